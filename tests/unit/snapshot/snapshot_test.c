/*
 * Unit tests for src/snapshot/snapshot.c (and the store's capture in
 * src/store/store.c): snapshot files round-trip every kind of value with
 * its version and expiry, refuse every truncation and damaged record, never
 * appear half-written after a crash, and hold exactly the store as of the
 * capture's start while writers keep changing it.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/crc32c.h"
#include "drey/io.h"
#include "drey/snapshot.h"
#include "drey/store.h"

#define DIR "/data"

static drey_io_fault *fs;
static drey_io *io;
static drey_store *st;

static void setup(void) {
    fs = drey_io_fault_create();
    io = drey_io_fault_io(fs);
    st = drey_store_create();
    cr_assert_eq(io->ops->mkdir(io, DIR), 0);
}

static void teardown(void) {
    drey_store_destroy(st);
    drey_io_fault_destroy(fs);
}

TestSuite(snapshot, .init = setup, .fini = teardown, .timeout = 60);

/* --- a model of the store --------------------------------------------------- */

typedef struct item {
    char cache[32];
    char key[64];
    drey_value_kind kind;
    uint8_t value[256];
    uint32_t len;
    uint64_t version;
    int64_t expires;
    bool present;
} item;

static void put(drey_store *s, const item *it) {
    drey_key k;
    drey_store_key(s, &k, it->cache, strlen(it->cache), it->key, strlen(it->key));
    drey_value v = {.kind = it->kind, .data = it->value, .len = it->len};
    drey_store_txn t;
    drey_store_txn_begin(s, &t, &k, 1);
    drey_store_txn_put(&t, &k, &v, it->expires, it->version);
    drey_store_txn_end(&t);
}

static void del(drey_store *s, const item *it) {
    drey_key k;
    drey_store_key(s, &k, it->cache, strlen(it->cache), it->key, strlen(it->key));
    drey_store_txn t;
    drey_store_txn_begin(s, &t, &k, 1);
    drey_store_txn_remove(&t, &k);
    drey_store_txn_end(&t);
}

/* What a snapshot read delivers, collected. */
typedef struct seen {
    size_t n, cap;
    item *items;
} seen;

static void collect(void *ctx, const drey_store_item *si) {
    seen *s = ctx;
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 64;
        s->items = realloc(s->items, s->cap * sizeof *s->items);
    }
    item *it = &s->items[s->n++];
    memset(it, 0, sizeof *it);
    cr_assert_lt(si->cache_len, sizeof it->cache);
    cr_assert_lt(si->key_len, sizeof it->key);
    cr_assert_leq(si->entry.value.len, sizeof it->value);
    memcpy(it->cache, si->cache, si->cache_len);
    memcpy(it->key, si->key, si->key_len);
    it->kind = si->entry.value.kind;
    it->len = si->entry.value.len;
    if (it->len > 0)
        memcpy(it->value, si->entry.value.data, it->len);
    it->version = si->entry.version;
    it->expires = si->entry.expires_at_ms;
    it->present = true;
}

static const item *find(const seen *s, const char *cache, const char *key) {
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->items[i].cache, cache) == 0 && strcmp(s->items[i].key, key) == 0)
            return &s->items[i];
    return NULL;
}

static void expect_item(const item *got, const item *want, const char *what) {
    cr_assert_not_null(got, "%s: %s/%s missing", what, want->cache, want->key);
    cr_assert_eq(got->kind, want->kind, "%s: %s kind", what, want->key);
    cr_assert_eq(got->len, want->len, "%s: %s len", what, want->key);
    cr_assert(memcmp(got->value, want->value, want->len) == 0, "%s: %s value", what, want->key);
    cr_assert_eq(got->version, want->version, "%s: %s version", what, want->key);
    cr_assert_eq(got->expires, want->expires, "%s: %s expiry", what, want->key);
}

static int take(drey_store *s, uint64_t lsn, int64_t time_ms, char *name, drey_snapshot_info *info) {
    drey_snapshot *snap = drey_snapshot_begin(s, lsn, time_ms);
    return drey_snapshot_finish(snap, io, DIR, name, 64, info);
}

