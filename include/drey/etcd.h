/*
 * etcd — drey's etcd v3 client on the gRPC C core, for the cluster's control
 * plane: KV reads, writes and transactions, leases kept alive on a stream,
 * and prefix watches that resume where they left off.
 *
 *   drey_etcd *e = drey_etcd_open(&(drey_etcd_options){.endpoints = "http://10.0.0.1:2379,http://10.0.0.2:2379"},
 *                                 err, sizeof err);
 *   drey_etcd_lease lease;
 *   drey_etcd_lease_grant(e, 2, 1000, &lease, &st);                // TTL 2 s, 1 s deadline
 *   drey_etcd_txn t;
 *   drey_etcd_txn_init(&t, &arena);
 *   drey_etcd_txn_if_create_revision(&t, "drey/controller", DREY_ETCD_EQUAL, 0);   // nobody holds it
 *   drey_etcd_txn_put(&t, DREY_ETCD_THEN, "drey/controller", "node-0", 6, lease.id);
 *   drey_etcd_txn_get(&t, DREY_ETCD_ELSE, "drey/controller", false);               // who does
 *   drey_etcd_txn_commit(e, &t, 1000, &arena, &resp, &st);  // resp->succeeded: we are the controller
 *
 * Every call has a deadline (timeout_ms, relative to the call's start; <= 0
 * has passed already). Requests and responses are the protoc-c types of
 * etcd's own protos (gen/etcd/...), so every etcd field is reachable;
 * responses live in the arena the caller passes.
 *
 * Endpoints and retries (after etcd's Go client, clientv3/retry.go): each
 * endpoint has its own channel; a call goes to the endpoint that last
 * answered and moves to the next when that one cannot be reached. A call is
 * sent only on a connected channel, so "could not connect" means "not sent"
 * and any call moves on to the next endpoint then. After sending, Range is
 * retried on the next endpoint when it fails UNAVAILABLE; writes (Put,
 * DeleteRange, Txn, LeaseGrant, LeaseRevoke) are not, because etcd may have
 * applied them: they fail with may_have_applied set, and the caller re-reads
 * (a Txn's compare makes that safe). An endpoint that timed out is tried
 * last by the next call, so a hung member costs one deadline, not every one.
 *
 * Streams (LeaseKeepAlive, Watch) run on the client's own thread, which
 * polls one completion queue; their callbacks run there, one at a time, in
 * order. A callback must not block, and must not make synchronous calls on
 * the same client (they fail FAILED_PRECONDITION at once instead of
 * deadlocking); it may stop or close any stream, itself included. Streams
 * have no deadline: a keepalive's liveness is its validity (below); a watch
 * on a member that hangs without closing its connection (SIGSTOP) waits for
 * it. gRPC keepalive pings would notice, but etcd refuses pings more often
 * than every 5 s by default, so they are left to a later option.
 *
 * Thread-safety: any number of threads may make calls and start, stop or
 * close streams at once. drey_etcd_close must come after every other call on
 * the client has returned, never from a callback (it aborts), and it closes
 * the streams left open, without callbacks, freeing them.
 *
 * Transport: http:// endpoints in plaintext, https:// endpoints over TLS:
 * etcd's certificate is checked against the CA file (or the system's roots)
 * and the endpoint's host, and a client certificate is presented when one is
 * given (etcd's --client-cert-auth). The files are re-read when they change
 * (gRPC's file watcher, every second): a rotated certificate is used for the
 * next connection without a restart. open checks them first, so a wrong
 * path or a key that does not match its certificate is an error there, not
 * a handshake that fails later.
 *
 * Authentication (etcd's auth enable): with a user, the client asks
 * Auth/Authenticate for a token (the password read from its file each
 * time, so a rotation needs no restart) and sends it as the `token`
 * metadata of every call and stream. A call refused UNAUTHENTICATED (the
 * token expired: etcd's simple tokens live --auth-token-ttl, JWT tokens
 * until their exp) authenticates again and is sent once more (etcd refused
 * it before anything applied); a stream that ends so is reopened with a new
 * token, which a thread of the client's fetches (a stream's callbacks may
 * not make calls).
 *
 * This module is the only user of gRPC's client API for etcd: the C core has
 * no compatibility promise across releases.
 */
