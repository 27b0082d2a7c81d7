/*
 * conn — the connection to the node and what every command does with it:
 * calls through the endpoints (failing over to the next on a failure of
 * the transport), the client for a stream, and reporting a failed call or a
 * negative answer in the -o format.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "grpc/health/v1/health.pb-c.h"

static void disconnect(drey_cli *c) {
    drey_client_close(c->client);
    c->client = NULL;
}

static drey_client *connect_current(drey_cli *c, drey_client_status *st) {
    if (c->client != NULL)
        return c->client;
    char err[512];
    c->copts.target = c->endpoints[c->current];
    c->copts.token = c->token;
    c->client = drey_client_open(&c->copts, err, sizeof err);
    if (c->client == NULL)
        drey_client_status_set(st, GRPC_STATUS_INVALID_ARGUMENT, drey_arena_strndup(&c->arena, err, strlen(err)));
    return c->client;
}

/* A failure of the transport, not an answer: the next endpoint may do. */
static bool transport_failure(const drey_client_status *st) {
    return st->code == GRPC_STATUS_UNAVAILABLE && st->details == NULL;
}

/* One unary call, as a message or as bytes. */
typedef struct unary {
    const char *method;
    const ProtobufCMessage *req; /* NULL: the bytes */
    const ProtobufCMessageDescriptor *type;
    void *resp;
    const uint8_t *bytes;
    size_t len;
} unary;

/* Tries u on each endpoint in turn, from the current one, until one
 * answers (an answer that is an error included). */
static grpc_status_code through_endpoints(drey_cli *c, const unary *u, drey_client_status *st) {
    for (size_t tried = 0; tried < c->n_endpoints; tried++) {
        drey_client *cl = connect_current(c, st);
        if (cl == NULL)
            return st->code;
        grpc_status_code code =
            u->req != NULL ? drey_client_unary(cl, u->method, u->req, u->type, c->timeout_ms, &c->arena,
                                               (ProtobufCMessage **)u->resp, st)
                           : drey_client_unary_raw(cl, u->method, u->bytes, u->len, c->timeout_ms, &c->arena,
                                                   (ProtobufCBinaryData *)u->resp, st);
        if (code == GRPC_STATUS_OK || !transport_failure(st))
            return st->code;
        disconnect(c);
        c->current = (c->current + 1) % c->n_endpoints;
    }
    return st->code;
}

grpc_status_code drey_cli_call(drey_cli *c, const char *method, const ProtobufCMessage *req,
                               const ProtobufCMessageDescriptor *type, void *resp, drey_client_status *st) {
    return through_endpoints(c, &(unary){.method = method, .req = req, .type = type, .resp = resp}, st);
}

grpc_status_code drey_cli_call_raw(drey_cli *c, const char *method, const uint8_t *req, size_t len,
                                   ProtobufCBinaryData *resp, drey_client_status *st) {
    return through_endpoints(c, &(unary){.method = method, .bytes = req, .len = len, .resp = resp}, st);
}

drey_client *drey_cli_stream_client(drey_cli *c, drey_client_status *st) {
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = "";
    Grpc__Health__V1__HealthCheckResponse *resp;
    int64_t saved = c->timeout_ms;
    if (c->timeout_ms < 0)
        c->timeout_ms = 5000;
    grpc_status_code code = drey_cli_call(c, DREY_CLIENT_HEALTH("Check"), &req.base,
                                          &grpc__health__v1__health_check_response__descriptor, &resp, st);
    c->timeout_ms = saved;
    /* Any answer means the node is there (health may be NOT_SERVING while it drains). */
    return code == GRPC_STATUS_OK || !transport_failure(st) ? c->client : NULL;
}

/* --- reporting ------------------------------------------------------------------ */

