/*
 * topology — the table routing reads, and the stream clients route with.
 *
 * The watch thread rebuilds an immutable topology after every batch of
 * etcd events and swaps it in under the cluster's mutex; routing takes a
 * reference under the same mutex (a few nanoseconds uncontended), so a
 * request routes with one consistent table however long it runs.
 *
 * WatchTopology streams are kept in a list under that mutex and sent the
 * new topology with each publication: drey.cluster.v1.Topology, the same
 * document for every stream.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/cluster/v1/cluster.pb-c.h"
#include "drey/log.h"
#include "internal.h"
#include "table.h"

struct topo_watcher {
    topo_watcher *next, *prev;
    drey_call *call;
};

static char *xstrdup(const char *s) {
    return drey_xstrdup(s != NULL ? s : "");
}

void drey_cluster__topology_unref(drey_cluster__topology *t) {
    if (t == NULL || atomic_fetch_sub(&t->refs, 1) != 1)
        return;
    for (size_t i = 0; i < t->n_nodes; i++) {
        free(t->nodes[i].id);
        free(t->nodes[i].advertise);
        free(t->nodes[i].internal);
    }
    free(t->nodes);
    free(t->parts);
    free(t);
}

bool drey_cluster__in_sync(const drey_cluster__topology *t, uint32_t p, int32_t node) {
    for (uint8_t i = 0; node >= 0 && i < t->parts[p].n_replicas; i++) {
        if (t->parts[p].replicas[i] == node)
            return true;
    }
    return false;
}

bool drey_cluster__copy_target(const drey_cluster__topology *t, uint32_t p, int32_t node) {
    for (uint8_t i = 0; node >= 0 && i < t->parts[p].n_joining; i++) {
        if (t->parts[p].joining[i] == node)
            return true;
    }
    return false;
}

drey_cluster__topology *drey_cluster__acquire(drey_cluster *c) {
    pthread_mutex_lock(&c->mu);
    drey_cluster__topology *t = c->topo;
    atomic_fetch_add(&t->refs, 1);
    pthread_mutex_unlock(&c->mu);
    return t;
}

/* The node's index in t, added (not a member: known only from the table)
 * if new. */
static int32_t node_index(drey_cluster__topology *t, size_t *cap, const char *id) {
    for (size_t i = 0; i < t->n_nodes; i++) {
        if (strcmp(t->nodes[i].id, id) == 0)
            return (int32_t)i;
    }
    if (t->n_nodes == *cap) {
        *cap = *cap ? *cap * 2 : 8;
        t->nodes = drey_xrealloc(t->nodes, *cap, sizeof *t->nodes);
    }
    t->nodes[t->n_nodes] = (drey_cluster__node){.id = xstrdup(id), .advertise = xstrdup(""), .internal = xstrdup("")};
    return (int32_t)t->n_nodes++;
}

void drey_cluster__publish_locked(drey_cluster *c) {
    drey_cluster__topology *t = drey_xcalloc(1, sizeof *t);
    atomic_store(&t->refs, 1);
    t->revision = c->revision;
    t->n_parts = c->n_parts;
    t->rf = c->rf;
    t->parts = drey_xcalloc(c->n_parts ? c->n_parts : 1, sizeof *t->parts);
    size_t cap = 0;
    for (size_t i = 0; i < c->n_members; i++) {
        int32_t k = node_index(t, &cap, c->members[i]->id);
        drey_cluster__node *n = &t->nodes[k];
        free(n->advertise);
        free(n->internal);
        n->advertise = xstrdup(c->members[i]->advertise);
        n->internal = xstrdup(c->members[i]->internal);
        n->member = true;
    }
    for (uint32_t p = 0; p < c->n_parts; p++) {
        const Drey__Internal__V1__PartitionEntry *e = c->entries[p];
        t->parts[p].epoch = c->epochs[p];
        t->parts[p].primary = e != NULL && e->primary[0] != '\0' ? node_index(t, &cap, e->primary) : -1;
        drey_cluster__part *pt = &t->parts[p];
        for (size_t i = 0; e != NULL && i < e->n_replicas && i < DREY_CLUSTER_MAX_REPLICAS; i++)
            pt->replicas[pt->n_replicas++] = node_index(t, &cap, e->replicas[i]);
        for (size_t i = 0; e != NULL && i < e->n_joining && pt->n_joining < DREY_CLUSTER_MAX_REPLICAS; i++)
            pt->joining[pt->n_joining++] = node_index(t, &cap, e->joining[i]);
        for (size_t i = 0; e != NULL && i < e->n_syncing && pt->n_joining < DREY_CLUSTER_MAX_REPLICAS; i++)
            pt->joining[pt->n_joining++] = node_index(t, &cap, e->syncing[i]);
        pt->next_primary = e == NULL                ? -1
                           : e->n_joining > 0        ? node_index(t, &cap, e->joining[0])
                           : e->handover[0] != '\0' ? node_index(t, &cap, e->handover)
                                                     : -1;
    }
    /* A node the table names whose membership lapsed keeps the internal
     * address it had: etcd revokes every lease after an outage longer
     * than their TTL, and until the members register again their
     * primaries still send them records and beats (the table, not the
     * membership, says who backs a partition). Clients are not given it. */
    const drey_cluster__topology *was = c->topo;
    for (size_t i = 0; was != NULL && i < t->n_nodes; i++) {
        drey_cluster__node *n = &t->nodes[i];
        for (size_t j = 0; !n->member && j < was->n_nodes; j++) {
            if (strcmp(was->nodes[j].id, n->id) == 0 && was->nodes[j].internal[0] != '\0') {
                free(n->internal);
                n->internal = xstrdup(was->nodes[j].internal);
            }
        }
    }
    t->self = -1;
    for (size_t i = 0; i < t->n_nodes; i++) {
        if (strcmp(t->nodes[i].id, c->opts.node_id) == 0)
            t->self = (int32_t)i;
    }
    snprintf(t->controller, sizeof t->controller, "%s", c->controller);
    /* For watch subscriptions: an owner reports a partition's changes only
     * while it owns it (not the copy it receives, nor the one it drops). */
    for (uint32_t p = 0; c->partitions != NULL && p < c->n_parts; p++)
        atomic_store(&c->partitions[p].owned, t->self >= 0 && t->parts[p].primary == t->self);
    drey_cluster__topology *old = c->topo;
    c->topo = t;
    drey_cluster__topology_unref(old);
    drey_cluster__notify_watchers_locked(c);
}

