#!/usr/bin/env python3
"""Checks that the documentation matches the repository. Standard library only.

1. README.md has at most 150 lines, and links every page in docs/.
2. Every relative link in README.md, CHANGELOG.md, BENCHMARKS.md and docs/*.md names a file that
   exists, and every `path/with/slash` the README's "Where to start reading" names exists.
3. No issue numbers in user-facing text: nothing like "issue 16" or "issue-16" in README.md,
   BENCHMARKS.md, CHANGELOG.md or docs/.
4. The crate table of docs/ARCHITECTURE.md ("Crates and their borders") lists every workspace
   crate with exactly its normal dependencies as `cargo metadata` reports them: the workspace
   crates it uses and the external crates it uses. A crate that gains (or drops) a dependency,
   or a new crate, fails this check until the table says so.

usage: scripts/check-docs.py [--self-test] [--print-deps]
  --self-test   also prove that check 4 fails on a table missing a dependency, a crate, or
                listing one too many (run by scripts/test.sh)
  --print-deps  print each crate's dependency cells as the table wants them, and exit
Exit status 0: every check passed; 1: a check failed (each failure on its own line).
"""
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README_MAX_LINES = 150
ISSUE_NUMBER = re.compile(r"\bissues?[ -]#?[0-9]", re.IGNORECASE)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)")
TICKED = re.compile(r"`([^`]+)`")
TABLE_HEADING = "## 2. Crates and their borders"


def read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def docs_pages():
    return sorted(
        os.path.join("docs", n) for n in os.listdir(os.path.join(ROOT, "docs")) if n.endswith(".md")
    )


def user_facing_files():
    return ["README.md", "BENCHMARKS.md", "CHANGELOG.md"] + docs_pages()


def check_readme(errors):
    text = read("README.md")
    lines = text.count("\n") + (0 if text.endswith("\n") else 1)
    if lines > README_MAX_LINES:
        errors.append(f"README.md: {lines} lines, at most {README_MAX_LINES}")
    linked = {os.path.normpath(t) for t in LINK.findall(text)}
    for page in docs_pages():
        if page not in linked:
            errors.append(f"README.md: no link to {page}")
    start = text.find("## Where to start reading")
    if start >= 0:
        end = text.find("\n## ", start + 1)
        for token in TICKED.findall(text[start : end if end > 0 else len(text)]):
            if "/" in token and not os.path.exists(os.path.join(ROOT, token)):
                errors.append(f"README.md: where to start reading names `{token}`, which does not exist")


def check_links(errors):
    for rel in user_facing_files():
        if not os.path.exists(os.path.join(ROOT, rel)):
            continue
        base = os.path.dirname(rel)
        for target in LINK.findall(read(rel)):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not os.path.exists(os.path.join(ROOT, base, target)):
                errors.append(f"{rel}: link to {target}, which does not exist")


def check_issue_numbers(errors):
    for rel in user_facing_files():
        if not os.path.exists(os.path.join(ROOT, rel)):
            continue
        for n, line in enumerate(read(rel).splitlines(), 1):
            m = ISSUE_NUMBER.search(line)
            if m:
                errors.append(f"{rel}:{n}: an issue number in user-facing text ({m.group(0)!r})")


def cargo_metadata():
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps", "--offline"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)


def crate_deps(meta):
    """{crate dir: (workspace deps as dirs, external deps)} of normal dependencies."""
    dirs = {
        p["name"]: os.path.relpath(os.path.dirname(p["manifest_path"]), ROOT) for p in meta["packages"]
    }
    deps = {}
    for p in meta["packages"]:
        normal = [d for d in p["dependencies"] if d["kind"] is None]
        ws = {dirs[d["name"]] for d in normal if d["name"] in dirs}
        ext = {d["name"] for d in normal if d["name"] not in dirs}
        deps[dirs[p["name"]]] = (ws, ext)
    return deps


