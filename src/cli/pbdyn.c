/*
 * pbdyn — JSON <-> protobuf wire bytes from descriptors; see pbdyn.h.
 *
 * The wire format is written and read here directly (tags, varints,
 * length-delimited fields): protobuf-c can only encode the types it was
 * compiled with, and `drey call` must handle types it first meets through
 * reflection.
 */
#include "pbdyn.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "drey/alloc.h"

typedef Google__Protobuf__FieldDescriptorProto field_t;
typedef Google__Protobuf__DescriptorProto message_t;
#define T(x) GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__TYPE__TYPE_##x

enum { SYM_MESSAGE, SYM_ENUM, SYM_SERVICE };

typedef struct sym {
    char *name; /* full, no leading dot */
    int kind;
    const void *desc;
    size_t file;
} sym;

struct drey_pb_pool {
    Google__Protobuf__FileDescriptorProto **files;
    size_t n_files, cap_files;
    sym *syms;
    size_t n_syms, cap_syms;
    drey_pb_resolver resolve;
    void *ctx;
};

/* --- the pool ----------------------------------------------------------------- */

drey_pb_pool *drey_pb_pool_new(drey_pb_resolver resolve, void *ctx) {
    drey_pb_pool *p = drey_xcalloc(1, sizeof *p);
    p->resolve = resolve;
    p->ctx = ctx;
    return p;
}

void drey_pb_pool_free(drey_pb_pool *p) {
    if (p == NULL)
        return;
    for (size_t i = 0; i < p->n_files; i++)
        google__protobuf__file_descriptor_proto__free_unpacked(p->files[i], NULL);
    for (size_t i = 0; i < p->n_syms; i++)
        free(p->syms[i].name);
    free(p->files);
    free(p->syms);
    free(p);
}

static void add_sym(drey_pb_pool *p, const char *scope, const char *name, int kind, const void *desc, size_t file) {
    if (p->n_syms == p->cap_syms) {
        p->cap_syms = p->cap_syms ? 2 * p->cap_syms : 64;
        p->syms = drey_xrealloc(p->syms, p->cap_syms, sizeof *p->syms);
    }
    size_t n = strlen(scope) + strlen(name) + 2;
    char *full = drey_xmalloc(n);
    snprintf(full, n, "%s%s%s", scope, scope[0] ? "." : "", name);
    p->syms[p->n_syms++] = (sym){.name = full, .kind = kind, .desc = desc, .file = file};
}

static void index_message(drey_pb_pool *p, const char *scope, const message_t *m, size_t file) {
    add_sym(p, scope, m->name, SYM_MESSAGE, m, file);
    const char *full = p->syms[p->n_syms - 1].name;
    char *mine = drey_xstrdup(full); /* syms may move */
    for (size_t i = 0; i < m->n_nested_type; i++)
        index_message(p, mine, m->nested_type[i], file);
    for (size_t i = 0; i < m->n_enum_type; i++)
        add_sym(p, mine, m->enum_type[i]->name, SYM_ENUM, m->enum_type[i], file);
    free(mine);
}

bool drey_pb_pool_has_file(const drey_pb_pool *p, const char *name) {
    for (size_t i = 0; i < p->n_files; i++)
        if (strcmp(p->files[i]->name, name) == 0)
            return true;
    return false;
}

const Google__Protobuf__FileDescriptorProto *drey_pb_pool_file_at(const drey_pb_pool *p, size_t i) {
    return i < p->n_files ? p->files[i] : NULL;
}

bool drey_pb_pool_add_file(drey_pb_pool *p, const uint8_t *data, size_t len) {
    Google__Protobuf__FileDescriptorProto *f = google__protobuf__file_descriptor_proto__unpack(NULL, len, data);
    if (f == NULL || f->name == NULL)
        return f == NULL ? false : (google__protobuf__file_descriptor_proto__free_unpacked(f, NULL), false);
    if (drey_pb_pool_has_file(p, f->name)) {
        google__protobuf__file_descriptor_proto__free_unpacked(f, NULL);
        return true;
    }
    if (p->n_files == p->cap_files) {
        p->cap_files = p->cap_files ? 2 * p->cap_files : 16;
        p->files = drey_xrealloc(p->files, p->cap_files, sizeof *p->files);
    }
    size_t fi = p->n_files;
    p->files[p->n_files++] = f;
    const char *pkg = f->package != NULL ? f->package : "";
    for (size_t i = 0; i < f->n_message_type; i++)
        index_message(p, pkg, f->message_type[i], fi);
    for (size_t i = 0; i < f->n_enum_type; i++)
        add_sym(p, pkg, f->enum_type[i]->name, SYM_ENUM, f->enum_type[i], fi);
    for (size_t i = 0; i < f->n_service; i++)
        add_sym(p, pkg, f->service[i]->name, SYM_SERVICE, f->service[i], fi);
    return true;
}

