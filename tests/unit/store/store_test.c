/*
 * Unit tests for src/store/store.c: the sharded table.
 *
 * Every test gets a fresh store. Values are compared byte for byte, and the
 * byte accounting is checked against drey_store_entry_bytes() summed over
 * the entries the test knows to be there.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/store.h"

#define MIN_BUCKETS 16 /* SHARD_MIN_BUCKETS in store.c */
#define NEVER 0

static drey_store *s;

static void setup(void) {
    s = drey_store_create();
    cr_assert_not_null(s);
}

static void teardown(void) {
    drey_store_destroy(s);
    s = NULL;
}

TestSuite(store, .init = setup, .fini = teardown);

/* --- helpers -------------------------------------------------------------- */

static drey_key key_in(const char *cache, const char *k) {
    drey_key out;
    drey_store_key(s, &out, cache, strlen(cache), k, strlen(k));
    return out;
}

static drey_value str_value(const char *v) {
    return (drey_value){.kind = DREY_VALUE_STRING, .data = (const uint8_t *)v, .len = (uint32_t)strlen(v)};
}

static void put_kv(const drey_key *k, const drey_value *v, int64_t expires, uint64_t version) {
    drey_store_txn t;
    drey_store_txn_begin(s, &t, k, 1);
    drey_store_txn_put(&t, k, v, expires, version);
    drey_store_txn_end(&t);
}

static void put(const char *cache, const char *k, const char *v, int64_t expires, uint64_t version) {
    drey_key key = key_in(cache, k);
    drey_value val = str_value(v);
    put_kv(&key, &val, expires, version);
}

static bool remove_key(const drey_key *k) {
    drey_store_txn t;
    drey_store_txn_begin(s, &t, k, 1);
    bool removed = drey_store_txn_remove(&t, k);
    drey_store_txn_end(&t);
    return removed;
}

/* What drey_store_read showed, copied out of the callback. */
typedef struct seen {
    int calls;
    drey_value_kind kind;
    uint8_t data[256];
    uint32_t len;
    uint64_t version;
    int64_t expires_at_ms;
} seen;

static void copy_view(void *arg, const drey_entry_view *e) {
    seen *r = arg;
    r->calls++;
    r->kind = e->value.kind;
    r->len = e->value.len;
    memcpy(r->data, e->value.data, e->value.len < sizeof r->data ? e->value.len : sizeof r->data);
    r->version = e->version;
    r->expires_at_ms = e->expires_at_ms;
}

static bool read_at(const drey_key *k, int64_t now, seen *r) {
    memset(r, 0, sizeof *r);
    bool found = drey_store_read(s, k, now, copy_view, r);
    cr_assert(eq(int, r->calls, found ? 1 : 0), "the callback runs once exactly when found");
    return found;
}

/* Reads cache/k at `now` and checks it holds string v. */
static void assert_string(const char *cache, const char *k, int64_t now, const char *v) {
    drey_key key = key_in(cache, k);
    seen r;
    cr_assert(read_at(&key, now, &r), "%s/%s is missing", cache, k);
    cr_assert(eq(int, r.kind, DREY_VALUE_STRING));
    cr_assert(eq(u32, r.len, (uint32_t)strlen(v)));
    cr_assert(eq(int, memcmp(r.data, v, r.len), 0), "%s/%s holds %.*s", cache, k, (int)r.len, r.data);
}

static void assert_missing(const char *cache, const char *k, int64_t now) {
    drey_key key = key_in(cache, k);
    seen r;
    cr_assert(not(read_at(&key, now, &r)), "%s/%s is visible", cache, k);
}

static drey_store_stats stats(void) {
    drey_store_stats st;
    drey_store_get_stats(s, &st);
    return st;
}

static size_t entry_bytes(const char *cache, const char *k, size_t value_len) {
    size_t clen = strcmp(cache, "default") == 0 ? 0 : strlen(cache);
    return drey_store_entry_bytes(clen, strlen(k), value_len);
}

/* --- basic operations ----------------------------------------------------- */

Test(store, a_new_store_is_empty) {
    drey_store_stats st = stats();
    cr_assert(eq(u64, st.entries, 0));
    cr_assert(eq(u64, st.bytes, 0));
    cr_assert(eq(u64, st.buckets, DREY_STORE_SHARDS * MIN_BUCKETS));
    cr_assert(eq(u64, st.expired_swept, 0));
    cr_assert(eq(u64, drey_store_last_version(s), 0));
    assert_missing("", "nothing", 0);
}

Test(store, put_then_read) {
    put("", "user:1", "alice", 5000, 7);
    drey_key k = key_in("", "user:1");
    seen r;
    cr_assert(read_at(&k, 1000, &r));
    cr_assert(eq(int, r.kind, DREY_VALUE_STRING));
    cr_assert(eq(u32, r.len, 5));
    cr_assert(eq(int, memcmp(r.data, "alice", 5), 0));
    cr_assert(eq(u64, r.version, 7));
    cr_assert(eq(i64, r.expires_at_ms, 5000));
}

/* Values are bytes: NULs inside and every kind survive, and an empty value
 * has no data. */
Test(store, values_are_kept_byte_for_byte) {
    static const uint8_t bin[] = {0, 1, 0, 255, 0};
    drey_key k1 = key_in("", "bin"), k2 = key_in("", "null"), k3 = key_in("", "i64");
    drey_value v1 = {.kind = DREY_VALUE_BYTES, .data = bin, .len = sizeof bin};
    drey_value v2 = {.kind = DREY_VALUE_NULL, .data = NULL, .len = 0};
    uint8_t le[8] = {0x2a, 0, 0, 0, 0, 0, 0, 0x80};
    drey_value v3 = {.kind = DREY_VALUE_INT64, .data = le, .len = 8};
    put_kv(&k1, &v1, NEVER, 1);
    put_kv(&k2, &v2, NEVER, 2);
    put_kv(&k3, &v3, NEVER, 3);
    seen r;
    cr_assert(read_at(&k1, 0, &r));
    cr_assert(eq(int, r.kind, DREY_VALUE_BYTES));
    cr_assert(eq(u32, r.len, sizeof bin));
    cr_assert(eq(int, memcmp(r.data, bin, sizeof bin), 0));
    cr_assert(read_at(&k2, 0, &r));
    cr_assert(eq(int, r.kind, DREY_VALUE_NULL));
    cr_assert(eq(u32, r.len, 0));
    cr_assert(read_at(&k3, 0, &r));
    cr_assert(eq(int, r.kind, DREY_VALUE_INT64));
    cr_assert(eq(int, memcmp(r.data, le, 8), 0));
}

Test(store, replace_changes_value_version_and_expiry) {
    put("", "k", "short", 100, 1);
    put("", "k", "a much longer value", NEVER, 2);
    drey_key k = key_in("", "k");
    seen r;
    cr_assert(read_at(&k, 200, &r), "the new entry never expires");
    cr_assert(eq(u64, r.version, 2));
    cr_assert(eq(i64, r.expires_at_ms, 0));
    assert_string("", "k", 200, "a much longer value");
    drey_store_stats st = stats();
    cr_assert(eq(u64, st.entries, 1));
    cr_assert(eq(u64, st.bytes, entry_bytes("", "k", strlen("a much longer value"))));
}

Test(store, remove) {
    put("", "k", "v", NEVER, 1);
    drey_key k = key_in("", "k");
    cr_assert(remove_key(&k));
    assert_missing("", "k", 0);
    cr_assert(not(remove_key(&k)), "a second remove finds nothing");
    cr_assert(eq(u64, stats().entries, 0));
    cr_assert(eq(u64, stats().bytes, 0));
}

