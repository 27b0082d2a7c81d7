/*
 * internal — what the cluster client (cluster.c) needs of the plain client
 * (client.c): several clients completing their asynchronous calls on one
 * queue, so one thread can wait on all of a cluster's nodes at once.
 */
#ifndef DREY_CLIENT_INTERNAL_H
#define DREY_CLIENT_INTERNAL_H

#include <grpc/grpc.h>

#include "drey/client.h"

/* drey_client_open whose asynchronous calls complete on async_cq (a next
 * queue the caller owns and shuts down after closing every client on it);
 * NULL: a queue of its own. A client on a shared queue must have no
 * asynchronous call in flight when it is closed. */
drey_client *drey_client__open_on(const drey_client_options *opts, grpc_completion_queue *async_cq, char *err,
                                  size_t err_cap);

/* drey_client_next over every client on cq. The caller knows a call is in
 * flight: with none, this waits out timeout_ms. */
bool drey_client__next_on(grpc_completion_queue *cq, int64_t timeout_ms, drey_arena *arena,
                          drey_client_completion *out);

/* Cancels c's asynchronous calls in flight (they still complete). */
void drey_client__cancel_all(drey_client *c);

#endif
