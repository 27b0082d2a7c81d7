// Validates deploy/k8s/*.yaml against the Kubernetes schemas (kubernetes-models,
// offline) and checks the invariants drey's drain depends on.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, readdirSync, realpathSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseAllDocuments } from 'yaml';
import { Service } from 'kubernetes-models/v1';
import { StatefulSet } from 'kubernetes-models/apps/v1';

const here = dirname(realpathSync(fileURLToPath(import.meta.url)));
const k8sDir = process.env.DREY_K8S_DIR ?? join(here, '..', '..', 'deploy', 'k8s');
const models = { 'v1/Service': Service, 'apps/v1/StatefulSet': StatefulSet };

function documents() {
  const docs = [];
  for (const f of readdirSync(k8sDir).filter((f) => f.endsWith('.yaml'))) {
    for (const d of parseAllDocuments(readFileSync(join(k8sDir, f), 'utf8'))) {
      assert.equal(d.errors.length, 0, `${f}: ${d.errors}`);
      docs.push({ file: f, obj: d.toJS() });
    }
  }
  return docs;
}

function durationSeconds(s) {
  const m = /^(\d+)(ms|s|m)$/.exec(s);
  assert.ok(m, `duration ${s}`);
  return Number(m[1]) / { ms: 1000, s: 1, m: 1 / 60 }[m[2]];
}

test('every manifest validates against its Kubernetes schema', () => {
  const docs = documents();
  assert.ok(docs.length >= 3);
  for (const { file, obj } of docs) {
    const Model = models[`${obj.apiVersion}/${obj.kind}`];
    assert.ok(Model, `${file}: no schema wired for ${obj.apiVersion}/${obj.kind}`);
    new Model(obj).validate(); // throws with the schema violation
  }
});

test('a broken manifest is rejected (the validation can fail)', () => {
  const sts = documents().find((d) => d.obj.kind === 'StatefulSet').obj;
  const broken = structuredClone(sts);
  broken.spec.replicas = 'one';
  assert.throws(() => new StatefulSet(broken).validate());
});

test('probes, ports and grace periods fit drey', () => {
  const docs = documents();
  const sts = docs.find((d) => d.obj.kind === 'StatefulSet').obj;
  const pod = sts.spec.template.spec;
  const c = pod.containers.find((x) => x.name === 'dreyd');
  const grpcPort = c.ports.find((p) => p.name === 'grpc').containerPort;
  const opsPort = c.ports.find((p) => p.name === 'ops').containerPort;
  assert.ok(c.args.includes(`--listen=0.0.0.0:${grpcPort}`));
  assert.ok(c.args.includes(`--ops-listen=0.0.0.0:${opsPort}`));
  // A non-loopback listener needs token keys (dreyd refuses to start otherwise).
  const keysArg = c.args.find((a) => a.startsWith('--jwt-keys-dir='));
  assert.ok(keysArg, 'JWT keys configured');
  const keysDir = keysArg.split('=')[1];
  assert.ok(c.volumeMounts.some((m) => m.mountPath === keysDir), 'the keys directory is mounted');
  assert.ok(!c.args.some((a) => a.startsWith('--insecure')), 'no insecure flags in the shipped manifest');
  assert.equal(c.startupProbe.grpc.port, grpcPort);
  assert.equal(c.readinessProbe.httpGet.path, '/health/ready');
  assert.equal(c.readinessProbe.httpGet.port, 'ops');
  assert.equal(c.livenessProbe.httpGet.path, '/health/live');
  const env = Object.fromEntries(c.env.map((e) => [e.name, e.value]));
  const grace = durationSeconds(env.DREY_DRAIN_GRACE) + durationSeconds(env.DREY_SHUTDOWN_TIMEOUT);
  assert.ok(pod.terminationGracePeriodSeconds > grace, 'the kubelet must not kill dreyd mid-drain');
  const mount = c.volumeMounts.find((m) => m.name === 'data');
  assert.ok(sts.spec.volumeClaimTemplates.some((v) => v.metadata.name === 'data'));
  assert.ok(mount.mountPath);
  for (const svc of docs.filter((d) => d.obj.kind === 'Service').map((d) => d.obj))
    assert.deepEqual(svc.spec.selector, sts.spec.selector.matchLabels);
  assert.equal(pod.securityContext.seccompProfile.type, 'RuntimeDefault');
});
