"""Readiness details and the /health/* endpoints, through a real HTTP client
(curl) and over gRPC (drey.admin.v1.Admin/GetReadinessDetails).

* /health/ready/details is application/json with every field of
  drey.admin.v1.ReadinessDetails in lowerCamelCase, 64-bit integers as JSON
  numbers, and agrees with GetReadinessDetails over gRPC field by field, in
  each journal-disk state (normal, high, critical, normal again after a
  snapshot).
* /health/live and /health/ready answer 200 while the journal disk quota is
  critical and while memory admission refuses writes (pressure is the write
  path's signal, not readiness); /health/ready is 503 (and details say
  ready=false) while the node drains.
* snapshot, compaction, journal and recovery figures follow what happened,
  across a restart; an ephemeral node says so.
* No key, value, cache name or request_id a client sent appears in the
  details, the metrics or the log, whether its write was applied or refused.
* From a non-loopback address (the ops port bound to 0.0.0.0, or to [::]
  for IPv6) details and metrics need a bearer token the node's keys verify
  (401 otherwise, and a node without keys refuses them outright);
  /health/live and /health/ready stay open; from loopback (127.0.0.1, ::1)
  no token is needed.
"""

import base64
import hashlib
import hmac
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid

import grpc
from google.protobuf import descriptor as pbd

from drey_harness import (ADMIN_SERVICE, CACHE_SERVICE, HEALTH_SERVICE, DreyTestCase, RpcFailure, ServiceClient,
                          main, make_value)

WAIT = 30.0
SEGMENT = 1 << 20
CAP = 4 << 20
VALUE = 200 * 1024
NODE = "ready-node"
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")
QUOTA_FLAGS = ("--segment-bytes=%d" % SEGMENT, "--journal-max-bytes=%d" % CAP, "--snapshot-every-bytes=0",
               "--snapshot-every=0")


# --- HTTP through curl -------------------------------------------------------------

