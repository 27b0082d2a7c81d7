"""The control plane behind TLS and etcd's authentication: Debian's etcd,
`drey cluster` and two dreyd.

* etcd with https:// client URLs and --client-cert-auth: `drey cluster init`
  and `status` and the nodes (--cluster-etcd-ca/-cert/-key) work with a
  client certificate etcd's CA signed; without one the CLI and the node
  fail with a clear message.
* etcd with auth enabled and a user whose role covers only the cluster's
  prefix: the CLI and the nodes (--cluster-etcd-user,
  --cluster-etcd-password-file; or the CLI's DREY_CLUSTER_ETCD_* variables)
  work under the prefix, and a prefix outside the role is refused.
"""

import json
import os
import subprocess
import tempfile

from drey_cluster import Cluster, ClusterCA, Etcd, ETCD, free_port
from drey_harness import DreyServer, DreyTestCase, main, make_value
from drey_tokens import openssl, poll


class TlsEtcd(Etcd):
    """One member serving https:// to clients whose certificate its CA
    signed; /health on a plain metrics port."""

    def __init__(self, ca):
        super().__init__()
        self.metrics_port = free_port()
        self.cert, self.key = ca.issue("etcd", san="127.0.0.1")
        # The SAN must be an IP address for 127.0.0.1: issue() writes DNS.
        base = os.path.join(self.tmp, "server")
        ext = base + ".ext"
        with open(ext, "w") as f:
            f.write("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n")
        openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", base + ".key",
                "-out", base + ".csr", "-subj", "/CN=etcd")
        openssl("x509", "-req", "-in", base + ".csr", "-CA", ca.ca, "-CAkey", ca.ca_key, "-set_serial", "77",
                "-out", base + ".pem", "-days", "2", "-extfile", ext)
        self.cert, self.key, self.ca = base + ".pem", base + ".key", ca.ca

    @property
    def url(self):
        return "https://127.0.0.1:%d" % self.client_port

    def start(self, timeout=30):
        peer = "http://127.0.0.1:%d" % self.peer_port
        self.log = open(os.path.join(self.tmp, "etcd.log"), "ab")
        self.proc = subprocess.Popen(
            [ETCD, "--name=default", "--data-dir=" + os.path.join(self.tmp, "data"),
             "--listen-client-urls=" + self.url, "--advertise-client-urls=" + self.url,
             "--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
             "--initial-cluster=default=" + peer, "--cert-file=" + self.cert, "--key-file=" + self.key,
             "--trusted-ca-file=" + self.ca, "--client-cert-auth",
             "--listen-metrics-urls=http://127.0.0.1:%d" % self.metrics_port],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)
        saved, self.client_port = self.client_port, self.metrics_port
        try:
            poll(self.healthy, lambda ok: ok, timeout=timeout, what="etcd healthy")
        finally:
            self.client_port = saved
        return self


class AuthEtcd(Etcd):
    """One member with auth enabled: root, and user drey whose role may read
    and write under allowed/ only."""

    PASSWORD = "pw-of-drey"

    def start(self, timeout=30):
        super().start(timeout)
        for args in (["user", "add", "root:rootpw"], ["role", "add", "drey"],
                     ["role", "grant-permission", "drey", "--prefix=true", "readwrite", "allowed/"],
                     ["user", "add", "drey:" + self.PASSWORD], ["user", "grant-role", "drey", "drey"],
                     ["auth", "enable"]):
            r = subprocess.run(["etcdctl", "--endpoints=" + self.url] + args, capture_output=True, text=True,
                               timeout=30, env=dict(os.environ, ETCDCTL_API="3"))
            assert r.returncode == 0, r.stderr
        return self


class SecureCluster(Cluster):
    """Cluster, on a given etcd, with extra flags for the CLI and nodes."""

    def __init__(self, etcd, cli_flags, node_flags, prefix, **kw):
        super().__init__(extra_flags=node_flags, **kw)
        self.etcd = etcd
        self.cli_flags = list(cli_flags)
        self.prefix = prefix

    def __enter__(self):
        self.etcd.start()
        out = self.cli("cluster", "init", "--etcd=" + self.etcd.url, "--prefix=" + self.prefix,
                       "--partitions=%d" % self.partitions, "--initial-nodes=%d" % self.initial_nodes,
                       "--replication-factor=1", *self.cli_flags)
        assert out.returncode == 0, out.stderr
        return self

    def status(self):
        out = self.cli("cluster", "status", "--etcd=" + self.etcd.url, "--prefix=" + self.prefix, "-o", "json",
                       *self.cli_flags)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)


