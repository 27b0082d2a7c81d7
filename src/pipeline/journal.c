/*
 * journal — stage 5: make a write durable before it is applied.
 *
 * A retry whose first attempt already has an outcome is answered from it and
 * goes no further. Otherwise the write is encoded as a journal record and
 * appended; the chain is parked and resumed on the journal's writer thread
 * once the record is durable, at the record's time, so the write is applied
 * (and becomes visible) only after it can no longer be lost. An ephemeral
 * node has no journal: the write goes straight on.
 *
 * An append that would cross the journal's disk quota is refused here,
 * before it is queued: RESOURCE_EXHAUSTED JOURNAL_DISK_QUOTA, with no record
 * written, nothing applied, no outcome remembered. The client may treat it
 * as definitive for that attempt.
 */
#include <errno.h>
#include <stdio.h>

#include "drey/clock.h"
#include "stages.h"

/* A refused append may retry once a snapshot and compaction freed segments:
 * seconds, not milliseconds. */
#define QUOTA_RETRY_MS 1000

static void on_durable(void *arg, const drey_journal_record *rec, int err) {
    drey_request *r = arg;
    if (err != 0) {
        drey_status *st = drey_pipeline__status(r, DREY_ERR_JOURNAL_WRITE_FAILED);
        drey_status_add_metadata(st, "errno", "%d", -err);
        drey_metrics *m = drey_pipeline__options(r->pipeline)->metrics;
        if (m != NULL)
            drey_metrics_observe_rejection(m, "journal", drey_error_lookup(st->error)->reason);
        drey_call_fail(r->call, st);
        return;
    }
    r->now_ms = rec->time_ms;
    drey_pipeline_resume(r);
}

drey_stage_result drey_pipeline__journal(drey_pipeline *p, drey_request *r) {
    drey_arena *a = drey_call_arena(r->call);
    drey_status *st = drey_arena_alloc(a, sizeof *st);
    drey_status_init(st);
    drey_apply ax = {.now_ms = drey_wall_ms(), .arena = a, .status = st};
    ProtobufCMessage *resp;
    if (drey_commit_lookup(drey_pipeline__commit(p), &r->write, &ax, &resp) == DREY_COMMIT_ANSWERED) {
        if (resp != NULL)
            drey_call_reply(r->call, resp);
        else
            drey_call_fail(r->call, st);
        return DREY_STAGE_ANSWERED;
    }
    drey_journal *j = drey_pipeline__journal_of(p);
    if (j == NULL)
        return DREY_STAGE_NEXT;
    uint8_t *payload;
    size_t len;
    drey_commit_encode(&r->write, a, &payload, &len);
    r->entry.payload = payload;
    r->entry.len = len;
    r->entry.done = on_durable;
    r->entry.arg = r;
    int rc = drey_journal_append(j, &r->entry);
    if (rc == 0)
        return DREY_STAGE_PARKED;
    /* Refused before it reached the journal: no record, no trace. */
    if (rc != -EDQUOT) {
        drey_status_add_metadata(drey_pipeline__status(r, DREY_ERR_JOURNAL_WRITE_FAILED), "errno", "%d", -rc);
        return DREY_STAGE_REJECT;
    }
    drey_journal_stats js;
    drey_journal_get_stats(j, &js);
    st = drey_pipeline__status(r, DREY_ERR_JOURNAL_DISK_QUOTA);
    drey_status_add_metadata(st, "usedBytes", "%llu", (unsigned long long)js.disk_bytes);
    drey_status_add_metadata(st, "maxBytes", "%llu", (unsigned long long)js.quota_max_bytes);
    drey_status_add_metadata(st, "highWaterBytes", "%llu", (unsigned long long)js.quota_high_water_bytes);
    drey_status_add_metadata(st, "requestBytes", "%zu", len);
    snprintf(st->quota_subject, sizeof st->quota_subject, "node:%s", drey_pipeline__options(p)->node_id);
    st->quota_description = "the journal's segments would grow past --journal-max-bytes";
    st->retry_delay_ms = QUOTA_RETRY_MS;
    return DREY_STAGE_REJECT;
}
