/*
 * Unit tests for src/auth/auth.c: create, reload, stats, destroy.
 *
 * Pins that create refuses sources it cannot use and says why; that a
 * reload swaps in a complete key set and retires every cached token (a
 * rotated-away key stops working at once, cached or not); that a broken
 * reload keeps the old keys; that verification is safe from several
 * threads while keys are reloaded; and that tokens and claims never reach
 * the log.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "auth_helpers.h"
#include "drey/log.h"

static struct {
    char *dir;  /* the test's scratch directory */
    char *keys; /* a keys directory inside it */
    EVP_PKEY *ec1, *ec2;
    unsigned char hs[32];
} F;

static void setup(void) {
    drey_log_set_level(DREY_LOG_LEVEL_ERROR);
    F.dir = th_tmpdir();
    F.keys = th_path(F.dir, "keys");
    cr_assert_eq(mkdir(F.keys, 0700), 0);
    F.ec1 = th_ec("P-256");
    F.ec2 = th_ec("P-256");
    th_random(F.hs, sizeof F.hs);
}

static void teardown(void) {
    EVP_PKEY_free(F.ec1);
    EVP_PKEY_free(F.ec2);
    th_rmrf(F.dir);
    free(F.dir);
    free(F.keys);
}

TestSuite(auth, .init = setup, .fini = teardown);

static void write_pem(const char *name, EVP_PKEY *pk) {
    char *pem = th_pub_pem(pk);
    th_write_str(F.keys, name, pem);
    free(pem);
}

static char *es_token(EVP_PKEY *pk, const char *kid, const char *sub) {
    char *c = th_claims(sub, "");
    char *tok = th_sign_pk(JWT_ALG_ES256, pk, kid, c);
    free(c);
    return tok;
}

static void create_fails(const drey_auth_options *o, const char *err_part) {
    char err[512] = "";
    drey_auth *a = drey_auth_create(o, err, sizeof err);
    cr_assert_null(a, "create should fail (%s)", err_part);
    cr_assert(strstr(err, err_part) != NULL, "err \"%s\" should mention \"%s\"", err, err_part);
    cr_assert_null(drey_auth_create(o, NULL, 0), "no err buffer: still NULL, no crash");
}

Test(auth, create_refuses_unusable_sources) {
    drey_auth_options o = th_options(NULL, NULL);
    create_fails(&o, "no key source");
    o = th_options("", "");
    create_fails(&o, "no key source");
    char *missing = th_path(F.dir, "missing.json");
    o = th_options(missing, NULL);
    create_fails(&o, "missing.json");
    th_write_str(F.dir, "garbage.json", "garbage");
    char *garbage = th_path(F.dir, "garbage.json");
    o = th_options(garbage, NULL);
    create_fails(&o, "not JSON");
    o = th_options(NULL, F.keys); /* empty */
    create_fails(&o, "no usable key");
    /* One good source does not excuse a bad one. */
    write_pem("k1.ES256.pem", F.ec1);
    o = th_options(garbage, F.keys);
    create_fails(&o, "not JSON");
    free(missing);
    free(garbage);
}

Test(auth, stats_start_at_zero) {
    write_pem("k1.ES256.pem", F.ec1);
    write_pem("k2.ES256.pem", F.ec2);
    drey_auth_options o = th_options(NULL, F.keys);
    drey_auth *a = th_create(&o);
    drey_auth_stats st;
    memset(&st, 0xff, sizeof st);
    drey_auth_get_stats(a, &st);
    cr_assert_eq(st.keys, 2);
    cr_assert_eq(st.cache_hits, 0);
    cr_assert_eq(st.cache_misses, 0);
    cr_assert_eq(st.reloads, 0);
    cr_assert_eq(st.reload_failures, 0);
    drey_auth_destroy(a);
    drey_auth_destroy(NULL);
}

