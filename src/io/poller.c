/*
 * poller — a thread that calls a function every interval until stopped; see
 * include/drey/io.h.
 */
#include <errno.h>
#include <string.h>

#include "drey/clock.h"
#include "drey/io.h"
#include "drey/log.h"

void drey_io_poller_init(drey_io_poller *p, const char *what, void (*poll)(void *arg), void *arg) {
    *p = (drey_io_poller){.poll = poll, .arg = arg, .what = what};
    pthread_mutex_init(&p->ctl, NULL);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
}

static void *poller_main(void *arg) {
    drey_io_poller *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stopping) {
        int64_t until = drey_deadline_after_ms(p->interval_ms);
        while (!p->stopping && drey_cond_wait_until(&p->cv, &p->mu, until) != ETIMEDOUT) {
        }
        if (p->stopping)
            break;
        pthread_mutex_unlock(&p->mu);
        p->poll(p->arg);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

void drey_io_poller_start(drey_io_poller *p, int64_t interval_ms) {
    int rc = 0;
    pthread_mutex_lock(&p->ctl);
    pthread_mutex_lock(&p->mu);
    if (!p->running) {
        p->interval_ms = interval_ms > 0 ? interval_ms : 1;
        p->stopping = false;
        rc = pthread_create(&p->thread, NULL, poller_main, p);
        p->running = rc == 0;
    }
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->ctl);
    if (rc != 0)
        DREY_LOG_ERROR("a watcher's thread did not start", DREY_LOG_STR("watcher", p->what),
                       DREY_LOG_STR("reason", strerror(rc)));
}

void drey_io_poller_stop(drey_io_poller *p) {
    pthread_mutex_lock(&p->ctl);
    pthread_mutex_lock(&p->mu);
    bool running = p->running;
    p->running = false;
    p->stopping = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    if (running)
        pthread_join(p->thread, NULL);
    pthread_mutex_unlock(&p->ctl);
}

void drey_io_poller_destroy(drey_io_poller *p) {
    drey_io_poller_stop(p);
    pthread_mutex_destroy(&p->ctl);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
}