/* txn_put documents that the new value may point into the entry it
 * replaces (an Update that keeps part of the old value); ASan checks the
 * copy happens before the free. */
Test(store, put_may_reuse_the_value_it_replaces) {
    put("", "k", "0123456789", NEVER, 1);
    drey_key k = key_in("", "k");
    drey_store_txn t;
    drey_store_txn_begin(s, &t, &k, 1);
    drey_entry_view v;
    cr_assert(drey_store_txn_get(&t, &k, 0, &v));
    drey_value tail = {.kind = DREY_VALUE_BYTES, .data = v.value.data + 4, .len = 6};
    drey_store_txn_put(&t, &k, &tail, NEVER, 2);
    cr_assert(drey_store_txn_get(&t, &k, 0, &v));
    cr_assert(eq(u32, v.value.len, 6));
    cr_assert(eq(int, memcmp(v.value.data, "456789", 6), 0));
    cr_assert(eq(int, v.value.kind, DREY_VALUE_BYTES));
    drey_store_txn_end(&t);
}

/* Limits of the entry layout: a 255-byte cache name and a 65535-byte key. */
Test(store, longest_cache_name_and_key) {
    char cache[256], *k = malloc(65536);
    memset(cache, 'c', 255);
    cache[255] = '\0';
    memset(k, 'k', 65535);
    k[65535] = '\0';
    put(cache, k, "v", NEVER, 1);
    assert_string(cache, k, 0, "v");
    k[65534] = 'j';
    assert_missing(cache, k, 0);
    cr_assert(eq(u64, stats().bytes, drey_store_entry_bytes(255, 65535, 1)));
    free(k);
}

Test(store, a_cache_name_over_255_bytes_aborts, .signal = SIGABRT) {
    char cache[257];
    memset(cache, 'c', 256);
    cache[256] = '\0';
    key_in(cache, "k");
}

Test(store, a_key_over_65535_bytes_aborts, .signal = SIGABRT) {
    static char k[65537];
    memset(k, 'k', 65536);
    key_in("", k);
}

/* --- cache namespaces ----------------------------------------------------- */

Test(store, caches_are_isolated) {
    put("a", "k", "in a", NEVER, 1);
    put("b", "k", "in b", NEVER, 2);
    put("", "k", "in default", NEVER, 3);
    assert_string("a", "k", 0, "in a");
    assert_string("b", "k", 0, "in b");
    assert_string("", "k", 0, "in default");
    assert_missing("c", "k", 0);
    drey_key kb = key_in("b", "k");
    cr_assert(remove_key(&kb));
    assert_string("a", "k", 0, "in a");
    assert_missing("b", "k", 0);
}

Test(store, default_is_the_empty_cache) {
    drey_key d = key_in("default", "k"), e = key_in("", "k");
    cr_assert(eq(sz, d.cache_len, 0));
    cr_assert(eq(str, (char *)d.cache, ""));
    cr_assert(eq(u64, d.hash, e.hash));
    put("default", "k", "v1", NEVER, 1);
    assert_string("", "k", 0, "v1");
    put("", "k", "v2", NEVER, 2);
    assert_string("default", "k", 0, "v2");
    cr_assert(eq(u64, stats().entries, 1));
    assert_missing("Default", "k", 0);
    assert_missing("default ", "k", 0);
}

/* The cache name is length-prefixed: ("ab","c") and ("a","bc") are two
 * entries, and a cache name never leaks into the key. */
Test(store, cache_and_key_do_not_run_together) {
    put("ab", "c", "1", NEVER, 1);
    put("a", "bc", "2", NEVER, 2);
    put("", "abc", "3", NEVER, 3);
    assert_string("ab", "c", 0, "1");
    assert_string("a", "bc", 0, "2");
    assert_string("", "abc", 0, "3");
    cr_assert(eq(u64, stats().entries, 3));
    cr_assert(ne(u64, key_in("ab", "c").hash, key_in("a", "bc").hash));
}

/* Two stores have different seeds: the same key hashes differently. */
Test(store, the_hash_seed_is_random_per_store) {
    drey_store *other = drey_store_create();
    drey_key a, b;
    drey_store_key(s, &a, "", 0, "k", 1);
    drey_store_key(other, &b, "", 0, "k", 1);
    cr_assert(ne(u64, a.hash, b.hash));
    drey_store_destroy(other);
}

/* --- expiry --------------------------------------------------------------- */

/* An entry is live while now < expires_at; at expires_at it is gone. */
Test(store, expiry_boundary) {
    put("", "k", "v", 1000, 1);
    assert_string("", "k", 999, "v");
    assert_missing("", "k", 1000);
    assert_missing("", "k", 1001);
    assert_string("", "k", 0, "v"); /* reads do not free: it is still there for an earlier clock */
    put("", "forever", "v", NEVER, 2);
    assert_string("", "forever", INT64_MAX, "v");
}

/* txn_get treats an expired entry as absent and frees it on the spot. */
Test(store, txn_get_frees_expired_entries) {
    put("", "old", "v", 1000, 1);
    put("", "live", "v", 5000, 2);
    drey_key old = key_in("", "old"), live = key_in("", "live");
    drey_key both[] = {old, live};
    drey_store_txn t;
    drey_entry_view v;

    drey_store_txn_begin(s, &t, both, 2);
    cr_assert(drey_store_txn_get(&t, &old, 999, &v), "still live at 999");
    cr_assert(eq(u64, stats().entries, 2));
    drey_store_txn_end(&t);

    drey_store_txn_begin(s, &t, both, 2);
    cr_assert(not(drey_store_txn_get(&t, &old, 1000, &v)));
    cr_assert(drey_store_txn_get(&t, &live, 1000, &v));
    drey_store_txn_end(&t);

    drey_store_stats st = stats();
    cr_assert(eq(u64, st.entries, 1), "the expired entry was freed");
    cr_assert(eq(u64, st.bytes, entry_bytes("", "live", 1)));
    assert_missing("", "old", 0);
}

Test(store, set_expiry) {
    put("", "k", "v", NEVER, 4);
    drey_key k = key_in("", "k"), missing = key_in("", "missing");
    drey_key both[] = {k, missing};
    drey_store_txn t;
    drey_store_txn_begin(s, &t, both, 2);
    cr_assert(drey_store_txn_set_expiry(&t, &k, 3000));
    cr_assert(not(drey_store_txn_set_expiry(&t, &missing, 3000)));
    drey_store_txn_end(&t);
    seen r;
    cr_assert(read_at(&k, 2999, &r));
    cr_assert(eq(i64, r.expires_at_ms, 3000));
    cr_assert(eq(u64, r.version, 4), "the version is the entry's, not the expiry's");
    assert_missing("", "k", 3000);
    assert_missing("", "missing", 0);

    drey_store_txn_begin(s, &t, &k, 1);
    cr_assert(drey_store_txn_set_expiry(&t, &k, NEVER));
    drey_store_txn_end(&t);
    assert_string("", "k", INT64_MAX, "v");
    cr_assert(eq(u64, stats().entries, 1));
}

/* The documented way to touch: txn_get first (which drops an expired
 * entry), then set_expiry, which then finds nothing to revive. */
