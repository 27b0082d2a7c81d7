/*
 * cluster — a node's life in the cluster: made, joined, drained, left,
 * destroyed; the threads its rooms run on, started and stopped here.
 *
 * Join: the table (table.c) is opened, the node's store partitioned as the
 * cluster is (a move then walks its partition's entries only), and the
 * table started; a restarted node with replicas steps out of the roles its
 * previous life held (controller.c); then the controller thread
 * (controller.c), the mover (move.c), and the primary's shrinker and
 * heartbeat threads (replicate.c) start. Leave
 * stops them in the reverse order, letting the writes still waiting for
 * backups finish (bounded) before the lease is given back.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/log.h"
#include "drey/partition.h"
#include "internal.h"
#include "controller.h"
#include "mover.h"
#include "partition.h"
#include "peers.h"
#include "primary.h"
#include "subscribe.h"
#include "table.h"

static char *xstrdup(const char *s) {
    return drey_xstrdup(s != NULL ? s : "");
}

drey_cluster *drey_cluster_create(const drey_cluster_options *opts, char *err, size_t cap) {
    drey_cluster *c = drey_xcalloc(1, sizeof *c);
    c->opts = *opts;
    c->opts.node_id = xstrdup(opts->node_id);
    c->opts.advertise = xstrdup(opts->advertise);
    c->opts.internal = xstrdup(opts->internal);
    c->opts.etcd = xstrdup(opts->etcd);
    c->opts.build = xstrdup(opts->build);
    size_t pl = strlen(opts->prefix);
    c->prefix = drey_xmalloc(pl + 2);
    snprintf(c->prefix, pl + 2, "%s%s", opts->prefix, pl > 0 && opts->prefix[pl - 1] == '/' ? "" : "/");
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cond, NULL);
    pthread_mutex_init(&c->primary.shrink_mu, NULL);
    pthread_mutex_init(&c->primary.rooms_mu, NULL);
    pthread_mutex_init(&c->lease_mu, NULL);
    pthread_cond_init(&c->primary.shrink_cond, NULL);
    if (c->opts.replication_timeout_ms <= 0)
        c->opts.replication_timeout_ms = 1000;
    if (c->opts.min_in_sync == 0)
        c->opts.min_in_sync = 1;
    /* Room for a clock running a little fast against etcd's, and for the
     * time etcd takes to act on an expiry it decided. */
    c->lease_margin_ns = 200 * 1000000LL;
    atomic_store(&c->mover.moving, -1);
    pthread_mutex_lock(&c->mu);
    drey_cluster__publish_locked(c); /* an empty table until joined */
    pthread_mutex_unlock(&c->mu);
    c->peers = drey_cluster__peers_create(opts->node_id, opts->tls_cert, opts->tls_key, opts->tls_ca, err, cap);
    if (c->peers == NULL ||
        (opts->peer_addresses != NULL && !drey_cluster__peers_dial_via(c->peers, opts->peer_addresses, err, cap))) {
        drey_cluster_destroy(c);
        return NULL;
    }
    return c;
}

void drey_cluster_set_addresses(drey_cluster *c, const char *advertise, const char *internal) {
    free((char *)c->opts.advertise);
    free((char *)c->opts.internal);
    c->opts.advertise = xstrdup(advertise);
    c->opts.internal = xstrdup(internal);
}

