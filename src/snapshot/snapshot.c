/*
 * snapshot — writing and reading snapshot files; see include/drey/snapshot.h.
 *
 * Each shard is serialized into its own buffer when the store hands it over
 * (on whichever thread touched it first); finish walks the shards in order,
 * forcing the capture of any not yet delivered, and streams each buffer to
 * the file before freeing it, so memory beyond the file itself stays bounded
 * by the shards writers touched first.
 */
#include "drey/snapshot.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/bytes.h"
#include "drey/crc32c.h"

#define SNAP_MAGIC "DREYSNP"
#define SNAP_END_MAGIC "DREYEND"
#define SNAP_VERSION 1u
#define SNAP_VERSION_TENANTS 2u
#define KIND_TENANT 0x80u /* in a version 2 file: a tenant follows the value */
#define SNAP_HEADER 64u
#define SNAP_TRAILER 32u
#define RECORD_HEAD 8u  /* length + CRC */
#define BODY_FIXED 24u  /* lengths, kind, version, expiry */

typedef struct buffer {
    uint8_t *data;
    size_t len, cap;
    uint64_t count;
    _Atomic bool complete;
} buffer;

struct drey_snapshot {
    drey_store *store;
    _Atomic bool tenants; /* some record names a tenant: the file is version 2 */
    uint64_t lsn;
    int64_t time_ms;
    uint64_t last_version;
    buffer shards[DREY_STORE_SHARDS];
};

static uint8_t *reserve(buffer *b, size_t n) {
    if (b->cap - b->len < n) {
        size_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap - b->len < n)
            cap *= 2;
        b->data = drey_xrealloc(b->data, cap, 1);
        b->cap = cap;
    }
    uint8_t *p = b->data + b->len;
    b->len += n;
    return p;
}

static void on_item(void *ctx, size_t shard, const drey_store_item *it) {
    drey_snapshot *snap = ctx;
    buffer *b = &snap->shards[shard];
    if (it == NULL) {
        atomic_store(&b->complete, true);
        return;
    }
    size_t tlen = 0;
    const char *tenant = drey_store_tenant_name(snap->store, it->tenant, &tlen);
    size_t body = BODY_FIXED + it->cache_len + it->key_len + it->entry.value.len + (tlen > 0 ? 1 + tlen : 0);
    uint8_t *p = reserve(b, RECORD_HEAD + body);
    uint8_t *q = p + RECORD_HEAD;
    q[0] = (uint8_t)it->cache_len;
    q[1] = (uint8_t)(it->entry.value.kind | (tlen > 0 ? KIND_TENANT : 0));
    if (tlen > 0) {
        uint8_t *t = q + BODY_FIXED + it->cache_len + it->key_len + it->entry.value.len;
        t[0] = (uint8_t)tlen;
        memcpy(t + 1, tenant, tlen);
        atomic_store_explicit(&snap->tenants, true, memory_order_relaxed);
    }
    drey_bytes_put16(q + 2, (uint16_t)it->key_len);
    drey_bytes_put32(q + 4, it->entry.value.len);
    drey_bytes_put64(q + 8, it->entry.version);
    drey_bytes_put64(q + 16, (uint64_t)it->entry.expires_at_ms);
    memcpy(q + BODY_FIXED, it->cache, it->cache_len);
    memcpy(q + BODY_FIXED + it->cache_len, it->key, it->key_len);
    if (it->entry.value.len > 0)
        memcpy(q + BODY_FIXED + it->cache_len + it->key_len, it->entry.value.data, it->entry.value.len);
    drey_bytes_put32(p, (uint32_t)body);
    drey_bytes_put32(p + 4, drey_crc32c(0, q, body));
    b->count++;
}

drey_snapshot *drey_snapshot_begin(drey_store *s, uint64_t lsn, int64_t time_ms) {
    drey_snapshot *snap = drey_xcalloc(1, sizeof *snap);
    snap->store = s;
    snap->lsn = lsn;
    snap->time_ms = time_ms;
    snap->last_version = drey_store_last_version(s);
    drey_store_capture_begin(s, on_item, snap, time_ms);
    return snap;
}

