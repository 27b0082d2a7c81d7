/*
 * auth_verify — what the principal stage costs a call: drey_auth_verify on
 * one thread, for an RS256 token the cache knows (every call after the
 * first, the hot path), and for tokens it does not (a signature check each).
 *
 *   bazel run //tests/bench:auth_verify [-- calls]
 *
 * Prints nanoseconds per verification and their ratio; asserts nothing.
 */
#include <jwt.h>
#include <openssl/pem.h>
#include <openssl/rsa.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "drey/auth.h"
#include "drey/log.h"

static void die(const char *what) {
    fprintf(stderr, "auth_verify: %s\n", what);
    exit(1);
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* The PEM text of a key (private or public), malloc'd. */
static char *pem_of(EVP_PKEY *pk, bool private_key) {
    BIO *b = BIO_new(BIO_s_mem());
    if (b == NULL || !(private_key ? PEM_write_bio_PrivateKey(b, pk, NULL, NULL, 0, NULL, NULL)
                                   : PEM_write_bio_PUBKEY(b, pk)))
        die("PEM_write_bio");
    char *data;
    long n = BIO_get_mem_data(b, &data);
    char *s = strndup(data, (size_t)n);
    BIO_free(b);
    return s;
}

/* "Bearer <RS256 token>" with exp an hour from now_s and a distinct jti. */
static char *bearer(const char *private_pem, long long now_s, int jti) {
    jwt_t *jwt = NULL;
    char claims[256];
    snprintf(claims, sizeof claims, "{\"sub\":\"bench\",\"exp\":%lld,\"iat\":%lld,\"jti\":\"%d\"}", now_s + 3600,
             now_s, jti);
    if (jwt_new(&jwt) != 0 ||
        jwt_set_alg(jwt, JWT_ALG_RS256, (const unsigned char *)private_pem, (int)strlen(private_pem)) != 0 ||
        jwt_add_header(jwt, "kid", "rs") != 0 || jwt_add_grants_json(jwt, claims) != 0)
        die("libjwt");
    char *tok = jwt_encode_str(jwt);
    if (tok == NULL)
        die("jwt_encode_str");
    jwt_free(jwt);
    size_t n = strlen(tok) + sizeof "Bearer ";
    char *h = malloc(n);
    snprintf(h, n, "Bearer %s", tok);
    free(tok);
    return h;
}

int main(int argc, char **argv) {
    long calls = argc > 1 ? atol(argv[1]) : 1000000;
    if (calls <= 0)
        die("usage: auth_verify [calls]");
    drey_log_set_level(DREY_LOG_LEVEL_ERROR);

    EVP_PKEY *pk = EVP_RSA_gen(2048);
    if (pk == NULL)
        die("EVP_RSA_gen");
    char *priv = pem_of(pk, true), *pub = pem_of(pk, false);
    char dir[] = "/tmp/drey-auth-bench-XXXXXX", path[64];
    if (mkdtemp(dir) == NULL)
        die("mkdtemp");
    snprintf(path, sizeof path, "%s/rs.RS256.pem", dir);
    FILE *f = fopen(path, "w");
    if (f == NULL || fputs(pub, f) < 0 || fclose(f) != 0)
        die("writing the public key");
    drey_auth_options o = {.keys_dir = dir, .clock_skew_ms = 60000, .max_token_bytes = 8192, .cache_entries = 1024};
    char err[512];
    drey_auth *a = drey_auth_create(&o, err, sizeof err);
    if (a == NULL)
        die(err);

    long long now_s = (long long)time(NULL);
    int64_t now_ms = now_s * 1000;
    char sub[64];
    char *hot = bearer(priv, now_s, 0);
    size_t hot_len = strlen(hot);
    if (drey_auth_verify(a, hot, hot_len, now_ms, sub, sizeof sub) != DREY_ERR_NONE)
        die("the token does not verify");
    int64_t t0 = now_ns();
    for (long i = 0; i < calls; i++)
        drey_auth_verify(a, hot, hot_len, now_ms, sub, sizeof sub);
    double cached = (double)(now_ns() - t0) / (double)calls;

    /* Fresh tokens, signed beforehand: each verification checks a signature. */
    long cold_n = calls / 100 > 100 ? calls / 100 : 100;
    char **cold = malloc((size_t)cold_n * sizeof *cold);
    for (long i = 0; i < cold_n; i++)
        cold[i] = bearer(priv, now_s, (int)i + 1);
    t0 = now_ns();
    for (long i = 0; i < cold_n; i++) {
        if (drey_auth_verify(a, cold[i], strlen(cold[i]), now_ms, sub, sizeof sub) != DREY_ERR_NONE)
            die("a fresh token does not verify");
    }
    double uncached = (double)(now_ns() - t0) / (double)cold_n;

    drey_auth_stats st;
    drey_auth_get_stats(a, &st);
    printf("RS256 token, %zu-byte header, one thread\n", hot_len);
    printf("  cached:   %9.0f ns/verify (%ld calls)\n", cached, calls);
    printf("  uncached: %9.0f ns/verify (%ld calls)\n", uncached, cold_n);
    printf("  uncached / cached: %.0f; cache hits %llu, misses %llu\n", uncached / cached,
           (unsigned long long)st.cache_hits, (unsigned long long)st.cache_misses);

    for (long i = 0; i < cold_n; i++)
        free(cold[i]);
    free(cold);
    free(hot);
    drey_auth_destroy(a);
    unlink(path);
    rmdir(dir);
    free(priv);
    free(pub);
    EVP_PKEY_free(pk);
    return 0;
}
