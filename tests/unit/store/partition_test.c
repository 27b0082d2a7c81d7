/*
 * Unit tests for the store's partitions (src/store/store.c, "partitions"):
 * a partitioned store keeps each partition's entries in tables of its own.
 *
 * The rules pinned here:
 *   - the partitions agree with a full walk of the store (every live entry
 *     in exactly its partition, the figures equal to what the walk counts)
 *     after random puts, replacements, removals, expiry changes, reads of
 *     expired entries, sweeps, evictions, cleared caches, a cleared store,
 *     a snapshot loaded into a partitioned store and a store partitioned
 *     after it was loaded;
 *   - a partition's walk in small steps, with writes going on between the
 *     steps (and the tables growing and shrinking under it), delivers every
 *     entry present for the whole walk;
 *   - removing one partition removes exactly its entries, tells the
 *     observer of each, and leaves every other partition as it was;
 *   - a store that is not partitioned has no partitions, and bad partition
 *     counts are refused without a change.
 * The partition function is the test's own (FNV-1a of cache and key), with
 * keys starting "none" placed in no partition, as outcomes that name no
 * write are on a cluster node.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/store.h"

#define T0 1700000000000LL

static drey_store *s;

static void setup(void) {
    s = drey_store_create();
}

static void teardown(void) {
    drey_store_destroy(s);
    s = NULL;
}

TestSuite(store_partition, .init = setup, .fini = teardown, .timeout = 60);

static _Atomic uint64_t fn_calls;

static uint32_t test_part(const char *cache, size_t cache_len, const char *key, size_t key_len, uint32_t n) {
    atomic_fetch_add_explicit(&fn_calls, 1, memory_order_relaxed);
    if (key_len >= 4 && memcmp(key, "none", 4) == 0)
        return UINT32_MAX;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < cache_len; i++)
        h = (h ^ (uint8_t)cache[i]) * 1099511628211ULL;
    h = (h ^ 0x1f) * 1099511628211ULL;
    for (size_t i = 0; i < key_len; i++)
        h = (h ^ (uint8_t)key[i]) * 1099511628211ULL;
    return (uint32_t)(h % n);
}

/* The partition the store files an entry under (n for none). */
static uint32_t group_of(const char *cache, size_t cache_len, const char *key, size_t key_len, uint32_t n) {
    uint32_t p = test_part(cache, cache_len, key, key_len, n);
    return p < n ? p : n;
}

/* --- writing ------------------------------------------------------------------ */

static drey_key key_of(drey_store *st, const char *cache, const char *key) {
    drey_key k;
    drey_store_key(st, &k, cache, strlen(cache), key, strlen(key));
    return k;
}

static void put_in(drey_store *st, const char *cache, const char *key, const char *value, int64_t expires) {
    drey_key k = key_of(st, cache, key);
    drey_value v = {.kind = DREY_VALUE_STRING, .data = (const uint8_t *)value, .len = (uint32_t)strlen(value)};
    drey_store_txn t;
    drey_store_txn_begin(st, &t, &k, 1);
    drey_store_txn_put(&t, &k, &v, expires, drey_store_next_version(st));
    drey_store_txn_end(&t);
}

static void put(const char *cache, const char *key, const char *value, int64_t expires) {
    put_in(s, cache, key, value, expires);
}

static bool del(const char *cache, const char *key) {
    drey_key k = key_of(s, cache, key);
    drey_store_txn t;
    drey_store_txn_begin(s, &t, &k, 1);
    bool removed = drey_store_txn_remove(&t, &k);
    drey_store_txn_end(&t);
    return removed;
}

/* --- what the store holds, two ways --------------------------------------------- */

/* Per partition: entries, their accounted bytes, those with an expiry, and
 * an order-independent fingerprint of their contents. */
typedef struct tally {
    uint64_t entries, bytes, expiring, sum, xor;
} tally;

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        h = (h ^ ((const uint8_t *)p)[i]) * 1099511628211ULL;
    return h;
}

static uint64_t fingerprint(const drey_store_item *it) {
    uint64_t h = fnv(1469598103934665603ULL, it->cache, it->cache_len);
    h = fnv(h, "\x1f", 1);
    h = fnv(h, it->key, it->key_len);
    h = fnv(h, it->entry.value.data, it->entry.value.len);
    h = fnv(h, &it->entry.version, sizeof it->entry.version);
    h = fnv(h, &it->entry.expires_at_ms, sizeof it->entry.expires_at_ms);
    return h * 0x9e3779b97f4a7c15ULL | 1;
}

static void tally_add(tally *t, const drey_store_item *it) {
    uint64_t f = fingerprint(it);
    t->entries++;
    t->bytes += drey_store_entry_bytes(it->cache_len, it->key_len, it->entry.value.len);
    t->expiring += it->entry.expires_at_ms != 0;
    t->sum += f;
    t->xor ^= f * 31;
}

typedef struct by_partition {
    uint32_t n;
    tally *t; /* n + 1 */
} by_partition;

