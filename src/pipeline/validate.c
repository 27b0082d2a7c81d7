/*
 * validate — stage 1: is the request well-formed and within limits?
 *
 * The rules are keyed by field name and type, not by method: every request
 * of drey.cache.v1 with a `cache` field gets the cache-name rule, every `key`
 * the key rule, every Value the value rules, every `entries` or `keys` the
 * batch limit. A new method with the usual field names is validated without
 * a line here.
 *
 * Two passes. The wire pass walks the encoded bytes, because protobuf-c
 * neither checks that strings are UTF-8 nor keeps strings with an embedded
 * NUL intact (a key "a\0b" would silently become "a"). The field pass walks
 * the decoded message. Field paths follow google.rpc.BadRequest: proto
 * names, `entries[3].key`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/bytes.h"
#include "drey/cache.h"
#include "drey/cache/v1/cache.pb-c.h"
#include "drey/pipeline.h"
#include "google/protobuf/duration.pb-c.h"
#include "google/protobuf/timestamp.pb-c.h"
#include "stages.h"

#define CACHE_PACKAGE "drey.cache.v1"
#define MAX_WIRE_DEPTH 64

/* Timestamp's valid range: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59Z. */
#define TIMESTAMP_MIN_SECONDS (-62135596800LL)
#define TIMESTAMP_MAX_SECONDS 253402300799LL

bool drey_validate_key(const char *key, size_t len, size_t max_len) {
    if (len == 0 || len > max_len || !drey_bytes_utf8_valid((const uint8_t *)key, len))
        return false;
    const uint8_t *p = (const uint8_t *)key;
    for (size_t i = 0; i < len; i++) {
        /* C0 controls, DEL, and C1 controls (U+0080..U+009F, encoded C2 80..C2 9F). */
        if (p[i] < 0x20 || p[i] == 0x7f)
            return false;
        if (p[i] == 0xc2 && i + 1 < len && p[i + 1] >= 0x80 && p[i + 1] <= 0x9f)
            return false;
    }
    return true;
}

bool drey_validate_cache_name(const char *name, size_t len, size_t max_len) {
    if (len == 0 || len > max_len)
        return false;
    if ((len == 1 && name[0] == '.') || (len == 2 && name[0] == '.' && name[1] == '.'))
        return false;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                  c == '_' || c == '-';
        if (!ok)
            return false;
    }
    return true;
}

/* --- wire pass ------------------------------------------------------------ */

typedef struct walk {
    drey_status *st;
    char path[96];
    size_t plen;
} walk;

static size_t push(walk *w, const char *name, long index) {
    size_t mark = w->plen;
    int n = index >= 0 ? snprintf(w->path + w->plen, sizeof w->path - w->plen, "%s%s[%ld]", w->plen ? "." : "",
                                  name, index)
                       : snprintf(w->path + w->plen, sizeof w->path - w->plen, "%s%s", w->plen ? "." : "", name);
    if (n > 0)
        w->plen = w->plen + (size_t)n < sizeof w->path ? w->plen + (size_t)n : sizeof w->path - 1;
    return mark;
}

static void pop(walk *w, size_t mark) {
    w->plen = mark;
    w->path[mark] = '\0';
}

static drey_error string_reason(const char *name, bool in_value) {
    if (in_value)
        return DREY_ERR_INVALID_VALUE;
    if (strcmp(name, "key") == 0 || strcmp(name, "keys") == 0)
        return DREY_ERR_INVALID_KEY;
    if (strcmp(name, "cache") == 0)
        return DREY_ERR_INVALID_CACHE_NAME;
    if (strcmp(name, "request_id") == 0)
        return DREY_ERR_INVALID_REQUEST_ID;
    return DREY_ERR_MALFORMED_REQUEST;
}

/* Checks every string field under d for UTF-8 without NUL. The encoding is
 * already known to be well-formed: protobuf-c unpacked it. */
static void wire_strings(walk *w, const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t len, bool in_value,
                         int depth) {
    if (depth > MAX_WIRE_DEPTH)
        return;
    uint32_t counts[64] = {0}; /* occurrences of repeated fields, for [i] */
    const uint8_t *end = p + len;
    in_value |= d == &drey__cache__v1__value__descriptor;
    while (p < end) {
        uint64_t key, n;
        if (!drey_bytes_varint(&p, end, &key))
            return;
        switch (key & 7) {
        case 0:
            if (!drey_bytes_varint(&p, end, &n))
                return;
            continue;
        case 1: p += 8; continue;
        case 5: p += 4; continue;
        case 2: break;
        default: return;
        }
        if (!drey_bytes_varint(&p, end, &n) || n > (uint64_t)(end - p))
            return;
        const ProtobufCFieldDescriptor *fd =
            key >> 3 <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3)) : NULL;
        if (fd != NULL && (fd->type == PROTOBUF_C_TYPE_STRING || fd->type == PROTOBUF_C_TYPE_MESSAGE)) {
            size_t fi = (size_t)(fd - d->fields);
            long index = -1;
            if (fd->label == PROTOBUF_C_LABEL_REPEATED && fi < 64)
                index = (long)counts[fi]++;
            size_t mark = push(w, fd->name, index);
            if (fd->type == PROTOBUF_C_TYPE_STRING) {
                if (!drey_bytes_utf8_valid(p, (size_t)n) || memchr(p, 0, (size_t)n) != NULL)
                    drey_status_add_violation(w->st, string_reason(fd->name, in_value), "%s", w->path);
            } else {
                wire_strings(w, fd->descriptor, p, (size_t)n, in_value, depth + 1);
            }
            pop(w, mark);
        }
        p += n;
    }
}

