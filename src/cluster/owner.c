/*
 * owner — who answers a request for a partition, as this node's table
 * says: this node, another (forwarded there), a backup (a stale read), or
 * nobody now (the refusal says why); and what a call to another node
 * carries. Shared by the rows that route (router.c) and split requests
 * (gather.c, fanout.c).
 *
 * A forwarded call carries the caller's token (the owner verifies it
 * again, so a request_id stays scoped by the original principal), the
 * forwarding node's id and the partition's epoch. A node that receives a
 * call forwarded to it and does not own the partition answers NOT_PRIMARY
 * and never forwards it again: two tables that disagree cannot bounce a
 * call. One forwarded from a newer table than this node's waits for its
 * table instead (the new owner hearing of a handover before its watch).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/clock.h"
#include "google/rpc/error_details.pb-c.h"
#include "google/rpc/status.pb-c.h"
#include "router.h"
#include "partition.h"
#include "peers.h"
#include "primary.h"
#include "table.h"

#define UNAVAILABLE_RETRY_MS 500

/* --- refusals ---------------------------------------------------------------- */

static drey_stage_result not_primary(drey_cluster *c, drey_request *r, const drey_cluster__topology *t, uint32_t p) {
    atomic_fetch_add(&c->route.not_primary, 1);
    drey_status *st = drey_status_new(r->arena, DREY_ERR_NOT_PRIMARY);
    drey_status_add_metadata(st, "partition", "%u", p);
    drey_status_add_metadata(st, "epoch", "%lld", (long long)t->parts[p].epoch);
    drey_status_add_metadata(st, "primary", "%s", t->parts[p].primary >= 0 ? t->nodes[t->parts[p].primary].id : "");
    drey_status_add_metadata(st, "outcome", "not_applied"); /* refused before any journal */
    r->status = st;
    return DREY_STAGE_REJECT;
}

drey_status *drey_cluster__unavailable(drey_cluster *c, drey_request *r, uint32_t p, drey_error e, const char *cause,
                                       const char *primary, bool maybe_applied) {
    if (e == DREY_ERR_PARTITION_UNAVAILABLE)
        atomic_fetch_add(&c->route.unavailable, 1);
    drey_status *st = drey_status_new(r->arena, e);
    drey_status_add_metadata(st, "partition", "%u", p);
    drey_status_add_metadata(st, "primary", "%s", primary);
    drey_status_add_metadata(st, "cause", "%s", cause);
    drey_status_add_metadata(st, "outcome", "%s", maybe_applied ? "unknown" : "not_applied");
    st->retry_delay_ms = UNAVAILABLE_RETRY_MS;
    return st;
}

drey_status *drey_cluster__unreachable(drey_cluster *c, drey_request *r, uint32_t p, const char *primary,
                                       const drey_answer *a, bool maybe_applied) {
    drey_status *st = drey_cluster__unavailable(c, r, p, DREY_ERR_PARTITION_UNAVAILABLE, "OWNER_UNREACHABLE",
                                                primary, maybe_applied);
    drey_status_add_metadata(st, "transport", "%.*s", (int)(a->message_len < 200 ? a->message_len : 200),
                             a->message != NULL ? a->message : "");
    return st;
}

/* Refused at routing, before any journal: not applied anywhere. */
static drey_stage_result unavailable(drey_cluster *c, drey_request *r, const drey_cluster__topology *t, uint32_t p,
                                     drey_error e) {
    int32_t o = t->parts[p].primary;
    /* A primary whose membership lease expired: with backups the controller
     * promotes one; with none the partition waits for it to return. */
    const char *cause = e == DREY_ERR_LEASE_EXPIRED                       ? "LEASE_EXPIRED"
                        : o >= 0 && !t->nodes[o].member && c->rf <= 1     ? "LEASE_EXPIRED"
                        : o < 0 || !t->nodes[o].member                    ? "FAILOVER_IN_PROGRESS"
                                                                          : "OWNER_UNREACHABLE";
    r->status = drey_cluster__unavailable(c, r, p, e, cause, o >= 0 ? t->nodes[o].id : "", false);
    return DREY_STAGE_REJECT;
}

