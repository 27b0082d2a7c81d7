/*
 * backpressure — node and principal admission; see
 * include/drey/backpressure.h.
 *
 * One mutex guards the counters, the queue and the principal table: every
 * critical section is a few comparisons and pointer moves, and callbacks
 * (resume, fail) always run after it is released.
 */
#include "drey/backpressure.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/list.h"

enum { T_NEW, T_QUEUED, T_DELAYED, T_RUNNING, T_DONE };
enum { R_NODE_RATE, R_PRINCIPAL_RATE, R_PRINCIPAL_CONCURRENCY, R_QUEUE_FULL, R_QUEUE_TIMEOUT, R_DEADLINE };

static const char *const reason_names[DREY_BP_REASONS] = {
    "NODE_RATE_LIMIT", "PRINCIPAL_RATE_LIMIT", "PRINCIPAL_CONCURRENCY_LIMIT",
    "QUEUE_FULL",      "QUEUE_TIMEOUT",        "DEADLINE_EXCEEDED",
};

static const drey_error reason_errors[DREY_BP_REASONS] = {
    DREY_ERR_NODE_RATE_LIMIT, DREY_ERR_PRINCIPAL_RATE_LIMIT, DREY_ERR_PRINCIPAL_CONCURRENCY_LIMIT,
    DREY_ERR_QUEUE_FULL,      DREY_ERR_QUEUE_TIMEOUT,        DREY_ERR_DEADLINE_EXCEEDED,
};

/* The backoff a refusal suggests when no token bucket says better. */
#define BACKOFF_MS 100

struct drey_bp_principal {
    uint64_t hash;
    drey_bp_principal *hnext;
    drey_link lru; /* in drey_bp's lru */
    uint32_t inflight, queued;
    uint32_t max_inflight, max_queued; /* a tenant's limits, or a peer's */
    bool rated;                        /* the per-principal rate applies */
    double tokens;
    int64_t refilled_ns;
    uint64_t admitted, rejected;
    char name[]; /* whole: a cut name would never be found again */
};

typedef struct bucket {
    double tokens;
    int64_t refilled_ns;
} bucket;

struct drey_bp {
    drey_bp_options opts;
    char node_id[96];
    drey_timers *timers;
    pthread_mutex_t mu;
    uint32_t inflight, queued;
    drey_list queue; /* of drey_bp_ticket by link_, in arrival order */
    bucket node;
    drey_bp_principal **table;
    size_t table_mask, n_principals;
    drey_list lru; /* of drey_bp_principal, least recently used first */
    uint64_t admitted, delayed, rejected[DREY_BP_REASONS];
};

const char *drey_bp_reject_reason_name(size_t i) {
    return i < DREY_BP_REASONS ? reason_names[i] : "?";
}

drey_bp *drey_bp_create(const drey_bp_options *opts, drey_timers *timers) {
    drey_bp *bp = drey_xcalloc(1, sizeof *bp);
    bp->opts = *opts;
    snprintf(bp->node_id, sizeof bp->node_id, "%s", opts->node_id != NULL ? opts->node_id : "");
    bp->opts.node_id = bp->node_id;
    bp->timers = timers;
    pthread_mutex_init(&bp->mu, NULL);
    size_t n = 64;
    while (n < 2 * (size_t)opts->max_principals)
        n *= 2;
    bp->table = drey_xcalloc(n, sizeof *bp->table);
    bp->table_mask = n - 1;
    bp->node.tokens = opts->node_burst;
    bp->node.refilled_ns = drey_mono_ns();
    return bp;
}

void drey_bp_destroy(drey_bp *bp) {
    if (bp == NULL)
        return;
    for (drey_link *l; (l = drey_list_pop(&bp->lru)) != NULL;)
        free(DREY_LIST_ITEM(l, drey_bp_principal, lru));
    free(bp->table);
    pthread_mutex_destroy(&bp->mu);
    free(bp);
}

/* Tokens now; refilled continuously at rate up to burst. */
static double refill(double tokens, int64_t *refilled_ns, double rate, double burst, int64_t now) {
    tokens += (double)(now - *refilled_ns) * rate / 1e9;
    *refilled_ns = now;
    return tokens > burst ? burst : tokens;
}

static uint64_t hash_name(const char *s) {
    /* FNV-1a is enough: the table is bounded and evicts, so colliding
     * names cost a chain walk, never unbounded memory. */
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ULL;
    return h;
}

