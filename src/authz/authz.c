/*
 * authz — the policy file in force: loading, reloading (SIGHUP, or the
 * watcher seeing the file change), refusals and what they leave behind.
 *
 * The current policy is one pointer, swapped under a mutex and read with
 * an acquire load; grants hold a reference to the policy they were
 * compiled under, so a reload frees nothing a request still uses. A load
 * that fails keeps the current policy; its reason stays in the stats (and
 * so in readiness) until a load succeeds.
 *
 * The watcher polls the file's metadata (device, inode, size, times) every
 * interval, as the key watcher does: it sees through the symlink swap
 * Kubernetes uses for a mounted ConfigMap. A broken file is reported once,
 * not every interval; the next change is tried again.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/io.h"
#include "drey/log.h"
#include "drey/metrics.h"
#include "internal.h"

struct drey_authz {
    char *path;
    _Atomic(drey_authz_policy *) policy; /* current; one reference held here */
    pthread_mutex_t mu;                  /* loads, the stats below, the denials */
    uint64_t generation;
    int64_t loaded_ms;
    uint64_t reloads, reload_failures;
    char last_error[256];
    uint64_t seen; /* the file's fingerprint at the last load attempt */
    _Atomic uint64_t denied[DREY_AUTHZ_VERBS];
    drey_authz_denial denials[DREY_AUTHZ_LAST_DENIALS]; /* most recent first */
    size_t n_denials;

    drey_io_poller watcher;
};

/* The file's policy, or NULL with err. */
static drey_authz_policy *load(const char *path, char *err, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, cap, "%s: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = drey_xmalloc(DREY_AUTHZ_MAX_POLICY_BYTES + 1);
    size_t n = fread(buf, 1, DREY_AUTHZ_MAX_POLICY_BYTES + 1, f);
    bool read_error = ferror(f) != 0;
    fclose(f);
    drey_authz_policy *p = NULL;
    if (read_error)
        snprintf(err, cap, "%s: read error", path);
    else if (n > DREY_AUTHZ_MAX_POLICY_BYTES)
        snprintf(err, cap, "%s: larger than %u bytes", path, DREY_AUTHZ_MAX_POLICY_BYTES);
    else {
        char why[200];
        p = drey_authz_policy_parse(buf, n, why, sizeof why);
        if (p == NULL)
            snprintf(err, cap, "%s: %s", path, why);
    }
    free(buf);
    return p;
}

static void look(void *arg);

drey_authz *drey_authz_create(const char *path, char *err, size_t err_cap) {
    uint64_t fp = drey_io_fingerprint(DREY_IO_FNV_OFFSET, path);
    drey_authz_policy *p = load(path, err, err_cap);
    if (p == NULL)
        return NULL;
    drey_authz *a = drey_xcalloc(1, sizeof *a);
    a->path = drey_xstrdup(path);
    atomic_init(&a->policy, p);
    a->generation = 1;
    a->loaded_ms = drey_wall_ms();
    a->seen = fp;
    pthread_mutex_init(&a->mu, NULL);
    drey_io_poller_init(&a->watcher, "authz policy", look, a);
    drey_authz_policy_info info;
    drey_authz_policy_info_of(p, &info);
    DREY_LOG_INFO("authz policy loaded", DREY_LOG_STR("path", path), DREY_LOG_UINT("roles", info.roles),
                  DREY_LOG_UINT("rules", info.rules), DREY_LOG_UINT("bindings", info.bindings));
    return a;
}

void drey_authz_destroy(drey_authz *a) {
    if (a == NULL)
        return;
    drey_io_poller_destroy(&a->watcher);
    drey_authz_policy_unref(atomic_load(&a->policy));
    pthread_mutex_destroy(&a->mu);
    free(a->path);
    free(a);
}

