/*
 * status — what a call's outcome says: the gRPC code and message, and the
 * google.rpc.Status a drey server puts in `grpc-status-details-bin`; see
 * include/drey/client.h.
 */
#include <string.h>

#include "drey/client.h"
#include "drey/rpc.h"
#include "google/protobuf/any.pb-c.h"
#include "google/protobuf/duration.pb-c.h"

#define TYPE_PREFIX "type.googleapis.com/"
/* google.protobuf.Duration's bound: 10,000 years. */
#define DURATION_MAX_SECONDS 315576000000LL

static void clear_details(drey_client_status *st) {
    st->details = NULL;
    st->error_info = NULL;
    st->bad_request = NULL;
    st->quota_failure = NULL;
    st->retry_info = NULL;
}

void drey_client_status_set(drey_client_status *st, grpc_status_code code, const char *message) {
    st->code = code;
    st->message = message != NULL ? message : "";
    clear_details(st);
}

/* The message type an Any holds: the type URL after its last '/'. */
static const char *any_type(const Google__Protobuf__Any *any) {
    const char *url = any->type_url != NULL ? any->type_url : "";
    const char *slash = strrchr(url, '/');
    return slash != NULL ? slash + 1 : url;
}

static const ProtobufCMessage *unpack_any(const Google__Protobuf__Any *any, const ProtobufCMessageDescriptor *d,
                                          drey_arena *arena) {
    if (strcmp(any_type(any), d->name) != 0)
        return NULL;
    return protobuf_c_message_unpack(d, drey_arena_protobuf_allocator(arena), any->value.len, any->value.data);
}

bool drey_client_status_decode_details(drey_client_status *st, const uint8_t *data, size_t len, drey_arena *arena) {
    clear_details(st);
    Google__Rpc__Status *s = (Google__Rpc__Status *)protobuf_c_message_unpack(
        &google__rpc__status__descriptor, drey_arena_protobuf_allocator(arena), len, data);
    if (s == NULL)
        return false;
    st->details = s;
    for (size_t i = 0; i < s->n_details; i++) {
        const Google__Protobuf__Any *any = s->details[i];
        const ProtobufCMessage *m;
        if (st->error_info == NULL && (m = unpack_any(any, &google__rpc__error_info__descriptor, arena)) != NULL)
            st->error_info = (const Google__Rpc__ErrorInfo *)m;
        else if (st->bad_request == NULL &&
                 (m = unpack_any(any, &google__rpc__bad_request__descriptor, arena)) != NULL)
            st->bad_request = (const Google__Rpc__BadRequest *)m;
        else if (st->quota_failure == NULL &&
                 (m = unpack_any(any, &google__rpc__quota_failure__descriptor, arena)) != NULL)
            st->quota_failure = (const Google__Rpc__QuotaFailure *)m;
        else if (st->retry_info == NULL && (m = unpack_any(any, &google__rpc__retry_info__descriptor, arena)) != NULL)
            st->retry_info = (const Google__Rpc__RetryInfo *)m;
    }
    return true;
}

const char *drey_client_status_reason(const drey_client_status *st) {
    return st->error_info != NULL && st->error_info->reason != NULL ? st->error_info->reason : "";
}

const char *drey_client_status_domain(const drey_client_status *st) {
    return st->error_info != NULL && st->error_info->domain != NULL ? st->error_info->domain : "";
}

const char *drey_client_status_metadata(const drey_client_status *st, const char *key) {
    if (st->error_info == NULL)
        return NULL;
    for (size_t i = 0; i < st->error_info->n_metadata; i++) {
        const Google__Rpc__ErrorInfo__MetadataEntry *e = st->error_info->metadata[i];
        if (e->key != NULL && strcmp(e->key, key) == 0)
            return e->value != NULL ? e->value : "";
    }
    return NULL;
}

const Google__Rpc__BadRequest__FieldViolation *drey_client_status_violation(const drey_client_status *st,
                                                                           const char *field) {
    if (st->bad_request == NULL)
        return NULL;
    for (size_t i = 0; i < st->bad_request->n_field_violations; i++) {
        const Google__Rpc__BadRequest__FieldViolation *v = st->bad_request->field_violations[i];
        if (v->field != NULL && strcmp(v->field, field) == 0)
            return v;
    }
    return NULL;
}

int64_t drey_client_status_retry_delay_ms(const drey_client_status *st) {
    if (st->retry_info == NULL || st->retry_info->retry_delay == NULL)
        return -1;
    const Google__Protobuf__Duration *d = st->retry_info->retry_delay;
    /* The server's bytes: outside google.protobuf.Duration's range, or
     * negative, it is no delay at all (and seconds * 1000 would overflow). */
    if (d->seconds < 0 || d->seconds > DURATION_MAX_SECONDS || d->nanos < 0 || d->nanos > 999999999)
        return -1;
    return d->seconds * 1000 + d->nanos / 1000000;
}

const char *drey_client_code_name(grpc_status_code code) {
    const char *name = drey_rpc_code_name(code);
    return name != NULL ? name : "UNKNOWN_CODE";
}
