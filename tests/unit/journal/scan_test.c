/*
 * Unit tests for src/journal/scan.c: reading the journal back.
 *
 * Segments are made by hand on the fault file system, so each test places
 * exactly the damage it is about: a clean end, a torn last batch (cut at
 * start), damage to data that was durable (refuses, naming file and offset),
 * bad headers, missing segments, and what repair keeps and drops.
 */
#include "tests/unit/journal/journal_util.h"

static drey_io_fault *fs;
static drey_io *io;

static void setup(void) {
    fs = drey_io_fault_create();
    io = drey_io_fault_io(fs);
}

static void teardown(void) {
    drey_io_fault_destroy(fs);
}

TestSuite(scan, .init = setup, .fini = teardown);

static void scan(uint64_t after, replayed *r, drey_journal_scan *s) {
    int rc = drey_journal_scan_dir(io, JDIR, after, r != NULL ? collect : NULL, r, s);
    cr_assert_eq(rc, 0, "scan: %d", rc);
}

static void expect_replayed(const replayed *r, uint64_t first, uint64_t last) {
    cr_assert_eq(r->n, last >= first ? last - first + 1 : 0, "replayed %zu records, expected %" PRIu64 "..%" PRIu64,
                 r->n, first, last);
    for (size_t i = 0; i < r->n; i++) {
        cr_assert_eq(r->lsn[i], first + i);
        char want[64];
        default_payload(want, sizeof want, first + i);
        cr_assert_str_eq(r->payload[i], want);
        cr_assert_eq(r->time_ms[i], 1000 + (int64_t)(first + i));
    }
}

Test(scan, no_journal_directory_is_empty) {
    drey_journal_scan s;
    scan(0, NULL, &s);
    cr_assert_eq(s.problem, DREY_JOURNAL_OK);
    cr_assert_eq(s.n_segments, 0);
    cr_assert_eq(s.last_lsn, 0);
    drey_journal_scan_free(&s);
}

Test(scan, clean_journal_replays_everything_in_order) {
    hframe f[64];
    make_segment(io, 1, SEG_BYTES, f, seq_frames(f, 1, 20, 0), NULL);
    make_segment(io, 21, SEG_BYTES, f, seq_frames(f, 21, 35, 0), NULL);
    make_segment(io, 36, SEG_BYTES, f, seq_frames(f, 36, 36, 0), NULL);
    replayed r = {0};
    drey_journal_scan s;
    scan(0, &r, &s);
    cr_assert_eq(s.problem, DREY_JOURNAL_OK, "%s", s.message);
    cr_assert_eq(s.n_segments, 3);
    cr_assert_eq(s.last_lsn, 36);
    cr_assert_eq(s.last_time_ms, 1036);
    cr_assert_eq(s.segments[0].first_lsn, 1);
    cr_assert_eq(s.segments[0].last_lsn, 20);
    cr_assert_eq(s.segments[0].records, 20);
    cr_assert_eq(s.segments[1].last_lsn, 35);
    cr_assert_eq(s.segments[2].records, 1);
    cr_assert_eq(s.segments[0].file_bytes, SEG_BYTES);
    for (size_t i = 0; i < 3; i++)
        cr_assert_eq(s.segments[i].problem, DREY_JOURNAL_OK);
    expect_replayed(&r, 1, 36);
    replayed_free(&r);
    drey_journal_scan_free(&s);
}

Test(scan, replay_gets_exactly_the_records_after_after_lsn) {
    hframe f[64];
    make_segment(io, 1, SEG_BYTES, f, seq_frames(f, 1, 20, 0), NULL);
    make_segment(io, 21, SEG_BYTES, f, seq_frames(f, 21, 30, 0), NULL);
    uint64_t afters[] = {0, 1, 19, 20, 21, 29, 30};
    for (size_t i = 0; i < sizeof afters / sizeof *afters; i++) {
        replayed r = {0};
        drey_journal_scan s;
        scan(afters[i], &r, &s);
        cr_assert_eq(s.problem, DREY_JOURNAL_OK, "after %" PRIu64 ": %s", afters[i], s.message);
        cr_assert_eq(s.last_lsn, 30);
        expect_replayed(&r, afters[i] + 1, 30);
        replayed_free(&r);
        drey_journal_scan_free(&s);
    }
}

