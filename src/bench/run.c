/*
 * run — the load: one thread per connection, each with its own drey_client
 * (so its own channel, connection and completion queue), keeping --streams
 * asynchronous calls in flight and starting the next call the moment one
 * finishes (a closed loop).
 *
 * With --cluster the main thread watches the target's topology and waits for
 * the first table before the threads start, so every call of the run is
 * routed; each thread's drey_client_cluster opens one connection per node
 * (plus one to the seed for partitions without an owner) and waits on all of
 * them through one queue.
 *
 * Time: all threads open their client, meet at a barrier, then the clock
 * starts. A call is measured when it finishes inside the window [start +
 * warmup, start + warmup + duration); its latency is the client's elapsed
 * time from start_call to the completion being taken. After the window no
 * call is started; those still in flight are drained (for at most the call
 * timeout) and not measured. With --count each thread starts its share of
 * the calls and the window ends with the last completion.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "drey/alloc.h"
#include "drey/arena.h"
#include "drey/bytes.h"
#include "drey/client.h"

#define POLL_MS 50
#define TOPOLOGY_WAIT_MS 10000
#define ARENA_RESET_BYTES (1u << 20)

typedef struct run_shared {
    const drey_bench_options *o;
    drey_client_topology *topo; /* --cluster */
    drey_bench_workload w;
    pthread_barrier_t barrier;
    int64_t start_ns;         /* set by the main thread before the barrier's second round */
    int64_t window_start_ns;
    int64_t window_end_ns;    /* INT64_MAX with --count and no duration */
} run_shared;

typedef struct conn_thread {
    pthread_t tid;
    int index;
    run_shared *sh;
    uint64_t quota;           /* calls to start; UINT64_MAX: until the window ends */
    drey_bench_stats *stats;
    int64_t last_done_ns;     /* last measured completion */
    bool ran_out;             /* stopped starting calls before the window ended (count, one pass) */
    char err[256];
} conn_thread;

static int64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void drey_bench_stats_init(drey_bench_stats *s) {
    memset(s, 0, sizeof *s);
    for (int op = 0; op < DREY_BENCH_N_OPS; op++)
        drey_bench_hist_init(&s->ops[op].latency);
}

void drey_bench_stats_add_error(drey_bench_stats *s, drey_bench_op op, int code, const char *reason, uint64_t n) {
    for (size_t i = 0; i < s->n_error_kinds; i++) {
        drey_bench_error_kind *k = &s->errors[i];
        if (k->op == op && k->code == code && strncmp(k->reason, reason, sizeof k->reason - 1) == 0) {
            k->count += n;
            return;
        }
    }
    if (s->n_error_kinds == DREY_BENCH_MAX_ERROR_KINDS) {
        s->error_kinds_dropped += n;
        return;
    }
    drey_bench_error_kind *k = &s->errors[s->n_error_kinds++];
    k->op = op;
    k->code = code;
    snprintf(k->reason, sizeof k->reason, "%s", reason);
    k->count = n;
}

void drey_bench_stats_merge(drey_bench_stats *dst, const drey_bench_stats *src) {
    for (int op = 0; op < DREY_BENCH_N_OPS; op++) {
        dst->ops[op].ok += src->ops[op].ok;
        dst->ops[op].errors += src->ops[op].errors;
        drey_bench_hist_merge(&dst->ops[op].latency, &src->ops[op].latency);
    }
    for (size_t i = 0; i < src->n_error_kinds; i++)
        drey_bench_stats_add_error(dst, src->errors[i].op, src->errors[i].code, src->errors[i].reason,
                                   src->errors[i].count);
    dst->error_kinds_dropped += src->error_kinds_dropped;
    dst->get_hits += src->get_hits;
    dst->get_misses += src->get_misses;
    dst->start_failures += src->start_failures;
}

/* GetResponse.found (field 1, a varint): a scan of the top-level fields. */
static bool response_found(const uint8_t *p, size_t len) {
    const uint8_t *end = p + len;
    uint64_t tag, v;
    while (p < end && drey_bytes_varint(&p, end, &tag)) {
        uint32_t wire = tag & 7;
        if (tag >> 3 == 1 && wire == 0)
            return drey_bytes_varint(&p, end, &v) && v != 0;
        if (wire == 0) {
            if (!drey_bytes_varint(&p, end, &v))
                return false;
        } else if (wire == 2) {
            if (!drey_bytes_varint(&p, end, &v) || v > (uint64_t)(end - p))
                return false;
            p += v;
        } else if (wire == 1 && end - p >= 8) {
            p += 8;
        } else if (wire == 5 && end - p >= 4) {
            p += 4;
        } else {
            return false;
        }
    }
    return false;
}

