"""Checkers for histories of operations on a drey cluster under faults.

A history records each operation as it was invoked and as it completed
(monotonic times), with what the client learnt: a value and a version, a
definitive refusal, or nothing (the call never answered: "unknown", it may
or may not have taken effect). The checks are the ones a lost or reordered
write breaks, and are polynomial because every written value is unique.

Register (one key, compare-and-set): reads and CAS writes.
  - every read returns a (value, version) some write produced (an
    acknowledged one with that version, or an unknown one with that value);
  - real-time order: an operation that completed before another was invoked
    has the smaller version (a read may equal the write it follows);
  - two successful CAS never start from the same version, and acknowledged
    versions of one key are distinct.

Set (unique keys added with Add): every acknowledged key is present at the
end; a key present was acknowledged or its outcome is unknown (a key
definitively refused, or never tried, is a phantom).

Counter (Increment with request_id retries): the final value lies between
the acknowledged increments and the acknowledged plus unknown ones (below:
an acknowledged increment lost; above: one applied twice, or a refused one
applied).

The partition table (check_table_history): every revision of each
partition's entry in etcd, read back after a scenario, moves only as its
writers move it: a new primary had every acknowledged write, a backup
counts as in sync only once its copy is complete (the rules are in the
function's docstring).

The workloads below make such histories: threads calling random live nodes,
each failed attempt retried through another node with the same request_id
(as a client wanting exactly-once effects does), recording when each
operation was invoked and completed and what it learnt.
"""
import base64
import bisect
import http.client
import json
import random
import threading
import time

import grpc

from drey_harness import RpcFailure, make_value, value_of


class Op:
    __slots__ = ("kind", "key", "value", "expected", "invoked", "completed", "outcome", "version", "delta")

    def __init__(self, kind, key, value=None, expected=None):
        self.kind, self.key, self.value, self.expected = kind, key, value, expected
        self.invoked = time.monotonic()
        self.completed = None
        self.outcome = None  # "ok", "fail" (definitive) or "unknown"
        self.version = None
        self.delta = None


class History:
    def __init__(self):
        self.lock = threading.Lock()
        self.ops = []

    def invoke(self, kind, key, value=None, expected=None):
        op = Op(kind, key, value, expected)
        with self.lock:
            self.ops.append(op)
        return op

    @staticmethod
    def ok(op, value=None, version=None):
        op.completed = time.monotonic()
        op.outcome = "ok"
        if op.kind == "read":
            op.value = value
        op.version = version

    @staticmethod
    def fail(op):
        op.completed = time.monotonic()
        op.outcome = "fail"

    @staticmethod
    def unknown(op):
        op.outcome = "unknown"  # completed stays None: it may take effect at any time


def check_register(history, initial):
    """Violations (a list of strings) of the register checks for every key.
    initial: key -> (value, version) written before the history began."""
    problems = []
    by_key = {}
    for op in history.ops:
        by_key.setdefault(op.key, []).append(op)
    for key, ops in by_key.items():
        writes = [o for o in ops if o.kind == "cas"]
        acked = {o.version: o for o in writes if o.outcome == "ok"}
        if len(acked) != sum(1 for o in writes if o.outcome == "ok"):
            problems.append("%s: two acknowledged writes share a version" % key)
        unknown_values = {o.value for o in writes if o.outcome == "unknown"}
        start = {}
        for o in writes:
            if o.outcome == "ok":
                if o.expected in start:
                    problems.append("%s: two successful CAS started from version %d" % (key, o.expected))
                start[o.expected] = o
        iv = initial.get(key)
        for r in (o for o in ops if o.kind == "read" and o.outcome == "ok"):
            if iv is not None and (r.value, r.version) == iv:
                continue
            w = acked.get(r.version)
            if w is not None:
                if w.value != r.value:
                    problems.append("%s: read %r at version %d, written as %r" % (key, r.value, r.version, w.value))
            elif r.value not in unknown_values:
                problems.append("%s: read %r at version %s that no write produced" % (key, r.value, r.version))
        # An op that completed before another was invoked has the smaller
        # version: compare each op with the largest version completed
        # before it began (a running maximum over completion times).
        done = sorted((o for o in ops if o.outcome == "ok" and o.version is not None), key=lambda o: o.completed)
        times = [o.completed for o in done]
        best, running = [], None
        for o in done:
            if running is None or o.version > running.version:
                running = o
            best.append(running)
        for b in done:
            i = bisect.bisect_left(times, b.invoked)
            if i == 0:
                continue
            a = best[i - 1]
            strict = b.kind == "cas"
            if b.version < a.version or (strict and b.version == a.version):
                problems.append("%s: %s at version %d began after %s at version %d had completed" %
                                (key, b.kind, b.version, a.kind, a.version))
    return problems