Test(store, set_expiry_after_get_cannot_revive_an_expired_entry) {
    put("", "k", "v", 1000, 1);
    drey_key k = key_in("", "k");
    drey_store_txn t;
    drey_entry_view v;
    drey_store_txn_begin(s, &t, &k, 1);
    cr_assert(not(drey_store_txn_get(&t, &k, 1000, &v)));
    cr_assert(not(drey_store_txn_set_expiry(&t, &k, 9000)));
    drey_store_txn_end(&t);
    assert_missing("", "k", 2000);
}

/* --- transactions --------------------------------------------------------- */

/* n keys whose shards are all different (if distinct) or all the same. */
static size_t keys_by_shard(drey_key *out, char (*names)[16], size_t n, bool distinct) {
    bool used[DREY_STORE_SHARDS] = {false};
    size_t got = 0;
    int want_shard = -1;
    for (int i = 0; got < n && i < 1000000; i++) {
        snprintf(names[got], 16, "k%d", i);
        drey_key k = key_in("", names[got]);
        size_t shard = (size_t)(k.hash >> 56);
        if (distinct ? used[shard] : (want_shard >= 0 && (size_t)want_shard != shard))
            continue;
        used[shard] = true;
        want_shard = (int)shard;
        out[got++] = k;
    }
    cr_assert(eq(sz, got, n));
    return got;
}

static size_t bits_set(const drey_store_txn *t) {
    size_t n = 0;
    for (size_t w = 0; w < DREY_STORE_SHARDS / 64; w++)
        n += (size_t)__builtin_popcountll(t->locked[w]);
    return n;
}

/* A batch spanning many shards is applied under one transaction holding
 * exactly those shards. */
Test(store, multi_key_txn_across_shards) {
    drey_key keys[40];
    char names[40][16];
    keys_by_shard(keys, names, 40, true);
    drey_store_txn t;
    drey_store_txn_begin(s, &t, keys, 40);
    cr_assert(eq(sz, bits_set(&t), 40), "one lock per shard");
    for (size_t i = 0; i < 40; i++) {
        size_t shard = (size_t)(keys[i].hash >> 56);
        bool locked = (t.locked[shard / 64] >> (shard % 64)) & 1;
        cr_assert(locked, "shard %zu is not locked", shard);
        drey_value v = str_value(names[i]);
        drey_store_txn_put(&t, &keys[i], &v, NEVER, i + 1);
    }
    for (size_t i = 0; i < 40; i++) {
        drey_entry_view v;
        cr_assert(drey_store_txn_get(&t, &keys[i], 0, &v), "reads inside the txn see its writes");
        cr_assert(eq(u64, v.version, i + 1));
    }
    drey_store_txn_end(&t);
    cr_assert(eq(sz, bits_set(&t), 0));
    for (size_t i = 0; i < 40; i++)
        assert_string("", names[i], 0, names[i]);
    cr_assert(eq(u64, stats().entries, 40));
}

/* Keys sharing a shard (and the same key twice) take its lock once. */
Test(store, keys_in_one_shard_lock_it_once) {
    drey_key keys[6];
    char names[6][16];
    keys_by_shard(keys, names, 5, false);
    keys[5] = keys[0];
    drey_store_txn t;
    drey_store_txn_begin(s, &t, keys, 6);
    cr_assert(eq(sz, bits_set(&t), 1));
    for (size_t i = 0; i < 6; i++) {
        drey_value v = str_value("x");
        drey_store_txn_put(&t, &keys[i], &v, NEVER, i + 1);
    }
    drey_store_txn_end(&t);
    cr_assert(eq(u64, stats().entries, 5));
    drey_key k0 = keys[0];
    seen r;
    cr_assert(read_at(&k0, 0, &r));
    cr_assert(eq(u64, r.version, 6), "the later put of the same key wins");
}

/* Touching a key whose shard the transaction does not hold is a caller bug
 * and aborts rather than corrupting the table. */
Test(store, a_key_outside_the_txn_aborts, .signal = SIGABRT) {
    drey_key keys[2];
    char names[2][16];
    keys_by_shard(keys, names, 2, true);
    drey_store_txn t;
    drey_store_txn_begin(s, &t, keys, 1);
    drey_value v = str_value("x");
    drey_store_txn_put(&t, &keys[1], &v, NEVER, 1);
}

Test(store, an_empty_txn_locks_nothing) {
    drey_store_txn t;
    drey_store_txn_begin(s, &t, NULL, 0);
    cr_assert(eq(sz, bits_set(&t), 0));
    drey_store_txn_end(&t);
}

/* --- growth, shrink and byte accounting ----------------------------------- */

#define MANY 100000

static void many_key(char *buf, size_t i) {
    snprintf(buf, 24, "key-%zu", i);
}

/* 100k keys: each shard doubles its buckets several times (about 390 keys
 * per shard: 16 -> 512), every key stays readable, the load factor stays at
 * most 1; removing them all shrinks every shard back to the minimum and the
 * byte count back to 0. */
Test(store, growth_and_shrink, .timeout = 120) {
    char name[24];
    uint64_t bytes = 0;
    for (size_t i = 0; i < MANY; i++) {
        many_key(name, i);
        char value[24];
        snprintf(value, sizeof value, "v%zu", i * 7);
        put(i % 3 == 0 ? "c1" : "", name, value, NEVER, i + 1);
        bytes += entry_bytes(i % 3 == 0 ? "c1" : "", name, strlen(value));
    }
    drey_store_stats st = stats();
    cr_assert(eq(u64, st.entries, MANY));
    cr_assert(eq(u64, st.bytes, bytes));
    cr_assert(ge(u64, st.buckets, MANY), "load factor at most 1");
    cr_assert(ge(u64, st.buckets, DREY_STORE_SHARDS * MIN_BUCKETS * 16), "shards grew past several resizes");
    cr_assert(le(u64, st.buckets, 4 * MANY), "no runaway growth");

    for (size_t i = 0; i < MANY; i += 97) {
        many_key(name, i);
        char value[24];
        snprintf(value, sizeof value, "v%zu", i * 7);
        assert_string(i % 3 == 0 ? "c1" : "", name, 0, value);
    }

    /* Remove 90%: the table shrinks with it (at most 8 buckets per entry
     * per shard, plus the minimum). */
    for (size_t i = 0; i < MANY; i++) {
        if (i % 10 == 0)
            continue;
        many_key(name, i);
        drey_key k = key_in(i % 3 == 0 ? "c1" : "", name);
        cr_assert(remove_key(&k), "%s", name);
    }
    st = stats();
    cr_assert(eq(u64, st.entries, MANY / 10));
    cr_assert(le(u64, st.buckets, DREY_STORE_SHARDS * MIN_BUCKETS + 8 * (st.entries + DREY_STORE_SHARDS)),
              "%llu buckets for %llu entries", (unsigned long long)st.buckets, (unsigned long long)st.entries);
    for (size_t i = 0; i < MANY; i += 10) {
        many_key(name, i);
        char value[24];
        snprintf(value, sizeof value, "v%zu", i * 7);
        assert_string(i % 3 == 0 ? "c1" : "", name, 0, value);
    }

    for (size_t i = 0; i < MANY; i += 10) {
        many_key(name, i);
        drey_key k = key_in(i % 3 == 0 ? "c1" : "", name);
        cr_assert(remove_key(&k));
    }
    st = stats();
    cr_assert(eq(u64, st.entries, 0));
    cr_assert(eq(u64, st.bytes, 0));
    cr_assert(eq(u64, st.buckets, DREY_STORE_SHARDS * MIN_BUCKETS));
}

/* bytes is exactly the sum of drey_store_entry_bytes over the entries, through
 * inserts, replaces that change sizes, removes, and expired entries freed by
 * txn_get; it returns to 0 when everything is gone. */
