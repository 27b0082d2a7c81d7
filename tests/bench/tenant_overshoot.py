#!/usr/bin/python3
"""How far past its quota a tenant gets on a cluster: Debian's etcd, three dreyd, and one tenant
writing new keys as fast as it can through every node at once (one drey-bench per node, each with the
tenant's token, so most writes are forwarded to their partition's owner).

While they run, the tenant's bytes on the partitions' primaries (each node's readiness details count
the partitions it leads) are summed every 20 ms; the worst sum and the one at the end are printed as a
share of the quota. The target was at most 10 % over. Numbers only, never an assertion.

    bazel build //:dreyd //:drey //:drey-bench && tests/bench/tenant_overshoot.py [--quota=4MiB] [--seconds=6]
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.normpath(os.path.join(HERE, "..", "..", "bazel-bin"))
os.environ.setdefault("DREY_BIN", os.path.join(BIN, "dreyd"))
sys.path.insert(0, os.path.join(HERE, "..", "integration", "python"))
sys.dont_write_bytecode = True
from drey_cluster import Cluster  # noqa: E402
from drey_tokens import KeyDir, details, mint  # noqa: E402


def size(s):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if s.endswith(u):
            return int(s[:-len(u)]) * m
    return int(s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quota", default="4MiB")
    ap.add_argument("--seconds", type=int, default=6)
    ap.add_argument("--value-bytes", type=int, default=256)
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--streams", type=int, default=16)
    args = ap.parse_args()
    quota = size(args.quota)
    keys = KeyDir()
    key = keys.rsa("k1")
    policy = os.path.join(keys.base, "policy.json")
    with open(policy, "w") as f:
        json.dump({"roles": {"app": [{"caches": ["*"], "keys": ["*"], "verbs": ["read", "write"]}]},
                   "bindings": [{"claim": "role", "equals": "app", "roles": ["app"]}],
                   "tenants": {"claim": "tenant", "maxBytes": {"acme": quota}}}, f)
    tokens = os.path.join(keys.base, "tokens.txt")
    with open(tokens, "w") as f:
        f.write(mint(key, sub="writer", role="app", tenant="acme", ttl=3600) + "\n")
    flags = ("--jwt-keys-dir=" + keys.path, "--authz-policy=" + policy, "--max-inflight=2048",
             "--max-queued=2048", "--principal-max-inflight=2048", "--principal-max-queued=2048")
    with Cluster(partitions=64, initial_nodes=3, extra_flags=flags) as cl:
        nodes = cl.start(3)
        cl.agreed_owners(nodes)
        peak, samples, stop = [0], [], threading.Event()

        def used():
            total = 0
            for n in nodes:
                ten = details(n.server).get("tenants") or {}
                total += sum(t["usedBytes"] for t in ten.get("top", []) if t["tenant"] == "acme")
            return total

        def sample():
            while not stop.is_set():
                u = used()
                samples.append(u)
                peak[0] = max(peak[0], u)
                time.sleep(0.02)  # the sampling period, not synchronisation
        t = threading.Thread(target=sample)
        t.start()
        benches = [subprocess.Popen(
            [os.path.join(BIN, "drey-bench"), "--target=" + n.server.address, "--tokens-file=" + tokens,
             "--connections=%d" % args.connections, "--streams=%d" % args.streams, "--mix=set:1",
             "--keys=10000000", "--key-bytes=16", "--value-bytes=%d" % args.value_bytes, "--duration=%ds" % args.seconds,
             "--seed=%d" % (i + 1), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for i, n in enumerate(nodes)]
        results = [json.loads(b.communicate(timeout=args.seconds + 120)[0]) for b in benches]
        time.sleep(0.2)  # the last writes' answers are in; then one more look
        stop.set()
        t.join()
        final = used()
        peak[0] = max(peak[0], final)
        refused = sum(r["errors"] for r in results)
        reasons = {}
        for r in results:
            for e in r.get("errors_by_status", []):
                k = "%s %s" % (e.get("code"), e.get("reason"))
                reasons[k] = reasons.get(k, 0) + e.get("count", 0)
        ok = sum(r["ok"] for r in results)
        print("tenant quota %d bytes, 3 nodes, %d writers per node x %d streams, %d s: %d writes applied, %d "
              "refused; the primaries held at most %d bytes (%+.2f %% of the quota), %d at the end (%+.2f %%); "
              "%d samples" % (quota, args.connections, args.streams, args.seconds, ok, refused, peak[0],
                              100.0 * (peak[0] - quota) / quota, final, 100.0 * (final - quota) / quota,
                              len(samples)))
        print(json.dumps({"quota": quota, "peak": peak[0], "final": final,
                          "overshoot_percent": round(100.0 * max(0, peak[0] - quota) / quota, 3),
                          "applied": ok, "refused": refused, "errors": reasons}))


if __name__ == "__main__":
    main()
