/* Grants compiled from claims, and the check every request passes. */
#include "authz_helpers.h"

#include <stdio.h>

Test(grants, the_example_reader_reads_users_and_sessions_only) {
    drey_authz_policy *p = th_policy(TH_EXAMPLE);
    drey_authz_grants *g = th_grants(p, "{\"sub\": \"svc\", \"groups\": [\"x\", \"cache-readers\"]}");
    cr_assert(th_key(g, DREY_AUTHZ_READ, "users", "anything"));
    cr_assert(th_key(g, DREY_AUTHZ_READ, "sess-eu", "k"));
    cr_assert_not(th_key(g, DREY_AUTHZ_READ, "sess", "k"), "sess-* needs the dash");
    cr_assert_not(th_key(g, DREY_AUTHZ_READ, "orders", "k"));
    cr_assert_not(th_key(g, DREY_AUTHZ_WRITE, "users", "k"));
    cr_assert_not(th_key(g, DREY_AUTHZ_DELETE, "users", "k"));
    cr_assert_not(th_prefix(g, DREY_AUTHZ_SCAN, "users", ""));
    cr_assert_not(th_scope(g, DREY_AUTHZ_ADMIN, DREY_AUTHZ_NODE, NULL));
    drey_authz_grants_unref(g);
    drey_authz_policy_unref(p);
}

Test(grants, the_writer_is_bound_to_its_key_prefix) {
    const char *text = "{\"roles\": {\"writer\": [{\"caches\": [\"users\"], \"keys\": [\"user:*\"], "
                       "\"verbs\": [\"read\", \"write\", \"delete\"]}]},"
                       " \"bindings\": [{\"claim\": \"role\", \"equals\": \"w\", \"roles\": [\"writer\"]}]}";
    drey_authz_policy *p = th_policy(text);
    drey_authz_grants *g = th_grants(p, "{\"role\": \"w\"}");
    cr_assert(th_key(g, DREY_AUTHZ_WRITE, "users", "user:42"));
    cr_assert(th_key(g, DREY_AUTHZ_WRITE, "users", "user:"));
    cr_assert_not(th_key(g, DREY_AUTHZ_WRITE, "users", "admin:1"));
    cr_assert_not(th_key(g, DREY_AUTHZ_WRITE, "users", "user"));
    const char *ok[] = {"user:1", "user:2"}, *mixed[] = {"user:1", "admin:1"};
    cr_assert(th_keys(g, DREY_AUTHZ_DELETE, "users", ok, 2));
    cr_assert_not(th_keys(g, DREY_AUTHZ_DELETE, "users", mixed, 2), "a batch is allowed whole or not at all");
    cr_assert(th_scope(g, DREY_AUTHZ_READ, DREY_AUTHZ_CACHE, "users"), "cache figures: the cache suffices");
    cr_assert_not(th_scope(g, DREY_AUTHZ_READ, DREY_AUTHZ_NODE, NULL), "ListCaches needs read on \"*\"");
    /* A binding on another value, a string claim where an array was
     * expected, a number: nothing. */
    drey_authz_grants *other = th_grants(p, "{\"role\": \"r\"}");
    cr_assert_not(th_key(other, DREY_AUTHZ_READ, "users", "user:1"));
    drey_authz_grants_unref(other);
    other = th_grants(p, "{\"role\": [\"a\", \"w\"]}");
    cr_assert(th_key(other, DREY_AUTHZ_READ, "users", "user:1"), "equals also matches an array element");
    drey_authz_grants_unref(other);
    other = th_grants(p, "{\"role\": 1}");
    cr_assert_not(th_key(other, DREY_AUTHZ_READ, "users", "user:1"));
    drey_authz_grants_unref(other);
    drey_authz_grants_unref(g);
    drey_authz_policy_unref(p);
}

