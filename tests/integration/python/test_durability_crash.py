"""Crash safety of the real binary: several clients write durably with
request_ids while dreyd is killed with SIGKILL at random moments, 30 times
on one data directory (DREY_TEST_CRASH_CYCLES; never fewer than 20).

After every restart:
* every acknowledged Set is there with its acknowledged value and version,
  or with the one later write of its key that was in flight (never acked);
* the shared counter lies between the acknowledged increments and those
  plus the unacknowledged ones; retrying every unacknowledged request with
  its request_id then makes it exactly the number of distinct request_ids,
  and the responses of all of them are exactly 1..total (delta 1: each
  application sees its own value, so a double application or a lost one
  shows);
* retrying acknowledged requests returns their original outcome and changes
  nothing; the same request_id with a different request is refused;
* versions are never reused across crashes.

Cycles vary: fsync always or interval (a process crash loses nothing
acknowledged under either), Admin/Snapshot in flight at the kill, size-
triggered snapshots, small segments so the journal rotates and is compacted.
The kill point is a random number of acknowledged writes, from a seeded RNG
(DREY_TEST_SEED reproduces a run; the seed is printed)."""

import os
import random
import shutil
import sys
import tempfile
import threading
import time
import traceback

import grpc

from drey_harness import (ADMIN_SERVICE, CACHE_SERVICE, DreyServer, DreyTestCase, RpcFailure, ServiceClient,
                          main, make_value, value_of)

CYCLES = max(20, int(os.environ.get("DREY_TEST_CRASH_CYCLES", "30")))
SEED = int(os.environ.get("DREY_TEST_SEED", "0")) or random.SystemRandom().randrange(1, 2**31)
SET_WORKERS = 2
INC_WORKERS = 2
KEYS_PER_WORKER = 6
COUNTER = "crash-counter"
CALL_TIMEOUT = 20.0
WAIT = 30.0  # deadline of every wait for progress


class Model:
    """What the clients were told, shared by the worker threads."""

    def __init__(self):
        self.lock = threading.Condition()
        # Set keys: key -> (seq, version) last acknowledged; key -> (seq, rid, request) in flight
        self.acked_set = {}
        self.pending_set = {}
        self.next_seq = {}
        # Increment: rid -> (value, version) of every request known applied (acked or retried)
        self.applied_inc = {}
        self.unknown_inc = {}      # rid -> request, unacknowledged in the current cycle
        self.inc_serial = 0
        self.acks = 0              # acknowledgements in the current cycle
        self.versions = {}         # version -> request id that got it (never reused)
        self.unexpected = []       # failures before the kill

    def note_version(self, version, rid):
        other = self.versions.setdefault(version, rid)
        if other != rid:
            raise AssertionError("version %d handed out twice: to %s and to %s" % (version, other, rid))


