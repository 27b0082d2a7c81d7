/*
 * call — one call on the server, from its arrival to its last reference:
 * the batches it starts, a unary reply (a message, a failure with its
 * google.rpc.Status, or a peer's answer relayed as it came), a stream's
 * messages queued and sent one batch at a time (concatenated where the
 * method allows), reads that a stream can pause, and cancellation. The
 * reference rules are in internal.h.
 */
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/support/time.h>

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/log.h"
#include "drey/rpc.h"
#include "internal.h"
#include "wire.h"

/* Deepest nesting of sub-messages accepted in a request (JSON values). */
#define MAX_MESSAGE_DEPTH 64

/* A stream message not yet sent, in the call's out. */
typedef struct out_msg {
    drey_link link;
    grpc_byte_buffer *bb;
} out_msg;

static void call_unref(drey_call *c);

static ProtobufCMessage *decode(drey_arena *arena, const drey_server__method *m, grpc_slice s) {
    const ProtobufCMessageDescriptor *d = m->spec.input;
    if (m->recursive && !drey_server__depth_ok(d, GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s), MAX_MESSAGE_DEPTH))
        return NULL;
    return protobuf_c_message_unpack(d, drey_arena_protobuf_allocator(arena), GRPC_SLICE_LENGTH(s),
                                     GRPC_SLICE_START_PTR(s));
}

/* --- calls ---------------------------------------------------------------- */

static bool is_streaming(const drey_call *c) {
    return c->method != NULL && drey_server__streaming(c->method);
}

static void on_close(drey_server__tag *t, bool ok);
static void on_send(drey_server__tag *t, bool ok);
static void on_recv(drey_server__tag *t, bool ok);

drey_call *drey_server__call_new(drey_server *s, drey_server__slot *slot) {
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
        c->request = drey_rpc_flatten(slot->payload);
        c->has_request = true;
        grpc_byte_buffer_destroy(slot->payload);
        slot->payload = NULL;
    }
    return c;
}