static void full_item(void *arg, const drey_store_item *it) {
    by_partition *b = arg;
    tally_add(&b->t[group_of(it->cache, it->cache_len, it->key, it->key_len, b->n)], it);
}

/* Every entry live at now_ms (INT64_MIN: expired ones too), by the
 * partition the function says, from a walk of the whole store. */
static by_partition full_walk(drey_store *st, uint32_t n, int64_t now_ms) {
    by_partition b = {.n = n, .t = calloc(n + 1, sizeof(tally))};
    for (size_t i = 0; i < DREY_STORE_SHARDS; i++)
        drey_store_walk_shard(st, i, now_ms, full_item, &b);
    return b;
}

typedef struct walked {
    tally t;
    uint32_t n, p;
    bool strays; /* an entry of another partition */
} walked;

static void walk_item(void *arg, const drey_store_item *it) {
    walked *w = arg;
    if (group_of(it->cache, it->cache_len, it->key, it->key_len, w->n) != w->p)
        w->strays = true;
    tally_add(&w->t, it);
}

/* Partition p from its own walk, in steps of `step` entries. */
static walked part_walk(drey_store *st, uint32_t n, uint32_t p, int64_t now_ms, size_t step) {
    walked w = {.n = n, .p = p};
    drey_store_scan_pos pos = {0, 0};
    size_t steps = 0;
    while (pos.shard != DREY_STORE_SCAN_DONE) {
        drey_store_partition_walk(st, p, now_ms, &pos, step, walk_item, &w);
        cr_assert_lt(++steps, 10000000, "the walk ends");
    }
    return w;
}

static const char *const caches[] = {"", "users", "#internal", "sessions"};
#define N_CACHES (sizeof caches / sizeof caches[0])

typedef struct cache_sum {
    uint64_t entries, bytes, expiring;
    size_t listed;
} cache_sum;

typedef struct listing {
    cache_sum *sums; /* N_CACHES */
    uint64_t entries;
} listing;

static void list_item(void *arg, const drey_cache_stats *c) {
    listing *l = arg;
    for (size_t i = 0; i < N_CACHES; i++) {
        if (c->cache_len == strlen(caches[i]) && memcmp(c->cache, caches[i], c->cache_len) == 0) {
            l->sums[i].listed++;
            cr_assert_gt(c->entries, 0, "a listed cache has entries in the partition");
            l->entries += c->entries;
            return;
        }
    }
    cr_assert_fail("an unknown cache listed: %.*s", (int)c->cache_len, c->cache);
}

static void same_tally(const tally *a, const tally *b, const char *what, uint32_t p) {
    cr_assert_eq(a->entries, b->entries, "%s, partition %u: entries %lu vs %lu", what, p, (unsigned long)a->entries,
                 (unsigned long)b->entries);
    cr_assert_eq(a->bytes, b->bytes, "%s, partition %u: bytes", what, p);
    cr_assert_eq(a->expiring, b->expiring, "%s, partition %u: expiring", what, p);
    cr_assert_eq(a->sum, b->sum, "%s, partition %u: contents", what, p);
    cr_assert_eq(a->xor, b->xor, "%s, partition %u: contents", what, p);
}

/* The rule: every partition's walk (live entries, and with now = INT64_MIN
 * every entry not cleared) is exactly the full walk's share of it, its
 * figures are what the walk counts, its figures per cache add up to the
 * cache's, and its listed caches are its figures. */
static struct {
    size_t clearing, expired, none;
} checked; /* what the checks saw, so a test knows its operations reached them */

