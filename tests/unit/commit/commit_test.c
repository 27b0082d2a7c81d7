/*
 * Unit tests for src/commit/commit.c: idempotent application of writes.
 *
 * A real cache service is registered on a server that is never started, so
 * the commit applies real state transitions and replay finds methods by
 * path. Each test pins one promise: a retry gets the first outcome (success
 * or failure) without applying twice, a reused key with other content is
 * refused, principals are separate namespaces, outcomes expire, and replay
 * of the journal payload reproduces state and outcome.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>

#include "drey/journal/v1/journal.pb-c.h"
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

TestSuite(commit, .init = setup, .fini = teardown, .timeout = 60);

typedef struct outcome {
    drey_status st;
    ProtobufCMessage *resp;
    uint8_t *bytes; /* the packed response */
    size_t len;
} outcome;

static void outcome_free(outcome *o) {
    free(o->bytes);
    memset(o, 0, sizeof *o);
}

static void apply_at(drey_commit *c, const drey_write *w, int64_t now, outcome *o) {
    memset(o, 0, sizeof *o);
    drey_status_init(&o->st);
    drey_apply ax = {.now_ms = now, .arena = &arena, .status = &o->st};
    o->resp = drey_commit_apply(c, w, &ax);
    if (o->resp != NULL) {
        cr_assert(drey_status_ok(&o->st));
        o->bytes = pack(o->resp, &o->len);
    } else {
        cr_assert(!drey_status_ok(&o->st), "no response and no error");
    }
}

static drey_commit_known lookup_at(drey_commit *c, const drey_write *w, int64_t now, outcome *o) {
    memset(o, 0, sizeof *o);
    drey_status_init(&o->st);
    drey_apply ax = {.now_ms = now, .arena = &arena, .status = &o->st};
    drey_commit_known k = drey_commit_lookup(c, w, &ax, &o->resp);
    if (o->resp != NULL)
        o->bytes = pack(o->resp, &o->len);
    return k;
}

static void expect_same(const outcome *a, const outcome *b, const char *what) {
    cr_assert_eq(a->st.error, b->st.error, "%s: error %d vs %d", what, a->st.error, b->st.error);
    cr_assert_eq(a->len, b->len, "%s: response size", what);
    if (a->len > 0)
        cr_assert(memcmp(a->bytes, b->bytes, a->len) == 0, "%s: responses differ", what);
    cr_assert_eq(a->st.n_metadata, b->st.n_metadata, "%s: metadata count", what);
    for (size_t i = 0; i < a->st.n_metadata; i++) {
        cr_assert_str_eq(a->st.metadata[i].key, b->st.metadata[i].key, "%s", what);
        cr_assert_str_eq(a->st.metadata[i].value, b->st.metadata[i].value, "%s", what);
    }
}

static const char *metadata(const drey_status *st, const char *key) {
    for (size_t i = 0; i < st->n_metadata; i++)
        if (strcmp(st->metadata[i].key, key) == 0)
            return st->metadata[i].value;
    return NULL;
}

Test(commit, write_init_takes_the_request_id_field) {
    drey_write w;
    make_set(&s, &w, &arena, "", "k", "v", 0, -1, "req-1", "alice");
    cr_assert_str_eq(w.request_id, "req-1");
    cr_assert_str_eq(w.principal, "alice");
    cr_assert_str_eq(w.method->path, "/drey.cache.v1.Cache/Set");
    make_set(&s, &w, &arena, "", "k", "v", 0, -1, "", "alice");
    cr_assert_str_eq(w.request_id, "");
}

Test(commit, same_request_id_returns_the_identical_response_and_applies_once) {
    drey_write w;
    make_set(&s, &w, &arena, "", "k", "v1", 0, -1, "r1", "");
    outcome first, again, looked;
    cr_assert_eq(lookup_at(s.commit, &w, T0, &looked), DREY_COMMIT_NEW);
    apply_at(s.commit, &w, T0, &first);
    cr_assert_not_null(first.resp);
    uint64_t version = ((Drey__Cache__V1__SetResponse *)first.resp)->version;
    cr_assert_eq(drey_store_last_version(s.store), version);

    /* Before journaling, the chain's lookup answers a retry... */
    cr_assert_eq(lookup_at(s.commit, &w, T0 + 10, &looked), DREY_COMMIT_ANSWERED);
    expect_same(&first, &looked, "lookup");
    /* ...and an apply of the same write (a replayed or raced retry) too. */
    apply_at(s.commit, &w, T0 + 20, &again);
    expect_same(&first, &again, "apply");
    cr_assert_eq(drey_store_last_version(s.store), version, "applied twice");
    entry_copy e;
    cr_assert(read_entry(s.store, "", "k", T0 + 20, &e));
    cr_assert_eq(e.version, version);

    /* Changed meanwhile by another write: the retry still gets its own
     * first outcome, and changes nothing. */
    drey_write other;
    make_set(&s, &other, &arena, "", "k", "v2", 0, -1, "", "");
    outcome o2;
    apply_at(s.commit, &other, T0 + 30, &o2);
    outcome_free(&again);
    apply_at(s.commit, &w, T0 + 40, &again);
    expect_same(&first, &again, "after a change");
    cr_assert(read_entry(s.store, "", "k", T0 + 40, &e));
    cr_assert_eq(e.len, 2);
    cr_assert(memcmp(e.data, "v2", 2) == 0);
    outcome_free(&first);
    outcome_free(&again);
    outcome_free(&looked);
    outcome_free(&o2);
}

