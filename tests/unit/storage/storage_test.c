/*
 * Unit tests for src/storage/storage.c: recovery (CURRENT -> snapshot ->
 * journal replay), snapshots, retention and compaction, on the fault file
 * system.
 *
 * Writes go through a small copy of the request chain's durable path
 * (src/pipeline/journal.c): look up a remembered outcome, else encode,
 * append to the journal and apply through commit in the completion, at the
 * record's time. A second write stack without storage is the model: every
 * acknowledged write is applied to it at the same time, and after every
 * crash the recovered store must equal it entry for entry (values,
 * versions, expiries, remembered outcomes).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include "drey/clock.h"
#include "drey/journal.h"
#include "drey/log.h"
#include "drey/storage.h"
#include "src/storage/storage_internal.h"
#include "tests/unit/write_stack.h"

#define DIR "/data"
#define RETENTION (3600 * 1000)

static drey_io_fault *fs;
static drey_io *io;

static void setup(void) {
    fs = drey_io_fault_create();
    io = drey_io_fault_io(fs);
}

static void teardown(void) {
    drey_io_fault_destroy(fs);
}

TestSuite(storage, .init = setup, .fini = teardown, .timeout = 120);

static drey_storage_options sopts(uint64_t segment_bytes, unsigned retain) {
    return (drey_storage_options){
        .journal = {.dir = DIR,
                    .io = io,
                    .segment_bytes = segment_bytes,
                    .fsync = DREY_FSYNC_ALWAYS,
                    .batch_max_bytes = 1u << 20},
        .retain_snapshots = retain,
    };
}

static drey_storage *node_open(const drey_storage_options *o, write_stack *s) {
    drey_storage *st = NULL;
    char err[2048] = "";
    int rc = drey_storage_open(o, s->store, s->commit, &st, err, sizeof err);
    cr_assert_eq(rc, 0, "storage open: %d %s", rc, err);
    cr_assert_not_null(st);
    return st;
}

/* --- writes ------------------------------------------------------------------ */

enum { OP_SET, OP_REMOVE, OP_INCREMENT };

typedef struct spec {
    int op;
    char cache[8];
    char key[16];
    char value[700];
    int64_t ttl_ms;
    int64_t if_version; /* < 0: none */
    int64_t delta;
    char rid[24];
    char principal[8];
} spec;

static void build(write_stack *s, const spec *sp, drey_arena *a, drey_write *w) {
    switch (sp->op) {
    case OP_SET:
        make_set(s, w, a, sp->cache, sp->key, sp->value, sp->ttl_ms, sp->if_version, sp->rid, sp->principal);
        break;
    case OP_REMOVE:
        make_remove(s, w, a, sp->cache, sp->key, sp->rid, sp->principal);
        break;
    default:
        make_increment(s, w, a, sp->cache, sp->key, sp->delta, sp->rid, sp->principal);
    }
}

/* The result of a write, comparable. */
typedef struct result {
    int journal_err;     /* the append failed */
    bool answered;       /* a retry answered before the journal */
    drey_error error;    /* the transition's failure */
    uint8_t bytes[256];  /* the packed response */
    size_t len;
    char meta[64];       /* "key=value" of the first metadata */
    uint64_t lsn;
    int64_t time_ms;
    uint8_t payload[1024]; /* the journal record */
    size_t payload_len;
} result;

static void record_outcome(result *r, const drey_status *st, const ProtobufCMessage *resp) {
    r->error = st->error;
    r->len = 0;
    if (resp != NULL) {
        r->len = protobuf_c_message_get_packed_size(resp);
        cr_assert_leq(r->len, sizeof r->bytes);
        protobuf_c_message_pack(resp, r->bytes);
    }
    r->meta[0] = '\0';
    if (st->n_metadata > 0)
        snprintf(r->meta, sizeof r->meta, "%s=%s", st->metadata[0].key, st->metadata[0].value);
}

static void expect_same_outcome(const result *a, const result *b, const char *what) {
    cr_assert_eq(a->error, b->error, "%s: error %d vs %d", what, a->error, b->error);
    cr_assert_eq(a->len, b->len, "%s: response sizes %zu vs %zu", what, a->len, b->len);
    cr_assert(memcmp(a->bytes, b->bytes, a->len) == 0, "%s: responses differ", what);
    cr_assert_str_eq(a->meta, b->meta, "%s", what);
}

typedef struct inflight {
    write_stack *s;
    drey_write w;
    drey_arena *arena;
    drey_journal_entry e;
    result *r;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool done;
} inflight;

static void on_durable(void *arg, const drey_journal_record *rec, int err) {
    inflight *f = arg;
    if (err != 0) {
        f->r->journal_err = err;
    } else {
        /* Applied on the writer thread, at the record's time, as the
         * request chain resumes it. */
        f->r->lsn = rec->lsn;
        f->r->time_ms = rec->time_ms;
        drey_status st;
        drey_status_init(&st);
        drey_apply ax = {.now_ms = rec->time_ms, .arena = f->arena, .status = &st};
        ProtobufCMessage *resp = drey_commit_apply(f->s->commit, &f->w, &ax);
        record_outcome(f->r, &st, resp);
    }
    pthread_mutex_lock(&f->mu);
    f->done = true;
    pthread_cond_signal(&f->cond);
    pthread_mutex_unlock(&f->mu);
}

/* Submits a write to the node the way the request chain does. */
static void submit(write_stack *s, drey_storage *st, const spec *sp, result *r) {
    memset(r, 0, sizeof *r);
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    inflight f = {.s = s, .arena = &a, .r = r, .mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    build(s, sp, &a, &f.w);
    drey_status status;
    drey_status_init(&status);
    drey_apply ax = {.now_ms = drey_wall_ms(), .arena = &a, .status = &status};
    ProtobufCMessage *resp;
    if (drey_commit_lookup(s->commit, &f.w, &ax, &resp) == DREY_COMMIT_ANSWERED) {
        r->answered = true;
        record_outcome(r, &status, resp);
        drey_arena_destroy(&a);
        return;
    }
    uint8_t *payload;
    size_t len;
    drey_commit_encode(&f.w, &a, &payload, &len);
    cr_assert_leq(len, sizeof r->payload);
    memcpy(r->payload, payload, len);
    r->payload_len = len;
    f.e.payload = payload;
    f.e.len = len;
    f.e.done = on_durable;
    f.e.arg = &f;
    append_or_done(drey_storage_journal(st), &f.e);
    pthread_mutex_lock(&f.mu);
    while (!f.done)
        pthread_cond_wait(&f.cond, &f.mu);
    pthread_mutex_unlock(&f.mu);
    drey_arena_destroy(&a);
}

/* Applies an acknowledged write to the model at its time. */
static void model_apply(write_stack *m, const spec *sp, int64_t time_ms, result *out) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    drey_write w;
    build(m, sp, &a, &w);
    drey_status st;
    drey_status_init(&st);
    drey_apply ax = {.now_ms = time_ms, .arena = &a, .status = &st};
    ProtobufCMessage *resp = drey_commit_apply(m->commit, &w, &ax);
    result tmp;
    memset(&tmp, 0, sizeof tmp);
    record_outcome(&tmp, &st, resp);
    if (out != NULL)
        *out = tmp;
    drey_arena_destroy(&a);
}

