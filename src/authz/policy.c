/*
 * policy — the policy file's JSON, checked field by field, into roles,
 * bindings and tenant quotas; see include/drey/authz.h.
 *
 * Everything is checked before anything is kept: an unknown field, a verb
 * that does not exist, a '*' in the middle of a pattern, a binding naming a
 * role that does not exist are errors that name their JSON path, and the
 * policy in force stays. Permissions fail closed: a rule must say which
 * caches and keys it covers (only admin and metrics are node-wide).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "drey/alloc.h"
#include "drey/bytes.h"
#include "internal.h"

#define MAX_ROLES 4096
#define MAX_RULES 65536
#define MAX_PATTERNS 4096
#define MAX_BINDINGS 65536
#define MAX_TENANT_QUOTAS 1000000
#define MAX_CLAIM_BYTES 256

static const char *const verb_names[DREY_AUTHZ_VERBS] = {
    [DREY_AUTHZ_READ] = "read",   [DREY_AUTHZ_WRITE] = "write", [DREY_AUTHZ_DELETE] = "delete",
    [DREY_AUTHZ_SCAN] = "scan",   [DREY_AUTHZ_WATCH] = "watch", [DREY_AUTHZ_CLEAR] = "clear",
    [DREY_AUTHZ_ADMIN] = "admin", [DREY_AUTHZ_METRICS] = "metrics",
};

#define NODE_VERBS ((1u << DREY_AUTHZ_ADMIN) | (1u << DREY_AUTHZ_METRICS))

const char *drey_authz_verb_name(drey_authz_verb v) {
    return (unsigned)v < DREY_AUTHZ_VERBS ? verb_names[v] : "unknown";
}

/* --- errors ------------------------------------------------------------------ */

typedef struct parser {
    char *err;
    size_t cap;
    bool failed;
} parser;

static bool fail(parser *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool fail(parser *ps, const char *fmt, ...) {
    if (!ps->failed && ps->cap > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ps->err, ps->cap, fmt, ap);
        va_end(ap);
    }
    ps->failed = true;
    return false;
}

/* Fields of obj must all be among allowed (NULL-terminated). */
static bool only_fields(parser *ps, json_t *obj, const char *path, const char *const *allowed) {
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) {
        bool ok = false;
        for (size_t i = 0; allowed[i] != NULL && !ok; i++)
            ok = strcmp(k, allowed[i]) == 0;
        if (!ok)
            return fail(ps, "%s: unknown field \"%.64s\"", path, k);
    }
    return true;
}

/* --- patterns -------------------------------------------------------------------- */

static bool cache_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
           c == '-';
}

/* A pattern: exact, or a prefix ending in '*' ('*' nowhere else). Cache
 * patterns use the characters of cache names; key patterns are UTF-8
 * without control characters, as keys are. */
static bool parse_pattern(parser *ps, json_t *v, const char *path, bool is_cache, pattern *out) {
    if (!json_is_string(v))
        return fail(ps, "%s: a pattern is a string", path);
    const char *s = json_string_value(v);
    size_t n = json_string_length(v);
    /* jansson refuses \u0000 in strings unless asked to allow it. */
    if (n == 0 || n > DREY_AUTHZ_MAX_PATTERN_BYTES)
        return fail(ps, "%s: a pattern is 1 to %d bytes", path, DREY_AUTHZ_MAX_PATTERN_BYTES);
    bool prefix = s[n - 1] == '*';
    size_t body = prefix ? n - 1 : n;
    if (memchr(s, '*', body) != NULL)
        return fail(ps, "%s: '*' may only end a pattern (a prefix)", path);
    if (is_cache) {
        for (size_t i = 0; i < body; i++) {
            if (!cache_char(s[i]))
                return fail(ps, "%s: cache patterns use the characters of cache names, [A-Za-z0-9._-]", path);
        }
    } else {
        if (!drey_bytes_utf8_valid((const uint8_t *)s, body))
            return fail(ps, "%s: not UTF-8", path);
        for (size_t i = 0; i < body; i++) {
            if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
                return fail(ps, "%s: control characters never occur in keys", path);
        }
    }
    out->s = drey_xstrndup(s, body);
    out->len = (uint32_t)body;
    out->prefix = prefix;
    return true;
}

