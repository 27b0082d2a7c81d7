/*
 * Memory per entry: loads N entries (16-byte keys, 100-byte values) into the
 * store and prints what jemalloc reports as allocated, per entry and beyond
 * key and value. With a partition count the store is partitioned first, as
 * a cluster node's is (and then, to time it, a second store is partitioned
 * after it was loaded, as at a node's join). A benchmark: it prints numbers
 * and never fails on them.
 *
 *   bazel run //tests/bench:store_memory -- [entries] [partitions]
 */
#include <jemalloc/jemalloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "drey/partition.h"
#include "drey/store.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* CPU time: the machine is shared, wall time is noisy. */
static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void on_read(void *arg, const drey_entry_view *e) {
    *(uint64_t *)arg += e->version;
}

static size_t allocated(void) {
    uint64_t epoch = 1;
    size_t sz = sizeof epoch;
    mallctl("epoch", &epoch, &sz, &epoch, sz);
    size_t bytes;
    sz = sizeof bytes;
    if (mallctl("stats.allocated", &bytes, &sz, NULL, 0) != 0) {
        fprintf(stderr, "jemalloc stats unavailable\n");
        exit(1);
    }
    return bytes;
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 1000000;
    uint32_t parts = argc > 2 ? (uint32_t)strtoul(argv[2], NULL, 10) : 0;
    enum { KEY = 16, VALUE = 100 };
    size_t before = allocated();
    drey_store *s = drey_store_create();
    if (parts > 0 && !drey_partition_index(s, parts)) {
        fprintf(stderr, "bad partition count %u\n", parts);
        return 2;
    }
    double load_start = now_s(), load_cpu = cpu_s();
    uint8_t value[VALUE];
    memset(value, 'v', sizeof value);
    drey_value v = {.kind = DREY_VALUE_BYTES, .data = value, .len = VALUE};
    for (size_t i = 0; i < n; i++) {
        char key[32];
        snprintf(key, sizeof key, "key-%012zu", i);
        drey_key k;
        drey_store_key(s, &k, "", 0, key, KEY);
        drey_store_txn t;
        drey_store_txn_begin(s, &t, &k, 1);
        drey_store_txn_put(&t, &k, &v, 0, drey_store_next_version(s));
        drey_store_txn_end(&t);
    }
    double load_s = now_s() - load_start;
    load_cpu = cpu_s() - load_cpu;
    size_t after = allocated();
    double read_cpu = cpu_s();
    uint64_t sum = 0;
    for (size_t i = 0; i < n; i++) {
        char key[32];
        snprintf(key, sizeof key, "key-%012zu", (i * 7919) % n);
        drey_key k;
        drey_store_key(s, &k, "", 0, key, KEY);
        drey_store_read(s, &k, 0, on_read, &sum);
    }
    read_cpu = cpu_s() - read_cpu;
    drey_store_stats st;
    drey_store_get_stats(s, &st);
    double per = (double)(after - before) / (double)n;
    printf("entries                 %zu\n", n);
    printf("partitions              %u%s\n", parts, parts ? "" : " (standalone)");
    printf("load                    %.3f s (%.0f ns per put; cpu %.0f ns)\n", load_s, load_s * 1e9 / (double)n,
           load_cpu * 1e9 / (double)n);
    printf("reads                   cpu %.0f ns per get (checksum %llu)\n", read_cpu * 1e9 / (double)n,
           (unsigned long long)sum);
    printf("jemalloc allocated      %.1f MiB\n", (double)(after - before) / (1 << 20));
    printf("bytes per entry         %.1f\n", per);
    printf("key + value             %d\n", KEY + VALUE);
    printf("overhead per entry      %.1f (target <= 64)\n", per - (KEY + VALUE));
    printf("accounted per entry     %.1f (the store's own figure)\n", (double)st.bytes / (double)n);
    printf("load factor             %.2f\n", (double)st.entries / (double)st.buckets);
    if (parts > 0) {
        /* What a node's join costs: the same entries loaded standalone,
         * then partitioned. */
        drey_store *late = drey_store_create();
        for (size_t i = 0; i < n; i++) {
            char key[32];
            snprintf(key, sizeof key, "key-%012zu", i);
            drey_key k;
            drey_store_key(late, &k, "", 0, key, KEY);
            drey_store_txn t;
            drey_store_txn_begin(late, &t, &k, 1);
            drey_store_txn_put(&t, &k, &v, 0, drey_store_next_version(late));
            drey_store_txn_end(&t);
        }
        double start = now_s();
        drey_partition_index(late, parts);
        double took = now_s() - start;
        printf("partitioned after load  %.3f s (%.0f ns per entry)\n", took, took * 1e9 / (double)n);
        drey_store_destroy(late);
    }
    drey_store_destroy(s);
    return 0;
}
