"""deploy/monitoring names only what edgevold serves: every metric in the alerting rules, in the
series their unit tests feed, and in the Grafana dashboard's queries is a family a live
edgevold serves on /metrics (or one it serves only on hardware a dev daemon lacks, listed in
CONDITIONAL and checked against the exporter's source); the families the replicated-volume rules
join on have the labels the exporter renders (LABELLED: a dev edgevold with no volume serves them
without samples, so their labels are read from the exporter's source); every alert has a unit
test that expects it both quiet and firing.

Usage: check_monitoring.py --url http://HOST:PORT/metrics  (exit 1 on any failure)
"""

import argparse
import json
import re
import sys
import time
import urllib.request

import yaml

import manifests as m

MONITORING = m.ROOT / "deploy" / "monitoring"
RULES = MONITORING / "edgevol-alerts.yaml"
RULE_TESTS = MONITORING / "edgevol-alerts.test.yaml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
EXPORTER = m.ROOT / "appliance" / "src" / "metrics" / "mod.rs"
METRICS_SRC = EXPORTER.parent

# Families edgevold serves only where a dev daemon on a file pool cannot: the pool device's
# NVMe SMART log (appliance/src/metrics/health.rs).
CONDITIONAL = {
    name: "only when the pool device is an NVMe namespace whose SMART log was read"
    for name in (
        "edgevol_nvme_temperature_celsius",
        "edgevol_nvme_media_errors_total",
        "edgevol_nvme_percentage_used",
        "edgevol_nvme_available_spare_percent",
        "edgevol_nvme_critical_warning",
    )
}
# Families whose label names the rules match on across appliances (on (volume_id), label_replace
# of legs_before): served with a sample only once a volume has legs or hosts, which a dev
# edgevold has not. The labels their test series carry must be the ones the exporter renders.
LABELLED = ("edgevol_volume_leg", "edgevol_volume_host_controllers")
# Labels the scrape adds to every series.
TARGET_LABELS = {"job", "instance"}
# Prometheus' own series the rules may use.
PROMETHEUS = {"up"}

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
            "unless", "offset", "bool", "inf", "nan"}


def metric_names(expr):
    """The metric names a PromQL expression selects: identifiers that are not functions,
    keywords, label names (matchers, grouping lists) or inside strings and ranges."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", e)
    names = set()
    for tok in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        rest = e[tok.end():].lstrip()
        # A function or an aggregation (`sum by (...) (...)`), or a keyword.
        if rest.startswith("(") or re.match(r"(by|without)\b", rest) or tok.group(0) in KEYWORDS:
            continue
        names.add(tok.group(0))
    return names


def served(text):
    """The sample names an exposition's families allow: counters and gauges by name,
    histograms as _bucket, _count and _sum (unless the family says it has no _sum)."""
    kinds = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    helps = dict(re.findall(r"^# HELP (\S+) (.*)$", text, re.M))
    out = set()
    for name, kind in kinds.items():
        if kind == "histogram":
            out |= {f"{name}_bucket", f"{name}_count"}
            if "no _sum" not in helps.get(name, ""):
                out.add(f"{name}_sum")
        else:
            out.add(name)
    return kinds, out


def scrape(url, wait):
    """/metrics once the pool is ready (the pool families appear then)."""
    deadline = time.monotonic() + wait
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                text = r.read().decode()
            if re.search(r"^edgevol_pool_ready 1$", text, re.M):
                return text
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"{url}: no ready pool within {wait} s")
        time.sleep(0.5)


def source_labels(name):
    """The label names the exporter's source renders for `name` (its `e.sample("name", &[...])`
    call under appliance/src/metrics), or None when no such call names it literally."""
    found = None
    for src in sorted(METRICS_SRC.glob("*.rs")):
        for call in re.finditer(r'\.sample\(\s*"' + re.escape(name) + r'",\s*&\[(.*?)\]\s*,',
                                src.read_text(), re.S):
            found = (found or set()) | set(re.findall(r'\(\s*"(\w+)"\s*,', call.group(1)))
    return found


def scraped_labels(text, name):
    """The label names of `name`'s samples in an exposition (None if it has no sample)."""
    samples = re.findall(r"^" + re.escape(name) + r"(?:\{(.*)\})? \S+$", text, re.M)
    if not samples:
        return None
    return {k for labels in samples for k in re.findall(r'(\w+)="', labels)}


def series_labels(series):
    """(name, label names) of a promtool input series `name{k="v", ...}`."""
    match = re.fullmatch(r"\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*(?:\{(.*)\})?\s*", series, re.S)
    return match.group(1), set(re.findall(r'(\w+)\s*=\s*"', match.group(2) or ""))