/* A thread's connection(s): one client, or a cluster router. */
typedef struct conn {
    drey_client *c;
    drey_client_cluster *cc;
} conn;

static bool conn_start(conn *k, const drey_bench_options *o, const drey_bench_request *req) {
    void *user = (void *)(uintptr_t)req->op;
    if (k->cc != NULL)
        return drey_client_cluster_start_call(k->cc, o->cache, strlen(o->cache), req->key, req->key_len, req->method,
                                              req->data, req->len, o->timeout_ms, user);
    return drey_client_start_call(k->c, req->method, req->data, req->len, o->timeout_ms, user);
}

static bool conn_next(conn *k, drey_arena *arena, drey_client_completion *done) {
    if (k->cc != NULL)
        return drey_client_cluster_next(k->cc, POLL_MS, arena, done);
    return drey_client_next(k->c, POLL_MS, arena, done);
}

static bool start_one(conn *c, drey_bench_gen *g, conn_thread *t, uint64_t *started, bool *exhausted) {
    drey_bench_request req;
    if (!drey_bench_next_request(g, &req)) {
        *exhausted = true;
        return false;
    }
    (*started)++;
    if (!conn_start(c, t->sh->o, &req)) {
        t->stats->start_failures++;
        return false;
    }
    return true;
}

static void record(conn_thread *t, drey_bench_op op, int64_t elapsed_ns, int code, const char *reason, int found) {
    drey_bench_op_stats *s = &t->stats->ops[op];
    drey_bench_hist_record(&s->latency, (uint64_t)elapsed_ns);
    if (code == GRPC_STATUS_OK) {
        s->ok++;
        if (found >= 0) {
            if (found)
                t->stats->get_hits++;
            else
                t->stats->get_misses++;
        }
    } else {
        s->errors++;
        drey_bench_stats_add_error(t->stats, op, code, reason, 1);
    }
}

/* --pipeline: one stream per node the operations go to (the target's;
 * with --cluster each owner's, opened when first routed to) and one batch
 * of N operations, each on its owner's stream, waited for whole
 * (redis-benchmark -P's loop). */
#define MAX_LANES 64

typedef struct lane {
    drey_client *c;
    drey_client_pipeline *p;
    size_t *ops;   /* the batch's operations sent on it, by index */
    size_t n, got;
} lane;

typedef struct lanes {
    lane l[MAX_LANES];
    size_t n;
} lanes;

/* The lane of req's owner (opened if new); NULL with t->err when it could
 * not be opened. */
static lane *lane_of(lanes *ls, conn *k, const drey_bench_request *req, size_t batch, conn_thread *t) {
    const char *cache = t->sh->o->cache;
    drey_client *c = k->cc != NULL ? drey_client_cluster_route(k->cc, cache, strlen(cache), req->key, req->key_len)
                                   : k->c;
    for (size_t i = 0; i < ls->n; i++) {
        if (ls->l[i].c == c)
            return &ls->l[i];
    }
    if (ls->n == MAX_LANES) {
        snprintf(t->err, sizeof t->err, "Pipeline: more than %d nodes", MAX_LANES);
        return NULL;
    }
    drey_client_status st;
    drey_client_pipeline *p = drey_client_pipeline_open(c, DREY_CLIENT_NO_DEADLINE, &st);
    if (p == NULL) {
        snprintf(t->err, sizeof t->err, "Pipeline: %s", st.message);
        return NULL;
    }
    lane *l = &ls->l[ls->n++];
    *l = (lane){.c = c, .p = p, .ops = drey_xcalloc(batch, sizeof *l->ops)};
    return l;
}

/* Reads lane l's results of the batch; false (t->err) when some did not come. */
static bool lane_collect(lane *l, const drey_bench_op *ops, int64_t t0, drey_arena *arena, conn_thread *t) {
    run_shared *sh = t->sh;
    while (l->got < l->n) {
        Drey__Cache__V1__PipelineResponse *resp;
        if (!drey_client_pipeline_next(l->p, sh->o->timeout_ms + 1000, arena, &resp))
            break;
        int64_t now = mono_ns();
        bool measured = now >= sh->window_start_ns && now < sh->window_end_ns;
        for (size_t i = 0; i < resp->n_results && l->got < l->n; i++, l->got++) {
            if (!measured)
                continue;
            const Drey__Cache__V1__PipelineResult *r = resp->results[i];
            drey_bench_op op = ops[l->ops[l->got]];
            drey_client_status rs;
            drey_client_pipeline_result_status(r, arena, &rs);
            int found = op == DREY_BENCH_GET && r->get != NULL ? r->get->found : -1;
            record(t, op, now - t0, rs.code, drey_client_status_reason(&rs), found);
            t->last_done_ns = now;
        }
    }
    if (l->got < l->n) {
        snprintf(t->err, sizeof t->err, "Pipeline: %zu of %zu results did not come", l->n - l->got, l->n);
        return false;
    }
    return true;
}