def check_set(acked, unknown, final_present):
    """Violations of the set checks: acked, unknown and final_present are
    sets of keys (acknowledged Adds, Adds of unknown outcome, keys found at
    the end)."""
    problems = []
    lost = sorted(set(acked) - set(final_present))
    if lost:
        problems.append("%d acknowledged keys lost: %s" % (len(lost), ", ".join(lost[:10])))
    phantom = sorted(set(final_present) - set(acked) - set(unknown))
    if phantom:
        problems.append("%d keys present that were refused or never added: %s" %
                        (len(phantom), ", ".join(phantom[:10])))
    return problems


def check_counter(acked_total, attempted_total, final):
    """Violations of one counter's check: acked_total is the sum of the
    acknowledged deltas, attempted_total that plus the deltas of unknown
    outcome (definitively refused ones took no effect)."""
    if final < acked_total:
        return ["final value %d is below the %d acknowledged: an acknowledged increment was lost" %
                (final, acked_total)]
    if final > attempted_total:
        return ["final value %d is above the %d attempted: an increment was applied twice (or a refused one "
                "applied)" % (final, attempted_total)]
    return []


def set_outcomes(history):
    """(acked, unknown) keys of the history's adds."""
    adds = [o for o in history.ops if o.kind == "add"]
    return ({o.key for o in adds if o.outcome == "ok"}, {o.key for o in adds if o.outcome == "unknown"})


def counter_totals(history):
    """counter -> (acked total, acked + unknown total) of the history's
    increments."""
    out = {}
    for o in history.ops:
        if o.kind != "incr":
            continue
        acked, tried = out.get(o.key, (0, 0))
        if o.outcome == "ok":
            acked += o.delta
        if o.outcome in ("ok", "unknown"):
            tried += o.delta
        out[o.key] = (acked, tried)
    return out


# --- the partition table's history ------------------------------------------------

class Entry(tuple):
    """One revision of a partition's entry (drey.internal.v1.PartitionEntry):
    primary ("" while unassigned), replicas (the in-sync backups), syncing
    (backups being copied to), joining (a move's target, "" for none),
    handover (an in-sync backup the primary role goes to without a copy,
    "" for none)."""
    __slots__ = ()

    def __new__(cls, primary="", replicas=(), syncing=(), joining="", handover=""):
        return tuple.__new__(cls, (primary, frozenset(replicas), frozenset(syncing), joining, handover))

    primary = property(lambda self: self[0])
    replicas = property(lambda self: self[1])
    syncing = property(lambda self: self[2])
    joining = property(lambda self: self[3])
    handover = property(lambda self: self[4])

    @classmethod
    def of(cls, pe):
        """From a decoded PartitionEntry."""
        return cls(pe.primary, pe.replicas, pe.syncing, pe.joining[0] if pe.joining else "", pe.handover)

    def __repr__(self):
        return "Entry(%r, %s, syncing=%s, joining=%r, handover=%r)" % (
            self.primary, sorted(self.replicas), sorted(self.syncing), self.joining, self.handover)


