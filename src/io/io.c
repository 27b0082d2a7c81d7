/*
 * io — helpers over any drey_io; see include/drey/io.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "drey/alloc.h"
#include "drey/io.h"

/* n bytes at off, in as many pwrites (write) or preads as it takes; one
 * that moves nothing is -EIO. */
static int transfer_all(drey_io *io, int fd, char *p, size_t n, off_t off, bool write) {
    while (n > 0) {
        ssize_t k = write ? io->ops->pwrite(io, fd, p, n, off) : io->ops->pread(io, fd, p, n, off);
        if (k < 0)
            return (int)k;
        if (k == 0)
            return -EIO;
        p += k;
        n -= (size_t)k;
        off += k;
    }
    return 0;
}

int drey_io_pwrite_all(drey_io *io, int fd, const void *buf, size_t n, off_t off) {
    return transfer_all(io, fd, (char *)buf, n, off, true);
}

int drey_io_pread_all(drey_io *io, int fd, void *buf, size_t n, off_t off) {
    return transfer_all(io, fd, buf, n, off, false);
}

int drey_io_write_file_atomic(drey_io *io, const char *dir, const char *name, const void *data, size_t n) {
    char tmp[4096], dst[4096];
    snprintf(tmp, sizeof tmp, "%s/%s.tmp", dir, name);
    snprintf(dst, sizeof dst, "%s/%s", dir, name);
    int fd = io->ops->open(io, tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return fd;
    return drey_io_install(io, fd, drey_io_pwrite_all(io, fd, data, n, 0), tmp, dst, dir);
}

int drey_io_install(drey_io *io, int fd, int rc, const char *tmp, const char *dst, const char *dir) {
    if (rc == 0 && fd >= 0)
        rc = io->ops->fdatasync(io, fd);
    int crc = fd >= 0 ? io->ops->close(io, fd) : 0;
    if (rc == 0)
        rc = crc;
    if (rc == 0)
        rc = io->ops->rename(io, tmp, dst);
    if (rc == 0)
        rc = io->ops->sync_dir(io, dir);
    if (rc != 0)
        io->ops->unlink(io, tmp);
    return rc;
}

int drey_io_read_file(drey_io *io, const char *path, uint8_t **data, size_t *n) {
    int fd = io->ops->open(io, path, O_RDONLY, 0);
    if (fd < 0)
        return fd;
    off_t size;
    int rc = io->ops->fsize(io, fd, &size);
    uint8_t *buf = NULL;
    if (rc == 0) {
        buf = drey_xmalloc(size > 0 ? (size_t)size : 1);
        rc = drey_io_pread_all(io, fd, buf, (size_t)size, 0);
    }
    io->ops->close(io, fd);
    if (rc != 0) {
        free(buf);
        return rc;
    }
    *data = buf;
    *n = (size_t)size;
    return 0;
}

void drey_io_free_names(char **names, size_t n) {
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

uint64_t drey_io_fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

uint64_t drey_io_fingerprint(uint64_t h, const char *path) {
    struct stat st;
    int64_t f[9] = {0};
    if (stat(path, &st) != 0) {
        f[0] = -1;
        f[1] = errno;
    } else {
        f[0] = (int64_t)st.st_dev;
        f[1] = (int64_t)st.st_ino;
        f[2] = (int64_t)st.st_size;
        f[3] = (int64_t)st.st_mtim.tv_sec;
        f[4] = (int64_t)st.st_mtim.tv_nsec;
        f[5] = (int64_t)st.st_ctim.tv_sec;
        f[6] = (int64_t)st.st_ctim.tv_nsec;
        f[7] = (int64_t)st.st_mode;
        f[8] = (int64_t)st.st_nlink;
    }
    return drey_io_fnv(h, f, sizeof f);
}
