/* The state behind drey_auth, shared by the files of src/auth (internal). */
#ifndef DREY_AUTH_INTERNAL_H
#define DREY_AUTH_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cache.h"
#include "drey/auth.h"
#include "drey/io.h"
#include "keys.h"

/* max_token_bytes when the options say 0. */
#define DREY_AUTH_DEFAULT_MAX_TOKEN_BYTES 8192

struct drey_auth {
    char *jwks_file; /* owned copies; NULL: not configured */
    char *keys_dir;
    char *issuer;
    char *audience;
    int64_t skew_ms;        /* >= 0 */
    size_t max_token_bytes; /* > 0 */

    /* The current key set. Verifiers hold the read lock for a whole
     * verification (the key set and the cache generation stay consistent);
     * a reload takes the write lock only to swap the pointer. Writers are
     * preferred so a reload is never starved by a busy node. */
    pthread_rwlock_t keys_lock;
    drey_auth__keyset *keys;
    drey_auth__cache *cache;

    pthread_mutex_t reload_mu;       /* one reload at a time */
    uint64_t generation;             /* of the newest key set; under reload_mu */
    _Atomic uint64_t seen_sources;   /* fingerprint taken by the last load attempt */

    drey_io_poller watcher; /* watch.c */

    drey_auth_attach attach; /* make NULL: none */

    _Atomic uint64_t cache_hits, cache_misses, reloads, reload_failures;
};

/* Loads the sources into a new key set and swaps it in; the trigger
 * ("reload", "watch") goes into the log line. */
bool drey_auth__reload(drey_auth *a, const char *trigger, char *err, size_t err_cap);

/* A fingerprint of the sources' metadata (device, inode, size, mtime,
 * ctime of the JWKS file, the keys directory and each of its entries):
 * it changes when any of them is created, removed, replaced or written. */
void drey_auth__watch_init(drey_auth *a);
uint64_t drey_auth__sources_fingerprint(const char *jwks_file, const char *keys_dir);

#endif
