/*
 * replicate — a partition's writes on its in-sync backups before they are
 * answered, and the backups' side of it.
 *
 * The primary. The chain orders a write (its versions, its time, its
 * journal record) under one lock; inside it this row gives the record the
 * partition's next sequence number, queues it in the partition's line and,
 * once the local append is queued, sends it to every in-sync backup the
 * table names (drey.internal.v1.Replica/Apply, a frame on the stream to
 * that node: the records of every partition to one node share one stream,
 * and frames queued while one is written go together). A write completes
 * when its record is durable here and acknowledged by every backup it was
 * sent to; writes complete in the partition's sequence, each applied and
 * answered in turn, so every copy applies the same writes in the same order
 * with the same versions.
 *
 * A backup that refuses a record, or does not answer within
 * --replication-timeout, is taken out of the in-sync set by the primary
 * itself (one etcd write compared on the epoch), and the writes waiting for
 * it complete without it; the controller later gives the partition a new
 * backup. A primary that cannot write etcd cannot shrink the set: its
 * writes wait, and their callers' deadlines pass (commit unknown, resolved
 * by retrying with the same request_id). This is the primary's to do, not
 * the controller's: only it knows which acknowledgements are missing, and
 * the compared write keeps a deposed primary from changing anything.
 *
 * The backup (router.c) takes a record only in sequence and only from the
 * primary of an epoch no older than the one it knows; it journals and
 * applies it like any write, in arrival order (Apply is never parked).
 *
 * Heartbeats: every BEAT_NS a primary tells each node that backs some of
 * its partitions the last write it acknowledged in each (Replica/Beat, on
 * the same stream as the records). A backup that has it knows how stale it
 * can be (router.c: stale reads report it), and the answer carries the
 * node's room, so a primary hears a backup's room while no write goes. A
 * beat not answered within --replication-timeout takes the backup out of
 * the set as a record's would: an idle partition learns it lost a backup
 * before its next write has to wait for it.
 *
 * Fencing: a primary takes writes and serves reads only while its lease is
 * valid by its own monotonic clock (the last renewal etcd confirmed, from
 * the time it was sent, plus the TTL, less a margin): the controller can
 * name another primary only after etcd expired the lease, which is later.
 * A write whose lease lapsed while it waited for its backups is still
 * applied (every copy has it) but answered UNAVAILABLE: its outcome is
 * unknown to the caller, as a timeout's would be. One still waiting when
 * this node learns it was deposed is answered so without being applied
 * here: this copy is replaced before it serves again.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/internal/v1/move.pb-c.h"
#include "drey/log.h"
#include "drey/partition.h"
#include "internal.h"
#include "partition.h"
#include "peers.h"
#include "primary.h"
#include "room.h"
#include "table.h"

#define BEAT_NS 250000000LL
/* How long a leaving node waits for its backups to hear it released them. */
#define RELEASE_MS 1000

/* One write in its partition's line. Not in the request's arena: an
 * acknowledgement may come after the write was answered (abandoned at a
 * stop), so the line, the sender and each backup's call hold a reference. */
typedef struct drey_cluster__rec {
    struct drey_cluster__rec *next;
    _Atomic int refs;
    drey_cluster *c;
    drey_request *r;
    uint32_t partition;
    uint64_t seq;
    int64_t epoch;
    bool sent;      /* every backup has its call: it may complete */
    bool local_done;
    bool unknown;   /* this node stopped leading the partition meanwhile */
    int local_err;
    uint8_t n_backups;
    uint8_t n_durable; /* backups that acknowledged it (not dropped ones) */
    bool acked[DREY_CLUSTER_MAX_REPLICAS];
    char backups[DREY_CLUSTER_MAX_REPLICAS][DREY_CLUSTER_MAX_ID];
    char address[DREY_CLUSTER_MAX_REPLICAS][DREY_CLUSTER_MAX_ID];
    drey_cluster__pcall *calls[DREY_CLUSTER_MAX_REPLICAS];
    uint8_t index[DREY_CLUSTER_MAX_REPLICAS]; /* each call's arg: &index[i] */
    drey_cluster__room *room[DREY_CLUSTER_MAX_REPLICAS];
    int64_t sent_ns;
    uint64_t journal_need; /* what the record takes of each backup's room */
    int64_t memory_need;
    int64_t time_ms;
} drey_cluster__rec;

/* --- the backups' room ------------------------------------------------------------ */

static drey_cluster__room *room_of(drey_cluster *c, const char *id) {
    size_t n = atomic_load(&c->primary.n_rooms);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(c->primary.rooms[i].id, id) == 0)
            return &c->primary.rooms[i];
    }
    pthread_mutex_lock(&c->primary.rooms_mu);
    drey_cluster__room *r = NULL;
    n = atomic_load(&c->primary.n_rooms);
    for (size_t i = 0; i < n && r == NULL; i++) {
        if (strcmp(c->primary.rooms[i].id, id) == 0)
            r = &c->primary.rooms[i];
    }
    if (r == NULL && n < DREY_CLUSTER_MAX_ROOMS) {
        r = &c->primary.rooms[n];
        snprintf(r->id, sizeof r->id, "%s", id);
        atomic_store(&r->journal, UINT64_MAX);
        atomic_store(&r->memory, INT64_MAX);
        r->grant_until_ns = drey_xcalloc(c->n_parts ? c->n_parts : 1, sizeof *r->grant_until_ns);
        atomic_store(&c->primary.n_rooms, n + 1); /* published once filled */
    }
    pthread_mutex_unlock(&c->primary.rooms_mu);
    return r;
}

