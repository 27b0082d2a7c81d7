"""Scan, Clear, RemoveMany, ListCaches and GetCacheStats through the real
server.

* RemoveMany: one result per key in request order, --max-batch enforced,
  key validation by field path, idempotent retries answered from the first
  outcome.
* Scan: every live key of the cache exactly as Get sees it (prefix,
  values, versions, expiries), in pages of at most `limit`; expired keys
  skipped; under concurrent writes a key present for the whole scan comes
  back at least once and a key never written never does; a cursor for
  another cache or prefix, a forged one and one issued before an ephemeral
  node restarted are refused with INVALID_ARGUMENT INVALID_CURSOR; a durable
  node's cursor goes on after a restart.
* Clear: the cache is empty at once for every reader (a reader that saw one
  key gone never sees another of the cache again), other caches untouched,
  figures at zero at once and memory returned by the sweep; it is one
  journal record, replayed after a restart, and a retry with its request_id
  does not clear what was written since.
* ListCaches / GetCacheStats: figures equal to the accounting (entry bytes
  are overhead + cache name + key + value), the same after a restart from
  the journal and after one from a snapshot.
"""

import os
import tempfile
import threading

import grpc

from drey_harness import ADMIN_SERVICE, CACHE_SERVICE, DreyTestCase, ServiceClient, main, make_value, value_of
from drey_tokens import details, ops_port, poll

INVALID = grpc.StatusCode.INVALID_ARGUMENT


class Case(DreyTestCase):
    SERVER_FLAGS = None

    def node(self, *flags, data_dir=None):
        if data_dir is None and "--ephemeral" not in flags:
            data_dir = tempfile.mkdtemp(prefix="drey-scan-", dir=os.environ.get("TEST_TMPDIR"))
        self.data_dir, self.flags = data_dir, flags
        args = list(flags) + ["--ops-listen=127.0.0.1:0"]
        if data_dir is not None:
            args.append("--data-dir=" + data_dir)
        self.srv = self.start_server(*args)
        self.ops = ops_port(self.srv)
        self.cache = ServiceClient(self.srv.channel(), self.pb.cache, CACHE_SERVICE)
        self.admin = ServiceClient(self.srv.channel(), self.pb.admin, ADMIN_SERVICE)
        return self.srv

    def restart(self):
        self.srv.stop()
        return self.node(*self.flags, data_dir=self.data_dir)

    def scan(self, cache="", prefix="", limit=0, values=False, cursor=""):
        """Every page until the cursor is "": (items, pages)."""
        items, pages = [], 0
        for _ in range(100000):
            r = self.call("Scan", cache=cache, prefix=prefix, limit=limit, include_values=values, cursor=cursor)
            pages += 1
            if limit:
                self.assertLessEqual(len(r.items), limit)
            items += list(r.items)
            cursor = r.next_cursor
            if not cursor:
                return items, pages
        self.fail("the scan did not end")


class RemoveManyTest(Case):

    def test_one_result_per_key_in_order(self):
        self.node("--ephemeral", "--max-batch=10")
        v1 = self.set("a", 1, cache="rm").version
        v3 = self.set("c", 3, cache="rm").version
        self.set("a", 1)  # same key, another cache
        r = self.call("RemoveMany", cache="rm", keys=["c", "b", "a", "a"])
        self.assertEqual([(x.key, x.removed, x.version) for x in r.results],
                         [("c", True, v3), ("b", False, 0), ("a", True, v1), ("a", False, 0)])
        self.assertFalse(self.get("a", cache="rm").found)
        self.assertTrue(self.get("a").found, "another cache's key went")
        self.rpcError("RemoveMany", self.cache.request("RemoveMany", keys=["k%d" % i for i in range(11)]),
                      INVALID, "BATCH_TOO_LARGE", field="keys")
        self.rpcError("RemoveMany", self.cache.request("RemoveMany", keys=["ok", ""]), INVALID, "INVALID_KEY",
                      field="keys[1]")
        self.rpcError("RemoveMany", self.cache.request("RemoveMany", cache="bad name", keys=["ok"]), INVALID,
                      "INVALID_CACHE_NAME", field="cache")

    def test_a_retry_returns_the_first_outcome(self):
        self.node("--ephemeral")
        v = self.set("x", 1).version
        first = self.call("RemoveMany", keys=["x"], request_id="rm-1")
        self.set("x", 2)
        again = self.call("RemoveMany", keys=["x"], request_id="rm-1")
        self.assertEqual(again, first)
        self.assertEqual(first.results[0].version, v)
        self.assertTrue(self.get("x").found, "the retry removed again")