/* The options' strings are copied: the caller's may go away. */
Test(auth, options_are_copied) {
    write_pem("k1.ES256.pem", F.ec1);
    char *dir = th_strdup(F.keys), *iss = th_strdup("https://issuer.test"), *aud = th_strdup("drey");
    drey_auth_options o = th_options(NULL, dir);
    o.issuer = iss;
    o.audience = aud;
    drey_auth *a = th_create(&o);
    memset(dir, 'x', strlen(dir));
    memset(iss, 'x', strlen(iss));
    memset(aud, 'x', strlen(aud));
    free(dir);
    free(iss);
    free(aud);
    char *tok = es_token(F.ec1, "k1", "alice");
    EXPECT_ERR(th_verify(a, tok, TH_NOW_MS, NULL, 0), DREY_ERR_NONE);
    char err[256];
    cr_assert(drey_auth_reload(a, err, sizeof err), "%s", err);
    free(tok);
    drey_auth_destroy(a);
}

/* Verified and cached, then its key file is removed and the keys reloaded:
 * the same token is now refused, from the cache or not. */
Test(auth, a_rotated_away_key_stops_working_at_once) {
    write_pem("k1.ES256.pem", F.ec1);
    write_pem("k2.ES256.pem", F.ec2);
    drey_auth_options o = th_options(NULL, F.keys);
    drey_auth *a = th_create(&o);
    char *t1 = es_token(F.ec1, "k1", "alice"), *t2 = es_token(F.ec2, "k2", "bob");
    EXPECT_ERR(th_verify(a, t1, TH_NOW_MS, NULL, 0), DREY_ERR_NONE);
    EXPECT_ERR(th_verify(a, t1, TH_NOW_MS, NULL, 0), DREY_ERR_NONE);
    drey_auth_stats st;
    drey_auth_get_stats(a, &st);
    cr_assert_eq(st.cache_hits, 1, "t1 is cached");

    th_unlink(F.keys, "k1.ES256.pem");
    char err[256] = "";
    cr_assert(drey_auth_reload(a, err, sizeof err), "%s", err);
    EXPECT_ERR(th_verify(a, t1, TH_NOW_MS, NULL, 0), DREY_ERR_TOKEN_UNKNOWN_KEY);
    EXPECT_ERR(th_verify(a, t2, TH_NOW_MS, NULL, 0), DREY_ERR_NONE);
    drey_auth_get_stats(a, &st);
    cr_assert_eq(st.keys, 1);
    cr_assert_eq(st.reloads, 1);
    cr_assert_eq(st.cache_hits, 1, "no hit after the reload");
    free(t1);
    free(t2);
    drey_auth_destroy(a);
}

/* Same kid, new key: tokens of the old key fail even if cached. */
Test(auth, a_replaced_key_retires_cached_tokens) {
    write_pem("k1.ES256.pem", F.ec1);
    drey_auth_options o = th_options(NULL, F.keys);
    drey_auth *a = th_create(&o);
    char *old = es_token(F.ec1, "k1", "alice"), *new = es_token(F.ec2, "k1", "alice");
    EXPECT_ERR(th_verify(a, old, TH_NOW_MS, NULL, 0), DREY_ERR_NONE);
    EXPECT_ERR(th_verify(a, new, TH_NOW_MS, NULL, 0), DREY_ERR_TOKEN_BAD_SIGNATURE);
    write_pem("k1.ES256.pem", F.ec2);
    cr_assert(drey_auth_reload(a, NULL, 0));
    EXPECT_ERR(th_verify(a, old, TH_NOW_MS, NULL, 0), DREY_ERR_TOKEN_BAD_SIGNATURE);
    EXPECT_ERR(th_verify(a, new, TH_NOW_MS, NULL, 0), DREY_ERR_NONE);
    free(old);
    free(new);
    drey_auth_destroy(a);
}

