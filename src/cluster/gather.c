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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/placement.h"
#include "router.h"
#include "peers.h"
#include "table.h"

typedef struct gather {
    drey_cluster *c;
    drey_request *r;
    size_t n;
    ProtobufCMessage **results; /* in the caller's order */
    _Atomic size_t pending;
    drey_answer failure; /* the first remote failure, copied into the arena */
    drey_status *unreachable; /* or a part's owner could not be reached */
    bool failed;
    bool from_backup; /* some keys were answered by backups, the stalest lag_ms ago */
    uint64_t lag_ms;
} gather;

typedef struct scatter_part {
    gather *g;
    size_t *index; /* positions in the caller's keys */
    size_t n;
    char node[DREY_CLUSTER_MAX_ID]; /* asked */
    bool to_backup; /* the keys' primary could not be reached already */
} scatter_part;

static void gathered(gather *g) {
    drey_request *r = g->r;
    if (g->unreachable != NULL) {
        drey_request_fail(r, g->unreachable);
        return;
    }
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

static uint32_t partition_of_key(const drey_request *r, size_t i, uint32_t n_parts) {
    const char *cache = drey_method_request_cache(r->msg);
    const char *key = drey_method_request_key(r->msg, i);
    return drey_placement_partition(cache, strlen(cache), key, strlen(key), n_parts);
}

static void scatter_done(void *arg, const drey_answer *a);

/* One request of parts[k]'s keys to node `to` each (packed before any is
 * sent: answers may come at once, and the last frees r's arena). */
static void send_parts(gather *g, scatter_part **parts, const drey_cluster__node **to, size_t n_parts) {
    drey_request *r = g->r;
    drey_cluster *c = g->c;
    uint8_t **bytes = drey_arena_alloc(r->arena, n_parts * sizeof *bytes);
    size_t *lens = drey_arena_alloc(r->arena, n_parts * sizeof *lens);
    for (size_t k = 0; k < n_parts; k++) {
        ProtobufCMessage *sub = drey_method_request_with_keys(r->arena, r->msg, parts[k]->index, parts[k]->n);
        lens[k] = protobuf_c_message_get_packed_size(sub);
        bytes[k] = drey_arena_alloc(r->arena, lens[k] ? lens[k] : 1);
        protobuf_c_message_pack(sub, bytes[k]);
        snprintf(parts[k]->node, sizeof parts[k]->node, "%s", to[k]->id);
    }
    drey_cluster__header h[3];
    size_t nh = drey_cluster__forward_headers(c, r, 0, h);
    int64_t deadline = r->ops->deadline_mono_ns(r->door);
    for (size_t k = 0; k < n_parts; k++) {
        atomic_fetch_add(&c->route.forwarded, 1);
        /* Not cancelled with the caller: the deadline bounds them. */
        drey_cluster__pcall_release(drey_cluster__peers_call(c->peers, to[k]->id, to[k]->internal, r->method->path,
                                                             bytes[k], lens[k], h, nh, deadline, scatter_done,
                                                             parts[k]));
    }
}

/* sp's owner could not be reached: a stale read asks a live backup of
 * each key's partition instead; false when some key has none. Runs
 * before sp's own answer is counted, so the gather cannot end meanwhile. */
static bool ask_backups(scatter_part *sp) {
    gather *g = sp->g;
    drey_request *r = g->r;
    drey_cluster__topology *t = drey_cluster__acquire(g->c);
    const drey_cluster__node **by = drey_arena_alloc(r->arena, sp->n * sizeof *by);
    bool all = t->n_parts > 0;
    for (size_t i = 0; all && i < sp->n; i++) {
        by[i] = drey_cluster__live_backup(t, partition_of_key(r, sp->index[i], t->n_parts));
        all = by[i] != NULL && strcmp(by[i]->id, sp->node) != 0;
    }
    if (all) {
        scatter_part **parts = drey_arena_alloc(r->arena, sp->n * sizeof *parts);
        const drey_cluster__node **to = drey_arena_alloc(r->arena, sp->n * sizeof *to);
        size_t n_parts = 0;
        for (size_t i = 0; i < sp->n; i++) {
            size_t k = 0;
            while (k < n_parts && to[k] != by[i])
                k++;
            if (k == n_parts) {
                parts[k] = drey_arena_calloc(r->arena, sizeof *parts[k]);
                *parts[k] = (scatter_part){.g = g, .to_backup = true};
                parts[k]->index = drey_arena_alloc(r->arena, sp->n * sizeof *parts[k]->index);
                to[n_parts++] = by[i];
            }
            parts[k]->index[parts[k]->n++] = sp->index[i];
        }
        atomic_fetch_add(&g->pending, n_parts);
        send_parts(g, parts, to, n_parts);
    }
    drey_cluster__topology_unref(t);
    return all;
}

static void scatter_done(void *arg, const drey_answer *a) {
    scatter_part *sp = arg;
    gather *g = sp->g;
    drey_request *r = g->r;
    drey_arena *arena = r->arena; /* only the peers' thread touches it now */
    ProtobufCMessage *resp = NULL;
    if (a->code == GRPC_STATUS_OK)
        resp = protobuf_c_message_unpack(r->method->desc->output, drey_arena_protobuf_allocator(arena),
                                         a->response_len, a->response);
    bool unreachable = a->code == GRPC_STATUS_UNAVAILABLE && a->details == NULL; /* the transport's */
    if (unreachable && !sp->to_backup && !g->failed && drey_method_request_allows_stale(r->msg) &&
        r->forwarded_by == NULL && ask_backups(sp)) {
        /* answered by the backups */
    } else if (!place(sp, resp) && !g->failed) {
        g->failed = true;
        if (unreachable) {
            /* As a forwarded call's (router.c): typed, and nothing applied. */
            drey_cluster__topology *t = drey_cluster__acquire(g->c);
            uint32_t p = t->n_parts > 0 ? partition_of_key(r, sp->index[0], t->n_parts) : 0;
            drey_cluster__topology_unref(t);
            g->unreachable = drey_cluster__unreachable(g->c, r, p, sp->node, a, false);
        }
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

drey_stage_result drey_cluster__route_keys(drey_cluster *c, drey_request *r, const drey_cluster__topology *t,
                                          bool may_await, int64_t *hold_ns) {
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
        int o = drey_cluster__owner(c, r, t, p, &node, &refusal, may_await);
        if (o == DREY_CLUSTER_OWNER_HOLD) {
            *hold_ns = r->status->retry_delay_ms * 1000000LL;
            r->status = NULL;
            return DREY_STAGE_PARKED;
        }
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
    g->c = c;
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
    scatter_part **parts = drey_arena_alloc(r->arena, n_groups * sizeof *parts);
    const drey_cluster__node **to = drey_arena_alloc(r->arena, n_groups * sizeof *to);
    size_t remote = 0;
    scatter_part here = {.g = g};
    for (size_t k = 0; k < n_groups; k++) {
        scatter_part *sp = groups[k] < 0 ? &here : drey_arena_calloc(r->arena, sizeof *sp);
        sp->g = g;
        sp->index = drey_arena_alloc(r->arena, n * sizeof *sp->index);
        for (size_t i = 0; i < n; i++) {
            if (who[i] == groups[k])
                sp->index[sp->n++] = i;
        }
        if (groups[k] >= 0) {
            to[remote] = &t->nodes[groups[k]];
            parts[remote++] = sp;
        }
    }
    /* This node's keys first, while nothing else touches the arena. */
    if (here.n > 0 && !place(&here, drey_cluster__read_here(r, drey_method_request_with_keys(r->arena, r->msg,
                                                                                              here.index, here.n))))
        return DREY_STAGE_REJECT;
    if (remote == 0) {
        gathered(g);
        return DREY_STAGE_ANSWERED;
    }
    atomic_store(&g->pending, remote);
    send_parts(g, parts, to, remote);
    return DREY_STAGE_PARKED;
}
