/*
 * lease — keeping one lease alive on its own LeaseKeepAlive stream, driven
 * by the client's thread; see include/drey/etcd.h.
 *
 * From clientv3/lease.go: a renewal TTL/3 after the last answer, a TTL of 0
 * in an answer means the lease is gone, a broken stream is reopened. Unlike
 * it, one renewal is in flight at a time, so each answer belongs to a known
 * send time, and the lease counts as valid until that send time + TTL (Go
 * counts from the answer's arrival, which a slow answer stretches).
 */
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>

#include "drey/clock.h"
#include "internal.h"

#define BACKOFF_MIN_NS (10 * 1000000LL)
#define BACKOFF_MAX_NS (500 * 1000000LL) /* clientv3's retryConnWait */

#define CONTAINER(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))

struct drey_etcd_keepalive {
    drey_etcd__stream s; /* first: the thread frees a keepalive as a stream */
    int64_t id;
    void (*on_lost)(void *user, drey_etcd_lease_loss why);
    void *user;

    /* The thread's. */
    size_t ep;
    grpc_call *call;
    grpc_byte_buffer *send, *recv;
    grpc_metadata md[2]; /* hasleader, and the token when etcd wants one */
    size_t n_md;
    uint64_t token_gen;
    grpc_metadata_array initial_md, trailing_md;
    grpc_status_code code;
    grpc_slice details;
    bool status_received;
    bool headers_sent;       /* the call's first send carried the initial metadata */
    bool outstanding;        /* a renewal was sent and not answered */
    int64_t sent_ns;         /* when the outstanding renewal was sent */
    int64_t next_send_ns;    /* when the next renewal is due (with a call up) */
    int64_t reconnect_ns;    /* when to open the next call (without one); 0: none */
    int64_t ttl_ns;
    bool lost;
    int64_t backoff_ns;
    drey_etcd__tag send_tag, recv_tag, status_tag;

    /* Under e->mu. */
    int64_t valid_until_ns;
    uint64_t renewals;
};

static drey_etcd_keepalive *of(drey_etcd__stream *s) {
    return (drey_etcd_keepalive *)s;
}

static int64_t valid_until(drey_etcd_keepalive *k) {
    pthread_mutex_lock(&k->s.e->mu);
    int64_t v = k->valid_until_ns;
    pthread_mutex_unlock(&k->s.e->mu);
    return v;
}

/* The next thing to do: a renewal, a reconnection, or noticing the lease
 * ran out. */
static void arm(drey_etcd_keepalive *k) {
    if (k->lost || k->s.closing) {
        k->s.timer_ns = 0;
        return;
    }
    int64_t t = valid_until(k);
    if (k->call != NULL && !k->outstanding && k->next_send_ns < t)
        t = k->next_send_ns;
    if (k->call == NULL && k->reconnect_ns != 0 && k->reconnect_ns < t)
        t = k->reconnect_ns;
    k->s.timer_ns = t;
}

static void lose(drey_etcd_keepalive *k, drey_etcd_lease_loss why) {
    k->lost = true;
    k->s.timer_ns = 0;
    if (k->call != NULL)
        grpc_call_cancel(k->call, NULL);
    if (k->on_lost != NULL && drey_etcd__may_call_back(&k->s))
        k->on_lost(k->user, why);
}

static void send_renewal(drey_etcd_keepalive *k) {
    Etcdserverpb__LeaseKeepAliveRequest req = ETCDSERVERPB__LEASE_KEEP_ALIVE_REQUEST__INIT;
    req.id = k->id;
    k->send = drey_etcd__pack(&req.base);
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (!k->headers_sent) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[n].data.send_initial_metadata.count = k->n_md;
        ops[n++].data.send_initial_metadata.metadata = k->md;
        k->headers_sent = true;
    }
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = k->send;
    k->sent_ns = drey_mono_ns();
    k->outstanding = true;
    if (grpc_call_start_batch(k->call, ops, n, &k->send_tag, NULL) == GRPC_CALL_OK) {
        k->s.pending++;
    } else {
        grpc_byte_buffer_destroy(k->send);
        k->send = NULL;
    }
}

