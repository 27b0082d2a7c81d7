/*
 * server — grpc core runtime; see include/drey/server.h.
 *
 * Every completion-queue event carries a `tag` whose callback knows what
 * finished. A call is reference-counted: one reference for the pending
 * RECV_CLOSE_ON_SERVER (which also tells us about cancellation), one for each
 * batch in flight, and one that the handler holds until it replies (unary) or
 * that the stream holds until the call is over (streaming). The call is freed
 * when the last one goes, whichever thread drops it.
 */
#include "drey/alloc.h"
#include "drey/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include "drey/clock.h"
#include "drey/log.h"
#include "drey/thread.h"
#include "tls.h"
#include "wire.h"

/* Outstanding grpc_server_request_*_call per method and queue. The core
 * queues calls that arrive while none is outstanding, so this bounds how many
 * calls can be accepted per wake-up, not how many can run. */
#define REQUESTS_PER_METHOD 2
#define CALL_ARENA_INLINE 4096
/* Deepest nesting of sub-messages accepted in a request (JSON values). */
#define MAX_MESSAGE_DEPTH 64

typedef struct tag {
    void (*done)(struct tag *t, bool ok);
} tag;

typedef struct method_rt {
    drey_server_method spec; /* its path is ours */
    size_t index;
    void *registered; /* grpc core's handle */
    bool recursive;   /* the request type nests without bound */
} method_rt;

typedef struct request_slot {
    tag tag;
    drey_server *server;
    size_t cq;
    method_rt *method;       /* NULL: unregistered (unknown) method */
    grpc_call *call;
    gpr_timespec deadline;
    grpc_metadata_array md;
    grpc_byte_buffer *payload;
    grpc_call_details details; /* unregistered methods only */
} request_slot;

typedef struct out_msg {
    struct out_msg *next;
    grpc_byte_buffer *bb;
} out_msg;

struct drey_call {
    drey_server *server;
    const method_rt *method; /* NULL for an unknown method */
    grpc_call *call;
    size_t cq;
    gpr_timespec deadline;
    grpc_metadata_array md;
    grpc_slice request; /* raw unary payload */
    bool has_request;
    int64_t started_ns; /* monotonic, at arrival */
    char conn[32];
    void *user;
    bool replied;                    /* unary: reply or fail issued (under mu) */
    void (*cancel_hook)(void *arg);  /* unary: runs on cancellation before replying */
    void *cancel_arg;
    _Atomic int refs;

    tag close_tag;
    int cancelled;       /* written by RECV_CLOSE_ON_SERVER */
    _Atomic bool closed; /* RECV_CLOSE_ON_SERVER completed */

    tag recv_tag;
    grpc_byte_buffer *recv_buf;

    tag send_tag;
    pthread_mutex_t mu; /* the send queue and the stream's end */
    out_msg *q_head, *q_tail;
    bool sending;        /* a SEND_MESSAGE batch is in flight */
    bool finish_wanted;  /* drey_call_finish() was called */
    bool status_sent;    /* the SEND_STATUS batch has started */
    bool md_sent;        /* initial metadata went out with a message */
    bool read_paused;    /* drey_call_pause_reading(): read no more for now */
    bool read_parked;    /* paused with no RECV_MESSAGE in flight */
    drey_status *finish_status;

    /* Storage the status batch points into until it completes. */
    grpc_byte_buffer *reply_bb;
    grpc_metadata trailer;
    grpc_slice status_msg;
    bool has_trailer;

    drey_arena arena;
    char arena_buf[CALL_ARENA_INLINE];
};

struct drey_server {
    grpc_server *grpc;
    grpc_completion_queue **cqs;
    pthread_t *threads;
    size_t n_cqs;
    bool started;
    method_rt **methods;
    size_t n_methods;
    drey_call_observer_fn observer;
    void *observer_ctx;
    drey_server_options opts;
    char *listen;
    grpc_server_credentials *creds;
    drey_server__tls *tls;

    tag shutdown_tag;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool shutdown_done;
    size_t live_calls; /* under mu: calls not yet freed */
    _Atomic bool shutting_down;
};

static void call_unref(drey_call *c);
static void request_call(drey_server *s, request_slot *slot);

/* --- helpers -------------------------------------------------------------- */

static grpc_byte_buffer *pack_message(const ProtobufCMessage *m) {
    size_t n = protobuf_c_message_get_packed_size(m);
    grpc_slice slice = grpc_slice_malloc(n);
    protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(slice));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice);
    return bb;
}

/* Flattens a received byte buffer into one slice (a no-copy ref when the
 * message arrived in a single slice, which is the common case). */
static grpc_slice flatten(grpc_byte_buffer *bb) {
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, bb))
        return grpc_empty_slice();
    grpc_slice s = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    return s;
}

