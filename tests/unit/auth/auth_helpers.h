/*
 * Helpers for the auth unit tests: keys generated at test time with OpenSSL,
 * tokens signed with libjwt or crafted by hand, JWKs, temporary key
 * directories. Everything returned as char * is malloc'd (free() it).
 */
#ifndef DREY_TESTS_AUTH_HELPERS_H
#define DREY_TESTS_AUTH_HELPERS_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jwt.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <openssl/rand.h>

#include "drey/auth.h"
#include "drey/status.h"

/* A fixed "now" so every test is deterministic: 2023-11-14T22:13:20Z. */
#define TH_NOW_S 1700000000LL
#define TH_NOW_MS (TH_NOW_S * 1000)

#define EXPECT_ERR(got, want)                                                                                     \
    do {                                                                                                          \
        drey_error got_ = (got), want_ = (want);                                                                  \
        cr_assert_eq(got_, want_, "%s:%d: got %s, want %s", __FILE__, __LINE__, th_err_name(got_),               \
                     th_err_name(want_));                                                                         \
    } while (0)

static inline const char *th_err_name(drey_error e) {
    return e == DREY_ERR_NONE ? "NONE" : drey_error_lookup(e)->reason;
}

static inline char *th_strdup(const char *s) {
    char *d = strdup(s);
    cr_assert_not_null(d);
    return d;
}

__attribute__((format(printf, 1, 2))) static inline char *th_fmt(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    cr_assert(vasprintf(&s, fmt, ap) >= 0);
    va_end(ap);
    return s;
}

/* ---- base64url ------------------------------------------------------ */

static inline char *th_b64url(const void *data, size_t n) {
    static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    const unsigned char *p = data;
    char *out = malloc(n / 3 * 4 + 5);
    cr_assert_not_null(out);
    size_t o = 0, i = 0;
    for (; i + 3 <= n; i += 3) {
        unsigned v = (unsigned)p[i] << 16 | (unsigned)p[i + 1] << 8 | p[i + 2];
        out[o++] = abc[v >> 18 & 63], out[o++] = abc[v >> 12 & 63], out[o++] = abc[v >> 6 & 63];
        out[o++] = abc[v & 63];
    }
    if (n - i == 1) {
        unsigned v = (unsigned)p[i] << 16;
        out[o++] = abc[v >> 18 & 63], out[o++] = abc[v >> 12 & 63];
    } else if (n - i == 2) {
        unsigned v = (unsigned)p[i] << 16 | (unsigned)p[i + 1] << 8;
        out[o++] = abc[v >> 18 & 63], out[o++] = abc[v >> 12 & 63], out[o++] = abc[v >> 6 & 63];
    }
    out[o] = '\0';
    return out;
}

static inline char *th_b64url_str(const char *s) {
    return th_b64url(s, strlen(s));
}

/* ---- keys ------------------------------------------------------------ */

static inline EVP_PKEY *th_rsa(unsigned bits) {
    EVP_PKEY *pk = EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t)bits);
    cr_assert_not_null(pk, "RSA keygen");
    return pk;
}

/* curve: "P-256", "P-384", "P-521" */
static inline EVP_PKEY *th_ec(const char *curve) {
    EVP_PKEY *pk = EVP_PKEY_Q_keygen(NULL, NULL, "EC", curve);
    cr_assert_not_null(pk, "EC keygen");
    return pk;
}

static inline char *th_bio_text(BIO *bio) {
    char *data;
    long n = BIO_get_mem_data(bio, &data);
    cr_assert(n > 0);
    char *s = malloc((size_t)n + 1);
    cr_assert_not_null(s);
    memcpy(s, data, (size_t)n);
    s[n] = '\0';
    BIO_free(bio);
    return s;
}

static inline char *th_pub_pem(EVP_PKEY *pk) {
    BIO *bio = BIO_new(BIO_s_mem());
    cr_assert_eq(PEM_write_bio_PUBKEY(bio, pk), 1);
    return th_bio_text(bio);
}

static inline char *th_priv_pem(EVP_PKEY *pk) {
    BIO *bio = BIO_new(BIO_s_mem());
    cr_assert_eq(PEM_write_bio_PrivateKey(bio, pk, NULL, NULL, 0, NULL, NULL), 1);
    return th_bio_text(bio);
}

