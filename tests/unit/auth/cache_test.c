/*
 * Unit tests for src/auth/cache.c: the verified-token cache.
 *
 * Directly: hits need the same digest, the current generation and times that
 * still pass; stale entries are dropped; the bound is exact and a full shard
 * replaces its oldest entry; concurrent use is safe. Through drey_auth: a
 * second verification of a token is a hit that skips the signature check
 * (stats), the bound holds, and several threads verify at once.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "auth_helpers.h"
#include "drey/log.h"
#include "src/auth/cache.h"

static void digest_of(uint32_t i, uint8_t d[DREY_AUTH_DIGEST]) {
    char s[16];
    snprintf(s, sizeof s, "token-%u", i);
    cr_assert_eq(EVP_Digest(s, strlen(s), d, NULL, EVP_sha256(), NULL), 1);
}

static drey_auth__verdict verdict(const char *sub, int64_t exp_ms) {
    return (drey_auth__verdict){.exp_ms = exp_ms, .nbf_ms = INT64_MIN, .sub = sub, .sub_len = strlen(sub)};
}

static bool hit(drey_auth__cache *c, uint32_t i, uint64_t gen, int64_t now_ms) {
    uint8_t d[DREY_AUTH_DIGEST];
    digest_of(i, d);
    char sub[32];
    bool fits = false;
    return drey_auth__cache_lookup(c, d, gen, now_ms, 0, sub, sizeof sub, &fits);
}

static void put(drey_auth__cache *c, uint32_t i, uint64_t gen, int64_t exp_ms) {
    uint8_t d[DREY_AUTH_DIGEST];
    digest_of(i, d);
    drey_auth__verdict v = verdict("someone", exp_ms);
    drey_auth__cache_insert(c, d, gen, &v);
}

Test(cache, hit_returns_the_sub) {
    drey_auth__cache *c = drey_auth__cache_create(8);
    uint8_t d[DREY_AUTH_DIGEST];
    digest_of(1, d);
    drey_auth__verdict v = verdict("alice", 10000);
    drey_auth__cache_insert(c, d, 1, &v);
    char sub[16] = "";
    bool fits = false;
    cr_assert(drey_auth__cache_lookup(c, d, 1, 5000, 0, sub, sizeof sub, &fits));
    cr_assert(fits);
    cr_assert_str_eq(sub, "alice");
    cr_assert(!hit(c, 2, 1, 5000), "another digest misses");
    /* Too small a buffer: still a hit, but the sub does not fit. */
    char tiny[5];
    cr_assert(drey_auth__cache_lookup(c, d, 1, 5000, 0, tiny, sizeof tiny, &fits));
    cr_assert(!fits);
    cr_assert(drey_auth__cache_lookup(c, d, 1, 5000, 0, NULL, 0, &fits));
    cr_assert(fits, "no buffer wanted: fits");
    drey_auth__cache_destroy(c);
}

Test(cache, other_generation_misses_and_is_dropped) {
    drey_auth__cache *c = drey_auth__cache_create(8);
    put(c, 1, 1, 10000);
    cr_assert_eq(drey_auth__cache_count(c), 1);
    cr_assert(!hit(c, 1, 2, 5000));
    cr_assert_eq(drey_auth__cache_count(c), 0);
    cr_assert(!hit(c, 1, 1, 5000), "dropped for good");
    drey_auth__cache_destroy(c);
}

Test(cache, times_follow_the_verification_rule) {
    drey_auth__cache *c = drey_auth__cache_create(8);
    uint8_t d[DREY_AUTH_DIGEST];
    digest_of(1, d);
    drey_auth__verdict v = {.exp_ms = 10000, .nbf_ms = 2000, .sub = "", .sub_len = 0};
    bool fits;
    drey_auth__cache_insert(c, d, 1, &v);
    cr_assert(drey_auth__cache_lookup(c, d, 1, 10999, 1000, NULL, 0, &fits), "exp + skew - 1 ms");
    cr_assert(drey_auth__cache_lookup(c, d, 1, 1000, 1000, NULL, 0, &fits), "nbf - skew");
    cr_assert(!drey_auth__cache_lookup(c, d, 1, 999, 1000, NULL, 0, &fits), "before nbf - skew");
    drey_auth__cache_insert(c, d, 1, &v);
    cr_assert(!drey_auth__cache_lookup(c, d, 1, 11000, 1000, NULL, 0, &fits), "exp + skew");
    cr_assert_eq(drey_auth__cache_count(c), 0);
    drey_auth__cache_destroy(c);
}

