"""--max-caches bounds the caches (namespaces) a node holds at once.

A write that would open one cache more is refused before the journal with
RESOURCE_EXHAUSTED TOO_MANY_CACHES (QuotaFailure node:<id>, RetryInfo) and
leaves no trace; writes to caches that exist go on; a cache whose last entry
goes counts no more, so cache names that come and go never exhaust the node.
"""
import grpc

from drey_harness import DreyTestCase, RpcFailure, main
from drey_tokens import metadata_keys_have_units


class MaxCachesTest(DreyTestCase):
    SERVER_FLAGS = ("--max-caches=2", "--node-id=mc")

    def test_one_cache_too_many_is_refused_and_an_emptied_one_frees_its_place(self):
        self.set("k", "v", cache="one")
        self.set("k", "v", cache="two")
        try:
            self.set("k", "v", cache="three", request_id="rid-three")
            self.fail("a third cache was opened")
        except grpc.RpcError as e:
            f = RpcFailure(e)
        self.assertRpcFailure(f, grpc.StatusCode.RESOURCE_EXHAUSTED, "TOO_MANY_CACHES")
        self.assertEqual(f.quota_failure.violations[0].subject, "node:mc")
        self.assertEqual(metadata_keys_have_units(f.metadata), [])
        self.assertIsNotNone(f.retry_info)
        self.assertFalse(self.get("k", cache="three").found, "the refused write left a trace")
        self.set("k2", "v", cache="two")  # an existing cache takes writes
        self.assertTrue(self.call("Remove", key="k", cache="one").removed)
        self.set("k", "v", cache="three", request_id="rid-three")  # "one" emptied: room again
        self.assertTrue(self.get("k", cache="three").found)
        # names that come and go (one at a time beside "two") do not pile up
        self.assertTrue(self.call("Remove", key="k", cache="three").removed)
        for i in range(300):
            self.set("k", "v", cache="churn-%d" % i)
            self.assertTrue(self.call("Remove", key="k", cache="churn-%d" % i).removed)
        self.set("k", "v", cache="after-the-churn")


if __name__ == "__main__":
    main()
