'use strict';
// The partition rule in JavaScript against the vectors every client shares
// (tests/data/partition_vectors.json, made by an independent Python
// implementation), and routing by a Topology message: the owner's
// advertised address, or null (any node forwards) without an owner.

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { test } = require('node:test');
const { crc32c, routingKey, partition, ownerAddress } = require('./routing');

const VECTORS = path.join(__dirname, '..', '..', 'data', 'partition_vectors.json');

test('the shared vectors hold in JavaScript', () => {
  const doc = JSON.parse(fs.readFileSync(VECTORS, 'utf8'));
  assert.equal(crc32c(Buffer.from(doc.crc32c_check.input)), Number(doc.crc32c_check.crc32c));
  assert.ok(doc.vectors.length >= 20);
  for (const v of doc.vectors) {
    assert.equal(partition(v.cache, v.key, v.partitions), v.partition, JSON.stringify(v));
    assert.equal(routingKey(Buffer.from(v.key, 'utf8')).toString('utf8'), v.routing_key, JSON.stringify(v));
  }
});

test('a topology routes to the owner, and a partition without one to nobody', () => {
  const p = partition('users', 'alice', 16);
  const topology = {
    hash: { function: 'CRC32C_CACHE_ROUTING_KEY', partitions: 16 },
    nodes: [{ id: 'n1', advertise: '10.0.0.1:50051' }, { id: 'n2', advertise: '10.0.0.2:50051' }],
    partitions: Array.from({ length: 16 }, (_, id) => ({ id, epoch: 7, primary: id === p ? 'n2' : 'n1' })),
  };
  assert.equal(ownerAddress(topology, 'users', 'alice'), '10.0.0.2:50051');
  assert.equal(ownerAddress(topology, 'users', '{alice}.cart'), '10.0.0.2:50051', 'a hash tag routes with its tag');
  topology.partitions[p].primary = '';
  assert.equal(ownerAddress(topology, 'users', 'alice'), null);
  topology.partitions[p].primary = 'n9'; // named by the table, not in nodes
  assert.equal(ownerAddress(topology, 'users', 'alice'), null);
  assert.equal(ownerAddress({ partitions: [] }, 'users', 'alice'), null, 'no hash rule: no routing');
});
