/*
 * Unit tests for the request chain (src/pipeline/pipeline.c and its stages)
 * through an in-memory door: no gRPC server, the real store, cache methods,
 * commit, backpressure, memory admission and a journal on the faulting
 * in-memory file system.
 *
 * Each test pins one promise of include/drey/pipeline.h: a refusal at any
 * stage leaves no trace (no journal record, memory and its accounting
 * unchanged, no remembered outcome, no version consumed); the stages run in
 * the declared order; a parked request resumes; a cancelled waiter leaves
 * the queue while a cancelled running request keeps its slot; the journal's
 * queue is bounded; a request not permitted by the policy, or past its
 * tenant's memory quota, leaves no trace either.
 *
 * A second service (drey.admin.v1.Admin, with a test's own handlers) lets a
 * test hold a request at the end of the chain for as long as it likes: its
 * Snapshot handler only records the request, and the test answers it.
 */
#include <criterion/criterion.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "drey/admin/v1/admin.pb-c.h"
#include "drey/auth.h"
#include "drey/authz.h"
#include "drey/cache.h"
#include "drey/cache/v1/cache.pb-c.h"
#include "drey/clock.h"
#include "drey/commit.h"
#include "drey/io.h"
#include "drey/journal.h"
#include "drey/memory.h"
#include "drey/method.h"
#include "drey/internal/v1/move.pb-c.h"
#include "drey/journal/v1/journal.pb-c.h"
#include "drey/partition.h"
#include "drey/pipeline.h"
#include "drey/store.h"
#include "drey/tenant.h"
#include "drey/timer.h"

#define WAIT_MS 10000

/* --- the in-memory door ---------------------------------------------------- */

typedef struct door {
    drey_arena arena;
    drey_request r;
    const char *authorization; /* metadata, or NULL */
    const char *forwarded_by;  /* metadata, or NULL */
    const char *peer_id;       /* the identity the peer proved (internal door) */
    void (*cancel_fn)(void *arg);
    void *cancel_arg;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool answered;
    drey_status st; /* the failure; DREY_ERR_NONE for a reply */
    uint8_t resp[4096];
    size_t resp_len;
} door;

static void door_reply(void *d_, const ProtobufCMessage *response) {
    door *d = d_;
    pthread_mutex_lock(&d->mu);
    cr_assert(!d->answered, "answered twice");
    d->resp_len = protobuf_c_message_get_packed_size(response);
    cr_assert_leq(d->resp_len, sizeof d->resp);
    protobuf_c_message_pack(response, d->resp);
    drey_status_init(&d->st);
    d->answered = true;
    pthread_cond_broadcast(&d->cond);
    pthread_mutex_unlock(&d->mu);
}

static void door_fail(void *d_, const drey_status *st) {
    door *d = d_;
    pthread_mutex_lock(&d->mu);
    cr_assert(!d->answered, "answered twice");
    d->st = *st;
    d->answered = true;
    pthread_cond_broadcast(&d->cond);
    pthread_mutex_unlock(&d->mu);
}

static const char *door_metadata(void *d_, const char *key, size_t *len) {
    door *d = d_;
    const char *v = strcmp(key, "authorization") == 0 ? d->authorization
                    : strcmp(key, DREY_FORWARDED_BY) == 0 ? d->forwarded_by
                                                          : NULL;
    if (v != NULL)
        *len = strlen(v);
    return v;
}

static bool door_peer_is(void *d_, const char *id, size_t len) {
    door *d = d_;
    return d->peer_id != NULL && strlen(d->peer_id) == len && memcmp(d->peer_id, id, len) == 0;
}

static const char *door_peer(void *d_) {
    (void)d_;
    return "conn:1";
}

static int64_t door_deadline(void *d_) {
    (void)d_;
    return INT64_MAX;
}

static void door_on_cancel(void *d_, void (*fn)(void *), void *arg) {
    door *d = d_;
    pthread_mutex_lock(&d->mu);
    d->cancel_fn = fn;
    d->cancel_arg = arg;
    pthread_mutex_unlock(&d->mu);
}

static const drey_request_ops door_ops = {
    .reply = door_reply,
    .fail = door_fail,
    .metadata = door_metadata,
    .peer = door_peer,
    .deadline_mono_ns = door_deadline,
    .on_cancel = door_on_cancel,
};

/* The cluster's internal listener: its callers prove who they are. */
static const drey_request_ops internal_ops = {
    .reply = door_reply,
    .fail = door_fail,
    .metadata = door_metadata,
    .peer = door_peer,
    .deadline_mono_ns = door_deadline,
    .on_cancel = door_on_cancel,
    .peer_is = door_peer_is,
};

/* The caller goes away: the door runs the chain's cancel hook once, as the
 * gRPC door does, unless the request was answered. */
static void door_cancel(door *d) {
    pthread_mutex_lock(&d->mu);
    void (*fn)(void *) = d->answered ? NULL : d->cancel_fn;
    d->cancel_fn = NULL;
    pthread_mutex_unlock(&d->mu);
    if (fn != NULL)
        fn(d->cancel_arg);
}

static bool door_wait(door *d, int64_t ms) {
    int64_t until = drey_mono_ms() + ms;
    pthread_mutex_lock(&d->mu);
    while (!d->answered && drey_mono_ms() < until) {
        pthread_mutex_unlock(&d->mu);
        struct timespec ts = {.tv_nsec = 1000000};
        nanosleep(&ts, NULL); /* polls with a deadline */
        pthread_mutex_lock(&d->mu);
    }
    bool a = d->answered;
    pthread_mutex_unlock(&d->mu);
    return a;
}

static bool door_answered(door *d) {
    pthread_mutex_lock(&d->mu);
    bool a = d->answered;
    pthread_mutex_unlock(&d->mu);
    return a;
}

static void door_free(door *d) {
    drey_arena_destroy(&d->arena);
    pthread_mutex_destroy(&d->mu);
    pthread_cond_destroy(&d->cond);
    free(d);
}

/* --- the fixture ----------------------------------------------------------- */

typedef struct fixture_opts {
    bool durable;
    bool auth_required;
    uint32_t max_inflight, max_queued, principal_max_inflight, principal_max_queued;
    int64_t memory_limit;
    uint32_t max_caches;
    uint64_t journal_max_bytes, max_queued_records;
    size_t max_key_bytes;
    /* A policy (--authz-policy): tokens are then HS256 with mint(). */
    const char *policy;
} fixture_opts;

typedef struct fixture {
    drey_store *store;
    drey_partition *partitions;
    drey_cache *cache;
    drey_method_table *methods;
    drey_commit *commit;
    drey_timers *timers;
    drey_bp *bp;
    drey_memory *memory;
    drey_io_fault *fs;
    drey_journal *journal;
    drey_pipeline *p;
    char dir[64]; /* the keys and the policy, when there is one */
    drey_auth *auth;
    drey_authz *authz;
    drey_tenants *tenants;
    /* The parked Admin/Snapshot request, for the test to answer. */
    pthread_mutex_t mu;
    drey_request *held;
    /* The journal writer, blocked between batches until released. */
    pthread_cond_t cond;
    bool writer_blocked, writer_release;
} fixture;

static fixture f;

static void hold(void *ctx, drey_request *r, const ProtobufCMessage *msg) {
    (void)ctx;
    (void)msg;
    pthread_mutex_lock(&f.mu);
    f.held = r;
    pthread_mutex_unlock(&f.mu);
}

static ProtobufCMessage *empty_details(void *ctx, drey_apply *ax, const ProtobufCMessage *msg) {
    (void)ctx;
    (void)msg;
    Drey__Admin__V1__ReadinessDetails *d = drey_arena_alloc(ax->arena, sizeof *d);
    drey__admin__v1__readiness_details__init(d);
    return &d->base;
}

static const drey_method_spec admin_specs[] = {
    {.name = "Snapshot", .flags = DREY_METHOD_ADMIN, .handle = hold},
    {.name = "GetReadinessDetails", .flags = DREY_METHOD_ADMIN, .apply = empty_details},
};

