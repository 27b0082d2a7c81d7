"""Server reflection, v1 and v1alpha, used the way grpcurl uses it: list the
services, fetch the file declaring a symbol with all its transitive imports,
build a DescriptorPool from those FileDescriptorProtos alone (no local stubs),
and call the Cache dynamically.

StatusDetailsTest is a client with no .proto files that prints drey's
errors the way grpcurl --format-error does: it decodes grpc-status-details-bin
as google.rpc.Status and each Any in it through types resolved by reflection
only, for every detail type drey sends (ErrorInfo, BadRequest, QuotaFailure,
RetryInfo)."""

import os
import subprocess
import threading

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

from drey_harness import (CACHE_SERVICE, DOMAIN, HEALTH_SERVICE, REFLECTION_V1, REFLECTION_V1ALPHA, BidiStream,
                          DreyTestCase, ServiceClient, main, make_value, value_of)

CACHE_FILE = "drey/cache/v1/cache.proto"
CACHE_DEPS = {"google/protobuf/duration.proto", "google/protobuf/struct.proto", "google/protobuf/timestamp.proto",
              "google/rpc/status.proto", "google/protobuf/any.proto"}
SERVICES = {CACHE_SERVICE, HEALTH_SERVICE, REFLECTION_V1, REFLECTION_V1ALPHA}
NOT_FOUND = grpc.StatusCode.NOT_FOUND.value[0]
INVALID_ARGUMENT = grpc.StatusCode.INVALID_ARGUMENT.value[0]


def prototype(pool, full_name):
    desc = pool.FindMessageTypeByName(full_name)
    if hasattr(message_factory, "GetMessageClass"):
        return message_factory.GetMessageClass(desc)
    return message_factory.MessageFactory(pool).GetPrototype(desc)


