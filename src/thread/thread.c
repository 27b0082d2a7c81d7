/*
 * thread — background threads started or the process aborted, and stopped
 * by flag, wake and join; see include/drey/thread.h.
 */
#include "drey/thread.h"

#include <stdlib.h>
#include <string.h>

#include "drey/log.h"

void drey_thread_start(pthread_t *t, const char *what, void *(*fn)(void *arg), void *arg) {
    int rc = pthread_create(t, NULL, fn, arg);
    if (rc != 0) {
        DREY_LOG_ERROR("cannot start a thread: aborting", DREY_LOG_STR("thread", what),
                       DREY_LOG_STR("error", strerror(rc)));
        abort();
    }
}

void drey_thread_stop(pthread_t t, pthread_mutex_t *mu, pthread_cond_t *cond, bool *stopping) {
    pthread_mutex_lock(mu);
    *stopping = true;
    pthread_cond_broadcast(cond);
    pthread_mutex_unlock(mu);
    pthread_join(t, NULL);
}
