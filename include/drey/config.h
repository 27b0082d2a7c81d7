/*
 * config — every setting of dreyd, from one option table.
 *
 * Each option is a command-line flag (--max-key-bytes=1024) and an
 * environment variable with the same name (DREY_MAX_KEY_BYTES=1024); a flag
 * wins over the environment, which wins over the default. `dreyd --help`
 * prints the table and `dreyd --help-markdown` prints the README's option
 * table, which a test keeps in step.
 */
#ifndef DREY_CONFIG_H
#define DREY_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* A numeric option set to its word (journal-max-bytes=auto): "not given",
 * which is not 0. */
#define DREY_CONFIG_AUTO INT64_C(-1)

typedef struct drey_config {
    char *listen;                   /* host:port of the gRPC listener */
    int64_t workers;                /* completion-queue threads; 0 = one per CPU */
    int64_t max_recv_message_bytes; /* larger requests: RESOURCE_EXHAUSTED */
    int64_t max_cache_name_bytes;   /* cache (namespace) name length limit */
    int64_t max_key_bytes;          /* key length limit */
    int64_t max_value_bytes;        /* encoded value size limit */
    int64_t max_batch;              /* keys or entries per GetMany/SetMany */
    int64_t pipeline_window;        /* a Pipeline stream's operations unanswered at once */
    int64_t max_caches;             /* caches with entries at once */
    int64_t drain_grace_ms;         /* NOT_SERVING before refusing new calls */
    int64_t shutdown_timeout_ms;    /* wait for in-flight calls, then cancel */
    int64_t expiry_sweep_interval_ms; /* active expiry cycle period */
    char *log_level;                /* debug, info, warn, error */
    char *data_dir;                 /* the journal, snapshots and manifest */
    bool ephemeral;                 /* memory only: no data directory */
    char *fsync;                    /* always, interval:<duration>, never */
    int64_t segment_bytes;          /* preallocated journal segment size */
    int64_t journal_max_queued, journal_max_queued_bytes; /* bounds of the journal's queue */
    int64_t journal_max_bytes;      /* disk quota of the journal's segments; 0: none; DREY_CONFIG_AUTO:
                                       derived from the data directory's file system */
    int64_t batch_wait_ms;          /* group commit: wait for more records */
    int64_t batch_max_bytes;        /* group commit: batch size bound */
    int64_t snapshot_every_bytes;   /* journal growth that triggers a snapshot */
    int64_t snapshot_every_ms;      /* time that triggers a snapshot */
    int64_t retain_snapshots;       /* snapshots kept */
    int64_t idempotency_retention_ms; /* how long request_id outcomes are kept */
    char *node_id;                  /* QuotaFailure subjects, metrics */
    char *jwt_jwks_file;            /* JWKS key set */
    char *jwt_keys_dir;             /* <kid>.<ALG>.pem / .key files */
    char *jwt_issuer, *jwt_audience;
    int64_t jwt_clock_skew_ms;
    int64_t jwt_max_token_bytes;
    int64_t jwt_cache_entries;
    int64_t jwt_reload_interval_ms;
    bool insecure_allow_anonymous_remote;
    char *authz_policy;             /* the policy file; "" = none (every caller may do everything) */
    int64_t authz_reload_interval_ms;
    char *tls_cert, *tls_key, *tls_client_ca;
    int64_t max_inflight, max_queued, queue_max_wait_ms;
    int64_t slowdown_at, slowdown_max_delay_ms;
    int64_t node_rate, node_burst;
    int64_t principal_max_inflight, principal_max_queued;
    int64_t principal_rate, principal_burst;
    int64_t max_principals;
    int64_t max_watches, principal_max_watches, watch_buffer_bytes, watch_history_bytes, watch_history_linger_ms;
    int64_t memory_limit_bytes;
    char *eviction;                 /* none, allkeys-lru, allkeys-lfu, volatile-lru, volatile-ttl */
    char *ops_listen;               /* the HTTP listener: health, details, metrics */
    int64_t metrics_principals;     /* principals with series of their own; the rest are "other" */
    char *cluster_etcd;             /* etcd endpoints; "" = a single node */
    char *cluster_etcd_ca, *cluster_etcd_cert, *cluster_etcd_key; /* TLS to etcd */
    char *cluster_etcd_user, *cluster_etcd_password_file;         /* etcd's own authentication */
    char *cluster_prefix;           /* the cluster's keys in etcd */
    int64_t cluster_lease_ttl_ms;
    int64_t cluster_start_timeout_ms;
    int64_t cluster_partitions;     /* expected; 0 = the cluster's */
    int64_t cluster_move_rate;      /* bytes per second a move sends */
    int64_t cluster_max_moves;      /* per source node, when controller */
    int64_t replication_timeout_ms;
    int64_t min_in_sync;
    int64_t cluster_drain_timeout_ms;
    char *cluster_peer_address;     /* id=host:port,... dialled instead of the advertised */
    char *internal_listen, *advertise, *internal_advertise;
    char *internal_tls_cert, *internal_tls_key, *internal_tls_ca;
} drey_config;

/* Fills cfg with the defaults of the option table. */
void drey_config_defaults(drey_config *cfg);

/* What --help asked for: the option list, the README's option table
 * (--help-markdown), the README's error catalogue (--help-errors) or the
 * version (--version). */
typedef enum drey_config_help {
    DREY_CONFIG_HELP_NONE,
    DREY_CONFIG_HELP_TEXT,
    DREY_CONFIG_HELP_MARKDOWN,
    DREY_CONFIG_HELP_ERRORS,
    DREY_CONFIG_HELP_VERSION, /* --version */
} drey_config_help;

/* Applies DREY_* variables from envp, then argv[first..argc). Writes a clear
 * message to err and returns false on an unknown option or a bad value. */
bool drey_config_parse(drey_config *cfg, int argc, char **argv, int first, char **envp, FILE *err,
                       drey_config_help *help);

void drey_config_free(drey_config *cfg);

void drey_config_print_help(FILE *out);
void drey_config_print_markdown(FILE *out);

/* Whether a listen address (host:port) can only be reached from this host,
 * so dreyd may serve anonymous callers there: "localhost", an IPv4 literal
 * in 127.0.0.0/8 or [::1]. Names are not resolved: a name that merely
 * starts with "127." (127.0.0.1.example.net) may resolve anywhere. */
bool drey_config_listen_is_loopback(const char *listen);

/* "64MiB", "4k", "1024" -> bytes; "250ms", "5s", "2m", "1h", "100" (ms) -> ms. */
bool drey_config_parse_bytes(const char *s, int64_t *out);
bool drey_config_parse_duration_ms(const char *s, int64_t *out);

#endif