/* --- whether this node may serve what it leads ----------------------------------------------- */

static int64_t lease_ns(const drey_cluster *c) {
    return c->opts.lease_ttl_s * 1000000000LL;
}

bool drey_cluster__may_serve(drey_cluster *c, const drey_cluster__topology *t, uint32_t p, int64_t *wait_ns) {
    *wait_ns = 0;
    if (atomic_load(&c->primary.released))
        return false;
    int64_t now = drey_mono_ns();
    const drey_cluster__part *part = &t->parts[p];
    const drey_cluster__partition *ps = &c->partitions[p];
    int64_t from = drey_cluster__serve_from(atomic_load(&ps->granted_ns), lease_ns(c), c->lease_margin_ns);
    if (now < from) {
        *wait_ns = from - now; /* promoted: the old primary may still hold this node's grant */
        return false;
    }
    /* A node that lost its lease and registered again may have been
     * replaced meanwhile: it leads nothing until its table says whether. */
    int64_t registered = atomic_load(&c->registered_revision);
    if (drey_cluster__may_lead_at(drey_cluster__lease_valid(c), t->revision, registered))
        return true;
    if (t->revision < registered)
        return false;
    int64_t until[DREY_CLUSTER_MAX_REPLICAS];
    for (uint8_t i = 0; i < part->n_replicas; i++) {
        drey_cluster__room *r = room_of(c, t->nodes[part->replicas[i]].id);
        until[i] = r != NULL ? atomic_load(&r->grant_until_ns[p]) : 0;
    }
    return drey_cluster__backups_grant(until, part->n_replicas, now);
}

static bool still_serves(drey_cluster *c, uint32_t p) {
    drey_cluster__topology *t = drey_cluster__acquire(c);
    int64_t wait_ns;
    bool ok = t->self >= 0 && t->parts[p].primary == t->self && drey_cluster__may_serve(c, t, p, &wait_ns);
    drey_cluster__topology_unref(t);
    return ok;
}

/* --- leaving ------------------------------------------------------------------------------------ */

typedef struct releasing {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    size_t pending;
} releasing;

static void released(void *arg, const drey_answer *a) {
    (void)a; /* a backup not told waits its grant out: slower, as safe */
    releasing *w = arg;
    pthread_mutex_lock(&w->mu);
    if (--w->pending == 0)
        pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->mu);
}

void drey_cluster__release_leases(drey_cluster *c) {
    atomic_store(&c->primary.released, true);
    drey_cluster__topology *t = drey_cluster__acquire(c);
    releasing w = {.pending = 1};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cond, NULL);
    drey_cluster__header h = {DREY_FORWARDED_BY, c->opts.node_id, strlen(c->opts.node_id)};
    int64_t deadline = drey_mono_ns() + RELEASE_MS * 1000000LL;
    for (uint32_t p = 0; t->self >= 0 && p < t->n_parts; p++) {
        const drey_cluster__part *part = &t->parts[p];
        for (uint8_t i = 0; part->primary == t->self && i < part->n_replicas; i++) {
            const drey_cluster__node *n = &t->nodes[part->replicas[i]];
            Drey__Internal__V1__ConfirmRequest req = DREY__INTERNAL__V1__CONFIRM_REQUEST__INIT;
            req.partition = p;
            req.partitions = t->n_parts;
            req.epoch = part->epoch;
            req.release = true;
            uint8_t buf[64];
            size_t len = drey__internal__v1__confirm_request__pack(&req, buf);
            pthread_mutex_lock(&w.mu);
            w.pending++;
            pthread_mutex_unlock(&w.mu);
            drey_cluster__pcall_release(drey_cluster__peers_call(c->peers, n->id, n->internal,
                                                                 DREY_REPLICA_CONFIRM_PATH, buf, len, &h, 1, deadline,
                                                                 released, &w));
        }
    }
    drey_cluster__topology_unref(t);
    released(&w, NULL); /* the loop's own count */
    pthread_mutex_lock(&w.mu);
    while (w.pending > 0)
        pthread_cond_wait(&w.cond, &w.mu); /* every call ends by its deadline */
    pthread_mutex_unlock(&w.mu);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cond);
}

/* The rules (room.h) take numbers read at one moment. No room (more
 * backups than DREY_CLUSTER_MAX_ROOMS): never heard, so never refused. */
static drey_cluster__room_seen room_seen(const drey_cluster__room *room) {
    if (room == NULL)
        return (drey_cluster__room_seen){.journal = UINT64_MAX, .memory = INT64_MAX, .since_heard_ns = INT64_MAX};
    return (drey_cluster__room_seen){
        .journal = atomic_load(&room->journal),
        .sent_journal = atomic_load(&room->sent_journal),
        .memory = atomic_load(&room->memory),
        .sent_memory = atomic_load(&room->sent_memory),
        .since_heard_ns = drey_mono_ns() - atomic_load(&room->heard_ns),
    };
}