static void table_remove(drey_bp *bp, drey_bp_principal *p) {
    drey_bp_principal **slot = &bp->table[p->hash & bp->table_mask];
    while (*slot != p)
        slot = &(*slot)->hnext;
    *slot = p->hnext;
    drey_list_remove(&bp->lru, &p->lru);
    bp->n_principals--;
    free(p);
}

/* The principal's entry, created if needed; NULL when the table is full of
 * busy principals. Needs bp->mu. */
static drey_bp_principal *principal_get(drey_bp *bp, const char *name, int64_t now) {
    uint64_t h = hash_name(name);
    for (drey_bp_principal *p = bp->table[h & bp->table_mask]; p != NULL; p = p->hnext) {
        if (p->hash == h && strcmp(p->name, name) == 0) {
            drey_list_move_to_tail(&bp->lru, &p->lru);
            return p;
        }
    }
    if (bp->n_principals >= bp->opts.max_principals) {
        drey_bp_principal *victim = DREY_LIST_ITEM(bp->lru.head, drey_bp_principal, lru);
        while (victim != NULL && (victim->inflight > 0 || victim->queued > 0))
            victim = DREY_LIST_ITEM(victim->lru.next, drey_bp_principal, lru);
        if (victim == NULL)
            return NULL;
        table_remove(bp, victim);
    }
    size_t len = strlen(name);
    drey_bp_principal *p = drey_xcalloc(1, sizeof *p + len + 1);
    memcpy(p->name, name, len + 1);
    p->hash = h;
    /* A cluster peer forwarding calls (node:<id>) carries many tenants'
     * calls, each already limited where it entered: its own budget is the
     * node's, and no tenant's rate applies to it. Clients cannot choose
     * principal names, so the prefix is the peer's alone. */
    bool peer = strncmp(name, "node:", 5) == 0;
    p->max_inflight = peer ? bp->opts.max_inflight : bp->opts.principal_max_inflight;
    p->max_queued = peer ? bp->opts.max_queued : bp->opts.principal_max_queued;
    p->rated = !peer && bp->opts.principal_rate > 0;
    p->tokens = bp->opts.principal_burst;
    p->refilled_ns = now;
    p->hnext = bp->table[h & bp->table_mask];
    bp->table[h & bp->table_mask] = p;
    drey_list_push(&bp->lru, &p->lru);
    bp->n_principals++;
    return p;
}

/* Fills st for a refusal; retry_ms < 0 means the default backoff. */
static void refuse(drey_bp *bp, drey_bp_principal *p, int reason, int64_t retry_ms, drey_status *st) {
    bp->rejected[reason]++;
    if (p != NULL)
        p->rejected++;
    drey_status_init(st);
    drey_status_set(st, reason_errors[reason]);
    if (reason == R_DEADLINE)
        return; /* not a quota: no QuotaFailure or RetryInfo */
    bool node_wide = reason == R_NODE_RATE || reason == R_QUEUE_FULL || reason == R_QUEUE_TIMEOUT;
    if (node_wide || p == NULL)
        snprintf(st->quota_subject, sizeof st->quota_subject, "node:%s", bp->node_id);
    else
        snprintf(st->quota_subject, sizeof st->quota_subject, "principal:%s", p->name);
    st->retry_delay_ms = retry_ms >= 0 ? retry_ms : BACKOFF_MS;
    switch (reason) {
    case R_NODE_RATE:
        drey_status_add_metadata(st, "limitRequestsPerSecond", "%g", bp->opts.node_rate);
        break;
    case R_PRINCIPAL_RATE:
        drey_status_add_metadata(st, "limitRequestsPerSecond", "%g", bp->opts.principal_rate);
        break;
    case R_PRINCIPAL_CONCURRENCY:
        drey_status_add_metadata(st, "limitInflightCalls", "%u", p->max_inflight);
        drey_status_add_metadata(st, "limitQueuedCalls", "%u", p->max_queued);
        break;
    case R_QUEUE_FULL:
        drey_status_add_metadata(st, "limitInflightCalls", "%u", bp->opts.max_inflight);
        drey_status_add_metadata(st, "limitQueuedCalls", "%u", bp->opts.max_queued);
        break;
    case R_QUEUE_TIMEOUT:
        drey_status_add_metadata(st, "maxWaitMs", "%lld", (long long)bp->opts.max_wait_ms);
        break;
    }
}

