/* Watches against a real etcd: events in revision order, none twice, none
 * lost, across an etcd kill and restart on the same data directory and a
 * SIGSTOP; compaction and cancellation reported; the callback rules. */
#include <pthread.h>
#include <stdatomic.h>

#include "etcd_fixture.h"

static etcd_cluster cluster;
static drey_etcd *e;
static drey_arena arena;
static drey_etcd_status st;

static void up(void) {
    etcd_start(&cluster, 1);
    e = client_of(cluster.endpoints);
    drey_arena_init(&arena, NULL, 0);
}

static void down(void) {
    drey_etcd_close(e);
    drey_arena_destroy(&arena);
    etcd_stop_all(&cluster);
}

TestSuite(watch, .init = up, .fini = down, .timeout = 90);

static int64_t put(const char *key, const char *value) {
    Etcdserverpb__PutRequest req = ETCDSERVERPB__PUT_REQUEST__INIT;
    req.key = drey_etcd_bytes(key);
    req.value = drey_etcd_bytes(value);
    Etcdserverpb__PutResponse *resp;
    drey_arena_reset(&arena);
    /* Retried around an etcd restart: a put whose outcome is unknown is
     * checked by the events' values, not assumed. */
    cr_assert(FIXTURE_WAIT_UNTIL(drey_etcd_put(e, &req, 2000, &arena, &resp, &st) == GRPC_STATUS_OK, 20000),
              "%s: %s", drey_etcd_code_name(st.code), st.message);
    return resp->header->revision;
}

/* What a watch delivered, for the test thread to look at. */
#define MAX_EVENTS 1024
typedef struct seen {
    pthread_mutex_t mu;
    int n;
    int64_t rev[MAX_EVENTS];
    int type[MAX_EVENTS];
    char key[MAX_EVENTS][32];
    char value[MAX_EVENTS][32];
    char prev[MAX_EVENTS][32];
    int calls;
    int ends;
    drey_etcd_watch_end_reason reason;
    int64_t compact_revision;
    grpc_status_code sync_code; /* a synchronous call made from the callback */
    bool close_from_callback;
    drey_etcd_watch *self;
} seen;