static void room_heard(drey_cluster__room *room, const uint8_t *response, size_t len) {
    Drey__Internal__V1__ReplicateResponse *resp = drey__internal__v1__replicate_response__unpack(NULL, len, response);
    if (resp == NULL)
        return;
    atomic_store(&room->journal, resp->journal_room_bytes);
    atomic_store(&room->memory, resp->memory_room_bytes);
    atomic_store(&room->heard_ns, drey_mono_ns());
    drey__internal__v1__replicate_response__free_unpacked(resp, NULL);
}

static void room_sent(drey_cluster__rec *rec, uint8_t i, int sign) {
    drey_cluster__room *room = rec->room[i];
    if (room == NULL)
        return;
    if (sign > 0) {
        atomic_fetch_add(&room->sent_journal, rec->journal_need);
        atomic_fetch_add(&room->sent_memory, rec->memory_need);
    } else {
        atomic_fetch_sub(&room->sent_journal, rec->journal_need);
        atomic_fetch_sub(&room->sent_memory, rec->memory_need);
    }
}

static void rec_unref(drey_cluster__rec *rec) {
    if (atomic_fetch_sub(&rec->refs, 1) != 1)
        return;
    for (uint8_t i = 0; i < rec->n_backups; i++) {
        if (rec->calls[i] != NULL)
            drey_cluster__pcall_release(rec->calls[i]);
    }
    free(rec);
}

static drey_cluster__rec *rec_of_index(uint8_t *index) {
    return (drey_cluster__rec *)((char *)(index - *index) - offsetof(drey_cluster__rec, index));
}

uint32_t drey_cluster_replication_factor(const drey_cluster *c) {
    return c->rf;
}

static bool complete(const drey_cluster__rec *rec) {
    if (!rec->sent || !rec->local_done)
        return false;
    for (uint8_t i = 0; i < rec->n_backups; i++) {
        if (!rec->acked[i])
            return false;
    }
    return true;
}

/* Applies and answers the complete writes at the head of p's line, in
 * order. One thread at a time drains a line (`draining`); the others only
 * mark their record (under the line's lock, which the drainer takes before
 * it looks at the head again) and leave, so applies never run concurrently
 * or out of order, and none runs under the line's lock. */
static void drain(drey_cluster *c, uint32_t p) {
    drey_cluster__line *ln = &c->partitions[p].line;
    pthread_mutex_lock(&ln->mu);
    if (ln->draining) {
        pthread_mutex_unlock(&ln->mu);
        return;
    }
    ln->draining = true;
    for (;;) {
        drey_cluster__rec *rec = ln->head;
        if (rec == NULL || !complete(rec))
            break;
        ln->head = rec->next;
        if (ln->head == NULL)
            ln->tail = NULL;
        ln->queued--;
        pthread_mutex_unlock(&ln->mu);
        drey_request *r = rec->r;
        if (rec->unknown) {
            /* This node no longer leads the partition (or stops): not
             * applied here. Its copy is replaced by a fresh one before it
             * serves the partition again, and applying now could land on
             * top of that copy (a cut primary hearing of its successor as
             * the copy to it begins). Whether the others have it is for a
             * retry with the request_id to find out. */
            drey_status *st = drey_status_new(r->arena, DREY_ERR_LEASE_EXPIRED);
            drey_status_add_metadata(st, "outcome", "unknown");
            drey_request_fail(r, st);
        } else if (rec->local_err != 0 && rec->n_durable == 0) {
            /* No copy has it durable (a dropped backup's copy is replaced): refused. */
            drey_status *st = drey_status_new(r->arena, DREY_ERR_JOURNAL_WRITE_FAILED);
            drey_status_add_metadata(st, "errno", "%d", -rec->local_err);
            drey_request_fail(r, st);
        } else {
            r->now_ms = rec->time_ms;
            /* Applied: every copy that has the record applies it (also
             * here when this node's own journal failed it: the backups
             * applied it, and the copies must not differ). Answered as of
             * unknown outcome then, when the lease lapsed meanwhile (the
             * partition may be another's soon), or when backups were
             * dropped and fewer copies than --min-in-sync have it. */
            if (rec->local_err != 0)
                r->answer_unknown = DREY_ERR_JOURNAL_WRITE_FAILED;
            else if (!drey_cluster__lease_valid(c) && !still_serves(c, p))
                r->answer_unknown = DREY_ERR_LEASE_EXPIRED;
            else if ((uint32_t)1 + rec->n_durable < c->opts.min_in_sync)
                r->answer_unknown = DREY_ERR_NOT_ENOUGH_REPLICAS;
            drey_pipeline_resume(r);
        }
        atomic_store(&c->partitions[p].applied, rec->seq);
        rec_unref(rec);
        pthread_mutex_lock(&ln->mu);
    }
    ln->draining = false;
    pthread_mutex_unlock(&ln->mu);
}

/* Marks every record of p's line (all backups done, or its outcome
 * unknown) and drains it. */
static void settle(drey_cluster *c, uint32_t p, const char *backup, bool unknown) {
    drey_cluster__line *ln = &c->partitions[p].line;
    pthread_mutex_lock(&ln->mu);
    for (drey_cluster__rec *rec = ln->head; rec != NULL; rec = rec->next) {
        for (uint8_t i = 0; i < rec->n_backups; i++) {
            if (backup == NULL || strcmp(rec->backups[i], backup) == 0)
                rec->acked[i] = true;
        }
        rec->unknown |= unknown;
    }
    pthread_mutex_unlock(&ln->mu);
    drain(c, p);
}

