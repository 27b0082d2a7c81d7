/*
 * tenant — the table of tenants, their bytes, and admission; see
 * include/drey/tenant.h.
 *
 * Numbers are handed out under a mutex (once per tenant and token: the
 * grants remember theirs); a number's record is found without a lock, in
 * chunks that never move. The store reports bytes under its shard locks:
 * the counters are atomics, and a cluster node's per-partition counters
 * hang off the record once it joined.
 */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/log.h"
#include "drey/metrics.h"
#include "drey/placement.h"
#include "internal.h"

static uint64_t name_hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ULL;
    return h;
}

tenant *drey_tenants__get(drey_tenants *t, uint32_t id) {
    if (id == 0 || id > atomic_load_explicit(&t->n, memory_order_acquire))
        return NULL;
    tenant *chunk = atomic_load_explicit(&t->chunks[(id - 1) / TENANT_CHUNK], memory_order_acquire);
    return &chunk[(id - 1) % TENANT_CHUNK];
}

/* The map slot of name: its own, or the empty one it goes to. Under mu. */
static uint32_t *map_slot(drey_tenants *t, const char *name, size_t len) {
    size_t mask = t->map_cap - 1, i = name_hash(name, len) & mask;
    for (;;) {
        uint32_t id = t->map[i];
        if (id == 0)
            return &t->map[i];
        tenant *x = drey_tenants__get(t, id);
        if (x->len == len && memcmp(x->name, name, len) == 0)
            return &t->map[i];
        i = (i + 1) & mask;
    }
}

static void map_grow(drey_tenants *t) {
    uint32_t *old = t->map;
    size_t old_cap = t->map_cap;
    t->map_cap *= 2;
    t->map = drey_xcalloc(t->map_cap, sizeof *t->map);
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i] != 0) {
            tenant *x = drey_tenants__get(t, old[i]);
            *map_slot(t, x->name, x->len) = old[i];
        }
    }
    free(old);
}

static _Atomic int64_t *new_parts(uint32_t n) {
    _Atomic int64_t *p = drey_xcalloc(n, sizeof *p);
    for (uint32_t i = 0; i < n; i++)
        atomic_init(&p[i], 0);
    return p;
}

uint32_t drey_tenants_intern(drey_tenants *t, const char *name, size_t len) {
    if (len == 0)
        return 0;
    if (len > TENANT_NAME_MAX)
        len = TENANT_NAME_MAX; /* authz never hands out longer ones */
    pthread_mutex_lock(&t->mu);
    uint32_t *slot = map_slot(t, name, len);
    if (*slot != 0) {
        uint32_t id = *slot;
        pthread_mutex_unlock(&t->mu);
        return id;
    }
    uint32_t id = atomic_load_explicit(&t->n, memory_order_relaxed) + 1;
    if ((id - 1) / TENANT_CHUNK >= TENANT_CHUNKS) {
        DREY_LOG_ERROR("more tenants than the table holds", DREY_LOG_UINT("max", (uint64_t)TENANT_CHUNK * TENANT_CHUNKS));
        abort();
    }
    tenant *chunk = atomic_load_explicit(&t->chunks[(id - 1) / TENANT_CHUNK], memory_order_relaxed);
    if (chunk == NULL) {
        chunk = drey_xcalloc(TENANT_CHUNK, sizeof *chunk);
        atomic_store_explicit(&t->chunks[(id - 1) / TENANT_CHUNK], chunk, memory_order_release);
    }
    tenant *x = &chunk[(id - 1) % TENANT_CHUNK];
    memcpy(x->name, name, len);
    x->name[len] = '\0';
    x->len = len;
    atomic_init(&x->limit, -1);
    uint32_t parts = atomic_load(&t->partitions);
    if (parts > 0)
        atomic_store(&x->parts, new_parts(parts));
    atomic_store_explicit(&t->n, id, memory_order_release);
    *slot = id;
    if ((size_t)id * 2 > t->map_cap)
        map_grow(t);
    pthread_mutex_unlock(&t->mu);
    return id;
}

/* --- the store's accountant ----------------------------------------------------------- */

