/*
 * local — this node calling its own chain, in-process: the door of a
 * request a node sends itself (its own share of a cache-wide call, the
 * Drop of a copy it handed over), so that a node never calls itself over
 * its internal listener's TLS.
 *
 * The request passes the same chain a peer's forwarded call does: its
 * metadata are the forwarding headers given (this node's id among them),
 * and the caller is this node by its own word (peer_is), as a peer is by
 * its certificate. The answer comes as a peer's would (drey_answer: the
 * response packed, or the status with its details), to done, on whatever
 * thread answers; the request's memory is its own and goes after done.
 */
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "stages.h"

typedef struct local_call {
    drey_subdoor sd; /* first: the request's door */
    drey_arena arena;
    drey_request r;
    const char *self;
    drey_request_header *headers;
    size_t n_headers;
    void (*done)(void *arg, const drey_answer *a);
    void *arg;
} local_call;

static void finish(local_call *lc, const drey_answer *a) {
    lc->done(lc->arg, a);
    drey_arena_destroy(&lc->arena);
    free(lc);
}

static void local_reply(drey_subdoor *door, const ProtobufCMessage *response) {
    local_call *lc = (local_call *)door;
    size_t n = protobuf_c_message_get_packed_size(response);
    uint8_t *buf = drey_arena_alloc(&lc->arena, n ? n : 1);
    protobuf_c_message_pack(response, buf);
    finish(lc, &(drey_answer){.code = GRPC_STATUS_OK, .response = buf, .response_len = n});
}

static void local_fail(drey_subdoor *door, const drey_status *st) {
    local_call *lc = (local_call *)door;
    uint8_t *details;
    size_t len;
    drey_status_encode(st, &lc->arena, &details, &len);
    const char *message = drey_status_message(st);
    finish(lc, &(drey_answer){.code = drey_status_code(st), .message = message, .message_len = strlen(message),
                              .details = details, .details_len = len});
}

static void local_relay(drey_subdoor *door, const drey_answer *a) {
    finish((local_call *)door, a);
}

static const char *local_metadata(drey_subdoor *door, const char *key, size_t *len) {
    local_call *lc = (local_call *)door;
    for (size_t i = 0; i < lc->n_headers; i++) {
        if (strcmp(lc->headers[i].key, key) == 0) {
            *len = lc->headers[i].len;
            return lc->headers[i].value;
        }
    }
    return NULL;
}

static const char *local_peer(drey_subdoor *door) {
    (void)door;
    return "node:self";
}

static bool local_peer_is(drey_subdoor *door, const char *id, size_t len) {
    local_call *lc = (local_call *)door;
    return strlen(lc->self) == len && memcmp(lc->self, id, len) == 0;
}

/* No mutex: nobody cancels a node's call to itself. */
static const drey_subdoor_stream local_stream = {.reply = local_reply, .fail = local_fail, .relay = local_relay,
                                                 .metadata = local_metadata, .peer = local_peer,
                                                 .peer_is = local_peer_is};

void drey_pipeline_call_local(drey_pipeline *p, const drey_method *m, const uint8_t *bytes, size_t len,
                              const char *self, const drey_request_header *headers, size_t n_headers,
                              int64_t deadline_ns, void (*done)(void *arg, const drey_answer *a), void *arg) {
    local_call *lc = drey_xcalloc(1, sizeof *lc);
    drey_arena_init(&lc->arena, NULL, 0);
    lc->self = drey_arena_strndup(&lc->arena, self, strlen(self));
    lc->headers = drey_arena_alloc(&lc->arena, (n_headers ? n_headers : 1) * sizeof *lc->headers);
    for (size_t i = 0; i < n_headers; i++) {
        lc->headers[i] = (drey_request_header){.key = drey_arena_strndup(&lc->arena, headers[i].key,
                                                                         strlen(headers[i].key)),
                                               .value = drey_arena_strndup(&lc->arena, headers[i].value,
                                                                           headers[i].len),
                                               .len = headers[i].len};
    }
    lc->n_headers = n_headers;
    drey_subdoor_init(&lc->sd, &local_stream, NULL, deadline_ns);
    lc->done = done;
    lc->arg = arg;
    uint8_t *copy = drey_arena_alloc(&lc->arena, len ? len : 1);
    if (len > 0)
        memcpy(copy, bytes, len);
    ProtobufCMessage *msg = protobuf_c_message_unpack(m->desc->input, drey_arena_protobuf_allocator(&lc->arena),
                                                      len, copy);
    if (msg == NULL) {
        drey_status st = drey_status_of(DREY_ERR_MALFORMED_REQUEST);
        local_fail(&lc->sd, &st);
        return;
    }
    drey_request_init(&lc->r, &drey_subdoor_peer_ops, &lc->sd, &lc->arena, m, msg, copy, len);
    drey_pipeline_submit(p, &lc->r);
}
