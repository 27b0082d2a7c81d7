"""What each copy of a partition holds and takes, on three nodes with
replication factor 2 (drey_replication's Scenario): a backup's room refusing
writes up front, --min-in-sync, the backup's own rules for records (only
from its primary, in sequence, of a current epoch), stale reads from a
backup, idle backups dropped or kept, evictions chosen within a partition,
whole-cache figures counting each partition once, and Clear ordered with
each partition's writes on every copy.
"""
import json
import shutil
import tempfile
import threading
import time

import grpc

from drey_cluster import Cluster, metric, partition, peer_channel, wait_until
from drey_harness import DreyTestCase, RpcFailure, ServiceClient, main, make_value, storage_tool, value_of
from drey_replication import PARTS, Scenario, details
from drey_tokens import http_get, ops_port, poll


class BackupRoom(DreyTestCase):
    SERVER_FLAGS = None

    def fill_backup(self, s, backup, reason, limit):
        """64 KiB Sets to partitions the backup holds, through their
        primaries, until one is refused for lack of room with `reason`
        (naming the backup: its primary's check of its room, or its own
        quota when it leads the partition again by then); every refusal is
        definitive (the key is nowhere). Returns (written, refused keys
        with the refusal's `backup`)."""
        n1 = s.cl.nodes["n1"]
        written, refused = 0, []
        while not refused:
            self.assertLess(written, limit, "%s's room never refused a write" % backup)
            backed = [(p, e[0]) for p, e in s.table(n1).items() if backup in e[1]]
            if not backed:
                break  # dropped everywhere: its room was not known in time
            p, primary = backed[written % len(backed)]
            set_, sreq, _ = s.cl.nodes[primary].cache.methods["Set"]
            key = s.key_in(p, "fill%d" % written)
            try:
                set_(sreq(key=key, value=make_value(b"f" * 65536)), timeout=10)
                written += 1
            except grpc.RpcError as e:
                f = RpcFailure(e)
                self.assertRpcFailure(f, grpc.StatusCode.RESOURCE_EXHAUSTED, reason)
                self.assertEqual(f.quota_failure.violations[0].subject, "node:" + backup)
                refused.append((key, f.metadata.get("backup")))
        get, greq, _ = s.cl.nodes["n2"].cache.methods["Get"]
        for key, _ in refused:
            self.assertFalse(get(greq(key=key), timeout=5).found, "a refused write was applied")
        return written, refused

    def test_a_backup_without_journal_room_refuses_writes_up_front(self):
        """A backup's journal quota counts before anything is journaled: its
        primary refuses a write that would not fit on it (JOURNAL_DISK_QUOTA
        naming the backup, nothing written anywhere); a backup whose quota
        refuses a record anyway (its room was not known yet) is dropped,
        never waited for."""
        with Scenario(self, extra_flags=("--segment-bytes=256KiB",)) as s:
            used = details(s.cl.nodes["n3"], "journalDisk")["usedBytes"]
            flags = list(s.cl.launched["n3"][0]) + ["--journal-max-bytes=%d" % (int(used) + 4 * 1024 * 1024),
                                                    "--snapshot-every=0", "--snapshot-every-bytes=0"]
            s.cl.restart("n3", flags=flags)
            wait_until(lambda: any("n3" in r for _, r in s.table(s.cl.nodes["n1"]).values()), timeout=30,
                       what="n3 to be a backup again (by a fresh copy)")
            shrinks = lambda: sum(details(n)["inSyncShrinks"] for n in (s.cl.nodes["n1"], s.cl.nodes["n2"]))
            before = shrinks()
            written, refused = self.fill_backup(s, "n3", "JOURNAL_DISK_QUOTA", 400)
            print("%d writes fitted; refused: %d (%d by a primary for its backup); backups dropped: %d"
                  % (written, len(refused), sum(1 for _, b in refused if b == "n3"), shrinks() - before))
            self.assertTrue(refused or shrinks() > before)
            s.cl.restart("n3", flags=list(s.cl.launched["n3"][0])[:-3])  # room again
            s.stop_and_check()

    def test_a_backup_without_memory_room_refuses_writes_up_front(self):
        """The same for memory: a write that would take a backup past its
        critical level is refused by the primary, MEMORY_PRESSURE naming the
        backup, and written nowhere."""
        with Scenario(self, durable=False) as s:
            s.stop_workloads()
            used = details(s.cl.nodes["n3"], "memory")["usedBytes"]
            limit = int(used) + (2 << 20)
            s.cl.restart("n3", flags=list(s.cl.launched["n3"][0]) + ["--memory-limit=%d" % limit])
            s.settle()  # n3 is a backup again: an ephemeral node comes back empty, by fresh copies
            written, refused = self.fill_backup(s, "n3", "MEMORY_PRESSURE", 200)
            print("%d writes fitted; refused: %d (%d by a primary for its backup)"
                  % (written, len(refused), sum(1 for _, b in refused if b == "n3")))
            self.assertTrue(refused)
            s.assert_replicas_equal()


