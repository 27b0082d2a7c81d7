/*
 * config — the option table and its parser; see include/drey/config.h.
 *
 * The table is the single description of every setting: the parser, --help,
 * the README table and the environment all read it. Adding a setting is one
 * field in drey_config plus one row here.
 */
#include "drey/config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"

typedef enum {
    OPT_STRING,
    OPT_ADDRESS, /* host:port (or unix:PATH); empty where the default is */
    OPT_INT,
    OPT_BYTES,
    OPT_DURATION,
    OPT_BOOL,
} opt_type;

typedef struct option {
    const char *name;     /* flag name; the variable is DREY_ + NAME */
    opt_type type;
    size_t offset;        /* field in drey_config */
    const char *fallback; /* default, in the same syntax a user writes */
    int64_t min, max;     /* accepted range for numeric types */
    const char *help;     /* one sentence: what it does and the trade-off */
} option;

/* Numeric options that also take one word, which sets the field to a value
 * outside its range: journal-max-bytes=auto ("not given") is not 0 ("none"). */
static const struct {
    const char *option, *word;
    int64_t value;
} words[] = {
    {"journal-max-bytes", "auto", DREY_CONFIG_AUTO},
};

static const char *word_of(const option *o, int64_t *value) {
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
        if (strcmp(words[i].option, o->name) == 0) {
            *value = words[i].value;
            return words[i].word;
        }
    }
    return NULL;
}

#define FIELD(f) offsetof(drey_config, f)
#define MIB (1024 * 1024)

