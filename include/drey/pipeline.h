/*
 * pipeline — the request chain every unary request passes.
 *
 *   ready -> validate -> principal -> backpressure -> authz -> route
 *         -> idempotency -> tenant -> memory -> journal -> apply
 *
 * The chain is a table of stages (src/pipeline/pipeline.c), read top to
 * bottom. A stage passes the request on, rejects it with a status (nothing
 * after it runs, and nothing it did stays), answers it (a retry answered from
 * its remembered outcome), or parks it and resumes the chain later with
 * drey_pipeline_resume(). Each stage says which methods it applies to by
 * method flags (include/drey/method.h).
 *
 * route is a cluster node's: a data request runs here, or goes to its
 * partition's owner (drey_pipeline_set_route); a single node passes it.
 *
 * The chain does not know where a request came from. A request is a door
 * (a small table of operations: reply, fail, metadata, peer, deadline,
 * cancellation) plus the method and the decoded message. A unary call on
 * either listener is one door (drey_pipeline_serve, grpc.c), a frame of a
 * peer's forwarding stream another (peer.c), an operation of a Pipeline
 * stream another (stream.c), a node's call to its own chain another
 * (drey_pipeline_call_local, local.c: a partition's move, a node's own share
 * of a cache-wide call); a Watch's admission brings its own, and unit tests
 * use an in-memory one. A record replicated from a primary needs none of its
 * own: it is a peer call (a partition's Apply, DREY_METHOD_PEER) through one
 * of these.
 */
#ifndef DREY_PIPELINE_H
#define DREY_PIPELINE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "drey/auth.h"
#include "drey/authz.h"
#include "drey/backpressure.h"
#include "drey/commit.h"
#include "drey/journal.h"
#include "drey/method.h"
#include "drey/memory.h"
#include "drey/metrics.h"
#include "drey/server.h"
#include "drey/status.h"
#include "drey/tenant.h"

typedef struct drey_pipeline drey_pipeline;

typedef enum drey_stage_result {
    DREY_STAGE_NEXT,     /* pass to the next stage */
    DREY_STAGE_REJECT,   /* r->status says why; the request fails */
    DREY_STAGE_PARKED,   /* the stage resumes the chain later */
    DREY_STAGE_ANSWERED, /* the stage answered (a retry answered from its outcome) */
} drey_stage_result;

/* Limits the validation stage enforces (see the option table). */
typedef struct drey_limits {
    size_t max_cache_name_bytes;
    size_t max_key_bytes;
    size_t max_value_bytes;
    size_t max_batch;
} drey_limits;

#define DREY_MAX_REQUEST_ID_BYTES 128
#define DREY_MAX_TTL_MS ((int64_t)100 * 366 * 24 * 3600 * 1000)

typedef struct drey_pipeline_options {
    drey_limits limits;
    const drey_method_table *methods; /* what the chain serves */
    drey_commit *commit;     /* applies writes (idempotency, then the method) */
    drey_auth *auth;         /* NULL: no keys; a request with a token is refused */
    bool auth_required;      /* a request without a token is refused */
    /* NULL: no policy, every caller may do everything. Otherwise auth (if
     * any) must have its grants attached (drey_auth_set_attach). */
    drey_authz *authz;
    /* Tenants' memory quotas (the policy's tenants section); NULL: none. */
    drey_tenants *tenants;
    drey_bp *backpressure;   /* NULL: no runtime admission */
    drey_memory *memory;     /* NULL: no memory admission */
    drey_metrics *metrics;   /* NULL: not counted */
    const char *node_id;     /* QuotaFailure subject node:<id> */
    /* drey.cache.v1.Cache/Pipeline: operations of one stream read and not
     * yet answered (0: 128). At the window the stream is not read. */
    size_t pipeline_window;
} drey_pipeline_options;

/* Another node's answer to a forwarded request, as it came: passed on to
 * the caller unchanged (drey_request_relay). The transport's own type. */
typedef drey_call_answer drey_answer;

/* The door a request came through. Every operation gets the request's
 * `door` pointer. */
typedef struct drey_request_ops {
    /* Answer the request: exactly one of reply/fail/relay, once, from any
     * thread. */
    void (*reply)(void *door, const ProtobufCMessage *response);
    void (*fail)(void *door, const drey_status *st);
    void (*relay)(void *door, const drey_answer *a);
    /* A request metadata value by lowercase key (not NUL-terminated), or NULL. */
    const char *(*metadata)(void *door, const char *key, size_t *len);
    /* Who is calling when no token says: "conn:<n>" for a client connection. */
    const char *(*peer)(void *door);
    /* Monotonic ns; INT64_MAX without a deadline. */
    int64_t (*deadline_mono_ns)(void *door);
    /* fn runs at most once if the caller goes away before the request is
     * answered, never once reply or fail has begun. May be NULL: a door
     * whose caller cannot go away. */
    void (*on_cancel)(void *door, void (*fn)(void *arg), void *arg);
    /* Whether the caller authenticated as cluster node id (mutual TLS on
     * the internal listener). NULL: a door peers never use; a request there
     * that claims to be forwarded is refused. */
    bool (*peer_is)(void *door, const char *id, size_t len);
} drey_request_ops;