/* --- comparing stores ------------------------------------------------------------ */

#define NKEYS 12
static const char *caches[] = {"", "c1"};
static const char *principals[] = {"", "alice"};

static void key_name(char *buf, size_t cap, unsigned k) {
    snprintf(buf, cap, "k%u", k);
}

/* Every key the tests write, and every outcome of the request ids in
 * `rids`, read at now_ms in both stores. */
static void expect_equal_stores(drey_store *got, drey_store *want, int64_t now_ms, char (*rids)[24], size_t nrids,
                                const char *what) {
    char key[32];
    for (size_t c = 0; c < 2; c++) {
        for (unsigned k = 0; k <= NKEYS; k++) {
            if (k == NKEYS)
                snprintf(key, sizeof key, "ctr");
            else
                key_name(key, sizeof key, k);
            entry_copy a, b;
            bool fa = read_entry(got, caches[c], key, now_ms, &a);
            bool fb = read_entry(want, caches[c], key, now_ms, &b);
            cr_assert_eq(fa, fb, "%s: %s/%s is %s, the model says %s", what, caches[c], key,
                         fa ? "there" : "missing", fb ? "there" : "missing");
            if (!fa)
                continue;
            cr_assert_eq(a.kind, b.kind, "%s: %s/%s kind", what, caches[c], key);
            cr_assert_eq(a.len, b.len, "%s: %s/%s length", what, caches[c], key);
            cr_assert(memcmp(a.data, b.data, a.len) == 0, "%s: %s/%s value", what, caches[c], key);
            cr_assert_eq(a.version, b.version, "%s: %s/%s version %" PRIu64 " vs %" PRIu64, what, caches[c], key,
                         a.version, b.version);
            cr_assert_eq(a.expires_at_ms, b.expires_at_ms, "%s: %s/%s expiry", what, caches[c], key);
        }
    }
    for (size_t i = 0; i < nrids; i++) {
        for (size_t p = 0; p < 2; p++) {
            char k[64];
            size_t pl = strlen(principals[p]), rl = strlen(rids[i]);
            memcpy(k, principals[p], pl);
            k[pl] = '\0';
            memcpy(k + pl + 1, rids[i], rl);
            drey_key dk;
            entry_copy a, b;
            memset(&a, 0, sizeof a);
            memset(&b, 0, sizeof b);
            drey_store_key(got, &dk, DREY_COMMIT_OUTCOME_CACHE, strlen(DREY_COMMIT_OUTCOME_CACHE), k, pl + 1 + rl);
            bool fa = drey_store_read(got, &dk, now_ms, copy_entry, &a);
            drey_store_key(want, &dk, DREY_COMMIT_OUTCOME_CACHE, strlen(DREY_COMMIT_OUTCOME_CACHE), k, pl + 1 + rl);
            bool fb = drey_store_read(want, &dk, now_ms, copy_entry, &b);
            cr_assert_eq(fa, fb, "%s: outcome of %s/%s", what, principals[p], rids[i]);
            if (fa) {
                cr_assert_eq(a.len, b.len, "%s: outcome of %s", what, rids[i]);
                cr_assert(memcmp(a.data, b.data, a.len) == 0, "%s: outcome of %s", what, rids[i]);
                cr_assert_eq(a.expires_at_ms, b.expires_at_ms, "%s: outcome expiry of %s", what, rids[i]);
            }
        }
    }
    cr_assert_eq(drey_store_last_version(got), drey_store_last_version(want), "%s: version counters", what);
}

/* --- snapshots on request ------------------------------------------------------------ */

typedef struct snap_wait {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool done;
    drey_snapshot_result r;
} snap_wait;

static void on_snapshot(void *arg, const drey_snapshot_result *r) {
    snap_wait *w = arg;
    pthread_mutex_lock(&w->mu);
    w->r = *r;
    w->done = true;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->mu);
}

static drey_snapshot_result snapshot_now(drey_storage *st) {
    snap_wait w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    drey_storage_request_snapshot(st, on_snapshot, &w);
    pthread_mutex_lock(&w.mu);
    while (!w.done)
        pthread_cond_wait(&w.cond, &w.mu);
    pthread_mutex_unlock(&w.mu);
    return w.r;
}

static size_t count_files(const char *dir, const char *suffix) {
    char **names;
    size_t n, count = 0;
    if (io->ops->list_dir(io, dir, &names, &n) != 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(names[i]), sl = strlen(suffix);
        if (l >= sl && strcmp(names[i] + l - sl, suffix) == 0)
            count++;
    }
    drey_io_free_names(names, n);
    return count;
}

/* A simple write: set k<i> in the default cache to "v<i>-<n>". */
static void set_key(write_stack *s, drey_storage *st, write_stack *model, unsigned k, unsigned n) {
    spec sp = {.op = OP_SET, .if_version = -1};
    key_name(sp.key, sizeof sp.key, k);
    snprintf(sp.value, sizeof sp.value, "v%u-%u", k, n);
    result r;
    submit(s, st, &sp, &r);
    cr_assert_eq(r.journal_err, 0);
    cr_assert_eq(r.error, DREY_ERR_NONE);
    if (model != NULL) {
        result m;
        model_apply(model, &sp, r.time_ms, &m);
        expect_same_outcome(&r, &m, "set");
    }
}

/* --- the tests ---------------------------------------------------------------------- */

Test(storage, fresh_directory) {
    write_stack s;
    stack_create(&s, RETENTION);
    drey_storage_options o = sopts(64 * 1024, 2);
    drey_storage *st = node_open(&o, &s);
    drey_storage_stats ss;
    drey_storage_get_stats(st, &ss);
    cr_assert_eq(ss.replayed_records, 0);
    cr_assert_eq(ss.snapshot_lsn, 0);
    cr_assert_eq(ss.recovered_snapshot_entries, 0);
    cr_assert(!ss.snapshot_in_flight);
    cr_assert_eq(count_files(DIR "/journal", ".seg"), 1);
    char name[256];
    uint64_t lsn;
    cr_assert_eq(drey_storage__read_manifest(io, DIR, name, sizeof name, &lsn), -ENOENT);
    drey_storage_close(st);
    /* And again, after a power loss: nothing to recover, nothing wrong. */
    drey_io_fault_crash(fs, true, 1);
    st = node_open(&o, &s);
    drey_storage_close(st);
    stack_destroy(&s);
}

