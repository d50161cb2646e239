#!/usr/bin/env python3
"""The current tables of BENCHMARKS.md, from the benchmarks' own output. Standard library only.

Each area runs its benchmark commands (the benches print markdown tables themselves), keeps what
they printed with the command, the machine (CPUs, memory, kernel, rustc, the 1-minute load
average sampled while it ran) and the commit, and prints one section per area. Figures are never
typed by hand: to change a table, run the area again.

usage:
  scripts/bench-report.py run [AREA ...]   run the areas (default: all) and keep their output in
                                           target/bench-report/AREA.json (minutes to an hour:
                                           run it on a quiet machine)
  scripts/bench-report.py print            print the kept areas as markdown
  scripts/bench-report.py write [FILE]     put that markdown between the bench-report markers of
                                           FILE (default: BENCHMARKS.md)
  scripts/bench-report.py list             the areas and their commands
EDGEVOL_BENCH_REPORT_DIR replaces target/bench-report.

Areas: data-path, data-path-qemu, data-path-qemu-tap, instructions, control-plane, qos,
snapshot-metadata, auth, replicated, encrypted, footprint, images, boot.
"""
import datetime
import json
import shlex
import shutil
import os
import re
import subprocess
import sys
import tarfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEEP = os.environ.get("EDGEVOL_BENCH_REPORT_DIR") or os.path.join(ROOT, "target", "bench-report")
BEGIN = "<!-- bench-report: begin (scripts/bench-report.py write; do not edit by hand) -->"
END = "<!-- bench-report: end -->"
MUSL = "x86_64-unknown-linux-musl"


def cargo_bench(package, bench, *args, features=()):
    argv = ["cargo", "bench", "-q", "-p", package]
    for f in features:
        argv += ["--features", f]
    argv += ["--bench", bench]
    if args:
        argv += ["--", *args]
    return argv


