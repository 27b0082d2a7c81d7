/*
 * io — the faulting, crashing in-memory file system for tests; see
 * include/drey/io.h.
 *
 * The model, in the manner of SQLite's crash-test VFS:
 *
 * - Whole paths are keys. Directories exist once made with mkdir, which is
 *   durable at once; "/" and "." always exist. A path is normalized by
 *   collapsing repeated slashes and dropping a trailing one; "." and ".."
 *   components are not interpreted.
 * - A file (inode) has current bytes, which pwrite, ftruncate, fallocate and
 *   O_TRUNC change, and durable bytes, which fdatasync makes equal to the
 *   current ones (size included). Every change since the last fdatasync is
 *   kept in the inode's log, in order.
 * - A name is an entry: path -> current inode and path -> durable inode.
 *   create, rename and unlink change the current side at once; sync_dir(d)
 *   copies the current side to the durable side for every entry whose parent
 *   is d. An inode lives while a current name, a durable name or an open
 *   descriptor refers to it, so an unlinked or renamed-over file stays
 *   readable through its descriptors.
 * - drey_io_fault_crash: every open descriptor is invalidated, every entry's
 *   current side reverts to its durable side, and every file to its durable
 *   bytes. With torn=true the file's log is then replayed over the durable
 *   bytes with a seeded coin per piece: each 512-byte-aligned sector a write
 *   touched survives (that write's bytes in it are kept) or not,
 *   independently; each truncate or allocate survives or not as a whole. A
 *   surviving piece past the durable end extends the file, and the gap reads
 *   as zeros. Injected faults are disarmed (a power cycle); stats carry on.
 * - Descriptor numbers are never reused, so a descriptor from before a crash
 *   can never reach a file opened after it.
 * - Injected faults count calls that reached the "device": a pwrite, sync or
 *   fallocate on a valid descriptor (or existing directory) with valid
 *   arguments, an unlink of an existing file. A failing call changes nothing.
 * - Stats count successful calls only.
 * - Held unlinks (drey_io_fault_hold_unlinks) wait on a condition variable,
 *   releasing the mutex, so the rest of the file system keeps working.
 *
 * One mutex guards everything.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/io.h"
#include "drey/list.h"

#define FAULT_SECTOR 512          /* the unit a torn write keeps or loses */
#define FAULT_MAX_FILE (1LL << 30) /* bytes; beyond it pwrite etc. fail with -EFBIG */
#define FAULT_FIRST_FD 3           /* descriptor numbers count up from here */

/* --- small helpers -------------------------------------------------------- */


/* --- byte buffers ---------------------------------------------------------- */

typedef struct fault_buf {
    uint8_t *data;
    size_t len; /* the file size */
    size_t cap; /* bytes allocated at data */
} fault_buf;

/* Sets the size; bytes past the old size read as zeros. */
static void buf_resize(fault_buf *b, size_t len) {
    if (len > b->cap) {
        size_t cap = b->cap > 0 ? b->cap : 4096;
        while (cap < len)
            cap *= 2;
        b->data = drey_xrealloc(b->data, cap, 1);
        b->cap = cap;
    }
    if (len > b->len)
        memset(b->data + b->len, 0, len - b->len);
    b->len = len;
}

static void buf_write(fault_buf *b, const void *src, size_t n, size_t off) {
    if (off + n > b->len)
        buf_resize(b, off + n);
    memcpy(b->data + off, src, n);
}

static void buf_copy(fault_buf *dst, const fault_buf *src) {
    dst->len = 0;
    buf_resize(dst, src->len);
    if (src->len > 0)
        memcpy(dst->data, src->data, src->len);
}

/* --- inodes ------------------------------------------------------------------ */

typedef enum { OP_WRITE, OP_TRUNCATE, OP_ALLOCATE } fault_op_kind;

/* One change since the file's last fdatasync. */
typedef struct fault_op {
    fault_op_kind kind;
    size_t off;    /* OP_WRITE, OP_ALLOCATE: where it starts */
    size_t len;    /* OP_WRITE: bytes; OP_TRUNCATE: the new size; OP_ALLOCATE: bytes */
    uint8_t *data; /* OP_WRITE: a copy of the bytes written */
} fault_op;

