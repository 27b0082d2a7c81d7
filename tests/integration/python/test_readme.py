"""The README's commands, run as a reader runs them.

The README's shell blocks are taken from the file and run as written, in
one bash that keeps what a reader's terminal keeps (variables, the working
directory, background jobs), with `set -eo pipefail` so that a command that
fails stops it:

- the quick start's `bazel/drey.sh serve`, in a clone made of what Bazel
  built for this test: bazel/drey.sh itself, bazel-bin/dreyd and
  bazel-bin/drey. On PATH, a `bazel` that accepts only the build line
  drey.sh runs (Bazel built both binaries already) and an `apt-get` that
  fails (a test installs nothing). It must serve, as dreyd itself (drey.sh
  execs it), and exit 0 when stopped;
- the first session against that node, line by line as one script; its
  last line, a watch "until Ctrl-C", is started, sees a change made from
  "another terminal", and is ended by SIGINT, which is what Ctrl-C sends;
- the three-node cluster, which must be docs/cluster.md's first block word
  for word, then that page's second block (grow to four, drain one).
`bazel/drey.sh test` is the test command itself (CI's .ci/run): not run here.

What is substituted, and why it is honest: the whole test runs in a private
network namespace, so the fixed ports the README uses (127.0.0.1:50051,
2379, 9090, ...) belong to this test alone and tests can run in parallel;
TMPDIR points into the test's temporary directory, where the cluster
recipe's `mktemp -d` lands. Nothing else changes: a README command that
breaks fails here. Every ```sh block of the README must be one of the
above: a new one fails the test until it is run here too.
"""
import fcntl
import glob
import os
import queue
import re
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest

from drey_harness import START_TIMEOUT, STOP_TIMEOUT, find_dreyd

HERE = os.path.dirname(os.path.abspath(__file__))
NS_ENV = "DREY_TEST_PRIVATE_NET_NS"
# A block may wait for the cluster (256 partitions moving, a drain): generous,
# only there so that a hang fails; the README's loops have no deadline.
BLOCK_TIMEOUT = 300
CTRL_C = "until Ctrl-C"


# --- the pages ------------------------------------------------------------------------

def find_file(rel):
    """rel (README.md, docs/cluster.md, bazel/drey.sh) in the runfiles tree
    under Bazel, or in the source tree when run by hand."""
    candidates = [os.path.join(os.getcwd(), rel)]
    for base in filter(None, [os.environ.get("RUNFILES_DIR"), os.environ.get("TEST_SRCDIR")]):
        candidates.append(os.path.join(base, "drey", rel))
    candidates.append(os.path.normpath(os.path.join(HERE, "..", "..", "..", rel)))
    for c in candidates:
        if os.path.isfile(c):
            return c
    raise RuntimeError("cannot find %s; looked in %s" % (rel, candidates))


def shell_blocks(path):
    """The ```sh blocks of a markdown file, in order: (heading above, text)."""
    blocks, heading, block = [], None, None
    with open(path, encoding="utf-8") as f:
        for line in f:
            if block is not None:
                if line.startswith("```"):
                    blocks.append((heading, "".join(block)))
                    block = None
                else:
                    block.append(line)
            elif line.startswith("```sh"):
                block = []
            elif line.startswith("#"):
                heading = line.lstrip("#").strip()
    return blocks


def block_under(blocks, heading):
    found = [text for h, text in blocks if h == heading]
    if len(found) != 1:
        raise AssertionError("expected one shell block under %r, found %d" % (heading, len(found)))
    return found[0]


# --- a private network namespace ------------------------------------------------------