/* --- tokens and a policy (the authz and tenant stages) ---------------------- */

static const unsigned char secret[32] = "0123456789abcdef0123456789abcdef";

static void write_file(const char *path, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    cr_assert_not_null(fp, "%s", path);
    cr_assert_eq(fwrite(data, 1, n, fp), n);
    fclose(fp);
}

/* base64url without padding, into out (NUL-terminated). */
static void b64url(const unsigned char *in, size_t n, char *out) {
    int len = EVP_EncodeBlock((unsigned char *)out, in, (int)n);
    int j = 0;
    for (int i = 0; i < len; i++) {
        char c = out[i];
        if (c == '=')
            break;
        out[j++] = c == '+' ? '-' : c == '/' ? '_' : c;
    }
    out[j] = '\0';
}

/* "Bearer <an HS256 token>" for sub with extra claims (",..." or ""); the
 * caller frees it. */
static char *mint(const char *sub, const char *extra) {
    char payload[512], hp[1024], h64[128], p64[768], sig64[64];
    snprintf(payload, sizeof payload, "{\"sub\":\"%s\",\"exp\":%lld%s}", sub,
             (long long)time(NULL) + 3600, extra);
    const char *header = "{\"alg\":\"HS256\",\"kid\":\"k1\",\"typ\":\"JWT\"}";
    b64url((const unsigned char *)header, strlen(header), h64);
    b64url((const unsigned char *)payload, strlen(payload), p64);
    snprintf(hp, sizeof hp, "%s.%s", h64, p64);
    unsigned char mac[32];
    unsigned int mac_len = sizeof mac;
    cr_assert_not_null(HMAC(EVP_sha256(), secret, sizeof secret, (const unsigned char *)hp, strlen(hp), mac, &mac_len));
    b64url(mac, mac_len, sig64);
    size_t n = strlen(hp) + strlen(sig64) + 16;
    char *out = malloc(n);
    snprintf(out, n, "Bearer %s.%s", hp, sig64);
    return out;
}

static void *grants_make(void *ctx, const char *claims, size_t len) {
    return drey_authz_grants_for(ctx, claims, len);
}
static void grants_ref(void *g) {
    drey_authz_grants_ref(g);
}
static void grants_unref(void *g) {
    drey_authz_grants_unref(g);
}
static bool grants_current(void *ctx, const void *g) {
    return drey_authz_current(ctx, g);
}
static int64_t tenant_limit(void *ctx, const char *tenant, size_t len) {
    return drey_authz_tenant_limit(ctx, tenant, len);
}

/* Keys, the policy, auth with grants attached and tenants, as dreyd wires them. */
static void authz_open(const char *policy) {
    snprintf(f.dir, sizeof f.dir, "/tmp/chain-authz-XXXXXX");
    cr_assert_not_null(mkdtemp(f.dir));
    char keys[96], path[128];
    snprintf(keys, sizeof keys, "%s/keys", f.dir);
    cr_assert_eq(mkdir(keys, 0700), 0);
    snprintf(path, sizeof path, "%s/k1.HS256.key", keys);
    write_file(path, secret, sizeof secret);
    snprintf(path, sizeof path, "%s/policy.json", f.dir);
    write_file(path, policy, strlen(policy));
    char err[512] = "";
    drey_auth_options ao = {.keys_dir = keys, .clock_skew_ms = 30000, .max_token_bytes = 8192, .cache_entries = 64};
    f.auth = drey_auth_create(&ao, err, sizeof err);
    cr_assert_not_null(f.auth, "%s", err);
    f.authz = drey_authz_create(path, err, sizeof err);
    cr_assert_not_null(f.authz, "%s", err);
    drey_auth_set_attach(f.auth, &(drey_auth_attach){.make = grants_make, .ref = grants_ref, .unref = grants_unref,
                                                     .current = grants_current, .ctx = f.authz});
    f.tenants = drey_tenants_create(f.store);
    drey_tenants_set_limits(f.tenants, tenant_limit, f.authz);
}

static void fixture_open(const fixture_opts *o) {
    memset(&f, 0, sizeof f);
    pthread_mutex_init(&f.mu, NULL);
    pthread_cond_init(&f.cond, NULL);
    f.store = drey_store_create();
    f.cache = drey_cache_create(f.store);
    f.methods = drey_method_table_create();
    cr_assert(drey_cache_register(f.cache, f.methods));
    cr_assert(drey_method_table_add_service(f.methods, &drey__admin__v1__admin__descriptor, admin_specs, 2, NULL));
    f.partitions = drey_partition_create(f.store);
    cr_assert(drey_partition_register(f.methods, f.partitions));
    drey_commit_options co = {.store = f.store, .methods = f.methods, .idempotency_retention_ms = 60000};
    f.commit = drey_commit_create(&co);
    f.timers = drey_timers_create();
    drey_bp_options bo = {
        .max_inflight = o->max_inflight ? o->max_inflight : 64,
        .max_queued = o->max_queued,
        .max_wait_ms = 60000,
        .slowdown_at = 1000000,
        .principal_max_inflight = o->principal_max_inflight ? o->principal_max_inflight : 64,
        .principal_max_queued = o->principal_max_queued,
        .max_principals = 64,
        .node_id = "t",
    };
    f.bp = drey_bp_create(&bo, f.timers);
    drey_memory_options mo = {
        .limit_bytes = o->memory_limit ? o->memory_limit : (int64_t)1 << 30,
        .node_id = "t",
        .max_caches = o->max_caches,
    };
    f.memory = drey_memory_create(&mo, f.store);
    if (o->durable) {
        f.fs = drey_io_fault_create();
        drey_io *io = drey_io_fault_io(f.fs);
        cr_assert_eq(io->ops->mkdir(io, "/d"), 0);
        drey_journal_options jo = {
            .dir = "/d",
            .io = io,
            .segment_bytes = 64 * 1024,
            .fsync = DREY_FSYNC_ALWAYS,
            .batch_max_bytes = 1 << 20,
            .max_bytes = o->journal_max_bytes,
            .max_queued_records = o->max_queued_records,
        };
        char err[256];
        cr_assert_eq(drey_journal_open(&jo, 0, NULL, NULL, &f.journal, err, sizeof err), 0, "%s", err);
    }
    if (o->policy != NULL)
        authz_open(o->policy);
    drey_pipeline_options po = {
        .auth = f.auth,
        .authz = f.authz,
        .tenants = f.tenants,
        .limits = {.max_cache_name_bytes = 64,
                   .max_key_bytes = o->max_key_bytes ? o->max_key_bytes : 256,
                   .max_value_bytes = 1 << 20,
                   .max_batch = 100},
        .methods = f.methods,
        .commit = f.commit,
        .auth_required = o->auth_required,
        .backpressure = f.bp,
        .memory = f.memory,
        .node_id = "t",
    };
    f.p = drey_pipeline_create(&po);
    drey_pipeline_set_journal(f.p, f.journal);
    drey_pipeline_set_ready(f.p, true);
}

static void fixture_close(void) {
    drey_journal_close(f.journal);
    drey_pipeline_destroy(f.p);
    drey_auth_destroy(f.auth); /* its token cache holds grants */
    drey_authz_destroy(f.authz);
    drey_memory_destroy(f.memory);
    drey_bp_destroy(f.bp);
    drey_timers_destroy(f.timers);
    drey_commit_destroy(f.commit);
    drey_method_table_destroy(f.methods);
    drey_cache_destroy(f.cache);
    drey_partition_destroy(f.partitions);
    drey_store_destroy(f.store);
    drey_tenants_destroy(f.tenants);
    drey_io_fault_destroy(f.fs);
    if (f.dir[0] != '\0') {
        char path[128];
        snprintf(path, sizeof path, "%s/keys/k1.HS256.key", f.dir);
        unlink(path);
        snprintf(path, sizeof path, "%s/keys", f.dir);
        rmdir(path);
        snprintf(path, sizeof path, "%s/policy.json", f.dir);
        unlink(path);
        rmdir(f.dir);
    }
    pthread_mutex_destroy(&f.mu);
    pthread_cond_destroy(&f.cond);
}

