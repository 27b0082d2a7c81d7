"""The process: a taken port, the JSON log (and what it must never contain),
configuration from flags and the environment, and start-up refusals."""

import re
import subprocess
import time

import grpc

from drey_harness import (CACHE_SERVICE, REFLECTION_V1, BidiStream, DreyServer, DreyTestCase, RpcFailure,
                          ServiceClient, find_dreyd, main, make_value, supported_flags)

SECRET_KEY = "S3CR3T-key-9b1e"
SECRET_VALUE = "S3CR3T-value-77c4"
SECRET_CACHE = "S3CR3T-cache-a0d2"


class PortInUseTest(DreyTestCase):

    def test_second_server_on_a_taken_port(self):
        first = self.server
        cases = [("127.0.0.1:%d" % first.port, ()), ("localhost:%d" % first.port, ())]
        if "insecure-allow-anonymous-remote" in supported_flags(first.binary):
            # a wildcard address needs auth or this explicit opt-out
            cases.append(("0.0.0.0:%d" % first.port, ("--insecure-allow-anonymous-remote",)))
        else:
            cases.append(("0.0.0.0:%d" % first.port, ()))
        for listen, flags in cases:
            with self.subTest(listen=listen):
                second = DreyServer(*flags, listen=listen, name="second dreyd").spawn()
                self.addCleanup(second.kill)
                t0 = time.monotonic()
                rc = second.wait(timeout=20)
                self.assertLess(time.monotonic() - t0, 10, "the second server took long to give up")
                self.assertNotEqual(rc, 0, "a second server started on a taken port")
                second.check_log_format()
                recs = second.log_records(strict=True)
                self.assertIsNone(second.find_log(lambda r: r.get("msg") == "listening"))
                errs = [r for r in recs if r["level"] == "error" and r["msg"] == "cannot start"]
                self.assertEqual(len(errs), 1, second.log_text())
                self.assertIn("already in use", errs[0].get("error", ""))
                self.assertIn(str(first.port), errs[0].get("error", ""))
                self.assertEqual(errs[0].get("listen"), listen)
        # the first one keeps serving
        self.assertEqual(self.health.Check(self.pb.health.HealthCheckRequest(), timeout=30).status,
                         self.pb.health.HealthCheckResponse.SERVING)
        self.set("still-here", 1)
        self.assertEqual(self.get_value("still-here"), 1)
        self.assertEqual(first.proc.poll(), None)


