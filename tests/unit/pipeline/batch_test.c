/*
 * Batches (drey_pipeline_batch_*): what a door's requests defer runs once,
 * in the order deferred, when the outermost batch of the thread ends; with
 * no batch open, or too much deferred, the caller is told to do it now.
 */
#include <criterion/criterion.h>

#include "drey/pipeline.h"

typedef struct log_ {
    int order[64];
    int n;
} log_;

typedef struct entry {
    log_ *log;
    int id;
} entry;

static void record(void *arg) {
    entry *e = arg;
    e->log->order[e->log->n++] = e->id;
}

Test(batch, outside_a_batch_nothing_is_deferred) {
    log_ l = {.n = 0};
    entry e = {&l, 1};
    cr_assert(!drey_pipeline_batch_defer(record, &e));
    cr_assert_eq(l.n, 0);
}

Test(batch, deferred_work_runs_in_order_at_the_outermost_end) {
    log_ l = {.n = 0};
    entry a = {&l, 1}, b = {&l, 2}, c = {&l, 3};
    drey_pipeline_batch_begin();
    cr_assert(drey_pipeline_batch_defer(record, &a));
    drey_pipeline_batch_begin();
    cr_assert(drey_pipeline_batch_defer(record, &b));
    drey_pipeline_batch_end();
    cr_assert_eq(l.n, 0, "an inner end runs nothing");
    cr_assert(drey_pipeline_batch_defer(record, &c));
    drey_pipeline_batch_end();
    cr_assert_eq(l.n, 3);
    cr_assert_eq(l.order[0], 1);
    cr_assert_eq(l.order[1], 2);
    cr_assert_eq(l.order[2], 3);
    cr_assert(!drey_pipeline_batch_defer(record, &a), "the batch is over");
}

Test(batch, a_full_batch_tells_the_caller_to_do_it_now) {
    log_ l = {.n = 0};
    entry e[64];
    int deferred = 0;
    drey_pipeline_batch_begin();
    for (int i = 0; i < 64; i++) {
        e[i] = (entry){&l, i};
        if (drey_pipeline_batch_defer(record, &e[i]))
            deferred++;
        else
            record(&e[i]);
    }
    cr_assert(deferred > 0 && deferred < 64, "%d deferred", deferred);
    cr_assert_eq(l.n, 64 - deferred, "the rest was done at once");
    drey_pipeline_batch_end();
    cr_assert_eq(l.n, 64, "and what was deferred at the end");
}

static void defer_again(void *arg) {
    entry *e = arg;
    /* Run outside the batch that deferred it: a second deferral is refused. */
    e->log->order[e->log->n++] = drey_pipeline_batch_defer(record, e) ? -1 : e->id;
}

Test(batch, what_runs_at_the_end_is_outside_the_batch) {
    log_ l = {.n = 0};
    entry e = {&l, 7};
    drey_pipeline_batch_begin();
    cr_assert(drey_pipeline_batch_defer(defer_again, &e));
    drey_pipeline_batch_end();
    cr_assert_eq(l.n, 1);
    cr_assert_eq(l.order[0], 7);
}
