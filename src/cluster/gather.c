/*
 * gather — a read of independent keys (DREY_ROUTE_KEYS: GetMany) split by
 * partition and answered in the caller's order.
 *
 * Keys this node can answer (it leads their partition, or holds an in-sync
 * copy and the read allows a stale answer) are read here first; every other
 * owner gets one request of its keys; the answers are gathered in the
 * caller's order. Reads are per key anyway, so nothing is lost by
 * splitting. A key whose primary is unreachable goes to a live backup when
 * the read allows it. The request and response are handled by field name
 * (`keys`, `results`, `from_backup`, `lag_ms`: drey_method_request_with_keys
 * and its kin), so a new method of this shape needs nothing here.
 */
#include <stdlib.h>
#include <string.h>

#include "drey/placement.h"
#include "router.h"
#include "peers.h"

typedef struct gather {
    drey_request *r;
    size_t n;
    ProtobufCMessage **results; /* in the caller's order */
    _Atomic size_t pending;
    drey_answer failure; /* the first remote failure, copied into the arena */
    bool failed;
    bool from_backup; /* some keys were answered by backups, the stalest lag_ms ago */
    uint64_t lag_ms;
} gather;

typedef struct scatter_part {
    gather *g;
    size_t *index; /* positions in the caller's keys */
    size_t n;
} scatter_part;

static void gathered(gather *g) {
    drey_request *r = g->r;
    if (g->failed) {
        drey_request_relay(r, &g->failure);
        return;
    }
    ProtobufCMessage *resp = drey_method_response_gathered(r->arena, r->method->desc->output, g->results, g->n);
    if (g->from_backup)
        drey_method_response_mark_stale(resp, g->lag_ms);
    drey_request_reply(r, resp);
}

/* The part's results into their places; false if resp does not fit. */
static bool place(scatter_part *sp, const ProtobufCMessage *resp) {
    gather *g = sp->g;
    ProtobufCMessage **results;
    if (resp == NULL || drey_method_response_results(resp, &results) != sp->n)
        return false;
    for (size_t i = 0; i < sp->n; i++)
        g->results[sp->index[i]] = results[i];
    uint64_t lag;
    if (drey_method_response_stale(resp, &lag)) {
        g->from_backup = true;
        g->lag_ms = lag > g->lag_ms ? lag : g->lag_ms;
    }
    return true;
}

static void scatter_done(void *arg, const drey_answer *a) {
    scatter_part *sp = arg;
    gather *g = sp->g;
    drey_arena *arena = g->r->arena; /* only the peers' thread touches it now */
    ProtobufCMessage *resp = NULL;
    if (a->code == GRPC_STATUS_OK)
        resp = protobuf_c_message_unpack(g->r->method->desc->output, drey_arena_protobuf_allocator(arena),
                                         a->response_len, a->response);
    if (!place(sp, resp) && !g->failed) {
        g->failed = true;
        g->failure = *a;
        if (a->code == GRPC_STATUS_OK)
            g->failure = (drey_answer){.code = GRPC_STATUS_INTERNAL, .message = "a peer's answer did not decode"};
        g->failure.message = drey_arena_strndup(arena, g->failure.message, g->failure.message_len);
        if (a->details != NULL) {
            uint8_t *d = drey_arena_alloc(arena, a->details_len);
            memcpy(d, a->details, a->details_len);
            g->failure.details = d;
        }
        g->failure.response = NULL;
        g->failure.response_len = 0;
    }
    if (atomic_fetch_sub(&g->pending, 1) == 1)
        gathered(g);
}

