/*
 * Unit tests for src/timer/timer.c: the deadline heap and its thread.
 *
 * Every test runs against the real timer thread. Callbacks only record what
 * happened (under a mutex, with a condition variable the test waits on);
 * the assertions run on the test's thread. Waits end at a 5 s deadline so a
 * timer that never fires fails the test instead of hanging it, and timing
 * checks are one-sided: a timer never fires before its deadline.
 *
 * Where a test must show that a timer did NOT fire, it arms a sentinel with
 * a later deadline and waits for that: one thread fires timers in deadline
 * order, so once the sentinel has run the earlier timer had its chance.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "drey/clock.h"
#include "drey/timer.h"

#define MS 1000000LL
#define WAIT_LIMIT_NS (5000 * MS)
#define MAX_FIRED 256

static drey_timers *timers;

/* What the callbacks saw, in firing order. */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* on CLOCK_MONOTONIC, like the module's own */
    int n;
    int ids[MAX_FIRED];
} fired;

static void setup(void) {
    pthread_mutex_init(&fired.mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&fired.cv, &ca);
    pthread_condattr_destroy(&ca);
    fired.n = 0;
    timers = drey_timers_create();
    cr_assert_not_null(timers);
}

static void teardown(void) {
    drey_timers_destroy(timers);
    timers = NULL;
    pthread_cond_destroy(&fired.cv);
    pthread_mutex_destroy(&fired.mu);
}

TestSuite(timer, .init = setup, .fini = teardown, .timeout = 30);

/* --- helpers -------------------------------------------------------------- */

typedef struct probe {
    drey_timer t;
    int id;
    atomic_int calls;
    _Atomic int64_t fired_ns;
} probe;

static void record(void *arg) {
    probe *p = arg;
    atomic_store(&p->fired_ns, drey_mono_ns());
    atomic_fetch_add(&p->calls, 1);
    pthread_mutex_lock(&fired.mu);
    if (fired.n < MAX_FIRED)
        fired.ids[fired.n] = p->id;
    fired.n++;
    pthread_cond_broadcast(&fired.cv);
    pthread_mutex_unlock(&fired.mu);
}

static void probe_init(probe *p, int id, int64_t at_ns) {
    memset(p, 0, sizeof *p);
    p->id = id;
    p->t.at_ns = at_ns;
    p->t.fn = record;
    p->t.arg = p;
}

static void arm_probe(probe *p, int id, int64_t at_ns) {
    probe_init(p, id, at_ns);
    drey_timer_arm(timers, &p->t);
}

static struct timespec abs_deadline(int64_t at_ns) {
    return (struct timespec){.tv_sec = at_ns / 1000000000, .tv_nsec = at_ns % 1000000000};
}

/* Waits until at least n callbacks have recorded; false at the deadline. */
static bool wait_fired(int n) {
    struct timespec until = abs_deadline(drey_mono_ns() + WAIT_LIMIT_NS);
    bool ok = true;
    pthread_mutex_lock(&fired.mu);
    while (fired.n < n && ok)
        ok = pthread_cond_timedwait(&fired.cv, &fired.mu, &until) == 0 || fired.n >= n;
    pthread_mutex_unlock(&fired.mu);
    return ok;
}

static int fired_count(void) {
    pthread_mutex_lock(&fired.mu);
    int n = fired.n;
    pthread_mutex_unlock(&fired.mu);
    return n;
}

/* Polls an atomic until it reaches want; the pause only paces the loop. */
static bool wait_atomic_at_least(atomic_long *v, long want) {
    int64_t limit = drey_mono_ns() + WAIT_LIMIT_NS;
    while (atomic_load(v) < want) {
        if (drey_mono_ns() > limit)
            return false;
        nanosleep(&(struct timespec){.tv_nsec = 200000}, NULL);
    }
    return true;
}

/* A callback that holds the timer thread until the test opens it: while it
 * runs nothing else can fire, so a test can arm a whole set of timers and
 * release them at once, whatever the scheduler does meanwhile. */
