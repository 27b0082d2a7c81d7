"""A cluster node's start and its log, as an operator meets them.

* etcd not up yet when a node starts (Kubernetes brings the pods up in any
  order): the node keeps trying, backing off, one line per failed attempt
  saying when it tries again, and joins and serves once etcd answers; a
  signal meanwhile stops it at once (exit 0); with a short
  --cluster-start-timeout it gives up and exits 1, saying why.
* A clean start of three nodes with two copies of each partition logs no
  warning and no error, and takes no backup out of an in-sync set (a node
  takes its primaries' records from the moment it joined, not only once it
  serves clients).
* A node's death: each survivor logs a line naming it as it leaves the
  membership, one saying its partitions failed over (to whom, how many),
  and a line per backup and per run of moves, not one per partition (the
  per-partition lines are debug).
"""
import signal
import time

from drey_tokens import details, poll

from drey_cluster import Cluster
from drey_harness import DreyTestCase, main, make_value

RETRY_MSG = "etcd does not answer yet; trying again"


class ClusterStart(DreyTestCase):
    SERVER_FLAGS = None

    def test_a_node_waits_for_etcd_to_come_up(self):
        with Cluster(partitions=8, initial_nodes=1) as cl:
            # etcd goes away with the cluster's config in its data directory
            cl.etcd.proc.kill()
            cl.etcd.proc.wait(30)
            cl.etcd.log.close()

            n1 = cl.start_node("n1", wait=False)
            first = n1.server.wait_log(lambda r: r.get("msg") == RETRY_MSG, 30, what="a retry line")
            self.assertEqual(first["level"], "warn")
            self.assertEqual(first["attempt"], 1)
            self.assertIn(cl.etcd.url, first["etcd"])
            self.assertGreater(first["retry_in_ms"], 0)
            self.assertGreater(first["gives_up_in_s"], 250, "the default waits minutes, not seconds")
            self.assertIn("cannot reach etcd", first["error"])

            # A signal while it waits: it stops at once, cleanly.
            n2 = cl.start_node("n2", wait=False)
            n2.server.wait_log(lambda r: r.get("msg") == RETRY_MSG, 30, what="n2's retry line")
            asked = time.monotonic()
            n2.server.signal(signal.SIGTERM)
            self.assertEqual(n2.server.wait(30), 0, n2.server.log_text()[-3000:])
            self.assertLess(time.monotonic() - asked, 10)
            self.assertTrue(n2.server.find_log(lambda r: r.get("msg") == "asked to stop before the cluster could "
                                                                           "be joined"), n2.server.log_text())

            # A short timeout: it gives up, and says why.
            n3 = cl.start_node("n3", flags=["--cluster-start-timeout=2s"], wait=False)
            self.assertEqual(n3.server.wait(30), 1, n3.server.log_text()[-3000:])
            rec = n3.server.find_log(lambda r: r.get("msg") == "cannot join the cluster: the node will not start")
            self.assertIsNotNone(rec, n3.server.log_text())
            self.assertIn("gave up after 2 s", rec["error"])
            self.assertIn("--cluster-start-timeout", rec["error"])
            self.assertIn("cannot reach etcd at " + cl.etcd.url, rec["error"])

            # n1 retried with growing pauses and is still waiting.
            n1.server.wait_log(lambda r: r.get("msg") == RETRY_MSG and r["attempt"] >= 3, 30, what="a third try")
            self.assertIsNone(n1.server.proc.poll())
            tries = [r for r in n1.server.log_records() if r.get("msg") == RETRY_MSG]
            self.assertLess(tries[0]["retry_in_ms"], tries[2]["retry_in_ms"], "backing off")

            cl.etcd.start()
            n1.server.wait_serving(60)
            cl.agreed_owners([n1])
            fn, req_cls, _ = n1.cache.methods["Set"]
            fn(req_cls(key="k", value=make_value("v")), timeout=30)
            fn, req_cls, _ = n1.cache.methods["Get"]
            self.assertTrue(fn(req_cls(key="k"), timeout=30).found)
            self.assertTrue(n1.server.find_log(lambda r: r.get("msg") == "joined the cluster"))
            del cl.nodes["n2"], cl.nodes["n3"]  # they exited as they should


    def test_a_clean_start_is_quiet_and_a_death_is_one_story(self):
        with Cluster(partitions=64, initial_nodes=3, replication_factor=2) as cl:
            nodes = cl.start(3)
            cl.agreed_owners(nodes)
            poll(cl.status, lambda s: s["underReplicatedPartitions"] == 0 and not s["unanswered"] and all(
                 n["movingIn"] == 0 and n["movingOut"] == 0 for n in s["nodes"]),
                 timeout=60, what="every partition with its two copies, nothing moving")

            def loud(node, since=0):
                return [r for r in node.server.log_records()[since:] if r.get("level") in ("warn", "error")]
            for n in nodes:
                self.assertEqual(loud(n), [], "%s warned on a clean start" % n.id)
                # no backup was refused as still starting and dropped
                self.assertEqual(details(n.server)["cluster"]["inSyncShrinks"], 0, n.server.log_text()[-3000:])

            survivors, dead = nodes[:2], nodes[2]
            marks = [len(n.server.log_records()) for n in survivors]
            dead.server.kill()
            for n in survivors:
                n.server.wait_log(lambda r: r.get("msg") == "a departed member's partitions have failed over"
                                  and r.get("node") == dead.id, 30, what="the failover's summary")
            for n, mark in zip(survivors, marks):
                left = [r for r in n.server.log_records()[mark:] if r.get("node") == dead.id
                        and r.get("msg", "").startswith("a member left the membership")]
                self.assertEqual(len(left), 1, n.server.log_text()[-3000:])
                self.assertEqual(left[0]["level"], "warn")
                done = n.server.find_log(lambda r: r.get("msg") == "a departed member's partitions have failed over")
                self.assertEqual(done["failed_over"], done["partitions"])
                self.assertEqual(sum(int(x.split(":")[1]) for x in done["to"].split(",")), done["partitions"])
                self.assertTrue(set(x.split(":")[0] for x in done["to"].split(",")) <= {"n1", "n2"}, done)
                warned = loud(n, mark)
                self.assertLessEqual(len(warned), 6, "one line per event, not one per partition:\n%s" %
                                     "\n".join(str(r) for r in warned))
                self.assertFalse([r for r in warned if "partition" in r], "no per-partition warning")
            del cl.nodes[dead.id]  # killed on purpose


if __name__ == "__main__":
    main()
