"""The drey CLI through the built binaries, typed as a user types it: each
command below is one shell line (shlex), run with DREY_* from the test's
environment, against a plain node, a TLS node, a mutual-TLS node, a node
with JWT keys and a three-node cluster with replicas.

* conventions: -h/--help on every command (the list comes from
  `drey --help`), --name value and --name=value, DREY_<NAME> for options,
  --version on drey, dreyd and drey-bench (and dreyd's first log line,
  readiness details, drey_build_info), exit codes 0/1/2/3;
* output: text (tab-separated, quoted where it could be misread), table,
  JSON (one object, or one a line);
* commands: mget, mset, exists, del, incr, expire/ttl/persist, watch (until
  --count or Ctrl-C), pipeline (stdin), call/list/describe through
  reflection with decoded error details, the interactive mode on a pty;
* connections: --tls-ca, --tls-server-name, --tls-cert/--tls-key, several
  --addr and --endpoints failing over, --token-file, --timeout;
* cluster status from any node and from etcd, short by default, the whole
  document with -o json; stats says copies with replicas; process_*
  metrics and the per-principal cap (--metrics-principals).
"""
import json
import os
import pty
import re
import select
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import grpc

from drey_cluster import Cluster
from drey_harness import DreyServer, find_dreyd, main, protos
from drey_tokens import KeyDir, http_get, mint, openssl, poll

BIN_DIR = os.path.dirname(find_dreyd())
DREY = os.path.join(BIN_DIR, "drey")
BENCH = os.path.join(BIN_DIR, "drey-bench")


