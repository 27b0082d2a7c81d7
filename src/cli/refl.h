/*
 * refl — a server's reflection (grpc.reflection.v1, falling back to
 * v1alpha) feeding a descriptor pool: what `drey call`, `drey list` and
 * `drey describe` know of a server they have no .proto files for.
 */
#ifndef DREY_CLI_REFL_H
#define DREY_CLI_REFL_H

#include <stdbool.h>

#include <jansson.h>

#include "drey/client.h"
#include "pbdyn.h"

typedef struct drey_refl {
    drey_client *client;
    int64_t timeout_ms;
    bool v1alpha;       /* the server only has v1alpha */
    drey_pb_pool *pool; /* its resolver asks the server */
    drey_client_status st; /* the last failure, when one was a call's */
    bool call_failed;
    char err[512];
} drey_refl;

void drey_refl_init(drey_refl *r, drey_client *c, int64_t timeout_ms);
void drey_refl_destroy(drey_refl *r);

/* The services the server lists (a new array of strings); NULL with r->err
 * (and r->st when the call failed). */
json_t *drey_refl_services(drey_refl *r);

/* Loads the file defining symbol, and what it imports, into r->pool. */
bool drey_refl_load(drey_refl *r, const char *symbol);

#endif
