/*
 * harness — see harness.h.
 */
#include "harness.h"

#include "grpc/health/v1/health.pb-c.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static const char *tmp_dir(void) {
    const char *d = getenv("TEST_TMPDIR");
    return d != NULL && d[0] != '\0' ? d : "/tmp";
}

/* A new empty file in the temporary directory; its path goes to buf. */
static int temp_file(const char *stem, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/%s-XXXXXX", tmp_dir(), stem);
    int fd = mkstemp(buf);
    cr_assert_geq(fd, 0, "mkstemp %s: %s", buf, strerror(errno));
    return fd;
}

static char *read_all(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    size_t cap = 4096, len = 0, n;
    char *buf = malloc(cap);
    while ((n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (len + 1 == cap)
            buf = realloc(buf, cap *= 2);
    }
    fclose(f);
    buf[len] = '\0';
    return buf;
}

const char *harness_binary(const char *name, char *buf, size_t cap) {
    const char *srcdir = getenv("TEST_SRCDIR");
    if (srcdir != NULL) {
        snprintf(buf, cap, "%s/drey/%s", srcdir, name);
        if (access(buf, X_OK) == 0)
            return buf;
    }
    snprintf(buf, cap, "bazel-bin/%s", name);
    cr_assert_eq(access(buf, X_OK), 0, "cannot find the %s binary (runfiles or bazel-bin)", name);
    return buf;
}

/* Forks and execs argv with stdout and stderr on the given fds. The child
 * gets SIGKILL if the test process dies first. */
static pid_t spawn(const char *const *argv, int out_fd, int err_fd, int *pidfd) {
    pid_t parent = getpid();
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull < 0 || dup2(devnull, 0) < 0 || dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0)
            _exit(127);
        execve(argv[0], (char *const *)argv, environ);
        _exit(127);
    }
    *pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    cr_assert_geq(*pidfd, 0, "pidfd_open: %s", strerror(errno));
    return pid;
}

/* Waits for the child behind pidfd to exit, up to timeout_ms; returns its
 * wait status, or -1 on timeout (the child is then killed). */
static int wait_exit(pid_t pid, int pidfd, int64_t timeout_ms) {
    struct pollfd p = {.fd = pidfd, .events = POLLIN};
    int64_t deadline = now_ms() + timeout_ms;
    int r;
    do {
        int64_t left = deadline - now_ms();
        r = poll(&p, 1, left > 0 ? (int)left : 0);
    } while (r < 0 && errno == EINTR);
    int status = 0;
    if (r == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        return -1;
    }
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    return status;
}

/* Waits until log holds a complete line containing every needle; returns
 * a copy of the line, or NULL if dreyd exited or the deadline passed. Woken
 * by inotify on the log file and by the pidfd, never by a timer. */
static char *wait_line(const harness_server *s, const char *needle, const char *needle2, bool *exited) {
    int ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    cr_assert_geq(ifd, 0);
    cr_assert_geq(inotify_add_watch(ifd, s->log_path, IN_MODIFY), 0);
    int64_t deadline = now_ms() + HARNESS_DEADLINE_MS;
    char *found = NULL;
    *exited = false;
    for (;;) {
        /* Read after the watch exists: a write between this read and the
         * poll below still wakes the poll. */
        char *log = harness_log(s);
        for (const char *line = log; *line != '\0' && found == NULL;) {
            const char *end = strchr(line, '\n');
            if (end == NULL)
                break; /* a line still being written */
            char *copy = strndup(line, (size_t)(end - line));
            if (strstr(copy, needle) != NULL && (needle2 == NULL || strstr(copy, needle2) != NULL))
                found = copy;
            else
                free(copy);
            line = end + 1;
        }
        free(log);
        if (found != NULL)
            break;
        struct pollfd p[2] = {{.fd = ifd, .events = POLLIN}, {.fd = s->pidfd, .events = POLLIN}};
        int64_t left = deadline - now_ms();
        int r = poll(p, 2, left > 0 ? (int)left : 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r == 0)
            break;
        if (p[1].revents & POLLIN) {
            *exited = true;
            break;
        }
        char events[4096];
        while (read(ifd, events, sizeof events) > 0) {
        }
    }
    close(ifd);
    return found;
}

bool harness_wait_log(const harness_server *s, const char *needle) {
    bool exited;
    char *line = wait_line(s, needle, NULL, &exited);
    free(line);
    return line != NULL;
}

/* Waits for health "" to be SERVING: a durable node listens while it
 * recovers and refuses cache calls until then. */
