'use strict';
// --authz-policy from @grpc/grpc-js: HS256 tokens signed here; NOT_PERMITTED
// with verb, cache and method and nothing of the request; GetMany refused
// whole; each Pipeline operation checked as it runs (a refused one fails
// alone, the stream goes on); a Watch of a prefix the caller may watch,
// refused for the whole cache; a policy reload taking effect; and a
// tenant's write past its quota refused TENANT_MEMORY_QUOTA.

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { test, before, after } = require('node:test');
const {
  startServer, cacheClient, rejects, assertStatus, statusDetails, rpcTypes, pollUntil, uniqueKey, grpc,
} = require('./drey');

const SECRET = Buffer.from('node-interop-secret-of-32-bytes!!');
const POLICY = {
  roles: {
    app: [{ caches: ['app'], keys: ['ok:*'], verbs: ['read', 'write', 'delete', 'watch'] }],
  },
  bindings: [{ claim: 'groups', contains: 'apps', roles: ['app'] }],
  tenants: { claim: 'tenant', maxBytes: { acme: 3000 } },
};

let dir;
let server;
let client;

const b64 = (buf) => Buffer.from(buf).toString('base64url');

function token(claims) {
  const header = b64(JSON.stringify({ alg: 'HS256', kid: 'k1', typ: 'JWT' }));
  const body = b64(JSON.stringify({ ...claims, exp: Math.floor(Date.now() / 1000) + 3600 }));
  const sig = crypto.createHmac('sha256', SECRET).update(`${header}.${body}`).digest();
  return `${header}.${body}.${b64(sig)}`;
}

const APP = token({ sub: 'node-app', groups: ['apps'], tenant: 'acme' });

function md(tok = APP) {
  const m = new grpc.Metadata();
  m.set('authorization', `Bearer ${tok}`);
  return m;
}

function call(method, request, tok = APP) {
  return new Promise((resolve, reject) => {
    client[method](request, md(tok), { deadline: Date.now() + 15000 }, (err, res) => (err ? reject(err) : resolve(res)));
  });
}

function writePolicy(policy) {
  const tmp = path.join(dir, 'policy.json.tmp');
  fs.writeFileSync(tmp, JSON.stringify(policy));
  fs.renameSync(tmp, path.join(dir, 'policy.json'));
}

before(async () => {
  dir = fs.mkdtempSync(path.join(process.env.TEST_TMPDIR || os.tmpdir(), 'drey-authz-'));
  fs.mkdirSync(path.join(dir, 'keys'));
  fs.writeFileSync(path.join(dir, 'keys', 'k1.HS256.key'), SECRET);
  writePolicy(POLICY);
  server = await startServer(['--ephemeral', `--jwt-keys-dir=${path.join(dir, 'keys')}`,
    `--authz-policy=${path.join(dir, 'policy.json')}`, '--authz-reload-interval=20ms']);
  client = cacheClient(server);
});

