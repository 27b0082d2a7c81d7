"""Who may do what (--authz-policy), through the real server and grpcio.

* A request is allowed when one role of its caller grants its verb on its
  cache and on every key it names; a refusal is PERMISSION_DENIED
  NOT_PERMITTED with ErrorInfo metadata verb, cache and method, and never the
  key or the value anywhere in the answer.
* Batches (GetMany, SetMany, RemoveMany) are checked whole before anything
  runs: a batch with one key not granted changes nothing.
* Each Pipeline operation is checked as it runs: a refused one gets its
  status in-band and the stream goes on.
* Scan needs scan on the cache and a key pattern covering its prefix (the
  whole cache: "*"); Watch needs watch on every key, on the prefix, or on the
  whole cache; Clear needs clear on the whole cache; the Admin service needs
  admin; ListCaches read on every cache.
* Refusals are in readiness details (last denials: principal, verb, cache,
  method, time, count) and counted by drey_authz_denied_total{verb}.
* The policy is reloaded when the file changes and on SIGHUP; one that does
  not load keeps the policy in force and says why (log, readiness details).
* Anonymous callers (a node without token keys) get the anonymous bindings'
  roles; without a policy every caller may do everything (the other tests).
"""

import json
import os
import signal
import time
import unittest

import grpc

from drey_harness import (ADMIN_SERVICE, CACHE_SERVICE, DreyTestCase, RpcFailure, ServiceClient, main, make_value,
                          protos)
from drey_tokens import KeyDir, bearer, details, http_get, mint, ops_port, poll, write_atomic

DENIED = grpc.StatusCode.PERMISSION_DENIED
RPC_TIMEOUT = 30

POLICY = {
    "roles": {
        "reader": [{"caches": ["users", "sess-*"], "keys": ["*"], "verbs": ["read"]}],
        "writer": [{"caches": ["users"], "keys": ["user:*"], "verbs": ["read", "write", "delete"]}],
        "scanner": [{"caches": ["users"], "keys": ["user:*"], "verbs": ["scan", "watch"]}],
        "ops": [{"caches": ["*"], "keys": ["*"],
                 "verbs": ["read", "write", "delete", "scan", "watch", "clear", "admin"]}],
        "prom": [{"verbs": ["metrics"]}],
    },
    "bindings": [
        {"claim": "sub", "equals": "ops-1", "roles": ["ops"]},
        {"claim": "groups", "contains": "cache-readers", "roles": ["reader"]},
        {"claim": "sub", "equals": "writer-1", "roles": ["writer", "scanner"]},
        {"claim": "sub", "equals": "prom", "roles": ["prom"]},
        {"anonymous": True, "roles": []},
    ],
}


def write_policy(path, policy):
    write_atomic(path, policy if isinstance(policy, str) else json.dumps(policy))


class AuthzCase(DreyTestCase):
    SERVER_FLAGS = None  # each class starts its own node

    @classmethod
    def start_node(cls, policy=POLICY, reload_interval="20ms", extra=()):
        cls.keys = KeyDir()
        cls.key = cls.keys.rsa("k1")
        cls.policy_path = os.path.join(cls.keys.base, "policy.json")
        write_policy(cls.policy_path, policy)
        from drey_harness import DreyServer
        cls.server = DreyServer("--jwt-keys-dir=" + cls.keys.path, "--authz-policy=" + cls.policy_path,
                                "--authz-reload-interval=" + reload_interval, "--ops-listen=127.0.0.1:0",
                                *extra).start()
        cls.channel = cls.server.channel()
        cls.cache = ServiceClient(cls.channel, cls.pb.cache, CACHE_SERVICE)
        cls.admin = ServiceClient(cls.channel, cls.pb.admin, ADMIN_SERVICE)
        cls.tok = {
            "ops": mint(cls.key, sub="ops-1"),
            "reader": mint(cls.key, sub="reader-1", groups=["staff", "cache-readers"]),
            "writer": mint(cls.key, sub="writer-1"),
            "nobody": mint(cls.key, sub="stranger"),
            "prom": mint(cls.key, sub="prom"),
        }

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.start_node()

    def as_(self, who, method, client=None, **fields):
        client = client or self.cache
        fn, req_cls, _ = client.methods[method]
        return fn(req_cls(**fields), metadata=bearer(self.tok[who]), timeout=RPC_TIMEOUT)

    def denied(self, who, method, verb, in_cache, client=None, secret=None, **fields):
        """The call is NOT_PERMITTED naming verb, cache and method, and no
        key or value of the request anywhere in the answer."""
        try:
            self.as_(who, method, client=client, **fields)
        except grpc.RpcError as e:
            f = RpcFailure(e)
        else:
            self.fail("%s %s: expected NOT_PERMITTED, the call succeeded" % (who, method))
        service = (client or self.cache).service_name
        self.assertRpcFailure(f, DENIED, "NOT_PERMITTED", secret=secret,
                              metadata={"verb": verb, "cache": in_cache, "method": "/%s/%s" % (service, method)})
        self.assertEqual(sorted(f.details), ["ErrorInfo"])
        self.assertEqual(sorted(f.metadata), ["cache", "method", "verb"])
        return f

    def ops_get(self, key, cache):
        return self.as_("ops", "Get", key=key, cache=cache)


