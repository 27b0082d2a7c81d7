/*
 * partition — one partition as this node runs it; see partition.h for who
 * writes what and the lock order.
 */
#include "partition.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/clock.h"

void drey_cluster__partition_init(drey_cluster__partition *p, uint32_t id) {
    memset(p, 0, sizeof *p);
    p->id = id;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->drained, NULL);
    pthread_mutex_init(&p->line.mu, NULL);
}

void drey_cluster__partition_destroy(drey_cluster__partition *p) {
    drey_cluster__dirty_free(p->dirty);
    pthread_mutex_destroy(&p->line.mu);
    pthread_cond_destroy(&p->drained);
    pthread_mutex_destroy(&p->mu);
}

/* --- the freeze ---------------------------------------------------------------- */

void drey_cluster__partition_leave(drey_cluster__partition *p) {
    if (atomic_fetch_sub(&p->inflight, 1) == 1 && atomic_load(&p->frozen)) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->drained);
        pthread_mutex_unlock(&p->mu);
    }
}

bool drey_cluster__partition_enter(drey_cluster__partition *p) {
    atomic_fetch_add(&p->inflight, 1);
    if (!atomic_load(&p->frozen))
        return true;
    drey_cluster__partition_leave(p);
    return false;
}

bool drey_cluster__partition_park(drey_cluster__partition *p, drey_cluster__parked *w) {
    pthread_mutex_lock(&p->mu);
    bool still = atomic_load(&p->frozen);
    if (still) {
        w->next = p->parked;
        p->parked = w;
    }
    pthread_mutex_unlock(&p->mu);
    return still;
}

bool drey_cluster__partition_freeze(drey_cluster__partition *p, int64_t deadline_ns) {
    atomic_store(&p->frozen, true);
    pthread_mutex_lock(&p->mu);
    bool drained;
    while (!(drained = atomic_load(&p->inflight) == 0)) {
        if (drey_cond_wait_until(&p->drained, &p->mu, deadline_ns) == ETIMEDOUT) {
            drained = atomic_load(&p->inflight) == 0;
            break;
        }
    }
    pthread_mutex_unlock(&p->mu);
    return drained;
}

void drey_cluster__partition_thaw(drey_cluster__partition *p) {
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->frozen, false);
    drey_cluster__parked *newest = p->parked;
    p->parked = NULL;
    pthread_mutex_unlock(&p->mu);
    /* Newest first in the list: reversed, they run in the order they came. */
    drey_cluster__parked *oldest = NULL;
    while (newest != NULL) {
        drey_cluster__parked *next = newest->next;
        newest->next = oldest;
        oldest = newest;
        newest = next;
    }
    while (oldest != NULL) {
        drey_cluster__parked *next = oldest->next;
        oldest->wake(oldest);
        oldest = next;
    }
}

/* --- keys changed during a copy ---------------------------------------------------- */

void drey_cluster__partition_note_key(drey_cluster__partition *p, const char *cache, size_t cache_len,
                                      const char *key, size_t key_len) {
    drey_cluster__dirty *d = drey_xmalloc(sizeof *d + cache_len + key_len);
    d->cache_len = (uint32_t)cache_len;
    d->key_len = (uint32_t)key_len;
    memcpy(d->data, cache, cache_len);
    memcpy(d->data + cache_len, key, key_len);
    pthread_mutex_lock(&p->mu);
    d->next = p->dirty;
    p->dirty = d;
    p->n_dirty++;
    pthread_mutex_unlock(&p->mu);
}

drey_cluster__dirty *drey_cluster__partition_take_dirty(drey_cluster__partition *p, size_t *n) {
    pthread_mutex_lock(&p->mu);
    drey_cluster__dirty *d = p->dirty;
    *n = p->n_dirty;
    p->dirty = NULL;
    p->n_dirty = 0;
    pthread_mutex_unlock(&p->mu);
    return d;
}

void drey_cluster__partition_give_back(drey_cluster__partition *p, drey_cluster__dirty *list) {
    size_t n = 0;
    drey_cluster__dirty *last = NULL;
    for (drey_cluster__dirty *d = list; d != NULL; d = d->next) {
        last = d;
        n++;
    }
    if (last == NULL)
        return;
    pthread_mutex_lock(&p->mu);
    last->next = p->dirty;
    p->dirty = list;
    p->n_dirty += n;
    pthread_mutex_unlock(&p->mu);
}

void drey_cluster__dirty_free(drey_cluster__dirty *d) {
    while (d != NULL) {
        drey_cluster__dirty *next = d->next;
        free(d);
        d = next;
    }
}

void drey_cluster__raise(_Atomic uint64_t *a, uint64_t v) {
    uint64_t was = atomic_load(a);
    while (was < v && !atomic_compare_exchange_weak(a, &was, v)) {
    }
}

void drey_cluster__raise_i64(_Atomic int64_t *a, int64_t v) {
    int64_t was = atomic_load(a);
    while (was < v && !atomic_compare_exchange_weak(a, &was, v)) {
    }
}

uint64_t drey_cluster__node_hash(const char *id) {
    uint64_t h = 0xcbf29ce484222325ULL; /* FNV-1a */
    for (const char *c = id != NULL ? id : ""; *c != '\0'; c++)
        h = (h ^ (uint8_t)*c) * 0x100000001b3ULL;
    return h;
}