Test(scan, replay_error_stops_the_scan) {
    hframe f[64];
    make_segment(io, 1, SEG_BYTES, f, seq_frames(f, 1, 10, 0), NULL);
    replayed r = {.stop_at = 4};
    drey_journal_scan s;
    cr_assert_eq(drey_journal_scan_dir(io, JDIR, 0, collect, &r, &s), 5);
    cr_assert_eq(r.n, 3);
    replayed_free(&r);
    drey_journal_scan_free(&s);
}

Test(scan, strangers_and_temporaries_are_ignored) {
    hframe f[8];
    make_segment(io, 1, SEG_BYTES, f, seq_frames(f, 1, 3, 0), NULL);
    int fd = io->ops->open(io, JDIR "/journal/0000000000000004.seg.tmp", O_RDWR | O_CREAT, 0644);
    cr_assert_eq(drey_io_pwrite_all(io, fd, "garbage", 7, 0), 0);
    io->ops->close(io, fd);
    fd = io->ops->open(io, JDIR "/journal/README", O_RDWR | O_CREAT, 0644);
    io->ops->close(io, fd);
    fd = io->ops->open(io, JDIR "/journal/000000000000000G.seg", O_RDWR | O_CREAT, 0644);
    io->ops->close(io, fd);
    drey_journal_scan s;
    scan(0, NULL, &s);
    cr_assert_eq(s.problem, DREY_JOURNAL_OK, "%s", s.message);
    cr_assert_eq(s.n_segments, 1);
    cr_assert_eq(s.last_lsn, 3);
    drey_journal_scan_free(&s);
}

/* A tail zeroed after the last frame (a cut tail, or preallocation) is the
 * clean end, in the last segment and before a later one alike. */
Test(scan, zeroed_tail_is_clean) {
    hframe f[64];
    uint64_t end = make_segment(io, 1, SEG_BYTES, f, seq_frames(f, 1, 5, 0), NULL);
    make_segment(io, 6, SEG_BYTES, f, seq_frames(f, 6, 8, 0), NULL);
    drey_journal_scan s;
    scan(0, NULL, &s);
    cr_assert_eq(s.problem, DREY_JOURNAL_OK, "%s", s.message);
    cr_assert_eq(s.segments[0].data_end, end);
    cr_assert_eq(s.last_lsn, 8);
    drey_journal_scan_free(&s);
}

/* A segment with a header and nothing else (rotation just happened). */
Test(scan, empty_last_segment_is_clean) {
    hframe f[8];
    make_segment(io, 1, SEG_BYTES, f, seq_frames(f, 1, 4, 0), NULL);
    make_segment(io, 5, SEG_BYTES, f, 0, NULL);
    drey_journal_scan s;
    scan(0, NULL, &s);
    cr_assert_eq(s.problem, DREY_JOURNAL_OK, "%s", s.message);
    cr_assert_eq(s.n_segments, 2);
    cr_assert_eq(s.segments[1].records, 0);
    cr_assert_eq(s.segments[1].last_lsn, 4);
    cr_assert_eq(s.segments[1].data_end, DREY_SEGMENT_HEADER);
    drey_journal_scan_free(&s);
}

/* --- torn tails ----------------------------------------------------------- */

/* Batches 1, 2..4 durable; batch 5..8 written as frames whose middle one is
 * damaged while a later frame of the same batch survived intact. */
