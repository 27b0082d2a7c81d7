/*
 * Unit tests for src/metrics/metrics.c: the recording API and the
 * Prometheus text exposition it produces.
 *
 * Every check goes through the real module: the exposition is written to a
 * memory FILE and parsed back by a strict parser in this file, which fails
 * on anything the text format (0.0.4) does not allow — a sample before its
 * family's # HELP and # TYPE, a family split in two, an unknown escape in a
 * label value, a raw newline inside one. Values are then looked up by
 * series (name plus label set) and compared exactly: counts are integers
 * and the sums below are chosen so the expected double is exact too.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "drey/metrics.h"
#include "drey/version.h"

/* The bucket layouts are part of the contract with dashboards and alerts:
 * copies of the tables in metrics.c, so a change to either shows here. */
static const double latency_bounds[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                        0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10};
static const double fsync_bounds[] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                      0.01,    0.025,  0.05,    0.1,    0.25,  0.5,    1};
static const double batch_bounds[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};
#define N_LATENCY (sizeof latency_bounds / sizeof latency_bounds[0])
#define N_FSYNC (sizeof fsync_bounds / sizeof fsync_bounds[0])
#define N_BATCH (sizeof batch_bounds / sizeof batch_bounds[0])

#define N_CODES 17
#define MAX_REJECTION_KINDS 64 /* MAX_REJECTION_KINDS in metrics.c */

static const char *const code_names[N_CODES] = {
    "OK",        "CANCELLED",          "UNKNOWN",           "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
    "OUT_OF_RANGE", "UNIMPLEMENTED",  "INTERNAL",          "UNAVAILABLE",      "DATA_LOSS",         "UNAUTHENTICATED",
};

enum { GET, SET, SNAPSHOT, N_METHODS };
static const char *const methods[N_METHODS] = {
    "/drey.cache.v1.Cache/Get",
    "/drey.cache.v1.Cache/Set",
    "/drey.admin.v1.Admin/Snapshot",
};

static drey_metrics *m;

static void setup(void) {
    m = drey_metrics_create();
    cr_assert_not_null(m);
}

static void teardown(void) {
    drey_metrics_destroy(m);
    m = NULL;
}

TestSuite(metrics, .init = setup, .fini = teardown);

/* --- a strict parser for the text exposition ------------------------------ */

#define MAX_LABELS 4
#define MAX_FAMILIES 32

typedef struct label {
    char key[64];
    char value[640]; /* unescaped */
} label;

typedef struct sample {
    char name[128];
    label labels[MAX_LABELS];
    size_t n_labels;
    char value_text[64];
    double value;
    size_t family;
} sample;

typedef struct family {
    char name[128];
    char type[16];
    char help[256];
    size_t n_samples;
} family;

typedef struct expo {
    char *text;
    size_t len;
    sample *samples;
    size_t n_samples, cap_samples;
    family families[MAX_FAMILIES];
    size_t n_families;
} expo;

static bool is_name_char(char c, bool first) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' || (!first && c >= '0' && c <= '9');
}

/* Reads a metric or label name at *p into out; fails the test if there is
 * none. */
static void read_name(const char **p, char *out, size_t cap, const char *line) {
    size_t n = 0;
    while (is_name_char((*p)[0], n == 0)) {
        cr_assert(lt(sz, n + 1, cap), "name too long in: %s", line);
        out[n++] = *(*p)++;
    }
    out[n] = '\0';
    cr_assert(gt(sz, n, 0), "expected a name in: %s", line);
}

/* A label value between double quotes; the only escapes the format has are
 * \\, \" and \n. */
static void read_label_value(const char **p, char *out, size_t cap, const char *line) {
    cr_assert(eq(chr, **p, '"'), "label value not quoted in: %s", line);
    (*p)++;
    size_t n = 0;
    for (;;) {
        char c = *(*p)++;
        cr_assert(ne(chr, c, '\0'), "unterminated label value in: %s", line);
        if (c == '"')
            break;
        if (c == '\\') {
            char e = *(*p)++;
            cr_assert(e == '\\' || e == '"' || e == 'n', "invalid escape \\%c in: %s", e, line);
            c = e == 'n' ? '\n' : e;
        }
        cr_assert(lt(sz, n + 1, cap), "label value too long in: %s", line);
        out[n++] = c;
    }
    out[n] = '\0';
}

static size_t family_index(const expo *e, const char *name) {
    for (size_t i = 0; i < e->n_families; i++) {
        if (strcmp(e->families[i].name, name) == 0)
            return i;
    }
    return SIZE_MAX;
}

/* Whether a sample called `name` belongs to family f: its own name, or for
 * a histogram the name with _bucket, _sum or _count appended. */
static bool in_family(const family *f, const char *name) {
    if (strcmp(f->name, name) == 0)
        return true;
    if (strcmp(f->type, "histogram") != 0)
        return false;
    size_t n = strlen(f->name);
    if (strncmp(f->name, name, n) != 0)
        return false;
    return strcmp(name + n, "_bucket") == 0 || strcmp(name + n, "_sum") == 0 || strcmp(name + n, "_count") == 0;
}

static void parse_sample(expo *e, const char *line, size_t current) {
    cr_assert(ne(sz, current, SIZE_MAX), "sample before any # HELP and # TYPE: %s", line);
    if (e->n_samples == e->cap_samples) {
        e->cap_samples = e->cap_samples ? 2 * e->cap_samples : 256;
        e->samples = realloc(e->samples, e->cap_samples * sizeof *e->samples);
        cr_assert_not_null(e->samples);
    }
    sample *s = &e->samples[e->n_samples];
    memset(s, 0, sizeof *s);
    const char *p = line;
    read_name(&p, s->name, sizeof s->name, line);
    if (*p == '{') {
        p++;
        while (*p != '}') {
            cr_assert(lt(sz, s->n_labels, MAX_LABELS), "too many labels in: %s", line);
            label *l = &s->labels[s->n_labels++];
            read_name(&p, l->key, sizeof l->key, line);
            for (size_t i = 0; i + 1 < s->n_labels; i++)
                cr_assert(ne(str, s->labels[i].key, l->key), "label %s twice in: %s", l->key, line);
            cr_assert(eq(chr, *p, '='), "expected = in: %s", line);
            p++;
            read_label_value(&p, l->value, sizeof l->value, line);
            if (*p == ',')
                p++;
            else
                cr_assert(eq(chr, *p, '}'), "expected , or } in: %s", line);
        }
        p++;
    }
    cr_assert(eq(chr, *p, ' '), "expected one space before the value in: %s", line);
    p++;
    cr_assert(lt(sz, strlen(p), sizeof s->value_text), "value too long in: %s", line);
    strcpy(s->value_text, p);
    char *end;
    s->value = strtod(p, &end);
    cr_assert(end != p && *end == '\0', "not a float value (or a timestamp follows) in: %s", line);
    family *f = &e->families[current];
    cr_assert(in_family(f, s->name), "%s outside its family: after # TYPE %s", s->name, f->name);
    if (strcmp(s->name + strlen(f->name), "_bucket") == 0) {
        cr_assert(eq(sz, s->n_labels > 0 ? strcmp(s->labels[s->n_labels - 1].key, "le") : 1, 0),
                  "a bucket without le last: %s", line);
    }
    s->family = current;
    f->n_samples++;
    e->n_samples++;
}

