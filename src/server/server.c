/*
 * server — the gRPC core server drey runs: its completion queues and their
 * worker threads, the methods registered with it, the slots that ask the
 * core for the next call of each method on each queue, the listener (its
 * credentials, and why a bind failed), and shutdown with a grace period;
 * see include/drey/server.h. A call itself is call.c's.
 */
#include "drey/server.h"

#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpc/support/time.h>

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/log.h"
#include "drey/rpc.h"
#include "drey/thread.h"
#include "internal.h"
#include "wire.h"

/* Outstanding grpc_server_request_*_call per method and queue. The core
 * queues calls that arrive while none is outstanding, so this bounds how many
 * calls can be accepted per wake-up, not how many can run. */
#define REQUESTS_PER_METHOD 2

static void request_call(drey_server *s, drey_server__slot *slot);

/* --- accepting calls ----------------------------------------------------------- */

static void on_new_call(drey_server__tag *t, bool ok) {
    drey_server__slot *slot = (drey_server__slot *)t;
    drey_server *s = slot->server;
    if (!ok) {
        /* The server is shutting down: the request will not be renewed. */
        grpc_metadata_array_destroy(&slot->md);
        if (slot->method == NULL)
            grpc_call_details_destroy(&slot->details);
        free(slot);
        return;
    }
    drey_call *c = drey_server__call_new(s, slot);
    if (slot->method == NULL)
        grpc_call_details_destroy(&slot->details);
    request_call(s, slot);
    drey_server__call_start(c);
}

static void request_call(drey_server *s, drey_server__slot *slot) {
    if (atomic_load(&s->shutting_down)) {
        free(slot); /* its metadata array was moved to the last call */
        return;
    }
    grpc_metadata_array_init(&slot->md);
    slot->payload = NULL;
    slot->call = NULL;
    grpc_call_error err;
    if (slot->method != NULL) {
        err = grpc_server_request_registered_call(s->grpc, slot->method->registered, &slot->call, &slot->deadline,
                                                  &slot->md, drey_server__streaming(slot->method) ? NULL : &slot->payload,
                                                  s->cqs[slot->cq], s->cqs[slot->cq], &slot->tag);
    } else {
        grpc_call_details_init(&slot->details);
        err = grpc_server_request_call(s->grpc, &slot->call, &slot->details, &slot->md, s->cqs[slot->cq],
                                       s->cqs[slot->cq], &slot->tag);
    }
    if (err != GRPC_CALL_OK) {
        DREY_LOG_ERROR("requesting a call failed", DREY_LOG_STR("error", grpc_call_error_to_string(err)));
        abort();
    }
}

static void new_slot(drey_server *s, size_t cq, drey_server__method *m) {
    drey_server__slot *slot = drey_xmalloc(sizeof *slot);
    memset(slot, 0, sizeof *slot);
    slot->tag.done = on_new_call;
    slot->server = s;
    slot->cq = cq;
    slot->method = m;
    request_call(s, slot);
}

/* --- the server -------------------------------------------------------------- */

static void on_shutdown(drey_server__tag *t, bool ok) {
    (void)ok;
    drey_server *s = (drey_server *)((char *)t - offsetof(drey_server, shutdown_tag));
    pthread_mutex_lock(&s->mu);
    s->shutdown_done = true;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->mu);
}

static void *worker_main(void *arg) {
    grpc_completion_queue *cq = arg;
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
        if (ev.type == GRPC_OP_COMPLETE) {
            drey_server__tag *t = ev.tag;
            t->done(t, ev.success != 0);
        }
    }
    return NULL;
}

