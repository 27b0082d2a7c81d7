"""`dreyd storage inspect|verify|dump|repair <dir>` on real data directories,
and what dreyd does at start with the same damage:

* after a clean run: verify exits 0; inspect lists every segment with its
  LSN range; dump prints every journal record and snapshot entry as JSON
  (keys escaped, values by kind and size only);
* a byte changed in the middle of a frame of a non-last segment (durable
  data): verify exits 1 naming the file and the offset; dreyd refuses to
  start with the same file and offset, exits non-zero and changes nothing;
  after `repair` verify is ok, dreyd starts, the records before the damage
  are there and the ones after it are gone;
* damage at the start of the last segment with later batches after it is
  damage too, not a torn tail; a missing segment is an LSN gap; a damaged
  CURRENT is reported and refused;
* a torn final frame (bytes of the last segment's last frame zeroed in
  place) is cut at start with a warning, and the server starts; with
  --fsync=interval everything since the last sync may be torn, and is cut
  the same way."""

import hashlib
import json
import os
import shutil
import tempfile

from drey_harness import (ADMIN_SERVICE, CACHE_SERVICE, DreyServer, DreyTestCase, ServiceClient, journal_segments,
                          main, make_value, segment_frames, storage_tool, value_of)

WAIT = 30.0
SECRET = "S3CR3T-value-d41c"
VALUE = SECRET + "-" + "y" * 900  # ~1 KiB records: a 64 KiB segment holds ~60
FLAGS = ("--segment-bytes=64KiB", "--snapshot-every-bytes=0", "--snapshot-every=0")
N = 300


def dir_digest(data_dir):
    """Names and contents of every file under data_dir but LOCK."""
    h = hashlib.sha256()
    for root, dirs, files in sorted(os.walk(data_dir)):
        dirs.sort()
        for name in sorted(files):
            if name == "LOCK":
                continue
            p = os.path.join(root, name)
            h.update(os.path.relpath(p, data_dir).encode() + b"\0")
            with open(p, "rb") as f:
                h.update(f.read())
    return h.hexdigest()


class ToolsTestCase(DreyTestCase):
    SERVER_FLAGS = None

    def setUp(self):
        d = tempfile.mkdtemp(prefix="drey-tools-")
        if not os.environ.get("DREY_TEST_KEEP_TMP"):
            self.addCleanup(shutil.rmtree, d, True)
        self.data_dir = os.path.join(d, "data")

    def boot(self):
        srv = DreyServer("--data-dir=" + self.data_dir, *FLAGS).start()
        self.addCleanup(srv.kill)
        ch = srv.channel()
        return srv, ServiceClient(ch, self.pb.cache, CACHE_SERVICE), ServiceClient(ch, self.pb.admin, ADMIN_SERVICE)

    def populate(self, n=N):
        """n Sets of new keys k0000.. with request_ids w-0000.. (LSN i+1),
        then a clean stop. Returns {key: version}."""
        srv, cache, _ = self.boot()
        versions = {}
        for i in range(n):
            r = cache.Set(self.pb.cache.SetRequest(key="k%04d" % i, value=make_value(VALUE),
                                                   request_id="w-%04d" % i), timeout=WAIT)
            versions["k%04d" % i] = r.version
        srv.stop()
        return versions

    def seg_path(self, name):
        return os.path.join(self.data_dir, "journal", name)

    def lsn_of_key(self):
        """LSN -> key from the frames on disk (request_id w-i is key ki)."""
        out = {}
        for name in journal_segments(self.data_dir):
            for f in segment_frames(self.seg_path(name)):
                out[f.lsn] = "k" + f.record().request_id[2:]
        return out

    def damage(self, name, offset):
        with open(self.seg_path(name), "r+b") as f:
            f.seek(offset)
            b = f.read(1)
            f.seek(offset)
            f.write(bytes([b[0] ^ 0x5A]))

    def verify(self, expect_rc):
        out = storage_tool("verify", self.data_dir)
        self.assertEqual(out.returncode, expect_rc, "verify exit code; stdout:\n%s\nstderr:\n%s" % (out.stdout,
                                                                                                   out.stderr))
        return out.stdout

    def refused_start(self, must_name):
        """dreyd on the damaged directory: exits non-zero, logs an error
        naming every string in must_name, and changes no file."""
        before = dir_digest(self.data_dir)
        srv = DreyServer("--data-dir=" + self.data_dir, *FLAGS, name="dreyd on a damaged directory").spawn()
        self.addCleanup(srv.kill)
        rc = srv.wait(WAIT)
        self.assertNotEqual(rc, 0, "dreyd started on a damaged journal:\n" + srv.log_text())
        srv.check_log_format()
        self.assertIsNone(srv.find_log(lambda r: r.get("msg") == "serving"))
        err = srv.find_log(lambda r: r.get("level") == "error" and r.get("msg") == "recovery failed: the node will "
                           "not start")
        self.assertIsNotNone(err, srv.log_text())
        for s in must_name:
            self.assertIn(s, err["error"])
        self.assertEqual(dir_digest(self.data_dir), before, "a refused start changed the data directory")
        return err["error"]