Test(store, byte_accounting_is_exact) {
    cr_assert(eq(sz, drey_store_entry_bytes(3, 5, 7) - drey_store_entry_bytes(0, 0, 0), 15));
    cr_assert(gt(sz, drey_store_entry_bytes(0, 0, 0), sizeof(void *)), "the header and bucket share count");

    static const char *const caches[] = {"", "a", "cache-two", "default"};
    char name[24], value[200];
    size_t vlen[400] = {0};
    uint64_t total = 0;
    for (size_t i = 0; i < 400; i++) {
        many_key(name, i);
        vlen[i] = (i * 37) % 190;
        memset(value, 'x', vlen[i]);
        value[vlen[i]] = '\0';
        put(caches[i % 4], name, value, i % 5 == 0 ? 100 : NEVER, 1);
        total += entry_bytes(caches[i % 4], name, vlen[i]);
    }
    cr_assert(eq(u64, stats().bytes, total));
    cr_assert(eq(u64, stats().entries, 400));

    /* Replace with other sizes. */
    for (size_t i = 0; i < 400; i += 3) {
        many_key(name, i);
        total -= entry_bytes(caches[i % 4], name, vlen[i]);
        vlen[i] = (vlen[i] + 101) % 199;
        memset(value, 'y', vlen[i]);
        value[vlen[i]] = '\0';
        put(caches[i % 4], name, value, i % 5 == 0 ? 100 : NEVER, 2);
        total += entry_bytes(caches[i % 4], name, vlen[i]);
    }
    cr_assert(eq(u64, stats().bytes, total));
    cr_assert(eq(u64, stats().entries, 400));

    /* Expired ones freed by txn_get. */
    for (size_t i = 0; i < 400; i += 5) {
        many_key(name, i);
        drey_key k = key_in(caches[i % 4], name);
        drey_store_txn t;
        drey_entry_view v;
        drey_store_txn_begin(s, &t, &k, 1);
        cr_assert(not(drey_store_txn_get(&t, &k, 100, &v)));
        drey_store_txn_end(&t);
        total -= entry_bytes(caches[i % 4], name, vlen[i]);
    }
    cr_assert(eq(u64, stats().bytes, total));
    cr_assert(eq(u64, stats().entries, 400 - 80));

    /* Everything else removed. */
    for (size_t i = 0; i < 400; i++) {
        if (i % 5 == 0)
            continue;
        many_key(name, i);
        drey_key k = key_in(caches[i % 4], name);
        cr_assert(remove_key(&k));
    }
    cr_assert(eq(u64, stats().bytes, 0));
    cr_assert(eq(u64, stats().entries, 0));
}

/* --- active expiry -------------------------------------------------------- */

/* Sweeps at `now` until `want` entries were freed or every shard was visited
 * `rounds` times; returns how many were freed. */
static size_t sweep_all(int64_t now, size_t want, int rounds) {
    size_t freed = 0;
    for (int i = 0; i < rounds * DREY_STORE_SHARDS && freed < want; i++)
        drey_store_sweep(s, now, SIZE_MAX, &freed);
    return freed;
}

Test(store, sweep_frees_expired_entries_and_leaves_live_ones) {
    char name[24];
    uint64_t live_bytes = 0;
    for (size_t i = 0; i < 2000; i++) {
        many_key(name, i);
        bool expiring = i % 2 == 0;
        put("", name, "value", expiring ? 500 : (i % 4 == 1 ? NEVER : 10000), i + 1);
        if (!expiring)
            live_bytes += entry_bytes("", name, 5);
    }
    cr_assert(eq(sz, sweep_all(499, SIZE_MAX, 1), 0), "nothing has expired at 499");
    cr_assert(eq(u64, stats().entries, 2000));

    size_t freed = sweep_all(500, 1000, 4);
    cr_assert(eq(sz, freed, 1000));
    drey_store_stats st = stats();
    cr_assert(eq(u64, st.entries, 1000));
    cr_assert(eq(u64, st.bytes, live_bytes));
    cr_assert(eq(u64, st.expired_swept, 1000));
    for (size_t i = 1; i < 2000; i += 2) {
        many_key(name, i);
        assert_string("", name, 500, "value");
    }
    cr_assert(eq(sz, sweep_all(500, SIZE_MAX, 1), 0), "a second pass finds nothing");
    cr_assert(eq(u64, stats().expired_swept, 1000));
}

/* *expired is incremented, not overwritten; the return value counts the
 * entries examined; max_buckets bounds the work of one step. */
Test(store, sweep_step_accounting) {
    size_t expired = 42;
    cr_assert(eq(sz, drey_store_sweep(s, 0, SIZE_MAX, &expired), 0), "an empty shard has nothing to examine");
    cr_assert(eq(sz, expired, 42));

    char name[24];
    for (size_t i = 0; i < 5000; i++) {
        many_key(name, i);
        put("", name, "v", 10, 1);
    }
    size_t examined = 0;
    for (int i = 0; i < DREY_STORE_SHARDS; i++)
        examined += drey_store_sweep(s, 0, 0, &expired);
    cr_assert(eq(sz, examined, 0), "max_buckets 0 does no work");
    cr_assert(eq(sz, expired, 42));

    /* Nothing expired at now=5: one full visit of every shard examines every
     * entry exactly once. */
    examined = 0;
    for (int i = 0; i < DREY_STORE_SHARDS; i++)
        examined += drey_store_sweep(s, 5, SIZE_MAX, &expired);
    cr_assert(eq(sz, examined, 5000));
    cr_assert(eq(sz, expired, 42));

    /* One bucket per step: far fewer examined than a full pass. */
    examined = 0;
    for (int i = 0; i < DREY_STORE_SHARDS; i++)
        examined += drey_store_sweep(s, 5, 1, &expired);
    cr_assert(lt(sz, examined, 5000 / 4), "examined %zu", examined);

    size_t before = expired;
    size_t freed = 0;
    for (int i = 0; i < 64 * DREY_STORE_SHARDS && freed < 5000; i++) {
        drey_store_sweep(s, 10, SIZE_MAX, &expired);
        freed = expired - before;
    }
    cr_assert(eq(sz, freed, 5000));
    cr_assert(eq(u64, stats().entries, 0));
}

static void set_expiry(const char *k, int64_t expires) {
    drey_key key = key_in("", k);
    drey_store_txn t;
    drey_store_txn_begin(s, &t, &key, 1);
    cr_assert(drey_store_txn_set_expiry(&t, &key, expires));
    drey_store_txn_end(&t);
}

/* The sweep passes over shards by this count: every way an entry gains,
 * changes or loses an expiry must keep it. */