/* --- one request of many on a stream -----------------------------------------
 *
 * The doors of a peer's Forward frame (peer.c), a Pipeline operation
 * (stream.c) and a Watch's admission (src/watch) differ in how an answer
 * goes out and where metadata comes from, and are alike in the rest: a
 * deadline of their own, and the chain's cancellation hook, which the
 * stream runs if its caller goes away first, and which runs at once when
 * set after that. One table of operations (drey_subdoor_ops) serves them
 * all; each stream says its own part in a drey_subdoor_stream and embeds a
 * drey_subdoor in its request's state (door = the drey_subdoor). */
typedef struct drey_subdoor drey_subdoor;

typedef struct drey_subdoor_stream {
    void (*reply)(drey_subdoor *d, const ProtobufCMessage *response);
    void (*fail)(drey_subdoor *d, const drey_status *st);
    void (*relay)(drey_subdoor *d, const drey_answer *a);
    const char *(*metadata)(drey_subdoor *d, const char *key, size_t *len);
    const char *(*peer)(drey_subdoor *d);
    bool (*peer_is)(drey_subdoor *d, const char *id, size_t len); /* drey_subdoor_peer_ops' only */
} drey_subdoor_stream;

struct drey_subdoor {
    const drey_subdoor_stream *stream;
    pthread_mutex_t *mu; /* the stream's: guards what follows; NULL: its caller cannot go away */
    int64_t deadline_ns;
    void (*cancel_fn)(void *arg);
    void *cancel_arg;
    bool gone; /* the caller went away unanswered: a hook set from now runs at once */
    _Atomic bool answered; /* reply, fail or relay has begun (set by the ops): the hook never runs after */
};

/* A client's stream (no peer uses it: a request claiming to be forwarded
 * is refused), and a peer's (peer_is asks the stream's mutual TLS). */
extern const drey_request_ops drey_subdoor_ops;
extern const drey_request_ops drey_subdoor_peer_ops;

void drey_subdoor_init(drey_subdoor *d, const drey_subdoor_stream *stream, pthread_mutex_t *mu,
                       int64_t deadline_ns);
/* The caller went away (needs mu): false if it was answered or gone
 * already; else marks it gone and takes its hook (*fn NULL: none set yet)
 * for the caller to run once mu is let go. */
bool drey_subdoor_cancel_locked(drey_subdoor *d, void (**fn)(void *arg), void **arg);
/* Answered (needs mu): the hook is let go. */
void drey_subdoor_answered_locked(drey_subdoor *d);

/* Metadata of a call one node forwards to another: the forwarding node's
 * id, and the partition epoch its table had. Accepted only from a peer that
 * authenticated as that id. */
#define DREY_FORWARDED_BY "drey-forwarded-by"
#define DREY_FORWARD_EPOCH "drey-epoch"

struct drey_request {
    /* Set by the door (drey_request_init). */
    const drey_request_ops *ops;
    void *door;
    drey_arena *arena;          /* lives until the request is answered */
    const drey_method *method;
    const ProtobufCMessage *msg;
    const uint8_t *bytes;       /* the message as received (validation, the journal) */
    size_t len;

