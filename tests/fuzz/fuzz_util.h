/*
 * Helpers shared by the fuzz targets: a failed property aborts with a
 * message (libFuzzer then saves the input), and the fault file system
 * stands in for the disk so that recovery runs on bytes alone.
 */
#ifndef DREY_TESTS_FUZZ_UTIL_H
#define DREY_TESTS_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fcntl.h>

#include "drey/io.h"

#define FUZZ_CHECK(cond, ...)                                                                   \
    do {                                                                                        \
        if (!(cond)) {                                                                          \
            fprintf(stderr, "%s:%d: property failed: %s: ", __FILE__, __LINE__, #cond);         \
            fprintf(stderr, __VA_ARGS__);                                                       \
            fputc('\n', stderr);                                                                \
            abort();                                                                            \
        }                                                                                       \
    } while (0)

/* Writes a durable file into the fault file system. */
static inline void fuzz_put_file(drey_io *io, const char *path, const uint8_t *data, size_t n) {
    int fd = io->ops->open(io, path, O_CREAT | O_WRONLY, 0644);
    FUZZ_CHECK(fd >= 0, "open %s: %d", path, fd);
    FUZZ_CHECK(drey_io_pwrite_all(io, fd, data, n, 0) == 0, "write %s", path);
    FUZZ_CHECK(io->ops->fdatasync(io, fd) == 0, "sync %s", path);
    io->ops->close(io, fd);
}

/* A little-endian field, for targets that repair what the fuzzer wrote. */
static inline uint64_t fuzz_get64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static inline uint32_t fuzz_get32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline void fuzz_put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void fuzz_put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

#endif
