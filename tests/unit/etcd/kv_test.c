/* KV calls and transactions against a real etcd: round trips, the claim and
 * epoch compare-and-swap the cluster is built on, a claim race, deadlines
 * (with etcd stopped by SIGSTOP) and option checks. */
#include <pthread.h>
#include <stdint.h>

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

static int64_t put(const char *key, const char *value, int64_t lease) {
    Etcdserverpb__PutRequest req = ETCDSERVERPB__PUT_REQUEST__INIT;
    req.key = drey_etcd_bytes(key);
    req.value = drey_etcd_bytes(value);
    req.lease = lease;
    Etcdserverpb__PutResponse *resp;
    cr_assert_eq(drey_etcd_put(e, &req, 5000, &arena, &resp, &st), GRPC_STATUS_OK, "%s: %s",
                 drey_etcd_code_name(st.code), st.message);
    return resp->header->revision;
}

static Etcdserverpb__RangeResponse *get(const char *key, bool prefix) {
    Etcdserverpb__RangeResponse *resp;
    cr_assert_eq(drey_etcd_get(e, key, prefix, 5000, &arena, &resp, &st), GRPC_STATUS_OK, "%s: %s",
                 drey_etcd_code_name(st.code), st.message);
    return resp;
}

static bool value_is(const Mvccpb__KeyValue *kv, const char *v) {
    return kv->value.len == strlen(v) && memcmp(kv->value.data, v, kv->value.len) == 0;
}

TestSuite(kv, .init = up, .fini = down, .timeout = 60);
TestSuite(kv_offline, .timeout = 60); /* one timeout: see failover_test.c */

Test(kv, put_get_prefix_and_delete_round_trip) {
    int64_t r1 = put("drey/t/a", "1", 0);
    int64_t r2 = put("drey/t/b", "2", 0);
    put("drey/u", "other", 0);
    cr_assert_gt(r2, r1);
    cr_assert_eq(st.endpoint[0] != '\0', true);

    Etcdserverpb__RangeResponse *one = get("drey/t/a", false);
    cr_assert_eq(one->n_kvs, 1);
    cr_assert(value_is(one->kvs[0], "1"));
    cr_assert_eq(one->kvs[0]->mod_revision, r1);
    cr_assert_eq(one->kvs[0]->create_revision, r1);

    Etcdserverpb__RangeResponse *all = get("drey/t/", true);
    cr_assert_eq(all->n_kvs, 2);
    cr_assert(value_is(all->kvs[0], "1") && value_is(all->kvs[1], "2"));
    cr_assert_eq(get("drey/missing", false)->n_kvs, 0);

    Etcdserverpb__DeleteRangeRequest del = ETCDSERVERPB__DELETE_RANGE_REQUEST__INIT;
    del.key = drey_etcd_bytes("drey/t/");
    del.range_end = drey_etcd_prefix_end(&arena, "drey/t/");
    Etcdserverpb__DeleteRangeResponse *dresp;
    cr_assert_eq(drey_etcd_delete_range(e, &del, 5000, &arena, &dresp, &st), GRPC_STATUS_OK);
    cr_assert_eq(dresp->deleted, 2);
    cr_assert_eq(get("drey/t/", true)->n_kvs, 0);
    cr_assert_eq(get("drey/u", false)->n_kvs, 1);
}

Test(kv, prefix_end_increments_the_last_byte_below_0xff) {
    ProtobufCBinaryData end = drey_etcd_prefix_end(&arena, "ab");
    cr_assert(end.len == 2 && memcmp(end.data, "ac", 2) == 0);
    end = drey_etcd_prefix_end(&arena, "a\xff");
    cr_assert(end.len == 1 && end.data[0] == 'b');
    end = drey_etcd_prefix_end(&arena, "\xff\xff");
    cr_assert(end.len == 1 && end.data[0] == 0);
    end = drey_etcd_prefix_end(&arena, "");
    cr_assert(end.len == 1 && end.data[0] == 0);
}

