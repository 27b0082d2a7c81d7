"""The peer stream that carries forwarded calls (drey.internal.v1.Peer/Forward).

Frames written by hand on a node's internal listener, as a peer with a
certificate of the cluster's CA: a frame becomes a request of the owner's
chain with the stream's certificate as its peer identity (a frame that
claims another node is refused), an unknown method, a request that does not
decode and a deadline already gone are answered per frame without ending the
stream, several frames in one message are answered by id, a stream message
that does not decode ends only that stream, and a Cancel frame, a propagated
deadline or the stream's end stop a request that waits for a slot. Through
real forwarding: a caller that goes away cancels the call waiting on the
owner, a GetMany whose owner never answers gives its slot back at its
deadline, a call in flight when the owner dies fails UNAVAILABLE at once
(never retried) and the next one opens a new stream, a certificate rotation
fails no call in flight, and a stopping owner ends the streams rather than
waiting its shutdown timeout for them.
"""
import os
import queue
import signal
import time
import unittest

import grpc

from drey_cluster import Cluster, internal_port, partition, peer_channel
from drey_harness import RpcFailure, main, make_value, value_of
from drey_tokens import details, poll

RPC = 30
FORWARD = "/drey.internal.v1.Peer/Forward"
GET = "/drey.cache.v1.Cache/Get"
SET = "/drey.cache.v1.Cache/Set"
# One slot per node; a waiting call ends by its cancel or deadline, not the queue's own limit.
LIMITS = ("--max-inflight=1", "--max-queued=4", "--queue-max-wait=60s")






class PeerStream:
    """One Forward stream written by hand."""

    def __init__(self, pb, channel):
        self.pb = pb
        self.q = queue.Queue()

        def frames():
            while True:
                m = self.q.get()
                if m is None:
                    return
                yield m

        stub = channel.stream_stream(FORWARD, request_serializer=pb.peer.Frames.SerializeToString,
                                     response_deserializer=pb.peer.Frames.FromString)
        self.call = stub(frames(), timeout=120)
        self.answers = {}

    def call_frame(self, id_, method, request, headers=(), timeout_us=0):
        return self.pb.peer.Frame(id=id_, call=self.pb.peer.Call(
            method=method, headers=[self.pb.peer.Header(key=k, value=v.encode()) for k, v in headers],
            timeout_us=timeout_us, request=request))

    def send(self, *frames):
        self.q.put(self.pb.peer.Frames(frames=list(frames)))

    def cancel_frame(self, id_):
        return self.pb.peer.Frame(id=id_, cancel=self.pb.peer.Cancel())

    def answer(self, id_):
        while id_ not in self.answers:
            for f in next(self.call).frames:
                self.answers[f.id] = f.answer
        return self.answers.pop(id_)

    def close(self):
        self.q.put(None)
        self.call.cancel()

    def reason(self, answer):
        st = self.pb.status.Status.FromString(answer.details)
        for any_ in st.details:
            if any_.type_url.endswith("google.rpc.ErrorInfo"):
                return self.pb.error_details.ErrorInfo.FromString(any_.value).reason
        return None


