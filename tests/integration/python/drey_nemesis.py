"""Faults for a drey cluster on one machine: every link behind a proxy.

NemesisCluster is a Cluster (drey_cluster.py) whose nodes are known up
front and whose every connection goes through a Proxy of its own, all made
before the first node starts:
- node -> etcd: one proxy per node (its --cluster-etcd);
- node A -> node B: one proxy per ordered pair, which A dials for B by
  --cluster-peer-address (the certificate is still checked against B's id,
  so TLS passes through). B -> A is another proxy: a link can be cut one
  way only.
A partition is then a proxy's mode (pass, blackhole, reset: see Proxy),
needing no root. The nemeses: kill (SIGKILL), restart (same data directory),
pause/resume (SIGSTOP/SIGCONT), isolate a node from etcd, from its peers or
both, split the nodes into groups (etcd stays with the largest), heal, a
node's wall clock offset (libfaketime, the monotonic clock left alone), and
a node's journal quota filled up.

Nothing waits by sleeping: readiness is polled with deadlines.
"""
import os
import shutil
import signal
import tempfile

import grpc

from drey_cluster import Cluster, Proxy, partition
from drey_harness import RpcFailure, find_dreyd, make_value
from drey_tokens import details, poll

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


def faketime_env(offset_s):
    """The environment that runs a process with its wall clock
    (CLOCK_REALTIME) offset_s seconds off while CLOCK_MONOTONIC is left
    alone (FAKETIME_DONT_FAKE_MONOTONIC): leases, deadlines and timers
    measured on the monotonic clock are unaffected, what reads the time of
    day is not. Keep the offset inside the test certificates' validity
    (issued now, for 2 days): a clock before notBefore fails every TLS
    handshake."""
    if not os.access(LIBFAKETIME, os.R_OK):
        raise AssertionError("libfaketime is missing (Debian package faketime)")
    return {
        "LD_PRELOAD": LIBFAKETIME,
        "FAKETIME": "%+d" % int(offset_s),
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        # libfaketime is preloaded before the ASan runtime of an ASan build.
        "ASAN_OPTIONS": "verify_asan_link_order=0:" + os.environ.get("ASAN_OPTIONS", ""),
    }


def dreyd_system_malloc():
    """//:dreyd_system_malloc, next to dreyd (the test's data): libfaketime
    deadlocks inside jemalloc's initialization."""
    path = os.path.join(os.path.dirname(find_dreyd()), "dreyd_system_malloc")
    if not os.access(path, os.X_OK):
        raise AssertionError("dreyd_system_malloc is not next to dreyd (add //:dreyd_system_malloc to data): %s" % path)
    return path