def run(line, env=None, stdin=None, timeout=60, addr=None):
    """One command line as typed: `drey ...`; returns (rc, stdout, stderr)."""
    argv = shlex.split(line)
    assert argv[0] in ("drey", "dreyd", "drey-bench"), line
    argv[0] = {"drey": DREY, "dreyd": find_dreyd(), "drey-bench": BENCH}[argv[0]]
    e = {k: v for k, v in os.environ.items() if not k.startswith("DREY_") or k in ("DREY_BIN",)}
    e["HOME"] = tempfile.gettempdir()
    if addr:
        e["DREY_ADDR"] = addr
    e.update(env or {})
    p = subprocess.run(argv, input=stdin, capture_output=True, text=True, env=e, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


class Plain(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.srv = DreyServer("--ops-listen=127.0.0.1:0", "--metrics-principals=2").start()
        cls.addr = cls.srv.address

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()

    def drey(self, line, rc=0, **kw):
        got, out, err = run(line, addr=kw.pop("addr", self.addr), **kw)
        self.assertEqual(got, rc, "%s: exit %d\nstdout: %s\nstderr: %s" % (line, got, out, err))
        return out, err

    # --- conventions

    def test_help_on_every_command(self):
        out, _ = self.drey("drey --help")
        for word in ("Exit status", "DREY_ADDR", "--tls-ca", "--endpoints", "-o, --output"):
            self.assertIn(word, out)
        commands = sorted({" ".join(m.groups()[0].split()[:2] if m.group(1).startswith("cluster") else
                                    m.group(1).split()[:1])
                           for m in re.finditer(r"^  ([a-z]+(?: [a-z]+)?)\b", out, re.M)} - {"DREY"})
        self.assertIn("watch", commands)
        self.assertIn("cluster status", commands)
        for cmd in commands:
            for h in ("-h", "--help"):
                out, _ = self.drey("drey %s %s" % (cmd, h))
                self.assertTrue(out.startswith("usage: drey " + cmd), (cmd, out))
        out, _ = self.drey("drey help set")
        self.assertIn("--if-version N", out)
        self.drey("drey frobnicate", rc=2)
        self.drey("drey cluster", rc=2)
        self.drey("dreyd --help")
        out, _ = self.drey("dreyd storage --help")
        self.assertIn("usage: dreyd storage", out)
        out, _ = self.drey("drey-bench --help")
        self.assertIn("--target", out)

    def test_versions(self):
        want = re.compile(r"^(drey|dreyd|drey-bench) (\d+\.\d+\.\d+) \(revision ([0-9a-f]{40}(-dirty)?|unknown), "
                          r"build \S+ (jemalloc|system-malloc)( asan)?\)\n$")
        seen = set()
        for prog in ("drey", "dreyd", "drey-bench"):
            out, _ = self.drey(prog + " --version")
            m = want.match(out)
            self.assertIsNotNone(m, out)
            seen.add((m.group(2), m.group(3)))
        self.assertEqual(len(seen), 1, "one version and revision for the three: %s" % seen)
        version, revision = seen.pop()
        out, _ = self.drey("drey version -o json")
        self.assertEqual((json.loads(out)["version"], json.loads(out)["revision"]), (version, revision))
        first = json.loads(self.srv.log_text().splitlines()[0])
        self.assertEqual((first["msg"], first["version"], first["revision"]), ("dreyd", version, revision))
        out, _ = self.drey("drey ready -o json")
        self.assertEqual(json.loads(out)["build"]["revision"], revision)
        _, _, body = http_get("127.0.0.1", self.srv.ops_port, "/metrics")
        self.assertIn('drey_build_info{version="%s",revision="%s"} 1' % (version, revision), body.decode())

    def test_options_with_space_equals_and_environment(self):
        self.drey("drey --cache conv set k 'two words' --ttl 1h")
        out, _ = self.drey("drey get k --cache=conv")
        self.assertEqual(out, "two words\n")
        out, _ = self.drey("drey get k", env={"DREY_CACHE": "conv", "DREY_OUTPUT": "json"})
        self.assertEqual(json.loads(out)["value"], "two words")
        self.drey("drey set k2 v", env={"DREY_CACHE": "conv", "DREY_TTL": "2s"})
        out, _ = self.drey("drey ttl k2 --cache conv -o json")
        self.assertLessEqual(json.loads(out)["remainingMs"], 2000)
        out, _ = self.drey("drey get k --cache=conv -o json", env={"DREY_OUTPUT": "table"})
        self.assertEqual(json.loads(out)["key"], "k", "the command line wins over the environment")
        self.drey("drey get k --timeout", rc=2)
        # drey-bench reads its options the same ways: DREY_<NAME>, then the command line.
        out, _ = self.drey("drey-bench --count 20 --mix=set:1 --keys=20 --distribution=sequential",
                           env={"DREY_TARGET": self.addr, "DREY_CACHE": "bench-env", "DREY_JSON": "true",
                                "DREY_VALUE_BYTES": "3"})
        self.assertEqual(json.loads(out)["ok"], 20, out)
        out, _ = self.drey("drey scan --cache=bench-env -o json")
        self.assertEqual(len(out.splitlines()), 20, out)
        _, err = self.drey("drey-bench --count 1", rc=2, env={"DREY_CONNECTIONS": "none"})
        self.assertIn("--connections", err)
        self.drey("drey get k --timeout=soon", rc=2)
        self.drey("drey get k", rc=2, env={"DREY_TIMEOUT": "soon"})
        self.drey("drey get k -o yaml", rc=2)
        self.drey("drey get k --values", rc=2)

    # --- output

    def test_text_is_unambiguous_and_json_is_stable(self):
        self.drey("drey --cache=out mset a 'x y' b 'tab\there' c '' d '\"q\"'")
        self.drey("drey --cache=out set n 5 --int")
        self.drey("drey --cache=out set j '{\"b\":1,\"a\":[true,null]}' --json")
        out, _ = self.drey("drey --cache=out mget a b c d n j missing")
        self.assertEqual(out.splitlines(), ["a\tx y", 'b\t"tab\\there"', 'c\t""', 'd\t"\\"q\\""', "n\t5",
                                            'j\t{"a":[true,null],"b":1}', "missing\t"])
        out, _ = self.drey("drey --cache=out mget a n j missing -o json")
        rows = [json.loads(l) for l in out.splitlines()]
        self.assertEqual([(r["key"], r["found"], r.get("kind"), r.get("value")) for r in rows],
                         [("a", True, "string", "x y"), ("n", True, "int64", 5),
                          ("j", True, "json", {"a": [True, None], "b": 1}), ("missing", False, None, None)])
        out, _ = self.drey("drey --cache=out get a -o table")
        head, row = out.splitlines()
        self.assertEqual(head.split(), ["KEY", "KIND", "VALUE", "VERSION", "EXPIRES_AT"])
        self.assertIn('"x y"', row)
        out, _ = self.drey("drey --cache=out scan -o table")
        self.assertEqual(out.splitlines()[0].split(), ["KEY", "VERSION", "EXPIRES_AT"])
        self.assertEqual(len(out.splitlines()), 7)
        out, _ = self.drey("drey ready")
        self.assertIn("ready\ttrue\n", out)
        self.assertIn("build.version\t", out)

    # --- commands

    def test_redis_habits(self):
        self.drey("drey --cache=r mset k1 1 k2 2 --int")
        out, _ = self.drey("drey --cache=r exists k1 k2")
        self.assertEqual(out, "k1\ttrue\nk2\ttrue\n")
        out, _ = self.drey("drey --cache=r exists k1 nope", rc=3)
        self.assertEqual(out, "k1\ttrue\nnope\tfalse\n")
        out, _ = self.drey("drey --cache=r incr k1 41")
        self.assertEqual(out, "42\n")
        self.drey("drey --cache=r incr k1 x", rc=2)
        self.drey("drey --cache=r expire k1 1h")
        out, _ = self.drey("drey --cache=r ttl k1 -o json")
        self.assertGreater(json.loads(out)["remainingMs"], 3590000)
        self.drey("drey --cache=r persist k1")
        out, _ = self.drey("drey --cache=r ttl k1")
        self.assertEqual(out, "none\t\n")
        self.drey("drey --cache=r persist k1", rc=3)
        self.drey("drey --cache=r expire nope 1s", rc=3)
        out, _ = self.drey("drey --cache=r del k1 k2 nope")
        self.assertEqual(out, "k1\ttrue\nk2\ttrue\nnope\tfalse\n")
        self.drey("drey --cache=r del k1", rc=3)
        _, err = self.drey("drey --cache=r set k v --if-version=7", rc=1)
        self.assertIn("reason: VERSION_MISMATCH", err)
        _, err = self.drey("drey --cache=r set k v --if-version=7 -o json", rc=1)
        self.assertEqual(json.loads(err)["error"]["reason"], "VERSION_MISMATCH")
        self.drey("drey --cache=r mset a", rc=2)

    def test_watch_prints_events_until_count_or_interrupt(self):
        p = subprocess.Popen([DREY, "--addr", self.addr, "--cache=w", "watch", "--prefix", "p/", "--values",
                              "-o", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            first = json.loads(p.stdout.readline())
            self.assertEqual(first["event"], "WATCHING")
            self.drey("drey --cache=w set p/1 one")
            self.drey("drey --cache=w set other x")
            self.drey("drey --cache=w del p/1")
            ev = [json.loads(p.stdout.readline()) for _ in range(2)]
            self.assertEqual([(e["event"], e["key"]) for e in ev], [("SET", "p/1"), ("REMOVE", "p/1")])
            self.assertEqual(ev[0]["value"], "one")
            p.send_signal(signal.SIGINT)
            self.assertEqual(p.wait(30), 0, p.stderr.read())
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
        # keys, --count: ends by itself
        p = subprocess.Popen([DREY, "--addr=" + self.addr, "--cache=w", "watch", "a", "b", "--count=3"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.assertTrue(p.stdout.readline().startswith("WATCHING\t"))
        self.drey("drey --cache=w set c 1")
        self.drey("drey --cache=w set b 2")
        self.drey("drey --cache=w set a 3")
        out, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 0, err)
        self.assertEqual([l.split("\t")[:2] for l in out.splitlines()], [["SET", "b"], ["SET", "a"]])
        self.drey("drey watch a --prefix=b", rc=2)

    def test_pipeline_reads_stdin_and_answers_in_order(self):
        ops = "set p1 one\nget p1\n# a comment\n\nincr ctr 5\nset n 1 --int\nincr n\nget missing\nmget p1 n\n"
        out, _ = self.drey("drey --cache=pl pipeline", stdin=ops)
        lines = [l.split("\t") for l in out.splitlines()]
        self.assertEqual([(l[0], l[1]) for l in lines], [("1", "OK"), ("2", "OK"), ("5", "OK"), ("6", "OK"),
                                                         ("7", "OK"), ("8", "OK"), ("9", "OK")])
        self.assertEqual(json.loads(lines[1][2])["value"], {"stringValue": "one"})
        self.assertEqual(json.loads(lines[4][2])["value"], "2")
        self.assertEqual(json.loads(lines[5][2]), {})
        out, _ = self.drey("drey --cache=pl pipeline -o json", stdin="set v x\nset v y --if-version=1\n", rc=1)
        rows = [json.loads(l) for l in out.splitlines()]
        self.assertEqual(rows[1]["code"], "FAILED_PRECONDITION")
        self.assertEqual(rows[1]["error"]["reason"], "VERSION_MISMATCH")
        _, err = self.drey("drey pipeline", stdin="get a\nfrobnicate b\n", rc=2)
        self.assertIn("line 2", err)

    def test_call_list_describe_through_reflection(self):
        out, _ = self.drey("drey list")
        self.assertIn("drey.cache.v1.Cache\n", out)
        out, _ = self.drey("drey list drey.cache.v1.Cache")
        self.assertIn("drey.cache.v1.Cache.Watch\n", out)
        out, _ = self.drey("drey describe drey.cache.v1.Cache")
        self.assertIn("rpc Watch(drey.cache.v1.WatchRequest) returns (stream drey.cache.v1.WatchEvent);", out)
        out, _ = self.drey("drey describe drey.cache.v1.SetRequest")
        self.assertIn("google.protobuf.Duration ttl = ", out)
        out, _ = self.drey("""drey call drey.cache.v1.Cache/Set '{"cache":"call","key":"greeting","value":{"string_value":"hello"},"ttl":"60s"}'""")
        set_resp = json.loads(out)
        self.assertEqual(set_resp["version"], str(int(set_resp["version"])), "uint64 as a string")
        self.assertRegex(set_resp["expiresAt"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")
        out, _ = self.drey("""drey call drey.cache.v1.Cache/Get '{"cache":"call","key":"greeting"}' -o json""")
        self.assertEqual(json.loads(out)["value"], {"stringValue": "hello"})
        out, _ = self.drey("drey call grpc.health.v1.Health/Check")
        self.assertEqual(json.loads(out), {"status": "SERVING"})
        out, _ = self.drey("drey call drey.cache.v1.Cache/GetMany --stdin",
                           stdin='{"cache":"call","keys":["greeting","nope"]}')
        self.assertEqual([r.get("found", False) for r in json.loads(out)["results"]], [True, False])
        # a server stream: WATCHING first; --timeout ends it
        rc, out, _ = run("""drey call drey.cache.v1.Cache/Watch '{"cache":"call"}' -o json --timeout=300ms""",
                         addr=self.addr)
        self.assertEqual(rc, 1)
        self.assertEqual(json.loads(out.splitlines()[0])["kind"], "WATCHING")
        # errors: every detail decoded through reflection
        _, err = self.drey("""drey call drey.cache.v1.Cache/Set '{"cache":"no spaces","key":""}'""", rc=1)
        doc = json.loads(err)
        self.assertEqual(doc["code"], "INVALID_ARGUMENT")
        types = [d["@type"] for d in doc["details"]]
        self.assertIn("type.googleapis.com/google.rpc.ErrorInfo", types)
        bad = next(d for d in doc["details"] if d["@type"].endswith("BadRequest"))
        fields = [v["field"] for v in bad["fieldViolations"]]
        self.assertIn("cache", fields)
        self.assertIn("key", fields)
        # usage errors change nothing
        self.drey("drey call drey.cache.v1.Cache/Get '{\"nope\":1}'", rc=2)
        self.drey("drey call drey.cache.v1.Cache/Get '{bad json'", rc=2)
        self.drey("drey call drey.cache.v1.Cache/Nothing", rc=2)
        self.drey("drey call nonsense", rc=2)

    def test_interactive_mode_on_a_terminal(self):
        hist = os.path.join(tempfile.mkdtemp(), "history")
        pid, fd = pty.fork()
        if pid == 0:
            os.execve(DREY, [DREY, "--addr", self.addr, "--cache=tty"],
                      dict(os.environ, DREY_HISTFILE=hist, TERM="dumb"))
        seen = b""

        def expect(pattern, timeout=30):
            nonlocal seen
            deadline = time.monotonic() + timeout
            while re.search(pattern, seen) is None:
                left = deadline - time.monotonic()
                self.assertGreater(left, 0, "waited for %r; screen: %r" % (pattern, seen))
                r, _, _ = select.select([fd], [], [], left)
                if r:
                    seen += os.read(fd, 4096)
            seen = seen[re.search(pattern, seen).end():]

        try:
            expect(rb"> ")
            os.write(fd, b"set who world\r")
            expect(rb"> ")
            os.write(fd, b"get who\r")
            expect(rb"world\r?\n")
            expect(rb"> ")
            os.write(fd, b"get who -o json\r")
            expect(rb'"value":"world"')
            os.write(fd, b"get nobody\r")
            expect(rb"not found")
            os.write(fd, b"quit\r")
            _, status = os.waitpid(pid, 0)
            self.assertEqual(os.WEXITSTATUS(status), 0)
        finally:
            os.close(fd)
        with open(hist) as f:  # libedit's format: spaces as \040
            self.assertIn("get\\040who", f.read())
        # Lines from a pipe: no prompt, the same commands.
        out, _ = self.drey("drey --cache=tty", stdin="get who\nexists who\n")
        self.assertEqual(out, "world\nwho\ttrue\n")

    def test_failover_over_several_endpoints(self):
        dead = "127.0.0.1:1"  # nothing listens on port 1 here
        out, _ = self.drey("drey --addr %s --addr %s set f 1" % (dead, self.addr), addr="")
        out, _ = self.drey("drey --endpoints=%s,%s get f" % (dead, self.addr), addr="")
        self.assertEqual(out, "1\n")
        self.drey("drey get f", addr="", env={"DREY_ENDPOINTS": "%s,%s" % (dead, self.addr)})
        _, err = self.drey("drey --addr %s --timeout=2s get f" % dead, addr="", rc=1)
        self.assertIn("UNAVAILABLE", err)

    def test_metrics_process_set_and_principal_cap(self):
        channels = [grpc.insecure_channel(self.addr) for _ in range(6)]
        pb = protos()
        try:
            for ch in channels:  # one principal (conn:<id>) each
                ch.unary_unary("/grpc.health.v1.Health/Check",
                               request_serializer=pb.health.HealthCheckRequest.SerializeToString,
                               response_deserializer=pb.health.HealthCheckResponse.FromString)(
                    pb.health.HealthCheckRequest(), timeout=10)
                ch.unary_unary("/drey.cache.v1.Cache/Get", request_serializer=pb.cache.GetRequest.SerializeToString,
                               response_deserializer=pb.cache.GetResponse.FromString)(
                    pb.cache.GetRequest(key="m"), timeout=10)
            _, _, body = http_get("127.0.0.1", self.srv.ops_port, "/metrics")
            text = body.decode()
        finally:
            for ch in channels:
                ch.close()
        for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_virtual_memory_bytes",
                     "process_open_fds", "process_max_fds", "process_start_time_seconds"):
            self.assertRegex(text, r"(?m)^%s [0-9.e+]+$" % name)
        principals = re.findall(r'(?m)^drey_principal_admitted_total\{principal="([^"]+)"\}', text)
        self.assertLessEqual(len(principals), 3, "two busiest and other: %s" % principals)
        self.assertIn("other", principals)
        self.assertNotEqual(re.search(r'drey_principal_admitted_total\{principal="other"\} ([0-9.]+)', text).group(1),
                            "0")


class Secure(unittest.TestCase):
    """TLS and mutual TLS nodes, certificates from the openssl CLI."""

    @classmethod
    def setUpClass(cls):
        d = cls.dir = tempfile.mkdtemp(prefix="drey-cli-pki-")

        def path(n):
            return os.path.join(d, n)

        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
                path("ca.key"), "-out", path("ca.pem"), "-subj", "/CN=cli-test-ca", "-days", "2",
                "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        for name, ext in (("server", "subjectAltName=DNS:drey.test\nextendedKeyUsage=serverAuth\n"),
                          ("client", "extendedKeyUsage=clientAuth\n")):
            openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
                    path(name + ".key"), "-out", path(name + ".csr"), "-subj", "/CN=" + name)
            with open(path(name + ".ext"), "w") as f:
                f.write(ext + "basicConstraints=CA:FALSE\n")
            openssl("x509", "-req", "-in", path(name + ".csr"), "-CA", path("ca.pem"), "-CAkey", path("ca.key"),
                    "-CAcreateserial", "-days", "2", "-out", path(name + ".pem"), "-extfile", path(name + ".ext"))
        cls.ca, cls.cert, cls.key = path("ca.pem"), path("client.pem"), path("client.key")
        cls.tls = DreyServer("--ephemeral", "--tls-cert=" + path("server.pem"), "--tls-key=" + path("server.key"))
        cls.mtls = DreyServer("--ephemeral", "--tls-cert=" + path("server.pem"), "--tls-key=" + path("server.key"),
                              "--tls-client-ca=" + path("ca.pem"))
        for s in (cls.tls, cls.mtls):
            s.spawn()
            s.port = int(s.wait_log(lambda r: r.get("msg") == "listening", 30)["port"])
            s.wait_log(lambda r: r.get("msg") == "serving", 30)

    @classmethod
    def tearDownClass(cls):
        cls.tls.stop()
        cls.mtls.stop()

    def drey(self, line, rc=0, **kw):
        got, out, err = run(line, **kw)
        self.assertEqual(got, rc, "%s: exit %d\nstdout: %s\nstderr: %s" % (line, got, out, err))
        return out, err

    def test_tls(self):
        a = self.tls.address
        self.drey("drey --addr %s --tls-ca %s --tls-server-name drey.test set k v" % (a, self.ca))
        out, _ = self.drey("drey --addr=%s --tls-ca=%s --tls-server-name=drey.test get k" % (a, self.ca))
        self.assertEqual(out, "v\n")
        out, _ = self.drey("drey get k", env={"DREY_ADDR": a, "DREY_TLS_CA": self.ca,
                                              "DREY_TLS_SERVER_NAME": "drey.test"})
        self.assertEqual(out, "v\n")
        # plaintext to a TLS node, and a name the certificate does not have, fail
        self.drey("drey --addr %s --timeout 2s get k" % a, rc=1)
        self.drey("drey --addr %s --tls-ca %s --timeout 2s get k" % (a, self.ca), rc=1)
        # files that are not there or not PEM: usage, nothing sent
        self.drey("drey --addr %s --tls-ca /nonexistent get k" % a, rc=1)
        self.drey("drey --addr %s --tls-ca %s --tls-cert %s get k" % (a, self.ca, self.cert), rc=1)

    def test_mutual_tls(self):
        a = self.mtls.address
        base = "drey --addr %s --tls-ca %s --tls-server-name drey.test" % (a, self.ca)
        self.drey(base + " --tls-cert %s --tls-key %s set k v" % (self.cert, self.key))
        out, _ = self.drey(base + " get k", env={"DREY_TLS_CERT": self.cert, "DREY_TLS_KEY": self.key})
        self.assertEqual(out, "v\n")
        self.drey(base + " --timeout 2s get k", rc=1)  # no client certificate
        out, _ = self.drey(base + " --tls-cert %s --tls-key %s call grpc.health.v1.Health/Check" % (self.cert, self.key))
        self.assertEqual(json.loads(out), {"status": "SERVING"})


class Tokens(unittest.TestCase):
    def test_token_file(self):
        kd = KeyDir()
        key = kd.hmac("k1")
        srv = DreyServer("--ephemeral", "--jwt-keys-dir=" + kd.path).start()
        try:
            tf = os.path.join(kd.base, "token")
            with open(tf, "w") as f:
                f.write("  " + mint(key) + "\n")
            rc, _, err = run("drey set k v", addr=srv.address)
            self.assertEqual(rc, 1)
            self.assertIn("TOKEN_MISSING", err)
            rc, _, err = run("drey --token-file %s set k v" % tf, addr=srv.address)
            self.assertEqual(rc, 0, err)
            rc, out, err = run("drey get k", addr=srv.address, env={"DREY_TOKEN_FILE": tf})
            self.assertEqual((rc, out), (0, "v\n"), err)
            rc, _, err = run("drey --token-file /nonexistent get k", addr=srv.address)
            self.assertEqual(rc, 2, err)
        finally:
            srv.stop()


class ClusterView(unittest.TestCase):
    def test_status_from_any_node_and_from_etcd(self):
        with Cluster(partitions=8, initial_nodes=3, replication_factor=2) as cl:
            nodes = cl.start(3)
            cl.wait_assigned(3)
            a = nodes[1].server.address
            doc = poll(lambda: json.loads(run("drey cluster status -o json", addr=a)[1]),
                       lambda d: d["underReplicatedPartitions"] == 0 and not d["moves"] and
                       all(n["state"] == "serving" for n in d["nodes"]) and
                       # every backup has heard its primary (a new one's lag is not known yet)
                       all(r.get("lagMs", 0) is not None for r in d["table"]),
                       timeout=60, what="a settled cluster")
            self.assertEqual(doc["source"], "node")
            self.assertEqual((doc["partitions"], doc["replicationFactor"]), (8, 2))
            self.assertEqual(sorted(n["id"] for n in doc["nodes"]), ["n1", "n2", "n3"])
            self.assertEqual(sum(n["partitions"] for n in doc["nodes"]), 8)
            self.assertEqual(sum(n["backups"] for n in doc["nodes"]), 8)
            self.assertEqual([n["copies"] for n in doc["nodes"]],
                             [n["partitions"] + n["backups"] for n in doc["nodes"]])
            self.assertEqual(sum(n["syncing"] for n in doc["nodes"]), 0)
            self.assertTrue(all(n["lease"] == "valid" for n in doc["nodes"]))
            self.assertEqual(sum(n["controller"] for n in doc["nodes"]), 1)
            self.assertTrue(all(re.match(r"drey \d+\.\d+\.\d+ ", n["build"]) for n in doc["nodes"]))
            self.assertEqual(len(doc["table"]), 8)
            self.assertTrue(all("lagMs" not in r or r["lagMs"] >= 1000 or r.get("pending") for r in doc["table"]),
                            "idle partitions show no lag: %s" % doc["table"])
            # the short table: members, totals, no partitions when all is well
            rc, out, err = run("drey --addr %s cluster status -o table" % a)
            self.assertEqual(rc, 0, err)
            self.assertRegex(out, r"(?m)^ID +ADVERTISE +PARTITIONS +BACKUPS +COPIES +SYNCING +STATE +LEASE +ROLE +BUILD$")
            self.assertNotIn("PARTITION ", out)
            self.assertLess(len(out), 2000)
            rc, out, _ = run("drey cluster status --partitions -o table", addr=a)
            lines = out.splitlines()
            header = next(i for i, l in enumerate(lines) if l.startswith("PARTITION "))
            self.assertEqual(len(lines) - header - 1, 8, out)
            rc, out, _ = run("drey cluster status", addr=a)
            self.assertEqual(len([l for l in out.splitlines() if l.startswith("member\t")]), 3)
            # the same from etcd
            rc, out, err = run("drey cluster status --etcd %s --prefix %s -o json" % (cl.etcd.url, cl.prefix))
            self.assertEqual(rc, 0, err)
            e = json.loads(out)
            self.assertEqual(e["source"], "etcd")
            self.assertEqual({r["partition"]: r["primary"] for r in e["table"]},
                             {r["partition"]: r["primary"] for r in doc["table"]})
            # stats counts each partition once, however many copies it has
            for k in ("a", "b", "c"):  # mset is atomic, so one partition only: three sets
                self.assertEqual(run("drey set %s 1" % k, addr=a)[0], 0)
            rc, _, err = run("drey mset a 1 b 2 c 3", addr=a)
            self.assertEqual(rc, 1)
            self.assertIn("CROSS_PARTITION", err)
            for n in nodes:
                rc, out, err = run("drey stats -o json", addr=n.server.address)
                self.assertEqual(rc, 0, err)
                row = json.loads(out.splitlines()[0])
                self.assertEqual(row["entries"], 3, n.server.address)
            # any node answers; a stopped one fails over
            nodes[0].server.stop()
            rc, out, err = run("drey --endpoints %s,%s get a" % (nodes[0].server.address, a))
            self.assertEqual((rc, out), (0, "1\n"), err)
            doc = poll(lambda: json.loads(run("drey cluster status -o json", addr=a)[1]),
                       lambda d: "n1" not in [n["id"] for n in d["nodes"]] or d["unanswered"] == ["n1"],
                       timeout=60, what="n1 gone or unanswered")
            # a single node is not a cluster member
            single = DreyServer("--ephemeral").start()
            try:
                rc, _, err = run("drey cluster status", addr=single.address)
                self.assertEqual(rc, 3, err)
            finally:
                single.stop()


if __name__ == "__main__":
    main()
