/*
 * store — sharded hash table of cache entries; see include/drey/store.h.
 *
 * The key picks its table (drey_store_key: the top 8 bits of the 64-bit key
 * hash, or on a partitioned store its partition and then those bits), the
 * low 32 bits the bucket, so a table can grow without rehashing into other
 * tables. Each table keeps a load factor between 1/8 and 1 by doubling or
 * halving its bucket array under its stripe's write lock (a few
 * microseconds per thousand entries).
 *
 * Each entry names its cache's slot in a registry (cache name -> slot), and
 * every change to an entry's bytes, existence or expiry updates both its
 * shard and its slot, so a cache's figures are exact at every moment
 * without a scan. Clearing a cache retires its slot (every shard locked for
 * a moment, no entry touched): retired entries are invisible and the sweep
 * frees them.
 */
#include "drey/store.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "drey/alloc.h"
#include "internal.h"
#include "siphash.h"

/* --- tables and their locks ------------------------------------------------ */

layout *drey_store__layout(const drey_store *s) {
    return atomic_load_explicit(&s->layout, memory_order_acquire);
}

pthread_rwlock_t *drey_store__lock_of(drey_store *s, size_t table) {
    return &s->stripes[table % DREY_STORE_SHARDS].lock;
}

/* The key's table; its stripe is locked, so the layout is stable. */
static shard *table_of(drey_store *s, const drey_key *k) {
    layout *L = atomic_load_explicit(&s->layout, memory_order_relaxed);
    if (k->table >= L->n_tables) {
        fprintf(stderr, "drey_store: a key made under another layout\n");
        abort(); /* a caller bug that would otherwise corrupt the table */
    }
    return &L->tables[k->table];
}

layout *drey_store__layout_new(uint32_t parts, drey_store_partition_fn fn) {
    layout *L = drey_xcalloc(1, sizeof *L);
    L->parts = parts;
    L->part_of = fn;
    L->per_part = 1;
    if (parts == 0) {
        L->n_tables = DREY_STORE_SHARDS;
    } else {
        /* Partitions and the group of entries of none, each with enough
         * tables that there are at least as many as stripes. */
        while ((uint64_t)(parts + 1) * L->per_part < DREY_STORE_SHARDS)
            L->per_part *= 2;
        L->n_tables = (parts + 1) * L->per_part;
    }
    L->tables = drey_xaligned(64, L->n_tables * sizeof(shard));
    memset(L->tables, 0, L->n_tables * sizeof(shard));
    for (size_t i = 0; i < L->n_tables; i++) {
        L->tables[i].buckets = drey_xcalloc(SHARD_MIN_BUCKETS, sizeof(entry *));
        L->tables[i].mask = SHARD_MIN_BUCKETS - 1;
        L->tables[i].per_cache = parts > 0;
    }
    return L;
}

/* The table, in layout L, of a key with this hash. */
uint32_t drey_store__table_for(const layout *L, const char *cache, size_t cache_len, const char *key, size_t key_len,
                          uint64_t hash) {
    if (L->parts == 0)
        return (uint32_t)(hash >> 56);
    uint32_t p = L->part_of(cache, cache_len, key, key_len, L->parts);
    if (p > L->parts)
        p = L->parts; /* the group of no partition */
    return p * L->per_part + (uint32_t)((hash >> 56) & (L->per_part - 1));
}

/* --- the table ------------------------------------------------------------ */

drey_store *drey_store_create(void) {
    drey_store *s = drey_xaligned(64, sizeof *s);
    memset(s, 0, sizeof *s);
    if (getrandom(s->seed, sizeof s->seed, 0) != (ssize_t)sizeof s->seed)
        abort();
    for (size_t i = 0; i < DREY_STORE_SHARDS; i++)
        pthread_rwlock_init(&s->stripes[i].lock, NULL);
    atomic_store(&s->layout, drey_store__layout_new(0, NULL));
    drey_store__registry_init(s);
    pthread_mutex_init(&s->pool_mu, NULL);
    return s;
}

static void tenant_account(drey_store *s, const entry *e, int64_t delta);

/* tell: the entries' tenants hear they are gone (a clear, not the end). */
static void free_entries(drey_store *s, shard *sh, bool tell) {
    for (size_t b = 0; b <= sh->mask; b++) {
        entry *e = sh->buckets[b];
        while (e != NULL) {
            entry *next = e->next;
            if (tell)
                tenant_account(s, e, -(int64_t)drey_store__entry_bytes(e));
            free(e);
            e = next;
        }
        sh->buckets[b] = NULL;
    }
    drey_store__shard_zero(sh);
}