    /* The chain's. */
    drey_pipeline *pipeline;
    size_t next_stage;     /* index into the chain */
    int64_t now_ms;        /* when the request is applied (0: now) */
    drey_status *status;   /* set by a rejecting stage */
    const char *principal; /* jwt:{sub}, the connection, or node:<id> for a
                              forwarded call: backpressure, metrics, logs */
    const char *forwarded_by; /* the node that forwarded it; NULL: a client's */
    drey_write write;      /* writes: what commit applies (its principal is the
                              idempotency scope: jwt:{sub}, or "" when anonymous) */
    drey_authz_grants *grants; /* the caller's (a reference, let go as it is
                                  answered); NULL without a policy */
    /* The tenant stage's: the write's tenant, the growth it reserved under
     * the tenant's quota (released as it is answered), whether it already
     * waited for a cluster's share of the quota. */
    uint32_t tenant_id;
    int64_t tenant_reserved;
    bool tenant_waited;
    int64_t tenant_evicted; /* bytes of the tenant's own entries it evicts for its quota */
    drey_journal_entry entry; /* writes: the journal append */
    drey_bp_ticket ticket;    /* the backpressure slot */
    bool has_ticket;
    /* Runs once as the request is answered, after it was applied (or
     * refused) and before the caller hears: the route row counts the
     * writes a partition has in flight with it. */
    void (*on_release)(void *arg);
    void *release_arg;
    bool failed;           /* answered with drey_request_fail (on_release may look) */
    int64_t growth;        /* writes: what memory admission counted it to add */
    /* What the route row noted of a write it runs here (its partition), for
     * the replicator; and the replicator's own note. */
    void *route_note;
    void *replica_note;
    /* Set by the replicator: the write is applied but answered with this
     * error, with ErrorInfo metadata outcome=unknown (other copies may or
     * may not have it); 0: answered as applied. */
    drey_error answer_unknown;
    /* The entries a write may evict (the route row's: a replicated
     * partition's write evicts only its own partition's entries, which
     * every copy of the partition then evicts alike); keep NULL: any. */
    drey_store_filter evict_only;
    /* Given to the method as drey_apply.keep (the route row's). */
    bool (*keep)(void *ctx, const char *cache, size_t cache_len, const char *key, size_t key_len);
    void *keep_ctx;
};

/* A cluster's replication of the writes this node leads. Both run under
 * the chain's order lock, around the journal append: prepare once the
 * write has its versions, time (r->entry.time_ms) and record (r->entry
 * payload), before it is journaled; appended with the append's result (0,
 * or the refusal: the record went nowhere) — on an ephemeral node right
 * after prepare, with 0.
 * prepare returns NEXT (not replicated: the chain goes on as without it),
 * REJECT (r->status, nothing happened) or PARKED: then the replicator owns
 * the write's completion (it takes r->entry.done) and resumes it with
 * drey_pipeline_resume once it may apply.
 * Nothing may be resumed under the order lock: a resumed Pipeline
 * operation can submit the stream's next one on the same thread, which
 * takes the order lock again (a deadlock seen at RF 2). So completions
 * that appended finds due wait for released, called with what appended
 * returned (when not 0) once the lock is let go. */
typedef struct drey_replicator {
    drey_stage_result (*prepare)(void *ctx, drey_request *r);
    uint32_t (*appended)(void *ctx, drey_request *r, int rc);
    void (*released)(void *ctx, uint32_t token);
    /* Memory admission: the least room the write's other copies have
     * (INT64_MAX: no other, or none known), so that a write evicting to
     * fit evicts enough for every copy (its victims go everywhere). */
    int64_t (*memory_room)(void *ctx, const drey_request *r);
    void *ctx;
} drey_replicator;

drey_pipeline *drey_pipeline_create(const drey_pipeline_options *opts);
void drey_pipeline_destroy(drey_pipeline *p);

/* Durable nodes: writes go through this journal (NULL: applied at once,
 * the ephemeral mode). Set before drey_pipeline_set_ready. */
void drey_pipeline_set_journal(drey_pipeline *p, drey_journal *j);
/* Clusters: the route row's function, where a data request runs. NEXT:
 * here; PARKED: sent to its partition's owner, answered later
 * (drey_request_relay); REJECT: r->status (not the owner of a forwarded
 * call, or no owner to reach). Without one (a single node) everything
 * runs here. Set before drey_pipeline_set_ready. */
void drey_pipeline_set_route(drey_pipeline *p, drey_stage_result (*route)(void *ctx, drey_request *r), void *ctx);
/* Clusters whose partitions have backups. Set before drey_pipeline_set_ready. */
void drey_pipeline_set_replicator(drey_pipeline *p, const drey_replicator *rep);
/* Whether writes go through a journal (a durable node). */
bool drey_pipeline_journaled(const drey_request *r);
/* The journal set by drey_pipeline_set_journal (NULL: an ephemeral node). */
drey_journal *drey_pipeline_journal(const drey_pipeline *p);
/* r's status for a journal that refused or failed its record of len bytes
 * (drey_journal_append's -errno, or the done callback's): JOURNAL_DISK_QUOTA
 * and JOURNAL_QUEUE_FULL with their figures, else JOURNAL_WRITE_FAILED. */
drey_status *drey_pipeline_journal_refusal(drey_request *r, int rc, size_t len);
/* Until ready, cache calls are refused with UNAVAILABLE RECOVERING (health
 * and reflection still answer). */
void drey_pipeline_set_ready(drey_pipeline *p, bool ready);

/* Binds every method of the table to the gRPC server: the server's door.
 * internal: the cluster's listener, whose callers are peers that
 * authenticate with mutual TLS; it also serves drey.internal.v1.Peer/Forward,
 * the stream peers forward calls on, whose frames are requests of a door of
 * their own (src/pipeline/peer.c). */
