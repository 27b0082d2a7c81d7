/*
 * journal — the live journal and its writer thread; see
 * include/drey/journal.h.
 *
 * The writer loop: take every queued record (up to the batch bound), stamp
 * LSNs and one time, encode the frames into one buffer, make room (a new
 * segment if the batch does not fit), pwrite, fdatasync, then complete the
 * records in LSN order. The mutex guards only the queue, the clock and the
 * segment list; no lock is held across a write, a sync or an unlink, so
 * appenders and readers never wait on the disk.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/journal.h"
#include "drey/log.h"
#include "drey/thread.h"
#include "frame.h"
#include "journal_internal.h"

typedef struct segment {
    char name[32];
    uint64_t first_lsn;
    uint64_t size;
} segment;

typedef struct task {
    struct task *next;
    void (*fn)(void *arg, uint64_t lsn, int64_t time_ms);
    void *arg;
} task;

struct drey_journal {
    drey_journal_options opts;
    char *dir;
    drey_io *io;

    pthread_t thread;
    pthread_mutex_t compact_mu; /* held through drey_journal_remove_through */
    pthread_mutex_t mu;
    pthread_cond_t cond;
    /* Guarded by mu. */
    drey_journal_entry *q_head, *q_tail;
    task *tasks;
    bool stopping;
    segment *segs;
    size_t n_segs, cap_segs;
    int64_t clock_floor;   /* no record is stamped earlier than this */
    bool batch_pending;    /* a stamped batch is not yet applied */
    int64_t pending_time;
    drey_journal_stats stats;
    /* The disk quota's plan: where queued records will land. Appends reserve
     * in queue order by the writer's own placement rule, so a record is
     * refused exactly when writing it would grow the segments past the cap.
     * The plan is re-based on the real figures whenever the queue drains. */
    uint64_t plan_used; /* segment bytes once every queued record is written */
    uint64_t plan_free; /* room left in the segment the next record goes to */
    uint64_t plan_seg;  /* that segment's size */
    bool plan_empty;    /* it holds no record (the writer grows it, see rotate) */
    uint64_t refused_need; /* frame size of the last refused append; 0: none */
    void (*observer)(void *ctx, size_t records, int64_t fsync_us);
    void *observer_ctx;
    void (*done_begin)(void), (*done_end)(void);

    /* The writer thread's own. */
    int fd;
    uint64_t off, seg_size;
    uint64_t next_lsn;
    int64_t last_time;
    uint8_t *buf;
    size_t buf_cap;
    int64_t last_sync_ms; /* monotonic, for the interval policy */
    bool dirty;           /* written since the last sync */
    uint64_t epoch_lsn;   /* first LSN written since the last sync; 0: none */
};

static void add_segment(drey_journal *j, const char *name, uint64_t first_lsn, uint64_t size) {
    if (j->n_segs == j->cap_segs) {
        j->cap_segs = j->cap_segs ? j->cap_segs * 2 : 8;
        j->segs = drey_xrealloc(j->segs, j->cap_segs, sizeof *j->segs);
    }
    segment *s = &j->segs[j->n_segs++];
    snprintf(s->name, sizeof s->name, "%s", name);
    s->first_lsn = first_lsn;
    s->size = size;
    j->stats.segments = j->n_segs;
    j->stats.disk_bytes += size;
}

static void mark_failed(drey_journal *j, int err, const char *what);
static int64_t sync_now(drey_journal *j, int *rc);

/* The size of a new segment for a first frame of `need` bytes. */
static uint64_t new_segment_size(const drey_journal *j, uint64_t need) {
    uint64_t size = j->opts.segment_bytes;
    if (size < DREY_SEGMENT_HEADER + need)
        size = (DREY_SEGMENT_HEADER + need + 4095) & ~(uint64_t)4095;
    return size;
}

/* Re-bases the quota plan on the real segments. Needs j->mu; only when no
 * record is queued or being written. */
