/*
 * cache — the drey.cache.v1.Cache service.
 *
 * Maps each RPC onto the store. Every method is an `apply` function of
 * (store, request, now): reads run at the end of the chain against the
 * sharded table; writes are deterministic state transitions, so the request
 * chain can run them after the journal append and recovery can replay them.
 *
 * The service also runs the active expiry cycle (Redis's activeExpireCycle):
 * every interval it frees expired entries nobody reads, using at most a
 * quarter of the interval.
 */
#ifndef DREY_CACHE_H
#define DREY_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "drey/cache/v1/cache.pb-c.h"
#include "drey/method.h"
#include "drey/store.h"

typedef struct drey_cache drey_cache;

drey_cache *drey_cache_create(drey_store *store);
void drey_cache_destroy(drey_cache *c);

/* Adds drey.cache.v1.Cache's methods to the table. */
bool drey_cache_register(drey_cache *c, drey_method_table *t);

/* On a durable node the journal bounds what the expiry cycle may free
 * (drey_journal_sweep_horizon); set before starting it. */
void drey_cache_set_expiry_horizon(drey_cache *c, int64_t (*fn)(void *ctx, int64_t now_ms), void *ctx);

/* Starts and stops the expiry thread. */
void drey_cache_start_expiry(drey_cache *c, int64_t interval_ms);
void drey_cache_stop_expiry(drey_cache *c);

/* The bytes a Value takes in the store: what --max-value-bytes limits and
 * what memory admission counts (one definition for both). */
uint32_t drey_cache_value_bytes(const Drey__Cache__V1__Value *v);

/* A stored value as the API carries it, in arena memory (the change feed
 * sends values it did not read through a Cache method). */
Drey__Cache__V1__Value *drey_cache_value_out(drey_arena *a, const drey_value *v);
/* An expiry (ms since the epoch) as the API carries it; NULL for 0 (never). */
Google__Protobuf__Timestamp *drey_cache_timestamp(drey_arena *a, int64_t ms);

/* One expiry cycle at now_ms within budget_ns; returns entries freed. */
uint64_t drey_cache_expire_cycle(drey_cache *c, int64_t now_ms, int64_t budget_ns);

#endif