static const option options[] = {
    {"listen", OPT_ADDRESS, FIELD(listen), "127.0.0.1:50051", 0, 0,
     "Address of the gRPC listener (host:port; port 0 picks a free one)."},
    {"workers", OPT_INT, FIELD(workers), "0", 0, 256,
     "Completion-queue threads serving calls; 0 means one per CPU."},
    {"max-recv-message-bytes", OPT_BYTES, FIELD(max_recv_message_bytes), "8MiB", 1024, INT32_MAX,
     "Largest request message accepted; larger ones get RESOURCE_EXHAUSTED from the transport."},
    {"max-cache-name-bytes", OPT_INT, FIELD(max_cache_name_bytes), "128", 1, 255,
     "Longest cache (namespace) name, in bytes of [A-Za-z0-9._-]."},
    {"max-key-bytes", OPT_INT, FIELD(max_key_bytes), "1024", 1, 65535,
     "Longest key, in bytes of UTF-8 without control characters."},
    {"max-value-bytes", OPT_BYTES, FIELD(max_value_bytes), "4MiB", 1, 64 * MIB,
     "Largest value (its encoded size); larger ones get INVALID_ARGUMENT PAYLOAD_TOO_LARGE."},
    {"max-caches", OPT_INT, FIELD(max_caches), "100000", 1, 1000000,
     "Caches (namespaces) with entries at once; a write that would open one more is refused with "
     "RESOURCE_EXHAUSTED TOO_MANY_CACHES. A cache with no entries left counts no more."},
    {"max-batch", OPT_INT, FIELD(max_batch), "1000", 1, 100000,
     "Most keys in a GetMany and entries in a SetMany."},
    {"pipeline-window", OPT_INT, FIELD(pipeline_window), "128", 1, 4096,
     "Operations of one Pipeline stream read and not yet answered; at the window the node stops reading the "
     "stream, so HTTP/2 flow control holds the client back. Each operation also takes its own backpressure slot."},
    {"drain-grace", OPT_DURATION, FIELD(drain_grace_ms), "5s", 0, 3600 * 1000,
     "On SIGTERM/SIGINT: how long health reports NOT_SERVING while calls are still accepted, so load balancers "
     "move away first."},
    {"shutdown-timeout", OPT_DURATION, FIELD(shutdown_timeout_ms), "10s", 0, 3600 * 1000,
     "After the grace period: how long in-flight calls may run before they are cancelled."},
    {"expiry-sweep-interval", OPT_DURATION, FIELD(expiry_sweep_interval_ms), "100ms", 1, 60 * 1000,
     "Period of the active expiry cycle that frees expired entries nobody reads; each cycle uses at most a "
     "quarter of it."},
    {"log-level", OPT_STRING, FIELD(log_level), "info", 0, 0, "Least severe log level written: debug, info, warn or error."},
    {"data-dir", OPT_STRING, FIELD(data_dir), "./drey-data", 0, 0,
     "Data directory: journal segments, snapshots and the CURRENT manifest. Copying a stopped node's directory "
     "moves its data."},
    {"ephemeral", OPT_BOOL, FIELD(ephemeral), "false", 0, 0,
     "Keep data in memory only: no journal, no snapshots, nothing survives a restart."},
    {"fsync", OPT_STRING, FIELD(fsync), "always", 0, 0,
     "When a write is durable. always: acknowledged after fdatasync (nothing acknowledged is lost); "
     "interval:<duration>: acknowledged after write(2), synced that often (a crash of the machine, not just the "
     "process, loses up to that much); never: the kernel decides (development only)."},
    {"segment-bytes", OPT_BYTES, FIELD(segment_bytes), "64MiB", 64 * 1024, (int64_t)1 << 40,
     "Size of a journal segment, preallocated when it is created (appending to preallocated space syncs faster)."},
    {"journal-max-bytes", OPT_BYTES, FIELD(journal_max_bytes), "auto", 0, (int64_t)1 << 50,
     "Hard cap on the journal's segment bytes on disk, preallocation included (not snapshots). A write that would "
     "cross it is refused with RESOURCE_EXHAUSTED JOURNAL_DISK_QUOTA while the node stays up; a snapshot (taken by "
     "itself once the journal passes 80% of the cap, unless --snapshot-every-bytes=0) and its compaction free "
     "space and writes resume by themselves. auto: derived from the data directory's file system at start, every "
     "second and after each snapshot, so that a full disk never fails the journal: the journal may grow by half of "
     "the space available beyond a reserve (5% of the file system, 1MiB to 1GiB) and the next snapshot (estimated "
     "as the larger of the last snapshot and the store's accounted bytes); the other half is left for that "
     "snapshot to grow as the journal does. 0: no cap (a full disk then fails writes with UNAVAILABLE "
     "JOURNAL_WRITE_FAILED). A number: at least --segment-bytes."},
    {"journal-max-queued", OPT_INT, FIELD(journal_max_queued), "16384", 1, 100000000,
     "Writes that may wait for the journal's writer at once; more get RESOURCE_EXHAUSTED JOURNAL_QUEUE_FULL "
     "before anything is written, so callers that give up early cannot pile up work."},
    {"journal-max-queued-bytes", OPT_BYTES, FIELD(journal_max_queued_bytes), "256MiB", 4096, (int64_t)1 << 40,
     "Bytes of writes that may wait for the journal's writer at once (JOURNAL_QUEUE_FULL beyond; a single larger "
     "write still goes when the queue is empty)."},
    {"batch-wait", OPT_DURATION, FIELD(batch_wait_ms), "0", 0, 1000,
     "Group commit: how long the journal waits for more writes before writing a batch (a batch also closes when the "
     "previous sync ends); 0 adds no latency."},
    {"batch-max-bytes", OPT_BYTES, FIELD(batch_max_bytes), "16MiB", 4096, (int64_t)1 << 30,
     "Group commit: a batch closes at this many bytes."},
    {"snapshot-every-bytes", OPT_BYTES, FIELD(snapshot_every_bytes), "256MiB", 0, (int64_t)1 << 50,
     "Take a snapshot after the journal has grown this much since the last one (0: never by size)."},
    {"snapshot-every", OPT_DURATION, FIELD(snapshot_every_ms), "1h", 0, (int64_t)366 * 24 * 3600 * 1000,
     "Take a snapshot this long after the last one if anything was written meanwhile (0: never by time)."},
    {"retain-snapshots", OPT_INT, FIELD(retain_snapshots), "2", 1, 100,
     "Snapshots kept; journal segments the newest one covers are deleted."},
    {"idempotency-retention", OPT_DURATION, FIELD(idempotency_retention_ms), "15m", 1000,
     (int64_t)7 * 24 * 3600 * 1000,
     "How long the outcome of a write with a request_id is remembered, so a retry returns it instead of applying "
     "again."},
    {"node-id", OPT_STRING, FIELD(node_id), "", 0, 0,
     "This node's name in quota errors (QuotaFailure subject node:<id>) and metrics; empty means the host name."},
    {"jwt-jwks-file", OPT_STRING, FIELD(jwt_jwks_file), "", 0, 0,
     "JWKS file of the keys that sign bearer tokens (each key needs kid and alg). With any JWT keys configured, "
     "every cache and admin call needs a valid token."},
    {"jwt-keys-dir", OPT_STRING, FIELD(jwt_keys_dir), "", 0, 0,
     "Directory of token keys: <kid>.<ALG>.pem (RS256/384/512, ES256/384/512 public keys) and <kid>.<ALG>.key "
     "(HS256/384/512 secrets). Reloaded on SIGHUP and when the files change."},
    {"jwt-issuer", OPT_STRING, FIELD(jwt_issuer), "", 0, 0, "Required iss claim; empty: not checked."},
    {"jwt-audience", OPT_STRING, FIELD(jwt_audience), "", 0, 0, "Required aud claim; empty: not checked."},
    {"jwt-clock-skew", OPT_DURATION, FIELD(jwt_clock_skew_ms), "60s", 0, 3600 * 1000,
     "Clock difference tolerated when checking exp, nbf and iat."},
    {"jwt-max-token-bytes", OPT_BYTES, FIELD(jwt_max_token_bytes), "8KiB", 256, 1 << 20,
     "Longest bearer token accepted (TOKEN_TOO_LARGE beyond)."},
    {"jwt-cache-entries", OPT_INT, FIELD(jwt_cache_entries), "10000", 16, 10000000,
     "Verified tokens remembered until they expire, so a signature is checked once per token, not per call."},
    {"jwt-reload-interval", OPT_DURATION, FIELD(jwt_reload_interval_ms), "2s", 100, 3600 * 1000,
     "How often the key files are checked for changes."},
    {"insecure-allow-anonymous-remote", OPT_BOOL, FIELD(insecure_allow_anonymous_remote), "false", 0, 0,
     "DANGER: allow listening on a non-loopback address without JWT keys, so anyone who can reach the port can "
     "read and write every cache. For isolated lab setups only."},
    {"authz-policy", OPT_STRING, FIELD(authz_policy), "", 0, 0,
     "JSON file of roles, bindings from token claims to roles, and tenant memory quotas (docs/security.md): each "
     "request must be granted its verb on its cache and keys. Reloaded on SIGHUP and when the file changes (one "
     "that does not load keeps the policy in force). Empty: no policy, every caller may do everything."},
    {"authz-reload-interval", OPT_DURATION, FIELD(authz_reload_interval_ms), "2s", 10, 3600 * 1000,
     "How often the policy file is checked for changes."},
    {"tls-cert", OPT_STRING, FIELD(tls_cert), "", 0, 0,
     "PEM certificate chain: serve TLS instead of plaintext. Re-read when the file changes."},
    {"tls-key", OPT_STRING, FIELD(tls_key), "", 0, 0, "PEM private key of --tls-cert."},
    {"tls-client-ca", OPT_STRING, FIELD(tls_client_ca), "", 0, 0,
     "PEM CA bundle: require client certificates it signed (mutual TLS)."},
    {"cluster-etcd", OPT_STRING, FIELD(cluster_etcd), "", 0, 0,
     "etcd endpoints (comma-separated http://host:port or https://host:port) of the cluster this node joins; "
     "empty: a single node. "
     "The cluster must exist (`drey cluster init`)."},
    {"cluster-etcd-ca", OPT_STRING, FIELD(cluster_etcd_ca), "", 0, 0,
     "PEM CA bundle that signs etcd's serving certificates, for https:// endpoints (empty: the system's roots). "
     "Re-read when the file changes."},
    {"cluster-etcd-cert", OPT_STRING, FIELD(cluster_etcd_cert), "", 0, 0,
     "PEM client certificate for etcd's --client-cert-auth (with --cluster-etcd-key). Re-read when it changes."},
    {"cluster-etcd-key", OPT_STRING, FIELD(cluster_etcd_key), "", 0, 0, "PEM private key of --cluster-etcd-cert."},
    {"cluster-etcd-user", OPT_STRING, FIELD(cluster_etcd_user), "", 0, 0,
     "etcd user (etcd's own authentication, `etcdctl auth enable`); its token is renewed when it expires."},
    {"cluster-etcd-password-file", OPT_STRING, FIELD(cluster_etcd_password_file), "", 0, 0,
     "File holding the etcd user's password (one line); read at each authentication, so a rotation needs no "
     "restart."},
    {"cluster-prefix", OPT_STRING, FIELD(cluster_prefix), "drey/", 0, 0,
     "Where the cluster's keys live in etcd; several clusters can share one etcd under different prefixes."},
    {"cluster-lease-ttl", OPT_DURATION, FIELD(cluster_lease_ttl_ms), "5s", 2000, 3600 * 1000,
     "Lease of this node's membership, kept alive on a stream: a node that stops renewing it leaves the "
     "membership this long after (etcd's minimum is 2s)."},
    {"cluster-start-timeout", OPT_DURATION, FIELD(cluster_start_timeout_ms), "5m", 0, 24 * 3600 * 1000,
     "At start, how long a node keeps trying an etcd that does not answer (backing off up to 10 s between "
     "attempts, one log line each) before it exits: under Kubernetes etcd may come up after the nodes. 0: "
     "one attempt."},
    {"cluster-partitions", OPT_INT, FIELD(cluster_partitions), "0", 0, 65536,
     "Partitions this node expects the cluster to have; it refuses to join one with another count. 0: any."},
    {"cluster-move-rate", OPT_BYTES, FIELD(cluster_move_rate), "64MiB", 64 * 1024, (int64_t)1 << 40,
     "Bytes per second this node sends while moving a partition to another node (a join, a drain)."},
    {"cluster-max-moves", OPT_INT, FIELD(cluster_max_moves), "2", 0, 64,
     "When this node is the controller: partitions planned to move off any one node at a time. 0: it plans "
     "none (the table stays as it is; moves already planned finish)."},
    {"cluster-drain-timeout", OPT_DURATION, FIELD(cluster_drain_timeout_ms), "60s", 0, 3600 * 1000,
     "On SIGTERM a cluster node first moves its partitions to the others, for up to this long (fit it in the "
     "pod's terminationGracePeriodSeconds with --drain-grace), then drains and leaves. 0: leave at once."},
    {"cluster-peer-address", OPT_STRING, FIELD(cluster_peer_address), "", 0, 0,
     "ID=HOST:PORT[,...]: dial these peers there instead of at the internal address they advertise (a sidecar, "
     "a NAT); their certificate is still checked against the id."},
    {"replication-timeout", OPT_DURATION, FIELD(replication_timeout_ms), "1s", 10, 60 * 1000,
     "A partition's primary takes a backup that has not acknowledged a write within this out of the "
     "partition's in-sync set (an etcd write), and the write completes without it."},
    {"min-in-sync", OPT_INT, FIELD(min_in_sync), "1", 1, 3,
     "Copies of a partition (its primary included) that must be in sync for it to take writes; below, writes "
     "are refused UNAVAILABLE NOT_ENOUGH_REPLICAS. 1: availability first (a primary alone takes writes)."},
    {"internal-listen", OPT_ADDRESS, FIELD(internal_listen), "", 0, 0,
     "host:port of the internal listener peers forward calls to (mutual TLS only; required with --cluster-etcd)."},
    {"advertise", OPT_ADDRESS, FIELD(advertise), "", 0, 0,
     "host:port clients reach this node's public listener at (a StatefulSet pod's DNS name); empty: --listen."},
    {"internal-advertise", OPT_ADDRESS, FIELD(internal_advertise), "", 0, 0,
     "host:port peers reach the internal listener at; empty: --internal-listen."},
    {"internal-tls-cert", OPT_STRING, FIELD(internal_tls_cert), "", 0, 0,
     "PEM certificate of this node for the internal listener and its calls to peers; its SAN or CN must be the "
     "node id. Re-read when the file changes."},
    {"internal-tls-key", OPT_STRING, FIELD(internal_tls_key), "", 0, 0, "PEM private key of --internal-tls-cert."},
    {"internal-tls-ca", OPT_STRING, FIELD(internal_tls_ca), "", 0, 0,
     "PEM CA that signs every node's internal certificate (pinned: peers must present one it signed)."},
    {"max-inflight", OPT_INT, FIELD(max_inflight), "256", 1, 1000000,
     "Calls running at once on the node; more wait in the queue."},
    {"max-queued", OPT_INT, FIELD(max_queued), "128", 0, 1000000,
     "Calls waiting for a slot; beyond it: RESOURCE_EXHAUSTED QUEUE_FULL."},
    {"queue-max-wait", OPT_DURATION, FIELD(queue_max_wait_ms), "250ms", 0, 3600 * 1000,
     "Longest wait in the queue: RESOURCE_EXHAUSTED QUEUE_TIMEOUT after it (or DEADLINE_EXCEEDED at the call's "
     "deadline, if sooner)."},
    {"slowdown-at", OPT_INT, FIELD(slowdown_at), "192", 0, 1000000,
     "Running calls from which each newly admitted call is held back, linearly more up to --slowdown-max-delay at "
     "--max-inflight, so overload shows as latency before refusals."},
    {"slowdown-max-delay", OPT_DURATION, FIELD(slowdown_max_delay_ms), "10ms", 0, 60 * 1000,
     "The hold-back at --max-inflight (0: no slowdown)."},
    {"node-rate", OPT_INT, FIELD(node_rate), "0", 0, 100000000,
     "Node rate limit, calls per second (token bucket; 0: none): RESOURCE_EXHAUSTED NODE_RATE_LIMIT beyond."},
    {"node-burst", OPT_INT, FIELD(node_burst), "0", 0, 100000000, "Node token bucket size (0: one second of --node-rate)."},
    {"principal-max-inflight", OPT_INT, FIELD(principal_max_inflight), "64", 1, 1000000,
     "Calls one principal (jwt:<sub> or conn:<connection>) may have running."},
    {"principal-max-queued", OPT_INT, FIELD(principal_max_queued), "64", 0, 1000000,
     "Calls one principal may have waiting; beyond: RESOURCE_EXHAUSTED PRINCIPAL_CONCURRENCY_LIMIT."},
    {"principal-rate", OPT_INT, FIELD(principal_rate), "0", 0, 100000000,
     "Per-principal rate limit, calls per second (0: none): RESOURCE_EXHAUSTED PRINCIPAL_RATE_LIMIT beyond."},
    {"principal-burst", OPT_INT, FIELD(principal_burst), "0", 0, 100000000,
     "Per-principal token bucket size (0: one second of --principal-rate)."},
    {"max-principals", OPT_INT, FIELD(max_principals), "10000", 16, 10000000,
     "Principals tracked at once; idle ones are forgotten first, so a flood of new names cannot exhaust memory."},
    {"max-watches", OPT_INT, FIELD(max_watches), "10000", 1, 10000000,
     "Watch streams open on the node at once; beyond: RESOURCE_EXHAUSTED NODE_WATCH_LIMIT. Each may pin up to "
     "--watch-buffer-bytes for a reader that is behind, so this bounds that memory with connection principals "
     "(anyone may open connections)."},
    {"principal-max-watches", OPT_INT, FIELD(principal_max_watches), "64", 1, 1000000,
     "Watch streams one principal may have open at once; beyond: RESOURCE_EXHAUSTED PRINCIPAL_WATCH_LIMIT. A "
     "watch takes a --max-inflight slot only while it is set up."},
    {"watch-buffer-bytes", OPT_BYTES, FIELD(watch_buffer_bytes), "1MiB", 1024, (int64_t)1 << 34,
     "Events one Watch stream may hold for a reader that is behind (at least one is always held); past it the "
     "buffer is emptied and the reader gets one RESYNC_REQUIRED. More absorbs longer stalls at that memory per "
     "stream."},
    {"watch-history-bytes", OPT_BYTES, FIELD(watch_history_bytes), "16MiB", 0, (int64_t)1 << 40,
     "Recent change events kept so a Watch can resume after the last event it saw (resume_after); older "
     "positions get RESYNC_REQUIRED HISTORY_UNAVAILABLE. 0: no resuming."},
    {"watch-history-linger", OPT_DURATION, FIELD(watch_history_linger_ms), "60s", 0, 24 * 3600 * 1000,
     "How long changes are still recorded after the last Watch closed, so a client that reconnects within it "
     "resumes; after it, recording stops (writes then cost nothing extra) and older positions cannot resume."},
    {"ops-listen", OPT_ADDRESS, FIELD(ops_listen), "127.0.0.1:9090", 0, 0,
     "Address of the operators' HTTP listener: /health/live, /health/ready, /health/ready/details, /metrics "
     "(details and metrics need a JWT from outside loopback); empty: none."},
    {"metrics-principals", OPT_INT, FIELD(metrics_principals), "10", 0, 1000,
     "Principals with series of their own in drey_principal_admitted_total and drey_principal_rejected_total: the "
     "busiest ones (calls admitted plus refused); every other principal is summed in principal=\"other\", so "
     "connection principals (conn:<id>, one per connection) cannot grow the exposition."},
    {"memory-limit", OPT_BYTES, FIELD(memory_limit_bytes), "0", 0, (int64_t)1 << 50,
     "Memory for entries; 0: 80% of the cgroup limit or of RAM. High at 80% and critical at 95% of it; writes "
     "that would grow past critical get RESOURCE_EXHAUSTED MEMORY_PRESSURE."},
    {"eviction", OPT_STRING, FIELD(eviction), "none", 0, 0,
     "What a write that would pass the critical memory level does. none: it is refused (MEMORY_PRESSURE), the "
     "cache only holds what clients put; allkeys-lru, allkeys-lfu: it first evicts the least recently or least "
     "frequently used entries (sampled, as Redis does); volatile-lru, volatile-ttl: only entries with an expiry, "
     "least recently used or soonest to expire first (entries without one are never evicted). Evictions are "
     "journaled with the write; MEMORY_PRESSURE remains when nothing evictable is left."},
};