static void free_snapshot(drey_snapshot *snap) {
    for (size_t i = 0; i < DREY_STORE_SHARDS; i++)
        free(snap->shards[i].data);
    free(snap);
}

int drey_snapshot_finish(drey_snapshot *snap, drey_io *io, const char *dir, char *name, size_t name_cap,
                         drey_snapshot_info *info) {
    char sdir[4096], path[4096 + 64], tmp[4096 + 80];
    snprintf(sdir, sizeof sdir, "%s/snapshots", dir);
    snprintf(name, name_cap, "snap-%016" PRIx64 ".snap", snap->lsn);
    snprintf(path, sizeof path, "%s/%s", sdir, name);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int rc = io->ops->mkdir(io, sdir);
    int fd = rc == 0 ? io->ops->open(io, tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644) : rc;
    uint8_t head[SNAP_HEADER] = {0};
    memcpy(head, SNAP_MAGIC, 8);
    drey_bytes_put32(head + 8, SNAP_VERSION);
    drey_bytes_put32(head + 12, SNAP_HEADER);
    drey_bytes_put64(head + 16, snap->lsn);
    drey_bytes_put64(head + 24, (uint64_t)snap->time_ms);
    drey_bytes_put64(head + 32, snap->last_version);
    drey_bytes_put32(head + 48, drey_crc32c(0, head, 48));
    uint64_t off = 0, count = 0;
    uint32_t chain = 0;
    if (fd >= 0) {
        rc = drey_io_pwrite_all(io, fd, head, sizeof head, 0);
        off = sizeof head;
    } else {
        rc = fd;
    }
    for (size_t i = 0; i < DREY_STORE_SHARDS; i++) {
        drey_store_capture_shard(snap->store, i);
        buffer *b = &snap->shards[i];
        if (rc == 0 && b->len > 0) {
            rc = drey_io_pwrite_all(io, fd, b->data, b->len, (off_t)off);
            off += b->len;
            chain = drey_crc32c(chain, b->data, b->len);
        }
        count += b->count;
        free(b->data);
        b->data = NULL;
        b->len = b->cap = 0;
    }
    drey_store_capture_end(snap->store);
    if (rc == 0 && atomic_load(&snap->tenants)) {
        /* Known only once every record is written: the header again. */
        drey_bytes_put32(head + 8, SNAP_VERSION_TENANTS);
        drey_bytes_put32(head + 48, drey_crc32c(0, head, 48));
        rc = drey_io_pwrite_all(io, fd, head, sizeof head, 0);
    }
    if (rc == 0) {
        uint8_t trailer[SNAP_TRAILER] = {0};
        memcpy(trailer, SNAP_END_MAGIC, 8);
        drey_bytes_put64(trailer + 8, count);
        drey_bytes_put32(trailer + 16, chain);
        drey_bytes_put32(trailer + 20, drey_crc32c(0, trailer, 20));
        rc = drey_io_pwrite_all(io, fd, trailer, sizeof trailer, (off_t)off);
        off += sizeof trailer;
    }
    rc = drey_io_install(io, fd, rc, tmp, path, sdir);
    if (info != NULL) {
        info->lsn = snap->lsn;
        info->time_ms = snap->time_ms;
        info->last_version = snap->last_version;
        info->entries = count;
        info->bytes = off;
    }
    free_snapshot(snap);
    return rc;
}

bool drey_snapshot_parse_name(const char *name, uint64_t *lsn) {
    return drey_bytes_hex_name(name, "snap-", ".snap", lsn);
}

#define FAIL(...)                                                                                                    \
    do {                                                                                                             \
        snprintf(err, err_cap, __VA_ARGS__);                                                                         \
        rc = -EINVAL;                                                                                                \
        goto out;                                                                                                    \
    } while (0)

