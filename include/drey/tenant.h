/*
 * tenant — tenants' memory: whose entries are how many bytes, and the
 * quota each tenant's writes are held to.
 *
 * A tenant is the value of the policy's tenants.claim in the caller's token
 * (include/drey/authz.h). Every entry remembers the tenant whose write
 * created or last replaced it (the store's entries carry a small number
 * this table hands out; snapshots, the journal and moves carry the name),
 * and the store reports every change of a tenant entry's accounted bytes
 * here: stored, replaced (by the same tenant or another), removed, expired,
 * evicted, swept after a Clear. So a tenant's bytes are exact through
 * restarts (recovery replays through the same store) and need no scan.
 *
 * Admission (drey_tenants_admit): a write whose growth would take its
 * tenant past its quota is refused before anything is journaled
 * (TENANT_MEMORY_QUOTA); writes admitted and not yet applied hold their
 * growth as a reservation, so concurrent writes cannot pass the quota
 * together.
 *
 * Clusters (drey_tenants_join): the quota holds for the sum over the
 * partitions' primaries. Bytes are kept per partition, and a node counts
 * those of the partitions it leads; the quota is shared out between nodes
 * as grants recorded in etcd under <prefix>tenants/<tenant>, each change a
 * compare-and-swap (ledger.c). A node admits a write while its tenant's
 * bytes here stay within its grant; it asks for more (the write waits for
 * the answer, one etcd transaction) when they would not, and hands back
 * what it does not use when another node asks. The grants never add up to
 * more than the quota, so neither can the bytes (docs/security.md).
 */
#ifndef DREY_TENANT_H
#define DREY_TENANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "drey/etcd.h"
#include "drey/store.h"

typedef struct drey_tenants drey_tenants;

/* The table, attached to the store as its tenant accountant. */
drey_tenants *drey_tenants_create(drey_store *store);
/* After the store is no longer used (the store keeps calling in until then). */
void drey_tenants_destroy(drey_tenants *t);

/* A tenant's number (1, 2, ...; 0 for ""), the same for the process's life. */
uint32_t drey_tenants_intern(drey_tenants *t, const char *name, size_t len);

/* The quota of a tenant by name (readiness and metrics show it beside its
 * bytes); -1: none. NULL: none known. */
void drey_tenants_set_limits(drey_tenants *t, int64_t (*limit)(void *ctx, const char *tenant, size_t len), void *ctx);

/* A write's tenant, its quota and the bytes it would add to the tenant
 * (new entries' bytes less those of the tenant's own entries it replaces). */
typedef struct drey_tenant_ask {
    uint32_t tenant;
    int64_t limit_bytes;  /* >= 0 */
    int64_t growth_bytes; /* > 0 */
    /* A cluster node that must first ask etcd for more of the quota parks
     * the write and calls resume(arg) once it has an answer (or gave up);
     * the caller then asks again with may_wait false. */
    bool may_wait;
    void (*resume)(void *arg);
    void *arg;
} drey_tenant_ask;

typedef enum drey_tenant_verdict {
    DREY_TENANT_ADMITTED, /* the growth is reserved: drey_tenants_release it once the write is answered */
    DREY_TENANT_REFUSED,  /* used and limit say why */
    DREY_TENANT_PARKED,   /* resume comes */
} drey_tenant_verdict;

typedef struct drey_tenant_admission {
    int64_t used_bytes;  /* the tenant's (cluster: across the primaries, as known here) */
    int64_t limit_bytes; /* its quota (cluster: the node's grant when it is less) */
} drey_tenant_admission;

drey_tenant_verdict drey_tenants_admit(drey_tenants *t, const drey_tenant_ask *a, drey_tenant_admission *out);
/* The reservation of an admitted write, once it was applied or refused. */
void drey_tenants_release(drey_tenants *t, uint32_t tenant, int64_t growth_bytes);
/* A write refused for its tenant's quota (the counters). */
void drey_tenants_refused(drey_tenants *t, uint32_t tenant);

/* A tenant's bytes here (single node: all of its entries; cluster node: in
 * the partitions it leads), reserved growth not included. */
int64_t drey_tenants_used(drey_tenants *t, uint32_t tenant);

/* --- clusters ------------------------------------------------------------------ */

typedef struct drey_tenants_cluster {
    drey_etcd *etcd;        /* the cluster's client (not owned) */
    const char *prefix;     /* the cluster's etcd prefix, e.g. "drey/" */
    const char *node_id;
    uint32_t partitions;
    /* Whether this node leads partition p now; whether a node id is a
     * member. Cheap and lock-free: called from this module's thread. */
    bool (*owns)(void *ctx, uint32_t p);
    bool (*is_member)(void *ctx, const char *node_id);
    void *ctx;
} drey_tenants_cluster;

/* After the cluster joined and before the node serves (nothing writes
 * meanwhile): counts every entry by partition and starts sharing quotas
 * through etcd. 0, or -1 with err. */
int drey_tenants_join(drey_tenants *t, const drey_tenants_cluster *c, char *err, size_t err_cap);
/* Stops the ledger's thread and watch (before the etcd client closes). */
void drey_tenants_leave(drey_tenants *t);

/* --- what operators see ------------------------------------------------------------ */

typedef struct drey_tenant_stats {
    char tenant[129];
    int64_t used_bytes;         /* here */
    int64_t limit_bytes;        /* -1: none */
    int64_t cluster_used_bytes; /* single node: used_bytes */
    int64_t granted_bytes;      /* cluster: this node's share; single node: the limit */
    uint64_t refused_writes;
} drey_tenant_stats;

typedef struct drey_tenants_summary {
    size_t tenants;             /* with entries here */
    uint64_t refused_writes;
    drey_tenant_stats other;    /* every tenant beyond the top, summed */
    size_t other_tenants;
} drey_tenants_summary;

/* The top (at most cap) tenants by bytes here, largest first; returns how
 * many; sum gets the rest. */
size_t drey_tenants_top(drey_tenants *t, drey_tenant_stats *top, size_t cap, drey_tenants_summary *sum);

/* A metrics collector (ctx: the table): drey_tenant_used_bytes{tenant},
 * drey_tenant_limit_bytes{tenant}, drey_tenant_refused_writes_total{tenant}
 * for the top 10 tenants and tenant="other" for the rest (bounded
 * cardinality), drey_tenants. */
void drey_tenants_collect_metrics(void *ctx, FILE *out);

#endif
