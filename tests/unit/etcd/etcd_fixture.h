/*
 * etcd_fixture — real etcd members (Debian's /usr/bin/etcd) for the etcd
 * client's tests: each on free loopback ports (checked by binding them, and
 * picked below the kernel's ephemeral range so that no outgoing connection
 * of a parallel test takes one before etcd binds it; a member that still
 * cannot start is started again on new ports), its own data directory under
 * the test's temporary directory, ready once its /health says so, dying with
 * the test process (so a failed test leaves nothing running). Members can be
 * stopped, killed and restarted on the same data directory and ports.
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
    int metrics_port; /* plain HTTP /health of a TLS member; 0: the client port */
    char name[16];
    char dir[512];
    char log[512];
} etcd_member;

/* TLS and authentication for the members (etcd_start_secure). */
typedef struct etcd_security {
    bool tls;            /* https:// client URLs, --client-cert-auth with the fixture's CA */
    int auth_token_ttl;  /* --auth-token-ttl in seconds (simple tokens); 0: etcd's */
} etcd_security;

typedef struct etcd_cluster {
    etcd_member m[FIXTURE_MAX_MEMBERS];
    int n;
    char root[400];
    char initial_cluster[512];
    char endpoints[256]; /* "http://127.0.0.1:A,http://127.0.0.1:B,..." (https:// with TLS) */
    etcd_security sec;
    /* With TLS, under root/certs: the CA, etcd's certificate (SAN IP
     * 127.0.0.1), a client certificate it signed (CN drey), another CA and
     * a client certificate that one signed. */
    char ca[512], server_cert[512], server_key[512], client_cert[512], client_key[512];
    char other_ca[512], other_cert[512], other_key[512];
} etcd_cluster;

/* The lowest port the kernel hands out for bind(0) and outgoing
 * connections. */
static inline int fixture_ephemeral_low(void) {
    int low = 32768, high;
    FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
    if (f != NULL) {
        if (fscanf(f, "%d %d", &low, &high) != 2)
            low = 32768;
        fclose(f);
    }
    return low;
}

static inline int fixture_try_bind(int port, int *fd_out) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        close(fd);
        return -1;
    }
    socklen_t len = sizeof sa;
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    *fd_out = fd;
    return ntohs(sa.sin_port);
}

/* A free loopback port, bound (not listening) by *fd until the caller
 * closes it, so ports picked together differ; NULL fd: closed at once.
 * Picked below the ephemeral range when there is room: a port bind(0)
 * gave out can be taken as the local port of some other test's outgoing
 * connection before etcd binds it ("address already in use"). */
static inline int fixture_bound_port(int *fd_out) {
    static unsigned seed;
    if (seed == 0)
        seed = (unsigned)getpid() ^ (unsigned)drey_mono_ns();
    int fd = -1, port = -1, low = fixture_ephemeral_low();
    for (int i = 0; i < 200 && port < 0 && low > 11000; i++)
        port = fixture_try_bind(10000 + (int)(rand_r(&seed) % (unsigned)(low - 10000)), &fd);
    if (port < 0)
        port = fixture_try_bind(0, &fd);
    cr_assert_gt(port, 0, "no free port");
    if (fd_out != NULL)
        *fd_out = fd;
    else
        close(fd);
    return port;
}

