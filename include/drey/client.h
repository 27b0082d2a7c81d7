/*
 * client — a gRPC client on the C core API, for the CLI, the integration
 * tests and load generators.
 *
 *   drey_client *c = drey_client_open(&(drey_client_options){.target = "127.0.0.1:50051"}, err, sizeof err);
 *   Drey__Cache__V1__GetRequest req = DREY__CACHE__V1__GET_REQUEST__INIT;
 *   req.key = "k";
 *   ProtobufCMessage *resp;
 *   drey_client_status st;
 *   if (drey_client_unary(c, DREY_CLIENT_CACHE("Get"), &req.base, &drey__cache__v1__get_response__descriptor,
 *                         5000, &arena, &resp, &st) != GRPC_STATUS_OK)
 *       printf("%s %s\n", drey_client_code_name(st.code), drey_client_status_reason(&st));
 *   drey_client_close(c);
 *
 * Memory: everything a call returns (the response, the status message and its
 * decoded details) lives in the drey_arena the caller passes, so one
 * drey_arena_reset() frees a call's results. The client owns nothing the
 * caller sees.
 *
 * Connections: each client opens its own channel and its own connection (a
 * local subchannel pool), so a load generator with one client per thread gets
 * one connection per thread. Transparent retries are off: a call's outcome
 * is what the server answered. A client is used by one thread at a time.
 *
 * Deadlines: timeout_ms is relative to the start of the call;
 * DREY_CLIENT_NO_DEADLINE means none, and 0 gives a deadline that has already
 * passed when the call starts.
 *
 * This module is the only client-side user of grpc/grpc.h: the C core API
 * has no compatibility promise across releases.
 */
#ifndef DREY_CLIENT_H
#define DREY_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <grpc/status.h>
#include <protobuf-c/protobuf-c.h>

#include "drey/arena.h"
#include "drey/cache/v1/cache.pb-c.h"
#include "google/rpc/error_details.pb-c.h"
#include "google/rpc/status.pb-c.h"

#define DREY_CLIENT_NO_DEADLINE ((int64_t)-1)

/* Method paths of the services dreyd serves. */
#define DREY_CLIENT_CACHE(method) ("/drey.cache.v1.Cache/" method)
#define DREY_CLIENT_HEALTH(method) ("/grpc.health.v1.Health/" method)
#define DREY_CLIENT_ADMIN(method) ("/drey.admin.v1.Admin/" method)

typedef struct drey_client drey_client;

/* One request header sent on every call. */
typedef struct drey_client_header {
    const char *key;   /* lowercase; "-bin" keys carry binary values */
    const char *value; /* NUL-terminated */
} drey_client_header;

typedef struct drey_client_options {
    const char *target;                /* "host:port" or any gRPC target URI */
    const char *token;                 /* sent as "authorization: Bearer <token>"; NULL or "": none */
    const drey_client_header *headers; /* more request headers for every call */
    size_t n_headers;
    int max_recv_message_bytes;        /* 0: gRPC's default (4 MiB); -1: unlimited */
    /* TLS: any of these set (or tls true) makes the channel TLS. */
    bool tls;                    /* TLS with the system's roots when tls_ca is not given */
    const char *tls_ca;          /* PEM file of the CA(s) that sign the server's certificate */
    const char *tls_cert;        /* PEM certificate chain of this client (mutual TLS) ... */
    const char *tls_key;         /* ... and its private key */
    const char *tls_server_name; /* the name checked in the server's certificate, instead of the target's host */
} drey_client_options;

/* Opens a channel (the connection is made by the first call): plaintext, or
 * TLS when any tls_* option is set. Returns NULL with a message in err when
 * the options are unusable (no target, a header gRPC would refuse, a TLS
 * file that cannot be read, a certificate without its key). grpc_init() is
 * balanced by close. */
drey_client *drey_client_open(const drey_client_options *opts, char *err, size_t err_cap);

/* Cancels calls and streams still in flight, waits for them, and frees
 * everything. NULL is accepted. */
void drey_client_close(drey_client *c);

/* --- status --------------------------------------------------------------- */

/* The outcome of a call. For a non-OK status from a drey server the details
 * (`grpc-status-details-bin`, a google.rpc.Status) are decoded and the known
 * detail types picked out; each is NULL when absent (and all are when the
 * trailer is missing or undecodable). A status made by the client itself
 * (connection refused, deadline, an undecodable response) has no details. */
