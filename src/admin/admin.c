/*
 * admin — drey.admin.v1.Admin; see include/drey/admin.h.
 *
 * Snapshot answers from the snapshot thread once the snapshot is durable,
 * so the completion-queue thread never waits on the disk.
 */
#include "drey/admin.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/version.h"

struct drey_admin {
    drey_admin_options opts;
    char *fsync_policy;
    _Atomic(drey_storage *) storage;
    _Atomic(drey_cluster *) cluster;
    _Atomic bool draining;
};

drey_admin *drey_admin_create(const drey_admin_options *opts) {
    drey_admin *a = drey_xcalloc(1, sizeof *a);
    a->opts = *opts;
    a->fsync_policy = drey_xstrdup(opts->fsync_policy != NULL ? opts->fsync_policy : "");
    return a;
}

void drey_admin_destroy(drey_admin *a) {
    if (a == NULL)
        return;
    free(a->fsync_policy);
    free(a);
}

void drey_admin_set_storage(drey_admin *a, drey_storage *st) {
    atomic_store(&a->storage, st);
}

void drey_admin_set_cluster(drey_admin *a, drey_cluster *c) {
    atomic_store(&a->cluster, c);
}

void drey_admin_set_draining(drey_admin *a) {
    atomic_store(&a->draining, true);
}

static void fail(drey_request *r, drey_error e) {
    drey_status st = drey_status_of(e);
    drey_request_fail(r, &st);
}

static void snapshot_done(void *arg, const drey_snapshot_result *r) {
    drey_request *req = arg;
    if (r->rc != 0) {
        fail(req, DREY_ERR_SNAPSHOT_FAILED);
        return;
    }
    Drey__Admin__V1__SnapshotResponse resp = DREY__ADMIN__V1__SNAPSHOT_RESPONSE__INIT;
    Google__Protobuf__Duration d = GOOGLE__PROTOBUF__DURATION__INIT;
    d.seconds = r->duration_ms / 1000;
    d.nanos = (int32_t)(r->duration_ms % 1000) * 1000000;
    resp.lsn = r->info.lsn;
    resp.file = (char *)r->file;
    resp.entries = r->info.entries;
    resp.bytes = r->info.bytes;
    resp.duration = &d;
    resp.segments_removed = r->segments_removed;
    drey_request_reply(req, &resp.base);
}

static void handle_snapshot(void *ctx, drey_request *r, const ProtobufCMessage *msg) {
    (void)msg;
    drey_admin *a = ctx;
    drey_storage *st = atomic_load(&a->storage);
    if (st == NULL) {
        fail(r, a->opts.durable ? DREY_ERR_RECOVERING : DREY_ERR_EPHEMERAL_NODE);
        return;
    }
    drey_storage_request_snapshot(st, snapshot_done, r);
}

/* --- readiness ------------------------------------------------------------ */

#define NEW(a, T, init) ((T *)init_msg(drey_arena_alloc((a), sizeof(T)), (void (*)(void *))(init)))

static void *init_msg(void *p, void (*init)(void *)) {
    init(p);
    return p;
}

static const char *fsync_name(drey_fsync_policy p) {
    return p == DREY_FSYNC_ALWAYS ? "always" : p == DREY_FSYNC_INTERVAL ? "interval" : "never";
}

static char *rfc3339(drey_arena *a, int64_t ms) {
    time_t sec = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&sec, &tm);
    char buf[32];
    strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
    return drey_arena_strndup(a, buf, strlen(buf));
}

/* The nested message types' names, shortened. */
#define RD_(x) Drey__Admin__V1__ReadinessDetails__##x
typedef Drey__Admin__V1__ReadinessDetails RD;

static char *rfc3339_ms(drey_arena *a, int64_t ms) {
    time_t sec = (time_t)(ms / 1000);
    struct tm tm;
    gmtime_r(&sec, &tm);
    char buf[40], full[48];
    strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(full, sizeof full, "%s.%03dZ", buf, (int)(ms % 1000));
    return drey_arena_strndup(a, full, strlen(full));
}

#define TOP_TENANTS 10