Test(storage, writes_are_recovered_after_a_crash) {
    write_stack s, m;
    stack_create(&s, RETENTION);
    stack_create(&m, RETENTION);
    drey_storage_options o = sopts(4096, 2);
    drey_storage *st = node_open(&o, &s);
    for (unsigned i = 0; i < 60; i++)
        set_key(&s, st, &m, i % NKEYS, i);
    drey_storage_close(st);
    stack_destroy(&s);
    drey_io_fault_crash(fs, true, 3);

    write_stack r;
    stack_create(&r, RETENTION);
    st = node_open(&o, &r);
    drey_storage_stats ss;
    drey_storage_get_stats(st, &ss);
    cr_assert_eq(ss.replayed_records, 60);
    expect_equal_stores(r.store, m.store, drey_wall_ms(), NULL, 0, "recovered");
    /* Appends continue after the recovered ones. */
    drey_journal_stats js;
    drey_journal_get_stats(drey_storage_journal(st), &js);
    cr_assert_eq(js.last_lsn, 60);
    set_key(&r, st, &m, 0, 1000);
    drey_journal_get_stats(drey_storage_journal(st), &js);
    cr_assert_eq(js.last_lsn, 61);
    drey_storage_close(st);
    stack_destroy(&r);
    stack_destroy(&m);
}

Test(storage, snapshot_switches_current_keeps_the_newest_and_compacts) {
    write_stack s, m;
    stack_create(&s, RETENTION);
    stack_create(&m, RETENTION);
    drey_storage_options o = sopts(4096, 2);
    drey_storage *st = node_open(&o, &s);
    char taken[4][96];
    uint64_t lsns[4];
    unsigned n = 0;
    for (int round = 0; round < 4; round++) {
        for (unsigned i = 0; i < 60; i++)
            set_key(&s, st, &m, (n + i) % NKEYS, n + i);
        n += 60;
        size_t segs_before = count_files(DIR "/journal", ".seg");
        drey_snapshot_result r = snapshot_now(st);
        cr_assert_eq(r.rc, 0, "snapshot %d: %d", round, r.rc);
        cr_assert_eq(r.info.lsn, n);
        cr_assert_eq(r.info.entries, NKEYS);
        snprintf(taken[round], sizeof taken[round], "%s", r.file);
        lsns[round] = r.info.lsn;
        char want[96];
        snprintf(want, sizeof want, "snapshots/snap-%016" PRIx64 ".snap", (uint64_t)n);
        cr_assert_str_eq(r.file, want);
        /* CURRENT names it, relative to the data directory. */
        char named[256];
        uint64_t lsn;
        cr_assert_eq(drey_storage__read_manifest(io, DIR, named, sizeof named, &lsn), 0);
        cr_assert_str_eq(named, r.file);
        cr_assert_eq(lsn, n);
        /* Retention: the newest two. */
        cr_assert_eq(count_files(DIR "/snapshots", ".snap"), round < 2 ? (size_t)round + 1 : 2);
        /* Compaction: the segments it covers are gone; the journal still
         * continues the snapshot. */
        size_t segs_after = count_files(DIR "/journal", ".seg");
        cr_assert_eq(segs_after, segs_before - r.segments_removed);
        cr_assert_gt(r.segments_removed, 0, "round %d", round);
        drey_journal_scan sc;
        cr_assert_eq(drey_journal_scan_dir(io, DIR, lsn, NULL, NULL, &sc), 0);
        cr_assert_eq(sc.problem, DREY_JOURNAL_OK, "%s", sc.message);
        cr_assert_leq(sc.segments[0].first_lsn, lsn + 1);
        drey_journal_scan_free(&sc);
    }
    char path[256];
    snprintf(path, sizeof path, DIR "/%s", taken[0]);
    cr_assert(io->ops->open(io, path, O_RDONLY, 0) < 0, "the oldest snapshot was kept");
    snprintf(path, sizeof path, DIR "/%s", taken[2]);
    int fd = io->ops->open(io, path, O_RDONLY, 0);
    cr_assert_geq(fd, 0, "the second newest was deleted");
    io->ops->close(io, fd);
    drey_storage_stats ss;
    drey_storage_get_stats(st, &ss);
    cr_assert_eq(ss.snapshots_taken, 4);
    cr_assert_eq(ss.snapshot_lsn, lsns[3]);
    cr_assert_gt(ss.segments_removed, 0);
    cr_assert(!ss.compaction_failed);
    /* Some writes after the last snapshot. */
    for (unsigned i = 0; i < 7; i++)
        set_key(&s, st, &m, i, 5000 + i);
    drey_storage_close(st);
    stack_destroy(&s);
    drey_io_fault_crash(fs, true, 11);

    /* Reopen: the snapshot, then the 7 records after it. */
    write_stack r;
    stack_create(&r, RETENTION);
    st = node_open(&o, &r);
    drey_storage_get_stats(st, &ss);
    cr_assert_eq(ss.snapshot_lsn, lsns[3]);
    cr_assert_eq(ss.recovered_snapshot_entries, NKEYS);
    cr_assert_eq(ss.replayed_records, 7);
    expect_equal_stores(r.store, m.store, drey_wall_ms(), NULL, 0, "snapshot + journal");
    drey_storage_close(st);
    stack_destroy(&r);
    stack_destroy(&m);
}

Test(storage, snapshot_of_an_idle_node_and_of_an_empty_store) {
    write_stack s;
    stack_create(&s, RETENTION);
    drey_storage_options o = sopts(64 * 1024, 1);
    drey_storage *st = node_open(&o, &s);
    drey_snapshot_result r = snapshot_now(st);
    cr_assert_eq(r.rc, 0);
    cr_assert_eq(r.info.lsn, 0);
    cr_assert_eq(r.info.entries, 0);
    r = snapshot_now(st);
    cr_assert_eq(r.rc, 0);
    cr_assert_eq(count_files(DIR "/snapshots", ".snap"), 1);
    drey_storage_close(st);
    drey_io_fault_crash(fs, false, 0);
    st = node_open(&o, &s);
    drey_storage_close(st);
    stack_destroy(&s);
}

/* Requests that arrive while a snapshot runs share the next one; all are
 * answered. */