/* The controller's claim: create_revision == 0 -> put with a lease, else read
 * the holder. */
static bool claim(drey_etcd *client, drey_arena *a, const char *who, int64_t lease, char *holder, size_t cap) {
    drey_etcd_txn t;
    drey_etcd_txn_init(&t, a);
    drey_etcd_txn_if_create_revision(&t, "drey/controller", DREY_ETCD_EQUAL, 0);
    drey_etcd_txn_put(&t, DREY_ETCD_THEN, "drey/controller", who, strlen(who), lease);
    drey_etcd_txn_get(&t, DREY_ETCD_ELSE, "drey/controller", false);
    Etcdserverpb__TxnResponse *resp;
    drey_etcd_status s;
    cr_assert_eq(drey_etcd_txn_commit(client, &t, 5000, a, &resp, &s), GRPC_STATUS_OK, "%s", s.message);
    if (resp->succeeded) {
        cr_assert_eq(resp->n_responses, 1);
        cr_assert_eq(resp->responses[0]->response_case, ETCDSERVERPB__RESPONSE_OP__RESPONSE_RESPONSE_PUT);
        snprintf(holder, cap, "%s", who);
        return true;
    }
    cr_assert_eq(resp->n_responses, 1);
    Etcdserverpb__RangeResponse *r = resp->responses[0]->response_range;
    cr_assert_not_null(r);
    cr_assert_eq(r->n_kvs, 1);
    snprintf(holder, cap, "%.*s", (int)r->kvs[0]->value.len, (const char *)r->kvs[0]->value.data);
    return false;
}

Test(kv, txn_claim_succeeds_once_and_tells_the_loser_who_holds_it) {
    char holder[64];
    cr_assert(claim(e, &arena, "node-0", 0, holder, sizeof holder));
    cr_assert_not(claim(e, &arena, "node-1", 0, holder, sizeof holder));
    cr_assert_str_eq(holder, "node-0");
}

/* The partition table's epoch: a write compares the entry's mod_revision, so
 * a writer with a stale epoch fails and changes nothing. */
Test(kv, txn_compare_and_swap_on_mod_revision) {
    int64_t epoch = put("drey/partitions/7", "primary=a", 0);
    drey_etcd_txn t;
    drey_etcd_txn_init(&t, &arena);
    drey_etcd_txn_if_mod_revision(&t, "drey/partitions/7", DREY_ETCD_EQUAL, epoch);
    drey_etcd_txn_put(&t, DREY_ETCD_THEN, "drey/partitions/7", "primary=b", 9, 0);
    Etcdserverpb__TxnResponse *resp;
    cr_assert_eq(drey_etcd_txn_commit(e, &t, 5000, &arena, &resp, &st), GRPC_STATUS_OK);
    cr_assert(resp->succeeded);
    int64_t new_epoch = resp->header->revision;
    cr_assert_gt(new_epoch, epoch);

    /* The same txn again: its epoch is stale now. */
    cr_assert_eq(drey_etcd_txn_commit(e, &t, 5000, &arena, &resp, &st), GRPC_STATUS_OK);
    cr_assert_not(resp->succeeded);
    Etcdserverpb__RangeResponse *now = get("drey/partitions/7", false);
    cr_assert(value_is(now->kvs[0], "primary=b"));
    cr_assert_eq(now->kvs[0]->mod_revision, new_epoch);

    /* The other compares and a delete branch. */
    drey_etcd_txn_init(&t, &arena);
    drey_etcd_txn_if_version(&t, "drey/partitions/7", DREY_ETCD_EQUAL, 2);
    drey_etcd_txn_if_value(&t, "drey/partitions/7", DREY_ETCD_EQUAL, "primary=b", 9);
    drey_etcd_txn_if_mod_revision(&t, "drey/partitions/7", DREY_ETCD_GREATER, epoch);
    drey_etcd_txn_if_create_revision(&t, "drey/partitions/7", DREY_ETCD_LESS, new_epoch);
    drey_etcd_txn_if_value(&t, "drey/partitions/7", DREY_ETCD_NOT_EQUAL, "primary=a", 9);
    drey_etcd_txn_delete(&t, DREY_ETCD_THEN, "drey/partitions/", true);
    drey_etcd_txn_put(&t, DREY_ETCD_ELSE, "drey/wrong", "x", 1, 0);
    cr_assert_eq(drey_etcd_txn_commit(e, &t, 5000, &arena, &resp, &st), GRPC_STATUS_OK);
    cr_assert(resp->succeeded);
    cr_assert_eq(resp->responses[0]->response_delete_range->deleted, 1);
    cr_assert_eq(get("drey/wrong", false)->n_kvs, 0);
}