static RD_(Tenants__Tenant) *tenant_msg(drey_arena *arena, const drey_tenant_stats *ts) {
    RD_(Tenants__Tenant) *m = NEW(arena, RD_(Tenants__Tenant), drey__admin__v1__readiness_details__tenants__tenant__init);
    m->tenant = drey_arena_strndup(arena, ts->tenant, strlen(ts->tenant));
    m->used_bytes = ts->used_bytes;
    m->limit_bytes = ts->limit_bytes;
    m->cluster_used_bytes = ts->cluster_used_bytes;
    m->granted_bytes = ts->granted_bytes;
    m->refused_writes = ts->refused_writes;
    return m;
}

static RD_(Tenants) *tenant_details(drey_tenants *t, drey_arena *arena) {
    drey_tenant_stats *top = drey_arena_alloc(arena, TOP_TENANTS * sizeof *top);
    drey_tenants_summary sum;
    size_t n = drey_tenants_top(t, top, TOP_TENANTS, &sum);
    RD_(Tenants) *m = NEW(arena, RD_(Tenants), drey__admin__v1__readiness_details__tenants__init);
    m->tenants = (uint32_t)sum.tenants;
    m->refused_writes = sum.refused_writes;
    m->n_top = n;
    m->top = drey_arena_alloc(arena, (n ? n : 1) * sizeof *m->top);
    for (size_t i = 0; i < n; i++)
        m->top[i] = tenant_msg(arena, &top[i]);
    m->other = tenant_msg(arena, &sum.other);
    m->other_tenants = (uint32_t)sum.other_tenants;
    return m;
}

static RD_(Authz) *authz_details(drey_authz *z, drey_arena *arena) {
    drey_authz_stats *s = drey_arena_alloc(arena, sizeof *s);
    drey_authz_get_stats(z, s);
    RD_(Authz) *az = NEW(arena, RD_(Authz), drey__admin__v1__readiness_details__authz__init);
    az->path = drey_arena_strndup(arena, s->path, strlen(s->path));
    az->generation = s->generation;
    az->loaded_at = rfc3339(arena, s->loaded_ms);
    az->roles = (uint32_t)s->policy.roles;
    az->rules = (uint32_t)s->policy.rules;
    az->bindings = (uint32_t)s->policy.bindings;
    az->reloads = s->reloads;
    az->reload_failures = s->reload_failures;
    az->last_error = drey_arena_strndup(arena, s->last_error, strlen(s->last_error));
    az->n_denied_by_verb = DREY_AUTHZ_VERBS;
    az->denied_by_verb = drey_arena_alloc(arena, DREY_AUTHZ_VERBS * sizeof *az->denied_by_verb);
    for (size_t v = 0; v < DREY_AUTHZ_VERBS; v++) {
        RD_(Authz__DeniedByVerbEntry) *e = NEW(arena, RD_(Authz__DeniedByVerbEntry),
                                               drey__admin__v1__readiness_details__authz__denied_by_verb_entry__init);
        e->key = (char *)drey_authz_verb_name((drey_authz_verb)v);
        e->value = s->denied[v];
        az->denied_by_verb[v] = e;
    }
    az->n_last_denials = s->n_denials;
    az->last_denials = drey_arena_alloc(arena, (s->n_denials ? s->n_denials : 1) * sizeof *az->last_denials);
    for (size_t i = 0; i < s->n_denials; i++) {
        const drey_authz_denial *dn = &s->denials[i];
        RD_(Authz__Denial) *x = NEW(arena, RD_(Authz__Denial), drey__admin__v1__readiness_details__authz__denial__init);
        x->principal = drey_arena_strndup(arena, dn->principal, strlen(dn->principal));
        x->verb = (char *)drey_authz_verb_name(dn->verb);
        x->cache = drey_arena_strndup(arena, dn->cache, strlen(dn->cache));
        x->method = drey_arena_strndup(arena, dn->method, strlen(dn->method));
        x->last_at = rfc3339_ms(arena, dn->last_ms);
        x->count = dn->count;
        az->last_denials[i] = x;
    }
    return az;
}

