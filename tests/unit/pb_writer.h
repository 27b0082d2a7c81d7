/*
 * Hand-encoding protobuf messages for unit tests, byte by byte, so a test
 * can send what protobuf-c would never produce (a NUL inside a string,
 * invalid UTF-8, nesting a million levels deep).
 *
 * The writer fills its buffer from the end, because a length-delimited
 * field can only be framed once its content is known: write a message's
 * fields LAST FIELD FIRST, and frame a sub-message with pbw_wrap() once its
 * fields are written. Deep nesting then costs O(n), not O(n^2).
 *
 *   pbw w; pbw_init(&w);
 *   size_t m = pbw_len(&w);
 *   pbw_string(&w, 2, "b", 1);       // inner { 1: "a", 2: "b" } ...
 *   pbw_string(&w, 1, "a", 1);
 *   pbw_wrap(&w, 3, m);              // ... as field 3 of the outer message
 *   pbw_data(&w) / pbw_len(&w)       // the encoding
 */
#ifndef DREY_TESTS_UNIT_PB_WRITER_H
#define DREY_TESTS_UNIT_PB_WRITER_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct pbw {
    uint8_t *buf;
    size_t cap;   /* bytes allocated */
    size_t start; /* the encoding is buf[start..cap) */
} pbw;

static inline void pbw_init(pbw *w) {
    w->cap = 256;
    w->buf = malloc(w->cap);
    if (w->buf == NULL)
        abort();
    w->start = w->cap;
}

static inline void pbw_free(pbw *w) {
    free(w->buf);
    w->buf = NULL;
}

static inline size_t pbw_len(const pbw *w) {
    return w->cap - w->start;
}

static inline const uint8_t *pbw_data(const pbw *w) {
    return w->buf + w->start;
}

/* A heap copy of exactly the encoding, so ASan catches any read past it. */
static inline uint8_t *pbw_copy(const pbw *w) {
    uint8_t *p = malloc(pbw_len(w) ? pbw_len(w) : 1);
    if (p == NULL)
        abort();
    memcpy(p, pbw_data(w), pbw_len(w));
    return p;
}

static inline void pbw_room(pbw *w, size_t n) {
    if (w->start >= n)
        return;
    size_t len = pbw_len(w), cap = w->cap;
    while (cap - len < n)
        cap *= 2;
    uint8_t *nb = malloc(cap);
    if (nb == NULL)
        abort();
    memcpy(nb + cap - len, w->buf + w->start, len);
    free(w->buf);
    w->buf = nb;
    w->cap = cap;
    w->start = cap - len;
}

/* Prepends raw bytes. */
static inline void pbw_raw(pbw *w, const void *p, size_t n) {
    pbw_room(w, n);
    w->start -= n;
    if (n > 0)
        memcpy(w->buf + w->start, p, n);
}

static inline void pbw_varint(pbw *w, uint64_t v) {
    uint8_t b[10];
    size_t n = 0;
    do {
        b[n] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v != 0)
            b[n] |= 0x80;
        n++;
    } while (v != 0);
    pbw_raw(w, b, n);
}

static inline void pbw_key(pbw *w, uint32_t field, unsigned wire_type) {
    pbw_varint(w, (uint64_t)field << 3 | wire_type);
}

/* Frames everything written since the length was `mark` as field `field`
 * (wire type 2). */
static inline void pbw_wrap(pbw *w, uint32_t field, size_t mark) {
    pbw_varint(w, pbw_len(w) - mark);
    pbw_key(w, field, 2);
}

static inline void pbw_string(pbw *w, uint32_t field, const void *s, size_t n) {
    pbw_raw(w, s, n);
    pbw_varint(w, n);
    pbw_key(w, field, 2);
}

static inline void pbw_cstring(pbw *w, uint32_t field, const char *s) {
    pbw_string(w, field, s, strlen(s));
}

static inline void pbw_uint(pbw *w, uint32_t field, uint64_t v) {
    pbw_varint(w, v);
    pbw_key(w, field, 0);
}

#endif
