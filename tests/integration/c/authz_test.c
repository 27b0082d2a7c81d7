/* --authz-policy through the C client (grpc core): a node without token
 * keys, whose anonymous callers may read, write and delete keys under "ok:"
 * of the cache "app", scan it under "ok:", and watch only the cache
 * "watched". Batches are refused whole, each Pipeline operation gets its own
 * answer, a Watch beyond the grant is refused, and so a near cache of a
 * cache the caller may not watch does not open: it never serves what it
 * cannot hear invalidations for. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

static harness_env env;
static char dir[512], policy[600], flag[700];

static void up(void) {
    harness_mkdtemp(dir, sizeof dir, "authz");
    snprintf(policy, sizeof policy, "%s/policy.json", dir);
    FILE *f = fopen(policy, "w");
    cr_assert_not_null(f);
    fputs("{\"roles\": {\"anon\": ["
          "  {\"caches\": [\"app\"], \"keys\": [\"ok:*\"], \"verbs\": [\"read\", \"write\", \"delete\", \"scan\"]},"
          "  {\"caches\": [\"watched\"], \"keys\": [\"*\"], \"verbs\": [\"read\", \"write\", \"watch\"]}]},"
          " \"bindings\": [{\"anonymous\": true, \"roles\": [\"anon\"]}]}",
          f);
    fclose(f);
    snprintf(flag, sizeof flag, "--authz-policy=%s", policy);
    const char *const flags[] = {"--ephemeral", flag, NULL};
    harness_up(&env, flags);
}

static void down(void) {
    harness_down(&env);
    harness_rmdir(dir);
}

TestSuite(authz, .init = up, .fini = down, .timeout = 120);

static void denied(const drey_client_status *st, const char *verb, const char *cache) {
    cr_assert_eq(st->code, GRPC_STATUS_PERMISSION_DENIED, "%s", drey_client_code_name(st->code));
    cr_assert_str_eq(drey_client_status_reason(st), "NOT_PERMITTED");
    cr_assert_str_eq(drey_client_status_metadata(st, "verb"), verb);
    cr_assert_str_eq(drey_client_status_metadata(st, "cache"), cache);
}

static void set(const char *cache, const char *key) {
    Drey__Cache__V1__SetRequest req = DREY__CACHE__V1__SET_REQUEST__INIT;
    req.cache = (char *)cache;
    req.key = (char *)key;
    req.value = harness_string(&env, "v");
    harness_ok(&env, DREY_CLIENT_CACHE("Set"), &req.base, &drey__cache__v1__set_response__descriptor);
}

static bool found(const char *cache, const char *key) {
    Drey__Cache__V1__GetRequest req = DREY__CACHE__V1__GET_REQUEST__INIT;
    req.cache = (char *)cache;
    req.key = (char *)key;
    Drey__Cache__V1__GetResponse *r =
        harness_ok(&env, DREY_CLIENT_CACHE("Get"), &req.base, &drey__cache__v1__get_response__descriptor);
    return r->found;
}

Test(authz, single_keys_and_batches_whole) {
    set("app", "ok:1");
    cr_assert(found("app", "ok:1"));
    drey_client_status st;
    Drey__Cache__V1__SetRequest bad = DREY__CACHE__V1__SET_REQUEST__INIT;
    bad.cache = "app";
    bad.key = "secret:1";
    bad.value = harness_string(&env, "v");
    harness_fails(&env, DREY_CLIENT_CACHE("Set"), &bad.base, &drey__cache__v1__set_response__descriptor,
                  GRPC_STATUS_PERMISSION_DENIED, &st);
    denied(&st, "write", "app");
    cr_assert_null(strstr(st.message, "secret"), "the key is never in the answer");

    Drey__Cache__V1__SetManyRequest__Entry e1 = DREY__CACHE__V1__SET_MANY_REQUEST__ENTRY__INIT,
                                            e2 = DREY__CACHE__V1__SET_MANY_REQUEST__ENTRY__INIT;
    e1.key = "ok:2";
    e1.value = harness_string(&env, "v");
    e2.key = "no:2";
    e2.value = harness_string(&env, "v");
    Drey__Cache__V1__SetManyRequest__Entry *entries[] = {&e1, &e2};
    Drey__Cache__V1__SetManyRequest sm = DREY__CACHE__V1__SET_MANY_REQUEST__INIT;
    sm.cache = "app";
    sm.n_entries = 2;
    sm.entries = entries;
    harness_fails(&env, DREY_CLIENT_CACHE("SetMany"), &sm.base, &drey__cache__v1__set_many_response__descriptor,
                  GRPC_STATUS_PERMISSION_DENIED, &st);
    denied(&st, "write", "app");
    cr_assert_not(found("app", "ok:2"), "the granted entry of a refused batch was not written");

    char *keys[] = {"ok:1", "no:1"};
    Drey__Cache__V1__RemoveManyRequest rm = DREY__CACHE__V1__REMOVE_MANY_REQUEST__INIT;
    rm.cache = "app";
    rm.n_keys = 2;
    rm.keys = keys;
    harness_fails(&env, DREY_CLIENT_CACHE("RemoveMany"), &rm.base,
                  &drey__cache__v1__remove_many_response__descriptor, GRPC_STATUS_PERMISSION_DENIED, &st);
    denied(&st, "delete", "app");
    cr_assert(found("app", "ok:1"));
    Drey__Cache__V1__GetManyRequest gm = DREY__CACHE__V1__GET_MANY_REQUEST__INIT;
    gm.cache = "app";
    gm.n_keys = 2;
    gm.keys = keys;
    harness_fails(&env, DREY_CLIENT_CACHE("GetMany"), &gm.base, &drey__cache__v1__get_many_response__descriptor,
                  GRPC_STATUS_PERMISSION_DENIED, &st);
    denied(&st, "read", "app");

    Drey__Cache__V1__ScanRequest scan = DREY__CACHE__V1__SCAN_REQUEST__INIT;
    scan.cache = "app";
    scan.prefix = "ok:";
    Drey__Cache__V1__ScanResponse *page =
        harness_ok(&env, DREY_CLIENT_CACHE("Scan"), &scan.base, &drey__cache__v1__scan_response__descriptor);
    cr_assert_geq(page->n_items, 1);
    scan.prefix = "";
    harness_fails(&env, DREY_CLIENT_CACHE("Scan"), &scan.base, &drey__cache__v1__scan_response__descriptor,
                  GRPC_STATUS_PERMISSION_DENIED, &st);
    denied(&st, "scan", "app");
    Drey__Cache__V1__ClearRequest clear = DREY__CACHE__V1__CLEAR_REQUEST__INIT;
    clear.cache = "app";
    harness_fails(&env, DREY_CLIENT_CACHE("Clear"), &clear.base, &drey__cache__v1__clear_response__descriptor,
                  GRPC_STATUS_PERMISSION_DENIED, &st);
    denied(&st, "clear", "app");
}

Test(authz, each_pipeline_operation_is_answered_on_its_own) {
    drey_client_status st;
    drey_client_pipeline *p = drey_client_pipeline_open(env.client, 60000, &st);
    cr_assert_not_null(p);
    Drey__Cache__V1__SetRequest ok = DREY__CACHE__V1__SET_REQUEST__INIT, no = DREY__CACHE__V1__SET_REQUEST__INIT;
    ok.cache = no.cache = "app";
    ok.key = "ok:p";
    no.key = "no:p";
    ok.value = no.value = harness_string(&env, "v");
    Drey__Cache__V1__GetRequest get = DREY__CACHE__V1__GET_REQUEST__INIT;
    get.cache = "app";
    get.key = "ok:p";
    cr_assert(drey_client_pipeline_add(p, 1, &ok.base, DREY_CLIENT_NO_DEADLINE));
    cr_assert(drey_client_pipeline_add(p, 2, &no.base, DREY_CLIENT_NO_DEADLINE));
    cr_assert(drey_client_pipeline_add(p, 3, &get.base, DREY_CLIENT_NO_DEADLINE));
    cr_assert(drey_client_pipeline_flush(p));
    grpc_status_code want[] = {GRPC_STATUS_OK, GRPC_STATUS_PERMISSION_DENIED, GRPC_STATUS_OK};
    for (size_t got = 0; got < 3;) {
        Drey__Cache__V1__PipelineResponse *resp;
        cr_assert(drey_client_pipeline_next(p, 30000, &env.arena, &resp));
        for (size_t i = 0; i < resp->n_results; i++, got++) {
            cr_assert_eq(resp->results[i]->id, got + 1);
            cr_assert_eq(drey_client_pipeline_result_status(resp->results[i], &env.arena, &st), want[got],
                         "operation %zu", got + 1);
            if (want[got] == GRPC_STATUS_PERMISSION_DENIED)
                denied(&st, "write", "app");
        }
    }
    drey_client_pipeline_close_send(p);
    cr_assert_eq(drey_client_pipeline_finish(p, &env.arena, &st), GRPC_STATUS_OK);
}

Test(authz, watches_and_near_caches_only_where_watch_is_granted) {
    drey_client_status st;
    Drey__Cache__V1__WatchRequest w = DREY__CACHE__V1__WATCH_REQUEST__INIT;
    w.cache = "app";
    drey_client_stream *s = drey_client_watch(env.client, &w, 30000, &st);
    cr_assert_not_null(s);
    ProtobufCMessage *ev;
    cr_assert_not(drey_client_stream_read(s, &drey__cache__v1__watch_event__descriptor, &env.arena, &ev),
                  "a watch of a cache not granted delivered an event");
    cr_assert_eq(drey_client_stream_finish(s, &env.arena, &st), GRPC_STATUS_PERMISSION_DENIED);
    denied(&st, "watch", "app");

    char err[256];
    drey_near_options o = {.server = {.target = env.server.addr}, .cache = "app"};
    drey_near_cache *n = drey_near_open(&o, 5000, err, sizeof err);
    cr_assert_null(n, "a near cache opened without the right to hear its invalidations");
    o.cache = "watched";
    n = drey_near_open(&o, HARNESS_DEADLINE_MS, err, sizeof err);
    cr_assert_not_null(n, "%s", err);
    set("watched", "k");
    bool f;
    Drey__Cache__V1__Value *v;
    uint64_t version;
    cr_assert(drey_near_get(n, "k", 30000, &env.arena, &f, &v, &version, &st));
    cr_assert(f);
    drey_near_close(n);
}
