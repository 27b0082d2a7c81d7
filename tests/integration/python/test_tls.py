"""TLS and mutual TLS through the real server, with certificates made by the
openssl CLI: a test CA, server certificates for 127.0.0.1/localhost, client
certificates from the CA and from a CA the node does not trust.

* --tls-cert/--tls-key: a grpcio secure channel works, a plaintext one does
  not, nor does a client that does not trust the node's CA.
* --tls-client-ca: a client without a certificate, or with one from another
  CA, is refused; one with a certificate from the CA works.
* Rotation: the certificate files replaced while the node runs (a new key
  and serial) are served to the next connection (the serial read with
  `openssl s_client`); a replacement that does not load keeps the old
  certificate; connections made before go on working.
"""

import os
import subprocess
import tempfile

import grpc

from drey_harness import CACHE_SERVICE, DreyServer, DreyTestCase, ServiceClient, main, make_value, value_of
from drey_tokens import fresh_channel, openssl, poll, write_atomic

RPC_TIMEOUT = 30


class Pki:
    """A CA and the certificates a test needs, in a private directory."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="drey-pki-", dir=os.environ.get("TEST_TMPDIR"))
        self.ca_key, self.ca = self.self_signed("ca", "drey-test-ca")
        self.other_ca_key, self.other_ca = self.self_signed("other-ca", "someone-else-ca")

    def path(self, name):
        return os.path.join(self.dir, name)

    def self_signed(self, name, cn):
        key, pem = self.path(name + ".key"), self.path(name + ".pem")
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key,
                "-out", pem, "-subj", "/CN=" + cn, "-days", "2",
                "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
        return key, pem

    def issue(self, name, cn, serial, server=True, ca=None):
        """A key and certificate signed by the CA (or `ca`: (key, pem))."""
        ca_key, ca_pem = ca or (self.ca_key, self.ca)
        key, csr, pem, ext = (self.path(name + s) for s in (".key", ".csr", ".pem", ".ext"))
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key,
                "-out", csr, "-subj", "/CN=" + cn)
        with open(ext, "w") as f:
            if server:
                f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
            else:
                f.write("extendedKeyUsage=clientAuth\n")
            f.write("basicConstraints=CA:FALSE\n")
        openssl("x509", "-req", "-in", csr, "-CA", ca_pem, "-CAkey", ca_key, "-set_serial", "0x%x" % serial,
                "-days", "2", "-out", pem, "-extfile", ext)
        return key, pem

    @staticmethod
    def read(path):
        with open(path, "rb") as f:
            return f.read()


def served_serial(port, pki, client=None):
    """The serial of the certificate the node serves to a new connection,
    as `openssl x509 -serial` prints it (hex, upper case)."""
    args = ["openssl", "s_client", "-connect", "127.0.0.1:%d" % port, "-servername", "localhost", "-alpn", "h2",
            "-CAfile", pki.ca]
    if client:
        args += ["-key", client[0], "-cert", client[1]]
    r = subprocess.run(args, input=b"", capture_output=True, timeout=60)
    pem = r.stdout
    if b"BEGIN CERTIFICATE" not in pem:
        raise AssertionError("s_client got no certificate (rc %d): %s" % (r.returncode, r.stderr[-2000:]))
    out = openssl("x509", "-noout", "-serial", input=pem).decode().strip()
    return out.split("=", 1)[1]


class TlsCase(DreyTestCase):
    SERVER_FLAGS = None

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.pki = Pki()
        cls.srv_key, cls.srv_pem = cls.pki.issue("server-1001", "localhost", 0x1001)
        cls.cli_key, cls.cli_pem = cls.pki.issue("client", "drey-client", 0x2001, server=False)
        cls.bad_cli_key, cls.bad_cli_pem = cls.pki.issue(
            "stranger", "stranger", 0x3001, server=False, ca=(cls.pki.other_ca_key, cls.pki.other_ca))

    def setUp(self):
        super().setUp()
        # the node of each test reads its own copies; rotation replaces them
        self.cert_path = self.pki.path(self._testMethodName + ".served.pem")
        self.key_path = self.pki.path(self._testMethodName + ".served.key")
        write_atomic(self.cert_path, Pki.read(self.srv_pem))
        write_atomic(self.key_path, Pki.read(self.srv_key))

    def creds(self, client_cert=True, ca=None, bad=False):
        kw = {"root_certificates": Pki.read(ca or self.pki.ca)}
        if client_cert:
            key, pem = (self.bad_cli_key, self.bad_cli_pem) if bad else (self.cli_key, self.cli_pem)
            kw.update(private_key=Pki.read(key), certificate_chain=Pki.read(pem))
        return grpc.ssl_channel_credentials(**kw)

    def cache_over(self, srv, credentials):
        ch = fresh_channel(srv.address, credentials=credentials)
        self.addCleanup(ch.close)
        return ServiceClient(ch, self.pb.cache, CACHE_SERVICE)

    def start_tls(self, *flags, client_cert=True):
        srv = DreyServer("--ephemeral", "--tls-cert=" + self.cert_path, "--tls-key=" + self.key_path, *flags)
        try:
            srv.start(wait_ready=False)
        except AssertionError as e:
            raise self.failureException("dreyd with --tls-cert/--tls-key %s did not start: %s" % (
                " ".join(flags) or "and no --tls-client-ca", e)) from None

        def cleanup():
            if srv.returncode is None:
                srv.stop()
        self.addCleanup(cleanup)
        health = ServiceClient(fresh_channel(srv.address, credentials=self.creds(client_cert)), self.pb.health,
                               "grpc.health.v1.Health")
        self.addCleanup(health.channel.close)
        poll(lambda: self.health_status(health), lambda s: s == "SERVING", timeout=30, interval=0.02,
             what="SERVING over TLS")
        return srv

    def health_status(self, health):
        try:
            r = health.Check(self.pb.health.HealthCheckRequest(), timeout=5, wait_for_ready=True)
            return self.pb.health.HealthCheckResponse.ServingStatus.Name(r.status)
        except grpc.RpcError as e:
            return e.code().name

    def works(self, cache):
        k = self.key()
        cache.Set(self.pb.cache.SetRequest(key=k, value=make_value("tls")), timeout=RPC_TIMEOUT)
        return value_of(cache.Get(self.pb.cache.GetRequest(key=k), timeout=RPC_TIMEOUT).value) == "tls"

    def fails(self, cache):
        with self.assertRaises(grpc.RpcError) as cm:
            cache.Get(self.pb.cache.GetRequest(key="x"), timeout=10)
        self.assertEqual(cm.exception.code(), grpc.StatusCode.UNAVAILABLE, cm.exception)

    def rotate(self, key, pem):
        # the key first: a handshake in between would see a mismatch, which
        # must not replace what is served
        write_atomic(self.key_path, Pki.read(key))
        write_atomic(self.cert_path, Pki.read(pem))


class TlsTest(TlsCase):
    """--tls-cert and --tls-key alone: TLS without client certificates."""

    def test_secure_channel_works_and_plaintext_does_not(self):
        srv = self.start_tls(client_cert=False)
        self.assertTrue(self.works(self.cache_over(srv, self.creds(client_cert=False))))
        # a client certificate is not asked for, and does no harm
        self.assertTrue(self.works(self.cache_over(srv, self.creds())))
        ch = fresh_channel(srv.address)
        self.addCleanup(ch.close)
        self.fails(ServiceClient(ch, self.pb.cache, CACHE_SERVICE))
        self.fails(self.cache_over(srv, self.creds(client_cert=False, ca=self.pki.other_ca)))
        self.assertEqual(served_serial(srv.port, self.pki), "1001")

    def test_rotation_without_client_certificates(self):
        srv = self.start_tls(client_cert=False)
        before = self.cache_over(srv, self.creds(client_cert=False))
        self.assertTrue(self.works(before))
        key, pem = self.pki.issue("server-1002", "localhost", 0x1002)
        self.rotate(key, pem)
        self.assertEqual(served_serial(srv.port, self.pki), "1002")
        self.assertTrue(self.works(self.cache_over(srv, self.creds(client_cert=False))))
        self.assertTrue(self.works(before))


class MutualTlsTest(TlsCase):
    """--tls-client-ca: client certificates from that CA are required."""

    def test_client_certificates_are_required(self):
        srv = self.start_tls("--tls-client-ca=" + self.pki.ca)
        self.assertTrue(self.works(self.cache_over(srv, self.creds())))
        self.fails(self.cache_over(srv, self.creds(client_cert=False)))
        self.fails(self.cache_over(srv, self.creds(bad=True)))
        ch = fresh_channel(srv.address)
        self.addCleanup(ch.close)
        self.fails(ServiceClient(ch, self.pb.cache, CACHE_SERVICE))
        cli = (self.cli_key, self.cli_pem)
        self.assertEqual(served_serial(srv.port, self.pki, client=cli), "1001")

    def test_rotation_is_seen_by_new_connections_and_a_broken_one_keeps_the_old(self):
        srv = self.start_tls("--tls-client-ca=" + self.pki.ca)
        cli = (self.cli_key, self.cli_pem)
        before = self.cache_over(srv, self.creds())
        self.assertTrue(self.works(before))
        self.assertEqual(served_serial(srv.port, self.pki, client=cli), "1001")
        key2, pem2 = self.pki.issue("server-1002", "localhost", 0x1002)
        self.rotate(key2, pem2)
        self.assertEqual(served_serial(srv.port, self.pki, client=cli), "1002")
        self.assertTrue(self.works(self.cache_over(srv, self.creds())))
        self.assertTrue(self.works(before), "a connection made before the rotation broke")
        srv.wait_log(lambda r: r.get("msg") == "tls: certificates reloaded", 30, what="the reload log line")

        # a certificate file that is not PEM: the node keeps serving 1002
        write_atomic(self.cert_path, b"-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
        self.assertEqual(served_serial(srv.port, self.pki, client=cli), "1002")
        self.assertTrue(self.works(self.cache_over(srv, self.creds())))
        # a certificate that does not match the key: still 1002
        _, pem3 = self.pki.issue("server-1003", "localhost", 0x1003)
        write_atomic(self.cert_path, Pki.read(pem3))
        self.assertEqual(served_serial(srv.port, self.pki, client=cli), "1002")
        self.assertTrue(self.works(self.cache_over(srv, self.creds())))
        # a good pair again: served
        key4, pem4 = self.pki.issue("server-1004", "localhost", 0x1004)
        self.rotate(key4, pem4)
        self.assertEqual(served_serial(srv.port, self.pki, client=cli), "1004")
        self.assertTrue(self.works(self.cache_over(srv, self.creds())))
        self.assertTrue(self.works(before))


    def test_a_broken_rotation_is_reported_not_announced(self):
        """The log must not say a rotation worked when the old certificate is
        kept (tls.c means to warn "new certificates do not load; keeping
        the old ones")."""
        srv = self.start_tls("--tls-client-ca=" + self.pki.ca)
        cli = (self.cli_key, self.cli_pem)
        self.assertEqual(served_serial(srv.port, self.pki, client=cli), "1001")
        write_atomic(self.cert_path, b"-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
        self.assertEqual(served_serial(srv.port, self.pki, client=cli), "1001")
        self.assertTrue(self.works(self.cache_over(srv, self.creds())))
        msgs = [r.get("msg") for r in srv.log_records()]
        self.assertIn("tls: new certificates do not load; keeping the old ones", msgs, srv.log_text())
        self.assertNotIn("tls: certificates reloaded", msgs,
                         "a certificate that was not loaded was logged as reloaded:\n" + srv.log_text())


class TlsStartupTest(TlsCase):

    def test_unreadable_certificates_stop_the_start(self):
        cases = {
            "missing cert": ("--tls-cert=" + self.pki.path("absent.pem"), "--tls-key=" + self.key_path),
            "missing key": ("--tls-cert=" + self.cert_path, "--tls-key=" + self.pki.path("absent.key")),
            "missing client CA": ("--tls-cert=" + self.cert_path, "--tls-key=" + self.key_path,
                                  "--tls-client-ca=" + self.pki.path("absent-ca.pem")),
        }
        not_pem = self.pki.path("not-a-cert.pem")
        write_atomic(not_pem, b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")
        # files that read but do not load (checked by gRPC core, which logs why)
        unusable = {
            "a cert that is not PEM": ("--tls-cert=" + not_pem, "--tls-key=" + self.key_path,
                                       "--tls-client-ca=" + self.pki.ca),
            "a key of another cert": ("--tls-cert=" + self.cert_path, "--tls-key=" + self.cli_key,
                                      "--tls-client-ca=" + self.pki.ca),
        }
        for name, flags in list(cases.items()) + list(unusable.items()):
            with self.subTest(name):
                srv = DreyServer("--ephemeral", *flags).spawn()
                self.addCleanup(srv.kill)
                rc = srv.wait(timeout=30)
                self.assertNotEqual(rc, 0, srv.log_text())
                self.assertIsNone(srv.find_log(lambda r: r.get("msg") == "listening"), srv.log_text())
                srv.check_log_format()
                errs = [r for r in srv.log_records() if r.get("level") == "error"]
                self.assertTrue(errs, srv.log_text())
                if name in cases:
                    self.assertIn("tls", str(errs[0]))
                else:
                    self.assertRegex(" ".join(str(e) for e in errs), r"(?i)cert|key", srv.log_text())


if __name__ == "__main__":
    main()
