/*
 * Unit tests for src/io/fault.c: the faulting, crashing in-memory file
 * system. Each test pins one rule of the model the journal's crash tests
 * rely on: what survives a crash (synced bytes, dir-synced names), what a
 * torn crash may keep, and how injected faults fire.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/io.h"

/* --- harness -------------------------------------------------------------- */

static drey_io_fault *fs;
static drey_io *io;

static void fs_setup(void) {
    fs = drey_io_fault_create();
    io = drey_io_fault_io(fs);
}

static void fs_teardown(void) {
    drey_io_fault_destroy(fs);
    fs = NULL;
    io = NULL;
}

TestSuite(fault, .init = fs_setup, .fini = fs_teardown);

static int op_open(const char *path, int flags) {
    return io->ops->open(io, path, flags, 0644);
}

/* Creates (or replaces) path with s; syncs the file and/or its directory. */
static void put(const char *path, const char *s, bool sync_file, const char *sync_dir) {
    int fd = op_open(path, O_WRONLY | O_CREAT | O_TRUNC);
    cr_assert_geq(fd, 0, "open %s: %d", path, fd);
    cr_assert_eq(drey_io_pwrite_all(io, fd, s, strlen(s), 0), 0);
    if (sync_file)
        cr_assert_eq(io->ops->fdatasync(io, fd), 0);
    cr_assert_eq(io->ops->close(io, fd), 0);
    if (sync_dir != NULL)
        cr_assert_eq(io->ops->sync_dir(io, sync_dir), 0);
}

/* Asserts that path holds exactly s. */
static void expect(const char *path, const char *s) {
    uint8_t *data = NULL;
    size_t n = 0;
    int rc = drey_io_read_file(io, path, &data, &n);
    cr_assert_eq(rc, 0, "read %s: %d", path, rc);
    cr_assert_eq(n, strlen(s), "%s: %zu bytes, expected %zu", path, n, strlen(s));
    cr_assert(memcmp(data, s, n) == 0, "%s: content differs", path);
    free(data);
}

static void expect_absent(const char *path) {
    cr_assert_eq(op_open(path, O_RDONLY), -ENOENT, "%s should not exist", path);
}

/* Asserts the names in dir, given as one space-separated string. */
static void expect_names(const char *dir, const char *want) {
    char **names;
    size_t n;
    cr_assert_eq(io->ops->list_dir(io, dir, &names, &n), 0);
    char got[1024] = "";
    for (size_t i = 0; i < n; i++) {
        if (i > 0)
            strcat(got, " ");
        strcat(got, names[i]);
    }
    drey_io_free_names(names, n);
    cr_assert_str_eq(got, want);
}

static off_t size_of(int fd) {
    off_t size = -1;
    cr_assert_eq(io->ops->fsize(io, fd, &size), 0);
    return size;
}

static drey_io_fault_stats stats(void) {
    drey_io_fault_stats s;
    drey_io_fault_get_stats(fs, &s);
    return s;
}

/* --- basic file operations and errors ---------------------------------------- */

Test(fault, write_read_and_size) {
    cr_assert_eq(io->ops->mkdir(io, "/d"), 0);
    int fd = op_open("/d/f", O_RDWR | O_CREAT);
    cr_assert_geq(fd, 0);
    cr_assert_eq(io->ops->pwrite(io, fd, "hello", 5, 0), 5);
    cr_assert_eq(io->ops->pwrite(io, fd, "XY", 2, 8), 2);
    cr_assert_eq(size_of(fd), 10);
    char buf[16];
    cr_assert_eq(io->ops->pread(io, fd, buf, sizeof buf, 0), 10, "a short read at the end");
    cr_assert(memcmp(buf, "hello\0\0\0XY", 10) == 0, "the hole reads as zeros");
    cr_assert_eq(io->ops->pread(io, fd, buf, 4, 10), 0, "at EOF");
    cr_assert_eq(io->ops->pread(io, fd, buf, 4, 100), 0, "past EOF");
    cr_assert_eq(drey_io_pread_all(io, fd, buf, 4, 8), -EIO);
    cr_assert_eq(io->ops->pwrite(io, fd, "x", 1, -1), -EINVAL);
    cr_assert_eq(io->ops->close(io, fd), 0);
    cr_assert_eq(io->ops->close(io, fd), -EBADF);
}

Test(fault, open_flags_and_errors) {
    cr_assert_eq(op_open("/nodir/f", O_WRONLY | O_CREAT), -ENOENT);
    cr_assert_eq(io->ops->mkdir(io, "/d"), 0);
    cr_assert_eq(op_open("/d/f", O_RDONLY), -ENOENT, "no O_CREAT");
    put("/d/f", "abc", false, NULL);
    cr_assert_eq(op_open("/d/f", O_WRONLY | O_CREAT | O_EXCL), -EEXIST);
    cr_assert_eq(op_open("/d/f/g", O_WRONLY | O_CREAT), -ENOTDIR);
    cr_assert_eq(op_open("/d", O_RDONLY), -EISDIR);
    cr_assert_eq(op_open("/d", O_WRONLY | O_CREAT | O_EXCL), -EEXIST);

    int fd = op_open("/d/f", O_RDONLY);
    char buf[4];
    cr_assert_eq(io->ops->pwrite(io, fd, "x", 1, 0), -EBADF, "read-only descriptor");
    cr_assert_eq(io->ops->fallocate(io, fd, 0, 10), -EBADF);
    cr_assert_eq(io->ops->ftruncate(io, fd, 0), -EINVAL);
    cr_assert_eq(io->ops->pread(io, fd, buf, 3, 0), 3);
    io->ops->close(io, fd);

    fd = op_open("/d/f", O_WRONLY);
    cr_assert_eq(io->ops->pread(io, fd, buf, 3, 0), -EBADF, "write-only descriptor");
    io->ops->close(io, fd);

    fd = op_open("/d/f", O_WRONLY | O_CREAT | O_EXCL | O_TRUNC);
    cr_assert_eq(fd, -EEXIST);
    fd = op_open("/d/f", O_RDWR | O_TRUNC);
    cr_assert_eq(size_of(fd), 0, "O_TRUNC empties the file");
    io->ops->close(io, fd);

    cr_assert_eq(io->ops->pwrite(io, 12345, "x", 1, 0), -EBADF);
    cr_assert_eq(io->ops->fdatasync(io, 12345), -EBADF);
    off_t size;
    cr_assert_eq(io->ops->fsize(io, 12345, &size), -EBADF);
}

