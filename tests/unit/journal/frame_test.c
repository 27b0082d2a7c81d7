/*
 * Unit tests for src/journal/frame.c: the frame and segment header codecs.
 * A frame must round-trip, and every kind of damage a crash or a bad disk
 * can do must decode as END (never written), TRUNCATED or BAD, never as a
 * valid frame.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "drey/crc32c.h"
#include "src/journal/frame.h"

static uint8_t buf[4096];

static size_t encode(uint64_t lsn, uint64_t batch, int64_t t, const char *payload) {
    drey_frame f = {.lsn = lsn, .batch_lsn = batch, .time_ms = t, .length = (uint32_t)strlen(payload)};
    memset(buf, 0xEE, sizeof buf);
    drey_frame_encode(&f, (const uint8_t *)payload, buf);
    return drey_frame_size(f.length);
}

Test(frame, size_is_aligned_to_8) {
    cr_assert_eq(drey_frame_size(0), 40);
    cr_assert_eq(drey_frame_size(1), 48);
    cr_assert_eq(drey_frame_size(8), 48);
    cr_assert_eq(drey_frame_size(9), 56);
    for (size_t n = 0; n < 100; n++)
        cr_assert_eq(drey_frame_size(n) % 8, 0);
}

Test(frame, round_trip) {
    const char *payloads[] = {"", "x", "hello journal", "0123456789abcdef0123456789abcdef01234"};
    for (size_t i = 0; i < sizeof payloads / sizeof *payloads; i++) {
        size_t n = encode(1000 + i, 999, -5 + (int64_t)i * 1700000000000LL, payloads[i]);
        /* Padding is zeros, not what was in the buffer. */
        for (size_t k = 40 + strlen(payloads[i]); k < n; k++)
            cr_assert_eq(buf[k], 0, "padding byte %zu", k);
        drey_frame f;
        cr_assert_eq(drey_frame_decode(buf, n, &f), DREY_FRAME_OK);
        cr_assert_eq(f.lsn, 1000 + i);
        cr_assert_eq(f.batch_lsn, 999);
        cr_assert_eq(f.time_ms, -5 + (int64_t)i * 1700000000000LL);
        cr_assert_eq(f.length, strlen(payloads[i]));
        cr_assert(memcmp(f.payload, payloads[i], f.length) == 0);
        cr_assert_eq(f.payload, buf + 40);
        /* More bytes readable than the frame: still OK. */
        cr_assert_eq(drey_frame_decode(buf, sizeof buf, &f), DREY_FRAME_OK);
    }
}

Test(frame, layout_is_little_endian_as_documented) {
    encode(0x0102030405060708ULL, 0x1112131415161718ULL, 0x2122232425262728LL, "abc");
    cr_assert_eq(buf[0], 3);
    cr_assert_eq(buf[8], 0x08);
    cr_assert_eq(buf[15], 0x01);
    cr_assert_eq(buf[16], 0x18);
    cr_assert_eq(buf[24], 0x28);
    cr_assert_eq(buf[32], 1); /* type record */
    cr_assert_eq(buf[36] | buf[37] | buf[38] | buf[39], 0);
    uint32_t crc = drey_crc32c(0, buf, 4);
    crc = drey_crc32c(crc, buf + 8, 32 + 3);
    cr_assert_eq(buf[4] | buf[5] << 8 | buf[6] << 16 | (uint32_t)buf[7] << 24, crc);
}

Test(frame, zero_header_is_end) {
    uint8_t zeros[128] = {0};
    drey_frame f;
    cr_assert_eq(drey_frame_decode(zeros, sizeof zeros, &f), DREY_FRAME_END);
    cr_assert_eq(drey_frame_decode(zeros, 40, &f), DREY_FRAME_END);
    /* Fewer bytes than a header, all zero: the end too. */
    cr_assert_eq(drey_frame_decode(zeros, 7, &f), DREY_FRAME_END);
    cr_assert_eq(drey_frame_decode(zeros, 0, &f), DREY_FRAME_END);
}

Test(frame, truncated_header) {
    size_t n = encode(7, 7, 1, "payload");
    (void)n;
    drey_frame f;
    for (size_t avail = 1; avail < 40; avail++)
        cr_assert_eq(drey_frame_decode(buf, avail, &f), DREY_FRAME_TRUNCATED, "avail %zu", avail);
}

Test(frame, truncated_payload_or_padding) {
    size_t n = encode(7, 7, 1, "a payload of some length");
    drey_frame f;
    for (size_t avail = 40; avail < n; avail++)
        cr_assert_eq(drey_frame_decode(buf, avail, &f), DREY_FRAME_TRUNCATED, "avail %zu of %zu", avail, n);
    cr_assert_eq(drey_frame_decode(buf, n, &f), DREY_FRAME_OK);
}

/* A torn write can leave the header and lose the payload sectors (zeros
 * where the payload was): the CRC catches it. */
Test(frame, zeroed_payload_is_bad) {
    size_t n = encode(7, 7, 1, "a payload that a crash lost");
    memset(buf + 40, 0, n - 40);
    drey_frame f;
    cr_assert_eq(drey_frame_decode(buf, n, &f), DREY_FRAME_BAD);
}

/* A header lost but the payload kept: not END (dirty bytes follow) at the
 * frame level it reads as END, which the scan then tells from the clean
 * end by the non-zero bytes after it. */
Test(frame, zeroed_header_with_payload_reads_as_end) {
    size_t n = encode(7, 7, 1, "payload survived");
    memset(buf, 0, 40);
    drey_frame f;
    cr_assert_eq(drey_frame_decode(buf, n, &f), DREY_FRAME_END);
}

