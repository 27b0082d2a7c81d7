"""/metrics (Prometheus text) through curl, checked by `promtool check
metrics` (Debian's prometheus package, installed here when missing) and by
a parser of its own:

* every sample belongs to a family declared with HELP and TYPE; counters end
  in _total; histograms have cumulative buckets ending at +Inf that equal
  their _count, and a _sum;
* the journal disk figures are those of /health/ready/details in every
  state (normal, high, critical, normal after a snapshot): used and max
  bytes, a one-hot state gauge, segments, LSN; refusals are counted by stage
  and reason (JOURNAL_DISK_QUOTA) and by method and code; the snapshot and
  compaction counters follow Admin/Snapshot; the group-commit histograms
  add up to the records written;
* principal-level series exist only for a bounded top 10 (the principals
  with the most refusals), however many principals there are;
* no key or cache name a client sent appears.
"""

import json
import math
import os
import re
import shutil
import subprocess
import uuid

import grpc

from drey_harness import (ADMIN_SERVICE, CACHE_SERVICE, DreyTestCase, RpcFailure, ServiceClient, main,
                          make_value)

WAIT = 30.0
SEGMENT = 1 << 20
CAP = 4 << 20
VALUE = 200 * 1024
TOP = 10
SET = "/drey.cache.v1.Cache/Set"
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?')

_promtool = None


def promtool():
    """promtool's path; installs Debian's prometheus package when it is
    missing (the test's own dependency, also in bazel/drey.sh)."""
    global _promtool
    if _promtool is None:
        path = shutil.which("promtool")
        if path is None:
            st = subprocess.run(["dpkg-query", "-W", "-f=${Status}", "prometheus"], capture_output=True, text=True)
            if "install ok installed" not in st.stdout:
                env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
                cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "-o",
                       "DPkg::Lock::Timeout=600", "prometheus"]
                r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
                if r.returncode != 0:
                    subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env, timeout=900)
                    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
                if r.returncode != 0:
                    raise AssertionError("cannot install prometheus (for promtool): %s" % r.stderr[-2000:])
            path = shutil.which("promtool") or "/usr/bin/promtool"
        _promtool = path
    return _promtool


def curl(url):
    """(HTTP status, Content-Type, body) through curl(1)."""
    cmd = ["curl", "-sS", "--noproxy", "*", "--max-time", "30", "-o", "-", "-w", "\n%{http_code} %{content_type}",
           url]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError("curl %s failed (%d): %s" % (url, r.returncode, r.stderr))
    body, _, tail = r.stdout.rpartition("\n")
    code, _, ctype = tail.partition(" ")
    return int(code), ctype, body


class Exposition:
    """A parsed text exposition: families (name -> {help, type, samples})
    and samples as (name, labels dict, value)."""

    def __init__(self, text):
        self.text = text
        self.families = {}
        self.samples = []
        self.problems = []
        current = None
        for n, line in enumerate(text.split("\n"), 1):
            if line == "":
                continue
            if line.startswith("# HELP "):
                name, _, help_ = line[7:].partition(" ")
                current = self.families.setdefault(name, {"help": None, "type": None, "samples": []})
                current["help"] = help_
                continue
            if line.startswith("# TYPE "):
                name, _, type_ = line[7:].partition(" ")
                if self.families.get(name, {}).get("help") is None:
                    self.problems.append("line %d: TYPE of %s before its HELP" % (n, name))
                current = self.families.setdefault(name, {"help": None, "type": None, "samples": []})
                current["type"] = type_
                continue
            if line.startswith("#"):
                continue
            m = SAMPLE.match(line)
            if m is None:
                self.problems.append("line %d: not a sample: %r" % (n, line))
                continue
            name, labels, value = m.group(1), dict(LABEL.findall(m.group(3) or "")), float(m.group(4))
            fam = self.family_of(name)
            if fam is None or fam is not current:
                self.problems.append("line %d: %s is not under its family's HELP and TYPE" % (n, name))
            else:
                fam["samples"].append((name, labels, value))
            self.samples.append((name, labels, value))

    def family_of(self, name):
        if name in self.families:
            return self.families[name]
        for suffix in ("_bucket", "_sum", "_count"):
            base = name[:-len(suffix)]
            if name.endswith(suffix) and self.families.get(base, {}).get("type") == "histogram":
                return self.families[base]
        return None

    def get(self, name, **labels):
        """The value of the one sample of name whose labels include these;
        None if there is none."""
        found = [v for n, l, v in self.samples if n == name and all(l.get(k) == w for k, w in labels.items())]
        if len(found) > 1:
            raise AssertionError("%d samples of %s%r" % (len(found), name, labels))
        return found[0] if found else None

    def series(self, name):
        return [(l, v) for n, l, v in self.samples if n == name]