Test(commit, a_stored_failure_is_returned_again) {
    drey_write w0;
    make_set(&s, &w0, &arena, "", "k", "v", 0, -1, "", "");
    outcome o0;
    apply_at(s.commit, &w0, T0, &o0);
    uint64_t v0 = ((Drey__Cache__V1__SetResponse *)o0.resp)->version;

    drey_write cas;
    make_set(&s, &cas, &arena, "", "k", "new", 0, 999, "cas-1", "");
    outcome first, again;
    apply_at(s.commit, &cas, T0 + 1, &first);
    cr_assert_eq(first.st.error, DREY_ERR_VERSION_MISMATCH);
    char want[32];
    snprintf(want, sizeof want, "%" PRIu64, v0);
    cr_assert_str_eq(metadata(&first.st, "currentVersion"), want);
    cr_assert_eq(drey_error_lookup(first.st.error)->code, GRPC_STATUS_FAILED_PRECONDITION);

    /* The entry moves on to version 999; the retry must not succeed now. */
    drey_store_raise_version(s.store, 998);
    drey_write bump;
    make_set(&s, &bump, &arena, "", "k", "v999", 0, -1, "", "");
    outcome ob;
    apply_at(s.commit, &bump, T0 + 2, &ob);
    cr_assert_eq(((Drey__Cache__V1__SetResponse *)ob.resp)->version, 999);

    apply_at(s.commit, &cas, T0 + 3, &again);
    expect_same(&first, &again, "retried failure");
    cr_assert_str_eq(metadata(&again.st, "currentVersion"), want);
    outcome looked;
    cr_assert_eq(lookup_at(s.commit, &cas, T0 + 3, &looked), DREY_COMMIT_ANSWERED);
    cr_assert_null(looked.resp);
    expect_same(&first, &looked, "looked-up failure");
    entry_copy e;
    cr_assert(read_entry(s.store, "", "k", T0 + 3, &e));
    cr_assert_eq(e.version, 999);
    outcome_free(&o0);
    outcome_free(&first);
    outcome_free(&again);
    outcome_free(&ob);
    outcome_free(&looked);
}

Test(commit, same_id_with_different_content_is_idempotency_key_reused) {
    drey_write w, changed, other_method;
    make_set(&s, &w, &arena, "", "k", "v1", 0, -1, "r1", "");
    make_set(&s, &changed, &arena, "", "k", "v2", 0, -1, "r1", "");
    make_remove(&s, &other_method, &arena, "", "k", "r1", "");
    outcome first, o;
    apply_at(s.commit, &w, T0, &first);
    uint64_t version = drey_store_last_version(s.store);
    apply_at(s.commit, &changed, T0 + 1, &o);
    cr_assert_eq(o.st.error, DREY_ERR_IDEMPOTENCY_KEY_REUSED);
    const drey_error_info *info = drey_error_lookup(DREY_ERR_IDEMPOTENCY_KEY_REUSED);
    cr_assert_eq(info->code, GRPC_STATUS_FAILED_PRECONDITION);
    cr_assert_str_eq(info->reason, "IDEMPOTENCY_KEY_REUSED");
    outcome_free(&o);
    cr_assert_eq(lookup_at(s.commit, &changed, T0 + 1, &o), DREY_COMMIT_ANSWERED);
    cr_assert_eq(o.st.error, DREY_ERR_IDEMPOTENCY_KEY_REUSED);
    outcome_free(&o);
    /* Another method with the same id and key: also reused. */
    apply_at(s.commit, &other_method, T0 + 2, &o);
    cr_assert_eq(o.st.error, DREY_ERR_IDEMPOTENCY_KEY_REUSED);
    cr_assert_eq(drey_store_last_version(s.store), version);
    entry_copy e;
    cr_assert(read_entry(s.store, "", "k", T0 + 2, &e), "the remove was applied");
    cr_assert(memcmp(e.data, "v1", 2) == 0);
    /* The original still answers. */
    outcome_free(&o);
    apply_at(s.commit, &w, T0 + 3, &o);
    expect_same(&first, &o, "original");
    outcome_free(&first);
    outcome_free(&o);
}

