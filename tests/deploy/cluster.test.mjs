// Validates deploy/k8s/cluster/*.yaml (the StatefulSet of three) against the
// Kubernetes schemas (kubernetes-models, offline), checks the invariants a
// cluster node depends on, and checks that every flag the manifests pass is
// one the binaries list in their --help (DREY_DREYD, DREY_CLI: the built
// dreyd and drey).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, realpathSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseAllDocuments } from 'yaml';
import { ConfigMap, Service } from 'kubernetes-models/v1';
import { StatefulSet } from 'kubernetes-models/apps/v1';
import { Job } from 'kubernetes-models/batch/v1';
import { PodDisruptionBudget } from 'kubernetes-models/policy/v1';
import { Issuer } from '@kubernetes-models/cert-manager/cert-manager.io/v1';

const here = dirname(realpathSync(fileURLToPath(import.meta.url)));
const k8sDir = join(process.env.DREY_K8S_DIR ?? join(here, '..', '..', 'deploy', 'k8s'), 'cluster');
const models = {
  'v1/ConfigMap': ConfigMap,
  'v1/Service': Service,
  'apps/v1/StatefulSet': StatefulSet,
  'batch/v1/Job': Job,
  'policy/v1/PodDisruptionBudget': PodDisruptionBudget,
  'cert-manager.io/v1/Issuer': Issuer,
};

function documents() {
  const docs = [];
  for (const f of readdirSync(k8sDir).filter((f) => f.endsWith('.yaml'))) {
    for (const d of parseAllDocuments(readFileSync(join(k8sDir, f), 'utf8'))) {
      assert.equal(d.errors.length, 0, `${f}: ${d.errors}`);
      docs.push(d.toJS());
    }
  }
  return docs;
}

const docs = documents();
const one = (kind, name) => {
  const found = docs.filter((d) => d.kind === kind && (name === undefined || d.metadata.name === name));
  assert.equal(found.length, 1, `exactly one ${kind} ${name ?? ''}`);
  return found[0];
};
const sts = one('StatefulSet');
const pod = sts.spec.template.spec;
const dreyd = pod.containers.find((c) => c.name === 'dreyd');
const headless = docs.find((d) => d.kind === 'Service' && d.spec.clusterIP === 'None');
const job = one('Job');
const initContainer = job.spec.template.spec.containers[0];

/** --name=value args as a Map (a flag given twice fails). */
function flags(args) {
  const m = new Map();
  for (const a of args.filter((x) => x.startsWith('--'))) {
    const [name, ...rest] = a.slice(2).split('=');
    assert.ok(!m.has(name), `--${name} given twice`);
    m.set(name, rest.join('='));
  }
  return m;
}
const args = flags(dreyd.args);
const envFrom = (c, name) => c.env.find((e) => e.name === name);

function durationSeconds(s) {
  const m = /^(\d+)(ms|s|m)$/.exec(s);
  assert.ok(m, `duration ${s}`);
  return Number(m[1]) / { ms: 1000, s: 1, m: 1 / 60 }[m[2]];
}

test('every cluster manifest validates against its Kubernetes schema', () => {
  assert.ok(docs.length >= 6);
  for (const obj of docs) {
    const Model = models[`${obj.apiVersion}/${obj.kind}`];
    assert.ok(Model, `no schema wired for ${obj.apiVersion}/${obj.kind}`);
    new Model(obj).validate();
  }
});

test('a broken cluster manifest is rejected (the validation can fail)', () => {
  const broken = structuredClone(one('PodDisruptionBudget'));
  broken.spec.maxUnavailable = { one: 1 };
  assert.throws(() => new PodDisruptionBudget(broken).validate());
  const badPolicy = structuredClone(sts);
  badPolicy.spec.podManagementPolicy = 7;
  assert.throws(() => new StatefulSet(badPolicy).validate());
});

test('three nodes started in parallel, one down at a time', () => {
  assert.equal(sts.spec.replicas, 3);
  assert.equal(sts.spec.podManagementPolicy, 'Parallel');
  const pdb = one('PodDisruptionBudget');
  assert.equal(pdb.spec.maxUnavailable, 1);
  assert.deepEqual(pdb.spec.selector.matchLabels, sts.spec.selector.matchLabels);
  for (const svc of docs.filter((d) => d.kind === 'Service'))
    assert.deepEqual(svc.spec.selector, sts.spec.selector.matchLabels);
  assert.equal(sts.spec.serviceName, headless.metadata.name);
  assert.equal(headless.spec.publishNotReadyAddresses, true, 'peers find a node that is still starting');
});

