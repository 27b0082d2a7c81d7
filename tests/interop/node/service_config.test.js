'use strict';
// The clients' gRPC service configs (deploy/client/, docs/clients.md) with
// @grpc/grpc-js (1.14: retries since 1.8, on by default): a partition's
// primary SIGKILLed under a client connected to it, and the retry pushback.
//
// The cluster is tests/integration/python/drey_failover.py run as a program
// (etcd, three dreyd with replication factor 2, a 2 s lease), driven over
// its standard input. The failover is the real one: the dead node's lease
// expires in etcd and the controller promotes the backup, about two seconds
// in which grpc-js's own retries (b ± 20%: 0.5, 1, 2, 4 s) carry the calls.

const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const http = require('node:http');
const path = require('node:path');
const readline = require('node:readline');
const { test } = require('node:test');
const {
  loadApi, startServer, unary, rejects, statusDetails, pollUntil, uniqueKey, grpc,
} = require('./drey');

const ROOT = path.resolve(__dirname, '..', '..', '..');
const DEFAULT = 'service-config.json';
const REQUEST_ID = 'service-config-request-id.json';
const CALL_MS = 30000; // a hang fails; the configs' own timeout (10 s) bounds each call first

function serviceConfig(name) {
  return fs.readFileSync(path.join(ROOT, 'deploy', 'client', name), 'utf8');
}

/** A Cache client on its own connection to target, with the service config
 * file named (null: none), as docs/clients.md says to load it. */
function client(target, config) {
  const { Cache } = loadApi().drey.cache.v1;
  const options = { 'grpc.use_local_subchannel_pool': 1 };
  if (config) Object.assign(options, { 'grpc.service_config': serviceConfig(config), 'grpc.enable_retries': 1 });
  return new Cache(target, grpc.credentials.createInsecure(), options);
}

/** The fixture: its scenario (the first line) and do(cmd), one JSON line each way. */
async function startFailover(leaseTtl) {
  const script = path.join(ROOT, 'tests', 'integration', 'python', 'drey_failover.py');
  const child = spawn('/usr/bin/python3', ['-u', script, `--lease-ttl=${leaseTtl}`],
    { stdio: ['pipe', 'pipe', 'inherit'] });
  const ended = new Promise((resolve) => child.once('exit', (code, signal) => resolve({ code, signal })));
  const lines = readline.createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  const next = async (what) => {
    const r = await Promise.race([lines.next(), ended.then((e) => ({ done: true, e }))]);
    assert.ok(!r.done, `the failover fixture ended before ${what}: ${JSON.stringify(r.e)}`);
    const a = JSON.parse(r.value);
    assert.ok(a.ok, `${what}: the fixture answered ${r.value}`);
    return a;
  };
  const scenario = await next('describing its cluster');
  return {
    ...scenario,
    async do(cmd) {
      child.stdin.write(`${JSON.stringify(cmd)}\n`);
      return next(JSON.stringify(cmd));
    },
    async refusals(method) {
      return (await this.do({ cmd: 'requests', method, code: 'UNAVAILABLE' })).value;
    },
    async stop() {
      child.stdin.end(); // the end of its input stops everything
      const r = await ended;
      assert.deepEqual(r, { code: 0, signal: null }, 'the failover fixture did not exit 0');
    },
  };
}

