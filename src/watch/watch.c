/*
 * watch — the change-feed hub and the Watch streams; see include/drey/watch.h.
 *
 * Locks, always in this order: the hub's mutex (feed numbering, history,
 * the stream list, the kick list, principal counts), then a stream's mutex
 * (its buffer and what it has handed to the transport), then the call's
 * own. The store calls the hub with a shard lock held, before all of them.
 *
 * An event is one allocation shared by the history and every buffer that
 * holds it (reference-counted), charged in full to each holder's bound: it
 * is the memory a stuck reader pins.
 *
 * A stream is sending while it has handed messages to the transport and
 * not yet heard (on_sent) that they left; then its next messages go from
 * that completion. An idle stream that gets an event is put on the kick
 * list for the delivery thread. At most one thread builds a stream's
 * messages at a time (`busy`, outside its mutex so publishers never wait
 * for an encoding), so they leave in buffer order.
 */
#include "drey/watch.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "drey/alloc.h"
#include "drey/cache.h"
#include "drey/cache/v1/cache.pb-c.h"
#include "drey/clock.h"
#include "drey/internal/v1/subscribe.pb-c.h"
#include "drey/log.h"
#include "drey/metrics.h"
#include "drey/placement.h"
#include "drey/thread.h"

#define WATCH_PATH "/drey.cache.v1.Cache/Watch"
#define SUBSCRIBE_PATH "/drey.internal.v1.Subscriber/Subscribe"
/* Messages handed to the transport at once: enough to keep a stream busy
 * between completions, few enough that the transport's queue stays small. */
#define SEND_BATCH 32
#define PRINCIPAL_BUCKETS 256

typedef struct wevent {
    _Atomic int refs;
    struct wevent *hnext; /* history, oldest first */
    uint64_t seq;
    uint64_t version;
    int64_t expires_at_ms;
    size_t bytes;         /* charged to each holder */
    uint32_t value_len;
    uint16_t key_len;
    uint8_t cache_len;
    uint8_t kind;         /* drey_store_change_kind, or EV_* */
    uint8_t value_kind;
    char data[];          /* cache, key, value */
} wevent;

/* What a cluster watch's buffer holds besides the store's kinds: an
 * owner's event as it came (data: its serialized WatchEvent, value_len
 * bytes) and the ingress's own markers (data: the reason, NUL-terminated). */
#define EV_RAW 100
#define EV_WATCHING 101
#define EV_RESYNC 102

static void event_unref(wevent *e) {
    if (e != NULL && atomic_fetch_sub_explicit(&e->refs, 1, memory_order_acq_rel) == 1)
        free(e);
}

typedef struct principal_count {
    struct principal_count *next;
    uint32_t n;
    char name[];
} principal_count;

typedef struct stream stream;

struct drey_watch {
    drey_watch_options opts;
    drey_store_observer observer;
    drey_method method; /* how the chain sees a Watch */
    uint64_t feed;

    pthread_mutex_t mu;
    pthread_cond_t cond;
    _Atomic bool recording;
    bool started, stopping, thread_running;
    pthread_t thread;
    uint64_t seq;          /* the last number given */
    uint64_t history_from; /* every event after it is in the history */
    wevent *hhead, *htail;
    size_t hbytes, hcount;
    int64_t idle_since_ms; /* monotonic; when the last stream closed */
    stream *streams;       /* attached to the feed: clients' watches, owner subscriptions */
    size_t n_streams;
    size_t n_subs;         /* of them, subscriptions */
    stream *remotes;       /* clients' watches of a cluster (fed by the cluster) */
    size_t n_remote;
    drey_watch_cluster cluster;
    bool has_cluster;
    stream *kick_head, *kick_tail;
    principal_count *principals[PRINCIPAL_BUCKETS];
    uint64_t events, resyncs;
};

typedef enum { S_ADMITTING, S_ATTACHED, S_REFUSED } stream_state;

struct stream {
    drey_watch *w;
    drey_call *call;
    _Atomic int refs; /* the call's (until on_done), the chain's (until answered), a kick's */
    drey_arena arena; /* the request and the chain's memory */
    drey_request req;
    Drey__Cache__V1__WatchRequest *msg;
    char *principal;  /* counted against its limit while attached */

    /* Filter (fixed once attached). */
    const char *cache;
    size_t cache_len;
    const char **keys; /* sorted */
    size_t *key_lens;
    size_t n_keys;
    const char *prefix;
    size_t prefix_len;
    bool values;

