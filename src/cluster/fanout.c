/*
 * fanout — the calls about a whole cache, answered by every node for what
 * it holds.
 *
 * ListCaches, GetCacheStats and Clear go to every member (this node too,
 * in-process through its own chain, so that each node's part runs the same
 * chain: authorization with the caller's token included). Each node
 * answers for the partitions it leads, so that the sums count each
 * partition once however many copies it has. A node's part of a Clear is a
 * Partitions/Clear write for each partition it leads, ordered and
 * replicated with that partition's writes (local_clear). A Clear is not
 * atomic across partitions: one that fails after some partitions cleared
 * says so (CLEAR_INCOMPLETE, outcome unknown) and a retry finishes it.
 *
 * Scan walks the owners one after another, each scanning the partitions it
 * owns (its store may hold a copy it does not own: skipped). The cursor
 * names the owner, its node-local cursor and a hash of who owns what when
 * the scan began; once partitions have moved the cursor is refused
 * (INVALID_CURSOR): a key that moved from an owner not yet scanned to one
 * already scanned would be missed, and a scan never silently misses keys.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/cache/v1/cache.pb-c.h"
#include "drey/crc32c.h"
#include "drey/internal/v1/move.pb-c.h"
#include "drey/log.h"
#include "drey/partition.h"
#include "internal.h"
#include "peers.h"
#include "router.h"

/* --- gathering every node's answer ------------------------------------------------ */

typedef struct slot {
    struct fan *fan;
    int code;
    uint8_t *bytes; /* the response (OK) or the status details; malloc'd */
    size_t len;
    char *message;
} slot;

typedef struct fan {
    drey_cluster *c;
    drey_request *r;
    size_t n;
    _Atomic size_t pending;
    slot *slots;
    void (*gathered)(struct fan *f);
} fan;

static uint8_t *copy_bytes(const uint8_t *p, size_t n) {
    uint8_t *b = drey_xmalloc(n ? n : 1);
    if (n > 0)
        memcpy(b, p, n);
    return b;
}

/* Not in the request's arena: answering the request frees that. */
static void fan_free(fan *f) {
    for (size_t i = 0; i < f->n; i++) {
        free(f->slots[i].bytes);
        free(f->slots[i].message);
    }
    free(f->slots);
    free(f);
}

/* The answers arrive on the peers' threads: each keeps its own copy, and
 * the last one combines them. */
static void fan_done(void *arg, const drey_answer *a) {
    slot *s = arg;
    s->code = a->code;
    if (a->code == 0) {
        s->bytes = copy_bytes(a->response, a->response_len);
        s->len = a->response_len;
    } else {
        s->bytes = a->details != NULL ? copy_bytes(a->details, a->details_len) : NULL;
        s->len = a->details != NULL ? a->details_len : 0;
        s->message = drey_xmalloc(a->message_len + 1);
        memcpy(s->message, a->message, a->message_len);
        s->message[a->message_len] = '\0';
    }
    if (atomic_fetch_sub(&s->fan->pending, 1) == 1) {
        fan *f = s->fan;
        f->gathered(f);
        fan_free(f);
    }
}

/* The first failure, relayed as it came; false if every node answered OK. */
static bool relay_failure(fan *f) {
    for (size_t i = 0; i < f->n; i++) {
        slot *s = &f->slots[i];
        if (s->code == 0)
            continue;
        drey_answer a = {.code = s->code, .message = s->message, .message_len = strlen(s->message),
                         .details = s->bytes, .details_len = s->len};
        drey_request_relay(f->r, &a);
        return true;
    }
    return false;
}

/* Who owns what, in one number: any move changes it. */
static uint32_t owners_hash(const drey_cluster__topology *t) {
    uint32_t h = 0;
    for (uint32_t p = 0; p < t->n_parts; p++) {
        const char *id = t->parts[p].primary >= 0 ? t->nodes[t->parts[p].primary].id : "";
        h = drey_crc32c(h, id, strlen(id) + 1);
    }
    return h;
}

