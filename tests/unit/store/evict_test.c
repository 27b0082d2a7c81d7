/*
 * Unit tests for src/store/evict.c: choosing victims under each policy.
 *
 * drey_store_evict_choose only names victims; the tests remove them with
 * drey_store_txn_evict as the commit module does, and check what stays.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "drey/store.h"

static drey_store *s;
static uint64_t next_version;

static void teardown(void) {
    drey_store_destroy(s);
    s = NULL;
}

static void with_policy(drey_evict_policy p) {
    s = drey_store_create();
    drey_store_set_policy(s, p);
    next_version = 0;
}

TestSuite(evict, .fini = teardown);

static drey_key key_of(const char *cache, const char *k) {
    drey_key out;
    drey_store_key(s, &out, cache, strlen(cache), k, strlen(k));
    return out;
}

static void put(const char *cache, const char *k, int64_t expires) {
    drey_key key = key_of(cache, k);
    static const uint8_t v[100];
    drey_value val = {.kind = DREY_VALUE_BYTES, .data = v, .len = sizeof v};
    drey_store_txn t;
    drey_store_txn_begin(s, &t, &key, 1);
    drey_store_txn_put(&t, &key, &val, expires, ++next_version);
    drey_store_txn_end(&t);
}

static void noop(void *arg, const drey_entry_view *e) {
    (void)arg, (void)e;
}

static bool has(const char *cache, const char *k) {
    drey_key key = key_of(cache, k);
    return drey_store_read(s, &key, 0, noop, NULL);
}

typedef struct victims {
    char cache[8][32], key[8][32];
    uint64_t version[8];
    size_t n;
} victims;

static void collect(void *arg, const drey_store_item *it, size_t bytes) {
    victims *v = arg;
    cr_assert(gt(sz, bytes, 0));
    cr_assert(lt(sz, v->n, 8));
    snprintf(v->cache[v->n], 32, "%.*s", (int)it->cache_len, it->cache);
    snprintf(v->key[v->n], 32, "%.*s", (int)it->key_len, it->key);
    v->version[v->n++] = it->entry.version;
}

/* Chooses and removes one victim; returns false when nothing was chosen. */
static bool evict_one(char *cache, char *key) {
    victims v = {0};
    int64_t got = drey_store_evict_choose(s, 1000, 1, 8, NULL, collect, &v);
    if (got == 0)
        return false;
    cr_assert(eq(sz, v.n, 1));
    drey_key k = key_of(v.cache[0], v.key[0]);
    drey_store_txn t;
    drey_store_txn_begin(s, &t, &k, 1);
    cr_assert(gt(sz, drey_store_txn_evict(&t, &k, v.version[0]), 0));
    drey_store_txn_end(&t);
    if (cache != NULL)
        strcpy(cache, v.cache[0]);
    if (key != NULL)
        strcpy(key, v.key[0]);
    return true;
}

