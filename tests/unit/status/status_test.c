/*
 * Unit tests for src/status/status.c: the error catalogue, how a status
 * collects its error, metadata and violations, and its encoding as
 * google.rpc.Status (decoded back here with protobuf-c, as a client would).
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <stdio.h>
#include <string.h>

#include "drey/status.h"
#include "google/protobuf/any.pb-c.h"
#include "google/protobuf/duration.pb-c.h"
#include "google/rpc/error_details.pb-c.h"
#include "google/rpc/status.pb-c.h"

#define TYPE_PREFIX "type.googleapis.com/"

/* --- catalogue ------------------------------------------------------------ */

/* The catalogue lists every error but NONE, in enum order; reasons are
 * unique UPPER_SNAKE_CASE and messages fixed sentences. */
Test(status, catalogue_is_complete_and_well_formed) {
    size_t n;
    const drey_error_info *e = drey_error_catalogue(&n);
    cr_assert(eq(sz, n, (size_t)DREY_ERR_COUNT_ - 1));
    for (size_t i = 0; i < n; i++) {
        cr_assert(eq(int, e[i].error, (int)i + 1), "row %zu is out of order", i);
        cr_assert(ne(int, e[i].code, GRPC_STATUS_OK), "%s", e[i].reason);
        cr_assert(gt(sz, strlen(e[i].reason), 0));
        for (const char *p = e[i].reason; *p != '\0'; p++) {
            bool upper_snake = (*p >= 'A' && *p <= 'Z') || *p == '_';
            cr_assert(upper_snake, "reason %s", e[i].reason);
        }
        cr_assert(gt(sz, strlen(e[i].message), 10), "message of %s", e[i].reason);
        for (size_t j = 0; j < i; j++)
            cr_assert(ne(str, (char *)e[i].reason, (char *)e[j].reason));
        cr_assert(eq(ptr, (void *)drey_error_lookup(e[i].error), (void *)&e[i]));
    }
}

