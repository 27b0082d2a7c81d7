"""Cache/Watch: change feeds through Debian's grpcio.

A watch names keys, a prefix or a whole cache; the first event is WATCHING
and every change after it comes once it is applied (durable first), in
order per key. A reader too slow for --watch-buffer-bytes gets exactly one
RESYNC_REQUIRED and the stream goes on; a watch resumes after the last
event it saw while the node still keeps what followed, and says
RESYNC_REQUIRED HISTORY_UNAVAILABLE otherwise. Watches count per principal
(--principal-max-watches: RESOURCE_EXHAUSTED PRINCIPAL_WATCH_LIMIT).
"""
import queue
import threading
import time

import grpc

from drey_harness import (ADMIN_SERVICE, CACHE_SERVICE, DreyTestCase, RpcFailure, ServiceClient, main,
                          value_of)

DEADLINE = 20.0


class Watcher:
    """A Watch read on a thread into a queue, so a test can wait for the
    next event with a deadline (and a stuck reader is one never drained)."""

    def __init__(self, client, **fields):
        self.events = queue.Queue()
        self.call = client.Watch(client.request("Watch", **fields), timeout=120)
        self.error = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            for ev in self.call:
                self.events.put(ev)
        except grpc.RpcError as e:
            self.error = e
        self.events.put(None)

    def next(self, timeout=DEADLINE):
        ev = self.events.get(timeout=timeout)
        if ev is None:
            raise AssertionError("the stream ended: %r" % (self.error,))
        return ev

    def cancel(self):
        self.call.cancel()
        self.thread.join(DEADLINE)


def kind(pb, name):
    return pb.cache.WatchEvent.Kind.Value(name)


class WatchTest(DreyTestCase):
    SERVER_FLAGS = ("--expiry-sweep-interval=20ms",)

    def watch(self, **fields):
        w = Watcher(self.cache, **fields)
        self.addCleanup(w.cancel)
        first = w.next()
        return w, first

    def test_keys_filter_with_values_in_order(self):
        a, b = self.key("a"), self.key("b")
        w, first = self.watch(keys=[a], include_values=True)
        self.assertEqual(first.kind, kind(self.pb, "WATCHING"))
        self.assertNotEqual(first.feed, 0)
        v1 = self.set(a, "one").version
        self.set(b, "not watched")
        v2 = self.set(a, "two").version
        rm = self.call("Remove", key=a)
        ev1, ev2, ev3 = w.next(), w.next(), w.next()
        self.assertEqual((ev1.kind, ev1.key, ev1.version, value_of(ev1.value)), (kind(self.pb, "SET"), a, v1, "one"))
        self.assertEqual(ev1.cache, "default")
        self.assertEqual((ev2.kind, ev2.version, value_of(ev2.value)), (kind(self.pb, "SET"), v2, "two"))
        self.assertEqual((ev3.kind, ev3.key, ev3.version), (kind(self.pb, "REMOVE"), a, rm.version))
        self.assertLess(first.sequence, ev1.sequence)
        self.assertLess(ev1.sequence, ev2.sequence)
        self.assertLess(ev2.sequence, ev3.sequence)

    def test_prefix_and_whole_cache_and_clear(self):
        cache = "wc-" + self.key("c")[-12:]
        p = self.key("p")
        wp, _ = self.watch(cache=cache, prefix=p)
        wall, _ = self.watch(cache=cache)
        self.set(p + "/1", 1, cache=cache)
        self.set("other", 2, cache=cache)
        self.set(p + "/elsewhere", 3)  # another cache
        self.call("Clear", cache=cache)
        e = wp.next()
        self.assertEqual((e.kind, e.key), (kind(self.pb, "SET"), p + "/1"))
        self.assertFalse(e.HasField("value"), "a value without include_values")
        self.assertEqual(wp.next().kind, kind(self.pb, "CLEAR"))
        got = [wall.next() for _ in range(3)]
        self.assertEqual([(g.kind, g.key) for g in got],
                         [(kind(self.pb, "SET"), p + "/1"), (kind(self.pb, "SET"), "other"),
                          (kind(self.pb, "CLEAR"), "")])
        self.assertEqual(got[2].cache, cache)

    def test_expire_and_increment(self):
        k = self.key()
        w, _ = self.watch(keys=[k])
        self.call("Increment", key=k, delta=5, ttl={"nanos": 50 * 1000 * 1000})
        e = w.next()
        self.assertEqual(e.kind, kind(self.pb, "SET"))
        self.assertTrue(e.HasField("expires_at"))
        x = w.next()
        self.assertEqual((x.kind, x.key, x.version), (kind(self.pb, "EXPIRE"), k, e.version))

    def test_resume_inside_the_history(self):
        k = self.key()
        w = Watcher(self.cache, keys=[k])
        first = w.next()
        self.set(k, 1)
        seen = w.next()
        w.cancel()
        missed = [self.set(k, i).version for i in (2, 3)]
        w2, hello = self.watch(keys=[k], resume_feed=first.feed, resume_after=seen.sequence)
        self.assertEqual((hello.kind, hello.sequence), (kind(self.pb, "WATCHING"), seen.sequence))
        self.assertEqual([w2.next().version for _ in missed], missed)
        live = self.set(k, 4).version
        self.assertEqual(w2.next().version, live)

    def test_resume_outside_the_history(self):
        _, first = self.watch(cache="elsewhere")
        for feed, after in ((first.feed ^ 1, first.sequence), (first.feed, first.sequence + 1000000)):
            _, ev = self.watch(resume_feed=feed, resume_after=after)
            self.assertEqual(ev.kind, kind(self.pb, "RESYNC_REQUIRED"))
            self.assertEqual(ev.reason, "HISTORY_UNAVAILABLE")
            self.assertEqual(ev.feed, first.feed)

    def test_invalid_requests(self):
        for fields, reason, field in (({"keys": ["a"], "prefix": "p"}, "MALFORMED_REQUEST", "prefix"),
                                      ({"keys": ["bad\x01key"]}, "INVALID_KEY", "keys[0]"),
                                      ({"cache": "bad name"}, "INVALID_CACHE_NAME", "cache")):
            with self.assertRaises(grpc.RpcError) as cm:
                next(self.cache.Watch(self.cache.request("Watch", **fields), timeout=DEADLINE))
            self.assertRpcFailure(RpcFailure(cm.exception), grpc.StatusCode.INVALID_ARGUMENT, reason, field=field)


