"""The fault harness works, proven on today's cluster (replication factor 1).

Three durable nodes and Debian's etcd, every link behind its own proxy
(drey_nemesis.NemesisCluster). Each nemesis is shown to do what it says on
the cluster as it is: a node cut from etcd loses its lease and comes back
on heal; a one-way cut between two nodes fails the calls forwarded that way
by their deadline while the other way works; a node paused past its lease
leaves and returns on SIGCONT; a node whose wall clock is offset serves; a
minority split from the majority loses etcd and its peers; a node whose
journal quota is full refuses writes definitively; and the workloads'
checkers stay clean through a kill and restart of a node (with factor 1 its
partitions are unavailable meanwhile: those operations fail or are unknown,
and the checkers must treat them so).

--cluster-peer-address is tested here too: a node dials a peer through the
override (and TLS still checks the peer's id), a wrong override fails
UNAVAILABLE rather than hanging, a malformed one stops the start.
"""
import datetime
import time

import grpc

from drey_checkers import Client, CounterWorkload, RegisterWorkload, SetWorkload
from drey_cluster import Cluster, free_port, partition
from drey_harness import DreyServer, DreyTestCase, RpcFailure, main, make_value, value_of
from drey_nemesis import NemesisCluster
from drey_tokens import details, poll

RPC = 5
PARTS = 16
TTL = 2.0  # the clusters' lease TTL, seconds


def key_on(owners, owner, prefix="k", cache=""):
    """A key of a partition owner owns."""
    return next(k for k in ("%s%d" % (prefix, i) for i in range(10000))
                if owners[partition(cache, k, PARTS)] == owner)


def set_through(node, key, value="v", timeout=RPC):
    fn, req_cls, _ = node.cache.methods["Set"]
    return fn(req_cls(key=key, value=make_value(value)), timeout=timeout)


def failure_of(fn):
    """(RpcFailure, seconds it took) of a call expected to fail."""
    t0 = time.monotonic()
    try:
        fn()
    except grpc.RpcError as e:
        return RpcFailure(e), time.monotonic() - t0
    raise AssertionError("the call succeeded")


def members(cl):
    return {n["id"] for n in cl.status()["nodes"]}


def works(fn):
    try:
        fn()
        return True
    except grpc.RpcError:
        return False