static void teardown(void) {
    fixture_close();
}

TestSuite(chain, .fini = teardown, .timeout = 60);

typedef struct via {
    const char *authorization;
    bool internal;            /* through the internal listener's door */
    const char *forwarded_by; /* its metadata */
    const char *peer_id;      /* who the peer proved to be */
} via;

/* Submits msg as a call of method (a path) through a new door. */
static door *submit_via(const char *method, const ProtobufCMessage *msg, via v) {
    door *d = calloc(1, sizeof *d);
    cr_assert_not_null(d);
    drey_arena_init(&d->arena, NULL, 0);
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cond, NULL);
    d->authorization = v.authorization;
    d->forwarded_by = v.forwarded_by;
    d->peer_id = v.peer_id;
    const drey_method *m = drey_method_find(f.methods, method);
    cr_assert_not_null(m, "%s", method);
    size_t len = protobuf_c_message_get_packed_size(msg);
    uint8_t *bytes = drey_arena_alloc(&d->arena, len ? len : 1);
    protobuf_c_message_pack(msg, bytes);
    ProtobufCMessage *decoded =
        protobuf_c_message_unpack(m->desc->input, drey_arena_protobuf_allocator(&d->arena), len, bytes);
    cr_assert_not_null(decoded);
    drey_request_init(&d->r, v.internal ? &internal_ops : &door_ops, d, &d->arena, m, decoded, bytes, len);
    drey_pipeline_submit(f.p, &d->r);
    return d;
}

static door *submit(const char *method, const ProtobufCMessage *msg, const char *authorization) {
    return submit_via(method, msg, (via){.authorization = authorization});
}

typedef struct set_args {
    const char *key, *value, *request_id, *authorization;
    const char *cache; /* NULL: "c" */
    size_t value_len; /* 0: strlen(value) */
} set_args;

static door *set(set_args a) {
    Drey__Cache__V1__Value v = DREY__CACHE__V1__VALUE__INIT;
    v.kind_case = DREY__CACHE__V1__VALUE__KIND_BYTES_VALUE;
    v.bytes_value.data = (uint8_t *)a.value;
    v.bytes_value.len = a.value_len ? a.value_len : strlen(a.value);
    Drey__Cache__V1__SetRequest req = DREY__CACHE__V1__SET_REQUEST__INIT;
    req.cache = (char *)(a.cache ? a.cache : "c");
    req.key = (char *)a.key;
    req.value = &v;
    req.request_id = (char *)(a.request_id ? a.request_id : "");
    return submit("/drey.cache.v1.Cache/Set", &req.base, a.authorization);
}

static door *hold_via(via v) {
    Drey__Admin__V1__SnapshotRequest req = DREY__ADMIN__V1__SNAPSHOT_REQUEST__INIT;
    return submit_via("/drey.admin.v1.Admin/Snapshot", &req.base, v);
}

static door *hold_one(void) {
    return hold_via((via){0});
}

static drey_request *take_held(void) {
    pthread_mutex_lock(&f.mu);
    drey_request *r = f.held;
    f.held = NULL;
    pthread_mutex_unlock(&f.mu);
    cr_assert_not_null(r, "the held request reached its handler");
    return r;
}

static void answer_held(drey_request *r) {
    Drey__Admin__V1__SnapshotResponse resp = DREY__ADMIN__V1__SNAPSHOT_RESPONSE__INIT;
    drey_request_reply(r, &resp.base);
}

static void expect_ok(door *d) {
    cr_assert(door_wait(d, WAIT_MS), "answered");
    cr_assert_eq(d->st.error, DREY_ERR_NONE, "refused: %s", drey_error_lookup(d->st.error)->reason);
}

static void expect_refused(door *d, drey_error e) {
    cr_assert(door_wait(d, WAIT_MS), "answered");
    cr_assert_eq(d->st.error, e, "expected %s, got %s", drey_error_lookup(e)->reason,
                 drey_error_lookup(d->st.error)->reason);
}

/* Everything a request could leave behind. Outcomes live in the store, so
 * its entry count and bytes cover them. */
typedef struct trace {
    uint64_t entries, bytes, version, lsn, appends;
    int64_t memory_used;
} trace;

static trace take_trace(void) {
    trace t = {0};
    drey_store_stats ss;
    drey_store_get_stats(f.store, &ss);
    t.entries = ss.entries;
    t.bytes = ss.bytes;
    t.version = drey_store_last_version(f.store);
    drey_memory_stats ms;
    drey_memory_get_stats(f.memory, &ms);
    t.memory_used = ms.used_bytes;
    if (f.journal != NULL) {
        drey_journal_stats js;
        drey_journal_get_stats(f.journal, &js);
        t.lsn = js.last_lsn;
        t.appends = js.appends;
    }
    return t;
}

static void expect_no_trace(const trace *before, const char *what) {
    trace now = take_trace();
    cr_assert_eq(now.entries, before->entries, "%s: entries (outcomes included)", what);
    cr_assert_eq(now.bytes, before->bytes, "%s: accounted bytes", what);
    cr_assert_eq(now.memory_used, before->memory_used, "%s: memory accounting", what);
    cr_assert_eq(now.version, before->version, "%s: a version was consumed", what);
    cr_assert_eq(now.lsn, before->lsn, "%s: a journal record was written", what);
    cr_assert_eq(now.appends, before->appends, "%s: a journal record was written", what);
}

/* A first write, so that there is state a refusal could disturb. */
static trace baseline(void) {
    door *d = set((set_args){.key = "k0", .value = "v0", .request_id = "r0"});
    expect_ok(d);
    door_free(d);
    return take_trace();
}

/* --- the journal writer, held between batches ------------------------------ */

static void block_writer_task(void *arg, uint64_t lsn, int64_t time_ms) {
    (void)arg;
    (void)lsn;
    (void)time_ms;
    pthread_mutex_lock(&f.mu);
    f.writer_blocked = true;
    pthread_cond_broadcast(&f.cond);
    while (!f.writer_release)
        pthread_cond_wait(&f.cond, &f.mu);
    f.writer_blocked = false;
    pthread_mutex_unlock(&f.mu);
}

static void block_writer(void) {
    f.writer_release = false;
    drey_journal_on_writer(f.journal, block_writer_task, NULL);
    pthread_mutex_lock(&f.mu);
    while (!f.writer_blocked)
        pthread_cond_wait(&f.cond, &f.mu);
    pthread_mutex_unlock(&f.mu);
}

static void release_writer(void) {
    pthread_mutex_lock(&f.mu);
    f.writer_release = true;
    pthread_cond_broadcast(&f.cond);
    pthread_mutex_unlock(&f.mu);
}

/* --- every stage's refusal leaves no trace --------------------------------- */

Test(chain, a_request_refused_while_recovering_leaves_no_trace) {
    fixture_open(&(fixture_opts){.durable = true});
    trace t = baseline();
    drey_pipeline_set_ready(f.p, false);
    door *d = set((set_args){.key = "k1", .value = "v1", .request_id = "r1"});
    expect_refused(d, DREY_ERR_RECOVERING);
    expect_no_trace(&t, "ready");
    door_free(d);
}

Test(chain, an_invalid_request_leaves_no_trace) {
    fixture_open(&(fixture_opts){.durable = true, .max_key_bytes = 8});
    trace t = baseline();
    door *d = set((set_args){.key = "a-key-longer-than-eight", .value = "v1", .request_id = "r1"});
    expect_refused(d, DREY_ERR_INVALID_KEY);
    expect_no_trace(&t, "validate");
    door_free(d);
}

Test(chain, a_token_that_cannot_be_checked_leaves_no_trace) {
    fixture_open(&(fixture_opts){.durable = true});
    trace t = baseline();
    door *d = set((set_args){.key = "k1", .value = "v1", .request_id = "r1", .authorization = "Bearer a.b.c"});
    expect_refused(d, DREY_ERR_TOKEN_UNKNOWN_KEY);
    expect_no_trace(&t, "principal");
    door_free(d);
}

