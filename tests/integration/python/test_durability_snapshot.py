"""drey.admin.v1.Admin/Snapshot on the real binary: the response (lsn, file,
entries, bytes, segments removed), CURRENT switching to the new snapshot,
snapshots beyond --retain-snapshots deleted, journal segments the snapshot
covers deleted, a restart from snapshot + journal tail recovering every
value and version (and replaying only the tail), snapshots taken under a
concurrent write load, the size and time triggers, a damaged snapshot
(fall back to an older one only while the journal continues it, else refuse
naming it), a SIGKILL while a snapshot is being written (nothing lost, and
no partial file left behind for good), and FAILED_PRECONDITION
EPHEMERAL_NODE on an --ephemeral node."""

import os
import shutil
import tempfile
import threading

import grpc
from google.protobuf import duration_pb2

from drey_harness import (ADMIN_SERVICE, CACHE_SERVICE, DreyServer, DreyTestCase, ServiceClient,
                          journal_segments, main, make_value, read_manifest, storage_tool, value_of)

WAIT = 30.0
VALUE = "x" * 1000  # ~1 KiB per record: a 64 KiB segment holds ~60


class SnapshotTestCase(DreyTestCase):
    SERVER_FLAGS = None

    def setUp(self):
        d = tempfile.mkdtemp(prefix="drey-snap-")
        if not os.environ.get("DREY_TEST_KEEP_TMP"):
            self.addCleanup(shutil.rmtree, d, True)
        self.data_dir = os.path.join(d, "data")

    def boot(self, *flags):
        srv = DreyServer("--data-dir=" + self.data_dir, *flags).start()
        self.addCleanup(srv.kill)
        ch = srv.channel()
        return srv, ServiceClient(ch, self.pb.cache, CACHE_SERVICE), ServiceClient(ch, self.pb.admin, ADMIN_SERVICE)

    def details(self, admin):
        return admin.GetReadinessDetails(self.pb.admin.GetReadinessDetailsRequest(), timeout=WAIT)

    def snapshot_files(self):
        d = os.path.join(self.data_dir, "snapshots")
        return sorted(n for n in os.listdir(d) if n.endswith(".snap"))


