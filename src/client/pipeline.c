/*
 * pipeline — the Pipeline stream from the client's side: operations are
 * encoded into PipelineRequests as they are added (the request bytes go in
 * as they are, with no decode and re-encode), sent when flushed, and the
 * PipelineResponses read back in order.
 *
 * A pipeline waits on a next queue of its own: its send, receive and status
 * batches complete in any order, and one wait takes whichever comes, so
 * received answers are taken in while a send waits for flow control.
 */
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/rpc.h"
#include "internal.h"

#define PIPELINE_PATH DREY_CLIENT_CACHE("Pipeline")

typedef struct pipeline_msg {
    drey_link link; /* in the pipeline's received */
    grpc_byte_buffer *bb;
} pipeline_msg;

struct drey_client_pipeline {
    drey_client *client;
    grpc_completion_queue *cq;
    drey_client__io io; /* send: the message gRPC has not taken yet */
    bool open_done, status_done, recv_done, sending, half_closed;
    bool undecodable;
    drey_list received; /* pipeline_msg not yet read */
    uint8_t *buf;             /* the next PipelineRequest's encoded operations */
    size_t len, cap, pending;
    /* Their addresses are the tags of the pipeline's batches. */
    char open_tag, send_tag, recv_tag, status_tag;
};

static void pipeline_recv(drey_client_pipeline *p) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &p->io.recv;
    if (grpc_call_start_batch(p->io.call, &op, 1, &p->recv_tag, NULL) != GRPC_CALL_OK)
        p->recv_done = true;
}

/* Takes one event (false when deadline passed first). */
static bool pipeline_pump(drey_client_pipeline *p, gpr_timespec deadline) {
    grpc_event ev = grpc_completion_queue_next(p->cq, deadline, NULL);
    if (ev.type != GRPC_OP_COMPLETE)
        return false;
    if (ev.tag == &p->open_tag) {
        p->open_done = true;
    } else if (ev.tag == &p->send_tag) {
        p->sending = false;
        if (p->io.send != NULL)
            grpc_byte_buffer_destroy(p->io.send);
        p->io.send = NULL;
    } else if (ev.tag == &p->status_tag) {
        p->status_done = true;
    } else if (ev.tag == &p->recv_tag) {
        if (!ev.success || p->io.recv == NULL) {
            p->recv_done = true;
        } else {
            pipeline_msg *m = drey_xmalloc(sizeof *m);
            m->bb = p->io.recv;
            p->io.recv = NULL;
            drey_list_push(&p->received, &m->link);
            pipeline_recv(p);
        }
    }
    return true;
}

drey_client_pipeline *drey_client_pipeline_open(drey_client *c, int64_t timeout_ms, drey_client_status *st) {
    drey_client_pipeline *p = drey_xcalloc(1, sizeof *p);
    p->client = c;
    p->cq = grpc_completion_queue_create_for_next(NULL);
    drey_client__io_open(&p->io, c, p->cq, PIPELINE_PATH, timeout_ms);
    grpc_op ops[4];
    size_t n = drey_client__open_ops(ops, c, NULL, &p->io.initial_md);
    grpc_call_error err = grpc_call_start_batch(p->io.call, ops, n, &p->open_tag, NULL);
    if (err == GRPC_CALL_OK) {
        grpc_op op;
        drey_client__status_op(&op, &p->io.code, &p->io.details, &p->io.trailing_md);
        err = grpc_call_start_batch(p->io.call, &op, 1, &p->status_tag, NULL);
        if (err != GRPC_CALL_OK)
            p->status_done = true;
    } else {
        p->open_done = p->status_done = true;
    }
    if (err != GRPC_CALL_OK) {
        drey_client_status_set(st, GRPC_STATUS_INTERNAL, grpc_call_error_to_string(err));
        p->recv_done = p->half_closed = true;
        grpc_call_cancel(p->io.call, NULL);
        drey_arena scratch;
        drey_arena_init(&scratch, NULL, 0);
        drey_client_status ignored;
        drey_client_pipeline_finish(p, &scratch, &ignored);
        drey_arena_destroy(&scratch);
        return NULL;
    }
    pipeline_recv(p);
    return p;
}

static void put_varint(drey_client_pipeline *p, uint64_t v) {
    do {
        uint8_t b = v & 0x7f;
        v >>= 7;
        p->buf[p->len++] = (uint8_t)(b | (v != 0 ? 0x80 : 0));
    } while (v != 0);
}

