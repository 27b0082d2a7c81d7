/* Rendezvous assignment with bounded loads: deterministic whatever the node
 * order, distinct replicas, plain HRW's primary is the highest weight, and
 * the load and movement bounds the cluster relies on (the numbers behind them:
 * bazel run //tests/bench:placement). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/placement.h"
#include "src/placement/measure.h"

#define MAX_NODES 201

static char names[MAX_NODES][24];
static const char *ids[MAX_NODES];

static void init_names(void) {
    for (int i = 0; i < MAX_NODES; i++) {
        snprintf(names[i], sizeof names[i], "drey-%d", i);
        ids[i] = names[i];
    }
}

TestSuite(assign, .init = init_names);

static uint32_t *assigned(const char *const *nodes, size_t n, uint32_t parts, uint32_t rf) {
    uint32_t *out = malloc(sizeof(uint32_t) * parts * (rf ? rf : 1));
    cr_assert_not_null(out);
    drey_placement_assign(nodes, n, parts, rf, out);
    return out;
}

Test(assign, the_node_order_does_not_matter) {
    const char *reversed[40];
    for (int i = 0; i < 40; i++)
        reversed[i] = ids[39 - i];
    for (uint32_t rf = 1; rf <= 3; rf++) {
        uint32_t *a = assigned(ids, 40, 256, rf), *b = assigned(reversed, 40, 256, rf);
        for (size_t i = 0; i < 256 * rf; i++)
            cr_assert_str_eq(ids[a[i]], reversed[b[i]], "rf %u slot %zu", rf, i);
        free(a);
        free(b);
    }
}

Test(assign, replicas_are_distinct_and_rf_is_capped_by_the_nodes) {
    cr_assert_eq(drey_placement_replicas(3, 2), 2);
    cr_assert_eq(drey_placement_replicas(2, 5), 2);
    for (size_t n = 1; n <= 6; n++) {
        uint32_t r = drey_placement_replicas(3, n);
        uint32_t *a = assigned(ids, n, 64, 3);
        for (uint32_t p = 0; p < 64; p++)
            for (uint32_t j = 0; j < r; j++) {
                cr_assert_lt(a[p * r + j], n);
                for (uint32_t k = 0; k < j; k++)
                    cr_assert_neq(a[p * r + j], a[p * r + k], "n %zu partition %u", n, p);
            }
        free(a);
    }
}

Test(assign, nothing_is_written_without_nodes_or_replicas) {
    uint32_t out[4] = {7, 7, 7, 7};
    drey_placement_assign(ids, 0, 4, 1, out);
    drey_placement_assign(ids, 3, 4, 0, out);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(out[i], 7);
}

Test(assign, plain_hrw_ranks_by_weight) {
    enum { N = 9, P = 128, RF = 3 };
    uint32_t out[P * RF];
    drey_placement_assign_unbounded(ids, N, P, RF, out);
    for (uint32_t p = 0; p < P; p++) {
        uint64_t prev = UINT64_MAX;
        for (uint32_t k = 0; k < RF; k++) {
            uint64_t w = drey_placement_weight(ids[out[p * RF + k]], strlen(ids[out[p * RF + k]]), p);
            cr_assert_leq(w, prev);
            prev = w;
        }
        for (uint32_t i = 0; i < N; i++) {
            int chosen = 0;
            for (uint32_t k = 0; k < RF; k++)
                chosen |= out[p * RF + k] == i;
            if (!chosen)
                cr_assert_lt(drey_placement_weight(ids[i], strlen(ids[i]), p), prev, "partition %u node %u", p, i);
        }
    }
}

/* The node counts the tests sweep for a partition count: every one up to
 * 200 for 256 partitions (where caps are small and their rounding matters),
 * every one up to 40 and then every 8th for 4096 (slower, and smooth). */
static size_t sizes_of(uint32_t parts, size_t *out) {
    size_t k = 0;
    for (size_t n = 1; n <= 200; n++)
        if (parts <= 256 || n <= 40 || n % 8 == 0 || n == 199)
            out[k++] = n;
    return k;
}

/* The primaries' caps add up to ceil(1.25 x partitions), the copies' caps
 * (rf 2) to the copies, and caps differ by at most one, so the fullest node
 * holds at most ceil(total / n) (rf 2: and 1% more) and the emptiest is
 * bounded too (rf 2):
 * with 16 or more copies per node, fullest and emptiest within 1.1x of
 * each other (measured 1.06x at most; at 1.25 x slots it was 2.3x). Primaries: <= 1.5x the mean for 256 partitions up to 32
 * nodes and <= 1.3x for 4096 up to 200 (rf 2: 1.35x, measured 1.31x: a
 * primary needs a node with room for a copy too); plain HRW measured 1.75x at 16
 * nodes with 256. */
