/*
 * pbenc — JSON to protobuf wire bytes, from the pool's descriptors: the
 * protobuf JSON mapping (a field's JSON or proto name, enums by name or
 * number, 64-bit integers as numbers or strings, bytes in base64, maps,
 * and the well-known types' own JSON forms); see pbdyn.h.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "drey/alloc.h"
#include "pbwire.h"

#define FAIL(...) (snprintf(err, err_cap, __VA_ARGS__), false)

static bool enc_message(drey_pb_pool *p, const char *type, const json_t *j, buf *b, const char *path, char *err,
                        size_t err_cap);

/* A JSON number or a decimal string as an integer in [min, max]. */
static bool json_int(const json_t *v, bool is_signed, int bits, uint64_t *out) {
    if (json_is_integer(v)) {
        json_int_t x = json_integer_value(v);
        if (!is_signed && x < 0)
            return false;
        *out = (uint64_t)x;
    } else if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d != trunc(d) || (!is_signed && d < 0) || fabs(d) > 9.2e18)
            return false;
        *out = is_signed ? (uint64_t)(int64_t)d : (uint64_t)d;
    } else if (json_is_string(v)) {
        const char *s = json_string_value(v);
        char *end;
        errno = 0;
        if (is_signed)
            *out = (uint64_t)strtoll(s, &end, 10);
        else
            *out = s[0] == '-' ? (errno = ERANGE, 0) : strtoull(s, &end, 10);
        if (errno != 0 || end == s || *end != '\0')
            return false;
    } else {
        return false;
    }
    if (bits == 32) {
        int64_t sv = (int64_t)*out;
        if (is_signed ? (sv < INT32_MIN || sv > INT32_MAX) : *out > UINT32_MAX)
            return false;
    }
    return true;
}

static bool json_double(const json_t *v, double *out) {
    if (json_is_number(v)) {
        *out = json_number_value(v);
        return true;
    }
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (strcmp(s, "NaN") == 0)
            *out = NAN;
        else if (strcmp(s, "Infinity") == 0)
            *out = INFINITY;
        else if (strcmp(s, "-Infinity") == 0)
            *out = -INFINITY;
        else {
            char *end;
            *out = strtod(s, &end);
            return end != s && *end == '\0';
        }
        return true;
    }
    return false;
}

/* "1.5s", "-0.25s" -> seconds and nanos of the same sign. */
static bool parse_duration(const char *s, int64_t *secs, int32_t *nanos) {
    size_t n = strlen(s);
    if (n < 2 || s[n - 1] != 's')
        return false;
    bool neg = s[0] == '-';
    const char *q = s + (neg || s[0] == '+');
    char *end;
    errno = 0;
    long long whole = strtoll(q, &end, 10);
    if (errno != 0 || end == q || whole < 0)
        return false;
    long frac = 0;
    if (*end == '.') {
        const char *f = end + 1;
        int digits = 0;
        for (; isdigit((unsigned char)*f) && digits < 9; f++, digits++)
            frac = frac * 10 + (*f - '0');
        if (digits == 0 || isdigit((unsigned char)*f))
            return false;
        for (; digits < 9; digits++)
            frac *= 10;
        end = (char *)f;
    }
    if (end != s + n - 1)
        return false;
    *secs = neg ? -whole : whole;
    *nanos = (int32_t)(neg ? -frac : frac);
    return true;
}