static void agrees(drey_store *st, uint32_t n, int64_t now_ms) {
    cr_assert_eq(drey_store_partitions(st), n);
    drey_store_stats stats;
    drey_store_get_stats(st, &stats);
    checked.clearing += stats.clearing > 0;
    by_partition live = full_walk(st, n, now_ms), all = full_walk(st, n, INT64_MIN);
    drey_store_partition_stats total = {0};
    cache_sum sums[N_CACHES] = {{0}};
    for (uint32_t p = 0; p <= n; p++) {
        walked w = part_walk(st, n, p, now_ms, 1 + p % 7);
        cr_assert(!w.strays, "partition %u's walk holds only its own entries", p);
        same_tally(&w.t, &live.t[p], "live", p);
        walked a = part_walk(st, n, p, INT64_MIN, 64);
        same_tally(&a.t, &all.t[p], "all", p);
        drey_store_partition_stats ps;
        drey_store_get_partition_stats(st, p, &ps);
        total.entries += ps.entries;
        total.bytes += ps.bytes;
        total.expiring += ps.expiring;
        if (stats.clearing == 0) { /* no entry of a cleared cache waits to be freed */
            cr_assert_eq(ps.entries, all.t[p].entries, "partition %u: entries figure", p);
            cr_assert_eq(ps.bytes, all.t[p].bytes, "partition %u: bytes figure", p);
            cr_assert_eq(ps.expiring, all.t[p].expiring, "partition %u: expiring figure", p);
        }
        listing l = {.sums = sums};
        drey_store_partition_list_caches(st, p, list_item, &l);
        if (stats.clearing == 0)
            cr_assert_eq(l.entries, ps.entries, "partition %u: its listed caches hold its entries", p);
        for (size_t i = 0; i < N_CACHES; i++) {
            drey_cache_stats cs;
            drey_store_partition_cache_stats(st, p, caches[i], strlen(caches[i]), &cs);
            cr_assert_eq(cs.evictions, 0);
            sums[i].entries += cs.entries;
            sums[i].bytes += cs.bytes;
            sums[i].expiring += cs.expiring;
        }
    }
    checked.none += live.t[n].entries > 0;
    for (uint32_t p = 0; p <= n; p++)
        checked.expired += all.t[p].entries > live.t[p].entries;
    cr_assert_eq(total.entries, stats.entries, "the partitions hold every entry");
    cr_assert_eq(total.bytes, stats.bytes);
    cr_assert_eq(total.expiring, stats.expiring);
    for (size_t i = 0; i < N_CACHES; i++) {
        drey_cache_stats cs;
        drey_store_cache_stats(st, caches[i], strlen(caches[i]), &cs);
        cr_assert_eq(sums[i].entries, cs.entries, "cache '%s': partitions' entries add up", caches[i]);
        cr_assert_eq(sums[i].bytes, cs.bytes, "cache '%s': bytes", caches[i]);
        cr_assert_eq(sums[i].expiring, cs.expiring, "cache '%s': expiring", caches[i]);
    }
    free(live.t);
    free(all.t);
}

/* --- random operations ------------------------------------------------------------- */

static uint64_t rng = 0x2545f4914f6cdd1dULL;

static uint64_t rnd(void) {
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return rng * 0x2545f4914f6cdd1dULL;
}

static void random_key(char *key, size_t cap, const char **cache) {
    *cache = caches[rnd() % N_CACHES];
    unsigned i = (unsigned)(rnd() % 1500);
    snprintf(key, cap, i % 50 == 0 ? "none-%u" : "k%u", i);
}

typedef struct victims {
    drey_key keys[32];
    uint64_t versions[32];
    char names[32][300];
    size_t n;
} victims;

static void take_victim(void *arg, const drey_store_item *v, size_t bytes) {
    (void)bytes;
    victims *vs = arg;
    if (vs->n == 32)
        return;
    char *name = vs->names[vs->n];
    memcpy(name, v->cache, v->cache_len);
    memcpy(name + v->cache_len, v->key, v->key_len);
    drey_store_key(s, &vs->keys[vs->n], name, v->cache_len, name + v->cache_len, v->key_len);
    vs->versions[vs->n++] = v->entry.version;
}

static void evict_some(int64_t now_ms) {
    victims vs = {.n = 0};
    drey_store_evict_choose(s, now_ms, 2000, 32, NULL, take_victim, &vs);
    for (size_t i = 0; i < vs.n; i++) {
        drey_store_txn t;
        drey_store_txn_begin(s, &t, &vs.keys[i], 1);
        drey_store_txn_evict(&t, &vs.keys[i], vs.versions[i]);
        drey_store_txn_end(&t);
    }
}

/* One random operation at time now. */
static void random_op(int64_t now) {
    char key[32], value[80];
    const char *cache;
    random_key(key, sizeof key, &cache);
    drey_key k = key_of(s, cache, key);
    uint64_t r = rnd() % 100;
    drey_store_txn t;
    if (r < 50) {
        size_t len = rnd() % sizeof value;
        memset(value, 'a' + (int)(rnd() % 26), len);
        value[len] = '\0';
        int64_t expires = rnd() % 3 == 0 ? now + (int64_t)(rnd() % 400) - 100 : 0;
        put(cache, key, value, expires);
    } else if (r < 70) {
        del(cache, key);
    } else if (r < 80) {
        drey_store_txn_begin(s, &t, &k, 1);
        drey_store_txn_set_expiry(&t, &k, rnd() % 2 ? 0 : now + (int64_t)(rnd() % 300));
        drey_store_txn_end(&t);
    } else if (r < 90) {
        drey_entry_view v;
        drey_store_txn_begin(s, &t, &k, 1); /* an expired entry found here is freed */
        drey_store_txn_get(&t, &k, now, &v);
        drey_store_txn_end(&t);
    } else if (r < 96) {
        size_t expired = 0;
        for (int i = 0; i < 40; i++)
            drey_store_sweep(s, now, 64, &expired);
    } else if (r < 99) {
        evict_some(now);
    } else {
        drey_store_clear_cache(s, cache, strlen(cache));
    }
}

static void random_ops(int n, int64_t *now) {
    for (int i = 0; i < n; i++) {
        random_op(*now);
        *now += (int64_t)(rnd() % 3);
    }
}

/* Partition counts: a few tables each (16), one each (256), more than
 * there are stripes (1000), and a single partition (128 tables). */