static bool parse_patterns(parser *ps, json_t *arr, const char *path, bool is_cache, pattern **out, size_t *n) {
    if (!json_is_array(arr) || json_array_size(arr) == 0)
        return fail(ps, "%s: a non-empty array of patterns", path);
    if (json_array_size(arr) > MAX_PATTERNS)
        return fail(ps, "%s: more than %d patterns", path, MAX_PATTERNS);
    *n = json_array_size(arr);
    *out = drey_xcalloc(*n, sizeof **out);
    size_t i;
    json_t *v;
    char sub[320];
    json_array_foreach(arr, i, v) {
        snprintf(sub, sizeof sub, "%.200s[%zu]", path, i);
        if (!parse_pattern(ps, v, sub, is_cache, &(*out)[i]))
            return false;
    }
    return true;
}

static void free_patterns(pattern *p, size_t n) {
    for (size_t i = 0; p != NULL && i < n; i++)
        free(p[i].s);
    free(p);
}

/* --- roles ------------------------------------------------------------------------ */

static bool parse_rule(parser *ps, json_t *obj, const char *path, rule *r) {
    static const char *const fields[] = {"caches", "keys", "verbs", NULL};
    if (!json_is_object(obj))
        return fail(ps, "%s: a rule is an object {caches, keys, verbs}", path);
    if (!only_fields(ps, obj, path, fields))
        return false;
    char sub[320];
    json_t *verbs = json_object_get(obj, "verbs");
    snprintf(sub, sizeof sub, "%.200s.verbs", path);
    if (!json_is_array(verbs) || json_array_size(verbs) == 0)
        return fail(ps, "%s: a non-empty array of verbs", sub);
    size_t i;
    json_t *v;
    json_array_foreach(verbs, i, v) {
        const char *name = json_string_value(v);
        int found = -1;
        for (int k = 0; name != NULL && k < DREY_AUTHZ_VERBS && found < 0; k++)
            found = strcmp(name, verb_names[k]) == 0 ? k : -1;
        if (found < 0)
            return fail(ps, "%s[%zu]: not a verb (read, write, delete, scan, watch, clear, admin, metrics)", sub, i);
        r->verbs |= 1u << found;
    }
    json_t *caches = json_object_get(obj, "caches"), *keys = json_object_get(obj, "keys");
    /* Only rules of node-wide verbs may leave caches and keys out: a
     * forgotten field must not mean "everything". */
    if ((r->verbs & ~NODE_VERBS) != 0 && (caches == NULL || keys == NULL))
        return fail(ps, "%s: a rule granting data verbs names its caches and keys (\"*\" for all)", path);
    snprintf(sub, sizeof sub, "%.200s.caches", path);
    if (caches != NULL && !parse_patterns(ps, caches, sub, true, &r->caches, &r->n_caches))
        return false;
    snprintf(sub, sizeof sub, "%.200s.keys", path);
    if (keys != NULL && !parse_patterns(ps, keys, sub, false, &r->keys, &r->n_keys))
        return false;
    return true;
}

static void free_role(role *ro) {
    for (size_t i = 0; ro->rules != NULL && i < ro->n_rules; i++) {
        free_patterns(ro->rules[i].caches, ro->rules[i].n_caches);
        free_patterns(ro->rules[i].keys, ro->rules[i].n_keys);
    }
    drey_authz__index_free(ro);
    free(ro->rules);
    free(ro->name);
}

static bool parse_roles(parser *ps, json_t *roles, drey_authz_policy *p) {
    if (roles == NULL)
        return true;
    if (!json_is_object(roles))
        return fail(ps, "roles: an object of role name -> rules");
    if (json_object_size(roles) > MAX_ROLES)
        return fail(ps, "roles: more than %d roles", MAX_ROLES);
    p->roles = drey_xcalloc(json_object_size(roles) + 1, sizeof *p->roles);
    const char *name;
    json_t *rules;
    char path[320];
    json_object_foreach(roles, name, rules) {
        role *ro = &p->roles[p->n_roles++];
        ro->name = drey_xstrdup(name);
        if (name[0] == '\0')
            return fail(ps, "roles: a role has a name");
        if (!json_is_array(rules))
            return fail(ps, "roles.%.64s: an array of rules", name);
        if (p->n_rules + json_array_size(rules) > MAX_RULES)
            return fail(ps, "roles: more than %d rules in all", MAX_RULES);
        ro->rules = drey_xcalloc(json_array_size(rules) + 1, sizeof *ro->rules);
        size_t i;
        json_t *r;
        json_array_foreach(rules, i, r) {
            snprintf(path, sizeof path, "roles.%.64s[%zu]", name, i);
            ro->n_rules++;
            if (!parse_rule(ps, r, path, &ro->rules[i]))
                return false;
        }
        p->n_rules += ro->n_rules;
    }
    return true;
}