Test(fault, names_and_directories) {
    cr_assert_eq(io->ops->mkdir(io, "/d"), 0);
    cr_assert_eq(io->ops->mkdir(io, "/d"), 0, "mkdir of an existing directory");
    cr_assert_eq(io->ops->mkdir(io, "/x/y"), -ENOENT, "missing parent");
    put("/d/f", "1", false, NULL);
    cr_assert_eq(io->ops->mkdir(io, "/d/f"), -EEXIST, "a file has the name");
    cr_assert_eq(io->ops->rename(io, "/d/missing", "/d/g"), -ENOENT);
    cr_assert_eq(io->ops->rename(io, "/d/f", "/nodir/g"), -ENOENT);
    cr_assert_eq(io->ops->unlink(io, "/d/missing"), -ENOENT);
    cr_assert_eq(io->ops->unlink(io, "/d"), -EISDIR);
    cr_assert_eq(io->ops->sync_dir(io, "/nodir"), -ENOENT);
    cr_assert_eq(io->ops->sync_dir(io, "/d/f"), -ENOTDIR);
    char **names;
    size_t n;
    cr_assert_eq(io->ops->list_dir(io, "/nodir", &names, &n), -ENOENT);
    cr_assert_eq(io->ops->list_dir(io, "/d/f", &names, &n), -ENOTDIR);

    /* Repeated and trailing slashes name the same thing. */
    expect("/d//f", "1");
    cr_assert_eq(io->ops->sync_dir(io, "/d/"), 0);
}

Test(fault, list_dir_is_sorted_current_names) {
    cr_assert_eq(io->ops->mkdir(io, "/d"), 0);
    cr_assert_eq(io->ops->mkdir(io, "/d/sub"), 0);
    put("/d/c", "c", false, NULL);
    put("/d/a", "a", false, NULL);
    put("/d/b", "b", false, NULL);
    put("/d/sub/inner", "i", false, NULL);
    expect_names("/d", "a b c sub");
    expect_names("/d/sub", "inner");
    expect_names("/", "d");
    cr_assert_eq(io->ops->rename(io, "/d/a", "/d/z"), 0);
    cr_assert_eq(io->ops->unlink(io, "/d/b"), 0);
    expect_names("/d", "c sub z");
}

Test(fault, rename_replaces_atomically_and_open_fds_keep_their_inode) {
    cr_assert_eq(io->ops->mkdir(io, "/d"), 0);
    put("/d/a", "new", false, NULL);
    put("/d/b", "old", false, NULL);
    int old_fd = op_open("/d/b", O_RDONLY);
    cr_assert_eq(io->ops->rename(io, "/d/a", "/d/b"), 0);
    expect_absent("/d/a");
    expect("/d/b", "new");
    char buf[8];
    cr_assert_eq(io->ops->pread(io, old_fd, buf, sizeof buf, 0), 3);
    cr_assert(memcmp(buf, "old", 3) == 0, "a renamed-over file stays readable through its fd");

    int fd = op_open("/d/b", O_RDWR);
    cr_assert_eq(io->ops->unlink(io, "/d/b"), 0);
    expect_absent("/d/b");
    cr_assert_eq(io->ops->pwrite(io, fd, "N", 1, 0), 1);
    cr_assert_eq(io->ops->pread(io, fd, buf, sizeof buf, 0), 3);
    cr_assert(memcmp(buf, "New", 3) == 0, "an unlinked file stays usable through its fd");
    io->ops->close(io, fd);
    io->ops->close(io, old_fd);
    cr_assert_eq(io->ops->rename(io, "/d/missing", "/d/missing"), -ENOENT);
}

/* --- what a crash keeps --------------------------------------------------------- */

Test(fault, unsynced_bytes_are_lost_and_synced_bytes_kept) {
    cr_assert_eq(io->ops->mkdir(io, "/d"), 0);
    int fd = op_open("/d/f", O_RDWR | O_CREAT);
    cr_assert_eq(io->ops->sync_dir(io, "/d"), 0);
    cr_assert_eq(io->ops->pwrite(io, fd, "durable", 7, 0), 7);
    cr_assert_eq(io->ops->fdatasync(io, fd), 0);
    cr_assert_eq(io->ops->pwrite(io, fd, "+lost", 5, 7), 5);
    cr_assert_eq(io->ops->pwrite(io, fd, "D", 1, 0), 1);
    expect("/d/f", "Durable+lost");
    drey_io_fault_crash(fs, false, 0);
    expect("/d/f", "durable");
}

Test(fault, a_file_never_synced_is_empty_after_a_crash) {
    cr_assert_eq(io->ops->mkdir(io, "/d"), 0);
    put("/d/f", "data", false, "/d");
    drey_io_fault_crash(fs, false, 0);
    expect("/d/f", "");
}

Test(fault, a_created_file_not_dir_synced_disappears) {
    cr_assert_eq(io->ops->mkdir(io, "/d"), 0);
    put("/d/kept", "k", true, "/d");
    put("/d/f", "data", true, NULL);
    expect_names("/d", "f kept");
    drey_io_fault_crash(fs, false, 0);
    expect_absent("/d/f");
    expect_names("/d", "kept");
    expect("/d/kept", "k");
}

