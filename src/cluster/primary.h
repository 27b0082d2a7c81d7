/*
 * primary — this node as the primary of partitions (replicate.c): its
 * writes ordered, numbered and sent to every in-sync backup, completed in
 * sequence once all have them; backups that fail taken out of the set;
 * heartbeats.
 */
#ifndef DREY_CLUSTER_PRIMARY_H
#define DREY_CLUSTER_PRIMARY_H

#include "internal.h"

void *drey_cluster__shrinker_main(void *arg);
/* The primaries' heartbeats to their backups (replicate.c); stops with the
 * shrinker. */
void *drey_cluster__beater_main(void *arg);
/* Answers every write still waiting for its backups (this node stops),
 * as commit unknown. */
void drey_cluster__abandon_lines(drey_cluster *c);
/* Writes this node leads that wait for their backups. */
size_t drey_cluster__pending_writes(drey_cluster *c);

/* Whether this node may serve (answer and commit) partition p, which it
 * leads in t: not while it waits out a lease it granted the previous
 * primary as a backup (*wait_ns: how long still); then with a table no
 * older than its registration, while its etcd lease holds or, etcd away,
 * while every in-sync backup's lease holds (room.h). */
bool drey_cluster__may_serve(drey_cluster *c, const drey_cluster__topology *t, uint32_t p, int64_t *wait_ns);

/* Leaving, once its writes were answered and before its etcd lease goes:
 * this node serves nothing more and tells each in-sync backup of every
 * partition it leads, so that the one promoted in its place need not
 * wait out the leases it granted (room.h). A backup not told (within a
 * second) waits them out. */
void drey_cluster__release_leases(drey_cluster *c);

#endif
