/*
 * The cluster module's shared model: the table as routing reads it (an
 * immutable topology), a partition entry as the controller and primaries
 * edit it, and the cluster object whose sub-structs are its rooms' state.
 * Each room's functions are declared in its own header: table.h (the
 * table, its snapshots and compared writes), peers.h (calls to other
 * nodes), router.h (the route row and the rows that split requests),
 * backup.h, primary.h (replicate.c), mover.h, controller.h and plan.h,
 * subscribe.h, partition.h. A room includes the headers of the rooms it
 * calls, and the calls go one way (tests/build/cluster_rooms_test.py).
 */
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

typedef struct drey_cluster__peers drey_cluster__peers;

/* A backup to take out of a partition's in-sync set. */
typedef struct drey_cluster__shrink {
    struct drey_cluster__shrink *next;
    uint32_t partition;
    int64_t epoch;
    char backup[DREY_CLUSTER_MAX_ID];
    char why[200];
    bool starting; /* the backup answered that it is still starting (RECOVERING) */
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
    /* Per partition: until when (monotonic ns) its lease granted to this
     * node as primary holds (room.h); allocated with the room. */
    _Atomic int64_t *grant_until_ns;
} drey_cluster__room;

#define DREY_CLUSTER_MAX_ROOMS 64

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
/* Whether the entry names id in any role: primary, in sync, a copy's
 * target or a handover's. */
bool drey_cluster__entry_names(const drey_cluster__entry *e, const char *id);
/* Removes id from the list (if there); returns whether it was there. */
bool drey_cluster__entry_remove(char (*ids)[DREY_CLUSTER_MAX_ID], size_t *n, const char *id);
void drey_cluster__entry_add(char (*ids)[DREY_CLUSTER_MAX_ID], size_t *n, const char *id);
/* Takes id out of the in-sync set, and a handover to it with it; returns
 * whether it was there. */
bool drey_cluster__entry_drop_replica(drey_cluster__entry *e, const char *id);



typedef struct drey_cluster__subs drey_cluster__subs;

/* What the route row notes of a write of a partition it runs here
 * (r->route_note), for the rows after it: the replicator, the memory
 * stage's eviction filter, the release that counts it out. */
typedef struct drey_cluster__note {
    drey_cluster *c;
    drey_request *r;
    uint32_t partition;
} drey_cluster__note;

static inline uint32_t drey_cluster__held_partition(const drey_request *r) {
    return ((const drey_cluster__note *)r->route_note)->partition;
}

/* --- the cluster ----------------------------------------------------------- */

typedef struct topo_watcher topo_watcher;

/* The rooms' own state. Each is touched by its room (the file named) and
 * read by the status report (status.c); counters are atomics. */

/* The primary (replicate.c): its backups' room, the backups to take out of
 * in-sync sets, its shrinker and heartbeat threads. */
typedef struct drey_cluster__primary {
    pthread_mutex_t rooms_mu; /* adding a room; reading one needs no lock */
    drey_cluster__room rooms[DREY_CLUSTER_MAX_ROOMS];
    _Atomic size_t n_rooms;
    pthread_t shrinker_thread, beater_thread;
    bool running;
    pthread_mutex_t shrink_mu;
    pthread_cond_t shrink_cond;     /* the beater waits on it too */
    drey_cluster__shrink *shrinks;  /* under shrink_mu */
    bool shrink_stop;
    _Atomic uint64_t replicated, replica_failures, isr_shrinks;
    _Atomic bool released; /* leaving: it serves nothing more (drey_cluster__release_leases) */
} drey_cluster__primary;

/* The mover (move.c): its thread and what its moves did. */
typedef struct drey_cluster__mover {
    pthread_t thread;
    bool running;
    _Atomic uint64_t moves_done, moves_failed, moved_entries, moved_bytes, pause_last_us, pause_max_us;
    _Atomic uint64_t backups_added;  /* copies that joined the in-sync set */
    _Atomic uint64_t handovers_done; /* roles handed to an in-sync backup */
    _Atomic uint64_t roleless_dropped; /* copies dropped that the table gave this node no role in */
    _Atomic int64_t moving;          /* the partition being moved out, or -1 */
} drey_cluster__mover;

/* The controller (controller.c): its thread, and its own memory of the
 * table between looks. */
