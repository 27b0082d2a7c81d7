/*
 * auth — JWT bearer tokens: key sets, verification, a verified-token cache.
 *
 * Keys come from a JWKS file and/or a directory of key files, and are chosen
 * by the token's `kid`. Every key has exactly one algorithm and the token's
 * `alg` must be it, which shuts out `alg: none` and the HS/RS confusion
 * (an HS256 token whose "secret" is an RSA public key, which libjwt alone
 * would accept). Supported: HS256/384/512, RS256/384/512, ES256/384/512.
 *
 *   JWKS: {"keys":[{"kid","alg","kty":"RSA","n","e"}, {"kty":"EC","crv","x","y"},
 *          {"kty":"oct","k"}]}  ("alg" is required on every key)
 *   keys directory: <kid>.<ALG>.pem (RS*, ES*: a PEM public key) and
 *          <kid>.<ALG>.key (HS*: the raw secret), e.g. "k1.RS256.pem"
 *
 * Claims: `exp` is required; `nbf` and `iat` are honoured; `iss` and `aud`
 * are checked when configured; a clock skew is allowed both ways.
 *
 * Verified tokens are cached by SHA-256 of the token until their `exp`, so a
 * client reusing its token pays for one signature check, not one per call. A
 * reload (SIGHUP, or the watcher noticing a key file changed) swaps in the
 * new key set atomically and empties the cache (a rotated-away key stops
 * working at once); a reload that fails keeps the old keys.
 */
#ifndef DREY_AUTH_H
#define DREY_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "drey/status.h"

typedef struct drey_auth drey_auth;

typedef struct drey_auth_options {
    const char *jwks_file;   /* NULL or "": none */
    const char *keys_dir;    /* NULL or "": none */
    const char *issuer;      /* NULL or "": not checked */
    const char *audience;    /* NULL or "": not checked */
    int64_t clock_skew_ms;
    size_t max_token_bytes;  /* longer: TOKEN_TOO_LARGE */
    size_t cache_entries;    /* verified-token cache bound */
} drey_auth_options;

/* NULL with a reason in err when the configured sources cannot be loaded
 * (or hold no usable key): the node must not start. */
drey_auth *drey_auth_create(const drey_auth_options *opts, char *err, size_t err_cap);
void drey_auth_destroy(drey_auth *a);

/* Re-reads the sources. On failure the old keys stay and err says why. */
bool drey_auth_reload(drey_auth *a, char *err, size_t err_cap);

/* A thread that reloads (and logs) when a key source changes on disk,
 * checking every interval_ms. */
void drey_auth_watch(drey_auth *a, int64_t interval_ms);
void drey_auth_stop_watch(drey_auth *a);

/* Verifies the value of an `authorization` header ("Bearer <jwt>") at
 * now_ms. On success returns DREY_ERR_NONE and writes the `sub` claim to sub
 * ("" if the token has none); otherwise the reason (DREY_ERR_TOKEN_*). */
drey_error drey_auth_verify(drey_auth *a, const char *header, size_t header_len, int64_t now_ms, char *sub,
                            size_t sub_cap);

/* What a module compiles from a verified token's claims (authz: the
 * caller's grants), kept with the token in the verified-token cache so it is
 * made once per token, not per call. */
typedef struct drey_auth_attach {
    /* From the token's claims (the payload, a JSON object's text): an object
     * with one reference, which the cache keeps. */
    void *(*make)(void *ctx, const char *claims, size_t len);
    void (*ref)(void *obj);
    void (*unref)(void *obj);
    /* false: obj was made under a configuration no longer in force; the
     * token is then verified and obj made again. */
    bool (*current)(void *ctx, const void *obj);
    void *ctx;
} drey_auth_attach;

/* Before the first verification; the cache drops what it holds. */
void drey_auth_set_attach(drey_auth *a, const drey_auth_attach *at);

/* drey_auth_verify, and on success *attached is the token's object (a
 * reference for the caller to unref), or NULL without an attach. */
drey_error drey_auth_verify_attached(drey_auth *a, const char *header, size_t header_len, int64_t now_ms, char *sub,
                                     size_t sub_cap, void **attached);

typedef struct drey_auth_stats {
    uint64_t keys;            /* in the current key set */
    uint64_t cache_hits, cache_misses;
    uint64_t reloads, reload_failures;
} drey_auth_stats;

void drey_auth_get_stats(drey_auth *a, drey_auth_stats *out);

#endif
