/*
 * walk — what visits many entries: scans (a cursor over tables and buckets
 * that survives resizes) and, on a partitioned store, a partition's tables:
 * repartitioning, a partition's removal, figures and walks; see
 * include/drey/store.h and docs/store-partitions.md.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/store.h"
#include "internal.h"

/* --- scans ---------------------------------------------------------------- */

static uint32_t rev32(uint32_t v) {
    v = ((v >> 1) & 0x55555555u) | ((v & 0x55555555u) << 1);
    v = ((v >> 2) & 0x33333333u) | ((v & 0x33333333u) << 2);
    v = ((v >> 4) & 0x0f0f0f0fu) | ((v & 0x0f0f0f0fu) << 4);
    v = ((v >> 8) & 0x00ff00ffu) | ((v & 0x00ff00ffu) << 8);
    return (v >> 16) | (v << 16);
}

/* What a walk delivers: every live entry, or a cache's live entries whose
 * keys start with prefix. */
typedef struct matcher {
    bool any;
    const char *cache;
    size_t cache_len;
    const char *prefix;
    size_t prefix_len;
} matcher;

static bool walk_match(drey_store *s, const entry *e, const matcher *m, int64_t now_ms) {
    if (!m->any && !(e->cache_len == m->cache_len && memcmp(e->data, m->cache, m->cache_len) == 0 &&
                     e->key_len >= m->prefix_len && memcmp(e->data + m->cache_len, m->prefix, m->prefix_len) == 0))
        return false;
    return drey_store__is_live(s, e, now_ms);
}

void drey_store_walk_shard(drey_store *s, size_t stripe_index, int64_t now_ms,
                           void (*fn)(void *arg, const drey_store_item *item), void *arg) {
    pthread_rwlock_rdlock(&s->stripes[stripe_index].lock);
    layout *L = atomic_load_explicit(&s->layout, memory_order_relaxed);
    for (size_t t = stripe_index; t < L->n_tables; t += DREY_STORE_SHARDS) {
        shard *sh = &L->tables[t];
        for (size_t b = 0; b <= sh->mask; b++) {
            for (const entry *e = sh->buckets[b]; e != NULL; e = e->next) {
                if (!drey_store__is_live(s, e, now_ms))
                    continue;
                drey_store_item it;
                drey_store__item_of(e, &it);
                fn(arg, &it);
            }
        }
    }
    pthread_rwlock_unlock(&s->stripes[stripe_index].lock);
}

/* Walks tables first .. first + count - 1 (pos->shard counts from first)
 * in reverse-binary bucket order, one table's stripe read-locked at a time;
 * tables that hold nothing are passed over without counting as visited.
 * The scan and a partition's walk. */
static size_t walk_tables(drey_store *s, size_t first, size_t count, const matcher *m, int64_t now_ms,
                          drey_store_scan_pos *pos, size_t limit, size_t max_buckets,
                          void (*fn)(void *arg, const drey_store_item *item), void *arg) {
    size_t delivered = 0, visited = 0;
    while (pos->shard != DREY_STORE_SCAN_DONE && visited < max_buckets) {
        if (pos->shard >= count) {
            pos->shard = DREY_STORE_SCAN_DONE;
            pos->bucket = 0;
            break;
        }
        size_t t = first + pos->shard;
        pthread_rwlock_t *lock = drey_store__lock_of(s, t);
        pthread_rwlock_rdlock(lock);
        shard *sh = &atomic_load_explicit(&s->layout, memory_order_relaxed)->tables[t];
        uint32_t mask = (uint32_t)sh->mask, v = pos->bucket;
        bool stop = false;
        if (sh->count == 0)
            v = 0; /* nothing here now: nothing that was here all along either */
        while (sh->count > 0 && visited < max_buckets) {
            const entry *chain = sh->buckets[v & mask];
            size_t n = 0;
            for (const entry *e = chain; e != NULL; e = e->next)
                n += walk_match(s, e, m, now_ms);
            if (delivered > 0 && delivered + n > limit) {
                stop = true; /* this bucket starts the next page */
                break;
            }
            for (const entry *e = chain; e != NULL; e = e->next) {
                if (!walk_match(s, e, m, now_ms))
                    continue;
                drey_store_item it;
                drey_store__item_of(e, &it);
                fn(arg, &it);
            }
            delivered += n;
            visited++;
            /* Reverse-binary increment: the bits above the mask first, so a
             * table that doubled or halved since is still covered. */
            v |= ~mask;
            v = rev32(rev32(v) + 1);
            if (v == 0 || delivered >= limit)
                break;
        }
        pthread_rwlock_unlock(lock);
        if (stop) {
            pos->bucket = v;
            break;
        }
        if (v == 0) {
            pos->shard = pos->shard + 1 < count ? pos->shard + 1 : DREY_STORE_SCAN_DONE;
            pos->bucket = 0;
        } else {
            pos->bucket = v;
        }
        if (delivered >= limit)
            break;
    }
    return delivered;
}