int drey_cluster_join(drey_cluster *c, char *err, size_t cap) {
    int r = drey_cluster__table_open(c, err, cap);
    if (r != 0)
        return r;
    /* Before anything moves: a partition's move then costs its entries. */
    if (c->opts.store != NULL)
        drey_partition_index(c->opts.store, c->n_parts);
    c->partitions = drey_xcalloc(c->n_parts, sizeof *c->partitions);
    for (uint32_t p = 0; p < c->n_parts; p++)
        drey_cluster__partition_init(&c->partitions[p], p);
    int64_t rev = drey_cluster__table_start(c, err, cap);
    if (rev < 0)
        return -1;
    if (c->rf > 1 && drey_cluster__step_down(c, err, cap) != 0)
        return -1;
    if (pthread_create(&c->ctl.thread, NULL, drey_cluster__controller_main, c) != 0)
        abort();
    c->ctl.running = true;
    if (c->opts.store != NULL) {
        if (pthread_create(&c->mover.thread, NULL, drey_cluster__mover_main, c) != 0)
            abort();
        c->mover.running = true;
    }
    if (pthread_create(&c->primary.shrinker_thread, NULL, drey_cluster__shrinker_main, c) != 0 ||
        pthread_create(&c->primary.beater_thread, NULL, drey_cluster__beater_main, c) != 0)
        abort();
    c->primary.running = true;
    DREY_LOG_INFO("joined the cluster", DREY_LOG_STR("node_id", c->opts.node_id),
                  DREY_LOG_UINT("partitions", c->n_parts), DREY_LOG_INT("revision", rev),
                  DREY_LOG_INT("lease_ttl_s", c->lease.ttl_s));
    return 0;
}

static void stop_shrinker(drey_cluster *c) {
    if (!c->primary.running)
        return;
    pthread_mutex_lock(&c->primary.shrink_mu);
    c->primary.shrink_stop = true;
    pthread_cond_broadcast(&c->primary.shrink_cond);
    pthread_mutex_unlock(&c->primary.shrink_mu);
    pthread_join(c->primary.shrinker_thread, NULL);
    pthread_join(c->primary.beater_thread, NULL);
    c->primary.running = false;
}

void drey_cluster_leave(drey_cluster *c) {
    if (c == NULL)
        return;
    pthread_mutex_lock(&c->mu);
    bool was = c->leaving;
    c->leaving = true;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->mu);
    if (was)
        return;
    drey_cluster__close_watchers(c);
    if (c->ctl.running) {
        pthread_join(c->ctl.thread, NULL);
        c->ctl.running = false;
    }
    if (c->mover.running) {
        pthread_join(c->mover.thread, NULL);
        c->mover.running = false;
    }
    /* Writes waiting for their backups finish while the lease still says
     * this node leads (bounded: a backup that does not answer is dropped
     * within the replication timeout); what is left is answered as of
     * unknown outcome. */
    int64_t until = drey_mono_ms() + c->opts.replication_timeout_ms + 1000;
    while (drey_cluster__pending_writes(c) > 0 && drey_mono_ms() < until)
        drey_nap_ms(10);
    stop_shrinker(c);
    drey_cluster__abandon_lines(c);
    if (c->rf > 1)
        drey_cluster__release_leases(c);
    drey_cluster__table_release(c);
    DREY_LOG_INFO("left the cluster", DREY_LOG_STR("node_id", c->opts.node_id));
}

static uint32_t owned_locked(const drey_cluster *c) {
    uint32_t n = 0;
    for (uint32_t p = 0; p < c->n_parts; p++)
        n += c->entries[p] != NULL && strcmp(c->entries[p]->primary, c->opts.node_id) == 0;
    return n;
}

/* Partitions whose in-sync set names this node. */
static uint32_t backed_locked(const drey_cluster *c) {
    uint32_t n = 0;
    for (uint32_t p = 0; p < c->n_parts; p++) {
        const Drey__Internal__V1__PartitionEntry *e = c->entries[p];
        for (size_t i = 0; e != NULL && i < e->n_replicas; i++)
            n += strcmp(e->replicas[i], c->opts.node_id) == 0;
    }
    return n;
}

