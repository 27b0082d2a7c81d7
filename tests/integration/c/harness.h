/*
 * harness — runs the real dreyd (and the drey CLI) for the C integration
 * tests.
 *
 * harness_start() spawns dreyd on 127.0.0.1:0 with its log in a temporary
 * file and waits, with a deadline and without sleeping, for the JSON
 * "listening" line that names the port. harness_stop() sends SIGTERM and
 * asserts that dreyd exits 0 (under ASan that includes "no leaks"). The child
 * dies with the test process, so a failed test leaves nothing running.
 */
#ifndef DREY_TEST_HARNESS_H
#define DREY_TEST_HARNESS_H

#include <stdbool.h>
#include <sys/types.h>

#include "drey/cache/v1/cache.pb-c.h"
#include "drey/client.h"

#define HARNESS_DEADLINE_MS 30000

typedef struct harness_server {
    pid_t pid;
    int pidfd;          /* readable once dreyd has exited */
    int port;
    char addr[32];      /* "127.0.0.1:<port>" */
    char log_path[512]; /* dreyd's stderr */
    char data_dir[512]; /* its own --data-dir, removed by harness_stop */
} harness_server;

/* The path of a binary of this workspace: $TEST_SRCDIR/drey/<name>, else
 * bazel-bin/<name>. */
const char *harness_binary(const char *name, char *buf, size_t cap);

/* Starts dreyd with --listen=127.0.0.1:0 --drain-grace=0 --data-dir=<a new
 * temporary directory> and then the NULL-terminated extra flags (later flags
 * win). Returns once health reports "" SERVING (recovery done); asserts it
 * got there. */
void harness_start(harness_server *s, const char *const *extra_flags);

/* SIGTERM; asserts dreyd exits 0 within the deadline (its log is printed
 * otherwise). Removes the data directory. */
void harness_stop(harness_server *s);

/* SIGKILL: dreyd is reaped and its files removed, its exit not checked (a
 * crash under test). */
void harness_kill(harness_server *s);

/* Another program in the background (etcd), its output in a temporary
 * file; it dies with the test process. */
typedef struct harness_proc {
    pid_t pid;
    int pidfd;
    char log_path[512];
} harness_proc;
void harness_spawn(harness_proc *p, const char *const *argv);
/* SIGKILL, reap, remove the output. */
void harness_proc_kill(harness_proc *p);

/* A free loopback TCP port (bound and released: for a program that takes
 * no port 0). */
int harness_free_port(void);

/* A new directory under $TEST_TMPDIR (or /tmp) into buf; harness_rmdir
 * removes it and what it holds. */
void harness_mkdtemp(char *buf, size_t cap, const char *stem);
void harness_rmdir(const char *path);

/* Sends sig to dreyd (harness_stop still reaps it). */
void harness_signal(const harness_server *s, int sig);

/* dreyd's log so far (malloc'd, NUL-terminated). */
char *harness_log(const harness_server *s);

/* Waits (deadline, no sleeping) for a complete log line containing needle;
 * false if dreyd exited or the deadline passed first. */
bool harness_wait_log(const harness_server *s, const char *needle);

/* A client of s (asserts it opened). */
drey_client *harness_client(const harness_server *s);
drey_client *harness_client_with(const harness_server *s, const drey_client_options *base);

/* The usual fixture: a dreyd, a client of it, an arena for results. */
typedef struct harness_env {
    harness_server server;
    drey_client *client;
    drey_arena arena;
} harness_env;

void harness_up(harness_env *env, const char *const *extra_flags);
void harness_down(harness_env *env);

/* A unary call that must succeed: returns the response (in env->arena). */
void *harness_ok(harness_env *env, const char *method, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *response_type);
/* A unary call that must fail with code; *st describes the failure. */
void harness_fails(harness_env *env, const char *method, const ProtobufCMessage *req,
                   const ProtobufCMessageDescriptor *response_type, grpc_status_code code, drey_client_status *st);

/* Request pieces in env->arena. */
Drey__Cache__V1__Value *harness_string(harness_env *env, const char *s);
Drey__Cache__V1__Value *harness_int(harness_env *env, int64_t v);
Google__Protobuf__Duration *harness_duration(harness_env *env, int64_t ms);
/* Wall-clock milliseconds. */
int64_t harness_wall_ms(void);

/* Runs argv (argv[0] a path) with stdout and stderr captured (malloc'd into
 * *out and *err unless NULL); asserts it ends within the deadline. Returns
 * its exit status. */
int harness_run(const char *const *argv, char **out, char **err);

#endif
