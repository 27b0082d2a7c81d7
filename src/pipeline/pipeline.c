/*
 * pipeline — the chain, declared once; see include/drey/pipeline.h.
 */
#include "drey/pipeline.h"

#include <stdlib.h>
#include <string.h>

#include "drey/clock.h"
#include "stages.h"

typedef struct stage {
    const char *name;
    unsigned applies_to; /* handler flags; 0 = every method */
    drey_stage_result (*run)(drey_pipeline *p, drey_request *r);
} stage;

/* The chain, in order. The handler runs after the last stage. */
static const stage chain[] = {
    {"validate", 0, drey_pipeline__validate},
};

#define N_STAGES (sizeof chain / sizeof chain[0])

struct drey_pipeline {
    drey_pipeline_options opts;
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

const drey_limits *drey_pipeline__limits(const drey_pipeline *p) {
    return &p->opts.limits;
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
        case DREY_STAGE_REJECT: drey_call_fail(r->call, r->status); return;
        }
    }
    drey_call_run(r->call, r->msg, r->now_ms != 0 ? r->now_ms : drey_wall_ms());
}

void drey_pipeline_dispatch(void *pipeline, drey_call *call, const ProtobufCMessage *request) {
    drey_request *r = drey_arena_calloc(drey_call_arena(call), sizeof *r);
    r->call = call;
    r->method = drey_call_method(call);
    r->msg = request;
    r->pipeline = pipeline;
    run_from(r);
}

void drey_pipeline_resume(drey_request *r) {
    run_from(r);
}
