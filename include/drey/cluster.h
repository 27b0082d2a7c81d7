/*
 * cluster — several dreyd as one cache.
 *
 * Keys fall into a fixed number of partitions (include/drey/placement.h);
 * each partition has one owner. The cluster's metadata lives in etcd
 * (proto/drey/internal/v1/meta.proto): its config, the members under their
 * leases, the controller's claim and the partition table, each entry's etcd
 * mod_revision being that partition's epoch. Every node watches all of it
 * and routes from memory: no etcd call sits on the request path.
 *
 * Routing is the request chain's route row (drey_cluster_route): a request
 * for a partition this node owns runs here; any other is forwarded once,
 * over the owner's internal listener (mutual TLS, the peer's identity is its
 * certificate's SAN or CN equal to its node id), with the caller's token and
 * remaining deadline. The owner never forwards again: if its table says
 * otherwise it answers NOT_PRIMARY, and the forwarding node retries once
 * when its own table has moved on (safe: refused before the journal). A
 * partition whose owner is not a member is PARTITION_UNAVAILABLE. GetMany
 * scatters per owner and gathers; SetMany stays atomic, so its entries must
 * share a partition (CROSS_PARTITION otherwise). Scan, Clear, ListCaches
 * and GetCacheStats reach every owner (fanout.c).
 *
 * One member is the controller (a lease claim on <prefix>controller). It
 * alone writes the partition table, each write a compare-and-swap on the
 * entry's epoch. It makes the first assignment, by rendezvous hashing, once
 * the cluster's initial_nodes are members.
 *
 * Moves (move.c): when the membership changes the controller plans, by the
 * same rendezvous hashing, which partitions go elsewhere, a few per node at
 * a time, by naming the new node `joining` in the entry. The primary then
 * copies the partition to it (Import calls, journaled there), keeps
 * copying what its writes changed meanwhile, pauses the partition's writes
 * for the last of it, hands the partition over in one etcd transaction
 * (compared on the epoch the controller set) and drops its own copy (a
 * journaled Drop). The handover is the primary's to write because only it
 * knows its copy is complete; a controller that dies meanwhile changes
 * nothing: the next one finds the plan in the table.
 *
 * A node that leaves (drey_cluster_drain: SIGTERM, `drey drain`) marks its
 * member entry draining; the controller plans none onto it and replaces
 * each of its copies before it goes (a new copy elsewhere in sync, then the
 * primary role handed over, then this node's copy dropped), and the node
 * leaves once it holds no copy.
 *
 * If etcd becomes unreachable, nodes keep serving with the table they have;
 * the table cannot change meanwhile (readiness details say so).
 */
#ifndef DREY_CLUSTER_H
#define DREY_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "drey/commit.h"
#include "drey/etcd.h"
#include "drey/method.h"
#include "drey/metrics.h"
#include "drey/partition.h"
#include "drey/pipeline.h"
#include "drey/server.h"
#include "drey/store.h"
#include "drey/tenant.h"
#include "drey/timer.h"
#include "drey/watch.h"

typedef struct drey_cluster drey_cluster;

typedef struct drey_cluster_options {
    const char *etcd;      /* etcd endpoints, comma-separated */
    /* TLS to https:// endpoints and etcd's authentication (NULL or "":
     * none); see include/drey/etcd.h. */
    drey_etcd_tls etcd_tls;
    const char *etcd_user, *etcd_password_file;
    const char *prefix;    /* where the cluster's keys live in etcd, e.g. "drey/" */
    const char *node_id;
    const char *advertise; /* host:port clients reach this node's public listener at */
    const char *internal;  /* host:port peers reach its internal listener at */
    int64_t lease_ttl_s;
    uint32_t partitions;   /* the count this node expects; 0: the cluster's */
    /* Peers: this node's certificate and key (its SAN or CN is its node id)
     * and the CA that signs every node's, pinned. */
    const char *tls_cert, *tls_key, *tls_ca;
    /* "id=host:port,...": peers dialled there instead of where they
     * advertise (the certificate is still checked against the id); NULL or
     * "": none. */
    const char *peer_addresses;
    const char *build;     /* this binary's version, for the member entry */
    drey_timers *timers;   /* a NOT_PRIMARY retry waits for the table on them */
    /* Moves: the data they copy, the chain that journals this node's Drop
     * (its table must hold drey.internal.v1.Partitions: partition.h), the
     * commit whose outcome keys a moving partition's writes change. */
    drey_store *store;
    drey_pipeline *pipeline;
    const drey_method_table *methods;
    drey_commit *commit;
    /* Journals and applies the records this node takes as a backup. */
    drey_partition_replica *replica;
    int64_t move_rate;     /* bytes per second a move sends; 0: unlimited */
    uint32_t max_moves;    /* as controller: partitions moving off one node at a time; 0: none */
    /* Replication (a cluster whose replication factor is above 1): a
     * backup that does not acknowledge a record within this is taken out
     * of the partition's in-sync set; a write of a partition with fewer
     * in-sync copies (the primary included) than min_in_sync is refused. */
    int64_t replication_timeout_ms;
    uint32_t min_in_sync;
    drey_metrics *metrics; /* acknowledgement latency; NULL: not observed */
    /* Joining: how long to keep trying an etcd that does not answer (under
     * Kubernetes etcd may come up after the nodes), backing off between
     * attempts; 0: one attempt. pause waits up to ms between attempts and
     * returns false when the node is asked to stop meanwhile (NULL: a
     * plain sleep). */
    int64_t start_timeout_ms;
    bool (*pause)(void *ctx, int64_t ms);
    void *pause_ctx;
} drey_cluster_options;

