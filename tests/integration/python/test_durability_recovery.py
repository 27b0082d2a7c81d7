"""Recovery visibility on the real binary, with a large journal (50,000
records written beforehand with --snapshot-every-bytes=0):

* while the journal replays, health for "" and for the Cache service is
  NOT_SERVING, cache and admin calls get UNAVAILABLE RECOVERING (and are not
  applied), /health/ready is 503 and the readiness details say recovering.
  Replay is held at a known point deterministically, without timing: the
  test holds a write lease (fcntl F_SETLEASE) on a segment in the middle of
  the journal, so dreyd's open of it blocks until the test lets go; the
  lease being broken tells the test that dreyd is there. A health Watch
  opened meanwhile sees NOT_SERVING, then SERVING once recovery ends;
* without the lease: the log order (listening, recovery: starting,
  recovery: done with every record replayed, serving), the readiness
  details (recovery done, replayedRecords) and every value and version.

Each test recovers a copy of the directory written once per class: a
copied data directory recovers anywhere."""

import errno
import fcntl
import json
import os
import shutil
import signal
import tempfile
import time

import grpc

from drey_harness import (ADMIN_SERVICE, CACHE_SERVICE, HEALTH_SERVICE, DreyServer, DreyTestCase, ServiceClient,
                          journal_segments, main, make_value, segment_frames, value_of)

RECORDS = 50000
KEYS = 5000
IN_FLIGHT = 50
WAIT = 60.0
FLAGS = ("--segment-bytes=1MiB", "--snapshot-every-bytes=0", "--snapshot-every=0", "--ops-listen=127.0.0.1:0")


