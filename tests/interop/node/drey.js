'use strict';
// Shared helpers of the Node.js interop tests: start and stop the real dreyd,
// make @grpc/grpc-js clients from the .proto files with @grpc/proto-loader,
// and decode google.rpc.Status from the grpc-status-details-bin trailer.
//
// Environment (set by run.sh):
//   DREY_BIN        absolute path of dreyd
//   DREY_PROTO_DIR  real path of the repository's proto/ directory

const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { setTimeout: delay } = require('node:timers/promises');

const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const protobuf = require('protobufjs');

const PROTO_DIR = process.env.DREY_PROTO_DIR || path.resolve(__dirname, '..', '..', '..', 'proto');
// Repository protos, google/protobuf well-known types, grpc/health/v1.
const INCLUDE_DIRS = [PROTO_DIR, '/usr/include', '/usr/share/grpc-proto'];
const LOADER_OPTIONS = {
  keepCase: true,
  longs: String,
  enums: String,
  defaults: true,
  oneofs: true,
  includeDirs: INCLUDE_DIRS,
};

// Generous: dreyd under ASan on a busy 2-core machine starts slowly.
const START_TIMEOUT_MS = 30000;
const STOP_TIMEOUT_MS = 30000;
const CALL_DEADLINE_MS = 15000;

function dreyBin() {
  const bin = process.env.DREY_BIN;
  assert.ok(bin, 'DREY_BIN is not set (run the tests through run.sh)');
  return bin;
}

function tmpBase() {
  return process.env.TEST_TMPDIR || os.tmpdir();
}

let api;
/** The loaded gRPC package tree: api.drey.cache.v1.Cache, api.grpc.health.v1.Health. */
function loadApi() {
  if (!api) {
    const def = protoLoader.loadSync(['drey/cache/v1/cache.proto', 'grpc/health/v1/health.proto'], LOADER_OPTIONS);
    api = grpc.loadPackageDefinition(def);
  }
  return api;
}

const running = new Set();
process.on('exit', () => {
  // A test that failed before stopping its server must not leave it behind.
  for (const child of running) child.kill('SIGKILL');
});

function parseLogLines(text) {
  const out = [];
  for (const line of text.split('\n')) {
    if (!line.trim()) continue;
    try {
      out.push(JSON.parse(line));
    } catch {
      // Not every stderr line need be JSON (e.g. sanitizer reports).
    }
  }
  return out;
}

/**
 * Starts dreyd on 127.0.0.1 with a kernel-chosen port and waits, polling its
 * stderr with a deadline, for the "listening" log line that names the port,
 * then for Health/Check("") to say SERVING: a
 * durable node listens, and answers NOT_SERVING, while it still recovers.
 * extraArgs are added to the command line; --drain-grace defaults to 0s so
 * that stop() is quick, and the data directory to a fresh one of its own,
 * unless extraArgs set them.
 */
