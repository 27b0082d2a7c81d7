/*
 * Unit tests for src/storage/tool.c (`dreyd storage inspect|verify|dump|
 * repair`) on a real data directory under $TEST_TMPDIR, plus posix smoke
 * tests of the storage: the data directory lock, and recovery through the
 * real file system.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "drey/clock.h"
#include "drey/storage.h"
#include "tests/unit/write_stack.h"

#define RETENTION (3600 * 1000)

static char dir[1024];

static void setup(void) {
    const char *base = getenv("TEST_TMPDIR");
    snprintf(dir, sizeof dir, "%s/drey-tool-XXXXXX", base != NULL ? base : "/tmp");
    cr_assert_not_null(mkdtemp(dir));
    strcat(dir, "/data");
}

TestSuite(tool, .init = setup, .timeout = 60);

static drey_storage_options sopts(void) {
    return (drey_storage_options){
        .journal = {.dir = dir,
                    .io = drey_io_posix(),
                    .segment_bytes = 4096,
                    .fsync = DREY_FSYNC_ALWAYS,
                    .batch_max_bytes = 1u << 20},
        .retain_snapshots = 2,
    };
}

/* --- writes through the storage (as the request chain does) ------------------ */

typedef struct waitw {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool done;
    int err;
    write_stack *s;
    drey_write *w;
    drey_arena *a;
} waitw;

static void on_durable(void *arg, const drey_journal_record *rec, int err) {
    waitw *f = arg;
    if (err == 0) {
        drey_status st;
        drey_status_init(&st);
        drey_apply ax = {.now_ms = rec->time_ms, .arena = f->a, .status = &st};
        drey_commit_apply(f->s->commit, f->w, &ax);
    }
    pthread_mutex_lock(&f->mu);
    f->err = err;
    f->done = true;
    pthread_cond_signal(&f->cond);
    pthread_mutex_unlock(&f->mu);
}

static void write_n(write_stack *s, drey_storage *st, unsigned from, unsigned n) {
    for (unsigned i = from; i < from + n; i++) {
        drey_arena a;
        drey_arena_init(&a, NULL, 0);
        drey_write w;
        char key[32], value[64], rid[32];
        snprintf(key, sizeof key, "key-%u", i % 10);
        snprintf(value, sizeof value, "value \"%u\" with a \\ and a \t tab", i);
        snprintf(rid, sizeof rid, "rid-%u", i);
        make_set(s, &w, &a, i % 2 ? "users" : "", key, value, i % 3 ? 0 : RETENTION, -1, rid, "al\"ice");
        uint8_t *payload;
        size_t len;
        drey_commit_encode(&w, &a, &payload, &len);
        waitw f = {.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER, .s = s, .w = &w, .a = &a};
        drey_journal_entry e = {.payload = payload, .len = len, .done = on_durable, .arg = &f};
        append_or_done(drey_storage_journal(st), &e);
        pthread_mutex_lock(&f.mu);
        while (!f.done)
            pthread_cond_wait(&f.cond, &f.mu);
        pthread_mutex_unlock(&f.mu);
        cr_assert_eq(f.err, 0);
        drey_arena_destroy(&a);
    }
}

typedef struct snapw {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool done;
    drey_snapshot_result r;
} snapw;

static void on_snapshot(void *arg, const drey_snapshot_result *r) {
    snapw *w = arg;
    pthread_mutex_lock(&w->mu);
    w->r = *r;
    w->done = true;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->mu);
}

static drey_snapshot_result snapshot_now(drey_storage *st) {
    snapw w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    drey_storage_request_snapshot(st, on_snapshot, &w);
    pthread_mutex_lock(&w.mu);
    while (!w.done)
        pthread_cond_wait(&w.cond, &w.mu);
    pthread_mutex_unlock(&w.mu);
    return w.r;
}

/* A data directory: 30 writes, a snapshot, 120 more writes (several
 * segments). Returns the snapshot's LSN. */
static uint64_t make_data_dir(void) {
    write_stack s;
    stack_create(&s, RETENTION);
    drey_storage_options o = sopts();
    drey_storage *st = NULL;
    char err[1024] = "";
    cr_assert_eq(drey_storage_open(&o, s.store, s.commit, &st, err, sizeof err), 0, "%s", err);
    write_n(&s, st, 0, 30);
    drey_snapshot_result r = snapshot_now(st);
    cr_assert_eq(r.rc, 0);
    write_n(&s, st, 30, 120);
    drey_storage_close(st);
    stack_destroy(&s);
    return r.info.lsn;
}

