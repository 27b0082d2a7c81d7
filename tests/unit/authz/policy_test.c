/* The policy file's grammar: what loads, and every way it is refused. */
#include "authz_helpers.h"

Test(policy, the_issues_example_loads) {
    drey_authz_policy *p = th_policy(TH_EXAMPLE);
    drey_authz_policy_info info;
    drey_authz_policy_info_of(p, &info);
    cr_assert_eq(info.roles, 3);
    cr_assert_eq(info.rules, 3);
    cr_assert_eq(info.bindings, 3);
    cr_assert_eq(info.tenant_quotas, 2);
    cr_assert(info.tenants);
    cr_assert_eq(drey_authz_policy_tenant_limit(p, "acme", 4), 1048576);
    cr_assert_eq(drey_authz_policy_tenant_limit(p, "other", 5), 268435456);
    drey_authz_policy_unref(p);
}

Test(policy, an_empty_object_grants_nothing_and_names_no_tenant) {
    drey_authz_policy *p = th_policy("{}");
    drey_authz_policy_info info;
    drey_authz_policy_info_of(p, &info);
    cr_assert_eq(info.roles + info.rules + info.bindings + info.tenant_quotas, 0);
    cr_assert_not(info.tenants);
    cr_assert_eq(drey_authz_policy_tenant_limit(p, "x", 1), -1);
    drey_authz_grants *g = th_grants(p, NULL);
    cr_assert_not(th_key(g, DREY_AUTHZ_READ, "default", "k"));
    drey_authz_grants_unref(g);
    drey_authz_policy_unref(p);
}

Test(policy, tenants_without_max_bytes_have_no_quota) {
    drey_authz_policy *p = th_policy("{\"tenants\": {\"claim\": \"t\"}}");
    cr_assert_eq(drey_authz_policy_tenant_limit(p, "x", 1), -1);
    drey_authz_policy_unref(p);
}

Test(policy, node_wide_rules_may_leave_out_caches_and_keys) {
    drey_authz_policy *p = th_policy("{\"roles\": {\"m\": [{\"verbs\": [\"metrics\", \"admin\"]}]}}");
    drey_authz_policy_unref(p);
}

static void refused(const char *text, const char *says) {
    const char *why = th_refusal(text);
    cr_assert(why[0] != '\0', "accepted: %s", text);
    cr_assert(strstr(why, says) != NULL, "refusal of %s says \"%s\", not \"%s\"", text, why, says);
}

