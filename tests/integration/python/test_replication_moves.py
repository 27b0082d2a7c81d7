"""Moves with replicas, and the rule that keeps them from losing
acknowledged writes: a copy in a partition's in-sync set is never replaced,
truncated or partly overwritten, and only such copies are promoted.

An outside history checker lost thousands of acknowledged writes when the
controller planned a move of a partition's primary role onto the node that
already was its in-sync backup: the move's first chunk replaced that
backup's copy with the partition as it was when the copy began, the backup
stayed in the in-sync set, the primary died mid-move, and the backup was
promoted with the first chunk only. These tests make that sequence happen,
exactly and with slow moves at several timings, while the register, set
and counter workloads write to the partition being moved:

- the reported plan (the primary role onto the in-sync backup, written into
  etcd as that controller wrote it) with the primary killed once the move
  began: every acknowledged write is still there;
- a slow move onto a node holding no copy, the primary killed after one,
  two or three of its chunks: the partial copy is never promoted;
- a new backup half copied when the primary dies: the partition waits for
  its primary instead of failing over to the half copy;
- the target of a slow move killed mid-move: the primary keeps the
  partition and the move is tried again;
- a hand-made Import to an in-sync backup is refused and changes nothing.

After each: the cluster settles, the workloads' histories pass their
checkers, every backup hashes like its primary, and every revision of
the partition table is a legal edit (check_table_history).
"""
import random
import time

import grpc

from drey_checkers import Entry, read_entry, write_entry
from drey_cluster import peer_channel, tag_for, wait_until
from drey_harness import DreyTestCase, RpcFailure, ServiceClient, main, make_value
from drey_replication import PARTS, Scenario, details

P = 3                    # the partition the tests move
BULK_VALUE = 64 * 1024
BULK_KEYS = 64           # 4 MiB in P: four 1 MiB chunks at --cluster-move-rate=1MiB, a second apart
SLOW = ("--cluster-move-rate=1MiB",)


def load_bulk(s, via, keys=BULK_KEYS):
    """Acknowledged Sets of BULK_VALUE bytes into P through via (new keys
    each time); key -> version."""
    tag = tag_for("bulk", P, PARTS)
    fn, req, _ = via.cache.methods["Set"]
    out = {}
    s.bulk = getattr(s, "bulk", 0) + keys
    for i in range(s.bulk - keys, s.bulk):
        key = "%sbulk-%d" % (tag, i)
        out[key] = fn(req(cache="bulk", key=key, value=make_value(bytes([i % 251]) * BULK_VALUE)), timeout=30).version
    return out


def missing_bulk(via, acked):
    """The acknowledged bulk writes via does not return as written."""
    fn, req, _ = via.cache.methods["Get"]
    out = []
    for key, version in sorted(acked.items()):
        deadline = time.time() + 15
        while True:
            try:
                g = fn(req(cache="bulk", key=key), timeout=5)
                break
            except grpc.RpcError as e:  # a failover's moment: the lease, the table
                if e.code() != grpc.StatusCode.UNAVAILABLE or time.time() > deadline:
                    raise
            time.sleep(0.05)
        if not g.found or g.version != version:
            out.append("%s: version %d acknowledged, read %s" % (key, version, g.version if g.found else "nothing"))
    return out


