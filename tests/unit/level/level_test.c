/*
 * Unit tests for src/level/level.c: the names are part of the readiness
 * JSON and the metrics' label values, so they are pinned here.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>

#include "drey/level.h"

Test(level, names_are_pinned) {
    cr_assert(eq(str, (char *)drey_level_name(DREY_LEVEL_NORMAL), "normal"));
    cr_assert(eq(str, (char *)drey_level_name(DREY_LEVEL_HIGH), "high"));
    cr_assert(eq(str, (char *)drey_level_name(DREY_LEVEL_CRITICAL), "critical"));
    for (int i = 0; i < DREY_LEVEL_COUNT; i++)
        cr_assert(eq(str, (char *)drey_level_names[i], (char *)drey_level_name((drey_level)i)));
}

Test(level, out_of_range_is_a_question_mark) {
    cr_assert(eq(str, (char *)drey_level_name((drey_level)DREY_LEVEL_COUNT), "?"));
    cr_assert(eq(str, (char *)drey_level_name((drey_level)-1), "?"));
}