Test(fault, sync_dir_covers_only_its_own_directory) {
    cr_assert_eq(io->ops->mkdir(io, "/a"), 0);
    cr_assert_eq(io->ops->mkdir(io, "/a/sub"), 0);
    cr_assert_eq(io->ops->mkdir(io, "/b"), 0);
    put("/a/f", "a", true, NULL);
    put("/a/sub/f", "s", true, NULL);
    put("/b/f", "b", true, NULL);
    cr_assert_eq(io->ops->sync_dir(io, "/a"), 0);
    drey_io_fault_crash(fs, false, 0);
    expect("/a/f", "a");
    expect_absent("/a/sub/f");
    expect_absent("/b/f");
    expect_names("/", "a b");
    expect_names("/a", "f sub");
}

Test(fault, rename_without_dir_sync_is_undone) {
    cr_assert_eq(io->ops->mkdir(io, "/d"), 0);
    put("/d/a", "A", true, NULL);
    put("/d/b", "B", true, "/d");
    cr_assert_eq(io->ops->rename(io, "/d/a", "/d/b"), 0);
    cr_assert_eq(io->ops->rename(io, "/d/b", "/d/c"), 0);
    expect_names("/d", "c");
    drey_io_fault_crash(fs, false, 0);
    expect_names("/d", "a b");
    expect("/d/a", "A");
    expect("/d/b", "B");
}

Test(fault, rename_with_dir_sync_is_kept) {
    cr_assert_eq(io->ops->mkdir(io, "/d"), 0);
    put("/d/a", "A", true, NULL);
    put("/d/b", "B", true, "/d");
    cr_assert_eq(io->ops->rename(io, "/d/a", "/d/b"), 0);
    cr_assert_eq(io->ops->sync_dir(io, "/d"), 0);
    drey_io_fault_crash(fs, false, 0);
    expect_names("/d", "b");
    expect("/d/b", "A");
}

Test(fault, unlink_comes_back_unless_dir_synced) {
    cr_assert_eq(io->ops->mkdir(io, "/d"), 0);
    put("/d/a", "A", true, NULL);
    put("/d/b", "B", true, "/d");
    cr_assert_eq(io->ops->unlink(io, "/d/a"), 0);
    cr_assert_eq(io->ops->unlink(io, "/d/b"), 0);
    expect_names("/d", "");
    drey_io_fault_crash(fs, false, 0);
    expect_names("/d", "a b");
    expect("/d/a", "A");
    cr_assert_eq(io->ops->unlink(io, "/d/a"), 0);
    cr_assert_eq(io->ops->sync_dir(io, "/d"), 0);
    drey_io_fault_crash(fs, false, 0);
    expect_names("/d", "b");
}

Test(fault, an_unlinked_file_synced_through_its_fd_comes_back_with_the_new_bytes) {
    cr_assert_eq(io->ops->mkdir(io, "/d"), 0);
    put("/d/a", "old", true, "/d");
    int fd = op_open("/d/a", O_RDWR);
    cr_assert_eq(io->ops->unlink(io, "/d/a"), 0);
    cr_assert_eq(io->ops->pwrite(io, fd, "NEW", 3, 0), 3);
    cr_assert_eq(io->ops->fdatasync(io, fd), 0);
    drey_io_fault_crash(fs, false, 0);
    expect("/d/a", "NEW");
}

Test(fault, mkdir_is_durable_at_once) {
    cr_assert_eq(io->ops->mkdir(io, "/d"), 0);
    cr_assert_eq(io->ops->mkdir(io, "/d/e"), 0);
    drey_io_fault_crash(fs, true, 7);
    expect_names("/", "d");
    expect_names("/d", "e");
}

Test(fault, truncate_and_allocate_are_durable_only_after_sync) {
    cr_assert_eq(io->ops->mkdir(io, "/d"), 0);
    put("/d/f", "0123456789", true, "/d");
    int fd = op_open("/d/f", O_RDWR);
    cr_assert_eq(io->ops->ftruncate(io, fd, 4), 0);
    cr_assert_eq(size_of(fd), 4);
    drey_io_fault_crash(fs, false, 0);
    expect("/d/f", "0123456789");

    fd = op_open("/d/f", O_RDWR);
    cr_assert_eq(io->ops->fallocate(io, fd, 8, 8), 0);
    cr_assert_eq(size_of(fd), 16, "fallocate extends the size");
    char buf[16];
    cr_assert_eq(drey_io_pread_all(io, fd, buf, 16, 0), 0);
    cr_assert(memcmp(buf, "0123456789\0\0\0\0\0\0", 16) == 0, "with zeros past the old end");
    cr_assert_eq(io->ops->fallocate(io, fd, 0, 4), 0);
    cr_assert_eq(size_of(fd), 16, "fallocate inside the file changes nothing");
    cr_assert_eq(io->ops->fallocate(io, fd, 0, 0), -EINVAL);
    drey_io_fault_crash(fs, false, 0);
    fd = op_open("/d/f", O_RDWR);
    cr_assert_eq(size_of(fd), 10, "an unsynced fallocate is lost");

    cr_assert_eq(io->ops->fallocate(io, fd, 0, 4096), 0);
    cr_assert_eq(io->ops->ftruncate(io, fd, 2), 0);
    cr_assert_eq(io->ops->ftruncate(io, fd, 6), 0);
    cr_assert_eq(io->ops->fdatasync(io, fd), 0);
    drey_io_fault_crash(fs, false, 0);
    fd = op_open("/d/f", O_RDONLY);
    cr_assert_eq(size_of(fd), 6, "the synced truncates and allocate, in order");
    cr_assert_eq(drey_io_pread_all(io, fd, buf, 6, 0), 0);
    cr_assert(memcmp(buf, "01\0\0\0\0", 6) == 0);
}

Test(fault, o_trunc_not_synced_is_undone) {
    cr_assert_eq(io->ops->mkdir(io, "/d"), 0);
    put("/d/f", "keep", true, "/d");
    int fd = op_open("/d/f", O_WRONLY | O_TRUNC);
    cr_assert_eq(size_of(fd), 0);
    drey_io_fault_crash(fs, false, 0);
    expect("/d/f", "keep");
}

