/* The cluster module's internals: the topology, peers, the pieces' glue. */
#ifndef DREY_CLUSTER_INTERNAL_H
#define DREY_CLUSTER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "drey/cluster.h"
#include "drey/etcd.h"
#include "drey/internal/v1/meta.pb-c.h"
#include "partition.h"

#define DREY_CLUSTER_MAX_ID 128
/* Operations per partition-table transaction: below etcd's --max-txn-ops (128). */
#define DREY_CLUSTER_TXN_OPS 100

/* A node as routing sees it. */
typedef struct drey_cluster__node {
    char *id, *advertise, *internal;
    bool member; /* registered now (its lease alive) */
} drey_cluster__node;

#define DREY_CLUSTER_MAX_RF 3
/* Room for an entry's backups while a partition changes hands. */
#define DREY_CLUSTER_MAX_REPLICAS 4

typedef struct drey_cluster__part {
    int64_t epoch;   /* mod_revision of the entry; 0: no entry */
    int32_t primary; /* index into nodes; -1: none */
    uint8_t n_replicas, n_joining;
    int32_t replicas[DREY_CLUSTER_MAX_REPLICAS]; /* in-sync backups, indexes into nodes */
    int32_t joining[DREY_CLUSTER_MAX_REPLICAS];  /* being copied to: a move's target, new backups */
    int32_t next_primary; /* a move's or a handover's target; -1: none */
} drey_cluster__part;

/* An immutable table, shared by reference: routing acquires the current
 * one, the watch publishes a new one. */
typedef struct drey_cluster__topology {
    _Atomic int refs;
    int64_t revision;
    uint32_t n_parts;
    uint32_t rf;
    drey_cluster__part *parts;
    size_t n_nodes;
    drey_cluster__node *nodes;
    int32_t self; /* index of this node; -1 if not in the table */
    char controller[DREY_CLUSTER_MAX_ID];
} drey_cluster__topology;

void drey_cluster__topology_unref(drey_cluster__topology *t);
/* Whether t names node (an index, -1: none) one of p's in-sync backups, or
 * the target of one of p's copies under way. */
bool drey_cluster__in_sync(const drey_cluster__topology *t, uint32_t p, int32_t node);
bool drey_cluster__copy_target(const drey_cluster__topology *t, uint32_t p, int32_t node);

/* --- peers: calls to other nodes' internal listeners ---------------------- */

typedef struct drey_cluster__peers drey_cluster__peers;

drey_cluster__peers *drey_cluster__peers_create(const char *cert, const char *key, const char *ca, char *err,
                                                size_t err_cap);
void drey_cluster__peers_destroy(drey_cluster__peers *p);
/* --cluster-peer-address: "id=host:port[,id=host:port...]", each peer id
 * dialled at its address instead of the one it advertises; before the
 * first call. false with a message in err if spec is malformed. */
bool drey_cluster__peers_dial_via(drey_cluster__peers *p, const char *spec, char *err, size_t err_cap);

typedef struct drey_cluster__header {
    const char *key;
    const char *value;
    size_t len;
} drey_cluster__header;

/* A call in flight, for cancelling it. */
typedef struct drey_cluster__pcall drey_cluster__pcall;

/* A unary call of path on node id at address, with the serialized request
 * and headers; done runs once, on the peers' thread, with the answer (whose
 * buffers live until done returns). The returned handle holds a reference:
 * drop it with drey_cluster__pcall_cancel or drey_cluster__pcall_release,
 * once, from any thread (done may have run already or not). */
drey_cluster__pcall *drey_cluster__peers_call(drey_cluster__peers *p, const char *id, const char *address, const char *path,
                              const uint8_t *request, size_t len, const drey_cluster__header *headers,
                              size_t n_headers, int64_t deadline_mono_ns,
                              void (*done)(void *arg, const drey_answer *a), void *arg);
