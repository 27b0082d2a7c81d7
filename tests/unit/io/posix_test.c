/*
 * Unit tests for src/io/posix.c and the helpers in src/io/io.c, against a
 * real temporary directory (under $TEST_TMPDIR when Bazel sets it).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "drey/io.h"

/* --- harness -------------------------------------------------------------- */

static char root[4096];
static drey_io *io;

static void tmp_setup(void) {
    const char *base = getenv("TEST_TMPDIR");
    int n = snprintf(root, sizeof root, "%s/drey_io_XXXXXX", base != NULL && base[0] != '\0' ? base : "/tmp");
    cr_assert(n > 0 && (size_t)n < sizeof root, "TEST_TMPDIR too long");
    cr_assert_not_null(mkdtemp(root), "mkdtemp: %s", strerror(errno));
    io = drey_io_posix();
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void tmp_teardown(void) {
    nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

TestSuite(posix, .init = tmp_setup, .fini = tmp_teardown);

/* root + "/" + rel, in a static buffer per slot. */
static const char *at(int slot, const char *rel) {
    static char bufs[4][4096];
    int n = snprintf(bufs[slot], sizeof bufs[slot], "%s/%s", root, rel);
    cr_assert(n > 0 && (size_t)n < sizeof bufs[slot], "path too long");
    return bufs[slot];
}

static off_t size_of(int fd) {
    off_t size = -1;
    cr_assert_eq(io->ops->fsize(io, fd, &size), 0);
    return size;
}

/* --- tests ------------------------------------------------------------------- */

Test(posix, write_read_sync_and_size) {
    int fd = io->ops->open(io, at(0, "f"), O_RDWR | O_CREAT | O_TRUNC, 0644);
    cr_assert_geq(fd, 0);
    cr_assert_eq(drey_io_pwrite_all(io, fd, "hello", 5, 0), 0);
    cr_assert_eq(io->ops->pwrite(io, fd, "XY", 2, 8), 2);
    cr_assert_eq(io->ops->fdatasync(io, fd), 0);
    cr_assert_eq(size_of(fd), 10);
    char buf[16];
    cr_assert_eq(io->ops->pread(io, fd, buf, sizeof buf, 0), 10, "a short read at the end");
    cr_assert(memcmp(buf, "hello\0\0\0XY", 10) == 0);
    cr_assert_eq(io->ops->pread(io, fd, buf, 4, 100), 0, "past EOF");
    cr_assert_eq(drey_io_pread_all(io, fd, buf, 4, 8), -EIO, "pread_all past EOF");
    cr_assert_eq(drey_io_pread_all(io, fd, buf, 5, 0), 0);
    cr_assert_eq(io->ops->ftruncate(io, fd, 3), 0);
    cr_assert_eq(size_of(fd), 3);
    cr_assert_eq(io->ops->close(io, fd), 0);
    cr_assert_eq(io->ops->pwrite(io, fd, "x", 1, 0), -EBADF);
}

Test(posix, fallocate_extends_the_size_with_zeros) {
    int fd = io->ops->open(io, at(0, "f"), O_RDWR | O_CREAT, 0644);
    cr_assert_eq(io->ops->pwrite(io, fd, "ab", 2, 0), 2);
    cr_assert_eq(io->ops->fallocate(io, fd, 0, 8192), 0);
    cr_assert_eq(size_of(fd), 8192);
    char buf[8];
    cr_assert_eq(drey_io_pread_all(io, fd, buf, 8, 0), 0);
    cr_assert(memcmp(buf, "ab\0\0\0\0\0\0", 8) == 0);
    cr_assert_eq(io->ops->fallocate(io, fd, 0, 16), 0);
    cr_assert_eq(size_of(fd), 8192, "never shrinks");
    io->ops->close(io, fd);
}

Test(posix, errors_are_negative_errno) {
    cr_assert_eq(io->ops->open(io, at(0, "nodir/f"), O_WRONLY | O_CREAT, 0644), -ENOENT);
    cr_assert_eq(io->ops->open(io, at(0, "missing"), O_RDONLY, 0), -ENOENT);
    int fd = io->ops->open(io, at(0, "f"), O_WRONLY | O_CREAT, 0644);
    io->ops->close(io, fd);
    cr_assert_eq(io->ops->open(io, at(0, "f"), O_WRONLY | O_CREAT | O_EXCL, 0644), -EEXIST);
    cr_assert_eq(io->ops->rename(io, at(0, "missing"), at(1, "g")), -ENOENT);
    cr_assert_eq(io->ops->unlink(io, at(0, "missing")), -ENOENT);
    cr_assert_eq(io->ops->sync_dir(io, at(0, "missing")), -ENOENT);
    char **names;
    size_t n;
    cr_assert_eq(io->ops->list_dir(io, at(0, "missing"), &names, &n), -ENOENT);
    cr_assert_eq(io->ops->mkdir(io, at(0, "x/y")), -ENOENT);
}

Test(posix, mkdir_rename_unlink_and_sorted_list_dir) {
    cr_assert_eq(io->ops->mkdir(io, at(0, "d")), 0);
    cr_assert_eq(io->ops->mkdir(io, at(0, "d")), 0, "an existing directory is fine");
    const char *files[] = {"d/c", "d/a", "d/b"};
    for (int i = 0; i < 3; i++) {
        int fd = io->ops->open(io, at(0, files[i]), O_WRONLY | O_CREAT, 0644);
        cr_assert_geq(fd, 0);
        io->ops->close(io, fd);
    }
    cr_assert_eq(io->ops->mkdir(io, at(0, "d/sub")), 0);
    cr_assert_eq(io->ops->sync_dir(io, at(0, "d")), 0);
    char **names;
    size_t n;
    cr_assert_eq(io->ops->list_dir(io, at(0, "d"), &names, &n), 0);
    cr_assert_eq(n, 4);
    cr_assert_str_eq(names[0], "a");
    cr_assert_str_eq(names[1], "b");
    cr_assert_str_eq(names[2], "c");
    cr_assert_str_eq(names[3], "sub");
    drey_io_free_names(names, n);

    cr_assert_eq(io->ops->rename(io, at(0, "d/a"), at(1, "d/z")), 0);
    cr_assert_eq(io->ops->unlink(io, at(0, "d/b")), 0);
    cr_assert_eq(io->ops->list_dir(io, at(0, "d"), &names, &n), 0);
    cr_assert_eq(n, 3);
    cr_assert_str_eq(names[0], "c");
    cr_assert_str_eq(names[1], "sub");
    cr_assert_str_eq(names[2], "z");
    drey_io_free_names(names, n);
}

Test(posix, write_file_atomic_and_read_file) {
    cr_assert_eq(drey_io_write_file_atomic(io, root, "m", "first", 5), 0);
    uint8_t *data;
    size_t n;
    cr_assert_eq(drey_io_read_file(io, at(0, "m"), &data, &n), 0);
    cr_assert_eq(n, 5);
    cr_assert(memcmp(data, "first", 5) == 0);
    free(data);

    cr_assert_eq(drey_io_write_file_atomic(io, root, "m", "second, longer", 14), 0);
    cr_assert_eq(drey_io_read_file(io, at(0, "m"), &data, &n), 0);
    cr_assert_eq(n, 14);
    cr_assert(memcmp(data, "second, longer", 14) == 0);
    free(data);

    cr_assert_eq(drey_io_write_file_atomic(io, root, "empty", "", 0), 0);
    cr_assert_eq(drey_io_read_file(io, at(0, "empty"), &data, &n), 0);
    cr_assert_eq(n, 0);
    free(data);

    char **names;
    size_t count;
    cr_assert_eq(io->ops->list_dir(io, root, &names, &count), 0);
    cr_assert_eq(count, 2, "no temporary file is left behind");
    cr_assert_str_eq(names[0], "empty");
    cr_assert_str_eq(names[1], "m");
    drey_io_free_names(names, count);

    cr_assert_eq(drey_io_read_file(io, at(0, "missing"), &data, &n), -ENOENT);
    cr_assert_eq(drey_io_write_file_atomic(io, at(0, "nodir"), "m", "x", 1), -ENOENT);
}

/* The file system's space is statvfs's, and preallocating a file takes it
 * from what is available (the derived journal cap depends on both). */
Test(posix, fs_space_is_statvfs_and_allocation_takes_from_it) {
    cr_assert_not_null(io->ops->fs_space);
    uint64_t total = 0, avail = 0;
    cr_assert_eq(io->ops->fs_space(io, root, &total, &avail), 0);
    struct statvfs sv;
    cr_assert_eq(statvfs(root, &sv), 0);
    cr_assert_eq(total, (uint64_t)sv.f_blocks * sv.f_frsize);
    cr_assert(total > 0 && avail <= total, "total %llu avail %llu", (unsigned long long)total,
              (unsigned long long)avail);
    cr_assert_eq(io->ops->fs_space(io, at(0, "missing/dir"), &total, &avail), -ENOENT);
}
