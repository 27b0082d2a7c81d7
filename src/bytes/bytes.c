/*
 * bytes — varints, UTF-8 and hexadecimal file names; see include/drey/bytes.h.
 */
#include "drey/bytes.h"

#include <string.h>

bool drey_bytes_varint(const uint8_t **p, const uint8_t *end, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if ((b & 0x80) == 0) {
            *out = v;
            return true;
        }
    }
    return false;
}

size_t drey_bytes_utf8_seq(const uint8_t *p, size_t n) {
    if (n == 0 || p[0] < 0xc2 || p[0] > 0xf4)
        return 0; /* ASCII, a continuation byte, an overlong 2-byte lead, past U+10FFFF */
    size_t len = p[0] >= 0xf0 ? 4 : p[0] >= 0xe0 ? 3 : 2;
    if (n < len)
        return 0;
    for (size_t k = 1; k < len; k++) {
        if ((p[k] & 0xc0) != 0x80)
            return 0;
    }
    /* Overlong 3- and 4-byte forms, surrogates, beyond U+10FFFF. */
    if ((p[0] == 0xe0 && p[1] < 0xa0) || (p[0] == 0xed && p[1] >= 0xa0) || (p[0] == 0xf0 && p[1] < 0x90) ||
        (p[0] == 0xf4 && p[1] >= 0x90))
        return 0;
    return len;
}

bool drey_bytes_utf8_valid(const uint8_t *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t len = drey_bytes_utf8_seq(s + i, n - i);
        if (len == 0)
            return false;
        i += len;
    }
    return true;
}

bool drey_bytes_hex_name(const char *name, const char *prefix, const char *suffix, uint64_t *value) {
    size_t np = strlen(prefix), ns = strlen(suffix);
    if (strlen(name) != np + 16 + ns || strncmp(name, prefix, np) != 0 || strcmp(name + np + 16, suffix) != 0)
        return false;
    uint64_t v = 0;
    for (size_t i = np; i < np + 16; i++) {
        char c = name[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0)
            return false;
        v = v << 4 | (uint64_t)d;
    }
    *value = v;
    return true;
}