#define N_OPTIONS (sizeof options / sizeof options[0])

static const char *type_name(opt_type t) {
    switch (t) {
    case OPT_STRING: return "string";
    case OPT_ADDRESS: return "host:port";
    case OPT_INT: return "int";
    case OPT_BYTES: return "bytes";
    case OPT_DURATION: return "duration";
    case OPT_BOOL: return "bool";
    }
    return "?";
}

/* host:port with a port of 0-65535 (a host may be a bracketed IPv6
 * address), or unix:PATH. gRPC would take "localhost" alone as port 443
 * and the ops listener would fail later: refused here, with the reason. */
static bool address_ok(const char *v) {
    if (v[0] == '\0' || strncmp(v, "unix:", 5) == 0)
        return true;
    const char *colon = strrchr(v, ':');
    if (colon == NULL || colon == v || colon[1] == '\0' || strlen(colon + 1) > 5)
        return false;
    if (strchr(v, ':') != colon && (v[0] != '[' || colon[-1] != ']'))
        return false; /* an IPv6 address without brackets: where is the port? */
    for (const char *d = colon + 1; *d != '\0'; d++) {
        if (*d < '0' || *d > '9')
            return false;
    }
    return atoi(colon + 1) <= 65535;
}

bool drey_config_listen_is_loopback(const char *listen) {
    const char *colon = strrchr(listen, ':');
    size_t n = colon != NULL ? (size_t)(colon - listen) : strlen(listen);
    char host[64];
    if (n >= sizeof host)
        return false;
    memcpy(host, listen, n);
    host[n] = '\0';
    if (strcmp(host, "localhost") == 0)
        return true;
    struct in6_addr a6;
    if (n >= 2 && host[0] == '[' && host[n - 1] == ']') {
        host[n - 1] = '\0';
        return inet_pton(AF_INET6, host + 1, &a6) == 1 && IN6_IS_ADDR_LOOPBACK(&a6);
    }
    struct in_addr a4;
    return inet_pton(AF_INET, host, &a4) == 1 && (ntohl(a4.s_addr) >> 24) == 127;
}

