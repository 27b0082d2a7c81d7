/*
 * pipeline — the chain, declared once; see include/drey/pipeline.h.
 */
#include "drey/alloc.h"
#include "drey/pipeline.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "drey/clock.h"
#include "stages.h"

typedef struct stage {
    const char *name;
    unsigned applies_to; /* handler flags; 0 = every method */
    drey_stage_result (*run)(drey_pipeline *p, drey_request *r);
} stage;

#define DATA (DREY_METHOD_READ | DREY_METHOD_WRITE)

/* The chain, in order. After the last stage the request is applied: a
 * write through commit, anything else by its handler. Health (SYSTEM) is
 * only validated: probes must answer under overload and without tokens.
 * A retry is answered from its remembered outcome before memory admission
 * can refuse it: a refusal says the write was not applied, which would be
 * false for a retry of one that was. */
static const stage chain[] = {
    {"ready", DATA, drey_pipeline__ready},
    {"validate", 0, drey_pipeline__validate},
    {"principal", DATA | DREY_METHOD_ADMIN | DREY_METHOD_PEER, drey_pipeline__principal},
    {"backpressure", DATA | DREY_METHOD_ADMIN | DREY_METHOD_PEER, drey_pipeline__backpressure},
    {"authz", DATA | DREY_METHOD_ADMIN, drey_pipeline__authz},
    {"route", DATA, drey_pipeline__route},
    {"idempotency", DREY_METHOD_WRITE, drey_pipeline__idempotency},
    {"tenant", DREY_METHOD_WRITE, drey_pipeline__tenant},
    {"memory", DREY_METHOD_WRITE, drey_pipeline__memory},
    {"journal", DREY_METHOD_WRITE, drey_pipeline__journal},
};

#define N_STAGES (sizeof chain / sizeof chain[0])

struct drey_pipeline {
    drey_pipeline_options opts;
    drey_journal *journal;
    pthread_mutex_t order; /* see order_and_append in journal.c */
    int64_t order_time;         /* under order: the last write's time */
    drey_replicator replicator; /* prepare NULL: none */
    drey_stage_result (*route)(void *ctx, drey_request *r); /* NULL: a single node */
    void *route_ctx;
    _Atomic bool ready;
    struct binding *bindings[2]; /* the gRPC doors', one per method: public, internal */
    struct peer_streams *peers;  /* the peer stream door's (peer.c) */
    struct stream_binding *stream; /* the Pipeline stream door's */
};

drey_pipeline *drey_pipeline_create(const drey_pipeline_options *opts) {
    drey_pipeline *p = drey_xcalloc(1, sizeof *p);
    p->opts = *opts;
    pthread_mutex_init(&p->order, NULL);
    return p;
}

void drey_pipeline_destroy(drey_pipeline *p) {
    if (p == NULL)
        return;
    free(p->bindings[0]);
    free(p->bindings[1]);
    drey_pipeline__free_peers(p->peers);
    free(p->stream);
    pthread_mutex_destroy(&p->order);
    free(p);
}

void drey_pipeline_set_journal(drey_pipeline *p, drey_journal *j) {
    p->journal = j;
    if (j != NULL)
        drey_journal_set_done_bracket(j, drey_pipeline_batch_begin, drey_pipeline_batch_end);
}

void drey_pipeline_set_replicator(drey_pipeline *p, const drey_replicator *rep) {
    p->replicator = *rep;
}

const drey_replicator *drey_pipeline__replicator(const drey_pipeline *p) {
    return p->replicator.prepare != NULL ? &p->replicator : NULL;
}

int64_t drey_pipeline__order_time(drey_pipeline *p) {
    int64_t now = drey_wall_ms();
    if (now > p->order_time)
        p->order_time = now;
    return p->order_time;
}

bool drey_pipeline_journaled(const drey_request *r) {
    return r->pipeline->journal != NULL;
}

drey_journal *drey_pipeline_journal(const drey_pipeline *p) {
    return p->journal;
}