static void torn_case(void (*damage)(uint64_t off, uint64_t size), uint64_t expect_last) {
    hframe f[16];
    size_t n = 0;
    f[n++] = (hframe){.lsn = 1, .batch = 1, .time_ms = 1001};
    for (uint64_t l = 2; l <= 4; l++)
        f[n++] = (hframe){.lsn = l, .batch = 2, .time_ms = 1000 + (int64_t)l};
    for (uint64_t l = 5; l <= 8; l++)
        f[n++] = (hframe){.lsn = l, .batch = 5, .time_ms = 1000 + (int64_t)l};
    uint64_t offs[16];
    make_segment(io, 1, SEG_BYTES, f, n, offs);
    damage(offs[5], offs[6] - offs[5]); /* frame lsn 6 */
    replayed r = {0};
    drey_journal_scan s;
    scan(0, &r, &s);
    cr_assert_eq(s.problem, DREY_JOURNAL_TORN_TAIL, "problem %d: %s", s.problem, s.message);
    cr_assert_eq(s.last_lsn, expect_last);
    cr_assert_eq(s.segments[0].problem_offset, offs[5]);
    cr_assert_eq(s.segments[0].data_end, offs[5]);
    cr_assert_eq(s.segments[0].dirty_end, offs[7] + 40 + 5); /* the last non-zero byte of lsn 8 */
    expect_replayed(&r, 1, expect_last);
    replayed_free(&r);
    drey_journal_scan_free(&s);
}

static char path1[128];

static void damage_flip(uint64_t off, uint64_t size) {
    flip_bit(io, path1, off + size - 9, 3);
}

static void damage_zero_header(uint64_t off, uint64_t size) {
    (void)size;
    uint8_t z[40] = {0};
    poke(io, path1, off, z, sizeof z);
}

static void damage_zero_payload(uint64_t off, uint64_t size) {
    uint8_t z[64] = {0};
    poke(io, path1, off + 40, z, size - 40);
}

static void damage_garbage_length(uint64_t off, uint64_t size) {
    (void)size;
    uint8_t l[4] = {0xff, 0xff, 0x00, 0x10};
    poke(io, path1, off, l, sizeof l);
}

Test(scan, torn_last_batch_with_an_intact_later_frame_of_the_same_batch) {
    seg_path(path1, sizeof path1, 1);
    torn_case(damage_flip, 5);
}

Test(scan, torn_last_batch_zeroed_header) {
    seg_path(path1, sizeof path1, 1);
    torn_case(damage_zero_header, 5);
}

Test(scan, torn_last_batch_zeroed_payload) {
    seg_path(path1, sizeof path1, 1);
    torn_case(damage_zero_payload, 5);
}

Test(scan, torn_last_batch_garbage_length) {
    seg_path(path1, sizeof path1, 1);
    torn_case(damage_garbage_length, 5);
}

/* A file cut short in the middle of its last frame (a torn extension). */
Test(scan, truncated_last_frame_is_a_torn_tail) {
    hframe f[8];
    uint64_t offs[8];
    uint64_t end = make_segment(io, 1, 4096, f, seq_frames(f, 1, 6, 0), offs);
    char p[128];
    seg_path(p, sizeof p, 1);
    for (uint64_t cut = offs[5] + 1; cut < end; cut += 5) {
        int fd = io->ops->open(io, p, O_RDWR, 0);
        cr_assert_eq(io->ops->ftruncate(io, fd, (off_t)cut), 0);
        io->ops->close(io, fd);
        drey_journal_scan s;
        scan(0, NULL, &s);
        cr_assert_eq(s.problem, DREY_JOURNAL_TORN_TAIL, "cut at %" PRIu64 ": %s", cut, s.message);
        cr_assert_eq(s.last_lsn, 5);
        cr_assert_eq(s.segments[0].problem_offset, offs[5]);
        drey_journal_scan_free(&s);
        make_segment(io, 1, 4096, f, 6, NULL);
    }
}

/* A crash tears the last, unsynced batch at random sectors: whatever
 * survives, the scan sees a clean journal or a torn tail, never damage, and
 * what it keeps is a prefix that holds every synced record. */
