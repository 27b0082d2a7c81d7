/*
 * kv — etcd's KV and Lease unary calls and the transaction builder; see
 * include/drey/etcd.h. Which calls are retried after they were sent is
 * decided here: only Range, the one that changes nothing.
 */
#include <stdlib.h>
#include <string.h>

#include "drey/clock.h"
#include "internal.h"

ProtobufCBinaryData drey_etcd_bytes(const char *s) {
    return (ProtobufCBinaryData){.len = strlen(s), .data = (uint8_t *)s};
}

ProtobufCBinaryData drey_etcd_prefix_end(drey_arena *arena, const char *prefix) {
    size_t n = strlen(prefix);
    uint8_t *end = drey_arena_alloc(arena, n > 0 ? n : 1);
    memcpy(end, prefix, n);
    while (n > 0) {
        if (end[n - 1] < 0xff) {
            end[n - 1]++;
            return (ProtobufCBinaryData){.len = n, .data = end};
        }
        n--;
    }
    /* All 0xff (or empty): every key from prefix on, etcd's "\0". */
    end[0] = 0;
    return (ProtobufCBinaryData){.len = 1, .data = end};
}

grpc_status_code drey_etcd_range(drey_etcd *e, const Etcdserverpb__RangeRequest *req, int64_t timeout_ms,
                                 drey_arena *arena, Etcdserverpb__RangeResponse **resp, drey_etcd_status *st) {
    return drey_etcd__unary(e, DREY_ETCD__RANGE, &req->base, &etcdserverpb__range_response__descriptor, true,
                            timeout_ms, arena, (ProtobufCMessage **)resp, st);
}

grpc_status_code drey_etcd_put(drey_etcd *e, const Etcdserverpb__PutRequest *req, int64_t timeout_ms,
                               drey_arena *arena, Etcdserverpb__PutResponse **resp, drey_etcd_status *st) {
    return drey_etcd__unary(e, DREY_ETCD__PUT, &req->base, &etcdserverpb__put_response__descriptor, false,
                            timeout_ms, arena, (ProtobufCMessage **)resp, st);
}

grpc_status_code drey_etcd_delete_range(drey_etcd *e, const Etcdserverpb__DeleteRangeRequest *req,
                                        int64_t timeout_ms, drey_arena *arena,
                                        Etcdserverpb__DeleteRangeResponse **resp, drey_etcd_status *st) {
    return drey_etcd__unary(e, DREY_ETCD__DELETE_RANGE, &req->base, &etcdserverpb__delete_range_response__descriptor,
                            false, timeout_ms, arena, (ProtobufCMessage **)resp, st);
}

grpc_status_code drey_etcd_txn_request(drey_etcd *e, const Etcdserverpb__TxnRequest *req, int64_t timeout_ms,
                                       drey_arena *arena, Etcdserverpb__TxnResponse **resp, drey_etcd_status *st) {
    /* A Txn of reads only is as safe to resend as a Range, but the builder
     * cannot tell a caller's intent from its ops cheaply: never resent. */
    return drey_etcd__unary(e, DREY_ETCD__TXN, &req->base, &etcdserverpb__txn_response__descriptor, false,
                            timeout_ms, arena, (ProtobufCMessage **)resp, st);
}

grpc_status_code drey_etcd_get(drey_etcd *e, const char *key, bool prefix, int64_t timeout_ms, drey_arena *arena,
                               Etcdserverpb__RangeResponse **resp, drey_etcd_status *st) {
    Etcdserverpb__RangeRequest req = ETCDSERVERPB__RANGE_REQUEST__INIT;
    req.key = drey_etcd_bytes(key);
    if (prefix)
        req.range_end = drey_etcd_prefix_end(arena, key);
    return drey_etcd_range(e, &req, timeout_ms, arena, resp, st);
}

/* --- transactions --------------------------------------------------------- */

void drey_etcd_txn_init(drey_etcd_txn *t, drey_arena *arena) {
    memset(t, 0, sizeof *t);
    Etcdserverpb__TxnRequest init = ETCDSERVERPB__TXN_REQUEST__INIT;
    t->req = init;
    t->arena = arena;
}