async function startServer(extraArgs = []) {
  const dir = fs.mkdtempSync(path.join(tmpBase(), 'dreyd-'));
  const logPath = path.join(dir, 'stderr.log');
  // The ops listener's default port (9090) is shared by every server: each
  // test server takes a free one.
  const args = ['--listen=127.0.0.1:0', '--ops-listen=127.0.0.1:0'];
  if (!extraArgs.some((a) => a.startsWith('--drain-grace'))) args.push('--drain-grace=0s');
  if (!extraArgs.some((a) => a.startsWith('--data-dir') || a.startsWith('--ephemeral')))
    args.push(`--data-dir=${path.join(dir, 'data')}`);
  args.push(...extraArgs);

  const fd = fs.openSync(logPath, 'w');
  const child = spawn(dreyBin(), args, { stdio: ['ignore', 'ignore', fd] });
  fs.closeSync(fd);
  running.add(child);
  const exited = new Promise((resolve) => {
    child.once('exit', (code, signal) => {
      running.delete(child);
      resolve({ code, signal });
    });
    child.once('error', (error) => {
      running.delete(child);
      resolve({ code: null, signal: null, error });
    });
  });
  let exit = null;
  exited.then((e) => {
    exit = e;
  });

  let finalLog = null; // kept once the process exited 0 and its temp dir is gone
  const readLog = () => (finalLog !== null ? finalLog : fs.readFileSync(logPath, 'utf8'));
  const deadline = Date.now() + START_TIMEOUT_MS;
  let port = 0;
  for (;;) {
    const listening = parseLogLines(readLog()).find((l) => l.msg === 'listening');
    if (listening) {
      assert.ok(Number.isInteger(listening.port) && listening.port > 0 && listening.port < 65536,
        `"listening" log line without a valid port: ${JSON.stringify(listening)}`);
      port = listening.port;
      break;
    }
    if (exit) {
      assert.fail(`dreyd ${args.join(' ')} exited before listening: ${JSON.stringify(exit)}\n${readLog()}`);
    }
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      assert.fail(`dreyd did not log "listening" within ${START_TIMEOUT_MS} ms\n${readLog()}`);
    }
    await Promise.race([delay(10), exited]);
  }
  await waitServing(`127.0.0.1:${port}`, deadline, () => exit, readLog);

  const server = {
    args,
    port,
    address: `127.0.0.1:${port}`,
    child,
    pid: child.pid,
    logPath,
    exited,
    get exit() {
      return exit;
    },
    log: readLog,
    logLines: () => parseLogLines(readLog()),
    signal(sig = 'SIGTERM') {
      assert.ok(child.kill(sig), `could not send ${sig} to dreyd ${child.pid}`);
    },
    /** Waits for the process to end and asserts it exited 0; returns its log. */
    async waitExit0(timeoutMs = STOP_TIMEOUT_MS) {
      // unref'd: a pending timer must not keep the test process alive.
      const timer = delay(timeoutMs, 'timeout', { ref: false });
      const r = await Promise.race([exited, timer]);
      if (r === 'timeout') {
        child.kill('SIGKILL');
        assert.fail(`dreyd ${child.pid} did not exit within ${timeoutMs} ms\n${readLog()}`);
      }
      const log = readLog();
      assert.deepEqual({ code: r.code, signal: r.signal }, { code: 0, signal: null }, `dreyd did not exit 0\n${log}`);
      finalLog = log;
      fs.rmSync(dir, { recursive: true, force: true });
      return log;
    },
    /**
     * Ends the process whatever state a (possibly failed) test left it in:
     * SIGTERM until dreyd has logged "draining", then one more, which ends
     * a drain grace however long; then waitExit0(). Signals are not queued,
     * so the second is sent only once the first has been taken.
     */
    async stop() {
      const draining = () => parseLogLines(readLog()).some((l) => l.msg === 'draining');
      if (!exit && !draining()) {
        child.kill('SIGTERM');
        const end = Date.now() + STOP_TIMEOUT_MS;
        while (!exit && !draining() && Date.now() < end) await Promise.race([delay(10), exited]);
      }
      if (!exit) child.kill('SIGTERM');
      return server.waitExit0();
    },
  };
  return server;
}

async function waitServing(address, deadlineMs, exitOf, readLog) {
  const health = healthClient({ address });
  try {
    let last;
    for (;;) {
      try {
        last = (await unary(health, 'Check', { service: '' }, Math.max(deadlineMs - Date.now(), 1))).status;
        if (last === 'SERVING') return;
      } catch (err) {
        last = `${grpc.status[err.code]} (${err.details})`;
      }
      if (exitOf()) assert.fail(`dreyd exited while recovering: ${JSON.stringify(exitOf())}\n${readLog()}`);
      if (Date.now() > deadlineMs) assert.fail(`dreyd not SERVING within ${START_TIMEOUT_MS} ms (last: ${last})\n${readLog()}`);
      await delay(10);
    }
  } finally {
    health.close();
  }
}

function cacheClient(server) {
  const { Cache } = loadApi().drey.cache.v1;
  return new Cache(server.address, grpc.credentials.createInsecure());
}

function healthClient(server) {
  const { Health } = loadApi().grpc.health.v1;
  return new Health(server.address, grpc.credentials.createInsecure());
}

function deadline(ms = CALL_DEADLINE_MS) {
  return Date.now() + ms;
}

/** A unary call as a promise; rejects with the grpc-js ServiceError. */
function unary(client, method, request, deadlineMs = CALL_DEADLINE_MS) {
  assert.equal(typeof client[method], 'function', `no method ${method}`);
  return new Promise((resolve, reject) => {
    client[method](request, new grpc.Metadata(), { deadline: deadline(deadlineMs) }, (err, res) => {
      if (err) reject(err);
      else resolve(res);
    });
  });
}

/** Awaits a call that must fail; returns the error after checking its code. */
async function rejects(promise, code) {
  let res;
  try {
    res = await promise;
  } catch (err) {
    assert.ok(err instanceof Error, `rejected with a non-Error: ${err}`);
    assert.equal(err.code, code,
      `expected status ${grpc.status[code]}, got ${grpc.status[err.code]} (${err.details})`);
    return err;
  }
  assert.fail(`expected status ${grpc.status[code]}, but the call succeeded: ${JSON.stringify(res)}`);
}

let rpcRoot;
/** protobufjs types of google/rpc/status.proto and error_details.proto. */
function rpcTypes() {
  if (!rpcRoot) {
    const root = new protobuf.Root();
    root.resolvePath = (origin, target) => {
      for (const dir of INCLUDE_DIRS) {
        const candidate = path.join(dir, target);
        if (fs.existsSync(candidate)) return candidate;
      }
      return protobuf.util.path.resolve(origin, target);
    };
    root.loadSync(['google/rpc/status.proto', 'google/rpc/error_details.proto'], { keepCase: true });
    root.resolveAll();
    rpcRoot = root;
  }
  return rpcRoot;
}

