/* The drey CLI end to end: run as a subprocess against the real dreyd. */
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

static harness_env env;
static char drey_bin[1024];
static char addr_flag[64];

static void up(void) {
    harness_up(&env, NULL);
    harness_binary("drey", drey_bin, sizeof drey_bin);
    snprintf(addr_flag, sizeof addr_flag, "--addr=%s", env.server.addr);
}

static void down(void) {
    harness_down(&env);
}

TestSuite(cli, .init = up, .fini = down, .timeout = 60);

/* Runs `drey --addr=<server> args...` (NULL-terminated); returns the exit
 * status, stdout and stderr (freed by the caller). */
#define DREY(out, err, ...) drey_run((out), (err), (const char *const[]){__VA_ARGS__, NULL})

static int drey_run(char **out, char **err, const char *const *args) {
    const char *argv[32] = {drey_bin, addr_flag};
    size_t n = 2;
    for (size_t i = 0; args[i] != NULL; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    return harness_run(argv, out, err);
}

/* Asserts exit status and stdout, printing stderr on a mismatch. */
static void expect(int want_rc, const char *want_out, const char *const *args) {
    char *out, *err;
    int rc = drey_run(&out, &err, args);
    cr_assert_eq(rc, want_rc, "drey %s %s: exit %d, stderr:\n%s", args[0], args[1] ? args[1] : "", rc, err);
    if (want_out != NULL)
        cr_assert_str_eq(out, want_out, "drey %s: stdout", args[0]);
    free(out);
    free(err);
}

#define EXPECT(rc, out, ...) expect((rc), (out), (const char *const[]){__VA_ARGS__, NULL})

Test(cli, set_get_and_incr) {
    char *out, *err;
    cr_assert_eq(DREY(&out, &err, "set", "greeting", "hello world"), 0, "%s", err);
    /* text: the version, a tab, the expiry (none: empty) */
    cr_assert_str_eq(out, "1\t\n", "%s", out);
    free(out);
    free(err);
    EXPECT(0, "hello world\n", "get", "greeting");
    EXPECT(0, "5\n", "incr", "n", "5");
    EXPECT(0, "6\n", "incr", "n");
    EXPECT(0, "-4\n", "incr", "n", "-10");
    EXPECT(0, "-4\n", "get", "n");

    /* What the CLI wrote is what the C client reads. */
    Drey__Cache__V1__GetRequest req = DREY__CACHE__V1__GET_REQUEST__INIT;
    req.key = "n";
    Drey__Cache__V1__GetResponse *g =
        harness_ok(&env, DREY_CLIENT_CACHE("Get"), &req.base, &drey__cache__v1__get_response__descriptor);
    cr_assert_eq(g->value->kind_case, DREY__CACHE__V1__VALUE__KIND_INT64_VALUE);
    cr_assert_eq(g->value->int64_value, -4);
}

Test(cli, a_version_mismatch_exits_1_with_code_reason_and_metadata) {
    EXPECT(0, NULL, "set", "k", "v1");
    char *out, *err;
    int rc = DREY(&out, &err, "set", "k", "v2", "--if-version=999");
    cr_assert_eq(rc, 1, "exit %d", rc);
    cr_assert_str_eq(out, "", "nothing on stdout");
    cr_assert_not_null(strstr(err, "FAILED_PRECONDITION"), "%s", err);
    cr_assert_not_null(strstr(err, "VERSION_MISMATCH"), "%s", err);
    cr_assert_not_null(strstr(err, "currentVersion"), "%s", err);
    free(out);
    free(err);
    EXPECT(0, "v1\n", "get", "k");
}

Test(cli, a_validation_error_lists_the_field_violations) {
    char *out, *err;
    int rc = DREY(&out, &err, "--cache=no spaces", "set", "", "v");
    cr_assert_eq(rc, 1);
    cr_assert_not_null(strstr(err, "INVALID_ARGUMENT"), "%s", err);
    cr_assert_not_null(strstr(err, "field cache: INVALID_CACHE_NAME"), "%s", err);
    cr_assert_not_null(strstr(err, "field key: INVALID_KEY"), "%s", err);
    free(out);
    free(err);
}

Test(cli, negative_answers_exit_3) {
    char *out, *err;
    int rc = DREY(&out, &err, "get", "missing");
    cr_assert_eq(rc, 3);
    cr_assert_str_eq(out, "", "a missing key prints nothing on stdout");
    cr_assert_not_null(strstr(err, "not found"), "%s", err);
    free(out);
    free(err);
    EXPECT(3, "", "rm", "missing");
    EXPECT(3, "", "touch", "missing", "5s");
    EXPECT(3, "", "ttl", "missing");
    EXPECT(0, NULL, "add", "once", "first");
    EXPECT(3, "", "add", "once", "second");
    EXPECT(0, "first\n", "get", "once");
}

Test(cli, usage_errors_exit_2) {
    EXPECT(2, "", "frobnicate");
    EXPECT(2, "", "get");
    EXPECT(2, "", "get", "a", "b");
    EXPECT(2, "", "get", "k", "--ttl=5s");
    EXPECT(2, "", "set", "k", "v", "--ttl=soon");
    EXPECT(2, "", "set", "k", "12x", "--int");
    EXPECT(2, "", "set", "k", "[1]", "--json");
    EXPECT(2, "", "set", "k", "v", "--int", "--json");
    EXPECT(2, "", "get", "k", "--bogus");
    char *out;
    cr_assert_eq(DREY(&out, NULL, "--help"), 0);
    cr_assert_not_null(strstr(out, "Exit status"), "%s", out);
    cr_assert_not_null(strstr(out, "incr KEY [DELTA]"), "%s", out);
    free(out);
}

Test(cli, ttl_touch_persist_and_rm) {
    EXPECT(0, NULL, "set", "s", "v", "--ttl=1h");
    char *out;
    cr_assert_eq(DREY(&out, NULL, "ttl", "s"), 0);
    cr_assert(strncmp(out, "3599.", 5) == 0 || strncmp(out, "3600.", 5) == 0, "%s", out);
    free(out);
    EXPECT(0, NULL, "touch", "s", "2m");
    cr_assert_eq(DREY(&out, NULL, "ttl", "s"), 0);
    cr_assert(strncmp(out, "119.", 4) == 0 || strncmp(out, "120.", 4) == 0, "%s", out);
    free(out);
    EXPECT(0, NULL, "persist", "s");
    EXPECT(0, "none\t\n", "ttl", "s");
    EXPECT(3, "", "persist", "s");
    EXPECT(0, NULL, "rm", "s");
    EXPECT(3, "", "get", "s");
}

Test(cli, value_kinds_and_caches) {
    EXPECT(0, NULL, "set", "i", "41", "--int");
    EXPECT(0, "42\n", "incr", "i");
    EXPECT(0, NULL, "set", "j", "{\"b\":[1,2.5,\"x\",null,true],\"a\":{\"n\":3}}", "--json");
    EXPECT(0, "{\"a\":{\"n\":3},\"b\":[1,2.5,\"x\",null,true]}\n", "get", "j");
    EXPECT(0, NULL, "--cache=other", "set", "i", "elsewhere");
    EXPECT(0, "elsewhere\n", "get", "i", "--cache=other");
    EXPECT(0, "42\n", "get", "i");
    EXPECT(0, NULL, "set", "dash", "--", "--not-a-flag");
    EXPECT(0, "--not-a-flag\n", "get", "dash");
}

Test(cli, health) {
    EXPECT(0, "SERVING\n", "health");
    EXPECT(0, "SERVING\n", "health", "drey.cache.v1.Cache");
    char *err;
    cr_assert_eq(DREY(NULL, &err, "health", "no.such.Service"), 1);
    cr_assert_not_null(strstr(err, "NOT_FOUND"), "%s", err);
    cr_assert_not_null(strstr(err, "UNKNOWN_SERVICE"), "%s", err);
    free(err);
}

/* Column i (from 0) of a tab-separated line. */
static const char *column(const char *line, int i) {
    const char *p = line;
    for (int k = 0; k < i; k++) {
        p = strchr(p, '\t');
        cr_assert_not_null(p, "no column %d in: %s", i, line);
        p++;
    }
    return p;
}

/* snapshot's columns: lsn, file, entries, bytes, durationMs, segmentsRemoved */
static unsigned long long field(const char *line, const char *name) {
    static const char *const names[] = {"lsn", "file", "entries", "bytes", "ms", "segments_removed"};
    for (int i = 0; i < 6; i++)
        if (strcmp(names[i], name) == 0)
            return strtoull(column(line, i), NULL, 10);
    cr_assert_fail("no column %s", name);
    return 0;
}

Test(cli, snapshot_then_ready_reports_it) {
    EXPECT(0, NULL, "set", "a", "1");
    EXPECT(0, NULL, "set", "b", "2");
    EXPECT(0, NULL, "set", "c", "3");
    EXPECT(0, NULL, "rm", "c");
    char *out, *err;
    cr_assert_eq(DREY(&out, &err, "snapshot"), 0, "%s", err);
    cr_assert_eq(strchr(out, '\n'), out + strlen(out) - 1, "one line: %s", out);
    cr_assert_eq(field(out, "lsn"), 4, "four journaled writes: %s", out);
    cr_assert_eq(field(out, "entries"), 2, "%s", out);
    cr_assert_gt(field(out, "bytes"), 0, "%s", out);
    const char *file = column(out, 1);
    char path[1024];
    snprintf(path, sizeof path, "%s/%.*s", env.server.data_dir, (int)strcspn(file, "\t\n"), file);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0, "the snapshot file %s is not there", path);
    cr_assert_eq((unsigned long long)st.st_size, field(out, "bytes"), "%s", out);
    free(out);
    free(err);

    cr_assert_eq(DREY(&out, &err, "ready", "-o", "json"), 0, "%s", err);
    cr_assert_not_null(strstr(out, "{\"ready\":true,"), "%s", out);
    cr_assert_not_null(strstr(out, "\"snapshot\":{\"lastLsn\":4,"), "%s", out);
    cr_assert_not_null(strstr(out, "\"journal\":{\"fsyncPolicy\":\"always\",\"lastLsn\":4,"), "%s", out);
    cr_assert_eq(strchr(out, '\n'), out + strlen(out) - 1, "one line: %s", out);
    free(out);
    free(err);
    EXPECT(2, "", "ready", "now");
    EXPECT(2, "", "snapshot", "--ttl=1s");
}

