#!/usr/bin/python3
"""The drey benchmark: drey, etcd and Redis on loopback, in one run on one machine.

tests/bench/run.sh installs what is missing, builds dreyd and drey-bench and calls this script,
which
  1. starts every server it needs on free loopback ports: dreyd ephemeral, durable and with JWT
     keys, etcd (single node) and Redis with appendfsync always and no;
  2. runs the scenarios in rounds (every scenario once per round, systems interleaved, so a slow
     moment of a shared machine is spread over all of them) at each concurrency level;
  3. cross-checks drey with h2load, measures fdatasync, memory per entry and recovery times;
  4. stops everything it started (also on failure and Ctrl-C) and writes results.json, then
     report.py turns it into report.md and the plots.

It prints numbers and never judges them: targets are reported as met or missed, not asserted.
Only the Python standard library and Debian's tools are used.
"""
import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
import bench_cluster  # noqa: E402
import payloads  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")

# dreyd's admission limits for the load scenarios. The defaults (256 running, 128 queued, slowdown
# from 192) are sized for a node among many and refuse part of 1,024 concurrent durable Sets with
# QUEUE_FULL (the "default admission" scenario shows how many); etcd and Redis run without such
# limits, so the comparison raises them. Per-principal limits stay at their defaults (64 + 64): each
# connection is its own principal and keeps at most 64 calls in flight.
DREYD_LOAD_FLAGS = ["--max-inflight=2048", "--max-queued=2048", "--slowdown-at=2048"]

SERIES = {
    "health": "drey Health/Check (ceiling)",
    "get": "drey Get",
    "get_jwt": "drey Get, RS256 token",
    "set_eph": "drey Set ephemeral",
    "set_dur": "drey Set durable",
    "etcd_put": "etcd Put",
    "etcd_range": "etcd Range serializable",
    "redis_set_always": "Redis SET appendfsync always",
    "redis_set_no": "Redis SET appendfsync no",
    "redis_get": "Redis GET",
    "set_dur_default_admission": "drey Set durable, default admission",
}
SERIES.update(bench_cluster.SERIES)


