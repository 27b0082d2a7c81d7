/*
 * stream — the commands that read a stream until it ends or the user
 * interrupts it: watch (the changes of keys, a prefix or the whole cache)
 * and pipeline (operations from standard input on one Pipeline stream,
 * answered in order), and the signal thread that ends them cleanly.
 */
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cli.h"
#include "drey/cache/v1/cache.pb-c.h"
#include "pbdyn.h"

/* Signals: SIGINT and SIGTERM are blocked from the start (before gRPC makes
 * its threads) and taken by one thread: it cancels the stream a command is
 * reading (watch, call), which then ends normally, or else exits as an
 * interrupted program does. SIGUSR2 ends the thread at exit. */
static pthread_mutex_t sig_mu = PTHREAD_MUTEX_INITIALIZER;
static drey_client_stream *sig_stream; /* the stream being read, under sig_mu */
static drey_cli_interrupter *sig_owner;
static pthread_t sig_thread;
static sigset_t sig_set;

static void *signal_thread(void *arg) {
    (void)arg;
    for (;;) {
        int sig;
        if (sigwait(&sig_set, &sig) != 0)
            continue;
        if (sig == SIGUSR2)
            return NULL;
        pthread_mutex_lock(&sig_mu);
        if (sig_stream != NULL) {
            sig_owner->fired = 1;
            drey_client_stream_cancel(sig_stream);
            pthread_mutex_unlock(&sig_mu);
            continue;
        }
        pthread_mutex_unlock(&sig_mu);
        fflush(stdout);
        _exit(128 + sig);
    }
}

void drey_cli_signals_start(void) {
    sigemptyset(&sig_set);
    sigaddset(&sig_set, SIGINT);
    sigaddset(&sig_set, SIGTERM);
    sigaddset(&sig_set, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &sig_set, NULL);
    pthread_create(&sig_thread, NULL, signal_thread, NULL);
}

void drey_cli_signals_stop(void) {
    pthread_kill(sig_thread, SIGUSR2);
    pthread_join(sig_thread, NULL);
}

void drey_cli_interrupter_start(drey_cli_interrupter *it, drey_client_stream *s) {
    it->fired = 0;
    pthread_mutex_lock(&sig_mu);
    sig_stream = s;
    sig_owner = it;
    pthread_mutex_unlock(&sig_mu);
}

/* Before the stream is finished (freed). */
void drey_cli_interrupter_stop(drey_cli_interrupter *it) {
    (void)it;
    pthread_mutex_lock(&sig_mu);
    sig_stream = NULL;
    sig_owner = NULL;
    pthread_mutex_unlock(&sig_mu);
}

/* --- watch ---------------------------------------------------------------------------- */

int drey_cli_cmd_watch(drey_cli *c, char **a) {
    Drey__Cache__V1__WatchRequest req = DREY__CACHE__V1__WATCH_REQUEST__INIT;
    req.cache = (char *)c->cache;
    for (req.n_keys = 0; a[req.n_keys] != NULL; req.n_keys++) {
    }
    req.keys = a;
    req.prefix = (char *)(drey_cli_opt(c, "prefix") != NULL ? drey_cli_opt(c, "prefix") : "");
    req.include_values = drey_cli_opt(c, "values") != NULL;
    if (req.n_keys > 0 && req.prefix[0] != '\0') {
        fprintf(stderr, "drey: watch: KEYs or --prefix, not both\n");
        return DREY_EXIT_USAGE;
    }
    uint64_t limit = 0;
    if (drey_cli_opt(c, "count") != NULL && !drey_cli_parse_uint64(drey_cli_opt(c, "count"), &limit)) {
        fprintf(stderr, "drey: --count: expected a number of events\n");
        return DREY_EXIT_USAGE;
    }
    drey_client_status st;
    drey_client *cl = drey_cli_stream_client(c, &st);
    if (cl == NULL)
        return drey_cli_report(c, &st);
    drey_client_stream *s = drey_client_watch(cl, &req, c->timeout_given ? c->timeout_ms : DREY_CLIENT_NO_DEADLINE, &st);
    if (s == NULL)
        return drey_cli_report(c, &st);
    drey_cli_interrupter it;
    drey_cli_interrupter_start(&it, s);
    static const char *const cols[] = {"event", "key", "version", "value", NULL};
    drey_out o;
    /* A table cannot wait for the end of a stream: rows print as text. */
    drey_out_begin(&o, c->format == DREY_OUT_TABLE ? DREY_OUT_TEXT : c->format, stdout, cols);
    uint64_t seen = 0;
    drey_arena ev_arena;
    drey_arena_init(&ev_arena, NULL, 0);
    Drey__Cache__V1__WatchEvent *ev;
    while ((limit == 0 || seen < limit) &&
           drey_client_stream_read(s, &drey__cache__v1__watch_event__descriptor, &ev_arena, (ProtobufCMessage **)&ev)) {
        const ProtobufCEnumValue *k =
            protobuf_c_enum_descriptor_get_value(&drey__cache__v1__watch_event__kind__descriptor, (int)ev->kind);
        json_t *row = json_pack("{ssssss}", "event", k != NULL ? k->name : "UNKNOWN", "cache",
                                ev->cache[0] ? ev->cache : "default", "key", ev->key);
        json_object_set_new(row, "version", json_integer((json_int_t)ev->version));
        if (ev->value != NULL)
            drey_cli_put_value(c, row, ev->value);
        if (ev->expires_at != NULL)
            json_object_set_new(row, "expiresAt", drey_cli_timestamp(ev->expires_at));
        json_object_set_new(row, "sequence", json_integer((json_int_t)ev->sequence));
        if (ev->kind == DREY__CACHE__V1__WATCH_EVENT__KIND__WATCHING)
            json_object_set_new(row, "feed", json_integer((json_int_t)ev->feed));
        if (ev->reason[0] != '\0')
            json_object_set_new(row, "reason", json_string(ev->reason));
        drey_out_row(&o, row);
        drey_arena_reset(&ev_arena);
        seen++;
    }
    drey_cli_interrupter_stop(&it);
    drey_client_stream_cancel(s);
    drey_client_stream_finish(s, &ev_arena, &st);
    int rc = DREY_EXIT_OK;
    if (!it.fired && (limit == 0 || seen < limit) && st.code != GRPC_STATUS_OK && st.code != GRPC_STATUS_CANCELLED)
        rc = drey_cli_report(c, &st);
    drey_arena_destroy(&ev_arena);
    return rc;
}

