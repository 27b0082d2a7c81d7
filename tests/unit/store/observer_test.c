/*
 * Unit tests for the store's change observer (drey_store_set_observer):
 * every change to a client cache's entries is reported once, with its
 * version, while the key's shard is locked; internal caches, loads, table
 * clears, expiry changes and the sweep of a cleared cache's entries are not.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "drey/store.h"

#define NEVER 0

static drey_store *s;

typedef struct change {
    drey_store_change_kind kind;
    char cache[64], key[64], value[64];
    uint64_t version;
    int64_t expires_at_ms;
} change;

static change seen[64];
static size_t n_seen;

static void record(void *ctx, const drey_store_change *c) {
    (void)ctx;
    cr_assert_lt(n_seen, 64);
    change *x = &seen[n_seen++];
    memset(x, 0, sizeof *x);
    x->kind = c->kind;
    snprintf(x->cache, sizeof x->cache, "%.*s", (int)c->cache_len, c->cache);
    if (c->key != NULL)
        snprintf(x->key, sizeof x->key, "%.*s", (int)c->key_len, c->key);
    if (c->kind == DREY_STORE_CHANGE_SET)
        snprintf(x->value, sizeof x->value, "%.*s", (int)c->value.len, (const char *)c->value.data);
    x->version = c->version;
    x->expires_at_ms = c->expires_at_ms;
}

static const drey_store_observer observer = {.fn = record};

static void setup(void) {
    s = drey_store_create();
    n_seen = 0;
    drey_store_set_observer(s, &observer);
}

static void teardown(void) {
    drey_store_destroy(s);
}

TestSuite(observer, .init = setup, .fini = teardown);

static drey_key key_in(const char *cache, const char *k) {
    drey_key out;
    drey_store_key(s, &out, cache, strlen(cache), k, strlen(k));
    return out;
}

static void put(const char *cache, const char *k, const char *v, int64_t expires, uint64_t version) {
    drey_key key = key_in(cache, k);
    drey_value val = {.kind = DREY_VALUE_STRING, .data = (const uint8_t *)v, .len = (uint32_t)strlen(v)};
    drey_store_txn t;
    drey_store_txn_begin(s, &t, &key, 1);
    drey_store_txn_put(&t, &key, &val, expires, version);
    drey_store_txn_end(&t);
}

static bool get(const char *cache, const char *k, int64_t now) {
    drey_key key = key_in(cache, k);
    drey_store_txn t;
    drey_entry_view e;
    drey_store_txn_begin(s, &t, &key, 1);
    bool live = drey_store_txn_get(&t, &key, now, &e);
    drey_store_txn_end(&t);
    return live;
}

static void expect(size_t i, drey_store_change_kind kind, const char *cache, const char *key, uint64_t version) {
    cr_assert_lt(i, n_seen, "change %zu was not reported (%zu were)", i, n_seen);
    cr_assert_eq(seen[i].kind, kind, "change %zu: kind %d", i, seen[i].kind);
    cr_assert_str_eq(seen[i].cache, cache);
    cr_assert_str_eq(seen[i].key, key);
    cr_assert_eq(seen[i].version, version, "change %zu: version %llu", i, (unsigned long long)seen[i].version);
}

Test(observer, sets_and_removes_with_their_versions) {
    put("c", "k", "one", NEVER, 1);
    put("c", "k", "two", 5000, 2); /* a replacement */
    drey_key k = key_in("c", "k");
    drey_store_txn t;
    drey_store_txn_begin(s, &t, &k, 1);
    cr_assert(drey_store_txn_remove(&t, &k));
    cr_assert_not(drey_store_txn_remove(&t, &k)); /* nothing there: nothing reported */
    drey_store_txn_end(&t);
    cr_assert_eq(n_seen, 3);
    expect(0, DREY_STORE_CHANGE_SET, "c", "k", 1);
    cr_assert_str_eq(seen[0].value, "one");
    expect(1, DREY_STORE_CHANGE_SET, "c", "k", 2);
    cr_assert_str_eq(seen[1].value, "two");
    cr_assert_eq(seen[1].expires_at_ms, 5000);
    expect(2, DREY_STORE_CHANGE_REMOVE, "c", "k", 2);
}

Test(observer, default_is_reported_as_the_empty_cache) {
    put("default", "k", "v", NEVER, 7);
    expect(0, DREY_STORE_CHANGE_SET, "", "k", 7);
}

Test(observer, expiry_found_by_a_write_and_by_the_sweep) {
    put("c", "a", "v", 100, 1);
    put("c", "b", "v", 100, 2);
    put("c", "live", "v", NEVER, 3);
    cr_assert_not(get("c", "a", 200)); /* a write's lookup frees it */
    size_t freed = 0;
    for (int i = 0; i < DREY_STORE_SHARDS; i++)
        drey_store_sweep(s, 200, 1 << 20, &freed);
    cr_assert_eq(freed, 1);
    cr_assert_eq(n_seen, 5);
    expect(3, DREY_STORE_CHANGE_EXPIRE, "c", "a", 1);
    expect(4, DREY_STORE_CHANGE_EXPIRE, "c", "b", 2);
}

Test(observer, eviction_reports_only_what_it_removed) {
    put("c", "k", "v", NEVER, 4);
    drey_key k = key_in("c", "k");
    drey_store_txn t;
    drey_store_txn_begin(s, &t, &k, 1);
    cr_assert_eq(drey_store_txn_evict(&t, &k, 3), 0); /* replaced since it was chosen */
    cr_assert_gt(drey_store_txn_evict(&t, &k, 4), 0);
    drey_store_txn_end(&t);
    cr_assert_eq(n_seen, 2);
    expect(1, DREY_STORE_CHANGE_EVICT, "c", "k", 4);
}

Test(observer, a_clear_is_one_change_and_its_sweep_none) {
    put("c", "a", "v", NEVER, 1);
    put("c", "b", "v", NEVER, 2);
    put("other", "a", "v", NEVER, 3);
    drey_store_clear_cache(s, "c", 1);
    size_t freed = 0;
    for (int i = 0; i < DREY_STORE_SHARDS; i++)
        drey_store_sweep(s, 0, 1 << 20, &freed);
    cr_assert_eq(freed, 2);
    cr_assert_not(get("c", "a", 0)); /* gone, and not reported again */
    cr_assert_eq(n_seen, 4);
    cr_assert_eq(seen[3].kind, DREY_STORE_CHANGE_CLEAR);
    cr_assert_str_eq(seen[3].cache, "c");
    cr_assert_str_eq(seen[3].key, "");
}

Test(observer, internal_caches_loads_table_clears_and_expiry_changes_are_not_reported) {
    put("#outcomes", "k", "v", NEVER, 0);
    drey_store_clear_cache(s, "#outcomes", 9);
    drey_store_item it = {.cache = "c", .cache_len = 1, .key = "loaded", .key_len = 6,
                          .entry = {.value = {.kind = DREY_VALUE_NULL}, .version = 9}};
    drey_store_load(s, &it);
    drey_key k = key_in("c", "loaded");
    drey_store_txn t;
    drey_store_txn_begin(s, &t, &k, 1);
    cr_assert(drey_store_txn_set_expiry(&t, &k, 5000));
    drey_store_txn_end(&t);
    drey_store_clear(s);
    cr_assert_eq(n_seen, 0, "%zu changes reported", n_seen);
}

Test(observer, none_once_removed) {
    drey_store_set_observer(s, NULL);
    put("c", "k", "v", NEVER, 1);
    drey_store_clear_cache(s, "c", 1);
    cr_assert_eq(n_seen, 0);
}
