/*
 * The persisted form of a failed write's outcome (see commit.c for the whole
 * outcome entry). Outcomes live in the store, so they go into snapshots and
 * must still be read by every later binary: the error is kept as its stable
 * reason, and the older form that kept the drey_error ordinal is still read
 * through a frozen table of what those ordinals meant.
 */
#ifndef DREY_COMMIT_OUTCOME_H
#define DREY_COMMIT_OUTCOME_H

#include <stddef.h>
#include <stdint.h>

#include "drey/arena.h"
#include "drey/status.h"

/* The byte after the fingerprint says what follows. */
enum {
    DREY_COMMIT__FAILED_V0 = 0, /* u16 drey_error ordinal (little-endian), metadata; written up to 2026-12 */
    DREY_COMMIT__SUCCEEDED = 1, /* the serialized response */
    DREY_COMMIT__FAILED = 2,    /* u8 len, reason, metadata */
};

/* Bytes drey_commit__failure_put writes for st, the marker included. */
size_t drey_commit__failure_bytes(const drey_status *st);
/* Writes st's failure (marker, reason, metadata) at p; returns the end. */
uint8_t *drey_commit__failure_put(const drey_status *st, uint8_t *p);
/* Sets st from a failure written at p[0..len) (p at the marker), either
 * form. What cannot be decoded is INTERNAL, never another error: an unknown
 * reason or ordinal is named in the metadata (storedReason, storedError). */
void drey_commit__failure_get(const uint8_t *p, size_t len, drey_arena *a, drey_status *st);

/* The reason ordinal `e` meant in the FAILED_V0 form; NULL for none. */
const char *drey_commit__v0_reason(unsigned e);

#endif