/* --- running the tool ------------------------------------------------------------ */

typedef struct run {
    int code;
    char *out, *err;
    size_t out_len, err_len;
} run;

static run tool(const char *cmd, const char *d) {
    run r = {0};
    FILE *out = open_memstream(&r.out, &r.out_len);
    FILE *err = open_memstream(&r.err, &r.err_len);
    char *argv[] = {(char *)cmd, (char *)d, NULL};
    r.code = drey_storage_tool(d != NULL ? 2 : 1, argv, out, err);
    fclose(out);
    fclose(err);
    return r;
}

static void run_free(run *r) {
    free(r->out);
    free(r->err);
}

/* The segment files, sorted. */
static size_t segments(char names[][32], size_t cap) {
    char jdir[1100];
    snprintf(jdir, sizeof jdir, "%s/journal", dir);
    drey_io *io = drey_io_posix();
    char **all;
    size_t n, k = 0;
    cr_assert_eq(io->ops->list_dir(io, jdir, &all, &n), 0);
    for (size_t i = 0; i < n && k < cap; i++) {
        size_t l = strlen(all[i]);
        if (l == 20 && strcmp(all[i] + 16, ".seg") == 0)
            snprintf(names[k++], 32, "%s", all[i]);
    }
    drey_io_free_names(all, n);
    return k;
}

static void flip_byte(const char *path, off_t off) {
    int fd = open(path, O_RDWR);
    cr_assert_geq(fd, 0, "%s", path);
    uint8_t b;
    cr_assert_eq(pread(fd, &b, 1, off), 1);
    b ^= 0x10;
    cr_assert_eq(pwrite(fd, &b, 1, off), 1);
    close(fd);
}

static size_t count_lines(const char *s, const char *prefix) {
    size_t n = 0;
    for (const char *p = s; p != NULL && *p != '\0';) {
        if (strncmp(p, prefix, strlen(prefix)) == 0)
            n++;
        p = strchr(p, '\n');
        if (p != NULL)
            p++;
    }
    return n;
}

Test(tool, inspect_and_verify_a_healthy_directory) {
    uint64_t lsn = make_data_dir();
    run r = tool("inspect", dir);
    cr_assert_eq(r.code, 0, "%s", r.out);
    char want[128];
    snprintf(want, sizeof want, "manifest: snapshots/snap-%016" PRIx64 ".snap (lsn %" PRIu64 ")", lsn, lsn);
    cr_assert(strstr(r.out, want) != NULL, "%s", r.out);
    cr_assert(strstr(r.out, "snapshots: 1\n") != NULL, "%s", r.out);
    cr_assert(strstr(r.out, "journal: last lsn 150") != NULL, "%s", r.out);
    cr_assert(strstr(r.out, "DAMAGE") == NULL, "%s", r.out);
    cr_assert_gt(count_lines(r.out, "  0"), 2, "segment lines: %s", r.out);
    run_free(&r);
    r = tool("verify", dir);
    cr_assert_eq(r.code, 0, "%s", r.out);
    cr_assert(strstr(r.out, "verify: ok") != NULL, "%s", r.out);
    run_free(&r);
}

Test(tool, dump_prints_json_lines) {
    uint64_t lsn = make_data_dir();
    run r = tool("dump", dir);
    cr_assert_eq(r.code, 0, "%s%s", r.out, r.err);
    /* The snapshot's entries (10 keys, and 30 remembered outcomes), then
     * the journal records after it. */
    size_t records = count_lines(r.out, "{\"lsn\":");
    size_t entries = count_lines(r.out, "{\"cache\":");
    cr_assert_eq(records, 150 - lsn, "%s", r.out);
    cr_assert_eq(entries, 10 + 30, "%s", r.out);
    size_t lines = count_lines(r.out, "");
    cr_assert_eq(lines, records + entries, "every line is an object:\n%s", r.out);
    for (const char *p = r.out; *p != '\0';) {
        const char *nl = strchr(p, '\n');
        cr_assert_not_null(nl);
        cr_assert_eq(*p, '{');
        cr_assert_eq(nl[-1], '}');
        p = nl + 1;
    }
    cr_assert(strstr(r.out, "\"method\":\"drey.cache.v1.Cache/Set\"") != NULL, "%s", r.out);
    cr_assert(strstr(r.out, "\"principal\":\"al\\\"ice\"") != NULL, "%s", r.out);
    cr_assert(strstr(r.out, "\"request_id\":\"rid-149\"") != NULL, "%s", r.out);
    cr_assert(strstr(r.out, "\"cache\":\"users\"") != NULL, "%s", r.out);
    cr_assert(strstr(r.out, "\"expires_at\":\"") != NULL, "%s", r.out);
    run_free(&r);
}

