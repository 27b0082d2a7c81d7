/*
 * health — grpc.health.v1.Health: Check and Watch.
 *
 * Knows "" (the whole node) and the services registered with it. Check of an
 * unknown service is NOT_FOUND; Watch of one gets SERVICE_UNKNOWN and stays
 * open, as the protocol asks. drey_health_drain() flips everything to
 * NOT_SERVING, tells every watcher, and ends their streams.
 */
#ifndef DREY_HEALTH_H
#define DREY_HEALTH_H

#include <stdbool.h>

#include "drey/method.h"
#include "drey/server.h"

typedef enum drey_health_status {
    DREY_HEALTH_UNKNOWN = 0,
    DREY_HEALTH_SERVING = 1,
    DREY_HEALTH_NOT_SERVING = 2,
    DREY_HEALTH_SERVICE_UNKNOWN = 3,
} drey_health_status;

typedef struct drey_health drey_health;

drey_health *drey_health_create(void);
void drey_health_destroy(drey_health *h);

/* Check joins the request chain's table (it is validated, and answers
 * without a token or admission); Watch is a stream of the transport's. */
bool drey_health_register(drey_health *h, drey_method_table *t, drey_server *s);

/* Declares a service (or "") and its status; watchers are told. */
void drey_health_set(drey_health *h, const char *service, drey_health_status status);
drey_health_status drey_health_get(drey_health *h, const char *service);

/* Every service NOT_SERVING, every Watch told and ended; later Watch calls
 * get NOT_SERVING and end at once. */
void drey_health_drain(drey_health *h);

#endif
