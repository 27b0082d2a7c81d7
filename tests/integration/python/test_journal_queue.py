"""--max-inflight bounds the work callers can queue, even when they give up.

A write admitted by backpressure waits for the journal's writer. Callers
with short deadlines go away while their writes wait; the slot each held
must stay taken until the write is done, or a flood of such callers queues
unbounded work (and memory) in the journal. These tests flood a durable node
whose writer is slowed by --batch-wait with writes whose deadlines expire at
once, then read the journal queue's peak from the readiness details and the
process's resident memory. A refusal for a full journal queue is checked
too (JOURNAL_QUEUE_FULL, with its details, and no trace).
"""
import concurrent.futures
import os
import grpc

from drey_harness import CACHE_SERVICE, DreyTestCase, RpcFailure, ServiceClient, main, make_value
from drey_tokens import details, fresh_channel, metadata_keys_have_units, ops_port

VALUE = b"v" * (64 * 1024)


def rss_bytes(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class JournalQueueTest(DreyTestCase):
    SERVER_FLAGS = None

    def flood(self, srv, n, deadline_s, parallel=64):
        """n Sets of 64 KiB, `parallel` at a time, each with its own
        deadline; returns the outcomes' codes."""
        ch = fresh_channel(srv.address)
        self.addCleanup(ch.close)
        cache = ServiceClient(ch, self.pb.cache, CACHE_SERVICE)
        fn, req_cls, _ = cache.methods["Set"]

        def one(i):
            try:
                fn(req_cls(key="flood-%d" % i, value=make_value(VALUE)), timeout=deadline_s)
                return grpc.StatusCode.OK
            except grpc.RpcError as e:
                return e.code()

        with concurrent.futures.ThreadPoolExecutor(parallel) as ex:
            return list(ex.map(one, range(n)))

    def test_writes_whose_callers_gave_up_stay_within_max_inflight(self):
        srv = self.start_server("--ops-listen=127.0.0.1:0", "--max-inflight=8",
                                "--max-queued=8", "--batch-wait=200ms", "--slowdown-at=1000")
        port = ops_port(srv)
        rss_before = rss_bytes(srv.proc.pid)
        codes = self.flood(srv, 1500, 0.01)
        self.assertIn(grpc.StatusCode.DEADLINE_EXCEEDED, codes, "the flood's deadlines did not expire")
        j = details(srv, port)["journal"]
        self.assertLessEqual(int(j["queuedRecordsPeak"]), 8,
                             "more writes waited for the disk than --max-inflight admits: %r" % j)
        if os.environ.get("ASAN_OPTIONS"):
            return  # ASan keeps freed memory in quarantine (256 MiB): resident size says nothing there
        grown = rss_bytes(srv.proc.pid) - rss_before
        # 1500 x 64 KiB were sent; 8 in the journal's queue are 512 KiB.
        self.assertLess(grown, 64 << 20, "resident memory grew by %d bytes" % grown)

    def test_a_full_journal_queue_refuses_with_details_and_no_trace(self):
        srv = self.start_server("--ops-listen=127.0.0.1:0", "--max-inflight=64",
                                "--journal-max-queued=2", "--batch-wait=1s", "--node-id=jq")
        port = ops_port(srv)
        ch = fresh_channel(srv.address)
        self.addCleanup(ch.close)
        cache = ServiceClient(ch, self.pb.cache, CACHE_SERVICE)
        fn, req_cls, _ = cache.methods["Set"]
        futs = [fn.future(req_cls(key="q-%d" % i, value=make_value(b"x")), timeout=30) for i in range(16)]
        failures = []
        for f in futs:
            try:
                f.result()
            except grpc.RpcError as e:
                failures.append(RpcFailure(e))
        self.assertTrue(failures, "16 writes at once and a queue of 2: nothing was refused")
        ok = len(futs) - len(failures)
        for f in failures:
            self.assertRpcFailure(f, grpc.StatusCode.RESOURCE_EXHAUSTED, "JOURNAL_QUEUE_FULL")
            self.assertEqual(sorted(f.details), ["ErrorInfo", "QuotaFailure", "RetryInfo"], repr(f))
            self.assertEqual(metadata_keys_have_units(f.metadata), [], repr(f.metadata))
            self.assertEqual(f.quota_failure.violations[0].subject, "node:jq")
        j = details(srv, port)["journal"]
        self.assertEqual(int(j["queueRejections"]), len(failures))
        self.assertEqual(int(j["lastLsn"]), ok, "a refused write reached the journal")
        for i, f in enumerate(futs):
            got = self.call("Get", client=cache, key="q-%d" % i)
            self.assertEqual(got.found, f.exception() is None, "key q-%d" % i)


if __name__ == "__main__":
    main()
