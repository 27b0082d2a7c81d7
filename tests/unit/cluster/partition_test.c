/*
 * Unit tests for src/cluster/partition.c: the freeze a move puts a
 * partition's writes through, and the keys they change while it is copied.
 *
 * The rule under test: every write is either counted in before the freeze
 * (and the freeze waits for it) or sees the freeze (and parks until the
 * thaw, which runs the parked ones in the order they came) — none slips
 * past both, whatever the interleaving (the last test races threads).
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <string.h>

#include "drey/clock.h"
#include "src/cluster/partition.h"

static drey_cluster__partition part;

static void setup(void) {
    drey_cluster__partition_init(&part, 7);
}

static void teardown(void) {
    drey_cluster__partition_destroy(&part);
}

TestSuite(partition, .init = setup, .fini = teardown, .timeout = 60);

typedef struct leaver {
    drey_cluster__partition *p;
    int64_t after_ms;
} leaver;

static void *leave_later(void *arg) {
    leaver *l = arg;
    int64_t until = drey_mono_ms() + l->after_ms;
    while (drey_mono_ms() < until) {
    }
    drey_cluster__partition_leave(l->p);
    return NULL;
}

Test(partition, a_write_counted_in_before_the_freeze_is_waited_for) {
    cr_assert(drey_cluster__partition_enter(&part));
    pthread_t t;
    leaver l = {.p = &part, .after_ms = 50};
    pthread_create(&t, NULL, leave_later, &l);
    int64_t started = drey_mono_ms();
    cr_assert(drey_cluster__partition_freeze(&part, drey_deadline_after_ms(10000)));
    cr_assert_geq(drey_mono_ms() - started, 40, "the freeze returned before the write left");
    cr_assert_eq(atomic_load(&part.inflight), 0);
    pthread_join(t, NULL);
    cr_assert(!drey_cluster__partition_enter(&part), "no write gets in while frozen");
    drey_cluster__partition_thaw(&part);
    cr_assert(drey_cluster__partition_enter(&part));
    drey_cluster__partition_leave(&part);
}

Test(partition, a_freeze_whose_writes_do_not_leave_in_time_says_so_and_stays_frozen) {
    cr_assert(drey_cluster__partition_enter(&part));
    cr_assert(!drey_cluster__partition_freeze(&part, drey_deadline_after_ms(20)));
    cr_assert(atomic_load(&part.frozen), "frozen until the mover thaws it");
    cr_assert(!drey_cluster__partition_enter(&part));
    drey_cluster__partition_leave(&part);
    drey_cluster__partition_thaw(&part);
    cr_assert(drey_cluster__partition_enter(&part));
    drey_cluster__partition_leave(&part);
}

typedef struct woken {
    drey_cluster__parked parked;
    int id;
} woken;

static int order[8], n_order;

static void record_wake(drey_cluster__parked *w) {
    order[n_order++] = ((woken *)w)->id;
}

Test(partition, the_thaw_runs_parked_writes_in_the_order_they_came) {
    cr_assert(drey_cluster__partition_freeze(&part, drey_deadline_after_ms(1000)));
    woken w[5];
    for (int i = 0; i < 5; i++) {
        w[i] = (woken){.parked = {.wake = record_wake}, .id = i};
        cr_assert(!drey_cluster__partition_enter(&part));
        cr_assert(drey_cluster__partition_park(&part, &w[i].parked));
    }
    n_order = 0;
    drey_cluster__partition_thaw(&part);
    cr_assert_eq(n_order, 5);
    for (int i = 0; i < 5; i++)
        cr_assert_eq(order[i], i, "woken %d-th: %d", i, order[i]);
    woken late = {.parked = {.wake = record_wake}, .id = 9};
    cr_assert(!drey_cluster__partition_park(&part, &late.parked), "thawed: enter again instead");
}

Test(partition, keys_changed_during_a_copy_are_taken_once_or_given_back) {
    drey_cluster__partition_note_key(&part, "c", 1, "k1", 2);
    drey_cluster__partition_note_key(&part, "c", 1, "k2", 2);
    size_t n;
    drey_cluster__dirty *d = drey_cluster__partition_take_dirty(&part, &n);
    cr_assert_eq(n, 2);
    size_t again;
    cr_assert_null(drey_cluster__partition_take_dirty(&part, &again));
    cr_assert_eq(again, 0);
    drey_cluster__partition_note_key(&part, "c", 1, "k3", 2);
    drey_cluster__partition_give_back(&part, d);
    d = drey_cluster__partition_take_dirty(&part, &n);
    cr_assert_eq(n, 3);
    int seen = 0;
    for (drey_cluster__dirty *x = d; x != NULL; x = x->next) {
        cr_assert_eq(x->cache_len, 1);
        cr_assert_eq(memcmp(x->data, "c", 1), 0);
        seen++;
    }
    cr_assert_eq(seen, 3);
    drey_cluster__dirty_free(d);
}

/* --- threads racing the freeze --------------------------------------------------- */

typedef struct racer {
    _Atomic bool stop;
    _Atomic uint64_t in_while_frozen; /* writes counted in after the freeze returned: the rule broken */
    _Atomic bool frozen_done;
    _Atomic uint64_t parked, woken;
} racer;

static racer race;

/* A writer's own parked write. Its own flag says it was woken: counters
 * shared by the writers could balance while it is still in the list, and
 * parking it again would make the list a cycle (a thaw that never ends). */
typedef struct race_waiter {
    drey_cluster__parked parked; /* first */
    _Atomic bool woken;
} race_waiter;

static void race_wake(drey_cluster__parked *w) {
    atomic_fetch_add(&race.woken, 1);
    atomic_store(&((race_waiter *)w)->woken, true);
}

static void *writer(void *arg) {
    (void)arg;
    race_waiter mine = {.parked = {.wake = race_wake}};
    while (!atomic_load(&race.stop)) {
        if (drey_cluster__partition_enter(&part)) {
            if (atomic_load(&race.frozen_done))
                atomic_fetch_add(&race.in_while_frozen, 1);
            drey_cluster__partition_leave(&part);
            continue;
        }
        atomic_store(&mine.woken, false);
        if (drey_cluster__partition_park(&part, &mine.parked)) {
            atomic_fetch_add(&race.parked, 1);
            /* The thaw wakes it (the last round thaws before the stop). */
            while (!atomic_load(&mine.woken)) {
            }
        }
    }
    return NULL;
}

Test(partition, no_write_slips_past_a_freeze_whatever_the_interleaving) {
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, writer, NULL);
    for (int round = 0; round < 200; round++) {
        cr_assert(drey_cluster__partition_freeze(&part, drey_deadline_after_ms(5000)));
        atomic_store(&race.frozen_done, true);
        /* Held frozen a moment, as the mover's last chunk and flip are: a
         * write that slipped past would get in meanwhile (a write that
         * counts itself in and backs out at the freeze is not in). */
        for (int64_t until = drey_mono_ns() + 200000; drey_mono_ns() < until;) {
        }
        atomic_store(&race.frozen_done, false);
        drey_cluster__partition_thaw(&part);
    }
    atomic_store(&race.stop, true);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    cr_assert_eq(atomic_load(&race.in_while_frozen), 0, "a write got in while the partition was frozen");
    cr_assert_eq(atomic_load(&race.woken), atomic_load(&race.parked), "a parked write was not woken");
}
