/*
 * storage — recovery, snapshots and compaction; see include/drey/storage.h.
 *
 * The manifest (CURRENT) is "DREYMAN\0", u32 length, u32 CRC-32C of the
 * payload, then a drey.journal.v1.Manifest. It is replaced atomically
 * (temporary file, fdatasync, rename, directory sync) only after the snapshot
 * it names is durable, so a crash at any point leaves a manifest naming a
 * complete snapshot and a journal that continues it.
 *
 * SEED is "DREYSEED", the store's 16-byte hash seed, u32 CRC-32C of the
 * seed: written once when the directory is new, read back at every start.
 * The same keys then land in the same shards and buckets after a restart,
 * so a scan cursor issued before it goes on after it; the seed stays a
 * secret of the directory (hash flooding needs it).
 */
#include "drey/storage.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/bytes.h"
#include "drey/crc32c.h"
#include "drey/journal/v1/journal.pb-c.h"
#include "drey/log.h"
#include "drey/thread.h"
#include "storage_internal.h"

typedef struct waiter {
    struct waiter *next;
    void (*done)(void *arg, const drey_snapshot_result *r);
    void *arg;
} waiter;

struct drey_storage {
    drey_storage_options opts;
    char *dir;
    drey_io *io;
    drey_store *store;
    drey_journal *journal;
    int lock_fd; /* <dir>/LOCK, held for the node's life; -1 without one */

    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool stopping;
    waiter *waiters;            /* requested snapshots */
    drey_snapshot *begun;       /* handed over by the writer thread */
    bool begin_done;
    uint64_t bytes_at_snapshot; /* journal bytes_written at the last snapshot */
    uint64_t appends_at_snapshot;
    int64_t last_snapshot_mono;
    bool last_snapshot_failed;
    uint64_t last_snapshot_bytes; /* size of the newest snapshot file */
    /* The disk watch's own (the opening thread, then the snapshot thread). */
    int64_t last_watch_mono;
    uint64_t logged_cap;          /* the derived cap last logged; 0: none yet */
    drey_storage_snapshot_room logged_room;
    bool fs_space_failed_logged;
    drey_storage_stats stats;
};

/* --- hash seed ------------------------------------------------------------ */

#define SEED_MAGIC "DREYSEED"
#define SEED_FILE_BYTES (8 + 16 + 4)

static void put_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static int load_seed(drey_storage *st, char *err, size_t cap) {
    char path[4096];
    snprintf(path, sizeof path, "%s/SEED", st->dir);
    uint8_t *buf;
    size_t n;
    int rc = drey_io_read_file(st->io, path, &buf, &n);
    if (rc == -ENOENT) {
        uint8_t out[SEED_FILE_BYTES];
        memcpy(out, SEED_MAGIC, 8);
        drey_store_get_seed(st->store, out + 8);
        put_le32(out + 24, drey_crc32c(0, out + 8, 16));
        rc = drey_io_write_file_atomic(st->io, st->dir, "SEED", out, sizeof out);
        if (rc != 0)
            snprintf(err, cap, "cannot write %s: %s", path, strerror(-rc));
        return rc;
    }
    if (rc != 0) {
        snprintf(err, cap, "cannot read %s: %s", path, strerror(-rc));
        return rc;
    }
    rc = -EINVAL;
    if (n == SEED_FILE_BYTES && memcmp(buf, SEED_MAGIC, 8) == 0) {
        uint8_t crc[4];
        put_le32(crc, drey_crc32c(0, buf + 8, 16));
        if (memcmp(crc, buf + 24, 4) == 0) {
            drey_store_set_seed(st->store, buf + 8);
            rc = 0;
        }
    }
    if (rc != 0)
        snprintf(err, cap, "%s is damaged (it holds the hash seed; deleting it only invalidates scan cursors)", path);
    free(buf);
    return rc;
}

/* --- manifest ------------------------------------------------------------- */

