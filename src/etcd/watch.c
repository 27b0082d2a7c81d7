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

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/rpc.h"
#include "internal.h"

#define BACKOFF_MIN_NS (10 * 1000000LL)
#define BACKOFF_MAX_NS (1000 * 1000000LL)

struct drey_etcd_watch {
    drey_etcd__stream s; /* first: the thread frees a drey_etcd_watch as a stream */
    ProtobufCBinaryData key, range_end;
    bool prev_kv;
    void (*on_events)(void *user, Mvccpb__Event *const *events, size_t n);
    void (*on_end)(void *user, const drey_etcd_watch_end *end);
    void *user;

    /* The thread's. */
    bool ended;       /* on_end was called (or is owed): no more streams */
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

static void start_attempt(drey_etcd__stream *s) {
    drey_etcd_watch *w = of(s);
    drey_etcd__call_open(s, DREY_ETCD__WATCH);
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
    set_stats(w, false, true);
    drey_etcd__call_send(s, &req.base);
    drey_etcd__call_recv(s);
}

/* The call is over: reconnects after a backoff, or ends the watch. */
static void on_call_end(drey_etcd__stream *s, grpc_status_code code, const char *message) {
    drey_etcd_watch *w = of(s);
    set_stats(w, false, false);
    if (w->s.closing || w->ended)
        return;
    if (!retryable(code)) {
        drey_etcd_watch_end end = {.reason = DREY_ETCD_WATCH_FAILED, .code = code, .message = message};
        end_watch(w, &end);
        return;
    }
    w->s.timer_ns = drey_etcd__call_retry_at(s, BACKOFF_MAX_NS);
}

/* etcd checks the token only when a watch is created, and answers one it
 * does not know by cancelling the watch, not by a status: a token that
 * expired unused, or that a member lost with its restart (simple tokens
 * live in its memory; replaying its log brings them back only for a
 * while), or none yet. A new token fixes those; a role without the
 * key does not ("permission denied"). */
static bool token_refused(const drey_etcd_watch *w, const char *reason) {
    return w->s.e->user != NULL && reason != NULL &&
           (strstr(reason, "invalid auth token") != NULL || strstr(reason, "user name is empty") != NULL ||
            strstr(reason, "revision of auth store is old") != NULL);
}

/* One WatchResponse. Returns false when the stream must stop. */
static bool handle(drey_etcd_watch *w, const Etcdserverpb__WatchResponse *r) {
    if (r->canceled && r->compact_revision == 0 && token_refused(w, r->cancel_reason)) {
        drey_etcd__token_stale(w->s.e, w->s.token_gen);
        return false; /* cancelled here: on_call_end reopens it after its backoff */
    }
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
        w->s.backoff_ns = BACKOFF_MIN_NS;
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

static void on_recv(drey_etcd__stream *s, bool ok) {
    drey_etcd_watch *w = of(s);
    if (!ok || s->recv == NULL) {
        drey_etcd__call_maybe_end(s); /* the stream is over: its status follows, if it has not come */
        return;
    }
    Etcdserverpb__WatchResponse *r = (Etcdserverpb__WatchResponse *)drey_rpc_unpack(
        s->recv, &etcdserverpb__watch_response__descriptor, drey_arena_protobuf_allocator(&w->arena));
    grpc_byte_buffer_destroy(s->recv);
    s->recv = NULL;
    bool go_on = r != NULL && !s->closing && !w->ended && handle(w, r);
    drey_arena_reset(&w->arena);
    if (go_on && !s->status_received && drey_etcd__may_call_back(s))
        drey_etcd__call_recv(s);
    else
        drey_etcd__call_cancel(s); /* undecodable, ended or closing: the status follows */
    drey_etcd__call_maybe_end(s);
}

static void w_timer(drey_etcd__stream *s) {
    drey_etcd_watch *w = of(s);
    if (s->call == NULL && !w->ended)
        start_attempt(s);
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
    drey_etcd_watch *w = drey_xcalloc(1, sizeof *w);
    size_t n = strlen(opts->key);
    w->key.len = n;
    w->key.data = drey_xmalloc(n);
    memcpy(w->key.data, opts->key, n);
    if (opts->prefix) {
        drey_arena a;
        drey_arena_init(&a, NULL, 0);
        ProtobufCBinaryData end = drey_etcd_prefix_end(&a, opts->key);
        w->range_end.len = end.len;
        w->range_end.data = drey_xmalloc(end.len);
        memcpy(w->range_end.data, end.data, end.len);
        drey_arena_destroy(&a);
    }
    w->prev_kv = opts->prev_kv;
    w->on_events = opts->on_events;
    w->on_end = opts->on_end;
    w->user = opts->user;
    w->s.backoff_ns = BACKOFF_MIN_NS;
    w->stats.next_revision = opts->start_revision;
    drey_arena_init(&w->arena, NULL, 0);
    drey_etcd__stream_init(&w->s, start_attempt, w_timer, on_recv, on_call_end, w_release);
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
