/*
 * commit — idempotent application of writes; see include/drey/commit.h.
 *
 * An outcome entry: key = principal, NUL, request_id; value (bytes) =
 *   32-byte SHA-256 of the method path and the request bytes
 *   u8 1, then the serialized response           (the write succeeded)
 *   u8 2, u8 len, reason, u8 n, n x (u8 len, key, u8 len, value)   (it failed)
 *   u8 0, u16 error ordinal, then as above       (it failed; read, no longer written)
 * expiring `retention` after the write's time. outcome.c reads and writes
 * the failure forms.
 */
#include "drey/alloc.h"
#include "drey/commit.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "drey/journal/v1/journal.pb-c.h"
#include "outcome.h"

#define FINGERPRINT 32
#define OUTCOME_STRIPES 64

struct drey_commit {
    drey_commit_options opts;
    pthread_mutex_t stripes[OUTCOME_STRIPES];
};

drey_commit *drey_commit_create(const drey_commit_options *opts) {
    drey_commit *c = drey_xcalloc(1, sizeof *c);
    c->opts = *opts;
    for (size_t i = 0; i < OUTCOME_STRIPES; i++)
        pthread_mutex_init(&c->stripes[i], NULL);
    return c;
}

void drey_commit_destroy(drey_commit *c) {
    if (c == NULL)
        return;
    for (size_t i = 0; i < OUTCOME_STRIPES; i++)
        pthread_mutex_destroy(&c->stripes[i]);
    free(c);
}

void drey_commit_write_init(drey_write *w, const drey_method *m, const ProtobufCMessage *request,
                            const uint8_t *bytes, size_t len, const char *principal) {
    w->method = m;
    w->request = request;
    w->request_bytes = bytes;
    w->request_len = len;
    w->principal = principal;
    w->request_id = "";
    w->tenant = "";
    w->evicted = NULL;
    w->n_evicted = 0;
    w->first_version = 0;
    const ProtobufCFieldDescriptor *fd =
        protobuf_c_message_descriptor_get_field_by_name(request->descriptor, "request_id");
    if (fd != NULL && fd->type == PROTOBUF_C_TYPE_STRING)
        w->request_id = *(char *const *)(const void *)((const char *)request + fd->offset);
}

static void fingerprint(const drey_write *w, uint8_t out[FINGERPRINT]) {
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    if (ctx == NULL || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1 ||
        EVP_DigestUpdate(ctx, w->method->path, strlen(w->method->path) + 1) != 1 ||
        EVP_DigestUpdate(ctx, w->request_bytes, w->request_len) != 1 || EVP_DigestFinal_ex(ctx, out, NULL) != 1)
        abort(); /* OpenSSL cannot hash in memory: nothing sane to do */
    EVP_MD_CTX_free(ctx);
}

/* A partitioned node's outcome keys end with NUL cache 0x1F key, the
 * write's first key: its partition, so the outcome moves with the data. */
static size_t scope_len(const drey_commit *c, const drey_write *w, const char **cache, const char **key) {
    *cache = *key = NULL;
    if (!c->opts.partitioned)
        return 0;
    *cache = drey_method_request_cache(w->request);
    *key = drey_method_request_key(w->request, 0);
    if (*cache == NULL || *key == NULL)
        return 0;
    return 1 + strlen(*cache) + 1 + strlen(*key);
}

/* The outcome entry's key: principal NUL request_id [NUL cache 0x1F key],
 * in arena memory. */
static void outcome_key(drey_commit *c, const drey_write *w, drey_arena *a, drey_key *k) {
    const char *cache, *first;
    size_t pl = strlen(w->principal), rl = strlen(w->request_id), sl = scope_len(c, w, &cache, &first);
    char *key = drey_arena_alloc(a, pl + 1 + rl + sl);
    memcpy(key, w->principal, pl);
    key[pl] = '\0';
    memcpy(key + pl + 1, w->request_id, rl);
    if (sl > 0) {
        char *p = key + pl + 1 + rl;
        size_t cl = strlen(cache);
        *p++ = '\0';
        memcpy(p, cache, cl);
        p[cl] = DREY_COMMIT_SCOPE_SEPARATOR;
        memcpy(p + cl + 1, first, strlen(first));
    }
    drey_store_key(c->opts.store, k, DREY_COMMIT_OUTCOME_CACHE, sizeof DREY_COMMIT_OUTCOME_CACHE - 1, key,
                   pl + 1 + rl + sl);
}

