/*
 * Fuzz target: one journal frame and one segment header (src/journal/frame.c),
 * the units recovery reads from a disk it cannot trust.
 *
 * Byte 0 holds flags, the rest is the data. With bit 0 set the target
 * writes a correct CRC into the frame (and bit 1, into the header) before
 * decoding, so the fuzzer also explores what lies behind the checksum
 * instead of stopping at it. Properties: a decoded frame lies inside the
 * data, and encoding what was decoded gives back the same bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "drey/crc32c.h"
#include "fuzz_util.h"
#include "src/journal/frame.h"

static void fix_frame_crc(uint8_t *p, size_t n) {
    if (n < DREY_FRAME_HEADER)
        return;
    uint32_t length = fuzz_get32(p);
    if ((uint64_t)DREY_FRAME_HEADER + length > n)
        return;
    uint32_t crc = drey_crc32c(0, p, 4);
    crc = drey_crc32c(crc, p + 8, DREY_FRAME_HEADER - 8 + (size_t)length);
    fuzz_put32(p + 4, crc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    uint8_t flags = data[0];
    size_t n = size - 1;
    uint8_t *buf = malloc(n ? n : 1);
    memcpy(buf, data + 1, n);

    if (n >= DREY_SEGMENT_HEADER) {
        uint8_t h[DREY_SEGMENT_HEADER];
        memcpy(h, buf, sizeof h);
        if (flags & 2)
            fuzz_put32(h + 32, drey_crc32c(0, h, 32));
        drey_segment_header sh;
        if (drey_segment_header_decode(h, &sh)) {
            uint8_t again[DREY_SEGMENT_HEADER];
            drey_segment_header_encode(&sh, again);
            FUZZ_CHECK(memcmp(again, h, 36) == 0, "a header does not encode back to itself");
            drey_segment_header back;
            FUZZ_CHECK(drey_segment_header_decode(again, &back) && back.first_lsn == sh.first_lsn &&
                           back.size == sh.size,
                       "an encoded header does not decode");
        }
    }

    if (flags & 1)
        fix_frame_crc(buf, n);
    drey_frame f;
    drey_frame_status st = drey_frame_decode(buf, n, &f);
    if (st == DREY_FRAME_OK) {
        size_t total = drey_frame_size(f.length);
        FUZZ_CHECK(total <= n && f.payload == buf + DREY_FRAME_HEADER, "frame of %zu bytes in %zu", total, n);
        uint8_t *again = malloc(total);
        drey_frame_encode(&f, f.payload, again);
        /* The padding is not covered by the CRC; everything else is. */
        FUZZ_CHECK(memcmp(again, buf, DREY_FRAME_HEADER + f.length) == 0, "a frame does not encode back to itself");
        drey_frame back;
        FUZZ_CHECK(drey_frame_decode(again, total, &back) == DREY_FRAME_OK && back.lsn == f.lsn &&
                       back.batch_lsn == f.batch_lsn && back.time_ms == f.time_ms && back.length == f.length,
                   "an encoded frame does not decode");
        free(again);
    } else if (st == DREY_FRAME_END) {
        for (size_t i = 0; i < n && i < DREY_FRAME_HEADER; i++)
            FUZZ_CHECK(buf[i] == 0, "END over a non-zero byte at %zu", i);
    }
    free(buf);
    return 0;
}