Test(fault, fds_are_invalid_after_a_crash_and_the_fs_stays_usable) {
    cr_assert_eq(io->ops->mkdir(io, "/d"), 0);
    put("/d/f", "x", true, "/d");
    int fd = op_open("/d/f", O_RDWR);
    int fd2 = op_open("/d/g", O_RDWR | O_CREAT);
    drey_io_fault_crash(fs, false, 0);
    char buf[4];
    off_t size;
    cr_assert_eq(io->ops->pwrite(io, fd, "y", 1, 0), -EBADF);
    cr_assert_eq(io->ops->pread(io, fd, buf, 1, 0), -EBADF);
    cr_assert_eq(io->ops->fdatasync(io, fd), -EBADF);
    cr_assert_eq(io->ops->fallocate(io, fd, 0, 10), -EBADF);
    cr_assert_eq(io->ops->ftruncate(io, fd, 0), -EBADF);
    cr_assert_eq(io->ops->fsize(io, fd, &size), -EBADF);
    cr_assert_eq(io->ops->close(io, fd), -EBADF);
    cr_assert_eq(io->ops->close(io, fd2), -EBADF);

    /* A restart: descriptor numbers are never reused, so a stale one cannot
     * reach a file opened after the crash. */
    int nfd = op_open("/d/f", O_RDWR);
    cr_assert_geq(nfd, 0);
    cr_assert_neq(nfd, fd);
    cr_assert_neq(nfd, fd2);
    cr_assert_eq(io->ops->pwrite(io, fd, "y", 1, 0), -EBADF);
    cr_assert_eq(io->ops->pwrite(io, nfd, "z", 1, 1), 1);
    cr_assert_eq(io->ops->fdatasync(io, nfd), 0);
    drey_io_fault_crash(fs, false, 0);
    expect("/d/f", "xz");
}

Test(fault, destroy_frees_open_files_and_unlinked_inodes) {
    cr_assert_eq(io->ops->mkdir(io, "/d"), 0);
    put("/d/a", "A", true, "/d");
    int fd = op_open("/d/a", O_RDWR);
    cr_assert_eq(io->ops->pwrite(io, fd, "unsynced", 8, 0), 8);
    cr_assert_eq(io->ops->unlink(io, "/d/a"), 0);
    cr_assert_geq(op_open("/d/b", O_RDWR | O_CREAT), 0);
    /* fs_teardown destroys it; ASan's leak check holds the test to it. */
}

/* --- torn crashes ---------------------------------------------------------------- */

#define SECTORS 8

/* A fresh file system holding /d/f = SECTORS sectors of 'o', durable, then
 * overwritten in one unsynced pwrite with 'n'; crashed torn with seed.
 * Returns the mask of sectors that hold the new bytes. */
static unsigned torn_overwrite(uint32_t seed) {
    drey_io_fault *f = drey_io_fault_create();
    drey_io *fio = drey_io_fault_io(f);
    uint8_t old[SECTORS * 512], neu[SECTORS * 512], got[SECTORS * 512];
    memset(old, 'o', sizeof old);
    memset(neu, 'n', sizeof neu);
    cr_assert_eq(fio->ops->mkdir(fio, "/d"), 0);
    int fd = fio->ops->open(fio, "/d/f", O_RDWR | O_CREAT, 0644);
    cr_assert_eq(drey_io_pwrite_all(fio, fd, old, sizeof old, 0), 0);
    cr_assert_eq(fio->ops->fdatasync(fio, fd), 0);
    cr_assert_eq(fio->ops->sync_dir(fio, "/d"), 0);
    cr_assert_eq(drey_io_pwrite_all(fio, fd, neu, sizeof neu, 0), 0);
    drey_io_fault_crash(f, true, seed);
    fd = fio->ops->open(fio, "/d/f", O_RDONLY, 0);
    off_t size;
    cr_assert_eq(fio->ops->fsize(fio, fd, &size), 0);
    cr_assert_eq(size, (off_t)sizeof got);
    cr_assert_eq(drey_io_pread_all(fio, fd, got, sizeof got, 0), 0);
    unsigned mask = 0;
    for (int s = 0; s < SECTORS; s++) {
        const uint8_t *p = got + s * 512;
        uint8_t c = p[0];
        cr_assert(c == 'o' || c == 'n', "sector %d holds %#x", s, c);
        for (int i = 1; i < 512; i++)
            cr_assert_eq(p[i], c, "sector %d is torn inside itself at %d", s, i);
        if (c == 'n')
            mask |= 1u << s;
    }
    drey_io_fault_destroy(f);
    return mask;
}

Test(fault, a_torn_crash_keeps_a_seed_dependent_subset_of_sectors) {
    unsigned seen_kept = 0, seen_lost = 0;
    bool masks[1u << SECTORS] = {false};
    int distinct = 0;
    for (uint32_t seed = 0; seed < 64; seed++) {
        unsigned m = torn_overwrite(seed);
        cr_assert_eq(torn_overwrite(seed), m, "seed %u is not deterministic", seed);
        seen_kept |= m;
        seen_lost |= ~m & ((1u << SECTORS) - 1);
        if (!masks[m]) {
            masks[m] = true;
            distinct++;
        }
    }
    cr_assert_eq(seen_kept, (1u << SECTORS) - 1, "every sector survives under some seed");
    cr_assert_eq(seen_lost, (1u << SECTORS) - 1, "every sector is lost under some seed");
    cr_assert_geq(distinct, 32, "seeds give different subsets (%d of 64)", distinct);
}