/* RFC 3339: 2026-01-02T03:04:05[.123456789](Z|+01:00). */
static bool parse_timestamp(const char *s, int64_t *secs, int32_t *nanos) {
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    int used = 0;
    if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
               &tm.tm_sec, &used) != 6 || used != 19)
        return false;
    tm.tm_year -= 1900;
    tm.tm_mon -= 1;
    const char *q = s + used;
    long frac = 0;
    if (*q == '.') {
        int digits = 0;
        for (q++; isdigit((unsigned char)*q) && digits < 9; q++, digits++)
            frac = frac * 10 + (*q - '0');
        if (digits == 0 || isdigit((unsigned char)*q))
            return false;
        for (; digits < 9; digits++)
            frac *= 10;
    }
    int64_t offset = 0;
    if (*q == 'Z' || *q == 'z') {
        q++;
    } else if (*q == '+' || *q == '-') {
        int hh, mm, n2 = 0;
        if (sscanf(q + 1, "%2d:%2d%n", &hh, &mm, &n2) != 2 || n2 != 5)
            return false;
        offset = (*q == '+' ? 1 : -1) * (hh * 3600 + mm * 60);
        q += 6;
    } else {
        return false;
    }
    if (*q != '\0')
        return false;
    *secs = (int64_t)timegm(&tm) - offset;
    *nanos = (int32_t)frac;
    return true;
}

static bool enc_value(drey_pb_pool *p, const json_t *v, buf *b, const char *path, char *err, size_t err_cap);

static bool enc_struct(drey_pb_pool *p, const json_t *obj, buf *b, const char *path, char *err, size_t err_cap) {
    if (!json_is_object(obj))
        return FAIL("%s: expected a JSON object (google.protobuf.Struct)", path);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)obj, k, v) {
        buf entry = {0}, val = {0};
        drey_pb__put_bytes(&entry, 1, k, strlen(k));
        if (!enc_value(p, v, &val, path, err, err_cap)) {
            free(entry.d);
            free(val.d);
            return false;
        }
        drey_pb__put_bytes(&entry, 2, val.d, val.n);
        drey_pb__put_bytes(b, 1, entry.d, entry.n);
        free(entry.d);
        free(val.d);
    }
    return true;
}

static bool enc_list(drey_pb_pool *p, const json_t *arr, buf *b, const char *path, char *err, size_t err_cap) {
    if (!json_is_array(arr))
        return FAIL("%s: expected a JSON array (google.protobuf.ListValue)", path);
    for (size_t i = 0; i < json_array_size(arr); i++) {
        buf val = {0};
        if (!enc_value(p, json_array_get(arr, i), &val, path, err, err_cap)) {
            free(val.d);
            return false;
        }
        drey_pb__put_bytes(b, 1, val.d, val.n);
        free(val.d);
    }
    return true;
}

/* google.protobuf.Value: any JSON. */
static bool enc_value(drey_pb_pool *p, const json_t *v, buf *b, const char *path, char *err, size_t err_cap) {
    buf sub = {0};
    bool ok = true;
    switch (json_typeof(v)) {
    case JSON_NULL:
        drey_pb__put_varint_field(b, 1, 0);
        return true;
    case JSON_INTEGER:
    case JSON_REAL:
        drey_pb__put_tag(b, 2, 1);
        double d = json_number_value(v);
        uint64_t bits;
        memcpy(&bits, &d, 8);
        drey_pb__put_fixed(b, bits, 8);
        return true;
    case JSON_STRING: drey_pb__put_bytes(b, 3, json_string_value(v), json_string_length(v)); return true;
    case JSON_TRUE:
    case JSON_FALSE:
        drey_pb__put_varint_field(b, 4, json_is_true(v));
        return true;
    case JSON_OBJECT:
        ok = enc_struct(p, v, &sub, path, err, err_cap);
        if (ok)
            drey_pb__put_bytes(b, 5, sub.d, sub.n);
        break;
    case JSON_ARRAY:
        ok = enc_list(p, v, &sub, path, err, err_cap);
        if (ok)
            drey_pb__put_bytes(b, 6, sub.d, sub.n);
        break;
    }
    free(sub.d);
    return ok;
}

/* Well-known types whose JSON is not an object of their fields; *done
 * false when type is not one of them (or j is its plain object form). */
