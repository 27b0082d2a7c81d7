'use strict';
// Error details: google.rpc.Status from the grpc-status-details-bin trailer,
// decoded with protobufjs from proto/google/rpc/*.proto, with ErrorInfo
// (domain drey.dev, reason, metadata) and BadRequest field violations.

const assert = require('node:assert/strict');
const { test, before, after } = require('node:test');
const {
  startServer, cacheClient, unary, rejects, assertStatus, statusDetails, uniqueKey, grpc,
} = require('./drey');

const LIMITS = {
  valueBytes: 64,
  batch: 3,
  keyBytes: 16,
  cacheNameBytes: 8,
  recvMessageBytes: 4096,
};

const INVALID = grpc.status.INVALID_ARGUMENT;

let server;
let client;

before(async () => {
  server = await startServer([
    `--max-value-bytes=${LIMITS.valueBytes}`,
    `--max-batch=${LIMITS.batch}`,
    `--max-key-bytes=${LIMITS.keyBytes}`,
    `--max-cache-name-bytes=${LIMITS.cacheNameBytes}`,
    `--max-recv-message-bytes=${LIMITS.recvMessageBytes}`,
  ]);
  client = cacheClient(server);
});

after(async () => {
  if (client) client.close();
  if (server) await server.stop();
});

async function invalid(method, request, { reason, violations, metadata = {} }) {
  const err = await rejects(unary(client, method, request), INVALID);
  return assertStatus(err, { code: INVALID, reason, metadata, violations });
}

/** A short key unique within this process (max-key-bytes is 16 here). */
let n = 0;
function key() {
  n += 1;
  return `e${n}`;
}

test('INVALID_KEY: empty, too long, control characters, NUL', async () => {
  const bad = [
    '',
    'k'.repeat(LIMITS.keyBytes + 1),
    'é'.repeat(LIMITS.keyBytes / 2 + 1), // 9 characters, 18 bytes: the limit is in bytes
    'tab\there',
    'line\nbreak',
    'bell\u0007',
    'del\u007f',
    'c1\u0085', // U+0085 NEL, a C1 control
    'a\u0000b', // protobuf-c would cut this at the NUL; the wire pass must catch it
  ];
  for (const k of bad) {
    await invalid('Get', { key: k }, { reason: 'INVALID_KEY', violations: [{ field: 'key', reason: 'INVALID_KEY' }] });
  }
  // The limits themselves are fine.
  for (const k of ['k'.repeat(LIMITS.keyBytes), 'é'.repeat(LIMITS.keyBytes / 2), 'sp ace', '🔑']) {
    assert.equal((await unary(client, 'Get', { key: k })).found, false, JSON.stringify(k));
  }
});

test('INVALID_KEY in batches names each offending index', async () => {
  await invalid('GetMany', { keys: ['ok', '', 'x\ny'] }, {
    reason: 'INVALID_KEY',
    violations: [{ field: 'keys[1]', reason: 'INVALID_KEY' }, { field: 'keys[2]', reason: 'INVALID_KEY' }],
  });
  await invalid('SetMany', {
    entries: [
      { key: key(), value: { bool_value: true } },
      { key: '', value: { bool_value: true } },
    ],
  }, { reason: 'INVALID_KEY', violations: [{ field: 'entries[1].key', reason: 'INVALID_KEY' }] });
});

test('INVALID_CACHE_NAME: outside [A-Za-z0-9._-], . and .., too long', async () => {
  for (const cache of ['bad name', '.', '..', 'a/b', 'ü', 'x:y', 'c'.repeat(LIMITS.cacheNameBytes + 1)]) {
    await invalid('Get', { cache, key: 'k' }, {
      reason: 'INVALID_CACHE_NAME',
      violations: [{ field: 'cache', reason: 'INVALID_CACHE_NAME' }],
    });
    await invalid('Set', { cache, key: 'k', value: { bool_value: true } }, {
      reason: 'INVALID_CACHE_NAME',
      violations: [{ field: 'cache', reason: 'INVALID_CACHE_NAME' }],
    });
  }
  for (const cache of ['c'.repeat(LIMITS.cacheNameBytes), '...', 'A-b_c.9']) {
    assert.equal((await unary(client, 'Get', { cache, key: 'k' })).found, false, cache);
  }
});

test('several violations are all listed; the reason is the first one', async () => {
  await invalid('Get', { cache: 'no way', key: '' }, {
    reason: 'INVALID_CACHE_NAME',
    violations: [{ field: 'cache', reason: 'INVALID_CACHE_NAME' }, { field: 'key', reason: 'INVALID_KEY' }],
  });
});

