"""`drey drain`, the preStop hook of deploy/k8s/cluster: it signals dreyd
and returns only once dreyd has drained and exited (so the kubelet's own
SIGTERM, which would cut the grace period short, never lands mid-drain);
it gives up at --wait on a process that does not exit, and says so when
there is nothing to signal."""
import signal
import subprocess
import time

from drey_cluster import drey_cli
from drey_harness import DreyServer, DreyTestCase, main


def drain(*args, timeout=60):
    return subprocess.run([drey_cli(), "drain"] + list(args), capture_output=True, text=True, timeout=timeout)


class Drain(DreyTestCase):
    def test_it_returns_once_dreyd_has_drained_and_exited(self):
        # A grace period long enough that a drain command returning at once
        # would be seen doing so.
        srv = DreyServer(drain_grace="700ms").start()
        start = time.monotonic()
        out = drain("--pid=%d" % srv.proc.pid, "--wait=30s")
        took = time.monotonic() - start
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertGreaterEqual(took, 0.7, "drain waited out the grace period")
        self.assertEqual(srv.wait(), 0)
        msgs = [r["msg"] for r in srv.log_records(strict=True)]
        self.assertIn("draining", msgs)
        self.assertEqual(msgs[-1], "stopped")

    def test_a_process_that_does_not_exit_is_reported_at_the_deadline(self):
        stubborn = subprocess.Popen(["sleep", "60"], preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN))
        try:
            start = time.monotonic()
            out = drain("--pid=%d" % stubborn.pid, "--wait=300ms")
            self.assertEqual(out.returncode, 1)
            self.assertIn("still running after 300 ms", out.stderr)
            self.assertGreaterEqual(time.monotonic() - start, 0.3)
            self.assertIsNone(stubborn.poll())
        finally:
            stubborn.kill()
            stubborn.wait()

    def test_nothing_to_signal(self):
        gone = subprocess.Popen(["true"])
        gone.wait()
        out = drain("--pid=%d" % gone.pid, "--wait=1s")
        self.assertEqual(out.returncode, 1)
        self.assertIn("cannot signal process %d" % gone.pid, out.stderr)

    def test_usage_errors(self):
        for args, needle in ((["--pid=abc"], "not a process id"), (["--pid=0"], "not a process id"),
                             (["--wait=soon"], "not a duration"), (["--bogus"], "unknown option")):
            out = drain(*args)
            self.assertEqual(out.returncode, 2, args)
            self.assertIn(needle, out.stderr)
        out = drain("--help")
        self.assertEqual(out.returncode, 0)
        self.assertIn("preStop", out.stdout)


if __name__ == "__main__":
    main()