#ifndef DREY_ETCD_H
#define DREY_ETCD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <grpc/status.h>

#include "drey/arena.h"
#include "etcd/etcdserver/etcdserverpb/rpc.pb-c.h"
#include "etcd/mvcc/mvccpb/kv.pb-c.h"

typedef struct drey_etcd drey_etcd;

/* TLS to https:// endpoints; NULL or "" fields: not given. */
typedef struct drey_etcd_tls {
    const char *ca_file;   /* PEM: the CAs that sign etcd's serving certificates (none: the system's) */
    const char *cert_file; /* PEM: this client's certificate, for etcd's --client-cert-auth */
    const char *key_file;  /* PEM: its key (with cert_file) */
} drey_etcd_tls;

typedef struct drey_etcd_options {
    /* Comma-separated URLs, "http://host:port" or "https://host:port" (a
     * bare host:port means http://); at most 16. */
    const char *endpoints;
    drey_etcd_tls tls;
    /* etcd's authentication: a user and the file holding its password (one
     * line); NULL or "": none. */
    const char *user;
    const char *password_file;
    /* How long a call waits for a not yet connected endpoint before trying
     * the next one, once every endpoint has been tried quickly; 0: 1000 ms. */
    int64_t connect_timeout_ms;
} drey_etcd_options;

/* Opens channels to the endpoints (connections are made by the first call)
 * and starts the client's thread. Returns NULL with a message in err when the
 * options are unusable. grpc_init() is balanced by close. */
drey_etcd *drey_etcd_open(const drey_etcd_options *opts, char *err, size_t err_cap);

/* Closes streams left open (no callbacks), stops the thread and frees
 * everything. NULL is accepted. */
void drey_etcd_close(drey_etcd *e);

/* --- status --------------------------------------------------------------- */

typedef struct drey_etcd_status {
    grpc_status_code code;
    /* A write failed after it was sent (UNAVAILABLE, DEADLINE_EXCEEDED, ...):
     * etcd may have applied it. False whenever etcd answered or the request
     * never left. */
    bool may_have_applied;
    char message[256];  /* etcd's or gRPC's words; "" on OK */
    char endpoint[128]; /* the endpoint of the last attempt ("host:port"), "" when none was made */
} drey_etcd_status;

/* --- KV ------------------------------------------------------------------- */

/* A NUL-terminated string as protobuf bytes (not copied). */
ProtobufCBinaryData drey_etcd_bytes(const char *s);

/* The range_end that makes a request cover every key starting with prefix
 * (in arena): prefix with its last byte below 0xff incremented; "\0" (every
 * key) when there is none. */
ProtobufCBinaryData drey_etcd_prefix_end(drey_arena *arena, const char *prefix);

grpc_status_code drey_etcd_range(drey_etcd *e, const Etcdserverpb__RangeRequest *req, int64_t timeout_ms,
                                 drey_arena *arena, Etcdserverpb__RangeResponse **resp, drey_etcd_status *st);
grpc_status_code drey_etcd_put(drey_etcd *e, const Etcdserverpb__PutRequest *req, int64_t timeout_ms,
                               drey_arena *arena, Etcdserverpb__PutResponse **resp, drey_etcd_status *st);
grpc_status_code drey_etcd_delete_range(drey_etcd *e, const Etcdserverpb__DeleteRangeRequest *req,
                                        int64_t timeout_ms, drey_arena *arena,
                                        Etcdserverpb__DeleteRangeResponse **resp, drey_etcd_status *st);
grpc_status_code drey_etcd_txn_request(drey_etcd *e, const Etcdserverpb__TxnRequest *req, int64_t timeout_ms,
                                       drey_arena *arena, Etcdserverpb__TxnResponse **resp, drey_etcd_status *st);