Drey__Admin__V1__ReadinessDetails *drey_admin_readiness(drey_admin *a, drey_arena *arena) {
    RD *d = NEW(arena, RD, drey__admin__v1__readiness_details__init);
    drey_storage *st = atomic_load(&a->storage);

    RD_(JournalDisk) *jd = d->journal_disk =
        NEW(arena, RD_(JournalDisk), drey__admin__v1__readiness_details__journal_disk__init);
    RD_(Journal) *j = d->journal = NEW(arena, RD_(Journal), drey__admin__v1__readiness_details__journal__init);
    RD_(Snapshot) *sn = d->snapshot = NEW(arena, RD_(Snapshot), drey__admin__v1__readiness_details__snapshot__init);
    RD_(Compaction) *co = d->compaction =
        NEW(arena, RD_(Compaction), drey__admin__v1__readiness_details__compaction__init);
    RD_(Recovery) *re = d->recovery = NEW(arena, RD_(Recovery), drey__admin__v1__readiness_details__recovery__init);
    RD_(DataDisk) *dd = d->data_disk = NEW(arena, RD_(DataDisk), drey__admin__v1__readiness_details__data_disk__init);
    dd->journal_cap = "";
    dd->snapshot_room = "";
    jd->state = "normal";
    j->fsync_policy = a->fsync_policy;
    co->state = "idle";
    co->last_run = "";
    re->state = !a->opts.durable ? "ephemeral" : st == NULL ? "recovering" : "done";
    d->ready = !a->opts.durable || st != NULL;
    if (st != NULL) {
        drey_journal_stats js;
        drey_journal_get_stats(drey_storage_journal(st), &js);
        drey_storage_stats ss;
        drey_storage_get_stats(st, &ss);
        jd->used_bytes = js.disk_bytes;
        jd->max_bytes = js.quota_max_bytes;
        jd->high_water_bytes = js.quota_high_water_bytes;
        jd->state = (char *)drey_level_name(js.quota_state);
        jd->write_rejection_active = js.quota_state == DREY_LEVEL_CRITICAL;
        j->fsync_policy = (char *)fsync_name(js.fsync);
        j->last_lsn = js.last_lsn;
        j->segments = (uint32_t)js.segments;
        j->last_fsync_micros = js.last_fsync_us;
        j->failed = js.failed;
        j->queued_records = js.queued_records;
        j->queued_bytes = js.queued_bytes;
        j->queued_records_peak = js.queued_records_peak;
        j->queue_rejections = js.queue_rejections;
        d->ready = !js.failed;
        sn->last_lsn = ss.snapshot_lsn;
        sn->age_seconds = ss.snapshot_time_ms > 0 ? (drey_wall_ms() - ss.snapshot_time_ms) / 1000 : 0;
        sn->in_flight = ss.snapshot_in_flight;
        co->state = ss.compaction_failed ? "failed" : "idle";
        co->last_run = ss.last_compaction_ms > 0 ? rfc3339(arena, ss.last_compaction_ms) : "";
        re->replayed_records = ss.replayed_records;
        dd->journal_cap = ss.journal_cap_derived ? "derived" : js.quota_max_bytes > 0 ? "configured" : "none";
        dd->fs_bytes = ss.fs_bytes;
        dd->available_bytes = ss.fs_avail_bytes;
        dd->reserve_bytes = ss.reserve_bytes;
        dd->snapshot_estimate_bytes = ss.snapshot_estimate_bytes;
        dd->snapshot_files_bytes = ss.snapshot_files_bytes;
        dd->snapshot_room = (char *)drey_storage_snapshot_room_name(ss.snapshot_room);
    }
    if (atomic_load(&a->draining))
        d->ready = false;
    RD_(Eviction) *ev = d->eviction = NEW(arena, RD_(Eviction), drey__admin__v1__readiness_details__eviction__init);
    {
        drey_store_stats ss;
        drey_store_get_stats(a->opts.store, &ss);
        ev->policy = (char *)drey_evict_policy_name(drey_store_policy(a->opts.store));
        ev->evicted_entries = ss.evictions;
        ev->evicted_bytes = ss.evicted_bytes;
        if (a->opts.memory != NULL) {
            drey_memory_stats ms;
            drey_memory_get_stats(a->opts.memory, &ms);
            ev->refused_writes = ms.rejections;
        }
    }
    drey_cluster *cl = atomic_load(&a->cluster);
    if (cl != NULL) {
        drey_cluster_status cs;
        drey_cluster_get_status(cl, &cs);
        RD_(Cluster) *c = NEW(arena, RD_(Cluster), drey__admin__v1__readiness_details__cluster__init);
        c->node_id = drey_arena_strndup(arena, cs.node_id, strlen(cs.node_id));
        c->controller = drey_arena_strndup(arena, cs.controller, strlen(cs.controller));
        c->is_controller = cs.is_controller;
        c->etcd_reachable = cs.etcd_reachable;
        c->partitions = cs.partitions;
        c->owned_partitions = cs.owned;
        c->unassigned_partitions = cs.unassigned;
        c->members = cs.members;
        c->table_revision = cs.revision;
        c->forwarded_calls = cs.forwarded;
        c->not_primary_answers = cs.not_primary;
        c->not_primary_retries = cs.retried;
        c->unavailable_answers = cs.unavailable;
        c->draining = cs.draining;
        c->moving_in = cs.moving_in;
        c->moving_out = cs.moving_out;
        c->moving_now = cs.moving_now;
        c->moves_done = cs.moves_done;
        c->moves_failed = cs.moves_failed;
        c->moved_entries = cs.moved_entries;
        c->moved_bytes = cs.moved_bytes;
        c->pause_last_us = cs.pause_last_us;
        c->pause_max_us = cs.pause_max_us;
        c->replication_factor = cs.rf;
        c->backup_partitions = cs.backup_of;
        c->under_replicated_partitions = cs.under_replicated;
        c->lease_valid = cs.lease_valid;
        c->replication_pending = cs.replication_pending;
        c->replicated_records = cs.replicated;
        c->replica_failures = cs.replica_failures;
        c->in_sync_shrinks = cs.isr_shrinks;
        c->backups_added = cs.backups_added;
        c->records_taken = cs.records_taken;
        c->records_refused = cs.records_refused;
        c->failovers = cs.failovers;
        c->handovers_done = cs.handovers_done;
        c->copies_refused = cs.copies_refused;
        c->roleless_dropped = cs.roleless_dropped;
        c->moves_waiting = cs.moves_waiting;
        /* Those it held a moment ago, and a few the table may have given it since. */
        size_t cap = (size_t)cs.owned + cs.backup_of + 16;
        drey_cluster_replica *reps = drey_arena_alloc(arena, cap * sizeof *reps);
        c->n_replicas = drey_cluster_get_replicas(cl, reps, cap);
        c->replicas = drey_arena_alloc(arena, (c->n_replicas ? c->n_replicas : 1) * sizeof *c->replicas);
        for (size_t i = 0; i < c->n_replicas; i++) {
            RD_(Cluster__PartitionReplica) *pr = NEW(arena, RD_(Cluster__PartitionReplica),
                                                     drey__admin__v1__readiness_details__cluster__partition_replica__init);
            pr->partition = reps[i].partition;
            pr->role = reps[i].primary ? (char *)"primary" : (char *)"backup";
            pr->epoch = reps[i].epoch;
            pr->sequence = reps[i].sequence;
            pr->n_in_sync = reps[i].n_in_sync;
            pr->in_sync = drey_arena_alloc(arena, (pr->n_in_sync ? pr->n_in_sync : 1) * sizeof *pr->in_sync);
            for (size_t k = 0; k < pr->n_in_sync; k++)
                pr->in_sync[k] = drey_arena_strndup(arena, reps[i].in_sync[k], strlen(reps[i].in_sync[k]));
            pr->pending = reps[i].pending;
            pr->lag_ms = reps[i].lag_ms;
            c->replicas[i] = pr;
        }
        d->cluster = c;
    }

    RD_(Memory) *m = NEW(arena, RD_(Memory), drey__admin__v1__readiness_details__memory__init);
    drey_memory_stats ms;
    drey_memory_get_stats(a->opts.memory, &ms);
    m->state = (char *)drey_level_name(ms.state);
    m->limit_bytes = ms.limit_bytes;
    m->used_bytes = ms.used_bytes;
    m->high_bytes = ms.high_bytes;
    m->critical_bytes = ms.critical_bytes;
    m->jemalloc_allocated_bytes = ms.jemalloc_allocated_bytes;
    m->write_rejection_active = ms.state == DREY_LEVEL_CRITICAL;
    d->memory = m;

    RD_(Backpressure) *b = NEW(arena, RD_(Backpressure), drey__admin__v1__readiness_details__backpressure__init);
    if (a->opts.backpressure != NULL) {
        drey_bp_stats bs;
        drey_bp_get_stats(a->opts.backpressure, &bs);
        b->in_flight = bs.inflight;
        b->queued = bs.queued;
        b->tracked_principals = bs.principals;
        b->n_rejections_by_reason = DREY_BP_REASONS;
        b->rejections_by_reason = drey_arena_alloc(arena, DREY_BP_REASONS * sizeof *b->rejections_by_reason);
        for (size_t i = 0; i < DREY_BP_REASONS; i++) {
            RD_(Backpressure__RejectionsByReasonEntry) *e =
                NEW(arena, RD_(Backpressure__RejectionsByReasonEntry),
                    drey__admin__v1__readiness_details__backpressure__rejections_by_reason_entry__init);
            e->key = (char *)drey_bp_reject_reason_name(i);
            e->value = bs.rejected[i];
            b->rejections_by_reason[i] = e;
        }
    }
    d->backpressure = b;

    RD_(Build) *bi = NEW(arena, RD_(Build), drey__admin__v1__readiness_details__build__init);
    bi->version = (char *)drey_version();
    bi->revision = (char *)drey_version_revision();
    bi->type = (char *)drey_version_build();
    d->build = bi;
    if (a->opts.authz != NULL)
        d->authz = authz_details(a->opts.authz, arena);
    char claim[300];
    if (a->opts.tenants != NULL && a->opts.authz != NULL &&
        drey_authz_tenant_claim(a->opts.authz, claim, sizeof claim)) {
        d->tenants = tenant_details(a->opts.tenants, arena);
        d->tenants->claim = drey_arena_strndup(arena, claim, strlen(claim));
    }
    return d;
}

