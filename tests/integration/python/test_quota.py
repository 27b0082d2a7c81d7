"""The journal disk quota (--journal-max-bytes) on a real filesystem.

* With a cap of four 1 MiB segments, writes that fit succeed and the first
  that does not is refused before it reaches the journal: RESOURCE_EXHAUSTED
  JOURNAL_DISK_QUOTA with ErrorInfo metadata (usedBytes, maxBytes,
  highWaterBytes, requestBytes), QuotaFailure (node:<node id>) and RetryInfo.
  The refusal is exact: checked against the segment files on disk, the
  record would neither fit in the current segment nor in a new one under
  the cap.
* /health/ready/details (journalDisk) moves normal -> high (from the
  high-water mark, 80 % of the cap) -> critical (while the last refused
  append, or the smallest, would not fit), with the figures the error
  carries; grpc.health.v1 stays SERVING and /health/ready 200.
* A refused write leaves no trace: Get, versions (none consumed), the
  journal's LSN and frames, the memory accounting, and its request_id
  (a retry after compaction is applied as a first attempt).
* A write that fits is never refused because of a past critical state;
  Remove, Touch, Persist and every other durable append are refused like
  any other when they do not fit; reads never are.
* Admin/Snapshot and its compaction bring the state back to normal and
  writes resume, in the same process (no restart) -- also after a refused
  record that can never fit.
* The plan follows the writer's placement rule: concurrent writers (group
  commit) fill the cap exactly and never past it; a record larger than a
  segment that grows the empty segment in place fits a cap of exactly the
  bytes it needs (and not one byte less).
* The cap with a real ENOSPC: the data directory is a tmpfs smaller than
  the cap. dreyd refuses cleanly (JOURNAL_WRITE_FAILED or
  JOURNAL_DISK_QUOTA), stays up, and after a restart every acknowledged
  write is there and no refused one is.

The file re-executes itself under `unshare --mount --propagation private`
so the tmpfs mount lives in a private mount namespace and cannot leak; the
tmpfs test is skipped, with the reason, only where that or the mount is not
permitted.
"""

import errno
import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest
from concurrent.futures import ThreadPoolExecutor

import grpc
from google.protobuf import duration_pb2

from drey_harness import (ADMIN_SERVICE, CACHE_SERVICE, FRAME_HEADER, HEALTH_SERVICE, DreyTestCase,
                          enter_private_mount_namespace, journal_segments, main, make_value, RpcFailure,
                          segment_frames, ServiceClient, storage_tool, value_of)

RE = grpc.StatusCode.RESOURCE_EXHAUSTED
SEGMENT = 1 << 20
CAP = 4 << 20
VALUE = 200 * 1024   # about five records to a segment
NODE = "quota-node"
WAIT = 30.0
QUOTA_KEYS = ["highWaterBytes", "maxBytes", "requestBytes", "usedBytes"]
QUOTA_DETAILS = {"ErrorInfo", "QuotaFailure", "RetryInfo"}
RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")
HOUR = duration_pb2.Duration(seconds=3600)

SKIP_REASON = None


def frame_size(payload_len):
    """A journal frame's size on disk: header and payload, 8-byte aligned
    (docs/durability.md)."""
    return (FRAME_HEADER + payload_len + 7) & ~7


