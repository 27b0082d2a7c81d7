/*
 * Unit tests for src/config/config.c: the option table, its parser (flags,
 * DREY_* variables, units, ranges) and the help outputs generated from it.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/config.h"

/* The options this file knows, in table order. The table may grow (the
 * help and markdown tests compare the two outputs with each other and only
 * require these to be among them, in this order). */
static const char *const option_names[] = {
    "listen",
    "workers",
    "max-recv-message-bytes",
    "max-cache-name-bytes",
    "max-key-bytes",
    "max-value-bytes",
    "max-batch",
    "drain-grace",
    "shutdown-timeout",
    "expiry-sweep-interval",
    "log-level",
    "data-dir",
    "ephemeral",
    "fsync",
    "segment-bytes",
    "journal-max-bytes",
    "batch-wait",
    "batch-max-bytes",
    "snapshot-every-bytes",
    "snapshot-every",
    "retain-snapshots",
    "idempotency-retention",
};
#define N_OPTIONS (sizeof option_names / sizeof option_names[0])

/* --- harness -------------------------------------------------------------- */

typedef struct run {
    drey_config cfg;
    bool ok;
    drey_config_help help;
    char *err; /* everything written to the error stream */
    size_t err_len;
} run;

/* Parses defaults + envp + argv ("dreyd" is prepended as argv[0]).
 * Both lists end with NULL. */
static void parse(run *r, const char *const *args, const char *const *env) {
    char *argv[32];
    int argc = 0;
    argv[argc++] = "dreyd";
    for (; args != NULL && *args != NULL; args++)
        argv[argc++] = (char *)*args;
    argv[argc] = NULL;
    FILE *err = open_memstream(&r->err, &r->err_len);
    cr_assert_not_null(err);
    drey_config_defaults(&r->cfg);
    r->ok = drey_config_parse(&r->cfg, argc, argv, 1, (char **)env, err, &r->help);
    fclose(err);
}