#define MANIFEST_MAGIC "DREYMAN"

int drey_storage__read_manifest(drey_io *io, const char *dir, char *snapshot, size_t cap, uint64_t *lsn) {
    char path[4096];
    snprintf(path, sizeof path, "%s/CURRENT", dir);
    uint8_t *buf;
    size_t n;
    int rc = drey_io_read_file(io, path, &buf, &n);
    if (rc != 0)
        return rc;
    rc = -EINVAL;
    if (n >= 16 && memcmp(buf, MANIFEST_MAGIC, 8) == 0) {
        uint32_t len = drey_bytes_get32(buf + 8), crc = drey_bytes_get32(buf + 12);
        if (len == n - 16 && crc == drey_crc32c(0, buf + 16, len)) {
            Drey__Journal__V1__Manifest *m = drey__journal__v1__manifest__unpack(NULL, len, buf + 16);
            if (m != NULL) {
                snprintf(snapshot, cap, "%s", m->snapshot);
                *lsn = m->snapshot_lsn;
                drey__journal__v1__manifest__free_unpacked(m, NULL);
                rc = 0;
            }
        }
    }
    free(buf);
    return rc;
}

static int write_manifest(drey_io *io, const char *dir, const char *snapshot, uint64_t lsn, char **retained,
                          size_t n_retained) {
    Drey__Journal__V1__Manifest m = DREY__JOURNAL__V1__MANIFEST__INIT;
    m.snapshot = (char *)snapshot;
    m.snapshot_lsn = lsn;
    m.retained_snapshots = retained;
    m.n_retained_snapshots = n_retained;
    size_t len = protobuf_c_message_get_packed_size(&m.base);
    uint8_t *buf = drey_xmalloc(16 + len);
    memcpy(buf, MANIFEST_MAGIC, 8);
    protobuf_c_message_pack(&m.base, buf + 16);
    uint32_t crc = drey_crc32c(0, buf + 16, len);
    drey_bytes_put32(buf + 8, (uint32_t)len);
    drey_bytes_put32(buf + 12, crc);
    int rc = drey_io_write_file_atomic(io, dir, "CURRENT", buf, 16 + len);
    free(buf);
    return rc;
}

/* Snapshot files, newest (highest LSN) first. */
size_t drey_storage__list_snapshots(drey_io *io, const char *dir, char ***names) {
    char path[4096];
    snprintf(path, sizeof path, "%s/snapshots", dir);
    char **all;
    size_t n;
    *names = NULL;
    if (io->ops->list_dir(io, path, &all, &n) != 0)
        return 0;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t lsn;
        if (drey_snapshot_parse_name(all[i], &lsn))
            all[k++] = all[i];
        else
            free(all[i]);
    }
    /* Names sort by LSN (fixed-width hex): reverse for newest first. */
    for (size_t i = 0; i < k / 2; i++) {
        char *t = all[i];
        all[i] = all[k - 1 - i];
        all[k - 1 - i] = t;
    }
    *names = all;
    return k;
}

/* --- recovery ------------------------------------------------------------- */

typedef struct replay_ctx {
    drey_commit *commit;
    uint64_t records;
    int64_t last_log_ms;
} replay_ctx;

static int replay_one(void *arg, const drey_journal_record *rec) {
    replay_ctx *r = arg;
    int rc = drey_commit_replay(r->commit, rec);
    if (rc != 0) {
        DREY_LOG_ERROR("recovery: a journal record cannot be applied", DREY_LOG_UINT("lsn", rec->lsn));
        return rc;
    }
    r->records++;
    int64_t now = drey_mono_ms();
    if (now - r->last_log_ms >= 1000) {
        r->last_log_ms = now;
        DREY_LOG_INFO("recovery: replaying the journal", DREY_LOG_UINT("records", r->records),
                      DREY_LOG_UINT("lsn", rec->lsn));
    }
    return 0;
}