class WatchOverflowTest(DreyTestCase):
    # 15 events of 64 KiB fit, a 16th does not: after an overflow there is
    # always room for the small write that ends the test.
    SERVER_FLAGS = ("--ephemeral", "--watch-buffer-bytes=1MiB", "--ops-listen=127.0.0.1:0")

    def metric(self, name):
        status, body = self.server.ops_get("/metrics")
        self.assertEqual(status, 200)
        for line in body.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        self.fail("no %s in /metrics" % name)

    def test_a_stuck_reader_gets_one_resync_and_goes_on(self):
        k = self.key()
        # A connection of its own whose window does not grow: the writes
        # below fill it while nobody reads.
        ch = self.server.channel(options=[("grpc.use_local_subchannel_pool", 1), ("grpc.http2.bdp_probe", 0)])
        client = ServiceClient(ch, self.pb.cache, CACHE_SERVICE)
        call = client.Watch(client.request("Watch", keys=[k], include_values=True), timeout=120)
        first = next(call)
        self.assertEqual(first.kind, kind(self.pb, "WATCHING"))
        big = b"x" * 65536
        versions = [self.set(k, big).version for _ in range(300)]  # 19 MB nobody reads
        after = self.set(k, "after").version
        events = []
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            ev = next(call)
            events.append(ev)
            if ev.kind == kind(self.pb, "SET") and ev.version == after:
                break
        self.assertEqual(self.metric("drey_watch_streams"), 1)
        self.assertEqual(self.metric("drey_watch_resyncs_total"), 1)
        self.assertEqual(self.metric("drey_watch_recording"), 1)
        self.assertGreaterEqual(self.metric("drey_watch_events_total"), len(versions) + 1)
        call.cancel()
        resyncs = [i for i, e in enumerate(events) if e.kind == kind(self.pb, "RESYNC_REQUIRED")]
        self.assertEqual(len(resyncs), 1, "exactly one RESYNC_REQUIRED: %r" % [e.kind for e in events])
        r = events[resyncs[0]]
        self.assertEqual(r.reason, "BUFFER_OVERFLOW")
        before, later = events[:resyncs[0]], events[resyncs[0] + 1:]
        self.assertLess(len(before), len(versions), "nothing was lost: the window was not filled")
        self.assertTrue(all(e.sequence <= r.sequence for e in before))
        self.assertTrue(all(e.sequence > r.sequence for e in later))
        self.assertEqual(later[-1].version, after)
        # Per key, versions only go up, across the resync too.
        seen = [e.version for e in events if e.kind == kind(self.pb, "SET")]
        self.assertEqual(seen, sorted(seen))


