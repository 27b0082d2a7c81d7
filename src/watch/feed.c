/*
 * feed — the change feed: each change the store reports is numbered, kept
 * in a bounded history for resuming watches, and buffered for every
 * attached stream whose filter takes it; the delivery thread sends the
 * buffers of streams nothing else is sending, and ends recording when no
 * watch has been open for the linger. Also the filters and the principal
 * counts. Locks and events: internal.h.
 */
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/placement.h"
#include "internal.h"

void drey_watch__event_unref(wevent *e) {
    if (e != NULL && atomic_fetch_sub_explicit(&e->refs, 1, memory_order_acq_rel) == 1)
        free(e);
}

/* --- principals --------------------------------------------------------- */

static principal_count **principal_slot(drey_watch *w, const char *name) {
    uint64_t h = 1469598103934665603ULL;
    for (const char *p = name; *p; p++)
        h = (h ^ (uint8_t)*p) * 1099511628211ULL;
    principal_count **pp = &w->principals[h % PRINCIPAL_BUCKETS];
    while (*pp != NULL && strcmp((*pp)->name, name) != 0)
        pp = &(*pp)->next;
    return pp;
}

bool drey_watch__principal_take(drey_watch *w, const char *name) {
    principal_count **pp = principal_slot(w, name);
    if (*pp == NULL) {
        size_t len = strlen(name);
        principal_count *pc = drey_xcalloc(1, sizeof *pc + len + 1);
        memcpy(pc->name, name, len + 1);
        *pp = pc;
    }
    if ((*pp)->n >= w->opts.max_per_principal)
        return false;
    (*pp)->n++;
    return true;
}

void drey_watch__principal_give(drey_watch *w, const char *name) {
    principal_count **pp = principal_slot(w, name);
    if (*pp == NULL)
        return;
    if (--(*pp)->n == 0) {
        principal_count *pc = *pp;
        *pp = pc->next;
        free(pc);
    }
}

/* --- filters ------------------------------------------------------------ */

static int key_cmp(const char *a, size_t al, const char *b, size_t bl) {
    int c = memcmp(a, b, al < bl ? al : bl);
    return c != 0 ? c : (al > bl) - (al < bl);
}