static size_t varint_len(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

/* The PipelineOperation field that carries requests of type d (0: none). */
static uint32_t operation_field(const ProtobufCMessageDescriptor *d) {
    const ProtobufCMessageDescriptor *op = &drey__cache__v1__pipeline_operation__descriptor;
    for (unsigned i = 0; i < op->n_fields; i++) {
        if (op->fields[i].type == PROTOBUF_C_TYPE_MESSAGE && op->fields[i].descriptor == d &&
            (op->fields[i].flags & PROTOBUF_C_FIELD_FLAG_ONEOF) != 0)
            return op->fields[i].id;
    }
    return 0;
}

/* Appends one operation, encoded by hand: the request bytes go in as they
 * are, with no decode and re-encode. */
static void add_encoded(drey_client_pipeline *p, uint64_t id, uint32_t field, const void *request, size_t len,
                        int64_t timeout_ms) {
    uint64_t secs = 0, nanos = 0;
    size_t dur = 0;
    if (timeout_ms >= 0) {
        secs = (uint64_t)timeout_ms / 1000;
        nanos = (uint64_t)timeout_ms % 1000 * 1000000;
        dur = (secs != 0 ? 1 + varint_len(secs) : 0) + (nanos != 0 ? 1 + varint_len(nanos) : 0);
    }
    size_t body = (id != 0 ? 1 + varint_len(id) : 0) + (timeout_ms >= 0 ? 1 + varint_len(dur) + dur : 0) +
                  varint_len((uint64_t)field << 3 | 2) + varint_len(len) + len;
    size_t need = p->len + 1 + varint_len(body) + body;
    if (need > p->cap) {
        p->cap = need > 2 * p->cap ? need : 2 * p->cap;
        p->buf = drey_xrealloc(p->buf, p->cap, 1);
    }
    p->buf[p->len++] = 0x0a; /* operations = 1, length-delimited */
    put_varint(p, body);
    if (id != 0) {
        p->buf[p->len++] = 0x08;
        put_varint(p, id);
    }
    if (timeout_ms >= 0) {
        p->buf[p->len++] = 0x12;
        put_varint(p, dur);
        if (secs != 0) {
            p->buf[p->len++] = 0x08;
            put_varint(p, secs);
        }
        if (nanos != 0) {
            p->buf[p->len++] = 0x10;
            put_varint(p, nanos);
        }
    }
    put_varint(p, (uint64_t)field << 3 | 2);
    put_varint(p, len);
    if (len > 0)
        memcpy(p->buf + p->len, request, len);
    p->len += len;
    p->pending++;
}

bool drey_client_pipeline_add(drey_client_pipeline *p, uint64_t id, const ProtobufCMessage *request,
                              int64_t timeout_ms) {
    uint32_t field = operation_field(request->descriptor);
    if (field == 0)
        return false;
    size_t n = protobuf_c_message_get_packed_size(request);
    uint8_t stack[512];
    uint8_t *b = n <= sizeof stack ? stack : drey_xmalloc(n);
    protobuf_c_message_pack(request, b);
    add_encoded(p, id, field, b, n, timeout_ms);
    if (b != stack)
        free(b);
    return true;
}

bool drey_client_pipeline_add_raw(drey_client_pipeline *p, uint64_t id, const char *method, const void *request,
                                  size_t request_len, int64_t timeout_ms) {
    const char *prefix = DREY_CLIENT_CACHE("");
    if (strncmp(method, prefix, strlen(prefix)) == 0)
        method += strlen(prefix);
    const ProtobufCMethodDescriptor *md =
        protobuf_c_service_descriptor_get_method_by_name(&drey__cache__v1__cache__descriptor, method);
    uint32_t field = md != NULL ? operation_field(md->input) : 0;
    if (field == 0)
        return false;
    add_encoded(p, id, field, request, request_len, timeout_ms);
    return true;
}

size_t drey_client_pipeline_pending(const drey_client_pipeline *p) {
    return p->pending;
}

static void pipeline_wait_send(drey_client_pipeline *p) {
    while (p->sending)
        pipeline_pump(p, gpr_inf_future(GPR_CLOCK_REALTIME));
}

bool drey_client_pipeline_flush(drey_client_pipeline *p) {
    if (p->half_closed)
        return false;
    if (p->pending == 0)
        return true;
    pipeline_wait_send(p);
    p->io.send = drey_rpc_copy(p->buf, p->len);
    p->len = 0;
    p->pending = 0;
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = p->io.send;
    if (grpc_call_start_batch(p->io.call, &op, 1, &p->send_tag, NULL) != GRPC_CALL_OK) {
        grpc_byte_buffer_destroy(p->io.send);
        p->io.send = NULL;
        return false;
    }
    p->sending = true;
    return true;
}

bool drey_client_pipeline_next(drey_client_pipeline *p, int64_t timeout_ms, drey_arena *arena,
                               Drey__Cache__V1__PipelineResponse **response) {
    *response = NULL;
    gpr_timespec deadline = drey_client__deadline_after(timeout_ms);
    while (drey_list_empty(&p->received) && !p->recv_done) {
        if (!pipeline_pump(p, deadline))
            return false;
    }
    if (drey_list_empty(&p->received) || p->undecodable)
        return false;
    pipeline_msg *m = DREY_LIST_ITEM(drey_list_pop(&p->received), pipeline_msg, link);
    *response = (Drey__Cache__V1__PipelineResponse *)drey_client__decode(
        m->bb, &drey__cache__v1__pipeline_response__descriptor, arena);
    grpc_byte_buffer_destroy(m->bb);
    free(m);
    if (*response == NULL) {
        p->undecodable = true;
        grpc_call_cancel(p->io.call, NULL);
        return false;
    }
    return true;
}

grpc_status_code drey_client_pipeline_result_status(const Drey__Cache__V1__PipelineResult *r, drey_arena *arena,
                                                    drey_client_status *st) {
    const Google__Rpc__Status *s = r->status;
    drey_client_status_set(st, s != NULL ? (grpc_status_code)s->code : GRPC_STATUS_OK,
                           s != NULL ? drey_arena_strndup(arena, s->message, strlen(s->message)) : "");
    if (s != NULL && s->code != 0) {
        size_t n = protobuf_c_message_get_packed_size(&s->base);
        uint8_t *b = drey_arena_alloc(arena, n > 0 ? n : 1);
        protobuf_c_message_pack(&s->base, b);
        drey_client_status_decode_details(st, b, n, arena);
    }
    return st->code;
}

const ProtobufCMessage *drey_client_pipeline_result_response(const Drey__Cache__V1__PipelineResult *r) {
    if (r->response_case == DREY__CACHE__V1__PIPELINE_RESULT__RESPONSE__NOT_SET)
        return NULL;
    const ProtobufCFieldDescriptor *fd =
        protobuf_c_message_descriptor_get_field(&drey__cache__v1__pipeline_result__descriptor, r->response_case);
    return fd != NULL ? *(ProtobufCMessage *const *)(const void *)((const char *)r + fd->offset) : NULL;
}

void drey_client_pipeline_close_send(drey_client_pipeline *p) {
    if (p->half_closed)
        return;
    drey_client_pipeline_flush(p);
    p->half_closed = true;
    pipeline_wait_send(p);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    if (grpc_call_start_batch(p->io.call, &op, 1, &p->send_tag, NULL) == GRPC_CALL_OK)
        p->sending = true;
}

void drey_client_pipeline_cancel(drey_client_pipeline *p) {
    grpc_call_cancel(p->io.call, NULL);
}

grpc_status_code drey_client_pipeline_finish(drey_client_pipeline *p, drey_arena *arena, drey_client_status *st) {
    drey_client_pipeline_close_send(p);
    while (!p->open_done || !p->status_done || !p->recv_done || p->sending)
        pipeline_pump(p, gpr_inf_future(GPR_CLOCK_REALTIME));
    if (p->undecodable)
        drey_client_status_set(st, GRPC_STATUS_INTERNAL, "a stream message is not a valid drey.cache.v1.PipelineResponse");
    else
        drey_client__fill_status(st, p->io.code, p->io.details, &p->io.trailing_md, arena);
    for (drey_link *l; (l = drey_list_pop(&p->received)) != NULL;) {
        pipeline_msg *m = DREY_LIST_ITEM(l, pipeline_msg, link);
        grpc_byte_buffer_destroy(m->bb);
        free(m);
    }
    drey_client__io_release(&p->io);
    drey_client__drain_cq(p->cq);
    free(p->buf);
    free(p);
    return st->code;
}