/* Parses e->text; every rule of the format the module relies on is checked
 * on the way. */
static void parse(expo *e) {
    cr_assert(e->len == 0 || e->text[e->len - 1] == '\n', "the exposition ends with a newline");
    cr_assert(eq(sz, strlen(e->text), e->len), "a NUL inside the exposition");
    size_t current = SIZE_MAX, pending_help = SIZE_MAX;
    const char *p = e->text, *end = e->text + e->len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        char line[2048];
        size_t n = (size_t)(nl - p);
        cr_assert(lt(sz, n, sizeof line));
        memcpy(line, p, n);
        line[n] = '\0';
        p = nl + 1;
        if (strncmp(line, "# HELP ", 7) == 0) {
            const char *q = line + 7;
            cr_assert(lt(sz, e->n_families, MAX_FAMILIES));
            family *f = &e->families[e->n_families];
            memset(f, 0, sizeof *f);
            read_name(&q, f->name, sizeof f->name, line);
            cr_assert(eq(sz, family_index(e, f->name), SIZE_MAX), "family %s declared twice", f->name);
            cr_assert(eq(chr, *q, ' '), "no help text in: %s", line);
            cr_assert(gt(sz, strlen(q + 1), 0), "empty help text in: %s", line);
            cr_assert(lt(sz, strlen(q + 1), sizeof f->help));
            strcpy(f->help, q + 1);
            pending_help = e->n_families++;
            current = SIZE_MAX;
        } else if (strncmp(line, "# TYPE ", 7) == 0) {
            /* The module writes HELP then TYPE, so TYPE always closes the
             * header a HELP opened. */
            cr_assert(ne(sz, pending_help, SIZE_MAX), "# TYPE without # HELP first: %s", line);
            family *f = &e->families[pending_help];
            const char *q = line + 7;
            char name[128];
            read_name(&q, name, sizeof name, line);
            cr_assert(eq(str, name, f->name), "# TYPE for another family than its # HELP: %s", line);
            cr_assert(eq(chr, *q, ' '), "no type in: %s", line);
            q++;
            cr_assert(strcmp(q, "counter") == 0 || strcmp(q, "gauge") == 0 || strcmp(q, "histogram") == 0 ||
                          strcmp(q, "summary") == 0 || strcmp(q, "untyped") == 0,
                      "unknown type in: %s", line);
            strcpy(f->type, q);
            current = pending_help;
            pending_help = SIZE_MAX;
        } else {
            cr_assert(ne(chr, line[0], '#'), "a comment that is neither HELP nor TYPE: %s", line);
            cr_assert(ne(chr, line[0], '\0'), "an empty line");
            parse_sample(e, line, current);
        }
    }
    cr_assert(eq(sz, pending_help, SIZE_MAX), "a # HELP without its # TYPE");
}

static void scrape(expo *e) {
    memset(e, 0, sizeof *e);
    FILE *f = open_memstream(&e->text, &e->len);
    cr_assert_not_null(f);
    drey_metrics_write(m, f);
    cr_assert(eq(int, fclose(f), 0));
    parse(e);
}

static void expo_free(expo *e) {
    free(e->text);
    free(e->samples);
    memset(e, 0, sizeof *e);
}

static const family *family_named(const expo *e, const char *name) {
    size_t i = family_index(e, name);
    cr_assert(ne(sz, i, SIZE_MAX), "no family %s", name);
    return &e->families[i];
}

/* The sample with this name and exactly these labels (key, value pairs,
 * NULL-terminated), or NULL. */
static const sample *find_v(const expo *e, const char *name, va_list ap) {
    label want[MAX_LABELS];
    size_t n = 0;
    const char *k;
    while ((k = va_arg(ap, const char *)) != NULL) {
        cr_assert(lt(sz, n, MAX_LABELS));
        snprintf(want[n].key, sizeof want[n].key, "%s", k);
        snprintf(want[n].value, sizeof want[n].value, "%s", va_arg(ap, const char *));
        n++;
    }
    for (size_t i = 0; i < e->n_samples; i++) {
        const sample *s = &e->samples[i];
        if (strcmp(s->name, name) != 0 || s->n_labels != n)
            continue;
        size_t matched = 0;
        for (size_t a = 0; a < n; a++) {
            for (size_t b = 0; b < n; b++) {
                if (strcmp(want[a].key, s->labels[b].key) == 0 && strcmp(want[a].value, s->labels[b].value) == 0)
                    matched++;
            }
        }
        if (matched == n)
            return s;
    }
    return NULL;
}

static const sample *find(const expo *e, const char *name, ...) {
    va_list ap;
    va_start(ap, name);
    const sample *s = find_v(e, name, ap);
    va_end(ap);
    return s;
}

static double value(const expo *e, const char *name, ...) {
    va_list ap;
    va_start(ap, name);
    const sample *s = find_v(e, name, ap);
    va_end(ap);
    cr_assert_not_null(s, "no sample %s with those labels in:\n%s", name, e->text);
    return s->value;
}

static size_t count_named(const expo *e, const char *name) {
    size_t n = 0;
    for (size_t i = 0; i < e->n_samples; i++)
        n += strcmp(e->samples[i].name, name) == 0;
    return n;
}

static const char *label_of(const sample *s, const char *key) {
    for (size_t i = 0; i < s->n_labels; i++) {
        if (strcmp(s->labels[i].key, key) == 0)
            return s->labels[i].value;
    }
    return NULL;
}

/* One histogram series as exposed. */
typedef struct hist {
    size_t n_buckets; /* including +Inf */
    double le[32];
    double cumulative[32];
    double sum, count;
} hist;

/* Collects the series of histogram `name` whose only label other than le
 * is method=`method` (NULL: no other label), checking the shape every
 * histogram must have: bounds strictly increasing, the last one +Inf,
 * buckets cumulative, +Inf equal to _count. */