Test(commit, principals_do_not_collide) {
    drey_write a, b, anon;
    make_increment(&s, &a, &arena, "", "counter", 1, "same-id", "alice");
    make_increment(&s, &b, &arena, "", "counter", 1, "same-id", "bob");
    make_increment(&s, &anon, &arena, "", "counter", 1, "same-id", "");
    outcome oa, ob, oanon, retry;
    apply_at(s.commit, &a, T0, &oa);
    apply_at(s.commit, &b, T0 + 1, &ob);
    apply_at(s.commit, &anon, T0 + 2, &oanon);
    cr_assert_eq(((Drey__Cache__V1__IncrementResponse *)oa.resp)->value, 1);
    cr_assert_eq(((Drey__Cache__V1__IncrementResponse *)ob.resp)->value, 2);
    cr_assert_eq(((Drey__Cache__V1__IncrementResponse *)oanon.resp)->value, 3);
    apply_at(s.commit, &b, T0 + 3, &retry);
    expect_same(&ob, &retry, "bob's retry");
    entry_copy e;
    cr_assert(read_entry(s.store, "", "counter", T0 + 3, &e));
    int64_t v;
    memcpy(&v, e.data, 8);
    cr_assert_eq(v, 3, "a retry incremented again");
    /* A principal name that would shift the separator does not collide:
     * ("a", "b\0c") vs ("a\0b", "c") cannot arise, but ("ab", "c") vs
     * ("a", "bc") must stay apart. */
    drey_write x, y;
    make_increment(&s, &x, &arena, "", "counter", 10, "bc", "a");
    make_increment(&s, &y, &arena, "", "counter", 100, "c", "ab");
    outcome ox, oy;
    apply_at(s.commit, &x, T0 + 4, &ox);
    apply_at(s.commit, &y, T0 + 5, &oy);
    cr_assert_eq(((Drey__Cache__V1__IncrementResponse *)oy.resp)->value, 113);
    outcome_free(&oa);
    outcome_free(&ob);
    outcome_free(&oanon);
    outcome_free(&retry);
    outcome_free(&ox);
    outcome_free(&oy);
}

Test(commit, writes_without_a_request_id_apply_every_time) {
    drey_write w;
    make_increment(&s, &w, &arena, "", "n", 1, "", "alice");
    outcome o;
    for (int i = 1; i <= 3; i++) {
        cr_assert_eq(lookup_at(s.commit, &w, T0, &o), DREY_COMMIT_NEW);
        outcome_free(&o);
        apply_at(s.commit, &w, T0 + i, &o);
        cr_assert_eq(((Drey__Cache__V1__IncrementResponse *)o.resp)->value, i);
        outcome_free(&o);
    }
}

Test(commit, outcomes_expire_after_the_retention) {
    drey_write w;
    make_increment(&s, &w, &arena, "", "n", 5, "r", "");
    outcome first, o;
    apply_at(s.commit, &w, T0, &first);
    cr_assert_eq(lookup_at(s.commit, &w, T0 + RETENTION - 1, &o), DREY_COMMIT_ANSWERED);
    expect_same(&first, &o, "within the window");
    outcome_free(&o);
    cr_assert_eq(lookup_at(s.commit, &w, T0 + RETENTION, &o), DREY_COMMIT_NEW);
    outcome_free(&o);
    /* Past the window, the same request is a new write. */
    apply_at(s.commit, &w, T0 + RETENTION, &o);
    cr_assert_eq(((Drey__Cache__V1__IncrementResponse *)o.resp)->value, 10);
    outcome_free(&o);
    /* And its outcome is remembered from then on. */
    cr_assert_eq(lookup_at(s.commit, &w, T0 + 2 * RETENTION - 1, &o), DREY_COMMIT_ANSWERED);
    cr_assert_eq(((Drey__Cache__V1__IncrementResponse *)o.resp)->value, 10);
    outcome_free(&o);
    outcome_free(&first);
}

Test(commit, outcomes_are_entries_of_the_internal_cache) {
    drey_write w;
    make_set(&s, &w, &arena, "", "k", "v", 0, -1, "r1", "alice");
    outcome o;
    apply_at(s.commit, &w, T0, &o);
    drey_key k;
    drey_store_key(s.store, &k, DREY_COMMIT_OUTCOME_CACHE, strlen(DREY_COMMIT_OUTCOME_CACHE), "alice\0r1", 8);
    entry_copy e;
    cr_assert(drey_store_read(s.store, &k, T0, copy_entry, &e));
    cr_assert_eq(e.expires_at_ms, T0 + RETENTION);
    cr_assert_eq(e.version, 0, "outcomes consume no version");
    cr_assert_eq(drey_store_last_version(s.store), 1);
    outcome_free(&o);
}

/* --- replay --------------------------------------------------------------------- */

static drey_journal_record encode(const drey_write *w, uint64_t lsn, int64_t time_ms) {
    uint8_t *payload;
    size_t len;
    drey_commit_encode(w, &arena, &payload, &len);
    return (drey_journal_record){.lsn = lsn, .time_ms = time_ms, .payload = payload, .len = len};
}