uint32_t drey_cluster_drain(drey_cluster *c, int64_t timeout_ms) {
    if (c == NULL || c->etcd == NULL)
        return 0;
    pthread_mutex_lock(&c->mu);
    c->draining = true;
    uint32_t owned = owned_locked(c), backed = backed_locked(c), staying = 0;
    for (size_t i = 0; i < c->n_members; i++)
        staying += !c->members[i]->draining && strcmp(c->members[i]->id, c->opts.node_id) != 0;
    pthread_mutex_unlock(&c->mu);
    if (owned + backed == 0 || timeout_ms <= 0)
        return owned;
    if (staying == 0) {
        DREY_LOG_WARN("draining: no other node can take this node's partitions; they are unavailable until it "
                      "returns", DREY_LOG_UINT("partitions", owned));
        return owned;
    }
    char err[256];
    if (!drey_cluster__mark_draining(c, err, sizeof err)) {
        DREY_LOG_WARN("could not mark this node draining in etcd; its partitions stay here", DREY_LOG_STR("error", err));
        return owned;
    }
    /* Every copy here is replaced before it goes (a new copy elsewhere in
     * sync, then the primary role handed over, then this one dropped), so
     * no partition has fewer copies meanwhile; unless fewer nodes stay
     * than the factor: then nobody can take the copies, and the primaries
     * are handed over all the same. */
    if (staying < c->rf)
        DREY_LOG_WARN("draining: fewer nodes stay than the replication factor, so this node's copies cannot be "
                      "replaced; its partitions keep fewer copies until a node joins",
                      DREY_LOG_UINT("nodes_staying", staying), DREY_LOG_UINT("replication_factor", c->rf),
                      DREY_LOG_UINT("partitions", owned), DREY_LOG_UINT("backups", backed));
    DREY_LOG_INFO("draining: replacing this node's copies on the others, then handing over",
                  DREY_LOG_UINT("partitions", owned), DREY_LOG_UINT("backups", backed),
                  DREY_LOG_INT("timeout_ms", timeout_ms));
    int64_t started = drey_mono_ms(), until = drey_deadline_after_ms(timeout_ms);
    pthread_mutex_lock(&c->mu);
    while ((owned = owned_locked(c)) + (backed = backed_locked(c)) > 0 && !c->leaving) {
        if (drey_cond_wait_until(&c->cond, &c->mu, until) == ETIMEDOUT) {
            owned = owned_locked(c);
            backed = backed_locked(c);
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
    if (owned + backed > 0)
        DREY_LOG_WARN("drain timed out: this node leaves holding copies. Each partition it leads fails over to an "
                      "in-sync backup when its lease ends (one with none waits for this node), and each it backs "
                      "has a copy fewer until the controller replaces it",
                      DREY_LOG_UINT("partitions", owned), DREY_LOG_UINT("backups", backed),
                      DREY_LOG_INT("took_ms", drey_mono_ms() - started));
    else
        DREY_LOG_INFO("drained: every copy this node held is on the others", DREY_LOG_INT("took_ms", drey_mono_ms() - started));
    return owned;
}

void drey_cluster_destroy(drey_cluster *c) {
    if (c == NULL)
        return;
    pthread_mutex_lock(&c->mu);
    c->leaving = true;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->mu);
    if (c->ctl.running)
        pthread_join(c->ctl.thread, NULL);
    if (c->mover.running)
        pthread_join(c->mover.thread, NULL);
    stop_shrinker(c);
    drey_cluster__abandon_lines(c);
    drey_cluster__table_free(c);
    drey_cluster__subs_destroy(c->subs); /* its calls run on the peers' channels */
    drey_cluster__peers_destroy(c->peers);
    for (drey_cluster__shrink *s = c->primary.shrinks, *next; s != NULL; s = next) {
        next = s->next;
        free(s);
    }
    for (uint32_t p = 0; c->partitions != NULL && p < c->n_parts; p++)
        drey_cluster__partition_destroy(&c->partitions[p]);
    free(c->partitions);
    pthread_mutex_destroy(&c->primary.shrink_mu);
    for (size_t i = 0; i < atomic_load(&c->primary.n_rooms); i++)
        free(c->primary.rooms[i].grant_until_ns);
    pthread_mutex_destroy(&c->primary.rooms_mu);
    pthread_mutex_destroy(&c->lease_mu);
    pthread_cond_destroy(&c->primary.shrink_cond);
    drey_cluster__topology_unref(c->topo);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cond);
    free((char *)c->opts.node_id);
    free((char *)c->opts.advertise);
    free((char *)c->opts.internal);
    free((char *)c->opts.etcd);
    free((char *)c->opts.build);
    free(c->prefix);
    free(c->ctl.seen_primary);
    free(c->ctl.primary_since_ms);
    free(c);
}
