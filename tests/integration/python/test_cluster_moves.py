"""Partitions moving while clients write: a node joins, a node drains by
SIGTERM, the controller dies in the middle of the moves.

Writers put unique keys (Set with a request_id) and increment counters
(Increment with a request_id), each through a random node, retrying a
failed attempt with the same request_id through another node, as a client
that wants exactly-once effects does. Afterwards:
- every acknowledged Set is readable, through every node, with its value;
- its request_id sent again, through any node, answers with the version it
  was first acknowledged with (the remembered outcome moved with the data);
- each counter lies between its acknowledged and its attempted increments
  (so no increment was applied twice, none acknowledged was lost);
- the table is complete, no move is left, and the new node owns a share
  near 1/n while a join moved no more than the rule's bound.

The internal Partitions service is served only to authenticated peers,
never to clients, and refuses to overwrite a partition its node owns.
"""
import os
import random
import shutil
import signal
import tempfile
import threading

import grpc

from drey_checkers import Client, RegisterWorkload, check_register
from drey_cluster import Cluster, metric, partition, wait_until
from drey_harness import DreyTestCase, RpcFailure, ServiceClient, main, make_value, value_of
from drey_tokens import poll

RPC = 10
PARTS = 32




class Writers:
    """Threads writing through random nodes until stopped; what was
    acknowledged and what was attempted. The registers are a
    RegisterWorkload (drey_checkers) through the same client."""

    def __init__(self, cluster, threads=3, value_bytes=64):
        self.cluster = cluster
        self.client = Client(self.nodes, rpc_timeout=RPC)
        self.stop_flag = threading.Event()
        self.lock = threading.Lock()
        self.acked = {}      # key -> (value, version, request_id)
        self.inc_acked = {}  # counter -> acknowledged increments
        self.inc_tried = {}  # counter -> attempted increments
        self.regressions = []  # a register whose acknowledged version went down
        self.failed = 0
        self.value_bytes = value_bytes
        self.threads = [threading.Thread(target=self.run, args=(t,), daemon=True) for t in range(threads)]
        # Registers every writer reads and compare-and-sets, checked as a history.
        self.registers = RegisterWorkload(self.client, threads=2, keys=2, name="cas")
        self.history, self.initial = self.registers.history, self.registers.initial

    def nodes(self):
        return self.cluster.live()

    def call(self, method, **fields):
        """Retries a failed attempt through another node with the same
        request; None if it never succeeded."""
        return self.client.call(method, **fields)[0]

    def run(self, t):
        i = 0
        counter = "c%d" % t
        register, last_version = "reg-%d" % t, 0
        while not self.stop_flag.is_set():
            i += 1
            if i % 4 == 2:
                # one writer per register, one write at a time: each
                # acknowledged version above the last, across moves too
                r = self.call("Set", cache="reg", key=register, value=make_value("r%d" % i),
                              request_id="reg-%d-%d" % (t, i))
                if r is not None:
                    if r.version <= last_version:
                        self.regressions.append((register, last_version, r.version))
                    last_version = r.version
                continue
            if i % 4 == 0:
                with self.lock:
                    self.inc_tried[counter] = self.inc_tried.get(counter, 0) + 1
                r = self.call("Increment", cache="ctr", key=counter, delta=1, request_id="inc-%d-%d" % (t, i))
                if r is not None:
                    with self.lock:
                        self.inc_acked[counter] = self.inc_acked.get(counter, 0) + 1
                continue
            key = "t%d-%d" % (t, i)
            value = ("v%d-" % i).ljust(self.value_bytes, "x")
            rid = "set-%d-%d" % (t, i)
            r = self.call("Set", key=key, value=make_value(value), request_id=rid)
            with self.lock:
                if r is None:
                    self.failed += 1
                else:
                    self.acked[key] = (value, r.version, rid)

    def start(self):
        self.registers.start()
        for th in self.threads:
            th.start()
        return self

    def wait_acked(self, n, timeout=60):
        wait_until(lambda: len(self.acked) >= n, timeout=timeout, what="%d acknowledged writes" % n)

    def stop(self):
        self.stop_flag.set()
        for th in self.threads:
            th.join(timeout=120)
        self.registers.stop()


