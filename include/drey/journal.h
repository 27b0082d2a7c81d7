/*
 * journal — the write-ahead log: segments of CRC-checked frames, group
 * commit, recovery.
 *
 * The journal knows nothing about what its records mean: a record is a
 * payload, and the journal gives it an LSN (1, 2, 3, ... never reused) and a
 * time. One writer thread takes every record queued while the previous batch
 * was being synced, writes them with one pwrite and makes them durable with
 * one fdatasync (group commit), then calls each record's `done` callback in
 * LSN order on the writer thread. The caller applies the record there, so
 * application order is LSN order, live and on replay alike.
 *
 * Segments live in <dir>/journal/<first LSN, 16 hex digits>.seg, are
 * preallocated, and are created as a temporary file that is synced, renamed
 * into place and made durable with a directory sync. The frame format and the
 * torn-write rules are in src/journal/frame.h.
 *
 * Failure rules. A batch that cannot get space (a new segment cannot be
 * created: ENOSPC) fails with that error and the journal goes on. A failed
 * write or fdatasync fails its batch and marks the journal failed: the pages
 * may or may not be on disk and the kernel may have dropped them (the lesson
 * of PostgreSQL's fsync failures), so every later append fails too until the
 * process restarts and recovery reads what is really there.
 */
#ifndef DREY_JOURNAL_H
#define DREY_JOURNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "drey/io.h"
#include "drey/level.h"

typedef enum drey_fsync_policy {
    DREY_FSYNC_ALWAYS,   /* acknowledge after fdatasync */
    DREY_FSYNC_INTERVAL, /* acknowledge after write; fdatasync every interval */
    DREY_FSYNC_NEVER,    /* acknowledge after write; the OS decides */
} drey_fsync_policy;

typedef struct drey_journal_options {
    const char *dir;          /* the data directory; the journal uses <dir>/journal */
    drey_io *io;
    uint64_t segment_bytes;   /* preallocated size of a segment */
    drey_fsync_policy fsync;
    int64_t fsync_interval_ms;
    int64_t batch_wait_us;    /* wait this long for more records before writing (0: none) */
    size_t batch_max_bytes;   /* a batch closes at this size */
    /* Disk quota: segment bytes (preallocation included) the journal may
     * hold; 0 for none. An append that would grow the segments past it is
     * refused (drey_journal_append returns -EDQUOT) before it is queued. */
    uint64_t max_bytes;
    /* Records (and their payload bytes) queued for the writer at most; 0:
     * no bound. An append beyond either is refused (-ENOBUFS) before it is
     * queued. A record larger than max_queued_bytes is still taken when the
     * queue is empty, so no record is refused for ever. */
    uint64_t max_queued_records;
    uint64_t max_queued_bytes;
} drey_journal_options;

typedef struct drey_journal_record {
    uint64_t lsn;
    int64_t time_ms; /* wall-clock ms the record is applied at */
    const uint8_t *payload;
    size_t len;
} drey_journal_record;

/* --- recovery and offline inspection -------------------------------------- */

typedef enum drey_journal_problem {
    DREY_JOURNAL_OK = 0,
    DREY_JOURNAL_TORN_TAIL,   /* the last batch was cut short by a crash */
    DREY_JOURNAL_BAD_HEADER,  /* a segment header is unreadable */
    DREY_JOURNAL_BAD_FRAME,   /* a CRC mismatch or garbage where durable data was */
    DREY_JOURNAL_LSN_GAP,     /* LSNs do not follow each other (a missing segment) */
    DREY_JOURNAL_IO_ERROR,
} drey_journal_problem;

const char *drey_journal_problem_name(drey_journal_problem p);

typedef struct drey_journal_segment_info {
    char name[32];          /* file name under journal/ */
    uint64_t first_lsn;     /* from the header */
    uint64_t last_lsn;      /* last valid record; first_lsn - 1 if none */
    uint64_t records;
    uint64_t file_bytes;    /* size on disk, preallocation included */
    uint64_t data_end;      /* offset where valid frames end */
    drey_journal_problem problem;
    uint64_t problem_offset;
    uint64_t dirty_end;     /* for a torn tail: end of the bytes after it that are not zero */
} drey_journal_segment_info;

typedef struct drey_journal_scan {
    drey_journal_segment_info *segments;
    size_t n_segments;
    uint64_t last_lsn;      /* last valid record before the first problem (0: none) */
    int64_t last_time_ms;
    drey_journal_problem problem; /* the first problem found, if any */
    size_t problem_segment;
    char message[320];      /* file and offset of the problem, for operators */
} drey_journal_scan;

typedef int (*drey_journal_replay_fn)(void *ctx, const drey_journal_record *rec);

/* Reads every segment, calling replay (may be NULL) for each valid record
 * with lsn > after_lsn, in order, until the first problem. Never changes the
 * files. Returns 0, the replay function's non-zero result, or -errno. */
int drey_journal_scan_dir(drey_io *io, const char *dir, uint64_t after_lsn, drey_journal_replay_fn replay, void *ctx,
                          drey_journal_scan *out);
