/*
 * Unit tests for src/cluster/plan.c: the controller's planners on tables.
 *
 * Each test is one rule of plan.h on a small table: the first assignment,
 * failover only to an in-sync copy, departed copies dropped, new backups
 * throttled, and the rebalance's moves and handovers (never a copy onto an
 * in-sync backup, nothing onto a copy under way, nothing during the settle
 * time, plans cancelled when their target leaves). The last test runs the
 * planners over many random tables and checks the invariants every entry
 * they write keeps.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/placement.h"
#include "src/cluster/plan.h"

#define N_PARTS 16

static drey_cluster__plan pl;
static drey_cluster__plan_stats st;

static void setup(void) {
    memset(&st, 0, sizeof st);
}

static void teardown(void) {
    drey_cluster__plan_free(&pl);
}

TestSuite(plan, .init = setup, .fini = teardown, .timeout = 30);

/* A plan of n_parts over the members "n1".."n<members>" (none draining). */
static void table(uint32_t n_parts, uint32_t rf, uint32_t max_moves, int members) {
    drey_cluster__plan_init(&pl, n_parts, rf, max_moves, 16);
    for (int i = 1; i <= members; i++) {
        char id[8];
        snprintf(id, sizeof id, "n%d", i);
        drey_cluster__plan_member(&pl, id, false);
    }
}

/* Entry p: primary, then in-sync backups ("" ends them). */
static void entry(uint32_t p, const char *primary, const char *b1, const char *b2) {
    drey_cluster__entry *e = &pl.ent[p];
    drey_cluster__entry_of(NULL, e);
    snprintf(e->primary, sizeof e->primary, "%s", primary);
    if (b1 != NULL)
        drey_cluster__entry_add(e->replicas, &e->n_replicas, b1);
    if (b2 != NULL)
        drey_cluster__entry_add(e->replicas, &e->n_replicas, b2);
}

static bool has(char (*ids)[DREY_CLUSTER_MAX_ID], size_t n, const char *id) {
    return drey_cluster__entry_has(ids, n, id);
}

static void unchanged_all(void) {
    for (uint32_t p = 0; p < pl.n_parts; p++)
        cr_assert(!pl.changed[p], "partition %u changed", p);
}

/* The primary the placement wants for p among ids. */
static const char *wanted(const char *const *ids, size_t n, uint32_t p) {
    uint32_t r = drey_placement_replicas(pl.rf, n);
    uint32_t *a = malloc((size_t)pl.n_parts * r * sizeof *a);
    drey_placement_assign(ids, n, pl.n_parts, pl.rf, a);
    const char *w = ids[a[p * r]];
    free(a);
    return w;
}

/* Every partition led as the placement over ids wants, each with backups
 * ("" for none) as given by fill. */
static void placed(const char *const *ids, size_t n) {
    uint32_t r = drey_placement_replicas(pl.rf, n);
    uint32_t *a = malloc((size_t)pl.n_parts * r * sizeof *a);
    drey_placement_assign(ids, n, pl.n_parts, pl.rf, a);
    for (uint32_t p = 0; p < pl.n_parts; p++)
        entry(p, ids[a[p * r]], r > 1 ? ids[a[p * r + 1]] : NULL, r > 2 ? ids[a[p * r + 2]] : NULL);
    free(a);
}

/* A partition whose wanted primary (among n1..n3) is not its primary p0;
 * its entry is set to primary p0 with backup b. */
static uint32_t misplaced(const char *primary, const char *backup, const char *want) {
    static const char *ids[] = {"n1", "n2", "n3"};
    for (uint32_t p = 0; p < pl.n_parts; p++) {
        if (strcmp(wanted(ids, 3, p), want) == 0) {
            entry(p, primary, backup, NULL);
            return p;
        }
    }
    cr_assert_fail("no partition wants %s", want);
    return 0;
}

/* --- the first assignment ------------------------------------------------------------- */

Test(plan, the_first_assignment_waits_for_the_initial_nodes_then_places_every_copy_in_sync) {
    table(N_PARTS, 2, 2, 2);
    drey_cluster__plan_assign(&pl, 3, &st);
    unchanged_all();
    drey_cluster__plan_member(&pl, "n3", false);
    drey_cluster__plan_assign(&pl, 3, &st);
    cr_assert_eq(st.assigned, N_PARTS);
    for (uint32_t p = 0; p < N_PARTS; p++) {
        cr_assert(pl.changed[p]);
        cr_assert_neq(pl.ent[p].primary[0], '\0');
        cr_assert_eq(pl.ent[p].n_replicas, 1, "the backup is in sync from the start (the copies are empty)");
        cr_assert_eq(pl.ent[p].n_syncing, 0);
    }
}

/* --- repairs --------------------------------------------------------------------------- */

