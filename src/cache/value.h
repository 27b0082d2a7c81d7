/* Conversions between drey.cache.v1 messages and the store (internal). */
#ifndef DREY_CACHE_VALUE_H
#define DREY_CACHE_VALUE_H

#include <stdbool.h>
#include <stdint.h>

#include "drey/arena.h"
#include "drey/cache/v1/cache.pb-c.h"
#include "drey/store.h"
#include "google/protobuf/duration.pb-c.h"
#include "google/protobuf/timestamp.pb-c.h"

/* A request's expiration choice; all unset means "none given". */
typedef struct drey_cache__expiry {
    const Google__Protobuf__Duration *ttl;
    const Google__Protobuf__Timestamp *expires_at;
    bool persist;
} drey_cache__expiry;

/* Absolute expiry in wall-clock ms (0 = never) for a write at now_ms;
 * `keep` is the current entry's expiry, used when none is given. Partial
 * milliseconds round up, so an entry never expires early. */
int64_t drey_cache__expiry_at(const drey_cache__expiry *ex, int64_t now_ms, int64_t keep);

/* A validated Value in store form; memory from the arena where needed. */
void drey_cache__value_in(const Drey__Cache__V1__Value *v, drey_arena *a, drey_value *out);
/* A stored value as a message, copied into the arena. */
Drey__Cache__V1__Value *drey_cache__value_out(drey_arena *a, const drey_value *v);

int64_t drey_cache__int64_of(const drey_value *v);
void drey_cache__int64_value(int64_t n, uint8_t buf[8], drey_value *out);

/* NULL for 0 (no expiry). */
Google__Protobuf__Timestamp *drey_cache__timestamp(drey_arena *a, int64_t ms);
Google__Protobuf__Duration *drey_cache__duration(drey_arena *a, int64_t ms);

#endif
