/*
 * arena — per-call bump allocator.
 *
 * A call decodes its request, builds its response and formats its error into
 * one arena, then frees everything at once. protobuf-c allocates through
 * drey_arena_protobuf_allocator(), so unpacking a request costs a few pointer
 * bumps instead of one malloc per field.
 */
#ifndef DREY_ARENA_H
#define DREY_ARENA_H

#include <stddef.h>

#include <protobuf-c/protobuf-c.h>

typedef struct drey_arena_block drey_arena_block;

typedef struct drey_arena {
    drey_arena_block *head;      /* newest block; allocations come from it */
    char *inline_buf;            /* first block's memory, owned by the caller */
    size_t inline_cap;           /* bytes in inline_buf */
    size_t inline_used;          /* bytes handed out from inline_buf */
    size_t allocated;            /* bytes handed out in all, for tests/metrics */
    ProtobufCAllocator pb;       /* protobuf-c adapter bound to this arena */
} drey_arena;

/* Initializes an arena that first serves from buf (may be NULL, cap 0). */
void drey_arena_init(drey_arena *a, void *buf, size_t cap);

/* 16-byte aligned memory; never NULL (aborts on out-of-memory like malloc
 * failures elsewhere in the server: a cache node that cannot allocate a few
 * bytes for a call cannot make progress). */
void *drey_arena_alloc(drey_arena *a, size_t size);
void *drey_arena_calloc(drey_arena *a, size_t size);
char *drey_arena_strndup(drey_arena *a, const char *s, size_t n);
char *drey_arena_sprintf(drey_arena *a, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Frees every block but keeps the arena usable. */
void drey_arena_reset(drey_arena *a);
void drey_arena_destroy(drey_arena *a);

static inline ProtobufCAllocator *drey_arena_protobuf_allocator(drey_arena *a) {
    return &a->pb;
}

#endif