Test(scan, torn_crash_of_the_last_batch_at_many_seeds) {
    char p[128];
    seg_path(p, sizeof p, 1);
    for (uint32_t seed = 1; seed <= 300; seed++) {
        drey_io_fault_destroy(fs);
        fs = drey_io_fault_create();
        io = drey_io_fault_io(fs);
        hframe f[64];
        uint64_t synced_end = make_segment(io, 1, SEG_BYTES, f, seq_frames(f, 1, 7, 0), NULL);
        /* The last batch: 20 frames of ~100 bytes (several sectors), written
         * with one pwrite and never synced. */
        uint8_t batch[8192];
        size_t pos = 0;
        char payload[128];
        for (uint64_t l = 8; l < 28; l++) {
            snprintf(payload, sizeof payload, "rec-%" PRIu64 "-%080d", l, 0);
            drey_frame fr = {.lsn = l, .batch_lsn = 8, .time_ms = 2000, .length = (uint32_t)strlen(payload)};
            drey_frame_encode(&fr, (const uint8_t *)payload, batch + pos);
            pos += drey_frame_size(fr.length);
        }
        int fd = io->ops->open(io, p, O_RDWR, 0);
        cr_assert_eq(drey_io_pwrite_all(io, fd, batch, pos, (off_t)synced_end), 0);
        io->ops->close(io, fd);
        drey_io_fault_crash(fs, true, seed);

        replayed r = {0};
        drey_journal_scan s;
        scan(0, &r, &s);
        cr_assert(s.problem == DREY_JOURNAL_OK || s.problem == DREY_JOURNAL_TORN_TAIL, "seed %u: %s", seed,
                  s.message);
        cr_assert_geq(s.last_lsn, 7, "seed %u", seed);
        cr_assert_leq(s.last_lsn, 27, "seed %u", seed);
        cr_assert_eq(r.n, s.last_lsn, "seed %u", seed);
        for (size_t i = 0; i < r.n; i++)
            cr_assert_eq(r.lsn[i], i + 1);
        replayed_free(&r);
        drey_journal_scan_free(&s);
    }
}

/* --- damage to durable data ----------------------------------------------- */

/* Damage followed by an intact frame of a later batch: the damaged frame
 * was durable before that batch was written, so this is not a crash. */
Test(scan, damage_before_a_later_batch_is_bad_frame_with_file_and_offset) {
    hframe f[16];
    size_t n = 0;
    for (uint64_t l = 1; l <= 3; l++)
        f[n++] = (hframe){.lsn = l, .batch = 1, .time_ms = 1000 + (int64_t)l};
    for (uint64_t l = 4; l <= 6; l++)
        f[n++] = (hframe){.lsn = l, .batch = 4, .time_ms = 1000 + (int64_t)l};
    f[n++] = (hframe){.lsn = 7, .batch = 7, .time_ms = 1007};
    uint64_t offs[16];
    make_segment(io, 1, SEG_BYTES, f, n, offs);
    char p[128];
    seg_path(p, sizeof p, 1);
    flip_bit(io, p, offs[4] + 41, 0); /* payload of lsn 5, batch 4; lsn 7 follows */
    replayed r = {0};
    drey_journal_scan s;
    scan(0, &r, &s);
    cr_assert_eq(s.problem, DREY_JOURNAL_BAD_FRAME, "%d: %s", s.problem, s.message);
    cr_assert_eq(s.problem_segment, 0);
    cr_assert_eq(s.segments[0].problem_offset, offs[4]);
    cr_assert_eq(s.last_lsn, 4);
    char want[256];
    snprintf(want, sizeof want, "%s at offset %" PRIu64, p, offs[4]);
    cr_assert(strstr(s.message, want) != NULL, "message \"%s\" lacks \"%s\"", s.message, want);
    /* Replay stops at the damage too. */
    expect_replayed(&r, 1, 4);
    replayed_free(&r);
    drey_journal_scan_free(&s);
}

