/*
 * watch — one etcd watch on its own Watch stream, driven by the client's
 * thread; see include/drey/etcd.h.
 *
 * Resumption follows clientv3/watch.go (serveSubstream): the watch restarts
 * from the revision after the last event delivered, or after the last
 * progress notification (etcd sends those only to watchers that have caught
 * up, so every event up to that revision has arrived). etcd never splits one
 * revision's events over two responses unless asked to fragment, which we
 * do not, so dropping events below that revision after a reconnection drops
 * exactly the ones already delivered.
 */
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>

#include "drey/clock.h"
#include "internal.h"

#define BACKOFF_MIN_NS (10 * 1000000LL)
#define BACKOFF_MAX_NS (1000 * 1000000LL)

#define CONTAINER(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))

struct drey_etcd_watch {
    drey_etcd__stream s; /* first: the thread frees a drey_etcd_watch as a stream */
    ProtobufCBinaryData key, range_end;
    bool prev_kv;
    void (*on_events)(void *user, Mvccpb__Event *const *events, size_t n);
    void (*on_end)(void *user, const drey_etcd_watch_end *end);
    void *user;

    /* The thread's. */
    size_t ep;
    grpc_call *call;
    grpc_byte_buffer *send, *recv;
    grpc_metadata md[2];   /* hasleader, and the token when etcd wants one */
    size_t n_md;
    uint64_t token_gen;    /* of the token this stream was opened with */
    grpc_metadata_array initial_md, trailing_md;
    grpc_status_code code;
    grpc_slice details;
    bool status_received; /* the current call's status is in code/details */
    bool ended;           /* on_end was called (or is owed): no more streams */
    int64_t backoff_ns;
    drey_etcd__tag send_tag, recv_tag, status_tag;
    drey_arena arena; /* one response's decoding */

    /* Under e->mu. */
    drey_etcd_watch_stats stats;
};

static drey_etcd_watch *of(drey_etcd__stream *s) {
    return (drey_etcd_watch *)s;
}

static bool retryable(grpc_status_code code) {
    switch (code) {
    case GRPC_STATUS_INVALID_ARGUMENT:
    case GRPC_STATUS_NOT_FOUND:
    case GRPC_STATUS_ALREADY_EXISTS:
    case GRPC_STATUS_PERMISSION_DENIED:
    case GRPC_STATUS_FAILED_PRECONDITION:
    case GRPC_STATUS_OUT_OF_RANGE:
    case GRPC_STATUS_UNIMPLEMENTED:
        return false;
    default:
        /* UNAVAILABLE (a member down, or without a leader), INTERNAL and
         * the rest: another stream can make progress (clientv3's isHaltErr
         * halts on fewer codes than it retries). UNAUTHENTICATED: the
         * token expired, a new one is being fetched. */
        return true;
    }
}

static void end_watch(drey_etcd_watch *w, const drey_etcd_watch_end *end) {
    w->ended = true;
    if (w->on_end != NULL && drey_etcd__may_call_back(&w->s))
        w->on_end(w->user, end);
}

static void set_stats(drey_etcd_watch *w, bool connected, bool new_stream) {
    pthread_mutex_lock(&w->s.e->mu);
    w->stats.connected = connected;
    w->stats.streams += new_stream;
    pthread_mutex_unlock(&w->s.e->mu);
}

static int64_t next_revision(drey_etcd_watch *w) {
    pthread_mutex_lock(&w->s.e->mu);
    int64_t r = w->stats.next_revision;
    pthread_mutex_unlock(&w->s.e->mu);
    return r;
}

static void set_next_revision(drey_etcd_watch *w, int64_t r) {
    pthread_mutex_lock(&w->s.e->mu);
    w->stats.next_revision = r;
    pthread_mutex_unlock(&w->s.e->mu);
}

static void post_recv(drey_etcd_watch *w) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &w->recv;
    if (grpc_call_start_batch(w->call, &op, 1, &w->recv_tag, NULL) == GRPC_CALL_OK)
        w->s.pending++;
}

