#!/usr/bin/python3
"""Eviction benchmark: hit ratio under a zipfian read/write workload, drey with
each --eviction policy beside Redis allkeys-lru and allkeys-lfu given the same
memory for data, and the CPU each policy adds per write.

    tests/bench/eviction.py [--ops=N] [--keys=N] [--out=FILE]

(builds nothing: run `bazel build //:dreyd //:drey-bench` first; DREY_BIN and
DREY_BENCH_BIN override where they are; copy the binaries elsewhere if another
build, e.g. --config=asan, may move bazel-bin meanwhile). Needs redis-server
(Debian's redis-server; tests/bench/run.sh installs it). Prints numbers,
asserts nothing; results of a run: tests/bench/results/2026-12-01/eviction.md.

Hit ratio. One client, one call at a time, the same seeded key sequence for
every system: each operation picks a key from a zipf(0.99) distribution over
--keys keys; 90% are reads done cache-aside (GET; on a miss, SET the value, as
an application filling its cache from a database would), 10% are writes (SET).
The hit ratio is hits / reads after a warmup of --keys operations. Two
workloads: stationary (the same popularity throughout) and shifting (halfway
through the measured operations another random set of keys becomes popular).
Memory for data holds about 10% of the keys: drey's critical level (95% of
--memory-limit) is 10% of the keys times drey's accounted entry size (header,
bucket pointer, key, value); Redis's maxmemory is its used_memory when empty
plus the same bytes. Both report how many keys they held at the end.
volatile-* policies only evict keys with an expiry, so their runs give every
write a ttl of one hour (the same for all keys: volatile-ttl then evicts the
oldest writes first).

CPU per write. An ephemeral dreyd with a 16 MiB limit is filled, then
drey-bench writes new keys (every write evicts) while the server's CPU time
(utime + stime from /proc) is read before and after; the baseline is policy
none with a limit large enough that nothing is evicted.
"""
import argparse
import bisect
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(TOP, "tests", "integration", "python"))
sys.dont_write_bytecode = True

import grpc  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
VALUE = 1000
KEY_FMT = "key:%07d"  # 11 bytes
DREY_OVERHEAD = 52     # accounted bytes beyond key and value (tests/bench/store_memory)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def wait_for(pred, timeout, what):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.02)
    raise RuntimeError("timed out waiting for " + what)


class Dreyd:
    def __init__(self, binary, *flags):
        self.dir = tempfile.mkdtemp(prefix="drey-evict-bench-")
        self.port = free_port()
        self.log = open(os.path.join(self.dir, "stderr.log"), "wb")
        self.proc = subprocess.Popen([binary, "--listen=127.0.0.1:%d" % self.port, "--ephemeral", "--ops-listen=",
                                      "--drain-grace=0s", "--log-level=warn"] + list(flags),
                                     stdout=subprocess.DEVNULL, stderr=self.log)
        self.channel = grpc.insecure_channel("127.0.0.1:%d" % self.port)
        grpc.channel_ready_future(self.channel).result(timeout=30)

    def stop(self):
        self.channel.close()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
        self.log.close()
        shutil.rmtree(self.dir, True)