size_t drey_cluster__pending_writes(drey_cluster *c) {
    size_t n = 0;
    for (uint32_t p = 0; c->partitions != NULL && p < c->n_parts; p++) {
        drey_cluster__line *ln = &c->partitions[p].line;
        pthread_mutex_lock(&ln->mu);
        n += ln->queued;
        pthread_mutex_unlock(&ln->mu);
    }
    return n;
}

void drey_cluster__abandon_lines(drey_cluster *c) {
    for (uint32_t p = 0; c->partitions != NULL && p < c->n_parts; p++)
        settle(c, p, NULL, true);
}

static void local_durable(void *arg, const drey_journal_record *jr, int err) {
    (void)jr;
    drey_cluster__rec *rec = arg;
    drey_cluster__line *ln = &rec->c->partitions[rec->partition].line;
    pthread_mutex_lock(&ln->mu);
    rec->local_done = true;
    rec->local_err = err;
    pthread_mutex_unlock(&ln->mu);
    drain(rec->c, rec->partition);
}

/* Why a backup's answer (not OK) takes it out of a set: the transport's or
 * the backup's words, cut after a whole word; and whether it said it is
 * still starting (a member whose chain is not serving yet). */
static void failure_of(const drey_answer *a, const char *what, char *why, size_t cap, bool *starting) {
    char msg[150], reason[64];
    drey_log_clip(msg, sizeof msg, a->message != NULL ? a->message : "", a->message != NULL ? a->message_len : 0);
    snprintf(why, cap, "%s%s (code %d)", what, msg, a->code);
    drey_cluster__answer_reason(a, reason, sizeof reason);
    *starting = strcmp(reason, "RECOVERING") == 0;
}

/* Asks the replication thread to take a backup out of p's in-sync set. */
static void request_shrink(drey_cluster *c, uint32_t p, const char *backup, int64_t epoch, const char *why,
                           bool starting) {
    drey_cluster__shrink *s = drey_xcalloc(1, sizeof *s);
    s->partition = p;
    s->epoch = epoch;
    s->starting = starting;
    snprintf(s->backup, sizeof s->backup, "%s", backup);
    snprintf(s->why, sizeof s->why, "%s", why);
    pthread_mutex_lock(&c->primary.shrink_mu);
    s->next = c->primary.shrinks;
    c->primary.shrinks = s;
    pthread_cond_broadcast(&c->primary.shrink_cond); /* the beater waits on it too: a signal could wake only that */
    pthread_mutex_unlock(&c->primary.shrink_mu);
}

static void acked(void *arg, const drey_answer *a) {
    uint8_t *index = arg;
    drey_cluster__rec *rec = rec_of_index(index);
    drey_cluster *c = rec->c;
    drey_cluster__line *ln = &c->partitions[rec->partition].line;
    room_sent(rec, *index, -1);
    if (a->code == 0) {
        if (rec->room[*index] != NULL)
            room_heard(rec->room[*index], a->response, a->response_len);
        pthread_mutex_lock(&ln->mu);
        rec->acked[*index] = true;
        rec->n_durable++;
        pthread_mutex_unlock(&ln->mu);
        atomic_fetch_add(&c->primary.replicated, 1);
        if (c->opts.metrics != NULL)
            drey_metrics_observe_replica_ack(c->opts.metrics, (drey_mono_ns() - rec->sent_ns) / 1000);
        drain(c, rec->partition);
    } else {
        /* The record waits until the backup is out of the set. */
        char why[200];
        bool starting;
        failure_of(a, "", why, sizeof why, &starting);
        atomic_fetch_add(&c->primary.replica_failures, 1);
        request_shrink(c, rec->partition, rec->backups[*index], rec->epoch, why, starting);
    }
    rec_unref(rec);
}

/* --- the chain's rows ---------------------------------------------------------- */

static drey_stage_result refuse(drey_request *r, drey_error e, uint32_t p) {
    r->status = drey_status_new(r->arena, e);
    drey_status_add_metadata(r->status, "partition", "%u", p);
    r->status->retry_delay_ms = 200;
    return DREY_STAGE_REJECT;
}