static int role_index(const drey_authz_policy *p, const char *name) {
    for (size_t i = 0; i < p->n_roles; i++) {
        if (strcmp(p->roles[i].name, name) == 0)
            return (int)i;
    }
    return -1;
}

/* --- bindings ------------------------------------------------------------------- */

static bool parse_binding(parser *ps, json_t *obj, size_t at, drey_authz_policy *p, binding *b) {
    static const char *const fields[] = {"claim", "equals", "contains", "anonymous", "roles", NULL};
    char path[64];
    snprintf(path, sizeof path, "bindings[%zu]", at);
    if (!json_is_object(obj))
        return fail(ps, "%s: a binding is an object", path);
    if (!only_fields(ps, obj, path, fields))
        return false;
    json_t *claim = json_object_get(obj, "claim"), *eq = json_object_get(obj, "equals"),
           *has = json_object_get(obj, "contains"), *anon = json_object_get(obj, "anonymous"),
           *roles = json_object_get(obj, "roles");
    if (anon != NULL) {
        if (!json_is_true(anon) || claim != NULL || eq != NULL || has != NULL)
            return fail(ps, "%s: an anonymous binding is {\"anonymous\": true, \"roles\": [...]}", path);
    } else {
        if (!json_is_string(claim) || json_string_length(claim) == 0 || json_string_length(claim) > MAX_CLAIM_BYTES)
            return fail(ps, "%s.claim: the name of a token claim", path);
        json_t *value = eq != NULL ? eq : has;
        if ((eq == NULL) == (has == NULL) || !json_is_string(value))
            return fail(ps, "%s: exactly one of \"equals\" and \"contains\", a string", path);
        b->claim = drey_xstrdup(json_string_value(claim));
        b->value_len = json_string_length(value);
        b->value = drey_xstrndup(json_string_value(value), b->value_len);
    }
    if (!json_is_array(roles))
        return fail(ps, "%s.roles: an array of role names", path);
    b->roles = drey_xcalloc(json_array_size(roles) + 1, sizeof *b->roles);
    size_t i;
    json_t *v;
    json_array_foreach(roles, i, v) {
        int idx = json_is_string(v) ? role_index(p, json_string_value(v)) : -1;
        if (idx < 0)
            return fail(ps, "%s.roles[%zu]: no such role", path, i);
        b->roles[b->n_roles++] = (uint32_t)idx;
    }
    return true;
}

static bool parse_bindings(parser *ps, json_t *bindings, drey_authz_policy *p) {
    if (bindings == NULL)
        return true;
    if (!json_is_array(bindings))
        return fail(ps, "bindings: an array");
    if (json_array_size(bindings) > MAX_BINDINGS)
        return fail(ps, "bindings: more than %d", MAX_BINDINGS);
    p->bindings = drey_xcalloc(json_array_size(bindings) + 1, sizeof *p->bindings);
    size_t i;
    json_t *b;
    json_array_foreach(bindings, i, b) {
        p->n_bindings++;
        if (!parse_binding(ps, b, i, p, &p->bindings[i]))
            return false;
    }
    return true;
}

/* --- tenants -------------------------------------------------------------------- */

static bool parse_tenants(parser *ps, json_t *t, drey_authz_policy *p) {
    static const char *const fields[] = {"claim", "maxBytes", NULL};
    p->default_quota = -1;
    if (t == NULL)
        return true;
    if (!json_is_object(t))
        return fail(ps, "tenants: an object {claim, maxBytes}");
    if (!only_fields(ps, t, "tenants", fields))
        return false;
    json_t *claim = json_object_get(t, "claim"), *max = json_object_get(t, "maxBytes");
    if (!json_is_string(claim) || json_string_length(claim) == 0 || json_string_length(claim) > MAX_CLAIM_BYTES)
        return fail(ps, "tenants.claim: the name of the token claim that names the tenant");
    p->tenant_claim = drey_xstrdup(json_string_value(claim));
    if (max == NULL)
        return true;
    if (!json_is_object(max))
        return fail(ps, "tenants.maxBytes: an object of tenant -> bytes (\"*\": every other tenant)");
    if (json_object_size(max) > MAX_TENANT_QUOTAS)
        return fail(ps, "tenants.maxBytes: more than %d tenants", MAX_TENANT_QUOTAS);
    p->quotas = drey_xcalloc(json_object_size(max) + 1, sizeof *p->quotas);
    const char *name;
    json_t *v;
    json_object_foreach(max, name, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return fail(ps, "tenants.maxBytes.%.64s: a number of bytes, 0 or more", name);
        size_t len = strlen(name);
        if (len == 0 || len > DREY_AUTHZ_MAX_TENANT_BYTES)
            return fail(ps, "tenants.maxBytes: a tenant is 1 to %d bytes", DREY_AUTHZ_MAX_TENANT_BYTES);
        if (strcmp(name, "*") == 0) {
            p->default_quota = json_integer_value(v);
            continue;
        }
        tenant_quota *q = &p->quotas[p->n_quotas++];
        q->name = drey_xstrndup(name, len);
        q->len = len;
        q->bytes = json_integer_value(v);
    }
    return true;
}