/* --- field pass ----------------------------------------------------------- */

typedef struct checker {
    const drey_limits *lim;
    drey_arena *arena;
    walk w;
} checker;

static const void *member(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *fd) {
    return (const char *)m + fd->offset;
}

static bool present(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *fd) {
    if (fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
        return *(const uint32_t *)(const void *)((const char *)m + fd->quantifier_offset) == fd->id;
    if (fd->type == PROTOBUF_C_TYPE_MESSAGE && fd->label != PROTOBUF_C_LABEL_REPEATED)
        return *(void *const *)member(m, fd) != NULL;
    return true;
}

static void violation(checker *c, drey_error e, const char *name, long index) {
    size_t mark = push(&c->w, name, index);
    drey_status_add_violation(c->w.st, e, "%s", c->w.path);
    pop(&c->w, mark);
}

static void check_value(checker *c, const Drey__Cache__V1__Value *v, const char *name) {
    if (v->kind_case == DREY__CACHE__V1__VALUE__KIND__NOT_SET) {
        violation(c, DREY_ERR_INVALID_VALUE, name, -1);
        return;
    }
    if (drey_cache_value_bytes(v) > c->lim->max_value_bytes) {
        if (c->w.st->error == DREY_ERR_NONE)
            drey_status_add_metadata(c->w.st, "limitBytes", "%zu", c->lim->max_value_bytes);
        violation(c, DREY_ERR_PAYLOAD_TOO_LARGE, name, -1);
    }
}

static bool duration_ok(const Google__Protobuf__Duration *d) {
    if (d->nanos <= -1000000000 || d->nanos >= 1000000000)
        return false;
    if ((d->seconds > 0 && d->nanos < 0) || (d->seconds < 0 && d->nanos > 0))
        return false;
    /* Positive, and at most DREY_MAX_TTL_MS. */
    if (d->seconds < 0 || (d->seconds == 0 && d->nanos <= 0))
        return false;
    return d->seconds < DREY_MAX_TTL_MS / 1000 || (d->seconds == DREY_MAX_TTL_MS / 1000 && d->nanos == 0);
}

static bool timestamp_ok(const Google__Protobuf__Timestamp *t) {
    return t->nanos >= 0 && t->nanos < 1000000000 && t->seconds >= TIMESTAMP_MIN_SECONDS &&
           t->seconds <= TIMESTAMP_MAX_SECONDS;
}

typedef struct keyed {
    const char *key;
    size_t index;
} keyed;

static int keyed_cmp(const void *a, const void *b) {
    const keyed *x = a, *y = b;
    int r = strcmp(x->key, y->key);
    if (r != 0)
        return r;
    return x->index < y->index ? -1 : x->index > y->index;
}

static void check_message(checker *c, const ProtobufCMessage *m);

static void check_batch_entries(checker *c, const ProtobufCFieldDescriptor *fd, ProtobufCMessage *const *items,
                                size_t n) {
    keyed *keys = drey_arena_alloc(c->arena, (n ? n : 1) * sizeof *keys);
    size_t n_keys = 0;
    for (size_t i = 0; i < n; i++) {
        size_t mark = push(&c->w, fd->name, (long)i);
        check_message(c, items[i]);
        pop(&c->w, mark);
        const ProtobufCFieldDescriptor *kf =
            protobuf_c_message_descriptor_get_field_by_name(items[i]->descriptor, "key");
        if (kf != NULL && kf->type == PROTOBUF_C_TYPE_STRING) {
            keys[n_keys].key = *(char *const *)member(items[i], kf);
            keys[n_keys].index = i;
            n_keys++;
        }
    }
    qsort(keys, n_keys, sizeof *keys, keyed_cmp);
    for (size_t i = 1; i < n_keys; i++) {
        if (strcmp(keys[i - 1].key, keys[i].key) == 0) {
            size_t mark = push(&c->w, fd->name, (long)keys[i].index);
            violation(c, DREY_ERR_DUPLICATE_KEY, "key", -1);
            pop(&c->w, mark);
        }
    }
}

static void check_batch_size(checker *c, const char *name, size_t n) {
    if (n > c->lim->max_batch) {
        if (c->w.st->error == DREY_ERR_NONE)
            drey_status_add_metadata(c->w.st, "limitItems", "%zu", c->lim->max_batch);
        violation(c, DREY_ERR_BATCH_TOO_LARGE, name, -1);
    }
}

static void check_string(checker *c, const char *name, const char *s, long index) {
    size_t len = strlen(s);
    if (strcmp(name, "cache") == 0) {
        if (len > 0 && !drey_validate_cache_name(s, len, c->lim->max_cache_name_bytes))
            violation(c, DREY_ERR_INVALID_CACHE_NAME, name, index);
    } else if (strcmp(name, "key") == 0 || strcmp(name, "keys") == 0) {
        if (!drey_validate_key(s, len, c->lim->max_key_bytes))
            violation(c, DREY_ERR_INVALID_KEY, name, index);
    } else if (strcmp(name, "request_id") == 0) {
        if (len > DREY_MAX_REQUEST_ID_BYTES)
            violation(c, DREY_ERR_INVALID_REQUEST_ID, name, index);
    }
}

static void check_message(checker *c, const ProtobufCMessage *m) {
    const ProtobufCMessageDescriptor *d = m->descriptor;
    if (strcmp(d->package_name, CACHE_PACKAGE) != 0)
        return;
    for (unsigned f = 0; f < d->n_fields; f++) {
        const ProtobufCFieldDescriptor *fd = &d->fields[f];
        bool is_value = fd->type == PROTOBUF_C_TYPE_MESSAGE && fd->descriptor == &drey__cache__v1__value__descriptor;
        if (!present(m, fd)) {
            /* Every request field of type Value is required, and so is a
             * ttl that is not one choice among several (Touch's). */
            if (is_value)
                violation(c, DREY_ERR_INVALID_VALUE, fd->name, -1);
            else if (fd->type == PROTOBUF_C_TYPE_MESSAGE && fd->descriptor == &google__protobuf__duration__descriptor &&
                     !(fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF))
                violation(c, DREY_ERR_INVALID_EXPIRATION, fd->name, -1);
            continue;
        }
        if (fd->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(const void *)((const char *)m + fd->quantifier_offset);
            const void *items = *(void *const *)member(m, fd);
            if (strcmp(fd->name, "keys") == 0 || strcmp(fd->name, "entries") == 0)
                check_batch_size(c, fd->name, n);
            if (fd->type == PROTOBUF_C_TYPE_STRING) {
                for (size_t i = 0; i < n; i++)
                    check_string(c, fd->name, ((char *const *)items)[i], (long)i);
            } else if (fd->type == PROTOBUF_C_TYPE_MESSAGE) {
                check_batch_entries(c, fd, items, n);
            }
            continue;
        }
        if (fd->type == PROTOBUF_C_TYPE_STRING) {
            check_string(c, fd->name, *(char *const *)member(m, fd), -1);
        } else if (is_value) {
            check_value(c, *(Drey__Cache__V1__Value *const *)member(m, fd), fd->name);
        } else if (fd->type == PROTOBUF_C_TYPE_MESSAGE) {
            const ProtobufCMessage *sub = *(ProtobufCMessage *const *)member(m, fd);
            if (fd->descriptor == &google__protobuf__duration__descriptor) {
                if (!duration_ok((const Google__Protobuf__Duration *)sub))
                    violation(c, DREY_ERR_INVALID_EXPIRATION, fd->name, -1);
            } else if (fd->descriptor == &google__protobuf__timestamp__descriptor) {
                if (!timestamp_ok((const Google__Protobuf__Timestamp *)sub))
                    violation(c, DREY_ERR_INVALID_EXPIRATION, fd->name, -1);
            } else {
                size_t mark = push(&c->w, fd->name, -1);
                check_message(c, sub);
                pop(&c->w, mark);
            }
        }
    }
}

bool drey_validate_request(const drey_limits *lim, const ProtobufCMessage *msg, const uint8_t *wire, size_t wire_len,
                           drey_arena *arena, drey_status *st) {
    walk w = {.st = st};
    if (wire != NULL)
        wire_strings(&w, msg->descriptor, wire, wire_len, false, 0);
    if (!drey_status_ok(st))
        return false; /* decoded strings may be cut at a NUL: check no further */
    checker c = {.lim = lim, .arena = arena, .w = {.st = st}};
    check_message(&c, msg);
    return drey_status_ok(st);
}

drey_stage_result drey_pipeline__validate(drey_pipeline *p, drey_request *r) {
    drey_status *st = drey_arena_alloc(r->arena, sizeof *st);
    drey_status_init(st);
    if (drey_validate_request(drey_pipeline__limits(p), r->msg, r->bytes, r->len, r->arena, st))
        return DREY_STAGE_NEXT;
    r->status = st;
    return DREY_STAGE_REJECT;
}
