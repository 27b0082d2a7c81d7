/*
 * Unit tests for drey_auth_set_attach: what another module makes of a
 * token's claims is made once per token and kept with it in the cache, is
 * made again once it is no longer current, and is never made for a token
 * that does not verify; references balance (ASan checks what is left).
 */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "auth_helpers.h"
#include "drey/log.h"

typedef struct obj {
    _Atomic int refs;
    int generation;
    char claims[512];
} obj;

static struct {
    char *dir, *keys;
    EVP_PKEY *ec;
    _Atomic int made, freed;
    int generation; /* what is current */
} F;

static void *make(void *ctx, const char *claims, size_t len) {
    (void)ctx;
    obj *o = calloc(1, sizeof *o);
    atomic_init(&o->refs, 1);
    o->generation = F.generation;
    snprintf(o->claims, sizeof o->claims, "%.*s", (int)len, claims);
    atomic_fetch_add(&F.made, 1);
    return o;
}

static void ref(void *p) {
    atomic_fetch_add(&((obj *)p)->refs, 1);
}

static void unref(void *p) {
    obj *o = p;
    if (atomic_fetch_sub(&o->refs, 1) == 1) {
        atomic_fetch_add(&F.freed, 1);
        free(o);
    }
}

static bool current(void *ctx, const void *p) {
    (void)ctx;
    return ((const obj *)p)->generation == F.generation;
}

static const drey_auth_attach attach = {.make = make, .ref = ref, .unref = unref, .current = current};

static void setup(void) {
    drey_log_set_level(DREY_LOG_LEVEL_ERROR);
    F.dir = th_tmpdir();
    F.keys = th_path(F.dir, "keys");
    cr_assert_eq(mkdir(F.keys, 0700), 0);
    F.ec = th_ec("P-256");
    char *pem = th_pub_pem(F.ec);
    th_write_str(F.keys, "k1.ES256.pem", pem);
    free(pem);
    atomic_store(&F.made, 0);
    atomic_store(&F.freed, 0);
    F.generation = 1;
}

static void teardown(void) {
    EVP_PKEY_free(F.ec);
    th_rmrf(F.dir);
    free(F.dir);
    free(F.keys);
}

TestSuite(attach, .init = setup, .fini = teardown);

static drey_error verify(drey_auth *a, const char *token, obj **out) {
    char *h = th_fmt("Bearer %s", token);
    char sub[64];
    void *o = NULL;
    drey_error e = drey_auth_verify_attached(a, h, strlen(h), TH_NOW_MS, sub, sizeof sub, out ? &o : NULL);
    free(h);
    if (out != NULL)
        *out = o;
    return e;
}

static char *token(const char *sub, const char *extra) {
    char *c = th_claims(sub, extra);
    char *t = th_sign_pk(JWT_ALG_ES256, F.ec, "k1", c);
    free(c);
    return t;
}

Test(attach, made_once_per_token_and_kept_with_it) {
    drey_auth_options o = th_options(NULL, F.keys);
    drey_auth *a = th_create(&o);
    drey_auth_set_attach(a, &attach);
    char *t = token("alice", ",\"groups\":[\"g1\"]");
    obj *x, *y;
    EXPECT_ERR(verify(a, t, &x), DREY_ERR_NONE);
    cr_assert_not_null(x);
    cr_assert(strstr(x->claims, "\"groups\"") != NULL && strstr(x->claims, "\"alice\"") != NULL, "%s", x->claims);
    EXPECT_ERR(verify(a, t, &y), DREY_ERR_NONE);
    cr_assert_eq(x, y, "the cached object");
    cr_assert_eq(atomic_load(&F.made), 1);
    cr_assert_eq(atomic_load(&x->refs), 3, "the cache's and two callers'");
    unref(x);
    unref(y);
    EXPECT_ERR(verify(a, t, NULL), DREY_ERR_NONE); /* a caller that does not want it takes no reference */
    cr_assert_eq(atomic_load(&x->refs), 1);
    free(t);
    drey_auth_destroy(a);
    cr_assert_eq(atomic_load(&F.freed), 1, "the cache let go of it");
}

