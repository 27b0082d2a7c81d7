"""Remembered outcomes of writes with a request_id across restarts of the
real binary: recovered from the journal and, after Admin/Snapshot has
compacted the journal away, from the snapshot alone. The outcome of the
first attempt is returned whatever happened since (Add's added=false, a
VERSION_MISMATCH, Remove's previous value, Increment's value, a batch, a
Touch), nothing is applied again, the same id with another request is
IDEMPOTENCY_KEY_REUSED, and --idempotency-retention holds across a restart
(an outcome is forgotten once it has passed)."""

import os
import shutil
import tempfile
import time

import grpc
from google.protobuf import duration_pb2

from drey_harness import (ADMIN_SERVICE, CACHE_SERVICE, DreyServer, DreyTestCase, RpcFailure, ServiceClient,
                          main, make_value, value_of)

WAIT = 30.0
FP = grpc.StatusCode.FAILED_PRECONDITION


class IdempotencyTestCase(DreyTestCase):
    SERVER_FLAGS = None

    def setUp(self):
        d = tempfile.mkdtemp(prefix="drey-idem-")
        if not os.environ.get("DREY_TEST_KEEP_TMP"):
            self.addCleanup(shutil.rmtree, d, True)
        self.data_dir = os.path.join(d, "data")

    def boot(self, *flags):
        srv = DreyServer("--data-dir=" + self.data_dir, "--segment-bytes=64KiB", "--snapshot-every-bytes=0",
                         *flags).start()
        self.addCleanup(srv.kill)
        ch = srv.channel()
        return srv, ServiceClient(ch, self.pb.cache, CACHE_SERVICE), ServiceClient(ch, self.pb.admin, ADMIN_SERVICE)