test('the node id is the pod name and the advertised names are its headless-Service DNS names', () => {
  assert.equal(envFrom(dreyd, 'POD_NAME').valueFrom.fieldRef.fieldPath, 'metadata.name');
  assert.equal(envFrom(dreyd, 'POD_NAMESPACE').valueFrom.fieldRef.fieldPath, 'metadata.namespace');
  assert.equal(args.get('node-id'), '$(POD_NAME)');
  const port = (name) => dreyd.ports.find((p) => p.name === name).containerPort;
  const dns = `$(POD_NAME).${headless.metadata.name}.$(POD_NAMESPACE).svc`;
  assert.equal(args.get('listen'), `0.0.0.0:${port('grpc')}`);
  assert.equal(args.get('internal-listen'), `0.0.0.0:${port('internal')}`);
  assert.equal(args.get('advertise'), `${dns}:${port('grpc')}`);
  assert.equal(args.get('internal-advertise'), `${dns}:${port('internal')}`);
  for (const name of ['grpc', 'internal'])
    assert.ok(headless.spec.ports.some((p) => p.targetPort === name), `the headless Service publishes ${name}`);
});

/** The pod's cert-manager CSI volume of that name. */
const csi = (spec, name) => {
  const v = spec.volumes.find((x) => x.name === name);
  assert.ok(v && v.csi, `volume ${name} is a CSI volume`);
  assert.equal(v.csi.driver, 'csi.cert-manager.io');
  assert.equal(v.csi.readOnly, true);
  return v.csi.volumeAttributes;
};

test('each pod gets its own internal certificate: no Secret holds every pod\'s key', () => {
  const attrs = csi(pod, 'internal-tls');
  const issuer = one('Issuer', attrs['csi.cert-manager.io/issuer-name']);
  assert.equal(attrs['csi.cert-manager.io/issuer-kind'], 'Issuer');
  assert.ok(issuer.spec.ca.secretName, 'the CA key is in a Secret only cert-manager reads');
  for (const v of pod.volumes)
    assert.notEqual(v.secret?.secretName, issuer.spec.ca.secretName, 'no pod mounts the CA key');
  // The node id (the pod name) is a SAN: peers check it.
  const dns = attrs['csi.cert-manager.io/dns-names'].split(',');
  assert.ok(dns.includes('${POD_NAME}'));
  assert.ok(dns.includes(`\${POD_NAME}.${headless.metadata.name}.\${POD_NAMESPACE}.svc`));
  assert.match(attrs['csi.cert-manager.io/key-usages'], /server auth/);
  assert.match(attrs['csi.cert-manager.io/key-usages'], /client auth/);
  assert.equal(attrs['csi.cert-manager.io/fs-group'], String(pod.securityContext.runAsUser), 'readable by the image user');
  const mount = dreyd.volumeMounts.find((m) => m.name === 'internal-tls');
  assert.equal(mount.readOnly, true);
  assert.equal(args.get('internal-tls-cert'), `${mount.mountPath}/tls.crt`);
  assert.equal(args.get('internal-tls-key'), `${mount.mountPath}/tls.key`);
  assert.equal(args.get('internal-tls-ca'), `${mount.mountPath}/ca.crt`);
  assert.equal(pod.securityContext.fsGroup, pod.securityContext.runAsUser);
});

test('two copies of a partition never share a Kubernetes node; pods spread over zones', () => {
  const anti = pod.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution;
  assert.equal(anti.length, 1);
  assert.equal(anti[0].topologyKey, 'kubernetes.io/hostname');
  assert.deepEqual(anti[0].labelSelector.matchLabels, sts.spec.selector.matchLabels);
  const spread = Object.fromEntries(pod.topologySpreadConstraints.map((t) => [t.topologyKey, t]));
  assert.equal(spread['kubernetes.io/hostname'].whenUnsatisfiable, 'DoNotSchedule');
  assert.equal(spread['topology.kubernetes.io/zone'].maxSkew, 1);
  for (const t of pod.topologySpreadConstraints)
    assert.deepEqual(t.labelSelector.matchLabels, sts.spec.selector.matchLabels);
});

