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
#include "drey/cache.h"
#include "drey/commit.h"
#include "drey/config.h"
#include "drey/health.h"
#include "drey/log.h"
#include "drey/pipeline.h"
#include "drey/reflect.h"
#include "drey/server.h"
#include "drey/status.h"
#include "drey/storage.h"
#include "drey/store.h"

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

static int64_t journal_horizon(void *ctx, int64_t now_ms) {
    return drey_journal_sweep_horizon(ctx, now_ms);
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
    drey_log_set_level(level);
    gpr_set_log_function(grpc_log_to_json);

    /* Signals are taken synchronously by this thread; every thread created
     * from here on inherits the mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    size_t workers = cfg.workers > 0 ? (size_t)cfg.workers : (size_t)(ncpu > 0 ? ncpu : 1);

    drey_store *store = drey_store_create();
    drey_cache *cache = drey_cache_create(store);
    drey_health *health = drey_health_create();
    drey_admin *admin = drey_admin_create(!cfg.ephemeral);
    drey_server_options sopts = {
        .listen = cfg.listen,
        .workers = workers,
        .max_recv_message_bytes = cfg.max_recv_message_bytes,
    };
    drey_server *server = drey_server_create(&sopts);
    drey_commit_options copts = {
        .store = store,
        .server = server,
        .idempotency_retention_ms = cfg.idempotency_retention_ms,
    };
    drey_commit *commit = drey_commit_create(&copts);
    drey_pipeline_options popts = {
        .limits = {
            .max_cache_name_bytes = (size_t)cfg.max_cache_name_bytes,
            .max_key_bytes = (size_t)cfg.max_key_bytes,
            .max_value_bytes = (size_t)cfg.max_value_bytes,
            .max_batch = (size_t)cfg.max_batch,
        },
        .commit = commit,
    };
    drey_pipeline *pipeline = drey_pipeline_create(&popts);
    drey_server_set_dispatch(server, drey_pipeline_dispatch, pipeline);
    drey_storage *storage = NULL;

    int rc = 0;
    if (!drey_cache_register(cache, server) || !drey_health_register(health, server) ||
        !drey_reflect_register(server) || !drey_admin_register(admin, server)) {
        DREY_LOG_ERROR("service registration failed");
        rc = 1;
        goto out;
    }
    /* Health answers from the start; the node is SERVING once recovered. */
    drey_health_set(health, "", DREY_HEALTH_NOT_SERVING);
    drey_health_set(health, "drey.cache.v1.Cache", DREY_HEALTH_NOT_SERVING);
    char err[512];
    int port = drey_server_start(server, err, sizeof err);
    if (port == 0) {
        DREY_LOG_ERROR("cannot start", DREY_LOG_STR("error", err), DREY_LOG_STR("listen", cfg.listen));
        rc = 1;
        goto out;
    }
    DREY_LOG_INFO("listening", DREY_LOG_STR("listen", cfg.listen), DREY_LOG_INT("port", port),
                  DREY_LOG_UINT("workers", workers), DREY_LOG_INT("pid", getpid()),
                  DREY_LOG_BOOL("ephemeral", cfg.ephemeral), DREY_LOG_STR("fsync", cfg.ephemeral ? "" : cfg.fsync));

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
            },
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
        drey_cache_set_expiry_horizon(cache, journal_horizon, drey_storage_journal(storage));
        drey_admin_set_storage(admin, storage);
    }
    drey_pipeline_set_ready(pipeline, true);
    drey_cache_start_expiry(cache, cfg.expiry_sweep_interval_ms);
    drey_health_set(health, "", DREY_HEALTH_SERVING);
    drey_health_set(health, "drey.cache.v1.Cache", DREY_HEALTH_SERVING);
    DREY_LOG_INFO("serving");

    int sig = wait_signal(&sigs, -1);
    DREY_LOG_INFO("draining", DREY_LOG_STR("signal", strsignal(sig)), DREY_LOG_INT("grace_ms", cfg.drain_grace_ms));
    drey_health_drain(health);
    if (wait_signal(&sigs, cfg.drain_grace_ms) != 0)
        DREY_LOG_INFO("second signal: ending the grace period now");
    DREY_LOG_INFO("stopping", DREY_LOG_INT("timeout_ms", cfg.shutdown_timeout_ms));
    drey_server_shutdown(server, cfg.shutdown_timeout_ms);
    drey_cache_stop_expiry(cache);

out:
    /* The journal completes what it holds before the server goes. */
    drey_storage_close(storage);
    drey_server_destroy(server);
    drey_pipeline_destroy(pipeline);
    drey_commit_destroy(commit);
    drey_admin_destroy(admin);
    drey_health_destroy(health);
    drey_cache_destroy(cache);
    drey_store_destroy(store);
    if (rc == 0)
        DREY_LOG_INFO("stopped");
    drey_config_free(&cfg);
    return rc;
}