static void pipeline_loop(conn *k, drey_bench_gen *g, conn_thread *t) {
    run_shared *sh = t->sh;
    const drey_bench_options *o = sh->o;
    size_t n = (size_t)o->pipeline;
    lanes ls = {.n = 0};
    drey_bench_op *ops = drey_xcalloc(n, sizeof *ops);
    drey_arena arena;
    drey_arena_init(&arena, NULL, 0);
    uint64_t started = 0, id = 0;
    bool exhausted = false, failed = false;
    size_t failed_lane = SIZE_MAX;
    while (!failed && started < t->quota && !exhausted && mono_ns() < sh->window_end_ns) {
        size_t b = 0;
        for (size_t i = 0; i < ls.n; i++)
            ls.l[i].n = ls.l[i].got = 0;
        while (b < n && started < t->quota) {
            drey_bench_request req;
            if (!drey_bench_next_request(g, &req)) {
                exhausted = true;
                break;
            }
            lane *l = lane_of(&ls, k, &req, n, t);
            if (l == NULL) {
                failed = true;
                break;
            }
            ops[b] = req.op;
            l->ops[l->n++] = b++;
            started++;
            drey_client_pipeline_add_raw(l->p, ++id, req.method, req.data, req.len, o->timeout_ms);
        }
        if (failed || b == 0)
            break;
        for (size_t i = 0; i < ls.n && !failed; i++)
            failed = ls.l[i].n > 0 && !drey_client_pipeline_flush(ls.l[i].p);
        int64_t t0 = mono_ns();
        for (size_t i = 0; i < ls.n && !failed; i++) {
            failed = !lane_collect(&ls.l[i], ops, t0, &arena, t);
            failed_lane = failed ? i : failed_lane;
        }
        if (arena.allocated > ARENA_RESET_BYTES)
            drey_arena_reset(&arena);
    }
    t->ran_out = exhausted || started >= t->quota;
    for (size_t i = 0; i < ls.n; i++) {
        drey_client_status st;
        /* The stream whose results did not come says why, if it ended: a
         * cancel changes nothing on an ended call. */
        if (i == failed_lane)
            drey_client_pipeline_cancel(ls.l[i].p);
        drey_client_pipeline_finish(ls.l[i].p, &arena, &st);
        if (i == failed_lane && st.code != GRPC_STATUS_CANCELLED) {
            size_t used = strlen(t->err);
            snprintf(t->err + used, sizeof t->err - used, "; the stream ended %s: %s", drey_client_code_name(st.code),
                     st.message);
        }
        free(ls.l[i].ops);
    }
    drey_arena_destroy(&arena);
    free(ops);
}

static void *conn_main(void *arg) {
    conn_thread *t = arg;
    run_shared *sh = t->sh;
    const drey_bench_options *o = sh->o;
    drey_client_options copts = {.target = o->target};
    if (o->n_tokens > 0)
        copts.token = o->tokens[(size_t)t->index % o->n_tokens];
    conn k = {0};
    if (sh->topo != NULL)
        k.cc = drey_client_cluster_open(sh->topo, &copts, t->err, sizeof t->err);
    else
        k.c = drey_client_open(&copts, t->err, sizeof t->err);
    conn *c = &k;
    pthread_barrier_wait(&sh->barrier); /* every client open */
    pthread_barrier_wait(&sh->barrier); /* the clock is set */
    if (k.c == NULL && k.cc == NULL)
        return NULL;

    drey_bench_gen g;
    drey_bench_gen_init(&g, &sh->w, t->index);
    if (o->pipeline > 0) {
        pipeline_loop(c, &g, t);
        drey_client_close(k.c);
        drey_client_cluster_close(k.cc);
        drey_bench_gen_free(&g);
        return NULL;
    }
    drey_arena arena;
    drey_arena_init(&arena, NULL, 0);
    uint64_t started = 0;
    bool exhausted = false;
    size_t in_flight = 0;
    for (int i = 0; i < o->streams && started < t->quota && !exhausted; i++) {
        if (start_one(c, &g, t, &started, &exhausted))
            in_flight++;
    }
    int64_t drain_deadline = INT64_MAX;
    while (in_flight > 0) {
        drey_client_completion done;
        if (!conn_next(c, &arena, &done)) {
            int64_t now = mono_ns();
            if (now >= sh->window_end_ns && drain_deadline == INT64_MAX)
                drain_deadline = now + (o->timeout_ms + 1000) * 1000000;
            if (now >= drain_deadline)
                break; /* close cancels the rest */
            continue;
        }
        in_flight--;
        int64_t now = mono_ns();
        drey_bench_op op = (drey_bench_op)(uintptr_t)done.user;
        if (now >= sh->window_start_ns && now < sh->window_end_ns) {
            drey_bench_op_stats *s = &t->stats->ops[op];
            drey_bench_hist_record(&s->latency, (uint64_t)done.elapsed_ns);
            if (done.status.code == GRPC_STATUS_OK) {
                s->ok++;
                if (op == DREY_BENCH_GET) {
                    if (response_found(done.response.data, done.response.len))
                        t->stats->get_hits++;
                    else
                        t->stats->get_misses++;
                }
            } else {
                s->errors++;
                drey_bench_stats_add_error(t->stats, op, done.status.code,
                                           drey_client_status_reason(&done.status), 1);
            }
            t->last_done_ns = now;
        }
        if (arena.allocated > ARENA_RESET_BYTES)
            drey_arena_reset(&arena);
        if (now < sh->window_end_ns && started < t->quota && !exhausted) {
            if (start_one(c, &g, t, &started, &exhausted))
                in_flight++;
        }
    }
    t->ran_out = exhausted || started >= t->quota;
    drey_client_close(k.c);
    drey_client_cluster_close(k.cc);
    drey_arena_destroy(&arena);
    drey_bench_gen_free(&g);
    return NULL;
}