static ProtobufCMessage *decode(drey_arena *arena, const method_rt *m, grpc_slice s) {
    const ProtobufCMessageDescriptor *d = m->spec.input;
    if (m->recursive && !drey_server__depth_ok(d, GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s), MAX_MESSAGE_DEPTH))
        return NULL;
    return protobuf_c_message_unpack(d, drey_arena_protobuf_allocator(arena), GRPC_SLICE_LENGTH(s),
                                     GRPC_SLICE_START_PTR(s));
}

/* --- calls ---------------------------------------------------------------- */

static bool is_streaming_method(const method_rt *m) {
    return m->spec.client_streaming || m->spec.server_streaming;
}

static bool is_streaming(const drey_call *c) {
    return c->method != NULL && is_streaming_method(c->method);
}

static void on_close(tag *t, bool ok);
static void on_send(tag *t, bool ok);
static void on_recv(tag *t, bool ok);

static drey_call *call_new(drey_server *s, request_slot *slot) {
    pthread_mutex_lock(&s->mu);
    s->live_calls++;
    pthread_mutex_unlock(&s->mu);
    drey_call *c = drey_xmalloc(sizeof *c);
    memset(c, 0, offsetof(drey_call, arena_buf));
    c->server = s;
    c->method = slot->method;
    c->call = slot->call;
    c->cq = slot->cq;
    c->started_ns = drey_mono_ns();
    c->deadline = slot->method != NULL ? slot->deadline : slot->details.deadline;
    c->md = slot->md; /* moved: the slot re-initializes its own */
    c->close_tag.done = on_close;
    c->recv_tag.done = on_recv;
    c->send_tag.done = on_send;
    pthread_mutex_init(&c->mu, NULL);
    drey_arena_init(&c->arena, c->arena_buf, sizeof c->arena_buf);
    if (slot->payload != NULL) {
        c->request = flatten(slot->payload);
        c->has_request = true;
        grpc_byte_buffer_destroy(slot->payload);
        slot->payload = NULL;
    }
    return c;
}

static void call_free(drey_call *c) {
    for (out_msg *m = c->q_head; m != NULL;) {
        out_msg *next = m->next;
        grpc_byte_buffer_destroy(m->bb);
        free(m);
        m = next;
    }
    if (c->reply_bb != NULL)
        grpc_byte_buffer_destroy(c->reply_bb);
    free(c->finish_status);
    if (c->has_trailer)
        grpc_slice_unref(c->trailer.value);
    grpc_slice_unref(c->status_msg); /* a zeroed slice is inline: a no-op */
    if (c->has_request)
        grpc_slice_unref(c->request);
    if (c->recv_buf != NULL)
        grpc_byte_buffer_destroy(c->recv_buf);
    grpc_metadata_array_destroy(&c->md);
    grpc_call_unref(c->call);
    pthread_mutex_destroy(&c->mu);
    drey_arena_destroy(&c->arena);
    drey_server *s = c->server;
    free(c);
    pthread_mutex_lock(&s->mu);
    if (--s->live_calls == 0)
        pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mu);
}

static void call_ref(drey_call *c) {
    atomic_fetch_add_explicit(&c->refs, 1, memory_order_relaxed);
}

static void call_unref(drey_call *c) {
    if (atomic_fetch_sub_explicit(&c->refs, 1, memory_order_acq_rel) == 1)
        call_free(c);
}

static void start_batch(drey_call *c, const grpc_op *ops, size_t n, tag *t) {
    call_ref(c);
    grpc_call_error err = grpc_call_start_batch(c->call, ops, n, t, NULL);
    if (err != GRPC_CALL_OK) {
        /* Only a programming error gets here (two batches of one kind). */
        DREY_LOG_ERROR("grpc_call_start_batch failed", DREY_LOG_STR("error", grpc_call_error_to_string(err)));
        abort();
    }
}

/* Fills the status ops of a batch from st (NULL = OK). */
static size_t status_ops(drey_call *c, const drey_status *st, grpc_op *ops) {
    drey_server *s = c->server;
    if (s->observer != NULL && c->method != NULL)
        s->observer(s->observer_ctx, c->method->index,
                    st == NULL || drey_status_ok(st) ? GRPC_STATUS_OK : (int)drey_status_code(st),
                    drey_mono_ns() - c->started_ns);
    grpc_op *op = ops;
    memset(op, 0, sizeof *op);
    op->op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    if (st == NULL || drey_status_ok(st)) {
        op->data.send_status_from_server.status = GRPC_STATUS_OK;
        return 1;
    }
    /* A scratch arena: the call's own may be in use on another thread. */
    char scratch[2048];
    drey_arena a;
    drey_arena_init(&a, scratch, sizeof scratch);
    uint8_t *details;
    size_t len;
    drey_status_encode(st, &a, &details, &len);
    c->trailer.key = grpc_slice_from_static_string("grpc-status-details-bin");
    c->trailer.value = grpc_slice_from_copied_buffer((const char *)details, len);
    drey_arena_destroy(&a);
    c->has_trailer = true;
    c->status_msg = grpc_slice_from_static_string(drey_status_message(st));
    op->data.send_status_from_server.status = drey_status_code(st);
    op->data.send_status_from_server.status_details = &c->status_msg;
    op->data.send_status_from_server.trailing_metadata_count = 1;
    op->data.send_status_from_server.trailing_metadata = &c->trailer;
    return 1;
}