typedef struct drey_client_status {
    grpc_status_code code;
    const char *message;                          /* never NULL; "" when none */
    const Google__Rpc__Status *details;           /* the whole google.rpc.Status */
    const Google__Rpc__ErrorInfo *error_info;     /* the first of each type */
    const Google__Rpc__BadRequest *bad_request;
    const Google__Rpc__QuotaFailure *quota_failure;
    const Google__Rpc__RetryInfo *retry_info;
} drey_client_status;

/* Sets code and message and clears the details (message NULL: ""). */
void drey_client_status_set(drey_client_status *st, grpc_status_code code, const char *message);

/* Decodes a serialized google.rpc.Status into st's details, in arena memory.
 * Detail types other than the four above are kept in st->details only; an
 * Any whose payload does not decode is skipped. Returns false (details left
 * NULL) when the bytes are not a google.rpc.Status. */
bool drey_client_status_decode_details(drey_client_status *st, const uint8_t *data, size_t len, drey_arena *arena);

/* ErrorInfo.reason and .domain, or "" without an ErrorInfo. */
const char *drey_client_status_reason(const drey_client_status *st);
const char *drey_client_status_domain(const drey_client_status *st);
/* ErrorInfo.metadata[key], or NULL. */
const char *drey_client_status_metadata(const drey_client_status *st, const char *key);
/* The BadRequest violation naming exactly this field path, or NULL. */
const Google__Rpc__BadRequest__FieldViolation *drey_client_status_violation(const drey_client_status *st,
                                                                           const char *field);
/* RetryInfo.retry_delay in milliseconds, or -1 without one (or with a
 * negative or out-of-range one). */
int64_t drey_client_status_retry_delay_ms(const drey_client_status *st);

/* "OK", "INVALID_ARGUMENT", ...; "UNKNOWN_CODE" outside the enum. */
const char *drey_client_code_name(grpc_status_code code);

/* --- synchronous unary calls ---------------------------------------------- */

/* Sends request to method (a path, "/pkg.Service/Method") and waits for the
 * outcome. On OK, *response is the decoded response (in arena) and the
 * return value is GRPC_STATUS_OK; a response that does not decode as
 * response_type makes the call INTERNAL. Otherwise *response is NULL and st
 * says why. Returns st->code. */
grpc_status_code drey_client_unary(drey_client *c, const char *method, const ProtobufCMessage *request,
                                   const ProtobufCMessageDescriptor *response_type, int64_t timeout_ms,
                                   drey_arena *arena, ProtobufCMessage **response, drey_client_status *st);

/* The same with pre-encoded request bytes, for servers whose types drey does
 * not know: *response is the raw response message (in arena; empty unless
 * OK). Returns st->code. */
grpc_status_code drey_client_unary_raw(drey_client *c, const char *method, const void *request, size_t request_len,
                                       int64_t timeout_ms, drey_arena *arena, ProtobufCBinaryData *response,
                                       drey_client_status *st);

/* --- asynchronous unary calls (load generators) --------------------------- */

/* A finished asynchronous call. */
typedef struct drey_client_completion {
    void *user;                   /* as given to drey_client_start_call */
    drey_client_status status;
    ProtobufCBinaryData response; /* raw response message (in arena); empty unless OK */
    int64_t elapsed_ns;           /* from start_call until drey_client_next took the completion */
} drey_client_completion;

/* Starts a unary call with pre-encoded request bytes (copied: the caller may
 * reuse them at once) and returns without waiting. Any number may be in
 * flight. Returns false only when gRPC refused to start the call. */
bool drey_client_start_call(drey_client *c, const char *method, const void *request, size_t request_len,
                            int64_t timeout_ms, void *user);

/* Waits up to timeout_ms (DREY_CLIENT_NO_DEADLINE: no limit) for a call
 * started by drey_client_start_call to finish and describes it in *out, its
 * strings and bytes in arena. Returns true with a completion, false on
 * timeout or when no call is in flight (it never blocks then). */
bool drey_client_next(drey_client *c, int64_t timeout_ms, drey_arena *arena, drey_client_completion *out);

/* Calls started and not yet returned by drey_client_next. */
size_t drey_client_in_flight(const drey_client *c);

/* --- server streaming ----------------------------------------------------- */

typedef struct drey_client_stream drey_client_stream;

/* Starts a server-streaming call: sends request and half-closes. timeout_ms
 * bounds the whole stream. Returns NULL (with st set) when gRPC refused to
 * start it. */
