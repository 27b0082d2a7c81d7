/*
 * store — the sharded in-memory table.
 *
 * Entries live in chained hash tables guarded by 256 rwlocks (stripes): a
 * read locks one stripe for reading, so reads never wait behind writes to
 * other stripes and there is no global lock on the read path. A standalone
 * store has 256 tables, one per stripe ("shards"). A cluster node's store
 * is partitioned (drey_store_set_partitions): each partition's entries
 * have tables of their own, as Redis Cluster keeps a dict per slot, so a
 * partition's walk, removal and figures cost its entries only. An entry is
 * one allocation holding its header, cache name, key and value.
 *
 * Expiry is absolute wall-clock milliseconds (0 = never). Every operation is
 * given `now_ms`; an entry with expires_at_ms <= now_ms is invisible to it.
 * drey_store_sweep() frees expired entries nobody reads.
 *
 * Writes go through a transaction that write-locks the stripes of all its
 * keys in ascending order, so a batch is applied atomically and two batches never
 * deadlock.
 *
 * Caches: every entry counts in its cache's figures (entries, bytes,
 * evictions), kept as entries come and go, so the figures cost nothing to
 * read. Clearing a cache is O(stripes): its entries become invisible at once
 * and are freed by the expiry sweep in bounded steps, their bytes counted
 * until they are.
 *
 * Eviction: with a policy in force, entries record their last access or an
 * approximate access frequency, and drey_store_evict_choose() picks victims
 * the way Redis does (sampled candidates feeding a small pool of the best).
 */
#ifndef DREY_STORE_H
#define DREY_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DREY_STORE_SHARDS 256

/* Value kinds; the numbers are drey.cache.v1.Value's oneof field numbers. */
typedef enum drey_value_kind {
    DREY_VALUE_BYTES = 1,
    DREY_VALUE_STRING = 2,
    DREY_VALUE_INT64 = 3,
    DREY_VALUE_DOUBLE = 4,
    DREY_VALUE_BOOL = 5,
    DREY_VALUE_JSON = 6, /* a serialized google.protobuf.Struct */
    DREY_VALUE_NULL = 7,
} drey_value_kind;

/* A value as stored: int64 and double as 8 little-endian bytes, bool as one
 * byte, null as none. */
typedef struct drey_value {
    drey_value_kind kind;
    const uint8_t *data;
    uint32_t len;
} drey_value;

typedef struct drey_key {
    const char *cache; /* "" is the default cache */
    size_t cache_len;
    const char *key;
    size_t key_len;
    uint64_t hash;     /* set by drey_store_key() */
    uint32_t table;    /* set by drey_store_key(): the table it lives in */
} drey_key;

/* What a reader sees of a live entry; pointers are valid only while the
 * shard is locked (inside the callback or the transaction). */
typedef struct drey_entry_view {
    drey_value value;
    uint64_t version;
    int64_t expires_at_ms; /* 0 = never */
    uint32_t tenant;       /* whose write stored it (drey_store_tenant_name); 0: none */
} drey_entry_view;

typedef struct drey_store drey_store;

/* An entry as scans, eviction and snapshots see it (defined below). */
typedef struct drey_store_item drey_store_item;

/* What --eviction chooses; the store never evicts by itself. */
typedef enum drey_evict_policy {
    DREY_EVICT_NONE = 0,
    DREY_EVICT_ALLKEYS_LRU,
    DREY_EVICT_ALLKEYS_LFU,
    DREY_EVICT_VOLATILE_LRU, /* only entries with an expiry */
    DREY_EVICT_VOLATILE_TTL, /* only entries with an expiry, soonest first */
} drey_evict_policy;

/* "none", "allkeys-lru", ...; parse returns false for anything else. */
const char *drey_evict_policy_name(drey_evict_policy p);
bool drey_evict_policy_parse(const char *s, drey_evict_policy *out);