Test(commit, encode_is_a_journal_record) {
    drey_write w;
    make_set(&s, &w, &arena, "c", "k", "v", 0, -1, "rid", "bob");
    drey_journal_record rec = encode(&w, 1, T0);
    Drey__Journal__V1__JournalRecord *jr = drey__journal__v1__journal_record__unpack(NULL, rec.len, rec.payload);
    cr_assert_not_null(jr);
    cr_assert_str_eq(jr->method, "drey.cache.v1.Cache/Set");
    cr_assert_str_eq(jr->principal, "bob");
    cr_assert_str_eq(jr->request_id, "rid");
    cr_assert_eq(jr->request.len, w.request_len);
    cr_assert(memcmp(jr->request.data, w.request_bytes, w.request_len) == 0);
    drey__journal__v1__journal_record__free_unpacked(jr, NULL);
}

Test(commit, replay_reproduces_state_and_outcome) {
    write_stack r;
    stack_create(&r, RETENTION);
    /* A sequence of writes, live on s and replayed on r. */
    drey_write ws[6];
    make_set(&s, &ws[0], &arena, "", "a", "1", 5000, -1, "w0", "alice");
    make_set(&s, &ws[1], &arena, "users", "b", "2", 0, -1, "", "");
    make_increment(&s, &ws[2], &arena, "", "n", 7, "w2", "");
    make_set(&s, &ws[3], &arena, "", "a", "x", 0, 12345, "w3", "alice"); /* fails: version mismatch */
    make_remove(&s, &ws[4], &arena, "users", "b", "w4", "bob");
    make_increment(&s, &ws[5], &arena, "", "n", 1, "", "");
    outcome live[6];
    for (int i = 0; i < 6; i++) {
        apply_at(s.commit, &ws[i], T0 + i * 10, &live[i]);
        drey_journal_record rec = encode(&ws[i], (uint64_t)i + 1, T0 + i * 10);
        cr_assert_eq(drey_commit_replay(r.commit, &rec), 0, "record %d", i);
    }
    cr_assert_eq(live[3].st.error, DREY_ERR_VERSION_MISMATCH);
    cr_assert_eq(drey_store_last_version(r.store), drey_store_last_version(s.store));
    const char *keys[][2] = {{"", "a"}, {"users", "b"}, {"", "n"}};
    for (size_t i = 0; i < 3; i++) {
        entry_copy x, y;
        bool fx = read_entry(s.store, keys[i][0], keys[i][1], T0 + 100, &x);
        bool fy = read_entry(r.store, keys[i][0], keys[i][1], T0 + 100, &y);
        cr_assert_eq(fx, fy, "%s/%s", keys[i][0], keys[i][1]);
        if (fx) {
            cr_assert_eq(x.version, y.version);
            cr_assert_eq(x.expires_at_ms, y.expires_at_ms);
            cr_assert_eq(x.len, y.len);
            cr_assert(memcmp(x.data, y.data, x.len) == 0);
        }
    }
    entry_copy a;
    cr_assert(read_entry(r.store, "", "a", T0 + 100, &a));
    cr_assert_eq(a.expires_at_ms, T0 + 5000, "expiry from the record's time, not the replay's");
    /* Every retry finds the same outcome on the replayed node, failures
     * included. */
    for (int i = 0; i < 6; i++) {
        if (ws[i].request_id[0] == '\0')
            continue;
        outcome o;
        cr_assert_eq(lookup_at(r.commit, &ws[i], T0 + 1000, &o), DREY_COMMIT_ANSWERED, "write %d", i);
        expect_same(&live[i], &o, "replayed outcome");
        outcome_free(&o);
    }
    /* Replaying a record twice (a retry journaled twice) applies once. */
    uint64_t before = drey_store_last_version(r.store);
    drey_journal_record rec = encode(&ws[2], 7, T0 + 500);
    cr_assert_eq(drey_commit_replay(r.commit, &rec), 0);
    cr_assert_eq(drey_store_last_version(r.store), before);
    for (int i = 0; i < 6; i++)
        outcome_free(&live[i]);
    stack_destroy(&r);
}

static drey_journal_record raw_record(const char *method, const uint8_t *req, size_t req_len) {
    Drey__Journal__V1__JournalRecord jr = DREY__JOURNAL__V1__JOURNAL_RECORD__INIT;
    jr.method = (char *)method;
    jr.request.data = (uint8_t *)req;
    jr.request.len = req_len;
    size_t len = protobuf_c_message_get_packed_size(&jr.base);
    uint8_t *buf = drey_arena_alloc(&arena, len ? len : 1);
    protobuf_c_message_pack(&jr.base, buf);
    return (drey_journal_record){.lsn = 1, .time_ms = T0, .payload = buf, .len = len};
}

