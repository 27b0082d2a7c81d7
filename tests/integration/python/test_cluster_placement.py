"""Every copy placed: backups are placed and rebalanced by the same
rendezvous placement as primaries (src/cluster/plan.h), so a node that
joins or restarts gets its share of backups, not only of primaries.

Three real nodes with replication factor 2 and a few hundred small keys,
then:
- a fourth node joins: it leads partitions and backs others, and the
  copies per node (primaries and in-sync backups) are within 1.25x of each
  other;
- a node restarts (an ephemeral one: it comes back empty and steps out of
  every entry that named it): it gets its share of backups back.
- a node drains (SIGTERM) while a writer adds keys: each of its copies is
  replaced before it goes, so the status, polled throughout, never shows
  an under-replicated partition, and no acknowledged write is lost.
After a join and a restart, every node's store holds exactly the keys of
the partitions it holds a copy of (the copies it was taken out of are
dropped, not kept in memory); after each, every key reads back, and every revision of the partition table
is a legal edit (check_table_history).
"""
import signal
import threading
import time

from drey_checkers import Client, SetWorkload, check_table_history, read_table_history
from drey_cluster import Cluster, metric, partition
from drey_harness import DreyTestCase, main, make_value, value_of
from drey_tokens import details as readiness, poll

PARTS = 64
RF = 2
KEYS = 400
RPC = 10
STABLE_S = 2.5  # longer than the controller's look (1 s): a table unchanged that long is not between two plans