typedef struct fault_inode {
    fault_buf cur;            /* what reads see */
    fault_buf dur;            /* what survives a crash */
    fault_op *log;            /* changes since the last fdatasync, oldest first */
    size_t nlog, caplog;
    unsigned refs;            /* current names + durable names + open descriptors */
    drey_link link;           /* in the file system's inodes */
} fault_inode;

/* --- the file system ------------------------------------------------------------ */

typedef struct fault_entry {
    char *path;
    fault_inode *cur; /* the file this name refers to now, or NULL */
    fault_inode *dur; /* the file it refers to after a crash, or NULL */
} fault_entry;

typedef struct fault_fd {
    int fd;
    int accmode; /* O_RDONLY, O_WRONLY or O_RDWR */
    fault_inode *ino;
} fault_fd;

typedef struct fault_arm {
    unsigned countdown; /* calls until the failing one; 0: disarmed */
    int err;            /* positive errno */
    bool sticky;        /* every call after the failing one fails too */
    bool failing;       /* sticky and already reached */
} fault_arm;

struct drey_io_fault {
    drey_io io; /* first: drey_io * converts to drey_io_fault * */
    pthread_mutex_t mu;
    char **dirs; /* directories besides "/" and ".", normalized */
    size_t ndirs, capdirs;
    fault_entry *entries; /* names, in no order; an entry with neither side is removed */
    size_t nentries, capentries;
    fault_fd *fds; /* open descriptors, in no order */
    size_t nfds, capfds;
    int next_fd;
    drey_list inodes; /* all live fault_inodes, oldest first (crash order) */
    fault_arm write_arm, sync_arm, alloc_arm, unlink_arm;
    uint64_t space_total; /* the file system's size for fs_space; 0: not reported */
    int space_err;        /* fs_space fails with -space_err */
    drey_io_fault_stats stats;
    /* The unlink latch: while held, unlink waits (before it acts) until
     * released; unlinks_waiting counts those waiting. */
    bool hold_unlinks;
    unsigned unlinks_waiting;
    pthread_cond_t unlink_cond;
};

static drey_io_fault *fs_of(drey_io *io) {
    return (drey_io_fault *)io;
}

/* --- inode life ----------------------------------------------------------------- */

static fault_inode *inode_new(drey_io_fault *f) {
    fault_inode *ino = drey_xmalloc(sizeof *ino);
    memset(ino, 0, sizeof *ino);
    drey_list_push(&f->inodes, &ino->link);
    return ino;
}

static void log_clear(fault_inode *ino) {
    for (size_t i = 0; i < ino->nlog; i++)
        free(ino->log[i].data);
    ino->nlog = 0;
}

static void inode_free(drey_io_fault *f, fault_inode *ino) {
    drey_list_remove(&f->inodes, &ino->link);
    log_clear(ino);
    free(ino->log);
    free(ino->cur.data);
    free(ino->dur.data);
    free(ino);
}

static void inode_ref(fault_inode *ino) {
    if (ino != NULL)
        ino->refs++;
}

static void inode_unref(drey_io_fault *f, fault_inode *ino) {
    if (ino != NULL && --ino->refs == 0)
        inode_free(f, ino);
}

/* Appends a change to the log (taking ownership of data) and applies it to
 * the current bytes. */
static void inode_apply(fault_inode *ino, fault_op op) {
    if (ino->nlog == ino->caplog) {
        ino->caplog = ino->caplog > 0 ? ino->caplog * 2 : 8;
        ino->log = drey_xrealloc(ino->log, ino->caplog, sizeof *ino->log);
    }
    ino->log[ino->nlog++] = op;
    switch (op.kind) {
    case OP_WRITE:
        buf_write(&ino->cur, op.data, op.len, op.off);
        break;
    case OP_TRUNCATE:
        buf_resize(&ino->cur, op.len);
        break;
    case OP_ALLOCATE:
        if (op.off + op.len > ino->cur.len)
            buf_resize(&ino->cur, op.off + op.len);
        break;
    }
}

