"""etcd away while clients write, on three nodes with factor 2
(drey_replication's Scenario and its checkers).

A primary holds leases granted by its in-sync backups (their answers to
its heartbeats) besides its etcd lease, so while nothing needs a change of
the partition table, reads and writes go on with etcd frozen or stopped:
every scenario holds the outage until every node's etcd lease has lapsed,
then for a count of operations more. What needs a table change (a failover)
waits for etcd: a primary killed while etcd is away leaves its partitions
unavailable, never led twice, until etcd returns and a backup is promoted.
After each, the checkers: no acknowledged write lost, every copy alike,
every table transition legal.
"""
import signal
import threading

import grpc

from drey_cluster import partition, wait_until
from drey_harness import DreyTestCase, RpcFailure, main, make_value
from drey_replication import LEASE_TTL_S, PARTS, Scenario, details


class Prober:
    """Gets of keys through one node, by four threads, until stopped."""

    def __init__(self, node, keys):
        self.get, self.req, _ = node.cache.methods["Get"]
        self.keys = keys
        self.calls = 0
        self.refusals = []
        self.done = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(4)]

    def run(self, i):
        while not self.done.is_set():
            key = self.keys[(self.calls + i) % len(self.keys)]
            try:
                self.get(self.req(key=key), timeout=5)
            except grpc.RpcError as e:
                f = RpcFailure(e)
                self.refusals.append((f.reason, f.metadata.get("cause")))
            self.calls += 1

    def start(self):
        for t in self.threads:
            t.start()

    def run_for(self, seconds):
        self.done.wait(seconds)  # the probe's length, not a synchronisation

    def stop(self):
        self.done.set()
        for t in self.threads:
            t.join(30)


def etcd_leases_lapsed(s):
    return all(not details(n).get("leaseValid", False) for n in s.running())


