/* drey.cache.v1.Cache through the C client against the real dreyd: what
 * each method returns when it succeeds. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static harness_env env;

static void up(void) {
    harness_up(&env, NULL);
}

static void down(void) {
    harness_down(&env);
}

TestSuite(cache, .init = up, .fini = down, .timeout = 60);

#define CALL(method, req, type) harness_ok(&env, DREY_CLIENT_CACHE(method), &(req).base, &(type))

static Drey__Cache__V1__SetResponse *set(const char *cache, const char *key, Drey__Cache__V1__Value *v) {
    Drey__Cache__V1__SetRequest req = DREY__CACHE__V1__SET_REQUEST__INIT;
    req.cache = (char *)cache;
    req.key = (char *)key;
    req.value = v;
    return CALL("Set", req, drey__cache__v1__set_response__descriptor);
}

static Drey__Cache__V1__GetResponse *get(const char *cache, const char *key) {
    Drey__Cache__V1__GetRequest req = DREY__CACHE__V1__GET_REQUEST__INIT;
    req.cache = (char *)cache;
    req.key = (char *)key;
    return CALL("Get", req, drey__cache__v1__get_response__descriptor);
}

static int64_t ms_of(const Google__Protobuf__Timestamp *t) {
    return t->seconds * 1000 + t->nanos / 1000000;
}

Test(cache, set_then_get_returns_the_value_and_version) {
    Drey__Cache__V1__SetResponse *s = set("", "greeting", harness_string(&env, "hello"));
    cr_assert_gt(s->version, 0);
    cr_assert_null(s->expires_at, "no ttl: no expiry");
    Drey__Cache__V1__GetResponse *g = get("", "greeting");
    cr_assert(g->found);
    cr_assert_eq(g->value->kind_case, DREY__CACHE__V1__VALUE__KIND_STRING_VALUE);
    cr_assert_str_eq(g->value->string_value, "hello");
    cr_assert_eq(g->version, s->version);
    cr_assert_null(g->expires_at);

    Drey__Cache__V1__GetResponse *missing = get("", "nobody");
    cr_assert_not(missing->found);
    cr_assert_null(missing->value);
    cr_assert_eq(missing->version, 0);
}

Test(cache, every_write_gets_a_higher_version) {
    uint64_t v1 = set("", "k", harness_string(&env, "a"))->version;
    uint64_t v2 = set("", "k", harness_string(&env, "b"))->version;
    uint64_t v3 = set("", "other", harness_string(&env, "c"))->version;
    cr_assert_gt(v2, v1);
    cr_assert_gt(v3, v2);
    Drey__Cache__V1__SetRequest req = DREY__CACHE__V1__SET_REQUEST__INIT;
    req.key = "k";
    req.value = harness_string(&env, "d");
    req.condition_case = DREY__CACHE__V1__SET_REQUEST__CONDITION_IF_VERSION;
    req.if_version = v2;
    Drey__Cache__V1__SetResponse *s = CALL("Set", req, drey__cache__v1__set_response__descriptor);
    cr_assert_gt(s->version, v3, "a matching if_version applies");
    req.key = "fresh";
    req.if_version = 0;
    s = CALL("Set", req, drey__cache__v1__set_response__descriptor);
    cr_assert_gt(s->version, 0, "if_version 0 inserts an absent key");
    cr_assert_str_eq(get("", "fresh")->value->string_value, "d");
}

Test(cache, values_of_every_kind_round_trip) {
    Drey__Cache__V1__Value vals[6];
    for (int i = 0; i < 6; i++)
        drey__cache__v1__value__init(&vals[i]);
    static uint8_t blob[] = {0, 1, 2, 0xff, 0};
    vals[0].kind_case = DREY__CACHE__V1__VALUE__KIND_BYTES_VALUE;
    vals[0].bytes_value = (ProtobufCBinaryData){.len = sizeof blob, .data = blob};
    vals[1].kind_case = DREY__CACHE__V1__VALUE__KIND_INT64_VALUE;
    vals[1].int64_value = INT64_MIN;
    vals[2].kind_case = DREY__CACHE__V1__VALUE__KIND_DOUBLE_VALUE;
    vals[2].double_value = 2.5;
    vals[3].kind_case = DREY__CACHE__V1__VALUE__KIND_BOOL_VALUE;
    vals[3].bool_value = true;
    vals[4].kind_case = DREY__CACHE__V1__VALUE__KIND_NULL_VALUE;
    Google__Protobuf__Value num = GOOGLE__PROTOBUF__VALUE__INIT;
    num.kind_case = GOOGLE__PROTOBUF__VALUE__KIND_NUMBER_VALUE;
    num.number_value = 42;
    Google__Protobuf__Struct__FieldsEntry entry = GOOGLE__PROTOBUF__STRUCT__FIELDS_ENTRY__INIT;
    entry.key = "answer";
    entry.value = &num;
    Google__Protobuf__Struct__FieldsEntry *entries[] = {&entry};
    Google__Protobuf__Struct obj = GOOGLE__PROTOBUF__STRUCT__INIT;
    obj.n_fields = 1;
    obj.fields = entries;
    vals[5].kind_case = DREY__CACHE__V1__VALUE__KIND_JSON_VALUE;
    vals[5].json_value = &obj;

    const char *keys[] = {"bytes", "int", "double", "bool", "null", "json"};
    for (int i = 0; i < 6; i++)
        set("", keys[i], &vals[i]);
    Drey__Cache__V1__Value *v = get("", "bytes")->value;
    cr_assert_eq(v->kind_case, DREY__CACHE__V1__VALUE__KIND_BYTES_VALUE);
    cr_assert_eq(v->bytes_value.len, sizeof blob);
    cr_assert_eq(memcmp(v->bytes_value.data, blob, sizeof blob), 0);
    v = get("", "int")->value;
    cr_assert_eq(v->kind_case, DREY__CACHE__V1__VALUE__KIND_INT64_VALUE);
    cr_assert_eq(v->int64_value, INT64_MIN);
    v = get("", "double")->value;
    cr_assert_eq(v->kind_case, DREY__CACHE__V1__VALUE__KIND_DOUBLE_VALUE);
    cr_assert_eq(v->double_value, 2.5);
    v = get("", "bool")->value;
    cr_assert_eq(v->kind_case, DREY__CACHE__V1__VALUE__KIND_BOOL_VALUE);
    cr_assert(v->bool_value);
    v = get("", "null")->value;
    cr_assert_eq(v->kind_case, DREY__CACHE__V1__VALUE__KIND_NULL_VALUE);
    v = get("", "json")->value;
    cr_assert_eq(v->kind_case, DREY__CACHE__V1__VALUE__KIND_JSON_VALUE);
    cr_assert_eq(v->json_value->n_fields, 1);
    cr_assert_str_eq(v->json_value->fields[0]->key, "answer");
    cr_assert_eq(v->json_value->fields[0]->value->number_value, 42);
}

Test(cache, caches_are_separate_namespaces) {
    set("alpha", "k", harness_string(&env, "in alpha"));
    cr_assert_not(get("beta", "k")->found);
    cr_assert_not(get("", "k")->found);
    set("", "k", harness_string(&env, "in default"));
    cr_assert_str_eq(get("alpha", "k")->value->string_value, "in alpha");
    cr_assert_str_eq(get("", "k")->value->string_value, "in default");
}

Test(cache, ttl_expiry_and_persist) {
    int64_t before = harness_wall_ms();
    Drey__Cache__V1__SetRequest req = DREY__CACHE__V1__SET_REQUEST__INIT;
    req.key = "session";
    req.value = harness_string(&env, "s");
    req.expiration_case = DREY__CACHE__V1__SET_REQUEST__EXPIRATION_TTL;
    req.ttl = harness_duration(&env, 60000);
    Drey__Cache__V1__SetResponse *s = CALL("Set", req, drey__cache__v1__set_response__descriptor);
    int64_t after = harness_wall_ms();
    cr_assert_not_null(s->expires_at);
    cr_assert_geq(ms_of(s->expires_at), before + 60000 - 1000);
    cr_assert_leq(ms_of(s->expires_at), after + 60000 + 1000);
    Drey__Cache__V1__GetResponse *g = get("", "session");
    cr_assert_not_null(g->expires_at);
    cr_assert_eq(ms_of(g->expires_at), ms_of(s->expires_at));

    Drey__Cache__V1__GetExpirationRequest ge = DREY__CACHE__V1__GET_EXPIRATION_REQUEST__INIT;
    ge.key = "session";
    Drey__Cache__V1__GetExpirationResponse *e =
        CALL("GetExpiration", ge, drey__cache__v1__get_expiration_response__descriptor);
    cr_assert(e->found);
    cr_assert(e->has_expiration);
    int64_t remaining = e->remaining->seconds * 1000 + e->remaining->nanos / 1000000;
    cr_assert(remaining > 0 && remaining <= 60000, "remaining %lld ms", (long long)remaining);
    cr_assert_eq(ms_of(e->expires_at), ms_of(s->expires_at));

    Drey__Cache__V1__PersistRequest p = DREY__CACHE__V1__PERSIST_REQUEST__INIT;
    p.key = "session";
    Drey__Cache__V1__PersistResponse *pr = CALL("Persist", p, drey__cache__v1__persist_response__descriptor);
    cr_assert(pr->found);
    cr_assert_eq(pr->version, s->version, "persist keeps the version");
    e = CALL("GetExpiration", ge, drey__cache__v1__get_expiration_response__descriptor);
    cr_assert(e->found);
    cr_assert_not(e->has_expiration);
    cr_assert_null(e->expires_at);
    pr = CALL("Persist", p, drey__cache__v1__persist_response__descriptor);
    cr_assert_not(pr->found, "nothing to persist the second time");

    ge.key = "absent";
    e = CALL("GetExpiration", ge, drey__cache__v1__get_expiration_response__descriptor);
    cr_assert_not(e->found);
}

Test(cache, an_expiry_in_the_past_stores_an_invisible_entry) {
    Google__Protobuf__Timestamp past = GOOGLE__PROTOBUF__TIMESTAMP__INIT;
    past.seconds = harness_wall_ms() / 1000 - 60;
    Drey__Cache__V1__SetRequest req = DREY__CACHE__V1__SET_REQUEST__INIT;
    req.key = "gone";
    req.value = harness_string(&env, "x");
    req.expiration_case = DREY__CACHE__V1__SET_REQUEST__EXPIRATION_EXPIRES_AT;
    req.expires_at = &past;
    CALL("Set", req, drey__cache__v1__set_response__descriptor);
    cr_assert_not(get("", "gone")->found);
    Drey__Cache__V1__AddRequest add = DREY__CACHE__V1__ADD_REQUEST__INIT;
    add.key = "gone";
    add.value = harness_string(&env, "y");
    Drey__Cache__V1__AddResponse *a = CALL("Add", add, drey__cache__v1__add_response__descriptor);
    cr_assert(a->added, "an expired entry counts as absent");
}

Test(cache, add_inserts_only_when_absent) {
    Drey__Cache__V1__AddRequest req = DREY__CACHE__V1__ADD_REQUEST__INIT;
    req.key = "once";
    req.value = harness_string(&env, "first");
    Drey__Cache__V1__AddResponse *a = CALL("Add", req, drey__cache__v1__add_response__descriptor);
    cr_assert(a->added);
    cr_assert_gt(a->version, 0);
    cr_assert_null(a->current_value);
    req.value = harness_string(&env, "second");
    Drey__Cache__V1__AddResponse *b = CALL("Add", req, drey__cache__v1__add_response__descriptor);
    cr_assert_not(b->added);
    cr_assert_eq(b->version, a->version, "the current entry's version");
    cr_assert_str_eq(b->current_value->string_value, "first");
    cr_assert_str_eq(get("", "once")->value->string_value, "first");
}

Test(cache, update_replaces_live_keys_and_keeps_their_expiry) {
    Drey__Cache__V1__UpdateRequest up = DREY__CACHE__V1__UPDATE_REQUEST__INIT;
    up.key = "u";
    up.value = harness_string(&env, "new");
    Drey__Cache__V1__UpdateResponse *r = CALL("Update", up, drey__cache__v1__update_response__descriptor);
    cr_assert_not(r->updated, "an absent key is not updated");
    cr_assert_not(get("", "u")->found, "nor created");

    Drey__Cache__V1__SetRequest req = DREY__CACHE__V1__SET_REQUEST__INIT;
    req.key = "u";
    req.value = harness_string(&env, "old");
    req.expiration_case = DREY__CACHE__V1__SET_REQUEST__EXPIRATION_TTL;
    req.ttl = harness_duration(&env, 120000);
    Drey__Cache__V1__SetResponse *s = CALL("Set", req, drey__cache__v1__set_response__descriptor);
    r = CALL("Update", up, drey__cache__v1__update_response__descriptor);
    cr_assert(r->updated);
    cr_assert_gt(r->version, s->version);
    cr_assert_not_null(r->expires_at);
    cr_assert_eq(ms_of(r->expires_at), ms_of(s->expires_at));
    Drey__Cache__V1__GetResponse *g = get("", "u");
    cr_assert_str_eq(g->value->string_value, "new");
    cr_assert_eq(g->version, r->version);
}

Test(cache, get_or_add_returns_the_live_value_or_inserts) {
    Drey__Cache__V1__GetOrAddRequest req = DREY__CACHE__V1__GET_OR_ADD_REQUEST__INIT;
    req.key = "goa";
    req.value = harness_string(&env, "mine");
    Drey__Cache__V1__GetOrAddResponse *a = CALL("GetOrAdd", req, drey__cache__v1__get_or_add_response__descriptor);
    cr_assert(a->added);
    cr_assert_str_eq(a->value->string_value, "mine");
    req.value = harness_string(&env, "yours");
    Drey__Cache__V1__GetOrAddResponse *b = CALL("GetOrAdd", req, drey__cache__v1__get_or_add_response__descriptor);
    cr_assert_not(b->added);
    cr_assert_str_eq(b->value->string_value, "mine");
    cr_assert_eq(b->version, a->version);
}

Test(cache, remove_deletes_and_can_return_the_previous_value) {
    Drey__Cache__V1__RemoveRequest rm = DREY__CACHE__V1__REMOVE_REQUEST__INIT;
    rm.key = "r";
    Drey__Cache__V1__RemoveResponse *r = CALL("Remove", rm, drey__cache__v1__remove_response__descriptor);
    cr_assert_not(r->removed);
    uint64_t v = set("", "r", harness_string(&env, "bye"))->version;
    rm.return_previous = true;
    r = CALL("Remove", rm, drey__cache__v1__remove_response__descriptor);
    cr_assert(r->removed);
    cr_assert_eq(r->version, v);
    cr_assert_not_null(r->previous);
    cr_assert_str_eq(r->previous->string_value, "bye");
    cr_assert_not(get("", "r")->found);
}

Test(cache, increment_creates_adds_and_refuses_non_integers) {
    Drey__Cache__V1__IncrementRequest req = DREY__CACHE__V1__INCREMENT_REQUEST__INIT;
    req.key = "counter";
    req.initial = 10;
    req.delta = 5;
    Drey__Cache__V1__IncrementResponse *r = CALL("Increment", req, drey__cache__v1__increment_response__descriptor);
    cr_assert(r->created);
    cr_assert_eq(r->value, 15);
    req.delta = -20;
    Drey__Cache__V1__IncrementResponse *r2 = CALL("Increment", req, drey__cache__v1__increment_response__descriptor);
    cr_assert_not(r2->created);
    cr_assert_eq(r2->value, -5, "initial applies only on creation");
    cr_assert_gt(r2->version, r->version);
    Drey__Cache__V1__GetResponse *g = get("", "counter");
    cr_assert_eq(g->value->kind_case, DREY__CACHE__V1__VALUE__KIND_INT64_VALUE);
    cr_assert_eq(g->value->int64_value, -5);

    drey_client_status st;
    set("", "text", harness_string(&env, "12"));
    req.key = "text";
    harness_fails(&env, DREY_CLIENT_CACHE("Increment"), &req.base, &drey__cache__v1__increment_response__descriptor,
                  GRPC_STATUS_FAILED_PRECONDITION, &st);
    cr_assert_str_eq(drey_client_status_reason(&st), "NOT_AN_INTEGER");

    set("", "big", harness_int(&env, INT64_MAX - 1));
    req.key = "big";
    req.delta = 2;
    harness_fails(&env, DREY_CLIENT_CACHE("Increment"), &req.base, &drey__cache__v1__increment_response__descriptor,
                  GRPC_STATUS_OUT_OF_RANGE, &st);
    cr_assert_str_eq(drey_client_status_reason(&st), "INTEGER_OVERFLOW");
    cr_assert_eq(get("", "big")->value->int64_value, INT64_MAX - 1, "a failed increment changes nothing");
}

Test(cache, touch_sets_a_new_ttl_on_live_keys_only) {
    Drey__Cache__V1__TouchRequest t = DREY__CACHE__V1__TOUCH_REQUEST__INIT;
    t.key = "t";
    t.ttl = harness_duration(&env, 30000);
    Drey__Cache__V1__TouchResponse *r = CALL("Touch", t, drey__cache__v1__touch_response__descriptor);
    cr_assert_not(r->found);
    uint64_t v = set("", "t", harness_string(&env, "x"))->version;
    int64_t before = harness_wall_ms();
    r = CALL("Touch", t, drey__cache__v1__touch_response__descriptor);
    cr_assert(r->found);
    cr_assert_eq(r->version, v, "touch keeps the version");
    cr_assert_not_null(r->expires_at);
    cr_assert_geq(ms_of(r->expires_at), before + 30000 - 1000);
    cr_assert_eq(ms_of(get("", "t")->expires_at), ms_of(r->expires_at));
}

Test(cache, set_many_then_get_many_in_request_order) {
    Drey__Cache__V1__SetManyRequest__Entry e[3];
    Drey__Cache__V1__SetManyRequest__Entry *ep[3];
    const char *keys[] = {"m1", "m2", "m3"};
    for (int i = 0; i < 3; i++) {
        drey__cache__v1__set_many_request__entry__init(&e[i]);
        e[i].key = (char *)keys[i];
        e[i].value = harness_int(&env, i * 100);
        ep[i] = &e[i];
    }
    e[2].expiration_case = DREY__CACHE__V1__SET_MANY_REQUEST__ENTRY__EXPIRATION_TTL;
    e[2].ttl = harness_duration(&env, 60000);
    Drey__Cache__V1__SetManyRequest sm = DREY__CACHE__V1__SET_MANY_REQUEST__INIT;
    sm.cache = "batch";
    sm.n_entries = 3;
    sm.entries = ep;
    Drey__Cache__V1__SetManyResponse *r = CALL("SetMany", sm, drey__cache__v1__set_many_response__descriptor);
    cr_assert_eq(r->n_results, 3);
    cr_assert_lt(r->results[0]->version, r->results[1]->version);
    cr_assert_lt(r->results[1]->version, r->results[2]->version);
    cr_assert_null(r->results[0]->expires_at);
    cr_assert_not_null(r->results[2]->expires_at);

    char *want[] = {"m3", "absent", "m1"};
    Drey__Cache__V1__GetManyRequest gm = DREY__CACHE__V1__GET_MANY_REQUEST__INIT;
    gm.cache = "batch";
    gm.n_keys = 3;
    gm.keys = want;
    Drey__Cache__V1__GetManyResponse *g = CALL("GetMany", gm, drey__cache__v1__get_many_response__descriptor);
    cr_assert_eq(g->n_results, 3);
    cr_assert_str_eq(g->results[0]->key, "m3");
    cr_assert(g->results[0]->found);
    cr_assert_eq(g->results[0]->value->int64_value, 200);
    cr_assert_eq(g->results[0]->version, r->results[2]->version);
    cr_assert_not_null(g->results[0]->expires_at);
    cr_assert_str_eq(g->results[1]->key, "absent");
    cr_assert_not(g->results[1]->found);
    cr_assert_str_eq(g->results[2]->key, "m1");
    cr_assert_eq(g->results[2]->value->int64_value, 0);
}

Test(cache, set_without_expiration_keeps_the_expiry_and_persist_drops_it) {
    Drey__Cache__V1__SetRequest req = DREY__CACHE__V1__SET_REQUEST__INIT;
    req.key = "k";
    req.value = harness_string(&env, "a");
    req.expiration_case = DREY__CACHE__V1__SET_REQUEST__EXPIRATION_TTL;
    req.ttl = harness_duration(&env, 60000);
    Drey__Cache__V1__SetResponse *first = CALL("Set", req, drey__cache__v1__set_response__descriptor);
    req.expiration_case = DREY__CACHE__V1__SET_REQUEST__EXPIRATION__NOT_SET;
    req.value = harness_string(&env, "b");
    Drey__Cache__V1__SetResponse *kept = CALL("Set", req, drey__cache__v1__set_response__descriptor);
    cr_assert_not_null(kept->expires_at, "an existing entry keeps its expiry");
    cr_assert_eq(ms_of(kept->expires_at), ms_of(first->expires_at));
    req.expiration_case = DREY__CACHE__V1__SET_REQUEST__EXPIRATION_PERSIST;
    req.persist = true;
    Drey__Cache__V1__SetResponse *persisted = CALL("Set", req, drey__cache__v1__set_response__descriptor);
    cr_assert_null(persisted->expires_at);
    cr_assert_null(get("", "k")->expires_at);
}

Test(cache, a_retry_with_the_same_request_id_applies_once) {
    Drey__Cache__V1__IncrementRequest req = DREY__CACHE__V1__INCREMENT_REQUEST__INIT;
    req.key = "n";
    req.delta = 1;
    req.request_id = "retry-1";
    Drey__Cache__V1__IncrementResponse *a = CALL("Increment", req, drey__cache__v1__increment_response__descriptor);
    Drey__Cache__V1__IncrementResponse *b = CALL("Increment", req, drey__cache__v1__increment_response__descriptor);
    cr_assert_eq(b->value, a->value, "the retry returns the first outcome");
    cr_assert_eq(b->version, a->version);
    cr_assert_eq(get("", "n")->value->int64_value, 1, "and is not applied twice");
    req.delta = 5; /* the same id for a different request */
    drey_client_status st;
    harness_fails(&env, DREY_CLIENT_CACHE("Increment"), &req.base, &drey__cache__v1__increment_response__descriptor,
                  GRPC_STATUS_FAILED_PRECONDITION, &st);
    cr_assert_str_eq(drey_client_status_reason(&st), "IDEMPOTENCY_KEY_REUSED");
    cr_assert_eq(get("", "n")->value->int64_value, 1);
}

