/*
 * storage — the data directory: recovery, snapshots, compaction, and the
 * offline tools.
 *
 *   <dir>/CURRENT                 the manifest: which snapshot, from which LSN
 *   <dir>/snapshots/snap-N.snap   snapshots (the newest N kept)
 *   <dir>/journal/N.seg           journal segments
 *
 * Opening loads the snapshot CURRENT names (or, if it is damaged, the newest
 * valid older one), then replays the journal after its LSN through commit.
 * A snapshot is taken when the journal has grown by snapshot-every-bytes
 * since the last one, when snapshot-every time has passed with writes in
 * between, or on request (drey.admin.v1.Admin/Snapshot); afterwards the
 * manifest is switched to it, older snapshots beyond the retention are
 * deleted, and so are the journal segments it covers.
 */
#ifndef DREY_STORAGE_H
#define DREY_STORAGE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "drey/commit.h"
#include "drey/io.h"
#include "drey/journal.h"
#include "drey/snapshot.h"
#include "drey/store.h"

typedef struct drey_storage drey_storage;

typedef struct drey_storage_options {
    drey_journal_options journal; /* its dir and io are the storage's */
    uint64_t snapshot_every_bytes; /* 0: never by size */
    int64_t snapshot_every_ms;     /* 0: never by time */
    unsigned retain_snapshots;     /* >= 1 */
    /* --journal-max-bytes not given: journal.max_bytes is ignored and the
     * cap is derived from the data directory's file system instead, at open
     * and again every second and after every snapshot (the rule is in
     * src/storage/diskcap.c). */
    bool derive_journal_cap;
} drey_storage_options;

/* Whether the next snapshot fits on the data directory's file system. */
typedef enum drey_storage_snapshot_room {
    DREY_STORAGE_SNAPSHOT_UNKNOWN, /* the file system's space cannot be read */
    DREY_STORAGE_SNAPSHOT_OK,      /* it fits, also once the journal reaches its cap */
    DREY_STORAGE_SNAPSHOT_LOW,     /* it fits now, but may not once the journal grows */
    DREY_STORAGE_SNAPSHOT_SHORT,   /* it does not fit: compaction cannot free the journal */
} drey_storage_snapshot_room;

const char *drey_storage_snapshot_room_name(drey_storage_snapshot_room r);

int drey_storage_open(const drey_storage_options *opts, drey_store *store, drey_commit *commit, drey_storage **out,
                      char *err, size_t err_cap);
/* Waits for a snapshot in progress, stops the snapshot thread, closes the
 * journal (completing what it holds). */
void drey_storage_close(drey_storage *st);

drey_journal *drey_storage_journal(drey_storage *st);

typedef struct drey_snapshot_result {
    int rc; /* 0 or -errno */
    drey_snapshot_info info;
    char file[96]; /* relative to the data directory */
    unsigned segments_removed;
    int64_t duration_ms;
} drey_snapshot_result;

/* Asks for a snapshot now; done runs on the snapshot thread when it is
 * durable (or failed). Requests made while one runs share the next one. */
void drey_storage_request_snapshot(drey_storage *st, void (*done)(void *arg, const drey_snapshot_result *r),
                                   void *arg);

typedef struct drey_storage_stats {
    uint64_t recovered_snapshot_entries;
    uint64_t replayed_records;
    int64_t recovery_ms;
    uint64_t snapshot_lsn;      /* of the newest snapshot; 0 if none */
    int64_t snapshot_time_ms;   /* when it was finished (wall clock) */
    bool snapshot_in_flight;
    uint64_t snapshots_taken, snapshots_failed;
    int64_t last_snapshot_duration_ms;
    int64_t last_compaction_ms; /* wall clock of the last compaction; 0 if none */
    uint64_t segments_removed;
    bool compaction_failed;
    /* The data directory's file system, as of the last look (every second). */
    bool journal_cap_derived;   /* the journal's cap is derived, not configured */
    uint64_t fs_bytes;          /* size of the file system; 0: unknown */
    uint64_t fs_avail_bytes;    /* what may still be allocated there */
    uint64_t reserve_bytes;     /* kept free when the cap is derived */
    uint64_t snapshot_estimate_bytes; /* the next snapshot, estimated */
    uint64_t snapshot_files_bytes;    /* the snapshot files kept */
    drey_storage_snapshot_room snapshot_room;
} drey_storage_stats;

void drey_storage_get_stats(drey_storage *st, drey_storage_stats *out);

/* `dreyd storage inspect|verify|dump|repair <dir>`: returns the exit code. */
int drey_storage_tool(int argc, char **argv, FILE *out, FILE *err);

#endif