class GrantsTest(AuthzCase):
    def test_the_reader_reads_its_caches_and_nothing_else(self):
        self.as_("ops", "Set", key="u1", cache="users", value=make_value("v"))
        self.assertTrue(self.as_("reader", "Get", key="u1", cache="users").found)
        self.as_("reader", "Get", key="x", cache="sess-eu")
        self.as_("reader", "GetExpiration", key="u1", cache="users")
        self.denied("reader", "Get", "read", "orders", key="secret-key-123", cache="orders", secret="secret-key-123")
        self.denied("reader", "Set", "write", "users", key="u1", cache="users", value=make_value("the-value-xyz"),
                    secret="the-value-xyz")
        self.denied("reader", "Remove", "delete", "users", key="u1", cache="users")
        self.denied("reader", "Increment", "write", "users", key="n", cache="users", delta=1)
        self.assertTrue(self.ops_get("u1", "users").found, "refusals change nothing")

    def test_a_token_no_binding_names_may_do_nothing(self):
        self.denied("nobody", "Get", "read", "default", key="k")
        self.denied("nobody", "Get", "read", "users", key="k", cache="users")

    def test_the_writer_is_held_to_its_key_prefix(self):
        self.as_("writer", "Set", key="user:1", cache="users", value=make_value("a"))
        self.as_("writer", "Add", key="user:2", cache="users", value=make_value("a"))
        self.as_("writer", "Touch", key="user:1", cache="users", ttl={"seconds": 60})
        self.as_("writer", "Persist", key="user:1", cache="users")
        self.as_("writer", "Remove", key="user:2", cache="users")
        for method, fields in (("Set", {"value": make_value("a")}), ("Update", {"value": make_value("a")}),
                               ("GetOrAdd", {"value": make_value("a")}), ("Touch", {"ttl": {"seconds": 5}}),
                               ("Persist", {})):
            with self.subTest(method):
                self.denied("writer", method, "write", "users", key="admin:1", cache="users", secret="admin:1",
                            **fields)
        self.denied("writer", "Set", "write", "default", key="user:1", value=make_value("a"))

    def test_batches_are_checked_whole_before_anything_runs(self):
        self.as_("ops", "Set", key="admin:9", cache="users", value=make_value("keep"))
        self.as_("ops", "Set", key="user:9", cache="users", value=make_value("keep"))
        entries = [self.pb.cache.SetManyRequest.Entry(key=k, value=make_value("new")) for k in ("user:8", "admin:8")]
        self.denied("writer", "SetMany", "write", "users", cache="users", entries=entries, secret="admin:8")
        self.assertFalse(self.ops_get("user:8", "users").found, "the granted part of a refused batch did not run")
        self.denied("writer", "RemoveMany", "delete", "users", cache="users", keys=["user:9", "admin:9"])
        self.assertTrue(self.ops_get("user:9", "users").found)
        self.assertTrue(self.ops_get("admin:9", "users").found)
        self.denied("writer", "GetMany", "read", "users", cache="users", keys=["user:9", "admin:9"])
        got = self.as_("writer", "GetMany", cache="users", keys=["user:9", "user:8"])
        self.assertEqual([r.found for r in got.results], [True, False])
        self.as_("writer", "RemoveMany", cache="users", keys=["user:9"])
        self.assertFalse(self.ops_get("user:9", "users").found)

    def test_scan_needs_a_pattern_covering_its_prefix(self):
        self.as_("ops", "Set", key="user:s1", cache="users", value=make_value("a"))
        self.as_("ops", "Set", key="admin:s1", cache="users", value=make_value("a"))
        keys, cursor = [], ""
        while True:
            page = self.as_("writer", "Scan", cache="users", prefix="user:", cursor=cursor)
            keys += [i.key for i in page.items]
            cursor = page.next_cursor
            if not cursor:
                break
        self.assertIn("user:s1", keys)
        self.assertNotIn("admin:s1", keys)
        self.denied("writer", "Scan", "scan", "users", cache="users")  # the whole cache
        self.denied("writer", "Scan", "scan", "users", cache="users", prefix="use")
        self.denied("writer", "Scan", "scan", "orders", cache="orders", prefix="user:")
        self.denied("reader", "Scan", "scan", "users", cache="users", prefix="user:")
        self.as_("ops", "Scan", cache="users")

    def test_watch_needs_every_key_the_prefix_or_the_whole_cache(self):
        def first_event(who, **fields):
            call = self.cache.Watch(self.pb.cache.WatchRequest(cache="users", **fields),
                                    metadata=bearer(self.tok[who]), timeout=RPC_TIMEOUT)
            try:
                return next(call)
            finally:
                call.cancel()

        WATCHING = self.pb.cache.WatchEvent.WATCHING
        self.assertEqual(first_event("writer", keys=["user:1", "user:2"]).kind, WATCHING)
        self.assertEqual(first_event("writer", prefix="user:").kind, WATCHING)
        self.assertEqual(first_event("ops").kind, WATCHING)
        for fields in ({}, {"keys": ["user:1", "admin:1"]}, {"prefix": "us"}):
            with self.subTest(fields):
                try:
                    first_event("writer", **fields)
                except grpc.RpcError as e:
                    self.assertRpcFailure(RpcFailure(e), DENIED, "NOT_PERMITTED",
                                          metadata={"verb": "watch", "cache": "users",
                                                    "method": "/drey.cache.v1.Cache/Watch"})
                else:
                    self.fail("watch %r allowed" % (fields,))

    def test_clear_needs_clear_on_the_whole_cache(self):
        self.as_("ops", "Set", key="user:c", cache="cleared", value=make_value("a"))
        self.denied("writer", "Clear", "clear", "users", cache="users")
        self.as_("ops", "Clear", cache="cleared")
        self.assertFalse(self.ops_get("user:c", "cleared").found)

    def test_cache_figures(self):
        self.as_("writer", "GetCacheStats", cache="users")
        self.denied("writer", "GetCacheStats", "read", "orders", cache="orders")
        self.denied("writer", "ListCaches", "read", "")
        self.as_("ops", "ListCaches")

    def test_the_admin_service_needs_admin(self):
        self.as_("ops", "GetReadinessDetails", client=self.admin)
        self.denied("writer", "GetReadinessDetails", "admin", "", client=self.admin)
        self.denied("writer", "Snapshot", "admin", "", client=self.admin)
        self.as_("ops", "Snapshot", client=self.admin)

    def test_each_pipeline_operation_is_checked_as_it_runs(self):
        p = self.pb.cache
        ops = [
            p.PipelineOperation(id=1, set=p.SetRequest(cache="users", key="user:p", value=make_value("a"))),
            p.PipelineOperation(id=2, set=p.SetRequest(cache="users", key="admin:p", value=make_value("a"))),
            p.PipelineOperation(id=3, get=p.GetRequest(cache="users", key="user:p")),
            p.PipelineOperation(id=4, clear=p.ClearRequest(cache="users")),
            p.PipelineOperation(id=5, get=p.GetRequest(cache="users", key="user:p")),
        ]
        results = []
        for resp in self.cache.Pipeline(iter([p.PipelineRequest(operations=ops)]),
                                        metadata=bearer(self.tok["writer"]), timeout=RPC_TIMEOUT):
            results += list(resp.results)
        self.assertEqual([r.id for r in results], [1, 2, 3, 4, 5])
        codes = [r.status.code for r in results]
        self.assertEqual(codes, [0, DENIED.value[0], 0, DENIED.value[0], 0])
        from google.rpc import error_details_pb2
        ei = error_details_pb2.ErrorInfo()
        self.assertTrue(results[1].status.details[0].Unpack(ei))
        self.assertEqual((ei.reason, ei.metadata["verb"], ei.metadata["cache"]), ("NOT_PERMITTED", "write", "users"))
        self.assertNotIn("admin:p", str(results[1].status))
        self.assertTrue(results[4].get.found, "the stream went on and the refused Clear cleared nothing")
        self.assertFalse(self.ops_get("admin:p", "users").found)


