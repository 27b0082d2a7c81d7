/*
 * stream — calls whose answers come as a stream, read one message at a
 * time on the client's pluck queue: a server stream from one request
 * (drey_client_stream_start, Watch), and raw streams for `drey call` that
 * send several request messages first (drey_client_stream_start_raw).
 *
 * A stream has three batches in flight at most, each with its own tag: the
 * opening (headers, the requests), a receive, and the status, which gRPC
 * completes only when the call is over.
 */
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/rpc.h"
#include "internal.h"

struct drey_client_stream {
    drey_link link; /* in the client's streams */
    drey_client *client;
    drey_client__io io;
    bool ended;       /* a read saw the end of the stream */
    bool undecodable; /* a message did not decode: the stream was cancelled */
    const char *undecodable_type;
    /* Their addresses are the tags of the stream's three batches. */
    char send_tag, recv_tag, status_tag;
};

static void stream_release(drey_client_stream *s) {
    drey_client__io_release(&s->io);
    free(s);
}

static void pluck(drey_client *c, void *tag) {
    grpc_event ev = grpc_completion_queue_pluck(c->sync_cq, tag, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type != GRPC_OP_COMPLETE)
        abort();
}

static drey_client_stream *stream_new(drey_client *c, grpc_byte_buffer *send, const char *method,
                                      int64_t timeout_ms) {
    drey_client_stream *s = drey_xcalloc(1, sizeof *s);
    s->client = c;
    s->io.send = send;
    drey_client__io_open(&s->io, c, c->sync_cq, method, timeout_ms);
    return s;
}

/* The opening batch (err) went out, or not: starts the status batch and
 * registers s, or releases s and says why in st (NULL then). */
static drey_client_stream *stream_opened(drey_client_stream *s, grpc_call_error err, drey_client_status *st) {
    if (err == GRPC_CALL_OK) {
        grpc_op op;
        drey_client__status_op(&op, &s->io.code, &s->io.details, &s->io.trailing_md);
        err = grpc_call_start_batch(s->io.call, &op, 1, &s->status_tag, NULL);
        if (err != GRPC_CALL_OK) {
            grpc_call_cancel(s->io.call, NULL);
            pluck(s->client, &s->send_tag);
        }
    }
    if (err != GRPC_CALL_OK) {
        drey_client_status_set(st, GRPC_STATUS_INTERNAL, grpc_call_error_to_string(err));
        stream_release(s);
        return NULL;
    }
    drey_list_push(&s->client->streams, &s->link);
    return s;
}

drey_client_stream *drey_client_stream_start(drey_client *c, const char *method, const ProtobufCMessage *request,
                                             int64_t timeout_ms, drey_client_status *st) {
    drey_client_stream *s = stream_new(c, drey_rpc_pack(request), method, timeout_ms);
    grpc_op ops[4];
    size_t n = drey_client__open_ops(ops, c, s->io.send, &s->io.initial_md);
    return stream_opened(s, grpc_call_start_batch(s->io.call, ops, n, &s->send_tag, NULL), st);
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
    drey_client_stream *s = stream_new(c, NULL, method, timeout_ms);
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
        grpc_byte_buffer *bb = drey_rpc_copy(requests[i].data, requests[i].len);
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
    return stream_opened(s, grpc_call_start_batch(s->io.call, ops, n, &s->send_tag, NULL), st);
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
    *message = drey_client__decode(s->io.recv, type, arena);
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
    drey_client__copy_buffer(s->io.recv, arena, message);
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
        drey_client__fill_status(st, s->io.code, s->io.details, &s->io.trailing_md, arena);
    drey_list_remove(&c->streams, &s->link);
    stream_release(s);
    return st->code;
}

void drey_client__finish_streams(drey_client *c) {
    if (drey_list_empty(&c->streams))
        return;
    drey_arena scratch;
    drey_arena_init(&scratch, NULL, 0);
    while (!drey_list_empty(&c->streams)) {
        drey_client_stream *s = DREY_LIST_ITEM(c->streams.head, drey_client_stream, link);
        drey_client_status st;
        drey_client_stream_cancel(s);
        drey_client_stream_finish(s, &scratch, &st);
    }
    drey_arena_destroy(&scratch);
}

void drey_client__stop_reader(pthread_t t, pthread_mutex_t *mu, pthread_cond_t *cond, bool *stopping,
                              drey_client_stream *const *stream) {
    pthread_mutex_lock(mu);
    *stopping = true;
    if (*stream != NULL)
        drey_client_stream_cancel(*stream);
    pthread_cond_broadcast(cond);
    pthread_mutex_unlock(mu);
    pthread_join(t, NULL);
}

drey_client_stream *drey_client_watch(drey_client *c, const Drey__Cache__V1__WatchRequest *request,
                                      int64_t timeout_ms, drey_client_status *st) {
    return drey_client_stream_start(c, DREY_CLIENT_CACHE("Watch"), &request->base, timeout_ms, st);
}
