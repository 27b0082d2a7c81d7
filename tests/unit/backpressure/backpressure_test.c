/*
 * Unit tests for src/backpressure/backpressure.c: runtime admission.
 *
 * Through the real module on a real timer thread, no mocks: the node admits
 * up to max_inflight, parks up to max_queued in one FIFO and refuses the rest
 * (QUEUE_FULL); a release resumes the oldest waiter exactly once; a waiter
 * fails with QUEUE_TIMEOUT after max_wait or DEADLINE_EXCEEDED at its
 * deadline; per-principal concurrency and token buckets refuse one principal
 * while others go on; the node bucket refuses everyone; the principal table
 * stays bounded and evicts idle principals oldest first; slowdown holds calls
 * back, then resumes them; the top-N report orders by rejections; and many
 * threads admitting and releasing at once leave the counters consistent.
 *
 * Refusals are checked down to the drey_status the gRPC layer turns into
 * ErrorInfo, QuotaFailure and RetryInfo. Nothing waits by sleeping: callbacks
 * signal a condition variable and the test waits on it with a deadline.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "drey/backpressure.h"
#include "drey/clock.h"
#include "drey/status.h"
#include "drey/timer.h"

#define WAIT_MS 5000      /* how long a callback may take before the test fails */
#define BACKOFF_MS 100    /* BACKOFF_MS in backpressure.c: the default retry delay */
#define NO_DEADLINE INT64_MAX

static drey_timers *timers;
static drey_bp *bp;

static void teardown(void) {
    /* Timers first: joining their thread means no callback still runs into
     * the module (or into a ticket) once it is gone. */
    drey_timers_destroy(timers);
    timers = NULL;
    drey_bp_destroy(bp);
    bp = NULL;
}

TestSuite(backpressure, .fini = teardown, .timeout = 60);

/* --- helpers -------------------------------------------------------------- */

/* Callbacks run on the releasing thread or the timer thread; they record what
 * happened and wake whoever waits. */
static pthread_mutex_t ev_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ev_cv = PTHREAD_COND_INITIALIZER;
static atomic_int resume_seq;

typedef struct call {
    drey_bp_ticket t;
    atomic_int resumed, failed;
    int resumed_as;   /* 1-based position among all resumes of the test */
    drey_status st;   /* what fail was given */
} call;

static void notify(void) {
    pthread_mutex_lock(&ev_mu);
    pthread_cond_broadcast(&ev_cv);
    pthread_mutex_unlock(&ev_mu);
}

static void on_resume(void *arg) {
    call *c = arg;
    c->resumed_as = atomic_fetch_add(&resume_seq, 1) + 1;
    atomic_fetch_add(&c->resumed, 1);
    notify();
}

static void on_fail(void *arg, const drey_status *st) {
    call *c = arg;
    c->st = *st;
    atomic_fetch_add(&c->failed, 1);
    notify();
}

/* Waits until *a + (b ? *b : 0) reaches want; false at the deadline. The
 * one-millisecond slice only bounds a lost wake-up: callbacks signal. */
static bool wait_count2(atomic_int *a, atomic_int *b, int want, int64_t timeout_ms) {
    int64_t until = drey_mono_ns() + timeout_ms * 1000000;
    bool ok = true;
    pthread_mutex_lock(&ev_mu);
    while (atomic_load(a) + (b != NULL ? atomic_load(b) : 0) < want) {
        if (drey_mono_ns() >= until) {
            ok = false;
            break;
        }
        drey_cond_wait_until(&ev_cv, &ev_mu, drey_deadline_after_ms(1));
    }
    pthread_mutex_unlock(&ev_mu);
    return ok;
}

static bool wait_resumed(call *c) {
    return wait_count2(&c->resumed, NULL, 1, WAIT_MS);
}

static bool wait_failed(call *c) {
    return wait_count2(&c->failed, NULL, 1, WAIT_MS);
}

/* Options every test starts from: room everywhere, nothing limited, so each
 * test turns on only the limit it is about. */
static drey_bp_options base_options(void) {
    return (drey_bp_options){
        .max_inflight = 100,
        .max_queued = 100,
        .max_wait_ms = 60000,
        .slowdown_at = 100, /* >= max_inflight: never */
        .slowdown_max_ms = 0,
        .principal_max_inflight = 100,
        .principal_max_queued = 100,
        .max_principals = 64,
        .node_id = "n1",
    };
}

static void start(const drey_bp_options *o) {
    timers = drey_timers_create();
    cr_assert_not_null(timers);
    bp = drey_bp_create(o, timers);
    cr_assert_not_null(bp);
}

static drey_bp_result admit_dl(call *c, const char *principal, int64_t deadline_ns, drey_status *st) {
    memset(c, 0, sizeof *c);
    c->t.principal = principal;
    c->t.deadline_ns = deadline_ns;
    c->t.resume = on_resume;
    c->t.fail = on_fail;
    c->t.arg = c;
    drey_status_init(st);
    return drey_bp_admit(bp, &c->t, st);
}

static drey_bp_result admit(call *c, const char *principal, drey_status *st) {
    return admit_dl(c, principal, NO_DEADLINE, st);
}

/* Asserts the call is admitted or parked (st untouched by a refusal). */
static void expect(drey_bp_result want, call *c, const char *principal) {
    drey_status st;
    drey_bp_result got = admit(c, principal, &st);
    cr_assert_eq(got, want, "%s: admit gave %d, wanted %d (%s)", principal, got, want,
                 drey_error_lookup(st.error)->reason);
}

static size_t reason(const char *name) {
    for (size_t i = 0; i < DREY_BP_REASONS; i++)
        if (strcmp(drey_bp_reject_reason_name(i), name) == 0)
            return i;
    cr_assert_fail("no rejection reason %s", name);
    return 0;
}

static drey_bp_stats stats(void) {
    drey_bp_stats s;
    memset(&s, 0xff, sizeof s); /* every field must be written */
    drey_bp_get_stats(bp, &s);
    return s;
}

static uint64_t rejected_total(const drey_bp_stats *s) {
    uint64_t n = 0;
    for (size_t i = 0; i < DREY_BP_REASONS; i++)
        n += s->rejected[i];
    return n;
}

