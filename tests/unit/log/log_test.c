/*
 * Unit tests for src/log/log.c.
 *
 * Lines are captured through a pipe (drey_log_set_fd) and every one is parsed
 * by a strict JSON checker (json_check.h): a line is exactly one object and a
 * newline, strings are valid UTF-8 with RFC 8259 escapes only.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "drey/log.h"
#include "tests/unit/log/json_check.h"

#define LINE_MAX_BYTES 4096 /* LOG_LINE_MAX in log.c, newline included */

/* --- capture -------------------------------------------------------------- */

static int cap_rd = -1, cap_wr = -1;
static char cap_buf[1 << 16];
static jobject obj; /* the last parsed line (large: kept off the stack) */

static void capture_start(void) {
    int fds[2];
    cr_assert(eq(int, pipe2(fds, O_NONBLOCK), 0));
    cap_rd = fds[0];
    cap_wr = fds[1];
    drey_log_set_fd(cap_wr);
}

static void capture_stop(void) {
    drey_log_set_fd(2);
    close(cap_rd);
    close(cap_wr);
}

TestSuite(log, .init = capture_start, .fini = capture_stop);

/* Everything written since the last call; NUL-terminated in cap_buf. */
static size_t captured(void) {
    size_t len = 0;
    for (;;) {
        ssize_t n = read(cap_rd, cap_buf + len, sizeof cap_buf - 1 - len);
        if (n > 0) {
            len += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        break; /* EAGAIN: the pipe is empty */
    }
    cap_buf[len] = '\0';
    return len;
}

/* Reads exactly one line and parses it into obj; returns its length. */
static size_t one_line(void) {
    size_t len = captured();
    cr_assert(gt(sz, len, 0), "nothing was written");
    cr_assert(json_parse_line(cap_buf, len, &obj), "not one valid JSON line (%s): %.300s", obj.err, cap_buf);
    return len;
}

static void assert_nothing_written(void) {
    size_t len = captured();
    cr_assert(eq(sz, len, 0), "unexpected output: %s", cap_buf);
}

static const jmember *member(const char *key) {
    const jmember *m = json_get(&obj, key);
    cr_assert_not_null(m, "no member \"%s\" in %.300s", key, cap_buf);
    return m;
}

static void assert_raw(const char *key, const char *raw) {
    const jmember *m = member(key);
    cr_assert(json_raw_is(m, raw), "\"%s\" is %.*s, expected %s", key, (int)m->raw_len, m->raw, raw);
}

static bool is_truncated(void) {
    const jmember *t = json_get(&obj, "truncated");
    if (t == NULL)
        return false;
    cr_assert(json_raw_is(t, "true"));
    cr_assert(eq(ptr, (void *)t, (void *)&obj.m[obj.n - 1]), "\"truncated\" must be the last member");
    return true;
}

/* --- line structure ------------------------------------------------------- */

/* A line is {"time","level","msg", then the fields in call order}. */
/* The clock the logger reads: time() is the coarse one and can lag it by a
 * tick across a second boundary. */
static time_t now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec;
}

Test(log, line_has_time_level_msg_then_fields_in_order) {
    time_t before = now_s();
    DREY_LOG_INFO("listening", DREY_LOG_STR("address", "127.0.0.1"), DREY_LOG_INT("port", 50051));
    time_t after = now_s();
    one_line();

    cr_assert(eq(sz, obj.n, 5));
    cr_assert(eq(str, obj.m[0].key, "time"));
    cr_assert(eq(str, obj.m[1].key, "level"));
    cr_assert(eq(str, obj.m[2].key, "msg"));
    cr_assert(eq(str, obj.m[3].key, "address"));
    cr_assert(eq(str, obj.m[4].key, "port"));
    assert_raw("level", "\"info\"");
    assert_raw("msg", "\"listening\"");
    assert_raw("address", "\"127.0.0.1\"");
    assert_raw("port", "50051");

    /* time: RFC 3339 UTC with milliseconds, between the clock reads around the call. */
    const jmember *t = member("time");
    cr_assert(eq(sz, t->str_len, strlen("2026-11-30T02:03:04.123Z")), "time is %s", t->str);
    const char *shape = "dddd-dd-ddTdd:dd:dd.dddZ";
    for (size_t i = 0; shape[i] != '\0'; i++) {
        if (shape[i] == 'd')
            cr_assert(t->str[i] >= '0' && t->str[i] <= '9', "time is %s", t->str);
        else
            cr_assert(eq(chr, t->str[i], shape[i]), "time is %s", t->str);
    }
    struct tm tm = {0};
    cr_assert_not_null(strptime(t->str, "%Y-%m-%dT%H:%M:%S", &tm));
    time_t logged = timegm(&tm);
    cr_assert(logged >= before && logged <= after, "logged %lld outside [%lld, %lld]", (long long)logged,
              (long long)before, (long long)after);
}