Test(scan, every_single_bit_flip_in_a_durable_batch_is_caught) {
    hframe f[16];
    size_t n = 0;
    f[n++] = (hframe){.lsn = 1, .batch = 1, .time_ms = 1001};
    f[n++] = (hframe){.lsn = 2, .batch = 2, .time_ms = 1002};
    f[n++] = (hframe){.lsn = 3, .batch = 3, .time_ms = 1003};
    uint64_t offs[16];
    uint64_t end = make_segment(io, 1, 4096, f, n, offs);
    char p[128];
    seg_path(p, sizeof p, 1);
    /* Every bit of frames 1 and 2 (the header and the payload; padding is
     * outside the CRC and harmless). */
    for (uint64_t byte = offs[0]; byte < offs[2]; byte++) {
        uint64_t in_frame = byte - (byte < offs[1] ? offs[0] : offs[1]);
        if (in_frame >= 40 + 5)
            continue; /* padding of "rec-N" */
        for (unsigned bit = 0; bit < 8; bit++) {
            flip_bit(io, p, byte, bit);
            drey_journal_scan s;
            scan(0, NULL, &s);
            cr_assert_eq(s.problem, DREY_JOURNAL_BAD_FRAME, "byte %" PRIu64 " bit %u: %d %s", byte, bit, s.problem,
                         s.message);
            cr_assert_lt(s.last_lsn, 3);
            drey_journal_scan_free(&s);
            flip_bit(io, p, byte, bit);
        }
    }
    (void)end;
}

Test(scan, damage_in_a_non_last_segment_is_bad_frame) {
    hframe f[16];
    uint64_t offs[16];
    make_segment(io, 1, SEG_BYTES, f, seq_frames(f, 1, 5, 1), offs); /* one batch */
    make_segment(io, 6, SEG_BYTES, f, seq_frames(f, 6, 8, 0), NULL);
    char p[128];
    seg_path(p, sizeof p, 1);
    flip_bit(io, p, offs[4] + 8, 0); /* the LSN of the last frame of segment 1 */
    drey_journal_scan s;
    scan(0, NULL, &s);
    cr_assert_eq(s.problem, DREY_JOURNAL_BAD_FRAME, "%d: %s", s.problem, s.message);
    cr_assert_eq(s.problem_segment, 0);
    cr_assert_eq(s.last_lsn, 4);
    cr_assert(strstr(s.message, "0000000000000001.seg") != NULL, "%s", s.message);
    /* The later segment is listed, not read. */
    cr_assert_eq(s.n_segments, 2);
    cr_assert_eq(s.segments[1].records, 0);
    drey_journal_scan_free(&s);
}

Test(scan, truncated_non_last_segment_is_bad_frame) {
    hframe f[16];
    uint64_t offs[16];
    make_segment(io, 1, 4096, f, seq_frames(f, 1, 5, 0), offs);
    make_segment(io, 6, 4096, f, seq_frames(f, 6, 8, 0), NULL);
    char p[128];
    seg_path(p, sizeof p, 1);
    int fd = io->ops->open(io, p, O_RDWR, 0);
    cr_assert_eq(io->ops->ftruncate(io, fd, (off_t)offs[4] + 20), 0);
    io->ops->close(io, fd);
    drey_journal_scan s;
    scan(0, NULL, &s);
    cr_assert_eq(s.problem, DREY_JOURNAL_BAD_FRAME, "%d: %s", s.problem, s.message);
    cr_assert_eq(s.last_lsn, 4);
    drey_journal_scan_free(&s);
}

/* An intact frame whose LSN does not follow: a hole in durable data. */
Test(scan, out_of_sequence_frame_is_an_lsn_gap) {
    hframe f[16];
    size_t n = seq_frames(f, 1, 4, 0);
    f[n++] = (hframe){.lsn = 6, .batch = 6, .time_ms = 1006};
    f[n++] = (hframe){.lsn = 7, .batch = 7, .time_ms = 1007};
    uint64_t offs[16];
    make_segment(io, 1, SEG_BYTES, f, n, offs);
    make_segment(io, 8, SEG_BYTES, f, 0, NULL);
    drey_journal_scan s;
    scan(0, NULL, &s);
    cr_assert_eq(s.problem, DREY_JOURNAL_LSN_GAP, "%d: %s", s.problem, s.message);
    cr_assert_eq(s.segments[0].problem_offset, offs[4]);
    cr_assert_eq(s.last_lsn, 4);
    drey_journal_scan_free(&s);
}