class WatchLimitTest(DreyTestCase):
    SERVER_FLAGS = ("--ephemeral", "--principal-max-watches=2", "--max-watches=3", "--watch-history-linger=0s",
                    "--node-id=wl", "--ops-listen=127.0.0.1:0")

    def setUp(self):
        # Streams of an earlier test leave asynchronously: start from none.
        deadline = time.monotonic() + DEADLINE
        while True:
            status, body = self.server.ops_get("/metrics")
            self.assertEqual(status, 200)
            if "\ndrey_watch_streams 0\n" in body:
                return
            self.assertLess(time.monotonic(), deadline, "watches of an earlier test are still open")

    def test_watches_per_node(self):
        channels = [self.server.channel(options=[("grpc.use_local_subchannel_pool", 1)]) for _ in range(4)]
        clients = [ServiceClient(ch, self.pb.cache, CACHE_SERVICE) for ch in channels]
        held = []
        for c in clients[:3]:  # three principals, one watch each
            w = Watcher(c)
            self.addCleanup(w.cancel)
            held.append(w)
            self.assertEqual(w.next().kind, kind(self.pb, "WATCHING"))
        with self.assertRaises(grpc.RpcError) as cm:
            next(clients[3].Watch(clients[3].request("Watch"), timeout=DEADLINE))
        f = self.assertRpcFailure(RpcFailure(cm.exception), grpc.StatusCode.RESOURCE_EXHAUSTED, "NODE_WATCH_LIMIT")
        self.assertEqual(f.metadata.get("limitWatches"), "3")
        self.assertEqual(f.quota_failure.violations[0].subject, "node:wl")
        self.assertIsNotNone(f.retry_info)
        for w in held:
            w.cancel()
        deadline = time.monotonic() + DEADLINE
        while True:  # the node sees them go asynchronously
            w = Watcher(clients[3])
            self.addCleanup(w.cancel)
            ev = w.events.get(timeout=DEADLINE)
            if ev is not None:
                break
            self.assertEqual(RpcFailure(w.error).reason, "NODE_WATCH_LIMIT")
            self.assertLess(time.monotonic(), deadline, "cancelled watches kept their places")
        self.assertEqual(ev.kind, kind(self.pb, "WATCHING"))

    def test_watches_per_principal(self):
        ch = self.server.channel(options=[("grpc.use_local_subchannel_pool", 1)])
        mine = ServiceClient(ch, self.pb.cache, CACHE_SERVICE)
        held = [Watcher(mine) for _ in range(2)]
        for w in held:
            self.addCleanup(w.cancel)
            self.assertEqual(w.next().kind, kind(self.pb, "WATCHING"))
        with self.assertRaises(grpc.RpcError) as cm:
            next(mine.Watch(mine.request("Watch"), timeout=DEADLINE))
        f = self.assertRpcFailure(RpcFailure(cm.exception), grpc.StatusCode.RESOURCE_EXHAUSTED, "PRINCIPAL_WATCH_LIMIT")
        self.assertEqual(f.metadata.get("limitWatches"), "2")
        self.assertTrue(f.quota_failure.violations[0].subject.startswith("principal:conn:"))
        self.assertIsNotNone(f.retry_info)
        other = Watcher(self.cache)  # another connection: another principal
        self.addCleanup(other.cancel)
        self.assertEqual(other.next().kind, kind(self.pb, "WATCHING"))
        held[0].cancel()  # a cancelled watch frees its place (once the node has seen it go)
        deadline = time.monotonic() + DEADLINE
        while True:
            w = Watcher(mine)
            self.addCleanup(w.cancel)
            ev = w.events.get(timeout=DEADLINE)
            if ev is not None:
                break
            self.assertEqual(RpcFailure(w.error).reason, "PRINCIPAL_WATCH_LIMIT")
            self.assertLess(time.monotonic(), deadline, "the cancelled watch kept its place")
        self.assertEqual(ev.kind, kind(self.pb, "WATCHING"))

    def test_no_resume_across_a_pause_in_recording(self):
        k = self.key()
        ch = self.server.channel(options=[("grpc.use_local_subchannel_pool", 1)])
        client = ServiceClient(ch, self.pb.cache, CACHE_SERVICE)
        w = Watcher(client, keys=[k])
        first = w.next()
        w.cancel()
        # With no linger, recording stops once the node saw the last watch
        # go; a change after that is unknown to the feed, so the position
        # before it cannot resume. Poll: the node notices asynchronously.
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            self.set(k, "changed")
            r = Watcher(client, keys=[k], resume_feed=first.feed, resume_after=first.sequence)
            ev = r.next()
            r.cancel()
            if ev.kind == kind(self.pb, "RESYNC_REQUIRED"):
                self.assertEqual(ev.reason, "HISTORY_UNAVAILABLE")
                return
            self.assertEqual(ev.kind, kind(self.pb, "WATCHING"))  # recording was still on
        self.fail("a position from before the pause still resumed")


