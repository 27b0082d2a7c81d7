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

/* --- the placement ------------------------------------------------------------------- */

/* Where every copy should be: rendezvous hashing with bounded loads
 * (drey/placement.h) over the members that stay and the primaries that are
 * down with no in-sync backup to fail over to (their data is on their disk
 * only, so their partitions stay planned where they are). For p, the nodes
 * at ids[assign[p * r + k]], its primary first. */
typedef struct placement {
    char (*ids)[DREY_CLUSTER_MAX_ID];
    size_t n;
    uint32_t r;
    uint32_t *assign;
} placement;

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

/* False (and nothing to free) when no node counts. */
static bool place(const drey_cluster__plan *pl, placement *w) {
    memset(w, 0, sizeof *w);
    size_t cap = pl->n_live + pl->n_parts;
    w->ids = drey_xcalloc(cap ? cap : 1, sizeof *w->ids);
    for (size_t i = 0; i < pl->n_live; i++) {
        if (!pl->draining[i])
            memcpy(w->ids[w->n++], pl->live[i], DREY_CLUSTER_MAX_ID);
    }
    for (uint32_t p = 0; p < pl->n_parts; p++) {
        const char *o = pl->ent[p].primary;
        if (o[0] != '\0' && liveness(pl, o) < 0 && id_index(w->ids, w->n, o) < 0)
            snprintf(w->ids[w->n++], DREY_CLUSTER_MAX_ID, "%s", o);
    }
    if (w->n == 0) {
        free(w->ids);
        return false;
    }
    qsort(w->ids, w->n, sizeof *w->ids, cmp_id);
    const char **names = drey_xcalloc(w->n, sizeof *names);
    for (size_t i = 0; i < w->n; i++)
        names[i] = w->ids[i];
    w->r = drey_placement_replicas(pl->rf, w->n);
    w->assign = drey_xmalloc((size_t)pl->n_parts * w->r * sizeof *w->assign);
    drey_placement_assign(names, w->n, pl->n_parts, pl->rf, w->assign);
    free(names);
    return true;
}

static void placement_free(placement *w) {
    free(w->assign);
    free(w->ids);
}

/* The k-th node the placement wants for p (0: its primary). */
static const char *placed(const placement *w, uint32_t p, uint32_t k) {
    return w->ids[w->assign[(size_t)p * w->r + k]];
}

