/*
 * measure — what a placement costs: the fullest node against the mean, and
 * how many replica slots change hands between two assignments. Used by the
 * unit tests and tests/bench/placement.c; the controller will use the move
 * count to report a plan's size.
 */
#ifndef DREY_PLACEMENT_MEASURE_H
#define DREY_PLACEMENT_MEASURE_H

#include <stddef.h>
#include <stdint.h>

/* The fullest node's replica slots (primaries_only: its primaries) divided by
 * the mean over n_nodes. assign is drey_placement_assign's output. */
double drey_placement__max_over_mean(const uint32_t *assign, size_t n_nodes, uint32_t n_partitions, uint32_t r,
                                     int primaries_only);

/* Replica slots of the new assignment held by a node that did not hold that
 * partition in the old one (a node id absent from old_ids counts as new).
 * r_old and r_new are the replica counts of each. */
size_t drey_placement__moved(const char *const *old_ids, const uint32_t *old_assign, uint32_t r_old,
                             const char *const *new_ids, const uint32_t *new_assign, uint32_t r_new,
                             uint32_t n_partitions);

/* Replica slots the node at index node holds. */
size_t drey_placement__slots_of(const uint32_t *assign, uint32_t n_partitions, uint32_t r, uint32_t node);

#endif
