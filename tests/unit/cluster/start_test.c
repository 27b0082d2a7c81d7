/*
 * Unit tests for the pause between a starting node's attempts to reach
 * etcd (src/cluster/cluster.c).
 */
#include <criterion/criterion.h>

#include "drey/cluster.h"

Test(start, the_pause_doubles_from_a_quarter_second_up_to_ten) {
    const int64_t middle[] = {250, 500, 1000, 2000, 4000, 8000, 10000, 10000};
    for (unsigned a = 1; a <= 8; a++)
        cr_assert_eq(drey_cluster_start_backoff_ms(a, 0.5), middle[a - 1], "attempt %u", a);
    cr_assert_eq(drey_cluster_start_backoff_ms(1000, 0.5), 10000, "capped, however long it waits");
    cr_assert_eq(drey_cluster_start_backoff_ms(0xffffffffu, 0.5), 10000, "no overflow");
}

Test(start, the_jitter_spreads_it_a_quarter_either_way) {
    cr_assert_eq(drey_cluster_start_backoff_ms(3, 0.0), 750);
    cr_assert_eq(drey_cluster_start_backoff_ms(3, 0.999999), 1249);
    cr_assert_eq(drey_cluster_start_backoff_ms(20, 0.0), 7500);
    cr_assert_leq(drey_cluster_start_backoff_ms(20, 0.999999), 12500);
}