def check_table_history(history, replication_factor=None, written_by_test=None):
    """Violations of the legal transitions of each partition's entry.
    history: partition -> [(epoch, Entry)], every revision of its etcd key
    in order (read_table_history); replication_factor: checks the count of
    copies too when given; written_by_test: partition -> epochs of
    revisions a test wrote into etcd itself (an old controller's plan, say):
    their own shape is not drey's to answer for, only what drey did next.

    Every change of an entry is one etcd transaction compared on the
    epoch (mod_revision) its writer read (src/cluster/entry.c), so
    consecutive revisions are exactly one writer's edit of the previous
    entry. The writers and their edits (src/cluster/plan.h):
      - the first assignment: an unassigned entry gets a primary and
        in-sync backups, all empty copies, so in sync from the start;
      - the controller's repairs: drop backups, copies and a handover on
        nodes that are gone, promote the first in-sync backup of a primary
        that is gone (clearing syncing, joining and handover), add a
        `syncing` backup on a node not holding the partition;
      - the controller's rebalance: sets `joining` (a node holding no
        in-sync copy) or `handover` (an in-sync backup) on an entry with
        neither, clears one whose target left, turns a `joining` that
        names an in-sync backup into a handover; adds a `syncing` backup
        where the placement wants one (one copy beyond the factor at
        most), drops an in-sync backup or a copy under way it does not
        want once the partition has enough in-sync copies without it;
      - the primary (move.c): a new backup's copy done moves it from
        syncing to replicas; a move makes `joining` the primary, clears
        joining, syncing and handover, and keeps the old primary as a
        backup while the partition would have too few copies without it;
        a handover makes `handover` the primary and the old primary an
        in-sync backup in its place;
      - the primary dropping a backup that did not acknowledge
        (replicate.c), and a restarted node stepping out of every role,
        handing a partition it led to a live in-sync backup (controller.c).
    From which these rules, each the one a wrong writer breaks:
      1. epochs strictly increase: each revision is a newer write;
      2. every entry is well formed: the primary is neither an in-sync nor
         a syncing backup, no node is both, the move target is not the
         primary, a handover names an in-sync backup, and with a factor,
         1 + in-sync + syncing <= factor + 1 (the repairs add no copy
         beyond the factor, the rebalance one: its replacement of a
         backup the placement does not want, made before that one goes);
      3. a copy's target is never in sync: `joining` is never one of the
         replicas. Its copy's first chunk replaces what the target holds,
         and an in-sync copy may be promoted at any moment (this is how
         acknowledged writes were once lost);
      4. an assigned partition keeps a primary: no writer clears it (with
         no live copy the partition waits for its primary);
      5. a new primary was in the previous entry's in-sync set (a
         failover, a step-down, a handover) or its move target, or the
         partition had none (the first assignment): anyone else would
         lead without every acknowledged write;
      6. a node enters the in-sync set only from syncing (its copy
         finished), or as the old primary at a move or a handover, or at
         the first assignment: any other way counts a copy that may lack
         acknowledged writes as in sync, and a failover to it would lose
         them.
    """
    problems = []
    written_by_test = written_by_test or {}
    for p in sorted(history):
        prev_epoch, prev = 0, Entry()
        for epoch, e in history[p]:
            where = "partition %d at epoch %d" % (p, epoch)
            foreign = epoch in written_by_test.get(p, ())
            if epoch <= prev_epoch:
                problems.append("%s: the epoch does not increase (after %d)" % (where, prev_epoch))
            if e.primary and (e.primary in e.replicas or e.primary in e.syncing):
                problems.append("%s: the primary %s is its own backup: %r" % (where, e.primary, e))
            if e.replicas & e.syncing:
                problems.append("%s: %s both in sync and syncing" % (where, ", ".join(sorted(e.replicas & e.syncing))))
            if e.joining and e.joining == e.primary:
                problems.append("%s: the primary %s is its own move target" % (where, e.primary))
            if e.handover and e.handover not in e.replicas:
                problems.append("%s: a handover to %s, not an in-sync backup: %r" % (where, e.handover, e))
            if e.joining and e.joining in e.replicas and not foreign:
                problems.append("%s: a copy planned onto %s, an in-sync backup: %r" % (where, e.joining, e))
            if replication_factor is not None and 1 + len(e.replicas) + len(e.syncing) > replication_factor + 1:
                problems.append("%s: more than one copy beyond the factor %d: %r" % (where, replication_factor, e))
            if prev.primary and not e.primary:
                problems.append("%s: the primary %s was cleared" % (where, prev.primary))
            first = not prev.primary
            if e.primary and e.primary != prev.primary and not first and \
                    e.primary not in prev.replicas and e.primary != prev.joining:
                problems.append("%s: new primary %s was neither in sync nor the move target in %r" %
                                (where, e.primary, prev))
            if not first:
                flipped = e.primary != prev.primary and e.primary in (prev.joining, prev.handover)
                for x in sorted(e.replicas - prev.replicas):
                    if x not in prev.syncing and not (flipped and x == prev.primary):
                        problems.append("%s: %s entered the in-sync set without a copy (was not syncing) in %r" %
                                        (where, x, prev))
            prev_epoch, prev = epoch, e
    return problems