drey_stage_result drey_cluster_replicate_prepare(void *cluster, drey_request *r) {
    drey_cluster *c = cluster;
    if (r->route_note == NULL)
        return DREY_STAGE_NEXT; /* not a partition's write (a peer's Import, a Clear's share) */
    uint32_t p = drey_cluster__held_partition(r);
    drey_cluster__topology *t = drey_cluster__acquire(c);
    drey_cluster__part *part = &t->parts[p];
    drey_stage_result res;
    if (part->primary < 0 || part->primary != t->self) {
        res = refuse(r, DREY_ERR_NOT_PRIMARY, p);
        goto out;
    }
    int64_t wait_ns;
    if (!drey_cluster__may_serve(c, t, p, &wait_ns)) {
        res = refuse(r, DREY_ERR_LEASE_EXPIRED, p);
        goto out;
    }
    if ((uint32_t)1 + part->n_replicas < c->opts.min_in_sync) {
        res = refuse(r, DREY_ERR_NOT_ENOUGH_REPLICAS, p);
        drey_status_add_metadata(r->status, "inSync", "%u", 1u + part->n_replicas);
        drey_status_add_metadata(r->status, "minInSync", "%u", c->opts.min_in_sync);
        goto out;
    }
    /* What the backups journal: this record marked a copy, in a frame. */
    uint64_t journal_need = ((uint64_t)r->entry.len + DREY_COMMIT_COPY_ROOM + 40 + 7) & ~(uint64_t)7;
    int64_t memory_need = r->growth > 0 ? r->growth : 0; /* net of what it evicts: every copy evicts it */
    drey_cluster__room *rooms[DREY_CLUSTER_MAX_REPLICAS] = {0};
    for (uint8_t i = 0; i < part->n_replicas; i++) {
        const char *id = t->nodes[part->replicas[i]].id;
        rooms[i] = room_of(c, id);
        uint64_t have = 0;
        drey_cluster__room_seen seen = room_seen(rooms[i]);
        drey_error e = drey_cluster__room_verdict(&seen, journal_need, memory_need, &have);
        if (e != DREY_ERR_NONE) {
            /* Definitive, as the primary's own quota would be: nothing was
             * journaled or sent anywhere. */
            res = refuse(r, e, p);
            snprintf(r->status->quota_subject, sizeof r->status->quota_subject, "node:%s", id);
            r->status->quota_description = e == DREY_ERR_JOURNAL_DISK_QUOTA
                                               ? "a backup of the partition has no room for the write in its journal"
                                               : "a backup of the partition has no room for the write in memory";
            drey_status_add_metadata(r->status, "backup", "%s", id);
            drey_status_add_metadata(r->status, "roomBytes", "%llu", (unsigned long long)have);
            drey_status_add_metadata(r->status, "requestBytes", "%llu",
                                     (unsigned long long)(e == DREY_ERR_JOURNAL_DISK_QUOTA ? journal_need
                                                                                           : (uint64_t)memory_need));
            r->status->retry_delay_ms = 1000;
            goto out;
        }
    }
    drey_cluster__rec *rec = drey_xcalloc(1, sizeof *rec);
    atomic_store(&rec->refs, 2 + part->n_replicas); /* the line, the sender, each call */
    rec->journal_need = journal_need;
    rec->memory_need = memory_need;
    rec->c = c;
    rec->r = r;
    rec->partition = p;
    rec->epoch = part->epoch;
    rec->time_ms = r->entry.time_ms;
    for (uint8_t i = 0; i < part->n_replicas; i++) {
        const drey_cluster__node *n = &t->nodes[part->replicas[i]];
        snprintf(rec->backups[i], DREY_CLUSTER_MAX_ID, "%s", n->id);
        snprintf(rec->address[i], DREY_CLUSTER_MAX_ID, "%s", n->internal);
        rec->index[i] = i;
        rec->room[i] = rooms[i];
    }
    rec->n_backups = part->n_replicas;
    rec->seq = atomic_fetch_add(&c->partitions[p].seq, 1) + 1;
    r->entry.done = local_durable;
    r->entry.arg = rec;
    drey_cluster__line *ln = &c->partitions[p].line;
    pthread_mutex_lock(&ln->mu);
    if (ln->tail != NULL)
        ln->tail->next = rec;
    else
        ln->head = rec;
    ln->tail = rec;
    ln->queued++;
    pthread_mutex_unlock(&ln->mu);
    r->replica_note = rec;
    res = DREY_STAGE_PARKED;
out:
    drey_cluster__topology_unref(t);
    return res;
}

int64_t drey_cluster_replicate_memory_room(void *cluster, const drey_request *r) {
    drey_cluster *c = cluster;
    if (r->route_note == NULL)
        return INT64_MAX;
    uint32_t p = drey_cluster__held_partition(r);
    drey_cluster__topology *t = drey_cluster__acquire(c);
    int64_t least = INT64_MAX;
    for (uint8_t i = 0; p < t->n_parts && i < t->parts[p].n_replicas; i++) {
        drey_cluster__room_seen seen = room_seen(room_of(c, t->nodes[t->parts[p].replicas[i]].id));
        int64_t m = drey_cluster__room_memory_left(&seen);
        least = m < least ? m : least;
    }
    drey_cluster__topology_unref(t);
    return least;
}