/* --- batches --------------------------------------------------------------------- */

#define BATCH_DEFERRED 32

static _Thread_local struct {
    int depth;
    size_t n;
    struct {
        void (*fn)(void *arg);
        void *arg;
    } deferred[BATCH_DEFERRED];
} batch;

void drey_pipeline_batch_begin(void) {
    batch.depth++;
}

bool drey_pipeline_batch_defer(void (*fn)(void *arg), void *arg) {
    if (batch.depth == 0 || batch.n == BATCH_DEFERRED)
        return false;
    batch.deferred[batch.n].fn = fn;
    batch.deferred[batch.n].arg = arg;
    batch.n++;
    return true;
}

void drey_pipeline_batch_end(void) {
    if (--batch.depth > 0)
        return;
    /* What runs now is outside this batch (a batch it opens is its own). */
    size_t n = batch.n;
    __typeof__(batch.deferred) run;
    memcpy(run, batch.deferred, n * sizeof run[0]);
    batch.n = 0;
    for (size_t i = 0; i < n; i++)
        run[i].fn(run[i].arg);
}

void drey_pipeline_set_route(drey_pipeline *p, drey_stage_result (*route)(void *ctx, drey_request *r), void *ctx) {
    p->route = route;
    p->route_ctx = ctx;
}

void drey_pipeline_set_ready(drey_pipeline *p, bool ready) {
    atomic_store(&p->ready, ready);
}

const drey_limits *drey_pipeline__limits(const drey_pipeline *p) {
    return &p->opts.limits;
}

const drey_pipeline_options *drey_pipeline__options(const drey_pipeline *p) {
    return &p->opts;
}

drey_journal *drey_pipeline__journal_of(const drey_pipeline *p) {
    return p->journal;
}

pthread_mutex_t *drey_pipeline__order_lock(drey_pipeline *p) {
    return &p->order;
}

drey_commit *drey_pipeline__commit(const drey_pipeline *p) {
    return p->opts.commit;
}

void drey_pipeline__set_bindings(drey_pipeline *p, bool internal, struct binding *b) {
    free(p->bindings[internal]);
    p->bindings[internal] = b;
}

void drey_pipeline__set_peers(drey_pipeline *p, struct peer_streams *ps) {
    drey_pipeline__free_peers(p->peers);
    p->peers = ps;
}

struct peer_streams *drey_pipeline__peers(const drey_pipeline *p) {
    return p->peers;
}

void drey_pipeline__set_stream_binding(drey_pipeline *p, struct stream_binding *b) {
    free(p->stream);
    p->stream = b;
}

drey_status *drey_pipeline__status(drey_request *r, drey_error e) {
    drey_status *st = drey_status_new(r->arena, e);
    r->status = st;
    return st;
}

drey_stage_result drey_pipeline__ready(drey_pipeline *p, drey_request *r) {
    if (atomic_load(&p->ready))
        return DREY_STAGE_NEXT;
    drey_pipeline__status(r, DREY_ERR_RECOVERING);
    return DREY_STAGE_REJECT;
}

/* What the chain holds for a request goes before its answer does, so a
 * caller that sees the answer finds the slot free. */
static void release(drey_request *r) {
    if (r->on_release != NULL)
        r->on_release(r->release_arg);
    if (r->has_ticket)
        drey_bp_release(r->pipeline->opts.backpressure, &r->ticket);
    if (r->tenant_reserved != 0)
        drey_tenants_release(r->pipeline->opts.tenants, r->tenant_id, r->tenant_reserved);
    r->tenant_reserved = 0;
    drey_authz_grants_unref(r->grants);
    r->grants = NULL;
}

void drey_request_reply(drey_request *r, const ProtobufCMessage *response) {
    release(r);
    r->ops->reply(r->door, response);
}

void drey_request_fail(drey_request *r, const drey_status *st) {
    r->failed = true;
    release(r);
    r->ops->fail(r->door, st);
}

