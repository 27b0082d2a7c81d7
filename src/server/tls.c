/*
 * TLS server credentials with reload; see tls.h.
 *
 * grpc core asks the fetcher for a configuration at every handshake; the
 * fetcher compares the files' identity (inode, size, mtime) with what it
 * loaded last and answers UNCHANGED unless one of them moved.
 */
#include "tls.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/log.h"
#include "drey/pem.h"

struct drey_server__tls {
    drey_pem_files files; /* cert, key, client CA (may be absent) */
    pthread_mutex_t mu;
    char first_error[256];
};

static grpc_ssl_certificate_config_reload_status fetch(void *user, grpc_ssl_server_certificate_config **config) {
    drey_server__tls *t = user;
    pthread_mutex_lock(&t->mu);
    drey_pem_id ids[3];
    bool changed = drey_pem_files_changed(&t->files, ids);
    grpc_ssl_certificate_config_reload_status rc = GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
    if (changed) {
        char err[256] = "";
        char *pem[3];
        bool ok = drey_pem_files_read(&t->files, pem, err, sizeof err);
        if (ok) {
            grpc_ssl_pem_key_cert_pair pair = {.private_key = pem[1], .cert_chain = pem[0]};
            /* grpc core insists on root certificates even when it asks for
             * no client certificate; the server's own chain is never used
             * for anything then. */
            *config = grpc_ssl_server_certificate_config_create(pem[2] != NULL ? pem[2] : pem[0], &pair, 1);
            ok = *config != NULL;
        }
        drey_pem_free(pem);
        if (ok) {
            if (t->files.loaded)
                DREY_LOG_INFO("tls: certificates reloaded");
            drey_pem_files_keep(&t->files, ids);
            rc = GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
        } else if (!t->files.loaded) {
            snprintf(t->first_error, sizeof t->first_error, "%s", err);
            rc = GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_FAIL;
        } else {
            DREY_LOG_WARN("tls: new certificates do not load; keeping the old ones", DREY_LOG_STR("error", err));
            drey_pem_files_keep(&t->files, ids); /* do not retry on every handshake */
        }
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

drey_server__tls *drey_server__tls_create(const char *cert, const char *key, const char *client_ca,
                                          grpc_server_credentials **creds, char *err, size_t err_cap) {
    drey_server__tls *t = drey_xcalloc(1, sizeof *t);
    pthread_mutex_init(&t->mu, NULL);
    drey_pem_files_init(&t->files, cert, key, client_ca);
    /* Load once now so a bad path fails the start, not the first client. */
    grpc_ssl_server_certificate_config *first = NULL;
    if (fetch(t, &first) != GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW) {
        snprintf(err, err_cap, "tls: %s", t->first_error[0] ? t->first_error : "the certificate or key is unusable");
        drey_server__tls_destroy(t);
        return NULL;
    }
    grpc_ssl_server_certificate_config_destroy(first);
    t->files.loaded = false; /* grpc core fetches its own first copy */
    grpc_ssl_server_credentials_options *o = grpc_ssl_server_credentials_create_options_using_config_fetcher(
        t->files.paths[2] != NULL ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                            : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        fetch, t);
    *creds = grpc_ssl_server_credentials_create_with_options(o);
    if (*creds == NULL) {
        snprintf(err, err_cap, "tls: grpc refused the credentials");
        drey_server__tls_destroy(t);
        return NULL;
    }
    return t;
}

void drey_server__tls_destroy(drey_server__tls *t) {
    if (t == NULL)
        return;
    drey_pem_files_free(&t->files);
    pthread_mutex_destroy(&t->mu);
    free(t);
}