class Moves(DreyTestCase):
    SERVER_FLAGS = None

    def test_the_primary_role_planned_onto_its_in_sync_backup_loses_nothing_when_the_primary_dies(self):
        """The reported history: `n1+n2` -> `n1+n2 joining n2` -> n1 killed
        -> n2 promoted. Today's rule: a plan onto an in-sync copy is a
        handover (no copy at all); the controller turns the reported
        plan into one, the mover never copies onto an in-sync node, and
        the node would refuse the copy anyway."""
        with Scenario(self, ids=("n1", "n2"), started=2, extra_flags=SLOW, partition=P) as s:
            via = s.running()[0]
            primary, (backup,) = s.table(via)[P]
            acked = load_bulk(s, s.cl.nodes[primary])
            s.progress()
            epoch, e = read_entry(s.cl, P)
            self.assertEqual((e.primary, set(e.replicas), e.joining, e.handover), (primary, {backup}, "", ""))
            target = s.cl.nodes[backup]
            held = lambda: s.hashes(target, [P])[P][0]
            before = held()
            planned = write_entry(s.cl, P, epoch, Entry(primary, e.replicas, e.syncing, joining=backup))
            self.assertIsNotNone(planned, "the entry moved on before the plan was written")
            # once a first chunk replaced the backup's copy (it holds fewer
            # entries: a copy), or the role moved (a handover)
            wait_until(lambda: held() < before or s.table(target)[P][0] == backup, timeout=30,
                       what="the move to begin")
            print("the backup held %d entries of partition %d, %d when %s was killed"
                  % (before, P, held(), primary))
            s.cl.kill(primary)
            wait_until(lambda: s.table(target)[P][0] == backup, timeout=30, what="%s to lead partition %d" % (backup, P))
            lost = missing_bulk(target, acked)
            self.assertEqual(lost, [], "%d of %d acknowledged writes lost" % (len(lost), len(acked)))
            s.cl.restart(primary)
            wait_until(s.restored, timeout=60, what="the factor restored")
            s.progress()
            s.stop_and_check(written_by_test={P: {planned}})


    def test_a_handover_loses_nothing_whenever_the_primary_dies(self):
        """The primary role handed to the in-sync backup (no copy), the
        primary killed at a random moment of it: before the pause, during
        the pause and the backup's confirmation, around the flip."""
        rng = random.Random()
        with Scenario(self, ids=("n1", "n2"), started=2, partition=P) as s:
            acked = {}
            for _ in range(2):
                via = s.running()[0]
                primary, (backup,) = s.table(via)[P]
                acked.update(load_bulk(s, s.cl.nodes[primary], keys=8))
                epoch, e = read_entry(s.cl, P)
                self.assertIsNotNone(write_entry(s.cl, P, epoch, Entry(primary, e.replicas, handover=backup)))
                delay = rng.uniform(0, 0.15)
                time.sleep(delay)  # when the fault strikes, not a wait for anything
                s.cl.kill(primary)
                target = s.cl.nodes[backup]
                wait_until(lambda: s.table(target)[P][0] == backup, timeout=30,
                           what="%s to lead partition %d" % (backup, P))
                lost = missing_bulk(target, acked)
                self.assertEqual(lost, [], "%d of %d acknowledged writes lost (%s killed %.3fs into a handover)"
                                 % (len(lost), len(acked), primary, delay))
                s.cl.restart(primary)
                wait_until(s.restored, timeout=60, what="the factor restored")
                s.progress()
            s.stop_and_check()

    def slow_move(self, victim, chunks):
        """A move of P onto a node holding no copy of it, at 1 MiB/s, with
        victim ("primary" or "target") killed once the target has taken
        `chunks` chunks."""
        with Scenario(self, extra_flags=SLOW, partition=P) as s:
            via = s.running()[0]
            primary, (backup,) = s.table(via)[P]
            target = next(i for i in s.cl.ids if i not in (primary, backup))
            acked = load_bulk(s, s.cl.nodes[primary])
            epoch, e = read_entry(s.cl, P)
            self.assertIsNotNone(write_entry(s.cl, P, epoch, Entry(primary, e.replicas, joining=target)))
            t = s.cl.nodes[target]
            per_chunk = (1 << 20) // BULK_VALUE
            wait_until(lambda: s.hashes(t, [P])[P][0] >= chunks * per_chunk, timeout=60,
                       what="%d chunks at %s" % (chunks, target))
            killed = primary if victim == "primary" else target
            s.cl.kill(killed)
            survivor = s.cl.nodes[backup]
            if victim == "primary":
                # the in-sync backup takes over, never the partial copy
                wait_until(lambda: s.table(survivor)[P][0] != primary, timeout=30, what="a failover")
                self.assertEqual(s.table(survivor)[P][0], backup, "the partition went to its partial copy")
            else:
                # the primary keeps the partition; the plan is cancelled
                wait_until(lambda: not s.table(survivor, joining=True)[P][2], timeout=30,
                           what="the move to %s cancelled" % target)
                self.assertEqual(s.table(survivor)[P][0], primary)
            lost = missing_bulk(survivor, acked)
            self.assertEqual(lost, [], "%d of %d acknowledged writes lost" % (len(lost), len(acked)))
            s.progress()
            s.cl.restart(killed)
            wait_until(s.restored, timeout=90, what="the factor restored")
            s.progress()
            s.stop_and_check()

    def test_a_slow_move_loses_nothing_when_the_primary_dies_between_chunks(self):
        self.slow_move("primary", random.choice([1, 2, 3]))

    def test_a_slow_move_loses_nothing_when_its_target_dies_between_chunks(self):
        self.slow_move("target", random.choice([1, 2]))


    def test_a_new_backup_half_copied_is_never_promoted(self):
        """The backup killed, a new one copied at 1 MiB/s, the primary
        killed after the copy's first chunk: the half copy is not in the
        in-sync set, so the partition waits for its primary (its data is
        on its disk) instead of failing over to it."""
        with Scenario(self, extra_flags=SLOW, partition=P) as s:
            via = s.running()[0]
            primary, (backup,) = s.table(via)[P]
            third = next(i for i in s.cl.ids if i not in (primary, backup))
            acked = load_bulk(s, s.cl.nodes[primary])
            s.cl.kill(backup)
            t = s.cl.nodes[third]
            wait_until(lambda: s.hashes(t, [P])[P][0] >= (1 << 20) // BULK_VALUE, timeout=60,
                       what="a first chunk at the new backup %s" % third)
            epoch, e = read_entry(s.cl, P)
            self.assertEqual((e.primary, e.replicas, e.syncing), (primary, frozenset(), frozenset([third])))
            s.cl.kill(primary)
            # past the primary's lease: the controller has looked, and waits
            wait_until(lambda: details(t)["members"] == 1, timeout=30, what="%s alone" % third)
            s.progress(ops=20)
            _, e = read_entry(s.cl, P)
            self.assertEqual(e.primary, primary, "the partition went to a copy that was not in sync: %r" % (e,))
            s.cl.restart(primary)
            lost = missing_bulk(s.cl.nodes[primary], acked)
            self.assertEqual(lost, [], "%d of %d acknowledged writes lost" % (len(lost), len(acked)))
            s.cl.restart(backup)
            wait_until(s.restored, timeout=90, what="the factor restored")
            s.progress()
            s.stop_and_check()