static void plan_from_actual(drey_journal *j) {
    j->plan_used = j->stats.disk_bytes;
    j->plan_free = j->seg_size > j->off ? j->seg_size - j->off : 0;
    j->plan_seg = j->seg_size;
    j->plan_empty = j->off == DREY_SEGMENT_HEADER;
}

/* Creates and switches to a new segment starting at next_lsn, large enough
 * for `need` bytes of frames. On failure nothing changes. */
static int rotate(drey_journal *j, uint64_t need) {
    char name[32], path[4096], tmp[4096 + 8];
    snprintf(name, sizeof name, "%016" PRIx64 ".seg", j->next_lsn);
    drey_journal__path(path, sizeof path, j->dir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    uint64_t size = new_segment_size(j, need);

    drey_io *io = j->io;
    if (j->fd >= 0 && j->off == DREY_SEGMENT_HEADER) {
        /* The current segment holds no record (a record larger than a
         * segment right after open or a switch): a new segment would have
         * its very name. Grow this one instead. The header keeps the size it
         * was created with; nothing reads it back. */
        int rc = io->ops->fallocate(io, j->fd, 0, (off_t)size);
        if (rc != 0)
            return rc;
        pthread_mutex_lock(&j->mu);
        segment *cur = &j->segs[j->n_segs - 1];
        j->stats.disk_bytes += size - cur->size;
        cur->size = size;
        pthread_mutex_unlock(&j->mu);
        j->seg_size = size;
        return 0;
    }
    if (j->fd >= 0 && j->dirty) {
        /* fsync interval/never: the segment being left must be complete on
         * disk before its successor is, or a power loss leaves a hole in
         * the LSNs between them (and a torn tail before a durable one). */
        int rc;
        sync_now(j, &rc);
        if (rc != 0) {
            mark_failed(j, rc, "fdatasync");
            return rc;
        }
    }
    io->ops->unlink(io, tmp); /* a leftover from a crash mid-rotation */
    int fd = io->ops->open(io, tmp, O_RDWR | O_CREAT | O_EXCL, 0644);
    if (fd < 0)
        return fd;
    uint8_t header[DREY_SEGMENT_HEADER];
    drey_segment_header h = {.first_lsn = j->next_lsn, .size = size};
    drey_segment_header_encode(&h, header);
    int rc = io->ops->fallocate(io, fd, 0, (off_t)size);
    if (rc == 0)
        rc = drey_io_pwrite_all(io, fd, header, sizeof header, 0);
    if (rc == 0)
        rc = io->ops->fdatasync(io, fd);
    if (rc == 0)
        rc = io->ops->rename(io, tmp, path);
    if (rc == 0) {
        char jdir[4096];
        drey_journal__path(jdir, sizeof jdir, j->dir, NULL);
        rc = io->ops->sync_dir(io, jdir);
    }
    if (rc != 0) {
        io->ops->close(io, fd);
        io->ops->unlink(io, tmp);
        io->ops->unlink(io, path);
        return rc;
    }
    if (j->fd >= 0)
        io->ops->close(io, j->fd);
    j->fd = fd;
    j->off = DREY_SEGMENT_HEADER;
    j->seg_size = size;
    pthread_mutex_lock(&j->mu);
    add_segment(j, name, j->next_lsn, size);
    pthread_mutex_unlock(&j->mu);
    return 0;
}

static void fail_batch(drey_journal_entry *batch, int err) {
    while (batch != NULL) {
        drey_journal_entry *next = batch->next_;
        batch->done(batch->arg, NULL, err);
        batch = next;
    }
}

static void mark_failed(drey_journal *j, int err, const char *what) {
    pthread_mutex_lock(&j->mu);
    j->stats.failed = true;
    j->stats.failed_errno = -err;
    pthread_mutex_unlock(&j->mu);
    DREY_LOG_ERROR("journal failed: durable writes are refused until a restart", DREY_LOG_STR("operation", what),
                   DREY_LOG_STR("error", strerror(-err)));
}

static int64_t sync_now(drey_journal *j, int *rc) {
    int64_t t0 = drey_mono_ns();
    *rc = j->io->ops->fdatasync(j->io, j->fd);
    int64_t us = (drey_mono_ns() - t0) / 1000;
    j->last_sync_ms = drey_mono_ms();
    j->dirty = false;
    if (*rc == 0)
        j->epoch_lsn = 0;
    pthread_mutex_lock(&j->mu);
    j->stats.last_fsync_us = us;
    pthread_mutex_unlock(&j->mu);
    return us;
}

/* Writes records that all fit in the current segment with one pwrite (and
 * one fdatasync), then completes them. */
static void write_run(drey_journal *j, drey_journal_entry *run, int64_t time_ms,
                      void (*observer)(void *ctx, size_t records, int64_t fsync_us), void *observer_ctx) {
    size_t total = 0, n = 0;
    for (drey_journal_entry *e = run; e != NULL; e = e->next_, n++)
        total += drey_frame_size(e->len);
    if (total > j->buf_cap) {
        j->buf_cap = total > 2 * j->buf_cap ? total : 2 * j->buf_cap;
        j->buf = drey_xrealloc(j->buf, j->buf_cap, 1);
    }
    uint64_t first = j->next_lsn;
    /* The frames' batch LSN is the first LSN written since the segment was
     * last synced: with fsync always that is this batch; with interval or
     * never, every batch a power loss may tear shares it, so recovery tells
     * their torn tail from damage to synced data (frame.h). */
    uint64_t epoch = j->epoch_lsn != 0 ? j->epoch_lsn : first;
    size_t pos = 0;
    uint64_t lsn = first;
    for (drey_journal_entry *e = run; e != NULL; e = e->next_, lsn++) {
        drey_frame f = {.lsn = lsn, .batch_lsn = epoch, .time_ms = e->time_ms != 0 ? e->time_ms : time_ms,
                        .length = (uint32_t)e->len};
        drey_frame_encode(&f, e->payload, j->buf + pos);
        pos += drey_frame_size(e->len);
    }
    int rc = drey_io_pwrite_all(j->io, j->fd, j->buf, total, (off_t)j->off);
    if (rc != 0) {
        mark_failed(j, rc, "write");
        /* Best effort: zeros where the batch went, so recovery does not
         * replay writes that were reported failed. */
        drey_journal__zero_range(j->io, j->fd, j->off, j->off + total);
        fail_batch(run, rc);
        return;
    }
    j->dirty = true;
    j->epoch_lsn = epoch;
    int64_t fsync_us = 0;
    if (j->opts.fsync == DREY_FSYNC_ALWAYS) {
        fsync_us = sync_now(j, &rc);
        if (rc != 0) {
            mark_failed(j, rc, "fdatasync");
            fail_batch(run, rc);
            return;
        }
    }
    j->off += total;
    j->next_lsn += n;
    j->last_time = time_ms;
    pthread_mutex_lock(&j->mu);
    j->stats.last_lsn = j->next_lsn - 1;
    j->stats.appends += n;
    j->stats.bytes_written += total;
    j->stats.batches++;
    pthread_mutex_unlock(&j->mu);

    /* Observed before the writes are acknowledged: whoever saw a write
     * acknowledged finds its batch in the figures. */
    if (observer != NULL)
        observer(observer_ctx, n, fsync_us);
    lsn = first;
    for (drey_journal_entry *e = run; e != NULL; lsn++) {
        drey_journal_entry *next = e->next_; /* done may free e */
        drey_journal_record rec = {
            .lsn = lsn, .time_ms = e->time_ms != 0 ? e->time_ms : time_ms, .payload = e->payload, .len = e->len};
        e->done(e->arg, &rec, 0);
        e = next;
    }
}

/* Places a batch record by record: those that fit in the current segment
 * go in one write; a record that does not fit starts a new segment (the
 * rule the quota plan follows, so the plan and the disk agree). */
static void write_batch(drey_journal *j, drey_journal_entry *batch, int64_t time_ms,
                        void (*observer)(void *ctx, size_t records, int64_t fsync_us), void *observer_ctx) {
    while (batch != NULL) {
        if (j->stats.failed) { /* only the writer sets it: no lock needed to read */
            fail_batch(batch, -EIO);
            return;
        }
        uint64_t need = drey_frame_size(batch->len);
        if (j->off + need > j->seg_size) {
            int rc = rotate(j, need);
            if (rc != 0) {
                DREY_LOG_WARN("journal cannot start a new segment", DREY_LOG_STR("error", strerror(-rc)));
                fail_batch(batch, rc);
                return;
            }
        }
        drey_journal_entry *last = batch;
        uint64_t used = need;
        while (last->next_ != NULL && j->off + used + drey_frame_size(last->next_->len) <= j->seg_size) {
            used += drey_frame_size(last->next_->len);
            last = last->next_;
        }
        drey_journal_entry *rest = last->next_;
        last->next_ = NULL;
        write_run(j, batch, time_ms, observer, observer_ctx);
        batch = rest;
    }
}

static void run_tasks(drey_journal *j, task *t) {
    while (t != NULL) {
        task *next = t->next;
        t->fn(t->arg, j->next_lsn - 1, j->last_time);
        free(t);
        t = next;
    }
}

static void *writer_main(void *arg) {
    drey_journal *j = arg;
    pthread_mutex_lock(&j->mu);
    for (;;) {
        bool interval = j->opts.fsync == DREY_FSYNC_INTERVAL;
        while (j->q_head == NULL && j->tasks == NULL && !j->stopping) {
            if (interval && j->dirty) {
                int64_t due = j->last_sync_ms + j->opts.fsync_interval_ms;
                if (drey_mono_ms() >= due)
                    break;
                drey_cond_wait_until(&j->cond, &j->mu, due * 1000000);
            } else {
                pthread_cond_wait(&j->cond, &j->mu);
            }
        }
        if (j->q_head == NULL && j->tasks == NULL && j->stopping)
            break;
        if (j->opts.batch_wait_us > 0 && j->q_head != NULL && !j->stopping) {
            /* Let a little more arrive, unless the batch is already full. */
            drey_cond_wait_until(&j->cond, &j->mu, drey_mono_ns() + j->opts.batch_wait_us * 1000);
        }
        task *tasks = j->tasks;
        j->tasks = NULL;
        drey_journal_entry *batch = j->q_head, *tail = NULL;
        size_t bytes = 0;
        for (drey_journal_entry *e = batch; e != NULL; e = e->next_) {
            if (tail != NULL && bytes + drey_frame_size(e->len) > j->opts.batch_max_bytes)
                break;
            bytes += drey_frame_size(e->len);
            tail = e;
        }
        int64_t time_ms = 0;
        if (tail != NULL) {
            for (drey_journal_entry *e = batch; e != tail->next_; e = e->next_) {
                j->stats.queued_records--;
                j->stats.queued_bytes -= e->len;
            }
            j->q_head = tail->next_;
            if (j->q_head == NULL)
                j->q_tail = NULL;
            tail->next_ = NULL;
            time_ms = drey_wall_ms();
            if (time_ms < j->clock_floor)
                time_ms = j->clock_floor;
            if (time_ms < j->last_time)
                time_ms = j->last_time;
            j->batch_pending = batch != NULL;
            j->pending_time = time_ms;
        } else {
            batch = NULL;
        }
        void (*observer)(void *, size_t, int64_t) = j->observer;
        void *observer_ctx = j->observer_ctx;
        void (*done_begin)(void) = j->done_begin, (*done_end)(void) = j->done_end;
        pthread_mutex_unlock(&j->mu);

        /* Tasks see the state after the previous batch, before this one. */
        run_tasks(j, tasks);
        if (batch != NULL) {
            if (done_begin != NULL)
                done_begin();
            write_batch(j, batch, time_ms, observer, observer_ctx);
            if (done_end != NULL)
                done_end();
        }
        if (interval && j->dirty && drey_mono_ms() >= j->last_sync_ms + j->opts.fsync_interval_ms) {
            int rc;
            sync_now(j, &rc);
            if (rc != 0 && !j->stats.failed)
                mark_failed(j, rc, "fdatasync");
        }
        pthread_mutex_lock(&j->mu);
        j->batch_pending = false;
        if (j->q_head == NULL)
            plan_from_actual(j);
    }
    pthread_mutex_unlock(&j->mu);
    if (j->dirty && !j->stats.failed) {
        int rc;
        sync_now(j, &rc);
    }
    return NULL;
}

static void remove_temporaries(drey_io *io, const char *dir) {
    char path[4096];
    drey_journal__path(path, sizeof path, dir, NULL);
    char **names;
    size_t n;
    if (io->ops->list_dir(io, path, &names, &n) != 0)
        return;
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(names[i]);
        if (len > 4 && strcmp(names[i] + len - 4, ".tmp") == 0) {
            drey_journal__path(path, sizeof path, dir, names[i]);
            io->ops->unlink(io, path);
        }
    }
    drey_io_free_names(names, n);
}