Test(chain, a_missing_token_leaves_no_trace) {
    fixture_open(&(fixture_opts){.durable = true, .auth_required = true});
    trace t = take_trace();
    door *d = set((set_args){.key = "k1", .value = "v1", .request_id = "r1"});
    expect_refused(d, DREY_ERR_TOKEN_MISSING);
    expect_no_trace(&t, "principal");
    door_free(d);
}

Test(chain, a_backpressure_refusal_leaves_no_trace) {
    fixture_open(&(fixture_opts){.durable = true, .principal_max_inflight = 1});
    trace t = baseline();
    door *h = hold_one(); /* conn:1 has its one slot taken */
    drey_request *held = take_held();
    door *d = set((set_args){.key = "k1", .value = "v1", .request_id = "r1"});
    expect_refused(d, DREY_ERR_PRINCIPAL_CONCURRENCY_LIMIT);
    expect_no_trace(&t, "backpressure");
    answer_held(held);
    expect_ok(h);
    door_free(h);
    door_free(d);
}

Test(chain, a_reused_request_id_leaves_no_trace) {
    fixture_open(&(fixture_opts){.durable = true});
    trace t = baseline();
    door *d = set((set_args){.key = "k0", .value = "other", .request_id = "r0"});
    expect_refused(d, DREY_ERR_IDEMPOTENCY_KEY_REUSED);
    expect_no_trace(&t, "idempotency");
    door_free(d);
}

Test(chain, a_retry_is_answered_without_a_trace) {
    fixture_open(&(fixture_opts){.durable = true});
    door *first = set((set_args){.key = "k0", .value = "v0", .request_id = "r0"});
    expect_ok(first);
    trace t = take_trace();
    door *retry = set((set_args){.key = "k0", .value = "v0", .request_id = "r0"});
    expect_ok(retry);
    cr_assert_eq(retry->resp_len, first->resp_len);
    cr_assert(memcmp(retry->resp, first->resp, first->resp_len) == 0, "the first outcome, byte for byte");
    expect_no_trace(&t, "retry");
    door_free(first);
    door_free(retry);
}

Test(chain, a_memory_refusal_leaves_no_trace) {
    fixture_open(&(fixture_opts){.durable = true, .memory_limit = 4096});
    trace t = baseline();
    static char big[3800];
    memset(big, 'x', sizeof big);
    door *d = set((set_args){.key = "k1", .value = big, .value_len = sizeof big, .request_id = "r1"});
    expect_refused(d, DREY_ERR_MEMORY_PRESSURE);
    expect_no_trace(&t, "memory");
    door_free(d);
}

Test(chain, a_write_opening_one_cache_too_many_leaves_no_trace) {
    fixture_open(&(fixture_opts){.durable = true, .max_caches = 2});
    trace t0 = baseline(); /* cache "c" */
    door *d = set((set_args){.cache = "d", .key = "k", .value = "v"});
    expect_ok(d);
    door_free(d);
    trace t = take_trace();
    d = set((set_args){.cache = "e", .key = "k", .value = "v", .request_id = "r-e"});
    expect_refused(d, DREY_ERR_TOO_MANY_CACHES);
    cr_assert_str_eq(d->st.quota_subject, "node:t");
    expect_no_trace(&t, "too many caches");
    door_free(d);
    /* Caches that exist take writes; one that empties counts no more. */
    d = set((set_args){.cache = "c", .key = "k2", .value = "v"});
    expect_ok(d);
    door_free(d);
    Drey__Cache__V1__RemoveRequest rm = DREY__CACHE__V1__REMOVE_REQUEST__INIT;
    rm.cache = "d";
    rm.key = "k";
    d = submit("/drey.cache.v1.Cache/Remove", &rm.base, NULL);
    expect_ok(d);
    door_free(d);
    d = set((set_args){.cache = "e", .key = "k", .value = "v"});
    expect_ok(d);
    door_free(d);
    (void)t0;
}

Test(chain, a_journal_quota_refusal_leaves_no_trace) {
    fixture_open(&(fixture_opts){.durable = true, .journal_max_bytes = 64 * 1024});
    trace t = baseline();
    static char big[70 * 1024];
    memset(big, 'x', sizeof big);
    door *d = set((set_args){.key = "k1", .value = big, .value_len = sizeof big, .request_id = "r1"});
    expect_refused(d, DREY_ERR_JOURNAL_DISK_QUOTA);
    expect_no_trace(&t, "journal quota");
    door_free(d);
}

Test(chain, a_full_journal_queue_refuses_before_anything_is_queued) {
    fixture_open(&(fixture_opts){.durable = true, .max_queued_records = 2});
    trace t = baseline();
    block_writer();
    door *a = set((set_args){.key = "k1", .value = "v1"});
    door *b = set((set_args){.key = "k2", .value = "v2"});
    door *c = set((set_args){.key = "k3", .value = "v3", .request_id = "r3"});
    expect_refused(c, DREY_ERR_JOURNAL_QUEUE_FULL);
    cr_assert(!door_answered(a) && !door_answered(b), "queued writes wait for the disk");
    drey_journal_stats js;
    drey_journal_get_stats(f.journal, &js);
    cr_assert_eq(js.queued_records, 2);
    cr_assert_eq(js.queue_rejections, 1);
    /* Nothing of the queued writes is visible yet (they hold the versions
     * they were ordered with, one each), and c left nothing. */
    trace queued = t;
    queued.version += 2;
    expect_no_trace(&queued, "queue full");
    release_writer();
    expect_ok(a);
    expect_ok(b);
    drey_journal_get_stats(f.journal, &js);
    cr_assert_eq(js.queued_records, 0);
    cr_assert_eq(js.last_lsn, t.lsn + 2, "a and b, not c");
    door_free(a);
    door_free(b);
    door_free(c);
}

/* Anonymous callers may do anything (baseline() writes without a token);
 * alice only user:* in "c", and her writes are acme's, 300 bytes at most. */
#define POLICY                                                                                                    \
    "{\"roles\": {\"all\": [{\"caches\": [\"*\"], \"keys\": [\"*\"], \"verbs\": [\"read\", \"write\", \"delete\"]}]," \
    "  \"users\": [{\"caches\": [\"c\"], \"keys\": [\"user:*\"], \"verbs\": [\"read\", \"write\", \"delete\"]}]},"   \
    " \"bindings\": [{\"claim\": \"sub\", \"equals\": \"alice\", \"roles\": [\"users\"]},"                          \
    "  {\"anonymous\": true, \"roles\": [\"all\"]}],"                                                             \
    " \"tenants\": {\"claim\": \"tenant\", \"maxBytes\": {\"acme\": 300, \"*\": 1000000}}}"

static door *set_many(const char *authorization, const char *k1, const char *k2) {
    Drey__Cache__V1__Value v = DREY__CACHE__V1__VALUE__INIT;
    v.kind_case = DREY__CACHE__V1__VALUE__KIND_BYTES_VALUE;
    v.bytes_value.data = (uint8_t *)"v";
    v.bytes_value.len = 1;
    Drey__Cache__V1__SetManyRequest__Entry e1 = DREY__CACHE__V1__SET_MANY_REQUEST__ENTRY__INIT, e2 = e1;
    e1.key = (char *)k1;
    e1.value = &v;
    e2.key = (char *)k2;
    e2.value = &v;
    Drey__Cache__V1__SetManyRequest__Entry *es[] = {&e1, &e2};
    Drey__Cache__V1__SetManyRequest req = DREY__CACHE__V1__SET_MANY_REQUEST__INIT;
    req.cache = "c";
    req.n_entries = 2;
    req.entries = es;
    return submit("/drey.cache.v1.Cache/SetMany", &req.base, authorization);
}