static hist histogram(const expo *e, const char *name, const char *method) {
    hist h = {0};
    char bucket[160], sum[160], count[160];
    snprintf(bucket, sizeof bucket, "%s_bucket", name);
    snprintf(sum, sizeof sum, "%s_sum", name);
    snprintf(count, sizeof count, "%s_count", name);
    for (size_t i = 0; i < e->n_samples; i++) {
        const sample *s = &e->samples[i];
        if (strcmp(s->name, bucket) != 0 || s->n_labels != (method != NULL ? 2u : 1u))
            continue;
        if (method != NULL && (label_of(s, "method") == NULL || strcmp(label_of(s, "method"), method) != 0))
            continue;
        cr_assert(lt(sz, h.n_buckets, 32));
        const char *le = label_of(s, "le");
        cr_assert_not_null(le);
        char *end;
        h.le[h.n_buckets] = strtod(le, &end);
        cr_assert(end != le && *end == '\0', "le=\"%s\" is not a float", le);
        h.cumulative[h.n_buckets++] = s->value;
    }
    cr_assert(gt(sz, h.n_buckets, 0), "no buckets for %s %s", name, method != NULL ? method : "");
    for (size_t i = 1; i < h.n_buckets; i++) {
        cr_assert(gt(dbl, h.le[i], h.le[i - 1]), "%s: le not increasing at %zu", name, i);
        cr_assert(ge(dbl, h.cumulative[i], h.cumulative[i - 1]), "%s: buckets not cumulative at le=%g", name,
                  h.le[i]);
    }
    cr_assert(eq(dbl, h.le[h.n_buckets - 1], INFINITY), "%s: the last bucket is not +Inf", name);
    if (method != NULL) {
        h.sum = value(e, sum, "method", method, NULL);
        h.count = value(e, count, "method", method, NULL);
    } else {
        h.sum = value(e, sum, NULL);
        h.count = value(e, count, NULL);
    }
    cr_assert(eq(dbl, h.cumulative[h.n_buckets - 1], h.count), "%s: le=\"+Inf\" differs from _count", name);
    return h;
}

/* Checks the series' bounds are `bounds` and its cumulative counts those
 * implied by per-bucket counts `per` (n + 1 entries, the last for +Inf). */
static void assert_buckets(const hist *h, const double *bounds, size_t n, const uint64_t *per) {
    cr_assert(eq(sz, h->n_buckets, n + 1));
    uint64_t c = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i < n)
            cr_assert(eq(dbl, h->le[i], bounds[i]), "bucket %zu", i);
        c += per[i];
        cr_assert(eq(dbl, h->cumulative[i], (double)c), "le=%g holds %g, want %llu", h->le[i], h->cumulative[i],
                  (unsigned long long)c);
    }
}

/* The bucket of a value, as Prometheus defines it: the first bound >= v. */
static size_t bucket_of(const double *bounds, size_t n, double v) {
    size_t i = 0;
    while (i < n && v > bounds[i])
        i++;
    return i;
}

/* Whether a sample only ever goes up: counters, and every part of a
 * histogram. */
static bool is_monotonic(const expo *e, const sample *s) {
    const char *type = e->families[s->family].type;
    return strcmp(type, "counter") == 0 || strcmp(type, "histogram") == 0;
}

/* Every counter and histogram series of `before` is in `after`, not lower. */
static void assert_nothing_went_down(const expo *before, const expo *after) {
    for (size_t i = 0; i < before->n_samples; i++) {
        const sample *s = &before->samples[i];
        if (!is_monotonic(before, s))
            continue;
        const sample *t = NULL;
        for (size_t j = 0; j < after->n_samples && t == NULL; j++) {
            const sample *c = &after->samples[j];
            if (strcmp(c->name, s->name) != 0 || c->n_labels != s->n_labels)
                continue;
            bool same = true;
            for (size_t k = 0; k < s->n_labels; k++)
                same = same && strcmp(c->labels[k].key, s->labels[k].key) == 0 &&
                       strcmp(c->labels[k].value, s->labels[k].value) == 0;
            if (same)
                t = c;
        }
        cr_assert_not_null(t, "series %s vanished", s->name);
        cr_assert(ge(dbl, t->value, s->value), "%s went down: %s -> %s", s->name, s->value_text, t->value_text);
    }
}

static int64_t us(int64_t v) {
    return v * 1000;
}

/* --- format --------------------------------------------------------------- */

static void gauge_collector(void *ctx, FILE *out) {
    (void)ctx;
    drey_metrics_header(out, "drey_test_queue_depth", "gauge", "Calls waiting, by queue.");
    char labels[128];
    drey_metrics_labels(labels, sizeof labels, "queue", "writes", NULL);
    drey_metrics_sample(out, "drey_test_queue_depth", labels, 3);
    drey_metrics_labels(labels, sizeof labels, "queue", "reads", NULL);
    drey_metrics_sample(out, "drey_test_queue_depth", labels, 0);
}

/* Fills the registry with something in every family, including label
 * values that need escaping. */
static void observe_a_bit_of_everything(void) {
    drey_metrics_set_methods(m, methods, N_METHODS);
    drey_metrics_observe_call(m, GET, 0, us(120));
    drey_metrics_observe_call(m, GET, 5, us(80));
    drey_metrics_observe_call(m, SET, 8, us(3000));
    drey_metrics_observe_rejection(m, "backpressure", "queue_full");
    drey_metrics_observe_rejection(m, "auth", "bad \"token\"\\\nsecond line");
    drey_metrics_observe_batch(m, 3, 250);
    drey_metrics_observe_batch(m, 1, 0);
    drey_metrics_observe_replica_ack(m, 420);
    drey_metrics_add_collector(m, gauge_collector, NULL);
}

Test(metrics, every_family_has_help_and_type_before_its_samples) {
    observe_a_bit_of_everything();
    expo e;
    scrape(&e); /* the parser fails on a sample outside its declared family */
    static const struct {
        const char *name, *type;
    } want[] = {
        {"drey_requests_total", "counter"},
        {"drey_request_duration_seconds", "histogram"},
        {"drey_rejections_total", "counter"},
        {"drey_journal_fsync_duration_seconds", "histogram"},
        {"drey_journal_batch_records", "histogram"},
        {"drey_cluster_replication_ack_seconds", "histogram"},
        {"drey_test_queue_depth", "gauge"},
    };
    cr_assert(eq(sz, e.n_families, sizeof want / sizeof want[0]));
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        cr_assert(eq(str, e.families[i].name, (char *)want[i].name), "family %zu", i);
        cr_assert(eq(str, e.families[i].type, (char *)want[i].type), "type of %s", want[i].name);
        cr_assert(gt(sz, e.families[i].n_samples, 0), "%s has no samples", want[i].name);
    }
    expo_free(&e);
}

