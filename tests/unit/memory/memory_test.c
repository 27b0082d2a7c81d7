/*
 * Unit tests for src/memory/memory.c: memory admission.
 *
 * "Used" is moved through a real drey_store: the tests put real entries with
 * the store's transaction API and size one entry's value so the store's
 * accounted bytes land on the exact figure wanted (drey_store_entry_bytes()
 * says what an entry costs). Limits are multiples of 100, where the module's
 * 80% and 95% are exact; see the thresholds tests for other limits.
 *
 * Pinned: the thresholds, the state each figure of "used" gives, the
 * admission rule (refuse only growth > 0 that would take used past
 * critical, reaching it exactly is allowed), the refusal's google.rpc
 * details, the rejection counter, and the default limit.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "drey/memory.h"
#include "drey/status.h"
#include "drey/store.h"
#include "google/protobuf/any.pb-c.h"
#include "google/protobuf/duration.pb-c.h"
#include "google/rpc/error_details.pb-c.h"
#include "google/rpc/status.pb-c.h"

#define LIMIT 10000
#define HIGH 8000     /* 80% of LIMIT */
#define CRITICAL 9500 /* 95% of LIMIT */
#define RETRY_MS 1000 /* RETRY_MS in memory.c */
#define NEVER 0

static drey_store *store;
static drey_memory *mem;

static void setup(void) {
    store = drey_store_create();
    cr_assert_not_null(store);
    mem = NULL;
}

static void teardown(void) {
    drey_memory_destroy(mem);
    drey_store_destroy(store);
}

TestSuite(memory, .init = setup, .fini = teardown, .timeout = 30);

/* --- helpers -------------------------------------------------------------- */

static drey_memory *create(int64_t limit, const char *node_id) {
    drey_memory_options o = {.limit_bytes = limit, .node_id = node_id};
    drey_memory *m = drey_memory_create(&o, store);
    cr_assert_not_null(m);
    return m;
}

static drey_key key_of(const char *k) {
    drey_key out;
    drey_store_key(store, &out, "", 0, k, strlen(k));
    return out;
}

static void put_bytes(const char *k, size_t len, int64_t expires_at_ms) {
    uint8_t *buf = calloc(1, len + 1);
    cr_assert_not_null(buf);
    drey_key key = key_of(k);
    drey_value v = {.kind = DREY_VALUE_BYTES, .data = buf, .len = (uint32_t)len};
    drey_store_txn t;
    drey_store_txn_begin(store, &t, &key, 1);
    drey_store_txn_put(&t, &key, &v, expires_at_ms, drey_store_next_version(store));
    drey_store_txn_end(&t);
    free(buf);
}

static void remove_key(const char *k) {
    drey_key key = key_of(k);
    drey_store_txn t;
    drey_store_txn_begin(store, &t, &key, 1);
    cr_assert(drey_store_txn_remove(&t, &key));
    drey_store_txn_end(&t);
}

/* Makes the store account exactly `used` bytes, all in the one entry "u". */
static void set_used(int64_t used) {
    int64_t overhead = (int64_t)drey_store_entry_bytes(0, 1, 0);
    cr_assert(ge(i64, used, overhead), "one entry costs at least %lld bytes", (long long)overhead);
    put_bytes("u", (size_t)(used - overhead), NEVER);
    cr_assert(eq(i64, drey_store_bytes(store), used));
}

static drey_memory_stats stats(void) {
    drey_memory_stats st;
    memset(&st, 0xA5, sizeof st);
    drey_memory_get_stats(mem, &st);
    return st;
}

static drey_level state(void) {
    return stats().state;
}

static bool admit(int64_t growth) {
    drey_status st;
    drey_status_init(&st);
    bool ok = drey_memory_admit(mem, growth, &st);
    cr_assert(eq(int, drey_status_ok(&st), ok), "admit said %d but the status is %s", ok,
              drey_error_lookup(st.error)->reason);
    return ok;
}