drey_server *drey_server_create(const drey_server_options *opts) {
    drey_rpc_init();
    drey_server *s = drey_xmalloc(sizeof *s);
    memset(s, 0, sizeof *s);
    s->opts = *opts;
    s->listen = drey_xstrdup(opts->listen);
    s->opts.listen = s->listen;
    s->opts.tls_cert = opts->tls_cert != NULL ? drey_xstrdup(opts->tls_cert) : NULL;
    s->opts.tls_key = opts->tls_key != NULL ? drey_xstrdup(opts->tls_key) : NULL;
    s->opts.tls_client_ca = opts->tls_client_ca != NULL ? drey_xstrdup(opts->tls_client_ca) : NULL;
    s->n_cqs = opts->workers > 0 ? opts->workers : 1;
    s->shutdown_tag.done = on_shutdown;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cond, NULL);

    grpc_arg args[2];
    memset(args, 0, sizeof args);
    args[0].type = GRPC_ARG_INTEGER;
    args[0].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[0].value.integer = (int)opts->max_recv_message_bytes;
    /* gRPC sets SO_REUSEPORT by default, which lets a second server bind a
     * taken port silently. */
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_ALLOW_REUSEPORT;
    args[1].value.integer = 0;
    grpc_channel_args cargs = {.num_args = 2, .args = args};
    s->grpc = grpc_server_create(&cargs, NULL);

    s->cqs = drey_xmalloc(s->n_cqs * sizeof *s->cqs);
    for (size_t i = 0; i < s->n_cqs; i++) {
        s->cqs[i] = grpc_completion_queue_create_for_next(NULL);
        grpc_server_register_completion_queue(s->grpc, s->cqs[i], NULL);
    }
    return s;
}

bool drey_server_add_method(drey_server *s, const drey_server_method *m) {
    bool streaming = m->client_streaming || m->server_streaming;
    if (streaming ? m->on_message == NULL || m->unary != NULL : m->unary == NULL || m->on_message != NULL) {
        DREY_LOG_ERROR("no callbacks of the method's kind", DREY_LOG_STR("path", m->path),
                       DREY_LOG_BOOL("streaming", streaming));
        return false;
    }
    for (size_t i = 0; i < s->n_methods; i++) {
        if (strcmp(s->methods[i]->spec.path, m->path) == 0) {
            DREY_LOG_ERROR("method registered twice", DREY_LOG_STR("path", m->path));
            return false;
        }
    }
    drey_server__method *rt = drey_xmalloc(sizeof *rt);
    memset(rt, 0, sizeof *rt);
    rt->spec = *m;
    rt->spec.path = drey_xstrdup(m->path);
    rt->index = s->n_methods;
    rt->recursive = drey_server__type_is_recursive(m->input);
    rt->registered = grpc_server_register_method(
        s->grpc, rt->spec.path, NULL, streaming ? GRPC_SRM_PAYLOAD_NONE : GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER, 0);
    if (rt->registered == NULL) {
        DREY_LOG_ERROR("grpc refused to register a method", DREY_LOG_STR("path", rt->spec.path));
        free((char *)rt->spec.path);
        free(rt);
        return false;
    }
    s->methods = drey_xrealloc(s->methods, s->n_methods + 1, sizeof *s->methods);
    s->methods[s->n_methods++] = rt;
    return true;
}

void drey_server_set_call_observer(drey_server *s, drey_call_observer_fn fn, void *ctx) {
    s->observer = fn;
    s->observer_ctx = ctx;
}

/* grpc core does not say why a bind failed; bind a plain socket to the same
 * address to find out (in use, not permitted, not an address here). */
static void explain_bind_failure(const char *listen, char *buf, size_t cap) {
    char host[256];
    const char *colon = strrchr(listen, ':');
    if (colon == NULL) {
        snprintf(buf, cap, "cannot listen on %s: expected host:port", listen);
        return;
    }
    size_t hlen = (size_t)(colon - listen);
    if (hlen >= sizeof host)
        hlen = sizeof host - 1;
    memcpy(host, listen, hlen);
    host[hlen] = '\0';
    if (hlen >= 2 && host[0] == '[' && host[hlen - 1] == ']') {
        memmove(host, host + 1, hlen - 2);
        host[hlen - 2] = '\0';
    }
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL;
    int gai = getaddrinfo(host[0] != '\0' ? host : NULL, colon + 1, &hints, &res);
    if (gai != 0) {
        snprintf(buf, cap, "cannot listen on %s: %s", listen, gai_strerror(gai));
        return;
    }
    int err = 0;
    int fd = socket(res->ai_family, SOCK_STREAM, 0);
    if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0)
        err = errno;
    if (fd >= 0)
        close(fd);
    freeaddrinfo(res);
    if (err == EADDRINUSE)
        snprintf(buf, cap, "cannot listen on %s: the address is already in use (is another server running?)",
                 listen);
    else if (err != 0)
        snprintf(buf, cap, "cannot listen on %s: %s", listen, strerror(err));
    else
        snprintf(buf, cap, "cannot listen on %s", listen);
}