Test(chain, a_request_not_permitted_leaves_no_trace) {
    fixture_open(&(fixture_opts){.durable = true, .policy = POLICY});
    trace t = baseline();
    char *alice = mint("alice", "");
    door *d = set((set_args){.key = "other", .value = "v", .request_id = "r1", .authorization = alice});
    expect_refused(d, DREY_ERR_NOT_PERMITTED);
    expect_no_trace(&t, "authz");
    door_free(d);
    /* One key of a batch not granted: the whole batch is refused. */
    d = set_many(alice, "user:1", "other");
    expect_refused(d, DREY_ERR_NOT_PERMITTED);
    expect_no_trace(&t, "authz, batch");
    door_free(d);
    d = set_many(alice, "user:1", "user:2");
    expect_ok(d);
    door_free(d);
    drey_authz_stats as;
    drey_authz_get_stats(f.authz, &as);
    cr_assert_eq(as.denied[DREY_AUTHZ_WRITE], 2);
    cr_assert_str_eq(as.denials[0].principal, "jwt:alice");
    free(alice);
}

Test(chain, a_tenant_quota_refusal_leaves_no_trace) {
    fixture_open(&(fixture_opts){.durable = true, .policy = POLICY});
    char *acme = mint("alice", ",\"tenant\":\"acme\"");
    static char v[100];
    memset(v, 'x', sizeof v);
    door *d = set((set_args){.key = "user:1", .value = v, .value_len = sizeof v, .authorization = acme});
    expect_ok(d);
    door_free(d);
    uint32_t id = drey_tenants_intern(f.tenants, "acme", 4);
    int64_t used = drey_tenants_used(f.tenants, id);
    cr_assert_gt(used, 100);
    cr_assert_leq(used, 300);
    trace t = take_trace();
    static char big[250];
    memset(big, 'y', sizeof big);
    d = set((set_args){.key = "user:2", .value = big, .value_len = sizeof big, .request_id = "r2", .authorization = acme});
    expect_refused(d, DREY_ERR_TENANT_MEMORY_QUOTA);
    cr_assert_str_eq(d->st.quota_subject, "tenant:acme");
    expect_no_trace(&t, "tenant");
    cr_assert_eq(drey_tenants_used(f.tenants, id), used, "nothing reserved is left behind");
    door_free(d);
    /* Replacing the tenant's own entry grows it only by the difference. */
    d = set((set_args){.key = "user:1", .value = big, .value_len = 150, .authorization = acme});
    expect_ok(d);
    door_free(d);
    cr_assert_eq(drey_tenants_used(f.tenants, id), used + 50);
    /* Removing gives the bytes back. */
    Drey__Cache__V1__RemoveRequest rm = DREY__CACHE__V1__REMOVE_REQUEST__INIT;
    rm.cache = "c";
    rm.key = "user:1";
    d = submit("/drey.cache.v1.Cache/Remove", &rm.base, acme);
    expect_ok(d);
    door_free(d);
    cr_assert_eq(drey_tenants_used(f.tenants, id), 0);
    free(acme);
}

Test(chain, authz_runs_after_principal_and_before_idempotency_and_tenant_before_memory) {
    fixture_open(&(fixture_opts){.durable = true, .policy = POLICY, .memory_limit = 4096});
    door *first = set((set_args){.key = "k0", .value = "v0", .request_id = "r0"});
    expect_ok(first);
    door_free(first);
    char *alice = mint("alice", ",\"tenant\":\"acme\"");
    /* authz before idempotency: r0 reused, by a caller who may not write k0. */
    door *d = set((set_args){.key = "k0", .value = "other", .request_id = "r0", .authorization = alice});
    expect_refused(d, DREY_ERR_NOT_PERMITTED);
    door_free(d);
    /* principal before authz: a token that cannot be checked. */
    d = set((set_args){.key = "k0", .value = "v", .authorization = "Bearer a.b.c"});
    expect_refused(d, DREY_ERR_TOKEN_MALFORMED);
    door_free(d);
    /* tenant before memory: too big for both. */
    static char big[5000];
    memset(big, 'x', sizeof big);
    d = set((set_args){.key = "user:1", .value = big, .value_len = sizeof big, .authorization = alice});
    expect_refused(d, DREY_ERR_TENANT_MEMORY_QUOTA);
    door_free(d);
    free(alice);
}

/* --- the order of the stages ----------------------------------------------- */

/* Each request below fails two stages; the earlier one answers. */
Test(chain, stages_run_in_the_declared_order) {
    fixture_open(&(fixture_opts){.durable = true, .max_key_bytes = 8, .principal_max_inflight = 1,
                                 .memory_limit = 4096, .journal_max_bytes = 64 * 1024});
    door *first = set((set_args){.key = "k0", .value = "v0", .request_id = "r0"});
    expect_ok(first);
    static char big[70 * 1024];
    memset(big, 'x', sizeof big);

    /* memory before journal: too big for memory and for the quota. */
    door *d = set((set_args){.key = "k1", .value = big, .value_len = sizeof big});
    expect_refused(d, DREY_ERR_MEMORY_PRESSURE);
    door_free(d);
    /* idempotency before memory: a retry is answered even when the write
     * would not be admitted now (here: its request_id is reused for a
     * write memory would refuse). */
    d = set((set_args){.key = "k0", .value = big, .value_len = sizeof big, .request_id = "r0"});
    expect_refused(d, DREY_ERR_IDEMPOTENCY_KEY_REUSED);
    door_free(d);

    door *h = hold_one();
    drey_request *held = take_held();
    /* backpressure before idempotency: conn:1's one slot is taken. */
    d = set((set_args){.key = "k0", .value = "v0", .request_id = "r0"});
    expect_refused(d, DREY_ERR_PRINCIPAL_CONCURRENCY_LIMIT);
    door_free(d);
    /* principal before backpressure. */
    d = set((set_args){.key = "k1", .value = "v1", .authorization = "Bearer a.b.c"});
    expect_refused(d, DREY_ERR_TOKEN_UNKNOWN_KEY);
    door_free(d);
    /* validate before principal. */
    d = set((set_args){.key = "a-key-longer-than-eight", .value = "v1", .authorization = "Bearer a.b.c"});
    expect_refused(d, DREY_ERR_INVALID_KEY);
    door_free(d);
    /* ready before validate. */
    drey_pipeline_set_ready(f.p, false);
    d = set((set_args){.key = "a-key-longer-than-eight", .value = "v1"});
    expect_refused(d, DREY_ERR_RECOVERING);
    door_free(d);

    answer_held(held);
    expect_ok(h);
    door_free(h);
    door_free(first);
}

Test(chain, a_retry_is_answered_from_its_outcome_under_memory_pressure) {
    fixture_open(&(fixture_opts){.durable = true, .memory_limit = 6000});
    static char v[2000];
    memset(v, 'x', sizeof v);
    door *first = set((set_args){.key = "k0", .value = v, .value_len = sizeof v, .request_id = "r0"});
    expect_ok(first);
    Drey__Cache__V1__RemoveRequest rm = DREY__CACHE__V1__REMOVE_REQUEST__INIT;
    rm.cache = "c";
    rm.key = "k0";
    door *removed = submit("/drey.cache.v1.Cache/Remove", &rm.base, NULL);
    expect_ok(removed);
    /* Fill memory until a write of the same size is refused. */
    door *fill1 = set((set_args){.key = "k1", .value = v, .value_len = sizeof v});
    expect_ok(fill1);
    door *fill2 = set((set_args){.key = "k2", .value = v, .value_len = sizeof v});
    expect_ok(fill2);
    door *refused = set((set_args){.key = "k3", .value = v, .value_len = sizeof v});
    expect_refused(refused, DREY_ERR_MEMORY_PRESSURE);
    /* Applied again, the retry would grow memory as much as k3; but it was
     * applied once, and MEMORY_PRESSURE (not applied) would be false. */
    trace t = take_trace();
    door *retry = set((set_args){.key = "k0", .value = v, .value_len = sizeof v, .request_id = "r0"});
    expect_ok(retry);
    cr_assert_eq(retry->resp_len, first->resp_len);
    cr_assert(memcmp(retry->resp, first->resp, first->resp_len) == 0, "the first outcome");
    expect_no_trace(&t, "retry under pressure");
    door_free(first);
    door_free(removed);
    door_free(fill1);
    door_free(fill2);
    door_free(refused);
    door_free(retry);
}

