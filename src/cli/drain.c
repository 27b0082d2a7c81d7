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
 * In a container, though, the hook is killed with PID 1: a hook that waits
 * for the exit never exits 0 itself (the kubelet records 137, "preStop
 * failed"). So with --ops (or $DREY_OPS_LISTEN, the pod's setting) the hook
 * also returns once dreyd's ops listener stops answering: dreyd closes it
 * after its drain (partitions handed over, the grace period, in-flight
 * calls finished), when a second signal can no longer cut anything short.
 *
 * "Exited" is: no such process, or a zombie not yet reaped (a test's
 * child). Exit status 0 when it exited (or closed its ops listener), 1
 * when it was still running at the deadline or could not be signalled, 2
 * on a usage error.
 */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "drain.h"
#include "drey/clock.h"
#include "drey/config.h"
#include "ops.h"

#define POLL_NS 20000000 /* 20 ms between looks at the process */

static void drain_usage(FILE *out) {
    fprintf(out, "usage: drey drain [--pid=N] [--wait=D] [--ops=HOST:PORT]\n\n"
                 "Sends dreyd SIGTERM and waits until it has drained: a preStop hook that keeps the\n"
                 "kubelet's own SIGTERM (which would cut the drain short) from arriving mid-drain.\n\n"
                 "  --pid=N   dreyd's process id (default 1: the container's entry point)\n"
                 "  --wait=D  give up after D (default 60s; keep it inside terminationGracePeriodSeconds)\n"
                 "  --ops=A   dreyd's ops listener (default $DREY_OPS_LISTEN): done once it closes, which\n"
                 "            dreyd does when its drain is over (a hook is killed with PID 1's exit)\n\n"
                 "Exit status: 0 dreyd drained (exited, or closed its ops listener); 1 it could not be\n"
                 "signalled or was still running; 2 usage.\n");
}

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

int drey_cli_drain(int argc, char **argv) {
    long pid = 1;
    int64_t wait_ms = 60000;
    const char *ops_flag = NULL;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            drain_usage(stdout);
            return 0;
        }
        if (strncmp(a, "--pid=", 6) == 0) {
            char *end;
            errno = 0;
            pid = strtol(a + 6, &end, 10);
            if (errno != 0 || end == a + 6 || *end != '\0' || pid < 1) {
                fprintf(stderr, "drey: drain: --pid=%s is not a process id\n", a + 6);
                return 2;
            }
        } else if (strncmp(a, "--ops=", 6) == 0) {
            ops_flag = a + 6;
        } else if (strncmp(a, "--wait=", 7) == 0) {
            if (!drey_config_parse_duration_ms(a + 7, &wait_ms)) {
                fprintf(stderr, "drey: drain: --wait=%s is not a duration (250ms, 5s, 2m, 1h)\n", a + 7);
                return 2;
            }
        } else {
            fprintf(stderr, "drey: drain: unknown argument %s\n", a);
            drain_usage(stderr);
            return 2;
        }
    }
    char ops[300];
    bool watch_ops = drey_cli_ops_address(ops_flag, ops, sizeof ops);
    if (kill((pid_t)pid, SIGTERM) != 0) {
        fprintf(stderr, "drey: drain: cannot signal process %ld: %s\n", pid, strerror(errno));
        return 1;
    }
    int64_t deadline = drey_mono_ns() + wait_ms * 1000000;
    while (!exited(pid) && !(watch_ops && drey_cli_ops_closed(ops))) {
        if (drey_mono_ns() >= deadline) {
            fprintf(stderr, "drey: drain: process %ld still running after %lld ms\n", pid, (long long)wait_ms);
            return 1;
        }
        struct timespec ts = {.tv_sec = 0, .tv_nsec = POLL_NS};
        nanosleep(&ts, NULL); /* paces the polling of another process: there is nothing to wait on */
    }
    return 0;
}
