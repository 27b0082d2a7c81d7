/*
 * watch — the change-feed hub and the Watch streams; see include/drey/watch.h.
 * This file makes the hub, registers its methods, starts and stops it, and
 * reports its figures; the feed is feed.c's, a stream stream.c's, cluster
 * watches cluster.c's (internal.h has the locks and the sending rules).
 */
#include "drey/watch.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>

#include "drey/alloc.h"
#include "drey/cache/v1/cache.pb-c.h"
#include "drey/clock.h"
#include "drey/metrics.h"
#include "drey/thread.h"
#include "internal.h"

#define WATCH_PATH "/drey.cache.v1.Cache/Watch"

drey_watch *drey_watch_create(const drey_watch_options *opts) {
    drey_watch *w = drey_xcalloc(1, sizeof *w);
    w->opts = *opts;
    if (w->opts.max_per_principal == 0)
        w->opts.max_per_principal = 1;
    w->observer = (drey_store_observer){.fn = drey_watch__observe, .ctx = w};
    w->method = (drey_method){
        .path = WATCH_PATH,
        .desc = protobuf_c_service_descriptor_get_method_by_name(&drey__cache__v1__cache__descriptor, "Watch"),
        .flags = DREY_METHOD_READ,
        .handle = drey_watch__handle,
        .ctx = w,
    };
    while (w->feed == 0) {
        if (getrandom(&w->feed, sizeof w->feed, 0) != (ssize_t)sizeof w->feed)
            w->feed = (uint64_t)drey_wall_ms() * 1000003u ^ (uint64_t)drey_mono_ns();
    }
    w->feed &= (1ULL << 53) - 1; /* exact in a JavaScript number too */
    if (w->feed == 0)
        w->feed = 1;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cond, NULL);
    w->idle_since_ms = drey_mono_ms();
    return w;
}

bool drey_watch_register(drey_watch *w, drey_server *s) {
    return drey_watch__add_method(w, s, WATCH_PATH, &drey__cache__v1__watch_request__descriptor, drey_watch__on_watch);
}

void drey_watch_start(drey_watch *w) {
    pthread_mutex_lock(&w->mu);
    if (!w->thread_running && !w->stopping) {
        drey_thread_start(&w->thread, "watch delivery", drey_watch__delivery_main, w);
        w->thread_running = true;
    }
    w->started = true;
    pthread_mutex_unlock(&w->mu);
}

void drey_watch_stop(drey_watch *w) {
    pthread_mutex_lock(&w->mu);
    w->stopping = true;
    drey_watch__recording_end_locked(w); /* an observer call already under way records nothing */
    for (int list = 0; list < 2; list++) {
        for (drey_link *l = list == 0 ? w->streams.head : w->remotes.head; l != NULL; l = l->next) {
            stream *s = DREY_LIST_ITEM(l, stream, link);
            pthread_mutex_lock(&s->mu);
            if (!s->done)
                drey_call_finish(s->call, NULL);
            pthread_mutex_unlock(&s->mu);
        }
    }
    pthread_cond_broadcast(&w->cond);
    bool running = w->thread_running;
    w->thread_running = false;
    pthread_mutex_unlock(&w->mu);
    if (running)
        pthread_join(w->thread, NULL);
}

void drey_watch_destroy(drey_watch *w) {
    if (w == NULL)
        return;
    drey_watch_stop(w);
    pthread_mutex_lock(&w->mu);
    for (drey_link *l; (l = drey_list_pop(&w->kicks)) != NULL;) /* kicked after the delivery thread ended */
        drey_watch__stream_unref(DREY_LIST_ITEM(l, stream, kick));
    for (size_t i = 0; i < PRINCIPAL_BUCKETS; i++) {
        while (w->principals[i] != NULL) {
            principal_count *pc = w->principals[i];
            w->principals[i] = pc->next;
            free(pc);
        }
    }
    pthread_mutex_unlock(&w->mu);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cond);
    free(w);
}

void drey_watch_get_stats(drey_watch *w, drey_watch_stats *out) {
    pthread_mutex_lock(&w->mu);
    out->streams = drey_watch__clients_locked(w);
    out->subscriptions = w->n_subs;
    out->events = w->events;
    out->resyncs = w->resyncs;
    out->history_events = w->hcount;
    out->history_bytes = w->hbytes;
    out->recording = atomic_load(&w->recording);
    pthread_mutex_unlock(&w->mu);
}

void drey_watch_collect_metrics(void *ctx, FILE *out) {
    drey_watch_stats st;
    drey_watch_get_stats(ctx, &st);
    static const struct {
        const char *name, *type, *help;
    } rows[] = {
        {"drey_watch_streams", "gauge", "Watch streams of clients open on this node."},
        {"drey_watch_subscriptions", "gauge", "Cluster watches' subscriptions this node serves as an owner."},
        {"drey_watch_events_total", "counter", "Changes numbered in the change feed."},
        {"drey_watch_resyncs_total", "counter", "RESYNC_REQUIRED owed to readers whose buffer overflowed."},
        {"drey_watch_history_events", "gauge", "Events kept for resuming watches."},
        {"drey_watch_history_bytes", "gauge", "Bytes of the events kept for resuming watches."},
        {"drey_watch_recording", "gauge", "1 while the feed records changes (a watch is open, or was lately)."},
    };
    const double values[] = {(double)st.streams,        (double)st.subscriptions, (double)st.events,
                             (double)st.resyncs,
                             (double)st.history_events, (double)st.history_bytes, st.recording ? 1.0 : 0.0};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        drey_metrics_header(out, rows[i].name, rows[i].type, rows[i].help);
        drey_metrics_sample(out, rows[i].name, "", values[i]);
    }
}
