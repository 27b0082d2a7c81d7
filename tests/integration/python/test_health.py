"""grpc.health.v1.Health: Check and Watch, and the drain on SIGTERM/SIGINT
(health goes NOT_SERVING, watchers are told and their streams end, calls are
still served during the grace period, then the process exits 0)."""

import signal
import subprocess
import sys
import time

import grpc

from drey_harness import (CACHE_SERVICE, REFLECTION_V1, BidiStream, DreyServer, DreyTestCase, ServiceClient,
                          main, make_value)

SECRET = "S3CR3T-health-e41b"
STREAMS = 64  # open at shutdown in test_open_streams_do_not_block_exit_forever ...
ROUNDS = 20   # ... in each of this many server lifetimes ...
BURNERS = 2   # ... while this many busy processes compete for the CPUs


class HealthTest(DreyTestCase):

    def check(self, service, client=None):
        client = client or self.health
        return client.Check(self.pb.health.HealthCheckRequest(service=service), timeout=30).status

    def watch(self, service, client=None, timeout=60):
        client = client or self.health
        return client.Watch(self.pb.health.HealthCheckRequest(service=service), timeout=timeout)

    @property
    def H(self):
        return self.pb.health.HealthCheckResponse

    def test_check_serving(self):
        self.assertEqual(self.check(""), self.H.SERVING)
        self.assertEqual(self.check(CACHE_SERVICE), self.H.SERVING)

    def test_check_unknown_service(self):
        for name in ["nope", "drey.cache.v1.cache", "drey.cache.v1.Cache ", SECRET, "x" * 300,
                     "grpc.health.v1.Health"]:
            with self.subTest(service=name[:30]):
                with self.assertRpcError(grpc.StatusCode.NOT_FOUND, "UNKNOWN_SERVICE", secret=SECRET) as e:
                    self.check(name)
                self.assertIsNone(e.failure.bad_request)

    def test_watch_streams_current_status_and_stays_open(self):
        calls = [self.watch(""), self.watch(CACHE_SERVICE)]
        for c in calls:
            self.assertEqual(next(c).status, self.H.SERVING)
        self.assertEqual(self.check(""), self.H.SERVING)  # a round trip after both
        for c in calls:
            self.assertTrue(c.is_active(), "a Watch stream ended while nothing changed")
            c.cancel()
            with self.assertRaises(grpc.RpcError) as cm:
                next(c)
            self.assertEqual(cm.exception.code(), grpc.StatusCode.CANCELLED)

    def test_watch_unknown_service_stays_open(self):
        for name in (SECRET, "x" * 300, "drey.cache.v1.cache"):
            with self.subTest(service=name[:30]):
                c = self.watch(name)
                first = next(c)
                self.assertEqual(first.status, self.H.SERVICE_UNKNOWN)
                self.assertEqual(self.check(""), self.H.SERVING)
                self.assertTrue(c.is_active(), "a Watch of an unknown service must stay open")
                c.cancel()

    def test_many_watchers_come_and_go(self):
        for round_ in range(3):
            calls = [self.watch(["", CACHE_SERVICE, "unknown"][i % 3]) for i in range(30)]
            for i, c in enumerate(calls):
                self.assertIn(next(c).status, (self.H.SERVING, self.H.SERVICE_UNKNOWN))
            for c in calls:
                c.cancel()
        # a watcher whose connection goes away entirely
        ch = self.server.channel()
        hc = ServiceClient(ch, self.pb.health, "grpc.health.v1.Health")
        c = self.watch("", client=hc)
        self.assertEqual(next(c).status, self.H.SERVING)
        ch.close()
        self.assertEqual(self.check(""), self.H.SERVING)

    def test_watch_malformed_request(self):
        fn = self.channel.unary_stream("/grpc.health.v1.Health/Watch", request_serializer=lambda b: b,
                                       response_deserializer=self.H.FromString)
        with self.assertRpcError(grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_REQUEST"):
            list(fn(b"\xff\xff\xff", timeout=30))


class DrainTest(DreyTestCase):
    SERVER_FLAGS = None  # every test starts its own server

    @property
    def H(self):
        return self.pb.health.HealthCheckResponse

    def clients(self, srv):
        ch = srv.channel()
        return (ServiceClient(ch, self.pb.cache, CACHE_SERVICE),
                ServiceClient(ch, self.pb.health, "grpc.health.v1.Health"),
                ServiceClient(ch, self.pb.reflection_v1, REFLECTION_V1))

    def test_sigterm_drains_then_exits_zero(self):
        srv = self.start_server(drain_grace="3s")
        cache, health, refl = self.clients(srv)
        HR = self.pb.health.HealthCheckRequest
        watches = [health.Watch(HR(service=s), timeout=60) for s in ("", CACHE_SERVICE)]
        for w in watches:
            self.assertEqual(next(w).status, self.H.SERVING)
        unknown = health.Watch(HR(service="unknown.Service"), timeout=60)
        self.assertEqual(next(unknown).status, self.H.SERVICE_UNKNOWN)
        # an in-flight stream opened before the signal
        stream = BidiStream(refl.ServerReflectionInfo)
        RR = self.pb.reflection_v1.ServerReflectionRequest
        self.assertTrue(stream.ask(RR(list_services="")).HasField("list_services_response"))
        cache.Set(cache.request("Set", key="before", value=make_value(1)), timeout=30)

        srv.signal(signal.SIGTERM)
        t_signal = time.monotonic()

        # every watcher is told NOT_SERVING, then its stream ends with OK
        for w in watches:
            self.assertEqual(next(w).status, self.H.NOT_SERVING)
            with self.assertRaises(StopIteration):
                next(w)
            self.assertEqual(w.code(), grpc.StatusCode.OK)
        rest = list(unknown)
        self.assertEqual(unknown.code(), grpc.StatusCode.OK, "the unknown-service watch must end cleanly")
        self.assertLessEqual(len(rest), 1)

        # during the grace period: Check says NOT_SERVING, calls still succeed
        for s in ("", CACHE_SERVICE):
            self.assertEqual(health.Check(HR(service=s), timeout=30).status, self.H.NOT_SERVING)
        with self.assertRpcError(grpc.StatusCode.NOT_FOUND, "UNKNOWN_SERVICE"):
            health.Check(HR(service="unknown.Service"), timeout=30)
        r = cache.Set(cache.request("Set", key="during", value=make_value("grace")), timeout=30)
        self.assertGreater(r.version, 0)
        self.assertEqual(cache.Get(cache.request("Get", key="before"), timeout=30).value.int64_value, 1)
        self.assertEqual(cache.Get(cache.request("Get", key="during"), timeout=30).value.string_value, "grace")
        self.assertTrue(stream.ask(RR(file_containing_symbol=CACHE_SERVICE)).HasField("file_descriptor_response"),
                        "an in-flight stream stopped answering during the grace period")
        # a Watch started during the grace period: NOT_SERVING, then the end
        late = health.Watch(HR(service=""), timeout=60)
        self.assertEqual([m.status for m in late], [self.H.NOT_SERVING])
        self.assertEqual(late.code(), grpc.StatusCode.OK)
        self.assertIsNone(srv.find_log(lambda r: r.get("msg") == "stopping"),
                          "the grace period ended before the checks above ran; raise --drain-grace")
        stream.close()
        # An idle grpcio channel does not answer the server's GOAWAY ping
        # (nothing polls it), which holds gRPC core's shutdown for ~5 s.
        srv.close_channels()

        rc = srv.wait()
        self.assertEqual(rc, 0, srv.log_text())
        self.assertGreaterEqual(time.monotonic() - t_signal, 2.9, "exited before the grace period ended")
        srv.check_log_format()
        draining = srv.find_log(lambda r: r.get("msg") == "draining")
        self.assertIsNotNone(draining)
        self.assertEqual(draining.get("grace_ms"), 3000)
        self.assertIsNotNone(srv.find_log(lambda r: r.get("msg") == "stopped"))

    def test_second_signal_ends_the_grace_period(self):
        srv = self.start_server(drain_grace="1h")
        _, health, _ = self.clients(srv)
        w = health.Watch(self.pb.health.HealthCheckRequest(service=""), timeout=120)
        self.assertEqual(next(w).status, self.H.SERVING)
        srv.signal(signal.SIGTERM)
        self.assertEqual(next(w).status, self.H.NOT_SERVING)
        srv.wait_log(lambda r: r.get("msg") == "draining", 30)
        srv.close_channels()
        srv.signal(signal.SIGINT)
        self.assertEqual(srv.wait(timeout=30), 0, srv.log_text())
        srv.check_log_format()
        self.assertIsNotNone(srv.find_log(lambda r: r.get("msg") == "stopped"))

    def test_sigint_drains_like_sigterm(self):
        srv = self.start_server(drain_grace="50ms")
        _, health, _ = self.clients(srv)
        self.assertEqual(health.Check(self.pb.health.HealthCheckRequest(), timeout=30).status, self.H.SERVING)
        srv.close_channels()
        srv.signal(signal.SIGINT)
        self.assertEqual(srv.wait(), 0, srv.log_text())
        srv.check_log_format()

    def test_open_streams_do_not_block_exit_forever(self):
        """Clients that keep streams open past the grace period are
        cancelled after --shutdown-timeout, and the process still exits 0.

        Many streams on many workers, with busy processes competing for the
        CPUs, make the cancellations race the end of the shutdown. The race
        is lost only now and then (about one round in four here), so the
        scenario runs ROUNDS times, each with a fresh server (~0.4 s)."""
        RR = self.pb.reflection_v1.ServerReflectionRequest
        for round_ in range(ROUNDS):
            srv = DreyServer("--shutdown-timeout=200ms", "--workers=16", drain_grace="50ms",
                             name="dreyd round %d" % round_).start()
            self.addCleanup(srv.kill)
            streams = []
            for i in range(STREAMS):
                if i % 8 == 0:  # eight streams per connection
                    refl = ServiceClient(srv.channel(), self.pb.reflection_v1, REFLECTION_V1)
                st = BidiStream(refl.ServerReflectionInfo, timeout=120)
                self.assertTrue(st.ask(RR(list_services="")).HasField("list_services_response"))
                streams.append(st)
            burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(BURNERS)]
            try:
                srv.signal(signal.SIGTERM)
                rc = srv.wait(timeout=30)
            finally:
                for b in burners:
                    b.kill()
                    b.wait()
            for st in streams:
                with self.assertRaises(grpc.RpcError):
                    list(st.call)
                st.cancel()
            srv.close_channels()
            self.assertEqual(rc, 0, "round %d: dreyd did not exit cleanly with streams open at shutdown:\n%s"
                             % (round_, srv.log_text()))
            srv.check_log_format()
            self.assertIsNotNone(srv.find_log(lambda r: r.get("msg") == "in-flight calls outlived the shutdown "
                                                                       "timeout; cancelling them"))


if __name__ == "__main__":
    main()
