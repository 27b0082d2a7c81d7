/*
 * Unit tests for src/store/siphash.c: SipHash-1-3 over two segments.
 *
 * Pins the function against published vectors, that any split of a message
 * into (a, b) hashes like the whole, and that key and input both matter.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <stdint.h>
#include <string.h>

#include "src/store/siphash.h"

static const uint8_t key_00_0f[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

/* SipHash-1-3 with key 00..0f over messages 00..(n-1), low 32 bits: the
 * Linux kernel's hsiphash vectors on 64-bit machines (lib/siphash_kunit.c),
 * where hsiphash is SipHash-1-3 truncated to u32. */
static const uint32_t vectors_low32[64] = {
    0x050fc4dcU, 0x7d57ca93U, 0x4dc7d44dU, 0xe7ddf7fbU, 0x88d38328U, 0x49533b67U, 0xc59f22a7U, 0x9bb11140U,
    0x8d299a8eU, 0x6c063de4U, 0x92ff097fU, 0xf94dc352U, 0x57b4d9a2U, 0x1229ffa7U, 0xc0f95d34U, 0x2a519956U,
    0x7d908b66U, 0x63dbd80cU, 0xb473e63eU, 0x8d297d1cU, 0xa6cce040U, 0x2b45f844U, 0xa320872eU, 0xdae6c123U,
    0x67349c8cU, 0x705b0979U, 0xca9913a5U, 0x4ade3b35U, 0xef6cd00dU, 0x4ab1e1f4U, 0x43c5e663U, 0x8c21d1bcU,
    0x16a7b60dU, 0x7a8ff9bfU, 0x1f2a753eU, 0xbf186b91U, 0xada26206U, 0xa3c33057U, 0xae3a36a1U, 0x7b108392U,
    0x99e41531U, 0x3f1ad944U, 0xc8138825U, 0xc28949a6U, 0xfaf8876bU, 0x9f042196U, 0x68b1d623U, 0x8b5114fdU,
    0xdf074c46U, 0x12cc86b3U, 0x0a52098fU, 0x9d292f9aU, 0xa2f41f12U, 0x43a71ed0U, 0x73f0bce6U, 0x70a7e980U,
    0x243c6d75U, 0xfdb71513U, 0xa67d8a08U, 0xb7e8f148U, 0xf7a644eeU, 0x0f1837f2U, 0x4b6694e0U, 0xb7bbb3a8U,
};

Test(siphash, matches_published_vectors) {
    uint8_t msg[64];
    for (int i = 0; i < 64; i++)
        msg[i] = (uint8_t)i;
    for (size_t n = 0; n < 64; n++) {
        uint64_t h = drey_store__siphash2(key_00_0f, msg, n, msg, 0);
        cr_assert(eq(u32, (uint32_t)h, vectors_low32[n]), "length %zu", n);
        cr_assert(eq(u64, drey_store__siphash2(key_00_0f, msg, 0, msg, n), h), "all in b, length %zu", n);
    }
}

/* Hashing a || b equals hashing the same bytes split anywhere else, for
 * every length up to a few blocks and every split point, from unaligned
 * buffers. */
Test(siphash, split_invariance) {
    uint8_t buf[1 + 48];
    uint8_t *msg = buf + 1; /* unaligned on purpose */
    uint32_t x = 2463534242u;
    for (size_t i = 0; i < 48; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        msg[i] = (uint8_t)x;
    }
    uint8_t k[16];
    memcpy(k, msg + 7, 16);
    for (size_t n = 0; n <= 48; n++) {
        uint64_t whole = drey_store__siphash2(k, msg, n, msg + n, 0);
        for (size_t split = 0; split <= n; split++) {
            uint64_t h = drey_store__siphash2(k, msg, split, msg + split, n - split);
            cr_assert(eq(u64, h, whole), "length %zu split at %zu", n, split);
        }
    }
}

Test(siphash, the_key_matters) {
    uint8_t k1[16] = {0}, k2[16] = {0};
    const char *m = "default:user:42";
    uint64_t base = drey_store__siphash2(k1, m, strlen(m), m, 0);
    for (int byte = 0; byte < 16; byte++) {
        memset(k2, 0, sizeof k2);
        k2[byte] = 0x01;
        cr_assert(ne(u64, drey_store__siphash2(k2, m, strlen(m), m, 0), base), "key byte %d ignored", byte);
    }
}

/* Every one-bit change of the input, and its length, changes the hash. */
Test(siphash, every_input_bit_matters) {
    uint8_t msg[16];
    memset(msg, 0xa5, sizeof msg);
    uint64_t seen[16 * 8 + 1];
    size_t n = 0;
    seen[n++] = drey_store__siphash2(key_00_0f, msg, sizeof msg, msg, 0);
    for (size_t bit = 0; bit < 16 * 8; bit++) {
        msg[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        uint64_t h = drey_store__siphash2(key_00_0f, msg, 8, msg + 8, 8);
        msg[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        for (size_t i = 0; i < n; i++)
            cr_assert(ne(u64, h, seen[i]), "bit %zu collides", bit);
        seen[n++] = h;
    }
    const uint8_t zero = 0;
    cr_assert(ne(u64, drey_store__siphash2(key_00_0f, &zero, 0, &zero, 0),
                 drey_store__siphash2(key_00_0f, &zero, 1, &zero, 0)),
              "a trailing zero byte counts through the length");
}
