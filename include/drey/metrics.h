/*
 * metrics — counters, gauges and histograms, exposed in the Prometheus text
 * format.
 *
 * Hot-path recording is a relaxed atomic add into a fixed slot: requests by
 * method and status code, latency per method, rejections by stage and reason,
 * journal batches and fsync latency. Everything else (memory, queue depth,
 * journal disk, snapshots) is read from its module when /metrics is scraped.
 * Label sets are fixed and small; per-principal figures are limited to a
 * bounded top-N so cardinality stays bounded whatever the callers do.
 */
#ifndef DREY_METRICS_H
#define DREY_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct drey_metrics drey_metrics;

/* Histogram bucket upper bounds are fixed per histogram (see metrics.c). */
typedef struct drey_histogram drey_histogram;

drey_metrics *drey_metrics_create(void);
void drey_metrics_destroy(drey_metrics *m);

/* Method names are registered once, in the server's method order. */
void drey_metrics_set_methods(drey_metrics *m, const char *const *names, size_t n);

/* A finished call: its method (index), gRPC status code and duration. */
void drey_metrics_observe_call(drey_metrics *m, size_t method, int code, int64_t duration_ns);
/* A refusal by a stage of the request chain (reason from the catalogue). */
void drey_metrics_observe_rejection(drey_metrics *m, const char *stage, const char *reason);
/* A journal batch: records in it and its fdatasync time (0: not synced). */
void drey_metrics_observe_batch(drey_metrics *m, size_t records, int64_t fsync_us);
/* A cluster primary: a backup acknowledged a record us after it was sent. */
void drey_metrics_observe_replica_ack(drey_metrics *m, int64_t us);

/* Collected at scrape time: a callback writes gauges with the helpers below. */
typedef void (*drey_metrics_collect_fn)(void *ctx, FILE *out);
void drey_metrics_add_collector(drey_metrics *m, drey_metrics_collect_fn fn, void *ctx);

/* A collector of the process_* families every Prometheus client library
 * exports (CPU seconds, resident and virtual memory, open and maximum file
 * descriptors, start time; read from /proc at each scrape) and
 * drey_build_info{version,revision}. ctx is unused. */
void drey_metrics_collect_process(void *ctx, FILE *out);

/* Writes the whole exposition. */
void drey_metrics_write(drey_metrics *m, FILE *out);

/* Exposition helpers for collectors: HELP and TYPE once, then samples.
 * Label values are escaped. */
void drey_metrics_header(FILE *out, const char *name, const char *type, const char *help);
void drey_metrics_sample(FILE *out, const char *name, const char *labels, double value);
/* labels built from key/value pairs: "k1", "v1", "k2", "v2", NULL. */
void drey_metrics_labels(char *buf, size_t cap, ...);

#endif