/* Unary replies: initial metadata, the message (if any) and the status in
 * one batch. The batch inherits the handler's reference. */
static void unary_finish(drey_call *c, const ProtobufCMessage *response, const drey_status *st) {
    pthread_mutex_lock(&c->mu);
    c->replied = true;
    c->cancel_hook = NULL;
    pthread_mutex_unlock(&c->mu);
    grpc_op ops[3];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (response != NULL) {
        c->reply_bb = pack_message(response);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = c->reply_bb;
    }
    n += status_ops(c, st, &ops[n]);
    c->status_sent = true;
    start_batch(c, ops, n, &c->send_tag);
    call_unref(c); /* the handler's reference */
}

void drey_call_reply(drey_call *c, const ProtobufCMessage *response) {
    unary_finish(c, response, NULL);
}

void drey_call_relay(drey_call *c, const drey_call_answer *a) {
    pthread_mutex_lock(&c->mu);
    c->replied = true;
    c->cancel_hook = NULL;
    pthread_mutex_unlock(&c->mu);
    drey_server *s = c->server;
    if (s->observer != NULL && c->method != NULL)
        s->observer(s->observer_ctx, c->method->index, a->code, drey_mono_ns() - c->started_ns);
    grpc_op ops[3];
    size_t n = 0;
    memset(ops, 0, sizeof ops);
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (a->code == GRPC_STATUS_OK) {
        grpc_slice slice = grpc_slice_from_copied_buffer((const char *)a->response, a->response_len);
        c->reply_bb = grpc_raw_byte_buffer_create(&slice, 1);
        grpc_slice_unref(slice);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = c->reply_bb;
    }
    grpc_op *op = &ops[n++];
    op->op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    op->data.send_status_from_server.status = (grpc_status_code)a->code;
    if (a->code != GRPC_STATUS_OK) {
        c->status_msg = grpc_slice_from_copied_buffer(a->message != NULL ? a->message : "", a->message_len);
        op->data.send_status_from_server.status_details = &c->status_msg;
        if (a->details != NULL) {
            c->trailer.key = grpc_slice_from_static_string("grpc-status-details-bin");
            c->trailer.value = grpc_slice_from_copied_buffer((const char *)a->details, a->details_len);
            c->has_trailer = true;
            op->data.send_status_from_server.trailing_metadata_count = 1;
            op->data.send_status_from_server.trailing_metadata = &c->trailer;
        }
    }
    c->status_sent = true;
    start_batch(c, ops, n, &c->send_tag);
    call_unref(c); /* the handler's reference */
}

void drey_call_fail(drey_call *c, const drey_status *st) {
    unary_finish(c, NULL, st);
}

#define MAX_CONCATENATED 256

/* first and the messages queued after it (up to MAX_CONCATENATED) as one
 * buffer of their slices; no copy, as each queued message is one slice.
 * Called with c->mu. */
static grpc_byte_buffer *concatenate_locked(drey_call *c, grpc_byte_buffer *first) {
    grpc_slice slices[MAX_CONCATENATED];
    size_t n = 0;
    grpc_byte_buffer *bb = first;
    for (;;) {
        slices[n++] = flatten(bb);
        grpc_byte_buffer_destroy(bb);
        out_msg *m = c->q_head;
        if (m == NULL || n == MAX_CONCATENATED)
            break;
        c->q_head = m->next;
        if (c->q_head == NULL)
            c->q_tail = NULL;
        bb = m->bb;
        free(m);
    }
    grpc_byte_buffer *out = grpc_raw_byte_buffer_create(slices, n);
    for (size_t i = 0; i < n; i++)
        grpc_slice_unref(slices[i]);
    return out;
}

/* Streaming: starts the next send if none is in flight. Called with c->mu. */
static void pump_locked(drey_call *c) {
    if (c->sending || c->status_sent)
        return;
    if (c->q_head != NULL) {
        out_msg *m = c->q_head;
        c->q_head = m->next;
        if (c->q_head == NULL)
            c->q_tail = NULL;
        grpc_op ops[2];
        size_t n = 0;
        memset(ops, 0, sizeof ops);
        if (!c->md_sent) {
            /* First message of the stream: initial metadata goes with it. */
            ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
            c->md_sent = true;
        }
        if (c->reply_bb != NULL)
            grpc_byte_buffer_destroy(c->reply_bb);
        c->reply_bb = m->bb;
        free(m);
        if (c->method->spec.concatenate_sends && c->q_head != NULL)
            c->reply_bb = concatenate_locked(c, c->reply_bb);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = c->reply_bb;
        c->sending = true;
        start_batch(c, ops, n, &c->send_tag);
        return;
    }
    if (c->finish_wanted) {
        grpc_op ops[2];
        size_t n = 0;
        memset(ops, 0, sizeof ops);
        if (!c->md_sent)
            ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
        n += status_ops(c, c->finish_status, &ops[n]);
        c->status_sent = true;
        c->sending = true;
        start_batch(c, ops, n, &c->send_tag);
    }
}