static ProtobufCBinaryData copy_bytes(drey_arena *a, const void *data, size_t len) {
    uint8_t *p = drey_arena_alloc(a, len > 0 ? len : 1);
    if (len > 0)
        memcpy(p, data, len);
    return (ProtobufCBinaryData){.len = len, .data = p};
}

/* Appends to an arena array, doubling it when full. */
static void *push(drey_arena *a, void ***items, size_t *n, size_t *cap, void *item) {
    if (*n == *cap) {
        size_t ncap = *cap ? *cap * 2 : 4;
        void **grown = drey_arena_alloc(a, ncap * sizeof *grown);
        if (*n > 0)
            memcpy(grown, *items, *n * sizeof *grown);
        *items = grown;
        *cap = ncap;
    }
    (*items)[(*n)++] = item;
    return item;
}

static Etcdserverpb__Compare *compare(drey_etcd_txn *t, const char *key, drey_etcd_cmp cmp,
                                      Etcdserverpb__Compare__CompareTarget target) {
    Etcdserverpb__Compare *c = drey_arena_alloc(t->arena, sizeof *c);
    Etcdserverpb__Compare init = ETCDSERVERPB__COMPARE__INIT;
    *c = init;
    static const Etcdserverpb__Compare__CompareResult results[] = {
        [DREY_ETCD_EQUAL] = ETCDSERVERPB__COMPARE__COMPARE_RESULT__EQUAL,
        [DREY_ETCD_NOT_EQUAL] = ETCDSERVERPB__COMPARE__COMPARE_RESULT__NOT_EQUAL,
        [DREY_ETCD_LESS] = ETCDSERVERPB__COMPARE__COMPARE_RESULT__LESS,
        [DREY_ETCD_GREATER] = ETCDSERVERPB__COMPARE__COMPARE_RESULT__GREATER,
    };
    c->result = results[cmp];
    c->target = target;
    c->key = copy_bytes(t->arena, key, strlen(key));
    push(t->arena, (void ***)&t->req.compare, &t->req.n_compare, &t->cap_compare, c);
    return c;
}

void drey_etcd_txn_if_create_revision(drey_etcd_txn *t, const char *key, drey_etcd_cmp cmp, int64_t revision) {
    Etcdserverpb__Compare *c = compare(t, key, cmp, ETCDSERVERPB__COMPARE__COMPARE_TARGET__CREATE);
    c->target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_CREATE_REVISION;
    c->create_revision = revision;
}

void drey_etcd_txn_if_mod_revision(drey_etcd_txn *t, const char *key, drey_etcd_cmp cmp, int64_t revision) {
    Etcdserverpb__Compare *c = compare(t, key, cmp, ETCDSERVERPB__COMPARE__COMPARE_TARGET__MOD);
    c->target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_MOD_REVISION;
    c->mod_revision = revision;
}

void drey_etcd_txn_if_version(drey_etcd_txn *t, const char *key, drey_etcd_cmp cmp, int64_t version) {
    Etcdserverpb__Compare *c = compare(t, key, cmp, ETCDSERVERPB__COMPARE__COMPARE_TARGET__VERSION);
    c->target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_VERSION;
    c->version = version;
}

void drey_etcd_txn_if_value(drey_etcd_txn *t, const char *key, drey_etcd_cmp cmp, const void *value, size_t len) {
    Etcdserverpb__Compare *c = compare(t, key, cmp, ETCDSERVERPB__COMPARE__COMPARE_TARGET__VALUE);
    c->target_union_case = ETCDSERVERPB__COMPARE__TARGET_UNION_VALUE;
    c->value = copy_bytes(t->arena, value, len);
}

static Etcdserverpb__RequestOp *op(drey_etcd_txn *t, drey_etcd_branch b) {
    Etcdserverpb__RequestOp *o = drey_arena_alloc(t->arena, sizeof *o);
    Etcdserverpb__RequestOp init = ETCDSERVERPB__REQUEST_OP__INIT;
    *o = init;
    if (b == DREY_ETCD_THEN)
        push(t->arena, (void ***)&t->req.success, &t->req.n_success, &t->cap_success, o);
    else
        push(t->arena, (void ***)&t->req.failure, &t->req.n_failure, &t->cap_failure, o);
    return o;
}

/* A new request of type d in the transaction's arena, added to branch b's
 * operations (the RequestOp member of that type). */
