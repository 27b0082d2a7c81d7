/*
 * etcd_fixture — real etcd members (Debian's /usr/bin/etcd) for the etcd
 * client's tests: each on free loopback ports (bound to :0 first, then
 * passed), its own data directory under the test's temporary directory,
 * ready once its /health says so, dying with the test process (so a failed
 * test leaves nothing running). Members can be stopped, killed and restarted
 * on the same data directory and ports.
 */
#ifndef DREY_TEST_ETCD_FIXTURE_H
#define DREY_TEST_ETCD_FIXTURE_H

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "drey/clock.h"
#include "drey/etcd.h"

#define FIXTURE_DEADLINE_MS 20000
#define FIXTURE_MAX_MEMBERS 3

typedef struct etcd_member {
    pid_t pid; /* 0: not running */
    int client_port, peer_port;
    char name[16];
    char dir[512];
    char log[512];
} etcd_member;

typedef struct etcd_cluster {
    etcd_member m[FIXTURE_MAX_MEMBERS];
    int n;
    char root[400];
    char initial_cluster[512];
    char endpoints[256]; /* "http://127.0.0.1:A,http://127.0.0.1:B,..." */
} etcd_cluster;

/* A port nothing listens on now (the socket is closed before it returns:
 * fine for a test, the kernel does not hand it out again at once). */
static inline int fixture_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0, "bind: %s", strerror(errno));
    socklen_t len = sizeof sa;
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    close(fd);
    return ntohs(sa.sin_port);
}

static inline void fixture_pause_ms(int ms) {
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* Polls cond (every 10 ms) until it holds or deadline_ms passes. */
#define FIXTURE_WAIT_UNTIL(cond, deadline_ms)                                                                      \
    ({                                                                                                             \
        int64_t until_ = drey_mono_ms() + (deadline_ms);                                                           \
        bool ok_;                                                                                                  \
        while (!(ok_ = (cond)) && drey_mono_ms() < until_)                                                         \
            fixture_pause_ms(10);                                                                                  \
        ok_;                                                                                                       \
    })

static inline void fixture_print_log(const etcd_member *m) {
    FILE *f = fopen(m->log, "r");
    if (f == NULL)
        return;
    char line[1024];
    fprintf(stderr, "--- %s's log ---\n", m->name);
    while (fgets(line, sizeof line, f) != NULL)
        fputs(line, stderr);
    fclose(f);
}

/* GET /health on the member's client port: true when etcd says it is
 * healthy (it has a leader). */
static inline bool fixture_healthy(const etcd_member *m) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return false;
    struct timeval tv = {.tv_sec = 1};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)m->client_port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bool ok = false;
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
        static const char req[] = "GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
        if (write(fd, req, sizeof req - 1) == (ssize_t)(sizeof req - 1)) {
            char buf[2048];
            size_t got = 0;
            ssize_t n;
            while (got < sizeof buf - 1 && (n = read(fd, buf + got, sizeof buf - 1 - got)) > 0)
                got += (size_t)n;
            buf[got] = '\0';
            ok = strstr(buf, " 200 ") != NULL && strstr(buf, "\"health\":\"true\"") != NULL;
        }
    }
    close(fd);
    return ok;
}

