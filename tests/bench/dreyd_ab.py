#!/usr/bin/python3
"""Two (or more) dreyd binaries side by side: Get (ephemeral) and durable Set at 16x64 and 10x5,
alternating binaries within each round; server CPU per call (utime + stime from /proc / calls)
and throughput, medians over the rounds. Prints numbers, never fails on them.

    DREY_BENCH_BIN=bazel-bin/drey-bench ROUNDS=3 DUR=3 \
        /usr/bin/python3 tests/bench/dreyd_ab.py before=/path/to/old/dreyd after=/path/to/new/dreyd

(copy the binaries out of bazel-bin first: another build may replace them meanwhile).
"""
import json, os, re, shutil, statistics, subprocess, sys, tempfile, time
TICK = os.sysconf("SC_CLK_TCK")
BENCH = os.environ.get("DREY_BENCH_BIN", "bazel-bin/drey-bench")
LIM = ["--max-inflight=4096", "--max-queued=4096", "--slowdown-at=4096", "--principal-max-inflight=4096", "--principal-max-queued=4096"]
DIRS = []  # data directories (durable: 64 MiB segments), removed at the end


def start(binary, extra, name):
    d = tempfile.mkdtemp(prefix="dreyd-ab-")
    DIRS.append(d)
    log = open(d + "/log", "w")
    p = subprocess.Popen([binary, "--listen=127.0.0.1:0", "--ops-listen=", "--data-dir=" + d + "/data"] + LIM + extra, stderr=log, stdout=log)
    for _ in range(600):
        t = open(d + "/log").read()
        if '"serving"' in t:
            return p, int(re.search(r'"port":(\d+)', t).group(1))
        time.sleep(0.05)
    raise SystemExit("no start " + name)
def cpu(pid):
    f = open("/proc/%d/stat" % pid).read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / TICK
def bench(port, mix, c, s, dur, extra=()):
    out = subprocess.run([BENCH, "--target=127.0.0.1:%d" % port, "--connections=%d" % c, "--streams=%d" % s, "--mix=%s:1" % mix, "--keys=20000", "--value-bytes=256", "--json"] + list(extra) + (["--duration=%gs" % dur, "--warmup=0"] if dur else []), capture_output=True, text=True)
    return json.loads(out.stdout)
binaries = dict(a.split("=", 1) for a in sys.argv[1:])
rounds = int(os.environ.get("ROUNDS", 3)); dur = float(os.environ.get("DUR", 3))
res = {}
for mode, extra in (("ephemeral", ["--ephemeral"]), ("durable", [])):
    srv = {n: start(b, extra, n) for n, b in binaries.items()}
    for n, (p, port) in srv.items():
        bench(port, "set", 4, 16, 0, ["--distribution=sequential", "--count=20000"])
    for r in range(rounds):
        for mix in (("get",) if mode == "ephemeral" else ("set",)):
            for c, s in ((16, 64), (10, 5)):
                for n, (p, port) in srv.items():
                    c0 = cpu(p.pid); d = bench(port, mix, c, s, dur); c1 = cpu(p.pid)
                    k = "%s %s %dx%d" % (mode, mix, c, s)
                    res.setdefault(k, {}).setdefault(n, []).append(((c1 - c0) / d["calls"] * 1e6, d["throughput"]))
                    print("%s %s round %d: %.1f us/call %.0f/s" % (k, n, r, (c1 - c0) / d["calls"] * 1e6, d["throughput"]), flush=True)
    for p, _ in srv.values():
        p.terminate(); p.wait()
for d in DIRS:
    shutil.rmtree(d, ignore_errors=True)
names = list(binaries)
print("| scenario | " + " | ".join("%s µs/call (median)" % n for n in names) + " | %s ÷ %s | throughput %s ÷ %s |" % (names[-1], names[0], names[-1], names[0]))
for k, v in res.items():
    m = {n: statistics.median(x[0] for x in v[n]) for n in names}
    t = {n: statistics.median(x[1] for x in v[n]) for n in names}
    print("| %s | %s | %.3f | %.3f |" % (k, " | ".join("%.1f" % m[n] for n in names), m[names[-1]] / m[names[0]], t[names[-1]] / t[names[0]]))
