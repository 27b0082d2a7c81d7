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

/* --- the client ----------------------------------------------------------- */

drey_client *drey_client_open(const drey_client_options *opts, char *err, size_t err_cap) {
    return drey_client__open_on(opts, NULL, err, err_cap);
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
    grpc_arg args[3];
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
    grpc_channel_args cargs = {.num_args = n, .args = args};
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
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
