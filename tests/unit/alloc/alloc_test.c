/*
 * Unit tests for src/alloc/alloc.c.
 *
 * The failure paths are death tests: each runs the call in a forked child
 * whose log goes to a pipe, and checks that the child died of SIGABRT after
 * one log line naming the size. A size near SIZE_MAX makes glibc's malloc
 * (and ASan's, told below to return NULL rather than report) really fail,
 * so the path under test is the real one, not a simulated failure.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "drey/alloc.h"
#include "drey/log.h"

/* Under ASan an impossible size is a report and exit(1) by default; drey's
 * policy is what should run, so ask ASan's malloc to fail like glibc's. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) {
    return "allocator_may_return_null=1";
}

typedef void (*call_fn)(void);

/* Runs fn in a child; returns the child's wait status, its log in out. */
static int in_child(call_fn fn, char *out, size_t cap) {
    int fds[2];
    cr_assert(eq(int, pipe(fds), 0));
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        drey_log_set_fd(fds[1]);
        fn();
        _exit(0); /* reached only if fn returned: the parent fails the test */
    }
    close(fds[1]);
    size_t len = 0;
    ssize_t n;
    while (len + 1 < cap && (n = read(fds[0], out + len, cap - 1 - len)) > 0)
        len += (size_t)n;
    out[len] = '\0';
    close(fds[0]);
    int status = 0;
    cr_assert(eq(int, waitpid(pid, &status, 0), pid));
    return status;
}

static void expect_abort(call_fn fn, const char *msg, const char *field) {
    char log[4096];
    int status = in_child(fn, log, sizeof log);
    int signaled = WIFSIGNALED(status);
    cr_assert(signaled, "child did not die (status %d), log: %s", status, log);
    int sig = WTERMSIG(status);
    cr_assert(eq(int, sig, SIGABRT));
    cr_assert(strstr(log, msg) != NULL, "log: %s", log);
    cr_assert(strstr(log, field) != NULL, "log: %s", log);
    cr_assert(strstr(log, "\"level\":\"error\"") != NULL, "log: %s", log);
}

#define HUGE (SIZE_MAX - 4096)

static void *volatile sink; /* keeps the compiler from dropping a call */

static void malloc_huge(void) {
    sink = drey_xmalloc(HUGE);
}
static void calloc_huge(void) {
    sink = drey_xcalloc(1, HUGE);
}
static void realloc_huge(void) {
    sink = drey_xrealloc(NULL, HUGE, 1);
}
static void aligned_huge(void) {
    sink = drey_xaligned(64, HUGE);
}
static void aligned_bad(void) {
    sink = drey_xaligned(3, 16);
}
static void calloc_overflow(void) {
    sink = drey_xcalloc(SIZE_MAX / 2 + 1, 2);
}
static void realloc_overflow(void) {
    void *p = drey_xmalloc(16);
    sink = p;
    sink = drey_xrealloc(p, SIZE_MAX / 8 + 1, 8);
}

Test(alloc, malloc_failure_aborts_naming_the_size) {
    char field[64];
    snprintf(field, sizeof field, "\"size\":%zu", (size_t)HUGE);
    expect_abort(malloc_huge, "out of memory", field);
}

Test(alloc, calloc_failure_aborts_naming_the_size) {
    char field[64];
    snprintf(field, sizeof field, "\"size\":%zu", (size_t)HUGE);
    expect_abort(calloc_huge, "out of memory", field);
}

Test(alloc, realloc_failure_aborts_naming_the_count) {
    char field[64];
    snprintf(field, sizeof field, "\"count\":%zu", (size_t)HUGE);
    expect_abort(realloc_huge, "out of memory", field);
}

Test(alloc, aligned_failure_aborts_naming_the_size) {
    char field[64];
    snprintf(field, sizeof field, "\"size\":%zu", (size_t)HUGE);
    expect_abort(aligned_huge, "out of memory", field);
}

Test(alloc, bad_alignment_is_a_bug_not_memory) {
    expect_abort(aligned_bad, "bad alignment", "\"align\":3");
}

Test(alloc, calloc_count_times_size_overflow_aborts) {
    char field[64];
    snprintf(field, sizeof field, "\"count\":%zu", SIZE_MAX / 2 + 1);
    expect_abort(calloc_overflow, "overflows", field);
}

Test(alloc, realloc_count_times_size_overflow_aborts) {
    char field[64];
    snprintf(field, sizeof field, "\"count\":%zu", SIZE_MAX / 8 + 1);
    expect_abort(realloc_overflow, "overflows", field);
}

Test(alloc, zero_sizes_return_live_blocks) {
    void *a = drey_xmalloc(0), *b = drey_xcalloc(0, 8), *c = drey_xcalloc(8, 0);
    cr_assert(a != NULL && b != NULL && c != NULL);
    cr_assert(a != b && b != c);
    /* realloc to zero keeps a block (glibc's realloc(p, 0) would free p). */
    void *d = drey_xrealloc(drey_xmalloc(32), 0, 8);
    cr_assert(d != NULL);
    free(a), free(b), free(c), free(d);
}

Test(alloc, calloc_zeroes_and_realloc_keeps_contents) {
    unsigned char *p = drey_xcalloc(100, 3);
    for (size_t i = 0; i < 300; i++)
        cr_assert(eq(u8, p[i], 0));
    memset(p, 0xab, 300);
    p = drey_xrealloc(p, 1000, 4);
    for (size_t i = 0; i < 300; i++)
        cr_assert(eq(u8, p[i], 0xab));
    free(p);
}

Test(alloc, aligned_is_aligned) {
    void *p = drey_xaligned(64, 100);
    cr_assert(eq(u64, (uintptr_t)p % 64, 0));
    free(p);
}

Test(alloc, strdup_and_strndup) {
    char *a = drey_xstrdup("hello");
    cr_assert(eq(str, a, "hello"));
    char *b = drey_xstrndup("hello", 3);
    cr_assert(eq(str, b, "hel"));
    char *c = drey_xstrndup("hi", 10); /* n past the end stops at the NUL */
    cr_assert(eq(str, c, "hi"));
    char *d = drey_xstrdup("");
    cr_assert(eq(str, d, ""));
    free(a), free(b), free(c), free(d);
}

Test(alloc, memstream_collects_what_is_written) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = drey_xopen_memstream(&buf, &len);
    fprintf(f, "%s-%d", "drey", 42);
    fclose(f);
    cr_assert(eq(sz, len, 7));
    cr_assert(eq(str, buf, "drey-42"));
    free(buf);
}