static inline char *th_bn_b64url(EVP_PKEY *pk, const char *param, size_t pad) {
    BIGNUM *bn = NULL;
    cr_assert_eq(EVP_PKEY_get_bn_param(pk, param, &bn), 1, "param %s", param);
    size_t n = pad != 0 ? pad : (size_t)BN_num_bytes(bn);
    unsigned char *buf = malloc(n);
    cr_assert_not_null(buf);
    cr_assert(BN_bn2binpad(bn, buf, (int)n) == (int)n);
    char *s = th_b64url(buf, n);
    free(buf);
    BN_free(bn);
    return s;
}

/* A public JWK (JSON object text) for an RSA or EC key. */
static inline char *th_jwk(EVP_PKEY *pk, const char *kid, const char *alg) {
    if (EVP_PKEY_get_base_id(pk) == EVP_PKEY_RSA) {
        char *n = th_bn_b64url(pk, OSSL_PKEY_PARAM_RSA_N, 0), *e = th_bn_b64url(pk, OSSL_PKEY_PARAM_RSA_E, 0);
        char *s = th_fmt("{\"kty\":\"RSA\",\"kid\":\"%s\",\"alg\":\"%s\",\"use\":\"sig\","
                         "\"n\":\"%s\",\"e\":\"%s\"}",
                         kid, alg, n, e);
        free(n);
        free(e);
        return s;
    }
    int bits = EVP_PKEY_get_bits(pk);
    size_t coord = ((size_t)bits + 7) / 8;
    const char *crv = bits == 256 ? "P-256" : bits == 384 ? "P-384" : "P-521";
    char *x = th_bn_b64url(pk, OSSL_PKEY_PARAM_EC_PUB_X, coord), *y = th_bn_b64url(pk, OSSL_PKEY_PARAM_EC_PUB_Y, coord);
    char *s = th_fmt("{\"kty\":\"EC\",\"kid\":\"%s\",\"alg\":\"%s\",\"crv\":\"%s\","
                     "\"x\":\"%s\",\"y\":\"%s\"}",
                     kid, alg, crv, x, y);
    free(x);
    free(y);
    return s;
}

static inline char *th_jwk_oct(const unsigned char *secret, size_t n, const char *kid, const char *alg) {
    char *k = th_b64url(secret, n);
    char *s = th_fmt("{\"kty\":\"oct\",\"kid\":\"%s\",\"alg\":\"%s\",\"k\":\"%s\"}", kid, alg, k);
    free(k);
    return s;
}

static inline void th_random(unsigned char *buf, size_t n) {
    cr_assert_eq(RAND_bytes(buf, (int)n), 1);
}

/* ---- tokens ---------------------------------------------------------- */

/* Signs claims (a JSON object) with libjwt; key is the private key PEM
 * (RS, ES) or the secret (HS); kid NULL: no kid header. */
static inline char *th_sign(jwt_alg_t alg, const void *key, size_t key_len, const char *kid, const char *claims) {
    jwt_t *jwt = NULL;
    cr_assert_eq(jwt_new(&jwt), 0);
    cr_assert_eq(jwt_set_alg(jwt, alg, key, (int)key_len), 0, "jwt_set_alg");
    if (kid != NULL)
        cr_assert_eq(jwt_add_header(jwt, "kid", kid), 0);
    cr_assert_eq(jwt_add_grants_json(jwt, claims), 0, "claims are not a JSON object: %s", claims);
    char *tok = jwt_encode_str(jwt);
    cr_assert_not_null(tok, "jwt_encode_str (%s)", jwt_alg_str(alg));
    jwt_free(jwt);
    return tok;
}

static inline char *th_sign_pk(jwt_alg_t alg, EVP_PKEY *pk, const char *kid, const char *claims) {
    char *pem = th_priv_pem(pk);
    char *tok = th_sign(alg, pem, strlen(pem), kid, claims);
    free(pem);
    return tok;
}

/* A token built by hand: b64url(header).b64url(payload).sig (sig as given). */
static inline char *th_raw(const char *header, const char *payload, const char *sig) {
    char *h = th_b64url_str(header), *p = th_b64url_str(payload);
    char *tok = th_fmt("%s.%s.%s", h, p, sig);
    free(h);
    free(p);
    return tok;
}