/* Sends the request to every member; PARKED, or REJECT when none can be
 * reached. */
static drey_stage_result fan_out(drey_cluster *c, drey_request *r, const drey_cluster__topology *t,
                                 void (*gathered)(fan *f), bool with_owners) {
    fan *f = drey_xcalloc(1, sizeof *f);
    f->c = c;
    f->r = r;
    f->gathered = gathered;
    f->slots = drey_xcalloc(t->n_nodes ? t->n_nodes : 1, sizeof *f->slots);
    const drey_cluster__node **to = drey_arena_alloc(r->arena, (t->n_nodes ? t->n_nodes : 1) * sizeof *to);
    for (size_t i = 0; i < t->n_nodes; i++) {
        if (t->nodes[i].member && t->nodes[i].internal[0] != '\0')
            to[f->n++] = &t->nodes[i];
    }
    if (f->n == 0) {
        fan_free(f);
        r->status = drey_status_new(r->arena, DREY_ERR_PARTITION_UNAVAILABLE);
        r->status->retry_delay_ms = 500;
        return DREY_STAGE_REJECT;
    }
    size_t n = f->n; /* f is freed by the last answer, which may come before the loop ends */
    atomic_store(&f->pending, n);
    drey_cluster__header h[4];
    size_t nh = drey_cluster__forward_headers(c, r, 0, h);
    if (with_owners) {
        char *hs = drey_arena_sprintf(r->arena, "%08x", owners_hash(t));
        h[nh++] = (drey_cluster__header){DREY_SCAN_OWNERS, hs, strlen(hs)};
    }
    for (size_t i = 0; i < n; i++)
        f->slots[i].fan = f;
    int64_t deadline = r->ops->deadline_mono_ns(r->door);
    for (size_t i = 0; i < n; i++) {
        /* This node's own share through its own chain, in-process (never
         * over its own TLS); the others' bounded by the caller's deadline,
         * like GetMany's parts. */
        if (t->self >= 0 && to[i] == &t->nodes[t->self] && c->opts.pipeline != NULL) {
            drey_pipeline_call_local(c->opts.pipeline, r->method, r->bytes, r->len, c->opts.node_id, h, nh, deadline,
                                     fan_done, &f->slots[i]);
            continue;
        }
        atomic_fetch_add(&c->route.forwarded, 1);
        drey_cluster__pcall_release(drey_cluster__peers_call(c->peers, to[i]->id, to[i]->internal, r->method->path,
                                                             r->bytes, r->len, h, nh, deadline, fan_done,
                                                             &f->slots[i]));
    }
    return DREY_STAGE_PARKED;
}

/* --- the figures ------------------------------------------------------------------ */

static void add_stats(Drey__Cache__V1__CacheStats *into, const Drey__Cache__V1__CacheStats *s) {
    into->entries += s->entries;
    into->bytes += s->bytes;
    into->evictions += s->evictions;
    into->evicted_bytes += s->evicted_bytes;
    into->expiring += s->expiring;
}

static void stats_gathered(fan *f) {
    if (relay_failure(f))
        return;
    drey_arena *a = f->r->arena;
    Drey__Cache__V1__CacheStats *sum = NULL;
    for (size_t i = 0; i < f->n; i++) {
        Drey__Cache__V1__CacheStats *s =
            drey__cache__v1__cache_stats__unpack(drey_arena_protobuf_allocator(a), f->slots[i].len, f->slots[i].bytes);
        if (s == NULL)
            continue;
        if (sum == NULL) {
            sum = s;
            continue;
        }
        add_stats(sum, s);
    }
    if (sum == NULL) {
        drey_status st = drey_status_of(DREY_ERR_INTERNAL);
        drey_request_fail(f->r, &st);
        return;
    }
    drey_request_reply(f->r, &sum->base);
}

static int by_name(const void *a, const void *b) {
    return strcmp((*(Drey__Cache__V1__CacheStats *const *)a)->cache, (*(Drey__Cache__V1__CacheStats *const *)b)->cache);
}

