"""Restarts of the real binary on one data directory: values, versions and
expiries survive (a key written with a 5 s ttl before a restart expires on
time after it), new writes get higher versions than any before, every fsync
policy survives a clean SIGTERM restart, keys written by concurrent clients
come back with exactly the versions they were acknowledged with (journal
order is version order), and a second dreyd on a data directory in use
refuses to start while the first keeps serving."""

import os
import shutil
import tempfile
import threading
import time

from google.protobuf import duration_pb2, timestamp_pb2

from drey_harness import (ADMIN_SERVICE, CACHE_SERVICE, HEALTH_SERVICE, DreyServer, DreyTestCase, ServiceClient,
                          main, make_value, value_of)

WAIT = 30.0


def now_ms():
    return int(time.time() * 1000)


def ts_ms(ts):
    return ts.seconds * 1000 + (ts.nanos + 999999) // 1000000


class RestartTestCase(DreyTestCase):
    SERVER_FLAGS = None

    def setUp(self):
        self.data_dir = os.path.join(self.private_dir(), "data")

    def private_dir(self):
        d = tempfile.mkdtemp(prefix="drey-restart-")
        if not os.environ.get("DREY_TEST_KEEP_TMP"):
            self.addCleanup(shutil.rmtree, d, True)
        return d

    def boot(self, *flags, data_dir=None, name="dreyd"):
        """A server on this test's data directory; (server, cache, admin,
        health) clients. Killed at cleanup if still running."""
        srv = DreyServer("--data-dir=" + (data_dir or self.data_dir), *flags, name=name).start()
        self.addCleanup(srv.kill)
        ch = srv.channel()
        return (srv, ServiceClient(ch, self.pb.cache, CACHE_SERVICE), ServiceClient(ch, self.pb.admin, ADMIN_SERVICE),
                ServiceClient(ch, self.pb.health, HEALTH_SERVICE))


