/*
 * Memory per entry: loads N entries (16-byte keys, 100-byte values) into the
 * store and prints what jemalloc reports as allocated, per entry and beyond
 * key and value. A benchmark: it prints numbers and never fails on them.
 *
 *   bazel run //tests/bench:store_memory -- [entries]
 */
#include <jemalloc/jemalloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/store.h"

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
    enum { KEY = 16, VALUE = 100 };
    size_t before = allocated();
    drey_store *s = drey_store_create();
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
    size_t after = allocated();
    drey_store_stats st;
    drey_store_get_stats(s, &st);
    double per = (double)(after - before) / (double)n;
    printf("entries                 %zu\n", n);
    printf("jemalloc allocated      %.1f MiB\n", (double)(after - before) / (1 << 20));
    printf("bytes per entry         %.1f\n", per);
    printf("key + value             %d\n", KEY + VALUE);
    printf("overhead per entry      %.1f (target <= 64)\n", per - (KEY + VALUE));
    printf("accounted per entry     %.1f (the store's own figure)\n", (double)st.bytes / (double)n);
    printf("load factor             %.2f\n", (double)st.entries / (double)st.buckets);
    drey_store_destroy(s);
    return 0;
}
