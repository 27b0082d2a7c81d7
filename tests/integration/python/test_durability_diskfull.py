"""A real full disk with no journal cap (--journal-max-bytes=0): the data
directory is a small size-limited tmpfs that the test fills. (On defaults
the node derives a cap from the file system and refuses with
JOURNAL_DISK_QUOTA before the disk is full: test_diskcap.py.) The server
stays up, fails writes with UNAVAILABLE
JOURNAL_WRITE_FAILED (errno ENOSPC) without applying them, keeps serving
reads and health; once space is freed writes work again (the journal goes
on after a segment could not be created: include/drey/journal.h), and after
a restart nothing acknowledged is lost and nothing refused was applied.

The test re-executes itself under `unshare --mount --propagation private`
so its tmpfs mount lives in a private mount namespace and cannot leak; where
that or the mount is not permitted it is skipped with the reason."""

import errno
import os
import unittest

import grpc

from drey_harness import (ADMIN_SERVICE, CACHE_SERVICE, HEALTH_SERVICE, DreyServer, DreyTestCase,
                          enter_private_mount_namespace, fill_filesystem, main, make_value, mount_tmpfs, RpcFailure,
                          ServiceClient, storage_tool, value_of)

WAIT = 30.0
SEGMENT = 256 * 1024
BIG = "z" * 16384  # 16 KiB values: a segment is full after ~16 of them
SKIP_REASON = None