static void list_gathered(fan *f) {
    if (relay_failure(f))
        return;
    drey_arena *a = f->r->arena;
    Drey__Cache__V1__ListCachesResponse *out = drey_arena_alloc(a, sizeof *out);
    drey__cache__v1__list_caches_response__init(out);
    size_t cap = 0;
    for (size_t i = 0; i < f->n; i++) {
        Drey__Cache__V1__ListCachesResponse *l = drey__cache__v1__list_caches_response__unpack(
            drey_arena_protobuf_allocator(a), f->slots[i].len, f->slots[i].bytes);
        for (size_t j = 0; l != NULL && j < l->n_caches; j++) {
            size_t k = 0;
            while (k < out->n_caches && strcmp(out->caches[k]->cache, l->caches[j]->cache) != 0)
                k++;
            if (k < out->n_caches) {
                add_stats(out->caches[k], l->caches[j]);
                continue;
            }
            if (out->n_caches == cap) {
                cap = cap ? cap * 2 : 16;
                Drey__Cache__V1__CacheStats **grown = drey_arena_alloc(a, cap * sizeof *grown);
                if (out->n_caches > 0)
                    memcpy(grown, out->caches, out->n_caches * sizeof *grown);
                out->caches = grown;
            }
            out->caches[out->n_caches++] = l->caches[j];
        }
    }
    if (out->n_caches > 1)
        qsort(out->caches, out->n_caches, sizeof *out->caches, by_name);
    drey_request_reply(f->r, &out->base);
}

/* --- a node's share of the figures -------------------------------------------------- */

/* A node's share counts the partitions it leads, so that the sum over the
 * nodes counts each partition once however many copies it has (copies a
 * node holds without leading them are the others' to count). Evictions
 * are the node's per cache: a backup does not count the victims its
 * primary's records name (marked copies, drey_write.copy), the primary did.
 * While a partition moves the nodes' tables may disagree for a moment and
 * a sum count it twice or not at all: figures, not a promise. */
static bool leads(const drey_cluster__topology *t, uint32_t p) {
    return t->parts[p].primary >= 0 && t->parts[p].primary == t->self;
}

static Drey__Cache__V1__CacheStats *share_of(drey_cluster *c, drey_arena *a, const drey_cluster__topology *t,
                                             const char *cache, size_t len) {
    Drey__Cache__V1__CacheStats *m = drey_arena_alloc(a, sizeof *m);
    drey__cache__v1__cache_stats__init(m);
    m->cache = len == 0 ? "default" : drey_arena_strndup(a, cache, len);
    for (uint32_t p = 0; p < t->n_parts; p++) {
        if (!leads(t, p))
            continue;
        drey_cache_stats cs;
        drey_store_partition_cache_stats(c->opts.store, p, cache, len, &cs);
        m->entries += cs.entries;
        m->bytes += cs.bytes;
        m->expiring += cs.expiring;
    }
    drey_cache_stats node;
    drey_store_cache_stats(c->opts.store, cache, len, &node);
    m->evictions = node.evictions;
    m->evicted_bytes = node.evicted_bytes;
    return m;
}

typedef struct names {
    drey_arena *arena;
    char **v;
    size_t *len;
    size_t n, cap;
} names;

static void note_name(void *arg, const drey_cache_stats *cs) {
    names *o = arg;
    if (cs->cache_len > 0 && cs->cache[0] == '#')
        return; /* internal: remembered outcomes */
    for (size_t i = 0; i < o->n; i++) {
        if (o->len[i] == cs->cache_len && memcmp(o->v[i], cs->cache, cs->cache_len) == 0)
            return;
    }
    if (o->n == o->cap) {
        o->cap = o->cap ? o->cap * 2 : 16;
        char **v = drey_arena_alloc(o->arena, o->cap * sizeof *v);
        size_t *l = drey_arena_alloc(o->arena, o->cap * sizeof *l);
        if (o->n > 0) {
            memcpy(v, o->v, o->n * sizeof *v);
            memcpy(l, o->len, o->n * sizeof *l);
        }
        o->v = v;
        o->len = l;
    }
    o->v[o->n] = drey_arena_strndup(o->arena, cs->cache, cs->cache_len);
    o->len[o->n++] = cs->cache_len;
}