Test(grants, scans_and_watches_need_a_pattern_covering_the_prefix) {
    const char *text = "{\"roles\": {\"r\": [{\"caches\": [\"c\"], \"keys\": [\"user:*\", \"exact\"], "
                       "\"verbs\": [\"scan\", \"watch\"]}], \"all\": [{\"caches\": [\"c\"], \"keys\": [\"*\"], "
                       "\"verbs\": [\"scan\", \"watch\", \"clear\"]}]},"
                       " \"bindings\": [{\"claim\": \"sub\", \"equals\": \"a\", \"roles\": [\"r\"]},"
                       "              {\"claim\": \"sub\", \"equals\": \"b\", \"roles\": [\"all\"]}]}";
    drey_authz_policy *p = th_policy(text);
    drey_authz_grants *a = th_grants(p, "{\"sub\": \"a\"}"), *b = th_grants(p, "{\"sub\": \"b\"}");
    cr_assert(th_prefix(a, DREY_AUTHZ_SCAN, "c", "user:"));
    cr_assert(th_prefix(a, DREY_AUTHZ_SCAN, "c", "user:4"));
    cr_assert_not(th_prefix(a, DREY_AUTHZ_SCAN, "c", "use"), "keys under \"use\" are not all under \"user:\"");
    cr_assert_not(th_prefix(a, DREY_AUTHZ_SCAN, "c", "exact"), "an exact pattern covers no prefix");
    cr_assert_not(th_prefix(a, DREY_AUTHZ_SCAN, "c", ""), "the whole cache needs \"*\"");
    cr_assert_not(th_prefix(a, DREY_AUTHZ_CLEAR, "c", ""));
    cr_assert(th_key(a, DREY_AUTHZ_WATCH, "c", "exact"));
    cr_assert(th_prefix(b, DREY_AUTHZ_SCAN, "c", ""));
    cr_assert(th_prefix(b, DREY_AUTHZ_WATCH, "c", ""));
    cr_assert(th_prefix(b, DREY_AUTHZ_CLEAR, "c", ""));
    cr_assert_not(th_prefix(b, DREY_AUTHZ_CLEAR, "d", ""));
    drey_authz_grants_unref(a);
    drey_authz_grants_unref(b);
    drey_authz_policy_unref(p);
}

Test(grants, two_roles_never_combine_into_a_grant_neither_gives) {
    const char *text = "{\"roles\": {\"a\": [{\"caches\": [\"c\"], \"keys\": [\"a:*\"], \"verbs\": [\"read\"]}],"
                       "            \"b\": [{\"caches\": [\"c\"], \"keys\": [\"b:*\"], \"verbs\": [\"read\"]}]},"
                       " \"bindings\": [{\"claim\": \"g\", \"contains\": \"x\", \"roles\": [\"a\", \"b\"]}]}";
    drey_authz_policy *p = th_policy(text);
    drey_authz_grants *g = th_grants(p, "{\"g\": [\"x\"]}");
    const char *both[] = {"a:1", "b:1"}, *as[] = {"a:1", "a:2"};
    cr_assert(th_key(g, DREY_AUTHZ_READ, "c", "a:1"));
    cr_assert(th_key(g, DREY_AUTHZ_READ, "c", "b:1"));
    cr_assert(th_keys(g, DREY_AUTHZ_READ, "c", as, 2));
    cr_assert_not(th_keys(g, DREY_AUTHZ_READ, "c", both, 2));
    drey_authz_grants_unref(g);
    drey_authz_policy_unref(p);
}

Test(grants, rules_of_one_role_do_combine) {
    const char *text = "{\"roles\": {\"a\": [{\"caches\": [\"c\"], \"keys\": [\"a:*\"], \"verbs\": [\"read\"]},"
                       "                    {\"caches\": [\"c\"], \"keys\": [\"b:*\"], \"verbs\": [\"read\"]}]},"
                       " \"bindings\": [{\"claim\": \"sub\", \"equals\": \"s\", \"roles\": [\"a\"]}]}";
    drey_authz_policy *p = th_policy(text);
    drey_authz_grants *g = th_grants(p, "{\"sub\": \"s\"}");
    const char *both[] = {"a:1", "b:1"};
    cr_assert(th_keys(g, DREY_AUTHZ_READ, "c", both, 2));
    drey_authz_grants_unref(g);
    drey_authz_policy_unref(p);
}

