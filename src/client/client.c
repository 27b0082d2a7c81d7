/*
 * client — channel, unary calls (synchronous and asynchronous) and server
 * streams on the gRPC C core; see include/drey/client.h.
 *
 * Two completion queues per client: a pluck queue for synchronous calls and
 * streams (each waits for its own tag), and a next queue for asynchronous
 * calls (drey_client_next takes whichever finishes first). A unary call is
 * one batch of all six client ops, so it completes with one event; the
 * RECV_STATUS_ON_CLIENT op makes that event arrive only when the call is
 * over, whatever happened to it.
 */
#include "drey/client.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include "drey/alloc.h"
#include "headers.h"
#include "internal.h"

#define DETAILS_KEY "grpc-status-details-bin"
/* Method paths registered with the channel (grpc_channel_register_call saves
 * parsing a path per call); later ones are passed as a path each time. */
#define MAX_REGISTERED_METHODS 64

typedef struct registered_method {
    char *path;
    void *handle;
} registered_method;

/* What a call's batches point into until they complete: the same for a
 * unary call and a stream. */
typedef struct call_io {
    grpc_call *call;
    grpc_byte_buffer *send;
    grpc_byte_buffer *recv;
    grpc_metadata_array initial_md;
    grpc_metadata_array trailing_md;
    grpc_status_code code;
    grpc_slice details;
} call_io;

/* One unary call. */
typedef struct unary_call {
    struct unary_call *prev, *next; /* the in-flight list (asynchronous calls) */
    drey_client *owner;             /* whose list: a queue may be shared by several clients */
    void *user;
    int64_t started_ns;
    call_io io;
} unary_call;

struct drey_client {
    grpc_channel *channel;
    grpc_completion_queue *sync_cq;  /* pluck: unary calls and streams */
    grpc_completion_queue *async_cq; /* next: drey_client_start_call */
    bool shared_cq;                  /* async_cq belongs to a cluster client */
    drey_client__headers headers;    /* sent on every call */
    registered_method methods[MAX_REGISTERED_METHODS];
    size_t n_methods;
    unary_call *in_flight; /* asynchronous calls not yet returned by next */
    size_t n_in_flight;
    drey_client_stream *streams; /* started and not finished */
};

struct drey_client_stream {
    drey_client_stream *prev, *next; /* the client's open streams */
    drey_client *client;
    call_io io;
    bool ended;        /* a read saw the end of the stream */
    bool undecodable;  /* a message did not decode: the stream was cancelled */
    const char *undecodable_type;
    /* Their addresses are the tags of the stream's three batches. */
    char send_tag, recv_tag, status_tag;
};

/* --- helpers -------------------------------------------------------------- */

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static gpr_timespec deadline_after(int64_t timeout_ms) {
    if (timeout_ms < 0)
        return gpr_inf_future(GPR_CLOCK_MONOTONIC);
    /* Not now + 0: grpc core may round the grpc-timeout it sends up (its
     * timeout_encoding.h says so), so "now" can reach the server as a
     * deadline still ahead, and a fast server answers. */
    if (timeout_ms == 0)
        return gpr_inf_past(GPR_CLOCK_MONOTONIC);
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
}

static grpc_byte_buffer *buffer_of(const void *data, size_t len) {
    grpc_slice s = grpc_slice_from_copied_buffer(data, len);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

static grpc_byte_buffer *buffer_of_message(const ProtobufCMessage *m) {
    size_t n = protobuf_c_message_get_packed_size(m);
    grpc_slice s = grpc_slice_malloc(n);
    protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

/* A received message as one slice (a reference, not a copy, when it came in
 * one piece). */
static grpc_slice flatten(grpc_byte_buffer *bb) {
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, bb))
        return grpc_empty_slice();
    grpc_slice s = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    return s;
}

static void copy_buffer(grpc_byte_buffer *bb, drey_arena *arena, ProtobufCBinaryData *out) {
    grpc_slice s = flatten(bb);
    out->len = GRPC_SLICE_LENGTH(s);
    out->data = drey_arena_alloc(arena, out->len > 0 ? out->len : 1);
    memcpy(out->data, GRPC_SLICE_START_PTR(s), out->len);
    grpc_slice_unref(s);
}

static ProtobufCMessage *decode_buffer(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *type,
                                       drey_arena *arena) {
    grpc_slice s = flatten(bb);
    ProtobufCMessage *m = protobuf_c_message_unpack(type, drey_arena_protobuf_allocator(arena), GRPC_SLICE_LENGTH(s),
                                                    GRPC_SLICE_START_PTR(s));
    grpc_slice_unref(s);
    return m;
}

/* Fills st from what RECV_STATUS_ON_CLIENT delivered. */
static void fill_status(drey_client_status *st, grpc_status_code code, grpc_slice details,
                        const grpc_metadata_array *trailing, drey_arena *arena) {
    drey_client_status_set(st, code,
                           drey_arena_strndup(arena, (const char *)GRPC_SLICE_START_PTR(details),
                                              GRPC_SLICE_LENGTH(details)));
    if (code == GRPC_STATUS_OK)
        return;
    for (size_t i = 0; i < trailing->count; i++) {
        const grpc_metadata *m = &trailing->metadata[i];
        if (grpc_slice_str_cmp(m->key, DETAILS_KEY) == 0) {
            drey_client_status_decode_details(st, GRPC_SLICE_START_PTR(m->value), GRPC_SLICE_LENGTH(m->value), arena);
            return;
        }
    }
}