/* Closes the segment and frees j (its writer stopped or never started). */
static void journal_free(drey_journal *j) {
    if (j->fd >= 0)
        j->io->ops->close(j->io, j->fd);
    free(j->buf);
    free(j->segs);
    free(j->dir);
    pthread_mutex_destroy(&j->compact_mu);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cond);
    free(j);
}

int drey_journal_open(const drey_journal_options *opts, uint64_t after_lsn, drey_journal_replay_fn replay, void *ctx,
                      drey_journal **out, char *err, size_t err_cap) {
    drey_io *io = opts->io;
    char path[4096];
    drey_journal__path(path, sizeof path, opts->dir, NULL);
    /* mkdir is durable: a segment's directory sync does not cover the
     * journal directory's own name. */
    int rc = io->ops->mkdir(io, opts->dir);
    if (rc == 0)
        rc = io->ops->mkdir(io, path);
    if (rc != 0) {
        snprintf(err, err_cap, "cannot create %s: %s", path, strerror(-rc));
        return rc;
    }
    remove_temporaries(io, opts->dir);

    drey_journal_scan scan;
    rc = drey_journal_scan_dir(io, opts->dir, after_lsn, replay, ctx, &scan);
    if (rc != 0) {
        snprintf(err, err_cap, "replaying %s failed (%d)%s%s", path, rc, scan.message[0] ? ": " : "", scan.message);
        drey_journal_scan_free(&scan);
        return rc < 0 ? rc : -EINVAL;
    }
    if (scan.problem != DREY_JOURNAL_OK && scan.problem != DREY_JOURNAL_TORN_TAIL) {
        snprintf(err, err_cap, "%s; nothing was changed. `dreyd storage verify %s` shows the damage, "
                               "`dreyd storage repair %s` cuts the journal there (dropping what follows)",
                 scan.message, opts->dir, opts->dir);
        drey_journal_scan_free(&scan);
        return -EINVAL;
    }

    drey_journal *j = drey_xcalloc(1, sizeof *j);
    j->opts = *opts;
    j->dir = drey_xstrdup(opts->dir);
    j->opts.dir = j->dir;
    j->io = io;
    j->fd = -1;
    pthread_mutex_init(&j->compact_mu, NULL);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cond, NULL);
    j->stats.fsync = opts->fsync;
    j->last_time = scan.last_time_ms;
    j->last_sync_ms = drey_mono_ms();

    if (scan.problem == DREY_JOURNAL_TORN_TAIL) {
        drey_journal_segment_info *si = &scan.segments[scan.problem_segment];
        drey_journal__path(path, sizeof path, opts->dir, si->name);
        int fd = io->ops->open(io, path, O_RDWR, 0);
        rc = fd < 0 ? fd : drey_journal__zero_range(io, fd, si->problem_offset, si->dirty_end);
        if (fd >= 0)
            io->ops->close(io, fd);
        if (rc != 0) {
            snprintf(err, err_cap, "cannot cut the torn tail of %s: %s", path, strerror(-rc));
            goto fail;
        }
        /* With fsync always the cut batch was never acknowledged; with
         * interval or never it may hold acknowledged writes (the documented
         * loss window of those policies). */
        DREY_LOG_WARN("journal: cut a torn final batch left by a crash",
                      DREY_LOG_BOOL("acknowledged_writes_possible", opts->fsync != DREY_FSYNC_ALWAYS),
                      DREY_LOG_STR("segment", si->name), DREY_LOG_UINT("offset", si->problem_offset),
                      DREY_LOG_UINT("bytes", si->dirty_end - si->problem_offset));
        j->stats.torn_tails_cut = 1;
    }
    if (scan.n_segments > 0 && scan.last_lsn < after_lsn) {
        /* The snapshot holds writes the journal lost (fsync policy never or
         * interval): every segment is covered by it. Start after it. */
        for (size_t i = 0; i < scan.n_segments; i++) {
            drey_journal__path(path, sizeof path, opts->dir, scan.segments[i].name);
            io->ops->unlink(io, path);
        }
        scan.n_segments = 0;
        DREY_LOG_WARN("journal: ends before the snapshot; starting a new one after it",
                      DREY_LOG_UINT("journal_last_lsn", scan.last_lsn), DREY_LOG_UINT("snapshot_lsn", after_lsn));
    }
    for (size_t i = 0; i < scan.n_segments; i++)
        add_segment(j, scan.segments[i].name, scan.segments[i].first_lsn, scan.segments[i].file_bytes);
    j->next_lsn = (scan.last_lsn > after_lsn ? scan.last_lsn : after_lsn) + 1;
    j->stats.last_lsn = j->next_lsn - 1;
    if (scan.n_segments > 0) {
        drey_journal_segment_info *last = &scan.segments[scan.n_segments - 1];
        drey_journal__path(path, sizeof path, opts->dir, last->name);
        j->fd = io->ops->open(io, path, O_RDWR, 0);
        if (j->fd < 0) {
            rc = j->fd;
            snprintf(err, err_cap, "cannot open %s: %s", path, strerror(-rc));
            goto fail;
        }
        j->off = scan.problem == DREY_JOURNAL_TORN_TAIL ? last->problem_offset : last->data_end;
        j->seg_size = last->file_bytes;
    }
    if (j->fd < 0 || j->off >= j->seg_size) {
        rc = rotate(j, 0);
        if (rc != 0) {
            snprintf(err, err_cap, "cannot create a journal segment in %s: %s", opts->dir, strerror(-rc));
            goto fail;
        }
    }
    drey_journal_scan_free(&scan);
    plan_from_actual(j);
    drey_thread_start(&j->thread, "journal writer", writer_main, j);
    *out = j;
    return 0;
