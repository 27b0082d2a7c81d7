/*
 * stream — a Watch stream: its request goes through the chain (admission,
 * backpressure) through the door here, the watch limits, then it joins
 * the feed (or, on a cluster node, the cluster feeds it); its buffer leaves
 * as WatchEvent messages, SEND_BATCH at a time, built outside its mutex;
 * on_done detaches it. Locks and the sending rules: internal.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/cache.h"
#include "drey/cache/v1/cache.pb-c.h"
#include "drey/clock.h"
#include "internal.h"

/* Messages handed to the transport at once: enough to keep a stream busy
 * between completions, few enough that the transport's queue stays small. */
#define SEND_BATCH 32

void drey_watch__stream_unref(stream *s) {
    if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1)
        return;
    for (size_t i = 0; i < s->ring_n; i++)
        drey_watch__event_unref(s->ring[(s->ring_head + i) % s->ring_cap]);
    free(s->ring);
    free(s->principal);
    pthread_cond_destroy(&s->idle);
    pthread_mutex_destroy(&s->mu);
    drey_arena_destroy(&s->arena);
    free(s);
}

/* --- messages ----------------------------------------------------------- */

static const char *cache_out(const char *cache, size_t len, drey_arena *a) {
    return len == 0 ? "default" : drey_arena_strndup(a, cache, len);
}

static const Drey__Cache__V1__WatchEvent__Kind kinds[] = {
    [DREY_STORE_CHANGE_SET] = DREY__CACHE__V1__WATCH_EVENT__KIND__SET,
    [DREY_STORE_CHANGE_REMOVE] = DREY__CACHE__V1__WATCH_EVENT__KIND__REMOVE,
    [DREY_STORE_CHANGE_EXPIRE] = DREY__CACHE__V1__WATCH_EVENT__KIND__EXPIRE,
    [DREY_STORE_CHANGE_EVICT] = DREY__CACHE__V1__WATCH_EVENT__KIND__EVICT,
    [DREY_STORE_CHANGE_CLEAR] = DREY__CACHE__V1__WATCH_EVENT__KIND__CLEAR,
};

static void event_msg(const stream *s, const wevent *e, drey_arena *a, Drey__Cache__V1__WatchEvent *m) {
    drey__cache__v1__watch_event__init(m);
    m->kind = kinds[e->kind];
    m->cache = (char *)cache_out(e->data, e->cache_len, a);
    m->key = drey_arena_strndup(a, e->data + e->cache_len, e->key_len);
    m->version = e->version;
    m->sequence = e->seq;
    if (e->kind == DREY_STORE_CHANGE_SET) {
        m->expires_at = drey_cache_timestamp(a, e->expires_at_ms);
        if (s->values) {
            drey_value v = {.kind = (drey_value_kind)e->value_kind,
                            .data = (const uint8_t *)e->data + e->cache_len + e->key_len,
                            .len = e->value_len};
            m->value = drey_cache_value_out(a, &v);
        }
    }
}

static void marker_msg(const stream *s, Drey__Cache__V1__WatchEvent__Kind kind, uint64_t seq, const char *reason,
                       drey_arena *a, Drey__Cache__V1__WatchEvent *m) {
    drey__cache__v1__watch_event__init(m);
    m->kind = kind;
    m->cache = (char *)cache_out(s->cache, s->cache_len, a);
    m->sequence = seq;
    m->feed = s->w->feed;
    m->reason = (char *)(reason != NULL ? reason : "");
}

/* One message to send, taken from the buffer under the stream's mutex. */
typedef struct pending {
    Drey__Cache__V1__WatchEvent__Kind marker; /* WATCHING or RESYNC_REQUIRED; 0: the event */
    uint64_t seq;
    const char *reason;
    wevent *event;
} pending;

/* Under s->mu: up to SEND_BATCH messages, in order, out of the buffer. */
static size_t take(stream *s, pending *out) {
    size_t n = 0;
    if (s->held)
        return 0;
    while (n < SEND_BATCH && (s->hello_pending || s->resync_pending || s->ring_n > 0)) {
        pending *p = &out[n++];
        memset(p, 0, sizeof *p);
        if (s->hello_pending) {
            p->marker = DREY__CACHE__V1__WATCH_EVENT__KIND__WATCHING;
            p->seq = s->hello_seq;
            s->hello_pending = false;
        } else if (s->resync_pending) {
            p->marker = DREY__CACHE__V1__WATCH_EVENT__KIND__RESYNC_REQUIRED;
            p->seq = s->resync_seq;
            p->reason = s->resync_reason;
            s->resync_pending = false;
        } else {
            p->event = s->ring[s->ring_head];
            s->ring_head = (s->ring_head + 1) % s->ring_cap;
            s->ring_n--;
            s->ring_bytes -= p->event->bytes;
        }
    }
    return n;
}

