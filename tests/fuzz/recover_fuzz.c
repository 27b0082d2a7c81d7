/*
 * Fuzz target: recovery of a damaged journal (src/journal/scan.c and the
 * open path in journal.c), on the in-memory fault file system.
 *
 * The input describes a journal directory: byte 0 says how many segments
 * (1-3), the first LSN, the snapshot LSN recovery starts after, and whether
 * to repair before the first open; the rest
 * is split between the segments, each becoming a segment file (a valid
 * header, then the bytes as frames). Frames are repaired before writing so
 * that the fuzzer reaches the decisions behind the CRC: a frame's LSN field
 * is read as an offset from the LSN expected there (0: the next one), its
 * batch LSN as a distance back from its LSN, and its CRC is made right
 * unless bit 0 of its time field says to leave it; bit 1 of the time field
 * keeps a wrong type. A later segment's first byte perturbs the first LSN its
 * name and header carry (0: it continues the previous segment); its third
 * byte, 0xfe or 0xff, damages its header or cuts the file inside it.
 *
 * Properties: replay sees consecutive LSNs ending at the scan's last LSN;
 * open succeeds exactly when the scan found nothing worse than a torn tail;
 * after an operator repair the journal scans clean and keeps exactly the
 * prefix before the damage; once open, a new record gets the LSN after
 * max(last record, snapshot) and the journal then scans clean.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/crc32c.h"
#include "drey/journal.h"
#include "drey/log.h"
#include "fuzz_util.h"
#include "src/journal/frame.h"

#define DIR "/d"

typedef struct replay_state {
    uint64_t after, next, count;
} replay_state;

static int on_record(void *ctx, const drey_journal_record *rec) {
    replay_state *r = ctx;
    FUZZ_CHECK(rec->lsn > r->after, "replayed lsn %" PRIu64 " not after %" PRIu64, rec->lsn, r->after);
    FUZZ_CHECK(r->next == 0 || rec->lsn == r->next, "replay lsn %" PRIu64 ", expected %" PRIu64, rec->lsn, r->next);
    r->next = rec->lsn + 1;
    r->count++;
    return 0;
}

/* Rewrites the frames of a segment body as the header comment says;
 * returns the next LSN expected after them. */
static uint64_t shape_frames(uint8_t *seg, size_t size, uint64_t expect) {
    size_t off = DREY_SEGMENT_HEADER;
    while (off + DREY_FRAME_HEADER <= size) {
        uint8_t *p = seg + off;
        uint32_t length = fuzz_get32(p);
        if (drey_frame_size(length) > size - off)
            break;
        uint64_t lsn = expect + fuzz_get64(p + 8);
        uint64_t back = fuzz_get64(p + 16);
        uint64_t batch = back < lsn ? lsn - back : 1;
        uint64_t time = fuzz_get64(p + 24);
        fuzz_put64(p + 8, lsn);
        fuzz_put64(p + 16, batch);
        if (!(time & 2)) {
            fuzz_put32(p + 32, DREY_FRAME_RECORD);
            fuzz_put32(p + 36, 0);
        }
        if (!(time & 1)) {
            uint32_t crc = drey_crc32c(0, p, 4);
            fuzz_put32(p + 4, drey_crc32c(crc, p + 8, DREY_FRAME_HEADER - 8 + (size_t)length));
        }
        expect = lsn + 1;
        off += drey_frame_size(length);
    }
    return expect;
}

static void scan(drey_io *io, uint64_t after, drey_journal_scan *s, replay_state *r) {
    memset(r, 0, sizeof *r);
    r->after = after;
    int rc = drey_journal_scan_dir(io, DIR, after, on_record, r, s);
    FUZZ_CHECK(rc == 0, "scan: %d", rc);
    if (r->count > 0)
        FUZZ_CHECK(r->next - 1 == s->last_lsn, "replay ended at %" PRIu64 ", scan at %" PRIu64, r->next - 1,
                   s->last_lsn);
}