class Nemesis(DreyTestCase):
    SERVER_FLAGS = None

    def cluster(self, **kw):
        cl = NemesisCluster(partitions=PARTS, lease_ttl="%ds" % TTL, extra_flags=("--segment-bytes=64KiB",), **kw)
        cl.__enter__()
        self.addCleanup(cl.__exit__, None, None, None)
        cl.start()
        cl.wait_assigned(3)
        owners = cl.agreed_owners(list(cl.nodes.values()))
        return cl, owners

    def stop_all(self, cl):
        for n in cl.live():
            n.server.stop()

    def test_a_peer_is_dialled_through_its_proxy(self):
        cl, owners = self.cluster()
        n1, n2 = cl.nodes["n1"], cl.nodes["n2"]
        link = cl.links[("n1", "n2")]
        k = key_on(owners, "n2")
        set_through(n1, k, "through the proxy")
        # TLS checked n2's id through it
        self.assertGreater(link.forwarded, 0, "n1 dialled n2 through the proxy, not at its advertised address")
        got = n2.cache.methods["Get"][0](n2.cache.methods["Get"][1](key=k), timeout=RPC)
        self.assertEqual(value_of(got.value), "through the proxy")
        self.stop_all(cl)

    def test_a_node_cut_from_etcd_leaves_and_heal_brings_it_back(self):
        cl, owners = self.cluster()
        n3 = cl.nodes["n3"]
        for mode in ("reset", "blackhole"):
            cl.isolate_from_etcd("n3", mode)
            # the others see it leave once its lease lapses (TTL 2 s)
            poll(lambda: members(cl), lambda m: m == {"n1", "n2"}, timeout=TTL + 15, what="n3 leaving (%s)" % mode)
            poll(lambda: details(n3.server)["cluster"], lambda c: not c["etcdReachable"], timeout=15,
                 what="n3's readiness saying etcd is unreachable (%s)" % mode)
            # it goes on serving its own partitions with the table it has
            set_through(n3, key_on(owners, "n3"), "alone")
            cl.heal()
            poll(lambda: members(cl), lambda m: m == {"n1", "n2", "n3"}, timeout=30, what="n3 back (%s)" % mode)
            poll(lambda: details(n3.server)["cluster"], lambda c: c["etcdReachable"], timeout=30,
                 what="n3's readiness saying etcd is reachable (%s)" % mode)
        self.stop_all(cl)

    def test_a_one_way_cut_fails_calls_that_way_by_their_deadline(self):
        cl, owners = self.cluster()
        n1, n2 = cl.nodes["n1"], cl.nodes["n2"]
        on_n2, on_n1 = key_on(owners, "n2"), key_on(owners, "n1")
        set_through(n1, on_n2)
        set_through(n2, on_n1)
        for mode in ("reset", "blackhole"):
            cl.cut("n1", "n2", mode)
            f, took = failure_of(lambda: set_through(n1, on_n2, timeout=3))
            # reset: the link is refused, UNAVAILABLE at once; blackhole: the
            # call stalls until its deadline, never longer
            want = {"reset": {grpc.StatusCode.UNAVAILABLE},
                    "blackhole": {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}}[mode]
            self.assertIn(f.code, want, "%s: %r" % (mode, f))
            self.assertLess(took, 3 + 1.0, "%s: the call ended by its deadline" % mode)
            print("n1 -> n2 %s: %s after %.2f s" % (mode, f.code.name, took))
            # the other way works
            set_through(n2, on_n1, "n2 -> n1 works")
            cl.heal()
            # the channel's reconnect backoff passes: polled
            poll(lambda: works(lambda: set_through(n1, on_n2, timeout=2)), bool, timeout=30,
                 what="n1 -> n2 again after heal (%s)" % mode)
        self.stop_all(cl)

    def test_a_node_paused_past_its_lease_leaves_and_returns_on_sigcont(self):
        cl, owners = self.cluster()
        cl.pause("n2")
        try:
            poll(lambda: members(cl), lambda m: m == {"n1", "n3"}, timeout=TTL + 15, what="n2 leaving while stopped")
            f, _ = failure_of(lambda: set_through(cl.nodes["n1"], key_on(owners, "n2"), timeout=2))
            self.assertIn(f.code, (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED), f)
        finally:
            cl.resume("n2")
        poll(lambda: members(cl), lambda m: m == {"n1", "n2", "n3"}, timeout=30, what="n2 registered again")
        poll(lambda: works(lambda: set_through(cl.nodes["n1"], key_on(owners, "n2"), timeout=2)), bool, timeout=30,
             what="n2's partitions through n1 again")
        self.stop_all(cl)

    def test_a_node_with_its_wall_clock_offset_serves_and_reports_it(self):
        cl, owners = self.cluster()
        offset = 600  # inside the certificates' validity
        n3 = cl.restart_with_clock_offset("n3", offset)
        t0 = datetime.datetime.utcnow()
        rec = n3.server.find_log(lambda r: r.get("msg") == "listening")
        logged = datetime.datetime.strptime(rec["time"], "%Y-%m-%dT%H:%M:%S.%fZ")
        skew = (logged - t0).total_seconds()
        self.assertGreater(skew, offset - 60, "n3's log times run %+.0f s off (expected about %+d)" % (skew, offset))
        self.assertLess(skew, offset + 60)
        poll(lambda: members(cl), lambda m: m == {"n1", "n2", "n3"}, timeout=30, what="n3 back")
        # it serves its partitions, directly and forwarded both ways
        k3, k1 = key_on(owners, "n3"), key_on(owners, "n1")
        poll(lambda: works(lambda: set_through(cl.nodes["n1"], k3, "via n1", timeout=2)), bool, timeout=30,
             what="n3's partition through n1")
        set_through(n3, k1, "via n3")
        get, greq, _ = n3.cache.methods["Get"]
        self.assertEqual(value_of(get(greq(key=k3), timeout=RPC).value), "via n1")
        print("n3's wall clock: %+.1f s" % skew)
        self.stop_all(cl)

    def test_a_minority_split_loses_etcd_and_its_peers(self):
        cl, owners = self.cluster()
        n1, n2, n3 = (cl.nodes[i] for i in ("n1", "n2", "n3"))
        cl.split([["n1", "n2"], ["n3"]])
        poll(lambda: members(cl), lambda m: m == {"n1", "n2"}, timeout=TTL + 15, what="the minority leaving")
        poll(lambda: details(n3.server)["cluster"], lambda c: not c["etcdReachable"], timeout=15,
             what="the minority's etcd unreachable")
        self.assertTrue(details(n1.server)["cluster"]["etcdReachable"], "the majority keeps etcd")
        # the majority still talks within itself; neither side reaches the other
        set_through(n1, key_on(owners, "n2"))
        set_through(n2, key_on(owners, "n1"))
        f, _ = failure_of(lambda: set_through(n1, key_on(owners, "n3"), timeout=2))
        self.assertEqual(f.code, grpc.StatusCode.UNAVAILABLE, f)
        f, _ = failure_of(lambda: set_through(n3, key_on(owners, "n1"), timeout=2))
        self.assertEqual(f.code, grpc.StatusCode.UNAVAILABLE, f)
        set_through(n3, key_on(owners, "n3"), "the minority serves what it owns")
        cl.heal()
        poll(lambda: members(cl), lambda m: m == {"n1", "n2", "n3"}, timeout=30, what="one cluster again")
        poll(lambda: works(lambda: set_through(n3, key_on(owners, "n1"), timeout=2)), bool, timeout=30,
             what="n3 -> n1 again")
        self.stop_all(cl)

    def test_a_node_with_its_journal_quota_full_refuses_writes(self):
        cl, owners = self.cluster()
        k2 = key_on(owners, "n2")
        set_through(cl.nodes["n2"], k2, "before")
        n2, fitted = cl.fill_journal_quota("n2")
        print("n2's journal quota full after %d writes" % fitted)
        poll(lambda: members(cl), lambda m: m == {"n1", "n2", "n3"}, timeout=30, what="n2 back")
        # the refusal is definitive, forwarded from n1 too, and the key keeps its value
        for via in (n2, cl.nodes["n1"]):
            f = poll(lambda: failure_of(lambda: set_through(via, k2, "after", timeout=RPC))[0],
                     lambda f: f.code != grpc.StatusCode.UNAVAILABLE, timeout=30, what="a quota refusal")
            self.assertEqual((f.code, f.reason), (grpc.StatusCode.RESOURCE_EXHAUSTED, "JOURNAL_DISK_QUOTA"), f)
        get, greq, _ = n2.cache.methods["Get"]
        self.assertEqual(value_of(get(greq(key=k2), timeout=RPC).value), "before")
        # the workload client counts such refusals as definitive failures
        c = Client(lambda: [n2], rpc_timeout=RPC, attempts=3)
        r, outcome, f = c.call("Set", key=k2, value=make_value("after"))
        self.assertEqual((r, outcome, f.reason), (None, "fail", "JOURNAL_DISK_QUOTA"))
        # the other nodes' partitions take writes
        set_through(n2, key_on(owners, "n1"))
        self.stop_all(cl)

    def test_the_checkers_stay_clean_through_a_kill_and_restart(self):
        cl, owners = self.cluster()
        # few attempts: an operation on the dead node's partitions gives up
        # while it is down, as the checkers must see: "fail" when the
        # refusal says not_applied (no connection to the owner), "unknown"
        # when it was in flight at the kill
        client = Client(cl.live, rpc_timeout=RPC, attempts=4, backoff=0.05)
        loads = [RegisterWorkload(client, threads=2, keys=3), SetWorkload(client, threads=2, name="add"),
                 CounterWorkload(client, threads=2, counters=3)]
        for w in loads:
            w.start()
        try:
            def acked(n):
                poll(lambda: min(w.count("ok") for w in loads), lambda c: c >= n, timeout=30,
                     what="%d acknowledged operations of each workload" % n)
            acked(50)
            cl.kill("n2")
            # (a CAS refused VERSION_MISMATCH is a definitive failure any time)
            poll(lambda: client.gave_up, lambda c: c > 0, timeout=30,
                 what="operations on n2's partitions giving up while it is down")
            done = [w.count("ok") for w in loads]
            cl.restart("n2")
            poll(lambda: members(cl), lambda m: m == {"n1", "n2", "n3"}, timeout=30, what="n2 back")
            poll(lambda: [w.count("ok") - d for w, d in zip(loads, done)], lambda c: min(c) >= 50, timeout=30,
                 what="50 more acknowledged operations of each workload")
        finally:
            for w in loads:
                w.stop()
        reg, adds, ctr = loads
        via = cl.nodes["n1"]
        self.assertEqual(reg.check(), [], "the registers' history")
        self.assertEqual(adds.check(via), [], "the set")
        self.assertEqual(ctr.check(via), [], "the counters")
        print("kill+restart: %s ok, %s unknown, %s failed" % (
            [w.count("ok") for w in loads], [w.count("unknown") for w in loads], [w.count("fail") for w in loads]))
        self.stop_all(cl)