def enter_private_network_namespace():
    """Re-executes this file in a network namespace of its own (never
    returns), unless it runs in one already; there, brings loopback up.
    Returns None, or why no namespace can be had here."""
    if os.environ.get(NS_ENV) == "1":
        loopback_up()
        return None
    unshare = shutil.which("unshare") or "/usr/bin/unshare"
    reasons = []
    for argv in ([unshare, "--net"], [unshare, "--net", "--map-root-user"]):
        try:
            probe = subprocess.run(argv + ["true"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as e:
            return "cannot run unshare(1): %s" % e
        if probe.returncode == 0:
            env = dict(os.environ)
            env[NS_ENV] = "1"
            sys.stdout.flush()
            sys.stderr.flush()
            os.execve(unshare, argv + [sys.executable, "-u", os.path.abspath(__file__)] + sys.argv[1:], env)
        reasons.append("%s: %s" % (" ".join(argv[1:]), probe.stderr.strip()))
    return "no network namespace permitted here (%s)" % "; ".join(reasons)


def loopback_up():
    SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifr = fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH14s", b"lo", 0, b""))
        flags = struct.unpack("16sH14s", ifr)[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14s", b"lo", flags | IFF_UP, b""))


NAMESPACE = enter_private_network_namespace()


# --- processes ------------------------------------------------------------------------

def descendants(pid):
    """Every process below pid (children, their children, ...), from /proc."""
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            parents.setdefault(int(fields[1]), []).append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_quietly(pid, sig=signal.SIGKILL):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def poll(fn, timeout, what):
    deadline = time.monotonic() + timeout
    while True:
        got = fn()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for %s" % what)
        time.sleep(0.05)


class Shell:
    """One bash, kept for the whole test as a reader's terminal is. Each
    step is a file the shell sources with its output in a file of its own;
    only the test's markers come back on the shell's standard output."""

    def __init__(self, cwd, env, tmp):
        self.tmp = tmp
        self.steps = 0
        self.err = open(os.path.join(tmp, "shell.err"), "wb")
        self.proc = subprocess.Popen(["bash", "--norc", "--noprofile"], cwd=cwd, env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err)
        self.lines = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.send("set -eo pipefail\n")

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def send(self, text):
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def answer(self, prefix, timeout, output=None):
        """The value of the next marker line `prefix value` the shell prints."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError("the shell did not finish within %ds%s" % (timeout, self.tail(output)))
            if line is None:
                self.proc.wait(10)
                raise AssertionError("the shell exited %s: a command failed%s"
                                     % (self.proc.returncode, self.tail(output)))
            if line.startswith(prefix + " "):
                return line[len(prefix) + 1:]

    def tail(self, output):
        if output is None or not os.path.exists(output):
            return ""
        with open(output, errors="replace") as f:
            said = "; its output (%s) ends:\n%s" % (output, "".join(f.readlines()[-40:]))
        # The logs of what it started (the cluster recipe's nodes and etcd,
        # in its mktemp -d directory): the directory goes with the test.
        for log in sorted(glob.glob(os.path.join(self.tmp, "tmp", "*", "*.log"))):
            with open(log, errors="replace") as f:
                said += "\n--- %s ends:\n%s" % (log, "".join(f.readlines()[-15:]))
        return said

    def run(self, script, timeout=BLOCK_TIMEOUT):
        """Sources script (xtrace on, so its output shows each command);
        returns what it printed. Fails if any command of it fails."""
        self.steps += 1
        path = os.path.join(self.tmp, "step%d.sh" % self.steps)
        out = path[:-3] + ".out"
        with open(path, "w") as f:
            f.write("set -x\n" + script + "set +x\n")
        self.send('source %s > %s 2>&1 < /dev/null\necho "__done $?"\n' % (path, out))
        self.answer("__done", timeout, out)
        with open(out, errors="replace") as f:
            return f.read()

    def start(self, line, out):
        """Starts a one-command line in the background, as itself (exec), and
        returns its pid."""
        self.send("(\nexec %s\n) > %s 2>&1 < /dev/null &\necho \"__pid $!\"\n" % (line, out))
        return int(self.answer("__pid", 30))

    def wait(self, pid, timeout):
        self.send('rc=0; wait %d || rc=$?; echo "__rc $rc"\n' % pid)
        return int(self.answer("__rc", timeout))

    def close(self):
        """Kills everything the shell started (the cluster's nodes, etcd),
        then the shell."""
        if self.proc.poll() is None:
            for pid in descendants(self.proc.pid):
                kill_quietly(pid)
            self.proc.kill()
        self.proc.wait(30)
        self.reader.join(30)
        self.proc.stdin.close()
        self.proc.stdout.close()
        self.err.close()


def printed(out):
    """What a step's commands printed, without the trace of the commands."""
    return [l for l in out.splitlines() if not l.startswith("+")]


# --- the test ---------------------------------------------------------------------------

class ReadmeTest(unittest.TestCase):
    maxDiff = None

    def setUp(self):
        self.readme = find_file("README.md")
        self.cluster_md = find_file("docs/cluster.md")
        self.blocks = shell_blocks(self.readme)

    def test_every_shell_block_is_run_here(self):
        headings = [h for h, _ in self.blocks]
        self.assertEqual(headings, ["Quick start", "A first session", "Three nodes on one machine"],
                         "the README's shell blocks changed: run the new ones in this test")
        self.assertEqual([l.split("#")[0].split() for l in block_under(self.blocks, "Quick start").splitlines()],
                         [["bazel/drey.sh", "serve"], ["bazel/drey.sh", "test"]])
        self.assertEqual(block_under(self.blocks, "Three nodes on one machine"), shell_blocks(self.cluster_md)[0][1],
                         "the README's cluster recipe should be docs/cluster.md's first block, word for word")
        session = block_under(self.blocks, "A first session").splitlines()
        self.assertEqual([l for l in session if CTRL_C in l], session[-1:],
                         "only the session's last line may run until Ctrl-C")

    def test_the_readme_as_written(self):
        if NAMESPACE is not None:
            self.skipTest(NAMESPACE)
        tmp = tempfile.mkdtemp(prefix="drey-readme-", dir=os.environ.get("TEST_TMPDIR"))
        if not os.environ.get("DREY_TEST_KEEP_TMP"):
            self.addCleanup(shutil.rmtree, tmp, True)
        self.clone, self.env = self.make_clone(tmp)
        self.drey = os.path.join(self.clone, "bazel-bin", "drey")
        node = self.serve(tmp)
        shell = Shell(self.clone, self.env, tmp)
        self.addCleanup(shell.close)
        self.first_session(shell, tmp)
        self.stop(node)
        self.cluster(shell)

    def make_clone(self, tmp):
        """A directory laid out as a clone after `bazel build //:dreyd
        //:drey`, with what the quick start runs."""
        clone = os.path.join(tmp, "clone")
        os.makedirs(os.path.join(clone, "bazel"))
        os.makedirs(os.path.join(clone, "bazel-bin"))
        shutil.copy(find_file("bazel/drey.sh"), os.path.join(clone, "bazel", "drey.sh"))
        dreyd = find_dreyd()
        os.symlink(dreyd, os.path.join(clone, "bazel-bin", "dreyd"))
        os.symlink(os.path.join(os.path.dirname(dreyd), "drey"), os.path.join(clone, "bazel-bin", "drey"))
        fake = os.path.join(tmp, "bin")
        os.makedirs(fake)
        self.script(fake, "bazel", '[ "$*" = "build //:dreyd //:drey" ] && exit 0\n'
                    'echo "test_readme: drey.sh ran bazel $*, not the build this test stands in for" >&2\nexit 1\n')
        self.script(fake, "apt-get", 'echo "test_readme: drey.sh would install packages (apt-get $*)" >&2\nexit 1\n')
        for d in ("tmp", "home"):
            os.makedirs(os.path.join(tmp, d))
        env = dict(os.environ)
        env.update(PATH=fake + os.pathsep + env.get("PATH", "/usr/bin:/bin"), TMPDIR=os.path.join(tmp, "tmp"),
                   HOME=os.path.join(tmp, "home"))
        for k in [k for k in env if k.startswith("DREY_") and k != NS_ENV]:
            del env[k]  # drey reads DREY_* as its options: the reader's shell has none
        return clone, env

    @staticmethod
    def script(d, name, body):
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write("#!/bin/sh\n" + body)
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)

    def cli(self, *args):
        """drey as typed in another terminal of the clone."""
        return subprocess.run([self.drey] + list(args), cwd=self.clone, env=self.env, capture_output=True,
                              text=True, timeout=30)

    def serve(self, tmp):
        """The quick start's first line, in a terminal of its own."""
        line = block_under(self.blocks, "Quick start").splitlines()[0]
        log = open(os.path.join(tmp, "serve.log"), "wb")
        self.addCleanup(log.close)
        node = subprocess.Popen(["bash", "-c", line], cwd=self.clone, env=self.env, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT)
        self.addCleanup(node.wait, 30)
        self.addCleanup(kill_quietly, node.pid)

        def serving():
            if node.poll() is not None:
                with open(log.name, errors="replace") as f:
                    raise AssertionError("%r exited %s:\n%s" % (line, node.returncode, f.read()[-4000:]))
            return self.cli("health").returncode == 0
        poll(serving, START_TIMEOUT, "the node of %r to serve" % line)
        exe = os.path.basename(os.readlink("/proc/%d/exe" % node.pid))
        self.assertEqual(exe, "dreyd", "drey.sh serve should exec dreyd, as the README says it passes its arguments on")
        return node

    def stop(self, node):
        """Ctrl-C twice in the node's terminal: the first starts the drain
        (health turns NOT_SERVING: exit 3), the second ends its grace."""
        node.send_signal(signal.SIGINT)
        poll(lambda: self.cli("health").returncode == 3, STOP_TIMEOUT, "the node to drain")
        node.send_signal(signal.SIGINT)
        self.assertEqual(node.wait(STOP_TIMEOUT), 0, "the served node should exit 0 on Ctrl-C")

    def first_session(self, shell, tmp):
        lines = block_under(self.blocks, "A first session").splitlines(keepends=True)
        out = shell.run("".join(lines[:-1]))
        for want in ("\nhello\n", "user:1\t", "ada", "user:2\t", "grace", '"stringValue": "hello"',
                     "drey.cache.v1.Cache\n", "SERVING", "ready\ttrue"):
            self.assertIn(want, out)
        self.assertEqual(len(re.findall(r"^[123]\tOK\t", out, re.M)), 3, "three pipelined answers:\n" + out)

        # The watch, until Ctrl-C; a change from another terminal meanwhile.
        watch = lines[-1].rstrip("\n")
        self.assertTrue(watch.startswith("$D watch "), watch)
        path = os.path.join(tmp, "watch.out")
        pid = shell.start(watch, path)

        def printed(pattern):
            if not os.path.exists(path):  # the background job opens it
                return None
            with open(path, errors="replace") as f:
                return re.search(pattern, f.read(), re.M)
        poll(lambda: printed(r"^WATCHING\t"), 30, "the watch's WATCHING line")
        self.assertEqual(self.cli("set", "user:3", "edsger").returncode, 0)
        poll(lambda: printed(r"^SET\tuser:3\t\d+\tedsger$"), 30, "the watch to print the change of user:3")
        os.kill(pid, signal.SIGINT)
        self.assertEqual(shell.wait(pid, 30), 0, "a watch ended by Ctrl-C exits 0")

    def cluster(self, shell):
        readme_block = block_under(self.blocks, "Three nodes on one machine")
        blocks = shell_blocks(self.cluster_md)
        self.assertGreaterEqual(len(blocks), 2, "docs/cluster.md should hold the recipe's two blocks")
        self.assertEqual(readme_block, blocks[0][1],
                         "the README's cluster recipe should be docs/cluster.md's first block, word for word")
        out = printed(shell.run(blocks[0][1]))
        self.assertEqual(out[-1], "hello", "the three-node block should end with the value read through n3")
        self.assertTrue([l for l in out if l.startswith("n3  127.0.0.1:50053")],
                        "n3 in the table of members:\n" + "\n".join(out))
        out = printed(shell.run(blocks[1][1]))
        self.assertEqual(out[-1], "hello", "the grown and drained cluster should still serve the value")


if __name__ == "__main__":
    unittest.main(verbosity=2)