/* Loads the newest usable snapshot: the manifest's, else older ones. When
 * it had to fall back, `fallback` says why (for the error if the journal
 * then does not continue the older snapshot). */
static int load_snapshot(drey_storage *st, uint64_t *lsn, char *err, size_t cap, char *fallback, size_t fcap) {
    char named[256] = "";
    uint64_t named_lsn = 0;
    int rc = drey_storage__read_manifest(st->io, st->dir, named, sizeof named, &named_lsn);
    if (rc == -ENOENT) {
        *lsn = 0;
        return 0; /* a new data directory */
    }
    if (rc != 0) {
        snprintf(err, cap, "%s/CURRENT is damaged; `dreyd storage inspect %s` shows what is there", st->dir,
                 st->dir);
        return -EINVAL;
    }
    if (named[0] == '\0') {
        *lsn = 0;
        return 0;
    }
    char **names;
    size_t n = drey_storage__list_snapshots(st->io, st->dir, &names);
    /* The named one first, then the others newest first. */
    rc = -ENOENT;
    char why[512] = "", named_why[512] = "";
    for (size_t pass = 0; pass < 2 && rc != 0; pass++) {
        for (size_t i = 0; i < n && rc != 0; i++) {
            char rel[300];
            snprintf(rel, sizeof rel, "snapshots/%s", names[i]);
            bool is_named = strcmp(rel, named) == 0;
            if (is_named != (pass == 0))
                continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", st->dir, rel);
            drey_snapshot_info info;
            char e[512];
            int64_t t0 = drey_mono_ms();
            rc = drey_snapshot_load(st->io, path, st->store, &info, e, sizeof e);
            if (rc != 0) {
                DREY_LOG_WARN("recovery: snapshot unusable", DREY_LOG_STR("file", rel), DREY_LOG_STR("error", e));
                snprintf(why, sizeof why, "%s", e);
                if (is_named)
                    snprintf(named_why, sizeof named_why, "%s", e);
                drey_store_clear(st->store);
                continue;
            }
            *lsn = info.lsn;
            if (!is_named && snprintf(fallback, fcap, "%s/CURRENT names %s, which is unusable (%s); %s was loaded instead",
                                      st->dir, named, named_why[0] ? named_why : "missing", rel) < 0)
                fallback[0] = '\0';
            st->stats.recovered_snapshot_entries = info.entries;
            st->stats.snapshot_lsn = info.lsn;
            st->stats.snapshot_time_ms = info.time_ms;
            DREY_LOG_INFO("recovery: snapshot loaded", DREY_LOG_STR("file", rel), DREY_LOG_UINT("lsn", info.lsn),
                          DREY_LOG_UINT("entries", info.entries), DREY_LOG_INT("ms", drey_mono_ms() - t0));
        }
    }
    drey_io_free_names(names, n);
    if (rc != 0)
        snprintf(err, cap, "no usable snapshot in %s/snapshots (the manifest names %s): %s", st->dir, named,
                 why[0] ? why : "missing");
    return rc;
}

/* --- the disk watch: derived cap, room for snapshots ----------------------- */

/* A snapshot file's header and trailer. */
#define SNAPSHOT_FRAMING 96u

/* Sizes of the snapshot files kept (all, and the newest), from the files. */
static void measure_snapshots(drey_storage *st) {
    char **names;
    size_t n = drey_storage__list_snapshots(st->io, st->dir, &names);
    uint64_t total = 0, newest = 0;
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/snapshots/%s", st->dir, names[i]);
        int fd = st->io->ops->open(st->io, path, O_RDONLY, 0);
        if (fd < 0)
            continue;
        off_t size = 0;
        if (st->io->ops->fsize(st->io, fd, &size) == 0) {
            total += (uint64_t)size;
            if (i == 0)
                newest = (uint64_t)size;
        }
        st->io->ops->close(st->io, fd);
    }
    drey_io_free_names(names, n);
    pthread_mutex_lock(&st->mu);
    st->stats.snapshot_files_bytes = total;
    st->last_snapshot_bytes = newest;
    pthread_mutex_unlock(&st->mu);
}