fail:
    drey_journal_scan_free(&scan);
    journal_free(j);
    return rc;
}

void drey_journal_close(drey_journal *j) {
    if (j == NULL)
        return;
    drey_thread_stop(j->thread, &j->mu, &j->cond, &j->stopping);
    journal_free(j);
}

/* Whether a frame of `need` bytes fits the quota after what is queued;
 * reserves it when `reserve`. Needs j->mu. */
static bool quota_fits(drey_journal *j, uint64_t need, bool reserve) {
    /* Without a cap the plan is kept all the same: a cap set later
     * (drey_journal_set_max_bytes) then starts from true figures even while
     * records are queued. */
    uint64_t max = j->opts.max_bytes > 0 ? j->opts.max_bytes : UINT64_MAX;
    if (need <= j->plan_free) {
        if (reserve) {
            j->plan_free -= need;
            j->plan_empty = false;
        }
        return true;
    }
    /* A new segment, or the empty current one grown to the same size. */
    uint64_t size = new_segment_size(j, need);
    uint64_t growth = j->plan_empty ? size - j->plan_seg : size;
    if (growth > max || j->plan_used > max - growth)
        return false;
    if (reserve) {
        j->plan_used += growth;
        j->plan_seg = size;
        j->plan_free = size - DREY_SEGMENT_HEADER - need;
        j->plan_empty = false;
    }
    return true;
}

