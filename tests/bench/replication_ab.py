#!/usr/bin/python3
"""Two (or more) dreyd binaries side by side on what a replicated write costs: three durable
nodes with replication factor 2, durable Set at 16 x 64 through drey-bench --cluster (every call
to its partition's primary), binaries alternating within each round. Per call, over the three
nodes: server CPU (utime + stime from /proc), and with perf, sendmsg calls and context switches.
Prints numbers, never fails on them. OP=get, RF=1 and STREAMS=5 (per connection) measure other
shapes of the same cluster.

    bazel build //:dreyd //:drey //:drey-bench    # copy each dreyd out with a drey beside it
    DREY_BENCH_BIN=bazel-bin/drey-bench ROUNDS=2 DUR=6 \\
        /usr/bin/python3 tests/bench/replication_ab.py before=/tmp/a/dreyd after=/tmp/b/dreyd
"""
import os
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration", "python"))

import cluster as cb  # noqa: E402
from drey_cluster import Cluster  # noqa: E402
from drey_tokens import poll  # noqa: E402

EVENTS = ("syscalls:sys_enter_sendmsg", "context-switches")


def perf_stat(pids, seconds, out):
    """perf stat over the nodes for seconds (None without perf)."""
    if shutil.which("perf") is None:
        return None
    return subprocess.Popen(["perf", "stat", "-x,", "-o", out, "-e", ",".join(EVENTS), "-p",
                             ",".join(str(p) for p in pids), "--", "sleep", str(seconds)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def counts(out):
    got = {}
    for line in open(out):
        f = line.strip().split(",")
        if len(f) > 2 and f[2] in EVENTS and f[0].isdigit():
            got[f[2]] = int(f[0])
    return got


OP = os.environ.get("OP", "set")
RF = int(os.environ.get("RF", 2))
STREAMS = int(os.environ.get("STREAMS", 64))


def one(binary, duration, out):
    os.environ["DREY_BIN"] = binary
    with Cluster(partitions=256, initial_nodes=3, ephemeral=False, extra_flags=cb.LIMITS,
                 replication_factor=RF) as c:
        nodes = c.start(3)
        c.wait_assigned(3)
        for n in nodes:
            poll(lambda n=n: c.topology(n),
                 lambda t: all(p.primary and len(p.replicas) == RF - 1 for p in t.partitions),
                 what="a full table at " + n.id)
        servers = [n.server for n in nodes]
        cb.prefill(servers[0].address, True)
        # perf counts the whole run but the first second (the load tool's start).
        perf = perf_stat([s.proc.pid for s in servers], duration - 1, out)
        row = cb.measure(binary, servers[0].address, servers, OP, duration, True, True, streams=STREAMS)
        if perf is not None:
            perf.wait()
            per = row["throughput"] * (duration - 1)
            for event, n in counts(out).items():
                row[event] = round(n / per, 3)
        return row


def main():
    binaries = dict(a.split("=", 1) for a in sys.argv[1:])
    if not binaries:
        sys.exit(__doc__)
    rounds, duration = int(os.environ.get("ROUNDS", 2)), float(os.environ.get("DUR", 6))
    rows = {name: [] for name in binaries}
    for _ in range(rounds):
        for name, binary in binaries.items():
            rows[name].append(one(binary, duration, "/tmp/replication_ab.%d.perf" % os.getpid()))
    print("%s, RF %d, 16 x %d" % (OP, RF, STREAMS))
    print("| binary | server CPU us per call | sendmsg per call | context switches per call | calls/s |")
    print("|---|---|---|---|---|")
    for name, rs in rows.items():
        def col(key):
            vals = [r.get(key) for r in rs if r.get(key) is not None]
            return "%s (median %s)" % (" / ".join(str(v) for v in vals), statistics.median(vals)) if vals else "-"
        print("| %s | %s | %s | %s | %s |" % (name, col("cpu_us_per_call"), col(EVENTS[0]), col(EVENTS[1]),
                                             col("throughput")))


if __name__ == "__main__":
    main()