class MinInSync(DreyTestCase):
    SERVER_FLAGS = None

    def test_writes_are_refused_when_a_partition_would_have_one_copy(self):
        # two nodes: nobody can replace the lost copy
        with Scenario(self, ids=("n1", "n3"), started=2, durable=False, extra_flags=("--min-in-sync=2",)) as s:
            n1 = s.cl.nodes["n1"]
            s.stop_workloads()
            p = next(p for p, (primary, r) in s.table(n1).items() if primary == "n1" and r == ("n3",))
            key = s.key_in(p, "mis")
            set_, sreq, _ = n1.cache.methods["Set"]
            set_(sreq(key=key, value=make_value("both")), timeout=5)
            s.cl.kill("n3")
            wait_until(lambda: "n3" not in s.table(n1)[p][1], timeout=30, what="n3 out of the set")

            def refused():
                try:
                    set_(sreq(key=key, value=make_value("alone")), timeout=5)
                    return False
                except grpc.RpcError as e:
                    f = RpcFailure(e)
                    if f.reason == "NOT_ENOUGH_REPLICAS" and f.metadata.get("outcome") != "unknown":
                        self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE)
                        self.assertEqual(f.metadata["minInSync"], "2")
                        return True
                    return False

            refused_seen = False
            deadline = time.time() + 20
            while time.time() < deadline and not refused_seen:
                refused_seen = refused()
            self.assertTrue(refused_seen, "a write to a partition with one copy was not refused")
            get, greq, _ = n1.cache.methods["Get"]
            self.assertIn(value_of(get(greq(key=key), timeout=5).value), ("both", "alone"))


