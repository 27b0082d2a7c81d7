"""The clients' gRPC service configs (deploy/client/, docs/clients.md) with
grpcio, the C core's Python binding:

- the files: every unary Cache method is in exactly one group, reads are
  the methods without a request_id and writes those with one, the
  streaming methods have no policy, and the two files differ only in the
  writes' retryable codes; the backoff schedule rides out a failover with
  dreyd's default lease;
- a failover: three nodes with replication factor 2, clients connected to
  one partition's primary through a two-address target, the primary
  SIGKILLed; reads and a write with a request_id made at that moment
  succeed through grpcio's own retries (the test has no retry loop), once
  the partition's backup is promoted; the same read without the config, and
  a write without request_id under the default config, fail;
- grpc-retry-pushback-ms: -1 when a refusal's RetryInfo asks for more time
  than the call has left, on a node's own refusals and on the ones it
  relays from a key's owner; grpcio then gives up at once with the refusal
  instead of waiting out the deadline.
"""
import json
import re
import subprocess
import time
import unittest
import uuid

import grpc

from drey_failover import Failover, service_config
from drey_harness import (CACHE_SERVICE, DreyTestCase, RpcFailure, ServiceClient, find_dreyd, main, make_value,
                          protos, value_of)
from drey_tokens import fresh_channel, poll

DEFAULT = "service-config.json"
REQUEST_ID = "service-config-request-id.json"
CALL_TIMEOUT = 30  # a hang fails; the configs' own timeout (10 s) bounds each call first
PUSHBACK = "grpc-retry-pushback-ms"


def configured(target, config=None):
    """A Cache client on its own connection, with the service config file
    named (None: none), as docs/clients.md says to load it."""
    opts = [("grpc.service_config", service_config(config)), ("grpc.enable_retries", 1)] if config else []
    return ServiceClient(fresh_channel(target, options=opts), protos().cache, CACHE_SERVICE)


def seconds(duration):
    assert duration.endswith("s"), duration
    return float(duration[:-1])


def refused_gets(srv):
    status, text = srv.ops_get("/metrics")
    assert status == 200, status
    m = re.search(r'^drey_requests_total\{method="/drey.cache.v1.Cache/Get",code="RESOURCE_EXHAUSTED"\} (\d+)$',
                  text, re.M)
    return int(m.group(1)) if m else 0


def trailer(failure, key):
    return [v for k, v in failure.trailers if k == key]


class ConfigFiles(unittest.TestCase):
    def setUp(self):
        self.configs = {name: json.loads(service_config(name)) for name in (DEFAULT, REQUEST_ID)}

    def split(self, name):
        """(reads, writes): the config's two groups, told apart by whether
        their methods' requests have a request_id; each (methods, config)."""
        with_id = {m.name for m in protos().cache.DESCRIPTOR.services_by_name["Cache"].methods
                   if "request_id" in m.input_type.fields_by_name}
        groups = []
        for mc in self.configs[name]["methodConfig"]:
            self.assertEqual({n["service"] for n in mc["name"]}, {CACHE_SERVICE}, name)
            groups.append(([n["method"] for n in mc["name"]], mc))
        self.assertEqual(len(groups), 2, name)
        reads = [g for g in groups if not set(g[0]) & with_id]
        writes = [g for g in groups if set(g[0]) <= with_id]
        self.assertEqual((len(reads), len(writes)), (1, 1), "a group mixes reads and writes in " + name)
        return reads[0], writes[0]

    def test_every_method_is_classified_by_its_request_id(self):
        service = protos().cache.DESCRIPTOR.services_by_name["Cache"]
        unary = {m.name for m in service.methods if not m.client_streaming and not m.server_streaming}
        self.assertEqual({m.name for m in service.methods} - unary, {"Pipeline", "Watch"})
        with_id = {m.name for m in service.methods if "request_id" in m.input_type.fields_by_name}
        codes = {}
        for name in (DEFAULT, REQUEST_ID):
            (reads, rc), (writes, wc) = self.split(name)
            self.assertEqual(len(reads) + len(writes), len(set(reads) | set(writes)), "a method twice in " + name)
            self.assertEqual(set(reads) | set(writes), unary, name)
            self.assertEqual(set(writes), with_id & unary, name)
            codes[name] = (rc["retryPolicy"]["retryableStatusCodes"], wc["retryPolicy"]["retryableStatusCodes"])
        # Writes retry UNAVAILABLE (commit unknown) only where every write
        # carries a request_id; a RESOURCE_EXHAUSTED refusal left no trace.
        both = ["UNAVAILABLE", "RESOURCE_EXHAUSTED"]
        self.assertEqual(codes[DEFAULT], (both, ["RESOURCE_EXHAUSTED"]))
        self.assertEqual(codes[REQUEST_ID], (both, both))
        _, (_, wc) = self.split(REQUEST_ID)
        wc["retryPolicy"]["retryableStatusCodes"] = ["RESOURCE_EXHAUSTED"]
        self.assertEqual(self.configs[DEFAULT], self.configs[REQUEST_ID],
                         "the files differ in more than the writes' retryable codes")

    def test_the_schedule_rides_out_a_failover_with_the_default_lease(self):
        """gRPC allows at most 5 attempts and jitters each backoff by ±20%
        (the C core, grpc-js): the four retries must span a failover,
        which takes the lease TTL plus up to half a second (etcd checks
        expiries every 500 ms) plus the controller's reaction, and the
        config's timeout must leave room for the last attempt."""
        out = subprocess.run([find_dreyd(), "--help"], capture_output=True, text=True).stdout
        lease = float(re.search(r"--cluster-lease-ttl=\S+\s+\(\S+, default (\d+)s\)", out).group(1))
        for mc in self.configs[DEFAULT]["methodConfig"]:
            rp = mc["retryPolicy"]
            self.assertLessEqual(rp["maxAttempts"], 5)
            self.assertTrue(mc["waitForReady"])
            b, total = seconds(rp["initialBackoff"]), 0.0
            for _ in range(rp["maxAttempts"] - 1):
                total += min(b, seconds(rp["maxBackoff"]))
                b *= rp["backoffMultiplier"]
            self.assertGreaterEqual(0.8 * total, lease + 0.6, "retries end before a %gs-lease failover" % lease)
            self.assertLess(1.2 * total, seconds(mc["timeout"]), "the timeout cuts off the last retry")