typedef struct unit {
    const char *suffix;
    int64_t mult;
} unit;

/* A non-negative number followed by one of the units' suffixes (compared
 * ignoring case or not), in the smallest unit; false on anything else or
 * an overflow. */
static bool parse_with_units(const char *s, const unit *units, size_t n_units, bool any_case, int64_t *out) {
    errno = 0;
    char *end;
    long long n = strtoll(s, &end, 10);
    if (end == s || errno != 0 || n < 0)
        return false;
    for (size_t i = 0; i < n_units; i++) {
        if ((any_case ? strcasecmp(end, units[i].suffix) : strcmp(end, units[i].suffix)) == 0) {
            if (n > INT64_MAX / units[i].mult)
                return false;
            *out = n * units[i].mult;
            return true;
        }
    }
    return false;
}

bool drey_config_parse_bytes(const char *s, int64_t *out) {
    static const unit units[] = {
        {"", 1},           {"b", 1},           {"k", 1000},       {"kb", 1000},      {"kib", 1024},
        {"m", 1000000},    {"mb", 1000000},    {"mib", 1 << 20},  {"g", 1000000000}, {"gb", 1000000000},
        {"gib", 1 << 30},  {"ki", 1024},       {"mi", 1 << 20},   {"gi", 1 << 30},
    };
    return parse_with_units(s, units, sizeof units / sizeof units[0], true, out);
}

