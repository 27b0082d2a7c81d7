/* Failures through the C client against the real dreyd: the gRPC code, and
 * the google.rpc.Status details (ErrorInfo, BadRequest) that explain it. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

static harness_env env;

static void up(void) {
    harness_up(&env, NULL);
}

/* Small limits, so that limit violations need small requests. */
static void up_small(void) {
    static const char *const flags[] = {"--max-recv-message-bytes=4096", "--max-value-bytes=64", "--max-batch=2",
                                        "--max-key-bytes=8", NULL};
    harness_up(&env, flags);
}

static void down(void) {
    harness_down(&env);
}

TestSuite(errors, .init = up, .fini = down, .timeout = 60);
TestSuite(limits, .init = up_small, .fini = down, .timeout = 60);

#define OK(method, req, type) harness_ok(&env, DREY_CLIENT_CACHE(method), &(req).base, &(type))
#define FAILS(method, req, type, code, st) \
    harness_fails(&env, DREY_CLIENT_CACHE(method), &(req).base, &(type), (code), (st))

static uint64_t set(const char *key, const char *value) {
    Drey__Cache__V1__SetRequest req = DREY__CACHE__V1__SET_REQUEST__INIT;
    req.key = (char *)key;
    req.value = harness_string(&env, value);
    return ((Drey__Cache__V1__SetResponse *)OK("Set", req, drey__cache__v1__set_response__descriptor))->version;
}

static Drey__Cache__V1__GetResponse *get(const char *key) {
    Drey__Cache__V1__GetRequest req = DREY__CACHE__V1__GET_REQUEST__INIT;
    req.key = (char *)key;
    return OK("Get", req, drey__cache__v1__get_response__descriptor);
}

/* The ErrorInfo every drey failure carries. */
static void assert_error_info(const drey_client_status *st, const char *reason) {
    cr_assert_not_null(st->details, "grpc-status-details-bin is missing");
    cr_assert_eq(st->details->code, (int32_t)st->code, "google.rpc.Status.code matches the gRPC code");
    cr_assert_str_eq(st->details->message, st->message);
    cr_assert_not_null(st->error_info, "no ErrorInfo in the details");
    cr_assert_str_eq(drey_client_status_reason(st), reason);
    cr_assert_str_eq(drey_client_status_domain(st), "drey.dev");
}

/* A field violation with this path and reason. */
static void assert_violation(const drey_client_status *st, const char *field, const char *reason) {
    cr_assert_not_null(st->bad_request, "no BadRequest in the details");
    const Google__Rpc__BadRequest__FieldViolation *v = drey_client_status_violation(st, field);
    if (v == NULL) {
        for (size_t i = 0; i < st->bad_request->n_field_violations; i++)
            fprintf(stderr, "  violation: %s %s\n", st->bad_request->field_violations[i]->field,
                    st->bad_request->field_violations[i]->reason);
        cr_assert_fail("no violation of field %s", field);
    }
    cr_assert_str_eq(v->reason, reason, "field %s", field);
    cr_assert_str_neq(v->description, "");
}

/* --- compare-and-set ------------------------------------------------------ */

Test(errors, set_with_a_stale_version_names_the_current_one) {
    uint64_t v = set("k", "original");
    Drey__Cache__V1__SetRequest req = DREY__CACHE__V1__SET_REQUEST__INIT;
    req.key = "k";
    req.value = harness_string(&env, "clobber");
    req.condition_case = DREY__CACHE__V1__SET_REQUEST__CONDITION_IF_VERSION;
    req.if_version = v + 1000;
    drey_client_status st;
    FAILS("Set", req, drey__cache__v1__set_response__descriptor, GRPC_STATUS_FAILED_PRECONDITION, &st);
    assert_error_info(&st, "VERSION_MISMATCH");
    char want[32];
    snprintf(want, sizeof want, "%llu", (unsigned long long)v);
    cr_assert_not_null(drey_client_status_metadata(&st, "currentVersion"));
    cr_assert_str_eq(drey_client_status_metadata(&st, "currentVersion"), want);
    cr_assert_null(st.bad_request, "a precondition failure is not a bad request");
    Drey__Cache__V1__GetResponse *g = get("k");
    cr_assert_str_eq(g->value->string_value, "original", "nothing was written");
    cr_assert_eq(g->version, v);

    req.if_version = 0; /* only if absent */
    FAILS("Set", req, drey__cache__v1__set_response__descriptor, GRPC_STATUS_FAILED_PRECONDITION, &st);
    cr_assert_str_eq(drey_client_status_metadata(&st, "currentVersion"), want);
}

