"""The operators' HTTP listener, through curl (Debian's) and promtool.

* /health/live, /health/ready, /health/ready/details (JSON) and /metrics
  (Prometheus text) answer from loopback without a token; /health/ready is
  503 while the node drains, /health/live stays 200.
* The details document has every field of drey.admin.v1.ReadinessDetails
  (docs/operations.md's "same details"), in lowerCamelCase with 64-bit integers as
  numbers, and agrees with Admin/GetReadinessDetails over gRPC.
* /metrics passes `promtool check metrics` after traffic that fills every
  family (refusals and per-principal figures included), and its figures
  follow what was done.
* From a non-loopback address (this machine's own, the ops port bound to
  0.0.0.0) details and metrics need a bearer token the node's keys verify;
  a node without keys refuses them to remote callers outright; the health
  endpoints stay open.
"""

import importlib
import json
import shutil
import signal
import socket
import subprocess
import unittest

import grpc
from google.protobuf import descriptor as pbd

from drey_harness import CACHE_SERVICE, DreyTestCase, ServiceClient, main, make_value, protos
from drey_tokens import KeyDir, bearer, mint, ops_port, poll

RPC_TIMEOUT = 30


def curl(url, *args, method=None):
    """(HTTP status, Content-Type, body text) through curl."""
    cmd = ["curl", "-sS", "--max-time", "30", "-o", "-", "-w", "\n%{http_code} %{content_type}"]
    if method:
        cmd += ["-X", method]
    r = subprocess.run(cmd + list(args) + [url], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError("curl %s failed (%d): %s" % (url, r.returncode, r.stderr))
    body, _, tail = r.stdout.rpartition("\n")
    code, _, ctype = tail.partition(" ")
    return int(code), ctype, body


def non_loopback_ipv4():
    """An IPv4 address of this machine that is not loopback, or None."""
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for a in out.split():
        if "." in a and not a.startswith("127."):
            try:
                socket.inet_aton(a)
            except OSError:
                continue
            return a
    return None


_admin = None


def admin_pb2():
    """drey.admin.v1 generated next to the harness's stubs."""
    global _admin
    if _admin is None:
        p = protos()
        if getattr(p, "admin", None) is not None:  # a harness that makes it already
            _admin = p.admin
            return _admin
        r = subprocess.run(["protoc", "--python_out=" + p.dir, "-I" + p.proto_dir, "-I/usr/include",
                            "drey/admin/v1/admin.proto"], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("protoc admin.proto: " + r.stderr)
        importlib.invalidate_caches()
        _admin = importlib.import_module("drey.admin.v1.admin_pb2")
    return _admin


def expected_shape(desc):
    """The JSON shape of a message: {jsonName: shape}, where a shape is a
    nested dict, "map", or the Python type of a scalar."""
    out = {}
    for f in desc.fields:
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            out[f.json_name] = "map"
        elif f.type == pbd.FieldDescriptor.TYPE_MESSAGE:
            out[f.json_name] = expected_shape(f.message_type)
        elif f.type == pbd.FieldDescriptor.TYPE_BOOL:
            out[f.json_name] = bool
        elif f.type == pbd.FieldDescriptor.TYPE_STRING:
            out[f.json_name] = str
        else:
            out[f.json_name] = int
    return out


class OpsCase(DreyTestCase):
    SERVER_FLAGS = None

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.kd = KeyDir()
        cls.hs = cls.kd.hmac("ops")
        cls.other = KeyDir().hmac("ops")  # the same kid, another secret

    def node(self, *flags, keys=True, ops="127.0.0.1:0", **kw):
        args = ["--ops-listen=" + ops, "--node-id=ops-node"] + list(flags)
        if keys:
            args.append("--jwt-keys-dir=" + self.kd.path)
        srv = self.start_server(*args, **kw)
        self.ops = ops_port(srv)
        self.cache = ServiceClient(srv.channel(), self.pb.cache, CACHE_SERVICE)
        return srv

    def url(self, path, host="127.0.0.1"):
        return "http://%s:%d%s" % (host, self.ops, path)

    def get_details(self, host="127.0.0.1", *args):
        code, ctype, body = curl(self.url("/health/ready/details", host), *args)
        self.assertEqual(code, 200, body)
        self.assertEqual(ctype, "application/json")
        return json.loads(body)


class EndpointsTest(OpsCase):

    def test_live_ready_and_unknown_paths(self):
        self.node()
        self.assertEqual(curl(self.url("/health/live")), (200, "text/plain", "ok\n"))
        self.assertEqual(curl(self.url("/health/ready")), (200, "text/plain", "ready\n"))
        self.assertEqual(curl(self.url("/nope"))[0], 404)
        self.assertEqual(curl(self.url("/health/live"), method="POST")[0], 405)
        self.assertEqual(curl(self.url("/metrics"), method="DELETE")[0], 405)
        code, _, _ = curl(self.url("/health/ready"), "-I")  # HEAD
        self.assertEqual(code, 200)

    def test_a_client_speaking_http2_to_the_ops_port_is_answered_and_logged_as_json(self):
        """A gRPC client dialling the wrong port (a cluster member's old
        address reused by this listener, say) sends HTTP/2's preface: the
        listener answers 505 and says so in a JSON line, never bare text
        on stderr (the harness checks every line when the node stops)."""
        srv = self.node()
        with socket.create_connection(("127.0.0.1", self.ops), timeout=10) as sk:
            sk.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            self.assertIn(b" 505 ", sk.recv(4096))
        srv.wait_log(lambda r: r.get("msg") == "ops listener" and "HTTP version" in r.get("detail", ""), 10,
                     what="the listener's complaint as a JSON line")
        srv.stop()

    def test_details_have_every_field_of_the_readiness_document(self):
        self.node()
        tok = mint(self.hs, sub="ops")
        self.cache.Set(self.pb.cache.SetRequest(key="k", value=make_value(b"x" * 100)), metadata=bearer(tok),
                       timeout=RPC_TIMEOUT)
        with self.assertRpcError(grpc.StatusCode.UNAUTHENTICATED, "TOKEN_MISSING"):
            self.cache.Get(self.pb.cache.GetRequest(key="k"), timeout=RPC_TIMEOUT)
        d = self.get_details()
        want = expected_shape(admin_pb2().ReadinessDetails.DESCRIPTOR)
        # A single node has no cluster section (test_cluster checks it there),
        # and a node without --authz-policy no authz or tenants section
        # (test_authz and test_tenant_quota check them).
        for section in ("cluster", "authz", "tenants"):
            self.assertIsNone(d.pop(section), section)
            del want[section]

        def check(obj, shape, where):
            self.assertIsInstance(obj, dict, where)
            self.assertEqual(sorted(obj), sorted(shape), "fields of %s" % where)
            for k, t in shape.items():
                v = obj[k]
                if isinstance(t, dict):
                    check(v, t, where + "." + k)
                elif t == "map":
                    self.assertIsInstance(v, dict, where + "." + k)
                    for mk, mv in v.items():
                        self.assertIsInstance(mv, int, "%s.%s[%s]" % (where, k, mk))
                elif t is int:
                    self.assertTrue(isinstance(v, int) and not isinstance(v, bool),
                                    "%s.%s is %r, not a number" % (where, k, v))
                else:
                    self.assertIsInstance(v, t, "%s.%s" % (where, k))
        check(d, want, "details")
        # what the figures say
        self.assertIs(d["ready"], True)
        self.assertEqual(d["recovery"]["state"], "done")
        self.assertEqual(d["journal"]["fsyncPolicy"], "always")
        self.assertEqual(d["journal"]["lastLsn"], 1)
        self.assertIs(d["journal"]["failed"], False)
        self.assertGreater(d["memory"]["usedBytes"], 100)
        self.assertEqual(d["memory"]["state"], "normal")
        self.assertTrue(d["memory"]["jemallocAllocatedBytes"] == -1 or d["memory"]["jemallocAllocatedBytes"] > 0)
        self.assertEqual(set(d["backpressure"]["rejectionsByReason"]),
                         {"NODE_RATE_LIMIT", "PRINCIPAL_RATE_LIMIT", "PRINCIPAL_CONCURRENCY_LIMIT", "QUEUE_FULL",
                          "QUEUE_TIMEOUT", "DEADLINE_EXCEEDED"})
        self.assertEqual(d["compaction"]["state"], "idle")
        # the same document over gRPC (with a token: admin calls need one)
        adm = admin_pb2()
        call = self.server_channel().unary_unary(
            "/drey.admin.v1.Admin/GetReadinessDetails",
            request_serializer=adm.GetReadinessDetailsRequest.SerializeToString,
            response_deserializer=adm.ReadinessDetails.FromString)
        g = call(adm.GetReadinessDetailsRequest(), metadata=bearer(tok), timeout=RPC_TIMEOUT)
        self.assertEqual(g.ready, d["ready"])
        self.assertEqual(g.memory.limit_bytes, d["memory"]["limitBytes"])
        self.assertEqual(g.memory.used_bytes, d["memory"]["usedBytes"])
        self.assertEqual(g.journal.last_lsn, d["journal"]["lastLsn"])
        self.assertEqual(g.journal.fsync_policy, d["journal"]["fsyncPolicy"])
        self.assertEqual(g.recovery.state, d["recovery"]["state"])
        self.assertEqual(dict(g.backpressure.rejections_by_reason), d["backpressure"]["rejectionsByReason"])

    def server_channel(self):
        return self.cache.channel

    def test_metrics_pass_promtool_and_follow_the_traffic(self):
        if shutil.which("promtool") is None:
            raise unittest.SkipTest("promtool is missing: apt-get install prometheus")
        self.node("--principal-rate=5", "--memory-limit=1MiB")
        tok = mint(self.hs, sub="metrics-user")
        req = self.pb.cache
        for i in range(3):
            self.cache.Set(req.SetRequest(key="m%d" % i, value=make_value(i)), metadata=bearer(tok),
                           timeout=RPC_TIMEOUT)
        refused = 0
        for _ in range(100):
            try:
                self.cache.Get(req.GetRequest(key="m0"), metadata=bearer(tok), timeout=RPC_TIMEOUT)
            except grpc.RpcError as e:
                self.assertEqual(e.code(), grpc.StatusCode.RESOURCE_EXHAUSTED)
                refused += 1
                if refused == 3:
                    break
        self.assertEqual(refused, 3)
        for _ in range(2):
            with self.assertRaises(grpc.RpcError):
                self.cache.Get(req.GetRequest(key="m0"), timeout=RPC_TIMEOUT)  # TOKEN_MISSING
        code, ctype, text = curl(self.url("/metrics"))
        self.assertEqual(code, 200)
        self.assertTrue(ctype.startswith("text/plain"), ctype)
        r = subprocess.run(["promtool", "check", "metrics"], input=text + "\n", capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 0, "promtool check metrics:\n%s%s" % (r.stdout, r.stderr))

        def sample(name, **labels):
            for line in text.split("\n"):
                if line.startswith("#") or not line.startswith(name):
                    continue
                head, _, value = line.rpartition(" ")
                if head.split("{")[0] != name:
                    continue
                if all('%s="%s"' % kv in head for kv in labels.items()):
                    return float(value)
            return None
        self.assertEqual(sample("drey_requests_total", method="/drey.cache.v1.Cache/Set", code="OK"), 3)
        self.assertEqual(sample("drey_rejections_total", stage="backpressure", reason="PRINCIPAL_RATE_LIMIT"),
                         refused)
        self.assertEqual(sample("drey_rejections_total", stage="principal", reason="TOKEN_MISSING"), 2)
        self.assertEqual(sample("drey_principal_rejected_total", principal="jwt:metrics-user"), refused)
        self.assertEqual(sample("drey_memory_limit_bytes"), 1 << 20)
        self.assertEqual(sample("drey_journal_last_lsn"), 3)
        self.assertEqual(sample("drey_ready"), 1)
        self.assertEqual(sample("drey_request_duration_seconds_count", method="/drey.cache.v1.Cache/Set"), 3)

    def test_ready_turns_503_while_draining(self):
        srv = self.node(drain_grace="30s")
        self.assertEqual(curl(self.url("/health/ready"))[0], 200)
        srv.signal(signal.SIGTERM)
        poll(lambda: curl(self.url("/health/ready"))[0], lambda c: c == 503, timeout=30, interval=0.02,
             what="503 while draining")
        self.assertEqual(curl(self.url("/health/live"))[:2], (200, "text/plain"))
        self.assertIs(self.get_details()["ready"], False)
        srv.signal(signal.SIGTERM)  # ends the grace period
        self.assertEqual(srv.wait(), 0)
        srv.check_log_format()


class RemoteAccessTest(OpsCase):
    """Details and metrics from a non-loopback address."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ip = non_loopback_ipv4()

    def setUp(self):
        super().setUp()
        if self.ip is None:
            self.skipTest("this machine has no non-loopback IPv4 address (hostname -I)")

    def test_a_valid_token_is_needed_from_outside_loopback(self):
        self.node(ops="0.0.0.0:0")
        good = mint(self.hs, sub="operator")
        for path in ("/health/ready/details", "/metrics"):
            with self.subTest(path):
                self.assertEqual(curl(self.url(path))[0], 200, "loopback needs no token")
                code, _, body = curl(self.url(path, self.ip))
                self.assertEqual(code, 401, body)
                self.assertIn("bearer token", body)
                for bad in (mint(self.hs, sub="op", now=0), mint(self.hs, sign_with=self.other),
                            mint(self.hs, kid="unknown"), "not-a-token"):
                    code, _, _ = curl(self.url(path, self.ip), "-H", "Authorization: Bearer " + bad)
                    self.assertEqual(code, 401, bad)
                code, _, body = curl(self.url(path, self.ip), "-H", "Authorization: Bearer " + good)
                self.assertEqual(code, 200, body)
        d = self.get_details(self.ip, "-H", "Authorization: Bearer " + good)
        self.assertIs(d["ready"], True)
        # health stays open from anywhere
        self.assertEqual(curl(self.url("/health/live", self.ip))[0], 200)
        self.assertEqual(curl(self.url("/health/ready", self.ip))[0], 200)

    def test_a_node_without_keys_refuses_remote_callers(self):
        self.node(keys=False, ops="0.0.0.0:0")
        for path in ("/health/ready/details", "/metrics"):
            with self.subTest(path):
                self.assertEqual(curl(self.url(path))[0], 200)
                self.assertEqual(curl(self.url(path, self.ip))[0], 401)
                code, _, _ = curl(self.url(path, self.ip), "-H", "Authorization: Bearer " + mint(self.hs))
                self.assertEqual(code, 401)
        self.assertEqual(curl(self.url("/health/live", self.ip))[0], 200)


if __name__ == "__main__":
    main()