    pthread_mutex_t mu;
    pthread_cond_t idle; /* busy went false */
    stream_state state;
    bool done;          /* on_done ran: never touch the call again */
    void (*cancel_fn)(void *arg);
    void *cancel_arg;
    wevent **ring;      /* buffer */
    size_t ring_cap, ring_head, ring_n, ring_bytes;
    bool hello_pending; /* WATCHING, first */
    uint64_t hello_seq;
    bool resync_pending;
    uint64_t resync_seq;
    const char *resync_reason;
    bool sending;       /* handed messages the transport has not reported gone */
    bool busy;          /* a thread builds and sends messages outside mu */
    bool drained;       /* on_sent came while busy */
    bool kicked;

    /* Clusters. A remote stream is a client's watch the cluster feeds
     * (drey_watch_deliver, drey_watch_mark); a subscription is an ingress
     * node's share of one, served from this node's feed. */
    bool remote, sub;
    bool held;          /* remote: nothing is sent before the first WATCHING */
    const char *episode; /* remote: the RESYNC_REQUIRED whose WATCHING is still owed */
    bool opening;       /* remote: the cluster's open has not returned */
    void *handle;       /* remote: the cluster's */
    const uint8_t *parts; /* subscription: bitmap of the partitions asked for */
    uint32_t n_parts;

    stream *prev, *next;  /* the hub's attached streams, or its remotes */
    stream *kick_next;
};

static void stream_unref(stream *s) {
    if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1)
        return;
    for (size_t i = 0; i < s->ring_n; i++)
        event_unref(s->ring[(s->ring_head + i) % s->ring_cap]);
    free(s->ring);
    free(s->principal);
    pthread_cond_destroy(&s->idle);
    pthread_mutex_destroy(&s->mu);
    drey_arena_destroy(&s->arena);
    free(s);
}

/* --- principals --------------------------------------------------------- */