Test(errors, a_condition_on_an_absent_key_reports_version_zero) {
    Drey__Cache__V1__SetRequest req = DREY__CACHE__V1__SET_REQUEST__INIT;
    req.key = "absent";
    req.value = harness_string(&env, "x");
    req.condition_case = DREY__CACHE__V1__SET_REQUEST__CONDITION_IF_VERSION;
    req.if_version = 5;
    drey_client_status st;
    FAILS("Set", req, drey__cache__v1__set_response__descriptor, GRPC_STATUS_FAILED_PRECONDITION, &st);
    assert_error_info(&st, "VERSION_MISMATCH");
    cr_assert_str_eq(drey_client_status_metadata(&st, "currentVersion"), "0");
    cr_assert_not(get("absent")->found);
}

Test(errors, remove_and_update_check_the_version_too) {
    uint64_t v = set("k", "keep");
    drey_client_status st;
    Drey__Cache__V1__RemoveRequest rm = DREY__CACHE__V1__REMOVE_REQUEST__INIT;
    rm.key = "k";
    rm.condition_case = DREY__CACHE__V1__REMOVE_REQUEST__CONDITION_IF_VERSION;
    rm.if_version = v - 1;
    FAILS("Remove", rm, drey__cache__v1__remove_response__descriptor, GRPC_STATUS_FAILED_PRECONDITION, &st);
    assert_error_info(&st, "VERSION_MISMATCH");
    Drey__Cache__V1__UpdateRequest up = DREY__CACHE__V1__UPDATE_REQUEST__INIT;
    up.key = "k";
    up.value = harness_string(&env, "changed");
    up.condition_case = DREY__CACHE__V1__UPDATE_REQUEST__CONDITION_IF_VERSION;
    up.if_version = v + 1;
    FAILS("Update", up, drey__cache__v1__update_response__descriptor, GRPC_STATUS_FAILED_PRECONDITION, &st);
    assert_error_info(&st, "VERSION_MISMATCH");
    Drey__Cache__V1__GetResponse *g = get("k");
    cr_assert_str_eq(g->value->string_value, "keep");
    cr_assert_eq(g->version, v);
    rm.if_version = v;
    cr_assert(((Drey__Cache__V1__RemoveResponse *)OK("Remove", rm, drey__cache__v1__remove_response__descriptor))
                  ->removed);
}

Test(errors, set_many_applies_nothing_when_one_condition_fails) {
    uint64_t v = set("b", "old b");
    Drey__Cache__V1__SetManyRequest__Entry e[2];
    Drey__Cache__V1__SetManyRequest__Entry *ep[2] = {&e[0], &e[1]};
    drey__cache__v1__set_many_request__entry__init(&e[0]);
    drey__cache__v1__set_many_request__entry__init(&e[1]);
    e[0].key = "a";
    e[0].value = harness_string(&env, "new a");
    e[1].key = "b";
    e[1].value = harness_string(&env, "new b");
    e[1].condition_case = DREY__CACHE__V1__SET_MANY_REQUEST__ENTRY__CONDITION_IF_VERSION;
    e[1].if_version = v + 7;
    Drey__Cache__V1__SetManyRequest req = DREY__CACHE__V1__SET_MANY_REQUEST__INIT;
    req.n_entries = 2;
    req.entries = ep;
    drey_client_status st;
    FAILS("SetMany", req, drey__cache__v1__set_many_response__descriptor, GRPC_STATUS_FAILED_PRECONDITION, &st);
    assert_error_info(&st, "VERSION_MISMATCH");
    cr_assert_not_null(drey_client_status_metadata(&st, "entryIndex"));
    cr_assert_str_eq(drey_client_status_metadata(&st, "entryIndex"), "1");
    cr_assert_not(get("a")->found, "the batch is all or nothing");
    cr_assert_str_eq(get("b")->value->string_value, "old b");
}

