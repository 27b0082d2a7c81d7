/*
 * client — the etcd client's channels, its thread, and unary calls with
 * endpoint failover; see include/drey/etcd.h.
 *
 * One completion queue, polled by one thread, carries everything: unary
 * calls (the calling thread waits on a condition variable the thread
 * signals), connectivity waits, and the streams' batches. A user thread
 * hands streams to the thread and wakes it with a connectivity watch on a
 * state no channel is in (GRPC_CHANNEL_SHUTDOWN), which completes at once:
 * gRPC's C core has no public alarm.
 */
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/log.h"
#include "drey/rpc.h"
#include "drey/thread.h"
#include "internal.h"

static const char *const method_paths[DREY_ETCD__N_METHODS] = {
    [DREY_ETCD__RANGE] = "/etcdserverpb.KV/Range",
    [DREY_ETCD__PUT] = "/etcdserverpb.KV/Put",
    [DREY_ETCD__DELETE_RANGE] = "/etcdserverpb.KV/DeleteRange",
    [DREY_ETCD__TXN] = "/etcdserverpb.KV/Txn",
    [DREY_ETCD__LEASE_GRANT] = "/etcdserverpb.Lease/LeaseGrant",
    [DREY_ETCD__LEASE_REVOKE] = "/etcdserverpb.Lease/LeaseRevoke",
    [DREY_ETCD__LEASE_KEEPALIVE] = "/etcdserverpb.Lease/LeaseKeepAlive",
    [DREY_ETCD__WATCH] = "/etcdserverpb.Watch/Watch",
    [DREY_ETCD__AUTHENTICATE] = "/etcdserverpb.Auth/Authenticate",
};

static _Thread_local drey_etcd *thread_client; /* set on each client's own thread */

/* --- helpers -------------------------------------------------------------- */

static gpr_timespec gpr_deadline(int64_t deadline_ns) {
    int64_t left = deadline_ns - drey_mono_ns();
    if (left <= 0)
        return gpr_inf_past(GPR_CLOCK_MONOTONIC);
    /* Relative: gpr's monotonic clock need not share CLOCK_MONOTONIC's epoch. */
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_nanos(left, GPR_TIMESPAN));
}

void drey_etcd__status_set(drey_etcd_status *st, grpc_status_code code, const char *fmt, ...) {
    st->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->message, sizeof st->message, fmt, ap);
    va_end(ap);
}

const char *drey_etcd_code_name(grpc_status_code code) {
    const char *name = drey_rpc_code_name(code);
    return name != NULL ? name : "UNKNOWN_CODE";
}

/* --- waiting for the thread ----------------------------------------------- */

typedef struct waiter {
    drey_etcd__tag tag;
    pthread_cond_t cv;
    bool fired, ok;
} waiter;

static void waiter_done(drey_etcd *e, drey_etcd__tag *t, bool ok) {
    waiter *w = (waiter *)t;
    pthread_mutex_lock(&e->mu);
    w->fired = true;
    w->ok = ok;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&e->mu);
}

static void waiter_init(waiter *w) {
    w->tag.done = waiter_done;
    w->fired = w->ok = false;
    pthread_cond_init(&w->cv, NULL);
}