static drey_stage_result local_figures(drey_cluster *c, drey_request *r, const drey_cluster__topology *t) {
    if (r->msg->descriptor == &drey__cache__v1__get_cache_stats_request__descriptor) {
        const char *cache = ((const Drey__Cache__V1__GetCacheStatsRequest *)(const void *)r->msg)->cache;
        size_t len = strlen(cache);
        if (len == 7 && memcmp(cache, "default", 7) == 0)
            len = 0;
        drey_request_reply(r, &share_of(c, r->arena, t, cache, len)->base);
        return DREY_STAGE_ANSWERED;
    }
    names o = {.arena = r->arena};
    for (uint32_t p = 0; p < t->n_parts; p++) {
        if (leads(t, p))
            drey_store_partition_list_caches(c->opts.store, p, note_name, &o);
    }
    Drey__Cache__V1__ListCachesResponse *resp = drey_arena_alloc(r->arena, sizeof *resp);
    drey__cache__v1__list_caches_response__init(resp);
    resp->caches = drey_arena_alloc(r->arena, (o.n ? o.n : 1) * sizeof *resp->caches);
    for (size_t i = 0; i < o.n; i++) {
        Drey__Cache__V1__CacheStats *m = share_of(c, r->arena, t, o.v[i], o.len[i]);
        if (m->entries > 0)
            resp->caches[resp->n_caches++] = m;
    }
    drey_request_reply(r, &resp->base);
    return DREY_STAGE_ANSWERED;
}

/* --- Clear ---------------------------------------------------------------------------- */

/* Partitions moved since the call's table was read: its shares would not
 * add up to the whole cache. */
static drey_stage_result refuse_moved(drey_cluster *c, drey_request *r) {
    r->status = drey_status_new(r->arena, DREY_ERR_PARTITION_MOVING);
    drey_status_add_metadata(r->status, "node", "%s", c->opts.node_id);
    drey_status_add_metadata(r->status, "outcome", "not_applied");
    r->status->retry_delay_ms = 200;
    return DREY_STAGE_REJECT;
}

/* A Clear that failed: relayed as it came when no part of it cleared
 * anything (every part refused, none said CLEAR_INCOMPLETE) or when a part
 * was refused for good (a node's policy denied it: a retry cannot help),
 * else CLEAR_INCOMPLETE, retryable, with the first refusal's reason as its
 * cause. */
static void clear_gathered(fan *f) {
    size_t failed = 0;
    const slot *first = NULL;
    bool partial = false;
    for (size_t i = 0; i < f->n; i++) {
        const slot *s = &f->slots[i];
        if (s->code == 0)
            continue;
        failed++;
        char reason[48];
        drey_answer a = {.code = s->code, .details = s->bytes, .details_len = s->len};
        drey_cluster__answer_reason(&a, reason, sizeof reason);
        partial |= strcmp(reason, "CLEAR_INCOMPLETE") == 0;
        if (first == NULL)
            first = s;
    }
    if (failed == 0) {
        Drey__Cache__V1__ClearResponse resp = DREY__CACHE__V1__CLEAR_RESPONSE__INIT;
        drey_request_reply(f->r, &resp.base);
        return;
    }
    if ((failed == f->n && !partial) || first->code != GRPC_STATUS_UNAVAILABLE) {
        relay_failure(f);
        return;
    }
    char reason[48];
    drey_answer a = {.code = first->code, .details = first->bytes, .details_len = first->len};
    drey_cluster__answer_reason(&a, reason, sizeof reason);
    drey_status st = drey_status_of(DREY_ERR_CLEAR_INCOMPLETE);
    drey_status_add_metadata(&st, "cause", "%s", reason[0] != '\0' ? reason : "UNREACHABLE");
    drey_status_add_metadata(&st, "causeMessage", "%.200s", first->message != NULL ? first->message : "");
    drey_status_add_metadata(&st, "outcome", "unknown");
    st.retry_delay_ms = 200;
    drey_request_fail(f->r, &st);
}