Test(log, a_message_without_fields) {
    DREY_LOG_WARN("bare");
    one_line();
    cr_assert(eq(sz, obj.n, 3));
    assert_raw("msg", "\"bare\"");
    assert_raw("level", "\"warn\"");
}

/* One call, one line: two calls give two lines. */
Test(log, each_call_writes_exactly_one_line) {
    DREY_LOG_INFO("one");
    DREY_LOG_INFO("two");
    size_t len = captured();
    char *nl = memchr(cap_buf, '\n', len);
    cr_assert_not_null(nl);
    size_t first = (size_t)(nl - cap_buf) + 1;
    cr_assert(json_parse_line(cap_buf, first, &obj), "%s", obj.err);
    assert_raw("msg", "\"one\"");
    cr_assert(json_parse_line(cap_buf + first, len - first, &obj), "%s", obj.err);
    assert_raw("msg", "\"two\"");
}

/* --- levels --------------------------------------------------------------- */

Test(log, every_level_has_its_name) {
    static const char *const names[] = {"\"debug\"", "\"info\"", "\"warn\"", "\"error\""};
    for (int l = DREY_LOG_LEVEL_DEBUG; l <= DREY_LOG_LEVEL_ERROR; l++) {
        drey_log_emit((drey_log_level)l, "x", NULL, 0);
        one_line();
        assert_raw("level", names[l]);
    }
}

Test(log, parse_level_accepts_exactly_the_four_names) {
    drey_log_level l = DREY_LOG_LEVEL_ERROR;
    cr_assert(drey_log_parse_level("debug", &l));
    cr_assert(eq(int, l, DREY_LOG_LEVEL_DEBUG));
    cr_assert(drey_log_parse_level("info", &l));
    cr_assert(eq(int, l, DREY_LOG_LEVEL_INFO));
    cr_assert(drey_log_parse_level("warn", &l));
    cr_assert(eq(int, l, DREY_LOG_LEVEL_WARN));
    cr_assert(drey_log_parse_level("error", &l));
    cr_assert(eq(int, l, DREY_LOG_LEVEL_ERROR));

    static const char *const bad[] = {"", "INFO", "Info", "warning", "err", "info ", "trace", "fatal"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        l = DREY_LOG_LEVEL_WARN;
        cr_assert(not(drey_log_parse_level(bad[i], &l)), "accepted \"%s\"", bad[i]);
        cr_assert(eq(int, l, DREY_LOG_LEVEL_WARN), "\"%s\" changed the output", bad[i]);
    }
}

Test(log, default_level_is_info) {
    cr_assert(eq(int, drey_log_min_level, DREY_LOG_LEVEL_INFO));
    DREY_LOG_DEBUG("hidden");
    assert_nothing_written();
    DREY_LOG_INFO("shown");
    one_line();
    assert_raw("msg", "\"shown\"");
}