test('seccomp RuntimeDefault, no privilege, a read-only root for every pod', () => {
  for (const spec of [pod, job.spec.template.spec]) {
    assert.equal(spec.securityContext.seccompProfile.type, 'RuntimeDefault');
    assert.equal(spec.securityContext.runAsNonRoot, true);
    for (const c of spec.containers) {
      assert.equal(c.securityContext.allowPrivilegeEscalation, false);
      assert.equal(c.securityContext.readOnlyRootFilesystem, true);
      assert.deepEqual(c.securityContext.capabilities.drop, ['ALL']);
    }
  }
});

test('the init Job has resources and goes away once finished', () => {
  assert.ok(job.spec.ttlSecondsAfterFinished > 0);
  assert.ok(initContainer.resources.requests.cpu && initContainer.resources.requests.memory);
  assert.ok(initContainer.resources.limits.memory);
});

test('etcd over TLS with its own authentication, the same for the nodes and the init Job', () => {
  const cm = one('ConfigMap', 'drey-cluster');
  const endpoints = cm.data['etcd-endpoints'].split(',');
  assert.ok(endpoints.length >= 3, 'an existing etcd cluster of three members');
  for (const e of endpoints) assert.match(e, /^https:\/\/[^,/]+:\d+$/, 'TLS, never plaintext');
  const jobSpec = job.spec.template.spec;
  for (const [c, spec] of [[dreyd, pod], [initContainer, jobSpec]]) {
    const env = (n) => envFrom(c, n);
    assert.equal(env('DREY_CLUSTER_ETCD').valueFrom.configMapKeyRef.key, 'etcd-endpoints');
    assert.equal(env('DREY_CLUSTER_ETCD').valueFrom.configMapKeyRef.name, cm.metadata.name);
    assert.equal(env('DREY_CLUSTER_PREFIX').valueFrom.configMapKeyRef.key, 'prefix');
    assert.equal(env('DREY_CLUSTER_ETCD_USER').valueFrom.configMapKeyRef.key, 'etcd-user');
    // Its own etcd client certificate, from the etcd client Issuer.
    const attrs = csi(spec, 'etcd-tls');
    one('Issuer', attrs['csi.cert-manager.io/issuer-name']);
    assert.equal(attrs['csi.cert-manager.io/common-name'], cm.data['etcd-user'], 'the CN etcd sees is the user');
    const tlsMount = c.volumeMounts.find((m) => m.name === 'etcd-tls').mountPath;
    assert.equal(env('DREY_CLUSTER_ETCD_CA').value, `${tlsMount}/ca.crt`);
    assert.equal(env('DREY_CLUSTER_ETCD_CERT').value, `${tlsMount}/tls.crt`);
    assert.equal(env('DREY_CLUSTER_ETCD_KEY').value, `${tlsMount}/tls.key`);
    // The password file: one key of a Secret, nothing else of it.
    const auth = spec.volumes.find((v) => v.name === 'etcd-auth').secret;
    assert.deepEqual(auth.items.map((i) => i.path), ['password']);
    const authMount = c.volumeMounts.find((m) => m.name === 'etcd-auth').mountPath;
    assert.equal(env('DREY_CLUSTER_ETCD_PASSWORD_FILE').value, `${authMount}/password`);
  }
  const init = flags(initContainer.args);
  assert.deepEqual(initContainer.args.slice(0, 2), ['cluster', 'init']);
  assert.equal(init.get('partitions'), args.get('cluster-partitions'), 'nodes expect the partitions init writes');
  assert.equal(init.get('initial-nodes'), String(sts.spec.replicas));
  assert.equal(job.spec.template.spec.restartPolicy, 'OnFailure', 'init retries until etcd answers');
});

test('a policy in force; Prometheus gets the metrics verb and nothing else', () => {
  const cm = one('ConfigMap', 'drey-authz-policy');
  const policy = JSON.parse(cm.data['policy.json']);
  const mount = dreyd.volumeMounts.find((m) => m.name === 'authz-policy');
  assert.equal(args.get('authz-policy'), `${mount.mountPath}/policy.json`);
  assert.equal(pod.volumes.find((v) => v.name === 'authz-policy').configMap.name, cm.metadata.name);
  const scrape = policy.bindings.filter((b) => b.claim === 'sub' && b.equals === 'prometheus');
  assert.equal(scrape.length, 1);
  for (const role of scrape[0].roles)
    for (const rule of policy.roles[role]) assert.deepEqual(rule.verbs, ['metrics'], 'only metrics');
});

