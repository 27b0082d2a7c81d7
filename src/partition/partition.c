/*
 * partition — where an entry belongs, and Import/Drop; see
 * include/drey/partition.h.
 *
 * A cluster node's store keeps each partition's entries in tables of their
 * own (drey_store_set_partitions, at join), so Import's replace and Drop
 * cost the partition's entries. A record whose partition count is not the
 * store's (replayed before the node joined, or on a standalone node) walks
 * the whole store instead, computing each entry's partition.
 *
 * A Drop names the epoch at which its node stopped holding the partition,
 * and each partition remembers the newest epoch it was imported at (in
 * memory, rebuilt by replay, as the Imports are journaled): a Drop older
 * than an Import applied before it removes nothing, live and on replay.
 * The partition came back to this node in between, and the copy that came
 * is the one to keep.
 */
#include "drey/partition.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/commit.h"
#include "drey/internal/v1/move.pb-c.h"
#include "drey/placement.h"

uint32_t drey_partition_of_entry(const char *cache, size_t cache_len, const char *key, size_t key_len, uint32_t n) {
    size_t ol = sizeof DREY_COMMIT_OUTCOME_CACHE - 1;
    if (cache_len != ol || memcmp(cache, DREY_COMMIT_OUTCOME_CACHE, ol) != 0)
        return drey_placement_partition(cache, cache_len, key, key_len, n);
    /* principal NUL request_id NUL cache SEPARATOR key */
    const char *p = memchr(key, '\0', key_len);
    const char *scope = p != NULL ? memchr(p + 1, '\0', key_len - (size_t)(p + 1 - key)) : NULL;
    if (scope == NULL)
        return DREY_PARTITION_NONE;
    scope++;
    size_t sl = key_len - (size_t)(scope - key);
    const char *sep = memchr(scope, DREY_COMMIT_SCOPE_SEPARATOR, sl);
    if (sep == NULL)
        return DREY_PARTITION_NONE;
    return drey_placement_partition(scope, (size_t)(sep - scope), sep + 1, sl - (size_t)(sep - scope) - 1, n);
}

bool drey_partition_index(drey_store *s, uint32_t n) {
    return drey_store_set_partitions(s, n, drey_partition_of_entry);
}

/* --- finding a partition's keys (a store not partitioned as the record) ------- */

typedef struct collect {
    drey_arena *arena;
    uint32_t partition, n;
    bool (*only)(void *arg, const drey_store_item *it); /* NULL: every entry of the partition */
    void *only_arg;
    drey_key *keys;
    size_t len, cap;
    drey_store *store;
} collect;

static void collect_item(void *arg, const drey_store_item *it) {
    collect *c = arg;
    if (drey_partition_of_entry(it->cache, it->cache_len, it->key, it->key_len, c->n) != c->partition ||
        (c->only != NULL && !c->only(c->only_arg, it)))
        return;
    if (c->len == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 64;
        drey_key *k = drey_arena_alloc(c->arena, cap * sizeof *k);
        if (c->len > 0)
            memcpy(k, c->keys, c->len * sizeof *k);
        c->keys = k;
        c->cap = cap;
    }
    char *data = drey_arena_alloc(c->arena, it->cache_len + it->key_len + 1);
    memcpy(data, it->cache, it->cache_len);
    memcpy(data + it->cache_len, it->key, it->key_len);
    drey_store_key(c->store, &c->keys[c->len++], data, it->cache_len, data + it->cache_len, it->key_len);
}

static size_t remove_keys(drey_store *s, const drey_key *keys, size_t n) {
    size_t removed = 0;
    for (size_t i = 0; i < n; i++) {
        drey_store_txn t;
        drey_store_txn_begin(s, &t, &keys[i], 1);
        removed += drey_store_txn_remove(&t, &keys[i]);
        drey_store_txn_end(&t);
    }
    return removed;
}

/* The partition's entries (those only() keeps) found by walking the whole
 * store: a record whose partition count is not the store's. */
