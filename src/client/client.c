/*
 * client — a drey client's channel: its credentials (plaintext, or TLS and
 * mutual TLS from PEM files), its channel arguments and its completion
 * queues, opened and closed; see include/drey/client.h. The calls it makes
 * are in unary.c, stream.c and pipeline.c, what they share in call.c.
 */
#include "drey/client.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/grpc_security.h>

#include "drey/alloc.h"
#include "drey/rpc.h"
#include "internal.h"

drey_client *drey_client_open(const drey_client_options *opts, char *err, size_t err_cap) {
    return drey_client__open_on(opts, NULL, err, err_cap);
}

/* A whole PEM file, NUL-terminated (freed by the caller); NULL with a
 * message in err. */
static char *read_pem(const char *what, const char *path, char *err, size_t err_cap) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, err_cap, "%s %s: %s", what, path, strerror(errno));
        return NULL;
    }
    size_t cap = 4096, len = 0, n;
    char *buf = drey_xmalloc(cap);
    while ((n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (len + 1 == cap)
            buf = drey_xrealloc(buf, cap *= 2, 1);
    }
    bool bad = ferror(f) != 0;
    fclose(f);
    buf[len] = '\0';
    if (bad || strstr(buf, "-----BEGIN ") == NULL) {
        snprintf(err, err_cap, "%s %s: %s", what, path, bad ? "cannot read it" : "not a PEM file");
        free(buf);
        return NULL;
    }
    return buf;
}

static bool wants_tls(const drey_client_options *o) {
    return o->tls || (o->tls_ca != NULL && o->tls_ca[0]) || (o->tls_cert != NULL && o->tls_cert[0]) ||
           (o->tls_key != NULL && o->tls_key[0]) || (o->tls_server_name != NULL && o->tls_server_name[0]);
}

/* The channel's credentials: plaintext, or TLS from the options' files.
 * NULL with a message in err. */
static grpc_channel_credentials *credentials(const drey_client_options *o, char *err, size_t err_cap) {
    if (!wants_tls(o))
        return grpc_insecure_credentials_create();
    bool has_cert = o->tls_cert != NULL && o->tls_cert[0], has_key = o->tls_key != NULL && o->tls_key[0];
    if (has_cert != has_key) {
        snprintf(err, err_cap, "a client certificate needs its key and a key its certificate (--tls-cert, --tls-key)");
        return NULL;
    }
    char *ca = NULL, *cert = NULL, *key = NULL;
    grpc_channel_credentials *creds = NULL;
    if (o->tls_ca != NULL && o->tls_ca[0] && (ca = read_pem("TLS CA", o->tls_ca, err, err_cap)) == NULL)
        goto out;
    if (has_cert && ((cert = read_pem("TLS certificate", o->tls_cert, err, err_cap)) == NULL ||
                     (key = read_pem("TLS key", o->tls_key, err, err_cap)) == NULL))
        goto out;
    grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
    creds = grpc_ssl_credentials_create(ca, has_cert ? &pair : NULL, NULL, NULL);
    if (creds == NULL)
        snprintf(err, err_cap, "gRPC refused the TLS settings");
out:
    free(ca);
    free(cert);
    free(key);
    return creds;
}

drey_client *drey_client__open_on(const drey_client_options *opts, grpc_completion_queue *async_cq, char *err,
                                  size_t err_cap) {
    if (opts->target == NULL || opts->target[0] == '\0') {
        snprintf(err, err_cap, "no target address");
        return NULL;
    }
    drey_client *c = drey_xcalloc(1, sizeof *c);
    drey_rpc_init();
    if (!drey_client__headers_build(&c->headers, opts->token, opts->headers, opts->n_headers, err, err_cap)) {
        free(c);
        grpc_shutdown();
        return NULL;
    }
    grpc_channel_credentials *creds = credentials(opts, err, err_cap);
    if (creds == NULL) {
        drey_client__headers_destroy(&c->headers);
        free(c);
        grpc_shutdown();
        return NULL;
    }
    grpc_arg args[4];
    size_t n = 0;
    memset(args, 0, sizeof args);
    /* Each client its own connection: a load generator's clients must not
     * share one. */
    args[n].type = GRPC_ARG_INTEGER;
    args[n].key = GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL;
    args[n++].value.integer = 1;
    args[n].type = GRPC_ARG_INTEGER;
    args[n].key = GRPC_ARG_ENABLE_RETRIES;
    args[n++].value.integer = 0;
    if (opts->max_recv_message_bytes != 0) {
        args[n].type = GRPC_ARG_INTEGER;
        args[n].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
        args[n++].value.integer = opts->max_recv_message_bytes;
    }
    if (opts->tls_server_name != NULL && opts->tls_server_name[0] != '\0') {
        args[n].type = GRPC_ARG_STRING;
        args[n].key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
        args[n++].value.string = (char *)opts->tls_server_name;
    }
    grpc_channel_args cargs = {.num_args = n, .args = args};
    c->channel = grpc_channel_create(opts->target, creds, &cargs);
    grpc_channel_credentials_release(creds);
    c->sync_cq = grpc_completion_queue_create_for_pluck(NULL);
    c->shared_cq = async_cq != NULL;
    c->async_cq = async_cq != NULL ? async_cq : grpc_completion_queue_create_for_next(NULL);
    return c;
}

void drey_client_close(drey_client *c) {
    if (c == NULL)
        return;
    drey_client__finish_streams(c);
    if (c->shared_cq) {
        /* The queue's owner drained it: a completion taken here could be
         * another client's. */
        if (c->n_in_flight != 0)
            abort();
    } else {
        drey_client__drop_in_flight(c);
        drey_client__drain_cq(c->async_cq);
    }
    grpc_completion_queue_shutdown(c->sync_cq);
    while (grpc_completion_queue_pluck(c->sync_cq, NULL, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
           GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(c->sync_cq);
    grpc_channel_destroy(c->channel);
    for (size_t i = 0; i < c->n_methods; i++)
        free(c->methods[i].path);
    drey_client__headers_destroy(&c->headers);
    free(c);
    grpc_shutdown();
}