static const uint32_t counts[] = {1, 16, 256, 1000};

Test(store_partition, agree_with_a_full_walk_after_random_operations) {
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        drey_store_destroy(s);
        s = drey_store_create();
        drey_store_set_policy(s, DREY_EVICT_ALLKEYS_LRU);
        rng = 0x9e3779b97f4a7c15ULL + c;
        uint32_t n = counts[c];
        cr_assert(drey_store_set_partitions(s, n, test_part));
        int64_t now = T0;
        for (int round = 0; round < 6; round++) {
            random_ops(1500, &now);
            agrees(s, n, now);
        }
        /* Everything swept: no cleared entry waits, the figures are exact. */
        size_t expired = 0;
        for (int i = 0; i < 4 * 1024; i++)
            drey_store_sweep(s, now, 1 << 20, &expired);
        drey_store_stats st;
        drey_store_get_stats(s, &st);
        cr_assert_eq(st.clearing, 0);
        agrees(s, n, now);
        drey_store_get_stats(s, &st);
        cr_assert_gt(st.evictions, 0, "evictions happened");
        cr_assert_gt(st.expired_swept, 0, "the sweep expired entries");
        drey_store_clear(s);
        agrees(s, n, now);
        random_ops(500, &now);
        agrees(s, n, now);
    }
    cr_assert_gt(checked.clearing, 0, "checked with entries of cleared caches waiting");
    cr_assert_gt(checked.expired, 0, "checked with expired entries not yet freed");
    cr_assert_gt(checked.none, 0, "checked with entries of no partition");
}

/* A snapshot loaded into a partitioned store, and a loaded store
 * partitioned afterwards (recovery, then the join), hold the same entries
 * in the same partitions as the store they came from. */
typedef struct captured {
    drey_store_item *items;
    char **copies;
    size_t n, cap;
} captured;

static void on_capture(void *ctx, size_t shard, const drey_store_item *it) {
    (void)shard;
    captured *c = ctx;
    if (it == NULL)
        return;
    if (c->n == c->cap) {
        c->cap = c->cap ? c->cap * 2 : 256;
        c->items = realloc(c->items, c->cap * sizeof *c->items);
        c->copies = realloc(c->copies, c->cap * sizeof *c->copies);
    }
    char *copy = malloc(it->cache_len + it->key_len + it->entry.value.len + 1);
    memcpy(copy, it->cache, it->cache_len);
    memcpy(copy + it->cache_len, it->key, it->key_len);
    memcpy(copy + it->cache_len + it->key_len, it->entry.value.data, it->entry.value.len);
    drey_store_item x = *it;
    x.cache = copy;
    x.key = copy + it->cache_len;
    x.entry.value.data = (const uint8_t *)copy + it->cache_len + it->key_len;
    c->copies[c->n] = copy;
    c->items[c->n++] = x;
}

Test(store_partition, a_loaded_snapshot_agrees_whether_partitioned_before_or_after) {
    const uint32_t n = 16;
    cr_assert(drey_store_set_partitions(s, n, test_part));
    int64_t now = T0;
    random_ops(4000, &now);
    captured cap = {0};
    drey_store_capture_begin(s, on_capture, &cap, now);
    drey_store_capture_end(s);
    by_partition want = full_walk(s, n, now);

    drey_store *before = drey_store_create(), *after = drey_store_create();
    cr_assert(drey_store_set_partitions(before, n, test_part));
    drey_store_reserve(before, cap.n);
    for (size_t i = 0; i < cap.n; i++) {
        drey_store_load(before, &cap.items[i]);
        drey_store_load(after, &cap.items[i]);
    }
    cr_assert(drey_store_set_partitions(after, n, test_part));
    drey_store *loaded[] = {before, after};
    for (size_t l = 0; l < 2; l++) {
        agrees(loaded[l], n, now);
        for (uint32_t p = 0; p <= n; p++) {
            walked w = part_walk(loaded[l], n, p, now, 5);
            same_tally(&w.t, &want.t[p], l == 0 ? "loaded into a partitioned store" : "partitioned after the load",
                       p);
        }
    }
    /* Partitioned again, into another count: still every entry, each where
     * the new count says. */
    cr_assert(drey_store_set_partitions(after, 300, test_part));
    agrees(after, 300, now);
    drey_store_stats a, b;
    drey_store_get_stats(after, &a);
    drey_store_get_stats(before, &b);
    cr_assert_eq(a.entries, b.entries);
    cr_assert_eq(a.bytes, b.bytes);
    drey_store_destroy(before);
    drey_store_destroy(after);
    for (size_t i = 0; i < cap.n; i++)
        free(cap.copies[i]);
    free(cap.items);
    free(cap.copies);
    free(want.t);
}

/* --- walks while writes go on ------------------------------------------------------- */

/* The first `count` keys "<prefix><i>" of cache "" in partition p, from i. */
static void keys_in(uint32_t n, uint32_t p, const char *prefix, char (*out)[24], size_t count) {
    size_t found = 0;
    for (unsigned i = 0; found < count; i++) {
        snprintf(out[found], sizeof out[found], "%s%u", prefix, i);
        if (group_of("", 0, out[found], strlen(out[found]), n) == p)
            found++;
    }
}