def _etcd_json(port, path, body, timeout=10):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        data = json.loads(r.read() or b"{}")
    finally:
        c.close()
    if r.status != 200 or "error" in data:
        raise AssertionError("etcd %s: %d %s" % (path, r.status, data))
    return data


def read_table_history(cluster):
    """partition -> [(epoch, Entry)]: every revision of every
    <prefix>partitions/NNNNN key, oldest first, read from the cluster's
    etcd directly (not through a node's proxy) with its JSON gateway:
    each key's newest revision, then the one before it (a range at
    mod_revision - 1), back to its creation. The harness's etcd never
    compacts (no --auto-compaction-*), and the count read must be the
    key's version (etcd's count of its writes): a history with a gap
    would hide a transition."""
    b64 = lambda s: base64.b64encode(s.encode() if isinstance(s, str) else s).decode()
    port = cluster.etcd.client_port
    base = cluster.prefix + "partitions/"
    now = _etcd_json(port, "/v3/kv/range", {"key": b64(base), "range_end": b64(base[:-1] + "0")})
    out = {}
    for kv in now.get("kvs", []):
        key = base64.b64decode(kv["key"])
        p = int(key[len(base):])
        revs = []
        rev = int(kv["mod_revision"])
        while rev >= int(kv["create_revision"]):
            got = _etcd_json(port, "/v3/kv/range", {"key": kv["key"], "revision": rev}).get("kvs", [])
            if not got:
                break
            x = got[0]
            pe = cluster.pb.meta.PartitionEntry.FromString(base64.b64decode(x.get("value", "")))
            revs.append((int(x["mod_revision"]), Entry.of(pe)))
            rev = int(x["mod_revision"]) - 1
        if len(revs) != int(kv["version"]):
            raise AssertionError("partition %d: read %d revisions of its entry, etcd counts %s" %
                                 (p, len(revs), kv["version"]))
        out[p] = revs[::-1]
    if len(out) != cluster.partitions:
        raise AssertionError("%d partition entries in etcd, the cluster has %d" % (len(out), cluster.partitions))
    return out


def read_entry(cluster, p):
    """(epoch, Entry) of partition p now, from etcd."""
    key = "%spartitions/%05d" % (cluster.prefix, p)
    got = _etcd_json(cluster.etcd.client_port, "/v3/kv/range",
                     {"key": base64.b64encode(key.encode()).decode()}).get("kvs", [])
    if not got:
        return 0, Entry()
    pe = cluster.pb.meta.PartitionEntry.FromString(base64.b64decode(got[0].get("value", "")))
    return int(got[0]["mod_revision"]), Entry.of(pe)


def write_entry(cluster, p, epoch, entry):
    """Writes partition p's entry as a controller does: one transaction
    compared on the epoch it read. Returns the new epoch, or None when
    the entry had moved on."""
    key = base64.b64encode(("%spartitions/%05d" % (cluster.prefix, p)).encode()).decode()
    pe = cluster.pb.meta.PartitionEntry(primary=entry.primary, replicas=sorted(entry.replicas),
                                        syncing=sorted(entry.syncing), joining=[entry.joining] if entry.joining
                                        else [], handover=entry.handover)
    r = _etcd_json(cluster.etcd.client_port, "/v3/kv/txn", {
        "compare": [{"key": key, "target": "MOD", "result": "EQUAL", "mod_revision": epoch}],
        "success": [{"request_put": {"key": key, "value": base64.b64encode(pe.SerializeToString()).decode()}}]})
    return int(r["header"]["revision"]) if r.get("succeeded") else None


# --- clients and workloads --------------------------------------------------------