Test(fault, a_torn_crash_splits_unaligned_writes_at_sector_boundaries) {
    bool seen[4] = {false};
    for (uint32_t seed = 0; seed < 64; seed++) {
        drey_io_fault *f = drey_io_fault_create();
        drey_io *fio = drey_io_fault_io(f);
        uint8_t buf[1024];
        memset(buf, 'o', sizeof buf);
        int fd = fio->ops->open(fio, "f", O_RDWR | O_CREAT, 0644);
        cr_assert_eq(drey_io_pwrite_all(fio, fd, buf, sizeof buf, 0), 0);
        cr_assert_eq(fio->ops->fdatasync(fio, fd), 0);
        cr_assert_eq(fio->ops->sync_dir(fio, "."), 0);
        memset(buf, 'n', 100);
        cr_assert_eq(drey_io_pwrite_all(fio, fd, buf, 100, 500), 0);
        drey_io_fault_crash(f, true, seed);
        fd = fio->ops->open(fio, "f", O_RDONLY, 0);
        cr_assert_eq(drey_io_pread_all(fio, fd, buf, sizeof buf, 0), 0);
        for (int i = 0; i < 1024; i++)
            if (i < 500 || i >= 600)
                cr_assert_eq(buf[i], 'o', "byte %d outside the write", i);
        bool first = buf[500] == 'n', second = buf[512] == 'n';
        for (int i = 500; i < 512; i++)
            cr_assert_eq(buf[i] == 'n', first);
        for (int i = 512; i < 600; i++)
            cr_assert_eq(buf[i] == 'n', second);
        seen[first * 2 + second] = true;
        drey_io_fault_destroy(f);
    }
    for (int i = 0; i < 4; i++)
        cr_assert(seen[i], "combination %d never happened", i);
}

Test(fault, a_torn_append_extends_the_file_only_as_far_as_a_surviving_sector) {
    bool saw_empty = false, saw_full = false, saw_gap = false;
    for (uint32_t seed = 0; seed < 64; seed++) {
        drey_io_fault *f = drey_io_fault_create();
        drey_io *fio = drey_io_fault_io(f);
        int fd = fio->ops->open(fio, "f", O_RDWR | O_CREAT, 0644);
        cr_assert_eq(fio->ops->sync_dir(fio, "."), 0);
        uint8_t buf[2048];
        memset(buf, 'n', sizeof buf);
        cr_assert_eq(drey_io_pwrite_all(fio, fd, buf, sizeof buf, 0), 0);
        drey_io_fault_crash(f, true, seed);
        fd = fio->ops->open(fio, "f", O_RDONLY, 0);
        off_t size;
        cr_assert_eq(fio->ops->fsize(fio, fd, &size), 0);
        cr_assert_eq(size % 512, 0);
        cr_assert_leq(size, 2048);
        memset(buf, 0xee, sizeof buf);
        cr_assert_eq(drey_io_pread_all(fio, fd, buf, (size_t)size, 0), 0);
        for (off_t s = 0; s < size / 512; s++) {
            uint8_t c = buf[s * 512];
            cr_assert(c == 'n' || c == 0, "sector %ld holds %#x", (long)s, c);
            for (int i = 1; i < 512; i++)
                cr_assert_eq(buf[s * 512 + i], c);
            if (c == 0)
                saw_gap = true;
        }
        if (size > 0)
            cr_assert_eq(buf[size - 1], 'n', "the last sector is one that survived");
        saw_empty |= size == 0;
        saw_full |= size == 2048;
        drey_io_fault_destroy(f);
    }
    cr_assert(saw_empty && saw_full && saw_gap);
}

Test(fault, synced_bytes_are_never_torn_and_a_clean_crash_tears_nothing) {
    uint8_t buf[4096], got[8192];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (uint8_t)(i * 7);
    for (uint32_t seed = 0; seed < 32; seed++) {
        for (int torn = 0; torn <= 1; torn++) {
            fs_teardown();
            fs_setup();
            cr_assert_eq(io->ops->mkdir(io, "/d"), 0);
            int fd = op_open("/d/f", O_RDWR | O_CREAT);
            cr_assert_eq(drey_io_pwrite_all(io, fd, buf, sizeof buf, 0), 0);
            cr_assert_eq(io->ops->fdatasync(io, fd), 0);
            cr_assert_eq(io->ops->sync_dir(io, "/d"), 0);
            /* Unsynced bytes after the synced ones. */
            memset(got, 'g', sizeof got);
            cr_assert_eq(drey_io_pwrite_all(io, fd, got, 4096, 4096), 0);
            drey_io_fault_crash(fs, torn, seed);
            fd = op_open("/d/f", O_RDONLY);
            off_t size = size_of(fd);
            cr_assert_geq(size, 4096, "seed %u torn %d", seed, torn);
            cr_assert(torn || size == 4096, "a clean crash keeps exactly the synced bytes");
            cr_assert_eq(drey_io_pread_all(io, fd, got, (size_t)size, 0), 0);
            cr_assert(memcmp(got, buf, sizeof buf) == 0, "seed %u torn %d", seed, torn);
        }
    }
}

/* --- fault injection ---------------------------------------------------------- */

Test(fault, the_nth_write_fails_once_and_changes_nothing) {
    int fd = op_open("f", O_RDWR | O_CREAT);
    cr_assert_eq(io->ops->pwrite(io, fd, "aa", 2, 0), 2, "before arming: not counted");
    drey_io_fault_fail_write(fs, 3, EIO, false);
    cr_assert_eq(io->ops->pwrite(io, fd, "b", 1, 2), 1);
    cr_assert_eq(io->ops->pwrite(io, 999, "x", 1, 0), -EBADF, "an invalid fd does not count");
    cr_assert_eq(io->ops->pwrite(io, fd, "c", 1, 3), 1);
    cr_assert_eq(io->ops->pwrite(io, fd, "XXXX", 4, 0), -EIO);
    cr_assert_eq(size_of(fd), 4);
    char buf[8];
    cr_assert_eq(io->ops->pread(io, fd, buf, 8, 0), 4);
    cr_assert(memcmp(buf, "aabc", 4) == 0, "the failed write changed nothing");
    cr_assert_eq(io->ops->pwrite(io, fd, "d", 1, 4), 1, "not sticky");
    drey_io_fault_stats s = stats();
    cr_assert_eq(s.writes, 4, "failed writes are not counted");
    cr_assert_eq(s.bytes_written, 5);
}

