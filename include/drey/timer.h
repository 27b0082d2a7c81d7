/*
 * timer — one thread that runs callbacks at monotonic deadlines.
 *
 * The request chain parks calls (a queued call waiting for a slot, a call
 * slowed down under load) and needs to wake them when their wait, or their
 * deadline, runs out; gRPC's C core exposes no timers, so drey keeps its own:
 * a binary heap under a mutex and a thread sleeping until the earliest
 * deadline. Callbacks run on the timer thread and must be short.
 */
#ifndef DREY_TIMER_H
#define DREY_TIMER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct drey_timers drey_timers;

typedef struct drey_timer {
    int64_t at_ns;                /* monotonic */
    void (*fn)(void *arg);
    void *arg;
    size_t heap_index_;           /* the timer module's; SIZE_MAX when not armed */
} drey_timer;

drey_timers *drey_timers_create(void);
/* Stops the thread; timers still armed never fire. */
void drey_timers_destroy(drey_timers *t);

/* Arms a caller-owned timer (at_ns, fn, arg set by the caller). Arming an
 * armed timer moves it to the new time: it fires once. */
void drey_timer_arm(drey_timers *t, drey_timer *timer);
/* Disarms it; true if it had not fired (its callback will not run). When it
 * returns false the callback has run or is running. */
bool drey_timer_cancel(drey_timers *t, drey_timer *timer);
/* Returns once the timer's callback is not running (at once when called
 * from that callback): after a cancel, the caller may then free the timer. */
void drey_timer_sync(drey_timers *t, drey_timer *timer);

#endif