static size_t walk_remove(drey_store *s, uint32_t partition, uint32_t n, int64_t now_ms, drey_arena *a,
                          bool (*only)(void *arg, const drey_store_item *it), void *only_arg) {
    size_t removed = 0;
    for (size_t sh = 0; sh < DREY_STORE_SHARDS; sh++) {
        /* Collected under the shard's read lock, removed after it. */
        collect c = {.arena = a, .partition = partition, .n = n, .store = s, .only = only, .only_arg = only_arg};
        drey_store_walk_shard(s, sh, now_ms, collect_item, &c);
        removed += remove_keys(s, c.keys, c.len);
    }
    return removed;
}

/* Removes every entry of the partition; how many there were. */
static size_t drop(drey_store *s, uint32_t partition, uint32_t n, int64_t now_ms, drey_arena *a) {
    if (drey_store_partitions(s) == n)
        return drey_store_partition_remove(s, partition, now_ms);
    return walk_remove(s, partition, n, now_ms, a, NULL, NULL);
}

/* --- the writes ---------------------------------------------------------------- */

static bool well_formed(drey_apply *ax, uint32_t partition, uint32_t n) {
    if (n > 0 && partition < n)
        return true;
    drey_status_set(ax->status, DREY_ERR_MALFORMED_REQUEST);
    return false;
}

/* Empty bytes decode as NULL: the store wants pointers it may copy from. */
static const void *bytes_of(const ProtobufCBinaryData *b) {
    return b->data != NULL ? (const void *)b->data : "";
}

static void key_of(drey_store *s, drey_key *k, const Drey__Internal__V1__MovedEntry *e) {
    drey_store_key(s, k, bytes_of(&e->cache), e->cache.len, bytes_of(&e->key), e->key.len);
}

/* The store and, per partition, the newest epoch an Import was applied at.
 * Writes apply one at a time in journal order (the commit's order), live
 * and on replay; the lock is for the readers that are not writes. */
struct drey_partition {
    drey_store *store;
    pthread_mutex_t mu;
    int64_t *imported; /* n; NULL until the first Import */
    uint32_t n;
};
typedef drey_partition partitions;

static void note_import(partitions *ps, uint32_t p, uint32_t n, int64_t epoch) {
    pthread_mutex_lock(&ps->mu);
    if (ps->n != n) {
        free(ps->imported);
        ps->imported = drey_xcalloc(n, sizeof *ps->imported);
        ps->n = n;
    }
    if (epoch > ps->imported[p])
        ps->imported[p] = epoch;
    pthread_mutex_unlock(&ps->mu);
}

static int64_t imported_at(partitions *ps, uint32_t p, uint32_t n) {
    pthread_mutex_lock(&ps->mu);
    int64_t e = ps->n == n ? ps->imported[p] : 0;
    pthread_mutex_unlock(&ps->mu);
    return e;
}

static ProtobufCMessage *import_apply(void *ctx, drey_apply *ax, const ProtobufCMessage *msg) {
    partitions *ps = ctx;
    drey_store *s = ps->store;
    const Drey__Internal__V1__ImportRequest *req = (const void *)msg;
    if (!well_formed(ax, req->partition, req->partitions))
        return NULL;
    note_import(ps, req->partition, req->partitions, req->epoch);
    if (req->replace)
        drop(s, req->partition, req->partitions, ax->now_ms, ax->arena);
    for (size_t i = 0; i < req->n_removed; i++) {
        drey_key k;
        key_of(s, &k, req->removed[i]);
        remove_keys(s, &k, 1);
    }
    for (size_t i = 0; i < req->n_entries; i++) {
        const Drey__Internal__V1__MovedEntry *e = req->entries[i];
        drey_key k;
        key_of(s, &k, e);
        drey_value v = {.kind = (drey_value_kind)e->kind, .data = bytes_of(&e->value), .len = (uint32_t)e->value.len};
        drey_store_txn t;
        drey_store_txn_begin(s, &t, &k, 1);
        t.tenant = drey_store_tenant_id(s, e->tenant, strlen(e->tenant)); /* as it was on the old copy */
        drey_store_txn_put(&t, &k, &v, e->expires_at_ms, e->version);
        drey_store_txn_end(&t);
    }
    drey_store_raise_version(s, req->min_version);
    Drey__Internal__V1__ImportResponse *resp = drey_arena_alloc(ax->arena, sizeof *resp);
    drey__internal__v1__import_response__init(resp);
    resp->entries = req->n_entries;
    return &resp->base;
}

