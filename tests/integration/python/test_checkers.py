"""The history checkers catch what they are for: each violation below is a
lost or reordered write a cluster under faults could produce, and a clean
history passes; likewise each illegal edit of a partition's entry. (The
checkers run against real clusters in test_cluster_moves, test_nemesis,
test_replication and test_replication_faults; here they are tried on
histories made by hand.)"""
import unittest

from drey_checkers import (Entry, History, check_counter, check_register, check_set, check_table_history,
                           counter_totals, set_outcomes)


def history(*ops):
    """ops: (kind, value, expected, version, outcome) in real-time order,
    each completing before the next is invoked unless outcome is 'unknown'."""
    h = History()
    for kind, value, expected, version, outcome in ops:
        op = h.invoke(kind, "k", value=value, expected=expected)
        if outcome == "ok":
            h.ok(op, value=value, version=version)
        elif outcome == "fail":
            h.fail(op)
        else:
            h.unknown(op)
    return h


INIT = {"k": ("v0", 1)}


class Register(unittest.TestCase):
    def test_a_clean_history_passes(self):
        h = history(("read", "v0", None, 1, "ok"), ("cas", "a", 1, 5, "ok"), ("read", "a", None, 5, "ok"),
                    ("cas", "b", 1, None, "fail"), ("cas", "c", 5, None, "unknown"), ("read", "c", None, 9, "ok"))
        self.assertEqual(check_register(h, INIT), [])

    def test_a_read_of_a_value_no_write_produced(self):
        h = history(("cas", "a", 1, 5, "ok"), ("read", "zz", None, 6, "ok"))
        self.assertTrue(any("no write produced" in p for p in check_register(h, INIT)))

    def test_a_read_that_goes_back_in_time(self):
        # the write of version 5 was acknowledged; a later read sees the old value: a lost write
        h = history(("cas", "a", 1, 5, "ok"), ("read", "v0", None, 1, "ok"))
        self.assertTrue(any("began after" in p for p in check_register(h, INIT)))

    def test_two_cas_from_one_version(self):
        h = history(("cas", "a", 1, 5, "ok"), ("cas", "b", 1, 6, "ok"))
        self.assertTrue(any("started from version 1" in p for p in check_register(h, INIT)))

    def test_a_version_reused(self):
        h = history(("cas", "a", 1, 5, "ok"), ("cas", "b", 5, 5, "ok"))
        problems = check_register(h, INIT)
        self.assertTrue(any("share a version" in p for p in problems))

    def test_a_read_that_mixes_a_version_and_another_value(self):
        h = history(("cas", "a", 1, 5, "ok"), ("read", "b", None, 5, "ok"))
        self.assertTrue(any("written as" in p for p in check_register(h, INIT)))


def outcomes(kind, *ops):
    """ops: (key, outcome) in order; increments have delta 1."""
    h = History()
    for key, outcome in ops:
        op = h.invoke(kind, key)
        op.delta = 1
        {"ok": h.ok, "fail": h.fail, "unknown": h.unknown}[outcome](op)
    return h


class Set(unittest.TestCase):
    H = outcomes("add", ("a", "ok"), ("b", "unknown"), ("c", "fail"), ("d", "ok"), ("e", "unknown"))

    def test_the_outcomes_of_a_history(self):
        self.assertEqual(set_outcomes(self.H), ({"a", "d"}, {"b", "e"}))

    def test_a_clean_end_passes_whatever_became_of_the_unknown(self):
        acked, unknown = set_outcomes(self.H)
        self.assertEqual(check_set(acked, unknown, {"a", "d"}), [])
        self.assertEqual(check_set(acked, unknown, {"a", "b", "d", "e"}), [])

    def test_an_acknowledged_key_lost(self):
        acked, unknown = set_outcomes(self.H)
        problems = check_set(acked, unknown, {"a", "b"})
        self.assertEqual(len(problems), 1)
        self.assertIn("1 acknowledged keys lost: d", problems[0])

    def test_a_refused_key_present(self):
        acked, unknown = set_outcomes(self.H)
        problems = check_set(acked, unknown, {"a", "c", "d"})
        self.assertEqual(len(problems), 1)
        self.assertIn("refused or never added: c", problems[0])

    def test_a_key_never_added_present(self):
        acked, unknown = set_outcomes(self.H)
        self.assertTrue(any("never added: zz" in p for p in check_set(acked, unknown, {"a", "d", "zz"})))


class Counter(unittest.TestCase):
    H = outcomes("incr", ("x", "ok"), ("x", "ok"), ("x", "unknown"), ("x", "fail"), ("y", "unknown"))

    def test_the_totals_of_a_history(self):
        # a definitive refusal counts in neither
        self.assertEqual(counter_totals(self.H), {"x": (2, 3), "y": (0, 1)})

    def test_a_final_value_in_bounds_passes(self):
        for final in (2, 3):
            self.assertEqual(check_counter(2, 3, final), [])

    def test_an_acknowledged_increment_lost(self):
        self.assertTrue(any("was lost" in p for p in check_counter(2, 3, 1)))

    def test_an_increment_applied_twice(self):
        self.assertTrue(any("applied twice" in p for p in check_counter(2, 3, 4)))