bool drey_call_send(drey_call *c, const ProtobufCMessage *message) {
    pthread_mutex_lock(&c->mu);
    bool open = !atomic_load(&c->closed) && !c->finish_wanted;
    if (open) {
        out_msg *m = drey_xmalloc(sizeof *m);
        m->next = NULL;
        m->bb = pack_message(message);
        if (c->q_tail != NULL)
            c->q_tail->next = m;
        else
            c->q_head = m;
        c->q_tail = m;
        pump_locked(c);
    }
    pthread_mutex_unlock(&c->mu);
    return open;
}

bool drey_call_send_bytes(drey_call *c, const uint8_t *data, size_t len) {
    pthread_mutex_lock(&c->mu);
    bool open = !atomic_load(&c->closed) && !c->finish_wanted;
    if (open) {
        out_msg *m = drey_xmalloc(sizeof *m);
        m->next = NULL;
        grpc_slice slice = grpc_slice_from_copied_buffer((const char *)data, len);
        m->bb = grpc_raw_byte_buffer_create(&slice, 1);
        grpc_slice_unref(slice);
        if (c->q_tail != NULL)
            c->q_tail->next = m;
        else
            c->q_head = m;
        c->q_tail = m;
        pump_locked(c);
    }
    pthread_mutex_unlock(&c->mu);
    return open;
}

void drey_call_finish(drey_call *c, const drey_status *st) {
    pthread_mutex_lock(&c->mu);
    if (!c->finish_wanted) {
        c->finish_wanted = true;
        if (st != NULL && !drey_status_ok(st)) {
            c->finish_status = drey_xmalloc(sizeof *st);
            memcpy(c->finish_status, st, sizeof *st);
        }
        pump_locked(c);
    }
    pthread_mutex_unlock(&c->mu);
}

static void on_send(tag *t, bool ok) {
    drey_call *c = (drey_call *)((char *)t - offsetof(drey_call, send_tag));
    (void)ok; /* a failed send means the call is gone; RECV_CLOSE tells us */
    if (is_streaming(c)) {
        pthread_mutex_lock(&c->mu);
        c->sending = false;
        if (ok)
            pump_locked(c);
        bool drained = ok && !c->sending && !c->finish_wanted && !atomic_load(&c->closed);
        pthread_mutex_unlock(&c->mu);
        /* Outside the lock: the handler sends its next messages from here. */
        if (drained && c->method->spec.on_sent != NULL)
            c->method->spec.on_sent(c->method->spec.ctx, c);
    }
    call_unref(c);
}

static void on_close(tag *t, bool ok) {
    drey_call *c = (drey_call *)((char *)t - offsetof(drey_call, close_tag));
    (void)ok;
    atomic_store(&c->closed, true);
    if (c->cancelled && !is_streaming(c)) {
        pthread_mutex_lock(&c->mu);
        void (*hook)(void *) = c->replied ? NULL : c->cancel_hook;
        c->cancel_hook = NULL;
        pthread_mutex_unlock(&c->mu);
        if (hook != NULL)
            hook(c->cancel_arg);
    }
    if (is_streaming(c)) {
        if (c->method->spec.on_done != NULL)
            c->method->spec.on_done(c->method->spec.ctx, c);
        call_unref(c); /* the stream's reference */
    }
    call_unref(c); /* RECV_CLOSE's reference */
}

static void start_recv(drey_call *c) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &c->recv_buf;
    start_batch(c, &op, 1, &c->recv_tag);
}

static void on_recv(tag *t, bool ok) {
    drey_call *c = (drey_call *)((char *)t - offsetof(drey_call, recv_tag));
    const drey_server_method *m = &c->method->spec;
    if (!ok || atomic_load(&c->closed)) {
        call_unref(c);
        return;
    }
    if (c->recv_buf == NULL) {
        /* Half-close. A server-streaming method has its one request already. */
        if (m->client_streaming)
            m->on_message(m->ctx, c, NULL);
        call_unref(c);
        return;
    }
    grpc_slice s = flatten(c->recv_buf);
    grpc_byte_buffer_destroy(c->recv_buf);
    c->recv_buf = NULL;
    /* Each message decodes into the call's arena, reset afterwards: a long
     * stream must not grow it. Handlers copy what they keep. */
    ProtobufCMessage *msg = decode(&c->arena, c->method, s);
    grpc_slice_unref(s);
    if (msg == NULL) {
        drey_status st;
        drey_status_init(&st);
        drey_status_set(&st, DREY_ERR_MALFORMED_REQUEST);
        drey_call_finish(c, &st);
        call_unref(c);
        return;
    }
    m->on_message(m->ctx, c, msg);
    drey_arena_reset(&c->arena);
    pthread_mutex_lock(&c->mu);
    bool more = m->client_streaming && !c->finish_wanted;
    if (more && c->read_paused) {
        c->read_parked = true; /* drey_call_resume_reading() starts it */
        more = false;
    }
    pthread_mutex_unlock(&c->mu);
    if (more)
        start_recv(c);
    call_unref(c);
}