static void path_of(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, DIR "/snapshots/%s", name);
}

static int read_into(const char *path, seen *out, drey_snapshot_info *info, char *err) {
    memset(out, 0, sizeof *out);
    return drey_snapshot_read(io, path, collect, out, info, err, 512);
}

/* Every value kind, in the default and a named cache. */
static size_t sample(item *v) {
    size_t n = 0;
    int64_t i64 = -1234567890123LL;
    double d = 3.25;
    v[n] = (item){.cache = "", .key = "bytes", .kind = DREY_VALUE_BYTES, .len = 5, .version = 3, .expires = 0};
    memcpy(v[n++].value, "\0\1\2\0\377", 5);
    v[n] = (item){.cache = "", .key = "string", .kind = DREY_VALUE_STRING, .len = 6, .version = 4,
                  .expires = 5000000};
    memcpy(v[n++].value, "héllo", 6);
    v[n] = (item){.cache = "users", .key = "int", .kind = DREY_VALUE_INT64, .len = 8, .version = 10, .expires = 0};
    memcpy(v[n++].value, &i64, 8);
    v[n] = (item){.cache = "users", .key = "double", .kind = DREY_VALUE_DOUBLE, .len = 8, .version = 11,
                  .expires = 9000000};
    memcpy(v[n++].value, &d, 8);
    v[n] = (item){.cache = "users", .key = "bool", .kind = DREY_VALUE_BOOL, .len = 1, .version = 12};
    v[n++].value[0] = 1;
    v[n] = (item){.cache = "json", .key = "struct", .kind = DREY_VALUE_JSON, .len = 4, .version = 13};
    memcpy(v[n++].value, "\x0a\x02\x08\x01", 4);
    v[n++] = (item){.cache = "json", .key = "null", .kind = DREY_VALUE_NULL, .len = 0, .version = 14};
    v[n] = (item){.cache = "", .key = "empty-bytes", .kind = DREY_VALUE_BYTES, .len = 0, .version = 15};
    n++;
    v[n] = (item){.cache = "big", .key = "max-version", .kind = DREY_VALUE_STRING, .len = 200,
                  .version = UINT64_MAX - 1, .expires = INT64_MAX};
    memset(v[n++].value, 'z', 200);
    return n;
}

Test(snapshot, round_trip_of_every_value_kind_version_and_expiry) {
    item v[16];
    size_t n = sample(v);
    for (size_t i = 0; i < n; i++)
        put(st, &v[i]);
    drey_store_raise_version(st, 77);
    char name[64];
    drey_snapshot_info info;
    cr_assert_eq(take(st, 0x2a, 1000000, name, &info), 0);
    cr_assert_str_eq(name, "snap-000000000000002a.snap");
    cr_assert_eq(info.lsn, 0x2a);
    cr_assert_eq(info.time_ms, 1000000);
    cr_assert_eq(info.last_version, 77);
    cr_assert_eq(info.entries, n);

    char path[256], err[512];
    path_of(path, sizeof path, name);
    seen s;
    drey_snapshot_info rinfo;
    cr_assert_eq(read_into(path, &s, &rinfo, err), 0, "%s", err);
    cr_assert_eq(s.n, n);
    for (size_t i = 0; i < n; i++)
        expect_item(find(&s, v[i].cache, v[i].key), &v[i], "read");
    cr_assert_eq(rinfo.lsn, 0x2a);
    cr_assert_eq(rinfo.time_ms, 1000000);
    cr_assert_eq(rinfo.last_version, 77);
    cr_assert_eq(rinfo.entries, n);
    cr_assert_eq(rinfo.bytes, info.bytes);
    free(s.items);

    /* Verifying reads without a callback. */
    cr_assert_eq(drey_snapshot_read(io, path, NULL, NULL, &rinfo, err, sizeof err), 0, "%s", err);

    /* Loading into a fresh store: every entry, and the version counter. */
    drey_store *fresh = drey_store_create();
    cr_assert_eq(drey_snapshot_load(io, path, fresh, &rinfo, err, sizeof err), 0, "%s", err);
    cr_assert_eq(drey_store_last_version(fresh), 77);
    drey_store_stats ss;
    drey_store_get_stats(fresh, &ss);
    cr_assert_eq(ss.entries, n);
    drey_snapshot *again = drey_snapshot_begin(fresh, 0x2b, 1000000);
    char name2[64];
    cr_assert_eq(drey_snapshot_finish(again, io, DIR, name2, sizeof name2, NULL), 0);
    path_of(path, sizeof path, name2);
    cr_assert_eq(read_into(path, &s, &rinfo, err), 0, "%s", err);
    for (size_t i = 0; i < n; i++)
        expect_item(find(&s, v[i].cache, v[i].key), &v[i], "reloaded");
    free(s.items);
    drey_store_destroy(fresh);
}