static void post_recv(drey_etcd_keepalive *k, bool with_initial_metadata) {
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (with_initial_metadata) {
        ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
        ops[n++].data.recv_initial_metadata.recv_initial_metadata = &k->initial_md;
    }
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n++].data.recv_message.recv_message = &k->recv;
    if (grpc_call_start_batch(k->call, ops, n, &k->recv_tag, NULL) == GRPC_CALL_OK)
        k->s.pending++;
}

static void start_attempt(drey_etcd_keepalive *k) {
    k->reconnect_ns = 0;
    k->call = drey_etcd__stream_call(k->s.e, k->ep, DREY_ETCD__LEASE_KEEPALIVE);
    grpc_metadata_array_init(&k->initial_md);
    grpc_metadata_array_init(&k->trailing_md);
    k->details = grpc_empty_slice();
    k->recv = NULL;
    k->headers_sent = false;
    drey_etcd__hasleader(&k->md[0]);
    k->n_md = 1 + drey_etcd__token_md(k->s.e, &k->md[1], &k->token_gen);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op.data.recv_status_on_client.trailing_metadata = &k->trailing_md;
    op.data.recv_status_on_client.status = &k->code;
    op.data.recv_status_on_client.status_details = &k->details;
    if (grpc_call_start_batch(k->call, &op, 1, &k->status_tag, NULL) != GRPC_CALL_OK)
        abort(); /* a fresh call always takes its status op */
    k->s.pending++;
    send_renewal(k); /* at once: the stream may be new because the last one broke */
    post_recv(k, true);
    arm(k);
}

/* As in watch.c: the call goes once its status has come and nothing of it
 * is in flight; then a new stream, after a backoff, unless the lease is
 * lost. */
static void maybe_finish(drey_etcd_keepalive *k) {
    if (!k->status_received || k->s.pending > 0)
        return;
    k->status_received = false;
    grpc_call_unref(k->call);
    k->call = NULL;
    grpc_slice_unref(k->details);
    grpc_metadata_array_destroy(&k->initial_md);
    grpc_metadata_array_destroy(&k->trailing_md);
    if (k->n_md > 1)
        grpc_slice_unref(k->md[1].value);
    k->n_md = 0;
    if (k->code == GRPC_STATUS_UNAUTHENTICATED)
        drey_etcd__token_stale(k->s.e, k->token_gen); /* the next stream gets a new one */
    /* A renewal the stream took with it may have reached etcd; it proves
     * nothing here. */
    k->outstanding = false;
    if (k->s.closing || k->lost)
        return;
    k->ep = (k->ep + 1) % k->s.e->n_endpoints;
    k->reconnect_ns = drey_mono_ns() + k->backoff_ns;
    k->backoff_ns = k->backoff_ns * 2 > BACKOFF_MAX_NS ? BACKOFF_MAX_NS : k->backoff_ns * 2;
    arm(k);
}

static void on_send(drey_etcd *e, drey_etcd__tag *t, bool ok) {
    (void)e;
    (void)ok;
    drey_etcd_keepalive *k = CONTAINER(t, drey_etcd_keepalive, send_tag);
    k->s.pending--;
    grpc_byte_buffer_destroy(k->send);
    k->send = NULL;
    maybe_finish(k);
}