/* --- parking, resuming, cancelling ----------------------------------------- */

Test(chain, a_request_parked_for_a_slot_resumes_when_one_frees) {
    fixture_open(&(fixture_opts){.durable = true, .max_inflight = 1, .max_queued = 4});
    door *h = hold_one();
    drey_request *held = take_held();
    trace t = take_trace();
    door *d = set((set_args){.key = "k1", .value = "v1"});
    cr_assert(!door_answered(d), "waits for the slot");
    expect_no_trace(&t, "while parked");
    answer_held(held);
    expect_ok(h);
    expect_ok(d);
    trace after = take_trace();
    cr_assert_eq(after.lsn, t.lsn + 1, "journaled once it ran");
    door_free(h);
    door_free(d);
}

/* Whether a Get of key in "c" through the chain finds it. */
static bool visible(const char *key) {
    Drey__Cache__V1__GetRequest get = DREY__CACHE__V1__GET_REQUEST__INIT;
    get.cache = "c";
    get.key = (char *)key;
    door *g = submit("/drey.cache.v1.Cache/Get", &get.base, NULL);
    expect_ok(g);
    Drey__Cache__V1__GetResponse *gr = drey__cache__v1__get_response__unpack(NULL, g->resp_len, g->resp);
    cr_assert_not_null(gr);
    bool found = gr->found;
    drey__cache__v1__get_response__free_unpacked(gr, NULL);
    door_free(g);
    return found;
}

Test(chain, a_write_is_answered_and_visible_only_once_durable) {
    fixture_open(&(fixture_opts){.durable = true});
    block_writer();
    door *d = set((set_args){.key = "k1", .value = "v1"});
    cr_assert(!door_answered(d));
    cr_assert(!visible("k1"), "not visible before it is durable");
    release_writer();
    expect_ok(d);
    cr_assert(visible("k1"));
    door_free(d);
}

/* The disk fails the write's fdatasync: UNAVAILABLE JOURNAL_WRITE_FAILED
 * with the errno, and nothing is applied (the journal's failure completes
 * the record without a record to hand). */
Test(chain, a_write_the_disk_fails_is_answered_journal_write_failed_and_not_applied) {
    fixture_open(&(fixture_opts){.durable = true});
    drey_io_fault_fail_sync(f.fs, 1, EIO, true);
    door *d = set((set_args){.key = "k1", .value = "v1", .request_id = "r1"});
    expect_refused(d, DREY_ERR_JOURNAL_WRITE_FAILED);
    cr_assert_eq(d->st.n_metadata, 1);
    cr_assert_str_eq(d->st.metadata[0].key, "errno");
    cr_assert_str_eq(d->st.metadata[0].value, "5");
    door_free(d);
    cr_assert(!visible("k1"), "a write that is not durable is not applied");
}

/* A replicator standing in for the cluster's: it takes the first write
 * (parked, resumed once durable) and, from released, submits a second
 * write on the same thread, as a Pipeline stream whose answered operation
 * submits its next one does. Were the order lock still held, the second
 * write would wait for it forever (the deadlock seen at RF 2). */
static struct {
    bool took_first;
    door *second;
} rp;

static void fake_durable(void *arg, const drey_journal_record *rec, int err) {
    (void)rec;
    cr_assert_eq(err, 0);
    drey_pipeline_resume(arg);
}

static drey_stage_result fake_prepare(void *ctx, drey_request *r) {
    (void)ctx;
    if (rp.took_first)
        return DREY_STAGE_NEXT;
    rp.took_first = true;
    r->entry.done = fake_durable;
    r->entry.arg = r;
    return DREY_STAGE_PARKED;
}

static uint32_t fake_appended(void *ctx, drey_request *r, int rc) {
    (void)ctx;
    (void)r;
    cr_assert_eq(rc, 0);
    return 7;
}

static void fake_released(void *ctx, uint32_t token) {
    (void)ctx;
    cr_assert_eq(token, 7, "released gets what appended returned");
    rp.second = set((set_args){.key = "k2", .value = "v2"});
}

Test(chain, a_replicator_completes_writes_only_once_the_order_lock_is_let_go) {
    fixture_open(&(fixture_opts){.durable = true});
    memset(&rp, 0, sizeof rp);
    drey_pipeline_set_replicator(f.p, &(drey_replicator){
                                          .prepare = fake_prepare, .appended = fake_appended, .released = fake_released});
    door *d = set((set_args){.key = "k1", .value = "v1"});
    cr_assert_not_null(rp.second, "released ran before the first write's submission returned");
    expect_ok(d);
    expect_ok(rp.second);
    door_free(d);
    door_free(rp.second);
}

Test(chain, a_cancelled_waiter_is_answered_cancelled_and_leaves_no_trace) {
    fixture_open(&(fixture_opts){.durable = true, .max_inflight = 1, .max_queued = 4});
    door *h = hold_one();
    drey_request *held = take_held();
    trace t = take_trace();
    door *d = set((set_args){.key = "k1", .value = "v1", .request_id = "r1"});
    cr_assert(!door_answered(d));
    door_cancel(d);
    expect_refused(d, DREY_ERR_CANCELLED);
    answer_held(held);
    expect_ok(h);
    expect_no_trace(&t, "cancelled waiter");
    door_free(h);
    door_free(d);
}

/* --max-inflight must bound work even when callers give up: a running
 * request that is cancelled keeps its slot until it is done. */
Test(chain, a_cancelled_running_request_keeps_its_slot) {
    fixture_open(&(fixture_opts){.durable = true, .max_inflight = 1, .max_queued = 0});
    door *h = hold_one();
    drey_request *held = take_held();
    door_cancel(h);
    cr_assert(!door_answered(h), "cancelling a running request does not answer it");
    door *d = set((set_args){.key = "k1", .value = "v1"});
    expect_refused(d, DREY_ERR_QUEUE_FULL);
    answer_held(held);
    expect_ok(h);
    door *e = set((set_args){.key = "k1", .value = "v1"});
    expect_ok(e);
    door_free(h);
    door_free(d);
    door_free(e);
}

/* The same through the journal: writes whose callers went away while they
 * waited for the disk still hold their slots, so no more than
 * --max-inflight of them can pile up in the journal's queue. */
Test(chain, cancelled_writes_in_the_journal_queue_keep_their_slots) {
    fixture_open(&(fixture_opts){.durable = true, .max_inflight = 4, .max_queued = 0});
    block_writer();
    door *w[4];
    char key[16];
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof key, "k%d", i);
        w[i] = set((set_args){.key = key, .value = "v"});
        door_cancel(w[i]);
    }
    door *more = set((set_args){.key = "k9", .value = "v"});
    expect_refused(more, DREY_ERR_QUEUE_FULL);
    drey_journal_stats js;
    drey_journal_get_stats(f.journal, &js);
    cr_assert_eq(js.queued_records, 4, "at most --max-inflight writes wait for the disk");
    release_writer();
    for (int i = 0; i < 4; i++) {
        expect_ok(w[i]);
        door_free(w[i]);
    }
    door_free(more);
}

/* --- forwarded calls -------------------------------------------------------- */

static door *get_via(const char *key, via v) {
    Drey__Cache__V1__GetRequest get = DREY__CACHE__V1__GET_REQUEST__INIT;
    get.cache = "c";
    get.key = (char *)key;
    return submit_via("/drey.cache.v1.Cache/Get", &get.base, v);
}

Test(chain, forwarding_metadata_is_refused_on_the_public_listener) {
    fixture_open(&(fixture_opts){.durable = true});
    door *d = get_via("k", (via){.forwarded_by = "node-a"});
    expect_refused(d, DREY_ERR_FORWARDING_NOT_ALLOWED);
    door_free(d);
}

