"""An idle node gives memory back to the system.

jemalloc returns freed pages as it decays them, and without a background
thread only allocating threads do that work: a node that went idle after a
burst kept every page of it resident. dreyd's malloc_conf (src/dreyd/main.c)
turns the background thread on with a 1 s dirty decay. Here a node grows by
tens of MiB of 256 KiB entries, they are all removed, and then, with no
request at all, its VmRSS must fall most of the way back to where it started
within a generous deadline (polled, so a slow machine only makes it slower).

A build without jemalloc (--config=asan) has nothing to check: skipped.
"""

import unittest

from drey_harness import CACHE_SERVICE, DreyTestCase, ServiceClient, main, make_value
from drey_tokens import details, ops_port, poll

VALUE = 256 * 1024
KEYS = 160           # 40 MiB of values
MIN_GROWTH = 30 << 20
DEADLINE = 20.0      # seconds; the decay is 1 s


def rss(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS for pid %d" % pid)


class IdleMemoryTest(DreyTestCase):

    def test_rss_falls_back_after_a_burst_of_deletions(self):
        srv = self.start_server("--ephemeral=true", "--ops-listen=127.0.0.1:0", "--max-value-bytes=1MiB")
        port = ops_port(srv)
        if details(srv, port)["memory"]["jemallocAllocatedBytes"] < 0:
            raise unittest.SkipTest("dreyd is not running on jemalloc")
        self.cache = ServiceClient(srv.channel(), self.pb.cache, CACHE_SERVICE)
        pid = srv.proc.pid
        base = rss(pid)

        keys = [self.key("big%d" % i) for i in range(KEYS)]
        payload = b"x" * VALUE
        for k in keys:
            self.call("Set", key=k, value=make_value(payload))
        peak = rss(pid)
        self.assertGreaterEqual(peak - base, MIN_GROWTH,
                                "the burst did not grow the node (%d -> %d bytes): nothing to give back" % (base, peak))

        for k in keys:
            self.call("Remove", key=k)
        allocated = details(srv, port)["memory"]["jemallocAllocatedBytes"]
        self.assertLess(allocated, KEYS * VALUE // 4, "the entries were not freed (jemalloc allocated %d)" % allocated)

        bound = base + (peak - base) // 3
        poll(lambda: rss(pid), lambda v: v <= bound, timeout=DEADLINE, interval=0.1,
             what="VmRSS back under %d bytes (started at %d, peaked at %d)" % (bound, base, peak))


if __name__ == "__main__":
    main()