/* The macros drop lines below the level; each threshold is checked. */
Test(log, level_filtering) {
    for (int min = DREY_LOG_LEVEL_DEBUG; min <= DREY_LOG_LEVEL_ERROR; min++) {
        drey_log_set_level((drey_log_level)min);
        DREY_LOG_DEBUG("d");
        DREY_LOG_INFO("i");
        DREY_LOG_WARN("w");
        DREY_LOG_ERROR("e");
        size_t len = captured();
        size_t lines = 0;
        for (size_t i = 0; i < len; i++)
            lines += cap_buf[i] == '\n';
        cr_assert(eq(sz, lines, (size_t)(DREY_LOG_LEVEL_ERROR - min + 1)), "min level %d wrote: %s", min, cap_buf);
        cr_assert(eq(int, strstr(cap_buf, "\"msg\":\"e\"") != NULL, 1));
        cr_assert(eq(int, strstr(cap_buf, "\"msg\":\"d\"") != NULL, min <= DREY_LOG_LEVEL_DEBUG));
        cr_assert(eq(int, strstr(cap_buf, "\"msg\":\"i\"") != NULL, min <= DREY_LOG_LEVEL_INFO));
        cr_assert(eq(int, strstr(cap_buf, "\"msg\":\"w\"") != NULL, min <= DREY_LOG_LEVEL_WARN));
    }
}

/* A filtered line costs nothing: its field arguments are not evaluated. */
Test(log, filtered_line_does_not_evaluate_its_fields) {
    int calls = 0;
    DREY_LOG_DEBUG("hidden", DREY_LOG_INT("n", ++calls));
    cr_assert(eq(int, calls, 0));
    DREY_LOG_INFO("shown", DREY_LOG_INT("n", ++calls));
    cr_assert(eq(int, calls, 1));
    one_line();
    assert_raw("n", "1");
}

/* --- escaping ------------------------------------------------------------- */

Test(log, escapes_quotes_backslashes_and_control_characters) {
    DREY_LOG_INFO("say \"hi\"\\ \n\r\t\x01\x1f\x7f/é", DREY_LOG_STR("k\"ey", "v\\al\"ue"));
    one_line();
    assert_raw("msg", "\"say \\\"hi\\\"\\\\ \\n\\r\\t\\u0001\\u001f\x7f/é\"");
    assert_raw("k\"ey", "\"v\\\\al\\\"ue\"");
    cr_assert(eq(str, (char *)member("msg")->str, "say \"hi\"\\ \n\r\t\x01\x1f\x7f/é"));
}

/* Every C0 control character survives the round trip. */
Test(log, every_control_character_round_trips) {
    char s[32];
    for (int c = 1; c < 32; c++)
        s[c - 1] = (char)c;
    s[31] = '\0';
    DREY_LOG_INFO("ctl", DREY_LOG_STR("s", s));
    one_line();
    const jmember *m = member("s");
    cr_assert(eq(sz, m->str_len, 31));
    cr_assert(eq(int, memcmp(m->str, s, 31), 0));
    cr_assert(json_raw_is(member("msg"), "\"ctl\""));
}

Test(log, null_strings_are_empty) {
    drey_log_field f[] = {DREY_LOG_STR("s", NULL)};
    drey_log_emit(DREY_LOG_LEVEL_INFO, NULL, f, 1);
    one_line();
    assert_raw("msg", "\"\"");
    assert_raw("s", "\"\"");
}

/* drey_log_json_escape returns the new length, or cap without writing a
 * partial escape when the text does not fit. */
Test(log, json_escape_fits_or_reports_cap) {
    char buf[16];
    memset(buf, '#', sizeof buf);
    cr_assert(eq(sz, drey_log_json_escape(buf, 2, sizeof buf, "a\"b\n"), 8));
    cr_assert(eq(int, memcmp(buf + 2, "a\\\"b\\n", 6), 0));

    memset(buf, '#', sizeof buf);
    cr_assert(eq(sz, drey_log_json_escape(buf, 0, 3, "ab\""), 3), "the escape of '\"' needs two bytes, one is left");
    cr_assert(eq(int, memcmp(buf, "ab#", 3), 0), "no half escape written");

    memset(buf, '#', sizeof buf);
    cr_assert(eq(sz, drey_log_json_escape(buf, 0, 6, "\x02"), 6));
    cr_assert(eq(int, memcmp(buf, "\\u0002", 6), 0));
    memset(buf, '#', sizeof buf);
    cr_assert(eq(sz, drey_log_json_escape(buf, 0, 5, "\x02"), 5), "\\u0002 does not fit in 5");
    cr_assert(eq(chr, buf[0], '#'));

    cr_assert(eq(sz, drey_log_json_escape(buf, 4, 16, ""), 4));
}

