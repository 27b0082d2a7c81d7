"""Cache/Watch in a cluster: a watch opened on any node follows the
partitions it covers, at their owners, across moves and lost owners.

- A keys watch on n1 of keys that n2 and n3 own sees every set and remove,
  made through any node, with values, in version order per key; a prefix
  and a whole-cache watch through one node see writes in every partition.
- The client's first message is WATCHING, sent once every owner's
  subscription is in place; a resume names one node's feed, so in a cluster
  it starts with RESYNC_REQUIRED HISTORY_UNAVAILABLE instead.
- A fourth node joins (partitions move) while a whole-cache watch is open:
  RESYNC_REQUIRED OWNER_CHANGED, then WATCHING; afterwards writes to moved
  partitions are reported, and no acknowledged write to a partition that
  did not move is missing from the stream.
- An owner SIGKILLed: RESYNC_REQUIRED OWNER_LOST; when it is back, WATCHING
  and its partitions' writes are reported again.
- A watch counts once, at the ingress, against its caller
  (--principal-max-watches); the owners serve its subscriptions apart
  (drey_watch_subscriptions) and cancelling it releases every one of them.
"""
import os
import random
import signal
import threading
import time

import grpc

from drey_cluster import Cluster, metric, partition, peer_channel, wait_until
from drey_harness import DreyTestCase, RpcFailure, ServiceClient, main, make_value, value_of

RPC = 10
PARTS = 16
SUBSCRIBE = "/drey.internal.v1.Subscriber/Subscribe"








class Collector:
    """A Watch (or a hand-made subscription: call) read on a thread; every
    message kept, in order."""

    def __init__(self, client, call=None, **fields):
        if call is None:
            fn, req_cls, _ = client.methods["Watch"]
            call = fn(req_cls(**fields), timeout=300)
        self.call = call
        self.events = []
        self.times = []  # monotonic arrival of each
        self.lock = threading.Lock()
        self.error = None
        self.ended = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            for ev in self.call:
                with self.lock:
                    self.events.append(ev)
                    self.times.append(time.monotonic())
        except grpc.RpcError as e:
            self.error = e
        self.ended = True

    def snapshot(self):
        with self.lock:
            return list(self.events)

    def wait(self, pred, what, timeout=30):
        def check():
            if self.ended and not pred(self.snapshot()):
                raise AssertionError("the stream ended (%r) before %s" % (self.error, what))
            return pred(self.snapshot())
        wait_until(check, timeout=timeout, what=what)
        return self.snapshot()

    def cancel(self):
        self.call.cancel()
        self.thread.join(30)


