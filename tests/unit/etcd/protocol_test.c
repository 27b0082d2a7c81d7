/* What etcd does rarely or never, from a small gRPC server that is not etcd:
 * answers that do not decode, refusals no retry can fix, a watch cancelled
 * by the server. The unary call fails INTERNAL, the watch and the keepalive
 * open a new stream instead of trusting the old one, a PERMISSION_DENIED
 * stream or a cancellation ends the watch. And what a real etcd does once
 * auth is enabled and we have no token: it cancels the watch and refuses
 * the calls, and none is retried. */
#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <pthread.h>
#include <stdatomic.h>

#include "etcd_fixture.h"

/* --- the fake server ------------------------------------------------------ */

typedef struct fake {
    grpc_server *server;
    grpc_completion_queue *cq;
    pthread_t thread;
    int port;
    grpc_status_code answer; /* OK: a message (below), then OK; else just that status */
    bool cancel_watch;       /* the message is a WatchResponse cancelling the watch, else undecodable */
    atomic_int calls;
} fake;

typedef struct pending_call {
    grpc_call *call;
    grpc_call_details details;
    grpc_metadata_array md;
    grpc_byte_buffer *out;
    int cancelled;
    int stage; /* 0: requested, 1: answered */
} pending_call;

static void request_next(fake *f) {
    pending_call *p = calloc(1, sizeof *p);
    grpc_call_details_init(&p->details);
    grpc_metadata_array_init(&p->md);
    cr_assert_eq(grpc_server_request_call(f->server, &p->call, &p->details, &p->md, f->cq, f->cq, p), GRPC_CALL_OK);
}

static void *fake_main(void *arg) {
    fake *f = arg;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(f->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.tag == f) /* the server's shutdown */
            continue;
        pending_call *p = ev.tag;
        if (p->stage == 0) {
            if (!ev.success) { /* shutting down */
                grpc_call_details_destroy(&p->details);
                grpc_metadata_array_destroy(&p->md);
                free(p);
                continue;
            }
            atomic_fetch_add(&f->calls, 1);
            request_next(f);
            static const uint8_t garbage[] = {0x0a, 0xff, 0x01}; /* field 1, 255 bytes long, 1 present */
            if (f->cancel_watch) {
                Etcdserverpb__WatchResponse r = ETCDSERVERPB__WATCH_RESPONSE__INIT;
                r.created = r.canceled = 1;
                r.watch_id = -1;
                r.cancel_reason = "etcdserver: permission denied";
                uint8_t buf[128];
                size_t len = protobuf_c_message_pack(&r.base, buf);
                grpc_slice s = grpc_slice_from_copied_buffer((const char *)buf, len);
                p->out = grpc_raw_byte_buffer_create(&s, 1);
                grpc_slice_unref(s);
            } else {
                grpc_slice s = grpc_slice_from_static_buffer(garbage, sizeof garbage);
                p->out = grpc_raw_byte_buffer_create(&s, 1);
            }
            grpc_op ops[4];
            memset(ops, 0, sizeof ops);
            size_t n = 0;
            ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
            if (f->answer == GRPC_STATUS_OK) {
                ops[n].op = GRPC_OP_SEND_MESSAGE;
                ops[n++].data.send_message.send_message = p->out;
            }
            ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
            ops[n].data.send_status_from_server.status = f->answer;
            grpc_slice msg = grpc_slice_from_static_string("not etcd");
            ops[n++].data.send_status_from_server.status_details = &msg;
            ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
            ops[n++].data.recv_close_on_server.cancelled = &p->cancelled;
            p->stage = 1;
            cr_assert_eq(grpc_call_start_batch(p->call, ops, n, p, NULL), GRPC_CALL_OK);
        } else {
            grpc_byte_buffer_destroy(p->out);
            grpc_call_unref(p->call);
            grpc_call_details_destroy(&p->details);
            grpc_metadata_array_destroy(&p->md);
            free(p);
        }
    }
    return NULL;
}

static void fake_start(fake *f, grpc_status_code answer, bool cancel_watch) {
    grpc_init();
    memset(f, 0, sizeof *f);
    f->answer = answer;
    f->cancel_watch = cancel_watch;
    f->server = grpc_server_create(NULL, NULL);
    f->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(f->server, f->cq, NULL);
    grpc_server_credentials *creds = grpc_insecure_server_credentials_create();
    f->port = grpc_server_add_http2_port(f->server, "127.0.0.1:0", creds);
    grpc_server_credentials_release(creds);
    cr_assert_gt(f->port, 0);
    grpc_server_start(f->server);
    request_next(f);
    pthread_create(&f->thread, NULL, fake_main, f);
}

