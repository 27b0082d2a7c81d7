/*
 * reflect — server reflection; see include/drey/reflect.h.
 *
 * v1alpha is wire-identical to v1 (same fields, same numbers), so the
 * v1alpha handler re-reads its request as v1, answers with the v1 logic, and
 * the bytes it sends are a valid v1alpha response.
 */
#include "drey/reflect.h"

#include <string.h>

#include "drey/descriptors.h"
#include "grpc/reflection/v1/reflection.pb-c.h"
#include "grpc/reflection/v1alpha/reflection.pb-c.h"

typedef Grpc__Reflection__V1__ServerReflectionRequest request;
typedef Grpc__Reflection__V1__ServerReflectionResponse response;

/* gRPC status codes used in error_response. */
enum { CODE_INVALID_ARGUMENT = 3, CODE_NOT_FOUND = 5 };

static void set_error(drey_arena *a, response *resp, int code, const char *message) {
    Grpc__Reflection__V1__ErrorResponse *e = drey_arena_alloc(a, sizeof *e);
    grpc__reflection__v1__error_response__init(e);
    e->error_code = code;
    e->error_message = (char *)message;
    resp->message_response_case = GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE;
    resp->error_response = e;
}

/* The file and everything it imports, transitively, each once. */
static void set_files(drey_arena *a, response *resp, const drey_descriptors *d, size_t file) {
    size_t n_files = drey_descriptors_file_count(d);
    size_t *order = drey_arena_alloc(a, n_files * sizeof *order);
    bool *seen = drey_arena_calloc(a, n_files * sizeof *seen);
    size_t n = 0;
    order[n++] = file;
    seen[file] = true;
    for (size_t i = 0; i < n; i++) {
        const size_t *deps;
        size_t n_deps = drey_descriptors_file_deps(d, order[i], &deps);
        for (size_t k = 0; k < n_deps; k++) {
            if (!seen[deps[k]]) {
                seen[deps[k]] = true;
                order[n++] = deps[k];
            }
        }
    }
    Grpc__Reflection__V1__FileDescriptorResponse *fr = drey_arena_alloc(a, sizeof *fr);
    grpc__reflection__v1__file_descriptor_response__init(fr);
    fr->n_file_descriptor_proto = n;
    fr->file_descriptor_proto = drey_arena_alloc(a, n * sizeof *fr->file_descriptor_proto);
    for (size_t i = 0; i < n; i++) {
        const uint8_t *data;
        size_t len;
        drey_descriptors_file_bytes(d, order[i], &data, &len);
        fr->file_descriptor_proto[i].data = (uint8_t *)data;
        fr->file_descriptor_proto[i].len = len;
    }
    resp->message_response_case =
        GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_FILE_DESCRIPTOR_RESPONSE;
    resp->file_descriptor_response = fr;
}

/* Whether the server serves a method of the service: the descriptor set
 * describes services a node may not run (a single node has no Cluster). */
static bool served(const drey_server *s, const char *service) {
    size_t n = strlen(service);
    for (size_t i = 0; i < drey_server_method_count(s); i++) {
        const char *path = drey_server_method_path(s, i);
        if (strncmp(path + 1, service, n) == 0 && path[1 + n] == '/')
            return true;
    }
    return false;
}

static void set_services(drey_arena *a, response *resp, const drey_descriptors *d, const drey_server *s) {
    const char *const *names;
    size_t n = drey_descriptors_services(d, &names);
    Grpc__Reflection__V1__ListServiceResponse *ls = drey_arena_alloc(a, sizeof *ls);
    grpc__reflection__v1__list_service_response__init(ls);
    ls->service = drey_arena_alloc(a, (n ? n : 1) * sizeof *ls->service);
    for (size_t i = 0; i < n; i++) {
        if (!served(s, names[i]))
            continue;
        Grpc__Reflection__V1__ServiceResponse *sr = drey_arena_alloc(a, sizeof *sr);
        grpc__reflection__v1__service_response__init(sr);
        sr->name = (char *)names[i];
        ls->service[ls->n_service++] = sr;
    }
    resp->message_response_case =
        GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_LIST_SERVICES_RESPONSE;
    resp->list_services_response = ls;
}