/* One key (prefix false) or every key under it (true), at the latest
 * revision. */
grpc_status_code drey_etcd_get(drey_etcd *e, const char *key, bool prefix, int64_t timeout_ms, drey_arena *arena,
                               Etcdserverpb__RangeResponse **resp, drey_etcd_status *st);

/* --- transactions --------------------------------------------------------- */

typedef enum drey_etcd_cmp {
    DREY_ETCD_EQUAL,
    DREY_ETCD_NOT_EQUAL,
    DREY_ETCD_LESS,
    DREY_ETCD_GREATER,
} drey_etcd_cmp;

typedef enum drey_etcd_branch {
    DREY_ETCD_THEN, /* run when every compare holds */
    DREY_ETCD_ELSE, /* run otherwise */
} drey_etcd_branch;

/* A transaction under construction; everything it holds is in its arena
 * (keys and values are copied), so the builder needs no cleanup. */
typedef struct drey_etcd_txn {
    Etcdserverpb__TxnRequest req;
    drey_arena *arena;
    size_t cap_compare, cap_success, cap_failure;
} drey_etcd_txn;

void drey_etcd_txn_init(drey_etcd_txn *t, drey_arena *arena);

/* A key that does not exist has create_revision, mod_revision and version 0.
 * mod_revision is what the cluster uses as a partition's epoch. */
void drey_etcd_txn_if_create_revision(drey_etcd_txn *t, const char *key, drey_etcd_cmp cmp, int64_t revision);
void drey_etcd_txn_if_mod_revision(drey_etcd_txn *t, const char *key, drey_etcd_cmp cmp, int64_t revision);
void drey_etcd_txn_if_version(drey_etcd_txn *t, const char *key, drey_etcd_cmp cmp, int64_t version);
void drey_etcd_txn_if_value(drey_etcd_txn *t, const char *key, drey_etcd_cmp cmp, const void *value, size_t len);

/* lease 0: none. */
void drey_etcd_txn_put(drey_etcd_txn *t, drey_etcd_branch b, const char *key, const void *value, size_t len,
                       int64_t lease);
void drey_etcd_txn_get(drey_etcd_txn *t, drey_etcd_branch b, const char *key, bool prefix);
void drey_etcd_txn_delete(drey_etcd_txn *t, drey_etcd_branch b, const char *key, bool prefix);

/* Sends the transaction: on OK, (*resp)->succeeded says which branch ran and
 * (*resp)->responses are its operations' results in order. */
grpc_status_code drey_etcd_txn_commit(drey_etcd *e, const drey_etcd_txn *t, int64_t timeout_ms, drey_arena *arena,
                                      Etcdserverpb__TxnResponse **resp, drey_etcd_status *st);

/* --- leases --------------------------------------------------------------- */

typedef struct drey_etcd_lease {
    int64_t id;
    int64_t ttl_s;      /* as granted by etcd */
    int64_t granted_ns; /* monotonic clock just before the grant was sent: the lease lives until at least
                           granted_ns + ttl_s unless revoked */
} drey_etcd_lease;

/* ttl_s: etcd raises it to its minimum (1.5 x election timeout, 2 s with
 * its defaults). */
grpc_status_code drey_etcd_lease_grant(drey_etcd *e, int64_t ttl_s, int64_t timeout_ms, drey_etcd_lease *out,
                                       drey_etcd_status *st);
/* Deletes the lease and every key attached to it. */
grpc_status_code drey_etcd_lease_revoke(drey_etcd *e, int64_t id, int64_t timeout_ms, drey_etcd_status *st);

typedef enum drey_etcd_lease_loss {
    DREY_ETCD_LEASE_EXPIRED,   /* etcd answered that the lease does not exist (expired or revoked) */
    DREY_ETCD_LEASE_UNCONFIRMED, /* no renewal was confirmed in time: past valid_until, etcd may have expired it */
} drey_etcd_lease_loss;

