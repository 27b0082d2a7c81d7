#!/usr/bin/env python3
"""What an etcd outage and a killed primary cost clients, on three nodes
with RF 2 and dreyd's default flags (5 s lease). Numbers, never assertions.

  - etcd away: drey-bench --cluster (Set and Get, half each) runs before,
    during and after a 30 s outage of etcd, frozen (SIGSTOP) and then
    stopped (SIGKILL, started again on its data); each phase is its own
    drey-bench run, so the refused calls of the outage are counted apart.
  - failover: a node is killed (SIGKILL) while a probe writes, every
    10 ms, one key of each partition the node led, through a survivor;
    per partition the time from the kill to its first acknowledged write,
    and every refusal on the way with its details (reason, cause, whether
    it carried ErrorInfo and RetryInfo).

  bazel build //:dreyd //:drey //:drey-bench
  /usr/bin/python3 tests/bench/outage.py [--outage=30] [--json=FILE]
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration", "python"))
os.environ.setdefault("DREY_BIN", os.path.join(HERE, "..", "..", "bazel-bin", "dreyd"))

import grpc  # noqa: E402

from drey_cluster import Cluster, drey_bench, partition  # noqa: E402
from drey_harness import RpcFailure, make_value  # noqa: E402

PARTITIONS = 256
DEFAULT_LEASE = "5s"  # dreyd's default --cluster-lease-ttl


def log(msg):
    print("[outage %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def bench(targets, seconds):
    argv = [drey_bench(), "--target=" + targets, "--cluster", "--mix=set:1,get:1", "--connections=4",
            "--streams=4", "--keys=10000", "--value-bytes=100", "--duration=%ds" % seconds, "--timeout=3s",
            "--json"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 120)
    if r.returncode not in (0, 1):
        raise RuntimeError("drey-bench failed: %s" % r.stderr)
    return json.loads(r.stdout)


def etcd_outage(cl, how, seconds):
    target = cl.nodes["n1"].server.address
    before = bench(target, 10)
    etcd = cl.etcd.proc
    if how == "frozen":
        etcd.send_signal(signal.SIGSTOP)
    else:
        etcd.kill()
        etcd.wait(30)
    try:
        during = bench(target, seconds)
    finally:
        if how == "frozen":
            etcd.send_signal(signal.SIGCONT)
        else:
            cl.etcd.log.close()
            cl.etcd.start()
    after = bench(target, 10)
    return {"how": how, "seconds": seconds,
            "phases": {name: {"calls": r["calls"], "errors": r["errors"], "throughput": r["throughput"],
                              "errors_by_status": r["errors_by_status"]}
                       for name, r in (("before", before), ("during", during), ("after", after))}}


def key_in(p, prefix):
    return next(k for k in ("%s-%d" % (prefix, i) for i in range(1000000)) if partition("", k, PARTITIONS) == p)


def failover(cl, victim):
    survivor = cl.nodes["n2" if victim != "n2" else "n3"]
    topo = cl.topology(survivor)
    led = [p.id for p in topo.partitions if p.primary == victim]
    keys = {p: key_in(p, "failover") for p in led}
    set_, sreq, _ = survivor.cache.methods["Set"]
    first_ok, refusals = {}, []
    stop = threading.Event()

    def probe(parts):
        while not stop.is_set() and len(first_ok) < len(led):
            for p in parts:
                if p in first_ok:
                    continue
                try:
                    set_(sreq(key=keys[p], value=make_value(b"v")), timeout=2)
                    first_ok[p] = time.monotonic()
                except grpc.RpcError as e:
                    f = RpcFailure(e)
                    refusals.append((f.code.name, f.reason, f.metadata.get("cause"), f.error_info is not None,
                                     f.retry_info is not None, f.metadata.get("outcome")))
            time.sleep(0.01)  # the probe's pace, not a synchronisation

    threads = [threading.Thread(target=probe, args=(led[i::4],)) for i in range(4)]
    killed = time.monotonic()
    cl.nodes[victim].server.kill()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    stop.set()
    times = sorted(first_ok[p] - killed for p in first_ok)
    kinds = {}
    for r in refusals:
        kinds[r] = kinds.get(r, 0) + 1
    return {"partitions": len(led), "recovered": len(times),
            "first_write_s": {"min": times[0], "median": times[len(times) // 2], "max": times[-1]} if times else None,
            "refusals": [{"code": k[0], "reason": k[1], "cause": k[2], "error_info": k[3], "retry_info": k[4],
                          "outcome": k[5], "count": n} for k, n in sorted(kinds.items(), key=lambda x: -x[1])]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--outage", type=int, default=30, help="seconds etcd is away")
    ap.add_argument("--how", default="frozen,stopped", help="etcd outages to run: frozen, stopped")
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    results = {}
    with Cluster(partitions=PARTITIONS, initial_nodes=3, ephemeral=False, lease_ttl=DEFAULT_LEASE,
                 replication_factor=2) as cl:
        cl.start(3)
        cl.wait_assigned(3)
        for how in args.how.split(","):
            log("etcd %s for %d s" % (how, args.outage))
            results["etcd_" + how] = etcd_outage(cl, how, args.outage)
            time.sleep(10)  # let the cluster settle between scenarios; paces the benchmark only
        log("killing n1 while a probe writes its partitions")
        results["failover"] = failover(cl, "n1")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    for how in args.how.split(","):
        r = results["etcd_" + how]
        print("etcd %s %d s:" % (how, r["seconds"]))
        for name, ph in r["phases"].items():
            print("  %-6s %7d calls  %5d errors (%.2f%%)  %8.0f calls/s" %
                  (name, ph["calls"], ph["errors"], 100.0 * ph["errors"] / max(ph["calls"], 1), ph["throughput"]))
            for e in ph["errors_by_status"]:
                print("         %6d x %s %s %s" % (e["count"], e["op"], e["code"], e["reason"]))
    f = results["failover"]
    print("failover of n1 (lease %s): %d of %d partitions took writes again" %
          (DEFAULT_LEASE, f["recovered"], f["partitions"]))
    if f["first_write_s"]:
        print("  first acknowledged write after the kill: min %.2f s, median %.2f s, max %.2f s" %
              (f["first_write_s"]["min"], f["first_write_s"]["median"], f["first_write_s"]["max"]))
    for r in f["refusals"]:
        print("  %6d x %s %s cause=%s ErrorInfo=%s RetryInfo=%s outcome=%s" %
              (r["count"], r["code"], r["reason"], r["cause"], r["error_info"], r["retry_info"], r["outcome"]))


if __name__ == "__main__":
    main()
