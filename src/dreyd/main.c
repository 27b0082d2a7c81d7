/*
 * dreyd — the drey cache server.
 *
 * Wires the modules together: configuration, the store and the cache
 * service, health, reflection, the request chain, and the gRPC runtime. On
 * SIGTERM or SIGINT it drains: health goes NOT_SERVING (watchers are told),
 * calls are still accepted for the grace period so load balancers can move
 * away, then the server stops accepting, lets in-flight calls finish, and the
 * process exits 0. A second signal cuts the grace period short.
 *
 * A durable node (the default) serves health and reflection while it
 * recovers its data directory; cache calls are refused with RECOVERING and
 * health for "" is NOT_SERVING until recovery ends.
 *
 * `dreyd storage inspect|verify|dump|repair <dir>` are the offline tools.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <grpc/support/log.h>

#include "drey/admin.h"
#include "drey/auth.h"
#include "drey/authz.h"
#include "drey/backpressure.h"
#include "drey/cache.h"
#include "drey/clock.h"
#include "drey/cluster.h"
#include "drey/partition.h"
#include "drey/commit.h"
#include "drey/config.h"
#include "drey/health.h"
#include "drey/log.h"
#include "drey/memory.h"
#include "drey/method.h"
#include "drey/metrics.h"
#include "drey/ops.h"
#include "drey/pipeline.h"
#include "drey/reflect.h"
#include "drey/server.h"
#include "drey/status.h"
#include "drey/storage.h"
#include "drey/store.h"
#include "drey/tenant.h"
#include "drey/timer.h"
#include "drey/version.h"
#include "drey/watch.h"

/* jemalloc's options, read before main runs (MALLOC_CONF in the environment
 * overrides any of them; a build without jemalloc never reads this).
 *
 * jemalloc returns freed pages to the system only as it decays them, and by
 * default only a thread that allocates does that work: an idle node kept
 * every page of its last burst (52 MB resident for 5.8 MB allocated, for as
 * long as it stayed idle). A background thread decays on a timer instead,
 * and a 1 s dirty decay (muzzy 0: purged pages go straight back) returns a
 * burst within a few seconds; tests/bench/idle_rss.py measures it and
 * tests/integration/python/test_idle_memory.py holds it. One thread is
 * enough for the purging and keeps the thread count flat on small nodes. */
const char *malloc_conf = "background_thread:true,max_background_threads:1,dirty_decay_ms:1000,muzzy_decay_ms:0";

/* gRPC core's own log lines, as JSON like everything else on stderr. */
static void grpc_log_to_json(gpr_log_func_args *args) {
    drey_log_level level = args->severity == GPR_LOG_SEVERITY_ERROR ? DREY_LOG_LEVEL_ERROR
                           : args->severity == GPR_LOG_SEVERITY_INFO ? DREY_LOG_LEVEL_INFO
                                                                      : DREY_LOG_LEVEL_DEBUG;
    DREY_LOG_(level, "grpc", DREY_LOG_STR("detail", args->message), DREY_LOG_STR("file", args->file),
              DREY_LOG_INT("line", args->line));
}

/* The README's error table, from the catalogue in src/status/status.c. */
static void print_error_catalogue(FILE *out) {
    size_t n;
    const drey_error_info *e = drey_error_catalogue(&n);
    fprintf(out, "| Reason | gRPC code | Meaning |\n|---|---|---|\n");
    for (size_t i = 0; i < n; i++)
        fprintf(out, "| `%s` | %s | %s |\n", e[i].reason, drey_status_code_name(e[i].code), e[i].message);
}

/* Read by LeakSanitizer in the ASan build, unused otherwise. OpenSSL
 * creates its random generators and its key decoders' provider caches
 * lazily (under grpc's TLS setup, and the PEM checks) and frees them in
 * its own exit handler; a cluster node that reconnected to a restarted
 * peer sometimes (2 runs in 6 of one test) exits with them still there,
 * referenced by nothing of drey's. Only allocations inside those two
 * OpenSSL entry points are excused: anything drey allocates keeps being
 * checked. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) {
    return "leak:RAND_bytes_ex\nleak:OSSL_DECODER_CTX_new_for_pkey\n";
}

/* Waits for SIGTERM/SIGINT for up to timeout_ms (< 0: forever); returns the
 * signal or 0 on timeout. */
