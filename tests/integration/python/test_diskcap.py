"""A node on defaults and a small real file system: the journal's disk cap
derived from the data directory's file system (--journal-max-bytes not
given; docs/durability.md "Journal disk quota", src/storage/diskcap.c).

The data directory is a 24 MiB tmpfs (with 1 MiB segments: the default
64 MiB segment does not fit such a volume at all).

* The cap is derived at start by the documented rule, logged, and shown in
  /health/ready/details (journalDisk.maxBytes, dataDisk.journalCap =
  derived, the file system's figures, the reserve, the snapshot estimate).
* Filling the volume, the node refuses with RESOURCE_EXHAUSTED
  JOURNAL_DISK_QUOTA, never UNAVAILABLE JOURNAL_WRITE_FAILED: its journal
  never meets ENOSPC, the journal is never failed, the snapshot still fits;
  an Admin/Snapshot compacts and the refused write goes through, no
  restart.
* With every trigger at its default, the node snapshots by itself once the
  journal passes the cap's high-water mark: writes of three times the
  volume go through (some refused and retried), nothing acknowledged is
  lost, across a restart too.
* The cap is re-derived when the volume grows (a tmpfs remount) and when
  another writer takes space.
* When the next snapshot cannot fit (another writer filled the volume),
  readiness says so first as low, then as short, with a warning in the log;
  the journal stops growing (JOURNAL_DISK_QUOTA), the snapshot indeed fails
  without failing the journal, and everything recovers once space is free.
* An automatic snapshot that fails for want of space is retried after a
  pause (not ten times a second), and once the space is back the cap rises
  and writes resume by themselves.
* A configured cap shows as configured (and low when it would let the
  journal take the snapshot's room); --journal-max-bytes=0 as none
  (test_durability_diskfull.py has the old failure with it).

The file re-executes itself in a private mount namespace
(enter_private_mount_namespace) so the tmpfs cannot leak; it is skipped,
with the reason, only where that or the mount is not permitted.
"""

import datetime
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import grpc

from drey_harness import (ADMIN_SERVICE, CACHE_SERVICE, DreyTestCase, enter_private_mount_namespace, main,
                          make_value, RpcFailure, ServiceClient, storage_tool, value_of)

MIB = 1 << 20
GIB = 1 << 30
TMPFS = 24 * MIB
SEGMENT = MIB
VALUE = 64 * 1024
WAIT = 30.0
RE = grpc.StatusCode.RESOURCE_EXHAUSTED
SKIP_REASON = None