typedef struct stable_seen {
    uint32_t n, p;
    uint8_t *seen; /* by the stable key's index */
    size_t stable;
} stable_seen;

#define STABLE 300

static char stable_keys[STABLE][24];

static size_t stable_index(const char *key, size_t len) {
    for (size_t i = 0; i < STABLE; i++) {
        if (strlen(stable_keys[i]) == len && memcmp(stable_keys[i], key, len) == 0)
            return i;
    }
    return SIZE_MAX;
}

static void see_stable(void *arg, const drey_store_item *it) {
    stable_seen *ss = arg;
    cr_assert_eq(group_of(it->cache, it->cache_len, it->key, it->key_len, ss->n), ss->p);
    size_t i = stable_index(it->key, it->key_len);
    if (i != SIZE_MAX)
        ss->seen[i] = 1;
}

static void all_stable_seen(const stable_seen *ss, const char *when) {
    for (size_t i = 0; i < STABLE; i++)
        cr_assert(ss->seen[i], "%s: stable key %s was present all along and never delivered", when, stable_keys[i]);
}

/* Deterministic: the partition's table doubles, and later halves, between
 * steps of one walk; reverse-binary order still covers every bucket. */
Test(store_partition, a_walk_sees_every_entry_present_throughout_across_growth_and_shrinking) {
    const uint32_t n = 256; /* one table per partition: its resizes are the walk's */
    const uint32_t p = 7;
    cr_assert(drey_store_set_partitions(s, n, test_part));
    keys_in(n, p, "s", stable_keys, STABLE);
    for (size_t i = 0; i < STABLE; i++)
        put("", stable_keys[i], "stable", 0);
    static char churn[6000][24];
    keys_in(n, p, "c", churn, 6000);
    for (int variant = 0; variant < 2; variant++) {
        uint8_t seen[STABLE] = {0};
        stable_seen ss = {.n = n, .p = p, .seen = seen};
        drey_store_scan_pos pos = {0, 0};
        int steps = 0;
        while (pos.shard != DREY_STORE_SCAN_DONE) {
            drey_store_partition_walk(s, p, T0, &pos, 3, see_stable, &ss);
            steps++;
            if (variant == 0 && steps == 20) {
                for (size_t i = 0; i < 6000; i++) /* the table grows 32-fold */
                    put("", churn[i], "x", 0);
            }
            if (variant == 0 && steps == 60) {
                for (size_t i = 0; i < 6000; i++) /* and shrinks back */
                    del("", churn[i]);
            }
            if (variant == 1 && steps == 10) {
                for (size_t i = 0; i < 6000; i++)
                    put("", churn[i], "x", 0);
            }
            if (variant == 1 && steps == 400) {
                for (size_t i = 0; i < 6000; i++)
                    del("", churn[i]);
            }
        }
        all_stable_seen(&ss, variant == 0 ? "grown then shrunk early" : "grown, walked, shrunk");
        for (size_t i = 0; i < 6000; i++)
            del("", churn[i]);
    }
}

typedef struct churner {
    uint32_t n, p;
    _Atomic bool stop;
    _Atomic uint64_t rounds;
} churner;

static void *churn_main(void *arg) {
    churner *c = arg;
    static char churn[3000][24];
    keys_in(c->n, c->p, "c", churn, 3000);
    for (uint64_t round = 0; !atomic_load(&c->stop); round++) {
        for (size_t i = 0; i < 3000 && !atomic_load(&c->stop); i++) {
            put("", churn[i], "churn", 0);
            if (i % 10 == 0) /* the stable keys are replaced: present all along */
                put("", stable_keys[(i / 10 + round) % STABLE], "replaced", 0);
        }
        for (size_t i = 0; i < 3000; i++)
            del("", churn[i]);
        atomic_fetch_add(&c->rounds, 1);
    }
    return NULL;
}

/* Threaded: writers replace the stable keys and add and remove others in
 * the same partition (growing and shrinking its tables) while walks go on
 * in small steps; every walk delivers every stable key. */
Test(store_partition, a_walk_concurrent_with_writes_returns_every_entry_present_throughout) {
    for (int layout = 0; layout < 2; layout++) {
        drey_store_destroy(s);
        s = drey_store_create();
        const uint32_t n = layout == 0 ? 256 : 8; /* one table per partition, or 32 */
        const uint32_t p = 3;
        cr_assert(drey_store_set_partitions(s, n, test_part));
        keys_in(n, p, "s", stable_keys, STABLE);
        for (size_t i = 0; i < STABLE; i++)
            put("", stable_keys[i], "stable", 0);
        churner c = {.n = n, .p = p};
        pthread_t th;
        cr_assert_eq(pthread_create(&th, NULL, churn_main, &c), 0);
        int walks = 0;
        while (walks < 200 || atomic_load(&c.rounds) < 3) {
            uint8_t seen[STABLE] = {0};
            stable_seen ss = {.n = n, .p = p, .seen = seen};
            drey_store_scan_pos pos = {0, 0};
            while (pos.shard != DREY_STORE_SCAN_DONE)
                drey_store_partition_walk(s, p, T0, &pos, 4, see_stable, &ss);
            all_stable_seen(&ss, "a walk during writes");
            walks++;
            cr_assert_lt(walks, 100000);
        }
        atomic_store(&c.stop, true);
        pthread_join(th, NULL);
    }
}