class EtcdSecurityTest(DreyTestCase):
    SERVER_FLAGS = None

    def serve_two(self, cl):
        nodes = cl.start(2)
        cl.wait_assigned(2)
        owners = cl.agreed_owners(nodes)
        self.assertTrue(all(owners.values()))
        nodes[0].cache.Set(self.pb.cache.SetRequest(key="k", value=make_value("v")), timeout=30)
        self.assertTrue(nodes[1].cache.Get(self.pb.cache.GetRequest(key="k"), timeout=30).found)
        self.assertEqual(sorted(n["id"] for n in cl.status()["nodes"]), ["n1", "n2"])

    def test_nodes_and_cli_over_tls_with_client_certificates(self):
        ca = ClusterCA("etcd-ca")
        self.addCleanup(ca.cleanup)
        etcd = TlsEtcd(ca)
        client_cert, client_key = ca.issue("drey-client")
        tls = ["--etcd-ca=" + ca.ca, "--etcd-cert=" + client_cert, "--etcd-key=" + client_key]
        node_tls = ["--cluster-etcd-ca=" + ca.ca, "--cluster-etcd-cert=" + client_cert,
                    "--cluster-etcd-key=" + client_key]
        with SecureCluster(etcd, tls, node_tls, "tls-test/", partitions=8, initial_nodes=2) as cl:
            self.serve_two(cl)
            # Without a client certificate etcd refuses the handshake.
            out = cl.cli("cluster", "status", "--etcd=" + etcd.url, "--prefix=" + cl.prefix,
                         "--etcd-ca=" + ca.ca, timeout=60)
            self.assertNotEqual(out.returncode, 0)
            self.assertIn("cannot", out.stderr.lower() + out.stdout.lower())
            out = cl.cli("cluster", "status", "--etcd=" + etcd.url.replace("https", "http"), "--prefix=" + cl.prefix,
                         *tls, timeout=60)
            self.assertNotEqual(out.returncode, 0, "TLS files with a plaintext endpoint are refused")
            self.assertIn("no endpoint is https://", out.stderr)
            flags = [f for f in cl.node_flags("n3", *ca.issue("n3")) if not f.startswith("--cluster-etcd-key=")]
            bad = DreyServer(*flags, name="n3")
            bad.spawn()
            self.assertEqual(bad.wait(), 1)
            self.assertIn("needs its key", bad.log_text())

    def test_nodes_and_cli_with_etcd_authentication_on_their_prefix(self):
        etcd = AuthEtcd()
        pw = os.path.join(tempfile.mkdtemp(prefix="drey-pw-"), "password")
        with open(pw, "w") as f:
            f.write(AuthEtcd.PASSWORD + "\n")
        auth = ["--etcd-user=drey", "--etcd-password-file=" + pw]
        node_auth = ["--cluster-etcd-user=drey", "--cluster-etcd-password-file=" + pw]
        with SecureCluster(etcd, auth, node_auth, "allowed/drey/", partitions=8, initial_nodes=2) as cl:
            self.serve_two(cl)
            # The same through the variables dreyd reads (a pod's environment).
            env = dict(os.environ, DREY_CLUSTER_ETCD=etcd.url, DREY_CLUSTER_ETCD_USER="drey",
                       DREY_CLUSTER_ETCD_PASSWORD_FILE=pw)
            from drey_cluster import drey_cli
            out = subprocess.run([drey_cli(), "cluster", "status", "--prefix=" + cl.prefix], capture_output=True,
                                 text=True, timeout=60, env=env)
            self.assertEqual(out.returncode, 0, out.stderr)
            # Outside the role's prefix etcd refuses.
            out = cl.cli("cluster", "init", "--etcd=" + etcd.url, "--prefix=elsewhere/", *auth)
            self.assertNotEqual(out.returncode, 0)
            self.assertIn("permission denied", out.stderr)
            # A wrong password says so.
            wrong = pw + ".wrong"
            with open(wrong, "w") as f:
                f.write("nope\n")
            out = cl.cli("cluster", "status", "--etcd=" + etcd.url, "--prefix=" + cl.prefix, "--etcd-user=drey",
                         "--etcd-password-file=" + wrong)
            self.assertNotEqual(out.returncode, 0)
            self.assertIn("authentication as drey failed", out.stderr)


if __name__ == "__main__":
    main()
