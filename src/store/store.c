/*
 * store — sharded hash table of cache entries; see include/drey/store.h.
 *
 * The top 8 bits of the 64-bit key hash pick the shard, the low 32 bits the
 * bucket, so a shard can grow without rehashing into other shards. Each shard
 * keeps a load factor between 1/8 and 1 by doubling or halving its bucket
 * array under its write lock (a few microseconds per thousand entries).
 */
#include "drey/store.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "drey/alloc.h"
#include "siphash.h"

#define SHARD_MIN_BUCKETS 16

typedef struct entry {
    struct entry *next;    /* bucket chain */
    uint64_t version;
    int64_t expires_at_ms; /* 0 = never */
    uint32_t hash;         /* low 32 bits of the key hash */
    uint32_t value_len;
    uint16_t key_len;
    uint8_t cache_len;
    uint8_t kind;          /* drey_value_kind */
    unsigned char data[];  /* cache name, key, value */
} entry;

typedef struct shard {
    pthread_rwlock_t lock;
    entry **buckets;
    size_t mask;         /* bucket count - 1 */
    size_t count;        /* entries, including expired ones */
    size_t bytes;        /* accounted bytes */
    size_t sweep_cursor; /* next bucket the expiry sweep visits */
    /* Entries with an expiry, changed under the write lock. The sweep reads
     * it without the lock to pass over shards with nothing to expire: a
     * stale read only delays a sweep, as reads expire entries themselves. */
    _Atomic size_t expiring;
} __attribute__((aligned(64))) shard;

struct drey_store {
    shard shards[DREY_STORE_SHARDS];
    /* The capture in progress (see drey_store_capture_begin). */
    _Atomic bool capture_pending[DREY_STORE_SHARDS];
    drey_store_capture_fn capture_fn;
    void *capture_ctx;
    int64_t capture_live_at;
    uint8_t seed[16];
    _Atomic uint64_t version;
    _Atomic int64_t bytes;      /* sum of the shards' accounted bytes */
    _Atomic size_t sweep_shard; /* shard the next sweep step starts in */
    _Atomic uint64_t expired_swept;
};

static shard *shard_of(drey_store *s, uint64_t hash) {
    return &s->shards[hash >> 56];
}

static size_t shard_index(uint64_t hash) {
    return (size_t)(hash >> 56);
}

drey_store *drey_store_create(void) {
    drey_store *s = drey_xaligned(64, sizeof *s);
    memset(s, 0, sizeof *s);
    if (getrandom(s->seed, sizeof s->seed, 0) != (ssize_t)sizeof s->seed)
        abort();
    for (size_t i = 0; i < DREY_STORE_SHARDS; i++) {
        shard *sh = &s->shards[i];
        pthread_rwlock_init(&sh->lock, NULL);
        sh->buckets = drey_xcalloc(SHARD_MIN_BUCKETS, sizeof(entry *));
        sh->mask = SHARD_MIN_BUCKETS - 1;
    }
    return s;
}

static void free_entries(shard *sh) {
    for (size_t b = 0; b <= sh->mask; b++) {
        entry *e = sh->buckets[b];
        while (e != NULL) {
            entry *next = e->next;
            free(e);
            e = next;
        }
        sh->buckets[b] = NULL;
    }
    sh->count = 0;
    sh->bytes = 0;
    atomic_store_explicit(&sh->expiring, 0, memory_order_relaxed);
}

void drey_store_destroy(drey_store *s) {
    if (s == NULL)
        return;
    for (size_t i = 0; i < DREY_STORE_SHARDS; i++) {
        shard *sh = &s->shards[i];
        free_entries(sh);
        free(sh->buckets);
        pthread_rwlock_destroy(&sh->lock);
    }
    free(s);
}

void drey_store_clear(drey_store *s) {
    for (size_t i = 0; i < DREY_STORE_SHARDS; i++) {
        shard *sh = &s->shards[i];
        pthread_rwlock_wrlock(&sh->lock);
        atomic_fetch_sub_explicit(&s->bytes, (int64_t)sh->bytes, memory_order_relaxed);
        free_entries(sh);
        pthread_rwlock_unlock(&sh->lock);
    }
}