void drey_call_pause_reading(drey_call *c) {
    pthread_mutex_lock(&c->mu);
    c->read_paused = true;
    pthread_mutex_unlock(&c->mu);
}

void drey_call_resume_reading(drey_call *c) {
    pthread_mutex_lock(&c->mu);
    c->read_paused = false;
    bool start = c->read_parked && !c->finish_wanted && !atomic_load(&c->closed);
    c->read_parked = false;
    pthread_mutex_unlock(&c->mu);
    if (start)
        start_recv(c);
}

static void fail_new(drey_call *c, drey_error e) {
    drey_status st;
    drey_status_init(&st);
    drey_status_set(&st, e);
    if (is_streaming(c))
        drey_call_finish(c, &st);
    else
        drey_call_fail(c, &st);
}

static bool deadline_passed(const drey_call *c) {
    return gpr_time_cmp(c->deadline, gpr_now(c->deadline.clock_type)) <= 0;
}

static void on_new_call(tag *t, bool ok) {
    request_slot *slot = (request_slot *)t;
    drey_server *s = slot->server;
    if (!ok) {
        /* The server is shutting down: the request will not be renewed. */
        grpc_metadata_array_destroy(&slot->md);
        if (slot->method == NULL)
            grpc_call_details_destroy(&slot->details);
        free(slot);
        return;
    }
    drey_call *c = call_new(s, slot);
    if (slot->method == NULL)
        grpc_call_details_destroy(&slot->details);
    request_call(s, slot);

    /* References: RECV_CLOSE's (taken by start_batch below) and the
     * handler's or the stream's. */
    atomic_store(&c->refs, 1);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &c->cancelled;
    start_batch(c, &op, 1, &c->close_tag);

    if (c->method == NULL) {
        fail_new(c, DREY_ERR_UNKNOWN_METHOD);
        return;
    }
    if (deadline_passed(c)) {
        fail_new(c, DREY_ERR_DEADLINE_EXCEEDED);
        return;
    }
    if (is_streaming(c)) {
        start_recv(c);
        return;
    }
    ProtobufCMessage *req = c->has_request ? decode(&c->arena, c->method, c->request) : NULL;
    if (req == NULL) {
        fail_new(c, DREY_ERR_MALFORMED_REQUEST);
        return;
    }
    c->method->spec.unary(c->method->spec.ctx, c, req);
}

static void request_call(drey_server *s, request_slot *slot) {
    if (atomic_load(&s->shutting_down)) {
        free(slot); /* its metadata array was moved to the last call */
        return;
    }
    grpc_metadata_array_init(&slot->md);
    slot->payload = NULL;
    slot->call = NULL;
    grpc_call_error err;
    if (slot->method != NULL) {
        err = grpc_server_request_registered_call(s->grpc, slot->method->registered, &slot->call, &slot->deadline,
                                                  &slot->md, is_streaming_method(slot->method) ? NULL : &slot->payload,
                                                  s->cqs[slot->cq], s->cqs[slot->cq], &slot->tag);
    } else {
        grpc_call_details_init(&slot->details);
        err = grpc_server_request_call(s->grpc, &slot->call, &slot->details, &slot->md, s->cqs[slot->cq],
                                       s->cqs[slot->cq], &slot->tag);
    }
    if (err != GRPC_CALL_OK) {
        DREY_LOG_ERROR("requesting a call failed", DREY_LOG_STR("error", grpc_call_error_to_string(err)));
        abort();
    }
}

static void new_slot(drey_server *s, size_t cq, method_rt *m) {
    request_slot *slot = drey_xmalloc(sizeof *slot);
    memset(slot, 0, sizeof *slot);
    slot->tag.done = on_new_call;
    slot->server = s;
    slot->cq = cq;
    slot->method = m;
    request_call(s, slot);
}

/* --- call accessors ------------------------------------------------------- */

drey_arena *drey_call_arena(drey_call *c) {
    return &c->arena;
}

void drey_call_request_bytes(const drey_call *c, const uint8_t **data, size_t *len) {
    *data = c->has_request ? GRPC_SLICE_START_PTR(c->request) : NULL;
    *len = c->has_request ? GRPC_SLICE_LENGTH(c->request) : 0;
}