static principal_count **principal_slot(drey_watch *w, const char *name) {
    uint64_t h = 1469598103934665603ULL;
    for (const char *p = name; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ULL;
    principal_count **pp = &w->principals[h % PRINCIPAL_BUCKETS];
    while (*pp != NULL && strcmp((*pp)->name, name) != 0)
        pp = &(*pp)->next;
    return pp;
}

/* Under w->mu. */
static bool principal_take(drey_watch *w, const char *name) {
    principal_count **pp = principal_slot(w, name);
    if (*pp == NULL) {
        size_t len = strlen(name);
        principal_count *pc = drey_xcalloc(1, sizeof *pc + len + 1);
        memcpy(pc->name, name, len + 1);
        *pp = pc;
    }
    if ((*pp)->n >= w->opts.max_per_principal)
        return false;
    (*pp)->n++;
    return true;
}

/* Under w->mu. */
static void principal_give(drey_watch *w, const char *name) {
    principal_count **pp = principal_slot(w, name);
    if (*pp == NULL)
        return;
    if (--(*pp)->n == 0) {
        principal_count *pc = *pp;
        *pp = pc->next;
        free(pc);
    }
}

/* --- filters ------------------------------------------------------------ */

static int key_cmp(const char *a, size_t al, const char *b, size_t bl) {
    int c = memcmp(a, b, al < bl ? al : bl);
    return c != 0 ? c : (al > bl) - (al < bl);
}

static bool stream_wants(const stream *s, const wevent *e) {
    if (e->cache_len != s->cache_len || memcmp(e->data, s->cache, s->cache_len) != 0)
        return false;
    if (e->kind == DREY_STORE_CHANGE_CLEAR)
        return true;
    const char *key = e->data + e->cache_len;
    if (s->n_keys > 0) {
        size_t lo = 0, hi = s->n_keys;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            int c = key_cmp(s->keys[mid], s->key_lens[mid], key, e->key_len);
            if (c == 0)
                return true;
            if (c < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        return false;
    }
    return e->key_len >= s->prefix_len && memcmp(key, s->prefix, s->prefix_len) == 0;
}

/* A subscription reports the partitions it asked for, and of them only
 * what this node owns at the moment of the change: a copy being received
 * (a move's imports) or handed over (its drop) is never reported. *part
 * caches the event's partition across streams (every subscription names
 * the cluster's count). */
static bool sub_wants(drey_watch *w, const stream *s, const wevent *e, int64_t *part) {
    if (e->kind == DREY_STORE_CHANGE_CLEAR)
        return true;
    if (*part < 0)
        *part = drey_placement_partition(e->data, e->cache_len, e->data + e->cache_len, e->key_len, s->n_parts);
    uint32_t p = (uint32_t)*part;
    return p < s->n_parts && (s->parts[p / 8] >> (p % 8) & 1) != 0 && w->has_cluster &&
           w->cluster.owns(w->cluster.ctx, p);
}

/* --- buffers ------------------------------------------------------------ */

/* Under w->mu and s->mu: queues the stream for the delivery
 * thread if nothing will send its buffer otherwise. */
static void kick_locked(drey_watch *w, stream *s) {
    if (s->sending || s->busy || s->kicked || s->done)
        return;
    s->kicked = true;
    atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
    s->kick_next = NULL;
    if (w->kick_tail != NULL)
        w->kick_tail->kick_next = s;
    else
        w->kick_head = s;
    w->kick_tail = s;
    pthread_cond_signal(&w->cond);
}

static void ring_clear(stream *s) {
    for (size_t i = 0; i < s->ring_n; i++)
        event_unref(s->ring[(s->ring_head + i) % s->ring_cap]);
    s->ring_head = s->ring_n = s->ring_bytes = 0;
}

/* Under s->mu: buffers e, or on overflow empties the buffer and owes the
 * reader one RESYNC_REQUIRED (which covers e too). */
static void stream_push(drey_watch *w, stream *s, wevent *e) {
    if (s->ring_n > 0 && s->ring_bytes + e->bytes > w->opts.buffer_bytes) {
        ring_clear(s);
        if (!s->resync_pending)
            w->resyncs++;
        s->resync_pending = true;
        s->resync_seq = e->seq;
        /* A cluster watch whose WATCHING is owed keeps saying so: the
         * marker it would have seen is gone with the buffer. */
        s->resync_reason = s->episode != NULL ? s->episode : "BUFFER_OVERFLOW";
        return;
    }
    if (s->ring_n == s->ring_cap) {
        size_t cap = s->ring_cap ? s->ring_cap * 2 : 16;
        wevent **r = drey_xcalloc(cap, sizeof *r);
        for (size_t i = 0; i < s->ring_n; i++)
            r[i] = s->ring[(s->ring_head + i) % s->ring_cap];
        free(s->ring);
        s->ring = r;
        s->ring_cap = cap;
        s->ring_head = 0;
    }
    atomic_fetch_add_explicit(&e->refs, 1, memory_order_relaxed);
    s->ring[(s->ring_head + s->ring_n) % s->ring_cap] = e;
    s->ring_n++;
    s->ring_bytes += e->bytes;
}

/* --- the feed ----------------------------------------------------------- */

/* Under w->mu. */
static void history_trim(drey_watch *w, size_t budget) {
    while (w->hhead != NULL && w->hbytes > budget) {
        wevent *e = w->hhead;
        w->hhead = e->hnext;
        if (w->hhead == NULL)
            w->htail = NULL;
        w->hbytes -= e->bytes;
        w->hcount--;
        w->history_from = e->seq;
        event_unref(e);
    }
}

static void observe(void *ctx, const drey_store_change *c) {
    drey_watch *w = ctx;
    if (!atomic_load(&w->recording))
        return;
    size_t vlen = c->kind == DREY_STORE_CHANGE_SET ? c->value.len : 0;
    wevent *e = drey_xmalloc(sizeof *e + c->cache_len + c->key_len + vlen);
    atomic_init(&e->refs, 1);
    e->hnext = NULL;
    e->version = c->version;
    e->expires_at_ms = c->expires_at_ms;
    e->bytes = sizeof *e + c->cache_len + c->key_len + vlen;
    e->value_len = (uint32_t)vlen;
    e->key_len = (uint16_t)c->key_len;
    e->cache_len = (uint8_t)c->cache_len;
    e->kind = (uint8_t)c->kind;
    e->value_kind = (uint8_t)c->value.kind;
    memcpy(e->data, c->cache, c->cache_len);
    if (c->key_len > 0)
        memcpy(e->data + c->cache_len, c->key, c->key_len);
    if (vlen > 0)
        memcpy(e->data + c->cache_len + c->key_len, c->value.data, vlen);

    pthread_mutex_lock(&w->mu);
    if (!atomic_load(&w->recording)) { /* stopped meanwhile */
        pthread_mutex_unlock(&w->mu);
        free(e);
        return;
    }
    e->seq = ++w->seq;
    w->events++;
    int64_t part = -1;
    for (stream *s = w->streams; s != NULL; s = s->next) {
        if (!stream_wants(s, e) || (s->sub && !sub_wants(w, s, e, &part)))
            continue;
        pthread_mutex_lock(&s->mu);
        stream_push(w, s, e);
        kick_locked(w, s);
        pthread_mutex_unlock(&s->mu);
    }
    if (w->opts.history_bytes > 0) {
        if (w->htail != NULL)
            w->htail->hnext = e;
        else
            w->hhead = e;
        w->htail = e;
        w->hbytes += e->bytes;
        w->hcount++;
        history_trim(w, w->opts.history_bytes); /* may drop e itself: then history_from says so */
    } else {
        w->history_from = e->seq;
        event_unref(e);
    }
    pthread_mutex_unlock(&w->mu);
}

/* Under w->mu: the first stream after a pause. Changes went unrecorded
 * meanwhile: a number is spent on the gap, so no position from before it
 * can resume. */
static void recording_begin_locked(drey_watch *w) {
    if (atomic_load(&w->recording))
        return;
    w->history_from = ++w->seq;
    atomic_store(&w->recording, true);
    /* Attached only now: an unwatched node's writes see a NULL observer.
     * A write that still saw none is complete in the store before this
     * watch's WATCHING can reach anyone (it held the key's shard lock), so
     * whatever a watcher reads after WATCHING already shows it. */
    drey_store_set_observer(w->opts.store, &w->observer);
}

static void recording_end_locked(drey_watch *w) {
    drey_store_set_observer(w->opts.store, NULL);
    atomic_store(&w->recording, false);
    history_trim(w, 0);
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
static void flush(stream *s) {
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
                event_unref(e);
            } else if (e != NULL && (e->kind == EV_WATCHING || e->kind == EV_RESYNC)) {
                marker_msg(s,
                           e->kind == EV_WATCHING ? DREY__CACHE__V1__WATCH_EVENT__KIND__WATCHING
                                                  : DREY__CACHE__V1__WATCH_EVENT__KIND__RESYNC_REQUIRED,
                           0, e->data, &a, &m);
                drey_call_send(s->call, &m.base);
                event_unref(e);
            } else if (e != NULL) {
                event_msg(s, e, &a, &m);
                drey_call_send(s->call, &m.base);
                event_unref(e);
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

static void *delivery_main(void *arg) {
    drey_watch *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        if (w->kick_head != NULL) {
            stream *s = w->kick_head;
            w->kick_head = s->kick_next;
            if (w->kick_head == NULL)
                w->kick_tail = NULL;
            pthread_mutex_lock(&s->mu);
            s->kicked = false;
            pthread_mutex_unlock(&s->mu);
            pthread_mutex_unlock(&w->mu);
            flush(s);
            stream_unref(s);
            pthread_mutex_lock(&w->mu);
            continue;
        }
        if (w->stopping)
            break;
        if (w->n_streams == 0 && atomic_load(&w->recording)) {
            int64_t end = w->idle_since_ms + w->opts.history_linger_ms;
            if (drey_mono_ms() >= end) {
                recording_end_locked(w);
                continue;
            }
            drey_cond_wait_until(&w->cond, &w->mu, drey_deadline_after_ms(end - drey_mono_ms()));
            continue;
        }
        pthread_cond_wait(&w->cond, &w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* --- the stream's life -------------------------------------------------- */

/* The chain's door. The chain answers once: reply (admitted: the stream
 * runs) or fail (refused: the call ends with the status). */
static void door_reply(void *door, const ProtobufCMessage *response) {
    (void)response;
    stream *s = door;
    flush(s);
    stream_unref(s);
}

static void door_fail(void *door, const drey_status *st) {
    stream *s = door;
    pthread_mutex_lock(&s->mu);
    s->state = S_REFUSED;
    s->cancel_fn = NULL;
    if (!s->done)
        drey_call_finish(s->call, st);
    pthread_mutex_unlock(&s->mu);
    stream_unref(s);
}

static void door_relay(void *door, const drey_answer *a) {
    (void)a; /* Watch is never forwarded: the route row passes it by (a cluster watch follows its owners) */
    drey_status st;
    drey_status_init(&st);
    drey_status_set(&st, DREY_ERR_INTERNAL);
    door_fail(door, &st);
}

static const char *door_metadata(void *door, const char *key, size_t *len) {
    stream *s = door;
    return drey_call_metadata(s->call, key, len);
}

static const char *door_peer(void *door) {
    stream *s = door;
    return drey_call_connection(s->call);
}

static int64_t door_deadline(void *door) {
    stream *s = door;
    return drey_call_deadline_mono_ns(s->call);
}

static void door_on_cancel(void *door, void (*fn)(void *arg), void *arg) {
    stream *s = door;
    pthread_mutex_lock(&s->mu);
    s->cancel_fn = fn;
    s->cancel_arg = arg;
    pthread_mutex_unlock(&s->mu);
}

static const drey_request_ops watch_door = {
    .reply = door_reply,
    .fail = door_fail,
    .relay = door_relay,
    .metadata = door_metadata,
    .peer = door_peer,
    .deadline_mono_ns = door_deadline,
    .on_cancel = door_on_cancel,
};

static void refuse(drey_request *r, drey_error e, const char *field) {
    drey_status *st = drey_arena_alloc(r->arena, sizeof *st);
    drey_status_init(st);
    if (field != NULL)
        drey_status_add_violation(st, e, "%s", field);
    else
        drey_status_set(st, e);
    drey_request_fail(r, st);
}

static int keys_order(const void *a, const void *b, void *ctx) {
    const stream *s = ctx;
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    return key_cmp(s->msg->keys[i], strlen(s->msg->keys[i]), s->msg->keys[j], strlen(s->msg->keys[j]));
}

static void set_filter(stream *s) {
    const Drey__Cache__V1__WatchRequest *m = s->msg;
    s->cache = m->cache;
    s->cache_len = strlen(m->cache);
    if (s->cache_len == 7 && memcmp(s->cache, "default", 7) == 0)
        s->cache_len = 0;
    s->prefix = m->prefix;
    s->prefix_len = strlen(m->prefix);
    s->values = m->include_values;
    s->n_keys = m->n_keys;
    if (m->n_keys > 0) {
        size_t *order = drey_arena_alloc(&s->arena, m->n_keys * sizeof *order);
        for (size_t i = 0; i < m->n_keys; i++)
            order[i] = i;
        qsort_r(order, m->n_keys, sizeof *order, keys_order, s);
        s->keys = drey_arena_alloc(&s->arena, m->n_keys * sizeof *s->keys);
        s->key_lens = drey_arena_alloc(&s->arena, m->n_keys * sizeof *s->key_lens);
        for (size_t i = 0; i < m->n_keys; i++) {
            s->keys[i] = m->keys[order[i]];
            s->key_lens[i] = strlen(s->keys[i]);
        }
    }
}

/* Clients' watches open on this node (under w->mu). */
static size_t clients_locked(const drey_watch *w) {
    return w->n_streams - w->n_subs + w->n_remote;
}

static void link_locked(stream **head, stream *s) {
    s->prev = NULL;
    s->next = *head;
    if (*head != NULL)
        (*head)->prev = s;
    *head = s;
}

static void unlink_locked(stream **head, stream *s) {
    if (s->prev != NULL)
        s->prev->next = s->next;
    else
        *head = s->next;
    if (s->next != NULL)
        s->next->prev = s->prev;
}

/* A cluster watch: counted here like any, fed by the cluster. The client
 * hears nothing until every owner's subscription is in place. */
static void attach_remote(drey_watch *w, stream *s, drey_request *r) {
    s->principal = drey_xstrdup(r->principal);
    pthread_mutex_lock(&s->mu);
    bool gone = s->done;
    if (!gone) {
        s->state = S_ATTACHED;
        s->cancel_fn = NULL;
        s->remote = true;
        s->held = true;
        s->opening = true;
        link_locked(&w->remotes, s);
        w->n_remote++;
        atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed); /* the hub's, until detached */
    }
    pthread_mutex_unlock(&s->mu);
    if (gone)
        principal_give(w, s->principal);
    drey_watch_cluster cl = w->cluster;
    pthread_mutex_unlock(&w->mu);
    if (!gone) {
        /* Outside the hub's mutex: the cluster feeds streams while holding
         * its own. The client may be gone meanwhile: whoever comes second,
         * this or on_done, closes. */
        void *h = cl.open(cl.ctx, (drey_watch_stream *)s, s->msg);
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

/* The end of the chain: the watch is admitted as a call; now the watch
 * limit, then the stream joins the feed. */
static void handle_watch(void *ctx, drey_request *r, const ProtobufCMessage *msg) {
    drey_watch *w = ctx;
    stream *s = r->door;
    (void)msg;
    if (s->msg->n_keys > 0 && s->msg->prefix[0] != '\0') {
        refuse(r, DREY_ERR_MALFORMED_REQUEST, "prefix");
        return;
    }
    set_filter(s);
    pthread_mutex_lock(&w->mu);
    /* A cluster node's watches follow the owners: not before it joined. */
    if (w->stopping || !w->started || (w->opts.clustered && !w->has_cluster)) {
        pthread_mutex_unlock(&w->mu);
        refuse(r, w->stopping ? DREY_ERR_CANCELLED : DREY_ERR_RECOVERING, NULL);
        return;
    }
    if (w->opts.max_streams > 0 && clients_locked(w) >= w->opts.max_streams) {
        pthread_mutex_unlock(&w->mu);
        drey_status *st = drey_arena_alloc(r->arena, sizeof *st);
        drey_status_init(st);
        drey_status_set(st, DREY_ERR_NODE_WATCH_LIMIT);
        drey_status_add_metadata(st, "limitWatches", "%u", w->opts.max_streams);
        snprintf(st->quota_subject, sizeof st->quota_subject, "node:%s", w->opts.node_id ? w->opts.node_id : "");
        st->quota_description = "the node has --max-watches watches open";
        st->retry_delay_ms = 1000;
        drey_request_fail(r, st);
        return;
    }
    if (!principal_take(w, r->principal)) {
        pthread_mutex_unlock(&w->mu);
        drey_status *st = drey_arena_alloc(r->arena, sizeof *st);
        drey_status_init(st);
        drey_status_set(st, DREY_ERR_PRINCIPAL_WATCH_LIMIT);
        drey_status_add_metadata(st, "limitWatches", "%u", w->opts.max_per_principal);
        snprintf(st->quota_subject, sizeof st->quota_subject, "principal:%s", r->principal);
        st->quota_description = "the caller has --principal-max-watches watches open";
        st->retry_delay_ms = 1000;
        drey_request_fail(r, st);
        return;
    }
    if (w->has_cluster) {
        attach_remote(w, s, r); /* unlocks w->mu */
        return;
    }
    s->principal = drey_xstrdup(r->principal);
    recording_begin_locked(w);
    pthread_mutex_lock(&s->mu);
    bool gone = s->done;
    if (!gone) {
        const Drey__Cache__V1__WatchRequest *m = s->msg;
        s->state = S_ATTACHED;
        s->cancel_fn = NULL;
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
                if (e->seq > m->resume_after && stream_wants(s, e))
                    stream_push(w, s, e);
            }
        }
        link_locked(&w->streams, s);
        w->n_streams++;
        atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed); /* the hub's, until detached */
    }
    pthread_mutex_unlock(&s->mu);
    if (gone)
        principal_give(w, s->principal);
    pthread_mutex_unlock(&w->mu);
    drey_request_reply(r, NULL); /* frees the backpressure slot; sends WATCHING */
}

static void on_message(void *ctx, drey_call *call, const ProtobufCMessage *request) {
    drey_watch *w = ctx;
    if (request == NULL)
        return; /* the client's half-close: the stream goes on */
    stream *s = drey_xcalloc(1, sizeof *s);
    s->w = w;
    s->call = call;
    atomic_init(&s->refs, 2); /* the call's and the chain's */
    drey_arena_init(&s->arena, NULL, 0);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->idle, NULL);
    s->state = S_ADMITTING;
    drey_call_set_user(call, s);
    /* The chain may park the request (the backpressure queue): it needs a
     * copy that outlives this callback, and the bytes for validation. */
    size_t len = protobuf_c_message_get_packed_size(request);
    uint8_t *bytes = drey_arena_alloc(&s->arena, len ? len : 1);
    protobuf_c_message_pack(request, bytes);
    s->msg = drey__cache__v1__watch_request__unpack(drey_arena_protobuf_allocator(&s->arena), len, bytes);
    if (s->msg == NULL)
        abort(); /* what protobuf-c just packed it unpacks */
    drey_request_init(&s->req, &watch_door, s, &s->arena, &w->method, &s->msg->base, bytes, len);
    drey_pipeline_submit(w->opts.pipeline, &s->req);
}

static void on_sent(void *ctx, drey_call *call) {
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
    flush(s);
}

static void on_done(void *ctx, drey_call *call) {
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
    void (*cancel)(void *) = s->cancel_fn;
    void *cancel_arg = s->cancel_arg;
    s->cancel_fn = NULL;
    ring_clear(s);
    void *handle = s->remote && !s->opening ? s->handle : NULL; /* opening: the opener closes */
    s->handle = NULL;
    pthread_mutex_unlock(&s->mu);
    if (attached && s->remote) {
        unlink_locked(&w->remotes, s);
        w->n_remote--;
        principal_give(w, s->principal);
    } else if (attached) {
        unlink_locked(&w->streams, s);
        w->n_streams--;
        if (s->sub)
            w->n_subs--;
        else
            principal_give(w, s->principal);
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
        stream_unref(s); /* the hub's */
    stream_unref(s);     /* the call's */
}

/* --- clusters: the owner's end of a subscription ------------------------- */

static void sub_refuse(drey_call *call, drey_error e) {
    drey_status st;
    drey_status_init(&st);
    drey_status_set(&st, e);
    drey_call_finish(call, &st);
}

/* An ingress node subscribes for one client's watch: attached to this
 * node's feed like a watch of its own, outside the chain (the ingress
 * admitted the caller; the peer is a node, by its certificate) and outside
 * every principal's count. */
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
    stream *s = drey_xcalloc(1, sizeof *s);
    s->w = w;
    s->call = call;
    atomic_init(&s->refs, 2); /* the call's (until on_done), and this function's */
    drey_arena_init(&s->arena, NULL, 0);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->idle, NULL);
    s->state = S_ADMITTING;
    s->sub = true;
    size_t len = drey__cache__v1__watch_request__get_packed_size(in->watch);
    uint8_t *bytes = drey_arena_alloc(&s->arena, len ? len : 1);
    drey__cache__v1__watch_request__pack(in->watch, bytes);
    s->msg = drey__cache__v1__watch_request__unpack(drey_arena_protobuf_allocator(&s->arena), len, bytes);
    if (s->msg == NULL)
        abort(); /* what protobuf-c just packed it unpacks */
    uint8_t *parts = drey_arena_calloc(&s->arena, n_parts / 8 + 1);
    for (size_t i = 0; i < in->n_partitions; i++) {
        if (in->partitions[i] < n_parts)
            parts[in->partitions[i] / 8] |= (uint8_t)(1u << (in->partitions[i] % 8));
    }
    s->parts = parts;
    s->n_parts = n_parts;
    set_filter(s);
    drey_call_set_user(call, s);
    pthread_mutex_lock(&w->mu);
    /* The ingress may have gone meanwhile (on_done): then never touch the call. */
    if (w->stopping || !w->started) {
        drey_error e = w->stopping ? DREY_ERR_CANCELLED : DREY_ERR_RECOVERING;
        pthread_mutex_unlock(&w->mu);
        pthread_mutex_lock(&s->mu);
        s->state = S_REFUSED;
        if (!s->done)
            sub_refuse(call, e);
        pthread_mutex_unlock(&s->mu);
        stream_unref(s);
        return;
    }
    recording_begin_locked(w);
    pthread_mutex_lock(&s->mu);
    bool gone = s->done;
    if (!gone) {
        s->state = S_ATTACHED;
        s->hello_pending = true; /* the ingress counts it in place from here */
        s->hello_seq = w->seq;
        link_locked(&w->streams, s);
        w->n_streams++;
        w->n_subs++;
        atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed); /* the hub's, until detached */
    }
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_unlock(&w->mu);
    if (!gone)
        flush(s);
    stream_unref(s); /* this function's */
}

bool drey_watch_register_internal(drey_watch *w, drey_server *internal) {
    const drey_server_method m = {
        .path = SUBSCRIBE_PATH,
        .input = &drey__internal__v1__subscribe_request__descriptor,
        .server_streaming = true,
        .on_message = on_subscribe,
        .on_done = on_done,
        .on_sent = on_sent,
        .ctx = w,
    };
    return drey_server_add_method(internal, &m);
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
            kick_locked(w, s);
        }
    } else if (!s->done) {
        if (marker && !watching && s->episode == NULL)
            s->episode = reason;
        else if (marker && watching)
            s->episode = NULL;
        if (e != NULL)
            stream_push(w, s, e);
        kick_locked(w, s);
    }
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_unlock(&w->mu);
    event_unref(e);
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

