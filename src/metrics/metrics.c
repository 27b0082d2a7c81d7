/*
 * metrics — fixed-slot atomics and the text exposition; see
 * include/drey/metrics.h.
 */
#include "drey/metrics.h"

#include <dirent.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "drey/alloc.h"
#include "drey/rpc.h"
#include "drey/version.h"

#define MAX_METHODS 64
#define MAX_CODES 17 /* gRPC's: OK to UNAUTHENTICATED */
#define MAX_REJECTION_KINDS 64
#define MAX_COLLECTORS 16


/* Bucket bounds, in the unit the histogram observes. */
static const double latency_bounds_s[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                          0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10};
static const double fsync_bounds_s[] = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                        0.01,    0.025,  0.05,    0.1,    0.25,  0.5,    1};
static const double batch_bounds[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024};

#define MAX_BOUNDS 16

struct drey_histogram {
    const double *bounds;
    size_t n;
    /* Per bucket, not cumulative; last = +Inf. The count is their sum, read
     * in the same pass, so a scrape under load never shows +Inf != _count. */
    _Atomic uint64_t buckets[MAX_BOUNDS + 1];
    _Atomic uint64_t sum_micro; /* sum in millionths of the unit */
};

typedef struct rejection_kind {
    const char *stage, *reason;
    _Atomic uint64_t count;
} rejection_kind;

struct drey_metrics {
    char *methods[MAX_METHODS];
    size_t n_methods;
    _Atomic uint64_t calls[MAX_METHODS][MAX_CODES];
    drey_histogram latency[MAX_METHODS];

    pthread_mutex_t mu; /* inserting rejection kinds and collectors */
    rejection_kind rejections[MAX_REJECTION_KINDS];
    _Atomic size_t n_rejections;

    drey_histogram fsync, batch, replica_ack;

    struct {
        drey_metrics_collect_fn fn;
        void *ctx;
    } collectors[MAX_COLLECTORS];
    size_t n_collectors;
};

static void hist_init(drey_histogram *h, const double *bounds, size_t n) {
    h->bounds = bounds;
    h->n = n;
}

static void hist_observe(drey_histogram *h, double v) {
    if (!(v > 0))
        v = 0; /* a clock step backwards: a negative would wrap the sum */
    size_t i = 0;
    while (i < h->n && v > h->bounds[i])
        i++;
    atomic_fetch_add_explicit(&h->buckets[i], 1, memory_order_relaxed);
    /* Rounded, not truncated: 249 us is 0.000249 in doubles just below. */
    atomic_fetch_add_explicit(&h->sum_micro, (uint64_t)(v * 1e6 + 0.5), memory_order_relaxed);
}

