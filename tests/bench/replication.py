#!/usr/bin/env python3
"""Replication benchmark: what a second copy costs, on this machine.
Numbers and ratios, never assertions.

- Durable Set (fsync always) at 16 connections x 64 streams through
  drey-bench --cluster (every call to its partition's primary) on three
  nodes, replication factor 1 against factor 2 (issue target: >= 0.6).
- The latency replication adds at one stream (1 x 1, durable Set), beside
  what one fdatasync takes on this disk (the journal's own histogram) and
  a loopback round trip (a Get at 1 x 1): the target is an added latency
  under one fdatasync plus one round trip, since the backup's fsync runs
  while the primary's does.
- Failover: SIGKILL the primary of a partition while a probe writes to it
  through another node; the time from the kill to the first acknowledged
  write, with a 2 s lease.

  bazel build //:dreyd //:drey //:drey-bench
  DREY_BIN=bazel-bin/dreyd /usr/bin/python3 tests/bench/replication.py [--duration=4] [--failovers=3]
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration", "python"))
os.environ.setdefault("DREY_BIN", os.path.join(HERE, "..", "..", "bazel-bin", "dreyd"))

import grpc  # noqa: E402

from cluster import LIMITS, bench, measure, prefill  # noqa: E402
from drey_cluster import Cluster, partition  # noqa: E402
from drey_harness import make_value  # noqa: E402
from drey_tokens import http_get, ops_port, poll  # noqa: E402

PARTS = 256


def fsync_p50_us(servers):
    """The median of the journal's fdatasync histogram, summed over nodes."""
    buckets = {}
    for s in servers:
        _, _, body = http_get("127.0.0.1", ops_port(s), "/metrics")
        for line in body.decode().splitlines():
            if line.startswith("drey_journal_fsync_duration_seconds_bucket{"):
                le = line.split('le="')[1].split('"')[0]
                buckets[le] = buckets.get(le, 0) + float(line.split()[-1])
    total = buckets.get("+Inf", 0)
    for le, count in sorted(((float(k), v) for k, v in buckets.items() if k != "+Inf")):
        if count >= total / 2:
            return le * 1e6
    return None


def cluster(rf, duration):
    rows = {}
    with Cluster(partitions=PARTS, initial_nodes=3, ephemeral=False, extra_flags=LIMITS,
                 replication_factor=rf) as c:
        nodes = c.start(3)
        c.wait_assigned(3)
        for n in nodes:
            poll(lambda n=n: c.topology(n), lambda t: all(p.primary and len(p.replicas) == rf - 1
                                                          for p in t.partitions), what="a full table")
        servers = [n.server for n in nodes]
        seed = nodes[0].server.address
        prefill(seed, True)
        rows["set"] = measure("rf %d, 16x64 durable Set" % rf, seed, servers, "set", duration, True, True)
        one = bench(seed, "set", duration, True, extra=("--connections=1", "--streams=1",
                                                         "--duration=%gs" % duration, "--warmup=0"))
        get = bench(seed, "get", duration, True, extra=("--connections=1", "--streams=1",
                                                         "--duration=%gs" % duration, "--warmup=0"))
        rows["one"] = {"set_p50_us": one["latency"].get("p50_us"), "get_p50_us": get["latency"].get("p50_us"),
                       "fsync_p50_us": fsync_p50_us(servers)}
        print(json.dumps({"rf": rf, "one_stream": rows["one"]}), flush=True)
    return rows


def failover(rounds):
    times = []
    for _ in range(rounds):
        with Cluster(partitions=16, initial_nodes=3, ephemeral=False, replication_factor=2) as c:
            nodes = c.start(3)
            c.wait_assigned(3)
            t = poll(lambda: c.topology(nodes[1]), lambda t: all(p.primary and p.replicas for p in t.partitions),
                     what="a full table")
            p = next(p.id for p in t.partitions if p.primary == "n1")
            key = next(k for k in ("f%d" % i for i in range(10000)) if partition("", k, 16) == p)
            fn, req, _ = nodes[1].cache.methods["Set"]
            fn(req(key=key, value=make_value("before")), timeout=5)
            killed = time.time()
            nodes[0].server.kill()
            while True:
                try:
                    fn(req(key=key, value=make_value("after")), timeout=1)
                    break
                except grpc.RpcError:
                    time.sleep(0.01)
            times.append(time.time() - killed)
            print(json.dumps({"failover_s": round(times[-1], 3)}), flush=True)
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=4.0, help="seconds per run")
    ap.add_argument("--failovers", type=int, default=3)
    a = ap.parse_args()
    r1 = cluster(1, a.duration)
    r2 = cluster(2, a.duration)
    times = failover(a.failovers)
    t1, t2 = r1["set"]["throughput"], r2["set"]["throughput"]
    print()
    print("| measure | factor 1 | factor 2 | ratio |")
    print("|---|---:|---:|---:|")
    print("| durable Set 16x64, calls/s | %.0f | %.0f | %.2f |" % (t1, t2, t2 / t1))
    print("| durable Set 16x64, p99 us | %s | %s | |" % (r1["set"]["p99_us"], r2["set"]["p99_us"]))
    print("| server CPU us per Set (3 nodes) | %s | %s | %.2f |" % (
        r1["set"]["cpu_us_per_call"], r2["set"]["cpu_us_per_call"],
        r2["set"]["cpu_us_per_call"] / r1["set"]["cpu_us_per_call"]))
    o1, o2 = r1["one"], r2["one"]
    print("| durable Set 1x1, p50 us | %s | %s | added %s |" % (o1["set_p50_us"], o2["set_p50_us"],
                                                            o2["set_p50_us"] - o1["set_p50_us"]))
    print("| fdatasync p50 us (journal histogram) / Get 1x1 p50 us | %s / %s | | |" % (o2["fsync_p50_us"],
                                                                                  o2["get_p50_us"]))
    print("| failover, kill to first acknowledged write (2 s lease) | | %s | |" % ", ".join(
        "%.2f s" % t for t in times))


if __name__ == "__main__":
    main()