/* Several clients (own connections, own threads) claim at once: exactly one
 * wins and every loser reads the winner. */
#define RACERS 6
typedef struct racer {
    int id;
    const char *endpoints;
    pthread_barrier_t *start;
    bool won;
    char holder[64];
} racer;

static void *race(void *arg) {
    racer *r = arg;
    drey_etcd *c = client_of(r->endpoints);
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    drey_etcd_lease lease;
    drey_etcd_status s;
    cr_assert_eq(drey_etcd_lease_grant(c, 10, 5000, &lease, &s), GRPC_STATUS_OK, "%s", s.message);
    char who[16];
    snprintf(who, sizeof who, "node-%d", r->id);
    pthread_barrier_wait(r->start);
    r->won = claim(c, &a, who, lease.id, r->holder, sizeof r->holder);
    drey_arena_destroy(&a);
    drey_etcd_close(c);
    return NULL;
}

Test(kv, a_claim_race_has_exactly_one_winner) {
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, RACERS);
    racer r[RACERS];
    pthread_t t[RACERS];
    for (int i = 0; i < RACERS; i++) {
        r[i] = (racer){.id = i, .endpoints = cluster.endpoints, .start = &start};
        pthread_create(&t[i], NULL, race, &r[i]);
    }
    for (int i = 0; i < RACERS; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&start);
    int winners = 0, winner = -1;
    for (int i = 0; i < RACERS; i++)
        if (r[i].won) {
            winners++;
            winner = i;
        }
    cr_assert_eq(winners, 1);
    for (int i = 0; i < RACERS; i++)
        cr_assert_str_eq(r[i].holder, r[winner].holder, "racer %d saw %s", i, r[i].holder);
    Etcdserverpb__RangeResponse *held = get("drey/controller", false);
    cr_assert(value_is(held->kvs[0], r[winner].holder));
    cr_assert_neq(held->kvs[0]->lease, 0);
}

/* One client, several threads calling at once (the header allows it): every
 * write lands, each with its own revision. */
#define WRITERS 4
#define WRITES 50
static void *write_many(void *arg) {
    int id = (int)(intptr_t)arg;
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    for (int i = 0; i < WRITES; i++) {
        char key[32];
        snprintf(key, sizeof key, "drey/mt/%d/%d", id, i);
        Etcdserverpb__PutRequest req = ETCDSERVERPB__PUT_REQUEST__INIT;
        req.key = drey_etcd_bytes(key);
        req.value = drey_etcd_bytes("x");
        Etcdserverpb__PutResponse *resp;
        drey_etcd_status s;
        cr_assert_eq(drey_etcd_put(e, &req, 5000, &a, &resp, &s), GRPC_STATUS_OK, "%s", s.message);
        drey_arena_reset(&a);
    }
    drey_arena_destroy(&a);
    return NULL;
}

Test(kv, one_client_serves_several_threads_at_once) {
    pthread_t t[WRITERS];
    for (int i = 0; i < WRITERS; i++)
        pthread_create(&t[i], NULL, write_many, (void *)(intptr_t)i);
    for (int i = 0; i < WRITERS; i++)
        pthread_join(t[i], NULL);
    Etcdserverpb__RangeResponse *all = get("drey/mt/", true);
    cr_assert_eq(all->n_kvs, WRITERS * WRITES);
    for (size_t i = 1; i < all->n_kvs; i++)
        cr_assert_neq(all->kvs[i]->mod_revision, all->kvs[i - 1]->mod_revision);
}

