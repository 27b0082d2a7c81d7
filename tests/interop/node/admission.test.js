'use strict';
// Admission refusals as a Node (@grpc/grpc-js) client sees them: every
// RESOURCE_EXHAUSTED carries, in grpc-status-details-bin, a google.rpc.Status
// with ErrorInfo (reason, domain drey.dev, metadata keys that name their
// unit), QuotaFailure (one violation: subject principal:<id> or node:<id>,
// a description) and RetryInfo (retry_delay: the time to the next token for
// rate limits, a backoff hint otherwise), decoded here with protobufjs.

const assert = require('node:assert/strict');
const http = require('node:http');
const { test } = require('node:test');
const {
  startServer, loadApi, unary, rejects, assertStatus, durationMs, pollUntil, uniqueKey, grpc,
} = require('./drey');

const RE = grpc.status.RESOURCE_EXHAUSTED;
const NODE_ID = 'node-js';
const UNIT_KEY = /(Bytes|PerSecond|Calls|Ms)$/;

/** A Cache client on a connection of its own: token-less callers are
 * principals by connection, and grpc-js shares connections between clients
 * of one target unless told not to. */
function ownConnection(server) {
  const { Cache } = loadApi().drey.cache.v1;
  return new Cache(server.address, grpc.credentials.createInsecure(), { 'grpc.use_local_subchannel_pool': 1 });
}

function opsPort(server) {
  const line = server.logLines().find((l) => l.msg === 'listening');
  assert.ok(line && line.ops_port > 0, `no ops_port in ${JSON.stringify(line)}`);
  return line.ops_port;
}

function details(server) {
  return new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port: opsPort(server), path: '/health/ready/details' }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c) => { body += c; });
      res.on('end', () => (res.statusCode === 200 ? resolve(JSON.parse(body)) : reject(new Error(body))));
    }).on('error', reject);
  });
}

/**
 * The three details of a quota refusal: returns { errorInfo, quotaFailure,
 * retryMs } after checking the code, the reason, that nothing else is in
 * the details, and the shape of each.
 */
function assertQuota(err, { reason, metadata, subject }) {
  const st = assertStatus(err, { code: RE, reason, metadata });
  assert.deepEqual(st.details.map((d) => d.type).sort(),
    ['google.rpc.ErrorInfo', 'google.rpc.QuotaFailure', 'google.rpc.RetryInfo']);
  for (const k of Object.keys(st.errorInfo.metadata)) {
    assert.match(k, UNIT_KEY, `ErrorInfo metadata key without a unit: ${k}`);
  }
  const qf = st.details.find((d) => d.type === 'google.rpc.QuotaFailure').value;
  assert.equal(qf.violations.length, 1, JSON.stringify(qf));
  if (subject instanceof RegExp) assert.match(qf.violations[0].subject, subject);
  else assert.equal(qf.violations[0].subject, subject);
  assert.ok(qf.violations[0].description.length > 0, 'QuotaFailure without a description');
  const ri = st.details.find((d) => d.type === 'google.rpc.RetryInfo').value;
  assert.ok(ri.retry_delay, 'RetryInfo without retry_delay');
  return { errorInfo: st.errorInfo, quotaFailure: qf, retryMs: durationMs(ri.retry_delay) };
}

/** Makes calls until one fails (at most 20); returns that error. */
async function untilRefused(call) {
  for (let i = 0; i < 20; i += 1) {
    try {
      await call();
    } catch (e) {
      return e;
    }
  }
  return assert.fail('20 calls and no refusal');
}

test('PRINCIPAL_RATE_LIMIT: the principal, its limit and the time to its next token', async () => {
  const server = await startServer([`--node-id=${NODE_ID}`, '--principal-rate=2', '--principal-burst=2']);
  const a = ownConnection(server);
  const b = ownConnection(server);
  try {
    // the burst of 2, and whatever refilled meanwhile (a token takes 500 ms)
    const err = await untilRefused(() => unary(a, 'Set', { key: uniqueKey('rl'), value: { int64_value: '1' } }));
    assert.equal(err.code, RE, `${err.code} ${err.details}`);
    const q = assertQuota(err, {
      reason: 'PRINCIPAL_RATE_LIMIT',
      metadata: { limitRequestsPerSecond: '2' },
      subject: /^principal:conn:\d+$/,
    });
    assert.ok(q.retryMs > 0 && q.retryMs <= 500, `retry_delay ${q.retryMs} ms is not the time to the next token`);
    // another connection is another principal, with its own bucket
    assert.equal((await unary(b, 'Get', { key: 'x' })).found, false);
    const errB = await untilRefused(() => unary(b, 'Get', { key: 'x' }));
    const qb = assertQuota(errB, { reason: 'PRINCIPAL_RATE_LIMIT', subject: /^principal:conn:\d+$/ });
    assert.notEqual(qb.quotaFailure.violations[0].subject, q.quotaFailure.violations[0].subject);
    // after the advertised delay there is a token again (a token takes
    // 500 ms to come back: a is asked until it is refused once more)
    const again = await untilRefused(() => unary(a, 'Get', { key: 'x' }));
    const wait = assertQuota(again, { reason: 'PRINCIPAL_RATE_LIMIT', subject: q.quotaFailure.violations[0].subject });
    await new Promise((r) => { setTimeout(r, wait.retryMs); });
    assert.equal((await unary(a, 'Get', { key: 'x' })).found, false);
  } finally {
    a.close();
    b.close();
    await server.stop();
  }
});

