"""Tenant memory quotas (the policy's tenants section), on one node.

* A tenant is the tenants.claim of the caller's token; a write that would
  take the tenant's entries past maxBytes ("*" for tenants not named) is
  refused RESOURCE_EXHAUSTED TENANT_MEMORY_QUOTA with ErrorInfo limitBytes,
  usedBytes, requestBytes, QuotaFailure tenant:<id> and RetryInfo, before
  the journal: no record, no version consumed, no remembered outcome.
* A tenant's bytes follow its entries: stored, replaced by itself or by
  another tenant, removed, expired and swept, evicted; and they are the same
  after a restart (journal replay, and a snapshot then replay).
* With an eviction policy a tenant over its quota evicts its own entries,
  and under node memory pressure a tenant's write evicts the tenant's own
  entries first.
* Readiness and metrics show the top tenants' bytes and quotas and one
  "other" row (bounded cardinality).
"""

import json
import os

import grpc

from drey_harness import CACHE_SERVICE, DreyServer, DreyTestCase, RpcFailure, ServiceClient, main, make_value
from drey_tokens import KeyDir, bearer, details, http_get, mint, ops_port, poll, write_atomic

QUOTA = 20000
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED
RPC_TIMEOUT = 30

POLICY = {
    "roles": {"rw": [{"caches": ["*"], "keys": ["*"],
                      "verbs": ["read", "write", "delete", "scan", "clear", "admin"]}]},
    "bindings": [{"claim": "role", "equals": "rw", "roles": ["rw"]}],
    "tenants": {"claim": "tenant", "maxBytes": {"acme": QUOTA, "big": 10 << 20, "*": 8 * QUOTA}},
}


class Node:
    """A node with keys and the policy; tokens per tenant."""

    def __init__(self, test, *flags, data_dir=None):
        self.keys = KeyDir()
        self.key = self.keys.rsa("k1")
        self.policy = os.path.join(self.keys.base, "policy.json")
        write_atomic(self.policy, json.dumps(POLICY))
        self.flags = ["--jwt-keys-dir=" + self.keys.path, "--authz-policy=" + self.policy,
                      "--ops-listen=127.0.0.1:0", "--expiry-sweep-interval=20ms"] + list(flags)
        # Its own data directory, kept across restart().
        self.flags.append("--data-dir=" + (data_dir or os.path.join(self.keys.base, "data")))
        self.test = test
        self.tokens = {}
        self.start()

    def start(self):
        self.server = self.test.start_server(*self.flags)
        self.cache = ServiceClient(self.server.channel(), self.test.pb.cache, CACHE_SERVICE)
        self.admin = ServiceClient(self.server.channel(), self.test.pb.admin, "drey.admin.v1.Admin")

    def restart(self):
        self.server.stop()
        self.start()

    def token(self, tenant):
        if tenant not in self.tokens:
            extra = {"tenant": tenant} if tenant is not None else {}
            self.tokens[tenant] = mint(self.key, sub="svc-%s" % tenant, role="rw", **extra)
        return self.tokens[tenant]

    def call(self, tenant, method, **fields):
        fn, req_cls, _ = self.cache.methods[method]
        return fn(req_cls(**fields), metadata=bearer(self.token(tenant)), timeout=RPC_TIMEOUT)

    def set(self, tenant, key, size, **fields):
        return self.call(tenant, "Set", key=key, value=make_value(b"x" * size), **fields)

    def tenants(self):
        return details(self.server)["tenants"]

    def used(self, tenant):
        for t in self.tenants()["top"]:
            if t["tenant"] == tenant:
                return t["usedBytes"]
        return 0

    def fill(self, tenant, size=1000, prefix="k"):
        """Writes until the tenant's quota refuses one; returns the refusal
        and the keys written."""
        written = []
        for i in range(10000):
            key = "%s%05d" % (prefix, i)
            try:
                self.set(tenant, key, size)
            except grpc.RpcError as e:
                return RpcFailure(e), written
            written.append(key)
        raise AssertionError("no refusal after 10000 writes")


def entry_bytes(cache, key, value_len):
    """drey_store_entry_bytes: the entry's allocation (header, cache, key,
    value) and its share of the bucket array."""
    return 44 + len(cache) + len(key) + value_len + 8