static void *op_of(drey_etcd_txn *t, drey_etcd_branch b, const ProtobufCMessageDescriptor *d) {
    ProtobufCMessage *m = drey_arena_alloc(t->arena, d->sizeof_message);
    protobuf_c_message_init(d, m);
    Etcdserverpb__RequestOp *o = op(t, b);
    const ProtobufCMessageDescriptor *od = &etcdserverpb__request_op__descriptor;
    for (unsigned i = 0; i < od->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &od->fields[i];
        if (f->descriptor == d) {
            *(uint32_t *)(void *)((char *)o + f->quantifier_offset) = f->id;
            *(ProtobufCMessage **)(void *)((char *)o + f->offset) = m;
        }
    }
    return m;
}

/* key, or with prefix every key under it, as a request's key and range_end. */
static void key_range(drey_etcd_txn *t, const char *key, bool prefix, ProtobufCBinaryData *k, ProtobufCBinaryData *end) {
    *k = copy_bytes(t->arena, key, strlen(key));
    if (prefix)
        *end = drey_etcd_prefix_end(t->arena, key);
}

void drey_etcd_txn_put(drey_etcd_txn *t, drey_etcd_branch b, const char *key, const void *value, size_t len,
                       int64_t lease) {
    Etcdserverpb__PutRequest *p = op_of(t, b, &etcdserverpb__put_request__descriptor);
    p->key = copy_bytes(t->arena, key, strlen(key));
    p->value = copy_bytes(t->arena, value, len);
    p->lease = lease;
}

void drey_etcd_txn_get(drey_etcd_txn *t, drey_etcd_branch b, const char *key, bool prefix) {
    Etcdserverpb__RangeRequest *r = op_of(t, b, &etcdserverpb__range_request__descriptor);
    key_range(t, key, prefix, &r->key, &r->range_end);
}

void drey_etcd_txn_delete(drey_etcd_txn *t, drey_etcd_branch b, const char *key, bool prefix) {
    Etcdserverpb__DeleteRangeRequest *d = op_of(t, b, &etcdserverpb__delete_range_request__descriptor);
    key_range(t, key, prefix, &d->key, &d->range_end);
}

grpc_status_code drey_etcd_txn_commit(drey_etcd *e, const drey_etcd_txn *t, int64_t timeout_ms, drey_arena *arena,
                                      Etcdserverpb__TxnResponse **resp, drey_etcd_status *st) {
    return drey_etcd_txn_request(e, &t->req, timeout_ms, arena, resp, st);
}

/* --- leases --------------------------------------------------------------- */

grpc_status_code drey_etcd_lease_grant(drey_etcd *e, int64_t ttl_s, int64_t timeout_ms, drey_etcd_lease *out,
                                       drey_etcd_status *st) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    Etcdserverpb__LeaseGrantRequest req = ETCDSERVERPB__LEASE_GRANT_REQUEST__INIT;
    req.ttl = ttl_s;
    Etcdserverpb__LeaseGrantResponse *resp;
    memset(out, 0, sizeof *out);
    /* Before the call: a lease cannot expire earlier than TTL after the
     * request left, whenever etcd granted it. */
    int64_t sent = drey_mono_ns();
    if (drey_etcd__unary(e, DREY_ETCD__LEASE_GRANT, &req.base, &etcdserverpb__lease_grant_response__descriptor, false,
                         timeout_ms, &a, (ProtobufCMessage **)&resp, st) == GRPC_STATUS_OK) {
        /* resp->error is unused: etcd 3.4 reports failures as statuses. */
        out->id = resp->id;
        out->ttl_s = resp->ttl;
        out->granted_ns = sent;
    }
    drey_arena_destroy(&a);
    return st->code;
}

grpc_status_code drey_etcd_lease_revoke(drey_etcd *e, int64_t id, int64_t timeout_ms, drey_etcd_status *st) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    Etcdserverpb__LeaseRevokeRequest req = ETCDSERVERPB__LEASE_REVOKE_REQUEST__INIT;
    req.id = id;
    ProtobufCMessage *resp;
    drey_etcd__unary(e, DREY_ETCD__LEASE_REVOKE, &req.base, &etcdserverpb__lease_revoke_response__descriptor, false,
                     timeout_ms, &a, &resp, st);
    drey_arena_destroy(&a);
    return st->code;
}