typedef struct drey_cluster__ctl {
    pthread_t thread;
    bool running;
    /* Each partition's primary as it last saw it, and since when
     * (drey_mono_ms): the rebalance's settle time. */
    char (*seen_primary)[DREY_CLUSTER_MAX_ID];
    int64_t *primary_since_ms;
    /* Its last look's moves held back by the settle time (UINT32_MAX: the
     * look repaired instead, and did not plan). */
    _Atomic uint32_t moves_waiting;
    _Atomic uint64_t failovers; /* partitions given a new primary */
    bool journal_failed;        /* this node's: marked draining for it (the thread's own) */
    int64_t quiet_until_ms;     /* no look before (drey_mono_ms; the thread's own) */
} drey_cluster__ctl;

/* The router's counts (router.c, owner.c). */
typedef struct drey_cluster__route_counts {
    _Atomic uint64_t forwarded, not_primary, retried, unavailable;
} drey_cluster__route_counts;

/* The backup's counts (backup.c). */
typedef struct drey_cluster__backup_counts {
    _Atomic uint64_t records_taken, records_refused;
    _Atomic uint64_t copies_refused; /* Imports, Confirms and Drops refused here */
} drey_cluster__backup_counts;

/*
 * The cluster as this node runs it. The table (table.c, topology.c,
 * entry.c) is shared: written under mu by the watch and by this node's own
 * compared writes, read by every room (routing through the published
 * topology, without mu). Each room's own state is in its sub-struct.
 *
 * Lock order: mu (the table) before a partition's mu (partition.h) before
 * its line's mu; lease_mu and the primary's rooms_mu and shrink_mu are
 * leaves. No lock is held while calling etcd or a peer.
 */
/* A member that left while leading partitions, followed until each has
 * another primary (or it returns): one line when it left, one when its
 * partitions have failed over, saying to whom and how long it took
 * (table.c; under the cluster's mu). */
#define DREY_CLUSTER_DEPARTURES 4
#define DREY_CLUSTER_HEIRS 8
typedef struct drey_cluster__departure {
    char id[DREY_CLUSTER_MAX_ID]; /* "": a free slot */
    int64_t left_ns;
    uint32_t led, taken;          /* partitions it led when it left; of them, led by another since */
    struct {
        char id[DREY_CLUSTER_MAX_ID];
        uint32_t n;
    } heirs[DREY_CLUSTER_HEIRS];
    size_t n_heirs;
} drey_cluster__departure;

struct drey_cluster {
    drey_cluster_options opts;
    char *prefix;
    uint32_t n_parts, rf, initial_nodes;
    drey_cluster__peers *peers;

    /* The table (table.c). */
    drey_etcd *etcd;
    drey_etcd_lease lease;
    pthread_mutex_t lease_mu; /* the keepalive's pointer: replaced while requests read it */
    drey_etcd_keepalive *keepalive;
    drey_etcd_watch *watch;
    int64_t lease_margin_ns;
    /* Of this process's latest registration (the first: its join; again
     * after a lost lease). */
    _Atomic int64_t registered_revision;
    pthread_mutex_t mu;
    pthread_cond_t cond; /* the table changed, or the node leaves */
    /* Under mu: the table as the watch last left it. */
    Drey__Internal__V1__Member **members;
    size_t n_members, cap_members;
    Drey__Internal__V1__PartitionEntry **entries; /* n_parts; NULL: no entry */
    int64_t *epochs;
    char controller[DREY_CLUSTER_MAX_ID];
    int64_t revision;
    bool watch_ended, lease_lost, leaving, stopping;
    /* Until then (drey_mono_ns) a member missing from the membership may
     * only be registering again: this node lost its own lease (etcd was
     * away, and revokes every lapsed lease at its return) and registered
     * again less than a lease ago. Its primaries are still asked. */
    _Atomic int64_t members_unsure_until_ns;
    bool draining; /* this node's member entry says so */
    bool loaded;   /* the table was read whole: from here on changes are news (logged) */
    drey_cluster__departure departures[DREY_CLUSTER_DEPARTURES];
    drey_cluster__topology *topo; /* the published table (a reference) */
    topo_watcher *watchers;        /* WatchTopology streams */

    drey_cluster__partition *partitions; /* n_parts, made at join (partition.h) */
    drey_cluster__primary primary;
    drey_cluster__mover mover;
    drey_cluster__ctl ctl;
    drey_cluster__route_counts route;
    drey_cluster__backup_counts backup;
    drey_cluster__subs *subs; /* drey_cluster_attach_watch */
};


#endif
