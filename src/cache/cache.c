/*
 * cache — drey.cache.v1.Cache handlers; see include/drey/cache.h.
 *
 * Conditions (if_version) compare against the live entry's version, where an
 * absent key has version 0: if_version 0 means "only if absent". Versions come
 * from the store's counter and are consumed only by writes that change a
 * value; Touch and Persist change the expiry and keep the version.
 */
#include "drey/cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/cache/v1/cache.pb-c.h"
#include "drey/clock.h"
#include "drey/log.h"
#include "drey/thread.h"
#include "value.h"

struct drey_cache {
    drey_store *store;
    pthread_t expiry_thread;
    bool expiry_running;
    int64_t expiry_interval_ms;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool stopping;
    int64_t (*horizon)(void *ctx, int64_t now_ms);
    void *horizon_ctx;
};

static drey_store *store_of(void *ctx) {
    return ((drey_cache *)ctx)->store;
}

static void make_key(drey_store *s, drey_key *k, const char *cache, const char *key) {
    drey_store_key(s, k, cache, strlen(cache), key, strlen(key));
}

static bool condition_holds(bool live, const drey_entry_view *e, bool has_condition, uint64_t if_version) {
    if (!has_condition)
        return true;
    return live ? e->version == if_version : if_version == 0;
}

static void *version_mismatch(drey_apply *ax, bool live, const drey_entry_view *e) {
    drey_status_set(ax->status, DREY_ERR_VERSION_MISMATCH);
    drey_status_add_metadata(ax->status, "currentVersion", "%llu", live ? (unsigned long long)e->version : 0ULL);
    return NULL;
}

/* A write's expiration choice; the generated enum names differ per message
 * (PREFIX), the fields do not. */
#define EXPIRY_OF(req, PREFIX)                                                                                      \
    ((drey_cache__expiry){                                                                                         \
        .ttl = (req)->expiration_case == PREFIX##_TTL ? (req)->ttl : NULL,                                         \
        .expires_at = (req)->expiration_case == PREFIX##_EXPIRES_AT ? (req)->expires_at : NULL,                    \
    })

/* The one-key write: the key's shard locked and its live entry, if any. */
typedef struct one_key {
    drey_store *store;
    drey_key key;
    drey_store_txn txn;
    drey_entry_view entry;
    bool live;
} one_key;

static void one_key_begin(one_key *o, void *ctx, const char *cache, const char *key, const drey_apply *ax) {
    o->store = store_of(ctx);
    make_key(o->store, &o->key, cache, key);
    drey_store_txn_begin(o->store, &o->txn, &o->key, 1);
    o->txn.tenant = ax->tenant; /* what it stores is the writer's tenant's */
    o->live = drey_store_txn_get(&o->txn, &o->key, ax->now_ms, &o->entry);
}

static void one_key_end(one_key *o) {
    drey_store_txn_end(&o->txn);
}

/* Ends the transaction with VERSION_MISMATCH unless the condition holds. */
static bool one_key_condition(one_key *o, drey_apply *ax, bool has_condition, uint64_t if_version) {
    if (condition_holds(o->live, &o->entry, has_condition, if_version))
        return true;
    one_key_end(o);
    version_mismatch(ax, o->live, &o->entry);
    return false;
}

/* Stores the value with a new version; returns the version. */
static uint64_t one_key_put(one_key *o, drey_apply *ax, const Drey__Cache__V1__Value *value, int64_t expires_at_ms) {
    drey_value v;
    drey_cache__value_in(value, ax->arena, &v);
    uint64_t version = drey_apply_version(ax, o->store);
    drey_store_txn_put(&o->txn, &o->key, &v, expires_at_ms, version);
    return version;
}

/* --- reads ---------------------------------------------------------------- */

typedef struct read_out {
    drey_arena *arena;
    Drey__Cache__V1__Value *value;
    uint64_t version;
    int64_t expires_at_ms;
} read_out;

static void copy_out(void *arg, const drey_entry_view *e) {
    read_out *o = arg;
    o->value = drey_cache__value_out(o->arena, &e->value);
    o->version = e->version;
    o->expires_at_ms = e->expires_at_ms;
}

static ProtobufCMessage *read_get(void *ctx, drey_apply *ax, const ProtobufCMessage *msg) {
    const Drey__Cache__V1__GetRequest *req = (const void *)msg;
    drey_store *s = store_of(ctx);
    drey_key k;
    make_key(s, &k, req->cache, req->key);
    read_out o = {.arena = ax->arena};
    Drey__Cache__V1__GetResponse *resp = drey_arena_alloc(ax->arena, sizeof *resp);
    drey__cache__v1__get_response__init(resp);
    if (drey_store_read(s, &k, ax->now_ms, copy_out, &o)) {
        resp->found = true;
        resp->value = o.value;
        resp->version = o.version;
        resp->expires_at = drey_cache__timestamp(ax->arena, o.expires_at_ms);
    }
    return &resp->base;
}

