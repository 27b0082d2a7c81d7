/*
 * cluster — both ends of a cluster watch. The ingress node (where the
 * client's Watch arrived) holds a remote stream that the cluster feeds from
 * the owners' subscriptions (drey_watch_deliver, drey_watch_lost,
 * drey_watch_mark); an owner serves an ingress's subscription from its own
 * feed, for the partitions asked for and only while it owns them.
 */
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/internal/v1/subscribe.pb-c.h"
#include "internal.h"

#define SUBSCRIBE_PATH "/drey.internal.v1.Subscriber/Subscribe"

/* --- clusters: the ingress's cluster watch ------------------------------------- */

/* The client hears nothing until every owner's subscription is in place. */
void drey_watch__attach_remote(drey_watch *w, stream *s, drey_request *r) {
    s->principal = drey_xstrdup(r->principal);
    pthread_mutex_lock(&s->mu);
    bool gone = s->done;
    if (!gone) {
        s->state = S_ATTACHED;
        drey_subdoor_answered_locked(&s->sd);
        s->remote = true;
        s->held = true;
        s->opening = true;
        drey_watch__attach_locked(s, &w->remotes, &w->n_remote);
    }
    pthread_mutex_unlock(&s->mu);
    if (gone)
        drey_watch__principal_give(w, s->principal);
    drey_watch_cluster cl = w->cluster;
    pthread_mutex_unlock(&w->mu);
    if (!gone) {
        /* Outside the hub's mutex: the cluster feeds streams while holding
         * its own. The client may be gone meanwhile: whoever comes second,
         * this or on_done, closes. */
        void *h = cl.open(cl.ctx, (drey_watch_stream *)s, s->msg, s->authorization, s->authorization_len);
        pthread_mutex_lock(&s->mu);
        s->handle = h;
        s->opening = false;
        bool close_now = s->done;
        if (close_now)
            s->handle = NULL;
        pthread_mutex_unlock(&s->mu);
        if (close_now)
            cl.close(cl.ctx, h);
    }
    drey_request_reply(r, NULL); /* frees the backpressure slot */
}

/* --- clusters: the owner's end of a subscription ------------------------- */

static void sub_refuse(drey_call *call, drey_error e) {
    drey_status st = drey_status_of(e);
    drey_call_finish(call, &st);
}

/* Ends a subscription refused after its stream was made (the call's
 * reference stays until on_done), and lets go of the caller's. */
static void sub_end(stream *s, const drey_status *st) {
    pthread_mutex_lock(&s->mu);
    s->state = S_REFUSED;
    if (!s->done)
        drey_call_finish(s->call, st);
    pthread_mutex_unlock(&s->mu);
    drey_watch__stream_unref(s);
}

/* The subscription as the principal and authz stages see it: the
 * ingress's call, carrying the client's token, forwarded by the node its
 * request names (checked against its certificate before). Used only while
 * on_subscribe runs, when the call surely lives. */
typedef struct sub_check {
    drey_call *call;
    const char *node;
} sub_check;

static const char *sub_metadata(void *door, const char *key, size_t *len) {
    sub_check *c = door;
    if (strcmp(key, DREY_FORWARDED_BY) == 0) {
        *len = strlen(c->node);
        return c->node;
    }
    return drey_call_metadata(c->call, key, len);
}

static const char *sub_peer(void *door) {
    return drey_call_connection(((sub_check *)door)->call);
}

static bool sub_peer_is(void *door, const char *id, size_t len) {
    return drey_call_peer_is(((sub_check *)door)->call, id, len);
}

static const drey_request_ops sub_door = {.metadata = sub_metadata, .peer = sub_peer, .peer_is = sub_peer_is};

/* An ingress node subscribes for one client's watch: attached to this
 * node's feed like a watch of its own, outside the chain and outside every
 * principal's count (the ingress admitted and counts the watch; the peer
 * is a node, by its certificate). The caller is checked again here all
 * the same, with this node's keys and policy, as a forwarded call is: the
 * ingress's check is an optimisation, this one the guard. */