Test(frame, every_flipped_bit_is_detected) {
    size_t n = encode(123456, 123450, 1700000000123LL, "flip every bit of me!");
    drey_frame f;
    for (size_t bit = 0; bit < n * 8; bit++) {
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        drey_frame_status st = drey_frame_decode(buf, n, &f);
        size_t byte = bit / 8;
        if (byte >= 40 + 21) {
            /* Padding is outside the CRC; a flip there is harmless to the
             * record, which still decodes as written. */
            cr_assert_eq(st, DREY_FRAME_OK, "padding bit %zu", bit);
        } else {
            cr_assert(st == DREY_FRAME_BAD || st == DREY_FRAME_TRUNCATED, "bit %zu (byte %zu) decoded as %d", bit,
                      byte, st);
        }
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    cr_assert_eq(drey_frame_decode(buf, n, &f), DREY_FRAME_OK);
}

Test(frame, each_header_field_damaged) {
    static const struct {
        size_t off;
        const char *field;
    } fields[] = {{0, "length"}, {4, "crc"},  {8, "lsn"},       {16, "batch"},
                  {24, "time"},  {32, "type"}, {36, "reserved"}, {40, "payload"}};
    for (size_t i = 0; i < sizeof fields / sizeof *fields; i++) {
        size_t n = encode(5, 5, 5, "0123456789");
        buf[fields[i].off + 1] ^= 0x10; /* the second byte: length 10 -> 4106 */
        drey_frame f;
        drey_frame_status st = drey_frame_decode(buf, n, &f);
        cr_assert(st == DREY_FRAME_BAD || st == DREY_FRAME_TRUNCATED, "%s: %d", fields[i].field, st);
    }
}

Test(frame, wrong_type_is_bad_even_with_a_matching_crc) {
    size_t n = encode(5, 5, 5, "abc");
    buf[32] = 2;
    /* Recompute the CRC so only the type is wrong. */
    uint32_t crc = drey_crc32c(0, buf, 4);
    crc = drey_crc32c(crc, buf + 8, 32 + 3);
    for (int i = 0; i < 4; i++)
        buf[4 + i] = (uint8_t)(crc >> (8 * i));
    drey_frame f;
    cr_assert_eq(drey_frame_decode(buf, n, &f), DREY_FRAME_BAD);
    buf[32] = 1;
    buf[36] = 1; /* reserved must be zero */
    cr_assert_eq(drey_frame_decode(buf, n, &f), DREY_FRAME_BAD);
}

Test(frame, garbage_length) {
    size_t n = encode(5, 5, 5, "abc");
    drey_frame f;
    uint32_t lengths[] = {0xFFFFFFFFu, 0x80000000u, 4096, 41, 2};
    for (size_t i = 0; i < sizeof lengths / sizeof *lengths; i++) {
        encode(5, 5, 5, "abc");
        for (int k = 0; k < 4; k++)
            buf[k] = (uint8_t)(lengths[i] >> (8 * k));
        drey_frame_status st = drey_frame_decode(buf, n, &f);
        cr_assert(st == DREY_FRAME_BAD || st == DREY_FRAME_TRUNCATED, "length %u: %d", lengths[i], st);
        /* Even with the whole buffer readable. */
        st = drey_frame_decode(buf, sizeof buf, &f);
        cr_assert(st == DREY_FRAME_BAD || st == DREY_FRAME_TRUNCATED, "length %u (4 KiB readable): %d", lengths[i],
                  st);
    }
}

Test(frame, random_garbage_never_decodes) {
    uint64_t s = 7;
    drey_frame f;
    for (int round = 0; round < 20000; round++) {
        for (size_t i = 0; i < 128; i += 8) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            memcpy(buf + i, &s, 8);
        }
        buf[32] = 1, buf[33] = buf[34] = buf[35] = 0; /* even with a plausible type */
        memset(buf + 36, 0, 4);
        buf[1] = buf[2] = buf[3] = 0;                 /* and a plausible length */
        buf[0] &= 0x3f;
        cr_assert_neq(drey_frame_decode(buf, 128, &f), DREY_FRAME_OK, "round %d", round);
    }
}

/* --- segment headers ------------------------------------------------------ */

Test(segment_header, round_trip_and_layout) {
    uint8_t h[DREY_SEGMENT_HEADER];
    drey_segment_header in = {.first_lsn = 0x1234, .size = 65536}, out;
    drey_segment_header_encode(&in, h);
    cr_assert(memcmp(h, "DREYWAL\0", 8) == 0);
    cr_assert_eq(h[8], 1);
    cr_assert_eq(h[12], 64);
    for (size_t i = 36; i < 64; i++)
        cr_assert_eq(h[i], 0);
    cr_assert(drey_segment_header_decode(h, &out));
    cr_assert_eq(out.first_lsn, 0x1234);
    cr_assert_eq(out.size, 65536);
}

Test(segment_header, damage_is_refused) {
    uint8_t h[DREY_SEGMENT_HEADER];
    drey_segment_header in = {.first_lsn = 77, .size = 65536}, out;
    drey_segment_header_encode(&in, h);
    for (size_t bit = 0; bit < 36 * 8; bit++) {
        h[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        cr_assert(!drey_segment_header_decode(h, &out), "bit %zu", bit);
        h[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
    uint8_t zeros[DREY_SEGMENT_HEADER] = {0};
    cr_assert(!drey_segment_header_decode(zeros, &out));
    /* first LSN 0 is never valid. */
    in.first_lsn = 0;
    drey_segment_header_encode(&in, h);
    cr_assert(!drey_segment_header_decode(h, &out));
}