class CleanDirectoryTest(ToolsTestCase):

    def test_inspect_verify_dump_after_a_clean_run(self):
        versions = self.populate()
        segs = journal_segments(self.data_dir)
        self.assertGreaterEqual(len(segs), 3)
        out = self.verify(0)
        self.assertIn("verify: ok", out)
        self.assertIn("manifest: none (no snapshot yet)", out)
        self.assertIn("journal segments: %d" % len(segs), out)
        self.assertIn("journal: last lsn %d" % N, out)
        ins = storage_tool("inspect", self.data_dir)
        self.assertEqual(ins.returncode, 0, ins.stderr)
        expect_first = 1
        for name in segs:
            frames = segment_frames(self.seg_path(name))
            self.assertEqual(frames[0].lsn, expect_first)
            line = "  %s  lsn %d..%d  records %d  bytes %d  ok" % (name, frames[0].lsn, frames[-1].lsn, len(frames),
                                                                   os.path.getsize(self.seg_path(name)))
            self.assertIn(line, ins.stdout)
            expect_first = frames[-1].lsn + 1
        self.assertEqual(expect_first, N + 1)

        dump = storage_tool("dump", self.data_dir)
        self.assertEqual(dump.returncode, 0, dump.stderr)
        self.assertNotIn(SECRET, dump.stdout, "dump printed a value")
        recs = [json.loads(line) for line in dump.stdout.splitlines()]
        self.assertEqual([r["lsn"] for r in recs], list(range(1, N + 1)))
        for i, r in enumerate(recs):
            self.assertEqual(r["method"], "drey.cache.v1.Cache/Set")
            self.assertEqual(r["request_id"], "w-%04d" % i)
            self.assertGreater(r["request_bytes"], len(VALUE))

        # with a snapshot: its entries, keys escaped, values by kind and size
        srv, cache, admin = self.boot()
        odd = 'quote"back\\slash\u00e9/\u2603'
        v = cache.Set(self.pb.cache.SetRequest(key=odd, value=make_value(SECRET)), timeout=WAIT).version
        snap = admin.Snapshot(self.pb.admin.SnapshotRequest(), timeout=WAIT)
        cache.Set(self.pb.cache.SetRequest(key="after", value=make_value(7)), timeout=WAIT)
        srv.stop()
        dump = storage_tool("dump", self.data_dir)
        self.assertEqual(dump.returncode, 0, dump.stderr)
        self.assertNotIn(SECRET, dump.stdout, "dump printed a value")
        lines = [json.loads(line) for line in dump.stdout.splitlines()]
        entries = {e["key"]: e for e in lines if "key" in e and e.get("cache") == ""}  # the default cache
        self.assertEqual(entries[odd]["version"], v)
        self.assertEqual(entries[odd]["value_bytes"], len(SECRET))
        self.assertEqual(entries["k0007"]["version"], versions["k0007"])
        self.assertEqual(entries["k0007"]["value_bytes"], len(VALUE))
        records = [e for e in lines if "lsn" in e]
        self.assertEqual([r["lsn"] for r in records], [snap.lsn + 1], "dump after a snapshot: the journal tail")
        out = self.verify(0)
        self.assertIn("manifest: %s (lsn %d)" % (snap.file, snap.lsn), out)
        self.assertIn("verify: ok", out)


