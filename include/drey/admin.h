/*
 * admin — drey.admin.v1.Admin, the operator's service: Snapshot, and the
 * readiness details (also served as JSON by the ops listener).
 */
#ifndef DREY_ADMIN_H
#define DREY_ADMIN_H

#include <stdbool.h>
#include <stdio.h>

#include "drey/admin/v1/admin.pb-c.h"
#include "drey/arena.h"
#include "drey/authz.h"
#include "drey/backpressure.h"
#include "drey/cluster.h"
#include "drey/memory.h"
#include "drey/metrics.h"
#include "drey/method.h"
#include "drey/pipeline.h"
#include "drey/storage.h"
#include "drey/tenant.h"

typedef struct drey_admin drey_admin;

typedef struct drey_admin_options {
    bool durable;
    const char *fsync_policy; /* as configured, for the details */
    drey_memory *memory;
    drey_bp *backpressure;    /* may be NULL */
    drey_store *store;
    size_t metrics_principals; /* principals with series of their own; the rest are "other" */
    drey_authz *authz;        /* NULL: no policy (no authz section) */
    drey_tenants *tenants;    /* NULL: no tenants section */
} drey_admin_options;

/* A durable node's storage is set once recovery is done; until then Snapshot
 * is refused with RECOVERING (ephemeral nodes: EPHEMERAL_NODE). */
drey_admin *drey_admin_create(const drey_admin_options *opts);
void drey_admin_destroy(drey_admin *a);
void drey_admin_set_storage(drey_admin *a, drey_storage *st);
/* A cluster node: the details gain the cluster's section. */
void drey_admin_set_cluster(drey_admin *a, drey_cluster *c);
/* The node is draining (SIGTERM): it reports not ready from now on. */
void drey_admin_set_draining(drey_admin *a);
bool drey_admin_register(drey_admin *a, drey_method_table *t);

/* The readiness document, built in the arena. */
Drey__Admin__V1__ReadinessDetails *drey_admin_readiness(drey_admin *a, drey_arena *arena);

/* A metrics collector (drey_metrics_add_collector): the readiness figures as
 * gauges and counters, plus the store and the top principals. ctx is the
 * drey_admin. */
void drey_admin_collect_metrics(void *ctx, FILE *out);

#endif