/* The file (and what it imports), or NOT_FOUND with what when file < 0. */
static void set_files_or_error(drey_arena *a, response *resp, const drey_descriptors *d, long file, const char *what) {
    if (file < 0)
        set_error(a, resp, CODE_NOT_FOUND, what);
    else
        set_files(a, resp, d, (size_t)file);
}

static void answer(const drey_server *s, drey_call *call, const request *req) {
    drey_arena *a = drey_call_arena(call);
    const drey_descriptors *d = drey_descriptors_builtin();
    response resp = GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__INIT;
    resp.valid_host = req->host;
    resp.original_request = (request *)req;
    switch (req->message_request_case) {
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_LIST_SERVICES:
        set_services(a, &resp, d, s);
        break;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME:
        set_files_or_error(a, &resp, d, drey_descriptors_find_file(d, req->file_by_filename), "file not found");
        break;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL:
        set_files_or_error(a, &resp, d, drey_descriptors_find_symbol(d, req->file_containing_symbol),
                           "symbol not found");
        break;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_EXTENSION:
        set_error(a, &resp, CODE_NOT_FOUND, "extension not found");
        break;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_ALL_EXTENSION_NUMBERS_OF_TYPE:
        if (drey_descriptors_find_symbol(d, req->all_extension_numbers_of_type) < 0) {
            set_error(a, &resp, CODE_NOT_FOUND, "type not found");
        } else {
            Grpc__Reflection__V1__ExtensionNumberResponse *en = drey_arena_alloc(a, sizeof *en);
            grpc__reflection__v1__extension_number_response__init(en);
            en->base_type_name = req->all_extension_numbers_of_type;
            resp.message_response_case =
                GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ALL_EXTENSION_NUMBERS_RESPONSE;
            resp.all_extension_numbers_response = en;
        }
        break;
    default:
        set_error(a, &resp, CODE_INVALID_ARGUMENT, "the request names no message_request");
        break;
    }
    drey_call_send(call, &resp.base);
}

static void on_message_v1(void *ctx, drey_call *call, const ProtobufCMessage *msg) {
    if (msg == NULL) {
        drey_call_finish(call, NULL); /* the client is done asking */
        return;
    }
    answer(ctx, call, (const request *)msg);
}

static void on_message_v1alpha(void *ctx, drey_call *call, const ProtobufCMessage *msg) {
    if (msg == NULL) {
        drey_call_finish(call, NULL);
        return;
    }
    drey_arena *a = drey_call_arena(call);
    size_t n = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = drey_arena_alloc(a, n);
    protobuf_c_message_pack(msg, buf);
    request *req = grpc__reflection__v1__server_reflection_request__unpack(drey_arena_protobuf_allocator(a), n, buf);
    if (req == NULL) { /* cannot happen: the same fields re-encoded */
        drey_call_finish(call, NULL);
        return;
    }
    answer(ctx, call, req);
}

bool drey_reflect_register(drey_server *s) {
    /* Both versions: grpcurl and most clients ask v1; older ones v1alpha. */
    static const struct {
        const char *path;
        const ProtobufCMessageDescriptor *input;
        void (*on_message)(void *ctx, drey_call *call, const ProtobufCMessage *msg);
    } versions[] = {
        {"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
         &grpc__reflection__v1__server_reflection_request__descriptor, on_message_v1},
        {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
         &grpc__reflection__v1alpha__server_reflection_request__descriptor, on_message_v1alpha},
    };
    for (size_t i = 0; i < sizeof versions / sizeof versions[0]; i++) {
        const drey_server_method m = {
            .path = versions[i].path,
            .input = versions[i].input,
            .client_streaming = true,
            .server_streaming = true,
            .on_message = versions[i].on_message,
            .ctx = s,
        };
        if (!drey_server_add_method(s, &m))
            return false;
    }
    return true;
}