typedef struct drey_store_stats {
    uint64_t entries;       /* including expired entries not yet swept */
    uint64_t bytes;         /* accounted bytes, see drey_store_entry_bytes() */
    uint64_t buckets;       /* hash slots across shards */
    uint64_t expired_swept; /* entries freed by the expiry sweep, ever */
    uint64_t expiring;      /* entries with an expiry (expired or not) */
    uint64_t clearing;      /* entries of cleared caches not yet freed */
    uint64_t evictions;     /* entries evicted, ever */
    uint64_t evicted_bytes;
} drey_store_stats;

drey_store *drey_store_create(void);
void drey_store_destroy(drey_store *s);

/* Normalizes the cache name ("default" and "" are the same cache) and hashes
 * the key with the store's random seed (hash flooding needs the seed). On a
 * partitioned store it also finds the key's partition. A key is good for
 * the layout it was made under: make none before drey_store_set_partitions()
 * that is used after it. */
void drey_store_key(const drey_store *s, drey_key *k, const char *cache, size_t cache_len, const char *key,
                    size_t key_len);

/* Bytes accounted for an entry: its allocation plus its share of the bucket
 * array. The same figure is added on insert and removed on delete, so the
 * total is exact. */
size_t drey_store_entry_bytes(size_t cache_len, size_t key_len, size_t value_len);

/* Calls fn under the shard's read lock if the key is live; returns found. */
bool drey_store_read(drey_store *s, const drey_key *k, int64_t now_ms,
                     void (*fn)(void *arg, const drey_entry_view *e), void *arg);

/* Versions: increasing per node, never reused. */
uint64_t drey_store_next_version(drey_store *s);
uint64_t drey_store_last_version(const drey_store *s);
void drey_store_raise_version(drey_store *s, uint64_t at_least);
/* Takes n consecutive versions at once (n > 0); returns the first. */
uint64_t drey_store_reserve_versions(drey_store *s, size_t n);
/* Gives back the reservation (first, n) if nothing was taken since, so a
 * write refused before anyone saw its versions leaves no trace; false (a
 * gap, harmless) otherwise. */
bool drey_store_unreserve_versions(drey_store *s, uint64_t first, size_t n);

typedef struct drey_store_txn {
    drey_store *store;
    uint64_t locked[DREY_STORE_SHARDS / 64]; /* bitmap of write-locked stripes */
    /* The tenant the entries this transaction puts belong to (0: none); 0
     * after begin, set by the caller (the write's tenant, drey_apply). */
    uint32_t tenant;
    /* A backup applying its primary's record (false after begin): its
     * evictions count in the store's figures, not in the cache's, which
     * the primary's count once for the cluster's whole-cache figures. */
    bool copy;
} drey_store_txn;

void drey_store_txn_begin(drey_store *s, drey_store_txn *t, const drey_key *keys, size_t n);
void drey_store_txn_end(drey_store_txn *t);

/* The live entry, or false. An expired entry found here is freed. */
bool drey_store_txn_get(drey_store_txn *t, const drey_key *k, int64_t now_ms, drey_entry_view *out);
/* Inserts or replaces; v may point into the entry it replaces. */
void drey_store_txn_put(drey_store_txn *t, const drey_key *k, const drey_value *v, int64_t expires_at_ms,
                        uint64_t version);
/* Changes the expiry of an existing entry; false if there is none. */
bool drey_store_txn_set_expiry(drey_store_txn *t, const drey_key *k, int64_t expires_at_ms);
bool drey_store_txn_remove(drey_store_txn *t, const drey_key *k);

/* One active-expiry step (Redis's active expire cycle): walks up to
 * `max_buckets` buckets from a rotating cursor, freeing expired entries
 * and entries of cleared caches. Returns how many entries it examined;
 * *expired is incremented by how many it freed (both kinds). A table
 * without an entry that has an expiry is passed over without being locked. */
size_t drey_store_sweep(drey_store *s, int64_t now_ms, size_t max_buckets, size_t *expired);