# A failed attempt worth retrying through another node. UNAVAILABLE,
# DEADLINE_EXCEEDED and CANCELLED may have taken effect (a forwarded call
# whose connection broke, a commit that did not answer in time);
# RESOURCE_EXHAUSTED is an admission refusal, which leaves no trace.
AMBIGUOUS = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
RETRYABLE = AMBIGUOUS | {grpc.StatusCode.RESOURCE_EXHAUSTED}


class Client:
    """Calls through a random live node (nodes(): Node objects), retrying a
    failed attempt through another with the same request, as a client that
    wants exactly-once effects does (with a request_id, a retry of a write
    that took effect answers with its first outcome)."""

    def __init__(self, nodes, rpc_timeout=10, attempts=40, backoff=0.05, seed=None):
        self.nodes = nodes
        self.rpc_timeout = rpc_timeout
        self.attempts = attempts
        self.backoff = backoff
        self.random = random.Random(seed)
        self.lock = threading.Lock()
        self.calls = 0    # RPCs made (each attempt counts)
        self.refused = 0  # of which failed (a retryable code)
        self.gave_up = 0  # calls that ran out of attempts
        # set while workloads stop: a call then makes no further attempt
        # (its outcome as far as it got), so stopping takes one RPC timeout,
        # not a whole retry budget spent against a fault still in place
        self.stopping = threading.Event()

    def counts(self):
        with self.lock:
            return self.calls, self.refused

    def call(self, method, **fields):
        """(response, None) on success; (None, "fail", RpcFailure) when
        every attempt was refused definitively (a code that cannot be
        ambiguous, or ErrorInfo outcome not_applied); (None, "unknown", last
        RpcFailure or None) when some attempt may have taken effect (or no
        node was up). A failure not worth retrying (VERSION_MISMATCH, a bad
        request) is raised as grpc.RpcError."""
        ambiguous, last = False, None
        for attempt in range(self.attempts):
            if attempt > 0 and self.stopping.is_set():
                break
            live = self.nodes()
            if not live:
                ambiguous = True
            else:
                node = self.random.choice(live)
                fn, req_cls, _ = node.cache.methods[method]
                try:
                    with self.lock:
                        self.calls += 1
                    return fn(req_cls(**fields), timeout=self.rpc_timeout), None, None
                except grpc.RpcError as e:
                    if e.code() not in RETRYABLE:
                        raise
                    with self.lock:
                        self.refused += 1
                    last = RpcFailure(e)
                    # a refusal that says it applied nothing is taken at its
                    # word, so the checkers catch it if it did
                    ambiguous = ambiguous or (e.code() in AMBIGUOUS and
                                              last.metadata.get("outcome") != "not_applied")
            time.sleep(self.backoff)  # a client's retry backoff
        with self.lock:
            self.gave_up += 1
        return None, ("unknown" if ambiguous else "fail"), last