Test(chain, the_internal_listener_serves_only_the_peer_its_certificate_names) {
    fixture_open(&(fixture_opts){.durable = true});
    door *d = get_via("k", (via){.internal = true, .forwarded_by = "node-a", .peer_id = "node-b"});
    expect_refused(d, DREY_ERR_PEER_UNAUTHENTICATED);
    door_free(d);
    d = get_via("k", (via){.internal = true, .peer_id = "node-a"});
    expect_refused(d, DREY_ERR_PEER_UNAUTHENTICATED);
    door_free(d);
    d = get_via("k", (via){.internal = true, .forwarded_by = "node-a", .peer_id = "node-a"});
    expect_ok(d);
    door_free(d);
}

/* An owner's share of a cluster Watch is checked outside the chain with
 * the chain's own principal and authz stages: the forwarding peer proven,
 * the token verified here, the grants asked here; nothing answered, nothing
 * held, a denial counted. */
#define WATCH_POLICY                                                                                               \
    "{\"roles\": {\"users\": [{\"caches\": [\"c\"], \"keys\": [\"user:*\"], \"verbs\": [\"watch\"]}]},"         \
    " \"bindings\": [{\"claim\": \"sub\", \"equals\": \"alice\", \"roles\": [\"users\"]}]}"

static drey_error authorize_watch(via v, const char *key, const char *prefix) {
    static const drey_method watch = {.path = "/drey.cache.v1.Cache/Watch", .flags = DREY_METHOD_READ};
    door *d = calloc(1, sizeof *d);
    cr_assert_not_null(d);
    drey_arena_init(&d->arena, NULL, 0);
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cond, NULL);
    d->authorization = v.authorization;
    d->forwarded_by = v.forwarded_by;
    d->peer_id = v.peer_id;
    Drey__Cache__V1__WatchRequest w = DREY__CACHE__V1__WATCH_REQUEST__INIT;
    w.cache = "c";
    char *keys[1] = {(char *)key};
    if (key != NULL) {
        w.n_keys = 1;
        w.keys = keys;
    } else
        w.prefix = (char *)prefix;
    drey_request_init(&d->r, &internal_ops, d, &d->arena, &watch, &w.base, NULL, 0);
    const drey_status *st = drey_pipeline_authorize(f.p, &d->r);
    cr_assert(!door_answered(d), "the check answers nothing");
    cr_assert_null(d->r.grants, "and holds nothing");
    drey_error e = st != NULL ? st->error : DREY_ERR_NONE;
    if (st == NULL)
        cr_assert_str_eq(d->r.principal, "node:n1");
    door_free(d);
    return e;
}

Test(chain, a_subscription_is_checked_with_this_nodes_keys_and_policy) {
    fixture_open(&(fixture_opts){.policy = WATCH_POLICY, .auth_required = true});
    char *alice = mint("alice", ""), *bob = mint("bob", "");
    via from_n1 = {.internal = true, .forwarded_by = "n1", .peer_id = "n1", .authorization = alice};
    cr_assert_eq(authorize_watch(from_n1, "user:1", NULL), DREY_ERR_NONE);
    cr_assert_eq(authorize_watch(from_n1, NULL, "user:"), DREY_ERR_NONE);
    cr_assert_eq(authorize_watch(from_n1, "other", NULL), DREY_ERR_NOT_PERMITTED);
    cr_assert_eq(authorize_watch(from_n1, NULL, ""), DREY_ERR_NOT_PERMITTED, "the whole cache");
    via as_bob = from_n1;
    as_bob.authorization = bob;
    cr_assert_eq(authorize_watch(as_bob, "user:1", NULL), DREY_ERR_NOT_PERMITTED, "no binding names bob");
    drey_authz_stats as;
    drey_authz_get_stats(f.authz, &as);
    cr_assert_eq(as.denied[DREY_AUTHZ_WATCH], 3);
    cr_assert_str_eq(as.denials[0].principal, "jwt:bob");
    cr_assert_str_eq(as.denials[0].method, "/drey.cache.v1.Cache/Watch");
    /* A token this node does not accept, none at all, another node's word. */
    via forged = from_n1;
    forged.authorization = "Bearer not-a-token";
    cr_assert_eq(authorize_watch(forged, "user:1", NULL), DREY_ERR_TOKEN_MALFORMED);
    via bare = from_n1;
    bare.authorization = NULL;
    cr_assert_eq(authorize_watch(bare, "user:1", NULL), DREY_ERR_TOKEN_MISSING);
    via impostor = from_n1;
    impostor.peer_id = "n2";
    cr_assert_eq(authorize_watch(impostor, "user:1", NULL), DREY_ERR_PEER_UNAUTHENTICATED);
    drey_authz_get_stats(f.authz, &as);
    cr_assert_eq(as.denied[DREY_AUTHZ_WATCH], 3, "refused before the policy: not a denial");
    free(alice);
    free(bob);
}

/* On the owner a forwarded call counts against its peer (node:<id>), not
 * against whoever it forwards for: the peer's limits are its own. */
Test(chain, a_forwarded_call_is_admitted_as_its_peer) {
    fixture_open(&(fixture_opts){.durable = true, .principal_max_inflight = 1});
    door *h = hold_one(); /* conn:1 is at its limit */
    drey_request *held = take_held();
    cr_assert_str_eq(held->principal, "conn:1");
    door *fw = hold_via((via){.internal = true, .forwarded_by = "node-a", .peer_id = "node-a"});
    drey_request *held_fw = take_held();
    cr_assert_str_eq(held_fw->principal, "node:node-a");
    cr_assert_str_eq(held_fw->forwarded_by, "node-a");
    /* The peer is not held to a tenant's limit of 1. */
    door *again = hold_via((via){.internal = true, .forwarded_by = "node-a", .peer_id = "node-a"});
    drey_request *held_again = take_held();
    cr_assert_str_eq(held_again->principal, "node:node-a");
    answer_held(held);
    answer_held(held_fw);
    answer_held(held_again);
    expect_ok(again);
    expect_ok(h);
    expect_ok(fw);
    door_free(h);
    door_free(fw);
    door_free(again);
}

/* A node's own calls to another (a partition moving) are the peer's, proven
 * by its certificate: refused from anyone else, and needing no token where
 * clients need one. */
Test(chain, peer_methods_serve_only_an_authenticated_peer) {
    fixture_open(&(fixture_opts){.durable = true, .auth_required = true});
    Drey__Internal__V1__DropRequest drop = DREY__INTERNAL__V1__DROP_REQUEST__INIT;
    drop.partitions = 4;
    trace before = take_trace();
    door *d = submit_via(DREY_PARTITION_DROP_PATH, &drop.base, (via){0});
    expect_refused(d, DREY_ERR_PEER_UNAUTHENTICATED);
    door_free(d);
    d = submit_via(DREY_PARTITION_DROP_PATH, &drop.base, (via){.internal = true, .peer_id = "node-a"});
    expect_refused(d, DREY_ERR_PEER_UNAUTHENTICATED);
    door_free(d);
    d = submit_via(DREY_PARTITION_DROP_PATH, &drop.base,
                   (via){.internal = true, .forwarded_by = "node-a", .peer_id = "node-b"});
    expect_refused(d, DREY_ERR_PEER_UNAUTHENTICATED);
    door_free(d);
    expect_no_trace(&before, "a refused peer call");
    d = submit_via(DREY_PARTITION_DROP_PATH, &drop.base,
                   (via){.internal = true, .forwarded_by = "node-a", .peer_id = "node-a"});
    expect_ok(d);
    door_free(d);
    trace after = take_trace();
    cr_assert_eq(after.lsn, before.lsn + 1, "journaled like any write");
}

/* --- versions follow the journal's order ------------------------------------ */

#define WRITERS 4
#define WRITES_PER_WRITER 60

typedef struct writer {
    int id;
    uint64_t versions[WRITES_PER_WRITER];
} writer;

