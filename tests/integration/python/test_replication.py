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

The backups' own rules, stale reads, evictions, whole-cache figures and
Clear are test_replication_copies.py's.
"""
import signal
import time

import grpc

from drey_cluster import wait_until
from drey_harness import DreyTestCase, main, make_value, value_of
from drey_replication import LEASE_TTL_S, Scenario, details, first_success_after

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
            # the promoted backup first waits out the lease it last granted n1
            written = []

            def write_new():
                written.append(set2(sreq(key=key, value=make_value("new")), timeout=10))
            print("the new primary took the write %.2fs after it was named" % first_success_after(write_new,
                                                                                                  time.time()))
            r = written[0]
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
            s.stop_workloads()
            s.cl.restart("n2", env={"FAKETIME": "+0"})  # its own clock again
            s.stop_and_check()

    def assert_copies_balanced(self, s, what):
        """Once the factor is restored on every partition (the workloads
        still writing), copies per node (primaries and in-sync backups)
        come within 1.25x of each other."""
        seen = {}

        def balanced():
            if not s.restored():
                return False
            copies = {n.id: 0 for n in s.running()}
            for primary, backups in s.table(s.running()[0]).values():
                for i in (primary,) + backups:
                    copies[i] += 1
            seen["copies"] = copies
            return max(copies.values()) <= 1.25 * min(copies.values())

        wait_until(balanced, timeout=90, what=lambda: "%s: copies per node within 1.25x (%s)" % (what, seen))
        print("%s: copies per node %s" % (what, seen["copies"]))

    def test_a_join_a_restart_and_a_drain_while_clients_write(self):
        with Scenario(self, ids=("n1", "n2", "n3", "n4"), started=3,
                      extra_flags=("--cluster-drain-timeout=60s",)) as s:
            s.cl.launch("n4")
            s.progress()
            self.assert_copies_balanced(s, "after n4 joined")
            # a restart: its copies were given to others; it gets its share back
            s.cl.restart("n3")
            s.progress()
            self.assert_copies_balanced(s, "after n3 restarted")
            # SIGTERM moves its copies to the others before it leaves: no
            # partition is ever short of its factor meanwhile
            n2 = s.cl.nodes["n2"]
            n2.server.signal(signal.SIGTERM)
            short = []
            while n2.server.proc.poll() is None:
                for n in s.running():
                    if n is not n2:
                        for p, (primary, backups) in s.table(n).items():
                            if 1 + len(backups) < s.rf:
                                short.append((n.id, p, primary, backups))
            n2.server.wait(timeout=90)
            self.assertEqual(short, [], "a partition went under-replicated during the drain")
            s.progress()
            self.assert_copies_balanced(s, "after n2 drained")
            s.stop_and_check()

if __name__ == "__main__":
    main()
