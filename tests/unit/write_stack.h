/*
 * A write stack for unit tests of commit and storage: a store, the cache
 * service's methods in a method table (which replay resolves records
 * through), and a commit. Plus builders
 * for cache write requests as the request chain would hand them over: the
 * decoded message and its wire bytes.
 */
#ifndef DREY_TESTS_UNIT_WRITE_STACK_H
#define DREY_TESTS_UNIT_WRITE_STACK_H

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/arena.h"
#include "drey/cache.h"
#include "drey/cache/v1/cache.pb-c.h"
#include "drey/commit.h"
#include "drey/journal.h"
#include "drey/method.h"
#include "drey/status.h"
#include "drey/store.h"

typedef struct write_stack {
    drey_store *store;
    drey_cache *cache;
    drey_method_table *methods;
    drey_commit *commit;
} write_stack;

static inline void stack_create(write_stack *s, int64_t retention_ms) {
    s->store = drey_store_create();
    s->cache = drey_cache_create(s->store);
    s->methods = drey_method_table_create();
    cr_assert(drey_cache_register(s->cache, s->methods));
    drey_commit_options co = {.store = s->store, .methods = s->methods, .idempotency_retention_ms = retention_ms};
    s->commit = drey_commit_create(&co);
}

static inline void stack_destroy(write_stack *s) {
    drey_commit_destroy(s->commit);
    drey_method_table_destroy(s->methods);
    drey_cache_destroy(s->cache);
    drey_store_destroy(s->store);
    memset(s, 0, sizeof *s);
}

static inline const drey_method *stack_method(write_stack *s, const char *name) {
    char path[128];
    snprintf(path, sizeof path, "/drey.cache.v1.Cache/%s", name);
    const drey_method *m = drey_method_find(s->methods, path);
    cr_assert_not_null(m, "no method %s", path);
    return m;
}

/* Fills w from a request message: packs it into arena memory and decodes
 * that again, as the chain receives it. */
static inline void make_write(write_stack *s, drey_write *w, drey_arena *a, const char *method,
                              const ProtobufCMessage *req, const char *principal) {
    const drey_method *m = stack_method(s, method);
    size_t len = protobuf_c_message_get_packed_size(req);
    uint8_t *bytes = drey_arena_alloc(a, len ? len : 1);
    protobuf_c_message_pack(req, bytes);
    ProtobufCMessage *decoded =
        protobuf_c_message_unpack(m->desc->input, drey_arena_protobuf_allocator(a), len, bytes);
    cr_assert_not_null(decoded);
    drey_commit_write_init(w, m, decoded, bytes, len, principal);
}

/* A Set of a string value; if_version < 0: unconditional; ttl_ms 0: none. */
static inline void make_set(write_stack *s, drey_write *w, drey_arena *a, const char *cache, const char *key,
                            const char *value, int64_t ttl_ms, int64_t if_version, const char *request_id,
                            const char *principal) {
    Drey__Cache__V1__Value v = DREY__CACHE__V1__VALUE__INIT;
    v.kind_case = DREY__CACHE__V1__VALUE__KIND_STRING_VALUE;
    v.string_value = (char *)value;
    Google__Protobuf__Duration ttl = GOOGLE__PROTOBUF__DURATION__INIT;
    Drey__Cache__V1__SetRequest req = DREY__CACHE__V1__SET_REQUEST__INIT;
    req.cache = (char *)cache;
    req.key = (char *)key;
    req.value = &v;
    req.request_id = (char *)request_id;
    if (ttl_ms > 0) {
        ttl.seconds = ttl_ms / 1000;
        ttl.nanos = (int32_t)(ttl_ms % 1000) * 1000000;
        req.expiration_case = DREY__CACHE__V1__SET_REQUEST__EXPIRATION_TTL;
        req.ttl = &ttl;
    }
    if (if_version >= 0) {
        req.condition_case = DREY__CACHE__V1__SET_REQUEST__CONDITION_IF_VERSION;
        req.if_version = (uint64_t)if_version;
    }
    make_write(s, w, a, "Set", &req.base, principal);
}

static inline void make_remove(write_stack *s, drey_write *w, drey_arena *a, const char *cache, const char *key,
                               const char *request_id, const char *principal) {
    Drey__Cache__V1__RemoveRequest req = DREY__CACHE__V1__REMOVE_REQUEST__INIT;
    req.cache = (char *)cache;
    req.key = (char *)key;
    req.request_id = (char *)request_id;
    make_write(s, w, a, "Remove", &req.base, principal);
}

static inline void make_increment(write_stack *s, drey_write *w, drey_arena *a, const char *cache, const char *key,
                                  int64_t delta, const char *request_id, const char *principal) {
    Drey__Cache__V1__IncrementRequest req = DREY__CACHE__V1__INCREMENT_REQUEST__INIT;
    req.cache = (char *)cache;
    req.key = (char *)key;
    req.delta = delta;
    req.request_id = (char *)request_id;
    make_write(s, w, a, "Increment", &req.base, principal);
}

/* The stored entry of a key, copied; false if none is live at now_ms. */
typedef struct entry_copy {
    drey_value_kind kind;
    uint8_t data[1024];
    uint32_t len;
    uint64_t version;
    int64_t expires_at_ms;
} entry_copy;

static inline void copy_entry(void *arg, const drey_entry_view *e) {
    entry_copy *c = arg;
    c->kind = e->value.kind;
    c->len = e->value.len < sizeof c->data ? e->value.len : (uint32_t)sizeof c->data;
    memcpy(c->data, e->value.data, c->len);
    c->version = e->version;
    c->expires_at_ms = e->expires_at_ms;
}

static inline bool read_entry(drey_store *st, const char *cache, const char *key, int64_t now_ms, entry_copy *out) {
    drey_key k;
    drey_store_key(st, &k, cache, strlen(cache), key, strlen(key));
    memset(out, 0, sizeof *out);
    return drey_store_read(st, &k, now_ms, copy_entry, out);
}

/* Packs a response into malloc'd bytes for byte-wise comparison. */
static inline uint8_t *pack(const ProtobufCMessage *m, size_t *len) {
    *len = protobuf_c_message_get_packed_size(m);
    uint8_t *b = malloc(*len ? *len : 1);
    protobuf_c_message_pack(m, b);
    return b;
}

/* Appends e; a refusal (quota, failed journal) is reported through e's done
 * callback like any other failure, so tests wait on one path. */
static inline void append_or_done(drey_journal *j, drey_journal_entry *e) {
    int rc = drey_journal_append(j, e);
    if (rc != 0)
        e->done(e->arg, NULL, rc);
}

#endif