/* --- validation ----------------------------------------------------------- */

Test(errors, every_invalid_field_is_named) {
    Drey__Cache__V1__SetRequest req = DREY__CACHE__V1__SET_REQUEST__INIT;
    req.cache = "no spaces allowed";
    req.key = "";
    /* no value */
    drey_client_status st;
    FAILS("Set", req, drey__cache__v1__set_response__descriptor, GRPC_STATUS_INVALID_ARGUMENT, &st);
    cr_assert_not_null(st.error_info);
    cr_assert_str_eq(drey_client_status_domain(&st), "drey.dev");
    assert_violation(&st, "cache", "INVALID_CACHE_NAME");
    assert_violation(&st, "key", "INVALID_KEY");
    assert_violation(&st, "value", "INVALID_VALUE");
    cr_assert_eq(st.bad_request->n_field_violations, 3);
    /* The first violation explains the call. */
    cr_assert_str_eq(drey_client_status_reason(&st), st.bad_request->field_violations[0]->reason);
}

Test(errors, messages_never_echo_what_the_caller_sent) {
    Drey__Cache__V1__GetRequest req = DREY__CACHE__V1__GET_REQUEST__INIT;
    req.key = "secret\x01token";
    drey_client_status st;
    FAILS("Get", req, drey__cache__v1__get_response__descriptor, GRPC_STATUS_INVALID_ARGUMENT, &st);
    assert_error_info(&st, "INVALID_KEY");
    assert_violation(&st, "key", "INVALID_KEY");
    cr_assert_null(strstr(st.message, "secret"), "%s", st.message);
    cr_assert_null(strstr(st.bad_request->field_violations[0]->description, "secret"));
}

Test(errors, batch_fields_carry_their_index) {
    Drey__Cache__V1__SetManyRequest__Entry e[3];
    Drey__Cache__V1__SetManyRequest__Entry *ep[3] = {&e[0], &e[1], &e[2]};
    for (int i = 0; i < 3; i++) {
        drey__cache__v1__set_many_request__entry__init(&e[i]);
        e[i].value = harness_string(&env, "v");
    }
    e[0].key = "ok";
    e[0].expiration_case = DREY__CACHE__V1__SET_MANY_REQUEST__ENTRY__EXPIRATION_TTL;
    e[0].ttl = harness_duration(&env, 0); /* ttl must be positive */
    e[1].key = "bad\nkey";
    e[2].key = "ok"; /* duplicate of entries[0] */
    Drey__Cache__V1__SetManyRequest req = DREY__CACHE__V1__SET_MANY_REQUEST__INIT;
    req.n_entries = 3;
    req.entries = ep;
    drey_client_status st;
    FAILS("SetMany", req, drey__cache__v1__set_many_response__descriptor, GRPC_STATUS_INVALID_ARGUMENT, &st);
    assert_violation(&st, "entries[0].ttl", "INVALID_EXPIRATION");
    assert_violation(&st, "entries[1].key", "INVALID_KEY");
    assert_violation(&st, "entries[2].key", "DUPLICATE_KEY");
    cr_assert_not(get("ok")->found);

    char *keys[] = {"fine", ""};
    Drey__Cache__V1__GetManyRequest gm = DREY__CACHE__V1__GET_MANY_REQUEST__INIT;
    gm.n_keys = 2;
    gm.keys = keys;
    FAILS("GetMany", gm, drey__cache__v1__get_many_response__descriptor, GRPC_STATUS_INVALID_ARGUMENT, &st);
    assert_violation(&st, "keys[1]", "INVALID_KEY");
    cr_assert_null(drey_client_status_violation(&st, "keys[0]"));
}

