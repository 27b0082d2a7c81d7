/*
 * level — the three pressure levels that memory and the journal's disk quota
 * both report: normal, high (observability only) and critical (writes that
 * would grow usage are refused). One enum and one name table, so the
 * readiness JSON, the metrics' state labels and the admin API spell a level
 * the same way whatever resource it describes.
 */
#ifndef DREY_LEVEL_H
#define DREY_LEVEL_H

typedef enum drey_level {
    DREY_LEVEL_NORMAL,
    DREY_LEVEL_HIGH,     /* at or past the high-water mark: observability only */
    DREY_LEVEL_CRITICAL, /* at the limit: growing writes are refused */
} drey_level;

#define DREY_LEVEL_COUNT 3

/* "normal", "high", "critical", in enum order (metrics list every state). */
extern const char *const drey_level_names[DREY_LEVEL_COUNT];

/* drey_level_names[l], "?" for a value outside the enum. */
const char *drey_level_name(drey_level l);

#endif
