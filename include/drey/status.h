/*
 * status — drey's error model: a gRPC status code plus google.rpc.Status.
 *
 * Every non-OK call carries `grpc-status-details-bin` = google.rpc.Status with
 * an ErrorInfo {reason, domain "drey.dev", metadata} from the catalogue below,
 * a BadRequest with field violations for INVALID_ARGUMENT, and QuotaFailure +
 * RetryInfo for quotas. Messages are fixed sentences from the catalogue: they
 * never echo what the caller sent.
 */
#ifndef DREY_STATUS_H
#define DREY_STATUS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <grpc/status.h>

#include "drey/arena.h"

#define DREY_ERROR_DOMAIN "drey.dev"

/* The catalogue: one row per reason in src/status/status.c (code, reason,
 * message). The README's error table is generated from it. */
typedef enum drey_error {
    DREY_ERR_NONE = 0,
    DREY_ERR_MALFORMED_REQUEST,
    DREY_ERR_INVALID_CACHE_NAME,
    DREY_ERR_INVALID_KEY,
    DREY_ERR_INVALID_VALUE,
    DREY_ERR_PAYLOAD_TOO_LARGE,
    DREY_ERR_BATCH_TOO_LARGE,
    DREY_ERR_DUPLICATE_KEY,
    DREY_ERR_INVALID_EXPIRATION,
    DREY_ERR_INVALID_REQUEST_ID,
    DREY_ERR_VERSION_MISMATCH,
    DREY_ERR_NOT_AN_INTEGER,
    DREY_ERR_INTEGER_OVERFLOW,
    DREY_ERR_UNKNOWN_METHOD,
    DREY_ERR_UNKNOWN_SERVICE,
    DREY_ERR_DEADLINE_EXCEEDED,
    DREY_ERR_CANCELLED,
    DREY_ERR_IDEMPOTENCY_KEY_REUSED,
    DREY_ERR_JOURNAL_WRITE_FAILED,
    DREY_ERR_RECOVERING,
    DREY_ERR_EPHEMERAL_NODE,
    DREY_ERR_SNAPSHOT_FAILED,
    /* Identity (UNAUTHENTICATED). */
    DREY_ERR_TOKEN_MISSING,
    DREY_ERR_TOKEN_MALFORMED,
    DREY_ERR_TOKEN_TOO_LARGE,
    DREY_ERR_TOKEN_ALGORITHM,
    DREY_ERR_TOKEN_UNKNOWN_KEY,
    DREY_ERR_TOKEN_BAD_SIGNATURE,
    DREY_ERR_TOKEN_EXPIRED,
    DREY_ERR_TOKEN_NOT_YET_VALID,
    DREY_ERR_TOKEN_WRONG_ISSUER,
    DREY_ERR_TOKEN_WRONG_AUDIENCE,
    DREY_ERR_TOKEN_INVALID,
    /* Admission (RESOURCE_EXHAUSTED). */
    DREY_ERR_NODE_RATE_LIMIT,
    DREY_ERR_PRINCIPAL_RATE_LIMIT,
    DREY_ERR_PRINCIPAL_CONCURRENCY_LIMIT,
    DREY_ERR_QUEUE_FULL,
    DREY_ERR_QUEUE_TIMEOUT,
    DREY_ERR_MEMORY_PRESSURE,
    DREY_ERR_JOURNAL_DISK_QUOTA,
    DREY_ERR_JOURNAL_QUEUE_FULL,
    DREY_ERR_TOO_MANY_CACHES,
    /* Cluster. */
    DREY_ERR_CROSS_PARTITION,
    DREY_ERR_NOT_PRIMARY,
    DREY_ERR_PARTITION_UNAVAILABLE,
    DREY_ERR_FORWARDING_NOT_ALLOWED,
    DREY_ERR_PEER_UNAUTHENTICATED,
    DREY_ERR_INTERNAL,
    /* New errors go last: remembered outcomes store the number. */
    DREY_ERR_INVALID_CURSOR,
    DREY_ERR_PARTITION_OWNED,
    DREY_ERR_PARTITION_MOVING,
    DREY_ERR_PRINCIPAL_WATCH_LIMIT,
    DREY_ERR_NODE_WATCH_LIMIT,
    DREY_ERR_LEASE_EXPIRED,
    DREY_ERR_NOT_ENOUGH_REPLICAS,
    DREY_ERR_STALE_EPOCH,
    DREY_ERR_OUT_OF_SEQUENCE,
    DREY_ERR_NOT_REPLICA,
    DREY_ERR_IN_SYNC_COPY,
    DREY_ERR_COPY_NOT_PLANNED,
    DREY_ERR_NOT_CAUGHT_UP,
    DREY_ERR_NOT_PERMITTED,
    DREY_ERR_TENANT_MEMORY_QUOTA,
    DREY_ERR_CLEAR_INCOMPLETE,
    DREY_ERR_COUNT_
} drey_error;