/* Hands the stream's next messages to the transport, unless it is sending
 * already. Any thread but the store's observer. Messages are built and
 * sent outside the stream's mutex, so a writer publishing to the stream
 * (with a shard locked) never waits for their encoding; `busy` keeps a
 * second thread out meanwhile, so they leave in order. */
void drey_watch__flush(stream *s) {
    char scratch[2048];
    drey_arena a;
    drey_arena_init(&a, scratch, sizeof scratch);
    pending batch[SEND_BATCH];
    pthread_mutex_lock(&s->mu);
    if (s->done || s->busy || s->sending || s->state != S_ATTACHED) {
        pthread_mutex_unlock(&s->mu);
        drey_arena_destroy(&a);
        return;
    }
    s->busy = true;
    for (;;) {
        size_t n = take(s, batch);
        if (n == 0)
            break;
        s->sending = true;
        s->drained = false;
        pthread_mutex_unlock(&s->mu);
        for (size_t i = 0; i < n; i++) {
            Drey__Cache__V1__WatchEvent m;
            wevent *e = batch[i].event;
            if (e != NULL && e->kind == EV_RAW) {
                drey_call_send_bytes(s->call, (const uint8_t *)e->data, e->value_len);
                drey_watch__event_unref(e);
            } else if (e != NULL && (e->kind == EV_WATCHING || e->kind == EV_RESYNC)) {
                marker_msg(s,
                           e->kind == EV_WATCHING ? DREY__CACHE__V1__WATCH_EVENT__KIND__WATCHING
                                                  : DREY__CACHE__V1__WATCH_EVENT__KIND__RESYNC_REQUIRED,
                           0, e->data, &a, &m);
                drey_call_send(s->call, &m.base);
                drey_watch__event_unref(e);
            } else if (e != NULL) {
                event_msg(s, e, &a, &m);
                drey_call_send(s->call, &m.base);
                drey_watch__event_unref(e);
            } else {
                marker_msg(s, batch[i].marker, batch[i].seq, batch[i].reason, &a, &m);
                drey_call_send(s->call, &m.base);
            }
            drey_arena_reset(&a);
        }
        pthread_mutex_lock(&s->mu);
        /* Everything sent left while we were sending: no other on_sent
         * will come for it, so go on here. */
        if (!s->drained || s->done)
            break;
        s->sending = false;
    }
    s->busy = false;
    pthread_cond_broadcast(&s->idle);
    pthread_mutex_unlock(&s->mu);
    drey_arena_destroy(&a);
}

/* --- the stream's life -------------------------------------------------- */

stream *drey_watch__stream_new(drey_watch *w, drey_call *call, int refs, const Drey__Cache__V1__WatchRequest *msg) {
    stream *s = drey_xcalloc(1, sizeof *s);
    s->w = w;
    s->call = call;
    atomic_init(&s->refs, refs);
    drey_arena_init(&s->arena, NULL, 0);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->idle, NULL);
    s->state = S_ADMITTING;
    s->len = protobuf_c_message_get_packed_size(&msg->base);
    s->bytes = drey_arena_alloc(&s->arena, s->len ? s->len : 1);
    protobuf_c_message_pack(&msg->base, s->bytes);
    s->msg = drey__cache__v1__watch_request__unpack(drey_arena_protobuf_allocator(&s->arena), s->len, s->bytes);
    if (s->msg == NULL)
        abort(); /* what protobuf-c just packed it unpacks */
    return s;
}

/* The chain's door. The chain answers once: reply (admitted: the stream
 * runs) or fail (refused: the call ends with the status). */
static void door_reply(drey_subdoor *door, const ProtobufCMessage *response) {
    (void)response;
    stream *s = (stream *)door;
    drey_watch__flush(s);
    drey_watch__stream_unref(s);
}

static void door_fail(drey_subdoor *door, const drey_status *st) {
    stream *s = (stream *)door;
    pthread_mutex_lock(&s->mu);
    s->state = S_REFUSED;
    drey_subdoor_answered_locked(&s->sd);
    if (!s->done)
        drey_call_finish(s->call, st);
    pthread_mutex_unlock(&s->mu);
    drey_watch__stream_unref(s);
}

