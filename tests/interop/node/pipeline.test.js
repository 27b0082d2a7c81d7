'use strict';
// drey.cache.v1.Cache/Pipeline from @grpc/grpc-js: results in stream order
// with the client's ids, same-key operations in stream order, a refused
// operation failing alone with the google.rpc.Status the unary call's
// trailer carries, cancellation, and a stream of 100,000 operations.

const assert = require('node:assert/strict');
const { test, before, after } = require('node:test');
const {
  startServer, cacheClient, unary, rejects, statusDetails, rpcTypes, uniqueKey, grpc,
} = require('./drey');

let server;
let client;

before(async () => {
  // Order and flow control are tested here, not admission: on a loaded
  // machine an operation may wait in the queue longer than the default 250 ms.
  server = await startServer(['--queue-max-wait=30s']);
  client = cacheClient(server);
});

after(async () => {
  if (client) client.close();
  if (server) await server.stop();
});

const str = (s) => ({ string_value: s });

/** A Pipeline stream with a promise for its end and a queue of results. */
function open(deadlineMs = 120000) {
  const call = client.Pipeline(new grpc.Metadata(), { deadline: Date.now() + deadlineMs });
  const results = [];
  let wake = null;
  const ended = new Promise((resolve) => {
    call.on('data', (resp) => {
      results.push(...resp.results);
      if (wake) wake();
    });
    call.on('error', (err) => resolve(err));
    call.on('end', () => resolve(null));
  });
  const take = async (n) => {
    while (results.length < n) {
      await new Promise((resolve) => { wake = resolve; });
      wake = null;
    }
    return results.splice(0, n);
  };
  return { call, ended, take, results };
}

/** The google.rpc.Status of a result, its Any details decoded. */
function decodeStatus(st) {
  const root = rpcTypes();
  const decoded = st.details.map((any) => {
    const type = any.type_url.replace('type.googleapis.com/', '');
    return { type, value: root.lookupType(type).decode(any.value) };
  });
  const one = (type) => (decoded.find((d) => d.type === type) || {}).value || null;
  return { code: st.code, message: st.message, errorInfo: one('google.rpc.ErrorInfo'), badRequest: one('google.rpc.BadRequest') };
}

test('results come in stream order with their ids; a get sees the set before it', async () => {
  const k = uniqueKey('ordered');
  const s = open();
  s.call.write({
    operations: [
      { id: 5, set: { key: k, value: str('a') } },
      { id: 2, get: { key: k } },
      { id: 9, set: { key: k, value: str('b') } },
      { id: 1, get: { key: k } },
      { id: 7, increment: { key: uniqueKey('n'), delta: 3 } },
    ],
  });
  s.call.write({ operations: [{ id: 3, remove: { key: k } }, { id: 4, get: { key: k } }] });
  const got = await s.take(7);
  assert.deepEqual(got.map((r) => Number(r.id)), [5, 2, 9, 1, 7, 3, 4]);
  for (const r of got) assert.ok(!r.status || r.status.code === 0, JSON.stringify(r.status));
  assert.equal(got[0].response, 'set');
  assert.equal(got[1].get.value.string_value, 'a');
  assert.equal(got[1].get.version, got[0].set.version);
  assert.equal(got[3].get.value.string_value, 'b');
  assert.equal(got[4].increment.value, '3');
  assert.equal(got[5].remove.removed, true);
  assert.equal(got[6].get.found, false);
  s.call.end();
  assert.equal(await s.ended, null);
});

test('a refused operation fails alone, with the unary call\'s status', async () => {
  const k = uniqueKey('refusal');
  const bad = { key: '', value: str('x') };
  const err = await rejects(unary(client, 'Set', bad), grpc.status.INVALID_ARGUMENT);
  const want = statusDetails(err);
  const s = open();
  s.call.write({
    operations: [
      { id: 1, set: { key: k, value: str('kept') } },
      { id: 2, set: bad },
      { id: 3, get: { key: k } },
    ],
  });
  const [ok, refused, after] = await s.take(3);
  assert.ok(!ok.status || ok.status.code === 0);
  const st = decodeStatus(refused.status);
  assert.equal(st.code, grpc.status.INVALID_ARGUMENT);
  assert.equal(st.message, want.message);
  assert.equal(st.errorInfo.reason, 'INVALID_KEY');
  assert.equal(st.errorInfo.domain, 'drey.dev');
  assert.deepEqual(st.badRequest.field_violations.map((v) => v.field), want.badRequest.field_violations.map((v) => v.field));
  assert.equal(refused.response, undefined);
  assert.equal(after.get.value.string_value, 'kept', 'the stream went on');
  s.call.end();
  assert.equal(await s.ended, null);
});

test('cancelling the stream ends it CANCELLED and the node goes on', async () => {
  const s = open();
  const ops = [];
  for (let i = 0; i < 200; i++) ops.push({ id: i, get: { key: `c${i}` } });
  s.call.write({ operations: ops });
  s.call.cancel();
  const err = await s.ended;
  assert.ok(err, 'the stream ended without an error');
  assert.equal(err.code, grpc.status.CANCELLED);
  const r = await unary(client, 'Get', { key: 'c0' });
  assert.equal(r.found, false);
});

test('a stream of 100,000 operations', async () => {
  const N = 100000;
  const PER = 500;
  const prefix = uniqueKey('long');
  const s = open(300000);
  let sent = 0;
  let seen = 0;
  const check = (r) => {
    assert.equal(Number(r.id), seen, 'out of order');
    assert.ok(!r.status || r.status.code === 0, JSON.stringify(r.status));
    if (seen % 2 === 1) assert.equal(r.get.value.string_value, String(seen - 1));
    seen++;
  };
  while (sent < N) {
    const ops = [];
    for (let i = sent; i < sent + PER; i += 2) {
      const key = `${prefix}-${(i / 2) % 1000}`;
      ops.push({ id: i, set: { key, value: str(String(i)) } });
      ops.push({ id: i + 1, get: { key } });
    }
    sent += PER;
    if (!s.call.write({ operations: ops })) await new Promise((resolve) => s.call.once('drain', resolve));
    // keep a bounded number unanswered, as a well-behaved client does
    while (sent - seen > 20 * PER) (await s.take(PER)).forEach(check);
  }
  s.call.end();
  while (seen < N) (await s.take(Math.min(PER, N - seen))).forEach(check);
  assert.equal(await s.ended, null);
});
