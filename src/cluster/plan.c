/*
 * plan — the controller's decisions on a snapshot of the table; see plan.h.
 */
#include "plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/placement.h"
#include "table.h"

void drey_cluster__plan_init(drey_cluster__plan *pl, uint32_t n_parts, uint32_t rf, uint32_t max_moves,
                             size_t max_members) {
    memset(pl, 0, sizeof *pl);
    pl->n_parts = n_parts;
    pl->rf = rf;
    pl->max_moves = max_moves;
    pl->ent = drey_xcalloc(n_parts ? n_parts : 1, sizeof *pl->ent);
    pl->changed = drey_xcalloc(n_parts ? n_parts : 1, sizeof *pl->changed);
    pl->live = drey_xcalloc(max_members ? max_members : 1, sizeof *pl->live);
    pl->draining = drey_xcalloc(max_members ? max_members : 1, sizeof *pl->draining);
}

void drey_cluster__plan_member(drey_cluster__plan *pl, const char *id, bool draining) {
    size_t i = pl->n_live;
    while (i > 0 && strcmp(pl->live[i - 1], id) > 0) {
        memcpy(pl->live[i], pl->live[i - 1], DREY_CLUSTER_MAX_ID);
        pl->draining[i] = pl->draining[i - 1];
        i--;
    }
    snprintf(pl->live[i], DREY_CLUSTER_MAX_ID, "%s", id);
    pl->draining[i] = draining;
    pl->n_live++;
}

void drey_cluster__plan_free(drey_cluster__plan *pl) {
    free(pl->ent);
    free(pl->changed);
    free(pl->live);
    free(pl->draining);
}

/* 1 a member that stays, 0 a member that is leaving, -1 not a member. */
static int liveness(const drey_cluster__plan *pl, const char *id) {
    for (size_t i = 0; i < pl->n_live; i++) {
        if (strcmp(pl->live[i], id) == 0)
            return pl->draining[i] ? 0 : 1;
    }
    return -1;
}

static int member_index(const drey_cluster__plan *pl, const char *id) {
    for (size_t i = 0; i < pl->n_live; i++) {
        if (strcmp(pl->live[i], id) == 0)
            return (int)i;
    }
    return -1;
}

static bool in(const char (*ids)[DREY_CLUSTER_MAX_ID], size_t n, const char *id) {
    return drey_cluster__entry_has((char (*)[DREY_CLUSTER_MAX_ID])ids, n, id);
}

static bool holds(const drey_cluster__entry *e, const char *id) {
    return strcmp(e->primary, id) == 0 || strcmp(e->joining, id) == 0 || in(e->replicas, e->n_replicas, id) ||
           in(e->syncing, e->n_syncing, id);
}

/* --- the first assignment ------------------------------------------------------------ */

void drey_cluster__plan_assign(drey_cluster__plan *pl, uint32_t initial_nodes, drey_cluster__plan_stats *st) {
    uint32_t unowned = 0;
    for (uint32_t p = 0; p < pl->n_parts; p++)
        unowned += pl->ent[p].primary[0] == '\0';
    if (unowned == 0 || pl->n_live == 0 || (unowned == pl->n_parts && pl->n_live < initial_nodes))
        return;
    const char **ids = drey_xcalloc(pl->n_live, sizeof *ids);
    for (size_t i = 0; i < pl->n_live; i++)
        ids[i] = pl->live[i];
    uint32_t r = drey_placement_replicas(pl->rf, pl->n_live);
    uint32_t *assign = drey_xmalloc((size_t)pl->n_parts * r * sizeof *assign);
    drey_placement_assign(ids, pl->n_live, pl->n_parts, pl->rf, assign);
    for (uint32_t p = 0; p < pl->n_parts; p++) {
        drey_cluster__entry *e = &pl->ent[p];
        if (e->primary[0] != '\0')
            continue;
        drey_cluster__entry_of(NULL, e);
        snprintf(e->primary, sizeof e->primary, "%s", ids[assign[p * r]]);
        for (uint32_t k = 1; k < r; k++)
            drey_cluster__entry_add(e->replicas, &e->n_replicas, ids[assign[p * r + k]]);
        pl->changed[p] = true;
        st->assigned++;
    }
    free(assign);
    free(ids);
}

/* --- repairs ------------------------------------------------------------------------ */

/* Backup i becomes e's primary. The copies under way and the plans were
 * the old primary's: they go (the new one plans its own). */
static void promote(drey_cluster__entry *e, size_t i) {
    char id[DREY_CLUSTER_MAX_ID];
    memcpy(id, e->replicas[i], sizeof id);
    drey_cluster__entry_remove(e->replicas, &e->n_replicas, id);
    memcpy(e->primary, id, sizeof id);
    e->n_syncing = 0;
    e->joining[0] = '\0';
    e->handover[0] = '\0';
}

