#!/usr/bin/env python3
"""Join and drain against store size: how long a third node's join takes to
settle, and a node's drain, with 100 k, 1 M and 4 M entries (100-byte
values) on 256 partitions, RF 1 and RF 2, for two dreyd binaries in one run
(main's and this tree's). Numbers, never assertions.

Each case is a fresh cluster (its own etcd) of two ephemeral nodes,
loaded through n1 with drey-bench --pipeline (sequential keys, 100 B
values, no writes during the moves) and settled, then:
  - join: n3 is started; the time runs from its start to a settled table:
    three members, every partition owned, none under-replicated, no move
    planned nor held back by the controller (drey_cluster_moves_waiting: a
    partition that changed primary in the last 5 s waits), no backup being
    copied, n3 owning partitions, the same in two reads of the table 0.3 s
    apart (the time of the first);
  - drain: n1 gets SIGTERM (--cluster-drain-timeout=600s); the time runs to
    a settled table of two members, and to n1's exit.
The entries and bytes the nodes sent (drey_cluster_moved_*) are read from
their metrics when the table has settled.

  bazel build //:dreyd //:drey //:drey-bench
  /usr/bin/python3 tests/bench/join_drain.py --binary=main=/path/to/main/dreyd --binary=after=bazel-bin/dreyd \\
      [--entries=100000,1000000,4000000] [--rf=1,2] [--json=FILE]

drey-bench and the drey CLI come from next to DREY_BIN (default
bazel-bin/dreyd): only dreyd differs between the binaries compared.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration", "python"))
os.environ.setdefault("DREY_BIN", os.path.join(HERE, "..", "..", "bazel-bin", "dreyd"))

from drey_cluster import Cluster, drey_bench  # noqa: E402
from drey_tokens import http_get, ops_port  # noqa: E402

PARTITIONS = 256
VALUE_BYTES = 100
# Admission wide open: the load is a fill, not a test of the limits. A
# backup is given 30 s to acknowledge: on a loaded 2-core machine the 1 s
# default takes backups out of the in-sync set during the fill, and the
# copies that bring them back are not what this measures.
FLAGS = ("--max-inflight=4096", "--max-queued=4096", "--slowdown-at=4096", "--principal-max-inflight=4096",
         "--principal-max-queued=4096", "--cluster-drain-timeout=600s", "--replication-timeout=30s")


def log(msg):
    print("[join_drain %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def metric(node, name, absent=0.0):
    try:
        _, _, body = http_get("127.0.0.1", ops_port(node.server), "/metrics")
    except OSError:
        return absent
    m = re.search(r"^%s (\S+)" % re.escape(name), body.decode(), re.M)
    return float(m.group(1)) if m else absent


def moves_waiting(cl, s):
    """The moves the controller holds back while their partitions settle
    after a change of primary (DREY_CLUSTER_MOVE_SETTLE_MS): a table with
    none planned is not settled while some wait. None: not known."""
    node = cl.nodes.get(s.get("controller") or "")
    return None if node is None else metric(node, "drey_cluster_moves_waiting", absent=None)


def load(addr, entries):
    argv = [drey_bench(), "--target=" + addr, "--mix=set:1", "--connections=2", "--pipeline=256",
            "--keys=%d" % entries, "--key-bytes=12", "--value-bytes=%d" % VALUE_BYTES,
            "--distribution=sequential", "--count=%d" % entries, "--timeout=60s", "--json"]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=3600)
    if r.returncode != 0:
        raise RuntimeError("drey-bench failed: %s" % r.stderr)
    out = json.loads(r.stdout)
    if out.get("errors"):
        raise RuntimeError("the fill had errors: %s" % out["errors"])
    return out


def settled(cl, s, members, rf, joined=None):
    if len(s["nodes"]) != members or s["unassignedPartitions"] or s["underReplicatedPartitions"] or s["moves"]:
        return False
    if any(t["syncing"] for t in s["table"]):
        return False
    if rf > 1 and any(1 + len(t["inSync"]) < rf for t in s["table"]):
        return False
    if joined is not None and not any(n["id"] == joined and n["partitions"] > 0 for n in s["nodes"]):
        return False
    return moves_waiting(cl, s) == 0


def placement(s):
    """Who holds what (the table's lag and pending figures move on their own)."""
    return [(t["primary"], tuple(t["inSync"]), tuple(t["syncing"])) for t in s["table"]]


def wait_settled(cl, members, rf, joined=None, timeout=1800):
    """The time of the first of two settled reads 0.3 s apart."""
    deadline = time.monotonic() + timeout
    first = None
    while time.monotonic() < deadline:
        at = time.monotonic()
        try:
            s = cl.status()
        except AssertionError:
            s = None  # a node going away mid-read
        if s is not None and settled(cl, s, members, rf, joined):
            if first is not None and at - first[0] >= 0.3 and placement(s) == first[1]:
                return first[0]
            if first is None or placement(s) != first[1]:
                first = (at, placement(s))
        else:
            first = None
        time.sleep(0.05)
    raise AssertionError("no settled table of %d members within %ds" % (members, timeout))


def run_case(label, binary, entries, rf):
    log("%s: %d entries, RF %d" % (label, entries, rf))
    with Cluster(partitions=PARTITIONS, initial_nodes=2, ephemeral=True, replication_factor=rf,
                 extra_flags=FLAGS) as cl:
        n1 = cl.start_node("n1", binary=binary)
        n2 = cl.start_node("n2", binary=binary)
        cl.wait_assigned(2)
        wait_settled(cl, 2, rf)  # with RF 2: every backup in sync before the fill
        t = time.monotonic()
        fill = load(n1.server.address, entries)
        log("  loaded in %.1f s (%.0f Sets/s)" % (time.monotonic() - t, fill["throughput"]))
        wait_settled(cl, 2, rf)  # the join starts from a settled table
        t0 = time.monotonic()
        n3 = cl.start_node("n3", binary=binary)
        join_s = wait_settled(cl, 3, rf, joined="n3") - t0
        moved = sum(metric(n, "drey_cluster_moved_entries_total") for n in (n1, n2))
        moved_bytes = sum(metric(n, "drey_cluster_moved_bytes_total") for n in (n1, n2))
        log("  join settled in %.2f s (%d entries, %.1f MiB sent)" % (join_s, moved, moved_bytes / 2**20))
        t1 = time.monotonic()
        n1.server.signal(signal.SIGTERM)
        drain_s = wait_settled(cl, 2, rf) - t1
        n1.server.wait(timeout=600)
        exit_s = time.monotonic() - t1
        log("  drain settled in %.2f s, n1 exited after %.2f s" % (drain_s, exit_s))
        for n in (n2, n3):  # no drain of the whole cluster at the end
            n.server.signal(signal.SIGKILL)
            n.server.wait()
        return {"binary": label, "entries": entries, "rf": rf, "join_s": join_s, "join_moved_entries": moved,
                "join_moved_mib": moved_bytes / 2**20, "drain_s": drain_s, "drain_exit_s": exit_s,
                "fill_sets_per_s": fill["throughput"]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", action="append", default=[], help="LABEL=PATH of a dreyd (repeat)")
    ap.add_argument("--entries", default="100000,1000000,4000000")
    ap.add_argument("--rf", default="1,2")
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    binaries = [b.split("=", 1) for b in args.binary] or [["this", os.environ["DREY_BIN"]]]
    results = []
    for entries in [int(x) for x in args.entries.split(",")]:
        for rf in [int(x) for x in args.rf.split(",")]:
            for label, path in binaries:
                results.append(run_case(label, os.path.abspath(path), entries, rf))
                if args.json:
                    with open(args.json, "w") as f:
                        json.dump(results, f, indent=1)
    print("| entries | RF | dreyd | join settles | entries moved | MiB moved | drain settles | drained node exits |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|")
    for r in results:
        print("| %s | %d | %s | %.2f s | %d | %.1f | %.2f s | %.2f s |" %
              ("{:,}".format(r["entries"]), r["rf"], r["binary"], r["join_s"], r["join_moved_entries"],
               r["join_moved_mib"], r["drain_s"], r["drain_exit_s"]))


if __name__ == "__main__":
    main()
