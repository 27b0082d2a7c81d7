/*
 * backup — what this node takes from the partitions' primaries, and what
 * it refuses; see backup.h for the rule.
 *
 * Each peer method the cluster serves between nodes (DREY_ROUTE_PEER) has
 * a row below: the route row hands the request here with the table it
 * routes with. A record taken sets the partition's sequence before it is
 * journaled (under a compare-and-swap, so two records racing for one
 * sequence cannot both be taken); once applied it raises `applied` and the
 * time the copy was last known current (what a stale read may miss). A
 * record that fails after it was taken is a gap: the sequence is marked
 * broken and nothing after it applies until a fresh copy.
 */
#include "backup.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "drey/clock.h"
#include "drey/internal/v1/move.pb-c.h"
#include "drey/partition.h"
#include "internal.h"
#include "partition.h"

/* --- the rules -------------------------------------------------------------------- */

drey_error drey_cluster__take_record(const drey_cluster__holding *h, int64_t epoch, uint64_t seq, uint64_t last) {
    bool current = h->sender_is_primary && h->in_sync;
    if (epoch < h->epoch && !current)
        return DREY_ERR_STALE_EPOCH;
    if (epoch == h->epoch && !current)
        return DREY_ERR_NOT_REPLICA;
    if (last == DREY_CLUSTER_SEQ_BROKEN || seq != last + 1)
        return DREY_ERR_OUT_OF_SEQUENCE;
    return DREY_ERR_NONE;
}

drey_error drey_cluster__take_import(const drey_cluster__holding *h, int64_t epoch) {
    if (h->primary)
        return DREY_ERR_PARTITION_OWNED;
    if (h->in_sync)
        return DREY_ERR_IN_SYNC_COPY;
    if (epoch > h->epoch)
        return DREY_ERR_NOT_CAUGHT_UP;
    if (epoch < h->epoch)
        return DREY_ERR_STALE_EPOCH;
    if (!h->copy_target || !h->sender_is_primary)
        return DREY_ERR_COPY_NOT_PLANNED;
    return DREY_ERR_NONE;
}

drey_error drey_cluster__take_confirm(const drey_cluster__holding *h, int64_t epoch, uint64_t seq, uint64_t applied,
                                      bool broken) {
    if (epoch > h->epoch)
        return DREY_ERR_NOT_CAUGHT_UP;
    if (epoch < h->epoch)
        return DREY_ERR_STALE_EPOCH;
    if (!h->in_sync || !h->sender_is_primary)
        return DREY_ERR_NOT_REPLICA;
    if (broken)
        return DREY_ERR_OUT_OF_SEQUENCE;
    if (applied < seq)
        return DREY_ERR_NOT_CAUGHT_UP;
    return DREY_ERR_NONE;
}

drey_error drey_cluster__take_drop(const drey_cluster__holding *h) {
    if (h->primary)
        return DREY_ERR_PARTITION_OWNED;
    if (h->in_sync)
        return DREY_ERR_IN_SYNC_COPY;
    if (h->copy_target)
        return DREY_ERR_STALE_EPOCH; /* the partition came back to this node since */
    return DREY_ERR_NONE;
}

bool drey_cluster__beat_grants(const drey_cluster__holding *h, int64_t epoch) {
    return h->sender_is_primary && h->in_sync && epoch >= h->epoch;
}

bool drey_cluster__beat_marks_current(const drey_cluster__holding *h, int64_t epoch, uint64_t seq, uint64_t applied,
                                      bool broken) {
    return h->sender_is_primary && h->in_sync && epoch >= h->epoch && !broken && applied >= seq;
}

/* --- this node's table ------------------------------------------------------------- */

static drey_cluster__holding holding(const drey_cluster__topology *t, uint32_t p, const char *sender) {
    const drey_cluster__part *pt = &t->parts[p];
    return (drey_cluster__holding){
        .epoch = pt->epoch,
        .primary = t->self >= 0 && pt->primary == t->self,
        .in_sync = drey_cluster__in_sync(t, p, t->self),
        .copy_target = drey_cluster__copy_target(t, p, t->self),
        .sender_is_primary = pt->primary >= 0 && sender != NULL && strcmp(t->nodes[pt->primary].id, sender) == 0,
    };
}

static drey_stage_result refuse(drey_request *r, drey_error e, uint32_t p, const drey_cluster__topology *t,
                                _Atomic uint64_t *count) {
    atomic_fetch_add(count, 1);
    r->status = drey_status_new(r->arena, e);
    drey_status_add_metadata(r->status, "partition", "%u", p);
    if (p < t->n_parts)
        drey_status_add_metadata(r->status, "epoch", "%lld", (long long)t->parts[p].epoch);
    return DREY_STAGE_REJECT;
}

/* The partition a peer request names, checked against the table. */
static bool known(const drey_cluster__topology *t, uint32_t p, uint32_t partitions) {
    return p < t->n_parts && partitions == t->n_parts;
}

