/*
 * pbwire — the wire format's writing side and what a field's descriptor
 * says, shared by the encoder and the decoder; see pbwire.h.
 */
#include "pbwire.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"

void drey_pb__put(buf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = b->n + n > 2 * b->cap ? b->n + n + 64 : 2 * b->cap;
        b->d = drey_xrealloc(b->d, b->cap, 1);
    }
    if (n > 0)
        memcpy(b->d + b->n, src, n);
    b->n += n;
}

void drey_pb__put_varint(buf *b, uint64_t v) {
    uint8_t tmp[10];
    size_t n = 0;
    do {
        tmp[n] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v != 0)
            tmp[n] |= 0x80;
        n++;
    } while (v != 0);
    drey_pb__put(b, tmp, n);
}

void drey_pb__put_tag(buf *b, int32_t number, int wire) {
    drey_pb__put_varint(b, (uint64_t)number << 3 | (uint64_t)wire);
}

void drey_pb__put_fixed(buf *b, uint64_t v, size_t n) {
    uint8_t tmp[8];
    for (size_t i = 0; i < n; i++)
        tmp[i] = (uint8_t)(v >> (8 * i));
    drey_pb__put(b, tmp, n);
}

void drey_pb__put_bytes(buf *b, int32_t number, const void *d, size_t n) {
    drey_pb__put_tag(b, number, 2);
    drey_pb__put_varint(b, n);
    drey_pb__put(b, d, n);
}

void drey_pb__put_varint_field(buf *b, int32_t number, uint64_t v) {
    drey_pb__put_tag(b, number, 0);
    drey_pb__put_varint(b, v);
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *drey_pb_base64(const uint8_t *d, size_t n) {
    char *out = drey_xmalloc(4 * ((n + 2) / 3) + 1), *o = out;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)d[i] << 16 | (i + 1 < n ? (uint32_t)d[i + 1] << 8 : 0) | (i + 2 < n ? d[i + 2] : 0);
        *o++ = B64[v >> 18 & 63];
        *o++ = B64[v >> 12 & 63];
        *o++ = i + 1 < n ? B64[v >> 6 & 63] : '=';
        *o++ = i + 2 < n ? B64[v & 63] : '=';
    }
    *o = '\0';
    return out;
}

bool drey_pb__unbase64(const char *s, buf *out) {
    uint32_t acc = 0;
    int bits = 0;
    for (; *s != '\0' && *s != '='; s++) {
        int v;
        if (*s >= 'A' && *s <= 'Z')
            v = *s - 'A';
        else if (*s >= 'a' && *s <= 'z')
            v = *s - 'a' + 26;
        else if (*s >= '0' && *s <= '9')
            v = *s - '0' + 52;
        else if (*s == '+' || *s == '-')
            v = 62;
        else if (*s == '/' || *s == '_')
            v = 63;
        else
            return false;
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            uint8_t byte = (uint8_t)(acc >> bits);
            drey_pb__put(out, &byte, 1);
        }
    }
    return true;
}

void drey_pb__put_camel(buf *b, const char *snake) {
    bool up = false;
    for (const char *s = snake; *s != '\0'; s++) {
        if (*s == '_') {
            up = true;
            continue;
        }
        char c = up ? (char)toupper((unsigned char)*s) : *s;
        up = false;
        drey_pb__put(b, &c, 1);
    }
}

void drey_pb__json_name(const field_t *f, char *out, size_t cap) {
    if (f->json_name != NULL && f->json_name[0] != '\0') {
        snprintf(out, cap, "%s", f->json_name);
        return;
    }
    buf camel = {0};
    drey_pb__put_camel(&camel, f->name);
    snprintf(out, cap, "%.*s", (int)camel.n, camel.d != NULL ? (const char *)camel.d : "");
    free(camel.d);
}

bool drey_pb__is_map_entry(const message_t *m) {
    return m != NULL && m->options != NULL && m->options->has_map_entry && m->options->map_entry;
}

const field_t *drey_pb__field(const message_t *m, uint32_t number) {
    for (size_t i = 0; i < m->n_field; i++)
        if (m->field[i]->has_number && (uint32_t)m->field[i]->number == number)
            return m->field[i];
    return NULL;
}

bool drey_pb__type_is(const char *type, const char *wkt) {
    if (type[0] == '.')
        type++;
    return strcmp(type, wkt) == 0;
}

bool drey_pb__is_wrapper(const char *type) {
    static const char *const w[] = {"DoubleValue", "FloatValue", "Int64Value", "UInt64Value", "Int32Value",
                                    "UInt32Value", "BoolValue",  "StringValue", "BytesValue"};
    if (type[0] == '.')
        type++;
    if (strncmp(type, "google.protobuf.", 16) != 0)
        return false;
    for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
        if (strcmp(type + 16, w[i]) == 0)
            return true;
    return false;
}