/* Milliseconds until the bucket holds a whole token, rounded up. */
static int64_t ms_to_token(double tokens, double rate) {
    double ms = (1.0 - tokens) / rate * 1000.0;
    int64_t whole = (int64_t)ms;
    return whole + (ms > (double)whole);
}

static void on_delay_done(void *arg);
static void on_queue_timer(void *arg);
static void admit_waiters(drey_bp *bp, drey_list *ready);
static void resume_all(drey_list *ready);

/* Takes a slot for t. Returns the slowdown to apply (ns; 0 = none). Needs
 * bp->mu. */
static int64_t take_slot(drey_bp *bp, drey_bp_ticket *t) {
    bp->inflight++;
    t->principal_->inflight++;
    t->principal_->admitted++;
    bp->admitted++;
    uint32_t at = bp->opts.slowdown_at, max = bp->opts.max_inflight;
    if (at >= max || bp->inflight <= at || bp->opts.slowdown_max_ms <= 0)
        return 0;
    return (int64_t)(bp->inflight - at) * bp->opts.slowdown_max_ms * 1000000 / (int64_t)(max - at);
}

drey_bp_result drey_bp_admit(drey_bp *bp, drey_bp_ticket *t, drey_status *st) {
    int64_t now = drey_mono_ns();
    t->state_ = T_NEW;
    t->bp_ = bp;
    atomic_store(&t->released_, false);
    t->timer_.heap_index_ = SIZE_MAX;
    t->timer_.fn = NULL; /* never armed: release need not wait for it */
    pthread_mutex_lock(&bp->mu);
    drey_bp_principal *p = principal_get(bp, t->principal, now);
    if (p == NULL) {
        refuse(bp, NULL, R_QUEUE_FULL, -1, st);
        goto rejected;
    }
    t->principal_ = p;
    if (bp->opts.node_rate > 0) {
        bp->node.tokens = refill(bp->node.tokens, &bp->node.refilled_ns, bp->opts.node_rate, bp->opts.node_burst, now);
        if (bp->node.tokens < 1) {
            refuse(bp, p, R_NODE_RATE, ms_to_token(bp->node.tokens, bp->opts.node_rate), st);
            goto rejected;
        }
    }
    if (p->rated) {
        p->tokens = refill(p->tokens, &p->refilled_ns, bp->opts.principal_rate, bp->opts.principal_burst, now);
        if (p->tokens < 1) {
            refuse(bp, p, R_PRINCIPAL_RATE, ms_to_token(p->tokens, bp->opts.principal_rate), st);
            goto rejected;
        }
    }
    bool node_room = bp->inflight < bp->opts.max_inflight;
    bool principal_room = p->inflight < p->max_inflight;
    if (!(node_room && principal_room)) {
        if (!principal_room && p->queued >= p->max_queued) {
            refuse(bp, p, R_PRINCIPAL_CONCURRENCY, -1, st);
            goto rejected;
        }
        if (bp->queued >= bp->opts.max_queued) {
            refuse(bp, p, R_QUEUE_FULL, -1, st);
            goto rejected;
        }
        if (t->deadline_ns <= now) {
            refuse(bp, p, R_DEADLINE, -1, st);
            goto rejected;
        }
    }
    if (bp->opts.node_rate > 0)
        bp->node.tokens -= 1;
    if (p->rated)
        p->tokens -= 1;
    if (node_room && principal_room) {
        int64_t delay = take_slot(bp, t);
        if (delay == 0) {
            t->state_ = T_RUNNING;
            pthread_mutex_unlock(&bp->mu);
            return DREY_BP_ADMITTED;
        }
        bp->delayed++;
        t->state_ = T_DELAYED;
        t->timer_.at_ns = now + delay;
        t->timer_.fn = on_delay_done;
        t->timer_.arg = t;
        drey_timer_arm(bp->timers, &t->timer_); /* under the mutex, as below */
        pthread_mutex_unlock(&bp->mu);
        return DREY_BP_PARKED;
    }
    /* Wait in line. */
    t->state_ = T_QUEUED;
    drey_list_push(&bp->queue, &t->link_);
    bp->queued++;
    p->queued++;
    int64_t until = now + bp->opts.max_wait_ms * 1000000;
    t->timer_.at_ns = t->deadline_ns < until ? t->deadline_ns : until;
    t->timer_.fn = on_queue_timer;
    t->timer_.arg = t;
    /* Armed under the mutex: a release racing in must find it armed. */
    drey_timer_arm(bp->timers, &t->timer_);
    pthread_mutex_unlock(&bp->mu);
    return DREY_BP_PARKED;
rejected:
    pthread_mutex_unlock(&bp->mu);
    return DREY_BP_REJECTED;
}