static void door_relay(drey_subdoor *door, const drey_answer *a) {
    (void)a; /* Watch is never forwarded: the route row passes it by (a cluster watch follows its owners) */
    drey_status st = drey_status_of(DREY_ERR_INTERNAL);
    door_fail(door, &st);
}

static const char *door_metadata(drey_subdoor *door, const char *key, size_t *len) {
    return drey_call_metadata(((stream *)door)->call, key, len);
}

static const char *door_peer(drey_subdoor *door) {
    return drey_call_connection(((stream *)door)->call);
}

static const drey_subdoor_stream watch_stream = {.reply = door_reply, .fail = door_fail, .relay = door_relay,
                                                 .metadata = door_metadata, .peer = door_peer};

static void refuse(drey_request *r, drey_error e, const char *field) {
    drey_status *st = drey_arena_alloc(r->arena, sizeof *st);
    drey_status_init(st);
    if (field != NULL)
        drey_status_add_violation(st, e, "%s", field);
    else
        drey_status_set(st, e);
    drey_request_fail(r, st);
}

size_t drey_watch__clients_locked(const drey_watch *w) {
    return w->n_streams - w->n_subs + w->n_remote;
}

void drey_watch__attach_locked(stream *s, drey_list *list, size_t *count) {
    drey_list_push(list, &s->link);
    (*count)++;
    atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed); /* the hub's, until detached */
}

void drey_watch__handle(void *ctx, drey_request *r, const ProtobufCMessage *msg) {
    drey_watch *w = ctx;
    stream *s = r->door;
    (void)msg;
    if (s->msg->n_keys > 0 && s->msg->prefix[0] != '\0') {
        refuse(r, DREY_ERR_MALFORMED_REQUEST, "prefix");
        return;
    }
    drey_watch__set_filter(s);
    pthread_mutex_lock(&w->mu);
    /* A cluster node's watches follow the owners: not before it joined. */
    if (w->stopping || !w->started || (w->opts.clustered && !w->has_cluster)) {
        pthread_mutex_unlock(&w->mu);
        refuse(r, w->stopping ? DREY_ERR_CANCELLED : DREY_ERR_RECOVERING, NULL);
        return;
    }
    if (w->opts.max_streams > 0 && drey_watch__clients_locked(w) >= w->opts.max_streams) {
        pthread_mutex_unlock(&w->mu);
        drey_status *st = drey_status_new(r->arena, DREY_ERR_NODE_WATCH_LIMIT);
        drey_status_add_metadata(st, "limitWatches", "%u", w->opts.max_streams);
        snprintf(st->quota_subject, sizeof st->quota_subject, "node:%s", w->opts.node_id ? w->opts.node_id : "");
        st->quota_description = "the node has --max-watches watches open";
        st->retry_delay_ms = 1000;
        drey_request_fail(r, st);
        return;
    }
    if (!drey_watch__principal_take(w, r->principal)) {
        pthread_mutex_unlock(&w->mu);
        drey_status *st = drey_status_new(r->arena, DREY_ERR_PRINCIPAL_WATCH_LIMIT);
        drey_status_add_metadata(st, "limitWatches", "%u", w->opts.max_per_principal);
        snprintf(st->quota_subject, sizeof st->quota_subject, "principal:%s", r->principal);
        st->quota_description = "the caller has --principal-max-watches watches open";
        st->retry_delay_ms = 1000;
        drey_request_fail(r, st);
        return;
    }
    if (w->has_cluster) {
        drey_watch__attach_remote(w, s, r); /* unlocks w->mu */
        return;
    }
    s->principal = drey_xstrdup(r->principal);
    drey_watch__recording_begin_locked(w);
    pthread_mutex_lock(&s->mu);
    bool gone = s->done;
    if (!gone) {
        const Drey__Cache__V1__WatchRequest *m = s->msg;
        s->state = S_ATTACHED;
        drey_subdoor_answered_locked(&s->sd);
        if (m->resume_feed == 0) {
            s->hello_pending = true;
            s->hello_seq = w->seq;
        } else if (m->resume_feed != w->feed || m->resume_after < w->history_from || m->resume_after > w->seq) {
            s->resync_pending = true;
            s->resync_seq = w->seq;
            s->resync_reason = "HISTORY_UNAVAILABLE";
        } else {
            s->hello_pending = true;
            s->hello_seq = m->resume_after;
            for (wevent *e = w->hhead; e != NULL; e = e->hnext) {
                if (e->seq > m->resume_after && drey_watch__wants(s, e))
                    drey_watch__push(w, s, e);
            }
        }
        drey_watch__attach_locked(s, &w->streams, &w->n_streams);
    }
    pthread_mutex_unlock(&s->mu);
    if (gone)
        drey_watch__principal_give(w, s->principal);
    pthread_mutex_unlock(&w->mu);
    drey_request_reply(r, NULL); /* frees the backpressure slot; sends WATCHING */
}