class RestartPreservesTest(RestartTestCase):

    def test_values_versions_and_expiries_survive_and_versions_keep_growing(self):
        pb = self.pb.cache
        srv, cache, _, _ = self.boot()
        written = {}  # key -> SetResponse-like (version, expires_at ms or 0)
        values = {
            "bytes": b"\x00\x01binary\xff", "string": "h\u00e9llo", "int": -42, "double": 2.5, "bool": True,
            "json": {"a": [1, "two", None], "b": {"c": False}}, "null": None,
        }
        for k, v in values.items():
            r = cache.Set(pb.SetRequest(key="kind-" + k, value=make_value(v)), timeout=WAIT)
            written["kind-" + k] = (r.version, 0)
        # a long ttl (expiry checked exactly) and an absolute expires_at
        r = cache.Set(pb.SetRequest(key="ttl-long", value=make_value("L"), ttl=duration_pb2.Duration(seconds=3600)),
                      timeout=WAIT)
        written["ttl-long"] = (r.version, ts_ms(r.expires_at))
        at = timestamp_pb2.Timestamp(seconds=int(time.time()) + 7200, nanos=123000000)
        r = cache.Set(pb.SetRequest(key="abs", value=make_value("A"), expires_at=at), timeout=WAIT)
        self.assertEqual(r.expires_at, at)
        written["abs"] = (r.version, ts_ms(at))
        # the counter, a touched and a persisted key, a removed key
        for _ in range(5):
            r = cache.Increment(pb.IncrementRequest(key="ctr", delta=3), timeout=WAIT)
        written["ctr"] = (r.version, 0)
        cache.Set(pb.SetRequest(key="touched", value=make_value(1), ttl=duration_pb2.Duration(seconds=60)),
                  timeout=WAIT)
        self.assertTrue(cache.Touch(pb.TouchRequest(key="touched", ttl=duration_pb2.Duration(seconds=5000)),
                                    timeout=WAIT).found)
        g = cache.Get(pb.GetRequest(key="touched"), timeout=WAIT)
        written["touched"] = (g.version, ts_ms(g.expires_at))
        cache.Set(pb.SetRequest(key="persisted", value=make_value(2), ttl=duration_pb2.Duration(seconds=60)),
                  timeout=WAIT)
        self.assertTrue(cache.Persist(pb.PersistRequest(key="persisted"), timeout=WAIT).found)
        g = cache.Get(pb.GetRequest(key="persisted"), timeout=WAIT)
        written["persisted"] = (g.version, 0)
        cache.Set(pb.SetRequest(key="removed", value=make_value("gone")), timeout=WAIT)
        self.assertTrue(cache.Remove(pb.RemoveRequest(key="removed"), timeout=WAIT).removed)
        # other caches are kept apart
        r = cache.Set(pb.SetRequest(cache="other.cache", key="ttl-long", value=make_value("O")), timeout=WAIT)
        other_version = r.version
        # last: the 5 s ttl
        before = now_ms()
        r = cache.Set(pb.SetRequest(key="ttl-short", value=make_value("short"), ttl=duration_pb2.Duration(seconds=5)),
                      timeout=WAIT)
        after = now_ms()
        short_exp = ts_ms(r.expires_at)
        self.assertGreaterEqual(short_exp, before + 5000)
        self.assertLessEqual(short_exp, after + 5001)
        written["ttl-short"] = (r.version, short_exp)
        max_before = max([v for v, _ in written.values()] + [other_version])
        srv.stop()

        srv, cache, _, _ = self.boot()
        self.assertLess(now_ms(), short_exp - 200,
                        "the restart took too long to check the 5 s entry before its expiry")
        for key, (version, exp) in written.items():
            r = cache.Get(pb.GetRequest(key=key), timeout=WAIT)
            self.assertTrue(r.found, key)
            self.assertEqual(r.version, version, "version of %s changed across the restart" % key)
            if exp:
                self.assertEqual(ts_ms(r.expires_at), exp, "expiry of %s changed across the restart" % key)
            else:
                self.assertFalse(r.HasField("expires_at"), key)
            if key.startswith("kind-"):
                self.assertEqual(value_of(r.value), values[key[5:]], key)
                self.assertEqual(r.value.WhichOneof("kind"), make_value(values[key[5:]]).WhichOneof("kind"), key)
        self.assertEqual(value_of(cache.Get(pb.GetRequest(key="ctr"), timeout=WAIT).value), 15)
        self.assertEqual(value_of(cache.Get(pb.GetRequest(key="ttl-long"), timeout=WAIT).value), "L")
        self.assertEqual(value_of(cache.Get(pb.GetRequest(cache="other.cache", key="ttl-long"),
                                            timeout=WAIT).value), "O")
        self.assertFalse(cache.Get(pb.GetRequest(key="removed"), timeout=WAIT).found, "a removed key came back")
        self.assertEqual(value_of(cache.Get(pb.GetRequest(key="ttl-short"), timeout=WAIT).value), "short")
        # new writes get versions above every version handed out before the restart
        r1 = cache.Set(pb.SetRequest(key="new", value=make_value(1)), timeout=WAIT)
        self.assertGreater(r1.version, max_before)
        r2 = cache.Increment(pb.IncrementRequest(key="ctr", delta=1), timeout=WAIT)
        self.assertGreater(r2.version, r1.version)
        self.assertEqual(r2.value, 16)
        # the 5 s entry expires on time: visible before its expiry, invisible from it
        deadline = time.monotonic() + WAIT
        while True:
            t_before = now_ms()
            r = cache.Get(pb.GetRequest(key="ttl-short"), timeout=WAIT)
            t_after = now_ms()
            if r.found:
                self.assertLess(t_before, short_exp, "visible %d ms after its expiry" % (t_before - short_exp))
            else:
                self.assertGreaterEqual(t_after, short_exp, "gone %d ms before its expiry" % (short_exp - t_after))
                break
            self.assertLess(time.monotonic(), deadline, "the 5 s entry never expired")
            time.sleep(0.01)
        self.assertLess(now_ms(), short_exp + 1000, "the 5 s entry expired late")
        srv.stop()

        # and it stays expired across one more restart; versions still grow
        srv, cache, _, _ = self.boot()
        self.assertFalse(cache.Get(pb.GetRequest(key="ttl-short"), timeout=WAIT).found, "an expired entry came back")
        self.assertEqual(cache.Get(pb.GetRequest(key="new"), timeout=WAIT).version, r1.version)
        r3 = cache.Set(pb.SetRequest(key="new", value=make_value(2)), timeout=WAIT)
        self.assertGreater(r3.version, r2.version)
        srv.stop()


