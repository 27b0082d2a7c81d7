#!/usr/bin/python3
"""Pipelined drey beside unary drey and pipelined Redis: operations/s and
server CPU per operation for Get and durable Set.

drey: one durable dreyd (--data-dir in a temp dir, the default fsync
policy), driven by drey-bench over 16 connections, unary at 16 and 64 calls
in flight per connection and through Pipeline at depths 1, 16 and 64 (each
connection sends a batch of N operations as one message and waits for the
N results). Redis: redis-server with appendonly yes + appendfsync always for
SET, without persistence for GET, driven by redis-benchmark -c 16 -P N.
Same key space and value size for both; Gets read a prefilled key space.

Server CPU per operation is (utime + stime) of the server process from
/proc/<pid>/stat over the run, divided by the operations it served. Both
servers and the load generators share the machine's cores: compare ratios
measured in one run, never a lone figure. This prints numbers; it asserts
nothing.

Every scenario runs in --rounds rounds (default 3) interleaved across the
systems, and the round with the most operations/s is kept.

usage: tests/bench/pipeline.py [--duration=S] [--rounds=N] [--json=FILE]
  (build first: bazel build //:dreyd //:drey-bench; DREY_BIN and DREY_BENCH_BIN
  override where they are, as tests/bench/run.sh sets them)
"""

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
TICK = os.sysconf("SC_CLK_TCK")
KEYS = 100000
VALUE = 256
CONNS = 16
DREYD = os.environ.get("DREY_BIN", os.path.join(TOP, "bazel-bin/dreyd"))
DREY_BENCH = os.environ.get("DREY_BENCH_BIN", os.path.join(TOP, "bazel-bin/drey-bench"))
LIMITS = ("--max-inflight=4096", "--max-queued=4096", "--slowdown-at=4096", "--principal-max-inflight=4096",
          "--principal-max-queued=4096", "--pipeline-window=128")


def log(msg):
    print("[pipeline %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_s(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise RuntimeError("no %s within %ds" % (what, timeout))


def start_dreyd(work):
    log_path = os.path.join(work, "dreyd.log")
    argv = [DREYD, "--listen=127.0.0.1:0", "--ops-listen=",
            "--data-dir=" + os.path.join(work, "data")] + list(LIMITS)
    proc = subprocess.Popen(argv, stderr=open(log_path, "wb"), stdin=subprocess.DEVNULL)
    port = []

    def listening():
        with open(log_path) as f:
            m = re.search(r'"msg":"listening".*?"port":(\d+)', f.read())
        if m:
            port.append(int(m.group(1)))
        return bool(m) or proc.poll() is not None
    wait_for(listening, 60, "listening line")
    if not port:
        raise RuntimeError("dreyd exited: %s" % open(log_path).read()[-2000:])
    return proc, "127.0.0.1:%d" % port[0]


def start_redis(work, name, appendfsync):
    port = free_port()
    d = os.path.join(work, name)
    os.makedirs(d)
    argv = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", d, "--save", "",
            "--daemonize", "no", "--protected-mode", "no"]
    argv += ["--appendonly", "yes", "--appendfsync", appendfsync] if appendfsync else ["--appendonly", "no"]
    proc = subprocess.Popen(argv, stdout=open(os.path.join(work, name + ".log"), "wb"), stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)

    def pong():
        p = subprocess.run(["redis-cli", "-p", str(port), "ping"], capture_output=True, text=True)
        return p.stdout.strip() == "PONG"
    wait_for(pong, 30, "redis PONG")
    return proc, port


def drey_bench(target, op, duration, streams=1, pipeline=0, extra=()):
    argv = [DREY_BENCH, "--target=" + target, "--connections=%d" % CONNS,
            "--streams=%d" % streams, "--mix=%s:1" % op, "--keys=%d" % KEYS, "--value-bytes=%d" % VALUE,
            "--duration=%ds" % duration, "--warmup=1s", "--json"] + list(extra)
    if pipeline:
        argv.append("--pipeline=%d" % pipeline)
    p = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 120)
    if p.returncode != 0:
        raise RuntimeError("drey-bench: %s %s" % (p.stdout[-500:], p.stderr[-500:]))
    return json.loads(p.stdout.strip().splitlines()[-1])


def measure_drey(proc, target, op, duration, streams, pipeline):
    c0, t0 = cpu_s(proc.pid), time.monotonic()
    r = drey_bench(target, op, duration, streams, pipeline)
    c1, t1 = cpu_s(proc.pid), time.monotonic()
    ops = r["ok"] + r["errors"]
    # the server's CPU over the whole drey-bench run (warmup, drain): per
    # operation it served in that time, estimated from the measured rate
    served = r["throughput"] * (t1 - t0) if r["throughput"] > 0 else 1
    lat = r.get("latency") or {}
    p50, p99 = lat.get("p50_us"), lat.get("p99_us")
    return {"throughput": r["throughput"], "ok": r["ok"], "errors": r["errors"],
            "p50_ms": p50 / 1000 if p50 is not None else None, "p99_ms": p99 / 1000 if p99 is not None else None, "server_cpu_us_per_op": (c1 - c0) / served * 1e6, "ops": ops}


