/*
 * internal — what the watch module's files share: the hub (struct
 * drey_watch: the change feed's numbering and history, its streams, the
 * kick list, principal counts), a stream (a client's Watch, a cluster
 * watch fed by the cluster, or an owner's subscription), and an event.
 * feed.c records changes and fills buffers; stream.c runs a Watch stream
 * and sends its buffer; cluster.c is both ends of a cluster watch; watch.c
 * makes, starts and stops the hub.
 *
 * Locks, always in this order: the hub's mutex (feed numbering, history,
 * the stream lists, the kick list, principal counts), then a stream's mutex
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
#ifndef DREY_WATCH_INTERNAL_H
#define DREY_WATCH_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "drey/list.h"
#include "drey/watch.h"

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
    drey_list streams;     /* attached to the feed: clients' watches, owner subscriptions */
    size_t n_streams;
    size_t n_subs;         /* of them, subscriptions */
    drey_list remotes;     /* clients' watches of a cluster (fed by the cluster) */
    size_t n_remote;
    drey_watch_cluster cluster;
    bool has_cluster;
    drey_list kicks;       /* streams for the delivery thread to flush */
    principal_count *principals[PRINCIPAL_BUCKETS];
    uint64_t events, resyncs;
};

typedef enum { S_ADMITTING, S_ATTACHED, S_REFUSED } stream_state;

struct stream {
    drey_subdoor sd; /* first: the admission's door; its hook under mu */
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

    const char *authorization; /* remote: the client's header (NULL: none), for the owners */
    size_t authorization_len;
    uint8_t *bytes;     /* the request as it came (the chain validates them) */
    size_t len;
    drey_link link;     /* in the hub's streams, or its remotes */
    drey_link kick;     /* in the hub's kicks while kicked */
};

/* --- feed.c ---------------------------------------------------------------- */

void drey_watch__event_unref(wevent *e);
/* The store's observer: numbers a change and buffers it where it is wanted. */
void drey_watch__observe(void *ctx, const drey_store_change *c);
/* Under w->mu: records changes from now on (the first stream after a pause),
 * or no more (the history goes). */
void drey_watch__recording_begin_locked(drey_watch *w);
void drey_watch__recording_end_locked(drey_watch *w);
/* Fixes the stream's filter from its request; whether the filter takes e. */
void drey_watch__set_filter(stream *s);
bool drey_watch__wants(const stream *s, const wevent *e);
/* Under s->mu: buffers e, or on overflow empties the buffer and owes the
 * reader one RESYNC_REQUIRED (which covers e too). */
void drey_watch__push(drey_watch *w, stream *s, wevent *e);
/* Under s->mu: drops every buffered event. */
void drey_watch__ring_clear(stream *s);
/* Under w->mu and s->mu: queues the stream for the delivery thread if
 * nothing will send its buffer otherwise. */
void drey_watch__kick_locked(drey_watch *w, stream *s);
/* Under w->mu: counts a watch against its principal's limit (false: at
 * the limit), or lets it go. */
bool drey_watch__principal_take(drey_watch *w, const char *name);
void drey_watch__principal_give(drey_watch *w, const char *name);
/* The delivery thread: flushes kicked streams, ends recording after the
 * linger. */
void *drey_watch__delivery_main(void *arg);

/* --- stream.c --------------------------------------------------------------- */

/* A stream for call, holding refs references, its request a copy of msg
 * in its own arena. */
stream *drey_watch__stream_new(drey_watch *w, drey_call *call, int refs, const Drey__Cache__V1__WatchRequest *msg);
void drey_watch__stream_unref(stream *s);
/* Under w->mu and s->mu: puts s on list (the hub's streams or remotes),
 * counted in *count, with the hub's reference. */
void drey_watch__attach_locked(stream *s, drey_list *list, size_t *count);
/* Hands the stream's next messages to the transport, unless it is sending
 * already. */
void drey_watch__flush(stream *s);
/* The end of the chain for a Watch (the method's handle): the watch is
 * admitted as a call; now the watch limits, then the stream joins the feed. */
void drey_watch__handle(void *ctx, drey_request *r, const ProtobufCMessage *msg);
/* Clients' watches open on this node (under w->mu). */
size_t drey_watch__clients_locked(const drey_watch *w);
/* The server's callbacks: a Watch's request, and for a Watch stream and a
 * subscription, its messages gone and its end. */
void drey_watch__on_watch(void *ctx, drey_call *call, const ProtobufCMessage *request);
void drey_watch__on_sent(void *ctx, drey_call *call);
void drey_watch__on_done(void *ctx, drey_call *call);
/* Registers a server-streaming method of the hub on server. */
bool drey_watch__add_method(drey_watch *w, drey_server *server, const char *path,
                            const ProtobufCMessageDescriptor *input,
                            void (*on_message)(void *ctx, drey_call *call, const ProtobufCMessage *msg));

/* --- cluster.c --------------------------------------------------------------- */

/* Under w->mu (released on return): a client's cluster watch, counted here
 * like any and fed by the cluster. */
void drey_watch__attach_remote(drey_watch *w, stream *s, drey_request *r);

#endif