static void seen_init(seen *s) {
    memset(s, 0, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
}

static void on_events(void *user, Mvccpb__Event *const *events, size_t n) {
    seen *s = user;
    pthread_mutex_lock(&s->mu);
    s->calls++;
    for (size_t i = 0; i < n && s->n < MAX_EVENTS; i++) {
        const Mvccpb__KeyValue *kv = events[i]->kv;
        s->rev[s->n] = kv->mod_revision;
        s->type[s->n] = events[i]->type;
        snprintf(s->key[s->n], sizeof s->key[0], "%.*s", (int)kv->key.len, (const char *)kv->key.data);
        snprintf(s->value[s->n], sizeof s->value[0], "%.*s", (int)kv->value.len, (const char *)kv->value.data);
        if (events[i]->prev_kv != NULL)
            snprintf(s->prev[s->n], sizeof s->prev[0], "%.*s", (int)events[i]->prev_kv->value.len,
                     (const char *)events[i]->prev_kv->value.data);
        s->n++;
    }
    bool close_self = s->close_from_callback;
    pthread_mutex_unlock(&s->mu);
    if (close_self) {
        drey_etcd_status sync;
        drey_arena a;
        drey_arena_init(&a, NULL, 0);
        Etcdserverpb__RangeResponse *resp;
        drey_etcd_get(e, "x", false, 1000, &a, &resp, &sync);
        drey_arena_destroy(&a);
        pthread_mutex_lock(&s->mu);
        s->sync_code = sync.code;
        pthread_mutex_unlock(&s->mu);
        drey_etcd_watch_close(s->self);
    }
}

static void on_end(void *user, const drey_etcd_watch_end *end) {
    seen *s = user;
    pthread_mutex_lock(&s->mu);
    s->ends++;
    s->reason = end->reason;
    s->compact_revision = end->compact_revision;
    pthread_mutex_unlock(&s->mu);
}

static int count(seen *s) {
    pthread_mutex_lock(&s->mu);
    int n = s->n;
    pthread_mutex_unlock(&s->mu);
    return n;
}

static int ends(seen *s) {
    pthread_mutex_lock(&s->mu);
    int n = s->ends;
    pthread_mutex_unlock(&s->mu);
    return n;
}

static drey_etcd_watch *watch(seen *s, const char *prefix, int64_t from, bool prev_kv) {
    drey_etcd_watch *w = drey_etcd_watch_start(
        e, &(drey_etcd_watch_options){.key = prefix, .prefix = true, .start_revision = from, .prev_kv = prev_kv,
                                      .on_events = on_events, .on_end = on_end, .user = s});
    cr_assert_not_null(w);
    return w;
}

/* Every event once, in order: revisions strictly increase except within one
 * revision (a txn), values are the ones written in order. */
static void assert_in_order(seen *s, int want, const char *const *values) {
    pthread_mutex_lock(&s->mu);
    cr_assert_eq(s->n, want, "%d events, want %d", s->n, want);
    for (int i = 0; i < s->n; i++) {
        if (i > 0)
            cr_assert_geq(s->rev[i], s->rev[i - 1], "event %d: revision %lld after %lld", i, (long long)s->rev[i],
                          (long long)s->rev[i - 1]);
        if (values != NULL)
            cr_assert_str_eq(s->value[i], values[i], "event %d", i);
    }
    pthread_mutex_unlock(&s->mu);
}

Test(watch, events_arrive_in_revision_order_with_txns_and_deletes) {
    int64_t start = put("drey/w/a", "first");
    seen s;
    seen_init(&s);
    drey_etcd_watch *w = watch(&s, "drey/w/", start, true);
    put("drey/other", "not watched");
    char vals[100][8];
    const char *want[104];
    want[0] = "first";
    for (int i = 0; i < 100; i++) {
        snprintf(vals[i], sizeof vals[i], "v%d", i);
        want[i + 1] = vals[i];
        put(i % 2 ? "drey/w/a" : "drey/w/b", vals[i]);
    }
    /* One revision, two events. */
    drey_etcd_txn t;
    drey_etcd_txn_init(&t, &arena);
    drey_etcd_txn_put(&t, DREY_ETCD_THEN, "drey/w/c", "t1", 2, 0);
    drey_etcd_txn_put(&t, DREY_ETCD_THEN, "drey/w/d", "t2", 2, 0);
    Etcdserverpb__TxnResponse *tr;
    cr_assert_eq(drey_etcd_txn_commit(e, &t, 5000, &arena, &tr, &st), GRPC_STATUS_OK);
    want[101] = "t1";
    want[102] = "t2";
    Etcdserverpb__DeleteRangeRequest del = ETCDSERVERPB__DELETE_RANGE_REQUEST__INIT;
    del.key = drey_etcd_bytes("drey/w/c");
    Etcdserverpb__DeleteRangeResponse *dr;
    cr_assert_eq(drey_etcd_delete_range(e, &del, 5000, &arena, &dr, &st), GRPC_STATUS_OK);
    want[103] = "";
    cr_assert(FIXTURE_WAIT_UNTIL(count(&s) >= 104, 10000), "%d events", count(&s));
    fixture_pause_ms(200); /* nothing more arrives */
    assert_in_order(&s, 104, want);
    pthread_mutex_lock(&s.mu);
    cr_assert_eq(s.rev[101], s.rev[102], "a txn's events share its revision");
    cr_assert_eq(s.type[103], MVCCPB__EVENT__EVENT_TYPE__DELETE);
    cr_assert_str_eq(s.prev[103], "t1", "prev_kv was asked for");
    cr_assert_str_eq(s.prev[1], "", "v0 created drey/w/b");
    cr_assert_str_eq(s.prev[2], "first");
    cr_assert_str_eq(s.prev[3], "v0");
    pthread_mutex_unlock(&s.mu);
    drey_etcd_watch_stats stats = drey_etcd_watch_stats_of(w);
    cr_assert(stats.connected);
    cr_assert_eq(stats.streams, 1);
    cr_assert_eq(stats.next_revision, dr->header->revision + 1);
    drey_etcd_watch_close(w);
    cr_assert_eq(ends(&s), 0, "a close is not an end");
}

Test(watch, from_now_sees_only_later_changes) {
    put("drey/n/a", "before");
    seen s;
    seen_init(&s);
    drey_etcd_watch *w = watch(&s, "drey/n/", 0, false);
    cr_assert(FIXTURE_WAIT_UNTIL(drey_etcd_watch_stats_of(w).connected, 10000));
    int64_t r = put("drey/n/a", "after");
    cr_assert(FIXTURE_WAIT_UNTIL(count(&s) == 1, 10000));
    const char *want[] = {"after"};
    assert_in_order(&s, 1, want);
    cr_assert_eq(s.rev[0], r);
    drey_etcd_watch_close(w);
}

/* etcd killed mid-stream and restarted on its data directory: the watch
 * reopens from the revision after the last one it delivered. Writes made
 * while it was down (through another endpoint there is none: right after
 * the restart, before the watch is back) arrive, and none twice. */
Test(watch, resumes_after_etcd_is_killed_and_restarted) {
    int64_t start = put("drey/r/k", "v0");
    seen s;
    seen_init(&s);
    drey_etcd_watch *w = watch(&s, "drey/r/", start, false);
    char vals[60][8];
    const char *want[61];
    want[0] = "v0";
    for (int i = 1; i <= 30; i++) {
        snprintf(vals[i], sizeof vals[i], "v%d", i);
        want[i] = vals[i];
        put("drey/r/k", vals[i]);
    }
    cr_assert(FIXTURE_WAIT_UNTIL(count(&s) == 31, 10000));
    etcd_kill(&cluster, 0);
    cr_assert(FIXTURE_WAIT_UNTIL(!drey_etcd_watch_stats_of(w).connected, 10000), "the stream did not break");
    etcd_restart(&cluster, 0);
    for (int i = 31; i < 60; i++) {
        snprintf(vals[i], sizeof vals[i], "v%d", i);
        want[i] = vals[i];
        put("drey/r/k", vals[i]);
    }
    cr_assert(FIXTURE_WAIT_UNTIL(count(&s) >= 60, 20000), "%d events", count(&s));
    fixture_pause_ms(200);
    assert_in_order(&s, 60, want);
    drey_etcd_watch_stats stats = drey_etcd_watch_stats_of(w);
    cr_assert_geq(stats.streams, 2, "%llu streams", (unsigned long long)stats.streams);
    cr_assert(FIXTURE_WAIT_UNTIL(drey_etcd_watch_stats_of(w).connected, 10000));
    cr_assert_eq(ends(&s), 0);
    drey_etcd_watch_close(w);
}

/* A SIGSTOPped etcd is a stream that goes quiet, not one that breaks: after
 * SIGCONT the events written before the pause and after it all arrive. */
Test(watch, carries_on_after_sigstop_and_sigcont) {
    int64_t start = put("drey/s/k", "a");
    seen s;
    seen_init(&s);
    drey_etcd_watch *w = watch(&s, "drey/s/", start, false);
    cr_assert(FIXTURE_WAIT_UNTIL(count(&s) == 1, 10000));
    etcd_signal(&cluster, 0, SIGSTOP);
    fixture_pause_ms(500);
    etcd_signal(&cluster, 0, SIGCONT);
    put("drey/s/k", "b");
    cr_assert(FIXTURE_WAIT_UNTIL(count(&s) == 2, 10000));
    const char *want[] = {"a", "b"};
    assert_in_order(&s, 2, want);
    drey_etcd_watch_close(w);
}

Test(watch, a_compacted_start_revision_is_reported) {
    int64_t first = put("drey/c/k", "1");
    put("drey/c/k", "2");
    int64_t third = put("drey/c/k", "3");
    char args[64];
    snprintf(args, sizeof args, "compact %lld", (long long)third);
    etcdctl(&cluster, args);
    seen s;
    seen_init(&s);
    drey_etcd_watch *w = watch(&s, "drey/c/", first, false);
    cr_assert(FIXTURE_WAIT_UNTIL(ends(&s) == 1, 10000), "no end reported");
    pthread_mutex_lock(&s.mu);
    cr_assert_eq(s.reason, DREY_ETCD_WATCH_COMPACTED);
    cr_assert_eq(s.compact_revision, third);
    cr_assert_eq(s.n, 0);
    pthread_mutex_unlock(&s.mu);
    /* Ended: no reconnection loop. */
    uint64_t streams = drey_etcd_watch_stats_of(w).streams;
    fixture_pause_ms(300);
    cr_assert_eq(drey_etcd_watch_stats_of(w).streams, streams);
    cr_assert_eq(ends(&s), 1);
    drey_etcd_watch_close(w);
}

/* Inside a callback a synchronous call would wait for the thread it runs
 * on: it fails at once. Closing the watch from its own callback works, and
 * nothing more is delivered. */
Test(watch, callbacks_refuse_synchronous_calls_and_may_close_their_watch) {
    int64_t start = put("drey/cb/k", "1");
    seen s;
    seen_init(&s);
    s.close_from_callback = true;
    pthread_mutex_lock(&s.mu);
    s.self = watch(&s, "drey/cb/", start, false);
    pthread_mutex_unlock(&s.mu);
    cr_assert(FIXTURE_WAIT_UNTIL(count(&s) == 1, 10000));
    cr_assert(FIXTURE_WAIT_UNTIL(({
                                     pthread_mutex_lock(&s.mu);
                                     grpc_status_code c = s.sync_code;
                                     pthread_mutex_unlock(&s.mu);
                                     c;
                                 }) == GRPC_STATUS_FAILED_PRECONDITION,
                                 5000));
    put("drey/cb/k", "2");
    fixture_pause_ms(300);
    cr_assert_eq(count(&s), 1);
    pthread_mutex_lock(&s.mu);
    cr_assert_eq(s.calls, 1);
    pthread_mutex_unlock(&s.mu);
}

Test(watch, start_refuses_unusable_options) {
    cr_assert_null(drey_etcd_watch_start(e, &(drey_etcd_watch_options){.key = NULL, .on_events = on_events}));
    cr_assert_null(drey_etcd_watch_start(e, &(drey_etcd_watch_options){.key = "k"}));
    cr_assert_null(
        drey_etcd_watch_start(e, &(drey_etcd_watch_options){.key = "k", .on_events = on_events, .start_revision = -1}));
    drey_etcd_watch_close(NULL);
    drey_etcd_keepalive_stop(NULL);
}

/* Watches left open at close are closed without callbacks; many at once. */
Test(watch, close_ends_watches_left_open) {
    seen s[8];
    for (int i = 0; i < 8; i++) {
        seen_init(&s[i]);
        watch(&s[i], "drey/many/", 0, false);
    }
    drey_etcd_close(e);
    e = client_of(cluster.endpoints);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(ends(&s[i]), 0);
}