class MetricsCase(DreyTestCase):
    SERVER_FLAGS = None

    def node(self, *flags):
        srv = self.start_server("--ops-listen=127.0.0.1:0", "--node-id=metrics-node", *flags)
        self.srv = srv
        self.ops = int(srv.find_log(lambda r: r.get("msg") == "listening")["ops_port"])
        ch = srv.channel()
        self.cache = ServiceClient(ch, self.pb.cache, CACHE_SERVICE)
        self.admin = ServiceClient(ch, self.pb.admin, ADMIN_SERVICE)
        return srv

    def metrics(self):
        """/metrics, checked by promtool and by the structural rules."""
        code, ctype, text = curl("http://127.0.0.1:%d/metrics" % self.ops)
        self.assertEqual(code, 200, text)
        self.assertTrue(ctype.startswith("text/plain"), ctype)
        self.assertIn("version=0.0.4", ctype)
        r = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, "promtool check metrics:\n%s%s" % (r.stdout, r.stderr))
        e = Exposition(text)
        self.assertEqual(e.problems, [])
        for name, fam in e.families.items():
            self.assertTrue(fam["help"], "%s has no HELP" % name)
            self.assertIn(fam["type"], ("counter", "gauge", "histogram"), name)
            if fam["type"] == "counter":
                self.assertTrue(name.endswith("_total"), name)
                self.assertTrue(all(v >= 0 for _, _, v in fam["samples"]), name)
            if fam["type"] == "histogram":
                self.assertHistogram(name, fam["samples"])
        return e

    def assertHistogram(self, name, samples):
        groups = {}
        for n, labels, v in samples:
            key = tuple(sorted((k, w) for k, w in labels.items() if k != "le"))
            groups.setdefault(key, {"buckets": [], "sum": None, "count": None})
            g = groups[key]
            if n == name + "_bucket":
                g["buckets"].append((float(labels["le"]), v))
            elif n == name + "_sum":
                g["sum"] = v
            elif n == name + "_count":
                g["count"] = v
        self.assertTrue(groups, "%s has no samples" % name)
        for key, g in groups.items():
            where = "%s%r" % (name, key)
            b = g["buckets"]
            self.assertGreaterEqual(len(b), 2, where)
            self.assertEqual([le for le, _ in b], sorted(le for le, _ in b), "%s: bucket order" % where)
            self.assertTrue(math.isinf(b[-1][0]), "%s: no +Inf bucket" % where)
            self.assertEqual([v for _, v in b], sorted(v for _, v in b), "%s: buckets are not cumulative" % where)
            self.assertEqual(b[-1][1], g["count"], "%s: +Inf bucket vs _count" % where)
            self.assertIsNotNone(g["sum"], "%s: no _sum" % where)
            self.assertGreaterEqual(g["sum"], 0, where)

    def details(self):
        code, ctype, body = curl("http://127.0.0.1:%d/health/ready/details" % self.ops)
        self.assertEqual(code, 200, body)
        return json.loads(body)


