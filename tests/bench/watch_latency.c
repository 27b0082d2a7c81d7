/*
 * Change-feed latency and cost, against a running dreyd:
 *
 *   watch_latency --target=HOST:PORT [--watchers=N] [--writes=M] [--keys=all]
 *   watch_latency --target=HOST:PORT --watchers=N --hold
 *
 * Server mode: N watcher threads, each on a connection of its own, watch
 * one key (or the whole default cache); one writer sets the key M times,
 * one at a time, and waits until every watcher has its event before the
 * next write. For each (write, watcher) it records the delay from the
 * moment the writer had the Set's acknowledgement to the moment the
 * watcher had the event (negative when the event came first: the node
 * publishes at apply, before the reply leaves), and the Set's own latency.
 *
 * Hold mode (--hold): the N watchers watch the whole default cache and read
 * until stdin closes, then print how many events they had: load for a
 * throughput run beside it.
 *
 * What the feed costs a write when nobody watches is measured end to end
 * instead (tests/bench/results/2026-12-01/watch_idle_ab.sh): an idle hub is
 * not the store's observer, so no in-process A/B would differ. A benchmark:
 * it prints numbers, never fails on them.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "drey/cache/v1/cache.pb-c.h"
#include "drey/client.h"

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int cmp64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static void report(const char *what, int64_t *v, size_t n) {
    qsort(v, n, sizeof *v, cmp64);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += (double)v[i];
    printf("%-28s n=%zu mean=%.1f p50=%.1f p90=%.1f p99=%.1f max=%.1f (µs)\n", what, n, sum / (double)n / 1e3,
           (double)v[n / 2] / 1e3, (double)v[n * 9 / 10] / 1e3, (double)v[n * 99 / 100] / 1e3,
           (double)v[n - 1] / 1e3);
}

/* --- server mode --------------------------------------------------------- */

typedef struct watcher {
    pthread_t thread;
    drey_client *client;
    drey_client_stream *stream;
    _Atomic uint64_t last_version;
    _Atomic int64_t last_at;
    _Atomic bool ready;
    _Atomic uint64_t events, resyncs;
} watcher;

static const char *target;
/* Watchers that have the current write's event; the last one wakes the
 * writer (no spinning: two cores serve the node and every thread here). */
static _Atomic size_t arrived;
static size_t n_watching;
static pthread_mutex_t arrived_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t arrived_cond = PTHREAD_COND_INITIALIZER;
static const char *key = "watch-bench";
static bool whole_cache, holding;

static void *watch_main(void *arg) {
    watcher *w = arg;
    Drey__Cache__V1__WatchRequest req = DREY__CACHE__V1__WATCH_REQUEST__INIT;
    char *keys[1] = {(char *)key};
    if (!whole_cache) {
        req.keys = keys;
        req.n_keys = 1;
    }
    drey_client_status st;
    w->stream = drey_client_watch(w->client, &req, DREY_CLIENT_NO_DEADLINE, &st);
    if (w->stream == NULL) {
        fprintf(stderr, "watch: %s\n", st.message);
        exit(1);
    }
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    ProtobufCMessage *m;
    while (drey_client_stream_read(w->stream, &drey__cache__v1__watch_event__descriptor, &a, &m)) {
        const Drey__Cache__V1__WatchEvent *ev = (const void *)m;
        int64_t t = now_ns();
        atomic_fetch_add_explicit(&w->events, 1, memory_order_relaxed);
        if (ev->kind == DREY__CACHE__V1__WATCH_EVENT__KIND__WATCHING) {
            atomic_store(&w->ready, true);
        } else if (ev->kind == DREY__CACHE__V1__WATCH_EVENT__KIND__SET) {
            atomic_store(&w->last_at, t);
            atomic_store(&w->last_version, ev->version);
            if (atomic_fetch_add(&arrived, 1) + 1 == n_watching) {
                pthread_mutex_lock(&arrived_mu);
                pthread_cond_signal(&arrived_cond);
                pthread_mutex_unlock(&arrived_mu);
            }
        } else if (ev->kind == DREY__CACHE__V1__WATCH_EVENT__KIND__RESYNC_REQUIRED) {
            atomic_fetch_add(&w->resyncs, 1);
            if (!holding) { /* one write at a time cannot overflow: the bench is broken */
                fprintf(stderr, "RESYNC_REQUIRED in a latency run\n");
                exit(1);
            }
        }
        drey_arena_reset(&a);
    }
    drey_client_stream_finish(w->stream, &a, &st);
    drey_arena_destroy(&a);
    return NULL;
}

