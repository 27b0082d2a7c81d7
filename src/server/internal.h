/*
 * internal — what the server's files share: the server (server.c: queues,
 * worker threads, methods, the slots that accept calls, shutdown), a call
 * (call.c: its references, batches, replies and streams) and the
 * connection a call came on (connection.c).
 *
 * Every completion-queue event carries a `tag` whose callback knows what
 * finished. A call is reference-counted: one reference for the pending
 * RECV_CLOSE_ON_SERVER (which also tells us about cancellation), one for each
 * batch in flight, and one that the handler holds until it replies (unary) or
 * that the stream holds until the call is over (streaming). The call is freed
 * when the last one goes, whichever thread drops it.
 */
#ifndef DREY_SERVER_INTERNAL_H
#define DREY_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>

#include "drey/list.h"
#include "drey/server.h"
#include "tls.h"

#define DREY_SERVER__CALL_ARENA_INLINE 4096

typedef struct drey_server__tag {
    void (*done)(struct drey_server__tag *t, bool ok);
} drey_server__tag;

typedef struct drey_server__method {
    drey_server_method spec; /* its path is ours */
    size_t index;
    void *registered; /* grpc core's handle */
    bool recursive;   /* the request type nests without bound */
} drey_server__method;

/* An outstanding request for the next call of a method on one queue. */
typedef struct drey_server__slot {
    drey_server__tag tag;
    drey_server *server;
    size_t cq;
    drey_server__method *method; /* NULL: unregistered (unknown) method */
    grpc_call *call;
    gpr_timespec deadline;
    grpc_metadata_array md;
    grpc_byte_buffer *payload;
    grpc_call_details details; /* unregistered methods only */
} drey_server__slot;

struct drey_call {
    drey_server *server;
    const drey_server__method *method; /* NULL for an unknown method */
    grpc_call *call;
    size_t cq;
    gpr_timespec deadline;
    grpc_metadata_array md;
    grpc_slice request; /* raw unary payload */
    bool has_request;
    int64_t started_ns; /* monotonic, at arrival */
    char conn[32];
    void *user;
    bool replied;                   /* unary: reply or fail issued (under mu) */
    void (*cancel_hook)(void *arg); /* unary: runs on cancellation before replying */
    void *cancel_arg;
    _Atomic int refs;

    drey_server__tag close_tag;
    int cancelled;       /* written by RECV_CLOSE_ON_SERVER */
    _Atomic bool closed; /* RECV_CLOSE_ON_SERVER completed */

    drey_server__tag recv_tag;
    grpc_byte_buffer *recv_buf;

    drey_server__tag send_tag;
    pthread_mutex_t mu; /* the send queue and the stream's end */
    drey_list out;      /* messages not yet sent (call.c's out_msg) */
    bool sending;       /* a SEND_MESSAGE batch is in flight */
    bool finish_wanted; /* drey_call_finish() was called */
    bool status_sent;   /* the SEND_STATUS batch has started */
    bool md_sent;       /* initial metadata went out with a message */
    bool read_paused;   /* drey_call_pause_reading(): read no more for now */
    bool read_parked;   /* paused with no RECV_MESSAGE in flight */
    drey_status *finish_status;
    drey_call_answer *finish_answer; /* drey_call_finish_relay(): another server's status, one allocation */

    /* Storage the status batch points into until it completes. */
    grpc_byte_buffer *reply_bb;
    grpc_metadata trailers[2]; /* grpc-status-details-bin, grpc-retry-pushback-ms */
    size_t n_trailers;
    grpc_slice status_msg;

    drey_arena arena;
    char arena_buf[DREY_SERVER__CALL_ARENA_INLINE];
};

struct drey_server {
    grpc_server *grpc;
    grpc_completion_queue **cqs;
    pthread_t *threads;
    size_t n_cqs;
    bool started;
    drey_server__method **methods;
    size_t n_methods;
    drey_call_observer_fn observer;
    void *observer_ctx;
    drey_server_options opts;
    char *listen;
    grpc_server_credentials *creds;
    drey_server__tls *tls;

    drey_server__tag shutdown_tag;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool shutdown_done;
    size_t live_calls; /* under mu: calls not yet freed */
    _Atomic bool shutting_down;
};

static inline bool drey_server__streaming(const drey_server__method *m) {
    return m->spec.client_streaming || m->spec.server_streaming;
}

/* --- call.c ------------------------------------------------------------------ */

/* The call that slot was filled with (its metadata and payload move to it). */
drey_call *drey_server__call_new(drey_server *s, drey_server__slot *slot);

/* Starts the new call: its RECV_CLOSE_ON_SERVER, then its handler (or a
 * refusal: an unknown method, a deadline already past, a malformed
 * request). */
void drey_server__call_start(drey_call *c);

#endif