static bool wait_serving(const harness_server *s, char *why, size_t why_cap) {
    drey_client *c = harness_client(s);
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    drey_client_status st;
    drey_client_stream *w =
        drey_client_stream_start(c, DREY_CLIENT_HEALTH("Watch"), &req.base, HARNESS_DEADLINE_MS, &st);
    bool serving = false;
    if (w != NULL) {
        ProtobufCMessage *m;
        while (!serving && drey_client_stream_read(w, &grpc__health__v1__health_check_response__descriptor, &a, &m))
            serving = ((Grpc__Health__V1__HealthCheckResponse *)m)->status ==
                      GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
        drey_client_stream_cancel(w);
        drey_client_stream_finish(w, &a, &st);
    }
    if (!serving)
        snprintf(why, why_cap, "health never said SERVING: %s %s", drey_client_code_name(st.code), st.message);
    drey_arena_destroy(&a);
    drey_client_close(c);
    return serving;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

/* Kills a dreyd that failed to start and removes its files; returns its
 * log. */
static char *abandon(harness_server *s) {
    char *log = harness_log(s);
    kill(s->pid, SIGKILL);
    int status;
    waitpid(s->pid, &status, 0);
    close(s->pidfd);
    s->pid = 0;
    unlink(s->log_path);
    nftw(s->data_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return log;
}

void harness_start(harness_server *s, const char *const *extra_flags) {
    memset(s, 0, sizeof *s);
    char bin[1024];
    harness_binary("dreyd", bin, sizeof bin);
    snprintf(s->data_dir, sizeof s->data_dir, "%s/dreyd-data-XXXXXX", tmp_dir());
    cr_assert_not_null(mkdtemp(s->data_dir), "mkdtemp: %s", strerror(errno));
    char data_flag[600];
    snprintf(data_flag, sizeof data_flag, "--data-dir=%s", s->data_dir);
    /* The ops listener's default port (9090) is shared by every server:
     * each test server takes a free one instead. */
    const char *argv[64] = {bin, "--listen=127.0.0.1:0", "--ops-listen=127.0.0.1:0", "--drain-grace=0", data_flag};
    size_t argc = 5;
    for (size_t i = 0; extra_flags != NULL && extra_flags[i] != NULL; i++) {
        cr_assert_lt(argc, sizeof argv / sizeof argv[0] - 1);
        argv[argc++] = extra_flags[i];
    }
    argv[argc] = NULL;

    int log_fd = temp_file("dreyd.log", s->log_path, sizeof s->log_path);
    s->pid = spawn(argv, log_fd, log_fd, &s->pidfd);
    close(log_fd);
    bool exited;
    char *line = wait_line(s, "\"msg\":\"listening\"", "\"port\":", &exited);
    if (line == NULL) {
        char *log = abandon(s);
        cr_assert_fail("dreyd did not start (%s); its log:\n%s", exited ? "it exited" : "deadline passed", log);
    }
    s->port = atoi(strstr(line, "\"port\":") + strlen("\"port\":"));
    free(line);
    cr_assert_gt(s->port, 0);
    snprintf(s->addr, sizeof s->addr, "127.0.0.1:%d", s->port);
    char why[512];
    if (!wait_serving(s, why, sizeof why)) {
        char *log = abandon(s);
        cr_assert_fail("dreyd did not become ready (%s); its log:\n%s", why, log);
    }
}

void harness_kill(harness_server *s) {
    if (s->pid <= 0)
        return;
    char *log = abandon(s);
    free(log);
}

void harness_spawn(harness_proc *p, const char *const *argv) {
    memset(p, 0, sizeof *p);
    int fd = temp_file("proc.log", p->log_path, sizeof p->log_path);
    p->pid = spawn(argv, fd, fd, &p->pidfd);
    close(fd);
}

void harness_proc_kill(harness_proc *p) {
    if (p->pid <= 0)
        return;
    kill(p->pid, SIGKILL);
    int status;
    waitpid(p->pid, &status, 0);
    close(p->pidfd);
    p->pid = 0;
    unlink(p->log_path);
}

int harness_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0, "bind: %s", strerror(errno));
    socklen_t len = sizeof a;
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

void harness_mkdtemp(char *buf, size_t cap, const char *stem) {
    snprintf(buf, cap, "%s/%s-XXXXXX", tmp_dir(), stem);
    cr_assert_not_null(mkdtemp(buf), "mkdtemp: %s", strerror(errno));
}

void harness_rmdir(const char *path) {
    nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

void harness_signal(const harness_server *s, int sig) {
    cr_assert_eq(kill(s->pid, sig), 0);
}

void harness_stop(harness_server *s) {
    if (s->pid <= 0)
        return;
    kill(s->pid, SIGTERM);
    int status = wait_exit(s->pid, s->pidfd, HARNESS_DEADLINE_MS);
    close(s->pidfd);
    s->pid = 0;
    char *log = harness_log(s);
    bool ok = status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok)
        fprintf(stderr, "dreyd log:\n%s\n", log);
    free(log);
    unlink(s->log_path);
    nftw(s->data_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    cr_assert(status != -1, "dreyd did not exit within %d ms of SIGTERM", HARNESS_DEADLINE_MS);
    cr_assert(WIFEXITED(status), "dreyd died of signal %d", WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    cr_assert_eq(WEXITSTATUS(status), 0, "dreyd exited %d", WEXITSTATUS(status));
}

char *harness_log(const harness_server *s) {
    return read_all(s->log_path);
}

drey_client *harness_client_with(const harness_server *s, const drey_client_options *base) {
    drey_client_options opts = base != NULL ? *base : (drey_client_options){0};
    opts.target = s->addr;
    char err[256];
    drey_client *c = drey_client_open(&opts, err, sizeof err);
    cr_assert_not_null(c, "%s", err);
    return c;
}

drey_client *harness_client(const harness_server *s) {
    return harness_client_with(s, NULL);
}

int harness_run(const char *const *argv, char **out, char **err) {
    char out_path[512], err_path[512];
    int out_fd = temp_file("stdout", out_path, sizeof out_path);
    int err_fd = temp_file("stderr", err_path, sizeof err_path);
    int pidfd;
    pid_t pid = spawn(argv, out_fd, err_fd, &pidfd);
    close(out_fd);
    close(err_fd);
    int status = wait_exit(pid, pidfd, HARNESS_DEADLINE_MS);
    close(pidfd);
    char *o = read_all(out_path), *e = read_all(err_path);
    unlink(out_path);
    unlink(err_path);
    cr_assert(status != -1, "%s did not finish within %d ms; stderr:\n%s", argv[0], HARNESS_DEADLINE_MS, e);
    cr_assert(WIFEXITED(status), "%s died of signal %d; stderr:\n%s", argv[0],
              WIFSIGNALED(status) ? WTERMSIG(status) : 0, e);
    if (out != NULL)
        *out = o;
    else
        free(o);
    if (err != NULL)
        *err = e;
    else
        free(e);
    return WEXITSTATUS(status);
}

void harness_up(harness_env *env, const char *const *extra_flags) {
    memset(env, 0, sizeof *env);
    drey_arena_init(&env->arena, NULL, 0);
    harness_start(&env->server, extra_flags);
    env->client = harness_client(&env->server);
}

void harness_down(harness_env *env) {
    drey_client_close(env->client);
    env->client = NULL;
    drey_arena_destroy(&env->arena);
    harness_stop(&env->server);
}

void *harness_ok(harness_env *env, const char *method, const ProtobufCMessage *req,
                 const ProtobufCMessageDescriptor *response_type) {
    ProtobufCMessage *resp;
    drey_client_status st;
    grpc_status_code code = drey_client_unary(env->client, method, req, response_type, 10000, &env->arena, &resp, &st);
    cr_assert_eq(code, GRPC_STATUS_OK, "%s: %s: %s (%s)", method, drey_client_code_name(code), st.message,
                 drey_client_status_reason(&st));
    cr_assert_not_null(resp);
    return resp;
}

void harness_fails(harness_env *env, const char *method, const ProtobufCMessage *req,
                   const ProtobufCMessageDescriptor *response_type, grpc_status_code code, drey_client_status *st) {
    ProtobufCMessage *resp;
    grpc_status_code got = drey_client_unary(env->client, method, req, response_type, 10000, &env->arena, &resp, st);
    cr_assert_eq(got, code, "%s: want %s, got %s: %s (%s)", method, drey_client_code_name(code),
                 drey_client_code_name(got), st->message, drey_client_status_reason(st));
    cr_assert_null(resp);
}

Drey__Cache__V1__Value *harness_string(harness_env *env, const char *s) {
    Drey__Cache__V1__Value *v = drey_arena_alloc(&env->arena, sizeof *v);
    drey__cache__v1__value__init(v);
    v->kind_case = DREY__CACHE__V1__VALUE__KIND_STRING_VALUE;
    v->string_value = (char *)s;
    return v;
}

Drey__Cache__V1__Value *harness_int(harness_env *env, int64_t n) {
    Drey__Cache__V1__Value *v = drey_arena_alloc(&env->arena, sizeof *v);
    drey__cache__v1__value__init(v);
    v->kind_case = DREY__CACHE__V1__VALUE__KIND_INT64_VALUE;
    v->int64_value = n;
    return v;
}

Google__Protobuf__Duration *harness_duration(harness_env *env, int64_t ms) {
    Google__Protobuf__Duration *d = drey_arena_alloc(&env->arena, sizeof *d);
    google__protobuf__duration__init(d);
    d->seconds = ms / 1000;
    d->nanos = (int32_t)(ms % 1000) * 1000000;
    return d;
}

int64_t harness_wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}
