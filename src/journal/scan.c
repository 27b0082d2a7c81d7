/*
 * Reading the journal back: recovery's scan, the offline tools, repair.
 *
 * A scan reads each segment whole, checks its header, and walks its frames
 * while they are intact and their LSNs follow each other. Where that stops
 * before the zeros of never-written space, it decides what happened (see
 * frame.h): in the last segment, if every intact frame after the damage
 * belongs to the batch the damage is in, a crash tore the last batch (a
 * torn tail, safe to cut: that batch was never acknowledged); otherwise data
 * that was durable is damaged, and only an operator may cut it.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/bytes.h"
#include "drey/journal.h"
#include "frame.h"
#include "journal_internal.h"

const char *drey_journal_problem_name(drey_journal_problem p) {
    switch (p) {
    case DREY_JOURNAL_OK: return "ok";
    case DREY_JOURNAL_TORN_TAIL: return "torn tail";
    case DREY_JOURNAL_BAD_HEADER: return "bad segment header";
    case DREY_JOURNAL_BAD_FRAME: return "damaged frame";
    case DREY_JOURNAL_LSN_GAP: return "LSN gap";
    case DREY_JOURNAL_IO_ERROR: return "I/O error";
    }
    return "?";
}

bool drey_journal__segment_name(const char *name, uint64_t *first_lsn) {
    return drey_bytes_hex_name(name, "", ".seg", first_lsn);
}

void drey_journal__path(char *buf, size_t cap, const char *dir, const char *name) {
    snprintf(buf, cap, "%s/journal%s%s", dir, name != NULL ? "/" : "", name != NULL ? name : "");
}

/* The end of the last non-zero byte at or after `from`. */
static size_t dirty_end(const uint8_t *buf, size_t from, size_t size) {
    size_t end = size;
    while (end > from && buf[end - 1] == 0)
        end--;
    return end;
}

/* After damage at `off` in the last segment, where the next record expected
 * is `expect`: is any intact frame at or after it, starting before `dirty`
 * (the end of the non-zero bytes), from a later batch? A frame is decoded
 * against the whole segment (`size`): its zero padding lies past `dirty`. */
static bool later_batch_follows(const uint8_t *buf, size_t off, size_t dirty, size_t size, uint64_t expect) {
    for (size_t p = off; p < dirty && p + DREY_FRAME_HEADER <= size; p += 8) {
        drey_frame f;
        if (drey_frame_decode(buf + p, size - p, &f) == DREY_FRAME_OK && f.batch_lsn > expect)
            return true;
    }
    return false;
}

static void set_problem(drey_journal_scan *s, size_t seg, drey_journal_problem p, uint64_t off, const char *dir,
                        const char *detail) {
    drey_journal_segment_info *si = &s->segments[seg];
    si->problem = p;
    si->problem_offset = off;
    if (s->problem == DREY_JOURNAL_OK) {
        s->problem = p;
        s->problem_segment = seg;
        snprintf(s->message, sizeof s->message, "%s in %s/journal/%s at offset %" PRIu64 "%s%s",
                 drey_journal_problem_name(p), dir, si->name, off, detail[0] ? ": " : "", detail);
    }
}

static int read_segment(drey_io *io, const char *path, uint8_t **buf, size_t *size) {
    return drey_io_read_file(io, path, buf, size);
}