Test(grants, the_default_cache_is_named_default) {
    const char *text = "{\"roles\": {\"d\": [{\"caches\": [\"default\"], \"keys\": [\"*\"], \"verbs\": [\"read\"]}],"
                       "            \"s\": [{\"caches\": [\"*\"], \"keys\": [\"k\"], \"verbs\": [\"write\"]}]},"
                       " \"bindings\": [{\"anonymous\": true, \"roles\": [\"d\", \"s\"]}]}";
    drey_authz_policy *p = th_policy(text);
    drey_authz_grants *g = th_grants(p, NULL);
    cr_assert(th_key(g, DREY_AUTHZ_READ, "", "x"));
    cr_assert(th_key(g, DREY_AUTHZ_READ, "default", "x"));
    cr_assert_not(th_key(g, DREY_AUTHZ_READ, "other", "x"));
    cr_assert(th_key(g, DREY_AUTHZ_WRITE, "", "k"));
    cr_assert(th_key(g, DREY_AUTHZ_WRITE, "any", "k"));
    cr_assert_not(th_key(g, DREY_AUTHZ_WRITE, "any", "k2"));
    drey_authz_grants_unref(g);
    drey_authz_policy_unref(p);
}

Test(grants, anonymous_bindings_are_for_callers_without_a_token) {
    const char *text = "{\"roles\": {\"pub\": [{\"caches\": [\"public\"], \"keys\": [\"*\"], \"verbs\": [\"read\"]}]},"
                       " \"bindings\": [{\"anonymous\": true, \"roles\": [\"pub\"]}]}";
    drey_authz_policy *p = th_policy(text);
    drey_authz_grants *anon = th_grants(p, NULL), *tok = th_grants(p, "{\"sub\": \"x\"}");
    cr_assert(th_key(anon, DREY_AUTHZ_READ, "public", "k"));
    cr_assert_not(th_key(tok, DREY_AUTHZ_READ, "public", "k"), "a token gets only what its bindings give");
    drey_authz_grants_unref(anon);
    drey_authz_grants_unref(tok);
    drey_authz_policy_unref(p);
}

Test(grants, node_wide_verbs_ignore_caches) {
    const char *text = "{\"roles\": {\"m\": [{\"verbs\": [\"metrics\"]}],"
                       "            \"o\": [{\"caches\": [\"one\"], \"keys\": [\"k\"], \"verbs\": [\"admin\"]}]},"
                       " \"bindings\": [{\"claim\": \"sub\", \"equals\": \"prom\", \"roles\": [\"m\"]},"
                       "              {\"claim\": \"sub\", \"equals\": \"op\", \"roles\": [\"o\"]}]}";
    drey_authz_policy *p = th_policy(text);
    drey_authz_grants *m = th_grants(p, "{\"sub\": \"prom\"}"), *o = th_grants(p, "{\"sub\": \"op\"}");
    cr_assert(th_scope(m, DREY_AUTHZ_METRICS, DREY_AUTHZ_NODE, NULL));
    cr_assert_not(th_scope(m, DREY_AUTHZ_ADMIN, DREY_AUTHZ_NODE, NULL));
    cr_assert_not(th_key(m, DREY_AUTHZ_READ, "x", "k"));
    cr_assert(th_scope(o, DREY_AUTHZ_ADMIN, DREY_AUTHZ_NODE, NULL));
    cr_assert_not(th_scope(o, DREY_AUTHZ_METRICS, DREY_AUTHZ_NODE, NULL));
    drey_authz_grants_unref(m);
    drey_authz_grants_unref(o);
    drey_authz_policy_unref(p);
}