drey_stage_result drey_cluster__route_keys(drey_cluster *c, drey_request *r, const drey_cluster__topology *t) {
    const char *cache = drey_method_request_cache(r->msg);
    size_t n = drey_method_request_key_count(r->msg);
    bool stale = drey_method_request_allows_stale(r->msg);
    int32_t *who = drey_arena_alloc(r->arena, (n ? n : 1) * sizeof *who);
    bool all_here = true;
    gather *g = drey_arena_calloc(r->arena, sizeof *g);
    for (size_t i = 0; i < n; i++) {
        const char *key = drey_method_request_key(r->msg, i);
        uint32_t p = drey_placement_partition(cache, strlen(cache), key, strlen(key), t->n_parts);
        uint64_t lag_ms;
        if (stale && drey_cluster__stale_copy(c, t, p, &lag_ms)) {
            who[i] = -1;
            g->from_backup = true;
            g->lag_ms = lag_ms > g->lag_ms ? lag_ms : g->lag_ms;
            continue;
        }
        const drey_cluster__node *node = NULL;
        drey_stage_result refusal;
        int o = drey_cluster__owner(c, r, t, p, &node, &refusal, false);
        if (o < 0 && stale && r->forwarded_by == NULL && (node = drey_cluster__live_backup(t, p)) != NULL) {
            o = 0;
            r->status = NULL;
        }
        if (o < 0)
            return refusal;
        who[i] = o == 1 ? -1 : (int32_t)(node - t->nodes);
        all_here &= o == 1;
    }
    if (all_here && !g->from_backup)
        return DREY_STAGE_NEXT;
    g->r = r;
    g->n = n;
    g->results = drey_arena_alloc(r->arena, (n ? n : 1) * sizeof *g->results);
    /* Groups: this node's keys (-1), then each other owner's. */
    size_t n_groups = 0;
    int32_t *groups = drey_arena_alloc(r->arena, (n + 1) * sizeof *groups);
    for (size_t i = 0; i < n; i++) {
        size_t k = 0;
        while (k < n_groups && groups[k] != who[i])
            k++;
        if (k == n_groups)
            groups[n_groups++] = who[i];
    }
    scatter_part *parts = drey_arena_calloc(r->arena, n_groups * sizeof *parts);
    size_t remote = 0;
    for (size_t k = 0; k < n_groups; k++) {
        parts[k].g = g;
        parts[k].index = drey_arena_alloc(r->arena, n * sizeof *parts[k].index);
        for (size_t i = 0; i < n; i++) {
            if (who[i] == groups[k])
                parts[k].index[parts[k].n++] = i;
        }
        remote += groups[k] >= 0;
    }
    atomic_store(&g->pending, remote);
    /* This node's keys first, while nothing else touches the arena; every
     * sub-request packed before any is sent: answers may come at once. */
    uint8_t **bytes = drey_arena_alloc(r->arena, n_groups * sizeof *bytes);
    size_t *lens = drey_arena_alloc(r->arena, n_groups * sizeof *lens);
    for (size_t k = 0; k < n_groups; k++) {
        ProtobufCMessage *sub = drey_method_request_with_keys(r->arena, r->msg, parts[k].index, parts[k].n);
        if (groups[k] < 0) {
            if (!place(&parts[k], drey_cluster__read_here(r, sub)))
                return DREY_STAGE_REJECT;
            continue;
        }
        lens[k] = protobuf_c_message_get_packed_size(sub);
        bytes[k] = drey_arena_alloc(r->arena, lens[k] ? lens[k] : 1);
        protobuf_c_message_pack(sub, bytes[k]);
    }
    if (remote == 0) {
        gathered(g);
        return DREY_STAGE_ANSWERED;
    }
    drey_cluster__header h[3];
    size_t nh = drey_cluster__forward_headers(c, r, 0, h);
    /* The last answer replies and frees r's arena, which holds all of this:
     * nothing of it is read once the last call is out. */
    for (size_t k = 0, left = remote; left > 0; k++) {
        if (groups[k] < 0)
            continue;
        const drey_cluster__node *to = &t->nodes[groups[k]];
        atomic_fetch_add(&c->route.forwarded, 1);
        left--;
        /* Not cancelled with the caller: the deadline bounds them. */
        drey_cluster__pcall_release(drey_cluster__peers_call(c->peers, to->id, to->internal, r->method->path,
                                                             bytes[k], lens[k], h, nh,
                                                             r->ops->deadline_mono_ns(r->door), scatter_done,
                                                             &parts[k]));
    }
    return DREY_STAGE_PARKED;
}