static const char *meta(const drey_status *st, const char *key) {
    for (size_t i = 0; i < st->n_metadata; i++)
        if (strcmp(st->metadata[i].key, key) == 0)
            return st->metadata[i].value;
    return NULL;
}

/* A quota refusal: the catalogue row, RESOURCE_EXHAUSTED, the QuotaFailure
 * subject and ErrorInfo metadata the client sees. */
static void expect_quota(const drey_status *st, drey_error e, const char *subject) {
    cr_assert_eq(st->error, e, "got %s, wanted %s", drey_error_lookup(st->error)->reason, drey_error_lookup(e)->reason);
    cr_assert_eq(drey_status_code(st), GRPC_STATUS_RESOURCE_EXHAUSTED);
    cr_assert_str_eq(st->quota_subject, subject);
}

static void expect_meta(const drey_status *st, const char *key, const char *value) {
    const char *got = meta(st, key);
    cr_assert_not_null(got, "metadata %s missing", key);
    cr_assert_str_eq(got, value, "metadata %s", key);
}

static void expect_counts(uint32_t inflight, uint32_t queued, uint64_t admitted) {
    drey_bp_stats s = stats();
    cr_assert_eq(s.inflight, inflight, "inflight %u, wanted %u", s.inflight, inflight);
    cr_assert_eq(s.queued, queued, "queued %u, wanted %u", s.queued, queued);
    cr_assert_eq(s.admitted, admitted, "admitted %llu, wanted %llu", (unsigned long long)s.admitted,
                 (unsigned long long)admitted);
}

/* --- reasons --------------------------------------------------------------- */

Test(backpressure, reason_names_are_the_catalogue_reasons_in_stats_order) {
    /* Stats index i and the ErrorInfo reason a client sees must agree, or the
     * admin page counts one refusal under another's name. */
    static const drey_error errors[DREY_BP_REASONS] = {
        DREY_ERR_NODE_RATE_LIMIT, DREY_ERR_PRINCIPAL_RATE_LIMIT, DREY_ERR_PRINCIPAL_CONCURRENCY_LIMIT,
        DREY_ERR_QUEUE_FULL,      DREY_ERR_QUEUE_TIMEOUT,        DREY_ERR_DEADLINE_EXCEEDED,
    };
    for (size_t i = 0; i < DREY_BP_REASONS; i++)
        cr_assert_str_eq(drey_bp_reject_reason_name(i), drey_error_lookup(errors[i])->reason);
    cr_assert_str_eq(drey_bp_reject_reason_name(DREY_BP_REASONS), "?");
    cr_assert_str_eq(drey_bp_reject_reason_name(SIZE_MAX), "?");
}

/* --- node concurrency and the queue ----------------------------------------- */

Test(backpressure, calls_run_up_to_max_inflight_then_wait_then_are_refused_with_queue_full) {
    drey_bp_options o = base_options();
    o.max_inflight = 2;
    o.max_queued = 2;
    start(&o);
    call c[5];
    expect(DREY_BP_ADMITTED, &c[0], "alice");
    expect(DREY_BP_ADMITTED, &c[1], "bob");
    expect_counts(2, 0, 2);
    expect(DREY_BP_PARKED, &c[2], "alice");
    expect(DREY_BP_PARKED, &c[3], "carol");
    expect_counts(2, 2, 2);

    drey_status st;
    cr_assert_eq(admit(&c[4], "dave", &st), DREY_BP_REJECTED);
    expect_quota(&st, DREY_ERR_QUEUE_FULL, "node:n1");
    cr_assert_eq(st.retry_delay_ms, BACKOFF_MS);
    expect_meta(&st, "limitInflightCalls", "2");
    expect_meta(&st, "limitQueuedCalls", "2");

    drey_bp_stats s = stats();
    cr_assert_eq(s.rejected[reason("QUEUE_FULL")], 1);
    cr_assert_eq(rejected_total(&s), 1);
    expect_counts(2, 2, 2);

    /* The pipeline's finish hook releases refused calls too: that must be a
     * no-op, not a freed slot. */
    cr_assert(!drey_bp_release(bp, &c[4].t));
    expect_counts(2, 2, 2);

    /* Waiters leave first, so the slots freed after them resume nobody. */
    cr_assert(drey_bp_release(bp, &c[2].t));
    cr_assert(drey_bp_release(bp, &c[3].t));
    expect_counts(2, 0, 2);
    cr_assert(!drey_bp_release(bp, &c[0].t));
    cr_assert(!drey_bp_release(bp, &c[1].t));
    expect_counts(0, 0, 2);
    cr_assert_eq(atomic_load(&c[2].resumed) + atomic_load(&c[3].resumed), 0, "released while waiting: no resume");
}

Test(backpressure, a_release_resumes_the_oldest_waiter_exactly_once) {
    drey_bp_options o = base_options();
    o.max_inflight = 1;
    o.max_queued = 3;
    start(&o);
    call a, b, c, d;
    expect(DREY_BP_ADMITTED, &a, "p1");
    expect(DREY_BP_PARKED, &b, "p2");
    expect(DREY_BP_PARKED, &c, "p3");
    expect(DREY_BP_PARKED, &d, "p4");
    expect_counts(1, 3, 1);

    cr_assert(!drey_bp_release(bp, &a.t), "a ran: not parked");
    cr_assert(wait_resumed(&b));
    cr_assert_eq(atomic_load(&c.resumed) + atomic_load(&d.resumed), 0, "one slot, one resume");
    expect_counts(1, 2, 2);

    /* A second release of the same call frees nothing and resumes nobody. */
    cr_assert(!drey_bp_release(bp, &a.t));
    expect_counts(1, 2, 2);
    cr_assert_eq(atomic_load(&c.resumed), 0);

    cr_assert(!drey_bp_release(bp, &b.t), "b was resumed: it ran");
    cr_assert(wait_resumed(&c));
    cr_assert(!drey_bp_release(bp, &c.t));
    cr_assert(wait_resumed(&d));
    cr_assert(!drey_bp_release(bp, &d.t));
    expect_counts(0, 0, 4);

    cr_assert_eq(b.resumed_as, 1);
    cr_assert_eq(c.resumed_as, 2);
    cr_assert_eq(d.resumed_as, 3);
    call *all[] = {&a, &b, &c, &d};
    for (size_t i = 0; i < 4; i++) {
        cr_assert_eq(atomic_load(&all[i]->resumed), i == 0 ? 0 : 1, "call %zu resumed once", i);
        cr_assert_eq(atomic_load(&all[i]->failed), 0);
    }
    drey_bp_stats s = stats();
    cr_assert_eq(rejected_total(&s), 0);
}