Test(cache, bound_is_exact) {
    size_t caps[] = {1, 2, 15, 16, 17, 100, 1000};
    for (size_t k = 0; k < sizeof caps / sizeof caps[0]; k++) {
        drey_auth__cache *c = drey_auth__cache_create(caps[k]);
        cr_assert_eq(drey_auth__cache_capacity(c), caps[k]);
        for (uint32_t i = 0; i < 5000; i++) {
            put(c, i, 1, 10000);
            cr_assert(drey_auth__cache_count(c) <= caps[k]);
        }
        cr_assert_eq(drey_auth__cache_count(c), caps[k], "a full cache holds exactly %zu", caps[k]);
        /* The newest entries are there. */
        cr_assert(hit(c, 4999, 1, 0));
        drey_auth__cache_destroy(c);
    }
}

Test(cache, full_shard_replaces_its_oldest) {
    drey_auth__cache *c = drey_auth__cache_create(1); /* one shard, one slot */
    put(c, 1, 1, 10000);
    put(c, 2, 1, 10000);
    cr_assert(!hit(c, 1, 1, 0));
    cr_assert(hit(c, 2, 1, 0));
    drey_auth__cache_destroy(c);

    c = drey_auth__cache_create(DREY_AUTH_CACHE_SHARDS * 4); /* 4 slots a shard */
    for (uint32_t i = 0; i < 2000; i++)
        put(c, i, 1, 10000);
    /* The last 4 inserted in every shard survive; so the last 4 overall do. */
    for (uint32_t i = 1996; i < 2000; i++)
        cr_assert(hit(c, i, 1, 0), "recent entry %u", i);
    cr_assert(!hit(c, 0, 1, 0));
    drey_auth__cache_destroy(c);
}

Test(cache, reinsert_updates_in_place) {
    drey_auth__cache *c = drey_auth__cache_create(4);
    put(c, 1, 1, 10000);
    put(c, 1, 2, 10000);
    cr_assert_eq(drey_auth__cache_count(c), 1);
    cr_assert(hit(c, 1, 2, 0));
    drey_auth__cache_destroy(c);
}

Test(cache, clear_and_disabled) {
    drey_auth__cache *c = drey_auth__cache_create(32);
    for (uint32_t i = 0; i < 32; i++)
        put(c, i, 1, 10000);
    drey_auth__cache_clear(c);
    cr_assert_eq(drey_auth__cache_count(c), 0);
    cr_assert(!hit(c, 3, 1, 0));
    put(c, 3, 1, 10000);
    cr_assert(hit(c, 3, 1, 0), "usable after a clear");
    drey_auth__cache_destroy(c);

    c = drey_auth__cache_create(0);
    put(c, 1, 1, 10000);
    cr_assert(!hit(c, 1, 1, 0));
    cr_assert_eq(drey_auth__cache_count(c), 0);
    drey_auth__cache_clear(c);
    drey_auth__cache_destroy(c);
}

static drey_auth__cache *shared;

static void *hammer(void *arg) {
    uint32_t base = (uint32_t)(uintptr_t)arg;
    for (uint32_t i = 0; i < 20000; i++) {
        uint32_t id = (base * 7919 + i) % 300;
        if (i % 3 == 0)
            put(shared, id, 1 + i % 2, 100000);
        else
            (void)hit(shared, id, 1 + i % 2, 0);
        if (i % 5000 == 4999 && base == 0)
            drey_auth__cache_clear(shared);
    }
    return NULL;
}

Test(cache, concurrent_use) {
    shared = drey_auth__cache_create(100);
    pthread_t t[4];
    for (uintptr_t i = 0; i < 4; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, hammer, (void *)i), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    cr_assert(drey_auth__cache_count(shared) <= 100);
    drey_auth__cache_destroy(shared);
}

/* ---- through drey_auth ------------------------------------------------- */

static struct {
    char *dir;
    unsigned char hs[32];
} F;

static void setup(void) {
    drey_log_set_level(DREY_LOG_LEVEL_ERROR);
    F.dir = th_tmpdir();
    th_random(F.hs, sizeof F.hs);
    th_write(F.dir, "hs.HS256.key", F.hs, sizeof F.hs);
}

static void teardown(void) {
    th_rmrf(F.dir);
    free(F.dir);
}

static drey_auth *create(size_t entries) {
    drey_auth_options o = th_options(NULL, F.dir);
    o.cache_entries = entries;
    return th_create(&o);
}