Test(attach, an_object_no_longer_current_is_made_again) {
    drey_auth_options o = th_options(NULL, F.keys);
    drey_auth *a = th_create(&o);
    drey_auth_set_attach(a, &attach);
    char *t = token("bob", "");
    obj *x, *y;
    EXPECT_ERR(verify(a, t, &x), DREY_ERR_NONE);
    F.generation = 2; /* a policy reload */
    EXPECT_ERR(verify(a, t, &y), DREY_ERR_NONE);
    cr_assert_neq(x, y);
    cr_assert_eq(y->generation, 2);
    cr_assert_eq(atomic_load(&F.made), 2);
    drey_auth_stats st;
    drey_auth_get_stats(a, &st);
    cr_assert_eq(st.cache_hits, 0, "verified again");
    cr_assert_eq(atomic_load(&F.freed), 0, "the first caller still holds the old one");
    unref(x);
    cr_assert_eq(atomic_load(&F.freed), 1);
    unref(y);
    free(t);
    drey_auth_destroy(a);
    cr_assert_eq(atomic_load(&F.freed), 2);
}

Test(attach, never_made_for_a_token_that_does_not_verify) {
    drey_auth_options o = th_options(NULL, F.keys);
    drey_auth *a = th_create(&o);
    drey_auth_set_attach(a, &attach);
    char *c = th_fmt("{\"sub\":\"x\",\"exp\":%lld}", TH_NOW_S - 3600);
    char *expired = th_sign_pk(JWT_ALG_ES256, F.ec, "k1", c);
    obj *x = (obj *)1;
    EXPECT_ERR(verify(a, expired, &x), DREY_ERR_TOKEN_EXPIRED);
    cr_assert_null(x);
    EXPECT_ERR(verify(a, "not.a.token", &x), DREY_ERR_TOKEN_MALFORMED);
    cr_assert_null(x);
    cr_assert_eq(atomic_load(&F.made), 0);
    free(c);
    free(expired);
    drey_auth_destroy(a);
}

Test(attach, without_a_cache_the_object_is_the_callers_alone) {
    drey_auth_options o = th_options(NULL, F.keys);
    o.cache_entries = 0;
    drey_auth *a = th_create(&o);
    drey_auth_set_attach(a, &attach);
    char *t = token("carol", "");
    obj *x;
    EXPECT_ERR(verify(a, t, &x), DREY_ERR_NONE);
    cr_assert_eq(atomic_load(&x->refs), 1);
    unref(x);
    EXPECT_ERR(verify(a, t, NULL), DREY_ERR_NONE);
    cr_assert_eq(atomic_load(&F.made), 2);
    cr_assert_eq(atomic_load(&F.freed), 2);
    free(t);
    drey_auth_destroy(a);
}

Test(attach, a_sub_that_does_not_fit_releases_the_object) {
    drey_auth_options o = th_options(NULL, F.keys);
    drey_auth *a = th_create(&o);
    drey_auth_set_attach(a, &attach);
    char *t = token("a-rather-long-subject-name", "");
    char *h = th_fmt("Bearer %s", t);
    char tiny[4];
    void *x = (void *)1;
    EXPECT_ERR(drey_auth_verify_attached(a, h, strlen(h), TH_NOW_MS, tiny, sizeof tiny, &x), DREY_ERR_TOKEN_INVALID);
    cr_assert_null(x);
    EXPECT_ERR(drey_auth_verify_attached(a, h, strlen(h), TH_NOW_MS, tiny, sizeof tiny, &x), DREY_ERR_TOKEN_INVALID);
    cr_assert_null(x, "from the cache too");
    free(h);
    free(t);
    drey_auth_destroy(a);
    cr_assert_eq(atomic_load(&F.made), atomic_load(&F.freed));
}
