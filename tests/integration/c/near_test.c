/* The C client's near cache against the real dreyd: writes through another
 * connection invalidate it once their event has arrived, and a
 * RESYNC_REQUIRED (a watch reader held up past --watch-buffer-bytes)
 * empties it. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "drey/clock.h"
#include "harness.h"

static harness_env env;

static const char *const flags[] = {"--ephemeral", "--watch-buffer-bytes=64KiB", NULL};

static void up(void) {
    harness_up(&env, flags);
}

static void down(void) {
    harness_down(&env);
}

TestSuite(near, .init = up, .fini = down, .timeout = 120);

/* What the watch thread has applied, and a gate that can hold it up. */
typedef struct seen {
    _Atomic uint64_t last_set_version;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool hold, held;
} seen;

static void on_event(void *ctx, const Drey__Cache__V1__WatchEvent *ev) {
    seen *s = ctx;
    if (ev->kind == DREY__CACHE__V1__WATCH_EVENT__KIND__SET)
        atomic_store(&s->last_set_version, ev->version);
    pthread_mutex_lock(&s->mu);
    while (s->hold) {
        s->held = true;
        pthread_cond_broadcast(&s->cond);
        pthread_cond_wait(&s->cond, &s->mu);
    }
    pthread_mutex_unlock(&s->mu);
}

static drey_near_cache *open_near(seen *s, const char *cache) {
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cond, NULL);
    drey_near_options o = {
        .server = {.target = env.server.addr}, .cache = cache, .on_event = on_event, .on_event_ctx = s};
    char err[256];
    drey_near_cache *n = drey_near_open(&o, HARNESS_DEADLINE_MS, err, sizeof err);
    cr_assert_not_null(n, "%s", err);
    return n;
}

static uint64_t set(const char *cache, const char *key, Drey__Cache__V1__Value *v) {
    Drey__Cache__V1__SetRequest req = DREY__CACHE__V1__SET_REQUEST__INIT;
    req.cache = (char *)cache;
    req.key = (char *)key;
    req.value = v;
    Drey__Cache__V1__SetResponse *r =
        harness_ok(&env, DREY_CLIENT_CACHE("Set"), &req.base, &drey__cache__v1__set_response__descriptor);
    return r->version;
}

static void wait_version(seen *s, uint64_t v) {
    int64_t end = drey_mono_ms() + HARNESS_DEADLINE_MS;
    while (atomic_load(&s->last_set_version) < v)
        cr_assert_lt(drey_mono_ms(), end, "the event of version %llu did not arrive", (unsigned long long)v);
}

static uint64_t near_get(drey_near_cache *n, const char *key, bool *found) {
    Drey__Cache__V1__Value *v;
    uint64_t version;
    drey_client_status st;
    cr_assert(drey_near_get(n, key, 10000, &env.arena, found, &v, &version, &st), "%s", st.message);
    return version;
}

Test(near, never_serves_a_value_older_than_an_event_that_arrived) {
    seen s;
    drey_near_cache *n = open_near(&s, "near");
    bool found;
    for (int i = 0; i < 200; i++) {
        near_get(n, "k", &found); /* fills (or hits) the old value */
        uint64_t v = set("near", "k", harness_int(&env, i));
        if (i % 2 == 0)
            near_get(n, "k", &found); /* a read racing the event: either value */
        wait_version(&s, v);
        for (int j = 0; j < 2; j++) { /* a miss, then a hit of what it kept */
            uint64_t got = near_get(n, "k", &found);
            cr_assert(found);
            cr_assert_eq(got, v, "round %d: served version %llu after the event of %llu", i,
                         (unsigned long long)got, (unsigned long long)v);
        }
        drey_arena_reset(&env.arena);
    }
    drey_near_stats st;
    drey_near_get_stats(n, &st);
    cr_assert_geq(st.hits, 200, "the near cache never served from memory");
    cr_assert_geq(st.invalidations, 199); /* every round but the first (absence is not kept) */
    cr_assert_eq(st.watches, 1);
    drey_near_close(n);
}

