/*
 * placement — the partition rule and rendezvous assignment with bounded
 * loads; see include/drey/placement.h.
 *
 * Partitions are placed in id order, each taking the highest-ranked nodes
 * that still have room. The order is fixed (not, say, by weight), so the
 * result depends only on the node set: a join changes the caps and the
 * ranking of the partitions the new node wins, and the rest mostly stay.
 */
#include "drey/placement.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/crc32c.h"

/* The primaries' caps add up to LOAD_NUM/LOAD_DEN of the partitions. 1.25
 * keeps the fullest node within about 1.25x of the mean while a join moves
 * about 1-2x the minimum (tests/bench/placement.c measures both). The
 * copies' caps (primaries and backups, rf > 1) add up to exactly the copies:
 * with any slack the emptiest node is not bounded (1.30x between the
 * fullest and the emptiest of 4 nodes with 256 partitions at 1.25, up to
 * 2.3x with 16 copies per node), and copies are what a node's memory and
 * journal hold. The price is a little more movement, most at 100 nodes and
 * more (tests/unit/placement). */
#define LOAD_NUM 5
#define LOAD_DEN 4

void drey_placement_routing_key(const char *key, size_t key_len, size_t *off, size_t *len) {
    const char *open = memchr(key, '{', key_len);
    if (open != NULL) {
        size_t start = (size_t)(open - key) + 1;
        const char *close = memchr(key + start, '}', key_len - start);
        if (close != NULL && close > key + start) {
            *off = start;
            *len = (size_t)(close - (key + start));
            return;
        }
    }
    *off = 0;
    *len = key_len;
}

uint32_t drey_placement_partition(const char *cache, size_t cache_len, const char *key, size_t key_len,
                                  uint32_t n_partitions) {
    /* The store's normalisation: "default" and "" are one cache, so they must
     * be one partition. */
    if (cache_len == 7 && memcmp(cache, "default", 7) == 0)
        cache_len = 0;
    uint8_t len_le[4] = {(uint8_t)cache_len, (uint8_t)(cache_len >> 8), (uint8_t)(cache_len >> 16),
                         (uint8_t)(cache_len >> 24)};
    uint32_t crc = drey_crc32c(0, len_le, sizeof len_le);
    crc = drey_crc32c(crc, cache, cache_len);
    crc = drey_crc32c(crc, "\x1f", 1);
    size_t off, len;
    drey_placement_routing_key(key, key_len, &off, &len);
    crc = drey_crc32c(crc, key + off, len);
    return crc % n_partitions;
}

static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15u;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9u;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebu;
    return x ^ (x >> 31);
}

static uint64_t fnv1a64(const char *s, size_t n) {
    uint64_t h = 0xcbf29ce484222325u;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3u;
    }
    return h;
}

/* The weight from a node's precomputed fnv1a64: CRC-32C would be cheaper,
 * but it is linear, and a linear hash correlates the rankings of different
 * partitions. */
static uint64_t weight_of(uint64_t node_hash, uint32_t partition) {
    return splitmix64(node_hash ^ splitmix64(partition));
}

uint64_t drey_placement_weight(const char *node_id, size_t node_id_len, uint32_t partition) {
    return weight_of(fnv1a64(node_id, node_id_len), partition);
}

typedef struct ranked {
    uint64_t weight;
    uint32_t node;
} ranked;

static int by_rank(const void *a, const void *b, void *ids) {
    const ranked *x = a, *y = b;
    if (x->weight != y->weight)
        return x->weight > y->weight ? -1 : 1;
    /* Equal weights (astronomically rare) fall back to the ids, so the order
     * of node_ids still does not matter. */
    const char *const *names = ids;
    return strcmp(names[x->node], names[y->node]);
}

/* Per-node caps that add up to total: total / n each, and one
 * more for the first total % n nodes in an order of their own (a hash of
 * the id, so it does not change when others join). A single cap for all,
 * ceil(1.25 x slots / n), jumps by one for every node at once when n
 * crosses a threshold (3 -> 2 between 159 and 160 nodes with 256
 * partitions), and a join there moved 21% of the partitions; with caps that
 * sum to a constant only a few nodes' caps change. */
static void caps_of(const char *const *ids, const uint64_t *hashes, size_t n, uint64_t total, uint32_t *caps,
                    ranked *order) {
    for (size_t i = 0; i < n; i++) {
        caps[i] = (uint32_t)(total / n);
        order[i] = (ranked){splitmix64(hashes[i] ^ 0x6361707300000000u /* "caps" */), (uint32_t)i};
    }
    qsort_r(order, n, sizeof *order, by_rank, (void *)ids);
    for (size_t i = 0; i < total % n; i++)
        caps[order[i].node]++;
}

/* The nodes in rank order for one partition, sorted lazily by selection:
 * a partition usually needs its first one or two, so this is O(n) where a
 * full sort was O(n log n) (8x faster for 200 nodes). */
typedef struct lazy_rank {
    ranked *r;
    size_t n, sorted;
    const char *const *ids;
} lazy_rank;

static uint32_t nth(lazy_rank *l, size_t i) {
    while (l->sorted <= i) {
        size_t best = l->sorted;
        for (size_t j = best + 1; j < l->n; j++)
            if (by_rank(&l->r[j], &l->r[best], (void *)l->ids) < 0)
                best = j;
        ranked t = l->r[l->sorted];
        l->r[l->sorted] = l->r[best];
        l->r[best] = t;
        l->sorted++;
    }
    return l->r[i].node;
}

/* The highest-ranked urgent node not taken (UINT32_MAX: none), without
 * sorting the rest. */
