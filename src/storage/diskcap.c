/*
 * The journal disk cap a node derives from its file system when
 * --journal-max-bytes is not given, and whether the next snapshot fits.
 * Pure functions of a few figures, so the rule is tested without a disk
 * (tests/unit/storage/diskcap_test.c); storage.c feeds them statvfs and its
 * own sizes.
 *
 * The rule. Compaction has to write a snapshot before it can delete the
 * segments it covers, so the journal must never take the space that
 * snapshot needs. The next snapshot is estimated as the larger of the last
 * snapshot file and the store's accounted bytes (an entry's accounting,
 * 48 bytes plus its cache, key and value, is larger than its snapshot
 * record, 32 bytes plus the same). From now on the snapshot can grow by at
 * most what the journal grows by (a new entry's snapshot record is no larger
 * than the journal frame that made it). So of the space left once a reserve
 * (for other writers, the manifest and temporary files) and the snapshot are
 * set aside, the journal may take half and the other half stays for the
 * snapshot to grow into:
 *
 *     spare = available - reserve - snapshot estimate      (0 if negative)
 *     cap   = journal bytes now + spare / 2
 *
 * Each derivation is safe on its own: at the cap, what is still free is the
 * reserve plus a snapshot grown by as much as the journal did. It is also a
 * fixed point: re-deriving after the journal and the store grew together
 * gives the same cap, so the cap does not drift while the node writes.
 */
#include <stdint.h>

#include "drey/storage.h"
#include "storage_internal.h"

#define MIB ((uint64_t)1 << 20)
#define GIB ((uint64_t)1 << 30)

uint64_t drey_storage__reserve_bytes(uint64_t fs_bytes) {
    uint64_t r = fs_bytes / 20;
    return r < MIB ? MIB : r > GIB ? GIB : r;
}

uint64_t drey_storage__derive_cap(const drey_storage__disk *d) {
    uint64_t reserve = drey_storage__reserve_bytes(d->fs_bytes);
    uint64_t held = reserve + d->snapshot_bytes;
    uint64_t spare = d->avail_bytes > held ? d->avail_bytes - held : 0;
    uint64_t cap = d->journal_bytes + spare / 2;
    /* 0 would mean "no cap": a journal with no room to grow gets the
     * smallest cap there is, which lets it fill the segment it has. */
    return cap > 0 ? cap : 1;
}

drey_storage_snapshot_room drey_storage__snapshot_fits(const drey_storage__disk *d, uint64_t cap) {
    if (d->avail_bytes < d->snapshot_bytes)
        return DREY_STORAGE_SNAPSHOT_SHORT;
    /* What the journal may still grow by, and the snapshot with it (no cap:
     * as of now; the disk, not the cap, will stop the journal). */
    uint64_t growth = cap > d->journal_bytes ? cap - d->journal_bytes : 0;
    uint64_t reserve = drey_storage__reserve_bytes(d->fs_bytes);
    uint64_t left = d->avail_bytes - d->snapshot_bytes;
    if (left < reserve || (left - reserve) / 2 < growth)
        return DREY_STORAGE_SNAPSHOT_LOW;
    return DREY_STORAGE_SNAPSHOT_OK;
}

const char *drey_storage_snapshot_room_name(drey_storage_snapshot_room r) {
    switch (r) {
    case DREY_STORAGE_SNAPSHOT_UNKNOWN: return "unknown";
    case DREY_STORAGE_SNAPSHOT_OK: return "ok";
    case DREY_STORAGE_SNAPSHOT_LOW: return "low";
    case DREY_STORAGE_SNAPSHOT_SHORT: return "short";
    }
    return "?";
}
