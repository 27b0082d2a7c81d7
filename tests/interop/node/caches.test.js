'use strict';
// Scan, Clear, RemoveMany, ListCaches and GetCacheStats through grpc-js, and
// eviction keeping a node with --memory-limit and --eviction taking writes.

const assert = require('node:assert/strict');
const { test, before, after } = require('node:test');
const { startServer, cacheClient, unary, rejects, assertStatus, grpc } = require('./drey');

let server;
let client;

before(async () => {
  server = await startServer(['--memory-limit=262144', '--eviction=allkeys-lru', '--max-batch=50']);
  client = cacheClient(server);
});

after(async () => {
  if (client) client.close();
  if (server) await server.stop();
});

async function scanAll(cache, extra = {}) {
  const items = [];
  let cursor = '';
  for (let pages = 0; pages < 10000; pages++) {
    const r = await unary(client, 'Scan', { cache, cursor, ...extra });
    items.push(...r.items);
    cursor = r.next_cursor;
    if (cursor === '') return items;
  }
  throw new Error('the scan did not end');
}

test('RemoveMany answers per key, in order, within --max-batch', async () => {
  const a = await unary(client, 'Set', { cache: 'nrm', key: 'a', value: { string_value: 'x' } });
  const r = await unary(client, 'RemoveMany', { cache: 'nrm', keys: ['a', 'b'] });
  assert.deepEqual(r.results.map((x) => [x.key, x.removed, x.version]), [['a', true, a.version], ['b', false, '0']]);
  const keys = Array.from({ length: 51 }, (_, i) => `k${i}`);
  const err = await rejects(unary(client, 'RemoveMany', { cache: 'nrm', keys }), grpc.status.INVALID_ARGUMENT);
  assertStatus(err, { code: grpc.status.INVALID_ARGUMENT, reason: 'BATCH_TOO_LARGE', metadata: { limitItems: '50' },
    violations: [{ field: 'keys', reason: 'BATCH_TOO_LARGE' }] });
});

test('Scan pages through live keys under a prefix, with values on request', async () => {
  for (let i = 0; i < 60; i++)
    await unary(client, 'Set', { cache: 'nsc', key: `${i % 2 ? 'odd' : 'even'}/${i}`, value: { int64_value: String(i) } });
  const all = await scanAll('nsc', { limit: 7 });
  assert.equal(all.length, 60);
  assert.ok(all.every((i) => i.value === null), 'values without include_values');
  const odd = await scanAll('nsc', { prefix: 'odd/', include_values: true });
  assert.deepEqual(odd.map((i) => Number(i.key.split('/')[1])).sort((x, y) => x - y),
    Array.from({ length: 30 }, (_, i) => 2 * i + 1));
  for (const i of odd) assert.equal(i.value.int64_value, i.key.split('/')[1]);
  const err = await rejects(unary(client, 'Scan', { cache: 'nsc', cursor: 'AAAA' }), grpc.status.INVALID_ARGUMENT);
  const st = assertStatus(err, { code: grpc.status.INVALID_ARGUMENT, reason: 'INVALID_CURSOR',
    violations: [{ field: 'cursor', reason: 'INVALID_CURSOR' }] });
  assert.ok(st.errorInfo.metadata.why.length > 0);
});

test('Clear empties one cache at once; the figures follow', async () => {
  for (let i = 0; i < 20; i++) await unary(client, 'Set', { cache: 'ncl', key: `k${i}`, value: { bool_value: true } });
  await unary(client, 'Set', { cache: 'nkeep', key: 'k', value: { bool_value: true } });
  const before = await unary(client, 'GetCacheStats', { cache: 'ncl' });
  assert.equal(before.entries, '20');
  assert.equal(before.cache, 'ncl');
  await unary(client, 'Clear', { cache: 'ncl', request_id: 'node-clear-1' });
  const afterStats = await unary(client, 'GetCacheStats', { cache: 'ncl' });
  assert.deepEqual([afterStats.entries, afterStats.bytes], ['0', '0']);
  assert.equal((await unary(client, 'Get', { cache: 'ncl', key: 'k1' })).found, false);
  assert.equal((await unary(client, 'Get', { cache: 'nkeep', key: 'k' })).found, true);
  assert.deepEqual(await scanAll('ncl'), []);
  const list = await unary(client, 'ListCaches', {});
  const names = list.caches.map((c) => c.cache);
  assert.ok(names.includes('nkeep') && !names.includes('ncl'), JSON.stringify(names));
});

test('with --eviction a full node keeps taking writes', async () => {
  const big = 'v'.repeat(1000);
  for (let i = 0; i < 800; i++) await unary(client, 'Set', { cache: 'nev', key: `e${i}`, value: { string_value: big } });
  const st = await unary(client, 'GetCacheStats', { cache: 'nev' });
  assert.ok(Number(st.evictions) > 400, JSON.stringify(st));
  assert.ok(Number(st.entries) < 800);
  assert.equal((await unary(client, 'Get', { cache: 'nev', key: 'e799' })).found, true, 'the newest write was evicted');
});
