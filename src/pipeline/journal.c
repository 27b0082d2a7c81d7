/*
 * journal — the idempotency and journal stages: answer a retry from its
 * outcome, or make the write durable before it is applied.
 *
 * A retry whose first attempt already has an outcome is answered from it and
 * goes no further (commit applies under the request_id's lock and checks
 * again, so two attempts racing past this stage still apply once).
 * Otherwise the write is given its versions, encoded as a journal record
 * and appended; the chain is parked and resumed on the journal's writer thread
 * once the record is durable, at the record's time, so the write is applied
 * (and becomes visible) only after it can no longer be lost. An ephemeral
 * node has no journal: the write goes straight on.
 *
 * An append that would cross the journal's disk quota is refused here,
 * before it is queued: RESOURCE_EXHAUSTED JOURNAL_DISK_QUOTA, with no record
 * written, nothing applied, no outcome remembered. The client may treat it
 * as definitive for that attempt. So is one that finds the journal's queue
 * full (JOURNAL_QUEUE_FULL): the queue is bounded in records and bytes so
 * that no pattern of callers can make it hold unbounded memory.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>

#include "drey/clock.h"
#include "stages.h"

/* A refused append may retry once a snapshot and compaction freed segments:
 * seconds, not milliseconds. */
#define QUOTA_RETRY_MS 1000

static void on_durable(void *arg, const drey_journal_record *rec, int err) {
    drey_request *r = arg;
    if (err != 0) {
        drey_status *st = drey_pipeline_journal_refusal(r, err, r->entry.len); /* rec: NULL */
        drey_metrics *m = drey_pipeline__options(r->pipeline)->metrics;
        if (m != NULL)
            drey_metrics_observe_rejection(m, "journal", drey_error_lookup(st->error)->reason);
        drey_request_fail(r, st);
        return;
    }
    r->now_ms = rec->time_ms;
    drey_pipeline_resume(r);
}

drey_stage_result drey_pipeline__idempotency(drey_pipeline *p, drey_request *r) {
    drey_status *st = drey_arena_alloc(r->arena, sizeof *st);
    drey_status_init(st);
    drey_apply ax = {.now_ms = drey_wall_ms(), .arena = r->arena, .status = st};
    ProtobufCMessage *resp;
    if (drey_commit_lookup(drey_pipeline__commit(p), &r->write, &ax, &resp) == DREY_COMMIT_NEW)
        return DREY_STAGE_NEXT;
    if (resp != NULL)
        drey_request_reply(r, resp);
    else
        drey_request_fail(r, st);
    return DREY_STAGE_ANSWERED;
}

static void quota_failure(drey_pipeline *p, drey_status *st, const char *description) {
    snprintf(st->quota_subject, sizeof st->quota_subject, "node:%s", drey_pipeline__options(p)->node_id);
    st->quota_description = description;
    st->retry_delay_ms = QUOTA_RETRY_MS;
}

/* Orders the write: reserves its versions, completes its record and
 * queues it, all under the pipeline's order lock. Why one lock around the
 * three: the journal applies records in LSN order (queue order), so
 * versions taken in that same order make two writes to one key apply with
 * increasing versions, live, on replay and on any replica that applies the
 * records in order; reserving outside the lock would let a later version
 * reach the queue first. Whatever else must follow that order (a
 * replication sequence, queueing to backups) belongs in here too. Keep it
 * small, every durable write passes through it: the record is encoded
 * before, only its first_version is appended inside. Returns
 * drey_journal_append's result; a refused append gives its versions back. */
