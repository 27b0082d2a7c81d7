/*
 * auth — the life of a drey_auth: create, reload, stats, destroy.
 *
 * A reload builds a complete key set off to the side and swaps it in only if
 * it loaded; the new set gets the next generation, which retires every
 * cached verification at once (a rotated-away key stops working at once).
 * Each reload's outcome is logged here, whoever asked for it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "auth_internal.h"
#include "drey/log.h"

static char *dup_opt(const char *s) {
    if (s == NULL || s[0] == '\0')
        return NULL;
    char *d = drey_xstrdup(s);
    return d;
}

static void free_shell(drey_auth *a) {
    drey_auth__cache_destroy(a->cache);
    pthread_rwlock_destroy(&a->keys_lock);
    pthread_mutex_destroy(&a->reload_mu);
    drey_io_poller_destroy(&a->watcher);
    free(a->jwks_file);
    free(a->keys_dir);
    free(a->issuer);
    free(a->audience);
    free(a);
}

drey_auth *drey_auth_create(const drey_auth_options *opts, char *err, size_t err_cap) {
    drey_auth *a = drey_xcalloc(1, sizeof *a);
    a->jwks_file = dup_opt(opts->jwks_file);
    a->keys_dir = dup_opt(opts->keys_dir);
    a->issuer = dup_opt(opts->issuer);
    a->audience = dup_opt(opts->audience);
    a->skew_ms = opts->clock_skew_ms > 0 ? opts->clock_skew_ms : 0;
    a->max_token_bytes = opts->max_token_bytes > 0 ? opts->max_token_bytes : DREY_AUTH_DEFAULT_MAX_TOKEN_BYTES;

    pthread_rwlockattr_t rwattr;
    pthread_rwlockattr_init(&rwattr);
    pthread_rwlockattr_setkind_np(&rwattr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&a->keys_lock, &rwattr);
    pthread_rwlockattr_destroy(&rwattr);
    pthread_mutex_init(&a->reload_mu, NULL);
    drey_auth__watch_init(a);
    a->cache = drey_auth__cache_create(opts->cache_entries);

    /* The fingerprint comes first: a change racing the load shows up as a
     * difference at the watcher's next look. */
    uint64_t fp = drey_auth__sources_fingerprint(a->jwks_file, a->keys_dir);
    a->keys = drey_auth__keyset_load(a->jwks_file, a->keys_dir, err, err_cap);
    if (a->keys == NULL) {
        free_shell(a);
        return NULL;
    }
    a->keys->generation = a->generation = 1;
    atomic_store(&a->seen_sources, fp);
    DREY_LOG_INFO("auth keys loaded", DREY_LOG_UINT("keys", a->keys->n));
    return a;
}

void drey_auth_destroy(drey_auth *a) {
    if (a == NULL)
        return;
    drey_auth_stop_watch(a);
    drey_auth__keyset_free(a->keys);
    free_shell(a);
}

bool drey_auth__reload(drey_auth *a, const char *trigger, char *err, size_t err_cap) {
    char why[512];
    pthread_mutex_lock(&a->reload_mu);
    atomic_store(&a->seen_sources, drey_auth__sources_fingerprint(a->jwks_file, a->keys_dir));
    drey_auth__keyset *ks = drey_auth__keyset_load(a->jwks_file, a->keys_dir, why, sizeof why);
    if (ks == NULL) {
        atomic_fetch_add_explicit(&a->reload_failures, 1, memory_order_relaxed);
        pthread_mutex_unlock(&a->reload_mu);
        DREY_LOG_WARN("auth reload failed; keeping the old keys", DREY_LOG_STR("trigger", trigger),
                      DREY_LOG_STR("reason", why));
        if (err != NULL && err_cap > 0)
            snprintf(err, err_cap, "%s", why);
        return false;
    }
    ks->generation = ++a->generation;
    pthread_rwlock_wrlock(&a->keys_lock);
    drey_auth__keyset *old = a->keys;
    a->keys = ks;
    pthread_rwlock_unlock(&a->keys_lock);
    /* Entries of the old generation can no longer hit (nor be added: adding
     * happens under the read lock); this only gives their memory back. */
    drey_auth__cache_clear(a->cache);
    drey_auth__keyset_free(old);
    atomic_fetch_add_explicit(&a->reloads, 1, memory_order_relaxed);
    size_t n = ks->n;
    pthread_mutex_unlock(&a->reload_mu);
    DREY_LOG_INFO("auth keys reloaded", DREY_LOG_STR("trigger", trigger), DREY_LOG_UINT("keys", n));
    return true;
}

void drey_auth_set_attach(drey_auth *a, const drey_auth_attach *at) {
    pthread_rwlock_wrlock(&a->keys_lock);
    drey_auth__cache_clear(a->cache); /* entries without an object must not hit */
    a->attach = *at;
    drey_auth__cache_set_attach(a->cache, at);
    pthread_rwlock_unlock(&a->keys_lock);
}

bool drey_auth_reload(drey_auth *a, char *err, size_t err_cap) {
    return drey_auth__reload(a, "reload", err, err_cap);
}

void drey_auth_get_stats(drey_auth *a, drey_auth_stats *out) {
    pthread_rwlock_rdlock(&a->keys_lock);
    out->keys = a->keys->n;
    pthread_rwlock_unlock(&a->keys_lock);
    out->cache_hits = atomic_load_explicit(&a->cache_hits, memory_order_relaxed);
    out->cache_misses = atomic_load_explicit(&a->cache_misses, memory_order_relaxed);
    out->reloads = atomic_load_explicit(&a->reloads, memory_order_relaxed);
    out->reload_failures = atomic_load_explicit(&a->reload_failures, memory_order_relaxed);
}
