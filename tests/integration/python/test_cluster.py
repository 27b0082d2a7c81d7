"""Several dreyd as one cache: Debian's etcd and three nodes on loopback.

Every RPC works through every node with the single node's results, and each
value lands on its partition's owner (checked with the nodes' own entry
counts against the owners the partition rule, implemented independently in
drey_cluster.py from the shared vectors, gives). GetMany scatters and
gathers; SetMany across partitions is refused per entry. The internal
listener takes only mutual TLS from the peer its certificate names, and the
public one refuses forwarding metadata. A node started for another cluster
shape, or with no cluster, refuses to join. An owner that dies leaves its
partitions PARTITION_UNAVAILABLE (never wrong data) until it returns with
its journal; etcd going away leaves routing as it was; a request_id retried
through another node gets the first outcome; one tenant flooding one node
does not starve another entering through another node; a dead controller
is replaced.
"""
import json
import os
import shutil
import re
import subprocess
import tempfile
import threading
import unittest

import grpc

from drey_cluster import Cluster, ClusterCA, partition, wait_until
from drey_harness import CACHE_SERVICE, DreyServer, DreyTestCase, RpcFailure, ServiceClient, main, make_value, value_of
from drey_tokens import http_get, ops_port, poll

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
RPC = 30


def vectors_path():
    for base in filter(None, [os.getcwd(), os.environ.get("TEST_SRCDIR") and os.path.join(os.environ["TEST_SRCDIR"], "drey")]):
        p = os.path.join(base, "tests", "data", "partition_vectors.json")
        if os.path.isfile(p):
            return p
    return os.path.join(os.path.dirname(__file__), "..", "..", "data", "partition_vectors.json")


def entries(node):
    status, _, body = http_get("127.0.0.1", ops_port(node.server), "/metrics")
    assert status == 200
    m = re.search(r"^drey_store_entries (\d+)", body.decode(), re.M)
    return int(m.group(1))


def failure(fn, *a, **kw):
    try:
        fn(*a, **kw)
    except grpc.RpcError as e:
        return RpcFailure(e)
    raise AssertionError("the call succeeded")


