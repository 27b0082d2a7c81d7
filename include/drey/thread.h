/*
 * thread — starting and stopping drey's background threads (the journal's
 * writer, the snapshotter, the expiry sweep, the timers, ...) one way.
 *
 * A thread that cannot be started aborts the process with a log line, as an
 * allocation that fails does (alloc.h): a node without its journal writer or
 * its timers cannot keep its promises, and callers that carried on would
 * have error paths that never run. Code that can do without its thread (the
 * key-file watcher, the CLI's signal thread, the C client) calls
 * pthread_create itself and says what it does instead.
 *
 * Such a thread sleeps on a condition variable under a mutex and leaves its
 * loop when a `stopping` flag, guarded by that mutex, is set: stopping it is
 * always set the flag, wake it, join it.
 */
#ifndef DREY_THREAD_H
#define DREY_THREAD_H

#include <pthread.h>
#include <stdbool.h>

/* Starts fn(arg) on a new thread in *t, or aborts with a log line naming
 * what (the thread's job, "journal writer"). */
void drey_thread_start(pthread_t *t, const char *what, void *(*fn)(void *arg), void *arg);

/* Sets *stopping under mu, wakes every waiter on cond, and joins t. */
void drey_thread_stop(pthread_t t, pthread_mutex_t *mu, pthread_cond_t *cond, bool *stopping);

#endif