class BackupSide(DreyTestCase):
    SERVER_FLAGS = None

    def test_a_backup_takes_records_only_from_its_primary_in_sequence(self):
        with Scenario(self, durable=False) as s:
            s.stop_workloads()
            s.settle()
            n1 = s.cl.nodes["n1"]
            table = s.table(n1)
            p, (primary, (backup,)) = next(iter(table.items()))
            b = s.cl.nodes[backup]
            epoch = next(x.epoch for x in s.cl.topology(n1).partitions if x.id == p)
            before = s.hashes(b, [p])
            mv = s.cl.pb.move
            jr = s.cl.pb.journal.JournalRecord(method="drey.cache.v1.Cache/Set",
                                               request=s.cl.pb.cache.SetRequest(
                                                   key=s.key_in(p, "inj"),
                                                   value=make_value("injected")).SerializeToString(),
                                               first_version=1 << 40)
            with peer_channel(s.cl, b, "n9") as ch:
                apply, req, _ = ServiceClient(ch, mv, "drey.internal.v1.Replica").methods["Apply"]
                md = [("drey-forwarded-by", "n9")]

                def refused(reason, **fields):
                    with self.assertRaises(grpc.RpcError) as e:
                        apply(req(partition=p, partitions=PARTS, record=jr.SerializeToString(), time_ms=1, **fields),
                              timeout=5, metadata=md)
                    self.assertEqual(RpcFailure(e.exception).reason, reason)

                refused("STALE_EPOCH", epoch=epoch - 1, sequence=1)
                refused("NOT_REPLICA", epoch=epoch, sequence=1)  # n9 is not its primary
                with self.assertRaises(grpc.RpcError) as e:
                    apply(req(partition=p, partitions=PARTS, record=jr.SerializeToString(), time_ms=1,
                              epoch=epoch + 1000, sequence=1 << 30), timeout=5, metadata=md)
                f = RpcFailure(e.exception)
                self.assertEqual(f.reason, "OUT_OF_SEQUENCE")
                self.assertEqual(s.hashes(b, [p]), before, "a refused record changed the backup")
                # A peer naming a newer epoch is believed (it would be a new
                # primary): this one takes the backup's next sequence number
                # from its real primary, whose next record is then refused.
                apply(req(partition=p, partitions=PARTS, record=jr.SerializeToString(), time_ms=1,
                          epoch=epoch + 1000, sequence=int(f.metadata["expected"])), timeout=5, metadata=md)
            self.assertNotEqual(s.hashes(b, [p]), before)
            prim = s.cl.nodes[primary]
            shrinks = details(prim)["inSyncShrinks"]
            set_, sreq, _ = prim.cache.methods["Set"]
            r = set_(sreq(key=s.key_in(p, "after"), value=make_value("after")), timeout=10)
            self.assertGreater(r.version, 0)  # the write went on without the refusing backup
            wait_until(lambda: details(prim)["inSyncShrinks"] > shrinks, timeout=10,
                       what="the primary to drop the backup that refused its record")
            s.settle()  # a fresh copy replaces the backup's diverged one
            s.assert_replicas_equal()


    def test_a_backup_journals_each_record_as_its_primary_wrote_it(self):
        """Two durable nodes, factor 2: every write is journaled on its
        backup as the client's own write (its method and request_id, the
        primary's bytes) marked a copy, never wrapped in the Apply request
        that carried it (`dreyd storage dump` on both data directories); a
        record the backup could not replay is refused MALFORMED_REQUEST and
        leaves nothing in its journal."""
        flags = ("--fsync=always", "--snapshot-every=0", "--snapshot-every-bytes=0")
        with Cluster(partitions=PARTS, initial_nodes=2, ephemeral=False, replication_factor=2,
                     extra_flags=flags) as cl:
            dirs = {i: tempfile.mkdtemp(prefix="drey-copyjournal-%s-" % i) for i in ("n1", "n2")}
            for d in dirs.values():
                self.addCleanup(shutil.rmtree, d, True)
            nodes = {i: cl.start_node(i, data_dir=dirs[i]) for i in dirs}
            entries = lambda: {p.id: (p.primary, tuple(p.replicas)) for p in cl.topology(nodes["n1"]).partitions}
            table = poll(entries, lambda t: all(pr and len(r) == 1 for pr, r in t.values()), timeout=60,
                         what="every partition led and backed")
            set_, sreq, _ = nodes["n1"].cache.methods["Set"]
            written = {}
            for i in range(40):
                key, rid = "k-%d" % i, "w-%d" % i
                set_(sreq(key=key, value=make_value("v%d" % i), request_id=rid), timeout=10)
                written[rid] = table[partition("", key, PARTS)]

            # A record taken in sequence that the backup could not replay.
            p, (primary, (backup,)) = next(iter(table.items()))
            epoch = next(x.epoch for x in cl.topology(nodes["n1"]).partitions if x.id == p)
            with peer_channel(cl, nodes[backup], "n9") as ch:
                apply, req, _ = ServiceClient(ch, cl.pb.move, "drey.internal.v1.Replica").methods["Apply"]
                md = [("drey-forwarded-by", "n9")]
                with self.assertRaises(grpc.RpcError) as e:
                    apply(req(partition=p, partitions=PARTS, record=b"\xff\xff\xff", time_ms=1,
                              epoch=epoch + 1000, sequence=1 << 30), timeout=5, metadata=md)
                expected = int(RpcFailure(e.exception).metadata["expected"])
                with self.assertRaises(grpc.RpcError) as e:
                    apply(req(partition=p, partitions=PARTS, record=b"\xff\xff\xff", time_ms=1,
                              epoch=epoch + 1000, sequence=expected), timeout=5, metadata=md)
                self.assertEqual(RpcFailure(e.exception).reason, "MALFORMED_REQUEST")
            for n in nodes.values():
                n.server.stop()

            journals = {}
            for i, d in dirs.items():
                dump = storage_tool("dump", d)
                self.assertEqual(dump.returncode, 0, dump.stderr)
                journals[i] = [r for r in map(json.loads, dump.stdout.splitlines()) if "lsn" in r]
                self.assertNotIn("drey.internal.v1.Replica/Apply", [r["method"] for r in journals[i]])
            for rid, (primary, (backup,)) in written.items():
                mine = lambda i: [r for r in journals[i] if r["request_id"] == rid]
                self.assertEqual([(r["method"], r.get("copy", False)) for r in mine(primary)],
                                 [("drey.cache.v1.Cache/Set", False)], rid)
                self.assertEqual([(r["method"], r.get("copy", False)) for r in mine(backup)],
                                 [("drey.cache.v1.Cache/Set", True)], rid)
                self.assertEqual(mine(backup)[0]["request_bytes"], mine(primary)[0]["request_bytes"])
            copies = sum(1 for r in journals[backup] if r.get("copy"))
            self.assertEqual(copies, sum(1 for _, (_, (b,)) in written.items() if b == backup),
                             "the refused record was journaled")


