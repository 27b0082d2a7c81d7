/* The stages of the request chain (internal to the pipeline module). */
#ifndef DREY_PIPELINE_STAGES_H
#define DREY_PIPELINE_STAGES_H

#include <pthread.h>

#include "drey/pipeline.h"

const drey_limits *drey_pipeline__limits(const drey_pipeline *p);

const drey_pipeline_options *drey_pipeline__options(const drey_pipeline *p);

drey_stage_result drey_pipeline__ready(drey_pipeline *p, drey_request *r);
drey_stage_result drey_pipeline__validate(drey_pipeline *p, drey_request *r);
drey_stage_result drey_pipeline__principal(drey_pipeline *p, drey_request *r);
drey_stage_result drey_pipeline__backpressure(drey_pipeline *p, drey_request *r);
drey_stage_result drey_pipeline__authz(drey_pipeline *p, drey_request *r);
drey_stage_result drey_pipeline__route(drey_pipeline *p, drey_request *r);
drey_stage_result drey_pipeline__idempotency(drey_pipeline *p, drey_request *r);
drey_stage_result drey_pipeline__tenant(drey_pipeline *p, drey_request *r);
drey_stage_result drey_pipeline__memory(drey_pipeline *p, drey_request *r);
drey_stage_result drey_pipeline__journal(drey_pipeline *p, drey_request *r);

drey_journal *drey_pipeline__journal_of(const drey_pipeline *p);
/* Held while a durable write is ordered (journal.c). */
pthread_mutex_t *drey_pipeline__order_lock(drey_pipeline *p);
drey_commit *drey_pipeline__commit(const drey_pipeline *p);
/* Under the order lock: the time the write being ordered applies at, never
 * below the last one's. */
int64_t drey_pipeline__order_time(drey_pipeline *p);
/* NULL: this node replicates nothing. */
const drey_replicator *drey_pipeline__replicator(const drey_pipeline *p);

/* The gRPC door's bindings, freed with the pipeline. */
struct binding;
void drey_pipeline__set_bindings(drey_pipeline *p, bool internal, struct binding *b);

/* The peer stream's door (peer.c) on the internal listener. */
bool drey_pipeline__serve_peers(drey_pipeline *p, drey_server *s);
struct peer_streams;
void drey_pipeline__set_peers(drey_pipeline *p, struct peer_streams *ps);
struct peer_streams *drey_pipeline__peers(const drey_pipeline *p);
void drey_pipeline__free_peers(struct peer_streams *ps);

/* drey.cache.v1.Cache/Pipeline on the server (src/pipeline/stream.c); its
 * binding, one allocation, is freed with the pipeline. */
struct stream_binding;
bool drey_pipeline__serve_stream(drey_pipeline *p, drey_server *s);
void drey_pipeline__set_stream_binding(drey_pipeline *p, struct stream_binding *b);

/* A status in the request's arena, for a rejecting stage. */
drey_status *drey_pipeline__status(drey_request *r, drey_error e);

#endif