class FsyncPolicyTest(RestartTestCase):

    def check_policy(self, fsync, policy_name):
        pb = self.pb.cache
        srv, cache, admin, _ = self.boot("--fsync=" + fsync)
        self.assertEqual(srv.find_log(lambda r: r.get("msg") == "listening").get("fsync"), fsync)
        d = admin.GetReadinessDetails(self.pb.admin.GetReadinessDetailsRequest(), timeout=WAIT)
        self.assertEqual(d.journal.fsync_policy, policy_name)
        versions = {}
        for i in range(200):
            r = cache.Set(pb.SetRequest(key="k%03d" % i, value=make_value("v%d" % i)), timeout=WAIT)
            versions["k%03d" % i] = r.version
        for i in range(20):
            cache.Increment(pb.IncrementRequest(key="ctr", delta=1, request_id="inc-%d" % i), timeout=WAIT)
        d = admin.GetReadinessDetails(self.pb.admin.GetReadinessDetailsRequest(), timeout=WAIT)
        self.assertEqual(d.journal.last_lsn, 220)
        self.assertFalse(d.journal.failed)
        srv.stop()

        srv, cache, admin, _ = self.boot("--fsync=" + fsync)
        got = cache.GetMany(pb.GetManyRequest(keys=sorted(versions)), timeout=WAIT).results
        for r in got:
            self.assertTrue(r.found, r.key)
            self.assertEqual(value_of(r.value), "v%d" % int(r.key[1:]))
            self.assertEqual(r.version, versions[r.key])
        self.assertEqual(value_of(cache.Get(pb.GetRequest(key="ctr"), timeout=WAIT).value), 20)
        # the request ids are remembered across the restart
        r = cache.Increment(pb.IncrementRequest(key="ctr", delta=1, request_id="inc-7"), timeout=WAIT)
        self.assertEqual(r.value, 8)
        self.assertEqual(value_of(cache.Get(pb.GetRequest(key="ctr"), timeout=WAIT).value), 20)
        d = admin.GetReadinessDetails(self.pb.admin.GetReadinessDetailsRequest(), timeout=WAIT)
        self.assertEqual(d.recovery.state, "done")
        self.assertEqual(d.recovery.replayed_records, 220)
        self.assertEqual(d.journal.fsync_policy, policy_name)
        srv.stop()

    def test_fsync_interval(self):
        self.check_policy("interval:50ms", "interval")

    def test_fsync_never(self):
        self.check_policy("never", "never")

    def test_fsync_always(self):
        self.check_policy("always", "always")


