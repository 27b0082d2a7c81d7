"""Memory admission with a small --memory-limit, through the real server.

* The accounting is exact and linear: an entry costs a fixed overhead plus
  its cache name, key and value bytes; usedBytes in /health/ready/details
  follows every write, overwrite, removal and expiry, goes back to its
  starting figure when everything is removed, and comes back the same after
  a restart (journal replay, and snapshot plus journal).
* Writes that would take usedBytes past the critical level (95% of the
  limit) are refused with RESOURCE_EXHAUSTED MEMORY_PRESSURE, ErrorInfo
  metadata in bytes (limitBytes, usedBytes, criticalBytes, requestBytes),
  QuotaFailure for the node and RetryInfo; the boundary is exact (growth up
  to critical is fine, one byte more is not). Reads, Remove, Touch, Persist
  and writes that do not grow memory are never refused.
* The no-trace invariant for the stages before the journal that these
  tests can reach with one server: validation and memory admission. A
  refused write leaves the key as it was, consumes no version, leaves its
  request_id free for a different request, and moves neither usedBytes nor
  the journal.
"""

import os
import tempfile
import uuid

import grpc

from drey_harness import CACHE_SERVICE, DreyTestCase, RpcFailure, ServiceClient, main, make_value, value_of
from drey_tokens import details, duration_ms, http_get, metadata_keys_have_units, ops_port, poll

RE = grpc.StatusCode.RESOURCE_EXHAUSTED
LIMIT = 256 * 1024
NODE = "mem-node"
RPC_TIMEOUT = 30


class MemoryCase(DreyTestCase):
    SERVER_FLAGS = None

    def node(self, data_dir=None):
        if data_dir is None:
            data_dir = tempfile.mkdtemp(prefix="drey-mem-", dir=os.environ.get("TEST_TMPDIR"))
        self.data_dir = data_dir
        srv = self.start_server("--memory-limit=%d" % LIMIT, "--ops-listen=127.0.0.1:0", "--node-id=" + NODE,
                                "--data-dir=" + data_dir)
        self.srv = srv
        self.ops = ops_port(srv)
        self.cache = ServiceClient(srv.channel(), self.pb.cache, CACHE_SERVICE)
        return srv

    def restart(self):
        self.srv.stop()
        return self.node(self.data_dir)

    def mem(self):
        return details(self.srv, self.ops)["memory"]

    def used(self):
        return self.mem()["usedBytes"]

    def lsn(self):
        return details(self.srv, self.ops)["journal"]["lastLsn"]

    def put(self, key, n, **fields):
        return self.call("Set", key=key, value=make_value(b"v" * n), **fields)

    def overhead(self):
        """The fixed cost of an entry, measured: a first entry's usedBytes
        minus its key and value bytes (the default cache's name is empty)."""
        u0 = self.used()
        k = "ovh-" + uuid.uuid4().hex[:8]
        self.put(k, 100)
        o = self.used() - u0 - len(k) - 100
        self.assertGreater(o, 0)
        self.call("Remove", key=k)
        self.assertEqual(self.used(), u0)
        return o

    def fill_to(self, target, prefix="fill"):
        """Writes entries until usedBytes is exactly target (<= critical);
        returns their keys."""
        o = self.overhead()
        keys = []
        while True:
            left = target - self.used()
            self.assertGreaterEqual(left, 0)
            if left == 0:
                return keys
            k = "%s-%04d" % (prefix, len(keys))
            n = min(8192, left - o - len(k))
            if n < 1:
                # too little room for one more entry: shrink the previous one
                self.assertTrue(keys, "cannot reach %d" % target)
                last = keys[-1]
                cur = len(self.get(last).value.bytes_value)
                self.put(last, cur - (o + len(k) + 1))
                continue
            self.put(k, n)
            keys.append(k)

    def refused_memory(self, method, **fields):
        with self.assertRpcError(RE, "MEMORY_PRESSURE") as e:
            self.call(method, **fields)
        f = e.failure
        self.assertEqual(sorted(f.details), ["ErrorInfo", "QuotaFailure", "RetryInfo"], repr(f))
        self.assertEqual(metadata_keys_have_units(f.metadata), [], f.metadata)
        self.assertEqual(set(f.metadata), {"limitBytes", "usedBytes", "criticalBytes", "requestBytes"})
        self.assertEqual(len(f.quota_failure.violations), 1)
        self.assertEqual(f.quota_failure.violations[0].subject, "node:" + NODE)
        self.assertTrue(f.quota_failure.violations[0].description)
        self.assertGreater(duration_ms(f.retry_info.retry_delay), 0)
        return f


