/*
 * io — the one small interface every journal, snapshot and manifest byte
 * goes through.
 *
 * Production uses drey_io_posix(). Tests use drey_io_fault (below): an
 * in-memory file system that can fail the Nth write or sync with EIO or
 * ENOSPC and can simulate a crash that loses everything not yet made durable,
 * in the manner of SQLite's crash-test VFS. A file's bytes are durable after
 * fdatasync/fsync of that file; a name (create, rename, unlink) is durable
 * after sync_dir of its directory.
 *
 * Every function returns 0 (or a count) on success and -errno on failure.
 */
#ifndef DREY_IO_H
#define DREY_IO_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct drey_io drey_io;

typedef struct drey_io_ops {
    int (*open)(drey_io *io, const char *path, int flags, int mode); /* O_* flags; returns fd */
    int (*close)(drey_io *io, int fd);
    ssize_t (*pwrite)(drey_io *io, int fd, const void *buf, size_t n, off_t off);
    ssize_t (*pread)(drey_io *io, int fd, void *buf, size_t n, off_t off);
    int (*fdatasync)(drey_io *io, int fd);
    int (*fallocate)(drey_io *io, int fd, off_t off, off_t len); /* reserve, extending the size */
    int (*ftruncate)(drey_io *io, int fd, off_t len);
    int (*fsize)(drey_io *io, int fd, off_t *size);
    int (*rename)(drey_io *io, const char *from, const char *to);
    int (*unlink)(drey_io *io, const char *path);
    int (*mkdir)(drey_io *io, const char *path); /* durable on return; 0 if it already exists */
    int (*sync_dir)(drey_io *io, const char *path);
    /* The names in a directory (no . or ..), sorted; free with drey_io_free_names. */
    int (*list_dir)(drey_io *io, const char *path, char ***names, size_t *n);
    /* Takes an exclusive advisory lock on path (created if absent) without
     * waiting: returns an fd to close() to release, or -EWOULDBLOCK when
     * another process holds it. Optional (NULL: no locking). */
    int (*lock)(drey_io *io, const char *path);
    /* The file system holding path: its size and the bytes an unprivileged
     * writer may still allocate (statvfs f_blocks and f_bavail). Optional
     * (NULL: unknown, and no journal cap is derived from it). */
    int (*fs_space)(drey_io *io, const char *path, uint64_t *total_bytes, uint64_t *avail_bytes);
} drey_io_ops;

struct drey_io {
    const drey_io_ops *ops;
};

/* The real file system. */
drey_io *drey_io_posix(void);

/* For watchers that poll files for rotation: a number that changes when
 * the file at path is replaced, rewritten, renamed over, appears or goes
 * (device, inode, size, times, mode, links), mixed into h with FNV-1a
 * (drey_io_fnv) so that several files make one. */
#define DREY_IO_FNV_OFFSET 0xcbf29ce484222325ULL
uint64_t drey_io_fnv(uint64_t h, const void *p, size_t n);
uint64_t drey_io_fingerprint(uint64_t h, const char *path);

/* A thread that calls poll(arg) every interval until stopped: the watchers
 * of the key files and of the authorization policy, which fingerprint what
 * they watch and reload when it changed. Polling, not inotify: it sees
 * through the symlink swaps Kubernetes uses for mounted secrets and config
 * maps, and costs a few stat(2) calls per interval. Start and stop may be
 * called from any thread, any number of times; one thread at most runs. */
typedef struct drey_io_poller {
    pthread_mutex_t ctl; /* serializes start and stop */
    pthread_mutex_t mu;  /* guards running and stopping */
    pthread_cond_t cv;   /* signalled to stop */
    pthread_t thread;
    bool running, stopping;
    int64_t interval_ms;
    void (*poll)(void *arg);
    void *arg;
    const char *what; /* "auth key watcher": for the log */
} drey_io_poller;

