/*
 * internal — what the files of the client module share: the client itself
 * (client.c), what every call needs (call.c), and, for the cluster client
 * (cluster.c), several clients completing their asynchronous calls on one
 * queue so one thread can wait on all of a cluster's nodes at once.
 *
 * A client has two completion queues: a pluck queue for synchronous calls
 * and streams (each waits for its own tag), and a next queue for
 * asynchronous calls (drey_client_next takes whichever finishes first).
 */
#ifndef DREY_CLIENT_INTERNAL_H
#define DREY_CLIENT_INTERNAL_H

#include <pthread.h>

#include <grpc/grpc.h>
#include <grpc/support/time.h>

#include "drey/client.h"
#include "drey/list.h"
#include "headers.h"

/* Method paths registered with the channel (grpc_channel_register_call saves
 * parsing a path per call); later ones are passed as a path each time. */
#define DREY_CLIENT__MAX_REGISTERED_METHODS 64

typedef struct drey_client__method {
    char *path;
    void *handle;
} drey_client__method;

struct drey_client {
    grpc_channel *channel;
    grpc_completion_queue *sync_cq;  /* pluck: unary calls and streams */
    grpc_completion_queue *async_cq; /* next: drey_client_start_call */
    bool shared_cq;                  /* async_cq belongs to a cluster client */
    drey_client__headers headers;    /* sent on every call */
    drey_client__method methods[DREY_CLIENT__MAX_REGISTERED_METHODS];
    size_t n_methods;
    drey_list in_flight; /* asynchronous calls (unary.c) not yet returned by next */
    size_t n_in_flight;
    drey_list streams; /* drey_client_stream started and not finished */
};

/* What a call's batches point into until they complete: the same for a
 * unary call and a stream. */
typedef struct drey_client__io {
    grpc_call *call;
    grpc_byte_buffer *send;
    grpc_byte_buffer *recv;
    grpc_metadata_array initial_md;
    grpc_metadata_array trailing_md;
    grpc_status_code code;
    grpc_slice details;
} drey_client__io;

/* --- call.c ---------------------------------------------------------------- */

/* A deadline timeout_ms from now; < 0: none; 0: already past. */
gpr_timespec drey_client__deadline_after(int64_t timeout_ms);

/* A call on c's channel (a registered method when there is room). */
grpc_call *drey_client__new_call(drey_client *c, grpc_completion_queue *cq, const char *method, int64_t timeout_ms);

/* Creates io's call (io->send already set) and what its batches fill in. */
void drey_client__io_open(drey_client__io *io, drey_client *c, grpc_completion_queue *cq, const char *method,
                          int64_t timeout_ms);
/* Frees what io's batches filled in, its request and the call. */
void drey_client__io_release(drey_client__io *io);

/* The ops that open every call: the client's headers with, when send is
 * not NULL, one request message and the end of the requests; then the
 * server's headers. Returns how many of ops (room for 4) it filled. */
size_t drey_client__open_ops(grpc_op *ops, const drey_client *c, grpc_byte_buffer *send,
                             grpc_metadata_array *initial_md);
/* The op that receives the call's status into code, details and trailing. */
void drey_client__status_op(grpc_op *op, grpc_status_code *code, grpc_slice *details, grpc_metadata_array *trailing);

/* Fills st from what RECV_STATUS_ON_CLIENT delivered. */
void drey_client__fill_status(drey_client_status *st, grpc_status_code code, grpc_slice details,
                              const grpc_metadata_array *trailing, drey_arena *arena);

/* A received message copied into arena memory / decoded as type there
 * (NULL when it is not a valid one). */
void drey_client__copy_buffer(grpc_byte_buffer *bb, drey_arena *arena, ProtobufCBinaryData *out);
ProtobufCMessage *drey_client__decode(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *type,
                                      drey_arena *arena);

/* Drains and destroys a queue after shutting it down. */
void drey_client__drain_cq(grpc_completion_queue *cq);

/* --- unary.c and stream.c, for closing a client ----------------------------- */

/* Cancels, waits for and frees c's asynchronous calls (c's own queue). */
void drey_client__drop_in_flight(drey_client *c);
/* Cancels and finishes c's open streams. */
void drey_client__finish_streams(drey_client *c);

/* --- the cluster client ------------------------------------------------------ */

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

/* Stops a thread that reads a stream, reconnecting until told to stop (the
 * near cache's watch, the topology's): under mu, sets *stopping, cancels
 * *stream (the one it reads, when there is one) and wakes cond; then joins
 * t. One critical section, so the thread cannot open a new stream between
 * the cancel and the flag. */
void drey_client__stop_reader(pthread_t t, pthread_mutex_t *mu, pthread_cond_t *cond, bool *stopping,
                              drey_client_stream *const *stream);

#endif
