/*
 * partition — one partition as this node runs it, whatever its role in it:
 * the sequence its writes are numbered by, the writes it leads that are
 * under way, the freeze a move puts them through, the keys they change
 * while it is copied out, and the line of writes waiting for backups.
 *
 * What the table says of it (epoch, primary, in-sync set, plans) is the
 * table's (topology.c: immutable snapshots routing reads); this is the
 * node's own state beside it. One per partition, n_parts of them in the
 * cluster, made at join and never moved.
 *
 * Who writes what:
 *   seq, applied, current_ns  atomics. seq: the primary numbers a write
 *       under the chain's order lock (replicate.c); a backup takes a
 *       record by compare-and-swap (backup.c); a copy's last chunk sets it.
 *       applied: raised as writes apply; current_ns: when a backup last
 *       knew it had every acknowledged write (records, heartbeats).
 *   inflight, frozen, moving, owned  atomics. The route row counts a write
 *       in (enter) and out (leave); the mover freezes and thaws, and sets
 *       moving while it copies; the table publication sets owned.
 *   parked, dirty  under mu: writes waiting for a thaw, in arrival order;
 *       keys changed while moving.
 *   line  under line.mu: the primary's writes waiting for their backups
 *       (replicate.c).
 *
 * Lock order: the cluster's table lock (c->mu) before a partition's mu
 * before its line.mu. None of them is held while calling another node or
 * etcd, or while running a parked write.
 *
 * The freeze's rule: a write counts itself in before it looks at frozen,
 * and the mover sets frozen before it waits for the count to drain, so
 * every write is either counted (and waited for) or sees the freeze (and
 * parks): none slips past both.
 */
#ifndef DREY_CLUSTER_PARTITION_H
#define DREY_CLUSTER_PARTITION_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "room.h"

/* A backup's sequence after a record it took failed: it takes no more
 * until a fresh copy. */
#define DREY_CLUSTER_SEQ_BROKEN (UINT64_MAX - 1)

/* A key a write changed while its partition was being copied out. */
typedef struct drey_cluster__dirty {
    struct drey_cluster__dirty *next;
    uint32_t cache_len, key_len;
    char data[]; /* cache then key */
} drey_cluster__dirty;

/* A write parked by a freeze: wake runs it again after the thaw. */
typedef struct drey_cluster__parked {
    struct drey_cluster__parked *next;
    void (*wake)(struct drey_cluster__parked *w);
} drey_cluster__parked;

typedef struct drey_cluster__rec drey_cluster__rec;

/* The primary's writes of the partition, in sequence, until they applied. */
typedef struct drey_cluster__line {
    pthread_mutex_t mu;
    drey_cluster__rec *head, *tail;
    size_t queued;
    bool draining; /* a thread is applying its complete head */
} drey_cluster__line;

typedef struct drey_cluster__partition {
    uint32_t id;
    _Atomic uint64_t seq;      /* the last write's sequence number (see above) */
    _Atomic uint64_t applied;  /* the last write applied here */
    _Atomic int64_t current_ns; /* a backup: when it last knew it had every acknowledged write; 0: never */
    _Atomic uint32_t inflight; /* local writes past the route row, not yet answered */
    _Atomic bool frozen;       /* its last changes are being sent: local writes park */
    _Atomic bool moving;       /* being copied out: answered writes note their keys */
    _Atomic bool cleared;      /* a Clear of it answered while moving: the copy is void */
    /* As a backup: when this node last granted the primary a lease (a
     * heartbeat's mark, backup.c; 0: none, or released), read without a
     * lock; with its epoch and grantee in grant, under mu. */
    _Atomic int64_t granted_ns;
    drey_cluster__grant grant;
    _Atomic bool owned;        /* this node leads it in the published table (Watch subscriptions) */
    pthread_mutex_t mu;
    pthread_cond_t drained;    /* inflight reached 0 while frozen */
    drey_cluster__parked *parked; /* newest first */
    drey_cluster__dirty *dirty;
    size_t n_dirty;
    drey_cluster__line line;
} drey_cluster__partition;

void drey_cluster__partition_init(drey_cluster__partition *p, uint32_t id);
/* Frees what it still holds (parked writes are the caller's: none by then). */
void drey_cluster__partition_destroy(drey_cluster__partition *p);

/* A write this node runs for the partition: true when counted in (leave
 * once it is answered); false when frozen (not counted): park it. */
bool drey_cluster__partition_enter(drey_cluster__partition *p);
void drey_cluster__partition_leave(drey_cluster__partition *p);
/* Parks w until the thaw, whose wake runs it again: true; false when the
 * partition thawed meanwhile (enter again). */
bool drey_cluster__partition_park(drey_cluster__partition *p, drey_cluster__parked *w);

/* Stops new writes and waits (until deadline_ns, monotonic) for the
 * counted ones to leave; false if some are still in (the partition stays
 * frozen: thaw it). */
bool drey_cluster__partition_freeze(drey_cluster__partition *p, int64_t deadline_ns);
/* Lets writes in again and wakes the parked ones, in arrival order. */
void drey_cluster__partition_thaw(drey_cluster__partition *p);

/* While moving: notes a key an answered write changed. */
void drey_cluster__partition_note_key(drey_cluster__partition *p, const char *cache, size_t cache_len,
                                      const char *key, size_t key_len);
/* The keys noted since the last call (the caller frees the list with
 * drey_cluster__dirty_free, or gives it back); *n their count. */
drey_cluster__dirty *drey_cluster__partition_take_dirty(drey_cluster__partition *p, size_t *n);
void drey_cluster__partition_give_back(drey_cluster__partition *p, drey_cluster__dirty *list);
void drey_cluster__dirty_free(drey_cluster__dirty *d);

/* Raises a to v (never lowers it). */
void drey_cluster__raise(_Atomic uint64_t *a, uint64_t v);
void drey_cluster__raise_i64(_Atomic int64_t *a, int64_t v);
/* A node id, hashed: a grant's grantee (room.h). */
uint64_t drey_cluster__node_hash(const char *id);

#endif