static bool waiter_wait(drey_etcd *e, waiter *w) {
    pthread_mutex_lock(&e->mu);
    while (!w->fired)
        pthread_cond_wait(&w->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    pthread_cond_destroy(&w->cv);
    return w->ok;
}

/* --- the thread ----------------------------------------------------------- */

bool drey_etcd__on_thread(const drey_etcd *e) {
    return thread_client == e;
}

static void wake_locked(drey_etcd *e) {
    if (e->wake_pending)
        return;
    e->wake_pending = true;
    grpc_channel_watch_connectivity_state(e->endpoints[0].channel, GRPC_CHANNEL_SHUTDOWN,
                                          gpr_inf_future(GPR_CLOCK_MONOTONIC), e->cq, &e->wake_tag);
}

static void wake_done(drey_etcd *e, drey_etcd__tag *t, bool ok) {
    (void)t;
    (void)ok;
    pthread_mutex_lock(&e->mu);
    e->wake_pending = false;
    pthread_mutex_unlock(&e->mu);
}

void drey_etcd__stream_add(drey_etcd *e, drey_etcd__stream *s) {
    s->e = e;
    pthread_mutex_lock(&e->mu);
    s->next = e->incoming;
    e->incoming = s;
    wake_locked(e);
    pthread_mutex_unlock(&e->mu);
}

bool drey_etcd__stream_close(drey_etcd__stream *s) {
    drey_etcd *e = s->e;
    pthread_mutex_lock(&e->mu);
    s->close_requested = true;
    if (drey_etcd__on_thread(e)) {
        /* Inside a callback: the thread is here, so it cannot be waited for;
         * it frees s once its batches are done. */
        s->free_on_release = true;
        pthread_mutex_unlock(&e->mu);
        return false;
    }
    wake_locked(e);
    while (!s->released)
        pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    return true;
}

bool drey_etcd__may_call_back(drey_etcd__stream *s) {
    pthread_mutex_lock(&s->e->mu);
    bool ok = !s->close_requested;
    pthread_mutex_unlock(&s->e->mu);
    return ok;
}

/* Marks s released; frees it when nobody will. Unlinks nothing. */
static void release(drey_etcd *e, drey_etcd__stream *s) {
    s->on_release(s);
    pthread_mutex_lock(&e->mu);
    bool free_it = s->free_on_release;
    s->released = true;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (free_it)
        free(s);
}

/* Takes the streams user threads handed over, asks the closing ones to
 * close and releases those with nothing in flight. Returns the earliest
 * timer (0: none) and whether the thread may stop. */
static int64_t housekeeping(drey_etcd *e, bool *may_stop) {
    pthread_mutex_lock(&e->mu);
    drey_etcd__stream *in = e->incoming;
    e->incoming = NULL;
    bool stopping = e->stopping;
    if (stopping) {
        /* Streams the user left open: closed without callbacks, freed here. */
        for (drey_etcd__stream *s = in; s != NULL; s = s->next)
            s->close_requested = s->free_on_release = true;
        for (drey_etcd__stream *s = e->streams; s != NULL; s = s->next)
            s->close_requested = s->free_on_release = true;
    }
    pthread_mutex_unlock(&e->mu);

    while (in != NULL) {
        drey_etcd__stream *s = in;
        in = in->next;
        s->next = e->streams;
        e->streams = s;
        if (drey_etcd__may_call_back(s)) {
            s->ep = atomic_load(&e->current);
            s->on_start(s);
        }
    }
    int64_t next_timer = 0;
    for (drey_etcd__stream **pp = &e->streams; *pp != NULL;) {
        drey_etcd__stream *s = *pp;
        if (!s->closing && !drey_etcd__may_call_back(s)) {
            s->closing = true;
            s->timer_ns = 0;
            drey_etcd__call_cancel(s);
        }
        if (s->closing && s->pending == 0) {
            *pp = s->next;
            release(e, s);
            continue;
        }
        if (s->timer_ns != 0 && (next_timer == 0 || s->timer_ns < next_timer))
            next_timer = s->timer_ns;
        pp = &s->next;
    }
    pthread_mutex_lock(&e->mu);
    *may_stop = e->stopping && e->streams == NULL && e->incoming == NULL;
    pthread_mutex_unlock(&e->mu);
    return next_timer;
}

static void run_timers(drey_etcd *e) {
    int64_t now = drey_mono_ns();
    for (drey_etcd__stream *s = e->streams; s != NULL; s = s->next) {
        if (s->timer_ns != 0 && s->timer_ns <= now && !s->closing) {
            s->timer_ns = 0;
            s->on_timer(s);
        }
    }
}

static void *thread_main(void *arg) {
    drey_etcd *e = arg;
    thread_client = e;
    bool shut = false;
    for (;;) {
        bool may_stop;
        int64_t next_timer = housekeeping(e, &may_stop);
        if (may_stop && !shut) {
            grpc_completion_queue_shutdown(e->cq);
            shut = true;
        }
        gpr_timespec deadline =
            next_timer == 0 ? gpr_inf_future(GPR_CLOCK_MONOTONIC) : gpr_deadline(next_timer);
        grpc_event ev = grpc_completion_queue_next(e->cq, deadline, NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type == GRPC_OP_COMPLETE) {
            drey_etcd__tag *t = ev.tag;
            t->done(e, t, ev.success != 0);
        }
        run_timers(e);
    }
    return NULL;
}

/* --- unary calls ---------------------------------------------------------- */

/* Waits until endpoint ep's channel is connected or deadline_ns. quick:
 * give up at once on an endpoint that is failing (first pass). */
static bool wait_ready(drey_etcd *e, size_t ep, int64_t deadline_ns, bool quick) {
    grpc_channel *ch = e->endpoints[ep].channel;
    for (;;) {
        grpc_connectivity_state s = grpc_channel_check_connectivity_state(ch, 1);
        if (s == GRPC_CHANNEL_READY)
            return true;
        if (quick && s == GRPC_CHANNEL_TRANSIENT_FAILURE)
            return false;
        if (drey_mono_ns() >= deadline_ns)
            return false;
        waiter w;
        waiter_init(&w);
        grpc_channel_watch_connectivity_state(ch, s, gpr_deadline(deadline_ns), e->cq, &w.tag);
        if (!waiter_wait(e, &w))
            return grpc_channel_check_connectivity_state(ch, 0) == GRPC_CHANNEL_READY;
    }
}

/* One call on endpoint ep, with the token when with_token (its generation
 * in *gen). On OK *resp is decoded into arena. */
static void call_once(drey_etcd *e, size_t ep, int method, const ProtobufCMessage *req,
                      const ProtobufCMessageDescriptor *resp_type, int64_t deadline_ns, drey_arena *arena,
                      ProtobufCMessage **resp, drey_etcd_status *st, bool with_token, uint64_t *gen) {
    grpc_call *call = grpc_channel_create_registered_call(e->endpoints[ep].channel, NULL, GRPC_PROPAGATE_DEFAULTS,
                                                          e->cq, e->endpoints[ep].methods[method],
                                                          gpr_deadline(deadline_ns), NULL);
    grpc_byte_buffer *send = drey_rpc_pack(req), *recv = NULL;
    grpc_metadata_array initial_md, trailing_md;
    grpc_metadata_array_init(&initial_md);
    grpc_metadata_array_init(&trailing_md);
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_metadata md[1];
    size_t n_md = with_token ? drey_etcd__token_md(e, md, gen) : 0;
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = n_md;
    ops[0].data.send_initial_metadata.metadata = n_md > 0 ? md : NULL;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial_md;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trailing_md;
    ops[5].data.recv_status_on_client.status = &code;
    ops[5].data.recv_status_on_client.status_details = &details;
    waiter w;
    waiter_init(&w);
    grpc_call_error err = grpc_call_start_batch(call, ops, 6, &w.tag, NULL);
    if (err != GRPC_CALL_OK) {
        pthread_cond_destroy(&w.cv);
        drey_etcd__status_set(st, GRPC_STATUS_INTERNAL, "%s", grpc_call_error_to_string(err));
    } else {
        waiter_wait(e, &w);
        drey_etcd__status_set(st, code, "%.*s", (int)GRPC_SLICE_LENGTH(details),
                              (const char *)GRPC_SLICE_START_PTR(details));
        if (code == GRPC_STATUS_OK) {
            *resp = recv != NULL ? drey_rpc_unpack(recv, resp_type, drey_arena_protobuf_allocator(arena)) : NULL;
            if (*resp == NULL)
                drey_etcd__status_set(st, GRPC_STATUS_INTERNAL, "the response is not a valid %s", resp_type->name);
        }
    }
    if (recv != NULL)
        grpc_byte_buffer_destroy(recv);
    grpc_byte_buffer_destroy(send);
    grpc_slice_unref(details);
    grpc_metadata_array_destroy(&initial_md);
    grpc_metadata_array_destroy(&trailing_md);
    grpc_call_unref(call);
    for (size_t i = 0; i < n_md; i++)
        grpc_slice_unref(md[i].value);
}

static void pause_ns(int64_t ns) {
    struct timespec ts = {.tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000};
    nanosleep(&ts, NULL);
}

static grpc_status_code unary(drey_etcd *e, int method, const ProtobufCMessage *req,
                              const ProtobufCMessageDescriptor *resp_type, bool idempotent, int64_t timeout_ms,
                              drey_arena *arena, ProtobufCMessage **resp, drey_etcd_status *st, bool with_token,
                              uint64_t *gen) {
    *resp = NULL;
    st->may_have_applied = false;
    st->message[0] = st->endpoint[0] = '\0';
    if (drey_etcd__on_thread(e)) {
        drey_etcd__status_set(st, GRPC_STATUS_FAILED_PRECONDITION,
                              "a synchronous etcd call from an etcd callback would wait for itself");
        return st->code;
    }
    if (timeout_ms <= 0) {
        drey_etcd__status_set(st, GRPC_STATUS_DEADLINE_EXCEEDED, "the deadline had passed before the call");
        return st->code;
    }
    int64_t deadline = drey_mono_ns() + timeout_ms * 1000000;
    int64_t connect_ns = e->connect_timeout_ms * 1000000;
    int64_t backoff_ns = 25 * 1000000;
    size_t start = atomic_load(&e->current);
    char last[sizeof st->message] = "";
    for (size_t attempt = 0;; attempt++) {
        size_t ep = (start + attempt) % e->n_endpoints;
        if (attempt > 0 && ep == start) {
            /* A whole pass failed: pause before the next (capped by the deadline). */
            int64_t left = deadline - drey_mono_ns();
            if (left > 0)
                pause_ns(backoff_ns < left ? backoff_ns : left);
            backoff_ns = backoff_ns * 2 > 500 * 1000000 ? 500 * 1000000 : backoff_ns * 2;
        }
        if (drey_mono_ns() >= deadline) {
            drey_etcd__status_set(st, GRPC_STATUS_DEADLINE_EXCEEDED, "deadline exceeded%s%.200s", last[0] ? ": " : "",
                                  last);
            return st->code;
        }
        snprintf(st->endpoint, sizeof st->endpoint, "%s", e->endpoints[ep].target);
        int64_t budget = drey_mono_ns() + connect_ns;
        if (!wait_ready(e, ep, budget < deadline ? budget : deadline, attempt < e->n_endpoints)) {
            /* Nothing was sent: any call may go on to the next endpoint. */
            snprintf(last, sizeof last, "%s: not connected", e->endpoints[ep].target);
            continue;
        }
        call_once(e, ep, method, req, resp_type, deadline, arena, resp, st, with_token, gen);
        if (st->code == GRPC_STATUS_OK) {
            atomic_store(&e->current, ep);
            return st->code;
        }
        if (st->code == GRPC_STATUS_UNAVAILABLE || st->code == GRPC_STATUS_DEADLINE_EXCEEDED) {
            /* This endpoint failed or hung: the next call starts elsewhere. */
            atomic_store(&e->current, (ep + 1) % e->n_endpoints);
            if (st->code == GRPC_STATUS_UNAVAILABLE && idempotent) {
                char why[150];
                drey_log_clip(why, sizeof why, st->message, strlen(st->message));
                snprintf(last, sizeof last, "%.100s: %s", e->endpoints[ep].target, why);
                continue;
            }
            st->may_have_applied = !idempotent;
        }
        return st->code;
    }
}

grpc_status_code drey_etcd__unary_plain(drey_etcd *e, int method, const ProtobufCMessage *req,
                                        const ProtobufCMessageDescriptor *resp_type, bool idempotent,
                                        int64_t timeout_ms, drey_arena *arena, ProtobufCMessage **resp,
                                        drey_etcd_status *st) {
    return unary(e, method, req, resp_type, idempotent, timeout_ms, arena, resp, st, false, NULL);
}

/* With etcd's authentication: a token first when there is none, and once
 * more when etcd refused the one sent (it expired): etcd checks the token
 * before anything applies, so the retry cannot apply a write twice. */
grpc_status_code drey_etcd__unary(drey_etcd *e, int method, const ProtobufCMessage *req,
                                  const ProtobufCMessageDescriptor *resp_type, bool idempotent, int64_t timeout_ms,
                                  drey_arena *arena, ProtobufCMessage **resp, drey_etcd_status *st) {
    if (e->user == NULL)
        return unary(e, method, req, resp_type, idempotent, timeout_ms, arena, resp, st, false, NULL);
    int64_t deadline = drey_mono_ns() + (timeout_ms > 0 ? timeout_ms : 0) * 1000000;
    uint64_t gen = 0;
    for (int attempt = 0;; attempt++) {
        *resp = NULL;
        if (drey_etcd__token_md(e, NULL, &gen) == 0 || attempt > 0) {
            if (drey_etcd__on_thread(e)) {
                drey_etcd__status_set(st, GRPC_STATUS_FAILED_PRECONDITION,
                                      "a synchronous etcd call from an etcd callback would wait for itself");
                return st->code;
            }
            if (drey_etcd__authenticate(e, gen, deadline, st) != GRPC_STATUS_OK)
                return st->code;
        }
        int64_t left_ms = (deadline - drey_mono_ns()) / 1000000;
        grpc_status_code code = unary(e, method, req, resp_type, idempotent, left_ms, arena, resp, st, true, &gen);
        if (code != GRPC_STATUS_UNAUTHENTICATED || attempt > 0)
            return code;
        st->may_have_applied = false;
    }
}

/* --- the client ----------------------------------------------------------- */

/* "http://host:port", "https://host:port" or "host:port" into target;
 * false for anything else. */
static bool parse_endpoint(const char *url, size_t len, char *target, size_t cap, bool *tls, char *err,
                           size_t err_cap) {
    static const char http[] = "http://", https[] = "https://";
    *tls = false;
    if (len >= sizeof https - 1 && strncmp(url, https, sizeof https - 1) == 0) {
        url += sizeof https - 1;
        len -= sizeof https - 1;
        *tls = true;
    } else if (len >= sizeof http - 1 && strncmp(url, http, sizeof http - 1) == 0) {
        url += sizeof http - 1;
        len -= sizeof http - 1;
    } else if (memchr(url, '/', len) != NULL) {
        snprintf(err, err_cap, "%.*s: not an http:// or https:// endpoint", (int)len, url);
        return false;
    }
    while (len > 0 && url[len - 1] == '/')
        len--;
    const char *colon = memrchr(url, ':', len);
    if (len == 0 || colon == NULL || colon == url || colon == url + len - 1 || len >= cap) {
        snprintf(err, err_cap, "%.*s: an endpoint is host:port", (int)len, url);
        return false;
    }
    memcpy(target, url, len);
    target[len] = '\0';
    return true;
}

drey_etcd *drey_etcd_open(const drey_etcd_options *opts, char *err, size_t err_cap) {
    char scratch[8];
    if (err == NULL) {
        err = scratch;
        err_cap = sizeof scratch;
    }
    if (opts->endpoints == NULL || opts->endpoints[0] == '\0') {
        snprintf(err, err_cap, "no etcd endpoints");
        return NULL;
    }
    if (opts->connect_timeout_ms < 0) {
        snprintf(err, err_cap, "the connect timeout is negative");
        return NULL;
    }
    drey_etcd *e = drey_xcalloc(1, sizeof *e);
    for (const char *p = opts->endpoints; *p != '\0';) {
        const char *comma = strchr(p, ',');
        size_t len = comma != NULL ? (size_t)(comma - p) : strlen(p);
        while (len > 0 && *p == ' ') {
            p++;
            len--;
        }
        if (e->n_endpoints == DREY_ETCD__MAX_ENDPOINTS) {
            snprintf(err, err_cap, "more than %d etcd endpoints", DREY_ETCD__MAX_ENDPOINTS);
            free(e);
            return NULL;
        }
        drey_etcd__endpoint *ep = &e->endpoints[e->n_endpoints];
        if (!parse_endpoint(p, len, ep->target, sizeof ep->target, &ep->tls, err, err_cap)) {
            free(e);
            return NULL;
        }
        e->n_endpoints++;
        p += len;
        if (*p == ',')
            p++;
    }
    e->connect_timeout_ms = opts->connect_timeout_ms > 0 ? opts->connect_timeout_ms : 1000;
    bool any_tls = false;
    for (size_t i = 0; i < e->n_endpoints; i++)
        any_tls |= e->endpoints[i].tls;
    const drey_etcd_tls *t = &opts->tls;
    bool tls_files = (t->ca_file != NULL && t->ca_file[0] != '\0') || (t->cert_file != NULL && t->cert_file[0] != '\0') ||
                     (t->key_file != NULL && t->key_file[0] != '\0');
    if (tls_files && !any_tls) {
        /* Certificates given for plaintext endpoints: a mistake that would
         * leave the control plane open, not something to ignore. */
        snprintf(err, err_cap, "TLS files are given for etcd but no endpoint is https://");
        free(e);
        return NULL;
    }
    bool has_user = opts->user != NULL && opts->user[0] != '\0';
    bool has_password = opts->password_file != NULL && opts->password_file[0] != '\0';
    if (has_user != has_password) {
        snprintf(err, err_cap, "etcd authentication needs both a user and a password file");
        free(e);
        return NULL;
    }
    if (has_password && access(opts->password_file, R_OK) != 0) {
        snprintf(err, err_cap, "%s: cannot be read", opts->password_file);
        free(e);
        return NULL;
    }

    drey_rpc_init();
    grpc_channel_credentials *tls = NULL;
    if (any_tls && (tls = drey_etcd__tls_credentials(t, err, err_cap)) == NULL) {
        free(e);
        grpc_shutdown();
        return NULL;
    }
    if (has_user) {
        e->user = drey_xstrdup(opts->user);
        e->password_file = drey_xstrdup(opts->password_file);
    }
    grpc_arg args[3];
    memset(args, 0, sizeof args);
    /* Its own connections: two clients in one process (a claim race, a test)
     * must not share one. */
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL;
    args[0].value.integer = 1;
    /* gRPC's reconnect backoff grows to 120 s: an etcd back after a restart
     * would wait that long. A second is what an operator expects. */
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS;
    args[1].value.integer = 1000;
    /* A large Range (the partition table) must not hit the 4 MiB default;
     * etcd's Go client lifts the limit too. */
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[2].value.integer = -1;
    grpc_channel_args cargs = {.num_args = 3, .args = args};
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    for (size_t i = 0; i < e->n_endpoints; i++) {
        drey_etcd__endpoint *ep = &e->endpoints[i];
        ep->channel = grpc_channel_create(ep->target, ep->tls ? tls : creds, &cargs);
        for (int m = 0; m < DREY_ETCD__N_METHODS; m++)
            ep->methods[m] = grpc_channel_register_call(ep->channel, method_paths[m], NULL, NULL);
    }
    grpc_channel_credentials_release(creds);
    if (tls != NULL)
        grpc_channel_credentials_release(tls);
    e->cq = grpc_completion_queue_create_for_next(NULL);
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->wake_tag.done = wake_done;
    drey_thread_start(&e->thread, "etcd client", thread_main, e);
    drey_etcd__auth_start(e);
    return e;
}

void drey_etcd_close(drey_etcd *e) {
    if (e == NULL)
        return;
    if (drey_etcd__on_thread(e)) {
        /* It would join the thread it runs on. */
        fprintf(stderr, "drey_etcd_close called from an etcd callback\n");
        abort();
    }
    drey_etcd__auth_stop(e); /* its calls need the thread */
    pthread_mutex_lock(&e->mu);
    e->stopping = true;
    wake_locked(e);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    grpc_completion_queue_destroy(e->cq);
    for (size_t i = 0; i < e->n_endpoints; i++)
        grpc_channel_destroy(e->endpoints[i].channel);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
    grpc_shutdown();
}