test('BATCH_TOO_LARGE: more than --max-batch keys or entries', async () => {
  const keys = Array.from({ length: LIMITS.batch + 1 }, key);
  await invalid('GetMany', { keys }, {
    reason: 'BATCH_TOO_LARGE',
    metadata: { limitItems: String(LIMITS.batch) },
    violations: [{ field: 'keys', reason: 'BATCH_TOO_LARGE' }],
  });
  await invalid('SetMany', { entries: keys.map((k) => ({ key: k, value: { int64_value: '1' } })) }, {
    reason: 'BATCH_TOO_LARGE',
    metadata: { limitItems: String(LIMITS.batch) },
    violations: [{ field: 'entries', reason: 'BATCH_TOO_LARGE' }],
  });
  assert.deepEqual((await unary(client, 'GetMany', { keys: keys.slice(0, LIMITS.batch) }))
    .results.map((r) => r.found), [false, false, false], 'the rejected SetMany stored nothing');
  const ok = await unary(client, 'SetMany', {
    entries: keys.slice(0, LIMITS.batch).map((k) => ({ key: k, value: { int64_value: '1' } })),
  });
  assert.equal(ok.results.length, LIMITS.batch, 'exactly --max-batch is fine');
});

test('PAYLOAD_TOO_LARGE: a value over --max-value-bytes, counted in bytes', async () => {
  const tooLarge = {
    reason: 'PAYLOAD_TOO_LARGE',
    metadata: { limitBytes: String(LIMITS.valueBytes) },
    violations: [{ field: 'value', reason: 'PAYLOAD_TOO_LARGE' }],
  };
  const k = key();
  await invalid('Set', { key: k, value: { string_value: 's'.repeat(LIMITS.valueBytes + 1) } }, tooLarge);
  await invalid('Set', { key: k, value: { string_value: 'é'.repeat(LIMITS.valueBytes / 2 + 1) } }, tooLarge);
  await invalid('Set', { key: k, value: { bytes_value: Buffer.alloc(LIMITS.valueBytes + 1, 7) } }, tooLarge);
  await invalid('Add', { key: k, value: { bytes_value: Buffer.alloc(LIMITS.valueBytes + 1) } }, tooLarge);
  await invalid('GetOrAdd', { key: k, value: { bytes_value: Buffer.alloc(LIMITS.valueBytes + 1) } }, tooLarge);
  await invalid('Update', { key: k, value: { bytes_value: Buffer.alloc(LIMITS.valueBytes + 1) } }, tooLarge);
  await invalid('Set', {
    key: k,
    value: { json_value: { fields: { text: { stringValue: 'j'.repeat(LIMITS.valueBytes) } } } },
  }, tooLarge);
  assert.equal((await unary(client, 'Get', { key: k })).found, false, 'nothing was stored');

  await invalid('SetMany', {
    entries: [
      { key: key(), value: { string_value: 'small' } },
      { key: key(), value: { string_value: 'x'.repeat(LIMITS.valueBytes + 1) } },
    ],
  }, { ...tooLarge, violations: [{ field: 'entries[1].value', reason: 'PAYLOAD_TOO_LARGE' }] });

  const atLimit = await unary(client, 'Set', { key: k, value: { string_value: 's'.repeat(LIMITS.valueBytes) } });
  assert.match(atLimit.version, /^[1-9]/, 'exactly --max-value-bytes is fine');
});

test('INVALID_VALUE: no value, or a value with no kind', async () => {
  const violations = [{ field: 'value', reason: 'INVALID_VALUE' }];
  await invalid('Set', { key: key() }, { reason: 'INVALID_VALUE', violations });
  await invalid('Set', { key: key(), value: {} }, { reason: 'INVALID_VALUE', violations });
  await invalid('Add', { key: key(), value: {} }, { reason: 'INVALID_VALUE', violations });
});

test('INVALID_EXPIRATION: non-positive or unnormalized durations and timestamps', async () => {
  const ttlBad = { reason: 'INVALID_EXPIRATION', violations: [{ field: 'ttl', reason: 'INVALID_EXPIRATION' }] };
  const v = { string_value: 'x' };
  await invalid('Set', { key: key(), value: v, ttl: { seconds: '0', nanos: 0 } }, ttlBad);
  await invalid('Set', { key: key(), value: v, ttl: { seconds: '-5', nanos: 0 } }, ttlBad);
  await invalid('Set', { key: key(), value: v, ttl: { seconds: '1', nanos: 1e9 } }, ttlBad);
  await invalid('Touch', { key: key() }, ttlBad);
  await invalid('Touch', { key: key(), ttl: { seconds: '0', nanos: -1 } }, ttlBad);
  await invalid('Set', { key: key(), value: v, expires_at: { seconds: '1', nanos: -1 } }, {
    reason: 'INVALID_EXPIRATION',
    violations: [{ field: 'expires_at', reason: 'INVALID_EXPIRATION' }],
  });
});

