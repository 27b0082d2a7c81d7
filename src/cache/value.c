/*
 * Conversions between cache messages and the store; see value.h.
 *
 * Numbers are stored little-endian whatever the host, so a snapshot written
 * on one machine reads the same on another.
 */
#include "value.h"

#include "drey/bytes.h"
#include "drey/cache.h"

#include <string.h>

#include "google/protobuf/struct.pb-c.h"

/* The last millisecond a google.protobuf.Timestamp can express
 * (9999-12-31T23:59:59.999Z): rounding up must not step past it, or the
 * expires_at we return would be invalid for strict clients. */
#define MAX_TIMESTAMP_MS (253402300799LL * 1000 + 999)

static int64_t ceil_ms(int64_t seconds, int32_t nanos) {
    int64_t ms = seconds * 1000 + (nanos + 999999) / 1000000;
    return ms > MAX_TIMESTAMP_MS ? MAX_TIMESTAMP_MS : ms;
}

int64_t drey_cache__expiry_at(const drey_cache__expiry *ex, int64_t now_ms, int64_t keep) {
    int64_t at;
    if (ex->ttl != NULL) {
        at = now_ms + ceil_ms(ex->ttl->seconds, ex->ttl->nanos);
        if (at > MAX_TIMESTAMP_MS)
            at = MAX_TIMESTAMP_MS;
    }
    else if (ex->expires_at != NULL)
        at = ceil_ms(ex->expires_at->seconds, ex->expires_at->nanos);
    else if (ex->persist)
        return 0;
    else
        return keep;
    /* 0 means "never": a time at or before the epoch is already past. */
    return at > 0 ? at : 1;
}

uint32_t drey_cache_value_bytes(const Drey__Cache__V1__Value *v) {
    switch (v->kind_case) {
    case DREY__CACHE__V1__VALUE__KIND_BYTES_VALUE: return (uint32_t)v->bytes_value.len;
    case DREY__CACHE__V1__VALUE__KIND_STRING_VALUE: return (uint32_t)strlen(v->string_value);
    case DREY__CACHE__V1__VALUE__KIND_INT64_VALUE:
    case DREY__CACHE__V1__VALUE__KIND_DOUBLE_VALUE: return 8;
    case DREY__CACHE__V1__VALUE__KIND_BOOL_VALUE: return 1;
    case DREY__CACHE__V1__VALUE__KIND_JSON_VALUE:
        return (uint32_t)protobuf_c_message_get_packed_size(&v->json_value->base);
    default: return 0;
    }
}

void drey_cache__value_in(const Drey__Cache__V1__Value *v, drey_arena *a, drey_value *out) {
    out->kind = (drey_value_kind)v->kind_case;
    out->data = NULL;
    out->len = 0;
    switch (v->kind_case) {
    case DREY__CACHE__V1__VALUE__KIND_BYTES_VALUE:
        out->data = v->bytes_value.data;
        out->len = (uint32_t)v->bytes_value.len;
        break;
    case DREY__CACHE__V1__VALUE__KIND_STRING_VALUE:
        out->data = (const uint8_t *)v->string_value;
        out->len = (uint32_t)strlen(v->string_value);
        break;
    case DREY__CACHE__V1__VALUE__KIND_INT64_VALUE:
    case DREY__CACHE__V1__VALUE__KIND_DOUBLE_VALUE: {
        uint8_t *buf = drey_arena_alloc(a, 8);
        uint64_t bits;
        if (v->kind_case == DREY__CACHE__V1__VALUE__KIND_INT64_VALUE)
            bits = (uint64_t)v->int64_value;
        else
            memcpy(&bits, &v->double_value, 8);
        drey_bytes_put64(buf, bits);
        out->data = buf;
        out->len = 8;
        break;
    }
    case DREY__CACHE__V1__VALUE__KIND_BOOL_VALUE: {
        uint8_t *buf = drey_arena_alloc(a, 1);
        buf[0] = v->bool_value ? 1 : 0;
        out->data = buf;
        out->len = 1;
        break;
    }
    case DREY__CACHE__V1__VALUE__KIND_JSON_VALUE: {
        size_t n = protobuf_c_message_get_packed_size(&v->json_value->base);
        uint8_t *buf = drey_arena_alloc(a, n);
        protobuf_c_message_pack(&v->json_value->base, buf);
        out->data = buf;
        out->len = (uint32_t)n;
        break;
    }
    default: /* null */
        break;
    }
}

Drey__Cache__V1__Value *drey_cache__value_out(drey_arena *a, const drey_value *v) {
    Drey__Cache__V1__Value *m = drey_arena_alloc(a, sizeof *m);
    drey__cache__v1__value__init(m);
    m->kind_case = (Drey__Cache__V1__Value__KindCase)v->kind;
    switch (v->kind) {
    case DREY_VALUE_BYTES: {
        uint8_t *copy = drey_arena_alloc(a, v->len);
        memcpy(copy, v->data, v->len);
        m->bytes_value.data = copy;
        m->bytes_value.len = v->len;
        break;
    }
    case DREY_VALUE_STRING: m->string_value = drey_arena_strndup(a, (const char *)v->data, v->len); break;
    case DREY_VALUE_INT64: m->int64_value = (int64_t)drey_bytes_get64(v->data); break;
    case DREY_VALUE_DOUBLE: {
        uint64_t bits = drey_bytes_get64(v->data);
        memcpy(&m->double_value, &bits, 8);
        break;
    }
    case DREY_VALUE_BOOL: m->bool_value = v->data[0] != 0; break;
    case DREY_VALUE_JSON:
        m->json_value =
            google__protobuf__struct__unpack(drey_arena_protobuf_allocator(a), v->len, v->data);
        if (m->json_value == NULL) { /* cannot happen: we packed it */
            m->json_value = drey_arena_alloc(a, sizeof *m->json_value);
            google__protobuf__struct__init(m->json_value);
        }
        break;
    case DREY_VALUE_NULL: m->null_value = GOOGLE__PROTOBUF__NULL_VALUE__NULL_VALUE; break;
    }
    return m;
}

int64_t drey_cache__int64_of(const drey_value *v) {
    return (int64_t)drey_bytes_get64(v->data);
}

void drey_cache__int64_value(int64_t n, uint8_t buf[8], drey_value *out) {
    drey_bytes_put64(buf, (uint64_t)n);
    out->kind = DREY_VALUE_INT64;
    out->data = buf;
    out->len = 8;
}

Google__Protobuf__Timestamp *drey_cache__timestamp(drey_arena *a, int64_t ms) {
    if (ms == 0)
        return NULL;
    Google__Protobuf__Timestamp *t = drey_arena_alloc(a, sizeof *t);
    google__protobuf__timestamp__init(t);
    int64_t sec = ms / 1000, rem = ms % 1000;
    if (rem < 0) {
        sec--;
        rem += 1000;
    }
    t->seconds = sec;
    t->nanos = (int32_t)(rem * 1000000);
    return t;
}

Google__Protobuf__Duration *drey_cache__duration(drey_arena *a, int64_t ms) {
    Google__Protobuf__Duration *d = drey_arena_alloc(a, sizeof *d);
    google__protobuf__duration__init(d);
    if (ms < 0)
        ms = 0;
    d->seconds = ms / 1000;
    d->nanos = (int32_t)(ms % 1000) * 1000000;
    return d;
}