void drey_store_key(const drey_store *s, drey_key *k, const char *cache, size_t cache_len, const char *key,
                    size_t key_len) {
    if (cache_len > 255 || key_len > UINT16_MAX)
        abort(); /* validation bounds both far below this */
    if (cache_len == 7 && memcmp(cache, "default", 7) == 0)
        cache_len = 0;
    k->cache = cache_len == 0 ? "" : cache;
    k->cache_len = cache_len;
    k->key = key;
    k->key_len = key_len;
    /* The cache name is prefixed by its length so ("ab","c") and ("a","bc")
     * hash differently. */
    uint8_t prefix[256];
    prefix[0] = (uint8_t)cache_len;
    memcpy(prefix + 1, cache, cache_len);
    k->hash = drey_store__siphash2(s->seed, prefix, cache_len + 1, key, key_len);
}

size_t drey_store_entry_bytes(size_t cache_len, size_t key_len, size_t value_len) {
    return offsetof(entry, data) + cache_len + key_len + value_len + sizeof(entry *);
}

static size_t entry_bytes(const entry *e) {
    return drey_store_entry_bytes(e->cache_len, e->key_len, e->value_len);
}

static bool is_live(const entry *e, int64_t now_ms) {
    return e->expires_at_ms == 0 || e->expires_at_ms > now_ms;
}

static bool matches(const entry *e, const drey_key *k) {
    return e->hash == (uint32_t)k->hash && e->key_len == k->key_len && e->cache_len == k->cache_len &&
           memcmp(e->data, k->cache, k->cache_len) == 0 && memcmp(e->data + k->cache_len, k->key, k->key_len) == 0;
}

/* The slot pointing at the key's entry (or at the NULL ending its chain). */
static entry **find_slot(shard *sh, const drey_key *k) {
    entry **slot = &sh->buckets[(uint32_t)k->hash & sh->mask];
    while (*slot != NULL && !matches(*slot, k))
        slot = &(*slot)->next;
    return slot;
}

static void view_of(const entry *e, drey_entry_view *v) {
    v->value.kind = (drey_value_kind)e->kind;
    v->value.data = e->data + e->cache_len + e->key_len;
    v->value.len = e->value_len;
    v->version = e->version;
    v->expires_at_ms = e->expires_at_ms;
}

static void resize(shard *sh, size_t nbuckets) {
    entry **nb = drey_xcalloc(nbuckets, sizeof(entry *));
    size_t nmask = nbuckets - 1;
    for (size_t b = 0; b <= sh->mask; b++) {
        entry *e = sh->buckets[b];
        while (e != NULL) {
            entry *next = e->next;
            entry **dst = &nb[e->hash & nmask];
            e->next = *dst;
            *dst = e;
            e = next;
        }
    }
    free(sh->buckets);
    sh->buckets = nb;
    sh->mask = nmask;
    sh->sweep_cursor &= nmask;
}

/* Accounted bytes change here and only here (and in free_entries). */
static void account(drey_store *s, shard *sh, int64_t delta) {
    sh->bytes += (size_t)delta;
    atomic_fetch_add_explicit(&s->bytes, delta, memory_order_relaxed);
}

/* Keeps a shard's count of expiring entries as an entry's expiry goes from
 * `from` to `to` (0: never; an entry inserted comes from 0, one freed goes
 * to 0). */
static void track_expiry(shard *sh, int64_t from, int64_t to) {
    if ((from != 0) != (to != 0))
        atomic_fetch_add_explicit(&sh->expiring, to != 0 ? 1 : (size_t)-1, memory_order_relaxed);
}

static void unlink_free(drey_store *s, shard *sh, entry **slot) {
    entry *e = *slot;
    *slot = e->next;
    sh->count--;
    track_expiry(sh, e->expires_at_ms, 0);
    account(s, sh, -(int64_t)entry_bytes(e));
    free(e);
    if (sh->mask + 1 > SHARD_MIN_BUCKETS && sh->count < (sh->mask + 1) / 8)
        resize(sh, (sh->mask + 1) / 2);
}