def reserve_of(fs_bytes):
    """docs/durability.md: 5 % of the file system, at least 1 MiB, at most 1 GiB."""
    return min(max(fs_bytes // 20, MIB), GIB)


def derived_cap(fs_bytes, avail, journal, snapshot):
    """docs/durability.md: the journal may grow by half of what is available beyond the
    reserve and the next snapshot."""
    spare = max(avail - reserve_of(fs_bytes) - snapshot, 0)
    return max(journal + spare // 2, 1)


def fallocate(path, nbytes):
    """Another writer takes nbytes of the volume (or gives them back)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, 0)
        if nbytes > 0:
            os.posix_fallocate(fd, 0, nbytes)
    finally:
        os.close(fd)


class DiskCapTest(DreyTestCase):
    SERVER_FLAGS = None

    @classmethod
    def setUpClass(cls):
        if SKIP_REASON:
            raise unittest.SkipTest(SKIP_REASON)
        super().setUpClass()

    def setUp(self):
        tmp = tempfile.mkdtemp(prefix="drey-diskcap-")
        self.addCleanup(shutil.rmtree, tmp, True)
        self.mnt = os.path.join(tmp, "mnt")
        os.mkdir(self.mnt)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%dk,mode=0700" % (TMPFS // 1024), "tmpfs", self.mnt],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            self.skipTest("cannot mount a tmpfs in the private mount namespace: %s" % r.stderr.strip())
        self.addCleanup(subprocess.run, ["umount", "-l", self.mnt], capture_output=True, timeout=30)
        try:
            with open("/proc/1/mountinfo") as f:
                self.assertNotIn(" %s " % self.mnt, f.read(), "the tmpfs leaked out of the mount namespace")
        except PermissionError:
            pass
        st = os.statvfs(self.mnt)
        self.assertEqual(st.f_blocks * st.f_frsize, TMPFS)
        self.data_dir = os.path.join(self.mnt, "data")
        self.filler = os.path.join(self.mnt, "filler")

    def boot(self, *extra):
        srv = self.start_server("--data-dir=" + self.data_dir, "--segment-bytes=%d" % SEGMENT,
                                "--ops-listen=127.0.0.1:0", *extra)
        self.srv = srv
        ch = srv.channel()
        self.cache = ServiceClient(ch, self.pb.cache, CACHE_SERVICE)
        self.admin = ServiceClient(ch, self.pb.admin, ADMIN_SERVICE)
        return srv

    def details(self):
        status, body = self.srv.ops_get("/health/ready/details")
        self.assertEqual(status, 200, body)
        return json.loads(body)

    def wait_details(self, pred, what, timeout=15.0):
        """Polls the details (the disk is looked at every second) until pred
        holds, with a deadline."""
        deadline = time.monotonic() + timeout
        while True:
            d = self.details()
            if pred(d):
                return d
            if time.monotonic() >= deadline:
                self.fail("timed out waiting for %s: %r" % (what, d))
            time.sleep(0.05)

    def assertDerivedAsDocumented(self, d):
        """maxBytes follows the rule from the figures the same look saw (the
        journal's bytes are its segments', unchanged while idle)."""
        dd, jd = d["dataDisk"], d["journalDisk"]
        self.assertEqual(dd["journalCap"], "derived")
        self.assertEqual(dd["fsBytes"], os.statvfs(self.mnt).f_blocks * os.statvfs(self.mnt).f_frsize)
        self.assertEqual(dd["reserveBytes"], reserve_of(dd["fsBytes"]))
        self.assertEqual(jd["maxBytes"], derived_cap(dd["fsBytes"], dd["availableBytes"], jd["usedBytes"],
                                                     dd["snapshotEstimateBytes"]), d)
        self.assertEqual(jd["highWaterBytes"], jd["maxBytes"] // 10 * 8)

    def assertNoJournalEnospc(self):
        """The journal never met ENOSPC: no segment creation failed, the
        journal is not failed, the node is ready."""
        self.assertIsNone(self.srv.find_log(lambda r: r.get("msg") == "journal cannot start a new segment"),
                          "the journal met a full disk")
        self.assertIsNone(self.srv.find_log(lambda r: str(r.get("msg", "")).startswith("journal failed")))
        d = self.details()
        self.assertFalse(d["journal"]["failed"])
        self.assertTrue(d["ready"])
        return d

    def set_req(self, key, i, rid):
        return self.pb.cache.SetRequest(key=key, value=make_value(bytes([i % 251]) * VALUE), request_id=rid)

    # --- the tests -------------------------------------------------------------

    def test_on_defaults_a_filling_volume_is_refused_by_the_quota_and_a_snapshot_brings_writes_back(self):
        srv = self.boot("--snapshot-every-bytes=0", "--snapshot-every=0")
        pid = srv.proc.pid
        d = self.details()
        self.assertDerivedAsDocumented(d)
        jd = d["journalDisk"]
        self.assertEqual((jd["state"], jd["usedBytes"], d["dataDisk"]["snapshotRoom"]), ("normal", SEGMENT, "ok"))
        self.assertLess(jd["maxBytes"], TMPFS // 2, "the journal may not take the snapshot's half")
        self.assertGreater(jd["maxBytes"], 8 * SEGMENT)
        start = srv.find_log(lambda r: r.get("msg") == "journal disk cap derived from the file system")
        self.assertIsNotNone(start, srv.log_text())
        self.assertEqual((start["max_bytes"], start["fs_bytes"], start["journal_bytes"]),
                         (jd["maxBytes"], TMPFS, SEGMENT))

        # 16 keys overwritten: the store (and so the snapshot) stays at 1 MiB
        acked, refused = {}, None
        for i in range(2 * TMPFS // VALUE):
            key = "k%02d" % (i % 16)
            req = self.set_req(key, i, "r%04d" % i)
            try:
                acked[key] = (value_of(req.value), self.cache.Set(req, timeout=WAIT).version)
            except grpc.RpcError as e:
                refused = (key, req, RpcFailure(e))
                break
        self.assertIsNotNone(refused, "the volume never refused a write")
        key, req, f = refused
        self.assertRpcFailure(f, RE, "JOURNAL_DISK_QUOTA")
        md = {k: int(v) for k, v in f.metadata.items()}
        d = self.assertNoJournalEnospc()
        self.assertEqual(md["maxBytes"], d["journalDisk"]["maxBytes"])
        self.assertLessEqual(md["usedBytes"], md["maxBytes"])
        self.assertEqual(d["journalDisk"]["state"], "critical")
        # the disk still has room for the reserve and the snapshot compaction needs
        st = os.statvfs(self.mnt)
        self.assertGreaterEqual(st.f_bavail * st.f_frsize,
                                reserve_of(TMPFS) + d["dataDisk"]["snapshotEstimateBytes"])
        self.assertEqual(d["dataDisk"]["snapshotRoom"], "ok")
        self.assertGreater(d["journal"]["segments"], 8)

        # a retry is refused the same way, cleanly
        with self.assertRpcError(RE, "JOURNAL_DISK_QUOTA"):
            self.cache.Set(req, timeout=WAIT)
        # the snapshot fits and its compaction frees the journal
        snap = self.admin.Snapshot(self.pb.admin.SnapshotRequest(), timeout=WAIT)
        self.assertEqual(snap.segments_removed, d["journal"]["segments"] - 1)
        d = self.wait_details(lambda d: d["journalDisk"]["state"] == "normal", "the state back to normal")
        self.assertDerivedAsDocumented(d)
        self.assertEqual(d["dataDisk"]["snapshotFilesBytes"], snap.bytes)
        self.assertGreaterEqual(d["dataDisk"]["snapshotEstimateBytes"], snap.bytes)
        r = self.cache.Set(req, timeout=WAIT)
        acked[key] = (value_of(req.value), r.version)
        self.assertEqual(self.cache.Set(req, timeout=WAIT).version, r.version, "the retry was applied twice")
        for k, want in acked.items():
            g = self.cache.Get(self.pb.cache.GetRequest(key=k), timeout=WAIT)
            self.assertEqual((value_of(g.value), g.version), want, k)
        self.assertNoJournalEnospc()
        self.assertEqual(srv.proc.pid, pid)
        self.assertEqual(sum(1 for rec in srv.log_records() if rec.get("msg") == "listening"), 1, "restarted")

    def test_on_defaults_the_node_compacts_by_itself_and_writes_three_volumes_without_a_restart(self):
        srv = self.boot()
        pid = srv.proc.pid
        self.assertDerivedAsDocumented(self.details())
        target = 3 * TMPFS
        lock = threading.Lock()
        acked, errors, written = {}, [], [0]
        deadline = time.monotonic() + 120

        def writer(t):
            for i in range(100000):
                with lock:
                    if written[0] >= target:
                        return
                key = "t%d-%02d" % (t, i % 8)  # 32 keys in all: a 2 MiB store
                req = self.set_req(key, i + t, "t%d-%06d" % (t, i))
                while True:
                    try:
                        r = self.cache.Set(req, timeout=WAIT)
                        break
                    except grpc.RpcError as e:
                        f = RpcFailure(e)
                        with lock:
                            errors.append(f)
                        if f.reason != "JOURNAL_DISK_QUOTA" or time.monotonic() > deadline:
                            return
                        # the client's own pacing of a retry, as RetryInfo asks (capped)
                        delay = f.retry_info.retry_delay
                        time.sleep(min(delay.seconds + delay.nanos / 1e9, 0.05))
                with lock:
                    acked[key] = (value_of(req.value), r.version)
                    written[0] += VALUE

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(180)
            self.assertFalse(th.is_alive(), "a writer hung")
        reasons = sorted({(f.code, f.reason) for f in errors})
        self.assertTrue(all(r == (RE, "JOURNAL_DISK_QUOTA") for r in reasons), reasons)
        for f in errors[:20]:
            self.assertRpcFailure(f, RE, "JOURNAL_DISK_QUOTA")
        self.assertGreaterEqual(written[0], target, "writes stopped before three volumes went through")
        d = self.assertNoJournalEnospc()
        taken = [rec for rec in srv.log_records() if rec.get("msg") == "snapshot written"]
        self.assertGreaterEqual(len(taken), 3, "the node did not compact by itself")
        self.assertGreater(d["snapshot"]["lastLsn"], 0)
        self.assertLessEqual(d["journalDisk"]["usedBytes"], d["journalDisk"]["maxBytes"])
        print("\n%.0f MiB written to a %d MiB volume in %.1fs: %d refusals (JOURNAL_DISK_QUOTA), %d snapshots"
              % (written[0] / MIB, TMPFS // MIB, time.monotonic() - (deadline - 120), len(errors), len(taken)),
              file=sys.stderr)
        self.assertEqual(srv.proc.pid, pid)
        for k, want in acked.items():
            g = self.cache.Get(self.pb.cache.GetRequest(key=k), timeout=WAIT)
            self.assertEqual((value_of(g.value), g.version), want, k)
        srv.stop()

        out = storage_tool("verify", self.data_dir)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.boot()
        for k, want in acked.items():
            g = self.cache.Get(self.pb.cache.GetRequest(key=k), timeout=WAIT)
            self.assertEqual((value_of(g.value), g.version), want, "%s after a restart" % k)
        self.assertDerivedAsDocumented(self.details())

    def test_the_cap_is_re_derived_when_the_volume_grows_and_when_another_writer_takes_space(self):
        srv = self.boot("--snapshot-every-bytes=0", "--snapshot-every=0")
        before = self.details()["journalDisk"]["maxBytes"]
        r = subprocess.run(["mount", "-o", "remount,size=%dk" % (2 * TMPFS // 1024), self.mnt],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        d = self.wait_details(lambda d: d["dataDisk"]["fsBytes"] == 2 * TMPFS, "the grown volume seen")
        self.assertDerivedAsDocumented(d)
        grown = d["journalDisk"]["maxBytes"]
        self.assertGreater(grown, before + TMPFS // 3, "half of the new space goes to the journal")
        rec = srv.wait_log(lambda r: r.get("msg") == "journal disk cap re-derived" and r["max_bytes"] == grown, 10,
                           "the re-derived cap logged")
        self.assertEqual(rec["fs_bytes"], 2 * TMPFS)

        # another writer takes 16 MiB: the cap gives up half of it
        fallocate(self.filler, 16 * MIB)
        d = self.wait_details(lambda d: d["journalDisk"]["maxBytes"] < grown - 7 * MIB, "the cap lowered")
        self.assertDerivedAsDocumented(d)
        self.assertEqual(d["journalDisk"]["maxBytes"], grown - 8 * MIB)
        # the volume shrunk back: as the file system says
        os.unlink(self.filler)
        r = subprocess.run(["mount", "-o", "remount,size=%dk" % (TMPFS // 1024), self.mnt],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)
        d = self.wait_details(lambda d: d["journalDisk"]["maxBytes"] == before, "the cap of the first volume")
        self.assertDerivedAsDocumented(d)

    def test_a_snapshot_that_would_not_fit_is_reported_before_it_is_too_late(self):
        srv = self.boot("--snapshot-every-bytes=0", "--snapshot-every=0")
        # a 3 MiB store: 48 distinct keys
        acked = {}
        for i in range(48):
            req = self.set_req("s%02d" % i, i, "s%02d" % i)
            acked["s%02d" % i] = (value_of(req.value), self.cache.Set(req, timeout=WAIT).version)
        d = self.wait_details(lambda d: d["dataDisk"]["snapshotEstimateBytes"] > 3 * MIB, "the estimate")
        est, reserve = d["dataDisk"]["snapshotEstimateBytes"], d["dataDisk"]["reserveBytes"]
        self.assertEqual(d["dataDisk"]["snapshotRoom"], "ok")

        # another writer leaves the snapshot and half the reserve: it fits now, but the journal may not grow
        avail = os.statvfs(self.mnt).f_bavail * os.statvfs(self.mnt).f_frsize
        fallocate(self.filler, avail - est - reserve // 2)
        d = self.wait_details(lambda d: d["dataDisk"]["snapshotRoom"] == "low", "snapshotRoom low")
        self.assertEqual(d["journalDisk"]["maxBytes"], d["journalDisk"]["usedBytes"], "the journal may not grow")
        self.assertDerivedAsDocumented(d)
        self.assertTrue(d["ready"], "disk pressure must not make the node unready")
        srv.wait_log(lambda r: r.get("level") == "warn" and r.get("snapshot_room") == "low", 10, "the warning (low)")

        # ... and then less than the snapshot: short
        avail = os.statvfs(self.mnt).f_bavail * os.statvfs(self.mnt).f_frsize
        fallocate(self.filler, os.path.getsize(self.filler) + avail - est + 64 * 1024)
        d = self.wait_details(lambda d: d["dataDisk"]["snapshotRoom"] == "short", "snapshotRoom short")
        self.assertLess(d["dataDisk"]["availableBytes"], d["dataDisk"]["snapshotEstimateBytes"])
        srv.wait_log(lambda r: r.get("level") == "warn" and r.get("snapshot_room") == "short", 10,
                     "the warning (short)")
        # the journal does not grow into the last bytes: refused by the quota, not by the disk
        refused = None
        for i in range(2 * SEGMENT // VALUE + 2):
            req = self.set_req("s%02d" % (i % 48), i, "late-%d" % i)
            try:
                acked["s%02d" % (i % 48)] = (value_of(req.value), self.cache.Set(req, timeout=WAIT).version)
            except grpc.RpcError as e:
                refused = (req, RpcFailure(e))
                break
        self.assertIsNotNone(refused, "a new segment was created on a volume without room for a snapshot")
        self.assertRpcFailure(refused[1], RE, "JOURNAL_DISK_QUOTA")
        self.assertNoJournalEnospc()
        # it was right: the snapshot does not fit, and that fails nothing else
        with self.assertRpcError(grpc.StatusCode.INTERNAL, "SNAPSHOT_FAILED"):
            self.admin.Snapshot(self.pb.admin.SnapshotRequest(), timeout=WAIT)
        self.assertNoJournalEnospc()

        # space back: ok again, logged; the snapshot and the refused write go through
        os.unlink(self.filler)
        d = self.wait_details(lambda d: d["dataDisk"]["snapshotRoom"] == "ok", "snapshotRoom ok")
        self.assertDerivedAsDocumented(d)
        srv.wait_log(lambda r: r.get("msg") == "the next snapshot fits on the data directory's file system again",
                     10, "the all-clear")
        self.admin.Snapshot(self.pb.admin.SnapshotRequest(), timeout=WAIT)
        req = refused[0]
        acked[req.key] = (value_of(req.value), self.cache.Set(req, timeout=WAIT).version)
        for k, want in acked.items():
            g = self.cache.Get(self.pb.cache.GetRequest(key=k), timeout=WAIT)
            self.assertEqual((value_of(g.value), g.version), want, k)

    def test_an_automatic_snapshot_that_fails_is_retried_after_a_pause_and_writes_resume_with_space(self):
        srv = self.boot()
        # 3 MiB of journal over 16 overwritten keys: several segments, a 1 MiB store
        acked = {}
        for i in range(48):
            req = self.set_req("k%02d" % (i % 16), i, "w%02d" % i)
            acked[req.key] = (value_of(req.value), self.cache.Set(req, timeout=WAIT).version)
        d = self.wait_details(lambda d: d["dataDisk"]["snapshotEstimateBytes"] > MIB, "the estimate")
        self.assertGreater(d["journal"]["segments"], 1)
        self.assertEqual(d["snapshot"]["lastLsn"], 0, "snapshotted before the volume filled")
        # another writer leaves less than the snapshot: the cap stops the journal where it is, which is past
        # its high-water mark, so the quota trigger fires -- and the snapshot fails for want of space
        avail = os.statvfs(self.mnt).f_bavail * os.statvfs(self.mnt).f_frsize
        fallocate(self.filler, avail - d["dataDisk"]["snapshotEstimateBytes"] // 2)
        first = srv.wait_log(lambda r: r.get("msg") == "snapshot failed", 10, "the automatic snapshot failing")
        d = self.details()
        self.assertEqual((d["dataDisk"]["snapshotRoom"], d["journalDisk"]["maxBytes"]),
                         ("short", d["journalDisk"]["usedBytes"]))
        self.assertNoJournalEnospc()
        # retried while the disk stays full, but after a pause (the trigger is checked ten times a second)
        srv.wait_log(lambda r: r.get("msg") == "snapshot failed" and r["time"] != first["time"], 20,
                     "the automatic snapshot retried")
        failed = [r for r in srv.log_records() if r.get("msg") == "snapshot failed"]
        stamps = [datetime.datetime.strptime(r["time"], "%Y-%m-%dT%H:%M:%S.%fZ") for r in failed]
        self.assertGreaterEqual((stamps[1] - stamps[0]).total_seconds(), 9.9, "retried without a pause")
        self.assertEqual(d["journal"]["failed"], False)
        # space back: the cap rises again, the journal is below its high-water mark, writes resume
        os.unlink(self.filler)
        d = self.wait_details(lambda d: d["dataDisk"]["snapshotRoom"] == "ok", "snapshotRoom ok")
        self.assertDerivedAsDocumented(d)
        self.assertEqual(d["journalDisk"]["state"], "normal")
        for i in range(32):
            req = self.set_req("k%02d" % (i % 16), i, "after-%02d" % i)
            acked[req.key] = (value_of(req.value), self.cache.Set(req, timeout=WAIT).version)
        for k, want in acked.items():
            g = self.cache.Get(self.pb.cache.GetRequest(key=k), timeout=WAIT)
            self.assertEqual((value_of(g.value), g.version), want, k)
        self.assertNoJournalEnospc()

    def test_a_configured_cap_and_no_cap_say_so(self):
        # a cap larger than the volume: configured, and low (it lets the journal take the snapshot's room)
        srv = self.boot("--journal-max-bytes=64MiB")
        d = self.details()
        self.assertEqual((d["dataDisk"]["journalCap"], d["journalDisk"]["maxBytes"]), ("configured", 64 * MIB))
        self.assertEqual(d["dataDisk"]["snapshotRoom"], "low")
        self.assertEqual(d["dataDisk"]["fsBytes"], TMPFS)
        self.assertIsNone(srv.find_log(lambda r: r.get("msg") == "journal disk cap derived from the file system"))
        srv.stop()
        srv = self.boot("--journal-max-bytes=0")
        d = self.details()
        self.assertEqual((d["dataDisk"]["journalCap"], d["journalDisk"]["maxBytes"]), ("none", 0))
        self.assertEqual(d["dataDisk"]["snapshotRoom"], "ok")
        srv.stop()
        # explicit auto is the default
        self.boot("--journal-max-bytes=auto")
        self.assertDerivedAsDocumented(self.details())


if __name__ == "__main__":
    SKIP_REASON = enter_private_mount_namespace(__file__)
    main()
