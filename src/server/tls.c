/*
 * TLS server credentials with reload; see tls.h.
 *
 * grpc core asks the fetcher for a configuration at every handshake; the
 * fetcher compares the files' identity (inode, size, mtime) with what it
 * loaded last and answers UNCHANGED unless one of them moved.
 */
#include "tls.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "drey/alloc.h"
#include "drey/log.h"

typedef struct file_id {
    ino_t ino;
    off_t size;
    struct timespec mtime;
} file_id;

struct drey_server__tls {
    char *paths[3]; /* cert, key, client CA (may be NULL) */
    file_id ids[3];
    bool loaded;
    pthread_mutex_t mu;
    char first_error[256];
};

static bool same_id(const file_id *a, const file_id *b) {
    return a->ino == b->ino && a->size == b->size && a->mtime.tv_sec == b->mtime.tv_sec &&
           a->mtime.tv_nsec == b->mtime.tv_nsec;
}

static char *read_all(const char *path, char *err, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, cap, "cannot read %s: %s", path, strerror(errno));
        return NULL;
    }
    size_t n = 0, size = 4096;
    char *buf = drey_xmalloc(size);
    size_t r;
    while ((r = fread(buf + n, 1, size - n - 1, f)) > 0) {
        n += r;
        if (size - n - 1 == 0) {
            size *= 2;
            buf = drey_xrealloc(buf, size, 1);
        }
    }
    fclose(f);
    buf[n] = '\0';
    return buf;
}

/* grpc core takes the PEM text as is and only fails later, at a handshake;
 * check it here: the chain parses, the key parses and belongs to the first
 * certificate, the client CA bundle parses. */
static bool pem_usable(char *const pem[3], char *err, size_t cap) {
    bool ok = false;
    X509 *cert = NULL;
    EVP_PKEY *key = NULL;
    BIO *b = BIO_new_mem_buf(pem[0], -1);
    cert = b != NULL ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
    BIO_free(b);
    if (cert == NULL) {
        snprintf(err, cap, "the certificate file holds no PEM certificate");
        goto out;
    }
    b = BIO_new_mem_buf(pem[1], -1);
    key = b != NULL ? PEM_read_bio_PrivateKey(b, NULL, NULL, NULL) : NULL;
    BIO_free(b);
    if (key == NULL) {
        snprintf(err, cap, "the key file holds no PEM private key");
        goto out;
    }
    if (X509_check_private_key(cert, key) != 1) {
        snprintf(err, cap, "the private key does not belong to the certificate");
        goto out;
    }
    if (pem[2] != NULL) {
        b = BIO_new_mem_buf(pem[2], -1);
        X509 *ca = b != NULL ? PEM_read_bio_X509(b, NULL, NULL, NULL) : NULL;
        BIO_free(b);
        if (ca == NULL) {
            snprintf(err, cap, "the client CA file holds no PEM certificate");
            goto out;
        }
        X509_free(ca);
    }
    ok = true;
out:
    X509_free(cert);
    EVP_PKEY_free(key);
    ERR_clear_error();
    return ok;
}

static grpc_ssl_certificate_config_reload_status fetch(void *user, grpc_ssl_server_certificate_config **config) {
    drey_server__tls *t = user;
    pthread_mutex_lock(&t->mu);
    file_id ids[3] = {{0}};
    bool changed = !t->loaded;
    for (int i = 0; i < 3; i++) {
        struct stat st;
        if (t->paths[i] == NULL)
            continue;
        if (stat(t->paths[i], &st) == 0) {
            ids[i] = (file_id){st.st_ino, st.st_size, st.st_mtim};
            changed |= !same_id(&ids[i], &t->ids[i]);
        }
    }
    grpc_ssl_certificate_config_reload_status rc = GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
    if (changed) {
        char err[256] = "";
        char *pem[3] = {NULL, NULL, NULL};
        bool ok = true;
        for (int i = 0; i < 3 && ok; i++) {
            if (t->paths[i] != NULL)
                ok = (pem[i] = read_all(t->paths[i], err, sizeof err)) != NULL;
        }
        ok = ok && pem_usable(pem, err, sizeof err);
        if (ok) {
            grpc_ssl_pem_key_cert_pair pair = {.private_key = pem[1], .cert_chain = pem[0]};
            /* grpc core insists on root certificates even when it asks for
             * no client certificate; the server's own chain is never used
             * for anything then. */
            *config = grpc_ssl_server_certificate_config_create(pem[2] != NULL ? pem[2] : pem[0], &pair, 1);
            ok = *config != NULL;
        }
        for (int i = 0; i < 3; i++)
            free(pem[i]);
        if (ok) {
            memcpy(t->ids, ids, sizeof ids);
            if (t->loaded)
                DREY_LOG_INFO("tls: certificates reloaded");
            t->loaded = true;
            rc = GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
        } else if (!t->loaded) {
            snprintf(t->first_error, sizeof t->first_error, "%s", err);
            rc = GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_FAIL;
        } else {
            DREY_LOG_WARN("tls: new certificates do not load; keeping the old ones", DREY_LOG_STR("error", err));
            memcpy(t->ids, ids, sizeof ids); /* do not retry on every handshake */
        }
    }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

drey_server__tls *drey_server__tls_create(const char *cert, const char *key, const char *client_ca,
                                          grpc_server_credentials **creds, char *err, size_t err_cap) {
    drey_server__tls *t = drey_xcalloc(1, sizeof *t);
    pthread_mutex_init(&t->mu, NULL);
    t->paths[0] = drey_xstrdup(cert);
    t->paths[1] = drey_xstrdup(key);
    t->paths[2] = client_ca != NULL && client_ca[0] != '\0' ? drey_xstrdup(client_ca) : NULL;
    /* Load once now so a bad path fails the start, not the first client. */
    grpc_ssl_server_certificate_config *first = NULL;
    if (fetch(t, &first) != GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW) {
        snprintf(err, err_cap, "tls: %s", t->first_error[0] ? t->first_error : "the certificate or key is unusable");
        drey_server__tls_destroy(t);
        return NULL;
    }
    grpc_ssl_server_certificate_config_destroy(first);
    t->loaded = false; /* grpc core fetches its own first copy */
    grpc_ssl_server_credentials_options *o = grpc_ssl_server_credentials_create_options_using_config_fetcher(
        t->paths[2] != NULL ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
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
    for (int i = 0; i < 3; i++)
        free(t->paths[i]);
    pthread_mutex_destroy(&t->mu);
    free(t);
}