void drey_commit_outcome_key(drey_commit *c, const drey_write *w, drey_arena *a, drey_key *k) {
    outcome_key(c, w, a, k);
}

/* Answers from a stored outcome: the response, or the failure, or a
 * conflict when the request differs. */
static ProtobufCMessage *answer(const drey_write *w, const drey_value *v, drey_apply *ax) {
    uint8_t fp[FINGERPRINT];
    fingerprint(w, fp);
    if (v->len < FINGERPRINT + 1 || memcmp(v->data, fp, FINGERPRINT) != 0) {
        drey_status_set(ax->status, DREY_ERR_IDEMPOTENCY_KEY_REUSED);
        return NULL;
    }
    const uint8_t *p = v->data + FINGERPRINT + 1, *end = v->data + v->len;
    if (v->data[FINGERPRINT] == DREY_COMMIT__SUCCEEDED) {
        ProtobufCMessage *resp = protobuf_c_message_unpack(
            w->method->desc->output, drey_arena_protobuf_allocator(ax->arena), (size_t)(end - p), p);
        if (resp == NULL)
            drey_status_set(ax->status, DREY_ERR_INTERNAL);
        return resp;
    }
    drey_commit__failure_get(p - 1, (size_t)(end - p) + 1, ax->arena, ax->status);
    return NULL;
}

typedef struct found {
    drey_arena *arena;
    drey_value value;
} found;

static void copy_value(void *arg, const drey_entry_view *e) {
    found *f = arg;
    uint8_t *copy = drey_arena_alloc(f->arena, e->value.len);
    memcpy(copy, e->value.data, e->value.len);
    f->value = e->value;
    f->value.data = copy;
}

drey_commit_known drey_commit_lookup(drey_commit *c, const drey_write *w, drey_apply *ax,
                                     ProtobufCMessage **response) {
    *response = NULL;
    if (w->request_id[0] == '\0')
        return DREY_COMMIT_NEW;
    drey_key k;
    outcome_key(c, w, ax->arena, &k);
    found f = {.arena = ax->arena};
    if (!drey_store_read(c->opts.store, &k, ax->now_ms, copy_value, &f))
        return DREY_COMMIT_NEW;
    *response = answer(w, &f.value, ax);
    return DREY_COMMIT_ANSWERED;
}

static void remember(drey_commit *c, const drey_write *w, drey_apply *ax, const drey_key *k,
                     const ProtobufCMessage *resp) {
    size_t len = FINGERPRINT + 1;
    if (resp != NULL)
        len += protobuf_c_message_get_packed_size(resp);
    else
        len += drey_commit__failure_bytes(ax->status) - 1;
    uint8_t *buf = drey_arena_alloc(ax->arena, len);
    fingerprint(w, buf);
    uint8_t *p = buf + FINGERPRINT;
    if (resp != NULL) {
        *p++ = DREY_COMMIT__SUCCEEDED;
        protobuf_c_message_pack(resp, p);
    } else {
        /* The reason, not the enum's ordinal: outcomes outlive the binary
         * (snapshots), and the enum may gain rows in the middle. */
        drey_commit__failure_put(ax->status, p);
    }
    drey_value v = {.kind = DREY_VALUE_BYTES, .data = buf, .len = (uint32_t)len};
    drey_store_txn t;
    drey_store_txn_begin(c->opts.store, &t, k, 1);
    drey_store_txn_put(&t, k, &v, ax->now_ms + c->opts.idempotency_retention_ms, 0);
    drey_store_txn_end(&t);
}

/* After the write, not before: a write that fails (a version mismatch)
 * grew nothing and evicts nothing, and a victim the write itself replaced
 * has a new version and stays. */
static void evict(drey_commit *c, const drey_write *w) {
    for (size_t i = 0; i < w->n_evicted; i++) {
        const drey_store_victim *v = &w->evicted[i];
        drey_key k;
        drey_store_key(c->opts.store, &k, v->cache, v->cache_len, v->key, v->key_len);
        drey_store_txn t;
        drey_store_txn_begin(c->opts.store, &t, &k, 1);
        t.copy = w->copy;
        drey_store_txn_evict(&t, &k, v->version);
        drey_store_txn_end(&t);
    }
}

