/*
 * pbjson — a protobuf-c message as JSON; see include/drey/pbjson.h.
 *
 * The descriptor drives everything (for the readiness details, whose schema
 * lives in admin.proto: the JSON follows it, so the two cannot drift apart).
 */
#include "drey/pbjson.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/log.h"

static void write_string(FILE *out, const char *s) {
    if (s == NULL)
        s = "";
    /* Escaping grows a byte to at most six (\u00XX). */
    size_t cap = strlen(s) * 6 + 1;
    char small[1024], *buf = cap <= sizeof small ? small : drey_xmalloc(cap);
    size_t n = drey_log_json_escape(buf, 0, cap, s);
    fputc('"', out);
    fwrite(buf, 1, n, out);
    fputc('"', out);
    if (buf != small)
        free(buf);
}

/* JSON has no NaN or infinities: the protobuf JSON mapping's strings. */
static void write_double(FILE *out, double v, const char *format) {
    if (isnan(v))
        fputs("\"NaN\"", out);
    else if (isinf(v))
        fputs(v > 0 ? "\"Infinity\"" : "\"-Infinity\"", out);
    else
        fprintf(out, format, v);
}

static void write_name(FILE *out, const char *snake) {
    fputc('"', out);
    bool upper = false;
    for (const char *p = snake; *p != '\0'; p++) {
        if (*p == '_') {
            upper = true;
            continue;
        }
        fputc(upper && *p >= 'a' && *p <= 'z' ? *p - 'a' + 'A' : *p, out);
        upper = false;
    }
    fputs("\":", out);
}

static void write_scalar(FILE *out, const ProtobufCFieldDescriptor *f, const void *v) {
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32: fprintf(out, "%" PRId32, *(const int32_t *)v); break;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32: fprintf(out, "%" PRIu32, *(const uint32_t *)v); break;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64: fprintf(out, "%" PRId64, *(const int64_t *)v); break;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64: fprintf(out, "%" PRIu64, *(const uint64_t *)v); break;
    case PROTOBUF_C_TYPE_FLOAT: write_double(out, (double)*(const float *)v, "%.9g"); break;
    case PROTOBUF_C_TYPE_DOUBLE: write_double(out, *(const double *)v, "%.17g"); break;
    case PROTOBUF_C_TYPE_BOOL: fputs(*(const protobuf_c_boolean *)v ? "true" : "false", out); break;
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumValue *ev =
            protobuf_c_enum_descriptor_get_value((const ProtobufCEnumDescriptor *)f->descriptor, *(const int *)v);
        if (ev != NULL)
            write_string(out, ev->name);
        else
            fprintf(out, "%d", *(const int *)v);
        break;
    }
    case PROTOBUF_C_TYPE_STRING: write_string(out, *(char *const *)v); break;
    case PROTOBUF_C_TYPE_BYTES: fputs("\"\"", out); break; /* never in operator documents */
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *sub = *(ProtobufCMessage *const *)v;
        if (sub == NULL)
            fputs("null", out);
        else
            drey_pbjson_write(out, sub);
        break;
    }
    }
}

static size_t scalar_size(const ProtobufCFieldDescriptor *f) {
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE: return 8;
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_MESSAGE: return sizeof(void *);
    case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
    default: return 4;
    }
}

/* A map field: repeated XxxEntry messages of key (1) and value (2). */
static bool is_map(const ProtobufCFieldDescriptor *f) {
    if (f->type != PROTOBUF_C_TYPE_MESSAGE || f->label != PROTOBUF_C_LABEL_REPEATED)
        return false;
    const ProtobufCMessageDescriptor *d = f->descriptor;
    size_t n = strlen(d->short_name);
    return n > 5 && strcmp(d->short_name + n - 5, "Entry") == 0 && d->n_fields == 2 &&
           strcmp(d->fields[0].name, "key") == 0 && strcmp(d->fields[1].name, "value") == 0;
}

void drey_pbjson_write(FILE *out, const ProtobufCMessage *m) {
    const ProtobufCMessageDescriptor *d = m->descriptor;
    fputc('{', out);
    bool first = true;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const char *base = (const char *)m + f->offset;
        /* A oneof's members share one union: only the set one is there. */
        if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
            *(const uint32_t *)(const void *)((const char *)m + f->quantifier_offset) != f->id)
            continue;
        if (!first)
            fputc(',', out);
        first = false;
        write_name(out, f->name);
        if (f->label != PROTOBUF_C_LABEL_REPEATED) {
            write_scalar(out, f, base);
            continue;
        }
        size_t n = *(const size_t *)(const void *)((const char *)m + f->quantifier_offset);
        const char *items = *(char *const *)(const void *)base;
        bool map = is_map(f);
        fputc(map ? '{' : '[', out);
        for (size_t k = 0; k < n; k++) {
            if (k > 0)
                fputc(',', out);
            const void *item = items + k * scalar_size(f);
            if (map) {
                const ProtobufCMessage *e = *(ProtobufCMessage *const *)item;
                const ProtobufCMessageDescriptor *ed = e->descriptor;
                write_scalar(out, &ed->fields[0], (const char *)e + ed->fields[0].offset);
                fputc(':', out);
                write_scalar(out, &ed->fields[1], (const char *)e + ed->fields[1].offset);
            } else {
                write_scalar(out, f, item);
            }
        }
        fputc(map ? '}' : ']', out);
    }
    fputc('}', out);
}