class ClusterWatch(DreyTestCase):
    SERVER_FLAGS = None

    def kind(self, name):
        return self.pb.cache.WatchEvent.Kind.Value(name)

    def kinds(self, evs):
        return [self.pb.cache.WatchEvent.Kind.Name(e.kind) for e in evs]

    def call(self, node, method, **fields):
        fn, req_cls, _ = node.cache.methods[method]
        return fn(req_cls(**fields), timeout=RPC)

    def watch(self, node, **fields):
        w = Collector(node.cache, **fields)
        self.addCleanup(w.cancel)
        return w

    def keys_owned_by(self, owners, node_id, n, cache="", prefix="k"):
        out, i = [], 0
        while len(out) < n:
            k = "%s%d" % (prefix, i)
            if owners[partition(cache, k, PARTS)] == node_id:
                out.append(k)
            i += 1
        return out

    def cluster(self, nodes=3, flags=(), per_node=None):
        cl = Cluster(partitions=PARTS, initial_nodes=nodes, extra_flags=flags)
        cl.__enter__()
        self.addCleanup(cl.__exit__, None, None, None)

        def stop_all():  # a clean stop (exit code, leaks under ASan), watches open or not
            for n in list(cl.nodes.values()):
                if n.server.returncode is None and n.server.proc.poll() is None:
                    n.server.stop()
        self.addCleanup(stop_all)
        started = [cl.start_node("n%d" % i, flags=(per_node or {}).get("n%d" % i, ()))
                   for i in range(1, nodes + 1)]
        cl.wait_assigned(nodes)
        owners = cl.agreed_owners(started)
        return cl, started, owners

    def subscribe(self, cl, node, as_id, node_field=None, partitions=(), count=PARTS, **watch):
        """A Subscribe call by hand, as node as_id would make it."""
        ch = peer_channel(cl, node, as_id)
        self.addCleanup(ch.close)
        stub = ch.unary_stream(SUBSCRIBE, request_serializer=self.pb.subscribe.SubscribeRequest.SerializeToString,
                               response_deserializer=self.pb.cache.WatchEvent.FromString)
        req = self.pb.subscribe.SubscribeRequest(node=as_id if node_field is None else node_field,
                                                 watch=self.pb.cache.WatchRequest(**watch),
                                                 partition_count=count, partitions=list(partitions))
        return stub(req, timeout=300)

    def assert_in_order(self, evs):
        last = {}
        for e in evs:
            if e.kind == self.kind("SET"):
                self.assertGreater(e.version, last.get(e.key, 0), "version order for %s" % e.key)
                last[e.key] = e.version
            elif e.kind == self.kind("REMOVE"):  # the version that went
                self.assertGreaterEqual(e.version, last.get(e.key, 0), "version order for %s" % e.key)
                last[e.key] = e.version

    # --- the tests -----------------------------------------------------------------

    def test_a_keys_watch_follows_other_owners_with_values_in_order(self):
        cl, (n1, n2, n3), owners = self.cluster()
        a = self.keys_owned_by(owners, "n2", 1)[0]
        b = self.keys_owned_by(owners, "n3", 1)[0]
        other = self.keys_owned_by(owners, "n2", 2)[1]
        w = self.watch(n1, keys=[a, b], include_values=True)
        first = w.wait(lambda evs: evs, "WATCHING")[0]
        self.assertEqual(first.kind, self.kind("WATCHING"))
        expected = []
        for i, via in enumerate([n1, n2, n3, n2, n1, n3]):
            k = a if i % 2 == 0 else b
            r = self.call(via, "Set", key=k, value=make_value("v%d" % i))
            expected.append(("SET", k, r.version, "v%d" % i))
            self.call(via, "Set", key=other, value=make_value("no"))
        rm = self.call(n3, "Remove", key=a)
        expected.append(("REMOVE", a, rm.version, None))
        evs = w.wait(lambda evs: len(evs) >= 1 + len(expected), "%d events" % len(expected))[1:]
        got = [(self.pb.cache.WatchEvent.Kind.Name(e.kind), e.key, e.version,
                value_of(e.value) if e.HasField("value") else None) for e in evs]
        for k in (a, b):
            self.assertEqual([g for g in got if g[1] == k], [x for x in expected if x[1] == k], k)
        self.assertNotIn(other, [e.key for e in evs], "a key not watched")
        self.assert_in_order(evs)
        self.assertTrue(all(e.cache == "default" for e in evs))

    def test_delay_from_acknowledgement_to_event_is_printed(self):
        """Not a timed assertion: the numbers for the report. A watch opened
        on the owner subscribes at itself (over its internal listener); one
        opened elsewhere adds that node's hop."""
        cl, (n1, n2, n3), owners = self.cluster()
        k = self.keys_owned_by(owners, "n2", 1)[0]
        local, remote = self.watch(n2, keys=[k]), self.watch(n1, keys=[k])
        for w in (local, remote):
            w.wait(lambda evs: evs, "WATCHING")
        acks = {}
        for i in range(200):
            r = self.call(n2, "Set", key=k, value=make_value(i))
            acks[r.version] = time.monotonic()
            for w in (local, remote):
                w.wait(lambda evs: evs[-1].version == r.version, "the event")
        for name, w in (("local", local), ("remote", remote)):
            with w.lock:
                arrived = {e.version: t for e, t in zip(w.events, w.times)}
            # an event may come before the acknowledgement is read: 0
            d = sorted(max(0.0, arrived[v] - t) for v, t in acks.items())
            print("cluster watch delay, write acknowledged -> event, %s (200 writes): p50 %.2f ms, p90 %.2f ms" %
                  ("opened on the owner" if name == "local" else "opened on another node", d[100] * 1000,
                   d[180] * 1000))

    def test_prefix_and_whole_cache_watches_see_every_partition(self):
        cl, nodes, owners = self.cluster()
        cache = "wc"
        wp = self.watch(nodes[1], cache=cache, prefix="p/")
        wall = self.watch(nodes[2], cache=cache)
        for w in (wp, wall):
            self.assertEqual(w.wait(lambda evs: evs, "WATCHING")[0].kind, self.kind("WATCHING"))
        keys = {}
        i = 0
        while len({partition(cache, k, PARTS) for k in keys}) < PARTS:
            k = "p/%d" % i
            keys[k] = self.call(nodes[i % 3], "Set", cache=cache, key=k, value=make_value(i)).version
            i += 1
        self.call(nodes[0], "Set", cache=cache, key="q/1", value=make_value("not in the prefix"))
        for w, want in ((wp, set(keys)), (wall, set(keys) | {"q/1"})):
            evs = w.wait(lambda evs: {e.key for e in evs[1:]} >= want, "every partition's writes")
            self.assertEqual({e.key for e in evs[1:]}, want)
            self.assertEqual({e.key: e.version for e in evs[1:] if e.key in keys}, keys)
        # Clear reaches every owner: each reports its share's CLEAR
        self.call(nodes[0], "Clear", cache=cache)
        wall.wait(lambda evs: self.kind("CLEAR") in [e.kind for e in evs], "CLEAR")

    def test_a_resume_in_a_cluster_starts_with_resync(self):
        cl, nodes, owners = self.cluster()
        w = self.watch(nodes[0], resume_feed=12345, resume_after=7)
        first = w.wait(lambda evs: evs, "the first message")[0]
        self.assertEqual((first.kind, first.reason), (self.kind("RESYNC_REQUIRED"), "HISTORY_UNAVAILABLE"))
        k = self.keys_owned_by(owners, "n3", 1)[0]
        v = self.call(nodes[1], "Set", key=k, value=make_value(1)).version
        evs = w.wait(lambda evs: len(evs) >= 2, "an event after it")
        self.assertEqual((evs[1].kind, evs[1].key, evs[1].version), (self.kind("SET"), k, v))

    def test_a_watch_counts_once_at_the_ingress_and_cancelling_releases_its_subscriptions(self):
        cl, nodes, owners = self.cluster(flags=("--principal-max-watches=1",))
        n1 = nodes[0]
        w1 = self.watch(n1)
        w1.wait(lambda evs: evs, "WATCHING")
        # the same caller (one connection) again: refused at the ingress
        fn, req_cls, _ = n1.cache.methods["Watch"]
        with self.assertRaises(grpc.RpcError) as e:
            next(fn(req_cls(), timeout=RPC))
        self.assertRpcFailure(RpcFailure(e.exception), grpc.StatusCode.RESOURCE_EXHAUSTED, "PRINCIPAL_WATCH_LIMIT")
        # another caller: its subscriptions at every owner come from node:n1,
        # which no owner counts against a principal's limit of 1
        other = ServiceClient(n1.server.channel(options=[("grpc.use_local_subchannel_pool", 1)]), cl.pb.cache,
                              "drey.cache.v1.Cache")
        w2 = Collector(other)
        self.addCleanup(w2.cancel)
        w2.wait(lambda evs: evs, "WATCHING")
        for n in nodes:
            self.assertEqual(metric(n, "drey_watch_subscriptions"), 2, n.id)
            self.assertEqual(metric(n, "drey_watch_streams"), 2 if n is n1 else 0, n.id)
        k = self.keys_owned_by(owners, "n2", 1)[0]
        v = self.call(nodes[2], "Set", key=k, value=make_value(1)).version
        for w in (w1, w2):
            w.wait(lambda evs: any(e.key == k and e.version == v for e in evs), "the write, on both watches")
        w1.cancel()
        w2.cancel()
        for n in nodes:
            wait_until(lambda: metric(n, "drey_watch_subscriptions") == 0, what="%s's subscriptions gone" % n.id)
            self.assertEqual(metric(n, "drey_watch_streams"), 0)

    def test_an_owner_serves_a_subscription_only_to_the_node_it_names_and_only_what_it_asks(self):
        cl, (n1, n2, n3), owners = self.cluster()
        mine = sorted({p for p, o in owners.items() if o == "n1"})
        self.assertGreaterEqual(len(mine), 2)
        refusals = [
            (dict(as_id="n9", node_field="n2"), grpc.StatusCode.UNAUTHENTICATED, "PEER_UNAUTHENTICATED"),
            (dict(as_id="n9", count=PARTS * 2), grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_REQUEST"),
            (dict(as_id="n9", keys=["a"], prefix="a"), grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_REQUEST"),
        ]
        for kw, code, reason in refusals:
            with self.assertRaises(grpc.RpcError) as e:
                next(self.subscribe(cl, n1, partitions=mine, **kw))
            self.assertRpcFailure(RpcFailure(e.exception), code, reason)
        # the partitions asked for, not the others n1 owns
        s = Collector(None, call=self.subscribe(cl, n1, "n9", partitions=mine[:1]))
        self.addCleanup(s.cancel)
        self.assertEqual(s.wait(lambda evs: evs, "WATCHING")[0].kind, self.kind("WATCHING"))
        self.assertEqual(metric(n1, "drey_watch_subscriptions"), 1)
        self.assertEqual(metric(n1, "drey_watch_streams"), 0, "a subscription is no client's watch")
        asked = next(k for k in ("s%d" % i for i in range(1000)) if partition("", k, PARTS) == mine[0])
        other = next(k for k in ("s%d" % i for i in range(1000)) if partition("", k, PARTS) == mine[1])
        self.call(n2, "Set", key=other, value=make_value("no"))
        v = self.call(n3, "Set", key=asked, value=make_value("yes")).version
        evs = s.wait(lambda evs: len(evs) >= 2, "the write asked for")
        self.assertEqual([(e.key, e.version) for e in evs[1:]], [(asked, v)])
        s.cancel()
        wait_until(lambda: metric(n1, "drey_watch_subscriptions") == 0, what="the subscription gone")

    def test_a_join_moves_partitions_under_an_open_watch(self):
        cl, nodes, before = self.cluster()
        w = self.watch(nodes[0], include_values=True)
        w.wait(lambda evs: evs, "WATCHING")
        # every partition asked of each old owner: what it owns at each change
        # is reported, never the copy it drops after a handover
        raw = {}
        for n in nodes:
            raw[n.id] = Collector(None, call=self.subscribe(cl, n, "n9", partitions=range(PARTS)))
            self.addCleanup(raw[n.id].cancel)
            raw[n.id].wait(lambda evs: evs, "WATCHING")
        acked = []  # (key, version), writes acknowledged while the watch is open
        lock, stop = threading.Lock(), threading.Event()

        def writer(seed):
            rnd = random.Random(seed)
            i = 0
            while not stop.is_set():
                k = "j%d-%d" % (seed, i % 200)
                i += 1
                via = rnd.choice(cl.live())
                try:
                    r = self.call(via, "Set", key=k, value=make_value(i))
                except grpc.RpcError:
                    continue  # a write refused or unknown is never asserted on
                with lock:
                    acked.append((k, r.version))

        threads = [threading.Thread(target=writer, args=(s,), daemon=True) for s in range(2)]
        for t in threads:
            t.start()
        try:
            wait_until(lambda: len(acked) >= 100, what="writes before the join")
            cl.start_node("n4")
            # settled: n4 owns some and no move is left
            wait_until(lambda: (lambda s: s["unassignedPartitions"] == 0 and not s["moves"] and
                                any(n["id"] == "n4" and n["partitions"] > 0 for n in s["nodes"]))(cl.status()),
                       timeout=120, what="the join settled")
            after = cl.agreed_owners(list(cl.nodes.values()))
            n_after = len(acked)
            wait_until(lambda: len(acked) >= n_after + 100, what="writes after the join")
        finally:
            stop.set()
            for t in threads:
                t.join(60)
        moved = {p for p in range(PARTS) if before[p] != after[p]}
        self.assertTrue(moved, "the join moved partitions")
        marks = lambda evs: [e for e in evs if e.kind in (self.kind("RESYNC_REQUIRED"), self.kind("WATCHING"))]
        evs = w.wait(lambda evs: marks(evs)[-1].kind == self.kind("WATCHING") and len(marks(evs)) >= 3,
                     "RESYNC_REQUIRED then WATCHING again")
        m = marks(evs)
        self.assertEqual(self.kinds(m[:2]), ["WATCHING", "RESYNC_REQUIRED"])
        self.assertEqual(m[1].reason, "OWNER_CHANGED")
        # every RESYNC_REQUIRED is followed by a WATCHING, never two in a row
        ks = self.kinds(m)
        self.assertTrue(all(ks[i] != ks[i + 1] for i in range(len(ks) - 1)), ks)
        # afterwards: writes to the moved partitions are reported
        mk = [k for k in ("m%d" % i for i in range(400)) if partition("", k, PARTS) in moved][:8]
        wrote = {k: self.call(random.choice(list(cl.nodes.values())), "Set", key=k, value=make_value(k)).version
                 for k in mk}
        evs = w.wait(lambda evs: all(any(e.key == k and e.version == v for e in evs) for k, v in wrote.items()),
                     "the moved partitions' writes")
        # and nothing acknowledged in a partition that did not move is missing
        seen = {(e.key, e.version) for e in evs if e.kind == self.kind("SET")}
        stay = [(k, v) for k, v in acked if partition("", k, PARTS) not in moved]
        self.assertGreater(len(stay), 100)
        missing = [kv for kv in stay if kv not in seen]
        self.assertEqual(missing, [], "acknowledged writes of unmoved partitions missing from the stream")
        self.assert_in_order(evs)
        # the writers never remove: a REMOVE would be an old owner's drop
        for node_id, r in raw.items():
            self.assertEqual([e.key for e in r.snapshot() if e.kind == self.kind("REMOVE")], [], node_id)
            self.assertTrue(any(e.kind == self.kind("SET") for e in r.snapshot()), node_id)
        print("join under a watch: %d partitions moved, %d writes acknowledged, %d markers" %
              (len(moved), len(acked), len(m)))

    def test_a_stuck_reader_of_a_cluster_watch_gets_one_resync_and_goes_on(self):
        cl, (n1, n2, n3), owners = self.cluster(flags=("--watch-buffer-bytes=256KiB",))
        k = self.keys_owned_by(owners, "n2", 1)[0]
        # a connection whose window does not grow: the writes below fill it
        ch = n1.server.channel(options=[("grpc.use_local_subchannel_pool", 1), ("grpc.http2.bdp_probe", 0)])
        client = ServiceClient(ch, cl.pb.cache, "drey.cache.v1.Cache")
        fn, req_cls, _ = client.methods["Watch"]
        call = fn(req_cls(keys=[k], include_values=True), timeout=120)
        self.assertEqual(next(call).kind, self.kind("WATCHING"))
        big = make_value(b"x" * 65536)
        versions = [self.call(n2, "Set", key=k, value=big).version for _ in range(100)]  # 6.5 MB nobody reads
        after = self.call(n3, "Set", key=k, value=make_value("after")).version
        events = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ev = next(call)
            events.append(ev)
            if ev.kind == self.kind("SET") and ev.version == after:
                break
        call.cancel()
        ks = self.kinds(events)
        # the ingress's buffer overflows (the owner's too, if the ingress
        # was slow to read it): each says so once, in the ingress's words
        overflows = metric(n1, "drey_watch_resyncs_total") + metric(n2, "drey_watch_resyncs_total")
        self.assertGreaterEqual(overflows, 1)
        self.assertTrue(1 <= ks.count("RESYNC_REQUIRED") <= overflows, ks)
        self.assertEqual({e.reason for e in events if e.kind == self.kind("RESYNC_REQUIRED")}, {"BUFFER_OVERFLOW"})
        self.assertLess(len(events), len(versions), "the reader was behind")
        self.assertEqual(events[-1].version, after)
        seen = [e.version for e in events if e.kind == self.kind("SET")]
        self.assertEqual(seen, sorted(seen))

    def test_an_overflow_while_a_watching_is_owed_keeps_saying_it_is_owed(self):
        cl, (n1, n2, n3), owners = self.cluster(flags=("--watch-buffer-bytes=256KiB",))
        k2 = self.keys_owned_by(owners, "n2", 1)[0]
        k3 = self.keys_owned_by(owners, "n3", 1)[0]
        ch = n1.server.channel(options=[("grpc.use_local_subchannel_pool", 1), ("grpc.http2.bdp_probe", 0)])
        client = ServiceClient(ch, cl.pb.cache, "drey.cache.v1.Cache")
        fn, req_cls, _ = client.methods["Watch"]
        call = fn(req_cls(keys=[k2, k3], include_values=True), timeout=120)
        self.assertEqual(next(call).kind, self.kind("WATCHING"))
        n3.server.kill()  # OWNER_LOST: a WATCHING is owed until n3 is back
        wait_until(lambda: "a watch's subscription ended" in n1.server.log_text(), what="n1 saw it end")
        # nobody reads while n2's events overflow the ingress's buffer
        big = make_value(b"x" * 65536)
        for _ in range(100):
            self.call(n2, "Set", key=k2, value=big)
        # the ingress's buffer, or (a slow ingress) the owner's subscription's
        wait_until(lambda: metric(n1, "drey_watch_resyncs_total") + metric(n2, "drey_watch_resyncs_total") >= 1,
                   what="an overflow")
        cl.start_node("n3")
        events = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            events.append(next(call))
            if events[-1].kind == self.kind("WATCHING"):
                break
        call.cancel()
        resyncs = [e.reason for e in events if e.kind == self.kind("RESYNC_REQUIRED")]
        self.assertTrue(resyncs)
        self.assertEqual(set(resyncs), {"OWNER_LOST"}, "the overflow's RESYNC_REQUIRED still says a WATCHING is owed")
        self.assertEqual(events[-1].kind, self.kind("WATCHING"))

    def test_an_owners_overflow_while_a_watching_is_owed_adds_nothing(self):
        # n1 (the ingress) keeps its lease while it is stopped
        cl, (n1, n2, n3), owners = self.cluster(flags=("--watch-buffer-bytes=256KiB",),
                                                per_node={"n1": ("--cluster-lease-ttl=30s",)})
        k2 = self.keys_owned_by(owners, "n2", 1)[0]
        k3 = self.keys_owned_by(owners, "n3", 1)[0]
        w = self.watch(n1, keys=[k2, k3], include_values=True)
        w.wait(lambda evs: evs, "WATCHING")
        n3.server.kill()
        w.wait(lambda evs: len(evs) >= 2, "OWNER_LOST")
        # the ingress stops reading n2: n2's subscription overflows
        os.kill(n1.server.proc.pid, signal.SIGSTOP)
        try:
            big = make_value(b"x" * 65536)
            for _ in range(300):
                self.call(n2, "Set", key=k2, value=big)
            wait_until(lambda: metric(n2, "drey_watch_resyncs_total") >= 1, what="n2's subscription overflowed")
        finally:
            os.kill(n1.server.proc.pid, signal.SIGCONT)
        v = self.call(n2, "Set", key=k2, value=make_value("after")).version
        w.wait(lambda evs: any(e.version == v for e in evs), "the write after it")
        cl.start_node("n3")
        evs = w.wait(lambda evs: evs[-1].kind == self.kind("WATCHING") and len(evs) > 2, "WATCHING again")
        marks = [(self.pb.cache.WatchEvent.Kind.Name(e.kind), e.reason) for e in evs if e.kind != self.kind("SET")]
        # (the ingress's own buffer may overflow too as it catches up: that
        # one repeats OWNER_LOST); never BUFFER_OVERFLOW, which would say the
        # watch covers everything again before n3 is back
        self.assertEqual(marks[0], ("WATCHING", ""))
        self.assertEqual(marks[-1], ("WATCHING", ""))
        self.assertEqual(set(marks[1:-1]), {("RESYNC_REQUIRED", "OWNER_LOST")}, marks)

    def test_a_node_not_yet_joined_refuses_subscriptions(self):
        # a restarted node waits for its old lease (5 s) before it joins;
        # its internal listener is up meanwhile
        cl, (n1, n2), owners = self.cluster(nodes=2, flags=("--cluster-lease-ttl=5s",))
        n2.server.kill()
        back = cl.start_node("n2", wait=False)
        with self.assertRaises(grpc.RpcError) as e:
            next(self.subscribe(cl, back, "n9", partitions=range(PARTS)))
        self.assertRpcFailure(RpcFailure(e.exception), grpc.StatusCode.UNAVAILABLE, "RECOVERING")
        back.server.wait_serving()

    def test_a_lost_owner_resyncs_and_is_followed_again_when_it_returns(self):
        cl, (n1, n2, n3), owners = self.cluster()
        k3 = self.keys_owned_by(owners, "n3", 1)[0]
        k2 = self.keys_owned_by(owners, "n2", 1)[0]
        w = self.watch(n1, keys=[k2, k3])
        w.wait(lambda evs: evs, "WATCHING")
        n3.server.kill()
        evs = w.wait(lambda evs: len(evs) >= 2, "RESYNC_REQUIRED")
        self.assertEqual((evs[1].kind, evs[1].reason), (self.kind("RESYNC_REQUIRED"), "OWNER_LOST"))
        # the other owner's events go on meanwhile
        v2 = self.call(n1, "Set", key=k2, value=make_value(2)).version
        w.wait(lambda evs: any(e.key == k2 and e.version == v2 for e in evs), "n2's write while n3 is down")
        cl.start_node("n3")
        evs = w.wait(lambda evs: evs[-1].kind == self.kind("WATCHING") and len(evs) >= 3, "WATCHING again",
                     timeout=60)
        v3 = self.call(n2, "Set", key=k3, value=make_value(3)).version
        evs = w.wait(lambda evs: any(e.key == k3 and e.version == v3 for e in evs), "n3's write once it is back")
        self.assertEqual(self.kinds([e for e in evs if e.kind != self.kind("SET")]),
                         ["WATCHING", "RESYNC_REQUIRED", "WATCHING"])


if __name__ == "__main__":
    main()