static bool enc_wkt(drey_pb_pool *p, const char *type, const json_t *j, buf *b, const char *path, bool *done,
                    char *err, size_t err_cap) {
    *done = true;
    int64_t secs;
    int32_t nanos;
    if (drey_pb__type_is(type, "google.protobuf.Timestamp") || drey_pb__type_is(type, "google.protobuf.Duration")) {
        bool ts = drey_pb__type_is(type, "google.protobuf.Timestamp");
        if (!json_is_string(j) ||
            !(ts ? parse_timestamp(json_string_value(j), &secs, &nanos)
                 : parse_duration(json_string_value(j), &secs, &nanos)))
            return FAIL("%s: expected %s", path, ts ? "an RFC 3339 time (2026-01-02T03:04:05Z)" : "a duration (1.5s)");
        if (secs != 0) {
            drey_pb__put_varint_field(b, 1, (uint64_t)secs);
        }
        if (nanos != 0) {
            drey_pb__put_varint_field(b, 2, (uint64_t)(int64_t)nanos);
        }
        return true;
    }
    if (drey_pb__type_is(type, "google.protobuf.Struct"))
        return enc_struct(p, j, b, path, err, err_cap);
    if (drey_pb__type_is(type, "google.protobuf.Value"))
        return enc_value(p, j, b, path, err, err_cap);
    if (drey_pb__type_is(type, "google.protobuf.ListValue"))
        return enc_list(p, j, b, path, err, err_cap);
    if (drey_pb__type_is(type, "google.protobuf.FieldMask")) {
        if (!json_is_string(j))
            return FAIL("%s: expected a field mask (\"a,b.c\")", path);
        const char *s = json_string_value(j);
        while (*s != '\0') {
            const char *comma = strchr(s, ',');
            size_t n = comma != NULL ? (size_t)(comma - s) : strlen(s);
            buf snake = {0};
            for (size_t i = 0; i < n; i++) {
                char c = s[i];
                if (isupper((unsigned char)c)) {
                    char u = '_';
                    drey_pb__put(&snake, &u, 1);
                    c = (char)tolower((unsigned char)c);
                }
                drey_pb__put(&snake, &c, 1);
            }
            drey_pb__put_bytes(b, 1, snake.d, snake.n);
            free(snake.d);
            s += n + (comma != NULL);
        }
        return true;
    }
    if (drey_pb__is_wrapper(type) && !json_is_object(j)) {
        json_t *obj = json_pack("{sO}", "value", j);
        bool ok = enc_message(p, type, obj, b, path, err, err_cap);
        json_decref(obj);
        return ok;
    }
    if (drey_pb__type_is(type, "google.protobuf.Any")) {
        const json_t *t = json_object_get(j, "@type");
        if (!json_is_object(j) || !json_is_string(t))
            return FAIL("%s: an Any needs \"@type\"", path);
        const char *url = json_string_value(t);
        const char *slash = strrchr(url, '/');
        const char *inner = slash != NULL ? slash + 1 : url;
        json_t *copy = json_deep_copy(j);
        json_object_del(copy, "@type");
        const json_t *payload = copy;
        /* A well-known type inside an Any keeps its own JSON under "value". */
        bool special = drey_pb__type_is(inner, "google.protobuf.Timestamp") || drey_pb__type_is(inner, "google.protobuf.Duration") ||
                       drey_pb__type_is(inner, "google.protobuf.Struct") || drey_pb__type_is(inner, "google.protobuf.Value") ||
                       drey_pb__type_is(inner, "google.protobuf.ListValue") || drey_pb__type_is(inner, "google.protobuf.FieldMask") ||
                       drey_pb__is_wrapper(inner);
        if (special && json_object_get(copy, "value") != NULL)
            payload = json_object_get(copy, "value");
        buf sub = {0};
        bool ok = enc_message(p, inner, payload, &sub, path, err, err_cap);
        if (ok) {
            drey_pb__put_bytes(b, 1, url, strlen(url));
            drey_pb__put_bytes(b, 2, sub.d, sub.n);
        }
        free(sub.d);
        json_decref(copy);
        return ok;
    }
    *done = false;
    return true;
}

