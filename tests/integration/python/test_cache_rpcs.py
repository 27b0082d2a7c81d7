"""Every drey.cache.v1.Cache RPC against the real server: results, versions,
expirations as returned (not their passing: see test_expiry.py), compare-and-
set, value kinds and cache isolation."""

import math
import time

import grpc
from google.protobuf import duration_pb2, struct_pb2, timestamp_pb2

from drey_harness import DreyTestCase, main, make_value, same_value, value_of

FP = grpc.StatusCode.FAILED_PRECONDITION
HOUR = duration_pb2.Duration(seconds=3600)
INT64_MAX = 2**63 - 1
INT64_MIN = -2**63


def ts_ms(ts):
    return ts.seconds * 1000 + ts.nanos // 1000000


def ts_at(seconds_from_now):
    t = timestamp_pb2.Timestamp()
    t.FromNanoseconds(int((time.time() + seconds_from_now) * 1e9))
    return t


class CacheRpcTest(DreyTestCase):
    def assert_gap(self, now, before, reserved, what):
        """A write that fails as it applies (a version mismatch, nothing to
        do) took no version for its keys, but on a durable node the versions
        it reserved when it was journaled are skipped: the counter moved by
        the probe's one, plus nothing (ephemeral) or exactly what the write
        named (durable). Versions only grow and are never reused."""
        self.assertIn(now - before - 1, (0, reserved), "%s took versions it did not reserve" % what)
    def assertExpiresAround(self, ts, before, after, ttl_s):
        """An expires_at set from a ttl between wall times before/after."""
        ms = ts_ms(ts)
        self.assertGreaterEqual(ms, int(before * 1000) + int(ttl_s * 1000) - 1)
        self.assertLessEqual(ms, int(after * 1000) + int(ttl_s * 1000) + 1)

    # --- Get / GetMany ---

    def test_get_absent(self):
        r = self.get(self.key())
        self.assertFalse(r.found)
        self.assertFalse(r.HasField("value"))
        self.assertEqual(r.version, 0)
        self.assertFalse(r.HasField("expires_at"))

    def test_get_returns_value_version_and_expiry(self):
        k = self.key()
        s = self.set(k, "hello")
        self.assertGreater(s.version, 0)
        self.assertFalse(s.HasField("expires_at"), "no expiration given: the new entry never expires")
        r = self.get(k)
        self.assertTrue(r.found)
        self.assertEqual(value_of(r.value), "hello")
        self.assertEqual(r.version, s.version)
        self.assertFalse(r.HasField("expires_at"))

        k2 = self.key("ttl")
        before = time.time()
        s2 = self.set(k2, 7, ttl=HOUR)
        after = time.time()
        self.assertExpiresAround(s2.expires_at, before, after, 3600)
        r2 = self.get(k2)
        self.assertTrue(r2.found)
        self.assertEqual(r2.expires_at, s2.expires_at)
        self.assertEqual(r2.version, s2.version)

    def test_get_many_one_result_per_key_in_order(self):
        a, b, c = self.key("a"), self.key("b"), self.key("c")
        va = self.set(a, "A").version
        vc = self.set(c, b"C", ttl=HOUR)
        keys = [c, b, a, b]  # absent and repeated keys included
        r = self.call("GetMany", keys=keys)
        self.assertEqual([x.key for x in r.results], keys)
        self.assertEqual([x.found for x in r.results], [True, False, True, False])
        self.assertEqual(value_of(r.results[0].value), b"C")
        self.assertEqual(r.results[0].version, vc.version)
        self.assertEqual(r.results[0].expires_at, vc.expires_at)
        self.assertEqual(value_of(r.results[2].value), "A")
        self.assertEqual(r.results[2].version, va)
        self.assertFalse(r.results[2].HasField("expires_at"))
        self.assertFalse(r.results[1].HasField("value"))
        self.assertEqual(r.results[1].version, 0)

    def test_get_many_empty(self):
        self.assertEqual(len(self.call("GetMany", keys=[]).results), 0)

    # --- Set ---

    def test_set_upserts_with_new_versions(self):
        k = self.key()
        v1 = self.set(k, "one").version
        v2 = self.set(k, "two").version
        self.assertGreater(v2, v1)
        r = self.get(k)
        self.assertEqual(value_of(r.value), "two")
        self.assertEqual(r.version, v2)

    def test_set_expiration_kinds(self):
        k = self.key()
        # ttl
        before = time.time()
        s = self.set(k, 1, ttl=HOUR)
        self.assertExpiresAround(s.expires_at, before, time.time(), 3600)
        # none given: an existing entry keeps its expiry
        s2 = self.set(k, 2)
        self.assertEqual(s2.expires_at, s.expires_at)
        self.assertEqual(self.get(k).expires_at, s.expires_at)
        # expires_at: taken as given (to the millisecond, rounded up)
        at = ts_at(7200)
        s3 = self.set(k, 3, expires_at=at)
        self.assertGreaterEqual(ts_ms(s3.expires_at), ts_ms(at))
        self.assertLessEqual(ts_ms(s3.expires_at), ts_ms(at) + 1)
        self.assertEqual(self.get(k).expires_at, s3.expires_at)
        # persist: the entry never expires
        s4 = self.set(k, 4, persist=True)
        self.assertFalse(s4.HasField("expires_at"))
        r = self.get(k)
        self.assertFalse(r.HasField("expires_at"))
        e = self.call("GetExpiration", key=k)
        self.assertTrue(e.found)
        self.assertFalse(e.has_expiration)
        # none given on an entry without expiry: still none
        self.assertFalse(self.set(k, 5).HasField("expires_at"))

    def test_set_expires_at_with_nanos_rounds_up(self):
        k = self.key()
        at = timestamp_pb2.Timestamp(seconds=int(time.time()) + 3600, nanos=123456789)
        s = self.set(k, 1, expires_at=at)
        self.assertEqual(s.expires_at.seconds, at.seconds)
        self.assertEqual(s.expires_at.nanos, 124000000)

    def test_set_if_version_zero_means_only_if_absent(self):
        k = self.key()
        v = self.set(k, "first", if_version=0).version
        before = self.last_version()
        with self.assertRpcError(FP, "VERSION_MISMATCH", metadata={"currentVersion": str(v)}) as e:
            self.set(k, "second", if_version=0)
        self.assertIsNone(e.failure.bad_request)
        self.assertEqual(value_of(self.get(k).value), "first")
        self.assert_gap(self.last_version(), before, 1, "a failed CAS")

    def test_set_if_version_compare_and_set(self):
        k = self.key()
        v1 = self.set(k, "a").version
        v2 = self.set(k, "b", if_version=v1).version
        self.assertGreater(v2, v1)
        with self.assertRpcError(FP, "VERSION_MISMATCH", metadata={"currentVersion": str(v2)}):
            self.set(k, "stale", if_version=v1)
        with self.assertRpcError(FP, "VERSION_MISMATCH", metadata={"currentVersion": str(v2)}):
            self.set(k, "future", if_version=v2 + 1000)
        r = self.get(k)
        self.assertEqual((value_of(r.value), r.version), ("b", v2))
        # on an absent key any non-zero if_version fails with currentVersion 0
        with self.assertRpcError(FP, "VERSION_MISMATCH", metadata={"currentVersion": "0"}):
            self.set(self.key("absent"), "x", if_version=v2)
        self.assertFalse(self.get(self.key("absent")).found)

    def test_set_if_version_on_expired_entry_counts_as_absent(self):
        k = self.key()
        self.set(k, "gone", expires_at=ts_at(-10))
        self.set(k, "new", if_version=0)
        self.assertEqual(self.get_value(k), "new")

    # --- SetMany ---

    def test_set_many_results_in_order(self):
        ks = [self.key(str(i)) for i in range(5)]
        self.set(ks[4], "old", ttl=HOUR)
        keep = self.get(ks[4]).expires_at
        entries = [
            self.pb.cache.SetManyRequest.Entry(key=ks[0], value=make_value("zero")),
            self.pb.cache.SetManyRequest.Entry(key=ks[1], value=make_value(1), ttl=HOUR),
            self.pb.cache.SetManyRequest.Entry(key=ks[2], value=make_value(2.5), expires_at=ts_at(3600)),
            self.pb.cache.SetManyRequest.Entry(key=ks[3], value=make_value(True), persist=True, if_version=0),
            self.pb.cache.SetManyRequest.Entry(key=ks[4], value=make_value(None)),
        ]
        r = self.call("SetMany", entries=entries)
        self.assertEqual(len(r.results), 5)
        versions = [x.version for x in r.results]
        self.assertEqual(versions, sorted(versions))
        self.assertEqual(len(set(versions)), 5)
        self.assertFalse(r.results[0].HasField("expires_at"))
        self.assertTrue(r.results[1].HasField("expires_at"))
        self.assertTrue(r.results[2].HasField("expires_at"))
        self.assertFalse(r.results[3].HasField("expires_at"))
        self.assertEqual(r.results[4].expires_at, keep, "no expiration given: the entry keeps its expiry")
        g = self.call("GetMany", keys=ks)
        self.assertEqual([value_of(x.value) for x in g.results], ["zero", 1, 2.5, True, None])
        self.assertEqual([x.version for x in g.results], versions)

    def test_set_many_is_atomic(self):
        a, b, c = self.key("a"), self.key("b"), self.key("c")
        vb = self.set(b, "b0").version
        before = self.last_version()
        E = self.pb.cache.SetManyRequest.Entry
        with self.assertRpcError(FP, "VERSION_MISMATCH",
                                 metadata={"entryIndex": "1", "currentVersion": str(vb)}):
            self.call("SetMany", entries=[E(key=a, value=make_value("a1")),
                                          E(key=b, value=make_value("b1"), if_version=vb + 1),
                                          E(key=c, value=make_value("c1"))])
        self.assertFalse(self.get(a).found, "a failed SetMany applied an entry")
        self.assertFalse(self.get(c).found, "a failed SetMany applied an entry")
        self.assertEqual((self.get_value(b), self.get(b).version), ("b0", vb))
        self.assert_gap(self.last_version(), before, 3, "a failed SetMany")
        # if_version 0 on the live key fails the batch too
        with self.assertRpcError(FP, "VERSION_MISMATCH", metadata={"entryIndex": "0"}):
            self.call("SetMany", entries=[E(key=b, value=make_value("x"), if_version=0),
                                          E(key=a, value=make_value("y"))])
        self.assertFalse(self.get(a).found)
        # and with the right versions it applies whole
        r = self.call("SetMany", entries=[E(key=a, value=make_value("a2"), if_version=0),
                                          E(key=b, value=make_value("b2"), if_version=vb)])
        self.assertEqual(len(r.results), 2)
        self.assertEqual((self.get_value(a), self.get_value(b)), ("a2", "b2"))

    # --- Add ---

    def test_add(self):
        k = self.key()
        before = time.time()
        a = self.call("Add", key=k, value=make_value("first"), ttl=HOUR)
        self.assertTrue(a.added)
        self.assertGreater(a.version, 0)
        self.assertFalse(a.HasField("current_value"))
        self.assertExpiresAround(a.expires_at, before, time.time(), 3600)
        last = self.last_version()
        b = self.call("Add", key=k, value=make_value("second"))
        self.assertFalse(b.added)
        self.assertEqual(b.version, a.version)
        self.assertEqual(value_of(b.current_value), "first")
        self.assertEqual(b.expires_at, a.expires_at)
        self.assertEqual(self.get_value(k), "first")
        self.assert_gap(self.last_version(), last, 1, "an Add that did not add")

    def test_add_without_expiration_never_expires(self):
        a = self.call("Add", key=self.key(), value=make_value(1))
        self.assertTrue(a.added)
        self.assertFalse(a.HasField("expires_at"))

    def test_add_over_expired_entry(self):
        k = self.key()
        self.set(k, "expired", expires_at=ts_at(-5))
        a = self.call("Add", key=k, value=make_value("fresh"))
        self.assertTrue(a.added, "an expired entry must count as absent")
        self.assertFalse(a.HasField("expires_at"))
        self.assertEqual(self.get_value(k), "fresh")

    # --- Update ---

    def test_update(self):
        k = self.key()
        last = self.last_version()
        u = self.call("Update", key=k, value=make_value("x"))
        self.assertFalse(u.updated)
        self.assertEqual(u.version, 0)
        self.assertFalse(self.get(k).found, "Update created an absent key")
        self.assert_gap(self.last_version(), last, 1, "an Update that did nothing")

        s = self.set(k, "v1", ttl=HOUR)
        u = self.call("Update", key=k, value=make_value("v2"))
        self.assertTrue(u.updated)
        self.assertGreater(u.version, s.version)
        self.assertEqual(u.expires_at, s.expires_at, "Update keeps the expiry")
        r = self.get(k)
        self.assertEqual((value_of(r.value), r.version, r.expires_at), ("v2", u.version, s.expires_at))

    def test_update_if_version(self):
        k = self.key()
        v = self.set(k, "a").version
        with self.assertRpcError(FP, "VERSION_MISMATCH", metadata={"currentVersion": str(v)}):
            self.call("Update", key=k, value=make_value("b"), if_version=v + 1)
        with self.assertRpcError(FP, "VERSION_MISMATCH", metadata={"currentVersion": str(v)}):
            self.call("Update", key=k, value=make_value("b"), if_version=0)
        self.assertEqual(self.get_value(k), "a")
        u = self.call("Update", key=k, value=make_value("b"), if_version=v)
        self.assertTrue(u.updated)
        self.assertEqual(self.get_value(k), "b")
        # absent key with a non-zero if_version: mismatch against version 0
        with self.assertRpcError(FP, "VERSION_MISMATCH", metadata={"currentVersion": "0"}):
            self.call("Update", key=self.key("absent"), value=make_value("b"), if_version=v)

    def test_update_skips_expired_entry(self):
        k = self.key()
        self.set(k, "old", expires_at=ts_at(-5))
        self.assertFalse(self.call("Update", key=k, value=make_value("new")).updated)
        self.assertFalse(self.get(k).found)

    # --- GetOrAdd ---

    def test_get_or_add(self):
        k = self.key()
        g = self.call("GetOrAdd", key=k, value=make_value("mine"), ttl=HOUR)
        self.assertTrue(g.added)
        self.assertEqual(value_of(g.value), "mine")
        self.assertGreater(g.version, 0)
        self.assertTrue(g.HasField("expires_at"))
        g2 = self.call("GetOrAdd", key=k, value=make_value("theirs"))
        self.assertFalse(g2.added)
        self.assertEqual(value_of(g2.value), "mine")
        self.assertEqual(g2.version, g.version)
        self.assertEqual(g2.expires_at, g.expires_at)

    def test_get_or_add_over_expired_entry(self):
        k = self.key()
        self.set(k, "expired", expires_at=ts_at(-5))
        g = self.call("GetOrAdd", key=k, value=make_value("fresh"))
        self.assertTrue(g.added)
        self.assertEqual(value_of(g.value), "fresh")
        self.assertFalse(g.HasField("expires_at"))

    # --- Remove ---

    def test_remove(self):
        k = self.key()
        r = self.call("Remove", key=k)
        self.assertFalse(r.removed)
        self.assertFalse(r.HasField("previous"))
        v = self.set(k, {"a": 1.0}).version
        r = self.call("Remove", key=k, return_previous=True)
        self.assertTrue(r.removed)
        self.assertEqual(r.version, v)
        self.assertEqual(value_of(r.previous), {"a": 1.0})
        self.assertFalse(self.get(k).found)
        self.assertFalse(self.call("Remove", key=k).removed)

    def test_remove_without_return_previous(self):
        k = self.key()
        self.set(k, "x")
        r = self.call("Remove", key=k)
        self.assertTrue(r.removed)
        self.assertFalse(r.HasField("previous"))

    def test_remove_if_version(self):
        k = self.key()
        v = self.set(k, "x").version
        with self.assertRpcError(FP, "VERSION_MISMATCH", metadata={"currentVersion": str(v)}):
            self.call("Remove", key=k, if_version=v + 1)
        self.assertTrue(self.get(k).found)
        r = self.call("Remove", key=k, if_version=v, return_previous=True)
        self.assertTrue(r.removed)
        self.assertEqual(value_of(r.previous), "x")
        self.assertFalse(self.get(k).found)

    def test_remove_expired_entry(self):
        k = self.key()
        self.set(k, "x", expires_at=ts_at(-5))
        self.assertFalse(self.call("Remove", key=k).removed)

    # --- Touch / Persist / GetExpiration ---

    def test_touch(self):
        k = self.key()
        self.assertFalse(self.call("Touch", key=k, ttl=HOUR).found)
        self.assertFalse(self.get(k).found, "Touch created a key")
        v = self.set(k, "x").version
        last = self.last_version()
        before = time.time()
        t = self.call("Touch", key=k, ttl=duration_pb2.Duration(seconds=120))
        after = time.time()
        self.assertTrue(t.found)
        self.assertEqual(t.version, v, "Touch keeps the version")
        self.assertExpiresAround(t.expires_at, before, after, 120)
        r = self.get(k)
        self.assertEqual((r.version, r.expires_at), (v, t.expires_at))
        self.assertEqual(self.last_version(), last + 1, "Touch consumed a version")

    def test_touch_expired_entry_is_not_found(self):
        k = self.key()
        self.set(k, "x", expires_at=ts_at(-5))
        self.assertFalse(self.call("Touch", key=k, ttl=HOUR).found)
        self.assertFalse(self.get(k).found, "Touch revived an expired entry")

    def test_persist(self):
        k = self.key()
        self.assertFalse(self.call("Persist", key=k).found)
        v = self.set(k, "x").version
        self.assertFalse(self.call("Persist", key=k).found, "found is true only if the key had an expiry")
        self.set(k, "y", ttl=HOUR)
        v = self.get(k).version
        last = self.last_version()
        p = self.call("Persist", key=k)
        self.assertTrue(p.found)
        self.assertEqual(p.version, v, "Persist keeps the version")
        r = self.get(k)
        self.assertEqual(r.version, v)
        self.assertFalse(r.HasField("expires_at"))
        self.assertFalse(self.call("GetExpiration", key=k).has_expiration)
        self.assertFalse(self.call("Persist", key=k).found)
        self.assertEqual(self.last_version(), last + 1, "Persist consumed a version")

    def test_get_expiration(self):
        k = self.key()
        e = self.call("GetExpiration", key=k)
        self.assertFalse(e.found)
        self.assertFalse(e.has_expiration)
        self.set(k, "x")
        e = self.call("GetExpiration", key=k)
        self.assertTrue(e.found)
        self.assertFalse(e.has_expiration)
        self.assertFalse(e.HasField("remaining"))
        self.assertFalse(e.HasField("expires_at"))
        s = self.set(k, "x", ttl=duration_pb2.Duration(seconds=600))
        e = self.call("GetExpiration", key=k)
        self.assertTrue(e.found)
        self.assertTrue(e.has_expiration)
        self.assertEqual(e.expires_at, s.expires_at)
        rem = e.remaining.ToMilliseconds()
        self.assertGreater(rem, 500 * 1000)
        self.assertLessEqual(rem, 600 * 1000)

    # --- Increment ---

    def test_increment_creates_then_adds(self):
        k = self.key()
        r = self.call("Increment", key=k, delta=5, initial=100)
        self.assertTrue(r.created)
        self.assertEqual(r.value, 105)
        self.assertFalse(self.call("GetExpiration", key=k).has_expiration)
        r2 = self.call("Increment", key=k, delta=-7, initial=1000)
        self.assertFalse(r2.created)
        self.assertEqual(r2.value, 98)
        self.assertGreater(r2.version, r.version)
        g = self.get(k)
        self.assertEqual(g.value.WhichOneof("kind"), "int64_value")
        self.assertEqual((g.value.int64_value, g.version), (98, r2.version))

    def test_increment_ttl_applies_only_on_create(self):
        k = self.key()
        r = self.call("Increment", key=k, delta=1, ttl=HOUR)
        self.assertTrue(r.created)
        exp = self.get(k).expires_at
        self.assertTrue(self.get(k).HasField("expires_at"))
        self.call("Increment", key=k, delta=1, ttl=duration_pb2.Duration(seconds=5))
        self.assertEqual(self.get(k).expires_at, exp, "an existing key keeps its expiry")
        k2 = self.key("persistent")
        self.set(k2, 10)
        self.call("Increment", key=k2, delta=1, ttl=HOUR)
        self.assertFalse(self.get(k2).HasField("expires_at"))
        self.assertEqual(self.get_value(k2), 11)
        k3 = self.key("at")
        self.call("Increment", key=k3, delta=1, expires_at=ts_at(3600))
        self.assertTrue(self.call("GetExpiration", key=k3).has_expiration)

    def test_increment_not_an_integer(self):
        for v in ["5", 5.0, b"\x05", True, None, {"n": 5.0}]:
            k = self.key()
            ver = self.set(k, v).version
            last = self.last_version()
            with self.assertRpcError(FP, "NOT_AN_INTEGER"):
                self.call("Increment", key=k, delta=1)
            r = self.get(k)
            self.assertTrue(same_value(value_of(r.value), v))
            self.assertEqual(r.version, ver)
            self.assert_gap(self.last_version(), last, 1, "a failed Increment")

    def test_increment_overflow(self):
        OOR = grpc.StatusCode.OUT_OF_RANGE
        k = self.key()
        v = self.set(k, INT64_MAX - 1).version
        self.assertEqual(self.call("Increment", key=k, delta=1).value, INT64_MAX)
        v = self.get(k).version
        with self.assertRpcError(OOR, "INTEGER_OVERFLOW"):
            self.call("Increment", key=k, delta=1)
        self.assertEqual((self.get_value(k), self.get(k).version), (INT64_MAX, v))
        k2 = self.key("min")
        self.set(k2, INT64_MIN + 1)
        self.assertEqual(self.call("Increment", key=k2, delta=-1).value, INT64_MIN)
        with self.assertRpcError(OOR, "INTEGER_OVERFLOW"):
            self.call("Increment", key=k2, delta=-1)
        self.assertEqual(self.get_value(k2), INT64_MIN)
        with self.assertRpcError(OOR, "INTEGER_OVERFLOW"):
            self.call("Increment", key=k2, delta=INT64_MIN)
        # the create path overflows too, and creates nothing
        k3 = self.key("create")
        with self.assertRpcError(OOR, "INTEGER_OVERFLOW"):
            self.call("Increment", key=k3, initial=INT64_MAX, delta=1)
        self.assertFalse(self.get(k3).found)
        # extremes that fit
        k4 = self.key("extremes")
        self.assertEqual(self.call("Increment", key=k4, initial=INT64_MIN, delta=INT64_MAX).value, -1)

    def test_increment_over_expired_entry_creates(self):
        k = self.key()
        self.set(k, "not a number", expires_at=ts_at(-5))
        r = self.call("Increment", key=k, delta=2, initial=40)
        self.assertTrue(r.created)
        self.assertEqual(r.value, 42)

    # --- versions ---

    def test_versions_strictly_increase_across_keys_and_caches(self):
        E = self.pb.cache.SetManyRequest.Entry
        seen = []
        ks = [self.key(str(i)) for i in range(4)]
        seen.append(self.set(ks[0], 1).version)
        seen.append(self.set(ks[1], 1, cache="other").version)
        seen.append(self.call("Add", key=ks[2], value=make_value(1)).version)
        seen.append(self.call("Update", key=ks[0], value=make_value(2)).version)
        seen.append(self.call("GetOrAdd", key=ks[3], value=make_value(1)).version)
        seen.append(self.call("Increment", key=ks[3] + "n", delta=1).version)
        seen.extend(x.version for x in self.call(
            "SetMany", cache="other", entries=[E(key=ks[0], value=make_value(0)),
                                              E(key=ks[2], value=make_value(0))]).results)
        removed = self.call("Remove", key=ks[0]).version
        self.assertEqual(removed, seen[3])
        seen.append(self.set(ks[0], "again").version)
        self.assertEqual(seen, sorted(seen))
        self.assertEqual(len(set(seen)), len(seen), "a version was reused: %s" % seen)
        self.assertNotIn(removed, seen[4:], "the removed entry's version was reused")

    # --- values ---

    def test_all_value_kinds_round_trip(self):
        cases = [
            b"", b"\x00\xff\x00binary\x80", bytes(range(256)) * 4,
            "", "plain", "h\u00e9llo \u2603 \U0001F600 \u4e2d\u6587",
            0, 1, -1, INT64_MAX, INT64_MIN,
            0.0, -0.0, 1.5, -2.25e-300, 1.7976931348623157e308, 5e-324,
            float("inf"), float("-inf"), float("nan"),
            True, False,
            None,
            {}, {"a": 1.0, "b": "two", "c": None, "d": True,
                 "e": {"nested": {"deeper": [1.0, "x", None, False, {"f": []}]}}, "g": []},
        ]
        for i, v in enumerate(cases):
            with self.subTest(value=v):
                k = self.key(str(i))
                s = self.set(k, v)
                r = self.get(k)
                self.assertTrue(r.found)
                self.assertEqual(r.version, s.version)
                got = value_of(r.value)
                self.assertTrue(same_value(got, v), "%r came back as %r" % (v, got))
                if isinstance(v, float):
                    self.assertEqual(math.copysign(1, got), math.copysign(1, v), "sign of %r" % v)
                    self.assertEqual(r.value.WhichOneof("kind"), "double_value")
                # and through GetMany and Remove(return_previous) too
                m = self.call("GetMany", keys=[k]).results[0]
                self.assertTrue(same_value(value_of(m.value), v))
                p = self.call("Remove", key=k, return_previous=True)
                self.assertTrue(same_value(value_of(p.previous), v))

    def test_json_struct_round_trips_exactly(self):
        st = struct_pb2.Struct()
        st.update({"list": [1.0, 2.5, "three", None, True, {"x": {"y": {"z": "deep"}}}],
                   "num": -0.5, "str": "\u00fc", "obj": {}})
        k = self.key()
        v = self.pb.cache.Value(json_value=st)
        self.call("Set", key=k, value=v)
        self.assertEqual(self.get(k).value.json_value, st)

    # --- request_id: a retry returns the first outcome ---

    def test_retry_with_same_request_id_returns_first_outcome(self):
        k = self.key()
        rid = "retry-" + k
        last = self.last_version()
        first = self.call("Increment", key=k, delta=5, request_id=rid)
        again = self.call("Increment", key=k, delta=5, request_id=rid)
        self.assertEqual(again, first)
        self.assertEqual(self.get_value(k), 5, "a retried Increment was applied twice")
        self.assertEqual(self.last_version(), last + 2, "a retry consumed a version")
        # the retry answers from the record even after the entry moved on
        s1 = self.set(k, "mine", request_id=rid + "-set")
        self.set(k, "someone else's")
        s2 = self.set(k, "mine", request_id=rid + "-set")
        self.assertEqual(s2, s1)
        self.assertEqual(self.get_value(k), "someone else's", "a retried Set was applied again")

    def test_retry_of_each_write_method(self):
        E = self.pb.cache.SetManyRequest.Entry
        k = self.key()
        self.set(k + "-upd", "u")
        self.set(k + "-rm", "r")
        self.set(k + "-touch", "t")
        self.set(k + "-persist", "p", ttl=HOUR)
        reqs = {
            "SetMany": dict(entries=[E(key=k + "-m1", value=make_value(1)), E(key=k + "-m2", value=make_value(2))]),
            "Add": dict(key=k + "-add", value=make_value(1)),
            "Update": dict(key=k + "-upd", value=make_value(2)),
            "GetOrAdd": dict(key=k + "-goa", value=make_value(3)),
            "Remove": dict(key=k + "-rm", return_previous=True),
            "Touch": dict(key=k + "-touch", ttl=HOUR),
            "Persist": dict(key=k + "-persist"),
        }
        for method, fields in reqs.items():
            with self.subTest(method=method):
                rid = "%s-%s" % (method, k)
                first = self.call(method, request_id=rid, **fields)
                last = self.last_version()
                again = self.call(method, request_id=rid, **fields)
                self.assertEqual(again, first, "%s retry answered differently" % method)
                self.assertEqual(self.last_version(), last + 1)
        self.assertFalse(self.get(k + "-rm").found)

    def test_request_id_reused_for_a_different_request(self):
        k = self.key()
        rid = "reuse-" + k
        v = self.set(k, "first", request_id=rid).version
        last = self.last_version()
        for method, fields in (("Set", dict(key=k, value=make_value("second"))),
                               ("Set", dict(key=k, value=make_value("first"), ttl=HOUR)),
                               ("Update", dict(key=k, value=make_value("first"))),
                               ("Increment", dict(key=k + "-n", delta=1))):
            with self.subTest(method=method, fields=str(fields)[:40]):
                with self.assertRpcError(FP, "IDEMPOTENCY_KEY_REUSED"):
                    self.call(method, request_id=rid, **fields)
        r = self.get(k)
        self.assertEqual((value_of(r.value), r.version), ("first", v))
        self.assertFalse(r.HasField("expires_at"))
        self.assertFalse(self.get(k + "-n").found)
        self.assertEqual(self.last_version(), last + 1, "a refused retry consumed a version")

    def test_a_failed_outcome_is_remembered_too(self):
        k = self.key()
        v = self.set(k, "a").version
        rid = "cas-" + k
        with self.assertRpcError(FP, "VERSION_MISMATCH", metadata={"currentVersion": str(v)}):
            self.set(k, "b", if_version=v + 1, request_id=rid)
        self.set(k, "c")
        # the same request again gets the first outcome, not a fresh check
        with self.assertRpcError(FP, "VERSION_MISMATCH", metadata={"currentVersion": str(v)}):
            self.set(k, "b", if_version=v + 1, request_id=rid)
        n = self.key("n")
        self.set(n, "text")
        with self.assertRpcError(FP, "NOT_AN_INTEGER"):
            self.call("Increment", key=n, delta=1, request_id="incr-" + n)
        self.set(n, 1)
        with self.assertRpcError(FP, "NOT_AN_INTEGER"):
            self.call("Increment", key=n, delta=1, request_id="incr-" + n)
        self.assertEqual(self.get_value(n), 1)

    def test_rejected_request_records_no_outcome(self):
        """Validation refusals leave no trace, not even an idempotency
        record: the same request_id then works for a valid request."""
        k = self.key()
        rid = "rejected-" + k
        with self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_VALUE"):
            self.call("Set", key=k, value=self.pb.cache.Value(), request_id=rid)
        s = self.set(k, "ok", request_id=rid)
        self.assertEqual(self.get(k).version, s.version)

    def test_no_request_id_means_no_deduplication(self):
        k = self.key()
        self.call("Increment", key=k, delta=1)
        self.call("Increment", key=k, delta=1)
        self.assertEqual(self.get_value(k), 2)

    # --- caches ---

    def test_caches_are_isolated_and_empty_is_default(self):
        k = self.key()
        vd = self.set(k, "in default", cache="").version
        r = self.get(k, cache="default")
        self.assertTrue(r.found, '"" and "default" must be the same cache')
        self.assertEqual((value_of(r.value), r.version), ("in default", vd))
        self.assertFalse(self.get(k, cache="other").found)
        vo = self.set(k, "in other", cache="other").version
        self.assertEqual(self.get_value(k, cache="default"), "in default")
        self.assertEqual(self.get_value(k, cache="other"), "in other")
        self.assertFalse(self.get(k, cache="Other").found, "cache names are case-sensitive")
        self.assertTrue(self.call("Remove", cache="other", key=k).removed)
        self.assertTrue(self.get(k).found, "Remove in one cache touched another")
        self.assertFalse(self.get(k, cache="other").found)
        self.assertGreater(vo, vd)
        # every method honours the cache
        self.assertFalse(self.call("Touch", cache="other", key=k, ttl=HOUR).found)
        self.assertFalse(self.call("Update", cache="other", key=k, value=make_value(1)).updated)
        self.assertTrue(self.call("Add", cache="other", key=k, value=make_value(1)).added)
        self.assertEqual(self.call("Increment", cache="third", key=k, delta=3).value, 3)
        self.assertEqual(self.get_value(k), "in default")
        self.assertEqual([x.found for x in self.call("GetMany", cache="fourth", keys=[k]).results], [False])


class EphemeralCacheRpcTest(CacheRpcTest):
    """The same semantics on a node without a journal (--ephemeral), where
    writes apply directly instead of after the durable append."""
    SERVER_FLAGS = ("--ephemeral",)


if __name__ == "__main__":
    main()
