/*
 * near — a near cache invalidated by a Watch; see include/drey/client.h.
 *
 * One mutex guards the table. An entry is READY (a value and its version,
 * kept as the packed Value) or FILLING (a placeholder: a read of the key is
 * on its way, numbered fill_id). Every event for a key deletes its entry
 * whatever its state, so a read that began before the event finds its
 * placeholder gone (or another read's) and keeps nothing: what the table
 * holds was read after the last event for the key, hence is no older than
 * that event's change. RESYNC_REQUIRED and the end of the watch delete
 * everything; while no watch is in force nothing is served or kept (on a
 * cluster node, also from a RESYNC_REQUIRED OWNER_CHANGED or OWNER_LOST to
 * the WATCHING after it: changes may be missed in between).
 *
 * Two clients: the reader (misses, one at a time under its own mutex: a
 * drey_client is used by one thread at a time) and the watcher's, used only
 * by the watch thread (drey_near_close cancels its stream, which gRPC allows
 * from any thread).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/client.h"
#include "drey/list.h"
#include "drey/thread.h"
#include "internal.h"

#define DEFAULT_MAX_ENTRIES 10000
#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 2000

typedef struct near_entry {
    struct near_entry *hnext;       /* bucket chain */
    drey_link age;                  /* in the cache's ages */
    uint64_t hash;
    bool ready;
    uint64_t fill_id;
    uint64_t version;
    int64_t expires_at_ms; /* 0: never */
    uint8_t *value;        /* packed drey.cache.v1.Value */
    size_t value_len;
    char key[];
} near_entry;

struct drey_near_cache {
    drey_near_options opts;
    char *cache;
    drey_client *reader, *watcher;
    pthread_mutex_t read_mu; /* the reader client */

    pthread_mutex_t mu;
    pthread_cond_t cond;
    near_entry **buckets;
    size_t n_buckets, n_entries;
    drey_list ages; /* of near_entry, oldest first */
    uint64_t fill_seq;
    bool watching, closing;
    drey_client_stream *stream;
    drey_near_stats stats;
    pthread_t thread;
};

static uint64_t hash_of(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ULL;
    return h;
}

static near_entry **slot_of(drey_near_cache *n, const char *key, size_t len, uint64_t h) {
    near_entry **pp = &n->buckets[h % n->n_buckets];
    while (*pp != NULL && !((*pp)->hash == h && strlen((*pp)->key) == len && memcmp((*pp)->key, key, len) == 0))
        pp = &(*pp)->hnext;
    return pp;
}

/* Under mu. */
static void unlink_entry(drey_near_cache *n, near_entry **pp) {
    near_entry *e = *pp;
    *pp = e->hnext;
    drey_list_remove(&n->ages, &e->age);
    n->n_entries--;
    free(e->value);
    free(e);
}

static void drop_key(drey_near_cache *n, const char *key) {
    size_t len = strlen(key);
    near_entry **pp = slot_of(n, key, len, hash_of(key, len));
    if (*pp != NULL) {
        unlink_entry(n, pp);
        n->stats.invalidations++;
    }
}

static void drop_all(drey_near_cache *n) {
    for (size_t i = 0; i < n->n_buckets; i++) {
        while (n->buckets[i] != NULL)
            unlink_entry(n, &n->buckets[i]);
    }
}

/* Under mu: a placeholder for key (dropping the oldest entry when full). */
static near_entry *add_placeholder(drey_near_cache *n, const char *key, size_t len, uint64_t h) {
    if (n->n_entries >= n->opts.max_entries && !drey_list_empty(&n->ages)) {
        near_entry *victim = DREY_LIST_ITEM(n->ages.head, near_entry, age);
        unlink_entry(n, slot_of(n, victim->key, strlen(victim->key), victim->hash));
    }
    near_entry *e = drey_xcalloc(1, sizeof *e + len + 1);
    memcpy(e->key, key, len);
    e->hash = h;
    e->fill_id = ++n->fill_seq;
    near_entry **pp = &n->buckets[h % n->n_buckets];
    e->hnext = *pp;
    *pp = e;
    drey_list_push(&n->ages, &e->age);
    n->n_entries++;
    return e;
}

