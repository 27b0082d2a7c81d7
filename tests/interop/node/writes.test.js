'use strict';
// Conditional and read-modify-write operations: Add, GetOrAdd, Update,
// compare-and-set with if_version, Remove, Increment, request_id retries.

const assert = require('node:assert/strict');
const { test, before, after } = require('node:test');
const { startServer, cacheClient, unary, rejects, assertStatus, uniqueKey, grpc } = require('./drey');

const INT64_MAX = '9223372036854775807';
const INT64_MIN = '-9223372036854775808';

let server;
let client;

before(async () => {
  server = await startServer();
  client = cacheClient(server);
});

after(async () => {
  if (client) client.close();
  if (server) await server.stop();
});

function mismatch(err, currentVersion) {
  return assertStatus(err, {
    code: grpc.status.FAILED_PRECONDITION,
    reason: 'VERSION_MISMATCH',
    metadata: { currentVersion },
  });
}

test('Add inserts only when absent and reports the current entry otherwise', async () => {
  const key = uniqueKey('add');
  const first = await unary(client, 'Add', { key, value: { string_value: 'first' } });
  assert.equal(first.added, true);
  assert.match(first.version, /^[1-9][0-9]*$/);
  assert.equal(first.expires_at, null);

  const second = await unary(client, 'Add', { key, value: { string_value: 'second' } });
  assert.equal(second.added, false);
  assert.equal(second.version, first.version, 'the current entry\'s version');
  assert.deepEqual(second.current_value, { string_value: 'first', kind: 'string_value' });

  const got = await unary(client, 'Get', { key });
  assert.equal(got.value.string_value, 'first');
  assert.equal(got.version, first.version);
});

test('GetOrAdd returns the live value or inserts the given one', async () => {
  const key = uniqueKey('getoradd');
  const first = await unary(client, 'GetOrAdd', { key, value: { int64_value: '41' } });
  assert.equal(first.added, true);
  assert.deepEqual(first.value, { int64_value: '41', kind: 'int64_value' });
  assert.match(first.version, /^[1-9][0-9]*$/);

  const second = await unary(client, 'GetOrAdd', { key, value: { int64_value: '99' } });
  assert.equal(second.added, false);
  assert.deepEqual(second.value, { int64_value: '41', kind: 'int64_value' });
  assert.equal(second.version, first.version);
});

test('Update replaces only a live key', async () => {
  const key = uniqueKey('update');
  const absent = await unary(client, 'Update', { key, value: { bool_value: true } });
  assert.equal(absent.updated, false);
  assert.equal((await unary(client, 'Get', { key })).found, false, 'Update does not insert');

  const set = await unary(client, 'Set', { key, value: { bool_value: false } });
  const upd = await unary(client, 'Update', { key, value: { bool_value: true } });
  assert.equal(upd.updated, true);
  assert.ok(BigInt(upd.version) > BigInt(set.version));
  const got = await unary(client, 'Get', { key });
  assert.deepEqual(got.value, { bool_value: true, kind: 'bool_value' });
  assert.equal(got.version, upd.version);

  mismatch(await rejects(unary(client, 'Update', { key, value: { bool_value: false }, if_version: set.version }),
    grpc.status.FAILED_PRECONDITION), upd.version);
  const cas = await unary(client, 'Update', { key, value: { bool_value: false }, if_version: upd.version });
  assert.equal(cas.updated, true);
});

test('Set with if_version: compare-and-set, 0 meaning "only if absent"', async () => {
  const key = uniqueKey('cas');
  const v1 = await unary(client, 'Set', { key, value: { string_value: 'v1' }, if_version: '0' });

  // Absent-only on a live key: mismatch, reporting the live version.
  mismatch(await rejects(unary(client, 'Set', { key, value: { string_value: 'x' }, if_version: '0' }),
    grpc.status.FAILED_PRECONDITION), v1.version);

  const v2 = await unary(client, 'Set', { key, value: { string_value: 'v2' }, if_version: v1.version });
  assert.ok(BigInt(v2.version) > BigInt(v1.version));

  // The stale version no longer matches.
  mismatch(await rejects(unary(client, 'Set', { key, value: { string_value: 'x' }, if_version: v1.version }),
    grpc.status.FAILED_PRECONDITION), v2.version);
  const got = await unary(client, 'Get', { key });
  assert.equal(got.value.string_value, 'v2', 'a failed CAS changes nothing');
  assert.equal(got.version, v2.version);

  // A non-zero version on an absent key: the current version is 0.
  const absent = uniqueKey('cas-absent');
  mismatch(await rejects(unary(client, 'Set', { key: absent, value: { string_value: 'x' }, if_version: v2.version }),
    grpc.status.FAILED_PRECONDITION), '0');
  assert.equal((await unary(client, 'Get', { key: absent })).found, false);
});

test('Remove with return_previous returns the removed entry', async () => {
  const key = uniqueKey('remove');
  const set = await unary(client, 'Set', { key, value: { bytes_value: Buffer.from([1, 2, 3]) } });
  const rm = await unary(client, 'Remove', { key, return_previous: true });
  assert.deepEqual(rm, {
    removed: true,
    version: set.version,
    previous: { bytes_value: Buffer.from([1, 2, 3]), kind: 'bytes_value' },
  });
  assert.equal((await unary(client, 'Get', { key })).found, false);

  const again = await unary(client, 'Remove', { key, return_previous: true });
  assert.equal(again.removed, false);
  assert.equal(again.previous, null);
});

