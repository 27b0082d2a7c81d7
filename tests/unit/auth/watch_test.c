/*
 * Unit tests for src/auth/watch.c: the sources' fingerprint and the reload
 * watcher.
 *
 * The fingerprint moves when a key file is added, removed, replaced or
 * touched, and holds still otherwise. The watcher reloads on such a change
 * (tests wait on stats with a deadline, never on a sleep), keeps the old keys
 * when the change is broken and reports that once, and stops when told.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "auth_helpers.h"
#include "drey/log.h"
#include "src/auth/auth_internal.h"

#define DEADLINE_MS 10000
#define INTERVAL_MS 10

static struct {
    char *dir;  /* holds jwks.json and keys/ */
    char *keys; /* the keys directory */
    char *jwks; /* the JWKS file */
    unsigned char a[32], b[32];
} F;

static void setup(void) {
    drey_log_set_level(DREY_LOG_LEVEL_ERROR);
    F.dir = th_tmpdir();
    F.keys = th_path(F.dir, "keys");
    F.jwks = th_path(F.dir, "jwks.json");
    cr_assert_eq(mkdir(F.keys, 0700), 0);
    th_random(F.a, sizeof F.a);
    th_random(F.b, sizeof F.b);
}

static void teardown(void) {
    th_rmrf(F.dir);
    free(F.dir);
    free(F.keys);
    free(F.jwks);
}

TestSuite(watch, .init = setup, .fini = teardown);

static void write_jwks(bool with_b) {
    char *ja = th_jwk_oct(F.a, 32, "a", "HS256"), *jb = th_jwk_oct(F.b, 32, "b", "HS256");
    const char *list[] = {ja, jb};
    char *text = th_jwks(list, with_b ? 2 : 1);
    th_write_str(F.dir, "jwks.json", text);
    free(text);
    free(ja);
    free(jb);
}

static drey_error verify_kid(drey_auth *a, const char *kid, const unsigned char *secret) {
    char *c = th_claims("watcher", "");
    char *tok = th_sign(JWT_ALG_HS256, secret, 32, kid, c);
    drey_error e = th_verify(a, tok, TH_NOW_MS, NULL, 0);
    free(tok);
    free(c);
    return e;
}

static uint64_t fp(void) {
    return drey_auth__sources_fingerprint(F.jwks, F.keys);
}

Test(watch, fingerprint_moves_with_every_change_and_only_then) {
    write_jwks(false);
    th_write(F.keys, "k1.HS256.key", F.a, 32);
    uint64_t f0 = fp();
    cr_assert_eq(fp(), f0, "nothing changed");

    th_write(F.keys, "k2.HS256.key", F.b, 32);
    uint64_t f1 = fp();
    cr_assert_neq(f1, f0, "a file added");

    th_unlink(F.keys, "k2.HS256.key");
    uint64_t f2 = fp();
    cr_assert_neq(f2, f1, "a file removed");

    th_write(F.keys, "k1.HS256.key", F.b, 32); /* same size, new inode */
    uint64_t f3 = fp();
    cr_assert_neq(f3, f2, "a file replaced");

    char *k1 = th_path(F.keys, "k1.HS256.key");
    struct timespec times[2] = {{.tv_sec = 1000000000, .tv_nsec = 0}, {.tv_sec = 1000000000, .tv_nsec = 0}};
    cr_assert_eq(utimensat(AT_FDCWD, k1, times, 0), 0);
    uint64_t f4 = fp();
    cr_assert_neq(f4, f3, "a file touched");
    free(k1);

    write_jwks(true);
    uint64_t f5 = fp();
    cr_assert_neq(f5, f4, "the JWKS rewritten");

    th_unlink(F.dir, "jwks.json");
    cr_assert_neq(fp(), f5, "the JWKS removed");
    cr_assert_eq(fp(), fp(), "a missing source is stable");

    th_write_str(F.keys, "README", "ignored by the loader, still a change");
    cr_assert_neq(fp(), f5);
    cr_assert_eq(drey_auth__sources_fingerprint(NULL, NULL), drey_auth__sources_fingerprint(NULL, NULL));
}

/* Waits (polling, with a deadline) until pred holds. */
static bool eventually(drey_auth *a, bool (*pred)(drey_auth *)) {
    int64_t until = th_mono_ms() + DEADLINE_MS;
    while (th_mono_ms() < until) {
        if (pred(a))
            return true;
        th_pause_ms(2);
    }
    return pred(a);
}

