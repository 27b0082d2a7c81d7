/*
 * health — grpc.health.v1.Health; see include/drey/health.h.
 *
 * Watchers are kept in a list under one mutex; a status change walks it and
 * queues a message on each matching stream. The server calls on_done when a
 * stream ends (cancelled or finished), which unlinks the watcher under the
 * same mutex, so a send never races with a stream going away.
 */
#include "drey/health.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/list.h"
#include "grpc/health/v1/health.pb-c.h"

#define MAX_SERVICES 16
#define MAX_SERVICE_NAME 128

typedef struct watcher {
    drey_link link; /* in the health's watchers */
    drey_call *call;
    char service[MAX_SERVICE_NAME];
    drey_health_status last_sent;
} watcher;

struct drey_health {
    pthread_mutex_t mu;
    struct {
        char name[MAX_SERVICE_NAME];
        drey_health_status status;
    } services[MAX_SERVICES];
    size_t n_services;
    drey_list watchers;
    bool draining;
};

/* Status of a service, SERVICE_UNKNOWN if not declared. Needs h->mu. */
static drey_health_status lookup_locked(drey_health *h, const char *service) {
    for (size_t i = 0; i < h->n_services; i++) {
        if (strcmp(h->services[i].name, service) == 0)
            return h->services[i].status;
    }
    return DREY_HEALTH_SERVICE_UNKNOWN;
}

static void send_status(drey_call *call, drey_health_status st) {
    Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
    resp.status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)st;
    drey_call_send(call, &resp.base);
}

drey_health *drey_health_create(void) {
    drey_health *h = drey_xcalloc(1, sizeof *h);
    pthread_mutex_init(&h->mu, NULL);
    return h;
}

void drey_health_destroy(drey_health *h) {
    if (h == NULL)
        return;
    pthread_mutex_destroy(&h->mu);
    free(h);
}

void drey_health_set(drey_health *h, const char *service, drey_health_status status) {
    pthread_mutex_lock(&h->mu);
    if (h->draining)
        status = DREY_HEALTH_NOT_SERVING;
    size_t i;
    for (i = 0; i < h->n_services; i++) {
        if (strcmp(h->services[i].name, service) == 0)
            break;
    }
    if (i == h->n_services && h->n_services < MAX_SERVICES && strlen(service) < MAX_SERVICE_NAME) {
        strcpy(h->services[i].name, service);
        h->n_services++;
    }
    if (i < h->n_services) {
        h->services[i].status = status;
        for (watcher *w = DREY_LIST_ITEM(h->watchers.head, watcher, link); w != NULL;
             w = DREY_LIST_ITEM(w->link.next, watcher, link)) {
            if (strcmp(w->service, service) == 0 && w->last_sent != status) {
                send_status(w->call, status);
                w->last_sent = status;
            }
        }
    }
    pthread_mutex_unlock(&h->mu);
}

drey_health_status drey_health_get(drey_health *h, const char *service) {
    pthread_mutex_lock(&h->mu);
    drey_health_status st = lookup_locked(h, service);
    pthread_mutex_unlock(&h->mu);
    return st;
}

void drey_health_drain(drey_health *h) {
    pthread_mutex_lock(&h->mu);
    h->draining = true;
    for (size_t i = 0; i < h->n_services; i++)
        h->services[i].status = DREY_HEALTH_NOT_SERVING;
    for (watcher *w = DREY_LIST_ITEM(h->watchers.head, watcher, link); w != NULL;
         w = DREY_LIST_ITEM(w->link.next, watcher, link)) {
        if (w->last_sent != DREY_HEALTH_NOT_SERVING)
            send_status(w->call, DREY_HEALTH_NOT_SERVING);
        w->last_sent = DREY_HEALTH_NOT_SERVING;
        drey_call_finish(w->call, NULL);
    }
    pthread_mutex_unlock(&h->mu);
}

static ProtobufCMessage *check(void *ctx, drey_apply *ax, const ProtobufCMessage *msg) {
    const Grpc__Health__V1__HealthCheckRequest *req = (const void *)msg;
    drey_health_status st = drey_health_get(ctx, req->service);
    if (st == DREY_HEALTH_SERVICE_UNKNOWN) {
        drey_status_set(ax->status, DREY_ERR_UNKNOWN_SERVICE);
        return NULL;
    }
    Grpc__Health__V1__HealthCheckResponse *resp = drey_arena_alloc(ax->arena, sizeof *resp);
    grpc__health__v1__health_check_response__init(resp);
    resp->status = (Grpc__Health__V1__HealthCheckResponse__ServingStatus)st;
    return &resp->base;
}

static void watch_message(void *ctx, drey_call *call, const ProtobufCMessage *msg) {
    if (msg == NULL)
        return; /* half-close: the stream stays open for updates */
    const Grpc__Health__V1__HealthCheckRequest *req = (const void *)msg;
    drey_health *h = ctx;
    watcher *w = drey_xcalloc(1, sizeof *w);
    w->call = call;
    /* A name too long to be a known service watches as unknown. */
    snprintf(w->service, sizeof w->service, "%s", strlen(req->service) < MAX_SERVICE_NAME ? req->service : "\x01");
    pthread_mutex_lock(&h->mu);
    w->last_sent = lookup_locked(h, w->service);
    send_status(call, w->last_sent);
    if (h->draining) {
        drey_call_finish(call, NULL);
        free(w);
    } else {
        drey_list_push(&h->watchers, &w->link);
        drey_call_set_user(call, w);
    }
    pthread_mutex_unlock(&h->mu);
}

static void watch_done(void *ctx, drey_call *call) {
    drey_health *h = ctx;
    pthread_mutex_lock(&h->mu);
    watcher *w = drey_call_user(call);
    if (w != NULL) {
        drey_list_remove(&h->watchers, &w->link);
        free(w);
        drey_call_set_user(call, NULL);
    }
    pthread_mutex_unlock(&h->mu);
}

bool drey_health_register(drey_health *h, drey_method_table *t, drey_server *s) {
    static const drey_method_spec check_spec = {.name = "Check", .flags = DREY_METHOD_SYSTEM, .apply = check};
    const ProtobufCServiceDescriptor *sd = &grpc__health__v1__health__descriptor;
    drey_server_method watch = {
        .path = "/grpc.health.v1.Health/Watch",
        .input = &grpc__health__v1__health_check_request__descriptor,
        .server_streaming = true,
        .on_message = watch_message,
        .on_done = watch_done,
        .ctx = h,
    };
    return drey_method_table_add_service(t, sd, &check_spec, 1, h) && drey_server_add_method(s, &watch);
}