void drey_store__shard_zero(shard *sh) {
    sh->count = 0;
    sh->bytes = 0;
    atomic_store_explicit(&sh->expiring, 0, memory_order_relaxed);
    atomic_store_explicit(&sh->evictable, 0, memory_order_relaxed);
    atomic_store_explicit(&sh->evictable_expiring, 0, memory_order_relaxed);
    free(sh->caches);
    sh->caches = NULL;
    sh->caches_cap = sh->caches_used = 0;
}

static void layout_destroy(drey_store *s, layout *L) {
    while (L != NULL) {
        layout *older = L->older;
        for (size_t i = 0; i < L->n_tables; i++) {
            free_entries(s, &L->tables[i], false);
            free(L->tables[i].buckets);
        }
        free(L->tables);
        free(L);
        L = older;
    }
}

void drey_store_destroy(drey_store *s) {
    if (s == NULL)
        return;
    layout_destroy(s, atomic_load(&s->layout));
    for (size_t i = 0; i < DREY_STORE_SHARDS; i++)
        pthread_rwlock_destroy(&s->stripes[i].lock);
    for (size_t i = 0; i < s->pool_len; i++)
        free(s->pool[i].name);
    pthread_mutex_destroy(&s->pool_mu);
    drey_store__registry_destroy(s);
    free(s);
}

void drey_store__lock_all(drey_store *s) {
    for (size_t i = 0; i < DREY_STORE_SHARDS; i++)
        pthread_rwlock_wrlock(&s->stripes[i].lock);
}

void drey_store__unlock_all(drey_store *s) {
    for (size_t i = DREY_STORE_SHARDS; i-- > 0;)
        pthread_rwlock_unlock(&s->stripes[i].lock);
}

void drey_store_clear(drey_store *s) {
    drey_store__lock_all(s);
    layout *L = atomic_load_explicit(&s->layout, memory_order_relaxed);
    for (size_t i = 0; i < L->n_tables; i++) {
        shard *sh = &L->tables[i];
        atomic_fetch_sub_explicit(&s->bytes, (int64_t)sh->bytes, memory_order_relaxed);
        free_entries(s, sh, true);
    }
    /* No entry is left to name a slot: every cache starts over. */
    registry *r = &s->reg;
    pthread_mutex_lock(&r->mu);
    memset(r->map, 0, r->map_cap * sizeof *r->map);
    r->map_used = 0;
    r->free_head = 0;
    for (uint32_t id = r->n_slots; id-- > 0;)
        drey_store__slot_release(s, id);
    pthread_mutex_unlock(&r->mu);
    atomic_store(&s->orphans, 0);
    /* The eviction pool may still name entries that are gone: harmless, a
     * candidate is looked up again before it is chosen. */
    drey_store__unlock_all(s);
}

/* The cache name (normalized) is prefixed by its length so ("ab","c") and
 * ("a","bc") hash differently. */
uint64_t drey_store__key_hash(const drey_store *s, const char *cache, size_t cache_len, const char *key, size_t key_len) {
    uint8_t prefix[256];
    prefix[0] = (uint8_t)cache_len;
    memcpy(prefix + 1, cache, cache_len);
    return drey_store__siphash2(s->seed, prefix, cache_len + 1, key, key_len);
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
    k->hash = drey_store__key_hash(s, cache, cache_len, key, key_len);
    k->table = drey_store__table_for(drey_store__layout(s), k->cache, cache_len, key, key_len, k->hash);
}

void drey_store_get_seed(const drey_store *s, uint8_t out[16]) {
    memcpy(out, s->seed, sizeof s->seed);
}

void drey_store_set_seed(drey_store *s, const uint8_t seed[16]) {
    if (drey_store_bytes(s) != 0) {
        fprintf(stderr, "drey_store: the hash seed changes only while the store is empty\n");
        abort(); /* every entry would be in the wrong bucket */
    }
    memcpy(s->seed, seed, sizeof s->seed);
}

uint64_t drey_store_tag(const drey_store *s, const void *data, size_t len) {
    /* Domain-separated from key hashes, which start with a length byte
     * of at most 255. */
    static const uint8_t domain[] = {0xff, 't', 'a', 'g'};
    return drey_store__siphash2(s->seed, domain, sizeof domain, data, len);
}

size_t drey_store_entry_bytes(size_t cache_len, size_t key_len, size_t value_len) {
    return offsetof(entry, data) + cache_len + key_len + value_len + sizeof(entry *);
}

size_t drey_store__entry_bytes(const entry *e) {
    return drey_store_entry_bytes(e->cache_len, e->key_len, e->value_len);
}

bool drey_store__retired(drey_store *s, const entry *e) {
    return drey_store__slot(s, e->cache_id)->retired;
}