void drey_request_relay(drey_request *r, const drey_answer *a) {
    release(r);
    r->ops->relay(r->door, a);
}

drey_stage_result drey_pipeline__route(drey_pipeline *p, drey_request *r) {
    if (p->route == NULL)
        return DREY_STAGE_NEXT;
    return p->route(p->route_ctx, r);
}

void drey_request_init(drey_request *r, const drey_request_ops *ops, void *door, drey_arena *arena,
                       const drey_method *method, const ProtobufCMessage *msg, const uint8_t *bytes, size_t len) {
    r->ops = ops;
    r->door = door;
    r->arena = arena;
    r->method = method;
    r->msg = msg;
    r->bytes = bytes;
    r->len = len;
}

/* The end of the chain. */
static void apply(drey_pipeline *p, drey_request *r) {
    const drey_method *m = r->method;
    if (m->apply == NULL) {
        m->handle(m->ctx, r, r->msg);
        return;
    }
    drey_status st;
    drey_status_init(&st);
    drey_apply ax = {
        .now_ms = r->now_ms != 0 ? r->now_ms : drey_wall_ms(),
        .arena = r->arena,
        .status = &st,
        .keep = r->keep,
        .keep_ctx = r->keep_ctx,
    };
    ProtobufCMessage *resp = (m->flags & DREY_METHOD_WRITE) != 0 ? drey_commit_apply(p->opts.commit, &r->write, &ax)
                                                                 : m->apply(m->ctx, &ax, r->msg);
    if (r->answer_unknown != DREY_ERR_NONE) {
        drey_status_init(&st);
        drey_status_set(&st, r->answer_unknown);
        drey_status_add_metadata(&st, "outcome", "unknown"); /* it was applied here */
        drey_request_fail(r, &st);
    } else if (resp != NULL)
        drey_request_reply(r, resp);
    else
        drey_request_fail(r, &st);
}

static void run_from(drey_request *r) {
    unsigned flags = r->method->flags;
    while (r->next_stage < N_STAGES) {
        const stage *s = &chain[r->next_stage++];
        if (s->applies_to != 0 && (s->applies_to & flags) == 0)
            continue;
        switch (s->run(r->pipeline, r)) {
        case DREY_STAGE_NEXT: break;
        case DREY_STAGE_PARKED: return;
        case DREY_STAGE_ANSWERED: return;
        case DREY_STAGE_REJECT:
            if (r->pipeline->opts.metrics != NULL)
                drey_metrics_observe_rejection(r->pipeline->opts.metrics, s->name,
                                               drey_error_lookup(r->status->error)->reason);
            drey_request_fail(r, r->status);
            return;
        }
    }
    apply(r->pipeline, r);
}

void drey_pipeline_submit(drey_pipeline *p, drey_request *r) {
    r->pipeline = p;
    r->next_stage = 0;
    r->principal = "runtime";
    if ((r->method->flags & DREY_METHOD_WRITE) != 0) {
        /* Anonymous until the principal stage names a token subject. */
        drey_commit_write_init(&r->write, r->method, r->msg, r->bytes, r->len, "");
    }
    run_from(r);
}

void drey_pipeline_resume(drey_request *r) {
    run_from(r);
}

const drey_status *drey_pipeline_authorize(drey_pipeline *p, drey_request *r) {
    r->pipeline = p;
    r->principal = "runtime";
    const char *stage = "principal"; /* the rejections metric's label, as in the chain */
    drey_stage_result res = drey_pipeline__principal(p, r);
    if (res == DREY_STAGE_NEXT) {
        stage = "authz";
        res = drey_pipeline__authz(p, r);
    }
    drey_authz_grants_unref(r->grants);
    r->grants = NULL;
    if (res == DREY_STAGE_NEXT)
        return NULL;
    if (p->opts.metrics != NULL)
        drey_metrics_observe_rejection(p->opts.metrics, stage, drey_error_lookup(r->status->error)->reason);
    return r->status;
}