class Redis:
    """redis-server on a free loopback port and a minimal RESP client."""

    def __init__(self, policy):
        self.dir = tempfile.mkdtemp(prefix="redis-evict-bench-")
        self.port = free_port()
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
                                      self.dir, "--save", "", "--appendonly", "no", "--maxmemory-policy", policy],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def up():
            try:
                self.sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
                return True
            except OSError:
                return False
        wait_for(up, 30, "redis-server")
        self.buf = b""

    def _line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise RuntimeError("redis closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _read(self):
        line = self._line()
        t, rest = line[:1], line[1:]
        if t in (b"+", b":"):
            return int(rest) if t == b":" else rest
        if t == b"-":
            raise RuntimeError("redis: " + rest.decode())
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            while len(self.buf) < n + 2:
                self.buf += self.sock.recv(65536)
            data, self.buf = self.buf[:n], self.buf[n + 2:]
            return data
        if t == b"*":
            return [self._read() for _ in range(int(rest))]
        raise RuntimeError("unexpected RESP %r" % line)

    def cmd(self, *args):
        out = b"*%d\r\n" % len(args)
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        self.sock.sendall(out)
        return self._read()

    def used_memory(self):
        info = self.cmd("INFO", "memory").decode()
        return int([ln for ln in info.split("\r\n") if ln.startswith("used_memory:")][0].split(":")[1])

    def stop(self):
        self.sock.close()
        self.proc.terminate()
        self.proc.wait(30)
        shutil.rmtree(self.dir, True)


def zipf_sequence(n_keys, n_ops, s, seed, shift_at=None):
    rnd = random.Random(seed)
    weights = [1.0 / (r ** s) for r in range(1, n_keys + 1)]
    total = sum(weights)
    cdf, acc = [], 0.0
    for w in weights:
        acc += w / total
        cdf.append(acc)
    perm = list(range(n_keys))
    rnd.shuffle(perm)  # rank -> key: popular keys are spread over the key space
    shifted = list(range(n_keys))
    rnd.shuffle(shifted)  # the second half's popularity: a new hot set
    ops = []
    for i in range(n_ops):
        rank = min(bisect.bisect_left(cdf, rnd.random()), n_keys - 1)
        p = shifted if shift_at is not None and i >= shift_at else perm
        ops.append((KEY_FMT % p[rank], rnd.random() < 0.9))
    return ops


def run_hit_ratio(ops, warmup, get, put):
    hits = reads = 0
    t0 = time.monotonic()
    for i, (key, is_read) in enumerate(ops):
        if is_read:
            hit = get(key)
            if not hit:
                put(key)
            if i >= warmup:
                reads += 1
                hits += hit
        else:
            put(key)
    return hits / reads if reads else 0.0, time.monotonic() - t0


def drey_hit_ratio(pb, binary, policy, budget, ops, warmup):
    limit = budget * 100 // 95 + 1
    d = Dreyd(binary, "--memory-limit=%d" % limit, "--eviction=" + policy)
    try:
        get = d.channel.unary_unary("/drey.cache.v1.Cache/Get", request_serializer=pb.GetRequest.SerializeToString,
                                    response_deserializer=pb.GetResponse.FromString)
        set_ = d.channel.unary_unary("/drey.cache.v1.Cache/Set", request_serializer=pb.SetRequest.SerializeToString,
                                     response_deserializer=pb.SetResponse.FromString)
        stats = d.channel.unary_unary("/drey.cache.v1.Cache/GetCacheStats",
                                      request_serializer=pb.GetCacheStatsRequest.SerializeToString,
                                      response_deserializer=pb.CacheStats.FromString)
        value = pb.Value(bytes_value=b"v" * VALUE)
        ttl = {"ttl": {"seconds": 3600}} if policy.startswith("volatile") else {}
        refused = [0]

        def put(key):
            try:
                set_(pb.SetRequest(key=key, value=value, **ttl), timeout=30)
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                refused[0] += 1

        ratio, secs = run_hit_ratio(ops, warmup, lambda k: get(pb.GetRequest(key=k), timeout=30).found, put)
        st = stats(pb.GetCacheStatsRequest(), timeout=30)
        return {"system": "drey", "policy": policy, "hit_ratio": ratio, "keys_held": st.entries,
                "evictions": st.evictions, "refused_writes": refused[0], "seconds": round(secs, 1),
                "memory_limit": limit, "data_bytes": budget}
    finally:
        d.stop()


def redis_per_key(n):
    """Redis's used_memory per key of this workload's shape, measured."""
    r = Redis("noeviction")
    try:
        base = r.used_memory()
        value = b"v" * VALUE
        for i in range(n):
            r.cmd("SET", KEY_FMT % i, value)
        return (r.used_memory() - base) / n
    finally:
        r.stop()


def redis_hit_ratio(policy, budget, ops, warmup, label):
    r = Redis(policy)
    try:
        base = r.used_memory()
        r.cmd("CONFIG", "SET", "maxmemory", int(base + budget))
        value = b"v" * VALUE
        ratio, secs = run_hit_ratio(ops, warmup, lambda k: r.cmd("GET", k) is not None,
                                    lambda k: r.cmd("SET", k, value))
        info = r.cmd("INFO", "stats").decode()
        ev = int([ln for ln in info.split("\r\n") if ln.startswith("evicted_keys:")][0].split(":")[1])
        return {"system": "redis " + label, "policy": policy, "hit_ratio": ratio, "keys_held": r.cmd("DBSIZE"),
                "evictions": ev, "refused_writes": 0, "seconds": round(secs, 1), "maxmemory": base + budget,
                "data_bytes": budget}
    finally:
        r.stop()


def cpu_per_write(binary, bench, policy, writes):
    """dreyd CPU seconds per write of a new key: evicting at the limit (or,
    for the baseline, under a limit nothing reaches)."""
    limit = "16MiB" if policy != "none" else "4GiB"
    d = Dreyd(binary, "--memory-limit=" + limit, "--eviction=" + policy)
    try:
        target = "--target=127.0.0.1:%d" % d.port
        common = [bench, target, "--connections=2", "--streams=8", "--mix=set", "--value-bytes=%d" % VALUE,
                  "--json"]
        if policy.startswith("volatile"):
            common.append("--ttl=1h")
        # fill: 16 MiB holds ~15k entries of 1 KB; 20k sequential keys overfill it
        subprocess.run(common + ["--distribution=sequential", "--keys=20000", "--count=20000", "--seed=1"],
                       check=True, capture_output=True)
        c0 = cpu_seconds(d.proc.pid)
        out = subprocess.run(common + ["--distribution=sequential", "--keys=%d" % (writes + 20000),
                                       "--count=%d" % writes, "--seed=2", "--cache=new"],
                             check=True, capture_output=True, text=True).stdout
        c1 = cpu_seconds(d.proc.pid)
        res = json.loads(out)
        return {"policy": policy, "cpu_us_per_write": (c1 - c0) / writes * 1e6, "errors": res.get("errors", {}),
                "ops_per_s": res.get("throughput")}
    finally:
        d.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=20000)
    ap.add_argument("--ops", type=int, default=100000)
    ap.add_argument("--cpu-writes", type=int, default=100000)
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--out", default="")
    ap.add_argument("--workloads", default="stationary,shifting")
    a = ap.parse_args()
    binary = os.environ.get("DREY_BIN", os.path.join(TOP, "bazel-bin", "dreyd"))
    bench = os.environ.get("DREY_BENCH_BIN", os.path.join(TOP, "bazel-bin", "drey-bench"))
    import drey_harness
    os.environ.setdefault("DREY_PROTO_DIR", os.path.join(TOP, "proto"))
    pb = drey_harness.protos().cache

    budget = a.keys // 10 * (DREY_OVERHEAD + len(KEY_FMT % 0) + VALUE)
    warmup = a.keys
    results = {"keys": a.keys, "ops": a.ops, "warmup": warmup, "value_bytes": VALUE, "data_bytes": budget,
               "hit_ratio": [], "cpu": []}
    # Redis twice: with drey's data bytes, and with what Redis itself needs
    # for the number of keys drey holds (its per-key cost measured here), so
    # the policies are compared on equal numbers of keys too.
    per_key = redis_per_key(a.keys // 10)
    results["redis_bytes_per_key"] = per_key
    workloads = {
        # the same popularity throughout
        "stationary": zipf_sequence(a.keys, a.ops + warmup, 0.99, a.seed),
        # halfway through, another set of keys becomes the popular one
        "shifting": zipf_sequence(a.keys, a.ops + warmup, 0.99, a.seed, shift_at=warmup + a.ops // 2),
    }
    for name in a.workloads.split(","):
        ops = workloads[name]
        for policy in ("allkeys-lru", "allkeys-lfu"):
            for label, b in (("same bytes", budget), ("same keys", per_key * (a.keys // 10))):
                r = redis_hit_ratio(policy, b, ops, warmup, label)
                r["workload"] = name
                results["hit_ratio"].append(r)
                print(json.dumps(r), flush=True)
        for policy in ("allkeys-lru", "allkeys-lfu", "volatile-lru", "volatile-ttl", "none"):
            r = drey_hit_ratio(pb, binary, policy, budget, ops, warmup)
            r["workload"] = name
            results["hit_ratio"].append(r)
            print(json.dumps(r), flush=True)
    for policy in ("none", "allkeys-lru", "allkeys-lfu", "volatile-lru", "volatile-ttl"):
        results["cpu"].append(cpu_per_write(binary, bench, policy, a.cpu_writes))
        print(json.dumps(results["cpu"][-1]), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
