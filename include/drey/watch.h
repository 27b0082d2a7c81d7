/*
 * watch — change feeds: drey.cache.v1.Cache/Watch.
 *
 * The store reports every change to a client cache's entries to one
 * observer (drey_store_set_observer), with the key's shard locked. The
 * watch hub is that observer: it numbers each change in the node's feed (a
 * sequence, increasing, per process start a new random feed id), keeps the
 * most recent ones for resuming watches (the history, bounded in bytes) and
 * puts each into the buffer of every stream whose filter it matches. A
 * delivery thread and the streams' send completions move buffered events to
 * the transport; nothing is sent from under a shard lock.
 *
 * Guarantees, per stream:
 * - Durable before visible: the store reports a write as it is applied,
 *   which on a durable node (--fsync=always) is after the journal made it
 *   durable, so a watcher never hears of a write that could be lost (with a
 *   relaxed --fsync, what a read would see). Recovery replays
 *   before any watch is admitted (drey_watch_start), and the hub observes
 *   the store only while watched: replay is never reported.
 * - Per-key order: one key's events come in the order its changes were
 *   applied (its versions' order).
 * - Bounded memory: a stream's buffer holds at most buffer_bytes of events
 *   (and always at least one). An event that does not fit empties the buffer
 *   and makes the next message exactly one RESYNC_REQUIRED; the stream goes
 *   on with the events after it. Nothing is dropped without saying so.
 * - Admission: a Watch passes the request chain like any call (ready,
 *   validation, principal, backpressure: the slot is held while the watch is
 *   set up, not for the stream's life), then the node holds at most
 *   max_streams (NODE_WATCH_LIMIT) and a principal at most max_per_principal
 *   watches at once (PRINCIPAL_WATCH_LIMIT).
 *
 * Clusters: a Watch on a cluster node is served by that node, the ingress,
 * from every owner's feed (drey_watch_set_cluster; the cluster module
 * follows the table and subscribes at the owners: src/cluster/subscribe.c).
 * The ingress admits and counts the watch as above, once, for its caller;
 * it holds the client's first message until every owner's subscription is
 * in place and then sends WATCHING; the owners' events reach the client's
 * buffer (bounded as above) as the owners sent them. When an owner changes
 * or is lost the client gets RESYNC_REQUIRED and, once every covered
 * partition has a subscription in place again, WATCHING. An owner serves a
 * subscription (drey_watch_register_internal) like a watch of its own
 * feed, limited to the partitions asked for that it owns at the moment of
 * each change, and counts it apart (subscriptions), never against a
 * principal: it comes from the ingress node. The owner checks the caller
 * again, as it checks a forwarded call (the ingress's check spares it
 * nothing, the owner's is the guard): the subscription carries the
 * client's token, which the owner verifies with its own keys and whose
 * grants it asks under its own policy (verb watch on the keys, the prefix
 * or the whole cache); a refusal ends the subscription with it, and the
 * ingress ends the client's watch with that status. A resume names one node's feed:
 * in a cluster it is answered RESYNC_REQUIRED (HISTORY_UNAVAILABLE) in place
 * of WATCHING.
 *
 * Cost when nobody watches: the hub is the store's observer only while a
 * stream is open and for history_linger_ms after the last one closed (so a
 * client that reconnects can resume); otherwise a change costs the store
 * one atomic load of a NULL observer.
 */
#ifndef DREY_WATCH_H
#define DREY_WATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "drey/cache/v1/cache.pb-c.h"
#include "drey/pipeline.h"
#include "drey/server.h"
#include "drey/store.h"

typedef struct drey_watch drey_watch;

typedef struct drey_watch_options {
    drey_store *store;
    drey_pipeline *pipeline;    /* admits new watches */
    uint32_t max_streams;       /* concurrent watches on the node; 0: no limit */
    uint32_t max_per_principal; /* concurrent watches per principal */
    size_t buffer_bytes;        /* per stream, of events not yet sent */
    size_t history_bytes;       /* events kept for resuming; 0: none */
    int64_t history_linger_ms;  /* recording goes on this long after the last stream */
    bool clustered;             /* watches wait for drey_watch_set_cluster (RECOVERING until) */
    const char *node_id;        /* QuotaFailure subject */
} drey_watch_options;

drey_watch *drey_watch_create(const drey_watch_options *opts);
/* Ends every stream first (drey_watch_stop). */
void drey_watch_destroy(drey_watch *w);

