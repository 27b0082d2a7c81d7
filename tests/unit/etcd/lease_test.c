/* Leases against a real etcd: one left alone expires (and a watch sees its
 * key deleted), a keepalive holds one well past its TTL, through an etcd
 * restart, and reports the loss when etcd says the lease is gone or when it
 * cannot confirm a renewal in time. */
#include <stdatomic.h>

#include "etcd_fixture.h"

static etcd_cluster cluster;
static drey_etcd *e;
static drey_arena arena;
static drey_etcd_status st;

static void up(void) {
    etcd_start(&cluster, 1);
    e = client_of(cluster.endpoints);
    drey_arena_init(&arena, NULL, 0);
}

static void down(void) {
    drey_etcd_close(e);
    drey_arena_destroy(&arena);
    etcd_stop_all(&cluster);
}

TestSuite(lease, .init = up, .fini = down, .timeout = 90);

static drey_etcd_lease grant(int64_t ttl) {
    drey_etcd_lease l;
    cr_assert_eq(drey_etcd_lease_grant(e, ttl, 5000, &l, &st), GRPC_STATUS_OK, "%s", st.message);
    return l;
}

static int64_t put(const char *key, int64_t lease) {
    Etcdserverpb__PutRequest req = ETCDSERVERPB__PUT_REQUEST__INIT;
    req.key = drey_etcd_bytes(key);
    req.value = drey_etcd_bytes("here");
    req.lease = lease;
    Etcdserverpb__PutResponse *resp;
    cr_assert_eq(drey_etcd_put(e, &req, 5000, &arena, &resp, &st), GRPC_STATUS_OK, "%s", st.message);
    return resp->header->revision;
}

static size_t present(const char *key) {
    Etcdserverpb__RangeResponse *resp;
    drey_arena_reset(&arena);
    cr_assert_eq(drey_etcd_get(e, key, false, 5000, &arena, &resp, &st), GRPC_STATUS_OK, "%s", st.message);
    return resp->n_kvs;
}

typedef struct deletions {
    atomic_int deletes;
    atomic_llong at_ms;
} deletions;

static void count_deletes(void *user, Mvccpb__Event *const *events, size_t n) {
    deletions *d = user;
    for (size_t i = 0; i < n; i++)
        if (events[i]->type == MVCCPB__EVENT__EVENT_TYPE__DELETE) {
            atomic_store(&d->at_ms, drey_mono_ms());
            atomic_fetch_add(&d->deletes, 1);
        }
}

Test(lease, a_lease_without_keepalive_expires_and_a_watch_sees_the_delete) {
    drey_etcd_lease l = grant(2);
    cr_assert_eq(l.ttl_s, 2);
    int64_t rev = put("drey/nodes/n0", l.id);
    deletions d = {0};
    drey_etcd_watch *w = drey_etcd_watch_start(
        e, &(drey_etcd_watch_options){.key = "drey/nodes/", .prefix = true, .start_revision = rev + 1,
                                      .on_events = count_deletes, .user = &d});
    cr_assert_not_null(w);
    int64_t granted_ms = l.granted_ns / 1000000;
    cr_assert(FIXTURE_WAIT_UNTIL(atomic_load(&d.deletes) == 1, 10000), "no DELETE within 10 s");
    int64_t after = atomic_load(&d.at_ms) - granted_ms;
    /* etcd expires leases on its leader's schedule: at TTL, a little later
     * under load, never before. */
    cr_assert(after >= 2000 && after < 6000, "deleted %lld ms after the grant", (long long)after);
    cr_assert_eq(present("drey/nodes/n0"), 0);
    drey_etcd_watch_close(w);
}

typedef struct loss {
    atomic_int calls;
    atomic_int why;
} loss;

static void record_loss(void *user, drey_etcd_lease_loss why) {
    loss *l = user;
    atomic_store(&l->why, (int)why);
    atomic_fetch_add(&l->calls, 1);
}

Test(lease, a_keepalive_holds_the_lease_past_its_ttl) {
    drey_etcd_lease l = grant(1);
    cr_assert_leq(l.ttl_s, 2); /* etcd raises 1 s to its minimum, 1 s with this fixture's election timeout */
    put("drey/nodes/n1", l.id);
    loss lost = {0};
    drey_etcd_keepalive *ka = drey_etcd_keepalive_start(e, &l, record_loss, &lost);
    int64_t ttl_ms = l.ttl_s * 1000;
    int64_t until = drey_mono_ms() + 4 * ttl_ms;
    while (drey_mono_ms() < until) {
        cr_assert_eq(present("drey/nodes/n1"), 1, "the key went %lld ms before the end",
                     (long long)(until - drey_mono_ms()));
        cr_assert_gt(drey_etcd_keepalive_valid_until_ns(ka), drey_mono_ns(), "validity lapsed while renewing");
        fixture_pause_ms(100);
    }
    cr_assert_eq(atomic_load(&lost.calls), 0);
    /* A renewal every TTL/3: about 12 in 4 TTLs. */
    cr_assert_geq(drey_etcd_keepalive_renewals(ka), 6, "%llu renewals",
                  (unsigned long long)drey_etcd_keepalive_renewals(ka));
    /* Valid until at most one TTL after now (send time + TTL). */
    cr_assert_leq(drey_etcd_keepalive_valid_until_ns(ka), drey_mono_ns() + ttl_ms * 1000000);
    drey_etcd_keepalive_stop(ka);
    /* Stopped: the lease runs out. */
    cr_assert(FIXTURE_WAIT_UNTIL(present("drey/nodes/n1") == 0, 4 * ttl_ms + 5000));
    cr_assert_eq(atomic_load(&lost.calls), 0, "stop is not a loss");
}