def curl(url, *args):
    """(HTTP status, Content-Type, body) of a request made by curl(1)."""
    cmd = ["curl", "-sS", "-g", "--noproxy", "*", "--max-time", "30", "-o", "-", "-w", "\n%{http_code} %{content_type}"]
    r = subprocess.run(cmd + list(args) + [url], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError("curl %s failed (%d): %s" % (url, r.returncode, r.stderr))
    body, _, tail = r.stdout.rpartition("\n")
    code, _, ctype = tail.partition(" ")
    return int(code), ctype, body


def non_loopback_ipv4():
    """An IPv4 address of this machine that is not loopback (hostname -I),
    or None."""
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for a in out.split():
        try:
            socket.inet_aton(a)
        except OSError:
            continue
        if a.count(".") == 3 and not a.startswith("127."):
            return a
    return None


def non_loopback_ipv6():
    """A global or unique-local IPv6 address of this machine (hostname -I),
    or None."""
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for a in out.split():
        try:
            socket.inet_pton(socket.AF_INET6, a)
        except OSError:
            continue
        if a != "::1" and not a.lower().startswith("fe80") and not a.lower().startswith("::ffff:"):
            return a
    return None


# --- HS256 tokens --------------------------------------------------------------------

def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def mint(secret, kid, sub="operator", exp_in=600, **claims):
    """An HS256 JWT signed with secret."""
    header = {"alg": "HS256", "typ": "JWT", "kid": kid}
    body = {"sub": sub, "iat": int(time.time()) - 5, "exp": int(time.time()) + exp_in}
    body.update(claims)
    signing = b64url(json.dumps(header).encode()) + "." + b64url(json.dumps(body).encode())
    sig = hmac.new(secret, signing.encode("ascii"), hashlib.sha256).digest()
    return signing + "." + b64url(sig)


def bearer(token):
    return (("authorization", "Bearer " + token),)


# --- the readiness document as JSON ----------------------------------------------------

INT_TYPES = {pbd.FieldDescriptor.TYPE_INT32, pbd.FieldDescriptor.TYPE_INT64, pbd.FieldDescriptor.TYPE_UINT32,
             pbd.FieldDescriptor.TYPE_UINT64, pbd.FieldDescriptor.TYPE_SINT32, pbd.FieldDescriptor.TYPE_SINT64,
             pbd.FieldDescriptor.TYPE_FIXED32, pbd.FieldDescriptor.TYPE_FIXED64}


def is_map(f):
    return f.message_type is not None and f.message_type.GetOptions().map_entry


def to_json(msg):
    """A message as the ops listener writes it (include/drey/ops.h): every
    field, lowerCamelCase names, 64-bit integers as numbers, maps as
    objects."""
    out = {}
    for f in msg.DESCRIPTOR.fields:
        v = getattr(msg, f.name)
        if f.type == pbd.FieldDescriptor.TYPE_MESSAGE and not is_map(f) and not msg.HasField(f.name):
            out[f.json_name] = None  # absent (a single node's cluster section): null
            continue
        if is_map(f):
            out[f.json_name] = dict(v)
        elif f.type == pbd.FieldDescriptor.TYPE_MESSAGE:
            out[f.json_name] = to_json(v)
        else:
            out[f.json_name] = v
    return out


class ReadinessCase(DreyTestCase):
    SERVER_FLAGS = None

    def node(self, *flags, ops="127.0.0.1:0", **kw):
        srv = self.start_server(*(("--ops-listen=" + ops, "--node-id=" + NODE) + tuple(flags)), **kw)
        self.srv = srv
        rec = srv.find_log(lambda r: r.get("msg") == "listening")
        self.ops = int(rec["ops_port"])
        self.assertGreater(self.ops, 0)
        ch = srv.channel()
        self.cache = ServiceClient(ch, self.pb.cache, CACHE_SERVICE)
        self.admin = ServiceClient(ch, self.pb.admin, ADMIN_SERVICE)
        self.health = ServiceClient(ch, self.pb.health, HEALTH_SERVICE)
        return srv

    def url(self, path, host="127.0.0.1"):
        return "http://%s:%d%s" % (host, self.ops, path)

    def details(self, host="127.0.0.1", *args):
        code, ctype, body = curl(self.url("/health/ready/details", host), *args)
        self.assertEqual((code, ctype), (200, "application/json"), body)
        return json.loads(body)

    def grpc_details(self, metadata=None):
        return self.admin.GetReadinessDetails(self.pb.admin.GetReadinessDetailsRequest(), metadata=metadata,
                                              timeout=WAIT)

    def put(self, key, value, metadata=None, **fields):
        return self.cache.Set(self.pb.cache.SetRequest(key=key, value=make_value(value), **fields),
                              metadata=metadata, timeout=WAIT)

    def assertShape(self, obj, desc, where="details"):
        """Every field of the message, in lowerCamelCase, with JSON types
        that match: numbers (never strings) for every integer."""
        self.assertIsInstance(obj, dict, where)
        self.assertEqual(sorted(obj), sorted(f.json_name for f in desc.fields), "fields of %s" % where)
        for f in desc.fields:
            v, w = obj[f.json_name], where + "." + f.json_name
            if is_map(f):
                self.assertIsInstance(v, dict, w)
                for mk, mv in v.items():
                    self.assertTrue(isinstance(mv, int) and not isinstance(mv, bool), "%s[%s] = %r" % (w, mk, mv))
            elif f.type == pbd.FieldDescriptor.TYPE_MESSAGE and f.json_name == "cluster":
                self.assertIsNone(v, w + ": a single node has no cluster section")
            elif f.type == pbd.FieldDescriptor.TYPE_MESSAGE and f.json_name in ("authz", "tenants"):
                self.assertIsNone(v, w + ": no section without --authz-policy")
            elif f.type == pbd.FieldDescriptor.TYPE_MESSAGE:
                self.assertShape(v, f.message_type, w)
            elif f.type == pbd.FieldDescriptor.TYPE_BOOL:
                self.assertIsInstance(v, bool, w)
            elif f.type == pbd.FieldDescriptor.TYPE_STRING:
                self.assertIsInstance(v, str, w)
            else:
                self.assertIn(f.type, INT_TYPES, w)
                self.assertTrue(isinstance(v, int) and not isinstance(v, bool), "%s is %r, not a number" % (w, v))

    def assertSameDetails(self, where):
        """The JSON document and GetReadinessDetails agree on every field.
        The gRPC call counts itself: one more call in flight."""
        # a read first: the channel's principal is tracked in both documents
        self.cache.Get(self.pb.cache.GetRequest(key="-"), timeout=WAIT)
        http = self.details()
        g = self.grpc_details()
        again = self.details()
        self.assertShape(http, self.pb.admin.ReadinessDetails.DESCRIPTOR)
        got = to_json(g)
        self.assertEqual(got["backpressure"]["inFlight"], http["backpressure"]["inFlight"] + 1,
                         "%s: the gRPC call itself is in flight" % where)
        got["backpressure"]["inFlight"] -= 1
        if got["snapshot"]["ageSeconds"] == again["snapshot"]["ageSeconds"]:  # a second may tick between
            http["snapshot"]["ageSeconds"] = got["snapshot"]["ageSeconds"]
        # jemalloc's own figure moves with every request served (-1 without jemalloc)
        je = [doc["memory"].pop("jemallocAllocatedBytes") for doc in (http, got, again)]
        self.assertTrue(all(v == -1 for v in je) or all(v > 0 for v in je), je)
        # the data directory's file system is looked at every second and other processes write to it: what it
        # has available (and a cap derived from that) may move between two reads, and so may the next
        # snapshot's estimate, taken in the same look from the store's bytes (a fill just before it shows)
        for doc in (http, got, again):
            self.assertIsInstance(doc["dataDisk"].pop("availableBytes"), int)
            self.assertIsInstance(doc["dataDisk"].pop("snapshotEstimateBytes"), int)
            if doc["dataDisk"]["journalCap"] == "derived":
                for k in ("maxBytes", "highWaterBytes"):
                    self.assertIsInstance(doc["journalDisk"].pop(k), int)
        self.assertEqual(http, again, "%s: the details moved while nothing happened" % where)
        self.assertEqual(got, http, where)
        return http


class DetailsTest(ReadinessCase):

    def test_json_and_grpc_agree_in_every_journal_disk_state(self):
        self.node(*QUOTA_FLAGS)
        d = self.assertSameDetails("normal")
        jd = d["journalDisk"]
        self.assertEqual((jd["state"], jd["maxBytes"], jd["usedBytes"], jd["writeRejectionActive"]),
                         ("normal", CAP, SEGMENT, False))
        self.assertTrue(d["ready"])
        self.assertEqual(d["recovery"], {"state": "done", "replayedRecords": 0})
        self.assertEqual(d["journal"]["fsyncPolicy"], "always")
        self.assertEqual(d["journal"]["lastLsn"], 0)
        self.assertEqual(d["journal"]["segments"], 1)
        self.assertFalse(d["journal"]["failed"])
        self.assertEqual(d["compaction"], {"state": "idle", "lastRun": ""})
        self.assertEqual(d["snapshot"], {"lastLsn": 0, "ageSeconds": 0, "inFlight": False})

        # high: from the high-water mark on
        i = 0
        while self.details()["journalDisk"]["usedBytes"] < jd["highWaterBytes"]:
            self.put("fill-%d" % i, b"f" * VALUE)
            i += 1
            self.assertLess(i, CAP // VALUE, "never reached the high-water mark")
        d = self.assertSameDetails("high")
        self.assertEqual((d["journalDisk"]["state"], d["journalDisk"]["writeRejectionActive"]), ("high", False))
        self.assertEqual(d["journal"]["lastLsn"], i)
        self.assertEqual(d["journalDisk"]["usedBytes"], d["journal"]["segments"] * SEGMENT)

        # critical: once a write was refused and would still not fit
        refused = None
        while refused is None:
            try:
                self.put("fill-%d" % i, b"f" * VALUE)
            except grpc.RpcError as e:
                refused = RpcFailure(e)
            i += 1
            self.assertLess(i, 2 * CAP // VALUE, "no write was refused")
        self.assertEqual(refused.reason, "JOURNAL_DISK_QUOTA")
        d = self.assertSameDetails("critical")
        self.assertEqual((d["journalDisk"]["state"], d["journalDisk"]["writeRejectionActive"]), ("critical", True))
        self.assertEqual(d["journalDisk"]["usedBytes"], int(refused.metadata["usedBytes"]))
        self.assertEqual(d["journalDisk"]["maxBytes"], int(refused.metadata["maxBytes"]))
        self.assertEqual(d["journalDisk"]["highWaterBytes"], int(refused.metadata["highWaterBytes"]))
        self.assertTrue(d["ready"])
        self.assertEqual(curl(self.url("/health/ready")), (200, "text/plain", "ready\n"))

        # normal again after a snapshot and its compaction
        snap = self.admin.Snapshot(self.pb.admin.SnapshotRequest(), timeout=WAIT)
        d = self.assertSameDetails("after the snapshot")
        self.assertEqual(d["journalDisk"]["state"], "normal")
        self.assertFalse(d["journalDisk"]["writeRejectionActive"])
        self.assertEqual(d["journalDisk"]["usedBytes"], SEGMENT)
        self.assertEqual(d["journal"]["segments"], 1)
        self.assertEqual(d["snapshot"]["lastLsn"], snap.lsn)
        self.assertFalse(d["snapshot"]["inFlight"])
        self.assertGreaterEqual(d["snapshot"]["ageSeconds"], 0)
        self.assertLessEqual(d["snapshot"]["ageSeconds"], WAIT)
        self.assertEqual(d["compaction"]["state"], "idle")
        self.assertRegex(d["compaction"]["lastRun"], RFC3339)

    def test_figures_across_a_restart_and_on_an_ephemeral_node(self):
        data = tempfile.mkdtemp(prefix="drey-ready-", dir=os.environ.get("TEST_TMPDIR"))
        self.addCleanup(shutil.rmtree, data, True)
        srv = self.node("--data-dir=" + data, *QUOTA_FLAGS)
        for i in range(3):
            self.put("a-%d" % i, i)
        snap = self.admin.Snapshot(self.pb.admin.SnapshotRequest(), timeout=WAIT)
        for i in range(4):
            self.put("b-%d" % i, i)
        before = self.details()
        srv.stop()
        self.node("--data-dir=" + data, *QUOTA_FLAGS)
        d = self.assertSameDetails("after a restart")
        self.assertEqual(d["recovery"], {"state": "done", "replayedRecords": 4})
        self.assertEqual(d["journal"]["lastLsn"], before["journal"]["lastLsn"])
        self.assertEqual(d["snapshot"]["lastLsn"], snap.lsn)
        self.assertEqual(d["memory"]["usedBytes"], before["memory"]["usedBytes"])
        self.assertEqual(d["journalDisk"]["usedBytes"], d["journal"]["segments"] * SEGMENT)
        self.assertTrue(d["ready"])

        self.node("--ephemeral")
        self.put("e", 1)
        d = self.assertSameDetails("ephemeral")
        self.assertEqual(d["recovery"]["state"], "ephemeral")
        self.assertEqual(d["journalDisk"]["maxBytes"], 0)
        self.assertEqual(d["journalDisk"]["usedBytes"], 0)
        self.assertEqual(d["journalDisk"]["state"], "normal")
        self.assertEqual(d["journal"]["lastLsn"], 0)
        self.assertTrue(d["ready"])


class HealthEndpointsTest(ReadinessCase):

    def test_live_and_ready_through_curl(self):
        self.node()
        self.assertEqual(curl(self.url("/health/live")), (200, "text/plain", "ok\n"))
        self.assertEqual(curl(self.url("/health/ready")), (200, "text/plain", "ready\n"))
        self.assertEqual(curl(self.url("/health/ready"), "-I")[0], 200)  # HEAD
        self.assertEqual(curl(self.url("/health/ready/details"), "-I")[:2], (200, "application/json"))
        self.assertEqual(curl(self.url("/health/nope"))[0], 404)
        self.assertEqual(curl(self.url("/health/ready"), "-X", "POST")[0], 405)

    def test_ready_stays_200_under_journal_disk_and_memory_pressure(self):
        limit = 256 * 1024
        self.node(*QUOTA_FLAGS, "--memory-limit=%d" % limit)
        refused = {}
        for i in range(64):  # 32 KiB entries: the seventh passes high, the eighth would pass critical
            try:
                self.put("big-%d" % i, b"x" * (32 * 1024))
            except grpc.RpcError as e:
                refused[RpcFailure(e).reason] = True
                break
        self.assertEqual(list(refused), ["MEMORY_PRESSURE"])
        d = self.details()
        m = d["memory"]
        self.assertEqual((m["limitBytes"], m["highBytes"], m["criticalBytes"]),
                         (limit, limit * 80 // 100, limit * 95 // 100))
        want = "critical" if m["usedBytes"] >= m["criticalBytes"] else "high" if m["usedBytes"] >= m["highBytes"] \
            else "normal"
        self.assertEqual(m["state"], want)
        self.assertNotEqual(m["state"], "normal")
        self.assertEqual(m["writeRejectionActive"], m["state"] == "critical")
        self.assertTrue(d["ready"])
        self.assertEqual(curl(self.url("/health/ready")), (200, "text/plain", "ready\n"))
        # journal disk pressure too: overwrites of the same size grow no memory
        # and are journaled, until the quota says no
        for i in range(2 * CAP // (32 * 1024)):
            try:
                self.put("big-0", bytes([i % 251]) * (32 * 1024))
            except grpc.RpcError as e:
                f = RpcFailure(e)
                self.assertEqual(f.reason, "JOURNAL_DISK_QUOTA", f)
                break
        else:
            self.fail("the journal disk quota never refused a write")
        d = self.details()
        self.assertEqual(d["journalDisk"]["state"], "critical")
        self.assertTrue(d["ready"])
        self.assertEqual(curl(self.url("/health/ready")), (200, "text/plain", "ready\n"))
        self.assertEqual(curl(self.url("/health/live")), (200, "text/plain", "ok\n"))
        self.assertEqual(self.health.Check(self.pb.health.HealthCheckRequest(service=""), timeout=WAIT).status,
                         self.pb.health.HealthCheckResponse.SERVING)

    def test_ready_is_503_while_draining(self):
        srv = self.node(drain_grace="60s")
        self.assertEqual(curl(self.url("/health/ready"))[0], 200)
        srv.signal(signal.SIGTERM)
        deadline = time.monotonic() + WAIT
        while curl(self.url("/health/ready"))[0] != 503:
            self.assertLess(time.monotonic(), deadline, "/health/ready never turned 503 while draining")
            self.assertIsNone(srv.proc.poll(), "dreyd exited instead of draining")
            time.sleep(0.02)
        self.assertEqual(curl(self.url("/health/ready")), (503, "text/plain", "not ready\n"))
        self.assertEqual(curl(self.url("/health/live")), (200, "text/plain", "ok\n"))
        d = self.details()
        self.assertFalse(d["ready"])
        self.assertEqual(d["recovery"]["state"], "done")
        self.assertFalse(d["journal"]["failed"])
        self.assertFalse(self.grpc_details().ready)
        self.assertEqual(self.health.Check(self.pb.health.HealthCheckRequest(service=""), timeout=WAIT).status,
                         self.pb.health.HealthCheckResponse.NOT_SERVING)
        srv.signal(signal.SIGTERM)  # a second signal ends the grace period
        self.assertEqual(srv.wait(), 0)
        srv.check_log_format()


class NoNamesTest(ReadinessCase):

    def test_no_key_value_cache_name_or_request_id_shows(self):
        self.node(*QUOTA_FLAGS)
        tag = uuid.uuid4().hex[:10]
        secrets = {"cache": "Cache-" + tag, "key": "Key-" + tag, "value": "Value-" + tag, "rid": "Rid-" + tag,
                   "rkey": "RefusedKey-" + tag, "rval": "RefusedValue-" + tag}
        self.put(secrets["key"], secrets["value"], cache=secrets["cache"], request_id=secrets["rid"])
        refused = None
        for i in range(2 * CAP // VALUE):
            key = "%s-%d" % (secrets["rkey"], i)
            try:
                self.put(key, secrets["rval"] + "x" * VALUE, cache=secrets["cache"], request_id="%s-%d" % (
                    secrets["rid"], i))
            except grpc.RpcError as e:
                refused = RpcFailure(e)
                break
        self.assertIsNotNone(refused)
        self.assertEqual(refused.reason, "JOURNAL_DISK_QUOTA")
        _, _, details = curl(self.url("/health/ready/details"))
        _, _, metrics = curl(self.url("/metrics"))
        g = self.grpc_details()
        texts = {"details": details, "metrics": metrics, "grpc": g.SerializeToString().decode("latin-1") + str(g),
                 "error": refused.everything_text(), "log": self.srv.log_text()}
        for where, text in texts.items():
            for what, s in secrets.items():
                self.assertNotIn(s, text, "%s shows the %s" % (where, what))
                self.assertNotIn(s.lower(), text.lower(), "%s shows the %s" % (where, what))
            self.assertNotIn(tag, text, "%s shows what the client sent" % where)


class RemoteAccessTest(ReadinessCase):
    """Details and metrics from this machine's own non-loopback address."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ip = non_loopback_ipv4()
        cls.keys = tempfile.mkdtemp(prefix="drey-ready-keys-", dir=os.environ.get("TEST_TMPDIR"))
        cls.kid = "ops"
        cls.secret = os.urandom(32)
        with open(os.path.join(cls.keys, cls.kid + ".HS256.key"), "wb") as f:
            f.write(cls.secret)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.keys, True)
        super().tearDownClass()

    def need_ipv4(self):
        if self.ip is None:
            self.skipTest("this machine has no non-loopback IPv4 address (hostname -I printed none)")

    def test_a_valid_token_is_needed_from_outside_loopback(self):
        self.need_ipv4()
        self.node("--jwt-keys-dir=" + self.keys, *QUOTA_FLAGS, ops="0.0.0.0:0")
        good = mint(self.secret, self.kid)
        # with keys configured every cache and admin call needs a token too
        with self.assertRpcError(grpc.StatusCode.UNAUTHENTICATED, "TOKEN_MISSING"):
            self.put("k", 1)
        self.put("k", 1, metadata=bearer(good))
        bad = {
            "none": None,
            "malformed": "Bearer not-a-token",
            "wrong scheme": "Basic " + base64.b64encode(b"op:pw").decode(),
            "expired": "Bearer " + mint(self.secret, self.kid, exp_in=-3600),
            "bad signature": "Bearer " + mint(os.urandom(32), self.kid),
            "unknown kid": "Bearer " + mint(self.secret, "nobody"),
            "alg none": "Bearer " + b64url(json.dumps({"alg": "none", "kid": self.kid}).encode()) + "." +
                        b64url(json.dumps({"sub": "x", "exp": int(time.time()) + 600}).encode()) + ".",
        }
        for path in ("/health/ready/details", "/metrics"):
            with self.subTest(path):
                self.assertEqual(curl(self.url(path))[0], 200, "loopback needs no token")
                for what, header in bad.items():
                    args = ("-H", "Authorization: " + header) if header else ()
                    code, _, body = curl(self.url(path, self.ip), *args)
                    self.assertEqual(code, 401, "%s: %s" % (what, body))
                    self.assertNotIn("journal", body.lower(), "a 401 shows figures")
                code, _, body = curl(self.url(path, self.ip), "-H", "Authorization: Bearer " + good)
                self.assertEqual(code, 200, body)
        d = self.details(self.ip, "-H", "Authorization: Bearer " + good)
        self.assertEqual(d["journalDisk"]["maxBytes"], CAP)
        self.assertEqual(d["journal"]["lastLsn"], 1)
        self.assertEqual(self.details()["journal"], d["journal"])
        g = self.grpc_details(metadata=bearer(good))
        self.assertEqual(g.journal_disk.max_bytes, CAP)
        # health stays open from anywhere, without a token
        self.assertEqual(curl(self.url("/health/live", self.ip)), (200, "text/plain", "ok\n"))
        self.assertEqual(curl(self.url("/health/ready", self.ip)), (200, "text/plain", "ready\n"))

    def test_the_same_rules_over_ipv6(self):
        ip6 = non_loopback_ipv6()
        if ip6 is None:
            self.skipTest("this machine has no non-loopback IPv6 address (hostname -I printed none)")
        self.node("--jwt-keys-dir=" + self.keys, ops="[::]:0")
        good = mint(self.secret, self.kid)
        remote = "[%s]" % ip6
        for path in ("/health/ready/details", "/metrics"):
            with self.subTest(path):
                self.assertEqual(curl(self.url(path, "[::1]"))[0], 200, "loopback (::1) needs no token")
                self.assertEqual(curl(self.url(path, remote))[0], 401)
                self.assertEqual(curl(self.url(path, remote), "-H", "Authorization: Bearer " + mint(
                    os.urandom(32), self.kid))[0], 401)
                self.assertEqual(curl(self.url(path, remote), "-H", "Authorization: Bearer " + good)[0], 200)
        self.assertEqual(curl(self.url("/health/live", remote))[0], 200)
        self.assertEqual(curl(self.url("/health/ready", remote))[0], 200)

    def test_a_node_without_keys_refuses_details_and_metrics_to_remote_callers(self):
        self.need_ipv4()
        self.node(ops="0.0.0.0:0")
        token = mint(self.secret, self.kid)
        for path in ("/health/ready/details", "/metrics"):
            with self.subTest(path):
                self.assertEqual(curl(self.url(path))[0], 200)
                self.assertEqual(curl(self.url(path, self.ip))[0], 401)
                self.assertEqual(curl(self.url(path, self.ip), "-H", "Authorization: Bearer " + token)[0], 401)
        self.assertEqual(curl(self.url("/health/live", self.ip))[0], 200)
        self.assertEqual(curl(self.url("/health/ready", self.ip))[0], 200)


if __name__ == "__main__":
    main()