const TYPE_URL_PREFIX = 'type.googleapis.com/';
const TO_OBJECT = { longs: String, enums: String, bytes: Buffer, defaults: true, arrays: true, objects: true };

/**
 * Decodes the grpc-status-details-bin trailer of a failed call into
 * { code, message, details: [{ type, value }], errorInfo, badRequest }.
 */
function statusDetails(err) {
  assert.ok(err.metadata, 'the error has no metadata');
  const bins = err.metadata.get('grpc-status-details-bin');
  assert.equal(bins.length, 1, 'expected one grpc-status-details-bin trailer');
  assert.ok(Buffer.isBuffer(bins[0]), 'grpc-status-details-bin is not a Buffer');
  const root = rpcTypes();
  const Status = root.lookupType('google.rpc.Status');
  const st = Status.decode(bins[0]);
  const details = st.details.map((any) => {
    assert.ok(any.type_url.startsWith(TYPE_URL_PREFIX), `unexpected type_url ${any.type_url}`);
    const type = any.type_url.slice(TYPE_URL_PREFIX.length);
    const T = root.lookupType(type);
    return { type, value: T.toObject(T.decode(any.value), TO_OBJECT) };
  });
  const only = (type) => {
    const found = details.filter((d) => d.type === type);
    assert.ok(found.length <= 1, `more than one ${type} in the details`);
    return found.length ? found[0].value : null;
  };
  return {
    code: st.code,
    message: st.message,
    details,
    errorInfo: only('google.rpc.ErrorInfo'),
    badRequest: only('google.rpc.BadRequest'),
  };
}

/**
 * Asserts the full error contract of a failed call: the gRPC code, a
 * google.rpc.Status with the same code and message, an ErrorInfo of domain
 * drey.dev with `reason` (and exactly `metadata` when given), and, when
 * `violations` is given, a BadRequest with exactly those {field, reason}
 * (each with a description), else no BadRequest at all.
 */
function assertStatus(err, { code, reason, metadata, violations }) {
  assert.equal(err.code, code, `expected ${grpc.status[code]}, got ${grpc.status[err.code]} (${err.details})`);
  const st = statusDetails(err);
  assert.equal(st.code, code, 'google.rpc.Status.code differs from the gRPC status');
  assert.equal(st.message, err.details, 'google.rpc.Status.message differs from grpc-message');
  assert.ok(st.message.length > 0, 'empty status message');
  assert.ok(st.errorInfo, `no ErrorInfo in ${JSON.stringify(st.details.map((d) => d.type))}`);
  assert.equal(st.errorInfo.domain, 'drey.dev');
  assert.equal(st.errorInfo.reason, reason);
  if (metadata !== undefined) assert.deepEqual(st.errorInfo.metadata, metadata);
  if (violations !== undefined) {
    assert.ok(st.badRequest, 'no BadRequest in the details');
    for (const v of st.badRequest.field_violations) {
      assert.ok(v.description.length > 0, `field violation without description: ${JSON.stringify(v)}`);
    }
    assert.deepEqual(st.badRequest.field_violations.map(({ field, reason: r }) => ({ field, reason: r })), violations);
  } else {
    assert.equal(st.badRequest, null, `unexpected BadRequest ${JSON.stringify(st.badRequest)}`);
  }
  return st;
}

/**
 * Polls `probe` (async, returns a value) until `done(value)` holds or the
 * deadline passes; returns the last value. The pause between probes only
 * paces the polling: the condition itself is what is waited for.
 */
async function pollUntil(probe, done, { timeoutMs = 15000, intervalMs = 20, what = 'condition' } = {}) {
  const end = Date.now() + timeoutMs;
  let last;
  for (;;) {
    last = await probe();
    if (done(last)) return last;
    if (Date.now() > end) assert.fail(`${what} not reached within ${timeoutMs} ms; last: ${JSON.stringify(last)}`);
    await delay(intervalMs);
  }
}

/** Milliseconds since the epoch of a google.protobuf.Timestamp object (seconds as string). */
function timestampMs(ts) {
  assert.ok(ts, 'missing timestamp');
  return Number(ts.seconds) * 1000 + Math.floor(ts.nanos / 1e6);
}

/** Milliseconds of a google.protobuf.Duration object (seconds as string). */
function durationMs(d) {
  assert.ok(d, 'missing duration');
  return Number(d.seconds) * 1000 + d.nanos / 1e6;
}

let seq = 0;
/** A key unique within this process. */
function uniqueKey(prefix = 'k') {
  seq += 1;
  return `${prefix}-${process.pid}-${seq}`;
}

module.exports = {
  grpc,
  protobuf,
  PROTO_DIR,
  INCLUDE_DIRS,
  LOADER_OPTIONS,
  loadApi,
  startServer,
  cacheClient,
  healthClient,
  deadline,
  unary,
  rejects,
  rpcTypes,
  statusDetails,
  assertStatus,
  pollUntil,
  timestampMs,
  durationMs,
  uniqueKey,
};