uint64_t drey_journal_room(drey_journal *j) {
    pthread_mutex_lock(&j->mu);
    uint64_t room = UINT64_MAX;
    if (j->opts.max_bytes > 0 && !j->stats.failed) {
        uint64_t seg = j->opts.segment_bytes > DREY_SEGMENT_HEADER ? j->opts.segment_bytes : DREY_SEGMENT_HEADER + 1;
        uint64_t left = j->opts.max_bytes > j->plan_used ? j->opts.max_bytes - j->plan_used : 0;
        room = j->plan_free + left / seg * (seg - DREY_SEGMENT_HEADER);
    } else if (j->stats.failed) {
        room = 0;
    }
    pthread_mutex_unlock(&j->mu);
    return room;
}

int drey_journal_append(drey_journal *j, drey_journal_entry *e) {
    e->next_ = NULL;
    pthread_mutex_lock(&j->mu);
    if (j->stats.failed) {
        pthread_mutex_unlock(&j->mu);
        return -EIO;
    }
    if ((j->opts.max_queued_records > 0 && j->stats.queued_records >= j->opts.max_queued_records) ||
        (j->opts.max_queued_bytes > 0 && j->stats.queued_records > 0 &&
         j->stats.queued_bytes + e->len > j->opts.max_queued_bytes)) {
        j->stats.queue_rejections++;
        pthread_mutex_unlock(&j->mu);
        return -ENOBUFS;
    }
    if (!quota_fits(j, drey_frame_size(e->len), true)) {
        j->stats.quota_rejections++;
        /* A record no segment under the cap could ever hold says nothing
         * about the journal's state: it does not make it critical. */
        uint64_t need = drey_frame_size(e->len);
        if (new_segment_size(j, need) <= j->opts.max_bytes)
            j->refused_need = need;
        pthread_mutex_unlock(&j->mu);
        return -EDQUOT;
    }
    if (j->q_tail != NULL)
        j->q_tail->next_ = e;
    else
        j->q_head = e;
    j->q_tail = e;
    j->stats.queued_records++;
    j->stats.queued_bytes += e->len;
    if (j->stats.queued_records > j->stats.queued_records_peak)
        j->stats.queued_records_peak = j->stats.queued_records;
    pthread_cond_signal(&j->cond);
    pthread_mutex_unlock(&j->mu);
    return 0;
}