static bool b_works(drey_auth *a) {
    drey_auth_stats st;
    drey_auth_get_stats(a, &st);
    return st.reloads >= 1 && verify_kid(a, "b", F.b) == DREY_ERR_NONE;
}

static bool reload_failed(drey_auth *a) {
    drey_auth_stats st;
    drey_auth_get_stats(a, &st);
    return st.reload_failures >= 1;
}

static bool reloaded(drey_auth *a) {
    drey_auth_stats st;
    drey_auth_get_stats(a, &st);
    return st.reloads >= 1;
}

Test(watch, picks_up_a_new_key_file) {
    th_write(F.keys, "a.HS256.key", F.a, 32);
    drey_auth_options o = th_options(NULL, F.keys);
    drey_auth *a = th_create(&o);
    drey_auth_watch(a, INTERVAL_MS);
    EXPECT_ERR(verify_kid(a, "b", F.b), DREY_ERR_TOKEN_UNKNOWN_KEY);
    th_write(F.keys, "b.HS256.key", F.b, 32);
    cr_assert(eventually(a, b_works), "the watcher should load b");
    EXPECT_ERR(verify_kid(a, "a", F.a), DREY_ERR_NONE);
    drey_auth_stats st;
    drey_auth_get_stats(a, &st);
    cr_assert_eq(st.keys, 2);
    cr_assert_eq(st.reload_failures, 0);
    drey_auth_stop_watch(a);
    drey_auth_destroy(a);
}

Test(watch, picks_up_a_changed_jwks) {
    write_jwks(false);
    drey_auth_options o = th_options(F.jwks, NULL);
    drey_auth *a = th_create(&o);
    drey_auth_watch(a, INTERVAL_MS);
    EXPECT_ERR(verify_kid(a, "b", F.b), DREY_ERR_TOKEN_UNKNOWN_KEY);
    write_jwks(true);
    cr_assert(eventually(a, b_works), "the watcher should load b");
    drey_auth_destroy(a); /* stops the watcher too */
}

Test(watch, keeps_the_old_keys_on_a_broken_change_and_reports_it_once) {
    write_jwks(false);
    drey_auth_options o = th_options(F.jwks, NULL);
    drey_auth *a = th_create(&o);
    drey_auth_watch(a, INTERVAL_MS);
    th_write_str(F.dir, "jwks.json", "{\"keys\": [ garbage");
    cr_assert(eventually(a, reload_failed), "the watcher should try and fail");
    EXPECT_ERR(verify_kid(a, "a", F.a), DREY_ERR_NONE);
    drey_auth_stats st;
    drey_auth_get_stats(a, &st);
    cr_assert_eq(st.keys, 1);
    cr_assert_eq(st.reloads, 0);
    /* Nothing changes for many intervals: no retry of the same broken file. */
    th_pause_ms(20 * INTERVAL_MS);
    drey_auth_get_stats(a, &st);
    cr_assert_eq(st.reload_failures, 1);
    /* Fixed: the next change loads. */
    write_jwks(true);
    cr_assert(eventually(a, b_works));
    drey_auth_stop_watch(a);
    drey_auth_destroy(a);
}

Test(watch, start_stop_are_idempotent_and_stop_means_stop) {
    th_write(F.keys, "a.HS256.key", F.a, 32);
    drey_auth_options o = th_options(NULL, F.keys);
    drey_auth *a = th_create(&o);
    drey_auth_stop_watch(a); /* not running: nothing to do */
    drey_auth_watch(a, INTERVAL_MS);
    drey_auth_watch(a, INTERVAL_MS); /* already running */
    drey_auth_stop_watch(a);
    drey_auth_stop_watch(a);
    th_write(F.keys, "b.HS256.key", F.b, 32);
    th_pause_ms(10 * INTERVAL_MS);
    drey_auth_stats st;
    drey_auth_get_stats(a, &st);
    cr_assert_eq(st.reloads, 0, "stopped: no reload");
    /* Started again: the change made while stopped is seen. */
    drey_auth_watch(a, INTERVAL_MS);
    cr_assert(eventually(a, reloaded));
    drey_auth_destroy(a);
}

/* A change between create and watch is not lost: the watcher compares with
 * what the last load saw, not with what it sees first. */
Test(watch, a_change_before_the_watch_starts_is_seen) {
    th_write(F.keys, "a.HS256.key", F.a, 32);
    drey_auth_options o = th_options(NULL, F.keys);
    drey_auth *a = th_create(&o);
    th_write(F.keys, "b.HS256.key", F.b, 32);
    drey_auth_watch(a, INTERVAL_MS);
    cr_assert(eventually(a, b_works));
    drey_auth_destroy(a);
}
