/* Endpoint failover: a dead endpoint first in the list is skipped; with a
 * three-member etcd, killing the member a client talks to moves its calls,
 * its watch (without losing or repeating an event) and its keepalive to the
 * others. */
#include <pthread.h>
#include <stdatomic.h>

#include "etcd_fixture.h"

static etcd_cluster cluster;

static void down(void) {
    etcd_stop_all(&cluster);
}

static void up1(void) {
    etcd_start(&cluster, 1);
}

static void up3(void) {
    etcd_start(&cluster, 3);
}

static bool put_ok(drey_etcd *e, const char *key, const char *value, drey_etcd_status *st) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    Etcdserverpb__PutRequest req = ETCDSERVERPB__PUT_REQUEST__INIT;
    req.key = drey_etcd_bytes(key);
    req.value = drey_etcd_bytes(value);
    Etcdserverpb__PutResponse *resp;
    bool ok = drey_etcd_put(e, &req, 2000, &a, &resp, st) == GRPC_STATUS_OK;
    drey_arena_destroy(&a);
    return ok;
}

Test(failover, a_dead_endpoint_first_is_skipped, .init = up1, .fini = down, .timeout = 60) {
    char endpoints[256], live[64];
    snprintf(endpoints, sizeof endpoints, "http://127.0.0.1:%d,%s", fixture_free_port(),
             etcd_endpoint(&cluster, 0, live, sizeof live));
    drey_etcd *e = client_of(endpoints);
    drey_etcd_status st;
    int64_t t0 = drey_mono_ms();
    cr_assert(put_ok(e, "k", "v", &st), "%s: %s", drey_etcd_code_name(st.code), st.message);
    cr_assert_lt(drey_mono_ms() - t0, 1500, "a refused connection is skipped at once");
    cr_assert_str_eq(st.endpoint, live + strlen("http://"));
    /* The next call goes straight to the endpoint that answered. */
    cr_assert(put_ok(e, "k", "w", &st));
    cr_assert_str_eq(st.endpoint, live + strlen("http://"));
    drey_etcd_close(e);
}

/* What the watch in the three-member test delivered. */
typedef struct seen {
    pthread_mutex_t mu;
    int n;
    int64_t rev[512];
    char value[512][16];
} seen;

static void on_events(void *user, Mvccpb__Event *const *events, size_t n) {
    seen *s = user;
    pthread_mutex_lock(&s->mu);
    for (size_t i = 0; i < n && s->n < 512; i++) {
        s->rev[s->n] = events[i]->kv->mod_revision;
        snprintf(s->value[s->n], sizeof s->value[0], "%.*s", (int)events[i]->kv->value.len,
                 (const char *)events[i]->kv->value.data);
        s->n++;
    }
    pthread_mutex_unlock(&s->mu);
}

static int count(seen *s) {
    pthread_mutex_lock(&s->mu);
    int n = s->n;
    pthread_mutex_unlock(&s->mu);
    return n;
}

static atomic_int lost;

static void on_lost(void *user, drey_etcd_lease_loss why) {
    (void)user;
    (void)why;
    atomic_fetch_add(&lost, 1);
}

static int member_of(const char *endpoint) {
    for (int i = 0; i < cluster.n; i++) {
        char ep[64];
        snprintf(ep, sizeof ep, "127.0.0.1:%d", cluster.m[i].client_port);
        if (strcmp(ep, endpoint) == 0)
            return i;
    }
    cr_assert_fail("%s is no member's endpoint", endpoint);
    return -1;
}

Test(failover, killing_the_members_endpoint_moves_calls_watch_and_keepalive, .init = up3, .fini = down,
     .timeout = 120) {
    drey_etcd *e = client_of(cluster.endpoints);
    drey_etcd_status st;
    cr_assert(put_ok(e, "drey/f/k", "start", &st), "%s", st.message);
    int victim = member_of(st.endpoint);

    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    Etcdserverpb__RangeResponse *r;
    cr_assert_eq(drey_etcd_get(e, "drey/f/k", false, 5000, &a, &r, &st), GRPC_STATUS_OK);
    int64_t start = r->kvs[0]->mod_revision;
    seen s = {.n = 0};
    pthread_mutex_init(&s.mu, NULL);
    drey_etcd_watch *w = drey_etcd_watch_start(
        e, &(drey_etcd_watch_options){.key = "drey/f/", .prefix = true, .start_revision = start,
                                      .on_events = on_events, .user = &s});
    drey_etcd_lease lease;
    cr_assert_eq(drey_etcd_lease_grant(e, 3, 5000, &lease, &st), GRPC_STATUS_OK, "%s", st.message);
    drey_etcd_keepalive *ka = drey_etcd_keepalive_start(e, &lease, on_lost, NULL);
    cr_assert(FIXTURE_WAIT_UNTIL(drey_etcd_keepalive_renewals(ka) >= 1 && count(&s) == 1, 10000));

    /* Writes before, then the member goes, then writes through another
     * client of the surviving members while ours moves over. */
    char vals[40][16];
    for (int i = 0; i < 20; i++) {
        snprintf(vals[i], sizeof vals[i], "v%d", i);
        cr_assert(put_ok(e, "drey/f/k", vals[i], &st));
    }
    etcd_kill(&cluster, victim);
    char others[200] = "";
    for (int i = 0, used = 0; i < cluster.n; i++)
        if (i != victim)
            used += snprintf(others + used, sizeof others - (size_t)used, "%shttp://127.0.0.1:%d", used ? "," : "",
                             cluster.m[i].client_port);
    drey_etcd *writer = client_of(others);
    for (int i = 20; i < 40; i++) {
        snprintf(vals[i], sizeof vals[i], "v%d", i);
        cr_assert(FIXTURE_WAIT_UNTIL(put_ok(writer, "drey/f/k", vals[i], &st), 20000), "%s", st.message);
    }
    /* Our client's reads move over: the killed endpoint is refused now. */
    cr_assert(FIXTURE_WAIT_UNTIL(drey_etcd_get(e, "drey/f/k", false, 2000, &a, &r, &st) == GRPC_STATUS_OK, 20000),
              "%s: %s", drey_etcd_code_name(st.code), st.message);
    cr_assert_neq(member_of(st.endpoint), victim);
    cr_assert(r->kvs[0]->value.len == 3 && memcmp(r->kvs[0]->value.data, "v39", 3) == 0);

    cr_assert(FIXTURE_WAIT_UNTIL(count(&s) >= 41, 20000), "%d events", count(&s));
    fixture_pause_ms(200);
    pthread_mutex_lock(&s.mu);
    cr_assert_eq(s.n, 41);
    cr_assert_str_eq(s.value[0], "start");
    for (int i = 0; i < 40; i++) {
        cr_assert_str_eq(s.value[i + 1], vals[i], "event %d", i + 1);
        cr_assert_gt(s.rev[i + 1], s.rev[i]);
    }
    pthread_mutex_unlock(&s.mu);
    cr_assert_geq(drey_etcd_watch_stats_of(w).streams, 2);

    /* The keepalive moved too: renewals continue for two more TTLs. */
    uint64_t renewals = drey_etcd_keepalive_renewals(ka);
    cr_assert(FIXTURE_WAIT_UNTIL(drey_etcd_keepalive_renewals(ka) >= renewals + 3, 10000));
    cr_assert_eq(atomic_load(&lost), 0);
    drey_etcd_keepalive_stop(ka);
    drey_etcd_watch_close(w);
    drey_arena_destroy(&a);
    drey_etcd_close(writer);
    drey_etcd_close(e);
}