def pause(node):
    """SIGSTOP, and until every thread of the node has stopped: a frame sent
    before that could still be answered."""
    pid = node.server.proc.pid
    os.kill(pid, signal.SIGSTOP)

    def states():
        out = []
        for t in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/stat" % (pid, t)) as f:
                    out.append(f.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:
                pass
        return out

    poll(states, lambda st: st and all(x == "T" for x in st), what="%s stopped" % node.id)


def in_flight(node, fut):
    """n1's running calls, while fut (the call meant to be running) has not ended."""
    if fut.done():
        raise AssertionError("the call ended: %r" % (fut.exception() or fut.result()))
    return details(node.server)["backpressure"]["inFlight"]


def key_owned_by(owners, node_id, n, prefix="k"):
    return next(k for k in ("%s%d" % (prefix, i) for i in range(1000)) if owners[partition("", k, n)] == node_id)


class Frames(unittest.TestCase):
    """Two nodes; n2 is paused by the tests that need n1's only slot held."""

    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster(partitions=8, initial_nodes=2, lease_ttl="10s", extra_flags=LIMITS).__enter__()
        cls.n1, cls.n2 = cls.cluster.start(2)
        cls.cluster.wait_assigned(2)
        cls.owners = poll(lambda: cls.cluster.owners(cls.n1), lambda o: all(o.values()), what="table")
        cls.pb = cls.cluster.pb
        cls.mine = key_owned_by(cls.owners, "n1", 8)
        cls.theirs = key_owned_by(cls.owners, "n2", 8)

    @classmethod
    def tearDownClass(cls):
        for n in (cls.n1, cls.n2):
            n.server.stop()
        cls.cluster.__exit__(None, None, None)

    def get_request(self, key):
        return self.pb.cache.GetRequest(key=key).SerializeToString()

    def stream(self, as_id="n9"):
        ch = peer_channel(self.cluster, self.n1, as_id)
        self.addCleanup(ch.close)
        s = PeerStream(self.pb, ch)
        self.addCleanup(s.close)
        return s

    def test_frames_are_answered_by_id_and_refusals_keep_the_stream(self):
        set_fn, set_req, _ = self.n1.cache.methods["Set"]
        set_fn(set_req(key=self.mine, value=make_value("here")), timeout=RPC)
        s = self.stream()
        me = [("drey-forwarded-by", "n9")]
        s.send(s.call_frame(7, GET, self.get_request(self.mine), me),
               s.call_frame(3, "/drey.cache.v1.Cache/NoSuchMethod", b"", me),
               s.call_frame(11, GET, b"\xff\xff\xff", me),
               s.call_frame(5, GET, self.get_request(self.mine), me, timeout_us=-1),
               s.call_frame(9, GET, self.get_request(self.theirs), me))
        a = s.answer(7)
        self.assertEqual(a.code, 0, a.message)
        self.assertEqual(value_of(self.pb.cache.GetResponse.FromString(a.response).value), "here")
        a = s.answer(3)
        self.assertEqual((a.code, s.reason(a)), (grpc.StatusCode.UNIMPLEMENTED.value[0], "UNKNOWN_METHOD"))
        a = s.answer(11)
        self.assertEqual((a.code, s.reason(a)), (grpc.StatusCode.INVALID_ARGUMENT.value[0], "MALFORMED_REQUEST"))
        a = s.answer(5)
        self.assertEqual((a.code, s.reason(a)), (grpc.StatusCode.DEADLINE_EXCEEDED.value[0], "DEADLINE_EXCEEDED"))
        # forwarded here, not owned here: refused, never forwarded again
        a = s.answer(9)
        self.assertEqual((a.code, s.reason(a)), (grpc.StatusCode.UNAVAILABLE.value[0], "NOT_PRIMARY"))
        # the stream is still good after all that
        s.send(s.call_frame(1, GET, self.get_request(self.mine), me))
        self.assertEqual(s.answer(1).code, 0)

    def test_a_frame_that_claims_another_node_is_refused(self):
        s = self.stream("n9")
        s.send(s.call_frame(1, GET, self.get_request(self.mine), [("drey-forwarded-by", "n2")]),
               s.call_frame(2, GET, self.get_request(self.mine)))
        for id_ in (1, 2):
            a = s.answer(id_)
            self.assertEqual((a.code, s.reason(a)),
                             (grpc.StatusCode.UNAUTHENTICATED.value[0], "PEER_UNAUTHENTICATED"), id_)

    def test_a_stream_message_that_does_not_decode_ends_the_stream(self):
        ch = peer_channel(self.cluster, self.n1, "n9")
        self.addCleanup(ch.close)
        stub = ch.stream_stream(FORWARD, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        call = stub(iter([b"\x0a\xff\xff\xff"]), timeout=RPC)
        with self.assertRaises(grpc.RpcError) as e:
            next(call)
        f = RpcFailure(e.exception)
        self.assertEqual((f.code, f.reason), (grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_REQUEST"))
        # n1 still takes streams
        s = self.stream()
        s.send(s.call_frame(1, GET, self.get_request(self.mine), [("drey-forwarded-by", "n9")]))
        self.assertEqual(s.answer(1).code, 0)

    def test_a_stream_needs_a_certificate_of_the_cluster(self):
        with grpc.insecure_channel("127.0.0.1:%d" % internal_port(self.n1)) as ch:
            s = PeerStream(self.pb, ch)
            s.send(s.call_frame(1, GET, self.get_request(self.mine), [("drey-forwarded-by", "n2")]))
            with self.assertRaises(grpc.RpcError) as e:
                s.answer(1)
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE)
            s.close()

    def hold_n1s_slot(self):
        """Pauses n2 and parks a forwarded call to it on n1's only slot."""
        pause(self.n2)
        self.addCleanup(os.kill, self.n2.server.proc.pid, signal.SIGCONT)
        fn, req_cls, _ = self.n1.cache.methods["Get"]
        fut = fn.future(req_cls(key=self.theirs))
        self.addCleanup(fut.cancel)
        poll(lambda: details(self.n1.server)["backpressure"]["inFlight"], lambda v: v == 1, what="n1's slot held")
        return fut

    def queued(self):
        return details(self.n1.server)["backpressure"].get("queued", 0)

    def test_a_waiting_frame_stops_at_cancel_deadline_or_the_streams_end(self):
        self.hold_n1s_slot()
        s = self.stream()
        me = [("drey-forwarded-by", "n9")]
        s.send(s.call_frame(1, GET, self.get_request(self.mine), me))
        poll(self.queued, lambda v: v == 1, what="the frame waiting for n1's slot")
        s.send(s.cancel_frame(1))
        a = s.answer(1)
        self.assertEqual((a.code, s.reason(a)), (grpc.StatusCode.CANCELLED.value[0], "CANCELLED"))
        self.assertEqual(self.queued(), 0)
        # the deadline the frame brought ends its wait
        t0 = time.monotonic()
        s.send(s.call_frame(2, GET, self.get_request(self.mine), me, timeout_us=300000))
        a = s.answer(2)
        self.assertEqual(a.code, grpc.StatusCode.DEADLINE_EXCEEDED.value[0], a.message)
        self.assertGreaterEqual(time.monotonic() - t0, 0.29)
        # a stream that ends takes its waiting requests with it
        s.send(s.call_frame(3, GET, self.get_request(self.mine), me))
        poll(self.queued, lambda v: v == 1, what="another frame waiting")
        s.close()
        poll(self.queued, lambda v: v == 0, timeout=10, what="the queue empty once the stream ended")


class Forwarding(unittest.TestCase):
    """Real forwarding; each test breaks a cluster of its own."""

    def test_a_caller_that_goes_away_cancels_the_call_waiting_on_the_owner(self):
        # n1 forwards to n2, whose only slot a call to the paused n3 holds
        with Cluster(partitions=8, initial_nodes=3, lease_ttl="10s", extra_flags=LIMITS) as cl:
            n1, n2, n3 = cl.start(3)
            cl.wait_assigned(3)
            owners = poll(lambda: cl.owners(n1), lambda o: all(o.values()), what="table")
            pause(n3)
            try:
                get2, greq, _ = n2.cache.methods["Get"]
                hold = get2.future(greq(key=key_owned_by(owners, "n3", 8)))
                poll(lambda: details(n2.server)["backpressure"]["inFlight"], lambda v: v == 1, what="n2's slot held")
                get1, _, _ = n1.cache.methods["Get"]
                fut = get1.future(greq(key=key_owned_by(owners, "n2", 8)))
                q2 = lambda: details(n2.server)["backpressure"].get("queued", 0)
                poll(q2, lambda v: v == 1, what="the forwarded call waiting on n2")
                fut.cancel()
                poll(q2, lambda v: v == 0, timeout=10, what="n2 no longer waiting for the caller that left")
                poll(lambda: details(n1.server)["backpressure"]["inFlight"], lambda v: v == 0, timeout=10,
                     what="n1's slot back")
                # a deadline does the same, on its own
                t0 = time.monotonic()
                with self.assertRaises(grpc.RpcError) as e:
                    get1(greq(key=key_owned_by(owners, "n2", 8)), timeout=0.5)
                self.assertEqual(e.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
                poll(q2, lambda v: v == 0, timeout=10, what="n2 no longer waiting past the deadline")
                self.assertLess(time.monotonic() - t0, 10)
                hold.cancel()
            finally:
                os.kill(n3.server.proc.pid, signal.SIGCONT)
            for n in (n1, n2, n3):
                n.server.stop()

    def test_a_get_many_whose_owner_never_answers_gives_its_slot_back_at_its_deadline(self):
        with Cluster(partitions=8, initial_nodes=2, lease_ttl="10s", extra_flags=LIMITS) as cl:
            n1, n2 = cl.start(2)
            cl.wait_assigned(2)
            owners = poll(lambda: cl.owners(n1), lambda o: all(o.values()), what="table")
            keys = [key_owned_by(owners, "n1", 8), key_owned_by(owners, "n2", 8)]
            pause(n2)
            try:
                fn, req_cls, _ = n1.cache.methods["GetMany"]
                with self.assertRaises(grpc.RpcError) as e:
                    fn(req_cls(keys=keys), timeout=0.5)
                self.assertEqual(e.exception.code(), grpc.StatusCode.DEADLINE_EXCEEDED)
                # the scatter is not cancelled with its caller: its own deadline ends it
                poll(lambda: details(n1.server)["backpressure"]["inFlight"], lambda v: v == 0, timeout=10,
                     what="n1's slot back after the deadline")
            finally:
                os.kill(n2.server.proc.pid, signal.SIGCONT)
            fn(req_cls(keys=keys), timeout=RPC)
            for n in (n1, n2):
                n.server.stop()

    def test_a_call_in_flight_when_the_owner_dies_fails_unavailable_and_the_next_opens_a_new_stream(self):
        # The default short lease: n2 is paused only briefly, and its return
        # waits for its old registration to expire.
        with Cluster(partitions=8, initial_nodes=2, extra_flags=LIMITS) as cl:
            n1, n2 = cl.start(2)
            cl.wait_assigned(2)
            owners = poll(lambda: cl.owners(n1), lambda o: all(o.values()), what="table")
            key = key_owned_by(owners, "n2", 8)
            set_fn, set_req, _ = n1.cache.methods["Set"]
            set_fn(set_req(key=key, value=make_value("before")), timeout=RPC)
            port = internal_port(n2)
            pause(n2)
            fut = set_fn.future(set_req(key=key, value=make_value("lost?")), timeout=RPC)
            poll(lambda: in_flight(n1, fut), lambda v: v == 1, what="the call in flight")
            t0 = time.monotonic()
            n2.server.kill()
            with self.assertRaises(grpc.RpcError) as e:
                fut.result()
            f = RpcFailure(e.exception)
            # typed, not the transport's bare message: the write reached n2's
            # stream, so whether n2 applied it is unknown (retry with its request_id)
            self.assertEqual((f.code, f.reason), (grpc.StatusCode.UNAVAILABLE, "PARTITION_UNAVAILABLE"), f.message)
            self.assertEqual((f.metadata["cause"], f.metadata["primary"], f.metadata["outcome"]),
                             ("OWNER_UNREACHABLE", "n2", "unknown"))
            self.assertIn("stream to peer n2 broke", f.metadata["transport"])
            self.assertIsNotNone(f.retry_info)
            self.assertLess(time.monotonic() - t0, RPC / 2, "failed when the stream broke, not at the deadline")
            self.assertEqual(details(n1.server)["cluster"].get("notPrimaryRetries", 0), 0, "never retried")
            # The next write finds no connection to n2 (its lease, 2 s, not
            # out yet): it never left n1, so it was not applied anywhere.
            with self.assertRaises(grpc.RpcError) as e:
                set_fn(set_req(key=key, value=make_value("never sent")), timeout=RPC)
            f = RpcFailure(e.exception)
            self.assertEqual((f.code, f.reason), (grpc.StatusCode.UNAVAILABLE, "PARTITION_UNAVAILABLE"), f.message)
            self.assertEqual((f.metadata["cause"], f.metadata["outcome"]), ("OWNER_UNREACHABLE", "not_applied"),
                             f.metadata)
            # n2 returns on the same internal address: the channel reconnects, a new stream carries calls.
            # (Once its old registration is gone: a node that has to wait for it can lose the lease it
            # took meanwhile, a join bug of its own.)
            poll(cl.status, lambda st: len(st["nodes"]) == 1, what="n2's registration gone")
            cl.start_node("n2", flags=["--internal-listen=127.0.0.1:%d" % port])
            get, greq, _ = n1.cache.methods["Get"]

            def forwarded_ok():
                try:
                    get(greq(key=key), timeout=RPC)
                    return True
                except grpc.RpcError:
                    return False

            poll(forwarded_ok, lambda ok: ok, what="forwarding to n2 again")
            set_fn(set_req(key=key, value=make_value("after")), timeout=RPC)
            self.assertEqual(value_of(get(greq(key=key), timeout=RPC).value), "after")
            for n in cl.nodes.values():
                n.server.stop()

    def test_a_certificate_rotation_fails_no_call_in_flight(self):
        import shutil
        with Cluster(partitions=8, initial_nodes=3, lease_ttl="10s",
                     extra_flags=("--max-inflight=8", "--queue-max-wait=60s")) as cl:
            n1, n2, n3 = cl.start(3)
            cl.wait_assigned(3)
            owners = poll(lambda: cl.owners(n1), lambda o: all(o.values()), what="table")
            k2, k3 = key_owned_by(owners, "n2", 8), key_owned_by(owners, "n3", 8)
            set_fn, set_req, _ = n1.cache.methods["Set"]
            get, greq, _ = n1.cache.methods["Get"]
            set_fn(set_req(key=k2, value=make_value("v")), timeout=RPC)  # n1's stream to n2 is open
            pause(n2)
            try:
                fut = set_fn.future(set_req(key=k2, value=make_value("across the rotation")), timeout=RPC)
                poll(lambda: in_flight(n1, fut), lambda v: v == 1, what="the call in flight")
                cert, key = cl.ca.issue("n1")
                for src, dst in ((key, n1.key), (cert, n1.cert)):
                    shutil.copy(src, dst + ".new")
                    os.replace(dst + ".new", dst)

                def reloaded():
                    get(greq(key=k3), timeout=RPC)  # the files are checked before a call
                    return n1.server.find_log(lambda r: r.get("msg") == "peer certificates reloaded")

                poll(reloaded, lambda r: r, what="n1 using its new certificate")
            finally:
                os.kill(n2.server.proc.pid, signal.SIGCONT)
            fut.result()  # answered on the old stream, not failed by the new channel
            self.assertEqual(value_of(get(greq(key=k2), timeout=RPC).value), "across the rotation")
            for n in (n1, n2, n3):
                n.server.stop()

    def test_a_stopping_owner_ends_the_peer_streams_instead_of_waiting_for_them(self):
        with Cluster(partitions=8, initial_nodes=2) as cl:
            n1, n2 = cl.start(2)
            cl.wait_assigned(2)
            owners = poll(lambda: cl.owners(n1), lambda o: all(o.values()), what="table")
            set_fn, set_req, _ = n1.cache.methods["Set"]
            set_fn(set_req(key=key_owned_by(owners, "n2", 8), value=make_value("v")), timeout=RPC)
            # n1's stream to n2 is open and stays open: n2's internal listener must not wait for it
            n2.server.stop()
            self.assertFalse(n2.server.find_log(lambda r: "outlived the shutdown timeout" in r.get("msg", "")),
                             n2.server.log_text()[-2000:])
            n1.server.stop()


if __name__ == "__main__":
    main()