class EtcdAway(DreyTestCase):
    SERVER_FLAGS = None
    MAX_REFUSED = 0.01  # of the calls made while etcd is away

    def hold_outage(self, s, ops=150):
        """Until every node's etcd lease lapsed, then ops more operations;
        (calls, refused) meanwhile."""
        calls0, refused0 = s.client.counts()
        wait_until(lambda: etcd_leases_lapsed(s), timeout=10 * LEASE_TTL_S, what="every node's etcd lease lapsed")
        s.progress(ops=ops, timeout=120)
        calls1, refused1 = s.client.counts()
        return calls1 - calls0, refused1 - refused0

    def check_outage_cost(self, calls, refused, what):
        print("%s: %d calls, %d refused (%.2f%%)" % (what, calls, refused, 100.0 * refused / max(calls, 1)))
        self.assertGreater(calls, 0)
        self.assertLessEqual(refused, self.MAX_REFUSED * calls, "%s: calls refused while etcd was away" % what)

    def check_nothing_changed(self, s, before, shrinks):
        """Back, etcd revokes every lease that lapsed while it was away;
        the members register again, and nothing fails over meanwhile: the
        table and every in-sync set stay (a member between its lease and
        its new one is still its partitions' backup, at its address)."""
        wait_until(lambda: all(details(n).get("leaseValid", False) for n in s.running()), timeout=30,
                   what="every node registered again")
        s.progress()
        self.assertEqual(s.table(s.cl.nodes["n1"]), before, "the table changed after etcd returned")
        self.assertEqual(sum(details(n)["inSyncShrinks"] for n in s.running()), shrinks,
                         "a backup was taken out of an in-sync set after etcd returned")

    def test_a_frozen_etcd_costs_no_calls(self):
        with Scenario(self) as s:
            s.progress()
            n1 = s.cl.nodes["n1"]
            before = s.table(n1)
            shrinks = sum(details(n)["inSyncShrinks"] for n in s.running())
            etcd = s.cl.etcd.proc
            etcd.send_signal(signal.SIGSTOP)
            try:
                calls, refused = self.hold_outage(s)
                # Reads through n1 of partitions n2 and n3 lead, hammered
                # across etcd's return: every lease is revoked at once then,
                # and a member between its lease and its new one is not gone
                prober = Prober(n1, [s.key_in(p, "probe") for p, (primary, _) in before.items() if primary != "n1"])
                prober.start()
            finally:
                etcd.send_signal(signal.SIGCONT)
            try:
                wait_until(lambda: all(details(n).get("leaseValid", False) for n in s.running()), timeout=30,
                           what="every node registered again")
                prober.run_for(1.0)
            finally:
                prober.stop()
            print("reads across etcd's return: %d, refused %d %s" % (prober.calls, len(prober.refusals),
                                                                     prober.refusals[:3]))
            self.assertEqual(prober.refusals, [], "reads refused across etcd's return")
            self.check_outage_cost(calls, refused, "etcd frozen")
            self.check_nothing_changed(s, before, shrinks)
            s.stop_and_check()

    def test_a_stopped_etcd_costs_no_calls(self):
        with Scenario(self) as s:
            s.progress()
            before = s.table(s.cl.nodes["n1"])
            shrinks = sum(details(n)["inSyncShrinks"] for n in s.running())
            s.cl.etcd.proc.kill()
            s.cl.etcd.proc.wait(30)
            try:
                calls, refused = self.hold_outage(s)
            finally:
                s.cl.etcd.log.close()
                s.cl.etcd.start()  # the same data directory and ports
            self.check_outage_cost(calls, refused, "etcd stopped")
            self.check_nothing_changed(s, before, shrinks)
            s.stop_and_check()

    def test_a_primary_killed_while_etcd_is_away_waits_for_etcd(self):
        with Scenario(self) as s:
            s.progress()
            n1 = s.cl.nodes["n1"]
            led = s.led_by("n1", n1)
            self.assertTrue(led)
            survivor = s.cl.nodes["n2"]
            etcd = s.cl.etcd.proc
            etcd.send_signal(signal.SIGSTOP)
            try:
                wait_until(lambda: etcd_leases_lapsed(s), timeout=10 * LEASE_TTL_S,
                           what="every node's etcd lease lapsed")
                s.cl.kill("n1")
                # n1's partitions: nobody may lead them without etcd (no
                # promotion), so their writes stop; the others go on
                key = s.key_in(led[0], "etcd-away")
                set_, sreq, _ = survivor.cache.methods["Set"]
                with self.assertRaises(grpc.RpcError) as cm:
                    set_(sreq(key=key, value=make_value(b"x")), timeout=3)
                self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAVAILABLE)
                other = next(p for p in range(PARTS) if p not in led)
                set_(sreq(key=s.key_in(other, "etcd-away"), value=make_value(b"y")), timeout=10)
                s.progress(ops=50, timeout=120)
            finally:
                etcd.send_signal(signal.SIGCONT)
            wait_until(lambda: not (set(s.led_by("n1", survivor)) & set(led)), timeout=30,
                       what="n1's partitions failed over once etcd returned")
            s.progress()
            s.stop_and_check()
            self.assertEqual(partition("", key, PARTS), led[0])

    def test_a_primary_cut_from_its_backup_while_etcd_is_away_waits_for_etcd(self):
        """Dropping an unreachable backup from the in-sync set is a table
        change: with etcd away the primary may not do it, so the
        partitions that n1 and n2 back for each other stop taking writes
        (refused, typed; never acknowledged on one copy), the others go
        on, and once etcd returns the cut is repaired by the table."""
        with Scenario(self) as s:
            s.progress()
            n1, n2 = s.cl.nodes["n1"], s.cl.nodes["n2"]
            table = s.table(n1)
            shared = [p for p, (primary, backups) in table.items()
                      if {primary, *backups} == {"n1", "n2"}]
            apart = [p for p, (primary, backups) in table.items() if "n3" in (primary, *backups)
                     and p not in shared]
            self.assertTrue(shared and apart, table)
            shrinks = details(n1)["inSyncShrinks"] + details(n2)["inSyncShrinks"]
            etcd = s.cl.etcd.proc
            etcd.send_signal(signal.SIGSTOP)
            try:
                wait_until(lambda: etcd_leases_lapsed(s), timeout=10 * LEASE_TTL_S,
                           what="every node's etcd lease lapsed")
                s.cl.cut("n1", "n2", mode="blackhole")
                s.cl.cut("n2", "n1", mode="blackhole")
                # a write to a partition the two share: its primary cannot
                # reach its backup and may not drop it, so the write waits
                # (its outcome unknown when the caller gives up)...
                p = shared[0]
                primary = s.cl.nodes[table[p][0]]
                set_, sreq, _ = primary.cache.methods["Set"]
                key = s.key_in(p, "cut-away")
                with self.assertRaises(grpc.RpcError) as cm:
                    set_(sreq(key=key, value=make_value(b"x")), timeout=3)
                self.assertIn(cm.exception.code(), (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE))
                # ...and once the backup's grant ran out, the next ones are
                # refused before the journal, typed
                def refused_typed():
                    try:
                        set_(sreq(key=s.key_in(p, "cut-later"), value=make_value(b"z")), timeout=3)
                    except grpc.RpcError as e:
                        f = RpcFailure(e)
                        return f.reason is not None and f.metadata.get("outcome") == "not_applied" and f
                    self.fail("a write acknowledged by a primary cut from its backup while etcd was away")
                f = wait_until(refused_typed, timeout=30, what="writes refused up front")
                self.assertEqual(f.code, grpc.StatusCode.UNAVAILABLE, f.message)
                self.assertIsNotNone(f.retry_info, f.message)
                print("a write to a partition cut from its backup, etcd away:", f.reason, f.metadata)
                # the others, through n3, go on
                set3, sreq3, _ = s.cl.nodes["n3"].cache.methods["Set"]
                for q in apart[:4]:
                    set3(sreq3(key=s.key_in(q, "cut-away"), value=make_value(b"y")), timeout=10)
                s.progress(ops=50, timeout=120)
                self.assertEqual(details(n1)["inSyncShrinks"] + details(n2)["inSyncShrinks"], shrinks,
                                 "an in-sync set changed while etcd was away")
            finally:
                etcd.send_signal(signal.SIGCONT)
            # etcd back, the cut still there: the table repairs it
            wait_until(lambda: all({s.table(n1)[q][0], *s.table(n1)[q][1]} != {"n1", "n2"} or
                                   len(s.table(n1)[q][1]) == 0 for q in shared),
                       timeout=60, what="the shared partitions repaired once etcd returned")
            s.progress()
            s.cl.heal()
            s.progress()
            s.stop_and_check()
            self.assertEqual(partition("", key, PARTS), p)


if __name__ == "__main__":
    main()