class WatchNoHistoryTest(DreyTestCase):
    SERVER_FLAGS = ("--ephemeral", "--watch-history-bytes=0")

    def test_only_the_newest_position_resumes(self):
        k = self.key()
        w = Watcher(self.cache, keys=[k])
        self.addCleanup(w.cancel)
        first = w.next()
        self.set(k, 1)
        one = w.next()
        self.set(k, 2)
        two = w.next()
        # Nothing is kept: after the newest event there is nothing to miss,
        # after an older one there is.
        r = Watcher(self.cache, keys=[k], resume_feed=first.feed, resume_after=two.sequence)
        self.addCleanup(r.cancel)
        self.assertEqual((r.next().kind), kind(self.pb, "WATCHING"))
        old = Watcher(self.cache, keys=[k], resume_feed=first.feed, resume_after=one.sequence)
        self.addCleanup(old.cancel)
        ev = old.next()
        self.assertEqual((ev.kind, ev.reason), (kind(self.pb, "RESYNC_REQUIRED"), "HISTORY_UNAVAILABLE"))
        self.set(k, 3)
        self.assertEqual(r.next().sequence, old.next().sequence, "both go on with the live events")


class WatchShutdownTest(DreyTestCase):
    SERVER_FLAGS = None

    def test_stopping_ends_open_watches_with_ok(self):
        # A long shutdown timeout: a stream the node did not end itself would
        # hold the exit back for a minute, past the stop deadline.
        srv = self.start_server("--ephemeral", "--shutdown-timeout=60s")
        client = ServiceClient(srv.channel(), self.pb.cache, CACHE_SERVICE)
        w = Watcher(client)
        self.assertEqual(w.next().kind, kind(self.pb, "WATCHING"))
        srv.signal()
        self.assertIsNone(w.events.get(timeout=DEADLINE), "an event instead of the end")
        self.assertIsNone(w.error, "the stream ended with %r, not OK" % (w.error,))
        srv.wait(timeout=20)
        self.assertEqual(srv.returncode, 0)


class WatchDurableTest(DreyTestCase):
    """Events follow durability: a write the journal refuses (its disk
    quota) is never reported, and consumes no version."""
    SERVER_FLAGS = ("--segment-bytes=1MiB", "--journal-max-bytes=4MiB", "--snapshot-every-bytes=0",
                    "--snapshot-every=0")

    def test_a_write_refused_by_the_journal_sends_nothing(self):
        k = self.key()
        w, _ = self.watch_key(k)
        acked = []
        refused = None
        for _ in range(100):
            try:
                acked.append(self.set(k, b"v" * (200 * 1024)).version)
            except grpc.RpcError as e:
                refused = RpcFailure(e)
                break
        self.assertIsNotNone(refused, "the quota never refused a write")
        self.assertRpcFailure(refused, grpc.StatusCode.RESOURCE_EXHAUSTED, "JOURNAL_DISK_QUOTA")
        admin = ServiceClient(self.channel, self.pb.admin, ADMIN_SERVICE)
        admin.Snapshot(self.pb.admin.SnapshotRequest(), timeout=60)  # frees the journal
        sentinel = self.set(k, "after").version
        got = []
        while not got or got[-1] != sentinel:
            got.append(w.next().version)
        self.assertEqual(got, acked + [sentinel])
        self.assertEqual(sentinel, acked[-1] + 1, "the refused write consumed a version")

    def watch_key(self, k):
        w = Watcher(self.cache, keys=[k])
        self.addCleanup(w.cancel)
        return w, w.next()


if __name__ == "__main__":
    main()