Test(snapshot, empty_store) {
    char name[64], path[256], err[512];
    drey_snapshot_info info;
    cr_assert_eq(take(st, 1, 5, name, &info), 0);
    cr_assert_eq(info.entries, 0);
    path_of(path, sizeof path, name);
    seen s;
    cr_assert_eq(read_into(path, &s, &info, err), 0, "%s", err);
    cr_assert_eq(s.n, 0);
    free(s.items);
}

Test(snapshot, entries_expired_at_the_capture_time_are_skipped) {
    item a = {.cache = "", .key = "expired", .kind = DREY_VALUE_STRING, .len = 1, .version = 1, .expires = 999};
    item b = {.cache = "", .key = "at-capture", .kind = DREY_VALUE_STRING, .len = 1, .version = 2, .expires = 1000};
    item c = {.cache = "", .key = "just-after", .kind = DREY_VALUE_STRING, .len = 1, .version = 3, .expires = 1001};
    item d = {.cache = "", .key = "never", .kind = DREY_VALUE_STRING, .len = 1, .version = 4, .expires = 0};
    put(st, &a);
    put(st, &b);
    put(st, &c);
    put(st, &d);
    char name[64], path[256], err[512];
    drey_snapshot_info info;
    cr_assert_eq(take(st, 9, 1000, name, &info), 0);
    cr_assert_eq(info.entries, 2);
    path_of(path, sizeof path, name);
    seen s;
    cr_assert_eq(read_into(path, &s, &info, err), 0, "%s", err);
    cr_assert_eq(s.n, 2);
    cr_assert_null(find(&s, "", "expired"));
    cr_assert_null(find(&s, "", "at-capture"));
    expect_item(find(&s, "", "just-after"), &c, "live");
    expect_item(find(&s, "", "never"), &d, "live");
    free(s.items);
}

Test(snapshot, parse_name) {
    uint64_t lsn;
    cr_assert(drey_snapshot_parse_name("snap-00000000000000ff.snap", &lsn));
    cr_assert_eq(lsn, 255);
    cr_assert(drey_snapshot_parse_name("snap-ffffffffffffffff.snap", &lsn));
    cr_assert_eq(lsn, UINT64_MAX);
    cr_assert(!drey_snapshot_parse_name("snap-00000000000000FF.snap", &lsn));
    cr_assert(!drey_snapshot_parse_name("snap-00000000000000ff.snap.tmp", &lsn));
    cr_assert(!drey_snapshot_parse_name("snap-0000000000000ff.snap", &lsn));
    cr_assert(!drey_snapshot_parse_name("snop-00000000000000ff.snap", &lsn));
    cr_assert(!drey_snapshot_parse_name("", &lsn));
}

Test(snapshot, missing_file) {
    drey_snapshot_info info;
    char err[512];
    cr_assert_eq(drey_snapshot_read(io, DIR "/snapshots/snap-0000000000000001.snap", NULL, NULL, &info, err,
                                    sizeof err),
                 -ENOENT);
    cr_assert(strstr(err, "cannot read") != NULL, "%s", err);
}

/* --- damage ----------------------------------------------------------------- */

static uint8_t *file;
static size_t file_len;

/* A snapshot of several records; its bytes in file/file_len. */
static void make_sample_snapshot(char *path, size_t cap) {
    item v[16];
    size_t n = sample(v);
    for (size_t i = 0; i < n; i++)
        put(st, &v[i]);
    char name[64];
    drey_snapshot_info info;
    cr_assert_eq(take(st, 5, 1000, name, &info), 0);
    path_of(path, cap, name);
    cr_assert_eq(drey_io_read_file(io, path, &file, &file_len), 0);
}