def log(msg):
    print("[bench %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- processes ------------------------------------------------------------------------------

class Service:
    """A server this script started; every one is stopped by stop_all()."""

    started = []

    def __init__(self, name, argv, log_path, cwd=None):
        self.name, self.argv, self.log_path, self.cwd = name, argv, log_path, cwd
        self.proc = None
        self.log_offset = 0

    def start(self):
        self.log_offset = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
        logf = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=self.cwd, start_new_session=True)
        logf.close()
        Service.started.append(self)

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout=30):
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self in Service.started:
            Service.started.remove(self)

    def cpu_seconds(self):
        """user + system CPU time of the process so far."""
        with open("/proc/%d/stat" % self.proc.pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def log_text(self):
        with open(self.log_path, "rb") as f:
            f.seek(self.log_offset)
            return f.read().decode(errors="replace")

    def log_tail(self, n=20):
        return "\n".join(self.log_text().splitlines()[-n:])

    def wait_until(self, predicate, timeout, what):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running():
                raise RuntimeError("%s exited while waiting for %s:\n%s" % (self.name, what, self.log_tail()))
            if predicate():
                return
            time.sleep(0.05)
        raise RuntimeError("%s: no %s within %ds:\n%s" % (self.name, what, timeout, self.log_tail()))


def stop_all():
    for s in reversed(list(Service.started)):
        try:
            s.stop()
        except Exception as e:  # keep stopping the others
            log("stopping %s: %s" % (s.name, e))


class Dreyd(Service):
    def __init__(self, name, binary, workdir, extra):
        self.data_dir = os.path.join(workdir, name + "-data")
        os.makedirs(self.data_dir, exist_ok=True)
        argv = [binary, "--listen=127.0.0.1:0", "--ops-listen=127.0.0.1:0", "--data-dir=" + self.data_dir,
                "--drain-grace=0", "--shutdown-timeout=2s", "--node-id=bench-" + name] + extra
        super().__init__(name, argv, os.path.join(workdir, name + ".log"))
        self.port = self.ops_port = None
        self.recovery = None

    def events(self):
        out = []
        for line in self.log_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def start(self, timeout=120):
        super().start()

        def serving():
            for e in self.events():
                if e.get("msg") == "listening":
                    self.port, self.ops_port = e["port"], e["ops_port"]
                elif e.get("msg") == "recovery: done":
                    self.recovery = e
                elif e.get("msg") == "serving":
                    return True
            return False

        self.wait_until(serving, timeout, "\"serving\" log line")

    @property
    def target(self):
        return "127.0.0.1:%d" % self.port

    def http(self, path):
        with urllib.request.urlopen("http://127.0.0.1:%d%s" % (self.ops_port, path), timeout=10) as r:
            return r.read().decode()

    def details(self):
        return json.loads(self.http("/health/ready/details"))

    def requests_total(self, method, code="OK"):
        want = 'drey_requests_total{method="%s",code="%s"} ' % (method, code)
        for line in self.http("/metrics").splitlines():
            if line.startswith(want):
                return int(float(line[len(want):]))
        return 0

    def rss_bytes(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0


class Etcd(Service):
    def __init__(self, workdir):
        self.client_port, self.peer_port = free_port(), free_port()
        client = "http://127.0.0.1:%d" % self.client_port
        peer = "http://127.0.0.1:%d" % self.peer_port
        argv = ["etcd", "--name", "bench", "--data-dir", os.path.join(workdir, "etcd-data"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", "bench=" + peer, "--quota-backend-bytes", str(8 << 30)]
        super().__init__("etcd", argv, os.path.join(workdir, "etcd.log"))

    def start(self, timeout=60):
        super().start()
        self.wait_until(lambda: "ready to serve client requests" in self.log_text(), timeout, "readiness")

    @property
    def target(self):
        return "127.0.0.1:%d" % self.client_port


class Redis(Service):
    def __init__(self, name, workdir, appendfsync):
        self.port = free_port()
        d = os.path.join(workdir, name + "-data")
        os.makedirs(d, exist_ok=True)
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", d, "--save", "",
                "--daemonize", "no", "--protected-mode", "no"]
        if appendfsync:
            argv += ["--appendonly", "yes", "--appendfsync", appendfsync]
        else:
            argv += ["--appendonly", "no"]
        super().__init__(name, argv, os.path.join(workdir, name + ".log"))

    def cli(self, *args):
        return subprocess.run(["redis-cli", "-p", str(self.port)] + list(args), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=60).stdout.decode()

    def start(self, timeout=30):
        super().start()
        self.wait_until(lambda: self.cli("ping").strip() == "PONG", timeout, "PONG")

    def info(self, section):
        out = {}
        for line in self.cli("info", section).splitlines():
            if ":" in line:
                k, v = line.strip().split(":", 1)
                out[k] = v
        return out


# --- measuring ------------------------------------------------------------------------------

def machine_busy_seconds():
    """CPU seconds the whole machine spent busy (and stolen by the hypervisor) since boot."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (v + [0] * 8)[:8]
    return (user + nice + system + irq + softirq) / CLK_TCK, steal / CLK_TCK


class Meter:
    """CPU used over one run by a server, by the load tool (this script's reaped children) and by
    everything else on the machine (other users of a shared box show up there)."""

    def __init__(self, server):
        self.server = server

    def __enter__(self):
        self.t0 = time.monotonic()
        self.s0 = self.server.cpu_seconds() if self.server else 0.0
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.c0 = ru.ru_utime + ru.ru_stime
        self.m0, self.st0 = machine_busy_seconds()
        return self

    def __exit__(self, *exc):
        self.wall = time.monotonic() - self.t0
        self.server_cpu = (self.server.cpu_seconds() - self.s0) if self.server else 0.0
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.client_cpu = ru.ru_utime + ru.ru_stime - self.c0
        m1, st1 = machine_busy_seconds()
        self.other_cpu = max(0.0, (m1 - self.m0) - self.server_cpu - self.client_cpu)
        self.steal = st1 - self.st0
        return False

    def fields(self, calls):
        calls = max(1.0, calls)
        return {"server_cpu_us_per_call": self.server_cpu / calls * 1e6,
                "client_cpu_us_per_call": self.client_cpu / calls * 1e6,
                "server_cpu_cores": self.server_cpu / self.wall, "client_cpu_cores": self.client_cpu / self.wall,
                "other_cpu_cores": self.other_cpu / self.wall, "steal_cores": self.steal / self.wall}


class Bench:
    def __init__(self, args, settings, workdir):
        self.args, self.s, self.workdir = args, settings, workdir
        self.runs = []
        self.failures = []
        self.quiet_budget_s = settings["quiet_wait_budget_s"]
        self.quiet_waited_s = 0.0
        self.preloads = {}  # server -> function that loads its key space again after a restart

    def ensure_running(self, server):
        """A server that died (killed from outside on a shared machine, or crashed) is started again
        (with its data directory) and its key space loaded again, so one loss costs one run."""
        if server.running():
            return
        code = server.proc.returncode if server.proc else None
        self.fail("%s exited (code %s); restarting it" % (server.name, code),
                  RuntimeError(server.log_tail(5) if server.proc else ""))
        server.stop()
        server.start()
        if server in self.preloads:
            self.preloads[server]()

    def wait_for_quiet(self):
        """On a shared machine, waits (within a budget for the whole run) until other processes use
        less than a quarter of a core before a measurement starts. Returns the busy cores seen last."""
        deadline = time.monotonic() + min(10.0, max(0.0, self.quiet_budget_s - self.quiet_waited_s))
        t0 = time.monotonic()
        while True:
            b0, _ = machine_busy_seconds()
            time.sleep(0.2)
            b1, _ = machine_busy_seconds()
            busy = (b1 - b0) / 0.2
            if busy < 0.25 or time.monotonic() >= deadline:
                self.quiet_waited_s += time.monotonic() - t0
                return busy

    # drey-bench ----------------------------------------------------------------------------

    def drey_bench(self, target, extra, conns=1, streams=1, timed=True, timeout=None):
        argv = [self.args.drey_bench, "--target=" + target, "--connections=%d" % conns,
                "--streams=%d" % streams, "--json", "--keys=%d" % self.s["keys"],
                "--key-bytes=%d" % self.s["key_bytes"], "--value-bytes=%d" % self.s["value_bytes"]]
        if timed:
            argv += ["--warmup=%dms" % self.s["warmup_ms"], "--duration=%dms" % self.s["duration_ms"]]
        argv += extra
        if timeout is None:
            timeout = (self.s["warmup_ms"] + self.s["duration_ms"]) / 1000 + 60
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError("drey-bench failed (%d): %s" % (p.returncode, p.stderr.decode()[-2000:]))
        return json.loads(p.stdout)

    def record_drey_bench(self, scenario, server, extra, conns, streams, round_no, system):
        label = "%s %dx%d" % (SERIES[scenario], conns, streams)
        try:
            self.ensure_running(server)
            journal0 = journal_stats(server) if scenario.startswith("set_dur") else None
            busy_before = self.wait_for_quiet()
            with Meter(server) as m:
                d = self.drey_bench(server.target, extra + ["--label=" + label], conns, streams)
            if not server.running():
                raise RuntimeError("%s exited during the run" % server.name)
        except Exception as e:
            self.fail(label, e)
            return None
        window = (self.s["warmup_ms"] + self.s["duration_ms"]) / self.s["duration_ms"]
        calls_all = max(1.0, d["calls"] * window)  # calls in warmup + measured window, about
        lat = d["latency"]
        run = {
            "scenario": scenario, "series": SERIES[scenario], "system": system, "tool": "drey-bench",
            "round": round_no, "connections": conns, "streams": streams, "concurrency": conns * streams,
            "throughput": d["throughput"], "ok": d["ok"], "errors": d["errors"], "elapsed_s": d["elapsed_s"],
            "mean_ms": lat["mean_us"] / 1e3, "p50_ms": lat["p50_us"] / 1e3, "p90_ms": lat["p90_us"] / 1e3,
            "p99_ms": lat["p99_us"] / 1e3, "p999_ms": lat["p999_us"] / 1e3, "max_ms": lat["max_us"] / 1e3,
            "errors_by_status": d["errors_by_status"],
            "get_hit_ratio": (d["get_hits"] / (d["get_hits"] + d["get_misses"])
                              if d["get_hits"] + d["get_misses"] else None),
        }
        run.update(m.fields(calls_all))
        run["busy_cores_before"] = busy_before
        if journal0 is not None:
            run["journal"] = journal_delta(journal0, journal_stats(server), d["elapsed_s"] + self.s["warmup_ms"] / 1000)
        self.runs.append(run)
        log("%-44s %10.0f calls/s  p50 %7.3f ms  p99 %7.3f ms  errors %d  cpu/call server %.1f us client %.1f us"
            % (label, run["throughput"], run["p50_ms"], run["p99_ms"], run["errors"],
               run["server_cpu_us_per_call"], run["client_cpu_us_per_call"]))
        return run

    def fail(self, what, e):
        log("FAILED %s: %s" % (what, e))
        self.failures.append({"what": what, "error": str(e)[-2000:]})

    # redis-benchmark -------------------------------------------------------------------------

    def redis_benchmark(self, server, test, clients, requests):
        argv = ["redis-benchmark", "-p", str(server.port), "-t", test, "-c", str(clients), "-d",
                str(self.s["value_bytes"]), "-r", str(self.s["keys"]), "-n", str(requests), "--csv"]
        if getattr(server, "cluster", False):
            argv.append("--cluster")
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=600)
        lines = [l for l in p.stdout.decode().splitlines() if l.startswith('"%s"' % test.upper())]
        if p.returncode != 0 or not lines:
            raise RuntimeError("redis-benchmark failed: %s %s" % (p.stdout.decode()[-500:], p.stderr.decode()[-500:]))
        f = [x.strip('"') for x in lines[0].split(",")]
        # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max"
        return {"rps": float(f[1]), "mean_ms": float(f[2]), "p50_ms": float(f[4]), "p95_ms": float(f[5]),
                "p99_ms": float(f[6]), "max_ms": float(f[7])}

    def record_redis(self, scenario, server, test, clients, round_no, rates):
        label = "%s c=%d" % (SERIES[scenario], clients)
        key = (scenario, clients)
        try:
            self.ensure_running(server)
            if key not in rates:  # calibrate: how many requests fill the measured duration
                probe = self.redis_benchmark(server, test, clients, 500 if clients == 1 else 5000)
                rates[key] = probe["rps"]
            n = max(1000, int(rates[key] * (self.s["warmup_ms"] + self.s["duration_ms"]) / 1000))
            busy_before = self.wait_for_quiet()
            with Meter(server) as m:
                r = self.redis_benchmark(server, test, clients, n)
            if not server.running():
                raise RuntimeError("%s exited during the run" % server.name)
            rates[key] = r["rps"]
        except Exception as e:
            self.fail(label, e)
            return None
        run = {
            "scenario": scenario, "series": SERIES[scenario], "system": "redis", "tool": "redis-benchmark",
            "round": round_no, "connections": clients, "streams": 1, "concurrency": clients,
            "throughput": r["rps"], "ok": n, "errors": 0, "mean_ms": r["mean_ms"], "p50_ms": r["p50_ms"],
            "p90_ms": None, "p95_ms": r["p95_ms"], "p99_ms": r["p99_ms"], "p999_ms": None, "max_ms": r["max_ms"],
            "errors_by_status": [],
        }
        run.update(m.fields(n))
        run["busy_cores_before"] = busy_before
        self.runs.append(run)
        log("%-44s %10.0f calls/s  p50 %7.3f ms  p99 %7.3f ms  cpu/call server %.1f us client %.1f us"
            % (label, run["throughput"], run["p50_ms"], run["p99_ms"], run["server_cpu_us_per_call"],
               run["client_cpu_us_per_call"]))
        return run

    # h2load ----------------------------------------------------------------------------------

    def h2load(self, server, method, body_file, clients, streams):
        """h2load drives one method with one pre-encoded body; the server's own request counter
        confirms how many calls succeeded at the gRPC level (h2load only sees HTTP 200)."""
        self.ensure_running(server)
        ok0 = server.requests_total(method, "OK")
        self.wait_for_quiet()
        argv = ["h2load", "-c", str(clients), "-m", str(streams), "-t", "1",
                "-D", str(max(1, self.s["duration_ms"] // 1000)),
                "--warm-up-time=%d" % max(1, self.s["warmup_ms"] // 1000), "-d", body_file,
                "-H", "content-type: application/grpc", "-H", "te: trailers",
                "http://%s%s" % (server.target, method)]
        with Meter(server) as m:
            p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
        out = p.stdout.decode()
        time.sleep(0.2)
        ok1 = server.requests_total(method, "OK")
        res = {"method": method, "connections": clients, "streams": streams, "concurrency": clients * streams,
               "server_ok_calls": ok1 - ok0}
        for line in out.splitlines():
            line = line.strip()
            if line.startswith("finished in"):
                res["throughput"] = float(line.split(",")[1].split()[0])
            elif line.startswith("requests:"):
                parts = {w[1]: int(w[0]) for w in (x.split() for x in line[len("requests:"):].split(","))
                         if len(w) >= 2 and w[0].isdigit()}
                res["requests_done"] = parts.get("done")
                res["requests_succeeded"] = parts.get("succeeded")
            elif line.startswith("time for request:"):
                f = line.split(":", 1)[1].split()
                res["mean_ms"] = _duration_ms(f[2])
                res["max_ms"] = _duration_ms(f[1])
        if "throughput" not in res:
            raise RuntimeError("h2load: no result: %s" % out[-1000:])
        res.update(m.fields(res["throughput"] * m.wall))
        return res


def journal_stats(server):
    """Group-commit counters of a durable dreyd (its /metrics histograms' sums and counts)."""
    want = {"drey_journal_batch_records_sum": "records", "drey_journal_batch_records_count": "batches",
            "drey_journal_fsync_duration_seconds_sum": "fsync_s", "drey_journal_fsync_duration_seconds_count": "fsyncs"}
    out = {}
    for line in server.http("/metrics").splitlines():
        name, _, value = line.partition(" ")
        if name in want:
            out[want[name]] = float(value)
    return out


def journal_delta(a, b, seconds):
    d = {k: b.get(k, 0) - a.get(k, 0) for k in ("records", "batches", "fsync_s", "fsyncs")}
    return {"records_per_batch": d["records"] / d["batches"] if d["batches"] else None,
            "batches_per_s": d["batches"] / seconds if seconds else None,
            "fsync_mean_ms": d["fsync_s"] / d["fsyncs"] * 1e3 if d["fsyncs"] else None,
            "fsync_busy_fraction": d["fsync_s"] / seconds if seconds else None}


def _duration_ms(text):
    for unit, mult in (("us", 1e-3), ("ms", 1.0), ("s", 1e3)):
        if text.endswith(unit):
            return float(text[:-len(unit)]) * mult
    return float(text)


def fdatasync_probe(directory, iterations):
    """Latency of appending a journal-sized record to a preallocated file and fdatasync-ing it,
    in the directory the servers' data lives in (drey's journal does the same per group commit)."""
    path = os.path.join(directory, "fdatasync-probe")
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)
    try:
        os.posix_fallocate(fd, 0, 64 << 20)
        os.fsync(fd)
        record = b"r" * 320
        samples = []
        for i in range(iterations):
            os.pwrite(fd, record, i * len(record))
            t = time.perf_counter()
            os.fdatasync(fd)
            samples.append((time.perf_counter() - t) * 1e3)
    finally:
        os.close(fd)
        os.unlink(path)
    samples.sort()
    q = lambda p: samples[min(len(samples) - 1, int(p / 100 * len(samples)))]  # noqa: E731
    return {"iterations": iterations, "p50_ms": q(50), "p90_ms": q(90), "p99_ms": q(99),
            "mean_ms": statistics.mean(samples)}


def machine_info(workdir):
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem_kb = int(f.readline().split()[1])
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    fs = subprocess.run(["stat", "-f", "-c", "%T", workdir], stdout=subprocess.PIPE).stdout.decode().strip()

    def version(argv):
        try:
            out = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=10).stdout
            return out.decode().splitlines()[0].strip()
        except Exception:
            return "unknown"

    def pkg(name):
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", name], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL).stdout.decode()
        return out or "unknown"

    return {
        "nproc": os.cpu_count(), "cpu": cpu, "kernel": platform.release(), "memory_gib": round(mem_kb / 2**20, 1),
        "load_average_before": load, "data_filesystem": fs,
        "versions": {"etcd": version(["etcd", "--version"]), "redis": version(["redis-server", "--version"]),
                     "h2load": version(["h2load", "--version"]), "libgrpc": pkg("libgrpc29"),
                     "debian": open("/etc/debian_version").read().strip()},
    }


# --- the run --------------------------------------------------------------------------------

def settings_for(quick):
    """Full: three rounds of every single-node scenario and two of the cluster's, 1,000,000 entries
    for memory and recovery. Quick: one round of each, 50,000 entries, about 3 minutes on 2 cores."""
    common = {"levels": [(1, 1), (4, 16), (16, 64)], "key_bytes": 8, "value_bytes": 256, "redis_clients": [1, 50],
              "warmup_ms": 500, "cluster_levels": [(10, 5), (16, 64)]}
    if quick:
        return dict(common, mode="quick", rounds=1, duration_ms=1500, keys=20000, memory_entries=50000,
                    fdatasync_iterations=300, quiet_wait_budget_s=5, cluster_rounds=1, watch_writes=500,
                    join_drain_entries=[20000],
                    eviction={"keys": 1000, "ops": 2000, "cpu_writes": 2000, "workloads": "stationary"},
                    pipeline={"duration_s": 1, "rounds": 1},
                    h2load=[("health", 16, 64), ("get", 16, 64)])
    return dict(common, mode="full", rounds=3, duration_ms=2500, keys=100000, memory_entries=1000000,
                fdatasync_iterations=1000, quiet_wait_budget_s=45, cluster_rounds=2, watch_writes=2000,
                join_drain_entries=[100000, 1000000],
                eviction={"keys": 20000, "ops": 100000, "cpu_writes": 100000, "workloads": "stationary,shifting"},
                pipeline={"duration_s": 3, "rounds": 3},
                h2load=[("health", 1, 1), ("get", 1, 1), ("health", 16, 64), ("get", 16, 64), ("set_dur", 16, 64)])


def run(args):
    s = settings_for(args.quick)
    t_start = time.monotonic()
    workdir = tempfile.mkdtemp(prefix="drey-bench-", dir=args.workdir)
    results = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "settings": {k: v for k, v in s.items()}, "dreyd_load_flags": DREYD_LOAD_FLAGS,
        "machine": machine_info(workdir), "command": args.command,
    }
    b = Bench(args, s, workdir)
    try:
        _run(b, s, workdir, results)
    finally:
        stop_all()
        results["runs"] = b.runs
        results["failures"] = b.failures
        results["elapsed_s"] = round(time.monotonic() - t_start, 1)
        results["quiet_waited_s"] = round(b.quiet_waited_s, 1)
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(results, f, indent=1)
        if b.failures:
            logs = os.path.join(args.out, "logs")
            os.makedirs(logs, exist_ok=True)
            for name in os.listdir(workdir):
                if name.endswith(".log"):
                    shutil.copy(os.path.join(workdir, name), logs)
        shutil.rmtree(workdir, ignore_errors=True)
    log("done in %.0f s; results in %s" % (time.monotonic() - t_start, args.out))
    return 0


def _run(b, s, workdir, results):
    args = b.args
    log("machine: %(nproc)s x %(cpu)s, kernel %(kernel)s, data on %(data_filesystem)s" % results["machine"])
    if results["machine"]["data_filesystem"] in ("tmpfs", "ramfs"):
        log("warning: %s is %s: fdatasync costs nothing there; pass --workdir on a disk"
            % (workdir, results["machine"]["data_filesystem"]))

    # Disk first, on a quiet machine.
    results["fdatasync"] = fdatasync_probe(workdir, s["fdatasync_iterations"])
    log("fdatasync of a 320-byte append: p50 %.3f ms p99 %.3f ms" % (results["fdatasync"]["p50_ms"],
                                                                      results["fdatasync"]["p99_ms"]))

    # Request bodies and tokens.
    etcd_put, etcd_range = os.path.join(workdir, "etcd-put.frames"), os.path.join(workdir, "etcd-range.frames")
    payloads.write_etcd_payloads(etcd_put, etcd_range, s["keys"], s["key_bytes"], s["value_bytes"])
    bodies = {
        "health": (os.path.join(workdir, "health.frame"), "/grpc.health.v1.Health/Check"),
        "get": (os.path.join(workdir, "get.frame"), "/drey.cache.v1.Cache/Get"),
        "set_dur": (os.path.join(workdir, "set.frame"), "/drey.cache.v1.Cache/Set"),
    }
    with open(bodies["health"][0], "wb") as f:
        f.write(payloads.frame(b""))
    payloads.write_drey_frame(bodies["get"][0], args.repo, "drey.cache.v1.GetRequest",
                              'key: "%s"' % payloads.key_of(1, s["key_bytes"]))
    payloads.write_drey_frame(bodies["set_dur"][0], args.repo, "drey.cache.v1.SetRequest",
                              'key: "%s" value { bytes_value: "%s" }'
                              % (payloads.key_of(1, s["key_bytes"]), payloads.value_text(s["value_bytes"])))
    snapshot_frame = os.path.join(workdir, "snapshot.frame")
    with open(snapshot_frame, "wb") as f:
        f.write(payloads.frame(b""))
    keys_dir = os.path.join(workdir, "jwt-keys")
    os.makedirs(keys_dir)
    private = payloads.make_rsa_key(workdir, keys_dir, "bench")
    tokens_file = os.path.join(workdir, "tokens")
    max_conns = max(c for c, _ in s["levels"])
    with open(tokens_file, "w") as f:
        for i in range(max_conns):  # one principal per connection, like anonymous conn:<peer>
            f.write(payloads.mint_rs256(private, "bench", "bench-%d" % i) + "\n")

    # Servers.
    dreyd = args.dreyd
    eph = Dreyd("drey-ephemeral", dreyd, workdir, ["--ephemeral"] + DREYD_LOAD_FLAGS)
    dur = Dreyd("drey-durable", dreyd, workdir, DREYD_LOAD_FLAGS)
    jwt = Dreyd("drey-jwt", dreyd, workdir, ["--ephemeral", "--jwt-keys-dir=" + keys_dir] + DREYD_LOAD_FLAGS)
    etcd = Etcd(workdir)
    r_always = Redis("redis-always", workdir, "always")
    r_no = Redis("redis-no", workdir, "no")
    for srv in (eph, dur, jwt, etcd, r_always, r_no):
        srv.start()
    log("servers up: drey %s (ephemeral) %s (durable) %s (jwt), etcd %s, redis :%d (always) :%d (no)"
        % (eph.target, dur.target, jwt.target, etcd.target, r_always.port, r_no.port))

    # Preload the key space where reads happen (and where etcd Puts overwrite).
    load = ["--mix=set", "--distribution=sequential", "--count=%d" % s["keys"], "--warmup=0"]
    b.preloads = {
        eph: lambda: b.drey_bench(eph.target, load, 4, 16, timed=False, timeout=600),
        jwt: lambda: b.drey_bench(jwt.target, load + ["--tokens-file=" + tokens_file], 4, 16, timed=False,
                                  timeout=600),
        etcd: lambda: b.drey_bench(etcd.target, ["--raw-method=/etcdserverpb.KV/Put", "--raw-payloads=" + etcd_put,
                                                 "--distribution=sequential", "--count=%d" % s["keys"]], 4, 16,
                                   timed=False, timeout=600),
        r_no: lambda: _redis_preload(r_no, s["keys"], s["value_bytes"]),
    }
    for preload in b.preloads.values():
        preload()
    log("preloaded %d keys into drey (ephemeral, jwt), etcd and redis" % s["keys"])

    scenarios = [
        ("health", eph, ["--mix=health"], "drey"),
        ("get", eph, ["--mix=get"], "drey"),
        ("get_jwt", jwt, ["--mix=get", "--tokens-file=" + tokens_file], "drey"),
        ("set_eph", eph, ["--mix=set"], "drey"),
        ("set_dur", dur, ["--mix=set"], "drey"),
        ("etcd_put", etcd, ["--raw-method=/etcdserverpb.KV/Put", "--raw-payloads=" + etcd_put], "etcd"),
        ("etcd_range", etcd, ["--raw-method=/etcdserverpb.KV/Range", "--raw-payloads=" + etcd_range], "etcd"),
    ]
    redis_rates = {}
    results["h2load"] = []
    for rnd in range(1, s["rounds"] + 1):
        log("round %d of %d" % (rnd, s["rounds"]))
        for conns, streams in s["levels"]:
            for scenario, server, extra, system in scenarios:
                b.record_drey_bench(scenario, server, extra, conns, streams, rnd, system)
        for clients in s["redis_clients"]:
            b.record_redis("redis_set_always", r_always, "set", clients, rnd, redis_rates)
            b.record_redis("redis_set_no", r_no, "set", clients, rnd, redis_rates)
            b.record_redis("redis_get", r_no, "get", clients, rnd, redis_rates)
        # h2load: the same dreyd driven by an independent HTTP/2 client.
        for scenario, conns, streams in s["h2load"]:
            server = dur if scenario == "set_dur" else eph
            body, method = bodies[scenario]
            try:
                res = b.h2load(server, method, body, conns, streams)
                res.update(scenario=scenario, series=SERIES[scenario], round=rnd)
                results["h2load"].append(res)
                log("h2load %-37s %dx%d %10.0f calls/s (server counted %d OK)"
                    % (SERIES[scenario], conns, streams, res["throughput"], res["server_ok_calls"]))
            except Exception as e:
                b.fail("h2load %s %dx%d" % (scenario, conns, streams), e)

    for srv in (eph, jwt, etcd, r_always, r_no, dur):
        srv.stop()

    # Durable Sets at 16x64 with dreyd's default admission limits: what the refusals look like.
    default = Dreyd("drey-default-admission", dreyd, workdir, [])
    default.start()
    c, st = s["levels"][-1]
    b.record_drey_bench("set_dur_default_admission", default, ["--mix=set"], c, st, 1, "drey")
    default.stop()

    results["memory"], results["recovery"] = _memory_and_recovery(b, s, workdir, snapshot_frame)

    # Clusters beside Redis Cluster, replication, forwarding, eviction, watch, join/drain.
    try:
        bench_cluster.run(b, s, workdir, results, sys.modules[__name__])
    except Exception as e:
        b.fail("cluster part", e)
        stop_all()


def _redis_preload(redis, keys, value_bytes):
    """SET key:<12 digits> (redis-benchmark's -r key format) for the whole key space."""
    value = payloads.value_text(value_bytes).encode()
    p = subprocess.Popen(["redis-cli", "-p", str(redis.port), "--pipe"], stdin=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _write_resp_sets(p.stdin, ("key:%012d" % i for i in range(keys)), value)
    p.stdin.close()
    p.wait(600)


def _write_resp_sets(out, keys, value):
    chunk = []
    tail = b"\r\n$%d\r\n%s\r\n" % (len(value), value)
    for k in keys:
        kb = k.encode()
        chunk.append(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s%s" % (len(kb), kb, tail))
        if len(chunk) == 4096:
            out.write(b"".join(chunk))
            chunk = []
    out.write(b"".join(chunk))


def _memory_and_recovery(b, s, workdir, snapshot_frame):
    for attempt in (1, 2):
        memory, recovery, ok = _memory_and_recovery_once(b, s, workdir, snapshot_frame, attempt)
        if ok:
            break
    return memory, recovery


def _memory_and_recovery_once(b, s, workdir, snapshot_frame, attempt):
    """Loads N entries (the benchmark's keys and values) into a durable dreyd, reads its memory
    figures, restarts it twice (journal replay, then from a snapshot) and loads the same data into
    Redis for its used_memory."""
    n = s["memory_entries"]
    memory, recovery = {"entries": n, "key_bytes": s["key_bytes"], "value_bytes": s["value_bytes"]}, {"entries": n}
    # fsync=never only to load faster: the journal holds the same records either way.
    node = Dreyd("drey-memory-%d" % attempt, b.args.dreyd, workdir,
                 ["--fsync=never", "--snapshot-every-bytes=0", "--snapshot-every=0"] + DREYD_LOAD_FLAGS)
    ok = True
    try:
        node.start()
        before = node.details()["memory"]
        rss0 = node.rss_bytes()
        t = time.monotonic()
        load = b.drey_bench(node.target, ["--mix=set", "--distribution=sequential", "--count=%d" % n,
                                          "--keys=%d" % n, "--warmup=0"], 16, 64, timed=False, timeout=900)
        memory["load_s"] = round(time.monotonic() - t, 2)
        memory["load_errors"] = load["errors"]
        if load["errors"] or not node.running():
            raise RuntimeError("loading failed: %d errors, dreyd %s" % (
                load["errors"], "running" if node.running() else "exited"))
        time.sleep(0.5)
        after = node.details()["memory"]
        memory["drey_used_bytes_per_entry"] = (after["usedBytes"] - before["usedBytes"]) / n
        memory["drey_jemalloc_bytes_per_entry"] = (after["jemallocAllocatedBytes"]
                                                   - before["jemallocAllocatedBytes"]) / n
        memory["drey_rss_bytes_per_entry"] = (node.rss_bytes() - rss0) / n
        log("drey: %d entries loaded in %.1f s; per entry: %.1f B jemalloc-allocated, %.1f B accounted, %.1f B RSS"
            % (n, memory["load_s"], memory["drey_jemalloc_bytes_per_entry"], memory["drey_used_bytes_per_entry"],
               memory["drey_rss_bytes_per_entry"]))

        node.stop()
        node.start(timeout=300)
        recovery["replay"] = _recovery_fields(node.recovery)
        log("drey restart, journal replay: %s ms (%s records)" % (recovery["replay"].get("ms"),
                                                                 recovery["replay"].get("replayed_records")))
        snap = b.drey_bench(node.target, ["--raw-method=/drey.admin.v1.Admin/Snapshot",
                                          "--raw-payloads=" + snapshot_frame, "--keys=1", "--count=1",
                                          "--timeout=300s"],
                            1, 1, timed=False, timeout=400)
        recovery["snapshot_call_errors"] = snap["errors"]
        recovery["snapshot_call_ms"] = snap["latency"]["max_us"] / 1e3
        node.stop()
        node.start(timeout=300)
        recovery["snapshot"] = _recovery_fields(node.recovery)
        log("drey restart from a snapshot: %s ms (%s records replayed after it)"
            % (recovery["snapshot"].get("ms"), recovery["snapshot"].get("replayed_records")))
    except Exception as e:
        b.fail("memory/recovery (drey), attempt %d" % attempt, e)
        ok = False
    finally:
        node.stop()
    if not ok and attempt == 1:
        shutil.rmtree(node.data_dir, ignore_errors=True)
        return memory, recovery, False

    redis = Redis("redis-memory", workdir, None)
    try:
        redis.start()
        used0 = int(redis.info("memory")["used_memory"])
        rss0 = int(redis.info("memory")["used_memory_rss"])
        value = payloads.value_text(s["value_bytes"]).encode()
        p = subprocess.Popen(["redis-cli", "-p", str(redis.port), "--pipe"], stdin=subprocess.PIPE,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _write_resp_sets(p.stdin, (payloads.key_of(i, s["key_bytes"]) for i in range(n)), value)
        p.stdin.close()
        p.wait(600)
        info = redis.info("memory")
        keys = int(redis.cli("dbsize").strip())
        memory["redis_keys"] = keys
        memory["redis_used_memory_per_key"] = (int(info["used_memory"]) - used0) / max(1, keys)
        memory["redis_rss_per_key"] = (int(info["used_memory_rss"]) - rss0) / max(1, keys)
        log("redis: %d keys; used_memory per key %.1f B, RSS per key %.1f B"
            % (keys, memory["redis_used_memory_per_key"], memory["redis_rss_per_key"]))
    except Exception as e:
        b.fail("memory (redis)", e)
    finally:
        redis.stop()
    return memory, recovery, ok


def _recovery_fields(event):
    if not event:
        return {}
    return {k: event.get(k) for k in ("ms", "replayed_records", "snapshot_lsn", "last_lsn", "torn_tails_cut")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="shorter runs, smaller data (about 2 minutes)")
    ap.add_argument("--out", required=True, help="results directory")
    ap.add_argument("--dreyd", required=True)
    ap.add_argument("--drey-bench", dest="drey_bench", required=True)
    ap.add_argument("--watch-latency", dest="watch_latency", required=True, help="tests/bench:watch_latency")
    ap.add_argument("--repo", required=True, help="the drey checkout (for proto/)")
    ap.add_argument("--workdir", default=None, help="where data directories go (a disk, not tmpfs)")
    ap.add_argument("--command", default="tests/bench/run.sh", help="the command line, for the report")
    args = ap.parse_args()

    def on_signal(signum, frame):
        raise SystemExit("interrupted by signal %d" % signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
