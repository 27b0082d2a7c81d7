/*
 * Unit tests for src/journal/journal.c: the live journal and its writer.
 *
 * Everything runs on the fault file system. Batches are made deterministic
 * with a gate (an on_writer task that holds the writer between batches
 * while a test queues records), and crashes with sticky faults: "power
 * fails at the Nth write or sync" is a sticky failure from the Nth call on,
 * then drey_io_fault_crash. After every crash the journal is reopened and
 * what it replays is checked against what was acknowledged.
 */
#include <stdatomic.h>
#include <sys/mman.h>
#include <unistd.h>

#include "drey/clock.h"
#include "drey/log.h"
#include "tests/unit/journal/journal_util.h"

static drey_io_fault *fs;
static drey_io *io;

static void setup(void) {
    fs = drey_io_fault_create();
    io = drey_io_fault_io(fs);
}

static void teardown(void) {
    drey_io_fault_destroy(fs);
}

TestSuite(journal, .init = setup, .fini = teardown, .timeout = 60);

static drey_journal_options jopts(void) {
    return (drey_journal_options){
        .dir = JDIR,
        .io = io,
        .segment_bytes = SEG_BYTES,
        .fsync = DREY_FSYNC_ALWAYS,
        .batch_max_bytes = 1u << 20,
    };
}

static drey_journal *jopen(const drey_journal_options *o, uint64_t after, replayed *r) {
    drey_journal *j = NULL;
    char err[512] = "";
    int rc = drey_journal_open(o, after, r != NULL ? collect : NULL, r, &j, err, sizeof err);
    cr_assert_eq(rc, 0, "open: %d %s", rc, err);
    cr_assert_not_null(j);
    return j;
}

static drey_journal_stats stats_of(drey_journal *j) {
    drey_journal_stats s;
    drey_journal_get_stats(j, &s);
    return s;
}

/* Appends n records "<prefix>-<i>" one after another, each waited for. */
static void append_each(drey_journal *j, const char *prefix, size_t n, int want_err) {
    for (size_t i = 0; i < n; i++) {
        waiter w;
        waiter_init(&w);
        pending p;
        char payload[64];
        snprintf(payload, sizeof payload, "%s-%zu", prefix, i);
        pending_set(&p, &w, payload);
        append_or_done(j, &p.e);
        wait_done(&w, 1);
        cr_assert_eq(p.err, want_err, "%s-%zu: err %d, expected %d", prefix, i, p.err, want_err);
        waiter_destroy(&w);
    }
}

/* Appends one record and returns its error (and LSN). */
static int append_one(drey_journal *j, const char *payload, uint64_t *lsn) {
    waiter w;
    waiter_init(&w);
    pending p;
    pending_set(&p, &w, payload);
    append_or_done(j, &p.e);
    wait_done(&w, 1);
    waiter_destroy(&w);
    if (lsn != NULL)
        *lsn = p.lsn;
    return p.err;
}

/* --- order, LSNs, time ----------------------------------------------------- */

#define THREADS 4
#define PER_THREAD 100

typedef struct appender {
    drey_journal *j;
    waiter *w;
    pending *p;
    size_t t;
} appender;

static void *append_thread(void *arg) {
    appender *a = arg;
    for (size_t i = 0; i < PER_THREAD; i++) {
        char payload[64];
        snprintf(payload, sizeof payload, "t%zu-%zu", a->t, i);
        pending_set(&a->p[i], a->w, payload);
        append_or_done(a->j, &a->p[i].e);
    }
    return NULL;
}