static void log_cap(const char *msg, uint64_t cap, const drey_storage__disk *d) {
    DREY_LOG_INFO(msg, DREY_LOG_UINT("max_bytes", cap), DREY_LOG_UINT("fs_bytes", d->fs_bytes),
                  DREY_LOG_UINT("fs_avail_bytes", d->avail_bytes), DREY_LOG_UINT("journal_bytes", d->journal_bytes),
                  DREY_LOG_UINT("snapshot_estimate_bytes", d->snapshot_bytes),
                  DREY_LOG_UINT("reserve_bytes", drey_storage__reserve_bytes(d->fs_bytes)));
}

/* Looks at the data directory's file system: re-derives the journal's cap
 * when it is derived and tells whether the next snapshot fits. Runs every
 * second on the snapshot thread (and at open, and after each snapshot), not
 * on the write path: each derivation already leaves room for the snapshot to
 * grow with the journal up to the cap (diskcap.c), so the timer is only
 * there for what the node cannot see -- the volume grown or shrunk, other
 * writers -- and it sees that even while writes are refused and no segment
 * is being created. Not under st->mu. */
static void watch_disk(drey_storage *st) {
    st->last_watch_mono = drey_mono_ms();
    drey_io *io = st->io;
    if (io->ops->fs_space == NULL)
        return; /* an io that cannot tell: no derived cap, room unknown */
    /* The journal's figures first: a segment created between the two looks
     * then lowers the cap instead of counting twice. */
    drey_journal_stats js;
    drey_journal_get_stats(st->journal, &js);
    uint64_t total, avail;
    int rc = io->ops->fs_space(io, st->dir, &total, &avail);
    if (rc != 0) {
        /* Once per failure spell: the cap stays as last derived (none if
         * it never was), the room becomes unknown. */
        if (!st->fs_space_failed_logged && st->opts.derive_journal_cap)
            DREY_LOG_WARN("cannot read the data directory's file system space; the journal cap is not re-derived",
                          DREY_LOG_STR("dir", st->dir), DREY_LOG_STR("error", strerror(-rc)),
                          DREY_LOG_UINT("journal_max_bytes", js.quota_max_bytes));
        st->fs_space_failed_logged = true;
        st->logged_room = DREY_STORAGE_SNAPSHOT_UNKNOWN;
        pthread_mutex_lock(&st->mu);
        st->stats.snapshot_room = DREY_STORAGE_SNAPSHOT_UNKNOWN;
        pthread_mutex_unlock(&st->mu);
        return;
    }
    if (st->fs_space_failed_logged && st->opts.derive_journal_cap)
        DREY_LOG_INFO("the data directory's file system space can be read again", DREY_LOG_STR("dir", st->dir));
    st->fs_space_failed_logged = false;
    pthread_mutex_lock(&st->mu);
    uint64_t est = st->last_snapshot_bytes;
    pthread_mutex_unlock(&st->mu);
    int64_t store_bytes = drey_store_bytes(st->store);
    uint64_t from_store = (store_bytes > 0 ? (uint64_t)store_bytes : 0) + SNAPSHOT_FRAMING;
    if (from_store > est)
        est = from_store;
    drey_storage__disk d = {.fs_bytes = total, .avail_bytes = avail, .journal_bytes = js.disk_bytes,
                            .snapshot_bytes = est};
    uint64_t cap = js.quota_max_bytes;
    if (st->opts.derive_journal_cap) {
        cap = drey_storage__derive_cap(&d);
        drey_journal_set_max_bytes(st->journal, cap);
        /* Logged at start and when it moves by a sixteenth: it follows the
         * store's size, which changes with every write. */
        uint64_t diff = cap > st->logged_cap ? cap - st->logged_cap : st->logged_cap - cap;
        if (st->logged_cap == 0 || diff >= st->logged_cap / 16) {
            log_cap(st->logged_cap == 0 ? "journal disk cap derived from the file system"
                                        : "journal disk cap re-derived",
                    cap, &d);
            st->logged_cap = cap;
        }
    }
    drey_storage_snapshot_room room = drey_storage__snapshot_fits(&d, cap);
    bool was_tight = st->logged_room == DREY_STORAGE_SNAPSHOT_LOW || st->logged_room == DREY_STORAGE_SNAPSHOT_SHORT;
    if (room != st->logged_room && (room != DREY_STORAGE_SNAPSHOT_OK || was_tight)) {
        if (room == DREY_STORAGE_SNAPSHOT_OK)
            DREY_LOG_INFO("the next snapshot fits on the data directory's file system again",
                          DREY_LOG_UINT("snapshot_estimate_bytes", est), DREY_LOG_UINT("fs_avail_bytes", avail));
        else
            DREY_LOG_WARN(room == DREY_STORAGE_SNAPSHOT_SHORT
                              ? "the next snapshot does not fit on the data directory's file system: compaction "
                                "cannot free the journal; free space or grow the volume"
                              : "the next snapshot may not fit once the journal grows: free space, grow the volume "
                                "or take a snapshot now",
                          DREY_LOG_STR("snapshot_room", drey_storage_snapshot_room_name(room)),
                          DREY_LOG_UINT("snapshot_estimate_bytes", est), DREY_LOG_UINT("fs_avail_bytes", avail),
                          DREY_LOG_UINT("journal_bytes", js.disk_bytes), DREY_LOG_UINT("journal_max_bytes", cap));
    }
    st->logged_room = room;
    pthread_mutex_lock(&st->mu);
    st->stats.fs_bytes = total;
    st->stats.fs_avail_bytes = avail;
    st->stats.reserve_bytes = drey_storage__reserve_bytes(total);
    st->stats.snapshot_estimate_bytes = est;
    st->stats.snapshot_room = room;
    pthread_mutex_unlock(&st->mu);
}