bool drey_config_parse_duration_ms(const char *s, int64_t *out) {
    static const unit units[] = {{"", 1}, {"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}};
    return parse_with_units(s, units, sizeof units / sizeof units[0], false, out);
}

static bool parse_bool(const char *s, bool *out) {
    if (strcmp(s, "true") == 0 || strcmp(s, "1") == 0 || strcmp(s, "yes") == 0) {
        *out = true;
        return true;
    }
    if (strcmp(s, "false") == 0 || strcmp(s, "0") == 0 || strcmp(s, "no") == 0) {
        *out = false;
        return true;
    }
    return false;
}

/* Sets one option from text; `origin` names the flag or variable in errors. */
static bool set_option(drey_config *cfg, const option *o, const char *value, const char *origin, FILE *err) {
    char *base = (char *)cfg + o->offset;
    int64_t n = 0;
    bool ok = true;
    switch (o->type) {
    case OPT_ADDRESS:
        if (!address_ok(value)) {
            fprintf(err, "dreyd: %s: expected host:port (e.g. 127.0.0.1:50051, [::1]:50051, 0.0.0.0:0), got \"%s\"\n",
                    origin, value);
            return false;
        }
        __attribute__((fallthrough)); /* stored as a string */
    case OPT_STRING: {
        char **slot = (char **)(void *)base;
        free(*slot);
        *slot = drey_xstrdup(value);
        return true;
    }
    case OPT_BOOL: {
        bool b;
        if (!parse_bool(value, &b)) {
            fprintf(err, "dreyd: %s: expected true or false\n", origin);
            return false;
        }
        *(bool *)(void *)base = b;
        return true;
    }
    case OPT_INT: {
        errno = 0;
        char *end;
        long long v = strtoll(value, &end, 10);
        ok = end != value && *end == '\0' && errno == 0;
        n = v;
        break;
    }
    case OPT_BYTES:
        if (word_of(o, &n) != NULL && strcmp(value, word_of(o, &n)) == 0) {
            *(int64_t *)(void *)base = n;
            return true;
        }
        ok = drey_config_parse_bytes(value, &n);
        break;
    case OPT_DURATION: ok = drey_config_parse_duration_ms(value, &n); break;
    }
    if (!ok) {
        if (word_of(o, &n) != NULL)
            fprintf(err, "dreyd: %s: expected %s or %s, e.g. 64MiB\n", origin, type_name(o->type), word_of(o, &n));
        else
            fprintf(err, "dreyd: %s: expected %s, e.g. %s\n", origin, type_name(o->type), o->fallback);
        return false;
    }
    if (n < o->min || n > o->max) {
        fprintf(err, "dreyd: %s: must be between %lld and %lld\n", origin, (long long)o->min, (long long)o->max);
        return false;
    }
    *(int64_t *)(void *)base = n;
    return true;
}

void drey_config_defaults(drey_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    for (size_t i = 0; i < N_OPTIONS; i++) {
        if (!set_option(cfg, &options[i], options[i].fallback, options[i].name, stderr))
            abort(); /* a bad default is a bug in the table */
    }
}

static const option *find_option(const char *name, size_t len) {
    for (size_t i = 0; i < N_OPTIONS; i++) {
        if (strlen(options[i].name) == len && strncmp(options[i].name, name, len) == 0)
            return &options[i];
    }
    return NULL;
}

static void env_name(const option *o, char *buf, size_t cap) {
    size_t j = (size_t)snprintf(buf, cap, "DREY_");
    for (const char *p = o->name; *p != '\0' && j + 1 < cap; p++)
        buf[j++] = *p == '-' ? '_' : (char)toupper((unsigned char)*p);
    buf[j] = '\0';
}

bool drey_config_parse(drey_config *cfg, int argc, char **argv, int first, char **envp, FILE *err,
                       drey_config_help *help) {
    *help = DREY_CONFIG_HELP_NONE;
    for (size_t i = 0; i < N_OPTIONS && envp != NULL; i++) {
        char var[96];
        env_name(&options[i], var, sizeof var);
        size_t vlen = strlen(var);
        for (char **e = envp; *e != NULL; e++) {
            if (strncmp(*e, var, vlen) == 0 && (*e)[vlen] == '=' &&
                !set_option(cfg, &options[i], *e + vlen + 1, var, err))
                return false;
        }
    }
    for (int i = first; i < argc; i++) {
        const char *arg = argv[i];
        if (strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0) {
            *help = DREY_CONFIG_HELP_TEXT;
            continue;
        }
        if (strcmp(arg, "--help-markdown") == 0) {
            *help = DREY_CONFIG_HELP_MARKDOWN;
            continue;
        }
        if (strcmp(arg, "--help-errors") == 0) {
            *help = DREY_CONFIG_HELP_ERRORS;
            continue;
        }
        if (strcmp(arg, "--version") == 0) {
            *help = DREY_CONFIG_HELP_VERSION;
            continue;
        }
        if (strncmp(arg, "--", 2) != 0) {
            fprintf(err, "dreyd: unexpected argument (options start with --); see dreyd --help\n");
            return false;
        }
        const char *name = arg + 2;
        const char *eq = strchr(name, '=');
        size_t nlen = eq != NULL ? (size_t)(eq - name) : strlen(name);
        const option *o = find_option(name, nlen);
        if (o == NULL) {
            fprintf(err, "dreyd: unknown option --%.*s; see dreyd --help\n", (int)nlen, name);
            return false;
        }
        const char *value;
        if (eq != NULL) {
            value = eq + 1;
        } else if (o->type == OPT_BOOL) {
            value = "true";
        } else if (i + 1 < argc) {
            value = argv[++i];
        } else {
            fprintf(err, "dreyd: --%s needs a value\n", o->name);
            return false;
        }
        char origin[96];
        snprintf(origin, sizeof origin, "--%s", o->name);
        if (!set_option(cfg, o, value, origin, err))
            return false;
    }
    return true;
}

void drey_config_free(drey_config *cfg) {
    for (size_t i = 0; i < N_OPTIONS; i++) {
        if (options[i].type == OPT_STRING || options[i].type == OPT_ADDRESS) {
            char **slot = (char **)(void *)((char *)cfg + options[i].offset);
            free(*slot);
            *slot = NULL;
        }
    }
}

void drey_config_print_help(FILE *out) {
    fprintf(out, "usage: dreyd [--option=value | --option value ...]\n"
                 "       dreyd storage inspect|verify|dump|repair DIR   (offline tools; dreyd storage --help)\n"
                 "       dreyd --version | --help | --help-markdown | --help-errors\n\n"
                 "Every option can also be set by the environment variable DREY_<NAME>\n"
                 "(upper case, '-' as '_'); a flag wins over the variable.\n\n"
                 "Exit status: 0 after a drain (SIGTERM, SIGINT) or --help/--version; 1 when it cannot\n"
                 "start (a listener, recovery, the cluster) or fails while serving; 2 on a bad option.\n\n");
    for (size_t i = 0; i < N_OPTIONS; i++) {
        char var[96];
        env_name(&options[i], var, sizeof var);
        fprintf(out, "  --%s=<%s>  (%s, default %s)\n      %s\n", options[i].name, type_name(options[i].type), var,
                options[i].fallback, options[i].help);
    }
}

void drey_config_print_markdown(FILE *out) {
    fprintf(out, "| Flag | Environment | Type | Default | Meaning |\n|---|---|---|---|---|\n");
    for (size_t i = 0; i < N_OPTIONS; i++) {
        char var[96];
        env_name(&options[i], var, sizeof var);
        fprintf(out, "| `--%s` | `%s` | %s | `%s` | %s |\n", options[i].name, var, type_name(options[i].type),
                options[i].fallback, options[i].help);
    }
}