Test(kv, a_revoked_lease_takes_its_keys_and_an_unknown_one_is_not_found) {
    drey_etcd_lease lease;
    int64_t before = drey_mono_ns();
    cr_assert_eq(drey_etcd_lease_grant(e, 30, 5000, &lease, &st), GRPC_STATUS_OK, "%s", st.message);
    cr_assert_neq(lease.id, 0);
    cr_assert_eq(lease.ttl_s, 30);
    cr_assert(lease.granted_ns >= before && lease.granted_ns <= drey_mono_ns());
    put("drey/nodes/a", "x", lease.id);
    cr_assert_eq(get("drey/nodes/a", false)->kvs[0]->lease, lease.id);
    cr_assert_eq(drey_etcd_lease_revoke(e, lease.id, 5000, &st), GRPC_STATUS_OK, "%s", st.message);
    cr_assert_eq(get("drey/nodes/a", false)->n_kvs, 0);
    cr_assert_eq(drey_etcd_lease_revoke(e, lease.id, 5000, &st), GRPC_STATUS_NOT_FOUND, "%s",
                 drey_etcd_code_name(st.code));
    cr_assert_not(st.may_have_applied);
    cr_assert_neq(strstr(st.message, "lease not found"), NULL, "%s", st.message);

    /* A put naming a lease that does not exist: etcd refuses it. */
    Etcdserverpb__PutRequest req = ETCDSERVERPB__PUT_REQUEST__INIT;
    req.key = drey_etcd_bytes("drey/nodes/b");
    req.lease = lease.id;
    Etcdserverpb__PutResponse *resp;
    cr_assert_eq(drey_etcd_put(e, &req, 5000, &arena, &resp, &st), GRPC_STATUS_NOT_FOUND);
    cr_assert_null(resp);
}

Test(kv, a_passed_deadline_sends_nothing) {
    Etcdserverpb__RangeResponse *resp;
    cr_assert_eq(drey_etcd_get(e, "k", false, 0, &arena, &resp, &st), GRPC_STATUS_DEADLINE_EXCEEDED);
    cr_assert_str_eq(st.endpoint, "");
    cr_assert_not(st.may_have_applied);
}

/* A stopped etcd keeps its connections open and answers nothing: calls end
 * at their deadline; a write may have been applied, a read never matters. */
Test(kv, deadline_exceeded_while_etcd_is_stopped_then_it_works_again) {
    put("drey/k", "v", 0); /* connected */
    etcd_signal(&cluster, 0, SIGSTOP);
    Etcdserverpb__PutRequest req = ETCDSERVERPB__PUT_REQUEST__INIT;
    req.key = drey_etcd_bytes("drey/k");
    req.value = drey_etcd_bytes("w");
    Etcdserverpb__PutResponse *presp;
    int64_t t0 = drey_mono_ms();
    cr_assert_eq(drey_etcd_put(e, &req, 300, &arena, &presp, &st), GRPC_STATUS_DEADLINE_EXCEEDED, "%s",
                 drey_etcd_code_name(st.code));
    int64_t took = drey_mono_ms() - t0;
    cr_assert(took >= 290 && took < 3000, "took %lld ms", (long long)took);
    cr_assert(st.may_have_applied);
    Etcdserverpb__RangeResponse *rresp;
    cr_assert_eq(drey_etcd_get(e, "drey/k", false, 300, &arena, &rresp, &st), GRPC_STATUS_DEADLINE_EXCEEDED);
    cr_assert_not(st.may_have_applied);
    drey_etcd_lease lease;
    cr_assert_eq(drey_etcd_lease_grant(e, 5, 300, &lease, &st), GRPC_STATUS_DEADLINE_EXCEEDED);
    cr_assert(st.may_have_applied);
    etcd_signal(&cluster, 0, SIGCONT);
    cr_assert(FIXTURE_WAIT_UNTIL(drey_etcd_get(e, "drey/k", false, 1000, &arena, &rresp, &st) == GRPC_STATUS_OK,
                                 FIXTURE_DEADLINE_MS));
    cr_assert_eq(rresp->n_kvs, 1);
}