static void account(void *ctx, uint32_t id, const char *cache, size_t cache_len, const char *key, size_t key_len,
                    int64_t delta) {
    drey_tenants *t = ctx;
    tenant *x = drey_tenants__get(t, id);
    if (x == NULL)
        return;
    atomic_fetch_add_explicit(&x->bytes, delta, memory_order_relaxed);
    _Atomic int64_t *parts = atomic_load_explicit(&x->parts, memory_order_acquire);
    if (parts != NULL) {
        uint32_t p = drey_placement_partition(cache, cache_len, key, key_len, atomic_load(&t->partitions));
        atomic_fetch_add_explicit(&parts[p], delta, memory_order_relaxed);
    }
}

static uint32_t intern(void *ctx, const char *name, size_t len) {
    return drey_tenants_intern(ctx, name, len);
}

static const char *name_of(void *ctx, uint32_t id, size_t *len) {
    tenant *x = drey_tenants__get(ctx, id);
    *len = x != NULL ? x->len : 0;
    return x != NULL ? x->name : "";
}

drey_tenants *drey_tenants_create(drey_store *store) {
    drey_tenants *t = drey_xcalloc(1, sizeof *t);
    t->store = store;
    pthread_mutex_init(&t->mu, NULL);
    t->map_cap = 64;
    t->map = drey_xcalloc(t->map_cap, sizeof *t->map);
    drey_store_set_tenants(store, &(drey_store_tenants){.account = account, .intern = intern, .name = name_of,
                                                         .ctx = t});
    return t;
}