Test(cli, an_unreachable_server_exits_1) {
    /* A port held by a socket that never listens: connections are refused,
     * and no other test can take it meanwhile. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    char addr[64];
    snprintf(addr, sizeof addr, "--addr=127.0.0.1:%d", ntohs(sa.sin_port));
    const char *argv[] = {drey_bin, addr, "--timeout=5s", "get", "k", NULL};
    char *err;
    int rc = harness_run(argv, NULL, &err);
    close(fd);
    cr_assert_eq(rc, 1, "exit %d: %s", rc, err);
    cr_assert_not_null(strstr(err, "UNAVAILABLE"), "%s", err);
    free(err);
}

static void up_ephemeral(void) {
    /* A grace longer than the test: the test's SIGTERM starts the drain,
     * harness_stop's ends it. */
    harness_up(&env, (const char *const[]){"--ephemeral", "--drain-grace=1h", NULL});
    harness_binary("drey", drey_bin, sizeof drey_bin);
    snprintf(addr_flag, sizeof addr_flag, "--addr=%s", env.server.addr);
}

TestSuite(cli_ephemeral, .init = up_ephemeral, .fini = down, .timeout = 60);

Test(cli_ephemeral, snapshot_is_refused_and_a_draining_node_is_not_ready) {
    char *out, *err;
    cr_assert_eq(DREY(&out, &err, "snapshot"), 1);
    cr_assert_str_eq(out, "");
    cr_assert_not_null(strstr(err, "FAILED_PRECONDITION"), "%s", err);
    free(out);
    free(err);
    cr_assert_eq(DREY(&out, &err, "ready", "-o", "json"), 0, "%s", err);
    cr_assert_not_null(strstr(out, "\"recovery\":{\"state\":\"ephemeral\","), "%s", out);
    free(out);
    free(err);

    harness_signal(&env.server, SIGTERM);
    int64_t deadline = harness_wall_ms() + HARNESS_DEADLINE_MS;
    int rc;
    while ((rc = DREY(&out, &err, "ready", "--output=json")) == 0 && harness_wall_ms() < deadline) {
        free(out);
        free(err);
    }
    cr_assert_eq(rc, 3, "still ready after SIGTERM: %s", out);
    cr_assert_not_null(strstr(out, "{\"ready\":false,"), "%s", out);
    free(out);
    free(err);
}