class AccountingTest(MemoryCase):

    def test_growing_writes_are_refused_exactly_at_critical(self):
        self.node()
        m = self.mem()
        self.assertEqual(m["limitBytes"], LIMIT)
        crit, high = m["criticalBytes"], m["highBytes"]
        self.assertEqual(crit, LIMIT * 95 // 100)
        self.assertEqual(high, LIMIT * 80 // 100)
        self.assertEqual((m["state"], m["writeRejectionActive"]), ("normal", False))
        u0 = self.used()
        self.assertEqual(u0, 0, "an empty store accounts nothing")
        o = self.overhead()
        # linear: the overhead is the same for every size
        for klen, vlen in ((3, 1), (40, 5000), (200, 0)):
            before = self.used()
            k = "k" * klen
            self.call("Set", key=k, value=make_value(b"x" * vlen))
            self.assertEqual(self.used() - before, o + klen + vlen, (klen, vlen))
            self.call("Remove", key=k)
        self.assertEqual(self.used(), u0)
        keys = self.fill_to(crit)
        m = self.mem()
        self.assertEqual(m["usedBytes"], crit)
        self.assertEqual((m["state"], m["writeRejectionActive"]), ("critical", True))
        last_lsn = self.lsn()

        # growth of any size is refused; the figures are the node's
        f = self.refused_memory("Set", key="new", value=make_value(b"z"))
        self.assertEqual(f.metadata, {"limitBytes": str(LIMIT), "usedBytes": str(crit),
                                      "criticalBytes": str(crit), "requestBytes": str(o + 3 + 1)})
        self.assertEqual(duration_ms(f.retry_info.retry_delay), 1000)
        big = keys[0]
        size = len(self.get(big).value.bytes_value)
        self.refused_memory("Set", key=big, value=make_value(b"v" * (size + 1)))
        self.refused_memory("Add", key="new", value=make_value(1))
        self.refused_memory("Increment", key="counter", delta=1)
        E = self.pb.cache.SetManyRequest.Entry
        self.refused_memory("SetMany", entries=[E(key=big, value=make_value(b"v" * (size - 10))),
                                                E(key="new2", value=make_value(b"v" * 11))])
        self.assertEqual(self.used(), crit)
        self.assertEqual(self.lsn(), last_lsn, "a refused write reached the journal")
        self.assertGreaterEqual(self.mem()["writeRejectionActive"], True)

        # reads, and writes that do not grow, are fine
        self.assertEqual(len(self.get(big).value.bytes_value), size)
        self.assertEqual(len(self.call("GetMany", keys=keys[:3]).results), 3)
        self.assertTrue(self.call("GetExpiration", key=big).found)
        self.assertTrue(self.call("Touch", key=big, ttl={"seconds": 3600}).found)
        self.assertTrue(self.call("Persist", key=big).found)
        self.put(big, size)  # same size: growth 0
        self.assertTrue(self.call("Update", key=big, value=make_value(b"w" * size)).updated)
        self.assertFalse(self.call("GetOrAdd", key=big, value=make_value(b"g" * size)).added)
        self.assertFalse(self.call("Add", key=big, value=make_value(b"a" * size)).added)
        self.assertEqual(self.used(), crit)
        # shrinking is fine, and growing back exactly to critical too
        self.put(big, size - 100)
        self.assertEqual(self.used(), crit - 100)
        self.refused_memory("Set", key=big, value=make_value(b"v" * (size + 1)))
        self.put(big, size)
        self.assertEqual(self.used(), crit)
        # removing is never refused, and frees exactly the entry
        r = self.call("Remove", key=big, return_previous=True)
        self.assertTrue(r.removed)
        self.assertEqual(self.used(), crit - (o + len(big) + size))
        self.assertEqual(self.mem()["state"], "high")
        self.put("new", 1)
        for k in keys[1:] + ["new"]:
            self.assertTrue(self.call("Remove", key=k).removed)
        self.assertEqual(self.used(), u0, "the accounting did not come back to its start")
        m = self.mem()
        self.assertEqual((m["state"], m["writeRejectionActive"]), ("normal", False))

    def test_calls_that_would_store_nothing_are_not_refused_at_critical(self):
        """docs/security.md: a write is refused when its growth, new size - old size,
        would pass critical. Add or GetOrAdd of a live key and Update of an
        absent one store nothing (growth 0): at critical they answer as
        they always do (GetOrAdd of a live key is a read)."""
        self.node()
        keys = self.fill_to(self.mem()["criticalBytes"])
        live = keys[0]
        size = len(self.get(live).value.bytes_value)
        bigger = make_value(b"B" * (size + 4000))
        outcomes = {}
        for name, fn in (
                ("GetOrAdd of a live key", lambda: self.call("GetOrAdd", key=live, value=bigger).added),
                ("Add of a live key", lambda: self.call("Add", key=live, value=bigger).added),
                ("Update of an absent key", lambda: self.call("Update", key="absent", value=bigger).updated)):
            try:
                outcomes[name] = fn()
            except grpc.RpcError as e:
                outcomes[name] = "%s %s" % (e.code().name, RpcFailure(e).reason)
        self.assertEqual(outcomes, {"GetOrAdd of a live key": False, "Add of a live key": False,
                                    "Update of an absent key": False})
        self.assertEqual(self.used(), self.mem()["criticalBytes"])

    def test_expiry_gives_the_bytes_back(self):
        self.node()
        u0 = self.used()
        self.put("forever", 1000)
        u1 = self.used()
        for i in range(5):
            self.call("Set", key="brief-%d" % i, value=make_value(b"b" * 2000), ttl={"nanos": 300000000})
        self.assertGreater(self.used(), u1)
        poll(self.used, lambda u: u == u1, timeout=30, interval=0.02, what="expired entries swept")
        self.call("Remove", key="forever")
        self.assertEqual(self.used(), u0)

    def test_the_accounting_survives_restarts(self):
        self.node()
        E = self.pb.cache.SetManyRequest.Entry
        for i in range(20):
            self.put("a-%02d" % i, 100 * i)
        self.put("a-03", 5000)  # overwrite, larger
        self.put("a-04", 1)     # overwrite, smaller
        self.call("Remove", key="a-05")
        self.call("SetMany", entries=[E(key="m-%d" % i, value=make_value("s" * i)) for i in range(10)])
        self.call("Increment", key="ctr", delta=5)
        self.call("Set", key="cache-named", cache="other", value=make_value({"j": [1, 2, 3]}))
        # remembered outcomes are entries too; they stay when the keys go
        before = self.used()
        self.call("Set", key="with-id", value=make_value("i"), request_id="rid-" + uuid.uuid4().hex)
        self.call("Remove", key="with-id", request_id="rid-" + uuid.uuid4().hex)
        outcomes = self.used() - before
        self.assertGreater(outcomes, 0)
        u = self.used()
        self.restart()
        self.assertEqual(self.used(), u, "journal replay accounted differently")
        # a snapshot, more writes after it, a restart: snapshot + journal
        snap = self.srv.channel().unary_unary("/drey.admin.v1.Admin/Snapshot", request_serializer=lambda b: b,
                                              response_deserializer=lambda b: b)
        snap(b"", timeout=RPC_TIMEOUT)
        self.put("after-snap", 3000)
        self.call("Remove", key="a-06")
        u = self.used()
        self.restart()
        self.assertEqual(self.used(), u, "snapshot + journal recovery accounted differently")
        self.assertEqual(len(self.get("after-snap").value.bytes_value), 3000)
        # every key removed, then a restart: back to the outcomes alone
        keys = ["a-%02d" % i for i in range(20) if i not in (5, 6)] + ["m-%d" % i for i in range(10)] + \
            ["ctr", "after-snap"]
        for k in keys:
            self.assertTrue(self.call("Remove", key=k).removed, k)
        self.assertTrue(self.call("Remove", key="cache-named", cache="other").removed)
        self.assertEqual(self.used(), outcomes)
        self.restart()
        self.assertEqual(self.used(), outcomes)

    def test_refusals_while_full_are_counted_and_the_node_stays_ready(self):
        srv = self.node()
        self.fill_to(self.mem()["criticalBytes"])
        for _ in range(3):
            self.refused_memory("Set", key="more", value=make_value(b"m" * 100))
        status, _, _ = http_get("127.0.0.1", self.ops, "/health/ready")
        self.assertEqual(status, 200, "memory pressure made the node unready")
        status, _, body = http_get("127.0.0.1", self.ops, "/metrics")
        text = body.decode()
        line = [ln for ln in text.split("\n")
                if ln.startswith("drey_rejections_total{") and 'reason="MEMORY_PRESSURE"' in ln]
        self.assertEqual(len(line), 1, text[:2000])
        self.assertIn('stage="memory"', line[0])
        self.assertEqual(float(line[0].rsplit(" ", 1)[1]), 3)
        self.assertIn('drey_memory_state{state="critical"} 1', text)
        self.assertIn("drey_memory_used_bytes %d" % self.used(), text)
        h = ServiceClient(srv.channel(), self.pb.health, "grpc.health.v1.Health")
        self.assertEqual(h.Check(self.pb.health.HealthCheckRequest(), timeout=RPC_TIMEOUT).status,
                         self.pb.health.HealthCheckResponse.SERVING)


class NoTraceTest(MemoryCase):
    """A write refused before the journal leaves nothing behind."""

    def snapshot(self, k):
        g = self.get(k)
        return (g.found, value_of(g.value) if g.found else None, g.version), self.used(), self.lsn()

    def check_no_trace(self, k, before, v_last, rid, refuse, reason, code):
        with self.assertRpcError(code, reason):
            refuse()
        self.assertEqual(self.snapshot(k), before, "the refused write left a trace")
        # the request_id is free for a different request, and the next write
        # gets the next version: none was consumed
        nk = self.key("next")
        r = self.call("Set", key=nk, value=make_value("different"), request_id=rid)
        self.assertEqual(r.version, v_last + 1, "the refused write consumed a version")
        # and that outcome is the one now remembered
        again = self.call("Set", key=nk, value=make_value("different"), request_id=rid)
        self.assertEqual(again.version, r.version)
        return nk

    def test_validation_refusals_leave_no_trace(self):
        self.node()
        cases = {
            "INVALID_EXPIRATION": lambda k, rid: self.call("Set", key=k, value=make_value("bad"), request_id=rid,
                                                           ttl={"seconds": -5}),
            "INVALID_VALUE": lambda k, rid: self.call("Set", key=k, request_id=rid),
            "PAYLOAD_TOO_LARGE": lambda k, rid: self.call("Set", key=k, value=make_value(b"x" * (5 << 20)),
                                                          request_id=rid),
            "INVALID_KEY": lambda k, rid: self.call("SetMany", request_id=rid, entries=[
                self.pb.cache.SetManyRequest.Entry(key=k, value=make_value(1)),
                self.pb.cache.SetManyRequest.Entry(key="bad\n", value=make_value(2))]),
        }
        for reason, refuse in cases.items():
            with self.subTest(reason):
                k = self.key("kept")
                v0 = self.call("Set", key=k, value=make_value("before")).version
                before = self.snapshot(k)
                rid = "rid-" + uuid.uuid4().hex
                self.check_no_trace(k, before, v0, rid, lambda: refuse(k, rid), reason,
                                    grpc.StatusCode.INVALID_ARGUMENT)

    def test_memory_refusals_leave_no_trace(self):
        self.node()
        crit = self.mem()["criticalBytes"]
        # room for a small write (with its remembered outcome), not a big one
        self.fill_to(crit - 3000)
        for method in ("Set", "Add", "SetMany"):
            with self.subTest(method):
                k = self.key("kept")
                free = crit - self.used()
                v0 = self.call("Set", key=k, value=make_value(b"s" * 10)).version
                before = self.snapshot(k)
                rid = "rid-" + uuid.uuid4().hex
                if method == "Set":
                    refuse = lambda: self.call("Set", key=k, value=make_value(b"L" * 8000), request_id=rid)  # noqa
                elif method == "Add":
                    refuse = lambda: self.call("Add", key="absent-" + k, value=make_value(b"L" * 8000),  # noqa
                                               request_id=rid)
                else:
                    refuse = lambda: self.call("SetMany", request_id=rid, entries=[  # noqa
                        self.pb.cache.SetManyRequest.Entry(key=k, value=make_value(b"L" * 4000)),
                        self.pb.cache.SetManyRequest.Entry(key="x" + k, value=make_value(b"L" * 4000))])
                nk = self.check_no_trace(k, before, v0, rid, refuse, "MEMORY_PRESSURE", RE)
                # make room again for the next case (the remembered outcome
                # of the request_id stays)
                self.call("Remove", key=k)
                self.call("Remove", key=nk)
                self.assertGreaterEqual(crit - self.used(), free - 400)


if __name__ == "__main__":
    main()
