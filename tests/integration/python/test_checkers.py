"""The history checkers catch what they are for: each violation below is a
lost or reordered write a cluster under faults could produce, and a clean
history passes. (The checkers run against real clusters in
test_cluster_moves and test_nemesis; here they are tried on histories made
by hand.)"""
import unittest

from drey_checkers import History, check_counter, check_register, check_set, counter_totals, set_outcomes


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


if __name__ == "__main__":
    unittest.main(verbosity=2)