Test(status, lookup_gives_each_error_its_grpc_code) {
    static const struct {
        drey_error e;
        grpc_status_code code;
        const char *reason;
    } rows[] = {
        {DREY_ERR_MALFORMED_REQUEST, GRPC_STATUS_INVALID_ARGUMENT, "MALFORMED_REQUEST"},
        {DREY_ERR_INVALID_CACHE_NAME, GRPC_STATUS_INVALID_ARGUMENT, "INVALID_CACHE_NAME"},
        {DREY_ERR_INVALID_KEY, GRPC_STATUS_INVALID_ARGUMENT, "INVALID_KEY"},
        {DREY_ERR_INVALID_VALUE, GRPC_STATUS_INVALID_ARGUMENT, "INVALID_VALUE"},
        {DREY_ERR_PAYLOAD_TOO_LARGE, GRPC_STATUS_INVALID_ARGUMENT, "PAYLOAD_TOO_LARGE"},
        {DREY_ERR_BATCH_TOO_LARGE, GRPC_STATUS_INVALID_ARGUMENT, "BATCH_TOO_LARGE"},
        {DREY_ERR_DUPLICATE_KEY, GRPC_STATUS_INVALID_ARGUMENT, "DUPLICATE_KEY"},
        {DREY_ERR_INVALID_EXPIRATION, GRPC_STATUS_INVALID_ARGUMENT, "INVALID_EXPIRATION"},
        {DREY_ERR_INVALID_REQUEST_ID, GRPC_STATUS_INVALID_ARGUMENT, "INVALID_REQUEST_ID"},
        {DREY_ERR_VERSION_MISMATCH, GRPC_STATUS_FAILED_PRECONDITION, "VERSION_MISMATCH"},
        {DREY_ERR_NOT_AN_INTEGER, GRPC_STATUS_FAILED_PRECONDITION, "NOT_AN_INTEGER"},
        {DREY_ERR_INTEGER_OVERFLOW, GRPC_STATUS_OUT_OF_RANGE, "INTEGER_OVERFLOW"},
        {DREY_ERR_UNKNOWN_METHOD, GRPC_STATUS_UNIMPLEMENTED, "UNKNOWN_METHOD"},
        {DREY_ERR_UNKNOWN_SERVICE, GRPC_STATUS_NOT_FOUND, "UNKNOWN_SERVICE"},
        {DREY_ERR_DEADLINE_EXCEEDED, GRPC_STATUS_DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED"},
        {DREY_ERR_IDEMPOTENCY_KEY_REUSED, GRPC_STATUS_FAILED_PRECONDITION, "IDEMPOTENCY_KEY_REUSED"},
        {DREY_ERR_JOURNAL_WRITE_FAILED, GRPC_STATUS_UNAVAILABLE, "JOURNAL_WRITE_FAILED"},
        {DREY_ERR_RECOVERING, GRPC_STATUS_UNAVAILABLE, "RECOVERING"},
        {DREY_ERR_EPHEMERAL_NODE, GRPC_STATUS_FAILED_PRECONDITION, "EPHEMERAL_NODE"},
        {DREY_ERR_SNAPSHOT_FAILED, GRPC_STATUS_INTERNAL, "SNAPSHOT_FAILED"},
        {DREY_ERR_INTERNAL, GRPC_STATUS_INTERNAL, "INTERNAL"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        const drey_error_info *info = drey_error_lookup(rows[i].e);
        cr_assert(eq(int, info->error, rows[i].e));
        cr_assert(eq(int, info->code, rows[i].code), "%s", rows[i].reason);
        cr_assert(eq(str, (char *)info->reason, (char *)rows[i].reason));
    }
    const drey_error_info *none = drey_error_lookup(DREY_ERR_NONE);
    cr_assert(eq(int, none->code, GRPC_STATUS_OK));
    cr_assert(eq(str, (char *)none->reason, ""));
}

/* An unknown error number never reads outside the table: it is INTERNAL. */
Test(status, lookup_of_an_unknown_error_is_internal) {
    cr_assert(eq(int, drey_error_lookup(DREY_ERR_COUNT_)->error, DREY_ERR_INTERNAL));
    cr_assert(eq(int, drey_error_lookup((drey_error)1000)->error, DREY_ERR_INTERNAL));
    cr_assert(eq(int, drey_error_lookup((drey_error)-1)->error, DREY_ERR_INTERNAL));
}

/* Persisted outcomes name their error by reason: every reason finds its
 * row, and nothing else finds any (not a prefix, not the empty reason). */
Test(status, from_reason_finds_every_row_and_nothing_else) {
    size_t n;
    const drey_error_info *e = drey_error_catalogue(&n);
    for (size_t i = 0; i < n; i++) {
        drey_error got = DREY_ERR_NONE;
        cr_assert(drey_error_from_reason(e[i].reason, strlen(e[i].reason), &got), "%s", e[i].reason);
        cr_assert(eq(int, got, e[i].error), "%s", e[i].reason);
    }
    drey_error got = DREY_ERR_NONE;
    cr_assert(not(drey_error_from_reason("", 0, &got)));
    cr_assert(not(drey_error_from_reason("VERSION_MISMATC", 15, &got)));
    cr_assert(not(drey_error_from_reason("VERSION_MISMATCHX", 17, &got)));
    cr_assert(not(drey_error_from_reason("version_mismatch", 16, &got)));
    cr_assert(drey_error_from_reason("VERSION_MISMATCH trailing", 16, &got), "a length-bounded reason");
    cr_assert(eq(int, got, DREY_ERR_VERSION_MISMATCH));
}

Test(status, code_names) {
    static const char *const names[] = {
        "OK",        "CANCELLED",         "UNKNOWN",           "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
        "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
        "OUT_OF_RANGE", "UNIMPLEMENTED",   "INTERNAL",          "UNAVAILABLE",      "DATA_LOSS",         "UNAUTHENTICATED",
    };
    for (int c = 0; c <= 16; c++)
        cr_assert(eq(str, (char *)drey_status_code_name((grpc_status_code)c), (char *)names[c]));
    cr_assert(eq(int, GRPC_STATUS_UNAUTHENTICATED, 16));
    cr_assert(eq(str, (char *)drey_status_code_name((grpc_status_code)17), "UNKNOWN"));
    cr_assert(eq(str, (char *)drey_status_code_name((grpc_status_code)-1), "UNKNOWN"));
}

/* --- building a status ---------------------------------------------------- */

Test(status, init_is_ok) {
    drey_status st;
    memset(&st, 0x5a, sizeof st);
    drey_status_init(&st);
    cr_assert(drey_status_ok(&st));
    cr_assert(eq(int, drey_status_code(&st), GRPC_STATUS_OK));
    cr_assert(eq(str, (char *)drey_status_message(&st), ""));
    cr_assert(eq(sz, st.n_metadata, 0));
    cr_assert(eq(sz, st.n_violations, 0));
    cr_assert(eq(sz, st.n_violations_total, 0));
    cr_assert(eq(str, st.quota_subject, ""));
    cr_assert(lt(i64, st.retry_delay_ms, 0));
}

/* The first failure explains the call: later ones do not replace it. */
Test(status, first_error_wins) {
    drey_status st;
    drey_status_init(&st);
    drey_status_set(&st, DREY_ERR_INVALID_KEY);
    drey_status_set(&st, DREY_ERR_INTERNAL);
    drey_status_add_violation(&st, DREY_ERR_INVALID_VALUE, "value");
    cr_assert(eq(int, st.error, DREY_ERR_INVALID_KEY));
    cr_assert(eq(int, drey_status_code(&st), GRPC_STATUS_INVALID_ARGUMENT));
    cr_assert(eq(str, (char *)drey_status_message(&st), (char *)drey_error_lookup(DREY_ERR_INVALID_KEY)->message));
    cr_assert(eq(int, st.violations[0].error, DREY_ERR_INVALID_VALUE), "the violation keeps its own error");
}

Test(status, first_violation_sets_the_error) {
    drey_status st;
    drey_status_init(&st);
    drey_status_add_violation(&st, DREY_ERR_DUPLICATE_KEY, "entries[%d].key", 2);
    drey_status_add_violation(&st, DREY_ERR_INVALID_KEY, "entries[%d].key", 3);
    cr_assert(eq(int, st.error, DREY_ERR_DUPLICATE_KEY));
    cr_assert(eq(sz, st.n_violations, 2));
    cr_assert(eq(str, st.violations[0].field, "entries[2].key"));
    cr_assert(eq(str, st.violations[1].field, "entries[3].key"));
    cr_assert(eq(int, st.violations[1].error, DREY_ERR_INVALID_KEY));
}

Test(status, an_explicit_message_replaces_the_catalogue_one) {
    drey_status st;
    drey_status_init(&st);
    drey_status_set(&st, DREY_ERR_INTERNAL);
    st.message = "journal write failed";
    cr_assert(eq(str, (char *)drey_status_message(&st), "journal write failed"));
}

/* Violations and metadata live in fixed arrays: extra ones are counted (for
 * violations) and dropped, long text is cut, nothing overflows. */
Test(status, violations_are_bounded) {
    drey_status st;
    drey_status_init(&st);
    for (int i = 0; i < DREY_STATUS_MAX_VIOLATIONS + 5; i++)
        drey_status_add_violation(&st, DREY_ERR_INVALID_KEY, "keys[%d]", i);
    cr_assert(eq(sz, st.n_violations, DREY_STATUS_MAX_VIOLATIONS));
    cr_assert(eq(sz, st.n_violations_total, DREY_STATUS_MAX_VIOLATIONS + 5));
    char want[32];
    snprintf(want, sizeof want, "keys[%d]", DREY_STATUS_MAX_VIOLATIONS - 1);
    cr_assert(eq(str, st.violations[DREY_STATUS_MAX_VIOLATIONS - 1].field, want), "the first ones are kept");
}

Test(status, long_field_paths_and_metadata_values_are_cut) {
    drey_status st;
    drey_status_init(&st);
    char longpath[300];
    memset(longpath, 'p', sizeof longpath - 1);
    longpath[sizeof longpath - 1] = '\0';
    drey_status_add_violation(&st, DREY_ERR_INVALID_KEY, "%s", longpath);
    cr_assert(eq(sz, strlen(st.violations[0].field), sizeof st.violations[0].field - 1));
    drey_status_add_metadata(&st, "limitBytes", "%s", longpath);
    cr_assert(eq(sz, strlen(st.metadata[0].value), sizeof st.metadata[0].value - 1));
}

Test(status, metadata_is_bounded) {
    drey_status st;
    drey_status_init(&st);
    for (int i = 0; i < DREY_STATUS_MAX_METADATA + 3; i++)
        drey_status_add_metadata(&st, "k", "%d", i);
    cr_assert(eq(sz, st.n_metadata, DREY_STATUS_MAX_METADATA));
    cr_assert(eq(str, st.metadata[DREY_STATUS_MAX_METADATA - 1].value, "7"));
}

/* --- encoding ------------------------------------------------------------- */

typedef struct decoded {
    Google__Rpc__Status *status;
    Google__Rpc__ErrorInfo *error_info;
    Google__Rpc__BadRequest *bad_request;
    Google__Rpc__QuotaFailure *quota_failure;
    Google__Rpc__RetryInfo *retry_info;
    size_t n_unknown;
} decoded;

/* Encodes st and decodes the result the way a client library would. */
static void encode_decode(const drey_status *st, decoded *d) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    uint8_t *bytes;
    size_t len;
    drey_status_encode(st, &a, &bytes, &len);
    memset(d, 0, sizeof *d);
    d->status = google__rpc__status__unpack(NULL, len, bytes);
    drey_arena_destroy(&a);
    cr_assert_not_null(d->status, "not a google.rpc.Status");
    for (size_t i = 0; i < d->status->n_details; i++) {
        const Google__Protobuf__Any *any = d->status->details[i];
        cr_assert_not_null(any->type_url);
        cr_assert(eq(int, strncmp(any->type_url, TYPE_PREFIX, strlen(TYPE_PREFIX)), 0), "%s", any->type_url);
        const char *type = any->type_url + strlen(TYPE_PREFIX);
        size_t n = any->value.len;
        const uint8_t *v = any->value.data;
        if (strcmp(type, "google.rpc.ErrorInfo") == 0) {
            cr_assert_null(d->error_info, "two ErrorInfo");
            cr_assert(eq(sz, i, 0), "ErrorInfo comes first");
            d->error_info = google__rpc__error_info__unpack(NULL, n, v);
            cr_assert_not_null(d->error_info);
        } else if (strcmp(type, "google.rpc.BadRequest") == 0) {
            cr_assert_null(d->bad_request, "two BadRequest");
            d->bad_request = google__rpc__bad_request__unpack(NULL, n, v);
            cr_assert_not_null(d->bad_request);
        } else if (strcmp(type, "google.rpc.QuotaFailure") == 0) {
            cr_assert_null(d->quota_failure, "two QuotaFailure");
            d->quota_failure = google__rpc__quota_failure__unpack(NULL, n, v);
            cr_assert_not_null(d->quota_failure);
        } else if (strcmp(type, "google.rpc.RetryInfo") == 0) {
            cr_assert_null(d->retry_info, "two RetryInfo");
            d->retry_info = google__rpc__retry_info__unpack(NULL, n, v);
            cr_assert_not_null(d->retry_info);
        } else {
            d->n_unknown++;
        }
    }
}

static void decoded_free(decoded *d) {
    if (d->error_info != NULL)
        google__rpc__error_info__free_unpacked(d->error_info, NULL);
    if (d->bad_request != NULL)
        google__rpc__bad_request__free_unpacked(d->bad_request, NULL);
    if (d->quota_failure != NULL)
        google__rpc__quota_failure__free_unpacked(d->quota_failure, NULL);
    if (d->retry_info != NULL)
        google__rpc__retry_info__free_unpacked(d->retry_info, NULL);
    google__rpc__status__free_unpacked(d->status, NULL);
}

/* A plain error: code, catalogue message, and an ErrorInfo alone. */
Test(status, encode_plain_error) {
    drey_status st;
    drey_status_init(&st);
    drey_status_set(&st, DREY_ERR_VERSION_MISMATCH);
    decoded d;
    encode_decode(&st, &d);
    cr_assert(eq(i32, d.status->code, GRPC_STATUS_FAILED_PRECONDITION));
    cr_assert(eq(str, d.status->message, (char *)drey_error_lookup(DREY_ERR_VERSION_MISMATCH)->message));
    cr_assert(eq(sz, d.status->n_details, 1));
    cr_assert_not_null(d.error_info);
    cr_assert(eq(str, d.error_info->reason, "VERSION_MISMATCH"));
    cr_assert(eq(str, d.error_info->domain, "drey.dev"));
    cr_assert(eq(sz, d.error_info->n_metadata, 0));
    cr_assert_null(d.bad_request, "no BadRequest without violations");
    cr_assert_null(d.quota_failure, "no QuotaFailure without a subject");
    cr_assert_null(d.retry_info, "no RetryInfo without a delay");
    decoded_free(&d);
}

Test(status, encode_error_info_metadata_in_order) {
    drey_status st;
    drey_status_init(&st);
    drey_status_set(&st, DREY_ERR_PAYLOAD_TOO_LARGE);
    drey_status_add_metadata(&st, "limitBytes", "%d", 4194304);
    drey_status_add_metadata(&st, "actualBytes", "%s", "5000000");
    decoded d;
    encode_decode(&st, &d);
    cr_assert(eq(str, d.error_info->reason, "PAYLOAD_TOO_LARGE"));
    cr_assert(eq(sz, d.error_info->n_metadata, 2));
    cr_assert(eq(str, d.error_info->metadata[0]->key, "limitBytes"));
    cr_assert(eq(str, d.error_info->metadata[0]->value, "4194304"));
    cr_assert(eq(str, d.error_info->metadata[1]->key, "actualBytes"));
    cr_assert(eq(str, d.error_info->metadata[1]->value, "5000000"));
    decoded_free(&d);
}

/* Each violation carries its field path, its own reason and the catalogue
 * description of that reason. */
Test(status, encode_bad_request_violations) {
    drey_status st;
    drey_status_init(&st);
    drey_status_add_violation(&st, DREY_ERR_INVALID_KEY, "entries[%d].key", 0);
    drey_status_add_violation(&st, DREY_ERR_DUPLICATE_KEY, "entries[%d].key", 2);
    drey_status_add_violation(&st, DREY_ERR_INVALID_EXPIRATION, "entries[1].ttl");
    decoded d;
    encode_decode(&st, &d);
    cr_assert(eq(i32, d.status->code, GRPC_STATUS_INVALID_ARGUMENT));
    cr_assert(eq(str, d.error_info->reason, "INVALID_KEY"));
    cr_assert_not_null(d.bad_request);
    cr_assert(eq(sz, d.bad_request->n_field_violations, 3));
    static const struct {
        const char *field;
        drey_error e;
    } want[] = {
        {"entries[0].key", DREY_ERR_INVALID_KEY},
        {"entries[2].key", DREY_ERR_DUPLICATE_KEY},
        {"entries[1].ttl", DREY_ERR_INVALID_EXPIRATION},
    };
    for (size_t i = 0; i < 3; i++) {
        const Google__Rpc__BadRequest__FieldViolation *v = d.bad_request->field_violations[i];
        cr_assert(eq(str, v->field, (char *)want[i].field));
        cr_assert(eq(str, v->reason, (char *)drey_error_lookup(want[i].e)->reason));
        cr_assert(eq(str, v->description, (char *)drey_error_lookup(want[i].e)->message));
    }
    cr_assert_null(d.quota_failure);
    cr_assert_null(d.retry_info);
    decoded_free(&d);
}

/* More violations than fit: the encoding holds the first
 * DREY_STATUS_MAX_VIOLATIONS and stays valid. */
Test(status, encode_violation_overflow_is_bounded) {
    drey_status st;
    drey_status_init(&st);
    for (int i = 0; i < 1000; i++)
        drey_status_add_violation(&st, DREY_ERR_INVALID_KEY, "keys[%d]", i);
    decoded d;
    encode_decode(&st, &d);
    cr_assert_not_null(d.bad_request);
    cr_assert(eq(sz, d.bad_request->n_field_violations, DREY_STATUS_MAX_VIOLATIONS));
    cr_assert(eq(str, d.bad_request->field_violations[0]->field, "keys[0]"));
    decoded_free(&d);
}

Test(status, encode_quota_failure_and_retry_info_when_set) {
    drey_status st;
    drey_status_init(&st);
    drey_status_set(&st, DREY_ERR_RECOVERING);
    snprintf(st.quota_subject, sizeof st.quota_subject, "client:%s", "10.0.0.7");
    st.quota_description = "too many calls";
    st.retry_delay_ms = 1500;
    decoded d;
    encode_decode(&st, &d);
    cr_assert(eq(i32, d.status->code, GRPC_STATUS_UNAVAILABLE));
    cr_assert(eq(sz, d.status->n_details, 3));
    cr_assert(eq(sz, d.n_unknown, 0));
    cr_assert_null(d.bad_request);
    cr_assert_not_null(d.quota_failure);
    cr_assert(eq(sz, d.quota_failure->n_violations, 1));
    cr_assert(eq(str, d.quota_failure->violations[0]->subject, "client:10.0.0.7"));
    cr_assert(eq(str, d.quota_failure->violations[0]->description, "too many calls"));
    cr_assert_not_null(d.retry_info);
    cr_assert_not_null(d.retry_info->retry_delay);
    cr_assert(eq(i64, d.retry_info->retry_delay->seconds, 1));
    cr_assert(eq(i32, d.retry_info->retry_delay->nanos, 500000000));
    decoded_free(&d);
}

/* Without its own description, a quota violation uses the error's message;
 * a zero delay is still a RetryInfo ("retry now"). */
Test(status, encode_quota_defaults_and_zero_delay) {
    drey_status st;
    drey_status_init(&st);
    drey_status_set(&st, DREY_ERR_RECOVERING);
    strcpy(st.quota_subject, "node");
    st.retry_delay_ms = 0;
    decoded d;
    encode_decode(&st, &d);
    cr_assert_not_null(d.quota_failure);
    cr_assert(eq(str, d.quota_failure->violations[0]->description,
                 (char *)drey_error_lookup(DREY_ERR_RECOVERING)->message));
    cr_assert_not_null(d.retry_info);
    cr_assert_not_null(d.retry_info->retry_delay);
    cr_assert(eq(i64, d.retry_info->retry_delay->seconds, 0));
    cr_assert(eq(i32, d.retry_info->retry_delay->nanos, 0));
    decoded_free(&d);

    drey_status_init(&st);
    drey_status_set(&st, DREY_ERR_RECOVERING);
    st.retry_delay_ms = 999;
    encode_decode(&st, &d);
    cr_assert_null(d.quota_failure);
    cr_assert(eq(i64, d.retry_info->retry_delay->seconds, 0));
    cr_assert(eq(i32, d.retry_info->retry_delay->nanos, 999000000));
    decoded_free(&d);
}

Test(status, encode_explicit_message) {
    drey_status st;
    drey_status_init(&st);
    drey_status_set(&st, DREY_ERR_INTERNAL);
    st.message = "journal write failed";
    decoded d;
    encode_decode(&st, &d);
    cr_assert(eq(i32, d.status->code, GRPC_STATUS_INTERNAL));
    cr_assert(eq(str, d.status->message, "journal write failed"));
    cr_assert(eq(str, d.error_info->reason, "INTERNAL"));
    decoded_free(&d);
}

/* Every catalogue row encodes to its own code and reason. */
Test(status, encode_every_catalogue_row) {
    size_t n;
    const drey_error_info *e = drey_error_catalogue(&n);
    for (size_t i = 0; i < n; i++) {
        drey_status st;
        drey_status_init(&st);
        drey_status_set(&st, e[i].error);
        decoded d;
        encode_decode(&st, &d);
        cr_assert(eq(i32, d.status->code, (int32_t)e[i].code));
        cr_assert(eq(str, d.status->message, (char *)e[i].message));
        cr_assert(eq(str, d.error_info->reason, (char *)e[i].reason));
        cr_assert(eq(str, d.error_info->domain, DREY_ERROR_DOMAIN));
        decoded_free(&d);
    }
}

/* --- reading another node's answer ------------------------------------------ */

static int64_t delay_of_encoded(const drey_status *st) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    uint8_t *bytes;
    size_t len;
    drey_status_encode(st, &a, &bytes, &len);
    int64_t ms = drey_status_retry_delay_ms(bytes, len);
    drey_arena_destroy(&a);
    return ms;
}