/* --- snapshots ------------------------------------------------------------ */

static void begin_on_writer(void *arg, uint64_t lsn, int64_t time_ms) {
    drey_storage *st = arg;
    drey_snapshot *snap = drey_snapshot_begin(st->store, lsn, time_ms);
    pthread_mutex_lock(&st->mu);
    st->begun = snap;
    st->begin_done = true;
    pthread_cond_broadcast(&st->cond);
    pthread_mutex_unlock(&st->mu);
}

/* Deletes the snapshots beyond the newest `keep` of names (newest first).
 * Only once CURRENT names the newest: until then it may name one of them. */
static void apply_retention(drey_storage *st, char **names, size_t n, size_t keep) {
    for (size_t i = keep; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/snapshots/%s", st->dir, names[i]);
        st->io->ops->unlink(st->io, path);
    }
}

static void take_snapshot(drey_storage *st, drey_snapshot_result *r) {
    memset(r, 0, sizeof *r);
    int64_t t0 = drey_mono_ms();
    drey_journal_stats js;
    drey_journal_get_stats(st->journal, &js);

    pthread_mutex_lock(&st->mu);
    st->begin_done = false;
    st->stats.snapshot_in_flight = true;
    pthread_mutex_unlock(&st->mu);
    drey_journal_on_writer(st->journal, begin_on_writer, st);
    pthread_mutex_lock(&st->mu);
    while (!st->begin_done)
        pthread_cond_wait(&st->cond, &st->mu);
    drey_snapshot *snap = st->begun;
    st->begun = NULL;
    pthread_mutex_unlock(&st->mu);

    char name[64];
    r->rc = drey_snapshot_finish(snap, st->io, st->dir, name, sizeof name, &r->info);
    if (r->rc == 0) {
        snprintf(r->file, sizeof r->file, "snapshots/%s", name);
        char **names;
        size_t n = drey_storage__list_snapshots(st->io, st->dir, &names);
        size_t n_kept = n < st->opts.retain_snapshots ? n : st->opts.retain_snapshots;
        char **kept = drey_xmalloc((n_kept ? n_kept : 1) * sizeof *kept);
        for (size_t i = 0; i < n_kept; i++) {
            kept[i] = drey_xmalloc(strlen(names[i]) + 12);
            sprintf(kept[i], "snapshots/%s", names[i]);
        }
        r->rc = write_manifest(st->io, st->dir, r->file, r->info.lsn, kept, n_kept);
        if (r->rc == 0)
            apply_retention(st, names, n, n_kept);
        drey_io_free_names(kept, n_kept);
        drey_io_free_names(names, n);
    }
    int compaction_rc = 0;
    if (r->rc == 0)
        compaction_rc = drey_journal_remove_through(st->journal, r->info.lsn, &r->segments_removed);
    r->duration_ms = drey_mono_ms() - t0;

    pthread_mutex_lock(&st->mu);
    st->stats.snapshot_in_flight = false;
    st->stats.last_snapshot_duration_ms = r->duration_ms;
    if (r->rc == 0) {
        st->stats.snapshots_taken++;
        st->stats.snapshot_lsn = r->info.lsn;
        st->stats.snapshot_time_ms = drey_wall_ms();
        st->stats.last_compaction_ms = drey_wall_ms();
        st->stats.segments_removed += r->segments_removed;
        st->stats.compaction_failed = compaction_rc != 0;
        st->bytes_at_snapshot = js.bytes_written;
        st->appends_at_snapshot = js.appends;
    } else {
        st->stats.snapshots_failed++;
    }
    st->last_snapshot_mono = drey_mono_ms();
    st->last_snapshot_failed = r->rc != 0;
    pthread_mutex_unlock(&st->mu);

    /* The new snapshot's size and the space compaction freed move the cap. */
    if (r->rc == 0)
        measure_snapshots(st);
    watch_disk(st);
    if (r->rc == 0)
        DREY_LOG_INFO("snapshot written", DREY_LOG_STR("file", r->file), DREY_LOG_UINT("lsn", r->info.lsn),
                      DREY_LOG_UINT("entries", r->info.entries), DREY_LOG_UINT("bytes", r->info.bytes),
                      DREY_LOG_INT("ms", r->duration_ms), DREY_LOG_UINT("segments_removed", r->segments_removed));
    else
        DREY_LOG_ERROR("snapshot failed", DREY_LOG_STR("error", strerror(-r->rc)));
    if (compaction_rc != 0)
        DREY_LOG_ERROR("compaction failed", DREY_LOG_STR("error", strerror(-compaction_rc)));
}

