/*
 * pipeline — the chain, declared once; see include/drey/pipeline.h.
 */
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

#define DATA (DREY_HANDLER_READ | DREY_HANDLER_WRITE)

/* The chain, in order. After the last stage the request is applied: a
 * write through commit, anything else by its handler. Health and reflection
 * (SYSTEM) only get validated: probes must answer under overload and
 * without tokens. */
static const stage chain[] = {
    {"ready", DATA, drey_pipeline__ready},
    {"validate", 0, drey_pipeline__validate},
    {"principal", DATA | DREY_HANDLER_ADMIN, drey_pipeline__principal},
    {"backpressure", DATA | DREY_HANDLER_ADMIN, drey_pipeline__backpressure},
    {"memory", DREY_HANDLER_WRITE, drey_pipeline__memory},
    {"journal", DREY_HANDLER_WRITE, drey_pipeline__journal},
};

#define N_STAGES (sizeof chain / sizeof chain[0])

struct drey_pipeline {
    drey_pipeline_options opts;
    drey_journal *journal;
    _Atomic bool ready;
};

drey_pipeline *drey_pipeline_create(const drey_pipeline_options *opts) {
    drey_pipeline *p = calloc(1, sizeof *p);
    if (p == NULL)
        abort();
    p->opts = *opts;
    return p;
}

void drey_pipeline_destroy(drey_pipeline *p) {
    free(p);
}

void drey_pipeline_set_journal(drey_pipeline *p, drey_journal *j) {
    p->journal = j;
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

drey_commit *drey_pipeline__commit(const drey_pipeline *p) {
    return p->opts.commit;
}

drey_status *drey_pipeline__status(drey_request *r, drey_error e) {
    drey_status *st = drey_arena_alloc(drey_call_arena(r->call), sizeof *st);
    drey_status_init(st);
    drey_status_set(st, e);
    r->status = st;
    return st;
}

drey_stage_result drey_pipeline__ready(drey_pipeline *p, drey_request *r) {
    if (atomic_load(&p->ready))
        return DREY_STAGE_NEXT;
    drey_pipeline__status(r, DREY_ERR_RECOVERING);
    return DREY_STAGE_REJECT;
}

/* The end of the chain. */
static void apply(drey_pipeline *p, drey_request *r) {
    if (r->method->handler->apply == NULL) {
        drey_call_run(r->call, r->msg, drey_wall_ms());
        return;
    }
    drey_status st;
    drey_status_init(&st);
    drey_apply ax = {
        .now_ms = r->now_ms != 0 ? r->now_ms : drey_wall_ms(),
        .arena = drey_call_arena(r->call),
        .status = &st,
    };
    ProtobufCMessage *resp = drey_commit_apply(p->opts.commit, &r->write, &ax);
    if (resp != NULL)
        drey_call_reply(r->call, resp);
    else
        drey_call_fail(r->call, &st);
}

static void run_from(drey_request *r) {
    unsigned flags = r->method->handler->flags;
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
            drey_call_fail(r->call, r->status);
            return;
        }
    }
    apply(r->pipeline, r);
}

void drey_pipeline_dispatch(void *pipeline, drey_call *call, const ProtobufCMessage *request) {
    drey_request *r = drey_arena_calloc(drey_call_arena(call), sizeof *r);
    r->call = call;
    r->method = drey_call_method(call);
    r->msg = request;
    r->pipeline = pipeline;
    r->principal = "runtime";
    if (r->method->handler->apply != NULL) {
        const uint8_t *bytes;
        size_t len;
        drey_call_request_bytes(call, &bytes, &len);
        /* Anonymous until the principal stage names a token subject. */
        drey_commit_write_init(&r->write, r->method, request, bytes, len, "");
    }
    run_from(r);
}

void drey_pipeline_resume(drey_request *r) {
    run_from(r);
}