uint32_t drey_cluster_replicate_appended(void *cluster, drey_request *r, int rc) {
    drey_cluster *c = cluster;
    drey_cluster__rec *rec = r->replica_note;
    drey_cluster__line *ln = &c->partitions[rec->partition].line;
    if (rc != 0) {
        /* Refused before the journal: it goes nowhere, and leaves the
         * line and the sequence as they were (still under the order lock:
         * it is the last of both). */
        pthread_mutex_lock(&ln->mu);
        drey_cluster__rec **pp = &ln->head, *prev = NULL;
        while (*pp != rec) {
            prev = *pp;
            pp = &(*pp)->next;
        }
        *pp = NULL;
        ln->tail = prev;
        ln->queued--;
        pthread_mutex_unlock(&ln->mu);
        atomic_fetch_sub(&c->partitions[rec->partition].seq, 1);
        r->replica_note = NULL;
        free(rec);
        return 0;
    }
    bool journaled = drey_pipeline_journaled(r);
    uint8_t *buf = NULL;
    size_t len = 0;
    Drey__Internal__V1__ReplicateRequest req = DREY__INTERNAL__V1__REPLICATE_REQUEST__INIT;
    req.partition = rec->partition;
    req.partitions = c->n_parts;
    req.epoch = rec->epoch;
    req.sequence = rec->seq;
    req.record.data = (uint8_t *)r->entry.payload;
    req.record.len = r->entry.len;
    req.time_ms = rec->time_ms;
    if (rec->n_backups > 0) {
        len = drey__internal__v1__replicate_request__get_packed_size(&req);
        buf = drey_arena_alloc(r->arena, len ? len : 1);
        drey__internal__v1__replicate_request__pack(&req, buf);
    }
    char *epoch = drey_arena_sprintf(r->arena, "%" PRId64, rec->epoch);
    drey_cluster__header h[] = {
        {DREY_FORWARDED_BY, c->opts.node_id, strlen(c->opts.node_id)},
        {DREY_FORWARD_EPOCH, epoch, strlen(epoch)},
    };
    int64_t deadline = drey_mono_ns() + c->opts.replication_timeout_ms * 1000000LL;
    rec->sent_ns = drey_mono_ns();
    for (uint8_t i = 0; i < rec->n_backups; i++)
        room_sent(rec, i, +1);
    for (uint8_t i = 0; i < rec->n_backups; i++)
        rec->calls[i] = drey_cluster__peers_call(c->peers, rec->backups[i], rec->address[i], DREY_REPLICA_APPLY_PATH, buf,
                                                 len, h, 2, deadline, acked, &rec->index[i]);
    /* Until here nothing may complete it: its memory is the request's. */
    pthread_mutex_lock(&ln->mu);
    rec->sent = true;
    if (!journaled)
        rec->local_done = true;
    pthread_mutex_unlock(&ln->mu);
    uint32_t p = rec->partition;
    rec_unref(rec);
    return p + 1; /* its acknowledgements may all be in: drain once the order lock is let go */
}

void drey_cluster_replicate_released(void *cluster, uint32_t token) {
    drain(cluster, token - 1);
}

/* --- taking a backup out of the set ------------------------------------------------ */

/* 1: the backup is out of the set (by this write or another); 0: try again;
 * -1: this node no longer leads the partition (it was deposed after its
 * lease lapsed): its waiting writes are answered as of unknown outcome
 * (the new primary may or may not have them), not applied here (drain). */
static int shrink_once(drey_cluster *c, const drey_cluster__shrink *s) {
    drey_cluster__entry e;
    pthread_mutex_lock(&c->mu);
    drey_cluster__entry_of(c->entries[s->partition], &e);
    int64_t epoch = c->epochs[s->partition];
    pthread_mutex_unlock(&c->mu);
    if (strcmp(e.primary, c->opts.node_id) != 0)
        return -1;
    if (!drey_cluster__entry_has(e.replicas, e.n_replicas, s->backup))
        return 1;
    if (!drey_cluster__lease_valid(c))
        return 0; /* etcd may have expired it: another primary may be coming */
    drey_cluster__entry_drop_replica(&e, s->backup);
    char err[200];
    drey_cluster__cas r = drey_cluster__cas_entry(c, s->partition, epoch, &e, err, sizeof err);
    if (r == DREY_CLUSTER_CAS_APPLIED) {
        atomic_fetch_add(&c->primary.isr_shrinks, 1);
        DREY_LOG_DEBUG("a backup was taken out of a partition's in-sync set", DREY_LOG_UINT("partition", s->partition),
                       DREY_LOG_STR("backup", s->backup), DREY_LOG_STR("reason", s->why));
        return 1;
    }
    return 0;
}

/* One line per backup and burst, not one per partition: a backup that
 * stops answering is taken out of every partition this node leads with it
 * within milliseconds. A burst ends once no shrink came for TALLY_QUIET_MS. */
#define TALLY_QUIET_MS 200
#define TALLY_MAX 8

typedef struct shrink_tally {
    char backup[DREY_CLUSTER_MAX_ID];
    char why[200];      /* the first reason */
    uint32_t partitions;
    bool starting;      /* every one answered that the backup is still starting */
    int64_t first_ns, last_ns;
} shrink_tally;

static void tally_flush(shrink_tally *t, size_t *n) {
    for (size_t i = 0; i < *n; i++) {
        int64_t took_ms = (t[i].last_ns - t[i].first_ns) / 1000000;
        /* A member that registered and does not serve yet (a clean start's
         * last node): expected, and it is synced again once it serves. */
        if (t[i].starting)
            DREY_LOG_INFO("a backup still starting was taken out of the in-sync sets of partitions this node leads; "
                          "it gets them again once it serves",
                          DREY_LOG_STR("backup", t[i].backup), DREY_LOG_UINT("partitions", t[i].partitions));
        else
            DREY_LOG_WARN("a backup stopped answering: taken out of the in-sync sets of partitions this node leads",
                          DREY_LOG_STR("backup", t[i].backup), DREY_LOG_UINT("partitions", t[i].partitions),
                          DREY_LOG_INT("took_ms", took_ms), DREY_LOG_STR("reason", t[i].why));
    }
    *n = 0;
}

