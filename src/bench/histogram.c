/*
 * histogram — log-linear bucketing; see histogram.h.
 *
 * Bucket index of v: below 2 x SUB it is v itself. Above, with m the index of
 * v's highest set bit and s = m - SUB_BITS (>= 1), v >> s lies in [SUB, 2 x SUB)
 * and the index is s x SUB + (v >> s): group s covers [(s + 1) x SUB,
 * (s + 2) x SUB), right after group s - 1, so indexes are dense.
 */
#include "histogram.h"

#include <math.h>
#include <string.h>

#define SUB_BITS DREY_BENCH_HIST_SUB_BITS
#define SUB DREY_BENCH_HIST_SUB

void drey_bench_hist_init(drey_bench_hist *h) {
    memset(h, 0, sizeof *h);
    h->min = UINT64_MAX;
}

uint32_t drey_bench_hist_bucket(uint64_t value) {
    if (value < 2 * SUB)
        return (uint32_t)value;
    uint32_t msb = 63u - (uint32_t)__builtin_clzll(value);
    uint32_t shift = msb - SUB_BITS;
    return shift * SUB + (uint32_t)(value >> shift);
}

uint64_t drey_bench_hist_bucket_low(uint32_t bucket) {
    if (bucket < 2 * SUB)
        return bucket;
    uint32_t shift = bucket / SUB - 1;
    return (uint64_t)(bucket % SUB + SUB) << shift;
}

uint64_t drey_bench_hist_bucket_width(uint32_t bucket) {
    if (bucket < 2 * SUB)
        return 1;
    return (uint64_t)1 << (bucket / SUB - 1);
}

void drey_bench_hist_record(drey_bench_hist *h, uint64_t value) {
    h->buckets[drey_bench_hist_bucket(value)]++;
    h->count++;
    h->sum += (double)value;
    if (value < h->min)
        h->min = value;
    if (value > h->max)
        h->max = value;
}

void drey_bench_hist_merge(drey_bench_hist *dst, const drey_bench_hist *src) {
    for (uint32_t i = 0; i < DREY_BENCH_HIST_BUCKETS; i++)
        dst->buckets[i] += src->buckets[i];
    dst->count += src->count;
    dst->sum += src->sum;
    if (src->min < dst->min)
        dst->min = src->min;
    if (src->max > dst->max)
        dst->max = src->max;
}

uint64_t drey_bench_hist_percentile(const drey_bench_hist *h, double p) {
    if (h->count == 0)
        return 0;
    if (p <= 0)
        return h->min;
    if (p >= 100)
        return h->max;
    /* Nearest rank: the ceil(p/100 x n)-th smallest value (1-based), in
     * integers (p in steps of 0.0001 %) so that 99.9% of 1000 is rank 999, not 1000. */
    unsigned __int128 ppm = (unsigned __int128)llround(p * 1e4); /* parts per million */
    uint64_t rank = (uint64_t)((ppm * h->count + 999999) / 1000000);
    if (rank == 0)
        rank = 1;
    uint64_t seen = 0;
    for (uint32_t i = 0; i < DREY_BENCH_HIST_BUCKETS; i++) {
        seen += h->buckets[i];
        if (seen >= rank) {
            uint64_t v = drey_bench_hist_bucket_low(i) + (drey_bench_hist_bucket_width(i) - 1) / 2;
            if (v < h->min)
                v = h->min;
            if (v > h->max)
                v = h->max;
            return v;
        }
    }
    return h->max;
}

double drey_bench_hist_mean(const drey_bench_hist *h) {
    return h->count > 0 ? h->sum / (double)h->count : 0.0;
}