bool drey_pipeline_serve(drey_pipeline *p, drey_server *s, bool internal);
/* (The public listener also gets drey.cache.v1.Cache/Pipeline: a stream
 * door, src/pipeline/stream.c, whose every operation is a request of its
 * own through this chain.) */

/* The internal listener is about to stop: each peer stream ends once the
 * requests it brought are answered (they were sent before this node left
 * the membership), instead of holding the listener's shutdown until its
 * timeout. */
void drey_pipeline_drain_peers(drey_pipeline *p);

/* --- batches: work done once for many requests ------------------------------
 *
 * A door that submits or answers many requests in a row on one thread (the
 * operations of one Pipeline message, the answers of one peer message), and
 * the journal's writer around the writes one fdatasync made durable
 * (drey_pipeline_set_journal), open a batch around them; a part that would
 * write to the network once per request (a peer stream's write, a Pipeline
 * stream's response) defers the write to the batch's end instead, so one
 * message carries them all.
 * Batches nest (the outermost end runs what was deferred) and are per
 * thread: nothing deferred may be waited for inside the batch. */
void drey_pipeline_batch_begin(void);
void drey_pipeline_batch_end(void);
/* Runs fn(arg) at the end of this thread's batch; false when no batch is
 * open (or too much is deferred): then the caller does it now. The caller
 * defers an arg once (a flag of its own) and keeps it alive until fn runs. */
bool drey_pipeline_batch_defer(void (*fn)(void *arg), void *arg);

/* A door's request: fills the door's part of r (which the door allocates,
 * typically zeroed in its own arena). */
void drey_request_init(drey_request *r, const drey_request_ops *ops, void *door, drey_arena *arena,
                       const drey_method *method, const ProtobufCMessage *msg, const uint8_t *bytes, size_t len);

/* A metadata header of a request a node sends (to a peer, or to itself). */
typedef struct drey_request_header {
    const char *key;
    const char *value;
    size_t len;
} drey_request_header;

/* This node calling its own chain in-process, as a peer would over the
 * internal listener (src/pipeline/local.c): method m with the request's
 * packed bytes and the forwarding headers a peer's call carries (self:
 * this node's id, which the headers name in DREY_FORWARDED_BY). done runs
 * once with the answer as a peer's would come, on whatever thread answers
 * it; a request that does not decode is answered MALFORMED_REQUEST. */
void drey_pipeline_call_local(drey_pipeline *p, const drey_method *m, const uint8_t *bytes, size_t len,
                              const char *self, const drey_request_header *headers, size_t n_headers,
                              int64_t deadline_ns, void (*done)(void *arg, const drey_answer *a), void *arg);

/* Runs r through the chain; it is answered through its door, now or later. */
void drey_pipeline_submit(drey_pipeline *p, drey_request *r);

/* Who calls, and whether it may: the chain's principal and authz stages
 * alone, for a request a node serves on a client's behalf outside the
 * chain (an owner's share of a cluster Watch: src/watch/cluster.c). The
 * token r's door carries is verified with this node's keys and its grants
 * asked under this node's policy, exactly as a forwarded call's would be
 * (the door needs metadata, peer and peer_is; the request must name its
 * forwarding node, DREY_FORWARDED_BY). NULL: it may (r->principal is
 * set); else the refusal, in r's arena: UNAUTHENTICATED for a token this
 * node does not accept, PERMISSION_DENIED NOT_PERMITTED counted and kept
 * among the last denials like the authz stage's. Nothing is held after it
 * returns; r is not answered. */
const drey_status *drey_pipeline_authorize(drey_pipeline *p, drey_request *r);

/* Continues a parked request with the stage after the one that parked it. */
void drey_pipeline_resume(drey_request *r);

/* Answer a request (handlers at the end of the chain, and the chain itself):
 * release what the chain holds for it, then answer through its door. */
void drey_request_reply(drey_request *r, const ProtobufCMessage *response);
void drey_request_fail(drey_request *r, const drey_status *st);
void drey_request_relay(drey_request *r, const drey_answer *a);
static inline drey_arena *drey_request_arena(const drey_request *r) {
    return r->arena;
}

/* The validation stage's checks, exposed for unit tests: validates a decoded
 * request (and its wire bytes, for what protobuf-c does not check) and
 * records violations in st. Returns true when the request is valid. */
bool drey_validate_request(const drey_limits *lim, const ProtobufCMessage *msg, const uint8_t *wire, size_t wire_len,
                           drey_arena *arena, drey_status *st);

/* Key and cache name rules, shared with clients' tests. */
bool drey_validate_key(const char *key, size_t len, size_t max_len);
bool drey_validate_cache_name(const char *name, size_t len, size_t max_len);

#endif