class AdminSnapshotTest(SnapshotTestCase):
    FLAGS = ("--segment-bytes=64KiB", "--retain-snapshots=2", "--snapshot-every-bytes=0", "--snapshot-every=0")

    def write(self, cache, model, keys, tag):
        pb = self.pb.cache
        for k in keys:
            r = cache.Set(pb.SetRequest(key=k, value=make_value("%s:%s:%s" % (k, tag, VALUE))), timeout=WAIT)
            model[k] = ("%s:%s:%s" % (k, tag, VALUE), r.version)

    def snapshot(self, admin, cache, model, expect_lsn):
        """One Admin/Snapshot with nothing else writing, checked against the
        directory before and after."""
        segs_before = journal_segments(self.data_dir)
        resp = admin.Snapshot(self.pb.admin.SnapshotRequest(), timeout=WAIT)
        self.assertEqual(resp.lsn, expect_lsn, "the snapshot does not hold every write so far")
        self.assertRegex(resp.file, r"^snapshots/snap-[0-9a-f]{16}\.snap$")
        path = os.path.join(self.data_dir, resp.file)
        self.assertTrue(os.path.isfile(path), resp.file)
        self.assertEqual(resp.bytes, os.path.getsize(path))
        self.assertEqual(resp.entries, len(model))
        self.assertTrue(resp.HasField("duration"))
        # CURRENT names it
        m = read_manifest(self.data_dir)
        self.assertEqual((m.snapshot, m.snapshot_lsn), (resp.file, resp.lsn))
        self.assertEqual(m.retained_snapshots[0], resp.file)
        # every segment it covers is gone: all but the one being written
        segs_after = journal_segments(self.data_dir)
        self.assertEqual(resp.segments_removed, len(segs_before) - 1, (segs_before, segs_after))
        self.assertEqual(segs_after, segs_before[-1:])
        d = self.details(admin)
        self.assertEqual(d.snapshot.last_lsn, resp.lsn)
        self.assertFalse(d.snapshot.in_flight)
        self.assertEqual(d.journal.segments, 1)
        self.assertEqual(d.compaction.state, "idle")
        self.assertNotEqual(d.compaction.last_run, "")
        return resp

    def check_all(self, cache, model):
        pb = self.pb.cache
        keys = sorted(model)
        for i in range(0, len(keys), 500):
            for r in cache.GetMany(pb.GetManyRequest(keys=keys[i:i + 500]), timeout=WAIT).results:
                if model[r.key] is None:
                    self.assertFalse(r.found, "removed key %s came back" % r.key)
                    continue
                self.assertTrue(r.found, r.key)
                self.assertEqual((value_of(r.value), r.version), model[r.key], r.key)

    def test_snapshot_retention_compaction_and_restart_from_snapshot_and_tail(self):
        pb = self.pb.cache
        srv, cache, admin = self.boot(*self.FLAGS)
        model = {}
        lsn = 0
        self.write(cache, model, ["a%03d" % i for i in range(250)], "1")
        self.write(cache, model, ["a%03d" % i for i in range(0, 250, 5)], "1b")  # overwrites
        lsn += 300
        self.assertGreaterEqual(len(journal_segments(self.data_dir)), 3, "expected several segments")
        self.assertIsNone(read_manifest(self.data_dir), "CURRENT before any snapshot")
        s1 = self.snapshot(admin, cache, model, lsn)

        self.write(cache, model, ["b%03d" % i for i in range(150)], "2")
        lsn += 150
        for k in ["a%03d" % i for i in range(0, 20)]:
            self.assertTrue(cache.Remove(pb.RemoveRequest(key=k), timeout=WAIT).removed)
            del model[k]
        lsn += 20
        s2 = self.snapshot(admin, cache, model, lsn)
        self.assertNotEqual(s2.file, s1.file)
        self.assertEqual(self.snapshot_files(), sorted(os.path.basename(f) for f in (s1.file, s2.file)))

        self.write(cache, model, ["c%03d" % i for i in range(100)], "3")
        lsn += 100
        s3 = self.snapshot(admin, cache, model, lsn)
        # --retain-snapshots=2: the oldest is deleted, CURRENT lists the two kept
        self.assertEqual(self.snapshot_files(), sorted(os.path.basename(f) for f in (s2.file, s3.file)))
        self.assertEqual(list(read_manifest(self.data_dir).retained_snapshots), [s3.file, s2.file])

        # the tail after the last snapshot: overwrites, removals, a ttl, counters
        tail = 0
        self.write(cache, model, ["c%03d" % i for i in range(0, 100, 2)], "4")
        tail += 50
        for k in ["b%03d" % i for i in range(10)]:
            self.assertTrue(cache.Remove(pb.RemoveRequest(key=k), timeout=WAIT).removed)
            del model[k]
            tail += 1
        r = cache.Set(pb.SetRequest(key="ttl", value=make_value("t"), ttl=duration_pb2.Duration(seconds=3600)),
                      timeout=WAIT)
        model["ttl"] = ("t", r.version)
        ttl_expiry = r.expires_at
        tail += 1
        for _ in range(7):
            r = cache.Increment(pb.IncrementRequest(key="ctr", delta=2), timeout=WAIT)
            tail += 1
        model["ctr"] = (14, r.version)
        max_version = max(v for _, v in model.values())
        self.assertEqual(self.details(admin).journal.last_lsn, lsn + tail)
        srv.stop()

        out = storage_tool("verify", self.data_dir)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertIn("manifest: %s (lsn %d)" % (s3.file, s3.lsn), out.stdout)

        srv, cache, admin = self.boot(*self.FLAGS)
        loaded = srv.find_log(lambda r: r.get("msg") == "recovery: snapshot loaded")
        self.assertIsNotNone(loaded, srv.log_text())
        self.assertEqual((loaded["file"], loaded["lsn"], loaded["entries"]), (s3.file, s3.lsn, s3.entries))
        done = srv.find_log(lambda r: r.get("msg") == "recovery: done")
        self.assertEqual((done["snapshot_lsn"], done["replayed_records"], done["last_lsn"]),
                         (s3.lsn, tail, lsn + tail), "recovery did not replay exactly the journal tail")
        d = self.details(admin)
        self.assertEqual((d.recovery.state, d.recovery.replayed_records), ("done", tail))
        self.assertEqual(d.snapshot.last_lsn, s3.lsn)
        self.assertEqual(d.journal.last_lsn, lsn + tail)
        self.check_all(cache, model)
        self.assertEqual(cache.Get(pb.GetRequest(key="ttl"), timeout=WAIT).expires_at, ttl_expiry)
        r = cache.Set(pb.SetRequest(key="new", value=make_value(1)), timeout=WAIT)
        self.assertGreater(r.version, max_version, "a version was reused after recovering from a snapshot")
        model["new"] = (1, r.version)
        lsn += tail + 1

        # segments written before the restart are compacted like any other
        self.write(cache, model, ["d%03d" % i for i in range(150)], "5")
        lsn += 150
        segs = journal_segments(self.data_dir)
        self.assertGreaterEqual(len(segs), 3)
        s4 = self.snapshot(admin, cache, model, lsn)
        self.assertEqual(self.snapshot_files(), sorted(os.path.basename(f) for f in (s3.file, s4.file)))
        srv.stop()
        srv, cache, admin = self.boot(*self.FLAGS)
        self.check_all(cache, model)
        self.assertEqual(self.details(admin).recovery.replayed_records, 0)
        srv.stop()

    def test_snapshot_while_clients_write(self):
        """Snapshots are taken without stopping the node: writes acknowledged
        while they run are all there after a restart (from the newest
        snapshot and the journal after it)."""
        pb = self.pb.cache
        srv, cache, admin = self.boot(*self.FLAGS)
        stop = threading.Event()
        acked = [dict() for _ in range(3)]
        errors = []

        def writer(w):
            c = ServiceClient(srv.channel(), pb, CACHE_SERVICE)
            n = 0
            try:
                while not stop.is_set() or n < 50:
                    k = "w%d-%d" % (w, n % 40)
                    r = c.Set(pb.SetRequest(key=k, value=make_value(n), request_id="w%d-%d" % (w, n)), timeout=WAIT)
                    acked[w][k] = (n, r.version)
                    n += 1
            except BaseException as e:  # reported below
                errors.append(e)
        threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
        for t in threads:
            t.start()
        snaps = []
        try:
            for _ in range(5):
                snaps.append(admin.Snapshot(self.pb.admin.SnapshotRequest(), timeout=WAIT))
        finally:
            stop.set()
            for t in threads:
                t.join(WAIT)
        self.assertEqual(errors, [])
        lsns = [s.lsn for s in snaps]
        self.assertEqual(lsns, sorted(lsns), "snapshot LSNs go backwards")
        self.assertEqual(read_manifest(self.data_dir).snapshot, snaps[-1].file)
        self.assertEqual(len(self.snapshot_files()), 2)
        srv.stop()
        srv, cache, admin = self.boot(*self.FLAGS)
        for w in range(3):
            keys = sorted(acked[w])
            for r in cache.GetMany(pb.GetManyRequest(keys=keys), timeout=WAIT).results:
                self.assertTrue(r.found, r.key)
                self.assertEqual((value_of(r.value), r.version), acked[w][r.key], r.key)
        srv.stop()


