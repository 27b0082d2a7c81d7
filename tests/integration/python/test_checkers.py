"""The history checkers catch what they are for: each violation below is a
lost or reordered write a cluster under faults could produce, and a clean
history passes. (The checkers run against real clusters in
test_cluster_moves; here they are tried on histories made by hand.)"""
import unittest

from drey_checkers import History, check_register


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


if __name__ == "__main__":
    unittest.main(verbosity=2)
