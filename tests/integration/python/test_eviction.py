"""Eviction (--eviction) with a small --memory-limit, through the real server.

* With a policy, a node whose memory is at the critical level keeps taking
  writes: each write evicts what the policy chooses until it fits, usedBytes
  stays at or below critical, and the evictions show in readiness details,
  GetCacheStats and /metrics (by policy and cache).
* allkeys-lru keeps what is read; allkeys-lfu keeps what is read often;
  volatile-lru and volatile-ttl never evict entries without an expiry (and
  volatile-ttl takes the soonest to expire first); when nothing evictable
  is left the write gets MEMORY_PRESSURE, with the policy in its metadata.
* Evictions are journaled with the write that needed them: a restarted node
  holds exactly the keys it held before (no evicted key comes back), and the
  version counter never goes back.
* A write refused before the journal evicts nothing: validation errors at
  the critical level leave every entry in place.
"""

import os
import tempfile

import grpc

from drey_harness import CACHE_SERVICE, DreyTestCase, ServiceClient, main, make_value
from drey_tokens import details, http_get, ops_port

RE = grpc.StatusCode.RESOURCE_EXHAUSTED
LIMIT = 256 * 1024
VALUE = 1000


class EvictionCase(DreyTestCase):
    SERVER_FLAGS = None

    def node(self, policy, data_dir=None, *extra):
        if data_dir is None:
            data_dir = tempfile.mkdtemp(prefix="drey-evict-", dir=os.environ.get("TEST_TMPDIR"))
        self.data_dir, self.policy = data_dir, policy
        srv = self.start_server("--memory-limit=%d" % LIMIT, "--eviction=" + policy, "--ops-listen=127.0.0.1:0",
                                "--data-dir=" + data_dir, *extra)
        self.srv = srv
        self.ops = ops_port(srv)
        self.cache = ServiceClient(srv.channel(), self.pb.cache, CACHE_SERVICE)
        return srv

    def restart(self):
        self.srv.stop()
        return self.node(self.policy, self.data_dir)

    def details(self):
        return details(self.srv, self.ops)

    def put(self, key, cache="", **fields):
        return self.call("Set", key=key, cache=cache, value=make_value(b"v" * VALUE), **fields)

    def live(self, keys, cache=""):
        found = set()
        for i in range(0, len(keys), 500):
            r = self.call("GetMany", cache=cache, keys=keys[i:i + 500])
            found |= {x.key for x in r.results if x.found}
        return found

    def scan_all(self, cache=""):
        keys, cursor = [], ""
        for _ in range(100000):
            r = self.call("Scan", cache=cache, cursor=cursor, limit=1000)
            keys += [i.key for i in r.items]
            cursor = r.next_cursor
            if not cursor:
                return keys
        self.fail("the scan did not end")