typedef struct gate {
    drey_timer t;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool entered, open;
} gate;

static void gate_cb(void *arg) {
    gate *g = arg;
    pthread_mutex_lock(&g->mu);
    g->entered = true;
    pthread_cond_broadcast(&g->cv);
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void gate_arm(gate *g, drey_timers *on) {
    memset(g, 0, sizeof *g);
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->t.at_ns = drey_mono_ns() - MS;
    g->t.fn = gate_cb;
    g->t.arg = g;
    drey_timer_arm(on, &g->t);
}

/* Waits (without a deadline of its own: the suite's timeout catches a
 * gate that is never entered) until the timer thread is inside gate_cb. */
static void gate_wait_entered(gate *g) {
    pthread_mutex_lock(&g->mu);
    while (!g->entered)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void gate_open(gate *g) {
    pthread_mutex_lock(&g->mu);
    g->open = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void gate_destroy(gate *g) {
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
}

/* --- ordering and deadlines ----------------------------------------------- */

/* Armed out of order while the timer thread is held, released together: they
 * run by deadline, including the ones whose deadline passed while held. */
Test(timer, timers_fire_in_deadline_order_not_arming_order) {
    gate g;
    gate_arm(&g, timers);
    gate_wait_entered(&g);

    static const int offsets_ms[] = {30, -5, 20, 0, 10, -10, 25, 5};
    enum { N = sizeof offsets_ms / sizeof offsets_ms[0] };
    probe p[N];
    int64_t now = drey_mono_ns();
    for (int i = 0; i < N; i++)
        arm_probe(&p[i], i, now + offsets_ms[i] * MS);
    gate_open(&g);

    cr_assert(wait_fired(N), "only %d of %d timers fired", fired_count(), N);
    for (int k = 1; k < N; k++) {
        int before = fired.ids[k - 1], after = fired.ids[k];
        cr_assert(lt(int, offsets_ms[before], offsets_ms[after]), "timer %d (%+d ms) ran before timer %d (%+d ms)",
                  before, offsets_ms[before], after, offsets_ms[after]);
    }
    for (int i = 0; i < N; i++) {
        cr_assert(eq(int, atomic_load(&p[i].calls), 1));
        cr_assert(ge(i64, atomic_load(&p[i].fired_ns), p[i].t.at_ns), "timer %d fired before its deadline", i);
    }
    gate_destroy(&g);
}

/* Without a gate: a timer armed after a later one still fires first, and
 * neither fires early. */
Test(timer, a_later_armed_earlier_deadline_fires_first_and_not_early) {
    probe late, early;
    int64_t now = drey_mono_ns();
    arm_probe(&late, 1, now + 80 * MS);
    arm_probe(&early, 2, now + 10 * MS);
    cr_assert(wait_fired(2));
    cr_assert(eq(int, fired.ids[0], 2));
    cr_assert(eq(int, fired.ids[1], 1));
    cr_assert(ge(i64, atomic_load(&early.fired_ns), early.t.at_ns));
    cr_assert(ge(i64, atomic_load(&late.fired_ns), late.t.at_ns));
}

/* A deadline already passed (by a second, or at the clock's origin) is due
 * at once: the thread must not sleep on it. */
Test(timer, a_timer_armed_in_the_past_fires_promptly) {
    probe a, b;
    arm_probe(&a, 1, drey_mono_ns() - 1000 * MS);
    arm_probe(&b, 2, 0);
    cr_assert(wait_fired(2), "a timer in the past did not fire within 5 s");
    cr_assert(eq(int, atomic_load(&a.calls), 1));
    cr_assert(eq(int, atomic_load(&b.calls), 1));
}

/* The thread may be asleep until a far deadline: an earlier timer armed
 * meanwhile must wake it, not wait behind the far one. */
Test(timer, an_earlier_timer_wakes_a_thread_sleeping_on_a_far_deadline) {
    probe far, soon;
    arm_probe(&far, 1, drey_mono_ns() + 3600 * 1000 * MS);
    /* Pacing only: lets the thread reach its timed wait on the far deadline;
     * the test passes either way, it just covers less if it has not. */
    nanosleep(&(struct timespec){.tv_nsec = 2 * MS}, NULL);
    arm_probe(&soon, 2, drey_mono_ns() + 5 * MS);
    cr_assert(wait_fired(1), "the far timer's sleep hid the earlier one");
    cr_assert(eq(int, fired.ids[0], 2));
    cr_assert(eq(int, atomic_load(&far.calls), 0));
    cr_assert(drey_timer_cancel(timers, &far.t));
}

/* --- cancel --------------------------------------------------------------- */

Test(timer, cancel_before_firing_returns_true_and_the_callback_never_runs) {
    probe doomed, sentinel;
    int64_t now = drey_mono_ns();
    arm_probe(&doomed, 1, now + 30 * MS);
    arm_probe(&sentinel, 2, now + 50 * MS);
    cr_assert(drey_timer_cancel(timers, &doomed.t));
    cr_assert(eq(sz, doomed.t.heap_index_, SIZE_MAX), "a cancelled timer reads as not armed");

    cr_assert(wait_fired(1));
    cr_assert(eq(int, fired.ids[0], 2));
    cr_assert(eq(int, atomic_load(&doomed.calls), 0), "a cancelled timer ran");
    cr_assert(not(drey_timer_cancel(timers, &doomed.t)), "a second cancel found it armed");
}

/* Cancelling one timer out of the middle of a full heap leaves the others
 * firing in order (the heap is repaired around the hole). */
Test(timer, cancel_from_the_middle_keeps_the_rest_in_order) {
    gate g;
    gate_arm(&g, timers);
    gate_wait_entered(&g);
    enum { N = 100 };
    static probe p[N];
    int64_t now = drey_mono_ns();
    /* Deadlines in a scrambled order, so the heap has real structure. */
    for (int i = 0; i < N; i++)
        arm_probe(&p[i], i, now + (int64_t)((i * 37) % N) * 100000);
    int cancelled = 0;
    for (int i = 0; i < N; i += 3) {
        cr_assert(drey_timer_cancel(timers, &p[i].t), "timer %d was not armed", i);
        cancelled++;
    }
    gate_open(&g);

    cr_assert(wait_fired(N - cancelled));
    for (int k = 1; k < N - cancelled; k++)
        cr_assert(lt(i64, p[fired.ids[k - 1]].t.at_ns, p[fired.ids[k]].t.at_ns), "out of order at %d", k);
    for (int i = 0; i < N; i++)
        cr_assert(eq(int, atomic_load(&p[i].calls), i % 3 == 0 ? 0 : 1), "timer %d", i);
    gate_destroy(&g);
}

Test(timer, cancel_after_it_fired_returns_false) {
    probe p;
    arm_probe(&p, 1, drey_mono_ns());
    cr_assert(wait_fired(1));
    cr_assert(not(drey_timer_cancel(timers, &p.t)));
    cr_assert(eq(int, atomic_load(&p.calls), 1));
}

/* A timer never armed may be zero-filled, its heap_index_ 0: cancel must see
 * that the heap's slot 0 holds another timer and leave that one alone. */
Test(timer, cancel_of_a_timer_never_armed_returns_false_and_disturbs_nothing) {
    probe armed, sentinel;
    int64_t now = drey_mono_ns();
    arm_probe(&armed, 1, now + 10 * MS);
    arm_probe(&sentinel, 2, now + 20 * MS);

    drey_timer zeroed;
    memset(&zeroed, 0, sizeof zeroed);
    cr_assert(not(drey_timer_cancel(timers, &zeroed)));
    drey_timer marked = {.heap_index_ = SIZE_MAX};
    cr_assert(not(drey_timer_cancel(timers, &marked)));
    drey_timer out_of_range = {.heap_index_ = 12345};
    cr_assert(not(drey_timer_cancel(timers, &out_of_range)));

    cr_assert(wait_fired(2), "a bogus cancel removed an armed timer");
    cr_assert(eq(int, fired.ids[0], 1));
    cr_assert(eq(int, fired.ids[1], 2));
}

Test(timer, a_cancelled_timer_can_be_armed_again) {
    probe p;
    arm_probe(&p, 1, drey_mono_ns() + 3600 * 1000 * MS);
    cr_assert(drey_timer_cancel(timers, &p.t));
    p.t.at_ns = drey_mono_ns() + 5 * MS;
    drey_timer_arm(timers, &p.t);
    cr_assert(wait_fired(1));
    cr_assert(eq(int, atomic_load(&p.calls), 1));
    cr_assert(ge(i64, atomic_load(&p.fired_ns), p.t.at_ns));
}

Test(timer, a_fired_timer_can_be_armed_again) {
    probe p;
    arm_probe(&p, 1, drey_mono_ns());
    cr_assert(wait_fired(1));
    p.t.at_ns = drey_mono_ns() + 5 * MS;
    drey_timer_arm(timers, &p.t);
    cr_assert(wait_fired(2));
    cr_assert(eq(int, atomic_load(&p.calls), 2));
}

/* Arming an armed timer moves it: one heap entry, at the new time. (Twice
 * in the heap, a true cancel could still leave its callback to run.) */
Test(timer, arming_an_armed_timer_moves_it_and_it_fires_once) {
    probe p;
    arm_probe(&p, 1, drey_mono_ns() + 3600 * 1000 * MS);
    p.t.at_ns = drey_mono_ns() + 5 * MS;
    drey_timer_arm(timers, &p.t);
    cr_assert(wait_fired(1));
    cr_assert(not(drey_timer_cancel(timers, &p.t)), "nothing of it is left armed");
    cr_assert(eq(int, atomic_load(&p.calls), 1));
}

typedef struct syncer {
    drey_timer *t;
    atomic_bool returned;
} syncer;

static void *sync_thread(void *arg) {
    syncer *s = arg;
    drey_timer_sync(timers, s->t);
    atomic_store(&s->returned, true);
    return NULL;
}

/* sync is how a timer's owner knows it may free it: it returns only once the
 * callback has returned. */
Test(timer, sync_waits_for_the_running_callback) {
    gate g;
    gate_arm(&g, timers);
    gate_wait_entered(&g);
    syncer s = {.t = &g.t};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, sync_thread, &s), 0);
    /* Absence takes time to show: 50 ms of the callback still running. */
    int64_t until = drey_mono_ns() + 50 * MS;
    while (drey_mono_ns() < until) {
        cr_assert(not(atomic_load(&s.returned)), "sync returned while the callback ran");
        nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
    }
    gate_open(&g);
    pthread_join(th, NULL);
    cr_assert(atomic_load(&s.returned));
    gate_destroy(&g);
}

static void sync_self(void *arg) {
    probe *p = arg;
    drey_timer_sync(timers, &p->t); /* would wait for itself forever */
    record(p);
}

Test(timer, sync_from_its_own_callback_or_of_an_idle_timer_returns_at_once) {
    probe idle;
    probe_init(&idle, 1, 0);
    drey_timer_sync(timers, &idle.t);
    probe p;
    probe_init(&p, 2, drey_mono_ns());
    p.t.fn = sync_self;
    drey_timer_arm(timers, &p.t);
    cr_assert(wait_fired(1), "the callback did not get past its own sync");
}

/* The callback is off the heap before it runs and cancel does not wait for
 * it: a cancel racing a running callback returns false at once. (If cancel
 * waited for the callback, this test would deadlock: the gate only opens
 * after cancel returns.) */
Test(timer, cancel_while_its_callback_runs_returns_false_without_waiting) {
    gate g;
    gate_arm(&g, timers);
    gate_wait_entered(&g);
    cr_assert(not(drey_timer_cancel(timers, &g.t)));
    gate_open(&g);

    /* The thread is free again once the gate callback returns. */
    probe after;
    arm_probe(&after, 1, drey_mono_ns());
    cr_assert(wait_fired(1));
    gate_destroy(&g);
}

/* --- callbacks that use the timers ---------------------------------------- */

/* A callback runs without the module's mutex held (timer.c says so), so it
 * may arm and cancel other timers. */
typedef struct meddler {
    drey_timer t;
    probe *to_arm;
    probe *to_cancel;
    atomic_int cancel_result; /* -1 until the callback ran */
} meddler;

static void meddle(void *arg) {
    meddler *m = arg;
    atomic_store(&m->cancel_result, drey_timer_cancel(timers, &m->to_cancel->t) ? 1 : 0);
    /* Its own deadline: earlier than anything else the test armed, so it runs
     * next whatever the scheduler did meanwhile. */
    m->to_arm->t.at_ns = m->t.at_ns;
    drey_timer_arm(timers, &m->to_arm->t);
}

Test(timer, a_callback_may_arm_and_cancel_other_timers) {
    probe armed_later, victim, sentinel;
    int64_t now = drey_mono_ns();
    probe_init(&armed_later, 1, 0);
    arm_probe(&victim, 2, now + 20 * MS);
    arm_probe(&sentinel, 3, now + 40 * MS);
    meddler m = {.t = {.at_ns = now, .fn = meddle}, .to_arm = &armed_later, .to_cancel = &victim};
    m.t.arg = &m;
    atomic_init(&m.cancel_result, -1);
    drey_timer_arm(timers, &m.t);

    cr_assert(wait_fired(2));
    cr_assert(eq(int, atomic_load(&m.cancel_result), 1), "the callback's cancel did not find the victim armed");
    cr_assert(eq(int, fired.ids[0], 1));
    cr_assert(eq(int, fired.ids[1], 3));
    cr_assert(eq(int, atomic_load(&armed_later.calls), 1));
    cr_assert(eq(int, atomic_load(&victim.calls), 0));
}

/* A periodic timer: the callback re-arms its own timer, which is already off
 * the heap, and cancel from inside its own callback finds nothing armed. */
typedef struct ticker {
    drey_timer t;
    atomic_long ticks;
    atomic_int self_cancel_found;
    long stop_after;
} ticker;

static void tick(void *arg) {
    ticker *k = arg;
    if (drey_timer_cancel(timers, &k->t))
        atomic_store(&k->self_cancel_found, 1);
    long n = atomic_fetch_add(&k->ticks, 1) + 1;
    if (n < k->stop_after) {
        k->t.at_ns = drey_mono_ns() + MS;
        drey_timer_arm(timers, &k->t);
    }
}

Test(timer, a_callback_may_re_arm_its_own_timer) {
    ticker k = {.t = {.at_ns = drey_mono_ns(), .fn = tick}, .stop_after = 5};
    k.t.arg = &k;
    drey_timer_arm(timers, &k.t);
    cr_assert(wait_atomic_at_least(&k.ticks, 5), "ticked %ld times", atomic_load(&k.ticks));
    cr_assert(eq(int, atomic_load(&k.self_cancel_found), 0), "a running timer was still on the heap");

    /* It stopped re-arming itself: a sentinel after its would-be next tick
     * runs, and the count has not moved. */
    probe sentinel;
    arm_probe(&sentinel, 1, drey_mono_ns() + 5 * MS);
    cr_assert(wait_fired(1));
    cr_assert(eq(long, atomic_load(&k.ticks), 5));
    cr_assert(not(drey_timer_cancel(timers, &k.t)));
}

/* --- many timers, several threads ----------------------------------------- */

enum { ARMERS = 8, PER_ARMER = 1000 };

typedef struct bulk_timer {
    drey_timer t;
    atomic_int calls;
    bool cancelled; /* cancel returned true; written by its armer only */
} bulk_timer;

static bulk_timer bulk[ARMERS][PER_ARMER];
static atomic_long bulk_fired;
static int64_t bulk_base_ns;

static void bulk_cb(void *arg) {
    bulk_timer *b = arg;
    atomic_fetch_add(&b->calls, 1);
    atomic_fetch_add(&bulk_fired, 1);
}

/* Arms its share with deadlines spread over 20 ms (some already due) and
 * cancels every third right away, racing the timer thread for the due ones. */
static void *armer(void *arg) {
    bulk_timer *mine = arg;
    for (int i = 0; i < PER_ARMER; i++) {
        mine[i].t = (drey_timer){.at_ns = bulk_base_ns + (int64_t)(i % 21 - 1) * MS, .fn = bulk_cb, .arg = &mine[i]};
        drey_timer_arm(timers, &mine[i].t);
        if (i % 3 == 0)
            mine[i].cancelled = drey_timer_cancel(timers, &mine[i].t);
    }
    return NULL;
}

Test(timer, thousands_of_timers_from_several_threads_fire_exactly_once) {
    memset(bulk, 0, sizeof bulk);
    atomic_store(&bulk_fired, 0);
    bulk_base_ns = drey_mono_ns();
    pthread_t th[ARMERS];
    for (int i = 0; i < ARMERS; i++)
        cr_assert(eq(int, pthread_create(&th[i], NULL, armer, bulk[i]), 0));
    for (int i = 0; i < ARMERS; i++)
        pthread_join(th[i], NULL);

    long expected = 0;
    for (int a = 0; a < ARMERS; a++)
        for (int i = 0; i < PER_ARMER; i++)
            expected += !bulk[a][i].cancelled;
    cr_assert(gt(long, expected, ARMERS * PER_ARMER / 2));
    cr_assert(wait_atomic_at_least(&bulk_fired, expected), "%ld of %ld fired", atomic_load(&bulk_fired), expected);

    /* Every bulk deadline is behind the sentinel's: once it has run, any
     * duplicate or cancelled-but-fired timer would already show. */
    probe sentinel;
    int64_t after_all = bulk_base_ns + 25 * MS, now = drey_mono_ns();
    arm_probe(&sentinel, 1, (now > after_all ? now : after_all) + MS);
    cr_assert(wait_fired(1));
    cr_assert(eq(long, atomic_load(&bulk_fired), expected));
    for (int a = 0; a < ARMERS; a++)
        for (int i = 0; i < PER_ARMER; i++)
            cr_assert(eq(int, atomic_load(&bulk[a][i].calls), bulk[a][i].cancelled ? 0 : 1),
                      "armer %d timer %d (cancelled: %d)", a, i, bulk[a][i].cancelled);
}

/* --- destroy -------------------------------------------------------------- */

/* Timers left armed at destroy never run, and the heap (grown past its first
 * 64 slots here) is freed: ASan's leak check covers the "does not leak". */
Test(timer, destroy_with_armed_timers_never_fires_them) {
    drey_timers *own = drey_timers_create();
    enum { FAR = 100, NEAR = 100 };
    static probe far[FAR], near[NEAR];
    int64_t now = drey_mono_ns();
    for (int i = 0; i < FAR; i++) {
        probe_init(&far[i], 1000 + i, now + 3600 * 1000 * MS);
        drey_timer_arm(own, &far[i].t);
    }
    /* Due shortly: some may fire before destroy gets the thread to stop, but
     * none after. */
    for (int i = 0; i < NEAR; i++) {
        probe_init(&near[i], 2000 + i, now + 20 * MS);
        drey_timer_arm(own, &near[i].t);
    }
    drey_timers_destroy(own);
    int at_destroy = fired_count();

    /* Past the near deadlines, measured on the suite's own timer thread. */
    probe sentinel;
    arm_probe(&sentinel, 1, drey_mono_ns() + 30 * MS);
    cr_assert(wait_fired(at_destroy + 1));
    cr_assert(eq(int, fired_count(), at_destroy + 1), "a destroyed timers' callback ran after destroy");
    for (int i = 0; i < FAR; i++)
        cr_assert(eq(int, atomic_load(&far[i].calls), 0));
}

Test(timer, destroy_of_an_idle_or_null_timers_returns) {
    drey_timers_destroy(drey_timers_create());
    drey_timers_destroy(NULL);
}
