'use strict';
// Expiry: ttl and expires_at, Touch, Persist, GetExpiration, and short ttls
// observed by polling with a deadline (never by sleeping a fixed time).

const assert = require('node:assert/strict');
const { test, before, after } = require('node:test');
const {
  startServer, cacheClient, unary, uniqueKey, pollUntil, timestampMs, durationMs,
} = require('./drey');

const MINUTE = { seconds: '60', nanos: 0 };
const SHORT_TTL_MS = 300;
const SHORT = { seconds: '0', nanos: SHORT_TTL_MS * 1e6 };
// Client and server read the same system clock; allow for ms rounding.
const SLACK_MS = 5;

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

function timestamp(ms) {
  return { seconds: String(Math.floor(ms / 1000)), nanos: (ms % 1000) * 1e6 };
}

/** Asserts that `ts` is `ttlMs` after some instant within [before, after]. */
function assertExpiresIn(ts, ttlMs, beforeMs, afterMs) {
  const at = timestampMs(ts);
  assert.ok(at >= beforeMs + ttlMs - SLACK_MS && at <= afterMs + ttlMs + SLACK_MS,
    `expires_at ${at} not within [${beforeMs + ttlMs}, ${afterMs + ttlMs}]`);
  return at;
}

/** Polls Get until the key is gone; asserts it was not gone before its expiry. */
async function waitExpired(key, expiresAtMs, cache = '') {
  const got = await pollUntil(async () => {
    const r = await unary(client, 'Get', { cache, key });
    return { found: r.found, receivedAt: Date.now() };
  }, (r) => !r.found, { what: `expiry of ${key}` });
  // The server read the entry before we received the answer: if it was
  // already invisible then, its expiry time had passed on the shared clock.
  assert.ok(got.receivedAt >= expiresAtMs, `expired early: gone at ${got.receivedAt}, expires_at ${expiresAtMs}`);
}

test('Set with ttl reports expires_at; Get and GetExpiration agree', async () => {
  const key = uniqueKey('ttl');
  const t0 = Date.now();
  const set = await unary(client, 'Set', { key, value: { string_value: 'x' }, ttl: MINUTE });
  const t1 = Date.now();
  assertExpiresIn(set.expires_at, 60000, t0, t1);

  const got = await unary(client, 'Get', { key });
  assert.deepEqual(got.expires_at, set.expires_at);

  const exp = await unary(client, 'GetExpiration', { key });
  const t2 = Date.now();
  assert.equal(exp.found, true);
  assert.equal(exp.has_expiration, true);
  assert.deepEqual(exp.expires_at, set.expires_at);
  const remaining = durationMs(exp.remaining);
  assert.ok(remaining > 0 && remaining <= 60000, `remaining ${remaining}`);
  assert.ok(remaining >= timestampMs(set.expires_at) - t2 - SLACK_MS, `remaining ${remaining} too small`);
});

test('Persist drops the expiry and keeps the version', async () => {
  const key = uniqueKey('persist');
  const set = await unary(client, 'Set', { key, value: { int64_value: '1' }, ttl: MINUTE });
  const p = await unary(client, 'Persist', { key });
  assert.deepEqual(p, { found: true, version: set.version });

  assert.deepEqual(await unary(client, 'GetExpiration', { key }),
    { found: true, has_expiration: false, remaining: null, expires_at: null });
  const got = await unary(client, 'Get', { key });
  assert.equal(got.expires_at, null);
  assert.equal(got.version, set.version);

  assert.equal((await unary(client, 'Persist', { key })).found, false, 'found only if it had an expiry');
  assert.equal((await unary(client, 'Persist', { key: uniqueKey('persist-absent') })).found, false);
  assert.deepEqual(await unary(client, 'GetExpiration', { key: uniqueKey('absent') }),
    { found: false, has_expiration: false, remaining: null, expires_at: null });
});

test('Touch gives a live key a new ttl, keeps the version, and the key expires on time', async () => {
  const key = uniqueKey('touch');
  const set = await unary(client, 'Set', { key, value: { string_value: 'short-lived' } });
  assert.equal(set.expires_at, null);

  let t0 = Date.now();
  const long = await unary(client, 'Touch', { key, ttl: MINUTE });
  assert.equal(long.found, true);
  assert.equal(long.version, set.version);
  assertExpiresIn(long.expires_at, 60000, t0, Date.now());

  t0 = Date.now();
  const short = await unary(client, 'Touch', { key, ttl: SHORT });
  assert.equal(short.found, true);
  assert.equal(short.version, set.version);
  const at = assertExpiresIn(short.expires_at, SHORT_TTL_MS, t0, Date.now());

  const exp = await unary(client, 'GetExpiration', { key });
  if (exp.found) {
    assert.equal(exp.has_expiration, true);
    assert.deepEqual(exp.expires_at, short.expires_at);
    assert.ok(durationMs(exp.remaining) <= SHORT_TTL_MS, `remaining ${durationMs(exp.remaining)}`);
  }

  await waitExpired(key, at);

  // An expired entry is invisible to every operation.
  assert.deepEqual(await unary(client, 'GetExpiration', { key }),
    { found: false, has_expiration: false, remaining: null, expires_at: null });
  assert.equal((await unary(client, 'Touch', { key, ttl: MINUTE })).found, false);
  assert.equal((await unary(client, 'Persist', { key })).found, false);
  assert.equal((await unary(client, 'Update', { key, value: { bool_value: true } })).updated, false);
  assert.equal((await unary(client, 'Remove', { key, return_previous: true })).removed, false);
  assert.equal((await unary(client, 'GetMany', { keys: [key] })).results[0].found, false);
  const add = await unary(client, 'Add', { key, value: { string_value: 'again' } });
  assert.equal(add.added, true, 'an expired entry counts as absent for Add');
  assert.ok(BigInt(add.version) > BigInt(set.version));
});