/* Cancelling frees a slot only while the call waits for it: a running call
 * keeps its slot until it is released as done, or callers that give up
 * could let more than max_inflight calls' work run at once. */
Test(backpressure, a_cancel_takes_a_waiter_out_but_leaves_a_running_call_its_slot) {
    drey_bp_options o = base_options();
    o.max_inflight = 1;
    o.max_queued = 2;
    start(&o);
    call a, b, c;
    expect(DREY_BP_ADMITTED, &a, "p1");
    expect(DREY_BP_PARKED, &b, "p2");
    cr_assert(!drey_bp_cancel(bp, &a.t), "a runs: cancel leaves it alone");
    expect_counts(1, 1, 1);
    cr_assert_eq(atomic_load(&b.resumed), 0, "a still holds the slot");
    cr_assert(drey_bp_cancel(bp, &b.t), "b waited: the caller must finish it");
    cr_assert(!drey_bp_cancel(bp, &b.t), "only the first counts");
    expect_counts(1, 0, 1);
    expect(DREY_BP_PARKED, &c, "p3");
    cr_assert(!drey_bp_release(bp, &a.t), "a is done");
    cr_assert(wait_resumed(&c), "c gets the slot a kept until it was done");
    cr_assert_eq(atomic_load(&b.resumed) + atomic_load(&b.failed), 0, "b was cancelled: never resumed");
    cr_assert(!drey_bp_cancel(bp, &c.t), "c runs now");
    cr_assert(!drey_bp_release(bp, &c.t));
    expect_counts(0, 0, 2);
}

Test(backpressure, a_waiter_released_before_its_turn_leaves_the_line_for_good) {
    drey_bp_options o = base_options();
    o.max_inflight = 1;
    o.max_queued = 4;
    o.max_wait_ms = 30;
    start(&o);
    call a, b, c, d, late;
    expect(DREY_BP_ADMITTED, &a, "p");
    expect(DREY_BP_PARKED, &b, "p");
    expect(DREY_BP_PARKED, &c, "p");
    expect(DREY_BP_PARKED, &d, "p");

    cr_assert(drey_bp_release(bp, &c.t), "c was parked: the caller must finish it");
    cr_assert(!drey_bp_release(bp, &c.t), "only the first release counts");
    expect_counts(1, 2, 1);

    /* The line closes up: b, then d, c never. */
    cr_assert(!drey_bp_release(bp, &a.t));
    cr_assert(wait_resumed(&b));
    cr_assert(!drey_bp_release(bp, &b.t));
    cr_assert(wait_resumed(&d));
    expect_counts(1, 0, 3);

    /* c's wait timer must be gone too. The timer thread fires in deadline
     * order, so once a waiter parked after c has timed out, c's timer would
     * have fired already. */
    expect(DREY_BP_PARKED, &late, "q");
    cr_assert(wait_failed(&late));
    cr_assert_eq(late.st.error, DREY_ERR_QUEUE_TIMEOUT);
    cr_assert_eq(atomic_load(&c.resumed), 0);
    cr_assert_eq(atomic_load(&c.failed), 0, "a cancelled waiter gets no fail either");

    drey_bp_stats s = stats();
    cr_assert_eq(s.rejected[reason("QUEUE_TIMEOUT")], 1, "only the late waiter timed out");
    cr_assert_eq(rejected_total(&s), 1);
    cr_assert(!drey_bp_release(bp, &d.t));
    expect_counts(0, 0, 3);
}

/* --- waiting too long --------------------------------------------------------- */

Test(backpressure, a_waiter_fails_with_queue_timeout_after_max_wait) {
    drey_bp_options o = base_options();
    o.max_inflight = 1;
    o.max_wait_ms = 30;
    start(&o);
    call a, b;
    expect(DREY_BP_ADMITTED, &a, "alice");
    int64_t t0 = drey_mono_ns();
    drey_status st;
    /* A deadline later than max_wait: the queue's own limit comes first. */
    cr_assert_eq(admit_dl(&b, "bob", t0 + 60 * 1000000000LL, &st), DREY_BP_PARKED);
    cr_assert(wait_failed(&b));
    cr_assert_geq(drey_mono_ns() - t0, 30 * 1000000LL, "failed before max_wait");

    expect_quota(&b.st, DREY_ERR_QUEUE_TIMEOUT, "node:n1");
    cr_assert_eq(b.st.retry_delay_ms, BACKOFF_MS);
    expect_meta(&b.st, "maxWaitMs", "30");
    cr_assert_eq(atomic_load(&b.resumed), 0);

    drey_bp_stats s = stats();
    cr_assert_eq(s.rejected[reason("QUEUE_TIMEOUT")], 1);
    cr_assert_eq(rejected_total(&s), 1);
    expect_counts(1, 0, 1);

    /* fail came, so its release is not a parked call's. */
    cr_assert(!drey_bp_release(bp, &b.t));
    cr_assert(!drey_bp_release(bp, &a.t));
    expect_counts(0, 0, 1);
    cr_assert_eq(atomic_load(&b.resumed), 0, "a failed waiter is not resumed by a later release");
    cr_assert_eq(atomic_load(&b.failed), 1);
}

