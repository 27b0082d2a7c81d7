/*
 * drey drain — a Kubernetes preStop hook for dreyd: sends dreyd SIGTERM
 * (what it drains on: NOT_SERVING, the grace period, in-flight calls, and
 * on a cluster node whatever its SIGTERM does first) and waits until the
 * process has exited, at most --wait.
 *
 * Why a command and not `kill`: the image has no shell or procps, and the
 * hook must block. The kubelet sends its own SIGTERM when the hook returns,
 * and a second signal cuts dreyd's grace period short; waiting for the exit
 * (the container ends with PID 1, and the hook with it) means that second
 * signal never comes while the drain runs.
 *
 * "Exited" is: no such process, or a zombie not yet reaped (a test's
 * child); with --ops, also once its ops listener closed. Exit status 0
 * when it exited (or closed its ops listener), 1 when it was still running at the
 * deadline or could not be signalled (or --pid-file holds no process id),
 * 2 on a usage error. --pid-file reads the id from a file, so scripts stop
 * the node they started, never one matched by name.
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "drey/clock.h"
#include "drey/config.h"
#include "ops.h"

#define POLL_NS 20000000 /* 20 ms between looks at the process */

/* The process is gone or a zombie. */
static bool exited(long pid) {
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH)
        return true;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return errno == ENOENT;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* "pid (comm) S ...": comm may hold spaces and parentheses, the state
     * follows the last ')'. */
    char *close = strrchr(buf, ')');
    return close != NULL && close[1] == ' ' && close[2] == 'Z';
}

/* A process id: decimal, at least 1. */
static bool parse_pid(const char *s, long *pid) {
    char *end;
    errno = 0;
    *pid = strtol(s, &end, 10);
    return errno == 0 && end != s && *end == '\0' && *pid >= 1;
}

int drey_cli_drain(drey_cli *c, char **args) {
    (void)args;
    long pid = 1;
    int64_t wait_ms = 60000;
    const char *p = drey_cli_opt(c, "pid"), *pf = drey_cli_opt(c, "pid-file"), *w = drey_cli_opt(c, "wait");
    if (p != NULL && pf != NULL) {
        fprintf(stderr, "drey: drain: --pid or --pid-file, not both\n");
        return DREY_EXIT_USAGE;
    }
    if (p != NULL && !parse_pid(p, &pid)) {
        fprintf(stderr, "drey: drain: --pid=%s is not a process id\n", p);
        return DREY_EXIT_USAGE;
    }
    if (pf != NULL) {
        char buf[64] = "";
        FILE *f = fopen(pf, "r");
        if (f == NULL) {
            fprintf(stderr, "drey: drain: --pid-file %s: %s\n", pf, strerror(errno));
            return DREY_EXIT_FAILED;
        }
        if (fgets(buf, sizeof buf, f) == NULL)
            buf[0] = '\0';
        fclose(f);
        buf[strcspn(buf, " \t\r\n")] = '\0';
        if (!parse_pid(buf, &pid)) {
            fprintf(stderr, "drey: drain: %s does not hold a process id\n", pf);
            return DREY_EXIT_FAILED;
        }
    }
    if (w != NULL && !drey_config_parse_duration_ms(w, &wait_ms)) {
        fprintf(stderr, "drey: drain: --wait=%s is not a duration (250ms, 5s, 2m, 1h)\n", w);
        return DREY_EXIT_USAGE;
    }
    /* In a container the hook is killed with PID 1, so waiting for the exit
     * never ends in 0 (the kubelet records 137): with --ops (or
     * $DREY_OPS_LISTEN, the pod's setting) the hook also returns once
     * dreyd's ops listener stops answering, which dreyd closes after its
     * drain, when a second signal can no longer cut anything short. */
    char ops[300];
    bool watch_ops = drey_cli_ops_address(drey_cli_opt(c, "ops"), ops, sizeof ops);
    if (kill((pid_t)pid, SIGTERM) != 0) {
        fprintf(stderr, "drey: drain: cannot signal process %ld: %s\n", pid, strerror(errno));
        return DREY_EXIT_FAILED;
    }
    int64_t deadline = drey_mono_ns() + wait_ms * 1000000;
    while (!exited(pid) && !(watch_ops && drey_cli_ops_closed(ops))) {
        if (drey_mono_ns() >= deadline) {
            fprintf(stderr, "drey: drain: process %ld still running after %lld ms\n", pid, (long long)wait_ms);
            return DREY_EXIT_FAILED;
        }
        struct timespec ts = {.tv_sec = 0, .tv_nsec = POLL_NS};
        nanosleep(&ts, NULL); /* paces the polling of another process: there is nothing to wait on */
    }
    return 0;
}
