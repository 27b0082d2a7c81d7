/*
 * admin — drey.admin.v1.Admin; see include/drey/admin.h.
 *
 * Snapshot answers from the snapshot thread once the snapshot is durable,
 * so the completion-queue thread never waits on the disk.
 */
#include "drey/admin.h"

#include <stdatomic.h>
#include <stdlib.h>

#include "drey/admin/v1/admin.pb-c.h"

struct drey_admin {
    bool durable;
    _Atomic(drey_storage *) storage;
};

drey_admin *drey_admin_create(bool durable) {
    drey_admin *a = calloc(1, sizeof *a);
    if (a == NULL)
        abort();
    a->durable = durable;
    return a;
}

void drey_admin_destroy(drey_admin *a) {
    free(a);
}

void drey_admin_set_storage(drey_admin *a, drey_storage *st) {
    atomic_store(&a->storage, st);
}

static void fail(drey_call *call, drey_error e) {
    drey_status st;
    drey_status_init(&st);
    drey_status_set(&st, e);
    drey_call_fail(call, &st);
}

static void snapshot_done(void *arg, const drey_snapshot_result *r) {
    drey_call *call = arg;
    if (r->rc != 0) {
        fail(call, DREY_ERR_SNAPSHOT_FAILED);
        return;
    }
    Drey__Admin__V1__SnapshotResponse resp = DREY__ADMIN__V1__SNAPSHOT_RESPONSE__INIT;
    Google__Protobuf__Duration d = GOOGLE__PROTOBUF__DURATION__INIT;
    d.seconds = r->duration_ms / 1000;
    d.nanos = (int32_t)(r->duration_ms % 1000) * 1000000;
    resp.lsn = r->info.lsn;
    resp.file = (char *)r->file;
    resp.entries = r->info.entries;
    resp.bytes = r->info.bytes;
    resp.duration = &d;
    resp.segments_removed = r->segments_removed;
    drey_call_reply(call, &resp.base);
}

static void handle_snapshot(drey_call *call, const ProtobufCMessage *msg) {
    (void)msg;
    drey_admin *a = drey_call_service_ctx(call);
    drey_storage *st = atomic_load(&a->storage);
    if (st == NULL) {
        fail(call, a->durable ? DREY_ERR_RECOVERING : DREY_ERR_EPHEMERAL_NODE);
        return;
    }
    drey_storage_request_snapshot(st, snapshot_done, call);
}

static const drey_handler handlers[] = {
    {.name = "Snapshot", .flags = DREY_HANDLER_SYSTEM, .unary = handle_snapshot},
};

bool drey_admin_register(drey_admin *a, drey_server *s) {
    return drey_server_add_service(s, &drey__admin__v1__admin__descriptor, handlers,
                                   sizeof handlers / sizeof handlers[0], a);
}