/* --- headers and missing segments ----------------------------------------- */

Test(scan, bad_segment_header) {
    hframe f[16];
    make_segment(io, 1, SEG_BYTES, f, seq_frames(f, 1, 5, 0), NULL);
    make_segment(io, 6, SEG_BYTES, f, seq_frames(f, 6, 8, 0), NULL);
    char p[128];
    seg_path(p, sizeof p, 6);
    flip_bit(io, p, 17, 2); /* the header's first LSN */
    replayed r = {0};
    drey_journal_scan s;
    scan(0, &r, &s);
    cr_assert_eq(s.problem, DREY_JOURNAL_BAD_HEADER, "%d: %s", s.problem, s.message);
    cr_assert_eq(s.problem_segment, 1);
    cr_assert_eq(s.last_lsn, 5);
    cr_assert(strstr(s.message, "0000000000000006.seg at offset 0") != NULL, "%s", s.message);
    expect_replayed(&r, 1, 5);
    replayed_free(&r);
    drey_journal_scan_free(&s);
}

Test(scan, header_lsn_disagreeing_with_the_name_is_a_bad_header) {
    hframe f[16];
    make_segment(io, 1, SEG_BYTES, f, seq_frames(f, 1, 5, 0), NULL);
    char from[128], to[128];
    seg_path(from, sizeof from, 1);
    seg_path(to, sizeof to, 2);
    cr_assert_eq(io->ops->rename(io, from, to), 0);
    drey_journal_scan s;
    scan(1, NULL, &s);
    cr_assert_eq(s.problem, DREY_JOURNAL_BAD_HEADER, "%d: %s", s.problem, s.message);
    drey_journal_scan_free(&s);
}

Test(scan, segment_shorter_than_a_header_is_a_bad_header) {
    hframe f[16];
    make_segment(io, 1, SEG_BYTES, f, seq_frames(f, 1, 5, 0), NULL);
    char p[128];
    seg_path(p, sizeof p, 6);
    int fd = io->ops->open(io, p, O_RDWR | O_CREAT, 0644);
    cr_assert_eq(drey_io_pwrite_all(io, fd, "DREYWAL", 8, 0), 0);
    io->ops->close(io, fd);
    drey_journal_scan s;
    scan(0, NULL, &s);
    cr_assert_eq(s.problem, DREY_JOURNAL_BAD_HEADER, "%d: %s", s.problem, s.message);
    cr_assert_eq(s.last_lsn, 5);
    drey_journal_scan_free(&s);
}

Test(scan, missing_middle_segment_is_an_lsn_gap) {
    hframe f[16];
    make_segment(io, 1, SEG_BYTES, f, seq_frames(f, 1, 5, 0), NULL);
    make_segment(io, 6, SEG_BYTES, f, seq_frames(f, 6, 8, 0), NULL);
    make_segment(io, 9, SEG_BYTES, f, seq_frames(f, 9, 12, 0), NULL);
    char p[128];
    seg_path(p, sizeof p, 6);
    cr_assert_eq(io->ops->unlink(io, p), 0);
    replayed r = {0};
    drey_journal_scan s;
    scan(0, &r, &s);
    cr_assert_eq(s.problem, DREY_JOURNAL_LSN_GAP, "%d: %s", s.problem, s.message);
    cr_assert_eq(s.problem_segment, 1);
    cr_assert_eq(s.last_lsn, 5);
    cr_assert(strstr(s.message, "0000000000000009.seg") != NULL, "%s", s.message);
    expect_replayed(&r, 1, 5);
    replayed_free(&r);
    drey_journal_scan_free(&s);
}