class RememberedOutcomesTest(IdempotencyTestCase):

    def first_attempts(self, cache):
        """The first attempts; returns [(method, request, outcome)] where the
        outcome is a response or an RpcFailure."""
        pb = self.pb.cache
        hour = duration_pb2.Duration(seconds=3600)
        cache.Add(pb.AddRequest(key="k1", value=make_value("orig")), timeout=WAIT)
        cache.Set(pb.SetRequest(key="k2", value=make_value("a")), timeout=WAIT)
        cache.Set(pb.SetRequest(key="k3", value=make_value("c")), timeout=WAIT)
        reqs = [
            ("Add", pb.AddRequest(key="k1", value=make_value("other"), request_id="add-x")),
            ("Set", pb.SetRequest(key="k2", value=make_value("b"), if_version=0, request_id="cas-x")),
            ("Remove", pb.RemoveRequest(key="k3", return_previous=True, request_id="rm-x")),
            ("Increment", pb.IncrementRequest(key="k4", delta=5, request_id="inc-x")),
            ("SetMany", pb.SetManyRequest(entries=[pb.SetManyRequest.Entry(key="e1", value=make_value(1)),
                                                   pb.SetManyRequest.Entry(key="e2", value=make_value(2))],
                                          request_id="many-x")),
            ("Touch", pb.TouchRequest(key="k1", ttl=hour, request_id="touch-x")),
            ("GetOrAdd", pb.GetOrAddRequest(key="k5", value=make_value("first"), request_id="goa-x")),
        ]
        out = []
        for method, req in reqs:
            try:
                outcome = getattr(cache, method)(req, timeout=WAIT)
            except grpc.RpcError as e:
                outcome = RpcFailure(e)
            out.append((method, req, outcome))
        add, cas, rm, inc, many, touch, goa = [o for _, _, o in out]
        self.assertFalse(add.added)
        self.assertEqual(value_of(add.current_value), "orig")
        self.assertIsInstance(cas, RpcFailure)
        self.assertRpcFailure(cas, FP, "VERSION_MISMATCH")
        self.assertTrue(rm.removed)
        self.assertEqual(value_of(rm.previous), "c")
        self.assertEqual(inc.value, 5)
        self.assertEqual(len(many.results), 2)
        self.assertTrue(touch.found)
        self.assertTrue(goa.added)
        # then the state moves on, so that applying any of them again would show
        cache.Remove(pb.RemoveRequest(key="k1"), timeout=WAIT)               # Add would add, Touch not find
        cache.Remove(pb.RemoveRequest(key="k2"), timeout=WAIT)               # if_version=0 would succeed
        cache.Set(pb.SetRequest(key="k3", value=make_value("d")), timeout=WAIT)  # Remove would remove
        cache.Increment(pb.IncrementRequest(key="k4", delta=100), timeout=WAIT)
        cache.Set(pb.SetRequest(key="e1", value=make_value(10)), timeout=WAIT)
        cache.Remove(pb.RemoveRequest(key="k5"), timeout=WAIT)               # GetOrAdd would add again
        return out

    def state(self, cache):
        keys = ["k1", "k2", "k3", "k4", "k5", "e1", "e2"]
        res = cache.GetMany(self.pb.cache.GetManyRequest(keys=keys), timeout=WAIT).results
        return {r.key: (value_of(r.value), r.version) if r.found else None for r in res}

    def check_retries(self, cache, attempts, state, where):
        for method, req, first in attempts:
            try:
                again = getattr(cache, method)(req, timeout=WAIT)
            except grpc.RpcError as e:
                again = RpcFailure(e)
            if isinstance(first, RpcFailure):
                self.assertIsInstance(again, RpcFailure, "%s %s %s" % (where, method, req.request_id))
                self.assertEqual((again.code, again.reason), (first.code, first.reason),
                                 "%s: %s %s" % (where, method, req.request_id))
            else:
                self.assertNotIsInstance(again, RpcFailure, "%s: %s %s: %r" % (where, method, req.request_id, again))
                self.assertEqual(again, first, "%s: %s %s does not return its first outcome"
                                 % (where, method, req.request_id))
        self.assertEqual(self.state(cache), state, "%s: a retry was applied again" % where)
        with self.assertRpcError(FP, "IDEMPOTENCY_KEY_REUSED"):
            cache.Increment(self.pb.cache.IncrementRequest(key="k4", delta=6, request_id="inc-x"), timeout=WAIT)

    def test_outcomes_survive_restarts_from_the_journal_and_from_a_snapshot(self):
        srv, cache, admin = self.boot()
        attempts = self.first_attempts(cache)
        state = self.state(cache)
        self.assertIsNone(state["k1"])
        self.assertIsNone(state["k2"])
        self.assertEqual(state["k4"][0], 105)
        self.check_retries(cache, attempts, state, "live")
        srv.stop()

        srv, cache, admin = self.boot()
        self.assertGreater(srv.find_log(lambda r: r.get("msg") == "recovery: done")["replayed_records"], 0)
        self.assertEqual(self.state(cache), state)
        self.check_retries(cache, attempts, state, "after a restart (journal)")
        snap = admin.Snapshot(self.pb.admin.SnapshotRequest(), timeout=WAIT)
        self.assertGreater(snap.entries, len([v for v in state.values() if v]), "outcomes are not in the snapshot")
        srv.stop()

        srv, cache, admin = self.boot()
        done = srv.find_log(lambda r: r.get("msg") == "recovery: done")
        self.assertEqual((done["snapshot_lsn"], done["replayed_records"]), (snap.lsn, 0),
                         "expected a recovery from the snapshot alone")
        self.assertEqual(self.state(cache), state)
        self.check_retries(cache, attempts, state, "after a restart (snapshot)")
        srv.stop()


class RetentionTest(IdempotencyTestCase):
    RETENTION_S = 3

    def test_retention_holds_across_a_restart(self):
        pb = self.pb.cache
        flags = ("--idempotency-retention=%ds" % self.RETENTION_S,)
        srv, cache, _ = self.boot(*flags)
        t0 = time.time()
        req = pb.IncrementRequest(key="ctr", delta=1, request_id="once")
        first = cache.Increment(req, timeout=WAIT)
        self.assertEqual(first.value, 1)
        srv.stop()
        srv, cache, _ = self.boot(*flags)
        again = cache.Increment(req, timeout=WAIT)
        if time.time() >= t0 + self.RETENTION_S - 0.5:
            self.skipTest("the restart took longer than the retention window")
        self.assertEqual(again, first, "the outcome was forgotten before --idempotency-retention")
        self.assertEqual(value_of(cache.Get(pb.GetRequest(key="ctr"), timeout=WAIT).value), 1)
        # once the retention has passed, the id is forgotten: a retry is a new write
        deadline = time.monotonic() + WAIT
        while time.time() < t0 + self.RETENTION_S + 0.2:
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.02)
        later = cache.Increment(req, timeout=WAIT)
        self.assertEqual(later.value, first.value + 1, "an outcome was remembered past --idempotency-retention")
        self.assertGreater(later.version, first.version)
        srv.stop()


if __name__ == "__main__":
    main()
