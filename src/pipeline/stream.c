/*
 * stream — drey.cache.v1.Cache/Pipeline, a stream door into the chain.
 *
 * Each operation a PipelineRequest carries becomes a request of its own
 * (an op, with its own arena, deadline, cancellation and backpressure
 * ticket) submitted to the same chain unary calls go through; its answer,
 * whichever stage gives it and from whichever thread, becomes a
 * PipelineResult. Results leave in the order the operations were read.
 *
 * Ordering: an op waits in the door, unsubmitted, while an earlier op of the
 * stream that touches the same key (or the same whole cache) is unanswered
 * and one of the two writes, so a Get after a Set of its key sees the Set.
 * Everything else is submitted at once and overlaps: durable writes of one
 * stream meet in the journal's group commit. The stream keeps a table of
 * its unanswered ops by (cache, key) hash, so finding what a new op waits
 * for costs its own keys, not the window; each op counts what it waits for
 * and is submitted when the count reaches zero. A hash collision only
 * serializes two ops that did not need it. Ops on a whole cache (Scan,
 * Clear, its figures) or every cache (ListCaches) are checked against all.
 *
 * Flow control counts ops, from being read until their result has been
 * handed to the transport: at --pipeline-window the door stops reading the
 * stream (HTTP/2 flow control then holds the client back), and at most
 * --pipeline-window ops run at once. At most one response message is queued
 * at the transport at a time; results that complete meanwhile are batched
 * into the next one, so answers never pile up unsent beyond the window.
 *
 * Lifetime: the stream holds a reference for the call (dropped in on_done)
 * and one per op. Once the call is over, ops not yet submitted are dropped,
 * submitted ones get their cancellation hook (a waiting op leaves the
 * backpressure queue, a running one keeps its slot until its work is done,
 * as a unary call does) and are freed when they are answered.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/cache/v1/cache.pb-c.h"
#include "drey/clock.h"
#include "drey/list.h"
#include "google/rpc/status.pb-c.h"
#include "stages.h"

#define PIPELINE_PATH "/drey.cache.v1.Cache/Pipeline"
#define CACHE_PREFIX "/drey.cache.v1.Cache/"
#define DEFAULT_WINDOW 128
#define MAX_CASES 32
#define OP_ARENA_INLINE 1024
/* A response message stops growing at this many bytes (one result more may
 * cross it): clients accept 4 MiB messages by default. */
#define MAX_RESPONSE_BYTES (1u << 20)
#define MAX_RESULTS_PER_MESSAGE 512

typedef struct op_kind {
    const drey_method *method;
    const ProtobufCFieldDescriptor *request; /* PipelineOperation's member */
    const ProtobufCFieldDescriptor *response; /* PipelineResult's member */
} op_kind;

struct stream_binding {
    drey_pipeline *pipeline;
    size_t window;
    op_kind kinds[MAX_CASES]; /* by oneof field number */
};

enum { OP_WAITING, OP_RUNNING, OP_DONE };

typedef struct pstream pstream;
struct pop;

/* An op's key in the stream's table of unanswered ops by key. */
typedef struct key_node {
    struct pop *op;
    uint64_t h;
    struct key_node *next, **pprev;
} key_node;

/* "dependent waits for me", in the dependent's arena (it outlives the
 * edge: it cannot be answered before what it waits for). */
typedef struct dep_node {
    struct pop *op;
    struct dep_node *next;
} dep_node;

#define KEY_BUCKETS 1024