static bool wanted(const placement *w, uint32_t p, const char *id) {
    for (uint32_t k = 0; k < w->r; k++) {
        if (strcmp(placed(w, p, k), id) == 0)
            return true;
    }
    return false;
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

/* Drops e's backups on nodes that are gone, and its copies under way to
 * nodes gone or leaving. A leaving node's in-sync backup stays until the
 * rebalance has its replacement in sync (make before break). */
static bool drop_departed(const drey_cluster__plan *pl, drey_cluster__entry *e, drey_cluster__plan_stats *st) {
    bool changed = false;
    for (size_t i = 0; i < e->n_replicas;) {
        if (liveness(pl, e->replicas[i]) < 0) {
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

/* The first node the placement wants for p among the members that stay
 * and do not hold it, else the one rendezvous hashing ranks highest among
 * them; NULL: none. */
static const char *next_backup(const drey_cluster__plan *pl, const placement *w, const drey_cluster__entry *e,
                               uint32_t p) {
    for (uint32_t k = 0; w != NULL && k < w->r; k++) {
        const char *id = placed(w, p, k);
        if (liveness(pl, id) == 1 && !holds(e, id))
            return id;
    }
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
    for (uint32_t p = 0; p < pl->n_parts; p++) {
        drey_cluster__entry *e = &pl->ent[p];
        if (e->primary[0] == '\0')
            continue; /* not assigned yet */
        bool changed = drop_departed(pl, e, st);
        if (liveness(pl, e->primary) < 0) {
            if (e->n_replicas == 0) {
                st->stranded++;
            } else {
                /* a backup that stays, else one that is leaving */
                size_t i = 0;
                while (i + 1 < e->n_replicas && liveness(pl, e->replicas[i]) != 1)
                    i++;
                promote(e, liveness(pl, e->replicas[i]) == 1 ? i : 0);
                st->promoted++;
                changed = true;
            }
        }
        pl->changed[p] |= changed;
    }
    /* New backups where the placement (of the table failed over) wants
     * them, throttled by the copies under way per primary. */
    placement w;
    bool have = place(pl, &w);
    uint32_t *copying = drey_xcalloc(pl->n_live ? pl->n_live : 1, sizeof *copying);
    for (uint32_t p = 0; p < pl->n_parts; p++) {
        int k = member_index(pl, pl->ent[p].primary);
        if (k >= 0)
            copying[k] += (uint32_t)pl->ent[p].n_syncing + (pl->ent[p].joining[0] != '\0');
    }
    for (uint32_t p = 0; p < pl->n_parts; p++) {
        drey_cluster__entry *e = &pl->ent[p];
        int k = member_index(pl, e->primary);
        if (k < 0 || pl->max_moves == 0 || 1 + e->n_replicas + e->n_syncing >= pl->rf || copying[k] >= pl->max_moves)
            continue;
        const char *to = next_backup(pl, have ? &w : NULL, e, p);
        if (to != NULL) {
            drey_cluster__entry_add(e->syncing, &e->n_syncing, to);
            copying[k]++;
            st->synced++;
            pl->changed[p] = true;
        }
    }
    free(copying);
    if (have)
        placement_free(&w);
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

/* The primary role toward the placement's primary want: a handover to it
 * in sync, nothing while it copies the partition as a backup or when the
 * primary stays a copy in the placement (the backups' step copies want
 * first, then a handover: one copy, where a move would drop a copy the
 * placement keeps), else a move. True when it planned one. */
static bool place_primary(const drey_cluster__plan *pl, drey_cluster__entry *e, uint32_t p, const placement *w,
                          uint32_t *copies, uint32_t *handovers, drey_cluster__plan_stats *st) {
    const char *want = placed(w, p, 0);
    if (strcmp(want, e->primary) == 0 || liveness(pl, want) != 1)
        return false;
    if (in(e->replicas, e->n_replicas, want)) {
        if (handovers != NULL && *handovers >= DREY_CLUSTER_MAX_HANDOVERS)
            return false;
        snprintf(e->handover, sizeof e->handover, "%s", want);
        if (handovers != NULL)
            (*handovers)++;
        st->handovers++;
        return true;
    }
    if (in(e->syncing, e->n_syncing, want) || wanted(w, p, e->primary) || *copies >= pl->max_moves)
        return false;
    snprintf(e->joining, sizeof e->joining, "%s", want);
    (*copies)++;
    st->moves++;
    return true;
}

/* The backups toward the placement, make-before-break: a `syncing` copy
 * for a wanted node not holding the partition (but the primary's place,
 * when a move will bring it), one copy beyond the factor at most per
 * partition and max_moves per primary at once; a backup or a copy under
 * way that the placement does not want goes once the partition has as
 * many in-sync copies without it as the placement wants (its replacement
 * in sync). True when it changed e. */
static bool place_backups(const drey_cluster__plan *pl, drey_cluster__entry *e, uint32_t p, const placement *w,
                          uint32_t *copies, drey_cluster__plan_stats *st) {
    bool changed = false, primary_stays = wanted(w, p, e->primary);
    for (uint32_t k = 0; k < w->r; k++) {
        const char *id = placed(w, p, k);
        if (holds(e, id) || liveness(pl, id) != 1 || (k == 0 && !primary_stays))
            continue;
        if (*copies >= pl->max_moves || 1 + e->n_replicas + e->n_syncing > pl->rf)
            break;
        drey_cluster__entry_add(e->syncing, &e->n_syncing, id);
        (*copies)++;
        st->placed++;
        changed = true;
    }
    for (size_t i = 0; i < e->n_replicas;) {
        if (e->n_replicas >= w->r && !wanted(w, p, e->replicas[i])) {
            drey_cluster__entry_drop_replica(e, e->replicas[i]);
            st->surplus++;
            changed = true;
        } else {
            i++;
        }
    }
    for (size_t i = 0; i < e->n_syncing;) {
        if (1 + e->n_replicas >= w->r && !wanted(w, p, e->syncing[i])) {
            drey_cluster__entry_remove(e->syncing, &e->n_syncing, e->syncing[i]);
            st->cancelled++;
            changed = true;
        } else {
            i++;
        }
    }
    return changed;
}

void drey_cluster__plan_rebalance(drey_cluster__plan *pl, drey_cluster__plan_stats *st) {
    for (uint32_t p = 0; p < pl->n_parts; p++) {
        if (pl->ent[p].primary[0] == '\0')
            return;
    }
    placement w;
    if (!place(pl, &w))
        return;
    /* Copies (moves, new backups) and handovers under way per primary (by
     * index in w.ids); a leaving primary is not there: its copies count
     * together. */
    uint32_t *copies = drey_xcalloc(w.n, sizeof *copies), *handovers = drey_xcalloc(w.n, sizeof *handovers);
    uint32_t copies_leaving = 0;
    for (uint32_t p = 0; p < pl->n_parts; p++) {
        const drey_cluster__entry *e = &pl->ent[p];
        int k = id_index(w.ids, w.n, e->primary);
        uint32_t *c = k >= 0 ? &copies[k] : &copies_leaving;
        *c += (uint32_t)e->n_syncing + (e->joining[0] != '\0');
        if (k >= 0)
            handovers[k] += e->handover[0] != '\0';
    }
    for (uint32_t p = 0; p < pl->n_parts; p++) {
        drey_cluster__entry *e = &pl->ent[p];
        bool changed = false;
        bool planned = review_plan(pl, e, &changed, st);
        pl->changed[p] |= changed;
        if (planned || liveness(pl, e->primary) < 0)
            continue;
        /* A primary that just changed keeps its role for the settle time;
         * its backups go on toward the placement (no primary changes). */
        bool settling = pl->primary_since_ms != NULL && pl->primary_since_ms[p] > 0 &&
                        pl->now_ms - pl->primary_since_ms[p] < DREY_CLUSTER_MOVE_SETTLE_MS;
        if (settling)
            st->waiting += strcmp(placed(&w, p, 0), e->primary) != 0;
        int k = id_index(w.ids, w.n, e->primary);
        uint32_t *c = k >= 0 ? &copies[k] : &copies_leaving;
        if (!settling && place_primary(pl, e, p, &w, c, k >= 0 ? &handovers[k] : NULL, st))
            pl->changed[p] = true;
        else if (place_backups(pl, e, p, &w, c, st))
            pl->changed[p] = true;
    }
    free(copies);
    free(handovers);
    placement_free(&w);
}
