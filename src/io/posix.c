/*
 * io — the real file system behind drey_io; see include/drey/io.h.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "drey/alloc.h"
#include "drey/io.h"

static int px_open(drey_io *io, const char *path, int flags, int mode) {
    (void)io;
    int fd;
    do
        fd = open(path, flags | O_CLOEXEC, mode);
    while (fd < 0 && errno == EINTR);
    return fd < 0 ? -errno : fd;
}

static int px_close(drey_io *io, int fd) {
    (void)io;
    return close(fd) != 0 && errno != EINTR ? -errno : 0;
}

static ssize_t px_pwrite(drey_io *io, int fd, const void *buf, size_t n, off_t off) {
    (void)io;
    ssize_t w;
    do
        w = pwrite(fd, buf, n, off);
    while (w < 0 && errno == EINTR);
    return w < 0 ? -errno : w;
}

static ssize_t px_pread(drey_io *io, int fd, void *buf, size_t n, off_t off) {
    (void)io;
    ssize_t r;
    do
        r = pread(fd, buf, n, off);
    while (r < 0 && errno == EINTR);
    return r < 0 ? -errno : r;
}

static int px_fdatasync(drey_io *io, int fd) {
    (void)io;
    return fdatasync(fd) != 0 ? -errno : 0;
}

static int px_fallocate(drey_io *io, int fd, off_t off, off_t len) {
    (void)io;
    /* posix_fallocate returns the error instead of setting errno. */
    int err = posix_fallocate(fd, off, len);
    return -err;
}

static int px_ftruncate(drey_io *io, int fd, off_t len) {
    (void)io;
    return ftruncate(fd, len) != 0 ? -errno : 0;
}

static int px_fsize(drey_io *io, int fd, off_t *size) {
    (void)io;
    struct stat st;
    if (fstat(fd, &st) != 0)
        return -errno;
    *size = st.st_size;
    return 0;
}

static int px_rename(drey_io *io, const char *from, const char *to) {
    (void)io;
    return rename(from, to) != 0 ? -errno : 0;
}

static int px_unlink(drey_io *io, const char *path) {
    (void)io;
    return unlink(path) != 0 ? -errno : 0;
}

static int px_sync_dir(drey_io *io, const char *path) {
    (void)io;
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = fsync(fd) != 0 ? -errno : 0;
    close(fd);
    return rc;
}

/* A new directory's name lives in its parent: syncing the parent makes it
 * durable, as the interface promises (a journal written into a directory
 * whose name a crash then loses is lost with it). */
static int px_mkdir(drey_io *io, const char *path) {
    if (mkdir(path, 0755) != 0)
        return errno == EEXIST ? 0 : -errno;
    char *copy = drey_xstrdup(path);
    int rc = px_sync_dir(io, dirname(copy));
    free(copy);
    return rc;
}

static int name_cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int px_list_dir(drey_io *io, const char *path, char ***names, size_t *n) {
    (void)io;
    DIR *d = opendir(path);
    if (d == NULL)
        return -errno;
    size_t cap = 16, count = 0;
    char **v = drey_xmalloc(cap * sizeof *v);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        if (count == cap) {
            cap *= 2;
            v = drey_xrealloc(v, cap, sizeof *v);
        }
        v[count++] = drey_xstrdup(e->d_name);
    }
    closedir(d);
    qsort(v, count, sizeof *v, name_cmp);
    *names = v;
    *n = count;
    return 0;
}

static int px_lock(drey_io *io, const char *path) {
    (void)io;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int err = errno;
        close(fd);
        return -err;
    }
    return fd;
}

static int px_fs_space(drey_io *io, const char *path, uint64_t *total_bytes, uint64_t *avail_bytes) {
    (void)io;
    struct statvfs sv;
    if (statvfs(path, &sv) != 0)
        return -errno;
    *total_bytes = (uint64_t)sv.f_blocks * sv.f_frsize;
    *avail_bytes = (uint64_t)sv.f_bavail * sv.f_frsize;
    return 0;
}

static const drey_io_ops posix_ops = {
    .open = px_open,
    .close = px_close,
    .pwrite = px_pwrite,
    .pread = px_pread,
    .fdatasync = px_fdatasync,
    .fallocate = px_fallocate,
    .ftruncate = px_ftruncate,
    .fsize = px_fsize,
    .rename = px_rename,
    .unlink = px_unlink,
    .mkdir = px_mkdir,
    .sync_dir = px_sync_dir,
    .list_dir = px_list_dir,
    .lock = px_lock,
    .fs_space = px_fs_space,
};

static drey_io posix_io = {.ops = &posix_ops};

drey_io *drey_io_posix(void) {
    return &posix_io;
}