static void done(run *r) {
    drey_config_free(&r->cfg);
    free(r->err);
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define NO_ARGS ((const char *const[]){NULL})

/* Parses and expects success. */
static void parse_ok(run *r, const char *const *args, const char *const *env) {
    parse(r, args, env);
    cr_assert(r->ok, "rejected: %s", r->err);
    cr_assert(eq(sz, r->err_len, 0), "wrote an error on success: %s", r->err);
}

/* Parses and expects failure with a message containing each needle. */
static void parse_fails(const char *const *args, const char *const *env, const char *needle1, const char *needle2) {
    run r;
    parse(&r, args, env);
    cr_assert(not(r.ok), "accepted %s", args[0] != NULL ? args[0] : env[0]);
    cr_assert(gt(sz, r.err_len, 0), "no message");
    cr_assert(eq(chr, r.err[r.err_len - 1], '\n'), "the message is one line: %s", r.err);
    cr_assert_not_null(strstr(r.err, needle1), "\"%s\" not in: %s", needle1, r.err);
    if (needle2 != NULL)
        cr_assert_not_null(strstr(r.err, needle2), "\"%s\" not in: %s", needle2, r.err);
    done(&r);
}

/* Every field of a and b is equal. */
static void assert_same_config(const drey_config *a, const drey_config *b, const char *context) {
    cr_assert(eq(str, a->listen, b->listen), "%s", context);
    cr_assert(eq(str, a->log_level, b->log_level), "%s", context);
    cr_assert(eq(str, a->data_dir, b->data_dir), "%s", context);
    cr_assert(eq(str, a->fsync, b->fsync), "%s", context);
    cr_assert(eq(int, a->ephemeral, b->ephemeral), "%s", context);
    cr_assert(eq(i64, a->workers, b->workers), "%s", context);
    cr_assert(eq(i64, a->max_recv_message_bytes, b->max_recv_message_bytes), "%s", context);
    cr_assert(eq(i64, a->max_cache_name_bytes, b->max_cache_name_bytes), "%s", context);
    cr_assert(eq(i64, a->max_key_bytes, b->max_key_bytes), "%s", context);
    cr_assert(eq(i64, a->max_value_bytes, b->max_value_bytes), "%s", context);
    cr_assert(eq(i64, a->max_batch, b->max_batch), "%s", context);
    cr_assert(eq(i64, a->drain_grace_ms, b->drain_grace_ms), "%s", context);
    cr_assert(eq(i64, a->shutdown_timeout_ms, b->shutdown_timeout_ms), "%s", context);
    cr_assert(eq(i64, a->expiry_sweep_interval_ms, b->expiry_sweep_interval_ms), "%s", context);
    cr_assert(eq(i64, a->segment_bytes, b->segment_bytes), "%s", context);
    cr_assert(eq(i64, a->journal_max_bytes, b->journal_max_bytes), "%s", context);
    cr_assert(eq(i64, a->batch_wait_ms, b->batch_wait_ms), "%s", context);
    cr_assert(eq(i64, a->batch_max_bytes, b->batch_max_bytes), "%s", context);
    cr_assert(eq(i64, a->snapshot_every_bytes, b->snapshot_every_bytes), "%s", context);
    cr_assert(eq(i64, a->snapshot_every_ms, b->snapshot_every_ms), "%s", context);
    cr_assert(eq(i64, a->retain_snapshots, b->retain_snapshots), "%s", context);
    cr_assert(eq(i64, a->idempotency_retention_ms, b->idempotency_retention_ms), "%s", context);
}

/* --- defaults ------------------------------------------------------------- */

Test(config, defaults) {
    drey_config c;
    drey_config_defaults(&c);
    cr_assert(eq(str, c.listen, "127.0.0.1:50051"));
    cr_assert(eq(i64, c.workers, 0));
    cr_assert(eq(i64, c.max_recv_message_bytes, 8 << 20));
    cr_assert(eq(i64, c.max_cache_name_bytes, 128));
    cr_assert(eq(i64, c.max_key_bytes, 1024));
    cr_assert(eq(i64, c.max_value_bytes, 4 << 20));
    cr_assert(eq(i64, c.max_batch, 1000));
    cr_assert(eq(i64, c.drain_grace_ms, 5000));
    cr_assert(eq(i64, c.shutdown_timeout_ms, 10000));
    cr_assert(eq(i64, c.expiry_sweep_interval_ms, 100));
    cr_assert(eq(str, c.log_level, "info"));
    cr_assert(eq(str, c.data_dir, "./drey-data"));
    cr_assert(not(c.ephemeral));
    cr_assert(eq(str, c.fsync, "always"));
    cr_assert(eq(i64, c.segment_bytes, 64 << 20));
    cr_assert(eq(i64, c.journal_max_bytes, DREY_CONFIG_AUTO));
    cr_assert(eq(i64, c.batch_wait_ms, 0));
    cr_assert(eq(i64, c.batch_max_bytes, 16 << 20));
    cr_assert(eq(i64, c.snapshot_every_bytes, 256 << 20));
    cr_assert(eq(i64, c.snapshot_every_ms, 3600000));
    cr_assert(eq(i64, c.retain_snapshots, 2));
    cr_assert(eq(i64, c.idempotency_retention_ms, 15 * 60000));
    drey_config_free(&c);
    cr_assert_null(c.listen);
    cr_assert_null(c.log_level);
    cr_assert_null(c.data_dir);
    cr_assert_null(c.fsync);
    drey_config_free(&c); /* twice is harmless */
}

Test(config, nothing_given_keeps_the_defaults) {
    run r;
    parse_ok(&r, NO_ARGS, NULL);
    drey_config d;
    drey_config_defaults(&d);
    assert_same_config(&r.cfg, &d, "no arguments");
    cr_assert(eq(int, r.help, DREY_CONFIG_HELP_NONE));
    drey_config_free(&d);
    done(&r);
}

/* --- flags ---------------------------------------------------------------- */

Test(config, flag_with_equals) {
    run r;
    parse_ok(&r,
             ARGS("--listen=0.0.0.0:7000", "--workers=4", "--max-recv-message-bytes=16MiB",
                  "--max-cache-name-bytes=64", "--max-key-bytes=2048", "--max-value-bytes=1k", "--max-batch=50",
                  "--drain-grace=250ms", "--shutdown-timeout=2m", "--expiry-sweep-interval=1s", "--log-level=debug"),
             NULL);
    cr_assert(eq(str, r.cfg.listen, "0.0.0.0:7000"));
    cr_assert(eq(i64, r.cfg.workers, 4));
    cr_assert(eq(i64, r.cfg.max_recv_message_bytes, 16 << 20));
    cr_assert(eq(i64, r.cfg.max_cache_name_bytes, 64));
    cr_assert(eq(i64, r.cfg.max_key_bytes, 2048));
    cr_assert(eq(i64, r.cfg.max_value_bytes, 1000));
    cr_assert(eq(i64, r.cfg.max_batch, 50));
    cr_assert(eq(i64, r.cfg.drain_grace_ms, 250));
    cr_assert(eq(i64, r.cfg.shutdown_timeout_ms, 120000));
    cr_assert(eq(i64, r.cfg.expiry_sweep_interval_ms, 1000));
    cr_assert(eq(str, r.cfg.log_level, "debug"));
    done(&r);
}

Test(config, flag_with_separate_value) {
    run r;
    parse_ok(&r, ARGS("--listen", "[::1]:0", "--max-key-bytes", "77", "--drain-grace", "5s", "--max-value-bytes", "8MB"),
             NULL);
    cr_assert(eq(str, r.cfg.listen, "[::1]:0"));
    cr_assert(eq(i64, r.cfg.max_key_bytes, 77));
    cr_assert(eq(i64, r.cfg.drain_grace_ms, 5000));
    cr_assert(eq(i64, r.cfg.max_value_bytes, 8000000));
    done(&r);
}

/* The value after "=" is taken verbatim, even when it contains '=' or
 * starts with "--". */
Test(config, flag_values_are_verbatim) {
    run r;
    parse_ok(&r, ARGS("--cluster-prefix=a=b", "--log-level", "--workers=3"), NULL);
    cr_assert(eq(str, r.cfg.cluster_prefix, "a=b"));
    cr_assert(eq(str, r.cfg.log_level, "--workers=3"), "the separate value is the next argument, whatever it is");
    cr_assert(eq(i64, r.cfg.workers, 0));
    done(&r);
}

Test(config, a_repeated_flag_takes_the_last_value) {
    run r;
    parse_ok(&r, ARGS("--max-batch=5", "--listen=x:1", "--max-batch", "6", "--listen=y:2"), NULL);
    cr_assert(eq(i64, r.cfg.max_batch, 6));
    cr_assert(eq(str, r.cfg.listen, "y:2"));
    done(&r);
}

/* gRPC takes "localhost" alone as port 443; the ops listener would fail
 * later, or not at all. */
Test(config, an_address_without_a_port_is_refused) {
    parse_fails(ARGS("--listen=localhost"), NULL, "--listen", "expected host:port");
    parse_fails(ARGS("--ops-listen=127.0.0.1"), NULL, "--ops-listen", "\"127.0.0.1\"");
    parse_fails(ARGS("--internal-listen=127.0.0.1:65536"), NULL, "--internal-listen", "expected host:port");
    parse_fails(ARGS("--advertise=::1:50051"), NULL, "--advertise", "expected host:port");
    parse_fails(NO_ARGS, ARGS("DREY_LISTEN=10.0.0.1:port"), "DREY_LISTEN", "expected host:port");
    run r;
    parse_ok(&r, ARGS("--listen=[::1]:50051", "--ops-listen=", "--internal-listen=0.0.0.0:0",
                      "--internal-advertise=n1.drey.svc:50052", "--advertise=unix:/run/drey.sock"),
             NULL);
    cr_assert(eq(str, r.cfg.ops_listen, ""), "empty: the ops listener is off");
    done(&r);
}

Test(config, arguments_before_first_are_skipped) {
    char *argv[] = {"dreyd", "serve", "--max-batch=9", NULL};
    drey_config c;
    drey_config_defaults(&c);
    drey_config_help help;
    cr_assert(drey_config_parse(&c, 3, argv, 2, NULL, stderr, &help));
    cr_assert(eq(i64, c.max_batch, 9));
    drey_config_free(&c);
}

/* --- environment ---------------------------------------------------------- */

Test(config, environment_variables) {
    run r;
    parse_ok(&r, NO_ARGS,
             ARGS("PATH=/usr/bin", "DREY_MAX_KEY_BYTES=77", "DREY_LOG_LEVEL=warn", "DREY_DRAIN_GRACE=2m",
                  "DREY_MAX_VALUE_BYTES=64k", "DREY_EXPIRY_SWEEP_INTERVAL=250ms", "DREY_LISTEN=10.0.0.1:9"));
    cr_assert(eq(i64, r.cfg.max_key_bytes, 77));
    cr_assert(eq(str, r.cfg.log_level, "warn"));
    cr_assert(eq(i64, r.cfg.drain_grace_ms, 120000));
    cr_assert(eq(i64, r.cfg.max_value_bytes, 64000));
    cr_assert(eq(i64, r.cfg.expiry_sweep_interval_ms, 250));
    cr_assert(eq(str, r.cfg.listen, "10.0.0.1:9"));
    done(&r);
}

/* Only the exact variable name counts; lookalikes are ignored. */
Test(config, lookalike_variables_are_ignored) {
    run r;
    parse_ok(&r, NO_ARGS,
             ARGS("DREY_MAX_KEY_BYTES_X=1", "DREY_MAX_KEY=2", "XDREY_MAX_KEY_BYTES=3", "DREY_MAX_KEY_BYTES",
                  "drey_max_key_bytes=4", "DREY_MAX-KEY-BYTES=5", "DREY_UNKNOWN=6"));
    cr_assert(eq(i64, r.cfg.max_key_bytes, 1024));
    done(&r);
}

Test(config, a_flag_beats_the_environment) {
    run r;
    parse_ok(&r, ARGS("--max-key-bytes=88", "--log-level", "error"),
             ARGS("DREY_MAX_KEY_BYTES=77", "DREY_LOG_LEVEL=debug", "DREY_MAX_BATCH=12"));
    cr_assert(eq(i64, r.cfg.max_key_bytes, 88));
    cr_assert(eq(str, r.cfg.log_level, "error"));
    cr_assert(eq(i64, r.cfg.max_batch, 12), "a variable without a flag still applies");
    done(&r);
}

Test(config, a_bad_variable_is_named_in_the_error) {
    parse_fails(NO_ARGS, ARGS("DREY_WORKERS=many"), "DREY_WORKERS", "expected int");
    parse_fails(NO_ARGS, ARGS("DREY_MAX_KEY_BYTES=0"), "DREY_MAX_KEY_BYTES", "between 1 and 65535");
    parse_fails(NO_ARGS, ARGS("DREY_DRAIN_GRACE=5x"), "DREY_DRAIN_GRACE", "expected duration");
}

/* --- errors --------------------------------------------------------------- */

Test(config, unknown_options) {
    parse_fails(ARGS("--nope"), NULL, "unknown option --nope", "--help");
    parse_fails(ARGS("--nope=3"), NULL, "unknown option --nope;", NULL);
    parse_fails(ARGS("--max-key=3"), NULL, "unknown option --max-key;", NULL);     /* no prefix matching */
    parse_fails(ARGS("--max-key-bytesX=3"), NULL, "unknown option", NULL);
    parse_fails(ARGS("--Max-Key-Bytes=3"), NULL, "unknown option", NULL);          /* case matters */
    parse_fails(ARGS("--=3"), NULL, "unknown option", NULL);
    parse_fails(ARGS("--"), NULL, "unknown option", NULL);
}

Test(config, arguments_that_are_not_options) {
    parse_fails(ARGS("serve"), NULL, "unexpected argument", NULL);
    parse_fails(ARGS("-w"), NULL, "unexpected argument", NULL);
    parse_fails(ARGS("--workers=2", "extra"), NULL, "unexpected argument", NULL);
}

Test(config, a_flag_without_its_value) {
    parse_fails(ARGS("--max-key-bytes"), NULL, "--max-key-bytes needs a value", NULL);
    parse_fails(ARGS("--workers=2", "--listen"), NULL, "--listen needs a value", NULL);
}

Test(config, values_that_do_not_parse) {
    parse_fails(ARGS("--workers=abc"), NULL, "--workers: expected int", NULL);
    parse_fails(ARGS("--workers=12abc"), NULL, "--workers", NULL);
    parse_fails(ARGS("--workers="), NULL, "--workers", NULL);
    parse_fails(ARGS("--workers=1.5"), NULL, "--workers", NULL);
    parse_fails(ARGS("--workers=0x10"), NULL, "--workers", NULL);
    parse_fails(ARGS("--workers=99999999999999999999"), NULL, "--workers", NULL);
    parse_fails(ARGS("--max-value-bytes=4XB"), NULL, "--max-value-bytes: expected bytes", NULL);
    parse_fails(ARGS("--max-value-bytes=MiB"), NULL, "--max-value-bytes", NULL);
    parse_fails(ARGS("--max-value-bytes=1.5MiB"), NULL, "--max-value-bytes", NULL);
    parse_fails(ARGS("--drain-grace=5d"), NULL, "--drain-grace: expected duration", NULL);
    parse_fails(ARGS("--drain-grace=1.5s"), NULL, "--drain-grace", NULL);
    parse_fails(ARGS("--drain-grace=-1s"), NULL, "--drain-grace", NULL);
    parse_fails(ARGS("--drain-grace="), NULL, "--drain-grace", NULL);
}

/* --journal-max-bytes: not given (auto, derived from the file system) is not
 * 0 (no cap), and the word is only a word for the option that has it. */
Test(config, journal_max_bytes_tells_auto_from_zero) {
    run r;
    parse_ok(&r, NO_ARGS, NULL);
    cr_assert(eq(i64, r.cfg.journal_max_bytes, DREY_CONFIG_AUTO));
    cr_assert(lt(i64, DREY_CONFIG_AUTO, 0), "auto must not look like a cap or like 0");
    done(&r);
    parse_ok(&r, ARGS("--journal-max-bytes=0"), NULL);
    cr_assert(eq(i64, r.cfg.journal_max_bytes, 0));
    done(&r);
    parse_ok(&r, ARGS("--journal-max-bytes=0", "--journal-max-bytes=auto"), NULL);
    cr_assert(eq(i64, r.cfg.journal_max_bytes, DREY_CONFIG_AUTO));
    done(&r);
    parse_ok(&r, NO_ARGS, ARGS("DREY_JOURNAL_MAX_BYTES=64MiB"));
    cr_assert(eq(i64, r.cfg.journal_max_bytes, 64 << 20));
    done(&r);
    parse_ok(&r, ARGS("--journal-max-bytes=auto"), ARGS("DREY_JOURNAL_MAX_BYTES=0"));
    cr_assert(eq(i64, r.cfg.journal_max_bytes, DREY_CONFIG_AUTO));
    done(&r);
    parse_fails(ARGS("--journal-max-bytes=-1"), NULL, "--journal-max-bytes: expected bytes or auto", NULL);
    parse_fails(ARGS("--journal-max-bytes=AUTO"), NULL, "--journal-max-bytes: expected bytes or auto", NULL);
    parse_fails(ARGS("--journal-max-bytes="), NULL, "--journal-max-bytes", NULL);
    parse_fails(ARGS("--segment-bytes=auto"), NULL, "--segment-bytes: expected bytes, e.g. 64MiB", NULL);
    parse_fails(ARGS("--memory-limit=auto"), NULL, "--memory-limit: expected bytes", NULL);
}

/* A rejected value leaves the field as it was. */
Test(config, a_rejected_value_changes_nothing) {
    run r;
    parse(&r, ARGS("--max-key-bytes=99", "--max-key-bytes=0"), NULL);
    cr_assert(not(r.ok));
    cr_assert(eq(i64, r.cfg.max_key_bytes, 99));
    done(&r);
}

/* --- ranges --------------------------------------------------------------- */

typedef struct range_case {
    const char *arg;
    bool ok;
} range_case;

Test(config, range_limits_are_inclusive) {
    static const range_case cases[] = {
        {"--workers=0", true},
        {"--workers=256", true},
        {"--workers=257", false},
        {"--workers=-1", false},
        {"--max-recv-message-bytes=1024", true},
        {"--max-recv-message-bytes=1KiB", true},
        {"--max-recv-message-bytes=1023", false},
        {"--max-recv-message-bytes=1k", false}, /* 1000 */
        {"--max-recv-message-bytes=2147483647", true},
        {"--max-recv-message-bytes=2GiB", false},
        {"--max-cache-name-bytes=1", true},
        {"--max-cache-name-bytes=255", true},
        {"--max-cache-name-bytes=0", false},
        {"--max-cache-name-bytes=256", false},
        {"--max-key-bytes=1", true},
        {"--max-key-bytes=65535", true},
        {"--max-key-bytes=0", false},
        {"--max-key-bytes=65536", false},
        {"--max-value-bytes=1", true},
        {"--max-value-bytes=64MiB", true},
        {"--max-value-bytes=67108865", false},
        {"--max-value-bytes=0", false},
        {"--max-batch=1", true},
        {"--max-batch=100000", true},
        {"--max-batch=100001", false},
        {"--max-batch=0", false},
        {"--drain-grace=0", true},
        {"--drain-grace=1h", true},
        {"--drain-grace=61m", false},
        {"--shutdown-timeout=3600000", true},
        {"--shutdown-timeout=3600001", false},
        {"--expiry-sweep-interval=1ms", true},
        {"--expiry-sweep-interval=0", false},
        {"--expiry-sweep-interval=1m", true},
        {"--expiry-sweep-interval=60001ms", false},
        {"--segment-bytes=64KiB", true},
        {"--segment-bytes=65535", false},
        {"--batch-wait=0", true},
        {"--batch-wait=1s", true},
        {"--batch-wait=1001ms", false},
        {"--batch-max-bytes=4096", true},
        {"--batch-max-bytes=4095", false},
        {"--snapshot-every-bytes=0", true},
        {"--snapshot-every=0", true},
        {"--retain-snapshots=1", true},
        {"--retain-snapshots=100", true},
        {"--retain-snapshots=0", false},
        {"--retain-snapshots=101", false},
        {"--idempotency-retention=1s", true},
        {"--idempotency-retention=999", false},
        {"--idempotency-retention=168h", true},
        {"--idempotency-retention=169h", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run r;
        parse(&r, ARGS(cases[i].arg), NULL);
        cr_assert(eq(int, r.ok, cases[i].ok), "%s: %s", cases[i].arg, r.err);
        if (!cases[i].ok)
            cr_assert_not_null(strstr(r.err, "must be between"), "%s: %s", cases[i].arg, r.err);
        done(&r);
    }
}

Test(config, range_error_names_both_bounds) {
    parse_fails(ARGS("--max-batch=100001"), NULL, "--max-batch: must be between 1 and 100000", NULL);
    parse_fails(ARGS("--drain-grace=2h"), NULL, "--drain-grace: must be between 0 and 3600000", NULL);
}

/* --- units ---------------------------------------------------------------- */

typedef struct unit_case {
    const char *text;
    bool ok;
    int64_t value;
} unit_case;

/* Decimal (k, MB) and binary (KiB, Mi) multiples, case-insensitive. */
Test(config, byte_units) {
    static const unit_case cases[] = {
        {"0", true, 0},
        {"1024", true, 1024},
        {"5b", true, 5},
        {"64k", true, 64000},
        {"64K", true, 64000},
        {"64kb", true, 64000},
        {"64KiB", true, 65536},
        {"64ki", true, 65536},
        {"4MiB", true, 4 << 20},
        {"4mib", true, 4 << 20},
        {"4Mi", true, 4 << 20},
        {"8MB", true, 8000000},
        {"8m", true, 8000000},
        {"1G", true, 1000000000},
        {"1gb", true, 1000000000},
        {"3GiB", true, 3LL << 30},
        {"9223372036854775807", true, INT64_MAX},
        {"", false, 0},
        {"k", false, 0},
        {"4 MiB", false, 0},
        {"4TiB", false, 0},
        {"4MiBs", false, 0},
        {"-1", false, 0},
        {"-1k", false, 0},
        {"1.5MiB", false, 0},
        {"9223372036854775807k", false, 0}, /* overflows */
        {"9223372036854775808", false, 0},
        {"9000000000G", true, 9000000000000000000LL},
        {"10000000000G", false, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t v = -12345;
        bool ok = drey_config_parse_bytes(cases[i].text, &v);
        cr_assert(eq(int, ok, cases[i].ok), "\"%s\"", cases[i].text);
        cr_assert(eq(i64, v, cases[i].ok ? cases[i].value : -12345), "\"%s\"", cases[i].text);
    }
}

/* ms (the default unit), s, m, h; the suffix is case-sensitive (M is not m). */
Test(config, duration_units) {
    static const unit_case cases[] = {
        {"0", true, 0},
        {"100", true, 100},
        {"250ms", true, 250},
        {"5s", true, 5000},
        {"2m", true, 120000},
        {"1h", true, 3600000},
        {"0s", true, 0},
        {"", false, 0},
        {"s", false, 0},
        {"5S", false, 0},
        {"2M", false, 0},
        {"1d", false, 0},
        {"5sec", false, 0},
        {"5 s", false, 0},
        {"1.5s", false, 0},
        {"-1s", false, 0},
        {"1us", false, 0},
        {"9223372036854775807h", false, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t v = -12345;
        bool ok = drey_config_parse_duration_ms(cases[i].text, &v);
        cr_assert(eq(int, ok, cases[i].ok), "\"%s\"", cases[i].text);
        cr_assert(eq(i64, v, cases[i].ok ? cases[i].value : -12345), "\"%s\"", cases[i].text);
    }
}

/* --- booleans ------------------------------------------------------------- */

/* A bool flag alone means true; with "=" it takes true/1/yes or
 * false/0/no, as does its variable. */
Test(config, bool_options) {
    run r;
    parse_ok(&r, ARGS("--ephemeral"), NULL);
    cr_assert(r.cfg.ephemeral);
    done(&r);

    static const char *const yes[] = {"true", "1", "yes"}, *const no[] = {"false", "0", "no"};
    for (size_t i = 0; i < 3; i++) {
        char flag[32], var[32];
        snprintf(flag, sizeof flag, "--ephemeral=%s", yes[i]);
        parse_ok(&r, ARGS(flag), NULL);
        cr_assert(r.cfg.ephemeral, "%s", flag);
        done(&r);
        snprintf(var, sizeof var, "DREY_EPHEMERAL=%s", yes[i]);
        parse_ok(&r, NO_ARGS, ARGS(var));
        cr_assert(r.cfg.ephemeral, "%s", var);
        done(&r);

        snprintf(flag, sizeof flag, "--ephemeral=%s", no[i]);
        parse_ok(&r, ARGS(flag), ARGS("DREY_EPHEMERAL=true"));
        cr_assert(not(r.cfg.ephemeral), "%s beats the variable", flag);
        done(&r);
    }

    parse_fails(ARGS("--ephemeral=maybe"), NULL, "--ephemeral: expected true or false", NULL);
    parse_fails(ARGS("--ephemeral=TRUE"), NULL, "--ephemeral", NULL);
    parse_fails(ARGS("--ephemeral="), NULL, "--ephemeral", NULL);
    parse_fails(NO_ARGS, ARGS("DREY_EPHEMERAL=on"), "DREY_EPHEMERAL: expected true or false", NULL);
    /* A bool flag never takes the next argument as its value. */
    parse_fails(ARGS("--ephemeral", "false"), NULL, "unexpected argument", NULL);
}

/* --- help ----------------------------------------------------------------- */

Test(config, help_flags) {
    static const struct {
        const char *arg;
        drey_config_help want;
    } cases[] = {
        {"--help", DREY_CONFIG_HELP_TEXT},
        {"-h", DREY_CONFIG_HELP_TEXT},
        {"--help-markdown", DREY_CONFIG_HELP_MARKDOWN},
        {"--help-errors", DREY_CONFIG_HELP_ERRORS},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        run r;
        parse_ok(&r, ARGS("--max-batch=3", cases[i].arg), NULL);
        cr_assert(eq(int, r.help, cases[i].want), "%s", cases[i].arg);
        cr_assert(eq(i64, r.cfg.max_batch, 3), "other options still apply");
        done(&r);
    }

    /* The last help flag decides. */
    run r;
    parse_ok(&r, ARGS("--help-markdown", "--help"), NULL);
    cr_assert(eq(int, r.help, DREY_CONFIG_HELP_TEXT));
    done(&r);
    parse_ok(&r, ARGS("--help", "--help-markdown"), NULL);
    cr_assert(eq(int, r.help, DREY_CONFIG_HELP_MARKDOWN));
    done(&r);

    /* A help flag does not excuse a bad option. */
    parse_fails(ARGS("--help", "--nope"), NULL, "unknown option --nope", NULL);
    parse_fails(ARGS("--help-markdown=yes"), NULL, "unknown option --help-markdown", NULL);

    /* The output is reset at every call. */
    drey_config c;
    drey_config_defaults(&c);
    drey_config_help help = DREY_CONFIG_HELP_ERRORS;
    char *argv[] = {"dreyd", NULL};
    cr_assert(drey_config_parse(&c, 1, argv, 1, NULL, stderr, &help));
    cr_assert(eq(int, help, DREY_CONFIG_HELP_NONE));
    drey_config_free(&c);
}

static char *capture_output(void (*print)(FILE *)) {
    char *buf;
    size_t len;
    FILE *f = open_memstream(&buf, &len);
    print(f);
    fclose(f);
    return buf;
}

/* One option as --help lists it. */
typedef struct help_entry {
    char name[64], type[16], var[80], fallback[64];
} help_entry;

/* Parses --help's "  --name=<type>  (DREY_NAME, default X)" lines. */
static size_t help_entries(help_entry *out, size_t max) {
    char *help = capture_output(drey_config_print_help);
    size_t n = 0;
    char *save;
    for (char *line = strtok_r(help, "\n", &save); line != NULL; line = strtok_r(NULL, "\n", &save)) {
        if (strncmp(line, "  --", 4) != 0)
            continue;
        cr_assert(lt(sz, n, max));
        help_entry *e = &out[n];
        char *eq = strstr(line, "=<"), *gt = strstr(line, ">  ("), *comma = strstr(line, ", default ");
        cr_assert(eq != NULL && gt != NULL && comma != NULL && line[strlen(line) - 1] == ')', "line: %s", line);
        snprintf(e->name, sizeof e->name, "%.*s", (int)(eq - line - 4), line + 4);
        snprintf(e->type, sizeof e->type, "%.*s", (int)(gt - eq - 2), eq + 2);
        snprintf(e->var, sizeof e->var, "%.*s", (int)(comma - gt - 4), gt + 4);
        snprintf(e->fallback, sizeof e->fallback, "%.*s", (int)(strlen(comma) - 10 - 1), comma + 10);
        n++;
    }
    free(help);
    return n;
}

/* DREY_ + the name in capitals with '-' as '_'. */
static void var_of(const char *name, char *out, size_t cap) {
    size_t j = (size_t)snprintf(out, cap, "DREY_");
    for (const char *p = name; *p != '\0' && j + 1 < cap; p++)
        out[j++] = *p == '-' ? '_' : (*p >= 'a' && *p <= 'z') ? (char)(*p - 32) : *p;
    out[j] = '\0';
}

#define MAX_HELP 256

Test(config, help_lists_every_option_with_its_variable_and_default) {
    char *help = capture_output(drey_config_print_help);
    cr_assert_not_null(strstr(help, "usage: dreyd"));
    static const char *const lines[] = {
        "  --listen=<host:port>  (DREY_LISTEN, default 127.0.0.1:50051)\n",
        "  --max-value-bytes=<bytes>  (DREY_MAX_VALUE_BYTES, default 4MiB)\n",
        "  --drain-grace=<duration>  (DREY_DRAIN_GRACE, default 5s)\n",
        "  --workers=<int>  (DREY_WORKERS, default 0)\n",
        "  --expiry-sweep-interval=<duration>  (DREY_EXPIRY_SWEEP_INTERVAL, default 100ms)\n",
        "  --ephemeral=<bool>  (DREY_EPHEMERAL, default false)\n",
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
        cr_assert_not_null(strstr(help, lines[i]), "missing: %s", lines[i]);
    free(help);

    static help_entry e[MAX_HELP];
    size_t n = help_entries(e, MAX_HELP);
    size_t known = 0;
    for (size_t i = 0; i < n; i++) {
        char var[80];
        var_of(e[i].name, var, sizeof var);
        cr_assert(eq(str, e[i].var, var), "--%s", e[i].name);
        for (size_t j = 0; j < i; j++)
            cr_assert(ne(str, e[i].name, e[j].name), "--%s listed twice", e[i].name);
        if (known < N_OPTIONS && strcmp(e[i].name, option_names[known]) == 0)
            known++;
    }
    cr_assert(eq(sz, known, N_OPTIONS), "--%s is missing or out of order", option_names[known]);
}

/* Splits a markdown row "| a | b |" into trimmed cells; returns the count. */
static size_t cells(char *row, char **out, size_t max) {
    size_t n = 0;
    cr_assert(eq(chr, row[0], '|'), "row: %s", row);
    char *p = row + 1;
    for (char *bar; (bar = strchr(p, '|')) != NULL; p = bar + 1) {
        *bar = '\0';
        while (*p == ' ')
            p++;
        char *e = bar;
        while (e > p && e[-1] == ' ')
            *--e = '\0';
        if (n < max)
            out[n] = p;
        n++;
    }
    cr_assert(eq(str, p, ""), "text after the last '|': %s", p);
    return n;
}

/* The options table of docs/operations.md: a header, a separator, then one row per option, in the
 * order and with the names, variables, types and defaults --help gives;
 * each row's default, given back as the flag or as the variable, parses
 * and (for the options this file knows) reproduces the default
 * configuration. */
Test(config, markdown_has_one_row_per_option) {
    static help_entry e[MAX_HELP];
    size_t n = help_entries(e, MAX_HELP);
    cr_assert(ge(sz, n, N_OPTIONS));

    char *md = capture_output(drey_config_print_markdown);
    char *save, *line = strtok_r(md, "\n", &save);
    cr_assert(eq(str, line, "| Flag | Environment | Type | Default | Meaning |"));
    line = strtok_r(NULL, "\n", &save);
    cr_assert(eq(str, line, "|---|---|---|---|---|"));

    drey_config defaults;
    drey_config_defaults(&defaults);
    size_t rows = 0;
    while ((line = strtok_r(NULL, "\n", &save)) != NULL) {
        char *c[8];
        cr_assert(eq(sz, cells(line, c, 8), 5), "row %zu has a '|' too many or too few", rows);
        cr_assert(lt(sz, rows, n), "more rows than options");
        const help_entry *h = &e[rows];
        char want[512];
        snprintf(want, sizeof want, "`--%.63s`", h->name);
        cr_assert(eq(str, c[0], want));
        snprintf(want, sizeof want, "`%.79s`", h->var);
        cr_assert(eq(str, c[1], want));
        cr_assert(eq(str, c[2], (char *)h->type));
        snprintf(want, sizeof want, "`%.63s`", h->fallback);
        cr_assert(eq(str, c[3], want), "default of --%s", h->name);
        cr_assert(gt(sz, strlen(c[4]), 10), "meaning of --%s", h->name);
        cr_assert(eq(chr, c[4][strlen(c[4]) - 1], '.'), "meaning is a sentence: %s", c[4]);

        char flag[512], var[512];
        snprintf(flag, sizeof flag, "--%.63s=%.63s", h->name, h->fallback);
        snprintf(var, sizeof var, "%.79s=%.63s", h->var, h->fallback);
        for (int how = 0; how < 2; how++) {
            run r;
            if (how == 0)
                parse_ok(&r, ARGS(flag), NULL);
            else
                parse_ok(&r, NO_ARGS, ARGS(var));
            assert_same_config(&r.cfg, &defaults, how == 0 ? flag : var);
            done(&r);
        }
        rows++;
    }
    cr_assert(eq(sz, rows, n), "one row per option");
    drey_config_free(&defaults);
    free(md);
}

/* Anonymous callers are allowed only where these say loopback. A name is
 * never resolved, so one that starts with "127." is not loopback (found by
 * tests/fuzz, regressions/config/name-starting-127-is-not-loopback). */
Test(config, listen_is_loopback_only_for_loopback_addresses) {
    const char *yes[] = {"127.0.0.1:50051", "127.0.0.2:0", "127.255.255.255:1", "localhost:0", "[::1]:9090",
                         "127.0.0.1"};
    const char *no[] = {"0.0.0.0:0",         "[::]:0",         "10.0.0.1:50051",   "127.0.0.1.nip.io:50051",
                        "127.example.com:1", "127.:0",         "127.0.0.1x:0",     "127.1:0",
                        "localhost.evil:0",  "[::1]x:0",       "[::ffff:10.0.0.1]:0", "",
                        ":50051",            "1270.0.0.1:0",   "[127.0.0.1]:0"};
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
        cr_assert(eq(int, drey_config_listen_is_loopback(yes[i]), 1), "%s is loopback", yes[i]);
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        cr_assert(eq(int, drey_config_listen_is_loopback(no[i]), 0), "%s is not loopback", no[i]);
}