Test(errors, touch_needs_a_ttl) {
    Drey__Cache__V1__TouchRequest req = DREY__CACHE__V1__TOUCH_REQUEST__INIT;
    req.key = "k";
    drey_client_status st;
    FAILS("Touch", req, drey__cache__v1__touch_response__descriptor, GRPC_STATUS_INVALID_ARGUMENT, &st);
    assert_error_info(&st, "INVALID_EXPIRATION");
    assert_violation(&st, "ttl", "INVALID_EXPIRATION");
}

Test(errors, invalid_utf8_on_the_wire_is_an_invalid_key) {
    /* GetRequest{key: "\xff"} encoded by hand: protobuf-c would not check. */
    static const uint8_t wire[] = {0x12, 0x01, 0xff};
    ProtobufCBinaryData resp;
    drey_client_status st;
    cr_assert_eq(drey_client_unary_raw(env.client, DREY_CLIENT_CACHE("Get"), wire, sizeof wire, 10000, &env.arena,
                                       &resp, &st),
                 GRPC_STATUS_INVALID_ARGUMENT, "%s", drey_client_code_name(st.code));
    assert_error_info(&st, "INVALID_KEY");
    assert_violation(&st, "key", "INVALID_KEY");
}

Test(errors, bytes_that_are_not_the_request_type_are_malformed) {
    static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff};
    ProtobufCBinaryData resp;
    drey_client_status st;
    cr_assert_eq(drey_client_unary_raw(env.client, DREY_CLIENT_CACHE("Set"), junk, sizeof junk, 10000, &env.arena,
                                       &resp, &st),
                 GRPC_STATUS_INVALID_ARGUMENT, "%s", drey_client_code_name(st.code));
    assert_error_info(&st, "MALFORMED_REQUEST");
    cr_assert_eq(resp.len, 0);
}

/* --- unknown methods, deadlines ------------------------------------------- */

Test(errors, an_unknown_method_is_unimplemented) {
    const char *methods[] = {DREY_CLIENT_CACHE("Frobnicate"), "/nope.v1.Nothing/Get"};
    for (size_t i = 0; i < 2; i++) {
        ProtobufCBinaryData resp;
        drey_client_status st;
        cr_assert_eq(drey_client_unary_raw(env.client, methods[i], "", 0, 10000, &env.arena, &resp, &st),
                     GRPC_STATUS_UNIMPLEMENTED, "%s: %s", methods[i], drey_client_code_name(st.code));
        assert_error_info(&st, "UNKNOWN_METHOD");
    }
    set("still", "serving");
}

Test(errors, an_expired_deadline_is_deadline_exceeded) {
    Drey__Cache__V1__GetRequest req = DREY__CACHE__V1__GET_REQUEST__INIT;
    req.key = "k";
    ProtobufCMessage *resp;
    drey_client_status st;
    cr_assert_eq(drey_client_unary(env.client, DREY_CLIENT_CACHE("Get"), &req.base,
                                   &drey__cache__v1__get_response__descriptor, 0, &env.arena, &resp, &st),
                 GRPC_STATUS_DEADLINE_EXCEEDED, "%s", drey_client_code_name(st.code));
    cr_assert_null(resp);
    cr_assert_not(get("k")->found, "the server serves the next call");
}

/* --- limits --------------------------------------------------------------- */

Test(limits, an_oversized_request_is_resource_exhausted) {
    size_t n = 8192; /* over --max-recv-message-bytes=4096 */
    char *big = drey_arena_alloc(&env.arena, n + 1);
    memset(big, 'x', n);
    big[n] = '\0';
    Drey__Cache__V1__SetRequest req = DREY__CACHE__V1__SET_REQUEST__INIT;
    req.key = "k";
    req.value = harness_string(&env, big);
    drey_client_status st;
    FAILS("Set", req, drey__cache__v1__set_response__descriptor, GRPC_STATUS_RESOURCE_EXHAUSTED, &st);
    cr_assert_not(get("k")->found);
}