/* Drops e's backups, copies and plans on nodes that are gone or leaving. */
static bool drop_departed(const drey_cluster__plan *pl, drey_cluster__entry *e, drey_cluster__plan_stats *st) {
    bool changed = false;
    for (size_t i = 0; i < e->n_replicas;) {
        if (liveness(pl, e->replicas[i]) != 1) {
            drey_cluster__entry_drop_replica(e, e->replicas[i]);
            st->dropped++;
            changed = true;
        } else {
            i++;
        }
    }
    for (size_t i = 0; i < e->n_syncing;) {
        if (liveness(pl, e->syncing[i]) != 1) {
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
static const char *next_backup(const drey_cluster__plan *pl, const drey_cluster__entry *e, uint32_t p) {
    const char *best = NULL;
    uint64_t best_w = 0;
    for (size_t i = 0; i < pl->n_live; i++) {
        if (pl->draining[i] || holds(e, pl->live[i]))
            continue;
        uint64_t w = drey_placement_weight(pl->live[i], strlen(pl->live[i]), p);
        if (best == NULL || w > best_w) {
            best = pl->live[i];
            best_w = w;
        }
    }
    return best;
}

void drey_cluster__plan_repair(drey_cluster__plan *pl, drey_cluster__plan_stats *st) {
    /* Copies under way per primary, for the throttle. */
    uint32_t *copying = drey_xcalloc(pl->n_live ? pl->n_live : 1, sizeof *copying);
    for (uint32_t p = 0; p < pl->n_parts; p++) {
        int k = member_index(pl, pl->ent[p].primary);
        if (k >= 0)
            copying[k] += (uint32_t)pl->ent[p].n_syncing;
    }
    for (uint32_t p = 0; p < pl->n_parts; p++) {
        drey_cluster__entry *e = &pl->ent[p];
        if (e->primary[0] == '\0')
            continue; /* not assigned yet */
        bool changed = drop_departed(pl, e, st);
        if (liveness(pl, e->primary) < 0) {
            if (e->n_replicas == 0) {
                st->stranded++;
            } else {
                promote(e, 0);
                st->promoted++;
                changed = true;
            }
        }
        int k = member_index(pl, e->primary);
        if (k >= 0 && pl->max_moves > 0 && 1 + e->n_replicas + e->n_syncing < pl->rf &&
            copying[k] < pl->max_moves) {
            const char *to = next_backup(pl, e, p);
            if (to != NULL) {
                drey_cluster__entry_add(e->syncing, &e->n_syncing, to);
                copying[k]++;
                st->synced++;
                changed = true;
            }
        }
        pl->changed[p] |= changed;
    }
    free(copying);
}

void drey_cluster__plan_step_out(drey_cluster__plan *pl, const char *self, const int64_t *epochs, int64_t before,
                                 drey_cluster__plan_stats *st) {
    for (uint32_t p = 0; p < pl->n_parts; p++) {
        drey_cluster__entry *e = &pl->ent[p];
        if (!holds(e, self) || epochs[p] > before)
            continue;
        bool changed = drey_cluster__entry_drop_replica(e, self);
        changed |= drey_cluster__entry_remove(e->syncing, &e->n_syncing, self);
        if (strcmp(e->joining, self) == 0) {
            e->joining[0] = '\0';
            changed = true;
        }
        if (strcmp(e->primary, self) == 0) {
            size_t i = 0;
            while (i < e->n_replicas && liveness(pl, e->replicas[i]) < 0)
                i++;
            if (i < e->n_replicas) {
                promote(e, i);
                changed = true;
            } else {
                st->stranded++;
            }
        }
        pl->changed[p] |= changed;
    }
}

/* --- the rebalance ------------------------------------------------------------------- */

static int cmp_id(const void *a, const void *b) {
    return strcmp(a, b);
}

static int id_index(char (*ids)[DREY_CLUSTER_MAX_ID], size_t n, const char *id) {
    for (size_t i = 0; i < n; i++) {
        if (strcmp(ids[i], id) == 0)
            return (int)i;
    }
    return -1;
}

/* A plan already in e: cancelled if its target left (or a handover's left
 * the in-sync set), a move onto an in-sync backup turned into a handover.
 * Returns whether e has a plan. */
static bool review_plan(const drey_cluster__plan *pl, drey_cluster__entry *e, bool *changed,
                        drey_cluster__plan_stats *st) {
    if (e->joining[0] != '\0' && in(e->replicas, e->n_replicas, e->joining)) {
        /* Its copy would replace an in-sync copy: the role goes without
         * one (a plan older controllers made). */
        memcpy(e->handover, e->joining, DREY_CLUSTER_MAX_ID);
        e->joining[0] = '\0';
        *changed = true;
    }
    if (e->joining[0] != '\0' && liveness(pl, e->joining) != 1) {
        e->joining[0] = '\0';
        *changed = true;
        st->cancelled++;
    }
    if (e->handover[0] != '\0' &&
        (liveness(pl, e->handover) != 1 || !in(e->replicas, e->n_replicas, e->handover))) {
        e->handover[0] = '\0';
        *changed = true;
        st->cancelled++;
    }
    return e->joining[0] != '\0' || e->handover[0] != '\0';
}

void drey_cluster__plan_rebalance(drey_cluster__plan *pl, drey_cluster__plan_stats *st) {
    for (uint32_t p = 0; p < pl->n_parts; p++) {
        if (pl->ent[p].primary[0] == '\0')
            return;
    }
    /* The nodes the placement counts: the members that stay, and primaries
     * that are down with no in-sync backup to fail over to (their data is
     * on their disk only, so their partitions stay planned where they are;
     * the repairs have already failed over the others). */
    size_t cap = pl->n_live + pl->n_parts;
    char (*ids)[DREY_CLUSTER_MAX_ID] = drey_xcalloc(cap ? cap : 1, sizeof *ids);
    size_t n = 0;
    for (size_t i = 0; i < pl->n_live; i++) {
        if (!pl->draining[i])
            memcpy(ids[n++], pl->live[i], DREY_CLUSTER_MAX_ID);
    }
    for (uint32_t p = 0; p < pl->n_parts; p++) {
        const char *o = pl->ent[p].primary;
        if (liveness(pl, o) < 0 && id_index(ids, n, o) < 0)
            snprintf(ids[n++], DREY_CLUSTER_MAX_ID, "%s", o);
    }
    if (n == 0) {
        free(ids);
        return;
    }
    qsort(ids, n, sizeof *ids, cmp_id);
    const char **names = drey_xcalloc(n, sizeof *names);
    for (size_t i = 0; i < n; i++)
        names[i] = ids[i];
    uint32_t r = drey_placement_replicas(pl->rf, n);
    uint32_t *assign = drey_xmalloc((size_t)pl->n_parts * r * sizeof *assign);
    drey_placement_assign(names, n, pl->n_parts, pl->rf, assign);
    /* Plans under way per primary (by index in ids). */
    uint32_t *moves = drey_xcalloc(n, sizeof *moves), *handovers = drey_xcalloc(n, sizeof *handovers);
    for (uint32_t p = 0; p < pl->n_parts; p++) {
        int k = id_index(ids, n, pl->ent[p].primary);
        if (k < 0)
            continue;
        moves[k] += pl->ent[p].joining[0] != '\0';
        handovers[k] += pl->ent[p].handover[0] != '\0';
    }
    uint32_t moves_draining = 0; /* a leaving primary is not in ids: its moves count together */
    for (uint32_t p = 0; p < pl->n_parts; p++) {
        drey_cluster__entry *e = &pl->ent[p];
        bool changed = false;
        bool planned = review_plan(pl, e, &changed, st);
        pl->changed[p] |= changed;
        if (planned || liveness(pl, e->primary) < 0)
            continue;
        const char *want = ids[assign[p * r]];
        if (strcmp(want, e->primary) == 0 || liveness(pl, want) != 1)
            continue;
        if (pl->primary_since_ms != NULL && pl->primary_since_ms[p] > 0 &&
            pl->now_ms - pl->primary_since_ms[p] < DREY_CLUSTER_MOVE_SETTLE_MS) {
            st->waiting++;
            continue;
        }
        int k = id_index(ids, n, e->primary);
        if (in(e->replicas, e->n_replicas, want)) {
            if (k >= 0 && handovers[k] >= DREY_CLUSTER_MAX_HANDOVERS)
                continue;
            snprintf(e->handover, sizeof e->handover, "%s", want);
            if (k >= 0)
                handovers[k]++;
            st->handovers++;
        } else if (in(e->syncing, e->n_syncing, want)) {
            continue; /* its copy as a backup first; then a handover */
        } else {
            if (k >= 0 ? moves[k] >= pl->max_moves : moves_draining >= pl->max_moves)
                continue;
            snprintf(e->joining, sizeof e->joining, "%s", want);
            if (k >= 0)
                moves[k]++;
            else
                moves_draining++;
            st->moves++;
        }
        pl->changed[p] = true;
    }
    free(moves);
    free(handovers);
    free(assign);
    free(names);
    free(ids);
}