static ProtobufCMessage *read_get_many(void *ctx, drey_apply *ax, const ProtobufCMessage *msg) {
    const Drey__Cache__V1__GetManyRequest *req = (const void *)msg;
    drey_store *s = store_of(ctx);
    drey_arena *a = ax->arena;
    Drey__Cache__V1__GetManyResponse *resp = drey_arena_alloc(a, sizeof *resp);
    drey__cache__v1__get_many_response__init(resp);
    resp->n_results = req->n_keys;
    resp->results = drey_arena_alloc(a, (req->n_keys ? req->n_keys : 1) * sizeof *resp->results);
    for (size_t i = 0; i < req->n_keys; i++) {
        Drey__Cache__V1__GetManyResponse__Result *r = drey_arena_alloc(a, sizeof *r);
        drey__cache__v1__get_many_response__result__init(r);
        r->key = req->keys[i];
        drey_key k;
        make_key(s, &k, req->cache, req->keys[i]);
        read_out o = {.arena = a};
        if (drey_store_read(s, &k, ax->now_ms, copy_out, &o)) {
            r->found = true;
            r->value = o.value;
            r->version = o.version;
            r->expires_at = drey_cache__timestamp(a, o.expires_at_ms);
        }
        resp->results[i] = r;
    }
    return &resp->base;
}

static void copy_expiry(void *arg, const drey_entry_view *e) {
    read_out *o = arg;
    o->version = e->version;
    o->expires_at_ms = e->expires_at_ms;
}

static ProtobufCMessage *read_get_expiration(void *ctx, drey_apply *ax, const ProtobufCMessage *msg) {
    const Drey__Cache__V1__GetExpirationRequest *req = (const void *)msg;
    drey_store *s = store_of(ctx);
    drey_key k;
    make_key(s, &k, req->cache, req->key);
    read_out o = {.arena = ax->arena};
    Drey__Cache__V1__GetExpirationResponse *resp = drey_arena_alloc(ax->arena, sizeof *resp);
    drey__cache__v1__get_expiration_response__init(resp);
    if (drey_store_read(s, &k, ax->now_ms, copy_expiry, &o)) {
        resp->found = true;
        if (o.expires_at_ms != 0) {
            resp->has_expiration = true;
            resp->expires_at = drey_cache__timestamp(ax->arena, o.expires_at_ms);
            resp->remaining = drey_cache__duration(ax->arena, o.expires_at_ms - ax->now_ms);
        }
    }
    return &resp->base;
}

/* --- writes --------------------------------------------------------------- */

static ProtobufCMessage *apply_set(void *ctx, drey_apply *ax, const ProtobufCMessage *msg) {
    const Drey__Cache__V1__SetRequest *req = (const void *)msg;
    one_key o;
    one_key_begin(&o, ctx, req->cache, req->key, ax);
    if (!one_key_condition(&o, ax, req->condition_case == DREY__CACHE__V1__SET_REQUEST__CONDITION_IF_VERSION,
                           req->if_version))
        return NULL;
    drey_cache__expiry ex = EXPIRY_OF(req, DREY__CACHE__V1__SET_REQUEST__EXPIRATION);
    ex.persist = req->expiration_case == DREY__CACHE__V1__SET_REQUEST__EXPIRATION_PERSIST;
    int64_t expires = drey_cache__expiry_at(&ex, ax->now_ms, o.live ? o.entry.expires_at_ms : 0);
    Drey__Cache__V1__SetResponse *resp = drey_arena_alloc(ax->arena, sizeof *resp);
    drey__cache__v1__set_response__init(resp);
    resp->version = one_key_put(&o, ax, req->value, expires);
    one_key_end(&o);
    resp->expires_at = drey_cache__timestamp(ax->arena, expires);
    return &resp->base;
}

static ProtobufCMessage *apply_set_many(void *ctx, drey_apply *ax, const ProtobufCMessage *msg) {
    const Drey__Cache__V1__SetManyRequest *req = (const void *)msg;
    drey_store *s = store_of(ctx);
    size_t n = req->n_entries;
    drey_key *keys = drey_arena_alloc(ax->arena, (n ? n : 1) * sizeof *keys);
    for (size_t i = 0; i < n; i++)
        make_key(s, &keys[i], req->cache, req->entries[i]->key);
    drey_store_txn t;
    drey_store_txn_begin(s, &t, keys, n);
    t.tenant = ax->tenant;
    /* Every condition first: the batch applies whole or not at all. The
     * entries' keys are distinct (validation), so checks don't interact. */
    int64_t *keep = drey_arena_alloc(ax->arena, (n ? n : 1) * sizeof *keep);
    for (size_t i = 0; i < n; i++) {
        const Drey__Cache__V1__SetManyRequest__Entry *en = req->entries[i];
        drey_entry_view e;
        bool live = drey_store_txn_get(&t, &keys[i], ax->now_ms, &e);
        keep[i] = live ? e.expires_at_ms : 0;
        if (!condition_holds(live, &e,
                             en->condition_case == DREY__CACHE__V1__SET_MANY_REQUEST__ENTRY__CONDITION_IF_VERSION,
                             en->if_version)) {
            drey_store_txn_end(&t);
            drey_status_add_metadata(ax->status, "entryIndex", "%zu", i);
            return version_mismatch(ax, live, &e);
        }
    }
    Drey__Cache__V1__SetManyResponse *resp = drey_arena_alloc(ax->arena, sizeof *resp);
    drey__cache__v1__set_many_response__init(resp);
    resp->n_results = n;
    resp->results = drey_arena_alloc(ax->arena, (n ? n : 1) * sizeof *resp->results);
    for (size_t i = 0; i < n; i++) {
        const Drey__Cache__V1__SetManyRequest__Entry *en = req->entries[i];
        drey_cache__expiry ex = EXPIRY_OF(en, DREY__CACHE__V1__SET_MANY_REQUEST__ENTRY__EXPIRATION);
        ex.persist = en->expiration_case == DREY__CACHE__V1__SET_MANY_REQUEST__ENTRY__EXPIRATION_PERSIST;
        int64_t expires = drey_cache__expiry_at(&ex, ax->now_ms, keep[i]);
        drey_value v;
        drey_cache__value_in(en->value, ax->arena, &v);
        Drey__Cache__V1__SetResponse *r = drey_arena_alloc(ax->arena, sizeof *r);
        drey__cache__v1__set_response__init(r);
        r->version = drey_apply_version(ax, s);
        drey_store_txn_put(&t, &keys[i], &v, expires, r->version);
        r->expires_at = drey_cache__timestamp(ax->arena, expires);
        resp->results[i] = r;
    }
    drey_store_txn_end(&t);
    return &resp->base;
}