test('INVALID_REQUEST_ID: longer than 128 bytes', async () => {
  await invalid('Set', { key: key(), value: { bool_value: true }, request_id: 'r'.repeat(129) }, {
    reason: 'INVALID_REQUEST_ID',
    violations: [{ field: 'request_id', reason: 'INVALID_REQUEST_ID' }],
  });
  await unary(client, 'Set', { key: key(), value: { bool_value: true }, request_id: 'r'.repeat(128) });
});

test('DUPLICATE_KEY: a batch naming a key twice', async () => {
  const a = key();
  const b = key();
  await invalid('SetMany', {
    entries: [
      { key: a, value: { int64_value: '1' } },
      { key: b, value: { int64_value: '2' } },
      { key: a, value: { int64_value: '3' } },
    ],
  }, { reason: 'DUPLICATE_KEY', violations: [{ field: 'entries[2].key', reason: 'DUPLICATE_KEY' }] });
});

test('VERSION_MISMATCH: FAILED_PRECONDITION with currentVersion, no BadRequest', async () => {
  const k = key();
  const set = await unary(client, 'Set', { key: k, value: { int64_value: '1' } });
  const err = await rejects(unary(client, 'Set', {
    key: k, value: { int64_value: '2' }, if_version: String(BigInt(set.version) + 1n),
  }), grpc.status.FAILED_PRECONDITION);
  const st = assertStatus(err, {
    code: grpc.status.FAILED_PRECONDITION,
    reason: 'VERSION_MISMATCH',
    metadata: { currentVersion: set.version },
  });
  assert.deepEqual(st.details.map((d) => d.type), ['google.rpc.ErrorInfo']);

  const absent = await rejects(unary(client, 'Remove', { key: key(), if_version: set.version }),
    grpc.status.FAILED_PRECONDITION);
  assertStatus(absent, {
    code: grpc.status.FAILED_PRECONDITION,
    reason: 'VERSION_MISMATCH',
    metadata: { currentVersion: '0' },
  });
});

test('MALFORMED_REQUEST: bytes that are not a GetRequest', async () => {
  const err = await new Promise((resolve, reject) => {
    client.makeUnaryRequest('/drey.cache.v1.Cache/Get', (b) => b, (b) => b,
      Buffer.from([0x12, 0x05, 0x61]), // field 2 (key), length 5, one byte of data
      new grpc.Metadata(), { deadline: Date.now() + 15000 },
      (e, res) => (e ? resolve(e) : reject(new Error(`unexpected success: ${res && res.toString('hex')}`))));
  });
  assertStatus(err, { code: INVALID, reason: 'MALFORMED_REQUEST', metadata: {} });
});

test('messages are fixed sentences and never echo what the client sent', async () => {
  const marker = 'MARKER4f2a';
  const errs = [
    await rejects(unary(client, 'Get', { key: `${marker}\n` }), INVALID),
    await rejects(unary(client, 'Get', { cache: `${marker}!`, key: 'k' }), INVALID),
    await rejects(unary(client, 'Set', { key: 'k', value: { string_value: marker.repeat(10) } }), INVALID),
  ];
  for (const err of errs) {
    assert.ok(!err.details.includes(marker), err.details);
    const st = statusDetails(err);
    assert.ok(!JSON.stringify(st).includes(marker), JSON.stringify(st));
    assert.ok(!err.metadata.get('grpc-status-details-bin')[0].includes(marker));
  }
});

test('a request over --max-recv-message-bytes is RESOURCE_EXHAUSTED from the transport, without details', async () => {
  const err = await rejects(unary(client, 'Set', {
    key: key(), value: { bytes_value: Buffer.alloc(LIMITS.recvMessageBytes + 100) },
  }), grpc.status.RESOURCE_EXHAUSTED);
  assert.deepEqual(err.metadata.get('grpc-status-details-bin'), []);
  // The server is still fine afterwards.
  assert.equal((await unary(client, 'Get', { key: key() })).found, false);
});