Test(near, a_resync_empties_it) {
    seen s;
    drey_near_cache *n = open_near(&s, "resync");
    bool found;
    uint64_t va = set("resync", "a", harness_string(&env, "kept"));
    wait_version(&s, va);
    near_get(n, "a", &found);
    near_get(n, "a", &found);
    drey_near_stats before;
    drey_near_get_stats(n, &before);
    cr_assert_eq(before.entries, 1);
    cr_assert_geq(before.hits, 1);

    /* Hold the watch thread on the next event, then write far more than the
     * connection's window and the node's buffer hold. */
    pthread_mutex_lock(&s.mu);
    s.hold = true;
    pthread_mutex_unlock(&s.mu);
    /* Events without values are small on the wire: many of them, in
     * batches, to pass any window the connection grows. */
    enum { BATCH = 1000, BATCHES = 300 };
    static Drey__Cache__V1__SetManyRequest__Entry entries[BATCH];
    static Drey__Cache__V1__SetManyRequest__Entry *ptrs[BATCH];
    static char keys[BATCH][16];
    for (int i = 0; i < BATCH; i++) {
        drey__cache__v1__set_many_request__entry__init(&entries[i]);
        snprintf(keys[i], sizeof keys[i], "b%d", i);
        entries[i].key = keys[i];
        entries[i].value = harness_int(&env, i);
        ptrs[i] = &entries[i];
    }
    Drey__Cache__V1__SetManyRequest req = DREY__CACHE__V1__SET_MANY_REQUEST__INIT;
    req.cache = "resync";
    req.n_entries = BATCH;
    req.entries = ptrs;
    for (int b = 0; b < BATCHES; b++) /* 300,000 events */
        harness_ok(&env, DREY_CLIENT_CACHE("SetMany"), &req.base, &drey__cache__v1__set_many_response__descriptor);
    drey_arena_reset(&env.arena);
    pthread_mutex_lock(&s.mu);
    int64_t deadline = drey_deadline_after_ms(HARNESS_DEADLINE_MS);
    while (!s.held && drey_mono_ns() < deadline)
        drey_cond_wait_until(&s.cond, &s.mu, deadline);
    cr_assert(s.held, "the watch thread never got an event to hold");
    s.hold = false;
    pthread_cond_broadcast(&s.cond);
    pthread_mutex_unlock(&s.mu);
    /* Caught up once a small write's event arrives. A write whose event is
     * dropped by another overflow (the buffer may be full when it comes) is
     * covered by that RESYNC_REQUIRED: write again. */
    int64_t give_up = drey_mono_ms() + HARNESS_DEADLINE_MS;
    for (int i = 0;; i++) {
        /* RESYNC_REQUIRED from earlier stalls may still be on their way. */
        cr_assert_lt(drey_mono_ms(), give_up, "the watch never caught up (%d writes)", i);
        drey_near_stats now;
        drey_near_get_stats(n, &now);
        uint64_t v = set("resync", "small", harness_int(&env, i));
        int64_t end = drey_mono_ms() + HARNESS_DEADLINE_MS;
        while (atomic_load(&s.last_set_version) < v) {
            drey_near_stats later;
            drey_near_get_stats(n, &later);
            if (later.resyncs > now.resyncs)
                break;
            cr_assert_lt(drey_mono_ms(), end, "neither the event of %llu nor a resync came", (unsigned long long)v);
        }
        if (atomic_load(&s.last_set_version) >= v)
            break;
    }

    drey_near_stats after;
    drey_near_get_stats(n, &after);
    /* At least one: the connection's own buffers may let the node move on
     * and overflow again (the Python suite pins "exactly one" with a reader
     * whose window cannot grow). */
    cr_assert_geq(after.resyncs, 1, "no RESYNC_REQUIRED arrived (%llu events)", (unsigned long long)after.events);
    cr_assert_eq(after.entries, 0, "a RESYNC_REQUIRED left %llu entries", (unsigned long long)after.entries);
    cr_assert_eq(near_get(n, "a", &found), va);
    drey_near_get_stats(n, &after);
    cr_assert_eq(after.misses, before.misses + 1, "a was served from memory after the resync");
    drey_near_close(n);
}

/* A near cache of its own node: the node goes away, the watch ends, and the
 * near cache empties rather than serve what it can no longer keep fresh. */
Test(near, without_its_watch_it_serves_nothing_from_memory) {
    harness_server other;
    static const char *const other_flags[] = {"--ephemeral", NULL};
    harness_start(&other, other_flags);
    drey_near_options o = {.server = {.target = other.addr}, .cache = "gone"};
    char err[256];
    drey_near_cache *n = drey_near_open(&o, HARNESS_DEADLINE_MS, err, sizeof err);
    cr_assert_not_null(n, "%s", err);
    drey_client *c = harness_client(&other);
    Drey__Cache__V1__SetRequest req = DREY__CACHE__V1__SET_REQUEST__INIT;
    req.cache = "gone";
    req.key = "k";
    req.value = harness_string(&env, "v");
    ProtobufCMessage *resp;
    drey_client_status st;
    cr_assert_eq(drey_client_unary(c, DREY_CLIENT_CACHE("Set"), &req.base, &drey__cache__v1__set_response__descriptor,
                                   10000, &env.arena, &resp, &st),
                 GRPC_STATUS_OK);
    drey_client_close(c);
    bool found;
    drey_near_stats s;
    int64_t until = drey_mono_ms() + HARNESS_DEADLINE_MS;
    do { /* the Set's event may come after a first read and drop what it kept */
        cr_assert_lt(drey_mono_ms(), until, "never a hit");
        near_get(n, "k", &found);
        cr_assert(found);
        drey_near_get_stats(n, &s);
    } while (s.hits == 0);
    cr_assert_eq(s.entries, 1);
    uint64_t hits = s.hits;

    harness_stop(&other);
    int64_t end = drey_mono_ms() + HARNESS_DEADLINE_MS;
    do { /* the watch ends once the thread sees the stream go */
        cr_assert_lt(drey_mono_ms(), end, "the near cache still holds its entry");
        drey_near_get_stats(n, &s);
    } while (s.entries > 0);
    Drey__Cache__V1__Value *v;
    uint64_t version;
    cr_assert_not(drey_near_get(n, "k", 2000, &env.arena, &found, &v, &version, &st),
                  "served k with its node gone");
    drey_near_get_stats(n, &s);
    cr_assert_eq(s.hits, hits, "a hit without a watch");
    drey_near_close(n);
}

Test(near, open_fails_when_the_watch_does_not_start) {
    drey_near_options o = {.server = {.target = "127.0.0.1:1"}}; /* nothing listens on port 1 */
    char err[256] = "";
    int64_t t0 = drey_mono_ms();
    cr_assert_null(drey_near_open(&o, 300, err, sizeof err));
    cr_assert(strstr(err, "did not start") != NULL, "%s", err);
    cr_assert_lt(drey_mono_ms() - t0, 10000, "open did not give up near its timeout");
}