void drey_store_get_stats(drey_store *s, drey_store_stats *out);

/* --- caches ---------------------------------------------------------------- */

typedef struct drey_cache_stats {
    const char *cache; /* "" is the default cache; valid during the callback */
    size_t cache_len;
    uint64_t entries;  /* including expired entries not yet swept */
    uint64_t bytes;
    uint64_t expiring;
    uint64_t evictions, evicted_bytes;
} drey_cache_stats;

/* One cache's figures; zero for a cache that holds nothing. */
void drey_store_cache_stats(drey_store *s, const char *cache, size_t cache_len, drey_cache_stats *out);
/* Calls fn for every cache holding entries (internal caches, whose names
 * start with '#', included: callers filter). Holds the registry lock:
 * fn must not call into the store. */
/* Whether a write may put an entry in the cache: it has entries already, or
 * fewer than limit caches do. */
bool drey_store_cache_admits(drey_store *s, const char *cache, size_t len, uint32_t limit);

void drey_store_list_caches(drey_store *s, void (*fn)(void *arg, const drey_cache_stats *c), void *arg);

/* Removes every entry of the cache at once (readers see all of it or none),
 * returning how many entries it held. Their memory is freed by
 * drey_store_sweep(); until then drey_store_bytes() still counts it. */
uint64_t drey_store_clear_cache(drey_store *s, const char *cache, size_t cache_len);

/* --- scans -------------------------------------------------------------------
 *
 * A scan walks one cache's entries table by table; within a table it visits
 * buckets in reverse-binary order (Redis's SCAN), so a key present for the
 * whole scan is returned at least once even if the table grows or shrinks
 * between pages. The position is meaningful only with the same hash seed
 * (see drey_store_tag) and the same partition count. */

#define DREY_STORE_SCAN_DONE UINT32_MAX

typedef struct drey_store_scan_pos {
    uint32_t shard;  /* the table; DREY_STORE_SCAN_DONE: done */
    uint32_t bucket; /* reverse-binary cursor within the table */
} drey_store_scan_pos;

/* Whether pos is a position of this store's scans (a cursor a client sends
 * back may name a table the store does not have). */
bool drey_store_scan_pos_valid(const drey_store *s, const drey_store_scan_pos *pos);

/* Continues the scan at *pos, calling fn with the table locked for each live
 * entry of the cache whose key starts with prefix; stops after `limit`
 * entries (more only when more share one bucket) or `max_buckets` buckets.
 * Returns the entries delivered; pos->shard == DREY_STORE_SCAN_DONE when
 * done. */
size_t drey_store_scan(drey_store *s, const char *cache, size_t cache_len, const char *prefix, size_t prefix_len,
                       int64_t now_ms, drey_store_scan_pos *pos, size_t limit, size_t max_buckets,
                       void (*fn)(void *arg, const drey_store_item *item), void *arg);

/* Calls fn, with the stripe read-locked, for every live entry of the tables
 * of one stripe (0 .. DREY_STORE_SHARDS-1), internal caches included: a walk
 * of the whole store a stripe at a time. */
void drey_store_walk_shard(drey_store *s, size_t shard, int64_t now_ms,
                           void (*fn)(void *arg, const drey_store_item *item), void *arg);

/* --- partitions ---------------------------------------------------------------
 *
 * A cluster node tells its store the partition count and the function that
 * places an entry (drey_partition_of_entry); from then on each partition's
 * entries live in tables of their own (Hazelcast's partition containers,
 * Redis Cluster's dict per slot), a few per partition when there are fewer
 * than 256 partitions so that locking stays as fine as a standalone
 * store's. A partition's walk, removal and figures then cost its own
 * entries, not the store's, and nothing is added to an entry: a key's
 * partition is found once, when drey_store_key() picks its table.
 *
 * Locking: a table is guarded by stripe (table % 256), like any table. A
 * walk step read-locks one table's stripe and releases it before it
 * returns; a removal write-locks one table's stripe at a time; the figures
 * read-lock the partition's stripes together (ascending, as transactions
 * do). Lock order, everywhere: the eviction pool, then stripes (ascending),
 * then the cache registry. */