Test(backpressure, a_waiter_whose_deadline_comes_first_fails_with_deadline_exceeded) {
    drey_bp_options o = base_options();
    o.max_inflight = 1;
    o.max_wait_ms = 60000;
    start(&o);
    call a, b;
    expect(DREY_BP_ADMITTED, &a, "alice");
    int64_t t0 = drey_mono_ns();
    drey_status st;
    cr_assert_eq(admit_dl(&b, "bob", t0 + 30 * 1000000LL, &st), DREY_BP_PARKED);
    cr_assert(wait_failed(&b));
    cr_assert_geq(drey_mono_ns() - t0, 30 * 1000000LL, "failed before its deadline");

    cr_assert_eq(b.st.error, DREY_ERR_DEADLINE_EXCEEDED);
    cr_assert_eq(drey_status_code(&b.st), GRPC_STATUS_DEADLINE_EXCEEDED);
    /* Not a quota: retrying will not help, so no QuotaFailure or RetryInfo. */
    cr_assert_str_eq(b.st.quota_subject, "");
    cr_assert_lt(b.st.retry_delay_ms, 0);

    drey_bp_stats s = stats();
    cr_assert_eq(s.rejected[reason("DEADLINE_EXCEEDED")], 1);
    cr_assert_eq(s.rejected[reason("QUEUE_TIMEOUT")], 0);
    expect_counts(1, 0, 1);
    drey_bp_release(bp, &a.t);
    drey_bp_release(bp, &b.t);
    expect_counts(0, 0, 1);
}

Test(backpressure, a_call_that_would_wait_past_its_deadline_is_refused_at_once) {
    drey_bp_options o = base_options();
    o.max_inflight = 1;
    start(&o);
    call a, b, c;
    drey_status st;
    /* With room a late call still runs: the deadline only bounds waiting. */
    cr_assert_eq(admit_dl(&a, "alice", drey_mono_ns() - 1, &st), DREY_BP_ADMITTED);
    cr_assert_eq(admit_dl(&b, "bob", drey_mono_ns() - 1, &st), DREY_BP_REJECTED);
    cr_assert_eq(st.error, DREY_ERR_DEADLINE_EXCEEDED);
    cr_assert_str_eq(st.quota_subject, "");
    expect_counts(1, 0, 1);
    cr_assert_eq(stats().rejected[reason("DEADLINE_EXCEEDED")], 1);
    cr_assert_eq(admit(&c, "carol", &st), DREY_BP_PARKED, "the refusal took no place in line");
    cr_assert(!drey_bp_release(bp, &a.t));
    cr_assert(wait_resumed(&c));
    cr_assert(!drey_bp_release(bp, &c.t));
    expect_counts(0, 0, 2);
}

/* --- principals --------------------------------------------------------------- */

Test(backpressure, a_principal_at_its_limit_is_refused_while_another_is_admitted) {
    drey_bp_options o = base_options();
    o.principal_max_inflight = 1;
    o.principal_max_queued = 1;
    start(&o);
    call a1, a2, a3, b1;
    expect(DREY_BP_ADMITTED, &a1, "jwt:alice");
    /* The node has room, but alice does not: she waits. */
    expect(DREY_BP_PARKED, &a2, "jwt:alice");
    drey_status st;
    cr_assert_eq(admit(&a3, "jwt:alice", &st), DREY_BP_REJECTED);
    expect_quota(&st, DREY_ERR_PRINCIPAL_CONCURRENCY_LIMIT, "principal:jwt:alice");
    cr_assert_eq(st.retry_delay_ms, BACKOFF_MS);
    expect_meta(&st, "limitInflightCalls", "1");
    expect_meta(&st, "limitQueuedCalls", "1");

    expect(DREY_BP_ADMITTED, &b1, "conn:7");
    expect_counts(2, 1, 2);
    drey_bp_stats s = stats();
    cr_assert_eq(s.rejected[reason("PRINCIPAL_CONCURRENCY_LIMIT")], 1);
    cr_assert_eq(rejected_total(&s), 1);

    /* bob finishing frees a node slot, not one of alice's. */
    cr_assert(!drey_bp_release(bp, &b1.t));
    cr_assert_eq(atomic_load(&a2.resumed), 0);
    expect_counts(1, 1, 2);
    cr_assert(!drey_bp_release(bp, &a1.t));
    cr_assert(wait_resumed(&a2));
    expect_counts(1, 0, 3);
    cr_assert(!drey_bp_release(bp, &a2.t));
    expect_counts(0, 0, 3);
}

Test(backpressure, the_queue_skips_waiters_whose_principal_is_full) {
    drey_bp_options o = base_options();
    o.max_inflight = 2;
    o.max_queued = 4;
    o.principal_max_inflight = 1;
    start(&o);
    call a1, b1, a2, c1;
    expect(DREY_BP_ADMITTED, &a1, "alice");
    expect(DREY_BP_ADMITTED, &b1, "bob");
    expect(DREY_BP_PARKED, &a2, "alice"); /* first in line */
    expect(DREY_BP_PARKED, &c1, "carol");

    /* A node slot frees while alice is still at her limit: carol goes first. */
    cr_assert(!drey_bp_release(bp, &b1.t));
    cr_assert(wait_resumed(&c1));
    cr_assert_eq(atomic_load(&a2.resumed), 0);
    expect_counts(2, 1, 3);

    cr_assert(!drey_bp_release(bp, &a1.t));
    cr_assert(wait_resumed(&a2));
    expect_counts(2, 0, 4);
    drey_bp_release(bp, &a2.t);
    drey_bp_release(bp, &c1.t);
    expect_counts(0, 0, 4);
    drey_bp_stats s = stats();
    cr_assert_eq(rejected_total(&s), 0);
}

/* --- token buckets ------------------------------------------------------------- */

