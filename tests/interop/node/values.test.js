'use strict';
// Set/Get round trips of every Value kind through @grpc/grpc-js and
// proto-loader, cache namespaces, and SetMany/GetMany.

const assert = require('node:assert/strict');
const { test, before, after } = require('node:test');
const { startServer, cacheClient, unary, rejects, assertStatus, uniqueKey, grpc } = require('./drey');

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

// google.protobuf.Struct comes from protobufjs's bundled well-known types,
// whose fields are camelCase whatever keepCase says (numberValue, not
// number_value); proto-loader adds the oneof's `kind` on output.
const STRUCT_IN = {
  fields: {
    n: { numberValue: -1.25 },
    s: { stringValue: 'text ✓' },
    b: { boolValue: true },
    z: { nullValue: 'NULL_VALUE' },
    l: { listValue: { values: [{ numberValue: 1 }, { stringValue: 'two' }, { nullValue: 'NULL_VALUE' }] } },
    o: { structValue: { fields: { inner: { boolValue: false } } } },
  },
};
const STRUCT_OUT = {
  fields: {
    n: { numberValue: -1.25, kind: 'numberValue' },
    s: { stringValue: 'text ✓', kind: 'stringValue' },
    b: { boolValue: true, kind: 'boolValue' },
    z: { nullValue: 'NULL_VALUE', kind: 'nullValue' },
    l: {
      listValue: {
        values: [
          { numberValue: 1, kind: 'numberValue' },
          { stringValue: 'two', kind: 'stringValue' },
          { nullValue: 'NULL_VALUE', kind: 'nullValue' },
        ],
      },
      kind: 'listValue',
    },
    o: { structValue: { fields: { inner: { boolValue: false, kind: 'boolValue' } } }, kind: 'structValue' },
  },
};

// [name, Value sent, Value expected back (default: the same plus kind)]
const CASES = [
  ['bytes', { bytes_value: Buffer.from([0x00, 0x01, 0x7f, 0x80, 0xfe, 0xff]) }],
  ['empty bytes', { bytes_value: Buffer.alloc(0) }],
  ['string', { string_value: 'héllo wörld ✓ 𝄞 日本' }],
  ['empty string', { string_value: '' }],
  ['int64 max', { int64_value: '9223372036854775807' }],
  ['int64 min', { int64_value: '-9223372036854775808' }],
  ['int64 zero', { int64_value: '0' }],
  ['int64 -1', { int64_value: '-1' }],
  ['int64 2^53+1', { int64_value: '9007199254740993' }],
  ['double', { double_value: 3.141592653589793 }],
  ['double tiny negative', { double_value: -2.5e-300 }],
  ['double negative zero', { double_value: -0 }],
  ['double infinity', { double_value: -Infinity }],
  ['double NaN', { double_value: NaN }],
  ['bool true', { bool_value: true }],
  ['bool false', { bool_value: false }],
  ['json struct', { json_value: STRUCT_IN }, { json_value: STRUCT_OUT, kind: 'json_value' }],
  ['empty json struct', { json_value: { fields: {} } }, { json_value: { fields: {} }, kind: 'json_value' }],
  ['null', { null_value: 'NULL_VALUE' }],
];

function expectedOut(sent, out) {
  if (out) return out;
  const [kind] = Object.keys(sent);
  return { ...sent, kind };
}

for (const [name, sent, out] of CASES) {
  test(`Set/Get round trip: ${name}`, async () => {
    const key = uniqueKey(name.replace(/ /g, '_'));
    const set = await unary(client, 'Set', { key, value: sent });
    assert.match(set.version, /^[1-9][0-9]*$/, 'Set returns a non-zero version');
    assert.equal(set.expires_at, null, 'no expiry asked, none reported');

    const got = await unary(client, 'Get', { key });
    assert.equal(got.found, true);
    assert.equal(got.version, set.version);
    assert.equal(got.expires_at, null);
    // deepStrictEqual compares with Object.is: NaN equals NaN, -0 differs from 0.
    assert.deepEqual(got.value, expectedOut(sent, out));
  });
}

test('Get of an absent key: found false, no value, version 0', async () => {
  const got = await unary(client, 'Get', { key: uniqueKey('absent') });
  // from_backup and lag_ms: only a cluster's backup answering an allow_stale read sets them
  assert.deepEqual(got, { found: false, value: null, version: '0', expires_at: null, from_backup: false, lag_ms: '0' });
});

test('every write gets a new, larger version; overwrites replace the value', async () => {
  const key = uniqueKey('versions');
  const a = await unary(client, 'Set', { key, value: { string_value: 'a' } });
  const b = await unary(client, 'Set', { key, value: { int64_value: '7' } });
  assert.ok(BigInt(b.version) > BigInt(a.version), `${b.version} > ${a.version}`);
  const got = await unary(client, 'Get', { key });
  assert.deepEqual(got.value, { int64_value: '7', kind: 'int64_value' });
  assert.equal(got.version, b.version);
});