bool drey_store_scan_pos_valid(const drey_store *s, const drey_store_scan_pos *pos) {
    return pos->shard == DREY_STORE_SCAN_DONE || pos->shard < drey_store__layout(s)->n_tables;
}

size_t drey_store_scan(drey_store *s, const char *cache, size_t cache_len, const char *prefix, size_t prefix_len,
                       int64_t now_ms, drey_store_scan_pos *pos, size_t limit, size_t max_buckets,
                       void (*fn)(void *arg, const drey_store_item *item), void *arg) {
    drey_store__normalize_cache(&cache, &cache_len);
    matcher m = {.cache = cache, .cache_len = cache_len, .prefix = prefix, .prefix_len = prefix_len};
    return walk_tables(s, 0, drey_store__layout(s)->n_tables, &m, now_ms, pos, limit, max_buckets, fn, arg);
}

/* --- partitions ------------------------------------------------------------- */

uint32_t drey_store_partitions(const drey_store *s) {
    return drey_store__layout(s)->parts;
}

/* Links an entry into a table of a layout being built, with its figures
 * (its cache's and the store's do not change). */
static void relink(shard *dst, entry *e) {
    entry **slot = &dst->buckets[e->hash & dst->mask];
    e->next = *slot;
    *slot = e;
    dst->count++;
    dst->bytes += drey_store__entry_bytes(e);
    bool expires = e->expires_at_ms != 0;
    atomic_fetch_add_explicit(&dst->expiring, expires, memory_order_relaxed);
    if (!drey_store__internal(e)) {
        atomic_fetch_add_explicit(&dst->evictable, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&dst->evictable_expiring, expires, memory_order_relaxed);
    }
    drey_store__tc_add(dst, e->cache_id, 1, (int64_t)drey_store__entry_bytes(e), expires);
    if (dst->count > dst->mask + 1)
        drey_store__resize(dst, (dst->mask + 1) * 2);
}

bool drey_store_set_partitions(drey_store *s, uint32_t n, drey_store_partition_fn fn) {
    if (n == 0 || n > DREY_STORE_MAX_PARTITIONS || fn == NULL)
        return false;
    drey_store__lock_all(s);
    layout *old = atomic_load_explicit(&s->layout, memory_order_relaxed);
    if (old->parts == n && old->part_of == fn) {
        drey_store__unlock_all(s);
        return true;
    }
    /* A capture in progress takes every stripe as it was: after the move a
     * stripe holds other entries. */
    for (size_t i = 0; i < DREY_STORE_SHARDS; i++)
        drey_store__capture_if_pending(s, i);
    layout *L = drey_store__layout_new(n, fn);
    for (size_t t = 0; t < old->n_tables; t++) {
        shard *sh = &old->tables[t];
        for (size_t b = 0; b <= sh->mask; b++) {
            while (sh->buckets[b] != NULL) {
                entry *e = sh->buckets[b];
                sh->buckets[b] = e->next;
                const char *cache = (const char *)e->data, *key = cache + e->cache_len;
                uint64_t hash = drey_store__key_hash(s, cache, e->cache_len, key, e->key_len);
                relink(&L->tables[drey_store__table_for(L, cache, e->cache_len, key, e->key_len, hash)], e);
            }
        }
        /* Emptied, not freed: a lock-free reader of the old layout reads
         * zeros (see layout in internal.h). */
        drey_store__shard_zero(sh);
    }
    L->older = old;
    atomic_store_explicit(&s->layout, L, memory_order_release);
    drey_store__unlock_all(s);
    return true;
}

/* Partition p's tables in L (first, count); false for a p it does not
 * have. A partition's tables are guarded by consecutive stripes that do
 * not wrap (per_part divides 256), so locking them in order is ascending. */
