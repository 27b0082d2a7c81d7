/*
 * Unit tests for src/commit/outcome.c: how a failed outcome is persisted.
 *
 * Outcomes go into snapshots, so what a retry is told after a restart must
 * not depend on the drey_error enum's numbering. These tests pin that the
 * persisted bytes name the reason, that the older form (the enum's ordinal,
 * written by binaries up to commit 5497eff) still answers with the error it
 * meant, through the frozen table below, and that anything undecodable
 * answers INTERNAL, never another error.
 */
#include <inttypes.h>

#include "src/commit/outcome.h"
#include "tests/unit/write_stack.h"

#define RETENTION 60000
#define T0 1700000000000LL

static write_stack s;
static drey_arena arena;

static void setup(void) {
    stack_create(&s, RETENTION);
    drey_arena_init(&arena, NULL, 0);
}

static void teardown(void) {
    drey_arena_destroy(&arena);
    stack_destroy(&s);
}

TestSuite(outcome, .init = setup, .fini = teardown, .timeout = 60);

/* What drey_error ordinals meant when FAILED_V0 outcomes were written: a
 * copy of the enum of commit 5497eff, independent of outcome.c's table. */
static const char *const v0[] = {
    [1] = "MALFORMED_REQUEST",     [2] = "INVALID_CACHE_NAME",     [3] = "INVALID_KEY",
    [4] = "INVALID_VALUE",         [5] = "PAYLOAD_TOO_LARGE",      [6] = "BATCH_TOO_LARGE",
    [7] = "DUPLICATE_KEY",         [8] = "INVALID_EXPIRATION",     [9] = "INVALID_REQUEST_ID",
    [10] = "VERSION_MISMATCH",     [11] = "NOT_AN_INTEGER",        [12] = "INTEGER_OVERFLOW",
    [13] = "UNKNOWN_METHOD",       [14] = "UNKNOWN_SERVICE",       [15] = "DEADLINE_EXCEEDED",
    [16] = "CANCELLED",            [17] = "IDEMPOTENCY_KEY_REUSED", [18] = "JOURNAL_WRITE_FAILED",
    [19] = "RECOVERING",           [20] = "EPHEMERAL_NODE",        [21] = "SNAPSHOT_FAILED",
    [22] = "TOKEN_MISSING",        [23] = "TOKEN_MALFORMED",       [24] = "TOKEN_TOO_LARGE",
    [25] = "TOKEN_ALGORITHM",      [26] = "TOKEN_UNKNOWN_KEY",     [27] = "TOKEN_BAD_SIGNATURE",
    [28] = "TOKEN_EXPIRED",        [29] = "TOKEN_NOT_YET_VALID",   [30] = "TOKEN_WRONG_ISSUER",
    [31] = "TOKEN_WRONG_AUDIENCE", [32] = "TOKEN_INVALID",         [33] = "NODE_RATE_LIMIT",
    [34] = "PRINCIPAL_RATE_LIMIT", [35] = "PRINCIPAL_CONCURRENCY_LIMIT", [36] = "QUEUE_FULL",
    [37] = "QUEUE_TIMEOUT",        [38] = "MEMORY_PRESSURE",       [39] = "JOURNAL_DISK_QUOTA",
    [40] = "INTERNAL",
};
#define V0_ROWS (sizeof v0 / sizeof v0[0])

static const char *metadata(const drey_status *st, const char *key) {
    for (size_t i = 0; i < st->n_metadata; i++)
        if (strcmp(st->metadata[i].key, key) == 0)
            return st->metadata[i].value;
    return NULL;
}

static void decode(const uint8_t *p, size_t len, drey_status *st) {
    drey_status_init(st);
    drey_commit__failure_get(p, len, &arena, st);
}

/* An old-format failure: marker 0, u16 ordinal, one metadata pair. */
static size_t v0_bytes(uint8_t *out, unsigned ordinal, const char *key, const char *value) {
    size_t kl = strlen(key), vl = strlen(value), n = 0;
    out[n++] = DREY_COMMIT__FAILED_V0;
    out[n++] = (uint8_t)ordinal;
    out[n++] = (uint8_t)(ordinal >> 8);
    out[n++] = 1;
    out[n++] = (uint8_t)kl;
    memcpy(out + n, key, kl);
    n += kl;
    out[n++] = (uint8_t)vl;
    memcpy(out + n, value, vl);
    return n + vl;
}

/* The outcome entry of (principal "", request_id rid), copied. */
static bool read_outcome(const char *rid, entry_copy *e) {
    char key[64];
    size_t n = (size_t)snprintf(key, sizeof key, "%c%s", '\0', rid);
    drey_key k;
    drey_store_key(s.store, &k, DREY_COMMIT_OUTCOME_CACHE, strlen(DREY_COMMIT_OUTCOME_CACHE), key, n);
    memset(e, 0, sizeof *e);
    return drey_store_read(s.store, &k, T0, copy_entry, e);
}