test('drey ready and drey drain inside the pod find the ops listener', () => {
  const ops = dreyd.ports.find((p) => p.name === 'ops').containerPort;
  assert.equal(envFrom(dreyd, 'DREY_OPS_LISTEN').value, `0.0.0.0:${ops}`);
  assert.ok(!args.has('ops-listen'), 'one place: the variable both dreyd and drey read');
});

test('the preStop drain fits inside the termination grace period', () => {
  const cmd = dreyd.lifecycle.preStop.exec.command;
  assert.equal(cmd[0], '/usr/local/bin/drey');
  assert.equal(cmd[1], 'drain');
  const hook = flags(cmd.slice(2));
  assert.equal(hook.get('pid'), '1', 'dreyd is the entry point, PID 1');
  const wait = durationSeconds(hook.get('wait'));
  // First the partitions move to the others, then the single-node drain.
  const drain = durationSeconds(args.get('cluster-drain-timeout')) + durationSeconds(args.get('drain-grace')) +
    durationSeconds(args.get('shutdown-timeout'));
  assert.ok(wait > drain, 'the hook waits out the whole drain, partition moves included');
  assert.ok(pod.terminationGracePeriodSeconds > wait, 'the kubelet does not kill dreyd while the hook waits');
  assert.equal(dreyd.readinessProbe.httpGet.path, '/health/ready');
  assert.equal(dreyd.startupProbe.grpc.port, dreyd.ports.find((p) => p.name === 'grpc').containerPort);
  const keys = args.get('jwt-keys-dir');
  assert.ok(dreyd.volumeMounts.some((m) => m.mountPath === keys), 'a non-loopback listener needs token keys');
});

function helpOf(bin, ...argv) {
  try {
    return execFileSync(bin, [...argv, '--help'], { encoding: 'utf8' });
  } catch (e) {
    return `${e.stdout ?? ''}${e.stderr ?? ''}`; // a --help that exits non-zero still prints the usage
  }
}

test('every flag the manifests pass is one the binaries list', { skip: !process.env.DREY_DREYD && 'DREY_DREYD unset' }, () => {
  const dreydHelp = helpOf(process.env.DREY_DREYD);
  assert.match(dreydHelp, /--cluster-etcd=/, 'this dreyd has the cluster flags');
  for (const name of args.keys()) assert.ok(dreydHelp.includes(`--${name}=`), `dreyd --help lists --${name}`);
  // Settings given as DREY_* variables are options of dreyd too.
  for (const e of dreyd.env.filter((x) => x.name.startsWith('DREY_'))) {
    const name = e.name.slice(5).toLowerCase().replaceAll('_', '-');
    assert.ok(dreydHelp.includes(`--${name}=`), `${e.name} is dreyd's --${name}`);
  }
  const cli = process.env.DREY_CLI;
  const clusterHelp = helpOf(cli, 'cluster', 'init');
  for (const name of flags(initContainer.args).keys())
    assert.match(clusterHelp, new RegExp(`--${name}[= \\]]`), `drey cluster --help lists --${name}`);
  const drainHelp = helpOf(cli, 'drain');
  for (const name of flags(dreyd.lifecycle.preStop.exec.command.slice(2)).keys())
    assert.match(drainHelp, new RegExp(`--${name}[= \\]]`), `drey drain --help lists --${name}`);
  // The check can fail: a flag dreyd does not have is caught.
  assert.ok(!dreydHelp.includes('--cluster-etcd-endpoints='));
});

test('the policy the manifest ships loads in dreyd', { skip: !process.env.DREY_DREYD && 'DREY_DREYD unset' }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'drey-policy-'));
  try {
    const file = join(dir, 'policy.json');
    writeFileSync(file, one('ConfigMap', 'drey-authz-policy').data['policy.json']);
    const log = await new Promise((resolve) => {
      const p = spawn(process.env.DREY_DREYD, ['--ephemeral', '--listen=127.0.0.1:0', '--ops-listen=',
        `--authz-policy=${file}`], { stdio: ['ignore', 'ignore', 'pipe'] });
      let text = '';
      p.stderr.on('data', (d) => {
        text += d;
        if (text.includes('"msg":"serving"') || text.includes('cannot load')) p.kill('SIGKILL');
      });
      p.on('exit', () => resolve(text));
    });
    assert.match(log, /"msg":"authz policy loaded"/, log);
    assert.match(log, /"roles":3/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