static ProtobufCMessage *apply_add(void *ctx, drey_apply *ax, const ProtobufCMessage *msg) {
    const Drey__Cache__V1__AddRequest *req = (const void *)msg;
    Drey__Cache__V1__AddResponse *resp = drey_arena_alloc(ax->arena, sizeof *resp);
    drey__cache__v1__add_response__init(resp);
    one_key o;
    one_key_begin(&o, ctx, req->cache, req->key, ax);
    if (o.live) {
        resp->version = o.entry.version;
        resp->current_value = drey_cache__value_out(ax->arena, &o.entry.value);
        resp->expires_at = drey_cache__timestamp(ax->arena, o.entry.expires_at_ms);
    } else {
        drey_cache__expiry ex = EXPIRY_OF(req, DREY__CACHE__V1__ADD_REQUEST__EXPIRATION);
        int64_t expires = drey_cache__expiry_at(&ex, ax->now_ms, 0);
        resp->added = true;
        resp->version = one_key_put(&o, ax, req->value, expires);
        resp->expires_at = drey_cache__timestamp(ax->arena, expires);
    }
    one_key_end(&o);
    return &resp->base;
}

static ProtobufCMessage *apply_update(void *ctx, drey_apply *ax, const ProtobufCMessage *msg) {
    const Drey__Cache__V1__UpdateRequest *req = (const void *)msg;
    one_key o;
    one_key_begin(&o, ctx, req->cache, req->key, ax);
    if (!one_key_condition(&o, ax, req->condition_case == DREY__CACHE__V1__UPDATE_REQUEST__CONDITION_IF_VERSION,
                           req->if_version))
        return NULL;
    Drey__Cache__V1__UpdateResponse *resp = drey_arena_alloc(ax->arena, sizeof *resp);
    drey__cache__v1__update_response__init(resp);
    if (o.live) {
        resp->updated = true;
        resp->version = one_key_put(&o, ax, req->value, o.entry.expires_at_ms);
        resp->expires_at = drey_cache__timestamp(ax->arena, o.entry.expires_at_ms);
    }
    one_key_end(&o);
    return &resp->base;
}

static ProtobufCMessage *apply_get_or_add(void *ctx, drey_apply *ax, const ProtobufCMessage *msg) {
    const Drey__Cache__V1__GetOrAddRequest *req = (const void *)msg;
    Drey__Cache__V1__GetOrAddResponse *resp = drey_arena_alloc(ax->arena, sizeof *resp);
    drey__cache__v1__get_or_add_response__init(resp);
    one_key o;
    one_key_begin(&o, ctx, req->cache, req->key, ax);
    if (o.live) {
        resp->value = drey_cache__value_out(ax->arena, &o.entry.value);
        resp->version = o.entry.version;
        resp->expires_at = drey_cache__timestamp(ax->arena, o.entry.expires_at_ms);
    } else {
        drey_cache__expiry ex = EXPIRY_OF(req, DREY__CACHE__V1__GET_OR_ADD_REQUEST__EXPIRATION);
        int64_t expires = drey_cache__expiry_at(&ex, ax->now_ms, 0);
        resp->added = true;
        resp->value = req->value;
        resp->version = one_key_put(&o, ax, req->value, expires);
        resp->expires_at = drey_cache__timestamp(ax->arena, expires);
    }
    one_key_end(&o);
    return &resp->base;
}

static ProtobufCMessage *apply_remove(void *ctx, drey_apply *ax, const ProtobufCMessage *msg) {
    const Drey__Cache__V1__RemoveRequest *req = (const void *)msg;
    one_key o;
    one_key_begin(&o, ctx, req->cache, req->key, ax);
    if (!one_key_condition(&o, ax, req->condition_case == DREY__CACHE__V1__REMOVE_REQUEST__CONDITION_IF_VERSION,
                           req->if_version))
        return NULL;
    Drey__Cache__V1__RemoveResponse *resp = drey_arena_alloc(ax->arena, sizeof *resp);
    drey__cache__v1__remove_response__init(resp);
    if (o.live) {
        resp->removed = true;
        resp->version = o.entry.version;
        if (req->return_previous)
            resp->previous = drey_cache__value_out(ax->arena, &o.entry.value); /* copy before the entry goes */
        drey_store_txn_remove(&o.txn, &o.key);
    }
    one_key_end(&o);
    return &resp->base;
}