# One partition's life in a three-node cluster with factor 2, through every
# writer's edit (check_table_history's docstring): each bad history below
# is this one with one step wrong.
LIFE = [
    (10, Entry("n1", ["n2"])),                          # the first assignment
    (14, Entry("n1", [])),                              # n1 drops n2, which did not acknowledge
    (15, Entry("n1", [], syncing=["n3"])),              # repair: a new backup, copied to
    (19, Entry("n1", ["n3"])),                          # the copy done: in sync
    (22, Entry("n1", ["n3"], joining="n2")),            # rebalance: move it to n2
    (30, Entry("n2", ["n3"])),                          # the handover (n1 not kept: 2 copies)
    (31, Entry("n2", ["n3"], joining="n1")),            # moved back...
    (35, Entry("n1", ["n3"])),
    (36, Entry("n1", ["n3"], handover="n3")),           # ...and to its in-sync backup, by a handover,
    (40, Entry("n3", ["n1"])),                          # which keeps the old primary as its backup
    (44, Entry("n1", [])),                              # n3 died: its backup promoted
    (45, Entry("n1", [], syncing=["n2"])),
    (48, Entry("n1", ["n2"])),
    (50, Entry("n1", ["n2"], syncing=["n3"])),          # rebalance: the placement wants n3, not n2...
    (53, Entry("n1", ["n2", "n3"])),                    # ...copied first (one beyond the factor)...
    (54, Entry("n1", ["n3"])),                          # ...then n2 goes
]


def table(*changes):
    """LIFE with changes: {epoch: Entry or None (left out)}, as a
    one-partition history."""
    c = dict(changes)
    return {7: [(ep, c.get(ep, e)) for ep, e in LIFE if c.get(ep, e) is not None]}


class TableHistory(unittest.TestCase):
    def violations(self, *changes, rf=2):
        return check_table_history(table(*changes), replication_factor=rf)

    def assertFound(self, problems, words):
        """The rule broken is found (a wrong entry may break others too)."""
        self.assertTrue(any(words in p for p in problems), problems)

    def test_a_clean_life_passes(self):
        self.assertEqual(self.violations(), [])
        self.assertEqual(check_table_history({0: [], 1: LIFE[:1]}), [])

    def test_an_epoch_that_does_not_increase(self):
        h = table()
        h[7][5] = (22, h[7][5][1])
        self.assertFound(check_table_history(h), "the epoch does not increase")

    def test_a_primary_that_is_its_own_backup(self):
        self.assertFound(self.violations((19, Entry("n1", ["n3", "n1"]))), "is its own backup")
        self.assertFound(self.violations((15, Entry("n1", [], syncing=["n1"]))), "is its own backup")

    def test_a_node_in_sync_and_syncing(self):
        self.assertFound(self.violations((15, Entry("n1", ["n3"], syncing=["n3"]))),
                        "both in sync and syncing")

    def test_a_primary_that_is_its_move_target(self):
        self.assertFound(self.violations((22, Entry("n1", ["n3"], joining="n1"))), "its own move target")

    def test_more_than_one_copy_beyond_the_factor(self):
        problems = self.violations((50, Entry("n1", ["n2"], syncing=["n3", "n4"])))
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("more than one copy beyond the factor 2", problems[0])
        self.assertEqual(self.violations((50, Entry("n1", ["n2"], syncing=["n3", "n4"])), rf=3), [])

    def test_a_copy_planned_onto_an_in_sync_backup(self):
        # the plan that lost acknowledged writes: its copy replaces n3's
        # in-sync copy, and a failover mid-move promotes n3
        bad = (36, Entry("n1", ["n3"], joining="n3"))
        self.assertFound(self.violations(bad), "a copy planned onto n3, an in-sync backup")
        # unless the test wrote it itself (then only what followed is drey's)
        self.assertEqual(check_table_history(table(bad), 2, written_by_test={7: {36}}), [])

    def test_a_handover_to_a_node_not_in_sync(self):
        self.assertFound(self.violations((36, Entry("n1", ["n3"], handover="n2"))), "a handover to n2")

    def test_a_primary_cleared(self):
        self.assertFound(self.violations((45, Entry("", []))), "was cleared")

    def test_a_new_primary_that_was_not_in_sync(self):
        # n3 was syncing, not in sync, when n1 lost the partition
        self.assertFound(self.violations((19, None), (22, Entry("n1", [], syncing=["n3"])),
                                        (30, Entry("n3", []))),
                        "new primary n3 was neither in sync nor the move target")
        # a node the entry never named
        self.assertFound(self.violations((44, Entry("n4", []))), "new primary n4")

    def test_a_backup_in_sync_without_a_copy(self):
        # repair naming n3 in sync at once, skipping the copy
        self.assertFound(self.violations((15, None)), "n3 entered the in-sync set without a copy")
        # the old primary kept at a failover (not a handover): it may lack writes the new one took
        self.assertFound(self.violations((44, Entry("n1", ["n3"]))), "n3 entered the in-sync set")
        # the move target named in sync when its move was cancelled (its copy unfinished)
        self.assertFound(self.violations((35, Entry("n2", ["n3", "n1"]))), "n1 entered the in-sync set")
        # a handover's old primary kept in sync is fine; a third node is not
        self.assertFound(self.violations((40, Entry("n3", ["n1", "n2"]))), "n2 entered the in-sync set")


if __name__ == "__main__":
    unittest.main(verbosity=2)
