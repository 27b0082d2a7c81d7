"""`drey drain`, the preStop hook of deploy/k8s/cluster: it signals dreyd
and returns only once dreyd has drained and exited (so the kubelet's own
SIGTERM, which would cut the grace period short, never lands mid-drain);
with --ops (or $DREY_OPS_LISTEN, as in the pod) it returns 0 as soon as
dreyd closed its ops listener at the end of its drain (in a container the
hook is killed with PID 1, so it must be done before dreyd exits); it gives
up at --wait on a process that does not exit, and says so when there is
nothing to signal.

`drey ready` reads the ops listener's details from loopback with --ops (or
$DREY_OPS_LISTEN): no token, as `kubectl exec ... drey ready` needs."""
import json
import os
import signal
import subprocess
import time

from drey_cluster import drey_cli
from drey_harness import DreyServer, DreyTestCase, main
from drey_tokens import KeyDir, ops_port, poll


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

    def test_with_the_ops_listener_it_returns_when_the_drain_is_over(self):
        srv = DreyServer("--ops-listen=127.0.0.1:0", drain_grace="700ms").start()
        port = ops_port(srv)
        start = time.monotonic()
        env = dict(os.environ, DREY_OPS_LISTEN="0.0.0.0:%d" % port)  # as the pod sets it
        out = subprocess.run([drey_cli(), "drain", "--pid=%d" % srv.proc.pid, "--wait=30s"], capture_output=True,
                             text=True, timeout=60, env=env)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertGreaterEqual(time.monotonic() - start, 0.7, "it waited out the grace period")
        self.assertTrue(srv.find_log(lambda r: r.get("msg") == "stopping"), "dreyd had finished draining")
        self.assertEqual(srv.wait(), 0)

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


class Ready(DreyTestCase):
    def test_ready_reads_the_ops_listener_without_a_token(self):
        keys = KeyDir()
        keys.rsa("k1")
        srv = self.start_server("--jwt-keys-dir=" + keys.path, "--ops-listen=127.0.0.1:0", drain_grace="2s")
        port = ops_port(srv)
        base = [drey_cli(), "--addr=" + srv.address]
        out = subprocess.run(base + ["ready"], capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 1, "over gRPC a node with keys wants a token")
        self.assertIn("TOKEN_MISSING", out.stderr)
        for args, env in ((["--ops=127.0.0.1:%d" % port], None),
                          ([], dict(os.environ, DREY_OPS_LISTEN="0.0.0.0:%d" % port))):
            out = subprocess.run(base + args + ["ready", "-o", "json"], capture_output=True, text=True, timeout=30,
                                 env=env)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertTrue(json.loads(out.stdout)["ready"])
        srv.signal(signal.SIGTERM)  # draining (a 2 s grace period): not ready, exit status 3
        out = poll(lambda: subprocess.run(base + ["--ops=127.0.0.1:%d" % port, "ready", "-o", "json"],
                                          capture_output=True, text=True, timeout=30),
                   lambda o: o.returncode != 0, what="not ready while draining")
        self.assertEqual(out.returncode, 3, out.stderr)
        self.assertFalse(json.loads(out.stdout)["ready"])
        srv.wait()
        out = subprocess.run(base + ["--ops=127.0.0.1:%d" % port, "ready"], capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 1)
        self.assertIn("refused", out.stderr)


if __name__ == "__main__":
    main()