/* A family with nothing to report still declares itself, so dashboards see
 * the metric exists before the first rejection. */
Test(metrics, an_empty_registry_still_declares_every_family) {
    expo e;
    scrape(&e);
    cr_assert(eq(sz, e.n_families, 6));
    cr_assert(eq(sz, family_named(&e, "drey_requests_total")->n_samples, 0));
    cr_assert(eq(sz, family_named(&e, "drey_request_duration_seconds")->n_samples, 0));
    cr_assert(eq(sz, family_named(&e, "drey_rejections_total")->n_samples, 0));
    hist h = histogram(&e, "drey_journal_fsync_duration_seconds", NULL);
    uint64_t none[N_LATENCY + 1] = {0};
    assert_buckets(&h, fsync_bounds, N_FSYNC, none);
    cr_assert(eq(dbl, h.sum, 0));
    h = histogram(&e, "drey_journal_batch_records", NULL);
    assert_buckets(&h, batch_bounds, N_BATCH, none);
    expo_free(&e);
}

/* The promtool linter is an extra opinion when the machine has it; the
 * parser above has already checked the same text. */
Test(metrics, promtool_accepts_the_exposition_when_installed) {
    observe_a_bit_of_everything();
    expo e;
    scrape(&e);
    if (system("command -v promtool >/dev/null 2>&1") == 0) {
        FILE *p = popen("promtool check metrics", "w");
        cr_assert_not_null(p);
        cr_assert(eq(sz, fwrite(e.text, 1, e.len, p), e.len));
        int st = pclose(p);
        bool accepted = WIFEXITED(st) && WEXITSTATUS(st) == 0;
        cr_assert(accepted, "promtool check metrics rejected:\n%s", e.text);
    }
    expo_free(&e);
}

/* --- requests ------------------------------------------------------------- */

/* The OK series exists from the start so rate() has a zero to start from;
 * other codes appear once returned. */
Test(metrics, a_method_never_called_shows_zero_ok_calls_and_no_other_code) {
    drey_metrics_set_methods(m, methods, N_METHODS);
    expo e;
    scrape(&e);
    cr_assert(eq(sz, count_named(&e, "drey_requests_total"), N_METHODS));
    uint64_t none[N_LATENCY + 1] = {0};
    for (size_t i = 0; i < N_METHODS; i++) {
        cr_assert(eq(dbl, value(&e, "drey_requests_total", "method", methods[i], "code", "OK", NULL), 0));
        hist h = histogram(&e, "drey_request_duration_seconds", methods[i]);
        assert_buckets(&h, latency_bounds, N_LATENCY, none);
        cr_assert(eq(dbl, h.sum, 0));
    }
    expo_free(&e);
}

Test(metrics, calls_are_counted_by_method_and_status_code) {
    drey_metrics_set_methods(m, methods, N_METHODS);
    for (int i = 0; i < 3; i++)
        drey_metrics_observe_call(m, GET, 0, us(100));
    for (int i = 0; i < 2; i++)
        drey_metrics_observe_call(m, GET, 5, us(100));
    drey_metrics_observe_call(m, SET, 16, us(100));
    drey_metrics_observe_call(m, SET, 1, us(100));
    expo e;
    scrape(&e);
    cr_assert(eq(dbl, value(&e, "drey_requests_total", "method", methods[GET], "code", "OK", NULL), 3));
    cr_assert(eq(dbl, value(&e, "drey_requests_total", "method", methods[GET], "code", "NOT_FOUND", NULL), 2));
    cr_assert(eq(dbl, value(&e, "drey_requests_total", "method", methods[SET], "code", "OK", NULL), 0));
    cr_assert(eq(dbl, value(&e, "drey_requests_total", "method", methods[SET], "code", "UNAUTHENTICATED", NULL), 1));
    cr_assert(eq(dbl, value(&e, "drey_requests_total", "method", methods[SET], "code", "CANCELLED", NULL), 1));
    cr_assert(eq(dbl, value(&e, "drey_requests_total", "method", methods[SNAPSHOT], "code", "OK", NULL), 0));
    cr_assert(eq(sz, count_named(&e, "drey_requests_total"), 6), "no series for codes never returned");
    cr_assert(eq(dbl, histogram(&e, "drey_request_duration_seconds", methods[GET]).count, 5));
    cr_assert(eq(dbl, histogram(&e, "drey_request_duration_seconds", methods[SET]).count, 2));
    cr_assert(eq(dbl, histogram(&e, "drey_request_duration_seconds", methods[SNAPSHOT]).count, 0));
    expo_free(&e);
}

/* Alerts match on the canonical gRPC names, not on numbers. */
Test(metrics, every_grpc_status_code_has_its_canonical_name) {
    drey_metrics_set_methods(m, methods, 1);
    for (int c = 0; c < N_CODES; c++) {
        for (int k = 0; k <= c; k++)
            drey_metrics_observe_call(m, GET, c, us(10));
    }
    expo e;
    scrape(&e);
    cr_assert(eq(sz, count_named(&e, "drey_requests_total"), N_CODES));
    for (int c = 0; c < N_CODES; c++) {
        cr_assert(eq(dbl, value(&e, "drey_requests_total", "method", methods[GET], "code", code_names[c], NULL),
                     c + 1),
                  "code %d", c);
    }
    expo_free(&e);
}

/* A call the registry cannot place must not land in someone else's slot. */
Test(metrics, calls_outside_the_registered_methods_or_codes_are_ignored) {
    drey_metrics_set_methods(m, methods, N_METHODS);
    drey_metrics_observe_call(m, GET, 0, us(100));
    expo before, after;
    scrape(&before);
    drey_metrics_observe_call(m, N_METHODS, 0, us(100));
    drey_metrics_observe_call(m, SIZE_MAX, 0, us(100));
    drey_metrics_observe_call(m, GET, -1, us(100));
    drey_metrics_observe_call(m, GET, N_CODES, us(100));
    drey_metrics_observe_call(m, GET, 1000, us(100));
    scrape(&after);
    cr_assert(eq(str, after.text, before.text));
    expo_free(&before);
    expo_free(&after);
}