/* --- the module --------------------------------------------------------- */

drey_watch *drey_watch_create(const drey_watch_options *opts) {
    drey_watch *w = drey_xcalloc(1, sizeof *w);
    w->opts = *opts;
    if (w->opts.max_per_principal == 0)
        w->opts.max_per_principal = 1;
    w->observer = (drey_store_observer){.fn = observe, .ctx = w};
    w->method = (drey_method){
        .path = WATCH_PATH,
        .desc = protobuf_c_service_descriptor_get_method_by_name(&drey__cache__v1__cache__descriptor, "Watch"),
        .flags = DREY_METHOD_READ,
        .handle = handle_watch,
        .ctx = w,
    };
    while (w->feed == 0) {
        if (getrandom(&w->feed, sizeof w->feed, 0) != (ssize_t)sizeof w->feed)
            w->feed = (uint64_t)drey_wall_ms() * 1000003u ^ (uint64_t)drey_mono_ns();
    }
    w->feed &= (1ULL << 53) - 1; /* exact in a JavaScript number too */
    if (w->feed == 0)
        w->feed = 1;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cond, NULL);
    w->idle_since_ms = drey_mono_ms();
    return w;
}

bool drey_watch_register(drey_watch *w, drey_server *s) {
    const drey_server_method m = {
        .path = WATCH_PATH,
        .input = &drey__cache__v1__watch_request__descriptor,
        .server_streaming = true,
        .on_message = on_message,
        .on_done = on_done,
        .on_sent = on_sent,
        .ctx = w,
    };
    return drey_server_add_method(s, &m);
}