Test(commit, replay_refuses_unknown_methods_and_garbage) {
    drey_write w;
    make_set(&s, &w, &arena, "", "k", "v", 0, -1, "", "");
    drey_journal_record rec = raw_record("drey.cache.v1.Cache/Nope", w.request_bytes, w.request_len);
    cr_assert_eq(drey_commit_replay(s.commit, &rec), -EINVAL);
    rec = raw_record("nope.Service/Set", w.request_bytes, w.request_len);
    cr_assert_eq(drey_commit_replay(s.commit, &rec), -EINVAL);
    /* A read method has no state transition. */
    rec = raw_record("drey.cache.v1.Cache/Get", (const uint8_t *)"", 0);
    cr_assert_eq(drey_commit_replay(s.commit, &rec), -EINVAL);
    /* A request that does not decode as the method's input. */
    static const uint8_t bad_req[] = {0x12, 0x7f, 0x01};
    rec = raw_record("drey.cache.v1.Cache/Set", bad_req, sizeof bad_req);
    cr_assert_eq(drey_commit_replay(s.commit, &rec), -EINVAL);
    /* A payload that is not a JournalRecord. */
    static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0x0f};
    drey_journal_record g = {.lsn = 1, .time_ms = T0, .payload = garbage, .len = sizeof garbage};
    cr_assert_eq(drey_commit_replay(s.commit, &g), -EINVAL);
    cr_assert_eq(drey_store_last_version(s.store), 0, "nothing was applied");
    /* The same record, well-formed, applies. */
    rec = raw_record("drey.cache.v1.Cache/Set", w.request_bytes, w.request_len);
    cr_assert_eq(drey_commit_replay(s.commit, &rec), 0);
    cr_assert_eq(drey_store_last_version(s.store), 1);
}

/* --- versions carried in the record ------------------------------------------------ */

/* A SetMany of n string entries keyed keys[i], value "v". */
static void make_set_many(write_stack *st, drey_write *w, const char *const *keys, size_t n) {
    Drey__Cache__V1__Value v = DREY__CACHE__V1__VALUE__INIT;
    v.kind_case = DREY__CACHE__V1__VALUE__KIND_STRING_VALUE;
    v.string_value = "v";
    Drey__Cache__V1__SetManyRequest__Entry es[8], *ep[8];
    cr_assert_leq(n, 8);
    for (size_t i = 0; i < n; i++) {
        drey__cache__v1__set_many_request__entry__init(&es[i]);
        es[i].key = (char *)keys[i];
        es[i].value = &v;
        ep[i] = &es[i];
    }
    Drey__Cache__V1__SetManyRequest req = DREY__CACHE__V1__SET_MANY_REQUEST__INIT;
    req.cache = "";
    req.entries = ep;
    req.n_entries = n;
    make_write(st, w, &arena, "SetMany", &req.base, "");
}

static void make_add(write_stack *st, drey_write *w, const char *key, const char *request_id) {
    Drey__Cache__V1__Value v = DREY__CACHE__V1__VALUE__INIT;
    v.kind_case = DREY__CACHE__V1__VALUE__KIND_STRING_VALUE;
    v.string_value = "added";
    Drey__Cache__V1__AddRequest req = DREY__CACHE__V1__ADD_REQUEST__INIT;
    req.cache = "";
    req.key = (char *)key;
    req.value = &v;
    req.request_id = (char *)request_id;
    make_write(st, w, &arena, "Add", &req.base, "");
}

static uint64_t version_of(drey_store *st, const char *key) {
    entry_copy e;
    cr_assert(read_entry(st, "", key, T0 + 100, &e), "%s is there", key);
    return e.version;
}

static uint64_t replayed(drey_commit *c, drey_write *w, uint64_t first_version, uint64_t lsn) {
    w->first_version = first_version;
    drey_journal_record rec = encode(w, lsn, T0 + (int64_t)lsn);
    cr_assert_eq(drey_commit_replay(c, &rec), 0);
    return first_version;
}

Test(commit, encode_carries_the_first_version_and_zero_stays_absent) {
    drey_write w;
    make_set(&s, &w, &arena, "", "k", "v", 0, -1, "", "");
    w.first_version = 123456789;
    drey_journal_record rec = encode(&w, 1, T0);
    Drey__Journal__V1__JournalRecord *jr = drey__journal__v1__journal_record__unpack(NULL, rec.len, rec.payload);
    cr_assert_not_null(jr);
    cr_assert_eq(jr->first_version, 123456789);
    drey__journal__v1__journal_record__free_unpacked(jr, NULL);
    /* An unreserved write's record is byte for byte what older code wrote. */
    w.first_version = 0;
    drey_journal_record plain = encode(&w, 1, T0);
    drey_journal_record old = raw_record("drey.cache.v1.Cache/Set", w.request_bytes, w.request_len);
    cr_assert_eq(plain.len, old.len);
    cr_assert(memcmp(plain.payload, old.payload, old.len) == 0);
}

/* The journal stage's two steps make a record that decodes as the one-step
 * encoding does, for every width of varint. */
