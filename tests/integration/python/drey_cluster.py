"""A drey cluster on one machine for tests: Debian's etcd and several dreyd.

- Etcd: one member on free loopback ports with its own data directory.
- ClusterCA: a CA and per-node certificates (SAN = the node id), made with
  the openssl CLI, for the internal listeners' mutual TLS.
- Cluster: `drey cluster init` under a private prefix, then nodes started
  with --cluster-etcd, each on free ports; helpers to reach every node, read
  the table, and route by key exactly as the partition rule says (the
  rule is implemented here independently, from the shared vectors).

Nothing waits by sleeping: every readiness is polled with a deadline.
"""
import http.client
import sys
import json
import os
import random
import select
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
import uuid

import grpc

from drey_harness import CACHE_SERVICE, DreyServer, ServiceClient, find_dreyd, protos
from drey_tokens import http_get, openssl, ops_port, poll

ETCD = shutil.which("etcd") or "/usr/bin/etcd"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def quiet_ports(n):
    """n distinct free loopback ports below the ephemeral range when there
    is room, for a server that is stopped and started again on the same
    ports (etcd): a port bind(0) gave out, once released, can be taken as
    the local port of some other test's outgoing connection (or a
    self-connect to it) before the server binds it again, and the restart
    fails with "address already in use". bind(0) and connect never hand
    out a port below the range. The sockets stay bound until all n are
    picked, so the ports differ."""
    low = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    held = []
    try:
        while len(held) < n:
            s = socket.socket()
            for _ in range(200 if low > 11000 else 0):
                try:
                    s.bind(("127.0.0.1", rng.randrange(10000, low)))
                    break
                except OSError:
                    continue
            else:
                s.bind(("127.0.0.1", 0))
            held.append(s)
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


# --- the partition rule (independent of drey's C code) -------------------------------

def _crc32c_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_TABLE = _crc32c_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc = (crc >> 8) ^ _TABLE[(crc ^ b) & 0xFF]
    return crc ^ 0xFFFFFFFF


def routing_key(key):
    start = key.find(b"{")
    if start < 0:
        return key
    end = key.find(b"}", start + 1)
    if end < 0 or end == start + 1:
        return key
    return key[start + 1:end]


def partition(cache, key, n):
    c = b"" if cache in ("", "default") else cache.encode()
    return crc32c(struct.pack("<I", len(c)) + c + b"\x1f" + routing_key(key.encode())) % n


def tag_for(cache, p, n):
    """A hash tag ("{t12}") that puts every key of cache starting with it in
    partition p of n."""
    return next(t for t in ("{t%d}" % i for i in range(1 << 20)) if partition(cache, t, n) == p)


# --- etcd -------------------------------------------------------------------------

class Etcd:
    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="drey-etcd-")
        self.client_port, self.peer_port = quiet_ports(2)
        self.proc = None

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.client_port

    def start(self, timeout=30):
        peer = "http://127.0.0.1:%d" % self.peer_port
        self.log = open(os.path.join(self.tmp, "etcd.log"), "ab")
        self.proc = subprocess.Popen(
            [ETCD, "--name=default", "--data-dir=" + os.path.join(self.tmp, "data"),
             "--listen-client-urls=" + self.url, "--advertise-client-urls=" + self.url,
             "--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
             "--initial-cluster=default=" + peer],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)
        poll(self.healthy, lambda ok: ok, timeout=timeout, what="etcd healthy")
        return self

    def healthy(self):
        if self.proc.poll() is not None:
            # the tail says why (the directory is gone once the test ends)
            with open(os.path.join(self.tmp, "etcd.log"), "rb") as f:
                tail = f.read()[-2000:].decode(errors="replace")
            raise RuntimeError("etcd exited (%s), its log ends:\n%s" % (self.proc.returncode, tail))
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.client_port, timeout=2)
            c.request("GET", "/health")
            body = c.getresponse().read()
            return json.loads(body).get("health") == "true"
        except (OSError, ValueError):
            return False

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self.log.close()
        shutil.rmtree(self.tmp, True)


# --- a link we can cut --------------------------------------------------------------

