/*
 * repair — failover and the replication factor, and a restarted node
 * stepping down.
 *
 * The controller, before it plans moves, looks at every entry against the
 * members registered now (a member is a node whose lease is alive):
 *   - a primary that is not a member is replaced by its first in-sync
 *     backup that is (one compared write: the epoch moves on, so records of
 *     the old primary's epoch are refused from then on). With no live
 *     backup the partition waits for its primary: its data is on that
 *     node's disk only;
 *   - backups and copies under way on nodes that are not members, or that
 *     are draining, are dropped;
 *   - a partition with fewer than the replication factor of copies gets a
 *     new backup `syncing`: the member not holding it that rendezvous
 *     hashing ranks highest. Its primary copies the partition there and
 *     adds it to the in-sync set (move.c), a few per primary at a time.
 *
 * The old primary stopped on its own before any of this: it commits and
 * serves only while its lease is valid by its own clock (router.c), and
 * etcd expires the lease later than that.
 *
 * A node that restarts does not know which of its records its backups had
 * (its journal may hold writes that were never acknowledged; an ephemeral
 * node holds nothing), so before it serves it takes itself out of every
 * entry that named it before it registered, handing each partition it led
 * to a live in-sync backup. It keeps a partition only when nobody else has
 * it. It comes back as a backup by the repair above.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/log.h"
#include "drey/placement.h"
#include "internal.h"

#define STEP_DOWN_TRIES 10

typedef struct view {
    uint32_t n_parts;
    drey_cluster__entry *ent;
    int64_t *epochs;
    char (*live)[DREY_CLUSTER_MAX_ID]; /* members, sorted */
    bool *draining;
    size_t n_live;
} view;

static int cmp_id(const void *a, const void *b) {
    return strcmp(a, b);
}

static void view_take(drey_cluster *c, view *v) {
    pthread_mutex_lock(&c->mu);
    v->n_parts = c->n_parts;
    v->ent = drey_xcalloc(c->n_parts, sizeof *v->ent);
    v->epochs = drey_xcalloc(c->n_parts, sizeof *v->epochs);
    for (uint32_t p = 0; p < c->n_parts; p++) {
        drey_cluster__entry_of(c->entries[p], &v->ent[p]);
        v->epochs[p] = c->epochs[p];
    }
    v->live = drey_xcalloc(c->n_members ? c->n_members : 1, sizeof *v->live);
    v->n_live = c->n_members;
    for (size_t i = 0; i < c->n_members; i++)
        snprintf(v->live[i], DREY_CLUSTER_MAX_ID, "%s", c->members[i]->id);
    qsort(v->live, v->n_live, sizeof *v->live, cmp_id);
    v->draining = drey_xcalloc(v->n_live ? v->n_live : 1, sizeof *v->draining);
    for (size_t i = 0; i < v->n_live; i++)
        v->draining[i] = drey_cluster__member_locked(c, v->live[i])->draining;
    pthread_mutex_unlock(&c->mu);
}

static void view_free(view *v) {
    free(v->ent);
    free(v->epochs);
    free(v->live);
    free(v->draining);
}

/* 1 alive and staying, 0 alive but draining, -1 not a member. */
static int liveness(const view *v, const char *id) {
    for (size_t i = 0; i < v->n_live; i++) {
        if (strcmp(v->live[i], id) == 0)
            return v->draining[i] ? 0 : 1;
    }
    return -1;
}

/* Backup i becomes e's primary; the copies under way and a planned move
 * were the old primary's, so they go. */
static void promote(drey_cluster__entry *e, size_t i) {
    char id[DREY_CLUSTER_MAX_ID];
    memcpy(id, e->replicas[i], sizeof id);
    drey_cluster__entry_remove(e->replicas, &e->n_replicas, id);
    memcpy(e->primary, id, sizeof id);
    e->n_syncing = 0;
    e->joining[0] = '\0';
}

static bool holds(const drey_cluster__entry *e, const char *id) {
    return strcmp(e->primary, id) == 0 || strcmp(e->joining, id) == 0 ||
           drey_cluster__entry_has((char (*)[DREY_CLUSTER_MAX_ID])e->replicas, e->n_replicas, id) ||
           drey_cluster__entry_has((char (*)[DREY_CLUSTER_MAX_ID])e->syncing, e->n_syncing, id);
}

/* Drops the backups and copies of e on nodes that are gone or leaving;
 * returns whether anything changed. */
static bool drop_departed(const view *v, drey_cluster__entry *e, uint32_t *dropped) {
    bool changed = false;
    for (size_t i = 0; i < e->n_replicas;) {
        if (liveness(v, e->replicas[i]) != 1) {
            drey_cluster__entry_remove(e->replicas, &e->n_replicas, e->replicas[i]);
            (*dropped)++;
            changed = true;
        } else {
            i++;
        }
    }
    for (size_t i = 0; i < e->n_syncing;) {
        if (liveness(v, e->syncing[i]) != 1) {
            drey_cluster__entry_remove(e->syncing, &e->n_syncing, e->syncing[i]);
            changed = true;
        } else {
            i++;
        }
    }
    return changed;
}

/* The member rendezvous hashing ranks highest for p among those not
 * holding it; NULL: none. */
