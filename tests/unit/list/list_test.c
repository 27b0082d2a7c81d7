/*
 * Unit tests for include/drey/list.h: order, removal at every position, and
 * the zeroed list and link that callers rely on instead of an init call.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>

#include "drey/list.h"

typedef struct item {
    int value;
    drey_link link;
} item;

/* The values from head to tail, and checks the back links agree. */
static size_t collect(const drey_list *l, int *out, size_t cap) {
    size_t n = 0;
    const drey_link *prev = NULL;
    for (item *x = DREY_LIST_ITEM(l->head, item, link); x != NULL; x = DREY_LIST_ITEM(x->link.next, item, link)) {
        cr_assert(eq(ptr, (void *)x->link.prev, (void *)prev));
        prev = &x->link;
        if (n < cap)
            out[n] = x->value;
        n++;
    }
    cr_assert(eq(ptr, (void *)l->tail, (void *)prev));
    return n;
}

Test(list, a_zeroed_list_is_empty) {
    drey_list l = {0};
    cr_assert(drey_list_empty(&l));
    cr_assert(eq(ptr, drey_list_pop(&l), NULL));
    cr_assert(eq(ptr, DREY_LIST_ITEM(l.head, item, link), NULL));
}

Test(list, push_keeps_arrival_order_and_pop_takes_the_oldest) {
    drey_list l = {0};
    item xs[4] = {{.value = 1}, {.value = 2}, {.value = 3}, {.value = 4}};
    for (int i = 0; i < 4; i++)
        drey_list_push(&l, &xs[i].link);
    int got[8];
    cr_assert(eq(sz, collect(&l, got, 8), 4));
    for (int i = 0; i < 4; i++)
        cr_assert(eq(int, got[i], i + 1));
    for (int i = 0; i < 4; i++) {
        drey_link *n = drey_list_pop(&l);
        cr_assert(eq(int, DREY_LIST_ITEM(n, item, link)->value, i + 1));
        cr_assert(eq(ptr, (void *)n->prev, NULL));
        cr_assert(eq(ptr, (void *)n->next, NULL));
    }
    cr_assert(drey_list_empty(&l));
    cr_assert(eq(ptr, (void *)l.tail, NULL));
}

Test(list, remove_works_at_the_head_the_middle_and_the_tail) {
    for (int gone = 0; gone < 3; gone++) {
        drey_list l = {0};
        item xs[3] = {{.value = 0}, {.value = 1}, {.value = 2}};
        for (int i = 0; i < 3; i++)
            drey_list_push(&l, &xs[i].link);
        drey_list_remove(&l, &xs[gone].link);
        int got[3];
        cr_assert(eq(sz, collect(&l, got, 3), 2));
        for (int i = 0, k = 0; i < 3; i++)
            if (i != gone)
                cr_assert(eq(int, got[k++], i));
        drey_list_push(&l, &xs[gone].link); /* a removed link can go back in */
        cr_assert(eq(sz, collect(&l, got, 3), 3));
        cr_assert(eq(int, got[2], gone));
    }
}

Test(list, removing_the_only_item_empties_the_list) {
    drey_list l = {0};
    item x = {.value = 7};
    drey_list_push(&l, &x.link);
    drey_list_remove(&l, &x.link);
    cr_assert(drey_list_empty(&l));
    cr_assert(eq(ptr, (void *)l.tail, NULL));
}

Test(list, move_to_tail_reorders_as_a_use_does) {
    drey_list l = {0};
    item xs[3] = {{.value = 1}, {.value = 2}, {.value = 3}};
    for (int i = 0; i < 3; i++)
        drey_list_push(&l, &xs[i].link);
    drey_list_move_to_tail(&l, &xs[0].link);
    drey_list_move_to_tail(&l, &xs[2].link); /* already the tail: stays */
    int got[3];
    cr_assert(eq(sz, collect(&l, got, 3), 3));
    cr_assert(eq(int, got[0], 2));
    cr_assert(eq(int, got[1], 1));
    cr_assert(eq(int, got[2], 3));
}