Test(commit, a_record_completed_with_its_order_decodes_as_the_whole_one) {
    static const uint64_t versions[] = {0, 1, 127, 128, 16384, 1ull << 32, UINT64_MAX};
    drey_write w;
    make_set(&s, &w, &arena, "c", "k", "v", 0, -1, "rid", "bob");
    drey_store_victim ev = {.cache = "c", .cache_len = 1, .key = "old", .key_len = 3, .version = 5};
    w.evicted = &ev;
    w.n_evicted = 1;
    for (size_t i = 0; i < sizeof versions / sizeof versions[0]; i++) {
        w.first_version = versions[i];
        uint8_t *buf;
        size_t len;
        drey_commit_encode_unordered(&w, &arena, &buf, &len);
        size_t n = drey_commit_encode_order(&w, buf + len);
        cr_assert_leq(n, DREY_COMMIT_ORDER_ROOM);
        Drey__Journal__V1__JournalRecord *jr = drey__journal__v1__journal_record__unpack(NULL, len + n, buf);
        cr_assert_not_null(jr, "version %llu", (unsigned long long)versions[i]);
        cr_assert_eq(jr->first_version, versions[i]);
        cr_assert_str_eq(jr->request_id, "rid");
        cr_assert_eq(jr->n_evicted, 1);
        cr_assert_eq(jr->evicted[0]->version, 5);
        /* Same fields as the one-step record: it re-packs to those bytes. */
        size_t plen = protobuf_c_message_get_packed_size(&jr->base);
        uint8_t *packed = drey_arena_alloc(&arena, plen);
        protobuf_c_message_pack(&jr->base, packed);
        drey__journal__v1__journal_record__free_unpacked(jr, NULL);
        drey_journal_record whole = encode(&w, 1, T0);
        cr_assert_eq(plen, whole.len);
        cr_assert(memcmp(packed, whole.payload, plen) == 0);
    }
}

Test(commit, replay_gives_a_key_the_records_version_on_a_counter_behind) {
    drey_write w;
    make_set(&s, &w, &arena, "", "k", "v", 0, -1, "rid", "");
    replayed(s.commit, &w, 1000, 1);
    cr_assert_eq(version_of(s.store, "k"), 1000);
    cr_assert_eq(drey_store_last_version(s.store), 1000, "the counter is raised past it");
    /* The remembered outcome names the same version. */
    outcome o;
    cr_assert_eq(lookup_at(s.commit, &w, T0 + 10, &o), DREY_COMMIT_ANSWERED);
    cr_assert_eq(((Drey__Cache__V1__SetResponse *)o.resp)->version, 1000);
    outcome_free(&o);
    /* A later write of this node's own goes on above it. */
    drey_write next;
    make_set(&s, &next, &arena, "", "k2", "v", 0, -1, "", "");
    apply_at(s.commit, &next, T0 + 20, &o);
    cr_assert_eq(((Drey__Cache__V1__SetResponse *)o.resp)->version, 1001);
    outcome_free(&o);
}

Test(commit, replay_gives_a_key_the_records_version_on_a_counter_far_ahead) {
    drey_store_raise_version(s.store, 5000000);
    drey_write w;
    make_set(&s, &w, &arena, "", "k", "v", 0, -1, "", "");
    replayed(s.commit, &w, 17, 1);
    cr_assert_eq(version_of(s.store, "k"), 17, "the record's, not the counter's");
    cr_assert_eq(drey_store_last_version(s.store), 5000000, "never lowered");
    /* A conditional write on the replica checks against the carried version. */
    drey_write cas;
    make_set(&s, &cas, &arena, "", "k", "w", 0, 17, "", "");
    replayed(s.commit, &cas, 18, 2);
    entry_copy e;
    cr_assert(read_entry(s.store, "", "k", T0 + 100, &e));
    cr_assert_eq(e.version, 18);
    cr_assert(e.len == 1 && e.data[0] == 'w', "the if_version matched the carried version");
}

Test(commit, a_record_without_first_version_takes_the_counter_as_before) {
    drey_store_raise_version(s.store, 41);
    drey_write w;
    make_set(&s, &w, &arena, "", "k", "v", 0, -1, "", "");
    drey_journal_record rec = raw_record("drey.cache.v1.Cache/Set", w.request_bytes, w.request_len);
    cr_assert_eq(drey_commit_replay(s.commit, &rec), 0);
    cr_assert_eq(version_of(s.store, "k"), 42);
    cr_assert_eq(drey_store_last_version(s.store), 42);
}