class Moves(DreyTestCase):
    SERVER_FLAGS = None

    def durable_node(self, cl, node_id, dirs, flags=()):
        """A node with a data directory of its own, kept across restarts
        and removed after the test (each preallocates a journal segment)."""
        if node_id not in dirs:
            dirs[node_id] = tempfile.mkdtemp(prefix="drey-move-", dir=os.environ.get("TEST_TMPDIR"))
            self.addCleanup(shutil.rmtree, dirs[node_id], True)
        return cl.start_node(node_id, data_dir=dirs[node_id], flags=flags)

    def settled(self, cl, members, owner=None):
        """Every partition owned by a member, no move left, and (a join)
        the new node owning some: before the controller has planned, the
        table is complete and has no moves too."""
        def done(s):
            return (s["unassignedPartitions"] == 0 and not s["moves"] and len(s["nodes"]) == members and
                    sum(n["partitions"] for n in s["nodes"]) == PARTS and
                    (owner is None or any(n["id"] == owner and n["partitions"] > 0 for n in s["nodes"])))
        return poll(cl.status, done, timeout=120, what="a settled table of %d members" % members, interval=0.05)

    def check(self, cl, w):
        nodes = cl.live()
        self.assertGreater(len(w.acked), 0)
        self.assertEqual(w.regressions, [], "versions only grow per key, across moves")
        self.assertEqual(check_register(w.history, w.initial), [], "the registers' history is consistent")
        cas_ok = sum(1 for o in w.history.ops if o.kind == "cas" and o.outcome == "ok")
        self.assertGreater(cas_ok, 0)
        for key, (value, version, rid) in sorted(w.acked.items()):
            for n in nodes:
                get, greq, _ = n.cache.methods["Get"]
                got = get(greq(key=key), timeout=RPC)
                self.assertEqual(value_of(got.value), value, "%s through %s" % (key, n.id))
                self.assertEqual(got.version, version, "%s through %s" % (key, n.id))
        # the remembered outcomes moved with their partitions
        for key, (value, version, rid) in random.Random(7).sample(sorted(w.acked.items()), min(60, len(w.acked))):
            n = random.choice(nodes)
            fn, req_cls, _ = n.cache.methods["Set"]
            again = fn(req_cls(key=key, value=make_value(value), request_id=rid), timeout=RPC)
            self.assertEqual(again.version, version, "a retry of %s through %s gets its first outcome" % (key, n.id))
        for counter, tried in w.inc_tried.items():
            get, greq, _ = nodes[0].cache.methods["Get"]
            got = get(greq(cache="ctr", key=counter), timeout=RPC)
            v = value_of(got.value) if got.found else 0
            acked = w.inc_acked.get(counter, 0)
            self.assertGreaterEqual(v, acked, "%s lost an acknowledged increment" % counter)
            self.assertLessEqual(v, tried, "%s applied an increment twice" % counter)

    def test_a_fourth_node_joins_while_clients_write(self):
        with Cluster(partitions=PARTS, initial_nodes=3, ephemeral=False) as cl:
            dirs = {}
            for i in (1, 2, 3):
                self.durable_node(cl, "n%d" % i, dirs)
            cl.wait_assigned(3)
            before = {p: o for p, o in cl.owners(cl.nodes["n1"]).items()}
            w = Writers(cl).start()
            try:
                w.wait_acked(300)
                scan, sreq, _ = cl.nodes["n1"].cache.methods["Scan"]
                page = scan(sreq(limit=5), timeout=RPC)
                self.durable_node(cl, "n4", dirs)
                s = self.settled(cl, 4, owner="n4")
                # a scan begun before the moves cannot vouch for every key: refused
                with self.assertRaises(grpc.RpcError) as e:
                    scan(sreq(limit=5, cursor=page.next_cursor), timeout=RPC)
                self.assertRpcFailure(RpcFailure(e.exception), grpc.StatusCode.INVALID_ARGUMENT, "INVALID_CURSOR")
                n_acked = len(w.acked)
                w.wait_acked(n_acked + 100)
            finally:
                w.stop()
            owned = {n["id"]: n["partitions"] for n in s["nodes"]}
            after = cl.owners(cl.nodes["n4"])
            moved = sum(1 for p in range(PARTS) if before[p] != after[p])
            self.assertGreater(owned["n4"], 0)
            self.assertTrue(all(after[p] == "n4" for p in range(PARTS) if before[p] != after[p]),
                            "a join moves partitions only to the new node")
            # the placement's bound on a join: 1/(n+1) + 0.12 of the partitions
            self.assertLessEqual(moved, int((1 / 4 + 0.12) * PARTS) + 1)
            self.assertLessEqual(max(owned.values()), 1.25 * PARTS / 4 + 1)
            handed = sum(metric(cl.nodes[i], "drey_cluster_moves_total") for i in ("n1", "n2", "n3"))
            self.assertEqual(handed, moved, "every move was a handover by its owner")
            pause = max(metric(cl.nodes[i], "drey_cluster_move_pause_max_seconds") for i in ("n1", "n2", "n3"))
            scanned, cursor = set(), ""
            while True:
                page = scan(sreq(limit=200, cursor=cursor), timeout=RPC)
                scanned.update(i.key for i in page.items)
                cursor = page.next_cursor
                if not cursor:
                    break
            self.assertEqual(set(w.acked) - scanned, set(), "a scan after the moves finds every key")
            print("join: %d partitions moved, %d writes acknowledged (%d gave up), longest pause %.1f ms" %
                  (moved, len(w.acked), w.failed, pause * 1000))
            self.check(cl, w)
            for n in cl.nodes.values():
                n.server.stop()

    def test_a_node_drains_on_sigterm_while_clients_write(self):
        with Cluster(partitions=PARTS, initial_nodes=4, ephemeral=False) as cl:
            dirs = {}
            for i in (1, 2, 3, 4):
                self.durable_node(cl, "n%d" % i, dirs, flags=("--cluster-drain-timeout=60s",))
            cl.wait_assigned(4)
            w = Writers(cl).start()
            try:
                w.wait_acked(300)
                leaving = cl.nodes["n2"]
                had = next(n["partitions"] for n in cl.status()["nodes"] if n["id"] == "n2")
                self.assertGreater(had, 0)
                leaving.server.signal(signal.SIGTERM)
                self.assertEqual(leaving.server.wait(timeout=90), 0)
                self.assertIsNotNone(leaving.server.find_log(lambda r: r.get("msg") == "drained: every copy this node held is on the others"))
                s = self.settled(cl, 3)
                self.assertNotIn("n2", {n["id"] for n in s["nodes"]})
                n_acked = len(w.acked)
                w.wait_acked(n_acked + 100)
            finally:
                w.stop()
            print("drain: %d partitions moved off n2, %d writes acknowledged (%d gave up)" %
                  (had, len(w.acked), w.failed))
            self.check(cl, w)
            for n in cl.nodes.values():
                if n.server.proc.poll() is None:
                    n.server.stop()

    def test_the_controller_killed_mid_move_is_replaced_and_the_moves_finish(self):
        # Slow moves (a rate cap, preloaded data) so the kill lands among them.
        flags = ("--cluster-move-rate=64KiB",)
        with Cluster(partitions=PARTS, initial_nodes=3, ephemeral=False) as cl:
            dirs = {}
            for i in (1, 2, 3):
                self.durable_node(cl, "n%d" % i, dirs, flags=flags)
            cl.wait_assigned(3)
            w = Writers(cl, value_bytes=2048).start()
            try:
                w.wait_acked(1500, timeout=120)
                put, preq, _ = cl.nodes["n1"].cache.methods["Set"]
                for i in range(300):
                    put(preq(cache="junk", key="j%d" % i, value=make_value(b"j" * 2048)), timeout=RPC)
                self.durable_node(cl, "n4", dirs, flags=flags)
                poll(cl.status, lambda s: s["moves"], what="moves planned")
                victim = cl.status()["controller"]
                self.assertIn(victim, ("n1", "n2", "n3"))
                wait_until(lambda: sum(metric(cl.nodes[i], "drey_cluster_moves_total")
                                       for i in ("n1", "n2", "n3")) >= 1, timeout=60, what="a first handover")
                self.assertTrue(cl.status()["moves"], "the kill lands while moves remain")
                # a Clear while copies are under way: each partition's Clear
                # is one of its writes, a copy it lands in starts again, so
                # nothing cleared comes back through a copy
                clear, creq, _ = cl.nodes["n4"].cache.methods["Clear"]

                def cleared():
                    try:
                        clear(creq(cache="junk"), timeout=RPC)
                        return True
                    except grpc.RpcError as e:
                        f = RpcFailure(e)
                        self.assertIn(f.reason, ("PARTITION_MOVING", "CLEAR_INCOMPLETE", "NOT_PRIMARY"), f.message)
                        self.assertIsNotNone(f.retry_info, f.message)
                        return False
                wait_until(cleared, timeout=60, what="a Clear during the moves")
                cl.nodes[victim].server.kill()
                poll(cl.status, lambda s: s["controller"] not in ("", victim), timeout=60,
                     what="another controller")
                # the dead node's own moves wait for it; it returns with its journal
                self.durable_node(cl, victim, dirs, flags=flags)
                self.settled(cl, 4, owner="n4")
                n_acked = len(w.acked)
                w.wait_acked(n_acked + 50)
            finally:
                w.stop()
            owned = {n["id"]: n["partitions"] for n in cl.status()["nodes"]}
            self.assertGreater(owned["n4"], 0)
            for n in cl.nodes.values():
                stats, sreq, _ = n.cache.methods["GetCacheStats"]
                self.assertEqual(stats(sreq(cache="junk"), timeout=RPC).entries, 0, "a cleared entry came back")
            print("controller kill: %s killed, %d writes acknowledged (%d gave up)" % (victim, len(w.acked), w.failed))
            self.check(cl, w)
            for n in cl.nodes.values():
                n.server.stop()