Test(plan, a_departed_primary_is_replaced_by_an_in_sync_backup_and_its_plans_go) {
    table(N_PARTS, 3, 2, 3);
    for (uint32_t p = 0; p < N_PARTS; p++)
        entry(p, "n2", "n1", "n3");
    entry(0, "n9", "n1", "n3");
    snprintf(pl.ent[0].handover, DREY_CLUSTER_MAX_ID, "n1");
    drey_cluster__plan_repair(&pl, &st);
    cr_assert_str_eq(pl.ent[0].primary, "n1");
    cr_assert(!has(pl.ent[0].replicas, pl.ent[0].n_replicas, "n1"));
    cr_assert_str_eq(pl.ent[0].handover, "");
    cr_assert_eq(st.promoted, 1);
    for (uint32_t p = 1; p < N_PARTS; p++)
        cr_assert(!pl.changed[p]);
}

Test(plan, a_copy_under_way_is_never_promoted) {
    table(N_PARTS, 2, 2, 2);
    for (uint32_t p = 0; p < N_PARTS; p++)
        entry(p, "n1", "n2", NULL);
    entry(0, "n9", NULL, NULL);
    drey_cluster__entry_add(pl.ent[0].syncing, &pl.ent[0].n_syncing, "n2");
    snprintf(pl.ent[0].joining, DREY_CLUSTER_MAX_ID, "n1");
    drey_cluster__plan_repair(&pl, &st);
    cr_assert_str_eq(pl.ent[0].primary, "n9", "the partition waits for its primary: only it has every write");
    cr_assert_eq(st.stranded, 1);
    cr_assert_eq(st.promoted, 0);
}

Test(plan, copies_and_a_handover_on_departed_nodes_are_dropped_and_a_leaving_nodes_backup_stays_for_now) {
    table(N_PARTS, 3, 2, 3);
    pl.draining[2] = true; /* n3 leaves */
    for (uint32_t p = 0; p < N_PARTS; p++)
        entry(p, "n1", "n2", NULL);
    entry(0, "n1", "n9", "n2"); /* n9 is gone */
    snprintf(pl.ent[0].handover, DREY_CLUSTER_MAX_ID, "n9");
    entry(1, "n1", "n3", NULL);
    drey_cluster__entry_add(pl.ent[1].syncing, &pl.ent[1].n_syncing, "n9");
    entry(2, "n1", "n2", NULL);
    drey_cluster__entry_add(pl.ent[2].syncing, &pl.ent[2].n_syncing, "n3");
    drey_cluster__plan_repair(&pl, &st);
    cr_assert_eq(pl.ent[0].n_replicas, 1);
    cr_assert_str_eq(pl.ent[0].replicas[0], "n2");
    cr_assert_str_eq(pl.ent[0].handover, "", "no handover to a node that is gone");
    cr_assert(has(pl.ent[1].replicas, pl.ent[1].n_replicas, "n3"),
              "a leaving node's in-sync backup stays until its replacement is in sync");
    cr_assert(!has(pl.ent[1].syncing, pl.ent[1].n_syncing, "n9"));
    cr_assert(!has(pl.ent[2].syncing, pl.ent[2].n_syncing, "n3"), "no copy to a leaving node");
    cr_assert_eq(st.dropped, 1);
}

Test(plan, an_under_replicated_partition_gets_a_new_backup_on_a_node_not_holding_it_a_few_at_a_time) {
    table(N_PARTS, 2, 2, 3);
    for (uint32_t p = 0; p < N_PARTS; p++)
        entry(p, "n1", NULL, NULL);
    drey_cluster__plan_repair(&pl, &st);
    uint32_t planned = 0;
    for (uint32_t p = 0; p < N_PARTS; p++) {
        if (pl.ent[p].n_syncing == 0)
            continue;
        planned++;
        cr_assert_str_neq(pl.ent[p].syncing[0], "n1");
        cr_assert_eq(pl.ent[p].n_replicas, 0, "a new backup is not in sync before its copy");
    }
    cr_assert_eq(planned, 2, "at most max_moves copies from one primary at once");
}

Test(plan, a_restarted_node_steps_out_of_the_entries_written_before_it_registered) {
    table(4, 2, 2, 3);
    int64_t epochs[4] = {10, 10, 10, 50};
    entry(0, "n1", "n2", NULL); /* it led: its backup takes over */
    entry(1, "n2", "n1", NULL); /* it backed: it leaves the set */
    entry(2, "n1", "n9", NULL); /* it led, its backup is gone: it keeps it */
    entry(3, "n2", "n1", NULL); /* written after it registered: about it */
    drey_cluster__plan_step_out(&pl, "n1", epochs, 40, &st);
    cr_assert_str_eq(pl.ent[0].primary, "n2");
    cr_assert_eq(pl.ent[0].n_replicas, 0);
    cr_assert_eq(pl.ent[1].n_replicas, 0);
    cr_assert_str_eq(pl.ent[2].primary, "n1");
    cr_assert_eq(st.stranded, 1);
    cr_assert(!pl.changed[3]);
}