Test(lease, a_revoked_lease_is_reported_expired_once) {
    drey_etcd_lease l = grant(2);
    loss lost = {0};
    drey_etcd_keepalive *ka = drey_etcd_keepalive_start(e, &l, record_loss, &lost);
    cr_assert(FIXTURE_WAIT_UNTIL(drey_etcd_keepalive_renewals(ka) >= 1, 5000));
    drey_etcd *other = client_of(cluster.endpoints);
    drey_etcd_status s;
    cr_assert_eq(drey_etcd_lease_revoke(other, l.id, 5000, &s), GRPC_STATUS_OK, "%s", s.message);
    drey_etcd_close(other);
    /* The next renewal (TTL/3 later) learns it. */
    cr_assert(FIXTURE_WAIT_UNTIL(atomic_load(&lost.calls) == 1, 5000), "no loss reported");
    cr_assert_eq(atomic_load(&lost.why), DREY_ETCD_LEASE_EXPIRED);
    uint64_t renewals = drey_etcd_keepalive_renewals(ka);
    fixture_pause_ms(1500); /* longer than a renewal interval: nothing more happens */
    cr_assert_eq(atomic_load(&lost.calls), 1);
    cr_assert_eq(drey_etcd_keepalive_renewals(ka), renewals);
    drey_etcd_keepalive_stop(ka);
}

/* A paused etcd answers no renewal: once the validity (last confirmed send +
 * TTL) passes, the loss is reported, without waiting for etcd. */
Test(lease, an_unconfirmed_renewal_is_a_loss_at_the_validity_deadline) {
    drey_etcd_lease l = grant(2);
    loss lost = {0};
    drey_etcd_keepalive *ka = drey_etcd_keepalive_start(e, &l, record_loss, &lost);
    cr_assert(FIXTURE_WAIT_UNTIL(drey_etcd_keepalive_renewals(ka) >= 1, 5000));
    etcd_signal(&cluster, 0, SIGSTOP);
    int64_t valid_until_ms = drey_etcd_keepalive_valid_until_ns(ka) / 1000000;
    cr_assert(FIXTURE_WAIT_UNTIL(atomic_load(&lost.calls) == 1, 5000), "no loss reported");
    int64_t late = drey_mono_ms() - valid_until_ms;
    etcd_signal(&cluster, 0, SIGCONT);
    cr_assert_eq(atomic_load(&lost.why), DREY_ETCD_LEASE_UNCONFIRMED);
    cr_assert(late >= 0 && late < 1000, "reported %lld ms after the validity deadline", (long long)late);
    drey_etcd_keepalive_stop(ka);
}

/* etcd killed and restarted on its data directory: the keepalive stream
 * breaks, is reopened, and the lease (persisted, and refreshed by the new
 * leader) is held throughout. */
Test(lease, a_keepalive_survives_an_etcd_restart) {
    drey_etcd_lease l = grant(6);
    put("drey/nodes/n2", l.id);
    loss lost = {0};
    drey_etcd_keepalive *ka = drey_etcd_keepalive_start(e, &l, record_loss, &lost);
    cr_assert(FIXTURE_WAIT_UNTIL(drey_etcd_keepalive_renewals(ka) >= 1, 5000));
    etcd_kill(&cluster, 0);
    etcd_restart(&cluster, 0);
    uint64_t before = drey_etcd_keepalive_renewals(ka);
    cr_assert(FIXTURE_WAIT_UNTIL(drey_etcd_keepalive_renewals(ka) >= before + 2, 10000), "no renewals after restart");
    cr_assert_eq(atomic_load(&lost.calls), 0);
    cr_assert_eq(present("drey/nodes/n2"), 1);
    drey_etcd_keepalive_stop(ka);
}

/* Left running at close: close ends it without a callback. */
Test(lease, close_ends_a_keepalive_left_running) {
    drey_etcd_lease l = grant(2);
    loss lost = {0};
    drey_etcd_keepalive *ka = drey_etcd_keepalive_start(e, &l, record_loss, &lost);
    cr_assert(FIXTURE_WAIT_UNTIL(drey_etcd_keepalive_renewals(ka) >= 1, 5000));
    drey_etcd_close(e);
    e = client_of(cluster.endpoints);
    cr_assert_eq(atomic_load(&lost.calls), 0);
}