/* Where an entry belongs: a partition below n, or anything else for none
 * (those entries form a group of their own, partition n). Called with
 * the cache name normalized ("" for the default cache); a pure function. */
typedef uint32_t (*drey_store_partition_fn)(const char *cache, size_t cache_len, const char *key, size_t key_len,
                                            uint32_t n);

#define DREY_STORE_MAX_PARTITIONS 65536

/* Keeps entries per partition from now on: moves every entry present into
 * its partition's tables, with every stripe write-locked (0.3 to 0.5 s per
 * million entries, tests/bench/store_memory; a node does it once, at join,
 * before it serves). Keys
 * made before are stale (see drey_store_key). Calling it again with the
 * same n and fn changes nothing. False, and nothing changed, for n = 0 or
 * n > DREY_STORE_MAX_PARTITIONS. */
bool drey_store_set_partitions(drey_store *s, uint32_t n, drey_store_partition_fn fn);
/* The partition count; 0 for a store that is not partitioned. */
uint32_t drey_store_partitions(const drey_store *s);

/* Continues a walk of partition p (p == n: the entries of no partition) at
 * *pos (start at {0, 0}), calling fn with the entry's stripe read-locked
 * for each live entry, internal caches included; stops after about `limit`
 * entries (more only when more share one bucket) or 8 x limit buckets, and
 * holds no lock when it returns. Returns the entries delivered (0 is
 * possible before the end); pos->shard == DREY_STORE_SCAN_DONE when done.
 * Scan's promise holds while writes go on between steps: an entry present
 * for the whole walk is delivered at least once. fn must not call into the
 * store. */
size_t drey_store_partition_walk(drey_store *s, uint32_t p, int64_t now_ms, drey_store_scan_pos *pos, size_t limit,
                                 void (*fn)(void *arg, const drey_store_item *item), void *arg);

/* Removes every entry of partition p, expired ones and those of cleared
 * caches included, one table at a time; returns how many of them were
 * live. The observer hears REMOVE for each live one and EXPIRE for each
 * expired one, as if each had been removed or swept. A store that is not
 * partitioned, or p > n: nothing, 0. */
uint64_t drey_store_partition_remove(drey_store *s, uint32_t p, int64_t now_ms);

/* Removes one cache's entries of partition p (a cluster's Clear, one
 * partition at a time, so that each is ordered with that partition's
 * writes on every copy), with p's tables locked together; the observer
 * hears one CLEAR of the cache. Returns how many were live. A store that is
 * not partitioned, or p > n: nothing, 0. */
uint64_t drey_store_partition_clear_cache(drey_store *s, uint32_t p, const char *cache, size_t cache_len,
                                          int64_t now_ms);

/* A partition's figures, kept as entries come and go (O(tables of p) to
 * read): entries including expired ones not yet swept and those of
 * cleared caches not yet freed, as drey_store_get_stats counts them. */
typedef struct drey_store_partition_stats {
    uint64_t entries;
    uint64_t bytes;
    uint64_t expiring;
} drey_store_partition_stats;

void drey_store_get_partition_stats(drey_store *s, uint32_t p, drey_store_partition_stats *out);
/* One cache's figures within partition p (evictions are the node's, not a
 * partition's: zero here); zero for a cache that has nothing there. */
void drey_store_partition_cache_stats(drey_store *s, uint32_t p, const char *cache, size_t cache_len,
                                      drey_cache_stats *out);
/* Calls fn for every cache with entries in partition p (cleared caches
 * not), with p's stripes and the registry locked: fn must not call into the
 * store. */
void drey_store_partition_list_caches(drey_store *s, uint32_t p, void (*fn)(void *arg, const drey_cache_stats *c),
                                      void *arg);

