"""A data directory written by an older dreyd recovers with the same
remembered outcomes.

tests/fixtures/outcomes-v0 was written by the dreyd of commit 5497eff, which
persisted a failed outcome's error as its drey_error ordinal (see its
README). Today's dreyd recovers a copy of it (outcomes from the snapshot in
the old byte form, the later ones re-created by journal replay), and every
retried request_id is answered as that binary answered it: the same code,
reason and metadata for failures, the same response (versions) for
successes, nothing applied again. Then today's dreyd snapshots the state,
restarts from that snapshot alone and answers the same again.

The outcomes were remembered for 168h from the fixture's writing, so dreyd
runs under libfaketime with its wall clock set to just after that moment
(its monotonic clock is left alone)."""

import datetime
import json
import os
import shutil
import tempfile

import grpc
from google.protobuf import json_format

from drey_harness import (ADMIN_SERVICE, CACHE_SERVICE, DreyServer, DreyTestCase, RpcFailure, ServiceClient,
                          main, make_value)

HERE = os.path.dirname(os.path.abspath(__file__))
WAIT = 30.0
LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


def fixture_dir():
    for base in (os.getcwd(), os.path.join(HERE, "..", "..", "..")):
        d = os.path.join(base, "tests", "fixtures", "outcomes-v0")
        if os.path.isfile(os.path.join(d, "expected.json")):
            return os.path.normpath(d)
    raise RuntimeError("cannot find tests/fixtures/outcomes-v0")


def outcome(cache, method, req):
    try:
        resp = getattr(cache, method)(req, timeout=WAIT)
        return {"ok": json_format.MessageToDict(resp, preserving_proto_field_name=True)}
    except grpc.RpcError as e:
        f = RpcFailure(e)
        return {"code": f.code.name, "reason": f.reason, "metadata": f.metadata}


class OutcomeFixtureTest(DreyTestCase):
    SERVER_FLAGS = None

    def setUp(self):
        if not os.access(LIBFAKETIME, os.R_OK):
            self.fail("libfaketime is missing (Debian package faketime)")
        src = fixture_dir()
        with open(os.path.join(src, "expected.json")) as f:
            self.expected = json.load(f)
        d = tempfile.mkdtemp(prefix="drey-fixture-")
        if not os.environ.get("DREY_TEST_KEEP_TMP"):
            self.addCleanup(shutil.rmtree, d, True)
        self.data_dir = os.path.join(d, "data")
        shutil.copytree(os.path.join(src, "data"), self.data_dir)
        # A minute after the fixture was written, well inside the retention.
        at = datetime.datetime.fromtimestamp(self.expected["written_ms"] / 1000 + 60, datetime.timezone.utc)
        self.env = {
            "LD_PRELOAD": LIBFAKETIME,
            "FAKETIME": at.strftime("@%Y-%m-%d %H:%M:%S"),
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "TZ": "UTC",
            # libfaketime is preloaded before the ASan runtime of an ASan build.
            "ASAN_OPTIONS": "verify_asan_link_order=0:" + os.environ.get("ASAN_OPTIONS", ""),
        }

    def boot(self):
        srv = DreyServer("--data-dir=" + self.data_dir, *self.expected["flags"], env=self.env).start()
        self.addCleanup(srv.kill)
        ch = srv.channel()
        return srv, ServiceClient(ch, self.pb.cache, CACHE_SERVICE), ServiceClient(ch, self.pb.admin, ADMIN_SERVICE)

    def check(self, cache, where):
        pb = self.pb.cache
        for a in self.expected["attempts"]:
            req = json_format.ParseDict(a["request"], getattr(pb, a["method"] + "Request")())
            self.assertEqual(outcome(cache, a["method"], req), a["outcome"],
                             "%s: %s %s is not answered as the old binary answered it"
                             % (where, a["method"], req.request_id))
        state = cache.GetMany(pb.GetManyRequest(keys=["k1", "k2", "k3", "k4", "k5", "n"]), timeout=WAIT)
        self.assertEqual(json_format.MessageToDict(state, preserving_proto_field_name=True), self.expected["state"],
                         "%s: a retry was applied again" % where)
        with self.assertRpcError(grpc.StatusCode.FAILED_PRECONDITION, "IDEMPOTENCY_KEY_REUSED"):
            cache.Set(pb.SetRequest(key="k1", value=make_value("other"), if_version=999, request_id="cas-1"),
                      timeout=WAIT)

    def test_old_outcomes_answer_the_same_after_recovery_and_a_new_snapshot(self):
        reasons = {a["outcome"].get("reason") for a in self.expected["attempts"]}
        self.assertTrue({"VERSION_MISMATCH", "NOT_AN_INTEGER", None} <= reasons, "the fixture lost its point")
        srv, cache, admin = self.boot()
        done = srv.find_log(lambda r: r.get("msg") == "recovery: done")
        self.assertEqual(done["snapshot_lsn"], self.expected["snapshot_lsn"])
        self.assertGreater(done["replayed_records"], 0, "nothing came from the journal")
        self.check(cache, "recovered")
        snap = admin.Snapshot(self.pb.admin.SnapshotRequest(), timeout=WAIT)
        srv.stop()

        srv, cache, admin = self.boot()
        done = srv.find_log(lambda r: r.get("msg") == "recovery: done")
        self.assertEqual((done["snapshot_lsn"], done["replayed_records"]), (snap.lsn, 0),
                         "expected a recovery from today's snapshot alone")
        self.check(cache, "from today's snapshot")
        srv.stop()


if __name__ == "__main__":
    main()