/* --- the rebalance ----------------------------------------------------------------------- */

Test(plan, the_primary_role_goes_to_an_in_sync_backup_by_a_handover_never_a_copy) {
    table(N_PARTS, 2, 2, 3);
    static const char *ids[] = {"n1", "n2", "n3"};
    placed(ids, 3);
    /* p's wanted primary n2 is its in-sync backup */
    uint32_t p = misplaced("n1", "n2", "n2");
    drey_cluster__plan_rebalance(&pl, &st);
    cr_assert(pl.changed[p]);
    cr_assert_str_eq(pl.ent[p].handover, "n2");
    cr_assert_str_eq(pl.ent[p].joining, "", "a copy onto n2 would replace its in-sync copy");
    cr_assert_eq(st.handovers, 1);
    cr_assert_eq(st.moves, 0);
}

Test(plan, the_primary_role_goes_to_a_node_holding_nothing_by_a_move) {
    table(N_PARTS, 2, 2, 3);
    static const char *ids[] = {"n1", "n2", "n3"};
    placed(ids, 3);
    uint32_t p = misplaced("n1", "n2", "n3");
    drey_cluster__plan_rebalance(&pl, &st);
    cr_assert_str_eq(pl.ent[p].joining, "n3");
    cr_assert_str_eq(pl.ent[p].handover, "");
    cr_assert_eq(st.moves, 1);
}

Test(plan, nothing_is_planned_onto_a_node_still_copying_the_partition_as_a_backup) {
    table(N_PARTS, 2, 2, 3);
    static const char *ids[] = {"n1", "n2", "n3"};
    placed(ids, 3);
    uint32_t p = misplaced("n1", NULL, "n2");
    drey_cluster__entry_add(pl.ent[p].syncing, &pl.ent[p].n_syncing, "n2");
    drey_cluster__plan_rebalance(&pl, &st);
    cr_assert_str_eq(pl.ent[p].joining, "", "its copy first, then a handover");
    cr_assert_str_eq(pl.ent[p].handover, "");
    cr_assert_str_eq(pl.ent[p].primary, "n1");
    cr_assert(has(pl.ent[p].syncing, pl.ent[p].n_syncing, "n2"));
}

Test(plan, a_move_planned_onto_an_in_sync_backup_becomes_a_handover) {
    table(N_PARTS, 2, 2, 3);
    static const char *ids[] = {"n1", "n2", "n3"};
    placed(ids, 3);
    uint32_t p = misplaced("n1", "n2", "n2");
    snprintf(pl.ent[p].joining, DREY_CLUSTER_MAX_ID, "n2"); /* the plan that lost writes */
    drey_cluster__plan_rebalance(&pl, &st);
    cr_assert(pl.changed[p]);
    cr_assert_str_eq(pl.ent[p].joining, "");
    cr_assert_str_eq(pl.ent[p].handover, "n2");
}

Test(plan, a_plan_whose_target_left_or_fell_out_of_sync_is_cancelled) {
    table(N_PARTS, 2, 2, 3);
    static const char *ids[] = {"n1", "n2", "n3"};
    placed(ids, 3);
    uint32_t p = misplaced("n1", "n2", "n2");
    snprintf(pl.ent[p].handover, DREY_CLUSTER_MAX_ID, "n3"); /* n3 is not in the set */
    drey_cluster__plan_rebalance(&pl, &st);
    cr_assert(pl.changed[p]);
    cr_assert_eq(st.cancelled, 1);
    cr_assert_str_eq(pl.ent[p].handover, "n2", "replanned at once, to the wanted in-sync backup");
    drey_cluster__plan_free(&pl);
    memset(&st, 0, sizeof st);
    table(N_PARTS, 2, 2, 2); /* n3 is gone */
    placed(ids, 2);
    snprintf(pl.ent[0].joining, DREY_CLUSTER_MAX_ID, "n3");
    drey_cluster__plan_rebalance(&pl, &st);
    cr_assert_str_eq(pl.ent[0].joining, "");
    cr_assert_eq(st.cancelled, 1);
}

Test(plan, a_partition_whose_primary_just_changed_keeps_it_for_the_settle_time) {
    table(N_PARTS, 2, 2, 3);
    static const char *ids[] = {"n1", "n2", "n3"};
    placed(ids, 3);
    uint32_t p = misplaced("n1", "n2", "n2");
    int64_t since[N_PARTS] = {0};
    since[p] = 100000;
    pl.primary_since_ms = since;
    pl.now_ms = 100000 + DREY_CLUSTER_MOVE_SETTLE_MS - 1;
    drey_cluster__plan_rebalance(&pl, &st);
    cr_assert_str_eq(pl.ent[p].handover, "", "no move straight back");
    cr_assert_str_eq(pl.ent[p].joining, "");
    cr_assert_str_eq(pl.ent[p].primary, "n1");
    cr_assert_eq(st.waiting, 1);
    pl.now_ms = 100000 + DREY_CLUSTER_MOVE_SETTLE_MS;
    drey_cluster__plan_rebalance(&pl, &st);
    cr_assert_str_eq(pl.ent[p].handover, "n2");
}

