/*
 * grants — one caller's roles, compiled from its token's claims, and the
 * check every request passes; see include/drey/authz.h.
 *
 * Compiling walks the bindings once per token (the auth module keeps the
 * result with the verified token). The check allocates nothing and takes no
 * lock: for each of the caller's roles it looks up the rules granting the
 * verb on the request's cache (an exact name is one hash probe; prefix
 * patterns are few) and tests their key patterns.
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "drey/alloc.h"
#include "internal.h"

/* --- compiling ------------------------------------------------------------------- */

static bool claim_names(json_t *claim, const char *value, size_t len) {
    if (json_is_string(claim))
        return json_string_length(claim) == len && memcmp(json_string_value(claim), value, len) == 0;
    if (!json_is_array(claim))
        return false;
    size_t i;
    json_t *v;
    json_array_foreach(claim, i, v) {
        if (json_is_string(v) && json_string_length(v) == len && memcmp(json_string_value(v), value, len) == 0)
            return true;
    }
    return false;
}

static void add_role(drey_authz_grants *g, const role *ro) {
    for (size_t j = 0; j < g->n_roles; j++) {
        if (g->roles[j] == ro)
            return;
    }
    g->roles[g->n_roles++] = ro;
    for (size_t r = 0; r < ro->n_rules; r++)
        g->verbs |= ro->rules[r].verbs;
}

static void set_tenant(drey_authz_grants *g, const drey_authz_policy *p, json_t *claims) {
    g->tenant_limit = -1;
    if (p->tenant_claim == NULL)
        return;
    json_t *t = json_object_get(claims, p->tenant_claim);
    if (!json_is_string(t))
        return; /* a caller without the claim belongs to no tenant */
    size_t n = json_string_length(t);
    const char *s = json_string_value(t);
    if (n == 0 || n > DREY_AUTHZ_MAX_TENANT_BYTES)
        return;
    memcpy(g->tenant, s, n);
    g->tenant[n] = '\0';
    g->tenant_len = n;
    g->has_tenant = true;
    g->tenant_limit = drey_authz_policy_tenant_limit(p, s, n);
}

drey_authz_grants *drey_authz_policy_grants(drey_authz_policy *p, const char *claims, size_t len) {
    drey_authz_policy_ref(p);
    if (claims == NULL)
        return &p->anonymous;
    drey_authz_grants *g = drey_xcalloc(1, sizeof *g);
    atomic_init(&g->refs, 1);
    g->policy = p;
    g->roles = drey_xcalloc(p->n_roles + 1, sizeof *g->roles);
    json_t *c = json_loadb(claims, len, 0, NULL);
    /* Claims that do not parse (they were verified: they do) bind nothing. */
    for (size_t i = 0; json_is_object(c) && i < p->n_bindings; i++) {
        const binding *b = &p->bindings[i];
        if (b->claim == NULL || !claim_names(json_object_get(c, b->claim), b->value, b->value_len))
            continue;
        for (size_t k = 0; k < b->n_roles; k++)
            add_role(g, &p->roles[b->roles[k]]);
    }
    set_tenant(g, p, c);
    json_decref(c);
    return g;
}

void drey_authz_grants_ref(drey_authz_grants *g) {
    if (g->borrowed)
        drey_authz_policy_ref(g->policy);
    else
        atomic_fetch_add_explicit(&g->refs, 1, memory_order_relaxed);
}

void drey_authz_grants_unref(drey_authz_grants *g) {
    if (g == NULL)
        return;
    if (g->borrowed) {
        drey_authz_policy_unref(g->policy);
        return;
    }
    if (atomic_fetch_sub_explicit(&g->refs, 1, memory_order_acq_rel) != 1)
        return;
    drey_authz_policy_unref(g->policy);
    free(g->roles);
    free(g);
}

const char *drey_authz_grants_tenant(const drey_authz_grants *g, size_t *len) {
    *len = g->tenant_len;
    return g->has_tenant ? g->tenant : NULL;
}

int64_t drey_authz_grants_tenant_limit(const drey_authz_grants *g) {
    return g->tenant_limit;
}

