/*
 * Fuzz target: the ops HTTP listener (src/ops) answering whatever bytes a
 * client sends.
 *
 * Its handler is a libmicrohttpd callback that needs a connection only
 * libmicrohttpd can make, so the target drives a real listener on loopback
 * (port 0) in front of a real, ephemeral node's readiness details and
 * metrics: each input is sent as one client's bytes on a fresh connection,
 * the write side is closed, and the answer is read to the end. This also
 * fuzzes libmicrohttpd's request parser, as deployed. The token check for
 * callers outside loopback cannot be reached from loopback; the token
 * target covers drey_auth_verify itself.
 *
 * Properties: every connection ends (the listener answers or closes within
 * 5 s), and whatever answer comes is an HTTP/1.x status line.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "drey/admin.h"
#include "drey/clock.h"
#include "drey/log.h"
#include "drey/memory.h"
#include "drey/metrics.h"
#include "drey/ops.h"
#include "drey/store.h"
#include "fuzz_util.h"

static drey_store *store;
static drey_memory *memory;
static drey_metrics *metrics;
static drey_admin *admin;
static drey_ops *ops;
static int port;

static void cleanup(void) {
    drey_ops_stop(ops);
    drey_admin_destroy(admin);
    drey_metrics_destroy(metrics);
    drey_memory_destroy(memory);
    drey_store_destroy(store);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    drey_log_set_level(DREY_LOG_LEVEL_ERROR);
    store = drey_store_create();
    drey_memory_options mo = {.limit_bytes = 64 << 20, .node_id = "fuzz"};
    memory = drey_memory_create(&mo, store);
    metrics = drey_metrics_create();
    drey_admin_options ao = {.durable = false, .fsync_policy = "never", .memory = memory, .store = store};
    admin = drey_admin_create(&ao);
    drey_metrics_add_collector(metrics, drey_admin_collect_metrics, admin);
    char err[256];
    drey_ops_options oo = {.listen = "127.0.0.1:0", .admin = admin, .metrics = metrics};
    ops = drey_ops_start(&oo, err, sizeof err);
    FUZZ_CHECK(ops != NULL, "%s", err);
    port = drey_ops_port(ops);
    atexit(cleanup);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FUZZ_CHECK(fd >= 0, "socket: %s", strerror(errno));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    /* libFuzzer's timer signal can interrupt any of these calls: a
     * connect interrupted goes on in the background. */
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        FUZZ_CHECK(errno == EINTR, "connect: %s", strerror(errno));
        struct pollfd w = {.fd = fd, .events = POLLOUT};
        while (poll(&w, 1, 5000) < 0)
            FUZZ_CHECK(errno == EINTR, "poll: %s", strerror(errno));
        int so_err = 0;
        socklen_t so_len = sizeof so_err;
        FUZZ_CHECK(getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_err, &so_len) == 0 && so_err == 0, "connect: %s",
                   strerror(so_err));
    }
    /* The listener may answer and close before it has read everything. */
    size_t sent = 0;
    while (sent < size) {
        ssize_t n = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        sent += (size_t)n;
    }
    shutdown(fd, SHUT_WR);
    char head[16];
    size_t got = 0;
    int64_t deadline = drey_mono_ms() + 5000;
    for (;;) {
        int64_t left = deadline - drey_mono_ms();
        FUZZ_CHECK(left > 0, "no end of the answer within 5 s (%zu bytes sent)", size);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)left) <= 0)
            continue;
        char buf[4096];
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break; /* closed (or reset: the listener refused the bytes) */
        for (ssize_t i = 0; i < n && got < sizeof head; i++)
            head[got++] = buf[i];
    }
    close(fd);
    if (got >= 9)
        FUZZ_CHECK(memcmp(head, "HTTP/1.", 7) == 0, "the answer starts with %.9s", head);
    return 0;
}