static const char *metadata(const drey_status *st, const char *key) {
    for (size_t i = 0; i < st->n_metadata; i++)
        if (strcmp(st->metadata[i].key, key) == 0)
            return st->metadata[i].value;
    return NULL;
}

/* Physical RAM, from /proc/meminfo (sysconf when it cannot be read). */
static int64_t physical_ram(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    long long kb = 0;
    if (f != NULL) {
        char line[128];
        while (fgets(line, sizeof line, f) != NULL)
            if (sscanf(line, "MemTotal: %lld kB", &kb) == 1)
                break;
        fclose(f);
    }
    if (kb > 0)
        return kb * 1024;
    return (int64_t)sysconf(_SC_PHYS_PAGES) * (int64_t)sysconf(_SC_PAGE_SIZE);
}

/* High and critical are 80% and 95% of the limit rounded down: at most
 * those shares, and short of them by less than one byte. */
static void assert_thresholds(const drey_memory_stats *st) {
    int64_t l = st->limit_bytes;
    cr_assert(le(i64, st->high_bytes * 100, l * 80), "limit %lld: high %lld", (long long)l, (long long)st->high_bytes);
    cr_assert(gt(i64, st->high_bytes * 100, l * 80 - 100), "limit %lld: high %lld", (long long)l,
              (long long)st->high_bytes);
    cr_assert(le(i64, st->critical_bytes * 100, l * 95), "limit %lld: critical %lld", (long long)l,
              (long long)st->critical_bytes);
    cr_assert(gt(i64, st->critical_bytes * 100, l * 95 - 100), "limit %lld: critical %lld", (long long)l,
              (long long)st->critical_bytes);
    cr_assert(lt(i64, st->high_bytes, st->critical_bytes));
}

/* --- thresholds ----------------------------------------------------------- */

Test(memory, high_and_critical_are_80_and_95_percent_of_an_explicit_limit) {
    mem = create(LIMIT, "n1");
    drey_memory_stats st = stats();
    cr_assert(eq(i64, st.limit_bytes, LIMIT));
    cr_assert(eq(i64, st.high_bytes, HIGH));
    cr_assert(eq(i64, st.critical_bytes, CRITICAL));

    drey_memory_destroy(mem);
    mem = create(64LL << 30 /* 64 GiB, more than int32 holds */, "n1");
    st = stats();
    cr_assert(eq(i64, st.limit_bytes, 64LL << 30));
    cr_assert(eq(i64, st.high_bytes, (64LL << 30) * 80 / 100));
    cr_assert(eq(i64, st.critical_bytes, (64LL << 30) * 95 / 100));
}

/* Whatever the limit (the configuration allows 1 byte to 2^50), the
 * thresholds are its shares rounded down, not those of the limit rounded
 * down to whole percent first, which made an empty store critical under a
 * limit below 100 bytes. */
Test(memory, thresholds_never_exceed_their_percentages) {
    static const int64_t limits[] = {50, 99, 199, 1000, 1023, 4096, 123457, 1LL << 30, 1LL << 50};
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
        drey_memory_destroy(mem);
        mem = create(limits[i], "n1");
        drey_memory_stats st = stats();
        cr_assert(eq(i64, st.limit_bytes, limits[i]));
        assert_thresholds(&st);
    }
}

Test(memory, a_tiny_limit_still_has_room_below_it) {
    mem = create(50, "n1");
    drey_memory_stats st = stats();
    cr_assert(eq(i64, st.high_bytes, 40));
    cr_assert(eq(i64, st.critical_bytes, 47));
    cr_assert(eq(int, st.state, DREY_LEVEL_NORMAL), "an empty store");
    drey_status ds;
    cr_assert(drey_memory_admit(mem, 47, &ds));
    cr_assert(not(drey_memory_admit(mem, 48, &ds)));
}

/* --- state ---------------------------------------------------------------- */

/* Each boundary belongs to the state above it: used == high is high, used ==
 * critical is critical. */
