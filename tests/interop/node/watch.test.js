'use strict';
// Cache/Watch from @grpc/grpc-js: filters, include_values, a stuck reader's
// single RESYNC_REQUIRED, resuming inside and outside the node's history,
// the per-principal watch limit and cancellation.

const assert = require('node:assert/strict');
const { test } = require('node:test');
const {
  startServer, loadApi, cacheClient, unary, assertStatus, pollUntil, uniqueKey, grpc,
} = require('./drey');

function ownConnection(server) {
  const { Cache } = loadApi().drey.cache.v1;
  return new Cache(server.address, grpc.credentials.createInsecure(), { 'grpc.use_local_subchannel_pool': 1 });
}

/** A Watch whose events queue up until a test takes them with next(). */
function watch(client, request) {
  const call = client.Watch(request, new grpc.Metadata(), { deadline: Date.now() + 120000 });
  const queue = [];
  const waiters = [];
  let ended = null;
  const wake = () => {
    while (waiters.length > 0 && (queue.length > 0 || ended)) {
      const w = waiters.shift();
      if (queue.length > 0) w.resolve(queue.shift());
      else w.reject(ended);
    }
  };
  call.on('data', (ev) => { queue.push(ev); wake(); });
  call.on('error', (e) => { ended = e; wake(); });
  call.on('end', () => { ended = ended || new Error('the stream ended'); wake(); });
  return {
    call,
    next(timeoutMs = 20000) {
      return new Promise((resolve, reject) => {
        const t = setTimeout(() => reject(new Error('no event within the deadline')), timeoutMs);
        waiters.push({
          resolve: (v) => { clearTimeout(t); resolve(v); },
          reject: (e) => { clearTimeout(t); reject(e); },
        });
        wake();
      });
    },
    cancel() { call.cancel(); },
  };
}

function set(client, key, value, cache = '') {
  return unary(client, 'Set', { cache, key, value });
}

test('filters, values and order', async () => {
  const server = await startServer(['--ephemeral']);
  const client = cacheClient(server);
  try {
    const a = uniqueKey('a');
    const p = uniqueKey('p');
    const byKey = watch(client, { keys: [a], include_values: true });
    const byPrefix = watch(client, { cache: 'pc', prefix: p });
    for (const w of [byKey, byPrefix]) {
      const first = await w.next();
      assert.equal(first.kind, 'WATCHING');
      assert.notEqual(first.feed, '0');
    }
    const v1 = (await set(client, a, { string_value: 'one' })).version;
    await set(client, uniqueKey('elsewhere'), { string_value: 'x' });
    const rm = await unary(client, 'Remove', { key: a });
    await set(client, `${p}/1`, { int64_value: '7' }, 'pc');
    await set(client, `${p}/1`, { int64_value: '8' }); // another cache
    await unary(client, 'Clear', { cache: 'pc' });

    const e1 = await byKey.next();
    assert.deepEqual([e1.kind, e1.cache, e1.key, e1.version, e1.value.string_value], ['SET', 'default', a, v1, 'one']);
    const e2 = await byKey.next();
    assert.deepEqual([e2.kind, e2.version], ['REMOVE', rm.version]);
    assert.ok(BigInt(e1.sequence) < BigInt(e2.sequence));
    const p1 = await byPrefix.next();
    assert.deepEqual([p1.kind, p1.key, p1.value], ['SET', `${p}/1`, null]); // no include_values
    assert.equal((await byPrefix.next()).kind, 'CLEAR');
    byKey.cancel();
    byPrefix.cancel();
  } finally {
    client.close();
    await server.stop();
  }
});

