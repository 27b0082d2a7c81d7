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
#include "backup.h"
#include "router.h"
#include "partition.h"
#include "peers.h"
#include "table.h"

#define RETRY_WAIT_NS 1000000000LL
#define RETRY_POLL_NS 10000000LL

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
    bool primary_failed; /* a stale read's forward to the primary broke: ask a backup */
    uint32_t partition;                /* of the last forward */
    char primary[DREY_CLUSTER_MAX_ID]; /* the partition's then */
    drey_timer timer;
    drey_cluster__parked parked; /* its partition is frozen */
} fwd;

typedef drey_cluster__note hold;

/* --- what a request names --------------------------------------------------- */

static uint32_t partition_of(const drey_cluster__topology *t, const char *cache, const char *key) {
    return drey_placement_partition(cache, strlen(cache), key, strlen(key), t->n_parts);
}

/* A read answered here from this node's backup copy. */
static drey_stage_result answer_stale(drey_request *r, uint64_t lag_ms) {
    ProtobufCMessage *resp = drey_cluster__read_here(r, r->msg);
    if (resp == NULL)
        return DREY_STAGE_REJECT;
    drey_method_response_mark_stale(resp, lag_ms);
    drey_request_reply(r, resp);
    return DREY_STAGE_ANSWERED;
}

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
        atomic_fetch_add(&f->c->route.retried, 1);
    reroute(f);
}

/* Routes f's request again once this node's table is at least revision
 * (or wait_ns has passed), on the timer thread. */
static void await_table(fwd *f, int64_t revision, int64_t wait_ns) {
    f->await_revision = revision;
    f->retry_until_ns = drey_mono_ns() + wait_ns;
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
        await_table(f, f->revision + 1, RETRY_WAIT_NS);
        return;
    }
    drey_request *r = f->r;
    if (a->code == GRPC_STATUS_UNAVAILABLE && a->details == NULL && !f->primary_failed &&
        drey_method_request_allows_stale(r->msg) && r->forwarded_by == NULL && f->c->opts.timers != NULL &&
        atomic_compare_exchange_strong(&f->call, &done, NULL)) {
        /* The table still names a primary that cannot be reached (killed,
         * and its lease not out yet): a stale read may be answered by a
         * live backup meanwhile. Routed again on the timer thread, as a
         * retry is, so that this peer's thread never waits on another. */
        f->primary_failed = true;
        await_table(f, 0, 0);
        return;
    }
    if (a->code == GRPC_STATUS_UNAVAILABLE && a->details == NULL) {
        /* The transport's, not the owner's (whose refusals carry details):
         * the owner could not be reached, or its stream broke. A write may
         * have reached its journal before the stream broke; not one that
         * never left. */
        drey_request_fail(r, drey_cluster__unreachable(f->c, r, f->partition, f->primary, a,
                                                       (r->method->flags & DREY_METHOD_WRITE) != 0 && !a->unsent));
        return;
    }
    drey_request_relay(r, a);
}

/* f may be gone once the call is out (its answer can free the request on
 * the peers' thread): the handle is kept in f->call before that can happen,
 * and nothing of f is touched here after. */
static void forward(drey_cluster *c, fwd *f, const drey_cluster__node *to, int64_t epoch) {
    drey_request *r = f->r;
    drey_cluster__header h[3];
    size_t n = drey_cluster__forward_headers(c, r, epoch, h);
    atomic_fetch_add(&c->route.forwarded, 1);
    drey_cluster__peers_call_kept(c->peers, to->id, to->internal, r->method->path, r->bytes, r->len, h, n,
                                  r->ops->deadline_mono_ns(r->door), forwarded_done, f, &f->call);
}

/* --- the row ------------------------------------------------------------------- */

/* A batch is atomic (one outcome per request_id), so its keys must share
 * a partition: false with CROSS_PARTITION (a field violation per key
 * elsewhere) when they do not. *p: that partition, or UINT32_MAX for no
 * keys. */