Test(store, the_expiring_count_follows_every_change) {
    put("", "a", "v", 100, 1);
    put("", "b", "v", NEVER, 2);
    cr_assert(eq(u64, stats().expiring, 1), "insert");
    put("", "a", "w", 200, 3);
    cr_assert(eq(u64, stats().expiring, 1), "replace, still expiring");
    put("", "a", "w", NEVER, 4);
    cr_assert(eq(u64, stats().expiring, 0), "replace without expiry");
    set_expiry("b", 300);
    set_expiry("b", 400);
    cr_assert(eq(u64, stats().expiring, 1), "set_expiry");
    set_expiry("b", NEVER);
    cr_assert(eq(u64, stats().expiring, 0), "persist");
    put("", "a", "w", 100, 5);
    drey_key a = key_in("", "a");
    cr_assert(remove_key(&a));
    cr_assert(eq(u64, stats().expiring, 0), "remove");

    put("", "c", "v", 100, 6);
    drey_key c = key_in("", "c");
    drey_store_txn t;
    drey_entry_view v;
    drey_store_txn_begin(s, &t, &c, 1);
    cr_assert(not(drey_store_txn_get(&t, &c, 100, &v)));
    drey_store_txn_end(&t);
    cr_assert(eq(u64, stats().expiring, 0), "freed by txn_get");

    drey_store_item it = {.cache = "", .key = "d", .key_len = 1, .entry = {.value = {.kind = DREY_VALUE_NULL}, .expires_at_ms = 9}};
    drey_store_load(s, &it);
    cr_assert(eq(u64, stats().expiring, 1), "load");
    size_t freed = 0;
    for (int i = 0; i < DREY_STORE_SHARDS; i++)
        drey_store_sweep(s, 9, SIZE_MAX, &freed);
    cr_assert(eq(sz, freed, 1));
    cr_assert(eq(u64, stats().expiring, 0), "swept");

    put("", "e", "v", 100, 7);
    drey_store_clear(s);
    cr_assert(eq(u64, stats().expiring, 0), "clear");
}

/* Entries without an expiry cost the sweep nothing: their shards are not
 * even locked, until one of their entries gains an expiry. */
Test(store, sweep_passes_over_shards_with_nothing_to_expire) {
    char name[24];
    for (size_t i = 0; i < 5000; i++) {
        many_key(name, i);
        put("", name, "v", NEVER, i + 1);
    }
    size_t examined = 0, freed = 0;
    for (int i = 0; i < DREY_STORE_SHARDS; i++)
        examined += drey_store_sweep(s, INT64_MAX, SIZE_MAX, &freed);
    cr_assert(eq(sz, examined, 0));

    many_key(name, 17);
    set_expiry(name, 50);
    for (int i = 0; i < DREY_STORE_SHARDS; i++)
        examined += drey_store_sweep(s, 50, SIZE_MAX, &freed);
    cr_assert(gt(sz, examined, 0), "the shard holding the expiring entry is swept");
    cr_assert(lt(sz, examined, 5000 / 16), "and only that one: examined %zu", examined);
    cr_assert(eq(sz, freed, 1));
    assert_missing("", name, 0);
    cr_assert(eq(u64, stats().entries, 4999));
}

/* Sweeping a large table that shrinks under the cursor still frees every
 * expired entry and leaves the table at its minimum size. */
Test(store, sweep_survives_shrinking_shards, .timeout = 120) {
    char name[24];
    for (size_t i = 0; i < 50000; i++) {
        many_key(name, i);
        put("", name, "v", 100, 1);
    }
    cr_assert(gt(u64, stats().buckets, DREY_STORE_SHARDS * MIN_BUCKETS));
    size_t freed = sweep_all(100, 50000, 64);
    cr_assert(eq(sz, freed, 50000));
    drey_store_stats st = stats();
    cr_assert(eq(u64, st.entries, 0));
    cr_assert(eq(u64, st.bytes, 0));
    cr_assert(eq(u64, st.buckets, DREY_STORE_SHARDS * MIN_BUCKETS));
    cr_assert(eq(u64, st.expired_swept, 50000));
}

/* --- versions ------------------------------------------------------------- */

Test(store, versions_increase_and_can_be_raised) {
    cr_assert(eq(u64, drey_store_last_version(s), 0));
    cr_assert(eq(u64, drey_store_next_version(s), 1));
    cr_assert(eq(u64, drey_store_next_version(s), 2));
    cr_assert(eq(u64, drey_store_last_version(s), 2));
    drey_store_raise_version(s, 100);
    cr_assert(eq(u64, drey_store_last_version(s), 100));
    cr_assert(eq(u64, drey_store_next_version(s), 101));
    drey_store_raise_version(s, 50); /* never lowers */
    cr_assert(eq(u64, drey_store_last_version(s), 101));
    drey_store_raise_version(s, 101);
    cr_assert(eq(u64, drey_store_next_version(s), 102));
}

#define VERSION_THREADS 4
#define VERSIONS_PER_THREAD 20000