class Placement(DreyTestCase):
    SERVER_FLAGS = None

    def settled(self, cl, members):
        """The table once every partition has its factor's in-sync copies,
        nothing is copied or moved, the controller holds no move back for
        the settle time after a change of primary, and it stayed so for
        STABLE_S (after a copy lands, the controller's next plan is up to a
        look away)."""
        seen = {}

        def probe():
            s = cl.status()
            nodes = s["nodes"]
            quiet = (len(nodes) == members and s["unassignedPartitions"] == 0 and
                     s["underReplicatedPartitions"] == 0 and not s["moves"] and
                     all(n["syncing"] == 0 and n["state"] == "serving" for n in nodes) and
                     sum(n["copies"] for n in nodes) == PARTS * RF and
                     readiness(cl.nodes[s["controller"]].server)["cluster"].get("movesWaiting", 0) == 0)
            table = [(r["primary"], sorted(r["inSync"])) for r in s["table"]]
            now = time.monotonic()
            if not quiet or seen.get("table") != table:
                seen.update(table=table if quiet else None, since=now)
            return s, now - seen["since"] if quiet else 0.0

        return poll(probe, lambda v: v[1] >= STABLE_S, timeout=120, interval=0.2,
                    what="a settled table of %d members" % members)[0]

    def assertBalanced(self, s):
        copies = {n["id"]: n["copies"] for n in s["nodes"]}
        self.assertLessEqual(max(copies.values()), 1.25 * min(copies.values()),
                             "copies per node: %s" % copies)
        for n in s["nodes"]:
            self.assertEqual(n["copies"], n["partitions"] + n["backups"])

    def write(self, cl):
        set_, req, _ = cl.nodes["n1"].cache.methods["Set"]
        keys = ["k%d" % i for i in range(KEYS)]
        for k in keys:
            set_(req(key=k, value=make_value("v-" + k)), timeout=RPC)
        return keys

    def assertStoresHoldTheirCopies(self, cl, s, keys):
        """Each node's store holds the keys of the partitions it leads or
        backs in sync, and nothing else (the copies it lost a role in are
        dropped by the node itself, a moment after the table says so)."""
        per_part = {}
        for k in keys:
            p = partition("", k, PARTS)
            per_part[p] = per_part.get(p, 0) + 1
        want = {n["id"]: 0 for n in s["nodes"]}
        for r in s["table"]:
            for node in [r["primary"]] + r["inSync"]:
                want[node] += per_part.get(r["partition"], 0)
        poll(lambda: {i: int(metric(cl.nodes[i], "drey_store_entries")) for i in want},
             lambda got: got == want, timeout=30, interval=0.1, what="stores holding their copies only: %s" % want)
        for n in cl.live():
            get, greq, _ = n.cache.methods["Get"]
            for k in keys[::7]:
                got = get(greq(key=k), timeout=RPC)
                self.assertEqual(value_of(got.value), "v-" + k, "%s through %s" % (k, n.id))

    def assertLegalTable(self, cl):
        self.assertEqual(check_table_history(read_table_history(cl), RF), [])

    def test_a_joining_node_gets_backups_as_well_as_primaries(self):
        with Cluster(partitions=PARTS, initial_nodes=3, replication_factor=RF) as cl:
            cl.start(3)
            cl.wait_assigned(3)
            keys = self.write(cl)
            self.settled(cl, 3)
            cl.start_node("n4")
            s = self.settled(cl, 4)
            n4 = next(n for n in s["nodes"] if n["id"] == "n4")
            self.assertGreater(n4["partitions"], 0)
            self.assertGreater(n4["backups"], 0, "the new node backs partitions too")
            self.assertBalanced(s)
            self.assertStoresHoldTheirCopies(cl, s, keys)
            self.assertLegalTable(cl)
            print("join: copies per node %s" % {n["id"]: (n["partitions"], n["backups"]) for n in s["nodes"]})

    def test_a_restarted_node_gets_its_share_of_backups_back(self):
        with Cluster(partitions=PARTS, initial_nodes=3, replication_factor=RF) as cl:
            cl.start(3)
            cl.wait_assigned(3)
            keys = self.write(cl)
            self.settled(cl, 3)
            cl.nodes["n2"].server.stop()
            cl.start_node("n2")
            s = self.settled(cl, 3)
            n2 = next(n for n in s["nodes"] if n["id"] == "n2")
            self.assertGreater(n2["backups"], 0, "the restarted node backs partitions again")
            self.assertBalanced(s)
            self.assertStoresHoldTheirCopies(cl, s, keys)
            self.assertLegalTable(cl)
            print("restart: copies per node %s" % {n["id"]: (n["partitions"], n["backups"]) for n in s["nodes"]})

    def test_a_drain_replaces_every_copy_before_it_goes(self):
        with Cluster(partitions=PARTS, initial_nodes=3, replication_factor=RF) as cl:
            for i in (1, 2, 3):
                cl.start_node("n%d" % i, flags=("--cluster-drain-timeout=60s",))
            cl.wait_assigned(3)
            keys = self.write(cl)
            self.settled(cl, 3)
            adds = SetWorkload(Client(cl.live, rpc_timeout=RPC), threads=2)
            adds.start()
            seen, stop = [], threading.Event()

            def watch():
                # n1's own table (its readiness details), a few ms a look
                while not stop.is_set():
                    d = readiness(cl.nodes["n1"].server)["cluster"]
                    seen.append((d.get("underReplicatedPartitions", 0), d.get("unassignedPartitions", 0)))

            watcher = threading.Thread(target=watch, daemon=True)
            watcher.start()
            try:
                poll(lambda: adds.count(), lambda n: n >= 50, timeout=30, what="adds acknowledged")
                leaving = cl.nodes["n3"]
                started = time.monotonic()
                leaving.server.signal(signal.SIGTERM)
                self.assertEqual(leaving.server.wait(timeout=90), 0)
                took = time.monotonic() - started
                self.assertIsNotNone(leaving.server.find_log(
                    lambda r: r.get("msg") == "drained: every copy this node held is on the others"))
                done = adds.count()
                poll(lambda: adds.count(), lambda n: n >= done + 20, timeout=30, what="adds after the drain")
            finally:
                stop.set()
                watcher.join(timeout=30)
                adds.stop()
            self.assertGreater(len(seen), 3, "the status was polled throughout")
            self.assertEqual([x for x in seen if x != (0, 0)], [], "a partition went under-replicated or unowned")
            self.settled(cl, 2)
            self.assertEqual(adds.check(cl.nodes["n1"]), [])
            get, greq, _ = cl.nodes["n2"].cache.methods["Get"]
            for k in keys[::7]:
                self.assertEqual(value_of(get(greq(key=k), timeout=RPC).value), "v-" + k)
            self.assertLegalTable(cl)
            print("drain: %.1f s with %d adds acknowledged, %d status polls, none under-replicated" %
                  (took, adds.count(), len(seen)))


if __name__ == "__main__":
    main()