static const sym *find_sym(drey_pb_pool *p, const char *name, int kind) {
    if (name[0] == '.')
        name++;
    for (int attempt = 0; attempt < 2; attempt++) {
        for (size_t i = 0; i < p->n_syms; i++)
            if (p->syms[i].kind == kind && strcmp(p->syms[i].name, name) == 0)
                return &p->syms[i];
        if (attempt == 0 && (p->resolve == NULL || !p->resolve(p->ctx, p, name)))
            break;
    }
    return NULL;
}

const message_t *drey_pb_pool_message(drey_pb_pool *p, const char *name) {
    const sym *s = find_sym(p, name, SYM_MESSAGE);
    return s != NULL ? s->desc : NULL;
}

const Google__Protobuf__EnumDescriptorProto *drey_pb_pool_enum(drey_pb_pool *p, const char *name) {
    const sym *s = find_sym(p, name, SYM_ENUM);
    return s != NULL ? s->desc : NULL;
}

const Google__Protobuf__ServiceDescriptorProto *drey_pb_pool_service(drey_pb_pool *p, const char *name) {
    const sym *s = find_sym(p, name, SYM_SERVICE);
    return s != NULL ? s->desc : NULL;
}

const Google__Protobuf__FileDescriptorProto *drey_pb_pool_file_of(drey_pb_pool *p, const char *name) {
    for (int k = SYM_MESSAGE; k <= SYM_SERVICE; k++) {
        const char *n = name[0] == '.' ? name + 1 : name;
        for (size_t i = 0; i < p->n_syms; i++)
            if (p->syms[i].kind == k && strcmp(p->syms[i].name, n) == 0)
                return p->files[p->syms[i].file];
    }
    return NULL;
}

/* --- helpers ------------------------------------------------------------------ */

typedef struct buf {
    uint8_t *d;
    size_t n, cap;
} buf;

static void put(buf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = b->n + n > 2 * b->cap ? b->n + n + 64 : 2 * b->cap;
        b->d = drey_xrealloc(b->d, b->cap, 1);
    }
    if (n > 0)
        memcpy(b->d + b->n, src, n);
    b->n += n;
}

static void put_varint(buf *b, uint64_t v) {
    uint8_t tmp[10];
    size_t n = 0;
    do {
        tmp[n] = (uint8_t)(v & 0x7f);
        v >>= 7;
        if (v != 0)
            tmp[n] |= 0x80;
        n++;
    } while (v != 0);
    put(b, tmp, n);
}

static void put_tag(buf *b, int32_t number, int wire) {
    put_varint(b, (uint64_t)number << 3 | (uint64_t)wire);
}

static void put_fixed(buf *b, uint64_t v, size_t n) {
    uint8_t tmp[8];
    for (size_t i = 0; i < n; i++)
        tmp[i] = (uint8_t)(v >> (8 * i));
    put(b, tmp, n);
}

static void put_bytes_field(buf *b, int32_t number, const void *d, size_t n) {
    put_tag(b, number, 2);
    put_varint(b, n);
    put(b, d, n);
}

static const char B64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *base64(const uint8_t *d, size_t n) {
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

/* Standard or URL-safe base64, padding optional; false on another byte. */
static bool unbase64(const char *s, buf *out) {
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
            put(out, &byte, 1);
        }
    }
    return true;
}

static void json_name_of(const field_t *f, char *out, size_t cap) {
    if (f->json_name != NULL && f->json_name[0] != '\0') {
        snprintf(out, cap, "%s", f->json_name);
        return;
    }
    size_t j = 0;
    bool up = false;
    for (const char *s = f->name; *s != '\0' && j + 1 < cap; s++) {
        if (*s == '_') {
            up = true;
            continue;
        }
        out[j++] = up ? (char)toupper((unsigned char)*s) : *s;
        up = false;
    }
    out[j] = '\0';
}