Test(memory, state_follows_the_stores_accounted_bytes) {
    mem = create(LIMIT, "n1");
    cr_assert(eq(int, state(), DREY_LEVEL_NORMAL), "an empty store");

    static const struct {
        int64_t used;
        drey_level want;
    } steps[] = {
        {HIGH - 1, DREY_LEVEL_NORMAL},       {HIGH, DREY_LEVEL_HIGH},
        {CRITICAL - 1, DREY_LEVEL_HIGH},     {CRITICAL, DREY_LEVEL_CRITICAL},
        {LIMIT + 5000, DREY_LEVEL_CRITICAL}, {CRITICAL - 1, DREY_LEVEL_HIGH}, /* shrinking back */
        {HIGH - 1, DREY_LEVEL_NORMAL},
    };
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        set_used(steps[i].used);
        drey_memory_stats st = stats();
        cr_assert(eq(i64, st.used_bytes, steps[i].used));
        cr_assert(eq(int, st.state, steps[i].want), "used %lld: %s, want %s", (long long)steps[i].used,
                  drey_level_name(st.state), drey_level_name(steps[i].want));
    }

    remove_key("u");
    cr_assert(eq(i64, stats().used_bytes, 0));
    cr_assert(eq(int, state(), DREY_LEVEL_NORMAL), "after the entry is removed");
}

/* Used is the sum over every entry, not one key's. */
Test(memory, used_counts_every_entry) {
    mem = create(LIMIT, "n1");
    int64_t each = (int64_t)drey_store_entry_bytes(0, 2, 1000);
    char k[3] = "k0";
    for (int i = 0; i < 9; i++) {
        k[1] = (char)('0' + i);
        put_bytes(k, 1000, NEVER);
    }
    cr_assert(eq(i64, stats().used_bytes, 9 * each));
    cr_assert(eq(int, state(), 9 * each >= CRITICAL ? DREY_LEVEL_CRITICAL : DREY_LEVEL_HIGH));
}

/* An expired entry nobody has swept still holds its memory, so it still
 * counts; the sweep that frees it gives the bytes back to admission. */
Test(memory, an_expired_entry_counts_until_it_is_swept) {
    mem = create(LIMIT, "n1");
    int64_t overhead = (int64_t)drey_store_entry_bytes(0, 1, 0);
    put_bytes("e", (size_t)(CRITICAL - overhead), 1000);
    cr_assert(eq(int, state(), DREY_LEVEL_CRITICAL));
    cr_assert(not(admit(1)));

    size_t expired = 0;
    for (int i = 0; i < DREY_STORE_SHARDS && expired == 0; i++)
        drey_store_sweep(store, 2000, SIZE_MAX, &expired);
    cr_assert(eq(sz, expired, 1));
    cr_assert(eq(i64, stats().used_bytes, 0));
    cr_assert(eq(int, state(), DREY_LEVEL_NORMAL));
    cr_assert(admit(1));
}

/* --- admission ------------------------------------------------------------ */

/* The rule is used + growth <= critical: a write may bring used to critical
 * exactly, and one byte more is refused. */
Test(memory, admit_refuses_only_growth_that_would_pass_critical) {
    mem = create(LIMIT, "n1");
    cr_assert(admit(CRITICAL), "an empty store may grow to critical exactly");
    cr_assert(not(admit(CRITICAL + 1)));

    set_used(9000);
    cr_assert(admit(1));
    cr_assert(admit(CRITICAL - 9000));
    cr_assert(not(admit(CRITICAL - 9000 + 1)));
    cr_assert(not(admit(INT32_MAX)));

    /* At critical nothing may grow, by a single byte. */
    set_used(CRITICAL);
    cr_assert(not(admit(1)));
}

/* Admission checks, it does not reserve: two writes each fitting alone are
 * both admitted, since neither has changed the store yet. */
Test(memory, admit_reserves_nothing) {
    mem = create(LIMIT, "n1");
    set_used(9000);
    cr_assert(admit(500));
    cr_assert(admit(500));
    cr_assert(eq(i64, drey_store_bytes(store), 9000));
}

