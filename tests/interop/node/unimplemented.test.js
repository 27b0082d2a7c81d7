'use strict';
// Methods and services the server does not have: UNIMPLEMENTED with an
// ErrorInfo, and the server keeps serving.

const assert = require('node:assert/strict');
const { test, before, after } = require('node:test');
const { startServer, cacheClient, unary, assertStatus, uniqueKey, grpc } = require('./drey');

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

/** A unary call on an arbitrary path with raw bytes; resolves to the error. */
function rawCallError(path, body = Buffer.alloc(0)) {
  return new Promise((resolve, reject) => {
    client.makeUnaryRequest(path, (b) => b, (b) => b, body, new grpc.Metadata(),
      { deadline: Date.now() + 15000 },
      (err, res) => (err ? resolve(err) : reject(new Error(`${path} succeeded: ${res && res.toString('hex')}`))));
  });
}

for (const path of [
  '/drey.cache.v1.Cache/Frobnicate', // a made-up method of a real service
  '/drey.cache.v1.Cache/get', // method names are case-sensitive
  '/drey.cache.v2.Cache/Get', // a service that does not exist
  '/grpc.health.v1.Health/List',
]) {
  test(`unknown method ${path}: UNIMPLEMENTED, UNKNOWN_METHOD`, async () => {
    const err = await rawCallError(path, Buffer.from([0x12, 0x01, 0x6b])); // a valid GetRequest{key:"k"}
    assertStatus(err, { code: grpc.status.UNIMPLEMENTED, reason: 'UNKNOWN_METHOD', metadata: {} });
  });
}

test('the server keeps serving after unknown methods', async () => {
  for (let i = 0; i < 5; i++) {
    const err = await rawCallError(`/drey.cache.v1.Cache/Nope${i}`);
    assert.equal(err.code, grpc.status.UNIMPLEMENTED);
  }
  const key = uniqueKey('after');
  const set = await unary(client, 'Set', { key, value: { string_value: 'ok' } });
  assert.equal((await unary(client, 'Get', { key })).version, set.version);
});
