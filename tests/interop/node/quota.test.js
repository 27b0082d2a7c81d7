'use strict';
// The journal disk quota (--journal-max-bytes) as a Node (@grpc/grpc-js)
// client sees it: a durable write that would grow the journal's segments past
// the cap is RESOURCE_EXHAUSTED with, in grpc-status-details-bin, a
// google.rpc.Status holding ErrorInfo (reason JOURNAL_DISK_QUOTA, domain
// drey.dev, metadata usedBytes, maxBytes, highWaterBytes, requestBytes),
// QuotaFailure (subject node:<node id>) and RetryInfo, decoded here with
// protobufjs. The figures agree with /health/ready/details; health stays
// SERVING; the refused write leaves no trace; a snapshot (Admin/Snapshot)
// brings writes back without a restart. Remove, Touch and Persist are
// refused like any other durable append when they do not fit.

const assert = require('node:assert/strict');
const http = require('node:http');
const { test } = require('node:test');
const protoLoader = require('@grpc/proto-loader');
const {
  startServer, cacheClient, healthClient, unary, assertStatus, durationMs, grpc, LOADER_OPTIONS,
} = require('./drey');

const RE = grpc.status.RESOURCE_EXHAUSTED;
const NODE_ID = 'node-js-quota';
const SEGMENT = 1 << 20;
const CAP = 4 << 20;
const VALUE = 200 * 1024;
const QUOTA_KEYS = ['highWaterBytes', 'maxBytes', 'requestBytes', 'usedBytes'];
const FLAGS = [
  `--segment-bytes=${SEGMENT}`, `--journal-max-bytes=${CAP}`, '--snapshot-every-bytes=0', '--snapshot-every=0',
  `--node-id=${NODE_ID}`,
];

let adminApi;
function adminClient(server) {
  if (!adminApi) {
    adminApi = grpc.loadPackageDefinition(protoLoader.loadSync(['drey/admin/v1/admin.proto'], LOADER_OPTIONS));
  }
  return new adminApi.drey.admin.v1.Admin(server.address, grpc.credentials.createInsecure());
}

function details(server) {
  const line = server.logLines().find((l) => l.msg === 'listening');
  assert.ok(line && line.ops_port > 0, `no ops_port in ${JSON.stringify(line)}`);
  return new Promise((resolve, reject) => {
    http.get({ host: '127.0.0.1', port: line.ops_port, path: '/health/ready/details' }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c) => { body += c; });
      res.on('end', () => (res.statusCode === 200 ? resolve(JSON.parse(body)) : reject(new Error(body))));
    }).on('error', reject);
  });
}

/**
 * The full contract of a JOURNAL_DISK_QUOTA refusal; returns the ErrorInfo
 * figures as numbers, the QuotaFailure and the RetryInfo delay in ms.
 */
function assertQuota(err) {
  const st = assertStatus(err, { code: RE, reason: 'JOURNAL_DISK_QUOTA' });
  assert.deepEqual(st.details.map((d) => d.type).sort(),
    ['google.rpc.ErrorInfo', 'google.rpc.QuotaFailure', 'google.rpc.RetryInfo']);
  assert.deepEqual(Object.keys(st.errorInfo.metadata).sort(), QUOTA_KEYS);
  const md = {};
  for (const [k, v] of Object.entries(st.errorInfo.metadata)) {
    assert.match(v, /^\d+$/, `ErrorInfo metadata ${k}=${v} is not a byte count`);
    md[k] = Number(v);
  }
  const qf = st.details.find((d) => d.type === 'google.rpc.QuotaFailure').value;
  assert.equal(qf.violations.length, 1, JSON.stringify(qf));
  assert.equal(qf.violations[0].subject, `node:${NODE_ID}`);
  assert.ok(qf.violations[0].description.length > 0, 'QuotaFailure without a description');
  const ri = st.details.find((d) => d.type === 'google.rpc.RetryInfo').value;
  assert.ok(ri.retry_delay, 'RetryInfo without retry_delay');
  const retryMs = durationMs(ri.retry_delay);
  assert.ok(retryMs > 0, `retry_delay ${retryMs} ms`);
  return { md, quotaFailure: qf, retryMs, message: st.message };
}

/** Calls call(i) until one fails; returns [results, error]. */
async function untilRefused(call, limit) {
  const ok = [];
  for (let i = 0; i < limit; i += 1) {
    try {
      ok.push(await call(i));
    } catch (err) {
      return [ok, err];
    }
  }
  return assert.fail(`${limit} calls and none was refused`);
}