/* Removes, reads, shrinking replaces: growth <= 0 always passes, even far
 * past the limit. */
Test(memory, admit_never_refuses_growth_of_zero_or_less) {
    mem = create(LIMIT, "n1");
    static const int64_t used[] = {0, CRITICAL, LIMIT * 3};
    static const int64_t growth[] = {0, -1, -1000000, INT64_MIN};
    for (size_t u = 0; u < sizeof used / sizeof used[0]; u++) {
        if (used[u] > 0)
            set_used(used[u]);
        for (size_t g = 0; g < sizeof growth / sizeof growth[0]; g++)
            cr_assert(admit(growth[g]), "used %lld growth %lld", (long long)used[u], (long long)growth[g]);
    }
    cr_assert(eq(u64, stats().rejections, 0));
}

/* A huge growth is refused, not wrapped around into an admission (under
 * UBSan the old used + growth was an overflow report). */
Test(memory, a_huge_growth_is_refused_without_overflow) {
    mem = create(LIMIT, "n1");
    set_used(145);
    cr_assert(not(admit(INT64_MAX)));
    cr_assert(not(admit(INT64_MAX - 100)));
    cr_assert(eq(u64, stats().rejections, 2));
}

/* An admitted write leaves the status alone (the caller may have put an
 * error there already); a refusal writes a whole status, so the caller need
 * not initialise it (the pipeline hands in fresh arena memory). */
Test(memory, admission_leaves_the_status_alone_and_a_refusal_needs_no_init) {
    mem = create(LIMIT, "n1");
    set_used(9000);

    drey_status st;
    drey_status_init(&st);
    drey_status_set(&st, DREY_ERR_QUEUE_FULL);
    cr_assert(drey_memory_admit(mem, 100, &st));
    cr_assert(eq(int, st.error, DREY_ERR_QUEUE_FULL));
    cr_assert(eq(sz, st.n_metadata, 0));

    memset(&st, 0xA5, sizeof st);
    cr_assert(not(drey_memory_admit(mem, 1000, &st)));
    cr_assert(eq(int, st.error, DREY_ERR_MEMORY_PRESSURE));
    cr_assert_null(st.message);
    cr_assert(eq(sz, st.n_metadata, 4));
    cr_assert(eq(sz, st.n_violations, 0));
    cr_assert(eq(sz, st.n_violations_total, 0));
}

/* The refusal as a client sees it: RESOURCE_EXHAUSTED, ErrorInfo reason
 * MEMORY_PRESSURE with figures whose keys carry their unit, a QuotaFailure
 * naming the node, and a RetryInfo. */