Test(fault, a_sticky_write_fault_fails_every_later_write_until_disarmed) {
    int fd = op_open("f", O_RDWR | O_CREAT);
    drey_io_fault_fail_write(fs, 2, ENOSPC, true);
    cr_assert_eq(io->ops->pwrite(io, fd, "a", 1, 0), 1);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(io->ops->pwrite(io, fd, "b", 1, 1), -ENOSPC);
    cr_assert_eq(size_of(fd), 1);
    drey_io_fault_fail_write(fs, 0, 0, false);
    cr_assert_eq(io->ops->pwrite(io, fd, "b", 1, 1), 1, "0 disarms");
    drey_io_fault_fail_write(fs, 1, EIO, false);
    cr_assert_eq(io->ops->pwrite(io, fd, "c", 1, 2), -EIO, "1 is the next one");
    cr_assert_eq(io->ops->pwrite(io, fd, "c", 1, 2), 1);
}

Test(fault, the_nth_sync_fails_counting_dir_syncs_and_makes_nothing_durable) {
    cr_assert_eq(io->ops->mkdir(io, "/d"), 0);
    int fd = op_open("/d/f", O_RDWR | O_CREAT);
    cr_assert_eq(io->ops->pwrite(io, fd, "x", 1, 0), 1);
    drey_io_fault_fail_sync(fs, 2, EIO, false);
    cr_assert_eq(io->ops->fdatasync(io, fd), 0);
    cr_assert_eq(io->ops->sync_dir(io, "/nodir"), -ENOENT, "a missing dir does not count");
    cr_assert_eq(io->ops->sync_dir(io, "/d"), -EIO, "sync_dir is the 2nd sync");
    drey_io_fault_crash(fs, false, 0);
    expect_absent("/d/f");

    fd = op_open("/d/f", O_RDWR | O_CREAT);
    cr_assert_eq(io->ops->sync_dir(io, "/d"), 0);
    cr_assert_eq(io->ops->pwrite(io, fd, "y", 1, 0), 1);
    drey_io_fault_fail_sync(fs, 1, EIO, true);
    cr_assert_eq(io->ops->fdatasync(io, fd), -EIO);
    cr_assert_eq(io->ops->fdatasync(io, fd), -EIO, "sticky");
    cr_assert_eq(io->ops->sync_dir(io, "/d"), -EIO, "sticky, dir syncs too");
    drey_io_fault_crash(fs, false, 0);
    expect("/d/f", "");
    drey_io_fault_stats s = stats();
    cr_assert_eq(s.syncs, 2);
    cr_assert_eq(s.dir_syncs, 1);
}

Test(fault, the_nth_allocate_fails_with_enospc) {
    int fd = op_open("f", O_RDWR | O_CREAT);
    drey_io_fault_fail_allocate(fs, 2, ENOSPC, false);
    cr_assert_eq(io->ops->fallocate(io, fd, 0, 100), 0);
    cr_assert_eq(io->ops->fallocate(io, fd, 0, 1 << 20), -ENOSPC);
    cr_assert_eq(size_of(fd), 100, "the failed fallocate changed nothing");
    cr_assert_eq(io->ops->fallocate(io, fd, 0, 200), 0);
    cr_assert_eq(size_of(fd), 200);
    drey_io_fault_fail_allocate(fs, 1, ENOSPC, true);
    cr_assert_eq(io->ops->fallocate(io, fd, 0, 300), -ENOSPC);
    cr_assert_eq(io->ops->fallocate(io, fd, 0, 300), -ENOSPC);
    cr_assert_eq(io->ops->pwrite(io, fd, "w", 1, 0), 1, "writes are not affected");
    cr_assert_eq(io->ops->fdatasync(io, fd), 0, "syncs are not affected");
    drey_io_fault_fail_allocate(fs, 0, 0, false);
    cr_assert_eq(io->ops->fallocate(io, fd, 0, 300), 0);
}

Test(fault, a_crash_disarms_injected_faults) {
    drey_io_fault_fail_write(fs, 1, EIO, true);
    drey_io_fault_fail_sync(fs, 1, EIO, true);
    drey_io_fault_fail_allocate(fs, 1, ENOSPC, true);
    drey_io_fault_crash(fs, false, 0);
    int fd = op_open("f", O_RDWR | O_CREAT);
    cr_assert_eq(io->ops->pwrite(io, fd, "a", 1, 0), 1);
    cr_assert_eq(io->ops->fallocate(io, fd, 0, 10), 0);
    cr_assert_eq(io->ops->fdatasync(io, fd), 0);
}

Test(fault, stats_count_successful_calls) {
    cr_assert_eq(io->ops->mkdir(io, "/d"), 0);
    int fd = op_open("/d/f", O_RDWR | O_CREAT);
    cr_assert_eq(io->ops->pwrite(io, fd, "abc", 3, 0), 3);
    cr_assert_eq(io->ops->pwrite(io, fd, "de", 2, 3), 2);
    cr_assert_eq(io->ops->fdatasync(io, fd), 0);
    cr_assert_eq(io->ops->sync_dir(io, "/d"), 0);
    cr_assert_eq(io->ops->sync_dir(io, "/"), 0);
    drey_io_fault_stats s = stats();
    cr_assert_eq(s.writes, 2);
    cr_assert_eq(s.bytes_written, 5);
    cr_assert_eq(s.syncs, 3, "fdatasync + sync_dir");
    cr_assert_eq(s.dir_syncs, 2);
    drey_io_fault_crash(fs, false, 0);
    s = stats();
    cr_assert_eq(s.writes, 2, "stats survive a crash");
}

/* --- drey_io_write_file_atomic under every crash point ------------------------------ */