Test(journal, appends_complete_in_lsn_order_with_non_decreasing_times) {
    drey_journal_options o = jopts();
    drey_journal *j = jopen(&o, 0, NULL);
    waiter w;
    waiter_init(&w);
    static pending p[THREADS][PER_THREAD];
    pthread_t th[THREADS];
    appender a[THREADS];
    for (size_t t = 0; t < THREADS; t++) {
        a[t] = (appender){.j = j, .w = &w, .p = p[t], .t = t};
        pthread_create(&th[t], NULL, append_thread, &a[t]);
    }
    for (size_t t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    wait_done(&w, THREADS * PER_THREAD);
    /* By completion order: LSN 1, 2, 3, ... and time never going back. */
    pending *by_order[THREADS * PER_THREAD] = {0};
    for (size_t t = 0; t < THREADS; t++) {
        for (size_t i = 0; i < PER_THREAD; i++) {
            cr_assert_eq(p[t][i].err, 0);
            cr_assert_null(by_order[p[t][i].order]);
            by_order[p[t][i].order] = &p[t][i];
            /* One thread's appends keep their order. */
            if (i > 0)
                cr_assert_gt(p[t][i].lsn, p[t][i - 1].lsn);
        }
    }
    for (size_t k = 0; k < THREADS * PER_THREAD; k++) {
        cr_assert_eq(by_order[k]->lsn, k + 1, "completion %zu has lsn %" PRIu64, k, by_order[k]->lsn);
        if (k > 0)
            cr_assert_geq(by_order[k]->time_ms, by_order[k - 1]->time_ms);
    }
    drey_journal_stats s = stats_of(j);
    cr_assert_eq(s.last_lsn, THREADS * PER_THREAD);
    cr_assert_eq(s.appends, THREADS * PER_THREAD);
    cr_assert_leq(s.batches, THREADS * PER_THREAD);
    cr_assert_eq(s.fsync, DREY_FSYNC_ALWAYS);
    cr_assert(!s.failed);
    drey_journal_close(j);

    /* Everything is replayed, in the same order with the same times. */
    replayed r = {0};
    j = jopen(&o, 0, &r);
    cr_assert_eq(r.n, THREADS * PER_THREAD);
    for (size_t k = 0; k < r.n; k++) {
        cr_assert_eq(r.lsn[k], k + 1);
        cr_assert_str_eq(r.payload[k], by_order[k]->payload);
        cr_assert_eq(r.time_ms[k], by_order[k]->time_ms);
    }
    replayed_free(&r);
    drey_journal_close(j);
    waiter_destroy(&w);
}

/* --- group commit ---------------------------------------------------------- */

typedef struct batch_log {
    pthread_mutex_t mu;
    size_t n;
    size_t records[1024];
} batch_log;

static void observe(void *ctx, size_t records, int64_t fsync_us) {
    batch_log *b = ctx;
    (void)fsync_us;
    pthread_mutex_lock(&b->mu);
    if (b->n < 1024)
        b->records[b->n++] = records;
    pthread_mutex_unlock(&b->mu);
}

Test(journal, records_queued_while_the_writer_is_busy_share_one_batch) {
    drey_journal_options o = jopts();
    drey_journal *j = jopen(&o, 0, NULL);
    batch_log b = {.mu = PTHREAD_MUTEX_INITIALIZER};
    drey_journal_set_batch_observer(j, observe, &b);
    append_each(j, "solo", 3, 0);
    drey_journal_stats before = stats_of(j);
    cr_assert_eq(before.batches, 3);

    gate g;
    gate_close(&g, j);
    waiter w;
    waiter_init(&w);
    static pending p[100];
    for (size_t i = 0; i < 100; i++) {
        char payload[32];
        snprintf(payload, sizeof payload, "group-%zu", i);
        pending_set(&p[i], &w, payload);
        append_or_done(j, &p[i].e);
    }
    gate_open(&g);
    wait_done(&w, 100);
    gate_destroy(&g);
    drey_journal_stats after = stats_of(j);
    cr_assert_eq(after.batches, before.batches + 1, "100 queued records took %" PRIu64 " batches",
                 after.batches - before.batches);
    cr_assert_eq(after.appends, 103);
    pthread_mutex_lock(&b.mu);
    cr_assert_eq(b.n, 4);
    cr_assert_eq(b.records[0], 1);
    cr_assert_eq(b.records[3], 100);
    pthread_mutex_unlock(&b.mu);
    for (size_t i = 0; i < 100; i++) {
        cr_assert_eq(p[i].err, 0);
        cr_assert_eq(p[i].lsn, 4 + i);
        cr_assert_eq(p[i].time_ms, p[0].time_ms, "one batch, one time");
    }
    drey_journal_close(j);
    waiter_destroy(&w);
}

/* The done bracket, as the pipeline sets it to answer a batch at once. */
static _Atomic int bracket_depth, bracket_begins;
static pending bracket_p[100];
static int depth_at_done[100];

static void bracket_begin(void) {
    atomic_fetch_add(&bracket_depth, 1);
    atomic_fetch_add(&bracket_begins, 1);
}

static void bracket_end(void) {
    atomic_fetch_sub(&bracket_depth, 1);
}

static void done_in_bracket(void *arg, const drey_journal_record *rec, int err) {
    depth_at_done[(pending *)arg - bracket_p] = atomic_load(&bracket_depth);
    on_done(arg, rec, err);
}

Test(journal, a_batch_completes_between_one_begin_and_one_end) {
    drey_journal_options o = jopts();
    drey_journal *j = jopen(&o, 0, NULL);
    drey_journal_set_done_bracket(j, bracket_begin, bracket_end);
    gate g;
    gate_close(&g, j);
    waiter w;
    waiter_init(&w);
    for (size_t i = 0; i < 100; i++) {
        char payload[32];
        snprintf(payload, sizeof payload, "bracketed-%zu", i);
        pending_set(&bracket_p[i], &w, payload);
        bracket_p[i].e.done = done_in_bracket;
        append_or_done(j, &bracket_p[i].e);
    }
    gate_open(&g);
    wait_done(&w, 100);
    gate_destroy(&g);
    drey_journal_close(j); /* the writer has left the bracket */
    cr_assert_eq(atomic_load(&bracket_begins), 1, "one batch, one bracket: %d", atomic_load(&bracket_begins));
    cr_assert_eq(atomic_load(&bracket_depth), 0);
    for (size_t i = 0; i < 100; i++)
        cr_assert_eq(depth_at_done[i], 1, "record %zu completed outside the bracket", i);
    waiter_destroy(&w);
}

Test(journal, batch_max_bytes_closes_a_batch) {
    drey_journal_options o = jopts();
    o.batch_max_bytes = 500;
    drey_journal *j = jopen(&o, 0, NULL);
    batch_log b = {.mu = PTHREAD_MUTEX_INITIALIZER};
    drey_journal_set_batch_observer(j, observe, &b);
    gate g;
    gate_close(&g, j);
    waiter w;
    waiter_init(&w);
    static pending p[41];
    for (size_t i = 0; i < 40; i++) {
        pending_set(&p[i], &w, "rec-xx"); /* a 48-byte frame */
        append_or_done(j, &p[i].e);
    }
    /* One record larger than the bound still goes, alone. */
    uint8_t *big = calloc(1, 2000);
    pending_set_big(&p[40], &w, big, 2000);
    append_or_done(j, &p[40].e);
    gate_open(&g);
    wait_done(&w, 41);
    pthread_mutex_lock(&b.mu);
    size_t total = 0;
    for (size_t i = 0; i < b.n; i++) {
        total += b.records[i];
        if (i + 1 < b.n)
            cr_assert_leq(b.records[i] * 48, 500, "batch %zu has %zu records", i, b.records[i]);
    }
    cr_assert_eq(total, 41);
    cr_assert_eq(b.records[b.n - 1], 1, "the big record is alone");
    cr_assert_geq(b.n, 5);
    pthread_mutex_unlock(&b.mu);
    for (size_t i = 0; i < 41; i++)
        cr_assert_eq(p[i].err, 0);
    drey_journal_close(j);
    free(big);
    gate_destroy(&g);
    waiter_destroy(&w);
}

/* --- segments --------------------------------------------------------------- */

static uint8_t *pattern(size_t len, uint64_t seed) {
    uint8_t *b = malloc(len ? len : 1);
    for (size_t i = 0; i < len; i++)
        b[i] = (uint8_t)(seed * 131 + i * 7);
    return b;
}

Test(journal, rotates_when_a_batch_does_not_fit) {
    drey_journal_options o = jopts();
    drey_journal *j = jopen(&o, 0, NULL);
    cr_assert_eq(stats_of(j).segments, 1);
    cr_assert_eq(count_segments(io), 1);
    waiter w;
    waiter_init(&w);
    enum { N = 200, LEN = 1000 };
    static pending p[N];
    for (size_t i = 0; i < N; i++) {
        pending_set_big(&p[i], &w, pattern(LEN, i), LEN);
        append_or_done(j, &p[i].e);
        if (i % 10 == 9)
            wait_done(&w, i + 1); /* batches of various sizes */
    }
    wait_done(&w, N);
    for (size_t i = 0; i < N; i++)
        cr_assert_eq(p[i].err, 0);
    drey_journal_stats s = stats_of(j);
    /* 200 frames of 1040 bytes in 64 KiB segments: at least 4. */
    cr_assert_geq(s.segments, 4);
    cr_assert_eq(s.segments, count_segments(io));
    cr_assert_eq(s.disk_bytes, s.segments * SEG_BYTES);
    drey_journal_close(j);

    drey_journal_scan sc;
    cr_assert_eq(drey_journal_scan_dir(io, JDIR, 0, NULL, NULL, &sc), 0);
    cr_assert_eq(sc.problem, DREY_JOURNAL_OK, "%s", sc.message);
    for (size_t i = 1; i < sc.n_segments; i++)
        cr_assert_eq(sc.segments[i].first_lsn, sc.segments[i - 1].last_lsn + 1);
    drey_journal_scan_free(&sc);

    drey_io_fault_crash(fs, false, 0);
    replayed r = {0};
    j = jopen(&o, 0, &r);
    cr_assert_eq(r.n, N);
    for (size_t i = 0; i < N; i++) {
        cr_assert_eq(r.lsn[i], i + 1);
        cr_assert_eq(r.len[i], LEN);
        uint8_t *want = pattern(LEN, i);
        cr_assert(memcmp(r.payload[i], want, LEN) == 0, "record %zu differs", i + 1);
        free(want);
    }
    replayed_free(&r);
    drey_journal_close(j);
    for (size_t i = 0; i < N; i++)
        free(p[i].big);
    waiter_destroy(&w);
}

/* A record larger than a whole segment gets a segment of its own size, as
 * the very first record (the segment created at open is still empty) and
 * in the middle of the journal. */
static void big_record_case(bool first) {
    drey_journal_options o = jopts();
    drey_journal *j = jopen(&o, 0, NULL);
    if (!first)
        append_each(j, "before", 5, 0);
    waiter w;
    waiter_init(&w);
    pending p;
    size_t len = 100 * 1024;
    pending_set_big(&p, &w, pattern(len, 9), len);
    append_or_done(j, &p.e);
    wait_done(&w, 1);
    cr_assert_eq(p.err, 0);
    uint64_t big_lsn = p.lsn;
    cr_assert_eq(big_lsn, first ? 1 : 6);
    append_each(j, "after", 5, 0);
    drey_journal_stats s = stats_of(j);
    cr_assert_eq(s.segments, count_segments(io), "the journal counts %" PRIu64 " segments, the directory has %zu",
                 s.segments, count_segments(io));
    /* Removing what a snapshot at the big record covers keeps the segment
     * being written. */
    unsigned removed;
    cr_assert_eq(drey_journal_remove_through(j, big_lsn, &removed), 0);
    cr_assert_eq(stats_of(j).segments, count_segments(io));
    append_each(j, "later", 3, 0);
    drey_journal_close(j);

    drey_io_fault_crash(fs, true, 1);
    replayed r = {0};
    j = jopen(&o, big_lsn, &r);
    /* Every record after the big one survives. */
    cr_assert_eq(r.n, 8, "replayed %zu", r.n);
    cr_assert_eq(r.lsn[0], big_lsn + 1);
    cr_assert_str_eq(r.payload[0], "after-0");
    cr_assert_str_eq(r.payload[7], "later-2");
    replayed_free(&r);
    drey_journal_close(j);
    drey_io_fault_crash(fs, false, 0);
    j = jopen(&o, big_lsn - 1, &r);
    cr_assert_eq(r.n, 9);
    cr_assert_eq(r.lsn[0], big_lsn);
    cr_assert_eq(r.len[0], len);
    uint8_t *want = pattern(len, 9);
    cr_assert(memcmp(r.payload[0], want, len) == 0);
    free(want);
    cr_assert_eq(r.lsn[8], big_lsn + 8);
    replayed_free(&r);
    drey_journal_close(j);
    free(p.big);
    waiter_destroy(&w);
}

Test(journal, record_larger_than_a_segment_as_the_first_record) {
    big_record_case(true);
}

Test(journal, record_larger_than_a_segment_mid_journal) {
    big_record_case(false);
}

/* Growing an empty segment for a big record is allocation too: without
 * space that record fails alone and the journal goes on. */
Test(journal, record_larger_than_a_segment_without_space_fails_alone) {
    drey_journal_options o = jopts();
    drey_journal *j = jopen(&o, 0, NULL);
    waiter w;
    waiter_init(&w);
    pending p;
    size_t len = 100 * 1024;
    pending_set_big(&p, &w, pattern(len, 3), len);
    drey_io_fault_fail_allocate(fs, 1, ENOSPC, false);
    append_or_done(j, &p.e);
    wait_done(&w, 1);
    cr_assert_eq(p.err, -ENOSPC);
    cr_assert(!stats_of(j).failed);
    uint64_t lsn;
    cr_assert_eq(append_one(j, "small", &lsn), 0);
    cr_assert_eq(lsn, 1);
    drey_journal_close(j);
    replayed r = {0};
    j = jopen(&o, 0, &r);
    cr_assert_eq(r.n, 1);
    cr_assert_str_eq(r.payload[0], "small");
    replayed_free(&r);
    drey_journal_close(j);
    free(p.big);
    waiter_destroy(&w);
}

Test(journal, reopen_continues_lsns) {
    drey_journal_options o = jopts();
    drey_journal *j = jopen(&o, 0, NULL);
    append_each(j, "a", 7, 0);
    drey_journal_close(j);
    replayed r = {0};
    j = jopen(&o, 0, &r);
    cr_assert_eq(r.n, 7);
    cr_assert_eq(stats_of(j).last_lsn, 7);
    uint64_t lsn;
    cr_assert_eq(append_one(j, "b", &lsn), 0);
    cr_assert_eq(lsn, 8);
    drey_journal_close(j);
    replayed_free(&r);
    /* Replay from a snapshot point: only what follows it. */
    j = jopen(&o, 5, &r);
    cr_assert_eq(r.n, 3);
    cr_assert_eq(r.lsn[0], 6);
    cr_assert_str_eq(r.payload[2], "b");
    cr_assert_eq(append_one(j, "c", &lsn), 0);
    cr_assert_eq(lsn, 9);
    replayed_free(&r);
    drey_journal_close(j);
}

/* A snapshot ahead of the journal (fsync never lost the tail, the snapshot
 * did not): the journal starts over after the snapshot. */
Test(journal, snapshot_ahead_of_the_journal_starts_a_new_one_after_it) {
    drey_journal_options o = jopts();
    drey_journal *j = jopen(&o, 0, NULL);
    append_each(j, "a", 4, 0);
    drey_journal_close(j);
    replayed r = {0};
    j = jopen(&o, 10, &r);
    cr_assert_eq(r.n, 0);
    uint64_t lsn;
    cr_assert_eq(append_one(j, "b", &lsn), 0);
    cr_assert_eq(lsn, 11);
    drey_journal_close(j);
    drey_io_fault_crash(fs, false, 0);
    j = jopen(&o, 10, &r);
    cr_assert_eq(r.n, 1);
    cr_assert_eq(r.lsn[0], 11);
    replayed_free(&r);
    drey_journal_close(j);
}

Test(journal, close_completes_what_was_queued) {
    drey_journal_options o = jopts();
    drey_journal *j = jopen(&o, 0, NULL);
    waiter w;
    waiter_init(&w);
    static pending p[50];
    for (size_t i = 0; i < 50; i++) {
        char payload[32];
        snprintf(payload, sizeof payload, "q-%zu", i);
        pending_set(&p[i], &w, payload);
        append_or_done(j, &p[i].e);
    }
    drey_journal_close(j);
    cr_assert_eq(w.done, 50);
    for (size_t i = 0; i < 50; i++)
        cr_assert_eq(p[i].err, 0);
    drey_io_fault_crash(fs, false, 0);
    replayed r = {0};
    j = jopen(&o, 0, &r);
    cr_assert_eq(r.n, 50);
    replayed_free(&r);
    drey_journal_close(j);
    waiter_destroy(&w);
}

/* --- failures ---------------------------------------------------------------- */

static void expect_failed_for_good(drey_journal *j, int err) {
    drey_journal_stats s = stats_of(j);
    cr_assert(s.failed);
    cr_assert_eq(s.failed_errno, err);
    /* Every later append fails, even though the disk works again. */
    for (int i = 0; i < 3; i++) {
        int rc = append_one(j, "after-failure", NULL);
        cr_assert_neq(rc, 0);
        cr_assert_lt(rc, 0);
    }
    cr_assert(stats_of(j).failed);
}

Test(journal, eio_at_write_fails_the_batch_and_the_journal) {
    drey_journal_options o = jopts();
    drey_journal *j = jopen(&o, 0, NULL);
    append_each(j, "ok", 3, 0);
    drey_journal_stats before = stats_of(j);
    drey_io_fault_fail_write(fs, 1, EIO, false);
    cr_assert_eq(append_one(j, "lost", NULL), -EIO);
    expect_failed_for_good(j, EIO);
    cr_assert_eq(stats_of(j).last_lsn, before.last_lsn);
    cr_assert_eq(stats_of(j).appends, before.appends);
    drey_journal_close(j);
    drey_io_fault_crash(fs, true, 7);
    /* A restart trusts the disk again: what was acknowledged, only. */
    replayed r = {0};
    j = jopen(&o, 0, &r);
    cr_assert_eq(r.n, 3);
    cr_assert(!stats_of(j).failed);
    uint64_t lsn;
    cr_assert_eq(append_one(j, "again", &lsn), 0);
    cr_assert_eq(lsn, 4);
    replayed_free(&r);
    drey_journal_close(j);
}

Test(journal, enospc_at_write_fails_the_journal_too) {
    drey_journal_options o = jopts();
    drey_journal *j = jopen(&o, 0, NULL);
    append_each(j, "ok", 2, 0);
    drey_io_fault_fail_write(fs, 1, ENOSPC, true);
    cr_assert_eq(append_one(j, "lost", NULL), -ENOSPC);
    drey_io_fault_fail_write(fs, 0, 0, false);
    expect_failed_for_good(j, ENOSPC);
    drey_journal_close(j);
    replayed r = {0};
    j = jopen(&o, 0, &r);
    cr_assert_eq(r.n, 2);
    replayed_free(&r);
    drey_journal_close(j);
}

Test(journal, eio_at_fdatasync_fails_the_batch_and_the_journal) {
    drey_journal_options o = jopts();
    drey_journal *j = jopen(&o, 0, NULL);
    append_each(j, "ok", 3, 0);
    drey_io_fault_fail_sync(fs, 1, EIO, false);
    cr_assert_eq(append_one(j, "unsynced", NULL), -EIO);
    expect_failed_for_good(j, EIO);
    drey_journal_close(j);
    /* The failed record was written but never made durable: a power loss
     * takes it, or not; either way nothing acknowledged is lost. */
    for (uint32_t seed = 0; seed < 8; seed++) {
        drey_io_fault_crash(fs, seed > 0, seed);
        replayed r = {0};
        j = jopen(&o, 0, &r);
        cr_assert(r.n == 3 || r.n == 4, "seed %u: %zu records", seed, r.n);
        cr_assert_str_eq(r.payload[2], "ok-2");
        replayed_free(&r);
        drey_journal_close(j);
    }
}

Test(journal, enospc_at_fallocate_fails_the_batch_but_not_the_journal) {
    drey_journal_options o = jopts();
    o.segment_bytes = 4096;
    drey_journal *j = jopen(&o, 0, NULL);
    /* Fill the first segment until the next record needs a new one. */
    size_t appended = 0;
    while (true) {
        drey_journal_stats s = stats_of(j);
        uint64_t used = DREY_SEGMENT_HEADER + s.bytes_written;
        if (used + 2 * drey_frame_size(10) > 4096)
            break;
        cr_assert_eq(append_one(j, "0123456789", NULL), 0);
        appended++;
    }
    if (DREY_SEGMENT_HEADER + stats_of(j).bytes_written + drey_frame_size(10) <= 4096) {
        cr_assert_eq(append_one(j, "0123456789", NULL), 0);
        appended++;
    }
    cr_assert_eq(stats_of(j).segments, 1);
    drey_io_fault_fail_allocate(fs, 1, ENOSPC, true);
    for (int i = 0; i < 3; i++)
        cr_assert_eq(append_one(j, "0123456789", NULL), -ENOSPC);
    drey_journal_stats s = stats_of(j);
    cr_assert(!s.failed, "a full disk does not make the journal untrustworthy");
    cr_assert_eq(s.segments, 1);
    cr_assert_eq(count_segments(io), 1);
    cr_assert_eq(s.last_lsn, appended);
    /* Space again: appends go on, with the next LSN. */
    drey_io_fault_fail_allocate(fs, 0, 0, false);
    uint64_t lsn;
    cr_assert_eq(append_one(j, "after", &lsn), 0);
    cr_assert_eq(lsn, appended + 1);
    cr_assert_eq(stats_of(j).segments, 2);
    drey_journal_close(j);
    drey_io_fault_crash(fs, true, 3);
    replayed r = {0};
    j = jopen(&o, 0, &r);
    cr_assert_eq(r.n, appended + 1);
    cr_assert_str_eq(r.payload[r.n - 1], "after");
    replayed_free(&r);
    drey_journal_close(j);
}

Test(journal, open_fails_cleanly_when_no_segment_can_be_created) {
    drey_journal_options o = jopts();
    drey_io_fault_fail_allocate(fs, 1, ENOSPC, true);
    drey_journal *j = NULL;
    char err[512] = "";
    int rc = drey_journal_open(&o, 0, NULL, NULL, &j, err, sizeof err);
    cr_assert_eq(rc, -ENOSPC);
    cr_assert_null(j);
    cr_assert(strstr(err, "cannot create a journal segment") != NULL, "%s", err);
    drey_io_fault_fail_allocate(fs, 0, 0, false);
    j = jopen(&o, 0, NULL);
    append_each(j, "x", 1, 0);
    drey_journal_close(j);
}

Test(journal, open_refuses_damage_naming_file_and_offset) {
    drey_journal_options o = jopts();
    o.segment_bytes = 4096;
    drey_journal *j = jopen(&o, 0, NULL);
    append_each(j, "0123456789012345678901234567890123456789", 200, 0);
    drey_journal_close(j);
    cr_assert_geq(count_segments(io), 3);
    char p[128];
    seg_path(p, sizeof p, 1);
    flip_bit(io, p, DREY_SEGMENT_HEADER + 100, 0);
    replayed r = {0};
    char err[1024] = "";
    int rc = drey_journal_open(&o, 0, collect, &r, &j, err, sizeof err);
    cr_assert_eq(rc, -EINVAL);
    cr_assert(strstr(err, "damaged frame in " JDIR "/journal/0000000000000001.seg at offset") != NULL, "%s", err);
    cr_assert(strstr(err, "dreyd storage repair") != NULL, "%s", err);
    replayed_free(&r);
    /* Nothing was changed: it refuses again, the same way. */
    char err2[1024] = "";
    cr_assert_eq(drey_journal_open(&o, 0, NULL, NULL, &j, err2, sizeof err2), -EINVAL);
    cr_assert_str_eq(err, err2);
}

Test(journal, replay_error_refuses_to_open) {
    drey_journal_options o = jopts();
    drey_journal *j = jopen(&o, 0, NULL);
    append_each(j, "x", 5, 0);
    drey_journal_close(j);
    replayed r = {.stop_at = 3};
    char err[512];
    cr_assert_neq(drey_journal_open(&o, 0, collect, &r, &j, err, sizeof err), 0);
    cr_assert(strstr(err, "replaying") != NULL, "%s", err);
    replayed_free(&r);
}

/* --- torn tails at open ------------------------------------------------------- */

/* One round: five durable records, then a batch of 20 written whose sync
 * fails (on disk, unsynced), a torn crash, and a reopen. Returns whether
 * the scan saw a torn tail. */
static bool torn_round(uint32_t seed) {
    drey_io_fault_destroy(fs);
    fs = drey_io_fault_create();
    io = drey_io_fault_io(fs);
    drey_journal_options o = jopts();
    drey_journal *j = jopen(&o, 0, NULL);
    append_each(j, "durable", 5, 0);
    gate g;
    gate_close(&g, j);
    waiter w;
    waiter_init(&w);
    static pending p[20];
    for (size_t i = 0; i < 20; i++) {
        char payload[64];
        snprintf(payload, sizeof payload, "torn-%zu-%040d", i, 0);
        pending_set(&p[i], &w, payload);
        append_or_done(j, &p[i].e);
    }
    drey_io_fault_fail_sync(fs, 1, EIO, true);
    gate_open(&g);
    wait_done(&w, 20);
    gate_destroy(&g);
    waiter_destroy(&w);
    for (size_t i = 0; i < 20; i++)
        cr_assert_eq(p[i].err, -EIO);
    drey_journal_close(j);
    drey_io_fault_crash(fs, true, seed);

    drey_journal_scan sc;
    cr_assert_eq(drey_journal_scan_dir(io, JDIR, 0, NULL, NULL, &sc), 0);
    cr_assert(sc.problem == DREY_JOURNAL_OK || sc.problem == DREY_JOURNAL_TORN_TAIL, "seed %u: %s", seed,
              sc.message);
    bool torn = sc.problem == DREY_JOURNAL_TORN_TAIL;
    drey_journal_scan_free(&sc);
    replayed r = {0};
    j = jopen(&o, 0, &r);
    cr_assert_geq(r.n, 5);
    cr_assert_leq(r.n, 25);
    cr_assert_eq(stats_of(j).torn_tails_cut, torn ? 1 : 0, "seed %u", seed);
    uint64_t lsn;
    cr_assert_eq(append_one(j, "after", &lsn), 0);
    cr_assert_eq(lsn, r.n + 1);
    drey_journal_close(j);
    replayed_free(&r);
    /* Cut for good: the next open finds a clean journal ending in "after". */
    drey_io_fault_crash(fs, true, seed + 1);
    j = jopen(&o, 0, &r);
    cr_assert_eq(stats_of(j).torn_tails_cut, 0, "seed %u", seed);
    cr_assert_eq(r.n, lsn);
    cr_assert_str_eq(r.payload[r.n - 1], "after");
    replayed_free(&r);
    drey_journal_close(j);
    return torn;
}

Test(journal, torn_tail_is_cut_counted_and_logged) {
    int logfd = memfd_create("log", 0);
    cr_assert_geq(logfd, 0);
    drey_log_set_fd(logfd);
    unsigned torn = 0, clean = 0;
    for (uint32_t seed = 1; seed <= 40; seed++) {
        if (torn_round(seed))
            torn++;
        else
            clean++;
    }
    drey_log_set_fd(2);
    cr_assert_gt(torn, 0, "no seed tore the batch");
    char logbuf[1 << 16] = "";
    ssize_t n = pread(logfd, logbuf, sizeof logbuf - 1, 0);
    cr_assert_gt(n, 0);
    cr_assert(strstr(logbuf, "torn final batch") != NULL, "log: %s", logbuf);
    close(logfd);
}

/* --- crash tests ------------------------------------------------------------- */

/* The splitmix64 of the tests. */
static uint64_t rng;
static uint64_t rnd(void) {
    uint64_t z = (rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

#define MAX_RECS 256
#define MAX_LEN 400

/* What a crash test knows: the records recovered or acknowledged, by LSN,
 * and the groups that failed since the last acknowledgement (a failed
 * batch may or may not be on disk; it gets LSNs only if it is). */
typedef struct history {
    char acked[MAX_RECS][MAX_LEN]; /* by LSN - 1 */
    size_t n;                      /* LSNs 1..n known */
    char failed[MAX_RECS][MAX_LEN];
    size_t nfailed;
    size_t group_start[MAX_RECS], group_len[MAX_RECS];
    size_t ngroups;
} history;

/* Appends `count` records in groups of random sizes, each group one batch
 * (queued while the gate holds the writer). Returns how many were
 * acknowledged. */
static size_t append_groups(drey_journal *j, history *h, size_t count) {
    size_t acks = 0;
    for (size_t i = 0; i < count;) {
        size_t g = 1 + rnd() % 6;
        if (g > count - i)
            g = count - i;
        gate gt;
        gate_close(&gt, j);
        waiter w;
        waiter_init(&w);
        pending *p = calloc(g, sizeof *p);
        char (*text)[MAX_LEN] = calloc(g, MAX_LEN);
        for (size_t k = 0; k < g; k++) {
            size_t len = 8 + rnd() % 300;
            int n = snprintf(text[k], MAX_LEN, "a%zu:", i + k);
            for (size_t c = (size_t)n; c < len; c++)
                text[k][c] = (char)('a' + (c + i + k) % 26);
            text[k][len] = '\0';
            pending_set_big(&p[k], &w, (uint8_t *)text[k], len);
            append_or_done(j, &p[k].e);
        }
        gate_open(&gt);
        wait_done(&w, g);
        gate_destroy(&gt);
        waiter_destroy(&w);
        /* One batch, but a batch is written segment by segment: its
         * records that fit the current segment are made durable before
         * the rest starts a new one. So the outcomes are some successes,
         * then (if a write, sync or new segment failed) failures. */
        size_t f = 0;
        while (f < g && p[f].err == 0)
            f++;
        for (size_t k = f; k < g; k++)
            cr_assert_neq(p[k].err, 0, "nothing succeeds after a failure in one batch");
        for (size_t k = 0; k < f; k++) {
            cr_assert_eq(p[k].lsn, h->n + 1, "LSNs follow the acknowledged ones");
            memcpy(h->acked[h->n++], text[k], MAX_LEN);
        }
        if (f > 0)
            h->nfailed = h->ngroups = 0;
        acks += f;
        if (f < g) {
            h->group_start[h->ngroups] = h->nfailed;
            h->group_len[h->ngroups++] = g - f;
            for (size_t k = f; k < g; k++)
                memcpy(h->failed[h->nfailed++], text[k], MAX_LEN);
        }
        free(p);
        free(text);
        i += g;
    }
    return acks;
}

/* How often the interesting cases happened, so the loops prove they
 * exercise them. */
static unsigned seen_torn, seen_unacked_kept, seen_acked_lost;

/* Reopens after a crash and checks the replay against the history: LSNs
 * 1..R, the first `must_have` of them exactly the acknowledged records, any
 * further known ones too, and any beyond those the start of one batch that
 * failed (written, never synced). The history becomes what was recovered. */
static drey_journal *reopen_and_check(const drey_journal_options *o, history *h, size_t must_have,
                                      const char *what) {
    drey_journal_scan sc;
    cr_assert_eq(drey_journal_scan_dir(io, JDIR, 0, NULL, NULL, &sc), 0);
    cr_assert(sc.problem == DREY_JOURNAL_OK || sc.problem == DREY_JOURNAL_TORN_TAIL, "%s: scan after crash: %s", what,
              sc.message);
    bool torn = sc.problem == DREY_JOURNAL_TORN_TAIL;
    drey_journal_scan_free(&sc);
    replayed r = {0};
    drey_journal *j = NULL;
    char err[1024] = "";
    int rc = drey_journal_open(o, 0, collect, &r, &j, err, sizeof err);
    cr_assert_eq(rc, 0, "%s: reopen: %s", what, err);
    cr_assert_geq(r.n, must_have, "%s: %zu records replayed, %zu were acknowledged", what, r.n, must_have);
    for (size_t i = 0; i < r.n; i++)
        cr_assert_eq(r.lsn[i], i + 1, "%s", what);
    size_t known = r.n < h->n ? r.n : h->n;
    for (size_t i = 0; i < known; i++)
        cr_assert_str_eq(r.payload[i], h->acked[i], "%s: lsn %zu", what, i + 1);
    if (r.n > h->n) {
        size_t extra = r.n - h->n;
        bool found = false;
        for (size_t g = 0; g < h->ngroups && !found; g++) {
            if (h->group_len[g] < extra)
                continue;
            bool match = true;
            for (size_t k = 0; k < extra && match; k++)
                match = strcmp(r.payload[h->n + k], h->failed[h->group_start[g] + k]) == 0;
            found = match;
        }
        cr_assert(found, "%s: %zu records replayed beyond the %zu known are no failed batch's", what, extra, h->n);
        seen_unacked_kept++;
        for (size_t k = 0; k < extra; k++)
            snprintf(h->acked[h->n + k], MAX_LEN, "%s", r.payload[h->n + k]);
    }
    drey_journal_stats s = stats_of(j);
    cr_assert_eq(s.torn_tails_cut, torn ? 1 : 0, "%s", what);
    cr_assert_eq(s.last_lsn, r.n);
    cr_assert(!s.failed);
    seen_torn += torn;
    seen_acked_lost += r.n < h->n;
    h->n = r.n;
    h->nfailed = h->ngroups = 0;
    replayed_free(&r);
    return j;
}

static void crash_round(uint32_t seed, drey_fsync_policy policy) {
    char what[160];
    drey_io_fault_destroy(fs);
    fs = drey_io_fault_create();
    io = drey_io_fault_io(fs);
    rng = seed * 0x51ed27ull + policy;
    drey_journal_options o = jopts();
    o.segment_bytes = 4096; /* rotations within a round */
    o.fsync = policy;
    o.fsync_interval_ms = 3600 * 1000; /* never due during the test */
    static history h;
    memset(&h, 0, sizeof h);
    drey_journal *j = jopen(&o, 0, NULL);
    size_t count = 10 + rnd() % 30;
    /* Power fails at the Nth write or sync (sticky: nothing after it
     * reaches the disk), or not at all. */
    unsigned kind = (unsigned)(rnd() % 4); /* a sync failure twice as often */
    if (kind == 3)
        kind = 1;
    unsigned nth = 1 + (unsigned)(rnd() % (kind == 0 ? count + 4 : count / 3 + 4));
    if (kind == 0)
        drey_io_fault_fail_write(fs, nth, EIO, true);
    else if (kind == 1)
        drey_io_fault_fail_sync(fs, nth, EIO, true);
    size_t acks = append_groups(j, &h, count);
    bool torn = seed % 4 != 0;
    drey_io_fault_crash(fs, torn, seed);
    drey_journal_close(j);
    snprintf(what, sizeof what, "seed %u policy %d kind %u nth %u torn %d", seed, policy, kind, nth, torn);
    j = reopen_and_check(&o, &h, policy == DREY_FSYNC_ALWAYS ? acks : 0, what);

    /* The journal works after recovery, and what it acknowledges survives
     * the next crash. */
    size_t more = 5 + rnd() % 10;
    cr_assert_eq(append_groups(j, &h, more), more, "%s: appends after recovery", what);
    drey_io_fault_crash(fs, true, seed + 1000);
    drey_journal_close(j);
    snprintf(what, sizeof what, "seed %u policy %d second crash", seed, policy);
    j = reopen_and_check(&o, &h, policy == DREY_FSYNC_ALWAYS ? h.n : 0, what);
    drey_journal_close(j);
}

Test(journal, crash_loop_fsync_always_loses_nothing_acknowledged) {
    for (uint32_t seed = 1; seed <= 400; seed++)
        crash_round(seed, DREY_FSYNC_ALWAYS);
    cr_log_info("torn tails cut %u, unacknowledged records kept %u", seen_torn, seen_unacked_kept);
    cr_assert_gt(seen_torn, 10, "torn tails cut: %u", seen_torn);
    cr_assert_gt(seen_unacked_kept, 5, "unacknowledged records recovered: %u", seen_unacked_kept);
    cr_assert_eq(seen_acked_lost, 0);
}

/* With fsync interval or never, a crash may lose acknowledged records, but
 * the node must come back with a prefix of what was written. */
Test(journal, crash_loop_fsync_interval_recovers_a_prefix) {
    for (uint32_t seed = 1; seed <= 100; seed++)
        crash_round(seed, DREY_FSYNC_INTERVAL);
    cr_assert_gt(seen_torn, 10, "torn tails cut: %u", seen_torn);
    cr_assert_gt(seen_acked_lost, 10, "rounds that lost acknowledged records: %u", seen_acked_lost);
}

Test(journal, crash_loop_fsync_never_recovers_a_prefix) {
    for (uint32_t seed = 1; seed <= 100; seed++)
        crash_round(seed, DREY_FSYNC_NEVER);
    cr_assert_gt(seen_torn, 10, "torn tails cut: %u", seen_torn);
    cr_assert_gt(seen_acked_lost, 10, "rounds that lost acknowledged records: %u", seen_acked_lost);
}

/* With fsync never, a segment switch must not leave a hole: power loss
 * after the next segment was made durable loses the unsynced end of the
 * previous one, and the journal must still open. */
Test(journal, fsync_never_rotation_then_power_loss_still_opens) {
    drey_journal_options o = jopts();
    o.segment_bytes = 4096;
    o.fsync = DREY_FSYNC_NEVER;
    drey_journal *j = jopen(&o, 0, NULL);
    append_each(j, "0123456789012345678901234567890123456789", 150, 0);
    cr_assert_geq(stats_of(j).segments, 2);
    drey_io_fault_crash(fs, false, 0);
    drey_journal_close(j);
    replayed r = {0};
    char err[1024] = "";
    int rc = drey_journal_open(&o, 0, collect, &r, &j, err, sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    for (size_t i = 0; i < r.n; i++)
        cr_assert_eq(r.lsn[i], i + 1);
    replayed_free(&r);
    drey_journal_close(j);
}

/* --- the writer's schedule ------------------------------------------------ */

static drey_journal *horizon_j;
static int64_t horizon_seen, horizon_stamp;

static void on_done_horizon(void *arg, const drey_journal_record *rec, int err) {
    (void)err;
    /* Applied on the writer; the clock has moved far ahead meanwhile. */
    horizon_stamp = rec->time_ms;
    horizon_seen = drey_journal_sweep_horizon(horizon_j, rec->time_ms + 3600 * 1000);
    on_done(arg, rec, err);
}

Test(journal, sweep_horizon_never_passes_a_stamped_unapplied_batch) {
    drey_journal_options o = jopts();
    drey_journal *j = jopen(&o, 0, NULL);
    horizon_j = j;
    /* Idle: the horizon is now. */
    cr_assert_eq(drey_journal_sweep_horizon(j, 12345), 12345);
    waiter w;
    waiter_init(&w);
    pending p;
    pending_set(&p, &w, "h");
    p.e.done = on_done_horizon;
    append_or_done(j, &p.e);
    wait_done(&w, 1);
    cr_assert_eq(p.err, 0);
    cr_assert_leq(horizon_seen, horizon_stamp, "horizon %" PRId64 " passed the unapplied batch at %" PRId64,
                  horizon_seen, horizon_stamp);
    /* Later records are stamped no earlier than the horizon asked for. */
    pending q;
    pending_set(&q, &w, "later");
    append_or_done(j, &q.e);
    wait_done(&w, 2);
    cr_assert_geq(q.time_ms, horizon_stamp + 3600 * 1000);
    /* Time never goes back across a restart either. */
    drey_journal_close(j);
    j = jopen(&o, 0, NULL);
    pending r;
    pending_set(&r, &w, "after-restart");
    append_or_done(j, &r.e);
    wait_done(&w, 3);
    cr_assert_geq(r.time_ms, q.time_ms);
    drey_journal_close(j);
    waiter_destroy(&w);
}

typedef struct task_probe {
    waiter *w;
    uint64_t lsn;
    int64_t time_ms;
    size_t done_when_run; /* completions seen when the task ran */
    bool ran;
} task_probe;

static void probe_task(void *arg, uint64_t lsn, int64_t time_ms) {
    task_probe *t = arg;
    pthread_mutex_lock(&t->w->mu);
    t->lsn = lsn;
    t->time_ms = time_ms;
    t->done_when_run = t->w->done;
    t->ran = true;
    pthread_cond_broadcast(&t->w->cond);
    pthread_mutex_unlock(&t->w->mu);
}

Test(journal, on_writer_tasks_run_between_batches_with_the_last_applied_lsn) {
    drey_journal_options o = jopts();
    drey_journal *j = jopen(&o, 0, NULL);
    waiter w;
    waiter_init(&w);
    /* On an idle journal: the last record's LSN and time. */
    pending a[3];
    for (int i = 0; i < 3; i++) {
        pending_set(&a[i], &w, "a");
        append_or_done(j, &a[i].e);
    }
    wait_done(&w, 3);
    task_probe t1 = {.w = &w};
    drey_journal_on_writer(j, probe_task, &t1);
    pthread_mutex_lock(&w.mu);
    while (!t1.ran)
        pthread_cond_wait(&w.cond, &w.mu);
    pthread_mutex_unlock(&w.mu);
    cr_assert_eq(t1.lsn, 3);
    cr_assert_eq(t1.time_ms, a[2].time_ms);

    /* Queued together with a batch: the task sees the state before it, and
     * none of the batch has been applied. */
    gate g;
    gate_close(&g, j);
    pending b[5];
    for (int i = 0; i < 5; i++) {
        pending_set(&b[i], &w, "b");
        append_or_done(j, &b[i].e);
    }
    task_probe t2 = {.w = &w};
    drey_journal_on_writer(j, probe_task, &t2);
    gate_open(&g);
    wait_done(&w, 8);
    cr_assert(t2.ran);
    cr_assert_eq(t2.lsn, 3);
    cr_assert_eq(t2.done_when_run, 3);

    /* Queued after a batch: sees all of it. */
    task_probe t3 = {.w = &w};
    drey_journal_on_writer(j, probe_task, &t3);
    pthread_mutex_lock(&w.mu);
    while (!t3.ran)
        pthread_cond_wait(&w.cond, &w.mu);
    pthread_mutex_unlock(&w.mu);
    cr_assert_eq(t3.lsn, 8);
    cr_assert_eq(t3.time_ms, b[4].time_ms);
    drey_journal_close(j);
    gate_destroy(&g);
    waiter_destroy(&w);
}

Test(journal, remove_through_deletes_only_wholly_covered_segments) {
    drey_journal_options o = jopts();
    o.segment_bytes = 4096;
    drey_journal *j = jopen(&o, 0, NULL);
    append_each(j, "0123456789012345678901234567890123456789", 250, 0);
    drey_journal_scan sc;
    cr_assert_eq(drey_journal_scan_dir(io, JDIR, 0, NULL, NULL, &sc), 0);
    size_t nseg = sc.n_segments;
    cr_assert_geq(nseg, 4);
    uint64_t first[64];
    for (size_t i = 0; i < nseg; i++)
        first[i] = sc.segments[i].first_lsn;
    drey_journal_scan_free(&sc);
    cr_assert_eq(stats_of(j).segments, nseg);

    unsigned removed = 99;
    /* Up to the one-but-last record of segment 2: only segment 1 goes. */
    cr_assert_eq(drey_journal_remove_through(j, first[2] - 2, &removed), 0);
    cr_assert_eq(removed, 1);
    cr_assert_eq(count_segments(io), nseg - 1);
    char p[128];
    seg_path(p, sizeof p, first[0]);
    cr_assert(!file_exists(io, p));
    seg_path(p, sizeof p, first[1]);
    cr_assert(file_exists(io, p));
    /* Up to the last record of segment 2: it goes. */
    cr_assert_eq(drey_journal_remove_through(j, first[2] - 1, &removed), 0);
    cr_assert_eq(removed, 1);
    /* The same again: nothing. */
    cr_assert_eq(drey_journal_remove_through(j, first[2] - 1, &removed), 0);
    cr_assert_eq(removed, 0);
    /* Everything: all but the segment being written. */
    cr_assert_eq(drey_journal_remove_through(j, UINT64_MAX, &removed), 0);
    cr_assert_eq(removed, nseg - 3);
    cr_assert_eq(count_segments(io), 1);
    drey_journal_stats s = stats_of(j);
    cr_assert_eq(s.segments, 1);
    cr_assert_eq(s.disk_bytes, 4096);
    seg_path(p, sizeof p, first[nseg - 1]);
    cr_assert(file_exists(io, p));
    uint64_t lsn;
    cr_assert_eq(append_one(j, "after", &lsn), 0);
    cr_assert_eq(lsn, 251);
    drey_journal_close(j);
    /* Deletions are durable, and the rest opens from a snapshot at 250. */
    drey_io_fault_crash(fs, true, 5);
    cr_assert_eq(count_segments(io), 1);
    replayed r = {0};
    j = jopen(&o, 250, &r);
    cr_assert_eq(r.n, 1);
    cr_assert_str_eq(r.payload[0], "after");
    replayed_free(&r);
    drey_journal_close(j);
}

Test(journal, temporaries_left_by_a_crash_are_removed_at_open) {
    drey_journal_options o = jopts();
    drey_journal *j = jopen(&o, 0, NULL);
    append_each(j, "x", 2, 0);
    drey_journal_close(j);
    int fd = io->ops->open(io, JDIR "/journal/0000000000000003.seg.tmp", O_RDWR | O_CREAT, 0644);
    cr_assert_geq(fd, 0);
    io->ops->close(io, fd);
    j = jopen(&o, 0, NULL);
    cr_assert(!file_exists(io, JDIR "/journal/0000000000000003.seg.tmp"));
    drey_journal_close(j);
}

/* --- a cap that changes (derived from the file system) -------------------- */

/* The quota plan is kept without a cap too, so a cap set while records are
 * queued counts them: here 70 queued records of 1,040 bytes fill the first
 * 64 KiB segment and start a second, and with a cap of two segments set
 * behind them only what fits in the second is accepted. A plan left stale
 * while there was no cap would think one segment was used and let a third
 * be created past the cap. */
Test(journal, a_cap_set_while_records_are_queued_counts_them) {
    drey_journal_options o = jopts();
    drey_journal *j = jopen(&o, 0, NULL);
    enum { QUEUED = 70, LEN = 1000, MAX = 200 };
    static pending p[MAX];
    waiter w;
    waiter_init(&w);
    gate g;
    gate_close(&g, j);
    for (size_t i = 0; i < QUEUED; i++) {
        pending_set_big(&p[i], &w, pattern(LEN, i), LEN);
        cr_assert_eq(drey_journal_append(j, &p[i].e), 0, "no cap: %zu refused", i);
    }
    drey_journal_set_max_bytes(j, 2 * SEG_BYTES);
    size_t n = QUEUED, refused = 0;
    while (n < MAX) {
        pending_set_big(&p[n], &w, pattern(LEN, n), LEN);
        int rc = drey_journal_append(j, &p[n].e);
        if (rc != 0) {
            cr_assert_eq(rc, -EDQUOT);
            free(p[n].big);
            refused++;
            break;
        }
        n++;
    }
    cr_assert_eq(refused, 1, "the cap never refused a record");
    /* Each 64 KiB segment holds 62 frames of 1,040 bytes after its header. */
    size_t per_segment = (SEG_BYTES - 64) / 1040;
    cr_assert_eq(n, 2 * per_segment, "accepted %zu records under a cap of two segments", n);
    gate_open(&g);
    wait_done(&w, n);
    gate_destroy(&g);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(p[i].err, 0, "record %zu: %d", i, p[i].err);
    drey_journal_stats s = stats_of(j);
    cr_assert_eq(s.disk_bytes, 2 * SEG_BYTES);
    cr_assert_eq(s.quota_max_bytes, 2 * SEG_BYTES);
    cr_assert_eq(s.quota_state, DREY_LEVEL_CRITICAL);
    cr_assert_eq(s.quota_rejections, 1);

    /* Raised: the refused record fits again (two of three segments are
     * below the high-water mark). Lowered below what is on disk: what fits
     * in the segment being written still goes, a new segment does not. 0:
     * no cap again. */
    drey_journal_set_max_bytes(j, 3 * SEG_BYTES);
    cr_assert_eq(stats_of(j).quota_state, DREY_LEVEL_NORMAL);
    append_each(j, "raised", 1, 0);
    drey_journal_set_max_bytes(j, 1);
    cr_assert_eq(append_one(j, "small-fits-in-the-current-segment", NULL), 0);
    cr_assert_eq(stats_of(j).quota_state, DREY_LEVEL_CRITICAL);
    uint8_t *big = pattern(SEG_BYTES, 7);
    waiter w2;
    waiter_init(&w2);
    pending q;
    pending_set_big(&q, &w2, big, SEG_BYTES);
    cr_assert_eq(drey_journal_append(j, &q.e), -EDQUOT);
    cr_assert_eq(stats_of(j).disk_bytes, 2 * SEG_BYTES);
    drey_journal_set_max_bytes(j, 0);
    append_or_done(j, &q.e);
    wait_done(&w2, 1);
    cr_assert_eq(q.err, 0);
    cr_assert_eq(stats_of(j).segments, 3);
    cr_assert_eq(stats_of(j).quota_max_bytes, 0);
    cr_assert_eq(stats_of(j).quota_state, DREY_LEVEL_NORMAL);
    free(big);
    for (size_t i = 0; i < n; i++)
        free(p[i].big);
    waiter_destroy(&w2);
    waiter_destroy(&w);
    drey_journal_close(j);
}

/* --- compaction does not hold up appends ------------------------------------ */

typedef struct remover {
    drey_journal *j;
    uint64_t lsn;
    unsigned removed;
    int rc;
} remover;

static void *remove_thread(void *arg) {
    remover *r = arg;
    r->rc = drey_journal_remove_through(r->j, r->lsn, &r->removed);
    return NULL;
}

typedef struct late_append {
    drey_journal *j;
    waiter *w;
    pending p;
} late_append;

static void *late_append_thread(void *arg) {
    late_append *a = arg;
    pending_set(&a->p, a->w, "during-compaction");
    append_or_done(a->j, &a->p.e); /* blocks here if compaction holds the lock */
    return NULL;
}

/* Whether w reached total before timeout_ms. */
static bool wait_done_for(waiter *w, size_t total, int64_t timeout_ms) {
    int64_t until = drey_deadline_after_ms(timeout_ms);
    pthread_mutex_lock(&w->mu);
    while (w->done < total && drey_cond_wait_until(&w->cond, &w->mu, until) == 0) {
    }
    bool ok = w->done >= total;
    pthread_mutex_unlock(&w->mu);
    return ok;
}

/* The lock scope, not a timing: with every unlink held, an append is
 * acknowledged and the stats answer while a compaction is stuck in its
 * first deletion. */
Test(journal, an_append_completes_while_compaction_waits_on_an_unlink) {
    drey_journal_options o = jopts();
    o.segment_bytes = 4096;
    drey_journal *j = jopen(&o, 0, NULL);
    append_each(j, "0123456789012345678901234567890123456789", 250, 0);
    size_t nseg = stats_of(j).segments;
    cr_assert_geq(nseg, 4);

    drey_io_fault_hold_unlinks(fs, true);
    remover r = {.j = j, .lsn = UINT64_MAX};
    pthread_t rt;
    pthread_create(&rt, NULL, remove_thread, &r);
    cr_assert(drey_io_fault_wait_unlinks_held(fs, 1, 10000), "compaction never reached an unlink");

    waiter w;
    waiter_init(&w);
    late_append a = {.j = j, .w = &w};
    pthread_t at;
    pthread_create(&at, NULL, late_append_thread, &a);
    bool appended = wait_done_for(&w, 1, 10000);
    drey_journal_stats during = stats_of(j);
    drey_io_fault_hold_unlinks(fs, false); /* unwinds a failing test too */
    pthread_join(at, NULL);
    pthread_join(rt, NULL);
    cr_assert(appended, "an append waited for a compaction's unlink");
    cr_assert_eq(a.p.err, 0);
    cr_assert_eq(a.p.lsn, 251);
    cr_assert_eq(during.segments, nseg, "no segment leaves the list before its file is gone");

    cr_assert_eq(r.rc, 0);
    cr_assert_eq(r.removed, nseg - 1);
    drey_journal_stats s = stats_of(j);
    cr_assert_eq(s.segments, 1);
    cr_assert_eq(s.disk_bytes, 4096);
    cr_assert_eq(count_segments(io), 1);
    waiter_destroy(&w);
    drey_journal_close(j);
    /* Deletions are durable, and the appended record survives. */
    drey_io_fault_crash(fs, true, 9);
    replayed rp = {0};
    j = jopen(&o, 250, &rp);
    cr_assert_eq(rp.n, 1);
    cr_assert_str_eq(rp.payload[0], "during-compaction");
    replayed_free(&rp);
    drey_journal_close(j);
}

/* A deletion that fails stops the compaction there: what was deleted has
 * left the list and the quota, the rest stays for the next compaction, and
 * the journal still opens without a gap. */
Test(journal, a_failed_unlink_keeps_the_segments_not_yet_deleted) {
    drey_journal_options o = jopts();
    o.segment_bytes = 4096;
    drey_journal *j = jopen(&o, 0, NULL);
    append_each(j, "0123456789012345678901234567890123456789", 250, 0);
    drey_journal_stats before = stats_of(j);
    size_t nseg = before.segments;
    cr_assert_geq(nseg, 4);

    drey_io_fault_fail_unlink(fs, 2, EIO, false);
    unsigned removed = 99;
    cr_assert_eq(drey_journal_remove_through(j, UINT64_MAX, &removed), -EIO);
    cr_assert_eq(removed, 1);
    drey_journal_stats s = stats_of(j);
    cr_assert_eq(s.segments, nseg - 1);
    cr_assert_eq(count_segments(io), nseg - 1);
    cr_assert_eq(s.disk_bytes, before.disk_bytes - 4096);
    uint64_t lsn;
    cr_assert_eq(append_one(j, "after", &lsn), 0);
    cr_assert_eq(lsn, 251);
    drey_journal_close(j);

    /* The first deletion was made durable before the failure was reported. */
    drey_io_fault_crash(fs, true, 11);
    cr_assert_eq(count_segments(io), nseg - 1);
    replayed rp = {0};
    j = jopen(&o, 250, &rp);
    cr_assert_eq(rp.n, 1);
    cr_assert_str_eq(rp.payload[0], "after");
    replayed_free(&rp);
    cr_assert_eq(drey_journal_remove_through(j, 250, &removed), 0);
    cr_assert_eq(removed, nseg - 2);
    cr_assert_eq(stats_of(j).segments, 1);
    drey_journal_close(j);
}
