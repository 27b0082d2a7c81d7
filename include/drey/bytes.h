/*
 * bytes — the byte-level encodings several modules share, each in one place:
 * little-endian integers (journal frames, snapshots, the manifest, stored
 * numeric values), protobuf varints (the descriptor set, the request wire
 * walk), UTF-8 validity (request strings, log escaping) and the fixed-width
 * hexadecimal numbers in data file names ("0000000000000001.seg",
 * "snap-00000000000000ff.snap").
 *
 * The fixed-width integer helpers are inline: they sit on the journal's and
 * the snapshot's per-record paths.
 */
#ifndef DREY_BYTES_H
#define DREY_BYTES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

static inline void drey_bytes_put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8);
}

static inline void drey_bytes_put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void drey_bytes_put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint16_t drey_bytes_get16(const uint8_t *p) {
    return (uint16_t)(p[0] | p[1] << 8);
}

static inline uint32_t drey_bytes_get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t drey_bytes_get64(const uint8_t *p) {
    return (uint64_t)drey_bytes_get32(p) | (uint64_t)drey_bytes_get32(p + 4) << 32;
}

/* Reads one protobuf varint at *p (not past end) and advances *p; false if
 * the input ends first or the varint runs past ten bytes. */
bool drey_bytes_varint(const uint8_t **p, const uint8_t *end, uint64_t *out);

/* The length (2 to 4) of the valid multi-byte UTF-8 sequence at p, n bytes
 * left; 0 if the bytes there are not one (ASCII included: callers handle
 * bytes below 0x80 themselves). Overlong forms, surrogates and code points
 * past U+10FFFF are invalid. */
size_t drey_bytes_utf8_seq(const uint8_t *p, size_t n);

/* Whether s[0..n) is valid UTF-8 (NUL bytes are valid UTF-8: callers that
 * refuse them check separately). */
bool drey_bytes_utf8_valid(const uint8_t *s, size_t n);

/* Parses a file name of the form <prefix><16 lowercase hex digits><suffix>
 * into *value; false (and *value untouched) for any other name. The writers
 * format with "%016" PRIx64, so one spelling per number is accepted. */
bool drey_bytes_hex_name(const char *name, const char *prefix, const char *suffix, uint64_t *value);

#endif