static void write_outcome(const char *rid, const uint8_t *bytes, size_t len) {
    char key[64];
    size_t n = (size_t)snprintf(key, sizeof key, "%c%s", '\0', rid);
    drey_key k;
    drey_store_key(s.store, &k, DREY_COMMIT_OUTCOME_CACHE, strlen(DREY_COMMIT_OUTCOME_CACHE), key, n);
    drey_value v = {.kind = DREY_VALUE_BYTES, .data = bytes, .len = (uint32_t)len};
    drey_store_txn t;
    drey_store_txn_begin(s.store, &t, &k, 1);
    drey_store_txn_put(&t, &k, &v, T0 + RETENTION, 0);
    drey_store_txn_end(&t);
}

static ProtobufCMessage *apply_at(const drey_write *w, int64_t now, drey_status *st) {
    drey_status_init(st);
    drey_apply ax = {.now_ms = now, .arena = &arena, .status = st};
    return drey_commit_apply(s.commit, w, &ax);
}

static drey_commit_known lookup_at(const drey_write *w, int64_t now, drey_status *st) {
    drey_status_init(st);
    drey_apply ax = {.now_ms = now, .arena = &arena, .status = st};
    ProtobufCMessage *resp;
    drey_commit_known k = drey_commit_lookup(s.commit, w, &ax, &resp);
    cr_assert_null(resp);
    return k;
}

/* A failed CAS with request_id "cas": k is at version 1, if_version 999. */
static void failed_cas(drey_write *cas) {
    drey_write w0;
    make_set(&s, &w0, &arena, "", "k", "v", 0, -1, "", "");
    drey_status st;
    cr_assert_not_null(apply_at(&w0, T0, &st));
    make_set(&s, cas, &arena, "", "k", "new", 0, 999, "cas", "");
    cr_assert_null(apply_at(cas, T0 + 1, &st));
    cr_assert_eq(st.error, DREY_ERR_VERSION_MISMATCH);
}

Test(outcome, a_persisted_failure_names_its_reason_not_an_ordinal) {
    drey_write cas;
    failed_cas(&cas);
    entry_copy e;
    cr_assert(read_outcome("cas", &e));
    static const char reason[] = "VERSION_MISMATCH";
    static const char key[] = "currentVersion";
    uint8_t want[64];
    size_t n = 0;
    want[n++] = DREY_COMMIT__FAILED;
    want[n++] = sizeof reason - 1;
    memcpy(want + n, reason, sizeof reason - 1);
    n += sizeof reason - 1;
    want[n++] = 1;
    want[n++] = sizeof key - 1;
    memcpy(want + n, key, sizeof key - 1);
    n += sizeof key - 1;
    want[n++] = 1;
    want[n++] = '1';
    cr_assert_eq(DREY_COMMIT__FAILED, 2, "the marker is part of the format");
    cr_assert_eq(e.len, 32 + n, "outcome of %" PRIu32 " bytes", e.len);
    cr_assert(memcmp(e.data + 32, want, n) == 0, "the failure is not marker 2, reason, metadata");
}

Test(outcome, an_old_format_outcome_answers_the_error_it_meant) {
    drey_write cas;
    failed_cas(&cas);
    /* Replace the remembered failure by the form binaries up to 5497eff
     * wrote (same fingerprint), with metadata of its own to tell them apart. */
    entry_copy e;
    cr_assert(read_outcome("cas", &e));
    uint8_t old[128];
    memcpy(old, e.data, 32);
    size_t n = 32 + v0_bytes(old + 32, 10, "currentVersion", "7");
    write_outcome("cas", old, n);

    drey_status st;
    cr_assert_eq(lookup_at(&cas, T0 + 2, &st), DREY_COMMIT_ANSWERED);
    cr_assert_eq(st.error, DREY_ERR_VERSION_MISMATCH);
    cr_assert_str_eq(drey_error_lookup(st.error)->reason, "VERSION_MISMATCH");
    cr_assert_eq(st.n_metadata, 1);
    cr_assert_str_eq(metadata(&st, "currentVersion"), "7");
    /* A retry that reaches apply is answered the same and applies nothing. */
    uint64_t version = drey_store_last_version(s.store);
    cr_assert_null(apply_at(&cas, T0 + 3, &st));
    cr_assert_eq(st.error, DREY_ERR_VERSION_MISMATCH);
    cr_assert_str_eq(metadata(&st, "currentVersion"), "7");
    cr_assert_eq(drey_store_last_version(s.store), version);
}