/* The delay comes back as it was encoded, among the other details; a
 * status without RetryInfo has none. */
Test(status, retry_delay_of_encoded_statuses) {
    drey_status st;
    drey_status_init(&st);
    drey_status_set(&st, DREY_ERR_NODE_RATE_LIMIT);
    strcpy(st.quota_subject, "node:n1");
    drey_status_add_metadata(&st, "limitRequestsPerSecond", "%d", 1);
    st.retry_delay_ms = 1500;
    cr_assert(eq(i64, delay_of_encoded(&st), 1500));
    st.retry_delay_ms = 0;
    cr_assert(eq(i64, delay_of_encoded(&st), 0));
    st.retry_delay_ms = -1;
    cr_assert(eq(i64, delay_of_encoded(&st), -1));
    drey_status_init(&st);
    drey_status_add_violation(&st, DREY_ERR_INVALID_KEY, "key");
    cr_assert(eq(i64, delay_of_encoded(&st), -1));
}

/* A google.rpc.Status made elsewhere: any type URL host, a delay with
 * sub-millisecond nanos rounded up, a RetryInfo without a delay skipped;
 * bytes that are not a Status give none. */
Test(status, retry_delay_of_foreign_statuses) {
    Google__Protobuf__Duration d = GOOGLE__PROTOBUF__DURATION__INIT;
    d.seconds = 2;
    d.nanos = 1;
    Google__Rpc__RetryInfo ri = GOOGLE__RPC__RETRY_INFO__INIT;
    ri.retry_delay = &d;
    uint8_t ri_bytes[64];
    size_t ri_len = google__rpc__retry_info__pack(&ri, ri_bytes);
    Google__Rpc__RetryInfo empty = GOOGLE__RPC__RETRY_INFO__INIT;
    uint8_t empty_bytes[8];
    size_t empty_len = google__rpc__retry_info__pack(&empty, empty_bytes);

    Google__Protobuf__Any any[2] = {GOOGLE__PROTOBUF__ANY__INIT, GOOGLE__PROTOBUF__ANY__INIT};
    any[0].type_url = "example.com/google.rpc.RetryInfo";
    any[0].value = (ProtobufCBinaryData){empty_len, empty_bytes};
    any[1].type_url = "example.com/google.rpc.RetryInfo";
    any[1].value = (ProtobufCBinaryData){ri_len, ri_bytes};
    Google__Protobuf__Any *anys[2] = {&any[0], &any[1]};
    Google__Rpc__Status s = GOOGLE__RPC__STATUS__INIT;
    s.code = GRPC_STATUS_UNAVAILABLE;
    s.n_details = 2;
    s.details = anys;
    uint8_t bytes[256];
    size_t len = google__rpc__status__pack(&s, bytes);
    cr_assert(eq(i64, drey_status_retry_delay_ms(bytes, len), 2001));

    any[1].type_url = "example.com/google.rpc.RetryInfoX";
    len = google__rpc__status__pack(&s, bytes);
    cr_assert(eq(i64, drey_status_retry_delay_ms(bytes, len), -1));

    static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff};
    cr_assert(eq(i64, drey_status_retry_delay_ms(junk, sizeof junk), -1));
    cr_assert(eq(i64, drey_status_retry_delay_ms(NULL, 0), -1));
}
