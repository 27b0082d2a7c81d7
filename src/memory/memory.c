/*
 * memory — memory admission; see include/drey/memory.h.
 *
 * jemalloc is looked up at run time (dlsym of mallctl), so the same code runs
 * in the ASan build, which uses the system allocator and reports -1.
 */
#include "drey/memory.h"

#include <dlfcn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "drey/alloc.h"

/* A refused write may retry after about this long: memory frees as entries
 * expire or are removed, not on a clock. */
#define RETRY_MS 1000

struct drey_memory {
    drey_store *store;
    int64_t limit, high, critical;
    char node_id[96];
    _Atomic uint64_t rejections;
    _Atomic uint64_t evicting;
    uint32_t max_caches;
};

static int64_t read_limit_file(const char *path) {
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return 0;
    char buf[64] = "";
    int64_t v = 0;
    if (fgets(buf, sizeof buf, f) != NULL && strncmp(buf, "max", 3) != 0)
        v = strtoll(buf, NULL, 10);
    fclose(f);
    return v;
}

int64_t drey_memory_default_limit(void) {
    int64_t ram = (int64_t)sysconf(_SC_PHYS_PAGES) * (int64_t)sysconf(_SC_PAGE_SIZE);
    int64_t cg = read_limit_file("/sys/fs/cgroup/memory.max");
    if (cg <= 0)
        cg = read_limit_file("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    /* cgroup v1 reports "no limit" as a huge number. */
    int64_t base = cg > 0 && cg < ram ? cg : ram;
    return base / 10 * 8;
}

drey_memory *drey_memory_create(const drey_memory_options *opts, drey_store *store) {
    drey_memory *m = drey_xcalloc(1, sizeof *m);
    m->store = store;
    m->limit = opts->limit_bytes > 0 ? opts->limit_bytes : drey_memory_default_limit();
    m->high = m->limit * 80 / 100; /* the limit is at most 2^50 (config): no overflow */
    m->critical = m->limit * 95 / 100;
    snprintf(m->node_id, sizeof m->node_id, "%s", opts->node_id != NULL ? opts->node_id : "");
    m->max_caches = opts->max_caches;
    return m;
}

void drey_memory_destroy(drey_memory *m) {
    free(m);
}

static drey_level state_of(const drey_memory *m, int64_t used) {
    return used >= m->critical ? DREY_LEVEL_CRITICAL : used >= m->high ? DREY_LEVEL_HIGH : DREY_LEVEL_NORMAL;
}

static bool refuse(drey_memory *m, int64_t used, int64_t growth, drey_status *st);

bool drey_memory_admit(drey_memory *m, int64_t growth, drey_status *st) {
    if (growth <= 0)
        return true;
    int64_t used = drey_store_bytes(m->store);
    if (growth <= m->critical - used) /* not used + growth: it may overflow */
        return true;
    return refuse(m, used, growth, st);
}

typedef struct victims {
    drey_arena *arena;
    drey_store_victim *v;
    size_t n, cap;
    size_t first_new;   /* victims before it were chosen by an earlier call */
    int64_t duplicates; /* bytes chosen again (dropped) */
} victims;

static void add_victim(void *arg, const drey_store_item *it, size_t bytes) {
    victims *vs = arg;
    /* A second choice (the writer's tenant's entries first, then any) may
     * sample one the first took: versions are unique. */
    for (size_t i = 0; i < vs->first_new; i++) {
        if (vs->v[i].version == it->entry.version) {
            vs->duplicates += (int64_t)bytes;
            return;
        }
    }
    if (vs->n == vs->cap) { /* usually one or two victims: grow as needed */
        size_t cap = vs->cap ? vs->cap * 2 : 4;
        drey_store_victim *v = drey_arena_alloc(vs->arena, cap * sizeof *v);
        if (vs->n > 0)
            memcpy(v, vs->v, vs->n * sizeof *v);
        vs->v = v;
        vs->cap = cap;
    }
    drey_store_victim *e = &vs->v[vs->n++];
    e->cache = drey_arena_strndup(vs->arena, it->cache, it->cache_len);
    e->cache_len = it->cache_len;
    e->key = drey_arena_strndup(vs->arena, it->key, it->key_len);
    e->key_len = it->key_len;
    e->version = it->entry.version;
}

bool drey_memory_admit_cache(drey_memory *m, const char *cache, drey_status *st) {
    if (m->max_caches == 0 || drey_store_cache_admits(m->store, cache, strlen(cache), m->max_caches))
        return true;
    drey_status_init(st);
    drey_status_set(st, DREY_ERR_TOO_MANY_CACHES);
    drey_status_add_metadata(st, "limitCaches", "%u", m->max_caches);
    snprintf(st->quota_subject, sizeof st->quota_subject, "node:%s", m->node_id);
    st->quota_description = "the write would open a cache past --max-caches";
    st->retry_delay_ms = RETRY_MS;
    return false;
}

bool drey_memory_evicts(const drey_memory *m) {
    return drey_store_policy(m->store) != DREY_EVICT_NONE;
}

bool drey_memory_admit_evicting(drey_memory *m, int64_t growth, int64_t now_ms, const drey_store_filter *only,
                                int64_t others, drey_arena *arena, const drey_store_victim **evicted,
                                size_t *n_evicted, int64_t *evicted_bytes, drey_status *st) {
    *evicted = NULL;
    *n_evicted = 0;
    *evicted_bytes = 0;
    return drey_memory_admit_evicting_tenant(m, growth, now_ms, only, 0, others, arena, evicted, n_evicted,
                                             evicted_bytes, st);
}

/* Chooses need bytes of victims (within only, and of tenant when it is not
 * 0) onto vs; returns the bytes chosen. */
static int64_t choose(drey_memory *m, int64_t now_ms, int64_t need, const drey_store_filter *only, uint32_t tenant,
                      victims *vs) {
    drey_store_filter f = only != NULL ? *only : (drey_store_filter){0};
    f.tenant = tenant;
    vs->first_new = vs->n;
    vs->duplicates = 0;
    size_t room = DREY_MEMORY_MAX_EVICTIONS > vs->n ? DREY_MEMORY_MAX_EVICTIONS - vs->n : 0;
    int64_t chosen = drey_store_evict_choose(m->store, now_ms, need, room, &f, add_victim, vs);
    return chosen - vs->duplicates;
}

bool drey_memory_admit_evicting_tenant(drey_memory *m, int64_t growth, int64_t now_ms, const drey_store_filter *only,
                                       uint32_t tenant, int64_t others, drey_arena *arena,
                                       const drey_store_victim **evicted, size_t *n_evicted, int64_t *evicted_bytes,
                                       drey_status *st) {
    int64_t pre = *evicted_bytes; /* chosen already (the tenant's quota): they count first */
    growth -= pre;
    if (growth <= 0)
        return true;
    int64_t used = drey_store_bytes(m->store);
    int64_t room = m->critical - used;
    bool policy = drey_memory_evicts(m);
    int64_t tightest = policy && others < room ? others : room;
    if (growth <= tightest)
        return true;
    if (!policy)
        return refuse(m, used, growth, st);
    /* Room for this write only (Redis evicts per command the same way):
     * evicting further ahead would journal victims no write needed yet. */
    int64_t need = growth - tightest;
    victims vs = {.arena = arena, .v = (drey_store_victim *)*evicted, .n = *n_evicted, .cap = *n_evicted};
    /* The writer's tenant's own entries are the first candidates: a tenant
     * filling memory churns its own data before anyone else's. */
    int64_t chosen = tenant != 0 ? choose(m, now_ms, need, only, tenant, &vs) : 0;
    if (chosen < need)
        chosen += choose(m, now_ms, need - chosen, only, 0, &vs);
    if (chosen < need && growth <= room)
        return true; /* it fits here: the copy it does not fit on refuses it (the replicator) */
    if (chosen < need) {
        bool ok = refuse(m, used, growth, st);
        drey_status_add_metadata(st, "evictionPolicy", "%s", drey_evict_policy_name(drey_store_policy(m->store)));
        drey_status_add_metadata(st, "evictableBytes", "%lld", (long long)chosen);
        return ok;
    }
    atomic_fetch_add_explicit(&m->evicting, 1, memory_order_relaxed);
    *evicted = vs.v;
    *n_evicted = vs.n;
    *evicted_bytes = pre + chosen;
    return true;
}

int64_t drey_memory_choose_tenant(drey_memory *m, int64_t need_bytes, int64_t now_ms, const drey_store_filter *only,
                                  uint32_t tenant, drey_arena *arena, const drey_store_victim **evicted,
                                  size_t *n_evicted) {
    victims vs = {.arena = arena, .v = (drey_store_victim *)*evicted, .n = *n_evicted, .cap = *n_evicted};
    int64_t chosen = choose(m, now_ms, need_bytes, only, tenant, &vs);
    *evicted = vs.v;
    *n_evicted = vs.n;
    return chosen;
}

static bool refuse(drey_memory *m, int64_t used, int64_t growth, drey_status *st) {
    atomic_fetch_add_explicit(&m->rejections, 1, memory_order_relaxed);
    drey_status_init(st);
    drey_status_set(st, DREY_ERR_MEMORY_PRESSURE);
    drey_status_add_metadata(st, "limitBytes", "%lld", (long long)m->limit);
    drey_status_add_metadata(st, "usedBytes", "%lld", (long long)used);
    drey_status_add_metadata(st, "criticalBytes", "%lld", (long long)m->critical);
    drey_status_add_metadata(st, "requestBytes", "%lld", (long long)growth);
    snprintf(st->quota_subject, sizeof st->quota_subject, "node:%s", m->node_id);
    st->quota_description = "memory in use would pass the node's critical level";
    st->retry_delay_ms = RETRY_MS;
    return false;
}

static int64_t jemalloc_allocated(void) {
    typedef int (*mallctl_fn)(const char *, void *, size_t *, void *, size_t);
    mallctl_fn mallctl = (mallctl_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "mallctl");
    if (mallctl == NULL)
        return -1;
    uint64_t epoch = 1;
    size_t sz = sizeof epoch;
    mallctl("epoch", &epoch, &sz, &epoch, sz); /* refresh the cached statistics */
    size_t allocated;
    sz = sizeof allocated;
    if (mallctl("stats.allocated", &allocated, &sz, NULL, 0) != 0)
        return -1;
    return (int64_t)allocated;
}

int64_t drey_memory_room(drey_memory *m) {
    int64_t used = drey_store_bytes(m->store);
    return m->critical > used ? m->critical - used : 0;
}

void drey_memory_get_stats(drey_memory *m, drey_memory_stats *out) {
    out->limit_bytes = m->limit;
    out->high_bytes = m->high;
    out->critical_bytes = m->critical;
    out->used_bytes = drey_store_bytes(m->store);
    out->state = state_of(m, out->used_bytes);
    out->jemalloc_allocated_bytes = jemalloc_allocated();
    out->rejections = atomic_load_explicit(&m->rejections, memory_order_relaxed);
    out->evicting_admissions = atomic_load_explicit(&m->evicting, memory_order_relaxed);
}