class ClusterClients(unittest.TestCase):
    """One cluster for the class: the failover, and a refusal relayed by
    a node that forwards."""

    @classmethod
    def setUpClass(cls):
        # A small memory limit, for a refusal with RetryInfo at a key's owner.
        cls.sc = Failover(extra_flags=("--memory-limit=256KiB",)).__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.sc.__exit__(None, None, None)

    def test_reads_and_request_id_writes_ride_out_a_failover(self):
        sc, pb = self.sc, protos().cache
        k = sc.keys
        seed = configured(sc.other.server.address)
        for key in k[:2]:
            seed.Set(pb.SetRequest(key=key, value=make_value("before " + key)), timeout=CALL_TIMEOUT)
        seed.Set(pb.SetRequest(key=k[2], value=make_value(10)), timeout=CALL_TIMEOUT)
        # Connected to the partition's primary: pick_first takes the first
        # address that answers. The second is where the library goes next.
        target = "ipv4:%s,%s" % (sc.victim.server.address, sc.other.server.address)
        reads, writes, plain = configured(target, DEFAULT), configured(target, REQUEST_ID), configured(target)
        for c in (reads, writes, plain):
            c.Get(pb.GetRequest(key=k[0]), timeout=CALL_TIMEOUT)
        methods = ("GetExpiration", "GetMany", "Increment")
        refused = {m: sc.requests(m, "UNAVAILABLE") for m in methods}

        sc.kill()
        killed = time.monotonic()
        # Made during the failover; nothing here retries them.
        expiration = reads.GetExpiration.future(pb.GetExpirationRequest(key=k[0]), timeout=CALL_TIMEOUT)
        many = reads.GetMany.future(pb.GetManyRequest(keys=k[:2]), timeout=CALL_TIMEOUT)
        rid = uuid.uuid4().hex
        increment = writes.Increment.future(pb.IncrementRequest(key=k[2], delta=1, request_id=rid),
                                            timeout=CALL_TIMEOUT)
        # At the same moment, without the config, and a write without a
        # request_id under the default config: refused, not retried.
        with self.assertRaises(grpc.RpcError) as e:
            plain.Get(pb.GetRequest(key=k[0]), timeout=CALL_TIMEOUT)
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE, RpcFailure(e.exception))
        with self.assertRaises(grpc.RpcError) as e:
            reads.Set(pb.SetRequest(key=k[3], value=make_value("lost")), timeout=CALL_TIMEOUT)
        self.assertEqual(e.exception.code(), grpc.StatusCode.UNAVAILABLE, RpcFailure(e.exception))

        self.assertTrue(expiration.result().found)
        got = many.result().results
        self.assertEqual([r.found for r in got], [True, True])
        self.assertEqual([value_of(r.value) for r in got], ["before " + k[0], "before " + k[1]])
        self.assertEqual(increment.result().value, 11)
        print("the calls made at the SIGKILL succeeded %.2fs after it" % (time.monotonic() - killed))
        # Each was refused at the node the client fell back to, then retried.
        for m in methods:
            self.assertGreater(sc.requests(m, "UNAVAILABLE"), refused[m], m)
        # Once: the counter moved by one, and the request_id answers as it did.
        self.assertEqual(value_of(plain.Get(pb.GetRequest(key=k[2]), timeout=CALL_TIMEOUT).value), 11)
        again = writes.Increment(pb.IncrementRequest(key=k[2], delta=1, request_id=rid), timeout=CALL_TIMEOUT)
        self.assertEqual(again.value, 11)

    def test_a_relayed_refusal_gets_the_pushback_of_the_forwarding_call(self):
        sc, pb = self.sc, protos().cache
        live = sc.cl.live()
        owners = sc.cl.agreed_owners(live)
        via = live[0]
        owner = next(o for o in owners.values() if o != via.id and o in {n.id for n in live})
        key = next(x for x in ("relayed-%d" % i for i in range(100000)) if sc.cl.owner_of(owners, x) == owner)
        big = pb.SetRequest(key=key, value=make_value(b"x" * (3 << 17)))
        plain, reads = configured(via.server.address), configured(via.server.address, DEFAULT)

        def refused(client, timeout):
            """The owner's refusal through via. With a deadline under its 1 s
            RetryInfo, a call may also run out of time before any answer on a
            loaded machine (two hops, ASan): up to ten are made for one answer."""
            for _ in range(10 if timeout < 1 else 1):
                with self.assertRaises(grpc.RpcError) as e:
                    client.Set(big, timeout=timeout)
                f = RpcFailure(e.exception)
                if f.code != grpc.StatusCode.DEADLINE_EXCEEDED:
                    break
            self.assertEqual((f.code, f.reason), (grpc.StatusCode.RESOURCE_EXHAUSTED, "MEMORY_PRESSURE"), f)
            self.assertEqual(f.quota_failure.violations[0].subject, "node:" + owner, "not the owner's refusal")
            self.assertEqual(f.retry_info.retry_delay.ToMilliseconds(), 1000)
            return f
        self.assertEqual(trailer(refused(plain, 0.9), PUSHBACK), ["-1"])
        self.assertEqual(trailer(refused(plain, CALL_TIMEOUT), PUSHBACK), [])
        # The default config retries RESOURCE_EXHAUSTED; the pushback stops it
        # (else its backoff would wait out the deadline every time).
        refused(reads, 0.9)