int drey_journal_scan_dir(drey_io *io, const char *dir, uint64_t after_lsn, drey_journal_replay_fn replay, void *ctx,
                          drey_journal_scan *out) {
    memset(out, 0, sizeof *out);
    char path[4096];
    drey_journal__path(path, sizeof path, dir, NULL);
    char **names;
    size_t n_names;
    int rc = io->ops->list_dir(io, path, &names, &n_names);
    if (rc == -ENOENT)
        return 0; /* no journal yet */
    if (rc != 0)
        return rc;
    out->segments = drey_xcalloc(n_names ? n_names : 1, sizeof *out->segments);
    uint64_t expect = 0; /* next LSN; 0 until the first segment sets it */
    rc = 0;
    for (size_t i = 0; i < n_names && rc == 0; i++) {
        uint64_t name_lsn;
        if (!drey_journal__segment_name(names[i], &name_lsn))
            continue; /* temporary files and strangers are not segments */
        size_t seg = out->n_segments++;
        drey_journal_segment_info *si = &out->segments[seg];
        snprintf(si->name, sizeof si->name, "%s", names[i]);
        si->first_lsn = name_lsn;
        si->last_lsn = name_lsn - 1;
        if (out->problem != DREY_JOURNAL_OK)
            continue; /* listed, not read: nothing after a problem counts */

        drey_journal__path(path, sizeof path, dir, names[i]);
        uint8_t *buf;
        size_t size;
        int err = read_segment(io, path, &buf, &size);
        if (err != 0) {
            set_problem(out, seg, DREY_JOURNAL_IO_ERROR, 0, dir, strerror(-err));
            continue;
        }
        si->file_bytes = size;
        drey_segment_header h;
        if (size < DREY_SEGMENT_HEADER || !drey_segment_header_decode(buf, &h) || h.first_lsn != name_lsn) {
            set_problem(out, seg, DREY_JOURNAL_BAD_HEADER, 0, dir, "");
            free(buf);
            continue;
        }
        bool last = true;
        for (size_t k = i + 1; k < n_names; k++) {
            uint64_t ignored;
            last &= !drey_journal__segment_name(names[k], &ignored);
        }
        if (expect == 0 && h.first_lsn > after_lsn + 1) {
            set_problem(out, seg, DREY_JOURNAL_LSN_GAP, 0, dir, "records after the snapshot are missing");
            free(buf);
            continue;
        }
        if (expect != 0 && h.first_lsn != expect) {
            set_problem(out, seg, DREY_JOURNAL_LSN_GAP, 0, dir, "does not continue the previous segment");
            free(buf);
            continue;
        }
        expect = h.first_lsn;
        size_t off = DREY_SEGMENT_HEADER;
        for (;;) {
            drey_frame f;
            drey_frame_status st = drey_frame_decode(buf + off, size - off, &f);
            if (st == DREY_FRAME_OK && f.lsn == expect) {
                if (f.lsn > after_lsn && replay != NULL) {
                    drey_journal_record rec = {.lsn = f.lsn, .time_ms = f.time_ms, .payload = f.payload,
                                               .len = f.length};
                    rc = replay(ctx, &rec);
                    if (rc != 0)
                        break;
                }
                si->records++;
                si->last_lsn = f.lsn;
                out->last_lsn = f.lsn;
                out->last_time_ms = f.time_ms;
                expect++;
                off += drey_frame_size(f.length);
                continue;
            }
            si->data_end = off;
            size_t dirty = dirty_end(buf, off, size);
            if (st == DREY_FRAME_END && dirty == off)
                break; /* clean: zeros from here on */
            si->dirty_end = dirty;
            if (last && !later_batch_follows(buf, off, dirty, size, expect))
                set_problem(out, seg, DREY_JOURNAL_TORN_TAIL, off, dir, "");
            else if (st == DREY_FRAME_OK)
                set_problem(out, seg, DREY_JOURNAL_LSN_GAP, off, dir, "a record out of sequence");
            else
                set_problem(out, seg, DREY_JOURNAL_BAD_FRAME, off, dir, "");
            break;
        }
        if (si->data_end == 0)
            si->data_end = off;
        free(buf);
    }
    drey_io_free_names(names, n_names);
    return rc;
}

void drey_journal_scan_free(drey_journal_scan *s) {
    free(s->segments);
    memset(s, 0, sizeof *s);
}

/* Zeroes [from, to) of a segment and syncs it. */
int drey_journal__zero_range(drey_io *io, int fd, uint64_t from, uint64_t to) {
    static const uint8_t zeros[65536];
    for (uint64_t off = from; off < to;) {
        size_t n = to - off < sizeof zeros ? (size_t)(to - off) : sizeof zeros;
        int rc = drey_io_pwrite_all(io, fd, zeros, n, (off_t)off);
        if (rc != 0)
            return rc;
        off += n;
    }
    return io->ops->fdatasync(io, fd);
}

int drey_journal_repair(drey_io *io, const char *dir, drey_journal_scan *s, uint64_t *dropped_segments) {
    *dropped_segments = 0;
    if (s->problem == DREY_JOURNAL_OK)
        return 0;
    char path[4096];
    size_t first_dropped = s->problem_segment;
    drey_journal_segment_info *si = &s->segments[s->problem_segment];
    if (si->problem != DREY_JOURNAL_BAD_HEADER && si->problem != DREY_JOURNAL_IO_ERROR &&
        !(si->problem == DREY_JOURNAL_LSN_GAP && si->problem_offset == 0)) {
        /* Keep the intact prefix of the damaged segment. */
        drey_journal__path(path, sizeof path, dir, si->name);
        int fd = io->ops->open(io, path, O_RDWR, 0);
        if (fd < 0)
            return fd;
        int rc = drey_journal__zero_range(io, fd, si->problem_offset, si->file_bytes);
        io->ops->close(io, fd);
        if (rc != 0)
            return rc;
        first_dropped++;
    }
    for (size_t i = first_dropped; i < s->n_segments; i++) {
        drey_journal__path(path, sizeof path, dir, s->segments[i].name);
        int rc = io->ops->unlink(io, path);
        if (rc != 0)
            return rc;
        (*dropped_segments)++;
    }
    drey_journal__path(path, sizeof path, dir, NULL);
    return io->ops->sync_dir(io, path);
}
