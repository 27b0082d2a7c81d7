/*
 * tenants — what the tenant module needs of the cluster to share tenants'
 * quotas through etcd (src/tenant/ledger.c): the etcd client, which
 * partitions this node leads, who is a member. The whole of the cluster's
 * part in tenant quotas.
 */
#include <string.h>

#include "drey/tenant.h"
#include "internal.h"
#include "table.h"

static bool owns(void *ctx, uint32_t p) {
    drey_cluster *c = ctx;
    return p < c->n_parts && c->partitions != NULL && atomic_load(&c->partitions[p].owned);
}

static bool is_member(void *ctx, const char *id) {
    drey_cluster__topology *t = drey_cluster__acquire(ctx);
    bool yes = false;
    for (size_t i = 0; i < t->n_nodes && !yes; i++)
        yes = t->nodes[i].member && strcmp(t->nodes[i].id, id) == 0;
    drey_cluster__topology_unref(t);
    return yes;
}

int drey_cluster_attach_tenants(drey_cluster *c, drey_tenants *t, char *err, size_t err_cap) {
    drey_tenants_cluster tc = {
        .etcd = c->etcd,
        .prefix = c->opts.prefix,
        .node_id = c->opts.node_id,
        .partitions = c->n_parts,
        .owns = owns,
        .is_member = is_member,
        .ctx = c,
    };
    return drey_tenants_join(t, &tc, err, err_cap);
}