class DamageTest(ToolsTestCase):

    def test_damaged_frame_in_a_non_last_segment_then_repair(self):
        versions = self.populate()
        segs = journal_segments(self.data_dir)
        self.assertGreaterEqual(len(segs), 3)
        lsn_key = self.lsn_of_key()
        name = segs[1]
        frames = segment_frames(self.seg_path(name))
        bad = frames[len(frames) // 2]
        self.damage(name, bad.offset + 40 + bad.length // 2)  # the middle of its payload
        where = "%s/journal/%s at offset %d" % (self.data_dir, name, bad.offset)

        out = self.verify(1)
        self.assertIn("DAMAGE: damaged frame in " + where, out)
        self.assertIn("  %s  lsn %d..%d  records %d  bytes %d  damaged frame at offset %d"
                      % (name, frames[0].lsn, bad.lsn - 1, bad.lsn - frames[0].lsn,
                         os.path.getsize(self.seg_path(name)), bad.offset), out)
        self.assertIn("verify: DAMAGED", out)
        ins = storage_tool("inspect", self.data_dir)
        self.assertEqual(ins.returncode, 0)
        self.assertIn(where, ins.stdout)
        dump = storage_tool("dump", self.data_dir)
        self.assertEqual(dump.returncode, 1)
        self.assertIn(where, dump.stderr)

        err = self.refused_start([name, "offset %d" % bad.offset])
        self.assertIn(where, err)

        rep = storage_tool("repair", self.data_dir)
        self.assertEqual(rep.returncode, 0, rep.stdout + rep.stderr)
        self.assertIn("repair: damaged frame in " + where, rep.stdout)
        self.assertIn("keeping records up to lsn %d" % (bad.lsn - 1), rep.stdout)
        self.assertIn("%d later segment(s)" % (len(segs) - 2), rep.stdout)
        self.assertIn("repair: done; %d segment file(s) deleted" % (len(segs) - 2), rep.stdout)
        self.assertEqual(journal_segments(self.data_dir), segs[:2])
        out = self.verify(0)
        self.assertIn("verify: ok", out)
        self.assertIn("journal: last lsn %d" % (bad.lsn - 1), out)

        srv, cache, admin = self.boot()
        kept = [lsn_key[lsn] for lsn in range(1, bad.lsn)]
        dropped = [lsn_key[lsn] for lsn in range(bad.lsn, N + 1)]
        for r in cache.GetMany(self.pb.cache.GetManyRequest(keys=kept), timeout=WAIT).results:
            self.assertTrue(r.found, "%s was before the damage" % r.key)
            self.assertEqual((value_of(r.value), r.version), (VALUE, versions[r.key]))
        for r in cache.GetMany(self.pb.cache.GetManyRequest(keys=dropped), timeout=WAIT).results:
            self.assertFalse(r.found, "%s was cut by repair" % r.key)
        d = admin.GetReadinessDetails(self.pb.admin.GetReadinessDetailsRequest(), timeout=WAIT)
        self.assertEqual(d.journal.last_lsn, bad.lsn - 1)
        self.assertEqual(d.recovery.replayed_records, bad.lsn - 1)
        r = cache.Set(self.pb.cache.SetRequest(key="new", value=make_value(1)), timeout=WAIT)
        self.assertGreater(r.version, max(versions[k] for k in kept))
        self.assertEqual(admin.GetReadinessDetails(self.pb.admin.GetReadinessDetailsRequest(),
                                                   timeout=WAIT).journal.last_lsn, bad.lsn)
        srv.stop()
        self.verify(0)

    def test_damage_followed_by_later_batches_in_the_last_segment_is_not_a_torn_tail(self):
        self.populate()
        segs = journal_segments(self.data_dir)
        name = segs[-1]
        frames = segment_frames(self.seg_path(name))
        self.assertGreaterEqual(len(frames), 3, "the last segment needs several batches")
        self.assertGreater(frames[-1].batch_lsn, frames[0].lsn)
        self.damage(name, frames[0].offset + 40 + 10)
        where = "%s/journal/%s at offset %d" % (self.data_dir, name, frames[0].offset)
        out = self.verify(1)
        self.assertIn("DAMAGE: damaged frame in " + where, out)
        self.refused_start([name, "offset %d" % frames[0].offset])

    def test_damaged_manifest(self):
        self.populate(20)
        srv, cache, admin = self.boot()
        admin.Snapshot(self.pb.admin.SnapshotRequest(), timeout=WAIT)
        srv.stop()
        current = os.path.join(self.data_dir, "CURRENT")
        with open(current, "r+b") as f:
            raw = bytearray(f.read())
            raw[len(raw) - 3] ^= 0x20
            f.seek(0)
            f.write(raw)
        out = self.verify(1)
        self.assertIn("manifest: DAMAGED (%s)" % current, out)
        self.refused_start([current, "is damaged"])

    def test_missing_segment_is_an_lsn_gap(self):
        self.populate()
        segs = journal_segments(self.data_dir)
        os.unlink(self.seg_path(segs[1]))
        out = self.verify(1)
        self.assertIn("DAMAGE: LSN gap in %s/journal/%s at offset 0" % (self.data_dir, segs[2]), out)
        self.refused_start([segs[2], "offset 0"])


class TornTailTest(ToolsTestCase):

    def test_torn_last_frame_is_cut_at_start(self):
        versions = self.populate()
        segs = journal_segments(self.data_dir)
        name = segs[-1]
        frames = segment_frames(self.seg_path(name))
        last = frames[-1]
        self.assertEqual(last.lsn, N)
        with open(self.seg_path(name), "r+b") as f:
            f.seek(last.offset + 40 + last.length // 2)
            f.write(b"\0" * 6)  # torn in place: part of its payload never reached the disk
        where = "%s/journal/%s at offset %d" % (self.data_dir, name, last.offset)
        out = self.verify(0)
        self.assertIn("note: torn tail in " + where, out)
        self.assertIn("journal: last lsn %d" % (N - 1), out)

        srv, cache, admin = self.boot()
        cut = srv.find_log(lambda r: r.get("msg", "").startswith("journal: cut a torn final batch"))
        self.assertIsNotNone(cut, srv.log_text())
        self.assertEqual(cut["level"], "warn")
        self.assertEqual((cut["segment"], cut["offset"]), (name, last.offset))
        self.assertGreater(cut["bytes"], 0)
        done = srv.find_log(lambda r: r.get("msg") == "recovery: done")
        self.assertEqual((done["torn_tails_cut"], done["replayed_records"], done["last_lsn"]), (1, N - 1, N - 1))
        lsn_key = {lsn: "k%04d" % (lsn - 1) for lsn in range(1, N + 1)}
        keys = [lsn_key[lsn] for lsn in range(1, N)]
        for r in cache.GetMany(self.pb.cache.GetManyRequest(keys=keys), timeout=WAIT).results:
            self.assertTrue(r.found, r.key)
            self.assertEqual(r.version, versions[r.key])
        self.assertFalse(cache.Get(self.pb.cache.GetRequest(key=lsn_key[N]), timeout=WAIT).found,
                         "the torn record was applied")
        # the journal goes on where the cut was
        cache.Set(self.pb.cache.SetRequest(key="after-cut", value=make_value(1)), timeout=WAIT)
        self.assertEqual(admin.GetReadinessDetails(self.pb.admin.GetReadinessDetailsRequest(),
                                                   timeout=WAIT).journal.last_lsn, N)
        srv.stop()
        out = self.verify(0)
        self.assertNotIn("torn tail", out)
        self.assertIn("journal: last lsn %d" % N, out)
        srv, cache, _ = self.boot()
        self.assertEqual(value_of(cache.Get(self.pb.cache.GetRequest(key="after-cut"), timeout=WAIT).value), 1)
        self.assertIsNone(srv.find_log(lambda r: r.get("msg", "").startswith("journal: cut")))
        srv.stop()

    def test_interval_fsync_torn_stretch_since_the_last_sync_is_cut(self):
        """With --fsync=interval nothing is synced between the periodic
        syncs, so a power loss may tear anything written since the last one:
        every frame of that stretch carries the same batch LSN, and damage
        inside it is a torn tail (cut at start), not durable data damage."""
        pb = self.pb.cache
        srv = DreyServer("--data-dir=" + self.data_dir, "--fsync=interval:1h", "--segment-bytes=1MiB",
                         "--snapshot-every-bytes=0", "--snapshot-every=0").start()
        self.addCleanup(srv.kill)
        cache = ServiceClient(srv.channel(), pb, CACHE_SERVICE)
        for i in range(40):
            cache.Set(pb.SetRequest(key="k%04d" % i, value=make_value(VALUE)), timeout=WAIT)
        srv.kill()  # SIGKILL: the page cache keeps it all; the damage below plays the power loss
        segs = journal_segments(self.data_dir)
        self.assertEqual(len(segs), 1)
        frames = segment_frames(self.seg_path(segs[0]))
        self.assertEqual([f.lsn for f in frames], list(range(1, 41)))
        self.assertEqual({f.batch_lsn for f in frames}, {1}, "one unsynced stretch, one batch LSN")
        bad = frames[19]
        self.damage(segs[0], bad.offset + 40 + bad.length // 2)
        where = "%s/journal/%s at offset %d" % (self.data_dir, segs[0], bad.offset)
        out = self.verify(0)
        self.assertIn("note: torn tail in " + where, out)

        srv, cache, admin = self.boot()
        cut = srv.find_log(lambda r: r.get("msg", "").startswith("journal: cut a torn final batch"))
        self.assertIsNotNone(cut, srv.log_text())
        self.assertEqual((cut["segment"], cut["offset"]), (segs[0], bad.offset))
        # Zeroed up to the last non-zero byte: the last frame's end, less any
        # zero padding (and zero payload bytes) it ends with.
        end = frames[-1].offset + frames[-1].size
        self.assertLessEqual(cut["bytes"], end - bad.offset)
        self.assertGreater(bad.offset + cut["bytes"], frames[-1].offset + 40)
        done = srv.find_log(lambda r: r.get("msg") == "recovery: done")
        self.assertEqual((done["replayed_records"], done["torn_tails_cut"]), (19, 1))
        res = cache.GetMany(pb.GetManyRequest(keys=["k%04d" % i for i in range(40)]), timeout=WAIT).results
        self.assertEqual([r.found for r in res], [True] * 19 + [False] * 21)
        srv.stop()
        self.assertIn("verify: ok", self.verify(0))


if __name__ == "__main__":
    main()