Test(backpressure, a_principal_past_its_burst_is_rate_limited_while_another_proceeds) {
    drey_bp_options o = base_options();
    /* One token per ten seconds: no refill can land during the test. */
    o.principal_rate = 0.1;
    o.principal_burst = 2;
    start(&o);
    call a[3], b;
    expect(DREY_BP_ADMITTED, &a[0], "alice");
    expect(DREY_BP_ADMITTED, &a[1], "alice");
    drey_status st;
    cr_assert_eq(admit(&a[2], "alice", &st), DREY_BP_REJECTED);
    expect_quota(&st, DREY_ERR_PRINCIPAL_RATE_LIMIT, "principal:alice");
    expect_meta(&st, "limitRequestsPerSecond", "0.1");
    /* RetryInfo says when the bucket holds a token again, not the default. */
    cr_assert_gt(st.retry_delay_ms, 9000, "retry in %lld ms", (long long)st.retry_delay_ms);
    cr_assert_leq(st.retry_delay_ms, 10000, "retry in %lld ms", (long long)st.retry_delay_ms);

    expect(DREY_BP_ADMITTED, &b, "bob");
    drey_bp_stats s = stats();
    cr_assert_eq(s.rejected[reason("PRINCIPAL_RATE_LIMIT")], 1);
    cr_assert_eq(rejected_total(&s), 1);
    expect_counts(3, 0, 3);

    /* Finishing calls returns no tokens: the limit is on rate, not on
     * concurrency. */
    drey_bp_release(bp, &a[0].t);
    drey_bp_release(bp, &a[1].t);
    cr_assert_eq(admit(&a[2], "alice", &st), DREY_BP_REJECTED);
    cr_assert_eq(st.error, DREY_ERR_PRINCIPAL_RATE_LIMIT);
    drey_bp_release(bp, &b.t);
    expect_counts(0, 0, 3);
}

Test(backpressure, the_node_rate_limit_refuses_everyone_past_its_burst) {
    drey_bp_options o = base_options();
    o.node_rate = 0.1;
    o.node_burst = 3;
    start(&o);
    call c[5];
    expect(DREY_BP_ADMITTED, &c[0], "alice");
    expect(DREY_BP_ADMITTED, &c[1], "bob");
    expect(DREY_BP_ADMITTED, &c[2], "carol");
    drey_status st;
    cr_assert_eq(admit(&c[3], "dave", &st), DREY_BP_REJECTED, "a fresh principal is no way around it");
    expect_quota(&st, DREY_ERR_NODE_RATE_LIMIT, "node:n1");
    expect_meta(&st, "limitRequestsPerSecond", "0.1");
    cr_assert_gt(st.retry_delay_ms, 9000, "retry in %lld ms", (long long)st.retry_delay_ms);
    cr_assert_leq(st.retry_delay_ms, 10000, "retry in %lld ms", (long long)st.retry_delay_ms);
    cr_assert_eq(admit(&c[4], "alice", &st), DREY_BP_REJECTED);
    cr_assert_eq(st.error, DREY_ERR_NODE_RATE_LIMIT);

    drey_bp_stats s = stats();
    cr_assert_eq(s.rejected[reason("NODE_RATE_LIMIT")], 2);
    cr_assert_eq(rejected_total(&s), 2);
    expect_counts(3, 0, 3);
    for (int i = 0; i < 3; i++)
        drey_bp_release(bp, &c[i].t);
    expect_counts(0, 0, 3);
}

Test(backpressure, a_call_refused_for_concurrency_spends_no_token) {
    drey_bp_options o = base_options();
    o.max_inflight = 1;
    o.max_queued = 0;
    o.node_rate = 0.1;
    o.node_burst = 2;
    start(&o);
    call a, b, c;
    drey_status st;
    expect(DREY_BP_ADMITTED, &a, "alice");
    cr_assert_eq(admit(&b, "bob", &st), DREY_BP_REJECTED);
    cr_assert_eq(st.error, DREY_ERR_QUEUE_FULL);
    drey_bp_release(bp, &a.t);
    /* The second token is still there for the next call. */
    expect(DREY_BP_ADMITTED, &c, "bob");
    drey_bp_release(bp, &c.t);
    cr_assert_eq(stats().rejected[reason("NODE_RATE_LIMIT")], 0);
}

/* --- the principal table ------------------------------------------------------ */

Test(backpressure, the_principal_table_never_holds_more_than_max_principals) {
    drey_bp_options o = base_options();
    o.max_principals = 8;
    start(&o);
    char name[32];
    for (int i = 0; i < 1000; i++) {
        call c;
        snprintf(name, sizeof name, "conn:%d", i);
        expect(DREY_BP_ADMITTED, &c, name);
        cr_assert_leq(stats().principals, 8, "after admitting principal %d", i);
        cr_assert(!drey_bp_release(bp, &c.t));
    }
    drey_bp_stats s = stats();
    cr_assert_eq(s.principals, 8, "a full table stays full");
    cr_assert_eq(s.admitted, 1000);
    cr_assert_eq(rejected_total(&s), 0);
}

Test(backpressure, idle_principals_are_evicted_least_recently_used_first) {
    drey_bp_options o = base_options();
    o.max_principals = 3;
    start(&o);
    const char *order[] = {"p0", "p1", "p2", "p0", "p3"}; /* p0 touched again: p1 is the oldest */
    for (size_t i = 0; i < 5; i++) {
        call c;
        expect(DREY_BP_ADMITTED, &c, order[i]);
        drey_bp_release(bp, &c.t);
    }
    drey_bp_principal_stats top[4];
    size_t n = drey_bp_top_principals(bp, top, 4);
    cr_assert_eq(n, 3);
    bool seen[4] = {false};
    for (size_t i = 0; i < n; i++) {
        cr_assert_neq(strcmp(top[i].name, "p1"), 0, "p1 was least recently used");
        for (int k = 0; k < 4; k++) {
            char want[16];
            snprintf(want, sizeof want, "p%d", k);
            if (strcmp(top[i].name, want) == 0)
                seen[k] = true;
        }
    }
    cr_assert(seen[0] && seen[2] && seen[3]);
    /* p0's two calls are one entry that survived, not two. */
    for (size_t i = 0; i < n; i++)
        if (strcmp(top[i].name, "p0") == 0)
            cr_assert_eq(top[i].admitted, 2);
}

