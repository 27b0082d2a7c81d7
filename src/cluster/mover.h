/*
 * mover — moves, new backups and handovers of the partitions this node
 * leads (move.c).
 */
#ifndef DREY_CLUSTER_MOVER_H
#define DREY_CLUSTER_MOVER_H

#include "internal.h"

/* The mover's loop (move.c). */
void *drey_cluster__mover_main(void *arg);

#endif