static bool enc_enum(drey_pb_pool *p, const field_t *f, const json_t *v, uint64_t *out, const char *path, char *err,
                     size_t err_cap) {
    if (json_is_integer(v)) {
        *out = (uint64_t)json_integer_value(v);
        return true;
    }
    const Google__Protobuf__EnumDescriptorProto *e = drey_pb_pool_enum(p, f->type_name);
    if (json_is_string(v) && e != NULL) {
        for (size_t i = 0; i < e->n_value; i++) {
            if (strcmp(e->value[i]->name, json_string_value(v)) == 0) {
                *out = (uint64_t)(int64_t)e->value[i]->number;
                return true;
            }
        }
    }
    return FAIL("%s: not a value of %s", path, f->type_name);
}

/* One value of field f (an element, for a repeated one). */
static bool enc_field(drey_pb_pool *p, const field_t *f, const json_t *v, buf *b, const char *path, char *err,
                      size_t err_cap) {
    uint64_t u;
    double d;
    switch (f->type) {
    case T(DOUBLE):
    case T(FLOAT):
        if (!json_double(v, &d))
            return FAIL("%s: expected a number", path);
        if (f->type == T(DOUBLE)) {
            drey_pb__put_tag(b, f->number, 1);
            memcpy(&u, &d, 8);
            drey_pb__put_fixed(b, u, 8);
        } else {
            float x = (float)d;
            uint32_t bits;
            memcpy(&bits, &x, 4);
            drey_pb__put_tag(b, f->number, 5);
            drey_pb__put_fixed(b, bits, 4);
        }
        return true;
    case T(INT64):
    case T(SINT64):
    case T(SFIXED64):
    case T(INT32):
    case T(SINT32):
    case T(SFIXED32):
    case T(UINT64):
    case T(FIXED64):
    case T(UINT32):
    case T(FIXED32): {
        bool sgn = f->type == T(INT64) || f->type == T(SINT64) || f->type == T(SFIXED64) || f->type == T(INT32) ||
                   f->type == T(SINT32) || f->type == T(SFIXED32);
        bool b32 = f->type == T(INT32) || f->type == T(SINT32) || f->type == T(SFIXED32) || f->type == T(UINT32) ||
                   f->type == T(FIXED32);
        if (!json_int(v, sgn, b32 ? 32 : 64, &u))
            return FAIL("%s: expected a%s %d-bit integer", path, sgn ? "" : "n unsigned", b32 ? 32 : 64);
        if (f->type == T(SINT64) || f->type == T(SINT32)) {
            int64_t s = (int64_t)u;
            u = ((uint64_t)s << 1) ^ (uint64_t)(s >> 63);
        }
        if (f->type == T(SFIXED64) || f->type == T(FIXED64)) {
            drey_pb__put_tag(b, f->number, 1);
            drey_pb__put_fixed(b, u, 8);
        } else if (f->type == T(SFIXED32) || f->type == T(FIXED32)) {
            drey_pb__put_tag(b, f->number, 5);
            drey_pb__put_fixed(b, u, 4);
        } else {
            drey_pb__put_varint_field(b, f->number, u);
        }
        return true;
    }
    case T(BOOL):
        if (!json_is_boolean(v))
            return FAIL("%s: expected true or false", path);
        drey_pb__put_varint_field(b, f->number, json_is_true(v));
        return true;
    case T(ENUM):
        if (!enc_enum(p, f, v, &u, path, err, err_cap))
            return false;
        drey_pb__put_varint_field(b, f->number, u);
        return true;
    case T(STRING):
        if (!json_is_string(v))
            return FAIL("%s: expected a string", path);
        drey_pb__put_bytes(b, f->number, json_string_value(v), json_string_length(v));
        return true;
    case T(BYTES): {
        buf raw = {0};
        if (!json_is_string(v) || !drey_pb__unbase64(json_string_value(v), &raw)) {
            free(raw.d);
            return FAIL("%s: expected base64 bytes", path);
        }
        drey_pb__put_bytes(b, f->number, raw.d, raw.n);
        free(raw.d);
        return true;
    }
    case T(MESSAGE): {
        buf sub = {0};
        bool ok = enc_message(p, f->type_name, v, &sub, path, err, err_cap);
        if (ok)
            drey_pb__put_bytes(b, f->number, sub.d, sub.n);
        free(sub.d);
        return ok;
    }
    default: return FAIL("%s: groups are not supported", path);
    }
}

