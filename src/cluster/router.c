/*
 * router — the chain's route row: run here, forward once, or refuse.
 *
 * A data request names its keys by field: `cache` with `key` (one key),
 * `keys` (GetMany) or `entries[].key` (SetMany). One key's partition has one
 * owner; the request runs here when that is this node, is forwarded to the
 * owner otherwise, and is refused when the owner is not a member
 * (PARTITION_UNAVAILABLE: with one replica nobody else has the data) or
 * when this node received it forwarded and does not own it (NOT_PRIMARY,
 * never forwarded twice: two tables that disagree cannot bounce a call).
 *
 * A forwarded call carries the caller's token (the owner verifies it again,
 * so a request_id stays scoped by the original principal), the forwarding
 * node's id and the partition's epoch, and the caller's remaining deadline.
 * The owner's answer is relayed as it came, details included. A NOT_PRIMARY
 * answer means the owner's table is newer: once this node's table has moved
 * on (or after a second) the request is routed once more. That retry is
 * safe because NOT_PRIMARY is refused before the journal; nothing else is
 * ever retried here.
 *
 * SetMany and RemoveMany must keep to one partition (CROSS_PARTITION);
 * Scan, Clear and the cache figures reach every owner (fanout.c).
 *
 * While this node moves a partition out (move.c), its local writes are
 * counted in and out here: while it is copied they record the keys they
 * changed, and for the last moments they wait for the handover, then go
 * where the table says. A forwarded call that names an epoch newer than
 * this node's table waits (a second at most) for the table to catch up
 * instead of being refused: that is the new owner hearing of a handover
 * from the old one before its watch did.
 *
 * GetMany scatters: keys this node owns are read here first, then every
 * other owner gets one GetMany of its keys; the answers are gathered in the
 * caller's order. Reads are per key anyway, so nothing is lost by splitting.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/cache/v1/cache.pb-c.h"
#include "drey/clock.h"
#include "drey/commit.h"
#include "drey/internal/v1/move.pb-c.h"
#include "drey/log.h"
#include "drey/placement.h"
#include "google/rpc/error_details.pb-c.h"
#include "google/rpc/status.pb-c.h"
#include "internal.h"

#define RETRY_WAIT_NS 1000000000LL
#define RETRY_POLL_NS 10000000LL
#define UNAVAILABLE_RETRY_MS 500

/* What fwd.call holds besides a call's handle. */
#define CALL_DONE ((drey_cluster__pcall *)1)      /* answered (or being) */
#define CALL_CANCELLED ((drey_cluster__pcall *)2) /* the caller went away */

typedef struct fwd {
    drey_cluster *c;
    drey_request *r;
    /* The forwarded call in flight, so that a caller who goes away cancels
     * it (and the slot it holds here is freed when it ends), or a mark. */
    _Atomic(drey_cluster__pcall *) call;
    int64_t revision; /* of the table the request was routed with */
    int64_t await_revision; /* the retry waits for a table at least this new */
    int64_t retry_until_ns;
    bool retried, awaited;
    drey_timer timer;
    drey_cluster__waiter waiter; /* its partition is frozen */
} fwd;

/* A local write of a partition, counted while it runs; or a record a
 * backup took (its sequence, and when it came). */
typedef struct hold {
    drey_cluster *c;
    drey_request *r;
    uint32_t partition;
    uint64_t seq;
    int64_t received_ns;
} hold;

/* --- what a request names --------------------------------------------------- */

static uint32_t partition_of(const drey_cluster__topology *t, const char *cache, const char *key) {
    return drey_placement_partition(cache, strlen(cache), key, strlen(key), t->n_parts);
}

/* --- refusals ---------------------------------------------------------------- */

static drey_stage_result not_primary(drey_cluster *c, drey_request *r, const drey_cluster__topology *t, uint32_t p) {
    atomic_fetch_add(&c->not_primary, 1);
    drey_status *st = drey_arena_alloc(r->arena, sizeof *st);
    drey_status_init(st);
    drey_status_set(st, DREY_ERR_NOT_PRIMARY);
    drey_status_add_metadata(st, "partition", "%u", p);
    drey_status_add_metadata(st, "epoch", "%lld", (long long)t->parts[p].epoch);
    drey_status_add_metadata(st, "primary", "%s", t->parts[p].primary >= 0 ? t->nodes[t->parts[p].primary].id : "");
    r->status = st;
    return DREY_STAGE_REJECT;
}

/* PARTITION_UNAVAILABLE (no owner to reach), or LEASE_EXPIRED (this node
 * owns it but may not lead it now). */
static drey_stage_result unavailable(drey_cluster *c, drey_request *r, uint32_t p, drey_error e) {
    if (e == DREY_ERR_PARTITION_UNAVAILABLE)
        atomic_fetch_add(&c->unavailable, 1);
    drey_status *st = drey_arena_alloc(r->arena, sizeof *st);
    drey_status_init(st);
    drey_status_set(st, e);
    drey_status_add_metadata(st, "partition", "%u", p);
    st->retry_delay_ms = UNAVAILABLE_RETRY_MS;
    r->status = st;
    return DREY_STAGE_REJECT;
}

/* The epoch the forwarding node's table had for the partition; 0: none. */
static int64_t forwarded_epoch(drey_request *r) {
    size_t len;
    const char *v = r->ops->metadata(r->door, DREY_FORWARD_EPOCH, &len);
    char buf[24];
    if (v == NULL || len == 0 || len >= sizeof buf)
        return 0;
    memcpy(buf, v, len);
    buf[len] = '\0';
    return strtoll(buf, NULL, 10);
}

#define OWNER_AWAIT 2 /* a forwarded call from a newer table: wait for ours */

/* The owner of p when a call may go to it: 1 this node, 0 another (*node),
 * -1 refused (r->status set), OWNER_AWAIT (only when may_await). */