Test(grants, the_tenant_comes_from_the_tenant_claim) {
    drey_authz_policy *p = th_policy(TH_EXAMPLE);
    size_t n;
    drey_authz_grants *g = th_grants(p, "{\"sub\": \"a\", \"tenant\": \"acme\"}");
    const char *t = drey_authz_grants_tenant(g, &n);
    cr_assert_not_null(t);
    cr_assert_eq(n, 4);
    cr_assert_str_eq(t, "acme");
    cr_assert_eq(drey_authz_grants_tenant_limit(g), 1048576);
    cr_assert_eq(drey_authz_grants_tenant_id(g), 0);
    drey_authz_grants_set_tenant_id(g, 7);
    cr_assert_eq(drey_authz_grants_tenant_id(g), 7);
    drey_authz_grants_unref(g);
    g = th_grants(p, "{\"tenant\": \"beta\"}");
    cr_assert_eq(drey_authz_grants_tenant_limit(g), 268435456, "\"*\" covers tenants not named");
    drey_authz_grants_unref(g);
    char long_tenant[200];
    snprintf(long_tenant, sizeof long_tenant, "{\"tenant\": \"%0129d\"}", 0);
    const char *none[] = {"{}", "{\"tenant\": 5}", "{\"tenant\": \"\"}", "{\"tenant\": [\"acme\"]}", long_tenant, NULL};
    for (size_t i = 0; none[i] != NULL; i++) {
        g = th_grants(p, none[i]);
        cr_assert_null(drey_authz_grants_tenant(g, &n), "%s names no tenant", none[i]);
        cr_assert_eq(drey_authz_grants_tenant_limit(g), -1);
        drey_authz_grants_unref(g);
    }
    g = th_grants(p, NULL);
    cr_assert_null(drey_authz_grants_tenant(g, &n));
    drey_authz_grants_unref(g);
    drey_authz_policy_unref(p);
}

Test(grants, claims_that_do_not_parse_bind_nothing) {
    drey_authz_policy *p = th_policy(TH_EXAMPLE);
    drey_authz_grants *g = th_grants(p, "{not json");
    cr_assert_not(th_key(g, DREY_AUTHZ_READ, "users", "k"));
    drey_authz_grants_unref(g);
    drey_authz_policy_unref(p);
}

Test(grants, grants_outlive_the_policy_they_were_compiled_under) {
    drey_authz_policy *p = th_policy(TH_EXAMPLE);
    drey_authz_grants *g = th_grants(p, "{\"sub\": \"ops-1\"}"), *anon = th_grants(p, NULL);
    drey_authz_policy_unref(p); /* the policy goes only with its last grants */
    cr_assert(th_key(g, DREY_AUTHZ_WRITE, "any", "k"));
    cr_assert_not(th_key(anon, DREY_AUTHZ_READ, "users", "k"));
    drey_authz_grants_ref(g);
    drey_authz_grants_unref(g);
    drey_authz_grants_unref(anon);
    drey_authz_grants_unref(g);
}

/* A hundred rules in one role, the cache asked for named by the last: the
 * index finds it by hash, and every rule still counts. */
Test(grants, a_large_role_is_indexed_by_cache) {
    char *text = malloc(64 * 1024);
    size_t n = (size_t)sprintf(text, "{\"roles\": {\"big\": [");
    for (int i = 0; i < 100; i++)
        n += (size_t)sprintf(text + n, "%s{\"caches\": [\"c%d\", \"p%d-*\"], \"keys\": [\"k%d:*\"], \"verbs\": [\"read\"]}",
                             i ? "," : "", i, i, i);
    sprintf(text + n, "]}, \"bindings\": [{\"claim\": \"sub\", \"equals\": \"s\", \"roles\": [\"big\"]}]}");
    drey_authz_policy *p = th_policy(text);
    drey_authz_grants *g = th_grants(p, "{\"sub\": \"s\"}");
    for (int i = 0; i < 100; i++) {
        char cache[16], pcache[16], key[16], other[16];
        snprintf(cache, sizeof cache, "c%d", i);
        snprintf(pcache, sizeof pcache, "p%d-x", i);
        snprintf(key, sizeof key, "k%d:1", i);
        snprintf(other, sizeof other, "k%d:1", (i + 1) % 100);
        cr_assert(th_key(g, DREY_AUTHZ_READ, cache, key));
        cr_assert(th_key(g, DREY_AUTHZ_READ, pcache, key));
        cr_assert_not(th_key(g, DREY_AUTHZ_READ, cache, other));
    }
    cr_assert_not(th_key(g, DREY_AUTHZ_READ, "c100", "k0:1"));
    drey_authz_grants_unref(g);
    drey_authz_policy_unref(p);
    free(text);
}