class ConcurrentWritersTest(RestartTestCase):
    WRITERS = 6
    ROUNDS = 40
    HOT = ["hot%d" % i for i in range(3)]

    def write_phase(self, cache, acked, phase):
        """WRITERS threads racing on a few keys with Set, SetMany, Increment
        and Add; acked[key] collects (version, value) of every acknowledged
        write."""
        pb = self.pb.cache
        lock = threading.Lock()
        errors = []

        def note(key, version, value):
            with lock:
                acked.setdefault(key, []).append((version, value))

        def writer(w):
            try:
                for n in range(self.ROUNDS):
                    tag = "p%d-w%d-%d" % (phase, w, n)
                    hot = self.HOT[(w + n) % len(self.HOT)]
                    op = n % 4
                    if op == 0:
                        r = cache.Set(pb.SetRequest(key=hot, value=make_value(tag)), timeout=WAIT)
                        note(hot, r.version, tag)
                    elif op == 1:
                        other = self.HOT[(w + n + 1) % len(self.HOT)]
                        r = cache.SetMany(pb.SetManyRequest(entries=[
                            pb.SetManyRequest.Entry(key=hot, value=make_value(tag + "a")),
                            pb.SetManyRequest.Entry(key=other, value=make_value(tag + "b"))]), timeout=WAIT)
                        note(hot, r.results[0].version, tag + "a")
                        note(other, r.results[1].version, tag + "b")
                    elif op == 2:
                        r = cache.Increment(pb.IncrementRequest(key="ctr", delta=1), timeout=WAIT)
                        note("ctr", r.version, r.value)
                    else:
                        key = "add-" + tag
                        r = cache.Add(pb.AddRequest(key=key, value=make_value(tag)), timeout=WAIT)
                        self.assertTrue(r.added)
                        note(key, r.version, tag)
            except Exception as e:  # surfaced by the main thread
                errors.append(e)

        threads = [threading.Thread(target=writer, args=(w,)) for w in range(self.WRITERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=WAIT * 4)
            self.assertFalse(t.is_alive(), "a writer did not finish")
        if errors:
            raise errors[0]

    def check(self, cache, acked, what):
        pb = self.pb.cache
        for key, writes in acked.items():
            version, value = max(writes)
            r = cache.Get(pb.GetRequest(key=key), timeout=WAIT)
            self.assertTrue(r.found, "%s: %s" % (what, key))
            self.assertEqual((r.version, value_of(r.value)), (version, value),
                             "%s: %s is not its last acknowledged write" % (what, key))

    def test_every_key_has_the_version_it_was_acknowledged_with_after_a_kill(self):
        srv, cache, admin, _ = self.boot("--fsync=always")
        acked = {}
        self.write_phase(cache, acked, 0)
        # recovery then loads a snapshot and replays the tail after it
        admin.Snapshot(self.pb.admin.SnapshotRequest(), timeout=WAIT)
        self.write_phase(cache, acked, 1)
        versions = [v for writes in acked.values() for v, _ in writes]
        self.assertEqual(len(versions), len(set(versions)), "a version was handed out twice")
        self.check(cache, acked, "live")
        srv.kill()

        srv, cache, admin, _ = self.boot("--fsync=always", name="dreyd after the kill")
        self.check(cache, acked, "after the kill")
        self.assertEqual(value_of(cache.Get(self.pb.cache.GetRequest(key="ctr"), timeout=WAIT).value),
                         len(acked["ctr"]))
        r = cache.Set(self.pb.cache.SetRequest(key=self.HOT[0], value=make_value("later")), timeout=WAIT)
        self.assertGreater(r.version, max(versions))
        srv.stop()


class DataDirLockTest(RestartTestCase):

    def test_second_dreyd_on_the_same_data_dir_refuses_and_the_first_keeps_serving(self):
        pb = self.pb.cache
        first, cache, _, health = self.boot()
        v1 = cache.Set(pb.SetRequest(key="mine", value=make_value("first")), timeout=WAIT).version
        second = DreyServer("--data-dir=" + self.data_dir, name="second dreyd").spawn()
        self.addCleanup(second.kill)
        rc = second.wait(timeout=WAIT)
        self.assertNotEqual(rc, 0, "a second dreyd started on a data directory in use")
        second.check_log_format()
        errs = [r for r in second.log_records(strict=True) if r["level"] == "error"]
        self.assertEqual(len(errs), 1, second.log_text())
        self.assertEqual(errs[0]["msg"], "recovery failed: the node will not start")
        self.assertIn(os.path.join(self.data_dir, "LOCK"), errs[0].get("error", ""))
        self.assertIn("in use by another dreyd", errs[0].get("error", ""))
        self.assertIsNone(second.find_log(lambda r: r.get("msg") == "serving"))
        # the refused one touched nothing: the first still serves, reads and writes
        self.assertIsNone(first.proc.poll())
        self.assertEqual(health.Check(self.pb.health.HealthCheckRequest(), timeout=WAIT).status,
                         self.pb.health.HealthCheckResponse.SERVING)
        r = cache.Get(pb.GetRequest(key="mine"), timeout=WAIT)
        self.assertEqual((value_of(r.value), r.version), ("first", v1))
        v2 = cache.Set(pb.SetRequest(key="mine", value=make_value("again")), timeout=WAIT).version
        self.assertGreater(v2, v1)
        first.stop()
        # once the first is gone the directory is free, and nothing was lost
        again, cache, _, _ = self.boot(name="dreyd after the first")
        r = cache.Get(pb.GetRequest(key="mine"), timeout=WAIT)
        self.assertEqual((value_of(r.value), r.version), ("again", v2))
        again.stop()


if __name__ == "__main__":
    main()