void drey_watch_start(drey_watch *w) {
    pthread_mutex_lock(&w->mu);
    if (!w->thread_running && !w->stopping) {
        drey_thread_start(&w->thread, "watch delivery", delivery_main, w);
        w->thread_running = true;
    }
    w->started = true;
    pthread_mutex_unlock(&w->mu);
}

void drey_watch_stop(drey_watch *w) {
    pthread_mutex_lock(&w->mu);
    w->stopping = true;
    recording_end_locked(w); /* an observer call already under way records nothing */
    for (int list = 0; list < 2; list++) {
        for (stream *s = list == 0 ? w->streams : w->remotes; s != NULL; s = s->next) {
            pthread_mutex_lock(&s->mu);
            if (!s->done)
                drey_call_finish(s->call, NULL);
            pthread_mutex_unlock(&s->mu);
        }
    }
    pthread_cond_broadcast(&w->cond);
    bool running = w->thread_running;
    w->thread_running = false;
    pthread_mutex_unlock(&w->mu);
    if (running)
        pthread_join(w->thread, NULL);
}

void drey_watch_destroy(drey_watch *w) {
    if (w == NULL)
        return;
    drey_watch_stop(w);
    pthread_mutex_lock(&w->mu);
    while (w->kick_head != NULL) { /* kicked after the delivery thread ended */
        stream *s = w->kick_head;
        w->kick_head = s->kick_next;
        stream_unref(s);
    }
    w->kick_tail = NULL;
    for (size_t i = 0; i < PRINCIPAL_BUCKETS; i++) {
        while (w->principals[i] != NULL) {
            principal_count *pc = w->principals[i];
            w->principals[i] = pc->next;
            free(pc);
        }
    }
    pthread_mutex_unlock(&w->mu);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cond);
    free(w);
}