/* --- removing a partition ---------------------------------------------------------------- */

typedef struct heard {
    size_t removes, expires, others;
    uint32_t n, p;
    bool strays;
} heard;

static void hear(void *ctx, const drey_store_change *c) {
    heard *h = ctx;
    if (c->kind == DREY_STORE_CHANGE_REMOVE || c->kind == DREY_STORE_CHANGE_EXPIRE) {
        if (group_of(c->cache, c->cache_len, c->key, c->key_len, h->n) != h->p)
            h->strays = true;
        *(c->kind == DREY_STORE_CHANGE_REMOVE ? &h->removes : &h->expires) += 1;
    } else {
        h->others++;
    }
}

Test(store_partition, removing_a_partition_leaves_the_others_untouched) {
    const uint32_t n = 16, p = 5;
    cr_assert(drey_store_set_partitions(s, n, test_part));
    int64_t now = T0;
    for (int i = 0; i < 3000; i++) {
        char key[16];
        snprintf(key, sizeof key, i % 97 == 0 ? "none%d" : "k%d", i);
        put(caches[i % N_CACHES], key, "v", i % 5 == 0 ? now + 50 : 0);
    }
    now += 100; /* a fifth have expired, not yet swept */
    by_partition before = full_walk(s, n, INT64_MIN);
    drey_store_partition_stats ps[17];
    for (uint32_t q = 0; q <= n; q++)
        drey_store_get_partition_stats(s, q, &ps[q]);
    cr_assert_gt(ps[p].entries, 100);
    /* The observer hears what a client would: live entries of client
     * caches removed, expired ones expired. */
    walked live = part_walk(s, n, p, now, 100);
    size_t internal_live = 0, internal_all = 0;
    for (int i = 0; i < 3000; i++) {
        char key[16];
        snprintf(key, sizeof key, i % 97 == 0 ? "none%d" : "k%d", i);
        if (i % N_CACHES == 2 && group_of(caches[2], strlen(caches[2]), key, strlen(key), n) == p) {
            internal_all++;
            internal_live += i % 5 != 0;
        }
    }
    heard h = {.n = n, .p = p};
    drey_store_observer o = {.fn = hear, .ctx = &h};
    drey_store_set_observer(s, &o);
    drey_store_stats st0, st1;
    drey_store_get_stats(s, &st0);
    uint64_t removed = drey_store_partition_remove(s, p, now);
    drey_store_set_observer(s, NULL);
    drey_store_get_stats(s, &st1);

    cr_assert_eq(removed, live.t.entries, "the live entries removed are counted");
    cr_assert(!h.strays, "the observer heard only of partition %u", p);
    cr_assert_eq(h.others, 0);
    cr_assert_eq(h.removes, live.t.entries - internal_live);
    cr_assert_eq(h.expires, before.t[p].entries - live.t.entries - (internal_all - internal_live));
    drey_store_partition_stats gone;
    drey_store_get_partition_stats(s, p, &gone);
    cr_assert_eq(gone.entries, 0);
    cr_assert_eq(gone.bytes, 0);
    cr_assert_eq(gone.expiring, 0);
    cr_assert_eq(part_walk(s, n, p, INT64_MIN, 10).t.entries, 0, "expired entries went too");
    cr_assert_eq(st0.entries - st1.entries, ps[p].entries, "the store lost exactly the partition's entries");
    cr_assert_eq((uint64_t)(st0.bytes - st1.bytes), ps[p].bytes);
    by_partition after = full_walk(s, n, INT64_MIN);
    for (uint32_t q = 0; q <= n; q++) {
        if (q == p)
            continue;
        same_tally(&after.t[q], &before.t[q], "another partition", q);
        drey_store_partition_stats x;
        drey_store_get_partition_stats(s, q, &x);
        cr_assert_eq(x.entries, ps[q].entries, "partition %u's figures", q);
        cr_assert_eq(x.bytes, ps[q].bytes);
    }
    agrees(s, n, now);
    /* The emptied partition takes writes again. */
    char key[24];
    keys_in(n, p, "again", (char(*)[24])key, 1);
    put("", key, "v", 0);
    drey_store_get_partition_stats(s, p, &gone);
    cr_assert_eq(gone.entries, 1);
    free(before.t);
    free(after.t);
}

/* Removing the group of no partition, and the entries of a cleared cache:
 * both go, and the figures stay whole. */
