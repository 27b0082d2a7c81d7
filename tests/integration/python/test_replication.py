"""Replication factor 2 on three nodes, proven under kills, pauses, cut links,
a split, a skewed clock, a full journal on a backup, a join and a drain, each
while clients write.

Every scenario runs three workloads through random nodes (retrying a failed
attempt through another with the same request_id): compare-and-set
registers, Adds of unique keys, counters. After healing, the cluster must
settle (every partition with a primary and an in-sync backup again, nothing
waiting), and then:
- the register history passes check_register (every read returns what some
  write produced, real-time order holds, no two successful CAS from one
  version), every acknowledged Add is present, every counter lies between
  its acknowledged and attempted increments;
- every live node routes with the same table, one primary per partition;
- each partition's primary and backup hold the same entries, versions and
  expiries (drey.internal.v1.Replica/Hash, like etcd's HashKV);
- every revision of every partition's entry in etcd is a legal edit of
  the one before (check_table_history).

The backup's side is tested through the internal listener too: it takes
records only from its primary, in sequence, of an epoch no older than its
own, and a refused record changes nothing.
"""
import signal
import time

import grpc

from drey_checkers import Client, CounterWorkload, RegisterWorkload, SetWorkload, check_table_history, \
    read_table_history
from drey_cluster import metric, partition, peer_channel, wait_until
from drey_harness import DreyTestCase, RpcFailure, ServiceClient, main, make_value, value_of
from drey_nemesis import NemesisCluster
from drey_tokens import details as readiness

PARTS = 16
LEASE_TTL_S = 2


def details(node, part="cluster"):
    return readiness(node.server)[part]


class Scenario:
    """A three-node cluster with factor 2 (or the nodes and factor given)
    and the three workloads."""

    def __init__(self, test, ids=("n1", "n2", "n3"), durable=True, extra_flags=(), started=3, replication_factor=2):
        self.test = test
        self.rf = replication_factor
        self.cl = NemesisCluster(ids=ids, partitions=PARTS, durable=durable, replication_factor=replication_factor,
                                 lease_ttl="%ds" % LEASE_TTL_S,
                                 extra_flags=("--fsync=always",) + tuple(extra_flags) if durable
                                 else tuple(extra_flags))
        self.cl.initial_nodes = started
        self.started = started
        self.workloads = []

    def __enter__(self):
        self.cl.__enter__()
        try:
            self.cl.start(self.started)
            self.settle()
            client = Client(self.cl.live, rpc_timeout=3, attempts=60, backoff=0.05)
            self.workloads = [RegisterWorkload(client, threads=2), SetWorkload(client, threads=2, name="set"),
                              CounterWorkload(client, threads=2)]
            for w in self.workloads:
                w.start()
        except BaseException:
            self.cl.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        for w in self.workloads:
            w.stop_flag.set()
        self.cl.__exit__(*exc)

    def progress(self, ops=30, timeout=60):
        """Until the workloads have completed `ops` more operations (whatever
        their outcome): a nemesis is held while clients write for a count
        of operations, not for a time."""
        done = lambda: sum(len(w.history.ops) - w.count(None) for w in self.workloads)
        start = done()
        wait_until(lambda: done() >= start + ops, timeout=timeout, what="%d more operations" % ops)

    def running(self):
        return self.cl.live()

    def table(self, node, joining=False):
        """partition -> (primary, replicas[, joining]) as node routes."""
        t = self.cl.topology(node)
        if joining:
            return {p.id: (p.primary, tuple(sorted(p.replicas)), tuple(sorted(p.joining))) for p in t.partitions}
        return {p.id: (p.primary, tuple(sorted(p.replicas))) for p in t.partitions}

    def led_by(self, node_id, via):
        return [p for p, (primary, _) in self.table(via).items() if primary == node_id]

    def key_in(self, p, prefix="probe"):
        return next(k for k in ("%s-%d" % (prefix, i) for i in range(100000)) if partition("", k, PARTS) == p)

    def settle(self, timeout=60):
        """Until every running node has the same complete table with the
        factor's backups for every partition (as many as the running nodes
        allow), no copy under way, and nothing waits for a backup."""
        nodes = self.running()
        started = time.time()
        backups = min(self.rf, len(nodes)) - 1

        def sample():
            tables = [self.table(n, joining=True) for n in nodes]
            if any(t != tables[0] for t in tables):
                return None
            ids = {n.id for n in nodes}
            for primary, replicas, joining in tables[0].values():
                if primary not in ids or len(replicas) != backups or primary in replicas or \
                        not set(replicas) <= ids:
                    return None
                if joining:
                    return None
            if not all(details(n)["underReplicatedPartitions"] == 0 and details(n)["replicationPending"] == 0
                       for n in nodes):
                return None
            return tables[0]

        def settled():
            # the same for longer than the controller's period (a second),
            # so it had its look and planned nothing more
            first = sample()
            if first is None:
                return False
            time.sleep(1.5)
            return sample() == first

        wait_until(settled, timeout=timeout, what="the replication factor restored on every partition")
        return time.time() - started

    def stop_and_check(self, min_ok=10):
        for w in self.workloads:
            w.stop()
        self.cl.heal()
        for n in self.cl.nodes.values():
            if n.server.proc.poll() is None:
                try:
                    n.server.signal(signal.SIGCONT)
                except ProcessLookupError:
                    pass
        took = self.settle()
        print("settled %.1fs after the workloads stopped" % took)
        reg, add, ctr = self.workloads
        node = self.running()[0]
        problems = reg.check() + add.check(node) + ctr.check(node)
        self.test.assertEqual(problems, [], "checker violations")
        for w in self.workloads:
            print("%s: ok %d, unknown %d, failed %d" % (w.name, w.count("ok"), w.count("unknown"), w.count("fail")))
        self.test.assertGreater(sum(w.count("ok") for w in self.workloads), min_ok, "the workloads made no progress")
        self.test.assertGreater(sum(metric(n, "drey_cluster_replication_ack_seconds_count")
                                    for n in self.running()), 0, "no acknowledgement was timed")
        self.assert_replicas_equal()
        history = read_table_history(self.cl)
        print("table history: %d revisions of %d entries" % (sum(map(len, history.values())), len(history)))
        self.test.assertEqual(check_table_history(history, self.rf), [], "illegal partition table transitions")

    # --- a node's own copy, through its internal listener ---

    def hashes(self, node, parts):
        with peer_channel(self.cl, node, "n9") as ch:
            fn, req, _ = ServiceClient(ch, self.cl.pb.move, "drey.internal.v1.Replica").methods["Hash"]
            resp = fn(req(partitions=PARTS, partition=parts), timeout=10, metadata=[("drey-forwarded-by", "n9")])
        return {h.partition: (h.entries, h.hash) for h in resp.partitions}

    def assert_replicas_equal(self):
        node = self.running()[0]
        table = self.table(node)
        by_id = {n.id: n for n in self.running()}
        copies = {i: self.hashes(n, list(range(PARTS))) for i, n in by_id.items()}
        entries = 0
        for p, (primary, replicas) in table.items():
            for b in replicas:
                self.test.assertEqual(copies[b][p], copies[primary][p],
                                      "partition %d: backup %s differs from primary %s" % (p, b, primary))
            entries += copies[primary][p][0]
        self.test.assertGreater(entries, 0)


