/*
 * commit — applies a write: idempotent retries first, then the method's
 * state transition.
 *
 * The same function runs live (after the journal made the write durable)
 * and on replay, so a retried request_id finds the same outcome after a
 * crash as before it. Outcomes are kept in the store itself, in an internal
 * cache no client can name, expiring after the retention window: snapshots,
 * memory accounting and the expiry sweep cover them with no extra code.
 *
 * A write is identified by (principal, request_id). The principal is the
 * verified token's subject, or "" for anonymous callers, who therefore share
 * one namespace of request_ids (a retry may come on a new connection).
 */
#ifndef DREY_COMMIT_H
#define DREY_COMMIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "drey/journal.h"
#include "drey/method.h"
#include "drey/store.h"

/* The internal cache holding outcomes (its name is not a valid cache name). */
#define DREY_COMMIT_OUTCOME_CACHE "#outcomes"
/* Its keys: principal NUL request_id, and on a partitioned node NUL cache
 * SEPARATOR key, naming the write's first key. */
#define DREY_COMMIT_SCOPE_SEPARATOR '\x1f'

typedef struct drey_commit drey_commit;

typedef struct drey_commit_options {
    drey_store *store;
    const drey_method_table *methods;  /* to find a replayed record's method */
    int64_t idempotency_retention_ms;  /* how long an outcome is remembered */
    /* A cluster node: outcome keys also name the write's first key (see
     * DREY_COMMIT_SCOPE_SEPARATOR), so that an outcome lives in the write's
     * partition and moves with it. Fixed for a data directory's life. */
    bool partitioned;
} drey_commit_options;

drey_commit *drey_commit_create(const drey_commit_options *opts);
void drey_commit_destroy(drey_commit *c);

typedef struct drey_write {
    const drey_method *method;
    const ProtobufCMessage *request;
    const uint8_t *request_bytes; /* as received: the journal keeps these */
    size_t request_len;
    const char *principal;        /* idempotency scope; "" for anonymous */
    const char *request_id;       /* the request's request_id field; "" for none */
    const char *tenant;           /* whose entries it stores; "" for none */
    /* Evicted once the write has applied successfully (memory admission
     * chose them; the journal record carries them). */
    const drey_store_victim *evicted;
    size_t n_evicted;
    /* The first of the versions its apply hands out (one per key it names),
     * reserved where the write was ordered (drey_commit_reserve_versions)
     * and carried in its journal record; 0: taken from the store's counter
     * as it applies. */
    uint64_t first_version;
    /* A backup applying its primary's record (its journal record's `copy`):
     * the evictions in it are the primary's, not counted in the cache's
     * figures again. */
    bool copy;
} drey_write;

/* Fills w, taking request_id from the request's field of that name. */
void drey_commit_write_init(drey_write *w, const drey_method *m, const ProtobufCMessage *request,
                            const uint8_t *bytes, size_t len, const char *principal);

typedef enum drey_commit_known {
    DREY_COMMIT_NEW,      /* no outcome yet: journal and apply it */
    DREY_COMMIT_ANSWERED, /* a retry: *response or ax->status holds the first outcome */
} drey_commit_known;

/* Before journaling: the outcome of an earlier attempt, if there is one. A
 * request_id reused for a different request is answered with
 * IDEMPOTENCY_KEY_REUSED. */
drey_commit_known drey_commit_lookup(drey_commit *c, const drey_write *w, drey_apply *ax,
                                     ProtobufCMessage **response);

/* Applies w at ax->now_ms with w's versions (ax->next_version and
 * n_versions are set from w->first_version) (or answers it from its
 * remembered outcome) and
 * remembers the outcome when it has a request_id. NULL with ax->status set
 * when the write failed. A write applied now (not answered from an outcome)
 * that succeeded then evicts w->evicted: live and on replay alike. */
ProtobufCMessage *drey_commit_apply(drey_commit *c, const drey_write *w, drey_apply *ax);

/* The store key of w's remembered outcome (w has a request_id), in a. */
void drey_commit_outcome_key(drey_commit *c, const drey_write *w, drey_arena *a, drey_key *k);

/* What remembering w's outcome will add to the store (0 without a
 * request_id); an estimate, for memory admission. */
size_t drey_commit_outcome_bytes(const drey_commit *c, const drey_write *w);

/* Reserves w's versions (drey_apply_versions_needed of its request) from the
 * store's counter, after raising it past the versions w brings
 * (drey_method_spec.versions_brought), and sets w->first_version. The caller orders writes: it
 * reserves and journals each under one lock, so that journal order is
 * version order (src/pipeline/journal.c). */
void drey_commit_reserve_versions(drey_commit *c, drey_write *w);
/* Undoes the reservation of a write that was refused before it was queued
 * (when nothing was reserved since), and clears w->first_version. */
void drey_commit_unreserve_versions(drey_commit *c, drey_write *w);

/* The journal payload of a write (a drey.journal.v1.JournalRecord). */
void drey_commit_encode(const drey_write *w, drey_arena *a, uint8_t **out, size_t *len);

/* The same record in two steps, so that the part that depends on the
 * write's order is tiny: everything but first_version, in a buffer with
 * DREY_COMMIT_ORDER_ROOM bytes to spare, and then (once the versions are
 * reserved) first_version appended at end, the buffer's first spare byte;
 * returns the bytes appended. A field after the others is valid protobuf
 * and decodes as if it were in its place. */
#define DREY_COMMIT_ORDER_ROOM 11 /* a tag byte and a 64-bit varint */
void drey_commit_encode_unordered(const drey_write *w, drey_arena *a, uint8_t **out, size_t *len);
size_t drey_commit_encode_order(const drey_write *w, uint8_t *end);

/* The store the commit applies to. */
drey_store *drey_commit_store(const drey_commit *c);

/* Decodes a journal record into w, in a (which w then points into): -EINVAL
 * for one that names no write method of the table or does not decode. */
int drey_commit_decode(drey_commit *c, const uint8_t *payload, size_t len, drey_arena *a, drey_write *w);

/* Decodes and applies a journal record at its time, giving its keys the
 * versions it carries (first_version; 0: the store's counter); -EINVAL as
 * drey_commit_decode (recovery stops there). */
int drey_commit_replay(drey_commit *c, const drey_journal_record *rec);

/* Marks a journal record a backup's copy of its primary's: appends `copy`
 * at end, the first of DREY_COMMIT_COPY_ROOM spare bytes after the record
 * (a field after the others decodes as if it were in its place); returns
 * the bytes appended. */
#define DREY_COMMIT_COPY_ROOM 2
size_t drey_commit_mark_copy(uint8_t *end);

#endif