class PeerAddressOption(DreyTestCase):
    """--cluster-peer-address on a plain cluster."""
    SERVER_FLAGS = None

    def test_a_wrong_override_fails_unavailable_not_a_hang(self):
        closed = free_port()  # nothing listens there
        with Cluster(partitions=PARTS, initial_nodes=2, lease_ttl="2s") as cl:
            n1 = cl.start_node("n1", flags=("--cluster-peer-address=n2=127.0.0.1:%d" % closed,))
            n2 = cl.start_node("n2")
            cl.wait_assigned(2)
            owners = cl.agreed_owners([n1, n2])
            f, took = failure_of(lambda: set_through(n1, key_on(owners, "n2"), timeout=5))
            self.assertEqual(f.code, grpc.StatusCode.UNAVAILABLE, f)
            self.assertLess(took, 5, "failed, not waited out")
            # n1's own partitions, and n2 -> n1 (no override), work
            set_through(n1, key_on(owners, "n1"))
            set_through(n2, key_on(owners, "n1"))
            for n in cl.nodes.values():
                n.server.stop()

    def test_a_malformed_override_stops_the_start(self):
        with Cluster(partitions=PARTS, initial_nodes=1) as cl:
            cert, key = cl.ca.issue("n1")
            for bad in ("n2", "n2=", "=127.0.0.1:1", "n2=127.0.0.1", "n2=:1", "n2=127.0.0.1:", "n2=h:1,,n3=h:2"):
                srv = DreyServer(*cl.node_flags("n1", cert, key), "--cluster-peer-address=" + bad, name="n1")
                srv.spawn()
                self.assertEqual(srv.wait(timeout=30), 1, bad)
                rec = srv.find_log(lambda r: r.get("msg") == "cannot start as a cluster node")
                self.assertIsNotNone(rec, srv.log_text())
                self.assertIn("is not ID=HOST:PORT", rec["error"], bad)


if __name__ == "__main__":
    main()