const char *drey_call_metadata(const drey_call *c, const char *key, size_t *len) {
    size_t klen = strlen(key);
    for (size_t i = 0; i < c->md.count; i++) {
        const grpc_metadata *m = &c->md.metadata[i];
        if (GRPC_SLICE_LENGTH(m->key) == klen && memcmp(GRPC_SLICE_START_PTR(m->key), key, klen) == 0) {
            *len = GRPC_SLICE_LENGTH(m->value);
            return (const char *)GRPC_SLICE_START_PTR(m->value);
        }
    }
    return NULL;
}


/* Connection numbers live on the connection's auth context, which grpc core
 * shares between all calls of one connection (drey installs no auth metadata
 * processor, which would give each call its own). Properties are read and
 * added under a lock striped by context, since adding may reallocate the
 * property array another thread is reading. */
#define CONN_STRIPES 64
static pthread_mutex_t conn_stripes[CONN_STRIPES] = {[0 ... CONN_STRIPES - 1] = PTHREAD_MUTEX_INITIALIZER};
static _Atomic uint64_t next_conn = 1;

const char *drey_call_connection(drey_call *c) {
    if (c->conn[0] != '\0')
        return c->conn;
    grpc_auth_context *ac = grpc_call_auth_context(c->call);
    if (ac == NULL) {
        snprintf(c->conn, sizeof c->conn, "conn:0");
        return c->conn;
    }
    pthread_mutex_t *mu = &conn_stripes[((uintptr_t)ac >> 4) % CONN_STRIPES];
    pthread_mutex_lock(mu);
    grpc_auth_property_iterator it = grpc_auth_context_find_properties_by_name(ac, "drey.connection");
    const grpc_auth_property *p = grpc_auth_property_iterator_next(&it);
    if (p != NULL) {
        snprintf(c->conn, sizeof c->conn, "conn:%.*s", (int)p->value_length, p->value);
    } else {
        char n[24];
        snprintf(n, sizeof n, "%llu", (unsigned long long)atomic_fetch_add(&next_conn, 1));
        grpc_auth_context_add_cstring_property(ac, "drey.connection", n);
        snprintf(c->conn, sizeof c->conn, "conn:%s", n);
    }
    pthread_mutex_unlock(mu);
    grpc_auth_context_release(ac);
    return c->conn;
}

void drey_call_on_cancel(drey_call *c, void (*fn)(void *arg), void *arg) {
    pthread_mutex_lock(&c->mu);
    bool already = atomic_load(&c->closed) && c->cancelled && !c->replied;
    if (!already) {
        c->cancel_hook = fn;
        c->cancel_arg = arg;
    }
    pthread_mutex_unlock(&c->mu);
    if (already)
        fn(arg); /* cancelled before the hook was set */
}

static bool property_is(grpc_auth_context *ac, const char *name, const char *id, size_t len) {
    grpc_auth_property_iterator it = grpc_auth_context_find_properties_by_name(ac, name);
    for (const grpc_auth_property *p; (p = grpc_auth_property_iterator_next(&it)) != NULL;) {
        if (p->value_length == len && memcmp(p->value, id, len) == 0)
            return true;
    }
    return false;
}

bool drey_call_peer_is(drey_call *c, const char *id, size_t len) {
    grpc_auth_context *ac = grpc_call_auth_context(c->call);
    if (ac == NULL)
        return false;
    /* Properties are read under the connection's stripe: drey_call_connection
     * may be adding one to the same context. */
    pthread_mutex_t *mu = &conn_stripes[((uintptr_t)ac >> 4) % CONN_STRIPES];
    pthread_mutex_lock(mu);
    bool ok = grpc_auth_context_peer_is_authenticated(ac) &&
              (property_is(ac, GRPC_X509_SAN_PROPERTY_NAME, id, len) ||
               property_is(ac, GRPC_X509_CN_PROPERTY_NAME, id, len));
    pthread_mutex_unlock(mu);
    grpc_auth_context_release(ac);
    return ok;
}

int64_t drey_call_deadline_mono_ns(const drey_call *c) {
    if (gpr_time_cmp(c->deadline, gpr_inf_future(c->deadline.clock_type)) == 0)
        return INT64_MAX;
    gpr_timespec mono = gpr_convert_clock_type(c->deadline, GPR_CLOCK_MONOTONIC);
    /* gpr's monotonic clock and CLOCK_MONOTONIC share an origin on Linux
     * only up to an offset, so measure what is left and add it to ours. */
    gpr_timespec left = gpr_time_sub(mono, gpr_now(GPR_CLOCK_MONOTONIC));
    return drey_mono_ns() + (int64_t)left.tv_sec * 1000000000 + left.tv_nsec;
}


void drey_call_set_user(drey_call *c, void *user) {
    c->user = user;
}

void *drey_call_user(const drey_call *c) {
    return c->user;
}