bool drey_bench_run(const drey_bench_options *o, drey_bench_result *r, char *err, size_t err_cap) {
    run_shared *sh = drey_xcalloc(1, sizeof *sh);
    sh->o = o;
    drey_bench_workload_init(&sh->w, o);
    if (o->cluster) {
        sh->topo = drey_client_topology_open(&(drey_client_options){.target = o->target,
                                                                    .token = o->n_tokens > 0 ? o->tokens[0] : NULL},
                                             err, err_cap);
        if (sh->topo == NULL || !drey_client_topology_wait(sh->topo, TOPOLOGY_WAIT_MS)) {
            if (sh->topo != NULL)
                snprintf(err, err_cap, "no topology from %s within %d ms (WatchTopology: is it a cluster node?)",
                         o->target, TOPOLOGY_WAIT_MS);
            drey_client_topology_close(sh->topo);
            drey_bench_workload_free(&sh->w);
            free(sh);
            return false;
        }
    }
    int n = o->connections;
    conn_thread *threads = drey_xcalloc((size_t)n, sizeof *threads);
    pthread_barrier_init(&sh->barrier, NULL, (unsigned)n + 1);
    for (int i = 0; i < n; i++) {
        conn_thread *t = &threads[i];
        t->index = i;
        t->sh = sh;
        t->stats = drey_xmalloc(sizeof *t->stats);
        drey_bench_stats_init(t->stats);
        t->quota = UINT64_MAX;
        if (o->count > 0)
            t->quota = o->count / (uint64_t)n + ((uint64_t)i < o->count % (uint64_t)n ? 1 : 0);
        if (pthread_create(&t->tid, NULL, conn_main, t) != 0) {
            fprintf(stderr, "drey-bench: cannot start thread %d\n", i);
            exit(1);
        }
    }
    pthread_barrier_wait(&sh->barrier);
    sh->start_ns = mono_ns();
    sh->window_start_ns = sh->start_ns + o->warmup_ms * 1000000;
    sh->window_end_ns = o->duration_ms > 0 ? sh->window_start_ns + o->duration_ms * 1000000 : INT64_MAX;
    pthread_barrier_wait(&sh->barrier);

    bool ok = true;
    drey_bench_stats_init(&r->total);
    int64_t last_done = sh->window_start_ns;
    bool ran_out = false;
    for (int i = 0; i < n; i++) {
        conn_thread *t = &threads[i];
        pthread_join(t->tid, NULL);
        if (t->err[0] != '\0' && ok) {
            snprintf(err, err_cap, "connection %d: %s", i, t->err);
            ok = false;
        }
        drey_bench_stats_merge(&r->total, t->stats);
        if (t->last_done_ns > last_done)
            last_done = t->last_done_ns;
        ran_out = ran_out || t->ran_out;
        free(t->stats);
    }
    /* A run that ran out of calls ends with its last completion; a timed
     * one measured the whole window. */
    int64_t end = ran_out || sh->window_end_ns == INT64_MAX ? last_done : sh->window_end_ns;
    if (end > sh->window_end_ns)
        end = sh->window_end_ns;
    r->elapsed_s = (double)(end - sh->window_start_ns) / 1e9;
    pthread_barrier_destroy(&sh->barrier);
    drey_client_topology_close(sh->topo);
    drey_bench_workload_free(&sh->w);
    free(threads);
    free(sh);
    return ok;
}
