/*
 * pbdec — protobuf wire bytes to JSON, from the pool's descriptors: what
 * the message carries (a proto3 field at its default is not on the wire,
 * so not printed), 64-bit integers as strings, enums by name, unknown
 * fields skipped, the well-known types in their own JSON forms; see
 * pbdyn.h.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "drey/alloc.h"
#include "pbwire.h"

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

/* One field of a message on the wire. */
typedef struct wire_field {
    uint32_t number;
    int wire;   /* 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32 */
    uint64_t v; /* a varint's or fixed's value */
    reader sub; /* a length-delimited one's bytes */
} wire_field;

/* The next field of r; false when the bytes are not one. */
static bool next_field(reader *r, wire_field *f) {
    uint64_t tag;
    if (!get_varint(r, &tag) || (tag >> 3) == 0 || (tag >> 3) > 0x1fffffff)
        return false;
    f->number = (uint32_t)(tag >> 3);
    f->wire = (int)(tag & 7);
    switch (f->wire) {
    case 0: return get_varint(r, &f->v);
    case 1: return get_fixed(r, 8, &f->v);
    case 5: return get_fixed(r, 4, &f->v);
    case 2:
        if (!get_varint(r, &f->v) || f->v > r->n - r->at)
            return false;
        f->sub = (reader){.d = r->d + r->at, .n = (size_t)f->v};
        r->at += (size_t)f->v;
        return true;
    default: return false; /* groups */
    }
}

/* The next field of r while there are bytes left (false at the end or on
 * bytes that are not a field: a lenient read for what nests in a field). */
static bool next_in(reader *r, wire_field *f) {
    return r->at < r->n && next_field(r, f);
}