/* --- the rows ------------------------------------------------------------------------ */

typedef struct taken {
    drey_partition_take take;
    drey_cluster *c;
    drey_request *r;
    uint32_t partition;
    uint64_t seq;
    int64_t received_ns;
} taken;

/* A record that applied makes this copy current as of its arrival: the
 * primary acknowledges a write only once every copy has it, and this copy
 * takes records in order, so every write acknowledged before this one came
 * is here. */
static void record_done(void *arg) {
    taken *k = arg;
    drey_cluster__partition *ps = &k->c->partitions[k->partition];
    if (k->r->failed) {
        atomic_store(&ps->seq, DREY_CLUSTER_SEQ_BROKEN);
        return;
    }
    drey_cluster__raise(&ps->applied, k->seq);
    drey_cluster__raise_i64(&ps->current_ns, k->received_ns);
}

static void record_answered(void *arg, const ProtobufCMessage *answer, int err) {
    taken *k = arg;
    if (answer != NULL)
        drey_request_reply(k->r, answer);
    else
        drey_request_fail(k->r, drey_pipeline_journal_refusal(k->r, err, k->take.len));
}

/* Taken in sequence, the record goes to the replica (partition.h), which
 * journals and applies it: it was validated and admitted at its primary,
 * so the chain's later stages (idempotency, quotas, memory, the journal's
 * ordering) do not run for it here. */
static drey_stage_result take_record(drey_cluster *c, drey_request *r, const drey_cluster__topology *t) {
    const Drey__Internal__V1__ReplicateRequest *req = (const void *)r->msg;
    uint32_t p = req->partition;
    if (!known(t, p, req->partitions))
        return refuse(r, DREY_ERR_MALFORMED_REQUEST, p, t, &c->backup.records_refused);
    drey_cluster__holding h = holding(t, p, r->forwarded_by);
    uint64_t last = atomic_load(&c->partitions[p].seq);
    drey_error e = drey_cluster__take_record(&h, req->epoch, req->sequence, last);
    if (e == DREY_ERR_NONE && !atomic_compare_exchange_strong(&c->partitions[p].seq, &last, req->sequence))
        e = DREY_ERR_OUT_OF_SEQUENCE;
    if (e != DREY_ERR_NONE) {
        refuse(r, e, p, t, &c->backup.records_refused);
        if (e == DREY_ERR_OUT_OF_SEQUENCE)
            drey_status_add_metadata(r->status, "expected", "%llu", (unsigned long long)last + 1);
        return DREY_STAGE_REJECT;
    }
    atomic_fetch_add(&c->backup.records_taken, 1);
    taken *k = drey_arena_alloc(r->arena, sizeof *k);
    *k = (taken){
        .take = {.record = req->record.data, .len = req->record.len, .time_ms = req->time_ms, .arena = r->arena,
                 .done = record_answered, .arg = k},
        .c = c,
        .r = r,
        .partition = p,
        .seq = req->sequence,
        .received_ns = drey_mono_ns(),
    };
    /* Taken: from here a record that fails leaves a gap (record_done). */
    r->on_release = record_done;
    r->release_arg = k;
    int rc = drey_partition_replica_take(c->opts.replica, &k->take);
    if (rc == 0)
        return DREY_STAGE_PARKED; /* answered by record_answered, maybe already: r is not ours now */
    r->status = rc == -EINVAL ? drey_status_new(r->arena, DREY_ERR_MALFORMED_REQUEST)
                              : drey_pipeline_journal_refusal(r, rc, req->record.len);
    drey_status_add_metadata(r->status, "partition", "%u", p);
    return DREY_STAGE_REJECT;
}

/* Each mark of a primary's heartbeat: a lease granted (noted, so that
 * this node waits it out if it is promoted), and a copy here made current;
 * a mark from a primary this table does not know yet is passed over (the
 * next beat will do). The marks not granted get epoch 0, so that the
 * method's answer (this node's room, replica.c) lists only the granted. */
static drey_stage_result take_beat(drey_cluster *c, drey_request *r, const drey_cluster__topology *t) {
    Drey__Internal__V1__BeatRequest *req = (Drey__Internal__V1__BeatRequest *)r->msg;
    int64_t now = drey_mono_ns();
    uint64_t grantee = drey_cluster__node_hash(r->forwarded_by);
    for (size_t i = 0; i < req->n_marks; i++) {
        Drey__Internal__V1__BeatRequest__Mark *m = req->marks[i];
        if (req->partitions != t->n_parts || m->partition >= t->n_parts) {
            m->epoch = 0;
            continue;
        }
        drey_cluster__partition *ps = &c->partitions[m->partition];
        drey_cluster__holding h = holding(t, m->partition, r->forwarded_by);
        if (!drey_cluster__beat_grants(&h, m->epoch)) {
            m->epoch = 0;
            continue;
        }
        pthread_mutex_lock(&ps->mu);
        ps->grant = (drey_cluster__grant){.at_ns = now, .epoch = m->epoch, .to = grantee};
        atomic_store(&ps->granted_ns, now);
        pthread_mutex_unlock(&ps->mu);
        if (drey_cluster__beat_marks_current(&h, m->epoch, m->sequence, atomic_load(&ps->applied),
                                             atomic_load(&ps->seq) == DREY_CLUSTER_SEQ_BROKEN))
            drey_cluster__raise_i64(&ps->current_ns, now);
    }
    return DREY_STAGE_NEXT;
}