/* What an import adds, counted as if nothing it replaces were there. */
static int64_t import_growth(void *ctx, const ProtobufCMessage *msg, int64_t now_ms) {
    (void)ctx;
    (void)now_ms;
    const Drey__Internal__V1__ImportRequest *req = (const void *)msg;
    int64_t bytes = 0;
    for (size_t i = 0; i < req->n_entries; i++) {
        const Drey__Internal__V1__MovedEntry *e = req->entries[i];
        bytes += (int64_t)drey_store_entry_bytes(e->cache.len, e->key.len, e->value.len);
    }
    return bytes;
}

static uint64_t import_versions(const ProtobufCMessage *msg) {
    return ((const Drey__Internal__V1__ImportRequest *)msg)->min_version;
}

/* Drop's and Clear's answer: how many entries went (their only field). */
static ProtobufCMessage *entries_removed(drey_apply *ax, const ProtobufCMessageDescriptor *d, uint64_t n) {
    ProtobufCMessage *m = drey_arena_alloc(ax->arena, d->sizeof_message);
    protobuf_c_message_init(d, m);
    *(uint64_t *)(void *)((char *)m + d->fields[0].offset) = n;
    return m;
}

static ProtobufCMessage *drop_apply(void *ctx, drey_apply *ax, const ProtobufCMessage *msg) {
    partitions *ps = ctx;
    const Drey__Internal__V1__DropRequest *req = (const void *)msg;
    if (!well_formed(ax, req->partition, req->partitions))
        return NULL;
    bool newer_copy = imported_at(ps, req->partition, req->partitions) > req->epoch;
    uint64_t n = newer_copy ? 0 : drop(ps->store, req->partition, req->partitions, ax->now_ms, ax->arena);
    return entries_removed(ax, &drey__internal__v1__drop_response__descriptor, n);
}

static bool in_cache(void *arg, const drey_store_item *it) {
    const ProtobufCMessage *m = arg;
    const char *cache = ((const Drey__Internal__V1__PartitionClearRequest *)(const void *)m)->cache;
    size_t len = strlen(cache);
    if (strcmp(cache, "default") == 0) /* the store's name for it, as it walks: "" */
        len = 0;
    return it->cache_len == len && memcmp(it->cache, cache, len) == 0;
}

static ProtobufCMessage *clear_apply(void *ctx, drey_apply *ax, const ProtobufCMessage *msg) {
    partitions *ps = ctx;
    const Drey__Internal__V1__PartitionClearRequest *req = (const void *)msg;
    if (!well_formed(ax, req->partition, req->partitions))
        return NULL;
    uint64_t n = drey_store_partitions(ps->store) == req->partitions
                     ? drey_store_partition_clear_cache(ps->store, req->partition, req->cache, strlen(req->cache),
                                                        ax->now_ms)
                     : walk_remove(ps->store, req->partition, req->partitions, ax->now_ms, ax->arena, in_cache,
                                   (void *)msg);
    return entries_removed(ax, &drey__internal__v1__partition_clear_response__descriptor, n);
}

drey_partition *drey_partition_create(drey_store *s) {
    partitions *ps = drey_xcalloc(1, sizeof *ps);
    ps->store = s;
    pthread_mutex_init(&ps->mu, NULL);
    return ps;
}

void drey_partition_destroy(drey_partition *ps) {
    if (ps == NULL)
        return;
    pthread_mutex_destroy(&ps->mu);
    free(ps->imported);
    free(ps);
}

bool drey_partition_register(drey_method_table *t, drey_partition *ps) {
    const drey_method_spec specs[] = {
        {.name = "Import", .route = DREY_ROUTE_PEER, .flags = DREY_METHOD_WRITE | DREY_METHOD_PEER, .apply = import_apply,
         .growth = import_growth, .versions_brought = import_versions},
        {.name = "Drop", .route = DREY_ROUTE_PEER, .flags = DREY_METHOD_WRITE | DREY_METHOD_PEER, .apply = drop_apply},
        {.name = "Clear", .route = DREY_ROUTE_PARTITION, .flags = DREY_METHOD_WRITE | DREY_METHOD_PEER,
         .apply = clear_apply},
    };
    return drey_method_table_add_service(t, &drey__internal__v1__partitions__descriptor, specs,
                                         sizeof specs / sizeof specs[0], ps);
}