static void write_variant(char *path, const uint8_t *data, size_t n) {
    cr_assert_eq(drey_io_write_file_atomic(io, DIR "/snapshots", "variant.snap", data, n), 0);
    snprintf(path, 256, DIR "/snapshots/variant.snap");
}

static int read_variant(const uint8_t *data, size_t n, char *err) {
    char path[256] = "";
    write_variant(path, data, n);
    drey_snapshot_info info;
    seen s;
    int rc = read_into(path, &s, &info, err);
    free(s.items);
    return rc;
}

Test(snapshot, every_truncation_is_refused) {
    char path[256], err[512];
    make_sample_snapshot(path, sizeof path);
    cr_assert_gt(file_len, 64 + 32 + 100);
    for (size_t len = 0; len < file_len; len++) {
        bool near_end = len + 300 >= file_len;
        if (!near_end && len % 7 != 0)
            continue; /* every length near the end, a sample elsewhere */
        int rc = read_variant(file, len, err);
        cr_assert_eq(rc, -EINVAL, "truncated to %zu of %zu: rc %d", len, file_len, rc);
        cr_assert(strstr(err, "variant.snap") != NULL, "%s", err);
    }
    cr_assert_eq(read_variant(file, file_len, err), 0, "%s", err);
    free(file);
}

/* Cut exactly at record boundaries, with a valid trailer appended: the
 * trailer's count and chained CRC still catch the missing records. */
Test(snapshot, dropped_records_with_a_rebuilt_trailer_are_refused) {
    char path[256], err[512];
    make_sample_snapshot(path, sizeof path);
    size_t end = file_len - 32;
    size_t off = 64;
    size_t cuts = 0;
    while (off < end) {
        uint32_t body = file[off] | file[off + 1] << 8 | file[off + 2] << 16 | (uint32_t)file[off + 3] << 24;
        off += 8 + body;
        if (off >= end)
            break;
        /* Records [64, off) plus the original trailer. */
        uint8_t *v = malloc(off + 32);
        memcpy(v, file, off);
        memcpy(v + off, file + end, 32);
        cr_assert_eq(read_variant(v, off + 32, err), -EINVAL, "cut at %zu", off);
        cr_assert(strstr(err, "where its trailer says") != NULL, "%s", err);
        free(v);
        cuts++;
    }
    cr_assert_gt(cuts, 3);
    free(file);
}

Test(snapshot, every_flipped_bit_in_a_record_is_refused) {
    char path[256], err[512];
    make_sample_snapshot(path, sizeof path);
    uint8_t *v = malloc(file_len);
    /* Header (CRC-covered part), every record, the trailer. */
    for (size_t byte = 0; byte < file_len; byte++) {
        if (byte >= 52 && byte < 64)
            continue; /* the header's zero padding is not checked */
        if (byte >= file_len - 32 + 24)
            continue; /* nor the trailer's */
        for (unsigned bit = 0; bit < 8; bit += 3) {
            memcpy(v, file, file_len);
            v[byte] ^= (uint8_t)(1u << bit);
            int rc = read_variant(v, file_len, err);
            cr_assert_eq(rc, -EINVAL, "byte %zu bit %u: rc %d", byte, bit, rc);
        }
    }
    free(v);
    free(file);
}

Test(snapshot, trailer_count_mismatch_is_refused) {
    char path[256], err[512];
    make_sample_snapshot(path, sizeof path);
    uint8_t *v = malloc(file_len);
    memcpy(v, file, file_len);
    uint8_t *t = v + file_len - 32;
    t[8] ^= 1; /* count */
    uint32_t crc = drey_crc32c(0, t, 20);
    for (int i = 0; i < 4; i++)
        t[20 + i] = (uint8_t)(crc >> (8 * i));
    cr_assert_eq(read_variant(v, file_len, err), -EINVAL);
    cr_assert(strstr(err, "where its trailer says") != NULL, "%s", err);
    free(v);
    free(file);
}

