/* Shared between storage.c and tool.c (internal). */
#ifndef DREY_STORAGE_INTERNAL_H
#define DREY_STORAGE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "drey/io.h"
#include "drey/storage.h"

/* CURRENT's snapshot (relative path, "" for none) and LSN; -ENOENT if there
 * is no manifest, -EINVAL if it is damaged. */
int drey_storage__read_manifest(drey_io *io, const char *dir, char *snapshot, size_t cap, uint64_t *lsn);

/* Snapshot file names under <dir>/snapshots, newest first (free with
 * drey_io_free_names). */
size_t drey_storage__list_snapshots(drey_io *io, const char *dir, char ***names);

/* --- the derived journal disk cap (diskcap.c) ------------------------------ */

typedef struct drey_storage__disk {
    uint64_t fs_bytes;       /* size of the data directory's file system */
    uint64_t avail_bytes;    /* what drey may still allocate there (statvfs f_bavail) */
    uint64_t journal_bytes;  /* the journal's segments, preallocation included */
    uint64_t snapshot_bytes; /* estimate of the next snapshot file */
} drey_storage__disk;

/* Kept free for other writers, the manifest and temporary files: 5 % of the
 * file system, at least 1 MiB and at most 1 GiB. */
uint64_t drey_storage__reserve_bytes(uint64_t fs_bytes);
/* The cap (>= 1: never "none"); the rule is in diskcap.c. */
uint64_t drey_storage__derive_cap(const drey_storage__disk *d);
/* Whether the next snapshot fits now (SHORT if not), and still will once
 * the journal has grown to `cap` (0: none) with the snapshot growing as
 * much (LOW if not). */
drey_storage_snapshot_room drey_storage__snapshot_fits(const drey_storage__disk *d, uint64_t cap);

#endif
