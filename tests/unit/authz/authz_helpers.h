/* Helpers for the authz unit tests: policies from literals, asks. */
#ifndef DREY_TESTS_AUTHZ_HELPERS_H
#define DREY_TESTS_AUTHZ_HELPERS_H

#include <criterion/criterion.h>
#include <string.h>

#include "drey/authz.h"

/* The example policy, verbatim. */
#define TH_EXAMPLE                                                                                                 \
    "{\"roles\": {\"reader\": [{\"caches\": [\"users\", \"sess-*\"], \"keys\": [\"*\"], \"verbs\": [\"read\"]}],"    \
    "  \"writer\": [{\"caches\": [\"users\"], \"keys\": [\"user:*\"], \"verbs\": [\"read\", \"write\", \"delete\"]}]," \
    "  \"ops\": [{\"caches\": [\"*\"], \"keys\": [\"*\"], \"verbs\": [\"read\", \"write\", \"delete\", \"scan\", "     \
    "\"watch\", \"clear\", \"admin\"]}]},"                                                                         \
    " \"bindings\": [{\"claim\": \"sub\", \"equals\": \"ops-1\", \"roles\": [\"ops\"]},"                               \
    "  {\"claim\": \"groups\", \"contains\": \"cache-readers\", \"roles\": [\"reader\"]},"                            \
    "  {\"anonymous\": true, \"roles\": []}],"                                                                     \
    " \"tenants\": {\"claim\": \"tenant\", \"maxBytes\": {\"acme\": 1048576, \"*\": 268435456}}}"

static inline drey_authz_policy *th_policy(const char *text) {
    char err[256];
    drey_authz_policy *p = drey_authz_policy_parse(text, strlen(text), err, sizeof err);
    cr_assert_not_null(p, "policy refused: %s", err);
    return p;
}

/* The reason a policy is refused ("" if it is not). */
static inline const char *th_refusal(const char *text) {
    static char err[256];
    drey_authz_policy *p = drey_authz_policy_parse(text, strlen(text), err, sizeof err);
    if (p != NULL) {
        drey_authz_policy_unref(p);
        return "";
    }
    return err;
}

static inline const char *th_key_at(const void *ctx, size_t i, size_t *len) {
    const char *const *keys = ctx;
    *len = strlen(keys[i]);
    return keys[i];
}

static inline bool th_keys(const drey_authz_grants *g, drey_authz_verb v, const char *cache,
                           const char *const *keys, size_t n) {
    drey_authz_ask a = {.verb = v, .scope = DREY_AUTHZ_KEYS, .cache = cache, .cache_len = strlen(cache),
                        .n_keys = n, .key = th_key_at, .key_ctx = keys};
    return drey_authz_allows(g, &a);
}

static inline bool th_key(const drey_authz_grants *g, drey_authz_verb v, const char *cache, const char *key) {
    const char *keys[] = {key};
    return th_keys(g, v, cache, keys, 1);
}

static inline bool th_prefix(const drey_authz_grants *g, drey_authz_verb v, const char *cache, const char *prefix) {
    drey_authz_ask a = {.verb = v, .scope = DREY_AUTHZ_PREFIX, .cache = cache, .cache_len = strlen(cache),
                        .prefix = prefix, .prefix_len = strlen(prefix)};
    return drey_authz_allows(g, &a);
}

static inline bool th_scope(const drey_authz_grants *g, drey_authz_verb v, drey_authz_scope scope,
                            const char *cache) {
    drey_authz_ask a = {.verb = v, .scope = scope, .cache = cache, .cache_len = cache ? strlen(cache) : 0};
    return drey_authz_allows(g, &a);
}

static inline drey_authz_grants *th_grants(drey_authz_policy *p, const char *claims) {
    return drey_authz_policy_grants(p, claims, claims != NULL ? strlen(claims) : 0);
}

#endif