void drey_journal_scan_free(drey_journal_scan *s);

/* Operator repair: cuts the journal at its first problem (zeroing the rest of
 * that segment and deleting later segments). Reports what it dropped. */
int drey_journal_repair(drey_io *io, const char *dir, drey_journal_scan *before, uint64_t *dropped_segments);

/* --- the live journal ------------------------------------------------------ */

typedef struct drey_journal drey_journal;

/* Opens <dir>/journal, replaying records after after_lsn through replay. A
 * torn tail is cut (its bytes zeroed and synced) and counted; any other
 * problem refuses to open with scan.message in err. Starts the writer. */
int drey_journal_open(const drey_journal_options *opts, uint64_t after_lsn, drey_journal_replay_fn replay, void *ctx,
                      drey_journal **out, char *err, size_t err_cap);

/* Stops the writer after it has written and completed what was queued,
 * syncs, and frees the journal. */
void drey_journal_close(drey_journal *j);

typedef void (*drey_journal_done_fn)(void *arg, const drey_journal_record *rec, int err);

/* A queued append. The caller owns it (typically in its request's arena)
 * and keeps it and the payload alive until `done` has been called. */
typedef struct drey_journal_entry {
    const uint8_t *payload;
    size_t len;
    /* The time the record applies at; 0: the journal's (the batch's). A
     * record a primary ordered for its backups too has its own. */
    int64_t time_ms;
    drey_journal_done_fn done; /* err 0: durable (per policy); else -errno, not written */
    void *arg;
    struct drey_journal_entry *next_; /* the journal's */
} drey_journal_entry;

/* Queues e. Refused before anything happens with -EDQUOT when it would
 * cross the disk quota, -ENOBUFS when the queue is full, and -EIO once the
 * journal has failed; then `done` is never called. */
int drey_journal_append(drey_journal *j, drey_journal_entry *e);

/* Changes the disk quota (0: none) from the next append on. Records
 * already queued keep their place: a lower cap refuses only what comes
 * after them. Used for a cap derived from the file system. */
void drey_journal_set_max_bytes(drey_journal *j, uint64_t max_bytes);

/* Runs fn on the writer thread between batches, with the LSN and time of the
 * last record applied. Used to start a snapshot at an exact LSN. */
void drey_journal_on_writer(drey_journal *j, void (*fn)(void *arg, uint64_t lsn, int64_t time_ms), void *arg);

/* The time up to which expired entries may be freed without changing what a
 * record not yet applied would see: min(now, the time of any record stamped
 * but not applied). Later records are stamped no earlier than it. */
int64_t drey_journal_sweep_horizon(drey_journal *j, int64_t now_ms);

/* Deletes segments whose records all have lsn <= lsn (never the one being
 * written). Returns how many were deleted. */
int drey_journal_remove_through(drey_journal *j, uint64_t lsn, unsigned *removed);

/* The journal disk quota (see drey_journal_options.max_bytes). */
typedef struct drey_journal_stats {
    uint64_t last_lsn;
    uint64_t segments;
    uint64_t disk_bytes;         /* segment files, preallocation included */
    uint64_t appends;            /* records written since open */
    uint64_t bytes_written;
    uint64_t batches;
    uint64_t torn_tails_cut;     /* at open */
    int64_t last_fsync_us;       /* duration of the last fdatasync */
    bool failed;                 /* a write or sync failed: appends are refused */
    int failed_errno;
    drey_fsync_policy fsync;
    uint64_t quota_max_bytes;    /* 0: no quota */
    uint64_t quota_high_water_bytes;
    drey_level quota_state; /* HIGH from high water; CRITICAL: the next append would not fit */
    uint64_t quota_rejections;
    uint64_t queued_records;     /* appended, not yet taken by the writer */
    uint64_t queued_bytes;       /* their payload bytes */
    uint64_t queued_records_peak; /* the most queued at once since open */
    uint64_t queue_rejections;   /* appends refused with -ENOBUFS */
} drey_journal_stats;

void drey_journal_get_stats(drey_journal *j, drey_journal_stats *out);

/* Frame bytes (drey_frame_size of a payload: its length plus 40, rounded
 * up to 8) that may still be appended, queued ones counted, before the
 * quota refuses; UINT64_MAX without a quota, 0 once the journal failed.
 * A little less than that may fit: a record never straddles segments. */
uint64_t drey_journal_room(drey_journal *j);

/* Histograms for metrics: called on the writer thread after each batch with
 * its record count and fdatasync duration (0 when not synced). */
void drey_journal_set_batch_observer(drey_journal *j, void (*fn)(void *ctx, size_t records, int64_t fsync_us),
                                     void *ctx);

/* Runs begin before a batch's first `done` and end after its last, on the
 * writer thread (NULL: nothing). The pipeline opens its batch there
 * (drey_pipeline_batch_begin): what one fdatasync completes is answered in
 * one message per stream, not one per record. */
void drey_journal_set_done_bracket(drey_journal *j, void (*begin)(void), void (*end)(void));

#endif