Test(metrics, counters_and_histograms_only_go_up) {
    observe_a_bit_of_everything();
    expo s0, s1, s2, s3;
    scrape(&s0);
    drey_metrics_observe_call(m, GET, 0, us(50));
    drey_metrics_observe_call(m, SNAPSHOT, 14, us(2500000));
    drey_metrics_observe_rejection(m, "backpressure", "queue_full");
    drey_metrics_observe_batch(m, 7, 100);
    scrape(&s1);
    scrape(&s2);
    cr_assert(eq(str, s2.text, s1.text), "a scrape does not reset anything");
    drey_metrics_observe_call(m, SNAPSHOT, 14, us(1));
    drey_metrics_observe_rejection(m, "auth", "expired");
    scrape(&s3);
    assert_nothing_went_down(&s0, &s1);
    assert_nothing_went_down(&s1, &s3);
    cr_assert(gt(dbl, value(&s1, "drey_rejections_total", "stage", "backpressure", "reason", "queue_full", NULL),
                 value(&s0, "drey_rejections_total", "stage", "backpressure", "reason", "queue_full", NULL)));
    expo_free(&s0);
    expo_free(&s1);
    expo_free(&s2);
    expo_free(&s3);
}

/* --- latency histogram ---------------------------------------------------- */

/* le is "less than or equal": a call lasting exactly a bound counts in that
 * bound's bucket, one nanosecond more in the next. */
Test(metrics, a_call_on_a_bucket_bound_counts_in_that_bucket) {
    const char *names[N_LATENCY];
    char storage[N_LATENCY][32];
    for (size_t i = 0; i < N_LATENCY; i++) {
        snprintf(storage[i], sizeof storage[i], "/t.T/M%zu", i);
        names[i] = storage[i];
    }
    drey_metrics_set_methods(m, names, N_LATENCY);
    for (size_t i = 0; i < N_LATENCY; i++) {
        int64_t ns = (int64_t)(latency_bounds[i] * 1e9 + 0.5);
        drey_metrics_observe_call(m, i, 0, ns);
        drey_metrics_observe_call(m, i, 0, ns + 1);
    }
    expo e;
    scrape(&e);
    for (size_t i = 0; i < N_LATENCY; i++) {
        uint64_t per[N_LATENCY + 1] = {0};
        per[i] = 1;
        per[i + 1] = 1;
        hist h = histogram(&e, "drey_request_duration_seconds", names[i]);
        assert_buckets(&h, latency_bounds, N_LATENCY, per);
        cr_assert(eq(dbl, h.count, 2));
    }
    expo_free(&e);
}

/* _sum is what rate(_sum)/rate(_count) divides: it must be the total of
 * the observed durations. They are whole microseconds here because the sum
 * is kept in integer microseconds. */
Test(metrics, the_latency_histogram_matches_what_was_observed) {
    drey_metrics_set_methods(m, methods, N_METHODS);
    static const int64_t durations_us[] = {1, 50, 100, 150, 300, 2500, 3000, 1000000, 20000000, 7500, 100, 10000000};
    uint64_t per[N_LATENCY + 1] = {0};
    int64_t total_us = 0;
    for (size_t i = 0; i < sizeof durations_us / sizeof durations_us[0]; i++) {
        drey_metrics_observe_call(m, SET, i % 2 ? 0 : 13, us(durations_us[i]));
        per[bucket_of(latency_bounds, N_LATENCY, (double)durations_us[i] / 1e6)]++;
        total_us += durations_us[i];
    }
    expo e;
    scrape(&e);
    hist h = histogram(&e, "drey_request_duration_seconds", methods[SET]);
    assert_buckets(&h, latency_bounds, N_LATENCY, per);
    cr_assert(eq(dbl, h.count, sizeof durations_us / sizeof durations_us[0]));
    cr_assert(eq(dbl, h.sum, (double)total_us / 1e6), "_sum %.17g", h.sum);
    cr_assert(eq(u64, per[N_LATENCY], 1), "20 s is past the last bound: only in +Inf");
    cr_assert(eq(dbl, histogram(&e, "drey_request_duration_seconds", methods[GET]).count, 0),
              "other methods keep their own histogram");
    expo_free(&e);
}

/* _sum in whole microseconds, rounded: 249 us as a double of seconds is
 * just below 0.000249, and truncation made it 248. */
Test(metrics, the_sum_is_rounded_to_the_microsecond) {
    drey_metrics_set_methods(m, methods, N_METHODS);
    drey_metrics_observe_call(m, SET, 0, 249000);
    drey_metrics_observe_call(m, SET, 0, 1500); /* 1.5 us rounds to 2 */
    expo e;
    scrape(&e);
    hist h = histogram(&e, "drey_request_duration_seconds", methods[SET]);
    cr_assert(eq(dbl, h.sum, 0.000251), "_sum %.17g", h.sum);
    expo_free(&e);
}

/* A duration below zero (a clock stepping back) counts as zero: converted
 * to unsigned it was undefined and wrapped the sum backwards. */
Test(metrics, a_negative_duration_counts_as_zero) {
    drey_metrics_set_methods(m, methods, N_METHODS);
    drey_metrics_observe_call(m, SET, 0, us(5000));
    drey_metrics_observe_call(m, SET, 0, -us(2000));
    expo e;
    scrape(&e);
    hist h = histogram(&e, "drey_request_duration_seconds", methods[SET]);
    cr_assert(eq(dbl, h.count, 2));
    cr_assert(eq(dbl, h.sum, 0.005), "_sum %.17g", h.sum);
    cr_assert(eq(dbl, h.cumulative[0], 1), "the zero is in the first bucket");
    expo_free(&e);
}

/* --- rejections ----------------------------------------------------------- */

Test(metrics, rejections_are_counted_by_stage_and_reason) {
    /* Same text at another address: the series is found by content. */
    char stage_copy[] = "backpressure", reason_copy[] = "queue_full";
    drey_metrics_observe_rejection(m, "auth", "unauthenticated");
    drey_metrics_observe_rejection(m, "auth", "unauthenticated");
    drey_metrics_observe_rejection(m, "backpressure", "queue_full");
    drey_metrics_observe_rejection(m, "backpressure", "principal_limit");
    drey_metrics_observe_rejection(m, stage_copy, reason_copy);
    drey_metrics_observe_rejection(m, "backpressure", "queue_full");
    drey_metrics_observe_rejection(m, "memory", "queue_full");
    expo e;
    scrape(&e);
    cr_assert(eq(sz, count_named(&e, "drey_rejections_total"), 4));
    cr_assert(eq(dbl, value(&e, "drey_rejections_total", "stage", "auth", "reason", "unauthenticated", NULL), 2));
    cr_assert(eq(dbl, value(&e, "drey_rejections_total", "stage", "backpressure", "reason", "queue_full", NULL), 3));
    cr_assert(eq(dbl, value(&e, "drey_rejections_total", "stage", "backpressure", "reason", "principal_limit", NULL),
                 1));
    cr_assert(eq(dbl, value(&e, "drey_rejections_total", "stage", "memory", "reason", "queue_full", NULL), 1));
    expo_free(&e);
}