static int owner(drey_cluster *c, drey_request *r, const drey_cluster__topology *t, uint32_t p,
                 const drey_cluster__node **node, drey_stage_result *refusal, bool may_await) {
    int32_t o = t->parts[p].primary;
    if (o >= 0 && o == t->self) {
        /* Another node may lead it once etcd expired the lease: not before
         * it lapsed by this node's clock. */
        if (c->rf > 1 && !drey_cluster__may_lead(c, t)) {
            *refusal = unavailable(c, r, p, DREY_ERR_LEASE_EXPIRED);
            return -1;
        }
        return 1;
    }
    if (r->forwarded_by != NULL) {
        if (may_await && c->opts.timers != NULL && forwarded_epoch(r) > t->revision)
            return OWNER_AWAIT;
        *refusal = not_primary(c, r, t, p);
        return -1;
    }
    if (o < 0 || !t->nodes[o].member || t->nodes[o].internal[0] == '\0') {
        *refusal = unavailable(c, r, p, DREY_ERR_PARTITION_UNAVAILABLE);
        return -1;
    }
    *node = &t->nodes[o];
    return 0;
}

/* --- stale reads ---------------------------------------------------------------------- */

static bool is_replica(const drey_cluster__topology *t, uint32_t p, int32_t node) {
    for (uint8_t i = 0; i < t->parts[p].n_replicas; i++) {
        if (t->parts[p].replicas[i] == node)
            return true;
    }
    return false;
}

/* Whether a read that allows it may be answered from this node's backup
 * copy of p, and how stale that copy may be. Not a copy under way, not
 * one broken by a failed record, not one never known current. */
static bool stale_copy(drey_cluster *c, const drey_cluster__topology *t, uint32_t p, uint64_t *lag_ms) {
    if (t->self < 0 || !is_replica(t, p, t->self))
        return false;
    const drey_cluster__pstate *ps = &c->pstate[p];
    int64_t at = atomic_load(&ps->current_ns);
    if (at == 0 || atomic_load(&ps->seq) == DREY_CLUSTER_SEQ_BROKEN)
        return false;
    int64_t now = drey_mono_ns();
    *lag_ms = now > at ? (uint64_t)((now - at) / 1000000) : 0;
    return true;
}

static bool allows_stale(const drey_request *r) {
    const ProtobufCMessageDescriptor *d = r->msg->descriptor;
    if (d == &drey__cache__v1__get_request__descriptor)
        return ((const Drey__Cache__V1__GetRequest *)r->msg)->allow_stale;
    if (d == &drey__cache__v1__get_many_request__descriptor)
        return ((const Drey__Cache__V1__GetManyRequest *)r->msg)->allow_stale;
    return false;
}

/* A read of msg (r's, or a part of it) answered by this node's store
 * here in the route row; NULL with r->status set when it fails. */
static ProtobufCMessage *read_here(drey_request *r, const ProtobufCMessage *msg) {
    drey_status st;
    drey_status_init(&st);
    drey_apply ax = {.now_ms = drey_wall_ms(), .arena = r->arena, .status = &st};
    ProtobufCMessage *resp = r->method->apply(r->method->ctx, &ax, msg);
    if (resp == NULL) {
        r->status = drey_arena_alloc(r->arena, sizeof st);
        *r->status = st;
    }
    return resp;
}

/* A Get answered here from this node's backup copy. */
static drey_stage_result answer_stale(drey_request *r, uint64_t lag_ms) {
    Drey__Cache__V1__GetResponse *resp = (void *)read_here(r, r->msg);
    if (resp == NULL)
        return DREY_STAGE_REJECT;
    resp->from_backup = true;
    resp->lag_ms = lag_ms;
    drey_request_reply(r, &resp->base);
    return DREY_STAGE_ANSWERED;
}

/* With its primary gone, a stale read goes to a backup that is a member
 * (NULL: none). */
static const drey_cluster__node *live_backup(const drey_cluster__topology *t, uint32_t p) {
    for (uint8_t i = 0; i < t->parts[p].n_replicas; i++) {
        const drey_cluster__node *n = &t->nodes[t->parts[p].replicas[i]];
        if (t->parts[p].replicas[i] != t->self && n->member && n->internal[0] != '\0')
            return n;
    }
    return NULL;
}

/* --- forwarding -------------------------------------------------------------- */

size_t drey_cluster__forward_headers(drey_cluster *c, drey_request *r, int64_t epoch, drey_cluster__header *h) {
    size_t n = 0, len;
    const char *auth = r->ops->metadata(r->door, "authorization", &len);
    if (auth != NULL)
        h[n++] = (drey_cluster__header){"authorization", auth, len};
    h[n++] = (drey_cluster__header){DREY_FORWARDED_BY, c->opts.node_id, strlen(c->opts.node_id)};
    const char *e = drey_arena_sprintf(r->arena, "%lld", (long long)epoch);
    h[n++] = (drey_cluster__header){DREY_FORWARD_EPOCH, e, strlen(e)};
    return n;
}

void drey_cluster__answer_reason(const drey_answer *a, char *out, size_t cap) {
    out[0] = '\0';
    if (a->code == GRPC_STATUS_OK || a->details == NULL)
        return;
    Google__Rpc__Status *st = google__rpc__status__unpack(NULL, a->details_len, a->details);
    for (size_t i = 0; st != NULL && i < st->n_details && out[0] == '\0'; i++) {
        const Google__Protobuf__Any *any = st->details[i];
        if (strcmp(any->type_url, "type.googleapis.com/google.rpc.ErrorInfo") != 0)
            continue;
        Google__Rpc__ErrorInfo *ei = google__rpc__error_info__unpack(NULL, any->value.len, any->value.data);
        if (ei != NULL)
            snprintf(out, cap, "%s", ei->reason);
        if (ei != NULL)
            google__rpc__error_info__free_unpacked(ei, NULL);
    }
    if (st != NULL)
        google__rpc__status__free_unpacked(st, NULL);
}

