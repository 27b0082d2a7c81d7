/*
 * method — the table of methods the request chain serves, and what a write
 * is.
 *
 * A method is a unary RPC of a service drey implements: its path, its
 * protobuf-c descriptor, the flags that tell the chain which stages apply,
 * and either a synchronous function of (state, request, time) — `apply`: a
 * write's deterministic state transition, or a read — or an asynchronous
 * handler for what answers later (a snapshot). The table knows no transport: the gRPC
 * server, a peer that forwards a call and a replicated record all resolve
 * methods here, and recovery replays journal records through the same
 * `apply` the live chain runs. Streaming methods are the transport's own
 * business (src/server) and are not in the table.
 *
 * Services fill the table once at start-up; it is read-only afterwards and
 * may be read from any thread without a lock.
 */
#ifndef DREY_METHOD_H
#define DREY_METHOD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "drey/arena.h"
#include "drey/status.h"
#include "drey/store.h"

/* The request the chain carries (include/drey/pipeline.h). */
typedef struct drey_request drey_request;

/* Which stages of the chain a method passes. */
enum {
    DREY_METHOD_READ = 1u << 0,   /* reads the store */
    DREY_METHOD_WRITE = 1u << 1,  /* mutates the store: memory admission, journal */
    DREY_METHOD_SYSTEM = 1u << 2, /* health: answers without a token, under overload */
    DREY_METHOD_ADMIN = 1u << 3,  /* operator actions: authenticated and admitted, no store access */
    /* Between cluster nodes: a partition's copy and drop (Import, Drop) and
     * its replication (Apply, Hash, Beat, Confirm). Served only on the
     * internal listener, to a caller that proved it is a node (mutual TLS):
     * its principal is node:<id>, never a token. */
    DREY_METHOD_PEER = 1u << 4,
    /* Taken in the order it arrives (a backup's records): no stage may park
     * it, so backpressure does not apply. */
    DREY_METHOD_ORDERED = 1u << 5,
    /* A write that gives its keys new versions (one per key it names): they
     * are reserved as it is journaled (a write that then fails leaves them
     * unused). The others (Remove, Touch, a partition's Import) reserve
     * none. */
    DREY_METHOD_VERSIONED = 1u << 6,
};

/* How a cluster routes a method's requests: the shape of what its message
 * names, read by the router (src/cluster/router.c) through the accessors
 * below; a single node runs everything where it arrives. A new method says
 * its shape here and the router needs no change. */
typedef enum drey_method_route {
    DREY_ROUTE_LOCAL = 0, /* answered where it arrives: it names no partition's data */
    DREY_ROUTE_KEY,       /* `cache` and `key`: the key's partition's primary */
    DREY_ROUTE_KEYS,      /* `keys`, each read on its own: each partition's primary, gathered in order */
    DREY_ROUTE_BATCH,     /* keys applied together (one outcome): one partition's, else CROSS_PARTITION */
    DREY_ROUTE_CACHE,     /* a whole cache: every owner's share */
    DREY_ROUTE_PARTITION, /* `partition`: one of that partition's writes, at its primary */
    DREY_ROUTE_PEER,      /* between cluster nodes: the cluster's own row for it (src/cluster/backup.c) */
} drey_method_route;

/* What `apply` gets: the time it happens at (for a write, the journal
 * record's, also on replay), the versions it hands out, and where its
 * response is built. */
typedef struct drey_apply {
    int64_t now_ms;      /* wall-clock milliseconds */
    drey_arena *arena;   /* response memory */
    drey_status *status; /* set when the transition fails */
    /* A write's versions, chosen where it was ordered (the journal stage
     * reserved them; a replayed or replicated record carries them), so that
     * every replica gives each key the version its client was told. The
     * write takes at most n_versions, in order, through drey_apply_version.
     * next_version 0: the store's counter (ephemeral nodes, records from
     * before versions were carried). */
    uint64_t next_version;
    size_t n_versions;
    /* Reads that walk many entries (Scan) skip those keep says no to: a
     * cluster node's copy of a partition it does not own. NULL: all. */
    bool (*keep)(void *ctx, const char *cache, size_t cache_len, const char *key, size_t key_len);
    void *keep_ctx;
    /* A write's tenant (drey_store_tenant_id): the entries it stores belong
     * to it. 0: none. */
    uint32_t tenant;
} drey_apply;

/* The next version for a write to give a key: ax's next reserved one, with
 * the store's counter raised past it so the node's later versions stay
 * above it; or, without a reservation, the store's next. Every write apply
 * takes its versions here, never from drey_store_next_version. Taking more
 * than ax->n_versions is a programming error (another write owns the next
 * ones): it aborts. */
uint64_t drey_apply_version(drey_apply *ax, drey_store *s);