/* A call of path to node id that its caller runs itself on cq (a watch's
 * subscription: a server stream of its own, subscribe.c), on the peer's
 * channel (made if need be): same credentials, same identity check. */
struct grpc_call;
struct grpc_completion_queue;
struct grpc_call *drey_cluster__peers_new_call(drey_cluster__peers *p, const char *id, const char *address,
                                               const char *path, struct grpc_completion_queue *cq);

/* Cancels the call (its done comes with CANCELLED unless it is over) and
 * drops the handle. */
void drey_cluster__pcall_cancel(drey_cluster__pcall *c);
void drey_cluster__pcall_release(drey_cluster__pcall *c);

/* --- moves ------------------------------------------------------------------ */

/* Scan, Clear, ListCaches, GetCacheStats: every node's share (fanout.c). */
drey_stage_result drey_cluster__route_cache_wide(drey_cluster *c, drey_request *r, drey_cluster__topology *t);

/* The ErrorInfo reason of a peer's answer into out ("" for none). */
void drey_cluster__answer_reason(const drey_answer *a, char *out, size_t cap);

/* The metadata of a call to another node: the caller's token, this node's
 * id, the partition's epoch (0: none); h holds 3 (router.c). */
size_t drey_cluster__forward_headers(drey_cluster *c, drey_request *r, int64_t epoch, drey_cluster__header *h);

/* A scan's share names the owners' hash it began with. */
#define DREY_SCAN_OWNERS "drey-scan-owners"

/* The mover's loop (move.c). */
void *drey_cluster__mover_main(void *arg);

/* Applies a key's value written by this node (the handover) as the watch
 * would, so routing follows at once; member.c. */
void drey_cluster__apply_own_write(drey_cluster *c, const char *key, const uint8_t *value, size_t len,
                                   int64_t revision);

/* <prefix>partitions/<p>, in a (member.c). */
char *drey_cluster__partition_key(const drey_cluster *c, drey_arena *a, uint32_t p);

/* A pause between retries against etcd, or a rate cap's: never a
 * synchronisation (member.c). */
void drey_cluster__nap_ms(int64_t ms);

/* --- replication (replicate.c) ------------------------------------------------ */

/* A backup to take out of a partition's in-sync set. */
typedef struct drey_cluster__shrink {
    struct drey_cluster__shrink *next;
    uint32_t partition;
    int64_t epoch;
    char backup[DREY_CLUSTER_MAX_ID];
    char why[200];
} drey_cluster__shrink;

/* What a backup last said it has room for, and what was sent to it since
 * that it has not acknowledged: its primaries refuse a write that would
 * not fit on it before anything is journaled anywhere. */
typedef struct drey_cluster__room {
    char id[DREY_CLUSTER_MAX_ID];
    _Atomic uint64_t journal;          /* frame bytes; UINT64_MAX: no quota (or not heard yet) */
    _Atomic int64_t memory;            /* accounted bytes; INT64_MAX: not heard yet */
    _Atomic uint64_t sent_journal;     /* in flight */
    _Atomic int64_t sent_memory;
    _Atomic int64_t heard_ns;          /* when journal and memory were reported */
    _Atomic bool beating;              /* a heartbeat to it is in flight */
} drey_cluster__room;

#define DREY_CLUSTER_MAX_ROOMS 64

void *drey_cluster__shrinker_main(void *arg);
/* The primaries' heartbeats to their backups (replicate.c); stops with the
 * shrinker. */
void *drey_cluster__beater_main(void *arg);
/* This node's lease is valid by its own clock. */
bool drey_cluster__lease_valid(drey_cluster *c);
/* This node may lead the partitions t names it primary of: its lease is
 * valid, and t is at least as new as its registration under that lease (a
 * node that lost its lease and registered again may have been replaced
 * meanwhile: it leads nothing until its table says whether). */
