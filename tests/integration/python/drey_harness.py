"""drey_harness — shared machinery of the Python integration tests.

Each test file drives the real `dreyd` binary with Debian's grpcio client:

* Python stubs are generated at run time with `protoc --python_out` from the
  repository's proto/ (plus the well-known types in /usr/include and the gRPC
  protos in /usr/share/grpc-proto/grpc), once per process. The gRPC protos are
  compiled with `-I/usr/share/grpc-proto/grpc` so the generated modules are
  `health.v1.health_pb2` and `reflection.v1.reflection_pb2`: a generated
  `grpc` package would shadow grpcio's own `grpc` module.
* `DreyServer` starts `dreyd --listen=127.0.0.1:0 ...` (with --data-dir in
  its private temp dir and the fixed-port --ops-listen turned off, when the
  binary has those options) with stderr in a file there, learns the port from the JSON log line `{"msg":"listening",...,
  "port":N}` and then waits until Health/Check("") says SERVING (a durable
  node recovers first); both are polled with deadlines: no fixed ports, no
  sleeps. It stops the server with SIGTERM, checking the exit code (0 unless
  told otherwise) and that every stderr line is a JSON object with time,
  level and msg. Under `--config=asan` a leak or UB report makes dreyd exit
  non-zero and writes non-JSON lines, so both checks catch it.
* `DreyTestCase` (unittest) owns one server per test class (`SERVER_FLAGS`),
  typed callers for every Cache method, google.rpc.Status decoding and
  `assertRpcError(code, reason, field=None)`.

Run a file directly while iterating:
    DREY_BIN=$PWD/bazel-bin/dreyd /usr/bin/python3 tests/integration/python/test_x.py
"""

import atexit
import contextlib
import errno
import http.client
import importlib
import json
import math
import os
import queue
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import uuid

import grpc
from google.protobuf import json_format, struct_pb2

HERE = os.path.dirname(os.path.abspath(__file__))
WKT_DIR = "/usr/include"                      # google/protobuf/*.proto
GRPC_PROTO_DIR = "/usr/share/grpc-proto/grpc"  # health/v1, reflection/v1{,alpha}

DOMAIN = "drey.dev"
CACHE_SERVICE = "drey.cache.v1.Cache"
HEALTH_SERVICE = "grpc.health.v1.Health"
ADMIN_SERVICE = "drey.admin.v1.Admin"
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
REFLECTION_V1ALPHA = "grpc.reflection.v1alpha.ServerReflection"

# How long a server may take to start or stop (ASan builds are slower and the
# tests of several files share two cores).
START_TIMEOUT = float(os.environ.get("DREY_TEST_START_TIMEOUT", "30"))
STOP_TIMEOUT = float(os.environ.get("DREY_TEST_STOP_TIMEOUT", "30"))
# Default deadline of a test's RPC: generous, only there so a hang fails.
RPC_TIMEOUT = 30.0


# --- locating things ---------------------------------------------------------

def find_proto_dir():
    """The repository's proto/ directory.

    Under `bazel test` the working directory is the runfiles tree of the
    workspace `drey`, where //:protos puts proto/...; outside Bazel it is found
    relative to this file (tests/integration/python/../../../proto)."""
    candidates = []
    if os.environ.get("DREY_PROTO_DIR"):
        candidates.append(os.environ["DREY_PROTO_DIR"])
    candidates.append(os.path.join(os.getcwd(), "proto"))
    for base in filter(None, [os.environ.get("RUNFILES_DIR"), os.environ.get("TEST_SRCDIR")]):
        candidates.append(os.path.join(base, "drey", "proto"))
    candidates.append(os.path.normpath(os.path.join(HERE, "..", "..", "..", "proto")))
    for c in candidates:
        if os.path.isfile(os.path.join(c, "drey", "cache", "v1", "cache.proto")):
            return c
    raise RuntimeError("cannot find proto/drey/cache/v1/cache.proto; looked in %s" % candidates)


def find_dreyd():
    path = os.environ.get("DREY_BIN")
    if not path:
        path = os.path.normpath(os.path.join(HERE, "..", "..", "..", "bazel-bin", "dreyd"))
    if not os.access(path, os.X_OK):
        raise RuntimeError("dreyd not found or not executable: %s (set DREY_BIN)" % path)
    return os.path.abspath(path)