/* Loads the peer certificates; no etcd yet. Until joined, the node routes
 * nothing (an empty table). NULL with a message in err. */
drey_cluster *drey_cluster_create(const drey_cluster_options *opts, char *err, size_t err_cap);

/* Where clients and peers reach this node, once its listeners are bound;
 * before drey_cluster_join. */
void drey_cluster_set_addresses(drey_cluster *c, const char *advertise, const char *internal);

/* Connects to etcd (retrying one that does not answer for up to
 * start_timeout_ms), checks the cluster's config against this node, waits
 * for an earlier registration of the same node id to expire, registers
 * under a lease kept alive on a stream, loads and watches the table and
 * stands for controller. 0; -1 with a message in err; DREY_CLUSTER_STOPPED
 * when pause said the node is asked to stop before etcd answered. */
#define DREY_CLUSTER_STOPPED 1
int drey_cluster_join(drey_cluster *c, char *err, size_t err_cap);

/* The pause before attempt (1: the second) to reach etcd at start:
 * doubling from 250 ms up to 10 s, each within +-25 % (random in [0, 1))
 * so that nodes started together do not call in step. */
int64_t drey_cluster_start_backoff_ms(unsigned attempt, double random);

/* Deregisters (revokes the lease: the node's entry goes at once), stops
 * standing for controller and ends WatchTopology streams. Routing goes on
 * with the last table. */
void drey_cluster_leave(drey_cluster *c);
void drey_cluster_destroy(drey_cluster *c);

/* Leaving: marks this node draining and waits, up to timeout_ms, until
 * every copy it holds (primary or in-sync backup) is on other nodes.
 * Returns how many partitions it still leads (0: nothing is unavailable by
 * leaving now). */
uint32_t drey_cluster_drain(drey_cluster *c, int64_t timeout_ms);

/* The pipeline's route row (drey_pipeline_set_route; ctx: the cluster). */
drey_stage_result drey_cluster_route(void *cluster, drey_request *r);

/* The cluster's (once joined): copies of each partition. */
uint32_t drey_cluster_replication_factor(const drey_cluster *c);

/* The pipeline's replication (drey_pipeline_options.replicator; ctx: the
 * cluster): a write this node leads, ordered, goes to the partition's
 * in-sync backups and is applied once every copy has it (replicate.c). */
drey_stage_result drey_cluster_replicate_prepare(void *cluster, drey_request *r);
uint32_t drey_cluster_replicate_appended(void *cluster, drey_request *r, int rc);
void drey_cluster_replicate_released(void *cluster, uint32_t token);
int64_t drey_cluster_replicate_memory_room(void *cluster, const drey_request *r);
/* After drey_cluster_join: the node's Watch streams follow the partitions
 * they cover at their owners (src/cluster/subscribe.c; see watch.h). */
void drey_cluster_attach_watch(drey_cluster *c, drey_watch *w);

/* After drey_cluster_join, before the node serves: tenants' quotas hold
 * across the cluster (src/cluster/tenants.c gives the tenant module what it
 * needs; the sharing is src/tenant/ledger.c). Stop it with
 * drey_tenants_leave before the cluster leaves. 0, or -1 with err. */
int drey_cluster_attach_tenants(drey_cluster *c, drey_tenants *t, char *err, size_t err_cap);

/* drey.cluster.v1.Cluster/WatchTopology on the public server. */
bool drey_cluster_register(drey_cluster *c, drey_server *s);

typedef struct drey_cluster_status {
    char node_id[128];
    char controller[128]; /* "" when none */
    bool is_controller;
    bool etcd_reachable;  /* the keepalive and the watch are current */
    uint32_t partitions;  /* the cluster's count */
    uint32_t owned;       /* partitions this node is primary of */
    uint32_t unassigned;
    uint32_t members;
    int64_t revision;     /* of the table this node routes with */
    uint64_t forwarded, not_primary, retried, unavailable;
    bool draining;
    uint32_t moving_in, moving_out; /* partitions planned to come here / go elsewhere */
    int64_t moving_now;             /* the partition being copied out now, or -1 */
    uint64_t moves_done, moves_failed, moved_entries, moved_bytes;
    uint64_t pause_last_us, pause_max_us; /* writes paused for a handover */
    uint32_t rf, backup_of, under_replicated;
    bool lease_valid;
    uint64_t replication_pending, replicated, replica_failures, isr_shrinks, backups_added, records_taken,
        records_refused, failovers, handovers_done, copies_refused, roleless_dropped;
    /* The controller: moves its last look held back by the settle time (a
     * partition whose primary just changed); UINT32_MAX: that look
     * repaired and planned no move. 0 on other nodes. */
    uint32_t moves_waiting;
} drey_cluster_status;

void drey_cluster_get_status(drey_cluster *c, drey_cluster_status *out);

/* A partition this node leads or backs, as its replication stands here. */
typedef struct drey_cluster_replica {
    uint32_t partition;
    bool primary;
    int64_t epoch;
    uint64_t sequence; /* the last write applied here */
    size_t n_in_sync;  /* primary: its in-sync backups */
    char in_sync[4][128];
    /* Primary: writes waiting for backups, and the oldest one's wait.
     * Backup: how long ago it last knew it had every acknowledged write
     * (UINT64_MAX: never). */
    uint64_t pending, lag_ms;
} drey_cluster_replica;

/* Fills out (cap entries) in partition order; returns how many. */
size_t drey_cluster_get_replicas(drey_cluster *c, drey_cluster_replica *out, size_t cap);

#endif