# name, title, what it measures, [(argv, tables_only)]. tables_only: keep only the markdown tables
# (and the line naming each) of an output that also carries test-harness lines; a string is a
# regular expression for other lines to keep as well (a bench's summary lines).
AREAS = [
    (
        "data-path",
        "Data path (host)",
        "NVMe/TCP target through the test initiator over loopback TCP, one I/O queue (two in the "
        "`2 queues` row), a 256 MiB volume of a dev pool on tmpfs; baselines from the same run: raw "
        "loopback TCP moving the same bytes, and the raw device. Run twice: as the daemon runs by "
        "default (an engine thread per core, unpinned), then pinned (`--pin`: the target's one "
        "engine on CPU 0, the host on CPU 1).",
        [
            (cargo_bench("edgevol-appliance", "data_path"), False),
            (cargo_bench("edgevol-appliance", "data_path", "--pin"), False),
        ],
    ),
    (
        "data-path-qemu",
        "Data path in QEMU",
        "fio in a node VM (TCG, 1 vCPU) against edgevold and the kernel's nvmet-tcp in one appliance "
        "VM, on identical virtio-blk backing, runs of the two targets interleaved: unpaced throughput "
        "(a row is initiator-bound when the node VM's vCPU was at least 70 % busy: it then measures "
        "the node), then at one paced rate for both targets the appliance VM's CPU per I/O and the "
        "QD1 completion latency. Under TCG only the ratios mean anything.",
        [(["scripts/bench-qemu.sh", "--skip-boot"], False)],
    ),
    (
        "data-path-qemu-tap",
        "Data path in QEMU, NICs with offloads",
        "The same, with the storage link on two taps and a bridge (`--tap`, root) instead of UDP "
        "datagrams: QEMU gives a virtio NIC checksum and segmentation offloads only over a backend "
        "with a vnet header, so over datagrams both targets compute every checksum and segment "
        "every send in software, which no real NIC asks of them.",
        [(["scripts/bench-qemu.sh", "--skip-boot", "--tap"], False)],
    ),
    (
        "instructions",
        "Engine instructions per command",
        "The NVMe/TCP engine thread's instructions per command, counted by valgrind's callgrind over "
        "the data-path bench (test initiator over loopback, the pool file on a drive's file system so "
        "that writes and queued reads go on the queue's io_uring, busy polling off): exact where "
        "timed figures are not, and under TCG (the QEMU tables) instructions are user-space time.",
        [(["scripts/bench-instructions.sh"], False)],
    ),
    (
        "control-plane",
        "Control plane",
        "CSI calls over one mTLS channel to an in-process appliance, durable commits on a pool file; "
        "Probe (touches no metadata) is the baseline. Then 100 in flight, medians of 8 rounds.",
        [
            (cargo_bench("edgevol-appliance", "control_plane"), False),
            (cargo_bench("edgevol-appliance", "control_plane", "--deep", "8"), False),
        ],
    ),
    (
        "qos",
        "Per-volume QoS",
        "Achieved rate against the limit, an unlimited neighbour next to limited and unlimited "
        "volumes, and the limiter's own cost, through the test initiator over loopback.",
        [(cargo_bench("edgevol-appliance", "qos"), False)],
    ),
    (
        "snapshot-metadata",
        "Changed-block tracking",
        "GetMetadataDelta between two snapshots of a thin volume (1 MiB clusters) with 2 % of its "
        "clusters written before the base and every 100th cluster rewritten before the target: time "
        "to stream the whole answer in-process, peak extra resident memory, most messages buffered.",
        [(cargo_bench("edgevol-appliance", "snapshot_metadata"), False)],
    ),
    (
        "auth",
        "DH-HMAC-CHAP",
        "`nvme connect` wall time of Linux 6.12 in a TCG guest to targets each allowing one hash and "
        "DH group, against an appliance without authentication; then the target side of one "
        "transaction per DH group on the host.",
        [
            (["scripts/test-auth-qemu.sh", "--runs", "3"], True),
            (cargo_bench("edgevol-nvmeof", "auth", features=("test-initiator",)), False),
        ],
    ),
    (
        "replicated",
        "Replicated volumes",
        "fio in a node VM (TCG, 1 vCPU) against a replicated (2 legs) and a single volume served by "
        "the same two appliances through edgevol proxy, rows interleaved, medians of 3 rounds; "
        "then the resync time of a leg per GiB changed while its appliance was away.",
        [(["scripts/test-replicated-qemu.sh", "--bench"], r"^(resync of a leg|medians of )")],
    ),
    (
        "encrypted",
        "Encrypted volumes",
        "fio in a node VM (TCG, 1 vCPU, LUKS2 aes-xts in software) against a plain and an encrypted "
        "raw block volume of one edgevold, rows interleaved, medians of 3 rounds, with how busy the "
        "node's vCPU was: the cost of dm-crypt on the node.",
        [(["scripts/test-encrypted-qemu.sh", "--bench"], True)],
    ),
    (
        "footprint",
        "Footprint",
        "RSS of the release `edgevold --dev` process at 0, 1,000 and 10,000 volumes; binary sizes.",
        [
            (cargo_bench("edgevol-appliance", "footprint"), False),
            (["cargo", "build", "-q", "--release", "-p", "edgevol-appliance", "--bin", "edgevold"], False),
            (
                ["cargo", "build", "-q", "--release", "--target", MUSL, "-p", "edgevol-appliance",
                 "--bin", "edgevold", "-p", "edgevol-cli", "--bin", "edgevol"],
                False,
            ),
        ],
    ),
    (
        "images",
        "Container images",
        "The OCI archives `scripts/build-images.sh` builds offline: archive size, and unpacked size "
        "(the sum of the files in its layers).",
        [(["scripts/build-images.sh", "--out", os.path.join(KEEP, "oci")], False)],
    ),
    (
        "boot",
        "Firmware image and boot",
        "`image/build.sh`'s artifacts, and boot-to-ready of the image under QEMU TCG (BIOS): one "
        "first boot (PKI generation, pool format), then the median of 3 later boots.",
        [(["scripts/bench-qemu.sh", "--skip-data-path"], False)],
    ),
]


def sh(argv):
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True).stdout.strip()


def load1():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def machine():
    cpu = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    return {
        "cpus": len(os.sched_getaffinity(0)),
        "cpu": cpu,
        "mem_gib": round(mem_kib / 1048576),
        "kernel": os.uname().release,
        "rustc": sh(["rustc", "--version"]),
        "qemu": sh(["sh", "-c", "qemu-system-x86_64 --version 2>/dev/null | head -1"]),
    }


def commit():
    head = sh(["git", "rev-parse", "--short=7", "HEAD"])
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=ROOT).returncode != 0
    return head + (" with uncommitted changes" if dirty else "")