/* A token built by hand and HMAC-signed with md over the exact bytes. */
static inline char *th_raw_hmac(const char *header, const char *payload, const EVP_MD *md, const void *secret,
                                size_t n) {
    char *h = th_b64url_str(header), *p = th_b64url_str(payload);
    char *input = th_fmt("%s.%s", h, p);
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int mac_len = 0;
    cr_assert_not_null(HMAC(md, secret, (int)n, (const unsigned char *)input, strlen(input), mac, &mac_len));
    char *sig = th_b64url(mac, mac_len);
    char *tok = th_fmt("%s.%s", input, sig);
    free(h);
    free(p);
    free(input);
    free(sig);
    return tok;
}

/* Standard claims around TH_NOW: exp an hour later, plus extra members
 * (a JSON fragment starting with ',' or ""). */
static inline char *th_claims(const char *sub, const char *extra) {
    return th_fmt("{\"sub\":\"%s\",\"iss\":\"https://issuer.test\",\"aud\":\"drey\",\"iat\":%lld,\"exp\":%lld%s}", sub,
                  TH_NOW_S - 10, TH_NOW_S + 3600, extra);
}

static inline drey_error th_verify(drey_auth *a, const char *token, int64_t now_ms, char *sub, size_t sub_cap) {
    char *h = th_fmt("Bearer %s", token);
    drey_error e = drey_auth_verify(a, h, strlen(h), now_ms, sub, sub_cap);
    free(h);
    return e;
}

/* ---- files ----------------------------------------------------------- */

static inline char *th_tmpdir(void) {
    const char *base = getenv("TEST_TMPDIR");
    char *tmpl = th_fmt("%s/authXXXXXX", base != NULL ? base : "/tmp");
    cr_assert_not_null(mkdtemp(tmpl));
    return tmpl;
}

static inline char *th_path(const char *dir, const char *name) {
    return th_fmt("%s/%s", dir, name);
}

/* Writes a file at once: a temporary name, then rename(2). */
static inline void th_write(const char *dir, const char *name, const void *data, size_t n) {
    char *tmp = th_fmt("%s/.%s.tmp", dir, name), *path = th_path(dir, name);
    FILE *f = fopen(tmp, "wb");
    cr_assert_not_null(f, "fopen %s", tmp);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    cr_assert_eq(fclose(f), 0);
    cr_assert_eq(rename(tmp, path), 0);
    free(tmp);
    free(path);
}

static inline void th_write_str(const char *dir, const char *name, const char *s) {
    th_write(dir, name, s, strlen(s));
}

static inline void th_unlink(const char *dir, const char *name) {
    char *path = th_path(dir, name);
    cr_assert_eq(unlink(path), 0, "unlink %s", path);
    free(path);
}

static inline void th_rmrf(const char *dir) {
    DIR *d = opendir(dir);
    if (d == NULL)
        return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        char *p = th_path(dir, de->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode))
            th_rmrf(p);
        else
            unlink(p);
        free(p);
    }
    closedir(d);
    rmdir(dir);
}

/* JWKS text from JWK object texts. */
static inline char *th_jwks(const char *const *jwks, size_t n) {
    size_t len = 16;
    for (size_t i = 0; i < n; i++)
        len += strlen(jwks[i]) + 1;
    char *s = malloc(len);
    cr_assert_not_null(s);
    strcpy(s, "{\"keys\":[");
    for (size_t i = 0; i < n; i++) {
        if (i > 0)
            strcat(s, ",");
        strcat(s, jwks[i]);
    }
    strcat(s, "]}");
    return s;
}

static inline drey_auth_options th_options(const char *jwks_file, const char *keys_dir) {
    return (drey_auth_options){
        .jwks_file = jwks_file,
        .keys_dir = keys_dir,
        .issuer = "https://issuer.test",
        .audience = "drey",
        .clock_skew_ms = 30000,
        .max_token_bytes = 8192,
        .cache_entries = 64,
    };
}

static inline drey_auth *th_create(const drey_auth_options *o) {
    char err[512] = "";
    drey_auth *a = drey_auth_create(o, err, sizeof err);
    cr_assert_not_null(a, "drey_auth_create: %s", err);
    return a;
}

static inline int64_t th_mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline void th_pause_ms(int ms) {
    struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)ms * 1000000L};
    nanosleep(&ts, NULL);
}

#endif