Test(commit, set_many_increment_and_add_records_replay_with_their_versions) {
    write_stack r;
    stack_create(&r, RETENTION);
    drey_store_raise_version(r.store, 250); /* between the records' versions */
    const char *keys[] = {"a", "b", "c"};
    drey_write sm, inc, inc2, add, add_again;
    make_set_many(&s, &sm, keys, 3);
    make_increment(&s, &inc, &arena, "", "n", 5, "", "");
    make_increment(&s, &inc2, &arena, "", "n", 1, "", "");
    make_add(&s, &add, "fresh", "add-1");
    make_add(&s, &add_again, "a", ""); /* a is there: adds nothing */
    replayed(r.commit, &sm, 200, 1);
    replayed(r.commit, &inc, 300, 2);
    replayed(r.commit, &inc2, 301, 3);
    replayed(r.commit, &add, 400, 4);
    replayed(r.commit, &add_again, 500, 5);
    cr_assert_eq(version_of(r.store, "a"), 200);
    cr_assert_eq(version_of(r.store, "b"), 201);
    cr_assert_eq(version_of(r.store, "c"), 202);
    cr_assert_eq(version_of(r.store, "n"), 301);
    cr_assert_eq(version_of(r.store, "fresh"), 400);
    entry_copy e;
    cr_assert(read_entry(r.store, "", "n", T0 + 100, &e));
    cr_assert_eq(e.kind, DREY_VALUE_INT64);
    cr_assert_eq(drey_store_last_version(r.store), 400, "an unused version leaves a gap, no counter bump");
    outcome o;
    cr_assert_eq(lookup_at(r.commit, &add, T0 + 100, &o), DREY_COMMIT_ANSWERED);
    cr_assert_eq(((Drey__Cache__V1__AddResponse *)o.resp)->version, 400);
    outcome_free(&o);
    stack_destroy(&r);
}

Test(commit, reserving_takes_one_version_per_key_and_a_refusal_gives_them_back) {
    drey_store_raise_version(s.store, 9);
    const char *keys[] = {"a", "b", "c"};
    drey_write sm, set1;
    make_set_many(&s, &sm, keys, 3);
    make_set(&s, &set1, &arena, "", "k", "v", 0, -1, "", "");
    drey_commit_reserve_versions(s.commit, &sm);
    cr_assert_eq(sm.first_version, 10);
    drey_commit_reserve_versions(s.commit, &set1);
    cr_assert_eq(set1.first_version, 13);
    cr_assert_eq(drey_store_last_version(s.store), 13);
    /* The last reservation goes back whole; an earlier one cannot (someone
     * took versions after it) and stays a gap. */
    drey_commit_unreserve_versions(s.commit, &set1);
    cr_assert_eq(set1.first_version, 0);
    cr_assert_eq(drey_store_last_version(s.store), 12);
    drey_commit_unreserve_versions(s.commit, &sm);
    cr_assert_eq(drey_store_last_version(s.store), 9);
    drey_commit_reserve_versions(s.commit, &sm);
    drey_commit_reserve_versions(s.commit, &set1);
    drey_commit_unreserve_versions(s.commit, &sm);
    cr_assert_eq(drey_store_last_version(s.store), 13, "a gap, never a reuse");
    /* Live, the apply hands out exactly the reserved ones. */
    outcome o;
    apply_at(s.commit, &set1, T0, &o);
    cr_assert_eq(((Drey__Cache__V1__SetResponse *)o.resp)->version, 13);
    outcome_free(&o);
    /* A write that names no key reserves nothing. */
    Drey__Cache__V1__ClearRequest clr = DREY__CACHE__V1__CLEAR_REQUEST__INIT;
    clr.cache = "";
    drey_write cw;
    make_write(&s, &cw, &arena, "Clear", &clr.base, "");
    drey_commit_reserve_versions(s.commit, &cw);
    cr_assert_eq(cw.first_version, 0);
    cr_assert_eq(drey_store_last_version(s.store), 13);
}

Test(commit, taking_more_versions_than_reserved_aborts, .signal = SIGABRT) {
    drey_status st;
    drey_status_init(&st);
    drey_apply ax = {.now_ms = T0, .arena = &arena, .status = &st, .next_version = 7, .n_versions = 1};
    cr_assert_eq(drey_apply_version(&ax, s.store), 7);
    cr_assert_eq(drey_store_last_version(s.store), 7);
    drey_apply_version(&ax, s.store); /* the next write's: a programming error */
}

/* --- racing retries ---------------------------------------------------------------- */

typedef struct racer {
    const drey_write *w;
    pthread_barrier_t *start;
    uint8_t bytes[64];
    size_t len;
} racer;

static void *race(void *arg) {
    racer *r = arg;
    char buf[2048];
    drey_arena a;
    drey_arena_init(&a, buf, sizeof buf);
    drey_status st;
    drey_status_init(&st);
    drey_apply ax = {.now_ms = T0, .arena = &a, .status = &st};
    pthread_barrier_wait(r->start);
    ProtobufCMessage *resp = drey_commit_apply(s.commit, r->w, &ax);
    r->len = resp != NULL ? protobuf_c_message_get_packed_size(resp) : 0;
    if (resp != NULL && r->len <= sizeof r->bytes)
        protobuf_c_message_pack(resp, r->bytes);
    drey_arena_destroy(&a);
    return NULL;
}

