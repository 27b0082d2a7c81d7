/*
 * admin — drey.admin.v1.Admin, the operator's service: Snapshot.
 */
#ifndef DREY_ADMIN_H
#define DREY_ADMIN_H

#include <stdbool.h>

#include "drey/server.h"
#include "drey/storage.h"

typedef struct drey_admin drey_admin;

/* A durable node's storage is set once recovery is done; until then Snapshot
 * is refused with RECOVERING (ephemeral nodes: EPHEMERAL_NODE). */
drey_admin *drey_admin_create(bool durable);
void drey_admin_destroy(drey_admin *a);
void drey_admin_set_storage(drey_admin *a, drey_storage *st);
bool drey_admin_register(drey_admin *a, drey_server *s);

#endif
