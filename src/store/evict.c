/*
 * evict — what to evict under memory pressure; see drey_store_evict_choose
 * in include/drey/store.h.
 *
 * The approach is Redis's (src/evict.c): no exact LRU list or LFU heap,
 * whose upkeep would cost every read a lock; instead each entry keeps a
 * 32-bit access word, updated with a relaxed store under the shard's read
 * lock, and choosing a victim samples a few random entries into a small
 * pool that stays sorted by how evictable they are. The pool outlives each
 * choice, so good candidates seen earlier are still there: with 5 samples
 * and 16 pool slots this comes close to true LRU (Redis's measurements, and
 * ours in tests/bench/results). Unlike Redis, a candidate is scored again
 * when it leaves the pool: one read since it was sampled goes back in with
 * its new score instead of being evicted on the stale one.
 *
 * LFU is Redis's Morris counter: 8 bits that grow with probability
 * 1/((c - 5) * 10 + 1) per access, new entries starting at 5 so they are not
 * the first evicted, and losing one per idle minute; its time is kept in
 * 16 ms units (Redis: minutes), so equally frequent entries go least
 * recently used first. Entries that have expired but were not yet freed are
 * always the best victims; internal caches ('#...': remembered outcomes of
 * idempotent writes) never are.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "drey/alloc.h"
#include "internal.h"

#define SAMPLES 5           /* Redis's maxmemory-samples default */
#define SAMPLE_BUCKETS 64   /* buckets probed at most per sample */
#define LFU_INIT 5
#define LFU_LOG_FACTOR 10
#define LFU_DECAY_MINUTES 1
#define EMPTY_ROUNDS 16     /* rounds in a row whose candidates were all gone or taken */

const char *drey_evict_policy_name(drey_evict_policy p) {
    switch (p) {
    case DREY_EVICT_NONE: return "none";
    case DREY_EVICT_ALLKEYS_LRU: return "allkeys-lru";
    case DREY_EVICT_ALLKEYS_LFU: return "allkeys-lfu";
    case DREY_EVICT_VOLATILE_LRU: return "volatile-lru";
    case DREY_EVICT_VOLATILE_TTL: return "volatile-ttl";
    }
    return "?";
}

bool drey_evict_policy_parse(const char *s, drey_evict_policy *out) {
    for (int p = DREY_EVICT_NONE; p <= DREY_EVICT_VOLATILE_TTL; p++) {
        if (strcmp(s, drey_evict_policy_name((drey_evict_policy)p)) == 0) {
            *out = (drey_evict_policy)p;
            return true;
        }
    }
    return false;
}

void drey_store_set_policy(drey_store *s, drey_evict_policy p) {
    s->policy = p;
}

drey_evict_policy drey_store_policy(const drey_store *s) {
    return s->policy;
}

/* The access clock: monotonic, so wall-clock jumps do not make everything
 * look idle; milliseconds (the coarse clock's 4 ms made a burst of writes
 * look equally old). */
static uint64_t access_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static uint64_t rnd(void) {
    static _Thread_local uint64_t x;
    if (x == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        x = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)(uintptr_t)&x ^ 0x9e3779b97f4a7c15ULL;
    }
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27; /* xorshift64* */
    return x * 0x2545f4914f6cdd1dULL;
}

static bool is_lfu(const drey_store *s) {
    return s->policy == DREY_EVICT_ALLKEYS_LFU;
}

static bool is_lru(const drey_store *s) {
    return s->policy == DREY_EVICT_ALLKEYS_LRU || s->policy == DREY_EVICT_VOLATILE_LRU;
}

/* LFU's time: 16 ms units in 24 bits (74 hours before it wraps; an entry
 * idle that long has long decayed to 0 unless read meanwhile, and at worst
 * looks less idle than it is). Finer than Redis's minutes so that among
 * entries of equal frequency the least recently used goes first. */
#define LFU_UNIT_MS 16
#define LFU_UNITS_PER_DECAY (60000 * LFU_DECAY_MINUTES / LFU_UNIT_MS)

static uint32_t lfu_now(void) {
    return (uint32_t)(access_ms() / LFU_UNIT_MS) & 0xffffff;
}

static uint32_t lfu_idle(uint32_t word, uint32_t now) {
    return (now - (word >> 8)) & 0xffffff;
}

/* The counter after the decay periods since the word's time. */
static uint32_t lfu_decayed(uint32_t word, uint32_t now) {
    uint32_t counter = word & 0xff;
    uint32_t periods = lfu_idle(word, now) / LFU_UNITS_PER_DECAY;
    return periods > counter ? 0 : counter - periods;
}

static uint32_t lfu_incr(uint32_t counter) {
    if (counter >= 255)
        return 255;
    uint32_t base = counter > LFU_INIT ? counter - LFU_INIT : 0;
    /* 2^-53 resolution is plenty for a probability at least 1/2500. */
    double r = (double)(rnd() >> 11) / 9007199254740992.0;
    return r < 1.0 / (base * LFU_LOG_FACTOR + 1) ? counter + 1 : counter;
}