static char *token_for(int i) {
    char sub[32];
    snprintf(sub, sizeof sub, "user-%d", i);
    char *c = th_claims(sub, "");
    char *tok = th_sign(JWT_ALG_HS256, F.hs, sizeof F.hs, "hs", c);
    free(c);
    return tok;
}

Test(auth_cache, second_verify_is_a_hit, .init = setup, .fini = teardown) {
    drey_auth *a = create(16);
    char *tok = token_for(1);
    char sub[32];
    drey_auth_stats st;
    EXPECT_ERR(th_verify(a, tok, TH_NOW_MS, sub, sizeof sub), DREY_ERR_NONE);
    drey_auth_get_stats(a, &st);
    cr_assert_eq(st.cache_misses, 1);
    cr_assert_eq(st.cache_hits, 0);
    sub[0] = '\0';
    EXPECT_ERR(th_verify(a, tok, TH_NOW_MS, sub, sizeof sub), DREY_ERR_NONE);
    cr_assert_str_eq(sub, "user-1");
    drey_auth_get_stats(a, &st);
    cr_assert_eq(st.cache_misses, 1);
    cr_assert_eq(st.cache_hits, 1);
    /* A failed verification is not remembered. */
    char *bad = th_strdup(tok);
    char *p = bad + strlen(bad) - 4; /* inside the signature */
    *p = *p == 'A' ? 'B' : 'A';
    EXPECT_ERR(th_verify(a, bad, TH_NOW_MS, NULL, 0), DREY_ERR_TOKEN_BAD_SIGNATURE);
    EXPECT_ERR(th_verify(a, bad, TH_NOW_MS, NULL, 0), DREY_ERR_TOKEN_BAD_SIGNATURE);
    drey_auth_get_stats(a, &st);
    cr_assert_eq(st.cache_misses, 3);
    cr_assert_eq(st.cache_hits, 1);
    free(bad);
    free(tok);
    drey_auth_destroy(a);
}

/* The hit skips the signature check: with the key file now different on
 * disk (not reloaded), a cached token still verifies; after a reload it is
 * checked against the new key and fails. */
Test(auth_cache, a_hit_does_not_reach_libjwt, .init = setup, .fini = teardown) {
    drey_auth *a = create(16);
    char *tok = token_for(2);
    EXPECT_ERR(th_verify(a, tok, TH_NOW_MS, NULL, 0), DREY_ERR_NONE);
    unsigned char other[32];
    th_random(other, sizeof other);
    th_write(F.dir, "hs.HS256.key", other, sizeof other);
    EXPECT_ERR(th_verify(a, tok, TH_NOW_MS, NULL, 0), DREY_ERR_NONE);
    char err[256];
    cr_assert(drey_auth_reload(a, err, sizeof err), "%s", err);
    EXPECT_ERR(th_verify(a, tok, TH_NOW_MS, NULL, 0), DREY_ERR_TOKEN_BAD_SIGNATURE);
    free(tok);
    drey_auth_destroy(a);
}

Test(auth_cache, bound_is_respected, .init = setup, .fini = teardown) {
    drey_auth *a = create(4);
    char *toks[12];
    for (int i = 0; i < 12; i++) {
        toks[i] = token_for(i);
        EXPECT_ERR(th_verify(a, toks[i], TH_NOW_MS, NULL, 0), DREY_ERR_NONE);
    }
    for (int i = 0; i < 12; i++)
        EXPECT_ERR(th_verify(a, toks[i], TH_NOW_MS, NULL, 0), DREY_ERR_NONE);
    drey_auth_stats st;
    drey_auth_get_stats(a, &st);
    cr_assert(st.cache_hits <= 4, "at most 4 tokens remembered, %llu hits", (unsigned long long)st.cache_hits);
    cr_assert_eq(st.cache_hits + st.cache_misses, 24);
    for (int i = 0; i < 12; i++)
        free(toks[i]);
    drey_auth_destroy(a);
}

Test(auth_cache, disabled_cache_always_verifies, .init = setup, .fini = teardown) {
    drey_auth *a = create(0);
    char *tok = token_for(3);
    for (int i = 0; i < 3; i++)
        EXPECT_ERR(th_verify(a, tok, TH_NOW_MS, NULL, 0), DREY_ERR_NONE);
    drey_auth_stats st;
    drey_auth_get_stats(a, &st);
    cr_assert_eq(st.cache_hits, 0);
    cr_assert_eq(st.cache_misses, 3);
    free(tok);
    drey_auth_destroy(a);
}