def dependency_notes(meta):
    """{(crate dir, dependency): " (optional)" / " (Linux)"}: how the table marks such a dependency."""
    dirs = {
        p["name"]: os.path.relpath(os.path.dirname(p["manifest_path"]), ROOT) for p in meta["packages"]
    }
    notes = {}
    for p in meta["packages"]:
        for d in p["dependencies"]:
            if d["kind"] is not None:
                continue
            said = []
            if d["optional"]:
                said.append("optional")
            if d.get("target"):
                said.append("Linux" if "linux" in d["target"] else d["target"])
            if said:
                notes[(dirs[p["name"]], dirs.get(d["name"], d["name"]))] = f" ({', '.join(said)})"
    return notes


def table_rows(text):
    """{crate dir: (workspace deps, external deps)} from ARCHITECTURE.md's crate table."""
    start = text.find(TABLE_HEADING)
    if start < 0:
        raise ValueError(f"docs/ARCHITECTURE.md: no '{TABLE_HEADING}' section")
    rows = {}
    in_table = False
    for line in text[start:].splitlines()[1:]:
        if line.startswith("## "):
            break
        if line.startswith("| crate |"):
            in_table = True
            continue
        if in_table and not line.startswith("|"):
            break
        if not (in_table and line.startswith("| `")):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4:
            raise ValueError(f"docs/ARCHITECTURE.md: crate row without 4 cells: {line}")
        crate = TICKED.findall(cells[0])[0]
        rows[crate] = (set(TICKED.findall(cells[2])), set(TICKED.findall(cells[3])))
    return rows


def compare(actual, table):
    errors = []
    for crate in sorted(actual):
        if crate not in table:
            errors.append(f"docs/ARCHITECTURE.md: crate `{crate}` has no row in the crate table")
            continue
        for kind, got, said in (
            ("workspace", actual[crate][0], table[crate][0]),
            ("external", actual[crate][1], table[crate][1]),
        ):
            for d in sorted(got - said):
                errors.append(f"docs/ARCHITECTURE.md: `{crate}` depends on {kind} crate `{d}`; the table lacks it")
            for d in sorted(said - got):
                errors.append(f"docs/ARCHITECTURE.md: the table says `{crate}` depends on {kind} crate `{d}`; it does not")
    for crate in sorted(set(table) - set(actual)):
        errors.append(f"docs/ARCHITECTURE.md: row `{crate}` is no workspace crate")
    return errors


def self_test(actual, table):
    """Check 4 must fail on a table that lacks a dependency, lacks a crate, or says too much."""
    failures = []
    some = next(c for c in sorted(actual) if actual[c][1])
    dep = sorted(actual[some][1])[0]
    cases = {
        f"`{some}` without `{dep}`": {**table, some: (table[some][0], table[some][1] - {dep})},
        f"no row for `{some}`": {c: v for c, v in table.items() if c != some},
        f"`{some}` with an extra dependency": {**table, some: (table[some][0], table[some][1] | {"no-such-crate"})},
    }
    for what, broken in cases.items():
        if not compare(actual, broken):
            failures.append(f"self-test: the check passed a table with {what}")
    return failures


def main(argv):
    meta_deps = None
    if "--print-deps" in argv:
        meta = cargo_metadata()
        notes = dependency_notes(meta)
        for crate, (ws, ext) in sorted(crate_deps(meta).items()):
            ticks = lambda names: ", ".join(f"`{n}`{notes.get((crate, n), '')}" for n in sorted(names)) or "-"
            print(f"| `{crate}` | ... | {ticks(ws)} | {ticks(ext)} |")
        return 0
    errors = []
    check_readme(errors)
    check_links(errors)
    check_issue_numbers(errors)
    try:
        meta_deps = crate_deps(cargo_metadata())
        table = table_rows(read("docs/ARCHITECTURE.md"))
        errors += compare(meta_deps, table)
        if "--self-test" in argv:
            errors += self_test(meta_deps, table)
    except (ValueError, subprocess.CalledProcessError) as e:
        errors.append(str(e).strip() or repr(e))
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        return 1
    print("docs: README, links, no issue numbers, crate table matches cargo metadata")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