Test(plan, moves_are_throttled_per_primary_and_handovers_less) {
    table(64, 2, 2, 3);
    static const char *ids[] = {"n1", "n2", "n3"};
    placed(ids, 3);
    /* every partition n2 or n3 should lead, on n1 with the wanted node in sync or not */
    uint32_t want_moves = 0, want_handovers = 0;
    for (uint32_t p = 0; p < 64; p++) {
        const char *w = wanted(ids, 3, p);
        if (strcmp(w, "n1") == 0)
            continue;
        bool in_sync = p % 2 == 0;
        entry(p, "n1", in_sync ? w : NULL, NULL);
        want_handovers += in_sync;
        want_moves += !in_sync;
    }
    cr_assert_gt(want_moves, 2);
    cr_assert_gt(want_handovers, DREY_CLUSTER_MAX_HANDOVERS);
    drey_cluster__plan_rebalance(&pl, &st);
    cr_assert_eq(st.moves + st.placed, 2, "max_moves copies (moves and new backups) from n1 at once");
    cr_assert_eq(st.handovers, DREY_CLUSTER_MAX_HANDOVERS);
}

Test(plan, nothing_moves_until_every_partition_has_a_primary) {
    table(N_PARTS, 2, 2, 3);
    static const char *ids[] = {"n1", "n2", "n3"};
    placed(ids, 3);
    misplaced("n1", "n2", "n2");
    pl.ent[N_PARTS - 1].primary[0] = '\0';
    drey_cluster__plan_rebalance(&pl, &st);
    unchanged_all();
}

Test(plan, a_leaving_primary_hands_its_partitions_over) {
    table(N_PARTS, 2, 2, 3);
    static const char *ids[] = {"n1", "n2", "n3"};
    placed(ids, 3);
    pl.draining[0] = true; /* n1 leaves */
    static const char *rest[] = {"n2", "n3"};
    uint32_t handed = 0;
    for (uint32_t p = 0; p < N_PARTS; p++) {
        if (strcmp(pl.ent[p].primary, "n1") != 0)
            continue;
        drey_cluster__entry *e = &pl.ent[p];
        e->n_replicas = 0;
        drey_cluster__entry_add(e->replicas, &e->n_replicas, wanted(rest, 2, p));
        handed++;
    }
    cr_assert_gt(handed, 0);
    drey_cluster__plan_rebalance(&pl, &st);
    cr_assert_eq(st.handovers, handed < DREY_CLUSTER_MAX_HANDOVERS ? handed : DREY_CLUSTER_MAX_HANDOVERS);
    cr_assert_eq(st.moves, 0);
}

/* --- every copy placed ------------------------------------------------------------------- */

/* The nodes' part of every plan in the table, as move.c carries them out:
 * a move makes its target primary (the old one stays a backup only while
 * the partition would have fewer copies than the factor), a handover makes
 * the backup primary and the old one a backup, a new backup joins the
 * in-sync set once copied. */
static void carry_out(void) {
    for (uint32_t p = 0; p < pl.n_parts; p++) {
        drey_cluster__entry *e = &pl.ent[p];
        char old[DREY_CLUSTER_MAX_ID];
        memcpy(old, e->primary, sizeof old);
        if (e->joining[0] != '\0') {
            memcpy(e->primary, e->joining, sizeof old);
            e->joining[0] = '\0';
            e->handover[0] = '\0';
            e->n_syncing = 0;
            if (1 + e->n_replicas < pl.rf)
                drey_cluster__entry_add(e->replicas, &e->n_replicas, old);
        } else if (e->handover[0] != '\0') {
            char to[DREY_CLUSTER_MAX_ID];
            memcpy(to, e->handover, sizeof to);
            drey_cluster__entry_drop_replica(e, to);
            memcpy(e->primary, to, sizeof to);
            drey_cluster__entry_add(e->replicas, &e->n_replicas, old);
        } else {
            while (e->n_syncing > 0) {
                drey_cluster__entry_add(e->replicas, &e->n_replicas, e->syncing[0]);
                drey_cluster__entry_remove(e->syncing, &e->n_syncing, e->syncing[0]);
            }
        }
    }
}