static ProtobufCMessage *apply_touch(void *ctx, drey_apply *ax, const ProtobufCMessage *msg) {
    const Drey__Cache__V1__TouchRequest *req = (const void *)msg;
    Drey__Cache__V1__TouchResponse *resp = drey_arena_alloc(ax->arena, sizeof *resp);
    drey__cache__v1__touch_response__init(resp);
    one_key o;
    one_key_begin(&o, ctx, req->cache, req->key, ax);
    if (o.live) {
        drey_cache__expiry ex = {.ttl = req->ttl};
        int64_t expires = drey_cache__expiry_at(&ex, ax->now_ms, 0);
        drey_store_txn_set_expiry(&o.txn, &o.key, expires);
        resp->found = true;
        resp->version = o.entry.version;
        resp->expires_at = drey_cache__timestamp(ax->arena, expires);
    }
    one_key_end(&o);
    return &resp->base;
}

static ProtobufCMessage *apply_persist(void *ctx, drey_apply *ax, const ProtobufCMessage *msg) {
    const Drey__Cache__V1__PersistRequest *req = (const void *)msg;
    Drey__Cache__V1__PersistResponse *resp = drey_arena_alloc(ax->arena, sizeof *resp);
    drey__cache__v1__persist_response__init(resp);
    one_key o;
    one_key_begin(&o, ctx, req->cache, req->key, ax);
    if (o.live) {
        resp->version = o.entry.version;
        if (o.entry.expires_at_ms != 0) {
            drey_store_txn_set_expiry(&o.txn, &o.key, 0);
            resp->found = true;
        }
    }
    one_key_end(&o);
    return &resp->base;
}

static ProtobufCMessage *apply_increment(void *ctx, drey_apply *ax, const ProtobufCMessage *msg) {
    const Drey__Cache__V1__IncrementRequest *req = (const void *)msg;
    one_key o;
    one_key_begin(&o, ctx, req->cache, req->key, ax);
    int64_t base = req->initial, expires;
    if (o.live) {
        if (o.entry.value.kind != DREY_VALUE_INT64) {
            one_key_end(&o);
            drey_status_set(ax->status, DREY_ERR_NOT_AN_INTEGER);
            return NULL;
        }
        base = drey_cache__int64_of(&o.entry.value);
        expires = o.entry.expires_at_ms;
    } else {
        drey_cache__expiry ex = EXPIRY_OF(req, DREY__CACHE__V1__INCREMENT_REQUEST__EXPIRATION);
        expires = drey_cache__expiry_at(&ex, ax->now_ms, 0);
    }
    int64_t result;
    if (__builtin_add_overflow(base, req->delta, &result)) {
        one_key_end(&o);
        drey_status_set(ax->status, DREY_ERR_INTEGER_OVERFLOW);
        return NULL;
    }
    uint8_t buf[8];
    drey_value v;
    drey_cache__int64_value(result, buf, &v);
    Drey__Cache__V1__IncrementResponse *resp = drey_arena_alloc(ax->arena, sizeof *resp);
    drey__cache__v1__increment_response__init(resp);
    resp->value = result;
    resp->created = !o.live;
    resp->version = drey_apply_version(ax, o.store);
    drey_store_txn_put(&o.txn, &o.key, &v, expires, resp->version);
    one_key_end(&o);
    return &resp->base;
}

static ProtobufCMessage *apply_remove_many(void *ctx, drey_apply *ax, const ProtobufCMessage *msg) {
    const Drey__Cache__V1__RemoveManyRequest *req = (const void *)msg;
    drey_store *s = store_of(ctx);
    drey_arena *a = ax->arena;
    size_t n = req->n_keys;
    drey_key *keys = drey_arena_alloc(a, (n ? n : 1) * sizeof *keys);
    for (size_t i = 0; i < n; i++)
        make_key(s, &keys[i], req->cache, req->keys[i]);
    Drey__Cache__V1__RemoveManyResponse *resp = drey_arena_alloc(a, sizeof *resp);
    drey__cache__v1__remove_many_response__init(resp);
    resp->n_results = n;
    resp->results = drey_arena_alloc(a, (n ? n : 1) * sizeof *resp->results);
    /* One transaction: a reader sees all of the batch's removals or none. */
    drey_store_txn t;
    drey_store_txn_begin(s, &t, keys, n);
    for (size_t i = 0; i < n; i++) {
        Drey__Cache__V1__RemoveManyResponse__Result *r = drey_arena_alloc(a, sizeof *r);
        drey__cache__v1__remove_many_response__result__init(r);
        r->key = req->keys[i];
        drey_entry_view e;
        if (drey_store_txn_get(&t, &keys[i], ax->now_ms, &e)) {
            r->removed = true;
            r->version = e.version;
            drey_store_txn_remove(&t, &keys[i]);
        }
        resp->results[i] = r;
    }
    drey_store_txn_end(&t);
    return &resp->base;
}

