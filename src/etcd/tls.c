/*
 * tls — credentials for https:// endpoints.
 *
 * gRPC's file watcher provider re-reads the CA, certificate and key every
 * second and uses what it read for the next handshake, so a rotation (a
 * Kubernetes Secret updated, a file renamed into place) needs no restart
 * and no new channel. The provider says nothing when a file is wrong (the
 * handshake just fails), so the files are checked here first: a path that
 * does not open, a PEM that does not parse, a key that is not the
 * certificate's are errors at open, with the file named.
 */
#include <stdio.h>
#include <string.h>

#include <grpc/grpc_security.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "internal.h"

#define REFRESH_SECONDS 1

static bool given(const char *s) {
    return s != NULL && s[0] != '\0';
}

static X509 *read_cert(const char *path, char *err, size_t cap) {
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(err, cap, "%s: cannot be read", path);
        return NULL;
    }
    X509 *x = PEM_read_X509(f, NULL, NULL, NULL);
    fclose(f);
    if (x == NULL)
        snprintf(err, cap, "%s: holds no PEM certificate", path);
    return x;
}

grpc_channel_credentials *drey_etcd__tls_credentials(const drey_etcd_tls *tls, char *err, size_t cap) {
    const char *ca = given(tls->ca_file) ? tls->ca_file : NULL;
    const char *cert = given(tls->cert_file) ? tls->cert_file : NULL;
    const char *key = given(tls->key_file) ? tls->key_file : NULL;
    if ((cert == NULL) != (key == NULL)) {
        snprintf(err, cap, "a client certificate for etcd needs its key, and a key its certificate");
        return NULL;
    }
    bool ok = true;
    if (ca != NULL) {
        X509 *x = read_cert(ca, err, cap);
        ok = x != NULL;
        X509_free(x);
    }
    if (ok && cert != NULL) {
        X509 *x = read_cert(cert, err, cap);
        EVP_PKEY *k = NULL;
        FILE *f = x != NULL ? fopen(key, "r") : NULL;
        if (x != NULL && f == NULL)
            snprintf(err, cap, "%s: cannot be read", key);
        if (f != NULL) {
            k = PEM_read_PrivateKey(f, NULL, NULL, NULL);
            fclose(f);
            if (k == NULL)
                snprintf(err, cap, "%s: holds no PEM private key", key);
            else if (X509_check_private_key(x, k) != 1)
                snprintf(err, cap, "%s is not the key of %s", key, cert);
        }
        ok = x != NULL && k != NULL && X509_check_private_key(x, k) == 1;
        X509_free(x);
        EVP_PKEY_free(k);
    }
    ERR_clear_error(); /* gRPC reads this thread's OpenSSL errors as its own */
    if (!ok)
        return NULL;
    grpc_tls_credentials_options *o = grpc_tls_credentials_options_create();
    if (ca != NULL || cert != NULL) {
        grpc_tls_certificate_provider *p =
            grpc_tls_certificate_provider_file_watcher_create(key, cert, ca, REFRESH_SECONDS);
        grpc_tls_credentials_options_set_certificate_provider(o, p);
        grpc_tls_certificate_provider_release(p);
        if (ca != NULL)
            grpc_tls_credentials_options_watch_root_certs(o); /* else the system's roots */
        if (cert != NULL)
            grpc_tls_credentials_options_watch_identity_key_cert_pairs(o);
    }
    grpc_tls_credentials_options_set_verify_server_cert(o, 1);
    grpc_channel_credentials *creds = grpc_tls_credentials_create(o);
    if (creds == NULL)
        snprintf(err, cap, "gRPC refused the TLS options for etcd");
    return creds;
}