Test(store_partition, removal_takes_entries_of_cleared_caches_and_the_group_of_none) {
    const uint32_t n = 4;
    cr_assert(drey_store_set_partitions(s, n, test_part));
    for (int i = 0; i < 400; i++) {
        char key[16];
        snprintf(key, sizeof key, i % 4 == 0 ? "none%d" : "k%d", i);
        put(i % 2 ? "users" : "", key, "v", 0);
    }
    cr_assert_gt(drey_store_clear_cache(s, "users", 5), 0);
    drey_store_stats st;
    drey_store_get_stats(s, &st);
    cr_assert_gt(st.clearing, 0);
    uint64_t live = 0;
    for (uint32_t p = 0; p <= n; p++)
        live += drey_store_partition_remove(s, p, T0);
    cr_assert_eq(live, 200, "only the default cache's entries were live");
    drey_store_get_stats(s, &st);
    cr_assert_eq(st.entries, 0);
    cr_assert_eq(st.bytes, 0);
    cr_assert_eq(st.clearing, 0, "the cleared cache's entries were freed");
    cr_assert_eq(drey_store_bytes(s), 0);
    drey_cache_stats cs;
    drey_store_cache_stats(s, "users", 5, &cs);
    cr_assert_eq(cs.entries, 0);
}

/* --- the rest of the store on a partitioned layout -------------------------------------- */

static void count_item(void *arg, const drey_store_item *it) {
    (void)it;
    (*(size_t *)arg)++;
}

Test(store_partition, scans_captures_and_reads_see_a_partitioned_store_whole) {
    const uint32_t n = 1000; /* more tables than stripes */
    cr_assert(drey_store_set_partitions(s, n, test_part));
    for (int i = 0; i < 2000; i++) {
        char key[16];
        snprintf(key, sizeof key, "k%d", i);
        put("users", key, "v", 0);
    }
    size_t got = 0;
    drey_store_scan_pos pos = {0, 0};
    while (pos.shard != DREY_STORE_SCAN_DONE)
        drey_store_scan(s, "users", 5, "", 0, T0, &pos, 37, 1000, count_item, &got);
    cr_assert_eq(got, 2000, "a scan covers every table");
    cr_assert(drey_store_scan_pos_valid(s, &(drey_store_scan_pos){n, 0}), "n + 1 tables: one per partition, one for none");
    cr_assert(!drey_store_scan_pos_valid(s, &(drey_store_scan_pos){n + 1, 0}));
    captured cap = {0};
    drey_store_capture_begin(s, on_capture, &cap, T0);
    drey_store_capture_end(s);
    cr_assert_eq(cap.n, 2000, "a capture takes every entry once");
    for (size_t i = 0; i < cap.n; i++)
        free(cap.copies[i]);
    free(cap.items);
    free(cap.copies);
    drey_store_reserve(s, 100000);
    drey_store_stats st;
    drey_store_get_stats(s, &st);
    cr_assert_eq(st.entries, 2000);
    for (int i = 0; i < 2000; i += 97) {
        char key[16];
        snprintf(key, sizeof key, "k%d", i);
        drey_key k = key_of(s, "users", key);
        cr_assert_gt(drey_store_entry_size(s, &k, T0), 0, "%s is found where its key says", key);
    }
}

Test(store_partition, scan_positions_past_the_tables_are_invalid) {
    cr_assert(drey_store_scan_pos_valid(s, &(drey_store_scan_pos){255, 0}));
    cr_assert(!drey_store_scan_pos_valid(s, &(drey_store_scan_pos){256, 0}), "a standalone store has 256 tables");
    cr_assert(drey_store_scan_pos_valid(s, &(drey_store_scan_pos){DREY_STORE_SCAN_DONE, 0}));
    cr_assert(drey_store_set_partitions(s, 16, test_part));
    /* 17 groups of 16 tables */
    cr_assert(drey_store_scan_pos_valid(s, &(drey_store_scan_pos){17 * 16 - 1, 0}));
    cr_assert(!drey_store_scan_pos_valid(s, &(drey_store_scan_pos){17 * 16, 0}));
}

Test(store_partition, a_store_not_partitioned_has_no_partitions) {
    put("", "k", "v", 0);
    cr_assert_eq(drey_store_partitions(s), 0);
    drey_store_scan_pos pos = {0, 0};
    size_t got = 0;
    cr_assert_eq(drey_store_partition_walk(s, 0, T0, &pos, 10, count_item, &got), 0);
    cr_assert_eq(pos.shard, DREY_STORE_SCAN_DONE);
    cr_assert_eq(got, 0);
    cr_assert_eq(drey_store_partition_remove(s, 0, T0), 0);
    drey_store_partition_stats ps;
    drey_store_get_partition_stats(s, 0, &ps);
    cr_assert_eq(ps.entries, 0);
    drey_store_stats st;
    drey_store_get_stats(s, &st);
    cr_assert_eq(st.entries, 1, "the entry is still there");
    atomic_store(&fn_calls, 0);
    put("", "k2", "v", 0);
    cr_assert_eq(atomic_load(&fn_calls), 0, "a standalone store never asks where an entry belongs");
}