/* splitmix64: the coin of a torn crash. */
static uint64_t prng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static bool coin(uint64_t *s) {
    return (prng_next(s) >> 63) != 0;
}

/* Replays the log over the durable bytes: every piece when rng is NULL (a
 * sync), else each sector of a write and each truncate/allocate survives on
 * a coin (a torn crash). Clears the log. */
static void inode_replay(fault_inode *ino, uint64_t *rng) {
    fault_buf *d = &ino->dur;
    for (size_t i = 0; i < ino->nlog; i++) {
        const fault_op *op = &ino->log[i];
        switch (op->kind) {
        case OP_WRITE:
            if (rng == NULL) {
                buf_write(d, op->data, op->len, op->off);
                break;
            }
            for (size_t at = op->off; at < op->off + op->len;) {
                size_t end = (at / FAULT_SECTOR + 1) * FAULT_SECTOR;
                if (end > op->off + op->len)
                    end = op->off + op->len;
                if (coin(rng))
                    buf_write(d, op->data + (at - op->off), end - at, at);
                at = end;
            }
            break;
        case OP_TRUNCATE:
            if (rng == NULL || coin(rng))
                buf_resize(d, op->len);
            break;
        case OP_ALLOCATE:
            if ((rng == NULL || coin(rng)) && op->off + op->len > d->len)
                buf_resize(d, op->off + op->len);
            break;
        }
    }
    log_clear(ino);
}

/* --- paths, directories and names ---------------------------------------------- */

/* Normalizes into out (PATH_MAX bytes): repeated slashes collapse, a trailing
 * slash goes. */
static int norm_path(const char *path, char *out) {
    if (path == NULL || path[0] == '\0')
        return -ENOENT;
    size_t n = 0;
    for (const char *p = path; *p != '\0'; p++) {
        if (*p == '/' && n > 0 && out[n - 1] == '/')
            continue;
        if (n + 1 >= PATH_MAX)
            return -ENAMETOOLONG;
        out[n++] = *p;
    }
    if (n > 1 && out[n - 1] == '/')
        n--;
    out[n] = '\0';
    return 0;
}

/* The parent directory of a normalized path, into out (PATH_MAX bytes). */
static void parent_of(const char *path, char *out) {
    const char *slash = strrchr(path, '/');
    if (slash == NULL) {
        strcpy(out, ".");
    } else if (slash == path) {
        strcpy(out, "/");
    } else {
        memcpy(out, path, (size_t)(slash - path));
        out[slash - path] = '\0';
    }
}

static const char *base_of(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash != NULL ? slash + 1 : path;
}

static bool is_dir(drey_io_fault *f, const char *path) {
    if (strcmp(path, "/") == 0 || strcmp(path, ".") == 0)
        return true;
    for (size_t i = 0; i < f->ndirs; i++)
        if (strcmp(f->dirs[i], path) == 0)
            return true;
    return false;
}

static fault_entry *find_entry(drey_io_fault *f, const char *path) {
    for (size_t i = 0; i < f->nentries; i++)
        if (strcmp(f->entries[i].path, path) == 0)
            return &f->entries[i];
    return NULL;
}

/* The file a name refers to now, or NULL. */
static fault_inode *lookup(drey_io_fault *f, const char *path) {
    fault_entry *e = find_entry(f, path);
    return e != NULL ? e->cur : NULL;
}

/* 0 if the parent of path is a directory; -ENOTDIR if it is a file,
 * -ENOENT if it is nothing. */
static int check_parent(drey_io_fault *f, const char *path) {
    char parent[PATH_MAX];
    parent_of(path, parent);
    if (is_dir(f, parent))
        return 0;
    return lookup(f, parent) != NULL ? -ENOTDIR : -ENOENT;
}

