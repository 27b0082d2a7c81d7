/*
 * pbwire — what the files of pbdyn share (pbpool.c, pbenc.c, pbdec.c): the
 * descriptor types, a growing byte buffer the encoder writes the wire
 * format into, and what a field's descriptor says (its JSON name, a map
 * entry, a well-known type). Internal to the CLI.
 */
#ifndef DREY_CLI_PBWIRE_H
#define DREY_CLI_PBWIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pbdyn.h"

typedef Google__Protobuf__FieldDescriptorProto field_t;
typedef Google__Protobuf__DescriptorProto message_t;
#define T(x) GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__TYPE__TYPE_##x

typedef struct buf {
    uint8_t *d;
    size_t n, cap;
} buf;

void drey_pb__put(buf *b, const void *src, size_t n);
void drey_pb__put_varint(buf *b, uint64_t v);
void drey_pb__put_tag(buf *b, int32_t number, int wire);
void drey_pb__put_fixed(buf *b, uint64_t v, size_t n);
/* A length-delimited field: its tag, length and bytes. */
void drey_pb__put_bytes(buf *b, int32_t number, const void *d, size_t n);
/* A varint field: its tag and value. */
void drey_pb__put_varint_field(buf *b, int32_t number, uint64_t v);
/* snake_case as lowerCamelCase (a field's JSON name, a FieldMask path). */
void drey_pb__put_camel(buf *b, const char *snake);

/* Standard or URL-safe base64, padding optional, appended to out; false on
 * another byte. */
bool drey_pb__unbase64(const char *s, buf *out);

/* The field's JSON name: json_name, or the name in lowerCamelCase. */
void drey_pb__json_name(const field_t *f, char *out, size_t cap);
bool drey_pb__is_map_entry(const message_t *m);
const field_t *drey_pb__field(const message_t *m, uint32_t number);
/* Whether type (a leading dot allowed) is the well-known type wkt / one of
 * google.protobuf's wrappers (Int64Value, ...). */
bool drey_pb__type_is(const char *type, const char *wkt);
bool drey_pb__is_wrapper(const char *type);

#endif
