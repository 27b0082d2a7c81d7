"""Routing by key against three dreyd: a client that routes with the table
makes the nodes forward nothing, a plain one entering through one node is
forwarded for every key that node does not own (about 2/3 of them).

The forwarded calls are counted by each node itself (readiness details,
cluster.forwardedCalls). drey-bench --cluster waits for the first Topology
before it sends, so its run must forward exactly zero; the plain run's
share is checked against the share of partitions its entry node does not
own, which the table gives. The Python router (drey_cluster.Router) is held
to the same: zero forwards, while the same keys through one node forward
exactly the ones it does not own. A routing client that started with a
table of no owners learns the assignment from the stream while it runs.
A Pipeline entering through one node has each operation forwarded to its
key's owner, its answer (a refusal's details included) relayed in order.
"""
import json
import re
import subprocess

import grpc

from drey_cluster import Cluster, Router, drey_bench, partition
from drey_harness import BidiStream, DreyTestCase, main, make_value, value_of
from drey_tokens import details, http_get, ops_port, poll

PARTITIONS = 64
CALLS = 3000
RPC = 30


def forwarded(node):
    return int(details(node.server)["cluster"].get("forwardedCalls", 0))


def ok_gets(node):
    """Gets this node answered OK (directly, or as the owner of a forward)."""
    status, _, body = http_get("127.0.0.1", ops_port(node.server), "/metrics")
    assert status == 200
    m = re.search(r'^drey_requests_total\{method="/drey.cache.v1.Cache/Get",code="OK"\} (\d+)', body.decode(), re.M)
    return int(m.group(1)) if m else 0