class DamagedSnapshotTest(SnapshotTestCase):
    """The snapshot CURRENT names is damaged: recovery falls back to an
    older one only when the journal still continues it, else it refuses
    naming the damage; never silently loses what the snapshot held."""

    def damage_file(self, rel):
        path = os.path.join(self.data_dir, rel)
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.seek(size // 2)
            b = f.read(1)
            f.seek(size // 2)
            f.write(bytes([b[0] ^ 0xFF]))

    def two_snapshots(self, *flags):
        pb = self.pb.cache
        srv, cache, admin = self.boot(*flags)
        model = {}
        for i in range(200):
            r = cache.Set(pb.SetRequest(key="s%03d" % i, value=make_value(VALUE + str(i))), timeout=WAIT)
            model["s%03d" % i] = (VALUE + str(i), r.version)
        s1 = admin.Snapshot(self.pb.admin.SnapshotRequest(), timeout=WAIT)
        for i in range(100, 300):
            r = cache.Set(pb.SetRequest(key="s%03d" % i, value=make_value("2-" + VALUE + str(i))), timeout=WAIT)
            model["s%03d" % i] = ("2-" + VALUE + str(i), r.version)
        s2 = admin.Snapshot(self.pb.admin.SnapshotRequest(), timeout=WAIT)
        r = cache.Set(pb.SetRequest(key="tail", value=make_value("t")), timeout=WAIT)
        model["tail"] = ("t", r.version)
        srv.stop()
        self.assertEqual(read_manifest(self.data_dir).snapshot, s2.file)
        self.damage_file(s2.file)
        out = storage_tool("verify", self.data_dir)
        self.assertEqual(out.returncode, 1, out.stdout)
        self.assertIn("the snapshot it names is DAMAGED", out.stdout)
        self.assertIn("%s  DAMAGED" % os.path.basename(s2.file), out.stdout)
        return model, s1, s2

    def test_falls_back_to_the_older_snapshot_when_the_journal_continues_it(self):
        flags = ("--snapshot-every-bytes=0", "--snapshot-every=0")  # one 64 MiB segment: nothing compacted
        model, s1, s2 = self.two_snapshots(*flags)
        srv, cache, admin = self.boot(*flags)
        warn = srv.find_log(lambda r: r.get("msg") == "recovery: snapshot unusable")
        self.assertIsNotNone(warn, srv.log_text())
        self.assertEqual(warn["file"], s2.file)
        loaded = srv.find_log(lambda r: r.get("msg") == "recovery: snapshot loaded")
        self.assertEqual((loaded["file"], loaded["lsn"]), (s1.file, s1.lsn))
        done = srv.find_log(lambda r: r.get("msg") == "recovery: done")
        self.assertEqual(done["replayed_records"], 201)
        keys = sorted(model)
        for r in cache.GetMany(self.pb.cache.GetManyRequest(keys=keys), timeout=WAIT).results:
            self.assertTrue(r.found, r.key)
            self.assertEqual((value_of(r.value), r.version), model[r.key], r.key)
        srv.stop()

    def test_refuses_when_the_journal_no_longer_continues_the_older_snapshot(self):
        flags = ("--segment-bytes=64KiB", "--snapshot-every-bytes=0", "--snapshot-every=0")
        _, _, s2 = self.two_snapshots(*flags)
        srv = DreyServer("--data-dir=" + self.data_dir, *flags).spawn()
        self.addCleanup(srv.kill)
        self.assertNotEqual(srv.wait(WAIT), 0, "dreyd started without the data of its damaged snapshot")
        err = srv.find_log(lambda r: r.get("msg") == "recovery failed: the node will not start")
        self.assertIsNotNone(err, srv.log_text())
        self.assertIn("CURRENT names %s, which is unusable" % s2.file, err["error"])
        self.assertIn("LSN gap", err["error"])
        self.assertIsNone(srv.find_log(lambda r: r.get("msg") == "serving"))


class SnapshotTriggerTest(SnapshotTestCase):

    def test_size_and_time_triggers(self):
        pb = self.pb.cache
        srv, cache, admin = self.boot("--segment-bytes=64KiB", "--snapshot-every-bytes=32KiB", "--snapshot-every=0")
        for i in range(40):  # ~40 KiB of journal
            cache.Set(pb.SetRequest(key="z%02d" % i, value=make_value(VALUE)), timeout=WAIT)
        rec = srv.wait_log(lambda r: r.get("msg") == "snapshot written", WAIT, what="a size-triggered snapshot")
        self.assertGreaterEqual(rec["lsn"], 32)
        self.assertEqual(read_manifest(self.data_dir).snapshot, rec["file"])
        srv.stop()

        srv, cache, admin = self.boot("--snapshot-every-bytes=0", "--snapshot-every=1s")
        cache.Set(pb.SetRequest(key="timed", value=make_value(1)), timeout=WAIT)
        rec = srv.wait_log(lambda r: r.get("msg") == "snapshot written", WAIT, what="a time-triggered snapshot")
        self.assertEqual(rec["lsn"], 41)
        self.assertEqual(read_manifest(self.data_dir).snapshot, rec["file"])
        srv.stop()


class SnapshotCrashTest(SnapshotTestCase):

    def test_sigkill_while_a_snapshot_is_written_loses_nothing_and_leaves_nothing(self):
        """dreyd killed while Admin/Snapshot writes its file: it restarts with
        everything (CURRENT still names the previous snapshot), and the
        partial snapshot file is not left behind forever: later starts and
        snapshots clean it up, as the journal does with its temporaries
        (otherwise every such crash leaks up to a whole snapshot of disk)."""
        pb = self.pb.cache
        flags = ("--snapshot-every-bytes=0", "--snapshot-every=0")
        srv, cache, admin = self.boot(*flags)
        first = admin.Snapshot(self.pb.admin.SnapshotRequest(), timeout=WAIT)
        big = "q" * 4000
        model = {}
        for i in range(100):  # 40 MB: the snapshot takes a while to write
            entries = [pb.SetManyRequest.Entry(key="big-%02d-%03d" % (i, j), value=make_value(big)) for j in range(100)]
            for e, r in zip(entries, cache.SetMany(pb.SetManyRequest(entries=entries), timeout=WAIT).results):
                model[e.key] = (big, r.version)
        snapdir = os.path.join(self.data_dir, "snapshots")
        partial, last_done = [], first
        for attempt in range(5):  # until the kill lands while the file is being written
            call = admin.Snapshot.future(self.pb.admin.SnapshotRequest(), timeout=WAIT)
            while not partial and not call.done():
                partial = [n for n in os.listdir(snapdir) if n.endswith(".tmp")]
            if partial:
                break
            last_done = call.result()
            r = cache.Set(pb.SetRequest(key="attempt-%d" % attempt, value=make_value(attempt)), timeout=WAIT)
            model["attempt-%d" % attempt] = (attempt, r.version)
        srv.kill()
        self.assertTrue(partial, "every snapshot finished before the test saw its file being written")
        self.assertEqual(read_manifest(self.data_dir).snapshot, last_done.file)

        srv, cache, admin = self.boot(*flags)
        keys = sorted(model)
        for i in range(0, len(keys), 1000):
            for r in cache.GetMany(pb.GetManyRequest(keys=keys[i:i + 1000]), timeout=WAIT).results:
                self.assertTrue(r.found, r.key)
                self.assertEqual(r.version, model[r.key][1], r.key)
        cache.Set(pb.SetRequest(key="after", value=make_value(1)), timeout=WAIT)
        s = admin.Snapshot(self.pb.admin.SnapshotRequest(), timeout=WAIT)
        srv.stop()
        left = sorted(os.listdir(snapdir))
        self.assertEqual([n for n in left if n.endswith(".tmp")], [],
                         "a partial snapshot from the crash is still in %s after a restart and a new snapshot "
                         "(%s)" % (snapdir, left))
        self.assertIn(os.path.basename(s.file), left)


class EphemeralSnapshotTest(SnapshotTestCase):

    def test_snapshot_on_an_ephemeral_node_is_refused(self):
        srv = DreyServer("--ephemeral").start()
        self.addCleanup(srv.kill)
        admin = ServiceClient(srv.channel(), self.pb.admin, ADMIN_SERVICE)
        with self.assertRpcError(grpc.StatusCode.FAILED_PRECONDITION, "EPHEMERAL_NODE"):
            admin.Snapshot(self.pb.admin.SnapshotRequest(), timeout=WAIT)
        d = self.details(admin)
        self.assertEqual(d.recovery.state, "ephemeral")
        self.assertTrue(d.ready)
        srv.stop()
        self.assertEqual(sorted(os.listdir(srv.tmp)), ["stderr.log"], "an ephemeral node wrote files")


if __name__ == "__main__":
    main()
