'use strict';
// The partition rule of proto/drey/cluster/v1/cluster.proto in JavaScript,
// and routing by key with a drey.cluster.v1.Topology (as WatchTopology sends
// it): the owner's advertised address for (cache, key), or null when the
// partition has no owner (send it to any node: it forwards).

const CRC32C_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let i = 0; i < 256; i++) {
    let c = i;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
    t[i] = c >>> 0;
  }
  return t;
})();

/** CRC-32C (Castagnoli) of a Buffer. */
function crc32c(buf) {
  let crc = 0xffffffff;
  for (const b of buf) crc = (crc >>> 8) ^ CRC32C_TABLE[(crc ^ b) & 0xff];
  return (crc ^ 0xffffffff) >>> 0;
}

/** The bytes of the first non-empty {...} of key (a Buffer), else key. */
function routingKey(key) {
  const start = key.indexOf(0x7b); // '{'
  if (start < 0) return key;
  const end = key.indexOf(0x7d, start + 1); // '}'
  if (end < 0 || end === start + 1) return key;
  return key.subarray(start + 1, end);
}

/** crc32c(u32le(len(cache)) || cache || 0x1F || routing_key) mod n. */
function partition(cache, key, n) {
  const c = cache === '' || cache === 'default' ? Buffer.alloc(0) : Buffer.from(cache, 'utf8');
  const len = Buffer.alloc(4);
  len.writeUInt32LE(c.length);
  const rk = routingKey(Buffer.isBuffer(key) ? key : Buffer.from(key, 'utf8'));
  return crc32c(Buffer.concat([len, c, Buffer.from([0x1f]), rk])) % n;
}

/** The owner's advertised host:port for (cache, key) by topology, or null. */
function ownerAddress(topology, cache, key) {
  const n = topology.hash && topology.hash.partitions;
  if (!n) return null;
  const p = partition(cache, key, n);
  const entry = (topology.partitions || []).find((e) => (e.id || 0) === p);
  if (!entry || !entry.primary) return null;
  const node = (topology.nodes || []).find((x) => x.id === entry.primary);
  return node && node.advertise ? node.advertise : null;
}

module.exports = { crc32c, routingKey, partition, ownerAddress };