class ThreeNodes(DreyTestCase):
    """One cluster of three ephemeral nodes for the tests that do not break it."""
    SERVER_FLAGS = None

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # A tenant's limits are small, and every admitted call is held back a
        # little (more the busier the node), so one flooding connection
        # reaches its limit while the others' calls stay quick.
        cls.cluster = Cluster(partitions=16, initial_nodes=3,
                              extra_flags=("--principal-max-inflight=2", "--principal-max-queued=0",
                                           "--slowdown-at=0", "--slowdown-max-delay=200ms")).__enter__()
        cls.nodes = cls.cluster.start(3)
        cls.cluster.wait_assigned(3)
        cls.owners = cls.cluster.agreed_owners(cls.nodes)

    @classmethod
    def tearDownClass(cls):
        for n in cls.nodes:
            n.server.stop()
        cls.cluster.__exit__(None, None, None)
        super().tearDownClass()

    def call(self, node, method, **fields):
        fn, req_cls, _ = node.cache.methods[method]
        return fn(req_cls(**fields), timeout=RPC)

    def test_the_partition_rule_matches_the_shared_vectors(self):
        with open(vectors_path()) as f:
            doc = json.load(f)
        for v in doc["vectors"]:
            self.assertEqual(partition(v["cache"], v["key"], v["partitions"]), v["partition"], v)
        t = self.cluster.topology(self.nodes[1])
        self.assertEqual(t.hash.partitions, 16)
        self.assertEqual(t.hash.function, self.pb.cluster.HashRule.CRC32C_CACHE_ROUTING_KEY)
        self.assertEqual(sorted(n.id for n in t.nodes), ["n1", "n2", "n3"])
        self.assertEqual({n.id: n.advertise for n in t.nodes},
                         {n.id: n.server.address for n in self.nodes})
        self.assertTrue(all(p.epoch > 0 for p in t.partitions), "every entry has an epoch")
        self.assertEqual(len({p.primary for p in t.partitions}), 3, "the first assignment used every node")

    def test_readiness_details_show_the_cluster(self):
        from drey_tokens import details
        owned = 0
        for n in self.nodes:
            c = details(n.server)["cluster"]
            self.assertEqual(c["nodeId"], n.id)
            self.assertTrue(c["etcdReachable"])
            self.assertEqual((c["partitions"], c["members"], c["unassignedPartitions"]), (16, 3, 0))
            self.assertEqual(c["controller"], self.cluster.status()["controller"])
            self.assertEqual(c["isController"], c["controller"] == n.id)
            owned += c["ownedPartitions"]
        self.assertEqual(owned, 16)

    def test_every_rpc_through_every_node_lands_on_the_owner(self):
        cache = "rpcs-" + self._testMethodName[-6:]
        keys = ["k%d" % i for i in range(60)]
        before = {n.id: entries(n) for n in self.nodes}
        for i, k in enumerate(keys):
            self.call(self.nodes[i % 3], "Set", cache=cache, key=k, value=make_value("v-" + k))
        for n in self.nodes:
            for k in keys:
                r = self.call(n, "Get", cache=cache, key=k)
                self.assertTrue(r.found, (n.id, k))
                self.assertEqual(value_of(r.value), "v-" + k)
        want = {n.id: 0 for n in self.nodes}
        for k in keys:
            want[self.owners[partition(cache, k, 16)]] += 1
        got = {n.id: entries(n) - before[n.id] for n in self.nodes}
        self.assertEqual(got, want, "each entry is on its partition's owner, nowhere else")
        # the other RPCs, each through a node that does not own the key
        k = keys[0]
        other = next(n for n in self.nodes if n.id != self.owners[partition(cache, k, 16)])
        self.assertEqual(self.call(other, "Add", cache=cache, key=k, value=make_value("x")).added, False)
        v = self.call(other, "Get", cache=cache, key=k).version
        self.assertTrue(self.call(other, "Update", cache=cache, key=k, value=make_value("u"), if_version=v).version > v)
        self.assertEqual(value_of(self.call(other, "GetOrAdd", cache=cache, key=k, value=make_value("z")).value), "u")
        self.call(other, "Touch", cache=cache, key=k, ttl={"seconds": 60})
        self.assertTrue(self.call(other, "GetExpiration", cache=cache, key=k).has_expiration)
        self.call(other, "Persist", cache=cache, key=k)
        self.assertFalse(self.call(other, "GetExpiration", cache=cache, key=k).has_expiration)
        self.assertEqual(self.call(other, "Increment", cache=cache, key="ctr", delta=5).value, 5)
        self.assertEqual(self.call(self.nodes[0], "Increment", cache=cache, key="ctr", delta=2).value, 7)
        self.assertTrue(self.call(other, "Remove", cache=cache, key=k).removed)
        self.assertFalse(self.call(self.nodes[2], "Get", cache=cache, key=k).found)
        # a failed CAS through a non-owner carries the owner's details unchanged
        f = failure(self.call, other, "Set", cache=cache, key=keys[1], value=make_value("c"), if_version=999999)
        self.assertRpcFailure(f, grpc.StatusCode.FAILED_PRECONDITION, "VERSION_MISMATCH")

    def test_get_many_scatters_and_gathers_in_order(self):
        cache = "many"
        keys = ["g%d" % i for i in range(40)]
        for k in keys[::2]:
            self.call(self.nodes[0], "Set", cache=cache, key=k, value=make_value("v" + k))
        self.assertGreater(len({self.owners[partition(cache, k, 16)] for k in keys}), 1)
        for n in self.nodes:
            r = self.call(n, "GetMany", cache=cache, keys=keys)
            self.assertEqual([x.key for x in r.results], keys)
            for i, x in enumerate(r.results):
                self.assertEqual(x.found, i % 2 == 0, x.key)
                if x.found:
                    self.assertEqual(value_of(x.value), "v" + x.key)

    def test_set_many_must_stay_in_one_partition(self):
        cache = "batch"
        keys = ["b%d" % i for i in range(8)]
        parts = [partition(cache, k, 16) for k in keys]
        self.assertGreater(len(set(parts)), 1)
        entries_ = [self.pb.cache.SetManyRequest.Entry(key=k, value=make_value(k)) for k in keys]
        f = failure(self.call, self.nodes[0], "SetMany", cache=cache, entries=entries_)
        bad = ["entries[%d].key" % i for i in range(1, 8) if parts[i] != parts[0]]
        self.assertRpcFailure(f, grpc.StatusCode.INVALID_ARGUMENT, "CROSS_PARTITION", fields=bad)
        for k in keys:
            self.assertFalse(self.call(self.nodes[1], "Get", cache=cache, key=k).found, "nothing applied")
        tagged = ["{user42}.%s" % s for s in ("name", "cart", "prefs")]
        owner = self.owners[partition(cache, "user42", 16)]
        via = next(n for n in self.nodes if n.id != owner)
        self.call(via, "SetMany", cache=cache,
                  entries=[self.pb.cache.SetManyRequest.Entry(key=k, value=make_value(k)) for k in tagged])
        for k in tagged:
            self.assertEqual(value_of(self.call(self.nodes[2], "Get", cache=cache, key=k).value), k)

    def test_remove_many_keeps_to_one_partition(self):
        cache = "rm"
        tagged = ["{t7}.%d" % i for i in range(5)]
        for k in tagged:
            self.call(self.nodes[0], "Set", cache=cache, key=k, value=make_value(k))
        owner = self.owners[partition(cache, "t7", 16)]
        via = next(n for n in self.nodes if n.id != owner)
        r = self.call(via, "RemoveMany", cache=cache, keys=tagged)
        self.assertEqual([x.removed for x in r.results], [True] * 5)
        keys = ["r%d" % i for i in range(8)]
        parts = [partition(cache, k, 16) for k in keys]
        f = failure(self.call, via, "RemoveMany", cache=cache, keys=keys)
        self.assertRpcFailure(f, grpc.StatusCode.INVALID_ARGUMENT, "CROSS_PARTITION",
                              fields=["keys[%d]" % i for i in range(1, 8) if parts[i] != parts[0]])

    def scan_all(self, node, cache, prefix="", limit=7):
        keys, cursor, pages = [], "", 0
        while True:
            r = self.call(node, "Scan", cache=cache, prefix=prefix, limit=limit, cursor=cursor)
            keys += [i.key for i in r.items]
            pages += 1
            self.assertLess(pages, 1000)
            if not r.next_cursor:
                return keys
            cursor = r.next_cursor

    def test_whole_cache_calls_reach_every_owner(self):
        cache = "wide"
        keys = ["w%d" % i for i in range(60)] + ["x%d" % i for i in range(9)]
        for k in keys:
            self.call(self.nodes[0], "Set", cache=cache, key=k, value=make_value(k))
        self.assertEqual(len({self.owners[partition(cache, k, 16)] for k in keys}), 3, "the keys span every node")
        for n in self.nodes:
            st = self.call(n, "GetCacheStats", cache=cache)
            self.assertEqual((st.cache, st.entries), (cache, len(keys)), n.id)
            listed = {c.cache: c.entries for c in self.call(n, "ListCaches").caches}
            self.assertEqual(listed.get(cache), len(keys), n.id)
            # every key once per owner's share: a scan through any node sees them all
            self.assertEqual(sorted(self.scan_all(n, cache)), sorted(keys), n.id)
            self.assertEqual(sorted(self.scan_all(n, cache, prefix="x")), sorted(k for k in keys if k[0] == "x"))
        # a cursor is the cluster's: another shape of table, or an altered one, is refused
        r = self.call(self.nodes[1], "Scan", cache=cache, limit=3)
        self.assertTrue(r.next_cursor.startswith("c"))
        forged = "c%08x" % ((int(r.next_cursor[1:9], 16) + 1) % (1 << 32)) + r.next_cursor[9:]
        for bad in (forged, "not-a-cursor", r.next_cursor[:9] + "ffff." + r.next_cursor[14:]):
            f = failure(self.call, self.nodes[2], "Scan", cache=cache, cursor=bad)
            self.assertRpcFailure(f, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_CURSOR")
        # Clear reaches every node; a retry of it answers as the first did
        self.call(self.nodes[2], "Clear", cache=cache, request_id="clear-wide")
        self.call(self.nodes[1], "Clear", cache=cache, request_id="clear-wide")
        for n in self.nodes:
            self.assertEqual(self.call(n, "GetCacheStats", cache=cache).entries, 0, n.id)
            self.assertEqual(self.scan_all(n, cache), [])
        for k in keys[:5]:
            self.assertFalse(self.call(self.nodes[1], "Get", cache=cache, key=k).found)
        # a whole-cache watch follows every owner (test_cluster_watch.py has the rest)
        watch, req_cls, _ = self.nodes[1].cache.methods["Watch"]
        stream = watch(req_cls(cache=cache), timeout=RPC)
        self.assertEqual(next(stream).kind, self.pb.cache.WatchEvent.Kind.Value("WATCHING"))
        stream.cancel()

    def test_a_retry_through_another_node_gets_the_first_outcome(self):
        cache, k, rid = "idem", "counter", "rid-" + self._testMethodName[-8:]
        first = self.call(self.nodes[0], "Increment", cache=cache, key=k, delta=3, request_id=rid)
        for n in self.nodes:
            again = self.call(n, "Increment", cache=cache, key=k, delta=3, request_id=rid)
            self.assertEqual((again.value, again.version), (first.value, first.version))
        self.assertEqual(value_of(self.call(self.nodes[2], "Get", cache=cache, key=k).value), 3)

    def test_forwarding_metadata_is_refused_on_the_public_listener(self):
        fn, req_cls, _ = self.nodes[0].cache.methods["Get"]
        f = failure(fn, req_cls(key="x"), timeout=RPC, metadata=[("drey-forwarded-by", "n2")])
        self.assertRpcFailure(f, grpc.StatusCode.PERMISSION_DENIED, "FORWARDING_NOT_ALLOWED")

    def internal_channel(self, node, cert=None, key=None, ca=None, name="n1"):
        port = node.server.find_log(lambda r: r.get("msg") == "listening")["internal_port"]
        target = "127.0.0.1:%d" % port
        if cert is None and ca is None:
            return grpc.insecure_channel(target)
        creds = grpc.ssl_channel_credentials(
            root_certificates=open(ca or self.cluster.ca.ca, "rb").read(),
            private_key=open(key, "rb").read() if key else None,
            certificate_chain=open(cert, "rb").read() if cert else None)
        return grpc.secure_channel(target, creds, options=[("grpc.ssl_target_name_override", name)])

    def internal_get(self, ch, forwarded_by):
        stub = ServiceClient(ch, self.pb.cache, CACHE_SERVICE)
        fn, req_cls, _ = stub.methods["Get"]
        md = [("drey-forwarded-by", forwarded_by)] if forwarded_by else None
        return fn(req_cls(cache="c", key="k"), timeout=10, metadata=md)

    def test_the_internal_listener_takes_only_the_peer_its_certificate_names(self):
        n1 = self.nodes[0]
        with self.internal_channel(n1) as ch:
            f = failure(self.internal_get, ch, "n2")
            self.assertEqual(f.code, UNAVAILABLE, "plaintext is refused by the TLS handshake")
        cert, key = self.cluster.ca.issue("n9")
        with self.internal_channel(n1, cert, key) as ch:
            f = failure(self.internal_get, ch, "n2")
            self.assertRpcFailure(f, grpc.StatusCode.UNAUTHENTICATED, "PEER_UNAUTHENTICATED")
            f = failure(self.internal_get, ch, None)
            self.assertRpcFailure(f, grpc.StatusCode.UNAUTHENTICATED, "PEER_UNAUTHENTICATED")
            # n9's own name is accepted (a real peer forwarding for itself);
            # a key n1 does not own is refused, never forwarded again
            theirs = next(k for k in ("np%d" % i for i in range(200)) if self.owners[partition("c", k, 16)] != "n1")
            mine = next(k for k in ("np%d" % i for i in range(200)) if self.owners[partition("c", k, 16)] == "n1")
            stub = ServiceClient(ch, self.pb.cache, CACHE_SERVICE)
            fn, req_cls, _ = stub.methods["Get"]
            fn(req_cls(cache="c", key=mine), timeout=10, metadata=[("drey-forwarded-by", "n9")])
            f = failure(fn, req_cls(cache="c", key=theirs), timeout=10, metadata=[("drey-forwarded-by", "n9")])
            self.assertRpcFailure(f, UNAVAILABLE, "NOT_PRIMARY")
            p = partition("c", theirs, 16)
            self.assertEqual(f.metadata["partition"], str(p))
            self.assertEqual(f.metadata["primary"], self.owners[p])
            self.assertGreater(int(f.metadata["epoch"]), 0)
        rogue = ClusterCA("rogue-ca")
        try:
            rcert, rkey = rogue.issue("n2")
            with self.internal_channel(n1, rcert, rkey, ca=self.cluster.ca.ca) as ch:
                f = failure(self.internal_get, ch, "n2")
                self.assertEqual(f.code, UNAVAILABLE, "a certificate of another CA fails the handshake")
        finally:
            rogue.cleanup()

    def test_a_node_for_another_cluster_shape_refuses_to_join(self):
        cert, key = self.cluster.ca.issue("n7")
        flags = self.cluster.node_flags("n7", cert, key) + ["--cluster-partitions=32"]
        srv = DreyServer(*flags, name="n7").spawn()
        rc = srv.wait(30)
        self.assertEqual(rc, 1)
        self.assertTrue(srv.find_log(lambda r: "16 partitions" in r.get("error", "") and "32" in r.get("error", "")),
                        srv.log_text())
        flags = [f for f in self.cluster.node_flags("n7", cert, key) if not f.startswith("--cluster-prefix")]
        srv = DreyServer(*(flags + ["--cluster-prefix=nobody-here/"]), name="n7").spawn()
        self.assertEqual(srv.wait(30), 1)
        self.assertTrue(srv.find_log(lambda r: "drey cluster init" in r.get("error", "")), srv.log_text())

    def test_a_node_whose_certificate_names_another_node_refuses_to_start(self):
        """Peers take a node's identity from its certificate: a node whose
        certificate names n8 would be refused by every peer (it used to join
        and then fail every move with "No match found for server name")."""
        cert, key = self.cluster.ca.issue("n8")
        srv = DreyServer(*self.cluster.node_flags("n7", cert, key), name="n7").spawn()
        self.assertEqual(srv.wait(30), 1)
        self.assertTrue(srv.find_log(lambda r: '"n7" (--node-id)' in r.get("error", "")
                                     and cert in r.get("error", "")), srv.log_text())
        # nor is the common name enough beside a SAN naming something else:
        # a peer dialling n7 verifies the SANs only
        cert, key = self.cluster.ca.issue("n7", san="elsewhere.example")
        srv = DreyServer(*self.cluster.node_flags("n7", cert, key), name="n7").spawn()
        self.assertEqual(srv.wait(30), 1)
        self.assertTrue(srv.find_log(lambda r: cert in r.get("error", "")), srv.log_text())

    def test_a_quiet_tenant_through_another_node_is_not_starved(self):
        """conn A floods n1 with more than its per-principal limit allows; B
        enters through n2 and writes keys n1 owns: forwarded, B's calls count
        against node:n2 on n1, not against A's limit or its own."""
        cache = "tenants"
        n1_keys = [k for k in ("q%d" % i for i in range(400)) if self.owners[partition(cache, k, 16)] == "n1"][:30]
        self.assertTrue(n1_keys)
        from drey_tokens import fresh_channel
        flood_ch = fresh_channel(self.nodes[0].server.address)
        flood = ServiceClient(flood_ch, self.pb.cache, CACHE_SERVICE)
        stop = threading.Event()
        refused = []

        def flooder():
            fn, req_cls, _ = flood.methods["Get"]
            while not stop.is_set():
                futs = [fn.future(req_cls(cache=cache, key=k), timeout=RPC) for k in n1_keys]
                for f in futs:
                    try:
                        f.result()
                    except grpc.RpcError as e:
                        refused.append(RpcFailure(e).reason)

        # C, through n2 too, keeps exactly its own limit (2) busy on n1's keys:
        # if forwarded calls shared one tenant's budget on n1, C would take
        # it all and B would be refused.
        c_ch = fresh_channel(self.nodes[1].server.address)
        c_cache = ServiceClient(c_ch, self.pb.cache, CACHE_SERVICE)
        c_refused = []

        def busy():
            fn, req_cls, _ = c_cache.methods["Get"]
            i = 0
            while not stop.is_set():
                futs = [fn.future(req_cls(cache=cache, key=n1_keys[(i + j) % len(n1_keys)]), timeout=RPC)
                        for j in range(2)]
                i += 2
                for f in futs:
                    try:
                        f.result()
                    except grpc.RpcError as e:
                        c_refused.append(RpcFailure(e).reason)

        threads = [threading.Thread(target=flooder) for _ in range(2)] + [threading.Thread(target=busy)]
        for t in threads:
            t.start()
        try:
            wait_until(lambda: refused, what="the flooding tenant refused at its limit")
            for k in n1_keys:
                self.call(self.nodes[1], "Set", cache=cache, key=k, value=make_value("quiet"))
        finally:
            stop.set()
            for t in threads:
                t.join()
            flood_ch.close()
            c_ch.close()
        self.assertIn("PRINCIPAL_CONCURRENCY_LIMIT", refused)
        self.assertEqual(c_refused, [], "a tenant within its limits through n2 was refused on n1")


class TokensAndQuotas(DreyTestCase):
    """Three durable nodes with JWT keys and a small journal cap: the token
    travels with a forwarded call and is checked again on the owner, and the
    owner's refusals reach the client unchanged."""
    SERVER_FLAGS = None

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        from drey_tokens import KeyDir
        cls.keys = KeyDir()
        cls.hs = cls.keys.hmac("k1")
        cls.cluster = Cluster(partitions=8, initial_nodes=3, ephemeral=False,
                              extra_flags=("--jwt-keys-dir=" + cls.keys.path, "--segment-bytes=64KiB",
                                           "--journal-max-bytes=128KiB", "--snapshot-every-bytes=0")).__enter__()
        cls.nodes = cls.cluster.start(3)
        cls.cluster.wait_assigned(3)
        cls.owners = cls.cluster.agreed_owners(cls.nodes)

    @classmethod
    def tearDownClass(cls):
        for n in cls.nodes:
            n.server.stop()
        cls.cluster.__exit__(None, None, None)
        super().tearDownClass()

    def via(self, key):
        """A node that does not own key, and the owner's id."""
        owner = self.owners[partition("", key, 8)]
        return next(n for n in self.nodes if n.id != owner), owner

    def call(self, node, method, token, **fields):
        from drey_tokens import bearer
        fn, req_cls, _ = node.cache.methods[method]
        return fn(req_cls(**fields), timeout=RPC, metadata=bearer(token) if token else None)

    def test_request_ids_stay_scoped_by_the_original_caller(self):
        from drey_tokens import mint
        alice, bob = mint(self.hs, sub="alice"), mint(self.hs, sub="bob")
        k = "tok-counter"
        via, _ = self.via(k)
        first = self.call(via, "Increment", alice, key=k, delta=1, request_id="same-id")
        for n in self.nodes:
            again = self.call(n, "Increment", alice, key=k, delta=1, request_id="same-id")
            self.assertEqual((again.value, again.version), (first.value, first.version), n.id)
        # the same request_id from another subject is another write
        other = self.call(via, "Increment", bob, key=k, delta=1, request_id="same-id")
        self.assertEqual(other.value, first.value + 1)
        f = failure(self.call, via, "Get", None, key=k)
        self.assertRpcFailure(f, grpc.StatusCode.UNAUTHENTICATED, "TOKEN_MISSING")
        expired = mint(self.hs, sub="alice", ttl=-120)
        f = failure(self.call, via, "Get", expired, key=k)
        self.assertRpcFailure(f, grpc.StatusCode.UNAUTHENTICATED, "TOKEN_EXPIRED")

    def test_the_owners_journal_quota_refusal_reaches_the_client_unchanged(self):
        from drey_tokens import mint
        tok = mint(self.hs, sub="filler")
        k = "quota-key"
        via, owner = self.via(k)
        refusal = None
        for i in range(400):
            try:
                self.call(via, "Set", tok, key=k, value=make_value(b"x" * 2048), request_id="q%d" % i)
            except grpc.RpcError as e:
                refusal = RpcFailure(e)
                break
        self.assertIsNotNone(refusal, "the owner's 128 KiB journal never filled")
        self.assertRpcFailure(refusal, grpc.StatusCode.RESOURCE_EXHAUSTED, "JOURNAL_DISK_QUOTA")
        self.assertEqual(refusal.quota_failure.violations[0].subject, "node:" + owner)
        self.assertIsNotNone(refusal.retry_info)


class Faults(unittest.TestCase):
    """Each test breaks a cluster of its own."""

    def test_a_dead_owner_is_unavailable_until_it_returns_with_its_data(self):
        with Cluster(partitions=16, initial_nodes=3, ephemeral=False) as cl:
            dirs = {i: tempfile.mkdtemp(prefix="drey-node-", dir=os.environ.get("TEST_TMPDIR")) for i in (1, 2, 3)}
            for d in dirs.values():
                self.addCleanup(shutil.rmtree, d, True)
            nodes = [cl.start_node("n%d" % i, data_dir=dirs[i]) for i in (1, 2, 3)]
            cl.wait_assigned(3)
            owners = poll(lambda: cl.owners(nodes[0]), lambda o: all(o.values()), what="table")
            n1 = nodes[0]
            fn, req_cls, _ = n1.cache.methods["Set"]
            keys = ["d%d" % i for i in range(48)]
            for k in keys:
                fn(req_cls(key=k, value=make_value("v" + k)), timeout=RPC)
            victim = cl.nodes["n3"]
            victim.server.kill()
            # once its lease is gone, n3's keys are unavailable, the rest are served
            get, greq, _ = n1.cache.methods["Get"]
            refusals = []

            def n3_key_refused():
                try:
                    get(greq(key=next(k for k in keys if owners[partition("", k, 16)] == "n3")), timeout=RPC)
                    return False
                except grpc.RpcError as e:
                    refusals.append(RpcFailure(e))
                    return refusals[-1].metadata.get("cause") == "LEASE_EXPIRED"

            wait_until(n3_key_refused, what="n3's partitions refused after its lease")
            # from the kill on, every refusal is typed, never the transport's bare
            # message: while n3's lease runs its stream breaks (OWNER_UNREACHABLE),
            # then its membership is gone (LEASE_EXPIRED); a read applied nothing
            for f in refusals:
                self.assertEqual((f.code, f.reason), (UNAVAILABLE, "PARTITION_UNAVAILABLE"), f.message)
                self.assertIsNotNone(f.retry_info, "RetryInfo tells when to try again")
                self.assertEqual((f.metadata["primary"], f.metadata["outcome"]), ("n3", "not_applied"))
                self.assertIn(f.metadata["cause"], ("OWNER_UNREACHABLE", "LEASE_EXPIRED"))
            for k in keys:
                if owners[partition("", k, 16)] == "n3":
                    f = failure(get, greq(key=k), timeout=RPC)
                    self.assertEqual(f.code, UNAVAILABLE)
                    self.assertEqual(f.reason, "PARTITION_UNAVAILABLE")
                    self.assertIsNotNone(f.retry_info, "RetryInfo tells when to try again")
                else:
                    self.assertEqual(value_of(get(greq(key=k), timeout=RPC).value), "v" + k)
            # n3 comes back with its journal and serves its partitions again
            cl.start_node("n3", data_dir=dirs[3])
            wait_until(lambda: not n3_key_refused(), what="n3 serving again")
            for k in keys:
                self.assertEqual(value_of(get(greq(key=k), timeout=RPC).value), "v" + k, k)
            for n in cl.nodes.values():
                n.server.stop()

    def test_routing_goes_on_without_etcd(self):
        with Cluster(partitions=8, initial_nodes=2) as cl:
            nodes = cl.start(2)
            cl.wait_assigned(2)
            poll(lambda: cl.owners(nodes[0]), lambda o: all(o.values()), what="table")
            poll(lambda: cl.owners(nodes[1]), lambda o: all(o.values()), what="table")
            cl.etcd.proc.kill()
            cl.etcd.proc.wait()
            from drey_tokens import details
            poll(lambda: details(nodes[0].server)["cluster"], lambda c: not c["etcdReachable"],
                 what="readiness saying etcd is unreachable")
            self.assertTrue(details(nodes[0].server)["ready"], "a node that can route stays ready")
            for i in range(32):
                via = nodes[i % 2]
                fn, req_cls, _ = via.cache.methods["Set"]
                fn(req_cls(key="e%d" % i, value=make_value(i)), timeout=RPC)
            for n in nodes:
                fn, req_cls, _ = n.cache.methods["Get"]
                for i in range(32):
                    self.assertEqual(value_of(fn(req_cls(key="e%d" % i), timeout=RPC).value), i)
            for n in nodes:
                n.server.stop()

    def test_not_primary_is_retried_once_and_answered_when_the_table_lags(self):
        """n3 reaches etcd through a proxy we cut: its table goes stale
        while a partition changes owner (n1 -> n2, written in etcd as a
        controller would). A write through n3 goes to n1, which says
        NOT_PRIMARY; n3 waits for its own table, routes once more (still
        stale: n1 again) and passes NOT_PRIMARY on. Once the link is back,
        n3 learns the owner and the write goes to n2."""
        from drey_cluster import Proxy
        # No moves: the controller would hand the partition back to n1.
        with Cluster(partitions=8, initial_nodes=3, lease_ttl="10s", extra_flags=("--cluster-max-moves=0",)) as cl:
            proxy = Proxy(cl.etcd.client_port)
            try:
                n1 = cl.start_node("n1")
                cl.start_node("n2")
                n3 = cl.start_node("n3", etcd_url=proxy.url)
                cl.wait_assigned(3)
                owners = poll(lambda: cl.owners(n3), lambda o: all(o.values()), what="n3's table")
                p = next(q for q, o in owners.items() if o == "n1")
                key = next(k for k in ("m%d" % i for i in range(500)) if partition("", k, 8) == p)
                proxy.block()
                value = b"\x0a\x02n2"  # drey.internal.v1.PartitionEntry{primary: "n2"}
                subprocess.run([shutil.which("etcdctl") or "/usr/bin/etcdctl", "--endpoints=" + cl.etcd.url, "put",
                                "%spartitions/%05d" % (cl.prefix, p), value], check=True, capture_output=True,
                               env=dict(os.environ, ETCDCTL_API="3"), timeout=30)
                poll(lambda: cl.owners(n1)[p], lambda o: o == "n2", what="n1 seeing n2 as the owner")
                self.assertEqual(cl.owners(n3)[p], "n1", "n3's table is stale while its link is cut")
                fn, req_cls, _ = n3.cache.methods["Set"]
                f = failure(fn, req_cls(key=key, value=make_value("v")), timeout=RPC)
                self.assertEqual(f.code, UNAVAILABLE)
                self.assertEqual(f.reason, "NOT_PRIMARY")
                self.assertEqual(f.metadata["primary"], "n2")
                from drey_tokens import details
                self.assertEqual(details(n3.server)["cluster"]["notPrimaryRetries"], 1, "routed once more, once")
                # The same write in a Pipeline message beside operations for
                # n2 (forwarded in the same peer message) and n3 itself: only
                # it is refused, with the unary call's reason, in its place.
                pb = cl.pb.cache
                other = next(k for k in ("o%d" % i for i in range(500)) if owners[partition("", k, 8)] == "n2")
                local = next(k for k in ("l%d" % i for i in range(500)) if owners[partition("", k, 8)] == "n3")
                ops = [pb.PipelineOperation(id=1, set=pb.SetRequest(key=other, value=make_value("o"))),
                       pb.PipelineOperation(id=2, set=pb.SetRequest(key=key, value=make_value("v"))),
                       pb.PipelineOperation(id=3, set=pb.SetRequest(key=local, value=make_value("l"))),
                       pb.PipelineOperation(id=4, get=pb.GetRequest(key=other))]
                got = []
                for resp in n3.cache.Pipeline(iter([pb.PipelineRequest(operations=ops)]), timeout=RPC):
                    got += list(resp.results)
                self.assertEqual([r.id for r in got], [1, 2, 3, 4])
                self.assertEqual([r.status.code for r in got], [0, UNAVAILABLE.value[0], 0, 0])
                info = cl.pb.error_details.ErrorInfo()
                self.assertTrue(any(d.Unpack(info) for d in got[1].status.details if d.Is(info.DESCRIPTOR)))
                self.assertEqual((info.reason, info.metadata["primary"]), ("NOT_PRIMARY", "n2"))
                self.assertEqual(value_of(got[3].get.value), "o")
                self.assertEqual(details(n3.server)["cluster"]["notPrimaryRetries"], 2, "the operation once more")
                proxy.unblock()
                poll(lambda: cl.owners(n3)[p], lambda o: o == "n2", what="n3 catching up")
                fn(req_cls(key=key, value=make_value("v")), timeout=RPC)
                get, greq, _ = cl.nodes["n2"].cache.methods["Get"]
                self.assertEqual(value_of(get(greq(key=key), timeout=RPC).value), "v", "the write is on n2")
                for n in cl.nodes.values():
                    n.server.stop()
            finally:
                proxy.close()

    def test_a_caller_that_goes_away_cancels_its_forwarded_call(self):
        """The owner is paused: forwarded calls without a deadline would hold
        their slots on the forwarding node until it resumed. Cancelling them
        cancels the forwarded calls, and the slots come back at once."""
        import signal
        from drey_tokens import details
        with Cluster(partitions=8, initial_nodes=3, lease_ttl="10s",
                     extra_flags=("--max-inflight=2", "--max-queued=0")) as cl:
            nodes = cl.start(3)
            cl.wait_assigned(3)
            owners = poll(lambda: cl.owners(nodes[0]), lambda o: all(o.values()), what="table")
            key = next(k for k in ("c%d" % i for i in range(500)) if owners[partition("", k, 8)] != "n1")
            victim = cl.nodes[owners[partition("", key, 8)]]
            n1 = nodes[0]
            inflight = lambda: details(n1.server)["backpressure"]["inFlight"]
            os.kill(victim.server.proc.pid, signal.SIGSTOP)
            try:
                fn, req_cls, _ = n1.cache.methods["Get"]
                futs = [fn.future(req_cls(key=key)) for _ in range(2)]
                poll(inflight, lambda v: v == 2, what="two forwarded calls holding n1's slots")
                for f in futs:
                    f.cancel()
                poll(inflight, lambda v: v == 0, timeout=10, what="the slots back once the callers went away")
            finally:
                os.kill(victim.server.proc.pid, signal.SIGCONT)
            for n in cl.nodes.values():
                n.server.stop()

    def test_a_dead_controller_is_replaced(self):
        with Cluster(partitions=8, initial_nodes=3) as cl:
            cl.start(3)
            s = cl.wait_assigned(3)
            old = s["controller"]
            self.assertIn(old, ("n1", "n2", "n3"))
            cl.nodes[old].server.kill()
            s = poll(cl.status, lambda s: s["controller"] not in ("", old), timeout=30, what="a new controller")
            self.assertIn(s["controller"], set(cl.nodes) - {old})
            for n in cl.nodes.values():
                if n.id != old:
                    n.server.stop()


if __name__ == "__main__":
    main()
