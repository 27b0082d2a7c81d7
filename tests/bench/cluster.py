#!/usr/bin/env python3
"""Cluster benchmark: what a forwarded call costs against a directly routed
one, and three nodes against one, on this machine. Numbers, never
assertions.

For each store mode (--ephemeral, then durable with the default fsync) and
each operation (Get over prefilled keys, Set), drey-bench runs the same
closed loop (16 connections x 64 streams) against:
  - 3 nodes, plain client entering through n1: about 2/3 of the calls are
    forwarded (n1 owns about 1/3 of the partitions);
  - 3 nodes, drey-bench --cluster: every call goes straight to its owner;
  - 1 node (a standalone dreyd, no cluster) for comparison, with the same
    16x64, and with 16x21 (what each of three owners sees in the routed run:
    a control for how much of the routed run's cost is smaller batches), and
    a one-node cluster (every call owned locally: the cost of cluster mode
    on the request path, without forwarding or a second process).
Server CPU is utime+stime from /proc/<pid>/stat of every dreyd, summed, read
just before and after the run; per call = that / the calls drey-bench
counted. The plain run mixes 1/3 direct and 2/3 forwarded calls, so the
cost of one forwarded call is derived from it as
    forwarded = (plain - direct * (1 - share)) / share
with share the forwarded fraction the nodes counted. drey-bench shares the two cores with the servers, so compare the
ratios of one run, not the absolute numbers.

Pipelined (--pipelines runs only this; it also ends a full run): a
standalone node and a 3-node cluster, ephemeral, 16 connections with
--pipeline=64, Get then Set, interleaved per round: the cluster entered
through n1 (2/3 of the operations forwarded) and topology-aware (drey-bench
--cluster --pipeline: each operation on its owner's stream, the local
cost). A forwarded operation's CPU is derived as above; it prints forwarded
against local, and 3 nodes against 1 node, by CPU per operation.

  bazel build //:dreyd //:drey //:drey-bench
  DREY_BIN=bazel-bin/dreyd /usr/bin/python3 tests/bench/cluster.py [--duration=4] [--pipelines] [--rounds=2]
"""
import argparse
import contextlib
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration", "python"))
os.environ.setdefault("DREY_BIN", os.path.join(HERE, "..", "..", "bazel-bin", "dreyd"))

from drey_cluster import Cluster, drey_bench  # noqa: E402
from drey_harness import DreyServer  # noqa: E402
from drey_tokens import details, poll  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
KEYS = 20000
# Admission wide open: the benchmark measures the data path, not the limits.
LIMITS = ("--max-inflight=4096", "--max-queued=4096", "--slowdown-at=4096", "--principal-max-inflight=4096",
          "--principal-max-queued=4096")


def cpu_s(pids):
    total = 0
    for pid in pids:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / TICK


def bench(target, op, duration, cluster_flag, extra=(), streams=64, pipeline=0):
    argv = [drey_bench(), "--target=" + target, "--connections=16", "--streams=%d" % streams, "--mix=%s:1" % op,
            "--keys=%d" % KEYS, "--value-bytes=256", "--json"] + list(extra)
    if cluster_flag:
        argv.append("--cluster")
    if pipeline:
        argv.append("--pipeline=%d" % pipeline)
    if not extra:
        argv += ["--duration=%gs" % duration, "--warmup=0"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout)


def prefill(target, cluster_flag):
    bench(target, "set", 0, cluster_flag, extra=("--distribution=sequential", "--count=%d" % KEYS))


def forwarded(servers):
    return sum(int(details(s)["cluster"].get("forwardedCalls", 0)) for s in servers)


def measure(label, target, servers, op, duration, cluster_flag, in_cluster, streams=64, pipeline=0):
    pids = [s.proc.pid for s in servers]
    f0 = forwarded(servers) if in_cluster else 0
    c0 = cpu_s(pids)
    r = bench(target, op, duration, cluster_flag, streams=streams, pipeline=pipeline)
    c1 = cpu_s(pids)
    f1 = forwarded(servers) if in_cluster else 0
    calls = r["calls"]
    row = {"label": label, "op": op, "calls": calls, "errors": r["errors"], "throughput": r["throughput"],
           "p50_us": r["latency"].get("p50_us"), "p99_us": r["latency"].get("p99_us"),
           "server_cpu_s": round(c1 - c0, 3), "cpu_us_per_call": round((c1 - c0) / calls * 1e6, 2) if calls else None,
           "forwarded_share": round((f1 - f0) / calls, 3) if calls else None}
    print(json.dumps(row), flush=True)
    return row


@contextlib.contextmanager
def three_node_cluster(ephemeral):
    """Three nodes, 256 partitions, every node routing with a full table
    and the keys prefilled: (the seed's address, the servers), stopped at
    the end."""
    with Cluster(partitions=256, initial_nodes=3, ephemeral=ephemeral, extra_flags=LIMITS) as c:
        nodes = c.start(3)
        c.wait_assigned(3)
        for n in nodes:
            poll(lambda n=n: c.owners(n), lambda o: all(o.values()), what="a full table at " + n.id)
        servers = [n.server for n in nodes]
        seed = nodes[0].server.address
        prefill(seed, True)
        yield seed, servers
        for s in servers:
            s.stop()


