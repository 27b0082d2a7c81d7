/*
 * The bench histogram: bucketing is dense and exact below 128, every value
 * lands in the bucket that covers it, and percentiles match the exact
 * nearest-rank percentiles of the recorded values to within half a bucket
 * (1/128 of the value).
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/bench/histogram.h"

static drey_bench_hist *new_hist(void) {
    drey_bench_hist *h = malloc(sizeof *h);
    cr_assert_not_null(h);
    drey_bench_hist_init(h);
    return h;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The exact nearest-rank percentile of sorted[0..n). */
static uint64_t exact_percentile(const uint64_t *sorted, size_t n, double p) {
    if (p >= 100)
        return sorted[n - 1];
    unsigned __int128 ppm = (unsigned __int128)llround(p * 1e4);
    uint64_t rank = (uint64_t)((ppm * n + 999999) / 1000000);
    if (rank == 0)
        rank = 1;
    return sorted[rank - 1];
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t next_rand(void) {
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double next_unit(void) {
    return (double)(next_rand() >> 11) / 9007199254740992.0;
}

static void check_against_exact(uint64_t *values, size_t n) {
    drey_bench_hist *h = new_hist();
    for (size_t i = 0; i < n; i++)
        drey_bench_hist_record(h, values[i]);
    qsort(values, n, sizeof *values, cmp_u64);
    static const double ps[] = {0.001, 1, 10, 25, 50, 75, 90, 95, 99, 99.9, 99.99, 100};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
        uint64_t want = exact_percentile(values, n, ps[i]);
        uint64_t got = drey_bench_hist_percentile(h, ps[i]);
        uint64_t diff = got > want ? got - want : want - got;
        cr_assert(diff <= want / 128, "p%g of %zu values: histogram %llu, exact %llu", ps[i], n,
                  (unsigned long long)got, (unsigned long long)want);
    }
    cr_assert_eq(h->count, n);
    cr_assert_eq(h->min, values[0]);
    cr_assert_eq(h->max, values[n - 1]);
    free(h);
}

Test(histogram, buckets_are_dense_and_cover_their_values) {
    uint32_t prev = 0;
    for (uint64_t v = 0; v < 100000; v++) {
        uint32_t b = drey_bench_hist_bucket(v);
        cr_assert(b == prev || b == prev + 1, "value %llu jumps from bucket %u to %u", (unsigned long long)v, prev, b);
        prev = b;
    }
    for (int i = 0; i < 100000; i++) {
        uint64_t v = next_rand() >> (next_rand() % 64);
        uint32_t b = drey_bench_hist_bucket(v);
        cr_assert_lt(b, DREY_BENCH_HIST_BUCKETS);
        uint64_t low = drey_bench_hist_bucket_low(b), width = drey_bench_hist_bucket_width(b);
        cr_assert(low <= v && v - low < width, "value %llu outside bucket %u [%llu, +%llu)", (unsigned long long)v, b,
                  (unsigned long long)low, (unsigned long long)width);
        if (b >= 2 * DREY_BENCH_HIST_SUB)
            cr_assert_leq(width, low / DREY_BENCH_HIST_SUB);
    }
    cr_assert_eq(drey_bench_hist_bucket(UINT64_MAX), DREY_BENCH_HIST_BUCKETS - 1);
    cr_assert_eq(drey_bench_hist_bucket_low(drey_bench_hist_bucket(1ull << 63)), 1ull << 63);
}

Test(histogram, values_below_128_are_exact) {
    for (uint64_t v = 0; v < 2 * DREY_BENCH_HIST_SUB; v++) {
        cr_assert_eq(drey_bench_hist_bucket(v), v);
        cr_assert_eq(drey_bench_hist_bucket_width((uint32_t)v), 1);
    }
    drey_bench_hist *h = new_hist();
    for (uint64_t v = 1; v <= 100; v++)
        drey_bench_hist_record(h, v);
    cr_assert_eq(drey_bench_hist_percentile(h, 50), 50);
    cr_assert_eq(drey_bench_hist_percentile(h, 90), 90);
    cr_assert_eq(drey_bench_hist_percentile(h, 99), 99);
    cr_assert_eq(drey_bench_hist_percentile(h, 99.9), 100);
    cr_assert_eq(drey_bench_hist_percentile(h, 100), 100);
    free(h);
}

Test(histogram, empty_is_zero) {
    drey_bench_hist *h = new_hist();
    cr_assert_eq(drey_bench_hist_percentile(h, 50), 0);
    cr_assert_eq(drey_bench_hist_mean(h), 0.0);
    free(h);
}

Test(histogram, uniform_latencies_match_exact_percentiles) {
    enum { N = 200000 };
    uint64_t *v = malloc(N * sizeof *v);
    for (size_t i = 0; i < N; i++)
        v[i] = 50000 + next_rand() % 5000000; /* 50 us .. 5 ms in ns */
    check_against_exact(v, N);
    free(v);
}

Test(histogram, long_tailed_latencies_match_exact_percentiles) {
    enum { N = 100000 };
    uint64_t *v = malloc(N * sizeof *v);
    for (size_t i = 0; i < N; i++) {
        /* log-uniform over 1 us .. 10 s: every bucket group is exercised */
        double e = 3.0 + 7.0 * next_unit();
        v[i] = (uint64_t)pow(10.0, e);
    }
    check_against_exact(v, N);
    free(v);
}

Test(histogram, nearest_rank_edges) {
    /* 1000 distinct values: p99.9 is the 999th, not the 1000th. */
    enum { N = 1000 };
    uint64_t *v = malloc(N * sizeof *v);
    for (size_t i = 0; i < N; i++)
        v[i] = (i + 1) * 1000;
    check_against_exact(v, N);
    drey_bench_hist *h = new_hist();
    for (size_t i = 0; i < N; i++)
        drey_bench_hist_record(h, (i + 1) * 1000);
    uint64_t p999 = drey_bench_hist_percentile(h, 99.9);
    cr_assert(p999 >= 999000 - 999000 / 128 && p999 <= 999000 + 999000 / 128, "p99.9 %llu", (unsigned long long)p999);
    free(h);
    /* A handful of values and a constant. */
    uint64_t few[] = {7000000, 3, 900, 12345678, 5};
    check_against_exact(few, 5);
    uint64_t same[64];
    for (size_t i = 0; i < 64; i++)
        same[i] = 777777;
    check_against_exact(same, 64);
    free(v);
}

Test(histogram, merge_equals_recording_everything_in_one) {
    drey_bench_hist *a = new_hist(), *b = new_hist(), *all = new_hist();
    for (int i = 0; i < 50000; i++) {
        uint64_t x = next_rand() % 10000000;
        drey_bench_hist_record(i % 3 == 0 ? a : b, x);
        drey_bench_hist_record(all, x);
    }
    drey_bench_hist_merge(a, b);
    cr_assert_eq(a->count, all->count);
    cr_assert_eq(a->min, all->min);
    cr_assert_eq(a->max, all->max);
    cr_assert_eq(memcmp(a->buckets, all->buckets, sizeof a->buckets), 0);
    for (double p = 1; p < 100; p += 7.5)
        cr_assert_eq(drey_bench_hist_percentile(a, p), drey_bench_hist_percentile(all, p));
    cr_assert_float_eq(drey_bench_hist_mean(a), drey_bench_hist_mean(all), 1e-6 * drey_bench_hist_mean(all));
    free(a);
    free(b);
    free(all);
}
