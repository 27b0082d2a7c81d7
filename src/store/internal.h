/*
 * The store's internals, shared by its files (store.c: the tables, entries,
 * transactions and the sweep; registry.c: the cache registry and per-table
 * figures; walk.c: scans and partition walks; evict.c: choosing what to
 * evict). Nothing outside src/store and its unit tests includes this.
 */
#ifndef DREY_STORE_INTERNAL_H
#define DREY_STORE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "drey/store.h"

#define SHARD_MIN_BUCKETS 16

typedef struct entry {
    struct entry *next;    /* bucket chain */
    uint64_t version;
    int64_t expires_at_ms; /* 0 = never */
    uint32_t hash;         /* low 32 bits of the key hash */
    uint32_t value_len;
    /* Recency or frequency for eviction (see evict.c): LRU the low 32 bits
     * of the last access's monotonic milliseconds; LFU (16 ms units << 8) |
     * log counter.
     * Read and written with relaxed atomics: readers update it under the
     * shard's read lock. Untouched when no policy is in force. */
    uint32_t access;
    uint32_t cache_id;     /* the cache slot the entry counts in (registry) */
    uint16_t key_len;
    uint8_t cache_len;
    uint8_t kind;          /* drey_value_kind, | ENTRY_TENANT */
    /* cache name, key, value; then, with ENTRY_TENANT, the tenant's number
     * (4 bytes, unaligned): an entry nobody's costs nothing more. */
    unsigned char data[];
} entry;

/* In kind: the entry is a tenant's (whose write created or last replaced it). */
#define ENTRY_TENANT 0x80u

static inline uint8_t drey_store__kind(const entry *e) {
    return (uint8_t)(e->kind & ~ENTRY_TENANT);
}

static inline uint32_t drey_store__tenant(const entry *e) {
    uint32_t t = 0;
    if (e->kind & ENTRY_TENANT)
        __builtin_memcpy(&t, e->data + e->cache_len + e->key_len + e->value_len, sizeof t);
    return t;
}

/* One cache's figures in one table of a partitioned store (a partition's
 * figures per cache are its tables' summed). Open addressing keyed by the
 * cache slot; a cache's row goes when its last entry in the table does. */
typedef struct table_cache {
    uint32_t id1;      /* 1 + cache slot id; 0: empty */
    uint32_t expiring; /* entries with an expiry */
    uint64_t entries;
    uint64_t bytes;
} table_cache;

/* A table: a chained hash table of entries. A standalone store has 256,
 * table i guarded by stripe i; a partitioned one a few per partition (see
 * layout), table t guarded by stripe t % 256. Every field but the atomics
 * changes only under its stripe's write lock. */
typedef struct shard {
    entry **buckets;
    size_t mask;         /* bucket count - 1 */
    size_t count;        /* entries, including expired ones */
    size_t bytes;        /* accounted bytes */
    size_t sweep_cursor; /* next bucket the expiry sweep visits */
    /* Entries with an expiry, changed under the write lock. The sweep reads
     * it without the lock to pass over tables with nothing to expire: a
     * stale read only delays a sweep, as reads expire entries themselves. */
    _Atomic size_t expiring;
    /* Entries eviction may choose (not in an internal '#' cache): all of
     * them, and those with an expiry. Under the write lock, read without
     * it by the sampler to pass over tables with nothing to choose. */
    _Atomic size_t evictable, evictable_expiring;
    table_cache *caches; /* per_cache: this table's figures per cache */
    bool per_cache;      /* a partitioned store's table */
    uint32_t caches_cap; /* a power of two, or 0 */
    uint32_t caches_used;
} __attribute__((aligned(64))) shard;

/* A lock guarding the tables t with t % DREY_STORE_SHARDS == its index. */
typedef struct stripe {
    pthread_rwlock_t lock;
} __attribute__((aligned(64))) stripe;

/* Where entries live. The key's table is chosen by drey_store_key():
 * standalone, the top 8 bits of its hash; partitioned, its partition's
 * group of `per_part` tables and within it the hash's top bits. Entries
 * the partition function places in no partition form group `parts`.
 * A layout changes only with every stripe write-locked, so whoever holds
 * any stripe lock sees one layout; a layout replaced is kept (emptied)
 * until the store is destroyed, so a lock-free reader of an old one reads
 * zeros, never freed memory. */
typedef struct layout {
    shard *tables;
    uint32_t n_tables;
    uint32_t parts;    /* partitions; 0: not partitioned */
    uint32_t per_part; /* tables per partition: a power of two, at most 128 */
    drey_store_partition_fn part_of;
    struct layout *older; /* the layout this one replaced */
} layout;

/* One cache's figures. A Clear retires the cache's slot: its entries become
 * invisible at once (is_live) and are freed by the sweep in bounded steps;
 * the next write to the name opens a new slot. `retired` changes only while
 * every shard is write-locked, so a reader holding any shard lock sees a
 * stable value. A retired slot is reused once its last entry is freed. */
typedef struct cache_slot {
    _Atomic int64_t entries;
    _Atomic int64_t bytes;
    _Atomic int64_t expiring;
    _Atomic uint64_t evictions;
    _Atomic uint64_t evicted_bytes;
    bool retired;
    uint8_t name_len;
    char name[256];
    uint32_t next_free;   /* free list (registry lock) */
} cache_slot;