_flags = {}


def supported_flags(binary):
    """The option names `binary --help` lists (cached per binary), so the
    harness can pass newer options only to binaries that know them."""
    if binary not in _flags:
        out = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60).stdout
        _flags[binary] = set(re.findall(r"^\s+--([a-z0-9-]+)=", out, re.M))
    return _flags[binary]


# --- generated stubs ---------------------------------------------------------

class Protos:
    """The generated modules: cache, admin, journal, status, error_details, health,
    reflection_v1, reflection_v1alpha."""


_protos = None
_protos_lock = threading.Lock()


def protos():
    """Generates the Python stubs once per process and imports them."""
    global _protos
    with _protos_lock:
        if _protos is not None:
            return _protos
        proto_dir = find_proto_dir()
        out = tempfile.mkdtemp(prefix="drey-py-stubs-")
        atexit.register(shutil.rmtree, out, True)
        runs = [
            ["-I" + proto_dir, "-I" + WKT_DIR,
             "drey/cache/v1/cache.proto", "drey/admin/v1/admin.proto", "drey/journal/v1/journal.proto",
             "drey/cluster/v1/cluster.proto", "drey/internal/v1/move.proto", "drey/internal/v1/meta.proto",
             "drey/internal/v1/peer.proto",
             "drey/internal/v1/subscribe.proto", "google/rpc/status.proto", "google/rpc/error_details.proto"],
            ["-I" + GRPC_PROTO_DIR,
             "health/v1/health.proto", "reflection/v1/reflection.proto", "reflection/v1alpha/reflection.proto"],
        ]
        for args in runs:
            r = subprocess.run(["protoc", "--python_out=" + out] + args, capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError("protoc failed: %s\n%s" % (" ".join(args), r.stderr))
        sys.path.insert(0, out)
        importlib.invalidate_caches()
        p = Protos()
        p.dir = out
        p.proto_dir = proto_dir
        p.cache = importlib.import_module("drey.cache.v1.cache_pb2")
        p.admin = importlib.import_module("drey.admin.v1.admin_pb2")
        p.journal = importlib.import_module("drey.journal.v1.journal_pb2")
        p.cluster = importlib.import_module("drey.cluster.v1.cluster_pb2")
        p.move = importlib.import_module("drey.internal.v1.move_pb2")
        p.meta = importlib.import_module("drey.internal.v1.meta_pb2")
        p.peer = importlib.import_module("drey.internal.v1.peer_pb2")
        p.subscribe = importlib.import_module("drey.internal.v1.subscribe_pb2")
        p.status = importlib.import_module("google.rpc.status_pb2")
        p.error_details = importlib.import_module("google.rpc.error_details_pb2")
        p.health = importlib.import_module("health.v1.health_pb2")
        p.reflection_v1 = importlib.import_module("reflection.v1.reflection_pb2")
        p.reflection_v1alpha = importlib.import_module("reflection.v1alpha.reflection_pb2")
        _protos = p
        return p


# --- values ------------------------------------------------------------------

def make_value(x):
    """A drey.cache.v1.Value from a Python value: bytes, str, bool, int,
    float, dict (json_value) or None (null_value)."""
    pb = protos().cache
    v = pb.Value()
    if x is None:
        v.null_value = struct_pb2.NULL_VALUE
    elif isinstance(x, bool):
        v.bool_value = x
    elif isinstance(x, int):
        v.int64_value = x
    elif isinstance(x, float):
        v.double_value = x
    elif isinstance(x, bytes):
        v.bytes_value = x
    elif isinstance(x, str):
        v.string_value = x
    elif isinstance(x, dict):
        v.json_value.SetInParent()  # {} too: the kind is set even when empty
        v.json_value.update(x)
    else:
        raise TypeError("no Value kind for %r" % (x,))
    return v


def value_of(v):
    """The Python value of a Value (the inverse of make_value); raises on a
    Value without a kind."""
    kind = v.WhichOneof("kind")
    if kind is None:
        raise AssertionError("Value has no kind set")
    if kind == "json_value":
        return json_format.MessageToDict(v.json_value)
    if kind == "null_value":
        return None
    return getattr(v, kind)


def same_value(a, b):
    """Equality that treats NaN as equal to NaN and keeps bool/int apart."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


# --- errors ------------------------------------------------------------------

class RpcFailure:
    """A failed call, with google.rpc.Status decoded from
    grpc-status-details-bin and its details unpacked by type_url."""

    TYPES = {
        "type.googleapis.com/google.rpc.ErrorInfo": "ErrorInfo",
        "type.googleapis.com/google.rpc.BadRequest": "BadRequest",
        "type.googleapis.com/google.rpc.QuotaFailure": "QuotaFailure",
        "type.googleapis.com/google.rpc.RetryInfo": "RetryInfo",
        "type.googleapis.com/google.rpc.PreconditionFailure": "PreconditionFailure",
        "type.googleapis.com/google.rpc.ResourceInfo": "ResourceInfo",
        "type.googleapis.com/google.rpc.DebugInfo": "DebugInfo",
    }

    def __init__(self, err):
        p = protos()
        self.error = err
        self.code = err.code()
        self.message = err.details() or ""
        self.trailers = tuple(err.trailing_metadata() or ())
        self.raw_details = None
        self.status = None
        self.details = {}       # short type name -> list of messages
        self.unknown_details = []
        for k, v in self.trailers:
            if k == "grpc-status-details-bin":
                self.raw_details = v
        if self.raw_details is not None:
            self.status = p.status.Status.FromString(self.raw_details)
            for any_ in self.status.details:
                name = self.TYPES.get(any_.type_url)
                if name is None:
                    self.unknown_details.append(any_.type_url)
                    continue
                msg = getattr(p.error_details, name)()
                msg.ParseFromString(any_.value)
                self.details.setdefault(name, []).append(msg)

    def _one(self, name):
        items = self.details.get(name, [])
        if len(items) > 1:
            raise AssertionError("%d %s details, expected at most one" % (len(items), name))
        return items[0] if items else None

    @property
    def error_info(self):
        return self._one("ErrorInfo")

    @property
    def bad_request(self):
        return self._one("BadRequest")

    @property
    def quota_failure(self):
        return self._one("QuotaFailure")

    @property
    def retry_info(self):
        return self._one("RetryInfo")

    @property
    def reason(self):
        ei = self.error_info
        return ei.reason if ei is not None else None

    @property
    def metadata(self):
        ei = self.error_info
        return dict(ei.metadata) if ei is not None else {}

    @property
    def fields(self):
        br = self.bad_request
        return [v.field for v in br.field_violations] if br is not None else []

    def everything_text(self):
        """Every piece of text the client got back, for leak checks."""
        parts = [self.message, repr(self.trailers)]
        if self.raw_details is not None:
            parts.append(self.raw_details.decode("latin-1"))
        if self.status is not None:
            parts.append(str(self.status))
        for items in self.details.values():
            parts.extend(str(m) for m in items)
        return "\n".join(parts)

    def __repr__(self):
        return "RpcFailure(%s, %r, reason=%r, fields=%r, metadata=%r)" % (
            self.code.name, self.message, self.reason, self.fields, self.metadata)


class _ErrorHolder:
    failure = None


# --- the server process --------------------------------------------------------

class DreyServer:
    """One dreyd process. start() returns once it logged its port."""

    def __init__(self, *flags, drain_grace="50ms", listen="127.0.0.1:0", env=None, name="dreyd"):
        self.binary = find_dreyd()
        self.flags = list(flags)
        self.drain_grace = drain_grace
        self.listen = listen
        self.env = env
        self.name = name
        self.tmp = tempfile.mkdtemp(prefix="drey-it-")
        if not os.environ.get("DREY_TEST_KEEP_TMP"):
            atexit.register(shutil.rmtree, self.tmp, True)
        self.log_path = os.path.join(self.tmp, "stderr.log")
        self.proc = None
        self.port = None
        self.returncode = None
        self._channels = []

    def argv(self):
        args = [self.binary, "--listen=" + self.listen]
        if self.drain_grace is not None:
            args.append("--drain-grace=" + self.drain_grace)
        # A durable node writes its journal to a private directory, never
        # to ./drey-data of whatever directory the test runs in.
        given = {f.split("=", 1)[0] for f in self.flags}
        known = supported_flags(self.binary)
        if "data-dir" in known and not given & {"--data-dir", "--ephemeral"}:
            args.append("--data-dir=" + os.path.join(self.tmp, "data"))
        # The operators' HTTP listener defaults to a fixed port, which
        # parallel servers would fight over: off unless a test asks for it.
        if "ops-listen" in known and "--ops-listen" not in given:
            args.append("--ops-listen=")
        return args + self.flags

    def spawn(self):
        env = dict(os.environ)
        if self.env:
            env.update(self.env)
        # No core file lands anywhere when dreyd aborts: it inherits this
        # process's limit. Not set in a preexec_fn: a fork that runs Python
        # before exec is unsafe once gRPC's threads exist (it runs every fork
        # handler; test processes that had used gRPC intermittently hung in
        # Popen or crashed), while without one Popen uses vfork and exec.
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        with open(self.log_path, "wb") as err:
            # cwd: anything dreyd writes to a relative path stays private
            self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=err, env=env, close_fds=True, cwd=self.tmp)
        return self

    def start(self, timeout=START_TIMEOUT, wait_ready=True):
        self.spawn()
        try:
            line = self.wait_log(lambda r: r.get("msg") == "listening" and "port" in r, timeout,
                                 what="the 'listening' log line")
        except AssertionError:
            self.kill()
            raise
        self.port = int(line["port"])
        if self.port <= 0:
            raise AssertionError("dreyd logged port %r" % (self.port,))
        if wait_ready:
            try:
                self.wait_serving(timeout)
            except AssertionError:
                self.kill()
                raise
        return self

    def wait_serving(self, timeout=START_TIMEOUT):
        """Polls grpc.health.v1.Health/Check("") until SERVING: a durable
        node listens (and answers health) while it still recovers."""
        p = protos()
        ch = grpc.insecure_channel(self.address)
        try:
            check = ch.unary_unary("/grpc.health.v1.Health/Check",
                                   request_serializer=p.health.HealthCheckRequest.SerializeToString,
                                   response_deserializer=p.health.HealthCheckResponse.FromString)
            deadline = time.monotonic() + timeout
            last = None
            while True:
                try:
                    last = check(p.health.HealthCheckRequest(service=""), timeout=5, wait_for_ready=True).status
                    if last == p.health.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError as e:
                    last = e.code()
                if self.proc.poll() is not None:
                    raise AssertionError("%s exited with %s while starting; stderr:\n%s" % (
                        self.name, self.proc.returncode, self.log_text()[-4000:]))
                if time.monotonic() >= deadline:
                    raise AssertionError("%s not SERVING after %.0fs (last: %r); stderr:\n%s" % (
                        self.name, timeout, last, self.log_text()[-4000:]))
                time.sleep(0.01)
        finally:
            ch.close()

    @property
    def address(self):
        return "127.0.0.1:%d" % self.port

    @property
    def ops_port(self):
        """The ops listener's port from the 'listening' line (0: none; pass
        --ops-listen=127.0.0.1:0 to get one)."""
        rec = self.find_log(lambda r: r.get("msg") == "listening")
        return int(rec.get("ops_port", 0)) if rec else 0

    def ops_get(self, path, timeout=10):
        """GET path on the ops listener: (HTTP status, body text)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.ops_port, timeout=timeout)
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            return resp.status, resp.read().decode("utf-8", "replace")
        finally:
            conn.close()

    # --- the log ---

    def log_text(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def log_records(self, strict=False):
        """Parsed JSON lines; with strict, a non-JSON line raises."""
        out = []
        for line in self.log_text().split("\n"):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                if strict:
                    raise AssertionError("stderr line is not JSON: %r" % line[:500])
                continue
            out.append(rec)
        return out

    def find_log(self, pred):
        for rec in self.log_records():
            if isinstance(rec, dict) and pred(rec):
                return rec
        return None

    def wait_log(self, pred, timeout, what="a log line"):
        """Polls the stderr file for a JSON line matching pred (with a
        deadline); fails early if the process exits first."""
        deadline = time.monotonic() + timeout
        while True:
            rec = self.find_log(pred)
            if rec is not None:
                return rec
            if self.proc is not None and self.proc.poll() is not None:
                rec = self.find_log(pred)
                if rec is not None:
                    return rec
                raise AssertionError("%s exited with %s before %s; stderr:\n%s" % (
                    self.name, self.proc.returncode, what, self.log_text()[-4000:]))
            if time.monotonic() >= deadline:
                raise AssertionError("timed out after %.0fs waiting for %s; stderr:\n%s" % (
                    timeout, what, self.log_text()[-4000:]))
            time.sleep(0.005)

    def check_log_format(self):
        """Every stderr line is a JSON object with string time, level, msg."""
        text = self.log_text()
        for line in text.split("\n"):
            if line == "":
                continue
            try:
                rec = json.loads(line)
            except ValueError:
                raise AssertionError("%s wrote a non-JSON stderr line: %r\nfull stderr:\n%s" % (
                    self.name, line[:500], text[-6000:]))
            if not isinstance(rec, dict):
                raise AssertionError("stderr line is not a JSON object: %r" % line[:500])
            for k in ("time", "level", "msg"):
                if not isinstance(rec.get(k), str) or rec.get(k) == "":
                    raise AssertionError("stderr line lacks %r: %r" % (k, line[:500]))
            if rec["level"] not in ("debug", "info", "warn", "error"):
                raise AssertionError("unknown level in %r" % line[:500])

    # --- clients ---

    def channel(self, options=None):
        ch = grpc.insecure_channel(self.address, options=options or [])
        self._channels.append(ch)
        return ch

    def close_channels(self):
        for ch in self._channels:
            ch.close()
        self._channels = []

    # --- stopping ---

    def signal(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)

    def wait(self, timeout=STOP_TIMEOUT):
        try:
            self.returncode = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError("%s did not exit within %.0fs; stderr:\n%s" % (
                self.name, timeout, self.log_text()[-4000:]))
        return self.returncode

    def stop(self, expect_rc=0, check_log=True, timeout=STOP_TIMEOUT):
        """SIGTERM, wait, and check the exit code and the log format."""
        self.close_channels()
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.signal(signal.SIGTERM)
        rc = self.wait(timeout)
        if expect_rc is not None and rc != expect_rc:
            raise AssertionError("%s exited with %s, expected %s; stderr:\n%s" % (
                self.name, rc, expect_rc, self.log_text()[-6000:]))
        if check_log:
            self.check_log_format()
        return rc

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# --- typed callers -------------------------------------------------------------

class ServiceClient:
    """Unary and streaming callables for a service, typed from its generated
    module: client.Get(request, timeout=...) etc."""

    def __init__(self, channel, module, service_name):
        self.channel = channel
        self.module = module
        self.service_name = service_name
        short = service_name.rsplit(".", 1)[1]
        sd = module.DESCRIPTOR.services_by_name[short]
        self.methods = {}
        for m in sd.methods:
            req_cls = getattr(module, m.input_type.name)
            resp_cls = getattr(module, m.output_type.name)
            path = "/%s/%s" % (service_name, m.name)
            if m.client_streaming:
                maker = channel.stream_stream if m.server_streaming else channel.stream_unary
            else:
                maker = channel.unary_stream if m.server_streaming else channel.unary_unary
            fn = maker(path, request_serializer=req_cls.SerializeToString,
                       response_deserializer=resp_cls.FromString)
            self.methods[m.name] = (fn, req_cls, resp_cls)
            setattr(self, m.name, fn)

    def request(self, method, **fields):
        return self.methods[method][1](**fields)


class BidiStream:
    """A bidirectional stream driven one request at a time."""

    _END = object()

    def __init__(self, multicallable, timeout=RPC_TIMEOUT):
        self._q = queue.Queue()
        self.call = multicallable(iter(self._q.get, self._END), timeout=timeout)

    def send(self, msg):
        self._q.put(msg)

    def recv(self):
        return next(self.call)

    def ask(self, msg):
        self.send(msg)
        return self.recv()

    def close(self):
        """Half-closes and drains the rest of the stream."""
        self._q.put(self._END)
        rest = list(self.call)
        return rest

    def cancel(self):
        self._q.put(self._END)  # unblocks grpcio's request-consuming thread
        self.call.cancel()


# --- the test case -------------------------------------------------------------

class DreyTestCase(unittest.TestCase):
    """One dreyd per test class, started with SERVER_FLAGS; stopped (and its
    exit code and log format checked) in tearDownClass."""

    SERVER_FLAGS = ()
    DRAIN_GRACE = "50ms"
    server = None

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.pb = protos()
        if cls.SERVER_FLAGS is None:
            return
        binary = find_dreyd()
        for flag in cls.SERVER_FLAGS:
            name = flag.split("=", 1)[0][2:]
            if name not in supported_flags(binary):
                raise unittest.SkipTest("this dreyd has no --%s" % name)
        cls.server = DreyServer(*cls.SERVER_FLAGS, drain_grace=cls.DRAIN_GRACE).start()
        cls.channel = cls.server.channel()
        cls.cache = ServiceClient(cls.channel, cls.pb.cache, CACHE_SERVICE)
        cls.health = ServiceClient(cls.channel, cls.pb.health, HEALTH_SERVICE)

    @classmethod
    def tearDownClass(cls):
        srv, cls.server = cls.server, None
        if srv is not None:
            srv.stop()
        super().tearDownClass()

    # --- helpers for tests ---

    def start_server(self, *flags, drain_grace="50ms", expect_rc=0, **kw):
        """A private server for one test, stopped (and checked) at cleanup."""
        srv = DreyServer(*flags, drain_grace=drain_grace, **kw).start()

        def cleanup():
            if srv.returncode is None:
                srv.stop(expect_rc=expect_rc)
        self.addCleanup(cleanup)
        return srv

    def key(self, label="k"):
        """A key no other test uses."""
        return "%s-%s-%s" % (self._testMethodName, label, uuid.uuid4().hex[:12])

    def call(self, method, request=None, client=None, timeout=RPC_TIMEOUT, **fields):
        """Calls a Cache method by name; request or keyword fields."""
        client = client or self.cache
        if request is None:
            request = client.request(method, **fields)
        return client.methods[method][0](request, timeout=timeout)

    def set(self, key, value, cache="", **fields):
        return self.call("Set", key=key, value=make_value(value), cache=cache, **fields)

    def get(self, key, cache=""):
        return self.call("Get", key=key, cache=cache)

    def get_value(self, key, cache=""):
        r = self.get(key, cache)
        self.assertTrue(r.found, "key %r not found" % key)
        return value_of(r.value)

    def last_version(self):
        """The most recent version the server handed out, by spending one:
        a Set of a scratch key (the next version is this + 1)."""
        return self.call("Set", key="~vprobe", value=make_value(b"")).version

    def assertRpcFailure(self, failure, code, reason, field=None, fields=None, secret=None, metadata=None):
        """Checks a decoded failure: status code, google.rpc.Status matching
        it, one ErrorInfo with the reason and domain drey.dev, the BadRequest
        field (or exact list of fields), and that `secret` appears nowhere."""
        f = failure
        self.assertEqual(f.code, code, "status code; got %r" % f)
        if secret is not None:
            self.assertNotIn(secret, f.everything_text(), "the error echoes the caller's input")
        if reason is None:
            return f
        self.assertIsNotNone(f.status, "no grpc-status-details-bin trailer on %r" % f)
        self.assertEqual(f.status.code, code.value[0], "google.rpc.Status.code")
        self.assertEqual(f.status.message, f.message, "google.rpc.Status.message vs grpc-message")
        self.assertTrue(f.message, "empty status message")
        self.assertEqual(f.unknown_details, [], "details of unexpected types")
        ei = f.error_info
        self.assertIsNotNone(ei, "no ErrorInfo in %r" % f)
        self.assertEqual(ei.reason, reason, "ErrorInfo.reason")
        self.assertEqual(ei.domain, DOMAIN, "ErrorInfo.domain")
        if field is not None or fields is not None:
            br = f.bad_request
            self.assertIsNotNone(br, "no BadRequest in %r" % f)
            got = [v.field for v in br.field_violations]
            if fields is not None:
                self.assertEqual(got, list(fields), "BadRequest fields")
            if field is not None:
                self.assertIn(field, got, "BadRequest fields")
                v = [v for v in br.field_violations if v.field == field][0]
                self.assertEqual(v.reason, reason, "FieldViolation.reason of %s" % field)
                self.assertTrue(v.description, "FieldViolation.description of %s" % field)
        if code == grpc.StatusCode.INVALID_ARGUMENT and reason != "MALFORMED_REQUEST":
            self.assertIsNotNone(f.bad_request, "INVALID_ARGUMENT without BadRequest: %r" % f)
        if metadata is not None:
            for k, v in metadata.items():
                self.assertEqual(f.metadata.get(k), v, "ErrorInfo.metadata[%r] in %r" % (k, f))
        return f

    @contextlib.contextmanager
    def assertRpcError(self, code, reason, field=None, fields=None, secret=None, metadata=None):
        """with self.assertRpcError(grpc.StatusCode.X, "REASON", field="key") as e:
               <the call>
           e.failure is the decoded RpcFailure."""
        holder = _ErrorHolder()
        try:
            yield holder
        except grpc.RpcError as err:
            holder.failure = RpcFailure(err)
            self.assertRpcFailure(holder.failure, code, reason, field=field, fields=fields, secret=secret,
                                  metadata=metadata)
        else:
            self.fail("expected %s %s, the call succeeded" % (code.name, reason))

    def rpcError(self, method, request, code, reason, field=None, client=None, **kw):
        """Calls a method expecting an error; returns the RpcFailure."""
        with self.assertRpcError(code, reason, field=field, **kw) as e:
            self.call(method, request, client=client)
        return e.failure

    def raw_unary(self, path, payload, response_cls=None, channel=None, timeout=RPC_TIMEOUT):
        """A unary call with hand-made request bytes (identity serializer)."""
        ch = channel or self.channel
        fn = ch.unary_unary(path, request_serializer=lambda b: b,
                            response_deserializer=(response_cls.FromString if response_cls else (lambda b: b)))
        return fn(payload, timeout=timeout)


# --- data directories (the durability tests) --------------------------------------

def storage_tool(command, data_dir, timeout=60):
    """`dreyd storage <command> <data_dir>`: the CompletedProcess (text)."""
    return subprocess.run([find_dreyd(), "storage", command, data_dir], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def read_manifest(data_dir):
    """<data_dir>/CURRENT decoded (drey.journal.v1.Manifest), or None when
    there is none. Checks the magic and the length (not the CRC)."""
    try:
        with open(os.path.join(data_dir, "CURRENT"), "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    if raw[:8] != b"DREYMAN\0" or len(raw) < 16 or struct.unpack_from("<I", raw, 8)[0] != len(raw) - 16:
        raise AssertionError("CURRENT is not a manifest: %r" % raw[:64])
    return protos().journal.Manifest.FromString(raw[16:])


def journal_segments(data_dir):
    """The journal's segment file names (<16 hex digits>.seg), in LSN order."""
    d = os.path.join(data_dir, "journal")
    return sorted(n for n in os.listdir(d) if re.fullmatch(r"[0-9a-f]{16}\.seg", n))


SEGMENT_HEADER = 64
FRAME_HEADER = 40


class Frame:
    """One journal frame as found on disk (src/journal/frame.h)."""

    def __init__(self, offset, length, lsn, batch_lsn, time_ms, payload):
        self.offset, self.length, self.lsn, self.batch_lsn = offset, length, lsn, batch_lsn
        self.time_ms, self.payload = time_ms, payload

    @property
    def size(self):
        return (FRAME_HEADER + self.length + 7) & ~7

    def record(self):
        return protos().journal.JournalRecord.FromString(self.payload)


def segment_frames(path):
    """The frames of a segment file, from its header to the first zero
    frame header (no CRC check: for tests that damage known frames)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"DREYWAL\0":
        raise AssertionError("%s is not a journal segment" % path)
    out, off = [], SEGMENT_HEADER
    while off + FRAME_HEADER <= len(data):
        length, _crc, lsn, batch_lsn, time_ms = struct.unpack_from("<IIQQq", data, off)
        if length == 0 and lsn == 0:
            break
        out.append(Frame(off, length, lsn, batch_lsn, time_ms, data[off + FRAME_HEADER:off + FRAME_HEADER + length]))
        off = out[-1].offset + out[-1].size
    return out


def patch_bytes(data, placeholder, replacement):
    """Replaces placeholder (exactly once) by replacement of the same length
    in serialized bytes, so every length prefix stays right."""
    assert len(placeholder) == len(replacement), "replacement must keep the length"
    assert data.count(placeholder) == 1, "placeholder must occur exactly once"
    return data.replace(placeholder, replacement)


def main():
    unittest.main(verbosity=2)


# --- a private mount namespace ----------------------------------------------

_NS_ENV = "DREY_TEST_PRIVATE_MOUNT_NS"


def mount_tmpfs(test, size_bytes, prefix="drey-tmpfs-"):
    """A size-limited tmpfs for test (in the private mount namespace that
    enter_private_mount_namespace gave the process), unmounted and removed
    at cleanup; skips the test where mounting is not permitted. Returns
    its mount point."""
    tmp = tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("TEST_TMPDIR"))
    test.addCleanup(shutil.rmtree, tmp, True)
    mnt = os.path.join(tmp, "mnt")
    os.mkdir(mnt)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%d,mode=0700" % size_bytes, "tmpfs", mnt],
                       capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        test.skipTest("cannot mount a tmpfs in the private mount namespace: %s" % r.stderr.strip())
    test.addCleanup(subprocess.run, ["umount", "-l", mnt], capture_output=True, timeout=30)
    # the mount is private: the first process's namespace does not see it
    try:
        with open("/proc/1/mountinfo") as f:
            test.assertNotIn(" %s " % mnt, f.read(), "the tmpfs leaked out of the mount namespace")
    except PermissionError:
        pass
    st = os.statvfs(mnt)
    test.assertLessEqual(st.f_blocks * st.f_frsize, size_bytes)
    return mnt


def mount_thin_disk(test, backing_bytes, size_bytes=64 << 20, prefix="drey-thin-"):
    """An ext4 file system of size_bytes on a loop device whose backing file
    lives on a tmpfs of backing_bytes: a thin-provisioned disk. Writes that
    need backing the tmpfs no longer has fail at writeback, so fdatasync
    returns an error (ENOSPC, then EIO) although the file system has room,
    as a full thin pool or a dying disk does. Returns (mount point, the
    tmpfs's mount point): fill the tmpfs (fill_filesystem) to make the disk
    fail. Unmounted and detached at cleanup; skips where loop devices or
    mounting are not permitted."""
    backing = mount_tmpfs(test, backing_bytes, prefix)
    image = os.path.join(backing, "disk.img")
    with open(image, "wb") as f:
        f.truncate(size_bytes)  # sparse: backed only where written
    r = subprocess.run(["losetup", "--find", "--show", image], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        test.skipTest("cannot attach a loop device: %s" % r.stderr.strip())
    dev = r.stdout.strip()
    test.addCleanup(subprocess.run, ["losetup", "-d", dev], capture_output=True, timeout=30)
    # few inodes, no ext4 journal, inode tables written now (not by a lazy
    # kernel thread later, which would take backing at any time)
    r = subprocess.run(["mkfs.ext4", "-q", "-F", "-N", "128", "-O", "^has_journal",
                        "-E", "nodiscard,lazy_itable_init=0", dev], capture_output=True, text=True, timeout=60)
    test.assertEqual(r.returncode, 0, r.stderr)
    mnt = tempfile.mkdtemp(prefix=prefix + "fs-", dir=os.environ.get("TEST_TMPDIR"))
    test.addCleanup(shutil.rmtree, mnt, True)
    r = subprocess.run(["mount", dev, mnt], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        test.skipTest("cannot mount a loop device: %s" % r.stderr.strip())
    test.addCleanup(subprocess.run, ["umount", "-l", mnt], capture_output=True, timeout=30)
    return mnt, backing


def fill_filesystem(path):
    """Writes path until its filesystem is full; returns the bytes written."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    total = 0
    try:
        for chunk in (1 << 20, 1 << 16, 4096, 512, 1):
            buf = b"\xaa" * chunk
            while True:
                try:
                    n = os.write(fd, buf)
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    break
                total += n
                if n < chunk:
                    break
    finally:
        os.close(fd)
    return total


def enter_private_mount_namespace(script):
    """Re-executes `script` (the calling test file) in a private mount
    namespace, so the filesystems a test mounts vanish with it (never
    returns), unless it already runs in one. Returns None there, or the
    reason it is not permitted here (the caller skips its tests)."""
    if os.environ.get(_NS_ENV) == "1":
        return None
    unshare = shutil.which("unshare") or "/usr/bin/unshare"
    argv = [unshare, "--mount", "--propagation", "private"]
    try:
        probe = subprocess.run(argv + ["true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return "cannot run unshare(1): %s" % e
    if probe.returncode != 0:
        return "unshare --mount is not permitted here (%s)" % probe.stderr.strip()
    env = dict(os.environ)
    env[_NS_ENV] = "1"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(unshare, argv + [sys.executable, "-u", os.path.abspath(script)] + sys.argv[1:], env)
    return "exec failed"  # not reached
