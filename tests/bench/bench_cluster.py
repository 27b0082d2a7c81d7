"""The cluster part of tests/bench/run.sh, called by bench.py after the single-node part.

In rounds (every system once per round and level, interleaved like the single-node scenarios):
  - a 3-node drey cluster with RF 2 under drey-bench --cluster (every call to its owner), Get and
    durable Set at 10x5 and 16x64, beside Redis Cluster (3 masters + 3 replicas, appendfsync always)
    under redis-benchmark --cluster at 50 and 1024 clients;
  - the same cluster entered through n1 by a plain client (cluster forwarding: 2/3 of the calls
    forwarded), at 16x64;
  - a 3-node cluster with RF 1 (durable Set at 16x64: replication's cost, RF 2 ÷ RF 1);
  - one standalone dreyd and a one-node cluster, both durable (the one node the cluster is compared
    with, and cluster mode's own cost on the request path);
  - pipelined (16 connections, --pipeline=64, once per round): the RF 1 cluster entered through n1
    (2/3 of the operations forwarded) and under drey-bench --cluster --pipeline (each operation on
    its owner's stream), and the standalone node: what a forwarded pipelined operation costs against
    a local one, and three nodes against one, without replication in either.
The clusters and the nodes come from tests/integration/python/drey_cluster.py and the flags from
tests/bench/cluster.py. After the rounds: pipelined drey beside pipelined Redis on one node
(tests/bench/pipeline.py), eviction hit ratio (tests/bench/eviction.py), watch
latency (tests/bench/watch_latency, as tests/bench/watch.sh runs it) and join/drain against store
size (tests/bench/join_drain.py), each run once with the sizes of the mode.
"""
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration", "python"))

CLK_TCK = os.sysconf("SC_CLK_TCK")

SERIES = {
    "c3_get": "3-node cluster RF 2 Get (--cluster)",
    "c3_set": "3-node cluster RF 2 Set durable (--cluster)",
    "c3_fwd_get": "3-node cluster RF 2 Get through n1 (forwarding)",
    "c3_fwd_set": "3-node cluster RF 2 Set durable through n1 (forwarding)",
    "c3rf1_set": "3-node cluster RF 1 Set durable (--cluster)",
    "one_get": "1 node Get (standalone, durable)",
    "one_set": "1 node Set durable (standalone)",
    "c1_get": "1-node cluster Get",
    "c1_set": "1-node cluster Set durable",
    "c3rf1_pipe_get": "3-node cluster RF 1 pipelined Get (--cluster --pipeline=64)",
    "c3rf1_pipe_set": "3-node cluster RF 1 pipelined Set durable (--cluster --pipeline=64)",
    "c3rf1_pipe_fwd_get": "3-node cluster RF 1 pipelined Get through n1 (--pipeline=64, forwarding)",
    "c3rf1_pipe_fwd_set": "3-node cluster RF 1 pipelined Set durable through n1 (--pipeline=64, forwarding)",
    "one_pipe_get": "1 node pipelined Get (standalone, durable, --pipeline=64)",
    "one_pipe_set": "1 node pipelined Set durable (standalone, --pipeline=64)",
    "rc_set": "Redis Cluster 3+3 SET appendfsync always",
    "rc_get": "Redis Cluster 3+3 GET",
}
ORDER = list(SERIES)

PIPELINE_DEPTH = 64


