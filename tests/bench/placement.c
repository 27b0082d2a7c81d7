/*
 * placement — what drey's partition placement costs past this machine,
 * simulated: for 1-200 nodes, 256 or 4096 partitions and RF 1 or 2, the
 * fullest node's share over the mean (bounded-load HRW, which drey uses, and
 * plain HRW for comparison), and the replica slots moved by a join or a leave
 * over the minimum possible. Numbers, not assertions: the bounds are checked
 * by tests/unit/placement.
 *
 *   bazel run -c opt //tests/bench:placement [-- --all]
 *
 * Nodes are "drey-0" .. "drey-<n-1>"; a join adds "drey-<n>", a leave removes
 * "drey-<n/2>". The minimum a join must move is the new node's fair share,
 * P x r / (n + 1); a leave, the slots the leaving node held.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/placement.h"
#include "src/placement/measure.h"

#define MAX_NODES 200

static char names[MAX_NODES + 1][16];

static void row(uint32_t parts, uint32_t rf, size_t n) {
    const char *ids[MAX_NODES + 1], *left[MAX_NODES];
    for (size_t i = 0; i <= n; i++)
        ids[i] = names[i];
    uint32_t r = drey_placement_replicas(rf, n), r_join = drey_placement_replicas(rf, n + 1);
    uint32_t *base = malloc(sizeof(uint32_t) * parts * r);
    uint32_t *plain = malloc(sizeof(uint32_t) * parts * r);
    uint32_t *join = malloc(sizeof(uint32_t) * parts * r_join);
    uint32_t *after_leave = malloc(sizeof(uint32_t) * parts * r);
    if (base == NULL || plain == NULL || join == NULL || after_leave == NULL)
        abort();
    drey_placement_assign(ids, n, parts, rf, base);
    drey_placement_assign_unbounded(ids, n, parts, rf, plain);
    drey_placement_assign(ids, n + 1, parts, rf, join);
    double load = drey_placement__max_over_mean(base, n, parts, r, 0);
    double primaries = drey_placement__max_over_mean(base, n, parts, r, 1);
    double plain_load = drey_placement__max_over_mean(plain, n, parts, r, 0);
    size_t moved_join = drey_placement__moved(ids, base, r, ids, join, r_join, parts);
    double min_join = (double)parts * r_join / (double)(n + 1);
    /* The new node's fair share; when RF grows with the join (n < rf) the
     * new slots are that share too. */
    double join_ratio = (double)moved_join / min_join;
    char leave_col[32] = "-";
    if (n >= 2) {
        size_t gone = n / 2, m = 0;
        for (size_t i = 0; i < n; i++)
            if (i != gone)
                left[m++] = ids[i];
        uint32_t r_left = drey_placement_replicas(rf, m);
        drey_placement_assign(left, m, parts, rf, after_leave);
        size_t moved = drey_placement__moved(ids, base, r, left, after_leave, r_left, parts);
        size_t minimum = drey_placement__slots_of(base, parts, r, (uint32_t)gone) - (size_t)parts * (r - r_left);
        snprintf(leave_col, sizeof leave_col, "%.2f", minimum > 0 ? (double)moved / (double)minimum : 0.0);
    }
    printf("%5zu %6u %3u %10.3f %11.3f %10.3f %10.2f %9.3f %9.3f %10s\n", n, parts, rf, load, primaries, plain_load,
           join_ratio, (double)moved_join / ((double)parts * r_join), 1.0 / (n + 1) + 0.12, leave_col);
    free(base);
    free(plain);
    free(join);
    free(after_leave);
}

int main(int argc, char **argv) {
    int all = argc > 1 && strcmp(argv[1], "--all") == 0;
    static const size_t some[] = {1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96, 128, 160, 199};
    for (size_t i = 0; i <= MAX_NODES; i++)
        snprintf(names[i], sizeof names[i], "drey-%zu", i);
    printf("nodes  parts  rf  max/mean  prim/mean  plain-HRW  join÷min  join-frac  bound  leave÷min\n");
    for (uint32_t rf = 1; rf <= 2; rf++) {
        for (uint32_t parts = 256; parts <= 4096; parts *= 16) {
            if (all) {
                for (size_t n = 1; n < MAX_NODES; n++)
                    row(parts, rf, n);
            } else {
                for (size_t i = 0; i < sizeof some / sizeof some[0]; i++)
                    row(parts, rf, some[i]);
            }
        }
    }
    return 0;
}
