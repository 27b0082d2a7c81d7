/*
 * status — the error catalogue and google.rpc.Status encoding; see
 * include/drey/status.h.
 */
#include "drey/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "google/protobuf/any.pb-c.h"
#include "google/protobuf/duration.pb-c.h"
#include "google/rpc/error_details.pb-c.h"
#include "google/rpc/status.pb-c.h"

static const drey_error_info catalogue[DREY_ERR_COUNT_] = {
    [DREY_ERR_NONE] = {DREY_ERR_NONE, GRPC_STATUS_OK, "", ""},
    [DREY_ERR_MALFORMED_REQUEST] = {DREY_ERR_MALFORMED_REQUEST, GRPC_STATUS_INVALID_ARGUMENT, "MALFORMED_REQUEST",
                                    "the request is not a valid protobuf message of the method's request type"},
    [DREY_ERR_INVALID_CACHE_NAME] = {DREY_ERR_INVALID_CACHE_NAME, GRPC_STATUS_INVALID_ARGUMENT, "INVALID_CACHE_NAME",
                                     "cache names are 1 to max-cache-name-bytes bytes of [A-Za-z0-9._-], not . or .."},
    [DREY_ERR_INVALID_KEY] = {DREY_ERR_INVALID_KEY, GRPC_STATUS_INVALID_ARGUMENT, "INVALID_KEY",
                              "keys are 1 to max-key-bytes bytes of valid UTF-8 without control characters"},
    [DREY_ERR_INVALID_VALUE] = {DREY_ERR_INVALID_VALUE, GRPC_STATUS_INVALID_ARGUMENT, "INVALID_VALUE",
                                "a value must have exactly one kind set; its strings must be UTF-8 without NUL"},
    [DREY_ERR_PAYLOAD_TOO_LARGE] = {DREY_ERR_PAYLOAD_TOO_LARGE, GRPC_STATUS_INVALID_ARGUMENT, "PAYLOAD_TOO_LARGE",
                                    "the value is larger than max-value-bytes"},
    [DREY_ERR_BATCH_TOO_LARGE] = {DREY_ERR_BATCH_TOO_LARGE, GRPC_STATUS_INVALID_ARGUMENT, "BATCH_TOO_LARGE",
                                  "a batch holds at most max-batch keys or entries"},
    [DREY_ERR_DUPLICATE_KEY] = {DREY_ERR_DUPLICATE_KEY, GRPC_STATUS_INVALID_ARGUMENT, "DUPLICATE_KEY",
                                "a batch names the same key more than once"},
    [DREY_ERR_INVALID_EXPIRATION] = {DREY_ERR_INVALID_EXPIRATION, GRPC_STATUS_INVALID_ARGUMENT, "INVALID_EXPIRATION",
                                     "ttl must be positive and at most 100 years; durations and timestamps must be "
                                     "normalized"},
    [DREY_ERR_INVALID_REQUEST_ID] = {DREY_ERR_INVALID_REQUEST_ID, GRPC_STATUS_INVALID_ARGUMENT, "INVALID_REQUEST_ID",
                                     "request_id is at most 128 bytes"},
    [DREY_ERR_VERSION_MISMATCH] = {DREY_ERR_VERSION_MISMATCH, GRPC_STATUS_FAILED_PRECONDITION, "VERSION_MISMATCH",
                                   "the entry's version is not if_version"},
    [DREY_ERR_NOT_AN_INTEGER] = {DREY_ERR_NOT_AN_INTEGER, GRPC_STATUS_FAILED_PRECONDITION, "NOT_AN_INTEGER",
                                 "the value is not an int64"},
    [DREY_ERR_INTEGER_OVERFLOW] = {DREY_ERR_INTEGER_OVERFLOW, GRPC_STATUS_OUT_OF_RANGE, "INTEGER_OVERFLOW",
                                   "the result does not fit in an int64"},
    [DREY_ERR_INVALID_CURSOR] = {DREY_ERR_INVALID_CURSOR, GRPC_STATUS_INVALID_ARGUMENT, "INVALID_CURSOR",
                                 "the scan cursor is not one this node issued for this cache and prefix (or its "
                                 "hash seed changed since: an ephemeral node restarted); start the scan again"},
    [DREY_ERR_UNKNOWN_METHOD] = {DREY_ERR_UNKNOWN_METHOD, GRPC_STATUS_UNIMPLEMENTED, "UNKNOWN_METHOD",
                                 "this server does not implement the method"},
    [DREY_ERR_UNKNOWN_SERVICE] = {DREY_ERR_UNKNOWN_SERVICE, GRPC_STATUS_NOT_FOUND, "UNKNOWN_SERVICE",
                                  "the health service does not know this service name"},
    [DREY_ERR_DEADLINE_EXCEEDED] = {DREY_ERR_DEADLINE_EXCEEDED, GRPC_STATUS_DEADLINE_EXCEEDED, "DEADLINE_EXCEEDED",
                                    "the call's deadline passed before it could run"},
    [DREY_ERR_CANCELLED] = {DREY_ERR_CANCELLED, GRPC_STATUS_CANCELLED, "CANCELLED",
                            "the client cancelled the call while it waited"},
    [DREY_ERR_IDEMPOTENCY_KEY_REUSED] = {DREY_ERR_IDEMPOTENCY_KEY_REUSED, GRPC_STATUS_FAILED_PRECONDITION,
                                         "IDEMPOTENCY_KEY_REUSED",
                                         "this request_id was already used for a different request"},
    [DREY_ERR_JOURNAL_WRITE_FAILED] = {DREY_ERR_JOURNAL_WRITE_FAILED, GRPC_STATUS_UNAVAILABLE,
                                       "JOURNAL_WRITE_FAILED",
                                       "the write could not be made durable and was not applied; retry with the "
                                       "same request_id"},
    [DREY_ERR_RECOVERING] = {DREY_ERR_RECOVERING, GRPC_STATUS_UNAVAILABLE, "RECOVERING",
                             "the node is still recovering its data; retry shortly"},
    [DREY_ERR_EPHEMERAL_NODE] = {DREY_ERR_EPHEMERAL_NODE, GRPC_STATUS_FAILED_PRECONDITION, "EPHEMERAL_NODE",
                                 "the node runs with --ephemeral and keeps no data on disk"},
    [DREY_ERR_SNAPSHOT_FAILED] = {DREY_ERR_SNAPSHOT_FAILED, GRPC_STATUS_INTERNAL, "SNAPSHOT_FAILED",
                                  "the snapshot could not be written; see the node's log"},
#define TOKEN(e, reason, msg) [DREY_ERR_##e] = {DREY_ERR_##e, GRPC_STATUS_UNAUTHENTICATED, reason, msg}
    TOKEN(TOKEN_MISSING, "TOKEN_MISSING", "this method needs an authorization: Bearer <JWT> header"),
    TOKEN(TOKEN_MALFORMED, "TOKEN_MALFORMED", "the authorization header is not Bearer <header.payload.signature>"),
    TOKEN(TOKEN_TOO_LARGE, "TOKEN_TOO_LARGE", "the token is longer than the node accepts"),
    TOKEN(TOKEN_ALGORITHM, "TOKEN_ALGORITHM",
          "the token's alg is not the algorithm configured for its key (alg none is never accepted)"),
    TOKEN(TOKEN_UNKNOWN_KEY, "TOKEN_UNKNOWN_KEY", "no configured key has the token's kid"),
    TOKEN(TOKEN_BAD_SIGNATURE, "TOKEN_BAD_SIGNATURE", "the token's signature does not verify"),
    TOKEN(TOKEN_EXPIRED, "TOKEN_EXPIRED", "the token has expired"),
    TOKEN(TOKEN_NOT_YET_VALID, "TOKEN_NOT_YET_VALID", "the token is not valid yet (nbf or iat in the future)"),
    TOKEN(TOKEN_WRONG_ISSUER, "TOKEN_WRONG_ISSUER", "the token's iss is not the configured issuer"),
    TOKEN(TOKEN_WRONG_AUDIENCE, "TOKEN_WRONG_AUDIENCE", "the token's aud does not name the configured audience"),
    TOKEN(TOKEN_INVALID, "TOKEN_INVALID", "the token's claims are unusable (exp is required)"),
#undef TOKEN
#define QUOTA(e, reason, msg) [DREY_ERR_##e] = {DREY_ERR_##e, GRPC_STATUS_RESOURCE_EXHAUSTED, reason, msg}
    QUOTA(NODE_RATE_LIMIT, "NODE_RATE_LIMIT", "the node's request rate limit is reached"),
    QUOTA(PRINCIPAL_RATE_LIMIT, "PRINCIPAL_RATE_LIMIT", "the caller's request rate limit is reached"),
    QUOTA(PRINCIPAL_CONCURRENCY_LIMIT, "PRINCIPAL_CONCURRENCY_LIMIT",
          "the caller has as many calls in flight and queued as it may"),
    QUOTA(QUEUE_FULL, "QUEUE_FULL", "the node is at its concurrency limit and its wait queue is full"),
    QUOTA(QUEUE_TIMEOUT, "QUEUE_TIMEOUT", "the call waited in the queue for the longest time allowed"),
    QUOTA(MEMORY_PRESSURE, "MEMORY_PRESSURE", "the write would grow memory past the node's critical level"),
    QUOTA(JOURNAL_DISK_QUOTA, "JOURNAL_DISK_QUOTA",
          "the write would grow the journal past its disk quota; a snapshot and compaction free space"),
    QUOTA(TOO_MANY_CACHES, "TOO_MANY_CACHES", "the write would open a cache past the node's limit on caches"),
    QUOTA(PRINCIPAL_WATCH_LIMIT, "PRINCIPAL_WATCH_LIMIT",
          "the caller has as many Watch streams open as it may (--principal-max-watches)"),
    QUOTA(NODE_WATCH_LIMIT, "NODE_WATCH_LIMIT", "the node has as many Watch streams open as it may (--max-watches)"),
    QUOTA(JOURNAL_QUEUE_FULL, "JOURNAL_QUEUE_FULL",
          "the journal's queue of writes waiting for the disk is full; retry after a short delay"),
    QUOTA(TENANT_MEMORY_QUOTA, "TENANT_MEMORY_QUOTA",
          "the write would take its tenant's entries past the tenant's memory quota (tenants.maxBytes)"),
#undef QUOTA
    [DREY_ERR_CROSS_PARTITION] = {DREY_ERR_CROSS_PARTITION, GRPC_STATUS_INVALID_ARGUMENT, "CROSS_PARTITION",
                                  "the entries of an atomic batch must share a partition (use one {hash tag})"},
    [DREY_ERR_NOT_PRIMARY] = {DREY_ERR_NOT_PRIMARY, GRPC_STATUS_UNAVAILABLE, "NOT_PRIMARY",
                              "this node does not own the key's partition; ErrorInfo names the owner"},
    [DREY_ERR_PARTITION_UNAVAILABLE] = {DREY_ERR_PARTITION_UNAVAILABLE, GRPC_STATUS_UNAVAILABLE,
                                        "PARTITION_UNAVAILABLE",
                                        "the node that owns the key's partition cannot be reached; retry later"},
    [DREY_ERR_FORWARDING_NOT_ALLOWED] = {DREY_ERR_FORWARDING_NOT_ALLOWED, GRPC_STATUS_PERMISSION_DENIED,
                                         "FORWARDING_NOT_ALLOWED",
                                         "forwarding metadata is accepted only from cluster peers on the internal "
                                         "listener"},
    [DREY_ERR_PEER_UNAUTHENTICATED] = {DREY_ERR_PEER_UNAUTHENTICATED, GRPC_STATUS_UNAUTHENTICATED,
                                       "PEER_UNAUTHENTICATED",
                                       "the internal listener serves only peers whose certificate names the node "
                                       "they say they are"},
    [DREY_ERR_PARTITION_OWNED] = {DREY_ERR_PARTITION_OWNED, GRPC_STATUS_FAILED_PRECONDITION, "PARTITION_OWNED",
                                  "this node owns the partition: an import would replace live data"},
    [DREY_ERR_PARTITION_MOVING] = {DREY_ERR_PARTITION_MOVING, GRPC_STATUS_UNAVAILABLE, "PARTITION_MOVING",
                                   "a node is moving a partition of this cache to another: retry the cache-wide "
                                   "call once the move is over"},
    [DREY_ERR_LEASE_EXPIRED] = {DREY_ERR_LEASE_EXPIRED, GRPC_STATUS_UNAVAILABLE, "LEASE_EXPIRED",
                                "this node's cluster lease is not confirmed (etcd unreachable or the node paused): "
                                "it neither serves nor commits its partitions until it is; a write answered so "
                                "may have been applied: retry it with the same request_id"},
    [DREY_ERR_NOT_ENOUGH_REPLICAS] = {DREY_ERR_NOT_ENOUGH_REPLICAS, GRPC_STATUS_UNAVAILABLE, "NOT_ENOUGH_REPLICAS",
                                      "the partition has fewer in-sync copies than --min-in-sync: writes are "
                                      "refused until a backup has caught up"},
    [DREY_ERR_STALE_EPOCH] = {DREY_ERR_STALE_EPOCH, GRPC_STATUS_FAILED_PRECONDITION, "STALE_EPOCH",
                              "the record's epoch is older than this node's table: its sender no longer leads the "
                              "partition"},
    [DREY_ERR_OUT_OF_SEQUENCE] = {DREY_ERR_OUT_OF_SEQUENCE, GRPC_STATUS_FAILED_PRECONDITION, "OUT_OF_SEQUENCE",
                                  "the record does not follow the last one this node took of the partition: it "
                                  "needs a fresh copy"},
    [DREY_ERR_NOT_REPLICA] = {DREY_ERR_NOT_REPLICA, GRPC_STATUS_FAILED_PRECONDITION, "NOT_REPLICA",
                              "this node is not an in-sync backup of the partition, or the sender not its primary"},
    [DREY_ERR_IN_SYNC_COPY] = {DREY_ERR_IN_SYNC_COPY, GRPC_STATUS_FAILED_PRECONDITION, "IN_SYNC_COPY",
                               "this node holds an in-sync copy of the partition: it has every acknowledged write "
                               "and a failover may promote it, so no import replaces it"},
    [DREY_ERR_COPY_NOT_PLANNED] = {DREY_ERR_COPY_NOT_PLANNED, GRPC_STATUS_FAILED_PRECONDITION, "COPY_NOT_PLANNED",
                                   "the partition's entry at the import's epoch does not name this node the target "
                                   "of a copy from the sender"},
    [DREY_ERR_NOT_CAUGHT_UP] = {DREY_ERR_NOT_CAUGHT_UP, GRPC_STATUS_FAILED_PRECONDITION, "NOT_CAUGHT_UP",
                                "this backup has not applied every write of the partition up to the sequence asked "
                                "(or its table is older than the epoch): ask again"},
    [DREY_ERR_NOT_PERMITTED] = {DREY_ERR_NOT_PERMITTED, GRPC_STATUS_PERMISSION_DENIED, "NOT_PERMITTED",
                                "the caller's roles do not grant this verb on this cache and every key the "
                                "request names (--authz-policy)"},
    [DREY_ERR_INTERNAL] = {DREY_ERR_INTERNAL, GRPC_STATUS_INTERNAL, "INTERNAL", "internal error"},
};