static void fake_stop(fake *f) {
    grpc_server_shutdown_and_notify(f->server, f->cq, f);
    grpc_server_cancel_all_calls(f->server);
    grpc_server_destroy(f->server); /* after the notification is queued; the thread drains it */
    grpc_completion_queue_shutdown(f->cq);
    pthread_join(f->thread, NULL);
    grpc_completion_queue_destroy(f->cq);
    grpc_shutdown();
}

static drey_etcd *client_of_fake(const fake *f) {
    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "127.0.0.1:%d", f->port);
    return client_of(endpoint);
}

/* --- undecodable answers -------------------------------------------------- */

static atomic_int events, ends_seen, losses;
static drey_etcd_watch_end_reason end_reason;
static grpc_status_code end_code;

static void count_events(void *user, Mvccpb__Event *const *ev, size_t n) {
    (void)user;
    (void)ev;
    atomic_fetch_add(&events, (int)n);
}

static void record_end(void *user, const drey_etcd_watch_end *end) {
    (void)user;
    end_reason = end->reason;
    end_code = end->code;
    atomic_fetch_add(&ends_seen, 1);
}

static void record_loss(void *user, drey_etcd_lease_loss why) {
    (void)user;
    cr_assert_eq(why, DREY_ETCD_LEASE_UNCONFIRMED);
    atomic_fetch_add(&losses, 1);
}

Test(protocol, an_undecodable_answer_is_internal_and_streams_start_over) {
    fake f;
    fake_start(&f, GRPC_STATUS_OK, false);
    drey_etcd *e = client_of_fake(&f);
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    drey_etcd_status st;
    Etcdserverpb__RangeResponse *resp;
    cr_assert_eq(drey_etcd_get(e, "k", false, 2000, &a, &resp, &st), GRPC_STATUS_INTERNAL, "%s",
                 drey_etcd_code_name(st.code));
    cr_assert_null(resp);
    cr_assert_neq(strstr(st.message, "not a valid etcdserverpb.RangeResponse"), NULL, "%s", st.message);

    drey_etcd_watch *w = drey_etcd_watch_start(
        e, &(drey_etcd_watch_options){.key = "k", .on_events = count_events, .on_end = record_end});
    cr_assert(FIXTURE_WAIT_UNTIL(drey_etcd_watch_stats_of(w).streams >= 3, 10000), "the watch did not start over");
    cr_assert_eq(atomic_load(&events), 0);
    cr_assert_eq(atomic_load(&ends_seen), 0, "an undecodable answer is retried, not an end");
    drey_etcd_watch_close(w);

    drey_etcd_lease lease = {.id = 1, .ttl_s = 1, .granted_ns = drey_mono_ns()};
    drey_etcd_keepalive *ka = drey_etcd_keepalive_start(e, &lease, record_loss, NULL);
    int before = atomic_load(&f.calls);
    cr_assert(FIXTURE_WAIT_UNTIL(atomic_load(&f.calls) >= before + 2, 5000), "the keepalive did not start over");
    cr_assert(FIXTURE_WAIT_UNTIL(atomic_load(&losses) == 1, 5000));
    cr_assert_eq(drey_etcd_keepalive_renewals(ka), 0);
    drey_etcd_keepalive_stop(ka);

    drey_arena_destroy(&a);
    drey_etcd_close(e);
    fake_stop(&f);
}

Test(protocol, a_refusal_no_retry_can_fix_ends_the_watch_and_the_call) {
    fake f;
    fake_start(&f, GRPC_STATUS_PERMISSION_DENIED, false);
    drey_etcd *e = client_of_fake(&f);
    drey_etcd_watch *w = drey_etcd_watch_start(
        e, &(drey_etcd_watch_options){.key = "k", .on_events = count_events, .on_end = record_end});
    cr_assert(FIXTURE_WAIT_UNTIL(atomic_load(&ends_seen) == 1, 10000));
    cr_assert_eq(end_reason, DREY_ETCD_WATCH_FAILED);
    cr_assert_eq(end_code, GRPC_STATUS_PERMISSION_DENIED);
    cr_assert_eq(drey_etcd_watch_stats_of(w).streams, 1);
    drey_etcd_watch_close(w);

    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    drey_etcd_status st;
    Etcdserverpb__PutRequest req = ETCDSERVERPB__PUT_REQUEST__INIT;
    req.key = drey_etcd_bytes("k");
    Etcdserverpb__PutResponse *resp;
    int before = atomic_load(&f.calls);
    cr_assert_eq(drey_etcd_put(e, &req, 2000, &a, &resp, &st), GRPC_STATUS_PERMISSION_DENIED);
    cr_assert_not(st.may_have_applied);
    cr_assert_str_eq(st.message, "not etcd");
    cr_assert_eq(atomic_load(&f.calls), before + 1, "sent once");
    drey_arena_destroy(&a);
    drey_etcd_close(e);
    fake_stop(&f);
}

typedef struct cancel_seen {
    atomic_int ends;
    drey_etcd_watch_end_reason reason;
    grpc_status_code code;
    char message[128];
} cancel_seen;