bool drey_store_read(drey_store *s, const drey_key *k, int64_t now_ms,
                     void (*fn)(void *arg, const drey_entry_view *e), void *arg) {
    shard *sh = shard_of(s, k->hash);
    pthread_rwlock_rdlock(&sh->lock);
    entry *e = *find_slot(sh, k);
    bool found = e != NULL && is_live(e, now_ms);
    if (found) {
        drey_entry_view v;
        view_of(e, &v);
        fn(arg, &v);
    }
    pthread_rwlock_unlock(&sh->lock);
    return found;
}

uint64_t drey_store_next_version(drey_store *s) {
    return atomic_fetch_add_explicit(&s->version, 1, memory_order_relaxed) + 1;
}

uint64_t drey_store_last_version(const drey_store *s) {
    return atomic_load_explicit(&s->version, memory_order_relaxed);
}

void drey_store_raise_version(drey_store *s, uint64_t at_least) {
    uint64_t cur = atomic_load_explicit(&s->version, memory_order_relaxed);
    while (cur < at_least &&
           !atomic_compare_exchange_weak_explicit(&s->version, &cur, at_least, memory_order_relaxed,
                                                  memory_order_relaxed)) {
    }
}

/* Hands a shard to the capture if it is still marked. Called with the
 * shard locked. */
static void capture_if_pending(drey_store *s, size_t idx) {
    if (!atomic_exchange(&s->capture_pending[idx], false))
        return;
    shard *sh = &s->shards[idx];
    for (size_t b = 0; b <= sh->mask; b++) {
        for (const entry *e = sh->buckets[b]; e != NULL; e = e->next) {
            if (!is_live(e, s->capture_live_at))
                continue;
            drey_store_item it = {
                .cache = (const char *)e->data,
                .cache_len = e->cache_len,
                .key = (const char *)e->data + e->cache_len,
                .key_len = e->key_len,
            };
            view_of(e, &it.entry);
            s->capture_fn(s->capture_ctx, idx, &it);
        }
    }
    s->capture_fn(s->capture_ctx, idx, NULL);
}

void drey_store_capture_begin(drey_store *s, drey_store_capture_fn fn, void *ctx, int64_t live_at_ms) {
    s->capture_fn = fn;
    s->capture_ctx = ctx;
    s->capture_live_at = live_at_ms;
    for (size_t i = 0; i < DREY_STORE_SHARDS; i++)
        atomic_store(&s->capture_pending[i], true);
}

void drey_store_capture_shard(drey_store *s, size_t idx) {
    shard *sh = &s->shards[idx];
    pthread_rwlock_rdlock(&sh->lock);
    capture_if_pending(s, idx);
    pthread_rwlock_unlock(&sh->lock);
}

void drey_store_capture_end(drey_store *s) {
    for (size_t i = 0; i < DREY_STORE_SHARDS; i++)
        drey_store_capture_shard(s, i);
    s->capture_fn = NULL;
    s->capture_ctx = NULL;
}

void drey_store_reserve(drey_store *s, size_t n) {
    size_t per = n / DREY_STORE_SHARDS + 1, want = SHARD_MIN_BUCKETS;
    while (want < per && want <= SIZE_MAX / 4) /* doubling past that would wrap to 0 and never end */
        want *= 2;
    for (size_t i = 0; i < DREY_STORE_SHARDS; i++) {
        shard *sh = &s->shards[i];
        pthread_rwlock_wrlock(&sh->lock);
        if (sh->mask + 1 < want)
            resize(sh, want);
        pthread_rwlock_unlock(&sh->lock);
    }
}