#define QUOTA_RETRY_MS 10000

/* Whether the size, quota or time trigger has fired. Needs st->mu. */
static bool snapshot_due(drey_storage *st) {
    drey_journal_stats js;
    drey_journal_get_stats(st->journal, &js);
    if (st->opts.snapshot_every_bytes > 0 && js.bytes_written - st->bytes_at_snapshot >= st->opts.snapshot_every_bytes)
        return true;
    /* A journal past its quota's high-water mark, with segments before the
     * one being written that a compaction would delete: snapshot now rather
     * than refuse writes at the cap. A size trigger like the one above, off
     * with it; after a failed snapshot it waits, so a full disk is not
     * retried every second. */
    if (st->opts.snapshot_every_bytes > 0 && js.quota_state != DREY_LEVEL_NORMAL && js.segments > 1 &&
        js.appends > st->appends_at_snapshot &&
        (!st->last_snapshot_failed || drey_mono_ms() - st->last_snapshot_mono >= QUOTA_RETRY_MS))
        return true;
    return st->opts.snapshot_every_ms > 0 && js.appends > st->appends_at_snapshot &&
           drey_mono_ms() - st->last_snapshot_mono >= st->opts.snapshot_every_ms;
}

static void *snapshot_main(void *arg) {
    drey_storage *st = arg;
    pthread_mutex_lock(&st->mu);
    while (!st->stopping) {
        if (drey_mono_ms() - st->last_watch_mono >= 1000) {
            pthread_mutex_unlock(&st->mu);
            watch_disk(st);
            pthread_mutex_lock(&st->mu);
            continue;
        }
        if (st->waiters == NULL && !snapshot_due(st)) {
            /* Triggers are checked once a second: they are coarse by nature.
             * With a cap, ten times a second (a lock and a copy of the
             * journal's figures): the last fifth of the cap may fill in well
             * under a second, and every write after it is refused until the
             * compaction the quota trigger starts. */
            drey_journal_stats js;
            drey_journal_get_stats(st->journal, &js);
            int64_t wait_ms = js.quota_max_bytes > 0 ? 100 : 1000;
            drey_cond_wait_until(&st->cond, &st->mu, drey_deadline_after_ms(wait_ms));
            continue;
        }
        waiter *w = st->waiters;
        st->waiters = NULL;
        pthread_mutex_unlock(&st->mu);
        drey_snapshot_result r;
        take_snapshot(st, &r);
        while (w != NULL) {
            waiter *next = w->next;
            w->done(w->arg, &r);
            free(w);
            w = next;
        }
        pthread_mutex_lock(&st->mu);
    }
    /* Requests that arrive during shutdown are answered, not dropped. */
    waiter *w = st->waiters;
    st->waiters = NULL;
    pthread_mutex_unlock(&st->mu);
    drey_snapshot_result r = {.rc = -ECANCELED};
    while (w != NULL) {
        waiter *next = w->next;
        w->done(w->arg, &r);
        free(w);
        w = next;
    }
    return NULL;
}