/* --- server --------------------------------------------------------------- */

static void on_shutdown(tag *t, bool ok) {
    (void)ok;
    drey_server *s = (drey_server *)((char *)t - offsetof(drey_server, shutdown_tag));
    pthread_mutex_lock(&s->mu);
    s->shutdown_done = true;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mu);
}

static void *worker_main(void *arg) {
    grpc_completion_queue *cq = arg;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type == GRPC_OP_COMPLETE) {
            tag *t = ev.tag;
            t->done(t, ev.success != 0);
        }
    }
    return NULL;
}

drey_server *drey_server_create(const drey_server_options *opts) {
    grpc_init();
    drey_server *s = drey_xmalloc(sizeof *s);
    memset(s, 0, sizeof *s);
    s->opts = *opts;
    s->listen = drey_xstrdup(opts->listen);
    s->opts.listen = s->listen;
    s->opts.tls_cert = opts->tls_cert != NULL ? drey_xstrdup(opts->tls_cert) : NULL;
    s->opts.tls_key = opts->tls_key != NULL ? drey_xstrdup(opts->tls_key) : NULL;
    s->opts.tls_client_ca = opts->tls_client_ca != NULL ? drey_xstrdup(opts->tls_client_ca) : NULL;
    s->n_cqs = opts->workers > 0 ? opts->workers : 1;
    s->shutdown_tag.done = on_shutdown;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cond, NULL);

    grpc_arg args[2];
    memset(args, 0, sizeof args);
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = (int)opts->max_recv_message_bytes;
    /* gRPC sets SO_REUSEPORT by default, which lets a second server bind a
     * taken port silently. */
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_ALLOW_REUSEPORT;
    args[1].value.integer = 0;
    grpc_channel_args cargs = {.num_args = 2, .args = args};
    s->grpc = grpc_server_create(&cargs, NULL);

    s->cqs = drey_xmalloc(s->n_cqs * sizeof *s->cqs);
    for (size_t i = 0; i < s->n_cqs; i++) {
        s->cqs[i] = grpc_completion_queue_create_for_next(NULL);
        grpc_server_register_completion_queue(s->grpc, s->cqs[i], NULL);
    }
    return s;
}

bool drey_server_add_method(drey_server *s, const drey_server_method *m) {
    bool streaming = m->client_streaming || m->server_streaming;
    if (streaming ? m->on_message == NULL || m->unary != NULL : m->unary == NULL || m->on_message != NULL) {
        DREY_LOG_ERROR("no callbacks of the method's kind", DREY_LOG_STR("path", m->path),
                       DREY_LOG_BOOL("streaming", streaming));
        return false;
    }
    for (size_t i = 0; i < s->n_methods; i++) {
        if (strcmp(s->methods[i]->spec.path, m->path) == 0) {
            DREY_LOG_ERROR("method registered twice", DREY_LOG_STR("path", m->path));
            return false;
        }
    }
    method_rt *rt = drey_xmalloc(sizeof *rt);
    memset(rt, 0, sizeof *rt);
    rt->spec = *m;
    rt->spec.path = drey_xstrdup(m->path);
    rt->index = s->n_methods;
    rt->recursive = drey_server__type_is_recursive(m->input);
    rt->registered = grpc_server_register_method(
        s->grpc, rt->spec.path, NULL, streaming ? GRPC_SRM_PAYLOAD_NONE : GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
    if (rt->registered == NULL) {
        DREY_LOG_ERROR("grpc refused to register a method", DREY_LOG_STR("path", rt->spec.path));
        free((char *)rt->spec.path);
        free(rt);
        return false;
    }
    s->methods = drey_xrealloc(s->methods, s->n_methods + 1, sizeof *s->methods);
    s->methods[s->n_methods++] = rt;
    return true;
}

void drey_server_set_call_observer(drey_server *s, drey_call_observer_fn fn, void *ctx) {
    s->observer = fn;
    s->observer_ctx = ctx;
}

/* grpc core does not say why a bind failed; bind a plain socket to the same
 * address to find out (in use, not permitted, not an address here). */
static void explain_bind_failure(const char *listen, char *buf, size_t cap) {
    char host[256];
    const char *colon = strrchr(listen, ':');
    if (colon == NULL) {
        snprintf(buf, cap, "cannot listen on %s: expected host:port", listen);
        return;
    }
    size_t hlen = (size_t)(colon - listen);
    if (hlen >= sizeof host)
        hlen = sizeof host - 1;
    memcpy(host, listen, hlen);
    host[hlen] = '\0';
    if (hlen >= 2 && host[0] == '[' && host[hlen - 1] == ']') {
        memmove(host, host + 1, hlen - 2);
        host[hlen - 2] = '\0';
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host[0] != '\0' ? host : NULL, colon + 1, &hints, &res);
    if (gai != 0) {
        snprintf(buf, cap, "cannot listen on %s: %s", listen, gai_strerror(gai));
        return;
    }
    int err = 0;
    int fd = socket(res->ai_family, SOCK_STREAM, 0);
    if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0)
        err = errno;
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    if (err == EADDRINUSE)
        snprintf(buf, cap, "cannot listen on %s: the address is already in use (is another server running?)",
                 listen);
    else if (err != 0)
        snprintf(buf, cap, "cannot listen on %s: %s", listen, strerror(err));
    else
        snprintf(buf, cap, "cannot listen on %s", listen);
}