static int wait_signal(const sigset_t *set, int64_t timeout_ms) {
    for (;;) {
        int sig;
        if (timeout_ms < 0) {
            if (sigwait(set, &sig) == 0)
                return sig;
            continue;
        }
        struct timespec ts = {.tv_sec = timeout_ms / 1000, .tv_nsec = (timeout_ms % 1000) * 1000000};
        sig = sigtimedwait(set, NULL, &ts);
        if (sig > 0)
            return sig;
        return 0; /* EAGAIN: timed out (EINTR cannot happen: all blocked) */
    }
}

/* "always", "never" or "interval:<duration>". */
static bool parse_fsync(const char *s, drey_fsync_policy *policy, int64_t *interval_ms) {
    *interval_ms = 0;
    if (strcmp(s, "always") == 0) {
        *policy = DREY_FSYNC_ALWAYS;
        return true;
    }
    if (strcmp(s, "never") == 0) {
        *policy = DREY_FSYNC_NEVER;
        return true;
    }
    if (strncmp(s, "interval:", 9) == 0 && drey_config_parse_duration_ms(s + 9, interval_ms) && *interval_ms > 0) {
        *policy = DREY_FSYNC_INTERVAL;
        return true;
    }
    return false;
}

/* host:port as others reach it: the advertised address when given, else
 * the listen address with the port actually bound. */
static void reachable_at(char *out, size_t cap, const char *advertised, const char *listen, int port) {
    if (advertised[0] != '\0') {
        snprintf(out, cap, "%s", advertised);
        return;
    }
    const char *colon = strrchr(listen, ':');
    int hlen = colon != NULL ? (int)(colon - listen) : (int)strlen(listen);
    snprintf(out, cap, "%.*s:%d", hlen, listen, port);
}

static void observe_call(void *ctx, size_t method, int code, int64_t duration_ns) {
    drey_metrics_observe_call(ctx, method, code, duration_ns);
}

static void observe_batch(void *ctx, size_t records, int64_t fsync_us) {
    drey_metrics_observe_batch(ctx, records, fsync_us);
}

static int64_t journal_horizon(void *ctx, int64_t now_ms) {
    return drey_journal_sweep_horizon(ctx, now_ms);
}

/* A token's grants, compiled once and kept with it by auth. */
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