def redis_benchmark(port, test, depth, n):
    argv = ["redis-benchmark", "-p", str(port), "-t", test, "-c", str(CONNS), "-d", str(VALUE), "-r", str(KEYS),
            "-n", str(n), "-P", str(depth), "--csv"]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    lines = [l for l in p.stdout.splitlines() if l.startswith('"%s"' % test.upper())]
    if p.returncode != 0 or not lines:
        raise RuntimeError("redis-benchmark failed: %s %s" % (p.stdout[-500:], p.stderr[-500:]))
    f = [x.strip('"') for x in lines[0].split(",")]
    return {"throughput": float(f[1]), "p50_ms": float(f[4]), "p99_ms": float(f[6])}


def measure_redis(proc, port, test, depth, duration):
    probe = redis_benchmark(port, test, depth, 20000 if depth == 1 else 200000)
    n = max(10000, int(probe["throughput"] * duration))
    c0 = cpu_s(proc.pid)
    r = redis_benchmark(port, test, depth, n)
    r["server_cpu_us_per_op"] = (cpu_s(proc.pid) - c0) / n * 1e6
    r["ops"] = n
    return r


DREY_MODES = (("unary x1", 1, 0), ("unary x16", 16, 0), ("unary x64", 64, 0), ("Pipeline depth 1", 1, 1),
              ("Pipeline depth 16", 1, 16), ("Pipeline depth 64", 1, 64))


def main():
    duration, rounds, json_out = 3, 3, None
    for a in sys.argv[1:]:
        if a.startswith("--duration="):
            duration = int(a.split("=", 1)[1])
        elif a.startswith("--rounds="):
            rounds = int(a.split("=", 1)[1])
        elif a.startswith("--json="):
            json_out = a.split("=", 1)[1]
        else:
            sys.exit(__doc__)
    work = tempfile.mkdtemp(prefix="drey-pipeline-bench-")
    procs = []
    best = {}  # (op, system, mode) -> the round with the most operations/s
    try:
        dreyd, target = start_dreyd(work)
        procs.append(dreyd)
        mem, mem_port = start_redis(work, "redis-mem", None)
        procs.append(mem)
        always, always_port = start_redis(work, "redis-always", "always")
        procs.append(always)
        log("prefilling (%d keys)" % KEYS)
        drey_bench(target, "set", 0, streams=16, pipeline=64,
                   extra=("--distribution=sequential", "--count=%d" % KEYS, "--duration=0"))
        redis_benchmark(mem_port, "set", 16, KEYS)
        # Rounds interleave the systems: other work on a shared machine only
        # slows a run down, so the best round of each is kept.
        for rnd in range(1, rounds + 1):
            for op in ("get", "set"):
                runs = [("drey", op, label, lambda st=streams, pl=pipeline: measure_drey(dreyd, target, op, duration,
                                                                                       st, pl))
                        for label, streams, pipeline in DREY_MODES]
                proc, port, system = ((mem, mem_port, "redis") if op == "get"
                                      else (always, always_port, "redis appendfsync always"))
                runs += [(system, op, "-P %d" % d, lambda d=d, proc=proc, port=port: measure_redis(proc, port, op, d,
                                                                                                    duration))
                         for d in (1, 16, 64)]
                for system, op_, mode, fn in runs:
                    r = fn()
                    r.update(system=system, op=op_, mode=mode, round=rnd)
                    log("round %d %-26s %-4s %-18s %10.0f ops/s  server cpu %.2f us/op"
                        % (rnd, system, op_, mode, r["throughput"], r["server_cpu_us_per_op"]))
                    k = (op_, system, mode)
                    if k not in best or r["throughput"] > best[k]["throughput"]:
                        best[k] = r
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(work, ignore_errors=True)
    rows = list(best.values())
    print("| op | system | mode | ops/s | server CPU µs/op | p50 ms | p99 ms |")
    print("|---|---|---|---:|---:|---:|---:|")
    for r in rows:
        print("| %s | %s | %s | %.0f | %.2f | %s | %s |" % (
            r["op"], r["system"], r["mode"], r["throughput"], r["server_cpu_us_per_op"],
            "%.3f" % r["p50_ms"] if r.get("p50_ms") is not None else "",
            "%.3f" % r["p99_ms"] if r.get("p99_ms") is not None else ""))
    if json_out:
        with open(json_out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