void drey_store_load(drey_store *s, const drey_store_item *item) {
    drey_key k;
    drey_store_key(s, &k, item->cache, item->cache_len, item->key, item->key_len);
    shard *sh = shard_of(s, k.hash);
    const drey_value *v = &item->entry.value;
    entry *e = drey_xmalloc(offsetof(entry, data) + k.cache_len + k.key_len + v->len);
    e->version = item->entry.version;
    e->expires_at_ms = item->entry.expires_at_ms;
    e->hash = (uint32_t)k.hash;
    e->value_len = v->len;
    e->key_len = (uint16_t)k.key_len;
    e->cache_len = (uint8_t)k.cache_len;
    e->kind = (uint8_t)v->kind;
    memcpy(e->data, k.cache, k.cache_len);
    memcpy(e->data + k.cache_len, k.key, k.key_len);
    if (v->len > 0)
        memcpy(e->data + k.cache_len + k.key_len, v->data, v->len);
    pthread_rwlock_wrlock(&sh->lock);
    entry **slot = &sh->buckets[e->hash & sh->mask];
    e->next = *slot;
    *slot = e;
    sh->count++;
    track_expiry(sh, 0, e->expires_at_ms);
    account(s, sh, (int64_t)entry_bytes(e));
    if (sh->count > sh->mask + 1)
        resize(sh, (sh->mask + 1) * 2);
    pthread_rwlock_unlock(&sh->lock);
}

void drey_store_txn_begin(drey_store *s, drey_store_txn *t, const drey_key *keys, size_t n) {
    t->store = s;
    memset(t->locked, 0, sizeof t->locked);
    for (size_t i = 0; i < n; i++) {
        size_t idx = shard_index(keys[i].hash);
        t->locked[idx / 64] |= (uint64_t)1 << (idx % 64);
    }
    /* Ascending shard order: two transactions never wait on each other in a
     * cycle. */
    for (size_t w = 0; w < DREY_STORE_SHARDS / 64; w++) {
        for (uint64_t bits = t->locked[w]; bits != 0; bits &= bits - 1) {
            size_t idx = w * 64 + (size_t)__builtin_ctzll(bits);
            pthread_rwlock_wrlock(&s->shards[idx].lock);
            capture_if_pending(s, idx);
        }
    }
}

void drey_store_txn_end(drey_store_txn *t) {
    for (size_t w = 0; w < DREY_STORE_SHARDS / 64; w++) {
        for (uint64_t bits = t->locked[w]; bits != 0; bits &= bits - 1)
            pthread_rwlock_unlock(&t->store->shards[w * 64 + (size_t)__builtin_ctzll(bits)].lock);
    }
    memset(t->locked, 0, sizeof t->locked);
}

static shard *txn_shard(drey_store_txn *t, const drey_key *k) {
    size_t idx = shard_index(k->hash);
    if ((t->locked[idx / 64] & ((uint64_t)1 << (idx % 64))) == 0) {
        fprintf(stderr, "drey_store: key outside its transaction\n");
        abort(); /* a caller bug that would otherwise corrupt the table */
    }
    return &t->store->shards[idx];
}

bool drey_store_txn_get(drey_store_txn *t, const drey_key *k, int64_t now_ms, drey_entry_view *out) {
    shard *sh = txn_shard(t, k);
    entry **slot = find_slot(sh, k);
    if (*slot == NULL)
        return false;
    if (!is_live(*slot, now_ms)) {
        unlink_free(t->store, sh, slot);
        return false;
    }
    view_of(*slot, out);
    return true;
}

void drey_store_txn_put(drey_store_txn *t, const drey_key *k, const drey_value *v, int64_t expires_at_ms,
                        uint64_t version) {
    shard *sh = txn_shard(t, k);
    size_t size = offsetof(entry, data) + k->cache_len + k->key_len + v->len;
    entry *e = drey_xmalloc(size);
    e->version = version;
    e->expires_at_ms = expires_at_ms;
    e->hash = (uint32_t)k->hash;
    e->value_len = v->len;
    e->key_len = (uint16_t)k->key_len;
    e->cache_len = (uint8_t)k->cache_len;
    e->kind = (uint8_t)v->kind;
    memcpy(e->data, k->cache, k->cache_len);
    memcpy(e->data + k->cache_len, k->key, k->key_len);
    if (v->len > 0)
        memcpy(e->data + k->cache_len + k->key_len, v->data, v->len);

    entry **slot = find_slot(sh, k);
    entry *old = *slot;
    track_expiry(sh, old != NULL ? old->expires_at_ms : 0, expires_at_ms);
    if (old != NULL) {
        e->next = old->next;
        *slot = e;
        account(t->store, sh, (int64_t)entry_bytes(e) - (int64_t)entry_bytes(old));
        free(old); /* after the copy: v may point into it */
        return;
    }
    e->next = NULL;
    *slot = e;
    sh->count++;
    account(t->store, sh, (int64_t)entry_bytes(e));
    if (sh->count > sh->mask + 1)
        resize(sh, (sh->mask + 1) * 2);
}