void drey_watch_get_stats(drey_watch *w, drey_watch_stats *out) {
    pthread_mutex_lock(&w->mu);
    out->streams = clients_locked(w);
    out->subscriptions = w->n_subs;
    out->events = w->events;
    out->resyncs = w->resyncs;
    out->history_events = w->hcount;
    out->history_bytes = w->hbytes;
    out->recording = atomic_load(&w->recording);
    pthread_mutex_unlock(&w->mu);
}

void drey_watch_collect_metrics(void *ctx, FILE *out) {
    drey_watch_stats st;
    drey_watch_get_stats(ctx, &st);
    static const struct {
        const char *name, *type, *help;
    } rows[] = {
        {"drey_watch_streams", "gauge", "Watch streams of clients open on this node."},
        {"drey_watch_subscriptions", "gauge", "Cluster watches' subscriptions this node serves as an owner."},
        {"drey_watch_events_total", "counter", "Changes numbered in the change feed."},
        {"drey_watch_resyncs_total", "counter", "RESYNC_REQUIRED owed to readers whose buffer overflowed."},
        {"drey_watch_history_events", "gauge", "Events kept for resuming watches."},
        {"drey_watch_history_bytes", "gauge", "Bytes of the events kept for resuming watches."},
        {"drey_watch_recording", "gauge", "1 while the feed records changes (a watch is open, or was lately)."},
    };
    const double values[] = {(double)st.streams,        (double)st.subscriptions, (double)st.events,
                             (double)st.resyncs,
                             (double)st.history_events, (double)st.history_bytes, st.recording ? 1.0 : 0.0};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        drey_metrics_header(out, rows[i].name, rows[i].type, rows[i].help);
        drey_metrics_sample(out, rows[i].name, "", values[i]);
    }
}