def label_failures(text, tests):
    """The LABELLED families' test series against the labels the exporter renders: each
    series' labels among them, and every rendered label fed by some series."""
    failures = []
    fed = {name: set() for name in LABELLED}
    for where, series in test_series(tests):
        name, labels = series_labels(series)
        if name in fed:
            fed[name] |= labels - TARGET_LABELS
    for name in LABELLED:
        rendered = source_labels(name)
        if rendered is None:
            failures.append(f"{name}: no e.sample(\"{name}\", ...) in {METRICS_SRC.relative_to(m.ROOT)}")
            continue
        live = scraped_labels(text, name)
        if live is not None and live != rendered:
            failures.append(f"{name}: served with labels {sorted(live)}, the source renders {sorted(rendered)}")
        if fed[name] != rendered:
            failures.append(f"{name}: the test series carry labels {sorted(fed[name])}, "
                            f"the exporter renders {sorted(rendered)}")
    return failures


def dashboard_queries(dash):
    """(where, PromQL) of every panel target and every templating query."""
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                out.append((f"panel {p['title']!r} {t['refId']}", t["expr"]))
            walk(p.get("panels", []))

    walk(dash["panels"])
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            q = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
            lv = re.fullmatch(r"label_values\((.+),\s*\w+\)", q)
            out.append((f"variable {var['name']}", lv.group(1) if lv else q))
    return out


def rule_queries(rules):
    return [(f"alert {r['alert']}", r["expr"]) for g in rules["groups"] for r in g["rules"]]


def test_series(tests):
    return [(f"test {t['name']!r} series", s["series"]) for t in tests["tests"]
            for s in t["input_series"]]


def self_test():
    """The extraction on the shapes the files use, and a name edgevold does not serve refused."""
    cases = {
        'sum by (instance, volume_id, le) (rate(edgevol_volume_io_latency_seconds_bucket'
        '{instance=~"$instance"}[$__rate_interval]))': {"edgevol_volume_io_latency_seconds_bucket"},
        "edgevol_pool_free_bytes / edgevol_pool_total_bytes < 0.03":
            {"edgevol_pool_free_bytes", "edgevol_pool_total_bytes"},
        'a{x="y"} * on (instance, device) group_left b': {"a", "b"},
        'absent(up{job="edgevol"} == 1)': {"up"},
        'edgevol_x{job="edgevol", instance="box-7:9100"}': {"edgevol_x"},
    }
    for expr, want in cases.items():
        got = metric_names(expr)
        assert got == want, f"metric_names({expr!r}) = {got}, want {want}"
    assert series_labels('edgevol_l{job="e", leg="1/2",\n    legs_before="a-v1"}') == \
        ("edgevol_l", {"job", "leg", "legs_before"})
    assert series_labels("up") == ("up", set())
    assert scraped_labels('# TYPE l gauge\nl{a="1",b="x y"} 1\nl{a="2"} 1\nlx 1\n', "l") == {"a", "b"}
    assert scraped_labels("# TYPE l gauge\n", "l") is None
    assert source_labels("edgevol_volume_leg") == {"volume_id", "leg", "legs_before"}
    _, names = served("# HELP h no _sum here\n# TYPE h histogram\n# TYPE c counter\n")
    assert names == {"h_bucket", "h_count", "c"}, names
    assert metric_names("rate(edgevol_bogus_total[5m])") - names == {"edgevol_bogus_total"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True, help="a dev edgevold's /metrics")
    ap.add_argument("--wait", type=float, default=60)
    args = ap.parse_args()

    self_test()
    failures = []
    text = scrape(args.url, args.wait)
    kinds, names = served(text)
    print(f"ok: {args.url} serves {len(kinds)} families")

    # The conditional list stays true: absent here, rendered by the exporter's source.
    source = EXPORTER.read_text()
    for name, why in CONDITIONAL.items():
        if name in kinds:
            failures.append(f"{name} is served by a dev edgevold: drop it from CONDITIONAL")
        if f'"{name}"' not in source:
            failures.append(f"{name} ({why}) is not in {EXPORTER.relative_to(m.ROOT)}")
    allowed = names | set(CONDITIONAL) | PROMETHEUS

    rules = yaml.safe_load(RULES.read_text())
    tests = yaml.safe_load(RULE_TESTS.read_text())
    dash = json.loads(DASHBOARD.read_text())
    checked = 0
    for where, expr in rule_queries(rules) + test_series(tests) + dashboard_queries(dash):
        found = metric_names(expr)
        if not found:
            failures.append(f"{where}: no metric in {expr!r}")
        for name in sorted(found - allowed):
            failures.append(f"{where}: {name} is not served by edgevold ({expr!r})")
        checked += 1
    print(f"ok: {checked} rule expressions, test series and dashboard queries checked")

    failures += label_failures(text, tests)
    print(f"ok: labels of {', '.join(LABELLED)} checked against the exporter")

    # Every alert has a test expecting it quiet and one expecting it firing.
    cases = {}
    for t in tests["tests"]:
        for case in t["alert_rule_test"]:
            cases.setdefault(case["alertname"], set()).add(bool(case.get("exp_alerts")))
    for where, _ in rule_queries(rules):
        alert = where.split(" ", 1)[1]
        if cases.get(alert) != {False, True}:
            failures.append(f"{where}: needs unit tests expecting it both quiet and firing")

    for f in failures:
        print(f"FAILED: {f}")
    print(f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
