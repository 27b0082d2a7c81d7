"""The replication scenarios' harness: a cluster of three nodes with factor
2 (or the nodes and factor given) under NemesisCluster, the three workloads
writing through random nodes, and the checks every scenario ends with (see
test_replication.py's docstring for what they prove)."""
import signal
import time

import grpc

from drey_checkers import Client, CounterWorkload, RegisterWorkload, SetWorkload, check_table_history, \
    read_table_history
from drey_cluster import metric, partition, peer_channel, tag_for, wait_until
from drey_harness import ServiceClient
from drey_nemesis import NemesisCluster
from drey_tokens import details as readiness

PARTS = 16
LEASE_TTL_S = 2


def details(node, part="cluster"):
    return readiness(node.server)[part]


class Scenario:
    """A three-node cluster with factor 2 (or the nodes and factor given)
    and the three workloads."""

    def __init__(self, test, ids=("n1", "n2", "n3"), durable=True, extra_flags=(), started=3, replication_factor=2,
                 node_flags=None, prepare=None, partition=None):
        """node_flags: id -> more flags for that node; prepare(cl) runs
        before the nodes start (a data directory elsewhere, say);
        partition: every workload key in that partition (hash tags), for a
        fault aimed at it."""
        self.partition = partition
        self.node_flags = node_flags or {}
        self.prepare = prepare
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
            if self.prepare is not None:
                self.prepare(self.cl)
            for i in self.cl.ids[:self.started]:
                self.cl.launch(i, flags=self.node_flags.get(i, ()))
            self.settle()
            client = self.client = Client(self.cl.live, rpc_timeout=3, attempts=60, backoff=0.05)
            tag = lambda cache: "" if self.partition is None else tag_for(cache, self.partition, PARTS)
            self.workloads = [RegisterWorkload(client, threads=2, prefix=tag("cas")),
                              SetWorkload(client, threads=2, name="set", prefix=tag("set")),
                              CounterWorkload(client, threads=2, prefix=tag("ctr"))]
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

    def stop_workloads(self):
        for w in self.workloads:
            w.stop_flag.set()
        self.client.stopping.set()
        for w in self.workloads:
            w.stop()
        self.client.stopping.clear()

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

    def restored(self):
        """Whether every running node routes with the same table, each
        partition led by a running node with the factor's in-sync backups
        on running nodes, no copy or move under way. Unlike settle this
        does not ask that nothing waits for a backup: for while the
        workloads write."""
        nodes = self.running()
        ids = {n.id for n in nodes}
        tables = [self.table(n, joining=True) for n in nodes]
        if any(t != tables[0] for t in tables):
            return False
        return all(primary in ids and len(replicas) == min(self.rf, len(ids)) - 1 and set(replicas) <= ids
                   and primary not in replicas and not joining
                   for primary, replicas, joining in tables[0].values())

    def settle(self, timeout=60):
        """Until every running node has the same complete table with the
        factor's backups for every partition (as many as the running nodes
        allow), no copy under way, and nothing waits for a backup."""
        nodes = self.running()
        started = time.time()
        backups = min(self.rf, len(nodes)) - 1
        why = ["nothing sampled"]  # the last sample's reason, for the timeout's message

        def unsettled(reason):
            why[0] = reason
            return None

        def sample():
            tables = [self.table(n, joining=True) for n in nodes]
            if any(t != tables[0] for t in tables):
                return unsettled("the nodes' tables differ: %s" % tables)
            ids = {n.id for n in nodes}
            for p, (primary, replicas, joining) in tables[0].items():
                if primary not in ids or len(replicas) != backups or primary in replicas or \
                        not set(replicas) <= ids:
                    return unsettled("partition %d: primary %s, in sync %s" % (p, primary, replicas))
                if joining:
                    return unsettled("partition %d: copies under way to %s" % (p, joining))
            for n in nodes:
                d = details(n)
                if d.get("movesWaiting", 0):
                    return unsettled("%s: the controller holds %s moves back while partitions settle" % (
                        n.id, d["movesWaiting"]))
                if d["underReplicatedPartitions"] != 0 or d["replicationPending"] != 0:
                    waiting = ["partition %s: %s pending, the oldest %s ms, in sync %s" % (
                        r["partition"], r.get("pending", 0), r.get("lagMs", 0), r.get("inSync", []))
                        for r in d.get("replicas", []) if r.get("pending")]
                    return unsettled("%s: %s under-replicated, %s pending (%s)" % (
                        n.id, d["underReplicatedPartitions"], d["replicationPending"], "; ".join(waiting)))
            return tables[0]

        def settled():
            # the same for longer than the controller's period (a second),
            # so it had its look and planned nothing more
            first = sample()
            if first is None:
                return False
            time.sleep(1.5)
            return sample() == first

        wait_until(settled, timeout=timeout,
                   what=lambda: "the replication factor restored on every partition (%s)" % why[0])
        return time.time() - started

    def stop_and_check(self, min_ok=10, written_by_test=None, keep_copies=()):
        """written_by_test: partition -> epochs of entries the test wrote
        into etcd itself (see check_table_history); keep_copies: nodes
        that cannot drop a copy (their journal failed)."""
        self.stop_workloads()
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
        self.wait_no_roleless_copies(keep_copies)
        history = read_table_history(self.cl)
        print("table history: %d revisions of %d entries" % (sum(map(len, history.values())), len(history)))
        self.test.assertEqual(check_table_history(history, self.rf, written_by_test), [],
                              "illegal partition table transitions")

    # --- a node's own copy, through its internal listener ---

    def hashes(self, node, parts):
        with peer_channel(self.cl, node, "n9") as ch:
            fn, req, _ = ServiceClient(ch, self.cl.pb.move, "drey.internal.v1.Replica").methods["Hash"]
            resp = fn(req(partitions=PARTS, partition=parts), timeout=10, metadata=[("drey-forwarded-by", "n9")])
        return {h.partition: (h.entries, h.hash) for h in resp.partitions}

    def roleless_copies(self, keep_copies=()):
        """(node, partition, entries) for each copy a node holds of a
        partition the table names it in no role in."""
        table = self.table(self.running()[0])
        found = []
        for n in self.running():
            if n.id in keep_copies:
                continue
            for p, (entries, _) in self.hashes(n, list(range(PARTS))).items():
                primary, replicas = table[p]
                if entries > 0 and n.id != primary and n.id not in replicas:
                    found.append((n.id, p, entries))
        return found

    def wait_no_roleless_copies(self, keep_copies=(), timeout=20):
        """Until no node holds a copy the table gives it no role in: each
        drops such a copy (a journaled, epoch-checked Drop) a moment after
        it sees the table."""
        left = [None]

        def none():
            left[0] = self.roleless_copies(keep_copies)
            return not left[0]
        wait_until(none, timeout=timeout, what=lambda: "copies held without a role dropped (%s)" % left[0])

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