test('a stuck reader gets exactly one RESYNC_REQUIRED and the stream goes on', async () => {
  // 15 events of 64 KiB fit the buffer, a 16th does not: the small write
  // that ends the test always finds room.
  const server = await startServer(['--ephemeral', '--watch-buffer-bytes=1MiB']);
  const client = cacheClient(server);
  const reader = ownConnection(server);
  try {
    const k = uniqueKey('big');
    const w = watch(reader, { keys: [k], include_values: true });
    assert.equal((await w.next()).kind, 'WATCHING');
    w.call.pause(); // nobody reads: HTTP/2 flow control backs up to the node
    const big = { bytes_value: Buffer.alloc(65536, 120) };
    for (let i = 0; i < 400; i += 1) await set(client, k, big); // 26 MB
    const after = (await set(client, k, { string_value: 'after' })).version;
    w.call.resume();
    const events = [];
    for (;;) {
      const ev = await w.next();
      events.push(ev);
      if (ev.kind === 'SET' && ev.version === after) break;
    }
    w.cancel();
    const resyncs = events.filter((e) => e.kind === 'RESYNC_REQUIRED');
    assert.equal(resyncs.length, 1, `kinds: ${events.map((e) => e.kind).join(',')}`);
    assert.equal(resyncs[0].reason, 'BUFFER_OVERFLOW');
    const at = events.indexOf(resyncs[0]);
    assert.ok(events.length < 400, 'no event was lost: the reader was never stuck');
    const seq = (e) => BigInt(e.sequence);
    assert.ok(events.slice(0, at).every((e) => seq(e) <= seq(resyncs[0])));
    assert.ok(events.slice(at + 1).every((e) => seq(e) > seq(resyncs[0])));
    const versions = events.filter((e) => e.kind === 'SET').map((e) => BigInt(e.version));
    assert.deepEqual(versions, [...versions].sort((x, y) => (x < y ? -1 : x > y ? 1 : 0)));
  } finally {
    reader.close();
    client.close();
    await server.stop();
  }
});

test('resume inside the history, and outside it', async () => {
  const server = await startServer(['--ephemeral']);
  const client = cacheClient(server);
  try {
    const k = uniqueKey('r');
    const w = watch(client, { keys: [k] });
    const first = await w.next();
    await set(client, k, { string_value: '1' });
    const seen = await w.next();
    w.cancel();
    const missed = [];
    for (const v of ['2', '3']) missed.push((await set(client, k, { string_value: v })).version);
    const again = watch(client, { keys: [k], resume_feed: first.feed, resume_after: seen.sequence });
    const hello = await again.next();
    assert.deepEqual([hello.kind, hello.sequence], ['WATCHING', seen.sequence]);
    assert.deepEqual([(await again.next()).version, (await again.next()).version], missed);
    again.cancel();

    const lost = watch(client, { keys: [k], resume_feed: first.feed, resume_after: '999999999' });
    const ev = await lost.next();
    assert.deepEqual([ev.kind, ev.reason, ev.feed], ['RESYNC_REQUIRED', 'HISTORY_UNAVAILABLE', first.feed]);
    lost.cancel();
  } finally {
    client.close();
    await server.stop();
  }
});

test('PRINCIPAL_WATCH_LIMIT, and a cancelled watch frees its place', async () => {
  const server = await startServer(['--ephemeral', '--principal-max-watches=1']);
  const mine = ownConnection(server);
  const other = ownConnection(server);
  try {
    const held = watch(mine, {});
    assert.equal((await held.next()).kind, 'WATCHING');
    const refused = watch(mine, {});
    const err = await refused.next().then(() => assert.fail('a second watch was admitted'), (e) => e);
    const st = assertStatus(err, {
      code: grpc.status.RESOURCE_EXHAUSTED, reason: 'PRINCIPAL_WATCH_LIMIT', metadata: { limitWatches: '1' },
    });
    const qf = st.details.find((d) => d.type === 'google.rpc.QuotaFailure').value;
    assert.match(qf.violations[0].subject, /^principal:conn:/);
    const elsewhere = watch(other, {});
    assert.equal((await elsewhere.next()).kind, 'WATCHING');
    held.cancel();
    const ok = await pollUntil(async () => {
      const w = watch(mine, {});
      try {
        return (await w.next()).kind;
      } catch (e) {
        return e.code;
      }
    }, (r) => r === 'WATCHING', { what: 'a watch after the cancel' });
    assert.equal(ok, 'WATCHING');
    elsewhere.cancel();
  } finally {
    mine.close();
    other.close();
    await server.stop();
  }
});
