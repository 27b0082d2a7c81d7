/*
 * report — what a run measured, as text for people or one JSON object for
 * scripts (tests/bench/run.sh). Latencies are the client's: from starting a
 * call to taking its completion, errors included.
 */
#include <stdio.h>
#include <string.h>

#include "bench.h"
#include "drey/client.h"

static const double percentiles[] = {50, 90, 99, 99.9};
static const char *const percentile_names[] = {"p50", "p90", "p99", "p99.9"};
#define N_PERCENTILES (sizeof percentiles / sizeof percentiles[0])

static const char *dist_name(drey_bench_dist d) {
    switch (d) {
    case DREY_BENCH_UNIFORM:
        return "uniform";
    case DREY_BENCH_ZIPF:
        return "zipf";
    case DREY_BENCH_SEQUENTIAL:
        return "sequential";
    }
    return "?";
}

static uint64_t calls_of(const drey_bench_stats *s, uint64_t *ok, uint64_t *errors) {
    *ok = *errors = 0;
    for (int op = 0; op < DREY_BENCH_N_OPS; op++) {
        *ok += s->ops[op].ok;
        *errors += s->ops[op].errors;
    }
    return *ok + *errors;
}

static void merged_latency(const drey_bench_stats *s, drey_bench_hist *all) {
    drey_bench_hist_init(all);
    for (int op = 0; op < DREY_BENCH_N_OPS; op++)
        drey_bench_hist_merge(all, &s->ops[op].latency);
}

/* "123.4us", "1.23ms", "2.1s" */
static const char *human_ns(double ns, char *buf, size_t cap) {
    if (ns < 1e6)
        snprintf(buf, cap, "%.1fus", ns / 1e3);
    else if (ns < 1e9)
        snprintf(buf, cap, "%.2fms", ns / 1e6);
    else
        snprintf(buf, cap, "%.2fs", ns / 1e9);
    return buf;
}

static void text_latency(const char *name, const drey_bench_hist *h, uint64_t calls, double elapsed) {
    char b[32];
    printf("  %-10s %10llu calls %12.1f/s  mean %s", name, (unsigned long long)calls,
           elapsed > 0 ? (double)calls / elapsed : 0.0, human_ns(drey_bench_hist_mean(h), b, sizeof b));
    for (size_t i = 0; i < N_PERCENTILES; i++)
        printf("  %s %s", percentile_names[i], human_ns((double)drey_bench_hist_percentile(h, percentiles[i]), b, sizeof b));
    printf("  max %s\n", human_ns((double)h->max, b, sizeof b));
}

void drey_bench_report_text(const drey_bench_options *o, const drey_bench_result *r) {
    const drey_bench_stats *s = &r->total;
    uint64_t ok, errors, calls = calls_of(s, &ok, &errors);
    if (o->label != NULL)
        printf("%s\n", o->label);
    printf("target       %s%s, %d connection%s x %d stream%s\n", o->target,
           o->cluster ? " (cluster seed: routed by key)" : "", o->connections, o->connections == 1 ? "" : "s",
           o->streams, o->streams == 1 ? "" : "s");
    if (o->pipeline > 0)
        printf("pipeline     %d operations per message on one Pipeline stream per connection\n", o->pipeline);
    if (o->raw_method != NULL) {
        printf("workload     raw %s, %zu payload%s, %s over %llu\n", o->raw_method, o->n_payloads,
               o->n_payloads == 1 ? "" : "s", dist_name(o->dist), (unsigned long long)o->keys);
    } else {
        printf("workload     mix");
        for (int op = 0; op < DREY_BENCH_N_OPS; op++) {
            if (o->mix[op] > 0)
                printf(" %s:%u", drey_bench_op_name(op), o->mix[op]);
        }
        printf(", %llu keys of %d bytes (%s), values of %zu bytes%s%s\n", (unsigned long long)o->keys, o->key_bytes,
               dist_name(o->dist), o->value_bytes, o->request_ids ? ", request_ids" : "",
               o->n_tokens > 0 ? ", bearer tokens" : "");
    }
    printf("measured     %.2f s (warmup %.1f s)\n", r->elapsed_s, (double)o->warmup_ms / 1000.0);
    printf("calls        %llu (ok %llu, errors %llu)\n", (unsigned long long)calls, (unsigned long long)ok,
           (unsigned long long)errors);
    printf("throughput   %.1f calls/s\n", r->elapsed_s > 0 ? (double)calls / r->elapsed_s : 0.0);
    drey_bench_hist all;
    merged_latency(s, &all);
    printf("latency\n");
    text_latency("all", &all, calls, r->elapsed_s);
    int n_ops = 0;
    for (int op = 0; op < DREY_BENCH_N_OPS; op++)
        n_ops += s->ops[op].latency.count > 0;
    if (n_ops > 1) {
        for (int op = 0; op < DREY_BENCH_N_OPS; op++) {
            const drey_bench_op_stats *os = &s->ops[op];
            if (os->latency.count > 0)
                text_latency(drey_bench_op_name(op), &os->latency, os->ok + os->errors, r->elapsed_s);
        }
    }
    if (s->get_hits + s->get_misses > 0)
        printf("get hits     %.1f%% (%llu of %llu)\n", 100.0 * (double)s->get_hits / (double)(s->get_hits + s->get_misses),
               (unsigned long long)s->get_hits, (unsigned long long)(s->get_hits + s->get_misses));
    if (s->n_error_kinds > 0) {
        printf("errors\n");
        for (size_t i = 0; i < s->n_error_kinds; i++) {
            const drey_bench_error_kind *k = &s->errors[i];
            printf("  %-10s %-20s %-30s %llu\n", drey_bench_op_name(k->op), drey_client_code_name(k->code),
                   k->reason[0] ? k->reason : "-", (unsigned long long)k->count);
        }
    }
    if (s->start_failures > 0)
        printf("calls gRPC refused to start: %llu\n", (unsigned long long)s->start_failures);
}

