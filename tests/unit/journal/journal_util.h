/*
 * Helpers shared by the journal's unit tests: hand-made segments on the
 * fault file system, and appends that can be waited for.
 */
#ifndef DREY_TESTS_UNIT_JOURNAL_UTIL_H
#define DREY_TESTS_UNIT_JOURNAL_UTIL_H

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/io.h"
#include "drey/journal.h"
#include "src/journal/frame.h"

#define JDIR "/data"
#define SEG_BYTES (64u * 1024u)

/* --- hand-made segments --------------------------------------------------- */

typedef struct hframe {
    uint64_t lsn, batch;
    int64_t time_ms;
    const char *payload; /* NULL: "rec-<lsn>" */
} hframe;

static inline void seg_path(char *buf, size_t cap, uint64_t first_lsn) {
    snprintf(buf, cap, JDIR "/journal/%016" PRIx64 ".seg", first_lsn);
}

static inline void default_payload(char *buf, size_t cap, uint64_t lsn) {
    snprintf(buf, cap, "rec-%" PRIu64, lsn);
}

/* Writes a durable segment: header, frames, zeros to `size`. Returns the
 * offset of each frame in offs (if not NULL) and the data end. */
static inline uint64_t make_segment(drey_io *io, uint64_t first_lsn, uint64_t size, const hframe *frames, size_t n,
                                    uint64_t *offs) {
    cr_assert_eq(io->ops->mkdir(io, JDIR), 0);
    cr_assert_eq(io->ops->mkdir(io, JDIR "/journal"), 0);
    uint8_t *buf = calloc(1, size);
    cr_assert_not_null(buf);
    drey_segment_header h = {.first_lsn = first_lsn, .size = size};
    drey_segment_header_encode(&h, buf);
    uint64_t off = DREY_SEGMENT_HEADER;
    for (size_t i = 0; i < n; i++) {
        char def[64];
        const char *p = frames[i].payload;
        if (p == NULL) {
            default_payload(def, sizeof def, frames[i].lsn);
            p = def;
        }
        drey_frame f = {.lsn = frames[i].lsn,
                        .batch_lsn = frames[i].batch,
                        .time_ms = frames[i].time_ms,
                        .length = (uint32_t)strlen(p)};
        cr_assert_leq(off + drey_frame_size(f.length), size);
        drey_frame_encode(&f, (const uint8_t *)p, buf + off);
        if (offs != NULL)
            offs[i] = off;
        off += drey_frame_size(f.length);
    }
    char path[256];
    seg_path(path, sizeof path, first_lsn);
    int fd = io->ops->open(io, path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    cr_assert_geq(fd, 0);
    cr_assert_eq(drey_io_pwrite_all(io, fd, buf, size, 0), 0);
    cr_assert_eq(io->ops->fdatasync(io, fd), 0);
    cr_assert_eq(io->ops->close(io, fd), 0);
    cr_assert_eq(io->ops->sync_dir(io, JDIR "/journal"), 0);
    free(buf);
    return off;
}

/* Frames lsn first..last, each its own batch (or all in `batch` if not 0). */
static inline size_t seq_frames(hframe *out, uint64_t first, uint64_t last, uint64_t batch) {
    size_t n = 0;
    for (uint64_t l = first; l <= last; l++, n++)
        out[n] = (hframe){.lsn = l, .batch = batch ? batch : l, .time_ms = 1000 + (int64_t)l};
    return n;
}

/* Overwrites bytes of a file durably. */
static inline void poke(drey_io *io, const char *path, uint64_t off, const void *data, size_t n) {
    int fd = io->ops->open(io, path, O_RDWR, 0);
    cr_assert_geq(fd, 0, "open %s", path);
    cr_assert_eq(drey_io_pwrite_all(io, fd, data, n, (off_t)off), 0);
    cr_assert_eq(io->ops->fdatasync(io, fd), 0);
    io->ops->close(io, fd);
}

static inline void flip_bit(drey_io *io, const char *path, uint64_t off, unsigned bit) {
    uint8_t *data;
    size_t n;
    cr_assert_eq(drey_io_read_file(io, path, &data, &n), 0);
    cr_assert_lt(off, n);
    uint8_t b = data[off] ^ (uint8_t)(1u << bit);
    free(data);
    poke(io, path, off, &b, 1);
}

static inline bool file_exists(drey_io *io, const char *path) {
    int fd = io->ops->open(io, path, O_RDONLY, 0);
    if (fd < 0)
        return false;
    io->ops->close(io, fd);
    return true;
}

static inline size_t count_segments(drey_io *io) {
    char **names;
    size_t n, segs = 0;
    if (io->ops->list_dir(io, JDIR "/journal", &names, &n) != 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(names[i]);
        if (l == 20 && strcmp(names[i] + 16, ".seg") == 0)
            segs++;
    }
    drey_io_free_names(names, n);
    return segs;
}

/* --- replay collection ---------------------------------------------------- */

typedef struct replayed {
    size_t n, cap;
    uint64_t *lsn;
    int64_t *time_ms;
    char **payload;  /* NUL-terminated copies */
    size_t *len;
    uint64_t stop_at; /* return 5 at this LSN (0: never) */
} replayed;

static inline int collect(void *ctx, const drey_journal_record *rec) {
    replayed *r = ctx;
    if (r->stop_at != 0 && rec->lsn == r->stop_at)
        return 5;
    if (r->n == r->cap) {
        r->cap = r->cap ? r->cap * 2 : 64;
        r->lsn = realloc(r->lsn, r->cap * sizeof *r->lsn);
        r->time_ms = realloc(r->time_ms, r->cap * sizeof *r->time_ms);
        r->payload = realloc(r->payload, r->cap * sizeof *r->payload);
        r->len = realloc(r->len, r->cap * sizeof *r->len);
    }
    r->lsn[r->n] = rec->lsn;
    r->time_ms[r->n] = rec->time_ms;
    r->payload[r->n] = malloc(rec->len + 1);
    memcpy(r->payload[r->n], rec->payload, rec->len);
    r->payload[r->n][rec->len] = '\0';
    r->len[r->n] = rec->len;
    r->n++;
    return 0;
}

static inline void replayed_free(replayed *r) {
    for (size_t i = 0; i < r->n; i++)
        free(r->payload[i]);
    free(r->lsn);
    free(r->time_ms);
    free(r->payload);
    free(r->len);
    memset(r, 0, sizeof *r);
}

/* --- waitable appends ------------------------------------------------------ */

typedef struct waiter {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    size_t done; /* completions so far */
} waiter;

typedef struct pending {
    drey_journal_entry e;
    waiter *w;
    char payload[64];
    uint8_t *big;    /* a large payload, owned */
    bool completed;
    int err;
    uint64_t lsn;
    int64_t time_ms;
    size_t order;    /* completion order */
} pending;

static inline void waiter_init(waiter *w) {
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cond, NULL);
    w->done = 0;
}