/* A length-delimited field's bytes as a string (the caller frees it). */
static char *string_of(reader sub) {
    return drey_xstrndup((const char *)sub.d, sub.n);
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
        char *s = drey_pb_base64(sub.d, sub.n);
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
    wire_field w;
    while (r.at < r.n) {
        if (!next_field(&r, &w)) {
            snprintf(err, err_cap, "the bytes are not a valid %s", m->name);
            json_decref(obj);
            return NULL;
        }
        const field_t *f = drey_pb__field(m, w.number);
        if (f == NULL)
            continue; /* unknown: skipped, as the JSON mapping does */
        char name[256];
        drey_pb__json_name(f, name, sizeof name);
        bool repeated = f->label == GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__LABEL__LABEL_REPEATED;
        const message_t *entry = f->type == T(MESSAGE) && repeated ? drey_pb_pool_message(p, f->type_name) : NULL;
        if (drey_pb__is_map_entry(entry) && w.wire == 2) {
            json_t *map = json_object_get(obj, name);
            if (map == NULL)
                json_object_set_new(obj, name, map = json_object());
            const field_t *kf = drey_pb__field(entry, 1), *vf = drey_pb__field(entry, 2);
            json_t *key = NULL, *val = NULL;
            wire_field ew;
            while (next_in(&w.sub, &ew)) {
                uint32_t en = ew.number;
                const field_t *ef = en == 1 ? kf : en == 2 ? vf : NULL;
                if (ef == NULL)
                    continue;
                json_t *x = ew.wire == 2 ? dec_delimited(p, ef, ew.sub, err, err_cap) : dec_scalar(p, ef, ew.v);
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
        if (w.wire == 2 && packable(f)) { /* packed repeated scalars */
            json_t *arr = json_object_get(obj, name);
            if (arr == NULL)
                json_object_set_new(obj, name, arr = json_array());
            while (w.sub.at < w.sub.n) {
                uint64_t e;
                int ew = wire_of(f);
                if (!(ew == 0 ? get_varint(&w.sub, &e) : get_fixed(&w.sub, ew == 1 ? 8 : 4, &e))) {
                    snprintf(err, err_cap, "the bytes are not a valid %s", m->name);
                    json_decref(obj);
                    return NULL;
                }
                json_array_append_new(arr, dec_scalar(p, f, e));
            }
            continue;
        }
        if ((w.wire == 2) != (wire_of(f) == 2)) {
            snprintf(err, err_cap, "field %s of %s has the wrong wire type", f->name, m->name);
            json_decref(obj);
            return NULL;
        }
        x = w.wire == 2 ? dec_delimited(p, f, w.sub, err, err_cap) : dec_scalar(p, f, w.v);
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
    wire_field w;
    while (r.at < r.n) {
        if (!next_field(&r, &w) || w.wire != 0)
            return false;
        if (w.number == 1)
            *secs = (int64_t)w.v;
        else if (w.number == 2)
            *nanos = (int32_t)w.v;
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

/* A google.protobuf.ListValue: its values (field 1). */
static json_t *dec_list(drey_pb_pool *p, reader r, char *err, size_t err_cap) {
    json_t *x = json_array();
    wire_field w;
    while (next_in(&r, &w))
        if (w.number == 1 && w.wire == 2)
            json_array_append_new(x, dec_value(p, w.sub, err, err_cap));
    return x;
}

static json_t *dec_struct(drey_pb_pool *p, reader r, char *err, size_t err_cap) {
    json_t *obj = json_object();
    wire_field w;
    while (r.at < r.n) {
        if (!next_field(&r, &w) || w.wire != 2) {
            json_decref(obj);
            snprintf(err, err_cap, "the bytes are not a valid google.protobuf.Struct");
            return NULL;
        }
        char *key = NULL;
        json_t *val = NULL;
        wire_field ew;
        while (next_in(&w.sub, &ew)) {
            if (ew.number == 1 && ew.wire == 2) {
                free(key);
                key = string_of(ew.sub);
            } else if (ew.number == 2 && ew.wire == 2) {
                json_decref(val);
                val = dec_value(p, ew.sub, err, err_cap);
            }
        }
        json_object_set_new(obj, key != NULL ? key : "", val != NULL ? val : json_null());
        free(key);
    }
    return obj;
}

static json_t *dec_value(drey_pb_pool *p, reader r, char *err, size_t err_cap) {
    json_t *out = json_null();
    wire_field w;
    while (r.at < r.n) {
        if (!next_field(&r, &w)) {
            json_decref(out);
            snprintf(err, err_cap, "the bytes are not a valid google.protobuf.Value");
            return NULL;
        }
        json_t *x = NULL;
        uint32_t n = w.number;
        if (n == 1)
            x = json_null();
        else if (n == 2 && w.wire == 1) {
            double d;
            memcpy(&d, &w.v, 8);
            x = dec_double(d);
        } else if (n == 3 && w.wire == 2)
            x = jstr(w.sub.d, w.sub.n);
        else if (n == 4 && w.wire == 0)
            x = json_boolean(w.v != 0);
        else if (n == 5 && w.wire == 2)
            x = dec_struct(p, w.sub, err, err_cap);
        else if (n == 6 && w.wire == 2)
            x = dec_list(p, w.sub, err, err_cap);
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
    if (drey_pb__type_is(type, "google.protobuf.Timestamp") || drey_pb__type_is(type, "google.protobuf.Duration")) {
        if (!secs_nanos(r, &secs, &nanos)) {
            snprintf(err, err_cap, "the bytes are not a valid %s", type);
            return NULL;
        }
        if (drey_pb__type_is(type, "google.protobuf.Duration")) {
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
    if (drey_pb__type_is(type, "google.protobuf.Struct"))
        return dec_struct(p, r, err, err_cap);
    if (drey_pb__type_is(type, "google.protobuf.Value"))
        return dec_value(p, r, err, err_cap);
    if (drey_pb__type_is(type, "google.protobuf.ListValue"))
        return dec_list(p, r, err, err_cap);
    if (drey_pb__is_wrapper(type) || drey_pb__type_is(type, "google.protobuf.FieldMask")) {
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
        if (drey_pb__is_wrapper(type)) {
            x = json_object_get(obj, "value");
            if (x == NULL) { /* the default, not on the wire */
                const field_t *f = drey_pb__field(m, 1);
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
                    drey_pb__put(&joined, ",", 1);
                const char *path = json_string_value(json_array_get(paths, i));
                drey_pb__put_camel(&joined, path != NULL ? path : "");
            }
            x = json_stringn(joined.d != NULL ? (const char *)joined.d : "", joined.n);
            free(joined.d);
        }
        json_decref(obj);
        return x;
    }
    if (drey_pb__type_is(type, "google.protobuf.Any")) {
        char *url = NULL;
        reader payload = {0};
        wire_field w;
        while (next_in(&r, &w)) {
            if (w.number == 1 && w.wire == 2) {
                free(url);
                url = string_of(w.sub);
            } else if (w.number == 2 && w.wire == 2) {
                payload = w.sub;
            }
        }
        json_t *obj = json_object();
        json_object_set_new(obj, "@type", json_string(url != NULL ? url : ""));
        const char *slash = url != NULL ? strrchr(url, '/') : NULL;
        const char *inner = slash != NULL ? slash + 1 : url != NULL ? url : "";
        char ignored[256];
        json_t *body = inner[0] != '\0' ? dec_message(p, inner, payload, ignored, sizeof ignored) : NULL;
        if (json_is_object(body) && !drey_pb__type_is(inner, "google.protobuf.Struct")) {
            json_object_update(obj, body);
        } else if (body != NULL) {
            json_object_set(obj, "value", body);
        } else { /* a type nobody describes: its bytes */
            char *b64 = drey_pb_base64(payload.d, payload.n);
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

json_t *drey_pb_message_json(drey_pb_pool *p, const ProtobufCMessage *m) {
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *b = drey_xmalloc(n ? n : 1);
    protobuf_c_message_pack(m, b);
    char err[256];
    json_t *j = drey_pb_to_json(p, m->descriptor->name, b, n, err, sizeof err);
    free(b);
    return j != NULL ? j : json_object();
}