Test(storage, concurrent_requests_are_all_answered) {
    write_stack s;
    stack_create(&s, RETENTION);
    drey_storage_options o = sopts(64 * 1024, 2);
    drey_storage *st = node_open(&o, &s);
    for (unsigned i = 0; i < 5; i++)
        set_key(&s, st, NULL, i, i);
    snap_wait w[6];
    for (int i = 0; i < 6; i++) {
        w[i] = (snap_wait){.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
        drey_storage_request_snapshot(st, on_snapshot, &w[i]);
    }
    for (int i = 0; i < 6; i++) {
        pthread_mutex_lock(&w[i].mu);
        while (!w[i].done)
            pthread_cond_wait(&w[i].cond, &w[i].mu);
        pthread_mutex_unlock(&w[i].mu);
        cr_assert_eq(w[i].r.rc, 0);
        cr_assert_eq(w[i].r.info.lsn, 5);
    }
    drey_storage_stats ss;
    drey_storage_get_stats(st, &ss);
    cr_assert_leq(ss.snapshots_taken, 6);
    cr_assert_geq(ss.snapshots_taken, 1);
    drey_storage_close(st);
    stack_destroy(&s);
}

Test(storage, failed_snapshot_keeps_the_manifest_and_the_journal) {
    write_stack s, m;
    stack_create(&s, RETENTION);
    stack_create(&m, RETENTION);
    drey_storage_options o = sopts(4096, 2);
    drey_storage *st = node_open(&o, &s);
    for (unsigned i = 0; i < 30; i++)
        set_key(&s, st, &m, i % NKEYS, i);
    drey_snapshot_result r = snapshot_now(st);
    cr_assert_eq(r.rc, 0);
    char named[256];
    uint64_t lsn;
    cr_assert_eq(drey_storage__read_manifest(io, DIR, named, sizeof named, &lsn), 0);
    for (unsigned i = 0; i < 30; i++)
        set_key(&s, st, &m, i % NKEYS, 100 + i);
    size_t segs = count_files(DIR "/journal", ".seg");
    /* The snapshot file's fdatasync fails: no new snapshot, CURRENT as it
     * was, no segment removed, and the journal is unaffected. */
    drey_io_fault_fail_sync(fs, 1, EIO, false);
    r = snapshot_now(st);
    cr_assert_eq(r.rc, -EIO);
    char named2[256];
    uint64_t lsn2;
    cr_assert_eq(drey_storage__read_manifest(io, DIR, named2, sizeof named2, &lsn2), 0);
    cr_assert_str_eq(named2, named);
    cr_assert_eq(lsn2, lsn);
    cr_assert_eq(count_files(DIR "/journal", ".seg"), segs);
    cr_assert_eq(count_files(DIR "/snapshots", ".snap"), 1);
    drey_storage_stats ss;
    drey_storage_get_stats(st, &ss);
    cr_assert_eq(ss.snapshots_failed, 1);
    cr_assert_eq(ss.snapshot_lsn, lsn);
    set_key(&s, st, &m, 1, 999);
    /* The manifest write fails (its file's sync is the third sync). */
    drey_io_fault_fail_sync(fs, 3, EIO, false);
    r = snapshot_now(st);
    cr_assert_eq(r.rc, -EIO);
    cr_assert_eq(drey_storage__read_manifest(io, DIR, named2, sizeof named2, &lsn2), 0);
    cr_assert_str_eq(named2, named, "CURRENT switched although its write failed");
    cr_assert_eq(count_files(DIR "/journal", ".seg"), segs, "segments removed without a manifest");
    drey_storage_close(st);
    stack_destroy(&s);
    drey_io_fault_crash(fs, true, 2);
    write_stack rs;
    stack_create(&rs, RETENTION);
    st = node_open(&o, &rs);
    expect_equal_stores(rs.store, m.store, drey_wall_ms(), NULL, 0, "after failed snapshots");
    drey_storage_close(st);
    stack_destroy(&rs);
    stack_destroy(&m);
}

/* Retention deletes old snapshots only once CURRENT names the new one: a
 * failed manifest switch leaves the snapshot CURRENT names in place. */
Test(storage, failed_manifest_switch_keeps_the_named_snapshot) {
    write_stack s;
    stack_create(&s, RETENTION);
    drey_storage_options o = sopts(64 * 1024, 1);
    drey_storage *st = node_open(&o, &s);
    set_key(&s, st, NULL, 1, 1);
    drey_snapshot_result a = snapshot_now(st);
    cr_assert_eq(a.rc, 0);
    set_key(&s, st, NULL, 2, 2);
    drey_io_fault_fail_sync(fs, 3, ENOSPC, false); /* the manifest's file sync */
    drey_snapshot_result b = snapshot_now(st);
    cr_assert_eq(b.rc, -ENOSPC);
    char named[256], path[512], err[512];
    uint64_t lsn;
    cr_assert_eq(drey_storage__read_manifest(io, DIR, named, sizeof named, &lsn), 0);
    cr_assert_str_eq(named, a.file);
    snprintf(path, sizeof path, DIR "/%s", named);
    drey_snapshot_info info;
    cr_assert_eq(drey_snapshot_read(io, path, NULL, NULL, &info, err, sizeof err), 0,
                 "the snapshot CURRENT names is gone: %s", err);
    /* The next one switches and then applies the retention. */
    set_key(&s, st, NULL, 3, 3);
    drey_snapshot_result c = snapshot_now(st);
    cr_assert_eq(c.rc, 0);
    cr_assert_eq(drey_storage__read_manifest(io, DIR, named, sizeof named, &lsn), 0);
    cr_assert_str_eq(named, c.file);
    cr_assert_eq(count_files(DIR "/snapshots", ".snap"), 1);
    drey_storage_close(st);
    stack_destroy(&s);
}

static void damage_file(const char *rel, long from_end) {
    char path[256];
    snprintf(path, sizeof path, DIR "/%s", rel);
    uint8_t *data;
    size_t n;
    cr_assert_eq(drey_io_read_file(io, path, &data, &n), 0, "%s", path);
    size_t at = from_end < 0 ? n - (size_t)(-from_end) : (size_t)from_end;
    uint8_t b = data[at] ^ 0x20;
    free(data);
    int fd = io->ops->open(io, path, O_RDWR, 0);
    cr_assert_eq(drey_io_pwrite_all(io, fd, &b, 1, (off_t)at), 0);
    cr_assert_eq(io->ops->fdatasync(io, fd), 0);
    io->ops->close(io, fd);
}

Test(storage, damaged_newest_snapshot_falls_back_when_the_journal_covers_the_older) {
    write_stack s, m;
    stack_create(&s, RETENTION);
    stack_create(&m, RETENTION);
    /* Large segments: compaction never removes the one segment. */
    drey_storage_options o = sopts(1024 * 1024, 3);
    drey_storage *st = node_open(&o, &s);
    for (unsigned i = 0; i < 20; i++)
        set_key(&s, st, &m, i % NKEYS, i);
    drey_snapshot_result a = snapshot_now(st);
    for (unsigned i = 0; i < 20; i++)
        set_key(&s, st, &m, i % NKEYS, 100 + i);
    drey_snapshot_result b = snapshot_now(st);
    for (unsigned i = 0; i < 5; i++)
        set_key(&s, st, &m, i % NKEYS, 200 + i);
    cr_assert_eq(a.rc, 0);
    cr_assert_eq(b.rc, 0);
    cr_assert_eq(b.segments_removed, 0);
    drey_storage_close(st);
    stack_destroy(&s);
    damage_file(b.file, -40);

    write_stack r;
    stack_create(&r, RETENTION);
    st = node_open(&o, &r);
    drey_storage_stats ss;
    drey_storage_get_stats(st, &ss);
    cr_assert_eq(ss.snapshot_lsn, a.info.lsn, "loaded lsn %" PRIu64, ss.snapshot_lsn);
    cr_assert_eq(ss.replayed_records, 25);
    expect_equal_stores(r.store, m.store, drey_wall_ms(), NULL, 0, "fallback");
    drey_storage_close(st);
    stack_destroy(&r);
    stack_destroy(&m);
}

Test(storage, damaged_newest_snapshot_refuses_when_the_journal_was_compacted) {
    write_stack s;
    stack_create(&s, RETENTION);
    drey_storage_options o = sopts(4096, 2);
    drey_storage *st = node_open(&o, &s);
    for (unsigned i = 0; i < 60; i++)
        set_key(&s, st, NULL, i % NKEYS, i);
    drey_snapshot_result a = snapshot_now(st);
    for (unsigned i = 0; i < 60; i++)
        set_key(&s, st, NULL, i % NKEYS, 100 + i);
    drey_snapshot_result b = snapshot_now(st);
    cr_assert_eq(a.rc, 0);
    cr_assert_eq(b.rc, 0);
    cr_assert_gt(b.segments_removed, 0);
    drey_storage_close(st);
    stack_destroy(&s);
    damage_file(b.file, 70);

    write_stack r;
    stack_create(&r, RETENTION);
    drey_storage *st2 = NULL;
    char err[2048] = "";
    int rc = drey_storage_open(&o, r.store, r.commit, &st2, err, sizeof err);
    cr_assert_neq(rc, 0);
    cr_assert_null(st2);
    /* The error says what happened: the named snapshot is damaged, the
     * older one is not continued by the journal. */
    cr_assert(strstr(err, b.file) != NULL, "%s", err);
    cr_assert(strstr(err, "unusable") != NULL, "%s", err);
    cr_assert(strstr(err, a.file) != NULL, "%s", err);
    cr_assert(strstr(err, "LSN gap") != NULL, "%s", err);
    /* Nothing was changed: it refuses again. */
    drey_store_clear(r.store);
    cr_assert_neq(drey_storage_open(&o, r.store, r.commit, &st2, err, sizeof err), 0);
    stack_destroy(&r);
}

Test(storage, every_snapshot_damaged_refuses) {
    write_stack s;
    stack_create(&s, RETENTION);
    drey_storage_options o = sopts(64 * 1024, 2);
    drey_storage *st = node_open(&o, &s);
    set_key(&s, st, NULL, 1, 1);
    drey_snapshot_result a = snapshot_now(st);
    drey_storage_close(st);
    stack_destroy(&s);
    damage_file(a.file, -40);
    write_stack r;
    stack_create(&r, RETENTION);
    char err[2048] = "";
    cr_assert_eq(drey_storage_open(&o, r.store, r.commit, &st, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "no usable snapshot") != NULL, "%s", err);
    cr_assert(strstr(err, a.file) != NULL, "%s", err);
    stack_destroy(&r);
}

Test(storage, damaged_current_refuses) {
    write_stack s;
    stack_create(&s, RETENTION);
    drey_storage_options o = sopts(64 * 1024, 2);
    drey_storage *st = node_open(&o, &s);
    set_key(&s, st, NULL, 1, 1);
    cr_assert_eq(snapshot_now(st).rc, 0);
    drey_storage_close(st);
    stack_destroy(&s);
    static const long where[] = {0, 9, 13, 20, -1};
    for (size_t i = 0; i < sizeof where / sizeof *where; i++) {
        damage_file("CURRENT", where[i]);
        write_stack r;
        stack_create(&r, RETENTION);
        char err[2048] = "";
        cr_assert_eq(drey_storage_open(&o, r.store, r.commit, &st, err, sizeof err), -EINVAL, "byte %ld", where[i]);
        cr_assert(strstr(err, DIR "/CURRENT is damaged") != NULL, "%s", err);
        stack_destroy(&r);
        damage_file("CURRENT", where[i]); /* undo */
    }
    write_stack r;
    stack_create(&r, RETENTION);
    st = node_open(&o, &r);
    drey_storage_close(st);
    stack_destroy(&r);
}

/* A crash after the new snapshot is durable but before CURRENT names it:
 * CURRENT's snapshot is loaded (the newer file is complete but unnamed).
 * And when the one CURRENT names is gone (retention deleted it and that
 * deletion became durable), the newest complete one is loaded. */
Test(storage, crash_between_snapshot_and_manifest_switch) {
    write_stack s, m;
    stack_create(&s, RETENTION);
    stack_create(&m, RETENTION);
    drey_storage_options o = sopts(64 * 1024, 1);
    drey_storage *st = node_open(&o, &s);
    for (unsigned i = 0; i < 10; i++)
        set_key(&s, st, &m, i, i);
    drey_snapshot_result r1 = snapshot_now(st);
    cr_assert_eq(r1.rc, 0);
    for (unsigned i = 0; i < 10; i++)
        set_key(&s, st, &m, i, 50 + i);
    /* The second snapshot: its file and dir sync (syncs 1, 2) succeed, the
     * manifest's file sync (3) fails: power is lost there. */
    drey_io_fault_fail_sync(fs, 3, EIO, true);
    drey_snapshot_result r2 = snapshot_now(st);
    cr_assert_neq(r2.rc, 0);
    drey_io_fault_crash(fs, true, 9);
    drey_storage_close(st);
    stack_destroy(&s);

    write_stack r;
    stack_create(&r, RETENTION);
    st = node_open(&o, &r);
    drey_storage_stats ss;
    drey_storage_get_stats(st, &ss);
    cr_assert_eq(ss.snapshot_lsn, 10);
    cr_assert_eq(ss.replayed_records, 10);
    expect_equal_stores(r.store, m.store, drey_wall_ms(), NULL, 0, "CURRENT's snapshot");
    drey_storage_close(st);
    stack_destroy(&r);

    char path[256];
    snprintf(path, sizeof path, DIR "/%s", r1.file);
    cr_assert_eq(io->ops->unlink(io, path), 0);
    cr_assert_eq(io->ops->sync_dir(io, DIR "/snapshots"), 0);
    stack_create(&r, RETENTION);
    st = node_open(&o, &r);
    drey_storage_get_stats(st, &ss);
    cr_assert_eq(ss.snapshot_lsn, 20, "loaded %" PRIu64, ss.snapshot_lsn);
    cr_assert_eq(ss.replayed_records, 0);
    expect_equal_stores(r.store, m.store, drey_wall_ms(), NULL, 0, "the newest snapshot");
    drey_storage_close(st);
    stack_destroy(&r);
    stack_destroy(&m);
}

/* --- the end-to-end crash loop ---------------------------------------------------- */

static uint64_t rng;
static uint64_t rnd(void) {
    uint64_t z = (rng += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

#define MAX_OPS 200

typedef struct done_write {
    spec sp;
    result r;
} done_write;

typedef struct world {
    done_write acked[MAX_OPS]; /* acknowledged writes with a request id */
    size_t nacked;
    done_write failed[MAX_OPS]; /* failed since the last acknowledgement */
    size_t nfailed;
    char rids[MAX_OPS][24];
    size_t nrids;
    uint64_t last_lsn;
    unsigned next_rid;
    int64_t ctr_applied; /* increments of "ctr" acknowledged (each once) */
} world;

/* How often the interesting cases happened, so the loop proves it covers
 * them. */
static struct {
    unsigned acked, failed, retries, snapshots, snapshots_failed, unacked_recovered, torn_cut;
} cov;

static void random_spec(world *w, spec *sp) {
    memset(sp, 0, sizeof *sp);
    sp->if_version = -1;
    snprintf(sp->cache, sizeof sp->cache, "%s", caches[rnd() % 2]);
    key_name(sp->key, sizeof sp->key, (unsigned)(rnd() % NKEYS));
    snprintf(sp->principal, sizeof sp->principal, "%s", principals[rnd() % 2]);
    unsigned r = (unsigned)(rnd() % 10);
    if (r < 5) {
        sp->op = OP_SET;
        /* Up to a few sectors: a torn write can keep part of a record. */
        size_t len = 4 + rnd() % 600;
        int n = snprintf(sp->value, sizeof sp->value, "val-%" PRIu64 "-", rnd() % 1000);
        for (size_t c = (size_t)n; c < len; c++)
            sp->value[c] = (char)('a' + c % 26);
        sp->value[len > (size_t)n ? len : (size_t)n] = '\0';
        switch (rnd() % 4) {
        case 0: sp->ttl_ms = 1 + (int64_t)(rnd() % 20); break; /* expires during the test */
        case 1: sp->ttl_ms = RETENTION; break;
        default: sp->ttl_ms = 0;
        }
        if (rnd() % 5 == 0)
            sp->if_version = (int64_t)(rnd() % 30); /* mostly a mismatch */
    } else if (r < 7) {
        sp->op = OP_REMOVE;
    } else if (r < 9) {
        sp->op = OP_INCREMENT;
        sp->delta = (int64_t)(rnd() % 7) - 3;
        snprintf(sp->cache, sizeof sp->cache, "c1"); /* ints only there, after its sets... */
        snprintf(sp->key, sizeof sp->key, "n%" PRIu64, rnd() % 2);
    } else {
        /* The counter: each acknowledged increment counts once. */
        sp->op = OP_INCREMENT;
        sp->delta = 1;
        sp->cache[0] = '\0';
        snprintf(sp->key, sizeof sp->key, "ctr");
    }
    if (rnd() % 10 < 8 || strcmp(sp->key, "ctr") == 0) {
        snprintf(sp->rid, sizeof sp->rid, "rid-%u", w->next_rid++);
        snprintf(w->rids[w->nrids++], 24, "%s", sp->rid);
    }
}

static int64_t ctr_value(drey_store *s, int64_t now) {
    entry_copy e;
    if (!read_entry(s, "", "ctr", now, &e))
        return 0;
    int64_t v;
    memcpy(&v, e.data, 8);
    return v;
}

/* Runs `nops` operations against the node; returns false once it is done
 * for (the journal failed). */
static void run_ops(write_stack *s, drey_storage *st, write_stack *m, world *w, size_t nops, bool *snapshots_ok) {
    for (size_t i = 0; i < nops; i++) {
        unsigned what = (unsigned)(rnd() % 100);
        if (what < 8) {
            drey_snapshot_result r = snapshot_now(st);
            if (r.rc != 0)
                *snapshots_ok = false;
            cov.snapshots++;
            cov.snapshots_failed += r.rc != 0;
            continue;
        }
        if (what < 20 && w->nacked > 0) {
            /* A retry of an acknowledged write: the first outcome, again. */
            done_write *d = &w->acked[rnd() % w->nacked];
            result r;
            submit(s, st, &d->sp, &r);
            cr_assert(r.answered, "a retry of %s was not answered from its outcome", d->sp.rid);
            expect_same_outcome(&r, &d->r, "retry");
            cov.retries++;
            continue;
        }
        done_write d;
        random_spec(w, &d.sp);
        submit(s, st, &d.sp, &d.r);
        cr_assert(!d.r.answered, "a new request id was answered");
        if (d.r.journal_err != 0) {
            w->failed[w->nfailed++] = d;
            cov.failed++;
            continue;
        }
        cov.acked++;
        cr_assert_eq(d.r.lsn, w->last_lsn + 1, "LSNs follow the acknowledged ones");
        w->last_lsn = d.r.lsn;
        w->nfailed = 0;
        result mr;
        model_apply(m, &d.sp, d.r.time_ms, &mr);
        expect_same_outcome(&d.r, &mr, "live vs model");
        if (strcmp(d.sp.key, "ctr") == 0 && d.r.error == DREY_ERR_NONE)
            w->ctr_applied++;
        if (d.sp.rid[0] != '\0')
            w->acked[w->nacked++] = d;
    }
}

typedef struct last_record {
    uint64_t lsn;
    int64_t time_ms;
    uint8_t payload[1024];
    size_t len;
} last_record;

static int keep_last(void *ctx, const drey_journal_record *rec) {
    last_record *l = ctx;
    l->lsn = rec->lsn;
    l->time_ms = rec->time_ms;
    l->len = rec->len < sizeof l->payload ? rec->len : sizeof l->payload;
    memcpy(l->payload, rec->payload, l->len);
    return 0;
}

/* After a reopen: a failed write may have reached the disk (written, its
 * sync failed) and been replayed. If so, apply it to the model too. */
static void account_for_an_unacknowledged_write(drey_storage *st, write_stack *m, world *w, const char *what) {
    drey_journal_stats js;
    drey_journal_get_stats(drey_storage_journal(st), &js);
    cr_assert_geq(js.last_lsn, w->last_lsn, "%s: acknowledged writes lost (last lsn %" PRIu64 ", acknowledged %" PRIu64
                                            ")",
                  what, js.last_lsn, w->last_lsn);
    cr_assert_leq(js.last_lsn, w->last_lsn + 1, "%s: more records than were written", what);
    if (js.last_lsn == w->last_lsn + 1) {
        last_record l = {0};
        drey_journal_scan sc;
        cr_assert_eq(drey_journal_scan_dir(io, DIR, w->last_lsn, keep_last, &l, &sc), 0);
        drey_journal_scan_free(&sc);
        cr_assert_eq(l.lsn, w->last_lsn + 1, "%s", what);
        bool found = false;
        for (size_t i = 0; i < w->nfailed && !found; i++) {
            done_write *d = &w->failed[i];
            if (d->r.payload_len != l.len || memcmp(d->r.payload, l.payload, l.len) != 0)
                continue;
            found = true;
            model_apply(m, &d->sp, l.time_ms, &d->r);
            if (strcmp(d->sp.key, "ctr") == 0 && d->r.error == DREY_ERR_NONE)
                w->ctr_applied++;
            if (d->sp.rid[0] != '\0')
                w->acked[w->nacked++] = *d;
        }
        cr_assert(found, "%s: the extra record is none of the failed writes", what);
        w->last_lsn++;
        cov.unacked_recovered++;
    }
    w->nfailed = 0;
}

static void check_recovered(write_stack *r, write_stack *m, world *w, const char *what) {
    int64_t now = drey_wall_ms();
    expect_equal_stores(r->store, m->store, now, w->rids, w->nrids, what);
    cr_assert_eq(ctr_value(r->store, now), w->ctr_applied, "%s: the counter was incremented %" PRId64
                                                           " times, %" PRId64 " acknowledged",
                 what, ctr_value(r->store, now), w->ctr_applied);
}

static void crash_loop_round(uint32_t seed) {
    char what[128];
    drey_io_fault_destroy(fs);
    fs = drey_io_fault_create();
    io = drey_io_fault_io(fs);
    rng = seed * 7919u;
    static world w;
    memset(&w, 0, sizeof w);
    write_stack s, m;
    stack_create(&s, RETENTION);
    stack_create(&m, RETENTION);
    drey_storage_options o = sopts(4096, 2);
    drey_storage *st = node_open(&o, &s);
    bool snaps_ok = true;
    /* Power fails at the Nth write or sync from some point on (or not). */
    size_t warmup = rnd() % 40;
    run_ops(&s, st, &m, &w, warmup, &snaps_ok);
    unsigned kind = (unsigned)(rnd() % 4); /* a sync failure twice as often */
    if (kind == 3)
        kind = 1;
    unsigned nth = 1 + (unsigned)(rnd() % 40);
    if (kind == 0)
        drey_io_fault_fail_write(fs, nth, EIO, true);
    else if (kind == 1)
        drey_io_fault_fail_sync(fs, nth, EIO, true);
    run_ops(&s, st, &m, &w, 20 + rnd() % 40, &snaps_ok);
    drey_io_fault_crash(fs, seed % 5 != 0, seed);
    drey_storage_close(st);
    stack_destroy(&s);

    snprintf(what, sizeof what, "seed %u kind %u nth %u", seed, kind, nth);
    write_stack r;
    stack_create(&r, RETENTION);
    st = node_open(&o, &r);
    account_for_an_unacknowledged_write(st, &m, &w, what);
    check_recovered(&r, &m, &w, what);
    drey_journal_stats js;
    drey_journal_get_stats(drey_storage_journal(st), &js);
    cov.torn_cut += (unsigned)js.torn_tails_cut;

    /* Retries after the restart get the first outcomes. */
    run_ops(&r, st, &m, &w, 10 + rnd() % 20, &snaps_ok);
    drey_io_fault_crash(fs, true, seed + 77);
    drey_storage_close(st);
    stack_destroy(&r);
    snprintf(what, sizeof what, "seed %u, second crash", seed);
    stack_create(&r, RETENTION);
    st = node_open(&o, &r);
    account_for_an_unacknowledged_write(st, &m, &w, what);
    check_recovered(&r, &m, &w, what);
    drey_storage_close(st);
    stack_destroy(&r);
    stack_destroy(&m);
}

Test(storage, crash_loop_recovers_exactly_the_acknowledged_state) {
    for (uint32_t seed = 1; seed <= 250; seed++)
        crash_loop_round(seed);
    cr_log_info("acked %u failed %u retries %u snapshots %u (failed %u) unacked recovered %u torn cut %u", cov.acked,
                cov.failed, cov.retries, cov.snapshots, cov.snapshots_failed, cov.unacked_recovered, cov.torn_cut);
    cr_assert_gt(cov.failed, 100);
    cr_assert_gt(cov.retries, 100);
    cr_assert_gt(cov.snapshots, 100);
    cr_assert_gt(cov.snapshots_failed, 10);
    cr_assert_gt(cov.unacked_recovered, 10);
    cr_assert_gt(cov.torn_cut, 10);
}

/* --- the derived journal cap (the rule itself: diskcap_test.c) -------------- */

static drey_storage_stats storage_stats(drey_storage *st) {
    drey_storage_stats ss;
    drey_storage_get_stats(st, &ss);
    return ss;
}

/* The journal's cap is the rule applied to the figures of the last look. */
static void expect_derived(drey_storage *st, const char *what) {
    drey_storage_stats ss = storage_stats(st);
    drey_journal_stats js;
    drey_journal_get_stats(drey_storage_journal(st), &js);
    drey_storage__disk d = {.fs_bytes = ss.fs_bytes, .avail_bytes = ss.fs_avail_bytes, .journal_bytes = js.disk_bytes,
                            .snapshot_bytes = ss.snapshot_estimate_bytes};
    cr_assert(ss.journal_cap_derived, "%s", what);
    cr_assert_eq(js.quota_max_bytes, drey_storage__derive_cap(&d), "%s: cap %" PRIu64, what, js.quota_max_bytes);
    cr_assert_eq(ss.reserve_bytes, drey_storage__reserve_bytes(ss.fs_bytes), "%s", what);
}

/* Polls the storage's figures (the disk is looked at every second) until
 * pred holds, with a deadline. */
static drey_storage_stats wait_stats(drey_storage *st, bool (*pred)(const drey_storage_stats *, uint64_t), uint64_t arg,
                                     const char *what) {
    int64_t deadline = drey_mono_ms() + 10000;
    for (;;) {
        drey_storage_stats ss = storage_stats(st);
        if (pred(&ss, arg))
            return ss;
        cr_assert_lt(drey_mono_ms(), deadline, "timed out waiting for %s", what);
        usleep(10 * 1000);
    }
}

static bool fs_is(const drey_storage_stats *ss, uint64_t bytes) {
    return ss->fs_bytes == bytes && ss->snapshot_room != DREY_STORAGE_SNAPSHOT_UNKNOWN;
}

static bool room_is(const drey_storage_stats *ss, uint64_t room) {
    return ss->snapshot_room == (drey_storage_snapshot_room)room;
}

/* Bytes of every file, by the fault file system's own account. */
static uint64_t files_bytes(void) {
    uint64_t total, avail;
    cr_assert_eq(io->ops->fs_space(io, DIR, &total, &avail), 0);
    cr_assert_gt(avail, 0);
    return total - avail;
}

Test(storage, a_derived_cap_follows_the_file_system_and_outlives_losing_sight_of_it) {
    int logfd = memfd_create("log", 0);
    cr_assert_geq(logfd, 0);
    drey_log_set_fd(logfd);
    const uint64_t MIB = 1 << 20;
    drey_io_fault_set_space(fs, 8 * MIB, 0);
    write_stack s;
    stack_create(&s, RETENTION);
    drey_storage_options o = sopts(64 * 1024, 2);
    o.derive_journal_cap = true;
    o.journal.max_bytes = 12345; /* ignored when derived */
    drey_storage *st = node_open(&o, &s);
    expect_derived(st, "at open");
    drey_storage_stats ss = storage_stats(st);
    cr_assert_eq(ss.fs_bytes, 8 * MIB);
    cr_assert_eq(ss.fs_avail_bytes, 8 * MIB - 64 * 1024 - (8 + 16 + 4), "one segment and SEED on an empty file system");
    cr_assert_eq(ss.snapshot_estimate_bytes, 96, "an empty store: a snapshot's header and trailer");
    cr_assert_eq(ss.snapshot_room, DREY_STORAGE_SNAPSHOT_OK);

    /* Writes grow the store; a snapshot's size and compaction move the cap. */
    for (int i = 0; i < 40; i++) {
        spec sp = {.op = OP_SET, .if_version = -1};
        snprintf(sp.key, sizeof sp.key, "k%d", i);
        memset(sp.value, 'v', 600);
        result r;
        submit(&s, st, &sp, &r);
        cr_assert_eq(r.journal_err, 0);
    }
    drey_snapshot_result snap = snapshot_now(st);
    cr_assert_eq(snap.rc, 0);
    ss = storage_stats(st);
    cr_assert_eq(ss.snapshot_files_bytes, snap.info.bytes);
    cr_assert_geq(ss.snapshot_estimate_bytes, snap.info.bytes, "the estimate is below the snapshot it estimates");
    cr_assert_eq(ss.fs_avail_bytes, 8 * MIB - files_bytes(), "the figures of the look after the compaction");
    expect_derived(st, "after a snapshot");

    /* The volume grows: re-derived within a second. */
    drey_io_fault_set_space(fs, 16 * MIB, 0);
    wait_stats(st, fs_is, 16 * MIB, "the grown volume");
    expect_derived(st, "grown");
    uint64_t grown;
    {
        drey_journal_stats js;
        drey_journal_get_stats(drey_storage_journal(st), &js);
        grown = js.quota_max_bytes;
    }

    /* Lost sight of the file system: the cap stays, the room is unknown,
     * one warning; then back. */
    drey_io_fault_set_space(fs, 16 * MIB, EIO);
    wait_stats(st, room_is, DREY_STORAGE_SNAPSHOT_UNKNOWN, "the room unknown");
    drey_journal_stats js;
    drey_journal_get_stats(drey_storage_journal(st), &js);
    cr_assert_eq(js.quota_max_bytes, grown);
    drey_io_fault_set_space(fs, 16 * MIB, 0);
    wait_stats(st, room_is, DREY_STORAGE_SNAPSHOT_OK, "the room back");
    expect_derived(st, "seen again");

    /* Shrunk (another writer): no room beyond the reserve and the snapshot
     * leaves the journal what it has (low); less than the snapshot: short. */
    uint64_t used = files_bytes();
    drey_io_fault_set_space(fs, used + ss.snapshot_estimate_bytes + 1024, 0);
    ss = wait_stats(st, room_is, DREY_STORAGE_SNAPSHOT_LOW, "the room low");
    drey_journal_get_stats(drey_storage_journal(st), &js);
    cr_assert_eq(js.quota_max_bytes, js.disk_bytes, "the journal may not grow");
    expect_derived(st, "low");
    drey_io_fault_set_space(fs, used + ss.snapshot_estimate_bytes / 2, 0);
    wait_stats(st, room_is, DREY_STORAGE_SNAPSHOT_SHORT, "the room short");
    expect_derived(st, "short");
    drey_storage_close(st);

    /* Not derived: the figures and the room still, the cap untouched. A
     * restart: recovery fills a fresh store (the seed is set only on an
     * empty one). */
    stack_destroy(&s);
    stack_create(&s, RETENTION);
    drey_io_fault_set_space(fs, 16 * MIB, 0);
    o.derive_journal_cap = false;
    o.journal.max_bytes = 0;
    st = node_open(&o, &s);
    ss = storage_stats(st);
    cr_assert(!ss.journal_cap_derived);
    cr_assert_eq(ss.fs_bytes, 16 * MIB);
    cr_assert_eq(ss.snapshot_room, DREY_STORAGE_SNAPSHOT_OK);
    drey_journal_get_stats(drey_storage_journal(st), &js);
    cr_assert_eq(js.quota_max_bytes, 0);
    drey_storage_close(st);
    stack_destroy(&s);

    drey_log_set_fd(2);
    static char logbuf[1 << 16];
    ssize_t n = pread(logfd, logbuf, sizeof logbuf - 1, 0);
    cr_assert_gt(n, 0);
    logbuf[n] = '\0';
    close(logfd);
    cr_assert_not_null(strstr(logbuf, "\"journal disk cap derived from the file system\""), "%s", logbuf);
    cr_assert_not_null(strstr(logbuf, "\"journal disk cap re-derived\""), "%s", logbuf);
    const char *warn = strstr(logbuf, "cannot read the data directory's file system space");
    cr_assert_not_null(warn, "%s", logbuf);
    cr_assert_null(strstr(warn + 1, "cannot read the data directory's file system space"), "warned more than once");
    cr_assert_not_null(strstr(logbuf, "can be read again"), "%s", logbuf);
    cr_assert_not_null(strstr(logbuf, "\"snapshot_room\":\"low\""), "%s", logbuf);
    cr_assert_not_null(strstr(logbuf, "\"snapshot_room\":\"short\""), "%s", logbuf);
}

/* --- the hash seed ------------------------------------------------------------ */

Test(storage, the_hash_seed_is_written_once_and_read_back) {
    write_stack s;
    stack_create(&s, RETENTION);
    drey_storage_options o = sopts(64 * 1024, 2);
    uint8_t mine[16], other[16];
    drey_store_get_seed(s.store, mine);
    drey_storage *st = node_open(&o, &s);
    drey_storage_close(st);
    stack_destroy(&s);
    write_stack r;
    stack_create(&r, RETENTION);
    drey_store_get_seed(r.store, other);
    cr_assert(memcmp(mine, other, 16) != 0, "two stores drew the same seed");
    st = node_open(&o, &r);
    drey_store_get_seed(r.store, other);
    cr_assert(memcmp(mine, other, 16) == 0, "the seed did not come back from SEED");
    drey_storage_close(st);
    stack_destroy(&r);
}

Test(storage, a_seed_that_cannot_be_written_or_is_damaged_refuses) {
    drey_storage_options o = sopts(64 * 1024, 2);
    write_stack s;
    stack_create(&s, RETENTION);
    drey_io_fault_fail_write(fs, 1, EIO, false); /* SEED is the first file a new directory gets */
    char err[2048] = "";
    drey_storage *st = NULL;
    cr_assert_eq(drey_storage_open(&o, s.store, s.commit, &st, err, sizeof err), -EIO);
    cr_assert(strstr(err, "cannot write " DIR "/SEED") != NULL, "%s", err);
    st = node_open(&o, &s);
    drey_storage_close(st);
    stack_destroy(&s);
    damage_file("SEED", 6);
    write_stack r;
    stack_create(&r, RETENTION);
    cr_assert_eq(drey_storage_open(&o, r.store, r.commit, &st, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, DIR "/SEED is damaged") != NULL, "%s", err);
    stack_destroy(&r);
}