Test(limits, a_value_over_max_value_bytes_is_payload_too_large) {
    char v[100];
    memset(v, 'v', sizeof v - 1);
    v[sizeof v - 1] = '\0';
    Drey__Cache__V1__SetRequest req = DREY__CACHE__V1__SET_REQUEST__INIT;
    req.key = "k";
    req.value = harness_string(&env, v);
    drey_client_status st;
    FAILS("Set", req, drey__cache__v1__set_response__descriptor, GRPC_STATUS_INVALID_ARGUMENT, &st);
    assert_error_info(&st, "PAYLOAD_TOO_LARGE");
    assert_violation(&st, "value", "PAYLOAD_TOO_LARGE");
    cr_assert_not_null(drey_client_status_metadata(&st, "limitBytes"));
    cr_assert_str_eq(drey_client_status_metadata(&st, "limitBytes"), "64");
}

Test(limits, a_batch_over_max_batch_is_batch_too_large) {
    char *keys[] = {"a", "b", "c"};
    Drey__Cache__V1__GetManyRequest req = DREY__CACHE__V1__GET_MANY_REQUEST__INIT;
    req.n_keys = 3;
    req.keys = keys;
    drey_client_status st;
    FAILS("GetMany", req, drey__cache__v1__get_many_response__descriptor, GRPC_STATUS_INVALID_ARGUMENT, &st);
    assert_error_info(&st, "BATCH_TOO_LARGE");
    assert_violation(&st, "keys", "BATCH_TOO_LARGE");
    cr_assert_str_eq(drey_client_status_metadata(&st, "limitItems"), "2");
}

Test(limits, a_key_over_max_key_bytes_is_invalid) {
    Drey__Cache__V1__GetRequest req = DREY__CACHE__V1__GET_REQUEST__INIT;
    req.key = "123456789"; /* 9 > 8 */
    drey_client_status st;
    FAILS("Get", req, drey__cache__v1__get_response__descriptor, GRPC_STATUS_INVALID_ARGUMENT, &st);
    assert_violation(&st, "key", "INVALID_KEY");
    req.key = "12345678";
    OK("Get", req, drey__cache__v1__get_response__descriptor);
}

Test(limits, the_client_refuses_responses_over_its_receive_limit) {
    char v[60];
    memset(v, 'v', sizeof v - 1);
    v[sizeof v - 1] = '\0';
    set("k", v);
    drey_client *small = harness_client_with(&env.server, &(drey_client_options){.max_recv_message_bytes = 16});
    Drey__Cache__V1__GetRequest req = DREY__CACHE__V1__GET_REQUEST__INIT;
    req.key = "k";
    ProtobufCMessage *resp;
    drey_client_status st;
    grpc_status_code code = drey_client_unary(small, DREY_CLIENT_CACHE("Get"), &req.base,
                                              &drey__cache__v1__get_response__descriptor, 10000, &env.arena, &resp,
                                              &st);
    drey_client_close(small);
    cr_assert_eq(code, GRPC_STATUS_RESOURCE_EXHAUSTED, "%s: %s", drey_client_code_name(code), st.message);
    cr_assert_str_eq(get("k")->value->string_value, v, "the default limit takes it");
}

Test(errors, a_bad_scan_cursor_is_invalid_argument_with_the_field) {
    Drey__Cache__V1__ScanRequest req = DREY__CACHE__V1__SCAN_REQUEST__INIT;
    req.cursor = "not-a-cursor";
    drey_client_status st;
    FAILS("Scan", req, drey__cache__v1__scan_response__descriptor, GRPC_STATUS_INVALID_ARGUMENT, &st);
    cr_assert_str_eq(drey_client_status_reason(&st), "INVALID_CURSOR");
    cr_assert_not_null(st.bad_request);
    cr_assert_eq(st.bad_request->n_field_violations, 1);
    cr_assert_str_eq(st.bad_request->field_violations[0]->field, "cursor");
}