static bool part_tables(const layout *L, uint32_t p, size_t *first, size_t *count) {
    if (L->parts == 0 || p > L->parts)
        return false;
    *first = (size_t)p * L->per_part;
    *count = L->per_part;
    return true;
}

size_t drey_store_partition_walk(drey_store *s, uint32_t p, int64_t now_ms, drey_store_scan_pos *pos, size_t limit,
                                 void (*fn)(void *arg, const drey_store_item *item), void *arg) {
    size_t first, count;
    if (!part_tables(drey_store__layout(s), p, &first, &count)) {
        *pos = (drey_store_scan_pos){DREY_STORE_SCAN_DONE, 0};
        return 0;
    }
    if (limit == 0)
        limit = 1;
    /* Tables keep at least one entry per 8 buckets: 8 x limit buckets
     * bound the step where entries are sparse. */
    size_t max_buckets = limit < SIZE_MAX / 16 ? limit * 8 + 64 : SIZE_MAX;
    matcher m = {.any = true};
    return walk_tables(s, first, count, &m, now_ms, pos, limit, max_buckets, fn, arg);
}

uint64_t drey_store_partition_remove(drey_store *s, uint32_t p, int64_t now_ms) {
    size_t first, count;
    if (!part_tables(drey_store__layout(s), p, &first, &count))
        return 0;
    uint64_t live = 0;
    for (size_t t = first; t < first + count; t++) {
        pthread_rwlock_t *lock = drey_store__lock_of(s, t);
        pthread_rwlock_wrlock(lock);
        drey_store__capture_if_pending(s, t % DREY_STORE_SHARDS);
        shard *sh = &atomic_load_explicit(&s->layout, memory_order_relaxed)->tables[t];
        for (size_t b = 0; b <= sh->mask; b++) {
            while (sh->buckets[b] != NULL) {
                entry *e = sh->buckets[b];
                if (!drey_store__retired(s, e)) {
                    bool is = drey_store__is_live(s, e, now_ms);
                    drey_store__observe(s, is ? DREY_STORE_CHANGE_REMOVE : DREY_STORE_CHANGE_EXPIRE, e);
                    live += is;
                }
                sh->buckets[b] = e->next;
                drey_store__uncount_entry(s, sh, e);
                free(e);
            }
        }
        if (sh->mask + 1 > SHARD_MIN_BUCKETS)
            drey_store__resize(sh, SHARD_MIN_BUCKETS); /* empty: nothing to move */
        pthread_rwlock_unlock(lock);
    }
    return live;
}

/* p's tables write-locked together, so that the one CLEAR it tells comes
 * after every earlier change of those keys and before any later one, as
 * drey_store_clear_cache's does for the whole store. */
uint64_t drey_store_partition_clear_cache(drey_store *s, uint32_t p, const char *cache, size_t cache_len,
                                          int64_t now_ms) {
    drey_store__normalize_cache(&cache, &cache_len);
    size_t first, count;
    if (!part_tables(drey_store__layout(s), p, &first, &count))
        return 0;
    for (size_t t = first; t < first + count; t++) {
        pthread_rwlock_wrlock(drey_store__lock_of(s, t));
        drey_store__capture_if_pending(s, t % DREY_STORE_SHARDS);
    }
    uint64_t live = 0;
    layout *L = atomic_load_explicit(&s->layout, memory_order_relaxed);
    for (size_t t = first; t < first + count; t++) {
        shard *sh = &L->tables[t];
        for (size_t b = 0; b <= sh->mask; b++) {
            for (entry **slot = &sh->buckets[b]; *slot != NULL;) {
                entry *e = *slot;
                if (e->cache_len != cache_len || memcmp(e->data, cache, cache_len) != 0 || drey_store__retired(s, e)) {
                    slot = &e->next;
                    continue;
                }
                live += drey_store__is_live(s, e, now_ms);
                *slot = e->next;
                drey_store__uncount_entry(s, sh, e);
                free(e);
            }
        }
    }
    const drey_store_observer *o = atomic_load_explicit(&s->observer, memory_order_acquire);
    if (o != NULL && !(cache_len > 0 && cache[0] == '#')) {
        drey_store_change c = {.kind = DREY_STORE_CHANGE_CLEAR, .cache = cache, .cache_len = cache_len};
        o->fn(o->ctx, &c);
    }
    for (size_t t = first + count; t-- > first;)
        pthread_rwlock_unlock(drey_store__lock_of(s, t));
    return live;
}

