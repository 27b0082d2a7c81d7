/*
 * tenant — the stage that holds a write to its tenant's memory quota; see
 * include/drey/tenant.h.
 *
 * The caller's tenant comes with its grants (the policy's tenants.claim of
 * its token): the write's journal record names it, so what it stores
 * belongs to the tenant live and on replay. A write whose growth for the
 * tenant (its new entries, less the tenant's own entries it replaces) would
 * pass the quota is refused here, before the journal, with
 * RESOURCE_EXHAUSTED TENANT_MEMORY_QUOTA: nothing is written, evicted or
 * remembered. With an eviction policy it first evicts the tenant's own
 * entries to make room (they go with the write's record, as memory
 * admission's victims do), and is refused only when the tenant has none
 * left to give.
 *
 * A cluster node may have to ask etcd for more of the tenant's quota: the
 * write is parked meanwhile and this stage runs again when the answer
 * comes (once: a second shortfall is a refusal).
 */
#include <stdio.h>
#include <string.h>

#include "drey/clock.h"
#include "drey/log.h"
#include "stages.h"

#define RETRY_MS 1000

static void resume(void *arg) {
    drey_pipeline_resume(arg);
}

static drey_stage_result refuse(drey_request *r, const char *tenant, size_t len, int64_t used, int64_t limit,
                                int64_t growth) {
    drey_status *st = drey_pipeline__status(r, DREY_ERR_TENANT_MEMORY_QUOTA);
    drey_status_add_metadata(st, "limitBytes", "%lld", (long long)limit);
    drey_status_add_metadata(st, "usedBytes", "%lld", (long long)used);
    drey_status_add_metadata(st, "requestBytes", "%lld", (long long)growth);
    snprintf(st->quota_subject, sizeof st->quota_subject, "tenant:%.*s", (int)len, tenant);
    st->quota_description = "the tenant's entries would pass its memory quota (tenants.maxBytes)";
    st->retry_delay_ms = RETRY_MS;
    return DREY_STAGE_REJECT;
}

drey_stage_result drey_pipeline__tenant(drey_pipeline *p, drey_request *r) {
    const drey_pipeline_options *o = drey_pipeline__options(p);
    const drey_method *m = r->method;
    if (o->tenants == NULL || r->grants == NULL || (m->flags & DREY_METHOD_PEER) != 0)
        return DREY_STAGE_NEXT;
    size_t len;
    const char *tenant = drey_authz_grants_tenant(r->grants, &len);
    if (tenant == NULL)
        return DREY_STAGE_NEXT; /* no tenant: bounded by the node only */
    r->write.tenant = tenant; /* the grants live until the write is answered */
    uint32_t id = drey_authz_grants_tenant_id(r->grants);
    if (id == 0) {
        id = drey_tenants_intern(o->tenants, tenant, len);
        drey_authz_grants_set_tenant_id(r->grants, id); /* once per token */
    }
    r->tenant_id = id;
    int64_t limit = drey_authz_grants_tenant_limit(r->grants);
    if (limit < 0 || m->tenant_growth == NULL)
        return DREY_STAGE_NEXT;
    int64_t now = drey_wall_ms();
    int64_t growth = m->tenant_growth(m->ctx, r->msg, now, id);
    if (growth <= 0)
        return DREY_STAGE_NEXT;
    growth -= r->tenant_evicted; /* a second run: its victims are chosen */
    drey_tenant_ask ask = {.tenant = id, .limit_bytes = limit, .growth_bytes = growth > 0 ? growth : 0,
                           .may_wait = !r->tenant_waited, .resume = resume, .arg = r};
    if (ask.growth_bytes == 0)
        return DREY_STAGE_NEXT;
    if (ask.may_wait) {
        /* Set before asking: a parked request may be resumed (and run on)
         * before admit returns, and nothing of r is touched after. The
         * resume runs this stage again. */
        r->tenant_waited = true;
        r->next_stage--;
    }
    drey_tenant_admission adm;
    drey_tenant_verdict v = drey_tenants_admit(o->tenants, &ask, &adm);
    if (v == DREY_TENANT_PARKED)
        return DREY_STAGE_PARKED;
    if (ask.may_wait)
        r->next_stage++;
    if (v == DREY_TENANT_ADMITTED) {
        r->tenant_reserved = ask.growth_bytes;
        return DREY_STAGE_NEXT;
    }
    /* Over its quota: with an eviction policy its own entries make room. */
    int64_t need = adm.used_bytes + ask.growth_bytes - adm.limit_bytes;
    if (o->memory != NULL && drey_memory_evicts(o->memory) && need > 0 && r->tenant_evicted == 0) {
        int64_t chosen = drey_memory_choose_tenant(o->memory, need, now, &r->evict_only, id, r->arena,
                                                   &r->write.evicted, &r->write.n_evicted);
        if (chosen >= need) {
            r->tenant_evicted = chosen;
            ask.growth_bytes = growth - chosen > 0 ? growth - chosen : 0;
            ask.may_wait = false;
            if (ask.growth_bytes == 0 ||
                drey_tenants_admit(o->tenants, &ask, &adm) == DREY_TENANT_ADMITTED) {
                r->tenant_reserved = ask.growth_bytes;
                return DREY_STAGE_NEXT;
            }
        }
        /* Not enough of its own to evict: nothing is evicted. */
        r->write.evicted = NULL;
        r->write.n_evicted = 0;
        r->tenant_evicted = 0;
    }
    drey_tenants_refused(o->tenants, id);
    DREY_LOG_DEBUG("write refused: tenant memory quota", DREY_LOG_STR("principal", r->principal),
                   DREY_LOG_INT("limit_bytes", adm.limit_bytes), DREY_LOG_INT("used_bytes", adm.used_bytes));
    return refuse(r, tenant, len, adm.used_bytes, adm.limit_bytes, growth);
}