/* --- JSON ------------------------------------------------------------------ */

static void json_string(const char *s) {
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static void json_latency(const drey_bench_hist *h) {
    printf("{\"count\":%llu,\"mean_us\":%.3f,\"min_us\":%.3f", (unsigned long long)h->count,
           drey_bench_hist_mean(h) / 1e3, h->count ? (double)h->min / 1e3 : 0.0);
    static const char *const keys[] = {"p50_us", "p90_us", "p99_us", "p999_us"};
    for (size_t i = 0; i < N_PERCENTILES; i++)
        printf(",\"%s\":%.3f", keys[i], (double)drey_bench_hist_percentile(h, percentiles[i]) / 1e3);
    printf(",\"max_us\":%.3f}", (double)h->max / 1e3);
}

void drey_bench_report_json(const drey_bench_options *o, const drey_bench_result *r) {
    const drey_bench_stats *s = &r->total;
    uint64_t ok, errors, calls = calls_of(s, &ok, &errors);
    printf("{\"label\":");
    json_string(o->label != NULL ? o->label : "");
    printf(",\"target\":");
    json_string(o->target);
    printf(",\"connections\":%d,\"streams\":%d,\"concurrency\":%d", o->connections, o->streams,
           o->connections * o->streams);
    printf(",\"cluster\":%s", o->cluster ? "true" : "false");
    printf(",\"pipeline\":%d", o->pipeline);
    if (o->raw_method != NULL) {
        printf(",\"raw_method\":");
        json_string(o->raw_method);
        printf(",\"payloads\":%zu", o->n_payloads);
    }
    printf(",\"mix\":{");
    bool first = true;
    for (int op = 0; op < DREY_BENCH_N_OPS; op++) {
        if (o->mix[op] > 0) {
            printf("%s\"%s\":%u", first ? "" : ",", drey_bench_op_name(op), o->mix[op]);
            first = false;
        }
    }
    printf("},\"keys\":%llu,\"key_bytes\":%d,\"distribution\":\"%s\",\"value_bytes\":%zu", (unsigned long long)o->keys,
           o->key_bytes, dist_name(o->dist), o->value_bytes);
    printf(",\"request_ids\":%s,\"tokens\":%zu", o->request_ids ? "true" : "false", o->n_tokens);
    printf(",\"warmup_s\":%.3f,\"elapsed_s\":%.3f", (double)o->warmup_ms / 1000.0, r->elapsed_s);
    printf(",\"calls\":%llu,\"ok\":%llu,\"errors\":%llu", (unsigned long long)calls, (unsigned long long)ok,
           (unsigned long long)errors);
    printf(",\"throughput\":%.1f", r->elapsed_s > 0 ? (double)calls / r->elapsed_s : 0.0);
    printf(",\"ok_throughput\":%.1f", r->elapsed_s > 0 ? (double)ok / r->elapsed_s : 0.0);
    drey_bench_hist all;
    merged_latency(s, &all);
    printf(",\"latency\":");
    json_latency(&all);
    printf(",\"ops\":{");
    first = true;
    for (int op = 0; op < DREY_BENCH_N_OPS; op++) {
        const drey_bench_op_stats *os = &s->ops[op];
        if (os->latency.count == 0)
            continue;
        printf("%s\"%s\":{\"ok\":%llu,\"errors\":%llu,\"latency\":", first ? "" : ",", drey_bench_op_name(op),
               (unsigned long long)os->ok, (unsigned long long)os->errors);
        json_latency(&os->latency);
        putchar('}');
        first = false;
    }
    printf("},\"get_hits\":%llu,\"get_misses\":%llu", (unsigned long long)s->get_hits,
           (unsigned long long)s->get_misses);
    printf(",\"errors_by_status\":[");
    for (size_t i = 0; i < s->n_error_kinds; i++) {
        const drey_bench_error_kind *k = &s->errors[i];
        printf("%s{\"op\":\"%s\",\"code\":\"%s\",\"reason\":", i ? "," : "", drey_bench_op_name(k->op),
               drey_client_code_name(k->code));
        json_string(k->reason);
        printf(",\"count\":%llu}", (unsigned long long)k->count);
    }
    printf("],\"start_failures\":%llu}\n", (unsigned long long)s->start_failures);
}