Test(assign, the_fullest_node_stays_within_the_bound) {
    size_t sizes[200];
    for (uint32_t rf = 1; rf <= 2; rf++)
        for (uint32_t parts = 256; parts <= 4096; parts *= 16)
            for (size_t i = 0, k = sizes_of(parts, sizes); i < k; i++) {
                size_t n = sizes[i];
                uint32_t r = drey_placement_replicas(rf, n);
                uint32_t *a = assigned(ids, n, parts, rf);
                double mean = (double)parts * r / (double)n;
                double load = drey_placement__max_over_mean(a, n, parts, r, 0);
                double primaries = drey_placement__max_over_mean(a, n, parts, r, 1);
                uint64_t total = r > 1 ? (uint64_t)parts * r : ((uint64_t)parts * 5 + 3) / 4;
                /* rf 2: the last partitions may find the only nodes with room
                 * among their own copies, and overflow another (by 15 of
                 * 2,048 at most, measured) */
                uint64_t most = (total + n - 1) / n + (r > 1 ? total / n / 100 + 1 : 0);
                cr_expect_leq(load * mean, (double)most + 1e-9, "%u partitions rf %u on %zu nodes: %.0f > %lu", parts,
                              rf, n, load * mean, (unsigned long)most);
                if (parts == 256 && n <= 32)
                    cr_expect_leq(load, 1.5, "%u partitions rf %u on %zu nodes: %.3f", parts, rf, n, load);
                if (parts == 4096) {
                    cr_expect_leq(load, 1.3, "%u partitions rf %u on %zu nodes: %.3f", parts, rf, n, load);
                    cr_expect_leq(primaries, rf > 1 ? 1.35 : 1.3, "primaries, rf %u, %zu nodes: %.3f", rf, n,
                                  primaries);
                }
                if (r > 1 && parts * r / n >= 16) {
                    uint32_t most = 0, least = UINT32_MAX;
                    for (uint32_t node = 0; node < n; node++) {
                        uint32_t held = (uint32_t)drey_placement__slots_of(a, parts, r, node);
                        most = held > most ? held : most;
                        least = held < least ? held : least;
                    }
                    cr_expect_leq(most, 1.1 * least, "%u partitions rf %u on %zu nodes: %u and %u copies", parts,
                                  rf, n, most, least);
                }
                free(a);
            }
}

/* A join moves at most 1/(n+1) + 0.12 of the replica slots (Squirix's ring
 * property tests set that bar); the minimum is 1/(n+1). With 16 or more
 * partitions per node, at most twice that; with rf 2, whose copies' caps
 * have no slack (a cap's change cascades further), up to 1/(n+1) + 0.02 of
 * the slots where that is more (measured +0.015 at 4096 partitions, where
 * twice the share of 150 nodes is only 0.013). */
Test(assign, a_join_moves_little_more_than_the_new_nodes_share) {
    size_t sizes[200];
    for (uint32_t rf = 1; rf <= 2; rf++)
        for (uint32_t parts = 256; parts <= 4096; parts *= 16)
            for (size_t i = 0, k = sizes_of(parts, sizes); i < k; i++) {
                size_t n = sizes[i];
                uint32_t r = drey_placement_replicas(rf, n), rj = drey_placement_replicas(rf, n + 1);
                uint32_t *before = assigned(ids, n, parts, rf), *after = assigned(ids, n + 1, parts, rf);
                size_t moved = drey_placement__moved(ids, before, r, ids, after, rj, parts);
                double frac = (double)moved / ((double)parts * rj);
                cr_expect_leq(frac, 1.0 / (double)(n + 1) + 0.12, "%u partitions rf %u, %zu -> %zu nodes: %.3f",
                              parts, rf, n, n + 1, frac);
                /* With 16 or more partitions per node: at most twice the
                 * share, and the new node gets some (with fewer, HRW alone
                 * can leave a node without any). */
                if (parts / (n + 1) >= 16) {
                    double bound = 2.0 / (double)(n + 1);
                    if (rj > 1 && bound < 1.0 / (double)(n + 1) + 0.02)
                        bound = 1.0 / (double)(n + 1) + 0.02;
                    cr_expect_leq(frac, bound, "%u partitions rf %u, %zu -> %zu nodes: %.3f", parts, rf, n, n + 1,
                                  frac);
                    cr_expect_gt(drey_placement__slots_of(after, parts, rj, (uint32_t)n), 0);
                }
                free(before);
                free(after);
            }
}

/* A leave moves at most twice the leaving node's slots while each node has
 * 16 or more partitions (rf 2: or those and 2% of the slots, as a join). Below that the caps' rounding reshuffles more (see
 * the bench's leave column), which is why P should be >= 16 x nodes. */
Test(assign, a_leave_moves_at_most_twice_the_minimum_with_enough_partitions) {
    const char *left[MAX_NODES];
    size_t sizes[200];
    for (uint32_t rf = 1; rf <= 2; rf++)
        for (uint32_t parts = 256; parts <= 4096; parts *= 16)
            for (size_t i = 0, k = sizes_of(parts, sizes); i < k; i++) {
                size_t n = sizes[i];
                if (n < 3 || parts / n < 16)
                    continue;
                size_t gone = n / 2, m = 0;
                for (size_t j = 0; j < n; j++)
                    if (j != gone)
                        left[m++] = ids[j];
                uint32_t r = drey_placement_replicas(rf, n), rl = drey_placement_replicas(rf, m);
                uint32_t *before = assigned(ids, n, parts, rf), *after = assigned(left, m, parts, rf);
                size_t moved = drey_placement__moved(ids, before, r, left, after, rl, parts);
                size_t minimum = drey_placement__slots_of(before, parts, r, (uint32_t)gone);
                size_t bound = 2 * minimum;
                if (rl > 1 && bound < minimum + (size_t)parts * rl / 50)
                    bound = minimum + (size_t)parts * rl / 50;
                cr_expect_leq(moved, bound, "%u partitions rf %u, %zu -> %zu nodes: %zu moved, minimum %zu",
                              parts, rf, n, m, moved, minimum);
                free(before);
                free(after);
            }
}