bool drey_watch__wants(const stream *s, const wevent *e) {
    if (e->cache_len != s->cache_len || memcmp(e->data, s->cache, s->cache_len) != 0)
        return false;
    if (e->kind == DREY_STORE_CHANGE_CLEAR)
        return true;
    const char *key = e->data + e->cache_len;
    if (s->n_keys > 0) {
        size_t lo = 0, hi = s->n_keys;
        while (lo < hi) {
            size_t mid = (lo + hi) / 2;
            int c = key_cmp(s->keys[mid], s->key_lens[mid], key, e->key_len);
            if (c == 0)
                return true;
            if (c < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        return false;
    }
    return e->key_len >= s->prefix_len && memcmp(key, s->prefix, s->prefix_len) == 0;
}

/* A subscription reports the partitions it asked for, and of them only
 * what this node owns at the moment of the change: a copy being received
 * (a move's imports) or handed over (its drop) is never reported. *part
 * caches the event's partition across streams (every subscription names
 * the cluster's count). */
static bool sub_wants(drey_watch *w, const stream *s, const wevent *e, int64_t *part) {
    if (e->kind == DREY_STORE_CHANGE_CLEAR)
        return true;
    if (*part < 0)
        *part = drey_placement_partition(e->data, e->cache_len, e->data + e->cache_len, e->key_len, s->n_parts);
    uint32_t p = (uint32_t)*part;
    return p < s->n_parts && (s->parts[p / 8] >> (p % 8) & 1) != 0 && w->has_cluster &&
           w->cluster.owns(w->cluster.ctx, p);
}

static int keys_order(const void *a, const void *b, void *ctx) {
    const stream *s = ctx;
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    return key_cmp(s->msg->keys[i], strlen(s->msg->keys[i]), s->msg->keys[j], strlen(s->msg->keys[j]));
}

void drey_watch__set_filter(stream *s) {
    const Drey__Cache__V1__WatchRequest *m = s->msg;
    s->cache = m->cache;
    s->cache_len = strlen(m->cache);
    if (s->cache_len == 7 && memcmp(s->cache, "default", 7) == 0)
        s->cache_len = 0;
    s->prefix = m->prefix;
    s->prefix_len = strlen(m->prefix);
    s->values = m->include_values;
    s->n_keys = m->n_keys;
    if (m->n_keys > 0) {
        size_t *order = drey_arena_alloc(&s->arena, m->n_keys * sizeof *order);
        for (size_t i = 0; i < m->n_keys; i++)
            order[i] = i;
        qsort_r(order, m->n_keys, sizeof *order, keys_order, s);
        s->keys = drey_arena_alloc(&s->arena, m->n_keys * sizeof *s->keys);
        s->key_lens = drey_arena_alloc(&s->arena, m->n_keys * sizeof *s->key_lens);
        for (size_t i = 0; i < m->n_keys; i++) {
            s->keys[i] = m->keys[order[i]];
            s->key_lens[i] = strlen(s->keys[i]);
        }
    }
}

/* --- buffers ------------------------------------------------------------ */

void drey_watch__kick_locked(drey_watch *w, stream *s) {
    if (s->sending || s->busy || s->kicked || s->done)
        return;
    s->kicked = true;
    atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
    drey_list_push(&w->kicks, &s->kick);
    pthread_cond_signal(&w->cond);
}

void drey_watch__ring_clear(stream *s) {
    for (size_t i = 0; i < s->ring_n; i++)
        drey_watch__event_unref(s->ring[(s->ring_head + i) % s->ring_cap]);
    s->ring_head = s->ring_n = s->ring_bytes = 0;
}

void drey_watch__push(drey_watch *w, stream *s, wevent *e) {
    if (s->ring_n > 0 && s->ring_bytes + e->bytes > w->opts.buffer_bytes) {
        drey_watch__ring_clear(s);
        if (!s->resync_pending)
            w->resyncs++;
        s->resync_pending = true;
        s->resync_seq = e->seq;
        /* A cluster watch whose WATCHING is owed keeps saying so: the
         * marker it would have seen is gone with the buffer. */
        s->resync_reason = s->episode != NULL ? s->episode : "BUFFER_OVERFLOW";
        return;
    }
    if (s->ring_n == s->ring_cap) {
        size_t cap = s->ring_cap ? s->ring_cap * 2 : 16;
        wevent **r = drey_xcalloc(cap, sizeof *r);
        for (size_t i = 0; i < s->ring_n; i++)
            r[i] = s->ring[(s->ring_head + i) % s->ring_cap];
        free(s->ring);
        s->ring = r;
        s->ring_cap = cap;
        s->ring_head = 0;
    }
    atomic_fetch_add_explicit(&e->refs, 1, memory_order_relaxed);
    s->ring[(s->ring_head + s->ring_n) % s->ring_cap] = e;
    s->ring_n++;
    s->ring_bytes += e->bytes;
}

/* --- the feed ----------------------------------------------------------- */

/* Under w->mu. */
static void history_trim(drey_watch *w, size_t budget) {
    while (w->hhead != NULL && w->hbytes > budget) {
        wevent *e = w->hhead;
        w->hhead = e->hnext;
        if (w->hhead == NULL)
            w->htail = NULL;
        w->hbytes -= e->bytes;
        w->hcount--;
        w->history_from = e->seq;
        drey_watch__event_unref(e);
    }
}

void drey_watch__observe(void *ctx, const drey_store_change *c) {
    drey_watch *w = ctx;
    if (!atomic_load(&w->recording))
        return;
    size_t vlen = c->kind == DREY_STORE_CHANGE_SET ? c->value.len : 0;
    wevent *e = drey_xmalloc(sizeof *e + c->cache_len + c->key_len + vlen);
    atomic_init(&e->refs, 1);
    e->hnext = NULL;
    e->version = c->version;
    e->expires_at_ms = c->expires_at_ms;
    e->bytes = sizeof *e + c->cache_len + c->key_len + vlen;
    e->value_len = (uint32_t)vlen;
    e->key_len = (uint16_t)c->key_len;
    e->cache_len = (uint8_t)c->cache_len;
    e->kind = (uint8_t)c->kind;
    e->value_kind = (uint8_t)c->value.kind;
    memcpy(e->data, c->cache, c->cache_len);
    if (c->key_len > 0)
        memcpy(e->data + c->cache_len, c->key, c->key_len);
    if (vlen > 0)
        memcpy(e->data + c->cache_len + c->key_len, c->value.data, vlen);

    pthread_mutex_lock(&w->mu);
    if (!atomic_load(&w->recording)) { /* stopped meanwhile */
        pthread_mutex_unlock(&w->mu);
        free(e);
        return;
    }
    e->seq = ++w->seq;
    w->events++;
    int64_t part = -1;
    for (stream *s = DREY_LIST_ITEM(w->streams.head, stream, link); s != NULL;
         s = DREY_LIST_ITEM(s->link.next, stream, link)) {
        if (!drey_watch__wants(s, e) || (s->sub && !sub_wants(w, s, e, &part)))
            continue;
        pthread_mutex_lock(&s->mu);
        drey_watch__push(w, s, e);
        drey_watch__kick_locked(w, s);
        pthread_mutex_unlock(&s->mu);
    }
    if (w->opts.history_bytes > 0) {
        if (w->htail != NULL)
            w->htail->hnext = e;
        else
            w->hhead = e;
        w->htail = e;
        w->hbytes += e->bytes;
        w->hcount++;
        history_trim(w, w->opts.history_bytes); /* may drop e itself: then history_from says so */
    } else {
        w->history_from = e->seq;
        drey_watch__event_unref(e);
    }
    pthread_mutex_unlock(&w->mu);
}

/* Changes went unrecorded during a pause: a number is spent on the gap,
 * so no position from before it can resume. */
void drey_watch__recording_begin_locked(drey_watch *w) {
    if (atomic_load(&w->recording))
        return;
    w->history_from = ++w->seq;
    atomic_store(&w->recording, true);
    /* Attached only now: an unwatched node's writes see a NULL observer.
     * A write that still saw none is complete in the store before this
     * watch's WATCHING can reach anyone (it held the key's shard lock), so
     * whatever a watcher reads after WATCHING already shows it. */
    drey_store_set_observer(w->opts.store, &w->observer);
}

void drey_watch__recording_end_locked(drey_watch *w) {
    drey_store_set_observer(w->opts.store, NULL);
    atomic_store(&w->recording, false);
    history_trim(w, 0);
}

/* --- delivery ------------------------------------------------------------ */

void *drey_watch__delivery_main(void *arg) {
    drey_watch *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        if (!drey_list_empty(&w->kicks)) {
            stream *s = DREY_LIST_ITEM(drey_list_pop(&w->kicks), stream, kick);
            pthread_mutex_lock(&s->mu);
            s->kicked = false;
            pthread_mutex_unlock(&s->mu);
            pthread_mutex_unlock(&w->mu);
            drey_watch__flush(s);
            drey_watch__stream_unref(s);
            pthread_mutex_lock(&w->mu);
            continue;
        }
        if (w->stopping)
            break;
        if (w->n_streams == 0 && atomic_load(&w->recording)) {
            int64_t end = w->idle_since_ms + w->opts.history_linger_ms;
            if (drey_mono_ms() >= end) {
                drey_watch__recording_end_locked(w);
                continue;
            }
            drey_cond_wait_until(&w->cond, &w->mu, drey_deadline_after_ms(end - drey_mono_ms()));
            continue;
        }
        pthread_cond_wait(&w->cond, &w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

