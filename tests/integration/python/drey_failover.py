"""A primary to kill: three nodes with replication factor 2, for the tests of
the clients' service config (deploy/client/) in Python, Go and Node.

Failover sets up the scenario every language's test shares:
- etcd, `drey cluster init --replication-factor=2`, three nodes, until every
  node routes with the same table and every partition has its in-sync
  backup (a kill then fails it over instead of leaving it unavailable);
- the victim: a node that leads a partition and is not the controller (a
  dead controller would add its own election to the failover); the other:
  the node that neither leads nor backs that partition, so that a client
  that loses the victim lands on a node that forwards;
- keys in the victim's partition.
kill() is SIGKILL, waited for. revoke() deletes the dead node's etcd lease at
once, as a failure detector faster than the lease would: the partition then
fails over as soon as the controller hears of it, not a lease TTL later.

Run as a program, it is the Go and Node tests' cluster (their languages
have no etcd or certificate helpers, and the cluster is the same real
thing): it prints one JSON line describing the scenario, then answers one
JSON command per line of standard input with one JSON line:
  {"cmd": "kill"}      SIGKILL the victim and wait for it to exit
  {"cmd": "revoke"}    revoke the victim's lease in etcd
  {"cmd": "requests", "method": "Get", "code": "UNAVAILABLE"}
                       the other node's drey_requests_total for that method
                       and code: the attempts it refused
  {"cmd": "quit"}      stop everything (so does the end of standard input)
Every answer has "ok"; a failure has "error". Logs go to standard error.
  drey_failover.py [--lease-ttl=2s] [--keys=N]
"""
import argparse
import base64
import http.client
import json
import os
import signal
import sys

from drey_cluster import Cluster, metric, partition, wait_until

PARTITIONS = 8
HERE = os.path.dirname(os.path.abspath(__file__))


def service_config(name):
    """The text of deploy/client/<name>: from the runfiles under `bazel
    test` (the working directory), else from this checkout."""
    for base in (os.getcwd(), os.path.join(HERE, "..", "..", "..")):
        path = os.path.join(base, "deploy", "client", name)
        if os.path.isfile(path):
            with open(path) as f:
                return f.read()
    raise RuntimeError("deploy/client/%s not found (add //deploy:client_configs to the test's data)" % name)


class Failover:
    def __init__(self, lease_ttl="2s", keys=4, extra_flags=()):
        self.cl = Cluster(partitions=PARTITIONS, initial_nodes=3, lease_ttl=lease_ttl, replication_factor=2,
                          extra_flags=extra_flags)
        self.n_keys = keys

    def __enter__(self):
        self.cl.__enter__()
        try:
            self._prepare()
        except BaseException:
            self.cl.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc):
        self.cl.__exit__(*exc)

    def _prepare(self):
        nodes = self.cl.start(3)
        table = self.settled(nodes)
        controller = self.cl.status()["controller"]
        led = {}
        for p, (primary, _) in sorted(table.items()):
            led.setdefault(primary, p)
        victim_id = next(i for i in sorted(led) if i != controller)
        self.partition = led[victim_id]
        self.backup_id = table[self.partition][1][0]
        self.victim = self.cl.nodes[victim_id]
        self.other = next(n for n in nodes if n.id not in (victim_id, self.backup_id))
        self.keys = [k for k in ("failover-%d" % i for i in range(100000))
                     if partition("", k, PARTITIONS) == self.partition][:self.n_keys]

    def table(self, node):
        """partition -> (primary, in-sync backups), as node routes."""
        t = self.cl.topology(node)
        return {p.id: (p.primary, tuple(sorted(p.replicas)), tuple(p.joining)) for p in t.partitions}

    def settled(self, nodes, timeout=60):
        """Until every node routes with the same table, every partition with
        a primary, one in-sync backup and no copy under way."""
        def tables():
            return [self.table(n) for n in nodes]

        def ok(ts):
            return all(t == ts[0] for t in ts) and all(
                primary and len(backups) == 1 and not joining for primary, backups, joining in ts[0].values())
        wait_until(lambda: ok(tables()), timeout=timeout, what="a settled table with a backup for every partition")
        return {p: (primary, backups) for p, (primary, backups, _) in tables()[0].items()}

    def kill(self):
        self.victim.server.proc.send_signal(signal.SIGKILL)
        self.victim.server.wait()

    def revoke(self):
        """Deletes the victim's member key with its lease, through etcd's
        JSON gateway, as the lease's expiry would."""
        key = self.cl.prefix + "nodes/" + self.victim.id
        got = self._etcd("/v3/kv/range", {"key": base64.b64encode(key.encode()).decode()})
        kvs = got.get("kvs") or []
        if not kvs or not kvs[0].get("lease"):
            raise AssertionError("no leased member key %s in etcd: %r" % (key, got))
        self._etcd("/v3/lease/revoke", {"ID": kvs[0]["lease"]})

    def _etcd(self, path, body):
        c = http.client.HTTPConnection("127.0.0.1", self.cl.etcd.client_port, timeout=10)
        try:
            c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read()
        finally:
            c.close()
        if r.status != 200:
            raise AssertionError("etcd %s: HTTP %d %s" % (path, r.status, data[:200]))
        return json.loads(data)

    def requests(self, method, code, node=None):
        """How many calls of method node (the other node) answered with code."""
        labels = 'method="/drey.cache.v1.Cache/%s",code="%s"' % (method, code)
        return int(metric(node or self.other, "drey_requests_total", labels))

    def describe(self):
        return {"ok": True, "partition": self.partition, "keys": self.keys, "backup": self.backup_id,
                "victim": {"id": self.victim.id, "address": self.victim.server.address},
                "other": {"id": self.other.id, "address": self.other.server.address}}


def serve(sc, lines, out):
    out.write(json.dumps(sc.describe()) + "\n")
    out.flush()
    for line in lines:
        if not line.strip():
            continue
        try:
            cmd = json.loads(line)
            name = cmd.get("cmd")
            if name == "quit":
                return
            if name == "kill":
                sc.kill()
                answer = {"ok": True}
            elif name == "revoke":
                sc.revoke()
                answer = {"ok": True}
            elif name == "requests":
                answer = {"ok": True, "value": sc.requests(cmd["method"], cmd["code"])}
            else:
                answer = {"ok": False, "error": "unknown command %r" % (name,)}
        except Exception as e:  # the client's test reports it
            answer = {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}
        out.write(json.dumps(answer) + "\n")
        out.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lease-ttl", default="2s")
    ap.add_argument("--keys", type=int, default=4)
    args = ap.parse_args()
    out = sys.stdout
    sys.stdout = sys.stderr  # the harness's prints must not mix with the protocol
    with Failover(lease_ttl=args.lease_ttl, keys=args.keys) as sc:
        serve(sc, sys.stdin, out)


if __name__ == "__main__":
    main()
