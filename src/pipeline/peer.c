/*
 * peer — the peer stream as a door into the chain (the owner's end).
 *
 * A forwarding node keeps one drey.internal.v1.Peer/Forward stream open to
 * this node's internal listener (proto/drey/internal/v1/peer.proto). Each
 * Call frame on it becomes a request, in an arena of its own (the stream's
 * message arena is reset after every message), whose metadata are the
 * frame's headers, whose deadline is the frame's timeout from arrival, and
 * whose peer identity is the stream's: peer_is asks the stream's mutual TLS
 * certificate, so the chain's forwarding rules (admission.c `forwarded`)
 * apply to a frame exactly as to a unary call on this listener.
 *
 * Answers go back as Answer frames. Those produced while the stream's
 * message is being handled (a Get answers inside the chain) are collected
 * and written as one stream message after the last frame; those produced
 * in a batch (the writes one fdatasync made durable: a backup's records)
 * at the batch's end; the others as they come.
 *
 * The request is cancelled (its on_cancel hook runs) by a Cancel frame for
 * its id, or when the stream ends before it is answered: the opener has
 * failed it already and nobody will read the answer.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/internal/v1/peer.pb-c.h"
#include "drey/list.h"
#include "stages.h"

#define DOOR_ARENA_INLINE 4096
#define FORWARD_PATH "/drey.internal.v1.Peer/Forward"

typedef struct door door;
typedef struct stream stream;

/* Every open stream, so that a stopping node can end them. */
struct peer_streams {
    drey_pipeline *pipeline;
    pthread_mutex_t mu;
    drey_list streams; /* of stream */
    bool draining;
};

struct stream {
    struct peer_streams *all;
    drey_link link;      /* in all->streams, under all->mu */
    drey_pipeline *pipeline;
    drey_call *call;     /* valid until closed */
    pthread_mutex_t mu;
    _Atomic int refs;    /* the call's (until it is over), one per request in flight */
    bool closed;         /* the call is over: answers go nowhere */
    bool half_closed;    /* the opener sends no more: finish once all are answered */
    drey_list doors;     /* requests in flight */
    char conn[32];
    /* Answers collected while a stream message is handled, or until the
     * end of a batch (which holds a reference), under mu. */
    bool collecting;
    bool flush_deferred;
    uint8_t *out;
    size_t out_len, out_cap;
};

struct door {
    drey_subdoor sd;   /* first: the request's door; its fields under s->mu */
    stream *s;
    drey_link link;    /* in s->doors, under s->mu */
    uint64_t id;
    Drey__Internal__V1__Header **headers; /* in the arena */
    size_t n_headers;
    _Atomic int refs;  /* the request's, and a cancel hook's while it runs */
    drey_request r;
    drey_arena arena;
    char arena_buf[DOOR_ARENA_INLINE];
};

/* The thread handling a stream message, for collecting its answers. */
static _Thread_local stream *handling;

