/*
 * authz — who may do what: grants from token claims, from a policy file.
 *
 *   {"roles": {"reader": [{"caches": ["users", "sess-*"], "keys": ["*"], "verbs": ["read"]}]},
 *    "bindings": [{"claim": "groups", "contains": "cache-readers", "roles": ["reader"]},
 *                 {"anonymous": true, "roles": []}],
 *    "tenants": {"claim": "tenant", "maxBytes": {"acme": 1048576, "*": 268435456}}}
 *
 * A role is a list of rules; a rule grants verbs on the caches and keys its
 * patterns name (a pattern is exact, or ends in '*' and names a prefix; "*"
 * is everything). A binding gives roles to the tokens whose claim (a string,
 * or an array of strings) equals or contains a value; "anonymous" bindings
 * give roles to callers without a token. A request is allowed when one role
 * of its caller grants its verb on its cache and on every key it names
 * (Redis's selectors: two roles never combine into a grant neither gives).
 * Calls that name a prefix (Scan, Watch) need a key pattern covering every
 * key under it; calls on a whole cache (Scan or Watch without a prefix,
 * Clear) need "*". admin and metrics are node-wide: caches and keys do not
 * apply to them.
 *
 * The policy is parsed and indexed once per load; a caller's grants are
 * compiled once per token (the auth module keeps them with the verified
 * token, drey_auth_attach) and checked without allocating. A reload that
 * does not parse keeps the old policy and says why (log, readiness); grants
 * compiled under an older policy are not current (drey_authz_current) and
 * are compiled again.
 *
 * tenants: the tenant of a token is the string value of tenants.claim;
 * maxBytes caps the bytes of entries its writes created or last replaced
 * ("*": tenants not named). Enforced by src/tenant.
 */
#ifndef DREY_AUTHZ_H
#define DREY_AUTHZ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "drey/status.h"

typedef enum drey_authz_verb {
    DREY_AUTHZ_READ,    /* Get, GetMany, GetExpiration, GetCacheStats, ListCaches */
    DREY_AUTHZ_WRITE,   /* Set, SetMany, Add, Update, GetOrAdd, Increment, Touch, Persist */
    DREY_AUTHZ_DELETE,  /* Remove, RemoveMany */
    DREY_AUTHZ_SCAN,    /* Scan */
    DREY_AUTHZ_WATCH,   /* Watch */
    DREY_AUTHZ_CLEAR,   /* Clear */
    DREY_AUTHZ_ADMIN,   /* the Admin service */
    DREY_AUTHZ_METRICS, /* the ops listener's details and metrics, from beyond loopback */
    DREY_AUTHZ_VERBS
} drey_authz_verb;

const char *drey_authz_verb_name(drey_authz_verb v);

/* Limits of a policy file (bigger ones are refused). */
#define DREY_AUTHZ_MAX_POLICY_BYTES (1u << 20)
#define DREY_AUTHZ_MAX_PATTERN_BYTES 1024
#define DREY_AUTHZ_MAX_TENANT_BYTES 128

/* --- a policy ---------------------------------------------------------------- */

typedef struct drey_authz_policy drey_authz_policy;

/* Parses and indexes a policy; NULL with the reason (the JSON path of what
 * is wrong) in err. Unknown fields are refused: a typo must not silently
 * grant or withhold. */
drey_authz_policy *drey_authz_policy_parse(const char *text, size_t len, char *err, size_t err_cap);
void drey_authz_policy_ref(drey_authz_policy *p);
void drey_authz_policy_unref(drey_authz_policy *p);

typedef struct drey_authz_policy_info {
    size_t roles, rules, bindings, tenant_quotas;
    bool tenants;          /* a tenants section with a claim */
} drey_authz_policy_info;
void drey_authz_policy_info_of(const drey_authz_policy *p, drey_authz_policy_info *out);

/* The quota of a tenant (maxBytes, or "*"); -1: none. */
int64_t drey_authz_policy_tenant_limit(const drey_authz_policy *p, const char *tenant, size_t len);

/* --- one caller's grants ---------------------------------------------------- */

typedef struct drey_authz_grants drey_authz_grants;

/* The grants of a verified token's claims (a JSON object's text), or of an
 * anonymous caller (claims NULL). Never NULL: a token no binding names gets
 * grants that allow nothing. A reference: drey_authz_grants_unref. */
drey_authz_grants *drey_authz_policy_grants(drey_authz_policy *p, const char *claims, size_t len);
void drey_authz_grants_ref(drey_authz_grants *g);
void drey_authz_grants_unref(drey_authz_grants *g);