class StaleReads(DreyTestCase):
    """allow_stale on Get and GetMany: a node that holds an in-sync backup
    copy of the key's partition answers from it, saying how stale it may be
    (from_backup, lag_ms); the claim is checked against the acknowledged
    writes: every write acknowledged more than lag_ms before the read was
    sent is visible in its answer."""
    SERVER_FLAGS = None
    # The lag is measured on the backup from when it received its primary's
    # last word; a heartbeat in flight when the backup was cut off makes it
    # understate by that message's transit.
    TRANSIT_S = 0.1

    def roles(self, s, p):
        primary, (backup,) = s.table(s.cl.nodes["n1"])[p]
        other = next(i for i in s.cl.ids if i not in (primary, backup))
        return s.cl.nodes[primary], s.cl.nodes[backup], s.cl.nodes[other]

    def quiet_roles(self, s, p, prefix):
        """The workloads stopped and the table settled: a key of p, and
        p's primary, its backup and the node with no copy."""
        s.stop_workloads()
        s.settle()
        return (s.key_in(p, prefix),) + self.roles(s, p)

    def stale_get(self, node, key):
        get, greq, _ = node.cache.methods["Get"]
        return get(greq(key=key, allow_stale=True), timeout=10)

    def check_bound(self, acked, sent_at, resp, what):
        """acked: [(version, monotonic time the client saw the ack)]."""
        if not resp.from_backup:
            return
        bound = sent_at - resp.lag_ms / 1000.0 - self.TRANSIT_S
        must = [v for v, at in acked if at < bound]
        if must:
            self.assertGreaterEqual(resp.version, max(must),
                                    "%s: a backup with lag %d ms missed a write acknowledged before that"
                                    % (what, resp.lag_ms))

    def test_a_backup_answers_stale_reads_and_says_how_stale(self):
        with Scenario(self, durable=False) as s:
            p = 3
            key, primary, backup, other = self.quiet_roles(s, p, "stale")
            set_, sreq, _ = primary.cache.methods["Set"]
            # An in-sync backup has every acknowledged write: read right
            # after each acknowledgement, it returns it.
            acked = []
            for i in range(30):
                r = set_(sreq(key=key, value=make_value("v%d" % i)), timeout=10)
                acked.append((r.version, time.monotonic()))
                got = self.stale_get(backup, key)
                self.assertTrue(got.from_backup)
                self.assertEqual((value_of(got.value), got.version), ("v%d" % i, r.version))
            # The primary answers itself; a node with no copy asks the primary.
            for n in (primary, other):
                got = self.stale_get(n, key)
                self.assertFalse(got.from_backup)
                self.assertEqual(got.version, acked[-1][0])
            # Idle, heartbeats keep the backup's lag small (no write needed).
            wait_until(lambda: self.stale_get(backup, key).lag_ms < 1000, timeout=30,
                       what="the idle backup to know it is current")
            mine = [x for x in details(backup)["replicas"] if x["partition"] == p]
            self.assertEqual(mine[0]["role"], "backup")
            theirs = [x for x in details(primary)["replicas"] if x["partition"] == p]
            self.assertEqual((theirs[0]["role"], theirs[0]["inSync"]), ("primary", [backup.id]))
            self.assertEqual(int(theirs[0]["sequence"]), int(mine[0]["sequence"]))
            _, _, body = http_get("127.0.0.1", ops_port(backup.server), "/metrics")
            self.assertIn('drey_cluster_replication_lag_seconds{role="backup"}', body.decode())
            wait_until(lambda: metric(backup, "drey_cluster_replication_lag_seconds", 'role="backup"') < 1,
                       timeout=30, what="the backup's worst lag under a second while idle")
            # drey cluster status asks every member for its view
            st = s.cl.status()
            self.assertEqual(st["unanswered"], [])
            row = st["table"][p]
            self.assertEqual((row["primary"], row["inSync"], row["pending"]), (primary.id, [backup.id], 0))
            # idle: a lag under a second is heartbeat noise, not shown
            self.assertTrue("lagMs" not in row or row["lagMs"] >= 1000, row)
            # a member that does not answer (paused for less than its lease)
            s.cl.pause(other.id)
            try:
                st = s.cl.status()
            finally:
                s.cl.resume(other.id)
            self.assertEqual(st["unanswered"], [other.id])
            self.assertTrue(all(r["lagMs"] is None for r in st["table"] if other.id in r["inSync"]))
            # GetMany across partitions: the backup's keys from its copy,
            # the others from their primaries, in the caller's order.
            keys = [s.key_in(q, "many") for q in range(PARTS)]
            for k in keys:
                set_any = s.cl.nodes["n1"].cache.methods["Set"]
                set_any[0](set_any[1](key=k, value=make_value(k)), timeout=10)
            gm, gmreq, _ = backup.cache.methods["GetMany"]
            got = gm(gmreq(keys=keys, allow_stale=True), timeout=10)
            self.assertEqual([value_of(r.value) for r in got.results], keys)
            self.assertTrue(got.from_backup)
            self.assertFalse(gm(gmreq(keys=keys), timeout=10).from_backup)

            # Cut the primary's link to its backup (records, heartbeats; the
            # backup can still call the primary): the backup goes on
            # answering, stale, with a lag that says so; once its table
            # drops it, it asks the primary instead.
            s.cl.cut(primary.id, backup.id, mode="blackhole")
            for i in range(5):
                r = set_(sreq(key=key, value=make_value("cut%d" % i)), timeout=15)
                acked.append((r.version, time.monotonic()))
            seen_stale = False
            deadline = time.time() + 30
            while time.time() < deadline:
                sent = time.monotonic()
                got = self.stale_get(backup, key)
                self.check_bound(acked, sent, got, "cut")
                seen_stale |= got.from_backup and got.version < acked[-1][0]
                if not got.from_backup:
                    break
            self.assertFalse(got.from_backup, "the dropped backup kept answering from its copy")
            self.assertEqual(got.version, acked[-1][0])
            print("the cut backup answered stale before its table dropped it: %s" % seen_stale)
            s.cl.heal()
            s.settle()
            s.assert_replicas_equal()

    def test_stale_reads_go_on_while_a_primary_is_gone(self):
        with Scenario(self, durable=False) as s:
            p = 5
            key, primary, backup, other = self.quiet_roles(s, p, "gone")
            # a key of a partition the killed node has no copy of
            q = next(q for q, (pr, bs) in s.table(other).items() if primary.id not in [pr] + list(bs))
            elsewhere = s.key_in(q, "elsewhere")
            set_, sreq, _ = primary.cache.methods["Set"]
            last = set_(sreq(key=key, value=make_value("last")), timeout=10)
            set_any, sreq_any, _ = other.cache.methods["Set"]
            set_any(sreq_any(key=elsewhere, value=make_value("there")), timeout=10)
            acked = [(last.version, time.monotonic())]
            gm, gmreq, _ = other.cache.methods["GetMany"]
            s.cl.kill(primary.id)
            killed = time.monotonic()
            # Until a new primary takes the partition, the backup answers,
            # through itself or through a node with no copy (whose table
            # still names the dead primary: its forward there fails, and a
            # stale read asks the backup instead), with a lag that grows
            # from the primary's last word. A GetMany answers every key.
            # Until the backup answers as the new primary (the node with no
            # copy may by then be the partition's new backup, answering
            # from its own copy).
            answers = []
            while not answers or answers[-2].from_backup:
                for n in (backup, other):
                    sent = time.monotonic()
                    got = self.stale_get(n, key)
                    self.assertEqual((value_of(got.value), got.version), ("last", last.version))
                    self.check_bound(acked, sent, got, "primary gone")
                    answers.append(got)
                many = gm(gmreq(keys=[elsewhere, key], allow_stale=True), timeout=10)
                self.assertEqual([value_of(r.value) for r in many.results], ["there", "last"])
                if time.monotonic() - killed > 60:
                    self.fail("no failover: %s routes %s, %s routes %s, the controller %s" % (
                        backup.id, s.table(backup)[p], other.id, s.table(other)[p],
                        s.cl.status().get("controller")))
            lags = [a.lag_ms for a in answers if a.from_backup]
            self.assertTrue(lags, "no stale answer while the primary was gone")
            print("stale answers while the primary was gone: %d, lag %d..%d ms" % (len(lags), min(lags), max(lags)))
            # promoted: the backup now answers as the primary
            wait_until(lambda: s.table(backup)[p][0] == backup.id, timeout=30, what="the backup promoted")
            self.assertFalse(self.stale_get(backup, key).from_backup)

    def test_a_read_whose_primary_is_unreachable_is_refused_typed(self):
        """Without allow_stale, a read forwarded to a primary that cannot be
        reached (killed, its lease not out yet) is refused UNAVAILABLE
        PARTITION_UNAVAILABLE with the cause, the primary, outcome
        not_applied and RetryInfo, counted in the metric; a GetMany too."""
        with Scenario(self, durable=False) as s:
            p = 6
            key, primary, backup, other = self.quiet_roles(s, p, "unreachable")
            get, greq, _ = other.cache.methods["Get"]
            gm, gmreq, _ = other.cache.methods["GetMany"]
            before = metric(other, "drey_cluster_unavailable_total")
            # killed: its lease (2 s) runs on, so the table names it a while
            s.cl.kill(primary.id)
            refusals = []
            deadline = time.monotonic() + 30
            while len(refusals) < 2 and time.monotonic() < deadline:
                for call in (lambda: get(greq(key=key), timeout=10),
                             lambda: gm(gmreq(keys=[key]), timeout=10)):
                    try:
                        call()
                    except grpc.RpcError as e:
                        refusals.append(RpcFailure(e))
                if s.table(other)[p][0] != primary.id:
                    break  # failed over before a call met the dead primary
            for f in refusals:
                self.assertEqual(f.code, grpc.StatusCode.UNAVAILABLE, f.message)
                self.assertEqual(f.reason, "PARTITION_UNAVAILABLE", f.message)
                md = f.metadata
                self.assertIn(md["cause"], ("OWNER_UNREACHABLE", "LEASE_EXPIRED", "FAILOVER_IN_PROGRESS"), md)
                self.assertEqual((md["partition"], md["outcome"]), (str(p), "not_applied"), md)
                self.assertIsNotNone(f.retry_info, md)
            self.assertTrue(refusals, "no read met the dead primary")
            self.assertGreater(metric(other, "drey_cluster_unavailable_total"), before)


