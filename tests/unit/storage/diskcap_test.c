/*
 * Unit tests for src/storage/diskcap.c: the journal disk cap derived from
 * the file system when --journal-max-bytes is not given, and whether the
 * next snapshot fits. Pure functions of the file system's size and free
 * space, the journal's bytes and the snapshot estimate, so every figure is
 * checked exactly; the behaviour on a real small file system is
 * tests/integration/python/test_diskcap.py.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <inttypes.h>
#include <stdint.h>

#include "drey/storage.h"
#include "src/storage/storage_internal.h"

#define MIB ((uint64_t)1 << 20)
#define GIB ((uint64_t)1 << 30)

static uint64_t cap_of(uint64_t fs, uint64_t avail, uint64_t journal, uint64_t snapshot) {
    drey_storage__disk d = {.fs_bytes = fs, .avail_bytes = avail, .journal_bytes = journal, .snapshot_bytes = snapshot};
    return drey_storage__derive_cap(&d);
}

static drey_storage_snapshot_room room_of(uint64_t fs, uint64_t avail, uint64_t journal, uint64_t snapshot,
                                          uint64_t cap) {
    drey_storage__disk d = {.fs_bytes = fs, .avail_bytes = avail, .journal_bytes = journal, .snapshot_bytes = snapshot};
    return drey_storage__snapshot_fits(&d, cap);
}

Test(diskcap, the_reserve_is_five_percent_of_the_file_system_between_one_mib_and_one_gib) {
    cr_assert(eq(u64, drey_storage__reserve_bytes(0), MIB));
    cr_assert(eq(u64, drey_storage__reserve_bytes(512 * 1024), MIB), "more than a tiny file system holds");
    cr_assert(eq(u64, drey_storage__reserve_bytes(20 * MIB), MIB));
    cr_assert(eq(u64, drey_storage__reserve_bytes(20 * MIB + 20), MIB + 1));
    cr_assert(eq(u64, drey_storage__reserve_bytes(24 * MIB), 24 * MIB / 20));
    cr_assert(eq(u64, drey_storage__reserve_bytes(4 * GIB), 4 * GIB / 20));
    cr_assert(eq(u64, drey_storage__reserve_bytes(20 * GIB), GIB));
    cr_assert(eq(u64, drey_storage__reserve_bytes(100000 * GIB), GIB));
}

Test(diskcap, the_journal_may_grow_by_half_of_what_is_left_after_the_reserve_and_the_snapshot) {
    /* A 24 MiB tmpfs with one 1 MiB segment and a 2 MiB snapshot estimate. */
    uint64_t fs = 24 * MIB;
    const uint64_t reserve = 24 * MIB / 20;
    cr_assert(eq(u64, cap_of(fs, 23 * MIB, MIB, 2 * MIB), MIB + (23 * MIB - reserve - 2 * MIB) / 2));
    /* A fresh node on a large disk: the snapshot is a header and a trailer. */
    fs = 100 * GIB;
    cr_assert(eq(u64, cap_of(fs, fs - 64 * MIB, 64 * MIB, 96), 64 * MIB + (fs - 64 * MIB - GIB - 96) / 2));
    /* An odd spare rounds down: never a byte more than the rule allows
     * (the spare is even with 23 MiB + 1 available: 24 MiB / 20 is odd). */
    uint64_t even = cap_of(24 * MIB, 23 * MIB + 1, MIB, 2 * MIB);
    cr_assert(eq(u64, (23 * MIB + 1 - reserve - 2 * MIB) % 2, 0));
    cr_assert(eq(u64, cap_of(24 * MIB, 23 * MIB + 2, MIB, 2 * MIB), even));
    cr_assert(eq(u64, cap_of(24 * MIB, 23 * MIB + 3, MIB, 2 * MIB), even + 1));
}

Test(diskcap, without_room_the_journal_keeps_what_it_has_and_the_cap_is_never_none) {
    uint64_t fs = 24 * MIB, reserve = 24 * MIB / 20;
    /* Exactly the reserve and the snapshot are free: no growth. */
    cr_assert(eq(u64, cap_of(fs, reserve + 2 * MIB, 3 * MIB, 2 * MIB), 3 * MIB));
    cr_assert(eq(u64, cap_of(fs, reserve + 2 * MIB + 1, 3 * MIB, 2 * MIB), 3 * MIB), "half a byte is none");
    /* Less than that, down to a full disk: still no growth, never less than
     * what the journal already holds (shrinking it is compaction's job). */
    cr_assert(eq(u64, cap_of(fs, reserve, 3 * MIB, 2 * MIB), 3 * MIB));
    cr_assert(eq(u64, cap_of(fs, 0, 3 * MIB, 2 * MIB), 3 * MIB));
    cr_assert(eq(u64, cap_of(fs, 0, 0, 2 * MIB), 1), "0 would mean no cap at all");
    cr_assert(eq(u64, cap_of(0, 0, 0, 0), 1));
}