Test(backpressure, busy_principals_are_never_evicted) {
    drey_bp_options o = base_options();
    o.max_principals = 3;
    start(&o);
    call busy[3], newcomer, idle_after;
    expect(DREY_BP_ADMITTED, &busy[0], "p0");
    expect(DREY_BP_ADMITTED, &busy[1], "p1");
    expect(DREY_BP_ADMITTED, &busy[2], "p2");
    drey_status st;
    /* No idle entry to give up: the newcomer is refused rather than a running
     * principal's limits forgotten. The module reports it node-wide. */
    cr_assert_eq(admit(&newcomer, "p3", &st), DREY_BP_REJECTED);
    expect_quota(&st, DREY_ERR_QUEUE_FULL, "node:n1");
    drey_bp_stats s = stats();
    cr_assert_eq(s.principals, 3);
    cr_assert_eq(s.rejected[reason("QUEUE_FULL")], 1);

    cr_assert(!drey_bp_release(bp, &busy[1].t));
    expect(DREY_BP_ADMITTED, &idle_after, "p3");
    drey_bp_principal_stats top[4];
    size_t n = drey_bp_top_principals(bp, top, 4);
    cr_assert_eq(n, 3);
    for (size_t i = 0; i < n; i++)
        cr_assert_neq(strcmp(top[i].name, "p1"), 0, "the one idle principal made room");
    drey_bp_release(bp, &busy[0].t);
    drey_bp_release(bp, &busy[2].t);
    drey_bp_release(bp, &idle_after.t);
    expect_counts(0, 0, 4);
}

/* --- slowdown ----------------------------------------------------------------- */

/* A principal name is never cut: one cut short would never be found again,
 * and every call of a long-named principal (jwt:{sub} with a long sub)
 * would get a fresh entry with fresh limits. */
Test(backpressure, a_principal_name_of_any_length_is_one_principal) {
    drey_bp_options o = base_options();
    o.principal_max_inflight = 1;
    o.principal_max_queued = 0;
    start(&o);
    char name[300];
    memset(name, 'p', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    call a, b;
    expect(DREY_BP_ADMITTED, &a, name);
    drey_status st;
    cr_assert_eq(admit(&b, name, &st), DREY_BP_REJECTED);
    cr_assert_eq(st.error, DREY_ERR_PRINCIPAL_CONCURRENCY_LIMIT);
    cr_assert_eq(stats().principals, 1);
    drey_bp_release(bp, &a.t);
}

/* A ticket lives in its call's memory, freed once release returns: release
 * must not return while the ticket's timer callback still runs. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool in_callback, release_returned, saw_release, callback_done;
} slow = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, false, false, false};

static void slow_fail(void *arg, const drey_status *st) {
    on_fail(arg, st);
    pthread_mutex_lock(&slow.mu);
    slow.in_callback = true;
    pthread_cond_broadcast(&slow.cv);
    /* Long enough for a release that does not wait to be seen returning. */
    int64_t until = drey_deadline_after_ms(200);
    while (!slow.release_returned && drey_cond_wait_until(&slow.cv, &slow.mu, until) == 0) {
    }
    slow.saw_release = slow.release_returned;
    slow.callback_done = true;
    pthread_cond_broadcast(&slow.cv);
    pthread_mutex_unlock(&slow.mu);
}

Test(backpressure, a_release_waits_for_the_tickets_timer_callback) {
    drey_bp_options o = base_options();
    o.max_inflight = 1;
    o.max_wait_ms = 1;
    start(&o);
    call running, waiter;
    expect(DREY_BP_ADMITTED, &running, "a");
    drey_status st;
    memset(&waiter, 0, sizeof waiter);
    waiter.t.principal = "b";
    waiter.t.deadline_ns = NO_DEADLINE;
    waiter.t.resume = on_resume;
    waiter.t.fail = slow_fail;
    waiter.t.arg = &waiter;
    cr_assert_eq(drey_bp_admit(bp, &waiter.t, &st), DREY_BP_PARKED);
    pthread_mutex_lock(&slow.mu);
    while (!slow.in_callback)
        pthread_cond_wait(&slow.cv, &slow.mu); /* the suite's timeout bounds it */
    pthread_mutex_unlock(&slow.mu);

    cr_assert(!drey_bp_release(bp, &waiter.t), "it timed out: fail came");
    pthread_mutex_lock(&slow.mu);
    slow.release_returned = true;
    pthread_cond_broadcast(&slow.cv);
    while (!slow.callback_done)
        pthread_cond_wait(&slow.cv, &slow.mu);
    bool saw = slow.saw_release;
    pthread_mutex_unlock(&slow.mu);
    cr_assert(!saw, "release returned while the timer callback still used the ticket");
    cr_assert_eq(waiter.st.error, DREY_ERR_QUEUE_TIMEOUT);
    drey_bp_release(bp, &running.t);
}

Test(backpressure, calls_past_slowdown_at_are_held_back_then_resumed) {
    drey_bp_options o = base_options();
    o.max_inflight = 4;
    o.max_queued = 2;
    o.slowdown_at = 2;
    o.slowdown_max_ms = 40;
    start(&o);
    call a, b, c, d, e;
    expect(DREY_BP_ADMITTED, &a, "p");
    expect(DREY_BP_ADMITTED, &b, "p");
    cr_assert_eq(stats().delayed, 0, "at slowdown_at, no hold-back yet");

    /* Linear from slowdown_at to max_inflight: the 3rd running call waits
     * half of slowdown_max, the 4th all of it. */
    int64_t t0 = drey_mono_ns();
    expect(DREY_BP_PARKED, &c, "p");
    drey_bp_stats s = stats();
    cr_assert_eq(s.delayed, 1);
    cr_assert_eq(s.inflight, 3, "a held-back call keeps its slot");
    cr_assert_eq(s.queued, 0, "held back, not queued");
    cr_assert(wait_resumed(&c));
    cr_assert_geq(drey_mono_ns() - t0, 20 * 1000000LL);

    t0 = drey_mono_ns();
    expect(DREY_BP_PARKED, &d, "p");
    cr_assert(wait_resumed(&d));
    cr_assert_geq(drey_mono_ns() - t0, 40 * 1000000LL);
    expect_counts(4, 0, 4);
    cr_assert_eq(stats().delayed, 2);

    /* A call that waited in line is not held back again on top of it. */
    expect(DREY_BP_PARKED, &e, "p");
    cr_assert(!drey_bp_release(bp, &a.t));
    cr_assert(wait_resumed(&e));
    cr_assert_eq(stats().delayed, 2);

    cr_assert(!drey_bp_release(bp, &c.t), "resumed: it ran");
    call *rest[] = {&b, &d, &e};
    for (size_t i = 0; i < 3; i++)
        cr_assert(!drey_bp_release(bp, &rest[i]->t));
    expect_counts(0, 0, 5);
    cr_assert_eq(atomic_load(&c.resumed) + atomic_load(&d.resumed) + atomic_load(&e.resumed), 3);
}

