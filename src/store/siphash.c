/*
 * SipHash-1-3 (Aumasson & Bernstein), the keyed hash Redis uses for its
 * dictionaries: fast on short keys and, with a random key per process,
 * resistant to hash flooding. Streams two segments so the cache name and the
 * key hash as one message without being copied together.
 */
#include "siphash.h"

#include <string.h>

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))

#define SIPROUND                                                                                                     \
    do {                                                                                                             \
        v0 += v1;                                                                                                    \
        v1 = ROTL(v1, 13);                                                                                           \
        v1 ^= v0;                                                                                                    \
        v0 = ROTL(v0, 32);                                                                                           \
        v2 += v3;                                                                                                    \
        v3 = ROTL(v3, 16);                                                                                           \
        v3 ^= v2;                                                                                                    \
        v0 += v3;                                                                                                    \
        v3 = ROTL(v3, 21);                                                                                           \
        v3 ^= v0;                                                                                                    \
        v2 += v1;                                                                                                    \
        v1 = ROTL(v1, 17);                                                                                           \
        v1 ^= v2;                                                                                                    \
        v2 = ROTL(v2, 32);                                                                                           \
    } while (0)

static uint64_t load_le64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

uint64_t drey_store__siphash2(const uint8_t k[16], const void *a, size_t alen, const void *b, size_t blen) {
    uint64_t k0 = load_le64(k), k1 = load_le64(k + 8);
    uint64_t v0 = 0x736f6d6570736575ULL ^ k0;
    uint64_t v1 = 0x646f72616e646f6dULL ^ k1;
    uint64_t v2 = 0x6c7967656e657261ULL ^ k0;
    uint64_t v3 = 0x7465646279746573ULL ^ k1;

    uint8_t buf[8];
    size_t fill = 0;
    const uint8_t *segs[2] = {a, b};
    size_t lens[2] = {alen, blen};
    for (int s = 0; s < 2; s++) {
        const uint8_t *p = segs[s];
        size_t n = lens[s];
        if (fill > 0) {
            size_t take = 8 - fill < n ? 8 - fill : n;
            memcpy(buf + fill, p, take);
            fill += take;
            p += take;
            n -= take;
            if (fill < 8)
                continue;
            uint64_t m = load_le64(buf);
            v3 ^= m;
            SIPROUND;
            v0 ^= m;
            fill = 0;
        }
        for (; n >= 8; p += 8, n -= 8) {
            uint64_t m = load_le64(p);
            v3 ^= m;
            SIPROUND;
            v0 ^= m;
        }
        memcpy(buf, p, n);
        fill = n;
    }

    uint64_t last = (uint64_t)(alen + blen) << 56;
    for (size_t i = 0; i < fill; i++)
        last |= (uint64_t)buf[i] << (8 * i);
    v3 ^= last;
    SIPROUND;
    v0 ^= last;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}
