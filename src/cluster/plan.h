/*
 * plan — the controller's decisions, as pure functions of the partition
 * table and the members: the first assignment, the repairs (failover,
 * copies on departed nodes, new backups) and the rebalance (moves and
 * handovers). No etcd, no locks, no clock: the controller (controller.c)
 * takes a snapshot into a drey_cluster__plan, runs these, and writes each
 * entry they changed in one transaction compared on the epoch it read, so
 * a plan made on a stale table changes nothing.
 *
 * The rules every plan keeps, because a promotion relies on them:
 *   - a node in a partition's in-sync set (`replicas`) has every write the
 *     primary acknowledged; it is never the target of a copy (`joining`,
 *     `syncing`), whose first chunk replaces what the target holds;
 *   - the primary role goes to an in-sync backup by a handover (no copy),
 *     and to any other node by a move (a copy, then the flip);
 *   - only an in-sync backup is promoted when a primary is gone.
 */
#ifndef DREY_CLUSTER_PLAN_H
#define DREY_CLUSTER_PLAN_H

#include <stdbool.h>
#include <stdint.h>

#include "internal.h"

/* How long the rebalance leaves a partition alone after its primary
 * changed: a membership that flaps would otherwise bounce primaries back
 * and forth, each bounce a pause of the partition's writes. */
#define DREY_CLUSTER_MOVE_SETTLE_MS 5000
/* Handovers planned per primary at once: each costs its partition a pause
 * of a few milliseconds and no copy, so more than moves. */
#define DREY_CLUSTER_MAX_HANDOVERS 8

typedef struct drey_cluster__plan {
    uint32_t n_parts;
    uint32_t rf;
    uint32_t max_moves;                /* copies (moves, new backups) per primary at once */
    drey_cluster__entry *ent;          /* n_parts; edited in place */
    bool *changed;                     /* n_parts: the entries to write back */
    char (*live)[DREY_CLUSTER_MAX_ID]; /* the members (lease alive), sorted */
    bool *draining;                    /* n_live: the member is leaving */
    size_t n_live;
    /* n_parts: when the partition's primary last changed as the controller
     * saw it (0: not since it started); NULL: never. With now_ms, the
     * rebalance's settle time. */
    const int64_t *primary_since_ms;
    int64_t now_ms;
} drey_cluster__plan;

typedef struct drey_cluster__plan_stats {
    uint32_t assigned;  /* partitions given their first primary */
    uint32_t promoted;  /* failovers */
    uint32_t stranded;  /* primary gone, no live in-sync backup: waits for it */
    uint32_t dropped;   /* in-sync backups on departed or leaving nodes */
    uint32_t synced;    /* new backups planned (syncing) */
    uint32_t moves;     /* primary roles planned onto a node by a copy */
    uint32_t handovers; /* primary roles planned onto an in-sync backup */
    uint32_t cancelled; /* plans undone: their target left */
    uint32_t waiting;   /* primary roles the placement would move, held back by the settle time */
    uint32_t placed;    /* backups planned (syncing) where the placement wants them */
    uint32_t surplus;   /* in-sync backups the placement does not want, dropped once its own are in sync */
} drey_cluster__plan_stats;

/* An empty table of n_parts entries; add members, fill ent, then plan. */
void drey_cluster__plan_init(drey_cluster__plan *pl, uint32_t n_parts, uint32_t rf, uint32_t max_moves,
                             size_t max_members);
/* Adds a member (the list stays sorted). */
void drey_cluster__plan_member(drey_cluster__plan *pl, const char *id, bool draining);
void drey_cluster__plan_free(drey_cluster__plan *pl);

/* The first assignment: every partition without a primary gets the
 * members rendezvous hashing ranks first (primary and rf-1 backups, all
 * empty, so in sync from the start), once initial_nodes are members when
 * no partition has one yet. */
void drey_cluster__plan_assign(drey_cluster__plan *pl, uint32_t initial_nodes, drey_cluster__plan_stats *st);

/* Failover, departed copies and new backups:
 *   - in-sync backups on nodes that are not members are dropped (and a
 *     handover to them), copies under way to nodes gone or leaving too; a
 *     leaving node's in-sync backup stays until the rebalance has its
 *     replacement in sync;
 *   - a primary that is not a member is replaced by its first in-sync
 *     backup that stays (else one that is leaving); with none the
 *     partition waits for it (its data is on that node only);
 *   - a partition with fewer copies than the factor gets a `syncing`
 *     backup: the first member not holding it that the placement wants
 *     there (else the one rendezvous hashing ranks highest), at most
 *     max_moves copies (moves and new backups) per primary at once. */
void drey_cluster__plan_repair(drey_cluster__plan *pl, drey_cluster__plan_stats *st);

/* A restarted node (self) taking itself out of every entry written before
 * `before` (the revision it registered at) that names it: its copies may
 * lack acknowledged writes, or hold writes never acknowledged. A partition
 * it led goes to a member in its in-sync set; with none it keeps it
 * (counted stranded: nobody else has it). */
void drey_cluster__plan_step_out(drey_cluster__plan *pl, const char *self, const int64_t *epochs, int64_t before,
                                 drey_cluster__plan_stats *st);

/* Every copy toward the placement (drey/placement.h: primaries and
 * backups by rendezvous hashing with bounded loads) of the members that
 * stay (and primaries that are down with no one to fail over to: their
 * partitions wait for them). The primary role:
 *   - the placement's primary in the in-sync set: a handover;
 *   - the placement's primary copying the partition as a new backup:
 *     nothing until that copy is in sync (then a handover);
 *   - the current primary also wanted by the placement (as a backup): the
 *     placement's primary is copied as a new backup first (then a
 *     handover), so the current primary's copy stays;
 *   - otherwise a move (`joining`).
 * The backups, in a partition with no move or handover planned:
 *   - a node the placement wants that holds nothing of it gets a `syncing`
 *     copy (not the primary's place when a move will bring it), one copy
 *     beyond the factor at most;
 *   - an in-sync backup or a copy under way the placement does not want
 *     goes once the partition has as many in-sync copies without it as the
 *     placement wants (make before break: its replacement is in sync).
 * A partition whose primary changed less than the settle time ago keeps
 * its primary (its backups go on). Copies (moves, new backups) at most max_moves per primary at once.
 * A plan whose target left, or (a handover) left the in-sync set, is
 * cancelled; a move planned onto an in-sync backup becomes a handover.
 * Only once every partition has a primary. A table the placement is in
 * plans nothing. */
void drey_cluster__plan_rebalance(drey_cluster__plan *pl, drey_cluster__plan_stats *st);

#endif
