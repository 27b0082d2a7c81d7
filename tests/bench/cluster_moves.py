#!/usr/bin/env python3
"""Partition moves: how long a join takes to settle, at what rate the data
moves, and how long a partition's writes pause for each handover, while
drey-bench writes. Numbers, never assertions.

Three durable nodes (256 partitions) are filled with --entries values of
--value-bytes through drey-bench, then a fourth joins while drey-bench
Sets keep running through n1; the run reports the time from the join to
a settled table, the bytes and entries the owners sent (their
drey_cluster_moved_* counters), the resulting rate, the longest and the
last pause (drey_cluster_move_pause_*), and drey-bench's throughput and
p99 before and during the moves.

  bazel build //:dreyd //:drey //:drey-bench
  DREY_BIN=bazel-bin/dreyd /usr/bin/python3 tests/bench/cluster_moves.py [--entries=50000]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration", "python"))
os.environ.setdefault("DREY_BIN", os.path.join(HERE, "..", "..", "bazel-bin", "dreyd"))

from drey_cluster import Cluster, drey_bench  # noqa: E402
from drey_tokens import http_get, ops_port, poll  # noqa: E402


def metric(node, name):
    _, _, body = http_get("127.0.0.1", ops_port(node.server), "/metrics")
    m = re.search(r"^%s (\S+)" % re.escape(name), body.decode(), re.M)
    return float(m.group(1)) if m else 0.0


def bench(addr, seconds, keys, value_bytes, out, fill=False):
    argv = [drey_bench(), "--target=" + addr, "--mix=set:1", "--connections=4", "--streams=16",
            "--keys=%d" % keys, "--value-bytes=%d" % value_bytes, "--json"]
    argv += ["--distribution=sequential", "--count=%d" % keys] if fill else ["--duration=%ds" % seconds, "--warmup=0"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 600)
    if r.returncode != 0:
        raise RuntimeError("drey-bench failed: %s" % r.stderr)
    out.append(json.loads(r.stdout))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=50000)
    ap.add_argument("--value-bytes", type=int, default=1024)
    ap.add_argument("--move-rate", default="64MiB")
    args = ap.parse_args()
    flags = ("--cluster-move-rate=" + args.move_rate,)
    with Cluster(partitions=256, initial_nodes=3, ephemeral=False, extra_flags=flags) as cl, \
            tempfile.TemporaryDirectory(prefix="drey-bench-move-") as top:
        dirs = [os.path.join(top, "n%d" % (i + 1)) for i in range(4)]
        for d in dirs:
            os.mkdir(d)
        nodes = [cl.start_node("n%d" % (i + 1), data_dir=dirs[i]) for i in range(3)]
        cl.wait_assigned(3)
        addr = nodes[0].server.address
        bench(addr, 0, args.entries, args.value_bytes, [], fill=True)
        before = []
        bench(addr, 3, args.entries, args.value_bytes, before)
        during = []
        writer = threading.Thread(target=bench, args=(addr, 20, args.entries, args.value_bytes, during))
        writer.start()
        time.sleep(2)  # the writer is at speed before the join (a benchmark's warm-up)
        t0 = time.monotonic()
        cl.start_node("n4", data_dir=dirs[3])
        poll(cl.status, lambda s: len(s["nodes"]) == 4 and not s["moves"] and
             next(n["partitions"] for n in s["nodes"] if n["id"] == "n4") > 0,
             timeout=600, what="a settled table", interval=0.05)
        settle = time.monotonic() - t0
        writer.join()
        owners = nodes
        sent = sum(metric(n, "drey_cluster_moved_bytes_total") for n in owners)
        entries = sum(metric(n, "drey_cluster_moved_entries_total") for n in owners)
        moves = sum(metric(n, "drey_cluster_moves_total") for n in owners)
        pause_max = max(metric(n, "drey_cluster_move_pause_max_seconds") for n in owners)
        print("entries %d x %d B on 3 nodes; n4 joins while drey-bench Sets through n1 (4x16)" %
              (args.entries, args.value_bytes))
        print("moves %d, %d entries, %.1f MiB sent in %.1f s to settle: %.1f MiB/s (cap %s)" %
              (moves, entries, sent / 2**20, settle, sent / 2**20 / settle, args.move_rate))
        print("longest handover pause %.1f ms" % (pause_max * 1000))
        for name, r in (("before the join", before[0]), ("during the moves", during[0])):
            print("%-17s %8.0f Sets/s  p99 %.2f ms  errors %s" %
                  (name, r["throughput"], r["latency"].get("p99_us", 0) / 1000, r["errors"]))
        for n in cl.nodes.values():
            n.server.stop()


if __name__ == "__main__":
    main()