class LogTest(DreyTestCase):
    SERVER_FLAGS = None

    def test_log_lines_are_json_and_never_hold_data(self):
        srv = DreyServer("--log-level=debug", drain_grace="50ms").start()
        try:
            ch = srv.channel()
            cache = ServiceClient(ch, self.pb.cache, CACHE_SERVICE)
            health = ServiceClient(ch, self.pb.health, "grpc.health.v1.Health")
            refl = ServiceClient(ch, self.pb.reflection_v1, REFLECTION_V1)
            E = self.pb.cache.SetManyRequest.Entry
            req = cache.request
            cache.Set(req("Set", cache=SECRET_CACHE, key=SECRET_KEY, value=make_value(SECRET_VALUE)), timeout=30)
            cache.Get(req("Get", cache=SECRET_CACHE, key=SECRET_KEY), timeout=30)
            cache.SetMany(req("SetMany", entries=[E(key=SECRET_KEY + "2", value=make_value(SECRET_VALUE.encode()))]),
                          timeout=30)
            cache.Increment(req("Increment", key=SECRET_KEY + "n", delta=1), timeout=30)
            cache.Remove(req("Remove", cache=SECRET_CACHE, key=SECRET_KEY, return_previous=True), timeout=30)
            failing = [
                lambda: cache.Set(req("Set", key=SECRET_KEY + "\n", value=make_value(SECRET_VALUE)), timeout=30),
                lambda: cache.Set(req("Set", cache=SECRET_CACHE + "/", key="k"), timeout=30),
                lambda: cache.Set(req("Set", key="k", value=make_value(SECRET_VALUE), request_id=SECRET_KEY * 20),
                                  timeout=30),
                lambda: cache.Increment(req("Increment", key=SECRET_KEY + "2", delta=1), timeout=30),
                lambda: health.Check(self.pb.health.HealthCheckRequest(service=SECRET_KEY), timeout=30),
                lambda: ch.unary_unary("/" + SECRET_KEY + "/Method")(b"", timeout=30),
                lambda: ch.unary_unary("/drey.cache.v1.Cache/Set")(SECRET_VALUE.encode() + b"\xff", timeout=30),
            ]
            for f in failing:
                with self.assertRaises(grpc.RpcError):
                    f()
            s = BidiStream(refl.ServerReflectionInfo)
            s.ask(self.pb.reflection_v1.ServerReflectionRequest(file_containing_symbol=SECRET_KEY))
            s.ask(self.pb.reflection_v1.ServerReflectionRequest(file_by_filename=SECRET_KEY + ".proto"))
            s.close()
        finally:
            srv.stop()
        text = srv.log_text()
        for secret in ("S3CR3T", SECRET_KEY, SECRET_VALUE, SECRET_CACHE):
            self.assertNotIn(secret, text, "the log holds data a client sent")
        recs = srv.log_records(strict=True)
        msgs = [r["msg"] for r in recs]
        for m in ("listening", "draining", "stopping", "stopped"):
            self.assertIn(m, msgs)
        self.assertLess(msgs.index("listening"), msgs.index("draining"))
        self.assertLess(msgs.index("stopping"), msgs.index("stopped"))
        self.assertEqual(msgs[-1], "stopped")
        listening = recs[msgs.index("listening")]
        self.assertEqual(listening["port"], srv.port)
        self.assertEqual(listening["pid"], srv.proc.pid)
        for r in recs:
            self.assertRegex(r["time"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
        self.assertTrue(re.match(r"^\{\"time\":", text), "the first key of a line is time")


class ConfigTest(DreyTestCase):
    SERVER_FLAGS = None

    def batch_limit_of(self, srv):
        """The max-batch a server enforces, from its ErrorInfo metadata."""
        cache = ServiceClient(srv.channel(), self.pb.cache, CACHE_SERVICE)
        try:
            cache.GetMany(cache.request("GetMany", keys=["k%d" % i for i in range(200)]), timeout=30)
        except grpc.RpcError as e:
            return int(RpcFailure(e).metadata["limitItems"])
        return None

    def test_environment_and_flags(self):
        srv = self.start_server(env={"DREY_MAX_BATCH": "7"})
        self.assertEqual(self.batch_limit_of(srv), 7)
        srv = self.start_server("--max-batch=9", env={"DREY_MAX_BATCH": "7"})
        self.assertEqual(self.batch_limit_of(srv), 9, "a flag must win over the environment")
        srv = self.start_server("--max-batch", "11")
        self.assertEqual(self.batch_limit_of(srv), 11)

    def test_bad_configuration_is_refused(self):
        for args, env in ((["--nope=1"], None), (["--max-batch=0"], None), (["--max-value-bytes=lots"], None),
                          (["--log-level=chatty"], None), (["positional"], None), ([], {"DREY_MAX_BATCH": "x"}),
                          (["--drain-grace=5 s"], None)):
            with self.subTest(args=args, env=env):
                srv = DreyServer(*args, env=env).spawn()
                self.addCleanup(srv.kill)
                rc = srv.wait(timeout=20)
                self.assertEqual(rc, 2, srv.log_text())
                self.assertTrue(srv.log_text().strip(), "refused without saying why")
                self.assertIsNone(srv.find_log(lambda r: r.get("msg") == "listening"))

    def test_help(self):
        out = subprocess.run([find_dreyd(), "--help"], capture_output=True, text=True, timeout=20)
        self.assertEqual(out.returncode, 0)
        for opt in ("--listen", "--max-recv-message-bytes", "--max-value-bytes", "--max-batch", "--drain-grace"):
            self.assertIn(opt, out.stdout)

    def test_bad_listen_address(self):
        for listen in ("nonsense", "256.1.1.1:1"):
            with self.subTest(listen=listen):
                srv = DreyServer(listen=listen).spawn()
                self.addCleanup(srv.kill)
                self.assertNotEqual(srv.wait(timeout=20), 0)
                self.assertIn(listen, srv.log_text(), "the refusal does not name the address")
                self.assertIsNone(srv.find_log(lambda r: r.get("msg") == "listening"))


if __name__ == "__main__":
    main()
