/*
 * unary — one request, one response: synchronous calls (drey_client_unary,
 * waiting on the client's pluck queue) and asynchronous ones
 * (drey_client_start_call and drey_client_next, on its next queue, or on a
 * queue the cluster client shares between nodes).
 *
 * A unary call is one batch of all six client ops, so it completes with one
 * event; the RECV_STATUS_ON_CLIENT op makes that event arrive only when the
 * call is over, whatever happened to it.
 */
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/rpc.h"
#include "internal.h"

typedef struct unary_call {
    drey_link link;     /* in the owner's in_flight (asynchronous calls) */
    drey_client *owner; /* whose list: a queue may be shared by several clients */
    void *user;
    int64_t started_ns;
    drey_client__io io;
} unary_call;

/* Starts u's batch (u->io.send set by the caller) on cq with tag u. */
static grpc_call_error unary_start(drey_client *c, unary_call *u, grpc_completion_queue *cq, const char *method,
                                   int64_t timeout_ms) {
    drey_client__io_open(&u->io, c, cq, method, timeout_ms);
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    size_t n = drey_client__open_ops(ops, c, u->io.send, &u->io.initial_md);
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n++].data.recv_message.recv_message = &u->io.recv;
    drey_client__status_op(&ops[n++], &u->io.code, &u->io.details, &u->io.trailing_md);
    u->started_ns = drey_mono_ns();
    return grpc_call_start_batch(u->io.call, ops, n, u, NULL);
}

/* Runs u (send set) to completion on the pluck queue and fills st; false
 * when gRPC refused to start it (u is then released). */
static bool unary_run(drey_client *c, unary_call *u, const char *method, int64_t timeout_ms, drey_arena *arena,
                      drey_client_status *st) {
    grpc_call_error err = unary_start(c, u, c->sync_cq, method, timeout_ms);
    if (err != GRPC_CALL_OK) {
        drey_client_status_set(st, GRPC_STATUS_INTERNAL, grpc_call_error_to_string(err));
        drey_client__io_release(&u->io);
        return false;
    }
    grpc_event ev = grpc_completion_queue_pluck(c->sync_cq, u, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    if (ev.type != GRPC_OP_COMPLETE)
        abort(); /* no deadline on the pluck, and the queue is not shut down */
    drey_client__fill_status(st, u->io.code, u->io.details, &u->io.trailing_md, arena);
    return true;
}

grpc_status_code drey_client_unary(drey_client *c, const char *method, const ProtobufCMessage *request,
                                   const ProtobufCMessageDescriptor *response_type, int64_t timeout_ms,
                                   drey_arena *arena, ProtobufCMessage **response, drey_client_status *st) {
    *response = NULL;
    unary_call u = {.io.send = drey_rpc_pack(request)};
    if (!unary_run(c, &u, method, timeout_ms, arena, st))
        return st->code;
    if (st->code == GRPC_STATUS_OK) {
        ProtobufCMessage *m = u.io.recv != NULL ? drey_client__decode(u.io.recv, response_type, arena) : NULL;
        if (m == NULL)
            drey_client_status_set(st, GRPC_STATUS_INTERNAL,
                                   drey_arena_sprintf(arena, "the response is not a valid %s", response_type->name));
        *response = m;
    }
    drey_client__io_release(&u.io);
    return st->code;
}

grpc_status_code drey_client_unary_raw(drey_client *c, const char *method, const void *request, size_t request_len,
                                       int64_t timeout_ms, drey_arena *arena, ProtobufCBinaryData *response,
                                       drey_client_status *st) {
    response->data = NULL;
    response->len = 0;
    unary_call u = {.io.send = drey_rpc_copy(request, request_len)};
    if (!unary_run(c, &u, method, timeout_ms, arena, st))
        return st->code;
    if (st->code == GRPC_STATUS_OK && u.io.recv != NULL)
        drey_client__copy_buffer(u.io.recv, arena, response);
    drey_client__io_release(&u.io);
    return st->code;
}

/* --- asynchronous calls ------------------------------------------------------ */

bool drey_client_start_call(drey_client *c, const char *method, const void *request, size_t request_len,
                            int64_t timeout_ms, void *user) {
    unary_call *u = drey_xcalloc(1, sizeof *u);
    u->user = user;
    u->owner = c;
    u->io.send = drey_rpc_copy(request, request_len);
    if (unary_start(c, u, c->async_cq, method, timeout_ms) != GRPC_CALL_OK) {
        drey_client__io_release(&u->io);
        free(u);
        return false;
    }
    drey_list_push(&c->in_flight, &u->link);
    c->n_in_flight++;
    return true;
}

/* Takes the next finished asynchronous call off cq and its owner's list,
 * or NULL. */
static unary_call *take_from(grpc_completion_queue *cq, gpr_timespec deadline) {
    grpc_event ev = grpc_completion_queue_next(cq, deadline, NULL);
    if (ev.type != GRPC_OP_COMPLETE)
        return NULL;
    unary_call *u = ev.tag;
    drey_list_remove(&u->owner->in_flight, &u->link);
    u->owner->n_in_flight--;
    return u;
}

static unary_call *take_completion(drey_client *c, gpr_timespec deadline) {
    if (c->n_in_flight == 0)
        return NULL;
    return take_from(c->async_cq, deadline);
}

/* Describes u in *out (in arena) and frees it. */
static void complete(unary_call *u, drey_arena *arena, drey_client_completion *out) {
    out->user = u->user;
    out->elapsed_ns = drey_mono_ns() - u->started_ns;
    out->response.data = NULL;
    out->response.len = 0;
    drey_client__fill_status(&out->status, u->io.code, u->io.details, &u->io.trailing_md, arena);
    if (u->io.code == GRPC_STATUS_OK && u->io.recv != NULL)
        drey_client__copy_buffer(u->io.recv, arena, &out->response);
    drey_client__io_release(&u->io);
    free(u);
}

bool drey_client_next(drey_client *c, int64_t timeout_ms, drey_arena *arena, drey_client_completion *out) {
    unary_call *u = take_completion(c, drey_client__deadline_after(timeout_ms));
    if (u == NULL)
        return false;
    complete(u, arena, out);
    return true;
}

bool drey_client__next_on(grpc_completion_queue *cq, int64_t timeout_ms, drey_arena *arena,
                          drey_client_completion *out) {
    unary_call *u = take_from(cq, drey_client__deadline_after(timeout_ms));
    if (u == NULL)
        return false;
    complete(u, arena, out);
    return true;
}

void drey_client__cancel_all(drey_client *c) {
    for (drey_link *l = c->in_flight.head; l != NULL; l = l->next)
        grpc_call_cancel(DREY_LIST_ITEM(l, unary_call, link)->io.call, NULL);
}

void drey_client__drop_in_flight(drey_client *c) {
    drey_client__cancel_all(c);
    unary_call *u;
    while ((u = take_completion(c, gpr_inf_future(GPR_CLOCK_REALTIME))) != NULL) {
        drey_client__io_release(&u->io);
        free(u);
    }
}

size_t drey_client_in_flight(const drey_client *c) {
    return c->n_in_flight;
}