int main(int argc, char **argv, char **envp) {
    if (argc >= 2 && strcmp(argv[1], "storage") == 0)
        return drey_storage_tool(argc - 2, argv + 2, stdout, stderr);

    drey_config cfg;
    drey_config_defaults(&cfg);
    drey_config_help help;
    if (!drey_config_parse(&cfg, argc, argv, 1, envp, stderr, &help)) {
        drey_config_free(&cfg);
        return 2;
    }
    if (help != DREY_CONFIG_HELP_NONE) {
        if (help == DREY_CONFIG_HELP_MARKDOWN)
            drey_config_print_markdown(stdout);
        else if (help == DREY_CONFIG_HELP_ERRORS)
            print_error_catalogue(stdout);
        else if (help == DREY_CONFIG_HELP_VERSION)
            drey_version_print(stdout, "dreyd");
        else
            drey_config_print_help(stdout);
        drey_config_free(&cfg);
        return 0;
    }
    drey_log_level level;
    if (!drey_log_parse_level(cfg.log_level, &level)) {
        fprintf(stderr, "dreyd: --log-level: expected debug, info, warn or error\n");
        drey_config_free(&cfg);
        return 2;
    }
    drey_fsync_policy fsync_policy;
    int64_t fsync_interval_ms;
    if (!parse_fsync(cfg.fsync, &fsync_policy, &fsync_interval_ms)) {
        fprintf(stderr, "dreyd: --fsync: expected always, never or interval:<duration> (e.g. interval:100ms)\n");
        drey_config_free(&cfg);
        return 2;
    }
    if (cfg.journal_max_bytes > 0 && cfg.journal_max_bytes < cfg.segment_bytes) {
        fprintf(stderr, "dreyd: --journal-max-bytes must be 0 or at least --segment-bytes (one segment)\n");
        drey_config_free(&cfg);
        return 2;
    }
    bool clustered = cfg.cluster_etcd[0] != '\0';
    if (clustered && (cfg.internal_listen[0] == '\0' || cfg.internal_tls_cert[0] == '\0' ||
                      cfg.internal_tls_key[0] == '\0' || cfg.internal_tls_ca[0] == '\0')) {
        fprintf(stderr, "dreyd: a cluster node (--cluster-etcd) needs --internal-listen, --internal-tls-cert, "
                        "--internal-tls-key and --internal-tls-ca: peers forward calls only over mutual TLS\n");
        drey_config_free(&cfg);
        return 2;
    }
    drey_evict_policy eviction;
    if (!drey_evict_policy_parse(cfg.eviction, &eviction)) {
        fprintf(stderr, "dreyd: --eviction: expected none, allkeys-lru, allkeys-lfu, volatile-lru or volatile-ttl\n");
        drey_config_free(&cfg);
        return 2;
    }
    drey_log_set_level(level);
    /* First, so every log says what wrote it. */
    DREY_LOG_INFO("dreyd", DREY_LOG_STR("version", drey_version()), DREY_LOG_STR("revision", drey_version_revision()),
                  DREY_LOG_STR("build", drey_version_build()));
    gpr_set_log_function(grpc_log_to_json);
    bool jwt = cfg.jwt_jwks_file[0] != '\0' || cfg.jwt_keys_dir[0] != '\0';
    if (!jwt && !drey_config_listen_is_loopback(cfg.listen) && !cfg.insecure_allow_anonymous_remote) {
        fprintf(stderr, "dreyd: refusing to listen on %s without JWT keys: anyone who reaches it could read and "
                        "write every cache. Configure --jwt-keys-dir or --jwt-jwks-file, listen on loopback, or "
                        "pass --insecure-allow-anonymous-remote for an isolated lab.\n",
                cfg.listen);
        drey_config_free(&cfg);
        return 2;
    }
    char node_id[96];
    if (cfg.node_id[0] != '\0')
        snprintf(node_id, sizeof node_id, "%s", cfg.node_id);
    else if (gethostname(node_id, sizeof node_id) != 0)
        snprintf(node_id, sizeof node_id, "drey");
    node_id[sizeof node_id - 1] = '\0';

    /* Signals are taken synchronously by this thread; every thread created
     * from here on inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    size_t workers = cfg.workers > 0 ? (size_t)cfg.workers : (size_t)(ncpu > 0 ? ncpu : 1);

    char err[512];
    drey_auth *auth = NULL;
    if (jwt) {
        drey_auth_options ao = {
            .jwks_file = cfg.jwt_jwks_file,
            .keys_dir = cfg.jwt_keys_dir,
            .issuer = cfg.jwt_issuer,
            .audience = cfg.jwt_audience,
            .clock_skew_ms = cfg.jwt_clock_skew_ms,
            .max_token_bytes = (size_t)cfg.jwt_max_token_bytes,
            .cache_entries = (size_t)cfg.jwt_cache_entries,
        };
        auth = drey_auth_create(&ao, err, sizeof err);
        if (auth == NULL) {
            DREY_LOG_ERROR("cannot load the JWT keys", DREY_LOG_STR("error", err));
            drey_config_free(&cfg);
            return 2;
        }
        drey_auth_watch(auth, cfg.jwt_reload_interval_ms);
    }
    drey_authz *authz = NULL;
    if (cfg.authz_policy[0] != '\0') {
        authz = drey_authz_create(cfg.authz_policy, err, sizeof err);
        if (authz == NULL) {
            DREY_LOG_ERROR("cannot load the authorization policy", DREY_LOG_STR("error", err));
            drey_auth_destroy(auth);
            drey_config_free(&cfg);
            return 2;
        }
        drey_authz_watch(authz, cfg.authz_reload_interval_ms);
        if (auth != NULL)
            drey_auth_set_attach(auth, &(drey_auth_attach){.make = grants_make, .ref = grants_ref,
                                                           .unref = grants_unref, .current = grants_current,
                                                           .ctx = authz});
    }
    drey_timers *timers = drey_timers_create();
    drey_bp_options bo = {
        .max_inflight = (uint32_t)cfg.max_inflight,
        .max_queued = (uint32_t)cfg.max_queued,
        .max_wait_ms = cfg.queue_max_wait_ms,
        .slowdown_at = (uint32_t)cfg.slowdown_at,
        .slowdown_max_ms = cfg.slowdown_max_delay_ms,
        .node_rate = (double)cfg.node_rate,
        .node_burst = (double)(cfg.node_burst > 0 ? cfg.node_burst : cfg.node_rate),
        .principal_max_inflight = (uint32_t)cfg.principal_max_inflight,
        .principal_max_queued = (uint32_t)cfg.principal_max_queued,
        .principal_rate = (double)cfg.principal_rate,
        .principal_burst = (double)(cfg.principal_burst > 0 ? cfg.principal_burst : cfg.principal_rate),
        .max_principals = (uint32_t)cfg.max_principals,
        .node_id = node_id,
    };
    drey_bp *bp = drey_bp_create(&bo, timers);
    drey_store *store = drey_store_create();
    drey_store_set_policy(store, eviction);
    /* Always: entries keep their tenants through snapshots and the journal
     * whether or not a policy names quotas now. */
    drey_tenants *tenants = drey_tenants_create(store);
    if (authz != NULL)
        drey_tenants_set_limits(tenants, tenant_limit, authz);
    drey_memory_options mo = {.limit_bytes = cfg.memory_limit_bytes, .node_id = node_id, .max_caches = (uint32_t)cfg.max_caches};
    drey_memory *memory = drey_memory_create(&mo, store);
    drey_cache *cache = drey_cache_create(store);
    drey_health *health = drey_health_create();
    drey_metrics *metrics = drey_metrics_create();
    drey_ops *ops = NULL;
    drey_admin_options adm = {
        .metrics_principals = (size_t)cfg.metrics_principals,
        .authz = authz,
        .tenants = authz != NULL ? tenants : NULL,
        .durable = !cfg.ephemeral,
        .fsync_policy = cfg.fsync,
        .memory = memory,
        .backpressure = bp,
        .store = store,
    };
    drey_admin *admin = drey_admin_create(&adm);
    drey_server_options sopts = {
        .listen = cfg.listen,
        .workers = workers,
        .max_recv_message_bytes = cfg.max_recv_message_bytes,
        .tls_cert = cfg.tls_cert,
        .tls_key = cfg.tls_key,
        .tls_client_ca = cfg.tls_client_ca,
    };
    drey_server *server = drey_server_create(&sopts);
    drey_method_table *methods = drey_method_table_create();
    drey_commit_options copts = {
        .store = store,
        .methods = methods,
        .idempotency_retention_ms = cfg.idempotency_retention_ms,
        .partitioned = clustered,
    };
    drey_commit *commit = drey_commit_create(&copts);
    drey_partition_replica *replica = drey_partition_replica_create(commit, memory);
    drey_partition *partitions = drey_partition_create(store);
    drey_pipeline_options popts = {
        .limits = {
            .max_cache_name_bytes = (size_t)cfg.max_cache_name_bytes,
            .max_key_bytes = (size_t)cfg.max_key_bytes,
            .max_value_bytes = (size_t)cfg.max_value_bytes,
            .max_batch = (size_t)cfg.max_batch,
        },
        .methods = methods,
        .commit = commit,
        .auth = auth,
        .auth_required = auth != NULL,
        .authz = authz,
        .tenants = tenants,
        .backpressure = bp,
        .memory = memory,
        .metrics = metrics,
        .node_id = node_id,
        .pipeline_window = (size_t)cfg.pipeline_window,
    };
    drey_pipeline *pipeline = drey_pipeline_create(&popts);
    drey_watch_options wo = {
        .store = store,
        .pipeline = pipeline,
        .max_streams = (uint32_t)cfg.max_watches,
        .max_per_principal = (uint32_t)cfg.principal_max_watches,
        .buffer_bytes = (size_t)cfg.watch_buffer_bytes,
        .history_bytes = (size_t)cfg.watch_history_bytes,
        .history_linger_ms = cfg.watch_history_linger_ms,
        .clustered = clustered,
        .node_id = node_id,
    };
    drey_watch *watch = drey_watch_create(&wo);
    drey_storage *storage = NULL;
    drey_server *internal = NULL;
    drey_cluster *cluster = NULL;
    int internal_port = 0;

    int rc = 0;
    char build_id[160];
    snprintf(build_id, sizeof build_id, "drey %s %s", drey_version(), drey_version_revision());
    if (clustered) {
        drey_server_options io = {
            .listen = cfg.internal_listen,
            .workers = workers,
            /* A peer stream message is a batch of forwarded requests (up to
             * 256 KiB) or one request with its frame: room for either. */
            .max_recv_message_bytes = cfg.max_recv_message_bytes < INT32_MAX - (1 << 20)
                                          ? cfg.max_recv_message_bytes + (1 << 20)
                                          : INT32_MAX,
            .tls_cert = cfg.internal_tls_cert,
            .tls_key = cfg.internal_tls_key,
            .tls_client_ca = cfg.internal_tls_ca,
        };
        internal = drey_server_create(&io);
        drey_cluster_options co = {
            .etcd = cfg.cluster_etcd,
            .etcd_tls = {.ca_file = cfg.cluster_etcd_ca, .cert_file = cfg.cluster_etcd_cert,
                         .key_file = cfg.cluster_etcd_key},
            .etcd_user = cfg.cluster_etcd_user,
            .etcd_password_file = cfg.cluster_etcd_password_file,
            .prefix = cfg.cluster_prefix,
            .node_id = node_id,
            .lease_ttl_s = (cfg.cluster_lease_ttl_ms + 999) / 1000,
            .partitions = (uint32_t)cfg.cluster_partitions,
            .tls_cert = cfg.internal_tls_cert,
            .tls_key = cfg.internal_tls_key,
            .tls_ca = cfg.internal_tls_ca,
            .peer_addresses = cfg.cluster_peer_address,
            .build = build_id,
            .timers = timers,
            .store = store,
            .pipeline = pipeline,
            .methods = methods,
            .commit = commit,
            .move_rate = cfg.cluster_move_rate,
            .max_moves = (uint32_t)cfg.cluster_max_moves,
            .replication_timeout_ms = cfg.replication_timeout_ms,
            .min_in_sync = (uint32_t)cfg.min_in_sync,
            .metrics = metrics,
        };
        cluster = drey_cluster_create(&co, err, sizeof err);
        if (cluster == NULL) {
            DREY_LOG_ERROR("cannot start as a cluster node", DREY_LOG_STR("error", err));
            rc = 1;
            goto out;
        }
    }
    /* Always: a journal written as a cluster node replays anywhere. */
    if (!drey_cache_register(cache, methods) || !drey_partition_register(methods, partitions) ||
        !drey_partition_register_replica(methods, replica) ||
        !drey_health_register(health, methods, server) ||
        !drey_admin_register(admin, methods) || !drey_pipeline_serve(pipeline, server, false) ||
        !drey_watch_register(watch, server) ||
        !drey_reflect_register(server) ||
        (clustered && (!drey_pipeline_serve(pipeline, internal, true) || !drey_watch_register_internal(watch, internal) ||
                       !drey_cluster_register(cluster, server)))) {
        DREY_LOG_ERROR("service registration failed");
        rc = 1;
        goto out;
    }
    const char *method_names[64];
    size_t n_methods = drey_server_method_count(server);
    for (size_t i = 0; i < n_methods && i < 64; i++)
        method_names[i] = drey_server_method_path(server, i);
    drey_metrics_set_methods(metrics, method_names, n_methods < 64 ? n_methods : 64);
    drey_metrics_add_collector(metrics, drey_metrics_collect_process, NULL);
    drey_metrics_add_collector(metrics, drey_admin_collect_metrics, admin);
    drey_metrics_add_collector(metrics, drey_watch_collect_metrics, watch);
    if (authz != NULL) {
        drey_metrics_add_collector(metrics, drey_authz_collect_metrics, authz);
        drey_metrics_add_collector(metrics, drey_tenants_collect_metrics, tenants);
    }
    drey_server_set_call_observer(server, observe_call, metrics);
    /* Health answers from the start; the node is SERVING once recovered. */
    drey_health_set(health, "", DREY_HEALTH_NOT_SERVING);
    drey_health_set(health, "drey.cache.v1.Cache", DREY_HEALTH_NOT_SERVING);
    int port = drey_server_start(server, err, sizeof err);
    if (port == 0) {
        DREY_LOG_ERROR("cannot start", DREY_LOG_STR("error", err), DREY_LOG_STR("listen", cfg.listen));
        rc = 1;
        goto out;
    }
    if (internal != NULL && (internal_port = drey_server_start(internal, err, sizeof err)) == 0) {
        DREY_LOG_ERROR("cannot start the internal listener", DREY_LOG_STR("error", err),
                       DREY_LOG_STR("listen", cfg.internal_listen));
        rc = 1;
        drey_server_shutdown(server, 0);
        goto out;
    }
    int ops_port = 0;
    if (cfg.ops_listen[0] != '\0') {
        drey_ops_options oo = {.listen = cfg.ops_listen, .admin = admin, .metrics = metrics, .auth = auth,
                               .authz = authz};
        ops = drey_ops_start(&oo, err, sizeof err);
        if (ops == NULL) {
            DREY_LOG_ERROR("cannot start", DREY_LOG_STR("error", err));
            rc = 1;
            drey_server_shutdown(server, 0);
            goto out;
        }
        ops_port = drey_ops_port(ops);
    }
    DREY_LOG_INFO("listening", DREY_LOG_STR("listen", cfg.listen), DREY_LOG_INT("port", port),
                  DREY_LOG_INT("ops_port", ops_port), DREY_LOG_INT("internal_port", internal_port),
                  DREY_LOG_UINT("workers", workers), DREY_LOG_INT("pid", getpid()), DREY_LOG_STR("node_id", node_id),
                  DREY_LOG_BOOL("ephemeral", cfg.ephemeral), DREY_LOG_STR("fsync", cfg.ephemeral ? "" : cfg.fsync),
                  DREY_LOG_BOOL("tls", cfg.tls_cert[0] != '\0'), DREY_LOG_BOOL("jwt", auth != NULL),
                  DREY_LOG_STR("eviction", drey_evict_policy_name(eviction)));
    if (!jwt && !drey_config_listen_is_loopback(cfg.listen))
        DREY_LOG_WARN("INSECURE: serving anonymous callers on a non-loopback address",
                      DREY_LOG_STR("listen", cfg.listen));

    if (!cfg.ephemeral) {
        drey_storage_options so = {
            .journal = {
                .dir = cfg.data_dir,
                .io = drey_io_posix(),
                .segment_bytes = (uint64_t)cfg.segment_bytes,
                .fsync = fsync_policy,
                .fsync_interval_ms = fsync_interval_ms,
                .batch_wait_us = cfg.batch_wait_ms * 1000,
                .batch_max_bytes = (size_t)cfg.batch_max_bytes,
                .max_bytes = cfg.journal_max_bytes > 0 ? (uint64_t)cfg.journal_max_bytes : 0,
                .max_queued_records = (uint64_t)cfg.journal_max_queued,
                .max_queued_bytes = (uint64_t)cfg.journal_max_queued_bytes,
            },
            .derive_journal_cap = cfg.journal_max_bytes == DREY_CONFIG_AUTO,
            .snapshot_every_bytes = (uint64_t)cfg.snapshot_every_bytes,
            .snapshot_every_ms = cfg.snapshot_every_ms,
            .retain_snapshots = (unsigned)cfg.retain_snapshots,
        };
        if (drey_storage_open(&so, store, commit, &storage, err, sizeof err) != 0) {
            DREY_LOG_ERROR("recovery failed: the node will not start", DREY_LOG_STR("error", err));
            rc = 1;
            drey_server_shutdown(server, 0);
            goto out;
        }
        drey_pipeline_set_journal(pipeline, drey_storage_journal(storage));
        drey_partition_replica_set_journal(replica, drey_storage_journal(storage));
        drey_journal_set_batch_observer(drey_storage_journal(storage), observe_batch, metrics);
        drey_cache_set_expiry_horizon(cache, journal_horizon, drey_storage_journal(storage));
        drey_admin_set_storage(admin, storage);
    }
    if (cluster != NULL) {
        char advertise[300], internal_at[300];
        reachable_at(advertise, sizeof advertise, cfg.advertise, cfg.listen, port);
        reachable_at(internal_at, sizeof internal_at, cfg.internal_advertise, cfg.internal_listen, internal_port);
        drey_cluster_set_addresses(cluster, advertise, internal_at);
        if (drey_cluster_join(cluster, err, sizeof err) != 0) {
            DREY_LOG_ERROR("cannot join the cluster: the node will not start", DREY_LOG_STR("error", err));
            rc = 1;
            drey_server_shutdown(server, 0);
            drey_server_shutdown(internal, 0);
            goto out;
        }
        if (authz != NULL && drey_cluster_attach_tenants(cluster, tenants, err, sizeof err) != 0) {
            DREY_LOG_ERROR("cannot share tenants' quotas: the node will not start", DREY_LOG_STR("error", err));
            rc = 1;
            drey_server_shutdown(server, 0);
            drey_server_shutdown(internal, 0);
            goto out;
        }
        drey_pipeline_set_route(pipeline, drey_cluster_route, cluster);
        if (drey_cluster_replication_factor(cluster) > 1)
            drey_pipeline_set_replicator(pipeline, &(drey_replicator){.prepare = drey_cluster_replicate_prepare,
                                                                      .appended = drey_cluster_replicate_appended,
                                                                      .memory_room = drey_cluster_replicate_memory_room,
                                                                      .ctx = cluster});
        drey_cluster_attach_watch(cluster, watch);
        drey_admin_set_cluster(admin, cluster);
    }
    /* After recovery: replayed writes are never reported to watchers. */
    drey_watch_start(watch);
    drey_pipeline_set_ready(pipeline, true);
    drey_cache_start_expiry(cache, cfg.expiry_sweep_interval_ms);
    drey_health_set(health, "", DREY_HEALTH_SERVING);
    drey_health_set(health, "drey.cache.v1.Cache", DREY_HEALTH_SERVING);
    DREY_LOG_INFO("serving");

    int sig;
    while ((sig = wait_signal(&sigs, -1)) == SIGHUP) {
        /* Each logs its outcome. */
        if (auth != NULL)
            drey_auth_reload(auth, err, sizeof err);
        if (authz != NULL)
            drey_authz_reload(authz, err, sizeof err);
    }
    /* A cluster node first hands its partitions to the others, serving
     * meanwhile: what it owns when it stops is unavailable until it comes
     * back. */
    if (cluster != NULL)
        drey_cluster_drain(cluster, cfg.cluster_drain_timeout_ms);
    DREY_LOG_INFO("draining", DREY_LOG_STR("signal", strsignal(sig)), DREY_LOG_INT("grace_ms", cfg.drain_grace_ms));
    drey_health_drain(health);
    drey_admin_set_draining(admin);
    int64_t grace_end = drey_mono_ms() + cfg.drain_grace_ms;
    for (;;) {
        int64_t left = grace_end - drey_mono_ms();
        if (left <= 0)
            break;
        sig = wait_signal(&sigs, left);
        if (sig == SIGTERM || sig == SIGINT) {
            DREY_LOG_INFO("second signal: ending the grace period now");
            break;
        }
    }
    DREY_LOG_INFO("stopping", DREY_LOG_INT("timeout_ms", cfg.shutdown_timeout_ms));
    /* Out of the membership first, so peers stop forwarding here; calls in
     * flight still finish. The quota ledger goes before the etcd client. */
    drey_tenants_leave(tenants);
    drey_cluster_leave(cluster);
    /* Streams end now, or the server would wait for them until its timeout. */
    drey_watch_stop(watch);
    drey_server_shutdown(server, cfg.shutdown_timeout_ms);
    if (internal != NULL) {
        drey_pipeline_drain_peers(pipeline);
        drey_server_shutdown(internal, cfg.shutdown_timeout_ms);
    }
    drey_cache_stop_expiry(cache);

out:
    drey_ops_stop(ops);
    /* The journal completes what it holds before the server goes. */
    drey_storage_close(storage);
    drey_server_destroy(server);
    drey_server_destroy(internal);
    drey_watch_destroy(watch); /* after the server: its streams are over */
    drey_tenants_leave(tenants); /* before the etcd client goes (a start that failed after joining) */
    drey_cluster_destroy(cluster);
    drey_pipeline_destroy(pipeline);
    drey_commit_destroy(commit);
    drey_partition_replica_destroy(replica);
    drey_partition_destroy(partitions);
    drey_method_table_destroy(methods);
    drey_admin_destroy(admin);
    drey_health_destroy(health);
    drey_cache_destroy(cache);
    drey_metrics_destroy(metrics);
    drey_memory_destroy(memory);
    drey_store_destroy(store);
    drey_tenants_destroy(tenants); /* the store no longer calls in */
    drey_bp_destroy(bp);
    drey_timers_destroy(timers);
    if (auth != NULL) {
        drey_auth_stop_watch(auth);
        drey_auth_destroy(auth); /* before authz: the token cache holds grants */
    }
    drey_authz_destroy(authz);
    if (rc == 0)
        DREY_LOG_INFO("stopped");
    drey_config_free(&cfg);
    return rc;
}
