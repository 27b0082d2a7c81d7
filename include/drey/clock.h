/*
 * clock — the two clocks drey reads, and timed waits on the right one.
 *
 * Expiry is wall-clock time (clients send absolute timestamps and expiry
 * survives restarts); durations and deadlines inside the process use the
 * monotonic clock, which does not jump. Every timed wait on a condition
 * variable goes through drey_cond_wait_until, so a wall-clock step (NTP, an
 * operator, a resumed VM) neither cuts a wait short nor stretches it.
 */
#ifndef DREY_CLOCK_H
#define DREY_CLOCK_H

#include <errno.h>
#include <pthread.h>
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

/* The monotonic instant ms milliseconds from now, for drey_cond_wait_until. */
static inline int64_t drey_deadline_after_ms(int64_t ms) {
    return drey_mono_ns() + ms * 1000000;
}

/* Sleeps ms milliseconds: a pause between retries, or a rate cap's, never
 * a synchronisation. */
static inline void drey_nap_ms(int64_t ms) {
    if (ms <= 0)
        return;
    struct timespec ts = {.tv_sec = (time_t)(ms / 1000), .tv_nsec = (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* Waits on c (mu held) until it is signalled or the monotonic instant
 * deadline_ns (drey_mono_ns's clock) has passed: ETIMEDOUT then, else 0.
 * Wakeups may be spurious: callers re-check what they wait for.
 *
 * pthread_cond_clockwait names the clock per wait, so any condition
 * variable will do (no pthread_condattr_setclock to forget at init). */
static inline int drey_cond_wait_until(pthread_cond_t *c, pthread_mutex_t *mu, int64_t deadline_ns) {
    if (deadline_ns < 0)
        deadline_ns = 0;
    struct timespec until = {.tv_sec = (time_t)(deadline_ns / 1000000000), .tv_nsec = (long)(deadline_ns % 1000000000)};
    int rc = pthread_cond_clockwait(c, mu, CLOCK_MONOTONIC, &until);
    return rc == ETIMEDOUT ? ETIMEDOUT : 0;
}

#endif