Test(commit, racing_attempts_of_one_request_apply_once) {
    enum { N = 8 };
    for (int round = 0; round < 50; round++) {
        char rid[32];
        snprintf(rid, sizeof rid, "race-%d", round);
        drey_write w;
        make_increment(&s, &w, &arena, "", "raced", 1, rid, "");
        pthread_barrier_t start;
        pthread_barrier_init(&start, NULL, N);
        racer rs[N];
        pthread_t th[N];
        for (int i = 0; i < N; i++) {
            rs[i] = (racer){.w = &w, .start = &start};
            pthread_create(&th[i], NULL, race, &rs[i]);
        }
        for (int i = 0; i < N; i++)
            pthread_join(th[i], NULL);
        pthread_barrier_destroy(&start);
        for (int i = 1; i < N; i++) {
            cr_assert_gt(rs[i].len, 0);
            cr_assert_eq(rs[i].len, rs[0].len);
            cr_assert(memcmp(rs[i].bytes, rs[0].bytes, rs[0].len) == 0, "round %d: different outcomes", round);
        }
        entry_copy e;
        cr_assert(read_entry(s.store, "", "raced", T0, &e));
        int64_t v;
        memcpy(&v, e.data, 8);
        cr_assert_eq(v, round + 1, "round %d: applied %" PRId64 " times in all", round, v);
    }
}

/* --- evictions ------------------------------------------------------------------- */

static bool present(drey_store *st, const char *cache, const char *key) {
    entry_copy e;
    return read_entry(st, cache, key, T0 + 100, &e);
}

Test(commit, evictions_ride_in_the_record_and_replay_exactly) {
    write_stack r;
    stack_create(&r, RETENTION);
    drey_write ws[4];
    make_set(&s, &ws[0], &arena, "c", "victim", "1", 0, -1, "", "");
    make_set(&s, &ws[1], &arena, "c", "rewritten", "1", 0, -1, "", "");
    for (int i = 0; i < 2; i++) {
        outcome o;
        apply_at(s.commit, &ws[i], T0 + i, &o);
        outcome_free(&o);
        drey_journal_record rec = encode(&ws[i], (uint64_t)i + 1, T0 + i);
        cr_assert_eq(drey_commit_replay(r.commit, &rec), 0);
    }
    /* chosen at versions 1 and 2; "rewritten" gets version 3 before the
     * write that evicts applies, so it stays */
    drey_store_victim v[2] = {
        {.cache = "c", .cache_len = 1, .key = "victim", .key_len = 6, .version = 1},
        {.cache = "c", .cache_len = 1, .key = "rewritten", .key_len = 9, .version = 2},
    };
    make_set(&s, &ws[2], &arena, "c", "rewritten", "2", 0, -1, "", "");
    make_set(&s, &ws[3], &arena, "c", "new", "x", 0, -1, "rid-ev", "");
    ws[3].evicted = v;
    ws[3].n_evicted = 2;
    for (int i = 2; i < 4; i++) {
        outcome o;
        apply_at(s.commit, &ws[i], T0 + i, &o);
        outcome_free(&o);
        drey_journal_record rec = encode(&ws[i], (uint64_t)i + 1, T0 + i);
        cr_assert_eq(drey_commit_replay(r.commit, &rec), 0);
    }
    drey_store *stores[] = {s.store, r.store};
    for (int i = 0; i < 2; i++) {
        cr_assert_not(present(stores[i], "c", "victim"), "store %d", i);
        cr_assert(present(stores[i], "c", "rewritten"), "store %d: a rewritten victim was evicted", i);
        cr_assert(present(stores[i], "c", "new"), "store %d", i);
        drey_cache_stats cs;
        drey_store_cache_stats(stores[i], "c", 1, &cs);
        cr_assert_eq(cs.evictions, 1, "store %d", i);
    }
    /* a retry is answered from its outcome and evicts nothing more */
    drey_write again = ws[3];
    drey_store_victim more = {.cache = "c", .cache_len = 1, .key = "new", .key_len = 3, .version = 4};
    again.evicted = &more;
    again.n_evicted = 1;
    outcome o;
    apply_at(s.commit, &again, T0 + 10, &o);
    outcome_free(&o);
    cr_assert(present(s.store, "c", "new"));
    /* a write that fails evicts nothing */
    drey_write bad;
    make_set(&s, &bad, &arena, "c", "new", "y", 0, 999, "", "");
    bad.evicted = &more;
    bad.n_evicted = 1;
    apply_at(s.commit, &bad, T0 + 11, &o);
    cr_assert_eq(o.st.error, DREY_ERR_VERSION_MISMATCH);
    outcome_free(&o);
    cr_assert(present(s.store, "c", "new"), "a failed write evicted");
    stack_destroy(&r);
}

Test(commit, replay_refuses_an_eviction_drey_cannot_have_written) {
    drey_write w;
    make_set(&s, &w, &arena, "", "k", "v", 0, -1, "", "");
    char long_cache[300];
    memset(long_cache, 'c', sizeof long_cache - 1);
    long_cache[sizeof long_cache - 1] = '\0';
    drey_store_victim v = {.cache = long_cache, .cache_len = sizeof long_cache - 1, .key = "k", .key_len = 1,
                           .version = 1};
    w.evicted = &v;
    w.n_evicted = 1;
    drey_journal_record rec = encode(&w, 1, T0);
    cr_assert_eq(drey_commit_replay(s.commit, &rec), -EINVAL);
    cr_assert_eq(drey_store_last_version(s.store), 0, "nothing was applied");
}