/* What a request names. */
typedef enum drey_authz_scope {
    DREY_AUTHZ_KEYS,   /* every key of the list */
    DREY_AUTHZ_PREFIX, /* every key under prefix ("" : the whole cache) */
    DREY_AUTHZ_CACHE,  /* the cache, whatever keys (GetCacheStats) */
    DREY_AUTHZ_NODE,   /* no cache (admin, metrics; ListCaches: read on every cache) */
} drey_authz_scope;

typedef struct drey_authz_ask {
    drey_authz_verb verb;
    drey_authz_scope scope;
    const char *cache; /* "" and "default" are the default cache */
    size_t cache_len;
    size_t n_keys;     /* KEYS: key(i) for i < n_keys */
    const char *(*key)(const void *ctx, size_t i, size_t *len);
    const void *key_ctx;
    const char *prefix; /* PREFIX */
    size_t prefix_len;
} drey_authz_ask;

/* Whether the grants allow the ask. No allocation, no lock. */
bool drey_authz_allows(const drey_authz_grants *g, const drey_authz_ask *ask);

/* The caller's tenant (NULL: none) and its quota (-1: none). */
const char *drey_authz_grants_tenant(const drey_authz_grants *g, size_t *len);
int64_t drey_authz_grants_tenant_limit(const drey_authz_grants *g);
/* A slot the tenant module keeps its id of the tenant in (0: not known yet);
 * the grants only carry it. */
uint32_t drey_authz_grants_tenant_id(const drey_authz_grants *g);
void drey_authz_grants_set_tenant_id(const drey_authz_grants *g, uint32_t id);

/* --- the authorizer: a policy file, reloaded -------------------------------- */

typedef struct drey_authz drey_authz;

/* Loads the file; NULL with the reason when it does not load (the node must
 * not start). */
drey_authz *drey_authz_create(const char *path, char *err, size_t err_cap);
void drey_authz_destroy(drey_authz *a);

/* Reads the file again (SIGHUP). On failure the old policy stays, err and
 * the log say why, and readiness shows it until a load succeeds. */
bool drey_authz_reload(drey_authz *a, char *err, size_t err_cap);
/* A thread that reloads when the file changes, looking every interval_ms. */
void drey_authz_watch(drey_authz *a, int64_t interval_ms);
void drey_authz_stop_watch(drey_authz *a);

/* The current policy's grants for claims (NULL: anonymous); a reference. */
drey_authz_grants *drey_authz_grants_for(drey_authz *a, const char *claims, size_t len);
/* Whether g was compiled under the current policy. */
bool drey_authz_current(const drey_authz *a, const drey_authz_grants *g);
/* The quota of a tenant under the current policy; -1: none. */
int64_t drey_authz_tenant_limit(drey_authz *a, const char *tenant, size_t len);
/* Whether the current policy names a tenant claim; its name into claim
 * (cap bytes, NUL-terminated) when claim is not NULL. */
bool drey_authz_has_tenants(drey_authz *a);
bool drey_authz_tenant_claim(drey_authz *a, char *claim, size_t cap);

/* A refusal: counted (drey_authz_denied_total{verb}), kept among the last
 * denials, and described in st: PERMISSION_DENIED NOT_PERMITTED with
 * ErrorInfo metadata verb, cache and method (never a key or a value).
 * cache NULL: a node-wide call (""); "" is the default cache. */
void drey_authz_deny(drey_authz *a, const char *principal, drey_authz_verb verb, const char *cache, size_t cache_len,
                     const char *method, drey_status *st);

#define DREY_AUTHZ_LAST_DENIALS 16

typedef struct drey_authz_denial {
    char principal[128];
    drey_authz_verb verb;
    char cache[129];
    char method[96];
    int64_t last_ms; /* wall clock */
    uint64_t count;  /* denials of this principal, verb, cache and method */
} drey_authz_denial;

typedef struct drey_authz_stats {
    char path[256];
    uint64_t generation;          /* policies loaded so far */
    int64_t loaded_ms;            /* when the current one was */
    drey_authz_policy_info policy;
    uint64_t reloads, reload_failures;
    char last_error[256];         /* "" once a load succeeded after it */
    uint64_t denied[DREY_AUTHZ_VERBS];
    size_t n_denials;             /* most recent first */
    drey_authz_denial denials[DREY_AUTHZ_LAST_DENIALS];
} drey_authz_stats;

void drey_authz_get_stats(drey_authz *a, drey_authz_stats *out);

/* A metrics collector (drey_metrics_add_collector; ctx: the drey_authz):
 * drey_authz_denied_total{verb}, drey_authz_policy_generation,
 * drey_authz_reload_failures_total. */
void drey_authz_collect_metrics(void *ctx, FILE *out);

#endif