drey_metrics *drey_metrics_create(void) {
    drey_metrics *m = drey_xcalloc(1, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    for (size_t i = 0; i < MAX_METHODS; i++)
        hist_init(&m->latency[i], latency_bounds_s, sizeof latency_bounds_s / sizeof latency_bounds_s[0]);
    hist_init(&m->fsync, fsync_bounds_s, sizeof fsync_bounds_s / sizeof fsync_bounds_s[0]);
    hist_init(&m->replica_ack, fsync_bounds_s, sizeof fsync_bounds_s / sizeof fsync_bounds_s[0]);
    hist_init(&m->batch, batch_bounds, sizeof batch_bounds / sizeof batch_bounds[0]);
    return m;
}

void drey_metrics_destroy(drey_metrics *m) {
    if (m == NULL)
        return;
    for (size_t i = 0; i < m->n_methods; i++)
        free(m->methods[i]);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void drey_metrics_set_methods(drey_metrics *m, const char *const *names, size_t n) {
    for (size_t i = 0; i < n && i < MAX_METHODS; i++)
        m->methods[i] = drey_xstrdup(names[i]);
    m->n_methods = n < MAX_METHODS ? n : MAX_METHODS;
}

void drey_metrics_observe_call(drey_metrics *m, size_t method, int code, int64_t duration_ns) {
    if (method >= m->n_methods || code < 0 || code >= MAX_CODES)
        return;
    atomic_fetch_add_explicit(&m->calls[method][code], 1, memory_order_relaxed);
    hist_observe(&m->latency[method], (double)duration_ns / 1e9);
}

void drey_metrics_observe_rejection(drey_metrics *m, const char *stage, const char *reason) {
    size_t n = atomic_load_explicit(&m->n_rejections, memory_order_acquire);
    for (size_t i = 0; i < n; i++) {
        rejection_kind *k = &m->rejections[i];
        if (strcmp(k->stage, stage) == 0 && strcmp(k->reason, reason) == 0) {
            atomic_fetch_add_explicit(&k->count, 1, memory_order_relaxed);
            return;
        }
    }
    pthread_mutex_lock(&m->mu);
    n = atomic_load_explicit(&m->n_rejections, memory_order_relaxed);
    size_t i;
    for (i = 0; i < n; i++) {
        if (strcmp(m->rejections[i].stage, stage) == 0 && strcmp(m->rejections[i].reason, reason) == 0)
            break;
    }
    if (i == n && n < MAX_REJECTION_KINDS) {
        /* Stage names and reasons are static strings of the chain and the
         * catalogue: kept by pointer. */
        m->rejections[i].stage = stage;
        m->rejections[i].reason = reason;
        atomic_store_explicit(&m->n_rejections, n + 1, memory_order_release);
    }
    if (i < MAX_REJECTION_KINDS)
        atomic_fetch_add_explicit(&m->rejections[i].count, 1, memory_order_relaxed);
    pthread_mutex_unlock(&m->mu);
}

void drey_metrics_observe_batch(drey_metrics *m, size_t records, int64_t fsync_us) {
    hist_observe(&m->batch, (double)records);
    if (fsync_us > 0)
        hist_observe(&m->fsync, (double)fsync_us / 1e6);
}

void drey_metrics_observe_replica_ack(drey_metrics *m, int64_t us) {
    hist_observe(&m->replica_ack, (double)us / 1e6);
}

void drey_metrics_add_collector(drey_metrics *m, drey_metrics_collect_fn fn, void *ctx) {
    pthread_mutex_lock(&m->mu);
    if (m->n_collectors < MAX_COLLECTORS) {
        m->collectors[m->n_collectors].fn = fn;
        m->collectors[m->n_collectors].ctx = ctx;
        m->n_collectors++;
    }
    pthread_mutex_unlock(&m->mu);
}

/* --- exposition ----------------------------------------------------------- */

void drey_metrics_header(FILE *out, const char *name, const char *type, const char *help) {
    fprintf(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void drey_metrics_sample(FILE *out, const char *name, const char *labels, double value) {
    fprintf(out, "%s%s%s%s %.17g\n", name, labels != NULL && labels[0] ? "{" : "", labels != NULL ? labels : "",
            labels != NULL && labels[0] ? "}" : "", value);
}

static size_t escape_label(char *buf, size_t cap, const char *v) {
    size_t n = 0;
    for (; *v != '\0' && n + 2 < cap; v++) {
        if (*v == '\\' || *v == '"') {
            buf[n++] = '\\';
            buf[n++] = *v;
        } else if (*v == '\n') {
            buf[n++] = '\\';
            buf[n++] = 'n';
        } else {
            buf[n++] = *v;
        }
    }
    buf[n] = '\0';
    return n;
}

void drey_metrics_labels(char *buf, size_t cap, ...) {
    va_list ap;
    va_start(ap, cap);
    size_t n = 0;
    buf[0] = '\0';
    const char *k;
    while ((k = va_arg(ap, const char *)) != NULL) {
        const char *v = va_arg(ap, const char *);
        char esc[512];
        escape_label(esc, sizeof esc, v);
        int w = snprintf(buf + n, cap - n, "%s%s=\"%s\"", n ? "," : "", k, esc);
        if (w < 0 || (size_t)w >= cap - n) {
            buf[n] = '\0'; /* no half pair: an unclosed quote breaks the exposition */
            break;
        }
        n += (size_t)w;
    }
    va_end(ap);
}

static void write_histogram(FILE *out, const char *name, const char *labels, drey_histogram *h) {
    char le[64], lbl[1024];
    uint64_t cumulative = 0;
    for (size_t i = 0; i <= h->n; i++) {
        cumulative += atomic_load_explicit(&h->buckets[i], memory_order_relaxed);
        if (i < h->n)
            snprintf(le, sizeof le, "%g", h->bounds[i]);
        else
            snprintf(le, sizeof le, "+Inf");
        snprintf(lbl, sizeof lbl, "%s%sle=\"%s\"", labels, labels[0] ? "," : "", le);
        fprintf(out, "%s_bucket{%s} %llu\n", name, lbl, (unsigned long long)cumulative);
    }
    char sumname[128];
    snprintf(sumname, sizeof sumname, "%s_sum", name);
    drey_metrics_sample(out, sumname, labels,
                        (double)atomic_load_explicit(&h->sum_micro, memory_order_relaxed) / 1e6);
    snprintf(sumname, sizeof sumname, "%s_count", name);
    drey_metrics_sample(out, sumname, labels, (double)cumulative);
}

/* --- the process: the names and meanings every Prometheus client library
 * uses (process_*), read from /proc at scrape time. ------------------------ */

/* Fields 22 (starttime, clock ticks after boot), 23 (vsize, bytes) and 24
 * (rss, pages) of /proc/self/stat; false when unreadable. */
static bool read_stat(double *start_ticks, double *vsize, double *rss_pages) {
    FILE *f = fopen("/proc/self/stat", "r");
    if (f == NULL)
        return false;
    char buf[1024];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* The command name may hold spaces and parentheses: fields are counted
     * after the last ')', which ends field 2. */
    char *p = strrchr(buf, ')');
    if (p == NULL)
        return false;
    unsigned long long v[22];
    int field = 3;
    for (p++; field <= 24 && *p != '\0'; field++) {
        while (*p == ' ')
            p++;
        char *end;
        unsigned long long x = strtoull(p, &end, 10);
        if (end == p && field != 3)
            return false;
        if (field >= 22)
            v[field - 22] = x;
        p = end == p ? p + 1 : end;
    }
    if (field <= 24)
        return false;
    *start_ticks = (double)v[0];
    *vsize = (double)v[1];
    *rss_pages = (double)v[2];
    return true;
}

/* The boot time, seconds since the epoch (btime in /proc/stat); 0 if unknown. */
static double boot_time(void) {
    FILE *f = fopen("/proc/stat", "r");
    if (f == NULL)
        return 0;
    char line[256];
    double bt = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        if (strncmp(line, "btime ", 6) == 0) {
            bt = strtod(line + 6, NULL);
            break;
        }
    }
    fclose(f);
    return bt;
}

static long open_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return -1;
    long n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1; /* the directory's own descriptor */
}

void drey_metrics_collect_process(void *ctx, FILE *out) {
    (void)ctx;
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        drey_metrics_header(out, "process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.");
        drey_metrics_sample(out, "process_cpu_seconds_total", NULL,
                            (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                                (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6);
    }
    double start, vsize, rss;
    if (read_stat(&start, &vsize, &rss)) {
        drey_metrics_header(out, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
        drey_metrics_sample(out, "process_resident_memory_bytes", NULL, rss * (double)sysconf(_SC_PAGESIZE));
        drey_metrics_header(out, "process_virtual_memory_bytes", "gauge", "Virtual memory size in bytes.");
        drey_metrics_sample(out, "process_virtual_memory_bytes", NULL, vsize);
        double bt = boot_time();
        if (bt > 0) {
            drey_metrics_header(out, "process_start_time_seconds", "gauge",
                                "Start time of the process since unix epoch in seconds.");
            drey_metrics_sample(out, "process_start_time_seconds", NULL, bt + start / (double)sysconf(_SC_CLK_TCK));
        }
    }
    long fds = open_fds();
    if (fds >= 0) {
        drey_metrics_header(out, "process_open_fds", "gauge", "Number of open file descriptors.");
        drey_metrics_sample(out, "process_open_fds", NULL, (double)fds);
    }
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        drey_metrics_header(out, "process_max_fds", "gauge", "Maximum number of open file descriptors.");
        drey_metrics_sample(out, "process_max_fds", NULL,
                            rl.rlim_cur == RLIM_INFINITY ? (double)INT64_MAX : (double)rl.rlim_cur);
    }
    char labels[512];
    drey_metrics_labels(labels, sizeof labels, "version", drey_version(), "revision", drey_version_revision(), NULL);
    drey_metrics_header(out, "drey_build_info", "gauge",
                        "Always 1: the version and git revision of this dreyd (dreyd --version).");
    drey_metrics_sample(out, "drey_build_info", labels, 1);
}

void drey_metrics_write(drey_metrics *m, FILE *out) {
    char labels[512];
    drey_metrics_header(out, "drey_requests_total", "counter", "Calls finished, by method and gRPC status code.");
    for (size_t i = 0; i < m->n_methods; i++) {
        for (int c = 0; c < MAX_CODES; c++) {
            uint64_t v = atomic_load_explicit(&m->calls[i][c], memory_order_relaxed);
            if (v == 0 && c != 0)
                continue; /* sparse: codes a method never returned are omitted */
            drey_metrics_labels(labels, sizeof labels, "method", m->methods[i], "code", drey_rpc_code_name((grpc_status_code)c), NULL);
            drey_metrics_sample(out, "drey_requests_total", labels, (double)v);
        }
    }
    drey_metrics_header(out, "drey_request_duration_seconds", "histogram",
                        "Time from a call's arrival to its reply, by method.");
    for (size_t i = 0; i < m->n_methods; i++) {
        drey_metrics_labels(labels, sizeof labels, "method", m->methods[i], NULL);
        write_histogram(out, "drey_request_duration_seconds", labels, &m->latency[i]);
    }
    drey_metrics_header(out, "drey_rejections_total", "counter",
                        "Calls refused by a stage of the request chain, by stage and reason.");
    size_t n = atomic_load_explicit(&m->n_rejections, memory_order_acquire);
    for (size_t i = 0; i < n; i++) {
        drey_metrics_labels(labels, sizeof labels, "stage", m->rejections[i].stage, "reason",
                            m->rejections[i].reason, NULL);
        drey_metrics_sample(out, "drey_rejections_total", labels,
                            (double)atomic_load_explicit(&m->rejections[i].count, memory_order_relaxed));
    }
    drey_metrics_header(out, "drey_journal_fsync_duration_seconds", "histogram",
                        "Duration of the journal's fdatasync, one per group-commit batch.");
    write_histogram(out, "drey_journal_fsync_duration_seconds", "", &m->fsync);
    drey_metrics_header(out, "drey_journal_batch_records", "histogram", "Records per group-commit batch.");
    write_histogram(out, "drey_journal_batch_records", "", &m->batch);
    drey_metrics_header(out, "drey_cluster_replication_ack_seconds", "histogram",
                        "From sending a record to a backup to its acknowledgement (durable there).");
    write_histogram(out, "drey_cluster_replication_ack_seconds", "", &m->replica_ack);
    pthread_mutex_lock(&m->mu);
    size_t nc = m->n_collectors;
    pthread_mutex_unlock(&m->mu);
    for (size_t i = 0; i < nc; i++)
        m->collectors[i].fn(m->collectors[i].ctx, out);
}