static void *take_versions(void *arg) {
    uint64_t *out = arg;
    for (int i = 0; i < VERSIONS_PER_THREAD; i++)
        out[i] = drey_store_next_version(s);
    return NULL;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Concurrent next_version calls never hand out the same number, and each
 * thread sees its own numbers increase. */
Test(store, versions_are_unique_across_threads) {
    static uint64_t got[VERSION_THREADS][VERSIONS_PER_THREAD];
    pthread_t th[VERSION_THREADS];
    for (int i = 0; i < VERSION_THREADS; i++)
        cr_assert(eq(int, pthread_create(&th[i], NULL, take_versions, got[i]), 0));
    for (int i = 0; i < VERSION_THREADS; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < VERSION_THREADS; i++)
        for (int j = 1; j < VERSIONS_PER_THREAD; j++)
            cr_assert(gt(u64, got[i][j], got[i][j - 1]));
    qsort(got, VERSION_THREADS * VERSIONS_PER_THREAD, sizeof(uint64_t), cmp_u64);
    uint64_t *all = &got[0][0];
    for (size_t i = 0; i < VERSION_THREADS * VERSIONS_PER_THREAD; i++)
        cr_assert(eq(u64, all[i], i + 1), "versions are 1..N with no gap or repeat");
    cr_assert(eq(u64, drey_store_last_version(s), VERSION_THREADS * VERSIONS_PER_THREAD));
}

/* --- concurrency ---------------------------------------------------------- */

/* A writer rewrites a set of keys generation after generation (one batch
 * per generation, spanning many shards, with some keys removed and
 * re-added); readers check every value they see is whole: its bytes, length
 * and kind all derive from its version, and a key's version never goes back.
 * A smoke test: ThreadSanitizer-grade proof is not the goal, but torn or
 * freed values and crashes show up (under ASan especially). */
#define RW_KEYS 64
#define RW_READERS 3
#define RW_GENERATIONS 3000

static drey_key rw_keys[RW_KEYS];
static char rw_names[RW_KEYS][16];
static atomic_bool rw_done;
static atomic_ulong rw_reads;

static uint32_t rw_len(uint64_t version) {
    return 8 + (uint32_t)(version % 120);
}

static void check_view(void *arg, const drey_entry_view *e) {
    uint64_t *last = arg;
    uint8_t want = (uint8_t)e->version;
    cr_assert(eq(u32, e->value.len, rw_len(e->version)), "length does not match version %llu",
              (unsigned long long)e->version);
    cr_assert(eq(int, e->value.kind, e->version % 2 ? DREY_VALUE_BYTES : DREY_VALUE_STRING));
    for (uint32_t i = 0; i < e->value.len; i++)
        cr_assert(eq(u8, e->value.data[i], want), "torn value at byte %u", i);
    cr_assert(ge(u64, e->version, *last), "a key's version went back");
    *last = e->version;
}

static void *rw_reader(void *arg) {
    (void)arg;
    uint64_t last[RW_KEYS] = {0};
    unsigned long n = 0;
    while (!atomic_load(&rw_done)) {
        for (size_t i = 0; i < RW_KEYS; i++) {
            drey_store_read(s, &rw_keys[i], 0, check_view, &last[i]);
            n++;
        }
    }
    atomic_fetch_add(&rw_reads, n);
    return NULL;
}

Test(store, concurrent_readers_and_a_writer, .timeout = 120) {
    for (size_t i = 0; i < RW_KEYS; i++) {
        snprintf(rw_names[i], sizeof rw_names[i], "rw%zu", i);
        rw_keys[i] = key_in("rw", rw_names[i]);
    }
    pthread_t readers[RW_READERS];
    for (int i = 0; i < RW_READERS; i++)
        cr_assert(eq(int, pthread_create(&readers[i], NULL, rw_reader, NULL), 0));

    uint8_t buf[128];
    for (int g = 0; g < RW_GENERATIONS; g++) {
        uint64_t version = drey_store_next_version(s);
        memset(buf, (uint8_t)version, sizeof buf);
        drey_value v = {.kind = version % 2 ? DREY_VALUE_BYTES : DREY_VALUE_STRING, .data = buf,
                        .len = rw_len(version)};
        drey_store_txn t;
        drey_store_txn_begin(s, &t, rw_keys, RW_KEYS);
        for (size_t i = 0; i < RW_KEYS; i++) {
            if ((g + i) % 7 == 0)
                drey_store_txn_remove(&t, &rw_keys[i]);
            else
                drey_store_txn_put(&t, &rw_keys[i], &v, NEVER, version);
        }
        drey_store_txn_end(&t);
    }
    atomic_store(&rw_done, true);
    for (int i = 0; i < RW_READERS; i++)
        pthread_join(readers[i], NULL);
    cr_assert(gt(u64, atomic_load(&rw_reads), 0));

    /* The final state is the last generation's. */
    uint64_t last = drey_store_last_version(s);
    for (size_t i = 0; i < RW_KEYS; i++) {
        seen r;
        bool removed = (RW_GENERATIONS - 1 + i) % 7 == 0;
        cr_assert(eq(int, read_at(&rw_keys[i], 0, &r), !removed), "key %zu", i);
        if (!removed)
            cr_assert(eq(u64, r.version, last));
    }
}

/* --- clear and load (recovery) -------------------------------------------- */

Test(store, clear_empties_the_table_and_keeps_it_usable) {
    char name[24];
    for (size_t i = 0; i < 3000; i++) {
        many_key(name, i);
        put(i % 2 ? "c" : "", name, "v", NEVER, drey_store_next_version(s));
    }
    drey_store_clear(s);
    drey_store_stats st = stats();
    cr_assert(eq(u64, st.entries, 0));
    cr_assert(eq(u64, st.bytes, 0));
    many_key(name, 7);
    assert_missing("c", name, 0);
    cr_assert(eq(u64, drey_store_last_version(s), 3000), "versions are never reused, even after a clear");

    put("", "again", "v2", NEVER, drey_store_next_version(s));
    assert_string("", "again", 0, "v2");
    cr_assert(eq(u64, stats().entries, 1));
    cr_assert(eq(u64, stats().bytes, entry_bytes("", "again", 2)));
    drey_key k = key_in("", "again");
    cr_assert(remove_key(&k));
    cr_assert(eq(u64, stats().bytes, 0));
}

/* load() inserts an entry exactly as recovery read it (version and expiry
 * included) without consuming a version. */
Test(store, load_inserts_as_read) {
    static const uint8_t data[] = {1, 2, 3};
    drey_store_item it = {
        .cache = "default",
        .cache_len = 7,
        .key = "k",
        .key_len = 1,
        .entry = {.value = {.kind = DREY_VALUE_BYTES, .data = data, .len = 3}, .version = 42, .expires_at_ms = 9000},
    };
    drey_store_load(s, &it);
    cr_assert(eq(u64, drey_store_last_version(s), 0));
    drey_key k = key_in("", "k");
    seen r;
    cr_assert(read_at(&k, 8999, &r), "\"default\" is the empty cache here too");
    cr_assert(eq(u64, r.version, 42));
    cr_assert(eq(i64, r.expires_at_ms, 9000));
    cr_assert(eq(int, r.kind, DREY_VALUE_BYTES));
    cr_assert(eq(int, memcmp(r.data, data, 3), 0));

    cr_assert(eq(u64, stats().entries, 1));
    cr_assert(eq(u64, stats().bytes, drey_store_entry_bytes(0, 1, 3)));
}

/* A snapshot's keys are unique: loading skips the lookup, sized up front
 * by reserve, and the table still finds every key and counts every byte. */
Test(store, reserve_then_load_many_unique_keys) {
    drey_store_reserve(s, 20000);
    drey_store_stats before = stats();
    cr_assert_geq(before.buckets, 20000, "reserve sized the table");
    static const uint8_t v[8] = {0};
    for (int i = 0; i < 20000; i++) {
        char key[16];
        int n = snprintf(key, sizeof key, "u%d", i);
        drey_store_item it = {
            .cache = "",
            .key = key,
            .key_len = (size_t)n,
            .entry = {.value = {.kind = DREY_VALUE_BYTES, .data = v, .len = 8}, .version = (uint64_t)i + 1},
        };
        drey_store_load(s, &it);
    }
    cr_assert(eq(u64, stats().entries, 20000));
    cr_assert(eq(u64, stats().buckets, before.buckets), "no resize while loading what was reserved");
    seen r;
    drey_key k = key_in("", "u12345");
    cr_assert(read_at(&k, 0, &r));
    cr_assert(eq(u64, r.version, 12346));
}

/* --- snapshot capture ----------------------------------------------------- */

#define CAP_KEYS 1000
#define CAP_EXPIRING 100

typedef struct capture {
    int done[DREY_STORE_SHARDS];  /* NULL markers per shard */
    int items[DREY_STORE_SHARDS]; /* items per shard */
    char value[CAP_KEYS + CAP_EXPIRING + 1][16];
    int times[CAP_KEYS + CAP_EXPIRING + 1];
    uint64_t version[CAP_KEYS + CAP_EXPIRING + 1];
    size_t total;
} capture;

static void on_capture(void *ctx, size_t shard, const drey_store_item *item) {
    capture *c = ctx;
    cr_assert(lt(sz, shard, DREY_STORE_SHARDS));
    cr_assert(eq(int, c->done[shard], 0), "shard %zu delivered after it was complete", shard);
    if (item == NULL) {
        c->done[shard]++;
        return;
    }
    char name[32];
    cr_assert(lt(sz, item->key_len, sizeof name));
    memcpy(name, item->key, item->key_len);
    name[item->key_len] = '\0';
    drey_key k;
    drey_store_key(s, &k, item->cache, item->cache_len, item->key, item->key_len);
    cr_assert(eq(sz, (size_t)(k.hash >> 56), shard), "%s reported in the wrong shard", name);
    size_t i = (size_t)atol(name + 4); /* "key-<i>" */
    cr_assert(le(sz, i, CAP_KEYS + CAP_EXPIRING));
    cr_assert(lt(u32, item->entry.value.len, 16));
    memcpy(c->value[i], item->entry.value.data, item->entry.value.len);
    c->value[i][item->entry.value.len] = '\0';
    c->version[i] = item->entry.version;
    c->times[i]++;
    c->items[shard]++;
    c->total++;
}

/* A capture is the table as of capture_begin: writes after it (replace,
 * remove, insert, an expired entry freed) do not show, every shard is
 * delivered exactly once, entries expired at live_at are left out, and
 * after capture_end nothing more is delivered. */
Test(store, capture_is_a_point_in_time_copy) {
    static capture c;
    char name[24], value[16];
    for (size_t i = 0; i < CAP_KEYS + CAP_EXPIRING; i++) {
        many_key(name, i);
        snprintf(value, sizeof value, "old%zu", i);
        put("", name, value, i < CAP_KEYS ? NEVER : 500, i + 1);
    }
    drey_store_capture_begin(s, on_capture, &c, 500);

    /* Writes racing the capture (single-threaded here: ordering is what
     * matters). */
    many_key(name, 1);
    put("", name, "new", NEVER, 9001);                     /* replace */
    many_key(name, 2);
    drey_key k2 = key_in("", name);
    cr_assert(remove_key(&k2));                            /* remove */
    many_key(name, CAP_KEYS + CAP_EXPIRING);
    put("", name, "added", NEVER, 9002);                   /* insert */
    size_t expired = 0;
    for (int i = 0; i < 8; i++)
        drey_store_sweep(s, 500, SIZE_MAX, &expired);      /* expiry */
    cr_assert(gt(sz, c.total, 0), "writes deliver their shard first");

    drey_store_capture_end(s);
    for (size_t sh = 0; sh < DREY_STORE_SHARDS; sh++)
        cr_assert(eq(int, c.done[sh], 1), "shard %zu", sh);
    cr_assert(eq(sz, c.total, CAP_KEYS));
    for (size_t i = 0; i < CAP_KEYS; i++) {
        snprintf(value, sizeof value, "old%zu", i);
        cr_assert(eq(int, c.times[i], 1), "key-%zu", i);
        cr_assert(eq(str, c.value[i], value), "key-%zu", i);
        cr_assert(eq(u64, c.version[i], i + 1));
    }
    for (size_t i = CAP_KEYS; i <= CAP_KEYS + CAP_EXPIRING; i++)
        cr_assert(eq(int, c.times[i], 0), "key-%zu is not in the capture", i);

    /* The writes themselves happened. */
    many_key(name, 1);
    assert_string("", name, 0, "new");
    many_key(name, 2);
    assert_missing("", name, 0);

    /* After the end, writes deliver nothing. */
    size_t total = c.total;
    many_key(name, 3);
    put("", name, "later", NEVER, 9003);
    cr_assert(eq(sz, c.total, total));
}

/* capture_shard delivers a shard once; later calls and writes do not
 * deliver it again. */
Test(store, capture_shard_delivers_once) {
    static capture c;
    char name[24];
    for (size_t i = 0; i < 200; i++) {
        many_key(name, i);
        put("", name, "v", NEVER, i + 1);
    }
    many_key(name, 0);
    drey_key k0 = key_in("", name);
    size_t shard = (size_t)(k0.hash >> 56);
    drey_store_capture_begin(s, on_capture, &c, 0);
    drey_store_capture_shard(s, shard);
    cr_assert(eq(int, c.done[shard], 1));
    int items = c.items[shard];
    cr_assert(ge(int, items, 1));
    drey_store_capture_shard(s, shard);
    put("", name, "changed", NEVER, 500);
    cr_assert(eq(int, c.items[shard], items));
    cr_assert(eq(int, c.done[shard], 1));
    drey_store_capture_end(s);
    cr_assert(eq(sz, c.total, 200));
}

/* --- caches: figures and clearing ------------------------------------------ */

static drey_cache_stats cache_stats(const char *cache) {
    drey_cache_stats cs;
    drey_store_cache_stats(s, cache, strlen(cache), &cs);
    return cs;
}

static size_t sweep_everything(int64_t now) {
    return sweep_all(now, SIZE_MAX, 4);
}

Test(store, each_cache_counts_its_entries_bytes_and_expiries) {
    put("a", "k1", "v1", NEVER, 1);
    put("a", "k2", "value", 5000, 2);
    put("b", "k1", "x", NEVER, 3);
    put("default", "d", "yy", NEVER, 4);
    drey_cache_stats a = cache_stats("a"), b = cache_stats("b"), d = cache_stats("");
    cr_assert(eq(u64, a.entries, 2));
    cr_assert(eq(u64, a.bytes, entry_bytes("a", "k1", 2) + entry_bytes("a", "k2", 5)));
    cr_assert(eq(u64, a.expiring, 1));
    cr_assert(eq(u64, b.entries, 1));
    cr_assert(eq(u64, b.bytes, entry_bytes("b", "k1", 1)));
    cr_assert(eq(u64, d.entries, 1), "\"\" and \"default\" are one cache");
    cr_assert(eq(u64, cache_stats("default").bytes, entry_bytes("", "d", 2)));
    cr_assert(eq(u64, cache_stats("none").entries, 0));
    /* an overwrite, an expiry change, a removal */
    put("a", "k1", "longer value", NEVER, 5);
    drey_key k2 = key_in("a", "k2");
    drey_store_txn t;
    drey_store_txn_begin(s, &t, &k2, 1);
    drey_store_txn_set_expiry(&t, &k2, NEVER);
    drey_store_txn_end(&t);
    a = cache_stats("a");
    cr_assert(eq(u64, a.bytes, entry_bytes("a", "k1", 12) + entry_bytes("a", "k2", 5)));
    cr_assert(eq(u64, a.expiring, 0));
    cr_assert(remove_key(&k2));
    a = cache_stats("a");
    cr_assert(eq(u64, a.entries, 1));
    cr_assert(eq(u64, a.bytes, entry_bytes("a", "k1", 12)));
    cr_assert(eq(u64, (uint64_t)drey_store_bytes(s), a.bytes + cache_stats("b").bytes + cache_stats("").bytes));
}

typedef struct listed {
    char names[8][32];
    uint64_t entries[8];
    int n;
} listed;

static void list_fn(void *arg, const drey_cache_stats *c) {
    listed *l = arg;
    cr_assert(lt(int, l->n, 8));
    snprintf(l->names[l->n], sizeof l->names[0], "%.*s", (int)c->cache_len, c->cache);
    l->entries[l->n++] = c->entries;
}

Test(store, list_caches_names_those_holding_entries) {
    put("a", "k", "v", NEVER, 1);
    put("b", "k", "v", NEVER, 2);
    put("b", "j", "v", NEVER, 3);
    drey_key k = key_in("a", "k");
    cr_assert(remove_key(&k));
    listed l = {0};
    drey_store_list_caches(s, list_fn, &l);
    cr_assert(eq(int, l.n, 1), "an empty cache is not listed");
    cr_assert(eq(str, l.names[0], "b"));
    cr_assert(eq(u64, l.entries[0], 2));
}

Test(store, clear_hides_the_cache_at_once_and_the_sweep_frees_it) {
    for (int i = 0; i < 500; i++) {
        char k[16];
        snprintf(k, sizeof k, "k%d", i);
        put("c", k, "value", i % 2 ? 10000 : NEVER, (uint64_t)i + 1);
    }
    put("other", "k1", "v", NEVER, 1000);
    int64_t before = drey_store_bytes(s);
    int64_t other = (int64_t)cache_stats("other").bytes;
    cr_assert(eq(u64, drey_store_clear_cache(s, "c", 1), 500));
    assert_missing("c", "k1", 0);
    assert_missing("c", "k2", 0);
    assert_string("other", "k1", 0, "v");
    drey_cache_stats c = cache_stats("c");
    cr_assert(eq(u64, c.entries, 0), "the cleared cache's figures are zero at once");
    cr_assert(eq(u64, c.bytes, 0));
    cr_assert(eq(i64, drey_store_bytes(s), before), "memory is counted until it is freed");
    cr_assert(eq(u64, stats().clearing, 500));
    /* a write to the name opens it afresh, replacing a cleared entry */
    put("c", "k3", "new", NEVER, 2000);
    assert_string("c", "k3", 0, "new");
    cr_assert(eq(u64, cache_stats("c").entries, 1));
    cr_assert(eq(u64, stats().clearing, 499));
    uint64_t swept = stats().expired_swept;
    cr_assert(eq(u64, sweep_everything(0), 499), "the sweep frees cleared entries");
    cr_assert(eq(u64, stats().expired_swept, swept), "freeing cleared entries is not expiry");
    cr_assert(eq(u64, stats().clearing, 0));
    cr_assert(eq(i64, drey_store_bytes(s), other + (int64_t)entry_bytes("c", "k3", 3)));
    cr_assert(eq(u64, drey_store_clear_cache(s, "nothing", 7), 0));
}

Test(store, clearing_a_cache_again_and_again_reuses_its_slots) {
    for (int round = 0; round < 2000; round++) {
        put("loop", "k", "v", NEVER, (uint64_t)round + 1);
        drey_store_clear_cache(s, "loop", 4);
        sweep_everything(0);
    }
    cr_assert(eq(u64, stats().entries, 0));
    cr_assert(eq(i64, drey_store_bytes(s), 0));
}

typedef struct capture_count {
    size_t items;
} capture_count;

static void count_capture(void *ctx, size_t shard, const drey_store_item *item) {
    (void)shard;
    if (item != NULL)
        ((capture_count *)ctx)->items++;
}

Test(store, a_snapshot_capture_skips_cleared_entries) {
    put("c", "k1", "v", NEVER, 1);
    put("d", "k1", "v", NEVER, 2);
    drey_store_clear_cache(s, "c", 1);
    capture_count cc = {0};
    drey_store_capture_begin(s, count_capture, &cc, 0);
    drey_store_capture_end(s);
    cr_assert(eq(sz, cc.items, 1));
}

/* --- scans ------------------------------------------------------------------ */

typedef struct scanned {
    char keys[4096][16];
    size_t n;
} scanned;

static void scan_fn(void *arg, const drey_store_item *it) {
    scanned *sc = arg;
    cr_assert(lt(sz, sc->n, 4096));
    snprintf(sc->keys[sc->n++], 16, "%.*s", (int)it->key_len, it->key);
}

static bool scanned_has(const scanned *sc, const char *k) {
    for (size_t i = 0; i < sc->n; i++)
        if (strcmp(sc->keys[i], k) == 0)
            return true;
    return false;
}

Test(store, a_scan_returns_each_live_key_of_the_cache) {
    for (int i = 0; i < 1000; i++) {
        char k[16];
        snprintf(k, sizeof k, "%c%d", i % 4 ? 'p' : 'q', i);
        put("s", k, "v", i == 7 ? 50 : NEVER, (uint64_t)i + 1);
        put("t", k, "v", NEVER, (uint64_t)i + 5000);
    }
    static scanned sc;
    sc.n = 0;
    drey_store_scan_pos pos = {0, 0};
    size_t pages = 0;
    while (pos.shard < DREY_STORE_SHARDS) {
        size_t got = drey_store_scan(s, "s", 1, "", 0, 100, &pos, 10, 1 << 20, scan_fn, &sc);
        cr_assert(le(sz, got, 10), "a page of %zu", got);
        pages++;
    }
    cr_assert(eq(sz, sc.n, 999), "every live key once, the expired one skipped");
    cr_assert(ge(sz, pages, 100));
    cr_assert(not(scanned_has(&sc, "p7")));
    sc.n = 0;
    pos = (drey_store_scan_pos){0, 0};
    while (pos.shard < DREY_STORE_SHARDS)
        drey_store_scan(s, "s", 1, "q", 1, 100, &pos, 1000, 1 << 20, scan_fn, &sc);
    cr_assert(eq(sz, sc.n, 250));
    /* a page's work is bounded by buckets too */
    pos = (drey_store_scan_pos){0, 0};
    sc.n = 0;
    drey_store_scan(s, "none", 4, "", 0, 100, &pos, 100, 10, scan_fn, &sc);
    cr_assert(eq(sz, sc.n, 0));
    cr_assert(lt(u32, pos.shard, DREY_STORE_SHARDS), "10 buckets cannot finish the table");
}

Test(store, a_scan_covers_keys_present_throughout_while_the_table_resizes) {
    for (int i = 0; i < 2000; i++) {
        char k[32];
        snprintf(k, sizeof k, "s%d", i);
        put("r", k, "v", NEVER, (uint64_t)i + 1);
    }
    static scanned sc;
    sc.n = 0;
    drey_store_scan_pos pos = {0, 0};
    int round = 0;
    while (pos.shard < DREY_STORE_SHARDS) {
        drey_store_scan(s, "r", 1, "", 0, 0, &pos, 7, 1 << 20, scan_fn, &sc);
        /* grow the table, then shrink it back, between pages */
        char k[32];
        if (round % 40 < 20) {
            for (int j = 0; j < 400; j++) {
                snprintf(k, sizeof k, "x%d-%d", round, j);
                put("other", k, "v", NEVER, 100000 + (uint64_t)round * 1000 + (uint64_t)j);
            }
        } else {
            for (int j = 0; j < 400; j++) {
                snprintf(k, sizeof k, "x%d-%d", round - 20, j);
                drey_key key = key_in("other", k);
                remove_key(&key);
            }
        }
        round++;
    }
    cr_assert(gt(int, round, 100));
    for (int i = 0; i < 2000; i++) {
        char k[32];
        snprintf(k, sizeof k, "s%d", i);
        cr_assert(scanned_has(&sc, k), "%s was present throughout and not returned", k);
    }
}

Test(store, a_tag_depends_on_the_seed_and_the_bytes) {
    uint64_t t1 = drey_store_tag(s, "abc", 3);
    cr_assert(eq(u64, t1, drey_store_tag(s, "abc", 3)));
    cr_assert(ne(u64, t1, drey_store_tag(s, "abd", 3)));
    uint8_t seed[16];
    drey_store_get_seed(s, seed);
    drey_store *other = drey_store_create();
    cr_assert(ne(u64, t1, drey_store_tag(other, "abc", 3)));
    drey_store_set_seed(other, seed);
    cr_assert(eq(u64, t1, drey_store_tag(other, "abc", 3)));
    drey_store_destroy(other);
}

Test(store, setting_the_seed_of_a_store_with_entries_aborts, .signal = SIGABRT) {
    put("", "k", "v", NEVER, 1);
    uint8_t seed[16] = {0};
    drey_store_set_seed(s, seed);
}

/* A cache whose last entry goes keeps no slot in the registry: cache names
 * written and emptied over a node's life must not pile up (the registry is
 * bounded, and --max-caches counts what is there). */
Test(store, a_cache_that_empties_leaves_the_registry) {
    char name[32];
    for (int i = 0; i < 20000; i++) {
        snprintf(name, sizeof name, "churn-%d", i);
        put(name, "k", "v", 0, (uint64_t)i + 1);
        drey_key k = key_in(name, "k");
        cr_assert(remove_key(&k));
    }
    cr_assert(drey_store_cache_admits(s, "a-new-one", 9, 1), "20,000 emptied caches still count");
    put("kept", "k", "v", 0, 30000);
    cr_assert(drey_store_cache_admits(s, "kept", 4, 1), "an existing cache always takes writes");
    cr_assert(not(drey_store_cache_admits(s, "another", 7, 1)), "one cache with entries is the limit of 1");
    drey_cache_stats st;
    drey_store_cache_stats(s, "churn-7", 7, &st);
    cr_assert_eq(st.entries, 0);
    assert_string("kept", "k", 1, "v");
}