Test(store_partition, bad_counts_are_refused_and_change_nothing) {
    for (int i = 0; i < 100; i++) {
        char key[16];
        snprintf(key, sizeof key, "k%d", i);
        put("", key, "v", 0);
    }
    cr_assert(!drey_store_set_partitions(s, 0, test_part));
    cr_assert(!drey_store_set_partitions(s, DREY_STORE_MAX_PARTITIONS + 1, test_part));
    cr_assert(!drey_store_set_partitions(s, 16, NULL));
    cr_assert_eq(drey_store_partitions(s), 0);
    cr_assert(drey_store_set_partitions(s, 16, test_part));
    atomic_store(&fn_calls, 0);
    cr_assert(drey_store_set_partitions(s, 16, test_part), "the same count again");
    cr_assert_eq(atomic_load(&fn_calls), 0, "changed nothing: no entry was placed again");
    cr_assert(!drey_store_set_partitions(s, 0, test_part));
    cr_assert_eq(drey_store_partitions(s), 16);
    agrees(s, 16, T0);
    /* A partition past the count is none the store has. */
    drey_store_scan_pos pos = {0, 0};
    size_t got = 0;
    drey_store_partition_walk(s, 17, T0, &pos, 10, count_item, &got);
    cr_assert_eq(pos.shard, DREY_STORE_SCAN_DONE);
    cr_assert_eq(got, 0);
    cr_assert_eq(drey_store_partition_remove(s, 17, T0), 0);
    drey_store_stats st;
    drey_store_get_stats(s, &st);
    cr_assert_eq(st.entries, 100);
}

Test(store_partition, the_largest_count_works) {
    cr_assert(drey_store_set_partitions(s, DREY_STORE_MAX_PARTITIONS, test_part));
    for (int i = 0; i < 500; i++) {
        char key[16];
        snprintf(key, sizeof key, "k%d", i);
        put("", key, "v", 0);
    }
    drey_store_stats st;
    drey_store_get_stats(s, &st);
    cr_assert_eq(st.entries, 500);
    uint32_t p = group_of("", 0, "k7", 2, DREY_STORE_MAX_PARTITIONS);
    walked w = part_walk(s, DREY_STORE_MAX_PARTITIONS, p, T0, 10);
    cr_assert_geq(w.t.entries, 1);
    cr_assert(!w.strays);
}

/* A table with many caches (the per-cache rows grow, and rows leave from
 * the middle of probe runs): each cache's figures within the partition stay
 * its figures, and the listing names exactly the caches that hold entries. */
static void count_listed(void *arg, const drey_cache_stats *c) {
    size_t *n = arg;
    (*n)++;
    cr_assert_gt(c->entries, 0);
}

Test(store_partition, a_table_keeps_many_caches_apart) {
    const uint32_t n = 256, p = 11; /* one table per partition */
    cr_assert(drey_store_set_partitions(s, n, test_part));
    enum { CACHES = 300, KEYS = 3 };
    static char names[CACHES][16], keys[CACHES][KEYS][24];
    for (int c = 0; c < CACHES; c++) {
        snprintf(names[c], sizeof names[c], "c%d", c);
        size_t found = 0;
        for (unsigned i = 0; found < KEYS; i++) {
            snprintf(keys[c][found], sizeof keys[c][found], "k%u", i);
            found += group_of(names[c], strlen(names[c]), keys[c][found], strlen(keys[c][found]), n) == p;
        }
    }
    bool held[CACHES][KEYS] = {{false}};
    rng = 42;
    for (int round = 0; round < 20; round++) {
        for (int i = 0; i < 400; i++) {
            int c = (int)(rnd() % CACHES), k = (int)(rnd() % KEYS);
            if (rnd() % 2) {
                put(names[c], keys[c][k], "value", rnd() % 4 == 0 ? T0 + 1000 : 0);
                held[c][k] = true;
            } else {
                del(names[c], keys[c][k]);
                held[c][k] = false;
            }
        }
        size_t holding = 0;
        for (int c = 0; c < CACHES; c++) {
            drey_cache_stats in_p, whole;
            drey_store_partition_cache_stats(s, p, names[c], strlen(names[c]), &in_p);
            drey_store_cache_stats(s, names[c], strlen(names[c]), &whole);
            uint64_t want = (uint64_t)held[c][0] + held[c][1] + held[c][2];
            cr_assert_eq(in_p.entries, want, "round %d, cache %s", round, names[c]);
            cr_assert_eq(in_p.entries, whole.entries);
            cr_assert_eq(in_p.bytes, whole.bytes);
            cr_assert_eq(in_p.expiring, whole.expiring);
            holding += want > 0;
        }
        size_t listed = 0;
        drey_store_partition_list_caches(s, p, count_listed, &listed);
        cr_assert_eq(listed, holding, "round %d: the caches holding entries, each once", round);
    }
}
