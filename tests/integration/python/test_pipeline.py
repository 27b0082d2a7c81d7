"""drey.cache.v1.Cache/Pipeline through Python grpcio: answers in stream
order with the client's ids, same-key operations in stream order, a refused
operation failing alone with the details the unary call would carry, the
window (the server stops reading a stream whose operations it cannot
answer), cancellation of waiting operations, per-operation timeouts, and a
stream of 100,000 operations.

Slots are held with the slowdown, as in test_backpressure.py: with
--slowdown-at=0 and --max-inflight=1 the first admitted operation is held
back (keeping its slot) for --slowdown-max-delay, and the others wait in the
queue, so what is running and waiting is read from /health/ready/details.
"""

import threading

import grpc
from google.protobuf import duration_pb2

from drey_harness import CACHE_SERVICE, BidiStream, DreyTestCase, ServiceClient, main, make_value, value_of
from drey_tokens import details, fresh_channel, ops_port, poll


def status_failure_fields(status, pb):
    """(reason, [BadRequest fields]) of a google.rpc.Status message."""
    reason, fields = None, []
    for d in status.details:
        if d.Is(pb.error_details.ErrorInfo.DESCRIPTOR):
            ei = pb.error_details.ErrorInfo()
            d.Unpack(ei)
            reason = ei.reason
        elif d.Is(pb.error_details.BadRequest.DESCRIPTOR):
            br = pb.error_details.BadRequest()
            d.Unpack(br)
            fields = [v.field for v in br.field_violations]
    return reason, fields