/* A member, leaving or not; and how many stay. */
static bool member(const char *id) {
    for (size_t i = 0; i < pl.n_live; i++) {
        if (strcmp(pl.live[i], id) == 0)
            return true;
    }
    return false;
}

static uint32_t staying(void) {
    uint32_t n = 0;
    for (size_t i = 0; i < pl.n_live; i++)
        n += !pl.draining[i];
    return n;
}

/* Whether the placement over the members that stay puts a copy of p on id. */
static bool placement_wants(uint32_t p, const char *id) {
    const char *ids[16];
    size_t n = 0;
    for (size_t i = 0; i < pl.n_live; i++) {
        if (!pl.draining[i])
            ids[n++] = pl.live[i];
    }
    uint32_t r = drey_placement_replicas(pl.rf, n), *a = malloc((size_t)pl.n_parts * r * sizeof *a);
    drey_placement_assign(ids, n, pl.n_parts, pl.rf, a);
    bool found = false;
    for (uint32_t k = 0; k < r; k++)
        found |= strcmp(ids[a[p * r + k]], id) == 0;
    free(a);
    return found;
}

/* One controller look as controller.c takes it: the first assignment,
 * else the repairs, else the rebalance. Checks that no in-sync copy on a
 * member (leaving or not) is dropped while the partition would be left
 * with fewer in-sync copies than the factor (unless fewer nodes stay than
 * the factor), that no partition has more than
 * one copy beyond the factor, and that every copy it plans goes where the
 * placement wants one (none wasted). Returns whether it planned. */
static bool look(void) {
    drey_cluster__entry *before = malloc(pl.n_parts * sizeof *before);
    memcpy(before, pl.ent, pl.n_parts * sizeof *before);
    memset(pl.changed, 0, pl.n_parts * sizeof *pl.changed);
    drey_cluster__plan_stats s = {0};
    bool any = false;
    drey_cluster__plan_assign(&pl, 1, &s);
    for (uint32_t p = 0; p < pl.n_parts; p++)
        any |= pl.changed[p];
    if (!any)
        drey_cluster__plan_repair(&pl, &s);
    for (uint32_t p = 0; p < pl.n_parts; p++)
        any |= pl.changed[p];
    if (!any)
        drey_cluster__plan_rebalance(&pl, &s);
    for (uint32_t p = 0; p < pl.n_parts; p++) {
        any |= pl.changed[p];
        const drey_cluster__entry *b = &before[p], *e = &pl.ent[p];
        cr_assert_leq(1 + e->n_replicas + e->n_syncing, pl.rf + 1, "partition %u: %zu in sync, %zu copying", p,
                      1 + e->n_replicas, e->n_syncing);
        for (size_t i = 0; i < e->n_syncing; i++) {
            if (!has(before[p].syncing, b->n_syncing, e->syncing[i]))
                cr_assert(placement_wants(p, e->syncing[i]), "partition %u: a copy to %s, not wanted there", p,
                          e->syncing[i]);
        }
        if (e->joining[0] != '\0' && strcmp(e->joining, b->joining) != 0)
            cr_assert(placement_wants(p, e->joining), "partition %u: a move to %s, not wanted there", p, e->joining);
        for (size_t i = 0; i < b->n_replicas; i++) {
            const char *id = b->replicas[i];
            bool kept = strcmp(e->primary, id) == 0 || has(pl.ent[p].replicas, e->n_replicas, id);
            if (!kept && member(id) && staying() >= pl.rf) /* else nobody could take the copy */
                cr_assert_geq(1 + e->n_replicas, pl.rf,
                              "partition %u: the in-sync copy on %s dropped, leaving %zu in-sync copies", p, id,
                              1 + e->n_replicas);
        }
    }
    free(before);
    return any;
}

/* Looks and carries the plans out until a look plans nothing; fails if that
 * takes more than max_looks. Then looks again: nothing (no oscillation). */
static int converge(int max_looks) {
    for (int i = 0; i < max_looks; i++) {
        if (!look()) {
            for (int again = 0; again < 3; again++)
                cr_assert(!look(), "a converged table planned again");
            return i;
        }
        carry_out();
    }
    cr_assert_fail("no convergence in %d looks", max_looks);
    return -1;
}

typedef struct held {
    uint32_t primaries, backups;
} held;

static held held_by(const char *id) {
    held h = {0, 0};
    for (uint32_t p = 0; p < pl.n_parts; p++) {
        h.primaries += strcmp(pl.ent[p].primary, id) == 0;
        h.backups += has(pl.ent[p].replicas, pl.ent[p].n_replicas, id);
    }
    return h;
}

/* Every member that stays holds copies (primaries and in-sync backups)
 * within 1.25x of every other's, every partition has min(rf, members)
 * in-sync copies and nothing under way. */
