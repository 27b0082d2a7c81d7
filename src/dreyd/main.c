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
 *
 * main is the list of the node's phases, each a function below: configure
 * (the options, checked, and the keys), build (the chain and the
 * services), the cluster's parts, register the services, listen, recover
 * (the data directory), join (the cluster), serve, drain and stop, tear
 * down. A phase that fails leaves what was built for tear_down.
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

/* gRPC core's own log lines, as JSON like everything else on stderr. It
 * says the same thing again at each retry (a peer whose certificate does
 * not match: three times a second): one text at most every
 * GRPC_REPEAT_MS, the next one saying how many were held back. Static:
 * never freed: gRPC may log until the process ends. */
#define GRPC_REPEAT_MS 10000
static drey_log_repeat grpc_repeats = DREY_LOG_REPEAT_INIT(GRPC_REPEAT_MS);

static void grpc_log_to_json(gpr_log_func_args *args) {
    drey_log_level level = args->severity == GPR_LOG_SEVERITY_ERROR ? DREY_LOG_LEVEL_ERROR
                           : args->severity == GPR_LOG_SEVERITY_INFO ? DREY_LOG_LEVEL_INFO
                                                                      : DREY_LOG_LEVEL_DEBUG;
    if (level < drey_log_min_level)
        return;
    uint64_t repeated = 0;
    if (!drey_log_repeat_admit(&grpc_repeats, args->message, drey_mono_ms(), &repeated))
        return;
    if (repeated > 0)
        DREY_LOG_(level, "grpc", DREY_LOG_STR("detail", args->message), DREY_LOG_STR("file", args->file),
                  DREY_LOG_INT("line", args->line), DREY_LOG_UINT("repeated", repeated));
    else
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

/* Everything the node runs, built in this order and torn down in reverse. */
typedef struct node {
    drey_config cfg;
    /* What the options say, checked. */
    drey_log_level log_level;
    drey_fsync_policy fsync_policy;
    int64_t fsync_interval_ms;
    drey_evict_policy eviction;
    bool clustered, jwt;
    char node_id[96];
    size_t workers;
    sigset_t signals; /* taken by the main thread only: blocked in every other */
    /* The parts. */
    drey_auth *auth;
    drey_authz *authz; /* NULL: no --authz-policy */
    drey_timers *timers;
    drey_bp *bp;
    drey_store *store;
    drey_tenants *tenants;
    drey_memory *memory;
    drey_cache *cache;
    drey_health *health;
    drey_metrics *metrics;
    drey_admin *admin;
    drey_server *server;
    drey_method_table *methods;
    drey_commit *commit;
    drey_partition_replica *replica;
    drey_partition *partitions;
    drey_pipeline *pipeline;
    drey_watch *watch;
    drey_server *internal; /* cluster nodes: the peers' mutual-TLS listener */
    drey_cluster *cluster;
    drey_ops *ops;
    drey_storage *storage;
    int port, internal_port;
    char err[512];
} node;

/* A bad option: the message on stderr, exit status 2. */
static int usage_error(const char *message) {
    fprintf(stderr, "dreyd: %s\n", message);
    return 2;
}

#define GO_ON (-1)

/* Parses and checks the options, starts the log, blocks the signals and
 * loads the JWT keys and the authorization policy. GO_ON, or the exit
 * status: 0 after --help or --version, 2 on a bad option. */
static int configure(node *n, int argc, char **argv, char **envp) {
    drey_config *cfg = &n->cfg;
    drey_config_defaults(cfg);
    drey_config_help help;
    if (!drey_config_parse(cfg, argc, argv, 1, envp, stderr, &help))
        return 2;
    if (help != DREY_CONFIG_HELP_NONE) {
        if (help == DREY_CONFIG_HELP_MARKDOWN)
            drey_config_print_markdown(stdout);
        else if (help == DREY_CONFIG_HELP_ERRORS)
            print_error_catalogue(stdout);
        else if (help == DREY_CONFIG_HELP_VERSION)
            drey_version_print(stdout, "dreyd");
        else
            drey_config_print_help(stdout);
        return 0;
    }
    if (!drey_log_parse_level(cfg->log_level, &n->log_level))
        return usage_error("--log-level: expected debug, info, warn or error");
    if (!parse_fsync(cfg->fsync, &n->fsync_policy, &n->fsync_interval_ms))
        return usage_error("--fsync: expected always, never or interval:<duration> (e.g. interval:100ms)");
    if (cfg->journal_max_bytes > 0 && cfg->journal_max_bytes < cfg->segment_bytes)
        return usage_error("--journal-max-bytes must be 0 or at least --segment-bytes (one segment)");
    n->clustered = cfg->cluster_etcd[0] != '\0';
    if (n->clustered && (cfg->internal_listen[0] == '\0' || cfg->internal_tls_cert[0] == '\0' ||
                         cfg->internal_tls_key[0] == '\0' || cfg->internal_tls_ca[0] == '\0'))
        return usage_error("a cluster node (--cluster-etcd) needs --internal-listen, --internal-tls-cert, "
                           "--internal-tls-key and --internal-tls-ca: peers forward calls only over mutual TLS");
    if (!drey_evict_policy_parse(cfg->eviction, &n->eviction))
        return usage_error("--eviction: expected none, allkeys-lru, allkeys-lfu, volatile-lru or volatile-ttl");
    drey_log_set_level(n->log_level);
    /* First, so every log says what wrote it. */
    DREY_LOG_INFO("dreyd", DREY_LOG_STR("version", drey_version()), DREY_LOG_STR("revision", drey_version_revision()),
                  DREY_LOG_STR("build", drey_version_build()));
    gpr_set_log_function(grpc_log_to_json);
    n->jwt = cfg->jwt_jwks_file[0] != '\0' || cfg->jwt_keys_dir[0] != '\0';
    if (!n->jwt && !drey_config_listen_is_loopback(cfg->listen) && !cfg->insecure_allow_anonymous_remote) {
        fprintf(stderr, "dreyd: refusing to listen on %s without JWT keys: anyone who reaches it could read and "
                        "write every cache. Configure --jwt-keys-dir or --jwt-jwks-file, listen on loopback, or "
                        "pass --insecure-allow-anonymous-remote for an isolated lab.\n",
                cfg->listen);
        return 2;
    }
    if (cfg->node_id[0] != '\0')
        snprintf(n->node_id, sizeof n->node_id, "%s", cfg->node_id);
    else if (gethostname(n->node_id, sizeof n->node_id) != 0)
        snprintf(n->node_id, sizeof n->node_id, "drey");
    n->node_id[sizeof n->node_id - 1] = '\0';

    /* Signals are taken synchronously by this thread; every thread created
     * from here on inherits the mask. */
    sigemptyset(&n->signals);
    sigaddset(&n->signals, SIGTERM);
    sigaddset(&n->signals, SIGINT);
    sigaddset(&n->signals, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &n->signals, NULL);
    signal(SIGPIPE, SIG_IGN);

    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    n->workers = cfg->workers > 0 ? (size_t)cfg->workers : (size_t)(ncpu > 0 ? ncpu : 1);
    if (n->jwt) {
        drey_auth_options ao = {
            .jwks_file = cfg->jwt_jwks_file,
            .keys_dir = cfg->jwt_keys_dir,
            .issuer = cfg->jwt_issuer,
            .audience = cfg->jwt_audience,
            .clock_skew_ms = cfg->jwt_clock_skew_ms,
            .max_token_bytes = (size_t)cfg->jwt_max_token_bytes,
            .cache_entries = (size_t)cfg->jwt_cache_entries,
        };
        n->auth = drey_auth_create(&ao, n->err, sizeof n->err);
        if (n->auth == NULL) {
            DREY_LOG_ERROR("cannot load the JWT keys", DREY_LOG_STR("error", n->err));
            return 2;
        }
        drey_auth_watch(n->auth, cfg->jwt_reload_interval_ms);
    }
    if (cfg->authz_policy[0] != '\0') {
        n->authz = drey_authz_create(cfg->authz_policy, n->err, sizeof n->err);
        if (n->authz == NULL) {
            DREY_LOG_ERROR("cannot load the authorization policy", DREY_LOG_STR("error", n->err));
            drey_auth_destroy(n->auth);
            n->auth = NULL;
            return 2;
        }
        drey_authz_watch(n->authz, cfg->authz_reload_interval_ms);
        if (n->auth != NULL)
            drey_auth_set_attach(n->auth, &(drey_auth_attach){.make = grants_make, .ref = grants_ref,
                                                              .unref = grants_unref, .current = grants_current,
                                                              .ctx = n->authz});
    }
    return GO_ON;
}

/* The chain and the services around the store: nothing listens yet. */
static void build(node *n) {
    const drey_config *cfg = &n->cfg;
    n->timers = drey_timers_create();
    drey_bp_options bo = {
        .max_inflight = (uint32_t)cfg->max_inflight,
        .max_queued = (uint32_t)cfg->max_queued,
        .max_wait_ms = cfg->queue_max_wait_ms,
        .slowdown_at = (uint32_t)cfg->slowdown_at,
        .slowdown_max_ms = cfg->slowdown_max_delay_ms,
        .node_rate = (double)cfg->node_rate,
        .node_burst = (double)(cfg->node_burst > 0 ? cfg->node_burst : cfg->node_rate),
        .principal_max_inflight = (uint32_t)cfg->principal_max_inflight,
        .principal_max_queued = (uint32_t)cfg->principal_max_queued,
        .principal_rate = (double)cfg->principal_rate,
        .principal_burst = (double)(cfg->principal_burst > 0 ? cfg->principal_burst : cfg->principal_rate),
        .max_principals = (uint32_t)cfg->max_principals,
        .node_id = n->node_id,
    };
    n->bp = drey_bp_create(&bo, n->timers);
    n->store = drey_store_create();
    drey_store_set_policy(n->store, n->eviction);
    /* Always: entries keep their tenants through snapshots and the journal
     * whether or not a policy names quotas now. */
    n->tenants = drey_tenants_create(n->store);
    if (n->authz != NULL)
        drey_tenants_set_limits(n->tenants, tenant_limit, n->authz);
    drey_memory_options mo = {
        .limit_bytes = cfg->memory_limit_bytes, .node_id = n->node_id, .max_caches = (uint32_t)cfg->max_caches};
    n->memory = drey_memory_create(&mo, n->store);
    n->cache = drey_cache_create(n->store);
    n->health = drey_health_create();
    n->metrics = drey_metrics_create();
    drey_admin_options adm = {
        .metrics_principals = (size_t)cfg->metrics_principals,
        .authz = n->authz,
        .tenants = n->authz != NULL ? n->tenants : NULL,
        .durable = !cfg->ephemeral,
        .fsync_policy = cfg->fsync,
        .memory = n->memory,
        .backpressure = n->bp,
        .store = n->store,
    };
    n->admin = drey_admin_create(&adm);
    drey_server_options sopts = {
        .listen = cfg->listen,
        .workers = n->workers,
        .max_recv_message_bytes = cfg->max_recv_message_bytes,
        .tls_cert = cfg->tls_cert,
        .tls_key = cfg->tls_key,
        .tls_client_ca = cfg->tls_client_ca,
    };
    n->server = drey_server_create(&sopts);
    n->methods = drey_method_table_create();
    drey_commit_options copts = {
        .store = n->store,
        .methods = n->methods,
        .idempotency_retention_ms = cfg->idempotency_retention_ms,
        .partitioned = n->clustered,
    };
    n->commit = drey_commit_create(&copts);
    n->replica = drey_partition_replica_create(n->commit, n->memory);
    n->partitions = drey_partition_create(n->store);
    drey_pipeline_options popts = {
        .limits = {
            .max_cache_name_bytes = (size_t)cfg->max_cache_name_bytes,
            .max_key_bytes = (size_t)cfg->max_key_bytes,
            .max_value_bytes = (size_t)cfg->max_value_bytes,
            .max_batch = (size_t)cfg->max_batch,
        },
        .methods = n->methods,
        .commit = n->commit,
        .auth = n->auth,
        .auth_required = n->auth != NULL,
        .authz = n->authz,
        .tenants = n->tenants,
        .backpressure = n->bp,
        .memory = n->memory,
        .metrics = n->metrics,
        .node_id = n->node_id,
        .pipeline_window = (size_t)cfg->pipeline_window,
    };
    n->pipeline = drey_pipeline_create(&popts);
    drey_watch_options wo = {
        .store = n->store,
        .pipeline = n->pipeline,
        .max_streams = (uint32_t)cfg->max_watches,
        .max_per_principal = (uint32_t)cfg->principal_max_watches,
        .buffer_bytes = (size_t)cfg->watch_buffer_bytes,
        .history_bytes = (size_t)cfg->watch_history_bytes,
        .history_linger_ms = cfg->watch_history_linger_ms,
        .clustered = n->clustered,
        .node_id = n->node_id,
    };
    n->watch = drey_watch_create(&wo);
}

/* A cluster node's internal listener and its cluster (not joined yet); 0,
 * or 1 when the cluster cannot be set up. */
/* Joining: waits up to ms before trying etcd again; false once SIGTERM or
 * SIGINT asks the node to stop (a pod deleted while etcd is away must not
 * wait out its grace period). */
static bool pause_unless_stopped(void *ctx, int64_t ms) {
    node *n = ctx;
    int64_t until = drey_mono_ms() + ms;
    for (int64_t left = ms; left > 0; left = until - drey_mono_ms()) {
        int sig = wait_signal(&n->signals, left);
        if (sig == SIGTERM || sig == SIGINT)
            return false;
        /* SIGHUP: the keys and the policy are read again when serving */
    }
    return true;
}

static int build_cluster(node *n) {
    const drey_config *cfg = &n->cfg;
    drey_server_options io = {
        .listen = cfg->internal_listen,
        .workers = n->workers,
        /* A peer stream message is a batch of forwarded requests (up to
         * 256 KiB) or one request with its frame: room for either. */
        .max_recv_message_bytes = cfg->max_recv_message_bytes < INT32_MAX - (1 << 20)
                                      ? cfg->max_recv_message_bytes + (1 << 20)
                                      : INT32_MAX,
        .tls_cert = cfg->internal_tls_cert,
        .tls_key = cfg->internal_tls_key,
        .tls_client_ca = cfg->internal_tls_ca,
    };
    n->internal = drey_server_create(&io);
    char build_id[160];
    snprintf(build_id, sizeof build_id, "drey %s %s", drey_version(), drey_version_revision());
    drey_cluster_options co = {
        .etcd = cfg->cluster_etcd,
        .etcd_tls = {.ca_file = cfg->cluster_etcd_ca, .cert_file = cfg->cluster_etcd_cert,
                     .key_file = cfg->cluster_etcd_key},
        .etcd_user = cfg->cluster_etcd_user,
        .etcd_password_file = cfg->cluster_etcd_password_file,
        .prefix = cfg->cluster_prefix,
        .node_id = n->node_id,
        .lease_ttl_s = (cfg->cluster_lease_ttl_ms + 999) / 1000,
        .partitions = (uint32_t)cfg->cluster_partitions,
        .tls_cert = cfg->internal_tls_cert,
        .tls_key = cfg->internal_tls_key,
        .tls_ca = cfg->internal_tls_ca,
        .peer_addresses = cfg->cluster_peer_address,
        .build = build_id,
        .timers = n->timers,
        .store = n->store,
        .pipeline = n->pipeline,
        .methods = n->methods,
        .commit = n->commit,
        .replica = n->replica,
        .move_rate = cfg->cluster_move_rate,
        .max_moves = (uint32_t)cfg->cluster_max_moves,
        .replication_timeout_ms = cfg->replication_timeout_ms,
        .min_in_sync = (uint32_t)cfg->min_in_sync,
        .metrics = n->metrics,
        .start_timeout_ms = cfg->cluster_start_timeout_ms,
        .pause = pause_unless_stopped,
        .pause_ctx = n,
    };
    n->cluster = drey_cluster_create(&co, n->err, sizeof n->err);
    if (n->cluster == NULL) {
        DREY_LOG_ERROR("cannot start as a cluster node", DREY_LOG_STR("error", n->err));
        return 1;
    }
    return 0;
}

/* The methods of every service, on the listeners and in the chain's table
 * (always all of them: a journal written as a cluster node replays
 * anywhere), and the metrics that name them; health answers from here on,
 * NOT_SERVING until the node has recovered. 0, or 1 on a failure. */
static int register_services(node *n) {
    if (!drey_cache_register(n->cache, n->methods) || !drey_partition_register(n->methods, n->partitions) ||
        !drey_partition_register_replica(n->methods, n->replica) ||
        !drey_health_register(n->health, n->methods, n->server) || !drey_admin_register(n->admin, n->methods) ||
        !drey_pipeline_serve(n->pipeline, n->server, false) || !drey_watch_register(n->watch, n->server) ||
        !drey_reflect_register(n->server) ||
        (n->clustered &&
         (!drey_pipeline_serve(n->pipeline, n->internal, true) || !drey_watch_register_internal(n->watch, n->internal) ||
          !drey_cluster_register(n->cluster, n->server)))) {
        DREY_LOG_ERROR("service registration failed");
        return 1;
    }
    const char *method_names[64];
    size_t n_methods = drey_server_method_count(n->server);
    for (size_t i = 0; i < n_methods && i < 64; i++)
        method_names[i] = drey_server_method_path(n->server, i);
    drey_metrics_set_methods(n->metrics, method_names, n_methods < 64 ? n_methods : 64);
    drey_metrics_add_collector(n->metrics, drey_metrics_collect_process, NULL);
    drey_metrics_add_collector(n->metrics, drey_admin_collect_metrics, n->admin);
    drey_metrics_add_collector(n->metrics, drey_watch_collect_metrics, n->watch);
    if (n->authz != NULL) {
        drey_metrics_add_collector(n->metrics, drey_authz_collect_metrics, n->authz);
        drey_metrics_add_collector(n->metrics, drey_tenants_collect_metrics, n->tenants);
    }
    drey_server_set_call_observer(n->server, observe_call, n->metrics);
    drey_health_set(n->health, "", DREY_HEALTH_NOT_SERVING);
    drey_health_set(n->health, "drey.cache.v1.Cache", DREY_HEALTH_NOT_SERVING);
    return 0;
}

/* The public listener, the internal one (a cluster node) and the ops
 * listener; 0, or 1 when one cannot start. */
static int listen_all(node *n) {
    const drey_config *cfg = &n->cfg;
    n->port = drey_server_start(n->server, n->err, sizeof n->err);
    if (n->port == 0) {
        DREY_LOG_ERROR("cannot start", DREY_LOG_STR("error", n->err), DREY_LOG_STR("listen", cfg->listen));
        return 1;
    }
    if (n->internal != NULL && (n->internal_port = drey_server_start(n->internal, n->err, sizeof n->err)) == 0) {
        DREY_LOG_ERROR("cannot start the internal listener", DREY_LOG_STR("error", n->err),
                       DREY_LOG_STR("listen", cfg->internal_listen));
        drey_server_shutdown(n->server, 0);
        return 1;
    }
    int ops_port = 0;
    if (cfg->ops_listen[0] != '\0') {
        drey_ops_options oo = {
            .listen = cfg->ops_listen, .admin = n->admin, .metrics = n->metrics, .auth = n->auth, .authz = n->authz};
        n->ops = drey_ops_start(&oo, n->err, sizeof n->err);
        if (n->ops == NULL) {
            DREY_LOG_ERROR("cannot start", DREY_LOG_STR("error", n->err));
            drey_server_shutdown(n->server, 0);
            return 1;
        }
        ops_port = drey_ops_port(n->ops);
    }
    DREY_LOG_INFO("listening", DREY_LOG_STR("listen", cfg->listen), DREY_LOG_INT("port", n->port),
                  DREY_LOG_INT("ops_port", ops_port), DREY_LOG_INT("internal_port", n->internal_port),
                  DREY_LOG_UINT("workers", n->workers), DREY_LOG_INT("pid", getpid()),
                  DREY_LOG_STR("node_id", n->node_id), DREY_LOG_BOOL("ephemeral", cfg->ephemeral),
                  DREY_LOG_STR("fsync", cfg->ephemeral ? "" : cfg->fsync),
                  DREY_LOG_BOOL("tls", cfg->tls_cert[0] != '\0'), DREY_LOG_BOOL("jwt", n->auth != NULL),
                  DREY_LOG_STR("eviction", drey_evict_policy_name(n->eviction)));
    if (!n->jwt && !drey_config_listen_is_loopback(cfg->listen))
        DREY_LOG_WARN("INSECURE: serving anonymous callers on a non-loopback address",
                      DREY_LOG_STR("listen", cfg->listen));
    return 0;
}

/* A durable node's data directory: the snapshot and the journal replayed
 * into the store, the journal then taking writes; 0, or 1 when recovery
 * fails. */
static int recover(node *n) {
    const drey_config *cfg = &n->cfg;
    if (cfg->ephemeral)
        return 0;
    drey_storage_options so = {
        .journal = {
            .dir = cfg->data_dir,
            .io = drey_io_posix(),
            .segment_bytes = (uint64_t)cfg->segment_bytes,
            .fsync = n->fsync_policy,
            .fsync_interval_ms = n->fsync_interval_ms,
            .batch_wait_us = cfg->batch_wait_ms * 1000,
            .batch_max_bytes = (size_t)cfg->batch_max_bytes,
            .max_bytes = cfg->journal_max_bytes > 0 ? (uint64_t)cfg->journal_max_bytes : 0,
            .max_queued_records = (uint64_t)cfg->journal_max_queued,
            .max_queued_bytes = (uint64_t)cfg->journal_max_queued_bytes,
        },
        .derive_journal_cap = cfg->journal_max_bytes == DREY_CONFIG_AUTO,
        .snapshot_every_bytes = (uint64_t)cfg->snapshot_every_bytes,
        .snapshot_every_ms = cfg->snapshot_every_ms,
        .retain_snapshots = (unsigned)cfg->retain_snapshots,
    };
    if (drey_storage_open(&so, n->store, n->commit, &n->storage, n->err, sizeof n->err) != 0) {
        DREY_LOG_ERROR("recovery failed: the node will not start", DREY_LOG_STR("error", n->err));
        drey_server_shutdown(n->server, 0);
        return 1;
    }
    drey_journal *journal = drey_storage_journal(n->storage);
    drey_pipeline_set_journal(n->pipeline, journal);
    drey_partition_replica_set_journal(n->replica, journal);
    drey_journal_set_batch_observer(journal, observe_batch, n->metrics);
    drey_cache_set_expiry_horizon(n->cache, journal_horizon, journal);
    drey_admin_set_storage(n->admin, n->storage);
    return 0;
}

/* A cluster node joins at the addresses peers and clients reach it at
 * (with a policy, its tenants' quotas shared through etcd), and the chain
 * routes and replicates from then on; 0, 1 when it cannot join, or
 * STOPPED when a signal asked it to stop while it waited for etcd. */
#define STOPPED (-2)
static int join(node *n) {
    const drey_config *cfg = &n->cfg;
    if (n->cluster == NULL)
        return 0;
    char advertise[300], internal_at[300];
    reachable_at(advertise, sizeof advertise, cfg->advertise, cfg->listen, n->port);
    reachable_at(internal_at, sizeof internal_at, cfg->internal_advertise, cfg->internal_listen, n->internal_port);
    drey_cluster_set_addresses(n->cluster, advertise, internal_at);
    int rc = drey_cluster_join(n->cluster, n->err, sizeof n->err);
    if (rc == DREY_CLUSTER_STOPPED) {
        DREY_LOG_INFO("asked to stop before the cluster could be joined", DREY_LOG_STR("reason", n->err));
        drey_server_shutdown(n->server, 0);
        drey_server_shutdown(n->internal, 0);
        return STOPPED;
    }
    bool joined = rc == 0;
    if (!joined ||
        (n->authz != NULL && drey_cluster_attach_tenants(n->cluster, n->tenants, n->err, sizeof n->err) != 0)) {
        DREY_LOG_ERROR(joined ? "cannot share tenants' quotas: the node will not start"
                              : "cannot join the cluster: the node will not start",
                       DREY_LOG_STR("error", n->err));
        drey_server_shutdown(n->server, 0);
        drey_server_shutdown(n->internal, 0);
        return 1;
    }
    drey_pipeline_set_route(n->pipeline, drey_cluster_route, n->cluster);
    if (drey_cluster_replication_factor(n->cluster) > 1)
        drey_pipeline_set_replicator(n->pipeline, &(drey_replicator){.prepare = drey_cluster_replicate_prepare,
                                                                     .appended = drey_cluster_replicate_appended,
                                                                     .released = drey_cluster_replicate_released,
                                                                     .memory_room = drey_cluster_replicate_memory_room,
                                                                     .ctx = n->cluster});
    drey_cluster_attach_watch(n->cluster, n->watch);
    drey_admin_set_cluster(n->admin, n->cluster);
    return 0;
}

/* SERVING, until SIGTERM or SIGINT (SIGHUP reloads the JWT keys and the
 * authorization policy); returns that signal. */
static int serve(node *n) {
    /* After recovery: replayed writes are never reported to watchers. */
    drey_watch_start(n->watch);
    drey_pipeline_set_ready(n->pipeline, true);
    drey_cache_start_expiry(n->cache, n->cfg.expiry_sweep_interval_ms);
    drey_health_set(n->health, "", DREY_HEALTH_SERVING);
    drey_health_set(n->health, "drey.cache.v1.Cache", DREY_HEALTH_SERVING);
    DREY_LOG_INFO("serving");
    int sig;
    while ((sig = wait_signal(&n->signals, -1)) == SIGHUP) {
        /* Each logs its outcome. */
        if (n->auth != NULL)
            drey_auth_reload(n->auth, n->err, sizeof n->err);
        if (n->authz != NULL)
            drey_authz_reload(n->authz, n->err, sizeof n->err);
    }
    return sig;
}

/* The drain: a cluster node hands its partitions to the others, health
 * goes NOT_SERVING for the grace period (a second signal ends it), then
 * the node leaves the membership, streams end and calls in flight finish
 * within the shutdown timeout. */
static void drain_and_stop(node *n, int sig) {
    const drey_config *cfg = &n->cfg;
    /* Serving meanwhile: what a node owns when it stops is unavailable
     * until it comes back. */
    if (n->cluster != NULL)
        drey_cluster_drain(n->cluster, cfg->cluster_drain_timeout_ms);
    DREY_LOG_INFO("draining", DREY_LOG_STR("signal", strsignal(sig)), DREY_LOG_INT("grace_ms", cfg->drain_grace_ms));
    drey_health_drain(n->health);
    drey_admin_set_draining(n->admin);
    int64_t grace_end = drey_mono_ms() + cfg->drain_grace_ms;
    for (;;) {
        int64_t left = grace_end - drey_mono_ms();
        if (left <= 0)
            break;
        sig = wait_signal(&n->signals, left);
        if (sig == SIGTERM || sig == SIGINT) {
            DREY_LOG_INFO("second signal: ending the grace period now");
            break;
        }
    }
    DREY_LOG_INFO("stopping", DREY_LOG_INT("timeout_ms", cfg->shutdown_timeout_ms));
    /* Out of the membership first, so peers stop forwarding here; calls in
     * flight still finish. The quota ledger goes before the etcd client. */
    drey_tenants_leave(n->tenants);
    drey_cluster_leave(n->cluster);
    /* Streams end now, or the server would wait for them until its timeout. */
    drey_watch_stop(n->watch);
    drey_server_shutdown(n->server, cfg->shutdown_timeout_ms);
    if (n->internal != NULL) {
        drey_pipeline_drain_peers(n->pipeline);
        drey_server_shutdown(n->internal, cfg->shutdown_timeout_ms);
    }
    drey_cache_stop_expiry(n->cache);
}

/* Frees what was built, whatever phase the node reached. */
static void tear_down(node *n) {
    drey_ops_stop(n->ops);
    /* The journal completes what it holds before the server goes. */
    drey_storage_close(n->storage);
    drey_server_destroy(n->server);
    drey_server_destroy(n->internal);
    drey_watch_destroy(n->watch); /* after the server: its streams are over */
    drey_tenants_leave(n->tenants); /* before the etcd client goes (a start that failed after joining) */
    drey_cluster_destroy(n->cluster);
    drey_pipeline_destroy(n->pipeline);
    drey_commit_destroy(n->commit);
    drey_partition_replica_destroy(n->replica);
    drey_partition_destroy(n->partitions);
    drey_method_table_destroy(n->methods);
    drey_admin_destroy(n->admin);
    drey_health_destroy(n->health);
    drey_cache_destroy(n->cache);
    drey_metrics_destroy(n->metrics);
    drey_memory_destroy(n->memory);
    drey_store_destroy(n->store);
    drey_tenants_destroy(n->tenants); /* the store no longer calls in */
    drey_bp_destroy(n->bp);
    drey_timers_destroy(n->timers);
    if (n->auth != NULL) {
        drey_auth_stop_watch(n->auth);
        drey_auth_destroy(n->auth); /* before authz: the token cache holds grants */
    }
    drey_authz_destroy(n->authz);
}

int main(int argc, char **argv, char **envp) {
    if (argc >= 2 && strcmp(argv[1], "storage") == 0)
        return drey_storage_tool(argc - 2, argv + 2, stdout, stderr);
    static node n; /* large (the options, every part's handle): not on the stack */
    int rc = configure(&n, argc, argv, envp);
    if (rc == GO_ON) {
        build(&n);
        rc = n.clustered ? build_cluster(&n) : 0;
        if (rc == 0)
            rc = register_services(&n);
        if (rc == 0)
            rc = listen_all(&n);
        if (rc == 0)
            rc = recover(&n);
        if (rc == 0)
            rc = join(&n);
        if (rc == 0)
            drain_and_stop(&n, serve(&n));
        tear_down(&n);
        if (rc == STOPPED)
            rc = 0;
        if (rc == 0)
            DREY_LOG_INFO("stopped");
    }
    drey_config_free(&n.cfg);
    return rc;
}