typedef struct drey_etcd_keepalive drey_etcd_keepalive;

/* Keeps the lease alive on a LeaseKeepAlive stream: a renewal every TTL/3
 * (as clientv3/lease.go does), the stream reopened on the next endpoint when
 * it breaks. on_lost is called once, on the client's thread, when the lease
 * is lost; nothing is renewed after that. */
drey_etcd_keepalive *drey_etcd_keepalive_start(drey_etcd *e, const drey_etcd_lease *lease,
                                               void (*on_lost)(void *user, drey_etcd_lease_loss why),
                                               void *user);

/* Monotonic time (drey_mono_ns) until which the lease certainly exists: the
 * send time of the last renewal etcd confirmed plus the TTL it confirmed
 * (not the receive time, as in Go's client: a late answer must not extend
 * what we may assume). A node serves only while now < this - margin. */
int64_t drey_etcd_keepalive_valid_until_ns(const drey_etcd_keepalive *ka);

/* Renewals etcd confirmed so far. */
uint64_t drey_etcd_keepalive_renewals(const drey_etcd_keepalive *ka);

/* Stops renewing (the lease expires after its TTL unless revoked) and frees
 * ka; no callback comes after it returns. NULL is accepted. */
void drey_etcd_keepalive_stop(drey_etcd_keepalive *ka);

/* --- watches -------------------------------------------------------------- */

typedef enum drey_etcd_watch_end_reason {
    DREY_ETCD_WATCH_COMPACTED, /* the revision to resume from was compacted: re-read, then watch again */
    DREY_ETCD_WATCH_CANCELED,  /* etcd cancelled the watch (message says why) */
    DREY_ETCD_WATCH_FAILED,    /* a status no retry can fix (e.g. PERMISSION_DENIED) */
} drey_etcd_watch_end_reason;

typedef struct drey_etcd_watch_end {
    drey_etcd_watch_end_reason reason;
    int64_t compact_revision; /* COMPACTED: the oldest revision still available */
    grpc_status_code code;    /* FAILED: the stream's status */
    const char *message;
} drey_etcd_watch_end;

typedef struct drey_etcd_watch_options {
    const char *key;
    bool prefix;            /* every key starting with key */
    int64_t start_revision; /* the first revision delivered; 0: changes after the watch is set up */
    bool prev_kv;           /* events carry the key's previous value */
    /* Events of one or more revisions, in revision order, never one twice,
     * none skipped (also across reconnections). Valid during the call. */
    void (*on_events)(void *user, Mvccpb__Event *const *events, size_t n);
    /* Once, when the watch delivers nothing more (not after a close). */
    void (*on_end)(void *user, const drey_etcd_watch_end *end);
    void *user;
} drey_etcd_watch_options;

typedef struct drey_etcd_watch drey_etcd_watch;

/* Watches key (or the prefix) from start_revision. A broken stream is
 * reopened (on the next endpoint, after a backoff of 10 ms doubling to 1 s)
 * from the revision after the last one delivered, or after the last progress
 * notification. Returns NULL only for unusable options (no key or callback). */
drey_etcd_watch *drey_etcd_watch_start(drey_etcd *e, const drey_etcd_watch_options *opts);

typedef struct drey_etcd_watch_stats {
    bool connected;        /* etcd confirmed the current stream's watch */
    uint64_t streams;      /* streams opened so far (1 + reconnections) */
    int64_t next_revision; /* the revision the watch resumes from; 0 before etcd confirmed it */
} drey_etcd_watch_stats;

drey_etcd_watch_stats drey_etcd_watch_stats_of(const drey_etcd_watch *w);

/* Stops the watch and frees w; no callback comes after it returns. NULL is
 * accepted. */
void drey_etcd_watch_close(drey_etcd_watch *w);

/* "OK", "UNAVAILABLE", ... */
const char *drey_etcd_code_name(grpc_status_code code);

#endif