static int order_and_append(drey_pipeline *p, drey_journal *j, drey_request *r, size_t *len,
                            drey_stage_result *replicated) {
    uint8_t *payload;
    drey_commit_encode_unordered(&r->write, r->arena, &payload, len);
    r->entry.payload = payload;
    r->entry.done = on_durable;
    r->entry.arg = r;
    drey_commit *c = drey_pipeline__commit(p);
    const drey_replicator *rep = drey_pipeline__replicator(p);
    *replicated = DREY_STAGE_NEXT;
    pthread_mutex_t *order = drey_pipeline__order_lock(p);
    pthread_mutex_lock(order);
    drey_commit_reserve_versions(c, &r->write);
    r->entry.len = *len + drey_commit_encode_order(&r->write, payload + *len);
    int rc = 0;
    if (rep != NULL) {
        /* Backups apply the record at the primary's time: it is chosen
         * here, with the order, not when a batch is written. */
        r->entry.time_ms = drey_pipeline__order_time(p);
        *replicated = rep->prepare(rep->ctx, r);
    }
    /* Once appended, a write the replicator does not hold may be answered
     * (and r freed) on the journal's thread at any moment: below, r is read
     * only when the append was refused or the replicator holds it. */
    *len = r->entry.len;
    if (*replicated == DREY_STAGE_REJECT)
        rc = -ECANCELED;
    else if (j != NULL)
        rc = drey_journal_append(j, &r->entry);
    else if (*replicated == DREY_STAGE_NEXT)
        rc = -ENOENT; /* nothing to order it with: applied as it comes */
    if (rc != 0) /* refused: no record, so no version either */
        drey_commit_unreserve_versions(c, &r->write);
    uint32_t due = *replicated == DREY_STAGE_PARKED ? rep->appended(rep->ctx, r, rc) : 0;
    pthread_mutex_unlock(order);
    if (due != 0)
        rep->released(rep->ctx, due);
    return rc;
}

drey_stage_result drey_pipeline__journal(drey_pipeline *p, drey_request *r) {
    drey_journal *j = drey_pipeline__journal_of(p);
    if (j == NULL && drey_pipeline__replicator(p) == NULL)
        return DREY_STAGE_NEXT; /* ephemeral: applied now, versions from the counter */
    size_t len;
    drey_stage_result replicated;
    int rc = order_and_append(p, j, r, &len, &replicated);
    if (replicated == DREY_STAGE_REJECT)
        return DREY_STAGE_REJECT; /* r->status: the replicator's */
    if (rc == -ENOENT)
        return DREY_STAGE_NEXT; /* ephemeral and not replicated */
    if (rc == 0)
        return DREY_STAGE_PARKED;
    drey_pipeline_journal_refusal(r, rc, len); /* before it reached the journal: no record, no trace */
    return DREY_STAGE_REJECT;
}

drey_status *drey_pipeline_journal_refusal(drey_request *r, int rc, size_t len) {
    drey_pipeline *p = r->pipeline;
    drey_journal *j = drey_pipeline__journal_of(p);
    drey_journal_stats js;
    drey_status *st;
    switch (rc) {
    case -EDQUOT:
        drey_journal_get_stats(j, &js);
        st = drey_pipeline__status(r, DREY_ERR_JOURNAL_DISK_QUOTA);
        drey_status_add_metadata(st, "usedBytes", "%llu", (unsigned long long)js.disk_bytes);
        drey_status_add_metadata(st, "maxBytes", "%llu", (unsigned long long)js.quota_max_bytes);
        drey_status_add_metadata(st, "highWaterBytes", "%llu", (unsigned long long)js.quota_high_water_bytes);
        drey_status_add_metadata(st, "requestBytes", "%zu", len);
        quota_failure(p, st, "the journal's segments would grow past --journal-max-bytes");
        break;
    case -ENOBUFS:
        drey_journal_get_stats(j, &js);
        st = drey_pipeline__status(r, DREY_ERR_JOURNAL_QUEUE_FULL);
        drey_status_add_metadata(st, "queuedRecords", "%llu", (unsigned long long)js.queued_records);
        drey_status_add_metadata(st, "queuedBytes", "%llu", (unsigned long long)js.queued_bytes);
        drey_status_add_metadata(st, "requestBytes", "%zu", len);
        quota_failure(p, st, "the journal's queue is full (--journal-max-queued, --journal-max-queued-bytes)");
        /* Waiting for the disk, not for space: a batch or two. */
        st->retry_delay_ms = 10;
        break;
    default:
        st = drey_pipeline__status(r, DREY_ERR_JOURNAL_WRITE_FAILED);
        drey_status_add_metadata(st, "errno", "%d", -rc);
        break;
    }
    return st;
}