static void record_cancel(void *user, const drey_etcd_watch_end *end) {
    cancel_seen *c = user;
    c->reason = end->reason;
    c->code = end->code;
    snprintf(c->message, sizeof c->message, "%s", end->message);
    atomic_fetch_add(&c->ends, 1);
}

Test(protocol, a_watch_the_server_cancels_ends_with_its_reason) {
    fake f;
    fake_start(&f, GRPC_STATUS_OK, true);
    drey_etcd *e = client_of_fake(&f);
    cancel_seen c = {0};
    drey_etcd_watch *w = drey_etcd_watch_start(
        e, &(drey_etcd_watch_options){.key = "k", .on_events = count_events, .on_end = record_cancel, .user = &c});
    cr_assert(FIXTURE_WAIT_UNTIL(atomic_load(&c.ends) == 1, 10000), "no cancellation reported");
    cr_assert_eq(c.reason, DREY_ETCD_WATCH_CANCELED);
    cr_assert_str_eq(c.message, "etcdserver: permission denied");
    fixture_pause_ms(200);
    cr_assert_eq(drey_etcd_watch_stats_of(w).streams, 1, "a cancelled watch is not reopened");
    cr_assert_eq(atomic_load(&c.ends), 1);
    drey_etcd_watch_close(w);
    drey_etcd_close(e);
    fake_stop(&f);
}

/* --- a real etcd with auth on --------------------------------------------- */

Test(protocol, etcd_with_auth_cancels_the_watch_of_a_client_without_a_token_and_refuses_its_calls) {
    etcd_cluster cluster;
    etcd_start(&cluster, 1);
    etcdctl(&cluster, "user add root:secret");
    etcdctl(&cluster, "role add root");
    etcdctl(&cluster, "user grant-role root root");
    etcdctl(&cluster, "auth enable");
    drey_etcd *e = client_of(cluster.endpoints);
    cancel_seen c = {0};
    drey_etcd_watch *w = drey_etcd_watch_start(
        e, &(drey_etcd_watch_options){.key = "k", .on_events = count_events, .on_end = record_cancel, .user = &c});
    cr_assert(FIXTURE_WAIT_UNTIL(atomic_load(&c.ends) == 1, 10000), "no end reported");
    /* etcd answers the create request with canceled = true. */
    cr_assert_eq(c.reason, DREY_ETCD_WATCH_CANCELED, "reason %d: %s", c.reason, c.message);
    cr_assert_neq(strstr(c.message, "user name is empty"), NULL, "%s", c.message);
    cr_assert_eq(drey_etcd_watch_stats_of(w).streams, 1);
    drey_etcd_watch_close(w);

    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    drey_etcd_status st;
    Etcdserverpb__RangeResponse *resp;
    cr_assert_eq(drey_etcd_get(e, "k", false, 2000, &a, &resp, &st), GRPC_STATUS_INVALID_ARGUMENT, "%s: %s",
                 drey_etcd_code_name(st.code), st.message);
    cr_assert_not(st.may_have_applied);
    drey_arena_destroy(&a);
    drey_etcd_close(e);
    etcd_stop_all(&cluster);
}

/* UNAVAILABLE after the request went out: Range, which changes nothing, is
 * sent again (until its deadline here, as this server never recovers); a
 * Put is sent once and reported as possibly applied. */
Test(protocol, unavailable_after_sending_retries_reads_and_not_writes) {
    fake f;
    fake_start(&f, GRPC_STATUS_UNAVAILABLE, false);
    drey_etcd *e = client_of_fake(&f);
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    drey_etcd_status st;
    Etcdserverpb__RangeResponse *r;
    int before = atomic_load(&f.calls);
    cr_assert_eq(drey_etcd_get(e, "k", false, 600, &a, &r, &st), GRPC_STATUS_DEADLINE_EXCEEDED, "%s",
                 drey_etcd_code_name(st.code));
    cr_assert_geq(atomic_load(&f.calls), before + 3, "Range was sent %d times", atomic_load(&f.calls) - before);
    cr_assert_neq(strstr(st.message, "not etcd"), NULL, "the last answer is kept: %s", st.message);
    cr_assert_not(st.may_have_applied);

    Etcdserverpb__PutRequest req = ETCDSERVERPB__PUT_REQUEST__INIT;
    req.key = drey_etcd_bytes("k");
    Etcdserverpb__PutResponse *resp;
    before = atomic_load(&f.calls);
    cr_assert_eq(drey_etcd_put(e, &req, 2000, &a, &resp, &st), GRPC_STATUS_UNAVAILABLE);
    cr_assert(st.may_have_applied);
    cr_assert_eq(atomic_load(&f.calls), before + 1, "sent once");
    drey_arena_destroy(&a);
    drey_etcd_close(e);
    fake_stop(&f);
}