int64_t drey_authz_policy_tenant_limit(const drey_authz_policy *p, const char *tenant, size_t len) {
    for (size_t i = 0; i < p->n_quotas; i++) {
        if (p->quotas[i].len == len && memcmp(p->quotas[i].name, tenant, len) == 0)
            return p->quotas[i].bytes;
    }
    return p->default_quota;
}

/* --- the policy ------------------------------------------------------------------ */

static void policy_free(drey_authz_policy *p) {
    for (size_t i = 0; p->roles != NULL && i < p->n_roles; i++)
        free_role(&p->roles[i]);
    free(p->roles);
    for (size_t i = 0; p->bindings != NULL && i < p->n_bindings; i++) {
        free(p->bindings[i].claim);
        free(p->bindings[i].value);
        free(p->bindings[i].roles);
    }
    free(p->bindings);
    for (size_t i = 0; p->quotas != NULL && i < p->n_quotas; i++)
        free(p->quotas[i].name);
    free(p->quotas);
    free(p->tenant_claim);
    free(p->anonymous.roles);
    free(p);
}

void drey_authz_policy_ref(drey_authz_policy *p) {
    atomic_fetch_add_explicit(&p->refs, 1, memory_order_relaxed);
}

void drey_authz_policy_unref(drey_authz_policy *p) {
    if (p != NULL && atomic_fetch_sub_explicit(&p->refs, 1, memory_order_acq_rel) == 1)
        policy_free(p);
}

/* The anonymous caller's grants: compiled once with the policy, borrowed. */
static void compile_anonymous(drey_authz_policy *p) {
    drey_authz_grants *g = &p->anonymous;
    g->borrowed = true;
    g->policy = p;
    g->tenant_limit = -1;
    size_t n = 0;
    for (size_t i = 0; i < p->n_bindings; i++)
        n += p->bindings[i].claim == NULL ? p->bindings[i].n_roles : 0;
    g->roles = drey_xcalloc(n + 1, sizeof *g->roles);
    for (size_t i = 0; i < p->n_bindings; i++) {
        const binding *b = &p->bindings[i];
        for (size_t k = 0; b->claim == NULL && k < b->n_roles; k++) {
            const role *ro = &p->roles[b->roles[k]];
            bool dup = false;
            for (size_t j = 0; j < g->n_roles && !dup; j++)
                dup = g->roles[j] == ro;
            if (dup)
                continue;
            g->roles[g->n_roles++] = ro;
            for (size_t r = 0; r < ro->n_rules; r++)
                g->verbs |= ro->rules[r].verbs;
        }
    }
}

drey_authz_policy *drey_authz_policy_parse(const char *text, size_t len, char *err, size_t err_cap) {
    parser ps = {.err = err, .cap = err_cap};
    if (err_cap > 0)
        err[0] = '\0';
    if (len > DREY_AUTHZ_MAX_POLICY_BYTES) {
        fail(&ps, "the policy is larger than %u bytes", DREY_AUTHZ_MAX_POLICY_BYTES);
        return NULL;
    }
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL) {
        fail(&ps, "not JSON: %s (line %d, column %d)", je.text, je.line, je.column);
        return NULL;
    }
    drey_authz_policy *p = drey_xcalloc(1, sizeof *p);
    atomic_init(&p->refs, 1);
    static const char *const fields[] = {"roles", "bindings", "tenants", NULL};
    if (!json_is_object(root))
        fail(&ps, "the policy is a JSON object {roles, bindings, tenants}");
    else if (only_fields(&ps, root, "the policy", fields) && parse_roles(&ps, json_object_get(root, "roles"), p) &&
             parse_bindings(&ps, json_object_get(root, "bindings"), p))
        parse_tenants(&ps, json_object_get(root, "tenants"), p);
    json_decref(root);
    if (ps.failed) {
        policy_free(p);
        return NULL;
    }
    drey_authz__index(p);
    compile_anonymous(p);
    return p;
}