/* --- metrics --------------------------------------------------------------- */

static void gauge(FILE *out, const char *name, const char *help, double v) {
    drey_metrics_header(out, name, "gauge", help);
    drey_metrics_sample(out, name, NULL, v);
}

static void counter(FILE *out, const char *name, const char *help, double v) {
    drey_metrics_header(out, name, "counter", help);
    drey_metrics_sample(out, name, NULL, v);
}

/* One series of one sample: a counter when its name ends in _total (as
 * Prometheus names them), else a gauge. */
typedef struct series {
    const char *name, *help;
    double value;
} series;

static void emit(FILE *out, const series *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(s[i].name);
        if (len > 6 && strcmp(s[i].name + len - 6, "_total") == 0)
            counter(out, s[i].name, s[i].help, s[i].value);
        else
            gauge(out, s[i].name, s[i].help, s[i].value);
    }
}

static void state_gauge(FILE *out, const char *name, const char *help, const char *current,
                        const char *const *states, size_t n) {
    drey_metrics_header(out, name, "gauge", help);
    char labels[64];
    for (size_t i = 0; i < n; i++) {
        drey_metrics_labels(labels, sizeof labels, "state", states[i], NULL);
        drey_metrics_sample(out, name, labels, strcmp(states[i], current) == 0 ? 1 : 0);
    }
}