class QuotaTest(DreyTestCase):
    SERVER_FLAGS = None

    def test_a_write_past_the_quota_is_refused_and_leaves_no_trace(self):
        n = Node(self)
        f, written = n.fill("acme")
        self.assertRpcFailure(f, EXHAUSTED, "TENANT_MEMORY_QUOTA")
        self.assertEqual(f.metadata["limitBytes"], str(QUOTA))
        used = int(f.metadata["usedBytes"])
        self.assertEqual(used, sum(entry_bytes("", k, 1000) for k in written), "usedBytes: the tenant's accounted bytes")
        self.assertGreater(used + int(f.metadata["requestBytes"]), QUOTA)
        self.assertLessEqual(used, QUOTA)
        self.assertEqual([v.subject for v in f.quota_failure.violations], ["tenant:acme"])
        self.assertGreater(f.retry_info.retry_delay.ToMilliseconds(), 0)
        self.assertEqual(n.used("acme"), used)

        lsn = details(n.server)["journal"]["lastLsn"]
        before = n.call("big", "Set", key="probe", value=make_value("p")).version
        with self.assertRpcError(EXHAUSTED, "TENANT_MEMORY_QUOTA"):
            n.set("acme", "refused", 1000, request_id="rid-1")
        self.assertEqual(details(n.server)["journal"]["lastLsn"], lsn + 1, "only the probe was journaled")
        self.assertEqual(n.call("big", "Set", key="probe", value=make_value("p")).version, before + 1,
                         "no version consumed")
        self.assertFalse(n.call("acme", "Get", key="refused").found)
        # Room made, the same request_id applies (it was never remembered).
        n.call("acme", "Remove", key=written[0])
        n.call("acme", "Remove", key=written[1])
        n.set("acme", "refused", 1000, request_id="rid-1")
        self.assertTrue(n.call("acme", "Get", key="refused").found)
        t = n.tenants()
        self.assertEqual(t["claim"], "tenant")
        acme = [x for x in t["top"] if x["tenant"] == "acme"][0]
        self.assertEqual(acme["limitBytes"], QUOTA)
        self.assertGreaterEqual(acme["refusedWrites"], 2)

    def test_a_tenantless_caller_is_bounded_only_by_the_node(self):
        n = Node(self)
        for i in range(40):
            n.set(None, "free%d" % i, 1000)
        self.assertEqual(n.tenants()["tenants"], 0)

    def test_bytes_follow_the_entries(self):
        n = Node(self)
        b = entry_bytes("c", "k1", 100)
        n.set("acme", "k1", 100, cache="c")
        self.assertEqual(n.used("acme"), b)
        n.set("acme", "k1", 300, cache="c")  # replaced by its own tenant: the difference
        self.assertEqual(n.used("acme"), entry_bytes("c", "k1", 300))
        n.set("beta", "k1", 50, cache="c")  # another tenant takes it over
        self.assertEqual(n.used("acme"), 0)
        self.assertEqual(n.used("beta"), entry_bytes("c", "k1", 50))
        n.call("acme", "Increment", key="n", cache="c", delta=1)
        self.assertEqual(n.used("acme"), entry_bytes("c", "n", 8))
        n.call("beta", "Remove", key="n", cache="c")  # removed by another: its owner's bytes go
        self.assertEqual(n.used("acme"), 0)
        n.set("acme", "short", 10, cache="c", ttl={"nanos": 100 * 1000000})
        self.assertGreater(n.used("acme"), 0)
        poll(lambda: n.used("acme"), lambda u: u == 0, what="the expired entry swept from acme's bytes")
        n.call("acme", "SetMany", cache="d", entries=[
            self.pb.cache.SetManyRequest.Entry(key="m%d" % i, value=make_value(b"y" * 10)) for i in range(3)])
        self.assertEqual(n.used("acme"), 3 * entry_bytes("d", "m0", 10))
        n.call("beta", "RemoveMany", cache="d", keys=["m0", "m1"])
        self.assertEqual(n.used("acme"), entry_bytes("d", "m2", 10))
        n.call("acme", "Clear", cache="d")
        poll(lambda: n.used("acme"), lambda u: u == 0, what="a cleared cache's entries swept")

    def test_bytes_survive_a_restart_replay_and_snapshot(self):
        n = Node(self)
        for i in range(5):
            n.set("acme", "a%d" % i, 500)
            n.set("beta", "b%d" % i, 700)
        n.call("beta", "Remove", key="b0")
        n.set("beta", "a1", 10)  # changes hands
        want = (n.used("acme"), n.used("beta"))
        n.restart()  # journal replay
        self.assertEqual((n.used("acme"), n.used("beta")), want)
        fn, req_cls, _ = n.admin.methods["Snapshot"]
        fn(req_cls(), metadata=bearer(n.token("acme")), timeout=RPC_TIMEOUT)
        n.set("acme", "after", 100)
        want = (n.used("acme"), n.used("beta"))
        n.restart()  # snapshot, then replay
        self.assertEqual((n.used("acme"), n.used("beta")), want)
        # ... and the quota counts them: acme is refused at the same point.
        f, _ = n.fill("acme", prefix="z")
        self.assertEqual(f.reason, "TENANT_MEMORY_QUOTA")