Test(snapshot, reordered_records_break_the_chained_crc) {
    char path[256], err[512];
    make_sample_snapshot(path, sizeof path);
    /* Swap the first two records: each intact, the count right. */
    size_t a = 64;
    uint32_t la = 8 + (file[a] | file[a + 1] << 8 | file[a + 2] << 16 | (uint32_t)file[a + 3] << 24);
    size_t b = a + la;
    uint32_t lb = 8 + (file[b] | file[b + 1] << 8 | file[b + 2] << 16 | (uint32_t)file[b + 3] << 24);
    uint8_t *v = malloc(file_len);
    memcpy(v, file, file_len);
    memcpy(v + a, file + b, lb);
    memcpy(v + a + lb, file + a, la);
    cr_assert_eq(read_variant(v, file_len, err), -EINVAL);
    free(v);
    free(file);
}

Test(snapshot, load_of_a_damaged_file_leaves_the_version_counter_alone) {
    char path[256], err[512];
    make_sample_snapshot(path, sizeof path);
    file[file_len - 40] ^= 0x40; /* in the last record */
    write_variant(path, file, file_len);
    drey_store *fresh = drey_store_create();
    drey_snapshot_info info;
    cr_assert_eq(drey_snapshot_load(io, path, fresh, &info, err, sizeof err), -EINVAL);
    cr_assert(strstr(err, "damaged") != NULL, "%s", err);
    cr_assert_eq(drey_store_last_version(fresh), 0);
    drey_store_destroy(fresh);
    free(file);
}

/* --- crashes ------------------------------------------------------------------ */

static size_t visible_snapshots(bool *all_valid) {
    char **names;
    size_t n, count = 0;
    *all_valid = true;
    if (io->ops->list_dir(io, DIR "/snapshots", &names, &n) != 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t lsn;
        if (!drey_snapshot_parse_name(names[i], &lsn))
            continue;
        count++;
        char path[256], err[512];
        path_of(path, sizeof path, names[i]);
        drey_snapshot_info info;
        if (drey_snapshot_read(io, path, NULL, NULL, &info, err, sizeof err) != 0)
            *all_valid = false;
    }
    drey_io_free_names(names, n);
    return count;
}

/* Power fails at the Nth write or sync of a snapshot (sticky: nothing after
 * it reaches the disk): the snapshot fails, and after the crash there is
 * no snapshot file, or a complete one, never a partial one. */
Test(snapshot, crash_during_write_leaves_no_partial_snapshot) {
    for (unsigned kind = 0; kind < 2; kind++) {
        for (unsigned nth = 1; nth <= 8; nth++) {
            for (uint32_t seed = 0; seed < 4; seed++) {
                drey_io_fault_destroy(fs);
                fs = drey_io_fault_create();
                io = drey_io_fault_io(fs);
                cr_assert_eq(io->ops->mkdir(io, DIR), 0);
                drey_store_destroy(st);
                st = drey_store_create();
                for (int i = 0; i < 300; i++) {
                    item it = {.kind = DREY_VALUE_STRING, .len = 100, .version = (uint64_t)i + 1};
                    snprintf(it.key, sizeof it.key, "key-%d", i);
                    memset(it.value, 'a' + i % 26, 100);
                    put(st, &it);
                }
                if (kind == 0)
                    drey_io_fault_fail_write(fs, nth, EIO, true);
                else
                    drey_io_fault_fail_sync(fs, nth, EIO, true);
                char name[64];
                drey_snapshot_info info;
                int rc = take(st, 3, 1000, name, &info);
                /* A write fault beyond the writes made lets it succeed. */
                drey_io_fault_crash(fs, seed > 0, seed);
                bool valid;
                size_t n = visible_snapshots(&valid);
                cr_assert(valid, "kind %u nth %u seed %u: a damaged snapshot is visible", kind, nth, seed);
                if (rc == 0)
                    cr_assert_eq(n, 1, "kind %u nth %u: a finished snapshot vanished", kind, nth);
                else if (kind == 0 || nth == 1)
                    cr_assert_eq(n, 0, "kind %u nth %u: a failed snapshot is visible", kind, nth);
            }
        }
    }
}