class PipelineCase(DreyTestCase):
    SERVER_FLAGS = ("--pipeline-window=1024", "--max-inflight=2048", "--principal-max-inflight=1024",
                    "--principal-max-queued=1024")

    def op(self, id, **kw):
        return self.pb.cache.PipelineOperation(id=id, **kw)

    def req(self, *ops):
        return self.pb.cache.PipelineRequest(operations=list(ops))

    def stream(self, client=None, timeout=60):
        client = client or self.cache
        s = BidiStream(client.Pipeline, timeout=timeout)
        self.addCleanup(s.cancel)
        return s

    def results(self, s, n):
        out = []
        while len(out) < n:
            out.extend(s.recv().results)
        return out

    def test_answers_in_order_with_ids_and_same_key_in_stream_order(self):
        k, other = self.key(), self.key("other")
        c = self.pb.cache
        s = self.stream()
        s.send(self.req(
            self.op(7, set=c.SetRequest(key=k, value=make_value(b"one"))),
            self.op(3, get=c.GetRequest(key=k)),
            self.op(9, set=c.SetRequest(key=other, value=make_value(b"x"))),
            self.op(1, set=c.SetRequest(key=k, value=make_value(b"two"))),
            self.op(2, get=c.GetRequest(key=k)),
            self.op(5, increment=c.IncrementRequest(key=self.key("n"), delta=2)),
        ))
        s.send(self.req(self.op(4, remove=c.RemoveRequest(key=k)), self.op(8, get=c.GetRequest(key=k))))
        got = self.results(s, 8)
        self.assertEqual([r.id for r in got], [7, 3, 9, 1, 2, 5, 4, 8])
        for r in got:
            self.assertEqual(r.status.code, 0, r)
        self.assertEqual(got[0].WhichOneof("response"), "set")
        self.assertEqual(value_of(got[1].get.value), b"one")
        self.assertEqual(got[1].get.version, got[0].set.version)
        self.assertEqual(value_of(got[4].get.value), b"two")
        self.assertGreater(got[3].set.version, got[0].set.version)
        self.assertEqual(got[5].increment.value, 2)
        self.assertTrue(got[6].remove.removed)
        self.assertFalse(got[7].get.found)
        self.assertEqual(s.close(), [])
        # what the stream wrote is what unary calls see
        self.assertEqual(self.get_value(other), b"x")

    def test_whole_cache_operations_keep_stream_order(self):
        c = self.pb.cache
        cache = "wc" + self.key()[-8:]
        s = self.stream()
        s.send(self.req(
            self.op(1, set=c.SetRequest(cache=cache, key="a", value=make_value(b"1"))),
            self.op(2, set=c.SetRequest(cache=cache, key="b", value=make_value(b"2"))),
            self.op(3, scan=c.ScanRequest(cache=cache, limit=1000)),
            self.op(4, clear=c.ClearRequest(cache=cache)),
            self.op(5, get_many=c.GetManyRequest(cache=cache, keys=["a", "a", "b"])),
            self.op(6, set_many=c.SetManyRequest(cache=cache, entries=[
                c.SetManyRequest.Entry(key="a", value=make_value(b"3"))])),
            self.op(7, get_cache_stats=c.GetCacheStatsRequest(cache=cache)),
            self.op(8, list_caches=c.ListCachesRequest()),
            self.op(9, get=c.GetRequest(cache=cache, key="a")),
        ))
        got = self.results(s, 9)
        self.assertEqual([r.id for r in got], list(range(1, 10)))
        for r in got:
            self.assertEqual(r.status.code, 0, r)
        self.assertEqual(sorted(i.key for i in got[2].scan.items), ["a", "b"])
        self.assertEqual([x.found for x in got[4].get_many.results], [False, False, False])
        self.assertEqual(got[6].get_cache_stats.entries, 1)
        self.assertIn(cache, [x.cache for x in got[7].list_caches.caches])
        self.assertEqual(value_of(got[8].get.value), b"3")
        s.close()

    def test_a_refused_operation_fails_alone_with_the_unary_details(self):
        c = self.pb.cache
        k = self.key()
        bad = c.SetRequest(key="", value=make_value(b"v"))
        unary = self.rpcError("Set", bad, grpc.StatusCode.INVALID_ARGUMENT, "INVALID_KEY", field="key")
        s = self.stream()
        s.send(self.req(self.op(1, set=c.SetRequest(key=k, value=make_value(b"ok"))),
                        self.op(2, set=bad),
                        self.op(3, get=c.GetRequest(key=k)),
                        self.op(4)))  # no request at all
        got = self.results(s, 4)
        self.assertEqual([r.id for r in got], [1, 2, 3, 4])
        self.assertEqual(got[0].status.code, 0)
        st = got[1].status
        self.assertEqual(st.code, grpc.StatusCode.INVALID_ARGUMENT.value[0])
        self.assertEqual(st.message, unary.message)
        self.assertEqual(st.SerializeToString(), unary.status.SerializeToString(), "the unary trailer's Status")
        self.assertIsNone(got[1].WhichOneof("response"))
        self.assertEqual(status_failure_fields(st, self.pb), ("INVALID_KEY", ["key"]))
        self.assertEqual(value_of(got[2].get.value), b"ok", "the stream went on")
        self.assertEqual(got[3].status.code, grpc.StatusCode.INVALID_ARGUMENT.value[0])
        self.assertEqual(status_failure_fields(got[3].status, self.pb)[0], "MALFORMED_REQUEST")
        self.assertEqual(s.close(), [])

    def test_an_operation_timeout_already_passed_is_deadline_exceeded(self):
        c = self.pb.cache
        k = self.key()
        s = self.stream()
        s.send(self.req(self.op(1, timeout=duration_pb2.Duration(nanos=0), get=c.GetRequest(key=k)),
                        self.op(2, timeout=duration_pb2.Duration(seconds=30), get=c.GetRequest(key=k))))
        got = self.results(s, 2)
        self.assertEqual(got[0].status.code, grpc.StatusCode.DEADLINE_EXCEEDED.value[0])
        self.assertEqual(status_failure_fields(got[0].status, self.pb)[0], "DEADLINE_EXCEEDED")
        self.assertEqual(got[1].status.code, 0)
        self.assertFalse(got[1].get.found)
        s.close()

    def test_a_response_message_holds_at_most_512_results(self):
        c = self.pb.cache
        s = self.stream()
        s.send(self.req(*[self.op(i, get=c.GetRequest(key="m%d" % i)) for i in range(1000)]))
        sizes, ids = [], []
        while len(ids) < 1000:
            m = s.recv()
            sizes.append(len(m.results))
            ids.extend(r.id for r in m.results)
        self.assertEqual(ids, list(range(1000)))
        self.assertLessEqual(max(sizes), 512, sizes)
        s.close()

    def test_large_answers_are_split_below_the_clients_message_limit(self):
        c = self.pb.cache
        k = self.key()
        big = b"x" * (200 * 1024)
        self.set(k, big)
        s = self.stream()
        n = 40  # 8 MB of answers: one message would pass grpcio's 4 MiB limit
        s.send(self.req(*[self.op(i, get=c.GetRequest(key=k)) for i in range(n)]))
        messages, got = 0, 0
        while got < n:
            m = s.recv()
            messages += 1
            self.assertLess(m.ByteSize(), (1 << 20) + len(big) + 1024)
            for r in m.results:
                self.assertEqual(r.id, got)
                self.assertEqual(value_of(r.get.value), big)
                got += 1
        self.assertGreaterEqual(messages, 7)
        s.close()

    def test_a_stream_of_100000_operations(self):
        c = self.pb.cache
        n, per = 100000, 500
        prefix = self.key()
        s = self.stream(timeout=300)
        errors = []

        def reader():
            try:
                want = 0
                while want < n:
                    for r in s.recv().results:
                        if r.id != want or r.status.code != 0:
                            errors.append((want, r))
                            return
                        if want % 2 == 1 and value_of(r.get.value) != b"%d" % (want - 1):
                            errors.append((want, r))
                            return
                        want += 1
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)

        t = threading.Thread(target=reader)
        t.start()
        for base in range(0, n, per):
            ops = []
            for i in range(base, base + per, 2):
                key = "%s-%d" % (prefix, i // 2 % 1000)
                ops.append(self.op(i, set=c.SetRequest(key=key, value=make_value(b"%d" % i))))
                ops.append(self.op(i + 1, get=c.GetRequest(key=key)))
            s.send(self.req(*ops))
        t.join(timeout=300)
        self.assertFalse(t.is_alive(), "the reader did not finish")
        self.assertEqual(errors, [])
        self.assertEqual(s.close(), [])


class PipelineBudgetCase(DreyTestCase):
    """Each operation takes its own ticket: a stream whose window is larger
    than its principal's budget gets refusals, per operation, and goes on."""

    SERVER_FLAGS = ("--pipeline-window=1024", "--principal-max-inflight=4", "--principal-max-queued=0")

    def test_operations_beyond_the_principals_budget_are_refused_one_by_one(self):
        c = self.pb.cache
        s = BidiStream(self.cache.Pipeline, timeout=60)
        self.addCleanup(s.cancel)
        n = 300
        s.send(c.PipelineRequest(operations=[
            c.PipelineOperation(id=i, set=c.SetRequest(key="b%d" % i, value=make_value(b"v"))) for i in range(n)]))
        got = []
        while len(got) < n:
            got.extend(s.recv().results)
        self.assertEqual([r.id for r in got], list(range(n)))
        ok = [r for r in got if r.status.code == 0]
        refused = [r for r in got if r.status.code != 0]
        self.assertGreaterEqual(len(ok), 4)
        self.assertTrue(refused, "300 durable sets at once within a budget of 4")
        for r in refused:
            self.assertEqual(r.status.code, grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])
            self.assertEqual(status_failure_fields(r.status, self.pb)[0], "PRINCIPAL_CONCURRENCY_LIMIT")
            self.assertTrue(any(d.Is(self.pb.error_details.RetryInfo.DESCRIPTOR) for d in r.status.details))
        # a refused set left no trace; an admitted one is there
        self.assertFalse(self.get("b%d" % refused[0].id).found)
        self.assertTrue(self.get("b%d" % ok[0].id).found)
        self.assertEqual(s.close(), [])