class Routing(DreyTestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.cluster = Cluster(partitions=PARTITIONS, initial_nodes=3).__enter__()
        cls.nodes = cls.cluster.start(3)
        cls.cluster.wait_assigned(3)
        # Every node's own table full, so no node forwards for lack of one.
        for n in cls.nodes:
            poll(lambda n=n: cls.cluster.owners(n), lambda o: all(o.values()), what="a full table at " + n.id)
        cls.owners = cls.cluster.owners(cls.nodes[0])

    @classmethod
    def tearDownClass(cls):
        for n in cls.nodes:
            n.server.stop()
        cls.cluster.__exit__(None, None, None)
        super().tearDownClass()

    def totals(self):
        return {n.id: forwarded(n) for n in self.nodes}

    def delta(self, before):
        after = self.totals()
        return {k: after[k] - before[k] for k in after}

    def bench(self, *flags):
        out = subprocess.run(
            [drey_bench(), "--target=" + self.nodes[0].server.address, "--connections=2", "--streams=8",
             "--count=%d" % CALLS, "--mix=get:1,set:1", "--keys=5000", "--value-bytes=16", "--json"] + list(flags),
            capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        r = json.loads(out.stdout)
        self.assertEqual(r["calls"], CALLS)
        self.assertEqual(r["errors"], 0, r["errors_by_status"])
        return r

    def not_owned_share(self, node_id):
        return sum(1 for p in self.owners.values() if p != node_id) / PARTITIONS

    def test_drey_bench_cluster_routes_every_call_to_its_owner(self):
        before = self.totals()
        r = self.bench("--cluster")
        self.assertTrue(r["cluster"])
        self.assertEqual(self.delta(before), {n.id: 0 for n in self.nodes}, "a routed run forwards nothing")

    def test_drey_bench_cluster_pipeline_sends_every_operation_on_its_owners_stream(self):
        before = self.totals()
        r = self.bench("--cluster", "--pipeline=16")
        self.assertTrue(r["cluster"])
        self.assertEqual(self.delta(before), {n.id: 0 for n in self.nodes}, "a routed pipeline forwards nothing")
        before = self.totals()
        self.bench("--pipeline=16")
        self.assertGreater(self.delta(before)["n1"], 0, "the same load through n1 alone is forwarded")

    def test_plain_drey_bench_through_one_node_is_forwarded_for_the_keys_it_does_not_own(self):
        before = self.totals()
        r = self.bench()
        self.assertFalse(r["cluster"])
        d = self.delta(before)
        self.assertEqual(d["n2"], 0)
        self.assertEqual(d["n3"], 0)
        share = d["n1"] / CALLS
        want = self.not_owned_share("n1")
        self.assertGreater(want, 0.4, "three nodes share the partitions: %r" % self.owners)
        # 3000 uniform calls over 5000 keys: the share's standard deviation is
        # under 0.01.
        self.assertAlmostEqual(share, want, delta=0.06)

    def test_a_pipeline_through_one_node_relays_every_owners_answer(self):
        pb = self.cluster.pb.cache
        n1 = self.nodes[0]
        keys = ["pipe-%d" % i for i in range(60)]
        remote = [k for k in keys if self.owners[partition("", k, PARTITIONS)] != "n1"]
        self.assertTrue(remote)
        cas_key = next(k for k in ("pipe-cas-%d" % i for i in range(1000))
                       if self.owners[partition("", k, PARTITIONS)] != "n1")
        cas = pb.SetRequest(key=cas_key, value=make_value(b"cas"), if_version=999999999)
        with self.assertRpcError(grpc.StatusCode.FAILED_PRECONDITION, "VERSION_MISMATCH") as e:
            n1.cache.Set(cas, timeout=RPC)
        unary = e.failure
        before = self.totals()
        s = BidiStream(n1.cache.Pipeline, timeout=60)
        self.addCleanup(s.cancel)
        ops = []
        for i, k in enumerate(keys):
            ops.append(pb.PipelineOperation(id=2 * i, set=pb.SetRequest(key=k, value=make_value(b"v%d" % i))))
            ops.append(pb.PipelineOperation(id=2 * i + 1, get=pb.GetRequest(key=k)))
        ops.append(pb.PipelineOperation(id=1000, set=cas))
        s.send(pb.PipelineRequest(operations=ops))
        got = []
        while len(got) < len(ops):
            got.extend(s.recv().results)
        self.assertEqual([r.id for r in got], [o.id for o in ops])
        for i in range(len(keys)):
            self.assertEqual(got[2 * i].status.code, 0, got[2 * i])
            self.assertEqual(got[2 * i].WhichOneof("response"), "set", got[2 * i])
            self.assertEqual(value_of(got[2 * i + 1].get.value), b"v%d" % i, "a get sees the set before it")
            self.assertEqual(got[2 * i + 1].get.version, got[2 * i].set.version, got[2 * i + 1])
            self.assertGreater(got[2 * i].set.version, 0)
        refused = got[-1].status
        self.assertEqual(refused.code, unary.code.value[0])
        self.assertEqual(refused.SerializeToString(), unary.status.SerializeToString(),
                         "the owner's google.rpc.Status, relayed as the unary call relays it")
        self.assertEqual(s.close(), [])
        d = self.delta(before)
        self.assertEqual(d["n1"], 2 * len(remote) + 1, "one forward per operation on another node's key")
        # An owner's answer is relayed as the owner encoded it: the bytes
        # of a forwarded result decode as the owner's unary answer does.
        k = remote[0]
        i = keys.index(k)
        owner = next(n for n in self.nodes if n.id == self.owners[partition("", k, PARTITIONS)])
        direct = owner.cache.Get(pb.GetRequest(key=k), timeout=RPC)
        self.assertEqual(got[2 * i + 1].get.SerializeToString(), direct.SerializeToString())

    def test_the_python_router_goes_to_the_owner(self):
        router = Router(self.cluster, self.nodes[1])
        self.assertEqual(router.partitions, PARTITIONS)
        keys = ["route-%d" % i for i in range(120)] + ["{tag}.a", "{tag}.b"]
        pb = self.cluster.pb.cache
        before = self.totals()
        for k in keys:
            router.client_for(k).Set(pb.SetRequest(key=k, value=make_value(b"v")), timeout=RPC)
        self.assertEqual(self.delta(before), {n.id: 0 for n in self.nodes})
        # The same keys through one node: exactly those it does not own are
        # forwarded.
        n1 = self.nodes[0]
        before = self.totals()
        for k in keys:
            n1.cache.Get(pb.GetRequest(key=k), timeout=RPC)
        d = self.delta(before)
        not_owned = sum(1 for k in keys if self.owners[partition("", k, PARTITIONS)] != "n1")
        self.assertEqual(d["n1"], not_owned)
        self.assertGreater(not_owned, 0)


class LearnsTheTable(DreyTestCase):
    def test_a_running_client_learns_the_assignment_from_the_stream(self):
        with Cluster(partitions=16, initial_nodes=3) as c:
            n1 = c.start_node("n1")
            bench = subprocess.Popen(
                [drey_bench(), "--target=" + n1.server.address, "--cluster", "--connections=1", "--streams=4",
                 "--duration=120s", "--warmup=0", "--mix=get:1", "--keys=1000", "--timeout=5s", "--json"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                # Its first table has no owners (two nodes are missing): every
                # call goes to the seed and is refused there.
                poll(lambda: details(n1.server)["cluster"].get("unavailableAnswers", 0), lambda v: int(v) > 0,
                     what="the client's calls refused for want of owners")
                nodes = [n1, c.start_node("n2"), c.start_node("n3")]
                c.wait_assigned(3)
                for n in nodes:
                    poll(lambda n=n: c.owners(n), lambda o: all(o.values()), what="a full table at " + n.id)
                # Once the client has the new table, n2 and n3 get its calls
                # directly and n1 forwards none of them any more: a window of
                # 200 Gets on every node with no forward (the client may take
                # a moment to see the table: windows are tried until one is
                # clean or the deadline passes).
                def clean_window():
                    f0 = sum(forwarded(n) for n in nodes)
                    base = {n.id: ok_gets(n) for n in nodes}
                    poll(lambda: min(ok_gets(n) - base[n.id] for n in nodes), lambda v: v >= 200,
                         what="200 more Gets on every node")
                    return sum(forwarded(n) for n in nodes) == f0

                poll(clean_window, lambda clean: clean, what="the running client routing by the new table")
                self.assertIsNone(bench.poll(), bench.stderr.read() if bench.poll() is not None else "")
            finally:
                bench.kill()
                bench.wait()
                bench.stderr.close()
            for n in nodes:
                n.server.stop()


class PipelineLanes(DreyTestCase):
    def test_a_pipeline_lane_whose_owner_is_gone_says_why(self):
        """drey-bench --cluster --pipeline keeps a stream per owner; when one
        cannot be had (its owner killed, the table still naming it for the
        lease's time), the failure says what the stream ended with, not only
        that its results did not come."""
        with Cluster(partitions=16, initial_nodes=2, lease_ttl="60s") as c:
            n1, n2 = c.start(2)
            c.wait_assigned(2)
            poll(lambda: c.owners(n1), lambda o: all(o.values()), what="a full table at n1")
            n2.server.kill()
            out = subprocess.run(
                [drey_bench(), "--target=" + n1.server.address, "--cluster", "--pipeline=16", "--connections=1",
                 "--count=200", "--mix=set:1", "--keys=1000", "--timeout=5s", "--json"],
                capture_output=True, text=True, timeout=120)
            self.assertEqual(out.returncode, 1, out.stderr)
            self.assertRegex(out.stderr, r"Pipeline: \d+ of \d+ results did not come; the stream ended UNAVAILABLE: "
                                         r"failed to connect")
            n1.server.stop()


if __name__ == "__main__":
    main()
