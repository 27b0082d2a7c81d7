/*
 * rpc — protobuf-c messages in gRPC byte buffers, status code names; see
 * include/drey/rpc.h.
 */
#include "drey/rpc.h"

#include <stdbool.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>

grpc_byte_buffer *drey_rpc_pack(const ProtobufCMessage *m) {
    size_t n = protobuf_c_message_get_packed_size(m);
    grpc_slice s = grpc_slice_malloc(n);
    protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

grpc_byte_buffer *drey_rpc_copy(const void *data, size_t len) {
    grpc_slice s = grpc_slice_from_copied_buffer(data, len);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

/* False when the buffer cannot be read; *out is then empty. */
static bool read_all(grpc_byte_buffer *bb, grpc_slice *out) {
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, bb)) {
        *out = grpc_empty_slice();
        return false;
    }
    *out = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    return true;
}

grpc_slice drey_rpc_flatten(grpc_byte_buffer *bb) {
    grpc_slice s;
    read_all(bb, &s);
    return s;
}

ProtobufCMessage *drey_rpc_unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *type, ProtobufCAllocator *a) {
    grpc_slice s;
    if (!read_all(bb, &s))
        return NULL;
    ProtobufCMessage *m = protobuf_c_message_unpack(type, a, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
    grpc_slice_unref(s);
    return m;
}

const char *drey_rpc_code_name(grpc_status_code code) {
    static const char *const names[] = {
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    };
    return (unsigned)code < sizeof names / sizeof names[0] ? names[code] : NULL;
}

void *drey_rpc_field(ProtobufCMessage *m, const char *name, size_t **count) {
    const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(m->descriptor, name);
    if (f == NULL)
        return NULL;
    char *base = (char *)m;
    if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
        *(uint32_t *)(void *)(base + f->quantifier_offset) = f->id;
    if (count != NULL)
        *count = f->label == PROTOBUF_C_LABEL_REPEATED ? (size_t *)(void *)(base + f->quantifier_offset) : NULL;
    return base + f->offset;
}
