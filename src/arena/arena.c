/*
 * arena — per-call bump allocator; see include/drey/arena.h.
 *
 * Blocks grow geometrically so a call with a 4 MiB value costs one large
 * block rather than many small ones. Requests larger than half a block get a
 * block of their own.
 */
#include "drey/arena.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"

#define ARENA_ALIGN 16
#define ARENA_MIN_BLOCK 4096

struct drey_arena_block {
    drey_arena_block *next;
    size_t cap;
    size_t used;
    _Alignas(ARENA_ALIGN) char data[];
};

static size_t align_up(size_t n) {
    return (n + (ARENA_ALIGN - 1)) & ~(size_t)(ARENA_ALIGN - 1);
}

static void *pb_alloc(void *ctx, size_t size) {
    return drey_arena_alloc(ctx, size);
}

static void pb_free(void *ctx, void *p) {
    (void)ctx;
    (void)p; /* freed with the arena */
}

void drey_arena_init(drey_arena *a, void *buf, size_t cap) {
    memset(a, 0, sizeof *a);
    /* The caller's buffer may be unaligned; skip to the first aligned byte. */
    if (buf != NULL) {
        uintptr_t p = (uintptr_t)buf;
        uintptr_t aligned = (p + (ARENA_ALIGN - 1)) & ~(uintptr_t)(ARENA_ALIGN - 1);
        size_t skip = (size_t)(aligned - p);
        if (cap > skip) {
            a->inline_buf = (char *)aligned;
            a->inline_cap = cap - skip;
        }
    }
    a->pb.alloc = pb_alloc;
    a->pb.free = pb_free;
    a->pb.allocator_data = a;
}

void *drey_arena_alloc(drey_arena *a, size_t size) {
    size = align_up(size == 0 ? 1 : size);
    a->allocated += size;
    if (a->inline_cap - a->inline_used >= size) {
        void *p = a->inline_buf + a->inline_used;
        a->inline_used += size;
        return p;
    }
    drey_arena_block *b = a->head;
    if (b != NULL && b->cap - b->used >= size) {
        void *p = b->data + b->used;
        b->used += size;
        return p;
    }
    size_t cap = b != NULL ? b->cap * 2 : ARENA_MIN_BLOCK;
    if (cap < size * 2)
        cap = align_up(size * 2);
    b = drey_xmalloc(sizeof *b + cap);
    b->cap = cap;
    b->used = size;
    b->next = a->head;
    a->head = b;
    return b->data;
}

void *drey_arena_calloc(drey_arena *a, size_t size) {
    void *p = drey_arena_alloc(a, size);
    memset(p, 0, size);
    return p;
}

char *drey_arena_strndup(drey_arena *a, const char *s, size_t n) {
    char *p = drey_arena_alloc(a, n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

char *drey_arena_sprintf(drey_arena *a, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        n = 0;
    char *p = drey_arena_alloc(a, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return p;
}

void drey_arena_reset(drey_arena *a) {
    drey_arena_block *b = a->head;
    while (b != NULL) {
        drey_arena_block *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
    a->inline_used = 0;
    a->allocated = 0;
}

void drey_arena_destroy(drey_arena *a) {
    drey_arena_reset(a);
}