class CopyRules(DreyTestCase):
    """What a node takes from a peer that copies a partition, through its
    internal listener with the sender's own certificate: nothing that would
    replace or drop an in-sync copy, nothing the table did not plan."""
    SERVER_FLAGS = None

    def test_an_in_sync_copy_takes_no_import_and_no_drop(self):
        with Scenario(self, durable=False, partition=P) as s:
            s.stop_workloads()
            s.settle()
            via = s.running()[0]
            primary, (backup,) = s.table(via)[P]
            other = next(i for i in s.cl.ids if i not in (primary, backup))
            epoch, _ = read_entry(s.cl, P)
            mv = s.cl.pb.move
            entry = mv.MovedEntry(cache=b"bulk", key=b"planted", kind=1, value=b"x", version=1)
            refusals = lambda n: details(s.cl.nodes[n])["copiesRefused"]

            def refused(node, as_id, method, reason, **fields):
                n = s.cl.nodes[node]
                before, count = s.hashes(n, [P]), refusals(node)
                with peer_channel(s.cl, n, as_id) as ch:
                    service = "drey.internal.v1.Replica" if method == "Confirm" else "drey.internal.v1.Partitions"
                    fn, req, _ = ServiceClient(ch, mv, service).methods[method]
                    with self.assertRaises(grpc.RpcError) as e:
                        fn(req(partition=P, partitions=PARTS, **fields), timeout=10,
                           metadata=[("drey-forwarded-by", as_id)])
                self.assertEqual((e.exception.code(), RpcFailure(e.exception).reason),
                                 (grpc.StatusCode.FAILED_PRECONDITION, reason), "%s at %s" % (method, node))
                self.assertEqual(s.hashes(n, [P]), before, "a refused %s changed %s" % (method, node))
                self.assertEqual(refusals(node), count + 1)

            # the primary itself, at the current epoch: the backup is in sync
            refused(backup, primary, "Import", "IN_SYNC_COPY", epoch=epoch, replace=True, entries=[entry])
            refused(backup, primary, "Import", "IN_SYNC_COPY", epoch=epoch + 1000, replace=True)
            refused(backup, primary, "Drop", "IN_SYNC_COPY", epoch=epoch)
            refused(primary, backup, "Import", "PARTITION_OWNED", epoch=epoch, entries=[entry])
            # a node holding no copy, that no plan names
            refused(other, primary, "Import", "COPY_NOT_PLANNED", epoch=epoch, replace=True, entries=[entry])
            refused(other, primary, "Import", "STALE_EPOCH", epoch=epoch - 1, entries=[entry])
            # a plan newer than the node's table: ask again (the mover does,
            # for a second: the target's watch is a moment behind)
            refused(other, primary, "Import", "NOT_CAUGHT_UP", epoch=epoch + 1000, entries=[entry])
            # a handover's check: only the in-sync backup, from its primary,
            # once it has every write
            refused(backup, primary, "Confirm", "NOT_CAUGHT_UP", epoch=epoch, sequence=1 << 40)
            refused(backup, "n9", "Confirm", "NOT_REPLICA", epoch=epoch, sequence=0)
            refused(other, primary, "Confirm", "NOT_REPLICA", epoch=epoch, sequence=0)
            refused(backup, primary, "Confirm", "STALE_EPOCH", epoch=epoch - 1, sequence=0)
            with peer_channel(s.cl, s.cl.nodes[backup], primary) as ch:
                fn, req, _ = ServiceClient(ch, mv, "drey.internal.v1.Replica").methods["Confirm"]
                r = fn(req(partition=P, partitions=PARTS, epoch=epoch, sequence=0), timeout=10,
                       metadata=[("drey-forwarded-by", primary)])
                self.assertGreater(r.applied, 0)
            s.stop_and_check(min_ok=0)


if __name__ == "__main__":
    main()
