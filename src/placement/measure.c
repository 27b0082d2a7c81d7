/*
 * measure — load and movement figures of assignments; see measure.h.
 */
#include "measure.h"

#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"

double drey_placement__max_over_mean(const uint32_t *assign, size_t n_nodes, uint32_t n_partitions, uint32_t r,
                                     int primaries_only) {
    if (n_nodes == 0 || r == 0 || n_partitions == 0)
        return 0;
    size_t *load = drey_xcalloc(n_nodes, sizeof *load);
    uint32_t per = primaries_only ? 1 : r;
    for (uint32_t p = 0; p < n_partitions; p++)
        for (uint32_t k = 0; k < per; k++)
            load[assign[(size_t)p * r + k]]++;
    size_t max = 0;
    for (size_t i = 0; i < n_nodes; i++)
        if (load[i] > max)
            max = load[i];
    free(load);
    double mean = (double)n_partitions * per / (double)n_nodes;
    return (double)max / mean;
}

size_t drey_placement__moved(const char *const *old_ids, const uint32_t *old_assign, uint32_t r_old,
                             const char *const *new_ids, const uint32_t *new_assign, uint32_t r_new,
                             uint32_t n_partitions) {
    size_t moved = 0;
    for (uint32_t p = 0; p < n_partitions; p++) {
        for (uint32_t k = 0; k < r_new; k++) {
            const char *id = new_ids[new_assign[(size_t)p * r_new + k]];
            int held = 0;
            for (uint32_t j = 0; j < r_old && !held; j++)
                held = strcmp(old_ids[old_assign[(size_t)p * r_old + j]], id) == 0;
            moved += !held;
        }
    }
    return moved;
}

size_t drey_placement__slots_of(const uint32_t *assign, uint32_t n_partitions, uint32_t r, uint32_t node) {
    size_t n = 0;
    for (size_t i = 0; i < (size_t)n_partitions * r; i++)
        n += assign[i] == node;
    return n;
}
