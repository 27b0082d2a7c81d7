#!/usr/bin/python3
"""The README's performance table, from the latest benchmark report (tests/bench/run.sh).

    tests/bench/readme_table.py              print the table of the latest results
    tests/bench/readme_table.py --write      rewrite it in README.md, between its markers
    readme_table.py --check --readme R --results A/results.json B/results.json ...
                                             exit 1 when R's table is not the latest results'
                                             (//tests/build:readme_perf_current_test)

The latest results are those with the latest "date" among tests/bench/results/*/results.json that
report.py has rendered (they hold "summary"). Nothing here measures: it copies figures of one run.
"""
import argparse
import glob
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
BEGIN = "<!-- performance:begin"
END = "<!-- performance:end -->"

# (scenario, connections, streams) rows of the report, in the README's order.
ROWS = [
    ("get", 16, 64), ("set_dur", 16, 64), ("etcd_put", 16, 64), ("redis_get", 50, 1), ("redis_set_always", 50, 1),
    ("c3_get", 16, 64), ("c3_set", 16, 64), ("rc_get", 1024, 1), ("rc_set", 1024, 1),
    ("c3_get", 10, 5), ("c3_set", 10, 5), ("rc_get", 50, 1), ("rc_set", 50, 1),
]


def latest(paths):
    best = None
    for p in paths:
        with open(p) as f:
            res = json.load(f)
        if "summary" not in res:
            continue
        if best is None or res["date"] > best[1]["date"]:
            best = (p, res)
    if best is None:
        raise SystemExit("readme_table.py: no rendered results.json among %d files" % len(paths))
    return best


def fmt(v, digits=1):
    if v is None:
        return "—"
    if abs(v) >= 1000:
        return format(round(v), ",")
    return ("%." + str(digits) + "f") % v


def table(path, res):
    run_dir = os.path.basename(os.path.dirname(os.path.abspath(path)))
    rows = {(r["scenario"], r["connections"], r["streams"]): r for r in res["summary"]}
    s = res["settings"]
    L = ["Run of %s (`%s`, %s mode%s) on %s × %s; full report: [tests/bench/results/%s/report.md]"
         "(tests/bench/results/%s/report.md). Two cores shared by the servers and the load tool: compare the "
         "ratios of one run, not the absolute figures." % (
             res["date"], res["command"], s["mode"], ": short rounds, noisy" if s["mode"] == "quick" else "",
             res["machine"]["nproc"], res["machine"]["cpu"], run_dir, run_dir), "",
         "| Scenario | load | calls/s | p50 ms | p99 ms | server CPU µs/call |", "|---|---|---:|---:|---:|---:|"]
    for key in ROWS:
        r = rows.get(key)
        if not r:
            continue
        load = "%d clients" % r["connections"] if r["tool"] == "redis-benchmark" else "%d × %d" % (
            r["connections"], r["streams"])
        L.append("| %s | %s | %s | %s | %s | %s |" % (r["series"], load, fmt(r["throughput"], 0), fmt(r["p50_ms"], 2),
                                                   fmt(r["p99_ms"], 2), fmt(r["server_cpu_us_per_call"])))
    targets = res.get("targets") or []
    if targets:
        L += ["", "| Target (issue #25) | measured | target | |", "|---|---:|---|---|"]
        for t in targets:
            if t.get("target") is None:
                continue
            verdict = "met" if t["met"] else ("**missed**" if t["met"] is not None else "not measured")
            L.append("| %s | %s | %s %s | %s |" % (t["name"], fmt(t["value"], 2),
                                                  "≥" if t.get("higher_is_better", True) else "≤",
                                                  fmt(t["target"], 2), verdict))
        if res.get("notes"):
            L += ["", "Why each missed target is missed, with the profiles: [tests/bench/results/%s/%s]"
                      "(tests/bench/results/%s/%s)." % (run_dir, res["notes"], run_dir, res["notes"])]
    return "\n".join(L)


def current(readme_text):
    lines = readme_text.split("\n")
    starts = [i for i, l in enumerate(lines) if l.startswith(BEGIN)]
    ends = [i for i, l in enumerate(lines) if l == END]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise SystemExit("README must hold one %s ... --> %s pair" % (BEGIN, END))
    return lines, starts[0], ends[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--readme", default=os.path.join(TOP, "README.md"))
    ap.add_argument("--results", nargs="*", default=None)
    a = ap.parse_args()
    paths = a.results if a.results is not None else glob.glob(os.path.join(HERE, "results", "*", "results.json"))
    want = table(*latest(paths))
    if not (a.write or a.check):
        print(want)
        return 0
    with open(a.readme) as f:
        text = f.read()
    lines, b, e = current(text)
    got = "\n".join(lines[b + 1:e])
    if a.check:
        if got != want:
            print("README's performance table is not the latest report's (run tests/bench/readme_table.py --write)",
                  file=sys.stderr)
            return 1
        print("README's performance table is current")
        return 0
    with open(a.readme, "w") as f:
        f.write("\n".join(lines[:b + 1] + [want] + lines[e:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