/* --- field types ---------------------------------------------------------- */

Test(log, every_field_type) {
    DREY_LOG_INFO("types", DREY_LOG_STR("s", "text"), DREY_LOG_INT("imin", INT64_MIN), DREY_LOG_INT("ineg", -1),
                  DREY_LOG_INT("imax", INT64_MAX), DREY_LOG_UINT("umax", UINT64_MAX), DREY_LOG_UINT("uzero", 0),
                  DREY_LOG_DOUBLE("d", 1.5), DREY_LOG_DOUBLE("dneg", -0.25), DREY_LOG_DOUBLE("dbig", 1e300),
                  DREY_LOG_DOUBLE("dsmall", 1.25e-7), DREY_LOG_DOUBLE("dzero", 0.0), DREY_LOG_BOOL("t", true),
                  DREY_LOG_BOOL("f", false));
    one_line();
    cr_assert(eq(sz, obj.n, 3 + 13));
    assert_raw("s", "\"text\"");
    assert_raw("imin", "-9223372036854775808");
    assert_raw("ineg", "-1");
    assert_raw("imax", "9223372036854775807");
    assert_raw("umax", "18446744073709551615");
    assert_raw("uzero", "0");
    assert_raw("d", "1.5");
    assert_raw("dneg", "-0.25");
    assert_raw("dbig", "1e+300");
    assert_raw("dsmall", "1.25e-07");
    assert_raw("dzero", "0");
    assert_raw("t", "true");
    assert_raw("f", "false");
    cr_assert(eq(int, member("d")->type, J_NUMBER));
    cr_assert(eq(int, member("t")->type, J_TRUE));
    cr_assert(eq(int, member("f")->type, J_FALSE));
}

/* BUG (see report): "%.6g" prints nan/inf, which are not JSON. */
Test(log, non_finite_doubles_stay_valid_json) {
    DREY_LOG_INFO("ratio", DREY_LOG_DOUBLE("nan", NAN), DREY_LOG_DOUBLE("inf", INFINITY),
                  DREY_LOG_DOUBLE("ninf", -INFINITY), DREY_LOG_INT("after", 7));
    one_line();
    member("nan");
    member("inf");
    member("ninf");
    assert_raw("after", "7");
}

/* BUG (see report): bytes that are not UTF-8 are copied as they are, which
 * makes the line invalid JSON (RFC 8259 section 8.1). */
Test(log, invalid_utf8_in_a_string_stays_valid_json) {
    DREY_LOG_INFO("grpc", DREY_LOG_STR("detail", "peer sent \xff\xfe and \xc0\xaf"), DREY_LOG_INT("after", 7));
    one_line();
    member("detail");
    assert_raw("after", "7");
}

/* --- truncation ----------------------------------------------------------- */

/* A field that does not fit is dropped whole; the fields before it stay and
 * the line ends with "truncated":true. */
Test(log, overlong_field_is_dropped_and_the_line_marked) {
    static char big[10000];
    memset(big, 'x', sizeof big - 1);
    DREY_LOG_INFO("big", DREY_LOG_STR("a", "kept"), DREY_LOG_STR("big", big), DREY_LOG_INT("c", 3));
    size_t len = one_line();
    cr_assert(le(sz, len, LINE_MAX_BYTES));
    assert_raw("a", "\"kept\"");
    cr_assert_null(json_get(&obj, "big"));
    cr_assert_null(json_get(&obj, "c"), "nothing after the cut");
    cr_assert(is_truncated());
}

