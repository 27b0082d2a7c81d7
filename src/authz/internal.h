/* What the files of src/authz share: a parsed policy and compiled grants
 * (internal to authz). */
#ifndef DREY_AUTHZ_INTERNAL_H
#define DREY_AUTHZ_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "drey/authz.h"

/* Exact ("users"), or a prefix ("sess-*": s = "sess-", prefix). "*" is the
 * empty prefix. */
typedef struct pattern {
    char *s;
    uint32_t len;
    bool prefix;
} pattern;

typedef struct rule {
    uint32_t verbs; /* bit per drey_authz_verb */
    pattern *caches;
    size_t n_caches;
    pattern *keys;
    size_t n_keys;
} rule;

/* A rule a cache prefix pattern names (one entry per such pattern). */
typedef struct wild_rule {
    const rule *r;
    const pattern *cache;
} wild_rule;

/* The rules of one role granting one verb, indexed by cache: exact cache
 * names in an open-addressing table, prefix patterns in a list. The check
 * looks at the rules that can apply to its cache and no others, so a policy
 * of hundreds of rules costs a hash and a few comparisons. */
typedef struct exact_slot {
    const char *name; /* NULL: empty */
    uint32_t len;
    uint32_t first, n; /* into verb_index.rules */
} exact_slot;

typedef struct verb_index {
    size_t n_rules;        /* rules of the role granting the verb */
    exact_slot *exact;     /* NULL when none */
    size_t exact_mask;
    const rule **rules;    /* the exact slots' rules, slot by slot */
    wild_rule *wild;
    size_t n_wild;
} verb_index;

typedef struct role {
    char *name;
    rule *rules;
    size_t n_rules;
    verb_index idx[DREY_AUTHZ_VERBS];
} role;

typedef struct binding {
    char *claim;     /* NULL: anonymous */
    char *value;
    size_t value_len;
    uint32_t *roles; /* indexes into the policy's roles */
    size_t n_roles;
} binding;

typedef struct tenant_quota {
    char *name;
    size_t len;
    int64_t bytes;
} tenant_quota;

struct drey_authz_grants {
    _Atomic long refs;
    drey_authz_policy *policy;  /* a reference, except for the policy's own anonymous grants */
    bool borrowed;              /* the policy's anonymous grants: references go to the policy */
    uint32_t verbs;             /* every verb some role grants: a quick no */
    size_t n_roles;
    const role **roles;
    char tenant[DREY_AUTHZ_MAX_TENANT_BYTES + 1];
    size_t tenant_len;
    bool has_tenant;
    int64_t tenant_limit;
    _Atomic uint32_t tenant_id;
};

struct drey_authz_policy {
    _Atomic long refs;
    role *roles;
    size_t n_roles, n_rules;
    binding *bindings;
    size_t n_bindings;
    char *tenant_claim;  /* NULL: no tenants */
    tenant_quota *quotas;
    size_t n_quotas;
    int64_t default_quota; /* "*"; -1: none */
    drey_authz_grants anonymous;
};

/* Indexes every role's rules by verb and cache (policy.c). */
void drey_authz__index(drey_authz_policy *p);
void drey_authz__index_free(role *ro);
/* The slot of an exact cache name in vi's table; NULL: no rule names it. */
const exact_slot *drey_authz__exact(const verb_index *vi, const char *name, size_t len);

#endif