static fault_entry *get_entry(drey_io_fault *f, const char *path) {
    fault_entry *e = find_entry(f, path);
    if (e != NULL)
        return e;
    if (f->nentries == f->capentries) {
        f->capentries = f->capentries > 0 ? f->capentries * 2 : 16;
        f->entries = drey_xrealloc(f->entries, f->capentries, sizeof *f->entries);
    }
    e = &f->entries[f->nentries++];
    e->path = drey_xstrdup(path);
    e->cur = e->dur = NULL;
    return e;
}

/* Drops entries that name nothing on either side. */
static void prune_entries(drey_io_fault *f) {
    size_t j = 0;
    for (size_t i = 0; i < f->nentries; i++) {
        if (f->entries[i].cur == NULL && f->entries[i].dur == NULL)
            free(f->entries[i].path);
        else
            f->entries[j++] = f->entries[i];
    }
    f->nentries = j;
}

static void set_cur(drey_io_fault *f, fault_entry *e, fault_inode *ino) {
    inode_ref(ino);
    inode_unref(f, e->cur);
    e->cur = ino;
}

static void set_dur(drey_io_fault *f, fault_entry *e, fault_inode *ino) {
    inode_ref(ino);
    inode_unref(f, e->dur);
    e->dur = ino;
}

/* --- descriptors and faults ------------------------------------------------------- */

static fault_fd *find_fd(drey_io_fault *f, int fd) {
    for (size_t i = 0; i < f->nfds; i++)
        if (f->fds[i].fd == fd)
            return &f->fds[i];
    return NULL;
}

static void arm(drey_io_fault *f, fault_arm *a, unsigned nth, int err, bool sticky) {
    pthread_mutex_lock(&f->mu);
    a->countdown = nth;
    a->err = err;
    a->sticky = sticky;
    a->failing = false;
    pthread_mutex_unlock(&f->mu);
}

/* Counts one call; returns -err if it is to fail. */
static int arm_check(fault_arm *a) {
    if (a->failing)
        return -a->err;
    if (a->countdown == 0)
        return 0;
    if (--a->countdown > 0)
        return 0;
    if (a->sticky)
        a->failing = true;
    return -a->err;
}

/* --- the operations ------------------------------------------------------------------ */