Test(memory, a_refusal_carries_memory_pressure_details) {
    mem = create(LIMIT, "node-7");
    set_used(9400);
    drey_status st;
    drey_status_init(&st);
    cr_assert(not(drey_memory_admit(mem, 200, &st)));

    cr_assert(eq(int, st.error, DREY_ERR_MEMORY_PRESSURE));
    cr_assert(eq(int, drey_status_code(&st), GRPC_STATUS_RESOURCE_EXHAUSTED));
    cr_assert(eq(str, (char *)drey_error_lookup(st.error)->reason, "MEMORY_PRESSURE"));
    cr_assert(eq(str, (char *)drey_status_message(&st), (char *)drey_error_lookup(DREY_ERR_MEMORY_PRESSURE)->message));

    static const struct {
        const char *key, *value;
    } want[] = {
        {"limitBytes", "10000"},
        {"usedBytes", "9400"},
        {"criticalBytes", "9500"},
        {"requestBytes", "200"},
    };
    cr_assert(eq(sz, st.n_metadata, sizeof want / sizeof want[0]));
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const char *v = metadata(&st, want[i].key);
        cr_assert_not_null(v, "no %s", want[i].key);
        cr_assert(eq(str, (char *)v, (char *)want[i].value), "%s", want[i].key);
    }
    for (size_t i = 0; i < st.n_metadata; i++) {
        size_t n = strlen(st.metadata[i].key);
        cr_assert(n > 5 && strcmp(st.metadata[i].key + n - 5, "Bytes") == 0, "%s has no unit", st.metadata[i].key);
    }

    cr_assert(eq(str, st.quota_subject, "node:node-7"));
    cr_assert_not_null(st.quota_description);
    cr_assert(gt(sz, strlen(st.quota_description), 0));
    cr_assert(eq(i64, st.retry_delay_ms, RETRY_MS));

    /* Encoded and decoded the way a client library would. */
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    uint8_t *bytes;
    size_t len;
    drey_status_encode(&st, &a, &bytes, &len);
    Google__Rpc__Status *s = google__rpc__status__unpack(NULL, len, bytes);
    drey_arena_destroy(&a);
    cr_assert_not_null(s);
    cr_assert(eq(i32, s->code, GRPC_STATUS_RESOURCE_EXHAUSTED));
    Google__Rpc__ErrorInfo *ei = NULL;
    Google__Rpc__QuotaFailure *qf = NULL;
    Google__Rpc__RetryInfo *ri = NULL;
    for (size_t i = 0; i < s->n_details; i++) {
        const Google__Protobuf__Any *any = s->details[i];
        if (strcmp(any->type_url, "type.googleapis.com/google.rpc.ErrorInfo") == 0)
            ei = google__rpc__error_info__unpack(NULL, any->value.len, any->value.data);
        else if (strcmp(any->type_url, "type.googleapis.com/google.rpc.QuotaFailure") == 0)
            qf = google__rpc__quota_failure__unpack(NULL, any->value.len, any->value.data);
        else if (strcmp(any->type_url, "type.googleapis.com/google.rpc.RetryInfo") == 0)
            ri = google__rpc__retry_info__unpack(NULL, any->value.len, any->value.data);
    }
    cr_assert_not_null(ei);
    cr_assert(eq(str, ei->reason, "MEMORY_PRESSURE"));
    cr_assert(eq(str, ei->domain, DREY_ERROR_DOMAIN));
    cr_assert(eq(sz, ei->n_metadata, 4));
    cr_assert(eq(str, ei->metadata[1]->key, "usedBytes"));
    cr_assert(eq(str, ei->metadata[1]->value, "9400"));
    cr_assert_not_null(qf);
    cr_assert(eq(sz, qf->n_violations, 1));
    cr_assert(eq(str, qf->violations[0]->subject, "node:node-7"));
    cr_assert_not_null(ri);
    cr_assert_not_null(ri->retry_delay);
    cr_assert(eq(i64, ri->retry_delay->seconds, RETRY_MS / 1000));
    cr_assert(eq(i32, ri->retry_delay->nanos, (RETRY_MS % 1000) * 1000000));
    google__rpc__retry_info__free_unpacked(ri, NULL);
    google__rpc__quota_failure__free_unpacked(qf, NULL);
    google__rpc__error_info__free_unpacked(ei, NULL);
    google__rpc__status__free_unpacked(s, NULL);
}

/* usedBytes is what the store held when the write asked, and requestBytes
 * the growth asked for, not the limit left. */
Test(memory, a_refusal_reports_the_figures_of_its_own_moment) {
    mem = create(LIMIT, "n1");
    set_used(LIMIT + 123);
    drey_status st;
    cr_assert(not(drey_memory_admit(mem, 7, &st)));
    cr_assert(eq(str, (char *)metadata(&st, "usedBytes"), "10123"));
    cr_assert(eq(str, (char *)metadata(&st, "requestBytes"), "7"));
    cr_assert(eq(str, (char *)metadata(&st, "limitBytes"), "10000"));
    cr_assert(eq(str, (char *)metadata(&st, "criticalBytes"), "9500"));
}