typedef struct pop {
    drey_subdoor sd;         /* first: the request's door; its hook under s->mu */
    drey_request r;
    pstream *s;
    uint64_t id;             /* the client's */
    const struct op_kind *kind; /* NULL: refused by the door */
    drey_link order;         /* in the stream's ops, or the list on_done drops */
    drey_link submit;        /* in the stream's submits */
    struct pop *cancel_next;
    int state;
    bool started;            /* submitted to the chain */
    bool in_submit;          /* drey_pipeline_submit has not returned: the chain may still touch it */
    bool released;           /* the stream let it go: sent, or the stream is over */
    bool pinned;             /* on_done is running its cancellation hook */
    bool write;
    bool global;             /* every cache (ListCaches) */
    bool whole;              /* the whole cache (Scan, Clear, figures) */
    uint64_t cache_h;
    struct key_node *keys;   /* one per key: (cache, key) hashes, linked in the stream's table */
    size_t n_keys;
    size_t deps;             /* earlier unanswered ops this one waits for */
    struct dep_node *dependents; /* later ops waiting for this one */
    drey_link ready;         /* in the stream's ready */
    struct pop *wide_next, **wide_pprev; /* the stream's unanswered whole-cache ops */
    void (*hook_fn)(void *arg);   /* on_done's copy of the chain's hook, run unlocked */
    void *hook_arg;
    Drey__Cache__V1__PipelineResult *result;
    size_t result_bytes;
    drey_arena arena;
    char arena_buf[OP_ARENA_INLINE];
} pop;

/* Request metadata the chain reads, copied: ops outlive the call. */
static const char *const kept_metadata[] = {"authorization", DREY_FORWARDED_BY, DREY_FORWARD_EPOCH};
#define N_KEPT (sizeof kept_metadata / sizeof kept_metadata[0])

struct pstream {
    pthread_mutex_t mu;
    const struct stream_binding *b;
    drey_call *call;         /* NULL once on_done has run */
    size_t refs;             /* the call's + one per op */
    drey_list ops;           /* read and not yet sent, in stream order */
    size_t n_ops;
    size_t n_running;
    drey_list ready;          /* nothing holds them back; waiting for room in the window */
    pop *wide;                /* unanswered ops on a whole cache or every cache */
    key_node *buckets[KEY_BUCKETS];
    drey_list submits;       /* to submit (drain) */
    bool submitting;         /* a thread is draining the submit queue */
    pthread_t drainer;       /* which (while submitting) */
    bool sending;            /* a response message is at the transport */
    bool emit_deferred;      /* to the end of a batch answering ops (it holds a reference) */
    bool paused;             /* reading paused at the window */
    bool half_closed;
    bool finished;
    int64_t deadline_ns;
    char *peer;
    char *md[N_KEPT];
    size_t md_len[N_KEPT];
};

/* --- scope: which keys an op touches -------------------------------------- */