static const char *next_backup(const view *v, const drey_cluster__entry *e, uint32_t p) {
    const char *best = NULL;
    uint64_t best_w = 0;
    for (size_t i = 0; i < v->n_live; i++) {
        if (v->draining[i] || holds(e, v->live[i]))
            continue;
        uint64_t w = drey_placement_weight(v->live[i], strlen(v->live[i]), p);
        if (best == NULL || w > best_w) {
            best = v->live[i];
            best_w = w;
        }
    }
    return best;
}

bool drey_cluster__repair(drey_cluster *c, bool *changed) {
    *changed = false;
    view v;
    view_take(c, &v);
    /* Copies under way per primary, for the throttle. */
    uint32_t *syncing_from = drey_xcalloc(v.n_live ? v.n_live : 1, sizeof *syncing_from);
    for (uint32_t p = 0; p < v.n_parts; p++) {
        for (size_t i = 0; i < v.n_live; i++) {
            if (strcmp(v.live[i], v.ent[p].primary) == 0)
                syncing_from[i] += (uint32_t)v.ent[p].n_syncing;
        }
    }
    uint32_t promoted = 0, stranded = 0, dropped = 0, synced = 0;
    bool ok = true;
    for (uint32_t p0 = 0; p0 < v.n_parts && ok;) {
        drey_arena a;
        drey_arena_init(&a, NULL, 0);
        drey_etcd_txn t;
        drey_etcd_txn_init(&t, &a);
        size_t ops = 0;
        uint32_t p = p0;
        for (; p < v.n_parts && ops < DREY_CLUSTER_TXN_OPS; p++) {
            drey_cluster__entry *e = &v.ent[p];
            if (e->primary[0] == '\0')
                continue; /* not assigned yet */
            bool changed = drop_departed(&v, e, &dropped);
            if (liveness(&v, e->primary) < 0) {
                if (e->n_replicas == 0) {
                    stranded++;
                } else {
                    promote(e, 0);
                    promoted++;
                    changed = true;
                }
            }
            if (liveness(&v, e->primary) >= 0 && c->opts.max_moves > 0 &&
                1 + e->n_replicas + e->n_syncing < c->rf) {
                size_t k = 0;
                while (k < v.n_live && strcmp(v.live[k], e->primary) != 0)
                    k++;
                const char *to = next_backup(&v, e, p);
                if (to != NULL && k < v.n_live && syncing_from[k] < c->opts.max_moves) {
                    drey_cluster__entry_add(e->syncing, &e->n_syncing, to);
                    syncing_from[k]++;
                    synced++;
                    changed = true;
                }
            }
            if (changed) {
                drey_cluster__txn_put_entry(c, &t, &a, p, v.epochs[p], e);
                ops++;
            }
        }
        p0 = p;
        ok = drey_cluster__commit_table_writes(c, &t, &a, ops);
        *changed = *changed || (ok && ops > 0);
        drey_arena_destroy(&a);
    }
    if (ok && (promoted > 0 || dropped > 0 || synced > 0))
        DREY_LOG_INFO("partition table repaired", DREY_LOG_UINT("promoted", promoted),
                      DREY_LOG_UINT("backups_dropped", dropped), DREY_LOG_UINT("backups_planned", synced),
                      DREY_LOG_UINT("without_live_copy", stranded));
    if (ok)
        atomic_fetch_add(&c->failovers, promoted);
    free(syncing_from);
    view_free(&v);
    return ok;
}

int drey_cluster__step_down(drey_cluster *c, char *err, size_t cap) {
    for (int attempt = 0; attempt < STEP_DOWN_TRIES; attempt++) {
        view v;
        view_take(c, &v);
        const char *self = c->opts.node_id;
        uint32_t left = 0, kept = 0, refused = 0;
        for (uint32_t p = 0; p < v.n_parts; p++) {
            drey_cluster__entry *e = &v.ent[p];
            /* Written after this process registered: about it, not about
             * the one before. */
            if (!holds(e, self) || v.epochs[p] > c->registered_revision)
                continue;
            bool changed = drey_cluster__entry_remove(e->replicas, &e->n_replicas, self);
            changed |= drey_cluster__entry_remove(e->syncing, &e->n_syncing, self);
            if (strcmp(e->joining, self) == 0) {
                e->joining[0] = '\0';
                changed = true;
            }
            if (strcmp(e->primary, self) == 0) {
                size_t i = 0;
                while (i < e->n_replicas && liveness(&v, e->replicas[i]) < 0)
                    i++;
                if (i < e->n_replicas) {
                    promote(e, i);
                    changed = true;
                } else {
                    kept++;
                }
            }
            if (!changed)
                continue;
            char why[160];
            drey_cluster__cas r = drey_cluster__cas_entry(c, p, v.epochs[p], e, why, sizeof why);
            if (r == DREY_CLUSTER_CAS_APPLIED)
                left++;
            else
                refused++;
        }
        view_free(&v);
        if (left > 0 || kept > 0)
            DREY_LOG_INFO("restarted: stepped out of the partitions others hold", DREY_LOG_UINT("left", left),
                          DREY_LOG_UINT("kept_only_copy", kept));
        if (refused == 0)
            return 0;
        /* Someone changed those entries meanwhile: the watch brings the
         * new ones; look again. */
        drey_cluster__nap_ms(100 * (attempt + 1));
    }
    snprintf(err, cap, "could not take this node out of the partition entries that name it (etcd kept refusing)");
    return -1;
}