Test(outcome, the_ordinal_table_is_frozen) {
    cr_assert_null(drey_commit__v0_reason(0), "NONE was never a failure");
    for (unsigned i = 1; i < V0_ROWS; i++) {
        const char *r = drey_commit__v0_reason(i);
        cr_assert_not_null(r, "ordinal %u", i);
        cr_assert_str_eq(r, v0[i], "ordinal %u", i);
        /* And it decodes to the error of that reason, whatever its number
         * is today. */
        uint8_t b[64];
        drey_status st;
        decode(b, v0_bytes(b, i, "k", "v"), &st);
        cr_assert_str_eq(drey_error_lookup(st.error)->reason, v0[i], "ordinal %u", i);
        cr_assert_str_eq(metadata(&st, "k"), "v");
    }
    cr_assert_null(drey_commit__v0_reason(V0_ROWS), "the table has no row 5497eff did not have");
    cr_assert_null(drey_commit__v0_reason(0xffff));
}

Test(outcome, every_reason_round_trips) {
    size_t n;
    const drey_error_info *cat = drey_error_catalogue(&n);
    for (size_t i = 0; i < n; i++) {
        drey_status st, got;
        drey_status_init(&st);
        drey_status_set(&st, cat[i].error);
        drey_status_add_metadata(&st, "limitBytes", "%d", 42);
        drey_status_add_metadata(&st, "entryIndex", "%s", "");
        uint8_t b[256];
        size_t len = drey_commit__failure_bytes(&st);
        cr_assert_lt(len, sizeof b);
        cr_assert_eq((size_t)(drey_commit__failure_put(&st, b) - b), len, "%s", cat[i].reason);
        decode(b, len, &got);
        cr_assert_eq(got.error, cat[i].error, "%s", cat[i].reason);
        cr_assert_eq(got.n_metadata, 2);
        cr_assert_str_eq(metadata(&got, "limitBytes"), "42");
        cr_assert_str_eq(metadata(&got, "entryIndex"), "");
    }
}

Test(outcome, an_unknown_reason_is_internal_and_named) {
    /* As a newer binary could write it. */
    static const uint8_t b[] = {DREY_COMMIT__FAILED, 13, 'F', 'U', 'T', 'U', 'R', 'E', '_', 'R', 'E', 'A', 'S', 'O',
                                'N', 1, 1, 'k', 1, 'v'};
    drey_status st;
    decode(b, sizeof b, &st);
    cr_assert_eq(st.error, DREY_ERR_INTERNAL);
    cr_assert_str_eq(metadata(&st, "storedReason"), "FUTURE_REASON");
    cr_assert_null(metadata(&st, "k"), "metadata of an error we do not know is not passed on");

    /* Through the commit, as a retry sees it. */
    drey_write cas;
    failed_cas(&cas);
    entry_copy e;
    cr_assert(read_outcome("cas", &e));
    uint8_t stored[128];
    memcpy(stored, e.data, 32);
    memcpy(stored + 32, b, sizeof b);
    write_outcome("cas", stored, 32 + sizeof b);
    cr_assert_eq(lookup_at(&cas, T0 + 2, &st), DREY_COMMIT_ANSWERED);
    cr_assert_eq(st.error, DREY_ERR_INTERNAL);
    cr_assert_str_eq(metadata(&st, "storedReason"), "FUTURE_REASON");
}

Test(outcome, an_unknown_ordinal_is_internal_and_named) {
    unsigned ordinals[] = {0, (unsigned)V0_ROWS, 0x1234, 0xffff};
    for (size_t i = 0; i < sizeof ordinals / sizeof ordinals[0]; i++) {
        uint8_t b[64];
        drey_status st;
        decode(b, v0_bytes(b, ordinals[i], "k", "v"), &st);
        cr_assert_eq(st.error, DREY_ERR_INTERNAL, "ordinal %u", ordinals[i]);
        char want[16];
        snprintf(want, sizeof want, "%u", ordinals[i]);
        cr_assert_str_eq(metadata(&st, "storedError"), want);
    }
}

Test(outcome, truncated_or_unknown_forms_are_internal) {
    static const uint8_t marker_only[] = {DREY_COMMIT__FAILED};
    static const uint8_t short_reason[] = {DREY_COMMIT__FAILED, 16, 'V', 'E', 'R', 'S', 'I', 'O', 'N'};
    static const uint8_t short_v0[] = {DREY_COMMIT__FAILED_V0, 10};
    static const uint8_t other_marker[] = {7, 10, 0, 0};
    const struct {
        const uint8_t *b;
        size_t len;
    } cases[] = {{marker_only, sizeof marker_only},
                 {short_reason, sizeof short_reason},
                 {short_v0, sizeof short_v0},
                 {other_marker, sizeof other_marker},
                 {other_marker, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        drey_status st;
        decode(cases[i].b, cases[i].len, &st);
        cr_assert_eq(st.error, DREY_ERR_INTERNAL, "case %zu", i);
    }
    /* Metadata cut short keeps what is whole. */
    uint8_t b[64];
    size_t n = v0_bytes(b, 11, "key", "value");
    drey_status st;
    decode(b, n - 2, &st);
    cr_assert_eq(st.error, DREY_ERR_NOT_AN_INTEGER);
    cr_assert_eq(st.n_metadata, 0);
}