static void balanced(void) {
    uint32_t most = 0, least = UINT32_MAX, members = 0;
    for (size_t i = 0; i < pl.n_live; i++) {
        if (pl.draining[i]) {
            held h = held_by(pl.live[i]);
            cr_assert_eq(h.primaries + h.backups, 0, "leaving %s still holds copies", pl.live[i]);
            continue;
        }
        members++;
        held h = held_by(pl.live[i]);
        uint32_t copies = h.primaries + h.backups;
        most = copies > most ? copies : most;
        least = copies < least ? copies : least;
    }
    cr_assert_leq(most, 1.25 * least, "copies per node from %u to %u", least, most);
    for (uint32_t p = 0; p < pl.n_parts; p++) {
        const drey_cluster__entry *e = &pl.ent[p];
        cr_assert_eq(1 + e->n_replicas, pl.rf < members ? pl.rf : members, "partition %u", p);
        cr_assert_eq(e->n_syncing, 0);
        cr_assert_str_eq(e->joining, "");
        cr_assert_str_eq(e->handover, "");
    }
}

static const char *const ids4[] = {"n1", "n2", "n3", "n4"};

Test(plan, a_table_where_the_placement_wants_every_copy_plans_nothing) {
    for (uint32_t rf = 1; rf <= 3; rf++) {
        drey_cluster__plan_free(&pl);
        table(256, rf, 2, 3);
        placed(ids4, 3);
        cr_assert_eq(converge(1), 0);
    }
}

Test(plan, a_joining_node_gets_backups_as_well_as_primaries_and_copies_even_out) {
    for (uint32_t rf = 2; rf <= 3; rf++) {
        drey_cluster__plan_free(&pl);
        table(256, rf, 2, 3);
        placed(ids4, 3);
        drey_cluster__plan_member(&pl, "n4", false);
        converge(400);
        held h = held_by("n4");
        cr_assert_gt(h.primaries, 0);
        cr_assert_gt(h.backups, 0, "rf %u: the new node backs partitions too", rf);
        balanced();
    }
}

Test(plan, a_cluster_that_doubles_never_holds_more_than_one_copy_beyond_the_factor) {
    table(256, 3, 2, 6);
    placed(ids4, 3);
    converge(600); /* look() checks every step */
    balanced();
}

Test(plan, a_copy_under_way_that_the_factor_still_needs_is_kept_though_the_placement_wants_another_node) {
    table(N_PARTS, 2, 2, 4);
    placed(ids4, 4);
    uint32_t r = 2, *a = malloc(N_PARTS * r * sizeof *a);
    drey_placement_assign(ids4, 4, N_PARTS, 2, a);
    const char *primary = ids4[a[0]], *other = NULL;
    for (int k = 0; k < 4 && other == NULL; k++) {
        if ((uint32_t)k != a[0] && (uint32_t)k != a[1])
            other = ids4[k];
    }
    free(a);
    entry(0, primary, NULL, NULL);
    drey_cluster__entry_add(pl.ent[0].syncing, &pl.ent[0].n_syncing, other); /* planned before a join, say */
    drey_cluster__plan_rebalance(&pl, &st);
    cr_assert(has(pl.ent[0].syncing, pl.ent[0].n_syncing, other), "the only copy on its way to the factor");
    cr_assert_eq(st.cancelled, 0);
}

Test(plan, a_restarted_node_gets_its_share_of_backups_back) {
    table(256, 2, 2, 3);
    placed(ids4, 3);
    int64_t epochs[256];
    for (uint32_t p = 0; p < 256; p++)
        epochs[p] = 10;
    drey_cluster__plan_step_out(&pl, "n1", epochs, 20, &st);
    held out = held_by("n1");
    cr_assert_eq(out.primaries + out.backups, 0, "it stepped out of every partition");
    converge(400);
    held h = held_by("n1");
    cr_assert_gt(h.backups, 60, "n1 backs %u partitions", h.backups);
    balanced();
}

Test(plan, after_a_failover_the_survivors_copies_even_out) {
    table(256, 2, 2, 0);
    drey_cluster__plan_member(&pl, "n1", false);
    drey_cluster__plan_member(&pl, "n3", false);
    drey_cluster__plan_member(&pl, "n4", false);
    placed(ids4, 4); /* as the four wanted it; n2 died */
    converge(400);
    cr_assert_eq(held_by("n2").primaries + held_by("n2").backups, 0);
    balanced();
}

Test(plan, a_drain_replaces_every_copy_before_dropping_it) {
    for (uint32_t rf = 2; rf <= 3; rf++) {
        drey_cluster__plan_free(&pl);
        table(256, rf, 2, 4);
        placed(ids4, 4);
        pl.draining[1] = true; /* n2 leaves: look() checks no step leaves fewer than rf in-sync copies */
        converge(600);
        balanced();
    }
}

