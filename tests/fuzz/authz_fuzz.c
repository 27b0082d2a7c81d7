/*
 * Fuzz target: the authorization policy's parser and the check
 * (src/authz/policy.c, src/authz/grants.c).
 *
 * The input is a policy, optionally followed by a NUL, a cache name, a NUL
 * and a key to ask about. A policy that parses is compiled for an anonymous
 * caller and a few tokens' claims, and every verb is asked about the cache
 * and key in every scope.
 *
 * Properties: a refusal always says why; a policy parses the same way
 * twice; the answers hold together: a batch allowed means each of its keys
 * is, a prefix allowed means a key under it is, the whole cache allowed
 * means any prefix of it is; a caller's tenant, when it has one, is the
 * claim's value.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "drey/authz.h"
#include "fuzz_util.h"

static const char *const claims[] = {
    NULL,
    "{\"sub\":\"ops-1\"}",
    "{\"sub\":\"svc\",\"groups\":[\"cache-readers\",\"a\",\"b\"],\"tenant\":\"acme\"}",
    "{\"sub\":\"writer-1\",\"role\":\"app\",\"groups\":\"a\",\"tenant\":\"t\"}",
};

static const char *key_at(const void *ctx, size_t i, size_t *len) {
    const char *const *keys = ctx;
    *len = strlen(keys[i]);
    return keys[i];
}

static bool ask(const drey_authz_grants *g, drey_authz_verb v, drey_authz_scope scope, const char *cache,
                const char *const *keys, size_t n, const char *prefix) {
    drey_authz_ask a = {.verb = v, .scope = scope, .cache = cache, .cache_len = strlen(cache), .n_keys = n,
                        .key = key_at, .key_ctx = keys, .prefix = prefix, .prefix_len = prefix ? strlen(prefix) : 0};
    return drey_authz_allows(g, &a);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    size_t policy_len = strnlen(text, size);
    char cache[130] = "users", key[300] = "user:1";
    if (policy_len < size) {
        const char *rest = text + policy_len + 1;
        size_t left = size - policy_len - 1, cl = strnlen(rest, left);
        snprintf(cache, sizeof cache, "%.*s", (int)cl, rest);
        if (cl < left)
            snprintf(key, sizeof key, "%.*s", (int)strnlen(rest + cl + 1, left - cl - 1), rest + cl + 1);
    }
    char err[256] = "", err2[256] = "";
    drey_authz_policy *p = drey_authz_policy_parse(text, policy_len, err, sizeof err);
    drey_authz_policy *again = drey_authz_policy_parse(text, policy_len, err2, sizeof err2);
    FUZZ_CHECK((p == NULL) == (again == NULL), "the same text parsed two ways");
    if (p == NULL) {
        FUZZ_CHECK(err[0] != '\0', "a refusal without a reason");
        FUZZ_CHECK(strcmp(err, err2) == 0, "two reasons: %s / %s", err, err2);
        return 0;
    }
    drey_authz_policy_info a, b;
    drey_authz_policy_info_of(p, &a);
    drey_authz_policy_info_of(again, &b);
    FUZZ_CHECK(memcmp(&a, &b, sizeof a) == 0, "two parses differ");
    drey_authz_policy_unref(again);

    char under[320];
    snprintf(under, sizeof under, "%sz", key);
    const char *one[] = {key}, *two[] = {key, "user:2"}, *second[] = {"user:2"}, *child[] = {under};
    for (size_t c = 0; c < sizeof claims / sizeof claims[0]; c++) {
        drey_authz_grants *g = drey_authz_policy_grants(p, claims[c], claims[c] ? strlen(claims[c]) : 0);
        for (int v = 0; v < DREY_AUTHZ_VERBS; v++) {
            bool k1 = ask(g, v, DREY_AUTHZ_KEYS, cache, one, 1, NULL);
            bool k2 = ask(g, v, DREY_AUTHZ_KEYS, cache, second, 1, NULL);
            bool both = ask(g, v, DREY_AUTHZ_KEYS, cache, two, 2, NULL);
            FUZZ_CHECK(!both || (k1 && k2), "a batch allowed with a key that is not");
            bool pre = ask(g, v, DREY_AUTHZ_PREFIX, cache, NULL, 0, key);
            FUZZ_CHECK(!pre || ask(g, v, DREY_AUTHZ_KEYS, cache, child, 1, NULL), "a prefix allowed, a key under it not");
            FUZZ_CHECK(!pre || k1, "a prefix allowed, the key equal to it not");
            bool whole = ask(g, v, DREY_AUTHZ_PREFIX, cache, NULL, 0, "");
            FUZZ_CHECK(!whole || pre, "the whole cache allowed, a prefix of it not");
            FUZZ_CHECK(!k1 || ask(g, v, DREY_AUTHZ_CACHE, cache, NULL, 0, NULL), "a key allowed, its cache not");
            (void)ask(g, v, DREY_AUTHZ_NODE, cache, NULL, 0, NULL);
        }
        size_t n;
        const char *t = drey_authz_grants_tenant(g, &n);
        if (t != NULL)
            FUZZ_CHECK(claims[c] != NULL && strstr(claims[c], t) != NULL && n > 0, "a tenant from nowhere");
        drey_authz_grants_unref(g);
    }
    drey_authz_policy_unref(p);
    return 0;
}