static uint64_t hash_bytes(uint64_t h, const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static uint64_t hash_str(const char *s) {
    return hash_bytes(0xcbf29ce484222325ull, s, strlen(s));
}

/* Fills the op's scope from what its request names (drey/method.h): a
 * cache and its keys; a cache and no keys: the whole cache; no cache:
 * every cache. */
static void op_scope(pop *o, const ProtobufCMessage *m) {
    const char *cache = drey_method_request_cache(m);
    if (cache == NULL) {
        o->global = true;
        return;
    }
    o->cache_h = hash_str(cache[0] != '\0' ? cache : "default");
    size_t n = drey_method_request_key_count(m);
    if (n == 0) {
        o->whole = true;
        return;
    }
    o->keys = drey_arena_calloc(&o->arena, n * sizeof *o->keys);
    for (size_t i = 0; i < n; i++) {
        const char *k = drey_method_request_key(m, i);
        o->keys[i].h = hash_bytes(o->cache_h, k != NULL ? k : "", k != NULL ? strlen(k) : 0);
    }
    o->n_keys = n;
}

/* Whether `later` must wait for `earlier` to be answered. */
static bool conflicts(const pop *earlier, const pop *later) {
    if (!earlier->write && !later->write)
        return false;
    if (earlier->global || later->global)
        return true;
    if (earlier->cache_h != later->cache_h)
        return false;
    if (earlier->whole || later->whole)
        return true;
    for (size_t i = 0; i < earlier->n_keys; i++) {
        for (size_t j = 0; j < later->n_keys; j++) {
            if (earlier->keys[i].h == later->keys[j].h)
                return true;
        }
    }
    return false;
}

/* --- ops ------------------------------------------------------------------ */

static void op_free(pop *o) {
    drey_arena_destroy(&o->arena);
    free(o);
}

static void stream_free(pstream *s) {
    pthread_mutex_destroy(&s->mu);
    free(s->peer);
    for (size_t i = 0; i < N_KEPT; i++)
        free(s->md[i]);
    free(s);
}

/* Frees o once nothing can touch it any more: the stream let it go, it is
 * answered, no submit that may still touch it is under way and no
 * cancellation hook is running for it. Under s->mu; true when that was the
 * stream's last reference (the caller frees the stream after unlocking). */
static bool settle_locked(pstream *s, pop *o) {
    if (!o->released || o->state != OP_DONE || o->in_submit || o->pinned)
        return false;
    op_free(o);
    return --s->refs == 0;
}

static Drey__Cache__V1__PipelineResult *result_of(pop *o) {
    Drey__Cache__V1__PipelineResult *res = drey_arena_alloc(&o->arena, sizeof *res);
    drey__cache__v1__pipeline_result__init(res);
    res->id = o->id;
    return res;
}

static void set_status(pop *o, Drey__Cache__V1__PipelineResult *res, const uint8_t *details, size_t len, int code,
                       const char *message, size_t message_len) {
    Google__Rpc__Status *st = NULL;
    if (details != NULL)
        st = google__rpc__status__unpack(drey_arena_protobuf_allocator(&o->arena), len, details);
    if (st == NULL) {
        st = drey_arena_alloc(&o->arena, sizeof *st);
        google__rpc__status__init(st);
        st->message = drey_arena_strndup(&o->arena, message != NULL ? message : "", message_len);
    }
    st->code = code;
    res->status = st;
}

static void op_fail_status(pop *o, Drey__Cache__V1__PipelineResult *res, const drey_status *st) {
    uint8_t *details;
    size_t len;
    drey_status_encode(st, &o->arena, &details, &len);
    const char *msg = drey_status_message(st);
    set_status(o, res, details, len, (int)drey_status_code(st), msg, strlen(msg));
}

static void complete(pop *o, Drey__Cache__V1__PipelineResult *res);

static void door_reply(drey_subdoor *door, const ProtobufCMessage *response) {
    pop *o = (pop *)door;
    Drey__Cache__V1__PipelineResult *res = result_of(o);
    const op_kind *k = o->kind;
    *(uint32_t *)(void *)((char *)res + k->response->quantifier_offset) = k->response->id;
    *(const ProtobufCMessage **)(void *)((char *)res + k->response->offset) = response;
    complete(o, res);
}

static void door_fail(drey_subdoor *door, const drey_status *st) {
    pop *o = (pop *)door;
    Drey__Cache__V1__PipelineResult *res = result_of(o);
    op_fail_status(o, res, st);
    complete(o, res);
}

/* A forwarded op's answer: the owner's response or status, as it came.
 * The owner's response is not decoded here to be encoded again: its bytes
 * become the result's response field as an unknown field, which protobuf-c
 * packs verbatim (tag, then the data: the length prefix and the bytes).
 * The owner encoded it with the same schema, as a unary relay's bytes. */
static void door_relay(drey_subdoor *door, const drey_answer *a) {
    pop *o = (pop *)door;
    Drey__Cache__V1__PipelineResult *res = result_of(o);
    if (a->code == 0) {
        uint8_t prefix[10];
        size_t n = 0;
        for (size_t v = a->response_len; n == 0 || v != 0; v >>= 7)
            prefix[n++] = (uint8_t)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
        uint8_t *data = drey_arena_alloc(&o->arena, n + a->response_len);
        memcpy(data, prefix, n);
        if (a->response_len > 0)
            memcpy(data + n, a->response, a->response_len);
        ProtobufCMessageUnknownField *f = drey_arena_alloc(&o->arena, sizeof *f);
        *f = (ProtobufCMessageUnknownField){.tag = o->kind->response->id,
                                            .wire_type = PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED,
                                            .len = n + a->response_len,
                                            .data = data};
        res->base.n_unknown_fields = 1;
        res->base.unknown_fields = f;
    } else {
        set_status(o, res, a->details, a->details_len, a->code, a->message, a->message_len);
    }
    complete(o, res);
}

static const char *door_metadata(drey_subdoor *door, const char *key, size_t *len) {
    const pstream *s = ((pop *)door)->s;
    for (size_t i = 0; i < N_KEPT; i++) {
        if (s->md[i] != NULL && strcmp(kept_metadata[i], key) == 0) {
            *len = s->md_len[i];
            return s->md[i];
        }
    }
    return NULL;
}

static const char *door_peer(drey_subdoor *door) {
    return ((pop *)door)->s->peer;
}

static const drey_subdoor_stream pipeline_stream = {.reply = door_reply, .fail = door_fail, .relay = door_relay,
                                                    .metadata = door_metadata, .peer = door_peer};

/* --- scheduling (under s->mu) --------------------------------------------- */

static void queue_submit_locked(pstream *s, pop *o) {
    o->state = OP_RUNNING;
    s->n_running++;
    drey_list_push(&s->submits, &o->submit);
}

static void ready_locked(pstream *s, pop *o) {
    drey_list_push(&s->ready, &o->ready);
}

/* Queues the ready ops for submission while fewer than the window run. */
static void schedule_locked(pstream *s) {
    while (!drey_list_empty(&s->ready) && s->n_running < s->b->window)
        queue_submit_locked(s, DREY_LIST_ITEM(drey_list_pop(&s->ready), pop, ready));
}

static void depend_locked(pop *earlier, pop *later, dep_node *node) {
    node->op = later;
    node->next = earlier->dependents;
    earlier->dependents = node;
    later->deps++;
}

/* A new op (the tail of the stream): records what it must wait for, and
 * enters the stream's table. Reads after reads overlap; a write waits for
 * every earlier unanswered op on its keys, a read for the writes. Whole-
 * cache ops are checked against everything (they are rare). */
static void admit_locked(pstream *s, pop *o) {
    if (o->whole || o->global) {
        for (pop *e = DREY_LIST_ITEM(s->ops.head, pop, order); e != o; e = DREY_LIST_ITEM(e->order.next, pop, order)) {
            if (e->state != OP_DONE && conflicts(e, o))
                depend_locked(e, o, drey_arena_alloc(&o->arena, sizeof(dep_node)));
        }
        o->wide_next = s->wide;
        if (s->wide != NULL)
            s->wide->wide_pprev = &o->wide_next;
        o->wide_pprev = &s->wide;
        s->wide = o;
    } else {
        for (pop *w = s->wide; w != NULL; w = w->wide_next) {
            if (conflicts(w, o))
                depend_locked(w, o, drey_arena_alloc(&o->arena, sizeof(dep_node)));
        }
        for (size_t i = 0; i < o->n_keys; i++) {
            key_node *k = &o->keys[i];
            key_node **b = &s->buckets[k->h % KEY_BUCKETS];
            for (key_node *e = *b; e != NULL; e = e->next) {
                /* An op naming a key twice must not wait for itself. */
                if (e->h == k->h && e->op != o && (e->op->write || o->write))
                    depend_locked(e->op, o, drey_arena_alloc(&o->arena, sizeof(dep_node)));
            }
            k->op = o;
            k->next = *b;
            if (*b != NULL)
                (*b)->pprev = &k->next;
            k->pprev = b;
            *b = k;
        }
    }
    if (o->deps == 0)
        ready_locked(s, o);
}

/* An op was answered: it leaves the table and what waited for it only on
 * it becomes ready. */
static void release_locked(pstream *s, pop *o) {
    for (size_t i = 0; i < o->n_keys; i++) {
        key_node *k = &o->keys[i];
        *k->pprev = k->next;
        if (k->next != NULL)
            k->next->pprev = k->pprev;
    }
    if (o->wide_pprev != NULL) {
        *o->wide_pprev = o->wide_next;
        if (o->wide_next != NULL)
            o->wide_next->wide_pprev = o->wide_pprev;
    }
    for (dep_node *d = o->dependents; d != NULL; d = d->next) {
        if (--d->op->deps == 0)
            ready_locked(s, d->op);
    }
}

/* Sends the answered ops at the head of the stream as one message, unless
 * one is already at the transport (on_sent comes back here). */
static void emit_locked(pstream *s) {
    if (s->call == NULL || s->sending || s->finished)
        return;
    size_t n = 0, bytes = 0;
    for (pop *o = DREY_LIST_ITEM(s->ops.head, pop, order);
         o != NULL && o->state == OP_DONE && n < MAX_RESULTS_PER_MESSAGE && bytes < MAX_RESPONSE_BYTES;
         o = DREY_LIST_ITEM(o->order.next, pop, order)) {
        n++;
        bytes += o->result_bytes;
    }
    if (n == 0) {
        if (s->half_closed && drey_list_empty(&s->ops)) {
            s->finished = true;
            drey_call_finish(s->call, NULL);
        }
        return;
    }
    Drey__Cache__V1__PipelineResult *inline_results[64];
    Drey__Cache__V1__PipelineResult **results =
        n <= 64 ? inline_results : drey_xmalloc(n * sizeof *results);
    pop *o = DREY_LIST_ITEM(s->ops.head, pop, order);
    for (size_t i = 0; i < n; i++, o = DREY_LIST_ITEM(o->order.next, pop, order))
        results[i] = o->result;
    Drey__Cache__V1__PipelineResponse resp = DREY__CACHE__V1__PIPELINE_RESPONSE__INIT;
    resp.n_results = n;
    resp.results = results;
    s->sending = drey_call_send(s->call, &resp.base);
    if (results != inline_results)
        free(results);
    for (size_t i = 0; i < n; i++) {
        pop *done = DREY_LIST_ITEM(drey_list_pop(&s->ops), pop, order);
        done->released = true;
        settle_locked(s, done); /* never the last: the call holds one */
    }
    s->n_ops -= n;
}

static void resume_locked(pstream *s) {
    if (s->paused && s->call != NULL && s->n_ops < s->b->window) {
        s->paused = false;
        drey_call_resume_reading(s->call);
    }
}

/* Drops a reference taken under s->mu, and the lock. */
static void unref_unlock(pstream *s) {
    bool last = --s->refs == 0;
    pthread_mutex_unlock(&s->mu);
    if (last)
        stream_free(s);
}

/* Submits what the queue holds; one thread at a time, so an op answered at
 * once (a read) that frees the next does not recurse into it. The caller
 * holds a reference on the stream for it (taken under s->mu), which this
 * drops. */
static void drain(pstream *s) {
    /* The ops forwarded to one owner go in one peer message. */
    drey_pipeline_batch_begin();
    pthread_mutex_lock(&s->mu);
    if (!s->submitting) {
        s->submitting = true;
        s->drainer = pthread_self();
        for (drey_link *l; (l = drey_list_pop(&s->submits)) != NULL;) {
            pop *o = DREY_LIST_ITEM(l, pop, submit);
            o->started = true;
            /* A stage may still touch the request after it was answered
             * (another thread can resume a parked one and answer it before
             * the stage that parked it returns): it is freed only once
             * submit has returned. */
            o->in_submit = true;
            pthread_mutex_unlock(&s->mu);
            if (o->result != NULL) {
                /* Refused by the door itself (no request set). */
                complete(o, o->result);
            } else if (o->sd.deadline_ns <= drey_mono_ns()) {
                drey_subdoor_ops.fail(&o->sd, drey_pipeline__status(&o->r, DREY_ERR_DEADLINE_EXCEEDED));
            } else {
                drey_pipeline_submit(s->b->pipeline, &o->r);
            }
            pthread_mutex_lock(&s->mu);
            o->in_submit = false;
            settle_locked(s, o); /* never the last: ours is held */
        }
        s->submitting = false;
        /* What the ops answered while they were submitted leaves now, in
         * one message rather than one for the first and one for the rest. */
        emit_locked(s);
        resume_locked(s);
    }
    unref_unlock(s);
    drey_pipeline_batch_end();
}

/* The end of a batch that answered ops of s (complete). */
static void emit_later(void *arg) {
    pstream *s = arg;
    pthread_mutex_lock(&s->mu);
    s->emit_deferred = false;
    emit_locked(s);
    resume_locked(s);
    unref_unlock(s);
}

/* An op is answered (any thread). */
static void complete(pop *o, Drey__Cache__V1__PipelineResult *res) {
    pstream *s = o->s;
    o->result = res;
    o->result_bytes = protobuf_c_message_get_packed_size(&res->base) + 8;
    pthread_mutex_lock(&s->mu);
    o->state = OP_DONE;
    drey_subdoor_answered_locked(&o->sd);
    s->n_running--;
    if (s->call == NULL) {
        /* The stream is over: nobody reads the answer. */
        bool last = settle_locked(s, o);
        pthread_mutex_unlock(&s->mu);
        if (last)
            stream_free(s);
        return;
    }
    release_locked(s, o);
    schedule_locked(s);
    if (s->submitting && pthread_equal(s->drainer, pthread_self())) {
        /* answered inside a submit: drain emits when it is done */
    } else if (s->emit_deferred) {
        /* a batch answering ops of this stream emits at its end */
    } else if (drey_pipeline_batch_defer(emit_later, s)) {
        /* answered among others (a peer's message of answers): they
         * leave together, in one response message */
        s->emit_deferred = true;
        s->refs++;
    } else {
        emit_locked(s); /* may free o */
        resume_locked(s);
    }
    bool more = !drey_list_empty(&s->submits);
    if (more)
        s->refs++; /* drain's */
    pthread_mutex_unlock(&s->mu);
    if (more)
        drain(s);
}

/* --- the stream ----------------------------------------------------------- */

static pstream *stream_of(const struct stream_binding *b, drey_call *call) {
    pstream *s = drey_call_user(call);
    if (s != NULL)
        return s;
    s = drey_xcalloc(1, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    s->b = b;
    s->call = call;
    s->refs = 1;
    s->deadline_ns = drey_call_deadline_mono_ns(call);
    s->peer = drey_xstrdup(drey_call_connection(call));
    for (size_t i = 0; i < N_KEPT; i++) {
        size_t n;
        const char *v = drey_call_metadata(call, kept_metadata[i], &n);
        if (v != NULL) {
            s->md[i] = drey_xmalloc(n + 1);
            memcpy(s->md[i], v, n);
            s->md[i][n] = '\0';
            s->md_len[i] = n;
        }
    }
    drey_call_set_user(call, s);
    return s;
}

/* Copies one operation out of the stream message (whose arena is reset
 * after on_message) into an op of its own. */
static pop *op_new(pstream *s, const Drey__Cache__V1__PipelineOperation *in, int64_t now_ns) {
    pop *o = drey_xmalloc(sizeof *o);
    memset(o, 0, offsetof(pop, arena_buf));
    o->s = s;
    o->id = in->id;
    drey_arena_init(&o->arena, o->arena_buf, sizeof o->arena_buf);
    int64_t deadline = s->deadline_ns;
    if (in->timeout != NULL) {
        int64_t t = in->timeout->seconds > 0 ? in->timeout->seconds : 0;
        t = t > INT64_MAX / 1000000000 / 2 ? INT64_MAX / 2 : t * 1000000000 + (in->timeout->nanos > 0 ? in->timeout->nanos : 0);
        if (now_ns + t < deadline)
            deadline = now_ns + t;
    }
    drey_subdoor_init(&o->sd, &pipeline_stream, &s->mu, deadline);
    size_t c = (size_t)in->request_case;
    const op_kind *k = c < MAX_CASES && s->b->kinds[c].method != NULL ? &s->b->kinds[c] : NULL;
    if (k == NULL) {
        drey_status st;
        drey_status_init(&st);
        drey_status_set(&st, DREY_ERR_MALFORMED_REQUEST); /* no request set */
        Drey__Cache__V1__PipelineResult *res = result_of(o);
        op_fail_status(o, res, &st);
        o->result = res;
        return o;
    }
    const ProtobufCMessage *sub = *(ProtobufCMessage *const *)(const void *)((const char *)in + k->request->offset);
    size_t len = protobuf_c_message_get_packed_size(sub);
    uint8_t *bytes = drey_arena_alloc(&o->arena, len > 0 ? len : 1);
    protobuf_c_message_pack(sub, bytes);
    ProtobufCMessage *msg = protobuf_c_message_unpack(k->method->desc->input,
                                                      drey_arena_protobuf_allocator(&o->arena), len, bytes);
    o->kind = k;
    drey_request_init(&o->r, &drey_subdoor_ops, &o->sd, &o->arena, k->method, msg, bytes, len);
    o->write = (k->method->flags & DREY_METHOD_WRITE) != 0;
    if (msg == NULL) {
        drey_status st = drey_status_of(DREY_ERR_MALFORMED_REQUEST);
        Drey__Cache__V1__PipelineResult *res = result_of(o);
        op_fail_status(o, res, &st);
        o->result = res;
    } else {
        op_scope(o, msg);
    }
    return o;
}

static void on_message(void *ctx, drey_call *call, const ProtobufCMessage *request) {
    const struct stream_binding *b = ctx;
    pstream *s = stream_of(b, call);
    if (request == NULL) {
        pthread_mutex_lock(&s->mu);
        s->half_closed = true;
        emit_locked(s);
        pthread_mutex_unlock(&s->mu);
        return;
    }
    const Drey__Cache__V1__PipelineRequest *req = (const Drey__Cache__V1__PipelineRequest *)request;
    int64_t now = drey_mono_ns();
    drey_list batch = {0};
    for (size_t i = 0; i < req->n_operations; i++) {
        pop *o = op_new(s, req->operations[i], now);
        o->state = OP_WAITING;
        drey_list_push(&batch, &o->order);
    }
    if (drey_list_empty(&batch))
        return;
    pthread_mutex_lock(&s->mu);
    s->refs += req->n_operations;
    s->n_ops += req->n_operations;
    for (drey_link *l; (l = drey_list_pop(&batch)) != NULL;) {
        pop *o = DREY_LIST_ITEM(l, pop, order);
        drey_list_push(&s->ops, &o->order);
        admit_locked(s, o);
    }
    schedule_locked(s);
    if (s->n_ops >= b->window && !s->paused) {
        s->paused = true;
        drey_call_pause_reading(call);
    }
    s->refs++; /* drain's */
    pthread_mutex_unlock(&s->mu);
    drain(s);
}

static void on_sent(void *ctx, drey_call *call) {
    (void)ctx;
    pstream *s = drey_call_user(call);
    pthread_mutex_lock(&s->mu);
    s->sending = false;
    emit_locked(s);
    resume_locked(s);
    pthread_mutex_unlock(&s->mu);
}

static void on_done(void *ctx, drey_call *call) {
    (void)ctx;
    pstream *s = drey_call_user(call);
    if (s == NULL)
        return; /* over before its first message */
    drey_list drop = {0};
    pop *cancel = NULL;
    pthread_mutex_lock(&s->mu);
    s->call = NULL;
    for (drey_link *l; (l = drey_list_pop(&s->ops)) != NULL;) {
        pop *o = DREY_LIST_ITEM(l, pop, order);
        o->released = true;
        if (o->state == OP_RUNNING && o->started) {
            /* Answered later, by whoever runs it; freed then. */
            if (drey_subdoor_cancel_locked(&o->sd, &o->hook_fn, &o->hook_arg) && o->hook_fn != NULL) {
                o->pinned = true;
                o->cancel_next = cancel;
                cancel = o;
            }
            continue;
        }
        if (o->state == OP_DONE) {
            settle_locked(s, o); /* unless a submit still runs: then it frees it */
            continue;
        }
        /* Never submitted: nothing else knows it. */
        if (o->state == OP_RUNNING)
            s->n_running--;
        drey_list_push(&drop, &o->order);
        s->refs--;
    }
    /* What they held of these lists was never submitted: dropped above. */
    s->submits = (drey_list){0};
    s->ready = (drey_list){0};
    s->refs--; /* the call's */
    bool last = s->refs == 0;
    pthread_mutex_unlock(&s->mu);
    for (drey_link *l; (l = drey_list_pop(&drop)) != NULL;)
        op_free(DREY_LIST_ITEM(l, pop, order));
    /* The hooks run unlocked: one may answer its op at once, which locks.
     * A pinned op stays allocated meanwhile, answered or not. */
    for (pop *o = cancel; o != NULL; o = o->cancel_next)
        o->hook_fn(o->hook_arg);
    if (cancel != NULL) {
        pthread_mutex_lock(&s->mu);
        for (pop *o = cancel, *next; o != NULL; o = next) {
            next = o->cancel_next;
            o->pinned = false;
            settle_locked(s, o);
        }
        last = s->refs == 0;
        pthread_mutex_unlock(&s->mu);
    }
    if (last)
        stream_free(s);
}

/* --- binding -------------------------------------------------------------- */

static const ProtobufCFieldDescriptor *member_of(const ProtobufCMessageDescriptor *d,
                                                 const ProtobufCMessageDescriptor *type) {
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *fd = &d->fields[i];
        if (fd->type == PROTOBUF_C_TYPE_MESSAGE && (fd->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) != 0 &&
            fd->descriptor == type)
            return fd;
    }
    return NULL;
}

bool drey_pipeline__serve_stream(drey_pipeline *p, drey_server *s) {
    const drey_pipeline_options *o = drey_pipeline__options(p);
    struct stream_binding *b = drey_xcalloc(1, sizeof *b);
    b->pipeline = p;
    b->window = o->pipeline_window > 0 ? o->pipeline_window : DEFAULT_WINDOW;
    size_t n = drey_method_count(o->methods);
    size_t bound = 0;
    for (size_t i = 0; i < n; i++) {
        const drey_method *m = drey_method_at(o->methods, i);
        if (strncmp(m->path, CACHE_PREFIX, strlen(CACHE_PREFIX)) != 0)
            continue;
        const ProtobufCFieldDescriptor *rq = member_of(&drey__cache__v1__pipeline_operation__descriptor, m->desc->input);
        const ProtobufCFieldDescriptor *rs = member_of(&drey__cache__v1__pipeline_result__descriptor, m->desc->output);
        if (rq == NULL || rs == NULL || rq->id >= MAX_CASES || rq->id != rs->id)
            continue;
        b->kinds[rq->id] = (op_kind){.method = m, .request = rq, .response = rs};
        bound++;
    }
    drey_pipeline__set_stream_binding(p, b);
    if (bound == 0)
        return true; /* no cache service: nothing to pipeline */
    drey_server_method sm = {
        .path = PIPELINE_PATH,
        .input = &drey__cache__v1__pipeline_request__descriptor,
        .client_streaming = true,
        .server_streaming = true,
        .on_message = on_message,
        .on_done = on_done,
        .on_sent = on_sent,
        .ctx = b,
    };
    return drey_server_add_method(s, &sm);
}