/* A drey_io that forwards its first `budget` calls to the fault FS and fails
 * every later one with -EIO: the power goes out after call `budget`. */
typedef struct cut_io {
    drey_io io; /* first */
    drey_io *inner;
    int budget;
} cut_io;

static bool cut_pass(drey_io *io_) {
    cut_io *c = (cut_io *)io_;
    if (c->budget <= 0)
        return false;
    c->budget--;
    return true;
}
#define INNER(io_) (((cut_io *)(io_))->inner)

static int cut_open(drey_io *c, const char *p, int fl, int m) {
    return cut_pass(c) ? INNER(c)->ops->open(INNER(c), p, fl, m) : -EIO;
}
static int cut_close(drey_io *c, int fd) {
    return cut_pass(c) ? INNER(c)->ops->close(INNER(c), fd) : -EIO;
}
static ssize_t cut_pwrite(drey_io *c, int fd, const void *b, size_t n, off_t o) {
    return cut_pass(c) ? INNER(c)->ops->pwrite(INNER(c), fd, b, n, o) : -EIO;
}
static ssize_t cut_pread(drey_io *c, int fd, void *b, size_t n, off_t o) {
    return cut_pass(c) ? INNER(c)->ops->pread(INNER(c), fd, b, n, o) : -EIO;
}
static int cut_fdatasync(drey_io *c, int fd) {
    return cut_pass(c) ? INNER(c)->ops->fdatasync(INNER(c), fd) : -EIO;
}
static int cut_fallocate(drey_io *c, int fd, off_t o, off_t l) {
    return cut_pass(c) ? INNER(c)->ops->fallocate(INNER(c), fd, o, l) : -EIO;
}
static int cut_ftruncate(drey_io *c, int fd, off_t l) {
    return cut_pass(c) ? INNER(c)->ops->ftruncate(INNER(c), fd, l) : -EIO;
}
static int cut_fsize(drey_io *c, int fd, off_t *s) {
    return cut_pass(c) ? INNER(c)->ops->fsize(INNER(c), fd, s) : -EIO;
}
static int cut_rename(drey_io *c, const char *a, const char *b) {
    return cut_pass(c) ? INNER(c)->ops->rename(INNER(c), a, b) : -EIO;
}
static int cut_unlink(drey_io *c, const char *p) {
    return cut_pass(c) ? INNER(c)->ops->unlink(INNER(c), p) : -EIO;
}
static int cut_mkdir(drey_io *c, const char *p) {
    return cut_pass(c) ? INNER(c)->ops->mkdir(INNER(c), p) : -EIO;
}
static int cut_sync_dir(drey_io *c, const char *p) {
    return cut_pass(c) ? INNER(c)->ops->sync_dir(INNER(c), p) : -EIO;
}
static int cut_list_dir(drey_io *c, const char *p, char ***names, size_t *n) {
    return cut_pass(c) ? INNER(c)->ops->list_dir(INNER(c), p, names, n) : -EIO;
}

static const drey_io_ops cut_ops = {
    .open = cut_open,
    .close = cut_close,
    .pwrite = cut_pwrite,
    .pread = cut_pread,
    .fdatasync = cut_fdatasync,
    .fallocate = cut_fallocate,
    .ftruncate = cut_ftruncate,
    .fsize = cut_fsize,
    .rename = cut_rename,
    .unlink = cut_unlink,
    .mkdir = cut_mkdir,
    .sync_dir = cut_sync_dir,
    .list_dir = cut_list_dir,
};

#define OLD_CONTENT "the old manifest"
#define NEW_CONTENT "the new manifest, which is longer than the old one"

/* /d/m after a crash: 1 if old, 2 if new, 0 if absent; fails on anything
 * else (a mix, a tail, a stray temporary file). */
static int atomic_outcome(bool had_old) {
    char **names;
    size_t n;
    cr_assert_eq(io->ops->list_dir(io, "/d", &names, &n), 0);
    cr_assert_leq(n, 1, "only the target may survive");
    if (n == 1)
        cr_assert_str_eq(names[0], "m");
    drey_io_free_names(names, n);
    uint8_t *data;
    size_t len;
    int rc = drey_io_read_file(io, "/d/m", &data, &len);
    if (rc == -ENOENT) {
        cr_assert(!had_old, "the old file was lost");
        return 0;
    }
    cr_assert_eq(rc, 0);
    int which = 0;
    if (len == strlen(OLD_CONTENT) && memcmp(data, OLD_CONTENT, len) == 0)
        which = 1;
    else if (len == strlen(NEW_CONTENT) && memcmp(data, NEW_CONTENT, len) == 0)
        which = 2;
    free(data);
    cr_assert_neq(which, 0, "neither the old nor the new content (%zu bytes)", len);
    cr_assert(which == 2 || had_old);
    return which;
}

static void atomic_setup(bool had_old) {
    cr_assert_eq(io->ops->mkdir(io, "/d"), 0);
    if (had_old)
        cr_assert_eq(drey_io_write_file_atomic(io, "/d", "m", OLD_CONTENT, strlen(OLD_CONTENT)), 0);
}

Test(fault, write_file_atomic_survives_a_crash_after_every_call) {
    /* open, pwrite, fdatasync, close, rename, sync_dir: 6 calls; the new
     * content is durable exactly when the sync_dir went through. */
    for (int had_old = 0; had_old <= 1; had_old++) {
        for (int budget = 0; budget <= 7; budget++) {
            for (int torn = 0; torn <= 1; torn++) {
                for (uint32_t seed = 0; seed < (torn ? 8u : 1u); seed++) {
                    fs_teardown();
                    fs_setup();
                    atomic_setup(had_old);
                    cut_io c = {.io = {.ops = &cut_ops}, .inner = io, .budget = budget};
                    int rc = drey_io_write_file_atomic(&c.io, "/d", "m", NEW_CONTENT, strlen(NEW_CONTENT));
                    cr_assert_eq(rc == 0, budget >= 6, "budget %d: rc %d", budget, rc);
                    drey_io_fault_crash(fs, torn, seed);
                    int which = atomic_outcome(had_old);
                    cr_assert_eq(which, budget >= 6 ? 2 : had_old, "had_old %d budget %d torn %d seed %u: %d",
                                 had_old, budget, torn, seed, which);
                }
            }
        }
    }
}