static drey_stage_result take_import(drey_cluster *c, drey_request *r, const drey_cluster__topology *t) {
    const Drey__Internal__V1__ImportRequest *imp = (const void *)r->msg;
    uint32_t p = imp->partition;
    if (!known(t, p, imp->partitions))
        return refuse(r, DREY_ERR_MALFORMED_REQUEST, p, t, &c->backup.copies_refused);
    drey_cluster__holding h = holding(t, p, r->forwarded_by);
    drey_error e = drey_cluster__take_import(&h, imp->epoch);
    if (e != DREY_ERR_NONE)
        return refuse(r, e, p, t, &c->backup.copies_refused);
    if (imp->last) {
        atomic_store(&c->partitions[p].seq, imp->sequence); /* the primary's next record follows it */
        atomic_store(&c->partitions[p].applied, imp->sequence);
    }
    return DREY_STAGE_NEXT;
}

static drey_stage_result take_confirm(drey_cluster *c, drey_request *r, const drey_cluster__topology *t) {
    const Drey__Internal__V1__ConfirmRequest *req = (const void *)r->msg;
    uint32_t p = req->partition;
    if (!known(t, p, req->partitions))
        return refuse(r, DREY_ERR_MALFORMED_REQUEST, p, t, &c->backup.copies_refused);
    drey_cluster__partition *ps = &c->partitions[p];
    if (req->release) {
        /* The sender leads it no more after req->epoch (a handover's flip,
         * move.c, or it is leaving, replicate.c). */
        pthread_mutex_lock(&ps->mu);
        if (drey_cluster__release_voids(&ps->grant, drey_cluster__node_hash(r->forwarded_by), req->epoch)) {
            ps->grant.at_ns = 0;
            atomic_store(&ps->granted_ns, 0);
        }
        pthread_mutex_unlock(&ps->mu);
        Drey__Internal__V1__ConfirmResponse *resp = drey_arena_alloc(r->arena, sizeof *resp);
        drey__internal__v1__confirm_response__init(resp);
        drey_request_reply(r, &resp->base);
        return DREY_STAGE_ANSWERED;
    }
    uint64_t applied = atomic_load(&ps->applied);
    drey_cluster__holding h = holding(t, p, r->forwarded_by);
    drey_error e = drey_cluster__take_confirm(&h, req->epoch, req->sequence, applied,
                                              atomic_load(&ps->seq) == DREY_CLUSTER_SEQ_BROKEN);
    if (e != DREY_ERR_NONE)
        return refuse(r, e, p, t, &c->backup.copies_refused);
    Drey__Internal__V1__ConfirmResponse *resp = drey_arena_alloc(r->arena, sizeof *resp);
    drey__internal__v1__confirm_response__init(resp);
    resp->applied = applied;
    drey_request_reply(r, &resp->base);
    return DREY_STAGE_ANSWERED;
}

static drey_stage_result take_drop(drey_cluster *c, drey_request *r, const drey_cluster__topology *t) {
    const Drey__Internal__V1__DropRequest *req = (const void *)r->msg;
    uint32_t p = req->partition;
    if (!known(t, p, req->partitions))
        return refuse(r, DREY_ERR_MALFORMED_REQUEST, p, t, &c->backup.copies_refused);
    drey_cluster__holding h = holding(t, p, r->forwarded_by);
    drey_error e = drey_cluster__take_drop(&h);
    return e == DREY_ERR_NONE ? DREY_STAGE_NEXT : refuse(r, e, p, t, &c->backup.copies_refused);
}

static const struct {
    const char *path;
    drey_stage_result (*take)(drey_cluster *c, drey_request *r, const drey_cluster__topology *t);
} rows[] = {
    {DREY_REPLICA_APPLY_PATH, take_record},   {DREY_REPLICA_BEAT_PATH, take_beat},
    {DREY_REPLICA_CONFIRM_PATH, take_confirm}, {DREY_PARTITION_IMPORT_PATH, take_import},
    {DREY_PARTITION_DROP_PATH, take_drop},
};

drey_stage_result drey_cluster__backup_take(drey_cluster *c, drey_request *r, const drey_cluster__topology *t) {
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (strcmp(r->method->path, rows[i].path) == 0)
            return rows[i].take(c, r, t);
    }
    return DREY_STAGE_NEXT; /* Hash: a read of what this node holds */
}