static ProtobufCMessage *apply_clear(void *ctx, drey_apply *ax, const ProtobufCMessage *msg) {
    const Drey__Cache__V1__ClearRequest *req = (const void *)msg;
    drey_store_clear_cache(store_of(ctx), req->cache, strlen(req->cache));
    Drey__Cache__V1__ClearResponse *resp = drey_arena_alloc(ax->arena, sizeof *resp);
    drey__cache__v1__clear_response__init(resp);
    return &resp->base;
}

/* --- scans ----------------------------------------------------------------
 *
 * A cursor is 28 bytes, base64url without padding:
 *   u8 format (1), u8[3] zero, u32 partition (0 until the cluster exists),
 *   u32 scan id (hash of cache and prefix), u32 shard, u32 reverse-binary
 *   bucket cursor, u64 tag; little-endian.
 * A position only means something under the hash seed it was computed
 * with, so the tag is a keyed hash of the first 20 bytes under the seed
 * (drey_store_tag): a cursor from another seed (an ephemeral node that
 * restarted; a durable node keeps its seed) or an altered one is refused
 * rather than misread. The partition field is where a cluster will say
 * which partition the scan is in: a cluster-wide scan walks partitions in
 * order, the cursor naming the partition and the position within it, and
 * the partition's owner checks the tag under its own seed. */

#define CURSOR_FORMAT 1
#define CURSOR_BYTES 28
#define SCAN_DEFAULT_LIMIT 100
#define SCAN_MAX_LIMIT 1000
/* Buckets one page visits at most, so a page of a small cache in a big
 * store costs a bounded time (the page may then be empty). */
#define SCAN_MAX_BUCKETS 16384

static const char b64url[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

static char *cursor_encode(drey_arena *a, const uint8_t *in, size_t n) {
    char *out = drey_arena_alloc(a, (n * 4 + 2) / 3 + 1), *p = out;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0) | (i + 2 < n ? in[i + 2] : 0);
        *p++ = b64url[v >> 18 & 63];
        *p++ = b64url[v >> 12 & 63];
        if (i + 1 < n)
            *p++ = b64url[v >> 6 & 63];
        if (i + 2 < n)
            *p++ = b64url[v & 63];
    }
    *p = '\0';
    return out;
}

/* Decodes exactly n bytes; false for anything else. */
static bool cursor_decode(const char *s, uint8_t *out, size_t n) {
    size_t len = strlen(s);
    if (len != (n * 4 + 2) / 3)
        return false;
    uint32_t acc = 0;
    size_t bits = 0, o = 0;
    for (size_t i = 0; i < len; i++) {
        const char *c = memchr(b64url, s[i], 64);
        if (s[i] == '\0' || c == NULL)
            return false;
        acc = acc << 6 | (uint32_t)(c - b64url);
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (o < n)
                out[o++] = (uint8_t)(acc >> bits);
        }
    }
    return o == n;
}