static void tally_add(shrink_tally *t, size_t *n, const drey_cluster__shrink *s) {
    size_t i = 0;
    while (i < *n && strcmp(t[i].backup, s->backup) != 0)
        i++;
    if (i == *n) {
        if (*n == TALLY_MAX) {
            tally_flush(t, n);
            i = 0;
        }
        t[i] = (shrink_tally){.starting = true, .first_ns = drey_mono_ns()};
        snprintf(t[i].backup, sizeof t[i].backup, "%s", s->backup);
        snprintf(t[i].why, sizeof t[i].why, "%s", s->why);
        (*n)++;
    }
    t[i].partitions++;
    t[i].last_ns = drey_mono_ns();
    t[i].starting = t[i].starting && s->starting;
}

void *drey_cluster__shrinker_main(void *arg) {
    drey_cluster *c = arg;
    shrink_tally tally[TALLY_MAX];
    size_t n_tally = 0;
    pthread_mutex_lock(&c->primary.shrink_mu);
    while (!c->primary.shrink_stop) {
        drey_cluster__shrink *s = c->primary.shrinks;
        if (s == NULL && n_tally > 0) {
            if (drey_cond_wait_until(&c->primary.shrink_cond, &c->primary.shrink_mu,
                                     drey_deadline_after_ms(TALLY_QUIET_MS)) == ETIMEDOUT &&
                c->primary.shrinks == NULL) {
                pthread_mutex_unlock(&c->primary.shrink_mu);
                tally_flush(tally, &n_tally);
                pthread_mutex_lock(&c->primary.shrink_mu);
            }
            continue;
        }
        if (s == NULL) {
            pthread_cond_wait(&c->primary.shrink_cond, &c->primary.shrink_mu);
            continue;
        }
        c->primary.shrinks = s->next;
        pthread_mutex_unlock(&c->primary.shrink_mu);
        int done;
        while ((done = shrink_once(c, s)) == 0) {
            pthread_mutex_lock(&c->primary.shrink_mu);
            bool stop = c->primary.shrink_stop;
            pthread_mutex_unlock(&c->primary.shrink_mu);
            if (stop)
                break;
            drey_nap_ms(50); /* etcd, or our table, has to move on */
        }
        if (done == 1)
            tally_add(tally, &n_tally, s);
        if (done != 0)
            settle(c, s->partition, done == 1 ? s->backup : NULL, done < 0);
        free(s);
        pthread_mutex_lock(&c->primary.shrink_mu);
    }
    pthread_mutex_unlock(&c->primary.shrink_mu);
    tally_flush(tally, &n_tally);
    return NULL;
}

/* --- heartbeats ------------------------------------------------------------------ */

/* A heartbeat in flight: what it named, to take the backup out of those
 * sets if it goes unanswered. */
typedef struct beat {
    drey_cluster *c;
    drey_cluster__room *room;
    int64_t sent_ns;
    size_t n;
    uint32_t *partitions;
    int64_t *epochs;
} beat;

/* Each partition the backup granted: its lease, from the beat's sending. */
static void beat_granted(beat *b, const uint8_t *response, size_t len) {
    drey_cluster *c = b->c;
    Drey__Internal__V1__ReplicateResponse *resp = drey__internal__v1__replicate_response__unpack(NULL, len, response);
    if (resp == NULL)
        return;
    int64_t until = drey_cluster__grant_until(b->sent_ns, lease_ns(c), c->lease_margin_ns);
    for (size_t i = 0; i < resp->n_granted; i++) {
        if (resp->granted[i] < c->n_parts)
            drey_cluster__raise_i64(&b->room->grant_until_ns[resp->granted[i]], until);
    }
    drey__internal__v1__replicate_response__free_unpacked(resp, NULL);
}

static void beat_done(void *arg, const drey_answer *a) {
    beat *b = arg;
    if (a->code == GRPC_STATUS_OK) {
        room_heard(b->room, a->response, a->response_len);
        beat_granted(b, a->response, a->response_len);
    } else if (a->code == GRPC_STATUS_DEADLINE_EXCEEDED || a->code == GRPC_STATUS_UNAVAILABLE) {
        char why[200];
        bool starting;
        failure_of(a, "no heartbeat answer: ", why, sizeof why, &starting);
        for (size_t i = 0; i < b->n; i++)
            request_shrink(b->c, b->partitions[i], b->room->id, b->epochs[i], why, starting);
    }
    atomic_store(&b->room->beating, false);
    free(b);
}

/* One heartbeat to node n of t for the partitions this node leads that n
 * backs; none while the last is unanswered. */