static void dequeue(drey_bp *bp, drey_bp_ticket *t) {
    drey_list_remove(&bp->queue, &t->link_);
    bp->queued--;
    t->principal_->queued--;
}

/* Admits waiters while there is room, skipping those whose principal is
 * full; moves them to ready (empty) for resuming outside the lock. Needs
 * bp->mu. */
static void admit_waiters(drey_bp *bp, drey_list *ready) {
    drey_bp_ticket *t = DREY_LIST_ITEM(bp->queue.head, drey_bp_ticket, link_);
    while (t != NULL && bp->inflight < bp->opts.max_inflight) {
        drey_bp_ticket *next = DREY_LIST_ITEM(t->link_.next, drey_bp_ticket, link_);
        if (t->principal_->inflight < t->principal_->max_inflight) {
            dequeue(bp, t);
            drey_timer_cancel(bp->timers, &t->timer_);
            take_slot(bp, t); /* a call that waited is not held back again */
            t->state_ = T_RUNNING;
            drey_list_push(ready, &t->link_);
        }
        t = next;
    }
}

static void resume_all(drey_list *ready) {
    for (drey_link *l; (l = drey_list_pop(ready)) != NULL;) {
        drey_bp_ticket *t = DREY_LIST_ITEM(l, drey_bp_ticket, link_);
        t->resume(t->arg);
    }
}

/* Frees t's slot or takes it out of the queue; with only_parked, only a
 * ticket still queued or held back (a running call keeps its slot until it
 * is done, so cancelling it cannot let more work in than max_inflight). The
 * checks and the release happen under one lock so a ticket being admitted
 * at the same moment is either released whole or left alone. */
static bool release(drey_bp *bp, drey_bp_ticket *t, bool only_parked) {
    pthread_mutex_lock(&bp->mu);
    bool skip = atomic_load(&t->released_) ||
                (only_parked && t->state_ != T_QUEUED && t->state_ != T_DELAYED);
    if (skip) {
        pthread_mutex_unlock(&bp->mu);
        return false;
    }
    atomic_store(&t->released_, true);
    bool parked = false;
    switch (t->state_) {
    case T_QUEUED:
        dequeue(bp, t);
        drey_timer_cancel(bp->timers, &t->timer_);
        parked = true;
        break;
    case T_DELAYED:
        drey_timer_cancel(bp->timers, &t->timer_);
        parked = true;
        __attribute__((fallthrough)); /* it holds a slot too */
    case T_RUNNING:
        bp->inflight--;
        t->principal_->inflight--;
        break;
    default:
        break;
    }
    t->state_ = T_DONE;
    drey_list ready = {0};
    admit_waiters(bp, &ready);
    pthread_mutex_unlock(&bp->mu);
    resume_all(&ready);
    /* The ticket's timer may have fired as it was released (or resumed),
     * its callback still to take the mutex and read the ticket, which the
     * caller frees once this returns. The callback finds T_DONE (or
     * T_RUNNING) and leaves; wait for it to have left. */
    if (t->timer_.fn != NULL)
        drey_timer_sync(bp->timers, &t->timer_);
    return parked;
}

bool drey_bp_release(drey_bp *bp, drey_bp_ticket *t) {
    return release(bp, t, false);
}

bool drey_bp_cancel(drey_bp *bp, drey_bp_ticket *t) {
    return release(bp, t, true);
}

static void on_delay_done(void *arg) {
    drey_bp_ticket *t = arg;
    drey_bp *bp = t->bp_;
    pthread_mutex_lock(&bp->mu);
    bool go = t->state_ == T_DELAYED;
    if (go)
        t->state_ = T_RUNNING;
    pthread_mutex_unlock(&bp->mu);
    if (go)
        t->resume(t->arg);
}