class InternalService(DreyTestCase):
    SERVER_FLAGS = None

    def test_partitions_are_served_only_to_peers_and_never_over_an_owner(self):
        with Cluster(partitions=8, initial_nodes=2) as cl:
            n1, _ = cl.start(2)
            cl.wait_assigned(2)
            owners = poll(lambda: cl.owners(n1), lambda o: all(o.values()), what="a full table")
            mine = next(p for p in range(8) if owners[p] == "n1")
            theirs = next(p for p in range(8) if owners[p] == "n2")
            mv = self.pb.move

            epochs = {x.id: x.epoch for x in cl.topology(n1).partitions}

            def import_req(p, key):
                e = mv.MovedEntry(cache=b"", key=key.encode(), kind=1, value=b"injected", version=1)
                return mv.ImportRequest(partition=p, partitions=8, replace=True, entries=[e], epoch=epochs[p])

            key_mine = next(k for k in ("k%d" % i for i in range(500)) if partition("", k, 8) == mine)
            key_theirs = next(k for k in ("k%d" % i for i in range(500)) if partition("", k, 8) == theirs)
            set_, sreq, _ = n1.cache.methods["Set"]
            set_(sreq(key=key_mine, value=make_value("live")), timeout=RPC)

            # the public listener does not even know the service
            stub = ServiceClient(n1.channel, mv, "drey.internal.v1.Partitions")
            fn, _, _ = stub.methods["Import"]
            with self.assertRaises(grpc.RpcError) as e:
                fn(import_req(theirs, key_theirs), timeout=RPC)
            self.assertEqual(e.exception.code(), grpc.StatusCode.UNIMPLEMENTED)

            port = n1.server.find_log(lambda r: r.get("msg") == "listening")["internal_port"]
            cert, key = cl.ca.issue("n9")

            def read(path):
                with open(path, "rb") as f:
                    return f.read()

            creds = grpc.ssl_channel_credentials(root_certificates=read(cl.ca.ca), private_key=read(key),
                                                 certificate_chain=read(cert))
            with grpc.secure_channel("127.0.0.1:%d" % port, creds,
                                     options=[("grpc.ssl_target_name_override", "n1")]) as ch:
                fn, _, _ = ServiceClient(ch, mv, "drey.internal.v1.Partitions").methods["Import"]
                # a peer must say who it is, and be it
                with self.assertRaises(grpc.RpcError) as e:
                    fn(import_req(theirs, key_theirs), timeout=RPC)
                self.assertRpcFailure(RpcFailure(e.exception), grpc.StatusCode.UNAUTHENTICATED,
                                      "PEER_UNAUTHENTICATED")
                with self.assertRaises(grpc.RpcError) as e:
                    fn(import_req(theirs, key_theirs), timeout=RPC, metadata=[("drey-forwarded-by", "n2")])
                self.assertRpcFailure(RpcFailure(e.exception), grpc.StatusCode.UNAUTHENTICATED,
                                      "PEER_UNAUTHENTICATED")
                md = [("drey-forwarded-by", "n9")]
                # an import over a partition its node owns would replace live data
                with self.assertRaises(grpc.RpcError) as e:
                    fn(import_req(mine, key_mine), timeout=RPC, metadata=md)
                f = RpcFailure(e.exception)
                self.assertRpcFailure(f, grpc.StatusCode.FAILED_PRECONDITION, "PARTITION_OWNED")
                self.assertEqual(f.metadata["partition"], str(mine))
                get, greq, _ = n1.cache.methods["Get"]
                self.assertEqual(value_of(get(greq(key=key_mine), timeout=RPC).value), "live")
                # one of another partition is refused too: no plan in the
                # table names this node the target of a copy from n9
                with self.assertRaises(grpc.RpcError) as e:
                    fn(import_req(theirs, key_theirs), timeout=RPC, metadata=md)
                self.assertRpcFailure(RpcFailure(e.exception), grpc.StatusCode.FAILED_PRECONDITION,
                                      "COPY_NOT_PLANNED")
                self.assertFalse(get(greq(key=key_theirs), timeout=RPC).found)
            for n in cl.nodes.values():
                n.server.stop()


if __name__ == "__main__":
    main()