void drey_store__touch(drey_store *s, entry *e) {
    if (is_lru(s)) {
        __atomic_store_n(&e->access, (uint32_t)access_ms(), __ATOMIC_RELAXED);
    } else if (is_lfu(s)) {
        uint32_t now = lfu_now();
        uint32_t c = lfu_incr(lfu_decayed(__atomic_load_n(&e->access, __ATOMIC_RELAXED), now));
        __atomic_store_n(&e->access, now << 8 | c, __ATOMIC_RELAXED);
    }
}

uint32_t drey_store__access_new(drey_store *s, uint32_t old, bool replacing) {
    if (is_lru(s))
        return (uint32_t)access_ms();
    if (is_lfu(s)) {
        uint32_t now = lfu_now();
        return now << 8 | (replacing ? lfu_incr(lfu_decayed(old, now)) : LFU_INIT);
    }
    return 0;
}

/* How evictable e is (higher first), or false if the policy never evicts
 * it. */
static bool score_of(drey_store *s, const entry *e, int64_t now_ms, uint64_t mono_now, uint32_t now_lfu,
                     uint64_t *score) {
    if (e->cache_len > 0 && e->data[0] == '#')
        return false; /* internal caches */
    if (drey_store__slot(s, e->cache_id)->retired)
        return false; /* cleared: the sweep frees it */
    bool volatile_only = s->policy == DREY_EVICT_VOLATILE_LRU || s->policy == DREY_EVICT_VOLATILE_TTL;
    if (volatile_only && e->expires_at_ms == 0)
        return false;
    if (e->expires_at_ms != 0 && e->expires_at_ms <= now_ms) {
        *score = UINT64_MAX; /* expired already: invisible, only its memory is left */
        return true;
    }
    uint32_t a = __atomic_load_n(&e->access, __ATOMIC_RELAXED);
    switch (s->policy) {
    case DREY_EVICT_ALLKEYS_LRU:
    case DREY_EVICT_VOLATILE_LRU: *score = (uint32_t)((uint32_t)mono_now - a); return true;
    case DREY_EVICT_ALLKEYS_LFU:
        *score = (uint64_t)(255 - lfu_decayed(a, now_lfu)) << 32 | lfu_idle(a, now_lfu);
        return true;
    case DREY_EVICT_VOLATILE_TTL: *score = UINT64_MAX - 1 - (uint64_t)e->expires_at_ms; return true;
    case DREY_EVICT_NONE: break;
    }
    return false;
}

/* Inserts a candidate, keeping the pool sorted ascending and its best
 * EVICT_POOL. Pool lock held. */
static void pool_insert(drey_store *s, const entry *e, uint64_t score) {
    for (size_t i = 0; i < s->pool_len; i++) {
        if (s->pool[i].version == e->version)
            return; /* versions are unique: already a candidate */
    }
    size_t k = 0;
    while (k < s->pool_len && s->pool[k].score < score)
        k++;
    pool_entry pe;
    if (s->pool_len == EVICT_POOL) {
        if (k == 0)
            return; /* worse than every candidate */
        /* Drop the worst, making room below k. */
        pe = s->pool[0];
        memmove(&s->pool[0], &s->pool[1], (k - 1) * sizeof pe);
        k--;
    } else {
        memmove(&s->pool[k + 1], &s->pool[k], (s->pool_len - k) * sizeof pe);
        pe.name = NULL;
        s->pool_len++;
    }
    size_t n = (size_t)e->cache_len + e->key_len;
    char *name = drey_xrealloc(pe.name, n, 1);
    memcpy(name, e->data, n);
    s->pool[k] = (pool_entry){
        .score = score, .version = e->version, .cache_len = e->cache_len, .key_len = e->key_len, .name = name};
}

static size_t shard_evictable(const drey_store *s, const shard *sh) {
    bool volatile_only = s->policy == DREY_EVICT_VOLATILE_LRU || s->policy == DREY_EVICT_VOLATILE_TTL;
    return atomic_load_explicit(volatile_only ? &sh->evictable_expiring : &sh->evictable, memory_order_relaxed);
}

/* Samples SAMPLES eligible entries into the pool, table after table from
 * a random one (a small store has about one entry per table); returns how
 * many were eligible (0: no table holds anything the policy may evict).
 * Thorough: probe whole tables, not SAMPLE_BUCKETS buckets from a random
 * one (after a sample found nothing, so a rare eligible entry is found). */
static bool allowed(const drey_store_filter *only, const entry *e) {
    if (only == NULL)
        return true;
    if (only->tenant != 0 && drey_store__tenant(e) != only->tenant)
        return false;
    return only->keep == NULL ||
           only->keep(only->ctx, (const char *)e->data, e->cache_len, (const char *)e->data + e->cache_len, e->key_len);
}