/* A keyed hash of data under the store's hash seed: a tag that only this
 * seed produces (scan cursors carry one, so a cursor from another seed or
 * an altered one is told apart from a valid position). */
uint64_t drey_store_tag(const drey_store *s, const void *data, size_t len);
/* The random hash seed, and replacing it (a durable node keeps its seed in
 * its data directory): only while the store is empty. */
void drey_store_get_seed(const drey_store *s, uint8_t out[16]);
void drey_store_set_seed(drey_store *s, const uint8_t seed[16]);

/* --- eviction ---------------------------------------------------------------- */

/* Sets the policy before the store is used (reads then track accesses). */
void drey_store_set_policy(drey_store *s, drey_evict_policy p);
drey_evict_policy drey_store_policy(const drey_store *s);

/* Chooses entries to evict until their bytes reach need_bytes or max_victims
 * were chosen, calling fn for each (item valid during the call). Returns the
 * bytes chosen; less than need_bytes when nothing more is evictable under
 * the policy. Nothing is removed: the caller journals the choice and removes
 * the victims with drey_store_txn_evict(). Internal caches ('#...') are
 * never chosen, nor entries `only` says no to (NULL: any may be). */
typedef struct drey_store_filter {
    bool (*keep)(void *ctx, const char *cache, size_t cache_len, const char *key, size_t key_len);
    void *ctx;
    uint32_t tenant; /* only this tenant's entries; 0: any */
} drey_store_filter;

int64_t drey_store_evict_choose(drey_store *s, int64_t now_ms, int64_t need_bytes, size_t max_victims,
                                const drey_store_filter *only,
                                void (*fn)(void *arg, const drey_store_item *victim, size_t bytes), void *arg);

/* An entry chosen for eviction, as a write's journal record names it. */
typedef struct drey_store_victim {
    const char *cache; /* normalized: "" is the default cache */
    size_t cache_len;
    const char *key;
    size_t key_len;
    uint64_t version;  /* removed only if the entry still has it */
} drey_store_victim;

/* Removes the key's entry if it still has `version` (a victim chosen
 * earlier), counting it as evicted; returns its accounted bytes, 0 if it
 * was not removed. */
size_t drey_store_txn_evict(drey_store_txn *t, const drey_key *k, uint64_t version);

/* Accounted bytes of all entries, kept as a running total: O(1). */
int64_t drey_store_bytes(const drey_store *s);
/* Accounted bytes of the key's live entry; 0 if there is none. */
size_t drey_store_entry_size(drey_store *s, const drey_key *k, int64_t now_ms);

/* --- snapshots ------------------------------------------------------------
 *
 * A capture copies the table as of one instant without stopping it: begin
 * marks every shard (here: a stripe, with all its tables), the first change
 * to a marked shard (a write, an expiry) first hands the shard's entries to
 * the capture callback, and the snapshotting thread hands over the shards
 * nobody touched. Each shard is delivered exactly once, holding its lock
 * for the copy only. */

typedef struct drey_store_item {
    const char *cache;
    size_t cache_len;
    const char *key;
    size_t key_len;
    drey_entry_view entry;
    uint32_t tenant; /* the entry's tenant (drey_store_tenant_name); 0: none */
    /* An entry read from a file or a message (a snapshot) names its tenant
     * instead (tenant 0 then); the store's own items leave it empty. */
    const char *tenant_name;
    size_t tenant_name_len;
} drey_store_item;

/* Called with the shard locked, for every entry of the shard live at the
 * capture's time, then once with item NULL: the shard is complete. */
typedef void (*drey_store_capture_fn)(void *ctx, size_t shard, const drey_store_item *item);

/* Starts a capture. The caller guarantees no write transaction is open (it
 * runs between journal batches). */
void drey_store_capture_begin(drey_store *s, drey_store_capture_fn fn, void *ctx, int64_t live_at_ms);
/* Delivers the shard now if nobody has yet. */
void drey_store_capture_shard(drey_store *s, size_t shard);
/* Ends the capture once every shard was delivered. */
void drey_store_capture_end(drey_store *s);