ProtobufCMessage *drey_commit_apply(drey_commit *c, const drey_write *w, drey_apply *ax) {
    void *ctx = w->method->ctx;
    ax->tenant = w->tenant != NULL ? drey_store_tenant_id(c->opts.store, w->tenant, strlen(w->tenant)) : 0;
    ax->next_version = w->first_version;
    ax->n_versions = w->first_version != 0 ? drey_apply_versions_needed(w->method, w->request) : 0;
    if (w->request_id[0] == '\0') {
        ProtobufCMessage *resp = w->method->apply(ctx, ax, w->request);
        if (resp != NULL)
            evict(c, w);
        return resp;
    }

    /* Check, apply and remember under the request_id's stripe lock, so two
     * attempts racing (ephemeral nodes apply on many threads) apply once.
     * Stripe locks are taken before any shard lock, never inside one. */
    drey_key k;
    outcome_key(c, w, ax->arena, &k);
    pthread_mutex_t *stripe = &c->stripes[k.hash % OUTCOME_STRIPES];
    pthread_mutex_lock(stripe);
    found f = {.arena = ax->arena};
    ProtobufCMessage *resp;
    if (drey_store_read(c->opts.store, &k, ax->now_ms, copy_value, &f)) {
        resp = answer(w, &f.value, ax);
    } else {
        resp = w->method->apply(ctx, ax, w->request);
        remember(c, w, ax, &k, resp);
        if (resp != NULL)
            evict(c, w);
    }
    pthread_mutex_unlock(stripe);
    return resp;
}

/* A typical response: a version and a timestamp or two. */
#define RESPONSE_ESTIMATE 48

size_t drey_commit_outcome_bytes(const drey_commit *c, const drey_write *w) {
    if (w->request_id[0] == '\0')
        return 0;
    const char *cache, *key;
    return drey_store_entry_bytes(sizeof DREY_COMMIT_OUTCOME_CACHE - 1,
                                  strlen(w->principal) + 1 + strlen(w->request_id) + scope_len(c, w, &cache, &key),
                                  FINGERPRINT + 1 + RESPONSE_ESTIMATE);
}

void drey_commit_reserve_versions(drey_commit *c, drey_write *w) {
    if (w->method->versions_brought != NULL)
        drey_store_raise_version(c->opts.store, w->method->versions_brought(w->request));
    size_t n = drey_apply_versions_needed(w->method, w->request);
    if (n == 0) {
        w->first_version = 0; /* hands out none: nothing to carry */
        return;
    }
    w->first_version = drey_store_reserve_versions(c->opts.store, n);
}

void drey_commit_unreserve_versions(drey_commit *c, drey_write *w) {
    if (w->first_version != 0)
        drey_store_unreserve_versions(c->opts.store, w->first_version, drey_apply_versions_needed(w->method, w->request));
    w->first_version = 0;
}

/* The record, with first_version unless with_version is false, in a buffer
 * with room bytes to spare after it. */
static void encode(const drey_write *w, bool with_version, size_t room, drey_arena *a, uint8_t **out, size_t *len) {
    Drey__Journal__V1__JournalRecord rec = DREY__JOURNAL__V1__JOURNAL_RECORD__INIT;
    rec.method = (char *)w->method->path + 1; /* without the leading '/' */
    rec.request.data = (uint8_t *)w->request_bytes;
    rec.request.len = w->request_len;
    rec.principal = (char *)w->principal;
    rec.request_id = (char *)w->request_id;
    rec.tenant = (char *)(w->tenant != NULL ? w->tenant : "");
    rec.first_version = with_version ? w->first_version : 0;
    if (w->n_evicted > 0) {
        rec.n_evicted = w->n_evicted;
        rec.evicted = drey_arena_alloc(a, w->n_evicted * sizeof *rec.evicted);
        for (size_t i = 0; i < w->n_evicted; i++) {
            const drey_store_victim *v = &w->evicted[i];
            Drey__Journal__V1__Evicted *e = drey_arena_alloc(a, sizeof *e);
            drey__journal__v1__evicted__init(e);
            e->cache = drey_arena_strndup(a, v->cache, v->cache_len);
            e->key.data = (uint8_t *)v->key;
            e->key.len = v->key_len;
            e->version = v->version;
            rec.evicted[i] = e;
        }
    }
    *len = protobuf_c_message_get_packed_size(&rec.base);
    *out = drey_arena_alloc(a, *len + room);
    protobuf_c_message_pack(&rec.base, *out);
}

