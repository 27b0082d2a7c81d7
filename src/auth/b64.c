/*
 * b64 — strict base64url decoding for JWT segments and JWK members.
 *
 * Strict on purpose: one byte string has exactly one accepted spelling, so
 * nothing downstream (the verified-token cache keys on the token's bytes)
 * sees two spellings of the same header or key.
 */
#include "b64.h"

#include <stdint.h>
#include <stdlib.h>

#include "drey/alloc.h"

static int value_of(char c) {
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '-')
        return 62;
    if (c == '_')
        return 63;
    return -1;
}

bool drey_auth__b64url_char(char c) {
    return value_of(c) >= 0;
}

unsigned char *drey_auth__b64url_decode(const char *s, size_t n, size_t *out_len) {
    if (n % 4 == 1)
        return NULL;
    size_t cap = n / 4 * 3 + (n % 4 == 0 ? 0 : n % 4 - 1);
    unsigned char *out = drey_xmalloc(cap + 1);
    size_t o = 0;
    uint32_t acc = 0;
    int bits = 0;
    for (size_t i = 0; i < n; i++) {
        int v = value_of(s[i]);
        if (v < 0) {
            free(out);
            return NULL;
        }
        acc = (acc << 6) | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            out[o++] = (unsigned char)(acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }
    if (acc != 0) { /* leftover bits must be zero */
        free(out);
        return NULL;
    }
    out[o] = '\0';
    *out_len = o;
    return out;
}