Test(scan, journal_starting_after_the_snapshot_is_an_lsn_gap) {
    hframe f[16];
    make_segment(io, 11, SEG_BYTES, f, seq_frames(f, 11, 15, 0), NULL);
    drey_journal_scan s;
    /* A snapshot at 9: record 10 is nowhere. */
    scan(9, NULL, &s);
    cr_assert_eq(s.problem, DREY_JOURNAL_LSN_GAP, "%d: %s", s.problem, s.message);
    cr_assert(strstr(s.message, "000000000000000b.seg at offset 0") != NULL, "%s", s.message);
    drey_journal_scan_free(&s);
    /* At 10: continues it exactly. */
    replayed r = {0};
    scan(10, &r, &s);
    cr_assert_eq(s.problem, DREY_JOURNAL_OK, "%s", s.message);
    expect_replayed(&r, 11, 15);
    replayed_free(&r);
    drey_journal_scan_free(&s);
    /* At 0 (no snapshot): records 1..10 are missing. */
    scan(0, NULL, &s);
    cr_assert_eq(s.problem, DREY_JOURNAL_LSN_GAP);
    drey_journal_scan_free(&s);
}

/* --- repair ---------------------------------------------------------------- */

Test(scan, repair_cuts_at_the_first_problem_and_deletes_later_segments) {
    hframe f[16];
    uint64_t offs[16];
    make_segment(io, 1, SEG_BYTES, f, seq_frames(f, 1, 5, 0), offs);
    make_segment(io, 6, SEG_BYTES, f, seq_frames(f, 6, 8, 0), NULL);
    make_segment(io, 9, SEG_BYTES, f, seq_frames(f, 9, 12, 0), NULL);
    char p1[128], p6[128], p9[128];
    seg_path(p1, sizeof p1, 1);
    seg_path(p6, sizeof p6, 6);
    seg_path(p9, sizeof p9, 9);
    flip_bit(io, p1, offs[2] + 40, 1); /* lsn 3 */
    drey_journal_scan s;
    scan(0, NULL, &s);
    cr_assert_eq(s.problem, DREY_JOURNAL_BAD_FRAME);
    uint64_t dropped = 99;
    cr_assert_eq(drey_journal_repair(io, JDIR, &s, &dropped), 0);
    cr_assert_eq(dropped, 2);
    drey_journal_scan_free(&s);
    cr_assert(file_exists(io, p1));
    cr_assert(!file_exists(io, p6));
    cr_assert(!file_exists(io, p9));
    /* The damaged segment keeps its size, zeros from the cut on. */
    uint8_t *data;
    size_t n;
    cr_assert_eq(drey_io_read_file(io, p1, &data, &n), 0);
    cr_assert_eq(n, SEG_BYTES);
    for (size_t i = offs[2]; i < n; i++)
        cr_assert_eq(data[i], 0, "byte %zu", i);
    free(data);
    replayed r = {0};
    scan(0, &r, &s);
    cr_assert_eq(s.problem, DREY_JOURNAL_OK, "%s", s.message);
    expect_replayed(&r, 1, 2);
    replayed_free(&r);
    drey_journal_scan_free(&s);
    /* Durable: a crash does not bring anything back. */
    drey_io_fault_crash(fs, false, 0);
    scan(0, NULL, &s);
    cr_assert_eq(s.problem, DREY_JOURNAL_OK, "%s", s.message);
    cr_assert_eq(s.n_segments, 1);
    cr_assert_eq(s.last_lsn, 2);
    drey_journal_scan_free(&s);
}