static void wait_ms(int ms) { /* the LRU clock has millisecond steps */
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

Test(evict, names_and_parsing) {
    drey_evict_policy p;
    cr_assert(drey_evict_policy_parse("allkeys-lru", &p) && p == DREY_EVICT_ALLKEYS_LRU);
    cr_assert(drey_evict_policy_parse("volatile-ttl", &p) && p == DREY_EVICT_VOLATILE_TTL);
    cr_assert(not(drey_evict_policy_parse("allkeys-random", &p)));
    cr_assert(eq(str, (char *)drey_evict_policy_name(DREY_EVICT_NONE), "none"));
    s = drey_store_create();
}

Test(evict, none_chooses_nothing) {
    with_policy(DREY_EVICT_NONE);
    put("", "a", 0);
    cr_assert(not(evict_one(NULL, NULL)));
}

/* Sampling is approximate (5 samples feeding a 16-entry pool, as Redis):
 * it need not find the least recently used entry each time, but it must
 * not evict an entry read a moment ago while many idle ones are left. */
Test(evict, lru_keeps_what_was_read_while_idle_entries_are_left) {
    with_policy(DREY_EVICT_ALLKEYS_LRU);
    char k[32];
    for (int i = 0; i < 100; i++) {
        snprintf(k, sizeof k, "k%03d", i);
        put("", k, 0);
    }
    wait_ms(5);
    for (int i = 0; i < 20; i++) {
        snprintf(k, sizeof k, "k%03d", i);
        cr_assert(has("", k));
    }
    for (int i = 0; i < 30; i++) {
        char key[32];
        cr_assert(evict_one(NULL, key));
        cr_assert(ge(int, strcmp(key, "k020"), 0), "%s was read just now, and evicted", key);
    }
}

Test(evict, lfu_keeps_what_is_read_often_while_others_are_left) {
    with_policy(DREY_EVICT_ALLKEYS_LFU);
    char k[32];
    for (int i = 0; i < 100; i++) {
        snprintf(k, sizeof k, "k%03d", i);
        put("", k, 0);
    }
    for (int r = 0; r < 200; r++)
        for (int i = 0; i < 20; i++) {
            snprintf(k, sizeof k, "k%03d", i);
            has("", k);
        }
    for (int i = 0; i < 30; i++) {
        char key[32];
        cr_assert(evict_one(NULL, key));
        cr_assert(ge(int, strcmp(key, "k020"), 0), "%s is read often, and evicted", key);
    }
}

Test(evict, volatile_policies_never_choose_entries_without_expiry) {
    with_policy(DREY_EVICT_VOLATILE_LRU);
    put("", "persistent", 0);
    put("", "t1", 1000000);
    put("", "t2", 1000000);
    char key[32];
    cr_assert(evict_one(NULL, key));
    cr_assert(eq(int, key[0], 't'));
    cr_assert(evict_one(NULL, key));
    cr_assert(eq(int, key[0], 't'));
    cr_assert(not(evict_one(NULL, key)), "nothing with an expiry is left");
    cr_assert(has("", "persistent"));
}

Test(evict, volatile_ttl_keeps_the_latest_to_expire_while_sooner_ones_are_left) {
    with_policy(DREY_EVICT_VOLATILE_TTL);
    char k[32];
    for (int i = 0; i < 100; i++) {
        snprintf(k, sizeof k, "k%03d", i);
        put("", k, i < 20 ? 9000000 + i : 100000 + (int64_t)i * 1000);
    }
    for (int i = 0; i < 30; i++) {
        char key[32];
        cr_assert(evict_one(NULL, key));
        cr_assert(ge(int, strcmp(key, "k020"), 0), "%s expires last, and was evicted", key);
    }
}

Test(evict, expired_entries_go_first_and_internal_caches_never) {
    with_policy(DREY_EVICT_ALLKEYS_LRU);
    put("#outcomes", "o1", 0);
    put("#outcomes", "o2", 0);
    put("", "fresh", 0);
    put("", "expired", 500); /* choose runs at 1000 */
    char cache[32], key[32];
    cr_assert(evict_one(cache, key));
    cr_assert(eq(str, key, "expired"));
    cr_assert(evict_one(cache, key));
    cr_assert(eq(str, key, "fresh"));
    cr_assert(not(evict_one(cache, key)), "an internal entry was chosen");
}

Test(evict, a_victim_rewritten_since_is_not_removed) {
    with_policy(DREY_EVICT_ALLKEYS_LRU);
    put("", "a", 0);
    victims v = {0};
    cr_assert(gt(i64, drey_store_evict_choose(s, 1000, 1, 8, NULL, collect, &v), 0));
    put("", "a", 0); /* a new version */
    drey_key k = key_of("", "a");
    drey_store_txn t;
    drey_store_txn_begin(s, &t, &k, 1);
    cr_assert(eq(sz, drey_store_txn_evict(&t, &k, v.version[0]), 0));
    drey_store_txn_end(&t);
    cr_assert(has("", "a"));
    drey_store_stats st;
    drey_store_get_stats(s, &st);
    cr_assert(eq(u64, st.evictions, 0));
}

static bool only_cache_b(void *ctx, const char *cache, size_t cache_len, const char *key, size_t key_len) {
    (void)ctx;
    (void)key;
    (void)key_len;
    return cache_len == 1 && cache[0] == 'b';
}

/* A cluster's write evicts only entries of its own partition (every copy
 * of the partition then evicts the same ones): the filter is obeyed even
 * when better candidates elsewhere were pooled by an earlier choice. */
Test(evict, a_filter_limits_the_victims) {
    with_policy(DREY_EVICT_ALLKEYS_LRU);
    char k[32];
    for (int i = 0; i < 20; i++) {
        snprintf(k, sizeof k, "a%03d", i);
        put("a", k, 0);
    }
    for (int i = 0; i < 5; i++) {
        snprintf(k, sizeof k, "b%03d", i);
        put("b", k, 0);
    }
    /* an unfiltered choice leaves sampled candidates of both caches pooled */
    victims warm = {0};
    cr_assert(gt(i64, drey_store_evict_choose(s, 1000, 1, 1, NULL, collect, &warm), 0));
    drey_store_filter only = {.keep = only_cache_b};
    victims v = {0};
    size_t one = drey_store_entry_bytes(1, 4, 100);
    cr_assert(eq(i64, drey_store_evict_choose(s, 1000, (int64_t)one * 3, 8, &only, collect, &v), (int64_t)one * 3));
    for (size_t i = 0; i < v.n; i++)
        cr_assert(eq(str, v.cache[i], "b"), "a victim outside the filter: %s/%s", v.cache[i], v.key[i]);
    /* more than the filter allows: what there is */
    victims w = {0};
    cr_assert(eq(i64, drey_store_evict_choose(s, 1000, (int64_t)one * 100, 8, &only, collect, &w), (int64_t)one * 5));
}

Test(evict, choose_stops_at_need_or_max_victims_and_counts_per_cache) {
    with_policy(DREY_EVICT_ALLKEYS_LRU);
    char k[32];
    for (int i = 0; i < 20; i++) {
        snprintf(k, sizeof k, "k%03d", i);
        put("c", k, 0);
    }
    size_t one = drey_store_entry_bytes(1, 4, 100);
    victims v = {0};
    cr_assert(eq(i64, drey_store_evict_choose(s, 1000, (int64_t)one * 2 + 1, 8, NULL, collect, &v), (int64_t)one * 3));
    cr_assert(eq(sz, v.n, 3));
    victims w = {0};
    cr_assert(eq(i64, drey_store_evict_choose(s, 1000, (int64_t)one * 100, 2, NULL, collect, &w), (int64_t)one * 2));
    for (size_t i = 0; i < v.n; i++) {
        drey_key key = key_of("c", v.key[i]);
        drey_store_txn t;
        drey_store_txn_begin(s, &t, &key, 1);
        drey_store_txn_evict(&t, &key, v.version[i]);
        drey_store_txn_end(&t);
    }
    drey_cache_stats cs;
    drey_store_cache_stats(s, "c", 1, &cs);
    cr_assert(eq(u64, cs.evictions, 3));
    cr_assert(eq(u64, cs.evicted_bytes, one * 3));
    cr_assert(eq(u64, cs.entries, 17));
}