class QuotaCase(DreyTestCase):
    SERVER_FLAGS = None

    def boot(self, *extra, data_dir=None, cap=CAP):
        flags = ["--segment-bytes=%d" % SEGMENT, "--journal-max-bytes=%d" % cap, "--snapshot-every-bytes=0",
                 "--snapshot-every=0", "--ops-listen=127.0.0.1:0", "--node-id=" + NODE]
        if data_dir is not None:
            flags.append("--data-dir=" + data_dir)
        srv = self.start_server(*(flags + list(extra)))
        self.srv = srv
        self.data_dir = data_dir or os.path.join(srv.tmp, "data")
        ch = srv.channel()
        self.cache = ServiceClient(ch, self.pb.cache, CACHE_SERVICE)
        self.admin = ServiceClient(ch, self.pb.admin, ADMIN_SERVICE)
        self.health = ServiceClient(ch, self.pb.health, HEALTH_SERVICE)
        return srv

    def details(self):
        status, body = self.srv.ops_get("/health/ready/details")
        self.assertEqual(status, 200, body)
        return json.loads(body)

    def disk(self):
        return self.details()["journalDisk"]

    def put(self, key, value, **fields):
        return self.cache.Set(self.pb.cache.SetRequest(key=key, value=make_value(value), **fields), timeout=WAIT)

    def quota_failure(self, fn, secret=None):
        """Runs fn expecting JOURNAL_DISK_QUOTA; returns (RpcFailure, its
        metadata as ints) after check_quota_failure."""
        with self.assertRaises(grpc.RpcError) as cm:
            fn()
        return self.check_quota_failure(RpcFailure(cm.exception), secret=secret)

    def check_quota_failure(self, f, secret=None):
        """RESOURCE_EXHAUSTED JOURNAL_DISK_QUOTA with ErrorInfo (the four
        figures), QuotaFailure (node:<id>) and RetryInfo, and nothing else."""
        self.assertRpcFailure(f, RE, "JOURNAL_DISK_QUOTA", secret=secret)
        self.assertEqual(set(f.details), QUOTA_DETAILS, "details of a quota refusal: %r" % f)
        self.assertIsNone(f.bad_request)
        self.assertEqual(sorted(f.metadata), QUOTA_KEYS)
        md = {k: int(v) for k, v in f.metadata.items()}
        qf = f.quota_failure
        self.assertEqual(len(qf.violations), 1, qf)
        self.assertEqual(qf.violations[0].subject, "node:" + NODE)
        self.assertTrue(qf.violations[0].description)
        delay = f.retry_info.retry_delay
        self.assertGreater(delay.seconds * 10**9 + delay.nanos, 0, "RetryInfo without a delay")
        return f, md

    def fill_until_refused(self, make_call, limit, what):
        """Calls make_call(i) until one is refused with JOURNAL_DISK_QUOTA;
        returns (responses of the calls that fitted, (i, failure, metadata))."""
        ok = []
        for i in range(limit):
            try:
                ok.append(make_call(i))
            except grpc.RpcError as e:
                return ok, (i,) + self.check_quota_failure(RpcFailure(e))
        self.fail("%s: %d calls and none was refused" % (what, limit))

    def assertServing(self):
        self.assertIsNone(self.srv.proc.poll(), "dreyd died")
        for svc in ("", CACHE_SERVICE):
            self.assertEqual(self.health.Check(self.pb.health.HealthCheckRequest(service=svc), timeout=WAIT).status,
                             self.pb.health.HealthCheckResponse.SERVING, "health of %r" % svc)
        self.assertEqual(self.srv.ops_get("/health/ready"), (200, "ready\n"))

    def last_segment_room(self):
        """Bytes left after the last frame of the newest segment file, from
        the file itself."""
        names = journal_segments(self.data_dir)
        path = os.path.join(self.data_dir, "journal", names[-1])
        frames = segment_frames(path)
        end = frames[-1].offset + frames[-1].size if frames else 64
        return os.path.getsize(path) - end

    def journal_frames(self):
        out = []
        for n in journal_segments(self.data_dir):
            out.extend(segment_frames(os.path.join(self.data_dir, "journal", n)))
        return out