def first_success_after(fn, since, timeout=30):
    """Seconds from since to the first call of fn that succeeds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            fn()
            return time.time() - since
        except grpc.RpcError:
            time.sleep(0.02)
    raise AssertionError("no write succeeded within %ds" % timeout)


class Replication(DreyTestCase):
    SERVER_FLAGS = None

    def test_a_killed_primary_fails_over_and_loses_no_acknowledged_write(self):
        with Scenario(self) as s:
            n1 = s.cl.nodes["n1"]
            led = s.led_by("n1", n1)
            self.assertTrue(led, "n1 leads no partition")
            probe_key = s.key_in(led[0])
            other = s.cl.nodes["n2"]
            set_, sreq, _ = other.cache.methods["Set"]
            s.progress()
            killed = time.time()
            s.cl.kill("n1")
            took = first_success_after(lambda: set_(sreq(key=probe_key, value=make_value("after")), timeout=2),
                                       killed)
            print("failover: first acknowledged write on a partition n1 led %.2fs after the kill (lease TTL %ds)"
                  % (took, LEASE_TTL_S))
            self.assertNotIn("n1", [p for p, _ in s.table(other).values()])
            s.progress()
            s.cl.restart("n1")  # it comes back as a backup, by a fresh copy
            s.progress()
            s.stop_and_check()

    def test_a_paused_primary_is_fenced(self):
        """SIGSTOP past the lease: the others take over; on SIGCONT the old
        primary neither serves what it had nor takes writes as primary."""
        with Scenario(self) as s:
            n1, n2 = s.cl.nodes["n1"], s.cl.nodes["n2"]
            p = s.led_by("n1", n2)[0]
            key = s.key_in(p, "zombie")
            set2, sreq, _ = n2.cache.methods["Set"]
            set2(sreq(key=key, value=make_value("old")), timeout=5)
            s.cl.pause("n1")
            wait_until(lambda: s.table(n2)[p][0] != "n1", timeout=30, what="a new primary for n1's partition")
            r = set2(sreq(key=key, value=make_value("new")), timeout=10)
            s.cl.resume("n1")
            get1, greq, _ = n1.cache.methods["Get"]
            set1, _, _ = n1.cache.methods["Set"]
            seen, refused = [], 0
            until = time.time() + 3
            while time.time() < until:
                try:
                    g = get1(greq(key=key), timeout=2)
                    seen.append((value_of(g.value), g.version))
                except grpc.RpcError as e:
                    refused += 1
                    self.assertIn(e.code(), (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED))
            print("the resumed node: %d reads answered, %d refused" % (len(seen), refused))
            for value, version in seen:
                self.assertEqual((value, version), ("new", r.version), "the fenced primary served a stale read")
            # a write through it now goes to the new primary, with a newer version
            w = set1(sreq(key=key, value=make_value("newer")), timeout=10)
            self.assertGreater(w.version, r.version)
            s.stop_and_check()

    def test_a_primary_cut_from_etcd_stops_and_is_replaced(self):
        with Scenario(self) as s:
            n2 = s.cl.nodes["n2"]
            p = s.led_by("n1", n2)[0]
            s.cl.isolate_from_etcd("n1", mode="blackhole")
            wait_until(lambda: s.table(n2)[p][0] != "n1", timeout=30, what="a new primary for n1's partition")
            wait_until(lambda: not details(s.cl.nodes["n1"])["leaseValid"], timeout=10,
                       what="n1 to see its lease lapse")
            s.progress()
            s.stop_and_check()

    def test_a_primary_cut_from_its_backups_drops_them_and_goes_on(self):
        with Scenario(self) as s:
            n1 = s.cl.nodes["n1"]
            before = details(n1)["inSyncShrinks"]
            s.cl.isolate_from_peers("n1", mode="blackhole")
            wait_until(lambda: details(n1)["inSyncShrinks"] > before, timeout=30,
                       what="n1 to drop a backup it cannot reach")
            s.progress()  # calls forwarded to or from n1 wait out their deadlines meanwhile
            s.stop_and_check()

    def test_a_minority_node_loses_its_partitions_to_the_majority(self):
        with Scenario(self) as s:
            n2 = s.cl.nodes["n2"]
            led = s.led_by("n1", n2)
            s.cl.split([["n1"], ["n2", "n3"]], mode="blackhole")
            wait_until(lambda: all(s.table(n2)[p][0] != "n1" for p in led), timeout=30,
                       what="the majority to take n1's partitions")
            s.progress()
            s.stop_and_check()

    def test_a_killed_backup_is_replaced(self):
        with Scenario(self) as s:
            n1 = s.cl.nodes["n1"]
            backups = [p for p, (_, r) in s.table(n1).items() if "n3" in r]
            self.assertTrue(backups)
            s.cl.kill("n3")
            wait_until(lambda: all("n3" not in s.table(n1)[p][1] for p in backups), timeout=30,
                       what="n3 out of every in-sync set")
            s.progress()
            s.stop_and_check()

    def test_a_skewed_clock_on_one_node_loses_nothing(self):
        """n2's wall clock 30 s ahead (libfaketime). Under libfaketime this
        node also fails to renew its etcd lease in time, every few seconds
        (gRPC's timers and libfaketime's interposed clock calls do not get
        along; not understood), so this is a flapping-lease nemesis too."""
        with Scenario(self) as s:
            s.cl.restart_with_clock_offset("n2", 30)
            s.progress(ops=100)
            for w in s.workloads:
                w.stop()
            s.cl.restart("n2", env={"FAKETIME": "+0"})  # its own clock again
            s.stop_and_check()

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
            for w in s.workloads:
                w.stop()
            used = details(s.cl.nodes["n3"], "memory")["usedBytes"]
            limit = int(used) + (2 << 20)
            s.cl.restart("n3", flags=list(s.cl.launched["n3"][0]) + ["--memory-limit=%d" % limit])
            s.settle()  # n3 is a backup again: an ephemeral node comes back empty, by fresh copies
            written, refused = self.fill_backup(s, "n3", "MEMORY_PRESSURE", 200)
            print("%d writes fitted; refused: %d (%d by a primary for its backup)"
                  % (written, len(refused), sum(1 for _, b in refused if b == "n3")))
            self.assertTrue(refused)
            s.assert_replicas_equal()

    def test_a_join_and_a_drain_while_clients_write(self):
        with Scenario(self, ids=("n1", "n2", "n3", "n4"), started=3,
                      extra_flags=("--cluster-drain-timeout=60s",)) as s:
            s.cl.launch("n4")
            s.progress()
            n1 = s.cl.nodes["n1"]
            wait_until(lambda: any("n4" in (pr,) + r for pr, r in s.table(n1).values()), timeout=60,
                       what="n4 to hold partitions")
            # SIGTERM moves its partitions to the others before it leaves
            s.cl.nodes["n2"].server.signal(signal.SIGTERM)
            s.cl.nodes["n2"].server.wait(timeout=90)
            s.progress()
            s.stop_and_check()


class MinInSync(DreyTestCase):
    SERVER_FLAGS = None

    def test_writes_are_refused_when_a_partition_would_have_one_copy(self):
        # two nodes: nobody can replace the lost copy
        with Scenario(self, ids=("n1", "n3"), started=2, durable=False, extra_flags=("--min-in-sync=2",)) as s:
            n1 = s.cl.nodes["n1"]
            for w in s.workloads:
                w.stop()
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
            for w in s.workloads:
                w.stop()
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


if __name__ == "__main__":
    main()