Test(plan, a_drain_with_no_node_to_take_the_copies_still_hands_the_primaries_over) {
    table(64, 2, 2, 2);
    placed(ids4, 2);
    pl.draining[0] = true; /* n1 leaves; only n2 stays */
    converge(200);
    for (uint32_t p = 0; p < 64; p++) {
        cr_assert_str_eq(pl.ent[p].primary, "n2");
        cr_assert_eq(pl.ent[p].n_replicas, 0, "one copy: nobody else to hold the second");
    }
}

Test(plan, a_failover_prefers_a_backup_that_stays_to_one_that_is_leaving) {
    table(N_PARTS, 3, 2, 3);
    pl.draining[0] = true; /* n1 leaves */
    for (uint32_t p = 0; p < N_PARTS; p++)
        entry(p, "n2", "n3", "n1");
    entry(0, "n9", "n1", "n3"); /* its primary died */
    drey_cluster__plan_repair(&pl, &st);
    cr_assert_str_eq(pl.ent[0].primary, "n3");
    cr_assert(has(pl.ent[0].replicas, pl.ent[0].n_replicas, "n1"), "the leaving backup stays for now");
}

Test(plan, a_surplus_backup_goes_only_once_the_wanted_one_is_in_sync) {
    table(N_PARTS, 2, 2, 3);
    static const char *ids[] = {"n1", "n2", "n3"};
    placed(ids, 3);
    /* a partition n1 leads where the placement wants n1 and another node,
     * backed by the third */
    uint32_t r = drey_placement_replicas(2, 3), *a = malloc(N_PARTS * r * sizeof *a), p = N_PARTS;
    drey_placement_assign(ids, 3, N_PARTS, 2, a);
    for (uint32_t q = 0; q < N_PARTS && p == N_PARTS; q++) {
        if (a[q * r] == 0)
            p = q;
    }
    cr_assert_lt(p, N_PARTS);
    const char *want = ids[a[p * r + 1]], *other = ids[3 - a[p * r + 1]];
    free(a);
    entry(p, "n1", other, NULL);
    drey_cluster__plan_rebalance(&pl, &st);
    cr_assert(pl.changed[p]);
    cr_assert(has(pl.ent[p].syncing, pl.ent[p].n_syncing, want), "the wanted backup is copied");
    cr_assert(has(pl.ent[p].replicas, pl.ent[p].n_replicas, other), "the surplus stays while the copy runs");
    cr_assert_eq(st.placed, 1);
    memset(pl.changed, 0, N_PARTS * sizeof *pl.changed);
    drey_cluster__plan_rebalance(&pl, &st);
    cr_assert(!pl.changed[p], "nothing while the copy runs");
    drey_cluster__entry_remove(pl.ent[p].syncing, &pl.ent[p].n_syncing, want);
    drey_cluster__entry_add(pl.ent[p].replicas, &pl.ent[p].n_replicas, want);
    drey_cluster__plan_rebalance(&pl, &st);
    cr_assert(pl.changed[p]);
    cr_assert_eq(pl.ent[p].n_replicas, 1);
    cr_assert_str_eq(pl.ent[p].replicas[0], want, "the surplus goes once its replacement is in sync");
    cr_assert_eq(st.surplus, 1);
}

Test(plan, a_primary_the_placement_keeps_as_a_backup_is_not_moved_away_but_the_new_one_copied_then_handed_over) {
    table(N_PARTS, 2, 2, 3);
    static const char *ids[] = {"n1", "n2", "n3"};
    placed(ids, 3);
    /* a partition the placement wants on n2 (primary) and n1 (backup),
     * led by n1 and backed by n3 */
    uint32_t r = drey_placement_replicas(2, 3), *a = malloc(N_PARTS * r * sizeof *a), p = N_PARTS;
    drey_placement_assign(ids, 3, N_PARTS, 2, a);
    for (uint32_t q = 0; q < N_PARTS && p == N_PARTS; q++) {
        if (a[q * r] == 1 && a[q * r + 1] == 0)
            p = q;
    }
    free(a);
    cr_assert_lt(p, N_PARTS);
    entry(p, "n1", "n3", NULL);
    drey_cluster__plan_rebalance(&pl, &st);
    cr_assert_str_eq(pl.ent[p].joining, "", "a move would drop n1's copy, which the placement keeps");
    cr_assert(has(pl.ent[p].syncing, pl.ent[p].n_syncing, "n2"));
    carry_out();
    memset(pl.changed, 0, N_PARTS * sizeof *pl.changed);
    drey_cluster__plan_rebalance(&pl, &st);
    cr_assert_str_eq(pl.ent[p].handover, "n2");
    carry_out();
    drey_cluster__plan_rebalance(&pl, &st);
    cr_assert_str_eq(pl.ent[p].primary, "n2");
    cr_assert_eq(pl.ent[p].n_replicas, 1);
    cr_assert_str_eq(pl.ent[p].replicas[0], "n1");
}