test('MEMORY_PRESSURE: the node, its figures in bytes and a backoff hint', async () => {
  const limit = 64 * 1024;
  const server = await startServer([`--node-id=${NODE_ID}`, `--memory-limit=${limit}`]);
  const c = ownConnection(server);
  try {
    const value = { bytes_value: Buffer.alloc(8192, 7) };
    const keys = [];
    let err = null;
    while (!err && keys.length < 20) {
      const key = uniqueKey('mem');
      try {
        await unary(c, 'Set', { key, value });
        keys.push(key);
      } catch (e) {
        err = e;
      }
    }
    assert.ok(err, 'no write was refused');
    const d = await details(server);
    const q = assertQuota(err, { reason: 'MEMORY_PRESSURE', subject: `node:${NODE_ID}` });
    assert.deepEqual(Object.keys(q.errorInfo.metadata).sort(),
      ['criticalBytes', 'limitBytes', 'requestBytes', 'usedBytes']);
    assert.equal(q.errorInfo.metadata.limitBytes, String(limit));
    assert.equal(q.errorInfo.metadata.criticalBytes, String(d.memory.criticalBytes));
    assert.equal(q.errorInfo.metadata.usedBytes, String(d.memory.usedBytes));
    const used = Number(q.errorInfo.metadata.usedBytes);
    const request = Number(q.errorInfo.metadata.requestBytes);
    assert.ok(request > 8192, `requestBytes ${request}`);
    assert.ok(used + request > d.memory.criticalBytes && used <= d.memory.criticalBytes);
    assert.ok(q.retryMs > 0, 'RetryInfo without a delay');
    // reads and removes are never refused; after a removal writes fit again
    assert.equal((await unary(c, 'Get', { key: keys[0] })).found, true);
    assert.equal((await unary(c, 'Remove', { key: keys[0] })).removed, true);
    await unary(c, 'Set', { key: keys[0], value });
  } finally {
    c.close();
    await server.stop();
  }
});

test('QUEUE_FULL: the node, its limits and a backoff hint; probes still answer', async () => {
  // One slot and no queue; --slowdown-at=0 holds a call admitted to the slot
  // for 30 s (it keeps the slot) until it is cancelled.
  const server = await startServer([`--node-id=${NODE_ID}`, '--max-inflight=1', '--max-queued=0',
    '--slowdown-at=0', '--slowdown-max-delay=30s']);
  const holderClient = ownConnection(server);
  const c = ownConnection(server);
  try {
    let holderErr = null;
    const holder = holderClient.Get({ key: 'held' }, new grpc.Metadata(), { deadline: Date.now() + 60000 },
      (e) => { holderErr = e; });
    await pollUntil(() => details(server), (d) => d.backpressure.inFlight === 1, { what: 'the held slot' });
    const err = await rejects(unary(c, 'Set', { key: uniqueKey('qf'), value: { bool_value: true } }), RE);
    const q = assertQuota(err, {
      reason: 'QUEUE_FULL',
      metadata: { limitInflightCalls: '1', limitQueuedCalls: '0' },
      subject: `node:${NODE_ID}`,
    });
    assert.equal(q.retryMs, 100);
    const { Health } = loadApi().grpc.health.v1;
    const h = new Health(server.address, grpc.credentials.createInsecure());
    const status = await unary(h, 'Check', { service: '' });
    assert.equal(status.status, 'SERVING');
    h.close();
    holder.cancel();
    await pollUntil(() => details(server), (d) => d.backpressure.inFlight === 0, { what: 'the slot freed' });
    await pollUntil(async () => holderErr, (e) => e !== null, { what: 'the holder cancelled' });
    assert.equal(holderErr.code, grpc.status.CANCELLED);
  } finally {
    holderClient.close();
    c.close();
    await server.stop();
  }
});