class LoadSampler:
    """The 1-minute load average every 5 s while a command runs."""

    def __init__(self):
        self.samples = [load1()]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.wait(5):
            self.samples.append(load1())

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()
        self.samples.append(load1())


def derived_rows(name):
    """Markdown the area's commands do not print: file sizes of what they built."""
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    if name == "footprint":
        rows = ["| artifact | bytes | MiB |", "|---|---:|---:|"]
        for label, path in (
            ("edgevold (release, glibc, dynamic)", os.path.join(target, "release", "edgevold")),
            ("edgevold (release, static musl)", os.path.join(target, MUSL, "release", "edgevold")),
            ("edgevol (release, static musl)", os.path.join(target, MUSL, "release", "edgevol")),
        ):
            rows.append(size_row(label, path))
        return "\n".join(rows)
    if name == "images":
        out = os.path.join(KEEP, "oci")
        rows = [
            "| artifact | archive bytes | archive MiB | unpacked bytes | unpacked MiB |",
            "|---|---:|---:|---:|---:|",
        ]
        for f in sorted(os.listdir(out)) if os.path.isdir(out) else []:
            path = os.path.join(out, f)
            packed, unpacked = os.path.getsize(path), unpacked_bytes(path)
            rows.append(f"| {f} | {packed} | {packed / 1048576:.2f} | {unpacked} | {unpacked / 1048576:.2f} |")
        return "\n".join(rows)
    return ""


def size_row(label, path):
    if not os.path.exists(path):
        return f"| {label} | not built | - |"
    b = os.path.getsize(path)
    return f"| {label} | {b} | {b / 1048576:.2f} |"


def unpacked_bytes(path):
    """Sum of the regular files in an archive: in each layer of an OCI layout tar, else in it."""
    total = 0
    with tarfile.open(path) as outer:
        names = outer.getnames()
        if any(n.lstrip("./").startswith("blobs/") for n in names):
            for m in outer.getmembers():
                if not m.isfile() or "blobs/" not in m.name:
                    continue
                try:
                    with tarfile.open(fileobj=outer.extractfile(m)) as layer:
                        total += sum(x.size for x in layer.getmembers() if x.isfile())
                except tarfile.TarError:
                    continue  # a manifest or config blob, not a layer
        else:
            total = sum(m.size for m in outer.getmembers() if m.isfile())
    return total


