/* The verified-token cache, internal to auth: SHA-256 of a token -> what
 * verification found (sub, exp, not-before), tagged with the key-set
 * generation that verified it. Thread-safe; bounded. */
#ifndef DREY_AUTH_CACHE_H
#define DREY_AUTH_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "drey/auth.h"

#define DREY_AUTH_DIGEST 32
#define DREY_AUTH_CACHE_SHARDS 16

typedef struct drey_auth__cache drey_auth__cache;

typedef struct drey_auth__verdict {
    int64_t exp_ms;  /* exp, in ms */
    int64_t nbf_ms;  /* the later of nbf and iat, in ms; INT64_MIN if neither */
    const char *sub; /* "" if none */
    size_t sub_len;
    void *attached;  /* what the attach made of the claims; NULL: none */
} drey_auth__verdict;

/* At most `entries` tokens are remembered; 0 disables the cache. */
drey_auth__cache *drey_auth__cache_create(size_t entries);
void drey_auth__cache_destroy(drey_auth__cache *c);

/* What entries carry besides the verdict (drey_auth_set_attach): the cache
 * holds one reference to each entry's object, and an object no longer
 * current is a miss. Set while the cache is empty. */
void drey_auth__cache_set_attach(drey_auth__cache *c, const drey_auth_attach *at);

/* Remembers a token verified under key-set generation gen (replacing the
 * oldest entry of its shard when the shard is full). */
void drey_auth__cache_insert(drey_auth__cache *c, const uint8_t digest[DREY_AUTH_DIGEST], uint64_t gen,
                             const drey_auth__verdict *v);

/* A hit is an entry for this digest verified under generation gen whose
 * times still pass drey_auth__check_times at now_ms: then its sub is copied
 * to sub (when it fits in sub_cap, NUL included; *sub_fits says whether it
 * did) and the result is true. Anything else is a miss; an entry that no
 * longer holds (stale generation, expired) is dropped on the way. */
bool drey_auth__cache_lookup(drey_auth__cache *c, const uint8_t digest[DREY_AUTH_DIGEST], uint64_t gen,
                             int64_t now_ms, int64_t skew_ms, char *sub, size_t sub_cap, bool *sub_fits);

/* drey_auth__cache_lookup, and on a hit *attached is the entry's object
 * with a reference for the caller (NULL: none). */
bool drey_auth__cache_lookup_attached(drey_auth__cache *c, const uint8_t digest[DREY_AUTH_DIGEST], uint64_t gen,
                                      int64_t now_ms, int64_t skew_ms, char *sub, size_t sub_cap, bool *sub_fits,
                                      void **attached);

/* Forgets everything (after a reload). */
void drey_auth__cache_clear(drey_auth__cache *c);

/* Entries held now / at most (tests). */
size_t drey_auth__cache_count(drey_auth__cache *c);
size_t drey_auth__cache_capacity(const drey_auth__cache *c);

#endif