/* Cardinality stays bounded whatever the callers pass: kinds past the table
 * are dropped, the ones already there keep counting. */
Test(metrics, rejection_kinds_are_bounded) {
    static char reasons[MAX_REJECTION_KINDS + 6][16]; /* kept by pointer: must outlive m */
    for (size_t i = 0; i < sizeof reasons / sizeof reasons[0]; i++) {
        snprintf(reasons[i], sizeof reasons[i], "r%zu", i);
        drey_metrics_observe_rejection(m, "test", reasons[i]);
    }
    drey_metrics_observe_rejection(m, "test", reasons[0]);
    drey_metrics_observe_rejection(m, "test", reasons[MAX_REJECTION_KINDS]);
    expo e;
    scrape(&e);
    cr_assert(eq(sz, count_named(&e, "drey_rejections_total"), MAX_REJECTION_KINDS));
    cr_assert(eq(dbl, value(&e, "drey_rejections_total", "stage", "test", "reason", reasons[0], NULL), 2));
    cr_assert(eq(dbl, value(&e, "drey_rejections_total", "stage", "test", "reason", reasons[MAX_REJECTION_KINDS - 1],
                            NULL),
                 1));
    cr_assert_null(find(&e, "drey_rejections_total", "stage", "test", "reason", reasons[MAX_REJECTION_KINDS], NULL));
    expo_free(&e);
}

/* --- label escaping ------------------------------------------------------- */

/* Backslash, double quote and newline are the three characters the text
 * format escapes in label values; anything else passes through. */
Test(metrics, label_values_are_escaped) {
    static const char method[] = "/odd.Svc/Get\"\\\n\xc3\xa9";
    static const char stage[] = "a\\b";
    static const char reason[] = "say \"hi\"\nbye";
    const char *names[] = {method};
    drey_metrics_set_methods(m, names, 1);
    drey_metrics_observe_call(m, 0, 0, us(100));
    drey_metrics_observe_rejection(m, stage, reason);
    expo e;
    scrape(&e); /* a raw newline in a value would split the line and fail the parse */
    cr_assert(eq(dbl, value(&e, "drey_requests_total", "method", method, "code", "OK", NULL), 1));
    cr_assert(eq(dbl, histogram(&e, "drey_request_duration_seconds", method).count, 1));
    cr_assert(eq(dbl, value(&e, "drey_rejections_total", "stage", stage, "reason", reason, NULL), 1));
    cr_assert_not_null(strstr(e.text, "drey_rejections_total{stage=\"a\\\\b\",reason=\"say \\\"hi\\\"\\nbye\"} 1\n"),
                       "%s", e.text);
    cr_assert_not_null(strstr(e.text, "method=\"/odd.Svc/Get\\\"\\\\\\n\xc3\xa9\""), "%s", e.text);
    expo_free(&e);
}

Test(metrics, the_label_helper_escapes_and_joins_pairs) {
    char buf[256];
    drey_metrics_labels(buf, sizeof buf, "k", "a\"b\\c\nd", "empty", "", "plain", "v", NULL);
    cr_assert(eq(str, buf, "k=\"a\\\"b\\\\c\\nd\",empty=\"\",plain=\"v\""));
    drey_metrics_labels(buf, sizeof buf, NULL);
    cr_assert(eq(str, buf, ""));
}

/* Whatever the length of the values, the helper stays inside its buffer
 * and leaves it terminated. */
Test(metrics, the_label_helper_never_writes_past_its_buffer) {
    struct {
        char buf[32];
        char guard[32];
    } b;
    memset(b.guard, 0x5a, sizeof b.guard);
    char long_value[2000];
    memset(long_value, '"', sizeof long_value - 1);
    long_value[sizeof long_value - 1] = '\0';
    drey_metrics_labels(b.buf, sizeof b.buf, "first", "x", "second", long_value, NULL);
    cr_assert(lt(sz, strnlen(b.buf, sizeof b.buf), sizeof b.buf));
    for (size_t i = 0; i < sizeof b.guard; i++)
        cr_assert(eq(u8, (uint8_t)b.guard[i], 0x5a), "guard byte %zu overwritten", i);
    cr_assert(eq(str, b.buf, "first=\"x\""), "the pairs that fit are kept, and no half of the next");
}

/* --- journal histograms --------------------------------------------------- */

Test(metrics, the_journal_histograms_follow_each_batch) {
    static const struct {
        size_t records;
        int64_t fsync_us;
    } batches[] = {
        {1, 0}, {3, 300}, {1024, 50}, {1025, 1000000}, {0, 2000000}, {64, 100}, {65, 0},
    };
    uint64_t per_batch[N_BATCH + 1] = {0}, per_fsync[N_FSYNC + 1] = {0};
    size_t records = 0, synced = 0;
    int64_t fsync_total = 0;
    for (size_t i = 0; i < sizeof batches / sizeof batches[0]; i++) {
        drey_metrics_observe_batch(m, batches[i].records, batches[i].fsync_us);
        per_batch[bucket_of(batch_bounds, N_BATCH, (double)batches[i].records)]++;
        records += batches[i].records;
        if (batches[i].fsync_us > 0) { /* 0: the batch was not synced */
            per_fsync[bucket_of(fsync_bounds, N_FSYNC, (double)batches[i].fsync_us / 1e6)]++;
            fsync_total += batches[i].fsync_us;
            synced++;
        }
    }
    expo e;
    scrape(&e);
    hist b = histogram(&e, "drey_journal_batch_records", NULL);
    assert_buckets(&b, batch_bounds, N_BATCH, per_batch);
    cr_assert(eq(dbl, b.count, sizeof batches / sizeof batches[0]));
    cr_assert(eq(dbl, b.sum, (double)records));
    hist f = histogram(&e, "drey_journal_fsync_duration_seconds", NULL);
    assert_buckets(&f, fsync_bounds, N_FSYNC, per_fsync);
    cr_assert(eq(dbl, f.count, synced));
    cr_assert(eq(dbl, f.sum, (double)fsync_total / 1e6), "_sum %.17g", f.sum);
    expo_free(&e);
}

/* --- collectors ----------------------------------------------------------- */

typedef struct collector_ctx {
    const char *name;
    int calls;
} collector_ctx;

static void counting_collector(void *arg, FILE *out) {
    collector_ctx *c = arg;
    c->calls++;
    char labels[64];
    drey_metrics_header(out, c->name, "gauge", "A figure read at scrape time.");
    drey_metrics_labels(labels, sizeof labels, "calls", c->calls == 1 ? "first" : "later", NULL);
    drey_metrics_sample(out, c->name, labels, c->calls);
}