class Proxy:
    """A TCP proxy on a free loopback port to target_port (None: not known
    yet, set_target() later; connections are refused meanwhile), one link
    whose faults a test chooses, per direction ("up": from the connecting
    side to the target, "down": back):
    - pass: bytes flow;
    - blackhole: connections are accepted and held, nothing is forwarded
      (what was read waits, and flows on a later pass, as TCP would deliver
      it after a partition heals): the other side sees a stall, not a reset;
    - reset: every connection is closed and new ones are refused (both
      directions: a TCP connection cannot be reset one way).
    block()/unblock() are reset/pass both ways."""

    MODES = ("pass", "blackhole", "reset")

    def __init__(self, target_port=None):
        self.target = target_port
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.modes = {"up": "pass", "down": "pass"}
        self.conns = []
        self.forwarded = 0  # connections passed on to the target
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    @property
    def address(self):
        return "127.0.0.1:%d" % self.port

    @property
    def blocked(self):
        return "reset" in self.modes.values()

    def set_target(self, port):
        """Where new connections go (a restarted node's new port)."""
        with self.lock:
            self.target = port

    def _accept(self):
        while not self.closed:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                target = self.target
                refuse = self.blocked or target is None
            if refuse:
                c.close()
                continue
            try:
                u = socket.create_connection(("127.0.0.1", target), timeout=5)
                u.settimeout(None)
            except OSError:
                c.close()
                continue
            with self.lock:
                if self.blocked or self.closed:
                    c.close()
                    u.close()
                    continue
                self.conns += [c, u]
                self.forwarded += 1
            for a, b, direction in ((c, u, "up"), (u, c, "down")):
                threading.Thread(target=self._pump, args=(a, b, direction), daemon=True).start()

    def _wait_passing(self, direction):
        """True once bytes may flow this way; False if the link was reset."""
        with self.lock:
            while self.modes[direction] == "blackhole" and not self.closed:
                self.changed.wait(1.0)
            return self.modes[direction] == "pass" and not self.closed

    def _pump(self, a, b, direction):
        try:
            while self._wait_passing(direction):
                # select: a blackhole set now must stop the next read, so the
                # read cannot block for ever with the mode unseen
                r, _, _ = select.select([a], [], [], 0.2)
                if not r:
                    continue
                data = a.recv(65536)
                if not data:
                    break
                if not self._wait_passing(direction):
                    break
                b.sendall(data)
        except (OSError, ValueError):
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        with self.lock:
            for s in (a, b):
                if s in self.conns:
                    self.conns.remove(s)
                    s.close()

    def set_mode(self, mode, direction=None):
        """mode for both directions, or only "up" or "down"."""
        assert mode in self.MODES, mode
        with self.lock:
            for d in ((direction,) if direction else ("up", "down")):
                self.modes[d] = mode
            conns = []
            if self.blocked:
                conns, self.conns = self.conns, []
            self.changed.notify_all()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def block(self):
        self.set_mode("reset")

    def unblock(self):
        self.set_mode("pass")

    def close(self):
        self.closed = True
        self.block()
        self.sock.close()


# --- certificates -------------------------------------------------------------------

class ClusterCA:
    def __init__(self, name="drey-cluster-ca"):
        self.dir = tempfile.mkdtemp(prefix="drey-ca-")
        self.ca_key = os.path.join(self.dir, "ca.key")
        self.ca = os.path.join(self.dir, "ca.pem")
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", self.ca_key, "-out", self.ca, "-days", "2", "-subj", "/CN=" + name)
        self.serial = 1

    def issue(self, node_id, cn=None, san=None):
        """(cert, key) for a node: SAN DNS:<node_id> (or san), CN cn or the id."""
        base = os.path.join(self.dir, "%s-%d" % (node_id, self.serial))
        key, csr, cert, ext = base + ".key", base + ".csr", base + ".pem", base + ".ext"
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key,
                "-out", csr, "-subj", "/CN=" + (cn or node_id))
        with open(ext, "w") as f:
            f.write("subjectAltName=DNS:%s\nextendedKeyUsage=serverAuth,clientAuth\n" % (san or node_id))
        openssl("x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", self.ca_key, "-set_serial",
                str(self.serial), "-out", cert, "-days", "2", "-extfile", ext)
        self.serial += 1
        return cert, key

    def cleanup(self):
        shutil.rmtree(self.dir, True)


# --- the cluster --------------------------------------------------------------------

def drey_cli():
    path = os.path.join(os.path.dirname(find_dreyd()), "drey")
    if not os.access(path, os.X_OK):
        raise RuntimeError("the drey CLI is not next to dreyd: %s" % path)
    return path