class Heartbeats(DreyTestCase):
    """A primary hears its backups while no write goes: their room (so an
    idle backup without room keeps refusing writes up front instead of
    being probed and dropped) and their silence (a backup it cannot reach
    is dropped before a write has to wait for it)."""
    SERVER_FLAGS = None

    def test_an_unreachable_idle_backup_is_dropped_without_a_write(self):
        with Scenario(self, durable=False) as s:
            s.stop_workloads()
            s.settle()
            n1 = s.cl.nodes["n1"]
            backed = lambda: [p for p, (_, r) in s.table(n1).items() if "n3" in r]
            self.assertTrue(backed())
            writes = sum(details(n)["replicatedRecords"] for n in s.running())
            s.cl.isolate_from_peers("n3", mode="blackhole")  # its lease stays alive
            wait_until(lambda: not backed(), timeout=30, what="n3 out of every in-sync set")
            self.assertEqual(sum(details(n)["replicatedRecords"] for n in s.running()), writes,
                             "a write was replicated meanwhile")
            self.assertTrue(any(details(s.cl.nodes[i])["inSyncShrinks"] > 0 for i in ("n1", "n2")))
            s.cl.heal()
            s.settle()

    def test_an_idle_backup_without_room_keeps_refusing(self):
        # the scenario's cluster, without its workloads: only n3 has a quota
        s = Scenario(self, ids=("n1", "n3"), started=2, extra_flags=("--segment-bytes=256KiB",))
        with s.cl:
            n1 = s.cl.launch("n1")
            s.cl.launch("n3", flags=("--journal-max-bytes=6MiB", "--snapshot-every=0", "--snapshot-every-bytes=0"))
            s.settle()
            led = [p for p, (primary, r) in s.table(n1).items() if primary == "n1" and r == ("n3",)]
            self.assertTrue(led)
            set_, sreq, _ = n1.cache.methods["Set"]
            big = make_value(b"f" * 65536)

            def refused_for_n3(key):
                try:
                    set_(sreq(key=key, value=big), timeout=10)
                    return False
                except grpc.RpcError as e:
                    f = RpcFailure(e)
                    self.assertRpcFailure(f, grpc.StatusCode.RESOURCE_EXHAUSTED, "JOURNAL_DISK_QUOTA")
                    self.assertEqual(f.quota_failure.violations[0].subject, "node:n3")
                    return True

            written = 0
            while not refused_for_n3(s.key_in(led[written % len(led)], "fill%d" % written)):
                written += 1
                self.assertLess(written, 200, "n3's quota never refused")
            shrinks = details(n1)["inSyncShrinks"]
            # Idle for longer than a room report stays fresh without being
            # heard again: heartbeats keep it fresh, so the write is never
            # sent to n3 as a probe (which n3 would refuse, and be dropped).
            until = time.monotonic() + 3
            tries = 0
            while time.monotonic() < until:
                self.assertTrue(refused_for_n3(s.key_in(led[0], "idle%d" % tries)))
                tries += 1
                time.sleep(0.3)  # spacing the attempts, not waiting for anything
            self.assertEqual(details(n1)["inSyncShrinks"], shrinks, "n3 was dropped")
            self.assertTrue(all(r == ("n3",) for p, (pr, r) in s.table(n1).items() if p in led))