/* Whether a is the owner's NOT_PRIMARY. */
static bool is_not_primary(const drey_answer *a) {
    char reason[32];
    drey_cluster__answer_reason(a, reason, sizeof reason);
    return a->code == GRPC_STATUS_UNAVAILABLE && strcmp(reason, "NOT_PRIMARY") == 0;
}

static drey_stage_result route_request(drey_cluster *c, drey_request *r, fwd *f);

static void reroute(fwd *f) {
    drey_request *r = f->r;
    switch (route_request(f->c, r, f)) {
    case DREY_STAGE_NEXT:
        drey_pipeline_resume(r);
        break;
    case DREY_STAGE_REJECT:
        drey_request_fail(r, r->status);
        break;
    default:
        break; /* forwarded again, or waiting again; answered later */
    }
}

/* Routes a request again once this node's table is new enough or the wait
 * is over (on the timer thread): one that met NOT_PRIMARY, or a forwarded
 * one that named a newer epoch. */
static void retry(void *arg) {
    fwd *f = arg;
    drey_cluster__topology *t = drey_cluster__acquire(f->c);
    int64_t rev = t->revision;
    drey_cluster__topology_unref(t);
    if (rev < f->await_revision && drey_mono_ns() < f->retry_until_ns) {
        f->timer.at_ns = drey_mono_ns() + RETRY_POLL_NS;
        drey_timer_arm(f->c->opts.timers, &f->timer);
        return;
    }
    if (f->retried)
        atomic_fetch_add(&f->c->retried, 1);
    reroute(f);
}

/* Routes f's request again once this node's table is at least revision
 * (or a second has passed), on the timer thread. */
static void await_table(fwd *f, int64_t revision) {
    f->await_revision = revision;
    f->retry_until_ns = drey_mono_ns() + RETRY_WAIT_NS;
    f->timer = (drey_timer){.at_ns = drey_mono_ns(), .fn = retry, .arg = f};
    drey_timer_arm(f->c->opts.timers, &f->timer);
}

static bool is_handle(const drey_cluster__pcall *p) {
    return p != NULL && p != CALL_DONE && p != CALL_CANCELLED;
}

/* The door's cancel hook: the caller went away. */
static void caller_gone(void *arg) {
    fwd *f = arg;
    drey_cluster__pcall *p = atomic_exchange(&f->call, CALL_CANCELLED);
    if (is_handle(p))
        drey_cluster__pcall_cancel(p);
}

static void forwarded_done(void *arg, const drey_answer *a) {
    fwd *f = arg;
    drey_cluster__pcall *p = atomic_exchange(&f->call, CALL_DONE);
    if (is_handle(p))
        drey_cluster__pcall_release(p);
    drey_cluster__pcall *done = CALL_DONE;
    /* A retry needs the slot back, unless the caller has gone meanwhile. */
    if (!f->retried && is_not_primary(a) && f->c->opts.timers != NULL &&
        atomic_compare_exchange_strong(&f->call, &done, NULL)) {
        f->retried = true;
        await_table(f, f->revision + 1);
        return;
    }
    drey_request_relay(f->r, a);
}

static void forward(drey_cluster *c, fwd *f, const drey_cluster__node *to, int64_t epoch) {
    drey_request *r = f->r;
    drey_cluster__header h[3];
    size_t n = drey_cluster__forward_headers(c, r, epoch, h);
    atomic_fetch_add(&c->forwarded, 1);
    drey_cluster__pcall *p = drey_cluster__peers_call(c->peers, to->id, to->internal, r->method->path, r->bytes,
                                                      r->len, h, n, r->ops->deadline_mono_ns(r->door),
                                                      forwarded_done, f);
    drey_cluster__pcall *none = NULL;
    if (!atomic_compare_exchange_strong(&f->call, &none, p)) {
        /* Answered already, or the caller left before the handle was kept. */
        if (none == CALL_CANCELLED)
            drey_cluster__pcall_cancel(p);
        else
            drey_cluster__pcall_release(p);
    }
}

/* --- GetMany: scatter and gather ---------------------------------------------- */

typedef struct gather {
    drey_request *r;
    const Drey__Cache__V1__GetManyRequest *req;
    Drey__Cache__V1__GetManyResponse__Result **results; /* in the caller's order */
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
    Drey__Cache__V1__GetManyResponse *resp = drey_arena_alloc(r->arena, sizeof *resp);
    drey__cache__v1__get_many_response__init(resp);
    resp->n_results = g->req->n_keys;
    resp->results = g->results;
    resp->from_backup = g->from_backup;
    resp->lag_ms = g->lag_ms;
    drey_request_reply(r, &resp->base);
}