static void call_free(drey_call *c) {
    for (drey_link *l; (l = drey_list_pop(&c->out)) != NULL;) {
        out_msg *m = DREY_LIST_ITEM(l, out_msg, link);
        grpc_byte_buffer_destroy(m->bb);
        free(m);
    }
    if (c->reply_bb != NULL)
        grpc_byte_buffer_destroy(c->reply_bb);
    free(c->finish_status);
    free(c->finish_answer);
    for (size_t i = 0; i < c->n_trailers; i++)
        grpc_slice_unref(c->trailers[i].value);
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

static void start_batch(drey_call *c, const grpc_op *ops, size_t n, drey_server__tag *t) {
    call_ref(c);
    grpc_call_error err = grpc_call_start_batch(c->call, ops, n, t, NULL);
    if (err != GRPC_CALL_OK) {
        /* Only a programming error gets here (two batches of one kind). */
        DREY_LOG_ERROR("grpc_call_start_batch failed", DREY_LOG_STR("error", grpc_call_error_to_string(err)));
        abort();
    }
}

/* Whether a refusal's RetryInfo asks for a longer wait than the call has
 * left: a retry then waits out the deadline and ends DEADLINE_EXCEEDED,
 * which hides the refusal (and, for a write refused before the journal,
 * reads as "commit unknown"). */
static bool retry_outlives_deadline(const drey_call *c, int64_t retry_delay_ms) {
    if (retry_delay_ms < 0)
        return false;
    int64_t deadline = drey_call_deadline_mono_ns(c);
    return deadline != INT64_MAX && (deadline - drey_mono_ns()) / 1000000 < retry_delay_ms;
}

/* The trailers of a failed call: its google.rpc.Status details, and
 * grpc-retry-pushback-ms: -1 when its RetryInfo delay outlives the deadline.
 * gRPC clients with a retry policy honour that trailer: a negative value
 * stops their retries, so the caller gets the refusal with its details at
 * once. drey never sends a positive pushback: gRPC waits exactly that long
 * and restarts its backoff from the beginning, so the same short delay on
 * every attempt would replace the growing backoff RetryInfo asks for (at
 * least the delay, then longer), and the few attempts gRPC allows would
 * span less than a failover (docs/clients.md). */
static void set_trailers(drey_call *c, grpc_op *op, const uint8_t *details, size_t len, int64_t retry_delay_ms) {
    c->n_trailers = 0;
    if (details != NULL) {
        c->trailers[c->n_trailers].key = grpc_slice_from_static_string("grpc-status-details-bin");
        c->trailers[c->n_trailers++].value = grpc_slice_from_copied_buffer((const char *)details, len);
    }
    if (retry_outlives_deadline(c, retry_delay_ms)) {
        c->trailers[c->n_trailers].key = grpc_slice_from_static_string("grpc-retry-pushback-ms");
        c->trailers[c->n_trailers++].value = grpc_slice_from_static_string("-1");
    }
    op->data.send_status_from_server.trailing_metadata_count = c->n_trailers;
    op->data.send_status_from_server.trailing_metadata = c->trailers;
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
    set_trailers(c, op, details, len, st->retry_delay_ms);
    drey_arena_destroy(&a);
    c->status_msg = grpc_slice_from_static_string(drey_status_message(st));
    op->data.send_status_from_server.status = drey_status_code(st);
    op->data.send_status_from_server.status_details = &c->status_msg;
    return 1;
}

/* Unary replies: initial metadata, the message (if any) and the status in
 * one batch. The batch inherits the handler's reference. */
/* An answer's batch begins alike: replied (no cancel hook from now on),
 * then the initial metadata. ops holds 3. */
static size_t begin_answer(drey_call *c, grpc_op *ops) {
    pthread_mutex_lock(&c->mu);
    c->replied = true;
    c->cancel_hook = NULL;
    pthread_mutex_unlock(&c->mu);
    memset(ops, 0, 3 * sizeof *ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    return 1;
}

static void unary_finish(drey_call *c, const ProtobufCMessage *response, const drey_status *st) {
    grpc_op ops[3];
    size_t n = begin_answer(c, ops);
    if (response != NULL) {
        c->reply_bb = drey_rpc_pack(response);
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

/* The status op of another server's answer (a, not OK): its code, message
 * and google.rpc.Status bytes as they came. */
static void answer_status_op(drey_call *c, const drey_call_answer *a, grpc_op *op) {
    drey_server *s = c->server;
    if (s->observer != NULL && c->method != NULL)
        s->observer(s->observer_ctx, c->method->index, a->code, drey_mono_ns() - c->started_ns);
    op->op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    op->data.send_status_from_server.status = (grpc_status_code)a->code;
    if (a->code == GRPC_STATUS_OK)
        return;
    c->status_msg = grpc_slice_from_copied_buffer(a->message != NULL ? a->message : "", a->message_len);
    op->data.send_status_from_server.status_details = &c->status_msg;
    /* The deadline that counts is this call's: the caller's, less the hop. */
    int64_t delay = a->details != NULL ? drey_status_retry_delay_ms(a->details, a->details_len) : -1;
    set_trailers(c, op, a->details, a->details_len, delay);
}

void drey_call_relay(drey_call *c, const drey_call_answer *a) {
    grpc_op ops[3];
    size_t n = begin_answer(c, ops);
    if (a->code == GRPC_STATUS_OK) {
        c->reply_bb = drey_rpc_copy(a->response, a->response_len);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = c->reply_bb;
    }
    answer_status_op(c, a, &ops[n++]);
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
        slices[n++] = drey_rpc_flatten(bb);
        grpc_byte_buffer_destroy(bb);
        if (drey_list_empty(&c->out) || n == MAX_CONCATENATED)
            break;
        out_msg *m = DREY_LIST_ITEM(drey_list_pop(&c->out), out_msg, link);
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
    if (!drey_list_empty(&c->out)) {
        out_msg *m = DREY_LIST_ITEM(drey_list_pop(&c->out), out_msg, link);
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
        if (c->method->spec.concatenate_sends && !drey_list_empty(&c->out))
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
        if (c->finish_answer != NULL)
            answer_status_op(c, c->finish_answer, &ops[n++]);
        else
            n += status_ops(c, c->finish_status, &ops[n]);
        c->status_sent = true;
        c->sending = true;
        start_batch(c, ops, n, &c->send_tag);
    }
}

/* Queues bb (taking it) and sends it when its turn comes; false (bb
 * destroyed) when the stream is over. */
static bool enqueue(drey_call *c, grpc_byte_buffer *bb) {
    pthread_mutex_lock(&c->mu);
    bool open = !atomic_load(&c->closed) && !c->finish_wanted;
    if (open) {
        out_msg *m = drey_xmalloc(sizeof *m);
        m->bb = bb;
        drey_list_push(&c->out, &m->link);
        pump_locked(c);
    }
    pthread_mutex_unlock(&c->mu);
    if (!open)
        grpc_byte_buffer_destroy(bb);
    return open;
}

bool drey_call_send(drey_call *c, const ProtobufCMessage *message) {
    return enqueue(c, drey_rpc_pack(message));
}

bool drey_call_send_bytes(drey_call *c, const uint8_t *data, size_t len) {
    return enqueue(c, drey_rpc_copy(data, len));
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

void drey_call_finish_relay(drey_call *c, const drey_call_answer *a) {
    if (a->code == GRPC_STATUS_OK) {
        drey_call_finish(c, NULL);
        return;
    }
    pthread_mutex_lock(&c->mu);
    if (!c->finish_wanted) {
        c->finish_wanted = true;
        /* One allocation: the answer, its message and its details. */
        drey_call_answer *copy = drey_xmalloc(sizeof *copy + a->message_len + a->details_len + 1);
        char *tail = (char *)(copy + 1);
        *copy = (drey_call_answer){.code = a->code, .message = tail, .message_len = a->message_len};
        if (a->message_len > 0)
            memcpy(tail, a->message, a->message_len);
        if (a->details != NULL) {
            copy->details = (const uint8_t *)tail + a->message_len;
            copy->details_len = a->details_len;
            memcpy(tail + a->message_len, a->details, a->details_len);
        }
        c->finish_answer = copy;
        pump_locked(c);
    }
    pthread_mutex_unlock(&c->mu);
}

static void on_send(drey_server__tag *t, bool ok) {
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

static void on_close(drey_server__tag *t, bool ok) {
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

static void on_recv(drey_server__tag *t, bool ok) {
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
    grpc_slice s = drey_rpc_flatten(c->recv_buf);
    grpc_byte_buffer_destroy(c->recv_buf);
    c->recv_buf = NULL;
    /* Each message decodes into the call's arena, reset afterwards: a long
     * stream must not grow it. Handlers copy what they keep. */
    ProtobufCMessage *msg = decode(&c->arena, c->method, s);
    grpc_slice_unref(s);
    if (msg == NULL) {
        drey_status st = drey_status_of(DREY_ERR_MALFORMED_REQUEST);
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
    drey_status st = drey_status_of(e);
    if (is_streaming(c))
        drey_call_finish(c, &st);
    else
        drey_call_fail(c, &st);
}

static bool deadline_passed(const drey_call *c) {
    return gpr_time_cmp(c->deadline, gpr_now(c->deadline.clock_type)) <= 0;
}

void drey_server__call_start(drey_call *c) {
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

/* --- accessors ------------------------------------------------------------- */

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