def three_nodes(ephemeral, duration):
    rows = []
    with three_node_cluster(ephemeral) as (seed, servers):
        for op in ("get", "set"):
            rows.append(measure("3 nodes, plain (through n1)", seed, servers, op, duration, False, True))
            rows.append(measure("3 nodes, --cluster (direct)", seed, servers, op, duration, True, True))
    return rows


def one_node_cluster(ephemeral, duration):
    rows = []
    with Cluster(partitions=256, initial_nodes=1, ephemeral=ephemeral, extra_flags=LIMITS) as c:
        (node,) = c.start(1)
        c.wait_assigned(1)
        poll(lambda: c.owners(node), lambda o: all(o.values()), what="a full table")
        prefill(node.server.address, False)
        for op in ("get", "set"):
            rows.append(measure("1-node cluster", node.server.address, [node.server], op, duration, False, True))
        node.server.stop()
    return rows


def one_node(ephemeral, duration):
    rows = []
    flags = list(LIMITS) + (["--ephemeral"] if ephemeral else [])
    s = DreyServer(*flags, name="single")
    s.start()
    try:
        prefill(s.address, False)
        for op in ("get", "set"):
            rows.append(measure("1 node (standalone)", s.address, [s], op, duration, False, False))
            rows.append(measure("1 node (standalone), 16x21", s.address, [s], op, duration, False, False, 21))
    finally:
        s.stop()
    return rows


def pipelines(duration, depth, rounds):
    """Pipelined loads (--pipeline=depth per connection), ephemeral: a
    standalone node, and a 3-node cluster entered through n1 (about 2/3 of
    the operations forwarded) and topology-aware (drey-bench --cluster: each
    operation on its owner's stream, none forwarded). Rounds interleave
    the three; every round is printed."""
    rows = []
    single = DreyServer(*(list(LIMITS) + ["--ephemeral"]), name="single")
    single.start()
    try:
        with three_node_cluster(True) as (seed, servers):
            prefill(single.address, False)
            for rnd in range(rounds):
                for op in ("get", "set"):
                    one = measure("1 node, pipelined", single.address, [single], op, duration, False, False, 1, depth)
                    plain = measure("3 nodes, pipelined through n1", seed, servers, op, duration, False, True, 1,
                                    depth)
                    routed = measure("3 nodes, pipelined --cluster", seed, servers, op, duration, True, True, 1,
                                     depth)
                    rows += [one, plain, routed]
                    share = plain["forwarded_share"]
                    local = routed["cpu_us_per_call"]
                    fwd = (plain["cpu_us_per_call"] - local * (1 - share)) / share
                    print("# pipelined %s (depth %d, round %d): CPU per op: local %.2f us, forwarded %.2f us, "
                          "forwarded/local %.2f (forwarded share %.2f; 1 node %.2f us, forwarded/1 node %.2f); "
                          "topology-aware 3 nodes/1 node %.2f; throughput 3 nodes --cluster/1 node %.2f" % (
                              op, depth, rnd + 1, local, fwd, fwd / local, share, one["cpu_us_per_call"],
                              fwd / one["cpu_us_per_call"], local / one["cpu_us_per_call"],
                              routed["throughput"] / one["throughput"]), flush=True)
    finally:
        single.stop()
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=4.0, help="seconds per run")
    ap.add_argument("--pipelines", action="store_true", help="only the pipelined scenario")
    ap.add_argument("--depth", type=int, default=64, help="operations per Pipeline message")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the pipelined scenario")
    a = ap.parse_args()
    if a.pipelines:
        print(json.dumps(pipelines(a.duration, a.depth, a.rounds)))
        return
    results = {}
    for mode, ephemeral in (("ephemeral", True), ("durable", False)):
        print("# %s" % mode, flush=True)
        rows = three_nodes(ephemeral, a.duration) + one_node(ephemeral, a.duration) + \
            one_node_cluster(ephemeral, a.duration)
        results[mode] = rows
        by = {(r["label"], r["op"]): r for r in rows}
        for op in ("get", "set"):
            fwd = by[("3 nodes, plain (through n1)", op)]
            direct = by[("3 nodes, --cluster (direct)", op)]
            single = by[("1 node (standalone)", op)]
            small = by[("1 node (standalone), 16x21", op)]
            one_cluster = by[("1-node cluster", op)]
            share = fwd["forwarded_share"]
            d = direct["cpu_us_per_call"]
            one_fwd = (fwd["cpu_us_per_call"] - d * (1 - share)) / share
            print("# %s %s: CPU per call: plain run/direct run %.2f, one forwarded call/direct %.2f "
                  "(%.1f us vs %.1f us); 3 nodes/1 node throughput: plain %.2f, --cluster %.2f; "
                  "direct/1-node CPU per call %.2f (16x21: %.2f; 1-node cluster/1 node %.2f)" % (
                      mode, op, fwd["cpu_us_per_call"] / d, one_fwd / d, one_fwd, d,
                      fwd["throughput"] / single["throughput"], direct["throughput"] / single["throughput"],
                      d / single["cpu_us_per_call"], d / small["cpu_us_per_call"],
                      one_cluster["cpu_us_per_call"] / single["cpu_us_per_call"]), flush=True)
    results["pipelined"] = pipelines(a.duration, a.depth, a.rounds)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