static void put32le(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32le(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t scan_id(const char *cache, const char *prefix) {
    if (strcmp(cache, "default") == 0)
        cache = "";
    uint32_t h = 2166136261u; /* FNV-1a over cache NUL prefix */
    for (const char *p = cache; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    h = (h ^ 0) * 16777619u;
    for (const char *p = prefix; *p; p++)
        h = (h ^ (uint8_t)*p) * 16777619u;
    return h;
}

static void *invalid_cursor(drey_apply *ax, const char *why) {
    drey_status_set(ax->status, DREY_ERR_INVALID_CURSOR);
    drey_status_add_metadata(ax->status, "why", "%s", why);
    drey_status_add_violation(ax->status, DREY_ERR_INVALID_CURSOR, "cursor");
    return NULL;
}

typedef struct scan_out {
    drey_arena *arena;
    const drey_apply *ax;
    bool values;
    Drey__Cache__V1__ScanResponse__Item **items;
    size_t n, cap;
} scan_out;

static void scan_item(void *arg, const drey_store_item *it) {
    scan_out *o = arg;
    if (o->ax->keep != NULL && !o->ax->keep(o->ax->keep_ctx, it->cache, it->cache_len, it->key, it->key_len))
        return;
    if (o->n == o->cap) { /* a bucket can hold more than the limit */
        size_t cap = o->cap * 2;
        Drey__Cache__V1__ScanResponse__Item **items = drey_arena_alloc(o->arena, cap * sizeof *items);
        memcpy(items, o->items, o->n * sizeof *items);
        o->items = items;
        o->cap = cap;
    }
    Drey__Cache__V1__ScanResponse__Item *item = drey_arena_alloc(o->arena, sizeof *item);
    drey__cache__v1__scan_response__item__init(item);
    item->key = drey_arena_strndup(o->arena, it->key, it->key_len);
    item->version = it->entry.version;
    if (o->values) {
        item->value = drey_cache__value_out(o->arena, &it->entry.value);
        item->expires_at = drey_cache__timestamp(o->arena, it->entry.expires_at_ms);
    }
    o->items[o->n++] = item;
}

static ProtobufCMessage *read_scan(void *ctx, drey_apply *ax, const ProtobufCMessage *msg) {
    const Drey__Cache__V1__ScanRequest *req = (const void *)msg;
    drey_store *s = store_of(ctx);
    drey_arena *a = ax->arena;
    uint32_t id = scan_id(req->cache, req->prefix);
    drey_store_scan_pos pos = {0, 0};
    if (req->cursor[0] != '\0') {
        uint8_t c[CURSOR_BYTES];
        if (!cursor_decode(req->cursor, c, sizeof c) || c[0] != CURSOR_FORMAT || c[1] || c[2] || c[3])
            return invalid_cursor(ax, "not a cursor of this format");
        uint64_t tag = (uint64_t)get32le(c + 20) | (uint64_t)get32le(c + 24) << 32;
        if (tag != drey_store_tag(s, c, 20))
            return invalid_cursor(ax, "not issued by this node under its hash seed (an ephemeral node restarted "
                                      "since, or another node issued it) or altered");
        if (get32le(c + 4) != 0)
            return invalid_cursor(ax, "the cursor names a partition this node does not serve");
        if (get32le(c + 8) != id)
            return invalid_cursor(ax, "issued for another cache or prefix");
        pos.shard = get32le(c + 12);
        pos.bucket = get32le(c + 16);
        if (pos.shard == DREY_STORE_SCAN_DONE || !drey_store_scan_pos_valid(s, &pos))
            return invalid_cursor(ax, "shard out of range");
    }
    size_t limit = req->limit == 0 ? SCAN_DEFAULT_LIMIT : req->limit > SCAN_MAX_LIMIT ? SCAN_MAX_LIMIT : req->limit;
    scan_out o = {.arena = a, .ax = ax, .values = req->include_values, .cap = limit};
    o.items = drey_arena_alloc(a, o.cap * sizeof *o.items);
    drey_store_scan(s, req->cache, strlen(req->cache), req->prefix, strlen(req->prefix), ax->now_ms, &pos, limit,
                    SCAN_MAX_BUCKETS, scan_item, &o);
    Drey__Cache__V1__ScanResponse *resp = drey_arena_alloc(a, sizeof *resp);
    drey__cache__v1__scan_response__init(resp);
    resp->items = o.items;
    resp->n_items = o.n;
    resp->next_cursor = "";
    if (pos.shard != DREY_STORE_SCAN_DONE) {
        uint8_t c[CURSOR_BYTES] = {CURSOR_FORMAT};
        put32le(c + 8, id);
        put32le(c + 12, pos.shard);
        put32le(c + 16, pos.bucket);
        uint64_t tag = drey_store_tag(s, c, 20);
        put32le(c + 20, (uint32_t)tag);
        put32le(c + 24, (uint32_t)(tag >> 32));
        resp->next_cursor = cursor_encode(a, c, sizeof c);
    }
    return &resp->base;
}

/* --- cache figures -------------------------------------------------------- */

static Drey__Cache__V1__CacheStats *stats_msg(drey_arena *a, const drey_cache_stats *cs) {
    Drey__Cache__V1__CacheStats *m = drey_arena_alloc(a, sizeof *m);
    drey__cache__v1__cache_stats__init(m);
    m->cache = cs->cache_len == 0 ? "default" : drey_arena_strndup(a, cs->cache, cs->cache_len);
    m->entries = cs->entries;
    m->bytes = cs->bytes;
    m->evictions = cs->evictions;
    m->evicted_bytes = cs->evicted_bytes;
    m->expiring = cs->expiring;
    return m;
}

static ProtobufCMessage *read_get_cache_stats(void *ctx, drey_apply *ax, const ProtobufCMessage *msg) {
    const Drey__Cache__V1__GetCacheStatsRequest *req = (const void *)msg;
    drey_cache_stats cs;
    drey_store_cache_stats(store_of(ctx), req->cache, strlen(req->cache), &cs);
    return &stats_msg(ax->arena, &cs)->base;
}

typedef struct list_out {
    drey_arena *arena;
    Drey__Cache__V1__CacheStats **v;
    size_t n, cap;
} list_out;

static void list_one(void *arg, const drey_cache_stats *cs) {
    list_out *o = arg;
    if (cs->cache_len > 0 && cs->cache[0] == '#')
        return; /* internal: remembered outcomes */
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 16;
        Drey__Cache__V1__CacheStats **v = drey_arena_alloc(o->arena, cap * sizeof *v);
        if (o->n > 0)
            memcpy(v, o->v, o->n * sizeof *v);
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = stats_msg(o->arena, cs);
}

static int by_name(const void *a, const void *b) {
    const Drey__Cache__V1__CacheStats *x = *(Drey__Cache__V1__CacheStats *const *)a;
    const Drey__Cache__V1__CacheStats *y = *(Drey__Cache__V1__CacheStats *const *)b;
    return strcmp(x->cache, y->cache);
}

static ProtobufCMessage *read_list_caches(void *ctx, drey_apply *ax, const ProtobufCMessage *msg) {
    (void)msg;
    list_out o = {.arena = ax->arena};
    drey_store_list_caches(store_of(ctx), list_one, &o);
    if (o.n > 1)
        qsort(o.v, o.n, sizeof *o.v, by_name);
    Drey__Cache__V1__ListCachesResponse *resp = drey_arena_alloc(ax->arena, sizeof *resp);
    drey__cache__v1__list_caches_response__init(resp);
    resp->caches = o.v;
    resp->n_caches = o.n;
    return &resp->base;
}

/* --- growth estimates (memory admission) --------------------------------- */

/* Whose growth an estimate is for: the node's (every entry replaced
 * counts), or one tenant's (only its own entries replaced count). */
#define NODE_WIDE UINT32_MAX

/* What storing `value_len` bytes under the key would add, now. */
static int64_t key_growth(drey_store *s, const char *cache, const char *key, uint32_t value_len, int64_t now_ms,
                          uint32_t tenant) {
    drey_key k;
    make_key(s, &k, cache, key);
    uint32_t owner;
    size_t old = drey_store_entry_size_tenant(s, &k, now_ms, &owner);
    if (tenant != NODE_WIDE && owner != tenant)
        old = 0; /* another tenant's entry changes hands: all of the new one is this tenant's */
    return (int64_t)drey_store_entry_bytes(k.cache_len, k.key_len, value_len) - (int64_t)old;
}

static int64_t tgrowth_set(void *ctx, const ProtobufCMessage *msg, int64_t now_ms, uint32_t tenant) {
    const Drey__Cache__V1__SetRequest *req = (const void *)msg;
    return key_growth(store_of(ctx), req->cache, req->key, drey_cache_value_bytes(req->value), now_ms, tenant);
}

static int64_t tgrowth_set_many(void *ctx, const ProtobufCMessage *msg, int64_t now_ms, uint32_t tenant) {
    const Drey__Cache__V1__SetManyRequest *req = (const void *)msg;
    int64_t sum = 0;
    for (size_t i = 0; i < req->n_entries; i++)
        sum += key_growth(store_of(ctx), req->cache, req->entries[i]->key,
                          drey_cache_value_bytes(req->entries[i]->value), now_ms, tenant);
    return sum;
}

/* Whether the key is live now (Add and GetOrAdd store nothing when it is,
 * Update nothing when it is not: such calls are never refused). */
static bool key_live(drey_store *s, const char *cache, const char *key, int64_t now_ms) {
    drey_key k;
    make_key(s, &k, cache, key);
    return drey_store_entry_size(s, &k, now_ms) > 0;
}

static int64_t tgrowth_add(void *ctx, const ProtobufCMessage *msg, int64_t now_ms, uint32_t tenant) {
    const Drey__Cache__V1__AddRequest *req = (const void *)msg;
    if (key_live(store_of(ctx), req->cache, req->key, now_ms))
        return 0;
    return key_growth(store_of(ctx), req->cache, req->key, drey_cache_value_bytes(req->value), now_ms, tenant);
}

static int64_t tgrowth_update(void *ctx, const ProtobufCMessage *msg, int64_t now_ms, uint32_t tenant) {
    const Drey__Cache__V1__UpdateRequest *req = (const void *)msg;
    if (!key_live(store_of(ctx), req->cache, req->key, now_ms))
        return 0;
    return key_growth(store_of(ctx), req->cache, req->key, drey_cache_value_bytes(req->value), now_ms, tenant);
}

static int64_t tgrowth_get_or_add(void *ctx, const ProtobufCMessage *msg, int64_t now_ms, uint32_t tenant) {
    const Drey__Cache__V1__GetOrAddRequest *req = (const void *)msg;
    if (key_live(store_of(ctx), req->cache, req->key, now_ms))
        return 0;
    return key_growth(store_of(ctx), req->cache, req->key, drey_cache_value_bytes(req->value), now_ms, tenant);
}

static int64_t tgrowth_increment(void *ctx, const ProtobufCMessage *msg, int64_t now_ms, uint32_t tenant) {
    const Drey__Cache__V1__IncrementRequest *req = (const void *)msg;
    return key_growth(store_of(ctx), req->cache, req->key, 8, now_ms, tenant);
}

/* The node's growth: every entry replaced counts. */
#define NODE_GROWTH(name)                                                                                          \
    static int64_t growth_##name(void *ctx, const ProtobufCMessage *msg, int64_t now_ms) {                          \
        return tgrowth_##name(ctx, msg, now_ms, NODE_WIDE);                                                        \
    }
NODE_GROWTH(set)
NODE_GROWTH(set_many)
NODE_GROWTH(add)
NODE_GROWTH(update)
NODE_GROWTH(get_or_add)
NODE_GROWTH(increment)

static const drey_method_spec methods[] = {
    {.name = "Get", .route = DREY_ROUTE_KEY, .flags = DREY_METHOD_READ, .apply = read_get},
    {.name = "GetMany", .route = DREY_ROUTE_KEYS, .flags = DREY_METHOD_READ, .apply = read_get_many},
    {.name = "GetExpiration", .route = DREY_ROUTE_KEY, .flags = DREY_METHOD_READ, .apply = read_get_expiration},
    {.name = "Set", .route = DREY_ROUTE_KEY, .flags = DREY_METHOD_WRITE | DREY_METHOD_VERSIONED, .apply = apply_set, .growth = growth_set, .tenant_growth = tgrowth_set},
    {.name = "SetMany", .route = DREY_ROUTE_BATCH, .flags = DREY_METHOD_WRITE | DREY_METHOD_VERSIONED, .apply = apply_set_many, .growth = growth_set_many, .tenant_growth = tgrowth_set_many},
    {.name = "Add", .route = DREY_ROUTE_KEY, .flags = DREY_METHOD_WRITE | DREY_METHOD_VERSIONED, .apply = apply_add, .growth = growth_add, .tenant_growth = tgrowth_add},
    {.name = "Update", .route = DREY_ROUTE_KEY, .flags = DREY_METHOD_WRITE | DREY_METHOD_VERSIONED, .apply = apply_update, .growth = growth_update, .tenant_growth = tgrowth_update},
    {.name = "GetOrAdd", .route = DREY_ROUTE_KEY, .flags = DREY_METHOD_WRITE | DREY_METHOD_VERSIONED, .apply = apply_get_or_add, .growth = growth_get_or_add, .tenant_growth = tgrowth_get_or_add},
    {.name = "Remove", .route = DREY_ROUTE_KEY, .flags = DREY_METHOD_WRITE, .apply = apply_remove},
    {.name = "Touch", .route = DREY_ROUTE_KEY, .flags = DREY_METHOD_WRITE, .apply = apply_touch},
    {.name = "Persist", .route = DREY_ROUTE_KEY, .flags = DREY_METHOD_WRITE, .apply = apply_persist},
    {.name = "Increment", .route = DREY_ROUTE_KEY, .flags = DREY_METHOD_WRITE | DREY_METHOD_VERSIONED, .apply = apply_increment, .growth = growth_increment, .tenant_growth = tgrowth_increment},
    {.name = "RemoveMany", .route = DREY_ROUTE_BATCH, .flags = DREY_METHOD_WRITE, .apply = apply_remove_many},
    {.name = "Scan", .route = DREY_ROUTE_CACHE, .flags = DREY_METHOD_READ, .apply = read_scan},
    {.name = "Clear", .route = DREY_ROUTE_CACHE, .flags = DREY_METHOD_WRITE, .apply = apply_clear},
    {.name = "ListCaches", .route = DREY_ROUTE_CACHE, .flags = DREY_METHOD_READ, .apply = read_list_caches},
    {.name = "GetCacheStats", .route = DREY_ROUTE_CACHE, .flags = DREY_METHOD_READ, .apply = read_get_cache_stats},
};

drey_cache *drey_cache_create(drey_store *store) {
    drey_cache *c = drey_xcalloc(1, sizeof *c);
    c->store = store;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cond, NULL);
    return c;
}

void drey_cache_destroy(drey_cache *c) {
    if (c == NULL)
        return;
    drey_cache_stop_expiry(c);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cond);
    free(c);
}

