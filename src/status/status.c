/*
 * status — the error catalogue and google.rpc.Status encoding; see
 * include/drey/status.h.
 */
#include "drey/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "drey/rpc.h"
#include "google/protobuf/any.pb-c.h"
#include "google/protobuf/duration.pb-c.h"
#include "google/rpc/error_details.pb-c.h"
#include "google/rpc/status.pb-c.h"

static const drey_error_info catalogue[DREY_ERR_COUNT_] = {
    [DREY_ERR_NONE] = {DREY_ERR_NONE, GRPC_STATUS_OK, "", ""},
/* Every other error's reason (ErrorInfo.reason) is its name. */
#define E(name, code, message) [DREY_ERR_##name] = {DREY_ERR_##name, GRPC_STATUS_##code, #name, message}
    E(MALFORMED_REQUEST, INVALID_ARGUMENT, "the request is not a valid protobuf message of the method's request type"),
    E(INVALID_CACHE_NAME, INVALID_ARGUMENT,
      "cache names are 1 to max-cache-name-bytes bytes of [A-Za-z0-9._-], not . or .."),
    E(INVALID_KEY, INVALID_ARGUMENT, "keys are 1 to max-key-bytes bytes of valid UTF-8 without control characters"),
    E(INVALID_VALUE, INVALID_ARGUMENT, "a value must have exactly one kind set; its strings must be UTF-8 without NUL"),
    E(PAYLOAD_TOO_LARGE, INVALID_ARGUMENT, "the value is larger than max-value-bytes"),
    E(BATCH_TOO_LARGE, INVALID_ARGUMENT, "a batch holds at most max-batch keys or entries"),
    E(DUPLICATE_KEY, INVALID_ARGUMENT, "a batch names the same key more than once"),
    E(INVALID_EXPIRATION, INVALID_ARGUMENT,
      "ttl must be positive and at most 100 years; durations and timestamps must be normalized"),
    E(INVALID_REQUEST_ID, INVALID_ARGUMENT, "request_id is at most 128 bytes"),
    E(VERSION_MISMATCH, FAILED_PRECONDITION, "the entry's version is not if_version"),
    E(NOT_AN_INTEGER, FAILED_PRECONDITION, "the value is not an int64"),
    E(INTEGER_OVERFLOW, OUT_OF_RANGE, "the result does not fit in an int64"),
    E(INVALID_CURSOR, INVALID_ARGUMENT,
      "the scan cursor is not one this node issued for this cache and prefix (or its hash seed changed since: an "
      "ephemeral node restarted); start the scan again"),
    E(UNKNOWN_METHOD, UNIMPLEMENTED, "this server does not implement the method"),
    E(UNKNOWN_SERVICE, NOT_FOUND, "the health service does not know this service name"),
    E(DEADLINE_EXCEEDED, DEADLINE_EXCEEDED, "the call's deadline passed before it could run"),
    E(CANCELLED, CANCELLED, "the client cancelled the call while it waited"),
    E(IDEMPOTENCY_KEY_REUSED, FAILED_PRECONDITION, "this request_id was already used for a different request"),
    E(JOURNAL_WRITE_FAILED, UNAVAILABLE,
      "the write could not be made durable and was not applied; retry with the same request_id"),
    E(RECOVERING, UNAVAILABLE, "the node is still recovering its data; retry shortly"),
    E(EPHEMERAL_NODE, FAILED_PRECONDITION, "the node runs with --ephemeral and keeps no data on disk"),
    E(SNAPSHOT_FAILED, INTERNAL, "the snapshot could not be written; see the node's log"),
    E(TOKEN_MISSING, UNAUTHENTICATED, "this method needs an authorization: Bearer <JWT> header"),
    E(TOKEN_MALFORMED, UNAUTHENTICATED, "the authorization header is not Bearer <header.payload.signature>"),
    E(TOKEN_TOO_LARGE, UNAUTHENTICATED, "the token is longer than the node accepts"),
    E(TOKEN_ALGORITHM, UNAUTHENTICATED,
      "the token's alg is not the algorithm configured for its key (alg none is never accepted)"),
    E(TOKEN_UNKNOWN_KEY, UNAUTHENTICATED, "no configured key has the token's kid"),
    E(TOKEN_BAD_SIGNATURE, UNAUTHENTICATED, "the token's signature does not verify"),
    E(TOKEN_EXPIRED, UNAUTHENTICATED, "the token has expired"),
    E(TOKEN_NOT_YET_VALID, UNAUTHENTICATED, "the token is not valid yet (nbf or iat in the future)"),
    E(TOKEN_WRONG_ISSUER, UNAUTHENTICATED, "the token's iss is not the configured issuer"),
    E(TOKEN_WRONG_AUDIENCE, UNAUTHENTICATED, "the token's aud does not name the configured audience"),
    E(TOKEN_INVALID, UNAUTHENTICATED, "the token's claims are unusable (exp is required)"),
    E(NODE_RATE_LIMIT, RESOURCE_EXHAUSTED, "the node's request rate limit is reached"),
    E(PRINCIPAL_RATE_LIMIT, RESOURCE_EXHAUSTED, "the caller's request rate limit is reached"),
    E(PRINCIPAL_CONCURRENCY_LIMIT, RESOURCE_EXHAUSTED, "the caller has as many calls in flight and queued as it may"),
    E(QUEUE_FULL, RESOURCE_EXHAUSTED, "the node is at its concurrency limit and its wait queue is full"),
    E(QUEUE_TIMEOUT, RESOURCE_EXHAUSTED, "the call waited in the queue for the longest time allowed"),
    E(MEMORY_PRESSURE, RESOURCE_EXHAUSTED, "the write would grow memory past the node's critical level"),
    E(JOURNAL_DISK_QUOTA, RESOURCE_EXHAUSTED,
      "the write would grow the journal past its disk quota; a snapshot and compaction free space"),
    E(TOO_MANY_CACHES, RESOURCE_EXHAUSTED, "the write would open a cache past the node's limit on caches"),
    E(PRINCIPAL_WATCH_LIMIT, RESOURCE_EXHAUSTED,
      "the caller has as many Watch streams open as it may (--principal-max-watches)"),
    E(NODE_WATCH_LIMIT, RESOURCE_EXHAUSTED, "the node has as many Watch streams open as it may (--max-watches)"),
    E(JOURNAL_QUEUE_FULL, RESOURCE_EXHAUSTED,
      "the journal's queue of writes waiting for the disk is full; retry after a short delay"),
    E(TENANT_MEMORY_QUOTA, RESOURCE_EXHAUSTED,
      "the write would take its tenant's entries past the tenant's memory quota (tenants.maxBytes)"),
    E(CROSS_PARTITION, INVALID_ARGUMENT, "the entries of an atomic batch must share a partition (use one {hash tag})"),
    E(NOT_PRIMARY, UNAVAILABLE, "this node does not own the key's partition; ErrorInfo names the owner"),
    E(PARTITION_UNAVAILABLE, UNAVAILABLE, "the node that owns the key's partition cannot be reached; retry later"),
    E(FORWARDING_NOT_ALLOWED, PERMISSION_DENIED,
      "forwarding metadata is accepted only from cluster peers on the internal listener"),
    E(PEER_UNAUTHENTICATED, UNAUTHENTICATED,
      "the internal listener serves only peers whose certificate names the node they say they are"),
    E(PARTITION_OWNED, FAILED_PRECONDITION, "this node owns the partition: an import would replace live data"),
    E(PARTITION_MOVING, UNAVAILABLE,
      "a node is moving a partition of this cache to another: retry the cache-wide call once the move is over"),
    E(CLEAR_INCOMPLETE, UNAVAILABLE,
      "the Clear reached some of the cache's partitions only (ErrorInfo's cause says why the others refused): "
      "retry it"),
    E(LEASE_EXPIRED, UNAVAILABLE,
      "neither this node's etcd lease nor its backups' leases hold (etcd and the backups unreachable, or the node "
      "paused): it neither serves nor commits its partitions until one does; a write answered so may have been "
      "applied: retry it with the same request_id"),
    E(NOT_ENOUGH_REPLICAS, UNAVAILABLE,
      "the partition has fewer in-sync copies than --min-in-sync: writes are refused until a backup has caught up"),
    E(STALE_EPOCH, FAILED_PRECONDITION,
      "the record's epoch is older than this node's table: its sender no longer leads the partition"),
    E(OUT_OF_SEQUENCE, FAILED_PRECONDITION,
      "the record does not follow the last one this node took of the partition: it needs a fresh copy"),
    E(NOT_REPLICA, FAILED_PRECONDITION,
      "this node is not an in-sync backup of the partition, or the sender not its primary"),
    E(IN_SYNC_COPY, FAILED_PRECONDITION,
      "this node holds an in-sync copy of the partition: it has every acknowledged write and a failover may promote "
      "it, so no import replaces it"),
    E(COPY_NOT_PLANNED, FAILED_PRECONDITION,
      "the partition's entry at the import's epoch does not name this node the target of a copy from the sender"),
    E(NOT_CAUGHT_UP, FAILED_PRECONDITION,
      "this backup has not applied every write of the partition up to the sequence asked (or its table is older "
      "than the epoch): ask again"),
    E(NOT_PERMITTED, PERMISSION_DENIED,
      "the caller's roles do not grant this verb on this cache and every key the request names (--authz-policy)"),
    E(INTERNAL, INTERNAL, "internal error"),
#undef E
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
    const char *name = drey_rpc_code_name(code);
    return name != NULL ? name : "UNKNOWN";
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

drey_status *drey_status_new(drey_arena *a, drey_error e) {
    drey_status *st = drey_arena_alloc(a, sizeof *st);
    drey_status_init(st);
    drey_status_set(st, e);
    return st;
}

drey_status drey_status_of(drey_error e) {
    drey_status st;
    drey_status_init(&st);
    drey_status_set(&st, e);
    return st;
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
