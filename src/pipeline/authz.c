/*
 * authz — the stage that asks the policy (--authz-policy) whether the
 * caller may do what its request asks; see include/drey/authz.h.
 *
 * It runs after backpressure, right before the request runs (or is
 * forwarded): a request that waited in the queue is checked against the
 * policy in force when it runs, not when it arrived, and every operation
 * of a Pipeline stream is checked as it is submitted. On a cluster the
 * owner of a forwarded call runs the same stage with the caller's token
 * (the forwarding node passes it on): the ingress's check spares a hop, the
 * owner's is the guard.
 *
 * What a request asks, by its message type: a verb, its cache, and its keys
 * (every key of a batch: one key not granted refuses the whole batch before
 * any of it runs), a prefix (Scan, Watch: every key under it), or the whole
 * cache (Clear; Scan and Watch without a prefix). Node calls
 * (DREY_METHOD_PEER) carry no caller and are the internal listener's, where
 * only peers' certificates get in.
 */
#include <string.h>

#include "drey/admin/v1/admin.pb-c.h"
#include "drey/cache/v1/cache.pb-c.h"
#include "stages.h"

/* The keys of a request, by its type. */
static const char *key_at(const void *ctx, size_t i, size_t *len) {
    const ProtobufCMessage *m = ctx;
    const ProtobufCMessageDescriptor *d = m->descriptor;
    const char *k;
    if (d == &drey__cache__v1__get_request__descriptor)
        k = ((const Drey__Cache__V1__GetRequest *)m)->key;
    else if (d == &drey__cache__v1__get_many_request__descriptor)
        k = ((const Drey__Cache__V1__GetManyRequest *)m)->keys[i];
    else if (d == &drey__cache__v1__watch_request__descriptor)
        k = ((const Drey__Cache__V1__WatchRequest *)m)->keys[i];
    else
        k = drey_method_request_key(m, i);
    *len = k != NULL ? strlen(k) : 0;
    return k;
}

static size_t key_count(const ProtobufCMessage *m) {
    if (m->descriptor == &drey__cache__v1__get_request__descriptor)
        return 1;
    return drey_method_request_key_count(m);
}

/* What r asks; false for a method the policy does not govern. */
static bool ask_of(const drey_request *r, drey_authz_ask *a) {
    const ProtobufCMessage *m = r->msg;
    const ProtobufCMessageDescriptor *d = m->descriptor;
    memset(a, 0, sizeof *a);
    if ((r->method->flags & DREY_METHOD_ADMIN) != 0) {
        a->verb = DREY_AUTHZ_ADMIN;
        a->scope = DREY_AUTHZ_NODE;
        return true;
    }
    a->cache = d == &drey__cache__v1__get_request__descriptor ? ((const Drey__Cache__V1__GetRequest *)m)->cache
                                                               : drey_method_request_cache(m);
    if (a->cache == NULL) {
        if (d != &drey__cache__v1__list_caches_request__descriptor)
            return false;
        a->verb = DREY_AUTHZ_READ; /* every cache's figures: read on "*" */
        a->scope = DREY_AUTHZ_NODE;
        return true;
    }
    a->cache_len = strlen(a->cache);
    a->scope = DREY_AUTHZ_KEYS;
    if (d == &drey__cache__v1__get_request__descriptor || d == &drey__cache__v1__get_many_request__descriptor ||
        d == &drey__cache__v1__get_expiration_request__descriptor)
        a->verb = DREY_AUTHZ_READ;
    else if (d == &drey__cache__v1__remove_request__descriptor || d == &drey__cache__v1__remove_many_request__descriptor)
        a->verb = DREY_AUTHZ_DELETE;
    else if (d == &drey__cache__v1__get_cache_stats_request__descriptor) {
        a->verb = DREY_AUTHZ_READ;
        a->scope = DREY_AUTHZ_CACHE;
        return true;
    } else if (d == &drey__cache__v1__scan_request__descriptor) {
        a->verb = DREY_AUTHZ_SCAN;
        a->scope = DREY_AUTHZ_PREFIX;
        a->prefix = ((const Drey__Cache__V1__ScanRequest *)m)->prefix;
    } else if (d == &drey__cache__v1__clear_request__descriptor) {
        a->verb = DREY_AUTHZ_CLEAR;
        a->scope = DREY_AUTHZ_PREFIX; /* every key of the cache */
        a->prefix = "";
    } else if (d == &drey__cache__v1__watch_request__descriptor) {
        const Drey__Cache__V1__WatchRequest *w = (const void *)m;
        a->verb = DREY_AUTHZ_WATCH;
        if (w->n_keys == 0) {
            a->scope = DREY_AUTHZ_PREFIX; /* a prefix, or "": the whole cache */
            a->prefix = w->prefix;
        }
    } else if ((r->method->flags & DREY_METHOD_WRITE) != 0)
        a->verb = DREY_AUTHZ_WRITE; /* Set, SetMany, Add, Update, GetOrAdd, Increment, Touch, Persist */
    else
        return false;
    if (a->scope == DREY_AUTHZ_PREFIX) {
        a->prefix_len = a->prefix != NULL ? strlen(a->prefix) : 0;
        return true;
    }
    a->n_keys = key_count(m);
    a->key = key_at;
    a->key_ctx = m;
    return true;
}

drey_stage_result drey_pipeline__authz(drey_pipeline *p, drey_request *r) {
    const drey_pipeline_options *o = drey_pipeline__options(p);
    if (o->authz == NULL || (r->method->flags & DREY_METHOD_PEER) != 0)
        return DREY_STAGE_NEXT;
    drey_authz_ask a;
    if (!ask_of(r, &a))
        return DREY_STAGE_NEXT;
    if (r->grants != NULL && drey_authz_allows(r->grants, &a))
        return DREY_STAGE_NEXT;
    /* The caller the refusal names: the token's subject when there is one
     * (a forwarded call's principal is the forwarding node). */
    const char *who = r->write.principal != NULL && r->write.principal[0] != '\0' ? r->write.principal : r->principal;
    drey_status *st = drey_pipeline__status(r, DREY_ERR_NONE);
    drey_authz_deny(o->authz, who, a.verb, a.cache, a.cache_len, r->method->path, st);
    return DREY_STAGE_REJECT;
}