Test(policy, every_error_is_refused_with_its_path) {
    refused("", "not JSON");
    refused("[]", "a JSON object");
    refused("{\"roles\": {}, \"extra\": 1}", "unknown field \"extra\"");
    refused("{\"roles\": []}", "roles: an object");
    refused("{\"roles\": {\"r\": {}}}", "roles.r: an array of rules");
    refused("{\"roles\": {\"r\": [1]}}", "roles.r[0]: a rule is an object");
    refused("{\"roles\": {\"r\": [{\"caches\": [\"a\"], \"keys\": [\"*\"], \"verbs\": [\"read\"], \"x\": 1}]}}",
            "roles.r[0]: unknown field \"x\"");
    refused("{\"roles\": {\"r\": [{\"caches\": [\"a\"], \"keys\": [\"*\"], \"verbs\": []}]}}",
            "roles.r[0].verbs: a non-empty array");
    refused("{\"roles\": {\"r\": [{\"caches\": [\"a\"], \"keys\": [\"*\"], \"verbs\": [\"read\", \"wirte\"]}]}}",
            "roles.r[0].verbs[1]: not a verb");
    refused("{\"roles\": {\"r\": [{\"keys\": [\"*\"], \"verbs\": [\"read\"]}]}}", "names its caches and keys");
    refused("{\"roles\": {\"r\": [{\"caches\": [\"*\"], \"verbs\": [\"read\", \"admin\"]}]}}",
            "names its caches and keys");
    refused("{\"roles\": {\"r\": [{\"caches\": [], \"keys\": [\"*\"], \"verbs\": [\"read\"]}]}}",
            "roles.r[0].caches: a non-empty array");
    refused("{\"roles\": {\"r\": [{\"caches\": [\"a*b\"], \"keys\": [\"*\"], \"verbs\": [\"read\"]}]}}",
            "roles.r[0].caches[0]: '*' may only end");
    refused("{\"roles\": {\"r\": [{\"caches\": [\"a b\"], \"keys\": [\"*\"], \"verbs\": [\"read\"]}]}}",
            "the characters of cache names");
    refused("{\"roles\": {\"r\": [{\"caches\": [\"a\"], \"keys\": [\"*x*\"], \"verbs\": [\"read\"]}]}}",
            "roles.r[0].keys[0]: '*' may only end");
    refused("{\"roles\": {\"r\": [{\"caches\": [\"a\"], \"keys\": [\"\"], \"verbs\": [\"read\"]}]}}",
            "a pattern is 1 to");
    refused("{\"roles\": {\"r\": [{\"caches\": [\"a\"], \"keys\": [7], \"verbs\": [\"read\"]}]}}",
            "a pattern is a string");
    refused("{\"roles\": {\"r\": [{\"caches\": [\"a\"], \"keys\": [\"\\u0001*\"], \"verbs\": [\"read\"]}]}}",
            "control characters");
    refused("{\"roles\": {\"r\": [{\"caches\": [\"a\"], \"keys\": [\"a\\u0000*\"], \"verbs\": [\"read\"]}]}}",
            "not JSON"); /* jansson refuses NUL in strings */
    refused("{\"bindings\": {}}", "bindings: an array");
    refused("{\"bindings\": [{\"claim\": \"sub\", \"equals\": \"x\", \"roles\": [\"nope\"]}]}",
            "bindings[0].roles[0]: no such role");
    refused("{\"bindings\": [{\"claim\": \"sub\", \"roles\": []}]}", "bindings[0]: exactly one of");
    refused("{\"bindings\": [{\"claim\": \"sub\", \"equals\": \"a\", \"contains\": \"b\", \"roles\": []}]}",
            "exactly one of");
    refused("{\"bindings\": [{\"claim\": \"\", \"equals\": \"a\", \"roles\": []}]}", "bindings[0].claim");
    refused("{\"bindings\": [{\"anonymous\": false, \"roles\": []}]}", "an anonymous binding is");
    refused("{\"bindings\": [{\"anonymous\": true, \"claim\": \"sub\", \"roles\": []}]}", "an anonymous binding is");
    refused("{\"bindings\": [{\"anonymous\": true}]}", "bindings[0].roles");
    refused("{\"bindings\": [{\"anonymous\": true, \"roles\": [], \"also\": 1}]}", "unknown field \"also\"");
    refused("{\"tenants\": {\"maxBytes\": {}}}", "tenants.claim");
    refused("{\"tenants\": {\"claim\": \"t\", \"maxBytes\": []}}", "tenants.maxBytes: an object");
    refused("{\"tenants\": {\"claim\": \"t\", \"maxBytes\": {\"a\": -1}}}", "tenants.maxBytes.a: a number");
    refused("{\"tenants\": {\"claim\": \"t\", \"maxBytes\": {\"a\": 1.5}}}", "tenants.maxBytes.a: a number");
    refused("{\"tenants\": {\"claim\": \"t\", \"other\": 1}}", "tenants: unknown field");
    refused("{\"roles\": {\"r\": []}, \"roles\": {}}", "not JSON"); /* duplicate keys are refused */
}

Test(policy, a_file_too_large_is_refused_before_parsing) {
    size_t n = DREY_AUTHZ_MAX_POLICY_BYTES + 1;
    char *big = malloc(n);
    memset(big, ' ', n);
    big[0] = '{';
    big[n - 1] = '}';
    char err[128];
    cr_assert_null(drey_authz_policy_parse(big, n, err, sizeof err));
    cr_assert(strstr(err, "larger than") != NULL, "%s", err);
    free(big);
}

Test(policy, a_tenant_name_too_long_is_refused) {
    char text[512];
    char name[DREY_AUTHZ_MAX_TENANT_BYTES + 2];
    memset(name, 'a', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    snprintf(text, sizeof text, "{\"tenants\": {\"claim\": \"t\", \"maxBytes\": {\"%s\": 1}}}", name);
    refused(text, "a tenant is 1 to");
}
