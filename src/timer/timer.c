/*
 * timer — a heap of deadlines and the thread that serves it; see
 * include/drey/timer.h.
 *
 * A callback runs without the mutex held, so it may arm or cancel timers.
 * cancel() of a timer whose callback is running returns false and does not
 * wait: callers decide who owns the wake-up with their own state, and
 * drey_timer_sync() tells them when the callback is over.
 */
#include "drey/timer.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/thread.h"

#define NOT_ARMED SIZE_MAX

struct drey_timers {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    pthread_cond_t idle; /* broadcast when a callback returns */
    drey_timer **heap;
    size_t n, cap;
    drey_timer *running; /* whose callback runs now */
    bool stopping;
    pthread_t thread;
};

static void swap(drey_timers *t, size_t i, size_t j) {
    drey_timer *a = t->heap[i];
    t->heap[i] = t->heap[j];
    t->heap[j] = a;
    t->heap[i]->heap_index_ = i;
    t->heap[j]->heap_index_ = j;
}

static void sift_up(drey_timers *t, size_t i) {
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (t->heap[p]->at_ns <= t->heap[i]->at_ns)
            break;
        swap(t, i, p);
        i = p;
    }
}

static void sift_down(drey_timers *t, size_t i) {
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < t->n && t->heap[l]->at_ns < t->heap[m]->at_ns)
            m = l;
        if (r < t->n && t->heap[r]->at_ns < t->heap[m]->at_ns)
            m = r;
        if (m == i)
            return;
        swap(t, i, m);
        i = m;
    }
}

static void remove_at(drey_timers *t, size_t i) {
    drey_timer *gone = t->heap[i];
    t->n--;
    if (i != t->n) {
        t->heap[i] = t->heap[t->n];
        t->heap[i]->heap_index_ = i;
        sift_down(t, i);
        sift_up(t, i);
    }
    gone->heap_index_ = NOT_ARMED;
}

static void *timer_main(void *arg) {
    drey_timers *t = arg;
    pthread_mutex_lock(&t->mu);
    while (!t->stopping) {
        if (t->n == 0) {
            pthread_cond_wait(&t->cond, &t->mu);
            continue;
        }
        int64_t now = drey_mono_ns();
        drey_timer *first = t->heap[0];
        if (first->at_ns > now) {
            drey_cond_wait_until(&t->cond, &t->mu, first->at_ns);
            continue;
        }
        remove_at(t, 0);
        t->running = first;
        pthread_mutex_unlock(&t->mu);
        first->fn(first->arg);
        pthread_mutex_lock(&t->mu);
        t->running = NULL;
        pthread_cond_broadcast(&t->idle);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

drey_timers *drey_timers_create(void) {
    drey_timers *t = drey_xcalloc(1, sizeof *t);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cond, NULL);
    pthread_cond_init(&t->idle, NULL);
    drey_thread_start(&t->thread, "timers", timer_main, t);
    return t;
}

void drey_timers_destroy(drey_timers *t) {
    if (t == NULL)
        return;
    drey_thread_stop(t->thread, &t->mu, &t->cond, &t->stopping);
    free(t->heap);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cond);
    pthread_cond_destroy(&t->idle);
    free(t);
}

static bool armed_locked(const drey_timers *t, const drey_timer *timer) {
    return timer->heap_index_ != NOT_ARMED && timer->heap_index_ < t->n && t->heap[timer->heap_index_] == timer;
}

void drey_timer_arm(drey_timers *t, drey_timer *timer) {
    pthread_mutex_lock(&t->mu);
    if (armed_locked(t, timer))
        remove_at(t, timer->heap_index_); /* re-armed: one entry, the new time */
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 64;
        t->heap = drey_xrealloc(t->heap, t->cap, sizeof *t->heap);
    }
    timer->heap_index_ = t->n;
    t->heap[t->n++] = timer;
    sift_up(t, timer->heap_index_);
    if (t->heap[0] == timer)
        pthread_cond_signal(&t->cond);
    pthread_mutex_unlock(&t->mu);
}

bool drey_timer_cancel(drey_timers *t, drey_timer *timer) {
    pthread_mutex_lock(&t->mu);
    bool armed = armed_locked(t, timer);
    if (armed)
        remove_at(t, timer->heap_index_);
    pthread_mutex_unlock(&t->mu);
    return armed;
}

void drey_timer_sync(drey_timers *t, drey_timer *timer) {
    pthread_mutex_lock(&t->mu);
    while (t->running == timer && !pthread_equal(pthread_self(), t->thread))
        pthread_cond_wait(&t->idle, &t->mu);
    pthread_mutex_unlock(&t->mu);
}