typedef struct eviction_lines {
    FILE *out;
    const char *policy;
    bool bytes; /* the bytes family, else the entries one */
    size_t n;
} eviction_lines;

/* Caches are user-named: only those that had evictions, and at most this
 * many, so the exposition stays bounded. */
#define EVICTION_CACHES_MAX 256

static void eviction_line(void *arg, const drey_cache_stats *c) {
    eviction_lines *l = arg;
    if (c->evictions == 0 || (c->cache_len > 0 && c->cache[0] == '#') || l->n >= EVICTION_CACHES_MAX)
        return;
    l->n++;
    char labels[320];
    snprintf(labels, sizeof labels, "policy=\"%s\",cache=\"%.*s\"", l->policy,
             c->cache_len == 0 ? 7 : (int)c->cache_len, c->cache_len == 0 ? "default" : c->cache);
    if (l->bytes)
        drey_metrics_sample(l->out, "drey_evicted_bytes_total", labels, (double)c->evicted_bytes);
    else
        drey_metrics_sample(l->out, "drey_evictions_total", labels, (double)c->evictions);
}

static void evictions_by_cache(FILE *out, drey_store *store) {
    eviction_lines l = {.out = out, .policy = drey_evict_policy_name(drey_store_policy(store))};
    drey_metrics_header(out, "drey_evictions_total", "counter",
                        "Entries evicted under memory pressure, by policy and cache (since start; a cleared "
                        "cache starts over).");
    drey_store_list_caches(store, eviction_line, &l);
    l.bytes = true;
    l.n = 0;
    drey_metrics_header(out, "drey_evicted_bytes_total", "counter", "Accounted bytes evicted, by policy and cache.");
    drey_store_list_caches(store, eviction_line, &l);
}