after(async () => {
  if (client) client.close();
  if (server) await server.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

const str = (s) => ({ string_value: s });

test('a call the grants do not cover is NOT_PERMITTED and echoes nothing', async () => {
  await call('Set', { cache: 'app', key: 'ok:1', value: str('v') });
  const err = await rejects(call('Set', { cache: 'app', key: 'no:SECRET', value: str('VALUE') }),
    grpc.status.PERMISSION_DENIED);
  const st = assertStatus(err, {
    code: grpc.status.PERMISSION_DENIED, reason: 'NOT_PERMITTED',
    metadata: { verb: 'write', cache: 'app', method: '/drey.cache.v1.Cache/Set' },
  });
  assert.ok(!JSON.stringify(st).includes('SECRET') && !err.details.includes('SECRET'));
  await rejects(call('Get', { cache: 'other', key: 'ok:1' }), grpc.status.PERMISSION_DENIED);
  await rejects(call('Get', { cache: 'app', key: 'ok:1' }, token({ sub: 'nobody' })), grpc.status.PERMISSION_DENIED);
});

test('GetMany is refused whole', async () => {
  const err = await rejects(call('GetMany', { cache: 'app', keys: ['ok:1', 'no:1'] }), grpc.status.PERMISSION_DENIED);
  assert.equal(statusDetails(err).errorInfo.metadata.verb, 'read');
  const res = await call('GetMany', { cache: 'app', keys: ['ok:1', 'ok:2'] });
  assert.deepEqual(res.results.map((r) => r.found), [true, false]);
});

test('each Pipeline operation is checked as it runs; the stream goes on', async () => {
  const ops = [
    { id: 1, set: { cache: 'app', key: 'ok:p', value: str('a') } },
    { id: 2, set: { cache: 'app', key: 'no:p', value: str('a') } },
    { id: 3, get: { cache: 'app', key: 'ok:p' } },
  ];
  const results = await new Promise((resolve, reject) => {
    const got = [];
    const stream = client.Pipeline(md(), { deadline: Date.now() + 15000 });
    stream.on('data', (r) => got.push(...r.results));
    stream.on('error', reject);
    stream.on('end', () => resolve(got));
    stream.write({ operations: ops });
    stream.end();
  });
  assert.deepEqual(results.map((r) => String(r.id)), ['1', '2', '3']);
  assert.equal(results[1].status.code, grpc.status.PERMISSION_DENIED);
  const ErrorInfo = rpcTypes().lookupType('google.rpc.ErrorInfo');
  const ei = ErrorInfo.decode(results[1].status.details[0].value);
  assert.equal(ei.reason, 'NOT_PERMITTED');
  assert.equal(results[2].get.found, true);
});

test('Watch: a prefix granted works, the whole cache is refused', async () => {
  const first = (request) => new Promise((resolve, reject) => {
    const s = client.Watch(request, md(), { deadline: Date.now() + 15000 });
    s.on('data', (ev) => {
      resolve(ev);
      s.cancel();
    });
    s.on('error', (err) => (err.code === grpc.status.CANCELLED ? null : reject(err)));
  });
  assert.equal((await first({ cache: 'app', prefix: 'ok:' })).kind, 'WATCHING');
  const err = await rejects(first({ cache: 'app' }), grpc.status.PERMISSION_DENIED);
  assert.equal(statusDetails(err).errorInfo.metadata.verb, 'watch');
});

test('a reloaded policy takes effect', async () => {
  await rejects(call('Remove', { cache: 'other', key: 'k' }), grpc.status.PERMISSION_DENIED);
  const more = structuredClone(POLICY);
  more.roles.app.push({ caches: ['other'], keys: ['*'], verbs: ['delete'] });
  writePolicy(more);
  await pollUntil(() => call('Remove', { cache: 'other', key: 'k' }).then(() => true, () => false), (ok) => ok,
    { what: 'the reloaded policy' });
  writePolicy(POLICY);
  await pollUntil(() => call('Remove', { cache: 'other', key: 'k' }).then(() => false, () => true), (ok) => ok,
    { what: 'the original policy back' });
});

test('a write past its tenant\'s quota is refused with the quota details', async () => {
  let err = null;
  for (let i = 0; i < 50 && !err; i += 1) {
    try {
      await call('Set', { cache: 'app', key: uniqueKey('ok:q'), value: str('x'.repeat(400)) });
    } catch (e) {
      err = e;
    }
  }
  assert.ok(err, 'never refused');
  const st = assertStatus(err, { code: grpc.status.RESOURCE_EXHAUSTED, reason: 'TENANT_MEMORY_QUOTA' });
  assert.equal(st.errorInfo.metadata.limitBytes, '3000');
  const qf = st.details.find((d) => d.type === 'google.rpc.QuotaFailure').value;
  assert.equal(qf.violations[0].subject, 'tenant:acme');
  assert.ok(st.details.some((d) => d.type === 'google.rpc.RetryInfo'));
});