Test(tool, verify_fails_on_a_damaged_frame_in_a_non_last_segment_and_repair_cuts_it) {
    make_data_dir();
    char names[16][32];
    size_t n = segments(names, 16);
    cr_assert_geq(n, 3);
    char path[1200];
    snprintf(path, sizeof path, "%s/journal/%s", dir, names[1]);
    flip_byte(path, 64 + 50); /* the first frame's payload */

    run r = tool("verify", dir);
    cr_assert_eq(r.code, 1, "%s", r.out);
    char want[1300];
    snprintf(want, sizeof want, "DAMAGE: damaged frame in %s/journal/%s at offset 64", dir, names[1]);
    cr_assert(strstr(r.out, want) != NULL, "wanted \"%s\" in:\n%s", want, r.out);
    cr_assert(strstr(r.out, "verify: DAMAGED") != NULL, "%s", r.out);
    run_free(&r);
    r = tool("inspect", dir);
    cr_assert_eq(r.code, 0, "inspect reports, it does not judge");
    cr_assert(strstr(r.out, want) != NULL, "%s", r.out);
    run_free(&r);
    r = tool("dump", dir);
    cr_assert_eq(r.code, 1);
    cr_assert(strstr(r.err, "damaged frame") != NULL, "%s", r.err);
    run_free(&r);

    /* The node refuses to start, naming file and offset. */
    write_stack s;
    stack_create(&s, RETENTION);
    drey_storage_options o = sopts();
    drey_storage *st = NULL;
    char err[2048] = "";
    cr_assert_neq(drey_storage_open(&o, s.store, s.commit, &st, err, sizeof err), 0);
    cr_assert(strstr(err, names[1]) != NULL && strstr(err, "at offset 64") != NULL, "%s", err);
    stack_destroy(&s);

    r = tool("repair", dir);
    cr_assert_eq(r.code, 0, "%s%s", r.out, r.err);
    cr_assert(strstr(r.out, "repair: damaged frame in") != NULL, "%s", r.out);
    char dropped[64];
    snprintf(dropped, sizeof dropped, "and %zu later segment(s)", n - 2);
    cr_assert(strstr(r.out, dropped) != NULL, "%s", r.out);
    run_free(&r);
    cr_assert_eq(segments(names, 16), 2);

    r = tool("verify", dir);
    cr_assert_eq(r.code, 0, "%s", r.out);
    cr_assert(strstr(r.out, "verify: ok") != NULL, "%s", r.out);
    run_free(&r);
    r = tool("repair", dir);
    cr_assert_eq(r.code, 0);
    cr_assert(strstr(r.out, "nothing to do") != NULL, "%s", r.out);
    run_free(&r);

    /* And the node starts again, with what was kept. */
    stack_create(&s, RETENTION);
    cr_assert_eq(drey_storage_open(&o, s.store, s.commit, &st, err, sizeof err), 0, "%s", err);
    drey_journal_stats js;
    drey_journal_get_stats(drey_storage_journal(st), &js);
    char first[32];
    snprintf(first, sizeof first, "%s", names[1]);
    cr_assert_eq(js.last_lsn, strtoull(first, NULL, 16) - 1);
    drey_storage_close(st);
    stack_destroy(&s);
}

Test(tool, damaged_snapshot_and_manifest_are_reported) {
    uint64_t lsn = make_data_dir();
    char path[1200];
    snprintf(path, sizeof path, "%s/snapshots/snap-%016" PRIx64 ".snap", dir, lsn);
    flip_byte(path, 100);
    run r = tool("verify", dir);
    cr_assert_eq(r.code, 1, "%s", r.out);
    cr_assert(strstr(r.out, "the snapshot it names is DAMAGED") != NULL, "%s", r.out);
    cr_assert(strstr(r.out, "DAMAGED: ") != NULL, "%s", r.out);
    run_free(&r);
    r = tool("dump", dir);
    cr_assert_eq(r.code, 1);
    run_free(&r);
    flip_byte(path, 100);
    snprintf(path, sizeof path, "%s/CURRENT", dir);
    flip_byte(path, 20);
    r = tool("verify", dir);
    cr_assert_eq(r.code, 1, "%s", r.out);
    cr_assert(strstr(r.out, "manifest: DAMAGED") != NULL, "%s", r.out);
    run_free(&r);
}