static bool is_map_entry(const message_t *m) {
    return m != NULL && m->options != NULL && m->options->has_map_entry && m->options->map_entry;
}

static const field_t *field_by_number(const message_t *m, uint32_t number) {
    for (size_t i = 0; i < m->n_field; i++)
        if (m->field[i]->has_number && (uint32_t)m->field[i]->number == number)
            return m->field[i];
    return NULL;
}

static bool type_is(const char *type, const char *wkt) {
    if (type[0] == '.')
        type++;
    return strcmp(type, wkt) == 0;
}

static bool is_wrapper(const char *type) {
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

#define FAIL(...) (snprintf(err, err_cap, __VA_ARGS__), false)

/* --- JSON -> wire -------------------------------------------------------------- */

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
        put_bytes_field(&entry, 1, k, strlen(k));
        if (!enc_value(p, v, &val, path, err, err_cap)) {
            free(entry.d);
            free(val.d);
            return false;
        }
        put_bytes_field(&entry, 2, val.d, val.n);
        put_bytes_field(b, 1, entry.d, entry.n);
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
        put_bytes_field(b, 1, val.d, val.n);
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
        put_tag(b, 1, 0);
        put_varint(b, 0);
        return true;
    case JSON_INTEGER:
    case JSON_REAL:
        put_tag(b, 2, 1);
        double d = json_number_value(v);
        uint64_t bits;
        memcpy(&bits, &d, 8);
        put_fixed(b, bits, 8);
        return true;
    case JSON_STRING: put_bytes_field(b, 3, json_string_value(v), json_string_length(v)); return true;
    case JSON_TRUE:
    case JSON_FALSE:
        put_tag(b, 4, 0);
        put_varint(b, json_is_true(v));
        return true;
    case JSON_OBJECT:
        ok = enc_struct(p, v, &sub, path, err, err_cap);
        if (ok)
            put_bytes_field(b, 5, sub.d, sub.n);
        break;
    case JSON_ARRAY:
        ok = enc_list(p, v, &sub, path, err, err_cap);
        if (ok)
            put_bytes_field(b, 6, sub.d, sub.n);
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
    if (type_is(type, "google.protobuf.Timestamp") || type_is(type, "google.protobuf.Duration")) {
        bool ts = type_is(type, "google.protobuf.Timestamp");
        if (!json_is_string(j) ||
            !(ts ? parse_timestamp(json_string_value(j), &secs, &nanos)
                 : parse_duration(json_string_value(j), &secs, &nanos)))
            return FAIL("%s: expected %s", path, ts ? "an RFC 3339 time (2026-01-02T03:04:05Z)" : "a duration (1.5s)");
        if (secs != 0) {
            put_tag(b, 1, 0);
            put_varint(b, (uint64_t)secs);
        }
        if (nanos != 0) {
            put_tag(b, 2, 0);
            put_varint(b, (uint64_t)(int64_t)nanos);
        }
        return true;
    }
    if (type_is(type, "google.protobuf.Struct"))
        return enc_struct(p, j, b, path, err, err_cap);
    if (type_is(type, "google.protobuf.Value"))
        return enc_value(p, j, b, path, err, err_cap);
    if (type_is(type, "google.protobuf.ListValue"))
        return enc_list(p, j, b, path, err, err_cap);
    if (type_is(type, "google.protobuf.FieldMask")) {
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
                    put(&snake, &u, 1);
                    c = (char)tolower((unsigned char)c);
                }
                put(&snake, &c, 1);
            }
            put_bytes_field(b, 1, snake.d, snake.n);
            free(snake.d);
            s += n + (comma != NULL);
        }
        return true;
    }
    if (is_wrapper(type) && !json_is_object(j)) {
        json_t *obj = json_pack("{sO}", "value", j);
        bool ok = enc_message(p, type, obj, b, path, err, err_cap);
        json_decref(obj);
        return ok;
    }
    if (type_is(type, "google.protobuf.Any")) {
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
        bool special = type_is(inner, "google.protobuf.Timestamp") || type_is(inner, "google.protobuf.Duration") ||
                       type_is(inner, "google.protobuf.Struct") || type_is(inner, "google.protobuf.Value") ||
                       type_is(inner, "google.protobuf.ListValue") || type_is(inner, "google.protobuf.FieldMask") ||
                       is_wrapper(inner);
        if (special && json_object_get(copy, "value") != NULL)
            payload = json_object_get(copy, "value");
        buf sub = {0};
        bool ok = enc_message(p, inner, payload, &sub, path, err, err_cap);
        if (ok) {
            put_bytes_field(b, 1, url, strlen(url));
            put_bytes_field(b, 2, sub.d, sub.n);
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
            put_tag(b, f->number, 1);
            memcpy(&u, &d, 8);
            put_fixed(b, u, 8);
        } else {
            float x = (float)d;
            uint32_t bits;
            memcpy(&bits, &x, 4);
            put_tag(b, f->number, 5);
            put_fixed(b, bits, 4);
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
            put_tag(b, f->number, 1);
            put_fixed(b, u, 8);
        } else if (f->type == T(SFIXED32) || f->type == T(FIXED32)) {
            put_tag(b, f->number, 5);
            put_fixed(b, u, 4);
        } else {
            put_tag(b, f->number, 0);
            put_varint(b, u);
        }
        return true;
    }
    case T(BOOL):
        if (!json_is_boolean(v))
            return FAIL("%s: expected true or false", path);
        put_tag(b, f->number, 0);
        put_varint(b, json_is_true(v));
        return true;
    case T(ENUM):
        if (!enc_enum(p, f, v, &u, path, err, err_cap))
            return false;
        put_tag(b, f->number, 0);
        put_varint(b, u);
        return true;
    case T(STRING):
        if (!json_is_string(v))
            return FAIL("%s: expected a string", path);
        put_bytes_field(b, f->number, json_string_value(v), json_string_length(v));
        return true;
    case T(BYTES): {
        buf raw = {0};
        if (!json_is_string(v) || !unbase64(json_string_value(v), &raw)) {
            free(raw.d);
            return FAIL("%s: expected base64 bytes", path);
        }
        put_bytes_field(b, f->number, raw.d, raw.n);
        free(raw.d);
        return true;
    }
    case T(MESSAGE): {
        buf sub = {0};
        bool ok = enc_message(p, f->type_name, v, &sub, path, err, err_cap);
        if (ok)
            put_bytes_field(b, f->number, sub.d, sub.n);
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
            json_name_of(m->field[i], jn, sizeof jn);
            if (strcmp(jn, k) == 0 || strcmp(m->field[i]->name, k) == 0)
                f = m->field[i];
        }
        char sub[512];
        snprintf(sub, sizeof sub, "%s%s%s", path, path[0] ? "." : "", k);
        if (f == NULL)
            return FAIL("%s: %s has no field %s", sub, m->name, k);
        if (json_is_null(v) && !(f->type == T(MESSAGE) && type_is(f->type_name, "google.protobuf.Value")))
            continue;
        const message_t *entry = f->type == T(MESSAGE) ? drey_pb_pool_message(p, f->type_name) : NULL;
        if (f->label == GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__LABEL__LABEL_REPEATED && is_map_entry(entry)) {
            if (!json_is_object(v))
                return FAIL("%s: expected a JSON object (a map)", sub);
            const field_t *kf = field_by_number(entry, 1), *vf = field_by_number(entry, 2);
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
                    put_bytes_field(b, f->number, e.d, e.n);
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

/* --- wire -> JSON -------------------------------------------------------------- */

typedef struct reader {
    const uint8_t *d;
    size_t n, at;
} reader;

static bool get_varint(reader *r, uint64_t *v) {
    *v = 0;
    for (int shift = 0; shift < 64 && r->at < r->n; shift += 7) {
        uint8_t byte = r->d[r->at++];
        *v |= (uint64_t)(byte & 0x7f) << shift;
        if ((byte & 0x80) == 0)
            return true;
    }
    return false;
}

static bool get_fixed(reader *r, size_t n, uint64_t *v) {
    if (r->n - r->at < n)
        return false;
    *v = 0;
    for (size_t i = 0; i < n; i++)
        *v |= (uint64_t)r->d[r->at + i] << (8 * i);
    r->at += n;
    return true;
}

/* The next field: its number, wire type and value (a varint or fixed in
 * *v; a length-delimited one in *sub). */
static bool next_field(reader *r, uint32_t *number, int *wire, uint64_t *v, reader *sub) {
    uint64_t tag;
    if (!get_varint(r, &tag) || (tag >> 3) == 0 || (tag >> 3) > 0x1fffffff)
        return false;
    *number = (uint32_t)(tag >> 3);
    *wire = (int)(tag & 7);
    switch (*wire) {
    case 0: return get_varint(r, v);
    case 1: return get_fixed(r, 8, v);
    case 5: return get_fixed(r, 4, v);
    case 2:
        if (!get_varint(r, v) || *v > r->n - r->at)
            return false;
        *sub = (reader){.d = r->d + r->at, .n = (size_t)*v};
        r->at += (size_t)*v;
        return true;
    default: return false; /* groups */
    }
}

static json_t *dec_message(drey_pb_pool *p, const char *type, reader r, char *err, size_t err_cap);

static json_t *jstr(const uint8_t *d, size_t n) {
    json_t *s = json_stringn((const char *)d, n);
    return s != NULL ? s : json_stringn_nocheck((const char *)d, n);
}

static json_t *dec_double(double d) {
    if (isnan(d))
        return json_string("NaN");
    if (isinf(d))
        return json_string(d > 0 ? "Infinity" : "-Infinity");
    return json_real(d);
}

/* One scalar of field f from a varint or fixed value. */
static json_t *dec_scalar(drey_pb_pool *p, const field_t *f, uint64_t v) {
    char tmp[32];
    switch (f->type) {
    case T(DOUBLE): {
        double d;
        memcpy(&d, &v, 8);
        return dec_double(d);
    }
    case T(FLOAT): {
        uint32_t bits = (uint32_t)v;
        float x;
        memcpy(&x, &bits, 4);
        return dec_double(x);
    }
    case T(INT64):
    case T(SFIXED64): snprintf(tmp, sizeof tmp, "%" PRId64, (int64_t)v); return json_string(tmp);
    case T(UINT64):
    case T(FIXED64): snprintf(tmp, sizeof tmp, "%" PRIu64, v); return json_string(tmp);
    case T(SINT64):
        snprintf(tmp, sizeof tmp, "%" PRId64, (int64_t)(v >> 1) ^ -(int64_t)(v & 1));
        return json_string(tmp);
    case T(INT32):
    case T(SFIXED32): return json_integer((int32_t)v);
    case T(SINT32): return json_integer((int32_t)((uint32_t)(v >> 1) ^ -(uint32_t)(v & 1)));
    case T(UINT32):
    case T(FIXED32): return json_integer((uint32_t)v);
    case T(BOOL): return json_boolean(v != 0);
    case T(ENUM): {
        const Google__Protobuf__EnumDescriptorProto *e = drey_pb_pool_enum(p, f->type_name);
        for (size_t i = 0; e != NULL && i < e->n_value; i++)
            if ((int32_t)e->value[i]->number == (int32_t)v)
                return json_string(e->value[i]->name);
        return json_integer((int32_t)v);
    }
    default: return json_null();
    }
}

static bool packable(const field_t *f) {
    return f->type != T(STRING) && f->type != T(BYTES) && f->type != T(MESSAGE) && f->type != T(GROUP);
}

static int wire_of(const field_t *f) {
    switch (f->type) {
    case T(DOUBLE):
    case T(FIXED64):
    case T(SFIXED64): return 1;
    case T(FLOAT):
    case T(FIXED32):
    case T(SFIXED32): return 5;
    case T(STRING):
    case T(BYTES):
    case T(MESSAGE): return 2;
    default: return 0;
    }
}

/* A length-delimited value of f: a string, bytes or a message. */
static json_t *dec_delimited(drey_pb_pool *p, const field_t *f, reader sub, char *err, size_t err_cap) {
    if (f->type == T(STRING))
        return jstr(sub.d, sub.n);
    if (f->type == T(BYTES)) {
        char *s = base64(sub.d, sub.n);
        json_t *j = json_string(s);
        free(s);
        return j;
    }
    return dec_message(p, f->type_name, sub, err, err_cap);
}

static json_t *dec_wkt(drey_pb_pool *p, const char *type, reader r, bool *done, char *err, size_t err_cap);

/* A map key as JSON writes it: always a string. */
static char *map_key(const json_t *k) {
    if (json_is_string(k))
        return drey_xstrdup(json_string_value(k));
    char tmp[32];
    if (json_is_integer(k))
        snprintf(tmp, sizeof tmp, "%" JSON_INTEGER_FORMAT, json_integer_value(k));
    else
        snprintf(tmp, sizeof tmp, "%s", json_is_true(k) ? "true" : "false");
    return drey_xstrdup(tmp);
}

static json_t *dec_message_plain(drey_pb_pool *p, const message_t *m, reader r, char *err, size_t err_cap);

static json_t *dec_message(drey_pb_pool *p, const char *type, reader r, char *err, size_t err_cap) {
    bool done;
    json_t *w = dec_wkt(p, type, r, &done, err, err_cap);
    if (done)
        return w;
    const message_t *m = drey_pb_pool_message(p, type);
    if (m == NULL) {
        snprintf(err, err_cap, "unknown message type %s", type[0] == '.' ? type + 1 : type);
        return NULL;
    }
    return dec_message_plain(p, m, r, err, err_cap);
}

static json_t *dec_message_plain(drey_pb_pool *p, const message_t *m, reader r, char *err, size_t err_cap) {
    json_t *obj = json_object();
    uint32_t number;
    int wire;
    uint64_t v;
    reader sub;
    while (r.at < r.n) {
        if (!next_field(&r, &number, &wire, &v, &sub)) {
            snprintf(err, err_cap, "the bytes are not a valid %s", m->name);
            json_decref(obj);
            return NULL;
        }
        const field_t *f = field_by_number(m, number);
        if (f == NULL)
            continue; /* unknown: skipped, as the JSON mapping does */
        char name[256];
        json_name_of(f, name, sizeof name);
        bool repeated = f->label == GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__LABEL__LABEL_REPEATED;
        const message_t *entry = f->type == T(MESSAGE) && repeated ? drey_pb_pool_message(p, f->type_name) : NULL;
        if (is_map_entry(entry) && wire == 2) {
            json_t *map = json_object_get(obj, name);
            if (map == NULL)
                json_object_set_new(obj, name, map = json_object());
            const field_t *kf = field_by_number(entry, 1), *vf = field_by_number(entry, 2);
            json_t *key = NULL, *val = NULL;
            uint32_t en;
            int ew;
            uint64_t ev;
            reader es;
            while (sub.at < sub.n && next_field(&sub, &en, &ew, &ev, &es)) {
                const field_t *ef = en == 1 ? kf : en == 2 ? vf : NULL;
                if (ef == NULL)
                    continue;
                json_t *x = ew == 2 ? dec_delimited(p, ef, es, err, err_cap) : dec_scalar(p, ef, ev);
                if (x == NULL) {
                    json_decref(key);
                    json_decref(val);
                    json_decref(obj);
                    return NULL;
                }
                json_decref(en == 1 ? key : val);
                *(en == 1 ? &key : &val) = x;
            }
            char *ks = key != NULL ? map_key(key) : drey_xstrdup("");
            json_object_set_new(map, ks, val != NULL ? val : json_null());
            free(ks);
            json_decref(key);
            continue;
        }
        json_t *x;
        if (wire == 2 && packable(f)) { /* packed repeated scalars */
            json_t *arr = json_object_get(obj, name);
            if (arr == NULL)
                json_object_set_new(obj, name, arr = json_array());
            while (sub.at < sub.n) {
                uint64_t e;
                int ew = wire_of(f);
                if (!(ew == 0 ? get_varint(&sub, &e) : get_fixed(&sub, ew == 1 ? 8 : 4, &e))) {
                    snprintf(err, err_cap, "the bytes are not a valid %s", m->name);
                    json_decref(obj);
                    return NULL;
                }
                json_array_append_new(arr, dec_scalar(p, f, e));
            }
            continue;
        }
        if ((wire == 2) != (wire_of(f) == 2)) {
            snprintf(err, err_cap, "field %s of %s has the wrong wire type", f->name, m->name);
            json_decref(obj);
            return NULL;
        }
        x = wire == 2 ? dec_delimited(p, f, sub, err, err_cap) : dec_scalar(p, f, v);
        if (x == NULL) {
            json_decref(obj);
            return NULL;
        }
        if (repeated) {
            json_t *arr = json_object_get(obj, name);
            if (arr == NULL)
                json_object_set_new(obj, name, arr = json_array());
            json_array_append_new(arr, x);
        } else {
            json_object_set_new(obj, name, x);
        }
    }
    return obj;
}

/* Fields 1 and 2 of a Timestamp or Duration. */
static bool secs_nanos(reader r, int64_t *secs, int32_t *nanos) {
    *secs = 0;
    *nanos = 0;
    uint32_t n;
    int w;
    uint64_t v;
    reader sub;
    while (r.at < r.n) {
        if (!next_field(&r, &n, &w, &v, &sub) || w != 0)
            return false;
        if (n == 1)
            *secs = (int64_t)v;
        else if (n == 2)
            *nanos = (int32_t)v;
    }
    return true;
}

static void frac9(char *out, size_t cap, int32_t nanos) {
    /* 0, 3, 6 or 9 digits, as the JSON mapping writes them. */
    if (nanos == 0)
        out[0] = '\0';
    else if (nanos % 1000000 == 0)
        snprintf(out, cap, ".%03d", nanos / 1000000);
    else if (nanos % 1000 == 0)
        snprintf(out, cap, ".%06d", nanos / 1000);
    else
        snprintf(out, cap, ".%09d", nanos);
}

static json_t *dec_value(drey_pb_pool *p, reader r, char *err, size_t err_cap);

static json_t *dec_struct(drey_pb_pool *p, reader r, char *err, size_t err_cap) {
    json_t *obj = json_object();
    uint32_t n;
    int w;
    uint64_t v;
    reader entry;
    while (r.at < r.n) {
        if (!next_field(&r, &n, &w, &v, &entry) || w != 2) {
            json_decref(obj);
            snprintf(err, err_cap, "the bytes are not a valid google.protobuf.Struct");
            return NULL;
        }
        char *key = NULL;
        json_t *val = NULL;
        uint32_t en;
        int ew;
        uint64_t ev;
        reader es;
        while (entry.at < entry.n && next_field(&entry, &en, &ew, &ev, &es)) {
            if (en == 1 && ew == 2) {
                free(key);
                key = drey_xmalloc(es.n + 1);
                memcpy(key, es.d, es.n);
                key[es.n] = '\0';
            } else if (en == 2 && ew == 2) {
                json_decref(val);
                val = dec_value(p, es, err, err_cap);
            }
        }
        json_object_set_new(obj, key != NULL ? key : "", val != NULL ? val : json_null());
        free(key);
    }
    return obj;
}

static json_t *dec_value(drey_pb_pool *p, reader r, char *err, size_t err_cap) {
    json_t *out = json_null();
    uint32_t n;
    int w;
    uint64_t v;
    reader sub;
    while (r.at < r.n) {
        if (!next_field(&r, &n, &w, &v, &sub)) {
            json_decref(out);
            snprintf(err, err_cap, "the bytes are not a valid google.protobuf.Value");
            return NULL;
        }
        json_t *x = NULL;
        if (n == 1)
            x = json_null();
        else if (n == 2 && w == 1) {
            double d;
            memcpy(&d, &v, 8);
            x = dec_double(d);
        } else if (n == 3 && w == 2)
            x = jstr(sub.d, sub.n);
        else if (n == 4 && w == 0)
            x = json_boolean(v != 0);
        else if (n == 5 && w == 2)
            x = dec_struct(p, sub, err, err_cap);
        else if (n == 6 && w == 2) {
            x = json_array();
            uint32_t ln;
            int lw;
            uint64_t lv;
            reader ls;
            while (sub.at < sub.n && next_field(&sub, &ln, &lw, &lv, &ls))
                if (ln == 1 && lw == 2)
                    json_array_append_new(x, dec_value(p, ls, err, err_cap));
        }
        if (x != NULL) {
            json_decref(out);
            out = x;
        }
    }
    return out;
}

static json_t *dec_wkt(drey_pb_pool *p, const char *type, reader r, bool *done, char *err, size_t err_cap) {
    *done = true;
    int64_t secs;
    int32_t nanos;
    char frac[16], tb[64];
    if (type_is(type, "google.protobuf.Timestamp") || type_is(type, "google.protobuf.Duration")) {
        if (!secs_nanos(r, &secs, &nanos)) {
            snprintf(err, err_cap, "the bytes are not a valid %s", type);
            return NULL;
        }
        if (type_is(type, "google.protobuf.Duration")) {
            bool neg = secs < 0 || nanos < 0;
            frac9(frac, sizeof frac, nanos < 0 ? -nanos : nanos);
            snprintf(tb, sizeof tb, "%s%" PRId64 "%ss", neg ? "-" : "", secs < 0 ? -secs : secs, frac);
            return json_string(tb);
        }
        time_t t = (time_t)secs;
        struct tm tm;
        gmtime_r(&t, &tm);
        size_t n = strftime(tb, sizeof tb, "%Y-%m-%dT%H:%M:%S", &tm);
        frac9(frac, sizeof frac, nanos);
        snprintf(tb + n, sizeof tb - n, "%sZ", frac);
        return json_string(tb);
    }
    if (type_is(type, "google.protobuf.Struct"))
        return dec_struct(p, r, err, err_cap);
    if (type_is(type, "google.protobuf.Value"))
        return dec_value(p, r, err, err_cap);
    if (type_is(type, "google.protobuf.ListValue")) {
        json_t *x = json_array();
        uint32_t ln;
        int lw;
        uint64_t lv;
        reader ls;
        while (r.at < r.n && next_field(&r, &ln, &lw, &lv, &ls))
            if (ln == 1 && lw == 2)
                json_array_append_new(x, dec_value(p, ls, err, err_cap));
        return x;
    }
    if (is_wrapper(type) || type_is(type, "google.protobuf.FieldMask")) {
        json_t *obj = NULL;
        *done = false;
        const message_t *m = drey_pb_pool_message(p, type);
        if (m == NULL)
            return NULL; /* decoded as an unknown type by the caller */
        *done = true;
        obj = dec_message_plain(p, m, r, err, err_cap);
        if (obj == NULL)
            return NULL;
        json_t *x;
        if (is_wrapper(type)) {
            x = json_object_get(obj, "value");
            if (x == NULL) { /* the default, not on the wire */
                const field_t *f = field_by_number(m, 1);
                x = f->type == T(STRING) || f->type == T(BYTES) ? json_string("")
                    : f->type == T(BOOL)                          ? json_false()
                    : f->type == T(INT64) || f->type == T(UINT64) ? json_string("0")
                                                                  : json_integer(0);
            } else {
                json_incref(x);
            }
        } else {
            buf joined = {0};
            json_t *paths = json_object_get(obj, "paths");
            for (size_t i = 0; i < json_array_size(paths); i++) {
                if (i > 0)
                    put(&joined, ",", 1);
                bool up = false;
                for (const char *c = json_string_value(json_array_get(paths, i)); c != NULL && *c; c++) {
                    if (*c == '_') {
                        up = true;
                        continue;
                    }
                    char ch = up ? (char)toupper((unsigned char)*c) : *c;
                    up = false;
                    put(&joined, &ch, 1);
                }
            }
            x = json_stringn(joined.d != NULL ? (const char *)joined.d : "", joined.n);
            free(joined.d);
        }
        json_decref(obj);
        return x;
    }
    if (type_is(type, "google.protobuf.Any")) {
        char *url = NULL;
        reader payload = {0};
        uint32_t n;
        int w;
        uint64_t v;
        reader sub;
        while (r.at < r.n && next_field(&r, &n, &w, &v, &sub)) {
            if (n == 1 && w == 2) {
                free(url);
                url = drey_xmalloc(sub.n + 1);
                memcpy(url, sub.d, sub.n);
                url[sub.n] = '\0';
            } else if (n == 2 && w == 2) {
                payload = sub;
            }
        }
        json_t *obj = json_object();
        json_object_set_new(obj, "@type", json_string(url != NULL ? url : ""));
        const char *slash = url != NULL ? strrchr(url, '/') : NULL;
        const char *inner = slash != NULL ? slash + 1 : url != NULL ? url : "";
        char ignored[256];
        json_t *body = inner[0] != '\0' ? dec_message(p, inner, payload, ignored, sizeof ignored) : NULL;
        if (json_is_object(body) && !type_is(inner, "google.protobuf.Struct")) {
            json_object_update(obj, body);
        } else if (body != NULL) {
            json_object_set(obj, "value", body);
        } else { /* a type nobody describes: its bytes */
            char *b64 = base64(payload.d, payload.n);
            json_object_set_new(obj, "value", json_string(b64));
            free(b64);
        }
        json_decref(body);
        free(url);
        return obj;
    }
    *done = false;
    return NULL;
}

json_t *drey_pb_to_json(drey_pb_pool *p, const char *type, const uint8_t *data, size_t len, char *err,
                        size_t err_cap) {
    return dec_message(p, type, (reader){.d = data, .n = len}, err, err_cap);
}
