/*
 * memory — memory admission: refuse writes that would grow memory past the
 * critical level, and never anything else.
 *
 * "Used" is the store's exact accounting (every entry's bytes, counted when
 * it is stored and when it goes: expiry, removal, recovery and snapshots
 * included). The limit defaults to 80% of the cgroup's memory limit, or of
 * RAM without one; high is 80% and critical 95% of the limit. A write whose
 * growth (new size - old size, estimated by its method) is positive and would
 * take used past critical is refused with MEMORY_PRESSURE; reads, removes,
 * Touch and Persist never are. jemalloc's own figure (stats.allocated) is read
 * alongside, so operators can see how the accounting compares with what the
 * allocator really holds.
 *
 * With an eviction policy (drey_store_set_policy), a write that would pass
 * critical is admitted if the store can name entries to evict whose bytes
 * make room for it: admission only chooses them; they are removed when the
 * write applies, after its journal record (which carries them) is durable.
 * A write refused here, or later before the journal, has evicted nothing.
 */
#ifndef DREY_MEMORY_H
#define DREY_MEMORY_H

#include <stdbool.h>
#include <stdint.h>

#include "drey/arena.h"
#include "drey/level.h"
#include "drey/status.h"
#include "drey/store.h"

typedef struct drey_memory drey_memory;

typedef struct drey_memory_options {
    int64_t limit_bytes; /* 0: 80% of the cgroup limit or of RAM */
    const char *node_id; /* QuotaFailure subject "node:<id>" */
    uint32_t max_caches; /* caches with entries at once; 0: no limit */
} drey_memory_options;

drey_memory *drey_memory_create(const drey_memory_options *opts, drey_store *store);
void drey_memory_destroy(drey_memory *m);

/* The default limit on this machine: 80% of memory.max (cgroup v2),
 * memory.limit_in_bytes (v1) or physical RAM. */
int64_t drey_memory_default_limit(void);

/* True if a write growing memory by `growth` bytes may proceed; otherwise
 * st is RESOURCE_EXHAUSTED MEMORY_PRESSURE with ErrorInfo metadata,
 * QuotaFailure and RetryInfo. */
bool drey_memory_admit(drey_memory *m, int64_t growth, drey_status *st);

/* The most entries one write may evict (its journal record names them). */
#define DREY_MEMORY_MAX_EVICTIONS 4096

/* drey_memory_admit, evicting under the store's policy: when the write
 * needs room, *evicted (arena memory) names entries whose bytes make it
 * (*evicted_bytes: theirs), chosen among those `only` allows (NULL: any),
 * enough for the room here and for `others` (the room of other copies that
 * evict the same entries; INT64_MAX: none); when they cannot (nothing
 * evictable is left), the write is refused with MEMORY_PRESSURE and
 * nothing is chosen. Without a policy only this node's room counts (the
 * other copies' is the replicator's to check). */
/* A write that would open a new cache past max_caches is refused
 * (RESOURCE_EXHAUSTED TOO_MANY_CACHES, st filled): every cache holds a slot
 * of the store's registry, which must not grow without bound. */
bool drey_memory_admit_cache(drey_memory *m, const char *cache, drey_status *st);

/* An eviction policy is in force (the store's). */
bool drey_memory_evicts(const drey_memory *m);

bool drey_memory_admit_evicting(drey_memory *m, int64_t growth, int64_t now_ms, const drey_store_filter *only,
                                int64_t others, drey_arena *arena, const drey_store_victim **evicted,
                                size_t *n_evicted, int64_t *evicted_bytes, drey_status *st);

/* drey_memory_admit_evicting for a write of a tenant (0: none): *evicted
 * may hold victims chosen already (the tenant's quota's; *evicted_bytes
 * theirs), which count first and are kept; then the tenant's own entries
 * are the candidates, then any `only` allows. On success *evicted holds
 * them all and *evicted_bytes their bytes. */
bool drey_memory_admit_evicting_tenant(drey_memory *m, int64_t growth, int64_t now_ms, const drey_store_filter *only,
                                       uint32_t tenant, int64_t others, drey_arena *arena,
                                       const drey_store_victim **evicted, size_t *n_evicted, int64_t *evicted_bytes,
                                       drey_status *st);

/* Chooses, for a tenant over its quota, its own entries to evict: at least
 * need_bytes of them (within only), added to *evicted (arena memory);
 * returns the bytes chosen (less than need_bytes when it has no more). */
int64_t drey_memory_choose_tenant(drey_memory *m, int64_t need_bytes, int64_t now_ms, const drey_store_filter *only,
                                  uint32_t tenant, drey_arena *arena, const drey_store_victim **evicted,
                                  size_t *n_evicted);

typedef struct drey_memory_stats {
    drey_level state; /* HIGH: used >= high; CRITICAL: used >= critical */
    int64_t limit_bytes, used_bytes, high_bytes, critical_bytes;
    int64_t jemalloc_allocated_bytes; /* -1 when jemalloc is not the allocator */
    uint64_t rejections;
    uint64_t evicting_admissions; /* writes admitted by choosing victims */
} drey_memory_stats;

/* Reads jemalloc's figure afresh (a mallctl call: not for every request). */
void drey_memory_get_stats(drey_memory *m, drey_memory_stats *out);

/* Accounted bytes the store may still grow by before writes are refused
 * (critical); cheap, for every replicated record's acknowledgement. */
int64_t drey_memory_room(drey_memory *m);

#endif