Test(diskcap, the_cap_follows_the_volume_as_it_grows_or_other_writers_take_space) {
    uint64_t base = cap_of(48 * MIB, 40 * MIB, 4 * MIB, 4 * MIB);
    /* The volume grown: half the new space goes to the journal (the reserve
     * grows with the file system too). */
    uint64_t grown = cap_of(96 * MIB, 88 * MIB, 4 * MIB, 4 * MIB);
    cr_assert(eq(u64, grown, 4 * MIB + (88 * MIB - 96 * MIB / 20 - 4 * MIB) / 2));
    cr_assert(gt(u64, grown, base + 20 * MIB));
    /* Another writer took 10 MiB: the cap gives up 5 MiB. */
    cr_assert(eq(u64, cap_of(48 * MIB, 30 * MIB, 4 * MIB, 4 * MIB), base - 5 * MIB));
    /* A larger snapshot estimate takes half of itself from the journal. */
    cr_assert(eq(u64, cap_of(48 * MIB, 40 * MIB, 4 * MIB, 8 * MIB), base - 2 * MIB));
}

/* xorshift64*: the same numbers on every run. */
static uint64_t next(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

/* The two properties the rule is for, over many file systems: at the cap,
 * with the snapshot grown by as much as the journal, the reserve is still
 * free (the journal never takes the snapshot's room); and re-deriving once
 * the journal and the store have grown together gives the same cap (it does
 * not creep up while the node writes). */
Test(diskcap, at_the_cap_the_grown_snapshot_and_the_reserve_still_fit_and_the_cap_is_a_fixed_point) {
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 100000; i++) {
        uint64_t fs = MIB + next(&seed) % (64 * GIB);
        uint64_t avail = next(&seed) % (fs + 1);
        uint64_t journal = next(&seed) % (fs - avail + 1);
        uint64_t snapshot = 96 + next(&seed) % (fs / 2 + 1);
        uint64_t reserve = drey_storage__reserve_bytes(fs);
        uint64_t cap = cap_of(fs, avail, journal, snapshot);
        cr_assert(ge(u64, cap, journal));
        uint64_t growth = cap - journal;
        if (avail < reserve + snapshot) {
            cr_assert(eq(u64, growth, 0), "no room, yet the journal may grow (case %d)", i);
            continue;
        }
        cr_assert(ge(u64, avail - growth, reserve + snapshot + growth),
                  "case %d: at the cap the grown snapshot does not fit: fs %" PRIu64 " avail %" PRIu64, i, fs, avail);
        uint64_t x = growth == 0 ? 0 : next(&seed) % (growth + 1);
        cr_assert(eq(u64, cap_of(fs, avail - x, journal + x, snapshot + x), cap), "case %d: not a fixed point", i);
        cr_assert(eq(int, room_of(fs, avail, journal, snapshot, cap), DREY_STORAGE_SNAPSHOT_OK),
                  "case %d: a derived cap with room leaves the snapshot short", i);
    }
}

Test(diskcap, the_next_snapshot_is_short_when_it_does_not_fit_now_and_low_when_the_journal_may_take_its_room) {
    uint64_t fs = 24 * MIB, reserve = 24 * MIB / 20;
    /* Does not fit now, whatever the cap. */
    cr_assert(eq(int, room_of(fs, 2 * MIB - 1, MIB, 2 * MIB, 0), DREY_STORAGE_SNAPSHOT_SHORT));
    cr_assert(eq(int, room_of(fs, 2 * MIB - 1, MIB, 2 * MIB, MIB), DREY_STORAGE_SNAPSHOT_SHORT));
    /* Fits, but not with the reserve kept: low. */
    cr_assert(eq(int, room_of(fs, 2 * MIB, MIB, 2 * MIB, MIB), DREY_STORAGE_SNAPSHOT_LOW));
    cr_assert(eq(int, room_of(fs, 2 * MIB + reserve - 1, MIB, 2 * MIB, MIB), DREY_STORAGE_SNAPSHOT_LOW));
    /* With the reserve and no growth left (the journal is at its cap). */
    cr_assert(eq(int, room_of(fs, 2 * MIB + reserve, MIB, 2 * MIB, MIB), DREY_STORAGE_SNAPSHOT_OK));
    /* A configured cap the journal may still grow to, with the snapshot
     * growing as much: 4 MiB of growth needs 8 MiB beyond the reserve. */
    cr_assert(eq(int, room_of(fs, 2 * MIB + reserve + 8 * MIB, MIB, 2 * MIB, 5 * MIB), DREY_STORAGE_SNAPSHOT_OK));
    cr_assert(eq(int, room_of(fs, 2 * MIB + reserve + 8 * MIB - 2, MIB, 2 * MIB, 5 * MIB),
                 DREY_STORAGE_SNAPSHOT_LOW));
    /* No cap: as of now. */
    cr_assert(eq(int, room_of(fs, 2 * MIB + reserve, MIB, 2 * MIB, 0), DREY_STORAGE_SNAPSHOT_OK));
    cr_assert(eq(int, room_of(fs, 2 * MIB + reserve - 1, MIB, 2 * MIB, 0), DREY_STORAGE_SNAPSHOT_LOW));
}

Test(diskcap, snapshot_room_names) {
    cr_assert(eq(str, (char *)drey_storage_snapshot_room_name(DREY_STORAGE_SNAPSHOT_UNKNOWN), "unknown"));
    cr_assert(eq(str, (char *)drey_storage_snapshot_room_name(DREY_STORAGE_SNAPSHOT_OK), "ok"));
    cr_assert(eq(str, (char *)drey_storage_snapshot_room_name(DREY_STORAGE_SNAPSHOT_LOW), "low"));
    cr_assert(eq(str, (char *)drey_storage_snapshot_room_name(DREY_STORAGE_SNAPSHOT_SHORT), "short"));
    cr_assert(eq(str, (char *)drey_storage_snapshot_room_name((drey_storage_snapshot_room)42), "?"));
}
