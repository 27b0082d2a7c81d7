/*
 * level — the pressure levels' names; see include/drey/level.h.
 */
#include "drey/level.h"

const char *const drey_level_names[DREY_LEVEL_COUNT] = {"normal", "high", "critical"};

const char *drey_level_name(drey_level l) {
    return (unsigned)l < DREY_LEVEL_COUNT ? drey_level_names[l] : "?";
}