test('reads and request_id writes ride out a failover through grpc-js retries', async () => {
  const f = await startFailover('2s');
  try {
    const k = f.keys;
    const seed = client(f.other.address, null);
    for (const key of k.slice(0, 2)) await unary(seed, 'Set', { key, value: { string_value: `before ${key}` } });
    await unary(seed, 'Set', { key: k[2], value: { int64_value: '10' } });
    // Connected to the partition's primary: pick_first takes the first
    // address that answers. The second is where the library goes next.
    const target = `ipv4:${f.victim.address},${f.other.address}`;
    const reads = client(target, DEFAULT);
    const writes = client(target, REQUEST_ID);
    const plain = client(target, null);
    for (const c of [reads, writes, plain]) await unary(c, 'Get', { key: k[0] });
    const methods = ['GetExpiration', 'GetMany', 'Increment'];
    const before = {};
    for (const m of methods) before[m] = await f.refusals(m);

    await f.do({ cmd: 'kill' });
    const killed = Date.now();
    // Made during the failover; nothing here retries them.
    const rid = uniqueKey('rid');
    const calls = [
      unary(reads, 'GetExpiration', { key: k[0] }, CALL_MS),
      unary(reads, 'GetMany', { keys: k.slice(0, 2) }, CALL_MS),
      unary(writes, 'Increment', { key: k[2], delta: '1', request_id: rid }, CALL_MS),
    ];
    // At the same moment, without the config, and a write without a
    // request_id under the default config: refused, not retried.
    await rejects(unary(plain, 'Get', { key: k[0] }, CALL_MS), grpc.status.UNAVAILABLE);
    await rejects(unary(reads, 'Set', { key: k[3], value: { string_value: 'lost' } }, CALL_MS),
      grpc.status.UNAVAILABLE);

    const [expiration, many, increment] = await Promise.all(calls);
    assert.equal(expiration.found, true);
    assert.deepEqual(many.results.map((r) => [r.found, r.value.string_value]),
      [[true, `before ${k[0]}`], [true, `before ${k[1]}`]]);
    assert.equal(increment.value, '11');
    console.log(`the calls made at the SIGKILL succeeded ${((Date.now() - killed) / 1000).toFixed(2)}s after it`);
    // Each was refused at the node the client fell back to, then retried.
    for (const m of methods) assert.ok(await f.refusals(m) > before[m], `${m} was never refused: not retried`);
    // Once: the counter moved by one, and the request_id answers as it did.
    assert.equal((await unary(plain, 'Get', { key: k[2] })).value.int64_value, '11');
    assert.equal((await unary(writes, 'Increment', { key: k[2], delta: '1', request_id: rid })).value, '11');
    for (const c of [seed, reads, writes, plain]) c.close();
  } finally {
    await f.stop();
  }
});

function refusedGets(server) {
  const line = server.logLines().find((l) => l.msg === 'listening');
  return new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port: line.ops_port, path: '/metrics' }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c) => { body += c; });
      res.on('end', () => {
        const m = body.match(/^drey_requests_total\{method="\/drey\.cache\.v1\.Cache\/Get",code="RESOURCE_EXHAUSTED"\} (\d+)$/m);
        resolve(m ? Number(m[1]) : 0);
      });
    }).on('error', reject);
  });
}

test('a retry that would outlive the deadline is stopped by the pushback', async () => {
  const server = await startServer(['--ephemeral', '--node-rate=1', '--node-burst=1']);
  try {
    const plain = client(server.address, null);
    const retrying = client(server.address, DEFAULT);
    const key = uniqueKey('k');
    // Until a call is admitted: the next token comes a second later, so a
    // call made now is refused with a RetryInfo of nearly 1 s.
    const spendTheToken = () => pollUntil(
      () => unary(plain, 'Get', { key }).then(() => true, (err) => {
        assert.equal(statusDetails(err).errorInfo.reason, 'NODE_RATE_LIMIT');
        return false;
      }),
      (ok) => ok, { what: 'a call admitted' });
    // The call has 700 ms: drey says grpc-retry-pushback-ms: -1 ...
    await spendTheToken();
    let err = await rejects(unary(plain, 'Get', { key }, 700), grpc.status.RESOURCE_EXHAUSTED);
    assert.deepEqual(err.metadata.get('grpc-retry-pushback-ms'), ['-1']);
    await spendTheToken();
    err = await rejects(unary(plain, 'Get', { key }), grpc.status.RESOURCE_EXHAUSTED);
    assert.deepEqual(err.metadata.get('grpc-retry-pushback-ms'), []);
    // ... and grpc-js gives up at once with the refusal (its backoff would
    // have waited out the deadline) ...
    await spendTheToken();
    err = await rejects(unary(retrying, 'Get', { key }, 700), grpc.status.RESOURCE_EXHAUSTED);
    assert.equal(statusDetails(err).errorInfo.reason, 'NODE_RATE_LIMIT');
    // ... and with time left retries until the bucket has a token again.
    const refused = await refusedGets(server);
    assert.equal((await unary(retrying, 'Get', { key })).found, false);
    assert.ok(await refusedGets(server) > refused, 'the call was not refused first: nothing was retried');
    plain.close();
    retrying.close();
  } finally {
    await server.stop();
  }
});