class Node:
    def __init__(self, cluster, node_id, server, cert, key):
        self.cluster = cluster
        self.id = node_id
        self.server = server
        self.cert, self.key = cert, key
        self.channel = server.channel()
        self.cache = ServiceClient(self.channel, cluster.pb.cache, CACHE_SERVICE)


class Cluster:
    """etcd + `drey cluster init` + nodes. Use as a context manager."""

    def __init__(self, partitions=16, initial_nodes=1, ephemeral=True, lease_ttl="2s", extra_flags=(),
                 replication_factor=1):
        self.pb = protos()
        self.replication_factor = replication_factor
        self.partitions = partitions
        self.initial_nodes = initial_nodes
        self.ephemeral = ephemeral
        self.lease_ttl = lease_ttl
        self.extra_flags = tuple(extra_flags)
        self.prefix = "drey-test-%s/" % uuid.uuid4().hex[:8]
        self.etcd = Etcd()
        self.ca = ClusterCA()
        self.nodes = {}

    def __enter__(self):
        self.etcd.start()
        out = self.cli("cluster", "init", "--etcd=" + self.etcd.url, "--prefix=" + self.prefix,
                       "--partitions=%d" % self.partitions, "--initial-nodes=%d" % self.initial_nodes,
                       "--replication-factor=%d" % self.replication_factor)
        assert out.returncode == 0, out.stderr
        return self

    def __exit__(self, *exc):
        for n in list(self.nodes.values()):
            if n.server.returncode is None and n.server.proc.poll() is not None:
                # died by itself: say how, for the failure this will cause
                print("%s exited with %s:\n%s" % (n.id, n.server.proc.returncode, n.server.log_text()[-6000:]),
                      file=sys.stderr)
            else:
                self.report_trouble(n)
                if n.server.returncode is None:
                    n.server.kill()
        self.etcd.stop()
        self.ca.cleanup()

    @staticmethod
    def report_trouble(node):
        """Warnings and errors a node logged (a lost lease, a failed move):
        on stderr, where a failing test's log shows them."""
        full = os.environ.get("DREY_TEST_FULL_LOGS")  # set it to see every line, when debugging a test
        lines = [l for l in node.server.log_text().splitlines()
                 if full or '"level":"warn"' in l or '"level":"error"' in l or "Sanitizer" in l or "runtime error" in l]
        if lines:
            print("%s logged:\n%s" % (node.id, "\n".join(lines if full else lines[-20:])), file=sys.stderr)

    def cli(self, *args, timeout=60):
        return subprocess.run([drey_cli()] + list(args), capture_output=True, text=True, timeout=timeout)

    def node_flags(self, node_id, cert, key, internal_port=None, etcd_url=None):
        flags = ["--node-id=" + node_id, "--cluster-etcd=" + (etcd_url or self.etcd.url),
                 "--cluster-prefix=" + self.prefix,
                 "--internal-listen=127.0.0.1:%d" % (internal_port or 0), "--internal-tls-cert=" + cert,
                 "--internal-tls-key=" + key, "--internal-tls-ca=" + self.ca.ca,
                 "--cluster-lease-ttl=" + self.lease_ttl, "--ops-listen=127.0.0.1:0",
                 # tests stop whole clusters: no node moves its data to the
                 # others first unless a test asks (the flags after win)
                 "--cluster-drain-timeout=0"]
        if self.ephemeral:
            flags.append("--ephemeral")
        return flags + list(self.extra_flags)

    def start_node(self, node_id, flags=(), data_dir=None, wait=True, etcd_url=None, env=None, binary=None):
        cert, key = self.ca.issue(node_id)
        f = self.node_flags(node_id, cert, key, etcd_url=etcd_url) + list(flags)
        if data_dir is not None:
            f.append("--data-dir=" + data_dir)
        srv = DreyServer(*f, name=node_id, env=env)
        if binary is not None:
            srv.binary = binary
        srv.start(wait_ready=wait)
        node = Node(self, node_id, srv, cert, key)
        self.nodes[node_id] = node
        return node

    def live(self):
        """Nodes whose process runs (paused ones too). A snapshot: workload
        threads call it while the test starts and restarts nodes."""
        return [n for n in list(self.nodes.values()) if n.server.proc.poll() is None]

    def start(self, n):
        return [self.start_node("n%d" % i) for i in range(1, n + 1)]

    # --- the table ---

    def status(self):
        out = self.cli("cluster", "status", "--etcd=" + self.etcd.url, "--prefix=" + self.prefix, "-o", "json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def topology(self, node):
        """The first drey.cluster.v1.Topology a node's WatchTopology sends."""
        stub = node.channel.unary_stream(
            "/drey.cluster.v1.Cluster/WatchTopology",
            request_serializer=self.pb.cluster.WatchTopologyRequest.SerializeToString,
            response_deserializer=self.pb.cluster.Topology.FromString)
        stream = stub(self.pb.cluster.WatchTopologyRequest(), timeout=30)
        try:
            return next(stream)
        finally:
            stream.cancel()

    def wait_assigned(self, members, timeout=30):
        """Until every partition has an owner and `members` nodes are members."""
        return poll(self.status, lambda s: s["unassignedPartitions"] == 0 and len(s["nodes"]) == members,
                    timeout=timeout, what="%d members owning every partition" % members)

    def agreed_owners(self, nodes, timeout=30):
        """Partition -> owner once every node's own table has every
        partition's owner, the same in all: the nodes route alike."""
        def tables():
            return [self.owners(n) for n in nodes]
        ts = poll(tables, lambda ts: all(all(t.values()) for t in ts) and all(t == ts[0] for t in ts),
                  timeout=timeout, what="every node's table complete and the same")
        return ts[0]

    def owners(self, node):
        """Partition -> owner id, from a node's own table."""
        t = self.topology(node)
        return {p.id: p.primary for p in t.partitions}

    def owner_of(self, owners, key, cache=""):
        return owners[partition(cache, key, self.partitions)]


class Router:
    """Routes by key the way a topology-aware client does: one cache client
    per node (by its advertised address, from a node's WatchTopology) and the
    partition rule above picks the owner's; a partition without an owner
    goes to the seed node, which forwards."""

    def __init__(self, cluster, seed):
        self.cluster = cluster
        self.seed = seed
        t = cluster.topology(seed)
        self.partitions = t.hash.partitions
        advertise = {n.id: n.advertise for n in t.nodes}
        self.owner_address = {p.id: advertise.get(p.primary, "") for p in t.partitions}
        by_address = {n.server.address: n for n in cluster.nodes.values()}
        self.clients = {}
        for addr in set(self.owner_address.values()) - {""}:
            node = by_address.get(addr)
            # A node this harness did not start (or a stale address) is
            # reached through the seed.
            self.clients[addr] = node.cache if node is not None else seed.cache

    def client_for(self, key, cache=""):
        addr = self.owner_address.get(partition(cache, key, self.partitions), "")
        return self.clients.get(addr, self.seed.cache)


def drey_bench():
    path = os.path.join(os.path.dirname(find_dreyd()), "drey-bench")
    if not os.access(path, os.X_OK):
        raise RuntimeError("drey-bench is not next to dreyd: %s" % path)
    return path


def internal_port(node):
    return node.server.find_log(lambda r: r.get("msg") == "listening")["internal_port"]


def peer_channel(cl, node, as_id):
    """A channel to node's internal listener with a cluster certificate for
    as_id (the caller then says it is as_id with drey-forwarded-by)."""
    cert, key = cl.ca.issue(as_id)
    with open(cl.ca.ca, "rb") as ca, open(key, "rb") as k, open(cert, "rb") as c:
        creds = grpc.ssl_channel_credentials(root_certificates=ca.read(), private_key=k.read(),
                                             certificate_chain=c.read())
    return grpc.secure_channel("127.0.0.1:%d" % internal_port(node), creds,
                               options=[("grpc.ssl_target_name_override", node.id)])


def metric(node, name, labels=None):
    """A sample of node's /metrics: the one named name (with labels, a
    substring of its {...}, when given); 0 when absent."""
    status, _, body = http_get("127.0.0.1", ops_port(node.server), "/metrics")
    assert status == 200
    for line in body.decode().splitlines():
        if labels is None and line.startswith(name + " "):
            return float(line.split()[-1])
        if labels is not None and line.startswith(name + "{") and labels in line:
            return float(line.split()[-1])
    return 0.0


def wait_until(fn, timeout=30, what="condition"):
    """what: a description, or a function giving it (what was last seen)."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise AssertionError("timed out waiting for %s" % (what() if callable(what) else what))
        time.sleep(0.01)  # paces the polling only