/* A port nothing listens on. */
static inline int fixture_free_port(void) {
    return fixture_bound_port(NULL);
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

/* GET /health on the member's client port (its metrics port with TLS):
 * true when etcd says it is healthy (it has a leader). */
static inline bool fixture_healthy(const etcd_member *m) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return false;
    struct timeval tv = {.tv_sec = 1};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int port = m->metrics_port != 0 ? m->metrics_port : m->client_port;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
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
    char client[64], peer[64], metrics[64], ttl[32];
    snprintf(client, sizeof client, "%s://127.0.0.1:%d", c->sec.tls ? "https" : "http", m->client_port);
    snprintf(metrics, sizeof metrics, "http://127.0.0.1:%d", m->metrics_port);
    snprintf(ttl, sizeof ttl, "%d", c->sec.auth_token_ttl);
    snprintf(peer, sizeof peer, "http://127.0.0.1:%d", m->peer_port);
    char token[64];
    snprintf(token, sizeof token, "drey-test-%d", (int)getpid());
    /* Fast elections for the failover tests; the minimum lease TTL becomes
     * ceil(1.5 x 500 ms) = 1 s. */
    const char *argv[40] = {"/usr/bin/etcd", "--name", m->name, "--data-dir", m->dir,
                          "--listen-client-urls", client, "--advertise-client-urls", client,
                          "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                          "--initial-cluster", c->initial_cluster, "--initial-cluster-state", state,
                          "--initial-cluster-token", token, "--heartbeat-interval", "50",
                          "--election-timeout", "500", "--logger", "zap", "--log-level", "warn",
                          /* TLS: etcd's certificate, clients' checked against the CA */
                          NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    size_t k = 0;
    while (argv[k] != NULL)
        k++;
    if (c->sec.tls) {
        argv[k++] = "--cert-file", argv[k++] = c->server_cert;
        argv[k++] = "--key-file", argv[k++] = c->server_key;
        argv[k++] = "--trusted-ca-file", argv[k++] = c->ca;
        argv[k++] = "--client-cert-auth";
        argv[k++] = "--listen-metrics-urls", argv[k++] = metrics;
    }
    if (c->sec.auth_token_ttl > 0)
        argv[k++] = "--auth-token-ttl", argv[k++] = ttl;
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

/* Waits until every running member is healthy. Returns false at once when
 * one has exited (a port taken between picking and binding), asserts on the
 * deadline. */
static inline bool fixture_wait_healthy(etcd_cluster *c) {
    int64_t until = drey_mono_ms() + FIXTURE_DEADLINE_MS;
    for (int i = 0; i < c->n; i++) {
        etcd_member *m = &c->m[i];
        while (m->pid != 0 && !fixture_healthy(m)) {
            int status;
            if (waitpid(m->pid, &status, WNOHANG) == m->pid) {
                m->pid = 0;
                fixture_print_log(m);
                return false;
            }
            if (drey_mono_ms() >= until) {
                fixture_print_log(m);
                cr_assert_fail("etcd %s did not become healthy", m->name);
            }
            fixture_pause_ms(10);
        }
    }
    return true;
}

static inline void etcd_kill(etcd_cluster *c, int i);

/* Runs a shell command, asserting it succeeds. */
static inline void fixture_sh(const char *cmd) {
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

/* Certificates with the openssl CLI: a CA, a certificate it signs with
 * subject CN and the extension lines ext (a file written here). */
static inline void fixture_issue(const char *dir, const char *ca, const char *name, const char *cn, const char *ext) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && printf '%s' > %s.ext && "
             "openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout %s.key -out %s.csr "
             "-subj /CN=%s 2>/dev/null && "
             "openssl x509 -req -in %s.csr -CA %s.pem -CAkey %s.key -CAcreateserial -out %s.pem -days 2 "
             "-extfile %s.ext 2>/dev/null",
             dir, ext, name, name, name, cn, name, ca, ca, name, name);
    fixture_sh(cmd);
}

static inline void fixture_certs(etcd_cluster *c) {
    char dir[480], cmd[1024];
    snprintf(dir, sizeof dir, "%s/certs", c->root);
    cr_assert_eq(mkdir(dir, 0700), 0);
    for (int k = 0; k < 2; k++) {
        const char *ca = k == 0 ? "ca" : "other-ca";
        snprintf(cmd, sizeof cmd,
                 "cd '%s' && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout %s.key "
                 "-out %s.pem -days 2 -subj /CN=%s 2>/dev/null",
                 dir, ca, ca, ca);
        fixture_sh(cmd);
    }
    fixture_issue(dir, "ca", "server", "etcd", "subjectAltName=IP:127.0.0.1,DNS:localhost\\n"
                                                 "extendedKeyUsage=serverAuth,clientAuth\\n");
    fixture_issue(dir, "ca", "client", "drey", "extendedKeyUsage=clientAuth\\n");
    fixture_issue(dir, "other-ca", "other", "drey", "extendedKeyUsage=clientAuth\\n");
    snprintf(c->ca, sizeof c->ca, "%s/ca.pem", dir);
    snprintf(c->server_cert, sizeof c->server_cert, "%s/server.pem", dir);
    snprintf(c->server_key, sizeof c->server_key, "%s/server.key", dir);
    snprintf(c->client_cert, sizeof c->client_cert, "%s/client.pem", dir);
    snprintf(c->client_key, sizeof c->client_key, "%s/client.key", dir);
    snprintf(c->other_ca, sizeof c->other_ca, "%s/other-ca.pem", dir);
    snprintf(c->other_cert, sizeof c->other_cert, "%s/other.pem", dir);
    snprintf(c->other_key, sizeof c->other_key, "%s/other.key", dir);
}

static inline void etcd_start_secure(etcd_cluster *c, int n, const etcd_security *sec);

/* Starts an n-member cluster and waits until every member is healthy; new
 * ports and a clean directory when a member could not start. */
static inline void etcd_start(etcd_cluster *c, int n) {
    etcd_start_secure(c, n, NULL);
}

/* etcd_start, with TLS (certificates made under the cluster's directory)
 * and authentication settings. */
static inline void etcd_start_secure(etcd_cluster *c, int n, const etcd_security *sec) {
    memset(c, 0, sizeof *c);
    cr_assert(n >= 1 && n <= FIXTURE_MAX_MEMBERS);
    c->n = n;
    if (sec != NULL)
        c->sec = *sec;
    const char *tmp = getenv("TEST_TMPDIR");
    for (int attempt = 0;; attempt++) {
        snprintf(c->root, sizeof c->root, "%s/etcd-XXXXXX", tmp != NULL ? tmp : "/tmp");
        cr_assert_not_null(mkdtemp(c->root), "mkdtemp: %s", strerror(errno));
        if (c->sec.tls)
            fixture_certs(c);
        size_t used = 0, eused = 0;
        int held[3 * FIXTURE_MAX_MEMBERS];
        for (int i = 0; i < n; i++) {
            etcd_member *m = &c->m[i];
            snprintf(m->name, sizeof m->name, "m%d", i);
            snprintf(m->dir, sizeof m->dir, "%.400s/m%d", c->root, i);
            snprintf(m->log, sizeof m->log, "%.400s/m%d.log", c->root, i);
            m->client_port = fixture_bound_port(&held[3 * i]);
            m->peer_port = fixture_bound_port(&held[3 * i + 1]);
            m->metrics_port = c->sec.tls ? fixture_bound_port(&held[3 * i + 2]) : 0;
            if (!c->sec.tls)
                held[3 * i + 2] = -1;
            used += (size_t)snprintf(c->initial_cluster + used, sizeof c->initial_cluster - used,
                                     "%sm%d=http://127.0.0.1:%d", i ? "," : "", i, m->peer_port);
            eused += (size_t)snprintf(c->endpoints + eused, sizeof c->endpoints - eused, "%s%s://127.0.0.1:%d",
                                      i ? "," : "", c->sec.tls ? "https" : "http", m->client_port);
        }
        for (int i = 0; i < 3 * n; i++) {
            if (held[i] >= 0)
                close(held[i]); /* just before etcd binds them */
        }
        for (int i = 0; i < n; i++)
            fixture_spawn(c, i, "new");
        if (fixture_wait_healthy(c))
            return;
        cr_assert_lt(attempt, 4, "etcd would not start");
        for (int i = 0; i < n; i++)
            etcd_kill(c, i);
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", c->root);
        cr_assert_eq(system(cmd), 0);
    }
}

/* The process's state letter from /proc/<pid>/stat ('T' when stopped). */
static inline char fixture_proc_state(pid_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return '?';
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *close_paren = strrchr(buf, ')');
    return close_paren != NULL && close_paren[1] == ' ' ? close_paren[2] : '?';
}

/* Sends sig; for SIGSTOP, returns once the member has stopped (kill returns
 * before its threads have, and a request could still be answered). */
static inline void etcd_signal(etcd_cluster *c, int i, int sig) {
    cr_assert_neq(c->m[i].pid, 0);
    kill(c->m[i].pid, sig);
    if (sig == SIGSTOP)
        cr_assert(FIXTURE_WAIT_UNTIL(fixture_proc_state(c->m[i].pid) == 'T', FIXTURE_DEADLINE_MS),
                  "etcd %s did not stop", c->m[i].name);
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
    cr_assert(fixture_wait_healthy(c), "etcd %s exited on restart", c->m[i].name);
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

/* "http://127.0.0.1:<client port of member i>" (https:// with TLS) */
static inline const char *etcd_endpoint(const etcd_cluster *c, int i, char *buf, size_t cap) {
    snprintf(buf, cap, "%s://127.0.0.1:%d", c->sec.tls ? "https" : "http", c->m[i].client_port);
    return buf;
}

/* Runs etcdctl against the cluster with the given arguments (a command
 * line tail, which may carry --user), asserting it succeeds. */
static inline void etcdctl(const etcd_cluster *c, const char *args) {
    char cmd[4096], tls[1700] = "";
    if (c->sec.tls)
        snprintf(tls, sizeof tls, "--cacert=%s --cert=%s --key=%s", c->ca, c->client_cert, c->client_key);
    snprintf(cmd, sizeof cmd, "ETCDCTL_API=3 /usr/bin/etcdctl --endpoints=%s %s %s >/dev/null 2>&1", c->endpoints,
             tls, args);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

static inline drey_etcd *client_of(const char *endpoints) {
    char err[256] = "";
    drey_etcd *e = drey_etcd_open(&(drey_etcd_options){.endpoints = endpoints}, err, sizeof err);
    cr_assert_not_null(e, "%s", err);
    return e;
}

#endif
