/*
 * status — this node's report of the cluster as it sees it (readiness
 * details, metrics, `drey cluster status`): its table, its moves, its
 * replication, counted where they happen.
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "primary.h"
#include "table.h"

void drey_cluster_get_status(drey_cluster *c, drey_cluster_status *out) {
    memset(out, 0, sizeof *out);
    drey_cluster__topology *t = drey_cluster__acquire(c);
    snprintf(out->node_id, sizeof out->node_id, "%s", c->opts.node_id);
    snprintf(out->controller, sizeof out->controller, "%s", t->controller);
    out->is_controller = strcmp(t->controller, c->opts.node_id) == 0;
    out->moves_waiting = out->is_controller ? atomic_load(&c->ctl.moves_waiting) : 0;
    out->partitions = t->n_parts;
    out->revision = t->revision;
    out->rf = t->rf;
    for (uint32_t p = 0; p < t->n_parts; p++) {
        out->owned += t->parts[p].primary >= 0 && t->parts[p].primary == t->self;
        out->unassigned += t->parts[p].primary < 0;
        out->backup_of += t->self >= 0 && drey_cluster__in_sync(t, p, t->self);
        out->under_replicated += t->parts[p].primary >= 0 && 1u + t->parts[p].n_replicas < t->rf;
    }
    for (size_t i = 0; i < t->n_nodes; i++)
        out->members += t->nodes[i].member;
    drey_cluster__topology_unref(t);
    pthread_mutex_lock(&c->mu);
    out->etcd_reachable = !c->lease_lost && !c->watch_ended;
    out->draining = c->draining;
    for (uint32_t p = 0; p < c->n_parts && c->entries != NULL; p++) {
        const Drey__Internal__V1__PartitionEntry *e = c->entries[p];
        if (e == NULL || e->n_joining == 0)
            continue;
        out->moving_out += strcmp(e->primary, c->opts.node_id) == 0;
        out->moving_in += strcmp(e->joining[0], c->opts.node_id) == 0;
    }
    pthread_mutex_unlock(&c->mu);
    out->moving_now = atomic_load(&c->mover.moving);
    out->moves_done = atomic_load(&c->mover.moves_done);
    out->moves_failed = atomic_load(&c->mover.moves_failed);
    out->moved_entries = atomic_load(&c->mover.moved_entries);
    out->moved_bytes = atomic_load(&c->mover.moved_bytes);
    out->pause_last_us = atomic_load(&c->mover.pause_last_us);
    out->pause_max_us = atomic_load(&c->mover.pause_max_us);
    out->forwarded = atomic_load(&c->route.forwarded);
    out->not_primary = atomic_load(&c->route.not_primary);
    out->retried = atomic_load(&c->route.retried);
    out->unavailable = atomic_load(&c->route.unavailable);
    out->lease_valid = drey_cluster__lease_valid(c);
    out->replication_pending = drey_cluster__pending_writes(c);
    out->replicated = atomic_load(&c->primary.replicated);
    out->replica_failures = atomic_load(&c->primary.replica_failures);
    out->isr_shrinks = atomic_load(&c->primary.isr_shrinks);
    out->backups_added = atomic_load(&c->mover.backups_added);
    out->records_taken = atomic_load(&c->backup.records_taken);
    out->records_refused = atomic_load(&c->backup.records_refused);
    out->handovers_done = atomic_load(&c->mover.handovers_done);
    out->roleless_dropped = atomic_load(&c->mover.roleless_dropped);
    out->copies_refused = atomic_load(&c->backup.copies_refused);
    out->failovers = atomic_load(&c->ctl.failovers);
}