uint32_t drey_authz_grants_tenant_id(const drey_authz_grants *g) {
    return atomic_load_explicit(&((drey_authz_grants *)g)->tenant_id, memory_order_relaxed);
}

void drey_authz_grants_set_tenant_id(const drey_authz_grants *g, uint32_t id) {
    atomic_store_explicit(&((drey_authz_grants *)g)->tenant_id, id, memory_order_relaxed);
}

/* --- checking -------------------------------------------------------------------- */

static bool matches(const pattern *p, const char *s, size_t n) {
    if (p->prefix)
        return n >= p->len && memcmp(s, p->s, p->len) == 0;
    return n == p->len && memcmp(s, p->s, n) == 0;
}

/* Every key that starts with prefix matches p. */
static bool covers(const pattern *p, const char *prefix, size_t n) {
    return p->prefix && n >= p->len && memcmp(prefix, p->s, p->len) == 0;
}

/* Whether rule r (which grants the verb on the cache) grants it on the
 * key (KEYS), on every key under the prefix (PREFIX), or on the cache. */
static bool rule_grants(const rule *r, const drey_authz_ask *a, const char *key, size_t key_len) {
    switch (a->scope) {
    case DREY_AUTHZ_KEYS:
        for (size_t i = 0; i < r->n_keys; i++) {
            if (matches(&r->keys[i], key, key_len))
                return true;
        }
        return false;
    case DREY_AUTHZ_PREFIX:
        for (size_t i = 0; i < r->n_keys; i++) {
            if (covers(&r->keys[i], a->prefix, a->prefix_len))
                return true;
        }
        return false;
    default:
        return true;
    }
}

/* One role, one key (or none). */
static bool role_grants(const role *ro, const drey_authz_ask *a, const char *cache, size_t cache_len, const char *key,
                        size_t key_len) {
    const verb_index *vi = &ro->idx[a->verb];
    if (vi->n_rules == 0)
        return false;
    const exact_slot *s = drey_authz__exact(vi, cache, cache_len);
    for (uint32_t i = 0; s != NULL && i < s->n; i++) {
        if (rule_grants(vi->rules[s->first + i], a, key, key_len))
            return true;
    }
    for (size_t i = 0; i < vi->n_wild; i++) {
        if (matches(vi->wild[i].cache, cache, cache_len) && rule_grants(vi->wild[i].r, a, key, key_len))
            return true;
    }
    return false;
}

/* A node-wide ask: admin and metrics need the verb; ListCaches (read on
 * every cache) a rule whose caches pattern is "*". */
static bool role_grants_node(const role *ro, drey_authz_verb v) {
    const verb_index *vi = &ro->idx[v];
    if (v == DREY_AUTHZ_ADMIN || v == DREY_AUTHZ_METRICS)
        return vi->n_rules > 0;
    for (size_t i = 0; i < vi->n_wild; i++) {
        if (vi->wild[i].cache->len == 0)
            return true;
    }
    return false;
}

static bool role_allows(const role *ro, const drey_authz_ask *a, const char *cache, size_t cache_len) {
    if (a->scope == DREY_AUTHZ_NODE)
        return role_grants_node(ro, a->verb);
    if (a->scope != DREY_AUTHZ_KEYS || a->n_keys == 0)
        return role_grants(ro, a, cache, cache_len, NULL, 0);
    for (size_t i = 0; i < a->n_keys; i++) {
        size_t n = 0;
        const char *k = a->key(a->key_ctx, i, &n);
        if (k == NULL || !role_grants(ro, a, cache, cache_len, k, n))
            return false;
    }
    return true;
}

bool drey_authz_allows(const drey_authz_grants *g, const drey_authz_ask *a) {
    if ((unsigned)a->verb >= DREY_AUTHZ_VERBS || (g->verbs & (1u << a->verb)) == 0)
        return false;
    const char *cache = a->cache != NULL ? a->cache : "";
    size_t cache_len = a->cache_len;
    if (cache_len == 0) {
        cache = "default"; /* the default cache is named so in patterns */
        cache_len = 7;
    }
    for (size_t i = 0; i < g->n_roles; i++) {
        if (role_allows(g->roles[i], a, cache, cache_len))
            return true;
    }
    return false;
}
