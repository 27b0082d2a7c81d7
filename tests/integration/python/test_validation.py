"""Every validation error of the default configuration, as a client sees it:
status code, ErrorInfo reason and domain "drey.dev", the BadRequest field
path, messages that never echo the input, and rejected writes that leave no
trace (the entry is unchanged and the next write gets the very next version).

Bytes protobuf cannot produce from Python (invalid UTF-8) are made by editing
serialized requests in place (same length, so every length prefix holds) and
sent with an identity request_serializer."""

import base64
import os
import re
import shutil
import struct
import subprocess
import unittest

import grpc
from google.protobuf import duration_pb2, struct_pb2, timestamp_pb2

from drey_harness import DreyTestCase, main, make_value, patch_bytes, value_of

IA = grpc.StatusCode.INVALID_ARGUMENT
HOUR = duration_pb2.Duration(seconds=3600)
SECRET = "S3CR3T-7f2a9c"          # recognisable; must never come back
PH = b"@@PLACEHOLDER@@"            # replaced in serialized requests
MAX_TTL_S = 100 * 366 * 24 * 3600  # DREY_MAX_TTL_MS / 1000

CACHE = "/drey.cache.v1.Cache/"
KEY_FIELD = {"GetMany": "keys[0]", "SetMany": "entries[0].key"}
WRITES = ["Set", "SetMany", "Add", "Update", "GetOrAdd", "Remove", "Touch", "Persist", "Increment"]
ALL = ["Get", "GetMany", "GetExpiration"] + WRITES