Test(cli, scan_clear_and_stats) {
    EXPECT(0, NULL, "--cache=sc", "set", "a/1", "one");
    EXPECT(0, NULL, "--cache=sc", "set", "a/2", "two");
    EXPECT(0, NULL, "--cache=sc", "set", "b/1", "three");
    EXPECT(0, NULL, "--cache=other", "set", "x", "y");
    char *out, *err;
    cr_assert_eq(DREY(&out, &err, "--cache=sc", "scan", "a/", "--values"), 0, "%s", err);
    /* hash order: check both lines, whatever their order */
    /* key, version, expiry (none: empty), value */
    cr_assert(strstr(out, "a/1\t") != NULL && strstr(out, "\t\tone\n") != NULL, "%s", out);
    cr_assert(strstr(out, "a/2\t") != NULL && strstr(out, "\t\ttwo\n") != NULL, "%s", out);
    cr_assert(strstr(out, "b/1") == NULL, "%s", out);
    int lines = 0;
    for (const char *p = out; *p; p++)
        lines += *p == '\n';
    cr_assert_eq(lines, 2, "%s", out);
    free(out);
    free(err);
    cr_assert_eq(DREY(&out, &err, "--cache=sc", "stats"), 0, "%s", err);
    cr_assert_eq(strncmp(out, "sc\t3\t", strlen("sc\t3\t")), 0, "%s", out);
    free(out);
    free(err);
    cr_assert_eq(DREY(&out, &err, "stats"), 0, "%s", err);
    cr_assert(strstr(out, "other\t1\t") != NULL && strstr(out, "sc\t3\t") != NULL, "%s", out);
    free(out);
    free(err);
    EXPECT(0, "sc\ttrue\n", "--cache=sc", "clear");
    EXPECT(0, "", "--cache=sc", "scan");
    EXPECT(0, NULL, "--cache=sc", "stats");
    cr_assert_eq(DREY(&out, &err, "--cache=sc", "stats"), 0, "%s", err);
    cr_assert_eq(strncmp(out, "sc\t0\t0\t", strlen("sc\t0\t0\t")), 0, "%s", out);
    free(out);
    free(err);
    EXPECT(0, "y\n", "--cache=other", "get", "x");
    /* --values belongs to scan only */
    EXPECT(2, "", "get", "x", "--values");
}