drey_client_stream *drey_client_stream_start(drey_client *c, const char *method, const ProtobufCMessage *request,
                                             int64_t timeout_ms, drey_client_status *st);

/* Waits for the next message and decodes it as type into arena. Returns
 * false when the stream has ended (or a message did not decode, which
 * drey_client_stream_finish reports as INTERNAL). */
bool drey_client_stream_read(drey_client_stream *s, const ProtobufCMessageDescriptor *type, drey_arena *arena,
                             ProtobufCMessage **message);

/* A call of any streaming kind with pre-encoded requests, for methods drey
 * knows no types of (`drey call`, reflection): sends the n requests (in
 * order, each after gRPC took the one before), half-closes, and leaves the
 * responses to drey_client_stream_read_raw. A send that fails ends the
 * sending: finish reports the call's status. NULL (with st set) when gRPC
 * refused to start it. */
drey_client_stream *drey_client_stream_start_raw(drey_client *c, const char *method, const ProtobufCBinaryData *requests,
                                                 size_t n_requests, int64_t timeout_ms, drey_client_status *st);

/* The next message as bytes (in arena); false at the end of the stream. */
bool drey_client_stream_read_raw(drey_client_stream *s, drey_arena *arena, ProtobufCBinaryData *message);

/* Cancels the stream (its status becomes CANCELLED unless it had ended). */
void drey_client_stream_cancel(drey_client_stream *s);

/* Waits for the stream to end (messages not read are discarded: cancel first
 * to stop early), describes its status in st (in arena) and frees the
 * stream. Returns st->code. */
grpc_status_code drey_client_stream_finish(drey_client_stream *s, drey_arena *arena, drey_client_status *st);

/* --- pipelined calls (drey.cache.v1.Cache/Pipeline) ---------------------- */

/* A bidirectional stream of Cache operations: add operations, flush them as
 * one PipelineRequest, read PipelineResponses; results come in the order
 * the operations were added, each with the id it was given.
 *
 *   drey_client_pipeline *p = drey_client_pipeline_open(c, 10000, &st);
 *   drey_client_pipeline_add(p, 1, &set.base, DREY_CLIENT_NO_DEADLINE);
 *   drey_client_pipeline_add(p, 2, &get.base, DREY_CLIENT_NO_DEADLINE);
 *   drey_client_pipeline_flush(p);
 *   Drey__Cache__V1__PipelineResponse *resp;
 *   while (got < 2 && drey_client_pipeline_next(p, 5000, &arena, &resp)) ...
 *   drey_client_pipeline_finish(p, &arena, &st);
 *
 * Results are received as soon as they arrive, whether or not the caller
 * reads them yet, so flush never waits on the caller's own unread answers;
 * what is buffered is bounded by what the caller sent. A pipeline belongs
 * to one thread at a time, and must be finished before its client is
 * closed. */

typedef struct drey_client_pipeline drey_client_pipeline;

/* Opens a Pipeline stream; timeout_ms bounds the whole stream. NULL (with
 * st set) when gRPC refused to start it. */
drey_client_pipeline *drey_client_pipeline_open(drey_client *c, int64_t timeout_ms, drey_client_status *st);

/* Adds an operation to the next message: request is a Cache request
 * message (its type picks the operation); timeout_ms is the operation's own
 * (DREY_CLIENT_NO_DEADLINE: the stream's only). False when no operation
 * takes that type. */
bool drey_client_pipeline_add(drey_client_pipeline *p, uint64_t id, const ProtobufCMessage *request,
                              int64_t timeout_ms);

/* The same with a pre-encoded request of the Cache method named method
 * ("Get", or its path "/drey.cache.v1.Cache/Get"); the bytes are copied. */
bool drey_client_pipeline_add_raw(drey_client_pipeline *p, uint64_t id, const char *method, const void *request,
                                  size_t request_len, int64_t timeout_ms);

/* Operations added and not yet flushed. */
size_t drey_client_pipeline_pending(const drey_client_pipeline *p);

/* Sends the added operations as one message, after gRPC has taken the
 * previous one. False once the stream is over (or half-closed). */
bool drey_client_pipeline_flush(drey_client_pipeline *p);

/* Waits up to timeout_ms (DREY_CLIENT_NO_DEADLINE: no limit) for the next
 * response message and decodes it into arena. False on timeout or at the
 * end of the stream (then drey_client_pipeline_finish says how it ended). */