class DenialsTest(AuthzCase):
    def test_denials_are_in_readiness_and_metrics(self):
        for _ in range(3):
            self.denied("reader", "Set", "write", "users", key="k-denied", cache="users", value=make_value("v"))
        self.denied("writer", "Clear", "clear", "users", cache="users")
        port = ops_port(self.server)
        d = details(self.server, port)["authz"]
        self.assertEqual(d["path"], self.policy_path)
        self.assertEqual(d["generation"], 1)
        self.assertEqual(d["roles"], 5)
        self.assertEqual(d["lastError"], "")
        self.assertGreaterEqual(d["deniedByVerb"]["write"], 3)
        last = d["lastDenials"]
        self.assertEqual(last[0]["principal"], "jwt:writer-1")
        self.assertEqual((last[0]["verb"], last[0]["cache"], last[0]["method"]),
                         ("clear", "users", "/drey.cache.v1.Cache/Clear"))
        mine = [x for x in last if x["principal"] == "jwt:reader-1" and x["verb"] == "write"]
        self.assertEqual(len(mine), 1)
        self.assertEqual(mine[0]["count"], 3)
        self.assertRegex(mine[0]["lastAt"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
        self.assertNotIn("k-denied", json.dumps(d), "keys never reach the denials")
        code, _, body = http_get("127.0.0.1", port, "/metrics")
        self.assertEqual(code, 200)
        text = body.decode()
        self.assertIn('drey_authz_denied_total{verb="clear"} 1', text)
        self.assertRegex(text, r'drey_authz_denied_total\{verb="write"\} [3-9]')
        self.assertIn("drey_authz_policy_generation 1", text)


class ReloadTest(AuthzCase):
    def test_a_changed_file_is_reloaded_and_a_bad_one_keeps_the_policy(self):
        self.denied("reader", "Set", "write", "users", key="r1", cache="users", value=make_value("v"))
        more = json.loads(json.dumps(POLICY))
        more["roles"]["reader"][0]["verbs"].append("write")
        write_policy(self.policy_path, more)

        def may_write():
            try:
                self.as_("reader", "Set", key="r1", cache="users", value=make_value("v"))
                return True
            except grpc.RpcError as e:
                if e.code() != DENIED:
                    raise
                return False
        poll(may_write, lambda ok: ok, what="the reloaded policy to grant write")
        port = ops_port(self.server)
        self.assertEqual(details(self.server, port)["authz"]["generation"], 2)

        write_policy(self.policy_path, '{"roles": {"reader": [{"caches": ["*"], "keys": ["*"], "verbs": ["reed"]}]}}')
        d = poll(lambda: details(self.server, port)["authz"], lambda a: a["lastError"] != "",
                 what="the failed reload in readiness")
        self.assertIn("not a verb", d["lastError"])
        self.assertEqual(d["reloadFailures"], 1)
        self.assertEqual(d["generation"], 2)
        self.assertTrue(may_write(), "the policy in force stays")
        self.server.wait_log(lambda r: r.get("msg", "").startswith("authz policy reload failed") and
                             "not a verb" in r.get("reason", ""), 10, what="the failed reload's log line")

        write_policy(self.policy_path, POLICY)
        poll(may_write, lambda ok: not ok, what="the original policy back")
        self.assertEqual(details(self.server, port)["authz"]["lastError"], "")


class SighupTest(AuthzCase):
    @classmethod
    def setUpClass(cls):
        DreyTestCase.setUpClass.__func__(cls)
        cls.start_node(reload_interval="1h")  # only SIGHUP reloads

    def test_sighup_reloads_the_policy(self):
        self.denied("reader", "Remove", "delete", "users", key="h", cache="users")
        more = json.loads(json.dumps(POLICY))
        more["roles"]["reader"][0]["verbs"].append("delete")
        write_policy(self.policy_path, more)
        time.sleep(0.2)  # not synchronisation: nothing may reload on its own meanwhile
        self.denied("reader", "Remove", "delete", "users", key="h", cache="users")
        self.server.signal(signal.SIGHUP)
        self.server.wait_log(lambda r: r.get("msg") == "authz policy reloaded" and r.get("trigger") == "reload", 10,
                             what="the reload")
        self.as_("reader", "Remove", key="h", cache="users")


class MetricsVerbTest(AuthzCase):
    """The ops listener from beyond loopback: the metrics verb, not an
    all-powerful token."""

    @classmethod
    def setUpClass(cls):
        DreyTestCase.setUpClass.__func__(cls)
        from test_ops import non_loopback_ipv4
        cls.ip = non_loopback_ipv4()
        if cls.ip is None:
            raise unittest.SkipTest("this machine has no non-loopback IPv4 address (hostname -I)")
        cls.start_node(extra=("--ops-listen=0.0.0.0:0",))

    def get(self, path, who=None, token=None):
        headers = {}
        if who is not None:
            headers["Authorization"] = "Bearer " + self.tok[who]
        elif token is not None:
            headers["Authorization"] = "Bearer " + token
        return http_get(self.ip, ops_port(self.server), path, headers=headers)[0]

    def test_details_and_metrics_need_the_metrics_verb(self):
        for path in ("/metrics", "/health/ready/details"):
            with self.subTest(path):
                self.assertEqual(self.get(path, "prom"), 200)
                self.assertEqual(self.get(path, "writer"), 403, "a valid token without the verb")
                self.assertEqual(self.get(path, "ops"), 403, "admin is not metrics")
                self.assertEqual(self.get(path), 403, "the anonymous bindings grant no metrics here")
                self.assertEqual(self.get(path, token="not-a-token"), 401)
                self.assertEqual(http_get("127.0.0.1", ops_port(self.server), path)[0], 200, "loopback: open")
        self.assertEqual(self.get("/health/ready"), 200, "health stays open")
        d = details(self.server)["authz"]
        self.assertGreaterEqual(d["deniedByVerb"]["metrics"], 6)
        self.assertIn("jwt:writer-1", [x["principal"] for x in d["lastDenials"] if x["verb"] == "metrics"])


class AnonymousTest(DreyTestCase):
    """A node without token keys: every caller is anonymous."""
    SERVER_FLAGS = None

    def test_anonymous_callers_get_the_anonymous_bindings_roles(self):
        keys = KeyDir()  # only for a private directory
        path = os.path.join(keys.base, "anon.json")
        write_policy(path, {"roles": {"pub": [{"caches": ["public"], "keys": ["*"], "verbs": ["read", "write"]}]},
                            "bindings": [{"anonymous": True, "roles": ["pub"]}]})
        srv = self.start_server("--authz-policy=" + path)
        cache = ServiceClient(srv.channel(), self.pb.cache, CACHE_SERVICE)
        cache.Set(self.pb.cache.SetRequest(cache="public", key="k", value=make_value("v")), timeout=RPC_TIMEOUT)
        self.assertTrue(cache.Get(self.pb.cache.GetRequest(cache="public", key="k"), timeout=RPC_TIMEOUT).found)
        with self.assertRpcError(DENIED, "NOT_PERMITTED", metadata={"verb": "read", "cache": "default"}):
            cache.Get(self.pb.cache.GetRequest(key="k"), timeout=RPC_TIMEOUT)

    def test_a_policy_that_does_not_load_stops_the_start(self):
        keys = KeyDir()
        path = os.path.join(keys.base, "bad.json")
        write_policy(path, '{"bindings": [{"claim": "sub", "equals": "x", "roles": ["missing"]}]}')
        from drey_harness import DreyServer
        srv = DreyServer("--authz-policy=" + path).spawn()
        self.assertEqual(srv.wait(), 2)
        self.assertIn("no such role", srv.log_text())
        self.assertIn("bindings[0].roles[0]", srv.log_text())


if __name__ == "__main__":
    main()