json_t *drey_cli_status_json(const drey_client_status *st) {
    json_t *o = json_object();
    json_object_set_new(o, "code", json_string(drey_client_code_name(st->code)));
    json_object_set_new(o, "message", json_string(st->message));
    const Google__Rpc__ErrorInfo *ei = st->error_info;
    if (ei != NULL) {
        json_object_set_new(o, "reason", json_string(ei->reason));
        json_object_set_new(o, "domain", json_string(ei->domain));
        json_t *md = json_object();
        for (size_t i = 0; i < ei->n_metadata; i++)
            json_object_set_new(md, ei->metadata[i]->key, json_string(ei->metadata[i]->value));
        json_object_set_new(o, "metadata", md);
    }
    if (st->bad_request != NULL) {
        json_t *a = json_array();
        for (size_t i = 0; i < st->bad_request->n_field_violations; i++) {
            const Google__Rpc__BadRequest__FieldViolation *v = st->bad_request->field_violations[i];
            json_array_append_new(a, json_pack("{ssssss}", "field", v->field, "reason", v->reason, "description",
                                               v->description));
        }
        json_object_set_new(o, "fieldViolations", a);
    }
    if (st->quota_failure != NULL) {
        json_t *a = json_array();
        for (size_t i = 0; i < st->quota_failure->n_violations; i++) {
            const Google__Rpc__QuotaFailure__Violation *v = st->quota_failure->violations[i];
            json_array_append_new(a, json_pack("{ssss}", "subject", v->subject, "description", v->description));
        }
        json_object_set_new(o, "quotaViolations", a);
    }
    if (drey_client_status_retry_delay_ms(st) >= 0)
        json_object_set_new(o, "retryDelayMs", json_integer(drey_client_status_retry_delay_ms(st)));
    return o;
}

int drey_cli_report(const drey_cli *c, const drey_client_status *st) {
    if (c->format == DREY_OUT_JSON) {
        json_t *o = json_pack("{so}", "error", drey_cli_status_json(st));
        drey_out_json_line(stderr, o);
        json_decref(o);
        return DREY_EXIT_FAILED;
    }
    fprintf(stderr, "drey: %s: %s\n", drey_client_code_name(st->code), st->message);
    const Google__Rpc__ErrorInfo *ei = st->error_info;
    if (ei != NULL) {
        fprintf(stderr, "  reason: %s (%s)\n", ei->reason, ei->domain);
        for (size_t i = 0; i < ei->n_metadata; i++)
            fprintf(stderr, "  %s: %s\n", ei->metadata[i]->key, ei->metadata[i]->value);
    }
    for (size_t i = 0; st->bad_request != NULL && i < st->bad_request->n_field_violations; i++) {
        const Google__Rpc__BadRequest__FieldViolation *v = st->bad_request->field_violations[i];
        fprintf(stderr, "  field %s: %s: %s\n", v->field, v->reason, v->description);
    }
    for (size_t i = 0; st->quota_failure != NULL && i < st->quota_failure->n_violations; i++) {
        const Google__Rpc__QuotaFailure__Violation *v = st->quota_failure->violations[i];
        fprintf(stderr, "  quota %s: %s\n", v->subject, v->description);
    }
    if (drey_client_status_retry_delay_ms(st) >= 0)
        fprintf(stderr, "  retry after: %" PRId64 "ms\n", drey_client_status_retry_delay_ms(st));
    return DREY_EXIT_FAILED;
}

int drey_cli_negative(drey_cli *c, const char *what, json_t *row) {
    if (c->format == DREY_OUT_JSON && row != NULL)
        drey_out_json_line(stdout, row);
    else
        fprintf(stderr, "%s\n", what);
    json_decref(row);
    return DREY_EXIT_NEGATIVE;
}

bool drey_cli_call_ok(drey_cli *c, const char *method, const ProtobufCMessage *req,
                      const ProtobufCMessageDescriptor *type, void *resp, int *rc) {
    drey_client_status st;
    if (drey_cli_call(c, method, req, type, resp, &st) == GRPC_STATUS_OK)
        return true;
    *rc = drey_cli_report(c, &st);
    return false;
}

/* --- values ----------------------------------------------------------------------- */

json_t *drey_cli_timestamp(const Google__Protobuf__Timestamp *t) {
    if (t == NULL)
        return json_null();
    time_t secs = (time_t)t->seconds;
    struct tm tm;
    char buf[48];
    gmtime_r(&secs, &tm);
    size_t n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, sizeof buf - n, ".%03dZ", t->nanos / 1000000);
    return json_string(buf);
}

int drey_cli_print_one(drey_cli *c, const char *const *columns, json_t *row) {
    drey_out o;
    drey_out_begin(&o, c->format, stdout, columns);
    drey_out_row(&o, row);
    drey_out_flush(&o);
    return DREY_EXIT_OK;
}

