/*
 * call — what every call of the client needs, whatever its shape (unary.c,
 * stream.c, pipeline.c): a call on the channel with its deadline, the
 * buffers its batches fill in, the ops that open it and receive its status,
 * and the status decoded with its google.rpc.Status details.
 */
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/rpc.h"
#include "internal.h"

#define DETAILS_KEY "grpc-status-details-bin"

gpr_timespec drey_client__deadline_after(int64_t timeout_ms) {
    if (timeout_ms < 0)
        return gpr_inf_future(GPR_CLOCK_MONOTONIC);
    /* Not now + 0: grpc core may round the grpc-timeout it sends up (its
     * timeout_encoding.h says so), so "now" can reach the server as a
     * deadline still ahead, and a fast server answers. */
    if (timeout_ms == 0)
        return gpr_inf_past(GPR_CLOCK_MONOTONIC);
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(timeout_ms, GPR_TIMESPAN));
}

static void *method_handle(drey_client *c, const char *method) {
    for (size_t i = 0; i < c->n_methods; i++) {
        if (strcmp(c->methods[i].path, method) == 0)
            return c->methods[i].handle;
    }
    if (c->n_methods == DREY_CLIENT__MAX_REGISTERED_METHODS)
        return NULL;
    drey_client__method *r = &c->methods[c->n_methods];
    r->path = drey_xstrdup(method);
    r->handle = grpc_channel_register_call(c->channel, r->path, NULL, NULL);
    c->n_methods++;
    return r->handle;
}

grpc_call *drey_client__new_call(drey_client *c, grpc_completion_queue *cq, const char *method, int64_t timeout_ms) {
    gpr_timespec deadline = drey_client__deadline_after(timeout_ms);
    void *handle = method_handle(c, method);
    if (handle != NULL)
        return grpc_channel_create_registered_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq, handle, deadline,
                                                   NULL);
    grpc_slice path = grpc_slice_from_static_string(method);
    return grpc_channel_create_call(c->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq, path, NULL, deadline, NULL);
}

void drey_client__io_open(drey_client__io *io, drey_client *c, grpc_completion_queue *cq, const char *method,
                          int64_t timeout_ms) {
    grpc_metadata_array_init(&io->initial_md);
    grpc_metadata_array_init(&io->trailing_md);
    io->recv = NULL;
    io->details = grpc_empty_slice();
    io->call = drey_client__new_call(c, cq, method, timeout_ms);
}

void drey_client__io_release(drey_client__io *io) {
    if (io->recv != NULL)
        grpc_byte_buffer_destroy(io->recv);
    if (io->send != NULL)
        grpc_byte_buffer_destroy(io->send);
    grpc_slice_unref(io->details);
    grpc_metadata_array_destroy(&io->initial_md);
    grpc_metadata_array_destroy(&io->trailing_md);
    if (io->call != NULL)
        grpc_call_unref(io->call);
}

size_t drey_client__open_ops(grpc_op *ops, const drey_client *c, grpc_byte_buffer *send,
                             grpc_metadata_array *initial_md) {
    size_t n = 0;
    memset(ops, 0, 4 * sizeof *ops);
    ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[n].data.send_initial_metadata.count = c->headers.count;
    ops[n++].data.send_initial_metadata.metadata = c->headers.md;
    if (send != NULL) {
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = send;
        ops[n++].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    }
    ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[n++].data.recv_initial_metadata.recv_initial_metadata = initial_md;
    return n;
}

void drey_client__status_op(grpc_op *op, grpc_status_code *code, grpc_slice *details, grpc_metadata_array *trailing) {
    memset(op, 0, sizeof *op);
    op->op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op->data.recv_status_on_client.trailing_metadata = trailing;
    op->data.recv_status_on_client.status = code;
    op->data.recv_status_on_client.status_details = details;
}

void drey_client__fill_status(drey_client_status *st, grpc_status_code code, grpc_slice details,
                              const grpc_metadata_array *trailing, drey_arena *arena) {
    drey_client_status_set(st, code,
                           drey_arena_strndup(arena, (const char *)GRPC_SLICE_START_PTR(details),
                                              GRPC_SLICE_LENGTH(details)));
    if (code == GRPC_STATUS_OK)
        return;
    for (size_t i = 0; i < trailing->count; i++) {
        const grpc_metadata *m = &trailing->metadata[i];
        if (grpc_slice_str_cmp(m->key, DETAILS_KEY) == 0) {
            drey_client_status_decode_details(st, GRPC_SLICE_START_PTR(m->value), GRPC_SLICE_LENGTH(m->value), arena);
            return;
        }
    }
}

void drey_client__copy_buffer(grpc_byte_buffer *bb, drey_arena *arena, ProtobufCBinaryData *out) {
    grpc_slice s = drey_rpc_flatten(bb);
    out->len = GRPC_SLICE_LENGTH(s);
    out->data = drey_arena_alloc(arena, out->len > 0 ? out->len : 1);
    memcpy(out->data, GRPC_SLICE_START_PTR(s), out->len);
    grpc_slice_unref(s);
}

ProtobufCMessage *drey_client__decode(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *type,
                                      drey_arena *arena) {
    return drey_rpc_unpack(bb, type, drey_arena_protobuf_allocator(arena));
}

void drey_client__drain_cq(grpc_completion_queue *cq) {
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type != GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cq);
}