class RecoveryTest(DreyTestCase):
    SERVER_FLAGS = None

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.base = tempfile.mkdtemp(prefix="drey-recovery-")
        cls.source = os.path.join(cls.base, "source")
        srv = DreyServer("--data-dir=" + cls.source, *FLAGS).start()
        try:
            pb = cls.pb.cache
            clients = [ServiceClient(srv.channel(), pb, CACHE_SERVICE) for _ in range(2)]
            pending = []
            for i in range(RECORDS):
                req = pb.SetRequest(key="r%04d" % (i % KEYS), value=make_value(i))
                pending.append(clients[i % 2].Set.future(req, timeout=WAIT))
                if len(pending) >= IN_FLIGHT:
                    for f in pending:
                        f.result()
                    pending = []
            for f in pending:
                f.result()
            cls.expected = {}
            keys = ["r%04d" % k for k in range(KEYS)]
            for i in range(0, KEYS, 1000):
                for r in clients[0].GetMany(pb.GetManyRequest(keys=keys[i:i + 1000]), timeout=WAIT).results:
                    cls.expected[r.key] = (value_of(r.value), r.version)
        finally:
            srv.stop()

    @classmethod
    def tearDownClass(cls):
        if not os.environ.get("DREY_TEST_KEEP_TMP"):
            shutil.rmtree(cls.base, True)
        super().tearDownClass()

    def setUp(self):
        self.data_dir = tempfile.mkdtemp(prefix="copy-", dir=self.base)
        os.rmdir(self.data_dir)
        shutil.copytree(self.source, self.data_dir)
        os.unlink(os.path.join(self.data_dir, "LOCK"))

    def clients(self, srv):
        ch = srv.channel()
        return (ServiceClient(ch, self.pb.cache, CACHE_SERVICE), ServiceClient(ch, self.pb.admin, ADMIN_SERVICE),
                ServiceClient(ch, self.pb.health, HEALTH_SERVICE))

    def check_recovered(self, srv, cache, admin):
        """Everything is there; the details and the log say so."""
        keys = sorted(self.expected)
        for i in range(0, len(keys), 1000):
            for r in cache.GetMany(self.pb.cache.GetManyRequest(keys=keys[i:i + 1000]), timeout=WAIT).results:
                self.assertTrue(r.found, r.key)
                self.assertEqual((value_of(r.value), r.version), self.expected[r.key], r.key)
        d = admin.GetReadinessDetails(self.pb.admin.GetReadinessDetailsRequest(), timeout=WAIT)
        self.assertTrue(d.ready)
        self.assertEqual(d.recovery.state, "done")
        self.assertEqual(d.recovery.replayed_records, RECORDS)
        self.assertEqual(d.journal.last_lsn, RECORDS)
        status, body = srv.ops_get("/health/ready/details")
        self.assertEqual(status, 200)
        j = json.loads(body)
        self.assertEqual(j["recovery"]["state"], "done")
        self.assertEqual(int(j["recovery"]["replayedRecords"]), RECORDS)
        self.assertEqual(srv.ops_get("/health/ready")[0], 200)
        msgs = [r["msg"] for r in srv.log_records(strict=True)]
        order = ["listening", "recovery: starting", "recovery: done", "serving"]
        self.assertEqual([m for m in msgs if m in order], order, "log order")
        done = srv.find_log(lambda r: r.get("msg") == "recovery: done")
        self.assertEqual((done["snapshot_lsn"], done["replayed_records"], done["last_lsn"], done["torn_tails_cut"]),
                         (0, RECORDS, RECORDS, 0))
        return done

    def test_large_journal_replay_log_order_and_details(self):
        self.assertGreaterEqual(len(journal_segments(self.data_dir)), 3)
        srv = DreyServer("--data-dir=" + self.data_dir, *FLAGS).start()
        self.addCleanup(srv.kill)
        cache, admin, _ = self.clients(srv)
        self.check_recovered(srv, cache, admin)
        srv.stop()

    def test_recovery_in_progress_is_refused_and_not_serving(self):
        pb = self.pb.cache
        hs = self.pb.health.HealthCheckResponse
        segs = journal_segments(self.data_dir)
        self.assertGreaterEqual(len(segs), 3)
        held = segs[len(segs) // 2]
        held_first_lsn = segment_frames(os.path.join(self.data_dir, "journal", held))[0].lsn
        self.assertGreater(held_first_lsn, 1000, "records must be replayed before the held segment")

        old_sigio = signal.signal(signal.SIGIO, signal.SIG_IGN)  # the lease-break notice
        self.addCleanup(signal.signal, signal.SIGIO, old_sigio)
        fd = os.open(os.path.join(self.data_dir, "journal", held), os.O_RDONLY)
        self.addCleanup(os.close, fd)
        try:
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_WRLCK)
        except OSError as e:
            if e.errno in (errno.EINVAL, errno.EAGAIN, errno.ENOLCK, errno.EACCES, errno.EPERM):
                self.skipTest("file leases are not available here (%s): recovery cannot be held" % e)
            raise
        released = [False]

        def release():
            if not released[0]:
                released[0] = True
                fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        self.addCleanup(release)

        srv = DreyServer("--data-dir=" + self.data_dir, *FLAGS).spawn()
        self.addCleanup(srv.kill)
        line = srv.wait_log(lambda r: r.get("msg") == "listening", WAIT, what="the 'listening' line")
        srv.port = int(line["port"])
        # dreyd opening the held segment breaks the lease: it is mid-replay, blocked there
        deadline = time.monotonic() + WAIT
        while fcntl.fcntl(fd, fcntl.F_GETLEASE) == fcntl.F_WRLCK:
            self.assertIsNone(srv.proc.poll(), srv.log_text())
            self.assertLess(time.monotonic(), deadline, "dreyd never reached the held segment")
            time.sleep(0.005)
        self.assertIsNotNone(srv.find_log(lambda r: r.get("msg") == "recovery: starting"))
        self.assertIsNone(srv.find_log(lambda r: r.get("msg") == "recovery: done"))

        cache, admin, health = self.clients(srv)
        watch = health.Watch(self.pb.health.HealthCheckRequest(service=""), timeout=WAIT)
        self.assertEqual(next(watch).status, hs.NOT_SERVING, "Watch while recovering")
        for svc in ("", CACHE_SERVICE):
            self.assertEqual(health.Check(self.pb.health.HealthCheckRequest(service=svc), timeout=WAIT,
                                          wait_for_ready=True).status,
                             hs.NOT_SERVING, "health of %r while recovering" % svc)
        with self.assertRpcError(grpc.StatusCode.UNAVAILABLE, "RECOVERING"):
            cache.Get(pb.GetRequest(key="r0001"), timeout=WAIT)
        with self.assertRpcError(grpc.StatusCode.UNAVAILABLE, "RECOVERING"):
            cache.Set(pb.SetRequest(key="during-recovery", value=make_value(1), request_id="during"), timeout=WAIT)
        with self.assertRpcError(grpc.StatusCode.UNAVAILABLE, "RECOVERING"):
            cache.Increment(pb.IncrementRequest(key="r0002", delta=1), timeout=WAIT)
        with self.assertRpcError(grpc.StatusCode.UNAVAILABLE, "RECOVERING"):
            admin.Snapshot(self.pb.admin.SnapshotRequest(), timeout=WAIT)
        d = admin.GetReadinessDetails(self.pb.admin.GetReadinessDetailsRequest(), timeout=WAIT)
        self.assertFalse(d.ready)
        self.assertEqual(d.recovery.state, "recovering")
        self.assertEqual(srv.ops_get("/health/live")[0], 200)
        self.assertEqual(srv.ops_get("/health/ready")[0], 503)
        status, body = srv.ops_get("/health/ready/details")
        self.assertEqual(status, 200)
        j = json.loads(body)
        self.assertFalse(j["ready"])
        self.assertEqual(j["recovery"]["state"], "recovering")
        self.assertIsNone(srv.proc.poll())
        self.assertIsNone(srv.find_log(lambda r: r.get("msg") == "recovery: done"), "recovery was not held")

        release()
        self.assertEqual(next(watch).status, hs.SERVING, "Watch once recovered")
        watch.cancel()
        srv.wait_serving(WAIT)
        self.check_recovered(srv, cache, admin)
        self.assertFalse(cache.Get(pb.GetRequest(key="during-recovery"), timeout=WAIT).found,
                         "a write refused while recovering was applied")
        # the refused request_id was not remembered: it applies now
        r = cache.Set(pb.SetRequest(key="during-recovery", value=make_value(1), request_id="during"), timeout=WAIT)
        self.assertGreater(r.version, max(v for _, v in self.expected.values()))
        self.assertEqual(value_of(cache.Get(pb.GetRequest(key="r0002"), timeout=WAIT).value),
                         self.expected["r0002"][0])
        srv.stop()


if __name__ == "__main__":
    main()