Test(plan, new_backups_count_against_the_primarys_copies_at_once) {
    table(64, 2, 2, 3);
    static const char *ids[] = {"n1", "n2", "n3"};
    placed(ids, 3);
    drey_cluster__plan_member(&pl, "n4", false);
    drey_cluster__plan_rebalance(&pl, &st);
    for (int k = 0; k < 4; k++) {
        uint32_t copies = 0;
        for (uint32_t p = 0; p < 64; p++) {
            if (strcmp(pl.ent[p].primary, ids4[k]) == 0)
                copies += (uint32_t)pl.ent[p].n_syncing + (pl.ent[p].joining[0] != '\0');
        }
        cr_assert_leq(copies, 2, "%s copies %u partitions at once", ids4[k], copies);
    }
    cr_assert_gt(st.placed, 0);
}

/* --- invariants over random tables -------------------------------------------------------- */

static const char *rnd_id(unsigned *seed) {
    static const char *ids[] = {"n1", "n2", "n3", "n4", "n9"};
    return ids[rand_r(seed) % 5];
}

/* A well-formed entry: distinct nodes across primary, replicas, syncing,
 * joining (not in replicas), handover (in replicas). */
static void random_entry(drey_cluster__entry *e, unsigned *seed) {
    drey_cluster__entry_of(NULL, e);
    if (rand_r(seed) % 8 == 0)
        return; /* unassigned */
    snprintf(e->primary, sizeof e->primary, "%s", rnd_id(seed));
    for (int i = 0; i < 3; i++) {
        const char *id = rnd_id(seed);
        bool taken = strcmp(id, e->primary) == 0 || has(e->replicas, e->n_replicas, id) ||
                     has(e->syncing, e->n_syncing, id) || strcmp(id, e->joining) == 0;
        if (taken)
            continue;
        switch (rand_r(seed) % 3) {
        case 0: drey_cluster__entry_add(e->replicas, &e->n_replicas, id); break;
        case 1: drey_cluster__entry_add(e->syncing, &e->n_syncing, id); break;
        default:
            if (e->joining[0] == '\0')
                snprintf(e->joining, sizeof e->joining, "%s", id);
        }
    }
    if (e->n_replicas > 0 && e->joining[0] == '\0' && rand_r(seed) % 3 == 0)
        snprintf(e->handover, sizeof e->handover, "%s", e->replicas[0]);
}

static void check_entry(const drey_cluster__entry *before, const drey_cluster__entry *e, uint32_t p) {
    if (e->joining[0] != '\0')
        cr_assert(!has((char (*)[DREY_CLUSTER_MAX_ID])e->replicas, e->n_replicas, e->joining),
                  "partition %u: a copy planned onto in-sync %s", p, e->joining);
    if (e->handover[0] != '\0')
        cr_assert(has((char (*)[DREY_CLUSTER_MAX_ID])e->replicas, e->n_replicas, e->handover),
                  "partition %u: a handover to %s, not in sync", p, e->handover);
    if (before->primary[0] != '\0' && strcmp(before->primary, e->primary) != 0)
        cr_assert(has((char (*)[DREY_CLUSTER_MAX_ID])before->replicas, before->n_replicas, e->primary),
                  "partition %u: %s promoted without an in-sync copy", p, e->primary);
    for (size_t i = 0; i < e->n_replicas; i++)
        cr_assert(has((char (*)[DREY_CLUSTER_MAX_ID])before->replicas, before->n_replicas, e->replicas[i]) ||
                      before->primary[0] == '\0',
                  "partition %u: %s entered the in-sync set without a copy", p, e->replicas[i]);
}

Test(plan, no_plan_ever_copies_onto_or_promotes_anything_but_an_in_sync_copy) {
    for (unsigned round = 0; round < 2000; round++) {
        unsigned seed = round;
        table(8, 1 + rand_r(&seed) % 3, 1 + rand_r(&seed) % 3, 0);
        static const char *members[] = {"n1", "n2", "n3", "n4"};
        for (int i = 0; i < 4; i++) {
            if (rand_r(&seed) % 4 != 0)
                drey_cluster__plan_member(&pl, members[i], rand_r(&seed) % 5 == 0);
        }
        drey_cluster__entry before[8];
        for (uint32_t p = 0; p < 8; p++) {
            random_entry(&pl.ent[p], &seed);
            before[p] = pl.ent[p];
        }
        drey_cluster__plan_repair(&pl, &st);
        drey_cluster__plan_rebalance(&pl, &st);
        for (uint32_t p = 0; p < 8; p++)
            check_entry(&before[p], &pl.ent[p], p);
        drey_cluster__plan_free(&pl);
        memset(&pl, 0, sizeof pl);
    }
    table(1, 1, 1, 0); /* for the fixture's teardown */
}