/* Escaping expands text (one control byte is six characters): the limit
 * counts the escaped form. */
Test(log, escape_expansion_counts_toward_the_limit) {
    static char ctl[1000];
    memset(ctl, '\x01', sizeof ctl - 1);
    DREY_LOG_INFO("ctl", DREY_LOG_STR("ctl", ctl));
    size_t len = one_line();
    cr_assert(le(sz, len, LINE_MAX_BYTES));
    cr_assert_null(json_get(&obj, "ctl"));
    cr_assert(is_truncated());
}

/* Many small fields: a prefix of them is kept, in order, up to the limit. */
Test(log, many_fields_keep_a_prefix) {
    drey_log_field f[200];
    char keys[200][16];
    static const char value[] = "0123456789012345678901234567890123456789";
    for (int i = 0; i < 200; i++) {
        snprintf(keys[i], sizeof keys[i], "f%03d", i);
        f[i] = DREY_LOG_STR(keys[i], value);
    }
    drey_log_emit(DREY_LOG_LEVEL_INFO, "many", f, 200);
    size_t len = one_line();
    cr_assert(le(sz, len, LINE_MAX_BYTES));
    cr_assert(is_truncated());
    size_t kept = obj.n - 4; /* time, level, msg, truncated */
    cr_assert(gt(sz, kept, 50), "only %zu fields kept", kept);
    cr_assert(lt(sz, kept, 200));
    for (size_t i = 0; i < kept; i++) {
        cr_assert(eq(str, obj.m[3 + i].key, keys[i]));
        cr_assert(eq(str, obj.m[3 + i].str, (char *)value));
    }
    cr_assert(gt(sz, len + 60, LINE_MAX_BYTES), "the cut wastes no more than one field's room (%zu bytes)", len);
}

/* Around the limit: each length gives a valid line that either holds the
 * whole field or drops it and says so, and once lines are cut, longer ones
 * are cut too. */
Test(log, field_length_sweep_across_the_limit) {
    static char v[4200];
    bool cut_seen = false;
    size_t longest_whole = 0;
    for (size_t n = 3800; n < sizeof v; n++) {
        memset(v, 'v', n);
        v[n] = '\0';
        DREY_LOG_INFO("sweep", DREY_LOG_STR("v", v));
        size_t len = one_line();
        cr_assert(le(sz, len, LINE_MAX_BYTES), "n=%zu gave %zu bytes", n, len);
        const jmember *m = json_get(&obj, "v");
        if (is_truncated()) {
            cut_seen = true;
            cr_assert_null(m, "n=%zu: a cut field is dropped whole", n);
        } else {
            cr_assert(not(cut_seen), "n=%zu: whole after a shorter one was cut", n);
            cr_assert_not_null(m);
            cr_assert(eq(sz, m->str_len, n));
            longest_whole = len;
        }
    }
    cr_assert(cut_seen);
    cr_assert(ge(sz, longest_whole, LINE_MAX_BYTES - 64), "lines are cut well before the limit: %zu", longest_whole);
}

/* BUG (see report): a message longer than the line leaves its string
 * unterminated: {"msg":"xxxx...,"truncated":true} is not JSON. */
Test(log, overlong_msg_still_yields_valid_json) {
    static char msg[5000];
    memset(msg, 'm', sizeof msg - 1);
    DREY_LOG_ERROR(msg, DREY_LOG_INT("code", 13));
    size_t len = one_line();
    cr_assert(le(sz, len, LINE_MAX_BYTES));
    member("msg");
    cr_assert(is_truncated());
}

/* --- writing -------------------------------------------------------------- */

/* A bad descriptor loses the line but does not crash or spin. */
Test(log, write_errors_are_ignored) {
    drey_log_set_fd(-1);
    DREY_LOG_ERROR("lost", DREY_LOG_INT("n", 1));
    drey_log_set_fd(cap_wr);
    DREY_LOG_INFO("after");
    one_line();
    assert_raw("msg", "\"after\"");
}

