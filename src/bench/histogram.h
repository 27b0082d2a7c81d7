/*
 * histogram — a log-linear latency histogram for drey-bench.
 *
 * Values (nanoseconds, or any unsigned 64-bit quantity) below 2 x SUB are
 * counted exactly; above, every power of two [2^k, 2^(k+1)) is split into SUB
 * equal buckets, so a bucket is never wider than 1/SUB of the values it holds.
 * A percentile is the midpoint of the bucket that holds it (clamped to the
 * smallest and largest value seen), which is within 1/(2 x SUB) of the exact
 * value: with SUB = 64, 0.8%. Recording is one shift and an add; histograms
 * of several threads merge by adding counts.
 *
 *   drey_bench_hist h;
 *   drey_bench_hist_init(&h);
 *   drey_bench_hist_record(&h, 1234567);
 *   uint64_t p99 = drey_bench_hist_percentile(&h, 99.0);
 */
#ifndef DREY_BENCH_HISTOGRAM_H
#define DREY_BENCH_HISTOGRAM_H

#include <stdint.h>

#define DREY_BENCH_HIST_SUB_BITS 6
#define DREY_BENCH_HIST_SUB (1u << DREY_BENCH_HIST_SUB_BITS) /* buckets per power of two */
/* Exact values [0, 2 x SUB), then SUB buckets for each of the powers of two
 * 2^(SUB_BITS+1) .. 2^63. */
#define DREY_BENCH_HIST_BUCKETS ((64 - DREY_BENCH_HIST_SUB_BITS + 1) * DREY_BENCH_HIST_SUB)

typedef struct drey_bench_hist {
    uint64_t count;                           /* values recorded */
    uint64_t min, max;                        /* smallest and largest value (min UINT64_MAX when empty) */
    double sum;                               /* for the mean */
    uint64_t buckets[DREY_BENCH_HIST_BUCKETS];
} drey_bench_hist;

void drey_bench_hist_init(drey_bench_hist *h);
void drey_bench_hist_record(drey_bench_hist *h, uint64_t value);
/* Adds src's counts to dst. */
void drey_bench_hist_merge(drey_bench_hist *dst, const drey_bench_hist *src);

/* The value at percentile p (0 < p <= 100) by the nearest-rank rule: the
 * smallest recorded value v such that at least p% of the values are <= v,
 * to within half a bucket. 0 when empty. */
uint64_t drey_bench_hist_percentile(const drey_bench_hist *h, double p);
double drey_bench_hist_mean(const drey_bench_hist *h);

/* The bucket a value falls in, and a bucket's first value and width
 * (exposed for the unit test). */
uint32_t drey_bench_hist_bucket(uint64_t value);
uint64_t drey_bench_hist_bucket_low(uint32_t bucket);
uint64_t drey_bench_hist_bucket_width(uint32_t bucket);

#endif