void drey_commit_encode(const drey_write *w, drey_arena *a, uint8_t **out, size_t *len) {
    encode(w, true, 0, a, out, len);
}

/* Field 6, varint: the tag, then the value 7 bits at a time. */
#define FIRST_VERSION_TAG ((6u << 3) | 0u)
/* Field 8 (copy), varint. */
#define COPY_TAG ((8u << 3) | 0u)

void drey_commit_encode_unordered(const drey_write *w, drey_arena *a, uint8_t **out, size_t *len) {
    encode(w, false, DREY_COMMIT_ORDER_ROOM, a, out, len);
}

size_t drey_commit_encode_order(const drey_write *w, uint8_t *end) {
    uint64_t v = w->first_version;
    if (v == 0)
        return 0; /* proto3 leaves a zero out */
    size_t n = 0;
    end[n++] = FIRST_VERSION_TAG;
    while (v >= 0x80) {
        end[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    end[n++] = (uint8_t)v;
    return n;
}



drey_store *drey_commit_store(const drey_commit *c) {
    return c->opts.store;
}

int drey_commit_decode(drey_commit *c, const uint8_t *payload, size_t len, drey_arena *a, drey_write *w) {
    Drey__Journal__V1__JournalRecord *jr =
        drey__journal__v1__journal_record__unpack(drey_arena_protobuf_allocator(a), len, payload);
    if (jr == NULL)
        return -EINVAL;
    char path[512];
    snprintf(path, sizeof path, "/%s", jr->method);
    const drey_method *m = drey_method_find(c->opts.methods, path);
    if (m == NULL || (m->flags & DREY_METHOD_WRITE) == 0)
        return -EINVAL;
    ProtobufCMessage *req =
        protobuf_c_message_unpack(m->desc->input, drey_arena_protobuf_allocator(a), jr->request.len, jr->request.data);
    if (req == NULL)
        return -EINVAL;
    *w = (drey_write){
        .method = m,
        .request = req,
        .request_bytes = jr->request.data,
        .request_len = jr->request.len,
        .principal = jr->principal,
        .request_id = jr->request_id,
        .tenant = jr->tenant,
        .first_version = jr->first_version,
        .copy = jr->copy,
    };
    if (jr->n_evicted > 0) {
        drey_store_victim *ev = drey_arena_alloc(a, jr->n_evicted * sizeof *ev);
        for (size_t i = 0; i < jr->n_evicted; i++) {
            const Drey__Journal__V1__Evicted *e = jr->evicted[i];
            size_t cl = strlen(e->cache);
            if (cl > 255 || e->key.len > UINT16_MAX)
                return -EINVAL; /* not a record drey wrote */
            ev[i] = (drey_store_victim){.cache = e->cache, .cache_len = cl, .key = (const char *)e->key.data,
                                        .key_len = e->key.len, .version = e->version};
        }
        w->evicted = ev;
        w->n_evicted = jr->n_evicted;
    }
    return 0;
}

int drey_commit_replay(drey_commit *c, const drey_journal_record *rec) {
    char scratch[4096];
    drey_arena a;
    drey_arena_init(&a, scratch, sizeof scratch);
    drey_write w;
    int rc = drey_commit_decode(c, rec->payload, rec->len, &a, &w);
    if (rc == 0) {
        drey_status st;
        drey_status_init(&st);
        drey_apply ax = {.now_ms = rec->time_ms, .arena = &a, .status = &st};
        drey_commit_apply(c, &w, &ax);
    }
    drey_arena_destroy(&a);
    return rc;
}

size_t drey_commit_mark_copy(uint8_t *end) {
    end[0] = COPY_TAG;
    end[1] = 1;
    return DREY_COMMIT_COPY_ROOM;
}