class EvictionWithReplicas(DreyTestCase):
    """--eviction with backups: a write's victims ride in its record and
    every copy of its partition evicts them, so they are chosen only among
    that partition's entries (another partition's copies live elsewhere and
    would differ), and enough of them for the copy with the least room."""
    SERVER_FLAGS = None
    LIMIT = 1 << 20
    VALUE = b"e" * 16384

    def test_evictions_stay_in_the_partition_and_fit_every_copy(self):
        with Scenario(self, durable=False,
                      extra_flags=("--eviction=allkeys-lru", "--memory-limit=%d" % self.LIMIT)) as s:
            s.stop_workloads()
            s.settle()
            table = s.table(s.cl.nodes["n1"])
            # p led by x and backed by y; r led by y, backed by the third node
            p, x, y, r = next((p, pr, b, r) for p, (pr, (b,)) in table.items() for r, (rpr, (rb,)) in table.items()
                              if rpr == b and rb not in (pr, b))
            nodes = s.cl.nodes

            def put(node, key):
                set_, sreq, _ = nodes[node].cache.methods["Set"]
                return set_(sreq(key=key, value=make_value(self.VALUE)), timeout=10)

            # the oldest entries anywhere: one per other partition
            sentinels = [s.key_in(q, "sentinel") for q in range(PARTS) if q not in (p, r)]
            for k in sentinels:
                put("n1", k)
            # y's memory half full of r (its own partition)
            r_keys = [s.key_in(r, "r%d" % i) for i in range(200)][:int(self.LIMIT * 0.45) // len(self.VALUE)]
            for k in r_keys:
                put(y, k)
            # three times x's memory into p: each write evicts p's oldest,
            # enough for y, which has the less room
            p_keys = []
            for i in range(3 * self.LIMIT // len(self.VALUE)):
                k = s.key_in(p, "p%d" % i)
                put(x, k)
                p_keys.append(k)
            gm, gmreq, _ = nodes["n1"].cache.methods["GetMany"]
            live = lambda keys: {e.key for e in gm(gmreq(keys=keys), timeout=10).results if e.found}
            self.assertEqual(live(sentinels), set(sentinels), "a write evicted another partition's entry")
            self.assertEqual(live(r_keys), set(r_keys), "a write to p evicted r's entries")
            kept = live(p_keys)
            self.assertLess(len(kept), len(p_keys), "nothing was evicted")
            self.assertIn(p_keys[-1], kept)
            self.assertGreater(details(nodes[x], "eviction")["evictedEntries"], 0)
            self.assertEqual(details(nodes[y], "eviction")["refusedWrites"], 0)
            # the cache's figures count each partition once: every copy
            # evicted p's victims, the primary's count is the cache's
            stats, sreq, _ = nodes["n1"].cache.methods["GetCacheStats"]
            figures = stats(sreq(cache=""), timeout=10)
            self.assertEqual(figures.entries, len(sentinels) + len(r_keys) + len(kept))
            self.assertEqual(figures.evictions, len(p_keys) - len(kept))
            s.assert_replicas_equal()


class ClearOnCopies(DreyTestCase):
    """Clear on a cluster is one write per partition, ordered with that
    partition's other writes and replicated like them: a write racing a
    Clear survives on every copy or on none. And the whole cache's figures
    count each partition once however many copies it has."""
    SERVER_FLAGS = None
    CACHE = "clr"

    def clear(self, node):
        """A Clear through node, retried while partitions move or a part
        could not finish (CLEAR_INCOMPLETE says so)."""
        clear, req, _ = node.cache.methods["Clear"]
        deadline = time.time() + 30
        while True:
            try:
                return clear(req(cache=self.CACHE), timeout=10)
            except grpc.RpcError as e:
                f = RpcFailure(e)
                self.assertIn(f.reason, ("CLEAR_INCOMPLETE", "PARTITION_MOVING", "NOT_PRIMARY"), f)
                self.assertEqual(e.code(), grpc.StatusCode.UNAVAILABLE)
                if time.time() > deadline:
                    raise
                time.sleep(0.05)

    def test_a_clear_racing_writes_leaves_every_copy_alike_and_figures_count_once(self):
        with Scenario(self, durable=True) as s:
            s.progress()
            s.stop_workloads()
            nodes = s.running()
            # figures before any Clear: each key once, though every
            # partition has two copies
            put = [n.cache.methods["Set"] for n in nodes]
            for i in range(200):
                fn, req, _ = put[i % len(put)]
                fn(req(cache=self.CACHE, key="fig-%d" % i, value=make_value(b"v")), timeout=10)
            for n in nodes:
                stats, sreq, _ = n.cache.methods["GetCacheStats"]
                self.assertEqual(stats(sreq(cache=self.CACHE), timeout=10).entries, 200, n.id)
                lc, lreq, _ = n.cache.methods["ListCaches"]
                listed = {c.cache: c.entries for c in lc(lreq(), timeout=10).caches}
                self.assertEqual(listed.get(self.CACHE), 200, n.id)
            # writers on every node while Clears go through each node
            stop = threading.Event()
            acked = []

            def writer(t):
                fn, req, _ = put[t % len(put)]
                i = 0
                while not stop.is_set():
                    try:
                        fn(req(cache=self.CACHE, key="w%d-%d" % (t, i % 300), value=make_value(b"%d" % i)),
                           timeout=5)
                        acked.append(1)
                    except grpc.RpcError:
                        pass
                    i += 1

            threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)]
            for t in threads:
                t.start()
            try:
                wait_until(lambda: len(acked) > 100, timeout=30, what="writes before the Clears")
                for round_ in range(6):
                    self.clear(nodes[round_ % len(nodes)])
                    mark = len(acked)
                    wait_until(lambda: len(acked) > mark + 20, timeout=30, what="writes between Clears")
            finally:
                stop.set()
                for t in threads:
                    t.join()
            s.settle()
            s.assert_replicas_equal()
            # and a Clear with nothing racing it empties the cache everywhere
            self.clear(nodes[0])
            for n in nodes:
                stats, sreq, _ = n.cache.methods["GetCacheStats"]
                self.assertEqual(stats(sreq(cache=self.CACHE), timeout=10).entries, 0, n.id)
            s.assert_replicas_equal()


if __name__ == "__main__":
    main()