/* Lines from concurrent threads never interleave: each is one write(2) of at
 * most PIPE_BUF bytes. Four writers, one reader draining a blocking pipe. */
#define WRITERS 4
#define LINES_PER_WRITER 400

typedef struct drain {
    int fd;
    char *buf;
    size_t len, cap;
} drain;

static void *drain_pipe(void *arg) {
    drain *d = arg;
    for (;;) {
        if (d->cap - d->len < 8192) {
            d->cap *= 2;
            d->buf = realloc(d->buf, d->cap);
            cr_assert_not_null(d->buf);
        }
        ssize_t n = read(d->fd, d->buf + d->len, d->cap - d->len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return NULL;
        d->len += (size_t)n;
    }
}

static void *write_lines(void *arg) {
    int id = (int)(intptr_t)arg;
    char body[3001];
    for (int i = 0; i < LINES_PER_WRITER; i++) {
        size_t n = (size_t)(i * 7 + id * 131) % 3000;
        memset(body, 'a' + id, n);
        body[n] = '\0';
        DREY_LOG_INFO("burst", DREY_LOG_INT("writer", id), DREY_LOG_INT("i", i), DREY_LOG_STR("body", body));
    }
    return NULL;
}

Test(log, concurrent_lines_never_interleave, .timeout = 60) {
    int fds[2];
    cr_assert(eq(int, pipe(fds), 0));
    drey_log_set_fd(fds[1]);
    drain d = {.fd = fds[0], .cap = 1 << 20};
    d.buf = malloc(d.cap);
    pthread_t reader, writers[WRITERS];
    cr_assert(eq(int, pthread_create(&reader, NULL, drain_pipe, &d), 0));
    for (int w = 0; w < WRITERS; w++)
        cr_assert(eq(int, pthread_create(&writers[w], NULL, write_lines, (void *)(intptr_t)w), 0));
    for (int w = 0; w < WRITERS; w++)
        pthread_join(writers[w], NULL);
    drey_log_set_fd(cap_wr);
    close(fds[1]); /* EOF for the reader */
    pthread_join(reader, NULL);
    close(fds[0]);

    int next[WRITERS] = {0};
    size_t lines = 0;
    for (size_t off = 0; off < d.len;) {
        char *nl = memchr(d.buf + off, '\n', d.len - off);
        cr_assert_not_null(nl, "the stream ends inside a line");
        size_t len = (size_t)(nl - (d.buf + off)) + 1;
        cr_assert(json_parse_line(d.buf + off, len, &obj), "line %zu: %s", lines, obj.err);
        const jmember *w = json_get(&obj, "writer"), *i = json_get(&obj, "i"), *body = json_get(&obj, "body");
        cr_assert(w != NULL && i != NULL && body != NULL);
        int id = atoi(w->raw), seq = atoi(i->raw);
        cr_assert(id >= 0 && id < WRITERS);
        cr_assert(eq(int, seq, next[id]), "writer %d: line %d after %d", id, seq, next[id] - 1);
        next[id]++;
        size_t want = (size_t)(seq * 7 + id * 131) % 3000;
        cr_assert(eq(sz, body->str_len, want));
        for (size_t k = 0; k < want; k++)
            cr_assert(eq(chr, body->str[k], (char)('a' + id)));
        lines++;
        off += len;
    }
    cr_assert(eq(sz, lines, (size_t)WRITERS * LINES_PER_WRITER));
    free(d.buf);
}

/* --- an empty error says nothing ------------------------------------------- */

Test(log, an_empty_error_field_is_left_out) {
    DREY_LOG_WARN("w", DREY_LOG_STR("error", ""), DREY_LOG_STR("peer", ""), DREY_LOG_STR("error", NULL));
    one_line();
    cr_assert_null(json_get(&obj, "error"), "%s", cap_buf);
    assert_raw("peer", "\"\""); /* other empty fields stay: their key may be the news */
    DREY_LOG_WARN("w", DREY_LOG_STR("error", "disk full"));
    one_line();
    assert_raw("error", "\"disk full\"");
}

/* --- clipping messages into fixed buffers ------------------------------------ */

static const char *clip(size_t cap, const char *s) {
    static char out[256];
    cr_assert_leq(cap, sizeof out);
    size_t n = drey_log_clip(out, cap, s, strlen(s));
    cr_assert_eq(n, strlen(out));
    cr_assert_lt(n, cap, "room for the NUL");
    return out;
}

Test(log, a_message_that_fits_is_copied_whole) {
    cr_assert_str_eq(clip(32, "Connection refused"), "Connection refused");
    cr_assert_str_eq(clip(19, "Connection refused"), "Connection refused", "exactly the room");
    cr_assert_str_eq(clip(8, ""), "");
}

Test(log, a_long_message_is_cut_after_a_whole_word) {
    const char *m = "Failed to connect to remote host: Connection refused";
    /* 40 bytes of room: the old %.*s cut gave "...remote host: Connecti" */
    cr_assert_str_eq(clip(40, m), "Failed to connect to remote host:...");
    cr_assert_str_eq(clip(45, m), "Failed to connect to remote host:...");
    cr_assert_str_eq(clip(48, m), "Failed to connect to remote host: Connection...");
    cr_assert_str_eq(clip(13, m), "Failed to...");
    cr_assert_str_eq(clip(12, m), "Failed...", "\"Failed to\" needs 9 bytes and the mark 3");
}

Test(log, a_single_long_word_is_cut_inside_it) {
    cr_assert_str_eq(clip(10, "abcdefghijklmnop"), "abcdef...");
    cr_assert_str_eq(clip(16, "ab cdefghijklmnopqrstuvwxyz"), "ab cdefghijk...", "a word before the half");
}

Test(log, a_cut_never_splits_a_utf8_character) {
    /* "ééééé" is 10 bytes; 6 bytes of room would end inside the fourth */
    const char *out = clip(10, "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9");
    cr_assert_str_eq(out, "\xc3\xa9\xc3\xa9\xc3\xa9...");
    cr_assert_str_eq(clip(4, "abcdef"), "", "no room for any of it and the mark");
}

/* --- repeated lines ----------------------------------------------------------- */

Test(log, the_same_text_goes_once_per_interval_with_a_count) {
    static drey_log_repeat repeats = DREY_LOG_REPEAT_INIT(1000);
    drey_log_repeat *r = &repeats;
    uint64_t k = 99;
    cr_assert(drey_log_repeat_admit(r, "No match found for server name", 0, &k));
    cr_assert_eq(k, 0);
    for (int i = 1; i <= 5; i++)
        cr_assert_not(drey_log_repeat_admit(r, "No match found for server name", i * 100, &k), "held back");
    cr_assert(drey_log_repeat_admit(r, "another text", 600, &k), "another text is not held back");
    cr_assert_eq(k, 0);
    cr_assert(drey_log_repeat_admit(r, "No match found for server name", 1000, &k), "after the interval");
    cr_assert_eq(k, 5, "says how many were held back");
    cr_assert_not(drey_log_repeat_admit(r, "No match found for server name", 1500, &k));
    cr_assert(drey_log_repeat_admit(r, "No match found for server name", 5000, &k));
    cr_assert_eq(k, 1);
}

Test(log, more_texts_than_slots_forget_the_least_recent) {
    static drey_log_repeat repeats = DREY_LOG_REPEAT_INIT(1000);
    drey_log_repeat *r = &repeats;
    char text[32];
    uint64_t k;
    for (int i = 0; i <= DREY_LOG_REPEAT_SLOTS; i++) { /* one more than fits: text 0 is forgotten */
        snprintf(text, sizeof text, "text %d", i);
        cr_assert(drey_log_repeat_admit(r, text, i, &k));
    }
    cr_assert(drey_log_repeat_admit(r, "text 0", 100, &k), "forgotten: it goes again");
    cr_assert_not(drey_log_repeat_admit(r, "text 5", 101, &k), "still watched");
}