static void apply_event(drey_near_cache *n, const Drey__Cache__V1__WatchEvent *ev) {
    pthread_mutex_lock(&n->mu);
    n->stats.events++;
    switch (ev->kind) {
    case DREY__CACHE__V1__WATCH_EVENT__KIND__WATCHING:
        n->watching = true;
        n->stats.watches++;
        pthread_cond_broadcast(&n->cond);
        break;
    case DREY__CACHE__V1__WATCH_EVENT__KIND__RESYNC_REQUIRED:
        n->stats.resyncs++;
        drop_all(n);
        /* Covered again from here on; but a cluster node's OWNER_CHANGED or
         * OWNER_LOST is covered only from the WATCHING that follows. */
        n->watching = ev->reason == NULL || strncmp(ev->reason, "OWNER_", 6) != 0;
        pthread_cond_broadcast(&n->cond);
        break;
    case DREY__CACHE__V1__WATCH_EVENT__KIND__CLEAR:
        n->stats.invalidations += n->n_entries;
        drop_all(n);
        break;
    default:
        drop_key(n, ev->key);
        break;
    }
    pthread_mutex_unlock(&n->mu);
    if (n->opts.on_event != NULL)
        n->opts.on_event(n->opts.on_event_ctx, ev);
}

static void *watch_main(void *arg) {
    drey_near_cache *n = arg;
    int64_t backoff = BACKOFF_MIN_MS;
    pthread_mutex_lock(&n->mu);
    while (!n->closing) {
        pthread_mutex_unlock(&n->mu);
        Drey__Cache__V1__WatchRequest req = DREY__CACHE__V1__WATCH_REQUEST__INIT;
        req.cache = n->cache;
        drey_client_status st;
        drey_client_stream *s = drey_client_watch(n->watcher, &req, DREY_CLIENT_NO_DEADLINE, &st);
        pthread_mutex_lock(&n->mu);
        n->stream = s;
        bool closing = n->closing;
        pthread_mutex_unlock(&n->mu);
        if (s != NULL && closing)
            drey_client_stream_cancel(s);
        drey_arena a;
        drey_arena_init(&a, NULL, 0);
        ProtobufCMessage *m;
        while (s != NULL && drey_client_stream_read(s, &drey__cache__v1__watch_event__descriptor, &a, &m)) {
            apply_event(n, (const Drey__Cache__V1__WatchEvent *)m);
            backoff = BACKOFF_MIN_MS;
            drey_arena_reset(&a);
        }
        pthread_mutex_lock(&n->mu);
        n->stream = NULL;
        n->watching = false; /* uncovered: what the table holds may be stale */
        drop_all(n);
        pthread_mutex_unlock(&n->mu);
        if (s != NULL)
            drey_client_stream_finish(s, &a, &st);
        drey_arena_destroy(&a);
        pthread_mutex_lock(&n->mu);
        if (!n->closing)
            drey_cond_wait_until(&n->cond, &n->mu, drey_deadline_after_ms(backoff));
        backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
    }
    pthread_mutex_unlock(&n->mu);
    return NULL;
}

drey_near_cache *drey_near_open(const drey_near_options *opts, int64_t timeout_ms, char *err, size_t err_cap) {
    drey_near_cache *n = drey_xcalloc(1, sizeof *n);
    n->opts = *opts;
    if (n->opts.max_entries == 0)
        n->opts.max_entries = DEFAULT_MAX_ENTRIES;
    n->cache = drey_xstrdup(opts->cache != NULL ? opts->cache : "");
    n->n_buckets = n->opts.max_entries < 16 ? 16 : n->opts.max_entries;
    n->buckets = drey_xcalloc(n->n_buckets, sizeof *n->buckets);
    pthread_mutex_init(&n->mu, NULL);
    pthread_mutex_init(&n->read_mu, NULL);
    pthread_cond_init(&n->cond, NULL);
    n->reader = drey_client_open(&opts->server, err, err_cap);
    n->watcher = n->reader != NULL ? drey_client_open(&opts->server, err, err_cap) : NULL;
    if (n->watcher == NULL) {
        drey_client_close(n->reader);
        n->reader = NULL;
        drey_near_close(n);
        return NULL;
    }
    drey_thread_start(&n->thread, "near cache watch", watch_main, n);
    pthread_mutex_lock(&n->mu);
    int64_t deadline = drey_deadline_after_ms(timeout_ms);
    while (!n->watching && drey_mono_ns() < deadline)
        drey_cond_wait_until(&n->cond, &n->mu, deadline);
    bool ok = n->watching;
    pthread_mutex_unlock(&n->mu);
    if (!ok) {
        snprintf(err, err_cap, "the watch of %s did not start within %lld ms", opts->server.target,
                 (long long)timeout_ms);
        drey_near_close(n);
        return NULL;
    }
    return n;
}