static inline void fixture_spawn(etcd_cluster *c, int i, const char *state) {
    etcd_member *m = &c->m[i];
    char client[64], peer[64];
    snprintf(client, sizeof client, "http://127.0.0.1:%d", m->client_port);
    snprintf(peer, sizeof peer, "http://127.0.0.1:%d", m->peer_port);
    char token[64];
    snprintf(token, sizeof token, "drey-test-%d", (int)getpid());
    /* Fast elections for the failover tests; the minimum lease TTL becomes
     * ceil(1.5 x 500 ms) = 1 s. */
    const char *argv[] = {"/usr/bin/etcd", "--name", m->name, "--data-dir", m->dir,
                          "--listen-client-urls", client, "--advertise-client-urls", client,
                          "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                          "--initial-cluster", c->initial_cluster, "--initial-cluster-state", state,
                          "--initial-cluster-token", token, "--heartbeat-interval", "50",
                          "--election-timeout", "500", "--logger", "zap", "--log-level", "warn", NULL};
    int log = open(m->log, O_WRONLY | O_CREAT | O_APPEND, 0644);
    cr_assert_geq(log, 0, "%s: %s", m->log, strerror(errno));
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(log, 1);
        dup2(log, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(log);
    m->pid = pid;
}

static inline void fixture_wait_healthy(etcd_cluster *c) {
    for (int i = 0; i < c->n; i++) {
        if (c->m[i].pid == 0)
            continue;
        if (!FIXTURE_WAIT_UNTIL(fixture_healthy(&c->m[i]), FIXTURE_DEADLINE_MS)) {
            fixture_print_log(&c->m[i]);
            cr_assert_fail("etcd %s did not become healthy", c->m[i].name);
        }
    }
}

/* Starts an n-member cluster and waits until every member is healthy. */
static inline void etcd_start(etcd_cluster *c, int n) {
    memset(c, 0, sizeof *c);
    cr_assert(n >= 1 && n <= FIXTURE_MAX_MEMBERS);
    c->n = n;
    const char *tmp = getenv("TEST_TMPDIR");
    snprintf(c->root, sizeof c->root, "%s/etcd-XXXXXX", tmp != NULL ? tmp : "/tmp");
    cr_assert_not_null(mkdtemp(c->root), "mkdtemp: %s", strerror(errno));
    size_t used = 0, eused = 0;
    for (int i = 0; i < n; i++) {
        etcd_member *m = &c->m[i];
        snprintf(m->name, sizeof m->name, "m%d", i);
        snprintf(m->dir, sizeof m->dir, "%s/%s", c->root, m->name);
        snprintf(m->log, sizeof m->log, "%s/%s.log", c->root, m->name);
        m->client_port = fixture_free_port();
        m->peer_port = fixture_free_port();
        used += (size_t)snprintf(c->initial_cluster + used, sizeof c->initial_cluster - used,
                                 "%s%s=http://127.0.0.1:%d", i ? "," : "", m->name, m->peer_port);
        eused += (size_t)snprintf(c->endpoints + eused, sizeof c->endpoints - eused, "%shttp://127.0.0.1:%d",
                                  i ? "," : "", m->client_port);
    }
    for (int i = 0; i < n; i++)
        fixture_spawn(c, i, "new");
    fixture_wait_healthy(c);
}

static inline void etcd_signal(etcd_cluster *c, int i, int sig) {
    cr_assert_neq(c->m[i].pid, 0);
    kill(c->m[i].pid, sig);
}

/* SIGKILL and reap. */
static inline void etcd_kill(etcd_cluster *c, int i) {
    etcd_member *m = &c->m[i];
    if (m->pid == 0)
        return;
    kill(m->pid, SIGKILL);
    waitpid(m->pid, NULL, 0);
    m->pid = 0;
}

/* Starts a killed member again on its data directory and ports, and waits
 * for the cluster to be healthy. */
static inline void etcd_restart(etcd_cluster *c, int i) {
    cr_assert_eq(c->m[i].pid, 0);
    fixture_spawn(c, i, "existing");
    fixture_wait_healthy(c);
}

static inline void etcd_stop_all(etcd_cluster *c) {
    for (int i = 0; i < c->n; i++) {
        if (c->m[i].pid != 0)
            kill(c->m[i].pid, SIGCONT); /* a stopped member cannot die of SIGKILL until it runs */
        etcd_kill(c, i);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", c->root);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", c->root);
}

/* "http://127.0.0.1:<client port of member i>" */
static inline const char *etcd_endpoint(const etcd_cluster *c, int i, char *buf, size_t cap) {
    snprintf(buf, cap, "http://127.0.0.1:%d", c->m[i].client_port);
    return buf;
}

/* Runs etcdctl against the cluster with the given arguments (a command
 * line tail), asserting it succeeds. */
static inline void etcdctl(const etcd_cluster *c, const char *args) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "ETCDCTL_API=3 /usr/bin/etcdctl --endpoints=%s %s >/dev/null", c->endpoints, args);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

static inline drey_etcd *client_of(const char *endpoints) {
    char err[256] = "";
    drey_etcd *e = drey_etcd_open(&(drey_etcd_options){.endpoints = endpoints}, err, sizeof err);
    cr_assert_not_null(e, "%s", err);
    return e;
}

#endif
