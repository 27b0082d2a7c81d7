/*
 * clock — the two clocks drey reads.
 *
 * Expiry is wall-clock time (clients send absolute timestamps and expiry
 * survives restarts); durations and deadlines inside the process use the
 * monotonic clock, which does not jump.
 */
#ifndef DREY_CLOCK_H
#define DREY_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t drey_wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline int64_t drey_mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static inline int64_t drey_mono_ms(void) {
    return drey_mono_ns() / 1000000;
}

#endif