/* --- WatchTopology ---------------------------------------------------------- */

static void send_topology(drey_call *call, const drey_cluster__topology *t) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    Drey__Cluster__V1__Topology msg = DREY__CLUSTER__V1__TOPOLOGY__INIT;
    Drey__Cluster__V1__HashRule hash = DREY__CLUSTER__V1__HASH_RULE__INIT;
    hash.function = DREY__CLUSTER__V1__HASH_RULE__FUNCTION__CRC32C_CACHE_ROUTING_KEY;
    hash.partitions = t->n_parts;
    msg.revision = t->revision;
    msg.hash = &hash;
    msg.replication_factor = t->rf;
    msg.n_nodes = t->n_nodes;
    msg.nodes = drey_arena_alloc(&a, (t->n_nodes ? t->n_nodes : 1) * sizeof *msg.nodes);
    for (size_t i = 0; i < t->n_nodes; i++) {
        Drey__Cluster__V1__Node *n = drey_arena_alloc(&a, sizeof *n);
        drey__cluster__v1__node__init(n);
        n->id = t->nodes[i].id;
        n->advertise = t->nodes[i].advertise;
        msg.nodes[i] = n;
    }
    msg.n_partitions = t->n_parts;
    msg.partitions = drey_arena_alloc(&a, (t->n_parts ? t->n_parts : 1) * sizeof *msg.partitions);
    for (uint32_t p = 0; p < t->n_parts; p++) {
        Drey__Cluster__V1__Partition *pp = drey_arena_alloc(&a, sizeof *pp);
        drey__cluster__v1__partition__init(pp);
        pp->id = p;
        pp->epoch = t->parts[p].epoch;
        pp->primary = t->parts[p].primary >= 0 ? t->nodes[t->parts[p].primary].id : "";
        pp->n_replicas = t->parts[p].n_replicas;
        pp->replicas = drey_arena_alloc(&a, (pp->n_replicas ? pp->n_replicas : 1) * sizeof *pp->replicas);
        for (size_t i = 0; i < pp->n_replicas; i++)
            pp->replicas[i] = t->nodes[t->parts[p].replicas[i]].id;
        pp->n_joining = t->parts[p].n_joining;
        pp->joining = drey_arena_alloc(&a, (pp->n_joining ? pp->n_joining : 1) * sizeof *pp->joining);
        for (size_t i = 0; i < pp->n_joining; i++)
            pp->joining[i] = t->nodes[t->parts[p].joining[i]].id;
        pp->next_primary = t->parts[p].next_primary >= 0 ? t->nodes[t->parts[p].next_primary].id : "";
        msg.partitions[p] = pp;
    }
    drey_call_send(call, &msg.base);
    drey_arena_destroy(&a);
}

void drey_cluster__notify_watchers_locked(drey_cluster *c) {
    for (topo_watcher *w = c->watchers; w != NULL; w = w->next)
        send_topology(w->call, c->topo);
}

static void watch_message(void *ctx, drey_call *call, const ProtobufCMessage *msg) {
    drey_cluster *c = ctx;
    if (msg == NULL)
        return;
    topo_watcher *w = drey_xcalloc(1, sizeof *w);
    w->call = call;
    pthread_mutex_lock(&c->mu);
    if (c->stopping) {
        pthread_mutex_unlock(&c->mu);
        free(w);
        drey_call_finish(call, NULL);
        return;
    }
    send_topology(call, c->topo);
    w->next = c->watchers;
    if (c->watchers != NULL)
        c->watchers->prev = w;
    c->watchers = w;
    drey_call_set_user(call, w);
    pthread_mutex_unlock(&c->mu);
}

static void watch_done(void *ctx, drey_call *call) {
    drey_cluster *c = ctx;
    pthread_mutex_lock(&c->mu);
    topo_watcher *w = drey_call_user(call);
    if (w != NULL) {
        if (w->prev != NULL)
            w->prev->next = w->next;
        else
            c->watchers = w->next;
        if (w->next != NULL)
            w->next->prev = w->prev;
        free(w);
        drey_call_set_user(call, NULL);
    }
    pthread_mutex_unlock(&c->mu);
}

/* Ends every stream (the node is stopping); their on_done unlinks them. */
void drey_cluster__close_watchers(drey_cluster *c) {
    pthread_mutex_lock(&c->mu);
    c->stopping = true;
    for (topo_watcher *w = c->watchers; w != NULL; w = w->next)
        drey_call_finish(w->call, NULL);
    pthread_mutex_unlock(&c->mu);
}

bool drey_cluster_register(drey_cluster *c, drey_server *s) {
    const drey_server_method m = {
        .path = "/drey.cluster.v1.Cluster/WatchTopology",
        .input = &drey__cluster__v1__watch_topology_request__descriptor,
        .server_streaming = true,
        .on_message = watch_message,
        .on_done = watch_done,
        .ctx = c,
    };
    return drey_server_add_method(s, &m);
}