int drey_server_start(drey_server *s, char *err_buf, size_t err_cap) {
    if (s->opts.tls_cert != NULL && s->opts.tls_cert[0] != '\0') {
        s->tls = drey_server__tls_create(s->opts.tls_cert, s->opts.tls_key != NULL ? s->opts.tls_key : "",
                                         s->opts.tls_client_ca, &s->creds, err_buf, err_cap);
        if (s->tls == NULL)
            return 0;
    } else {
        s->creds = grpc_insecure_server_credentials_create();
    }
    int port = grpc_server_add_http2_port(s->grpc, s->listen, s->creds);
    if (port == 0) {
        explain_bind_failure(s->listen, err_buf, err_cap);
        return 0;
    }
    grpc_server_start(s->grpc);
    s->started = true;
    for (size_t q = 0; q < s->n_cqs; q++) {
        for (size_t m = 0; m < s->n_methods; m++) {
            for (int k = 0; k < REQUESTS_PER_METHOD; k++)
                new_slot(s, q, s->methods[m]);
        }
        new_slot(s, q, NULL);
    }
    s->threads = drey_xmalloc(s->n_cqs * sizeof *s->threads);
    for (size_t q = 0; q < s->n_cqs; q++)
        drey_thread_start(&s->threads[q], "server worker", worker_main, s->cqs[q]);
    return port;
}

static bool wait_shutdown(drey_server *s, int64_t timeout_ms) {
    int64_t deadline = drey_deadline_after_ms(timeout_ms);
    pthread_mutex_lock(&s->mu);
    while (!s->shutdown_done) {
        if (timeout_ms < 0)
            pthread_cond_wait(&s->cond, &s->mu);
        else if (drey_cond_wait_until(&s->cond, &s->mu, deadline) == ETIMEDOUT)
            break;
    }
    bool done = s->shutdown_done;
    pthread_mutex_unlock(&s->mu);
    return done;
}

void drey_server_shutdown(drey_server *s, int64_t timeout_ms) {
    if (atomic_exchange(&s->shutting_down, true))
        return;
    if (s->started) {
        grpc_server_shutdown_and_notify(s->grpc, s->cqs[0], &s->shutdown_tag);
        if (!wait_shutdown(s, timeout_ms)) {
            DREY_LOG_WARN("in-flight calls outlived the shutdown timeout; cancelling them",
                          DREY_LOG_INT("timeout_ms", timeout_ms));
            grpc_server_cancel_all_calls(s->grpc);
            wait_shutdown(s, -1);
        }
        /* The server's shutdown tag can come before the last calls are
         * freed (a cancelled stream's handler may still be finishing it):
         * the queues must outlive every batch those calls start. */
        pthread_mutex_lock(&s->mu);
        while (s->live_calls > 0)
            pthread_cond_wait(&s->cond, &s->mu);
        pthread_mutex_unlock(&s->mu);
    }
    for (size_t q = 0; q < s->n_cqs; q++)
        grpc_completion_queue_shutdown(s->cqs[q]);
    if (s->started) {
        for (size_t q = 0; q < s->n_cqs; q++)
            pthread_join(s->threads[q], NULL);
    } else {
        for (size_t q = 0; q < s->n_cqs; q++)
            worker_main(s->cqs[q]); /* drain to GRPC_QUEUE_SHUTDOWN */
    }
}

void drey_server_destroy(drey_server *s) {
    if (s == NULL)
        return;
    drey_server_shutdown(s, 0);
    grpc_server_destroy(s->grpc);
    for (size_t q = 0; q < s->n_cqs; q++)
        grpc_completion_queue_destroy(s->cqs[q]);
    if (s->creds != NULL)
        grpc_server_credentials_release(s->creds);
    drey_server__tls_destroy(s->tls);
    for (size_t m = 0; m < s->n_methods; m++) {
        free((char *)s->methods[m]->spec.path);
        free(s->methods[m]);
    }
    free(s->methods);
    free(s->cqs);
    free(s->threads);
    free(s->listen);
    free((char *)s->opts.tls_cert);
    free((char *)s->opts.tls_key);
    free((char *)s->opts.tls_client_ca);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cond);
    free(s);
    grpc_shutdown();
}

size_t drey_server_method_count(const drey_server *s) {
    return s->n_methods;
}

const char *drey_server_method_path(const drey_server *s, size_t i) {
    return s->methods[i]->spec.path;
}