Test(backpressure, a_held_back_call_released_early_gives_its_slot_back_and_never_resumes) {
    drey_bp_options o = base_options();
    o.max_inflight = 3;
    o.slowdown_at = 1;
    o.slowdown_max_ms = 1000; /* the 2nd running call is held 500 ms */
    start(&o);
    call a, b, c;
    expect(DREY_BP_ADMITTED, &a, "p");
    expect(DREY_BP_PARKED, &b, "p");
    expect_counts(2, 0, 2);
    cr_assert(drey_bp_release(bp, &b.t), "still held back: the caller finishes it");
    expect_counts(1, 0, 2);

    /* c is held as long as b was, from later: once c resumes, b's timer
     * would have fired. */
    expect(DREY_BP_PARKED, &c, "p");
    cr_assert(wait_resumed(&c));
    cr_assert_eq(atomic_load(&b.resumed), 0);
    cr_assert_eq(atomic_load(&b.failed), 0);
    cr_assert_eq(stats().delayed, 2);
    drey_bp_release(bp, &a.t);
    drey_bp_release(bp, &c.t);
    expect_counts(0, 0, 3);
}

/* --- top principals ------------------------------------------------------------ */

Test(backpressure, top_principals_orders_by_rejections_and_respects_n) {
    drey_bp_options o = base_options();
    o.principal_max_inflight = 1;
    o.principal_max_queued = 0;
    start(&o);
    const char *names[] = {"alice", "bob", "carol", "dave"};
    const int refusals[] = {1, 3, 2, 0};
    call running[4];
    for (int i = 0; i < 4; i++) {
        expect(DREY_BP_ADMITTED, &running[i], names[i]);
        for (int k = 0; k < refusals[i]; k++) {
            call extra;
            drey_status st;
            cr_assert_eq(admit(&extra, names[i], &st), DREY_BP_REJECTED);
            cr_assert_eq(st.error, DREY_ERR_PRINCIPAL_CONCURRENCY_LIMIT);
        }
    }

    drey_bp_principal_stats top[5];
    memset(top, 0, sizeof top);
    strcpy(top[2].name, "untouched");
    cr_assert_eq(drey_bp_top_principals(bp, top, 2), 2);
    cr_assert_str_eq(top[0].name, "bob");
    cr_assert_eq(top[0].rejected, 3);
    cr_assert_str_eq(top[1].name, "carol");
    cr_assert_eq(top[1].rejected, 2);
    cr_assert_str_eq(top[2].name, "untouched", "n bounds what is written");

    cr_assert_eq(drey_bp_top_principals(bp, top, 5), 4, "only as many as there are");
    const char *want[] = {"bob", "carol", "alice", "dave"};
    const uint64_t want_rejected[] = {3, 2, 1, 0};
    for (int i = 0; i < 4; i++) {
        cr_assert_str_eq(top[i].name, want[i], "rank %d", i);
        cr_assert_eq(top[i].rejected, want_rejected[i]);
        cr_assert_eq(top[i].admitted, 1);
        cr_assert_eq(top[i].inflight, 1);
        cr_assert_eq(top[i].queued, 0);
    }
    cr_assert_eq(drey_bp_top_principals(bp, NULL, 0), 0);

    for (int i = 0; i < 4; i++)
        drey_bp_release(bp, &running[i].t);
    cr_assert_eq(drey_bp_top_principals(bp, top, 1), 1);
    cr_assert_str_eq(top[0].name, "bob");
    cr_assert_eq(top[0].inflight, 0, "figures are current");
    cr_assert_eq(stats().rejected[reason("PRINCIPAL_CONCURRENCY_LIMIT")], 6);
}

/* The metrics' series: the busiest n by calls admitted plus refused, the
 * rest summed as "other", so a thousand connections make one more series,
 * not a thousand. */
Test(backpressure, busiest_principals_cap_the_series_with_an_other_row) {
    drey_bp_options o = base_options();
    start(&o);
    const char *names[] = {"conn:1", "conn:2", "conn:3", "jwt:big", "jwt:mid"};
    const int calls[] = {1, 1, 2, 7, 4};
    for (int i = 0; i < 5; i++) {
        for (int k = 0; k < calls[i]; k++) {
            call c;
            expect(DREY_BP_ADMITTED, &c, names[i]);
            drey_bp_release(bp, &c.t);
        }
    }
    drey_bp_principal_stats top[3], rest;
    cr_assert_eq(drey_bp_busiest_principals(bp, top, 2, &rest), 2);
    cr_assert_str_eq(top[0].name, "jwt:big");
    cr_assert_eq(top[0].admitted, 7);
    cr_assert_str_eq(top[1].name, "jwt:mid");
    cr_assert_str_eq(rest.name, "other");
    cr_assert_eq(rest.admitted, 4, "conn:1, conn:2 and conn:3 summed");
    cr_assert_eq(rest.rejected, 0);

    /* Ties go by name: the same set at every scrape. */
    cr_assert_eq(drey_bp_busiest_principals(bp, top, 3, &rest), 3);
    cr_assert_str_eq(top[2].name, "conn:3");
    cr_assert_eq(drey_bp_busiest_principals(bp, top, 3, &rest), 3);
    cr_assert_eq(rest.admitted, 2);
    memset(top, 0, sizeof top);
    cr_assert_eq(drey_bp_busiest_principals(bp, top, 0, &rest), 0, "n = 0: everyone is other");
    cr_assert_eq(rest.admitted, 15);
    drey_bp_principal_stats all[8];
    cr_assert_eq(drey_bp_busiest_principals(bp, all, 8, &rest), 5, "only as many as there are");
    cr_assert_eq(rest.admitted, 0);
    cr_assert_str_eq(all[3].name, "conn:1");
    cr_assert_str_eq(all[4].name, "conn:2");
}

/* --- many threads -------------------------------------------------------------- */

#define THREADS 8
#define ROUNDS 1500