class ScanTest(Case):

    def test_pages_cover_the_cache_exactly(self):
        self.node("--ephemeral")
        want = {}
        for i in range(300):
            k = ("p/%03d" if i % 3 else "q/%03d") % i
            want[k] = self.set(k, "v%d" % i, cache="s1").version
        self.set("p/other", 1, cache="s2")
        self.set("p/expired", 1, cache="s1", expires_at={"seconds": 1})
        self.set("p/later", 1, cache="s1", ttl={"seconds": 3600})
        want["p/later"] = self.get("p/later", cache="s1").version
        items, pages = self.scan(cache="s1", limit=7)
        self.assertGreater(pages, 300 // 7)
        self.assertEqual(sorted(i.key for i in items), sorted(want), "not exactly the live keys")
        self.assertEqual({i.key: i.version for i in items}, want)
        self.assertTrue(all(not i.HasField("value") for i in items), "values without include_values")
        items, _ = self.scan(cache="s1", prefix="p/", values=True, limit=50)
        self.assertEqual(sorted(i.key for i in items), sorted(k for k in want if k.startswith("p/")))
        for i in items:
            g = self.get(i.key, cache="s1")
            self.assertEqual(value_of(i.value), value_of(g.value))
            self.assertEqual(i.HasField("expires_at"), g.HasField("expires_at"))
        items, _ = self.scan(cache="nothing-here")
        self.assertEqual(items, [])
        # the default cache has two names
        self.set("d1", 1)
        self.assertEqual([i.key for i in self.scan(cache="default")[0]], ["d1"])
        self.assertEqual([i.key for i in self.scan(cache="")[0]], ["d1"])

    def test_bad_cursors_are_refused(self):
        self.node("--ephemeral")
        for i in range(50):
            self.set("k%02d" % i, i, cache="c")
        r = self.call("Scan", cache="c", limit=5)
        self.assertTrue(r.next_cursor)
        for req, why in ((dict(cache="other", cursor=r.next_cursor), "another cache"),
                         (dict(cache="c", prefix="k", cursor=r.next_cursor), "another prefix"),
                         (dict(cache="c", cursor="nonsense"), "garbage"),
                         (dict(cache="c", cursor=r.next_cursor[:10] + ("A" if r.next_cursor[10] != "A" else "B") +
               r.next_cursor[11:]), "a changed position"),
                         (dict(cache="c", cursor=r.next_cursor + "A"), "a longer cursor")):
            with self.assertRpcError(INVALID, "INVALID_CURSOR", field="cursor") as e:
                self.call("Scan", **req)
            self.assertTrue(e.failure.metadata.get("why"), why)
        # a position past the last shard is refused too (forged bytes)
        import base64
        raw = bytearray(base64.urlsafe_b64decode(r.next_cursor + "=="))
        raw[12:16] = (1000).to_bytes(4, "little")
        forged = base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")
        with self.assertRpcError(INVALID, "INVALID_CURSOR", field="cursor"):
            self.call("Scan", cache="c", cursor=forged)

    def test_under_concurrent_writes(self):
        self.node("--ephemeral")
        stable = ["stable-%04d" % i for i in range(2000)]
        for k in stable:
            self.set(k, 1, cache="w")
        stop = threading.Event()
        errors = []

        def writer():
            # churn: keys come and go (the table grows and shrinks under the
            # scan), the stable ones are rewritten in place
            ch = self.srv.channel()
            c = ServiceClient(ch, self.pb.cache, CACHE_SERVICE)
            n = 0
            try:
                while not stop.is_set():
                    batch = ["churn-%06d" % (n + i) for i in range(50)]
                    c.SetMany(c.request("SetMany", cache="w", entries=[
                        c.module.SetManyRequest.Entry(key=k, value=make_value(b"x")) for k in batch]), timeout=30)
                    c.RemoveMany(c.request("RemoveMany", cache="w", keys=batch[:45]), timeout=30)
                    c.Set(c.request("Set", cache="w", key=stable[n % len(stable)], value=make_value(n)), timeout=30)
                    n += 50
            except Exception as e:  # surfaces in the test thread
                errors.append(e)

        t = threading.Thread(target=writer)
        t.start()
        try:
            items, pages = self.scan(cache="w", limit=13)
        finally:
            stop.set()
            t.join(60)
        self.assertEqual(errors, [])
        keys = [i.key for i in items]
        self.assertTrue(set(stable) <= set(keys), "a key present for the whole scan was not returned")
        self.assertTrue(all(k.startswith(("stable-", "churn-")) for k in keys))

    def test_a_cursor_goes_on_after_a_durable_node_restarts(self):
        self.node()
        keys = ["r%03d" % i for i in range(200)]
        for k in keys:
            self.set(k, 1, cache="rs")
        first = self.call("Scan", cache="rs", limit=20)
        self.restart()
        rest, _ = self.scan(cache="rs", limit=20, cursor=first.next_cursor)
        got = {i.key for i in first.items} | {i.key for i in rest}
        self.assertEqual(got, set(keys))

    def test_a_damaged_seed_file_stops_startup(self):
        self.node()
        self.set("x", 1)
        self.srv.stop()
        path = os.path.join(self.data_dir, "SEED")
        with open(path, "r+b") as f:
            f.seek(10)
            f.write(b"\xff\xfe")
        from drey_harness import DreyServer
        srv = DreyServer("--data-dir=" + self.data_dir)
        self.addCleanup(srv.kill)
        srv.spawn()
        self.assertEqual(srv.wait(), 1)
        self.assertIn("SEED is damaged", srv.log_text())

    def test_an_ephemeral_node_refuses_a_cursor_from_before_its_restart(self):
        self.node("--ephemeral")
        for i in range(100):
            self.set("e%03d" % i, 1, cache="es")
        first = self.call("Scan", cache="es", limit=10)
        self.restart()
        for i in range(100):
            self.set("e%03d" % i, 1, cache="es")
        with self.assertRpcError(INVALID, "INVALID_CURSOR", field="cursor") as e:
            self.call("Scan", cache="es", cursor=first.next_cursor)
        self.assertIn("seed", e.failure.metadata["why"])


class ClearTest(Case):

    def test_clear_is_all_or_nothing_for_readers(self):
        self.node("--ephemeral")
        keys = ["k%04d" % i for i in range(500)]
        E = self.pb.cache.SetManyRequest.Entry
        for i in range(0, len(keys), 100):
            self.call("SetMany", cache="cl", entries=[E(key=k, value=make_value(1)) for k in keys[i:i + 100]])
        self.set("keep", 1, cache="other")
        violations, started, done = [], threading.Event(), threading.Event()

        def reader():
            ch = self.srv.channel()
            c = ServiceClient(ch, self.pb.cache, CACHE_SERVICE)
            gone = None
            while not done.is_set():
                for k in keys:
                    found = c.Get(c.request("Get", cache="cl", key=k), timeout=30).found
                    started.set()
                    if gone is not None and found:
                        violations.append((gone, k))
                    if not found and gone is None:
                        gone = k
                if gone is not None:
                    return

        readers = [threading.Thread(target=reader) for _ in range(3)]
        for t in readers:
            t.start()
        started.wait(30)
        self.call("Clear", cache="cl")
        for t in readers:
            t.join(60)
        done.set()
        self.assertEqual(violations, [], "a reader saw part of the cache after another part was gone")
        self.assertEqual(self.scan(cache="cl")[0], [])
        st = self.call("GetCacheStats", cache="cl")
        self.assertEqual((st.entries, st.bytes), (0, 0))
        self.assertTrue(self.get("keep", cache="other").found)
        self.assertEqual([c.cache for c in self.call("ListCaches").caches], ["other"])
        # memory comes back once the sweep freed the cleared entries
        other = self.call("GetCacheStats", cache="other").bytes
        poll(lambda: details(self.srv, self.ops)["memory"]["usedBytes"], lambda u: u == other, timeout=30,
             what="usedBytes back to the other cache's bytes")
        # the name is usable again at once
        self.set("k0000", 2, cache="cl")
        self.assertEqual(self.call("GetCacheStats", cache="cl").entries, 1)

    def test_clear_replays_and_a_retry_does_not_clear_again(self):
        self.node()
        for i in range(50):
            self.set("a%02d" % i, i, cache="cr")
        self.call("Clear", cache="cr", request_id="clear-1")
        self.set("after", 1, cache="cr")
        self.assertEqual(self.call("Clear", cache="cr", request_id="clear-1"), self.pb.cache.ClearResponse())
        self.assertTrue(self.get("after", cache="cr").found, "the retry cleared again")
        self.restart()
        self.assertEqual([i.key for i in self.scan(cache="cr")[0]], ["after"])
        self.assertEqual(self.call("GetCacheStats", cache="cr").entries, 1)
        self.rpcError("Clear", self.cache.request("Clear", cache="no such"), INVALID, "INVALID_CACHE_NAME",
                      field="cache")


class StatsTest(Case):

    def overhead(self):
        self.set("ovh", b"")
        o = self.call("GetCacheStats").bytes - 3
        self.call("Remove", key="ovh")
        return o

    def test_figures_are_exact_and_survive_restarts(self):
        self.node()
        o = self.overhead()
        self.set("a", b"12345", cache="st1")
        self.set("bb", b"1", cache="st1", ttl={"seconds": 3600})
        self.set("c", b"", cache="st2")
        self.set("d", b"xyz")
        want = {
            "st1": (2, 2 * o + 2 * 3 + 1 + 2 + 5 + 1, 1),
            "st2": (1, o + 3 + 1, 0),
            "default": (1, o + 1 + 3, 0),
        }

        def check(when):
            got = {c.cache: (c.entries, c.bytes, c.expiring) for c in self.call("ListCaches").caches}
            self.assertEqual(got, want, when)
            for name, fig in want.items():
                st = self.call("GetCacheStats", cache=name)
                self.assertEqual((st.cache, st.entries, st.bytes, st.expiring), (name,) + fig, when)
            self.assertEqual(self.call("GetCacheStats", cache="none").entries, 0)

        check("live")
        self.set("a", b"1234567890", cache="st1")
        want["st1"] = (2, want["st1"][1] + 5, 1)
        check("after an overwrite")
        self.restart()
        check("after replaying the journal")
        self.admin.Snapshot(self.admin.request("Snapshot"), timeout=60)
        self.restart()
        check("after loading a snapshot")
        # idempotency outcomes live in an internal cache nobody lists
        self.set("e", 1, cache="st2", request_id="rid-st")
        self.assertNotIn("#outcomes", [c.cache for c in self.call("ListCaches").caches])


if __name__ == "__main__":
    main()
