/*
 * pbdyn — protobuf messages known only by their descriptors (what a server's
 * reflection sends), to and from JSON in the protobuf JSON mapping: what
 * `drey call` needs to call any method, as grpcurl does.
 *
 * A pool holds FileDescriptorProtos and indexes their messages, enums and
 * services by full name. JSON -> wire accepts a field's JSON name or its
 * proto name, enums by name or number, 64-bit integers as numbers or
 * strings, bytes as base64, and the well-known types' JSON forms (Timestamp,
 * Duration, Struct, Value, ListValue, wrappers, Empty, FieldMask, Any with
 * "@type"). Wire -> JSON writes what the message carries (a proto3 field at
 * its default is not on the wire, and not printed; a oneof member always
 * is), 64-bit integers as strings, enums by name, unknown fields skipped.
 * A type the pool lacks (an Any's payload) is asked of the resolver.
 */
#ifndef DREY_CLI_PBDYN_H
#define DREY_CLI_PBDYN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "google/protobuf/descriptor.pb-c.h"

typedef struct drey_pb_pool drey_pb_pool;

/* Adds the files that define symbol (a full name, no leading dot) to the
 * pool; false when it cannot. */
typedef bool (*drey_pb_resolver)(void *ctx, drey_pb_pool *pool, const char *symbol);

drey_pb_pool *drey_pb_pool_new(drey_pb_resolver resolve, void *ctx);
void drey_pb_pool_free(drey_pb_pool *p);

/* A serialized FileDescriptorProto; a file already there is ignored. False
 * when the bytes do not decode. */
bool drey_pb_pool_add_file(drey_pb_pool *p, const uint8_t *data, size_t len);
bool drey_pb_pool_has_file(const drey_pb_pool *p, const char *name);
/* The i-th file added; NULL past the last. */
const Google__Protobuf__FileDescriptorProto *drey_pb_pool_file_at(const drey_pb_pool *p, size_t i);

/* By full name (a leading dot is accepted); NULL when unknown (after asking
 * the resolver). */
const Google__Protobuf__DescriptorProto *drey_pb_pool_message(drey_pb_pool *p, const char *name);
const Google__Protobuf__EnumDescriptorProto *drey_pb_pool_enum(drey_pb_pool *p, const char *name);
const Google__Protobuf__ServiceDescriptorProto *drey_pb_pool_service(drey_pb_pool *p, const char *name);
/* The file that defines the symbol (message, enum, service), or NULL. */
const Google__Protobuf__FileDescriptorProto *drey_pb_pool_file_of(drey_pb_pool *p, const char *name);

/* JSON -> the wire bytes of message type (malloc'd in *out); false with a
 * message in err naming the field. */
bool drey_pb_from_json(drey_pb_pool *p, const char *type, const json_t *j, uint8_t **out, size_t *len, char *err,
                       size_t err_cap);

/* Wire bytes of message type -> JSON (a new reference); NULL with a message
 * in err when they do not decode as that type. */
json_t *drey_pb_to_json(drey_pb_pool *p, const char *type, const uint8_t *data, size_t len, char *err,
                        size_t err_cap);

/* A pool of the descriptor set built into drey (the one dreyd serves). */
drey_pb_pool *drey_pb_pool_builtin(void);

/* A message of a type the pool knows, as JSON (an empty object when it
 * does not decode). */
json_t *drey_pb_message_json(drey_pb_pool *p, const ProtobufCMessage *m);

/* d in standard base64 with padding (the caller frees it). */
char *drey_pb_base64(const uint8_t *d, size_t n);

#endif