static void on_queue_timer(void *arg) {
    drey_bp_ticket *t = arg;
    drey_bp *bp = t->bp_;
    pthread_mutex_lock(&bp->mu);
    if (t->state_ != T_QUEUED) {
        pthread_mutex_unlock(&bp->mu);
        return; /* admitted or released meanwhile */
    }
    dequeue(bp, t);
    t->state_ = T_DONE;
    int reason = drey_mono_ns() >= t->deadline_ns ? R_DEADLINE : R_QUEUE_TIMEOUT;
    drey_status st;
    refuse(bp, t->principal_, reason, -1, &st);
    drey_list ready = {0};
    admit_waiters(bp, &ready);
    pthread_mutex_unlock(&bp->mu);
    resume_all(&ready);
    t->fail(t->arg, &st);
}

void drey_bp_get_stats(drey_bp *bp, drey_bp_stats *out) {
    pthread_mutex_lock(&bp->mu);
    out->inflight = bp->inflight;
    out->queued = bp->queued;
    out->principals = (uint32_t)bp->n_principals;
    out->admitted = bp->admitted;
    out->delayed = bp->delayed;
    memcpy(out->rejected, bp->rejected, sizeof out->rejected);
    pthread_mutex_unlock(&bp->mu);
}

size_t drey_bp_top_principals(drey_bp *bp, drey_bp_principal_stats *out, size_t n) {
    size_t k = 0;
    pthread_mutex_lock(&bp->mu);
    for (drey_bp_principal *p = DREY_LIST_ITEM(bp->lru.tail, drey_bp_principal, lru); p != NULL;
         p = DREY_LIST_ITEM(p->lru.prev, drey_bp_principal, lru)) {
        /* Insertion into a small sorted array: n is a handful. */
        size_t i = k < n ? k++ : n;
        while (i > 0 && out[i - 1].rejected < p->rejected) {
            if (i < n)
                out[i] = out[i - 1];
            i--;
        }
        if (i < n) {
            snprintf(out[i].name, sizeof out[i].name, "%s", p->name);
            out[i].inflight = p->inflight;
            out[i].queued = p->queued;
            out[i].admitted = p->admitted;
            out[i].rejected = p->rejected;
        }
    }
    pthread_mutex_unlock(&bp->mu);
    return k;
}

/* a ranks before b: busier, or as busy and first by name. */
static bool busier(uint64_t a_calls, const char *a_name, uint64_t b_calls, const char *b_name) {
    return a_calls != b_calls ? a_calls > b_calls : strcmp(a_name, b_name) < 0;
}

size_t drey_bp_busiest_principals(drey_bp *bp, drey_bp_principal_stats *out, size_t n,
                                  drey_bp_principal_stats *rest) {
    memset(rest, 0, sizeof *rest);
    snprintf(rest->name, sizeof rest->name, "other");
    size_t k = 0;
    pthread_mutex_lock(&bp->mu);
    for (drey_bp_principal *p = DREY_LIST_ITEM(bp->lru.tail, drey_bp_principal, lru); p != NULL;
         p = DREY_LIST_ITEM(p->lru.prev, drey_bp_principal, lru)) {
        uint64_t calls = p->admitted + p->rejected;
        drey_bp_principal_stats cur = {.inflight = p->inflight, .queued = p->queued, .admitted = p->admitted,
                                       .rejected = p->rejected};
        snprintf(cur.name, sizeof cur.name, "%s", p->name);
        /* Insertion into a small sorted array; what falls off the end goes
         * to the rest. */
        size_t i = k < n ? k++ : n;
        drey_bp_principal_stats dropped = cur;
        bool drop = i == n;
        if (drop && n > 0 && busier(calls, cur.name, out[n - 1].admitted + out[n - 1].rejected, out[n - 1].name)) {
            dropped = out[n - 1];
            i = n - 1;
        } else if (drop) {
            i = SIZE_MAX;
        }
        if (i != SIZE_MAX) {
            while (i > 0 && busier(calls, cur.name, out[i - 1].admitted + out[i - 1].rejected, out[i - 1].name)) {
                out[i] = out[i - 1];
                i--;
            }
            out[i] = cur;
        }
        if (drop) {
            rest->inflight += dropped.inflight;
            rest->queued += dropped.queued;
            rest->admitted += dropped.admitted;
            rest->rejected += dropped.rejected;
        }
    }
    pthread_mutex_unlock(&bp->mu);
    return k;
}
