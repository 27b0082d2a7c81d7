"""Concurrency smoke: many client threads on several connections hammering
shared keys. Increment totals are exact, compare-and-set loses no update,
exactly one racer wins Add/GetOrAdd/Remove, versions are never reused and a
reader never sees a key's version go backwards."""

import random
import threading

import grpc

from drey_harness import CACHE_SERVICE, DreyTestCase, ServiceClient, main, make_value, value_of

THREADS = 8
CHANNELS = 4


class ConcurrencyTest(DreyTestCase):
    SERVER_FLAGS = ("--workers=4",)

    def setUp(self):
        self.clients = [ServiceClient(self.server.channel(), self.pb.cache, CACHE_SERVICE) for _ in range(CHANNELS)]

    def run_threads(self, fn, n=THREADS):
        """Runs fn(i, client) on n threads started together; re-raises the
        first failure; returns the results in thread order."""
        barrier = threading.Barrier(n)
        results, errors = [None] * n, []

        def body(i):
            try:
                barrier.wait(30)
                results[i] = fn(i, self.clients[i % CHANNELS])
            except BaseException as e:  # reported below
                errors.append(e)
        threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
            self.assertFalse(t.is_alive(), "a worker thread hung")
        if errors:
            raise errors[0]
        return results

    def test_mixed_load_on_shared_keys(self):
        pb = self.pb.cache
        counters = ["ctr-%d" % i for i in range(3)]
        shared = ["shared-%d" % i for i in range(4)]
        ops = 150

        def work(i, c):
            rnd = random.Random(i)
            added = {k: 0 for k in counters}
            versions = []
            last_seen = {}
            for n in range(ops):
                k = rnd.choice(counters)
                d = rnd.randint(-5, 20)
                r = c.Increment(pb.IncrementRequest(key=k, delta=d), timeout=60)
                added[k] += d
                versions.append(r.version)
                sk = rnd.choice(shared)
                val = "t%d-%d" % (i, n)
                s = c.Set(pb.SetRequest(key=sk, value=make_value(val)), timeout=60)
                versions.append(s.version)
                g = c.Get(pb.GetRequest(key=sk), timeout=60)
                self.assertTrue(g.found)
                self.assertRegex(value_of(g.value), r"^t\d+-\d+$")
                self.assertGreaterEqual(g.version, s.version, "read an older version than this thread wrote")
                self.assertGreaterEqual(g.version, last_seen.get(sk, 0), "a key's version went backwards")
                last_seen[sk] = g.version
                m = c.GetMany(pb.GetManyRequest(keys=shared + counters), timeout=60)
                self.assertEqual([x.key for x in m.results], shared + counters)
            return added, versions

        results = self.run_threads(work)
        for k in counters:
            expected = sum(r[0][k] for r in results)
            self.assertEqual(self.get_value(k), expected, "Increment lost or doubled an update on %s" % k)
        versions = [v for r in results for v in r[1]]
        self.assertEqual(len(versions), len(set(versions)), "a version was handed out twice")
        for r in results:
            self.assertEqual(r[1], sorted(r[1]), "one thread's writes got decreasing versions")

    def test_compare_and_set_loses_no_update(self):
        pb = self.pb.cache
        key = self.key()
        self.set(key, 0)
        per_thread = 25

        def work(i, c):
            conflicts = 0
            for _ in range(per_thread):
                while True:
                    g = c.Get(pb.GetRequest(key=key), timeout=60)
                    try:
                        c.Set(pb.SetRequest(key=key, value=make_value(g.value.int64_value + 1), if_version=g.version),
                              timeout=60)
                        break
                    except grpc.RpcError as e:
                        self.assertEqual(e.code(), grpc.StatusCode.FAILED_PRECONDITION)
                        conflicts += 1
            return conflicts

        self.run_threads(work)
        self.assertEqual(self.get_value(key), THREADS * per_thread)

    def test_exactly_one_racer_wins(self):
        pb = self.pb.cache
        for round_ in range(10):
            ka, kg, kr, kc = (self.key("add%d" % round_), self.key("goa%d" % round_), self.key("rm%d" % round_),
                              self.key("cas%d" % round_))
            self.set(kr, "doomed")

            def work(i, c):
                a = c.Add(pb.AddRequest(key=ka, value=make_value(i)), timeout=60)
                g = c.GetOrAdd(pb.GetOrAddRequest(key=kg, value=make_value(i)), timeout=60)
                r = c.Remove(pb.RemoveRequest(key=kr, return_previous=True), timeout=60)
                try:
                    c.Set(pb.SetRequest(key=kc, value=make_value(i), if_version=0), timeout=60)
                    cas = True
                except grpc.RpcError as e:
                    self.assertEqual(e.code(), grpc.StatusCode.FAILED_PRECONDITION)
                    cas = False
                return a, g, r, cas

            res = self.run_threads(work)
            adds = [r[0] for r in res]
            winners = [i for i, a in enumerate(adds) if a.added]
            self.assertEqual(len(winners), 1, "Add: %d winners" % len(winners))
            self.assertEqual(self.get_value(ka), winners[0])
            self.assertEqual({a.version for a in adds}, {adds[winners[0]].version})
            for i, a in enumerate(adds):
                if not a.added:
                    self.assertEqual(value_of(a.current_value), winners[0])
            goas = [r[1] for r in res]
            gw = [i for i, g in enumerate(goas) if g.added]
            self.assertEqual(len(gw), 1, "GetOrAdd: %d winners" % len(gw))
            self.assertEqual({value_of(g.value) for g in goas}, {gw[0]})
            self.assertEqual({g.version for g in goas}, {goas[gw[0]].version})
            removed = [r[2] for r in res if r[2].removed]
            self.assertEqual(len(removed), 1, "Remove: %d winners" % len(removed))
            self.assertEqual(value_of(removed[0].previous), "doomed")
            self.assertEqual(sum(1 for r in res if r[3]), 1, "Set(if_version=0): not exactly one winner")

    def test_set_many_is_all_or_nothing_under_contention(self):
        """Writers race SetMany over the same keys with if_version=0 on a
        fresh key each round: exactly one batch lands, whole."""
        pb = self.pb.cache
        E = pb.SetManyRequest.Entry
        for round_ in range(10):
            keys = [self.key("r%d-%d" % (round_, j)) for j in range(5)]

            def work(i, c):
                try:
                    c.SetMany(pb.SetManyRequest(entries=[E(key=k, value=make_value(i), if_version=0)
                                                         for k in keys]), timeout=60)
                    return True
                except grpc.RpcError as e:
                    self.assertEqual(e.code(), grpc.StatusCode.FAILED_PRECONDITION)
                    return False
            res = self.run_threads(work)
            self.assertEqual(sum(res), 1)
            winner = res.index(True)
            got = self.call("GetMany", keys=keys)
            self.assertEqual([value_of(x.value) for x in got.results], [winner] * 5, "a batch was applied in part")

    def test_overlapping_batches_in_opposite_orders(self):
        """SetMany locks every key's shard: batches naming the same keys in
        opposite orders must neither deadlock nor interleave."""
        pb = self.pb.cache
        E = pb.SetManyRequest.Entry
        keys = [self.key(str(j)) for j in range(40)]

        def work(i, c):
            order = keys if i % 2 == 0 else list(reversed(keys))
            for n in range(30):
                r = c.SetMany(pb.SetManyRequest(entries=[E(key=k, value=make_value(i * 1000 + n)) for k in order]),
                              timeout=60)
                self.assertEqual(len(r.results), len(keys))
                g = c.GetMany(pb.GetManyRequest(keys=keys), timeout=60)
                self.assertTrue(all(x.found for x in g.results))
            return True

        self.run_threads(work)
        final = self.call("GetMany", keys=keys)
        self.assertEqual(len({value_of(x.value) for x in final.results}), 1,
                         "the last batch was not applied whole: %s" % sorted({value_of(x.value)
                                                                            for x in final.results}))


class EphemeralConcurrencyTest(ConcurrencyTest):
    """The same races without the journal's group commit (--ephemeral)."""
    SERVER_FLAGS = ("--workers=4", "--ephemeral")


if __name__ == "__main__":
    main()