const drey_error_info *drey_error_lookup(drey_error e) {
    if ((unsigned)e >= DREY_ERR_COUNT_)
        e = DREY_ERR_INTERNAL;
    return &catalogue[e];
}

bool drey_error_from_reason(const char *reason, size_t len, drey_error *out) {
    /* A linear scan: this answers retries from remembered outcomes, not
     * every call. Row 0 (NONE) has the empty reason and is never a match. */
    for (size_t i = 1; i < DREY_ERR_COUNT_; i++) {
        if (strlen(catalogue[i].reason) == len && memcmp(catalogue[i].reason, reason, len) == 0) {
            *out = catalogue[i].error;
            return true;
        }
    }
    return false;
}

const char *drey_status_code_name(grpc_status_code code) {
    static const char *const names[] = {
        "OK",          "CANCELLED",      "UNKNOWN",        "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED", "NOT_FOUND",
        "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
        "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL",    "UNAVAILABLE",        "DATA_LOSS",         "UNAUTHENTICATED",
    };
    return (unsigned)code < sizeof names / sizeof names[0] ? names[code] : "UNKNOWN";
}

const drey_error_info *drey_error_catalogue(size_t *n) {
    *n = DREY_ERR_COUNT_ - 1;
    return catalogue + 1;
}

void drey_status_init(drey_status *st) {
    st->error = DREY_ERR_NONE;
    st->message = NULL;
    st->n_metadata = 0;
    st->n_violations = 0;
    st->n_violations_total = 0;
    st->quota_subject[0] = '\0';
    st->quota_description = NULL;
    st->retry_delay_ms = -1;
}

