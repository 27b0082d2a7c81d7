"""Configured limits: values (--max-value-bytes), batches (--max-batch), keys
and cache names (--max-key-bytes, --max-cache-name-bytes) and whole
messages (--max-recv-message-bytes), each set small so the tests stay fast;
after every refusal the server keeps serving and nothing was written."""

import grpc
from google.protobuf import struct_pb2

from drey_harness import CACHE_SERVICE, DreyTestCase, ServiceClient, main, make_value, value_of

IA = grpc.StatusCode.INVALID_ARGUMENT
SECRET = "S3CR3T-limits-51d0"
VALUE_LIMIT = 1024
BATCH_LIMIT = 5


class LimitsTest(DreyTestCase):
    SERVER_FLAGS = ("--max-value-bytes=1KiB", "--max-batch=%d" % BATCH_LIMIT, "--max-recv-message-bytes=64KiB",
                    "--max-key-bytes=16", "--max-cache-name-bytes=8")

    def key(self, label="k"):
        return "%s-%d" % (label[:6], self.id_counter())

    _n = 0

    @classmethod
    def id_counter(cls):
        cls._n += 1
        return cls._n

    def assertServing(self):
        h = self.health.Check(self.pb.health.HealthCheckRequest(service=""), timeout=30)
        self.assertEqual(h.status, self.pb.health.HealthCheckResponse.SERVING)
        k = self.key("alive")
        self.set(k, "yes")
        self.assertEqual(self.get_value(k), "yes")

    # --- PAYLOAD_TOO_LARGE ---

    def test_value_limit(self):
        too_big = [b"\x00" * (VALUE_LIMIT + 1), "x" * (VALUE_LIMIT + 1),
                   "\u20ac" * 342,  # 342 characters, 1026 bytes: the limit counts bytes
                   {"blob": SECRET + "y" * VALUE_LIMIT}]
        fits = [b"\x00" * VALUE_LIMIT, "x" * VALUE_LIMIT, "\u20ac" * 341, {"s": "y" * 900}, 2**63 - 1, 1.5,
                True, None]
        for v in too_big:
            for method in ("Set", "Add", "GetOrAdd", "Update"):
                with self.subTest(method=method, value=str(v)[:16]):
                    k = self.key()
                    ver = self.set(k, "seed").version
                    last = self.last_version()
                    self.rpcError(method, self.cache.request(method, key=k, value=make_value(v)), IA,
                                  "PAYLOAD_TOO_LARGE", fields=["value"], metadata={"limitBytes": "1024"},
                                  secret=SECRET)
                    r = self.get(k)
                    self.assertEqual((value_of(r.value), r.version), ("seed", ver))
                    self.assertEqual(self.last_version(), last + 1, "a rejected write consumed a version")
        for v in fits:
            with self.subTest(fits=str(v)[:16]):
                k = self.key()
                self.set(k, v)
                self.assertEqual(self.get_value(k), v)

    def test_value_limit_in_set_many(self):
        E = self.pb.cache.SetManyRequest.Entry
        ka, kb = self.key("a"), self.key("b")
        self.rpcError("SetMany", self.pb.cache.SetManyRequest(entries=[
            E(key=ka, value=make_value("small")), E(key=kb, value=make_value(b"z" * (VALUE_LIMIT + 1)))]),
            IA, "PAYLOAD_TOO_LARGE", fields=["entries[1].value"], metadata={"limitBytes": "1024"})
        self.assertFalse(self.get(ka).found, "a rejected SetMany applied an entry")

    def test_json_limit_counts_the_encoded_struct(self):
        st = struct_pb2.Struct()
        for i in range(60):
            st.fields["field-%02d" % i].number_value = i  # ~60 * 20 encoded bytes
        self.assertGreater(st.ByteSize(), VALUE_LIMIT)
        self.rpcError("Set", self.cache.request("Set", key=self.key(), value=self.pb.cache.Value(json_value=st)),
                      IA, "PAYLOAD_TOO_LARGE", fields=["value"])

    # --- BATCH_TOO_LARGE ---

    def test_batch_limit(self):
        pb = self.pb.cache
        E = pb.SetManyRequest.Entry
        keys = [self.key("b%d" % i) for i in range(BATCH_LIMIT + 1)]
        self.rpcError("GetMany", pb.GetManyRequest(keys=keys), IA, "BATCH_TOO_LARGE", fields=["keys"],
                      metadata={"limitItems": str(BATCH_LIMIT)})
        self.rpcError("SetMany", pb.SetManyRequest(entries=[E(key=k, value=make_value(1)) for k in keys]), IA,
                      "BATCH_TOO_LARGE", fields=["entries"], metadata={"limitItems": str(BATCH_LIMIT)})
        self.assertFalse(self.get(keys[0]).found)
        r = self.call("SetMany", entries=[E(key=k, value=make_value(i)) for i, k in enumerate(keys[:BATCH_LIMIT])])
        self.assertEqual(len(r.results), BATCH_LIMIT)
        g = self.call("GetMany", keys=keys[:BATCH_LIMIT])
        self.assertEqual([value_of(x.value) for x in g.results], list(range(BATCH_LIMIT)))
        # a batch too large and with bad keys reports both
        f = self.rpcError("GetMany", pb.GetManyRequest(keys=keys + [""]), IA, "BATCH_TOO_LARGE")
        self.assertEqual(f.fields, ["keys", "keys[%d]" % (BATCH_LIMIT + 1)])

    # --- key and cache name lengths ---

    def test_key_and_cache_name_limits(self):
        self.set("k" * 16, "ok", cache="c" * 8)
        self.assertEqual(self.get_value("k" * 16, cache="c" * 8), "ok")
        self.set("\u00e9" * 8, "ok")  # 16 bytes
        self.rpcError("Set", self.cache.request("Set", key="k" * 17, value=make_value(1)), IA, "INVALID_KEY",
                      fields=["key"])
        self.rpcError("Get", self.cache.request("Get", key="\u00e9" * 8 + "x"), IA, "INVALID_KEY", fields=["key"])
        self.rpcError("Get", self.cache.request("Get", key="k", cache="c" * 9), IA, "INVALID_CACHE_NAME",
                      fields=["cache"])

    # --- whole messages ---

    def test_oversized_message(self):
        k = self.key()
        ver = self.set(k, "seed").version
        big = self.cache.request("Set", key=k, value=make_value(b"\x01" * (100 * 1024)))
        self.assertGreater(big.ByteSize(), 64 * 1024)
        for _ in range(3):
            with self.assertRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, None):
                self.call("Set", big)
        self.assertServing()
        r = self.get(k)
        self.assertEqual((value_of(r.value), r.version), ("seed", ver), "an oversized Set was applied")
        # just under the transport limit, over the value limit: drey's own answer
        mid = self.cache.request("Set", key=k, value=make_value(b"\x01" * (60 * 1024)))
        self.assertLess(mid.ByteSize(), 64 * 1024)
        self.rpcError("Set", mid, IA, "PAYLOAD_TOO_LARGE", fields=["value"])
        # and a fresh connection works too
        ch = self.server.channel()
        c2 = ServiceClient(ch, self.pb.cache, CACHE_SERVICE)
        self.assertEqual(value_of(c2.Get(self.cache.request("Get", key=k), timeout=30).value), "seed")

    def test_oversized_batch_message(self):
        keys = ["%05d" % i + "x" * 11 for i in range(5000)]  # ~90 KiB of keys
        with self.assertRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, None):
            self.call("GetMany", keys=keys)
        self.assertServing()


if __name__ == "__main__":
    main()
