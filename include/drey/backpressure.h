/*
 * backpressure — runtime admission: how many calls run at once, who waits,
 * who is refused.
 *
 * Node: at most max_inflight calls run; beyond that up to max_queued wait in
 * one FIFO for at most max_wait (then QUEUE_TIMEOUT; a full queue is
 * QUEUE_FULL). Between slowdown_at and max_inflight running calls, each newly
 * admitted call is first held back for a time growing linearly to
 * slowdown_max, so pressure shows up as latency before it becomes refusal.
 * An optional token bucket limits the node's rate (NODE_RATE_LIMIT).
 *
 * Principal (jwt:{sub} or conn:{id}): at most principal_max_inflight running
 * and principal_max_queued waiting (PRINCIPAL_CONCURRENCY_LIMIT), and its own
 * token bucket (PRINCIPAL_RATE_LIMIT). A cluster peer that forwards calls
 * (node:{id}) is a principal whose limits are the node's own (max_inflight,
 * max_queued, no per-principal rate): its calls were limited per tenant
 * where they entered. A principal at its limit is refused
 * while others go on: the queue skips waiters whose principal is full. The
 * principal table is bounded; idle principals are evicted least recently
 * used first.
 *
 * A waiting call leaves the queue at once when its deadline passes
 * (DEADLINE_EXCEEDED) or it is cancelled (drey_bp_cancel). A running call's
 * slot is released exactly once, by drey_bp_release() when it is done.
 */
#ifndef DREY_BACKPRESSURE_H
#define DREY_BACKPRESSURE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "drey/list.h"
#include "drey/status.h"
#include "drey/timer.h"

typedef struct drey_bp drey_bp;

typedef struct drey_bp_options {
    uint32_t max_inflight;
    uint32_t max_queued;
    int64_t max_wait_ms;
    uint32_t slowdown_at;        /* running calls where slowdown starts; >= max_inflight: never */
    int64_t slowdown_max_ms;     /* the hold-back at max_inflight */
    double node_rate;            /* requests per second; 0: unlimited */
    double node_burst;
    uint32_t principal_max_inflight;
    uint32_t principal_max_queued;
    double principal_rate;       /* 0: unlimited */
    double principal_burst;
    uint32_t max_principals;     /* table bound */
    const char *node_id;         /* QuotaFailure subject "node:<id>" */
} drey_bp_options;

typedef struct drey_bp_principal drey_bp_principal;

/* One call's passage; lives in the call's arena. The caller sets principal,
 * deadline_ns, resume and fail before drey_bp_admit. */
typedef struct drey_bp_ticket {
    const char *principal;
    int64_t deadline_ns;         /* monotonic; INT64_MAX: none */
    /* A parked call may go on (called from the releasing or the timer thread). */
    void (*resume)(void *arg);
    /* A parked call must fail with st (timeout, deadline, cancel). */
    void (*fail)(void *arg, const drey_status *st);
    void *arg;

    /* The module's. */
    struct drey_bp *bp_;
    drey_link link_; /* in the queue while T_QUEUED */
    drey_bp_principal *principal_;
    drey_timer timer_;
    int state_;
    _Atomic bool released_;
} drey_bp_ticket;

typedef enum drey_bp_result {
    DREY_BP_ADMITTED, /* run now; release when done */
    DREY_BP_PARKED,   /* resume or fail will be called */
    DREY_BP_REJECTED, /* st says why; nothing to release */
} drey_bp_result;

drey_bp *drey_bp_create(const drey_bp_options *opts, drey_timers *timers);
void drey_bp_destroy(drey_bp *bp);

drey_bp_result drey_bp_admit(drey_bp *bp, drey_bp_ticket *t, drey_status *st);
/* The call is done (replied) or cancelled: frees its slot, or takes it out
 * of the queue. Safe to call more than once; only the first counts, and it
 * returns only once no timer callback is using the ticket, which may then
 * be freed. Returns true when the call was parked (queued or held back):
 * neither resume nor fail will come, so the caller finishes the call
 * itself. */
bool drey_bp_release(drey_bp *bp, drey_bp_ticket *t);
/* The caller went away: like drey_bp_release for a ticket still queued or
 * held back (returns true: the caller finishes the call itself), and nothing
 * for a running one, which keeps its slot until drey_bp_release when its
 * work is done. Cancelling must not free a slot while the work it admitted
 * (a write in the journal's queue, say) goes on. */
bool drey_bp_cancel(drey_bp *bp, drey_bp_ticket *t);

typedef struct drey_bp_stats {
    uint32_t inflight, queued, principals;
    uint64_t admitted, delayed;
    uint64_t rejected[6]; /* by reason: see drey_bp_reject_reason_name */
} drey_bp_stats;

#define DREY_BP_REASONS 6
const char *drey_bp_reject_reason_name(size_t i);
void drey_bp_get_stats(drey_bp *bp, drey_bp_stats *out);

/* Per-principal figures for the bounded top-N metrics: the n principals with
 * the most rejections. */
typedef struct drey_bp_principal_stats {
    char name[96];
    uint32_t inflight, queued;
    uint64_t admitted, rejected;
} drey_bp_principal_stats;
size_t drey_bp_top_principals(drey_bp *bp, drey_bp_principal_stats *out, size_t n);

/* The metrics' view: the n busiest principals (most calls admitted plus
 * refused; ties by name, so the set is stable between scrapes), and in
 * *rest every other tracked principal's figures summed, named "other". A
 * flood of connection principals then adds to one series, never new ones.
 * Returns how many were written to out. */
size_t drey_bp_busiest_principals(drey_bp *bp, drey_bp_principal_stats *out, size_t n,
                                  drey_bp_principal_stats *rest);

#endif
