/*
 * CPU per write that eviction adds, in the store alone (no gRPC, no journal,
 * so the nanoseconds are not lost in the server's noise): a store of N
 * entries (16-byte keys, 100-byte values) takes M writes of new keys; with a
 * policy each write first chooses one victim and removes it
 * (drey_store_evict_choose + drey_store_txn_evict, as admission and commit
 * do), with none the baseline write removes the oldest key instead, so the
 * table keeps its size either way. Also the cost a policy adds to a read
 * (recording the access). A benchmark: it prints numbers, never fails on
 * them.
 *
 *   bazel run //tests/bench:evict_cpu -- [entries] [writes]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "drey/store.h"

enum { KEY = 16, VALUE = 100 };

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static void key_of(drey_store *s, drey_key *k, char *buf, size_t i) {
    snprintf(buf, 32, "key-%012zu", i);
    drey_store_key(s, k, "", 0, buf, KEY);
}

static void put(drey_store *s, size_t i, int64_t expires) {
    static uint8_t value[VALUE];
    drey_value v = {.kind = DREY_VALUE_BYTES, .data = value, .len = VALUE};
    char buf[32];
    drey_key k;
    key_of(s, &k, buf, i);
    drey_store_txn t;
    drey_store_txn_begin(s, &t, &k, 1);
    drey_store_txn_put(&t, &k, &v, expires, drey_store_next_version(s));
    drey_store_txn_end(&t);
}

typedef struct victim {
    char key[64];
    size_t key_len;
    uint64_t version;
} victim;

static void take(void *arg, const drey_store_item *it, size_t bytes) {
    (void)bytes;
    victim *v = arg;
    memcpy(v->key, it->key, it->key_len);
    v->key_len = it->key_len;
    v->version = it->entry.version;
}

static void noop(void *arg, const drey_entry_view *e) {
    (void)arg, (void)e;
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : 200000;
    size_t m = argc > 2 ? strtoull(argv[2], NULL, 10) : 200000;
    static const drey_evict_policy policies[] = {DREY_EVICT_NONE, DREY_EVICT_ALLKEYS_LRU, DREY_EVICT_ALLKEYS_LFU,
                                                 DREY_EVICT_VOLATILE_LRU, DREY_EVICT_VOLATILE_TTL};
    double base_write = 0, base_read = 0;
    printf("entries %zu, writes %zu, %d-byte keys, %d-byte values\n", n, m, KEY, VALUE);
    printf("%-13s %10s %12s %10s %12s\n", "policy", "ns/write", "added/write", "ns/read", "added/read");
    for (size_t p = 0; p < sizeof policies / sizeof policies[0]; p++) {
        drey_store *s = drey_store_create();
        drey_store_set_policy(s, policies[p]);
        int64_t expires = policies[p] == DREY_EVICT_VOLATILE_LRU || policies[p] == DREY_EVICT_VOLATILE_TTL
                              ? (int64_t)4e12 : 0;
        for (size_t i = 0; i < n; i++)
            put(s, i, expires == 0 ? 0 : expires + (int64_t)i);
        size_t one = drey_store_entry_bytes(0, KEY, VALUE);
        double t0 = now_ns();
        for (size_t i = 0; i < m; i++) {
            char buf[32];
            drey_key k;
            if (policies[p] == DREY_EVICT_NONE) {
                key_of(s, &k, buf, i); /* the oldest */
            } else {
                victim v;
                if (drey_store_evict_choose(s, 1, (int64_t)one, 1, NULL, take, &v) == 0) {
                    fprintf(stderr, "nothing evictable at write %zu\n", i);
                    return 1;
                }
                drey_store_key(s, &k, "", 0, v.key, v.key_len);
                drey_store_txn t;
                drey_store_txn_begin(s, &t, &k, 1);
                drey_store_txn_evict(&t, &k, v.version);
                drey_store_txn_end(&t);
            }
            if (policies[p] == DREY_EVICT_NONE) {
                drey_store_txn t;
                drey_store_txn_begin(s, &t, &k, 1);
                drey_store_txn_remove(&t, &k);
                drey_store_txn_end(&t);
            }
            put(s, n + i, expires == 0 ? 0 : expires + (int64_t)(n + i));
        }
        double write_ns = (now_ns() - t0) / (double)m;
        t0 = now_ns();
        for (size_t i = 0; i < m; i++) {
            char buf[32];
            drey_key k;
            key_of(s, &k, buf, n + (i * 7919) % m);
            drey_store_read(s, &k, 1, noop, NULL);
        }
        double read_ns = (now_ns() - t0) / (double)m;
        if (p == 0)
            base_write = write_ns, base_read = read_ns;
        printf("%-13s %10.0f %+12.0f %10.0f %+12.0f\n", drey_evict_policy_name(policies[p]), write_ns,
               write_ns - base_write, read_ns, read_ns - base_read);
        drey_store_destroy(s);
    }
    return 0;
}