int drey_server_start(drey_server *s, char *err_buf, size_t err_cap) {
    if (s->opts.tls_cert != NULL && s->opts.tls_cert[0] != '\0') {
        s->tls = drey_server__tls_create(s->opts.tls_cert, s->opts.tls_key != NULL ? s->opts.tls_key : "",
                                         s->opts.tls_client_ca, &s->creds, err_buf, err_cap);
        if (s->tls == NULL)
            return 0;
    } else {
        s->creds = grpc_insecure_server_credentials_create();
    }
    int port = grpc_server_add_http2_port(s->grpc, s->listen, s->creds);
    if (port == 0) {
        explain_bind_failure(s->listen, err_buf, err_cap);
        return 0;
    }
    grpc_server_start(s->grpc);
    s->started = true;
    for (size_t q = 0; q < s->n_cqs; q++) {
        for (size_t m = 0; m < s->n_methods; m++) {
            for (int k = 0; k < REQUESTS_PER_METHOD; k++)
                new_slot(s, q, s->methods[m]);
        }
        new_slot(s, q, NULL);
    }
    s->threads = drey_xmalloc(s->n_cqs * sizeof *s->threads);
    for (size_t q = 0; q < s->n_cqs; q++)
        drey_thread_start(&s->threads[q], "server worker", worker_main, s->cqs[q]);
    return port;
}

static bool wait_shutdown(drey_server *s, int64_t timeout_ms) {
    int64_t deadline = drey_deadline_after_ms(timeout_ms);
    pthread_mutex_lock(&s->mu);
    while (!s->shutdown_done) {
        if (timeout_ms < 0)
            pthread_cond_wait(&s->cond, &s->mu);
        else if (drey_cond_wait_until(&s->cond, &s->mu, deadline) == ETIMEDOUT)
            break;
    }
    bool done = s->shutdown_done;
    pthread_mutex_unlock(&s->mu);
    return done;
}

void drey_server_shutdown(drey_server *s, int64_t timeout_ms) {
    if (atomic_exchange(&s->shutting_down, true))
        return;
    if (s->started) {
        grpc_server_shutdown_and_notify(s->grpc, s->cqs[0], &s->shutdown_tag);
        if (!wait_shutdown(s, timeout_ms)) {
            DREY_LOG_WARN("in-flight calls outlived the shutdown timeout; cancelling them",
                          DREY_LOG_INT("timeout_ms", timeout_ms));
            grpc_server_cancel_all_calls(s->grpc);
            wait_shutdown(s, -1);
        }
        /* The server's shutdown tag can come before the last calls are
         * freed (a cancelled stream's handler may still be finishing it):
         * the queues must outlive every batch those calls start. */
        pthread_mutex_lock(&s->mu);
        while (s->live_calls > 0)
            pthread_cond_wait(&s->cond, &s->mu);
        pthread_mutex_unlock(&s->mu);
    }
    for (size_t q = 0; q < s->n_cqs; q++)
        grpc_completion_queue_shutdown(s->cqs[q]);
    if (s->started) {
        for (size_t q = 0; q < s->n_cqs; q++)
            pthread_join(s->threads[q], NULL);
    } else {
        for (size_t q = 0; q < s->n_cqs; q++)
            worker_main(s->cqs[q]); /* drain to GRPC_QUEUE_SHUTDOWN */
    }
}

void drey_server_destroy(drey_server *s) {
    if (s == NULL)
        return;
    drey_server_shutdown(s, 0);
    grpc_server_destroy(s->grpc);
    for (size_t q = 0; q < s->n_cqs; q++)
        grpc_completion_queue_destroy(s->cqs[q]);
    if (s->creds != NULL)
        grpc_server_credentials_release(s->creds);
    drey_server__tls_destroy(s->tls);
    for (size_t m = 0; m < s->n_methods; m++) {
        free((char *)s->methods[m]->spec.path);
        free(s->methods[m]);
    }
    free(s->methods);
    free(s->cqs);
    free(s->threads);
    free(s->listen);
    free((char *)s->opts.tls_cert);
    free((char *)s->opts.tls_key);
    free((char *)s->opts.tls_client_ca);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cond);
    free(s);
    grpc_shutdown();
}

size_t drey_server_method_count(const drey_server *s) {
    return s->n_methods;
}

const char *drey_server_method_path(const drey_server *s, size_t i) {
    return s->methods[i]->spec.path;
}