/* --- changes ----------------------------------------------------------------
 *
 * An observer hears of every change to an entry of a client cache (internal
 * '#' caches never): a value stored, a key removed, an entry expired and
 * freed (by the sweep or by a write finding it), evicted, a cache cleared.
 * It is called with the key's shard write-locked (every shard for a clear),
 * so one key's changes reach it in the order they were applied, and it must
 * not call into the store. Snapshot loads, drey_store_clear() and changes
 * of expiry (Touch, Persist) are not reported, nor are the entries of a
 * cleared cache as the sweep frees them (the clear said it). */

typedef enum drey_store_change_kind {
    DREY_STORE_CHANGE_SET = 1,
    DREY_STORE_CHANGE_REMOVE,
    DREY_STORE_CHANGE_EXPIRE,
    DREY_STORE_CHANGE_EVICT,
    DREY_STORE_CHANGE_CLEAR,
} drey_store_change_kind;

typedef struct drey_store_change {
    drey_store_change_kind kind;
    const char *cache; /* normalized: "" is the default cache */
    size_t cache_len;
    const char *key;   /* CLEAR: NULL */
    size_t key_len;
    drey_value value;  /* SET; valid during the call */
    uint64_t version;  /* SET: the new one; else the version that went */
    int64_t expires_at_ms;
} drey_store_change;

typedef struct drey_store_observer {
    void (*fn)(void *ctx, const drey_store_change *c);
    void *ctx;
} drey_store_observer;

/* Installs (o) or removes (NULL) the observer; o must outlive its use. A
 * durable node installs it after recovery, so replayed writes are never
 * reported. With none, a change costs one atomic load. */
void drey_store_set_observer(drey_store *s, const drey_store_observer *o);

/* --- tenants ------------------------------------------------------------------
 *
 * An entry may belong to a tenant: the one whose write created or last
 * replaced it (drey_store_txn.tenant), a small number the tenant table
 * hands out. The store keeps no table of tenants: it reports every change
 * of a tenant's entries' accounted bytes (stored, replaced, removed,
 * expired, evicted, swept) to the accountant, and asks it for names and
 * numbers (snapshots, journal replay, moves carry names). */

typedef struct drey_store_tenants {
    /* delta bytes for tenant (never 0), of the entry (cache, key); called
     * with the entry's shard write-locked: no store call, no blocking. */
    void (*account)(void *ctx, uint32_t tenant, const char *cache, size_t cache_len, const char *key, size_t key_len,
                    int64_t delta);
    /* The number of a tenant name (0 for ""), and the name of a number. */
    uint32_t (*intern)(void *ctx, const char *name, size_t len);
    const char *(*name)(void *ctx, uint32_t tenant, size_t *len);
    void *ctx;
} drey_store_tenants;

/* Before the store is used. */
void drey_store_set_tenants(drey_store *s, const drey_store_tenants *t);
/* 0 for "" or without an accountant. */
uint32_t drey_store_tenant_id(drey_store *s, const char *name, size_t len);
/* "" for 0 or without an accountant. */
const char *drey_store_tenant_name(drey_store *s, uint32_t tenant, size_t *len);
/* Accounted bytes and tenant of the key's live entry (0, 0: none). */
size_t drey_store_entry_size_tenant(drey_store *s, const drey_key *k, int64_t now_ms, uint32_t *tenant);

/* Removes every entry (recovery starting over from an older snapshot). */
void drey_store_clear(drey_store *s);

/* Sizes the table for about n entries (recovery knows how many come). */
void drey_store_reserve(drey_store *s, size_t n);

/* Inserts an entry as recovery read it from a snapshot: no version is
 * consumed, and the key must not be in the store yet (a snapshot's keys are
 * unique), so it is not looked up. */
void drey_store_load(drey_store *s, const drey_store_item *item);

#endif
