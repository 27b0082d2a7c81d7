'use strict';
// grpc.health.v1.Health through grpc-js: Check, Watch, and the drain on
// SIGTERM (NOT_SERVING to every watcher, streams end, exit 0).

const assert = require('node:assert/strict');
const { test } = require('node:test');
const {
  startServer, cacheClient, healthClient, unary, rejects, assertStatus, pollUntil, uniqueKey, grpc,
} = require('./drey');

const CACHE_SERVICE = 'drey.cache.v1.Cache';

/**
 * Opens a Watch stream and returns { next(), status, call }: next() resolves
 * to the next message or null when the stream has ended; status resolves to
 * the call's final status.
 */
function watch(client, service) {
  const call = client.Watch({ service }, { deadline: Date.now() + 60000 });
  const status = new Promise((resolve) => call.on('status', resolve));
  call.on('error', () => {}); // the status promise reports it
  const it = call[Symbol.asyncIterator]();
  return {
    call,
    status,
    async next() {
      const r = await it.next();
      return r.done ? null : r.value;
    },
  };
}

test('Check: "" and drey.cache.v1.Cache are SERVING; unknown services are NOT_FOUND', async () => {
  const server = await startServer();
  const health = healthClient(server);
  try {
    assert.deepEqual(await unary(health, 'Check', { service: '' }), { status: 'SERVING' });
    assert.deepEqual(await unary(health, 'Check', { service: CACHE_SERVICE }), { status: 'SERVING' });
    for (const service of ['no.such.Service', 'drey.cache.v1.cache', 'x'.repeat(1000)]) {
      const err = await rejects(unary(health, 'Check', { service }), grpc.status.NOT_FOUND);
      assertStatus(err, { code: grpc.status.NOT_FOUND, reason: 'UNKNOWN_SERVICE', metadata: {} });
    }
  } finally {
    health.close();
    await server.stop();
  }
});

test('Watch: SERVING, then NOT_SERVING on SIGTERM, then the stream ends and dreyd exits 0', async () => {
  const server = await startServer(['--drain-grace=1s']);
  const health = healthClient(server);
  try {
    const node = watch(health, '');
    const cache = watch(health, CACHE_SERVICE);
    const unknown = watch(health, 'no.such.Service');
    assert.deepEqual(await node.next(), { status: 'SERVING' });
    assert.deepEqual(await cache.next(), { status: 'SERVING' });
    assert.deepEqual(await unknown.next(), { status: 'SERVICE_UNKNOWN' });

    server.signal('SIGTERM');
    assert.deepEqual(await node.next(), { status: 'NOT_SERVING' });
    assert.deepEqual(await cache.next(), { status: 'NOT_SERVING' });
    assert.equal(await node.next(), null, 'the "" stream ends after NOT_SERVING');
    assert.equal(await cache.next(), null, 'the Cache stream ends after NOT_SERVING');
    assert.equal((await node.status).code, grpc.status.OK);
    assert.equal((await cache.status).code, grpc.status.OK);

    // Every watcher is told and its stream ends, an unknown service's too.
    assert.deepEqual(await unknown.next(), { status: 'NOT_SERVING' });
    assert.equal(await unknown.next(), null);
    assert.equal((await unknown.status).code, grpc.status.OK);

    const log = await server.waitExit0();
    const msgs = server.logLines().map((l) => l.msg);
    for (const m of ['draining', 'stopping', 'stopped']) assert.ok(msgs.includes(m), `no "${m}" in\n${log}`);
  } finally {
    health.close();
    await server.stop();
  }
});

test('Watch of an unknown service: SERVICE_UNKNOWN, and the stream stays open', async () => {
  const server = await startServer();
  const health = healthClient(server);
  try {
    const w = watch(health, 'no.such.Service');
    assert.deepEqual(await w.next(), { status: 'SERVICE_UNKNOWN' });
    // Still open: a Check on the same channel completes while the stream
    // has neither ended nor sent anything more.
    let ended = false;
    w.status.then(() => {
      ended = true;
    });
    assert.deepEqual(await unary(health, 'Check', { service: '' }), { status: 'SERVING' });
    assert.equal(ended, false, 'the Watch stream ended on its own');
    w.call.cancel();
    assert.equal((await w.status).code, grpc.status.CANCELLED);
  } finally {
    health.close();
    await server.stop();
  }
});

test('during the drain grace: NOT_SERVING, calls still served, new Watches end at once; a second signal stops', async () => {
  // A grace period far longer than the test: only the second signal can end it in time.
  const server = await startServer(['--drain-grace=120s']);
  const health = healthClient(server);
  const client = cacheClient(server);
  try {
    assert.deepEqual(await unary(health, 'Check', { service: '' }), { status: 'SERVING' });
    server.signal('SIGTERM');
    await pollUntil(() => unary(health, 'Check', { service: '' }), (r) => r.status === 'NOT_SERVING',
      { what: 'health NOT_SERVING after SIGTERM' });
    assert.deepEqual(await unary(health, 'Check', { service: CACHE_SERVICE }), { status: 'NOT_SERVING' });

    const key = uniqueKey('drain');
    const set = await unary(client, 'Set', { key, value: { string_value: 'still served' } });
    const got = await unary(client, 'Get', { key });
    assert.equal(got.version, set.version);

    const late = watch(health, '');
    assert.deepEqual(await late.next(), { status: 'NOT_SERVING' });
    assert.equal(await late.next(), null);
    assert.equal((await late.status).code, grpc.status.OK);
    assert.equal(server.exit, null, 'still running inside the grace period');

    server.signal('SIGTERM');
    const log = await server.waitExit0(60000);
    assert.ok(server.logLines().some((l) => l.msg === 'second signal: ending the grace period now'), log);
  } finally {
    client.close();
    health.close();
    await server.stop();
  }
});