test('caches are separate namespaces; "" is the default cache', async () => {
  const key = uniqueKey('ns');
  await unary(client, 'Set', { cache: 'alpha', key, value: { string_value: 'in alpha' } });
  await unary(client, 'Set', { cache: 'beta.2_x-y', key, value: { string_value: 'in beta' } });
  assert.deepEqual((await unary(client, 'Get', { cache: 'alpha', key })).value,
    { string_value: 'in alpha', kind: 'string_value' });
  assert.deepEqual((await unary(client, 'Get', { cache: 'beta.2_x-y', key })).value,
    { string_value: 'in beta', kind: 'string_value' });
  assert.equal((await unary(client, 'Get', { key })).found, false, 'not in the default cache');
  assert.equal((await unary(client, 'Get', { cache: 'default', key })).found, false, '"default" is just a name');
  await unary(client, 'Set', { key, value: { bool_value: true } });
  assert.equal((await unary(client, 'Get', { cache: '', key })).found, true);
});

test('keys are opaque UTF-8: case, spaces and non-ASCII are distinct keys', async () => {
  const base = uniqueKey('Opaque');
  const keys = [base, base.toLowerCase(), `${base} `, `${base}/ü`, `${base}🔑`];
  for (const [i, key] of keys.entries()) {
    await unary(client, 'Set', { cache: 'opaque', key, value: { int64_value: String(i) } });
  }
  const many = await unary(client, 'GetMany', { cache: 'opaque', keys });
  assert.deepEqual(many.results.map((r) => [r.key, r.value.int64_value]), keys.map((k, i) => [k, String(i)]));
});

test('SetMany then GetMany: one result per key in request order', async () => {
  const k = [uniqueKey('many'), uniqueKey('many'), uniqueKey('many')];
  const values = [
    { bytes_value: Buffer.from('bin\0ary') },
    { int64_value: '-9223372036854775808' },
    { json_value: { fields: { a: { numberValue: 1 } } } },
  ];
  const set = await unary(client, 'SetMany', {
    cache: 'batch',
    entries: k.map((key, i) => ({ key, value: values[i] })),
  });
  assert.equal(set.results.length, 3);
  const versions = set.results.map((r) => BigInt(r.version));
  assert.equal(new Set(versions).size, 3, 'distinct versions');
  for (const v of versions) assert.ok(v > 0n);
  for (const r of set.results) assert.equal(r.expires_at, null);

  const missing = uniqueKey('missing');
  const got = await unary(client, 'GetMany', { cache: 'batch', keys: [k[2], missing, k[0], k[1]] });
  assert.deepEqual(got.results.map((r) => r.key), [k[2], missing, k[0], k[1]]);
  assert.deepEqual(got.results.map((r) => r.found), [true, false, true, true]);
  assert.deepEqual(got.results.map((r) => r.version),
    [set.results[2].version, '0', set.results[0].version, set.results[1].version]);
  assert.deepEqual(got.results[2].value, { bytes_value: Buffer.from('bin\0ary'), kind: 'bytes_value' });
  assert.deepEqual(got.results[3].value, { int64_value: '-9223372036854775808', kind: 'int64_value' });
  assert.deepEqual(got.results[0].value,
    { json_value: { fields: { a: { numberValue: 1, kind: 'numberValue' } } }, kind: 'json_value' });
  assert.equal(got.results[1].value, null);

  // The same keys are not in the default cache.
  const other = await unary(client, 'GetMany', { keys: k });
  assert.deepEqual(other.results.map((r) => r.found), [false, false, false]);
});

test('GetMany and SetMany accept empty batches', async () => {
  assert.deepEqual(await unary(client, 'GetMany', { keys: [] }), { results: [], from_backup: false, lag_ms: '0' });
  assert.deepEqual(await unary(client, 'SetMany', { entries: [] }), { results: [] });
});

test('SetMany is atomic: one failed condition applies no entry', async () => {
  const existing = uniqueKey('atomic');
  const fresh = uniqueKey('atomic');
  const v = await unary(client, 'Set', { key: existing, value: { string_value: 'old' } });
  const err = await rejects(unary(client, 'SetMany', {
    entries: [
      { key: fresh, value: { string_value: 'new' } },
      { key: existing, value: { string_value: 'new' }, if_version: String(BigInt(v.version) + 1000n) },
    ],
  }), grpc.status.FAILED_PRECONDITION);
  assertStatus(err, {
    code: grpc.status.FAILED_PRECONDITION,
    reason: 'VERSION_MISMATCH',
    metadata: { entryIndex: '1', currentVersion: v.version },
  });
  assert.equal((await unary(client, 'Get', { key: fresh })).found, false, 'the first entry was not applied');
  const still = await unary(client, 'Get', { key: existing });
  assert.equal(still.version, v.version);
  assert.equal(still.value.string_value, 'old');

  // With the right version every entry applies.
  const ok = await unary(client, 'SetMany', {
    entries: [
      { key: fresh, value: { string_value: 'new' }, if_version: '0' },
      { key: existing, value: { string_value: 'new' }, if_version: v.version },
    ],
  });
  assert.equal(ok.results.length, 2);
  const after = await unary(client, 'GetMany', { keys: [fresh, existing] });
  assert.deepEqual(after.results.map((r) => r.value.string_value), ['new', 'new']);
  assert.deepEqual(after.results.map((r) => r.version), ok.results.map((r) => r.version));
});
