/*
 * admission — stages 2 to 4: who is calling, may it run now, may it grow
 * memory.
 *
 * principal: a bearer token is verified (auth) and names the caller
 *   jwt:{sub}; without one the caller is conn:{connection}. A node with
 *   keys refuses token-less calls (auth_required); a node without keys
 *   refuses calls that bring a token it cannot check. With a policy
 *   (authz) the caller's grants come with the verified token (or are the
 *   anonymous bindings'), for the authz stage (authz.c).
 * backpressure: takes a slot, waits in the queue, or is refused. The slot is
 *   released in exactly one place, when the request is answered whatever
 *   stage answered it (drey_request_reply/fail); a cancelled waiter leaves
 *   the queue at once, while a cancelled request that already runs keeps its
 *   slot until its work is done, so callers that give up cannot pile up
 *   work past --max-inflight.
 * memory: a write that would grow memory past the critical level is refused,
 *   or, with an eviction policy, admitted with the entries it will evict.
 *
 * Nothing before the journal changes state: a refusal here leaves no trace.
 */
#include <stdio.h>
#include <string.h>

#include "drey/clock.h"
#include "drey/log.h"
#include "stages.h"

#define SUB_MAX 256

/* A forwarded call: only on the internal listener, only from the peer its
 * metadata names. Backpressure counts it against that peer (node:<id>),
 * while its token, verified below as any other, still scopes its request_id
 * to the original caller. */
static drey_stage_result forwarded(drey_request *r) {
    size_t n;
    const char *by = r->ops->metadata(r->door, DREY_FORWARDED_BY, &n);
    if (r->ops->peer_is == NULL) {
        if (by == NULL)
            return DREY_STAGE_NEXT;
        drey_pipeline__status(r, DREY_ERR_FORWARDING_NOT_ALLOWED);
        return DREY_STAGE_REJECT;
    }
    if (by == NULL || n == 0 || n > 128 || !r->ops->peer_is(r->door, by, n)) {
        drey_pipeline__status(r, DREY_ERR_PEER_UNAUTHENTICATED);
        return DREY_STAGE_REJECT;
    }
    r->forwarded_by = drey_arena_strndup(r->arena, by, n);
    return DREY_STAGE_NEXT;
}

/* A node's own call to another (a partition's entries moving): the node is
 * the principal, and proves it by its certificate, not a token. */
static drey_stage_result peer_call(drey_request *r) {
    if (r->forwarded_by == NULL) {
        drey_pipeline__status(r, DREY_ERR_PEER_UNAUTHENTICATED);
        return DREY_STAGE_REJECT;
    }
    r->principal = drey_arena_sprintf(r->arena, "node:%s", r->forwarded_by);
    return DREY_STAGE_NEXT;
}

drey_stage_result drey_pipeline__principal(drey_pipeline *p, drey_request *r) {
    const drey_pipeline_options *o = drey_pipeline__options(p);
    if (forwarded(r) == DREY_STAGE_REJECT)
        return DREY_STAGE_REJECT;
    if ((r->method->flags & DREY_METHOD_PEER) != 0)
        return peer_call(r);
    size_t len;
    const char *header = r->ops->metadata(r->door, "authorization", &len);
    const char *conn = r->forwarded_by != NULL ? drey_arena_sprintf(r->arena, "node:%s", r->forwarded_by)
                                                : r->ops->peer(r->door);
    if (header == NULL) {
        if (o->auth_required) {
            drey_pipeline__status(r, DREY_ERR_TOKEN_MISSING);
            return DREY_STAGE_REJECT;
        }
        r->principal = conn;
        if (o->authz != NULL)
            r->grants = drey_authz_grants_for(o->authz, NULL, 0); /* the anonymous bindings' */
        return DREY_STAGE_NEXT;
    }
    if (o->auth == NULL) {
        drey_pipeline__status(r, DREY_ERR_TOKEN_UNKNOWN_KEY);
        return DREY_STAGE_REJECT;
    }
    char sub[SUB_MAX];
    void *grants = NULL;
    drey_error e = drey_auth_verify_attached(o->auth, header, len, drey_wall_ms(), sub, sizeof sub,
                                             o->authz != NULL ? &grants : NULL);
    r->grants = grants; /* compiled once per token, kept with it in the token cache */
    if (e != DREY_ERR_NONE) {
        drey_pipeline__status(r, e);
        DREY_LOG_DEBUG("token refused", DREY_LOG_STR("principal", conn), DREY_LOG_STR("method", r->method->path),
                       DREY_LOG_STR("reason", drey_error_lookup(e)->reason));
        return DREY_STAGE_REJECT;
    }
    if (sub[0] == '\0') {
        r->principal = conn; /* verified, but names nobody */
        return DREY_STAGE_NEXT;
    }
    const char *subject = drey_arena_sprintf(r->arena, "jwt:%s", sub);
    r->write.principal = subject; /* idempotency scope: the original caller */
    r->principal = r->forwarded_by != NULL ? conn : subject;
    return DREY_STAGE_NEXT;
}

/* --- backpressure --------------------------------------------------------- */

