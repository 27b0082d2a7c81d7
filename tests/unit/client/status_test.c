/* Unit tests for src/client/status.c: decoding google.rpc.Status details. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "drey/client.h"
#include "drey/status.h"
#include "google/protobuf/any.pb-c.h"

/* Encodes st with the server's encoder and decodes it with the client's. */
static void round_trip(const drey_status *st, drey_arena *a, drey_client_status *out) {
    uint8_t *bytes;
    size_t len;
    drey_status_encode(st, a, &bytes, &len);
    drey_client_status_set(out, drey_status_code(st), drey_status_message(st));
    cr_assert(drey_client_status_decode_details(out, bytes, len, a));
}

static Google__Protobuf__Any *pack(drey_arena *a, const char *url, const ProtobufCMessage *m) {
    Google__Protobuf__Any *any = drey_arena_alloc(a, sizeof *any);
    google__protobuf__any__init(any);
    any->type_url = (char *)url;
    any->value.len = protobuf_c_message_get_packed_size(m);
    any->value.data = drey_arena_alloc(a, any->value.len + 1);
    protobuf_c_message_pack(m, any->value.data);
    return any;
}

static void encode(drey_arena *a, Google__Protobuf__Any **details, size_t n, uint8_t **out, size_t *len) {
    Google__Rpc__Status s = GOOGLE__RPC__STATUS__INIT;
    s.code = 3;
    s.message = "bad";
    s.details = details;
    s.n_details = n;
    *len = protobuf_c_message_get_packed_size(&s.base);
    *out = drey_arena_alloc(a, *len + 1);
    protobuf_c_message_pack(&s.base, *out);
}

Test(client_status, error_info_reason_domain_and_metadata) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    drey_status st;
    drey_status_init(&st);
    drey_status_set(&st, DREY_ERR_VERSION_MISMATCH);
    drey_status_add_metadata(&st, "currentVersion", "%d", 7);
    drey_status_add_metadata(&st, "entryIndex", "%d", 2);
    drey_client_status cs;
    round_trip(&st, &a, &cs);
    cr_assert_eq(cs.code, GRPC_STATUS_FAILED_PRECONDITION);
    cr_assert_not_null(cs.details);
    cr_assert_eq(cs.details->code, GRPC_STATUS_FAILED_PRECONDITION);
    cr_assert_str_eq(drey_client_status_reason(&cs), "VERSION_MISMATCH");
    cr_assert_str_eq(drey_client_status_domain(&cs), "drey.dev");
    cr_assert_str_eq(drey_client_status_metadata(&cs, "currentVersion"), "7");
    cr_assert_str_eq(drey_client_status_metadata(&cs, "entryIndex"), "2");
    cr_assert_null(drey_client_status_metadata(&cs, "missing"));
    cr_assert_null(cs.bad_request);
    cr_assert_null(cs.quota_failure);
    cr_assert_null(cs.retry_info);
    cr_assert_eq(drey_client_status_retry_delay_ms(&cs), -1);
    drey_arena_destroy(&a);
}

Test(client_status, bad_request_field_violations) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    drey_status st;
    drey_status_init(&st);
    drey_status_add_violation(&st, DREY_ERR_INVALID_KEY, "entries[%d].key", 3);
    drey_status_add_violation(&st, DREY_ERR_INVALID_EXPIRATION, "entries[%d].ttl", 5);
    drey_client_status cs;
    round_trip(&st, &a, &cs);
    cr_assert_eq(cs.code, GRPC_STATUS_INVALID_ARGUMENT);
    cr_assert_str_eq(drey_client_status_reason(&cs), "INVALID_KEY");
    cr_assert_not_null(cs.bad_request);
    cr_assert_eq(cs.bad_request->n_field_violations, 2);
    const Google__Rpc__BadRequest__FieldViolation *v = drey_client_status_violation(&cs, "entries[3].key");
    cr_assert_not_null(v);
    cr_assert_str_eq(v->reason, "INVALID_KEY");
    cr_assert_str_eq(v->description, drey_error_lookup(DREY_ERR_INVALID_KEY)->message);
    v = drey_client_status_violation(&cs, "entries[5].ttl");
    cr_assert_not_null(v);
    cr_assert_str_eq(v->reason, "INVALID_EXPIRATION");
    cr_assert_null(drey_client_status_violation(&cs, "entries[3]"), "field paths match exactly");
    drey_arena_destroy(&a);
}

Test(client_status, quota_failure_and_retry_info) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    drey_status st;
    drey_status_init(&st);
    drey_status_set(&st, DREY_ERR_INTERNAL);
    snprintf(st.quota_subject, sizeof st.quota_subject, "client:alice");
    st.quota_description = "too many calls";
    st.retry_delay_ms = 1500;
    drey_client_status cs;
    round_trip(&st, &a, &cs);
    cr_assert_not_null(cs.quota_failure);
    cr_assert_eq(cs.quota_failure->n_violations, 1);
    cr_assert_str_eq(cs.quota_failure->violations[0]->subject, "client:alice");
    cr_assert_str_eq(cs.quota_failure->violations[0]->description, "too many calls");
    cr_assert_eq(drey_client_status_retry_delay_ms(&cs), 1500);
    drey_arena_destroy(&a);
}