class ValidationTest(DreyTestCase):

    def request(self, method, key="k", cache="", value=None, **extra):
        """A minimal valid request of `method` for one key."""
        pb = self.pb.cache
        value = value if value is not None else make_value("v")
        if method == "GetMany":
            fields = dict(keys=[key])
        elif method == "SetMany":
            fields = dict(entries=[pb.SetManyRequest.Entry(key=key, value=value)])
        elif method in ("Set", "Add", "Update", "GetOrAdd"):
            fields = dict(key=key, value=value)
        elif method == "Touch":
            fields = dict(key=key, ttl=HOUR)
        elif method == "Increment":
            fields = dict(key=key, delta=1)
        else:
            fields = dict(key=key)
        fields.update(extra)
        return self.cache.request(method, cache=cache, **fields)

    def response_cls(self, method):
        return self.cache.methods[method][2]

    def seeded(self, value="seed"):
        """A key holding `value`; returns (key, version)."""
        k = self.key()
        return k, self.set(k, value).version

    def assertNoTrace(self, key, value, version, last_before, cache=""):
        """The entry is unchanged and no version was consumed by the
        rejected call (last_before is last_version() taken before it)."""
        r = self.get(key, cache)
        self.assertTrue(r.found)
        self.assertEqual((value_of(r.value), r.version), (value, version), "a rejected write changed the entry")
        self.assertEqual(self.last_version(), last_before + 1, "a rejected write consumed a version")

    # --- INVALID_CACHE_NAME ---

    def test_invalid_cache_names_on_every_method(self):
        bad = ["a/b", "a b", ".", "..", "x" * 129, "caf\u00e9", "a:b", "tab\t", SECRET + "/x", "*", "#outcomes"]
        for method in ALL:
            for name in bad:
                with self.subTest(method=method, cache=name):
                    self.rpcError(method, self.request(method, cache=name), IA, "INVALID_CACHE_NAME",
                                  field="cache", secret=SECRET)

    def test_valid_cache_name_edges(self):
        for name in ["x" * 128, "...", ".a", "a.b_c-D9", "-", "_", "0"]:
            with self.subTest(cache=name):
                k = self.key()
                self.set(k, name, cache=name)
                self.assertEqual(self.get_value(k, cache=name), name)
                self.assertFalse(self.get(k).found)

    # --- INVALID_KEY ---

    def test_invalid_keys_on_every_method(self):
        bad = ["", "x" * 1025, "\u20ac" * 342, SECRET + "\n", SECRET + "\x00tail", "\x7f", "a\x1bb",
               "c1\u0085", "\u009f", "\t", "\r"]
        for method in ALL:
            for key in bad:
                with self.subTest(method=method, key=key[:20]):
                    self.rpcError(method, self.request(method, key=key), IA, "INVALID_KEY",
                                  field=KEY_FIELD.get(method, "key"), secret=SECRET)

    def test_valid_key_edges(self):
        for key in ["x" * 1024, "\u20ac" * 341 + "x", "\U0001F600", " ", "a b", "\u00a0", "\u2028",
                    "/slashes/ok", "\ufeff"]:
            with self.subTest(key=key[:10]):
                self.set(key, "ok")
                self.assertEqual(self.get_value(key), "ok")
                self.assertTrue(self.call("Remove", key=key).removed)

    def test_key_paths_in_batches(self):
        pb = self.pb.cache
        f = self.rpcError("GetMany", pb.GetManyRequest(keys=["ok", "", "fine", "x\n"]), IA, "INVALID_KEY",
                          fields=["keys[1]", "keys[3]"])
        self.assertEqual([v.reason for v in f.bad_request.field_violations], ["INVALID_KEY"] * 2)
        E = pb.SetManyRequest.Entry
        entries = [E(key="k%d" % i, value=make_value(i)) for i in range(5)]
        entries[3].key = SECRET + "\x01"
        self.rpcError("SetMany", pb.SetManyRequest(entries=entries), IA, "INVALID_KEY",
                      fields=["entries[3].key"], secret=SECRET)
        self.assertFalse(self.get("k0").found, "a rejected SetMany applied an entry")

    def test_nul_in_key_is_rejected_not_truncated(self):
        # protobuf-c would cut "a\0b" to "a": the wire pass must catch it.
        k, v = self.seeded()
        last = self.last_version()
        self.rpcError("Set", self.request("Set", key=k + "\x00tail", value=make_value("evil")), IA, "INVALID_KEY",
                      field="key")
        self.assertNoTrace(k, "seed", v, last)
        # the same, hand-edited on the wire
        data = self.request("Set", key=k + "@@@@@", value=make_value("evil")).SerializeToString()
        data = patch_bytes(data, b"@@@@@", b"\x00tail")
        with self.assertRpcError(IA, "INVALID_KEY", field="key"):
            self.raw_unary(CACHE + "Set", data, self.response_cls("Set"))
        self.assertEqual(self.get(k).version, v)
        for method in ("Remove", "Increment", "Touch", "Persist"):
            last = self.last_version()
            data = self.request(method, key=k + "@@@@").SerializeToString()
            with self.subTest(method=method), self.assertRpcError(IA, "INVALID_KEY", field="key"):
                self.raw_unary(CACHE + method, patch_bytes(data, b"@@@@", b"\x00zzz"), self.response_cls(method))
            self.assertNoTrace(k, "seed", v, last)

    def test_invalid_utf8_on_the_wire(self):
        bad_sequences = [
            b"\xff" * len(PH),                                  # never valid
            b"\xc0\xaf" + b"x" * (len(PH) - 2),                 # overlong '/'
            b"\xed\xa0\x80" + b"x" * (len(PH) - 3),             # surrogate U+D800
            b"x" * (len(PH) - 2) + b"\xe2\x82",                 # truncated sequence
            b"\xf4\x90\x80\x80" + b"x" * (len(PH) - 4),         # past U+10FFFF
            b"\x80" + b"x" * (len(PH) - 1),                     # lone continuation byte
        ]
        pb = self.pb.cache
        E = pb.SetManyRequest.Entry
        ph = PH.decode()
        cases = []
        for m in ALL:
            cases.append((m, self.request(m, key=ph), "INVALID_KEY", KEY_FIELD.get(m, "key")))
            cases.append((m, self.request(m, cache=ph), "INVALID_CACHE_NAME", "cache"))
        cases += [
            ("GetMany", pb.GetManyRequest(keys=["a", ph]), "INVALID_KEY", "keys[1]"),
            ("SetMany", pb.SetManyRequest(entries=[E(key="a", value=make_value(1)), E(key=ph, value=make_value(2))]),
             "INVALID_KEY", "entries[1].key"),
            ("Set", self.request("Set", value=make_value(ph)), "INVALID_VALUE", "value.string_value"),
            ("SetMany", pb.SetManyRequest(entries=[E(key="a", value=make_value(1)), E(key="b", value=make_value(ph))]),
             "INVALID_VALUE", "entries[1].value.string_value"),
            ("Set", self.request("Set", value=make_value({ph: 1.0})), "INVALID_VALUE", "value.json_value.fields[0].key"),
        ]
        for m in WRITES:
            cases.append((m, self.request(m, request_id=ph), "INVALID_REQUEST_ID", "request_id"))
        for method, req, reason, field in cases:
            data = req.SerializeToString()
            for seq in bad_sequences:
                with self.subTest(method=method, reason=reason, seq=seq):
                    with self.assertRpcError(IA, reason, field=field):
                        self.raw_unary(CACHE + method, patch_bytes(data, PH, seq), self.response_cls(method))
        self.assertFalse(self.get("a").found, "a rejected write applied")

    # --- INVALID_VALUE ---

    def test_missing_or_empty_value(self):
        pb = self.pb.cache
        for method in ("Set", "Add", "Update", "GetOrAdd"):
            k, v = self.seeded()
            with self.subTest(method=method, case="missing"):
                last = self.last_version()
                self.rpcError(method, self.cache.request(method, key=k), IA, "INVALID_VALUE", fields=["value"])
                self.assertNoTrace(k, "seed", v, last)
            with self.subTest(method=method, case="no kind"):
                last = self.last_version()
                self.rpcError(method, self.cache.request(method, key=k, value=pb.Value()), IA, "INVALID_VALUE",
                              fields=["value"])
                self.assertNoTrace(k, "seed", v, last)
        E = pb.SetManyRequest.Entry
        self.rpcError("SetMany", pb.SetManyRequest(entries=[E(key="a", value=make_value(1)), E(key="b"),
                                                            E(key="c", value=pb.Value())]),
                      IA, "INVALID_VALUE", fields=["entries[1].value", "entries[2].value"])
        self.assertFalse(self.get("a").found)

    def test_nul_in_string_value_is_rejected(self):
        k, v = self.seeded()
        last = self.last_version()
        self.rpcError("Set", self.request("Set", key=k, value=make_value(SECRET + "\x00rest")), IA,
                      "INVALID_VALUE", field="value.string_value", secret=SECRET)
        self.assertNoTrace(k, "seed", v, last)

    def test_value_too_deep_is_malformed(self):
        # Struct nests without bound; the server caps the depth it decodes.
        deep = struct_pb2.Struct()
        cur = deep
        for _ in range(80):
            cur = cur.fields["d"].struct_value
        cur.fields["leaf"].string_value = SECRET
        k, v = self.seeded()
        last = self.last_version()
        self.rpcError("Set", self.cache.request("Set", key=k, value=self.pb.cache.Value(json_value=deep)), IA,
                      "MALFORMED_REQUEST", secret=SECRET)
        self.assertNoTrace(k, "seed", v, last)
        # a reasonable depth is fine
        ok = struct_pb2.Struct()
        cur = ok
        for _ in range(20):
            cur = cur.fields["d"].struct_value
        self.call("Set", key=k, value=self.pb.cache.Value(json_value=ok))
        self.assertEqual(self.get(k).value.json_value, ok)

    @staticmethod
    def nested_set_request(key, depth):
        """SetRequest{key, value: {json_value: {"d": [[[... "leaf" ...]]]}}}
        with `depth` nested ListValues, built as raw bytes (fast at any
        depth: single-field messages nest as concatenated prefixes)."""
        def ld(field, payload_len):  # tag + length of a length-delimited field
            out = bytes([(field << 3) | 2])
            n = payload_len
            while True:
                b = n & 0x7f
                n >>= 7
                out += bytes([b | (0x80 if n else 0)])
                if not n:
                    return out
        tail = b"\x1a\x04leaf"  # google.protobuf.Value{string_value: "leaf"}
        prefixes, size = [], len(tail)
        for _ in range(depth):
            inner = ld(1, size)     # ListValue.values(1) -> Value
            size += len(inner)
            outer = ld(6, size)     # Value.list_value(6) -> ListValue
            size += len(outer)
            prefixes.append(outer + inner)
        nested = b"".join(reversed(prefixes)) + tail
        entry = b"\x0a\x01d" + ld(2, len(nested)) + nested  # Struct.FieldsEntry{key, value}
        struct_ = ld(1, len(entry)) + entry                  # Struct{fields}
        value = ld(6, len(struct_)) + struct_                # drey Value{json_value}
        kb = key.encode()
        return ld(2, len(kb)) + kb + ld(3, len(value)) + value

    def test_hostile_nesting_is_refused_without_crashing(self):
        """50,000 nested lists (~400 KB): refused as MALFORMED_REQUEST by the
        depth check, and the server lives on. 5 levels, built the same way,
        are stored."""
        k, v = self.seeded()
        last = self.last_version()
        with self.assertRpcError(IA, "MALFORMED_REQUEST"):
            self.raw_unary(CACHE + "Set", self.nested_set_request(k, 50000), self.response_cls("Set"))
        self.assertNoTrace(k, "seed", v, last)
        self.raw_unary(CACHE + "Set", self.nested_set_request(k, 5), self.response_cls("Set"))
        self.assertEqual(value_of(self.get(k).value), {"d": [[[[["leaf"]]]]]})

    # --- INVALID_EXPIRATION ---

    def test_invalid_durations(self):
        D = duration_pb2.Duration
        bad = [D(), D(seconds=-1), D(nanos=-1), D(seconds=1, nanos=-1), D(seconds=-1, nanos=1),
               D(nanos=1000000000), D(seconds=1, nanos=-1000000000), D(seconds=MAX_TTL_S + 1),
               D(seconds=2**62)]
        E = self.pb.cache.SetManyRequest.Entry
        for d in bad:
            for method in ("Set", "Add", "GetOrAdd", "Touch", "Increment"):
                k, v = self.seeded()
                last = self.last_version()
                with self.subTest(method=method, ttl=str(d)):
                    req = self.request(method, key=k)
                    req.ttl.CopyFrom(d)
                    self.rpcError(method, req, IA, "INVALID_EXPIRATION", fields=["ttl"])
                    self.assertNoTrace(k, "seed", v, last)
            with self.subTest(method="SetMany", ttl=str(d)):
                self.rpcError("SetMany", self.pb.cache.SetManyRequest(entries=[
                    E(key="a", value=make_value(1), ttl=HOUR), E(key="b", value=make_value(1), ttl=d)]),
                    IA, "INVALID_EXPIRATION", fields=["entries[1].ttl"])
        self.assertFalse(self.get("a").found)

    def test_touch_requires_a_ttl(self):
        k, v = self.seeded()
        self.rpcError("Touch", self.pb.cache.TouchRequest(key=k), IA, "INVALID_EXPIRATION", fields=["ttl"])

    def test_invalid_timestamps(self):
        T = timestamp_pb2.Timestamp
        bad = [T(seconds=1, nanos=-1), T(seconds=1, nanos=1000000000), T(seconds=253402300800),
               T(seconds=-62135596801), T(seconds=2**62)]
        E = self.pb.cache.SetManyRequest.Entry
        for t in bad:
            for method in ("Set", "Add", "GetOrAdd", "Increment"):
                k, v = self.seeded()
                last = self.last_version()
                with self.subTest(method=method, expires_at=str(t)):
                    req = self.request(method, key=k)
                    req.expires_at.CopyFrom(t)
                    self.rpcError(method, req, IA, "INVALID_EXPIRATION", fields=["expires_at"])
                    self.assertNoTrace(k, "seed", v, last)
            with self.subTest(method="SetMany", expires_at=str(t)):
                self.rpcError("SetMany", self.pb.cache.SetManyRequest(entries=[
                    E(key="a", value=make_value(1)), E(key="b", value=make_value(1)),
                    E(key="c", value=make_value(1), expires_at=t)]),
                    IA, "INVALID_EXPIRATION", fields=["entries[2].expires_at"])

    def test_expiration_edges_that_are_valid(self):
        D, T = duration_pb2.Duration, timestamp_pb2.Timestamp
        k = self.key()
        self.set(k, 1, ttl=D(nanos=1))               # 1 ns rounds up to 1 ms
        self.set(k, 1, ttl=D(seconds=MAX_TTL_S))     # 100 years
        self.assertTrue(self.get(k).found)
        self.set(k, 1, expires_at=T(seconds=253402300799, nanos=999999999))
        self.assertTrue(self.get(k).found)
        self.set(k, 1, expires_at=T(seconds=-62135596800))
        self.assertFalse(self.get(k).found)

    # --- INVALID_REQUEST_ID ---

    def test_request_id_length(self):
        for method in WRITES:
            k, v = self.seeded()
            with self.subTest(method=method):
                last = self.last_version()
                self.rpcError(method, self.request(method, key=k, request_id=SECRET + "x" * 129), IA,
                              "INVALID_REQUEST_ID", fields=["request_id"], secret=SECRET)
                self.assertNoTrace(k, "seed", v, last)
                # 128 bytes is accepted (ids are unique: a reused one is refused)
                rid = (method + "-" + self.key("rid")).ljust(128, "r")[:128]
                self.call(method, self.request(method, key=self.key("ok"), request_id=rid))

    # --- DUPLICATE_KEY ---

    def test_duplicate_keys_in_set_many(self):
        E = self.pb.cache.SetManyRequest.Entry
        pb = self.pb.cache
        k, v = self.seeded()
        last = self.last_version()
        self.rpcError("SetMany", pb.SetManyRequest(entries=[E(key=k, value=make_value(1)),
                                                            E(key="other", value=make_value(2)),
                                                            E(key=k, value=make_value(3))]),
                      IA, "DUPLICATE_KEY", fields=["entries[2].key"])
        self.assertNoTrace(k, "seed", v, last)
        self.assertFalse(self.get("other").found)
        self.rpcError("SetMany", pb.SetManyRequest(entries=[E(key="d", value=make_value(i)) for i in range(3)]),
                      IA, "DUPLICATE_KEY", fields=["entries[1].key", "entries[2].key"])
        # the same key in two caches is not a duplicate: SetMany names one cache
        self.call("SetMany", entries=[E(key="d1", value=make_value(1)), E(key="d2", value=make_value(1))])

    # --- BATCH_TOO_LARGE at the default limit (1000) ---

    def test_default_batch_limit(self):
        pb = self.pb.cache
        E = pb.SetManyRequest.Entry
        prefix = self.key()
        keys = ["%s-%d" % (prefix, i) for i in range(1001)]
        f = self.rpcError("GetMany", pb.GetManyRequest(keys=keys), IA, "BATCH_TOO_LARGE", field="keys",
                          metadata={"limitItems": "1000"})
        self.assertEqual(f.fields, ["keys"])
        last = self.last_version()
        self.rpcError("SetMany", pb.SetManyRequest(entries=[E(key=k, value=make_value(1)) for k in keys]), IA,
                      "BATCH_TOO_LARGE", fields=["entries"], metadata={"limitItems": "1000"})
        self.assertFalse(self.get(keys[0]).found, "a rejected SetMany applied an entry")
        self.assertEqual(self.last_version(), last + 1)
        r = self.call("SetMany", entries=[E(key=k, value=make_value(i)) for i, k in enumerate(keys[:1000])])
        self.assertEqual(len(r.results), 1000)
        vs = [x.version for x in r.results]
        self.assertEqual(vs, list(range(vs[0], vs[0] + 1000)))
        g = self.call("GetMany", keys=keys[:1000])
        self.assertEqual([x.key for x in g.results], keys[:1000])
        self.assertEqual([x.value.int64_value for x in g.results], list(range(1000)))
        self.assertEqual([x.version for x in g.results], vs)

    # --- several violations ---

    def test_all_violations_reported_first_one_wins(self):
        pb = self.pb.cache
        req = pb.SetRequest(cache="bad/cache", key="", request_id="x" * 129, ttl=duration_pb2.Duration())
        f = self.rpcError("Set", req, IA, "INVALID_CACHE_NAME", fields=["cache", "key", "value", "ttl", "request_id"])
        self.assertEqual([v.reason for v in f.bad_request.field_violations],
                         ["INVALID_CACHE_NAME", "INVALID_KEY", "INVALID_VALUE", "INVALID_EXPIRATION",
                          "INVALID_REQUEST_ID"])
        E = pb.SetManyRequest.Entry
        f = self.rpcError("SetMany", pb.SetManyRequest(entries=[E(key="k%d\n" % i, value=make_value(1))
                                                                for i in range(40)]),
                          IA, "INVALID_KEY", field="entries[0].key")
        self.assertLessEqual(len(f.fields), 40)
        self.assertEqual(f.fields, ["entries[%d].key" % i for i in range(len(f.fields))])

    # --- MALFORMED_REQUEST ---

    def test_garbage_bytes(self):
        garbage = [b"\xff\xff\xff\xff", b"\x0a\xff\x01", b"\x12\x05ab", b"\x07", b"\x0b\x00",
                   SECRET.encode() + b"\xff\xff"]
        for method in ALL:
            for g in garbage:
                with self.subTest(method=method, payload=g):
                    with self.assertRpcError(IA, "MALFORMED_REQUEST", secret=SECRET) as e:
                        self.raw_unary(CACHE + method, g, self.response_cls(method))
                    self.assertIsNone(e.failure.bad_request)
        # wrong wire type for a known field (key as varint)
        with self.assertRpcError(IA, "MALFORMED_REQUEST"):
            self.raw_unary(CACHE + "Get", b"\x10\x01", self.response_cls("Get"))
        with self.assertRpcError(IA, "MALFORMED_REQUEST"):
            self.raw_unary("/grpc.health.v1.Health/Check", b"\xff\xff", self.pb.health.HealthCheckResponse)
        self.assertEqual(self.call("Get", key="still-fine").found, False)

    def test_empty_payload_is_a_valid_empty_message(self):
        # zero bytes decode to an empty GetRequest: the key rule rejects it
        with self.assertRpcError(IA, "INVALID_KEY", field="key"):
            self.raw_unary(CACHE + "Get", b"", self.response_cls("Get"))

    def test_unknown_fields_are_ignored(self):
        k = self.key()
        data = self.request("Set", key=k).SerializeToString() + b"\xf8\x07\x01"  # field 127 varint
        self.raw_unary(CACHE + "Set", data, self.response_cls("Set"))
        self.assertEqual(self.get_value(k), "v")

    # --- UNKNOWN_METHOD ---

    def test_unknown_method_and_service(self):
        U = grpc.StatusCode.UNIMPLEMENTED
        for path in [CACHE + "Frobnicate", "/drey.cache.v1.Nope/Get", "/grpc.health.v1.Health/Nope",
                     "/no.such.Service/Get", CACHE + "get", "/" + SECRET + "/X"]:
            with self.subTest(path=path):
                with self.assertRpcError(U, "UNKNOWN_METHOD", secret=SECRET):
                    self.raw_unary(path, b"")
        # a streaming client hitting an unknown method gets the same answer
        fn = self.channel.stream_stream("/no.such.Service/Stream", request_serializer=lambda b: b,
                                        response_deserializer=lambda b: b)
        with self.assertRpcError(U, "UNKNOWN_METHOD"):
            list(fn(iter([b"x", b"y"]), timeout=30))

    # --- DEADLINE_EXCEEDED ---

    @unittest.skipUnless(shutil.which("nghttp"), "needs nghttp (nghttp2-client) to send grpc-timeout itself")
    def test_deadline_already_passed(self):
        """grpcio never sends a call whose deadline passed, so nghttp sends a
        raw gRPC request with `grpc-timeout: 0n`: the write must not run.
        (gRPC core may answer DEADLINE_EXCEEDED before drey sees the call; if
        drey answers, it must carry its ErrorInfo.)"""
        k, v = self.seeded()
        last = self.last_version()
        msg = self.request("Set", key=k, value=make_value("late")).SerializeToString()
        body = os.path.join(self.server.tmp, "deadline-body")
        with open(body, "wb") as f:
            f.write(b"\x00" + struct.pack(">I", len(msg)) + msg)
        for timeout in ("0n", "0m", "0S"):
            with self.subTest(timeout=timeout):
                out = subprocess.run(
                    ["nghttp", "-v", "-t", "20", "-H", "content-type: application/grpc", "-H", "te: trailers",
                     "-H", "grpc-timeout: " + timeout, "-d", body,
                     "http://%s%sSet" % (self.server.address, CACHE)],
                    capture_output=True, timeout=60).stdout.decode("utf-8", "replace")
                hdrs = dict(re.findall(r"recv \(stream_id=\d+\) ([a-z0-9:-]+): (.*)", out))
                self.assertEqual(hdrs.get("grpc-status"), "4", "no DEADLINE_EXCEEDED:\n" + out[-3000:])
                if "grpc-status-details-bin" in hdrs:
                    raw = hdrs["grpc-status-details-bin"]
                    st = self.pb.status.Status.FromString(base64.b64decode(raw + "=" * (-len(raw) % 4)))
                    self.assertEqual(st.code, 4)
                    ei = self.pb.error_details.ErrorInfo()
                    st.details[0].Unpack(ei)
                    self.assertEqual((ei.reason, ei.domain), ("DEADLINE_EXCEEDED", "drey.dev"))
        self.assertNoTrace(k, "seed", v, last)


if __name__ == "__main__":
    main()