static void on_cancel(void *arg) {
    drey_request *r = arg;
    if (drey_bp_cancel(drey_pipeline__options(r->pipeline)->backpressure, &r->ticket)) {
        /* It was waiting: nobody else will answer it. */
        drey_request_fail(r, drey_pipeline__status(r, DREY_ERR_CANCELLED));
    }
}

static void on_resume(void *arg) {
    drey_pipeline_resume(arg);
}

static void on_fail(void *arg, const drey_status *st) {
    drey_request *r = arg;
    r->status = drey_arena_alloc(r->arena, sizeof *st);
    memcpy(r->status, st, sizeof *st);
    drey_metrics *m = drey_pipeline__options(r->pipeline)->metrics;
    if (m != NULL)
        drey_metrics_observe_rejection(m, "backpressure", drey_error_lookup(st->error)->reason);
    drey_request_fail(r, r->status);
}

drey_stage_result drey_pipeline__backpressure(drey_pipeline *p, drey_request *r) {
    drey_bp *bp = drey_pipeline__options(p)->backpressure;
    /* An ordered request parked here would let a later one pass it; its
     * sender bounds its own window instead. */
    if (bp == NULL || (r->method->flags & DREY_METHOD_ORDERED) != 0)
        return DREY_STAGE_NEXT;
    r->ticket.principal = r->principal;
    r->ticket.deadline_ns = r->ops->deadline_mono_ns(r->door);
    r->ticket.resume = on_resume;
    r->ticket.fail = on_fail;
    r->ticket.arg = r;
    drey_status *st = drey_arena_alloc(r->arena, sizeof *st);
    /* Before admitting: a parked request can be resumed, run to its end and
     * answered on another thread (its door then frees it) before
     * drey_bp_admit has returned here, so nothing of r may be touched after
     * a PARKED; and its answer must release the slot it got. The cancel
     * hook is harmless on a request that is admitted at once: drey_bp_cancel
     * frees only a waiting ticket, and a later stage's hook replaces it. */
    r->has_ticket = true;
    if (r->ops->on_cancel != NULL)
        r->ops->on_cancel(r->door, on_cancel, r);
    switch (drey_bp_admit(bp, &r->ticket, st)) {
    case DREY_BP_ADMITTED:
        return DREY_STAGE_NEXT;
    case DREY_BP_PARKED:
        return DREY_STAGE_PARKED;
    case DREY_BP_REJECTED:
        break;
    }
    r->has_ticket = false;
    r->status = st;
    DREY_LOG_DEBUG("request refused", DREY_LOG_STR("principal", r->principal), DREY_LOG_STR("method", r->method->path),
                   DREY_LOG_STR("reason", drey_error_lookup(st->error)->reason));
    return DREY_STAGE_REJECT;
}

/* --- memory --------------------------------------------------------------- */

drey_stage_result drey_pipeline__memory(drey_pipeline *p, drey_request *r) {
    const drey_pipeline_options *o = drey_pipeline__options(p);
    const drey_method *m = r->method;
    if (m->growth == NULL)
        return DREY_STAGE_NEXT;
    int64_t growth = m->growth(m->ctx, r->msg, drey_wall_ms());
    if (growth > 0)
        growth += (int64_t)drey_commit_outcome_bytes(o->commit, &r->write);
    r->growth = growth; /* a replicated write's backups must have room for it too */
    if (o->memory == NULL)
        return DREY_STAGE_NEXT;
    int64_t evicted_bytes;
    drey_status *st = drey_arena_alloc(r->arena, sizeof *st);
    /* A write that adds an entry may open a cache: within --max-caches. */
    const ProtobufCFieldDescriptor *fd = protobuf_c_message_descriptor_get_field_by_name(r->msg->descriptor, "cache");
    if (growth > 0 && fd != NULL && fd->type == PROTOBUF_C_TYPE_STRING &&
        !drey_memory_admit_cache(o->memory, *(char *const *)(const void *)((const char *)r->msg + fd->offset), st)) {
        r->status = st;
        return DREY_STAGE_REJECT;
    }
    /* With --eviction the victims ride in the write's journal record and go
     * when it applies: a write refused from here on evicted nothing. */
    const drey_replicator *rep = drey_pipeline__replicator(p);
    /* Only a write that evicts makes room on the other copies; without a policy the replicator checks their room. */
    int64_t others = growth > 0 && rep != NULL && rep->memory_room != NULL && drey_memory_evicts(o->memory)
                         ? rep->memory_room(rep->ctx, r)
                         : INT64_MAX;
    /* The tenant stage may have chosen some of the tenant's own entries
     * already (its quota): they count first. */
    evicted_bytes = r->tenant_evicted;
    if (drey_memory_admit_evicting_tenant(o->memory, growth, drey_wall_ms(), &r->evict_only, r->tenant_id, others,
                                          r->arena, &r->write.evicted, &r->write.n_evicted, &evicted_bytes, st)) {
        r->growth -= evicted_bytes; /* its backups evict the same entries */
        return DREY_STAGE_NEXT;
    }
    r->status = st;
    return DREY_STAGE_REJECT;
}