/* Records are read in chunks of this size (a record larger than a chunk
 * gets a buffer of its own size): a snapshot is never held in memory whole,
 * which with millions of entries costs more in page faults than parsing. */
#define READ_CHUNK (8u << 20)

int drey_snapshot_read(drey_io *io, const char *path, void (*fn)(void *ctx, const drey_store_item *item), void *ctx,
                       drey_snapshot_info *info, char *err, size_t err_cap) {
    uint8_t head[SNAP_HEADER], t[SNAP_TRAILER];
    uint8_t *buf = NULL;
    off_t size = 0;
    int fd = io->ops->open(io, path, O_RDONLY, 0);
    int rc = fd < 0 ? fd : io->ops->fsize(io, fd, &size);
    if (rc == 0 && size >= (off_t)(SNAP_HEADER + SNAP_TRAILER)) {
        rc = drey_io_pread_all(io, fd, head, sizeof head, 0);
        if (rc == 0)
            rc = drey_io_pread_all(io, fd, t, sizeof t, size - (off_t)SNAP_TRAILER);
    }
    if (rc != 0) {
        snprintf(err, err_cap, "cannot read %s: %s", path, strerror(-rc));
        if (fd >= 0)
            io->ops->close(io, fd);
        return rc;
    }
    uint32_t version = drey_bytes_get32(head + 8);
    if ((uint64_t)size < SNAP_HEADER + SNAP_TRAILER || memcmp(head, SNAP_MAGIC, 8) != 0 ||
        (version != SNAP_VERSION && version != SNAP_VERSION_TENANTS) ||
        drey_bytes_get32(head + 48) != drey_crc32c(0, head, 48) ||
        drey_bytes_get32(head + 12) < SNAP_HEADER || drey_bytes_get32(head + 12) > (uint64_t)size - SNAP_TRAILER)
        FAIL("%s: bad snapshot header", path); /* a header size past the records would read past the end */
    memset(info, 0, sizeof *info);
    info->lsn = drey_bytes_get64(head + 16);
    info->time_ms = (int64_t)drey_bytes_get64(head + 24);
    info->last_version = drey_bytes_get64(head + 32);
    info->bytes = (uint64_t)size;
    if (memcmp(t, SNAP_END_MAGIC, 8) != 0 || drey_bytes_get32(t + 20) != drey_crc32c(0, t, 20))
        FAIL("%s: the trailer is missing or damaged (a truncated snapshot)", path);

    const uint64_t end = (uint64_t)size - SNAP_TRAILER;
    uint64_t pos = drey_bytes_get32(head + 12); /* next byte of the file to read */
    uint64_t rec = pos;              /* file offset of buf[start] */
    size_t cap = READ_CHUNK, have = 0, start = 0;
    buf = drey_xmalloc(cap);
    uint32_t chain = 0;
    uint64_t count = 0;
    for (;;) {
        size_t avail = have - start;
        size_t need = RECORD_HEAD + BODY_FIXED;
        if (avail >= RECORD_HEAD) {
            uint32_t body = drey_bytes_get32(buf + start);
            if (body < BODY_FIXED || body > end - rec - RECORD_HEAD)
                FAIL("%s: record at offset %" PRIu64 " is damaged", path, rec);
            need = RECORD_HEAD + (size_t)body;
        }
        if (avail >= need) {
            const uint8_t *r = buf + start, *q = r + RECORD_HEAD;
            uint32_t body = drey_bytes_get32(r);
            if (drey_bytes_get32(r + 4) != drey_crc32c(0, q, body))
                FAIL("%s: record at offset %" PRIu64 " is damaged", path, rec);
            drey_store_item it = {
                .cache_len = q[0],
                .key_len = drey_bytes_get16(q + 2),
            };
            bool has_tenant = version == SNAP_VERSION_TENANTS && (q[1] & KIND_TENANT) != 0;
            it.entry.value.kind = (drey_value_kind)(has_tenant ? q[1] & ~KIND_TENANT : q[1]);
            it.entry.value.len = drey_bytes_get32(q + 4);
            it.entry.version = drey_bytes_get64(q + 8);
            it.entry.expires_at_ms = (int64_t)drey_bytes_get64(q + 16);
            uint64_t fixed = (uint64_t)BODY_FIXED + it.cache_len + it.key_len + it.entry.value.len;
            if (has_tenant && fixed < body) {
                it.tenant_name = (const char *)q + fixed + 1;
                it.tenant_name_len = q[fixed];
                fixed += 1 + it.tenant_name_len;
            }
            if (fixed != body || (has_tenant && it.tenant_name_len == 0))
                FAIL("%s: record at offset %" PRIu64 " has inconsistent lengths", path, rec);
            it.cache = (const char *)q + BODY_FIXED;
            it.key = it.cache + it.cache_len;
            it.entry.value.data = (const uint8_t *)it.key + it.key_len;
            if (fn != NULL)
                fn(ctx, &it);
            chain = drey_crc32c(chain, r, need);
            start += need;
            rec += need;
            count++;
            continue;
        }
        if (pos == end) {
            if (avail > 0)
                FAIL("%s: record at offset %" PRIu64 " is cut short", path, rec);
            break;
        }
        /* Keep the partial record, make room for it whole, read on. */
        memmove(buf, buf + start, avail);
        have = avail;
        start = 0;
        if (need > cap) {
            cap = need;
            buf = drey_xrealloc(buf, cap, 1);
        }
        size_t n = cap - have < end - pos ? cap - have : (size_t)(end - pos);
        rc = drey_io_pread_all(io, fd, buf + have, n, (off_t)pos);
        if (rc != 0) {
            snprintf(err, err_cap, "cannot read %s: %s", path, strerror(-rc));
            goto out;
        }
        have += n;
        pos += n;
    }
    if (count != drey_bytes_get64(t + 8) || chain != drey_bytes_get32(t + 16))
        FAIL("%s: holds %" PRIu64 " records where its trailer says %" PRIu64, path, count, drey_bytes_get64(t + 8));
    info->entries = count;
out:
    free(buf);
    io->ops->close(io, fd);
    return rc;
}