/* A node's share of a Clear: one Partitions/Clear write per partition it
 * leads, through its own chain in-process, each routed, journaled and
 * replicated as one of that partition's writes, so that every copy clears
 * it at the same point of its sequence: a write racing the Clear is on
 * every copy or on none. Every share carries the ingress's owners hash and
 * a node whose table differs refuses its share (a partition that moved
 * between two nodes' shares would otherwise be cleared by neither); one
 * that moves after the check refuses its own write (NOT_PRIMARY). A move
 * copying a partition when its Clear runs starts again (move.c). */
static drey_stage_result local_clear(drey_cluster *c, drey_request *r, const drey_cluster__topology *t) {
    size_t len;
    const char *v = r->ops->metadata(r->door, DREY_SCAN_OWNERS, &len);
    char have[16];
    snprintf(have, sizeof have, "%08x", owners_hash(t));
    if (v == NULL || len != 8 || memcmp(v, have, 8) != 0)
        return refuse_moved(c, r);
    const drey_method *m = drey_method_find(c->opts.methods, DREY_PARTITION_CLEAR_PATH);
    size_t n = 0;
    for (uint32_t p = 0; p < t->n_parts; p++)
        n += t->parts[p].primary >= 0 && t->parts[p].primary == t->self;
    if (n == 0 || m == NULL || c->opts.pipeline == NULL) {
        Drey__Cache__V1__ClearResponse resp = DREY__CACHE__V1__CLEAR_RESPONSE__INIT;
        drey_request_reply(r, &resp.base);
        return DREY_STAGE_ANSWERED;
    }
    fan *f = drey_xcalloc(1, sizeof *f);
    *f = (fan){.c = c, .r = r, .n = n, .gathered = clear_gathered, .slots = drey_xcalloc(n, sizeof *f->slots)};
    atomic_store(&f->pending, n);
    slot *slots = f->slots; /* f is freed by the last answer, which may come before the loop ends */
    for (size_t i = 0; i < n; i++)
        slots[i].fan = f;
    drey_cluster__header h = {DREY_FORWARDED_BY, c->opts.node_id, strlen(c->opts.node_id)};
    const char *cache = drey_method_request_cache(r->msg);
    int64_t deadline = r->ops->deadline_mono_ns(r->door);
    size_t i = 0;
    for (uint32_t p = 0; p < t->n_parts && i < n; p++) {
        if (t->parts[p].primary < 0 || t->parts[p].primary != t->self)
            continue;
        Drey__Internal__V1__PartitionClearRequest req = DREY__INTERNAL__V1__PARTITION_CLEAR_REQUEST__INIT;
        req.partition = p;
        req.partitions = t->n_parts;
        req.cache = (char *)(cache != NULL ? cache : "");
        size_t blen = drey__internal__v1__partition_clear_request__get_packed_size(&req);
        uint8_t *bytes = drey_xmalloc(blen ? blen : 1); /* not the arena: answers may be using it */
        drey__internal__v1__partition_clear_request__pack(&req, bytes);
        drey_pipeline_call_local(c->opts.pipeline, m, bytes, blen, c->opts.node_id, &h, 1, deadline, fan_done,
                                 &slots[i++]);
        free(bytes);
    }
    return DREY_STAGE_PARKED;
}

/* --- Scan ----------------------------------------------------------------------------- */

/* A cluster cursor: 'c', the owners' hash (8 hex digits), the owner's index
 * (4 hex digits), '.', then that owner's own cursor (which it checks). */
#define SCAN_PREFIX 'c'

