/*
 * Unit tests for src/auth/keys.c: key sets from a JWKS file and a keys
 * directory.
 *
 * Pins that RSA and EC JWKs become exactly the PEM public keys they
 * describe, that every rule about a single key (alg required and matching
 * kty/crv, key sizes, PEM type, file naming) skips that key only, and that
 * what breaks a source as a whole (unreadable, not a JWKS, nothing usable,
 * a duplicate kid) fails the load.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "auth_helpers.h"
#include "drey/log.h"
#include "src/auth/keys.h"

static char *dir;

static void setup(void) {
    dir = th_tmpdir();
    drey_log_set_level(DREY_LOG_LEVEL_ERROR); /* skipped-key warnings are expected here */
}

static void teardown(void) {
    th_rmrf(dir);
    free(dir);
}

TestSuite(keys, .init = setup, .fini = teardown);

static drey_auth__keyset *load_ok(const char *jwks, const char *kdir) {
    char err[512] = "";
    drey_auth__keyset *ks = drey_auth__keyset_load(jwks, kdir, err, sizeof err);
    cr_assert_not_null(ks, "load failed: %s", err);
    return ks;
}

static void load_fails(const char *jwks, const char *kdir, const char *err_part) {
    char err[512] = "";
    drey_auth__keyset *ks = drey_auth__keyset_load(jwks, kdir, err, sizeof err);
    cr_assert_null(ks, "load should fail (%s)", err_part);
    cr_assert(strstr(err, err_part) != NULL, "err \"%s\" should mention \"%s\"", err, err_part);
}

static char *write_jwks_as(const char *name, const char *const *jwks, size_t n) {
    char *text = th_jwks(jwks, n);
    th_write_str(dir, name, text);
    free(text);
    return th_path(dir, name);
}

static char *write_jwks(const char *const *jwks, size_t n) {
    return write_jwks_as("jwks.json", jwks, n);
}

static const drey_auth__key *must_find(const drey_auth__keyset *ks, const char *kid, jwt_alg_t alg) {
    const drey_auth__key *k = drey_auth__keyset_find(ks, kid);
    cr_assert_not_null(k, "kid %s", kid);
    cr_assert_str_eq(k->kid, kid);
    cr_assert_eq(k->alg, alg, "kid %s: alg %s", kid, jwt_alg_str(k->alg));
    return k;
}

/* The key built from a JWK or a PEM file is the key itself: its PEM is the
 * original's, byte for byte. */
static void expect_pem(const drey_auth__key *k, EVP_PKEY *pk) {
    cr_assert_not_null(k->pkey, "kid %s", k->kid);
    cr_assert_null(k->material, "kid %s: a public key has no secret", k->kid);
    char *want = th_pub_pem(pk), *got = th_pub_pem(k->pkey);
    cr_assert_str_eq(got, want, "kid %s: PEM differs", k->kid);
    free(want);
    free(got);
}

Test(keys, jwks_rsa_ec_and_oct_become_exact_keys) {
    EVP_PKEY *rsa = th_rsa(2048), *p256 = th_ec("P-256"), *p384 = th_ec("P-384"), *p521 = th_ec("P-521");
    unsigned char secret[64];
    th_random(secret, sizeof secret);
    char *jwk[] = {
        th_jwk(rsa, "r", "RS256"),  th_jwk(rsa, "r5", "RS512"),      th_jwk(p256, "e2", "ES256"),
        th_jwk(p384, "e3", "ES384"), th_jwk(p521, "e5", "ES512"),     th_jwk_oct(secret, 32, "h2", "HS256"),
        th_jwk_oct(secret, 64, "h5", "HS512"),
    };
    char *path = write_jwks((const char *const *)jwk, 7);
    drey_auth__keyset *ks = load_ok(path, NULL);
    cr_assert_eq(ks->n, 7);
    expect_pem(must_find(ks, "r", JWT_ALG_RS256), rsa);
    expect_pem(must_find(ks, "r5", JWT_ALG_RS512), rsa);
    expect_pem(must_find(ks, "e2", JWT_ALG_ES256), p256);
    expect_pem(must_find(ks, "e3", JWT_ALG_ES384), p384);
    expect_pem(must_find(ks, "e5", JWT_ALG_ES512), p521);
    const drey_auth__key *h2 = must_find(ks, "h2", JWT_ALG_HS256);
    cr_assert_eq(h2->material_len, 32);
    cr_assert(memcmp(h2->material, secret, 32) == 0);
    cr_assert_eq(must_find(ks, "h5", JWT_ALG_HS512)->material_len, 64);
    drey_auth__keyset_free(ks);
    for (size_t i = 0; i < 7; i++)
        free(jwk[i]);
    free(path);
    EVP_PKEY_free(rsa);
    EVP_PKEY_free(p256);
    EVP_PKEY_free(p384);
    EVP_PKEY_free(p521);
}