class Group:
    """Processes measured as one server (their CPU summed), for Bench.record_drey_bench and
    record_redis. It cannot be restarted: a member that died fails the runs that follow."""

    def __init__(self, name, procs, target=None, port=None, cluster=False):
        self.name, self.procs, self.target, self.port, self.cluster = name, procs, target, port, cluster
        self.proc = procs[0]

    def running(self):
        return all(p.poll() is None for p in self.procs)

    def cpu_seconds(self):
        total = 0
        for p in self.procs:
            with open("/proc/%d/stat" % p.pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        return total / CLK_TCK

    def log_tail(self, n=5):
        return ""

    def stop(self):
        pass

    def start(self):
        raise RuntimeError("%s cannot be restarted by the benchmark" % self.name)


def _redis_cluster(bench_mod, workdir):
    nodes = []
    for i in range(6):
        r = bench_mod.Redis("redis-cluster-%d" % i, workdir, "always")
        d = os.path.join(workdir, "redis-cluster-%d-data" % i)
        r.argv += ["--cluster-enabled", "yes", "--cluster-config-file", os.path.join(d, "nodes.conf"),
                   "--cluster-node-timeout", "5000",
                   # its bus port on its own free port (not port + 10000, past 65535 for a high port)
                   "--cluster-port", str(bench_mod.free_port())]
        r.start()
        nodes.append(r)
    p = subprocess.run(["redis-cli", "--cluster", "create"] + ["127.0.0.1:%d" % r.port for r in nodes] +
                       ["--cluster-replicas", "1", "--cluster-yes"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=120)
    if p.returncode != 0:
        raise RuntimeError("redis-cli --cluster create: %s" % p.stdout.decode()[-1000:])
    deadline = time.monotonic() + 60
    while not all("cluster_state:ok" in r.cli("cluster", "info") for r in nodes):
        if time.monotonic() > deadline:
            raise RuntimeError("Redis Cluster not ok within 60 s")
        time.sleep(0.1)
    return nodes


def _forwarded(servers):
    from drey_tokens import details
    return sum(int(details(s)["cluster"].get("forwardedCalls", 0)) for s in servers)


def run(b, s, workdir, results, bench_mod):
    """The cluster scenarios in rounds, then the single runs. Fills results["cluster"]."""
    os.environ["DREY_BIN"] = b.args.dreyd
    os.environ.setdefault("DREY_PROTO_DIR", os.path.join(b.args.repo, "proto"))
    tempfile.tempdir = workdir  # the harness's node directories (64 MiB segments) go with the run's
    from cluster import LIMITS
    from drey_cluster import Cluster
    from drey_harness import DreyServer
    from drey_tokens import poll

    out = results.setdefault("cluster", {})
    levels = [tuple(l) for l in s["cluster_levels"]]
    top = max(levels, key=lambda l: l[0] * l[1])
    with contextlib.ExitStack() as stack:
        groups = {}
        for name, nodes_n, rf in (("c3", 3, 2), ("c3rf1", 3, 1), ("c1", 1, 1)):
            c = stack.enter_context(Cluster(partitions=256, initial_nodes=nodes_n, ephemeral=False,
                                             extra_flags=LIMITS, replication_factor=rf))
            nodes = c.start(nodes_n)
            c.wait_assigned(nodes_n)
            for n in nodes:
                poll(lambda n=n: c.topology(n), lambda t: all(p.primary and len(p.replicas) == rf - 1
                                                              for p in t.partitions),
                     timeout=120, what="a full table at " + n.id)
            groups[name] = (Group(name, [n.server.proc for n in nodes], target=nodes[0].server.address),
                            [n.server for n in nodes])
        one = DreyServer(*LIMITS, name="one")
        one.start()
        stack.callback(one.stop)
        groups["one"] = (Group("one", [one.proc], target=one.address), [one])
        rc_nodes = _redis_cluster(bench_mod, workdir)
        for r in rc_nodes:
            stack.callback(r.stop)
        rc = Group("redis-cluster", [r.proc for r in rc_nodes], port=rc_nodes[0].port, cluster=True)
        bench_mod.log("cluster part: drey RF 2 %s, RF 1 %s, one-node cluster %s, standalone %s, Redis Cluster :%d"
              % tuple([groups[k][0].target for k in ("c3", "c3rf1", "c1", "one")] + [rc.port]))

        load = ["--mix=set", "--distribution=sequential", "--count=%d" % s["keys"], "--warmup=0"]
        for name, (g, _) in groups.items():
            b.drey_bench(g.target, load + (["--cluster"] if name.startswith("c3") else []), 4, 16, timed=False,
                         timeout=600)

        cl = ["--cluster"]
        redis_rates = {}

        def forwarding(scenario, group, extra, conns, streams, rnd):
            """A run through n1 by a plain client, with the share of its calls (or pipelined
            operations) that the nodes forwarded."""
            g, servers = group
            f0 = _forwarded(servers)
            run = b.record_drey_bench(scenario, g, extra, conns, streams, rnd, "drey")
            if run:  # the counter counts the warmup's calls too, as the CPU figures do
                window = (s["warmup_ms"] + s["duration_ms"]) / s["duration_ms"]
                run["forwarded_share"] = (_forwarded(servers) - f0) / max(1.0, (run["ok"] + run["errors"]) * window)

        for rnd in range(1, s["cluster_rounds"] + 1):
            bench_mod.log("cluster round %d of %d" % (rnd, s["cluster_rounds"]))
            for conns, streams in levels:
                for op in ("get", "set"):
                    b.record_drey_bench("c3_" + op, groups["c3"][0], ["--mix=" + op] + cl, conns, streams, rnd,
                                        "drey")
                    b.record_drey_bench("one_" + op, groups["one"][0], ["--mix=" + op], conns, streams, rnd, "drey")
                    b.record_drey_bench("c1_" + op, groups["c1"][0], ["--mix=" + op], conns, streams, rnd, "drey")
                    if (conns, streams) == top:
                        forwarding("c3_fwd_" + op, groups["c3"], ["--mix=" + op], conns, streams, rnd)
                if (conns, streams) == top:
                    b.record_drey_bench("c3rf1_set", groups["c3rf1"][0], ["--mix=set"] + cl, conns, streams, rnd,
                                        "drey")
                    for op in ("get", "set"):
                        pipe = ["--mix=" + op, "--pipeline=%d" % PIPELINE_DEPTH]
                        b.record_drey_bench("one_pipe_" + op, groups["one"][0], pipe, conns, 1, rnd, "drey")
                        b.record_drey_bench("c3rf1_pipe_" + op, groups["c3rf1"][0], pipe + cl, conns, 1, rnd, "drey")
                        forwarding("c3rf1_pipe_fwd_" + op, groups["c3rf1"], pipe, conns, 1, rnd)
                clients = conns * streams
                b.record_redis("rc_set", rc, "set", clients, rnd, redis_rates)
                b.record_redis("rc_get", rc, "get", clients, rnd, redis_rates)
    out["levels"] = levels
    out["pipeline_depth"] = PIPELINE_DEPTH

    for what, fn in (("pipeline", _pipeline), ("eviction", _eviction), ("watch", _watch),
                     ("join_drain", _join_drain)):
        try:
            t = time.monotonic()
            out[what] = fn(b, s, workdir, bench_mod)
            bench_mod.log("%s done in %.0f s" % (what, time.monotonic() - t))
        except Exception as e:
            b.fail(what, e)


def _script(b, argv, timeout):
    env = dict(os.environ, DREY_BIN=b.args.dreyd, DREY_BENCH_BIN=b.args.drey_bench)
    p = subprocess.run([sys.executable, "-B"] + argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                       timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (os.path.basename(argv[0]), p.returncode,
                                                   p.stderr.decode()[-2000:]))
    return p


def _pipeline(b, s, workdir, bench_mod):
    """Pipelined drey beside pipelined Redis on one node (tests/bench/pipeline.py)."""
    path = os.path.join(workdir, "pipeline.json")
    p = s["pipeline"]
    _script(b, [os.path.join(HERE, "pipeline.py"), "--duration=%d" % p["duration_s"], "--rounds=%d" % p["rounds"],
                "--json=" + path], 3600)
    with open(path) as f:
        return json.load(f)


def _eviction(b, s, workdir, bench_mod):
    path = os.path.join(workdir, "eviction.json")
    e = s["eviction"]
    _script(b, [os.path.join(HERE, "eviction.py"), "--keys=%d" % e["keys"], "--ops=%d" % e["ops"],
                "--cpu-writes=%d" % e["cpu_writes"], "--workloads=" + e["workloads"], "--out=" + path], 1800)
    with open(path) as f:
        return json.load(f)


def _watch(b, s, workdir, bench_mod):
    """Ack-to-event delay at 1 and 100 watchers on a durable dreyd (watch.sh's shapes)."""
    rows = []
    for watchers in (1, 100):
        node = bench_mod.Dreyd("drey-watch-%d" % watchers, b.args.dreyd, workdir, [])
        node.start()
        try:
            p = subprocess.run([b.args.watch_latency, "--target=" + node.target, "--watchers=%d" % watchers,
                                "--writes=%d" % s["watch_writes"]], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, timeout=600)
            if p.returncode != 0:
                raise RuntimeError("watch_latency: %s" % p.stderr.decode()[-1000:])
            row = {"watchers": watchers, "writes": s["watch_writes"], "output": p.stdout.decode()}
            for line in p.stdout.decode().splitlines():
                # an event can reach a watcher before the writer sees its acknowledgement: delays < 0
                num = r"(-?[\d.]+)"
                m = re.match(r"(Set latency|ack -> event delay)\s+n=(\d+) mean=%s p50=%s p90=%s p99=%s max=%s"
                             % ((num,) * 5), line)
                if m:
                    key = "set" if m.group(1) == "Set latency" else "delay"
                    row[key] = {"n": int(m.group(2)), "mean_us": float(m.group(3)), "p50_us": float(m.group(4)),
                                "p99_us": float(m.group(6)), "max_us": float(m.group(7))}
            rows.append(row)
            bench_mod.log("watch, %d watchers: ack -> event p50 %s us" % (watchers, row.get("delay", {}).get("p50_us")))
        finally:
            node.stop()
    return rows


def _join_drain(b, s, workdir, bench_mod):
    path = os.path.join(workdir, "join_drain.json")
    _script(b, [os.path.join(HERE, "join_drain.py"), "--binary=this=" + b.args.dreyd,
                "--entries=" + ",".join(str(n) for n in s["join_drain_entries"]), "--rf=2", "--json=" + path], 3600)
    with open(path) as f:
        return json.load(f)