/* The owners in a stable order (by id): index i of the scan. */
static size_t owner_list(const drey_cluster__topology *t, drey_arena *a, int32_t **out) {
    int32_t *o = drey_arena_alloc(a, (t->n_nodes ? t->n_nodes : 1) * sizeof *o);
    size_t n = 0;
    for (size_t i = 0; i < t->n_nodes; i++) {
        bool owns = false;
        for (uint32_t p = 0; p < t->n_parts && !owns; p++)
            owns = t->parts[p].primary == (int32_t)i;
        if (!owns)
            continue;
        size_t k = n++;
        while (k > 0 && strcmp(t->nodes[o[k - 1]].id, t->nodes[i].id) > 0) {
            o[k] = o[k - 1];
            k--;
        }
        o[k] = (int32_t)i;
    }
    *out = o;
    return n;
}

typedef struct scan_call {
    drey_cluster *c;
    drey_request *r;
    uint32_t hash;
    size_t index, n_owners;
} scan_call;

static drey_stage_result scan_refused(drey_request *r, const char *why) {
    r->status = drey_status_new(r->arena, DREY_ERR_INVALID_CURSOR);
    drey_status_add_metadata(r->status, "why", "%s", why);
    drey_status_add_violation(r->status, DREY_ERR_INVALID_CURSOR, "cursor");
    return DREY_STAGE_REJECT;
}

static void scan_answered(void *arg, const drey_answer *a) {
    scan_call *sc = arg;
    drey_request *r = sc->r;
    if (a->code != 0) {
        drey_request_relay(r, a);
        return;
    }
    /* Only this thread touches the arena now. */
    Drey__Cache__V1__ScanResponse *resp = drey__cache__v1__scan_response__unpack(
        drey_arena_protobuf_allocator(r->arena), a->response_len, a->response);
    if (resp == NULL) {
        drey_answer bad = {.code = GRPC_STATUS_INTERNAL, .message = "a peer's answer did not decode"};
        bad.message_len = strlen(bad.message);
        drey_request_relay(r, &bad);
        return;
    }
    size_t next = sc->index;
    const char *inner = resp->next_cursor;
    if (inner[0] == '\0') { /* this owner is done: the next one, from its start */
        next++;
        inner = "";
    }
    resp->next_cursor = next < sc->n_owners
                            ? drey_arena_sprintf(r->arena, "%c%08x%04zx.%s", SCAN_PREFIX, sc->hash, next, inner)
                            : "";
    drey_request_reply(r, &resp->base);
}

static drey_stage_result route_scan(drey_cluster *c, drey_request *r, const drey_cluster__topology *t) {
    const Drey__Cache__V1__ScanRequest *req = (const void *)r->msg;
    uint32_t hash = owners_hash(t);
    int32_t *owners;
    size_t n = owner_list(t, r->arena, &owners);
    size_t index = 0;
    const char *inner = "";
    if (req->cursor[0] != '\0') {
        unsigned h;
        size_t i;
        int used = 0;
        if (req->cursor[0] != SCAN_PREFIX || sscanf(req->cursor + 1, "%8x%4zx.%n", &h, &i, &used) != 2 ||
            used != 13)
            return scan_refused(r, "not a cursor of a cluster scan");
        if (h != hash)
            return scan_refused(r, "partitions moved since the scan began: start it again (a scan never misses a "
                                   "key silently)");
        if (i >= n)
            return scan_refused(r, "names an owner the cluster does not have");
        index = i;
        inner = req->cursor + 1 + used;
    }
    if (n == 0) {
        Drey__Cache__V1__ScanResponse *empty = drey_arena_alloc(r->arena, sizeof *empty);
        drey__cache__v1__scan_response__init(empty);
        empty->next_cursor = "";
        drey_request_reply(r, &empty->base);
        return DREY_STAGE_ANSWERED;
    }
    const drey_cluster__node *to = &t->nodes[owners[index]];
    if (!to->member || to->internal[0] == '\0') {
        r->status = drey_status_new(r->arena, DREY_ERR_PARTITION_UNAVAILABLE);
        drey_status_add_metadata(r->status, "node", "%s", to->id);
        r->status->retry_delay_ms = 500;
        return DREY_STAGE_REJECT;
    }
    Drey__Cache__V1__ScanRequest sub = *req;
    sub.cursor = (char *)inner;
    size_t len = drey__cache__v1__scan_request__get_packed_size(&sub);
    uint8_t *bytes = drey_arena_alloc(r->arena, len ? len : 1);
    drey__cache__v1__scan_request__pack(&sub, bytes);
    scan_call *sc = drey_arena_alloc(r->arena, sizeof *sc);
    *sc = (scan_call){.c = c, .r = r, .hash = hash, .index = index, .n_owners = n};
    drey_cluster__header h[4];
    size_t nh = drey_cluster__forward_headers(c, r, 0, h);
    char *hs = drey_arena_sprintf(r->arena, "%08x", hash);
    h[nh++] = (drey_cluster__header){DREY_SCAN_OWNERS, hs, strlen(hs)};
    atomic_fetch_add(&c->route.forwarded, 1);
    drey_cluster__pcall_release(drey_cluster__peers_call(c->peers, to->id, to->internal, r->method->path, bytes, len, h,
                                                         nh, r->ops->deadline_mono_ns(r->door), scan_answered, sc));
    return DREY_STAGE_PARKED;
}