static void *write_one_key(void *arg) {
    writer *w = arg;
    for (int i = 0; i < WRITES_PER_WRITER; i++) {
        char value[32];
        snprintf(value, sizeof value, "w%d-%d", w->id, i);
        door *d = set((set_args){.key = "hot", .value = value});
        expect_ok(d);
        Drey__Cache__V1__SetResponse *r = drey__cache__v1__set_response__unpack(NULL, d->resp_len, d->resp);
        cr_assert_not_null(r);
        w->versions[i] = r->version;
        drey__cache__v1__set_response__free_unpacked(r, NULL);
        door_free(d);
    }
    return NULL;
}

/* The journal read back: each record's first version, in LSN order, and a
 * fresh stack the records are replayed into, checked record by record. */
typedef struct reread {
    drey_store *store;
    drey_commit *commit;
    drey_method_table *methods;
    drey_cache *cache;
    uint64_t versions[WRITERS * WRITES_PER_WRITER + 1];
    size_t n;
    uint64_t last_lsn;
} reread;

static int reread_record(void *ctx, const drey_journal_record *rec) {
    reread *rr = ctx;
    Drey__Journal__V1__JournalRecord *jr = drey__journal__v1__journal_record__unpack(NULL, rec->len, rec->payload);
    cr_assert_not_null(jr);
    cr_assert_str_eq(jr->method, "drey.cache.v1.Cache/Set");
    cr_assert_gt(rec->lsn, rr->last_lsn);
    rr->last_lsn = rec->lsn;
    cr_assert_lt(rr->n, sizeof rr->versions / sizeof rr->versions[0]);
    rr->versions[rr->n++] = jr->first_version;
    drey__journal__v1__journal_record__free_unpacked(jr, NULL);
    cr_assert_eq(drey_commit_replay(rr->commit, rec), 0);
    /* The replayed key has exactly the record's version. */
    drey_key k;
    drey_store_key(rr->store, &k, "c", 1, "hot", 3);
    drey_entry_view e;
    drey_store_txn t;
    drey_store_txn_begin(rr->store, &t, &k, 1);
    cr_assert(drey_store_txn_get(&t, &k, drey_wall_ms(), &e));
    uint64_t got = e.version;
    drey_store_txn_end(&t);
    cr_assert_eq(got, rr->versions[rr->n - 1], "lsn %llu", (unsigned long long)rec->lsn);
    return 0;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

Test(chain, concurrent_writes_to_one_key_get_versions_in_journal_order_and_replay_reproduces_them) {
    fixture_open(&(fixture_opts){.durable = true});
    /* Versions from elsewhere on the node (another partition's writes, a
     * snapshot) must not matter to a replay. */
    drey_store_raise_version(f.store, 1000);
    static writer ws[WRITERS];
    pthread_t th[WRITERS];
    for (int i = 0; i < WRITERS; i++) {
        ws[i].id = i;
        cr_assert_eq(pthread_create(&th[i], NULL, write_one_key, &ws[i]), 0);
    }
    for (int i = 0; i < WRITERS; i++)
        pthread_join(th[i], NULL);

    /* Each writer saw its own versions increase. */
    uint64_t all[WRITERS * WRITES_PER_WRITER];
    size_t n = 0;
    for (int i = 0; i < WRITERS; i++)
        for (int j = 0; j < WRITES_PER_WRITER; j++) {
            if (j > 0)
                cr_assert_gt(ws[i].versions[j], ws[i].versions[j - 1]);
            all[n++] = ws[i].versions[j];
        }

    static reread rr;
    memset(&rr, 0, sizeof rr);
    rr.store = drey_store_create();
    rr.cache = drey_cache_create(rr.store);
    rr.methods = drey_method_table_create();
    cr_assert(drey_cache_register(rr.cache, rr.methods));
    drey_commit_options co = {.store = rr.store, .methods = rr.methods, .idempotency_retention_ms = 60000};
    rr.commit = drey_commit_create(&co);
    drey_journal_scan scan;
    cr_assert_eq(drey_journal_scan_dir(drey_io_fault_io(f.fs), "/d", 0, reread_record, &rr, &scan), 0);
    drey_journal_scan_free(&scan);

    /* Strictly increasing in LSN order, and exactly the acknowledged ones. */
    cr_assert_eq(rr.n, n);
    for (size_t i = 1; i < rr.n; i++)
        cr_assert_gt(rr.versions[i], rr.versions[i - 1], "record %zu", i);
    qsort(all, n, sizeof all[0], cmp_u64);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(rr.versions[i], all[i], "acknowledged version %zu", i);
    cr_assert_gt(all[0], 1000);

    /* Live and replayed stores agree on the key. */
    drey_key lk, rk;
    drey_store_key(f.store, &lk, "c", 1, "hot", 3);
    drey_store_key(rr.store, &rk, "c", 1, "hot", 3);
    drey_entry_view le, re;
    drey_store_txn lt, rt;
    drey_store_txn_begin(f.store, &lt, &lk, 1);
    drey_store_txn_begin(rr.store, &rt, &rk, 1);
    cr_assert(drey_store_txn_get(&lt, &lk, drey_wall_ms(), &le));
    cr_assert(drey_store_txn_get(&rt, &rk, drey_wall_ms(), &re));
    cr_assert_eq(le.version, re.version);
    cr_assert_eq(le.version, all[n - 1], "the last journaled is the last applied");
    cr_assert_eq(le.value.len, re.value.len);
    cr_assert(memcmp(le.value.data, re.value.data, le.value.len) == 0);
    drey_store_txn_end(&rt);
    drey_store_txn_end(&lt);
    cr_assert_geq(drey_store_last_version(rr.store), all[n - 1]);

    drey_commit_destroy(rr.commit);
    drey_method_table_destroy(rr.methods);
    drey_cache_destroy(rr.cache);
    drey_store_destroy(rr.store);
}

/* A write ordered behind an Import that has not applied yet still gets a
 * version above every version the import brings: the counter is raised as
 * the import is ordered, since the write's versions are reserved then. */
Test(chain, a_write_ordered_after_an_import_gets_versions_above_the_imported_ones) {
    fixture_open(&(fixture_opts){.durable = true});
    Drey__Internal__V1__MovedEntry e = DREY__INTERNAL__V1__MOVED_ENTRY__INIT;
    e.cache = (ProtobufCBinaryData){.data = (uint8_t *)"c", .len = 1};
    e.key = (ProtobufCBinaryData){.data = (uint8_t *)"moved", .len = 5};
    e.kind = DREY_VALUE_BYTES;
    e.value = (ProtobufCBinaryData){.data = (uint8_t *)"x", .len = 1};
    e.version = 4000;
    Drey__Internal__V1__MovedEntry *ep = &e;
    Drey__Internal__V1__ImportRequest imp = DREY__INTERNAL__V1__IMPORT_REQUEST__INIT;
    imp.partitions = 4;
    imp.partition = drey_partition_of_entry("c", 1, "moved", 5, 4);
    imp.entries = &ep;
    imp.n_entries = 1;
    imp.min_version = 5000;
    block_writer();
    door *i = submit_via(DREY_PARTITION_IMPORT_PATH, &imp.base,
                         (via){.internal = true, .forwarded_by = "node-a", .peer_id = "node-a"});
    door *d = set((set_args){.key = "moved", .value = "after"});
    cr_assert(!door_answered(i), "the import waits for the disk: %s", drey_error_lookup(i->st.error)->reason);
    cr_assert(!door_answered(d), "the write waits for the disk: %s", drey_error_lookup(d->st.error)->reason);
    release_writer();
    expect_ok(i);
    expect_ok(d);
    Drey__Cache__V1__SetResponse *r = drey__cache__v1__set_response__unpack(NULL, d->resp_len, d->resp);
    cr_assert_not_null(r);
    cr_assert_gt(r->version, 5000, "got %llu", (unsigned long long)r->version);
    drey__cache__v1__set_response__free_unpacked(r, NULL);
    door_free(i);
    door_free(d);
}