static void values_collector(void *ctx, FILE *out) {
    (void)ctx;
    drey_metrics_header(out, "drey_test_value", "gauge", "Values that must survive the text form.");
    drey_metrics_sample(out, "drey_test_value", "k=\"tenth\"", 0.1);
    drey_metrics_sample(out, "drey_test_value", "k=\"negative\"", -3.25);
    drey_metrics_sample(out, "drey_test_value", "k=\"huge\"", 1e300);
    drey_metrics_sample(out, "drey_test_value", "k=\"tiny\"", 5e-324);
    drey_metrics_sample(out, "drey_test_value", "k=\"2^53+2\"", 9007199254740994.0);
    drey_metrics_header(out, "drey_test_up", "gauge", "No labels at all.");
    drey_metrics_sample(out, "drey_test_up", NULL, 1);
    drey_metrics_header(out, "drey_test_empty_labels", "gauge", "Empty labels.");
    drey_metrics_sample(out, "drey_test_empty_labels", "", 2);
}

Test(metrics, collectors_run_at_every_scrape_after_the_built_in_families) {
    collector_ctx a = {"drey_test_a", 0}, b = {"drey_test_b", 0};
    drey_metrics_add_collector(m, counting_collector, &a);
    drey_metrics_add_collector(m, counting_collector, &b);
    cr_assert(eq(int, a.calls, 0), "collectors run at scrape time, not when added");
    expo e1, e2;
    scrape(&e1);
    scrape(&e2);
    cr_assert(eq(int, a.calls, 2));
    cr_assert(eq(int, b.calls, 2));
    cr_assert(eq(sz, e2.n_families, 8));
    cr_assert(eq(str, e2.families[6].name, "drey_test_a"), "in the order they were added, after the built-ins");
    cr_assert(eq(str, e2.families[7].name, "drey_test_b"));
    cr_assert(eq(dbl, value(&e1, "drey_test_a", "calls", "first", NULL), 1));
    cr_assert(eq(dbl, value(&e2, "drey_test_b", "calls", "later", NULL), 2));
    expo_free(&e1);
    expo_free(&e2);
}

/* Gauges are doubles: the text must give back the same double, and a sample
 * without labels has no braces at all. */
Test(metrics, sample_values_round_trip_exactly) {
    drey_metrics_add_collector(m, values_collector, NULL);
    expo e;
    scrape(&e);
    cr_assert(eq(dbl, value(&e, "drey_test_value", "k", "tenth", NULL), 0.1));
    cr_assert(eq(dbl, value(&e, "drey_test_value", "k", "negative", NULL), -3.25));
    cr_assert(eq(dbl, value(&e, "drey_test_value", "k", "huge", NULL), 1e300));
    cr_assert(eq(dbl, value(&e, "drey_test_value", "k", "tiny", NULL), 5e-324));
    cr_assert(eq(dbl, value(&e, "drey_test_value", "k", "2^53+2", NULL), 9007199254740994.0));
    cr_assert_not_null(strstr(e.text, "\ndrey_test_up 1\n"));
    cr_assert_not_null(strstr(e.text, "\ndrey_test_empty_labels 2\n"));
    expo_free(&e);
}

/* --- concurrency ---------------------------------------------------------- */

#define THREADS 8
#define PER_THREAD 4000

static const int64_t thread_durations_us[] = {1, 50, 100, 150, 300, 2500, 1000000, 20000000};
#define N_DURATIONS (sizeof thread_durations_us / sizeof thread_durations_us[0])
static const char *const thread_reasons[] = {"queue_full", "principal_limit", "draining", "memory", "disk"};
#define N_REASONS (sizeof thread_reasons / sizeof thread_reasons[0])

/* What thread t does at step i; the test replays it to know the totals. */
static size_t step_method(int t, int i) {
    return (size_t)(t + i) % N_METHODS;
}
static int step_code(int t, int i) {
    return (t * 7 + i) % 5 == 0 ? 14 : 0;
}
static int64_t step_duration_us(int t, int i) {
    return thread_durations_us[(size_t)(t + 3 * i) % N_DURATIONS];
}
static const char *step_reason(int t, int i) {
    return thread_reasons[(size_t)(t + i) % N_REASONS];
}
static size_t step_records(int t, int i) {
    return (size_t)(1 + (t + i) % 40);
}
static int64_t step_fsync_us(int t, int i) {
    return (t + i) % 3 == 0 ? 0 : 100;
}

typedef struct worker {
    int t;
    int steps; /* how many it did */
    pthread_barrier_t *go;
    atomic_bool *stop; /* NULL: exactly PER_THREAD steps */
} worker;

static void *observe_steps(void *arg) {
    worker *w = arg;
    pthread_barrier_wait(w->go);
    int i;
    for (i = 0; i < PER_THREAD || (w->stop != NULL && !atomic_load(w->stop)); i++) {
        drey_metrics_observe_call(m, step_method(w->t, i), step_code(w->t, i), us(step_duration_us(w->t, i)));
        /* Every thread's first steps race to insert the same new kinds. */
        drey_metrics_observe_rejection(m, "backpressure", step_reason(w->t, i));
        drey_metrics_observe_batch(m, step_records(w->t, i), step_fsync_us(w->t, i));
    }
    w->steps = i;
    return NULL;
}

/* Runs n workers and fills steps[] with what each did. With `during`, this
 * thread calls it `rounds` times while the workers record: they keep going
 * until it is done, so every round overlaps them. */
static void run_workers(int n, int steps[], void (*during)(void *), void *ctx, int rounds) {
    pthread_t th[THREADS];
    worker w[THREADS];
    pthread_barrier_t go;
    atomic_bool stop = false;
    cr_assert(eq(int, pthread_barrier_init(&go, NULL, (unsigned)n + 1), 0));
    for (int t = 0; t < n; t++) {
        w[t] = (worker){.t = t, .go = &go, .stop = during != NULL ? &stop : NULL};
        cr_assert(eq(int, pthread_create(&th[t], NULL, observe_steps, &w[t]), 0));
    }
    pthread_barrier_wait(&go);
    for (int r = 0; during != NULL && r < rounds; r++)
        during(ctx);
    atomic_store(&stop, true);
    for (int t = 0; t < n; t++) {
        cr_assert(eq(int, pthread_join(th[t], NULL), 0));
        steps[t] = w[t].steps;
    }
    pthread_barrier_destroy(&go);
}