static void on_recv(drey_etcd *e, drey_etcd__tag *t, bool ok) {
    (void)e;
    drey_etcd_keepalive *k = CONTAINER(t, drey_etcd_keepalive, recv_tag);
    k->s.pending--;
    if (!ok || k->recv == NULL) {
        maybe_finish(k);
        return;
    }
    Etcdserverpb__LeaseKeepAliveResponse *r = (Etcdserverpb__LeaseKeepAliveResponse *)drey_etcd__unpack(
        k->recv, &etcdserverpb__lease_keep_alive_response__descriptor, NULL);
    grpc_byte_buffer_destroy(k->recv);
    k->recv = NULL;
    if (r == NULL) {
        grpc_call_cancel(k->call, NULL); /* not etcd: a new stream */
    } else if (k->lost || k->s.closing) {
        /* Late: nothing to do. */
    } else if (r->ttl <= 0) {
        lose(k, DREY_ETCD_LEASE_EXPIRED);
    } else if (k->outstanding) {
        int64_t now = drey_mono_ns();
        k->outstanding = false;
        k->ttl_ns = r->ttl * 1000000000LL;
        k->next_send_ns = now + k->ttl_ns / 3;
        k->backoff_ns = BACKOFF_MIN_NS;
        pthread_mutex_lock(&k->s.e->mu);
        if (k->sent_ns + k->ttl_ns > k->valid_until_ns)
            k->valid_until_ns = k->sent_ns + k->ttl_ns;
        k->renewals++;
        pthread_mutex_unlock(&k->s.e->mu);
    }
    if (r != NULL)
        protobuf_c_message_free_unpacked(&r->base, NULL);
    if (!k->lost && !k->s.closing && !k->status_received)
        post_recv(k, false);
    arm(k);
    maybe_finish(k);
}

static void on_status(drey_etcd *e, drey_etcd__tag *t, bool ok) {
    (void)e;
    (void)ok;
    drey_etcd_keepalive *k = CONTAINER(t, drey_etcd_keepalive, status_tag);
    k->s.pending--;
    k->status_received = true;
    maybe_finish(k);
}

static void k_start(drey_etcd__stream *s) {
    drey_etcd_keepalive *k = of(s);
    k->ep = atomic_load(&s->e->current);
    start_attempt(k);
}

static void k_timer(drey_etcd__stream *s) {
    drey_etcd_keepalive *k = of(s);
    if (k->lost)
        return;
    int64_t now = drey_mono_ns();
    if (now >= valid_until(k)) {
        lose(k, DREY_ETCD_LEASE_UNCONFIRMED);
        return;
    }
    if (k->call != NULL && !k->outstanding && !k->status_received && now >= k->next_send_ns && k->send == NULL)
        send_renewal(k);
    else if (k->call == NULL && k->reconnect_ns != 0 && now >= k->reconnect_ns)
        start_attempt(k);
    arm(k);
}

static void k_close(drey_etcd__stream *s) {
    drey_etcd_keepalive *k = of(s);
    if (k->call != NULL)
        grpc_call_cancel(k->call, NULL);
}

static void k_release(drey_etcd__stream *s) {
    (void)s;
}

drey_etcd_keepalive *drey_etcd_keepalive_start(drey_etcd *e, const drey_etcd_lease *lease,
                                               void (*on_lost)(void *user, drey_etcd_lease_loss why),
                                               void *user) {
    drey_etcd_keepalive *k = calloc(1, sizeof *k);
    if (k == NULL)
        abort();
    k->id = lease->id;
    k->on_lost = on_lost;
    k->user = user;
    k->ttl_ns = lease->ttl_s * 1000000000LL;
    k->valid_until_ns = lease->granted_ns + k->ttl_ns;
    k->backoff_ns = BACKOFF_MIN_NS;
    k->send_tag.done = on_send;
    k->recv_tag.done = on_recv;
    k->status_tag.done = on_status;
    k->s.on_start = k_start;
    k->s.on_timer = k_timer;
    k->s.on_close = k_close;
    k->s.on_release = k_release;
    drey_etcd__stream_add(e, &k->s);
    return k;
}

int64_t drey_etcd_keepalive_valid_until_ns(const drey_etcd_keepalive *ka) {
    return valid_until((drey_etcd_keepalive *)ka);
}

uint64_t drey_etcd_keepalive_renewals(const drey_etcd_keepalive *ka) {
    pthread_mutex_lock(&ka->s.e->mu);
    uint64_t n = ka->renewals;
    pthread_mutex_unlock(&ka->s.e->mu);
    return n;
}

void drey_etcd_keepalive_stop(drey_etcd_keepalive *ka) {
    if (ka != NULL && drey_etcd__stream_close(&ka->s))
        free(ka);
}