/* --- pipeline ------------------------------------------------------------------------- */

/* Prints the results that have arrived (all of them when wait). */
static int pipeline_drain(drey_client_pipeline *p, drey_pb_pool *pool, drey_out *o, uint64_t *printed,
                          uint64_t sent, bool wait, drey_arena *a) {
    int rc = DREY_EXIT_OK;
    Drey__Cache__V1__PipelineResponse *resp;
    while (*printed < sent && drey_client_pipeline_next(p, wait ? DREY_CLIENT_NO_DEADLINE : 0, a, &resp)) {
        for (size_t i = 0; i < resp->n_results; i++) {
            const Drey__Cache__V1__PipelineResult *res = resp->results[i];
            drey_client_status st;
            json_t *row = json_pack("{sI}", "line", (json_int_t)res->id);
            if (drey_client_pipeline_result_status(res, a, &st) != GRPC_STATUS_OK) {
                json_object_set_new(row, "code", json_string(drey_client_code_name(st.code)));
                json_object_set_new(row, "error", drey_cli_status_json(&st));
                rc = DREY_EXIT_FAILED;
            } else {
                json_object_set_new(row, "code", json_string("OK"));
                const ProtobufCMessage *m = drey_client_pipeline_result_response(res);
                json_object_set_new(row, "response", m != NULL ? drey_pb_message_json(pool, m) : json_object());
            }
            drey_out_row(o, row);
            (*printed)++;
        }
        drey_arena_reset(a);
    }
    return rc;
}

/* Operations from standard input, one a line, sent on one Pipeline stream;
 * the answers in order, each with its line number. */
int drey_cli_cmd_pipeline(drey_cli *c, char **a) {
    (void)a;
    drey_client_status st;
    drey_client *cl = drey_cli_stream_client(c, &st);
    if (cl == NULL)
        return drey_cli_report(c, &st);
    drey_client_pipeline *p =
        drey_client_pipeline_open(cl, c->timeout_given ? c->timeout_ms : DREY_CLIENT_NO_DEADLINE, &st);
    if (p == NULL)
        return drey_cli_report(c, &st);
    drey_pb_pool *pool = drey_pb_pool_builtin();
    static const char *const cols[] = {"line", "code", "response", NULL};
    static const char *const ecols[] = {"line", "code", "error", NULL};
    (void)ecols;
    drey_out o;
    drey_out_begin(&o, c->format == DREY_OUT_TABLE ? DREY_OUT_TEXT : c->format, stdout, cols);
    drey_arena ra;
    drey_arena_init(&ra, NULL, 0);
    char *line = NULL;
    size_t cap = 0;
    uint64_t lineno = 0, sent = 0, printed = 0;
    int rc = DREY_EXIT_OK, r;
    while (getline(&line, &cap, stdin) > 0) {
        lineno++;
        char **w, *buf;
        int n = drey_cli_split_words(line, &w, &buf);
        if (n < 0) {
            fprintf(stderr, "drey: pipeline: line %" PRIu64 ": unclosed quote\n", lineno);
            rc = DREY_EXIT_USAGE;
            break;
        }
        if (n == 0 || w[0][0] == '#') {
            free(w);
            free(buf);
            continue;
        }
        char err[512], *args[64];
        drey_cli_op line_op = drey_cli_op_of_words(w, n, args, sizeof args / sizeof args[0]);
        ProtobufCMessage *op = drey_cli_build(c, w[0], &line_op, true, NULL, err, sizeof err);
        free(w);
        free(buf);
        if (op == NULL) {
            fprintf(stderr, "drey: pipeline: line %" PRIu64 ": %s\n", lineno, err);
            rc = DREY_EXIT_USAGE;
            break;
        }
        drey_client_pipeline_add(p, lineno, op, DREY_CLIENT_NO_DEADLINE);
        sent++;
        if (drey_client_pipeline_pending(p) >= 64) {
            drey_client_pipeline_flush(p);
            if ((r = pipeline_drain(p, pool, &o, &printed, sent, false, &ra)) != DREY_EXIT_OK)
                rc = r;
        }
    }
    free(line);
    if (rc == DREY_EXIT_USAGE)
        drey_client_pipeline_cancel(p);
    drey_client_pipeline_close_send(p);
    if (rc != DREY_EXIT_USAGE && (r = pipeline_drain(p, pool, &o, &printed, sent, true, &ra)) != DREY_EXIT_OK)
        rc = r;
    if (drey_client_pipeline_finish(p, &ra, &st) != GRPC_STATUS_OK && rc != DREY_EXIT_USAGE)
        rc = drey_cli_report(c, &st);
    drey_arena_destroy(&ra);
    drey_pb_pool_free(pool);
    return rc;
}