static inline void waiter_destroy(waiter *w) {
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cond);
}

static inline void on_done(void *arg, const drey_journal_record *rec, int err) {
    pending *p = arg;
    pthread_mutex_lock(&p->w->mu);
    p->err = err;
    if (err == 0) {
        p->lsn = rec->lsn;
        p->time_ms = rec->time_ms;
        if (rec->payload != p->e.payload || rec->len != p->e.len)
            p->err = -12345; /* the record must carry the entry's payload */
    }
    p->order = p->w->done++;
    p->completed = true;
    pthread_cond_broadcast(&p->w->cond);
    pthread_mutex_unlock(&p->w->mu);
}

static inline void pending_set(pending *p, waiter *w, const char *payload) {
    memset(p, 0, sizeof *p);
    p->w = w;
    snprintf(p->payload, sizeof p->payload, "%s", payload);
    p->e.payload = (const uint8_t *)p->payload;
    p->e.len = strlen(p->payload);
    p->e.done = on_done;
    p->e.arg = p;
}

/* An entry with a malloc'd payload of len bytes (owned by the pending). */
static inline void pending_set_big(pending *p, waiter *w, uint8_t *data, size_t len) {
    memset(p, 0, sizeof *p);
    p->w = w;
    p->big = data;
    p->e.payload = data;
    p->e.len = len;
    p->e.done = on_done;
    p->e.arg = p;
}

static inline void wait_done(waiter *w, size_t total) {
    pthread_mutex_lock(&w->mu);
    while (w->done < total)
        pthread_cond_wait(&w->cond, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

/* --- a gate: holds the writer thread inside an on_writer task ------------- */

typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool entered, open, left;
    uint64_t lsn; /* what the task was given */
    int64_t time_ms;
} gate;

static inline void gate_task(void *arg, uint64_t lsn, int64_t time_ms) {
    gate *g = arg;
    pthread_mutex_lock(&g->mu);
    g->lsn = lsn;
    g->time_ms = time_ms;
    g->entered = true;
    pthread_cond_broadcast(&g->cond);
    while (!g->open)
        pthread_cond_wait(&g->cond, &g->mu);
    g->left = true;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->mu);
}

/* Blocks the writer between batches; returns once it is held. */
static inline void gate_close(gate *g, drey_journal *j) {
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cond, NULL);
    g->entered = g->open = g->left = false;
    drey_journal_on_writer(j, gate_task, g);
    pthread_mutex_lock(&g->mu);
    while (!g->entered)
        pthread_cond_wait(&g->cond, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static inline void gate_open(gate *g) {
    pthread_mutex_lock(&g->mu);
    g->open = true;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->mu);
}

/* Frees the gate's resources once the writer has left gate_task (it may
 * still be on its way out right after gate_open, and records refused at
 * once by drey_journal_append complete without it). */
static inline void gate_destroy(gate *g) {
    pthread_mutex_lock(&g->mu);
    while (g->entered && !g->left)
        pthread_cond_wait(&g->cond, &g->mu);
    pthread_mutex_unlock(&g->mu);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cond);
}


/* Appends e; a refusal (quota, failed journal) is reported through e's done
 * callback like any other failure, so tests wait on one path. */
static inline void append_or_done(drey_journal *j, drey_journal_entry *e) {
    int rc = drey_journal_append(j, e);
    if (rc != 0)
        e->done(e->arg, NULL, rc);
}

#endif