int64_t drey_cluster__forwarded_epoch(drey_request *r) {
    size_t len;
    const char *v = r->ops->metadata(r->door, DREY_FORWARD_EPOCH, &len);
    char buf[24];
    if (v == NULL || len == 0 || len >= sizeof buf)
        return 0;
    memcpy(buf, v, len);
    buf[len] = '\0';
    return strtoll(buf, NULL, 10);
}

int drey_cluster__owner(drey_cluster *c, drey_request *r, const drey_cluster__topology *t, uint32_t p,
                        const drey_cluster__node **node, drey_stage_result *refusal, bool may_await) {
    int32_t o = t->parts[p].primary;
    if (o >= 0 && o == t->self) {
        /* Another node may lead it once etcd expired the lease and the
         * backups' grants ran out: not before by this node's clock. */
        int64_t wait_ns;
        if (c->rf > 1 && !drey_cluster__may_serve(c, t, p, &wait_ns)) {
            if (wait_ns <= 0) {
                *refusal = unavailable(c, r, t, p, DREY_ERR_LEASE_EXPIRED);
                return -1;
            }
            /* Just promoted: the old primary may hold this node's grant. */
            r->status = drey_cluster__unavailable(c, r, p, DREY_ERR_PARTITION_UNAVAILABLE, "FAILOVER_IN_PROGRESS",
                                                  c->opts.node_id, false);
            r->status->retry_delay_ms = wait_ns / 1000000 + 1;
            *refusal = DREY_STAGE_REJECT;
            bool fits = drey_mono_ns() + wait_ns < r->ops->deadline_mono_ns(r->door);
            return may_await && fits && c->opts.timers != NULL ? DREY_CLUSTER_OWNER_HOLD : -1;
        }
        return 1;
    }
    if (r->forwarded_by != NULL) {
        if (may_await && c->opts.timers != NULL && drey_cluster__forwarded_epoch(r) > t->revision)
            return DREY_CLUSTER_OWNER_AWAIT;
        *refusal = not_primary(c, r, t, p);
        return -1;
    }
    if (o < 0 || t->nodes[o].internal[0] == '\0' ||
        (!t->nodes[o].member && drey_mono_ns() >= atomic_load(&c->members_unsure_until_ns))) {
        *refusal = unavailable(c, r, t, p, DREY_ERR_PARTITION_UNAVAILABLE);
        return -1;
    }
    *node = &t->nodes[o];
    return 0;
}

/* --- stale reads ---------------------------------------------------------------------- */

bool drey_cluster__stale_copy(drey_cluster *c, const drey_cluster__topology *t, uint32_t p, uint64_t *lag_ms) {
    /* An in-sync backup; or a primary just promoted from one, waiting out
     * its grant: its copy is as current as when it last backed it. */
    bool waiting = t->self >= 0 && t->parts[p].primary == t->self &&
                   drey_mono_ns() < drey_cluster__serve_from(atomic_load(&c->partitions[p].granted_ns),
                                                             c->opts.lease_ttl_s * 1000000000LL, c->lease_margin_ns);
    if (t->self < 0 || (!drey_cluster__in_sync(t, p, t->self) && !waiting))
        return false;
    const drey_cluster__partition *ps = &c->partitions[p];
    int64_t at = atomic_load(&ps->current_ns);
    if (at == 0 || atomic_load(&ps->seq) == DREY_CLUSTER_SEQ_BROKEN)
        return false;
    int64_t now = drey_mono_ns();
    *lag_ms = now > at ? (uint64_t)((now - at) / 1000000) : 0;
    return true;
}

ProtobufCMessage *drey_cluster__read_here(drey_request *r, const ProtobufCMessage *msg) {
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

const drey_cluster__node *drey_cluster__live_backup(const drey_cluster__topology *t, uint32_t p) {
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


/* Whether a is the owner's NOT_PRIMARY. */