void drey_near_close(drey_near_cache *n) {
    if (n == NULL)
        return;
    if (n->watcher != NULL)
        drey_client__stop_reader(n->thread, &n->mu, &n->cond, &n->closing, &n->stream);
    drop_all(n);
    drey_client_close(n->watcher);
    drey_client_close(n->reader);
    free(n->buckets);
    free(n->cache);
    pthread_mutex_destroy(&n->mu);
    pthread_mutex_destroy(&n->read_mu);
    pthread_cond_destroy(&n->cond);
    free(n);
}

static int64_t ms_of(const Google__Protobuf__Timestamp *t) {
    return t == NULL ? 0 : t->seconds * 1000 + t->nanos / 1000000;
}

bool drey_near_get(drey_near_cache *n, const char *key, int64_t timeout_ms, drey_arena *arena, bool *found,
                   Drey__Cache__V1__Value **value, uint64_t *version, drey_client_status *st) {
    size_t len = strlen(key);
    uint64_t h = hash_of(key, len);
    *found = false;
    *value = NULL;
    *version = 0;
    uint64_t fill = 0;
    pthread_mutex_lock(&n->mu);
    if (n->watching) {
        near_entry **pp = slot_of(n, key, len, h);
        near_entry *e = *pp;
        if (e != NULL && e->ready && e->expires_at_ms != 0 && e->expires_at_ms <= drey_wall_ms()) {
            unlink_entry(n, pp);
            e = NULL;
        }
        if (e != NULL && e->ready) {
            n->stats.hits++;
            *value = drey__cache__v1__value__unpack(drey_arena_protobuf_allocator(arena), e->value_len, e->value);
            *version = e->version;
            pthread_mutex_unlock(&n->mu);
            *found = *value != NULL;
            return true;
        }
        if (e == NULL)
            fill = add_placeholder(n, key, len, h)->fill_id;
    }
    n->stats.misses++;
    pthread_mutex_unlock(&n->mu);

    Drey__Cache__V1__GetRequest req = DREY__CACHE__V1__GET_REQUEST__INIT;
    req.cache = n->cache;
    req.key = (char *)key;
    ProtobufCMessage *resp;
    pthread_mutex_lock(&n->read_mu);
    grpc_status_code code = drey_client_unary(n->reader, DREY_CLIENT_CACHE("Get"), &req.base,
                                              &drey__cache__v1__get_response__descriptor, timeout_ms, arena, &resp, st);
    pthread_mutex_unlock(&n->read_mu);
    const Drey__Cache__V1__GetResponse *g = code == GRPC_STATUS_OK ? (const void *)resp : NULL;

    pthread_mutex_lock(&n->mu);
    near_entry **pp = slot_of(n, key, len, h);
    if (fill != 0 && *pp != NULL && !(*pp)->ready && (*pp)->fill_id == fill) {
        if (g != NULL && g->found && g->value != NULL) {
            near_entry *e = *pp;
            e->value_len = protobuf_c_message_get_packed_size(&g->value->base);
            e->value = drey_xmalloc(e->value_len ? e->value_len : 1);
            protobuf_c_message_pack(&g->value->base, e->value);
            e->version = g->version;
            e->expires_at_ms = ms_of(g->expires_at);
            e->ready = true;
        } else {
            unlink_entry(n, pp); /* absence is not kept */
        }
    }
    pthread_mutex_unlock(&n->mu);
    if (g == NULL)
        return false;
    *found = g->found;
    *value = g->value;
    *version = g->version;
    return true;
}

void drey_near_get_stats(drey_near_cache *n, drey_near_stats *out) {
    pthread_mutex_lock(&n->mu);
    *out = n->stats;
    out->entries = n->n_entries;
    pthread_mutex_unlock(&n->mu);
}