void drey_journal_set_max_bytes(drey_journal *j, uint64_t max_bytes) {
    pthread_mutex_lock(&j->mu);
    j->opts.max_bytes = max_bytes;
    pthread_mutex_unlock(&j->mu);
}

void drey_journal_on_writer(drey_journal *j, void (*fn)(void *arg, uint64_t lsn, int64_t time_ms), void *arg) {
    task *t = drey_xmalloc(sizeof *t);
    t->fn = fn;
    t->arg = arg;
    pthread_mutex_lock(&j->mu);
    t->next = NULL;
    task **p = &j->tasks;
    while (*p != NULL)
        p = &(*p)->next;
    *p = t;
    pthread_cond_signal(&j->cond);
    pthread_mutex_unlock(&j->mu);
}

int64_t drey_journal_sweep_horizon(drey_journal *j, int64_t now_ms) {
    pthread_mutex_lock(&j->mu);
    if (now_ms > j->clock_floor)
        j->clock_floor = now_ms;
    int64_t h = j->batch_pending && j->pending_time < now_ms ? j->pending_time : now_ms;
    pthread_mutex_unlock(&j->mu);
    return h;
}

int drey_journal_remove_through(drey_journal *j, uint64_t lsn, unsigned *removed) {
    *removed = 0;
    /* One compaction at a time: between choosing the segments and dropping
     * them from the list, only this function removes any. */
    pthread_mutex_lock(&j->compact_mu);
    pthread_mutex_lock(&j->mu);
    /* A segment's records end where the next segment begins; the last
     * segment is the one being written and always stays. */
    size_t n = 0;
    while (n + 1 < j->n_segs && j->segs[n + 1].first_lsn - 1 <= lsn)
        n++;
    /* Copied: the writer may grow (and so move) the list meanwhile. */
    char(*names)[sizeof j->segs[0].name] = n > 0 ? drey_xcalloc(n, sizeof *names) : NULL;
    for (size_t i = 0; i < n; i++)
        memcpy(names[i], j->segs[i].name, sizeof names[i]);
    pthread_mutex_unlock(&j->mu);

    /* Unlinked without j->mu, which every append takes: a slow file system
     * delays the compaction, not the writes. Oldest first, so a crash
     * midway leaves a journal without a gap (what is left is covered by
     * the snapshot, and replay skips it). A segment leaves the list, and
     * its bytes the quota, once its file is gone. */
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        drey_journal__path(path, sizeof path, j->dir, names[i]);
        rc = j->io->ops->unlink(j->io, path);
        if (rc != 0)
            break;
        pthread_mutex_lock(&j->mu);
        j->stats.disk_bytes -= j->segs[0].size;
        j->plan_used -= j->segs[0].size;
        memmove(j->segs, j->segs + 1, (j->n_segs - 1) * sizeof *j->segs);
        j->n_segs--;
        j->stats.segments = j->n_segs;
        pthread_mutex_unlock(&j->mu);
        (*removed)++;
    }
    free(names);
    pthread_mutex_lock(&j->mu);
    /* Compaction is the remedy for a full journal: from here the state
     * tells only what the smallest record would meet, until the next
     * refusal. */
    j->refused_need = 0;
    pthread_mutex_unlock(&j->mu);
    if (*removed > 0) {
        char path[4096];
        drey_journal__path(path, sizeof path, j->dir, NULL);
        int src = j->io->ops->sync_dir(j->io, path);
        if (rc == 0)
            rc = src;
    }
    pthread_mutex_unlock(&j->compact_mu);
    return rc;
}

