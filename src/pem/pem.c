/*
 * pem — TLS material from files; see include/drey/pem.h.
 */
#include "drey/pem.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "drey/alloc.h"

void drey_pem_files_init(drey_pem_files *f, const char *chain, const char *key, const char *ca) {
    memset(f, 0, sizeof *f);
    f->paths[0] = drey_xstrdup(chain);
    f->paths[1] = drey_xstrdup(key);
    f->paths[2] = ca != NULL && ca[0] != '\0' ? drey_xstrdup(ca) : NULL;
}

void drey_pem_files_free(drey_pem_files *f) {
    for (int i = 0; i < 3; i++)
        free(f->paths[i]);
    memset(f, 0, sizeof *f);
}

static bool same_id(const drey_pem_id *a, const drey_pem_id *b) {
    return a->ino == b->ino && a->size == b->size && a->mtime.tv_sec == b->mtime.tv_sec &&
           a->mtime.tv_nsec == b->mtime.tv_nsec;
}

bool drey_pem_files_changed(const drey_pem_files *f, drey_pem_id now[3]) {
    bool changed = !f->loaded;
    for (int i = 0; i < 3; i++) {
        struct stat st;
        now[i] = (drey_pem_id){0};
        if (f->paths[i] != NULL && stat(f->paths[i], &st) == 0)
            now[i] = (drey_pem_id){st.st_ino, st.st_size, st.st_mtim};
        changed |= f->paths[i] != NULL && !same_id(&now[i], &f->ids[i]);
    }
    return changed;
}

void drey_pem_files_keep(drey_pem_files *f, const drey_pem_id now[3]) {
    memcpy(f->ids, now, sizeof f->ids);
    f->loaded = true;
}

static char *read_all(const char *path, char *err, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, cap, "cannot read %s: %s", path, strerror(errno));
        return NULL;
    }
    size_t n = 0, size = 4096;
    char *buf = drey_xmalloc(size);
    for (size_t r; (r = fread(buf + n, 1, size - n - 1, f)) > 0;) {
        n += r;
        if (n == size - 1)
            buf = drey_xrealloc(buf, size *= 2, 1);
    }
    fclose(f);
    buf[n] = '\0';
    return buf;
}

static bool usable(char *const pem[3], char *err, size_t cap) {
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
            snprintf(err, cap, "the CA file holds no PEM certificate");
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

void drey_pem_free(char *pem[3]) {
    for (int i = 0; i < 3; i++) {
        free(pem[i]);
        pem[i] = NULL;
    }
}

bool drey_pem_files_read(const drey_pem_files *f, char *pem[3], char *err, size_t cap) {
    pem[0] = pem[1] = pem[2] = NULL;
    bool ok = true;
    for (int i = 0; i < 3 && ok; i++) {
        if (f->paths[i] != NULL)
            ok = (pem[i] = read_all(f->paths[i], err, cap)) != NULL;
    }
    if (ok && usable(pem, err, cap))
        return true;
    drey_pem_free(pem);
    return false;
}

bool drey_pem_names(const char *chain, const char *name) {
    BIO *bio = BIO_new_mem_buf(chain, -1);
    X509 *cert = bio != NULL ? PEM_read_bio_X509(bio, NULL, NULL, NULL) : NULL;
    bool named = cert != NULL &&
                 X509_check_host(cert, name, strlen(name), X509_CHECK_FLAG_NO_WILDCARDS, NULL) == 1;
    X509_free(cert);
    BIO_free(bio);
    ERR_clear_error();
    return named;
}