static size_t populate(drey_store *s, int64_t now_ms, bool thorough, const drey_store_filter *only) {
    uint64_t mono = access_ms();
    uint32_t now_lfu = lfu_now();
    layout *L = drey_store__layout(s);
    size_t start = (size_t)rnd(), eligible = 0;
    for (size_t i = 0; i < L->n_tables && eligible < SAMPLES; i++) {
        size_t t = (start + i) % L->n_tables;
        shard *sh = &L->tables[t];
        if (shard_evictable(s, sh) == 0)
            continue;
        pthread_rwlock_t *lock = drey_store__lock_of(s, t);
        pthread_rwlock_rdlock(lock);
        if (drey_store__layout(s) != L) {
            pthread_rwlock_unlock(lock); /* partitioned meanwhile: this table is gone */
            break;
        }
        size_t nb = sh->mask + 1;
        size_t probes = thorough || nb < SAMPLE_BUCKETS ? nb : SAMPLE_BUCKETS;
        size_t b = (size_t)rnd() & sh->mask;
        for (size_t p = 0; p < probes && eligible < SAMPLES; p++, b = (b + 1) & sh->mask) {
            for (const entry *e = sh->buckets[b]; e != NULL && eligible < SAMPLES; e = e->next) {
                uint64_t score;
                if (allowed(only, e) && score_of(s, e, now_ms, mono, now_lfu, &score)) {
                    pool_insert(s, e, score);
                    eligible++;
                }
            }
        }
        pthread_rwlock_unlock(lock);
    }
    return eligible;
}

/* Pops the best candidate that still exists with its version and gives it
 * to fn; returns its bytes, 0 when the pool held none. A candidate read
 * since it was sampled scores lower now: it goes back into the pool with
 * its new score when another candidate now beats it (Redis evicts on the
 * stale score; this keeps a key read a moment ago). Pool lock held. */
static size_t pop_victim(drey_store *s, int64_t now_ms, const drey_store_filter *only,
                         void (*fn)(void *arg, const drey_store_item *victim, size_t bytes), void *arg,
                         const uint64_t *taken, size_t n_taken, uint64_t *version) {
    uint64_t mono = access_ms();
    uint32_t now_lfu = lfu_now();
    for (size_t rescored = 0; s->pool_len > 0;) {
        pool_entry pe = s->pool[--s->pool_len];
        bool dup = false;
        for (size_t i = 0; i < n_taken; i++)
            dup |= taken[i] == pe.version;
        size_t bytes = 0;
        if (!dup) {
            layout *L = drey_store__layout(s);
            drey_key k;
            drey_store_key(s, &k, pe.name, pe.cache_len, pe.name + pe.cache_len, pe.key_len);
            pthread_rwlock_t *lock = drey_store__lock_of(s, k.table);
            pthread_rwlock_rdlock(lock);
            entry *e = NULL;
            if (drey_store__layout(s) == L) { /* else the key may name a table of another layout */
                shard *sh = &L->tables[k.table];
                e = sh->buckets[(uint32_t)k.hash & sh->mask];
                while (e != NULL && !drey_store__matches(e, &k))
                    e = e->next;
            }
            uint64_t now_score;
            /* A candidate another choice sampled may be one this one may
             * not take: it goes (it is sampled again when wanted). */
            if (e != NULL && e->version == pe.version && allowed(only, e) &&
                score_of(s, e, now_ms, mono, now_lfu, &now_score)) {
                if (rescored < 2 * EVICT_POOL && s->pool_len > 0 && now_score < s->pool[s->pool_len - 1].score) {
                    rescored++;
                    pool_insert(s, e, now_score);
                } else {
                    bytes = drey_store__entry_bytes(e);
                    *version = e->version;
                    drey_store_item it = {
                        .cache = (const char *)e->data,
                        .cache_len = e->cache_len,
                        .key = (const char *)e->data + e->cache_len,
                        .key_len = e->key_len,
                        .tenant = drey_store__tenant(e),
                    };
                    it.entry.version = e->version;
                    it.entry.expires_at_ms = e->expires_at_ms;
                    fn(arg, &it, bytes);
                }
            }
            pthread_rwlock_unlock(lock);
        }
        free(pe.name);
        if (bytes > 0)
            return bytes;
    }
    return 0;
}

int64_t drey_store_evict_choose(drey_store *s, int64_t now_ms, int64_t need_bytes, size_t max_victims,
                                const drey_store_filter *only,
                                void (*fn)(void *arg, const drey_store_item *victim, size_t bytes), void *arg) {
    if (s->policy == DREY_EVICT_NONE || need_bytes <= 0 || max_victims == 0)
        return 0;
    uint64_t *taken = drey_xcalloc(max_victims, sizeof *taken);
    size_t n = 0, empty = 0;
    int64_t chosen = 0;
    pthread_mutex_lock(&s->pool_mu);
    while (chosen < need_bytes && n < max_victims && empty < EMPTY_ROUNDS) {
        size_t found = populate(s, now_ms, empty > 0, only);
        if (found == 0 && s->pool_len == 0)
            break; /* nothing the policy may evict */
        uint64_t version = 0;
        size_t bytes = pop_victim(s, now_ms, only, fn, arg, taken, n, &version);
        if (bytes == 0) {
            empty++;
            continue;
        }
        taken[n] = version;
        empty = 0;
        chosen += (int64_t)bytes;
        n++;
    }
    pthread_mutex_unlock(&s->pool_mu);
    free(taken);
    return chosen;
}