Test(memory, rejections_count_refusals_only) {
    mem = create(LIMIT, "n1");
    set_used(9000);
    cr_assert(eq(u64, stats().rejections, 0));
    cr_assert(admit(100));
    cr_assert(admit(0));
    cr_assert(admit(-50));
    cr_assert(not(admit(501)));
    cr_assert(not(admit(10000)));
    cr_assert(admit(500));
    cr_assert(not(admit(600)));
    cr_assert(eq(u64, stats().rejections, 3));
}

/* Admission runs on many request threads at once: the counter loses none. */
enum { REFUSERS = 4, REFUSALS_EACH = 2000 };

static void *refuse_many(void *arg) {
    (void)arg;
    for (int i = 0; i < REFUSALS_EACH; i++) {
        drey_status st;
        if (drey_memory_admit(mem, LIMIT, &st))
            return (void *)1;
    }
    return NULL;
}

Test(memory, concurrent_refusals_are_all_counted) {
    mem = create(LIMIT, "n1");
    pthread_t th[REFUSERS];
    for (int i = 0; i < REFUSERS; i++)
        cr_assert(eq(int, pthread_create(&th[i], NULL, refuse_many, NULL), 0));
    for (int i = 0; i < REFUSERS; i++) {
        void *admitted;
        pthread_join(th[i], &admitted);
        cr_assert_null(admitted, "a growth of the whole limit was admitted");
    }
    cr_assert(eq(u64, stats().rejections, (uint64_t)REFUSERS * REFUSALS_EACH));
}

/* --- stats ---------------------------------------------------------------- */

Test(memory, stats_report_the_figures_admission_uses) {
    mem = create(LIMIT, "n1");
    set_used(HIGH + 1);
    cr_assert(not(admit(CRITICAL)));
    drey_memory_stats st = stats();
    cr_assert(eq(int, st.state, DREY_LEVEL_HIGH));
    cr_assert(eq(i64, st.limit_bytes, LIMIT));
    cr_assert(eq(i64, st.high_bytes, HIGH));
    cr_assert(eq(i64, st.critical_bytes, CRITICAL));
    cr_assert(eq(i64, st.used_bytes, HIGH + 1));
    cr_assert(eq(i64, st.used_bytes, drey_store_bytes(store)));
    cr_assert(eq(u64, st.rejections, 1));
    /* This test binary links no jemalloc unless something brought it in. */
    if (dlsym(RTLD_DEFAULT, "mallctl") == NULL)
        cr_assert(eq(i64, st.jemalloc_allocated_bytes, -1));
    else
        cr_assert(gt(i64, st.jemalloc_allocated_bytes, 0));
}

/* --- the default limit ---------------------------------------------------- */

Test(memory, the_default_limit_is_positive_and_not_above_physical_ram) {
    int64_t d = drey_memory_default_limit();
    int64_t ram = physical_ram();
    cr_assert(gt(i64, d, 0));
    cr_assert(le(i64, d, ram), "default %lld, RAM %lld", (long long)d, (long long)ram);
    /* 80% of RAM at most, whatever the cgroup says. */
    cr_assert(le(i64, d, ram / 10 * 8), "default %lld is over 80%% of RAM %lld", (long long)d, (long long)ram);
    cr_assert(eq(i64, drey_memory_default_limit(), d), "the default changed between two calls");
}

Test(memory, a_limit_of_zero_means_the_default) {
    mem = create(0, "n1");
    drey_memory_stats st = stats();
    int64_t d = drey_memory_default_limit();
    cr_assert(eq(i64, st.limit_bytes, d));
    assert_thresholds(&st);
    cr_assert(eq(int, st.state, DREY_LEVEL_NORMAL), "an empty store under the default limit");
    cr_assert(admit(1));
}

/* --- eviction ---------------------------------------------------------------- */

static const char *metadata_of(const drey_status *st, const char *key) {
    for (size_t i = 0; i < st->n_metadata; i++)
        if (strcmp(st->metadata[i].key, key) == 0)
            return st->metadata[i].value;
    return NULL;
}