/* Every JWK below breaks one rule; only "good" survives. */
Test(keys, jwks_bad_keys_are_skipped_one_by_one) {
    EVP_PKEY *rsa = th_rsa(2048), *small = th_rsa(1024), *p256 = th_ec("P-256"), *p384 = th_ec("P-384");
    unsigned char secret[64];
    th_random(secret, sizeof secret);
    char *good = th_jwk(p256, "good", "ES256");
    char *p256_x = th_bn_b64url(p256, OSSL_PKEY_PARAM_EC_PUB_X, 32);
    char *p256_y = th_bn_b64url(p256, OSSL_PKEY_PARAM_EC_PUB_Y, 32);
    char *jwk[] = {
        good,
        /* alg missing */
        th_fmt("{\"kty\":\"oct\",\"kid\":\"noalg\",\"k\":\"%s\"}", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"),
        /* kid missing */
        th_fmt("{\"kty\":\"oct\",\"alg\":\"HS256\",\"k\":\"%s\"}", "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"),
        th_jwk(p256, "rs-on-ec", "RS256"),   /* RS256 needs kty RSA */
        th_jwk(rsa, "es-on-rsa", "ES256"),   /* ES256 needs kty EC */
        th_jwk(p384, "es256-p384", "ES256"), /* ES256 needs crv P-256 */
        th_jwk(p256, "es384-p256", "ES384"), /* ES384 needs crv P-384 */
        th_jwk(small, "rsa1024", "RS256"),   /* too small */
        th_jwk_oct(secret, 31, "short256", "HS256"),
        th_jwk_oct(secret, 47, "short384", "HS384"),
        th_jwk_oct(secret, 32, "hs-on-rsa", "RS256"),
        th_jwk(p256, "none", "none"),
        th_jwk(p256, "ps256", "PS256"),
        th_fmt("{\"kty\":\"EC\",\"kid\":\"offcurve\",\"alg\":\"ES256\",\"crv\":\"P-256\",\"x\":\"%s\","
               "\"y\":\"%s\"}",
               p256_x, p256_x),
        th_fmt("{\"kty\":\"EC\",\"kid\":\"shortx\",\"alg\":\"ES256\",\"crv\":\"P-256\",\"x\":\"AAAA\","
               "\"y\":\"%s\"}",
               p256_y),
        th_fmt("{\"kty\":\"RSA\",\"kid\":\"badn\",\"alg\":\"RS256\",\"n\":\"not+base64\",\"e\":\"AQAB\"}"),
        th_fmt("{\"kty\":\"EC\",\"kid\":\"enc\",\"alg\":\"ES256\",\"use\":\"enc\",\"crv\":\"P-256\","
               "\"x\":\"%s\",\"y\":\"%s\"}",
               p256_x, p256_y),
        th_fmt("[\"not an object\"]"),
        th_fmt("{\"kty\":\"oct\",\"kid\":\"k-not-string\",\"alg\":\"HS256\",\"k\":42}"),
    };
    size_t n = sizeof jwk / sizeof jwk[0];
    char *path = write_jwks((const char *const *)jwk, n);
    drey_auth__keyset *ks = load_ok(path, NULL);
    cr_assert_eq(ks->n, 1, "only the good key survives, got %zu", ks->n);
    must_find(ks, "good", JWT_ALG_ES256);
    drey_auth__keyset_free(ks);

    /* Without the good key, nothing is usable: the load fails. */
    char *bad = write_jwks((const char *const *)jwk + 1, n - 1);
    load_fails(bad, NULL, "no usable key");
    free(bad);
    for (size_t i = 0; i < n; i++)
        free(jwk[i]);
    free(path);
    free(p256_x);
    free(p256_y);
    EVP_PKEY_free(rsa);
    EVP_PKEY_free(small);
    EVP_PKEY_free(p256);
    EVP_PKEY_free(p384);
}

Test(keys, jwks_unreadable_or_not_a_jwks_fails) {
    char *missing = th_path(dir, "missing.json");
    load_fails(missing, NULL, "missing.json");
    th_write_str(dir, "garbage.json", "{\"keys\": [ this is not json");
    char *garbage = th_path(dir, "garbage.json");
    load_fails(garbage, NULL, "not JSON");
    th_write_str(dir, "nokeys.json", "{\"kty\":\"oct\"}");
    char *nokeys = th_path(dir, "nokeys.json");
    load_fails(nokeys, NULL, "not a JWKS");
    th_write_str(dir, "empty.json", "{\"keys\":[]}");
    char *empty = th_path(dir, "empty.json");
    load_fails(empty, NULL, "no usable key");
    th_write_str(dir, "dup.json", "{\"keys\":[], \"keys\":[]}");
    char *dup = th_path(dir, "dup.json");
    load_fails(dup, NULL, "not JSON");
    load_fails(dir, NULL, "not a regular file");
    free(missing);
    free(garbage);
    free(nokeys);
    free(empty);
    free(dup);
}

Test(keys, no_source_fails) {
    load_fails(NULL, NULL, "no key source");
    load_fails("", "", "no key source");
}

Test(keys, dir_loads_pem_and_secret_files) {
    EVP_PKEY *rsa = th_rsa(2048), *p384 = th_ec("P-384");
    char *rsa_pem = th_pub_pem(rsa), *p384_pem = th_pub_pem(p384);
    unsigned char secret[48];
    th_random(secret, sizeof secret);
    th_write_str(dir, "rsa.RS256.pem", rsa_pem);
    th_write_str(dir, "dotted.kid.RS384.pem", rsa_pem);
    th_write_str(dir, "ec.ES384.pem", p384_pem);
    th_write(dir, "hs.HS384.key", secret, 48);
    th_write(dir, "hs256.HS256.key", secret, 32);
    th_write_str(dir, "README.md", "not a key");
    th_write_str(dir, "notes.txt", "not a key");
    th_write_str(dir, ".hidden.RS256.pem", rsa_pem);
    drey_auth__keyset *ks = load_ok(NULL, dir);
    cr_assert_eq(ks->n, 5);
    expect_pem(must_find(ks, "rsa", JWT_ALG_RS256), rsa);
    expect_pem(must_find(ks, "dotted.kid", JWT_ALG_RS384), rsa);
    expect_pem(must_find(ks, "ec", JWT_ALG_ES384), p384);
    const drey_auth__key *hs = must_find(ks, "hs", JWT_ALG_HS384);
    cr_assert_eq(hs->material_len, 48);
    cr_assert(memcmp(hs->material, secret, 48) == 0);
    must_find(ks, "hs256", JWT_ALG_HS256);
    cr_assert_null(drey_auth__keyset_find(ks, "hidden"));
    cr_assert_null(drey_auth__keyset_find(ks, ".hidden"));
    drey_auth__keyset_free(ks);
    free(rsa_pem);
    free(p384_pem);
    EVP_PKEY_free(rsa);
    EVP_PKEY_free(p384);
}

Test(keys, dir_bad_files_are_skipped_one_by_one) {
    EVP_PKEY *rsa = th_rsa(2048), *p256 = th_ec("P-256"), *p384 = th_ec("P-384");
    char *rsa_pem = th_pub_pem(rsa), *p256_pem = th_pub_pem(p256), *p384_pem = th_pub_pem(p384);
    char *rsa_priv = th_priv_pem(rsa);
    unsigned char secret[64];
    th_random(secret, sizeof secret);
    th_write_str(dir, "good.ES256.pem", p256_pem);
    th_write_str(dir, "ec-named-rs.RS256.pem", p256_pem);   /* type mismatch */
    th_write_str(dir, "rsa-named-es.ES256.pem", rsa_pem);   /* type mismatch */
    th_write_str(dir, "p384-named-256.ES256.pem", p384_pem); /* curve mismatch */
    th_write_str(dir, "private.RS256.pem", rsa_priv);        /* not a public key */
    th_write_str(dir, "garbage.RS256.pem", "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n");
    th_write(dir, "short.HS256.key", secret, 31);  /* < 32 bytes */
    th_write(dir, "short.HS512.key", secret, 63);  /* < 64 bytes */
    th_write(dir, "hs-as-pem.HS256.pem", secret, 64); /* HS keys are .key files */
    th_write_str(dir, "rs-as-key.RS256.key", rsa_pem); /* RS keys are .pem files */
    th_write_str(dir, "unknown.PS256.pem", rsa_pem);
    th_write_str(dir, "lower.rs256.pem", rsa_pem);
    th_write_str(dir, "noalg.pem", rsa_pem);
    th_write_str(dir, ".RS256.pem", rsa_pem); /* hidden, ignored */
    char *sub = th_path(dir, "subdir.RS256.pem");
    cr_assert_eq(mkdir(sub, 0700), 0);
    drey_auth__keyset *ks = load_ok(NULL, dir);
    for (size_t i = 0; i < ks->n; i++)
        cr_assert_str_eq(ks->keys[i].kid, "good", "only good survives, %s did too", ks->keys[i].kid);
    cr_assert_eq(ks->n, 1);
    must_find(ks, "good", JWT_ALG_ES256);
    drey_auth__keyset_free(ks);

    th_unlink(dir, "good.ES256.pem");
    load_fails(NULL, dir, "no usable key");
    free(sub);
    free(rsa_pem);
    free(p256_pem);
    free(p384_pem);
    free(rsa_priv);
    EVP_PKEY_free(rsa);
    EVP_PKEY_free(p256);
    EVP_PKEY_free(p384);
}

Test(keys, dir_missing_or_empty_fails) {
    char *missing = th_path(dir, "nope");
    load_fails(NULL, missing, "nope");
    free(missing);
    load_fails(NULL, dir, "no usable key");
}

Test(keys, duplicate_kid_fails) {
    EVP_PKEY *p256 = th_ec("P-256");
    char *pem = th_pub_pem(p256);
    char *kdir = th_path(dir, "keys");
    cr_assert_eq(mkdir(kdir, 0700), 0);
    th_write_str(kdir, "k1.ES256.pem", pem);

    /* Across sources. */
    char *jwk[] = {th_jwk(p256, "k1", "ES256")};
    char *path = write_jwks((const char *const *)jwk, 1);
    load_fails(path, kdir, "\"k1\"");

    /* Inside the directory, under two algorithms. */
    char *kdir2 = th_path(dir, "keys2");
    cr_assert_eq(mkdir(kdir2, 0700), 0);
    th_write_str(kdir2, "k2.ES256.pem", pem);
    unsigned char secret[32];
    th_random(secret, sizeof secret);
    th_write(kdir2, "k2.HS256.key", secret, 32);
    load_fails(NULL, kdir2, "\"k2\"");

    /* Inside the JWKS. */
    char *twice[] = {jwk[0], jwk[0]};
    char *path2 = write_jwks_as("twice.json", (const char *const *)twice, 2);
    load_fails(path2, NULL, "\"k1\"");

    /* Distinct kids across both sources load together. */
    th_unlink(kdir, "k1.ES256.pem");
    th_write_str(kdir, "k3.ES256.pem", pem);
    drey_auth__keyset *ks = load_ok(path, kdir);
    cr_assert_eq(ks->n, 2);
    must_find(ks, "k1", JWT_ALG_ES256);
    must_find(ks, "k3", JWT_ALG_ES256);
    drey_auth__keyset_free(ks);
    free(jwk[0]);
    free(path);
    free(path2);
    free(kdir);
    free(kdir2);
    free(pem);
    EVP_PKEY_free(p256);
}

Test(keys, find_by_kid_and_the_single_key_rule) {
    unsigned char secret[32];
    th_random(secret, sizeof secret);
    char name[64];
    for (int i = 0; i < 40; i++) {
        snprintf(name, sizeof name, "kid-%02d.HS256.key", i);
        th_write(dir, name, secret, 32);
    }
    drey_auth__keyset *ks = load_ok(NULL, dir);
    cr_assert_eq(ks->n, 40);
    for (int i = 0; i < 40; i++) {
        snprintf(name, sizeof name, "kid-%02d", i);
        must_find(ks, name, JWT_ALG_HS256);
    }
    cr_assert_null(drey_auth__keyset_find(ks, "kid-40"));
    cr_assert_null(drey_auth__keyset_find(ks, ""));
    cr_assert_null(drey_auth__keyset_find(ks, NULL), "no kid with 40 keys: no key");
    drey_auth__keyset_free(ks);

    char *one = th_path(dir, "one");
    cr_assert_eq(mkdir(one, 0700), 0);
    th_write(one, "only.HS256.key", secret, 32);
    ks = load_ok(NULL, one);
    const drey_auth__key *k = drey_auth__keyset_find(ks, NULL);
    cr_assert_not_null(k, "no kid with one key: that key");
    cr_assert_str_eq(k->kid, "only");
    drey_auth__keyset_free(ks);
    free(one);
}

Test(keys, min_secret_sizes) {
    cr_assert_eq(drey_auth__min_secret(JWT_ALG_HS256), 32);
    cr_assert_eq(drey_auth__min_secret(JWT_ALG_HS384), 48);
    cr_assert_eq(drey_auth__min_secret(JWT_ALG_HS512), 64);
    cr_assert_eq(drey_auth__min_secret(JWT_ALG_RS256), 0);
}