bool drey_cluster__may_lead(drey_cluster *c, const drey_cluster__topology *t);
/* The partition of a write the route row held for this node (router.c). */
uint32_t drey_cluster__held_partition(const drey_request *r);
/* Answers every write still waiting for its backups (this node stops),
 * as commit unknown. */
void drey_cluster__abandon_lines(drey_cluster *c);
/* Writes this node leads that wait for their backups. */
size_t drey_cluster__pending_writes(drey_cluster *c);

/* --- partition entries ------------------------------------------------------ */

/* An entry as the controller and the primary edit it. */
typedef struct drey_cluster__entry {
    char primary[DREY_CLUSTER_MAX_ID];
    char replicas[DREY_CLUSTER_MAX_REPLICAS][DREY_CLUSTER_MAX_ID];
    char syncing[DREY_CLUSTER_MAX_REPLICAS][DREY_CLUSTER_MAX_ID];
    char joining[DREY_CLUSTER_MAX_ID];  /* a move's target, never in replicas; "": no move */
    char handover[DREY_CLUSTER_MAX_ID]; /* an in-sync backup to hand the primary role to; "": none */
    size_t n_replicas, n_syncing;
} drey_cluster__entry;

/* e NULL: the empty entry. */
void drey_cluster__entry_of(const Drey__Internal__V1__PartitionEntry *e, drey_cluster__entry *out);
bool drey_cluster__entry_has(char (*ids)[DREY_CLUSTER_MAX_ID], size_t n, const char *id);
/* Removes id from the list (if there); returns whether it was there. */
bool drey_cluster__entry_remove(char (*ids)[DREY_CLUSTER_MAX_ID], size_t *n, const char *id);
void drey_cluster__entry_add(char (*ids)[DREY_CLUSTER_MAX_ID], size_t *n, const char *id);
/* Takes id out of the in-sync set, and a handover to it with it; returns
 * whether it was there. */
bool drey_cluster__entry_drop_replica(drey_cluster__entry *e, const char *id);

/* Adds to t: if p's entry is still at epoch, put e (in a). */
void drey_cluster__txn_put_entry(drey_cluster *c, drey_etcd_txn *t, drey_arena *a, uint32_t p, int64_t epoch,
                                 const drey_cluster__entry *e);

typedef enum drey_cluster__cas {
    DREY_CLUSTER_CAS_APPLIED, /* written, and applied to this node's table */
    DREY_CLUSTER_CAS_REFUSED, /* the entry moved on, or etcd refused: nothing written */
    DREY_CLUSTER_CAS_UNKNOWN, /* etcd did not say (it may have applied) */
} drey_cluster__cas;

/* Writes p's entry if it is still at epoch, applying it to this node's
 * table at once when it did; err says why not. */
drey_cluster__cas drey_cluster__cas_entry(drey_cluster *c, uint32_t p, int64_t epoch, const drey_cluster__entry *e,
                                          char *err, size_t err_cap);
/* --- watches: clients' Watch streams following their partitions (subscribe.c) --- */

typedef struct drey_cluster__subs drey_cluster__subs;
/* Ends every subscription; before the peers go. */
void drey_cluster__subs_destroy(drey_cluster__subs *s);

/* --- the cluster ----------------------------------------------------------- */

typedef struct topo_watcher topo_watcher;

struct drey_cluster {
    drey_cluster_options opts;
    char *prefix;
    drey_etcd *etcd;
    drey_etcd_lease lease;
    pthread_mutex_t lease_mu; /* the keepalive's pointer: replaced while requests read it */
    drey_etcd_keepalive *keepalive;
    drey_etcd_watch *watch;
    drey_cluster__peers *peers;
    uint32_t n_parts, rf, initial_nodes;