static int run_server(size_t n_watchers, size_t writes, bool hold) {
    char err[256];
    drey_client *writer = drey_client_open(&(drey_client_options){.target = target}, err, sizeof err);
    if (writer == NULL) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    watcher *ws = calloc(n_watchers ? n_watchers : 1, sizeof *ws);
    n_watching = n_watchers;
    for (size_t i = 0; i < n_watchers; i++) {
        ws[i].client = drey_client_open(&(drey_client_options){.target = target}, err, sizeof err);
        pthread_create(&ws[i].thread, NULL, watch_main, &ws[i]);
    }
    int64_t end = now_ns() + 30 * 1000000000LL;
    for (size_t i = 0; i < n_watchers; i++) {
        while (!atomic_load(&ws[i].ready)) {
            if (now_ns() > end) {
                fprintf(stderr, "watcher %zu never said WATCHING\n", i);
                return 1;
            }
            sched_yield();
        }
    }
    if (hold) {
        printf("%zu watchers ready\n", n_watchers);
        fflush(stdout);
        char line[64];
        while (fgets(line, sizeof line, stdin) != NULL) {
        }
        uint64_t events = 0, resyncs = 0;
        for (size_t i = 0; i < n_watchers; i++) {
            events += atomic_load(&ws[i].events);
            resyncs += atomic_load(&ws[i].resyncs);
        }
        printf("%zu watchers had %llu events, %llu of them RESYNC_REQUIRED (readers too slow for their buffer)\n",
               n_watchers, (unsigned long long)events, (unsigned long long)resyncs);
        fflush(stdout);
        _exit(0); /* the streams go with the process */
    }
    int64_t *delay = malloc((writes * (n_watchers ? n_watchers : 1)) * sizeof *delay);
    int64_t *set_ns = malloc(writes * sizeof *set_ns);
    size_t nd = 0;
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    Drey__Cache__V1__Value v = DREY__CACHE__V1__VALUE__INIT;
    v.kind_case = DREY__CACHE__V1__VALUE__KIND_INT64_VALUE;
    for (size_t i = 0; i < writes + writes / 10; i++) { /* the first tenth warms up */
        Drey__Cache__V1__SetRequest req = DREY__CACHE__V1__SET_REQUEST__INIT;
        req.key = (char *)key;
        v.int64_value = (int64_t)i;
        req.value = &v;
        ProtobufCMessage *resp;
        drey_client_status st;
        atomic_store(&arrived, 0);
        int64_t t0 = now_ns();
        if (drey_client_unary(writer, DREY_CLIENT_CACHE("Set"), &req.base, &drey__cache__v1__set_response__descriptor,
                              10000, &a, &resp, &st) != GRPC_STATUS_OK) {
            fprintf(stderr, "Set: %s\n", st.message);
            return 1;
        }
        int64_t acked = now_ns();
        uint64_t version = ((Drey__Cache__V1__SetResponse *)resp)->version;
        bool counted = i >= writes / 10;
        if (counted)
            set_ns[i - writes / 10] = acked - t0;
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 10;
        pthread_mutex_lock(&arrived_mu);
        while (atomic_load(&arrived) < n_watchers) {
            if (pthread_cond_timedwait(&arrived_cond, &arrived_mu, &until) != 0) {
                fprintf(stderr, "%zu of %zu watchers had version %llu after 10 s\n", atomic_load(&arrived),
                        n_watchers, (unsigned long long)version);
                return 1;
            }
        }
        pthread_mutex_unlock(&arrived_mu);
        for (size_t j = 0; j < n_watchers; j++) {
            if (atomic_load(&ws[j].last_version) != version) {
                fprintf(stderr, "watcher %zu: an event out of step\n", j);
                return 1;
            }
            if (counted)
                delay[nd++] = atomic_load(&ws[j].last_at) - acked;
        }
        drey_arena_reset(&a);
    }
    printf("watchers=%zu writes=%zu filter=%s\n", n_watchers, writes, whole_cache ? "whole cache" : "one key");
    report("Set latency", set_ns, writes);
    if (n_watchers > 0)
        report("ack -> event delay", delay, nd);
    for (size_t i = 0; i < n_watchers; i++)
        drey_client_stream_cancel(ws[i].stream);
    for (size_t i = 0; i < n_watchers; i++) {
        pthread_join(ws[i].thread, NULL);
        drey_client_close(ws[i].client);
    }
    drey_arena_destroy(&a);
    drey_client_close(writer);
    free(ws);
    free(delay);
    free(set_ns);
    return 0;
}

int main(int argc, char **argv) {
    size_t watchers = 1, writes = 2000;
    bool hold = false;
    for (int i = 1; i < argc; i++) {
        if (strncmp(argv[i], "--target=", 9) == 0)
            target = argv[i] + 9;
        else if (strncmp(argv[i], "--watchers=", 11) == 0)
            watchers = strtoul(argv[i] + 11, NULL, 10);
        else if (strncmp(argv[i], "--writes=", 9) == 0)
            writes = strtoul(argv[i] + 9, NULL, 10);
        else if (strcmp(argv[i], "--keys=all") == 0)
            whole_cache = true;
        else if (strcmp(argv[i], "--hold") == 0)
            hold = holding = whole_cache = true;
        else {
            fprintf(stderr, "usage: %s --target=HOST:PORT [--watchers=N] [--writes=M] [--keys=all] [--hold]\n",
                    argv[0]);
            return 2;
        }
    }
    if (target == NULL || writes == 0) {
        fprintf(stderr, "--target is required\n");
        return 2;
    }
    return run_server(watchers, writes, hold);
}
