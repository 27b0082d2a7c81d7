/*
 * node — the commands about the node rather than its data: health (the
 * gRPC health check), ready (the readiness details, as the ops listener
 * serves them; from that listener itself with --ops) and snapshot (write
 * one now and compact the journal).
 */
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "drey/admin/v1/admin.pb-c.h"
#include "drey/alloc.h"
#include "drey/pbjson.h"
#include "grpc/health/v1/health.pb-c.h"
#include "ops.h"

int drey_cli_cmd_health(drey_cli *c, char **a) {
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = a[0] != NULL ? a[0] : "";
    Grpc__Health__V1__HealthCheckResponse *r;
    int rc;
    if (!drey_cli_call_ok(c, DREY_CLIENT_HEALTH("Check"), &req.base, &grpc__health__v1__health_check_response__descriptor, &r, &rc))
        return rc;
    const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(
        &grpc__health__v1__health_check_response__serving_status__descriptor, (int)r->status);
    static const char *const cols[] = {"status", NULL};
    drey_cli_print_one(c, cols, json_pack("{ssss}", "service", req.service, "status", ev != NULL ? ev->name : "UNKNOWN"));
    return r->status == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING ? DREY_EXIT_OK
                                                                                          : DREY_EXIT_NEGATIVE;
}

int drey_cli_cmd_snapshot(drey_cli *c, char **a) {
    (void)a;
    Drey__Admin__V1__SnapshotRequest req = DREY__ADMIN__V1__SNAPSHOT_REQUEST__INIT;
    Drey__Admin__V1__SnapshotResponse *r;
    int rc;
    if (!drey_cli_call_ok(c, DREY_CLIENT_ADMIN("Snapshot"), &req.base, &drey__admin__v1__snapshot_response__descriptor, &r, &rc))
        return rc;
    int64_t ms = r->duration != NULL ? r->duration->seconds * 1000 + r->duration->nanos / 1000000 : 0;
    static const char *const cols[] = {"lsn", "file", "entries", "bytes", "durationMs", "segmentsRemoved", NULL};
    return drey_cli_print_one(c, cols,
                     json_pack("{sIsssIsIsIsI}", "lsn", (json_int_t)r->lsn, "file", r->file, "entries",
                               (json_int_t)r->entries, "bytes", (json_int_t)r->bytes, "durationMs", (json_int_t)ms,
                               "segmentsRemoved", (json_int_t)r->segments_removed));
}

/* Leaves of a JSON document as "a.b.c" / value rows. */
static void flatten(drey_out *o, const char *path, json_t *v) {
    if (json_is_object(v) && json_object_size(v) > 0) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s%s%s", path, path[0] ? "." : "", k);
            flatten(o, sub, x);
        }
    } else if (json_is_array(v) && json_array_size(v) > 0) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s[%zu]", path, i);
            flatten(o, sub, json_array_get(v, i));
        }
    } else {
        drey_out_row(o, json_pack("{sssO}", "field", path, "value", v));
    }
}

/* The readiness document: over gRPC, or (--ops, $DREY_OPS_LISTEN) the
 * same document from the ops listener, which needs no token from loopback
 * (inside a pod: kubectl exec ... drey ready). NULL, and *rc, if neither
 * answered; else malloc'd JSON text. */
static char *readiness_text(drey_cli *c, int *rc) {
    char ops[300];
    if (drey_cli_ops_address(drey_cli_opt(c, "ops"), ops, sizeof ops)) {
        char *body, err[320];
        size_t len;
        int status = drey_cli_ops_get(ops, "/health/ready/details", &body, &len, err, sizeof err);
        if (status == 200 || status == 503)
            return body;
        if (status == 0)
            fprintf(stderr, "drey: ready: %s\n", err);
        else
            fprintf(stderr, "drey: ready: the ops listener at %s answered HTTP %d\n", ops, status);
        free(status != 0 ? body : NULL);
        *rc = DREY_EXIT_FAILED;
        return NULL;
    }
    Drey__Admin__V1__GetReadinessDetailsRequest req = DREY__ADMIN__V1__GET_READINESS_DETAILS_REQUEST__INIT;
    Drey__Admin__V1__ReadinessDetails *r;
    if (!drey_cli_call_ok(c, DREY_CLIENT_ADMIN("GetReadinessDetails"), &req.base,
                          &drey__admin__v1__readiness_details__descriptor, &r, rc))
        return NULL;
    char *text = NULL;
    size_t len = 0;
    FILE *m = drey_xopen_memstream(&text, &len);
    drey_pbjson_write(m, &r->base);
    fclose(m);
    return text;
}

/* The document GET /health/ready/details serves (-o json: the same bytes'
 * schema); text and table: one field per line. */
int drey_cli_cmd_ready(drey_cli *c, char **a) {
    (void)a;
    int rc;
    char *text = readiness_text(c, &rc);
    if (text == NULL)
        return rc;
    json_t *doc = json_loads(text, 0, NULL);
    free(text);
    if (doc == NULL) {
        fprintf(stderr, "drey: ready: the details are not JSON\n");
        return DREY_EXIT_FAILED;
    }
    bool ready = json_is_true(json_object_get(doc, "ready"));
    if (c->format == DREY_OUT_JSON) {
        char *one = json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER);
        puts(one);
        free(one);
    } else {
        static const char *const cols[] = {"field", "value", NULL};
        drey_out o;
        drey_out_begin(&o, c->format, stdout, cols);
        flatten(&o, "", doc);
        drey_out_flush(&o);
    }
    json_decref(doc);
    return ready ? DREY_EXIT_OK : DREY_EXIT_NEGATIVE;
}
