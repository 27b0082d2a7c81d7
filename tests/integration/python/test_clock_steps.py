"""Timed waits do not follow the wall clock.

dreyd runs under libfaketime with its wall clock (CLOCK_REALTIME) running at
a thousandth of real speed while the monotonic clock is left alone: what a
wall clock stepped back does to a wait whose deadline is a wall-clock
instant, continuously. Every timed wait in dreyd must still end on time by
the monotonic clock: the journal's batch wait and fsync interval, the
expiry sweep's period, the snapshot trigger's once-a-second check and the
shutdown timeout. Each is polled against a generous deadline (many times
its own length, and far below the thousandfold a wall-clock deadline
would take); nothing here is a timing assertion beyond that bound.

The binary is //:dreyd_system_malloc: libfaketime deadlocks inside
jemalloc's initialization (see BUILD.bazel)."""

import datetime
import os
import re
import signal
import time

from google.protobuf import duration_pb2

from drey_harness import (ADMIN_SERVICE, CACHE_SERVICE, REFLECTION_V1, BidiStream, DreyServer, DreyTestCase,
                          ServiceClient, main, make_value)

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
# Every wait below is at most 1 s of monotonic time; a wall-clock deadline
# would take a thousand times as long.
BOUND = 20.0
SLOW_WALL_CLOCK = {
    "LD_PRELOAD": LIBFAKETIME,
    "FAKETIME": "+0 x0.001",
    "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    # libfaketime is preloaded before the ASan runtime of an ASan build.
    "ASAN_OPTIONS": "verify_asan_link_order=0:" + os.environ.get("ASAN_OPTIONS", ""),
}


def poll(what, pred, bound=BOUND):
    deadline = time.monotonic() + bound
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise AssertionError("%s: not within %.0fs of the monotonic clock" % (what, bound))
        time.sleep(0.02)


class ClockStepTest(DreyTestCase):
    SERVER_FLAGS = None

    def setUp(self):
        if not os.access(LIBFAKETIME, os.R_OK):
            self.fail("libfaketime is missing (Debian package faketime)")

    def boot(self, *flags):
        srv = DreyServer("--ops-listen=127.0.0.1:0", *flags, env=SLOW_WALL_CLOCK).start()
        self.addCleanup(srv.kill)
        ch = srv.channel()
        return srv, ServiceClient(ch, self.pb.cache, CACHE_SERVICE), ServiceClient(ch, self.pb.admin, ADMIN_SERVICE)

    def metric(self, srv, name):
        status, body = srv.ops_get("/metrics")
        self.assertEqual(status, 200)
        m = re.search(r"^%s(?:\{[^}]*\})? (\S+)$" % re.escape(name), body, re.M)
        return float(m.group(1)) if m else 0.0

    def test_the_wall_clock_is_slowed(self):
        """The premise: under this environment dreyd's wall clock barely
        moves (its log times), while real seconds pass."""
        srv, cache, _ = self.boot("--ephemeral")
        cache.Set(self.pb.cache.SetRequest(key="a", value=make_value(1)), timeout=BOUND)
        t0 = time.monotonic()
        time.sleep(1.0)  # not synchronisation: the premise needs real time to pass
        cache.Set(self.pb.cache.SetRequest(key="b", value=make_value(1)), timeout=BOUND)
        srv.stop()
        real = time.monotonic() - t0
        times = [datetime.datetime.strptime(r["time"], "%Y-%m-%dT%H:%M:%S.%fZ") for r in srv.log_records()]
        wall = (times[-1] - times[0]).total_seconds()
        self.assertGreaterEqual(real, 1.0)
        self.assertLess(wall, 0.2, "dreyd's wall clock moved %.3fs in %.3fs" % (wall, real))

    def test_the_batch_wait_ends_on_time(self):
        srv, cache, _ = self.boot("--batch-wait=200ms")
        cache.Set(self.pb.cache.SetRequest(key="k", value=make_value("v")), timeout=BOUND)
        srv.stop()

    def test_the_fsync_interval_ends_on_time(self):
        # Written right after the start, so the interval has not passed yet
        # and the writer waits for it.
        srv, cache, admin = self.boot("--fsync=interval:3s")
        cache.Set(self.pb.cache.SetRequest(key="k", value=make_value("v")), timeout=BOUND)
        poll("an fsync after --fsync=interval:3s", lambda: admin.GetReadinessDetails(
            self.pb.admin.GetReadinessDetailsRequest(), timeout=BOUND).journal.last_fsync_micros > 0)
        srv.stop()

    def test_the_expiry_sweep_period_ends_on_time(self):
        # Entries whose 1 ms ttl passes (a second of real time on this wall
        # clock) are freed by the sweep, nobody reading them.
        srv, cache, _ = self.boot("--ephemeral", "--expiry-sweep-interval=200ms")
        for i in range(5):
            cache.Set(self.pb.cache.SetRequest(key="e%d" % i, value=make_value(i),
                                               ttl=duration_pb2.Duration(nanos=1000000)), timeout=BOUND)
        poll("the expiry sweep", lambda: self.metric(srv, "drey_store_expired_swept_total") >= 5)
        srv.stop()

    def test_the_snapshot_trigger_check_ends_on_time(self):
        srv, cache, _ = self.boot("--snapshot-every=1s", "--snapshot-every-bytes=0")
        cache.Set(self.pb.cache.SetRequest(key="k", value=make_value("v")), timeout=BOUND)
        poll("a snapshot by --snapshot-every=1s", lambda: srv.find_log(lambda r: r.get("msg") == "snapshot written"))
        srv.stop()

    def test_the_shutdown_timeout_ends_on_time(self):
        srv, _, _ = self.boot("--ephemeral", "--shutdown-timeout=500ms")
        refl = ServiceClient(srv.channel(), self.pb.reflection_v1, REFLECTION_V1)
        stream = BidiStream(refl.ServerReflectionInfo, timeout=120)
        stream.ask(self.pb.reflection_v1.ServerReflectionRequest(list_services=""))
        # The open stream outlives the shutdown timeout; dreyd cancels it.
        srv.signal(signal.SIGTERM)
        poll("exit after --shutdown-timeout=500ms with a call in flight", lambda: srv.proc.poll() is not None)
        stream.cancel()
        srv.wait()
        self.assertEqual(srv.returncode, 0)
        self.assertTrue(srv.find_log(lambda r: r.get("msg") == "in-flight calls outlived the shutdown timeout; "
                                                              "cancelling them"))


if __name__ == "__main__":
    main()