void drey_storage_request_snapshot(drey_storage *st, void (*done)(void *arg, const drey_snapshot_result *r),
                                   void *arg) {
    waiter *w = drey_xmalloc(sizeof *w);
    w->done = done;
    w->arg = arg;
    pthread_mutex_lock(&st->mu);
    w->next = st->waiters;
    st->waiters = w;
    pthread_cond_broadcast(&st->cond);
    pthread_mutex_unlock(&st->mu);
}

/* --- lifecycle ------------------------------------------------------------ */

/* Temporary files a crash left mid-snapshot or mid-manifest: never named by
 * CURRENT, never counted by retention, so nothing else would delete them. */
static void remove_leftovers(drey_storage *st) {
    char path[4096];
    snprintf(path, sizeof path, "%s/CURRENT.tmp", st->dir);
    st->io->ops->unlink(st->io, path);
    snprintf(path, sizeof path, "%s/snapshots", st->dir);
    char **names;
    size_t n;
    if (st->io->ops->list_dir(st->io, path, &names, &n) != 0)
        return;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(names[i]);
        if (len > 4 && strcmp(names[i] + len - 4, ".tmp") == 0) {
            snprintf(path, sizeof path, "%s/snapshots/%s", st->dir, names[i]);
            st->io->ops->unlink(st->io, path);
        }
    }
    drey_io_free_names(names, n);
}

/* What open acquires before it can fail and close releases last: the data
 * directory's lock, the strings and the synchronisation. */
static void free_storage(drey_storage *st) {
    if (st->lock_fd >= 0)
        st->io->ops->close(st->io, st->lock_fd);
    free(st->dir);
    pthread_mutex_destroy(&st->mu);
    pthread_cond_destroy(&st->cond);
    free(st);
}