void drey_admin_collect_metrics(void *ctx, FILE *out) {
    drey_admin *a = ctx;
    char scratch[4096];
    drey_arena arena;
    drey_arena_init(&arena, scratch, sizeof scratch);
    RD *d = drey_admin_readiness(a, &arena);

    gauge(out, "drey_ready", "1 when the node can serve (recovered, journal not failed).", d->ready);
    gauge(out, "drey_journal_disk_used_bytes", "Journal segment bytes on disk, preallocation included.",
          (double)d->journal_disk->used_bytes);
    gauge(out, "drey_journal_disk_max_bytes", "The journal disk quota (0: none).", (double)d->journal_disk->max_bytes);
    state_gauge(out, "drey_journal_disk_state", "Journal disk quota state (1 for the current one).",
                d->journal_disk->state, drey_level_names, DREY_LEVEL_COUNT);
    gauge(out, "drey_journal_last_lsn", "LSN of the last journal record.", (double)d->journal->last_lsn);
    gauge(out, "drey_journal_segments", "Journal segment files.", d->journal->segments);
    gauge(out, "drey_journal_queued_records", "Writes waiting for the journal's writer.",
          (double)d->journal->queued_records);
    gauge(out, "drey_journal_queued_bytes", "Payload bytes of the writes waiting for the journal's writer.",
          (double)d->journal->queued_bytes);
    gauge(out, "drey_journal_failed", "1 once a journal write or sync failed (until a restart).", d->journal->failed);
    gauge(out, "drey_memory_used_bytes", "Bytes of entries, as accounted.", (double)d->memory->used_bytes);
    gauge(out, "drey_memory_limit_bytes", "The memory limit for entries.", (double)d->memory->limit_bytes);
    gauge(out, "drey_memory_jemalloc_allocated_bytes", "jemalloc's stats.allocated (-1 without jemalloc).",
          (double)d->memory->jemalloc_allocated_bytes);
    state_gauge(out, "drey_memory_state", "Memory state (1 for the current one).", d->memory->state,
                drey_level_names, DREY_LEVEL_COUNT);
    gauge(out, "drey_inflight_calls", "Calls admitted and running.", d->backpressure->in_flight);
    gauge(out, "drey_queued_calls", "Calls waiting for a slot.", d->backpressure->queued);
    gauge(out, "drey_tracked_principals", "Principals in the backpressure table.",
          d->backpressure->tracked_principals);
    gauge(out, "drey_snapshot_last_lsn", "LSN of the newest snapshot.", (double)d->snapshot->last_lsn);
    gauge(out, "drey_snapshot_age_seconds", "Age of the newest snapshot.", (double)d->snapshot->age_seconds);
    gauge(out, "drey_recovery_replayed_records", "Journal records replayed at start.",
          (double)d->recovery->replayed_records);
    if (d->cluster != NULL) {
        const RD_(Cluster) *c = d->cluster;
        const series cluster[] = {
            {"drey_cluster_partitions_owned", "Partitions this node is primary of.", c->owned_partitions},
            {"drey_cluster_partitions_unassigned", "Partitions no node owns.", c->unassigned_partitions},
            {"drey_cluster_members", "Nodes registered in etcd, this one included.", c->members},
            {"drey_cluster_is_controller", "1 when this node is the cluster's controller.", c->is_controller},
            {"drey_cluster_etcd_reachable",
             "1 while the membership lease and the table's watch are current.", c->etcd_reachable},
            {"drey_cluster_forwarded_calls_total",
             "Calls forwarded to the owner of their partition.", c->forwarded_calls},
            {"drey_cluster_not_primary_total",
             "Forwarded calls refused here: not this node's partition.", c->not_primary_answers},
            {"drey_cluster_not_primary_retries_total",
             "Calls routed again after an owner's NOT_PRIMARY.", c->not_primary_retries},
            {"drey_cluster_unavailable_total", "Calls refused PARTITION_UNAVAILABLE.", c->unavailable_answers},
            {"drey_cluster_draining", "1 while this node moves its partitions away to leave.", c->draining},
            {"drey_cluster_partitions_moving_in", "Partitions planned to move to this node.", c->moving_in},
            {"drey_cluster_partitions_moving_out", "Partitions planned to move off this node.", c->moving_out},
            {"drey_cluster_moves_total", "Partitions this node handed over to another.", c->moves_done},
            {"drey_cluster_moves_failed_total",
             "Moves out of this node that failed before the handover.", c->moves_failed},
            {"drey_cluster_moved_entries_total", "Entries sent by moves out of this node.", c->moved_entries},
            {"drey_cluster_moved_bytes_total", "Bytes sent by moves out of this node.", c->moved_bytes},
            {"drey_cluster_move_pause_max_seconds",
             "The longest pause of a partition's writes for a handover since start.", c->pause_max_us / 1e6},
            {"drey_cluster_move_pause_last_seconds",
             "The last handover's pause of its partition's writes.", c->pause_last_us / 1e6},
            {"drey_cluster_partitions_backup", "Partitions this node is an in-sync backup of.", c->backup_partitions},
            {"drey_cluster_partitions_under_replicated",
             "Partitions with fewer in-sync copies than the replication factor.", c->under_replicated_partitions},
            {"drey_cluster_lease_valid",
             "1 while this node's lease is valid by its own clock (it leads only then).", c->lease_valid},
            {"drey_cluster_replication_pending",
             "Writes waiting here for their backups' acknowledgements.", c->replication_pending},
            {"drey_cluster_replicated_records_total", "Records a backup acknowledged.", c->replicated_records},
            {"drey_cluster_replica_failures_total",
             "Records a backup refused or did not acknowledge in time.", c->replica_failures},
            {"drey_cluster_in_sync_shrinks_total", "Backups this node took out of an in-sync set.", c->in_sync_shrinks},
            {"drey_cluster_backups_added_total", "Copies to new backups this node completed.", c->backups_added},
            {"drey_cluster_records_taken_total", "Records this node took as a backup.", c->records_taken},
            {"drey_cluster_records_refused_total", "Records this node refused as a backup.", c->records_refused},
            {"drey_cluster_failovers_total", "Partitions this node, as controller, gave a new primary.", c->failovers},
            {"drey_cluster_handovers_total", "Primary roles this node handed to an in-sync backup.", c->handovers_done},
            {"drey_cluster_copies_refused_total",
             "Imports, handover checks and drops this node refused (a copy not planned, or an in-sync one).",
             c->copies_refused},
            {"drey_cluster_roleless_dropped_total",
             "Copies of partitions the table gives this node no role in that it dropped.", c->roleless_dropped},
        };
        emit(out, cluster, sizeof cluster / sizeof cluster[0]);
        /* UINT32_MAX: the controller's last look repaired instead (unknown, not 0). */
        if (c->moves_waiting != UINT32_MAX)
            gauge(out, "drey_cluster_moves_waiting",
                  "The controller: moves held back while their partitions settle after a change of primary.",
                  (double)c->moves_waiting);
        /* The worst partition per role: per-partition series are in the
         * readiness details. */
        uint64_t lag[2] = {0, 0}; /* primary, backup */
        for (size_t i = 0; i < c->n_replicas; i++) {
            size_t k = strcmp(c->replicas[i]->role, "primary") == 0 ? 0 : 1;
            if (c->replicas[i]->lag_ms != UINT64_MAX && c->replicas[i]->lag_ms > lag[k])
                lag[k] = c->replicas[i]->lag_ms;
        }
        drey_metrics_header(out, "drey_cluster_replication_lag_seconds", "gauge",
                            "Primary: the longest a write here has waited for its backups; backup: the longest "
                            "since a copy here last had every write its primary acknowledged.");
        drey_metrics_sample(out, "drey_cluster_replication_lag_seconds", "role=\"primary\"", (double)lag[0] / 1e3);
        drey_metrics_sample(out, "drey_cluster_replication_lag_seconds", "role=\"backup\"", (double)lag[1] / 1e3);
    }
    gauge(out, "drey_data_disk_available_bytes",
          "Bytes the data directory's file system still has (0 when unknown or ephemeral).",
          (double)d->data_disk->available_bytes);
    gauge(out, "drey_snapshot_estimate_bytes", "The next snapshot's estimated size.",
          (double)d->data_disk->snapshot_estimate_bytes);
    static const char *const rooms[] = {"ok", "low", "short", "unknown"};
    state_gauge(out, "drey_snapshot_room",
                "Whether the next snapshot fits on the data directory's file system (1 for the current state).",
                d->data_disk->snapshot_room, rooms, 4);

    drey_storage *st = atomic_load(&a->storage);
    if (st != NULL) {
        drey_storage_stats sst;
        drey_storage_get_stats(st, &sst);
        drey_metrics_header(out, "drey_snapshots_total", "counter", "Snapshots written, by result.");
        drey_metrics_sample(out, "drey_snapshots_total", "result=\"ok\"", (double)sst.snapshots_taken);
        drey_metrics_sample(out, "drey_snapshots_total", "result=\"failed\"", (double)sst.snapshots_failed);
        gauge(out, "drey_snapshot_last_duration_seconds", "Duration of the last snapshot, compaction included.",
              (double)sst.last_snapshot_duration_ms / 1e3);
        drey_metrics_header(out, "drey_compaction_segments_removed_total", "counter",
                            "Journal segments deleted because a snapshot covers them.");
        drey_metrics_sample(out, "drey_compaction_segments_removed_total", NULL, (double)sst.segments_removed);
        gauge(out, "drey_compaction_failed", "1 when the last compaction could not delete segments.",
              sst.compaction_failed);
    }

    drey_store_stats ss;
    drey_store_get_stats(a->opts.store, &ss);
    gauge(out, "drey_store_entries", "Entries in the store, expired ones not yet swept included.",
          (double)ss.entries);
    drey_metrics_header(out, "drey_store_expired_swept_total", "counter",
                        "Expired entries freed by the active expiry cycle.");
    drey_metrics_sample(out, "drey_store_expired_swept_total", NULL, (double)ss.expired_swept);
    gauge(out, "drey_store_clearing_entries", "Entries of cleared caches not yet freed by the sweep.",
          (double)ss.clearing);

    drey_metrics_header(out, "drey_eviction_policy", "gauge", "The --eviction policy in force (1 for it).");
    for (int p = DREY_EVICT_NONE; p <= DREY_EVICT_VOLATILE_TTL; p++) {
        char labels[64];
        const char *name = drey_evict_policy_name((drey_evict_policy)p);
        snprintf(labels, sizeof labels, "policy=\"%s\"", name);
        drey_metrics_sample(out, "drey_eviction_policy", labels, strcmp(name, d->eviction->policy) == 0);
    }
    evictions_by_cache(out, a->opts.store);

    if (a->opts.backpressure != NULL) {
        size_t cap = a->opts.metrics_principals;
        drey_bp_principal_stats *top = drey_xcalloc(cap > 0 ? cap : 1, sizeof *top), rest;
        size_t n = drey_bp_busiest_principals(a->opts.backpressure, top, cap, &rest);
        static const char *const help[2] = {
            "Calls admitted, for the busiest principals (--metrics-principals) and principal=\"other\" for the rest.",
            "Calls refused by backpressure, for the same principals and principal=\"other\".",
        };
        static const char *const names[2] = {"drey_principal_admitted_total", "drey_principal_rejected_total"};
        char labels[256];
        for (int f = 0; f < 2; f++) {
            drey_metrics_header(out, names[f], "counter", help[f]);
            for (size_t i = 0; i <= n; i++) {
                const drey_bp_principal_stats *p = i < n ? &top[i] : &rest;
                drey_metrics_labels(labels, sizeof labels, "principal", p->name, NULL);
                drey_metrics_sample(out, names[f], labels, (double)(f == 0 ? p->admitted : p->rejected));
            }
        }
        free(top);
    }
    drey_arena_destroy(&arena);
}

static ProtobufCMessage *readiness(void *ctx, drey_apply *ax, const ProtobufCMessage *msg) {
    (void)msg;
    return &drey_admin_readiness(ctx, ax->arena)->base;
}

static const drey_method_spec methods[] = {
    {.name = "Snapshot", .flags = DREY_METHOD_ADMIN, .handle = handle_snapshot},
    {.name = "GetReadinessDetails", .flags = DREY_METHOD_ADMIN, .apply = readiness},
};

bool drey_admin_register(drey_admin *a, drey_method_table *t) {
    return drey_method_table_add_service(t, &drey__admin__v1__admin__descriptor, methods,
                                         sizeof methods / sizeof methods[0], a);
}