Test(auth, a_broken_reload_keeps_the_old_keys) {
    char *jwk = th_jwk(F.ec1, "k1", "ES256");
    const char *list[] = {jwk};
    char *text = th_jwks(list, 1);
    th_write_str(F.dir, "jwks.json", text);
    char *path = th_path(F.dir, "jwks.json");
    drey_auth_options o = th_options(path, NULL);
    drey_auth *a = th_create(&o);
    char *tok = es_token(F.ec1, "k1", "alice");
    EXPECT_ERR(th_verify(a, tok, TH_NOW_MS, NULL, 0), DREY_ERR_NONE);

    const char *broken[] = {"{\"keys\": [ garbage", "{\"keys\":[{\"kty\":\"EC\",\"kid\":\"k1\"}]}", "[]", ""};
    for (size_t i = 0; i < sizeof broken / sizeof broken[0]; i++) {
        th_write_str(F.dir, "jwks.json", broken[i]);
        char err[256] = "";
        cr_assert(!drey_auth_reload(a, err, sizeof err), "broken JWKS %zu must not load", i);
        cr_assert(strstr(err, "jwks.json") != NULL, "err names the file: %s", err);
        EXPECT_ERR(th_verify(a, tok, TH_NOW_MS, NULL, 0), DREY_ERR_NONE);
    }
    th_unlink(F.dir, "jwks.json");
    cr_assert(!drey_auth_reload(a, NULL, 0));
    EXPECT_ERR(th_verify(a, tok, TH_NOW_MS, NULL, 0), DREY_ERR_NONE);
    drey_auth_stats st;
    drey_auth_get_stats(a, &st);
    cr_assert_eq(st.keys, 1);
    cr_assert_eq(st.reloads, 0);
    cr_assert_eq(st.reload_failures, 5);
    free(tok);
    free(text);
    free(jwk);
    free(path);
    drey_auth_destroy(a);
}

Test(auth, a_reload_with_a_duplicate_kid_fails) {
    write_pem("k1.ES256.pem", F.ec1);
    char *jwk = th_jwk(F.ec2, "k2", "ES256");
    const char *list[] = {jwk};
    char *text = th_jwks(list, 1);
    th_write_str(F.dir, "jwks.json", text);
    char *path = th_path(F.dir, "jwks.json");
    drey_auth_options o = th_options(path, F.keys);
    drey_auth *a = th_create(&o);
    write_pem("k2.ES256.pem", F.ec1);
    char err[256] = "";
    cr_assert(!drey_auth_reload(a, err, sizeof err));
    cr_assert(strstr(err, "\"k2\"") != NULL, "%s", err);
    char *tok = es_token(F.ec2, "k2", "bob");
    EXPECT_ERR(th_verify(a, tok, TH_NOW_MS, NULL, 0), DREY_ERR_NONE);
    free(tok);
    free(text);
    free(jwk);
    free(path);
    drey_auth_destroy(a);
}

Test(auth, a_reload_empties_the_cache) {
    th_write(F.keys, "hs.HS256.key", F.hs, 32);
    drey_auth_options o = th_options(NULL, F.keys);
    drey_auth *a = th_create(&o);
    char *c = th_claims("alice", "");
    char *tok = th_sign(JWT_ALG_HS256, F.hs, 32, "hs", c);
    EXPECT_ERR(th_verify(a, tok, TH_NOW_MS, NULL, 0), DREY_ERR_NONE);
    cr_assert(drey_auth_reload(a, NULL, 0)); /* same keys, new generation */
    EXPECT_ERR(th_verify(a, tok, TH_NOW_MS, NULL, 0), DREY_ERR_NONE);
    EXPECT_ERR(th_verify(a, tok, TH_NOW_MS, NULL, 0), DREY_ERR_NONE);
    drey_auth_stats st;
    drey_auth_get_stats(a, &st);
    cr_assert_eq(st.cache_misses, 2);
    cr_assert_eq(st.cache_hits, 1);
    free(tok);
    free(c);
    drey_auth_destroy(a);
}

/* ---- concurrency ---------------------------------------------------------- */

#define THREADS 4
#define ROUNDS 400

static struct {
    drey_auth *a;
    char *toks[8]; /* tokens[i] has sub "user-i" */
    atomic_bool stop;
    atomic_int failures;
} C;

static void *verifier(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    for (int i = 0; i < ROUNDS; i++) {
        seed = seed * 1103515245u + 12345u;
        unsigned k = (seed >> 16) % 8;
        char sub[32], want[32];
        snprintf(want, sizeof want, "user-%u", k);
        drey_error e = th_verify(C.a, C.toks[k], TH_NOW_MS, sub, sizeof sub);
        if (e != DREY_ERR_NONE || strcmp(sub, want) != 0)
            atomic_fetch_add(&C.failures, 1);
    }
    return NULL;
}

static void *reloader(void *arg) {
    (void)arg;
    while (!atomic_load(&C.stop)) {
        if (!drey_auth_reload(C.a, NULL, 0))
            atomic_fetch_add(&C.failures, 1);
        th_pause_ms(1);
    }
    return NULL;
}

