/*
 * alloc — drey's one out-of-memory policy: an allocation that fails aborts.
 *
 * A cache that cannot allocate cannot keep the promises it has made (an
 * acknowledged write that the journal can no longer queue, a reply it cannot
 * build), and code that tries to carry on has error paths that never run.
 * So, as Redis's zmalloc does, every heap allocation outside libraries that
 * bring their own allocator goes through these functions: on failure they
 * write one log line naming the size asked for and call abort(). A count
 * times a size that overflows size_t aborts the same way instead of wrapping
 * into a short buffer.
 *
 * Sizes that come from a request, a file or a peer must be bounded by
 * validation before they get here: aborting is right for a machine out of
 * memory, never for a client that asked for a terabyte.
 *
 * These functions never return NULL. A size of 0 returns a unique pointer
 * that may be passed to free() (and to drey_xrealloc).
 */
#ifndef DREY_ALLOC_H
#define DREY_ALLOC_H

#include <stddef.h>
#include <stdio.h>

void *drey_xmalloc(size_t size);
/* n * size bytes, zeroed. */
void *drey_xcalloc(size_t n, size_t size);
/* Resizes p (NULL allocates) to n * size bytes, as reallocarray does. */
void *drey_xrealloc(void *p, size_t n, size_t size);
/* size bytes aligned to align (a power of two, a multiple of sizeof(void *)). */
void *drey_xaligned(size_t align, size_t size);
char *drey_xstrdup(const char *s);
/* At most n bytes of s, always NUL-terminated. */
char *drey_xstrndup(const char *s, size_t n);
/* open_memstream: a stream writing into *buf (its size in *len), which the
 * caller frees after fclose. It allocates, so it follows the same policy. */
FILE *drey_xopen_memstream(char **buf, size_t *len);

#endif