class AllKeysTest(EvictionCase):

    def test_lru_keeps_taking_writes_and_keeps_what_is_read(self):
        self.node("allkeys-lru")
        crit = self.details()["memory"]["criticalBytes"]
        hot = ["hot-%02d" % i for i in range(20)]
        for k in hot:
            self.put(k)
        written = []
        # about 4x what fits: every write past the limit evicts
        for i in range(1000):
            k = "cold-%04d" % i
            self.put(k, cache="c1")
            written.append(k)
            if i % 10 == 0:
                self.assertEqual(len(self.live(hot)), len(hot), "a hot key was evicted at write %d" % i)
        d = self.details()
        self.assertLessEqual(d["memory"]["usedBytes"], crit)
        ev = d["eviction"]
        self.assertEqual(ev["policy"], "allkeys-lru")
        self.assertGreater(int(ev["evictedEntries"]), 600)
        self.assertGreater(int(ev["evictedBytes"]), 600 * VALUE)
        self.assertEqual(len(self.live(hot)), len(hot))
        survivors = self.live(written, cache="c1")
        self.assertLess(len(survivors), 300)
        # the newest writes survive: LRU, not random
        self.assertTrue(set(written[-50:]) <= survivors, "recent writes were evicted")
        st = self.call("GetCacheStats", cache="c1")
        self.assertEqual(st.entries, len(survivors))
        self.assertEqual(st.evictions, len(written) - len(survivors))
        self.assertGreater(st.evicted_bytes, st.evictions * VALUE)
        _, _, body = http_get("127.0.0.1", self.ops, "/metrics")
        text = body.decode()
        self.assertIn('drey_evictions_total{policy="allkeys-lru",cache="c1"} %d' % st.evictions, text)
        self.assertIn('drey_eviction_policy{policy="allkeys-lru"} 1', text)
        self.assertIn('drey_eviction_policy{policy="none"} 0', text)
        self.assertIn('drey_evicted_bytes_total{policy="allkeys-lru",cache="c1"}', text)

    def test_lfu_keeps_what_is_read_often(self):
        self.node("allkeys-lfu")
        freq = ["freq-%02d" % i for i in range(20)]
        for k in freq:
            self.put(k)
        for _ in range(30):
            self.live(freq)
        for i in range(800):
            self.put("once-%04d" % i)
        self.assertEqual(len(self.live(freq)), len(freq), "LFU evicted frequently read keys")
        self.assertEqual(self.details()["eviction"]["policy"], "allkeys-lfu")

    def test_evictions_replay_exactly_and_versions_never_go_back(self):
        self.node("allkeys-lru")
        for i in range(700):
            self.put("r-%04d" % i, request_id="rid-%d" % i if i % 7 == 0 else "")
        last = self.call("Set", key="~v", value=make_value(1)).version
        before = sorted(self.scan_all())
        self.assertLess(len(before), 700)
        stats = self.call("GetCacheStats", cache="")
        self.restart()
        self.assertEqual(sorted(self.scan_all()), before, "replay did not reproduce the evictions")
        again = self.call("GetCacheStats", cache="")
        self.assertEqual((again.entries, again.bytes), (stats.entries, stats.bytes))
        self.assertGreater(self.call("Set", key="~v2", value=make_value(1)).version, last)
        # a retried write is answered from its outcome, evicting nothing
        n = int(self.details()["eviction"]["evictedEntries"])
        r = self.call("Set", key="r-0000", value=make_value(b"v" * VALUE), request_id="rid-0")
        self.assertGreater(r.version, 0)
        self.assertEqual(int(self.details()["eviction"]["evictedEntries"]), n)

    def test_a_refused_write_evicts_nothing(self):
        self.node("allkeys-lru", None, "--max-value-bytes=2000")
        for i in range(400):
            self.put("f-%04d" % i)
        keys = sorted(self.scan_all())
        n = int(self.details()["eviction"]["evictedEntries"])
        lsn = self.details()["journal"]["lastLsn"]
        with self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "PAYLOAD_TOO_LARGE"):
            self.call("Set", key="big", value=make_value(b"x" * 5000))
        self.assertEqual(sorted(self.scan_all()), keys)
        self.assertEqual(int(self.details()["eviction"]["evictedEntries"]), n)
        self.assertEqual(self.details()["journal"]["lastLsn"], lsn)


class VolatileTest(EvictionCase):

    def test_volatile_lru_never_evicts_keys_without_ttl(self):
        self.node("volatile-lru")
        crit = self.details()["memory"]["criticalBytes"]
        persistent = []
        for i in range(150):
            persistent.append("p-%03d" % i)
            self.put(persistent[-1])
        for i in range(400):
            self.put("t-%03d" % i, ttl={"seconds": 3600})
        self.assertEqual(len(self.live(persistent)), len(persistent))
        self.assertGreater(int(self.details()["eviction"]["evictedEntries"]), 0)
        self.assertLessEqual(self.details()["memory"]["usedBytes"], crit)
        # persistent writes use up what volatile keys held; then nothing is
        # evictable and the write is refused, with the policy said
        refused = None
        for i in range(400):
            try:
                self.put("p2-%03d" % i)
            except grpc.RpcError as e:
                refused = e
                break
        self.assertIsNotNone(refused, "writes never hit MEMORY_PRESSURE")
        with self.assertRpcError(RE, "MEMORY_PRESSURE") as e:
            self.put("p3")
        self.assertEqual(e.failure.metadata["evictionPolicy"], "volatile-lru")
        self.assertEqual(len(self.live(persistent)), len(persistent))

    def test_volatile_ttl_evicts_the_soonest_to_expire_first(self):
        self.node("volatile-ttl")
        late = ["late-%03d" % i for i in range(60)]
        for k in late:
            self.put(k, ttl={"seconds": 7200})
        for i in range(500):
            self.put("soon-%03d" % i, ttl={"seconds": 600 + i})
        self.assertEqual(len(self.live(late)), len(late), "volatile-ttl evicted later-expiring keys first")
        self.assertEqual(self.details()["eviction"]["policy"], "volatile-ttl")


class NoneTest(EvictionCase):

    def test_none_refuses_as_before(self):
        self.node("none")
        with self.assertRpcError(RE, "MEMORY_PRESSURE"):
            for i in range(1000):
                self.put("n-%04d" % i)
        self.assertEqual(int(self.details()["eviction"]["evictedEntries"]), 0)
        self.assertEqual(self.details()["eviction"]["policy"], "none")

    def test_an_unknown_policy_is_refused_at_start(self):
        from drey_harness import DreyServer
        srv = DreyServer("--eviction=random", "--ephemeral")
        self.addCleanup(srv.kill)
        srv.spawn()
        self.assertEqual(srv.wait(), 2)
        self.assertIn("--eviction", srv.log_text())


if __name__ == "__main__":
    main()
