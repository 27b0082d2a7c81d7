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

#endif