def read_retrying(call, timeout=30):
    """A final read for a checker: a transient UNAVAILABLE (a peer's
    channel reconnecting after a restart) is retried, never taken for
    data; anything else is raised."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class Workload:
    """Threads running step(thread, i) until stop(), recording into
    self.history."""

    def __init__(self, client, threads=2, name="w"):
        self.client = client
        self.name = name
        self.history = History()
        self.stop_flag = threading.Event()
        self.errors = []  # exceptions a thread died of
        self.threads = [threading.Thread(target=self._run, args=(t,), daemon=True) for t in range(threads)]

    def setup(self):
        pass

    def _run(self, t):
        i = 0
        try:
            while not self.stop_flag.is_set():
                i += 1
                self.step(t, i)
        except Exception as e:  # noqa: BLE001  (reported by stop())
            self.errors.append(e)

    def start(self):
        self.setup()
        for th in self.threads:
            th.start()
        return self

    def count(self, outcome="ok"):
        return sum(1 for o in self.history.ops if o.outcome == outcome)

    def stop(self):
        self.stop_flag.set()
        for th in self.threads:
            th.join(timeout=120)
        if self.errors:
            raise self.errors[0]

    def record(self, op, r, outcome, version=None, value=None):
        h = self.history
        if r is not None:
            h.ok(op, value=value, version=version)
        elif outcome == "fail":
            h.fail(op)
        else:
            h.unknown(op)


class RegisterWorkload(Workload):
    """Per-key registers in cache "cas": read, then compare-and-set from the
    version read (a unique value each), checked by check_register against
    self.initial."""

    def __init__(self, client, threads=2, keys=2, name="reg", prefix=""):
        super().__init__(client, threads, name)
        self.keys = ["%s%s-%d" % (prefix, name, k) for k in range(keys)]
        self.initial = {}

    def setup(self):
        for key in self.keys:
            r, outcome, f = self.client.call("Set", cache="cas", key=key, value=make_value("init"))
            assert r is not None, "the register %s could not be set up: %s %r" % (key, outcome, f)
            self.initial[key] = ("init", r.version)

    def step(self, t, i):
        key = self.keys[i % len(self.keys)]
        h = self.history
        read = h.invoke("read", key)
        r, outcome, _ = self.client.call("Get", cache="cas", key=key)
        if r is None:
            self.record(read, None, outcome)
            return
        h.ok(read, value=value_of(r.value) if r.found else None, version=r.version)
        value = "%s-%d-%d" % (self.name, t, i)
        cas = h.invoke("cas", key, value=value, expected=r.version)
        try:
            w, outcome, _ = self.client.call("Set", cache="cas", key=key, value=make_value(value),
                                             if_version=r.version, request_id="%s-%d-%d" % (self.name, t, i))
        except grpc.RpcError as e:
            if RpcFailure(e).reason != "VERSION_MISMATCH":
                raise
            h.fail(cas)
            return
        self.record(cas, w, outcome, version=w.version if w is not None else None)

    def check(self):
        return check_register(self.history, self.initial)


class SetWorkload(Workload):
    """Unique keys added with Add (request_id retries) to cache "set"."""

    def __init__(self, client, threads=2, name="set", prefix=""):
        super().__init__(client, threads, name)
        self.prefix = prefix

    def step(self, t, i):
        key = "%s%s-%d-%d" % (self.prefix, self.name, t, i)
        op = self.history.invoke("add", key, value=key)
        r, outcome, _ = self.client.call("Add", cache="set", key=key, value=make_value(key),
                                         request_id="%s-add-%d-%d" % (self.name, t, i))
        if r is not None and not r.added:
            # a retry of an Add that took effect answers with its outcome:
            # added. Not added means someone else's key: a bug here.
            raise AssertionError("Add of the unique key %s found it present" % key)
        self.record(op, r, outcome, version=r.version if r is not None else None)

    def final_present(self, node, chunk=500):
        """Keys of the history present now, read through node by GetMany."""
        keys = sorted({o.key for o in self.history.ops if o.kind == "add"})
        present = set()
        fn, req_cls, _ = node.cache.methods["GetMany"]
        for k in range(0, len(keys), chunk):
            resp = read_retrying(lambda: fn(req_cls(cache="set", keys=keys[k:k + chunk]), timeout=30))
            present.update(res.key for res in resp.results if res.found)
        return present

    def check(self, node):
        acked, unknown = set_outcomes(self.history)
        return check_set(acked, unknown, self.final_present(node))


class CounterWorkload(Workload):
    """Counters in cache "ctr" incremented by 1 with request_id retries
    through random nodes."""

    def __init__(self, client, threads=2, counters=3, name="ctr", prefix=""):
        super().__init__(client, threads, name)
        self.counters = ["%s%s-%d" % (prefix, name, c) for c in range(counters)]

    def step(self, t, i):
        key = self.counters[(t + i) % len(self.counters)]
        op = self.history.invoke("incr", key)
        op.delta = 1
        r, outcome, _ = self.client.call("Increment", cache="ctr", key=key, delta=1,
                                         request_id="%s-%d-%d" % (self.name, t, i))
        self.record(op, r, outcome)

    def final(self, node):
        out = {}
        fn, req_cls, _ = node.cache.methods["Get"]
        for key in self.counters:
            r = read_retrying(lambda: fn(req_cls(cache="ctr", key=key), timeout=30))
            out[key] = value_of(r.value) if r.found else 0
        return out

    def check(self, node):
        final = self.final(node)
        problems = []
        for key, (acked, tried) in counter_totals(self.history).items():
            problems += ["%s: %s" % (key, p) for p in check_counter(acked, tried, final[key])]
        return problems