Drey__Cache__V1__Value *drey_cache_value_out(drey_arena *a, const drey_value *v) {
    return drey_cache__value_out(a, v);
}

Google__Protobuf__Timestamp *drey_cache_timestamp(drey_arena *a, int64_t ms) {
    return drey_cache__timestamp(a, ms);
}

bool drey_cache_register(drey_cache *c, drey_method_table *t) {
    return drey_method_table_add_service(t, &drey__cache__v1__cache__descriptor, methods,
                                         sizeof methods / sizeof methods[0], c);
}

/* --- active expiry -------------------------------------------------------- */

/* Buckets visited per step; small enough that a step holds a shard's write
 * lock for microseconds. */
#define EXPIRE_STEP_BUCKETS 64
/* After each lap over the shards, go on only while more than this share of
 * the entries examined had expired (Redis uses 10%). */
#define EXPIRE_CONTINUE_PERCENT 10

uint64_t drey_cache_expire_cycle(drey_cache *c, int64_t now_ms, int64_t budget_ns) {
    int64_t start = drey_mono_ns();
    size_t examined = 0, expired = 0;
    for (size_t steps = 1;; steps++) {
        examined += drey_store_sweep(c->store, now_ms, EXPIRE_STEP_BUCKETS, &expired);
        if (drey_mono_ns() - start >= budget_ns)
            break;
        if (steps % DREY_STORE_SHARDS == 0 && expired * 100 <= examined * EXPIRE_CONTINUE_PERCENT)
            break;
    }
    return expired;
}