Test(scan, repair_of_a_bad_header_drops_that_segment_and_later_ones) {
    hframe f[16];
    make_segment(io, 1, SEG_BYTES, f, seq_frames(f, 1, 5, 0), NULL);
    make_segment(io, 6, SEG_BYTES, f, seq_frames(f, 6, 8, 0), NULL);
    make_segment(io, 9, SEG_BYTES, f, seq_frames(f, 9, 12, 0), NULL);
    char p6[128];
    seg_path(p6, sizeof p6, 6);
    flip_bit(io, p6, 0, 0);
    drey_journal_scan s;
    scan(0, NULL, &s);
    cr_assert_eq(s.problem, DREY_JOURNAL_BAD_HEADER);
    uint64_t dropped;
    cr_assert_eq(drey_journal_repair(io, JDIR, &s, &dropped), 0);
    cr_assert_eq(dropped, 2);
    drey_journal_scan_free(&s);
    scan(0, NULL, &s);
    cr_assert_eq(s.problem, DREY_JOURNAL_OK);
    cr_assert_eq(s.n_segments, 1);
    cr_assert_eq(s.last_lsn, 5);
    drey_journal_scan_free(&s);
}

Test(scan, repair_of_a_gap_drops_the_segments_after_it) {
    hframe f[16];
    make_segment(io, 1, SEG_BYTES, f, seq_frames(f, 1, 5, 0), NULL);
    make_segment(io, 9, SEG_BYTES, f, seq_frames(f, 9, 12, 0), NULL);
    drey_journal_scan s;
    scan(0, NULL, &s);
    cr_assert_eq(s.problem, DREY_JOURNAL_LSN_GAP);
    uint64_t dropped;
    cr_assert_eq(drey_journal_repair(io, JDIR, &s, &dropped), 0);
    cr_assert_eq(dropped, 1);
    drey_journal_scan_free(&s);
    scan(0, NULL, &s);
    cr_assert_eq(s.problem, DREY_JOURNAL_OK);
    cr_assert_eq(s.last_lsn, 5);
    drey_journal_scan_free(&s);
}

Test(scan, repair_of_a_torn_tail_zeroes_it) {
    hframe f[16];
    uint64_t offs[16];
    make_segment(io, 1, SEG_BYTES, f, seq_frames(f, 1, 6, 4), offs);
    char p[128];
    seg_path(p, sizeof p, 1);
    flip_bit(io, p, offs[4] + 41, 0);
    drey_journal_scan s;
    scan(0, NULL, &s);
    cr_assert_eq(s.problem, DREY_JOURNAL_TORN_TAIL, "%s", s.message);
    uint64_t dropped;
    cr_assert_eq(drey_journal_repair(io, JDIR, &s, &dropped), 0);
    cr_assert_eq(dropped, 0);
    drey_journal_scan_free(&s);
    scan(0, NULL, &s);
    cr_assert_eq(s.problem, DREY_JOURNAL_OK);
    cr_assert_eq(s.last_lsn, 4);
    drey_journal_scan_free(&s);
}

Test(scan, repair_of_an_intact_journal_does_nothing) {
    hframe f[16];
    make_segment(io, 1, SEG_BYTES, f, seq_frames(f, 1, 6, 0), NULL);
    drey_journal_scan s;
    scan(0, NULL, &s);
    uint64_t dropped = 7;
    cr_assert_eq(drey_journal_repair(io, JDIR, &s, &dropped), 0);
    cr_assert_eq(dropped, 0);
    drey_journal_scan_free(&s);
    scan(0, NULL, &s);
    cr_assert_eq(s.last_lsn, 6);
    drey_journal_scan_free(&s);
}

Test(scan, problem_names) {
    cr_assert_str_eq(drey_journal_problem_name(DREY_JOURNAL_OK), "ok");
    cr_assert_str_eq(drey_journal_problem_name(DREY_JOURNAL_TORN_TAIL), "torn tail");
    cr_assert_str_eq(drey_journal_problem_name(DREY_JOURNAL_BAD_FRAME), "damaged frame");
    cr_assert_str_eq(drey_journal_problem_name(DREY_JOURNAL_LSN_GAP), "LSN gap");
    cr_assert_str_eq(drey_journal_problem_name(DREY_JOURNAL_BAD_HEADER), "bad segment header");
    cr_assert_str_eq(drey_journal_problem_name(DREY_JOURNAL_IO_ERROR), "I/O error");
    cr_assert_str_eq(drey_journal_problem_name((drey_journal_problem)99), "?");
}
