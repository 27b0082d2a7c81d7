/*
 * Fuzz target: loading a snapshot (src/snapshot) and reading the manifest
 * that names it (CURRENT, src/storage), from the fault file system.
 *
 * Byte 0 holds flags, the rest is the file. Bit 7 makes it the manifest
 * instead of a snapshot. The other bits let the target make checksums and
 * counts right before writing, so that the fuzzer reaches the parsing behind
 * them: bit 0 the header CRC, bit 1 each record's CRC, bit 2 the trailer
 * (its record count, chained CRC and own CRC; bit 3 makes the count one
 * off); for a manifest, bit 0 its length and bit 1 its CRC.
 *
 * Properties: a snapshot that reads loads into a store with the entries it
 * announced; the store then snapshots and reads back; a manifest that
 * reads names a snapshot within the buffer given.
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "drey/crc32c.h"
#include "drey/snapshot.h"
#include "drey/store.h"
#include "fuzz_util.h"
#include "src/storage/storage_internal.h"

#define DIR "/d"
#define SNAP_HEADER 64u
#define SNAP_TRAILER 32u
#define RECORD_HEAD 8u
#define BODY_FIXED 24u

static void fix_snapshot(uint8_t *b, size_t n, unsigned flags) {
    if (n < SNAP_HEADER + SNAP_TRAILER)
        return;
    if (flags & 1)
        fuzz_put32(b + 48, drey_crc32c(0, b, 48));
    uint64_t pos = fuzz_get32(b + 12), end = n - SNAP_TRAILER, count = 0;
    uint32_t chain = 0;
    while (pos >= SNAP_HEADER && pos + RECORD_HEAD <= end) {
        uint32_t body = fuzz_get32(b + pos);
        if (body > end - pos - RECORD_HEAD)
            break;
        if (flags & 2)
            fuzz_put32(b + pos + 4, drey_crc32c(0, b + pos + RECORD_HEAD, body));
        chain = drey_crc32c(chain, b + pos, RECORD_HEAD + body);
        count++;
        pos += RECORD_HEAD + body;
    }
    if (flags & 4) {
        uint8_t *t = b + end;
        memcpy(t, "DREYEND", 8);
        fuzz_put64(t + 8, flags & 8 ? count + 1 : count); /* bit 3: a count one off */
        fuzz_put32(t + 16, chain);
        fuzz_put32(t + 20, drey_crc32c(0, t, 20));
    }
}

static void fix_manifest(uint8_t *b, size_t n, unsigned flags) {
    if (n < 16)
        return;
    if (flags & 1)
        fuzz_put32(b + 8, (uint32_t)(n - 16));
    if (flags & 2)
        fuzz_put32(b + 12, drey_crc32c(0, b + 16, n - 16));
}

typedef struct counted {
    uint64_t items;
} counted;

static void count_item(void *ctx, const drey_store_item *it) {
    counted *c = ctx;
    FUZZ_CHECK(it->cache_len <= 255 && it->key_len <= 65535, "item lengths %zu %zu", it->cache_len, it->key_len);
    c->items++;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > (1u << 20))
        return 0;
    unsigned flags = data[0];
    size_t n = size - 1;
    uint8_t *b = malloc(n ? n : 1);
    memcpy(b, data + 1, n);
    drey_io_fault *fs = drey_io_fault_create();
    drey_io *io = drey_io_fault_io(fs);
    FUZZ_CHECK(io->ops->mkdir(io, DIR) == 0 && io->ops->mkdir(io, DIR "/snapshots") == 0, "mkdir");

    if (flags & 0x80) {
        fix_manifest(b, n, flags);
        fuzz_put_file(io, DIR "/CURRENT", b, n);
        char name[64];
        uint64_t lsn;
        int rc = drey_storage__read_manifest(io, DIR, name, sizeof name, &lsn);
        FUZZ_CHECK(rc == 0 || rc == -EINVAL, "manifest: %d", rc);
        if (rc == 0)
            FUZZ_CHECK(memchr(name, 0, sizeof name) != NULL, "unterminated name");
    } else {
        fix_snapshot(b, n, flags);
        const char *path = DIR "/snapshots/snap-0000000000000001.snap";
        fuzz_put_file(io, path, b, n);
        drey_snapshot_info info;
        char err[512];
        counted c = {0};
        int rc = drey_snapshot_read(io, path, count_item, &c, &info, err, sizeof err);
        FUZZ_CHECK(rc == 0 || rc == -EINVAL, "read: %d", rc);
        drey_store *s = drey_store_create();
        drey_snapshot_info li;
        int lrc = drey_snapshot_load(io, path, s, &li, err, sizeof err);
        FUZZ_CHECK(lrc == rc, "load %d where read %d", lrc, rc);
        if (rc == 0) {
            FUZZ_CHECK(c.items == info.entries && li.entries == info.entries, "%llu items, %llu announced",
                       (unsigned long long)c.items, (unsigned long long)info.entries);
            /* What a loaded node writes at its next snapshot reads back. */
            drey_snapshot *snap = drey_snapshot_begin(s, info.lsn + 1, 0);
            char name[64];
            drey_snapshot_info wi, ri;
            FUZZ_CHECK(drey_snapshot_finish(snap, io, DIR, name, sizeof name, &wi) == 0, "finish");
            char again[128];
            snprintf(again, sizeof again, DIR "/snapshots/%s", name);
            FUZZ_CHECK(drey_snapshot_read(io, again, NULL, NULL, &ri, err, sizeof err) == 0, "re-read: %s", err);
            FUZZ_CHECK(ri.entries == wi.entries && ri.entries <= info.entries, "wrote %llu, read %llu of %llu",
                       (unsigned long long)wi.entries, (unsigned long long)ri.entries,
                       (unsigned long long)info.entries);
        }
        drey_store_destroy(s);
    }
    free(b);
    drey_io_fault_destroy(fs);
    return 0;
}