/* The smallest record a client can send: the quota is critical when even
 * it would not fit. */
#define SMALLEST_RECORD 64

void drey_journal_get_stats(drey_journal *j, drey_journal_stats *out) {
    pthread_mutex_lock(&j->mu);
    *out = j->stats;
    out->quota_max_bytes = j->opts.max_bytes;
    out->quota_high_water_bytes = j->opts.max_bytes / 10 * 8;
    out->quota_state = DREY_LEVEL_NORMAL;
    if (j->opts.max_bytes > 0) {
        /* Critical while even the smallest record, or the last one refused,
         * would not fit: the state tells what writes see now, never what
         * they saw once. */
        if (!quota_fits(j, drey_frame_size(SMALLEST_RECORD), false) ||
            (j->refused_need > 0 && !quota_fits(j, j->refused_need, false)))
            out->quota_state = DREY_LEVEL_CRITICAL;
        else if (out->disk_bytes >= out->quota_high_water_bytes)
            out->quota_state = DREY_LEVEL_HIGH;
    }
    pthread_mutex_unlock(&j->mu);
}

void drey_journal_set_batch_observer(drey_journal *j, void (*fn)(void *ctx, size_t records, int64_t fsync_us),
                                     void *ctx) {
    pthread_mutex_lock(&j->mu);
    j->observer = fn;
    j->observer_ctx = ctx;
    pthread_mutex_unlock(&j->mu);
}

void drey_journal_set_done_bracket(drey_journal *j, void (*begin)(void), void (*end)(void)) {
    pthread_mutex_lock(&j->mu);
    j->done_begin = begin;
    j->done_end = end;
    pthread_mutex_unlock(&j->mu);
}