class EvictionTest(DreyTestCase):
    SERVER_FLAGS = None

    def test_over_its_quota_a_tenant_evicts_its_own_entries(self):
        n = Node(self, "--eviction=allkeys-lru")
        for i in range(5):
            n.set("beta", "beta%d" % i, 1000)
        for i in range(60):  # three times its quota
            n.set("acme", "acme%02d" % i, 1000)
        self.assertLessEqual(n.used("acme"), QUOTA)
        self.assertGreater(n.used("acme"), QUOTA // 2)
        self.assertTrue(n.call("acme", "Get", key="acme59").found)
        self.assertFalse(n.call("acme", "Get", key="acme00").found, "its least recently used went")
        for i in range(5):
            self.assertTrue(n.call("beta", "Get", key="beta%d" % i).found, "nobody else's entries go")
        # A single write larger than the quota cannot be made room for.
        with self.assertRpcError(EXHAUSTED, "TENANT_MEMORY_QUOTA"):
            n.set("acme", "huge", QUOTA + 1)

    def test_under_node_pressure_a_tenants_write_evicts_its_own_entries_first(self):
        n = Node(self, "--eviction=allkeys-lru", "--memory-limit=400KiB")
        i = 0
        while details(n.server)["memory"]["state"] == "normal":
            n.set(None, "neutral%04d" % i, 2000)
            i += 1
        for k in range(20):
            n.set("big", "big%02d" % k, 2000)
        before = details(n.server)["eviction"]["evictedEntries"]
        for k in range(40):
            n.set("big", "more%02d" % k, 2000)
        self.assertGreater(details(n.server)["eviction"]["evictedEntries"], before, "memory was short")
        for k in range(i):
            self.assertTrue(n.call(None, "Get", key="neutral%04d" % k).found,
                            "an entry of no tenant went while the writer's tenant had its own")


class VisibilityTest(DreyTestCase):
    SERVER_FLAGS = None

    def test_top_tenants_and_one_other_row(self):
        n = Node(self)
        for t in range(12):
            n.set("t%02d" % t, "k", 100 * (t + 1), cache="c%02d" % t)
        ten = n.tenants()
        self.assertEqual(ten["tenants"], 12)
        top = [x["tenant"] for x in ten["top"]]
        self.assertEqual(top, ["t%02d" % t for t in range(11, 1, -1)], "the 10 largest, largest first")
        self.assertEqual(ten["otherTenants"], 2)
        self.assertEqual(ten["other"]["usedBytes"], entry_bytes("c00", "k", 100) + entry_bytes("c01", "k", 200))
        self.assertEqual(ten["top"][0]["limitBytes"], 8 * QUOTA, "the \"*\" quota")
        code, _, body = http_get("127.0.0.1", ops_port(n.server), "/metrics")
        text = body.decode()
        self.assertIn('drey_tenant_used_bytes{tenant="t11"} %d' % entry_bytes("c11", "k", 1200), text)
        self.assertIn('drey_tenant_used_bytes{tenant="other"} %d' % ten["other"]["usedBytes"], text)
        self.assertIn('drey_tenant_limit_bytes{tenant="t11"} %d' % (8 * QUOTA), text)
        self.assertNotIn('tenant="t00"', text, "bounded: beyond the top 10 only the other row")
        self.assertIn("drey_tenants 12", text)


if __name__ == "__main__":
    main()