class Pushback(DreyTestCase):
    SERVER_FLAGS = None  # each test has its own node: they spend its rate limit

    def test_a_retry_that_would_outlive_the_deadline_is_stopped(self):
        pb = protos().cache
        srv = self.start_server("--ephemeral", "--node-rate=1", "--node-burst=1", "--ops-listen=127.0.0.1:0")
        plain, retrying = configured(srv.address), configured(srv.address, DEFAULT)
        get = pb.GetRequest(key="k")

        def admitted():
            try:
                plain.Get(get, timeout=CALL_TIMEOUT)
                return True
            except grpc.RpcError as e:
                self.assertEqual(RpcFailure(e).reason, "NODE_RATE_LIMIT", RpcFailure(e))
                return False

        def spend_the_token():
            """Until a call is admitted: the next token comes a second later,
            so a call made now is refused with a RetryInfo of nearly 1 s."""
            poll(admitted, lambda ok: ok, timeout=CALL_TIMEOUT, what="a call admitted", interval=0.02)

        for timeout, pushback in ((0.7, ["-1"]), (CALL_TIMEOUT, []), (None, [])):
            spend_the_token()
            with self.assertRaises(grpc.RpcError) as e:
                plain.Get(get, timeout=timeout)
            f = RpcFailure(e.exception)
            self.assertEqual(f.reason, "NODE_RATE_LIMIT", f)
            self.assertGreater(f.retry_info.retry_delay.ToMilliseconds(), 700)
            self.assertEqual(trailer(f, PUSHBACK), pushback, timeout)
        # No RetryInfo, no pushback, however short the deadline.
        with self.assertRaises(grpc.RpcError) as e:
            plain.Get(pb.GetRequest(key=""), timeout=0.7)
        f = RpcFailure(e.exception)
        self.assertEqual((f.reason, f.retry_info, trailer(f, PUSHBACK)), ("INVALID_KEY", None, []), f)
        # grpcio with the config: gives up at once with the refusal (its
        # backoff would have waited out the deadline) ...
        spend_the_token()
        with self.assertRaises(grpc.RpcError) as e:
            retrying.Get(get, timeout=0.7)
        self.assertEqual(RpcFailure(e.exception).reason, "NODE_RATE_LIMIT", RpcFailure(e.exception))
        # ... and with time left, retries until the bucket has a token again.
        before = refused_gets(srv)
        self.assertEqual(retrying.Get(get, timeout=CALL_TIMEOUT).found, False)
        self.assertGreater(refused_gets(srv), before, "the call was not refused first: nothing was retried")

if __name__ == "__main__":
    main()