static int ft_open(drey_io *io, const char *path, int flags, int mode) {
    (void)mode;
    drey_io_fault *f = fs_of(io);
    char p[PATH_MAX];
    int rc = norm_path(path, p);
    if (rc != 0)
        return rc;
    int accmode = flags & O_ACCMODE;
    if (accmode != O_RDONLY && accmode != O_WRONLY && accmode != O_RDWR)
        return -EINVAL;
    pthread_mutex_lock(&f->mu);
    fault_inode *ino = NULL;
    if ((rc = check_parent(f, p)) != 0)
        goto out;
    if (is_dir(f, p)) {
        rc = (flags & O_CREAT) && (flags & O_EXCL) ? -EEXIST : -EISDIR;
        goto out;
    }
    ino = lookup(f, p);
    if (ino != NULL && (flags & O_CREAT) && (flags & O_EXCL)) {
        rc = -EEXIST;
        goto out;
    }
    if (ino == NULL) {
        if (!(flags & O_CREAT)) {
            rc = -ENOENT;
            goto out;
        }
        ino = inode_new(f);
        set_cur(f, get_entry(f, p), ino);
    } else if ((flags & O_TRUNC) && ino->cur.len > 0) {
        inode_apply(ino, (fault_op){.kind = OP_TRUNCATE, .len = 0});
    }
    if (f->nfds == f->capfds) {
        f->capfds = f->capfds > 0 ? f->capfds * 2 : 16;
        f->fds = drey_xrealloc(f->fds, f->capfds, sizeof *f->fds);
    }
    if (f->next_fd == INT_MAX) {
        rc = -EMFILE;
        goto out;
    }
    fault_fd *d = &f->fds[f->nfds++];
    d->fd = f->next_fd++;
    d->accmode = accmode;
    d->ino = ino;
    inode_ref(ino);
    rc = d->fd;
out:
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static int ft_close(drey_io *io, int fd) {
    drey_io_fault *f = fs_of(io);
    pthread_mutex_lock(&f->mu);
    int rc = -EBADF;
    fault_fd *d = find_fd(f, fd);
    if (d != NULL) {
        fault_inode *ino = d->ino;
        *d = f->fds[--f->nfds];
        inode_unref(f, ino);
        rc = 0;
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

/* Locks the file system and finds fd; NULL (still locked) when there is no
 * such descriptor or it was opened with the access mode denied (-1: none). */
static fault_fd *lock_fd(drey_io *io, int fd, int denied, drey_io_fault **f) {
    *f = fs_of(io);
    pthread_mutex_lock(&(*f)->mu);
    fault_fd *d = find_fd(*f, fd);
    return d != NULL && d->accmode != denied ? d : NULL;
}

/* Normalizes path into p and locks the file system; a failure to
 * normalize is returned, unlocked. */
static int lock_path(drey_io *io, const char *path, char p[PATH_MAX], drey_io_fault **f) {
    *f = fs_of(io);
    int rc = norm_path(path, p);
    if (rc == 0)
        pthread_mutex_lock(&(*f)->mu);
    return rc;
}

static ssize_t ft_pwrite(drey_io *io, int fd, const void *buf, size_t n, off_t off) {
    drey_io_fault *f;
    fault_fd *d = lock_fd(io, fd, O_RDONLY, &f);
    ssize_t rc;
    if (d == NULL) {
        rc = -EBADF;
    } else if (off < 0 || n > SSIZE_MAX) {
        rc = -EINVAL;
    } else if ((rc = arm_check(&f->write_arm)) != 0) {
        /* injected: nothing changes */
    } else if (n > (size_t)FAULT_MAX_FILE || off > FAULT_MAX_FILE - (off_t)n) {
        rc = -EFBIG;
    } else {
        if (n > 0) {
            uint8_t *copy = drey_xmalloc(n);
            memcpy(copy, buf, n);
            inode_apply(d->ino, (fault_op){.kind = OP_WRITE, .off = (size_t)off, .len = n, .data = copy});
        }
        f->stats.writes++;
        f->stats.bytes_written += n;
        rc = (ssize_t)n;
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static ssize_t ft_pread(drey_io *io, int fd, void *buf, size_t n, off_t off) {
    drey_io_fault *f;
    fault_fd *d = lock_fd(io, fd, O_WRONLY, &f);
    ssize_t rc;
    if (d == NULL) {
        rc = -EBADF;
    } else if (off < 0) {
        rc = -EINVAL;
    } else if ((uint64_t)off >= d->ino->cur.len) {
        rc = 0;
    } else {
        size_t avail = d->ino->cur.len - (size_t)off;
        if (n > avail)
            n = avail;
        if (n > SSIZE_MAX)
            n = SSIZE_MAX;
        memcpy(buf, d->ino->cur.data + off, n);
        rc = (ssize_t)n;
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static int ft_fdatasync(drey_io *io, int fd) {
    drey_io_fault *f;
    fault_fd *d = lock_fd(io, fd, -1, &f);
    int rc;
    if (d == NULL) {
        rc = -EBADF;
    } else if ((rc = arm_check(&f->sync_arm)) == 0) {
        inode_replay(d->ino, NULL);
        f->stats.syncs++;
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static int ft_fallocate(drey_io *io, int fd, off_t off, off_t len) {
    drey_io_fault *f;
    fault_fd *d = lock_fd(io, fd, O_RDONLY, &f);
    int rc;
    if (d == NULL) {
        rc = -EBADF;
    } else if (off < 0 || len <= 0) {
        rc = -EINVAL;
    } else if ((rc = arm_check(&f->alloc_arm)) != 0) {
        /* injected: nothing changes */
    } else if (len > FAULT_MAX_FILE || off > FAULT_MAX_FILE - len) {
        rc = -EFBIG;
    } else if ((size_t)(off + len) > d->ino->cur.len) {
        inode_apply(d->ino, (fault_op){.kind = OP_ALLOCATE, .off = (size_t)off, .len = (size_t)len});
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static int ft_ftruncate(drey_io *io, int fd, off_t len) {
    drey_io_fault *f = fs_of(io);
    pthread_mutex_lock(&f->mu);
    int rc = 0;
    fault_fd *d = find_fd(f, fd);
    if (d == NULL)
        rc = -EBADF;
    else if (d->accmode == O_RDONLY || len < 0)
        rc = -EINVAL;
    else if (len > FAULT_MAX_FILE)
        rc = -EFBIG;
    else if ((size_t)len != d->ino->cur.len)
        inode_apply(d->ino, (fault_op){.kind = OP_TRUNCATE, .len = (size_t)len});
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static int ft_fsize(drey_io *io, int fd, off_t *size) {
    drey_io_fault *f = fs_of(io);
    pthread_mutex_lock(&f->mu);
    int rc = -EBADF;
    fault_fd *d = find_fd(f, fd);
    if (d != NULL) {
        *size = (off_t)d->ino->cur.len;
        rc = 0;
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static int ft_rename(drey_io *io, const char *from, const char *to) {
    drey_io_fault *f = fs_of(io);
    char a[PATH_MAX], b[PATH_MAX];
    int rc = norm_path(from, a);
    if (rc == 0)
        rc = norm_path(to, b);
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&f->mu);
    fault_inode *ino = NULL;
    if ((rc = check_parent(f, a)) != 0 || (rc = check_parent(f, b)) != 0)
        goto out;
    if (is_dir(f, a) || is_dir(f, b)) {
        rc = -EISDIR; /* directories are not renamed in this model */
        goto out;
    }
    if ((ino = lookup(f, a)) == NULL) {
        rc = -ENOENT;
        goto out;
    }
    if (strcmp(a, b) != 0) {
        set_cur(f, get_entry(f, b), ino); /* may add an entry: look a up again */
        set_cur(f, find_entry(f, a), NULL);
        prune_entries(f);
    }
out:
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static int ft_unlink(drey_io *io, const char *path) {
    drey_io_fault *f;
    char p[PATH_MAX];
    int rc = lock_path(io, path, p, &f);
    if (rc != 0)
        return rc;
    if (f->hold_unlinks) {
        f->unlinks_waiting++;
        pthread_cond_broadcast(&f->unlink_cond);
        while (f->hold_unlinks)
            pthread_cond_wait(&f->unlink_cond, &f->mu);
        f->unlinks_waiting--;
    }
    if ((rc = check_parent(f, p)) != 0)
        goto out;
    if (is_dir(f, p)) {
        rc = -EISDIR;
        goto out;
    }
    fault_entry *e = find_entry(f, p);
    if (e == NULL || e->cur == NULL) {
        rc = -ENOENT;
        goto out;
    }
    if ((rc = arm_check(&f->unlink_arm)) != 0)
        goto out;
    set_cur(f, e, NULL);
    prune_entries(f);
out:
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static int ft_mkdir(drey_io *io, const char *path) {
    drey_io_fault *f;
    char p[PATH_MAX];
    int rc = lock_path(io, path, p, &f);
    if (rc != 0)
        return rc;
    if (is_dir(f, p))
        goto out;
    if ((rc = check_parent(f, p)) != 0)
        goto out;
    fault_entry *e = find_entry(f, p);
    if (e != NULL && e->cur != NULL) {
        rc = -EEXIST;
        goto out;
    }
    if (e != NULL) {
        /* A file unlinked but not yet dir-synced: the durable mkdir
         * replaces its durable name. */
        set_dur(f, e, NULL);
        prune_entries(f);
    }
    if (f->ndirs == f->capdirs) {
        f->capdirs = f->capdirs > 0 ? f->capdirs * 2 : 8;
        f->dirs = drey_xrealloc(f->dirs, f->capdirs, sizeof *f->dirs);
    }
    f->dirs[f->ndirs++] = drey_xstrdup(p);
out:
    pthread_mutex_unlock(&f->mu);
    return rc;
}

/* 0 if path (normalized) is a directory; -ENOTDIR if a file, else -ENOENT. */
static int check_dir(drey_io_fault *f, const char *p) {
    if (is_dir(f, p))
        return 0;
    return lookup(f, p) != NULL ? -ENOTDIR : -ENOENT;
}

static int ft_sync_dir(drey_io *io, const char *path) {
    drey_io_fault *f;
    char p[PATH_MAX], parent[PATH_MAX];
    int rc = lock_path(io, path, p, &f);
    if (rc != 0)
        return rc;
    if ((rc = check_dir(f, p)) != 0 || (rc = arm_check(&f->sync_arm)) != 0)
        goto out;
    for (size_t i = 0; i < f->nentries; i++) {
        fault_entry *e = &f->entries[i];
        parent_of(e->path, parent);
        if (strcmp(parent, p) == 0)
            set_dur(f, e, e->cur);
    }
    prune_entries(f);
    f->stats.syncs++;
    f->stats.dir_syncs++;
out:
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static int name_cmp(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int ft_list_dir(drey_io *io, const char *path, char ***names, size_t *n) {
    drey_io_fault *f;
    char p[PATH_MAX], parent[PATH_MAX];
    int rc = lock_path(io, path, p, &f);
    if (rc != 0)
        return rc;
    if ((rc = check_dir(f, p)) != 0)
        goto out;
    char **v = drey_xcalloc(f->nentries + f->ndirs, sizeof *v);
    size_t count = 0;
    for (size_t i = 0; i < f->nentries; i++) {
        parent_of(f->entries[i].path, parent);
        if (f->entries[i].cur != NULL && strcmp(parent, p) == 0)
            v[count++] = drey_xstrdup(base_of(f->entries[i].path));
    }
    for (size_t i = 0; i < f->ndirs; i++) {
        parent_of(f->dirs[i], parent);
        if (strcmp(parent, p) == 0 && strcmp(f->dirs[i], p) != 0)
            v[count++] = drey_xstrdup(base_of(f->dirs[i]));
    }
    qsort(v, count, sizeof *v, name_cmp);
    *names = v;
    *n = count;
out:
    pthread_mutex_unlock(&f->mu);
    return rc;
}

/* The size set by drey_io_fault_set_space, less every live file's bytes
 * (unlinked files still open count, as on a real file system). */
static int ft_fs_space(drey_io *io, const char *path, uint64_t *total_bytes, uint64_t *avail_bytes) {
    (void)path;
    drey_io_fault *f = fs_of(io);
    pthread_mutex_lock(&f->mu);
    int rc = f->space_err != 0 ? -f->space_err : f->space_total == 0 ? -ENOTSUP : 0;
    if (rc == 0) {
        uint64_t used = 0;
        for (drey_link *l = f->inodes.head; l != NULL; l = l->next)
            used += DREY_LIST_ITEM(l, fault_inode, link)->cur.len;
        *total_bytes = f->space_total;
        *avail_bytes = used < f->space_total ? f->space_total - used : 0;
    }
    pthread_mutex_unlock(&f->mu);
    return rc;
}

static const drey_io_ops fault_ops = {
    .open = ft_open,
    .close = ft_close,
    .pwrite = ft_pwrite,
    .pread = ft_pread,
    .fdatasync = ft_fdatasync,
    .fallocate = ft_fallocate,
    .ftruncate = ft_ftruncate,
    .fsize = ft_fsize,
    .rename = ft_rename,
    .unlink = ft_unlink,
    .mkdir = ft_mkdir,
    .sync_dir = ft_sync_dir,
    .list_dir = ft_list_dir,
    .fs_space = ft_fs_space,
};

/* --- the test-facing API ----------------------------------------------------------- */

drey_io_fault *drey_io_fault_create(void) {
    drey_io_fault *f = drey_xmalloc(sizeof *f);
    memset(f, 0, sizeof *f);
    f->io.ops = &fault_ops;
    pthread_mutex_init(&f->mu, NULL);
    pthread_cond_init(&f->unlink_cond, NULL);
    f->next_fd = FAULT_FIRST_FD;
    return f;
}

void drey_io_fault_destroy(drey_io_fault *f) {
    if (f == NULL)
        return;
    while (!drey_list_empty(&f->inodes))
        inode_free(f, DREY_LIST_ITEM(f->inodes.head, fault_inode, link));
    for (size_t i = 0; i < f->nentries; i++)
        free(f->entries[i].path);
    free(f->entries);
    for (size_t i = 0; i < f->ndirs; i++)
        free(f->dirs[i]);
    free(f->dirs);
    free(f->fds);
    pthread_cond_destroy(&f->unlink_cond);
    pthread_mutex_destroy(&f->mu);
    free(f);
}

drey_io *drey_io_fault_io(drey_io_fault *f) {
    return &f->io;
}

void drey_io_fault_fail_write(drey_io_fault *f, unsigned nth, int err, bool sticky) {
    arm(f, &f->write_arm, nth, err, sticky);
}

void drey_io_fault_fail_sync(drey_io_fault *f, unsigned nth, int err, bool sticky) {
    arm(f, &f->sync_arm, nth, err, sticky);
}

void drey_io_fault_fail_allocate(drey_io_fault *f, unsigned nth, int err, bool sticky) {
    arm(f, &f->alloc_arm, nth, err, sticky);
}

void drey_io_fault_fail_unlink(drey_io_fault *f, unsigned nth, int err, bool sticky) {
    arm(f, &f->unlink_arm, nth, err, sticky);
}

void drey_io_fault_hold_unlinks(drey_io_fault *f, bool hold) {
    pthread_mutex_lock(&f->mu);
    f->hold_unlinks = hold;
    pthread_cond_broadcast(&f->unlink_cond);
    pthread_mutex_unlock(&f->mu);
}

bool drey_io_fault_wait_unlinks_held(drey_io_fault *f, unsigned n, int64_t timeout_ms) {
    int64_t until = drey_deadline_after_ms(timeout_ms);
    pthread_mutex_lock(&f->mu);
    int rc = 0;
    while (f->unlinks_waiting < n && rc == 0)
        rc = drey_cond_wait_until(&f->unlink_cond, &f->mu, until);
    bool ok = f->unlinks_waiting >= n;
    pthread_mutex_unlock(&f->mu);
    return ok;
}

void drey_io_fault_crash(drey_io_fault *f, bool torn, uint32_t seed) {
    pthread_mutex_lock(&f->mu);
    /* Power is gone: descriptors first, so their references drop. Inodes
     * stay alive until names are settled: hold one reference on each. */
    for (drey_link *l = f->inodes.head; l != NULL; l = l->next)
        inode_ref(DREY_LIST_ITEM(l, fault_inode, link));
    for (size_t i = 0; i < f->nfds; i++)
        inode_unref(f, f->fds[i].ino);
    f->nfds = 0;
    for (size_t i = 0; i < f->nentries; i++)
        set_cur(f, &f->entries[i], f->entries[i].dur);
    prune_entries(f);
    uint64_t rng = seed;
    for (drey_link *l = f->inodes.head, *next; l != NULL; l = next) {
        next = l->next;
        fault_inode *ino = DREY_LIST_ITEM(l, fault_inode, link);
        if (ino->refs > 1) {
            if (torn)
                inode_replay(ino, &rng);
            else
                log_clear(ino);
            buf_copy(&ino->cur, &ino->dur);
        }
        inode_unref(f, ino);
    }
    f->write_arm = f->sync_arm = f->alloc_arm = f->unlink_arm = (fault_arm){0};
    pthread_mutex_unlock(&f->mu);
}

void drey_io_fault_set_space(drey_io_fault *f, uint64_t total_bytes, int err) {
    pthread_mutex_lock(&f->mu);
    f->space_total = total_bytes;
    f->space_err = err;
    pthread_mutex_unlock(&f->mu);
}

void drey_io_fault_get_stats(drey_io_fault *f, drey_io_fault_stats *out) {
    pthread_mutex_lock(&f->mu);
    *out = f->stats;
    pthread_mutex_unlock(&f->mu);
}
