/*
 * snapshot — every live entry as of one LSN, in one file.
 *
 * File layout (little-endian):
 *   header (64 bytes): magic "DREYSNP\0", u32 version (1, or 2 when some
 *     record names a tenant), u32 header size, u64 LSN, i64 time ms, u64
 *     last version, u64 0, u32 CRC-32C of bytes 0..48, zeros
 *   records: u32 body length, u32 CRC-32C of the body, body =
 *     u8 cache length, u8 value kind, u16 key length, u32 value length,
 *     u64 version, i64 expires_at ms, cache, key, value; in a version 2
 *     file a kind with its top bit set (0x80) is followed, after the value,
 *     by u8 tenant length and the tenant's name
 * A file without tenants is byte for byte what version 1 wrote, and an
 * older binary refuses (loudly) a file whose entries name tenants.
 *   trailer (32 bytes): magic "DREYEND\0", u64 record count,
 *     u32 CRC-32C chained over every record's bytes, u32 CRC-32C of the
 *     trailer's first 20 bytes, zeros
 * A damaged record fails its CRC; a truncated file lacks the trailer or its
 * count; either way the snapshot is not loaded.
 *
 * Writing does not stop the node (drey_store's capture): begin on the
 * journal's writer thread between batches, then finish on any thread.
 */
#ifndef DREY_SNAPSHOT_H
#define DREY_SNAPSHOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "drey/io.h"
#include "drey/store.h"

typedef struct drey_snapshot_info {
    uint64_t lsn;
    int64_t time_ms;
    uint64_t last_version;
    uint64_t entries;
    uint64_t bytes;
} drey_snapshot_info;

typedef struct drey_snapshot drey_snapshot;

/* Starts capturing the store as of lsn (the writer thread, between
 * batches). */
drey_snapshot *drey_snapshot_begin(drey_store *s, uint64_t lsn, int64_t time_ms);

/* Writes <dir>/snapshots/<name> (a temporary file, fdatasync, rename,
 * directory sync) and frees the snapshot. name receives
 * "snap-<lsn, 16 hex digits>.snap". */
int drey_snapshot_finish(drey_snapshot *snap, drey_io *io, const char *dir, char *name, size_t name_cap,
                         drey_snapshot_info *info);

/* Reads and checks a snapshot; for each entry calls fn (may be NULL, e.g.
 * to verify). Returns 0, -EINVAL with a reason in err for a damaged or
 * truncated file, or -errno. */
int drey_snapshot_read(drey_io *io, const char *path, void (*fn)(void *ctx, const drey_store_item *item), void *ctx,
                       drey_snapshot_info *info, char *err, size_t err_cap);

/* drey_snapshot_read into a store (and its version counter). */
int drey_snapshot_load(drey_io *io, const char *path, drey_store *s, drey_snapshot_info *info, char *err,
                       size_t err_cap);

/* "snap-<16 hex>.snap" -> LSN. */
bool drey_snapshot_parse_name(const char *name, uint64_t *lsn);

#endif