bool drey_store_txn_set_expiry(drey_store_txn *t, const drey_key *k, int64_t expires_at_ms) {
    shard *sh = txn_shard(t, k);
    entry *e = *find_slot(sh, k);
    if (e == NULL)
        return false;
    track_expiry(sh, e->expires_at_ms, expires_at_ms);
    e->expires_at_ms = expires_at_ms;
    return true;
}

bool drey_store_txn_remove(drey_store_txn *t, const drey_key *k) {
    shard *sh = txn_shard(t, k);
    entry **slot = find_slot(sh, k);
    if (*slot == NULL)
        return false;
    unlink_free(t->store, sh, slot);
    return true;
}

size_t drey_store_sweep(drey_store *s, int64_t now_ms, size_t max_buckets, size_t *expired) {
    size_t idx = atomic_fetch_add_explicit(&s->sweep_shard, 1, memory_order_relaxed) % DREY_STORE_SHARDS;
    shard *sh = &s->shards[idx];
    size_t examined = 0, freed = 0;
    if (atomic_load_explicit(&sh->expiring, memory_order_relaxed) == 0)
        return 0; /* nothing can expire: no write lock to stall readers */
    pthread_rwlock_wrlock(&sh->lock);
    capture_if_pending(s, idx);
    size_t nbuckets = sh->mask + 1;
    size_t steps = max_buckets < nbuckets ? max_buckets : nbuckets;
    for (size_t i = 0; i < steps; i++) {
        size_t b = sh->sweep_cursor;
        sh->sweep_cursor = (b + 1) & sh->mask;
        entry **slot = &sh->buckets[b];
        while (*slot != NULL) {
            examined++;
            if (is_live(*slot, now_ms)) {
                slot = &(*slot)->next;
                continue;
            }
            size_t before = sh->mask;
            unlink_free(s, sh, slot);
            freed++;
            if (sh->mask != before)
                goto out; /* the table shrank under the cursor: resume next step */
        }
    }
out:
    pthread_rwlock_unlock(&sh->lock);
    atomic_fetch_add_explicit(&s->expired_swept, freed, memory_order_relaxed);
    *expired += freed;
    return examined;
}

int64_t drey_store_bytes(const drey_store *s) {
    return atomic_load_explicit(&s->bytes, memory_order_relaxed);
}

size_t drey_store_entry_size(drey_store *s, const drey_key *k, int64_t now_ms) {
    shard *sh = shard_of(s, k->hash);
    pthread_rwlock_rdlock(&sh->lock);
    entry *e = *find_slot(sh, k);
    size_t n = e != NULL && is_live(e, now_ms) ? entry_bytes(e) : 0;
    pthread_rwlock_unlock(&sh->lock);
    return n;
}

void drey_store_get_stats(drey_store *s, drey_store_stats *out) {
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < DREY_STORE_SHARDS; i++) {
        shard *sh = &s->shards[i];
        pthread_rwlock_rdlock(&sh->lock);
        out->entries += sh->count;
        out->bytes += sh->bytes;
        out->buckets += sh->mask + 1;
        out->expiring += atomic_load_explicit(&sh->expiring, memory_order_relaxed);
        pthread_rwlock_unlock(&sh->lock);
    }
    out->expired_swept = atomic_load_explicit(&s->expired_swept, memory_order_relaxed);
}