static void start_attempt(drey_etcd_watch *w) {
    drey_etcd *e = w->s.e;
    w->call = drey_etcd__stream_call(e, w->ep, DREY_ETCD__WATCH);
    grpc_metadata_array_init(&w->initial_md);
    grpc_metadata_array_init(&w->trailing_md);
    w->details = grpc_empty_slice();
    w->recv = NULL;
    drey_etcd__hasleader(&w->md[0]);
    w->n_md = 1 + drey_etcd__token_md(e, &w->md[1], &w->token_gen);

    Etcdserverpb__WatchCreateRequest create = ETCDSERVERPB__WATCH_CREATE_REQUEST__INIT;
    create.key = w->key;
    create.range_end = w->range_end;
    create.start_revision = next_revision(w);
    create.prev_kv = w->prev_kv;
    /* Progress notifications move the resume point on while nothing under
     * the key changes, so a reconnection after a long quiet spell does not
     * ask for a revision compacted since. */
    create.progress_notify = 1;
    Etcdserverpb__WatchRequest req = ETCDSERVERPB__WATCH_REQUEST__INIT;
    req.request_union_case = ETCDSERVERPB__WATCH_REQUEST__REQUEST_UNION_CREATE_REQUEST;
    req.create_request = &create;
    w->send = drey_etcd__pack(&req.base);
    set_stats(w, false, true);

    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[0].data.recv_status_on_client.trailing_metadata = &w->trailing_md;
    ops[0].data.recv_status_on_client.status = &w->code;
    ops[0].data.recv_status_on_client.status_details = &w->details;
    if (grpc_call_start_batch(w->call, ops, 1, &w->status_tag, NULL) != GRPC_CALL_OK)
        abort(); /* a fresh call always takes its status op */
    w->s.pending++;
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = w->n_md;
    ops[0].data.send_initial_metadata.metadata = w->md;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = w->send;
    if (grpc_call_start_batch(w->call, ops, 2, &w->send_tag, NULL) == GRPC_CALL_OK)
        w->s.pending++;
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[0].data.recv_initial_metadata.recv_initial_metadata = &w->initial_md;
    ops[1].op = GRPC_OP_RECV_MESSAGE;
    ops[1].data.recv_message.recv_message = &w->recv;
    if (grpc_call_start_batch(w->call, ops, 2, &w->recv_tag, NULL) == GRPC_CALL_OK)
        w->s.pending++;
}

/* Once the status has come and every batch of the call has completed (only
 * then may its buffers be reused): frees the call, then reconnects after a
 * backoff or ends the watch. */
static void maybe_finish(drey_etcd_watch *w) {
    if (!w->status_received || w->s.pending > 0)
        return;
    drey_etcd *e = w->s.e;
    w->status_received = false;
    grpc_status_code code = w->code;
    char message[160];
    snprintf(message, sizeof message, "%.*s", (int)GRPC_SLICE_LENGTH(w->details),
             (const char *)GRPC_SLICE_START_PTR(w->details));
    grpc_call_unref(w->call);
    w->call = NULL;
    grpc_slice_unref(w->details);
    grpc_metadata_array_destroy(&w->initial_md);
    grpc_metadata_array_destroy(&w->trailing_md);
    if (w->n_md > 1)
        grpc_slice_unref(w->md[1].value);
    w->n_md = 0;
    set_stats(w, false, false);
    if (code == GRPC_STATUS_UNAUTHENTICATED)
        drey_etcd__token_stale(e, w->token_gen);
    if (w->s.closing || w->ended)
        return;
    if (!retryable(code)) {
        drey_etcd_watch_end end = {.reason = DREY_ETCD_WATCH_FAILED, .code = code, .message = message};
        end_watch(w, &end);
        return;
    }
    w->ep = (w->ep + 1) % e->n_endpoints;
    w->s.timer_ns = drey_mono_ns() + w->backoff_ns;
    w->backoff_ns = w->backoff_ns * 2 > BACKOFF_MAX_NS ? BACKOFF_MAX_NS : w->backoff_ns * 2;
}

static void on_send(drey_etcd *e, drey_etcd__tag *t, bool ok) {
    (void)e;
    (void)ok; /* a failed send ends the call: its status says why */
    drey_etcd_watch *w = CONTAINER(t, drey_etcd_watch, send_tag);
    w->s.pending--;
    grpc_byte_buffer_destroy(w->send);
    w->send = NULL;
    maybe_finish(w);
}

/* One WatchResponse. Returns false when the stream must stop. */
static bool handle(drey_etcd_watch *w, const Etcdserverpb__WatchResponse *r) {
    if (r->canceled) {
        drey_etcd_watch_end end = {.message = r->cancel_reason != NULL ? r->cancel_reason : ""};
        if (r->compact_revision > 0) {
            end.reason = DREY_ETCD_WATCH_COMPACTED;
            end.compact_revision = r->compact_revision;
        } else {
            end.reason = DREY_ETCD_WATCH_CANCELED;
        }
        end_watch(w, &end);
        return false;
    }
    int64_t next = next_revision(w);
    if (r->created) {
        w->backoff_ns = BACKOFF_MIN_NS;
        if (next == 0 && r->header != NULL)
            next = r->header->revision + 1; /* "from now": what now was */
        set_stats(w, true, false);
    }
    size_t first = 0;
    while (first < r->n_events && r->events[first]->kv != NULL && r->events[first]->kv->mod_revision < next)
        first++; /* delivered before the reconnection */
    if (first < r->n_events) {
        const Mvccpb__Event *last = r->events[r->n_events - 1];
        if (last->kv != NULL)
            next = last->kv->mod_revision + 1;
        set_next_revision(w, next);
        if (drey_etcd__may_call_back(&w->s))
            w->on_events(w->user, r->events + first, r->n_events - first);
        return true;
    }
    if (r->n_events == 0 && !r->created && r->header != NULL && r->header->revision + 1 > next)
        next = r->header->revision + 1; /* a progress notification */
    set_next_revision(w, next);
    return true;
}