class QuotaMetricsTest(MetricsCase):

    def assertAgree(self, m, d, where):
        jd = d["journalDisk"]
        self.assertEqual(m.get("drey_journal_disk_used_bytes"), jd["usedBytes"], where)
        self.assertEqual(m.get("drey_journal_disk_max_bytes"), jd["maxBytes"], where)
        states = {l["state"]: v for l, v in m.series("drey_journal_disk_state")}
        self.assertEqual(states, {s: float(s == jd["state"]) for s in ("normal", "high", "critical")}, where)
        self.assertEqual(m.get("drey_journal_segments"), d["journal"]["segments"], where)
        self.assertEqual(m.get("drey_journal_last_lsn"), d["journal"]["lastLsn"], where)
        self.assertEqual(m.get("drey_journal_failed"), float(d["journal"]["failed"]), where)
        self.assertEqual(m.get("drey_ready"), float(d["ready"]), where)
        self.assertEqual(m.get("drey_memory_used_bytes"), d["memory"]["usedBytes"], where)
        self.assertEqual(m.get("drey_snapshot_last_lsn"), d["snapshot"]["lastLsn"], where)
        dd = d["dataDisk"]
        # the disk is looked at every second: its figures may move between the two reads, its state not here
        self.assertGreater(m.get("drey_snapshot_estimate_bytes"), 0, where)
        self.assertGreater(m.get("drey_data_disk_available_bytes"), 0, where)
        self.assertEqual(dd["journalCap"], "configured", where)
        rooms = {l["state"]: v for l, v in m.series("drey_snapshot_room")}
        self.assertEqual(rooms, {s: float(s == dd["snapshotRoom"]) for s in ("ok", "low", "short", "unknown")}, where)
        # group commit: every record written since the start is in one batch
        self.assertEqual(m.get("drey_journal_batch_records_sum"), d["journal"]["lastLsn"], where)
        self.assertEqual(m.get("drey_journal_fsync_duration_seconds_count"),
                         m.get("drey_journal_batch_records_count"), "%s: one fdatasync per batch" % where)

    def test_journal_disk_metrics_follow_the_details_through_every_state(self):
        self.node("--segment-bytes=%d" % SEGMENT, "--journal-max-bytes=%d" % CAP, "--snapshot-every-bytes=0",
                  "--snapshot-every=0")
        tag = uuid.uuid4().hex[:10]
        cache_name, key_prefix = "MetricsCache-" + tag, "MetricsKey-" + tag
        m, d = self.metrics(), self.details()
        self.assertEqual(d["journalDisk"]["state"], "normal")
        self.assertAgree(m, d, "at start")
        self.assertIsNone(m.get("drey_rejections_total", reason="JOURNAL_DISK_QUOTA"))

        ok = refused = 0
        seen = []
        while refused == 0:
            try:
                self.cache.Set(self.pb.cache.SetRequest(cache=cache_name, key="%s-%d" % (key_prefix, ok),
                                                        value=make_value(b"v" * VALUE)), timeout=WAIT)
                ok += 1
            except grpc.RpcError as e:
                self.assertEqual(RpcFailure(e).reason, "JOURNAL_DISK_QUOTA")
                refused += 1
            m, d = self.metrics(), self.details()
            self.assertAgree(m, d, "after %d writes" % ok)
            if not seen or seen[-1] != d["journalDisk"]["state"]:
                seen.append(d["journalDisk"]["state"])
            self.assertLess(ok, 2 * CAP // VALUE, "no write was refused")
        self.assertEqual(seen, ["normal", "high", "critical"])
        for _ in range(2):  # refused again: counted again
            with self.assertRaises(grpc.RpcError):
                self.cache.Set(self.pb.cache.SetRequest(cache=cache_name, key="%s-x" % key_prefix,
                                                        value=make_value(b"v" * VALUE)), timeout=WAIT)
            refused += 1
        m, d = self.metrics(), self.details()
        self.assertAgree(m, d, "critical")
        self.assertEqual(m.get("drey_rejections_total", stage="journal", reason="JOURNAL_DISK_QUOTA"), refused)
        self.assertEqual(m.get("drey_requests_total", method=SET, code="RESOURCE_EXHAUSTED"), refused)
        self.assertEqual(m.get("drey_requests_total", method=SET, code="OK"), ok)
        self.assertEqual(m.get("drey_request_duration_seconds_count", method=SET), ok + refused)
        self.assertEqual(m.get("drey_store_entries"), ok)
        self.assertEqual(m.get("drey_snapshots_total", result="ok"), 0)

        snap = self.admin.Snapshot(self.pb.admin.SnapshotRequest(), timeout=WAIT)
        m, d = self.metrics(), self.details()
        self.assertEqual(d["journalDisk"]["state"], "normal")
        self.assertAgree(m, d, "after the snapshot")
        self.assertEqual(m.get("drey_snapshots_total", result="ok"), 1)
        self.assertEqual(m.get("drey_snapshots_total", result="failed"), 0)
        self.assertEqual(m.get("drey_compaction_segments_removed_total"), snap.segments_removed)
        self.assertGreater(snap.segments_removed, 0)
        self.assertEqual(m.get("drey_compaction_failed"), 0)
        self.assertEqual(m.get("drey_snapshot_last_lsn"), snap.lsn)
        self.assertEqual(m.get("drey_requests_total", method="/drey.admin.v1.Admin/Snapshot", code="OK"), 1)
        # the refusals stay counted; the names the client sent never show
        self.assertEqual(m.get("drey_rejections_total", stage="journal", reason="JOURNAL_DISK_QUOTA"), refused)
        self.assertNotIn(tag, m.text)


class PrincipalMetricsTest(MetricsCase):

    def test_principal_series_are_a_bounded_top_10(self):
        self.node("--principal-rate=1", "--principal-burst=1")
        channels = []
        self.addCleanup(lambda: [ch.close() for ch in channels])

        def connection():
            # a connection of its own: a token-less caller's principal is its connection
            ch = self.srv.channel(options=[("grpc.use_local_subchannel_pool", 1)])
            channels.append(ch)
            return ServiceClient(ch, self.pb.cache, CACHE_SERVICE)

        heavy, light = [connection() for _ in range(TOP + 2)], [connection() for _ in range(50 - TOP - 2)]
        get = self.pb.cache.GetRequest(key="k")
        heavy_subjects = set()
        for c in heavy:
            refusals = 0
            for _ in range(12):
                try:
                    c.Get(get, timeout=WAIT)
                except grpc.RpcError as e:
                    f = RpcFailure(e)
                    self.assertEqual(f.reason, "PRINCIPAL_RATE_LIMIT", f)
                    subject = f.quota_failure.violations[0].subject
                    self.assertTrue(subject.startswith("principal:conn:"), subject)
                    heavy_subjects.add(subject[len("principal:"):])
                    refusals += 1
            self.assertGreaterEqual(refusals, 5, "the rate limit hardly refused anything")
        self.assertEqual(len(heavy_subjects), len(heavy), "one principal per connection")
        for c in light:
            c.Get(get, timeout=WAIT)  # one call: admitted on its burst, never refused

        m = self.metrics()
        d = self.details()
        self.assertGreaterEqual(d["backpressure"]["trackedPrincipals"], 50)
        self.assertEqual(m.get("drey_tracked_principals"), d["backpressure"]["trackedPrincipals"])
        self.assertEqual(d["backpressure"]["rejectionsByReason"]["PRINCIPAL_RATE_LIMIT"],
                         m.get("drey_rejections_total", stage="backpressure", reason="PRINCIPAL_RATE_LIMIT"))
        for family in ("drey_principal_admitted_total", "drey_principal_rejected_total"):
            with self.subTest(family):
                series = m.series(family)
                # the busiest TOP (--metrics-principals) and one "other" row for the rest
                self.assertEqual(len(series), TOP + 1, "%s: %d series for 50 principals" % (family, len(series)))
                names = [l["principal"] for l, _ in series]
                self.assertIn("other", names)
                names.remove("other")
                self.assertEqual(len(set(names)), TOP)
                self.assertLessEqual(set(names), heavy_subjects, "not the busiest principals")
        for l, v in m.series("drey_principal_rejected_total"):
            if l["principal"] != "other":
                self.assertGreaterEqual(v, 5, l)
        for l, v in m.series("drey_principal_admitted_total"):
            self.assertGreaterEqual(v, 1, l)
        other = dict((l["principal"], v) for l, v in m.series("drey_principal_admitted_total"))["other"]
        self.assertGreaterEqual(other, len(light), "every light principal's call is in the other row")


if __name__ == "__main__":
    main()
