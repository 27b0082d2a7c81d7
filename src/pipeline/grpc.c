/*
 * grpc — the gRPC server as a door into the chain.
 *
 * Each method of the table becomes a unary method of the server whose
 * callback wraps the call in a request (in the call's arena, which lives
 * until the call is answered) and submits it. The door's operations map
 * one to one onto the server's call API.
 */
#include <stdlib.h>

#include "drey/alloc.h"
#include "stages.h"

struct binding {
    drey_pipeline *pipeline;
    const drey_method *method;
    const drey_request_ops *door;
};

static void door_reply(void *door, const ProtobufCMessage *response) {
    drey_call_reply(door, response);
}

static void door_fail(void *door, const drey_status *st) {
    drey_call_fail(door, st);
}

static void door_relay(void *door, const drey_answer *a) {
    drey_call_relay(door, a);
}

static bool door_peer_is(void *door, const char *id, size_t len) {
    return drey_call_peer_is(door, id, len);
}

static const char *door_metadata(void *door, const char *key, size_t *len) {
    return drey_call_metadata(door, key, len);
}

static const char *door_peer(void *door) {
    return drey_call_connection(door);
}

static int64_t door_deadline(void *door) {
    return drey_call_deadline_mono_ns(door);
}

static void door_on_cancel(void *door, void (*fn)(void *arg), void *arg) {
    drey_call_on_cancel(door, fn, arg);
}

#define CALL_OPS                                                                                               \
    .reply = door_reply, .fail = door_fail, .relay = door_relay, .metadata = door_metadata, .peer = door_peer,   \
    .deadline_mono_ns = door_deadline, .on_cancel = door_on_cancel

static const drey_request_ops public_door = {CALL_OPS};

/* The cluster's listener: the same, and its callers can prove who they are. */
static const drey_request_ops internal_door = {CALL_OPS, .peer_is = door_peer_is};

static void on_unary(void *ctx, drey_call *call, const ProtobufCMessage *request) {
    const struct binding *b = ctx;
    drey_arena *a = drey_call_arena(call);
    drey_request *r = drey_arena_calloc(a, sizeof *r);
    const uint8_t *bytes;
    size_t len;
    drey_call_request_bytes(call, &bytes, &len);
    drey_request_init(r, b->door, call, a, b->method, request, bytes, len);
    drey_pipeline_submit(b->pipeline, r);
}

bool drey_pipeline_serve(drey_pipeline *p, drey_server *s, bool internal) {
    const drey_method_table *t = drey_pipeline__options(p)->methods;
    size_t n = drey_method_count(t);
    struct binding *b = drey_xcalloc(n > 0 ? n : 1, sizeof *b);
    drey_pipeline__set_bindings(p, internal, b);
    for (size_t i = 0; i < n; i++) {
        const drey_method *m = drey_method_at(t, i);
        if ((m->flags & DREY_METHOD_PEER) != 0 && !internal)
            continue; /* not even UNIMPLEMENTED's hint that it exists */
        b[i] = (struct binding){.pipeline = p, .method = m, .door = internal ? &internal_door : &public_door};
        drey_server_method sm = {
            .path = m->path,
            .input = m->desc->input,
            .unary = on_unary,
            .ctx = &b[i],
        };
        if (!drey_server_add_method(s, &sm))
            return false;
    }
    /* Peers forward over their stream; Pipelines are for clients. */
    return internal ? drey_pipeline__serve_peers(p, s) : drey_pipeline__serve_stream(p, s);
}