static bool batch_partition(drey_request *r, const drey_cluster__topology *t, uint32_t *p_out) {
    const char *cache = drey_method_request_cache(r->msg);
    size_t n = drey_method_request_key_count(r->msg);
    /* Its keys are `entries[i].key` or `keys[i]`. */
    bool entries = protobuf_c_message_descriptor_get_field_by_name(r->msg->descriptor, "entries") != NULL;
    *p_out = UINT32_MAX;
    if (n == 0 || cache == NULL)
        return true;
    uint32_t p0 = partition_of(t, cache, drey_method_request_key(r->msg, 0));
    drey_status *st = NULL;
    for (size_t i = 1; i < n; i++) {
        if (partition_of(t, cache, drey_method_request_key(r->msg, i)) == p0)
            continue;
        if (st == NULL) {
            st = drey_status_new(r->arena, DREY_ERR_CROSS_PARTITION);
        }
        drey_status_add_violation(st, DREY_ERR_CROSS_PARTITION, entries ? "entries[%zu].key" : "keys[%zu]", i);
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

/* --- writes of the partitions this node leads ------------------------------------- */

/* The write was applied or refused: while its partition is copied out,
 * its keys (and its outcome's) are what the copy may have missed. */
static void write_done(void *arg) {
    hold *h = arg;
    drey_cluster *c = h->c;
    drey_cluster__partition *pt = &c->partitions[h->partition];
    if (atomic_load(&pt->moving) && h->r->method->route == DREY_ROUTE_PARTITION) {
        /* A Clear of it: no list of keys says what the copy missed. */
        atomic_store(&pt->cleared, true);
    } else if (atomic_load(&pt->moving)) {
        const ProtobufCMessage *m = h->r->msg;
        const char *cache = drey_method_request_cache(m);
        size_t n = drey_method_request_key_count(m);
        for (size_t i = 0; cache != NULL && i < n; i++) {
            const char *k = drey_method_request_key(m, i);
            if (k != NULL)
                drey_cluster__partition_note_key(pt, cache, strlen(cache), k, strlen(k));
        }
        if (h->r->write.request_id != NULL && h->r->write.request_id[0] != '\0' && c->opts.commit != NULL) {
            drey_key ok;
            drey_commit_outcome_key(c->opts.commit, &h->r->write, h->r->arena, &ok);
            drey_cluster__partition_note_key(pt, ok.cache, ok.cache_len, ok.key, ok.key_len);
        }
    }
    drey_cluster__partition_leave(pt);
}

static void parked_wake(drey_cluster__parked *w) {
    fwd *f = (fwd *)((char *)w - offsetof(fwd, parked));
    reroute(f);
}

static bool in_partition(void *ctx, const char *cache, size_t cache_len, const char *key, size_t key_len) {
    const hold *h = ctx;
    return drey_placement_partition(cache, cache_len, key, key_len, h->c->n_parts) == h->partition;
}

/* A write this node runs for partition p: counted in (a move's freeze
 * waits for it), or parked while p is frozen, routed again at the thaw. */
static drey_stage_result hold_write(drey_cluster *c, drey_request *r, fwd **fp, uint32_t p) {
    while (!drey_cluster__partition_enter(&c->partitions[p])) {
        fwd *f = *fp = fwd_of(c, r, *fp);
        f->parked.wake = parked_wake;
        if (drey_cluster__partition_park(&c->partitions[p], &f->parked))
            return DREY_STAGE_PARKED;
    }
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

/* --- the row, continued ------------------------------------------------------------ */

/* Held until this node may serve it (a second routing refuses instead of
 * holding again): a failover's wait, invisible but for the time it takes. */
static drey_stage_result hold_for(drey_cluster *c, drey_request *r, fwd *f, const drey_cluster__topology *t,
                                  int64_t wait_ns) {
    f = fwd_of(c, r, f);
    f->revision = t->revision;
    f->awaited = true;
    await_table(f, INT64_MAX, wait_ns);
    return DREY_STAGE_PARKED;
}

/* A request for partition p: run here, forward once, wait for the table,
 * or refuse. */
static drey_stage_result route_partition(drey_cluster *c, drey_request *r, fwd *f, const drey_cluster__topology *t,
                                         uint32_t p) {
    drey_stage_result res = DREY_STAGE_NEXT;
    const drey_cluster__node *to = NULL;
    bool stale = drey_method_request_allows_stale(r->msg);
    uint64_t lag_ms;
    if (stale && drey_cluster__stale_copy(c, t, p, &lag_ms))
        return answer_stale(r, lag_ms);
    int o = drey_cluster__owner(c, r, t, p, &to, &res, f == NULL || !f->awaited);
    const drey_cluster__node *backup;
    if ((o < 0 || (o == 0 && f != NULL && f->primary_failed && strcmp(to->id, f->primary) == 0)) && stale && r->forwarded_by == NULL &&
        (backup = drey_cluster__live_backup(t, p)) != NULL) {
        o = 0; /* its primary cannot answer: a backup may */
        to = backup;
        r->status = NULL;
    }
    if (o == DREY_CLUSTER_OWNER_HOLD) {
        int64_t wait_ns = r->status->retry_delay_ms * 1000000LL;
        r->status = NULL;
        return hold_for(c, r, f, t, wait_ns);
    }
    if (o < 0)
        return res;
    if (o == 1)
        return (r->method->flags & DREY_METHOD_WRITE) != 0 ? hold_write(c, r, &f, p) : DREY_STAGE_NEXT;
    f = fwd_of(c, r, f);
    f->revision = t->revision;
    if (o == DREY_CLUSTER_OWNER_AWAIT) {
        f->awaited = true;
        await_table(f, drey_cluster__forwarded_epoch(r), RETRY_WAIT_NS);
    } else {
        /* A stale read may go to a backup; a refusal names the primary. */
        int32_t primary = t->parts[p].primary;
        f->partition = p;
        snprintf(f->primary, sizeof f->primary, "%s", primary >= 0 ? t->nodes[primary].id : to->id);
        forward(c, f, to, t->parts[p].epoch);
    }
    return DREY_STAGE_PARKED;
}

static drey_stage_result refuse_malformed(drey_request *r, const char *field) {
    r->status = drey_status_new(r->arena, DREY_ERR_MALFORMED_REQUEST);
    drey_status_add_violation(r->status, DREY_ERR_MALFORMED_REQUEST, "%s", field);
    return DREY_STAGE_REJECT;
}

/* By the shape of what the method names (include/drey/method.h). */
static drey_stage_result route_request(drey_cluster *c, drey_request *r, fwd *f) {
    drey_cluster__topology *t = drey_cluster__acquire(c);
    drey_stage_result res = DREY_STAGE_NEXT;
    const char *cache = drey_method_request_cache(r->msg);
    const char *key = drey_method_request_key(r->msg, 0);
    uint32_t p;
    int64_t hold_ns = 0;
    if (t->n_parts == 0)
        goto out; /* not in a table yet: nothing is partitioned */
    switch (r->method->route) {
    case DREY_ROUTE_LOCAL:
        break; /* names no partition's data; a Watch follows its owners itself (subscribe.c) */
    case DREY_ROUTE_PEER:
        res = drey_cluster__backup_take(c, r, t);
        break;
    case DREY_ROUTE_CACHE:
        res = drey_cluster__route_cache_wide(c, r, t);
        break;
    case DREY_ROUTE_KEYS:
        if (cache != NULL)
            res = drey_cluster__route_keys(c, r, t, f == NULL || !f->awaited, &hold_ns);
        if (hold_ns > 0)
            res = hold_for(c, r, f, t, hold_ns);
        break;
    case DREY_ROUTE_BATCH:
        if (!batch_partition(r, t, &p))
            res = DREY_STAGE_REJECT;
        else if (p != UINT32_MAX)
            res = route_partition(c, r, f, t, p);
        break;
    case DREY_ROUTE_PARTITION:
        p = drey_method_request_partition(r->msg);
        if (p < t->n_parts)
            res = route_partition(c, r, f, t, p);
        else
            res = refuse_malformed(r, "partition");
        break;
    case DREY_ROUTE_KEY:
        if (cache != NULL && key != NULL)
            res = route_partition(c, r, f, t, partition_of(t, cache, key));
        break;
    }
out:
    drey_cluster__topology_unref(t);
    return res;
}

drey_stage_result drey_cluster_route(void *cluster, drey_request *r) {
    return route_request(cluster, r, NULL);
}

