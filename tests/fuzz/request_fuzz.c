/*
 * Fuzz target: a request as the server receives it, for every method of
 * every service drey serves (Cache, Admin, Cluster, Health, reflection
 * v1/v1alpha).
 *
 * The first byte picks the method; the rest is the message. It goes through
 * what the server does with bytes from the network before any handler sees
 * them: the depth check for recursive request types (src/server/wire.c),
 * protobuf-c's unpack into a call arena, then the validation stage's wire
 * pass and checks (src/pipeline/validate.c). Small limits put the limit
 * branches within the fuzzer's reach. A reflection request's file name or
 * symbol is then looked up as src/reflect does (src/descriptors).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "drey/admin/v1/admin.pb-c.h"
#include "drey/arena.h"
#include "drey/cache/v1/cache.pb-c.h"
#include "drey/cluster/v1/cluster.pb-c.h"
#include "drey/descriptors.h"
#include "drey/pipeline.h"
#include "drey/status.h"
#include "grpc/health/v1/health.pb-c.h"
#include "grpc/reflection/v1/reflection.pb-c.h"
#include "grpc/reflection/v1alpha/reflection.pb-c.h"
#include "src/server/wire.h"

/* As src/server/server.c's MAX_MESSAGE_DEPTH. */
#define MAX_DEPTH 64

static const ProtobufCServiceDescriptor *const services[] = {
    &drey__cache__v1__cache__descriptor,
    &drey__admin__v1__admin__descriptor,
    &drey__cluster__v1__cluster__descriptor,
    &grpc__health__v1__health__descriptor,
    &grpc__reflection__v1__server_reflection__descriptor,
    &grpc__reflection__v1alpha__server_reflection__descriptor,
};

static const drey_limits limits = {
    .max_cache_name_bytes = 16,
    .max_key_bytes = 32,
    .max_value_bytes = 256,
    .max_batch = 4,
};

static const ProtobufCMessageDescriptor *input_of(uint8_t pick) {
    size_t n = 0;
    for (size_t s = 0; s < sizeof services / sizeof services[0]; s++)
        n += services[s]->n_methods;
    size_t i = pick % n;
    for (size_t s = 0;; s++) {
        if (i < services[s]->n_methods)
            return services[s]->methods[i].input;
        i -= services[s]->n_methods;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1)
        return 0;
    const ProtobufCMessageDescriptor *d = input_of(data[0]);
    data++, size--;
    /* The server checks depth only for types that can nest without bound;
     * checking every type here also fuzzes the walk over the others. */
    bool shallow = drey_server__depth_ok(d, data, size, MAX_DEPTH);
    if (drey_server__type_is_recursive(d) && !shallow)
        return 0;
    char buf[1024];
    drey_arena a;
    drey_arena_init(&a, buf, sizeof buf);
    ProtobufCMessage *m = protobuf_c_message_unpack(d, drey_arena_protobuf_allocator(&a), size, data);
    if (m != NULL) {
        drey_status st;
        drey_status_init(&st);
        bool ok = drey_validate_request(&limits, m, data, size, &a, &st);
        if (ok != drey_status_ok(&st))
            abort(); /* the verdict and the status disagree */
        if (ok && (d == &grpc__reflection__v1__server_reflection_request__descriptor ||
                   d == &grpc__reflection__v1alpha__server_reflection_request__descriptor)) {
            /* v1alpha is read as v1, as src/reflect does. */
            const Grpc__Reflection__V1__ServerReflectionRequest *r =
                (const Grpc__Reflection__V1__ServerReflectionRequest *)protobuf_c_message_unpack(
                    &grpc__reflection__v1__server_reflection_request__descriptor, drey_arena_protobuf_allocator(&a),
                    size, data);
            const drey_descriptors *dd = drey_descriptors_builtin();
            if (r != NULL) {
                switch (r->message_request_case) {
                case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME:
                    (void)drey_descriptors_find_file(dd, r->file_by_filename);
                    break;
                case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL:
                    (void)drey_descriptors_find_symbol(dd, r->file_containing_symbol);
                    break;
                case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_ALL_EXTENSION_NUMBERS_OF_TYPE:
                    (void)drey_descriptors_find_symbol(dd, r->all_extension_numbers_of_type);
                    break;
                default:
                    break;
                }
            }
        }
        /* What a rejection sends back must encode. */
        if (!ok) {
            uint8_t *out;
            size_t out_len;
            drey_status_encode(&st, &a, &out, &out_len);
        }
    }
    drey_arena_destroy(&a);
    return 0;
}