bool drey_client_pipeline_next(drey_client_pipeline *p, int64_t timeout_ms, drey_arena *arena,
                               Drey__Cache__V1__PipelineResponse **response);

/* A result's outcome as a unary call's: code, message and the decoded
 * details (in arena). Returns st->code. */
grpc_status_code drey_client_pipeline_result_status(const Drey__Cache__V1__PipelineResult *r, drey_arena *arena,
                                                    drey_client_status *st);

/* A result's response message (GetResponse, SetResponse, ...), or NULL when
 * it failed. */
const ProtobufCMessage *drey_client_pipeline_result_response(const Drey__Cache__V1__PipelineResult *r);

/* Flushes what was added and half-closes: the server ends the stream once
 * it has answered everything. */
void drey_client_pipeline_close_send(drey_client_pipeline *p);

/* Cancels the stream: the server drops what it has not started. */
void drey_client_pipeline_cancel(drey_client_pipeline *p);

/* Half-closes (unless done), waits for the stream to end (discarding
 * unread results), describes its status in st (in arena) and frees p.
 * Returns st->code. */
grpc_status_code drey_client_pipeline_finish(drey_client_pipeline *p, drey_arena *arena, drey_client_status *st);

/* --- change feeds and a near cache ---------------------------------------- */

/* drey.cache.v1.Cache/Watch: a server stream of WatchEvents (see
 * proto/drey/cache/v1/cache.proto). Read it with drey_client_stream_read
 * (type &drey__cache__v1__watch_event__descriptor); the first event is
 * WATCHING or RESYNC_REQUIRED. */
drey_client_stream *drey_client_watch(drey_client *c, const Drey__Cache__V1__WatchRequest *request,
                                      int64_t timeout_ms, drey_client_status *st);

/* A near cache: values of one cache kept in this process, invalidated by a
 * Watch of the whole cache on a connection (and a thread) of its own.
 *
 * Once the event of a change has arrived, no get serves a value older than
 * that change: a miss reads from the node with a placeholder in the table,
 * and an event for the key (or a RESYNC_REQUIRED, which empties the table)
 * that arrives before the read returns drops the placeholder, so the read's
 * answer is not kept. Entries also go at their expiry, and the oldest go
 * when max_entries is reached. When the watch ends (the node went away),
 * the near cache empties and serves nothing from memory until it has
 * watched again (it reopens the stream, backing off 50 ms doubling to 2 s).
 * On a cluster node a RESYNC_REQUIRED OWNER_CHANGED or OWNER_LOST (a
 * partition changed owner, an owner was lost) empties it the same way until
 * the WATCHING that follows. Any number of threads may call drey_near_get. */
typedef struct drey_near_cache drey_near_cache;

typedef struct drey_near_options {
    drey_client_options server; /* where to read and watch */
    const char *cache;          /* "" or "default": the default cache */
    size_t max_entries;         /* 0: 10,000 */
    /* Called on the watch thread after each event has been applied (tests,
     * metrics); NULL: none. */
    void (*on_event)(void *ctx, const Drey__Cache__V1__WatchEvent *ev);
    void *on_event_ctx;
} drey_near_options;

/* Opens both connections and waits up to timeout_ms for the watch to say
 * WATCHING; NULL with a message in err otherwise. */
drey_near_cache *drey_near_open(const drey_near_options *opts, int64_t timeout_ms, char *err, size_t err_cap);
void drey_near_close(drey_near_cache *n);

/* The key's value: from memory, or read from the node (timeout_ms) and
 * kept. Returns true with *found and, when found, *value (in arena) and
 * *version; false with st set when the read failed. */
bool drey_near_get(drey_near_cache *n, const char *key, int64_t timeout_ms, drey_arena *arena, bool *found,
                   Drey__Cache__V1__Value **value, uint64_t *version, drey_client_status *st);

typedef struct drey_near_stats {
    uint64_t hits, misses;
    uint64_t events;        /* applied, WATCHING and RESYNC_REQUIRED included */
    uint64_t invalidations; /* entries dropped by events */
    uint64_t resyncs;       /* RESYNC_REQUIRED received (each emptied the table) */
    uint64_t entries;       /* held now */
    uint64_t watches;       /* times the watch said WATCHING */
} drey_near_stats;
void drey_near_get_stats(drey_near_cache *n, drey_near_stats *out);