class DiskFullTest(DreyTestCase):
    SERVER_FLAGS = None

    @classmethod
    def setUpClass(cls):
        if SKIP_REASON:
            raise unittest.SkipTest(SKIP_REASON)
        super().setUpClass()

    def setUp(self):
        self.mnt = mount_tmpfs(self, 4 << 20, "drey-diskfull-")
        self.data_dir = os.path.join(self.mnt, "data")

    def boot(self):
        srv = DreyServer("--data-dir=" + self.data_dir, "--segment-bytes=%d" % SEGMENT, "--journal-max-bytes=0",
                         "--snapshot-every-bytes=0", "--snapshot-every=0", "--ops-listen=127.0.0.1:0").start()
        self.addCleanup(srv.kill)
        ch = srv.channel()
        return (srv, ServiceClient(ch, self.pb.cache, CACHE_SERVICE), ServiceClient(ch, self.pb.admin, ADMIN_SERVICE),
                ServiceClient(ch, self.pb.health, HEALTH_SERVICE))

    def assertJournalWriteFailed(self, fn):
        with self.assertRpcError(grpc.StatusCode.UNAVAILABLE, "JOURNAL_WRITE_FAILED",
                                 metadata={"errno": str(errno.ENOSPC)}) as e:
            fn()
        return e.failure

    def test_full_disk_fails_writes_keeps_reads_and_loses_nothing(self):
        pb = self.pb.cache
        srv, cache, admin, health = self.boot()
        acked = {}
        for i in range(5):
            r = cache.Set(pb.SetRequest(key="before-%d" % i, value=make_value(i), request_id="b%d" % i), timeout=WAIT)
            acked["before-%d" % i] = (i, r.version)

        filler = os.path.join(self.mnt, "filler")
        self.assertGreater(fill_filesystem(filler), 0)
        self.assertEqual(os.statvfs(self.mnt).f_bavail, 0, "the tmpfs is not full")

        # writes go on into the preallocated segment, then the next segment
        # cannot be created: the write fails, documented, and is not applied
        failed = None
        for i in range(4 * SEGMENT // len(BIG)):
            key, rid = "fill-%03d" % i, "f%03d" % i
            req = pb.SetRequest(key=key, value=make_value(BIG), request_id=rid)
            try:
                r = cache.Set(req, timeout=WAIT)
            except grpc.RpcError as e:
                f = RpcFailure(e)
                self.assertRpcFailure(f, grpc.StatusCode.UNAVAILABLE, "JOURNAL_WRITE_FAILED",
                                      metadata={"errno": str(errno.ENOSPC)})
                failed = (key, req)
                break
            acked[key] = (BIG, r.version)
        self.assertIsNotNone(failed, "writes never failed on a full disk")
        self.assertGreater(len(acked), 5, "no write fitted in the preallocated segment")

        # smaller records still fit: fill the segment up with the smallest
        # (an Increment of a one-letter key) until even that is refused
        pad = 0
        for _ in range(SEGMENT // 64):
            try:
                r = cache.Increment(pb.IncrementRequest(key="p", delta=1), timeout=WAIT)
            except grpc.RpcError as e:
                self.assertRpcFailure(RpcFailure(e), grpc.StatusCode.UNAVAILABLE, "JOURNAL_WRITE_FAILED",
                                      metadata={"errno": str(errno.ENOSPC)})
                break
            pad += 1
            acked["p"] = (pad, r.version)
        else:
            self.fail("small writes never failed on a full disk")
        # and a Remove's record is smaller still (it carries no version)
        for _ in range(SEGMENT // 64):
            try:
                cache.Remove(pb.RemoveRequest(key="q"), timeout=WAIT)
            except grpc.RpcError as e:
                self.assertRpcFailure(RpcFailure(e), grpc.StatusCode.UNAVAILABLE, "JOURNAL_WRITE_FAILED",
                                      metadata={"errno": str(errno.ENOSPC)})
                break
        else:
            self.fail("the smallest writes never failed on a full disk")

        # now it fails every kind of write, and applies none of them
        self.assertJournalWriteFailed(lambda: cache.Set(failed[1], timeout=WAIT))
        self.assertJournalWriteFailed(lambda: cache.Increment(pb.IncrementRequest(key="ctr", delta=1,
                                                                                 request_id="ctr-1"), timeout=WAIT))
        self.assertJournalWriteFailed(lambda: cache.SetMany(pb.SetManyRequest(entries=[
            pb.SetManyRequest.Entry(key="many-%d" % i, value=make_value(BIG)) for i in range(20)]), timeout=WAIT))
        self.assertJournalWriteFailed(lambda: cache.Remove(pb.RemoveRequest(key="before-0"), timeout=WAIT))

        # the server stays up and keeps serving reads and health
        self.assertIsNone(srv.proc.poll(), "dreyd died on a full disk")
        for svc in ("", CACHE_SERVICE):
            self.assertEqual(health.Check(self.pb.health.HealthCheckRequest(service=svc), timeout=WAIT).status,
                             self.pb.health.HealthCheckResponse.SERVING, "health of %r on a full disk" % svc)
        got = cache.GetMany(pb.GetManyRequest(keys=sorted(acked) + [failed[0], "ctr", "many-0"]),
                            timeout=WAIT).results
        for r in got:
            if r.key in acked:
                self.assertTrue(r.found, r.key)
                self.assertEqual((value_of(r.value), r.version), acked[r.key], r.key)
            else:
                self.assertFalse(r.found, "%s was refused but applied" % r.key)
        status, _ = srv.ops_get("/health/ready")
        self.assertEqual(status, 200, "disk pressure must not make the node unready")
        d = admin.GetReadinessDetails(self.pb.admin.GetReadinessDetailsRequest(), timeout=WAIT)
        self.assertTrue(d.ready)
        self.assertFalse(d.journal.failed, "a segment that could not be created must not fail the journal")
        self.assertEqual((d.data_disk.journal_cap, d.journal_disk.max_bytes), ("none", 0), "explicit 0: no cap")
        self.assertEqual(d.journal.segments, 1)
        warn = srv.find_log(lambda r: r.get("msg") == "journal cannot start a new segment")
        self.assertIsNotNone(warn, srv.log_text())
        self.assertEqual(os.listdir(os.path.join(self.data_dir, "journal")), ["%016x.seg" % 1],
                         "a failed segment creation left files behind")

        # a snapshot cannot be written either: refused, documented, nothing left behind
        with self.assertRpcError(grpc.StatusCode.INTERNAL, "SNAPSHOT_FAILED"):
            admin.Snapshot(self.pb.admin.SnapshotRequest(), timeout=WAIT)
        self.assertFalse(os.path.exists(os.path.join(self.data_dir, "CURRENT")))
        snaps = os.path.join(self.data_dir, "snapshots")
        self.assertEqual(os.listdir(snaps) if os.path.isdir(snaps) else [], [],
                         "a failed snapshot left files behind")
        self.assertIsNone(srv.proc.poll(), "dreyd died on a failed snapshot")

        # space freed: the refused write, retried with its request_id, is applied once
        os.unlink(filler)
        r = cache.Set(failed[1], timeout=WAIT)
        acked[failed[0]] = (BIG, r.version)
        self.assertEqual(cache.Set(failed[1], timeout=WAIT).version, r.version)
        r = cache.Increment(pb.IncrementRequest(key="ctr", delta=1, request_id="ctr-1"), timeout=WAIT)
        self.assertEqual(r.value, 1)
        acked["ctr"] = (1, r.version)
        snap = admin.Snapshot(self.pb.admin.SnapshotRequest(), timeout=WAIT)
        # live keys, plus the remembered outcome of every request_id applied
        rids = sum(1 for k in acked if k.startswith(("before-", "fill-"))) + 1
        self.assertEqual(snap.entries, len(acked) + rids)
        r = cache.Set(pb.SetRequest(key="after-snapshot", value=make_value(1)), timeout=WAIT)
        acked["after-snapshot"] = (1, r.version)
        srv.stop()

        out = storage_tool("verify", self.data_dir)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)

        srv, cache, _, _ = self.boot()
        got = cache.GetMany(pb.GetManyRequest(keys=sorted(acked) + ["many-0"]), timeout=WAIT).results
        for r in got:
            if r.key in acked:
                self.assertTrue(r.found, "%s was acknowledged and is lost" % r.key)
                self.assertEqual((value_of(r.value), r.version), acked[r.key], r.key)
            else:
                self.assertFalse(r.found, "%s was refused but applied" % r.key)
        self.assertEqual(cache.Increment(pb.IncrementRequest(key="ctr", delta=1, request_id="ctr-1"),
                                         timeout=WAIT).value, 1, "the retried increment was applied twice")
        srv.stop()


if __name__ == "__main__":
    SKIP_REASON = enter_private_mount_namespace(__file__)
    main()