static void *expiry_main(void *arg) {
    drey_cache *c = arg;
    pthread_mutex_lock(&c->mu);
    while (!c->stopping) {
        pthread_mutex_unlock(&c->mu);
        int64_t now = drey_wall_ms();
        if (c->horizon != NULL)
            now = c->horizon(c->horizon_ctx, now);
        drey_cache_expire_cycle(c, now, c->expiry_interval_ms * 1000000 / 4);
        pthread_mutex_lock(&c->mu);
        if (!c->stopping)
            drey_cond_wait_until(&c->cond, &c->mu, drey_deadline_after_ms(c->expiry_interval_ms));
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

void drey_cache_set_expiry_horizon(drey_cache *c, int64_t (*fn)(void *ctx, int64_t now_ms), void *ctx) {
    c->horizon = fn;
    c->horizon_ctx = ctx;
}

void drey_cache_start_expiry(drey_cache *c, int64_t interval_ms) {
    c->expiry_interval_ms = interval_ms;
    c->stopping = false;
    drey_thread_start(&c->expiry_thread, "expiry sweep", expiry_main, c);
    c->expiry_running = true;
}

void drey_cache_stop_expiry(drey_cache *c) {
    if (!c->expiry_running)
        return;
    drey_thread_stop(c->expiry_thread, &c->mu, &c->cond, &c->stopping);
    c->expiry_running = false;
}
