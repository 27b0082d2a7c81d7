/*
 * stream — the calls of the etcd client's streams (a watch, a keepalive),
 * on the client's thread: opening one on an endpoint with its status batch
 * and its metadata (hasleader, and etcd's token with its authentication),
 * sending and receiving on it, ending it once its status has come and
 * nothing of it is in flight (only then may its buffers be reused; a call
 * refused UNAUTHENTICATED asks for a new token), and the backoff and next
 * endpoint after a broken one. watch.c and lease.c say
 * what their messages mean.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/support/time.h>

#include "drey/clock.h"
#include "drey/rpc.h"
#include "internal.h"

#define CONTAINER(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))

static void on_send(drey_etcd *e, drey_etcd__tag *t, bool ok) {
    (void)e;
    (void)ok; /* a failed send ends the call: its status says why */
    drey_etcd__stream *s = CONTAINER(t, drey_etcd__stream, send_tag);
    s->pending--;
    grpc_byte_buffer_destroy(s->send);
    s->send = NULL;
    drey_etcd__call_maybe_end(s);
}

static void on_recv(drey_etcd *e, drey_etcd__tag *t, bool ok) {
    (void)e;
    drey_etcd__stream *s = CONTAINER(t, drey_etcd__stream, recv_tag);
    s->pending--;
    s->on_recv(s, ok);
}

static void on_status(drey_etcd *e, drey_etcd__tag *t, bool ok) {
    (void)e;
    (void)ok;
    drey_etcd__stream *s = CONTAINER(t, drey_etcd__stream, status_tag);
    s->pending--;
    s->status_received = true;
    drey_etcd__call_maybe_end(s);
}

void drey_etcd__stream_init(drey_etcd__stream *s, void (*on_start)(drey_etcd__stream *s),
                            void (*on_timer)(drey_etcd__stream *s), void (*on_recv_hook)(drey_etcd__stream *s, bool ok),
                            void (*on_call_end)(drey_etcd__stream *s, grpc_status_code code, const char *message),
                            void (*on_release)(drey_etcd__stream *s)) {
    s->send_tag.done = on_send;
    s->recv_tag.done = on_recv;
    s->status_tag.done = on_status;
    s->on_start = on_start;
    s->on_timer = on_timer;
    s->on_recv = on_recv_hook;
    s->on_call_end = on_call_end;
    s->on_release = on_release;
}

void drey_etcd__call_open(drey_etcd__stream *s, int method) {
    drey_etcd *e = s->e;
    s->call = grpc_channel_create_registered_call(e->endpoints[s->ep].channel, NULL, GRPC_PROPAGATE_DEFAULTS, e->cq,
                                                  e->endpoints[s->ep].methods[method],
                                                  gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
    grpc_metadata_array_init(&s->initial_md);
    grpc_metadata_array_init(&s->trailing_md);
    s->details = grpc_empty_slice();
    s->recv = NULL;
    s->headers_sent = s->headers_asked = false;
    /* "hasleader: true" makes an etcd member that lost its leader end our
     * stream (clientv3.WithRequireLeader), so it reconnects to one that has
     * a leader instead of hanging. */
    memset(&s->md[0], 0, sizeof s->md[0]);
    s->md[0].key = grpc_slice_from_static_string("hasleader");
    s->md[0].value = grpc_slice_from_static_string("true");
    s->n_md = 1 + drey_etcd__token_md(e, &s->md[1], &s->token_gen);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op.data.recv_status_on_client.trailing_metadata = &s->trailing_md;
    op.data.recv_status_on_client.status = &s->code;
    op.data.recv_status_on_client.status_details = &s->details;
    if (grpc_call_start_batch(s->call, &op, 1, &s->status_tag, NULL) != GRPC_CALL_OK)
        abort(); /* a fresh call always takes its status op */
    s->pending++;
}

void drey_etcd__call_send(drey_etcd__stream *s, const ProtobufCMessage *msg) {
    s->send = drey_rpc_pack(msg);
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (!s->headers_sent) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[n].data.send_initial_metadata.count = s->n_md;
        ops[n++].data.send_initial_metadata.metadata = s->md;
        s->headers_sent = true;
    }
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = s->send;
    if (grpc_call_start_batch(s->call, ops, n, &s->send_tag, NULL) == GRPC_CALL_OK) {
        s->pending++;
    } else {
        grpc_byte_buffer_destroy(s->send);
        s->send = NULL;
    }
}

void drey_etcd__call_recv(drey_etcd__stream *s) {
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (!s->headers_asked) {
        ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
        ops[n++].data.recv_initial_metadata.recv_initial_metadata = &s->initial_md;
        s->headers_asked = true;
    }
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n++].data.recv_message.recv_message = &s->recv;
    if (grpc_call_start_batch(s->call, ops, n, &s->recv_tag, NULL) == GRPC_CALL_OK)
        s->pending++;
}

void drey_etcd__call_cancel(drey_etcd__stream *s) {
    if (s->call != NULL)
        grpc_call_cancel(s->call, NULL);
}

void drey_etcd__call_maybe_end(drey_etcd__stream *s) {
    if (!s->status_received || s->pending > 0)
        return;
    s->status_received = false;
    grpc_status_code code = s->code;
    char message[160];
    snprintf(message, sizeof message, "%.*s", (int)GRPC_SLICE_LENGTH(s->details),
             (const char *)GRPC_SLICE_START_PTR(s->details));
    grpc_call_unref(s->call);
    s->call = NULL;
    grpc_slice_unref(s->details);
    grpc_metadata_array_destroy(&s->initial_md);
    grpc_metadata_array_destroy(&s->trailing_md);
    if (s->n_md > 1)
        grpc_slice_unref(s->md[1].value);
    s->n_md = 0;
    if (code == GRPC_STATUS_UNAUTHENTICATED)
        drey_etcd__token_stale(s->e, s->token_gen); /* the next call gets a new one */
    s->on_call_end(s, code, message);
}

int64_t drey_etcd__call_retry_at(drey_etcd__stream *s, int64_t max_ns) {
    s->ep = (s->ep + 1) % s->e->n_endpoints;
    int64_t at = drey_mono_ns() + s->backoff_ns;
    s->backoff_ns = s->backoff_ns * 2 > max_ns ? max_ns : s->backoff_ns * 2;
    return at;
}