/* The record count a snapshot's trailer announces (0 if unreadable): lets a
 * loader size the table once instead of growing it a thousand times. It is
 * read before the records are checked, so it is only believed up to what a
 * file of this size can hold: a damaged count must not size the table. */
static uint64_t announced_count(drey_io *io, const char *path) {
    int fd = io->ops->open(io, path, O_RDONLY, 0);
    if (fd < 0)
        return 0;
    off_t size;
    uint8_t t[SNAP_TRAILER];
    uint64_t n = 0;
    if (io->ops->fsize(io, fd, &size) == 0 && size >= (off_t)SNAP_TRAILER &&
        drey_io_pread_all(io, fd, t, sizeof t, size - (off_t)SNAP_TRAILER) == 0 && memcmp(t, SNAP_END_MAGIC, 8) == 0 &&
        drey_bytes_get32(t + 20) == drey_crc32c(0, t, 20)) {
        uint64_t most = ((uint64_t)size - SNAP_TRAILER) / (RECORD_HEAD + BODY_FIXED);
        n = drey_bytes_get64(t + 8) < most ? drey_bytes_get64(t + 8) : most;
    }
    io->ops->close(io, fd);
    return n;
}

static void load_item(void *ctx, const drey_store_item *it) {
    drey_store_item with = *it;
    with.tenant = drey_store_tenant_id(ctx, it->tenant_name, it->tenant_name_len);
    drey_store_load(ctx, &with);
}

int drey_snapshot_load(drey_io *io, const char *path, drey_store *s, drey_snapshot_info *info, char *err,
                       size_t err_cap) {
    drey_store_reserve(s, announced_count(io, path));
    int rc = drey_snapshot_read(io, path, load_item, s, info, err, err_cap);
    if (rc == 0)
        drey_store_raise_version(s, info->last_version);
    return rc;
}