static void scatter_done(void *arg, const drey_answer *a) {
    scatter_part *sp = arg;
    gather *g = sp->g;
    drey_arena *arena = g->r->arena; /* only the peers' thread touches it now */
    Drey__Cache__V1__GetManyResponse *resp = NULL;
    if (a->code == GRPC_STATUS_OK)
        resp = drey__cache__v1__get_many_response__unpack(drey_arena_protobuf_allocator(arena), a->response_len,
                                                         a->response);
    if (resp != NULL && resp->n_results == sp->n) {
        for (size_t i = 0; i < sp->n; i++)
            g->results[sp->index[i]] = resp->results[i];
        g->from_backup |= resp->from_backup;
        g->lag_ms = resp->lag_ms > g->lag_ms ? resp->lag_ms : g->lag_ms;
    } else if (!g->failed) {
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

/* The GetMany of the keys of part, in arena memory. */
static Drey__Cache__V1__GetManyRequest sub_request(drey_arena *a, const Drey__Cache__V1__GetManyRequest *req,
                                                   const scatter_part *part) {
    Drey__Cache__V1__GetManyRequest sub = *req;
    sub.n_keys = part->n;
    sub.keys = drey_arena_alloc(a, (part->n ? part->n : 1) * sizeof *sub.keys);
    for (size_t i = 0; i < part->n; i++)
        sub.keys[i] = req->keys[part->index[i]];
    return sub;
}

static drey_stage_result route_get_many(drey_cluster *c, drey_request *r, const drey_cluster__topology *t) {
    const Drey__Cache__V1__GetManyRequest *req = (const void *)r->msg;
    size_t n = req->n_keys;
    int32_t *who = drey_arena_alloc(r->arena, (n ? n : 1) * sizeof *who);
    bool all_here = true;
    gather *g = drey_arena_calloc(r->arena, sizeof *g);
    for (size_t i = 0; i < n; i++) {
        uint32_t p = partition_of(t, req->cache, req->keys[i]);
        uint64_t lag_ms;
        if (req->allow_stale && stale_copy(c, t, p, &lag_ms)) {
            who[i] = -1;
            g->from_backup = true;
            g->lag_ms = lag_ms > g->lag_ms ? lag_ms : g->lag_ms;
            continue;
        }
        const drey_cluster__node *node = NULL;
        drey_stage_result refusal;
        int o = owner(c, r, t, p, &node, &refusal, false);
        if (o < 0 && req->allow_stale && r->forwarded_by == NULL && (node = live_backup(t, p)) != NULL) {
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
    g->req = req;
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
    /* This node's keys first, while nothing else touches the arena. */
    for (size_t k = 0; k < n_groups; k++) {
        if (groups[k] >= 0)
            continue;
        Drey__Cache__V1__GetManyRequest sub = sub_request(r->arena, req, &parts[k]);
        Drey__Cache__V1__GetManyResponse *resp = (void *)read_here(r, &sub.base);
        if (resp == NULL)
            return DREY_STAGE_REJECT;
        for (size_t i = 0; i < parts[k].n; i++)
            g->results[parts[k].index[i]] = resp->results[i];
    }
    /* Pack every sub-request before sending any: answers may come at once. */
    uint8_t **bytes = drey_arena_alloc(r->arena, n_groups * sizeof *bytes);
    size_t *lens = drey_arena_alloc(r->arena, n_groups * sizeof *lens);
    for (size_t k = 0; k < n_groups; k++) {
        if (groups[k] < 0)
            continue;
        Drey__Cache__V1__GetManyRequest sub = sub_request(r->arena, req, &parts[k]);
        lens[k] = drey__cache__v1__get_many_request__get_packed_size(&sub);
        bytes[k] = drey_arena_alloc(r->arena, lens[k] ? lens[k] : 1);
        drey__cache__v1__get_many_request__pack(&sub, bytes[k]);
    }
    if (remote == 0) {
        gathered(g);
        return DREY_STAGE_ANSWERED;
    }
    drey_cluster__header h[3];
    size_t nh = drey_cluster__forward_headers(c, r, 0, h);
    for (size_t k = 0; k < n_groups; k++) {
        if (groups[k] < 0)
            continue;
        const drey_cluster__node *to = &t->nodes[groups[k]];
        atomic_fetch_add(&c->forwarded, 1);
        /* Not cancelled with the caller: the deadline bounds them. */
        drey_cluster__pcall_release(drey_cluster__peers_call(c->peers, to->id, to->internal, r->method->path,
                                                             bytes[k], lens[k], h, nh,
                                                             r->ops->deadline_mono_ns(r->door), scatter_done,
                                                             &parts[k]));
    }
    return DREY_STAGE_PARKED;
}

/* --- the row ------------------------------------------------------------------- */

/* SetMany and RemoveMany are atomic (one outcome per request_id), so
 * their keys must share a partition: false with CROSS_PARTITION (a field
 * violation per key elsewhere) when they do not. *p: that partition, or
 * UINT32_MAX for no keys. */
static bool batch_partition(drey_request *r, const drey_cluster__topology *t, uint32_t *p_out) {
    const char *cache = drey_method_request_cache(r->msg);
    const Drey__Cache__V1__SetManyRequest *set = (const void *)r->msg;
    const Drey__Cache__V1__RemoveManyRequest *rm = (const void *)r->msg;
    bool is_set = r->msg->descriptor == &drey__cache__v1__set_many_request__descriptor;
    size_t n = is_set ? set->n_entries : rm->n_keys;
    *p_out = UINT32_MAX;
    if (n == 0)
        return true;
    uint32_t p0 = partition_of(t, cache, is_set ? set->entries[0]->key : rm->keys[0]);
    drey_status *st = NULL;
    for (size_t i = 1; i < n; i++) {
        if (partition_of(t, cache, is_set ? set->entries[i]->key : rm->keys[i]) == p0)
            continue;
        if (st == NULL) {
            st = drey_arena_alloc(r->arena, sizeof *st);
            drey_status_init(st);
            drey_status_set(st, DREY_ERR_CROSS_PARTITION);
        }
        if (is_set)
            drey_status_add_violation(st, DREY_ERR_CROSS_PARTITION, "entries[%zu].key", i);
        else
            drey_status_add_violation(st, DREY_ERR_CROSS_PARTITION, "keys[%zu]", i);
    }
    if (st != NULL) {
        r->status = st;
        return false;
    }
    *p_out = p0;
    return true;
}

static fwd *fwd_of(drey_cluster *c, drey_request *r, fwd *f) {
    if (f != NULL)
        return f;
    f = drey_arena_calloc(r->arena, sizeof *f);
    f->c = c;
    f->r = r;
    if (r->ops->on_cancel != NULL)
        r->ops->on_cancel(r->door, caller_gone, f);
    return f;
}

/* --- writes of a partition being moved out --------------------------------------- */

static void record_key(drey_cluster *c, uint32_t p, const char *cache, size_t cache_len, const char *key,
                       size_t key_len) {
    drey_cluster__dirty *d = drey_xmalloc(sizeof *d + cache_len + key_len);
    d->partition = p;
    d->cache_len = (uint32_t)cache_len;
    d->key_len = (uint32_t)key_len;
    memcpy(d->data, cache, cache_len);
    memcpy(d->data + cache_len, key, key_len);
    pthread_mutex_lock(&c->move_mu);
    d->next = c->dirty;
    c->dirty = d;
    pthread_mutex_unlock(&c->move_mu);
}

/* The write was applied or refused: its keys (and its outcome's) are what
 * the copy may have missed. */
static void write_done(void *arg) {
    hold *h = arg;
    drey_cluster *c = h->c;
    drey_cluster__pstate *ps = &c->pstate[h->partition];
    if (atomic_load(&ps->moving)) {
        const ProtobufCMessage *m = h->r->msg;
        const char *cache = drey_method_request_cache(m);
        size_t n = drey_method_request_key_count(m);
        for (size_t i = 0; cache != NULL && i < n; i++) {
            const char *k = drey_method_request_key(m, i);
            if (k != NULL)
                record_key(c, h->partition, cache, strlen(cache), k, strlen(k));
        }
        if (h->r->write.request_id != NULL && h->r->write.request_id[0] != '\0' && c->opts.commit != NULL) {
            drey_key ok;
            drey_commit_outcome_key(c->opts.commit, &h->r->write, h->r->arena, &ok);
            record_key(c, h->partition, ok.cache, ok.cache_len, ok.key, ok.key_len);
        }
    }
    if (atomic_fetch_sub(&ps->inflight, 1) == 1 && atomic_load(&ps->frozen)) {
        pthread_mutex_lock(&c->move_mu);
        pthread_cond_broadcast(&c->move_cond);
        pthread_mutex_unlock(&c->move_mu);
    }
}

/* A record that failed after it was taken (this node's journal refused
 * it) is a gap in the partition's sequence: nothing after it may apply.
 * One that applied makes this copy current as of its arrival: the
 * primary acknowledges a write only once every copy has it, and this copy
 * takes records in order, so every write acknowledged before this one
 * came is here. */
static void record_done(void *arg) {
    hold *h = arg;
    drey_cluster__pstate *ps = &h->c->pstate[h->partition];
    if (h->r->failed) {
        atomic_store(&ps->seq, DREY_CLUSTER_SEQ_BROKEN);
        return;
    }
    drey_cluster__raise(&ps->applied, h->seq);
    drey_cluster__raise_i64(&ps->current_ns, h->received_ns);
}

static void waiter_wake(drey_cluster__waiter *w) {
    fwd *f = (fwd *)((char *)w - offsetof(fwd, waiter));
    reroute(f);
}

static bool in_partition(void *ctx, const char *cache, size_t cache_len, const char *key, size_t key_len) {
    const hold *h = ctx;
    return drey_placement_partition(cache, cache_len, key, key_len, h->c->n_parts) == h->partition;
}

/* A write this node runs for partition p: counted in (the mover waits for
 * the count to drain), or parked while p is frozen. The count goes up
 * before the freeze is looked at, and the mover freezes before it looks at
 * the count, so no write slips past both. */
static drey_stage_result hold_write(drey_cluster *c, drey_request *r, fwd **fp, uint32_t p) {
    drey_cluster__pstate *ps = &c->pstate[p];
    atomic_fetch_add(&ps->inflight, 1);
    if (!atomic_load(&ps->frozen)) {
        hold *h = drey_arena_alloc(r->arena, sizeof *h);
        *h = (hold){.c = c, .r = r, .partition = p};
        r->on_release = write_done;
        r->release_arg = h;
        r->route_note = h;
        /* Its record's victims are evicted by every copy of p: only p's
         * entries (another partition's copies elsewhere would differ). */
        if (c->rf > 1)
            r->evict_only = (drey_store_filter){.keep = in_partition, .ctx = h};
        return DREY_STAGE_NEXT;
    }
    if (atomic_fetch_sub(&ps->inflight, 1) == 1) {
        pthread_mutex_lock(&c->move_mu);
        pthread_cond_broadcast(&c->move_cond);
        pthread_mutex_unlock(&c->move_mu);
    }
    fwd *f = *fp = fwd_of(c, r, *fp);
    f->waiter = (drey_cluster__waiter){.partition = p, .wake = waiter_wake};
    pthread_mutex_lock(&c->move_mu);
    bool still = atomic_load(&ps->frozen); /* thawed meanwhile: go on at once */
    if (still) {
        f->waiter.next = c->waiters;
        c->waiters = &f->waiter;
    }
    pthread_mutex_unlock(&c->move_mu);
    if (!still)
        return hold_write(c, r, fp, p);
    return DREY_STAGE_PARKED;
}

uint32_t drey_cluster__held_partition(const drey_request *r) {
    return ((const hold *)r->route_note)->partition;
}

void drey_cluster__thaw(drey_cluster *c, uint32_t p) {
    pthread_mutex_lock(&c->move_mu);
    atomic_store(&c->pstate[p].frozen, false);
    drey_cluster__waiter *mine = NULL, **pp = &c->waiters;
    while (*pp != NULL) {
        drey_cluster__waiter *w = *pp;
        if (w->partition == p) {
            *pp = w->next;
            w->next = mine;
            mine = w;
        } else {
            pp = &w->next;
        }
    }
    pthread_mutex_unlock(&c->move_mu);
    /* The list holds the newest first, so mine is oldest first: the order
     * they came in. */
    while (mine != NULL) {
        drey_cluster__waiter *next = mine->next;
        mine->wake(mine);
        mine = next;
    }
}

/* --- a backup taking its primary's records ------------------------------------------ */

static drey_stage_result refuse_record(drey_cluster *c, drey_request *r, drey_error e, uint32_t p, uint64_t expected) {
    atomic_fetch_add(&c->records_refused, 1);
    r->status = drey_arena_alloc(r->arena, sizeof *r->status);
    drey_status_init(r->status);
    drey_status_set(r->status, e);
    drey_status_add_metadata(r->status, "partition", "%u", p);
    if (e == DREY_ERR_OUT_OF_SEQUENCE)
        drey_status_add_metadata(r->status, "expected", "%llu", (unsigned long long)expected);
    return DREY_STAGE_REJECT;
}

/* A record from a partition's primary: taken only in sequence, and only
 * from the primary this node's table names for it, or from the primary of
 * a newer epoch (the one that just named this node a backup, or was just
 * promoted, before this node's watch said so). A refused record leaves a gap: every
 * later one is refused too until a fresh copy (move.c) sets the sequence
 * again. */
static drey_stage_result accept_record(drey_cluster *c, drey_request *r, const drey_cluster__topology *t) {
    const Drey__Internal__V1__ReplicateRequest *req = (const void *)r->msg;
    uint32_t p = req->partition;
    if (p >= t->n_parts || req->partitions != t->n_parts)
        return refuse_record(c, r, DREY_ERR_MALFORMED_REQUEST, p, 0);
    const drey_cluster__part *part = &t->parts[p];
    int32_t o = part->primary;
    const char *from = r->forwarded_by;
    bool current = o >= 0 && from != NULL && strcmp(t->nodes[o].id, from) == 0 && is_replica(t, p, t->self);
    /* An older epoch is fenced only if it was another primary's: the entry
     * also changes when a move is planned or a backup added, and the
     * primary's records may name the epoch before that a little longer
     * than this node's table does. */
    if (req->epoch < part->epoch && !current)
        return refuse_record(c, r, DREY_ERR_STALE_EPOCH, p, 0);
    if (req->epoch == part->epoch && !current)
        return refuse_record(c, r, DREY_ERR_NOT_REPLICA, p, 0);
    uint64_t last = atomic_load(&c->pstate[p].seq);
    if (req->sequence != last + 1 || !atomic_compare_exchange_strong(&c->pstate[p].seq, &last, req->sequence))
        return refuse_record(c, r, DREY_ERR_OUT_OF_SEQUENCE, p, last + 1);
    atomic_fetch_add(&c->records_taken, 1);
    hold *h = drey_arena_alloc(r->arena, sizeof *h);
    *h = (hold){.c = c, .r = r, .partition = p, .seq = req->sequence, .received_ns = drey_mono_ns()};
    r->on_release = record_done;
    r->release_arg = h;
    return DREY_STAGE_NEXT;
}

/* A primary's heartbeat: each partition it names whose primary it is in
 * this node's table, and that this node backs, is current as of now if
 * every write the primary had acknowledged is applied here. (A mark from
 * a primary this table does not know yet is passed over: the next beat
 * will do.) The answer, this node's room, is the method's. */
static void accept_beat(drey_cluster *c, drey_request *r, const drey_cluster__topology *t) {
    const Drey__Internal__V1__BeatRequest *req = (const void *)r->msg;
    int64_t now = drey_mono_ns();
    for (size_t i = 0; req->partitions == t->n_parts && r->forwarded_by != NULL && i < req->n_marks; i++) {
        const Drey__Internal__V1__BeatRequest__Mark *m = req->marks[i];
        uint32_t p = m->partition;
        if (p >= t->n_parts || t->parts[p].primary < 0 || m->epoch < t->parts[p].epoch ||
            strcmp(t->nodes[t->parts[p].primary].id, r->forwarded_by) != 0 || !is_replica(t, p, t->self))
            continue;
        drey_cluster__pstate *ps = &c->pstate[p];
        if (atomic_load(&ps->seq) != DREY_CLUSTER_SEQ_BROKEN && atomic_load(&ps->applied) >= m->sequence)
            drey_cluster__raise_i64(&ps->current_ns, now);
    }
}

/* --- copies and handovers (move.c) --------------------------------------------------- */

static drey_stage_result refuse_copy(drey_cluster *c, drey_request *r, drey_error e, uint32_t p,
                                     const drey_cluster__topology *t, int64_t asked) {
    atomic_fetch_add(&c->copies_refused, 1);
    r->status = drey_arena_alloc(r->arena, sizeof *r->status);
    drey_status_init(r->status);
    drey_status_set(r->status, e);
    drey_status_add_metadata(r->status, "partition", "%u", p);
    if (p < t->n_parts)
        drey_status_add_metadata(r->status, "epoch", "%lld", (long long)t->parts[p].epoch);
    drey_status_add_metadata(r->status, "asked_epoch", "%lld", (long long)asked);
    return DREY_STAGE_REJECT;
}

static bool copy_target(const drey_cluster__topology *t, uint32_t p, int32_t node) {
    for (uint8_t i = 0; i < t->parts[p].n_joining; i++) {
        if (t->parts[p].joining[i] == node)
            return true;
    }
    return false;
}

static bool sent_by_primary(const drey_request *r, const drey_cluster__topology *t, uint32_t p) {
    int32_t o = t->parts[p].primary;
    return o >= 0 && r->forwarded_by != NULL && strcmp(t->nodes[o].id, r->forwarded_by) == 0;
}

/* A chunk of a copy (a move's or a new backup's). Taken only when this
 * node's table has the partition at the epoch the copy was planned at,
 * led by the sender, with this node the copy's target (joining or
 * syncing). Never while this node holds an in-sync copy, whatever the
 * epochs say: that copy has every acknowledged write and may be promoted.
 * A copy from a newer table than this node's waits (a second at most) for
 * the table: the target hearing of the plan from the primary before its
 * watch did. */
static drey_stage_result accept_import(drey_cluster *c, drey_request *r, const drey_cluster__topology *t, fwd **fp) {
    const Drey__Internal__V1__ImportRequest *imp = (const void *)r->msg;
    uint32_t p = imp->partition;
    if (p >= t->n_parts || imp->partitions != t->n_parts)
        return refuse_copy(c, r, DREY_ERR_MALFORMED_REQUEST, p, t, imp->epoch);
    if (t->self >= 0 && t->parts[p].primary == t->self)
        return refuse_copy(c, r, DREY_ERR_PARTITION_OWNED, p, t, imp->epoch);
    if (t->self >= 0 && is_replica(t, p, t->self))
        return refuse_copy(c, r, DREY_ERR_IN_SYNC_COPY, p, t, imp->epoch);
    if (imp->epoch > t->parts[p].epoch && c->opts.timers != NULL && (*fp == NULL || !(*fp)->awaited)) {
        fwd *f = *fp = fwd_of(c, r, *fp);
        f->awaited = true;
        f->revision = t->revision;
        await_table(f, imp->epoch);
        return DREY_STAGE_PARKED;
    }
    if (imp->epoch < t->parts[p].epoch)
        return refuse_copy(c, r, DREY_ERR_STALE_EPOCH, p, t, imp->epoch);
    if (imp->epoch != t->parts[p].epoch || t->self < 0 || !copy_target(t, p, t->self) || !sent_by_primary(r, t, p))
        return refuse_copy(c, r, DREY_ERR_COPY_NOT_PLANNED, p, t, imp->epoch);
    if (imp->last) {
        atomic_store(&c->pstate[p].seq, imp->sequence); /* the primary's next record follows it */
        atomic_store(&c->pstate[p].applied, imp->sequence);
    }
    return DREY_STAGE_NEXT;
}

/* A handover's check: this node backs the partition in sync at the
 * epoch, under the sender, and has applied every write up to the
 * sequence. The answer comes from here; the method changes nothing. */
static drey_stage_result accept_confirm(drey_cluster *c, drey_request *r, const drey_cluster__topology *t) {
    const Drey__Internal__V1__ConfirmRequest *req = (const void *)r->msg;
    uint32_t p = req->partition;
    if (p >= t->n_parts || req->partitions != t->n_parts)
        return refuse_copy(c, r, DREY_ERR_MALFORMED_REQUEST, p, t, req->epoch);
    if (req->epoch > t->parts[p].epoch) /* the plan is newer than this node's table */
        return refuse_copy(c, r, DREY_ERR_NOT_CAUGHT_UP, p, t, req->epoch);
    if (req->epoch < t->parts[p].epoch)
        return refuse_copy(c, r, DREY_ERR_STALE_EPOCH, p, t, req->epoch);
    if (t->self < 0 || !is_replica(t, p, t->self) || !sent_by_primary(r, t, p))
        return refuse_copy(c, r, DREY_ERR_NOT_REPLICA, p, t, req->epoch);
    const drey_cluster__pstate *ps = &c->pstate[p];
    uint64_t applied = atomic_load(&ps->applied), seq = atomic_load(&ps->seq);
    if (seq == DREY_CLUSTER_SEQ_BROKEN)
        return refuse_copy(c, r, DREY_ERR_OUT_OF_SEQUENCE, p, t, req->epoch);
    if (applied < req->sequence)
        return refuse_copy(c, r, DREY_ERR_NOT_CAUGHT_UP, p, t, req->epoch);
    Drey__Internal__V1__ConfirmResponse *resp = drey_arena_alloc(r->arena, sizeof *resp);
    drey__internal__v1__confirm_response__init(resp);
    resp->applied = applied;
    drey_request_reply(r, &resp->base);
    return DREY_STAGE_ANSWERED;
}

/* This node's own Drop of a copy it no longer holds a role for: refused
 * if its table names it in the partition again (a copy came back since). */
static drey_stage_result accept_drop(drey_cluster *c, drey_request *r, const drey_cluster__topology *t) {
    const Drey__Internal__V1__DropRequest *req = (const void *)r->msg;
    uint32_t p = req->partition;
    if (p >= t->n_parts || req->partitions != t->n_parts)
        return refuse_copy(c, r, DREY_ERR_MALFORMED_REQUEST, p, t, req->epoch);
    if (t->self >= 0 && t->parts[p].primary == t->self)
        return refuse_copy(c, r, DREY_ERR_PARTITION_OWNED, p, t, req->epoch);
    if (t->self >= 0 && is_replica(t, p, t->self))
        return refuse_copy(c, r, DREY_ERR_IN_SYNC_COPY, p, t, req->epoch);
    if (t->self >= 0 && copy_target(t, p, t->self))
        return refuse_copy(c, r, DREY_ERR_STALE_EPOCH, p, t, req->epoch);
    return DREY_STAGE_NEXT;
}

/* --- the row, continued ------------------------------------------------------------ */

static drey_stage_result route_request(drey_cluster *c, drey_request *r, fwd *f) {
    drey_cluster__topology *t = drey_cluster__acquire(c);
    drey_stage_result res = DREY_STAGE_NEXT;
    const char *cache = drey_method_request_cache(r->msg);
    const char *key = drey_method_request_key(r->msg, 0);
    uint32_t p;
    const ProtobufCMessageDescriptor *d = r->msg->descriptor;
    if (t->n_parts > 0 && (d == &drey__cache__v1__scan_request__descriptor ||
                           d == &drey__cache__v1__clear_request__descriptor ||
                           d == &drey__cache__v1__list_caches_request__descriptor ||
                           d == &drey__cache__v1__get_cache_stats_request__descriptor)) {
        res = drey_cluster__route_cache_wide(c, r, t);
        goto out;
    }
    if (d == &drey__internal__v1__replicate_request__descriptor && t->n_parts > 0) {
        res = accept_record(c, r, t);
        goto out;
    }
    if (d == &drey__internal__v1__beat_request__descriptor && t->n_parts > 0) {
        accept_beat(c, r, t);
        goto out;
    }
    if (d == &drey__internal__v1__import_request__descriptor && t->n_parts > 0) {
        res = accept_import(c, r, t, &f);
        goto out;
    }
    if (d == &drey__internal__v1__confirm_request__descriptor && t->n_parts > 0) {
        res = accept_confirm(c, r, t);
        goto out;
    }
    if (d == &drey__internal__v1__drop_request__descriptor && t->n_parts > 0) {
        res = accept_drop(c, r, t);
        goto out;
    }
    if (cache == NULL || t->n_parts == 0 || d == &drey__cache__v1__watch_request__descriptor)
        goto out; /* names no key: a node-local request; a Watch follows its owners itself (subscribe.c) */
    if (r->msg->descriptor == &drey__cache__v1__get_many_request__descriptor) {
        res = route_get_many(c, r, t);
        goto out;
    }
    if (d == &drey__cache__v1__set_many_request__descriptor || d == &drey__cache__v1__remove_many_request__descriptor) {
        bool ok = batch_partition(r, t, &p);
        if (!ok)
            res = DREY_STAGE_REJECT;
        if (!ok || p == UINT32_MAX)
            goto out;
    } else if (key != NULL) {
        p = partition_of(t, cache, key);
    } else {
        goto out;
    }
    const drey_cluster__node *to = NULL;
    bool stale = allows_stale(r);
    uint64_t lag_ms;
    if (stale && stale_copy(c, t, p, &lag_ms)) {
        res = answer_stale(r, lag_ms);
        goto out;
    }
    int o = owner(c, r, t, p, &to, &res, f == NULL || !f->awaited);
    if (o < 0 && stale && r->forwarded_by == NULL && (to = live_backup(t, p)) != NULL) {
        o = 0; /* its primary cannot answer: a backup may */
        r->status = NULL;
    }
    if (o < 0)
        goto out;
    if (o == 1) {
        res = (r->method->flags & DREY_METHOD_WRITE) != 0 ? hold_write(c, r, &f, p) : DREY_STAGE_NEXT;
        goto out;
    }
    f = fwd_of(c, r, f);
    f->revision = t->revision;
    res = DREY_STAGE_PARKED;
    if (o == OWNER_AWAIT) {
        f->awaited = true;
        await_table(f, forwarded_epoch(r));
        goto out;
    }
    forward(c, f, to, t->parts[p].epoch);
out:
    drey_cluster__topology_unref(t);
    return res;
}

drey_stage_result drey_cluster_route(void *cluster, drey_request *r) {
    return route_request(cluster, r, NULL);
}

void drey_cluster_get_status(drey_cluster *c, drey_cluster_status *out) {
    memset(out, 0, sizeof *out);
    drey_cluster__topology *t = drey_cluster__acquire(c);
    snprintf(out->node_id, sizeof out->node_id, "%s", c->opts.node_id);
    snprintf(out->controller, sizeof out->controller, "%s", t->controller);
    out->is_controller = strcmp(t->controller, c->opts.node_id) == 0;
    out->partitions = t->n_parts;
    out->revision = t->revision;
    out->rf = t->rf;
    for (uint32_t p = 0; p < t->n_parts; p++) {
        out->owned += t->parts[p].primary >= 0 && t->parts[p].primary == t->self;
        out->unassigned += t->parts[p].primary < 0;
        out->backup_of += t->self >= 0 && is_replica(t, p, t->self);
        out->under_replicated += t->parts[p].primary >= 0 && 1u + t->parts[p].n_replicas < t->rf;
    }
    for (size_t i = 0; i < t->n_nodes; i++)
        out->members += t->nodes[i].member;
    drey_cluster__topology_unref(t);
    pthread_mutex_lock(&c->mu);
    out->etcd_reachable = !c->lease_lost && !c->watch_ended;
    out->draining = c->draining;
    for (uint32_t p = 0; p < c->n_parts && c->entries != NULL; p++) {
        const Drey__Internal__V1__PartitionEntry *e = c->entries[p];
        if (e == NULL || e->n_joining == 0)
            continue;
        out->moving_out += strcmp(e->primary, c->opts.node_id) == 0;
        out->moving_in += strcmp(e->joining[0], c->opts.node_id) == 0;
    }
    pthread_mutex_unlock(&c->mu);
    out->moving_now = atomic_load(&c->moving);
    out->moves_done = atomic_load(&c->moves_done);
    out->moves_failed = atomic_load(&c->moves_failed);
    out->moved_entries = atomic_load(&c->moved_entries);
    out->moved_bytes = atomic_load(&c->moved_bytes);
    out->pause_last_us = atomic_load(&c->pause_last_us);
    out->pause_max_us = atomic_load(&c->pause_max_us);
    out->forwarded = atomic_load(&c->forwarded);
    out->not_primary = atomic_load(&c->not_primary);
    out->retried = atomic_load(&c->retried);
    out->unavailable = atomic_load(&c->unavailable);
    out->lease_valid = drey_cluster__lease_valid(c);
    for (uint32_t p = 0; c->lines != NULL && p < c->n_parts; p++) {
        pthread_mutex_lock(&c->lines[p].mu);
        out->replication_pending += c->lines[p].queued;
        pthread_mutex_unlock(&c->lines[p].mu);
    }
    out->replicated = atomic_load(&c->replicated);
    out->replica_failures = atomic_load(&c->replica_failures);
    out->isr_shrinks = atomic_load(&c->isr_shrinks);
    out->backups_added = atomic_load(&c->backups_added);
    out->records_taken = atomic_load(&c->records_taken);
    out->records_refused = atomic_load(&c->records_refused);
    out->handovers_done = atomic_load(&c->handovers_done);
    out->copies_refused = atomic_load(&c->copies_refused);
    out->failovers = atomic_load(&c->failovers);
}
