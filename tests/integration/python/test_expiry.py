"""Expiry with real time: short ttls observed by polling with a deadline.

No fixed sleep decides anything. Each observation is bracketed by wall-clock
readings taken before and after the call, and checked against the entry's
expires_at: a read that finished before expires_at must see the entry, a read
that started at or after it must not, and only reads straddling the instant
may go either way. (dreyd uses the same CLOCK_REALTIME, in milliseconds; an
entry is live while now_ms < expires_at_ms.)"""

import time

from google.protobuf import duration_pb2, timestamp_pb2

from drey_harness import DreyTestCase, main, make_value, value_of

SHORT_MS = 300
SHORT = duration_pb2.Duration(nanos=SHORT_MS * 1000000)
HOUR = duration_pb2.Duration(seconds=3600)
WAIT = 20.0  # deadline for an expiry to be observed (slow sanitizer builds)


def now_ms():
    return int(time.time() * 1000)


def ts_ms(ts):
    return ts.seconds * 1000 + (ts.nanos + 999999) // 1000000


def ts_at_ms(ms):
    return timestamp_pb2.Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1000000)


class ExpiryTest(DreyTestCase):

    def observe(self, key, expires_ms, cache=""):
        """One Get, checked against expires_ms; returns found."""
        before = now_ms()
        r = self.get(key, cache)
        after = now_ms()
        if after < expires_ms:
            self.assertTrue(r.found, "entry invisible %d ms before its expiry" % (expires_ms - after))
        if before >= expires_ms:
            self.assertFalse(r.found, "entry visible %d ms after its expiry" % (before - expires_ms))
        if r.found:
            self.assertEqual(ts_ms(r.expires_at), expires_ms)
        return r.found

    def wait_expired(self, key, expires_ms, cache=""):
        """Polls Get (checking every observation) until the entry is gone."""
        deadline = time.monotonic() + WAIT
        while self.observe(key, expires_ms, cache):
            self.assertLess(time.monotonic(), deadline, "entry %r never expired" % key)
            time.sleep(0.01)

    def wait_past(self, expires_ms):
        """Polls the wall clock until expires_ms has passed."""
        deadline = time.monotonic() + WAIT
        while now_ms() <= expires_ms:
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.01)

    def short_entry(self, key, value="v", **kw):
        before = now_ms()
        s = self.set(key, value, ttl=SHORT, **kw)
        after = now_ms()
        exp = ts_ms(s.expires_at)
        self.assertGreaterEqual(exp, before + SHORT_MS)
        self.assertLessEqual(exp, after + SHORT_MS + 1)
        return exp

    # --- entries expire ---

    def test_set_ttl_expires(self):
        k = self.key()
        t0 = time.monotonic()
        exp = self.short_entry(k)
        self.wait_expired(k, exp)
        self.assertGreaterEqual(time.monotonic() - t0, (SHORT_MS - 2) / 1000.0, "expired before its ttl")

    def test_set_expires_at_expires(self):
        k = self.key()
        exp = now_ms() + SHORT_MS
        s = self.set(k, "v", expires_at=ts_at_ms(exp))
        self.assertEqual(ts_ms(s.expires_at), exp)
        self.wait_expired(k, exp)

    def test_every_creating_method_honours_ttl(self):
        E = self.pb.cache.SetManyRequest.Entry
        ks = [self.key(str(i)) for i in range(5)]
        exps = []
        exps.append(ts_ms(self.call("Add", key=ks[0], value=make_value(1), ttl=SHORT).expires_at))
        exps.append(ts_ms(self.call("GetOrAdd", key=ks[1], value=make_value(1), ttl=SHORT).expires_at))
        exps.append(ts_ms(self.call("SetMany", entries=[E(key=ks[2], value=make_value(1), ttl=SHORT)])
                          .results[0].expires_at))
        self.call("Increment", key=ks[3], delta=1, ttl=SHORT)
        exps.append(ts_ms(self.get(ks[3]).expires_at))
        self.set(ks[4], "persistent")
        exps.append(ts_ms(self.call("Touch", key=ks[4], ttl=SHORT).expires_at))
        for k, exp in zip(ks, exps):
            self.wait_expired(k, exp)

    def test_expired_entry_is_invisible_to_every_operation(self):
        k = self.key()
        exp = self.short_entry(k, "old")
        self.wait_expired(k, exp)
        self.assertFalse(self.call("GetMany", keys=[k]).results[0].found)
        self.assertFalse(self.call("GetExpiration", key=k).found)
        self.assertFalse(self.call("Touch", key=k, ttl=HOUR).found)
        self.assertFalse(self.call("Persist", key=k).found)
        self.assertFalse(self.call("Update", key=k, value=make_value("x")).updated)
        self.assertFalse(self.call("Remove", key=k).removed)
        self.assertFalse(self.get(k).found, "an operation revived an expired entry")
        a = self.call("Add", key=k, value=make_value("new"))
        self.assertTrue(a.added)
        self.assertFalse(a.HasField("expires_at"))
        self.assertEqual(self.get_value(k), "new")

    def test_cas_and_increment_treat_expired_as_absent(self):
        k, n = self.key("cas"), self.key("counter")
        exp = self.short_entry(k, "old")
        self.call("Increment", key=n, delta=10, ttl=SHORT)
        exp_n = ts_ms(self.get(n).expires_at)
        self.wait_expired(k, exp)
        self.wait_expired(n, exp_n)
        self.set(k, "new", if_version=0)
        self.assertEqual(self.get_value(k), "new")
        r = self.call("Increment", key=n, delta=1, initial=100)
        self.assertTrue(r.created)
        self.assertEqual(r.value, 101)

    def test_get_or_add_after_expiry_adds(self):
        k = self.key()
        exp = self.short_entry(k, "old")
        self.wait_expired(k, exp)
        g = self.call("GetOrAdd", key=k, value=make_value("new"))
        self.assertTrue(g.added)
        self.assertEqual(value_of(g.value), "new")

    # --- what keeps and what changes an expiry ---

    def test_update_set_increment_keep_the_expiry(self):
        a, b, c = self.key("update"), self.key("set"), self.key("incr")
        exp_a = self.short_entry(a, "v1")
        exp_b = self.short_entry(b, "v1")
        exp_c = self.short_entry(c, 1)
        u = self.call("Update", key=a, value=make_value("v2"))
        self.assertEqual(ts_ms(u.expires_at), exp_a)
        s = self.set(b, "v2")  # no expiration given: keeps it
        self.assertEqual(ts_ms(s.expires_at), exp_b)
        self.call("Increment", key=c, delta=1, ttl=HOUR)  # ttl ignored: the key exists
        self.wait_expired(a, exp_a)
        self.wait_expired(b, exp_b)
        self.wait_expired(c, exp_c)

    def test_persist_touch_and_set_persist_prevent_expiry(self):
        p, t, s = self.key("persist"), self.key("touch"), self.key("setpersist")
        sp = self.set(p, "p", ttl=SHORT)
        st = self.set(t, "t", ttl=SHORT)
        ss = self.set(s, "s", ttl=SHORT)
        self.assertTrue(self.call("Persist", key=p).found)
        self.assertTrue(self.call("Touch", key=t, ttl=HOUR).found)
        self.set(s, "s2", persist=True)
        # past every original expiry: without the calls above all three are gone
        self.wait_past(max(ts_ms(x.expires_at) for x in (sp, st, ss)))
        r = self.get(p)
        self.assertTrue(r.found, "a persisted entry expired")
        self.assertEqual(r.version, sp.version)
        self.assertFalse(r.HasField("expires_at"))
        self.assertTrue(self.get(t).found, "a touched entry expired at its old time")
        self.assertTrue(self.get(s).found, "Set(persist) did not drop the expiry")

    def test_touch_can_shorten(self):
        k = self.key()
        self.set(k, "v", ttl=HOUR)
        t = self.call("Touch", key=k, ttl=SHORT)
        self.wait_expired(k, ts_ms(t.expires_at))

    def test_remaining_counts_down(self):
        k = self.key()
        self.set(k, "v", ttl=duration_pb2.Duration(seconds=60))
        e1 = self.call("GetExpiration", key=k)
        self.assertTrue(e1.has_expiration)
        r1 = e1.remaining.ToMilliseconds()
        start = time.monotonic()
        while True:
            r2 = self.call("GetExpiration", key=k).remaining.ToMilliseconds()
            if r2 < r1:
                break
            self.assertEqual(r2, r1, "remaining grew")
            self.assertLess(time.monotonic() - start, WAIT, "remaining never decreased")
            time.sleep(0.005)
        self.assertGreater(r2, 0)
        self.assertLessEqual(r1, 60000)

    # --- expires_at in the past ---

    def test_expires_at_in_the_past_stores_an_invisible_entry(self):
        for i, at in enumerate([ts_at_ms(now_ms() - 10000), timestamp_pb2.Timestamp(seconds=0),
                                timestamp_pb2.Timestamp(seconds=-86400 * 365), timestamp_pb2.Timestamp(seconds=1)]):
            with self.subTest(at=at):
                k = self.key(str(i))
                s = self.set(k, "ghost", expires_at=at)
                self.assertGreater(s.version, 0)
                self.assertTrue(s.HasField("expires_at"), "a past expires_at must not mean 'never'")
                self.assertLess(ts_ms(s.expires_at), now_ms())
                self.assertFalse(self.get(k).found)
                self.assertFalse(self.call("GetMany", keys=[k]).results[0].found)
                self.assertFalse(self.call("GetExpiration", key=k).found)
                self.assertFalse(self.call("Persist", key=k).found)
                self.assertTrue(self.call("Add", key=k, value=make_value("real")).added)

    def test_past_expires_at_hides_an_existing_entry(self):
        k = self.key()
        self.set(k, "visible")
        self.set(k, "gone", expires_at=ts_at_ms(now_ms() - 1000))
        self.assertFalse(self.get(k).found)
        E = self.pb.cache.SetManyRequest.Entry
        k2 = self.key("many")
        self.call("SetMany", entries=[E(key=k2, value=make_value(1), expires_at=ts_at_ms(now_ms() - 1000))])
        self.assertFalse(self.get(k2).found)


if __name__ == "__main__":
    main()