Test(memory, with_a_policy_a_full_node_admits_with_victims_that_make_room) {
    drey_store_set_policy(store, DREY_EVICT_ALLKEYS_LRU);
    mem = create(100000, "n1");
    char k[16];
    for (int i = 0; drey_store_bytes(store) < 95000 - 1100; i++) {
        snprintf(k, sizeof k, "k%03d", i);
        put_bytes(k, 1000, NEVER);
    }
    int64_t used = drey_store_bytes(store), crit = stats().critical_bytes;
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    drey_status st;
    drey_status_init(&st);
    const drey_store_victim *v;
    size_t n;
    int64_t evb;
    /* room left: no victims */
    cr_assert(drey_memory_admit_evicting(mem, crit - used, 0, NULL, INT64_MAX, &a, &v, &n, &evb, &st));
    cr_assert(eq(sz, n, 0));
    /* 2.5 entries past critical: three victims */
    int64_t one = (int64_t)drey_store_entry_bytes(0, 4, 1000);
    cr_assert(drey_memory_admit_evicting(mem, crit - used + one * 5 / 2, 0, NULL, INT64_MAX, &a, &v, &n, &evb, &st));
    cr_assert(eq(sz, n, 3));
    cr_assert(eq(i64, evb, one * 3), "the victims' bytes");
    /* another copy with less room: enough victims for it too */
    cr_assert(drey_memory_admit_evicting(mem, crit - used + one * 5 / 2, 0, NULL, one / 2, &a, &v, &n, &evb, &st));
    cr_assert(ge(i64, evb, crit - used + one * 2), "evicted for the tighter copy");
    /* this node's room, another's short and nothing more to evict for it:
     * admitted here, for the copy's own check to refuse */
    cr_assert(drey_memory_admit_evicting(mem, crit - used, 0, NULL, -((int64_t)1 << 40), &a, &v, &n, &evb, &st));
    cr_assert(eq(sz, n, 0));
    for (size_t i = 0; i < n; i++) {
        cr_assert(eq(sz, v[i].cache_len, 0));
        cr_assert(eq(sz, v[i].key_len, 4));
        cr_assert(gt(u64, v[i].version, 0));
    }
    cr_assert(eq(i64, drey_store_bytes(store), used), "admission only chooses: nothing was removed");
    cr_assert(eq(u64, stats().evicting_admissions, 2));
    /* more than everything there is: refused, with the policy said */
    cr_assert(not(drey_memory_admit_evicting(mem, 200000, 0, NULL, INT64_MAX, &a, &v, &n, &evb, &st)));
    cr_assert(eq(int, st.error, DREY_ERR_MEMORY_PRESSURE));
    cr_assert(eq(str, (char *)metadata_of(&st, "evictionPolicy"), "allkeys-lru"));
    cr_assert_not_null(metadata_of(&st, "evictableBytes"));
    cr_assert(eq(sz, n, 0));
    drey_arena_destroy(&a);
}

Test(memory, volatile_policies_refuse_when_only_entries_without_expiry_are_left) {
    drey_store_set_policy(store, DREY_EVICT_VOLATILE_TTL);
    mem = create(100000, "n1");
    set_used(95000);
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    drey_status st;
    drey_status_init(&st);
    const drey_store_victim *v;
    size_t n;
    int64_t evb;
    cr_assert(not(drey_memory_admit_evicting(mem, 10, 0, NULL, INT64_MAX, &a, &v, &n, &evb, &st)));
    cr_assert(eq(str, (char *)metadata_of(&st, "evictableBytes"), "0"));
    /* without a policy the refusal is today's, metadata and all */
    drey_store_set_policy(store, DREY_EVICT_NONE);
    drey_status_init(&st);
    cr_assert(not(drey_memory_admit_evicting(mem, 10, 0, NULL, INT64_MAX, &a, &v, &n, &evb, &st)));
    cr_assert_null(metadata_of(&st, "evictionPolicy"));
    drey_arena_destroy(&a);
}