bool drey_store__is_live(drey_store *s, const entry *e, int64_t now_ms) {
    return (e->expires_at_ms == 0 || e->expires_at_ms > now_ms) && !drey_store__retired(s, e);
}

bool drey_store__matches(const entry *e, const drey_key *k) {
    return e->hash == (uint32_t)k->hash && e->key_len == k->key_len && e->cache_len == k->cache_len &&
           memcmp(e->data, k->cache, k->cache_len) == 0 && memcmp(e->data + k->cache_len, k->key, k->key_len) == 0;
}

/* The slot pointing at the key's entry (or at the NULL ending its chain). */
static entry **find_slot(shard *sh, const drey_key *k) {
    entry **slot = &sh->buckets[(uint32_t)k->hash & sh->mask];
    while (*slot != NULL && !drey_store__matches(*slot, k))
        slot = &(*slot)->next;
    return slot;
}

static void view_of(const entry *e, drey_entry_view *v) {
    v->value.kind = (drey_value_kind)drey_store__kind(e);
    v->value.data = e->data + e->cache_len + e->key_len;
    v->value.len = e->value_len;
    v->version = e->version;
    v->expires_at_ms = e->expires_at_ms;
    v->tenant = drey_store__tenant(e);
}

void drey_store__item_of(const entry *e, drey_store_item *it) {
    it->cache = (const char *)e->data;
    it->cache_len = e->cache_len;
    it->key = (const char *)e->data + e->cache_len;
    it->key_len = e->key_len;
    view_of(e, &it->entry);
    it->tenant = it->entry.tenant;
}