Test(auth, concurrent_verifies_while_reloading) {
    write_pem("k1.ES256.pem", F.ec1);
    th_write(F.keys, "hs.HS256.key", F.hs, 32);
    drey_auth_options o = th_options(NULL, F.keys);
    o.cache_entries = 4; /* smaller than the token set: hits, misses and evictions */
    C.a = th_create(&o);
    for (int i = 0; i < 8; i++) {
        char sub[32];
        snprintf(sub, sizeof sub, "user-%d", i);
        char *c = th_claims(sub, "");
        C.toks[i] = i % 2 == 0 ? th_sign_pk(JWT_ALG_ES256, F.ec1, "k1", c) : th_sign(JWT_ALG_HS256, F.hs, 32, "hs", c);
        free(c);
    }
    pthread_t v[THREADS], r;
    cr_assert_eq(pthread_create(&r, NULL, reloader, NULL), 0);
    for (uintptr_t i = 0; i < THREADS; i++)
        cr_assert_eq(pthread_create(&v[i], NULL, verifier, (void *)(i + 1)), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(v[i], NULL);
    atomic_store(&C.stop, true);
    pthread_join(r, NULL);
    cr_assert_eq(atomic_load(&C.failures), 0);
    drey_auth_stats st;
    drey_auth_get_stats(C.a, &st);
    cr_assert_eq(st.cache_hits + st.cache_misses, THREADS * ROUNDS);
    cr_assert(st.reloads >= 1);
    for (int i = 0; i < 8; i++)
        free(C.toks[i]);
    drey_auth_destroy(C.a);
}

/* ---- the log -------------------------------------------------------------- */

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    char *buf = calloc(1, 1 << 20);
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

Test(auth, tokens_secrets_and_claims_never_reach_the_log) {
    char *log_path = th_path(F.dir, "log");
    int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    cr_assert(fd >= 0);
    drey_log_set_fd(fd);
    drey_log_set_level(DREY_LOG_LEVEL_DEBUG);

    th_write(F.keys, "hs.HS256.key", F.hs, 32);
    th_write(F.keys, "short.HS256.key", F.hs, 16); /* skipped: logged */
    drey_auth_options o = th_options(NULL, F.keys);
    drey_auth *a = th_create(&o);
    const char *subject = "secret-subject-1234";
    char *c = th_claims(subject, ",\"email\":\"claim-value-5678\"");
    char *tok = th_sign(JWT_ALG_HS256, F.hs, 32, "hs", c);
    char *bad = th_strdup(tok);
    bad[strlen(bad) - 3] = bad[strlen(bad) - 3] == 'A' ? 'B' : 'A';
    EXPECT_ERR(th_verify(a, tok, TH_NOW_MS, NULL, 0), DREY_ERR_NONE);
    EXPECT_ERR(th_verify(a, bad, TH_NOW_MS, NULL, 0), DREY_ERR_TOKEN_BAD_SIGNATURE);
    EXPECT_ERR(th_verify(a, tok, (TH_NOW_S + 7200) * 1000, NULL, 0), DREY_ERR_TOKEN_EXPIRED);
    cr_assert(drey_auth_reload(a, NULL, 0));
    drey_auth_watch(a, 5);
    drey_auth_destroy(a);
    drey_log_set_fd(2);
    close(fd);

    char *log = slurp(log_path);
    cr_assert(strstr(log, "auth key skipped") != NULL, "the short secret is reported: %s", log);
    cr_assert(strstr(log, "auth keys reloaded") != NULL, "the reload is reported: %s", log);
    const char *dot = strchr(tok, '.');
    char *hdr = th_fmt("%.*s", (int)(dot - tok), tok);
    cr_assert(strstr(log, hdr) == NULL, "no token segment in the log");
    cr_assert(strstr(log, strrchr(tok, '.') + 1) == NULL, "no signature in the log");
    cr_assert(strstr(log, subject) == NULL, "no subject in the log");
    cr_assert(strstr(log, "claim-value-5678") == NULL, "no claim in the log");
    char *secret_b64 = th_b64url(F.hs, 32);
    cr_assert(strstr(log, secret_b64) == NULL, "no secret in the log");
    free(secret_b64);
    free(hdr);
    free(log);
    free(bad);
    free(tok);
    free(c);
    free(log_path);
}