/* Read-locks partition p's stripes (ascending); false for a p the store
 * does not have. */
static bool lock_part(drey_store *s, uint32_t p, size_t *first, size_t *count) {
    for (;;) {
        layout *L = drey_store__layout(s);
        if (!part_tables(L, p, first, count))
            return false;
        for (size_t i = 0; i < *count; i++)
            pthread_rwlock_rdlock(drey_store__lock_of(s, *first + i));
        if (atomic_load_explicit(&s->layout, memory_order_relaxed) == L)
            return true;
        for (size_t i = *count; i-- > 0;) /* partitioned again meanwhile */
            pthread_rwlock_unlock(drey_store__lock_of(s, *first + i));
    }
}

static void unlock_part(drey_store *s, size_t first, size_t count) {
    for (size_t i = count; i-- > 0;)
        pthread_rwlock_unlock(drey_store__lock_of(s, first + i));
}

void drey_store_get_partition_stats(drey_store *s, uint32_t p, drey_store_partition_stats *out) {
    memset(out, 0, sizeof *out);
    size_t first, count;
    if (!lock_part(s, p, &first, &count))
        return;
    layout *L = atomic_load_explicit(&s->layout, memory_order_relaxed);
    for (size_t t = first; t < first + count; t++) {
        out->entries += L->tables[t].count;
        out->bytes += L->tables[t].bytes;
        out->expiring += atomic_load_explicit(&L->tables[t].expiring, memory_order_relaxed);
    }
    unlock_part(s, first, count);
}

/* Sums the cache's rows over partition p's tables; p's stripes locked. */
static void part_cache_sum(drey_store *s, size_t first, size_t count, uint32_t id, drey_cache_stats *out) {
    layout *L = atomic_load_explicit(&s->layout, memory_order_relaxed);
    for (size_t t = first; t < first + count; t++) {
        const table_cache *row = drey_store__tc_find(&L->tables[t], id);
        if (row != NULL) {
            out->entries += row->entries;
            out->bytes += row->bytes;
            out->expiring += row->expiring;
        }
    }
}

void drey_store_partition_cache_stats(drey_store *s, uint32_t p, const char *cache, size_t cache_len,
                                      drey_cache_stats *out) {
    drey_store__normalize_cache(&cache, &cache_len);
    memset(out, 0, sizeof *out);
    out->cache = cache;
    out->cache_len = cache_len;
    size_t first, count;
    if (!lock_part(s, p, &first, &count))
        return;
    /* With the partition's stripes held, no entry of it comes or goes, so
     * the slot found now is the one its entries count in. */
    pthread_mutex_lock(&s->reg.mu);
    bool found;
    size_t i = drey_store__map_find(s, cache, cache_len, &found);
    uint32_t id = found ? s->reg.map[i] - 1 : 0;
    pthread_mutex_unlock(&s->reg.mu);
    if (found)
        part_cache_sum(s, first, count, id, out);
    unlock_part(s, first, count);
}

void drey_store_partition_list_caches(drey_store *s, uint32_t p, void (*fn)(void *arg, const drey_cache_stats *c),
                                      void *arg) {
    size_t first, count;
    if (!lock_part(s, p, &first, &count))
        return;
    layout *L = atomic_load_explicit(&s->layout, memory_order_relaxed);
    pthread_mutex_lock(&s->reg.mu);
    for (size_t t = first; t < first + count; t++) {
        const shard *sh = &L->tables[t];
        for (uint32_t r = 0; r < sh->caches_cap; r++) {
            uint32_t id1 = sh->caches[r].id1;
            if (id1 == 0)
                continue;
            bool seen = false; /* reported with an earlier table of p */
            for (size_t u = first; u < t && !seen; u++)
                seen = drey_store__tc_find(&L->tables[u], id1 - 1) != NULL;
            const cache_slot *c = drey_store__slot(s, id1 - 1);
            if (seen || c->retired)
                continue;
            drey_cache_stats st = {.cache = c->name, .cache_len = c->name_len};
            part_cache_sum(s, t, first + count - t, id1 - 1, &st);
            fn(arg, &st);
        }
    }
    pthread_mutex_unlock(&s->reg.mu);
    unlock_part(s, first, count);
}