void drey_watch__on_watch(void *ctx, drey_call *call, const ProtobufCMessage *request) {
    drey_watch *w = ctx;
    if (request == NULL)
        return; /* the client's half-close: the stream goes on */
    /* The chain may park the request (the backpressure queue): it needs a
     * copy that outlives this callback, and the bytes for validation. */
    stream *s = drey_watch__stream_new(w, call, 2, (const Drey__Cache__V1__WatchRequest *)request); /* the call's and the chain's */
    drey_call_set_user(call, s);
    if (w->opts.clustered) {
        /* The owners check the caller again (cluster.c): its token, read
         * now, while the call surely lives. */
        size_t len;
        const char *auth = drey_call_metadata(call, "authorization", &len);
        if (auth != NULL) {
            s->authorization = drey_arena_strndup(&s->arena, auth, len);
            s->authorization_len = len;
        }
    }
    drey_subdoor_init(&s->sd, &watch_stream, &s->mu, drey_call_deadline_mono_ns(call));
    drey_request_init(&s->req, &drey_subdoor_ops, &s->sd, &s->arena, &w->method, &s->msg->base, s->bytes, s->len);
    drey_pipeline_submit(w->opts.pipeline, &s->req);
}

void drey_watch__on_sent(void *ctx, drey_call *call) {
    (void)ctx;
    stream *s = drey_call_user(call);
    if (s == NULL)
        return;
    pthread_mutex_lock(&s->mu);
    if (s->busy) {
        s->drained = true; /* the sending thread goes on */
        pthread_mutex_unlock(&s->mu);
        return;
    }
    s->sending = false;
    pthread_mutex_unlock(&s->mu);
    drey_watch__flush(s);
}

void drey_watch__on_done(void *ctx, drey_call *call) {
    drey_watch *w = ctx;
    stream *s = drey_call_user(call);
    if (s == NULL)
        return;
    drey_call_set_user(call, NULL);
    /* The call may be freed once this returns: a thread sending outside the
     * stream's mutex finishes first, and none starts after done. */
    pthread_mutex_lock(&s->mu);
    s->done = true;
    while (s->busy)
        pthread_cond_wait(&s->idle, &s->mu);
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_lock(&w->mu);
    pthread_mutex_lock(&s->mu);
    bool attached = s->state == S_ATTACHED;
    void (*cancel)(void *) = NULL;
    void *cancel_arg = NULL;
    drey_subdoor_cancel_locked(&s->sd, &cancel, &cancel_arg);
    drey_watch__ring_clear(s);
    void *handle = s->remote && !s->opening ? s->handle : NULL; /* opening: the opener closes */
    s->handle = NULL;
    pthread_mutex_unlock(&s->mu);
    if (attached && s->remote) {
        drey_list_remove(&w->remotes, &s->link);
        w->n_remote--;
        drey_watch__principal_give(w, s->principal);
    } else if (attached) {
        drey_list_remove(&w->streams, &s->link);
        w->n_streams--;
        if (s->sub)
            w->n_subs--;
        else
            drey_watch__principal_give(w, s->principal);
        if (w->n_streams == 0) {
            w->idle_since_ms = drey_mono_ms();
            pthread_cond_signal(&w->cond); /* the linger timer starts */
        }
    }
    drey_watch_cluster cl = w->cluster;
    pthread_mutex_unlock(&w->mu);
    /* Every subscription the cluster holds for it ends; after close no
     * event reaches the stream. */
    if (handle != NULL)
        cl.close(cl.ctx, handle);
    /* Waiting in the backpressure queue: leave it (the chain then fails the
     * request through the door, which no longer touches the call). */
    if (cancel != NULL)
        cancel(cancel_arg);
    if (attached)
        drey_watch__stream_unref(s); /* the hub's */
    drey_watch__stream_unref(s);     /* the call's */
}


bool drey_watch__add_method(drey_watch *w, drey_server *server, const char *path,
                            const ProtobufCMessageDescriptor *input,
                            void (*on_message)(void *ctx, drey_call *call, const ProtobufCMessage *msg)) {
    const drey_server_method m = {
        .path = path,
        .input = input,
        .server_streaming = true,
        .on_message = on_message,
        .on_done = drey_watch__on_done,
        .on_sent = drey_watch__on_sent,
        .ctx = w,
    };
    return drey_server_add_method(server, &m);
}