/* --- clusters: routing by key --------------------------------------------- */

/* A drey cluster accepts any call on any node (a node that does not own the
 * key's partition forwards it), so routing by key only saves the forward:
 * the owner's CPU is spent either way, the ingress node's is saved. A
 * client with a stale or missing table stays correct.
 *
 *   drey_client_topology *t = drey_client_topology_open(&(drey_client_options){.target = seed}, err, sizeof err);
 *   drey_client_topology_wait(t, 5000);          // optional: the first table
 *   drey_client_cluster *cc = drey_client_cluster_open(t, &opts, err, sizeof err);   // one per thread
 *   drey_client *c = drey_client_cluster_route(cc, "users", 5, "alice", 5);
 *   ... drey_client_unary(c, ...) or drey_client_cluster_start_call / _next ...
 *   drey_client_cluster_close(cc);
 *   drey_client_topology_close(t);
 *
 * A topology watches drey.cluster.v1.Cluster/WatchTopology on the seed on a
 * thread of its own, and reopens the stream (backing off, 50 ms doubling to
 * 2 s) when it ends, so a seed that restarts is picked up again. It may be
 * shared by any number of threads. A cluster client belongs to one thread at
 * a time, like a drey_client: it keeps one drey_client (channel, connection)
 * per node it has routed to, plus one to the seed, and takes the newest table
 * at its next route. A partition with no owner, or an owner without an
 * advertised address, routes to the seed. */

typedef struct drey_client_topology drey_client_topology;
typedef struct drey_client_cluster drey_client_cluster;

/* The partition rule of proto/drey/cluster/v1/cluster.proto (the same
 * function as drey_placement_partition). n_partitions >= 1. */
uint32_t drey_client_partition(const char *cache, size_t cache_len, const char *key, size_t key_len,
                               uint32_t n_partitions);

/* Starts watching the seed's topology (seed->target; its token and headers
 * are sent on the stream). NULL with a message in err when the options are
 * unusable, as drey_client_open. */
drey_client_topology *drey_client_topology_open(const drey_client_options *seed, char *err, size_t err_cap);

/* Waits up to timeout_ms for the first table; true once one is loaded. */
bool drey_client_topology_wait(drey_client_topology *t, int64_t timeout_ms);

/* Tables received so far (0 before the first). */
uint64_t drey_client_topology_version(const drey_client_topology *t);

/* The partition count of the current table (0 before the first). */
uint32_t drey_client_topology_partitions(const drey_client_topology *t);

/* Stops the watch (cancels the stream, joins the thread) and frees t. Every
 * cluster client opened on t must be closed first. NULL is accepted. */
void drey_client_topology_close(drey_client_topology *t);

/* A router on t for one thread; opts->target is the seed (for partitions
 * without a known owner), the rest applies to every node's channel. */
drey_client_cluster *drey_client_cluster_open(drey_client_topology *t, const drey_client_options *opts, char *err,
                                              size_t err_cap);

/* The client of the node that owns (cache, key)'s partition by the newest
 * table, else the seed's. Owned by cc: valid until cc is closed. */
drey_client *drey_client_cluster_route(drey_client_cluster *cc, const char *cache, size_t cache_len, const char *key,
                                       size_t key_len);

/* The address drey_client_cluster_route would pick: the owner's advertised
 * host:port, or the seed's target. Valid until the next call on cc. */
const char *drey_client_cluster_route_address(drey_client_cluster *cc, const char *cache, size_t cache_len,
                                              const char *key, size_t key_len);

/* drey_client_start_call on the owner's client. The completions of every
 * node's calls come out of one queue: drey_client_cluster_next. */
bool drey_client_cluster_start_call(drey_client_cluster *cc, const char *cache, size_t cache_len, const char *key,
                                    size_t key_len, const char *method, const void *request, size_t request_len,
                                    int64_t timeout_ms, void *user);

/* As drey_client_next, over the calls started with
 * drey_client_cluster_start_call on any node. */
bool drey_client_cluster_next(drey_client_cluster *cc, int64_t timeout_ms, drey_arena *arena,
                              drey_client_completion *out);

/* Calls started with drey_client_cluster_start_call and not yet returned. */
size_t drey_client_cluster_in_flight(const drey_client_cluster *cc);

/* Cancels the calls in flight, waits for them, closes every node's client
 * and frees cc. NULL is accepted. */
void drey_client_cluster_close(drey_client_cluster *cc);

#endif