static void stream_unref(stream *s) {
    if (atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    pthread_mutex_destroy(&s->mu);
    free(s->out);
    free(s);
}

static void door_unref(door *d) {
    if (atomic_fetch_sub(&d->refs, 1) != 1)
        return;
    stream *s = d->s;
    drey_arena_destroy(&d->arena);
    free(d);
    stream_unref(s);
}

/* Appends one frame, as a one-frame Frames (they concatenate), to s->out;
 * needs s->mu. */
static void append_locked(stream *s, const Drey__Internal__V1__Frame *f) {
    Drey__Internal__V1__Frames fs = DREY__INTERNAL__V1__FRAMES__INIT;
    Drey__Internal__V1__Frame *one = (Drey__Internal__V1__Frame *)f;
    fs.n_frames = 1;
    fs.frames = &one;
    size_t n = drey__internal__v1__frames__get_packed_size(&fs);
    if (s->out_len + n > s->out_cap) {
        s->out_cap = (s->out_len + n) * 2;
        s->out = drey_xrealloc(s->out, s->out_cap, 1);
    }
    drey__internal__v1__frames__pack(&fs, s->out + s->out_len);
    s->out_len += n;
}

/* Writes what was collected; needs s->mu. */
static void flush_locked(stream *s) {
    if (s->out_len == 0)
        return;
    if (!s->closed)
        drey_call_send_bytes(s->call, s->out, s->out_len);
    s->out_len = 0;
}

static void finish_if_done_locked(stream *s) {
    if (s->half_closed && drey_list_empty(&s->doors) && !s->closed && !s->collecting) {
        flush_locked(s);
        drey_call_finish(s->call, NULL);
    }
}


/* The end of a batch that answered requests of s. */
static void flush_later(void *arg) {
    stream *s = arg;
    pthread_mutex_lock(&s->mu);
    s->flush_deferred = false;
    flush_locked(s);
    pthread_mutex_unlock(&s->mu);
    stream_unref(s);
}

/* Sends the answer for d's frame and lets the request go. */
static void answer(door *d, const Drey__Internal__V1__Answer *a) {
    stream *s = d->s;
    Drey__Internal__V1__Frame f = DREY__INTERNAL__V1__FRAME__INIT;
    f.id = d->id;
    f.body_case = DREY__INTERNAL__V1__FRAME__BODY_ANSWER;
    f.answer = (Drey__Internal__V1__Answer *)a;
    pthread_mutex_lock(&s->mu);
    drey_subdoor_answered_locked(&d->sd);
    drey_list_remove(&s->doors, &d->link);
    if (!s->closed) {
        append_locked(s, &f);
        if (handling == s || s->flush_deferred) {
            /* written at the end of the message or of the batch */
        } else if (drey_pipeline_batch_defer(flush_later, s)) {
            s->flush_deferred = true;
            atomic_fetch_add(&s->refs, 1);
        } else {
            flush_locked(s);
        }
    }
    finish_if_done_locked(s);
    pthread_mutex_unlock(&s->mu);
    door_unref(d);
}

static void fail_status(door *d, const drey_status *st) {
    Drey__Internal__V1__Answer a = DREY__INTERNAL__V1__ANSWER__INIT;
    a.code = (int32_t)drey_status_code(st);
    a.message = (char *)drey_status_message(st);
    uint8_t *details;
    size_t len;
    drey_status_encode(st, &d->arena, &details, &len);
    a.details = (ProtobufCBinaryData){.len = len, .data = details};
    answer(d, &a);
}

static void door_reply(drey_subdoor *sd, const ProtobufCMessage *response) {
    door *d = (door *)sd;
    Drey__Internal__V1__Answer a = DREY__INTERNAL__V1__ANSWER__INIT;
    size_t n = protobuf_c_message_get_packed_size(response);
    uint8_t *buf = drey_arena_alloc(&d->arena, n ? n : 1);
    protobuf_c_message_pack(response, buf);
    a.response = (ProtobufCBinaryData){.len = n, .data = buf};
    answer(d, &a);
}

static void door_fail(drey_subdoor *sd, const drey_status *st) {
    fail_status((door *)sd, st);
}

static void door_relay(drey_subdoor *sd, const drey_answer *in) {
    door *d = (door *)sd;
    Drey__Internal__V1__Answer a = DREY__INTERNAL__V1__ANSWER__INIT;
    a.code = in->code;
    a.message = drey_arena_strndup(&d->arena, in->message != NULL ? in->message : "", in->message_len);
    a.details = (ProtobufCBinaryData){.len = in->details_len, .data = (uint8_t *)in->details};
    a.response = (ProtobufCBinaryData){.len = in->response_len, .data = (uint8_t *)in->response};
    answer(d, &a);
}

static const char *door_metadata(drey_subdoor *sd, const char *key, size_t *len) {
    door *d = (door *)sd;
    for (size_t i = 0; i < d->n_headers; i++) {
        if (strcmp(d->headers[i]->key, key) == 0) {
            *len = d->headers[i]->value.len;
            return (const char *)d->headers[i]->value.data;
        }
    }
    return NULL;
}

static const char *door_peer(drey_subdoor *sd) {
    return ((door *)sd)->s->conn;
}

static bool door_peer_is(drey_subdoor *sd, const char *id, size_t len) {
    stream *s = ((door *)sd)->s;
    /* Under mu: the call stays valid while the stream is not closed. */
    pthread_mutex_lock(&s->mu);
    bool ok = !s->closed && drey_call_peer_is(s->call, id, len);
    pthread_mutex_unlock(&s->mu);
    return ok;
}

static const drey_subdoor_stream peer_stream = {.reply = door_reply, .fail = door_fail, .relay = door_relay,
                                                .metadata = door_metadata, .peer = door_peer,
                                                .peer_is = door_peer_is};

/* Marks d cancelled and runs its hook (outside the lock, holding a
 * reference so that an answer meanwhile cannot free it); needs s->mu,
 * which it releases and takes again. */
static void cancel_locked(stream *s, door *d) {
    void (*fn)(void *) = NULL;
    void *arg = NULL;
    if (!drey_subdoor_cancel_locked(&d->sd, &fn, &arg) || fn == NULL)
        return;
    atomic_fetch_add(&d->refs, 1);
    pthread_mutex_unlock(&s->mu);
    fn(arg);
    door_unref(d);
    pthread_mutex_lock(&s->mu);
}

static void refuse(door *d, drey_error e) {
    drey_status st = drey_status_of(e);
    fail_status(d, &st);
}

static void on_call(stream *s, uint64_t id, const Drey__Internal__V1__Call *c) {
    drey_pipeline *p = s->pipeline;
    door *d = drey_xmalloc(sizeof *d);
    memset(d, 0, offsetof(door, arena_buf));
    d->s = s;
    d->id = id;
    atomic_store(&d->refs, 1);
    atomic_fetch_add(&s->refs, 1);
    drey_arena_init(&d->arena, d->arena_buf, sizeof d->arena_buf);
    int64_t now = drey_mono_ns();
    drey_subdoor_init(&d->sd, &peer_stream, &s->mu,
                      c->timeout_us <= 0 || c->timeout_us > (INT64_MAX - now) / 1000 ? INT64_MAX
                                                                                     : now + c->timeout_us * 1000);
    pthread_mutex_lock(&s->mu);
    drey_list_push(&s->doors, &d->link);
    pthread_mutex_unlock(&s->mu);

    const drey_method *m = drey_method_find(drey_pipeline__options(p)->methods, c->method);
    if (m == NULL) {
        refuse(d, DREY_ERR_UNKNOWN_METHOD);
        return;
    }
    if (c->timeout_us < 0) {
        refuse(d, DREY_ERR_DEADLINE_EXCEEDED);
        return;
    }
    /* The frame lives in the stream's message arena: keep copies. */
    d->n_headers = c->n_headers;
    d->headers = drey_arena_alloc(&d->arena, (c->n_headers ? c->n_headers : 1) * sizeof *d->headers);
    for (size_t i = 0; i < c->n_headers; i++) {
        Drey__Internal__V1__Header *h = drey_arena_alloc(&d->arena, sizeof *h);
        *h = *c->headers[i];
        h->key = drey_arena_strndup(&d->arena, c->headers[i]->key, strlen(c->headers[i]->key));
        h->value.data = drey_arena_alloc(&d->arena, h->value.len ? h->value.len : 1);
        if (h->value.len > 0) /* empty bytes decode as NULL */
            memcpy(h->value.data, c->headers[i]->value.data, h->value.len);
        d->headers[i] = h;
    }
    size_t len = c->request.len;
    uint8_t *bytes = drey_arena_alloc(&d->arena, len ? len : 1);
    if (len > 0) /* an empty request (ListCaches) decodes as NULL */
        memcpy(bytes, c->request.data, len);
    /* The forwarding node decoded it first, with the public listener's
     * nesting guard, and a peer is an authenticated node of this cluster. */
    ProtobufCMessage *msg =
        protobuf_c_message_unpack(m->desc->input, drey_arena_protobuf_allocator(&d->arena), len, bytes);
    if (msg == NULL) {
        refuse(d, DREY_ERR_MALFORMED_REQUEST);
        return;
    }
    drey_request_init(&d->r, &drey_subdoor_peer_ops, &d->sd, &d->arena, m, msg, bytes, len);
    drey_pipeline_submit(p, &d->r);
}

static void on_cancel_frame(stream *s, uint64_t id) {
    pthread_mutex_lock(&s->mu);
    for (door *d = DREY_LIST_ITEM(s->doors.head, door, link); d != NULL; d = DREY_LIST_ITEM(d->link.next, door, link)) {
        if (d->id == id) {
            cancel_locked(s, d);
            break;
        }
    }
    pthread_mutex_unlock(&s->mu);
}

static void on_message(void *ctx, drey_call *call, const ProtobufCMessage *msg) {
    struct peer_streams *all = ctx;
    stream *s = drey_call_user(call);
    if (s == NULL) {
        s = drey_xcalloc(1, sizeof *s);
        s->all = all;
        s->pipeline = all->pipeline;
        s->call = call;
        pthread_mutex_init(&s->mu, NULL);
        atomic_store(&s->refs, 1);
        const char *conn = drey_call_connection(call);
        strncpy(s->conn, conn, sizeof s->conn - 1);
        drey_call_set_user(call, s);
        pthread_mutex_lock(&all->mu);
        s->half_closed = all->draining;
        drey_list_push(&all->streams, &s->link);
        pthread_mutex_unlock(&all->mu);
    }
    if (msg == NULL) {
        pthread_mutex_lock(&s->mu);
        s->half_closed = true;
        finish_if_done_locked(s);
        pthread_mutex_unlock(&s->mu);
        return;
    }
    const Drey__Internal__V1__Frames *fs = (const void *)msg;
    pthread_mutex_lock(&s->mu);
    s->collecting = true;
    pthread_mutex_unlock(&s->mu);
    handling = s;
    for (size_t i = 0; i < fs->n_frames; i++) {
        const Drey__Internal__V1__Frame *f = fs->frames[i];
        if (f->body_case == DREY__INTERNAL__V1__FRAME__BODY_CALL)
            on_call(s, f->id, f->call);
        else if (f->body_case == DREY__INTERNAL__V1__FRAME__BODY_CANCEL)
            on_cancel_frame(s, f->id);
        /* Answers are the opener's to receive; anything else is newer than
         * this build and is ignored. */
    }
    handling = NULL;
    pthread_mutex_lock(&s->mu);
    s->collecting = false;
    flush_locked(s);
    finish_if_done_locked(s);
    pthread_mutex_unlock(&s->mu);
}

static void on_done(void *ctx, drey_call *call) {
    struct peer_streams *all = ctx;
    stream *s = drey_call_user(call);
    if (s == NULL)
        return;
    pthread_mutex_lock(&all->mu);
    drey_list_remove(&all->streams, &s->link);
    pthread_mutex_unlock(&all->mu);
    pthread_mutex_lock(&s->mu);
    s->closed = true;
    s->out_len = 0;
    /* Nobody will read their answers; a request that waits stops waiting.
     * Each is held while its hook runs outside the lock, and the list may
     * change meanwhile, so take them all first. */
    size_t n = 0;
    for (drey_link *l = s->doors.head; l != NULL; l = l->next)
        n++;
    door **live = drey_xmalloc((n ? n : 1) * sizeof *live);
    n = 0;
    for (door *d = DREY_LIST_ITEM(s->doors.head, door, link); d != NULL; d = DREY_LIST_ITEM(d->link.next, door, link)) {
        atomic_fetch_add(&d->refs, 1);
        live[n++] = d;
    }
    for (size_t i = 0; i < n; i++) {
        cancel_locked(s, live[i]);
        pthread_mutex_unlock(&s->mu);
        door_unref(live[i]);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    free(live);
    stream_unref(s);
}

void drey_pipeline_drain_peers(drey_pipeline *p) {
    struct peer_streams *all = drey_pipeline__peers(p);
    if (all == NULL)
        return;
    pthread_mutex_lock(&all->mu);
    all->draining = true;
    for (stream *s = DREY_LIST_ITEM(all->streams.head, stream, link); s != NULL;
         s = DREY_LIST_ITEM(s->link.next, stream, link)) {
        pthread_mutex_lock(&s->mu);
        s->half_closed = true;
        finish_if_done_locked(s);
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_unlock(&all->mu);
}

void drey_pipeline__free_peers(struct peer_streams *all) {
    if (all == NULL)
        return;
    pthread_mutex_destroy(&all->mu);
    free(all);
}

bool drey_pipeline__serve_peers(drey_pipeline *p, drey_server *s) {
    struct peer_streams *all = drey_xcalloc(1, sizeof *all);
    all->pipeline = p;
    pthread_mutex_init(&all->mu, NULL);
    drey_pipeline__set_peers(p, all);
    drey_server_method sm = {
        .path = FORWARD_PATH,
        .input = &drey__internal__v1__frames__descriptor,
        .client_streaming = true,
        .server_streaming = true,
        .concatenate_sends = true, /* serialized Frames concatenate */
        .on_message = on_message,
        .on_done = on_done,
        .ctx = all,
    };
    return drey_server_add_method(s, &sm);
}
