"""Grants and tenant quotas on a cluster: Debian's etcd and three dreyd.

* The owner checks a forwarded call again, with the caller's token: a node
  whose own policy grants a call still gets the owner's refusal (relayed
  unchanged, NOT_PERMITTED) when the owner's policy does not grant it: for
  single-key calls, GetMany's scattered parts, Scan and Clear reaching every
  node, and a Pipeline's operations.
* The owner checks a cluster Watch again too: the ingress subscribes at each
  owner with the caller's token, the owner verifies it with its own keys
  (a token it does not know: UNAUTHENTICATED) and asks its own policy for
  watch on the keys, the prefix or the whole cache; its refusal ends the
  client's watch with the owner's status (PERMISSION_DENIED NOT_PERMITTED,
  counted and listed on the owner), and a watch both grant sees its events.
* A tenant's quota holds for the sum of its bytes on the partitions'
  primaries: a tenant writing through every node at once is refused
  TENANT_MEMORY_QUOTA once the cluster holds its quota, and the primaries'
  bytes add up to at most the quota. The nodes' shares are in etcd under
  <prefix>tenants/<tenant>.
"""

import json
import os
import threading

import grpc

from drey_cluster import Cluster, metric, partition
from drey_harness import DreyTestCase, RpcFailure, main, make_value
from drey_tokens import KeyDir, bearer, details, mint, poll, write_atomic

DENIED = grpc.StatusCode.PERMISSION_DENIED
RPC_TIMEOUT = 30
QUOTA = 60000

OPEN = {
    "roles": {"all": [{"caches": ["*"], "keys": ["*"],
                       "verbs": ["read", "write", "delete", "scan", "watch", "clear", "admin"]}]},
    "bindings": [{"claim": "role", "equals": "app", "roles": ["all"]}],
    "tenants": {"claim": "tenant", "maxBytes": {"acme": QUOTA}},
}
STRICT = {
    "roles": {"some": [{"caches": ["*"], "keys": ["ok:*"], "verbs": ["read", "write", "delete", "watch"]}]},
    "bindings": [{"claim": "role", "equals": "app", "roles": ["some"]}],
    "tenants": {"claim": "tenant", "maxBytes": {"acme": QUOTA}},
}


