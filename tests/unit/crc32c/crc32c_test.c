/*
 * Unit tests for src/crc32c/crc32c.c: CRC-32C against the RFC 3720 (iSCSI)
 * test vectors, chaining, and the hardware path against the portable table
 * on random data of many lengths and alignments.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "drey/crc32c.h"

/* RFC 3720, appendix B.4. */
static void vectors(uint32_t (*fn)(uint32_t, const void *, size_t), const char *which) {
    uint8_t buf[32];
    memset(buf, 0, sizeof buf);
    cr_expect_eq(fn(0, buf, 32), 0x8A9136AAu, "%s: 32 zero bytes", which);
    memset(buf, 0xff, sizeof buf);
    cr_expect_eq(fn(0, buf, 32), 0x62A8AB43u, "%s: 32 0xFF bytes", which);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)i;
    cr_expect_eq(fn(0, buf, 32), 0x46DD794Eu, "%s: 0..31 ascending", which);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)(31 - i);
    cr_expect_eq(fn(0, buf, 32), 0x113FDB5Cu, "%s: 31..0 descending", which);
    /* The classic check value of CRC-32C. */
    cr_expect_eq(fn(0, "123456789", 9), 0xE3069283u, "%s: \"123456789\"", which);
    cr_expect_eq(fn(0, "", 0), 0u, "%s: nothing", which);
    cr_expect_eq(fn(0x12345678u, "", 0), 0x12345678u, "%s: nothing leaves the crc alone", which);
}

Test(crc32c, rfc3720_vectors_dispatching_path) {
    vectors(drey_crc32c, "drey_crc32c");
}

Test(crc32c, rfc3720_vectors_portable_path) {
    vectors(drey_crc32c_portable, "drey_crc32c_portable");
}

/* The iSCSI SCSI Read(10) command PDU of RFC 3720 B.4. */
Test(crc32c, rfc3720_read10_pdu) {
    static const uint8_t pdu[48] = {
        0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18,
        0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    };
    cr_expect_eq(drey_crc32c(0, pdu, sizeof pdu), 0xD9963A56u);
    cr_expect_eq(drey_crc32c_portable(0, pdu, sizeof pdu), 0xD9963A56u);
}

static uint64_t rng_state;
static uint64_t rnd(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

Test(crc32c, chaining_equals_one_shot) {
    rng_state = 1;
    uint8_t buf[4096];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (uint8_t)rnd();
    for (int round = 0; round < 500; round++) {
        size_t n = rnd() % sizeof buf;
        size_t cut1 = n ? rnd() % (n + 1) : 0;
        size_t cut2 = cut1 + (n - cut1 ? rnd() % (n - cut1 + 1) : 0);
        uint32_t whole = drey_crc32c(0, buf, n);
        uint32_t c = drey_crc32c(0, buf, cut1);
        c = drey_crc32c(c, buf + cut1, cut2 - cut1);
        c = drey_crc32c(c, buf + cut2, n - cut2);
        cr_assert_eq(c, whole, "n=%zu cuts %zu,%zu", n, cut1, cut2);
        uint32_t p = drey_crc32c_portable(0, buf, cut1);
        p = drey_crc32c_portable(p, buf + cut1, n - cut1);
        cr_assert_eq(p, whole, "portable chain n=%zu cut %zu", n, cut1);
    }
    /* Byte at a time. */
    uint32_t c = 0;
    for (size_t i = 0; i < 100; i++)
        c = drey_crc32c(c, buf + i, 1);
    cr_assert_eq(c, drey_crc32c(0, buf, 100));
}

Test(crc32c, hardware_equals_portable_on_many_lengths_and_alignments) {
    rng_state = 42;
    static uint8_t buf[8192 + 16];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (uint8_t)rnd();
    for (size_t align = 0; align < 16; align++) {
        for (size_t n = 0; n <= 300; n++) {
            uint32_t seed = (uint32_t)rnd();
            cr_assert_eq(drey_crc32c(seed, buf + align, n), drey_crc32c_portable(seed, buf + align, n),
                         "align %zu len %zu", align, n);
        }
    }
    for (int round = 0; round < 200; round++) {
        size_t align = rnd() % 16, n = rnd() % 8192;
        cr_assert_eq(drey_crc32c(0, buf + align, n), drey_crc32c_portable(0, buf + align, n), "align %zu len %zu",
                     align, n);
    }
}

/* A single flipped bit anywhere changes the checksum (CRC's guarantee for
 * burst errors shorter than 32 bits). */
Test(crc32c, detects_every_single_bit_flip) {
    uint8_t buf[64];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (uint8_t)(i * 7);
    uint32_t good = drey_crc32c(0, buf, sizeof buf);
    for (size_t bit = 0; bit < sizeof buf * 8; bit++) {
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        cr_assert_neq(drey_crc32c(0, buf, sizeof buf), good, "bit %zu", bit);
        buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    }
}