void drey_store__resize(shard *sh, size_t nbuckets) {
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

/* A tenant's entry's bytes: what its accountant hears. */
static void tenant_account(drey_store *s, const entry *e, int64_t delta) {
    if ((e->kind & ENTRY_TENANT) != 0 && s->tenants.account != NULL && delta != 0)
        s->tenants.account(s->tenants.ctx, drey_store__tenant(e), (const char *)e->data, e->cache_len,
                           (const char *)e->data + e->cache_len, e->key_len, delta);
}

/* Accounted bytes change here and only here (and in free_entries): the
 * table's (and its cache's row), the store's and the entry's cache's; its
 * tenant's is told. */
static void account(drey_store *s, shard *sh, const entry *e, int64_t delta) {
    sh->bytes += (size_t)delta;
    drey_store__tc_add(sh, e->cache_id, 0, delta, 0);
    atomic_fetch_add_explicit(&s->bytes, delta, memory_order_relaxed);
    atomic_fetch_add_explicit(&drey_store__slot(s, e->cache_id)->bytes, delta, memory_order_relaxed);
    tenant_account(s, e, delta);
}

/* Keeps the counts of expiring entries (shard and cache) as an entry's
 * expiry goes from `from` to `to` (0: never; an entry inserted comes from 0,
 * one freed goes to 0). */
bool drey_store__internal(const entry *e) {
    return e->cache_len > 0 && e->data[0] == '#';
}

static void track_expiry(drey_store *s, shard *sh, const entry *e, int64_t from, int64_t to) {
    if ((from != 0) == (to != 0))
        return;
    atomic_fetch_add_explicit(&sh->expiring, to != 0 ? 1 : (size_t)-1, memory_order_relaxed);
    drey_store__tc_add(sh, e->cache_id, 0, 0, to != 0 ? 1 : -1);
    if (!drey_store__internal(e))
        atomic_fetch_add_explicit(&sh->evictable_expiring, to != 0 ? 1 : (size_t)-1, memory_order_relaxed);
    atomic_fetch_add_explicit(&drey_store__slot(s, e->cache_id)->expiring, to != 0 ? 1 : -1, memory_order_relaxed);
}

/* A new entry's counts, first of all (its cache's row in the table opens
 * here); slot_for counted it in its cache already. */
static void count_entry(shard *sh, const entry *e) {
    sh->count++;
    drey_store__tc_add(sh, e->cache_id, 1, 0, 0);
    if (!drey_store__internal(e))
        atomic_fetch_add_explicit(&sh->evictable, 1, memory_order_relaxed);
}

/* Forgets an entry's counts; a slot whose last entry goes is reused: a
 * cache that has emptied keeps no slot, so cache names written over a
 * node's life do not pile up in the registry. */
void drey_store__uncount_entry(drey_store *s, shard *sh, const entry *e) {
    sh->count--;
    if (!drey_store__internal(e))
        atomic_fetch_sub_explicit(&sh->evictable, 1, memory_order_relaxed);
    track_expiry(s, sh, e, e->expires_at_ms, 0);
    account(s, sh, e, -(int64_t)drey_store__entry_bytes(e));
    drey_store__tc_add(sh, e->cache_id, -1, 0, 0); /* last: its row may go now */
    cache_slot *c = drey_store__slot(s, e->cache_id);
    bool retired_slot = c->retired;
    if (retired_slot)
        atomic_fetch_sub_explicit(&s->orphans, 1, memory_order_relaxed);
    if (atomic_fetch_sub_explicit(&c->entries, 1, memory_order_relaxed) != 1)
        return;
    /* The last entry went. Entries are counted in under the registry lock
     * (slot_for), so an entry added meanwhile shows here, and a write after
     * the release opens a fresh slot. A retired slot has left the map
     * already. */
    registry *r = &s->reg;
    pthread_mutex_lock(&r->mu);
    if (atomic_load_explicit(&c->entries, memory_order_relaxed) == 0) {
        if (!retired_slot) {
            bool found;
            size_t i = drey_store__map_find(s, c->name, c->name_len, &found);
            if (found)
                r->map[i] = MAP_DELETED;
        }
        drey_store__slot_release(s, e->cache_id);
    }
    pthread_mutex_unlock(&r->mu);
}

static void unlink_free(drey_store *s, shard *sh, entry **slot) {
    entry *e = *slot;
    *slot = e->next;
    drey_store__uncount_entry(s, sh, e);
    free(e);
    if (sh->mask + 1 > SHARD_MIN_BUCKETS && sh->count < (sh->mask + 1) / 8)
        drey_store__resize(sh, (sh->mask + 1) / 2);
}

void drey_store_set_observer(drey_store *s, const drey_store_observer *o) {
    atomic_store_explicit(&s->observer, o, memory_order_release);
}

/* Tells the observer, if any, of a change to e (still linked). */
void drey_store__observe(drey_store *s, drey_store_change_kind kind, const entry *e) {
    const drey_store_observer *o = atomic_load_explicit(&s->observer, memory_order_acquire);
    if (o == NULL || drey_store__internal(e))
        return;
    drey_store_change c = {
        .kind = kind,
        .cache = (const char *)e->data,
        .cache_len = e->cache_len,
        .key = (const char *)e->data + e->cache_len,
        .key_len = e->key_len,
        .value = {.kind = (drey_value_kind)drey_store__kind(e), .data = e->data + e->cache_len + e->key_len, .len = e->value_len},
        .version = e->version,
        .expires_at_ms = e->expires_at_ms,
    };
    o->fn(o->ctx, &c);
}

bool drey_store_read(drey_store *s, const drey_key *k, int64_t now_ms,
                     void (*fn)(void *arg, const drey_entry_view *e), void *arg) {
    pthread_rwlock_t *lock = drey_store__lock_of(s, k->table);
    pthread_rwlock_rdlock(lock);
    entry *e = *find_slot(table_of(s, k), k);
    bool found = e != NULL && drey_store__is_live(s, e, now_ms);
    if (found) {
        drey_store__touch(s, e);
        drey_entry_view v;
        view_of(e, &v);
        fn(arg, &v);
    }
    pthread_rwlock_unlock(lock);
    return found;
}

uint64_t drey_store_next_version(drey_store *s) {
    return atomic_fetch_add_explicit(&s->version, 1, memory_order_relaxed) + 1;
}

uint64_t drey_store_reserve_versions(drey_store *s, size_t n) {
    return atomic_fetch_add_explicit(&s->version, n, memory_order_relaxed) + 1;
}

bool drey_store_unreserve_versions(drey_store *s, uint64_t first, size_t n) {
    uint64_t last = first + n - 1;
    return atomic_compare_exchange_strong_explicit(&s->version, &last, first - 1, memory_order_relaxed,
                                                   memory_order_relaxed);
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

/* Hands a stripe's tables to the capture if it is still marked. Called
 * with the stripe locked. */
void drey_store__capture_if_pending(drey_store *s, size_t idx) {
    if (!atomic_exchange(&s->capture_pending[idx], false))
        return;
    layout *L = atomic_load_explicit(&s->layout, memory_order_relaxed);
    for (size_t t = idx; t < L->n_tables; t += DREY_STORE_SHARDS) {
        shard *sh = &L->tables[t];
        for (size_t b = 0; b <= sh->mask; b++) {
            for (const entry *e = sh->buckets[b]; e != NULL; e = e->next) {
                if (!drey_store__is_live(s, e, s->capture_live_at))
                    continue;
                drey_store_item it;
                drey_store__item_of(e, &it);
                s->capture_fn(s->capture_ctx, idx, &it);
            }
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
    pthread_rwlock_rdlock(&s->stripes[idx].lock);
    drey_store__capture_if_pending(s, idx);
    pthread_rwlock_unlock(&s->stripes[idx].lock);
}

void drey_store_capture_end(drey_store *s) {
    for (size_t i = 0; i < DREY_STORE_SHARDS; i++)
        drey_store_capture_shard(s, i);
    s->capture_fn = NULL;
    s->capture_ctx = NULL;
}

void drey_store_reserve(drey_store *s, size_t n) {
    for (size_t i = 0; i < DREY_STORE_SHARDS; i++) {
        pthread_rwlock_wrlock(&s->stripes[i].lock);
        layout *L = atomic_load_explicit(&s->layout, memory_order_relaxed);
        size_t per = n / L->n_tables + 1, want = SHARD_MIN_BUCKETS;
        while (want < per && want <= SIZE_MAX / 4) /* doubling past that would wrap to 0 and never end */
            want *= 2;
        for (size_t t = i; t < L->n_tables; t += DREY_STORE_SHARDS) {
            if (L->tables[t].mask + 1 < want)
                drey_store__resize(&L->tables[t], want);
        }
        pthread_rwlock_unlock(&s->stripes[i].lock);
    }
}

static entry *new_entry(const drey_key *k, const drey_value *v, int64_t expires_at_ms, uint64_t version,
                        uint32_t tenant) {
    size_t tail = tenant != 0 ? sizeof tenant : 0;
    entry *e = drey_xmalloc(offsetof(entry, data) + k->cache_len + k->key_len + v->len + tail);
    e->version = version;
    e->expires_at_ms = expires_at_ms;
    e->hash = (uint32_t)k->hash;
    e->value_len = v->len;
    e->access = 0;
    e->cache_id = 0;
    e->key_len = (uint16_t)k->key_len;
    e->cache_len = (uint8_t)k->cache_len;
    e->kind = (uint8_t)((uint8_t)v->kind | (tenant != 0 ? ENTRY_TENANT : 0));
    memcpy(e->data, k->cache, k->cache_len);
    memcpy(e->data + k->cache_len, k->key, k->key_len);
    if (v->len > 0)
        memcpy(e->data + k->cache_len + k->key_len, v->data, v->len);
    if (tenant != 0)
        memcpy(e->data + k->cache_len + k->key_len + v->len, &tenant, sizeof tenant);
    return e;
}

void drey_store_load(drey_store *s, const drey_store_item *item) {
    drey_key k;
    drey_store_key(s, &k, item->cache, item->cache_len, item->key, item->key_len);
    entry *e = new_entry(&k, &item->entry.value, item->entry.expires_at_ms, item->entry.version, item->tenant);
    pthread_rwlock_t *lock = drey_store__lock_of(s, k.table);
    pthread_rwlock_wrlock(lock);
    shard *sh = table_of(s, &k);
    e->cache_id = drey_store__slot_for(s, k.cache, k.cache_len);
    e->access = drey_store__access_new(s, 0, false);
    entry **slot = &sh->buckets[e->hash & sh->mask];
    e->next = *slot;
    *slot = e;
    count_entry(sh, e);
    track_expiry(s, sh, e, 0, e->expires_at_ms);
    account(s, sh, e, (int64_t)drey_store__entry_bytes(e));
    if (sh->count > sh->mask + 1)
        drey_store__resize(sh, (sh->mask + 1) * 2);
    pthread_rwlock_unlock(lock);
}

void drey_store_txn_begin(drey_store *s, drey_store_txn *t, const drey_key *keys, size_t n) {
    t->store = s;
    t->tenant = 0;
    t->copy = false;
    memset(t->locked, 0, sizeof t->locked);
    for (size_t i = 0; i < n; i++) {
        size_t idx = keys[i].table % DREY_STORE_SHARDS;
        t->locked[idx / 64] |= (uint64_t)1 << (idx % 64);
    }
    /* Ascending stripe order: two transactions never wait on each other in
     * a cycle. */
    for (size_t w = 0; w < DREY_STORE_SHARDS / 64; w++) {
        for (uint64_t bits = t->locked[w]; bits != 0; bits &= bits - 1) {
            size_t idx = w * 64 + (size_t)__builtin_ctzll(bits);
            pthread_rwlock_wrlock(&s->stripes[idx].lock);
            drey_store__capture_if_pending(s, idx);
        }
    }
}

void drey_store_txn_end(drey_store_txn *t) {
    for (size_t w = 0; w < DREY_STORE_SHARDS / 64; w++) {
        for (uint64_t bits = t->locked[w]; bits != 0; bits &= bits - 1)
            pthread_rwlock_unlock(&t->store->stripes[w * 64 + (size_t)__builtin_ctzll(bits)].lock);
    }
    memset(t->locked, 0, sizeof t->locked);
}

static shard *txn_shard(drey_store_txn *t, const drey_key *k) {
    size_t idx = k->table % DREY_STORE_SHARDS;
    if ((t->locked[idx / 64] & ((uint64_t)1 << (idx % 64))) == 0) {
        fprintf(stderr, "drey_store: key outside its transaction\n");
        abort(); /* a caller bug that would otherwise corrupt the table */
    }
    return table_of(t->store, k);
}

bool drey_store_txn_get(drey_store_txn *t, const drey_key *k, int64_t now_ms, drey_entry_view *out) {
    shard *sh = txn_shard(t, k);
    entry **slot = find_slot(sh, k);
    if (*slot == NULL)
        return false;
    if (!drey_store__is_live(t->store, *slot, now_ms)) {
        if (!drey_store__retired(t->store, *slot))
            drey_store__observe(t->store, DREY_STORE_CHANGE_EXPIRE, *slot);
        unlink_free(t->store, sh, slot);
        return false;
    }
    drey_store__touch(t->store, *slot);
    view_of(*slot, out);
    return true;
}

void drey_store_txn_put(drey_store_txn *t, const drey_key *k, const drey_value *v, int64_t expires_at_ms,
                        uint64_t version) {
    drey_store *s = t->store;
    shard *sh = txn_shard(t, k);
    entry *e = new_entry(k, v, expires_at_ms, version, t->tenant);
    entry **slot = find_slot(sh, k);
    entry *old = *slot;
    if (old != NULL && !drey_store__retired(s, old)) {
        /* The same cache's slot, and its recency or frequency goes on
         * (Redis keeps an overwritten key's LFU counter). */
        e->cache_id = old->cache_id;
        e->access = drey_store__access_new(s, old->access, true);
        e->next = old->next;
        *slot = e;
        track_expiry(s, sh, e, old->expires_at_ms, expires_at_ms);
        if (drey_store__tenant(old) != t->tenant) {
            /* The entry changes hands: the old tenant's bytes go, the new
             * one's come (the totals see only the difference). */
            tenant_account(s, old, -(int64_t)drey_store__entry_bytes(old));
            tenant_account(s, e, (int64_t)drey_store__entry_bytes(old));
        }
        account(s, sh, e, (int64_t)drey_store__entry_bytes(e) - (int64_t)drey_store__entry_bytes(old));
        free(old); /* after the copy: v may point into it */
        drey_store__observe(s, DREY_STORE_CHANGE_SET, e);
        return;
    }
    if (old != NULL) /* a cleared cache's entry: it goes, the new one counts afresh */
        unlink_free(s, sh, find_slot(sh, k));
    e->cache_id = drey_store__slot_for(s, k->cache, k->cache_len);
    e->access = drey_store__access_new(s, 0, false);
    slot = find_slot(sh, k);
    e->next = NULL;
    *slot = e;
    count_entry(sh, e);
    track_expiry(s, sh, e, 0, expires_at_ms);
    account(s, sh, e, (int64_t)drey_store__entry_bytes(e));
    if (sh->count > sh->mask + 1)
        drey_store__resize(sh, (sh->mask + 1) * 2);
    drey_store__observe(s, DREY_STORE_CHANGE_SET, e);
}

bool drey_store_txn_set_expiry(drey_store_txn *t, const drey_key *k, int64_t expires_at_ms) {
    shard *sh = txn_shard(t, k);
    entry *e = *find_slot(sh, k);
    if (e == NULL)
        return false;
    track_expiry(t->store, sh, e, e->expires_at_ms, expires_at_ms);
    e->expires_at_ms = expires_at_ms;
    return true;
}

bool drey_store_txn_remove(drey_store_txn *t, const drey_key *k) {
    shard *sh = txn_shard(t, k);
    entry **slot = find_slot(sh, k);
    if (*slot == NULL)
        return false;
    if (!drey_store__retired(t->store, *slot))
        drey_store__observe(t->store, DREY_STORE_CHANGE_REMOVE, *slot);
    unlink_free(t->store, sh, slot);
    return true;
}

size_t drey_store_txn_evict(drey_store_txn *t, const drey_key *k, uint64_t version) {
    drey_store *s = t->store;
    shard *sh = txn_shard(t, k);
    entry **slot = find_slot(sh, k);
    if (*slot == NULL || (*slot)->version != version || drey_store__retired(s, *slot))
        return 0;
    size_t bytes = drey_store__entry_bytes(*slot);
    if (!t->copy) {
        cache_slot *c = drey_store__slot(s, (*slot)->cache_id);
        atomic_fetch_add_explicit(&c->evictions, 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&c->evicted_bytes, bytes, memory_order_relaxed);
    }
    atomic_fetch_add_explicit(&s->evictions, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->evicted_bytes, bytes, memory_order_relaxed);
    drey_store__observe(s, DREY_STORE_CHANGE_EVICT, *slot);
    unlink_free(s, sh, slot);
    return bytes;
}

size_t drey_store_sweep(drey_store *s, int64_t now_ms, size_t max_buckets, size_t *expired) {
    layout *L = drey_store__layout(s);
    size_t idx = atomic_fetch_add_explicit(&s->sweep_shard, 1, memory_order_relaxed) % L->n_tables;
    shard *sh = &L->tables[idx];
    size_t examined = 0, freed = 0, cleared = 0;
    if (atomic_load_explicit(&sh->expiring, memory_order_relaxed) == 0 &&
        atomic_load_explicit(&s->orphans, memory_order_relaxed) == 0)
        return 0; /* nothing can expire: no write lock to stall readers */
    pthread_rwlock_t *lock = drey_store__lock_of(s, idx);
    pthread_rwlock_wrlock(lock);
    if (atomic_load_explicit(&s->layout, memory_order_relaxed) != L) {
        pthread_rwlock_unlock(lock); /* the store was partitioned meanwhile */
        return 0;
    }
    drey_store__capture_if_pending(s, idx % DREY_STORE_SHARDS);
    size_t nbuckets = sh->mask + 1;
    size_t steps = max_buckets < nbuckets ? max_buckets : nbuckets;
    for (size_t i = 0; i < steps; i++) {
        size_t b = sh->sweep_cursor;
        sh->sweep_cursor = (b + 1) & sh->mask;
        entry **slot = &sh->buckets[b];
        while (*slot != NULL) {
            examined++;
            if (drey_store__is_live(s, *slot, now_ms)) {
                slot = &(*slot)->next;
                continue;
            }
            bool orphan = drey_store__retired(s, *slot);
            if (!orphan)
                drey_store__observe(s, DREY_STORE_CHANGE_EXPIRE, *slot);
            size_t before = sh->mask;
            unlink_free(s, sh, slot);
            freed++;
            cleared += orphan;
            if (sh->mask != before)
                goto out; /* the table shrank under the cursor: resume next step */
        }
    }
out:
    pthread_rwlock_unlock(lock);
    /* Cleared entries count as freed (the expiry cycle goes on while there
     * are many), not as expired. */
    atomic_fetch_add_explicit(&s->expired_swept, freed - cleared, memory_order_relaxed);
    *expired += freed;
    return examined;
}

int64_t drey_store_bytes(const drey_store *s) {
    return atomic_load_explicit(&s->bytes, memory_order_relaxed);
}

size_t drey_store_entry_size(drey_store *s, const drey_key *k, int64_t now_ms) {
    uint32_t tenant;
    return drey_store_entry_size_tenant(s, k, now_ms, &tenant);
}

size_t drey_store_entry_size_tenant(drey_store *s, const drey_key *k, int64_t now_ms, uint32_t *tenant) {
    pthread_rwlock_t *lock = drey_store__lock_of(s, k->table);
    pthread_rwlock_rdlock(lock);
    entry *e = *find_slot(table_of(s, k), k);
    bool live = e != NULL && drey_store__is_live(s, e, now_ms);
    size_t n = live ? drey_store__entry_bytes(e) : 0;
    *tenant = live ? drey_store__tenant(e) : 0;
    pthread_rwlock_unlock(lock);
    return n;
}

/* --- tenants -------------------------------------------------------------- */

void drey_store_set_tenants(drey_store *s, const drey_store_tenants *t) {
    s->tenants = *t;
}

uint32_t drey_store_tenant_id(drey_store *s, const char *name, size_t len) {
    if (len == 0 || s->tenants.intern == NULL)
        return 0;
    return s->tenants.intern(s->tenants.ctx, name, len);
}

const char *drey_store_tenant_name(drey_store *s, uint32_t tenant, size_t *len) {
    if (tenant == 0 || s->tenants.name == NULL) {
        *len = 0;
        return "";
    }
    return s->tenants.name(s->tenants.ctx, tenant, len);
}

void drey_store_get_stats(drey_store *s, drey_store_stats *out) {
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < DREY_STORE_SHARDS; i++) {
        pthread_rwlock_rdlock(&s->stripes[i].lock);
        layout *L = atomic_load_explicit(&s->layout, memory_order_relaxed);
        for (size_t t = i; t < L->n_tables; t += DREY_STORE_SHARDS) {
            shard *sh = &L->tables[t];
            out->entries += sh->count;
            out->bytes += sh->bytes;
            out->buckets += sh->mask + 1;
            out->expiring += atomic_load_explicit(&sh->expiring, memory_order_relaxed);
        }
        pthread_rwlock_unlock(&s->stripes[i].lock);
    }
    out->expired_swept = atomic_load_explicit(&s->expired_swept, memory_order_relaxed);
    int64_t orphans = atomic_load_explicit(&s->orphans, memory_order_relaxed);
    out->clearing = orphans > 0 ? (uint64_t)orphans : 0;
    out->evictions = atomic_load_explicit(&s->evictions, memory_order_relaxed);
    out->evicted_bytes = atomic_load_explicit(&s->evicted_bytes, memory_order_relaxed);
}

/* --- caches --------------------------------------------------------------- */

void drey_store__normalize_cache(const char **cache, size_t *len) {
    if (*len == 7 && memcmp(*cache, "default", 7) == 0)
        *len = 0;
    if (*len == 0)
        *cache = "";
}

static void stats_of(const cache_slot *c, drey_cache_stats *out) {
    int64_t n = atomic_load_explicit(&c->entries, memory_order_relaxed);
    int64_t b = atomic_load_explicit(&c->bytes, memory_order_relaxed);
    int64_t x = atomic_load_explicit(&c->expiring, memory_order_relaxed);
    out->cache = c->name;
    out->cache_len = c->name_len;
    /* Each counter is exact; read one after another while writers run,
     * they may be a moment apart, never negative. */
    out->entries = n > 0 ? (uint64_t)n : 0;
    out->bytes = b > 0 ? (uint64_t)b : 0;
    out->expiring = x > 0 ? (uint64_t)x : 0;
    out->evictions = atomic_load_explicit(&c->evictions, memory_order_relaxed);
    out->evicted_bytes = atomic_load_explicit(&c->evicted_bytes, memory_order_relaxed);
}

void drey_store_cache_stats(drey_store *s, const char *cache, size_t cache_len, drey_cache_stats *out) {
    drey_store__normalize_cache(&cache, &cache_len);
    memset(out, 0, sizeof *out);
    out->cache = cache;
    out->cache_len = cache_len;
    pthread_mutex_lock(&s->reg.mu);
    bool found;
    size_t i = drey_store__map_find(s, cache, cache_len, &found);
    if (found) {
        stats_of(drey_store__slot(s, s->reg.map[i] - 1), out);
        out->cache = cache; /* the slot's name is only valid under the lock */
    }
    pthread_mutex_unlock(&s->reg.mu);
}

void drey_store_list_caches(drey_store *s, void (*fn)(void *arg, const drey_cache_stats *c), void *arg) {
    registry *r = &s->reg;
    pthread_mutex_lock(&r->mu);
    for (size_t i = 0; i < r->map_cap; i++) {
        if (r->map[i] == MAP_EMPTY || r->map[i] == MAP_DELETED)
            continue;
        drey_cache_stats st;
        stats_of(drey_store__slot(s, r->map[i] - 1), &st);
        if (st.entries > 0)
            fn(arg, &st);
    }
    pthread_mutex_unlock(&r->mu);
}

uint64_t drey_store_clear_cache(drey_store *s, const char *cache, size_t cache_len) {
    drey_store__normalize_cache(&cache, &cache_len);
    /* Every shard, in the transactions' order: no reader sees a part of the
     * cache gone and another part still there. A capture in progress takes
     * each shard as it was before the clear. */
    for (size_t i = 0; i < DREY_STORE_SHARDS; i++) {
        pthread_rwlock_wrlock(&s->stripes[i].lock);
        drey_store__capture_if_pending(s, i);
    }
    uint64_t cleared = 0;
    registry *r = &s->reg;
    pthread_mutex_lock(&r->mu);
    bool found;
    size_t i = drey_store__map_find(s, cache, cache_len, &found);
    if (found) {
        uint32_t id = r->map[i] - 1;
        cache_slot *c = drey_store__slot(s, id);
        r->map[i] = MAP_DELETED;
        int64_t n = atomic_load(&c->entries);
        cleared = n > 0 ? (uint64_t)n : 0;
        if (n > 0) {
            c->retired = true;
            atomic_fetch_add(&s->orphans, n);
        } else {
            drey_store__slot_release(s, id);
        }
    }
    pthread_mutex_unlock(&r->mu);
    const drey_store_observer *o = atomic_load_explicit(&s->observer, memory_order_acquire);
    if (o != NULL && !(cache_len > 0 && cache[0] == '#')) {
        drey_store_change c = {.kind = DREY_STORE_CHANGE_CLEAR, .cache = cache, .cache_len = cache_len};
        o->fn(o->ctx, &c); /* every shard still locked: after each key's earlier changes */
    }
    for (size_t j = DREY_STORE_SHARDS; j-- > 0;)
        pthread_rwlock_unlock(&s->stripes[j].lock);
    return cleared;
}
