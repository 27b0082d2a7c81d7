#!/usr/bin/python3
"""Resident memory of an idle dreyd after a burst: does the node give memory back?

Two bursts, each on a fresh node, each followed by 30 s of idleness during
which VmRSS (/proc/<pid>/status) is sampled every 250 ms:

  expired   5 s of 256 KiB Sets with a 2 ms ttl (4 connections x 8 streams):
            every entry expires and active expiry frees it, nothing stays.
  deleted   200 keys of 256 KiB Set (50 MiB of entries), then all removed.
  deadline  (only with --bursts) 5 s of 256 KiB Sets over 1,000 keys whose calls
            have a 2 ms deadline: writes queued before it passed still land.

Each burst runs once per allocator configuration, in one run so the two can
be compared on the same noisy machine (read the ratios, not the absolute
figures). The configurations are MALLOC_CONF strings, which jemalloc reads
after the malloc_conf built into dreyd (src/dreyd/main.c), so the first,
"jemalloc defaults", undoes what dreyd sets. jemalloc's own stats.allocated
comes from GET /health/ready/details.

  bazel build //:dreyd //:drey-bench && tests/bench/idle_rss.py [--idle 30] [--json]

A benchmark: it prints numbers and never fails on them.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(TOP, "tests", "integration", "python"))

CONFIGS = [
    ("jemalloc defaults", "background_thread:false,dirty_decay_ms:10000,muzzy_decay_ms:0"),
    ("as built", None),
]
VALUE = 256 * 1024
MiB = 1024 * 1024


def rss_bytes(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS for pid %d" % pid)


def bench(binary, srv, *flags):
    argv = [binary, "--target=" + srv.address, "--value-bytes=%d" % VALUE, "--json"] + list(flags)
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise RuntimeError("drey-bench failed (%d): %s" % (r.returncode, r.stderr[-2000:]))
    return json.loads(r.stdout)


def allocated(srv):
    status, body = srv.ops_get("/health/ready/details")
    if status not in (200, 503):
        return -1
    return int(json.loads(body)["memory"].get("jemallocAllocatedBytes", -1))


def idle(srv, seconds):
    """VmRSS samples (seconds since the burst ended, bytes) over `seconds`."""
    samples, start = [], time.monotonic()
    while True:
        t = time.monotonic() - start
        samples.append((t, rss_bytes(srv.proc.pid)))
        if t >= seconds:
            return samples
        time.sleep(0.25)  # a sampling period, not synchronisation


def at(samples, t):
    """The last sample taken at or before t seconds."""
    return [b for s, b in samples if s <= t][-1]


def run_burst(kind, conf, args, harness):
    env = {"MALLOC_CONF": conf} if conf else {}
    srv = harness.DreyServer("--ops-listen=127.0.0.1:0", "--max-value-bytes=1MiB", env=env).start()
    try:
        base = rss_bytes(srv.proc.pid)
        if kind in ("expired", "deadline"):
            expiry = "--ttl=2ms" if kind == "expired" else "--timeout=2ms"
            bench(args.bench, srv, "--mix=set:1", expiry, "--duration=%gs" % args.burst, "--warmup=0s",
                  "--connections=4", "--streams=8", "--keys=1000")
        else:
            common = ["--distribution=sequential", "--keys=200", "--count=200", "--timeout=30s", "--connections=2",
                      "--streams=4"]
            bench(args.bench, srv, "--mix=set:1", *common)
            bench(args.bench, srv, "--mix=remove:1", *common)
        samples = idle(srv, args.idle)
        row = {
            "burst": kind,
            "config": conf or "(dreyd's malloc_conf)",
            "rss_start_mib": base / MiB,
            "rss_after_burst_mib": samples[0][1] / MiB,
            "allocated_end_mib": allocated(srv) / MiB,
        }
        for t in (1, 5, 10, 15, 20, 30):
            if t <= args.idle:
                row["rss_%ds_mib" % t] = at(samples, t) / MiB
        row["rss_end_mib"] = samples[-1][1] / MiB
        return row
    finally:
        srv.stop(check_log=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dreyd", default=os.path.join(TOP, "bazel-bin", "dreyd"))
    ap.add_argument("--bench", default=os.path.join(TOP, "bazel-bin", "drey-bench"))
    ap.add_argument("--idle", type=float, default=30.0, help="seconds of idleness sampled after a burst")
    ap.add_argument("--burst", type=float, default=5.0, help="seconds of the expired-Set burst")
    ap.add_argument("--conf", action="append", metavar="NAME=MALLOC_CONF",
                    help="a configuration to compare (repeatable; default: jemalloc defaults and as built)")
    ap.add_argument("--bursts", default="expired,deleted", help="comma-separated: expired, deleted, deadline")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.environ["DREY_BIN"] = os.path.abspath(args.dreyd)
    import drey_harness as harness

    configs = CONFIGS
    if args.conf:
        configs = [tuple(c.split("=", 1)) if "=" in c else (c, None) for c in args.conf]
    rows = []
    for kind in args.bursts.split(","):
        for name, conf in configs:
            row = run_burst(kind, conf, args, harness)
            row["name"] = name
            rows.append(row)
            print("%-8s %-18s start %6.1f  burst end %6.1f  1s %6.1f  5s %6.1f  10s %6.1f  15s %6.1f  end %6.1f MiB"
                  "  (allocated %5.1f MiB)" % (
                      kind, name, row["rss_start_mib"], row["rss_after_burst_mib"], row.get("rss_1s_mib", 0),
                      row.get("rss_5s_mib", 0), row.get("rss_10s_mib", 0), row.get("rss_15s_mib", 0),
                      row["rss_end_mib"], row["allocated_end_mib"]), file=sys.stderr, flush=True)
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()


if __name__ == "__main__":
    main()