class ReflectionMixin:
    """The tests, run once per reflection version (VERSION, SERVICE)."""

    VERSION = None
    SERVICE = None

    @property
    def mod(self):
        return getattr(self.pb, self.VERSION)

    def stream(self):
        client = ServiceClient(self.channel, self.mod, self.SERVICE)
        s = BidiStream(client.ServerReflectionInfo)
        self.addCleanup(s.cancel)
        return s

    def req(self, **kw):
        return self.mod.ServerReflectionRequest(**kw)

    def files_of(self, resp):
        self.assertEqual(resp.WhichOneof("message_response"), "file_descriptor_response", str(resp)[:500])
        return [descriptor_pb2.FileDescriptorProto.FromString(b)
                for b in resp.file_descriptor_response.file_descriptor_proto]

    def assertClosed(self, files, first):
        """files starts with `first`, has no duplicates and holds every
        transitive import."""
        names = [f.name for f in files]
        self.assertEqual(names[0], first)
        self.assertEqual(len(names), len(set(names)), "duplicate files: %s" % names)
        for f in files:
            for dep in f.dependency:
                self.assertIn(dep, names, "%s imports %s, which was not sent" % (f.name, dep))
        return set(names)

    def build_pool(self, files):
        """A DescriptorPool from the reflected files only, dependencies first."""
        pool = descriptor_pool.DescriptorPool()
        pending = list(files)
        added = set()
        while pending:
            ready = [f for f in pending if all(d in added for d in f.dependency)]
            self.assertTrue(ready, "unresolvable imports among %s" % [f.name for f in pending])
            for f in ready:
                pool.Add(f)
                added.add(f.name)
                pending.remove(f)
        return pool

    # --- tests ---

    def test_list_services(self):
        s = self.stream()
        r = s.ask(self.req(host="localhost", list_services=""))
        self.assertEqual(r.WhichOneof("message_response"), "list_services_response")
        names = {x.name for x in r.list_services_response.service}
        self.assertTrue(SERVICES <= names, "missing: %s" % (SERVICES - names))
        self.assertEqual(r.original_request.list_services, "")
        self.assertEqual(r.original_request.host, "localhost")
        self.assertEqual(r.valid_host, "localhost")

    def test_file_containing_symbol_has_transitive_deps(self):
        s = self.stream()
        for sym in (CACHE_SERVICE, "drey.cache.v1.SetRequest", "drey.cache.v1.Value",
                    "drey.cache.v1.SetManyRequest.Entry", "drey.cache.v1.GetManyResponse.Result",
                    "drey.cache.v1.Cache.Get"):
            with self.subTest(symbol=sym):
                r = s.ask(self.req(file_containing_symbol=sym))
                names = self.assertClosed(self.files_of(r), CACHE_FILE)
                self.assertEqual(names, {CACHE_FILE} | CACHE_DEPS)
                self.assertEqual(r.original_request.file_containing_symbol, sym)
        for sym, fname in ((HEALTH_SERVICE, "grpc/health/v1/health.proto"),
                           (REFLECTION_V1, "grpc/reflection/v1/reflection.proto"),
                           (REFLECTION_V1ALPHA, "grpc/reflection/v1alpha/reflection.proto"),
                           ("google.protobuf.Duration", "google/protobuf/duration.proto")):
            with self.subTest(symbol=sym):
                self.assertClosed(self.files_of(s.ask(self.req(file_containing_symbol=sym))), fname)

    def test_file_by_filename(self):
        s = self.stream()
        names = self.assertClosed(self.files_of(s.ask(self.req(file_by_filename=CACHE_FILE))), CACHE_FILE)
        self.assertEqual(names, {CACHE_FILE} | CACHE_DEPS)
        files = self.files_of(s.ask(self.req(file_by_filename="google/protobuf/struct.proto")))
        self.assertEqual([f.name for f in files], ["google/protobuf/struct.proto"])

    def test_reflected_api_is_the_one_in_proto_dir(self):
        """The served cache.proto is what proto/ compiles to (gen/ is not
        stale), source info aside."""
        s = self.stream()
        served = self.files_of(s.ask(self.req(file_by_filename=CACHE_FILE)))[0]
        served.ClearField("source_code_info")
        out = os.path.join(self.server.tmp, "cache.binpb")
        subprocess.run(["protoc", "-I" + self.pb.proto_dir, "-I/usr/include", "--descriptor_set_out=" + out,
                        CACHE_FILE], check=True)
        with open(out, "rb") as f:
            local = descriptor_pb2.FileDescriptorSet.FromString(f.read()).file[0]
        self.assertEqual(local.name, CACHE_FILE)
        self.assertEqual(served, local, "reflection serves a cache.proto that differs from proto/ (stale gen/?)")

    def test_not_found_errors_keep_the_stream(self):
        s = self.stream()
        cases = [self.req(file_containing_symbol="drey.cache.v1.Nope"),
                 self.req(file_containing_symbol="S3CR3T.sym"),
                 self.req(file_containing_symbol=""),
                 self.req(file_by_filename="drey/cache/v1/nope.proto"),
                 self.req(file_by_filename=""),
                 self.req(file_containing_extension=self.mod.ExtensionRequest(
                     containing_type="drey.cache.v1.Value", extension_number=100)),
                 self.req(all_extension_numbers_of_type="drey.cache.v1.Nope")]
        for req in cases:
            with self.subTest(request=str(req).strip()):
                r = s.ask(req)
                self.assertEqual(r.WhichOneof("message_response"), "error_response", str(r))
                self.assertEqual(r.error_response.error_code, NOT_FOUND)
                self.assertNotIn("S3CR3T", r.error_response.error_message)
                self.assertEqual(r.original_request, req)
        # the stream still answers
        self.assertEqual(s.ask(self.req(list_services="")).WhichOneof("message_response"), "list_services_response")
        self.assertEqual(s.close(), [])
        self.assertEqual(s.call.code(), grpc.StatusCode.OK)

    def test_extension_numbers_and_empty_request(self):
        s = self.stream()
        r = s.ask(self.req(all_extension_numbers_of_type="drey.cache.v1.Value"))
        self.assertEqual(r.WhichOneof("message_response"), "all_extension_numbers_response")
        self.assertEqual(r.all_extension_numbers_response.base_type_name, "drey.cache.v1.Value")
        self.assertEqual(list(r.all_extension_numbers_response.extension_number), [])
        r = s.ask(self.req())
        self.assertEqual(r.WhichOneof("message_response"), "error_response")
        self.assertEqual(r.error_response.error_code, INVALID_ARGUMENT)

    def test_many_requests_on_one_stream(self):
        s = self.stream()
        reqs = [self.req(list_services=""), self.req(file_containing_symbol=CACHE_SERVICE),
                self.req(file_by_filename="grpc/health/v1/health.proto"),
                self.req(file_containing_symbol="no.such.Symbol")] * 10
        # pipelined: all sent before reading any answer
        for r in reqs:
            s.send(r)
        answers = [s.recv() for _ in reqs]
        kinds = [a.WhichOneof("message_response") for a in answers]
        self.assertEqual(kinds, ["list_services_response", "file_descriptor_response", "file_descriptor_response",
                                 "error_response"] * 10)
        for q, a in zip(reqs, answers):
            self.assertEqual(a.original_request, q)
        self.assertEqual(s.close(), [])

    def test_concurrent_streams(self):
        errors = []

        def worker():
            try:
                s = BidiStream(ServiceClient(self.channel, self.mod, self.SERVICE).ServerReflectionInfo)
                for _ in range(20):
                    self.files_of(s.ask(self.req(file_containing_symbol=CACHE_SERVICE)))
                s.close()
            except Exception as e:  # reported below
                errors.append(e)
        threads = [threading.Thread(target=worker) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertEqual(errors, [])

    def test_malformed_request_ends_the_stream(self):
        fn = self.channel.stream_stream("/%s/ServerReflectionInfo" % self.SERVICE, request_serializer=lambda b: b,
                                        response_deserializer=lambda b: b)
        with self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_REQUEST"):
            list(fn(iter([b"\xff\xff\xff"]), timeout=30))

    def test_dynamic_call_like_grpcurl(self):
        s = self.stream()
        services = [x.name for x in s.ask(self.req(list_services="")).list_services_response.service]
        self.assertIn(CACHE_SERVICE, services)
        files = self.files_of(s.ask(self.req(file_containing_symbol=CACHE_SERVICE)))
        pool = self.build_pool(files)
        svc = pool.FindServiceByName(CACHE_SERVICE)
        methods = {m.name: m for m in svc.methods}
        self.assertEqual(set(methods), {"Get", "GetMany", "Set", "SetMany", "Add", "Update", "GetOrAdd", "Remove",
                                        "Touch", "Persist", "GetExpiration", "Increment", "RemoveMany", "Scan",
                                        "Clear", "ListCaches", "GetCacheStats", "Pipeline", "Watch"})
        self.assertTrue(methods["Watch"].server_streaming)
        set_m, get_m = methods["Set"], methods["Get"]
        self.assertEqual(set_m.input_type.full_name, "drey.cache.v1.SetRequest")
        SetRequest = prototype(pool, set_m.input_type.full_name)
        SetResponse = prototype(pool, set_m.output_type.full_name)
        GetRequest = prototype(pool, get_m.input_type.full_name)
        GetResponse = prototype(pool, get_m.output_type.full_name)
        key = "reflected-%s" % self.VERSION

        req = SetRequest()
        req.cache = "dyn"
        req.key = key
        req.value.json_value.fields["via"].string_value = "reflection " + self.VERSION
        req.value.json_value.fields["n"].number_value = 42
        req.ttl.seconds = 3600
        path = lambda m: "/%s/%s" % (svc.full_name, m.name)
        set_rpc = self.channel.unary_unary(path(set_m), request_serializer=lambda m: m.SerializeToString(),
                                           response_deserializer=SetResponse.FromString)
        get_rpc = self.channel.unary_unary(path(get_m), request_serializer=lambda m: m.SerializeToString(),
                                           response_deserializer=GetResponse.FromString)
        sr = set_rpc(req, timeout=30)
        self.assertGreater(sr.version, 0)
        self.assertTrue(sr.HasField("expires_at"))
        g = GetRequest()
        g.cache = "dyn"
        g.key = key
        gr = get_rpc(g, timeout=30)
        self.assertTrue(gr.found)
        self.assertEqual(gr.version, sr.version)
        self.assertEqual(gr.value.json_value.fields["via"].string_value, "reflection " + self.VERSION)
        self.assertEqual(gr.value.json_value.fields["n"].number_value, 42)
        # and the typed client agrees
        self.assertEqual(value_of(self.get(key, cache="dyn").value), {"via": "reflection " + self.VERSION, "n": 42.0})


class DynamicDetails:
    """Decodes google.rpc.Status and its details with types fetched from the
    server's reflection (version `mod`) and nothing else."""

    TYPE_PREFIX = "type.googleapis.com/"

    def __init__(self, test, mod, service):
        self.test = test
        self.mod = mod
        self.stream = BidiStream(ServiceClient(test.channel, mod, service).ServerReflectionInfo)
        test.addCleanup(self.stream.cancel)
        self.pool = descriptor_pool.DescriptorPool()
        self.added = set()

    def resolve(self, full_name):
        """The message class of full_name, its files fetched by reflection."""
        r = self.stream.ask(self.mod.ServerReflectionRequest(file_containing_symbol=full_name))
        self.test.assertEqual(r.WhichOneof("message_response"), "file_descriptor_response",
                              "reflection cannot describe %s: %s" % (full_name, str(r)[:300]))
        pending = [descriptor_pb2.FileDescriptorProto.FromString(b)
                   for b in r.file_descriptor_response.file_descriptor_proto]
        pending = [f for f in pending if f.name not in self.added]
        while pending:
            ready = [f for f in pending if all(d in self.added for d in f.dependency)]
            self.test.assertTrue(ready, "imports not served with %s: %s" % (full_name, [f.name for f in pending]))
            for f in ready:
                self.pool.Add(f)
                self.added.add(f.name)
                pending.remove(f)
        return prototype(self.pool, full_name)

    def decode(self, err):
        """(Status, [(type name, detail message)]) of a failed call."""
        raw = dict(err.trailing_metadata() or ()).get("grpc-status-details-bin")
        self.test.assertIsNotNone(raw, "no grpc-status-details-bin on %r" % err)
        status = self.resolve("google.rpc.Status").FromString(raw)
        details = []
        for any_ in status.details:
            self.test.assertTrue(any_.type_url.startswith(self.TYPE_PREFIX), any_.type_url)
            name = any_.type_url[len(self.TYPE_PREFIX):]
            details.append((name, self.resolve(name).FromString(any_.value)))
        # what grpcurl --format-error would print
        print("%s %s" % (err.code().name, text_format.MessageToString(status, as_one_line=True)[:200]))
        for name, msg in details:
            print("  %s { %s }" % (name, text_format.MessageToString(msg, as_one_line=True)))
        return status, details


class StatusDetailsTest(DreyTestCase):
    """Every detail type drey sends, decoded through reflection alone."""

    NODE = "details-node"
    LIMIT = 256 * 1024
    SERVER_FLAGS = ("--memory-limit=%d" % LIMIT, "--node-id=" + NODE)

    def failure(self, fn, *args, **kw):
        try:
            fn(*args, timeout=30, **kw)
        except grpc.RpcError as e:
            return e
        self.fail("the call succeeded")

    def check(self, client, err, code, reason, types):
        status, details = client.decode(err)
        self.assertEqual(err.code(), code)
        self.assertEqual(status.code, code.value[0])
        self.assertEqual(status.message, err.details())
        self.assertEqual([n for n, _ in details], types)
        ei = details[0][1]
        self.assertEqual(ei.reason, reason)
        self.assertEqual(ei.domain, DOMAIN)
        return dict(details)

    def test_every_detail_type_through_reflection(self):
        for version, service in (("reflection_v1", REFLECTION_V1), ("reflection_v1alpha", REFLECTION_V1ALPHA)):
            with self.subTest(reflection=version):
                client = DynamicDetails(self, getattr(self.pb, version), service)
                # ErrorInfo alone: a request that is not a SetRequest at all
                raw = self.channel.unary_unary("/%s/Set" % CACHE_SERVICE, request_serializer=lambda b: b,
                                               response_deserializer=lambda b: b)
                err = self.failure(raw, b"\xff\xff\xff")
                self.check(client, err, grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_REQUEST", ["google.rpc.ErrorInfo"])

                # ErrorInfo + BadRequest: a validation error
                err = self.failure(self.cache.Set, self.pb.cache.SetRequest(key="", value=make_value("v")))
                d = self.check(client, err, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_KEY",
                               ["google.rpc.ErrorInfo", "google.rpc.BadRequest"])
                fv = d["google.rpc.BadRequest"].field_violations
                self.assertEqual([(v.field, v.reason) for v in fv], [("key", "INVALID_KEY")])
                self.assertTrue(fv[0].description)

                # ErrorInfo + QuotaFailure + RetryInfo: a memory refusal (a
                # value larger than the critical level on its own)
                err = self.failure(self.cache.Set, self.pb.cache.SetRequest(
                    key=self.key(), value=make_value(b"m" * (self.LIMIT + 1))))
                d = self.check(client, err, grpc.StatusCode.RESOURCE_EXHAUSTED, "MEMORY_PRESSURE",
                               ["google.rpc.ErrorInfo", "google.rpc.QuotaFailure", "google.rpc.RetryInfo"])
                ei = d["google.rpc.ErrorInfo"]
                self.assertEqual(ei.metadata["limitBytes"], str(self.LIMIT))
                self.assertEqual(set(ei.metadata), {"limitBytes", "usedBytes", "criticalBytes", "requestBytes"})
                qv = d["google.rpc.QuotaFailure"].violations
                self.assertEqual([v.subject for v in qv], ["node:" + self.NODE])
                self.assertTrue(qv[0].description)
                delay = d["google.rpc.RetryInfo"].retry_delay
                self.assertEqual(delay.DESCRIPTOR.full_name, "google.protobuf.Duration")
                self.assertGreater(delay.seconds * 1000 + delay.nanos // 1000000, 0)
                # the types came from the server, not from local stubs
                self.assertIn("google/rpc/error_details.proto", client.added)
                self.assertIn("google/rpc/status.proto", client.added)


class ReflectionV1Test(ReflectionMixin, DreyTestCase):
    VERSION = "reflection_v1"
    SERVICE = REFLECTION_V1


class ReflectionV1AlphaTest(ReflectionMixin, DreyTestCase):
    VERSION = "reflection_v1alpha"
    SERVICE = REFLECTION_V1ALPHA


if __name__ == "__main__":
    main()