/* The owner's share of a scan: the partitions it owns (its table is the
 * scan's: the owners' hash matched). */
static bool keep_owned(void *arg, const char *cache, size_t cache_len, const char *key, size_t key_len) {
    const drey_cluster__topology *t = arg;
    uint32_t p = drey_partition_of_entry(cache, cache_len, key, key_len, t->n_parts);
    return p < t->n_parts && t->parts[p].primary >= 0 && t->parts[p].primary == t->self;
}

static void release_topology(void *arg) {
    drey_cluster__topology_unref(arg);
}

static drey_stage_result local_scan(drey_cluster *c, drey_request *r, drey_cluster__topology *t) {
    (void)c;
    size_t len;
    const char *v = r->ops->metadata(r->door, DREY_SCAN_OWNERS, &len);
    char want[16];
    if (v == NULL || len != 8)
        return scan_refused(r, "a forwarded scan must name its table");
    memcpy(want, v, 8);
    want[8] = '\0';
    char have[16];
    snprintf(have, sizeof have, "%08x", owners_hash(t));
    if (strcmp(want, have) != 0)
        return scan_refused(r, "partitions moved since the scan began: start it again (a scan never misses a "
                               "key silently)");
    atomic_fetch_add(&t->refs, 1); /* until the request is answered */
    r->keep = keep_owned;
    r->keep_ctx = t;
    r->on_release = release_topology;
    r->release_arg = t;
    return DREY_STAGE_NEXT;
}

/* --- the row's entry ------------------------------------------------------------------ */

drey_stage_result drey_cluster__route_cache_wide(drey_cluster *c, drey_request *r, drey_cluster__topology *t) {
    const ProtobufCMessageDescriptor *d = r->msg->descriptor;
    if (r->forwarded_by != NULL) { /* a node's share: here, never further */
        if (d == &drey__cache__v1__clear_request__descriptor)
            return local_clear(c, r, t);
        if (d == &drey__cache__v1__scan_request__descriptor)
            return local_scan(c, r, t);
        if (c->opts.store != NULL)
            return local_figures(c, r, t);
        return DREY_STAGE_NEXT;
    }
    if (d == &drey__cache__v1__scan_request__descriptor)
        return route_scan(c, r, t);
    if (d == &drey__cache__v1__clear_request__descriptor)
        return fan_out(c, r, t, clear_gathered, true);
    if (d == &drey__cache__v1__list_caches_request__descriptor)
        return fan_out(c, r, t, list_gathered, false);
    return fan_out(c, r, t, stats_gathered, false);
}
