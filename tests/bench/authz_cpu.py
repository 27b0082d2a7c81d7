#!/usr/bin/python3
"""Get with a 100-rule authorization policy against Get without one: dreyd's CPU per call.

Two ephemeral nodes with the same RS256 key and the same token (so only the policy differs), driven
by drey-bench one after the other in interleaved rounds (every round runs both; the best round of each
is kept, as tests/bench/run.sh does: other load only ever slows a run down). The policy's role bound
to the token has 100 rules: 50 naming other caches exactly, 49 naming cache prefixes that do not match
(the check walks those), and the one that grants read on the default cache last. Prints server CPU us
per call of each and their ratio (the target: at most 1.03); never asserts.

    bazel build -c opt //:dreyd //:drey-bench && tests/bench/authz_cpu.py [--rounds=3] [--seconds=5]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "integration", "python"))
sys.dont_write_bytecode = True
from bench import Dreyd, Meter, log, stop_all  # noqa: E402
from drey_tokens import KeyDir, mint  # noqa: E402

BIN = os.path.normpath(os.path.join(HERE, "..", "..", "bazel-bin"))


def policy():
    rules = [{"caches": ["other-%d" % i], "keys": ["k%d:*" % i], "verbs": ["read", "write"]} for i in range(50)]
    rules += [{"caches": ["pre%d-*" % i], "keys": ["*"], "verbs": ["read"]} for i in range(49)]
    rules.append({"caches": ["default"], "keys": ["*"], "verbs": ["read", "write"]})
    return {"roles": {"big": rules}, "bindings": [{"claim": "sub", "equals": "bench", "roles": ["big"]}]}


def run_bench(node, tokens, args, mix):
    out = subprocess.run([os.path.join(BIN, "drey-bench"), "--target=" + node.target, "--tokens-file=" + tokens,
                          "--connections=%d" % args.connections, "--streams=%d" % args.streams, "--mix=" + mix,
                          "--keys=1000", "--value-bytes=256", "--duration=%ds" % args.seconds, "--warmup=1s",
                          "--json"], capture_output=True, text=True, timeout=args.seconds + 120)
    if out.returncode != 0:
        raise RuntimeError("drey-bench failed: %s" % out.stderr)
    return json.loads(out.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--streams", type=int, default=64)
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="drey-authz-bench-")
    keys = KeyDir(os.path.join(work, "keys"))
    key = keys.rsa("k1")
    tokens = os.path.join(work, "tokens.txt")
    with open(tokens, "w") as f:
        f.write(mint(key, sub="bench", ttl=24 * 3600) + "\n")
    policy_file = os.path.join(work, "policy.json")
    with open(policy_file, "w") as f:
        json.dump(policy(), f)
    flags = ["--ephemeral", "--jwt-keys-dir=" + keys.path, "--max-inflight=2048", "--max-queued=2048",
             "--slowdown-at=2048", "--principal-max-inflight=2048", "--principal-max-queued=2048"]
    nodes = {"without": Dreyd("without", os.path.join(BIN, "dreyd"), work, flags),
             "policy": Dreyd("policy", os.path.join(BIN, "dreyd"), work,
                             flags + ["--authz-policy=" + policy_file])}
    best = {}
    try:
        for n in nodes.values():
            n.start()
            run_bench(n, tokens, argparse.Namespace(**{**vars(args), "seconds": 1}), "set:1")  # the keys exist
        for r in range(args.rounds):
            for name, n in nodes.items():
                with Meter(n) as m:
                    res = run_bench(n, tokens, args, "get:1")
                if res["errors"] > 0:  # reported, not hidden: CPU per call counts every call
                    log("round %d %s: %d errors %s" % (r + 1, name, res["errors"],
                                                       json.dumps(res.get("errors_by_status"))))
                us = m.fields(res["calls"])["server_cpu_us_per_call"]
                log("round %d %-8s %8.0f calls/s  server %.2f us/call" % (r + 1, name, res["ok_throughput"], us))
                if name not in best or us < best[name][0]:
                    best[name] = (us, res["ok_throughput"])
    finally:
        stop_all()
    a, b = best["without"][0], best["policy"][0]
    print("Get %dx%d, server CPU per call (best of %d rounds): without a policy %.2f us, with a 100-rule "
          "policy %.2f us; ratio %.3f (target <= 1.03)" % (args.connections, args.streams, args.rounds, a, b, b / a))
    print(json.dumps({"without_us": round(a, 3), "policy_us": round(b, 3), "ratio": round(b / a, 4),
                      "throughput_without": best["without"][1], "throughput_policy": best["policy"][1]}))


if __name__ == "__main__":
    main()