/* No etcd at all: a call waits for a connection until its deadline and says
 * which endpoint it could not reach; nothing was sent. */
Test(kv_offline, an_unreachable_endpoint_fails_at_the_deadline_without_sending) {
    char endpoint[64];
    snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%d", fixture_free_port());
    drey_etcd *c = client_of(endpoint);
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    Etcdserverpb__PutRequest req = ETCDSERVERPB__PUT_REQUEST__INIT;
    req.key = drey_etcd_bytes("k");
    Etcdserverpb__PutResponse *resp;
    drey_etcd_status s;
    cr_assert_eq(drey_etcd_put(c, &req, 400, &a, &resp, &s), GRPC_STATUS_DEADLINE_EXCEEDED, "%s",
                 drey_etcd_code_name(s.code));
    cr_assert_not(s.may_have_applied, "nothing can have been sent: %s", s.message);
    cr_assert_neq(strstr(s.message, "not connected"), NULL, "%s", s.message);
    cr_assert_str_eq(s.endpoint, endpoint + strlen("http://"));
    drey_arena_destroy(&a);
    drey_etcd_close(c);
}

Test(kv_offline, open_refuses_unusable_options) {
    char err[256];
    struct {
        drey_etcd_options o;
        const char *want;
    } bad[] = {
        {{.endpoints = NULL}, "no etcd endpoints"},
        {{.endpoints = ""}, "no etcd endpoints"},
        {{.endpoints = "http://127.0.0.1:2379", .tls.ca_file = "ca.pem"}, "no endpoint is https://"},
        {{.endpoints = "https://127.0.0.1:2379", .tls.cert_file = "c.pem"}, "needs its key"},
        {{.endpoints = "https://127.0.0.1:2379", .tls.key_file = "c.key"}, "needs its key"},
        {{.endpoints = "https://127.0.0.1:2379", .tls.ca_file = "/nonexistent/ca.pem"}, "/nonexistent/ca.pem"},
        {{.endpoints = "http://127.0.0.1:2379", .user = "drey"}, "both a user and a password file"},
        {{.endpoints = "http://127.0.0.1:2379", .password_file = "pw"}, "both a user and a password file"},
        {{.endpoints = "http://127.0.0.1:2379", .user = "drey", .password_file = "/nonexistent/pw"},
         "/nonexistent/pw: cannot be read"},
        {{.endpoints = "unix:///tmp/etcd"}, "not an http:// or https:// endpoint"},
        {{.endpoints = "http://127.0.0.1"}, "an endpoint is host:port"},
        {{.endpoints = "http://127.0.0.1:2379,,http://127.0.0.1:2380"}, "an endpoint is host:port"},
        {{.endpoints = "http://127.0.0.1:1", .connect_timeout_ms = -1}, "the connect timeout is negative"},
        {{.endpoints = "1:1,1:1,1:1,1:1,1:1,1:1,1:1,1:1,1:1,1:1,1:1,1:1,1:1,1:1,1:1,1:1,1:1"}, "more than 16"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        cr_assert_null(drey_etcd_open(&bad[i].o, err, sizeof err), "case %zu", i);
        cr_assert_neq(strstr(err, bad[i].want), NULL, "case %zu: %s", i, err);
    }
    drey_etcd *ok = drey_etcd_open(&(drey_etcd_options){.endpoints = "http://127.0.0.1:1/, 127.0.0.1:2"}, err,
                                   sizeof err);
    cr_assert_not_null(ok, "%s", err);
    drey_etcd_close(ok);
    drey_etcd_close(NULL);
    cr_assert_str_eq(drey_etcd_code_name(GRPC_STATUS_UNAVAILABLE), "UNAVAILABLE");
    cr_assert_str_eq(drey_etcd_code_name((grpc_status_code)99), "UNKNOWN_CODE");
}
