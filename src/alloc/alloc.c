/*
 * alloc — abort on allocation failure; see include/drey/alloc.h.
 *
 * The log line is formatted on the stack by drey_log (which never allocates),
 * so reporting the failure cannot itself need the memory that is missing.
 */
#include "drey/alloc.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "drey/log.h"

static _Noreturn void out_of_memory(const char *what, size_t n, size_t size) {
    DREY_LOG_ERROR("out of memory: aborting", DREY_LOG_STR("call", what), DREY_LOG_UINT("count", n),
                   DREY_LOG_UINT("size", size));
    abort();
}

static _Noreturn void overflow(const char *what, size_t n, size_t size) {
    DREY_LOG_ERROR("allocation size overflows: aborting", DREY_LOG_STR("call", what), DREY_LOG_UINT("count", n),
                   DREY_LOG_UINT("size", size));
    abort();
}

void *drey_xmalloc(size_t size) {
    void *p = malloc(size > 0 ? size : 1);
    if (p == NULL)
        out_of_memory("malloc", 1, size);
    return p;
}

void *drey_xcalloc(size_t n, size_t size) {
    if (size != 0 && n > SIZE_MAX / size)
        overflow("calloc", n, size);
    void *p = calloc(n > 0 ? n : 1, size > 0 ? size : 1);
    if (p == NULL)
        out_of_memory("calloc", n, size);
    return p;
}

void *drey_xrealloc(void *p, size_t n, size_t size) {
    if (size != 0 && n > SIZE_MAX / size)
        overflow("realloc", n, size);
    size_t bytes = n * size;
    /* realloc(p, 0) frees p and may return NULL: keep a live block instead. */
    void *q = realloc(p, bytes > 0 ? bytes : 1);
    if (q == NULL)
        out_of_memory("realloc", n, size);
    return q;
}

void *drey_xaligned(size_t align, size_t size) {
    void *p = NULL;
    int rc = posix_memalign(&p, align, size > 0 ? size : 1);
    if (rc == EINVAL) {
        /* A caller bug, not a full machine: say so rather than blame memory. */
        DREY_LOG_ERROR("bad alignment: aborting", DREY_LOG_UINT("align", align));
        abort();
    }
    if (rc != 0)
        out_of_memory("posix_memalign", 1, size);
    return p;
}

char *drey_xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = drey_xmalloc(n);
    memcpy(d, s, n);
    return d;
}

char *drey_xstrndup(const char *s, size_t n) {
    size_t len = strnlen(s, n);
    char *d = drey_xmalloc(len + 1);
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

FILE *drey_xopen_memstream(char **buf, size_t *len) {
    FILE *f = open_memstream(buf, len);
    if (f == NULL)
        out_of_memory("open_memstream", 1, 0);
    return f;
}