Test(fault, write_file_atomic_survives_a_failed_write_or_sync_then_a_crash) {
    /* fault: 0 none, 1 the write, 2 the file sync, 3 the dir sync. */
    for (int had_old = 0; had_old <= 1; had_old++) {
        for (int fault = 0; fault <= 3; fault++) {
            for (int torn = 0; torn <= 1; torn++) {
                for (uint32_t seed = 0; seed < (torn ? 8u : 1u); seed++) {
                    fs_teardown();
                    fs_setup();
                    atomic_setup(had_old);
                    if (fault == 1)
                        drey_io_fault_fail_write(fs, 1, EIO, false);
                    else if (fault >= 2)
                        drey_io_fault_fail_sync(fs, (unsigned)fault - 1, EIO, false);
                    int rc = drey_io_write_file_atomic(io, "/d", "m", NEW_CONTENT, strlen(NEW_CONTENT));
                    cr_assert_eq(rc, fault == 0 ? 0 : -EIO);
                    if (fault == 3)
                        expect("/d/m", NEW_CONTENT); /* renamed, not yet durable */
                    drey_io_fault_crash(fs, torn, seed);
                    cr_assert_eq(atomic_outcome(had_old), fault == 0 ? 2 : had_old);
                }
            }
        }
    }
}

/* --- threads -------------------------------------------------------------------- */

typedef struct writer_arg {
    const char *path;
    int rounds;
} writer_arg;

static void *writer(void *p) {
    writer_arg *a = p;
    int fd = op_open(a->path, O_RDWR | O_CREAT);
    cr_assert_geq(fd, 0);
    for (int i = 0; i < a->rounds; i++) {
        uint32_t v = (uint32_t)i;
        cr_assert_eq(io->ops->pwrite(io, fd, &v, sizeof v, (off_t)i * 4), 4);
        if (i % 10 == 0)
            cr_assert_eq(io->ops->fdatasync(io, fd), 0);
    }
    cr_assert_eq(io->ops->fdatasync(io, fd), 0);
    io->ops->close(io, fd);
    return NULL;
}

Test(fault, concurrent_callers_share_one_lock) {
    cr_assert_eq(io->ops->mkdir(io, "/d"), 0);
    writer_arg a = {"/d/a", 2000}, b = {"/d/b", 2000};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, writer, &a);
    pthread_create(&tb, NULL, writer, &b);
    for (int i = 0; i < 200; i++) {
        char **names;
        size_t n;
        cr_assert_eq(io->ops->list_dir(io, "/d", &names, &n), 0);
        drey_io_free_names(names, n);
        drey_io_fault_stats s;
        drey_io_fault_get_stats(fs, &s);
    }
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    cr_assert_eq(io->ops->sync_dir(io, "/d"), 0);
    drey_io_fault_crash(fs, false, 0);
    drey_io_fault_stats s = stats();
    cr_assert_eq(s.writes, 4000);
    cr_assert_eq(s.bytes_written, 16000);
    const char *paths[] = {"/d/a", "/d/b"};
    for (int k = 0; k < 2; k++) {
        uint8_t *data;
        size_t n;
        cr_assert_eq(drey_io_read_file(io, paths[k], &data, &n), 0);
        cr_assert_eq(n, 8000);
        for (uint32_t i = 0; i < 2000; i++) {
            uint32_t v;
            memcpy(&v, data + i * 4, 4);
            cr_assert_eq(v, i);
        }
        free(data);
    }
}

/* fs_space: not reported until set; then the size less every file's bytes
 * (an unlinked file still open included); or the failure asked for. */
Test(fault, fs_space_reports_what_was_set_less_the_files) {
    uint64_t total = 1, avail = 1;
    cr_assert_eq(io->ops->fs_space(io, "/", &total, &avail), -ENOTSUP);
    drey_io_fault_set_space(fs, 1 << 20, 0);
    cr_assert_eq(io->ops->fs_space(io, "/", &total, &avail), 0);
    cr_assert_eq(total, 1 << 20);
    cr_assert_eq(avail, 1 << 20);
    int fd = io->ops->open(io, "/a", O_RDWR | O_CREAT, 0644);
    cr_assert_geq(fd, 0);
    cr_assert_eq(io->ops->fallocate(io, fd, 0, 300000), 0);
    cr_assert_eq(io->ops->fs_space(io, "/", &total, &avail), 0);
    cr_assert_eq(avail, (1 << 20) - 300000);
    cr_assert_eq(io->ops->unlink(io, "/a"), 0);
    cr_assert_eq(io->ops->fs_space(io, "/", &total, &avail), 0);
    cr_assert_eq(avail, (1 << 20) - 300000, "an open file keeps its space");
    cr_assert_eq(io->ops->close(io, fd), 0);
    cr_assert_eq(io->ops->fs_space(io, "/", &total, &avail), 0);
    cr_assert_eq(avail, 1 << 20);
    drey_io_fault_set_space(fs, 1000, 0);
    fd = io->ops->open(io, "/b", O_RDWR | O_CREAT, 0644);
    cr_assert_eq(io->ops->fallocate(io, fd, 0, 4096), 0);
    cr_assert_eq(io->ops->fs_space(io, "/", &total, &avail), 0);
    cr_assert_eq(avail, 0, "more files than space: nothing available, not a wrap-around");
    io->ops->close(io, fd);
    drey_io_fault_set_space(fs, 1 << 20, EIO);
    cr_assert_eq(io->ops->fs_space(io, "/", &total, &avail), -EIO);
}
