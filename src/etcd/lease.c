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

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/rpc.h"
#include "internal.h"

#define BACKOFF_MIN_NS (10 * 1000000LL)
#define BACKOFF_MAX_NS (500 * 1000000LL) /* clientv3's retryConnWait */

struct drey_etcd_keepalive {
    drey_etcd__stream s; /* first: the thread frees a keepalive as a stream */
    int64_t id;
    void (*on_lost)(void *user, drey_etcd_lease_loss why);
    void *user;

    /* The thread's. */
    bool outstanding;        /* a renewal was sent and not answered */
    int64_t sent_ns;         /* when the outstanding renewal was sent */
    int64_t next_send_ns;    /* when the next renewal is due (with a call up) */
    int64_t reconnect_ns;    /* when to open the next call (without one); 0: none */
    int64_t ttl_ns;
    bool lost;

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
    if (k->s.call != NULL && !k->outstanding && k->next_send_ns < t)
        t = k->next_send_ns;
    if (k->s.call == NULL && k->reconnect_ns != 0 && k->reconnect_ns < t)
        t = k->reconnect_ns;
    k->s.timer_ns = t;
}

static void lose(drey_etcd_keepalive *k, drey_etcd_lease_loss why) {
    k->lost = true;
    k->s.timer_ns = 0;
    drey_etcd__call_cancel(&k->s);
    if (k->on_lost != NULL && drey_etcd__may_call_back(&k->s))
        k->on_lost(k->user, why);
}

static void send_renewal(drey_etcd_keepalive *k) {
    Etcdserverpb__LeaseKeepAliveRequest req = ETCDSERVERPB__LEASE_KEEP_ALIVE_REQUEST__INIT;
    req.id = k->id;
    k->sent_ns = drey_mono_ns();
    k->outstanding = true;
    drey_etcd__call_send(&k->s, &req.base);
}

static void start_attempt(drey_etcd__stream *s) {
    drey_etcd_keepalive *k = of(s);
    k->reconnect_ns = 0;
    drey_etcd__call_open(s, DREY_ETCD__LEASE_KEEPALIVE);
    send_renewal(k); /* at once: the stream may be new because the last one broke */
    drey_etcd__call_recv(s);
    arm(k);
}

/* The call is over; a new one, after a backoff, unless the lease is lost. */
static void on_call_end(drey_etcd__stream *s, grpc_status_code code, const char *message) {
    (void)code;
    (void)message;
    drey_etcd_keepalive *k = of(s);
    /* A renewal the stream took with it may have reached etcd; it proves
     * nothing here. */
    k->outstanding = false;
    if (k->s.closing || k->lost)
        return;
    k->reconnect_ns = drey_etcd__call_retry_at(s, BACKOFF_MAX_NS);
    arm(k);
}

static void on_recv(drey_etcd__stream *s, bool ok) {
    drey_etcd_keepalive *k = of(s);
    if (!ok || s->recv == NULL) {
        drey_etcd__call_maybe_end(s);
        return;
    }
    Etcdserverpb__LeaseKeepAliveResponse *r = (Etcdserverpb__LeaseKeepAliveResponse *)drey_rpc_unpack(
        s->recv, &etcdserverpb__lease_keep_alive_response__descriptor, NULL);
    grpc_byte_buffer_destroy(s->recv);
    s->recv = NULL;
    if (r == NULL) {
        drey_etcd__call_cancel(s); /* not etcd: a new stream */
    } else if (k->lost || k->s.closing) {
        /* Late: nothing to do. */
    } else if (r->ttl <= 0) {
        lose(k, DREY_ETCD_LEASE_EXPIRED);
    } else if (k->outstanding) {
        int64_t now = drey_mono_ns();
        k->outstanding = false;
        k->ttl_ns = r->ttl * 1000000000LL;
        k->next_send_ns = now + k->ttl_ns / 3;
        k->s.backoff_ns = BACKOFF_MIN_NS;
        pthread_mutex_lock(&k->s.e->mu);
        if (k->sent_ns + k->ttl_ns > k->valid_until_ns)
            k->valid_until_ns = k->sent_ns + k->ttl_ns;
        k->renewals++;
        pthread_mutex_unlock(&k->s.e->mu);
    }
    if (r != NULL)
        protobuf_c_message_free_unpacked(&r->base, NULL);
    if (!k->lost && !k->s.closing && !s->status_received)
        drey_etcd__call_recv(s);
    arm(k);
    drey_etcd__call_maybe_end(s);
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
    if (s->call != NULL && !k->outstanding && !s->status_received && now >= k->next_send_ns && s->send == NULL)
        send_renewal(k);
    else if (s->call == NULL && k->reconnect_ns != 0 && now >= k->reconnect_ns)
        start_attempt(s);
    arm(k);
}

static void k_release(drey_etcd__stream *s) {
    (void)s;
}

drey_etcd_keepalive *drey_etcd_keepalive_start(drey_etcd *e, const drey_etcd_lease *lease,
                                               void (*on_lost)(void *user, drey_etcd_lease_loss why),
                                               void *user) {
    drey_etcd_keepalive *k = drey_xcalloc(1, sizeof *k);
    k->id = lease->id;
    k->on_lost = on_lost;
    k->user = user;
    k->ttl_ns = lease->ttl_s * 1000000000LL;
    k->valid_until_ns = lease->granted_ns + k->ttl_ns;
    k->s.backoff_ns = BACKOFF_MIN_NS;
    drey_etcd__stream_init(&k->s, start_attempt, k_timer, on_recv, on_call_end, k_release);
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
