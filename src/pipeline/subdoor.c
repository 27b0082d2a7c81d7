/*
 * subdoor — the door of one request of many on a stream; see
 * include/drey/pipeline.h.
 */
#include "drey/pipeline.h"

void drey_subdoor_init(drey_subdoor *d, const drey_subdoor_stream *stream, pthread_mutex_t *mu,
                       int64_t deadline_ns) {
    *d = (drey_subdoor){.stream = stream, .mu = mu, .deadline_ns = deadline_ns};
    atomic_init(&d->answered, false);
}

bool drey_subdoor_cancel_locked(drey_subdoor *d, void (**fn)(void *arg), void **arg) {
    if (d->gone || atomic_load(&d->answered))
        return false;
    d->gone = true;
    *fn = d->cancel_fn;
    *arg = d->cancel_arg;
    d->cancel_fn = NULL;
    return true;
}

void drey_subdoor_answered_locked(drey_subdoor *d) {
    atomic_store(&d->answered, true);
    d->cancel_fn = NULL;
}

static void sub_reply(void *door, const ProtobufCMessage *response) {
    drey_subdoor *d = door;
    atomic_store(&d->answered, true);
    d->stream->reply(d, response);
}

static void sub_fail(void *door, const drey_status *st) {
    drey_subdoor *d = door;
    atomic_store(&d->answered, true);
    d->stream->fail(d, st);
}

static void sub_relay(void *door, const drey_answer *a) {
    drey_subdoor *d = door;
    atomic_store(&d->answered, true);
    d->stream->relay(d, a);
}

static const char *sub_metadata(void *door, const char *key, size_t *len) {
    drey_subdoor *d = door;
    return d->stream->metadata(d, key, len);
}

static const char *sub_peer(void *door) {
    drey_subdoor *d = door;
    return d->stream->peer(d);
}

static int64_t sub_deadline(void *door) {
    return ((drey_subdoor *)door)->deadline_ns;
}

/* Set while the request runs; run at once if the caller is already gone
 * (the stream ended, or the opener cancelled it, before the hook was set). */
static void sub_on_cancel(void *door, void (*fn)(void *arg), void *arg) {
    drey_subdoor *d = door;
    if (d->mu == NULL)
        return; /* a caller that cannot go away (this node's own call) */
    pthread_mutex_lock(d->mu);
    bool now = d->gone && !atomic_load(&d->answered);
    if (!now) {
        d->cancel_fn = fn;
        d->cancel_arg = arg;
    }
    pthread_mutex_unlock(d->mu);
    if (now)
        fn(arg);
}

static bool sub_peer_is(void *door, const char *id, size_t len) {
    drey_subdoor *d = door;
    return d->stream->peer_is(d, id, len);
}

#define SUBDOOR_OPS                                                                                                    \
    .reply = sub_reply, .fail = sub_fail, .relay = sub_relay, .metadata = sub_metadata, .peer = sub_peer,              \
    .deadline_mono_ns = sub_deadline, .on_cancel = sub_on_cancel

const drey_request_ops drey_subdoor_ops = {SUBDOOR_OPS};
const drey_request_ops drey_subdoor_peer_ops = {SUBDOOR_OPS, .peer_is = sub_peer_is};