/* How a service describes one of its methods. */
typedef struct drey_method_spec {
    const char *name; /* the method's name in the service descriptor */
    unsigned flags;
    drey_method_route route;
    /* Returns the response, or NULL with ax->status set. For a write
     * (DREY_METHOD_WRITE, which must have it) a deterministic state
     * transition of (store, request, ax->now_ms), run after the journal
     * append and again on replay; for anything else a function of the
     * current state, run at the end of the chain. */
    ProtobufCMessage *(*apply)(void *ctx, drey_apply *ax, const ProtobufCMessage *request);
    /* Writes that can grow memory: the bytes the write would add to the
     * store's accounting (new size - old size) if applied now. */
    int64_t (*growth)(void *ctx, const ProtobufCMessage *request, int64_t now_ms);
    /* The same for one tenant: what its entries would grow by (new entries
     * less the tenant's own entries they replace; another tenant's entry
     * replaced is not the writer's to count). Writes with growth have it. */
    int64_t (*tenant_growth)(void *ctx, const ProtobufCMessage *request, int64_t now_ms, uint32_t tenant);
    /* Writes that bring versions of their own (entries moving in): the
     * highest. The store's counter is raised to it as the write is ordered,
     * not only as it applies, so that a write ordered after it (whose
     * versions are reserved then) gets versions above the ones it brings. */
    uint64_t (*versions_brought)(const ProtobufCMessage *request);
    /* Methods without apply: runs once with the decoded request at the end
     * of the chain and must eventually answer it (drey_request_reply or
     * drey_request_fail in include/drey/pipeline.h), from any thread. */
    void (*handle)(void *ctx, drey_request *r, const ProtobufCMessage *request);
} drey_method_spec;

typedef struct drey_method {
    const char *path;                      /* "/drey.cache.v1.Cache/Get" */
    const ProtobufCMethodDescriptor *desc; /* name, input and output types */
    unsigned flags;
    drey_method_route route;
    ProtobufCMessage *(*apply)(void *ctx, drey_apply *ax, const ProtobufCMessage *request);
    int64_t (*growth)(void *ctx, const ProtobufCMessage *request, int64_t now_ms);
    int64_t (*tenant_growth)(void *ctx, const ProtobufCMessage *request, int64_t now_ms, uint32_t tenant);
    uint64_t (*versions_brought)(const ProtobufCMessage *request);
    void (*handle)(void *ctx, drey_request *r, const ProtobufCMessage *request);
    void *ctx;                             /* given to drey_method_table_add_service */
} drey_method;

/* How many versions a write of this request may hand out (one per key it
 * names for a DREY_METHOD_VERSIONED method, else none): what the journal
 * stage reserves for it. */
size_t drey_apply_versions_needed(const drey_method *m, const ProtobufCMessage *request);

typedef struct drey_method_table drey_method_table;

drey_method_table *drey_method_table_create(void);
void drey_method_table_destroy(drey_method_table *t);

/* Adds every unary method of the service. Each needs a spec with exactly
 * one of apply and handle (a write: apply); streaming methods must have
 * none (they are registered on the transport). A mismatch is a programming
 * error, logged and reported as false. */
bool drey_method_table_add_service(drey_method_table *t, const ProtobufCServiceDescriptor *sd,
                                   const drey_method_spec *specs, size_t n_specs, void *ctx);

/* The method at path ("/pkg.Service/Method"), or NULL. */
const drey_method *drey_method_find(const drey_method_table *t, const char *path);
size_t drey_method_count(const drey_method_table *t);
const drey_method *drey_method_at(const drey_method_table *t, size_t i);

/* What a data request names, found by field name as validation does: its
 * `cache` (NULL: it names none), and its keys — `key`, `keys[i]` or
 * `entries[i].key`. Routing and the idempotency scope of a partitioned node
 * read these. */
const char *drey_method_request_cache(const ProtobufCMessage *m);
size_t drey_method_request_key_count(const ProtobufCMessage *m);
const char *drey_method_request_key(const ProtobufCMessage *m, size_t i);
/* What a DREY_ROUTE_PARTITION request names: its `partition` (UINT32_MAX
 * for a message without one). */
uint32_t drey_method_request_partition(const ProtobufCMessage *m);
/* A read's `allow_stale` (false for a message without one): it may be
 * answered from an in-sync backup's copy. */
bool drey_method_request_allows_stale(const ProtobufCMessage *m);

/* Scatter and gather of a DREY_ROUTE_KEYS method, by field name: the
 * request with `keys` = keys[index[0..n)] (a shallow copy in a; NULL: m
 * has no `keys`); a response's repeated `results` (*out, their count); a
 * response of type d with results as its `results`; whether a response
 * says it came from a backup (`from_backup`, its `lag_ms`), and marking
 * it so (lag_ms kept at the largest). */
ProtobufCMessage *drey_method_request_with_keys(drey_arena *a, const ProtobufCMessage *m, const size_t *index,
                                                size_t n);
size_t drey_method_response_results(const ProtobufCMessage *resp, ProtobufCMessage ***out);
ProtobufCMessage *drey_method_response_gathered(drey_arena *a, const ProtobufCMessageDescriptor *d,
                                                ProtobufCMessage **results, size_t n);
bool drey_method_response_stale(const ProtobufCMessage *resp, uint64_t *lag_ms);
void drey_method_response_mark_stale(ProtobufCMessage *resp, uint64_t lag_ms);

#endif