class NemesisCluster(Cluster):
    """etcd, `drey cluster init` for len(ids) initial nodes, and a proxy on
    every link. Nodes are durable by default (their data directories are
    kept across restarts and removed at exit). Use as a context manager,
    then start() (or launch() each node)."""

    def __init__(self, ids=("n1", "n2", "n3"), partitions=16, durable=True, lease_ttl="2s", extra_flags=(),
                 replication_factor=1):
        super().__init__(partitions=partitions, initial_nodes=len(ids), ephemeral=not durable,
                         lease_ttl=lease_ttl, extra_flags=extra_flags, replication_factor=replication_factor)
        self.ids = list(ids)
        self.durable = durable
        self.etcd_links = {}  # id -> Proxy to etcd
        self.links = {}       # (a, b) -> Proxy that a dials for b
        self.data_dirs = {}
        self.launched = {}    # id -> the flags and env it was last launched with

    def __enter__(self):
        super().__enter__()
        try:
            for a in self.ids:
                self.etcd_links[a] = Proxy(self.etcd.client_port)
                for b in self.ids:
                    if a != b:
                        self.links[(a, b)] = Proxy()  # b's port once b listens
                if self.durable:
                    self.data_dirs[a] = tempfile.mkdtemp(prefix="drey-nemesis-%s-" % a,
                                                         dir=os.environ.get("TEST_TMPDIR"))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        try:
            super().__exit__(*exc)
        finally:
            for p in list(self.etcd_links.values()) + list(self.links.values()):
                p.close()
            for d in self.data_dirs.values():
                shutil.rmtree(d, True)

    # --- nodes ---

    def peer_addresses(self, node_id):
        return ",".join("%s=%s" % (b, self.links[(node_id, b)].address) for b in self.ids if b != node_id)

    def launch(self, node_id, flags=(), env=None, binary=None, wait=True):
        """Starts node_id behind its proxies (or again, with the same data
        directory) and points every link to it at its internal port."""
        assert node_id in self.ids, node_id
        old = self.nodes.get(node_id)
        assert old is None or old.server.proc.poll() is not None, "%s is running" % node_id
        self.launched[node_id] = (tuple(flags), env, binary)
        f = ["--cluster-peer-address=" + self.peer_addresses(node_id)] + list(flags)
        node = self.start_node(node_id, flags=f, data_dir=self.data_dirs.get(node_id), wait=wait,
                               etcd_url=self.etcd_links[node_id].url, env=env, binary=binary)
        rec = node.server.wait_log(lambda r: r.get("msg") == "listening" and "internal_port" in r, 30,
                                   what="the internal port")
        for a in self.ids:
            if a != node_id:
                self.links[(a, node_id)].set_target(int(rec["internal_port"]))
        return node

    def start(self, n=None):
        return [self.launch(i) for i in self.ids[:n]]

    def kill(self, node_id):
        self.nodes[node_id].server.kill()

    def restart(self, node_id, flags=None, env=None, binary=None, wait=True):
        """SIGKILL if running, then start again on the same data directory,
        with the flags (and env, binary) it had unless given."""
        self.kill(node_id)
        f0, e0, b0 = self.launched[node_id]
        return self.launch(node_id, flags=f0 if flags is None else flags, env=e0 if env is None else env,
                           binary=b0 if binary is None else binary, wait=wait)

    def pause(self, node_id):
        self.nodes[node_id].server.signal(signal.SIGSTOP)

    def resume(self, node_id):
        self.nodes[node_id].server.signal(signal.SIGCONT)

    # --- links ---

    def isolate_from_etcd(self, node_id, mode="reset"):
        self.etcd_links[node_id].set_mode(mode)

    def isolate_from_peers(self, node_id, mode="reset"):
        """Every link from and to node_id."""
        for (a, b), p in self.links.items():
            if node_id in (a, b):
                p.set_mode(mode)

    def isolate(self, node_id, mode="reset"):
        self.isolate_from_etcd(node_id, mode)
        self.isolate_from_peers(node_id, mode)

    def cut(self, a, b, mode="reset", direction=None):
        """The link a dials for b only (b -> a is another)."""
        self.links[(a, b)].set_mode(mode, direction)

    def split(self, groups, mode="reset"):
        """Nodes reach only the nodes of their own group; etcd stays on the
        side of the largest group (the majority), the others lose it. Nodes
        in no group are cut from everything."""
        groups = [set(g) for g in groups]
        side = {i: k for k, g in enumerate(groups) for i in g}
        majority = max(range(len(groups)), key=lambda k: len(groups[k]))
        for (a, b), p in self.links.items():
            p.set_mode("pass" if a in side and side.get(b) == side[a] else mode)
        for i, p in self.etcd_links.items():
            p.set_mode("pass" if side.get(i) == majority else mode)

    def heal(self):
        for p in list(self.etcd_links.values()) + list(self.links.values()):
            p.set_mode("pass")

    # --- a node's clock and disk ---

    def restart_with_clock_offset(self, node_id, offset_s, flags=None):
        """Restarts node_id with its wall clock offset_s seconds off (see
        faketime_env), on //:dreyd_system_malloc."""
        return self.restart(node_id, flags=flags, env=faketime_env(offset_s), binary=dreyd_system_malloc())

    def fill_journal_quota(self, node_id, limit=2000):
        """Restarts node_id with a journal quota (--journal-max-bytes) of
        what its journal holds on disk now, no snapshot that would free it,
        then writes to its own partitions until the quota refuses even an
        empty value (big values first, then smaller): a full journal quota,
        reached as a client would. From then on every write it would journal
        is refused RESOURCE_EXHAUSTED JOURNAL_DISK_QUOTA (a definitive
        refusal, no trace left) while reads go on. Returns the node and how
        many writes fitted."""
        assert self.durable, "a quota needs a journal"
        used = details(self.nodes[node_id].server)["journalDisk"]["usedBytes"]
        f0 = [f for f in self.launched[node_id][0]
              if not f.startswith(("--journal-max-bytes=", "--snapshot-every"))]
        node = self.restart(node_id, flags=f0 + ["--journal-max-bytes=%d" % int(used), "--snapshot-every=0",
                                                 "--snapshot-every-bytes=0"])
        owners = poll(lambda: self.owners(node), lambda o: all(o.values()), what="%s's table" % node_id)
        # short keys of the default cache: no write a test makes is smaller
        mine = iter([k for k in ("~%d" % i for i in range(20 * limit))
                     if owners[partition("", k, self.partitions)] == node_id])
        fn, req_cls, _ = node.cache.methods["Set"]
        fitted = 0
        for size in (8192, 512, 32, 0):
            while True:
                assert fitted < limit, "%s took %d writes under a quota of %d" % (node_id, fitted, used)
                try:
                    fn(req_cls(key=next(mine), value=make_value(b"f" * size)), timeout=30)
                    fitted += 1
                except grpc.RpcError as e:
                    if RpcFailure(e).reason != "JOURNAL_DISK_QUOTA":
                        raise
                    break
        return node, fitted