test('Remove without return_previous returns no value; if_version guards it', async () => {
  const key = uniqueKey('remove-cas');
  const set = await unary(client, 'Set', { key, value: { string_value: 'keep?' } });
  mismatch(await rejects(unary(client, 'Remove', { key, if_version: String(BigInt(set.version) + 1n) }),
    grpc.status.FAILED_PRECONDITION), set.version);
  assert.equal((await unary(client, 'Get', { key })).found, true, 'a failed conditional Remove keeps the key');

  const rm = await unary(client, 'Remove', { key, if_version: set.version });
  assert.equal(rm.removed, true);
  assert.equal(rm.version, set.version);
  assert.equal(rm.previous, null, 'previous only with return_previous');
  assert.equal((await unary(client, 'Get', { key })).found, false);
});

test('Increment creates with initial + delta, then adds', async () => {
  const key = uniqueKey('incr');
  const a = await unary(client, 'Increment', { key, delta: '5', initial: '10' });
  assert.equal(a.value, '15');
  assert.equal(a.created, true);
  const b = await unary(client, 'Increment', { key, delta: '-20', initial: '1000' });
  assert.equal(b.value, '-5', 'initial only applies on creation');
  assert.equal(b.created, false);
  assert.ok(BigInt(b.version) > BigInt(a.version));
  const got = await unary(client, 'Get', { key });
  assert.deepEqual(got.value, { int64_value: '-5', kind: 'int64_value' });
  assert.equal(got.version, b.version);

  // int64 precision survives the round trip (beyond 2^53).
  const big = uniqueKey('incr-big');
  const c = await unary(client, 'Increment', { key: big, delta: '1', initial: '9007199254740992' });
  assert.equal(c.value, '9007199254740993');
});

test('Increment to the int64 limits succeeds; past them is OUT_OF_RANGE INTEGER_OVERFLOW', async () => {
  const key = uniqueKey('overflow');
  const set = await unary(client, 'Set', { key, value: { int64_value: '9223372036854775806' } });
  const top = await unary(client, 'Increment', { key, delta: '1' });
  assert.equal(top.value, INT64_MAX);

  const err = await rejects(unary(client, 'Increment', { key, delta: '1' }), grpc.status.OUT_OF_RANGE);
  assertStatus(err, { code: grpc.status.OUT_OF_RANGE, reason: 'INTEGER_OVERFLOW', metadata: {} });
  const got = await unary(client, 'Get', { key });
  assert.equal(got.value.int64_value, INT64_MAX, 'an overflowing Increment changes nothing');
  assert.equal(got.version, top.version);
  assert.ok(BigInt(top.version) > BigInt(set.version));

  const low = uniqueKey('underflow');
  await unary(client, 'Set', { key: low, value: { int64_value: INT64_MIN } });
  assertStatus(await rejects(unary(client, 'Increment', { key: low, delta: '-1' }), grpc.status.OUT_OF_RANGE),
    { code: grpc.status.OUT_OF_RANGE, reason: 'INTEGER_OVERFLOW', metadata: {} });
  assert.equal((await unary(client, 'Increment', { key: low, delta: INT64_MAX })).value, '-1');

  // Creation that would overflow fails and creates nothing.
  const fresh = uniqueKey('overflow-create');
  assertStatus(await rejects(unary(client, 'Increment', { key: fresh, delta: '1', initial: INT64_MAX }),
    grpc.status.OUT_OF_RANGE), { code: grpc.status.OUT_OF_RANGE, reason: 'INTEGER_OVERFLOW', metadata: {} });
  assert.equal((await unary(client, 'Get', { key: fresh })).found, false);
});

test('Increment of a non-int64 value is FAILED_PRECONDITION NOT_AN_INTEGER', async () => {
  for (const value of [{ string_value: '12' }, { double_value: 1 }, { bool_value: true }, { null_value: 'NULL_VALUE' }]) {
    const key = uniqueKey('nan');
    const set = await unary(client, 'Set', { key, value });
    const err = await rejects(unary(client, 'Increment', { key, delta: '1' }), grpc.status.FAILED_PRECONDITION);
    assertStatus(err, { code: grpc.status.FAILED_PRECONDITION, reason: 'NOT_AN_INTEGER', metadata: {} });
    const got = await unary(client, 'Get', { key });
    assert.equal(got.version, set.version, `unchanged after Increment of ${JSON.stringify(value)}`);
  }
});

// cache.proto: "a retry with the same id returns the first outcome instead
// of applying twice".
test('a retried request_id returns the first outcome instead of applying twice', async () => {
  const key = uniqueKey('idem');
  const requestId = uniqueKey('req');
  const first = await unary(client, 'Increment', { key, delta: '1', request_id: requestId });
  const retry = await unary(client, 'Increment', { key, delta: '1', request_id: requestId });
  assert.deepEqual(retry, first);
  const got = await unary(client, 'Get', { key });
  assert.equal(got.value.int64_value, '1', 'applied once');
  const other = await unary(client, 'Increment', { key, delta: '1', request_id: uniqueKey('req') });
  assert.equal(other.value, '2', 'a new request_id applies');
});
