/*
 * commit — the persisted form of failed outcomes; see outcome.h.
 *
 * A failure after the marker:
 *   FAILED:    u8 len, reason (the catalogue's ErrorInfo.reason)
 *   FAILED_V0: u16 drey_error ordinal, little-endian
 * then, in both, u8 n, n x (u8 len, key, u8 len, value) of ErrorInfo metadata.
 */
#include "outcome.h"

#include <stdio.h>
#include <string.h>

/* What each drey_error ordinal meant when FAILED_V0 outcomes were written
 * (the enum as of commit 5497eff). Frozen: never edit it to follow the enum;
 * tests/unit/commit/outcome_test.c holds it fixed. */
static const char *const v0_reasons[] = {
    NULL, /* DREY_ERR_NONE: never a failure */
    "MALFORMED_REQUEST",
    "INVALID_CACHE_NAME",
    "INVALID_KEY",
    "INVALID_VALUE",
    "PAYLOAD_TOO_LARGE",
    "BATCH_TOO_LARGE",
    "DUPLICATE_KEY",
    "INVALID_EXPIRATION",
    "INVALID_REQUEST_ID",
    "VERSION_MISMATCH",
    "NOT_AN_INTEGER",
    "INTEGER_OVERFLOW",
    "UNKNOWN_METHOD",
    "UNKNOWN_SERVICE",
    "DEADLINE_EXCEEDED",
    "CANCELLED",
    "IDEMPOTENCY_KEY_REUSED",
    "JOURNAL_WRITE_FAILED",
    "RECOVERING",
    "EPHEMERAL_NODE",
    "SNAPSHOT_FAILED",
    "TOKEN_MISSING",
    "TOKEN_MALFORMED",
    "TOKEN_TOO_LARGE",
    "TOKEN_ALGORITHM",
    "TOKEN_UNKNOWN_KEY",
    "TOKEN_BAD_SIGNATURE",
    "TOKEN_EXPIRED",
    "TOKEN_NOT_YET_VALID",
    "TOKEN_WRONG_ISSUER",
    "TOKEN_WRONG_AUDIENCE",
    "TOKEN_INVALID",
    "NODE_RATE_LIMIT",
    "PRINCIPAL_RATE_LIMIT",
    "PRINCIPAL_CONCURRENCY_LIMIT",
    "QUEUE_FULL",
    "QUEUE_TIMEOUT",
    "MEMORY_PRESSURE",
    "JOURNAL_DISK_QUOTA",
    "INTERNAL",
};

const char *drey_commit__v0_reason(unsigned e) {
    return e < sizeof v0_reasons / sizeof v0_reasons[0] ? v0_reasons[e] : NULL;
}

size_t drey_commit__failure_bytes(const drey_status *st) {
    size_t len = 1 + 1 + strlen(drey_error_lookup(st->error)->reason) + 1;
    for (size_t i = 0; i < st->n_metadata; i++)
        len += 2 + strlen(st->metadata[i].key) + strlen(st->metadata[i].value);
    return len;
}

uint8_t *drey_commit__failure_put(const drey_status *st, uint8_t *p) {
    const char *reason = drey_error_lookup(st->error)->reason;
    size_t rl = strlen(reason);
    *p++ = DREY_COMMIT__FAILED;
    *p++ = (uint8_t)rl;
    memcpy(p, reason, rl);
    p += rl;
    *p++ = (uint8_t)st->n_metadata;
    for (size_t i = 0; i < st->n_metadata; i++) {
        size_t kl = strlen(st->metadata[i].key), vl = strlen(st->metadata[i].value);
        *p++ = (uint8_t)kl;
        memcpy(p, st->metadata[i].key, kl);
        p += kl;
        *p++ = (uint8_t)vl;
        memcpy(p, st->metadata[i].value, vl);
        p += vl;
    }
    return p;
}

static void get_metadata(const uint8_t *p, const uint8_t *end, drey_arena *a, drey_status *st) {
    if (p >= end)
        return;
    size_t n = *p++;
    for (size_t i = 0; i < n && end - p >= 2; i++) {
        size_t kl = p[0];
        if ((size_t)(end - p) < 2 + kl)
            break;
        const char *key = (const char *)p + 1;
        size_t vl = p[1 + kl];
        if ((size_t)(end - p) < 2 + kl + vl)
            break;
        /* Metadata keys are static strings in the catalogue's callers;
         * keep this one alive in the arena. */
        drey_status_add_metadata(st, drey_arena_strndup(a, key, kl), "%.*s", (int)vl, (const char *)p + 2 + kl);
        p += 2 + kl + vl;
    }
}

void drey_commit__failure_get(const uint8_t *p, size_t len, drey_arena *a, drey_status *st) {
    const uint8_t *end = p + len;
    drey_error e;
    if (len >= 2 && p[0] == DREY_COMMIT__FAILED && (size_t)(end - p) >= 2 + (size_t)p[1]) {
        const char *reason = (const char *)p + 2;
        size_t rl = p[1];
        if (!drey_error_from_reason(reason, rl, &e)) {
            /* Written by a newer binary, or damaged: say so, never guess. */
            drey_status_set(st, DREY_ERR_INTERNAL);
            drey_status_add_metadata(st, "storedReason", "%.*s", (int)rl, reason);
            return;
        }
        drey_status_set(st, e);
        get_metadata(p + 2 + rl, end, a, st);
        return;
    }
    if (len >= 3 && p[0] == DREY_COMMIT__FAILED_V0) {
        unsigned ordinal = (unsigned)p[1] | (unsigned)p[2] << 8;
        const char *reason = drey_commit__v0_reason(ordinal);
        if (reason == NULL || !drey_error_from_reason(reason, strlen(reason), &e)) {
            /* An ordinal past the frozen table, or a reason since retired. */
            drey_status_set(st, DREY_ERR_INTERNAL);
            drey_status_add_metadata(st, "storedError", "%u", ordinal);
            if (reason != NULL)
                drey_status_add_metadata(st, "storedReason", "%s", reason);
            return;
        }
        drey_status_set(st, e);
        get_metadata(p + 3, end, a, st);
        return;
    }
    drey_status_set(st, DREY_ERR_INTERNAL);
}