grpc_status_code drey_status_code(const drey_status *st) {
    return drey_error_lookup(st->error)->code;
}

const char *drey_status_message(const drey_status *st) {
    return st->message != NULL ? st->message : drey_error_lookup(st->error)->message;
}

void drey_status_set(drey_status *st, drey_error e) {
    if (st->error == DREY_ERR_NONE)
        st->error = e;
}

void drey_status_add_metadata(drey_status *st, const char *key, const char *fmt, ...) {
    if (st->n_metadata == DREY_STATUS_MAX_METADATA)
        return;
    drey_status_metadata *m = &st->metadata[st->n_metadata++];
    m->key = key;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m->value, sizeof m->value, fmt, ap);
    va_end(ap);
}

void drey_status_add_violation(drey_status *st, drey_error e, const char *fmt, ...) {
    drey_status_set(st, e);
    st->n_violations_total++;
    if (st->n_violations == DREY_STATUS_MAX_VIOLATIONS)
        return;
    drey_field_violation *v = &st->violations[st->n_violations++];
    v->error = e;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->field, sizeof v->field, fmt, ap);
    va_end(ap);
}

static Google__Protobuf__Any *pack_any(drey_arena *a, const char *type, const ProtobufCMessage *m) {
    Google__Protobuf__Any *any = drey_arena_alloc(a, sizeof *any);
    google__protobuf__any__init(any);
    any->type_url = drey_arena_sprintf(a, "type.googleapis.com/%s", type);
    any->value.len = protobuf_c_message_get_packed_size(m);
    any->value.data = drey_arena_alloc(a, any->value.len);
    protobuf_c_message_pack(m, any->value.data);
    return any;
}