/* Checks the scrape holds exactly what n workers did, steps[t] each. */
static void assert_totals(const expo *e, int n, const int steps[]) {
    uint64_t calls[N_METHODS][N_CODES] = {{0}};
    uint64_t lat[N_METHODS][N_LATENCY + 1] = {{0}};
    int64_t lat_us[N_METHODS] = {0};
    uint64_t rejections[N_REASONS] = {0};
    uint64_t per_batch[N_BATCH + 1] = {0}, per_fsync[N_FSYNC + 1] = {0};
    uint64_t records = 0, synced = 0;
    int64_t fsync_us = 0;
    for (int t = 0; t < n; t++) {
        for (int i = 0; i < steps[t]; i++) {
            size_t mt = step_method(t, i);
            calls[mt][step_code(t, i)]++;
            lat[mt][bucket_of(latency_bounds, N_LATENCY, (double)step_duration_us(t, i) / 1e6)]++;
            lat_us[mt] += step_duration_us(t, i);
            rejections[(size_t)(t + i) % N_REASONS]++;
            per_batch[bucket_of(batch_bounds, N_BATCH, (double)step_records(t, i))]++;
            records += step_records(t, i);
            if (step_fsync_us(t, i) > 0) {
                per_fsync[bucket_of(fsync_bounds, N_FSYNC, (double)step_fsync_us(t, i) / 1e6)]++;
                fsync_us += step_fsync_us(t, i);
                synced++;
            }
        }
    }
    for (size_t mt = 0; mt < N_METHODS; mt++) {
        for (int c = 0; c < N_CODES; c++) {
            const sample *s = find(e, "drey_requests_total", "method", methods[mt], "code", code_names[c], NULL);
            if (calls[mt][c] == 0 && c != 0) {
                cr_assert_null(s, "%s %s never returned", methods[mt], code_names[c]);
                continue;
            }
            cr_assert_not_null(s);
            cr_assert(eq(dbl, s->value, (double)calls[mt][c]), "%s %s", methods[mt], code_names[c]);
        }
        hist h = histogram(e, "drey_request_duration_seconds", methods[mt]);
        assert_buckets(&h, latency_bounds, N_LATENCY, lat[mt]);
        cr_assert(eq(dbl, h.sum, (double)lat_us[mt] / 1e6), "%s _sum %.17g", methods[mt], h.sum);
    }
    cr_assert(eq(sz, count_named(e, "drey_rejections_total"), N_REASONS), "one series per kind, even when raced");
    for (size_t r = 0; r < N_REASONS; r++) {
        cr_assert(eq(dbl, value(e, "drey_rejections_total", "stage", "backpressure", "reason", thread_reasons[r], NULL),
                     (double)rejections[r]));
    }
    hist b = histogram(e, "drey_journal_batch_records", NULL);
    assert_buckets(&b, batch_bounds, N_BATCH, per_batch);
    cr_assert(eq(dbl, b.sum, (double)records));
    hist f = histogram(e, "drey_journal_fsync_duration_seconds", NULL);
    assert_buckets(&f, fsync_bounds, N_FSYNC, per_fsync);
    cr_assert(eq(dbl, f.count, (double)synced));
    cr_assert(eq(dbl, f.sum, (double)fsync_us / 1e6));
}

Test(metrics, concurrent_observations_are_all_counted, .timeout = 120) {
    drey_metrics_set_methods(m, methods, N_METHODS);
    int steps[THREADS];
    run_workers(THREADS, steps, NULL, NULL, 0);
    for (int t = 0; t < THREADS; t++)
        cr_assert(eq(int, steps[t], PER_THREAD));
    expo e;
    scrape(&e);
    assert_totals(&e, THREADS, steps);
    expo_free(&e);
}

typedef struct scraper {
    expo prev;
    int scrapes;
} scraper;

static void scrape_and_compare(void *arg) {
    scraper *s = arg;
    expo now;
    scrape(&now);
    /* Each histogram's shape holds in every scrape, +Inf == _count included,
     * though threads record while it is written. */
    for (size_t i = 0; i < N_METHODS; i++)
        histogram(&now, "drey_request_duration_seconds", methods[i]);
    if (s->scrapes++ > 0)
        assert_nothing_went_down(&s->prev, &now);
    expo_free(&s->prev);
    s->prev = now;
}

/* Scrapes taken while threads record still parse, and no counter is ever
 * seen lower than in the scrape before. */
Test(metrics, scrapes_during_observations_never_see_a_counter_go_down, .timeout = 120) {
    drey_metrics_set_methods(m, methods, N_METHODS);
    scraper s = {0};
    int steps[THREADS / 2];
    run_workers(THREADS / 2, steps, scrape_and_compare, &s, 20);
    cr_assert(eq(int, s.scrapes, 20));
    expo e;
    scrape(&e);
    assert_nothing_went_down(&s.prev, &e);
    assert_totals(&e, THREADS / 2, steps);
    expo_free(&s.prev);
    expo_free(&e);
}

/* The process collector: every process_* family Prometheus's client
 * libraries export, with values this process can check for itself, and
 * drey_build_info. It parses as the rest does (HELP, TYPE, samples). */
Test(metrics, the_process_collector_reports_this_process) {
    drey_metrics_add_collector(m, drey_metrics_collect_process, NULL);
    int extra = dup(2); /* one more descriptor open than before */
    expo e;
    scrape(&e);
    cr_assert(eq(str, (char *)family_named(&e, "process_cpu_seconds_total")->type, "counter"));
    cr_assert(ge(dbl, value(&e, "process_cpu_seconds_total", NULL), 0));
    cr_assert(gt(dbl, value(&e, "process_resident_memory_bytes", NULL), 4096));
    cr_assert(ge(dbl, value(&e, "process_virtual_memory_bytes", NULL),
                 value(&e, "process_resident_memory_bytes", NULL)));
    struct rlimit rl;
    cr_assert(eq(int, getrlimit(RLIMIT_NOFILE, &rl), 0));
    cr_assert(eq(dbl, value(&e, "process_max_fds", NULL), (double)rl.rlim_cur));
    cr_assert(ge(dbl, value(&e, "process_open_fds", NULL), 4), "stdin, stdout, stderr and the dup");
    double start = value(&e, "process_start_time_seconds", NULL);
    double now = (double)time(NULL);
    cr_assert(le(dbl, start, now + 1), "started before now");
    cr_assert(gt(dbl, start, now - 3600), "and within the hour (a test process)");
    cr_assert(eq(dbl, value(&e, "drey_build_info", "version", drey_version(), "revision", drey_version_revision(), NULL),
                 1));
    expo_free(&e);
    close(extra);
    scrape(&e);
    expo_free(&e);
}