static void on_subscribe(void *ctx, drey_call *call, const ProtobufCMessage *request) {
    drey_watch *w = ctx;
    if (request == NULL || drey_call_user(call) != NULL)
        return; /* the half-close */
    const Drey__Internal__V1__SubscribeRequest *in = (const void *)request;
    if (in->node == NULL || !drey_call_peer_is(call, in->node, strlen(in->node))) {
        sub_refuse(call, DREY_ERR_PEER_UNAUTHENTICATED);
        return;
    }
    pthread_mutex_lock(&w->mu);
    uint32_t n_parts = w->has_cluster ? w->cluster.partitions(w->cluster.ctx) : 0;
    pthread_mutex_unlock(&w->mu);
    if (in->watch == NULL || n_parts == 0 || in->partition_count != n_parts ||
        (in->watch->n_keys > 0 && in->watch->prefix[0] != '\0')) {
        sub_refuse(call, n_parts == 0 ? DREY_ERR_RECOVERING : DREY_ERR_MALFORMED_REQUEST);
        return;
    }
    stream *s = drey_watch__stream_new(w, call, 2, in->watch); /* the call's (until on_done), and this function's */
    s->sub = true;
    drey_call_set_user(call, s);
    sub_check check = {.call = call, .node = in->node};
    drey_request_init(&s->req, &sub_door, &check, &s->arena, &w->method, &s->msg->base, s->bytes, s->len);
    const drey_status *refused = drey_pipeline_authorize(w->opts.pipeline, &s->req);
    s->req.door = NULL; /* check lives in this frame only */
    if (refused != NULL) {
        sub_end(s, refused);
        return;
    }
    uint8_t *parts = drey_arena_calloc(&s->arena, n_parts / 8 + 1);
    for (size_t i = 0; i < in->n_partitions; i++) {
        if (in->partitions[i] < n_parts)
            parts[in->partitions[i] / 8] |= (uint8_t)(1u << (in->partitions[i] % 8));
    }
    s->parts = parts;
    s->n_parts = n_parts;
    drey_watch__set_filter(s);
    pthread_mutex_lock(&w->mu);
    /* The ingress may have gone meanwhile (on_done): then never touch the call. */
    if (w->stopping || !w->started) {
        drey_status st = drey_status_of(w->stopping ? DREY_ERR_CANCELLED : DREY_ERR_RECOVERING);
        pthread_mutex_unlock(&w->mu);
        sub_end(s, &st);
        return;
    }
    drey_watch__recording_begin_locked(w);
    pthread_mutex_lock(&s->mu);
    bool gone = s->done;
    if (!gone) {
        s->state = S_ATTACHED;
        s->hello_pending = true; /* the ingress counts it in place from here */
        s->hello_seq = w->seq;
        drey_watch__attach_locked(s, &w->streams, &w->n_streams);
        w->n_subs++;
    }
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_unlock(&w->mu);
    if (!gone)
        drey_watch__flush(s);
    drey_watch__stream_unref(s); /* this function's */
}

bool drey_watch_register_internal(drey_watch *w, drey_server *internal) {
    return drey_watch__add_method(w, internal, SUBSCRIBE_PATH, &drey__internal__v1__subscribe_request__descriptor,
                                  on_subscribe);
}

void drey_watch_set_cluster(drey_watch *w, const drey_watch_cluster *c) {
    pthread_mutex_lock(&w->mu);
    w->cluster = *c;
    w->has_cluster = true;
    pthread_mutex_unlock(&w->mu);
}

/* --- clusters: the ingress's end, fed by the cluster ---------------------- */

static wevent *blob_event(uint8_t kind, const void *data, size_t len) {
    wevent *e = drey_xcalloc(1, sizeof *e + len + 1);
    atomic_init(&e->refs, 1);
    e->bytes = sizeof *e + len;
    e->value_len = (uint32_t)len;
    e->kind = kind;
    if (len > 0)
        memcpy(e->data, data, len);
    return e;
}

/* Queues e on a remote stream; needs nothing locked. */
static void remote_push(stream *s, wevent *e, bool watching, bool marker, const char *reason) {
    drey_watch *w = s->w;
    pthread_mutex_lock(&w->mu);
    pthread_mutex_lock(&s->mu);
    if (!s->done && marker && s->held) {
        if (watching) { /* before it, nothing was promised: a RESYNC_REQUIRED says nothing */
            /* The first message; the events buffered meanwhile follow it. */
            s->held = false;
            if (s->msg->resume_feed != 0) {
                s->resync_pending = true;
                s->resync_seq = 0;
                s->resync_reason = "HISTORY_UNAVAILABLE";
            } else {
                s->hello_pending = true;
                s->hello_seq = 0;
            }
            drey_watch__kick_locked(w, s);
        }
    } else if (!s->done) {
        if (marker && !watching && s->episode == NULL)
            s->episode = reason;
        else if (marker && watching)
            s->episode = NULL;
        if (e != NULL)
            drey_watch__push(w, s, e);
        drey_watch__kick_locked(w, s);
    }
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_unlock(&w->mu);
    drey_watch__event_unref(e);
}

void drey_watch_deliver(drey_watch_stream *ws, const uint8_t *event, size_t len) {
    remote_push((stream *)ws, blob_event(EV_RAW, event, len), false, false, NULL);
}

void drey_watch_lost(drey_watch_stream *ws) {
    stream *s = (stream *)ws;
    /* Before the first WATCHING nothing was promised; while one is owed the
     * client re-reads after it anyway. */
    pthread_mutex_lock(&s->mu);
    bool moot = s->held || s->episode != NULL;
    pthread_mutex_unlock(&s->mu);
    if (!moot)
        remote_push(s, blob_event(EV_RESYNC, "BUFFER_OVERFLOW", strlen("BUFFER_OVERFLOW")), false, false, NULL);
}

void drey_watch_mark(drey_watch_stream *ws, bool watching, const char *reason) {
    stream *s = (stream *)ws;
    if (reason == NULL)
        reason = "";
    /* A RESYNC_REQUIRED while one is owed its WATCHING adds nothing. */
    pthread_mutex_lock(&s->mu);
    bool redundant = !watching && !s->held && s->episode != NULL;
    pthread_mutex_unlock(&s->mu);
    if (redundant)
        return;
    wevent *e = blob_event(watching ? EV_WATCHING : EV_RESYNC, reason, strlen(reason));
    remote_push(s, e, watching, true, reason);
}

void drey_watch_end(drey_watch_stream *ws, const drey_call_answer *owner_status) {
    stream *s = (stream *)ws;
    pthread_mutex_lock(&s->mu);
    if (!s->done) /* a call ends once: whatever ended it first stands */
        drey_call_finish_relay(s->call, owner_status);
    pthread_mutex_unlock(&s->mu);
}
