/*
 * controller — the elected controller's thread and looks (controller.c),
 * on top of the pure planners (plan.h); a restarted node stepping out.
 */
#ifndef DREY_CLUSTER_CONTROLLER_H
#define DREY_CLUSTER_CONTROLLER_H

#include "internal.h"

struct drey_cluster__plan;
/* The table and the members into pl (plan.h), for planning; returns each
 * entry's epoch (n_parts, malloc'd). Takes c->mu (controller.c). */
int64_t *drey_cluster__snapshot(drey_cluster *c, struct drey_cluster__plan *pl);
/* The controller's look: assign, repair, rebalance, and write what changed
 * (controller.c). */
void drey_cluster__control(drey_cluster *c);
/* A restarted node leaves the entries that name it (controller.c). */
int drey_cluster__step_down(drey_cluster *c, char *err, size_t cap);

/* The controller thread (controller.c). */
void *drey_cluster__controller_main(void *arg);

#endif