typedef struct worker {
    pthread_barrier_t *go;
    int id;
    call *calls;
    drey_bp_result *results;
    bool *cancelled;
    int errors;          /* contract breaches seen on this thread */
    char first_error[128];
} worker;

static void worker_error(worker *w, const char *what, int round) {
    if (w->errors++ == 0)
        snprintf(w->first_error, sizeof w->first_error, "thread %d round %d: %s", w->id, round, what);
}

static void *work(void *arg) {
    static const char *const principals[] = {"p0", "p1", "p2", "p3", "p4"};
    worker *w = arg;
    pthread_barrier_wait(w->go);
    for (int i = 0; i < ROUNDS; i++) {
        call *c = &w->calls[i];
        drey_status st;
        drey_bp_result r = admit(c, principals[(w->id + i) % 5], &st);
        w->results[i] = r;
        if (r == DREY_BP_ADMITTED) {
            sched_yield(); /* hold the slot for a moment so others queue */
            if (drey_bp_release(bp, &c->t))
                worker_error(w, "a running call released as parked", i);
        } else if (r == DREY_BP_PARKED) {
            if (i % 5 == 0 && drey_bp_release(bp, &c->t)) {
                /* Cancelled while waiting: no callback may follow. */
                w->cancelled[i] = true;
                continue;
            }
            /* Either not cancelled, or cancelled too late: resume or fail is
             * on its way, possibly from another thread. */
            if (!wait_count2(&c->resumed, &c->failed, 1, WAIT_MS)) {
                worker_error(w, "no resume or fail", i);
                continue;
            }
            if (atomic_load(&c->resumed) && drey_bp_release(bp, &c->t))
                worker_error(w, "a resumed call released as parked", i);
        }
    }
    return NULL;
}

static void hammer(const drey_bp_options *o) {
    start(o);
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, THREADS);
    worker w[THREADS];
    pthread_t th[THREADS];
    for (int k = 0; k < THREADS; k++) {
        w[k] = (worker){.go = &go, .id = k};
        w[k].calls = calloc(ROUNDS, sizeof *w[k].calls);
        w[k].results = calloc(ROUNDS, sizeof *w[k].results);
        w[k].cancelled = calloc(ROUNDS, sizeof *w[k].cancelled);
        cr_assert(w[k].calls && w[k].results && w[k].cancelled);
        cr_assert_eq(pthread_create(&th[k], NULL, work, &w[k]), 0);
    }
    for (int k = 0; k < THREADS; k++)
        pthread_join(th[k], NULL);
    pthread_barrier_destroy(&go);

    /* Stop the timer thread so no callback can still be on its way while
     * the counts are taken. */
    drey_timers_destroy(timers);
    timers = NULL;

    uint64_t admitted_now = 0, parked = 0, rejected = 0, resumed = 0, failed = 0, cancelled = 0;
    for (int k = 0; k < THREADS; k++) {
        cr_assert_eq(w[k].errors, 0, "%d errors, first: %s", w[k].errors, w[k].first_error);
        for (int i = 0; i < ROUNDS; i++) {
            call *c = &w[k].calls[i];
            int res = atomic_load(&c->resumed), fl = atomic_load(&c->failed);
            switch (w[k].results[i]) {
            case DREY_BP_ADMITTED:
                admitted_now++;
                cr_assert_eq(res + fl, 0, "an admitted call gets no callback");
                break;
            case DREY_BP_REJECTED:
                rejected++;
                cr_assert_eq(res + fl, 0, "a refused call gets no callback");
                break;
            case DREY_BP_PARKED:
                parked++;
                /* Exactly one way out of the parking lot. */
                cr_assert_eq(res + fl + (w[k].cancelled[i] ? 1 : 0), 1,
                             "thread %d round %d: resumed %d, failed %d, cancelled %d", k, i, res, fl,
                             w[k].cancelled[i]);
                resumed += (uint64_t)res;
                failed += (uint64_t)fl;
                cancelled += w[k].cancelled[i];
                break;
            }
        }
        free(w[k].calls);
        free(w[k].results);
        free(w[k].cancelled);
    }
    drey_bp_stats s = stats();
    cr_assert_eq(s.inflight, 0);
    cr_assert_eq(s.queued, 0);
    cr_assert_eq(admitted_now + parked + rejected, (uint64_t)THREADS * ROUNDS);
    cr_assert_eq(rejected_total(&s), rejected + failed, "stats %llu, seen %llu + %llu",
                 (unsigned long long)rejected_total(&s), (unsigned long long)rejected, (unsigned long long)failed);
    /* A held-back call is counted when it takes its slot, so one cancelled
     * during its hold-back is admitted without a resume; a queued one
     * cancelled is never admitted. */
    cr_assert_geq(s.admitted, admitted_now + resumed);
    cr_assert_leq(s.admitted, admitted_now + resumed + cancelled);
    if (o->slowdown_max_ms == 0) {
        cr_assert_eq(s.delayed, 0);
        cr_assert_eq(s.admitted, admitted_now + resumed, "stats %llu, seen %llu + %llu",
                     (unsigned long long)s.admitted, (unsigned long long)admitted_now, (unsigned long long)resumed);
    } else {
        cr_assert_leq(s.delayed, parked);
    }
    cr_assert_gt(parked, 0, "the test should make calls wait");
    cr_assert_gt(resumed, 0, "and be resumed");
    cr_assert(s.principals <= o->max_principals);
}

Test(backpressure, many_threads_admitting_and_releasing_leave_consistent_counts) {
    drey_bp_options o = base_options();
    o.max_inflight = 4;
    o.max_queued = 3;
    o.max_wait_ms = 2000;
    o.principal_max_inflight = 2;
    o.principal_max_queued = 2;
    o.max_principals = 16;
    hammer(&o);
}

Test(backpressure, many_threads_with_slowdown_leave_consistent_counts) {
    drey_bp_options o = base_options();
    o.max_inflight = 4;
    o.max_queued = 3;
    o.max_wait_ms = 2000;
    o.slowdown_at = 2;
    o.slowdown_max_ms = 1;
    o.principal_max_inflight = 2;
    o.principal_max_queued = 2;
    o.max_principals = 16;
    hammer(&o);
}