static uint32_t best_urgent(const lazy_rank *l, const bool *must, const bool *taken) {
    const ranked *best = NULL;
    for (size_t j = 0; j < l->n; j++) {
        const ranked *x = &l->r[j];
        if (must[x->node] && !taken[x->node] && (best == NULL || by_rank(x, best, (void *)l->ids) < 0))
            best = x;
    }
    return best != NULL ? best->node : UINT32_MAX;
}

static void assign(const char *const *node_ids, size_t n_nodes, uint32_t n_partitions, uint32_t rf, uint32_t *out,
                   bool bounded) {
    uint32_t r = drey_placement_replicas(rf, n_nodes);
    if (r == 0)
        return;
    uint64_t *hashes = drey_xcalloc(n_nodes, sizeof *hashes);
    ranked *rank = drey_xcalloc(n_nodes, sizeof *rank);
    uint32_t *primaries = drey_xcalloc(n_nodes, sizeof *primaries);
    uint32_t *slots = drey_xcalloc(n_nodes, sizeof *slots);
    uint32_t *primary_cap = drey_xcalloc(n_nodes, sizeof *primary_cap);
    uint32_t *slot_cap = drey_xcalloc(n_nodes, sizeof *slot_cap);
    bool *taken = drey_xcalloc(n_nodes, sizeof *taken), *must = drey_xcalloc(n_nodes, sizeof *must);
    for (size_t i = 0; i < n_nodes; i++)
        hashes[i] = fnv1a64(node_ids[i], strlen(node_ids[i]));
    if (bounded) {
        uint64_t primaries_total = ((uint64_t)n_partitions * LOAD_NUM + LOAD_DEN - 1) / LOAD_DEN;
        caps_of(node_ids, hashes, n_nodes, primaries_total, primary_cap, rank);
        caps_of(node_ids, hashes, n_nodes, r > 1 ? (uint64_t)n_partitions * r : primaries_total, slot_cap, rank);
    } else {
        for (size_t i = 0; i < n_nodes; i++)
            primary_cap[i] = slot_cap[i] = UINT32_MAX;
    }

    for (uint32_t p = 0; p < n_partitions; p++) {
        for (size_t i = 0; i < n_nodes; i++)
            rank[i] = (ranked){weight_of(hashes[i], p), (uint32_t)i};
        lazy_rank lr = {.r = rank, .n = n_nodes, .ids = node_ids};
        uint32_t *dst = out + (size_t)p * r;
        /* A node with room for a copy of every partition left (this one
         * included) must hold one of this one, or it ends below its cap
         * and others above theirs: a node holds one copy of a partition
         * at most, and with caps that add up to the copies (rf > 1) there
         * is no slack for that. Urgent ones go first, in rank order. */
        size_t urgent = 0;
        for (size_t i = 0; i < n_nodes; i++) {
            must[i] = r > 1 && slot_cap[i] > slots[i] && slot_cap[i] - slots[i] >= n_partitions - p;
            urgent += must[i];
        }
        /* The primary: the first with room for both a primary and a slot
         * (among the urgent ones when they are enough for every copy). The
         * caps exceed the totals, but the two together can leave no node
         * with both; then room for a slot will do, and then anyone. */
        bool only_urgent = urgent >= r;
        size_t pick = n_nodes;
        for (size_t i = 0; i < n_nodes && pick == n_nodes; i++)
            if (primaries[nth(&lr, i)] < primary_cap[nth(&lr, i)] && slots[nth(&lr, i)] < slot_cap[nth(&lr, i)] &&
                (!only_urgent || must[nth(&lr, i)]))
                pick = i;
        for (size_t i = 0; i < n_nodes && pick == n_nodes; i++)
            if (slots[nth(&lr, i)] < slot_cap[nth(&lr, i)] && (!only_urgent || must[nth(&lr, i)]))
                pick = i;
        if (pick == n_nodes)
            pick = 0;
        uint32_t node = nth(&lr, pick);
        dst[0] = node;
        taken[node] = true;
        primaries[node]++;
        slots[node]++;
        for (uint32_t k = 1; k < r; k++) {
            size_t want = n_nodes;
            node = urgent > 0 ? best_urgent(&lr, must, taken) : UINT32_MAX;
            for (size_t i = 0; i < n_nodes && want == n_nodes && node == UINT32_MAX; i++)
                if (!taken[nth(&lr, i)] && slots[nth(&lr, i)] < slot_cap[nth(&lr, i)])
                    want = i;
            for (size_t i = 0; i < n_nodes && want == n_nodes && node == UINT32_MAX; i++)
                if (!taken[nth(&lr, i)])
                    want = i;
            if (node == UINT32_MAX)
                node = nth(&lr, want);
            dst[k] = node;
            taken[node] = true;
            slots[node]++;
        }
        for (uint32_t k = 0; k < r; k++)
            taken[dst[k]] = false;
    }
    free(must);
    free(taken);
    free(slot_cap);
    free(primary_cap);
    free(slots);
    free(primaries);
    free(rank);
    free(hashes);
}

void drey_placement_assign(const char *const *node_ids, size_t n_nodes, uint32_t n_partitions, uint32_t rf,
                           uint32_t *out) {
    assign(node_ids, n_nodes, n_partitions, rf, out, true);
}

void drey_placement_assign_unbounded(const char *const *node_ids, size_t n_nodes, uint32_t n_partitions,
                                     uint32_t rf, uint32_t *out) {
    assign(node_ids, n_nodes, n_partitions, rf, out, false);
}