Test(snapshot, failed_snapshot_leaves_no_temporary) {
    item it = {.key = "k", .kind = DREY_VALUE_STRING, .len = 1, .version = 1};
    put(st, &it);
    drey_io_fault_fail_sync(fs, 1, EIO, false);
    char name[64];
    drey_snapshot_info info;
    cr_assert_eq(take(st, 3, 1000, name, &info), -EIO);
    char **names;
    size_t n;
    cr_assert_eq(io->ops->list_dir(io, DIR "/snapshots", &names, &n), 0);
    cr_assert_eq(n, 0, "left %s", n ? names[0] : "");
    drey_io_free_names(names, n);
    /* The store's capture ended: a later snapshot works. */
    cr_assert_eq(take(st, 4, 1000, name, &info), 0);
    cr_assert_eq(info.entries, 1);
}

/* --- capture consistency -------------------------------------------------------- */

#define KEYS 4000

typedef struct mutator {
    drey_store *s;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    size_t done;
    uint64_t rng;
    int64_t capture_time;
} mutator;

static uint64_t next_rand(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static void key_item(item *it, size_t i) {
    memset(it, 0, sizeof *it);
    snprintf(it->cache, sizeof it->cache, "c%zu", i % 3);
    snprintf(it->key, sizeof it->key, "key-%zu", i);
}

static void *mutate(void *arg) {
    mutator *m = arg;
    for (size_t n = 0; n < 40000; n++) {
        item it;
        size_t i = next_rand(&m->rng) % (KEYS + 500);
        key_item(&it, i);
        switch (next_rand(&m->rng) % 5) {
        case 0:
        case 1:
            it.kind = DREY_VALUE_STRING;
            it.len = 10;
            memset(it.value, 'M', 10);
            it.version = 1000000 + n;
            it.expires = (int64_t)(next_rand(&m->rng) % 3) * 500; /* 0, or expired at the capture time */
            put(m->s, &it);
            break;
        case 2:
            del(m->s, &it);
            break;
        case 3: {
            drey_key k;
            drey_store_key(m->s, &k, it.cache, strlen(it.cache), it.key, strlen(it.key));
            drey_store_txn t;
            drey_store_txn_begin(m->s, &t, &k, 1);
            drey_store_txn_set_expiry(&t, &k, 1);
            drey_store_txn_end(&t);
            break;
        }
        default: {
            /* The expiry sweep, at a time long after the capture: frees
             * entries that were live at it. */
            size_t expired = 0;
            drey_store_sweep(m->s, m->capture_time + 1000000, 64, &expired);
            break;
        }
        }
        if (n == 1000) {
            pthread_mutex_lock(&m->mu);
            m->done = n;
            pthread_cond_broadcast(&m->cond);
            pthread_mutex_unlock(&m->mu);
        }
    }
    return NULL;
}

Test(snapshot, capture_holds_exactly_the_state_at_begin_while_writers_go_on) {
    static item model[KEYS];
    uint64_t r = 99;
    const int64_t capture_time = 10000;
    for (size_t i = 0; i < KEYS; i++) {
        key_item(&model[i], i);
        model[i].kind = DREY_VALUE_BYTES;
        model[i].len = (uint32_t)(next_rand(&r) % 50);
        for (uint32_t b = 0; b < model[i].len; b++)
            model[i].value[b] = (uint8_t)next_rand(&r);
        model[i].version = i + 1;
        /* A third expire before the capture, a third after it, a third never. */
        switch (i % 3) {
        case 0: model[i].expires = capture_time - (int64_t)(i % 100); break;
        case 1: model[i].expires = capture_time + 1 + (int64_t)(i % 1000); break;
        default: model[i].expires = 0;
        }
        put(st, &model[i]);
    }
    drey_store_raise_version(st, KEYS);

    drey_snapshot *snap = drey_snapshot_begin(st, 500, capture_time);
    mutator m = {.s = st, .rng = 7, .capture_time = capture_time};
    pthread_mutex_init(&m.mu, NULL);
    pthread_cond_init(&m.cond, NULL);
    pthread_t th;
    pthread_create(&th, NULL, mutate, &m);
    /* Finish while the mutator is well under way. */
    pthread_mutex_lock(&m.mu);
    while (m.done == 0)
        pthread_cond_wait(&m.cond, &m.mu);
    pthread_mutex_unlock(&m.mu);
    char name[64];
    drey_snapshot_info info;
    cr_assert_eq(drey_snapshot_finish(snap, io, DIR, name, sizeof name, &info), 0);
    pthread_join(th, NULL);

    char path[256], err[512];
    path_of(path, sizeof path, name);
    seen s;
    cr_assert_eq(read_into(path, &s, &info, err), 0, "%s", err);
    size_t live = 0;
    for (size_t i = 0; i < KEYS; i++) {
        const item *got = find(&s, model[i].cache, model[i].key);
        if (model[i].expires != 0 && model[i].expires <= capture_time) {
            cr_assert_null(got, "%s expired before the capture", model[i].key);
            continue;
        }
        expect_item(got, &model[i], "capture");
        live++;
    }
    cr_assert_eq(s.n, live, "the snapshot holds %zu entries, the model %zu", s.n, live);
    cr_assert_eq(info.last_version, KEYS);
    free(s.items);
    pthread_mutex_destroy(&m.mu);
    pthread_cond_destroy(&m.cond);
}

/* Found by tests/fuzz (regressions/snapshot/header-size-past-end): a header
 * whose size field points past the records, with a right CRC, is a damaged
 * header (-EINVAL), not a read past the end of the file (-EIO). */
Test(snapshot, header_size_past_the_records_is_a_bad_header) {
    char path[256], err[512];
    make_sample_snapshot(path, sizeof path);
    uint8_t *v = malloc(file_len);
    memcpy(v, file, file_len);
    uint32_t hs = (uint32_t)(file_len - 32 + 1);
    for (int i = 0; i < 4; i++)
        v[12 + i] = (uint8_t)(hs >> (8 * i));
    uint32_t crc = drey_crc32c(0, v, 48);
    for (int i = 0; i < 4; i++)
        v[48 + i] = (uint8_t)(crc >> (8 * i));
    cr_assert_eq(read_variant(v, file_len, err), -EINVAL);
    cr_assert(strstr(err, "bad snapshot header") != NULL, "%s", err);
    free(v);
    free(file);
}

/* Found by tests/fuzz (regressions/snapshot/trailer-count-sizes-table):
 * loading sizes the table from the trailer's count before any record is
 * checked, so a huge count (with or without a right trailer CRC) must not
 * reach the allocator, or loop: the load fails as damaged and the store
 * stays usable. */
Test(snapshot, a_huge_trailer_count_does_not_size_the_table) {
    char path[256], err[512];
    make_sample_snapshot(path, sizeof path);
    uint8_t *v = malloc(file_len);
    for (int fix_crc = 0; fix_crc < 2; fix_crc++) {
        memcpy(v, file, file_len);
        uint8_t *t = v + file_len - 32;
        for (int i = 8; i < 16; i++)
            t[i] = i == 15 ? 0x7f : 0xff; /* INT64_MAX records */
        if (fix_crc) {
            uint32_t crc = drey_crc32c(0, t, 20);
            for (int i = 0; i < 4; i++)
                t[20 + i] = (uint8_t)(crc >> (8 * i));
        }
        write_variant(path, v, file_len);
        drey_store *s = drey_store_create();
        drey_snapshot_info info;
        cr_assert_eq(drey_snapshot_load(io, path, s, &info, err, sizeof err), -EINVAL, "crc fixed: %d", fix_crc);
        drey_store_destroy(s);
    }
    free(v);
    free(file);
}

/* --- tenants (version 2) ------------------------------------------------------ */

/* A tiny accountant: two names, bytes per tenant. */
static const char *const tenant_names[] = {"", "acme", "globex"};
static int64_t tenant_bytes[3];

static void t_account(void *ctx, uint32_t tenant, const char *cache, size_t cache_len, const char *key,
                      size_t key_len, int64_t delta) {
    (void)ctx, (void)cache, (void)cache_len, (void)key, (void)key_len;
    cr_assert_lt(tenant, 3u);
    tenant_bytes[tenant] += delta;
}

static uint32_t t_intern(void *ctx, const char *name, size_t len) {
    (void)ctx;
    for (uint32_t i = 0; i < 3; i++)
        if (strlen(tenant_names[i]) == len && memcmp(tenant_names[i], name, len) == 0)
            return i;
    cr_assert_fail("unknown tenant %.*s", (int)len, name);
    return 0;
}

static const char *t_name(void *ctx, uint32_t tenant, size_t *len) {
    (void)ctx;
    *len = strlen(tenant_names[tenant]);
    return tenant_names[tenant];
}

static const drey_store_tenants tenant_table = {.account = t_account, .intern = t_intern, .name = t_name};

static void put_tenant(drey_store *s, const char *key, const char *value, uint32_t tenant) {
    drey_key k;
    drey_store_key(s, &k, "c", 1, key, strlen(key));
    drey_value v = {.kind = DREY_VALUE_BYTES, .data = (const uint8_t *)value, .len = (uint32_t)strlen(value)};
    drey_store_txn t;
    drey_store_txn_begin(s, &t, &k, 1);
    t.tenant = tenant;
    drey_store_txn_put(&t, &k, &v, 0, 0);
    drey_store_txn_end(&t);
}

static uint32_t version_of(const char *path) {
    int fd = io->ops->open(io, path, O_RDONLY, 0);
    cr_assert_geq(fd, 0);
    uint8_t h[12];
    cr_assert_eq(io->ops->pread(io, fd, h, sizeof h, 0), (ssize_t)sizeof h);
    io->ops->close(io, fd);
    return (uint32_t)h[8] | (uint32_t)h[9] << 8 | (uint32_t)h[10] << 16 | (uint32_t)h[11] << 24;
}

Test(snapshot, entries_keep_their_tenants_and_a_file_without_tenants_stays_version_1) {
    memset(tenant_bytes, 0, sizeof tenant_bytes);
    drey_store_set_tenants(st, &tenant_table);
    char name[64], path[256], err[512];
    drey_snapshot_info info;

    put_tenant(st, "plain", "v0", 0);
    cr_assert_eq(take(st, 1, 5, name, &info), 0);
    path_of(path, sizeof path, name);
    cr_assert_eq(version_of(path), 1u, "no tenant: what version 1 wrote");

    put_tenant(st, "a1", "value-of-acme", 1);
    put_tenant(st, "a2", "more", 1);
    put_tenant(st, "g1", "value-of-globex", 2);
    int64_t acme = tenant_bytes[1], globex = tenant_bytes[2];
    cr_assert_gt(acme, 0);
    cr_assert_gt(globex, 0);
    cr_assert_eq(take(st, 2, 6, name, &info), 0);
    path_of(path, sizeof path, name);
    cr_assert_eq(version_of(path), 2u);

    /* Loaded into a new store, every entry is its tenant's again, and the
     * accountant hears the same bytes. */
    memset(tenant_bytes, 0, sizeof tenant_bytes);
    drey_store *again = drey_store_create();
    drey_store_set_tenants(again, &tenant_table);
    cr_assert_eq(drey_snapshot_load(io, path, again, &info, err, sizeof err), 0, "%s", err);
    cr_assert_eq(info.entries, 4);
    cr_assert_eq(tenant_bytes[1], acme);
    cr_assert_eq(tenant_bytes[2], globex);
    const char *keys[] = {"plain", "a1", "a2", "g1"};
    const uint32_t want[] = {0, 1, 1, 2};
    for (size_t i = 0; i < 4; i++) {
        drey_key k;
        drey_store_key(again, &k, "c", 1, keys[i], strlen(keys[i]));
        uint32_t tenant = 99;
        cr_assert_gt(drey_store_entry_size_tenant(again, &k, 6, &tenant), 0, "%s", keys[i]);
        cr_assert_eq(tenant, want[i], "%s", keys[i]);
    }
    /* Replacing an entry under another tenant moves its bytes. */
    put_tenant(again, "a1", "now-globex", 2);
    cr_assert_lt(tenant_bytes[1], acme);
    cr_assert_gt(tenant_bytes[2], globex);
    drey_store_destroy(again);
}
