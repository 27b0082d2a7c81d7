/*
 * Unit tests for src/thread/thread.c: a started thread runs and a stopped
 * one has left its loop before stop returns; a thread that cannot be
 * started aborts the process after one log line (a death test: the child
 * asks for thread stacks larger than the address space, so pthread_create
 * really fails).
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "drey/log.h"
#include "drey/thread.h"

typedef struct worker {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool stopping, started, left;
} worker;

static void *worker_main(void *arg) {
    worker *w = arg;
    pthread_mutex_lock(&w->mu);
    w->started = true;
    pthread_cond_broadcast(&w->cond);
    while (!w->stopping)
        pthread_cond_wait(&w->cond, &w->mu);
    w->left = true;
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

Test(thread, a_started_thread_runs_and_stop_waits_until_it_has_left) {
    worker w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};
    pthread_t t;
    drey_thread_start(&t, "test worker", worker_main, &w);
    pthread_mutex_lock(&w.mu);
    while (!w.started)
        pthread_cond_wait(&w.cond, &w.mu);
    pthread_mutex_unlock(&w.mu);
    drey_thread_stop(t, &w.mu, &w.cond, &w.stopping);
    cr_assert(w.stopping);
    cr_assert(w.left); /* joined: no lock needed to read it now */
}

static void *never_runs(void *arg) {
    (void)arg;
    return NULL;
}

Test(thread, a_thread_that_cannot_start_aborts_after_a_log_line) {
    int fds[2];
    cr_assert(eq(int, pipe(fds), 0));
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        drey_log_set_fd(fds[1]);
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, (size_t)1 << 62); /* no mmap can give that */
        pthread_setattr_default_np(&attr);
        pthread_t t;
        drey_thread_start(&t, "doomed", never_runs, NULL);
        _exit(0); /* reached only if the start did not abort */
    }
    close(fds[1]);
    char log[4096];
    size_t len = 0;
    ssize_t n;
    while (len + 1 < sizeof log && (n = read(fds[0], log + len, sizeof log - 1 - len)) > 0)
        len += (size_t)n;
    log[len] = '\0';
    close(fds[0]);
    int status = 0;
    cr_assert(eq(int, waitpid(pid, &status, 0), pid));
    int signaled = WIFSIGNALED(status);
    cr_assert(signaled, "the child exited instead of aborting; its log: %s", log);
    cr_assert(eq(int, WTERMSIG(status), SIGABRT));
    cr_assert(strstr(log, "cannot start a thread") != NULL, "log: %s", log);
    cr_assert(strstr(log, "doomed") != NULL, "log: %s", log);
}