#define SLOT_CHUNK 256
/* At most 16,777,216 caches at once: far past what memory admission lets in
 * (--max-caches, plus one per write in flight), so the abort that guards
 * it is unreachable. */
#define SLOT_CHUNKS 65536

typedef struct registry {
    pthread_mutex_t mu;    /* the map, the free list, slot allocation */
    cache_slot *_Atomic chunks[SLOT_CHUNKS]; /* written once each, never moved */
    uint32_t n_slots;      /* slots ever allocated */
    uint32_t free_head;    /* 1 + index of the first free slot; 0: none */
    _Atomic uint32_t live; /* slots in use by caches clients name (changed under mu) */
    uint32_t *map;         /* open addressing: 1 + slot id, 0 empty, UINT32_MAX deleted */
    size_t map_cap;        /* power of two */
    size_t map_used;       /* live + deleted */
} registry;

/* The eviction pool (evict.c): the best candidates seen by sampling. */
#define EVICT_POOL 16

typedef struct pool_entry {
    uint64_t score;   /* higher: evict first */
    uint64_t version;
    uint8_t cache_len;
    uint16_t key_len;
    char *name;       /* cache name then key, malloc'd, EVICT_NAME_MAX bytes */
} pool_entry;

struct drey_store {
    stripe stripes[DREY_STORE_SHARDS];
    _Atomic(layout *) layout;
    /* The capture in progress (see drey_store_capture_begin), per stripe. */
    _Atomic bool capture_pending[DREY_STORE_SHARDS];
    drey_store_capture_fn capture_fn;
    void *capture_ctx;
    int64_t capture_live_at;
    uint8_t seed[16];
    _Atomic uint64_t version;
    _Atomic int64_t bytes;      /* sum of the shards' accounted bytes */
    _Atomic size_t sweep_shard; /* table the next sweep step starts in */
    _Atomic uint64_t expired_swept;
    _Atomic int64_t orphans;    /* entries of retired slots not yet freed */
    _Atomic uint64_t evictions, evicted_bytes;
    drey_evict_policy policy;   /* set before use, read-only afterwards */
    registry reg;
    pthread_mutex_t pool_mu;
    pool_entry pool[EVICT_POOL];
    size_t pool_len;            /* sorted by score, ascending */
    /* Hears of changes (drey_store_set_observer); NULL: nobody. */
    _Atomic(const drey_store_observer *) observer;
    /* Tenants' bytes and names (drey_store_set_tenants); account NULL: none. */
    drey_store_tenants tenants;
};

cache_slot *drey_store__slot(drey_store *s, uint32_t id);
/* The layout: relaxed under a stripe lock (the lock orders it), acquire
 * without one. */
layout *drey_store__layout(const drey_store *s);
pthread_rwlock_t *drey_store__lock_of(drey_store *s, size_t table);
/* Visible to operations at now_ms: not expired, not cleared. */
bool drey_store__is_live(drey_store *s, const entry *e, int64_t now_ms);
bool drey_store__matches(const entry *e, const drey_key *k);
size_t drey_store__entry_bytes(const entry *e);
/* Records an access to e (policy in force; relaxed atomics, any lock). */
void drey_store__touch(drey_store *s, entry *e);
/* The access word of an entry created now, or replacing one whose access
 * word was `old`. */
uint32_t drey_store__access_new(drey_store *s, uint32_t old, bool replacing);

/* The cache registry's open-addressing map: slot ids, 0 free, a tombstone
 * where a name went (registry.c). */
#define MAP_EMPTY 0u
#define MAP_DELETED UINT32_MAX

/* Helpers the files share (defined where their section lives); each takes
 * the locks its section's comment names. */
void drey_store__capture_if_pending(drey_store *s, size_t idx);
bool drey_store__internal(const entry *e);
void drey_store__item_of(const entry *e, drey_store_item *it);
uint64_t drey_store__key_hash(const drey_store *s, const char *cache, size_t cache_len, const char *key, size_t key_len);
layout *drey_store__layout_new(uint32_t parts, drey_store_partition_fn fn);
void drey_store__lock_all(drey_store *s);
size_t drey_store__map_find(drey_store *s, const char *name, size_t len, bool *found);
void drey_store__normalize_cache(const char **cache, size_t *len);
void drey_store__observe(drey_store *s, drey_store_change_kind kind, const entry *e);
void drey_store__registry_destroy(drey_store *s);
void drey_store__registry_init(drey_store *s);
void drey_store__resize(shard *sh, size_t nbuckets);
bool drey_store__retired(drey_store *s, const entry *e);
uint32_t drey_store__slot_for(drey_store *s, const char *name, size_t len);
void drey_store__slot_release(drey_store *s, uint32_t id);
uint32_t drey_store__table_for(const layout *L, const char *cache, size_t cache_len, const char *key, size_t key_len, uint64_t hash);
void drey_store__tc_add(shard *sh, uint32_t id, int64_t entries, int64_t bytes, int expiring);
table_cache *drey_store__tc_find(const shard *sh, uint32_t id);
void drey_store__uncount_entry(drey_store *s, shard *sh, const entry *e);
/* A table emptied of entries: its figures zero and its cache rows freed. */
void drey_store__shard_zero(shard *sh);
void drey_store__unlock_all(drey_store *s);

#endif