test('JOURNAL_DISK_QUOTA: the figures, the node, a retry hint; no trace; writes resume after a snapshot', async () => {
  const server = await startServer(FLAGS);
  const c = cacheClient(server);
  const admin = adminClient(server);
  const health = healthClient(server);
  try {
    const d0 = await details(server);
    assert.deepEqual(d0.journalDisk, {
      state: 'normal', maxBytes: CAP, usedBytes: SEGMENT, highWaterBytes: d0.journalDisk.highWaterBytes,
      writeRejectionActive: false,
    });
    const request = (i) => ({
      key: `fill-${i}`, value: { bytes_value: Buffer.alloc(VALUE, i) }, request_id: `rid-fill-${i}`,
    });
    let before = d0;
    const [acked, err] = await untilRefused(async (i) => {
      before = await details(server);
      return unary(c, 'Set', request(i));
    }, 2 * (CAP / VALUE));
    assert.ok(acked.length >= (3 * SEGMENT) / VALUE, `only ${acked.length} writes fitted`);
    const refusedAt = acked.length;

    const q = assertQuota(err);
    assert.ok(!q.message.includes(`fill-${refusedAt}`), 'the message echoes the key');
    const d = await details(server);
    assert.equal(q.md.maxBytes, CAP);
    assert.equal(q.md.usedBytes, d.journalDisk.usedBytes);
    assert.equal(q.md.usedBytes, before.journalDisk.usedBytes);
    assert.equal(q.md.highWaterBytes, d.journalDisk.highWaterBytes);
    assert.ok(q.md.highWaterBytes <= 0.8 * CAP && q.md.highWaterBytes > 0.8 * CAP - 16, `${q.md.highWaterBytes}`);
    assert.ok(q.md.requestBytes > VALUE && q.md.requestBytes < VALUE + 1024, `requestBytes ${q.md.requestBytes}`);
    assert.ok(q.md.usedBytes + SEGMENT > CAP, 'refused although another segment fitted under the cap');
    assert.ok(q.md.usedBytes <= CAP);
    assert.equal(d.journalDisk.state, 'critical');
    assert.equal(d.journalDisk.writeRejectionActive, true);
    assert.equal(d.ready, true);
    // no trace of the refused write
    assert.equal(d.journal.lastLsn, before.journal.lastLsn);
    assert.equal(d.memory.usedBytes, before.memory.usedBytes);
    assert.equal((await unary(c, 'Get', { key: `fill-${refusedAt}` })).found, false);
    // the node stays up and SERVING
    for (const service of ['', 'drey.cache.v1.Cache']) {
      assert.equal((await unary(health, 'Check', { service })).status, 'SERVING', service);
    }
    // a write that fits still goes through, one version after the last acknowledged one
    const small = await unary(c, 'Set', { key: 'small', value: { int64_value: '1' } });
    assert.equal(BigInt(small.version), BigInt(acked[acked.length - 1].version) + 1n);
    // the retry is refused the same way while it does not fit
    const again = await unary(c, 'Set', request(refusedAt)).then(() => null, (e) => e);
    assert.ok(again, 'the refused write went through without any space freed');
    assertQuota(again);

    const snap = await unary(admin, 'Snapshot', {});
    assert.equal(snap.segments_removed, d.journal.segments - 1);
    const d2 = await details(server);
    assert.equal(d2.journalDisk.state, 'normal');
    assert.equal(d2.journalDisk.writeRejectionActive, false);
    assert.equal(d2.journalDisk.usedBytes, SEGMENT);
    // writes resume: the refused request is a first attempt, applied once
    const r = await unary(c, 'Set', request(refusedAt));
    assert.equal(BigInt(r.version), BigInt(small.version) + 1n);
    assert.equal((await unary(c, 'Set', request(refusedAt))).version, r.version);
    const g = await unary(c, 'Get', { key: `fill-${refusedAt}` });
    assert.equal(g.found, true);
    assert.equal(g.version, r.version);
    assert.deepEqual(g.value.bytes_value, Buffer.alloc(VALUE, refusedAt));
    assert.equal(server.exit, null, 'dreyd exited');
  } finally {
    c.close();
    admin.close();
    health.close();
    await server.stop();
  }
});

test('Remove, Touch and Persist are refused like any durable append once nothing fits; reads are not', async () => {
  const server = await startServer(FLAGS);
  const c = cacheClient(server);
  const admin = adminClient(server);
  try {
    const key = `long-${'x'.repeat(300)}`;
    const set = await unary(c, 'Set', { key, value: { string_value: 'kept' }, ttl: { seconds: '3600' } });
    // large records, then smaller ones, then one-letter increments, until nothing fits
    await untilRefused((i) => unary(c, 'Set', { key: `big-${i}`, value: { bytes_value: Buffer.alloc(VALUE, 1) } }),
      64);
    await untilRefused((i) => unary(c, 'Set', { key: `mid-${i}`, value: { bytes_value: Buffer.alloc(4096, 2) } }),
      1000);
    const [, incErr] = await untilRefused(() => unary(c, 'Increment', { key: 'p', delta: '1' }), 1000);
    const inc = assertQuota(incErr);
    const d = await details(server);
    assert.equal(d.journalDisk.state, 'critical');

    for (const [method, req] of [
      ['Remove', { key }],
      ['Touch', { key, ttl: { seconds: '7200' } }],
      ['Persist', { key }],
    ]) {
      const err = await unary(c, method, req).then(() => null, (e) => e);
      assert.ok(err, `${method} went through with no room left`);
      const q = assertQuota(err);
      assert.ok(q.md.requestBytes >= inc.md.requestBytes, `${method}: requestBytes ${q.md.requestBytes}`);
      assert.equal(q.md.usedBytes, inc.md.usedBytes);
    }
    assert.equal((await details(server)).journal.lastLsn, d.journal.lastLsn, 'a refused call was journaled');
    // reads are never refused, and nothing refused was applied
    const g = await unary(c, 'Get', { key });
    assert.deepEqual([g.found, g.value.string_value, g.version], [true, 'kept', set.version]);
    const e = await unary(c, 'GetExpiration', { key });
    assert.equal(e.has_expiration, true, 'the refused Persist was applied');
    assert.ok(Number(e.remaining.seconds) <= 3600, 'the refused Touch was applied');

    await unary(admin, 'Snapshot', {});
    assert.equal((await unary(c, 'Touch', { key, ttl: { seconds: '7200' } })).found, true);
    assert.equal((await unary(c, 'Persist', { key })).found, true);
    assert.equal((await unary(c, 'Remove', { key })).removed, true);
  } finally {
    c.close();
    admin.close();
    await server.stop();
  }
});