void drey_tenants_destroy(drey_tenants *t) {
    if (t == NULL)
        return;
    drey_tenants_leave(t);
    uint32_t n = atomic_load(&t->n);
    for (uint32_t id = 1; id <= n; id++) {
        tenant *x = drey_tenants__get(t, id);
        free(atomic_load(&x->parts));
        for (tenant_waiter *w = x->waiters; w != NULL;) {
            tenant_waiter *next = w->next;
            free(w);
            w = next;
        }
    }
    for (size_t i = 0; i < TENANT_CHUNKS; i++)
        free(atomic_load(&t->chunks[i]));
    free(t->map);
    free(t->owned);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

void drey_tenants_set_limits(drey_tenants *t, int64_t (*limit)(void *ctx, const char *tenant, size_t len), void *ctx) {
    t->limit = limit;
    t->limit_ctx = ctx;
}

int64_t drey_tenants__local(drey_tenants *t, tenant *x) {
    _Atomic int64_t *parts = atomic_load_explicit(&x->parts, memory_order_acquire);
    if (parts == NULL || t->owned == NULL)
        return atomic_load_explicit(&x->bytes, memory_order_relaxed);
    uint32_t n = atomic_load(&t->partitions);
    int64_t sum = 0;
    for (uint32_t w = 0; w < (n + 63) / 64; w++) {
        for (uint64_t bits = atomic_load_explicit(&t->owned[w], memory_order_relaxed); bits != 0; bits &= bits - 1)
            sum += atomic_load_explicit(&parts[w * 64 + (uint32_t)__builtin_ctzll(bits)], memory_order_relaxed);
    }
    return sum;
}

int64_t drey_tenants_used(drey_tenants *t, uint32_t id) {
    tenant *x = drey_tenants__get(t, id);
    return x != NULL ? drey_tenants__local(t, x) : 0;
}

/* --- admission ----------------------------------------------------------------------- */

drey_tenant_verdict drey_tenants_admit(drey_tenants *t, const drey_tenant_ask *a, drey_tenant_admission *out) {
    tenant *x = drey_tenants__get(t, a->tenant);
    if (x == NULL)
        return DREY_TENANT_ADMITTED; /* never: ids come from this table */
    atomic_store_explicit(&x->limit, a->limit_bytes, memory_order_relaxed);
    bool shared = t->ledger != NULL;
    for (;;) {
        int64_t used = drey_tenants__local(t, x);
        int64_t pending = atomic_load(&x->pending);
        int64_t cap = a->limit_bytes, granted = shared ? atomic_load(&x->granted) : cap;
        if (granted < cap)
            cap = granted;
        int64_t after = used + pending + a->growth_bytes;
        if (after <= cap) {
            if (!atomic_compare_exchange_weak(&x->pending, &pending, pending + a->growth_bytes))
                continue; /* another write reserved meanwhile: look again */
            /* Ask before it is needed, so that the write after next does
             * not have to wait for etcd. */
            if (shared && granted < a->limit_bytes && after > granted - granted / 4)
                drey_tenants__ledger_ask(t, x, after - granted + a->growth_bytes, NULL);
            return DREY_TENANT_ADMITTED;
        }
        out->used_bytes = used + pending + (shared ? atomic_load(&x->others_used) : 0);
        out->limit_bytes = a->limit_bytes;
        if (shared && granted < a->limit_bytes && a->may_wait &&
            drey_mono_ns() >= atomic_load(&x->exhausted_until_ns)) {
            tenant_waiter *w = drey_xcalloc(1, sizeof *w);
            w->resume = a->resume;
            w->arg = a->arg;
            drey_tenants__ledger_ask(t, x, after - granted, w);
            return DREY_TENANT_PARKED;
        }
        return DREY_TENANT_REFUSED;
    }
}

void drey_tenants_release(drey_tenants *t, uint32_t id, int64_t growth_bytes) {
    tenant *x = drey_tenants__get(t, id);
    if (x != NULL)
        atomic_fetch_sub(&x->pending, growth_bytes);
}

void drey_tenants_refused(drey_tenants *t, uint32_t id) {
    tenant *x = drey_tenants__get(t, id);
    if (x != NULL)
        atomic_fetch_add_explicit(&x->refused, 1, memory_order_relaxed);
}

/* --- clusters ------------------------------------------------------------------------- */

typedef struct counting {
    drey_tenants *t;
    uint32_t partitions;
} counting;

static void count_item(void *arg, const drey_store_item *it) {
    counting *c = arg;
    tenant *x = drey_tenants__get(c->t, it->tenant);
    if (x == NULL)
        return;
    size_t bytes = drey_store_entry_bytes(it->cache_len, it->key_len, it->entry.value.len);
    uint32_t p = drey_placement_partition(it->cache, it->cache_len, it->key, it->key_len, c->partitions);
    atomic_fetch_add_explicit(&atomic_load(&x->parts)[p], (int64_t)bytes, memory_order_relaxed);
}

int drey_tenants_join(drey_tenants *t, const drey_tenants_cluster *c, char *err, size_t err_cap) {
    if (c->partitions == 0) {
        snprintf(err, err_cap, "tenants: the cluster has no partitions");
        return -1;
    }
    pthread_mutex_lock(&t->mu);
    t->owned = drey_xcalloc((c->partitions + 63) / 64, sizeof *t->owned);
    uint32_t n = atomic_load(&t->n);
    for (uint32_t id = 1; id <= n; id++)
        atomic_store(&drey_tenants__get(t, id)->parts, new_parts(c->partitions));
    atomic_store(&t->partitions, c->partitions);
    pthread_mutex_unlock(&t->mu);
    /* Nothing writes yet (the node does not serve before it joined): the
     * entries recovery brought back are counted by partition once. Expired
     * ones count too, as they do in the store's totals until swept. */
    counting cn = {.t = t, .partitions = c->partitions};
    for (size_t s = 0; s < DREY_STORE_SHARDS; s++)
        drey_store_walk_shard(t->store, s, INT64_MIN, count_item, &cn);
    return drey_tenants__ledger_start(t, c, err, err_cap);
}

void drey_tenants_leave(drey_tenants *t) {
    if (t->ledger != NULL)
        drey_tenants__ledger_stop(t);
}

/* --- what operators see ------------------------------------------------------------------ */

static void stats_of(drey_tenants *t, tenant *x, drey_tenant_stats *s) {
    memcpy(s->tenant, x->name, x->len + 1);
    s->used_bytes = drey_tenants__local(t, x);
    int64_t limit = t->limit != NULL ? t->limit(t->limit_ctx, x->name, x->len) : atomic_load(&x->limit);
    s->limit_bytes = limit;
    bool shared = t->ledger != NULL;
    s->cluster_used_bytes = s->used_bytes + (shared ? atomic_load(&x->others_used) : 0);
    s->granted_bytes = shared ? atomic_load(&x->granted) : limit;
    s->refused_writes = atomic_load_explicit(&x->refused, memory_order_relaxed);
}

size_t drey_tenants_top(drey_tenants *t, drey_tenant_stats *top, size_t cap, drey_tenants_summary *sum) {
    memset(sum, 0, sizeof *sum);
    sum->other.limit_bytes = -1;
    size_t n_top = 0;
    uint32_t n = atomic_load_explicit(&t->n, memory_order_acquire);
    for (uint32_t id = 1; id <= n; id++) {
        tenant *x = drey_tenants__get(t, id);
        drey_tenant_stats s;
        stats_of(t, x, &s);
        sum->refused_writes += s.refused_writes;
        if (s.used_bytes == 0 && s.refused_writes == 0 && atomic_load(&x->pending) == 0)
            continue; /* nothing here: not listed */
        sum->tenants++;
        /* Insert by bytes; what falls off the end goes to "other". */
        size_t k = n_top;
        while (k > 0 && top[k - 1].used_bytes < s.used_bytes)
            k--;
        drey_tenant_stats fall = s;
        if (k < cap) {
            if (n_top == cap)
                fall = top[cap - 1];
            size_t moved = (n_top < cap ? n_top : cap - 1) - k;
            memmove(&top[k + 1], &top[k], moved * sizeof *top);
            top[k] = s;
            if (n_top < cap) {
                n_top++;
                continue;
            }
        }
        sum->other.used_bytes += fall.used_bytes;
        sum->other.cluster_used_bytes += fall.cluster_used_bytes;
        sum->other.refused_writes += fall.refused_writes;
        sum->other_tenants++;
    }
    return n_top;
}

#define TOP_TENANTS 10

/* A value of drey_tenant_stats by its offset. */
static double stat_at(const drey_tenant_stats *st, size_t field) {
    if (field == offsetof(drey_tenant_stats, refused_writes))
        return (double)st->refused_writes;
    return (double)*(const int64_t *)(const void *)((const char *)st + field);
}

/* One series for the top tenants, and for the rest when a sum of them
 * means something (`other`). */
static void tenant_series(FILE *out, const char *name, const char *type, const char *help,
                          const drey_tenant_stats *top, size_t n, size_t field, const drey_tenant_stats *other) {
    char labels[300];
    drey_metrics_header(out, name, type, help);
    for (size_t i = 0; i < n; i++) {
        drey_metrics_labels(labels, sizeof labels, "tenant", top[i].tenant, NULL);
        drey_metrics_sample(out, name, labels, stat_at(&top[i], field));
    }
    if (other != NULL)
        drey_metrics_sample(out, name, "tenant=\"other\"", stat_at(other, field));
}

void drey_tenants_collect_metrics(void *ctx, FILE *out) {
    drey_tenants *t = ctx;
    drey_tenant_stats top[TOP_TENANTS];
    drey_tenants_summary sum;
    size_t n = drey_tenants_top(t, top, TOP_TENANTS, &sum);
    drey_metrics_header(out, "drey_tenants", "gauge", "Tenants with entries here.");
    drey_metrics_sample(out, "drey_tenants", NULL, (double)sum.tenants);
    tenant_series(out, "drey_tenant_used_bytes", "gauge",
                  "Accounted bytes of each tenant's entries here (a cluster node: in the partitions it leads), for "
                  "the 10 largest tenants; tenant=\"other\" sums the rest.",
                  top, n, offsetof(drey_tenant_stats, used_bytes), &sum.other);
    tenant_series(out, "drey_tenant_limit_bytes", "gauge", "The memory quota of each of the same tenants (-1: none).",
                  top, n, offsetof(drey_tenant_stats, limit_bytes), NULL);
    tenant_series(out, "drey_tenant_refused_writes_total", "counter",
                  "Writes refused TENANT_MEMORY_QUOTA here, for the same tenants and the rest.", top, n,
                  offsetof(drey_tenant_stats, refused_writes), &sum.other);
    if (t->ledger == NULL)
        return;
    tenant_series(out, "drey_tenant_granted_bytes", "gauge",
                  "A cluster node: the share of each of the same tenants' quota it holds (etcd ledger).", top, n,
                  offsetof(drey_tenant_stats, granted_bytes), NULL);
    tenant_series(out, "drey_tenant_cluster_used_bytes", "gauge",
                  "A cluster node: each of the same tenants' bytes on every primary, as last heard.", top, n,
                  offsetof(drey_tenant_stats, cluster_used_bytes), NULL);
}
