/* Unit tests for src/arena/arena.c. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#include "drey/arena.h"

Test(arena, allocations_are_aligned_and_distinct) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    char *p = drey_arena_alloc(&a, 3);
    char *q = drey_arena_alloc(&a, 5);
    cr_assert_eq((uintptr_t)p % 16, 0);
    cr_assert_eq((uintptr_t)q % 16, 0);
    cr_assert(q >= p + 3 || p >= q + 5);
    drey_arena_destroy(&a);
}

Test(arena, serves_from_the_inline_buffer_first) {
    char buf[256];
    drey_arena a;
    drey_arena_init(&a, buf, sizeof buf);
    char *p = drey_arena_alloc(&a, 32);
    cr_assert(p >= buf && p < buf + sizeof buf);
    char *big = drey_arena_alloc(&a, 4096);
    cr_assert(big < buf || big >= buf + sizeof buf, "a block larger than the buffer comes from the heap");
    memset(big, 0xab, 4096);
    drey_arena_destroy(&a);
}

Test(arena, a_huge_allocation_gets_its_own_block) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    size_t n = 5u << 20;
    char *p = drey_arena_alloc(&a, n);
    memset(p, 1, n);
    char *q = drey_arena_alloc(&a, 16);
    memset(q, 2, 16);
    cr_assert_eq(p[n - 1], 1);
    drey_arena_destroy(&a);
}

Test(arena, reset_keeps_the_arena_usable) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 1000; i++)
            drey_arena_alloc(&a, 100);
        cr_assert_geq(a.allocated, 100000);
        drey_arena_reset(&a);
        cr_assert_eq(a.allocated, 0);
    }
    drey_arena_destroy(&a);
}

Test(arena, strings_and_protobuf_allocator) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    char *s = drey_arena_strndup(&a, "hello world", 5);
    cr_assert_str_eq(s, "hello");
    char *f = drey_arena_sprintf(&a, "%s-%d", "x", 42);
    cr_assert_str_eq(f, "x-42");
    ProtobufCAllocator *pa = drey_arena_protobuf_allocator(&a);
    void *p = pa->alloc(pa->allocator_data, 64);
    cr_assert_not_null(p);
    pa->free(pa->allocator_data, p); /* a no-op; freed with the arena */
    drey_arena_destroy(&a);
}