static void appended(void *arg, const drey_journal_record *rec, int err) {
    uint64_t *lsn = arg;
    *lsn = err == 0 ? rec->lsn : 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    drey_log_set_level(DREY_LOG_LEVEL_ERROR); /* torn tails are expected here */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2 || size > 65536)
        return 0;
    unsigned n_segs = 1 + (data[0] & 3) % 3;
    uint64_t first = 1 + ((data[0] >> 2) & 7);
    uint64_t after = (data[0] >> 5) & 3; /* the snapshot's LSN */
    bool repair_first = data[0] >> 7;    /* repair without trying to open */
    const uint8_t *rest = data + 1;
    size_t left = size - 1, part = left / n_segs;

    drey_io_fault *fs = drey_io_fault_create();
    drey_io *io = drey_io_fault_io(fs);
    FUZZ_CHECK(io->ops->mkdir(io, DIR) == 0 && io->ops->mkdir(io, DIR "/journal") == 0, "mkdir");
    uint64_t expect = first;
    for (unsigned i = 0; i < n_segs; i++) {
        size_t len = i + 1 == n_segs ? left - part * i : part;
        const uint8_t *body = rest + part * i;
        uint64_t seg_lsn = expect;
        if (len > 0 && i > 0)
            seg_lsn += (uint64_t)(int8_t)body[0]; /* a gap, an overlap, or neither */
        if (seg_lsn == 0)
            seg_lsn = 1;
        /* Zeros after the bytes, as preallocation leaves them. */
        size_t seg_size = DREY_SEGMENT_HEADER + ((len + 7) & ~(size_t)7) + 64;
        uint8_t *seg = calloc(1, seg_size);
        drey_segment_header h = {.first_lsn = seg_lsn, .size = seg_size};
        drey_segment_header_encode(&h, seg);
        memcpy(seg + DREY_SEGMENT_HEADER, body, len);
        expect = shape_frames(seg, seg_size, seg_lsn);
        /* A segment's third byte can damage its header or cut the file
         * inside it. */
        size_t file_size = seg_size;
        if (len > 2 && body[2] == 0xfe)
            seg[body[1] % 36] ^= 0x10;
        else if (len > 2 && body[2] == 0xff)
            file_size = body[1] % DREY_SEGMENT_HEADER;
        char path[128];
        snprintf(path, sizeof path, DIR "/journal/%016" PRIx64 ".seg", seg_lsn);
        fuzz_put_file(io, path, seg, file_size);
        free(seg);
    }

    /* What else a journal directory may hold: a temporary file a crash
     * left, and a stranger. Neither is a segment. */
    fuzz_put_file(io, DIR "/journal/0000000000000001.seg.tmp", (const uint8_t *)"x", 1);
    fuzz_put_file(io, DIR "/journal/README", (const uint8_t *)"x", 1);

    drey_journal_scan s1, s2;
    replay_state r1, r2;
    scan(io, after, &s1, &r1);
    drey_journal_problem p1 = s1.problem;
    uint64_t last1 = s1.last_lsn;
    drey_journal_options o = {.dir = DIR, .io = io, .segment_bytes = 4096, .fsync = DREY_FSYNC_ALWAYS,
                              .batch_max_bytes = 1 << 16};
    drey_journal *j = NULL;
    char err[1024];
    replay_state r3 = {.after = after};
    if (!repair_first || p1 == DREY_JOURNAL_OK) {
        /* What the node does at start: open, cutting a torn tail and
         * refusing anything else. */
        int rc = drey_journal_open(&o, after, on_record, &r3, &j, err, sizeof err);
        bool opens = p1 == DREY_JOURNAL_OK || p1 == DREY_JOURNAL_TORN_TAIL;
        FUZZ_CHECK((rc == 0) == opens, "open returned %d with %s: %s", rc, drey_journal_problem_name(p1),
                   rc ? err : "");
        if (rc == 0)
            FUZZ_CHECK(r3.count == r1.count, "open replayed %" PRIu64 " records, the scan %" PRIu64, r3.count,
                       r1.count);
    }
    if (j == NULL) {
        /* The operator's repair, then the start again. */
        FUZZ_CHECK(s1.message[0] != '\0', "a problem without a message");
        uint64_t dropped;
        FUZZ_CHECK(drey_journal_repair(io, DIR, &s1, &dropped) == 0, "repair failed");
        scan(io, after, &s2, &r2);
        FUZZ_CHECK(s2.problem == DREY_JOURNAL_OK, "after repair: %s", s2.message);
        FUZZ_CHECK(s2.last_lsn == last1 && r2.count == r1.count,
                   "repair kept %" PRIu64 " records to %" PRIu64 ", not %" PRIu64 " to %" PRIu64, r2.count,
                   s2.last_lsn, r1.count, last1);
        drey_journal_scan_free(&s2);
        memset(&r3, 0, sizeof r3);
        r3.after = after;
        int rc = drey_journal_open(&o, after, on_record, &r3, &j, err, sizeof err);
        FUZZ_CHECK(rc == 0, "open after repair: %s", err);
    }
    drey_journal_scan_free(&s1);

    uint64_t lsn = 0;
    drey_journal_entry e = {.payload = (const uint8_t *)"x", .len = 1, .done = appended, .arg = &lsn};
    FUZZ_CHECK(drey_journal_append(j, &e) == 0, "append");
    drey_journal_close(j);
    uint64_t want = (last1 > after ? last1 : after) + 1;
    FUZZ_CHECK(lsn == want, "the new record got lsn %" PRIu64 ", not %" PRIu64, lsn, want);
    scan(io, after, &s2, &r2);
    FUZZ_CHECK(s2.problem == DREY_JOURNAL_OK, "after open and append: %s", s2.message);
    FUZZ_CHECK(s2.last_lsn == lsn, "last lsn %" PRIu64 " after appending %" PRIu64, s2.last_lsn, lsn);
    drey_journal_scan_free(&s2);
    drey_io_fault_destroy(fs);
    return 0;
}
