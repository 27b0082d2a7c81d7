/*
 * ops — the HTTP listener; see include/drey/ops.h.
 *
 * libmicrohttpd runs its own polling thread; every answer is built in
 * memory (open_memstream) and handed over as a copy, so nothing here
 * outlives a request.
 */
#include "drey/ops.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/log.h"
#include "drey/pbjson.h"

struct drey_ops {
    drey_ops_options opts;
    struct MHD_Daemon *daemon;
    int port;
};

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *type, const char *body,
                                 size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (r == NULL)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "Cache-Control", "no-store");
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

/* libmicrohttpd's own complaints (a client speaking HTTP/2 or garbage to
 * this port, say) would go to stderr as bare text: every line dreyd writes
 * is JSON. */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    size_t n = strlen(line);
    while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        line[--n] = '\0';
    DREY_LOG_WARN("ops listener", DREY_LOG_STR("detail", line));
}

static bool from_loopback(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (info == NULL || info->client_addr == NULL)
        return false;
    const struct sockaddr *sa = info->client_addr;
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)(const void *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(a))
            return true;
        return IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127;
    }
    return false;
}

/* 200, or why not: 401 (no token the node's keys verify), 403 (a policy
 * that does not grant the caller metrics). */
static unsigned authorized(drey_ops *o, struct MHD_Connection *c, const char *url) {
    if (from_loopback(c))
        return MHD_HTTP_OK;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (o->opts.authz == NULL) {
        char sub[256];
        return h != NULL && o->opts.auth != NULL &&
                       drey_auth_verify(o->opts.auth, h, strlen(h), drey_wall_ms(), sub, sizeof sub) == DREY_ERR_NONE
                   ? MHD_HTTP_OK
                   : MHD_HTTP_UNAUTHORIZED;
    }
    /* With a policy: the metrics verb, from the token's grants or the
     * anonymous bindings' (a scraper needs no all-powerful token). */
    char sub[256] = "";
    void *g = NULL;
    if (h == NULL)
        g = drey_authz_grants_for(o->opts.authz, NULL, 0);
    else if (o->opts.auth == NULL ||
             drey_auth_verify_attached(o->opts.auth, h, strlen(h), drey_wall_ms(), sub, sizeof sub, &g) != DREY_ERR_NONE)
        return MHD_HTTP_UNAUTHORIZED;
    drey_authz_ask ask = {.verb = DREY_AUTHZ_METRICS, .scope = DREY_AUTHZ_NODE};
    bool ok = g != NULL && drey_authz_allows(g, &ask);
    drey_authz_grants_unref(g);
    if (!ok) {
        drey_status st;
        drey_status_init(&st);
        char who[300];
        snprintf(who, sizeof who, "%s%s", sub[0] != '\0' ? "jwt:" : "http", sub);
        drey_authz_deny(o->opts.authz, who, DREY_AUTHZ_METRICS, NULL, 0, url, &st);
        return MHD_HTTP_FORBIDDEN;
    }
    return MHD_HTTP_OK;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **state) {
    (void)version, (void)upload;
    drey_ops *o = cls;
    if (*state == NULL) {
        *state = o; /* headers seen; the body (if any) comes next */
        return MHD_YES;
    }
    *upload_size = 0;
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return send_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "text/plain", "method not allowed\n", 19);
    if (strcmp(url, "/health/live") == 0)
        return send_text(c, MHD_HTTP_OK, "text/plain", "ok\n", 3);

    char scratch[4096];
    drey_arena a;
    drey_arena_init(&a, scratch, sizeof scratch);
    enum MHD_Result rc;
    if (strcmp(url, "/health/ready") == 0) {
        bool ready = drey_admin_readiness(o->opts.admin, &a)->ready;
        rc = ready ? send_text(c, MHD_HTTP_OK, "text/plain", "ready\n", 6)
                   : send_text(c, MHD_HTTP_SERVICE_UNAVAILABLE, "text/plain", "not ready\n", 10);
    } else if (strcmp(url, "/health/ready/details") == 0 || strcmp(url, "/metrics") == 0) {
        unsigned verdict = authorized(o, c, url);
        if (verdict == MHD_HTTP_UNAUTHORIZED) {
            rc = send_text(c, MHD_HTTP_UNAUTHORIZED, "text/plain",
                           "a bearer token is needed from outside loopback\n", 47);
        } else if (verdict == MHD_HTTP_FORBIDDEN) {
            static const char denied[] = "the authorization policy grants this caller no metrics verb\n";
            rc = send_text(c, MHD_HTTP_FORBIDDEN, "text/plain", denied, sizeof denied - 1);
        } else {
            char *body = NULL;
            size_t len = 0;
            FILE *f = drey_xopen_memstream(&body, &len);
            bool details = url[1] == 'h';
            if (details) {
                drey_pbjson_write(f, &drey_admin_readiness(o->opts.admin, &a)->base);
                fputc('\n', f);
            } else {
                drey_metrics_write(o->opts.metrics, f);
            }
            fclose(f);
            rc = send_text(c, MHD_HTTP_OK, details ? "application/json" : "text/plain; version=0.0.4", body, len);
            free(body);
        }
    } else {
        rc = send_text(c, MHD_HTTP_NOT_FOUND, "text/plain", "not found\n", 10);
    }
    drey_arena_destroy(&a);
    return rc;
}

drey_ops *drey_ops_start(const drey_ops_options *opts, char *err, size_t err_cap) {
    char host[256];
    const char *colon = strrchr(opts->listen, ':');
    if (colon == NULL || (size_t)(colon - opts->listen) >= sizeof host) {
        snprintf(err, err_cap, "ops listener: expected host:port, got %s", opts->listen);
        return NULL;
    }
    memcpy(host, opts->listen, (size_t)(colon - opts->listen));
    host[colon - opts->listen] = '\0';
    char *h = host;
    if (h[0] == '[' && h[strlen(h) - 1] == ']') {
        h[strlen(h) - 1] = '\0';
        h++;
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *res;
    int gai = getaddrinfo(h[0] ? h : NULL, colon + 1, &hints, &res);
    if (gai != 0) {
        snprintf(err, err_cap, "ops listener %s: %s", opts->listen, gai_strerror(gai));
        return NULL;
    }
    drey_ops *o = drey_xcalloc(1, sizeof *o);
    o->opts = *opts;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (res->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    /* The logger first: libmicrohttpd says so otherwise (on its own logger). */
    o->daemon = MHD_start_daemon(flags, 0, NULL, NULL, handle, o, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                                 MHD_OPTION_SOCK_ADDR, res->ai_addr, MHD_OPTION_CONNECTION_LIMIT, (unsigned)64,
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
    freeaddrinfo(res);
    if (o->daemon == NULL) {
        snprintf(err, err_cap, "ops listener: cannot listen on %s (in use?)", opts->listen);
        free(o);
        return NULL;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(o->daemon, MHD_DAEMON_INFO_BIND_PORT);
    o->port = info != NULL ? info->port : 0;
    return o;
}

int drey_ops_port(const drey_ops *o) {
    return o->port;
}

void drey_ops_stop(drey_ops *o) {
    if (o == NULL)
        return;
    MHD_stop_daemon(o->daemon);
    free(o);
}