void drey_io_poller_init(drey_io_poller *p, const char *what, void (*poll)(void *arg), void *arg);
/* Starts the thread unless it runs. One that cannot be started is logged
 * and done without: a reload is still asked for by SIGHUP. */
void drey_io_poller_start(drey_io_poller *p, int64_t interval_ms);
void drey_io_poller_stop(drey_io_poller *p);
/* Stops it, then frees what init made. */
void drey_io_poller_destroy(drey_io_poller *p);

/* Loops over short writes/reads; -errno on failure, -EIO on a short read
 * past the end of the file. */
int drey_io_pwrite_all(drey_io *io, int fd, const void *buf, size_t n, off_t off);
int drey_io_pread_all(drey_io *io, int fd, void *buf, size_t n, off_t off);

/* Writes a whole file atomically and durably: a temporary file next to it,
 * fdatasync, rename over `path`, sync of the directory. */
int drey_io_write_file_atomic(drey_io *io, const char *dir, const char *name, const void *data, size_t n);

/* Puts a file written under tmp in place as dst, durably: when rc (the
 * writing's result so far) is 0, syncs and closes fd, renames tmp to dst
 * and syncs dir (dst's directory); on any failure closes fd and removes
 * tmp. fd < 0: nothing to close. Returns the first failure, or 0. */
int drey_io_install(drey_io *io, int fd, int rc, const char *tmp, const char *dst, const char *dir);
/* Reads a whole file (malloc'd). */
int drey_io_read_file(drey_io *io, const char *path, uint8_t **data, size_t *n);

void drey_io_free_names(char **names, size_t n);

/* --- the faulting, crashing in-memory file system (for tests) ----------- */

typedef struct drey_io_fault drey_io_fault;

drey_io_fault *drey_io_fault_create(void);
void drey_io_fault_destroy(drey_io_fault *f);
drey_io *drey_io_fault_io(drey_io_fault *f);

/* The Nth pwrite (fdatasync, fallocate) from now, counting from 1, fails
 * with -err, and so does every one after it when `sticky`. 0 disarms. */
void drey_io_fault_fail_write(drey_io_fault *f, unsigned nth, int err, bool sticky);
void drey_io_fault_fail_sync(drey_io_fault *f, unsigned nth, int err, bool sticky);
void drey_io_fault_fail_allocate(drey_io_fault *f, unsigned nth, int err, bool sticky);
/* The same for unlink (counted on an existing file). */
void drey_io_fault_fail_unlink(drey_io_fault *f, unsigned nth, int err, bool sticky);

/* While held, every unlink waits, before it acts, until released: a slow
 * disk's deletion, for tests of what holds a lock across one. */
void drey_io_fault_hold_unlinks(drey_io_fault *f, bool hold);
/* Waits until at least n unlinks are held; false if timeout_ms passed
 * first. */
bool drey_io_fault_wait_unlinks_held(drey_io_fault *f, unsigned n, int64_t timeout_ms);

/* Simulates power loss: every file reverts to its durable bytes and every
 * directory to its durable names. With torn=true, each 512-byte sector of
 * each write not yet made durable survives or not at random (seeded), as a
 * disk may persist some sectors of an interrupted write and not others.
 * Open descriptors become invalid (-EBADF). */
void drey_io_fault_crash(drey_io_fault *f, bool torn, uint32_t seed);

/* What fs_space reports: a file system of total_bytes, less the bytes of
 * every file in it (0: not reported, -ENOTSUP), or a failure with -err
 * when err != 0. Nothing is refused for want of space. */
void drey_io_fault_set_space(drey_io_fault *f, uint64_t total_bytes, int err);

/* Counts, for assertions. */
typedef struct drey_io_fault_stats {
    uint64_t writes, syncs, dir_syncs, bytes_written;
} drey_io_fault_stats;
void drey_io_fault_get_stats(drey_io_fault *f, drey_io_fault_stats *out);

#endif