typedef struct drey_error_info {
    drey_error error;
    grpc_status_code code;
    const char *reason;  /* ErrorInfo.reason, UPPER_SNAKE_CASE */
    const char *message; /* the status message */
} drey_error_info;

const drey_error_info *drey_error_lookup(drey_error e);
/* The error whose reason is reason[0..len); false for none. Reasons are the
 * catalogue's stable names: what is persisted is a reason, never an ordinal
 * (a row added to the enum renumbers everything after it). */
bool drey_error_from_reason(const char *reason, size_t len, drey_error *out);
/* "INVALID_ARGUMENT" for GRPC_STATUS_INVALID_ARGUMENT, and so on. */
const char *drey_status_code_name(grpc_status_code code);
/* The whole catalogue, for the README and its test. */
const drey_error_info *drey_error_catalogue(size_t *n);

#define DREY_STATUS_MAX_METADATA 8
#define DREY_STATUS_MAX_VIOLATIONS 16

typedef struct drey_status_metadata {
    const char *key;  /* camelCase with unit, e.g. limitBytes; static */
    char value[48];
} drey_status_metadata;

typedef struct drey_field_violation {
    char field[80];          /* path, e.g. entries[3].key */
    drey_error error;        /* its description and reason */
} drey_field_violation;

typedef struct drey_status {
    drey_error error;                     /* DREY_ERR_NONE: OK */
    const char *message;                  /* NULL: the catalogue's message */
    size_t n_metadata;
    drey_status_metadata metadata[DREY_STATUS_MAX_METADATA];
    size_t n_violations;                  /* recorded (at most the max) */
    size_t n_violations_total;            /* found, for the message */
    drey_field_violation violations[DREY_STATUS_MAX_VIOLATIONS];
    char quota_subject[128];              /* QuotaFailure subject; "" = none */
    const char *quota_description;
    int64_t retry_delay_ms;               /* RetryInfo; < 0 = none */
} drey_status;

void drey_status_init(drey_status *st);
/* A status of e and nothing more (init, then set): the error paths that
 * add no detail. */
drey_status drey_status_of(drey_error e);
/* The same in the arena (a request's refusal, which outlives the stage). */
drey_status *drey_status_new(drey_arena *a, drey_error e);
static inline bool drey_status_ok(const drey_status *st) {
    return st->error == DREY_ERR_NONE;
}
grpc_status_code drey_status_code(const drey_status *st);
const char *drey_status_message(const drey_status *st);

/* Sets the error if none is set yet (the first failure explains the call). */
void drey_status_set(drey_status *st, drey_error e);
void drey_status_add_metadata(drey_status *st, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Records a field violation; the first one also becomes the status error. */
void drey_status_add_violation(drey_status *st, drey_error e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Serializes google.rpc.Status into arena memory. */
void drey_status_encode(const drey_status *st, drey_arena *arena, uint8_t **out, size_t *out_len);
/* The RetryInfo delay in a serialized google.rpc.Status (another node's
 * answer), in milliseconds rounded up; -1 when it has none or does not
 * decode. */
int64_t drey_status_retry_delay_ms(const uint8_t *details, size_t len);

#endif