static void beat_node(drey_cluster *c, const drey_cluster__topology *t, int32_t n) {
    size_t k = 0;
    for (uint32_t p = 0; p < t->n_parts; p++) {
        const drey_cluster__part *part = &t->parts[p];
        for (uint8_t i = 0; part->primary == t->self && i < part->n_replicas; i++)
            k += part->replicas[i] == n;
    }
    drey_cluster__room *room = k > 0 ? room_of(c, t->nodes[n].id) : NULL;
    bool idle = false;
    if (room == NULL || !atomic_compare_exchange_strong(&room->beating, &idle, true))
        return;
    beat *b = drey_xmalloc(sizeof *b + k * (sizeof *b->partitions + sizeof *b->epochs));
    b->c = c;
    b->room = room;
    b->sent_ns = drey_mono_ns();
    b->n = k;
    b->epochs = (int64_t *)(b + 1);
    b->partitions = (uint32_t *)(b->epochs + k);
    Drey__Internal__V1__BeatRequest__Mark *marks = drey_xmalloc(k * sizeof *marks);
    Drey__Internal__V1__BeatRequest__Mark **mp = drey_xmalloc(k * sizeof *mp);
    size_t j = 0;
    for (uint32_t p = 0; p < t->n_parts; p++) {
        const drey_cluster__part *part = &t->parts[p];
        for (uint8_t i = 0; part->primary == t->self && i < part->n_replicas; i++) {
            if (part->replicas[i] != n)
                continue;
            drey__internal__v1__beat_request__mark__init(&marks[j]);
            marks[j].partition = p;
            marks[j].epoch = part->epoch;
            marks[j].sequence = atomic_load(&c->partitions[p].applied);
            mp[j] = &marks[j];
            b->partitions[j] = p;
            b->epochs[j] = part->epoch;
            j++;
        }
    }
    Drey__Internal__V1__BeatRequest req = DREY__INTERNAL__V1__BEAT_REQUEST__INIT;
    req.partitions = t->n_parts;
    req.n_marks = k;
    req.marks = mp;
    size_t len = drey__internal__v1__beat_request__get_packed_size(&req);
    uint8_t *buf = drey_xmalloc(len ? len : 1);
    drey__internal__v1__beat_request__pack(&req, buf);
    drey_cluster__header h = {DREY_FORWARDED_BY, c->opts.node_id, strlen(c->opts.node_id)};
    int64_t deadline = drey_mono_ns() + c->opts.replication_timeout_ms * 1000000LL;
    drey_cluster__pcall_release(drey_cluster__peers_call(c->peers, t->nodes[n].id, t->nodes[n].internal,
                                                         DREY_REPLICA_BEAT_PATH, buf, len, &h, 1, deadline, beat_done, b));
    free(buf);
    free(mp);
    free(marks);
}

void *drey_cluster__beater_main(void *arg) {
    drey_cluster *c = arg;
    int64_t next = drey_mono_ns();
    pthread_mutex_lock(&c->primary.shrink_mu);
    while (!c->primary.shrink_stop) {
        if (drey_mono_ns() < next) {
            drey_cond_wait_until(&c->primary.shrink_cond, &c->primary.shrink_mu, next);
            continue;
        }
        pthread_mutex_unlock(&c->primary.shrink_mu);
        /* Also while etcd is away: the backups' answers are the leases
         * that let this node go on (a backup whose table names another
         * primary grants nothing). Not with a table older than this
         * node's registration: it may name a previous life's partitions. */
        if (c->rf > 1) {
            drey_cluster__topology *t = drey_cluster__acquire(c);
            bool current = t->revision >= atomic_load(&c->registered_revision);
            for (size_t n = 0; t->self >= 0 && current && n < t->n_nodes; n++) {
                if ((int32_t)n != t->self && t->nodes[n].member && t->nodes[n].internal[0] != '\0')
                    beat_node(c, t, (int32_t)n);
            }
            drey_cluster__topology_unref(t);
        }
        next = drey_mono_ns() + BEAT_NS;
        pthread_mutex_lock(&c->primary.shrink_mu);
    }
    pthread_mutex_unlock(&c->primary.shrink_mu);
    return NULL;
}

/* --- what readiness shows ------------------------------------------------------------ */

size_t drey_cluster_get_replicas(drey_cluster *c, drey_cluster_replica *out, size_t cap) {
    drey_cluster__topology *t = drey_cluster__acquire(c);
    size_t n = 0;
    int64_t now = drey_mono_ns();
    for (uint32_t p = 0; t->self >= 0 && p < t->n_parts && n < cap; p++) {
        const drey_cluster__part *part = &t->parts[p];
        bool primary = part->primary == t->self, backup = false;
        for (uint8_t i = 0; i < part->n_replicas; i++)
            backup |= part->replicas[i] == t->self;
        if (!primary && !backup)
            continue;
        drey_cluster_replica *o = &out[n++];
        memset(o, 0, sizeof *o);
        o->partition = p;
        o->primary = primary;
        o->epoch = part->epoch;
        o->sequence = atomic_load(&c->partitions[p].applied);
        if (primary) {
            for (uint8_t i = 0; i < part->n_replicas && i < sizeof o->in_sync / sizeof o->in_sync[0]; i++)
                snprintf(o->in_sync[o->n_in_sync++], sizeof o->in_sync[0], "%s", t->nodes[part->replicas[i]].id);
            drey_cluster__line *ln = &c->partitions[p].line;
            pthread_mutex_lock(&ln->mu);
            o->pending = ln->queued;
            if (ln->head != NULL && ln->head->sent && now > ln->head->sent_ns) /* sent: sent_ns is written */
                o->lag_ms = (uint64_t)(now - ln->head->sent_ns) / 1000000;
            pthread_mutex_unlock(&ln->mu);
        } else {
            int64_t at = atomic_load(&c->partitions[p].current_ns);
            o->lag_ms = at == 0 ? UINT64_MAX : now > at ? (uint64_t)(now - at) / 1000000 : 0;
        }
    }
    drey_cluster__topology_unref(t);
    return n;
}