Test(cache, remove_many_answers_per_key) {
    uint64_t va = set("rm", "a", harness_string(&env, "1"))->version;
    Drey__Cache__V1__RemoveManyRequest req = DREY__CACHE__V1__REMOVE_MANY_REQUEST__INIT;
    char *keys[] = {"a", "missing"};
    req.cache = "rm";
    req.keys = keys;
    req.n_keys = 2;
    Drey__Cache__V1__RemoveManyResponse *r = CALL("RemoveMany", req, drey__cache__v1__remove_many_response__descriptor);
    cr_assert_eq(r->n_results, 2);
    cr_assert_str_eq(r->results[0]->key, "a");
    cr_assert(r->results[0]->removed);
    cr_assert_eq(r->results[0]->version, va);
    cr_assert_str_eq(r->results[1]->key, "missing");
    cr_assert_not(r->results[1]->removed);
    cr_assert_not(get("rm", "a")->found);
}

Test(cache, scan_pages_through_a_cache_and_clear_empties_it) {
    char key[32];
    for (int i = 0; i < 120; i++) {
        snprintf(key, sizeof key, "key-%03d", i);
        set("sc", key, harness_int(&env, i));
    }
    set("sc-other", "key-000", harness_int(&env, 0));
    bool seen[120] = {false};
    size_t total = 0, pages = 0;
    char *cursor = "";
    do {
        Drey__Cache__V1__ScanRequest req = DREY__CACHE__V1__SCAN_REQUEST__INIT;
        req.cache = "sc";
        req.limit = 25;
        req.cursor = cursor;
        req.include_values = true;
        Drey__Cache__V1__ScanResponse *r = CALL("Scan", req, drey__cache__v1__scan_response__descriptor);
        cr_assert_leq(r->n_items, 25);
        for (size_t i = 0; i < r->n_items; i++) {
            int n = atoi(r->items[i]->key + 4);
            cr_assert(n >= 0 && n < 120 && !seen[n], "%s twice or unknown", r->items[i]->key);
            seen[n] = true;
            cr_assert_eq(r->items[i]->value->int64_value, n);
            cr_assert_gt(r->items[i]->version, 0);
            total++;
        }
        cursor = r->next_cursor;
        pages++;
    } while (cursor[0] != '\0' && pages < 1000);
    cr_assert_eq(total, 120);
    cr_assert_geq(pages, 5);

    Drey__Cache__V1__GetCacheStatsRequest sreq = DREY__CACHE__V1__GET_CACHE_STATS_REQUEST__INIT;
    sreq.cache = "sc";
    Drey__Cache__V1__CacheStats *st = CALL("GetCacheStats", sreq, drey__cache__v1__cache_stats__descriptor);
    cr_assert_eq(st->entries, 120);
    cr_assert_gt(st->bytes, 120 * (8 + 7));

    Drey__Cache__V1__ClearRequest creq = DREY__CACHE__V1__CLEAR_REQUEST__INIT;
    creq.cache = "sc";
    CALL("Clear", creq, drey__cache__v1__clear_response__descriptor);
    st = CALL("GetCacheStats", sreq, drey__cache__v1__cache_stats__descriptor);
    cr_assert_eq(st->entries, 0);
    cr_assert_eq(st->bytes, 0);
    cr_assert_not(get("sc", "key-001")->found);
    cr_assert(get("sc-other", "key-000")->found);

    Drey__Cache__V1__ListCachesRequest lreq = DREY__CACHE__V1__LIST_CACHES_REQUEST__INIT;
    Drey__Cache__V1__ListCachesResponse *l = CALL("ListCaches", lreq, drey__cache__v1__list_caches_response__descriptor);
    bool other = false;
    for (size_t i = 0; i < l->n_caches; i++) {
        cr_assert_str_neq(l->caches[i]->cache, "sc", "a cleared cache is listed");
        other |= strcmp(l->caches[i]->cache, "sc-other") == 0 && l->caches[i]->entries == 1;
    }
    cr_assert(other);
}