static bool reload(drey_authz *a, const char *trigger, char *err, size_t err_cap) {
    char why[256];
    pthread_mutex_lock(&a->mu);
    a->seen = drey_io_fingerprint(DREY_IO_FNV_OFFSET, a->path);
    drey_authz_policy *p = load(a->path, why, sizeof why);
    if (p == NULL) {
        a->reload_failures++;
        snprintf(a->last_error, sizeof a->last_error, "%s", why);
        pthread_mutex_unlock(&a->mu);
        DREY_LOG_WARN("authz policy reload failed; keeping the policy in force", DREY_LOG_STR("trigger", trigger),
                      DREY_LOG_STR("reason", why));
        if (err != NULL && err_cap > 0)
            snprintf(err, err_cap, "%s", why);
        return false;
    }
    drey_authz_policy *old = atomic_exchange_explicit(&a->policy, p, memory_order_acq_rel);
    a->generation++;
    a->reloads++;
    a->loaded_ms = drey_wall_ms();
    a->last_error[0] = '\0';
    pthread_mutex_unlock(&a->mu);
    drey_authz_policy_unref(old); /* requests holding grants of it keep it alive */
    drey_authz_policy_info info;
    drey_authz_policy_info_of(p, &info);
    DREY_LOG_INFO("authz policy reloaded", DREY_LOG_STR("trigger", trigger), DREY_LOG_UINT("roles", info.roles),
                  DREY_LOG_UINT("rules", info.rules), DREY_LOG_UINT("bindings", info.bindings));
    return true;
}

bool drey_authz_reload(drey_authz *a, char *err, size_t err_cap) {
    return reload(a, "reload", err, err_cap);
}

/* --- the watcher ------------------------------------------------------------------ */

static void look(void *arg) {
    drey_authz *a = arg;
    uint64_t fp = drey_io_fingerprint(DREY_IO_FNV_OFFSET, a->path);
    pthread_mutex_lock(&a->mu);
    bool changed = fp != a->seen;
    pthread_mutex_unlock(&a->mu);
    if (changed)
        reload(a, "watch", NULL, 0);
}

void drey_authz_watch(drey_authz *a, int64_t interval_ms) {
    drey_io_poller_start(&a->watcher, interval_ms);
}

void drey_authz_stop_watch(drey_authz *a) {
    drey_io_poller_stop(&a->watcher);
}

/* --- grants ----------------------------------------------------------------------- */

/* The current policy with a reference (a reload may drop the authorizer's
 * at any moment). */
static drey_authz_policy *current(drey_authz *a) {
    pthread_mutex_lock(&a->mu);
    drey_authz_policy *p = atomic_load_explicit(&a->policy, memory_order_acquire);
    drey_authz_policy_ref(p);
    pthread_mutex_unlock(&a->mu);
    return p;
}

drey_authz_grants *drey_authz_grants_for(drey_authz *a, const char *claims, size_t len) {
    drey_authz_policy *p = current(a);
    drey_authz_grants *g = drey_authz_policy_grants(p, claims, len);
    drey_authz_policy_unref(p);
    return g;
}

bool drey_authz_current(const drey_authz *a, const drey_authz_grants *g) {
    return g->policy == atomic_load_explicit(&((drey_authz *)a)->policy, memory_order_acquire);
}

int64_t drey_authz_tenant_limit(drey_authz *a, const char *tenant, size_t len) {
    drey_authz_policy *p = current(a);
    int64_t limit = drey_authz_policy_tenant_limit(p, tenant, len);
    drey_authz_policy_unref(p);
    return limit;
}

bool drey_authz_has_tenants(drey_authz *a) {
    return drey_authz_tenant_claim(a, NULL, 0);
}

bool drey_authz_tenant_claim(drey_authz *a, char *claim, size_t cap) {
    drey_authz_policy *p = current(a);
    bool yes = p->tenant_claim != NULL;
    if (yes && claim != NULL && cap > 0)
        snprintf(claim, cap, "%s", p->tenant_claim);
    drey_authz_policy_unref(p);
    return yes;
}

/* --- refusals ----------------------------------------------------------------------- */

static void copy_field(char *dst, size_t cap, const char *s, size_t n) {
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, s, n);
    dst[n] = '\0';
}