static void *method_handle(drey_client *c, const char *method) {
    for (size_t i = 0; i < c->n_methods; i++) {
        if (strcmp(c->methods[i].path, method) == 0)
            return c->methods[i].handle;
    }
    if (c->n_methods == MAX_REGISTERED_METHODS)
        return NULL;
    registered_method *r = &c->methods[c->n_methods];
    r->path = drey_xstrdup(method);
    r->handle = grpc_channel_register_call(c->channel, r->path, NULL, NULL);
    c->n_methods++;
    return r->handle;
}

static grpc_call *new_call(drey_client *c, grpc_completion_queue *cq, const char *method, int64_t timeout_ms) {
    gpr_timespec deadline = deadline_after(timeout_ms);
    void *handle = method_handle(c, method);
    if (handle != NULL)
        return grpc_channel_create_registered_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq, handle, deadline,
                                                   NULL);
    grpc_slice path = grpc_slice_from_static_string(method);
    return grpc_channel_create_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq, path, NULL, deadline, NULL);
}

/* Creates io's call (io->send already set) and what its batches fill in. */
static void io_open(call_io *io, drey_client *c, grpc_completion_queue *cq, const char *method, int64_t timeout_ms) {
    grpc_metadata_array_init(&io->initial_md);
    grpc_metadata_array_init(&io->trailing_md);
    io->recv = NULL;
    io->details = grpc_empty_slice();
    io->call = new_call(c, cq, method, timeout_ms);
}

/* Frees what io's batches filled in, its request and the call. */
static void io_release(call_io *io) {
    if (io->recv != NULL)
        grpc_byte_buffer_destroy(io->recv);
    if (io->send != NULL)
        grpc_byte_buffer_destroy(io->send);
    grpc_slice_unref(io->details);
    grpc_metadata_array_destroy(&io->initial_md);
    grpc_metadata_array_destroy(&io->trailing_md);
    if (io->call != NULL)
        grpc_call_unref(io->call);
}

/* The four ops that open every call this client makes (one request message,
 * then the server's headers): ops[0..3]. Unary calls add the response and the
 * status to the same batch; streams read them later. */
static void open_ops(grpc_op *ops, drey_client *c, grpc_byte_buffer *send, grpc_metadata_array *initial_md) {
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = c->headers.count;
    ops[0].data.send_initial_metadata.metadata = c->headers.md;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = initial_md;
}

/* --- unary calls ---------------------------------------------------------- */

/* Starts u's batch (u->io.send set by the caller) on cq with tag u. */
static grpc_call_error unary_start(drey_client *c, unary_call *u, grpc_completion_queue *cq, const char *method,
                                   int64_t timeout_ms) {
    io_open(&u->io, c, cq, method, timeout_ms);

    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    open_ops(ops, c, u->io.send, &u->io.initial_md);
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &u->io.recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &u->io.trailing_md;
    ops[5].data.recv_status_on_client.status = &u->io.code;
    ops[5].data.recv_status_on_client.status_details = &u->io.details;
    u->started_ns = mono_ns();
    return grpc_call_start_batch(u->io.call, ops, 6, u, NULL);
}

/* Runs u (send set) to completion on the pluck queue; false when gRPC
 * refused to start it (st says so and u is released). */
static bool unary_run(drey_client *c, unary_call *u, const char *method, int64_t timeout_ms,
                      drey_client_status *st) {
    grpc_call_error err = unary_start(c, u, c->sync_cq, method, timeout_ms);
    if (err != GRPC_CALL_OK) {
        drey_client_status_set(st, GRPC_STATUS_INTERNAL, grpc_call_error_to_string(err));
        io_release(&u->io);
        return false;
    }
    grpc_event ev = grpc_completion_queue_pluck(c->sync_cq, u, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type != GRPC_OP_COMPLETE)
        abort(); /* no deadline on the pluck, and the queue is not shut down */
    return true;
}

grpc_status_code drey_client_unary(drey_client *c, const char *method, const ProtobufCMessage *request,
                                   const ProtobufCMessageDescriptor *response_type, int64_t timeout_ms,
                                   drey_arena *arena, ProtobufCMessage **response, drey_client_status *st) {
    *response = NULL;
    unary_call u = {.io.send = buffer_of_message(request)};
    if (!unary_run(c, &u, method, timeout_ms, st))
        return st->code;
    fill_status(st, u.io.code, u.io.details, &u.io.trailing_md, arena);
    if (st->code == GRPC_STATUS_OK) {
        ProtobufCMessage *m = u.io.recv != NULL ? decode_buffer(u.io.recv, response_type, arena) : NULL;
        if (m == NULL)
            drey_client_status_set(st, GRPC_STATUS_INTERNAL,
                                   drey_arena_sprintf(arena, "the response is not a valid %s", response_type->name));
        *response = m;
    }
    io_release(&u.io);
    return st->code;
}