class CrashTest(DreyTestCase):
    SERVER_FLAGS = None

    def setUp(self):
        self.rng = random.Random(SEED)          # the kill points: reproducible from the seed
        self.sample_rng = random.Random(SEED + 1)  # which acknowledged requests are retried
        sys.stderr.write("\n[test_durability_crash] seed=%d (DREY_TEST_SEED=%d reproduces it), %d cycles\n"
                         % (SEED, SEED, CYCLES))
        self.model = Model()
        tmp = tempfile.mkdtemp(prefix="drey-crash-")
        if not os.environ.get("DREY_TEST_KEEP_TMP"):
            self.addCleanup(shutil.rmtree, tmp, True)
        self.data_dir = os.path.join(tmp, "data")
        self.cycle = 0
        self.torn_tails = 0
        self.snapshots_seen = 0
        self.unknown_applied = 0  # unacknowledged writes found applied after the crash
        self.unknown_fresh = 0    # unacknowledged writes first applied by their retry

    def ctx(self):
        return "seed=%d cycle=%d" % (SEED, self.cycle)

    # --- the server ---

    def start(self, fsync="always", snapshot_every_bytes="0"):
        srv = DreyServer("--data-dir=" + self.data_dir, "--segment-bytes=128KiB", "--retain-snapshots=2",
                         "--fsync=" + fsync, "--snapshot-every-bytes=" + snapshot_every_bytes,
                         name="dreyd[cycle %d]" % self.cycle)
        srv.start()
        self.addCleanup(srv.kill)
        done = srv.find_log(lambda r: r.get("msg") == "recovery: done")
        self.assertIsNotNone(done, "no 'recovery: done' line; %s" % self.ctx())
        self.torn_tails += int(done.get("torn_tails_cut", 0))
        return srv

    def clients(self, srv):
        ch = srv.channel()
        return ServiceClient(ch, self.pb.cache, CACHE_SERVICE), ServiceClient(ch, self.pb.admin, ADMIN_SERVICE)

    # --- the load ---

    def set_worker(self, w, srv, killed):
        pb = self.pb.cache
        m = self.model
        cache = ServiceClient(srv.channel(), pb, CACHE_SERVICE)
        keys = ["crash-w%d-k%d" % (w, i) for i in range(KEYS_PER_WORKER)]
        n = 0
        while True:
            key = keys[n % len(keys)]
            n += 1
            with m.lock:
                seq = m.next_seq.get(key, 0) + 1
                m.next_seq[key] = seq
                rid = "set-%s-%d" % (key, seq)
                req = pb.SetRequest(key=key, value=make_value(seq), request_id=rid)
                m.pending_set[key] = (seq, rid, req)
            try:
                resp = cache.Set(req, timeout=CALL_TIMEOUT)
            except grpc.RpcError as e:
                with m.lock:
                    if not killed.is_set():
                        m.unexpected.append("Set %s before the kill: %r" % (rid, RpcFailure(e)))
                return
            with m.lock:
                m.acked_set[key] = (seq, resp.version)
                del m.pending_set[key]
                m.note_version(resp.version, rid)
                m.acks += 1
                m.lock.notify_all()

    def inc_worker(self, w, srv, killed):
        pb = self.pb.cache
        m = self.model
        cache = ServiceClient(srv.channel(), pb, CACHE_SERVICE)
        while True:
            with m.lock:
                m.inc_serial += 1
                rid = "inc-%d-%d" % (w, m.inc_serial)
                req = pb.IncrementRequest(key=COUNTER, delta=1, request_id=rid)
                m.unknown_inc[rid] = req
            try:
                resp = cache.Increment(req, timeout=CALL_TIMEOUT)
            except grpc.RpcError as e:
                with m.lock:
                    if not killed.is_set():
                        m.unexpected.append("Increment %s before the kill: %r" % (rid, RpcFailure(e)))
                return
            with m.lock:
                del m.unknown_inc[rid]
                m.applied_inc[rid] = (resp.value, resp.version)
                m.note_version(resp.version, rid)
                m.acks += 1
                m.lock.notify_all()

    def snapshot_caller(self, srv, killed, at_acks, results):
        """Asks for a snapshot once at_acks writes were acknowledged: it may
        still be running when the kill comes."""
        m = self.model
        _, admin = self.clients(srv)
        with m.lock:
            if not m.lock.wait_for(lambda: m.acks >= at_acks or killed.is_set(), WAIT):
                return
            if killed.is_set():
                return
        try:
            results.append(admin.Snapshot(self.pb.admin.SnapshotRequest(), timeout=CALL_TIMEOUT))
        except grpc.RpcError as e:
            if not killed.is_set():
                with m.lock:
                    m.unexpected.append("Admin/Snapshot before the kill: %r" % RpcFailure(e))

    def thread(self, fn, *args):
        """A client thread whose unexpected exceptions fail the test."""
        def body():
            try:
                fn(*args)
            except BaseException:
                with self.model.lock:
                    self.model.unexpected.append(traceback.format_exc())
                    self.model.lock.notify_all()
        return threading.Thread(target=body)

    def run_until_kill(self, srv, kill_at, admin_snapshot_at=None, wait_size_snapshot=False):
        """Runs the workers until kill_at acknowledgements (and, when asked,
        a size-triggered snapshot), then SIGKILLs dreyd mid-load."""
        m = self.model
        killed = threading.Event()
        with m.lock:
            m.acks = 0
        threads = [self.thread(self.set_worker, w, srv, killed) for w in range(SET_WORKERS)]
        threads += [self.thread(self.inc_worker, w, srv, killed) for w in range(INC_WORKERS)]
        snaps = []
        if admin_snapshot_at is not None:
            threads.append(self.thread(self.snapshot_caller, srv, killed, admin_snapshot_at, snaps))
        for t in threads:
            t.start()
        try:
            with m.lock:
                ok = m.lock.wait_for(lambda: m.acks >= kill_at or m.unexpected, WAIT)
                self.assertTrue(ok, "only %d writes acknowledged in %.0fs; %s" % (m.acks, WAIT, self.ctx()))
            if wait_size_snapshot:
                srv.wait_log(lambda r: r.get("msg") == "snapshot written", WAIT, what="a size-triggered snapshot")
        finally:
            killed.set()
            srv.kill()  # SIGKILL
            srv.returncode = srv.proc.returncode
            for t in threads:
                t.join(WAIT)
                self.assertFalse(t.is_alive(), "a client thread hung after the kill; %s" % self.ctx())
            srv.close_channels()
        self.assertEqual(m.unexpected, [], "writes failed while dreyd was up; %s" % self.ctx())
        self.assertEqual(srv.returncode, -9, "dreyd was not killed by SIGKILL; %s" % self.ctx())
        self.snapshots_seen += len(snaps)
        for s in snaps:
            self.assertTrue(s.file.startswith("snapshots/"), s)

    # --- the checks after a restart ---

    def check_sets(self, cache):
        """Every key holds its acknowledged value and version, or the one
        unacknowledged write in flight; then that write is retried."""
        pb = self.pb.cache
        m = self.model
        keys = sorted(set(m.acked_set) | set(m.pending_set))
        got = {r.key: r for r in cache.GetMany(pb.GetManyRequest(keys=keys), timeout=CALL_TIMEOUT).results}
        for key in keys:
            r = got[key]
            acked = m.acked_set.get(key)
            pending = m.pending_set.get(key)
            where = "key %s (acked %r, in flight %r); %s" % (key, acked, pending and pending[:2], self.ctx())
            if not r.found:
                self.assertIsNone(acked, "an acknowledged write is lost: " + where)
            else:
                v = value_of(r.value)
                allowed = ([acked[0]] if acked else []) + ([pending[0]] if pending else [])
                self.assertIn(v, allowed, "wrong value %r: %s" % (v, where))
                if acked and v == acked[0]:
                    self.assertEqual(r.version, acked[1], "the acknowledged version changed: " + where)
            if pending is None:
                continue
            seq, rid, req = pending
            applied_before = r.found and value_of(r.value) == seq
            resp = cache.Set(req, timeout=CALL_TIMEOUT)
            if applied_before:
                self.unknown_applied += 1
                self.assertEqual(resp.version, r.version,
                                 "the retry of a write applied before the crash did not return its outcome: " + where)
            else:
                self.unknown_fresh += 1
                self.assertGreater(resp.version, max(m.versions, default=0),
                                   "a new write's version is not the highest: " + where)
            again = cache.Set(req, timeout=CALL_TIMEOUT)
            self.assertEqual(again.version, resp.version, "a second retry applied again: " + where)
            after = cache.Get(pb.GetRequest(key=key), timeout=CALL_TIMEOUT)
            self.assertTrue(after.found, where)
            self.assertEqual((value_of(after.value), after.version), (seq, resp.version), where)
            m.note_version(resp.version, rid)
            m.acked_set[key] = (seq, resp.version)
            del m.pending_set[key]

    def counter(self, cache):
        r = cache.Get(self.pb.cache.GetRequest(key=COUNTER), timeout=CALL_TIMEOUT)
        return value_of(r.value) if r.found else 0

    def check_counter(self, cache):
        m = self.model
        known = len(m.applied_inc)
        unknown = dict(m.unknown_inc)
        c0 = self.counter(cache)
        self.assertGreaterEqual(c0, known, "acknowledged increments are lost; %s" % self.ctx())
        self.assertLessEqual(c0, known + len(unknown),
                             "the counter holds more than every increment ever sent; %s" % self.ctx())
        # retry every unacknowledged increment with its request_id
        already = 0
        for rid, req in sorted(unknown.items()):
            resp = cache.Increment(req, timeout=CALL_TIMEOUT)
            if resp.value <= c0:
                already += 1  # applied before the crash: its original outcome
            m.note_version(resp.version, rid)
            m.applied_inc[rid] = (resp.value, resp.version)
            del m.unknown_inc[rid]
        self.unknown_applied += already
        self.unknown_fresh += len(unknown) - already
        self.assertEqual(already, c0 - known,
                         "retries answered as applied-before-the-crash do not match the counter; %s" % self.ctx())
        total = len(m.applied_inc)
        self.assertEqual(self.counter(cache), total,
                         "after retrying every request_id once the counter is not their number; %s" % self.ctx())
        values = sorted(v for v, _ in m.applied_inc.values())
        self.assertEqual(values, list(range(1, total + 1)),
                         "increment outcomes are not exactly 1..%d (applied twice or lost); %s" % (total, self.ctx()))
        # retrying again (unknowns and a sample of acknowledged ones) changes nothing
        sample = sorted(unknown) + self.sample_rng.sample(sorted(m.applied_inc), min(10, total))
        for rid in sample:
            req = self.pb.cache.IncrementRequest(key=COUNTER, delta=1, request_id=rid)
            resp = cache.Increment(req, timeout=CALL_TIMEOUT)
            self.assertEqual((resp.value, resp.version), m.applied_inc[rid],
                             "retry of %s does not return its first outcome; %s" % (rid, self.ctx()))
        self.assertEqual(self.counter(cache), total, "a retry was applied twice; %s" % self.ctx())

    def check_after_restart(self, srv):
        cache, _ = self.clients(srv)
        self.check_sets(cache)
        self.check_counter(cache)
        srv.close_channels()

    # --- the test ---

    def test_sigkill_cycles_lose_nothing_acknowledged_and_apply_retries_once(self):
        t0 = time.monotonic()
        for self.cycle in range(CYCLES):
            fsync = "interval:50ms" if self.cycle % 4 == 2 else "always"
            size_snapshots = self.cycle % 5 == 3
            admin_snapshot = self.cycle % 3 == 1
            srv = self.start(fsync=fsync, snapshot_every_bytes="16KiB" if size_snapshots else "0")
            self.check_after_restart(srv)
            kill_at = self.rng.randint(10, 400)
            self.run_until_kill(srv, kill_at,
                                admin_snapshot_at=self.rng.randint(0, kill_at) if admin_snapshot else None,
                                wait_size_snapshot=size_snapshots)
        self.cycle = CYCLES
        srv = self.start()
        self.check_after_restart(srv)
        pb = self.pb.cache
        cache, admin = self.clients(srv)
        # the same request_id with a different request is refused, across restarts
        rid = sorted(self.model.applied_inc)[0]
        with self.assertRpcError(grpc.StatusCode.FAILED_PRECONDITION, "IDEMPOTENCY_KEY_REUSED"):
            cache.Increment(pb.IncrementRequest(key=COUNTER, delta=2, request_id=rid), timeout=CALL_TIMEOUT)
        self.assertEqual(self.counter(cache), len(self.model.applied_inc))
        # a clean stop and start keeps it all too, from a final snapshot
        admin.Snapshot(self.pb.admin.SnapshotRequest(), timeout=CALL_TIMEOUT)
        srv.stop()
        srv = self.start()
        self.check_after_restart(srv)
        srv.stop()
        sys.stderr.write("[test_durability_crash] seed=%d: %d cycles in %.1fs, %d increments, %d keys, "
                         "%d torn tails cut, %d snapshots asked during the load; unacknowledged writes: "
                         "%d found applied, %d applied by their retry\n"
                         % (SEED, CYCLES, time.monotonic() - t0, len(self.model.applied_inc),
                            len(self.model.acked_set), self.torn_tails, self.snapshots_seen,
                            self.unknown_applied, self.unknown_fresh))


if __name__ == "__main__":
    main()