/* Serves /drey.cache.v1.Cache/Watch on the server (before it starts). */
bool drey_watch_register(drey_watch *w, drey_server *s);

/* Starts the delivery thread; until then every watch is refused
 * (RECOVERING). Call after recovery, before the node is ready: the hub
 * becomes the store's observer only when a watch is admitted, so replayed
 * writes are never reported. */
void drey_watch_start(drey_watch *w);
/* Ends every stream with OK and refuses new ones (the node is stopping), so
 * server shutdown does not wait for them. Detaches from the store. */
void drey_watch_stop(drey_watch *w);

/* --- clusters --------------------------------------------------------- */

/* A client's watch on a cluster node, as the cluster module feeds it. */
typedef struct drey_watch_stream drey_watch_stream;

typedef struct drey_watch_cluster {
    /* The ingress: a client's watch was admitted (req lives as long as the
     * stream); follow its partitions. authorization is the client's header
     * (authorization_len bytes; NULL: none), for the owners to check again;
     * it lives as long as the stream. Returns the cluster's handle. From
     * then until close(handle) returns, ws takes drey_watch_deliver,
     * drey_watch_mark and drey_watch_end; close runs once, when the
     * client's call is over. */
    void *(*open)(void *ctx, drey_watch_stream *ws, const Drey__Cache__V1__WatchRequest *req,
                  const char *authorization, size_t authorization_len);
    void (*close)(void *ctx, void *handle);
    /* The owner: the cluster's partition count, and whether this node owns
     * partition p now. owns is called with a store shard locked: it must
     * take no lock. */
    uint32_t (*partitions)(void *ctx);
    bool (*owns)(void *ctx, uint32_t p);
    void *ctx;
} drey_watch_cluster;

/* Before any watch is admitted (the cluster has joined). */
void drey_watch_set_cluster(drey_watch *w, const drey_watch_cluster *c);
/* Serves /drey.internal.v1.Subscriber/Subscribe on the internal listener. */
bool drey_watch_register_internal(drey_watch *w, drey_server *internal);

/* An owner's serialized WatchEvent, to the client as it came; any thread
 * that holds no store lock. Never blocks on the client: its buffer bound
 * applies (overflow: RESYNC_REQUIRED). */
void drey_watch_deliver(drey_watch_stream *ws, const uint8_t *event, size_t len);
/* An owner's subscription lost events (its buffer overflowed) and goes on:
 * the client hears RESYNC_REQUIRED BUFFER_OVERFLOW in its place in the
 * stream, unless nothing was promised yet or a WATCHING is owed anyway. */
void drey_watch_lost(drey_watch_stream *ws);
/* watching: every covered partition's subscription is in place (the first
 * time: the stream's WATCHING, or RESYNC_REQUIRED HISTORY_UNAVAILABLE for a
 * resume; later: WATCHING again). Else RESYNC_REQUIRED with reason (a
 * string literal): events may be missed until the next WATCHING; before the
 * first one it says nothing and is dropped. */
void drey_watch_mark(drey_watch_stream *ws, bool watching, const char *reason);
/* An owner refused the watch (its own check of the caller: a token it
 * does not accept, a grant its policy does not give): the client's watch
 * ends with the owner's status as it came (code, message, details), after
 * what is already on its way. Later calls do nothing. */
void drey_watch_end(drey_watch_stream *ws, const drey_call_answer *owner_status);

typedef struct drey_watch_stats {
    uint64_t streams;         /* clients' watches open now */
    uint64_t subscriptions;   /* other nodes' (and this one's) cluster subscriptions served now */
    uint64_t events;          /* changes numbered in the feed, ever */
    uint64_t resyncs;         /* RESYNC_REQUIRED sent for overflow, ever */
    uint64_t history_events;  /* kept now */
    uint64_t history_bytes;
    bool recording;
} drey_watch_stats;
void drey_watch_get_stats(drey_watch *w, drey_watch_stats *out);

/* A metrics collector (drey_metrics_add_collector): drey_watch_streams,
 * drey_watch_subscriptions,
 * drey_watch_events_total, drey_watch_resyncs_total,
 * drey_watch_history_events, drey_watch_history_bytes, drey_watch_recording. */
void drey_watch_collect_metrics(void *ctx, FILE *out);

#endif