def run_area(name, commands):
    record = {"area": name, "commit": commit(), "machine": machine(), "commands": []}
    record["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    with LoadSampler() as load:
        for argv, tables_only in commands:
            print(f"==> bench-report {name}: {' '.join(argv)}", file=sys.stderr)
            t0 = time.monotonic()
            p = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
            record["commands"].append(
                {
                    "argv": argv,
                    "tables_only": tables_only,
                    "status": p.returncode,
                    "seconds": round(time.monotonic() - t0),
                    "stdout": p.stdout,
                }
            )
            sys.stderr.write(p.stdout)
    record["load"] = [min(load.samples), max(load.samples)]
    record["derived"] = derived_rows(name)
    os.makedirs(KEEP, exist_ok=True)
    with open(os.path.join(KEEP, f"{name}.json"), "w") as f:
        json.dump(record, f, indent=1)
    return all(c["status"] == 0 for c in record["commands"])


def tables(text, keep=None):
    """Only the markdown tables of an output, each with the line before it when that line is a
    title (ends with ':'), and the lines the regular expression `keep` matches."""
    # libtest prints "test NAME ... " and then the test's own output on the same line.
    lines = [re.sub(r"^test \S+ \.\.\. (?=\|)", "", l) for l in text.splitlines()]
    kept = []
    for i, line in enumerate(lines):
        if not line.startswith("|"):
            if keep and re.search(keep, line):
                kept += ["", line]
            continue
        if i == 0 or not lines[i - 1].startswith("|"):
            title = next((l for l in reversed(lines[max(0, i - 3) : i]) if l.strip()), "")
            # A title says what follows (ends with ':'); anything else is a harness line.
            kept += ["", title] if title.rstrip().endswith(":") else [""]
        kept.append(line)
    return "\n".join(kept).strip()


def squeeze(text):
    """Blank lines collapsed to one; a table keeps a blank line before it."""
    out = []
    for line in text.strip().splitlines():
        line = line.rstrip()
        if not line and out and not out[-1]:
            continue
        if line.startswith("|") and out and out[-1] and not out[-1].startswith("|"):
            out.append("")
        out.append(line)
    return "\n".join(out)


def section(name, title, what):
    path = os.path.join(KEEP, f"{name}.json")
    out = [f"### {title}", "", what, ""]
    if not os.path.exists(path):
        out.append(f"Not measured yet: `scripts/bench-report.py run {name}`.")
        return "\n".join(out)
    with open(path) as f:
        r = json.load(f)
    m = r["machine"]
    lo, hi = r["load"]
    cmds = "; ".join(f"`{shlex.join(c['argv'])}`" for c in r["commands"])
    out.append(f"- Command: {cmds}")
    out.append(
        f"- Machine: {m['cpus']} CPUs ({m['cpu']}), {m['mem_gib']} GiB, Linux {m['kernel']}, "
        f"{m['rustc']}" + (f", {m['qemu']}" if m.get("qemu") else "")
    )
    out.append(f"- 1-minute load average while it ran: {lo:.1f}-{hi:.1f}")
    out.append(f"- Commit: {r['commit']}, {r['date']}")
    for c in r["commands"]:
        only = c["tables_only"]
        body = tables(c["stdout"], only if isinstance(only, str) else None) if only else c["stdout"]
        if c["status"] != 0:
            body += f"\n\n`{shlex.join(c['argv'])}` FAILED (exit status {c['status']}): its tables may be incomplete."
        if body.strip():
            out += ["", squeeze(body)]
    if r.get("derived"):
        out += ["", r["derived"]]
    return "\n".join(out)


def report():
    return "\n\n".join(section(n, t, w) for n, t, w, _ in AREAS) + "\n"


COPIED = (
    "**Partly regenerated.** A section that names no `scripts/bench-report.py` run below holds "
    "the most recent figures of [docs/benchmarks-history.md](docs/benchmarks-history.md), copied "
    "with the commit, command and machine each was measured with, until its area is run again."
)


def sections_of(region):
    """The `### title` sections of the marked part of BENCHMARKS.md, as (title, text)."""
    out = []
    for chunk in re.split(r"(?m)^(?=### )", region):
        if chunk.startswith("### "):
            out.append((chunk.splitlines()[0][4:], chunk.strip()))
    return out


def write(path):
    """Puts the kept areas between the markers of `path`. An area with no kept run keeps the
    section `path` already has for it (if it holds figures), so running some areas never drops
    the figures of the others."""
    with open(path) as f:
        text = f.read()
    a, b = text.find(BEGIN), text.find(END)
    if a < 0 or b < a:
        sys.exit(f"{path}: no bench-report markers ({BEGIN} ... {END})")
    before = sections_of(text[a + len(BEGIN) : b])
    parts, copied = [], False
    for n, t, w, _ in AREAS:
        old = next((s for title, s in before if title.startswith(t)), None)
        if os.path.exists(os.path.join(KEEP, f"{n}.json")) or not old or "Not measured yet" in old:
            parts.append(section(n, t, w))
        else:
            parts.append(old)
            copied = True
    body = "\n\n".join(([COPIED] if copied else []) + parts) + "\n"
    with open(path, "w") as f:
        f.write(text[: a + len(BEGIN)] + "\n" + body + text[b:])


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    names = [n for n, *_ in AREAS]
    cmd, args = argv[0], argv[1:]
    if cmd == "list":
        for n, t, _, commands in AREAS:
            print(f"{n}: {t}")
            for argv_, _ in commands:
                print(f"    {' '.join(argv_)}")
        return 0
    if cmd == "run":
        # ring's C code needs a musl C compiler for the static builds (as scripts/bench.sh does).
        if shutil.which("musl-gcc"):
            os.environ.setdefault("CC_x86_64_unknown_linux_musl", "musl-gcc")
        unknown = [a for a in args if a not in names]
        if unknown:
            print(f"unknown area(s): {', '.join(unknown)}; areas: {', '.join(names)}", file=sys.stderr)
            return 2
        ok = True
        for n, _, _, commands in AREAS:
            if not args or n in args:
                ok &= run_area(n, commands)
        return 0 if ok else 1
    if cmd == "print":
        sys.stdout.write(report())
        return 0
    if cmd == "write":
        write(os.path.join(ROOT, args[0]) if args else os.path.join(ROOT, "BENCHMARKS.md"))
        return 0
    print(__doc__.strip(), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
