/*
 * placement — which partition a key belongs to, and which nodes should hold
 * each partition.
 *
 * The partition rule is a contract with every client (proto/drey/cluster/v1/
 * cluster.proto documents it with test vectors): any implementation must give
 * the same partition for the same (cache, key, N).
 *
 * Assignment is not a contract: only the cluster's controller computes it, to
 * propose a partition table. It is rendezvous (highest-random-weight) hashing
 * with bounded loads: each partition ranks the nodes by a 64-bit weight of
 * (node id, partition) and takes the highest-ranked nodes that are not full.
 * The primaries' caps add up to 1.25x the partitions (per-node caps differ
 * by at most one), so the fullest node leads at most about 1.25x the mean
 * plus one. With rf > 1 the caps on copies (primaries and backups) add up
 * to exactly the copies, and a node that could not reach its cap with one
 * copy of each partition left goes first, so every node holds its share:
 * fullest and emptiest within 1.07x of each other with 16 or more copies
 * per node (with 1.25x slack the emptiest was unbounded: 1.30x on 4 nodes
 * with 256 partitions, 2.3x at worst), where plain HRW measured 1.75x over the mean
 * (256 on 16 nodes; tests/bench/placement.c prints both). Bounded loads are
 * Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing with Bounded
 * Loads" (SODA 2018).
 *
 * A join moves at most 1/(n+1) + 0.12 of the slots for every n up to 200
 * (the new node's share is 1/(n+1)); with 16 or more partitions per node it
 * moves at most twice that share (rf 2: or the share and 2% of the slots,
 * the price of caps without slack at 100 nodes and more) and a leave at
 * most twice the leaving node's slots (rf 2: or those and 2%). With fewer
 * partitions per node a cap's rounding moves more (a leave up to 11x the
 * minimum at 148 nodes with 256 partitions): pick P >= 16 x the largest
 * node count.
 *
 * Deterministic: the result depends only on the set of node ids (not their
 * order), P and RF. Pure functions: any thread, no shared state.
 */
#ifndef DREY_PLACEMENT_H
#define DREY_PLACEMENT_H

#include <stddef.h>
#include <stdint.h>

/* The routing key of a key: the bytes between the first '{' and the first
 * '}' after it when there are any, else the whole key. Sets *off and *len
 * within key. */
void drey_placement_routing_key(const char *key, size_t key_len, size_t *off, size_t *len);

/* crc32c(u32le(len(cache)) || cache || 0x1F || routing_key) mod n_partitions,
 * with cache "default" hashed as "". n_partitions must be at least 1. */
uint32_t drey_placement_partition(const char *cache, size_t cache_len, const char *key, size_t key_len,
                                  uint32_t n_partitions);

/* The rendezvous weight of node_id for partition: a higher weight ranks the
 * node higher. splitmix64(fnv1a64(node_id) ^ splitmix64(partition)). */
uint64_t drey_placement_weight(const char *node_id, size_t node_id_len, uint32_t partition);

/* How many replicas each partition gets: min(rf, n_nodes). */
static inline uint32_t drey_placement_replicas(uint32_t rf, size_t n_nodes) {
    return n_nodes < rf ? (uint32_t)n_nodes : rf;
}

/* Assigns n_partitions partitions to the n_nodes nodes (NUL-terminated ids,
 * no duplicates) with rf replicas each. Writes, for partition p, the indexes
 * into node_ids of its replicas to out[p * r .. p * r + r - 1], primary first,
 * where r = drey_placement_replicas(rf, n_nodes) (out has room for
 * n_partitions * r). Nothing is written when n_nodes or rf is 0. */
void drey_placement_assign(const char *const *node_ids, size_t n_nodes, uint32_t n_partitions, uint32_t rf,
                           uint32_t *out);

/* The same with the loads left unbounded: plain HRW (for comparison). */
void drey_placement_assign_unbounded(const char *const *node_ids, size_t n_nodes, uint32_t n_partitions,
                                     uint32_t rf, uint32_t *out);

#endif