Test(tool, torn_tail_is_a_note_not_damage) {
    uint64_t lsn = make_data_dir();
    char names[16][32];
    size_t n = segments(names, 16);
    char path[1200];
    snprintf(path, sizeof path, "%s/journal/%s", dir, names[n - 1]);
    /* Damage the last frame of the last segment: nothing follows it. */
    drey_journal_scan sc;
    cr_assert_eq(drey_journal_scan_dir(drey_io_posix(), dir, lsn, NULL, NULL, &sc), 0);
    cr_assert_eq(sc.problem, DREY_JOURNAL_OK, "%s", sc.message);
    uint64_t end = sc.segments[sc.n_segments - 1].data_end;
    drey_journal_scan_free(&sc);
    flip_byte(path, (off_t)end - 3);
    run r = tool("verify", dir);
    cr_assert_eq(r.code, 0, "%s", r.out);
    cr_assert(strstr(r.out, "note: torn tail") != NULL, "%s", r.out);
    run_free(&r);
}

Test(tool, usage) {
    run r = tool("inspect", NULL);
    cr_assert_eq(r.code, 2);
    cr_assert(strstr(r.err, "usage: dreyd storage") != NULL, "%s", r.err);
    run_free(&r);
    r = tool("frobnicate", "/nonexistent");
    cr_assert_eq(r.code, 2);
    run_free(&r);
}

/* --- posix smoke tests --------------------------------------------------------------- */

Test(tool, data_directory_lock_refuses_a_second_node) {
    write_stack a, b;
    stack_create(&a, RETENTION);
    stack_create(&b, RETENTION);
    drey_storage_options o = sopts();
    drey_storage *st1 = NULL, *st2 = NULL;
    char err[1024] = "";
    cr_assert_eq(drey_storage_open(&o, a.store, a.commit, &st1, err, sizeof err), 0, "%s", err);
    cr_assert_neq(drey_storage_open(&o, b.store, b.commit, &st2, err, sizeof err), 0);
    cr_assert_null(st2);
    cr_assert(strstr(err, "in use by another dreyd") != NULL, "%s", err);
    drey_storage_close(st1);
    /* Released at close. */
    cr_assert_eq(drey_storage_open(&o, b.store, b.commit, &st2, err, sizeof err), 0, "%s", err);
    drey_storage_close(st2);
    stack_destroy(&a);
    stack_destroy(&b);
}

Test(tool, recovery_through_the_real_file_system) {
    write_stack s;
    stack_create(&s, RETENTION);
    drey_storage_options o = sopts();
    drey_storage *st = NULL;
    char err[1024] = "";
    cr_assert_eq(drey_storage_open(&o, s.store, s.commit, &st, err, sizeof err), 0, "%s", err);
    write_n(&s, st, 0, 80);
    cr_assert_eq(snapshot_now(st).rc, 0);
    write_n(&s, st, 80, 20);
    drey_storage_close(st);
    uint64_t version = drey_store_last_version(s.store);
    entry_copy before;
    cr_assert(read_entry(s.store, "users", "key-9", drey_wall_ms(), &before));
    stack_destroy(&s);

    stack_create(&s, RETENTION);
    cr_assert_eq(drey_storage_open(&o, s.store, s.commit, &st, err, sizeof err), 0, "%s", err);
    drey_storage_stats ss;
    drey_storage_get_stats(st, &ss);
    cr_assert_eq(ss.snapshot_lsn, 80);
    cr_assert_eq(ss.replayed_records, 20);
    cr_assert_eq(drey_store_last_version(s.store), version);
    entry_copy after;
    cr_assert(read_entry(s.store, "users", "key-9", drey_wall_ms(), &after));
    cr_assert_eq(after.version, before.version);
    cr_assert_eq(after.len, before.len);
    cr_assert(memcmp(after.data, before.data, after.len) == 0);
    drey_storage_close(st);
    stack_destroy(&s);
}