void drey_authz_policy_info_of(const drey_authz_policy *p, drey_authz_policy_info *out) {
    out->roles = p->n_roles;
    out->rules = p->n_rules;
    out->bindings = p->n_bindings;
    out->tenant_quotas = p->n_quotas + (p->default_quota >= 0);
    out->tenants = p->tenant_claim != NULL;
}

/* --- the index --------------------------------------------------------------------- */

static uint64_t name_hash(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ULL;
    return h;
}

/* An exact cache's slot in vi's table: its own, or the empty one where it
 * goes. */
static exact_slot *exact_find(const verb_index *vi, const char *name, size_t len) {
    size_t i = name_hash(name, len) & vi->exact_mask;
    for (;;) {
        exact_slot *s = &vi->exact[i];
        if (s->name == NULL || (s->len == len && memcmp(s->name, name, len) == 0))
            return s;
        i = (i + 1) & vi->exact_mask;
    }
}

static void index_verb(role *ro, drey_authz_verb v) {
    verb_index *vi = &ro->idx[v];
    size_t n_exact = 0, n_wild = 0;
    for (size_t r = 0; r < ro->n_rules; r++) {
        const rule *ru = &ro->rules[r];
        if ((ru->verbs & (1u << v)) == 0)
            continue;
        vi->n_rules++;
        for (size_t c = 0; c < ru->n_caches; c++) {
            n_exact += !ru->caches[c].prefix;
            n_wild += ru->caches[c].prefix;
        }
    }
    vi->wild = drey_xcalloc(n_wild + 1, sizeof *vi->wild);
    vi->rules = drey_xcalloc(n_exact + 1, sizeof *vi->rules);
    if (n_exact > 0) {
        size_t cap = 4;
        while (cap < n_exact * 2)
            cap *= 2;
        vi->exact = drey_xcalloc(cap, sizeof *vi->exact);
        vi->exact_mask = cap - 1;
    }
    /* Two passes: count each cache's rules, then lay them out slot by slot. */
    for (size_t r = 0; r < ro->n_rules; r++) {
        const rule *ru = &ro->rules[r];
        for (size_t c = 0; (ru->verbs & (1u << v)) != 0 && c < ru->n_caches; c++) {
            const pattern *pt = &ru->caches[c];
            if (pt->prefix) {
                vi->wild[vi->n_wild++] = (wild_rule){.r = ru, .cache = pt};
                continue;
            }
            exact_slot *s = exact_find(vi, pt->s, pt->len);
            s->name = pt->s;
            s->len = pt->len;
            s->n++;
        }
    }
    uint32_t next = 0;
    for (size_t i = 0; vi->exact != NULL && i <= vi->exact_mask; i++) {
        vi->exact[i].first = next;
        next += vi->exact[i].n;
        vi->exact[i].n = 0;
    }
    for (size_t r = 0; r < ro->n_rules; r++) {
        const rule *ru = &ro->rules[r];
        for (size_t c = 0; (ru->verbs & (1u << v)) != 0 && c < ru->n_caches; c++) {
            const pattern *pt = &ru->caches[c];
            if (pt->prefix)
                continue;
            exact_slot *s = exact_find(vi, pt->s, pt->len);
            vi->rules[s->first + s->n++] = ru;
        }
    }
}

void drey_authz__index(drey_authz_policy *p) {
    for (size_t i = 0; i < p->n_roles; i++) {
        for (int v = 0; v < DREY_AUTHZ_VERBS; v++)
            index_verb(&p->roles[i], (drey_authz_verb)v);
    }
}

void drey_authz__index_free(role *ro) {
    for (int v = 0; v < DREY_AUTHZ_VERBS; v++) {
        free(ro->idx[v].exact);
        free(ro->idx[v].rules);
        free(ro->idx[v].wild);
    }
}

const exact_slot *drey_authz__exact(const verb_index *vi, const char *name, size_t len) {
    if (vi->exact == NULL)
        return NULL;
    const exact_slot *s = exact_find(vi, name, len);
    return s->name != NULL ? s : NULL;
}