class PipelineWindowCase(DreyTestCase):
    """One slot held back for a minute: what a stream runs and waits for is
    visible in the node's backpressure figures."""

    WINDOW = 8
    SERVER_FLAGS = ("--ops-listen=127.0.0.1:0", "--pipeline-window=%d" % WINDOW, "--max-inflight=1",
                    "--slowdown-at=0", "--slowdown-max-delay=60s", "--max-queued=1000", "--queue-max-wait=60s",
                    "--principal-max-inflight=1000", "--principal-max-queued=1000")

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.ops = ops_port(cls.server)

    def bp(self):
        return details(self.server, self.ops)["backpressure"]

    def wait_bp(self, timeout=30, **want):
        return poll(self.bp, lambda b: all(b[k] == v for k, v in want.items()), timeout=timeout,
                    what="backpressure %r" % want)

    def test_the_window_bounds_what_runs_and_cancel_empties_the_queue(self):
        self.wait_bp(inFlight=0, queued=0)
        c = self.pb.cache
        ch = fresh_channel(self.server.address)
        self.addCleanup(ch.close)
        client = ServiceClient(ch, self.pb.cache, CACHE_SERVICE)
        s = BidiStream(client.Pipeline, timeout=120)
        self.addCleanup(s.cancel)
        for i in range(50):
            s.send(self.pb.cache.PipelineRequest(operations=[
                self.pb.cache.PipelineOperation(id=i, get=c.GetRequest(key="w%d" % i))]))
        # the window's worth of operations runs or waits; the rest is unread
        self.wait_bp(inFlight=1, queued=self.WINDOW - 1)
        b = poll(self.bp, lambda b: True)
        self.assertEqual(b["inFlight"] + b["queued"], self.WINDOW)
        s.cancel()
        # waiting and held-back operations leave at once (a running one would
        # keep its slot until its work is done, as a unary call's does)
        self.wait_bp(inFlight=0, queued=0, timeout=10)

    def test_an_operation_whose_timeout_passes_in_the_queue_ends_deadline_exceeded(self):
        self.wait_bp(inFlight=0, queued=0)
        c = self.pb.cache
        holder = self.pipeline_on_new_connection()
        holder.send(c.PipelineRequest(operations=[c.PipelineOperation(id=1, get=c.GetRequest(key="h"))]))
        self.wait_bp(inFlight=1)  # held back for a minute, keeping the node's only slot
        s = self.pipeline_on_new_connection()
        s.send(c.PipelineRequest(operations=[
            c.PipelineOperation(id=7, timeout=duration_pb2.Duration(nanos=300 * 1000000), get=c.GetRequest(key="q"))]))
        r = s.recv().results[0]
        self.assertEqual(r.id, 7)
        self.assertEqual(r.status.code, grpc.StatusCode.DEADLINE_EXCEEDED.value[0])
        self.assertEqual(status_failure_fields(r.status, self.pb)[0], "DEADLINE_EXCEEDED")
        holder.cancel()
        self.wait_bp(inFlight=0, queued=0, timeout=10)
        s.close()

    def pipeline_on_new_connection(self):
        ch = fresh_channel(self.server.address)
        self.addCleanup(ch.close)
        s = BidiStream(ServiceClient(ch, self.pb.cache, CACHE_SERVICE).Pipeline, timeout=120)
        self.addCleanup(s.cancel)
        return s


if __name__ == "__main__":
    main()