void drey_status_encode(const drey_status *st, drey_arena *a, uint8_t **out, size_t *out_len) {
    const drey_error_info *info = drey_error_lookup(st->error);
    Google__Protobuf__Any *details[4];
    size_t n_details = 0;

    Google__Rpc__ErrorInfo ei = GOOGLE__RPC__ERROR_INFO__INIT;
    ei.reason = (char *)info->reason;
    ei.domain = DREY_ERROR_DOMAIN;
    Google__Rpc__ErrorInfo__MetadataEntry entries[DREY_STATUS_MAX_METADATA];
    Google__Rpc__ErrorInfo__MetadataEntry *entry_ptrs[DREY_STATUS_MAX_METADATA];
    for (size_t i = 0; i < st->n_metadata; i++) {
        google__rpc__error_info__metadata_entry__init(&entries[i]);
        entries[i].key = (char *)st->metadata[i].key;
        entries[i].value = (char *)st->metadata[i].value;
        entry_ptrs[i] = &entries[i];
    }
    ei.n_metadata = st->n_metadata;
    ei.metadata = entry_ptrs;
    details[n_details++] = pack_any(a, "google.rpc.ErrorInfo", &ei.base);

    if (st->n_violations > 0) {
        Google__Rpc__BadRequest br = GOOGLE__RPC__BAD_REQUEST__INIT;
        Google__Rpc__BadRequest__FieldViolation fv[DREY_STATUS_MAX_VIOLATIONS];
        Google__Rpc__BadRequest__FieldViolation *fv_ptrs[DREY_STATUS_MAX_VIOLATIONS];
        for (size_t i = 0; i < st->n_violations; i++) {
            const drey_error_info *vi = drey_error_lookup(st->violations[i].error);
            google__rpc__bad_request__field_violation__init(&fv[i]);
            fv[i].field = (char *)st->violations[i].field;
            fv[i].description = (char *)vi->message;
            fv[i].reason = (char *)vi->reason;
            fv_ptrs[i] = &fv[i];
        }
        br.n_field_violations = st->n_violations;
        br.field_violations = fv_ptrs;
        details[n_details++] = pack_any(a, "google.rpc.BadRequest", &br.base);
    }

    Google__Rpc__QuotaFailure qf = GOOGLE__RPC__QUOTA_FAILURE__INIT;
    Google__Rpc__QuotaFailure__Violation qv = GOOGLE__RPC__QUOTA_FAILURE__VIOLATION__INIT;
    Google__Rpc__QuotaFailure__Violation *qv_ptr = &qv;
    if (st->quota_subject[0] != '\0') {
        qv.subject = (char *)st->quota_subject;
        qv.description = (char *)(st->quota_description != NULL ? st->quota_description : info->message);
        qf.n_violations = 1;
        qf.violations = &qv_ptr;
        details[n_details++] = pack_any(a, "google.rpc.QuotaFailure", &qf.base);
    }

    Google__Protobuf__Duration delay = GOOGLE__PROTOBUF__DURATION__INIT;
    Google__Rpc__RetryInfo ri = GOOGLE__RPC__RETRY_INFO__INIT;
    if (st->retry_delay_ms >= 0) {
        delay.seconds = st->retry_delay_ms / 1000;
        delay.nanos = (int32_t)(st->retry_delay_ms % 1000) * 1000000;
        ri.retry_delay = &delay;
        details[n_details++] = pack_any(a, "google.rpc.RetryInfo", &ri.base);
    }

    Google__Rpc__Status s = GOOGLE__RPC__STATUS__INIT;
    s.code = (int32_t)info->code;
    s.message = (char *)drey_status_message(st);
    s.n_details = n_details;
    s.details = details;
    *out_len = protobuf_c_message_get_packed_size(&s.base);
    *out = drey_arena_alloc(a, *out_len);
    protobuf_c_message_pack(&s.base, *out);
}