static bool enc_message(drey_pb_pool *p, const char *type, const json_t *j, buf *b, const char *path, char *err,
                        size_t err_cap) {
    bool done;
    if (!enc_wkt(p, type, j, b, path, &done, err, err_cap))
        return false;
    if (done)
        return true;
    const message_t *m = drey_pb_pool_message(p, type);
    if (m == NULL)
        return FAIL("%s: unknown message type %s", path, type);
    if (!json_is_object(j))
        return FAIL("%s: expected a JSON object (%s)", path, type[0] == '.' ? type + 1 : type);
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)j, k, v) {
        const field_t *f = NULL;
        char jn[256];
        for (size_t i = 0; i < m->n_field && f == NULL; i++) {
            drey_pb__json_name(m->field[i], jn, sizeof jn);
            if (strcmp(jn, k) == 0 || strcmp(m->field[i]->name, k) == 0)
                f = m->field[i];
        }
        char sub[512];
        snprintf(sub, sizeof sub, "%s%s%s", path, path[0] ? "." : "", k);
        if (f == NULL)
            return FAIL("%s: %s has no field %s", sub, m->name, k);
        if (json_is_null(v) && !(f->type == T(MESSAGE) && drey_pb__type_is(f->type_name, "google.protobuf.Value")))
            continue;
        const message_t *entry = f->type == T(MESSAGE) ? drey_pb_pool_message(p, f->type_name) : NULL;
        if (f->label == GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__LABEL__LABEL_REPEATED && drey_pb__is_map_entry(entry)) {
            if (!json_is_object(v))
                return FAIL("%s: expected a JSON object (a map)", sub);
            const field_t *kf = drey_pb__field(entry, 1), *vf = drey_pb__field(entry, 2);
            const char *mk;
            json_t *mv;
            json_object_foreach(v, mk, mv) {
                buf e = {0};
                json_t *key = kf->type == T(STRING) ? json_string(mk) : json_string(mk);
                if (kf->type == T(BOOL)) {
                    json_decref(key);
                    key = json_boolean(strcmp(mk, "true") == 0);
                }
                bool ok = enc_field(p, kf, key, &e, sub, err, err_cap) && enc_field(p, vf, mv, &e, sub, err, err_cap);
                json_decref(key);
                if (ok)
                    drey_pb__put_bytes(b, f->number, e.d, e.n);
                free(e.d);
                if (!ok)
                    return false;
            }
        } else if (f->label == GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__LABEL__LABEL_REPEATED) {
            if (!json_is_array(v))
                return FAIL("%s: expected a JSON array", sub);
            for (size_t i = 0; i < json_array_size(v); i++) {
                char el[560];
                snprintf(el, sizeof el, "%s[%zu]", sub, i);
                if (!enc_field(p, f, json_array_get(v, i), b, el, err, err_cap))
                    return false;
            }
        } else if (!enc_field(p, f, v, b, sub, err, err_cap)) {
            return false;
        }
    }
    return true;
}

bool drey_pb_from_json(drey_pb_pool *p, const char *type, const json_t *j, uint8_t **out, size_t *len, char *err,
                       size_t err_cap) {
    buf b = {0};
    if (!enc_message(p, type, j, &b, "", err, err_cap)) {
        free(b.d);
        return false;
    }
    *out = b.d != NULL ? b.d : drey_xmalloc(1);
    *len = b.n;
    return true;
}