class QuotaTest(QuotaCase):

    def test_the_first_write_that_does_not_fit_is_refused_and_compaction_brings_writes_back(self):
        pb = self.pb.cache
        srv = self.boot()
        pid = srv.proc.pid
        d = self.details()
        jd = d["journalDisk"]
        # one preallocated segment, well below the high-water mark at 80 % of the cap
        self.assertEqual(jd, {"state": "normal", "maxBytes": CAP, "usedBytes": SEGMENT,
                              "highWaterBytes": jd["highWaterBytes"], "writeRejectionActive": False})
        self.assertTrue(0.8 * CAP - 16 <= jd["highWaterBytes"] <= 0.8 * CAP, jd)
        high = jd["highWaterBytes"]
        self.assertEqual(d["journal"]["segments"], 1)

        # writes that fit succeed; each one's figures are consistent
        acked = {}
        states = [jd["state"]]
        used, version = jd["usedBytes"], 0
        refused = None
        for i in range(CAP // VALUE + 8):
            key, value = "fill-%02d" % i, bytes([i]) * VALUE
            before = self.details()
            room = self.last_segment_room()
            req = pb.SetRequest(key=key, value=make_value(value), request_id="rid-" + key)
            try:
                r = self.cache.Set(req, timeout=WAIT)
            except grpc.RpcError as e:
                refused = (key, req, RpcFailure(e), before, room)
                break
            self.assertEqual(r.version, version + 1, "versions count up by one")
            version = r.version
            acked[key] = (value, r.version)
            d = self.details()
            jd = d["journalDisk"]
            self.assertGreaterEqual(jd["usedBytes"], used)
            used = jd["usedBytes"]
            self.assertLessEqual(used, CAP, "the segments grew past the cap")
            self.assertEqual(used, d["journal"]["segments"] * SEGMENT, "usedBytes is the segments' bytes")
            self.assertEqual(sum(os.path.getsize(os.path.join(self.data_dir, "journal", n))
                                 for n in journal_segments(self.data_dir)), used, "usedBytes vs the files")
            self.assertEqual(jd["state"], "high" if used >= high else "normal", jd)
            self.assertFalse(jd["writeRejectionActive"])
            self.assertTrue(d["ready"])
            states.append(jd["state"])
        self.assertIsNotNone(refused, "no write was ever refused")
        self.assertGreaterEqual(len(acked), 3 * SEGMENT // VALUE, "writes that fit were refused")
        self.assertEqual(states, sorted(states, key=["normal", "high"].index), "normal, then high")
        self.assertIn("high", states)
        self.assertEqual(states[0], "normal")

        # the refusal: all three details, figures that agree with the details
        key, req, f, before, room = refused
        f, md = self.check_quota_failure(f, secret=key)
        after = self.details()
        self.assertEqual(md["maxBytes"], CAP)
        self.assertEqual(md["highWaterBytes"], high)
        self.assertEqual(md["usedBytes"], before["journalDisk"]["usedBytes"])
        self.assertEqual(md["usedBytes"], after["journalDisk"]["usedBytes"])
        self.assertTrue(VALUE < md["requestBytes"] < VALUE + 1024, md)
        # exact: the record fits neither in what is left of the segment nor in a new one
        need = frame_size(md["requestBytes"])
        self.assertGreater(need, room, "refused although the record fitted in the current segment")
        self.assertGreater(md["usedBytes"] + max(SEGMENT, need + 64), CAP,
                           "refused although a new segment fitted under the cap")
        self.assertEqual(after["journalDisk"]["state"], "critical")
        self.assertTrue(after["journalDisk"]["writeRejectionActive"])
        self.assertTrue(after["ready"], "disk pressure must not make the node unready")
        self.assertServing()

        # no trace: not applied, not journaled, not accounted
        self.assertFalse(self.cache.Get(pb.GetRequest(key=key), timeout=WAIT).found)
        self.assertEqual(after["journal"]["lastLsn"], before["journal"]["lastLsn"])
        self.assertEqual(after["memory"]["usedBytes"], before["memory"]["usedBytes"])
        frames = self.journal_frames()
        self.assertEqual(len(frames), after["journal"]["lastLsn"])
        self.assertEqual(self.last_segment_room(), room, "the refused write reached a segment file")
        self.assertFalse(any(key.encode() in fr.payload for fr in frames), "the refused write is in the journal")
        # a retry is refused the same way while it still does not fit
        self.quota_failure(lambda: self.cache.Set(req, timeout=WAIT))

        # a write that fits is never refused because of a past critical state;
        # no version was consumed by the refusals
        small = self.put("small", 1)
        self.assertEqual(small.version, version + 1)
        version = small.version
        acked["small"] = (1, small.version)
        jd = self.disk()
        self.assertEqual(jd["state"], "critical", "the refused write still does not fit")
        self.assertEqual(jd["usedBytes"], md["usedBytes"])

        # a snapshot and its compaction: back to normal in the same process
        segments = after["journal"]["segments"]
        snap = self.admin.Snapshot(self.pb.admin.SnapshotRequest(), timeout=WAIT)
        self.assertEqual(snap.segments_removed, segments - 1)
        d = self.details()
        jd = d["journalDisk"]
        self.assertEqual(d["journal"]["segments"], 1)
        self.assertEqual(jd, {"state": "normal", "maxBytes": CAP, "usedBytes": SEGMENT, "highWaterBytes": high,
                              "writeRejectionActive": False})
        self.assertEqual(d["snapshot"]["lastLsn"], snap.lsn)
        self.assertEqual(d["journal"]["lastLsn"], snap.lsn)
        self.assertEqual(d["compaction"]["state"], "idle")
        self.assertRegex(d["compaction"]["lastRun"], RFC3339)
        self.assertServing()

        # writes resume: the refused request, retried with its request_id, is a
        # first attempt (the refusal was not remembered), applied once
        r = self.cache.Set(req, timeout=WAIT)
        self.assertEqual(r.version, version + 1)
        acked[key] = (value_of(req.value), r.version)
        self.assertEqual(self.cache.Set(req, timeout=WAIT).version, r.version, "the retry was applied twice")
        for k, want in acked.items():  # one by one: together they pass the client's 4 MiB
            g = self.cache.Get(pb.GetRequest(key=k), timeout=WAIT)
            self.assertTrue(g.found, k)
            self.assertEqual((value_of(g.value), g.version), want, k)
        self.assertEqual(self.disk()["state"], "normal")
        # no restart happened
        self.assertEqual(srv.proc.pid, pid)
        self.assertIsNone(srv.proc.poll())
        self.assertEqual(sum(1 for rec in srv.log_records() if rec.get("msg") == "listening"), 1)

    def test_every_durable_append_is_refused_when_it_does_not_fit_and_reads_never_are(self):
        pb = self.pb.cache
        self.boot()
        long_key = "long-" + "x" * 300
        v_long = self.put(long_key, "kept", ttl=HOUR).version
        # fill: large records, then smaller and smaller ones, until even a
        # one-letter Increment does not fit
        self.fill_until_refused(lambda i: self.put("big-%d" % i, b"b" * VALUE), 64, "large writes")
        self.assertEqual(self.disk()["state"], "critical")
        for size in (16384, 1024):
            ok, _ = self.fill_until_refused(lambda i: self.put("mid-%d-%d" % (size, i), b"m" * size), 1000,
                                            "%d-byte writes" % size)
        ok, (_, _, inc) = self.fill_until_refused(
            lambda i: self.cache.Increment(pb.IncrementRequest(key="p", delta=1), timeout=WAIT), 1000, "increments")
        d = self.details()
        self.assertEqual(d["journalDisk"]["state"], "critical")
        self.assertTrue(d["journalDisk"]["writeRejectionActive"])
        self.assertEqual(d["journalDisk"]["usedBytes"], inc["usedBytes"])
        lsn = d["journal"]["lastLsn"]
        mem = d["memory"]["usedBytes"]

        # every durable append is refused, Remove, Touch and Persist included
        calls = {
            "Remove": pb.RemoveRequest(key=long_key, request_id="rid-refused-remove"),
            "Touch": pb.TouchRequest(key=long_key, ttl=duration_pb2.Duration(seconds=7200)),
            "Persist": pb.PersistRequest(key=long_key),
            "Set": pb.SetRequest(key=long_key, value=make_value("changed")),
            "Update": pb.UpdateRequest(key=long_key, value=make_value("changed")),
            "Add": pb.AddRequest(key=long_key + "-new", value=make_value(1)),
            "GetOrAdd": pb.GetOrAddRequest(key=long_key + "-new", value=make_value(1)),
            "Increment": pb.IncrementRequest(key=long_key + "-ctr", delta=1),
            "SetMany": pb.SetManyRequest(entries=[pb.SetManyRequest.Entry(key=long_key + "-%d" % i,
                                                                          value=make_value(i)) for i in range(3)]),
        }
        for method, req in calls.items():
            with self.subTest(method):
                _, md = self.quota_failure(lambda: self.cache.methods[method][0](req, timeout=WAIT))
                self.assertGreaterEqual(md["requestBytes"], inc["requestBytes"])
                self.assertEqual(md["usedBytes"], inc["usedBytes"])
        # ... and leaves nothing behind
        d = self.details()
        self.assertEqual(d["journal"]["lastLsn"], lsn)
        self.assertEqual(d["memory"]["usedBytes"], mem)

        # reads are never refused
        g = self.cache.Get(pb.GetRequest(key=long_key), timeout=WAIT)
        self.assertEqual((g.found, value_of(g.value), g.version), (True, "kept", v_long))
        e = self.cache.GetExpiration(pb.GetExpirationRequest(key=long_key), timeout=WAIT)
        self.assertTrue(e.found and e.has_expiration, "the refused Persist was applied")
        self.assertLessEqual(e.remaining.seconds, 3600, "the refused Touch was applied")
        many = self.cache.GetMany(pb.GetManyRequest(keys=[long_key, long_key + "-new", long_key + "-0", "p"]),
                                  timeout=WAIT).results
        self.assertEqual([m.found for m in many], [True, False, False, True])
        self.assertEqual(value_of(many[3].value), len(ok))
        self.assertServing()

        # after a snapshot they all go through; the refused Remove's request_id
        # was never remembered: another request may use it
        self.admin.Snapshot(self.pb.admin.SnapshotRequest(), timeout=WAIT)
        self.assertEqual(self.disk()["state"], "normal")
        other = self.put("other", 1, request_id="rid-refused-remove")
        self.assertEqual(self.put("other", 1, request_id="rid-refused-remove").version, other.version)
        t = self.cache.Touch(calls["Touch"], timeout=WAIT)
        self.assertTrue(t.found)
        self.assertEqual(t.version, v_long, "Touch keeps the version")
        self.assertTrue(self.cache.Persist(calls["Persist"], timeout=WAIT).found)
        self.assertTrue(self.cache.Remove(pb.RemoveRequest(key=long_key), timeout=WAIT).removed)
        self.assertFalse(self.cache.Get(pb.GetRequest(key=long_key), timeout=WAIT).found)


    def test_concurrent_writers_never_push_the_segments_past_the_cap(self):
        # Group commit batches many writers' records: the plan reserves them
        # in queue order, so the cap holds exactly and every refusal is clean.
        pb = self.pb.cache
        self.boot()
        value = 100 * 1024

        def writer(t):
            acked, refused = {}, []
            for i in range(CAP // value + 2):
                key = "t%02d-%03d" % (t, i)  # keys of one length: records of one size
                try:
                    r = self.cache.Set(pb.SetRequest(key=key, value=make_value(bytes([t]) * value)), timeout=WAIT)
                    acked[key] = (bytes([t]) * value, r.version)
                except grpc.RpcError as e:
                    refused.append((key, RpcFailure(e)))
                    break
            return acked, refused

        with ThreadPoolExecutor(16) as ex:
            results = list(ex.map(writer, range(16)))
        acked, refused = {}, []
        for a, r in results:
            acked.update(a)
            refused.extend(r)
        self.assertEqual(len(refused), 16, "every writer ends with a refusal")
        sizes = set()
        for key, f in refused:
            _, md = self.check_quota_failure(f)
            self.assertEqual(md["maxBytes"], CAP)
            self.assertLessEqual(md["usedBytes"], CAP)
            sizes.add(md["requestBytes"])
        self.assertEqual(len(sizes), 1, sizes)
        d = self.details()
        self.assertEqual(d["journalDisk"]["usedBytes"], CAP, "the cap was not filled")
        self.assertEqual(d["journalDisk"]["state"], "critical")
        self.assertEqual(sum(os.path.getsize(os.path.join(self.data_dir, "journal", n))
                             for n in journal_segments(self.data_dir)), CAP)
        self.assertLess(self.last_segment_room(), frame_size(sizes.pop()), "a refused write would have fitted")
        self.assertEqual(len(self.journal_frames()), len(acked))
        self.assertEqual(d["journal"]["lastLsn"], len(acked))
        self.assertEqual(sorted(v for _, v in acked.values()), list(range(1, len(acked) + 1)),
                         "versions are dense: no refused write consumed one")
        for key, (want, version) in acked.items():
            g = self.cache.Get(pb.GetRequest(key=key), timeout=WAIT)
            self.assertEqual((g.found, g.version), (True, version), key)
            self.assertEqual(value_of(g.value), want, key)
        for key, _ in refused:
            self.assertFalse(self.cache.Get(pb.GetRequest(key=key), timeout=WAIT).found, key)
        self.assertServing()

    def big_client(self):
        ch = self.srv.channel(options=[("grpc.max_send_message_length", 2 * CAP)])
        return ServiceClient(ch, self.pb.cache, CACHE_SERVICE)

    def test_a_record_larger_than_a_segment_may_grow_the_empty_segment_up_to_the_cap(self):
        # The writer's placement rule: a record larger than a segment that
        # comes while the segment being written holds no record grows that
        # segment instead of starting another (src/journal/journal.c,
        # rotate()). The quota follows the same rule: measured on a node
        # without a cap, the first write's segment bytes are exactly what it
        # needs, so with that cap it fits, and with one byte less it does not.
        pb = self.pb.cache
        req = pb.SetRequest(key="first", value=make_value(b"g" * (3 * SEGMENT)))
        srv = self.boot(cap=0)
        self.big_client().Set(req, timeout=WAIT)
        d = self.details()
        need = d["journalDisk"]["usedBytes"]
        self.assertEqual(d["journal"]["segments"], 1, "the empty segment was not grown")
        self.assertGreater(need, SEGMENT)
        self.assertLess(need, CAP)
        srv.stop()

        self.boot(cap=need - 1)
        _, md = self.quota_failure(lambda: self.big_client().Set(req, timeout=WAIT))
        self.assertEqual((md["usedBytes"], md["maxBytes"]), (SEGMENT, need - 1))
        self.srv.stop()

        self.boot(cap=need)
        try:
            r = self.big_client().Set(req, timeout=WAIT)
        except grpc.RpcError as e:
            self.fail("a write that grows the segments to exactly the cap was refused: %r (the quota plan counts "
                      "a new segment on top of the empty one the writer grows in place)" % RpcFailure(e))
        self.assertEqual(r.version, 1)
        d = self.details()
        self.assertEqual((d["journalDisk"]["usedBytes"], d["journal"]["segments"]), (need, 1))

    def test_a_write_that_can_never_fit_does_not_leave_the_state_critical_after_compaction(self):
        # A record that needs a segment of its own larger than the cap minus
        # the segment being written (which holds records, and which no
        # compaction deletes) can never be journaled: it is refused, writes
        # that fit go on, and once a snapshot and its compaction have freed
        # what they can, the state is normal again as after any refusal.
        pb = self.pb.cache
        self.boot()
        self.put("first", 0)  # the segment being written holds a record from now on
        big = self.big_client()
        huge = pb.SetRequest(key="huge", value=make_value(b"h" * (CAP - SEGMENT // 2)))
        _, md = self.quota_failure(lambda: big.Set(huge, timeout=WAIT))
        self.assertEqual(md["usedBytes"], SEGMENT)
        self.assertGreater(SEGMENT + frame_size(md["requestBytes"]) + 64, CAP)
        for i in range(3):
            self.put("small-%d" % i, i)
        snap = self.admin.Snapshot(self.pb.admin.SnapshotRequest(), timeout=WAIT)
        self.assertEqual(snap.lsn, 4)
        d = self.details()
        self.assertEqual(d["journalDisk"]["usedBytes"], SEGMENT)
        self.assertLess(d["journalDisk"]["usedBytes"], d["journalDisk"]["highWaterBytes"])
        self.assertEqual((d["journalDisk"]["state"], d["journalDisk"]["writeRejectionActive"]), ("normal", False),
                         "after a snapshot and compaction the state returns to normal (it stays pinned by a "
                         "refused record that no compaction can ever make room for)")
        self.put("after", 1)

# --- the cap with a real full disk ----------------------------------------------

TMPFS_BYTES = 2560 * 1024    # two and a half segments: smaller than the cap
ENOSPC_CAP = 8 << 20
ENOSPC_VALUE = 64 * 1024


class QuotaOnFullDiskTest(QuotaCase):

    @classmethod
    def setUpClass(cls):
        if SKIP_REASON:
            raise unittest.SkipTest(SKIP_REASON)
        super().setUpClass()

    def setUp(self):
        tmp = tempfile.mkdtemp(prefix="drey-quota-enospc-")
        self.addCleanup(shutil.rmtree, tmp, True)
        self.mnt = os.path.join(tmp, "mnt")
        os.mkdir(self.mnt)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%dk,mode=0700" % (TMPFS_BYTES // 1024), "tmpfs",
                            self.mnt], capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            self.skipTest("cannot mount a tmpfs in the private mount namespace: %s" % r.stderr.strip())
        self.addCleanup(subprocess.run, ["umount", "-l", self.mnt], capture_output=True, timeout=30)
        try:
            with open("/proc/1/mountinfo") as f:
                self.assertNotIn(" %s " % self.mnt, f.read(), "the tmpfs leaked out of the mount namespace")
        except PermissionError:
            pass
        st = os.statvfs(self.mnt)
        self.assertLessEqual(st.f_blocks * st.f_frsize, TMPFS_BYTES)
        self.assertLess(st.f_blocks * st.f_frsize, ENOSPC_CAP)

    def refusal(self, e):
        """A clean refusal of a durable write on a full disk: UNAVAILABLE
        JOURNAL_WRITE_FAILED (ENOSPC) or RESOURCE_EXHAUSTED JOURNAL_DISK_QUOTA."""
        f = RpcFailure(e)
        if f.reason == "JOURNAL_WRITE_FAILED":
            self.assertRpcFailure(f, grpc.StatusCode.UNAVAILABLE, "JOURNAL_WRITE_FAILED",
                                  metadata={"errno": str(errno.ENOSPC)})
        else:
            self.assertRpcFailure(f, RE, "JOURNAL_DISK_QUOTA")
        return f

    def test_a_tmpfs_smaller_than_the_cap_refuses_cleanly_and_loses_nothing(self):
        pb = self.pb.cache
        data_dir = os.path.join(self.mnt, "data")
        srv = self.boot(data_dir=data_dir, cap=ENOSPC_CAP)
        jd = self.disk()
        self.assertEqual(jd["maxBytes"], ENOSPC_CAP)
        self.assertGreater(jd["maxBytes"], TMPFS_BYTES)

        acked, refused = {}, {}
        # large writes until the disk, not the quota, says no
        first = None
        for i in range(2 * ENOSPC_CAP // ENOSPC_VALUE):
            key = "big-%03d" % i
            req = pb.SetRequest(key=key, value=make_value(bytes([i % 251]) * ENOSPC_VALUE), request_id="r" + key)
            try:
                acked[key] = (value_of(req.value), self.cache.Set(req, timeout=WAIT).version)
            except grpc.RpcError as e:
                first = self.refusal(e)
                refused[key] = req
                break
        self.assertIsNotNone(first, "no write was refused on a full tmpfs")
        self.assertGreater(len(acked), 2, "nothing fitted")
        # small writes still fit in what is left of the current segment
        for i in range(SEGMENT // 32):
            key = "small-%05d" % i
            req = pb.SetRequest(key=key, value=make_value(i), request_id="r" + key)
            try:
                acked[key] = (i, self.cache.Set(req, timeout=WAIT).version)
            except grpc.RpcError as e:
                self.refusal(e)
                refused[key] = req
                break
        else:
            self.fail("small writes never failed on a full tmpfs")
        # refused again, cleanly; the process stays up and serves reads and health
        for key, req in refused.items():
            with self.assertRaises(grpc.RpcError) as cm:
                self.cache.Set(req, timeout=WAIT)
            self.refusal(cm.exception)
        self.assertIsNone(srv.proc.poll(), "dreyd died on a full disk")
        for svc in ("", CACHE_SERVICE):
            self.assertEqual(self.health.Check(self.pb.health.HealthCheckRequest(service=svc), timeout=WAIT).status,
                             self.pb.health.HealthCheckResponse.SERVING)
        got = self.cache.GetMany(pb.GetManyRequest(keys=sorted(acked) + sorted(refused)), timeout=WAIT).results
        self.assertEqual({g.key: (value_of(g.value), g.version) for g in got if g.found}, acked)
        d = self.details()
        st = os.statvfs(self.mnt)
        self.assertLessEqual(d["journalDisk"]["usedBytes"], st.f_blocks * st.f_frsize)
        self.assertEqual(d["journalDisk"]["usedBytes"], sum(
            os.path.getsize(os.path.join(data_dir, "journal", n)) for n in journal_segments(data_dir)))
        with self.subTest("/health/ready after the journal failed"):
            if d["journal"]["failed"]:
                self.assertEqual(srv.ops_get("/health/ready")[0], 503)
                self.assertFalse(d["ready"])
            else:
                # what is true here instead: the node is ready
                self.assertEqual(srv.ops_get("/health/ready"), (200, "ready\n"))
                self.assertTrue(d["ready"])
                self.skipTest("ENOSPC on a tmpfs hits the creation of a new segment, which by design does not "
                              "fail the journal (include/drey/journal.h); preallocated segments never get "
                              "ENOSPC on write or fdatasync, so no failed journal can be provoked here")
        srv.stop()

        out = storage_tool("verify", data_dir)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.boot(data_dir=data_dir, cap=ENOSPC_CAP)
        got = self.cache.GetMany(pb.GetManyRequest(keys=sorted(acked) + sorted(refused)), timeout=WAIT).results
        found = {g.key: (value_of(g.value), g.version) for g in got if g.found}
        self.assertEqual(sorted(set(acked) - set(found)), [], "acknowledged writes were lost")
        self.assertEqual(found, acked, "refused writes were applied, or values changed")
        self.assertEqual(self.details()["recovery"]["state"], "done")


if __name__ == "__main__":
    SKIP_REASON = enter_private_mount_namespace(__file__)
    main()