    pthread_mutex_t mu;
    pthread_cond_t cond;
    /* Under mu: the table as the watch last left it. */
    Drey__Internal__V1__Member **members;
    size_t n_members, cap_members;
    Drey__Internal__V1__PartitionEntry **entries; /* n_parts; NULL: no entry */
    int64_t *epochs;
    char controller[DREY_CLUSTER_MAX_ID];
    int64_t revision;
    bool watch_ended, lease_lost, leaving, stopping;
    bool draining; /* this node's member entry says so */
    drey_cluster__topology *topo; /* the published table (a reference) */
    topo_watcher *watchers;        /* WatchTopology streams */

    pthread_t controller_thread, mover_thread;
    bool controller_running, mover_running;

    drey_cluster__partition *partitions; /* n_parts, made at join (partition.h) */

    _Atomic uint64_t moves_done, moves_failed, moved_entries, moved_bytes, pause_last_us, pause_max_us;
    _Atomic int64_t moving; /* the partition being moved out, or -1 */
    _Atomic uint32_t clearing; /* Clears running here: a move's copy waits for them */
    pthread_mutex_t clear_mu;
    pthread_cond_t clear_cond; /* clearing reached 0 */

    _Atomic uint64_t forwarded, not_primary, retried, unavailable;
    /* Of this process's latest registration (the first: its join; again
     * after a lost lease). */
    _Atomic int64_t registered_revision;
    pthread_mutex_t rooms_mu;    /* adding a room; reading one needs no lock */
    drey_cluster__room rooms[DREY_CLUSTER_MAX_ROOMS];
    _Atomic size_t n_rooms;
    int64_t lease_margin_ns;
    pthread_t shrinker_thread, beater_thread;
    bool shrinker_running;
    pthread_mutex_t shrink_mu;
    pthread_cond_t shrink_cond;
    drey_cluster__shrink *shrinks; /* under shrink_mu */
    bool shrink_stop;
    _Atomic uint64_t replicated, replica_failures, isr_shrinks, records_taken, records_refused;
    _Atomic uint64_t copies_refused; /* Imports, Confirms and Drops refused here (router.c) */

    _Atomic uint64_t failovers;     /* as controller: partitions given a new primary */
    _Atomic uint64_t handovers_done; /* as primary: roles handed to an in-sync backup */
    /* The controller thread's own: each partition's primary as it last
     * saw it, and since when (drey_mono_ms), for the rebalance's settle
     * time (controller.c). */
    char (*seen_primary)[DREY_CLUSTER_MAX_ID];
    int64_t *primary_since_ms;
    /* Its last look's moves held back by the settle time (UINT32_MAX: the
     * look repaired instead, and did not plan). */
    _Atomic uint32_t moves_waiting;
    _Atomic uint64_t backups_added; /* as primary: copies that joined the in-sync set */

    drey_cluster__subs *subs; /* drey_cluster_attach_watch */
};

drey_cluster__topology *drey_cluster__acquire(drey_cluster *c);
/* Rebuilds the topology from the table; needs c->mu. */
void drey_cluster__publish_locked(drey_cluster *c);
/* WatchTopology streams get the new topology; needs c->mu. */
void drey_cluster__notify_watchers_locked(drey_cluster *c);
void drey_cluster__close_watchers(drey_cluster *c);

/* The registered member named id, or NULL; needs c->mu. */
const Drey__Internal__V1__Member *drey_cluster__member_locked(const drey_cluster *c, const char *id);

struct drey_cluster__plan;
/* The table and the members into pl (plan.h), for planning; returns each
 * entry's epoch (n_parts, malloc'd). Takes c->mu (controller.c). */
int64_t *drey_cluster__snapshot(drey_cluster *c, struct drey_cluster__plan *pl);
/* The controller's look: assign, repair, rebalance, and write what changed
 * (controller.c). */
void drey_cluster__control(drey_cluster *c);
/* A restarted node leaves the entries that name it (controller.c). */
int drey_cluster__step_down(drey_cluster *c, char *err, size_t cap);

/* The controller's loop (member.c). */
void *drey_cluster__controller_main(void *arg);

#endif
