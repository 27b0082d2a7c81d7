/*
 * list — the one intrusive doubly linked list: queues, LRU orders and
 * registries of live objects thread a drey_link through their own struct
 * instead of each writing the same pointer surgery again.
 *
 * A zeroed drey_list is empty and a zeroed drey_link is in no list, so
 * structs from drey_xcalloc or `= {0}` need no init call. Nothing here
 * locks: a list is guarded by whatever guards its owner. The owner of a
 * link is found with DREY_LIST_ITEM (container_of), which passes NULL
 * through, so `for (T *x = DREY_LIST_ITEM(l.head, T, f); x != NULL; ...)`
 * walks a list. Head is the oldest (first pushed), tail the newest.
 */
#ifndef DREY_LIST_H
#define DREY_LIST_H

#include <stdbool.h>
#include <stddef.h>

typedef struct drey_link {
    struct drey_link *prev, *next;
} drey_link;

typedef struct drey_list {
    drey_link *head, *tail;
} drey_list;

/* The struct of type `type` whose member `member` is link; NULL for NULL. */
#define DREY_LIST_ITEM(link, type, member)                                                                           \
    ((type *)drey_list__item_((link), offsetof(type, member)))

static inline void *drey_list__item_(const drey_link *link, size_t offset) {
    return link != NULL ? (char *)link - offset : NULL;
}

/* Appends n (in no list) at the tail. */
static inline void drey_list_push(drey_list *l, drey_link *n) {
    n->next = NULL;
    n->prev = l->tail;
    if (l->tail != NULL)
        l->tail->next = n;
    else
        l->head = n;
    l->tail = n;
}

/* Takes n out of l; n is then in no list. */
static inline void drey_list_remove(drey_list *l, drey_link *n) {
    if (n->prev != NULL)
        n->prev->next = n->next;
    else
        l->head = n->next;
    if (n->next != NULL)
        n->next->prev = n->prev;
    else
        l->tail = n->prev;
    n->prev = n->next = NULL;
}

/* Takes the head out of l and returns it; NULL when l is empty. */
static inline drey_link *drey_list_pop(drey_list *l) {
    drey_link *n = l->head;
    if (n != NULL)
        drey_list_remove(l, n);
    return n;
}

/* Moves n (in l) to the tail, as a use does in an LRU order. */
static inline void drey_list_move_to_tail(drey_list *l, drey_link *n) {
    drey_list_remove(l, n);
    drey_list_push(l, n);
}

static inline bool drey_list_empty(const drey_list *l) {
    return l->head == NULL;
}

#endif