test('Touch of an absent key: found false', async () => {
  assert.equal((await unary(client, 'Touch', { key: uniqueKey('touch-absent'), ttl: MINUTE })).found, false);
});

test('Add and Increment with a short ttl: the key is absent again after expiry', async () => {
  const key = uniqueKey('add-ttl');
  const a = await unary(client, 'Add', { key, value: { string_value: 'a' }, ttl: SHORT });
  assert.equal(a.added, true);
  await waitExpired(key, timestampMs(a.expires_at));
  assert.equal((await unary(client, 'Add', { key, value: { string_value: 'b' } })).added, true);

  const counter = uniqueKey('incr-ttl');
  const c = await unary(client, 'Increment', { key: counter, delta: '1', ttl: SHORT });
  assert.equal(c.created, true);
  const exp = await unary(client, 'GetExpiration', { key: counter });
  if (exp.found) assert.equal(exp.has_expiration, true, 'the ttl applies on creation');
  await waitExpired(counter, exp.found ? timestampMs(exp.expires_at) : 0);
  const again = await unary(client, 'Increment', { key: counter, delta: '1' });
  assert.deepEqual([again.value, again.created], ['1', true], 'recreated from initial 0');
});

test('Set with no expiration keeps an existing expiry; persist drops it; expires_at sets it', async () => {
  const key = uniqueKey('keep');
  const first = await unary(client, 'Set', { key, value: { int64_value: '1' }, ttl: MINUTE });
  const second = await unary(client, 'Set', { key, value: { int64_value: '2' } });
  assert.deepEqual(second.expires_at, first.expires_at);
  assert.deepEqual((await unary(client, 'Get', { key })).expires_at, first.expires_at);

  const third = await unary(client, 'Set', { key, value: { int64_value: '3' }, persist: true });
  assert.equal(third.expires_at, null);
  assert.equal((await unary(client, 'GetExpiration', { key })).has_expiration, false);

  const atMs = (Math.floor(Date.now() / 1000) + 3600) * 1000 + 250;
  const fourth = await unary(client, 'Set', { key, value: { int64_value: '4' }, expires_at: timestamp(atMs) });
  assert.equal(timestampMs(fourth.expires_at), atMs);
  assert.equal(timestampMs((await unary(client, 'Get', { key })).expires_at), atMs);

  const fresh = uniqueKey('keep-new');
  assert.equal((await unary(client, 'Set', { key: fresh, value: { int64_value: '1' } })).expires_at, null,
    'a new entry without expiration never expires');
});

test('Update and Increment keep the expiry of an existing key', async () => {
  const key = uniqueKey('update-ttl');
  const set = await unary(client, 'Set', { key, value: { int64_value: '1' }, ttl: MINUTE });
  const upd = await unary(client, 'Update', { key, value: { int64_value: '5' } });
  assert.deepEqual(upd.expires_at, set.expires_at);
  await unary(client, 'Increment', { key, delta: '1', ttl: { seconds: '7200', nanos: 0 } });
  const got = await unary(client, 'Get', { key });
  assert.equal(got.value.int64_value, '6');
  assert.deepEqual(got.expires_at, set.expires_at, 'Increment\'s ttl applies only on creation');
});

test('an expires_at in the past stores an entry that is never visible', async () => {
  const key = uniqueKey('past');
  await unary(client, 'Set', { key, value: { string_value: 'old' } });
  await unary(client, 'Set', { key, value: { string_value: 'gone' }, expires_at: timestamp(Date.now() - 10000) });
  assert.equal((await unary(client, 'Get', { key })).found, false);
  assert.equal((await unary(client, 'Add', { key, value: { string_value: 'new' } })).added, true);
});

test('SetMany entries carry their own expiry; GetMany reports it', async () => {
  const short = uniqueKey('many-ttl');
  const forever = uniqueKey('many-forever');
  const res = await unary(client, 'SetMany', {
    entries: [
      { key: short, value: { bool_value: true }, ttl: SHORT },
      { key: forever, value: { bool_value: false } },
    ],
  });
  assert.ok(res.results[0].expires_at);
  assert.equal(res.results[1].expires_at, null);
  const many = await unary(client, 'GetMany', { keys: [short, forever] });
  if (many.results[0].found) assert.deepEqual(many.results[0].expires_at, res.results[0].expires_at);
  assert.equal(many.results[1].expires_at, null);
  await waitExpired(short, timestampMs(res.results[0].expires_at));
  const later = await unary(client, 'GetMany', { keys: [short, forever] });
  assert.deepEqual(later.results.map((r) => r.found), [false, true]);
});

// dreyd keeps expiries in whole milliseconds, rounded up; rounding must not
// step past google.protobuf.Timestamp's valid range (strict clients — JSON
// mapping, grpcurl, Go's CheckValid — reject 10000-01-01T00:00:00Z).
test('expires_at at the end of the Timestamp range comes back as a valid Timestamp', async () => {
  const key = uniqueKey('max-ts');
  const max = { seconds: '253402300799', nanos: 999999999 };
  const set = await unary(client, 'Set', { key, value: { bool_value: true }, expires_at: max });
  for (const ts of [set.expires_at, (await unary(client, 'Get', { key })).expires_at]) {
    assert.ok(BigInt(ts.seconds) <= 253402300799n, `expires_at ${JSON.stringify(ts)} is past 9999-12-31T23:59:59.999999999Z`);
  }
});
