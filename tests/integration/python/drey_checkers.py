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
"""
import bisect
import threading
import time


class Op:
    __slots__ = ("kind", "key", "value", "expected", "invoked", "completed", "outcome", "version")

    def __init__(self, kind, key, value=None, expected=None):
        self.kind, self.key, self.value, self.expected = kind, key, value, expected
        self.invoked = time.monotonic()
        self.completed = None
        self.outcome = None  # "ok", "fail" (definitive) or "unknown"
        self.version = None


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