int64_t drey_status_retry_delay_ms(const uint8_t *details, size_t len) {
    static const char suffix[] = "/google.rpc.RetryInfo";
    const size_t n = sizeof suffix - 1;
    Google__Rpc__Status *s = google__rpc__status__unpack(NULL, len, details);
    if (s == NULL)
        return -1;
    int64_t ms = -1;
    for (size_t i = 0; i < s->n_details && ms < 0; i++) {
        const Google__Protobuf__Any *any = s->details[i];
        size_t tl = any->type_url != NULL ? strlen(any->type_url) : 0;
        if (tl < n || strcmp(any->type_url + tl - n, suffix) != 0)
            continue;
        Google__Rpc__RetryInfo *ri = google__rpc__retry_info__unpack(NULL, any->value.len, any->value.data);
        if (ri != NULL && ri->retry_delay != NULL && ri->retry_delay->seconds >= 0 && ri->retry_delay->nanos >= 0 &&
            ri->retry_delay->seconds < INT64_MAX / 1000 - 1)
            ms = ri->retry_delay->seconds * 1000 + (ri->retry_delay->nanos + 999999) / 1000000;
        if (ri != NULL)
            google__rpc__retry_info__free_unpacked(ri, NULL);
    }
    google__rpc__status__free_unpacked(s, NULL);
    return ms;
}