grpc_status_code drey_client_unary_raw(drey_client *c, const char *method, const void *request, size_t request_len,
                                       int64_t timeout_ms, drey_arena *arena, ProtobufCBinaryData *response,
                                       drey_client_status *st) {
    response->data = NULL;
    response->len = 0;
    unary_call u = {.io.send = buffer_of(request, request_len)};
    if (!unary_run(c, &u, method, timeout_ms, st))
        return st->code;
    fill_status(st, u.io.code, u.io.details, &u.io.trailing_md, arena);
    if (st->code == GRPC_STATUS_OK && u.io.recv != NULL)
        copy_buffer(u.io.recv, arena, response);
    io_release(&u.io);
    return st->code;
}

/* --- asynchronous unary calls --------------------------------------------- */

bool drey_client_start_call(drey_client *c, const char *method, const void *request, size_t request_len,
                            int64_t timeout_ms, void *user) {
    unary_call *u = drey_xcalloc(1, sizeof *u);
    u->user = user;
    u->owner = c;
    u->io.send = buffer_of(request, request_len);
    if (unary_start(c, u, c->async_cq, method, timeout_ms) != GRPC_CALL_OK) {
        io_release(&u->io);
        free(u);
        return false;
    }
    u->next = c->in_flight;
    if (c->in_flight != NULL)
        c->in_flight->prev = u;
    c->in_flight = u;
    c->n_in_flight++;
    return true;
}

/* Takes the next finished asynchronous call off cq and its owner's list,
 * or NULL. */
static unary_call *take_from(grpc_completion_queue *cq, gpr_timespec deadline) {
    grpc_event ev = grpc_completion_queue_next(cq, deadline, NULL);
    if (ev.type != GRPC_OP_COMPLETE)
        return NULL;
    unary_call *u = ev.tag;
    drey_client *c = u->owner;
    if (u->prev != NULL)
        u->prev->next = u->next;
    else
        c->in_flight = u->next;
    if (u->next != NULL)
        u->next->prev = u->prev;
    c->n_in_flight--;
    return u;
}

static unary_call *take_completion(drey_client *c, gpr_timespec deadline) {
    if (c->n_in_flight == 0)
        return NULL;
    return take_from(c->async_cq, deadline);
}

/* Describes u in *out (in arena) and frees it. */
static void complete(unary_call *u, drey_arena *arena, drey_client_completion *out) {
    out->user = u->user;
    out->elapsed_ns = mono_ns() - u->started_ns;
    out->response.data = NULL;
    out->response.len = 0;
    fill_status(&out->status, u->io.code, u->io.details, &u->io.trailing_md, arena);
    if (u->io.code == GRPC_STATUS_OK && u->io.recv != NULL)
        copy_buffer(u->io.recv, arena, &out->response);
    io_release(&u->io);
    free(u);
}

bool drey_client_next(drey_client *c, int64_t timeout_ms, drey_arena *arena, drey_client_completion *out) {
    unary_call *u = take_completion(c, deadline_after(timeout_ms));
    if (u == NULL)
        return false;
    complete(u, arena, out);
    return true;
}

bool drey_client__next_on(grpc_completion_queue *cq, int64_t timeout_ms, drey_arena *arena,
                          drey_client_completion *out) {
    unary_call *u = take_from(cq, deadline_after(timeout_ms));
    if (u == NULL)
        return false;
    complete(u, arena, out);
    return true;
}

void drey_client__cancel_all(drey_client *c) {
    for (unary_call *u = c->in_flight; u != NULL; u = u->next)
        grpc_call_cancel(u->io.call, NULL);
}

size_t drey_client_in_flight(const drey_client *c) {
    return c->n_in_flight;
}

/* --- server streaming ----------------------------------------------------- */

static void stream_release(drey_client_stream *s) {
    io_release(&s->io);
    free(s);
}

static void pluck(drey_client *c, void *tag) {
    grpc_event ev = grpc_completion_queue_pluck(c->sync_cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type != GRPC_OP_COMPLETE)
        abort();
}

drey_client_stream *drey_client_stream_start(drey_client *c, const char *method, const ProtobufCMessage *request,
                                             int64_t timeout_ms, drey_client_status *st) {
    drey_client_stream *s = drey_xcalloc(1, sizeof *s);
    s->client = c;
    s->io.send = buffer_of_message(request);
    io_open(&s->io, c, c->sync_cq, method, timeout_ms);

    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    open_ops(ops, c, s->io.send, &s->io.initial_md);
    grpc_call_error err = grpc_call_start_batch(s->io.call, ops, 4, &s->send_tag, NULL);
    if (err != GRPC_CALL_OK) {
        drey_client_status_set(st, GRPC_STATUS_INTERNAL, grpc_call_error_to_string(err));
        stream_release(s);
        return NULL;
    }
    grpc_op status_op;
    memset(&status_op, 0, sizeof status_op);
    status_op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    status_op.data.recv_status_on_client.trailing_metadata = &s->io.trailing_md;
    status_op.data.recv_status_on_client.status = &s->io.code;
    status_op.data.recv_status_on_client.status_details = &s->io.details;
    err = grpc_call_start_batch(s->io.call, &status_op, 1, &s->status_tag, NULL);
    if (err != GRPC_CALL_OK) {
        drey_client_status_set(st, GRPC_STATUS_INTERNAL, grpc_call_error_to_string(err));
        grpc_call_cancel(s->io.call, NULL);
        pluck(c, &s->send_tag);
        stream_release(s);
        return NULL;
    }
    s->next = c->streams;
    if (c->streams != NULL)
        c->streams->prev = s;
    c->streams = s;
    return s;
}

