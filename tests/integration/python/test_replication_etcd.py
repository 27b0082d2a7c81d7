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

import grpc

from drey_cluster import partition, wait_until
from drey_harness import DreyTestCase, main, make_value
from drey_replication import LEASE_TTL_S, PARTS, Scenario, details


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

    def test_a_frozen_etcd_costs_no_calls(self):
        with Scenario(self) as s:
            s.progress()
            etcd = s.cl.etcd.proc
            etcd.send_signal(signal.SIGSTOP)
            try:
                calls, refused = self.hold_outage(s)
            finally:
                etcd.send_signal(signal.SIGCONT)
            self.check_outage_cost(calls, refused, "etcd frozen")
            s.progress()
            s.stop_and_check()

    def test_a_stopped_etcd_costs_no_calls(self):
        with Scenario(self) as s:
            s.progress()
            s.cl.etcd.proc.kill()
            s.cl.etcd.proc.wait(30)
            try:
                calls, refused = self.hold_outage(s)
            finally:
                s.cl.etcd.log.close()
                s.cl.etcd.start()  # the same data directory and ports
            self.check_outage_cost(calls, refused, "etcd stopped")
            s.progress()
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


if __name__ == "__main__":
    main()