int drey_storage_open(const drey_storage_options *opts, drey_store *store, drey_commit *commit, drey_storage **out,
                      char *err, size_t err_cap) {
    drey_storage *st = drey_xcalloc(1, sizeof *st);
    st->opts = *opts;
    st->dir = drey_xstrdup(opts->journal.dir);
    st->io = opts->journal.io;
    st->store = store;
    if (st->opts.retain_snapshots == 0)
        st->opts.retain_snapshots = 1;
    pthread_mutex_init(&st->mu, NULL);
    pthread_cond_init(&st->cond, NULL);

    st->lock_fd = -1;
    int64_t t0 = drey_mono_ms();
    int rc = st->io->ops->mkdir(st->io, st->dir);
    if (rc != 0) {
        snprintf(err, err_cap, "cannot create the data directory %s: %s", st->dir, strerror(-rc));
        goto fail;
    }
    if (st->io->ops->lock != NULL) {
        char path[4096];
        snprintf(path, sizeof path, "%s/LOCK", st->dir);
        rc = st->io->ops->lock(st->io, path);
        if (rc < 0) {
            snprintf(err, err_cap, "%s: %s", path,
                     rc == -EWOULDBLOCK ? "the data directory is in use by another dreyd" : strerror(-rc));
            goto fail;
        }
        st->lock_fd = rc;
    }
    remove_leftovers(st);
    rc = load_seed(st, err, err_cap);
    if (rc != 0)
        goto fail;
    DREY_LOG_INFO("recovery: starting", DREY_LOG_STR("dir", st->dir));
    uint64_t snapshot_lsn = 0;
    char fallback[1024] = "";
    rc = load_snapshot(st, &snapshot_lsn, err, err_cap, fallback, sizeof fallback);
    if (rc != 0)
        goto fail;
    replay_ctx rctx = {.commit = commit, .last_log_ms = drey_mono_ms()};
    drey_journal_options jo = opts->journal;
    jo.dir = st->dir;
    if (opts->derive_journal_cap)
        jo.max_bytes = 0; /* until the disk watch below derives it, before any append */
    rc = drey_journal_open(&jo, snapshot_lsn, replay_one, &rctx, &st->journal, err, err_cap);
    if (rc != 0) {
        if (fallback[0] != '\0') {
            /* The journal's own advice (repair) would cut what the damaged
             * snapshot is needed for: say what really happened first. */
            char jerr[1024];
            snprintf(jerr, sizeof jerr, "%s", err);
            snprintf(err, err_cap, "%s, but the journal does not continue it: %s", fallback, jerr);
        }
        goto fail;
    }
    drey_journal_stats js;
    drey_journal_get_stats(st->journal, &js);
    st->stats.replayed_records = rctx.records;
    st->stats.recovery_ms = drey_mono_ms() - t0;
    st->last_snapshot_mono = drey_mono_ms();
    st->stats.journal_cap_derived = opts->derive_journal_cap;
    measure_snapshots(st);
    watch_disk(st);
    DREY_LOG_INFO("recovery: done", DREY_LOG_UINT("snapshot_lsn", snapshot_lsn),
                  DREY_LOG_UINT("replayed_records", rctx.records), DREY_LOG_UINT("last_lsn", js.last_lsn),
                  DREY_LOG_UINT("torn_tails_cut", js.torn_tails_cut), DREY_LOG_INT("ms", st->stats.recovery_ms));
    drey_thread_start(&st->thread, "snapshotter", snapshot_main, st);
    *out = st;
    return 0;
fail:
    free_storage(st);
    return rc;
}

void drey_storage_close(drey_storage *st) {
    if (st == NULL)
        return;
    drey_thread_stop(st->thread, &st->mu, &st->cond, &st->stopping);
    drey_journal_close(st->journal);
    free_storage(st);
}

drey_journal *drey_storage_journal(drey_storage *st) {
    return st->journal;
}

void drey_storage_get_stats(drey_storage *st, drey_storage_stats *out) {
    pthread_mutex_lock(&st->mu);
    *out = st->stats;
    pthread_mutex_unlock(&st->mu);
}
