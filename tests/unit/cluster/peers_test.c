/*
 * Unit tests for src/cluster/peers.c: a kept call's handle.
 *
 * A forwarded request's memory holds its call's handle, and the call's
 * answer may free that memory on the peers' thread at once: the handle
 * must be in place before the answer can run, and a caller that gave up
 * before the call went out gets CANCELLED without anything being sent.
 * Real peers (mutual TLS from a certificate the openssl CLI makes) calling
 * a port nobody listens on.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <grpc/status.h>

#include "drey/clock.h"
#include "src/cluster/peers.h"

#define GAVE_UP ((drey_cluster__pcall *)1)

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool done;
    int code;
    _Atomic(drey_cluster__pcall *) handle;
    drey_cluster__pcall *seen; /* *handle when done ran */
} kept;

static char dir[] = "/tmp/drey-peers-XXXXXX";
static drey_cluster__peers *peers;

static void setup(void) {
    cr_assert_not_null(mkdtemp(dir));
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout %s/n1.key -out %s/n1.pem "
             "-days 2 -subj /CN=n1 -addext subjectAltName=DNS:n1 "
             "-addext extendedKeyUsage=serverAuth,clientAuth 2>/dev/null",
             dir, dir);
    cr_assert_eq(system(cmd), 0, "openssl made a certificate");
    char cert[64], key[64], err[256] = "";
    snprintf(cert, sizeof cert, "%s/n1.pem", dir);
    snprintf(key, sizeof key, "%s/n1.key", dir);
    peers = drey_cluster__peers_create("n1", cert, key, cert, err, sizeof err);
    cr_assert_not_null(peers, "%s", err);
}

static void teardown(void) {
    drey_cluster__peers_destroy(peers);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(peers, .init = setup, .fini = teardown);

/* 127.0.0.1:<a port just let go>: connecting is refused. */
static void closed_address(char *out, size_t cap) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, len), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    snprintf(out, cap, "127.0.0.1:%u", ntohs(a.sin_port));
}

static void on_done(void *arg, const drey_answer *a) {
    kept *k = arg;
    pthread_mutex_lock(&k->mu);
    k->seen = atomic_load(&k->handle);
    k->code = a->code;
    k->done = true;
    pthread_cond_broadcast(&k->cond);
    pthread_mutex_unlock(&k->mu);
}

static void call_and_wait(kept *k) {
    pthread_mutex_init(&k->mu, NULL);
    pthread_cond_init(&k->cond, NULL);
    char address[32];
    closed_address(address, sizeof address);
    static const uint8_t request[] = {0};
    drey_cluster__peers_call_kept(peers, "n2", address, "/drey.cache.v1.Cache/Get", request, 0, NULL, 0,
                                  drey_mono_ns() + 10 * 1000000000LL, on_done, k, &k->handle);
    pthread_mutex_lock(&k->mu);
    while (!k->done)
        pthread_cond_wait(&k->cond, &k->mu); /* the call's deadline bounds it */
    pthread_mutex_unlock(&k->mu);
    pthread_mutex_destroy(&k->mu);
    pthread_cond_destroy(&k->cond);
}

Test(peers, a_kept_calls_handle_is_in_place_before_its_answer_runs) {
    for (int i = 0; i < 20; i++) {
        kept k = {.done = false};
        call_and_wait(&k);
        cr_assert(k.seen != NULL && k.seen != GAVE_UP, "round %d: the handle was kept first", i);
        cr_assert_neq(k.code, GRPC_STATUS_OK, "nobody listens there");
        cr_assert_neq(k.code, GRPC_STATUS_CANCELLED, "not cancelled: it was sent");
        drey_cluster__pcall_release(atomic_exchange(&k.handle, NULL));
    }
}

Test(peers, a_call_given_up_on_before_it_goes_out_is_cancelled_unsent) {
    kept k = {.done = false};
    atomic_store(&k.handle, GAVE_UP);
    call_and_wait(&k);
    cr_assert_eq(k.code, GRPC_STATUS_CANCELLED);
    cr_assert_eq(k.seen, GAVE_UP, "the caller's mark stays: no handle to drop");
    cr_assert_eq(atomic_load(&k.handle), GAVE_UP);
}
