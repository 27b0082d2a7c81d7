/*
 * refl — reflection queries, one stream each; see refl.h.
 */
#include "refl.h"

#include <string.h>

#include "drey/alloc.h"
#include "grpc/reflection/v1/reflection.pb-c.h"

typedef Grpc__Reflection__V1__ServerReflectionRequest refl_req;
typedef Grpc__Reflection__V1__ServerReflectionResponse refl_resp;

/* One request on a stream of its own; the response in arena, or NULL. */
static refl_resp *ask(drey_refl *r, refl_req *req, drey_arena *a) {
    size_t n = grpc__reflection__v1__server_reflection_request__get_packed_size(req);
    ProtobufCBinaryData msg = {.len = n, .data = drey_arena_alloc(a, n ? n : 1)};
    grpc__reflection__v1__server_reflection_request__pack(req, msg.data);
    for (int attempt = 0; attempt < 2; attempt++) {
        const char *method = r->v1alpha ? "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
                                        : "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo";
        drey_client_stream *s = drey_client_stream_start_raw(r->client, method, &msg, 1, r->timeout_ms, &r->st);
        ProtobufCBinaryData out = {0};
        bool got = s != NULL && drey_client_stream_read_raw(s, a, &out);
        if (s != NULL)
            drey_client_stream_finish(s, a, &r->st);
        if (got) {
            refl_resp *resp = grpc__reflection__v1__server_reflection_response__unpack(drey_arena_protobuf_allocator(a),
                                                                                       out.len, out.data);
            if (resp == NULL)
                snprintf(r->err, sizeof r->err, "the server's reflection answer does not decode");
            return resp;
        }
        if (r->st.code == GRPC_STATUS_UNIMPLEMENTED && !r->v1alpha) {
            r->v1alpha = true;
            continue;
        }
        break;
    }
    r->call_failed = true;
    snprintf(r->err, sizeof r->err, "server reflection: %s: %s", drey_client_code_name(r->st.code), r->st.message);
    return NULL;
}

static bool add_files(drey_refl *r, const refl_resp *resp) {
    if (resp->message_response_case ==
        GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE) {
        snprintf(r->err, sizeof r->err, "server reflection: %s", resp->error_response->error_message);
        return false;
    }
    if (resp->message_response_case !=
        GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_FILE_DESCRIPTOR_RESPONSE) {
        snprintf(r->err, sizeof r->err, "server reflection: an unexpected answer");
        return false;
    }
    const Grpc__Reflection__V1__FileDescriptorResponse *fr = resp->file_descriptor_response;
    for (size_t i = 0; i < fr->n_file_descriptor_proto; i++) {
        if (!drey_pb_pool_add_file(r->pool, fr->file_descriptor_proto[i].data, fr->file_descriptor_proto[i].len)) {
            snprintf(r->err, sizeof r->err, "server reflection: a file descriptor does not decode");
            return false;
        }
    }
    return true;
}

/* Imports the server did not send with the file: asked for by name. */
static bool load_imports(drey_refl *r, drey_arena *a) {
    for (int round = 0; round < 64; round++) {
        const char *missing = NULL;
        /* Walk every file's dependencies for one the pool lacks. */
        for (size_t i = 0; missing == NULL; i++) {
            const Google__Protobuf__FileDescriptorProto *f = drey_pb_pool_file_at(r->pool, i);
            if (f == NULL)
                break;
            for (size_t k = 0; k < f->n_dependency && missing == NULL; k++)
                if (!drey_pb_pool_has_file(r->pool, f->dependency[k]))
                    missing = f->dependency[k];
        }
        if (missing == NULL)
            return true;
        refl_req req = GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__INIT;
        req.message_request_case = GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME;
        req.file_by_filename = (char *)missing;
        refl_resp *resp = ask(r, &req, a);
        if (resp == NULL || !add_files(r, resp))
            return false;
        if (!drey_pb_pool_has_file(r->pool, missing)) {
            snprintf(r->err, sizeof r->err, "server reflection: %s is not served", missing);
            return false;
        }
    }
    return true;
}

bool drey_refl_load(drey_refl *r, const char *symbol) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    refl_req req = GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__INIT;
    req.message_request_case = GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL;
    req.file_containing_symbol = (char *)(symbol[0] == '.' ? symbol + 1 : symbol);
    refl_resp *resp = ask(r, &req, &a);
    bool ok = resp != NULL && add_files(r, resp) && load_imports(r, &a);
    drey_arena_destroy(&a);
    return ok;
}

static bool resolve(void *ctx, drey_pb_pool *pool, const char *symbol) {
    (void)pool;
    drey_refl *r = ctx;
    char saved[sizeof r->err];
    memcpy(saved, r->err, sizeof saved);
    bool ok = drey_refl_load(r, symbol);
    if (!ok)
        memcpy(r->err, saved, sizeof saved); /* a type nobody serves is not this call's failure */
    return ok;
}

void drey_refl_init(drey_refl *r, drey_client *c, int64_t timeout_ms) {
    memset(r, 0, sizeof *r);
    r->client = c;
    r->timeout_ms = timeout_ms;
    r->pool = drey_pb_pool_new(resolve, r);
    drey_client_status_set(&r->st, GRPC_STATUS_OK, "");
}

void drey_refl_destroy(drey_refl *r) {
    drey_pb_pool_free(r->pool);
}

json_t *drey_refl_services(drey_refl *r) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    refl_req req = GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__INIT;
    req.message_request_case = GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_LIST_SERVICES;
    req.list_services = "";
    refl_resp *resp = ask(r, &req, &a);
    json_t *names = NULL;
    if (resp != NULL && resp->message_response_case ==
                            GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_LIST_SERVICES_RESPONSE) {
        names = json_array();
        for (size_t i = 0; i < resp->list_services_response->n_service; i++)
            json_array_append_new(names, json_string(resp->list_services_response->service[i]->name));
    } else if (resp != NULL) {
        snprintf(r->err, sizeof r->err, "server reflection: an unexpected answer to list_services");
    }
    drey_arena_destroy(&a);
    return names;
}