/* Runs one batch of n ops on s's call and waits for it; false when gRPC
 * refused it or it failed (the stream is over: its status says why). */
static bool stream_batch(drey_client_stream *s, grpc_op *ops, size_t n) {
    char tag;
    if (grpc_call_start_batch(s->io.call, ops, n, &tag, NULL) != GRPC_CALL_OK)
        return false;
    grpc_event ev = grpc_completion_queue_pluck(s->client->sync_cq, &tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    return ev.type == GRPC_OP_COMPLETE && ev.success;
}

drey_client_stream *drey_client_stream_start_raw(drey_client *c, const char *method, const ProtobufCBinaryData *requests,
                                                 size_t n_requests, int64_t timeout_ms, drey_client_status *st) {
    drey_client_stream *s = drey_xcalloc(1, sizeof *s);
    s->client = c;
    io_open(&s->io, c, c->sync_cq, method, timeout_ms);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_INITIAL_METADATA;
    op.data.send_initial_metadata.count = c->headers.count;
    op.data.send_initial_metadata.metadata = c->headers.md;
    bool sent = stream_batch(s, &op, 1);
    /* A send that fails means the call is over: its status tells why. */
    for (size_t i = 0; sent && i < n_requests; i++) {
        memset(&op, 0, sizeof op);
        op.op = GRPC_OP_SEND_MESSAGE;
        grpc_byte_buffer *bb = buffer_of(requests[i].data, requests[i].len);
        op.data.send_message.send_message = bb;
        sent = stream_batch(s, &op, 1);
        grpc_byte_buffer_destroy(bb);
    }
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (sent)
        ops[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[n++].data.recv_initial_metadata.recv_initial_metadata = &s->io.initial_md;
    grpc_call_error err = grpc_call_start_batch(s->io.call, ops, n, &s->send_tag, NULL);
    if (err == GRPC_CALL_OK) {
        memset(&op, 0, sizeof op);
        op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
        op.data.recv_status_on_client.trailing_metadata = &s->io.trailing_md;
        op.data.recv_status_on_client.status = &s->io.code;
        op.data.recv_status_on_client.status_details = &s->io.details;
        err = grpc_call_start_batch(s->io.call, &op, 1, &s->status_tag, NULL);
        if (err != GRPC_CALL_OK) {
            grpc_call_cancel(s->io.call, NULL);
            pluck(c, &s->send_tag);
        }
    }
    if (err != GRPC_CALL_OK) {
        drey_client_status_set(st, GRPC_STATUS_INTERNAL, grpc_call_error_to_string(err));
        stream_release(s);
        return NULL;
    }
    s->next = c->streams;
    if (c->streams != NULL)
        c->streams->prev = s;
    c->streams = s;
    return s;
}

/* Receives the next message into s->io.recv; false at the end of the stream. */
static bool stream_recv(drey_client_stream *s) {
    if (s->ended)
        return false;
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &s->io.recv;
    if (grpc_call_start_batch(s->io.call, &op, 1, &s->recv_tag, NULL) != GRPC_CALL_OK) {
        s->ended = true;
        return false;
    }
    pluck(s->client, &s->recv_tag);
    if (s->io.recv == NULL) {
        s->ended = true;
        return false;
    }
    return true;
}

bool drey_client_stream_read(drey_client_stream *s, const ProtobufCMessageDescriptor *type, drey_arena *arena,
                             ProtobufCMessage **message) {
    *message = NULL;
    if (!stream_recv(s))
        return false;
    *message = decode_buffer(s->io.recv, type, arena);
    grpc_byte_buffer_destroy(s->io.recv);
    s->io.recv = NULL;
    if (*message == NULL) {
        s->undecodable = true;
        s->undecodable_type = type->name;
        s->ended = true;
        grpc_call_cancel(s->io.call, NULL);
        return false;
    }
    return true;
}

bool drey_client_stream_read_raw(drey_client_stream *s, drey_arena *arena, ProtobufCBinaryData *message) {
    message->data = NULL;
    message->len = 0;
    if (!stream_recv(s))
        return false;
    copy_buffer(s->io.recv, arena, message);
    grpc_byte_buffer_destroy(s->io.recv);
    s->io.recv = NULL;
    return true;
}

void drey_client_stream_cancel(drey_client_stream *s) {
    grpc_call_cancel(s->io.call, NULL);
}

grpc_status_code drey_client_stream_finish(drey_client_stream *s, drey_arena *arena, drey_client_status *st) {
    while (stream_recv(s)) {
        grpc_byte_buffer_destroy(s->io.recv);
        s->io.recv = NULL;
    }
    drey_client *c = s->client;
    pluck(c, &s->send_tag);
    pluck(c, &s->status_tag);
    if (s->undecodable)
        drey_client_status_set(st, GRPC_STATUS_INTERNAL,
                               drey_arena_sprintf(arena, "a stream message is not a valid %s", s->undecodable_type));
    else
        fill_status(st, s->io.code, s->io.details, &s->io.trailing_md, arena);
    if (s->prev != NULL)
        s->prev->next = s->next;
    else
        c->streams = s->next;
    if (s->next != NULL)
        s->next->prev = s->prev;
    stream_release(s);
    return st->code;
}

/* --- pipelined calls ------------------------------------------------------ */

/* A pipeline waits on a next queue of its own: its send, receive and
 * status batches complete in any order, and one wait takes whichever comes,
 * so received answers are taken in while a send waits for flow control. */

#define PIPELINE_PATH DREY_CLIENT_CACHE("Pipeline")

typedef struct pipeline_msg {
    struct pipeline_msg *next;
    grpc_byte_buffer *bb;
} pipeline_msg;

struct drey_client_pipeline {
    drey_client *client;
    grpc_completion_queue *cq;
    grpc_call *call;
    grpc_metadata_array initial_md, trailing_md;
    grpc_status_code code;
    grpc_slice details;
    grpc_byte_buffer *send;   /* the message gRPC has not taken yet */
    grpc_byte_buffer *recv;
    bool open_done, status_done, recv_done, sending, half_closed;
    bool undecodable;
    pipeline_msg *q_head, *q_tail; /* received, not yet read */
    uint8_t *buf;             /* the next PipelineRequest's encoded operations */
    size_t len, cap, pending;
    /* Their addresses are the tags of the pipeline's batches. */
    char open_tag, send_tag, recv_tag, status_tag;
};

static void pipeline_recv(drey_client_pipeline *p) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &p->recv;
    if (grpc_call_start_batch(p->call, &op, 1, &p->recv_tag, NULL) != GRPC_CALL_OK)
        p->recv_done = true;
}

/* Takes one event (false when deadline passed first). */
static bool pipeline_pump(drey_client_pipeline *p, gpr_timespec deadline) {
    grpc_event ev = grpc_completion_queue_next(p->cq, deadline, NULL);
    if (ev.type != GRPC_OP_COMPLETE)
        return false;
    if (ev.tag == &p->open_tag) {
        p->open_done = true;
    } else if (ev.tag == &p->send_tag) {
        p->sending = false;
        if (p->send != NULL)
            grpc_byte_buffer_destroy(p->send);
        p->send = NULL;
    } else if (ev.tag == &p->status_tag) {
        p->status_done = true;
    } else if (ev.tag == &p->recv_tag) {
        if (!ev.success || p->recv == NULL) {
            p->recv_done = true;
        } else {
            pipeline_msg *m = drey_xmalloc(sizeof *m);
            m->next = NULL;
            m->bb = p->recv;
            p->recv = NULL;
            if (p->q_tail != NULL)
                p->q_tail->next = m;
            else
                p->q_head = m;
            p->q_tail = m;
            pipeline_recv(p);
        }
    }
    return true;
}

drey_client_pipeline *drey_client_pipeline_open(drey_client *c, int64_t timeout_ms, drey_client_status *st) {
    drey_client_pipeline *p = drey_xcalloc(1, sizeof *p);
    p->client = c;
    p->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_metadata_array_init(&p->initial_md);
    grpc_metadata_array_init(&p->trailing_md);
    p->details = grpc_empty_slice();
    p->call = new_call(c, p->cq, PIPELINE_PATH, timeout_ms);
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = c->headers.count;
    ops[0].data.send_initial_metadata.metadata = c->headers.md;
    ops[1].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[1].data.recv_initial_metadata.recv_initial_metadata = &p->initial_md;
    grpc_call_error err = grpc_call_start_batch(p->call, ops, 2, &p->open_tag, NULL);
    if (err == GRPC_CALL_OK) {
        grpc_op op;
        memset(&op, 0, sizeof op);
        op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
        op.data.recv_status_on_client.trailing_metadata = &p->trailing_md;
        op.data.recv_status_on_client.status = &p->code;
        op.data.recv_status_on_client.status_details = &p->details;
        err = grpc_call_start_batch(p->call, &op, 1, &p->status_tag, NULL);
        if (err != GRPC_CALL_OK)
            p->status_done = true;
    } else {
        p->open_done = p->status_done = true;
    }
    if (err != GRPC_CALL_OK) {
        drey_client_status_set(st, GRPC_STATUS_INTERNAL, grpc_call_error_to_string(err));
        p->recv_done = p->half_closed = true;
        grpc_call_cancel(p->call, NULL);
        drey_arena scratch;
        drey_arena_init(&scratch, NULL, 0);
        drey_client_status ignored;
        drey_client_pipeline_finish(p, &scratch, &ignored);
        drey_arena_destroy(&scratch);
        return NULL;
    }
    pipeline_recv(p);
    return p;
}

static void put_varint(drey_client_pipeline *p, uint64_t v) {
    do {
        uint8_t b = v & 0x7f;
        v >>= 7;
        p->buf[p->len++] = (uint8_t)(b | (v != 0 ? 0x80 : 0));
    } while (v != 0);
}

static size_t varint_len(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* The PipelineOperation field that carries requests of type d (0: none). */
static uint32_t operation_field(const ProtobufCMessageDescriptor *d) {
    const ProtobufCMessageDescriptor *op = &drey__cache__v1__pipeline_operation__descriptor;
    for (unsigned i = 0; i < op->n_fields; i++) {
        if (op->fields[i].type == PROTOBUF_C_TYPE_MESSAGE && op->fields[i].descriptor == d &&
            (op->fields[i].flags & PROTOBUF_C_FIELD_FLAG_ONEOF) != 0)
            return op->fields[i].id;
    }
    return 0;
}

/* Appends one operation, encoded by hand: the request bytes go in as they
 * are, with no decode and re-encode. */
static void add_encoded(drey_client_pipeline *p, uint64_t id, uint32_t field, const void *request, size_t len,
                        int64_t timeout_ms) {
    uint64_t secs = 0, nanos = 0;
    size_t dur = 0;
    if (timeout_ms >= 0) {
        secs = (uint64_t)timeout_ms / 1000;
        nanos = (uint64_t)timeout_ms % 1000 * 1000000;
        dur = (secs != 0 ? 1 + varint_len(secs) : 0) + (nanos != 0 ? 1 + varint_len(nanos) : 0);
    }
    size_t body = (id != 0 ? 1 + varint_len(id) : 0) + (timeout_ms >= 0 ? 1 + varint_len(dur) + dur : 0) +
                  varint_len((uint64_t)field << 3 | 2) + varint_len(len) + len;
    size_t need = p->len + 1 + varint_len(body) + body;
    if (need > p->cap) {
        p->cap = need > 2 * p->cap ? need : 2 * p->cap;
        p->buf = drey_xrealloc(p->buf, p->cap, 1);
    }
    p->buf[p->len++] = 0x0a; /* operations = 1, length-delimited */
    put_varint(p, body);
    if (id != 0) {
        p->buf[p->len++] = 0x08;
        put_varint(p, id);
    }
    if (timeout_ms >= 0) {
        p->buf[p->len++] = 0x12;
        put_varint(p, dur);
        if (secs != 0) {
            p->buf[p->len++] = 0x08;
            put_varint(p, secs);
        }
        if (nanos != 0) {
            p->buf[p->len++] = 0x10;
            put_varint(p, nanos);
        }
    }
    put_varint(p, (uint64_t)field << 3 | 2);
    put_varint(p, len);
    if (len > 0)
        memcpy(p->buf + p->len, request, len);
    p->len += len;
    p->pending++;
}

bool drey_client_pipeline_add(drey_client_pipeline *p, uint64_t id, const ProtobufCMessage *request,
                              int64_t timeout_ms) {
    uint32_t field = operation_field(request->descriptor);
    if (field == 0)
        return false;
    size_t n = protobuf_c_message_get_packed_size(request);
    uint8_t stack[512];
    uint8_t *b = n <= sizeof stack ? stack : drey_xmalloc(n);
    protobuf_c_message_pack(request, b);
    add_encoded(p, id, field, b, n, timeout_ms);
    if (b != stack)
        free(b);
    return true;
}

bool drey_client_pipeline_add_raw(drey_client_pipeline *p, uint64_t id, const char *method, const void *request,
                                  size_t request_len, int64_t timeout_ms) {
    const char *prefix = DREY_CLIENT_CACHE("");
    if (strncmp(method, prefix, strlen(prefix)) == 0)
        method += strlen(prefix);
    const ProtobufCMethodDescriptor *md =
        protobuf_c_service_descriptor_get_method_by_name(&drey__cache__v1__cache__descriptor, method);
    uint32_t field = md != NULL ? operation_field(md->input) : 0;
    if (field == 0)
        return false;
    add_encoded(p, id, field, request, request_len, timeout_ms);
    return true;
}

size_t drey_client_pipeline_pending(const drey_client_pipeline *p) {
    return p->pending;
}

static void pipeline_wait_send(drey_client_pipeline *p) {
    while (p->sending)
        pipeline_pump(p, gpr_inf_future(GPR_CLOCK_REALTIME));
}

bool drey_client_pipeline_flush(drey_client_pipeline *p) {
    if (p->half_closed)
        return false;
    if (p->pending == 0)
        return true;
    pipeline_wait_send(p);
    p->send = buffer_of(p->buf, p->len);
    p->len = 0;
    p->pending = 0;
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = p->send;
    if (grpc_call_start_batch(p->call, &op, 1, &p->send_tag, NULL) != GRPC_CALL_OK) {
        grpc_byte_buffer_destroy(p->send);
        p->send = NULL;
        return false;
    }
    p->sending = true;
    return true;
}

bool drey_client_pipeline_next(drey_client_pipeline *p, int64_t timeout_ms, drey_arena *arena,
                               Drey__Cache__V1__PipelineResponse **response) {
    *response = NULL;
    gpr_timespec deadline = timeout_ms < 0 ? gpr_inf_future(GPR_CLOCK_MONOTONIC) : deadline_after(timeout_ms);
    while (p->q_head == NULL && !p->recv_done) {
        if (!pipeline_pump(p, deadline))
            return false;
    }
    pipeline_msg *m = p->q_head;
    if (m == NULL || p->undecodable)
        return false;
    p->q_head = m->next;
    if (p->q_head == NULL)
        p->q_tail = NULL;
    *response = (Drey__Cache__V1__PipelineResponse *)decode_buffer(
        m->bb, &drey__cache__v1__pipeline_response__descriptor, arena);
    grpc_byte_buffer_destroy(m->bb);
    free(m);
    if (*response == NULL) {
        p->undecodable = true;
        grpc_call_cancel(p->call, NULL);
        return false;
    }
    return true;
}

grpc_status_code drey_client_pipeline_result_status(const Drey__Cache__V1__PipelineResult *r, drey_arena *arena,
                                                    drey_client_status *st) {
    const Google__Rpc__Status *s = r->status;
    drey_client_status_set(st, s != NULL ? (grpc_status_code)s->code : GRPC_STATUS_OK,
                           s != NULL ? drey_arena_strndup(arena, s->message, strlen(s->message)) : "");
    if (s != NULL && s->code != 0) {
        size_t n = protobuf_c_message_get_packed_size(&s->base);
        uint8_t *b = drey_arena_alloc(arena, n > 0 ? n : 1);
        protobuf_c_message_pack(&s->base, b);
        drey_client_status_decode_details(st, b, n, arena);
    }
    return st->code;
}

const ProtobufCMessage *drey_client_pipeline_result_response(const Drey__Cache__V1__PipelineResult *r) {
    if (r->response_case == DREY__CACHE__V1__PIPELINE_RESULT__RESPONSE__NOT_SET)
        return NULL;
    const ProtobufCFieldDescriptor *fd =
        protobuf_c_message_descriptor_get_field(&drey__cache__v1__pipeline_result__descriptor, r->response_case);
    return fd != NULL ? *(ProtobufCMessage *const *)(const void *)((const char *)r + fd->offset) : NULL;
}

void drey_client_pipeline_close_send(drey_client_pipeline *p) {
    if (p->half_closed)
        return;
    drey_client_pipeline_flush(p);
    p->half_closed = true;
    pipeline_wait_send(p);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    if (grpc_call_start_batch(p->call, &op, 1, &p->send_tag, NULL) == GRPC_CALL_OK)
        p->sending = true;
}

void drey_client_pipeline_cancel(drey_client_pipeline *p) {
    grpc_call_cancel(p->call, NULL);
}

grpc_status_code drey_client_pipeline_finish(drey_client_pipeline *p, drey_arena *arena, drey_client_status *st) {
    drey_client_pipeline_close_send(p);
    while (!p->open_done || !p->status_done || !p->recv_done || p->sending)
        pipeline_pump(p, gpr_inf_future(GPR_CLOCK_REALTIME));
    if (p->undecodable)
        drey_client_status_set(st, GRPC_STATUS_INTERNAL, "a stream message is not a valid drey.cache.v1.PipelineResponse");
    else
        fill_status(st, p->code, p->details, &p->trailing_md, arena);
    for (pipeline_msg *m = p->q_head, *next; m != NULL; m = next) {
        next = m->next;
        grpc_byte_buffer_destroy(m->bb);
        free(m);
    }
    if (p->recv != NULL)
        grpc_byte_buffer_destroy(p->recv);
    if (p->send != NULL)
        grpc_byte_buffer_destroy(p->send);
    grpc_slice_unref(p->details);
    grpc_metadata_array_destroy(&p->initial_md);
    grpc_metadata_array_destroy(&p->trailing_md);
    grpc_call_unref(p->call);
    grpc_completion_queue_shutdown(p->cq);
    while (grpc_completion_queue_next(p->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type != GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(p->cq);
    free(p->buf);
    free(p);
    return st->code;
}

/* --- the client ----------------------------------------------------------- */

drey_client *drey_client_open(const drey_client_options *opts, char *err, size_t err_cap) {
    return drey_client__open_on(opts, NULL, err, err_cap);
}

/* A whole PEM file, NUL-terminated (freed by the caller); NULL with a
 * message in err. */
static char *read_pem(const char *what, const char *path, char *err, size_t err_cap) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, err_cap, "%s %s: %s", what, path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, len = 0, n;
    char *buf = drey_xmalloc(cap);
    while ((n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (len + 1 == cap)
            buf = drey_xrealloc(buf, cap *= 2, 1);
    }
    bool bad = ferror(f) != 0;
    fclose(f);
    buf[len] = '\0';
    if (bad || strstr(buf, "-----BEGIN ") == NULL) {
        snprintf(err, err_cap, "%s %s: %s", what, path, bad ? "cannot read it" : "not a PEM file");
        free(buf);
        return NULL;
    }
    return buf;
}

static bool wants_tls(const drey_client_options *o) {
    return o->tls || (o->tls_ca != NULL && o->tls_ca[0]) || (o->tls_cert != NULL && o->tls_cert[0]) ||
           (o->tls_key != NULL && o->tls_key[0]) || (o->tls_server_name != NULL && o->tls_server_name[0]);
}

/* The channel's credentials: plaintext, or TLS from the options' files.
 * NULL with a message in err. */
static grpc_channel_credentials *credentials(const drey_client_options *o, char *err, size_t err_cap) {
    if (!wants_tls(o))
        return grpc_insecure_credentials_create();
    bool has_cert = o->tls_cert != NULL && o->tls_cert[0], has_key = o->tls_key != NULL && o->tls_key[0];
    if (has_cert != has_key) {
        snprintf(err, err_cap, "a client certificate needs its key and a key its certificate (--tls-cert, --tls-key)");
        return NULL;
    }
    char *ca = NULL, *cert = NULL, *key = NULL;
    grpc_channel_credentials *creds = NULL;
    if (o->tls_ca != NULL && o->tls_ca[0] && (ca = read_pem("TLS CA", o->tls_ca, err, err_cap)) == NULL)
        goto out;
    if (has_cert && ((cert = read_pem("TLS certificate", o->tls_cert, err, err_cap)) == NULL ||
                     (key = read_pem("TLS key", o->tls_key, err, err_cap)) == NULL))
        goto out;
    grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
    creds = grpc_ssl_credentials_create(ca, has_cert ? &pair : NULL, NULL, NULL);
    if (creds == NULL)
        snprintf(err, err_cap, "gRPC refused the TLS settings");
out:
    free(ca);
    free(cert);
    free(key);
    return creds;
}

drey_client *drey_client__open_on(const drey_client_options *opts, grpc_completion_queue *async_cq, char *err,
                                  size_t err_cap) {
    if (opts->target == NULL || opts->target[0] == '\0') {
        snprintf(err, err_cap, "no target address");
        return NULL;
    }
    drey_client *c = drey_xcalloc(1, sizeof *c);
    grpc_init();
    if (!drey_client__headers_build(&c->headers, opts->token, opts->headers, opts->n_headers, err, err_cap)) {
        free(c);
        grpc_shutdown();
        return NULL;
    }
    grpc_channel_credentials *creds = credentials(opts, err, err_cap);
    if (creds == NULL) {
        drey_client__headers_destroy(&c->headers);
        free(c);
        grpc_shutdown();
        return NULL;
    }
    grpc_arg args[4];
    size_t n = 0;
    memset(args, 0, sizeof args);
    /* Each client its own connection: a load generator's clients must not
     * share one. */
    args[n].type = GRPC_ARG_INTEGER;
    args[n].key = GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL;
    args[n++].value.integer = 1;
    args[n].type = GRPC_ARG_INTEGER;
    args[n].key = GRPC_ARG_ENABLE_RETRIES;
    args[n++].value.integer = 0;
    if (opts->max_recv_message_bytes != 0) {
        args[n].type = GRPC_ARG_INTEGER;
        args[n].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
        args[n++].value.integer = opts->max_recv_message_bytes;
    }
    if (opts->tls_server_name != NULL && opts->tls_server_name[0] != '\0') {
        args[n].type = GRPC_ARG_STRING;
        args[n].key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
        args[n++].value.string = (char *)opts->tls_server_name;
    }
    grpc_channel_args cargs = {.num_args = n, .args = args};
    c->channel = grpc_channel_create(opts->target, creds, &cargs);
    grpc_channel_credentials_release(creds);
    c->sync_cq = grpc_completion_queue_create_for_pluck(NULL);
    c->shared_cq = async_cq != NULL;
    c->async_cq = async_cq != NULL ? async_cq : grpc_completion_queue_create_for_next(NULL);
    return c;
}

void drey_client_close(drey_client *c) {
    if (c == NULL)
        return;
    if (c->streams != NULL) {
        drey_arena scratch;
        drey_arena_init(&scratch, NULL, 0);
        while (c->streams != NULL) {
            drey_client_status st;
            drey_client_stream_cancel(c->streams);
            drey_client_stream_finish(c->streams, &scratch, &st);
        }
        drey_arena_destroy(&scratch);
    }
    if (c->shared_cq) {
        /* The queue's owner drained it: a completion taken here could be
         * another client's. */
        if (c->n_in_flight != 0)
            abort();
    } else {
        drey_client__cancel_all(c);
        unary_call *u;
        while ((u = take_completion(c, gpr_inf_future(GPR_CLOCK_REALTIME))) != NULL) {
            io_release(&u->io);
            free(u);
        }
        grpc_completion_queue_shutdown(c->async_cq);
        while (grpc_completion_queue_next(c->async_cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
               GRPC_QUEUE_SHUTDOWN) {
        }
        grpc_completion_queue_destroy(c->async_cq);
    }
    grpc_completion_queue_shutdown(c->sync_cq);
    while (grpc_completion_queue_pluck(c->sync_cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(c->sync_cq);
    grpc_channel_destroy(c->channel);
    for (size_t i = 0; i < c->n_methods; i++)
        free(c->methods[i].path);
    drey_client__headers_destroy(&c->headers);
    free(c);
    grpc_shutdown();
}

/* --- change feeds --------------------------------------------------------- */

drey_client_stream *drey_client_watch(drey_client *c, const Drey__Cache__V1__WatchRequest *request,
                                      int64_t timeout_ms, drey_client_status *st) {
    return drey_client_stream_start(c, DREY_CLIENT_CACHE("Watch"), &request->base, timeout_ms, st);
}
