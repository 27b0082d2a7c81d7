/*
 * ops — the CLI's side of dreyd's HTTP ops listener: readiness details from
 * loopback, where they need no token (`drey ready` inside a pod, with
 * $DREY_OPS_LISTEN from the pod's environment), and whether the listener
 * has closed (dreyd closes it once its drain is over: `drey drain`).
 */
#include "ops.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "drey/alloc.h"

bool drey_cli_ops_address(const char *flag, char *out, size_t cap) {
    const char *a = flag != NULL ? flag : getenv("DREY_OPS_LISTEN");
    if (a == NULL || a[0] == '\0')
        return false;
    if (strncmp(a, "0.0.0.0:", 8) == 0)
        snprintf(out, cap, "127.0.0.1:%s", a + 8);
    else if (strncmp(a, "[::]:", 5) == 0)
        snprintf(out, cap, "[::1]:%s", a + 5);
    else
        snprintf(out, cap, "%s", a);
    return true;
}

/* A connected socket to host:port, or -1 with errno (ECONNREFUSED: nothing
 * listens) and err. */
static int dial(const char *addr, char *err, size_t cap) {
    char host[256];
    const char *colon = strrchr(addr, ':');
    if (colon == NULL || (size_t)(colon - addr) >= sizeof host) {
        snprintf(err, cap, "%s: expected host:port", addr);
        errno = EINVAL;
        return -1;
    }
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = '\0';
    char *h = host;
    if (h[0] == '[' && h[strlen(h) - 1] == ']') {
        h[strlen(h) - 1] = '\0';
        h++;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res;
    int gai = getaddrinfo(h, colon + 1, &hints, &res);
    if (gai != 0) {
        snprintf(err, cap, "%s: %s", addr, gai_strerror(gai));
        errno = EINVAL;
        return -1;
    }
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int saved = 0;
    if (fd >= 0) {
        struct timeval tv = {.tv_sec = 10};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        if (connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
            saved = errno;
            close(fd);
            fd = -1;
        }
    } else {
        saved = errno;
    }
    freeaddrinfo(res);
    if (fd < 0) {
        snprintf(err, cap, "%s: %s", addr, strerror(saved));
        errno = saved;
    }
    return fd;
}

bool drey_cli_ops_closed(const char *addr) {
    char err[300];
    int fd = dial(addr, err, sizeof err);
    if (fd >= 0) {
        close(fd);
        return false;
    }
    return errno == ECONNREFUSED;
}

int drey_cli_ops_get(const char *addr, const char *path, char **body, size_t *len, char *err, size_t cap) {
    *body = NULL;
    *len = 0;
    int fd = dial(addr, err, cap);
    if (fd < 0)
        return 0;
    char req[512];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: %s\r\n\r\n", path, addr);
    if (n < 0 || (size_t)n >= sizeof req || write(fd, req, (size_t)n) != n) {
        snprintf(err, cap, "%s: the request could not be sent", addr);
        close(fd);
        return 0;
    }
    size_t have = 0, size = 8192;
    char *buf = drey_xmalloc(size);
    for (ssize_t r; (r = read(fd, buf + have, size - have - 1)) > 0;) {
        have += (size_t)r;
        if (have == size - 1)
            buf = drey_xrealloc(buf, size *= 2, 1);
    }
    close(fd);
    buf[have] = '\0';
    int status = 0;
    char *start = strstr(buf, "\r\n\r\n");
    if (sscanf(buf, "HTTP/%*d.%*d %d", &status) != 1 || start == NULL) {
        snprintf(err, cap, "%s: not an HTTP answer", addr);
        free(buf);
        return 0;
    }
    start += 4;
    *len = have - (size_t)(start - buf);
    *body = drey_xmalloc(*len + 1);
    memcpy(*body, start, *len);
    (*body)[*len] = '\0';
    free(buf);
    return status;
}
