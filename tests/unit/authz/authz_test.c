/* The policy file in force: loading, reloading, watching, refusals. */
#include "authz_helpers.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "drey/clock.h"

static char *temp_file(void) {
    const char *dir = getenv("TEST_TMPDIR");
    char *path = NULL;
    cr_assert(asprintf(&path, "%s/policy-XXXXXX", dir != NULL ? dir : "/tmp") > 0);
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    return path;
}

/* Writes a new file and renames it into place (a new inode, as a
 * ConfigMap's update or an editor's save). */
static void put(const char *path, const char *text) {
    char tmp[512];
    snprintf(tmp, sizeof tmp, "%s.new", path);
    FILE *f = fopen(tmp, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    cr_assert_eq(rename(tmp, path), 0);
}

#define READER                                                                                                     \
    "{\"roles\": {\"r\": [{\"caches\": [\"*\"], \"keys\": [\"*\"], \"verbs\": [\"read\"]}]},"                          \
    " \"bindings\": [{\"anonymous\": true, \"roles\": [\"r\"]}]}"
#define WRITER                                                                                                     \
    "{\"roles\": {\"w\": [{\"caches\": [\"*\"], \"keys\": [\"*\"], \"verbs\": [\"write\"]}]},"                         \
    " \"bindings\": [{\"anonymous\": true, \"roles\": [\"w\"]}], \"tenants\": {\"claim\": \"t\", "                  \
    "\"maxBytes\": {\"a\": 10}}}"

static bool anon_may(drey_authz *a, drey_authz_verb v) {
    drey_authz_grants *g = drey_authz_grants_for(a, NULL, 0);
    bool ok = th_key(g, v, "c", "k");
    drey_authz_grants_unref(g);
    return ok;
}

Test(authz, a_file_that_does_not_load_stops_the_start) {
    char err[256];
    cr_assert_null(drey_authz_create("/nonexistent/policy.json", err, sizeof err));
    cr_assert(strstr(err, "/nonexistent/policy.json") != NULL, "%s", err);
    char *path = temp_file();
    put(path, "{\"roles\": 1}");
    cr_assert_null(drey_authz_create(path, err, sizeof err));
    cr_assert(strstr(err, "roles: an object") != NULL, "%s", err);
    unlink(path);
    free(path);
}

Test(authz, a_reload_swaps_the_policy_and_a_bad_one_keeps_it) {
    char *path = temp_file();
    put(path, READER);
    char err[256];
    drey_authz *a = drey_authz_create(path, err, sizeof err);
    cr_assert_not_null(a, "%s", err);
    cr_assert(anon_may(a, DREY_AUTHZ_READ));
    cr_assert_not(drey_authz_has_tenants(a));
    drey_authz_grants *old = drey_authz_grants_for(a, NULL, 0);
    cr_assert(drey_authz_current(a, old));

    put(path, WRITER);
    cr_assert(drey_authz_reload(a, err, sizeof err), "%s", err);
    cr_assert_not(anon_may(a, DREY_AUTHZ_READ));
    cr_assert(anon_may(a, DREY_AUTHZ_WRITE));
    cr_assert_not(drey_authz_current(a, old), "grants of the old policy are compiled again");
    cr_assert(th_key(old, DREY_AUTHZ_READ, "c", "k"), "while a request holds them they still work");
    drey_authz_grants_unref(old);
    cr_assert(drey_authz_has_tenants(a));
    cr_assert_eq(drey_authz_tenant_limit(a, "a", 1), 10);
    cr_assert_eq(drey_authz_tenant_limit(a, "b", 1), -1);

    put(path, "{\"roles\": {\"r\": [{\"caches\": [\"*\"], \"keys\": [\"*\"], \"verbs\": [\"reed\"]}]}}");
    cr_assert_not(drey_authz_reload(a, err, sizeof err));
    cr_assert(strstr(err, "not a verb") != NULL, "%s", err);
    cr_assert(anon_may(a, DREY_AUTHZ_WRITE), "the policy in force stays");
    drey_authz_stats s;
    drey_authz_get_stats(a, &s);
    cr_assert_eq(s.generation, 2);
    cr_assert_eq(s.reloads, 1);
    cr_assert_eq(s.reload_failures, 1);
    cr_assert(strstr(s.last_error, "not a verb") != NULL);
    cr_assert_str_eq(s.path, path);

    put(path, READER);
    cr_assert(drey_authz_reload(a, err, sizeof err));
    drey_authz_get_stats(a, &s);
    cr_assert_str_eq(s.last_error, "", "a good load clears the error");
    cr_assert_eq(s.generation, 3);
    drey_authz_destroy(a);
    unlink(path);
    free(path);
}

Test(authz, the_watcher_reloads_a_changed_file) {
    char *path = temp_file();
    put(path, READER);
    char err[256];
    drey_authz *a = drey_authz_create(path, err, sizeof err);
    cr_assert_not_null(a);
    drey_authz_watch(a, 10);
    put(path, WRITER);
    int64_t until = drey_mono_ms() + 5000;
    while (!anon_may(a, DREY_AUTHZ_WRITE) && drey_mono_ms() < until)
        usleep(5000);
    cr_assert(anon_may(a, DREY_AUTHZ_WRITE));
    /* A broken file: reported, the policy stays, and once it is fixed it loads. */
    put(path, "{");
    drey_authz_stats s;
    until = drey_mono_ms() + 5000;
    do {
        usleep(5000);
        drey_authz_get_stats(a, &s);
    } while (s.reload_failures == 0 && drey_mono_ms() < until);
    cr_assert_eq(s.reload_failures, 1);
    cr_assert(anon_may(a, DREY_AUTHZ_WRITE));
    usleep(50000);
    drey_authz_get_stats(a, &s);
    cr_assert_eq(s.reload_failures, 1, "a broken file is tried once, not every interval");
    put(path, READER);
    until = drey_mono_ms() + 5000;
    while (!anon_may(a, DREY_AUTHZ_READ) && drey_mono_ms() < until)
        usleep(5000);
    cr_assert(anon_may(a, DREY_AUTHZ_READ));
    drey_authz_stop_watch(a);
    drey_authz_stop_watch(a);
    drey_authz_destroy(a);
    unlink(path);
    free(path);
}

Test(authz, a_denial_is_a_status_a_count_and_a_line_in_the_last_denials) {
    char *path = temp_file();
    put(path, READER);
    char err[256];
    drey_authz *a = drey_authz_create(path, err, sizeof err);
    drey_status st;
    drey_status_init(&st);
    drey_authz_deny(a, "jwt:alice", DREY_AUTHZ_WRITE, "users", 5, "/drey.cache.v1.Cache/Set", &st);
    cr_assert_eq(drey_status_code(&st), GRPC_STATUS_PERMISSION_DENIED);
    cr_assert_str_eq(drey_error_lookup(st.error)->reason, "NOT_PERMITTED");
    cr_assert_eq(st.n_metadata, 3);
    cr_assert_str_eq(st.metadata[0].key, "verb");
    cr_assert_str_eq(st.metadata[0].value, "write");
    cr_assert_str_eq(st.metadata[1].key, "cache");
    cr_assert_str_eq(st.metadata[1].value, "users");
    cr_assert_str_eq(st.metadata[2].key, "method");
    cr_assert_str_eq(st.metadata[2].value, "/drey.cache.v1.Cache/Set");

    drey_status_init(&st);
    drey_authz_deny(a, "jwt:alice", DREY_AUTHZ_WRITE, "users", 5, "/drey.cache.v1.Cache/Set", &st);
    drey_status_init(&st);
    drey_authz_deny(a, "conn:1", DREY_AUTHZ_ADMIN, NULL, 0, "/drey.admin.v1.Admin/Snapshot", &st);
    cr_assert_str_eq(st.metadata[1].value, "", "admin names no cache");
    drey_status_init(&st);
    drey_authz_deny(a, "conn:1", DREY_AUTHZ_READ, "", 0, "/drey.cache.v1.Cache/Get", &st);
    cr_assert_str_eq(st.metadata[1].value, "default");

    drey_authz_stats s;
    drey_authz_get_stats(a, &s);
    cr_assert_eq(s.denied[DREY_AUTHZ_WRITE], 2);
    cr_assert_eq(s.denied[DREY_AUTHZ_ADMIN], 1);
    cr_assert_eq(s.n_denials, 3);
    cr_assert_str_eq(s.denials[0].method, "/drey.cache.v1.Cache/Get");
    cr_assert_str_eq(s.denials[2].principal, "jwt:alice");
    cr_assert_eq(s.denials[2].count, 2);
    cr_assert(s.denials[2].last_ms > 0);

    /* Bounded: the oldest go; a repeated one moves to the front. */
    for (int i = 0; i < 40; i++) {
        char who[32];
        snprintf(who, sizeof who, "conn:%d", 100 + i);
        drey_status_init(&st);
        drey_authz_deny(a, who, DREY_AUTHZ_READ, "c", 1, "/m", &st);
    }
    drey_status_init(&st);
    drey_authz_deny(a, "conn:130", DREY_AUTHZ_READ, "c", 1, "/m", &st);
    drey_authz_get_stats(a, &s);
    cr_assert_eq(s.n_denials, DREY_AUTHZ_LAST_DENIALS);
    cr_assert_str_eq(s.denials[0].principal, "conn:130");
    cr_assert_eq(s.denials[0].count, 2);
    cr_assert_str_eq(s.denials[1].principal, "conn:139");

    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    drey_authz_collect_metrics(a, f);
    fclose(f);
    cr_assert(strstr(text, "drey_authz_denied_total{verb=\"write\"} 2") != NULL, "%s", text);
    cr_assert(strstr(text, "drey_authz_denied_total{verb=\"read\"} 42") != NULL, "%s", text);
    cr_assert(strstr(text, "drey_authz_denied_total{verb=\"metrics\"} 0") != NULL, "%s", text);
    cr_assert(strstr(text, "drey_authz_policy_generation 1") != NULL, "%s", text);
    free(text);
    drey_authz_destroy(a);
    unlink(path);
    free(path);
}
