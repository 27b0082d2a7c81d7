/*
 * drey-bench — a closed-loop gRPC load generator on the C core client
 * (drey_client_start_call / drey_client_next).
 *
 * The parts, one file each:
 *   options.c   the command line (drey_bench_options)
 *   workload.c  keys (uniform, zipf, sequential), the operation mix and the
 *               encoded requests; raw payloads for other gRPC servers
 *   run.c       one thread per connection keeping `streams` calls in flight
 *   report.c    text and JSON output of what the threads measured
 *   histogram.c the log-linear latency histogram (its own unit test)
 */
#ifndef DREY_BENCH_H
#define DREY_BENCH_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "histogram.h"

/* What one call does. RAW sends a pre-encoded payload to --raw-method. */
typedef enum drey_bench_op {
    DREY_BENCH_GET,
    DREY_BENCH_SET,
    DREY_BENCH_ADD,
    DREY_BENCH_INCREMENT,
    DREY_BENCH_REMOVE,
    DREY_BENCH_HEALTH,
    DREY_BENCH_RAW,
    DREY_BENCH_N_OPS
} drey_bench_op;

const char *drey_bench_op_name(drey_bench_op op);

typedef enum drey_bench_dist {
    DREY_BENCH_UNIFORM,
    DREY_BENCH_ZIPF,
    DREY_BENCH_SEQUENTIAL, /* 0, 1, 2, ... across all connections: each key once per pass */
} drey_bench_dist;

/* One raw request body (a pre-encoded protobuf message). */
typedef struct drey_bench_payload {
    const uint8_t *data;
    size_t len;
} drey_bench_payload;

typedef struct drey_bench_options {
    const char *target;        /* host:port */
    int connections;           /* channels, one connection and one thread each */
    int streams;               /* calls in flight per connection */
    int64_t duration_ms;       /* measured time (after warmup); 0 with count */
    int64_t warmup_ms;         /* calls finishing in it are not measured */
    uint64_t count;            /* calls in all (0: run for duration_ms) */
    uint64_t keys;             /* key space */
    int key_bytes;             /* every key is this long: "k" + zero-padded index */
    drey_bench_dist dist;
    double zipf_s;             /* zipf exponent */
    size_t value_bytes;
    unsigned mix[DREY_BENCH_N_OPS]; /* relative weights */
    const char *cache;         /* "": the default cache */
    int64_t ttl_ms;            /* writes carry this ttl (0: none) */
    char **tokens;             /* connection i sends tokens[i % n_tokens] (none when 0) */
    size_t n_tokens;
    bool request_ids;          /* writes carry a unique request_id */
    int64_t timeout_ms;        /* per-call deadline */
    const char *raw_method;    /* "/pkg.Service/Method" for RAW */
    drey_bench_payload *payloads; /* RAW: chosen by the key distribution over n_payloads */
    size_t n_payloads;
    bool json;
    bool cluster;              /* route by key with the target's topology */
    int pipeline;              /* >0: operations per message on one Pipeline stream per connection */
    const char *label;         /* echoed in the report */
    uint64_t seed;
} drey_bench_options;

/* Parses argv into o (exits 2 with a message on a usage error, 0 on --help). */
void drey_bench_options_parse(drey_bench_options *o, int argc, char **argv);

/* --- workload ------------------------------------------------------------- */

/* Read-only state shared by every thread. */
typedef struct drey_bench_workload {
    const drey_bench_options *o;
    double *zipf_cdf;          /* keys entries, for DREY_BENCH_ZIPF */
    uint8_t *value;            /* value_bytes of filler */
    unsigned mix_total;
    _Atomic uint64_t next_seq; /* DREY_BENCH_SEQUENTIAL */
    uint64_t run_id;           /* makes request_ids unique across runs */
} drey_bench_workload;

/* One thread's generator. */
typedef struct drey_bench_gen {
    const drey_bench_workload *w;
    uint64_t rng;
    int thread;
    uint64_t seq;              /* request_id counter */
    uint8_t *buf;              /* the encoded request */
    size_t cap;
    char key[64];              /* the request's key */
} drey_bench_gen;

/* A request ready to send: data points into the generator's buffer (or a
 * raw payload), like key, and stays valid until the next drey_bench_next_request. */
typedef struct drey_bench_request {
    drey_bench_op op;
    const char *method;
    const uint8_t *data;
    size_t len;
    const char *key;           /* the generator's key (""; raw and health: none) */
    size_t key_len;
} drey_bench_request;

void drey_bench_workload_init(drey_bench_workload *w, const drey_bench_options *o);
void drey_bench_workload_free(drey_bench_workload *w);
void drey_bench_gen_init(drey_bench_gen *g, const drey_bench_workload *w, int thread);
void drey_bench_gen_free(drey_bench_gen *g);
/* The next request; false when a sequential pass is over (every key was
 * given out once). */
bool drey_bench_next_request(drey_bench_gen *g, drey_bench_request *out);
/* The key index the distribution picks next (exposed for tests and raw mode). */
uint64_t drey_bench_next_key(drey_bench_gen *g, uint64_t n, bool *exhausted);
/* Reads a file of gRPC-framed messages (1 flag byte, 4-byte big-endian
 * length, payload; the format h2load's -d sends) into payloads. */
bool drey_bench_load_payloads(const char *path, drey_bench_payload **out, size_t *n, char *err, size_t err_cap);

/* --- results -------------------------------------------------------------- */

#define DREY_BENCH_MAX_ERROR_KINDS 32

/* Calls that ended with one (op, status, ErrorInfo reason). */
typedef struct drey_bench_error_kind {
    drey_bench_op op;
    int code;                  /* grpc_status_code */
    char reason[64];           /* "" without an ErrorInfo */
    uint64_t count;
} drey_bench_error_kind;

typedef struct drey_bench_op_stats {
    uint64_t ok, errors;
    drey_bench_hist latency;   /* ns, calls that finished OK and errors alike */
} drey_bench_op_stats;

/* What one thread (or, merged, the run) measured. */
typedef struct drey_bench_stats {
    drey_bench_op_stats ops[DREY_BENCH_N_OPS];
    drey_bench_error_kind errors[DREY_BENCH_MAX_ERROR_KINDS];
    size_t n_error_kinds;
    uint64_t error_kinds_dropped; /* errors beyond the table (counted in ops[].errors) */
    uint64_t get_hits, get_misses;
    uint64_t start_failures;   /* gRPC refused to start a call */
} drey_bench_stats;

void drey_bench_stats_init(drey_bench_stats *s);
void drey_bench_stats_add_error(drey_bench_stats *s, drey_bench_op op, int code, const char *reason, uint64_t n);
void drey_bench_stats_merge(drey_bench_stats *dst, const drey_bench_stats *src);

typedef struct drey_bench_result {
    drey_bench_stats total;
    double elapsed_s;          /* the measured window */
} drey_bench_result;

/* Runs the load and fills r. Returns false (message in err) when the run
 * could not start. */
bool drey_bench_run(const drey_bench_options *o, drey_bench_result *r, char *err, size_t err_cap);

void drey_bench_report_text(const drey_bench_options *o, const drey_bench_result *r);
void drey_bench_report_json(const drey_bench_options *o, const drey_bench_result *r);

#endif