class ClusterAuthzTest(DreyTestCase):
    SERVER_FLAGS = None

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.keys = KeyDir()
        cls.key = cls.keys.rsa("k1")
        cls.token = mint(cls.key, sub="app-1", role="app", tenant="acme")

    def policy_file(self, name, policy):
        path = os.path.join(self.keys.base, name)
        write_atomic(path, json.dumps(policy))
        return path

    def call(self, node, method, **fields):
        fn, req_cls, _ = node.cache.methods[method]
        return fn(req_cls(**fields), metadata=bearer(self.token), timeout=RPC_TIMEOUT)

    def test_the_owner_checks_forwarded_calls_again(self):
        open_path, strict_path = self.policy_file("open.json", OPEN), self.policy_file("strict.json", STRICT)
        base = ("--jwt-keys-dir=" + self.keys.path,)
        with Cluster(partitions=8, initial_nodes=2, extra_flags=base) as cl:
            ingress = cl.start_node("n1", flags=["--authz-policy=" + open_path])
            owner = cl.start_node("n2", flags=["--authz-policy=" + strict_path])
            owners = cl.agreed_owners([ingress, owner])
            # A key of each node's, under the strict policy's pattern and not.
            def key_on(node_id, prefix):
                for i in range(10000):
                    k = "%s%d" % (prefix, i)
                    if cl.owner_of(owners, k) == node_id:
                        return k
            theirs, theirs_ok, mine = key_on("n2", "no:"), key_on("n2", "ok:"), key_on("n1", "no:")
            self.call(ingress, "Set", key=mine, value=make_value("v"))  # n1 owns it: its own policy
            self.call(ingress, "Set", key=theirs_ok, value=make_value("v"))
            with self.assertRpcError(DENIED, "NOT_PERMITTED", metadata={"verb": "write", "cache": "default"},
                                     secret=theirs):
                self.call(ingress, "Set", key=theirs, value=make_value("v"))
            with self.assertRpcError(DENIED, "NOT_PERMITTED", metadata={"verb": "read"}):
                self.call(ingress, "GetMany", keys=[mine, theirs])  # the owner's part is refused
            got = self.call(ingress, "GetMany", keys=[mine, theirs_ok])
            self.assertEqual([r.found for r in got.results], [True, True])
            with self.assertRpcError(DENIED, "NOT_PERMITTED", metadata={"verb": "clear"}):
                self.call(ingress, "Clear")  # every node's share: n2 refuses its own
            self.assertTrue(self.call(ingress, "Get", key=theirs_ok).found)
            # A scan walks the owners one after another: n2's page is refused.
            with self.assertRpcError(DENIED, "NOT_PERMITTED", metadata={"verb": "scan"}):
                cursor = ""
                for _ in range(100):
                    cursor = self.call(ingress, "Scan", cursor=cursor).next_cursor
                    if not cursor:
                        break

            p = self.pb.cache
            ops = [p.PipelineOperation(id=1, set=p.SetRequest(key=theirs, value=make_value("x"))),
                   p.PipelineOperation(id=2, get=p.GetRequest(key=theirs_ok))]
            results = []
            for resp in ingress.cache.Pipeline(iter([p.PipelineRequest(operations=ops)]),
                                               metadata=bearer(self.token), timeout=RPC_TIMEOUT):
                results += list(resp.results)
            self.assertEqual([r.status.code for r in results], [DENIED.value[0], 0])
            self.assertTrue(results[1].get.found)

            denials = details(owner.server)["authz"]["lastDenials"]
            self.assertIn(("write", "/drey.cache.v1.Cache/Set"), [(d["verb"], d["method"]) for d in denials])
            self.assertEqual({d["principal"] for d in denials}, {"jwt:app-1"}, "the caller, not the forwarding node")

    def test_the_owner_checks_a_watch_again(self):
        open_path, strict_path = self.policy_file("open-w.json", OPEN), self.policy_file("strict-w.json", STRICT)
        # The ingress knows a key the owner does not.
        both = KeyDir()
        both.install(self.key)
        stranger = mint(both.rsa("k2"), sub="app-2", role="app")
        with Cluster(partitions=8, initial_nodes=2) as cl:
            ingress = cl.start_node("n1", flags=["--jwt-keys-dir=" + both.path, "--authz-policy=" + open_path])
            owner = cl.start_node("n2", flags=["--jwt-keys-dir=" + self.keys.path, "--authz-policy=" + strict_path])
            owners = cl.agreed_owners([ingress, owner])

            def key_on(node_id, prefix):
                return next(k for k in ("%s%d" % (prefix, i) for i in range(10000))
                            if cl.owner_of(owners, k) == node_id)
            theirs, theirs_ok, mine_ok = key_on("n2", "no:"), key_on("n2", "ok:"), key_on("n1", "ok:")

            def watch(token=self.token, timeout=RPC_TIMEOUT, **fields):
                fn, req_cls, _ = ingress.cache.methods["Watch"]
                return fn(req_cls(**fields), metadata=bearer(token), timeout=timeout)

            # Refused by the owner: a key of its own, a key of each node's
            # (the whole watch), the whole cache. Without the owner's check
            # they would be served.
            for fields in ({"keys": [theirs]}, {"keys": [mine_ok, theirs]}, {}):
                with self.assertRpcError(DENIED, "NOT_PERMITTED", secret=theirs,
                                         metadata={"verb": "watch", "cache": "default",
                                                   "method": "/drey.cache.v1.Cache/Watch"}):
                    list(watch(timeout=10, **fields))
            # A token the ingress accepts and the owner does not know.
            with self.assertRpcError(grpc.StatusCode.UNAUTHENTICATED, "TOKEN_UNKNOWN_KEY"):
                list(watch(token=stranger, timeout=10, keys=[theirs_ok]))

            # Both grant it: the owner's events arrive, and the ingress's own.
            kind = self.pb.cache.WatchEvent.Kind
            stream = watch(prefix="ok:")
            try:
                self.assertEqual(next(stream).kind, kind.Value("WATCHING"))
                self.call(ingress, "Set", key=theirs_ok, value=make_value("w1"))
                self.call(ingress, "Set", key=mine_ok, value=make_value("w2"))
                seen = set()
                while seen != {theirs_ok, mine_ok}:
                    ev = next(stream)
                    if ev.kind == kind.Value("SET"):
                        seen.add(ev.key)
            finally:
                stream.cancel()

            # The owner refused and counted them; the ingress granted them.
            self.assertGreaterEqual(metric(owner, "drey_authz_denied_total", 'verb="watch"'), 3)
            self.assertEqual(metric(ingress, "drey_authz_denied_total", 'verb="watch"'), 0)
            denials = [d for d in details(owner.server)["authz"]["lastDenials"] if d["verb"] == "watch"]
            self.assertEqual([(d["principal"], d["method"]) for d in denials],
                             [("jwt:app-1", "/drey.cache.v1.Cache/Watch")])

    def test_the_owner_verifies_a_pipelines_token_again(self):
        """A token the ingress accepts and the owner does not know: the
        Pipeline operations the owner runs are refused there, each in its
        place, and the ingress's own are answered."""
        both = KeyDir()
        both.install(self.key)
        stranger = mint(both.rsa("k2"), sub="app-2", role="app")
        with Cluster(partitions=8, initial_nodes=2) as cl:
            ingress = cl.start_node("n1", flags=["--jwt-keys-dir=" + both.path])
            owner = cl.start_node("n2", flags=["--jwt-keys-dir=" + self.keys.path])
            owners = cl.agreed_owners([ingress, owner])
            keys = ["pipe%d" % i for i in range(40)]
            theirs = [k for k in keys if cl.owner_of(owners, k) == "n2"]
            self.assertTrue(theirs and len(theirs) < len(keys), owners)
            p = self.pb.cache
            ops = [p.PipelineOperation(id=i, set=p.SetRequest(key=k, value=make_value("v")))
                   for i, k in enumerate(keys)]
            results = []
            for resp in ingress.cache.Pipeline(iter([p.PipelineRequest(operations=ops)]),
                                               metadata=bearer(stranger), timeout=RPC_TIMEOUT):
                results += list(resp.results)
            self.assertEqual([r.id for r in results], list(range(len(keys))))
            unauthenticated = grpc.StatusCode.UNAUTHENTICATED.value[0]
            self.assertEqual([r.status.code for r in results],
                             [unauthenticated if k in theirs else 0 for k in keys])
            info = self.pb.error_details.ErrorInfo()
            refused = results[keys.index(theirs[0])].status
            self.assertTrue(any(d.Unpack(info) for d in refused.details if d.Is(info.DESCRIPTOR)))
            self.assertEqual(info.reason, "TOKEN_UNKNOWN_KEY")

    def test_a_tenants_quota_holds_across_the_cluster(self):
        open_path = self.policy_file("open-quota.json", OPEN)
        with Cluster(partitions=16, initial_nodes=3,
                     extra_flags=("--jwt-keys-dir=" + self.keys.path, "--authz-policy=" + open_path)) as cl:
            nodes = cl.start(3)
            cl.agreed_owners(nodes)
            refusals = []
            lock = threading.Lock()

            def writer(node, tag):
                mine = 0
                for i in range(1000):
                    try:
                        self.call(node, "Set", key="%s-%d" % (tag, i), value=make_value(b"x" * 500))
                    except grpc.RpcError as e:
                        f = RpcFailure(e)
                        if f.reason != "TENANT_MEMORY_QUOTA":
                            raise
                        with lock:
                            refusals.append(f)
                        mine += 1
                        if mine >= 10:
                            return
            threads = [threading.Thread(target=writer, args=(n, "w%s-%d" % (n.id, k))) for n in nodes for k in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertTrue(refusals, "the tenant was never refused")
            f = refusals[0]
            self.assertEqual(f.metadata["limitBytes"], str(QUOTA))
            self.assertEqual([v.subject for v in f.quota_failure.violations], ["tenant:acme"])

            def primaries_bytes():
                total = 0
                for n in nodes:
                    ten = details(n.server)["tenants"]
                    total += sum(t["usedBytes"] for t in ten["top"] if t["tenant"] == "acme")
                return total
            used = primaries_bytes()
            self.assertLessEqual(used, QUOTA, "the primaries hold at most the quota")
            self.assertGreater(used, QUOTA * 7 // 10, "most of the quota was usable")
            # The shares in etcd add up to at most the quota too.
            import subprocess
            got = subprocess.run(["etcdctl", "--endpoints=" + cl.etcd.url, "get", cl.prefix + "tenants/acme",
                                  "--print-value-only"], capture_output=True, text=True, timeout=30,
                                 env=dict(os.environ, ETCDCTL_API="3"))
            shares = json.loads(got.stdout)
            self.assertLessEqual(sum(s["g"] for s in shares.values()), QUOTA, shares)
            self.assertEqual(set(shares), {"n1", "n2", "n3"})


if __name__ == "__main__":
    main()
