/*
 * backup — this node as a copy of partitions another node leads: the
 * records, heartbeats, copies, handover checks and drops it takes from
 * peers, and what it refuses.
 *
 * THE RULE: a copy in a partition's in-sync set is never replaced,
 * truncated or partly overwritten. Every write the primary acknowledged is
 * on every in-sync copy (it was taken, journaled and applied here before
 * the primary answered), and a failover promotes one of them. So an
 * in-sync copy takes only the primary's records, in sequence; an Import
 * (a chunk of a copy) is taken only by the node the table names the
 * copy's target at the Import's epoch, from that epoch's primary, never
 * by a node holding an in-sync copy or the primary role; and a node drops
 * its copy only when its table names it in no role.
 *
 * The verdicts are pure functions of what this node's table says about
 * the partition (a drey_cluster__holding) and the request's fields, so the
 * rules are tested without a network (tests/unit/cluster/backup_test.c);
 * drey_cluster__backup_take (backup.c) applies them in the route row.
 */
#ifndef DREY_CLUSTER_BACKUP_H
#define DREY_CLUSTER_BACKUP_H

#include <stdbool.h>
#include <stdint.h>

#include "drey/status.h"
#include "internal.h"

/* What this node's table says about one partition, seen from one request. */
typedef struct drey_cluster__holding {
    int64_t epoch;          /* the partition's epoch in this node's table */
    bool primary;           /* this node leads it */
    bool in_sync;           /* this node is one of its in-sync backups */
    bool copy_target;       /* this node is a copy's target (a move's or a new backup's) */
    bool sender_is_primary; /* the request's sender leads it in this table */
} drey_cluster__holding;

/* A record (Replica/Apply) of epoch with sequence seq, last the sequence
 * of the last record taken here. Taken (NONE) only in sequence, and only
 * from the primary this table names while this node backs the partition
 * in sync, or from one naming a newer epoch (the primary that just named
 * this node a backup, or was just promoted, before this node's watch said
 * so). An older epoch that is not the current primary's is refused
 * (STALE_EPOCH): the entry also moves on when a move is planned or a
 * backup added, and the primary's records may name the epoch before that
 * a little longer than this table does. */
drey_error drey_cluster__take_record(const drey_cluster__holding *h, int64_t epoch, uint64_t seq, uint64_t last);

/* A chunk of a copy planned at epoch. NOT_CAUGHT_UP: this table is older
 * than the plan (ask again). */
drey_error drey_cluster__take_import(const drey_cluster__holding *h, int64_t epoch);

/* A handover's check at epoch: this node backs the partition in sync under
 * the sender and has applied every write up to seq. */
drey_error drey_cluster__take_confirm(const drey_cluster__holding *h, int64_t epoch, uint64_t seq, uint64_t applied,
                                      bool broken);

/* This node's own Drop of a copy it handed over: only if its table names it
 * in no role now. */
drey_error drey_cluster__take_drop(const drey_cluster__holding *h);

/* Whether a heartbeat's mark (the primary's epoch and last acknowledged
 * sequence) makes this copy current: from the table's primary, of an epoch
 * no older than the table's, to an in-sync copy that has applied it. */
bool drey_cluster__beat_marks_current(const drey_cluster__holding *h, int64_t epoch, uint64_t seq, uint64_t applied,
                                      bool broken);

/* A heartbeat's mark of a partition at epoch grants its sender a lease
 * (this node will not serve the partition, should it be promoted, until
 * the lease ran out or the sender released it): only an in-sync backup
 * grants, only to the primary its table names, of an epoch no older than
 * the table's. A backup that learns of a newer primary stops at once. */
bool drey_cluster__beat_grants(const drey_cluster__holding *h, int64_t epoch);

/* DREY_ROUTE_PEER: this node's part as a backup or a copy's target, by the
 * method's row; the route row hands such requests here with its table. */
drey_stage_result drey_cluster__backup_take(drey_cluster *c, drey_request *r, const drey_cluster__topology *t);

#endif