void drey_authz_deny(drey_authz *a, const char *principal, drey_authz_verb verb, const char *cache, size_t cache_len,
                     const char *method, drey_status *st) {
    if (cache == NULL) /* a node-wide call */
        cache_len = 0, cache = "";
    else if (cache_len == 0)
        cache = "default", cache_len = 7;
    if (principal == NULL)
        principal = "";
    if (method == NULL)
        method = "";
    drey_status_set(st, DREY_ERR_NOT_PERMITTED);
    drey_status_add_metadata(st, "verb", "%s", drey_authz_verb_name(verb));
    drey_status_add_metadata(st, "cache", "%.*s", (int)(cache_len < 47 ? cache_len : 47), cache);
    drey_status_add_metadata(st, "method", "%.47s", method);
    if ((unsigned)verb < DREY_AUTHZ_VERBS)
        atomic_fetch_add_explicit(&a->denied[verb], 1, memory_order_relaxed);

    drey_authz_denial d = {.verb = verb, .last_ms = drey_wall_ms(), .count = 1};
    copy_field(d.principal, sizeof d.principal, principal, strlen(principal));
    copy_field(d.cache, sizeof d.cache, cache, cache_len);
    copy_field(d.method, sizeof d.method, method, strlen(method));
    pthread_mutex_lock(&a->mu);
    size_t at = a->n_denials;
    for (size_t i = 0; i < a->n_denials; i++) {
        const drey_authz_denial *e = &a->denials[i];
        if (e->verb == verb && strcmp(e->principal, d.principal) == 0 && strcmp(e->cache, d.cache) == 0 &&
            strcmp(e->method, d.method) == 0) {
            d.count = e->count + 1;
            at = i;
            break;
        }
    }
    if (at == a->n_denials && a->n_denials < DREY_AUTHZ_LAST_DENIALS)
        a->n_denials++;
    if (at >= a->n_denials)
        at = a->n_denials - 1; /* the oldest goes */
    memmove(&a->denials[1], &a->denials[0], at * sizeof a->denials[0]);
    a->denials[0] = d;
    pthread_mutex_unlock(&a->mu);
    DREY_LOG_DEBUG("request not permitted", DREY_LOG_STR("principal", d.principal),
                   DREY_LOG_STR("verb", drey_authz_verb_name(verb)), DREY_LOG_STR("cache", d.cache),
                   DREY_LOG_STR("method", d.method));
}

void drey_authz_get_stats(drey_authz *a, drey_authz_stats *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->path, sizeof out->path, "%s", a->path);
    for (int v = 0; v < DREY_AUTHZ_VERBS; v++)
        out->denied[v] = atomic_load_explicit(&a->denied[v], memory_order_relaxed);
    pthread_mutex_lock(&a->mu);
    out->generation = a->generation;
    out->loaded_ms = a->loaded_ms;
    drey_authz_policy_info_of(atomic_load(&a->policy), &out->policy);
    out->reloads = a->reloads;
    out->reload_failures = a->reload_failures;
    snprintf(out->last_error, sizeof out->last_error, "%s", a->last_error);
    out->n_denials = a->n_denials;
    memcpy(out->denials, a->denials, a->n_denials * sizeof a->denials[0]);
    pthread_mutex_unlock(&a->mu);
}

void drey_authz_collect_metrics(void *ctx, FILE *out) {
    drey_authz *a = ctx;
    drey_authz_stats s;
    drey_authz_get_stats(a, &s);
    drey_metrics_header(out, "drey_authz_denied_total", "counter",
                        "Requests refused PERMISSION_DENIED NOT_PERMITTED by the authorization policy, by verb.");
    char labels[64];
    for (int v = 0; v < DREY_AUTHZ_VERBS; v++) {
        drey_metrics_labels(labels, sizeof labels, "verb", drey_authz_verb_name((drey_authz_verb)v), NULL);
        drey_metrics_sample(out, "drey_authz_denied_total", labels, (double)s.denied[v]);
    }
    drey_metrics_header(out, "drey_authz_policy_generation", "gauge",
                        "Authorization policies loaded since start (1: the first; a failed reload adds none).");
    drey_metrics_sample(out, "drey_authz_policy_generation", NULL, (double)s.generation);
    drey_metrics_header(out, "drey_authz_policy_reload_failures_total", "counter",
                        "Policy reloads that did not load (the policy in force stayed).");
    drey_metrics_sample(out, "drey_authz_policy_reload_failures_total", NULL, (double)s.reload_failures);
    drey_metrics_header(out, "drey_authz_policy_load_failing", "gauge",
                        "1 while the last attempt to load the policy file failed.");
    drey_metrics_sample(out, "drey_authz_policy_load_failing", NULL, s.last_error[0] != '\0');
}
