/*
 * Fuzz target: verifying an `authorization` header (src/auth: the bearer
 * prefix, the token's three segments, its JOSE header, the claims, RS256,
 * ES256 and HS256 signatures, the verified-token cache).
 *
 * Byte 0 holds flags, the rest is the header value. With bit 0 set the
 * target signs what it was given again with the HS256 key (everything
 * after the last dot is replaced by a right signature), so the fuzzer gets
 * past the signature to the claims. Bit 1 picks a verifier that also checks
 * issuer and audience. The keys are fixed (public keys and a test secret,
 * written to a temporary key directory at start), and so is "now".
 *
 * Properties: the answer of a second verification (now from the cache
 * when the first succeeded) is the first one's, a subject is always a
 * terminated string, and an accepted token was signed.
 */
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "drey/auth.h"
#include "drey/log.h"
#include "fuzz_util.h"

/* 2023-11-14T22:13:20Z, before the seeds' exp. */
#define NOW_MS 1700000000000LL

static const char rs_pem[] =
    "-----BEGIN PUBLIC KEY-----\n"
    "MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAouLpXY04YlDr0oGTJ9CQ\n"
    "JOYJ4qPwmt9yu2ziPn2Uifu/VwI0A6lExXh2M5kIQGJ8JDaBDeMnX9Zbmm4yuJ4q\n"
    "7oMOPUbNU+Gt/0WdmzGg0Pf1jt5yUc5R0DDJ0MxlyMG4wnIdaNL6wXpUk3DTedaC\n"
    "vZyW0IiN6r5yRR+N+621TYWRMzyQV88MZ9L948BhTT4yElinazbkgVEyYMJNYRPl\n"
    "N3Pn5wh6r2MIS1W/keu9pxdBKAXpz+JQBAXC7V22IMcOIk2StbuKulMazYch9mhS\n"
    "dnsXzKrBsqPSUC2a96HffV6AYRxWgdJ5nfTSCulWUwNGFOnChn4PYMYjjiXEIiFW\n"
    "uQIDAQAB\n"
    "-----END PUBLIC KEY-----\n";

static const char es_pem[] =
    "-----BEGIN PUBLIC KEY-----\n"
    "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEyF9fQtDqlWZGbEbZ8eT3GduuUDYQ\n"
    "VG3IdFinS33ndWIjsQ2r1E354+MBYET4lNT7zQR8OasNU/rxJD6eAq2Fzg==\n"
    "-----END PUBLIC KEY-----\n";

/* A test secret, not used anywhere else. */
static const char hs_key[] = "886kZu0PGFxwtWfVuBpub3q7lGnlOpa4i60hW/w9";

static drey_auth *plain, *strict;
static char keys_dir[64];

static void put(const char *name, const char *text) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", keys_dir, name);
    FILE *f = fopen(path, "w");
    FUZZ_CHECK(f != NULL, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

static void cleanup(void) {
    drey_auth_destroy(plain);
    drey_auth_destroy(strict);
    const char *names[] = {"rs.RS256.pem", "es.ES256.pem", "hs.HS256.key"};
    for (size_t i = 0; i < 3; i++) {
        char path[128];
        snprintf(path, sizeof path, "%s/%s", keys_dir, names[i]);
        unlink(path);
    }
    rmdir(keys_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    drey_log_set_level(DREY_LOG_LEVEL_ERROR); /* skipped keys are expected here */
    snprintf(keys_dir, sizeof keys_dir, "%s/drey-fuzz-keys-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    FUZZ_CHECK(mkdtemp(keys_dir) != NULL, "mkdtemp");
    put("rs.RS256.pem", rs_pem);
    put("es.ES256.pem", es_pem);
    put("hs.HS256.key", hs_key);
    char err[512];
    drey_auth_options o = {.keys_dir = keys_dir, .clock_skew_ms = 30000, .max_token_bytes = 4096,
                           .cache_entries = 64};
    plain = drey_auth_create(&o, err, sizeof err);
    FUZZ_CHECK(plain != NULL, "%s", err);
    o.issuer = "https://issuer.test";
    o.audience = "drey";
    strict = drey_auth_create(&o, err, sizeof err);
    FUZZ_CHECK(strict != NULL, "%s", err);
    atexit(cleanup);
    return 0;
}

static const char b64url[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/* header value with its signature segment replaced by HS256(secret). */
static char *resign(const char *h, size_t n, size_t *out_len) {
    const char *dot = memrchr(h, '.', n);
    size_t start = 0;
    for (size_t i = 0; i < n; i++) {
        if (h[i] == ' ')
            start = i + 1; /* the token starts after "Bearer " */
    }
    if (dot == NULL || (size_t)(dot - h) < start)
        return NULL;
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned mac_len = 0;
    HMAC(EVP_sha256(), hs_key, (int)strlen(hs_key), (const unsigned char *)h + start, (size_t)(dot - h) - start,
         mac, &mac_len);
    size_t head = (size_t)(dot - h) + 1;
    char *out = malloc(head + 4 * mac_len / 3 + 4);
    memcpy(out, h, head);
    size_t o = head;
    for (unsigned i = 0; i < mac_len; i += 3) {
        unsigned v = (unsigned)mac[i] << 16 | (i + 1 < mac_len ? (unsigned)mac[i + 1] << 8 : 0) |
                     (i + 2 < mac_len ? mac[i + 2] : 0);
        out[o++] = b64url[v >> 18 & 63];
        out[o++] = b64url[v >> 12 & 63];
        if (i + 1 < mac_len)
            out[o++] = b64url[v >> 6 & 63];
        if (i + 2 < mac_len)
            out[o++] = b64url[v & 63];
    }
    *out_len = o;
    return out;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 8192)
        return 0;
    drey_auth *a = data[0] & 2 ? strict : plain;
    const char *h = (const char *)data + 1;
    size_t n = size - 1;
    char *signed_h = NULL;
    if (data[0] & 1) {
        signed_h = resign(h, n, &n);
        if (signed_h == NULL)
            return 0;
        h = signed_h;
    }
    char sub1[64], sub2[64];
    memset(sub1, 'x', sizeof sub1);
    drey_error e1 = drey_auth_verify(a, h, n, NOW_MS, sub1, sizeof sub1);
    drey_error e2 = drey_auth_verify(a, h, n, NOW_MS, sub2, sizeof sub2);
    FUZZ_CHECK(e1 == e2, "first %d, then %d", (int)e1, (int)e2);
    if (getenv("DREY_FUZZ_DEBUG") != NULL) /* to see what a seed reaches */
        fprintf(stderr, "verify: %s\n", e1 == DREY_ERR_NONE ? "ok" : drey_error_lookup(e1)->reason);
    if (e1 == DREY_ERR_NONE) {
        FUZZ_CHECK(memchr(sub1, 0, sizeof sub1) != NULL, "unterminated subject");
        FUZZ_CHECK(strcmp(sub1, sub2) == 0, "the cache gave another subject");
    }
    free(signed_h);
    return 0;
}
