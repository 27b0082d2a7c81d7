/* Shared between storage.c and tool.c (internal). */
#ifndef DREY_STORAGE_INTERNAL_H
#define DREY_STORAGE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "drey/io.h"

/* CURRENT's snapshot (relative path, "" for none) and LSN; -ENOENT if there
 * is no manifest, -EINVAL if it is damaged. */
int drey_storage__read_manifest(drey_io *io, const char *dir, char *snapshot, size_t cap, uint64_t *lsn);

/* Snapshot file names under <dir>/snapshots, newest first (free with
 * drey_io_free_names). */
size_t drey_storage__list_snapshots(drey_io *io, const char *dir, char ***names);

#endif