static void on_recv(drey_etcd *e, drey_etcd__tag *t, bool ok) {
    (void)e;
    drey_etcd_watch *w = CONTAINER(t, drey_etcd_watch, recv_tag);
    w->s.pending--;
    if (!ok || w->recv == NULL) {
        maybe_finish(w); /* the stream is over: its status follows, if it has not come */
        return;
    }
    Etcdserverpb__WatchResponse *r = (Etcdserverpb__WatchResponse *)drey_etcd__unpack(
        w->recv, &etcdserverpb__watch_response__descriptor, drey_arena_protobuf_allocator(&w->arena));
    grpc_byte_buffer_destroy(w->recv);
    w->recv = NULL;
    bool go_on = r != NULL && !w->s.closing && !w->ended && handle(w, r);
    drey_arena_reset(&w->arena);
    if (go_on && !w->status_received && drey_etcd__may_call_back(&w->s))
        post_recv(w);
    else
        grpc_call_cancel(w->call, NULL); /* undecodable, ended or closing: the status follows */
    maybe_finish(w);
}

static void on_status(drey_etcd *e, drey_etcd__tag *t, bool ok) {
    (void)e;
    (void)ok;
    drey_etcd_watch *w = CONTAINER(t, drey_etcd_watch, status_tag);
    w->s.pending--;
    w->status_received = true;
    maybe_finish(w);
}

static void w_start(drey_etcd__stream *s) {
    drey_etcd_watch *w = of(s);
    w->ep = atomic_load(&s->e->current);
    start_attempt(w);
}

static void w_timer(drey_etcd__stream *s) {
    drey_etcd_watch *w = of(s);
    if (w->call == NULL && !w->ended)
        start_attempt(w);
}

static void w_close(drey_etcd__stream *s) {
    drey_etcd_watch *w = of(s);
    if (w->call != NULL)
        grpc_call_cancel(w->call, NULL);
}

static void w_release(drey_etcd__stream *s) {
    drey_etcd_watch *w = of(s);
    free(w->key.data);
    free(w->range_end.data);
    drey_arena_destroy(&w->arena);
}

drey_etcd_watch *drey_etcd_watch_start(drey_etcd *e, const drey_etcd_watch_options *opts) {
    if (opts->key == NULL || opts->on_events == NULL || opts->start_revision < 0)
        return NULL;
    drey_etcd_watch *w = calloc(1, sizeof *w);
    if (w == NULL)
        abort();
    size_t n = strlen(opts->key);
    w->key.len = n;
    w->key.data = malloc(n > 0 ? n : 1);
    if (w->key.data == NULL)
        abort();
    memcpy(w->key.data, opts->key, n);
    if (opts->prefix) {
        drey_arena a;
        drey_arena_init(&a, NULL, 0);
        ProtobufCBinaryData end = drey_etcd_prefix_end(&a, opts->key);
        w->range_end.len = end.len;
        w->range_end.data = malloc(end.len);
        if (w->range_end.data == NULL)
            abort();
        memcpy(w->range_end.data, end.data, end.len);
        drey_arena_destroy(&a);
    }
    w->prev_kv = opts->prev_kv;
    w->on_events = opts->on_events;
    w->on_end = opts->on_end;
    w->user = opts->user;
    w->backoff_ns = BACKOFF_MIN_NS;
    w->stats.next_revision = opts->start_revision;
    drey_arena_init(&w->arena, NULL, 0);
    w->send_tag.done = on_send;
    w->recv_tag.done = on_recv;
    w->status_tag.done = on_status;
    w->s.on_start = w_start;
    w->s.on_timer = w_timer;
    w->s.on_close = w_close;
    w->s.on_release = w_release;
    drey_etcd__stream_add(e, &w->s);
    return w;
}

drey_etcd_watch_stats drey_etcd_watch_stats_of(const drey_etcd_watch *w) {
    pthread_mutex_lock(&w->s.e->mu);
    drey_etcd_watch_stats st = w->stats;
    pthread_mutex_unlock(&w->s.e->mu);
    return st;
}

void drey_etcd_watch_close(drey_etcd_watch *w) {
    if (w != NULL && drey_etcd__stream_close(&w->s))
        free(w);
}