Test(client_status, unknown_and_undecodable_details_are_skipped) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    Google__Rpc__DebugInfo dbg = GOOGLE__RPC__DEBUG_INFO__INIT;
    dbg.detail = "stack";
    Google__Rpc__ErrorInfo good = GOOGLE__RPC__ERROR_INFO__INIT;
    good.reason = "SECOND";
    good.domain = "example.com";
    Google__Protobuf__Any *details[3];
    details[0] = pack(&a, "type.googleapis.com/google.rpc.DebugInfo", &dbg.base);
    /* Claims to be an ErrorInfo but is not a valid message. */
    Google__Protobuf__Any bogus = GOOGLE__PROTOBUF__ANY__INIT;
    bogus.type_url = "type.googleapis.com/google.rpc.ErrorInfo";
    static uint8_t junk[] = {0x0a, 0x7f, 'x'}; /* field 1, length 127, 1 byte */
    bogus.value.data = junk;
    bogus.value.len = sizeof junk;
    details[1] = &bogus;
    /* Any host in the type URL names the same type. */
    details[2] = pack(&a, "example.com/types/google.rpc.ErrorInfo", &good.base);
    uint8_t *bytes;
    size_t len;
    encode(&a, details, 3, &bytes, &len);

    drey_client_status cs;
    drey_client_status_set(&cs, GRPC_STATUS_INVALID_ARGUMENT, "bad");
    cr_assert(drey_client_status_decode_details(&cs, bytes, len, &a));
    cr_assert_eq(cs.details->n_details, 3, "every detail stays in details");
    cr_assert_str_eq(drey_client_status_reason(&cs), "SECOND");
    cr_assert_str_eq(drey_client_status_domain(&cs), "example.com");
    cr_assert_null(cs.bad_request);
    drey_arena_destroy(&a);
}

Test(client_status, bytes_that_are_not_a_status_leave_no_details) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    static const uint8_t junk[] = {0xff, 0xff, 0xff};
    drey_client_status cs;
    drey_client_status_set(&cs, GRPC_STATUS_INTERNAL, "boom");
    cr_assert_not(drey_client_status_decode_details(&cs, junk, sizeof junk, &a));
    cr_assert_eq(cs.code, GRPC_STATUS_INTERNAL, "the code is kept");
    cr_assert_str_eq(cs.message, "boom");
    cr_assert_null(cs.details);
    cr_assert_null(cs.error_info);
    cr_assert_str_eq(drey_client_status_reason(&cs), "");
    cr_assert_str_eq(drey_client_status_domain(&cs), "");
    cr_assert_null(drey_client_status_violation(&cs, "key"));
    drey_arena_destroy(&a);
}

Test(client_status, an_empty_status_decodes_without_details) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    drey_client_status cs;
    drey_client_status_set(&cs, GRPC_STATUS_UNKNOWN, NULL);
    cr_assert_str_eq(cs.message, "");
    cr_assert(drey_client_status_decode_details(&cs, (const uint8_t *)"", 0, &a));
    cr_assert_not_null(cs.details);
    cr_assert_null(cs.error_info);
    drey_arena_destroy(&a);
}

Test(client_status, set_clears_earlier_details) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    drey_status st;
    drey_status_init(&st);
    drey_status_add_violation(&st, DREY_ERR_INVALID_KEY, "key");
    st.retry_delay_ms = 10;
    drey_client_status cs;
    round_trip(&st, &a, &cs);
    cr_assert_not_null(cs.bad_request);
    drey_client_status_set(&cs, GRPC_STATUS_OK, "");
    cr_assert_null(cs.details);
    cr_assert_null(cs.error_info);
    cr_assert_null(cs.bad_request);
    cr_assert_null(cs.retry_info);
    drey_arena_destroy(&a);
}

Test(client_status, code_names) {
    cr_assert_str_eq(drey_client_code_name(GRPC_STATUS_OK), "OK");
    cr_assert_str_eq(drey_client_code_name(GRPC_STATUS_FAILED_PRECONDITION), "FAILED_PRECONDITION");
    cr_assert_str_eq(drey_client_code_name(GRPC_STATUS_UNAUTHENTICATED), "UNAUTHENTICATED");
    cr_assert_str_eq(drey_client_code_name((grpc_status_code)99), "UNKNOWN_CODE");
    cr_assert_str_eq(drey_client_code_name((grpc_status_code)-1), "UNKNOWN_CODE");
}

/* Found while writing the tests/fuzz status target (the fuzzer had not yet
 * reached it in 20 s), pinned by
 * regressions/status/retry-delay-*: a server's RetryInfo may hold any
 * Duration; seconds * 1000 overflowed for huge ones, and negative ones came
 * out as negative delays other than -1. */
Test(client_status, a_retry_delay_out_of_range_is_none) {
    static const struct {
        int64_t seconds;
        int32_t nanos;
        int64_t want;
    } cases[] = {
        {INT64_MAX, 0, -1},         {315576000001LL, 0, -1}, {-5, -1, -1}, {0, -1, -1}, {1, 1000000000, -1},
        {315576000000LL, 999999999, 315576000000999LL},      {0, 0, 0},    {2, 5000000, 2005},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        drey_arena a;
        drey_arena_init(&a, NULL, 0);
        Google__Protobuf__Duration d = GOOGLE__PROTOBUF__DURATION__INIT;
        d.seconds = cases[i].seconds;
        d.nanos = cases[i].nanos;
        Google__Rpc__RetryInfo ri = GOOGLE__RPC__RETRY_INFO__INIT;
        ri.retry_delay = &d;
        Google__Protobuf__Any *any = pack(&a, "type.googleapis.com/google.rpc.RetryInfo", &ri.base);
        uint8_t *bytes;
        size_t len;
        encode(&a, &any, 1, &bytes, &len);
        drey_client_status cs;
        drey_client_status_set(&cs, GRPC_STATUS_RESOURCE_EXHAUSTED, "x");
        cr_assert(drey_client_status_decode_details(&cs, bytes, len, &a));
        cr_assert_not_null(cs.retry_info);
        cr_assert_eq(drey_client_status_retry_delay_ms(&cs), cases[i].want, "case %zu: %lld", i,
                     (long long)drey_client_status_retry_delay_ms(&cs));
        drey_arena_destroy(&a);
    }
}
