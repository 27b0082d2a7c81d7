/*
 * move — handing a partition this node leads to another node, or copying
 * it to a new backup, as the controller planned in its entry.
 *
 * THE RULE: a copy in the partition's in-sync set is never replaced,
 * truncated or partly overwritten. Every write the primary acknowledged is
 * on every in-sync copy, and a failover promotes one of them: a copy that
 * is being rebuilt must be out of that set (in etcd, compared on the
 * epoch) before its first chunk lands, or a failover mid-copy would
 * promote it with part of the partition. So:
 *   - the primary role goes to an in-sync backup by a handover, with no
 *     copy at all (`handover` in the entry);
 *   - a copy goes only to a node the entry names `joining` (a move) or
 *     `syncing` (a new backup), never one of `replicas`; this node refuses
 *     to start one onto a node its table names in sync, and the receiver
 *     refuses an Import while it holds an in-sync copy, or one the entry
 *     at the Import's epoch does not name it the target of (router.c);
 *   - a copy joins the in-sync set only once complete (the last chunk goes
 *     with the partition's writes paused), in one write compared on the
 *     epoch the copy was planned at.
 *
 * A move or a new backup:
 *   1. copy: walk the partition's own tables (the store keeps entries per
 *      partition, store.h) and send its entries (remembered outcomes
 *      included) to the target as Import calls of about a megabyte, the
 *      first one replacing whatever it held of the partition, at
 *      --cluster-move-rate. Writes go on meanwhile and record the keys
 *      they changed (router.c);
 *   2. catch up: send the current state of the changed keys, a few rounds
 *      while there are many;
 *   3. freeze: new writes of the partition wait, the ones running finish;
 *      the last changed keys go with this node's version counter, so
 *      versions keep increasing on the new owner;
 *   4. flip: one etcd transaction, compared on the epoch the controller
 *      planned at, names the target primary (a move) or an in-sync backup
 *      (a new backup). This node applies it to its own table at once, so
 *      the waiting writes, routed again, go where it says; the new owner,
 *      hearing of it from a forwarded call before its watch did, waits
 *      for its table;
 *   5. drop (a move): this node's copy goes in one journaled write, unless
 *      the partition came back to it meanwhile (the Drop names the epoch).
 *
 * A handover: freeze as in 3; ask the backup to confirm it applied every
 * write up to the partition's last sequence (Replica/Confirm: every write
 * was acknowledged by it before it was answered, so this is a check, not a
 * wait); flip as in 4, this node staying an in-sync backup (it has every
 * write). The pause is one round trip to the backup and one to etcd.
 *
 * Any failure before the flip (the target gone, its journal full, a
 * deadline) thaws the partition: this node is still its primary and
 * nothing was lost; the move is tried again a second later, or replanned by
 * the controller. A flip whose outcome etcd did not confirm keeps the
 * partition frozen until the entry is read back: thawing it then could let
 * two nodes take its writes.
 *
 * The pause (3 to 4) is what the writes of one partition feel: the last
 * catch-up plus one etcd round trip; it is measured and reported.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/internal/v1/move.pb-c.h"
#include "drey/journal.h"
#include "drey/log.h"
#include "drey/partition.h"
#include "drey/pipeline.h"
#include "internal.h"
#include "mover.h"
#include "partition.h"
#include "peers.h"
#include "table.h"

#define CHUNK_BYTES (1u << 20)
#define CATCH_UP_ROUNDS 4
#define CATCH_UP_KEYS 512   /* fewer changed keys than this: freeze */
#define FREEZE_DRAIN_MS 2000 /* for the running writes of a frozen partition */
#define PEER_CALL_MS 10000
#define ETCD_CALL_MS 2000
#define RETRY_MS 1000
#define CONFIRM_MS 1000

/* --- one call to the target, waited for ----------------------------------------- */

typedef struct sync_call {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool done;
    int code;
    char message[256];
    char reason[64]; /* the ErrorInfo reason, if any */
} sync_call;

static void sync_done(void *arg, const drey_answer *a) {
    sync_call *s = arg;
    pthread_mutex_lock(&s->mu);
    s->code = a->code;
    drey_log_clip(s->message, sizeof s->message, a->message != NULL ? a->message : "",
                  a->message != NULL ? a->message_len : 0);
    drey_cluster__answer_reason(a, s->reason, sizeof s->reason);
    s->done = true;
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->mu);
}

typedef enum move_kind {
    MOVE,     /* the primary role to `joining`, by a copy */
    SYNC,     /* a copy to a new backup (`syncing`); this node stays primary */
    HANDOVER, /* the primary role to an in-sync backup, without a copy */
} move_kind;

typedef struct mover {
    drey_cluster *c;
    uint32_t partition;
    move_kind kind;
    const char *target, *address;
    int64_t epoch; /* the entry's, when the move was planned */
    uint64_t entries, bytes;
    int64_t next_send_ns; /* the rate cap's schedule */
    char err[300];
} mover;

/* Calls path on the target with the packed request; 0 or the gRPC code,
 * with the reason (if any) in reason and what happened in mv->err. */
static int call_target(mover *mv, const char *path, const uint8_t *buf, size_t len, char *reason, size_t cap) {
    drey_cluster *c = mv->c;
    char epoch[24];
    snprintf(epoch, sizeof epoch, "%" PRId64, mv->epoch);
    drey_cluster__header h[] = {
        {DREY_FORWARDED_BY, c->opts.node_id, strlen(c->opts.node_id)},
        {DREY_FORWARD_EPOCH, epoch, strlen(epoch)},
    };
    sync_call s = {.done = false};
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cond, NULL);
    drey_cluster__pcall *pc = drey_cluster__peers_call(c->peers, mv->target, mv->address, path, buf, len, h, 2,
                                                       drey_mono_ns() + PEER_CALL_MS * 1000000LL, sync_done, &s);
    pthread_mutex_lock(&s.mu);
    while (!s.done)
        pthread_cond_wait(&s.cond, &s.mu); /* the call's deadline bounds it */
    pthread_mutex_unlock(&s.mu);
    drey_cluster__pcall_release(pc);
    pthread_mutex_destroy(&s.mu);
    pthread_cond_destroy(&s.cond);
    if (s.code != 0)
        snprintf(mv->err, sizeof mv->err, "%s at %s: %s (code %d)", strrchr(path, '/') + 1, mv->target,
                 s.message, s.code);
    snprintf(reason, cap, "%s", s.reason);
    return s.code;
}

static bool call_import(mover *mv, const Drey__Internal__V1__ImportRequest *req) {
    drey_cluster *c = mv->c;
    size_t len = drey__internal__v1__import_request__get_packed_size(req);
    uint8_t *buf = drey_xmalloc(len ? len : 1);
    drey__internal__v1__import_request__pack(req, buf);
    if (c->opts.move_rate > 0) {
        /* A rate cap, not a synchronisation: the copy may not take the
         * node's disk and network from its clients. */
        int64_t now = drey_mono_ns();
        if (mv->next_send_ns > now)
            drey_nap_ms((mv->next_send_ns - now) / 1000000);
        int64_t start = mv->next_send_ns > now ? mv->next_send_ns : now;
        mv->next_send_ns = start + (int64_t)((double)len * 1e9 / (double)c->opts.move_rate);
    }
    char reason[64];
    int code;
    int64_t until = drey_mono_ns() + CONFIRM_MS * 1000000LL;
    /* The target's table may not have the plan yet (its watch is a moment
     * behind this node's): it says so, and is asked again. */
    while ((code = call_target(mv, DREY_PARTITION_IMPORT_PATH, buf, len, reason, sizeof reason)) != 0 &&
           strcmp(reason, "NOT_CAUGHT_UP") == 0 && drey_mono_ns() < until)
        drey_nap_ms(2);
    free(buf);
    if (code != 0)
        return false;
    mv->entries += req->n_entries;
    mv->bytes += len;
    return true;
}

/* --- chunks ------------------------------------------------------------------------ */

typedef struct chunk {
    drey_arena arena;
    Drey__Internal__V1__MovedEntry **entries, **removed;
    size_t n_entries, n_removed, cap_entries, cap_removed;
    size_t bytes;
    uint32_t partition, n_parts;
    drey_store *store; /* names the entries' tenants */
} chunk;

static void chunk_init(chunk *ch, uint32_t partition, uint32_t n_parts, drey_store *store) {
    memset(ch, 0, sizeof *ch);
    drey_arena_init(&ch->arena, NULL, 0);
    ch->partition = partition;
    ch->n_parts = n_parts;
    ch->store = store;
}

static Drey__Internal__V1__MovedEntry *push(chunk *ch, bool removed, const char *cache, size_t cache_len,
                                            const char *key, size_t key_len) {
    Drey__Internal__V1__MovedEntry ***list = removed ? &ch->removed : &ch->entries;
    size_t *n = removed ? &ch->n_removed : &ch->n_entries, *cap = removed ? &ch->cap_removed : &ch->cap_entries;
    if (*n == *cap) {
        *cap = *cap ? *cap * 2 : 256;
        *list = drey_xrealloc(*list, *cap, sizeof **list);
    }
    Drey__Internal__V1__MovedEntry *e = drey_arena_alloc(&ch->arena, sizeof *e);
    drey__internal__v1__moved_entry__init(e);
    uint8_t *data = drey_arena_alloc(&ch->arena, cache_len + key_len + 1);
    memcpy(data, cache, cache_len);
    memcpy(data + cache_len, key, key_len);
    e->cache = (ProtobufCBinaryData){.len = cache_len, .data = data};
    e->key = (ProtobufCBinaryData){.len = key_len, .data = data + cache_len};
    (*list)[(*n)++] = e;
    ch->bytes += cache_len + key_len + 16;
    return e;
}

static void push_entry(chunk *ch, const char *cache, size_t cache_len, const char *key, size_t key_len,
                       const drey_entry_view *v) {
    Drey__Internal__V1__MovedEntry *e = push(ch, false, cache, cache_len, key, key_len);
    uint8_t *value = drey_arena_alloc(&ch->arena, v->value.len ? v->value.len : 1);
    if (v->value.len > 0)
        memcpy(value, v->value.data, v->value.len);
    e->kind = (uint32_t)v->value.kind;
    e->value = (ProtobufCBinaryData){.len = v->value.len, .data = value};
    e->version = v->version;
    e->expires_at_ms = v->expires_at_ms;
    size_t tenant_len;
    const char *tenant = drey_store_tenant_name(ch->store, v->tenant, &tenant_len);
    e->tenant = drey_arena_strndup(&ch->arena, tenant, tenant_len); /* its tenant's on the new copy too */
    ch->bytes += v->value.len + tenant_len;
}

static void chunk_reset(chunk *ch) {
    free(ch->entries);
    free(ch->removed);
    drey_arena_destroy(&ch->arena);
    chunk_init(ch, ch->partition, ch->n_parts, ch->store);
}

static void chunk_destroy(chunk *ch) {
    free(ch->entries);
    free(ch->removed);
    drey_arena_destroy(&ch->arena);
}

/* The last chunk goes while the partition is frozen: it carries this
 * node's version counter (versions keep increasing per key on the new
 * copy) and the partition's sequence (its next record follows it). */
static bool send_chunk(mover *mv, chunk *ch, bool replace, bool last) {
    Drey__Internal__V1__ImportRequest req = DREY__INTERNAL__V1__IMPORT_REQUEST__INIT;
    req.partition = ch->partition;
    req.partitions = ch->n_parts;
    req.replace = replace;
    req.entries = ch->entries;
    req.n_entries = ch->n_entries;
    req.removed = ch->removed;
    req.n_removed = ch->n_removed;
    req.epoch = mv->epoch;
    if (last) {
        req.last = true;
        req.min_version = drey_store_last_version(mv->c->opts.store);
        req.sequence = atomic_load(&mv->c->partitions[ch->partition].seq);
    }
    bool ok = call_import(mv, &req);
    chunk_reset(ch);
    return ok;
}

#define COPY_STEP 256 /* entries per step of the partition's walk (one lock held per step) */

static void export_item(void *arg, const drey_store_item *it) {
    chunk *ch = arg;
    push_entry(ch, it->cache, it->cache_len, it->key, it->key_len, &it->entry);
}

static void export_item_of_partition(void *arg, const drey_store_item *it) {
    chunk *ch = arg;
    if (drey_partition_of_entry(it->cache, it->cache_len, it->key, it->key_len, ch->n_parts) == ch->partition)
        export_item(ch, it);
}

/* 1: the partition as it is now, while its writes go on: a walk of its own
 * tables in steps, no lock held across a send; an entry present all along
 * goes at least once, and what changes meanwhile goes again with the
 * changed keys. A store not partitioned as the cluster (never, once
 * joined) is walked whole. */
static bool copy(mover *mv) {
    drey_cluster *c = mv->c;
    drey_store *s = c->opts.store;
    chunk ch;
    chunk_init(&ch, mv->partition, c->n_parts, s);
    bool ok = true, first = true, indexed = drey_store_partitions(s) == c->n_parts;
    drey_store_scan_pos pos = {0, 0};
    for (size_t sh = 0; ok && (indexed ? pos.shard != DREY_STORE_SCAN_DONE : sh < DREY_STORE_SHARDS); sh++) {
        if (indexed)
            drey_store_partition_walk(s, mv->partition, drey_wall_ms(), &pos, COPY_STEP, export_item, &ch);
        else
            drey_store_walk_shard(s, sh, drey_wall_ms(), export_item_of_partition, &ch);
        bool last = indexed ? pos.shard == DREY_STORE_SCAN_DONE : sh == DREY_STORE_SHARDS - 1;
        if (ch.bytes >= CHUNK_BYTES || (last && (ch.n_entries > 0 || first))) {
            ok = send_chunk(mv, &ch, first, false);
            first = false;
        }
    }
    chunk_destroy(&ch);
    return ok;
}

typedef struct read_into {
    chunk *ch;
    const drey_cluster__dirty *d;
} read_into;

static void read_dirty(void *arg, const drey_entry_view *v) {
    read_into *ri = arg;
    push_entry(ri->ch, ri->d->data, ri->d->cache_len, ri->d->data + ri->d->cache_len, ri->d->key_len, v);
}

/* 2 and 3: the changed keys as they are now, present or gone. The last
 * call carries the version counter. */
static bool send_changes(mover *mv, drey_cluster__dirty *list, bool last) {
    drey_cluster *c = mv->c;
    chunk ch;
    chunk_init(&ch, mv->partition, c->n_parts, c->opts.store);
    bool ok = true;
    for (drey_cluster__dirty *d = list; d != NULL && ok; d = d->next) {
        drey_key k;
        drey_store_key(c->opts.store, &k, d->data, d->cache_len, d->data + d->cache_len, d->key_len);
        read_into ri = {.ch = &ch, .d = d};
        if (!drey_store_read(c->opts.store, &k, drey_wall_ms(), read_dirty, &ri))
            push(&ch, true, d->data, d->cache_len, d->data + d->cache_len, d->key_len);
        if (ch.bytes >= CHUNK_BYTES && d->next != NULL)
            ok = send_chunk(mv, &ch, false, false);
    }
    if (ok && (last || ch.n_entries + ch.n_removed > 0))
        ok = send_chunk(mv, &ch, false, last);
    chunk_destroy(&ch);
    return ok;
}

/* 3: no new writes, and the running ones answered. */
static bool freeze(drey_cluster *c, uint32_t p) {
    return drey_cluster__partition_freeze(&c->partitions[p], drey_deadline_after_ms(FREEZE_DRAIN_MS));
}

/* --- 4: the flip ------------------------------------------------------------------------ */

typedef enum flip { FLIPPED, KEPT, UNKNOWN } flip;

/* Whether the entry says the flip happened. */
static bool done_in(const mover *mv, const Drey__Internal__V1__PartitionEntry *e) {
    if (mv->kind != SYNC)
        return strcmp(e->primary, mv->target) == 0;
    for (size_t i = 0; i < e->n_replicas; i++) {
        if (strcmp(e->replicas[i], mv->target) == 0)
            return true;
    }
    return false;
}

static flip read_back(mover *mv, const char *key) {
    drey_cluster *c = mv->c;
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    Etcdserverpb__RangeResponse *resp;
    drey_etcd_status st;
    flip h = UNKNOWN;
    if (drey_etcd_get(c->etcd, key, false, ETCD_CALL_MS, &a, &resp, &st) == GRPC_STATUS_OK) {
        h = KEPT;
        if (resp->n_kvs == 1) {
            Drey__Internal__V1__PartitionEntry *e = drey__internal__v1__partition_entry__unpack(
                drey_arena_protobuf_allocator(&a), resp->kvs[0]->value.len, resp->kvs[0]->value.data);
            if (e != NULL && done_in(mv, e)) {
                h = FLIPPED;
                drey_cluster__apply_own_write(c, key, resp->kvs[0]->value.data, resp->kvs[0]->value.len,
                                              resp->kvs[0]->mod_revision);
            }
        }
    }
    drey_arena_destroy(&a);
    return h;
}

/* The entry after the flip, false when it is no longer the one planned:
 *   - a move: the target primary; the backups stay (they have every write
 *     up to the freeze, and the new primary continues the partition's
 *     sequence), and so does this node as one while the partition would
 *     have fewer copies than the factor without it; the copies under way
 *     were this node's (the new primary plans its own);
 *   - a handover: the target primary, this node an in-sync backup in its
 *     place (it has every write); the rest stays;
 *   - a new backup: it joins the in-sync set, this node stays primary. */
static bool next_entry(mover *mv, drey_cluster__entry *e, bool *keep_copy) {
    drey_cluster *c = mv->c;
    pthread_mutex_lock(&c->mu);
    bool same = c->epochs[mv->partition] == mv->epoch;
    if (same)
        drey_cluster__entry_of(c->entries[mv->partition], e);
    pthread_mutex_unlock(&c->mu);
    if (!same)
        return false;
    *keep_copy = true;
    switch (mv->kind) {
    case SYNC:
        if (!drey_cluster__entry_remove(e->syncing, &e->n_syncing, mv->target))
            return false;
        drey_cluster__entry_add(e->replicas, &e->n_replicas, mv->target);
        return true;
    case HANDOVER:
        if (strcmp(e->handover, mv->target) != 0 || !drey_cluster__entry_drop_replica(e, mv->target))
            return false;
        snprintf(e->primary, sizeof e->primary, "%s", mv->target);
        drey_cluster__entry_add(e->replicas, &e->n_replicas, c->opts.node_id);
        return true;
    case MOVE:
        if (strcmp(e->joining, mv->target) != 0 || drey_cluster__entry_has(e->replicas, e->n_replicas, mv->target))
            return false;
        snprintf(e->primary, sizeof e->primary, "%s", mv->target);
        e->joining[0] = '\0';
        e->handover[0] = '\0';
        e->n_syncing = 0;
        *keep_copy = 1 + e->n_replicas < c->rf;
        if (*keep_copy)
            drey_cluster__entry_add(e->replicas, &e->n_replicas, c->opts.node_id);
        return true;
    }
    return false;
}

static flip flip_entry(mover *mv, bool *keep_copy) {
    drey_cluster *c = mv->c;
    drey_cluster__entry e;
    if (!next_entry(mv, &e, keep_copy)) {
        snprintf(mv->err, sizeof mv->err, "the partition's entry changed since the move was planned");
        return KEPT;
    }
    switch (drey_cluster__cas_entry(c, mv->partition, mv->epoch, &e, mv->err, sizeof mv->err)) {
    case DREY_CLUSTER_CAS_APPLIED: return FLIPPED;
    case DREY_CLUSTER_CAS_REFUSED: return KEPT;
    case DREY_CLUSTER_CAS_UNKNOWN: break;
    }
    /* Frozen until etcd says which: both answers are safe, guessing is
     * not. */
    DREY_LOG_WARN("a handover's outcome is unknown; the partition stays paused until etcd answers",
                  DREY_LOG_UINT("partition", mv->partition), DREY_LOG_STR("error", mv->err));
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    const char *key = drey_cluster__partition_key(c, &a, mv->partition);
    flip h;
    do {
        pthread_mutex_lock(&c->mu);
        bool leaving = c->leaving;
        pthread_mutex_unlock(&c->mu);
        if (leaving) {
            h = UNKNOWN;
            break;
        }
        drey_nap_ms(100);
    } while ((h = read_back(mv, key)) == UNKNOWN);
    drey_arena_destroy(&a);
    return h;
}

/* A handover's check: the target has applied every write of the
 * partition up to seq. Every one was acknowledged by it before it was
 * answered, so this waits at most for its apply to be noted (and for its
 * table, if its watch is behind), CONFIRM_MS in all. */
static bool confirm(mover *mv, uint64_t seq) {
    drey_cluster *c = mv->c;
    Drey__Internal__V1__ConfirmRequest req = DREY__INTERNAL__V1__CONFIRM_REQUEST__INIT;
    req.partition = mv->partition;
    req.partitions = c->n_parts;
    req.epoch = mv->epoch;
    req.sequence = seq;
    uint8_t buf[64];
    size_t len = drey__internal__v1__confirm_request__pack(&req, buf);
    int64_t until = drey_mono_ns() + CONFIRM_MS * 1000000LL;
    for (;;) {
        char reason[64];
        int code = call_target(mv, DREY_REPLICA_CONFIRM_PATH, buf, len, reason, sizeof reason);
        if (code == 0)
            return true;
        if (strcmp(reason, "NOT_CAUGHT_UP") != 0 || drey_mono_ns() > until)
            return false;
        drey_nap_ms(2);
    }
}

/* After the flip of a move or a handover, before the thaw: the target may
 * have granted this node leases as a backup (room.h), which it would wait
 * out before serving; this node applied the flip to its own table and
 * leads the partition no more, so it releases them. A release that does
 * not arrive costs the target that wait, nothing else. */
static void release(mover *mv) {
    drey_cluster *c = mv->c;
    Drey__Internal__V1__ConfirmRequest req = DREY__INTERNAL__V1__CONFIRM_REQUEST__INIT;
    req.partition = mv->partition;
    req.partitions = c->n_parts;
    pthread_mutex_lock(&c->mu);
    req.epoch = c->epochs[mv->partition];
    pthread_mutex_unlock(&c->mu);
    req.release = true;
    uint8_t buf[64];
    size_t len = drey__internal__v1__confirm_request__pack(&req, buf);
    char reason[64];
    if (call_target(mv, DREY_REPLICA_CONFIRM_PATH, buf, len, reason, sizeof reason) != 0)
        DREY_LOG_DEBUG("a release after a handover did not arrive; the new primary waits out its grants",
                       DREY_LOG_UINT("partition", mv->partition), DREY_LOG_STR("error", mv->err));
}

/* --- 5: the drop, a journaled write of this node ------------------------------------- */

/* The Drop goes through this node's own chain, in-process, as a peer's
 * would (journaled like any write); the table's check (backup.c) and the
 * partition's imported epoch (src/partition) keep it off a copy that came
 * back. */
static bool drop(drey_cluster *c, uint32_t p, int64_t epoch) {
    const drey_method *m = drey_method_find(c->opts.methods, DREY_PARTITION_DROP_PATH);
    if (m == NULL || c->opts.pipeline == NULL)
        return false;
    Drey__Internal__V1__DropRequest req = DREY__INTERNAL__V1__DROP_REQUEST__INIT;
    req.partition = p;
    req.partitions = c->n_parts;
    req.epoch = epoch;
    uint8_t buf[64];
    size_t len = drey__internal__v1__drop_request__pack(&req, buf);
    drey_cluster__header h = {DREY_FORWARDED_BY, c->opts.node_id, strlen(c->opts.node_id)};
    sync_call s = {.done = false};
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cond, NULL);
    drey_pipeline_call_local(c->opts.pipeline, m, buf, len, c->opts.node_id, &h, 1, INT64_MAX, sync_done, &s);
    pthread_mutex_lock(&s.mu);
    while (!s.done)
        pthread_cond_wait(&s.cond, &s.mu); /* the journal answers every write */
    pthread_mutex_unlock(&s.mu);
    pthread_mutex_destroy(&s.mu);
    pthread_cond_destroy(&s.cond);
    if (s.code != 0)
        DREY_LOG_WARN("a copy of a partition this node holds no role in was not dropped; it is tried again",
                      DREY_LOG_UINT("partition", p), DREY_LOG_STR("reason", s.reason[0] ? s.reason : s.message));
    return s.code == 0;
}

/* --- copies without a role ----------------------------------------------------------------- */

/* Drops the partitions this node holds entries of although their entries
 * name it in no role: a backup taken out of the in-sync set, a restarted
 * node that stepped out, a copy that did not complete, a move's drop that
 * failed. The same journaled Drop as a move's, naming the epoch of the
 * entry that left the node out: the route row refuses it if the node has a
 * role again by the time it runs, and a copy imported at a newer epoch is
 * spared (live and on replay). Memory then holds only what the node serves
 * or may be promoted with. */
static void drop_roleless(drey_cluster *c, int64_t *retry_at) {
    drey_journal *j = drey_pipeline_journal(c->opts.pipeline);
    if (j != NULL) {
        drey_journal_stats js;
        drey_journal_get_stats(j, &js);
        if (js.failed)
            return; /* no Drop can be journaled: they stay, unserved, until the node restarts */
    }
    uint32_t *parts = drey_xcalloc(c->n_parts ? c->n_parts : 1, sizeof *parts);
    int64_t *epochs = drey_xcalloc(c->n_parts ? c->n_parts : 1, sizeof *epochs);
    size_t n = 0;
    int64_t now = drey_mono_ms();
    pthread_mutex_lock(&c->mu);
    for (uint32_t p = 0; p < c->n_parts && !c->leaving; p++) {
        const Drey__Internal__V1__PartitionEntry *e = c->entries[p];
        if (e == NULL || retry_at[p] > now || e->primary[0] == '\0')
            continue;
        drey_cluster__entry x;
        drey_cluster__entry_of(e, &x);
        if (!drey_cluster__entry_names(&x, c->opts.node_id)) {
            parts[n] = p;
            epochs[n++] = c->epochs[p];
        }
    }
    pthread_mutex_unlock(&c->mu);
    for (size_t i = 0; i < n; i++) {
        drey_store_partition_stats st;
        drey_store_get_partition_stats(c->opts.store, parts[i], &st);
        if (st.entries == 0)
            continue;
        if (drop(c, parts[i], epochs[i])) {
            atomic_fetch_add(&c->mover.roleless_dropped, 1);
            DREY_LOG_DEBUG("dropped a copy of a partition this node holds no role in", DREY_LOG_UINT("partition", parts[i]),
                           DREY_LOG_UINT("entries", st.entries), DREY_LOG_INT("epoch", epochs[i]));
        } else {
            retry_at[parts[i]] = drey_mono_ms() + 5 * RETRY_MS;
        }
    }
    free(parts);
    free(epochs);
}

/* --- one move ------------------------------------------------------------------------------ */

static uint64_t elapsed_us(int64_t since_ns) {
    return (uint64_t)((drey_mono_ns() - since_ns) / 1000);
}

/* 1 to 3 of a copy: true with the partition frozen and all of it sent;
 * *froze once it is frozen. */
static bool copy_out(mover *mv, bool *froze) {
    drey_cluster *c = mv->c;
    drey_cluster__partition *pt = &c->partitions[mv->partition];
    /* A Clear of the partition answered from here on (router.c's
     * write_done) voids the copy: it is seen once the partition is frozen,
     * and the controller plans the copy again. One answered before was
     * applied before the copy reads anything. */
    atomic_store(&pt->cleared, false);
    atomic_store(&pt->moving, true);
    bool ok = copy(mv);
    for (int round = 0; ok && round < CATCH_UP_ROUNDS; round++) {
        size_t n;
        drey_cluster__dirty *d = drey_cluster__partition_take_dirty(pt, &n);
        if (n < CATCH_UP_KEYS) {
            drey_cluster__partition_give_back(pt, d); /* few enough for the pause: they go with the last ones */
            break;
        }
        ok = send_changes(mv, d, false);
        drey_cluster__dirty_free(d);
    }
    *froze = ok;
    if (ok && !freeze(c, mv->partition)) {
        snprintf(mv->err, sizeof mv->err, "the partition's running writes did not finish within %d ms",
                 FREEZE_DRAIN_MS);
        return false;
    }
    if (ok && atomic_load(&pt->cleared)) {
        snprintf(mv->err, sizeof mv->err, "a Clear of the partition ran during the copy");
        return false;
    }
    if (ok) {
        size_t n;
        drey_cluster__dirty *d = drey_cluster__partition_take_dirty(pt, &n);
        ok = send_changes(mv, d, true);
        drey_cluster__dirty_free(d);
    }
    return ok;
}

/* A handover's part before the flip: true with the partition frozen and
 * the target confirmed to have every write of it. */
static bool ready_handover(mover *mv, bool *froze) {
    drey_cluster *c = mv->c;
    *froze = true;
    if (!freeze(c, mv->partition)) {
        snprintf(mv->err, sizeof mv->err, "the partition's running writes did not finish within %d ms",
                 FREEZE_DRAIN_MS);
        return false;
    }
    /* Every write up to this one was answered, so acknowledged by every
     * in-sync backup: the target among them. */
    return confirm(mv, atomic_load(&c->partitions[mv->partition].seq));
}

static const char *kind_name(move_kind k) {
    return k == MOVE ? "move" : k == SYNC ? "new backup" : "handover";
}

static bool run(mover *mv) {
    drey_cluster *c = mv->c;
    uint32_t p = mv->partition;
    drey_cluster__partition *pt = &c->partitions[p];
    int64_t started = drey_mono_ns();
    atomic_store(&c->mover.moving, (int64_t)p);
    bool froze = false, keep_copy = true;
    bool ok = mv->kind == HANDOVER ? ready_handover(mv, &froze) : copy_out(mv, &froze);
    int64_t paused = drey_mono_ns();
    flip h = ok ? flip_entry(mv, &keep_copy) : KEPT;
    if (h == FLIPPED && mv->kind != SYNC)
        release(mv);
    atomic_store(&pt->moving, false);
    if (h == UNKNOWN)
        return false; /* stopping with the flip unconfirmed: stay paused */
    drey_cluster__partition_thaw(pt);
    if (froze) {
        uint64_t pause = elapsed_us(paused);
        atomic_store(&c->mover.pause_last_us, pause);
        if (pause > atomic_load(&c->mover.pause_max_us))
            atomic_store(&c->mover.pause_max_us, pause);
    }
    size_t n;
    drey_cluster__dirty_free(drey_cluster__partition_take_dirty(pt, &n));
    atomic_store(&c->mover.moving, -1);
    atomic_fetch_add(&c->mover.moved_entries, mv->entries);
    atomic_fetch_add(&c->mover.moved_bytes, mv->bytes);
    if (h != FLIPPED) {
        atomic_fetch_add(&c->mover.moves_failed, 1);
        DREY_LOG_DEBUG("a partition's move did not complete; this node keeps leading it",
                      DREY_LOG_STR("kind", kind_name(mv->kind)), DREY_LOG_UINT("partition", p),
                      DREY_LOG_STR("to", mv->target), DREY_LOG_STR("error", mv->err));
        return false;
    }
    atomic_fetch_add(mv->kind == SYNC ? &c->mover.backups_added : mv->kind == MOVE ? &c->mover.moves_done : &c->mover.handovers_done,
                     1);
    DREY_LOG_DEBUG(mv->kind == SYNC ? "partition copied to a new backup" : "partition handed over",
                  DREY_LOG_STR("kind", kind_name(mv->kind)), DREY_LOG_UINT("partition", p),
                  DREY_LOG_STR("to", mv->target), DREY_LOG_UINT("entries", mv->entries),
                  DREY_LOG_UINT("bytes", mv->bytes), DREY_LOG_UINT("pause_us", atomic_load(&c->mover.pause_last_us)),
                  DREY_LOG_UINT("took_ms", elapsed_us(started) / 1000));
    if (!keep_copy) {
        pthread_mutex_lock(&c->mu);
        int64_t epoch = c->epochs[p]; /* the flip's, or newer: the Drop is refused if that names this node */
        pthread_mutex_unlock(&c->mu);
        drop(c, p, epoch);
    }
    return true;
}

/* --- the loop ------------------------------------------------------------------------------ */

/* The next planned move out of this node whose last try is not too
 * recent, handovers first (they copy nothing); needs c->mu. */
static bool next_move(drey_cluster *c, const int64_t *retry_at, mover *mv) {
    int64_t now = drey_mono_ms();
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t p = 0; p < c->n_parts; p++) {
            const Drey__Internal__V1__PartitionEntry *e = c->entries[p];
            if (e == NULL || strcmp(e->primary, c->opts.node_id) != 0 || retry_at[p] > now)
                continue;
            drey_cluster__entry x;
            drey_cluster__entry_of(e, &x);
            const char *target = NULL;
            if (pass == 0 && x.handover[0] != '\0' && drey_cluster__entry_has(x.replicas, x.n_replicas, x.handover)) {
                mv->kind = HANDOVER;
                target = e->handover;
            } else if (pass == 1 && x.joining[0] != '\0') {
                /* Never a copy onto an in-sync backup (the rule above): the
                 * controller turns such a plan into a handover. */
                if (drey_cluster__entry_has(x.replicas, x.n_replicas, x.joining))
                    continue;
                mv->kind = MOVE; /* before the backups: the new primary restores the ones it wants */
                target = e->joining[0];
            } else if (pass == 1 && x.n_syncing > 0 &&
                       !drey_cluster__entry_has(x.replicas, x.n_replicas, x.syncing[0])) {
                mv->kind = SYNC;
                target = e->syncing[0];
            } else {
                continue;
            }
            const Drey__Internal__V1__Member *to = drey_cluster__member_locked(c, target);
            if (to == NULL || to->internal[0] == '\0' || strcmp(target, c->opts.node_id) == 0)
                continue; /* the controller replans it */
            mv->partition = p;
            mv->target = drey_xstrdup(to->id);
            mv->address = drey_xstrdup(to->internal);
            mv->epoch = c->epochs[p];
            return true;
        }
    }
    return false;
}

/* One line per run of moves (from the first after an idle spell until
 * none was to do for BATCH_QUIET_MS), not one per partition: a join, a
 * drain or a failover's new backups move tens of partitions at once, in
 * waves the controller plans a few at a time. */
#define BATCH_TARGETS 8
#define BATCH_QUIET_MS 1000

typedef struct batch {
    uint32_t done[3], failed; /* by kind */
    uint64_t entries, bytes;
    int64_t started_ns;
    struct {
        char id[DREY_CLUSTER_MAX_ID];
        uint32_t n;
    } to[BATCH_TARGETS];
    size_t n_to;
    char error[200]; /* the last failure's */
} batch;

static void batch_add(batch *b, const mover *mv, bool ok) {
    if (b->started_ns == 0)
        b->started_ns = drey_mono_ns();
    if (!ok) {
        b->failed++;
        drey_log_clip(b->error, sizeof b->error, mv->err, strlen(mv->err));
        return;
    }
    b->done[mv->kind]++;
    b->entries += mv->entries;
    b->bytes += mv->bytes;
    size_t i = 0;
    while (i < b->n_to && strcmp(b->to[i].id, mv->target) != 0)
        i++;
    if (i == b->n_to && b->n_to < BATCH_TARGETS)
        snprintf(b->to[b->n_to++].id, sizeof b->to[0].id, "%s", mv->target);
    if (i < b->n_to)
        b->to[i].n++;
}

static void batch_flush(batch *b) {
    if (b->started_ns == 0)
        return;
    char to[512] = "";
    size_t n = 0;
    for (size_t i = 0; i < b->n_to && n < sizeof to; i++)
        n += (size_t)snprintf(to + n, sizeof to - n, "%s%s:%u", i > 0 ? "," : "", b->to[i].id, b->to[i].n);
    int64_t took_ms = (drey_mono_ns() - b->started_ns) / 1000000;
    if (b->failed > 0)
        DREY_LOG_WARN("partition moves from this node: some did not complete (retried)", DREY_LOG_UINT("moves", b->done[MOVE]),
                      DREY_LOG_UINT("handovers", b->done[HANDOVER]), DREY_LOG_UINT("new_backups", b->done[SYNC]),
                      DREY_LOG_UINT("failed", b->failed), DREY_LOG_STR("to", to), DREY_LOG_INT("took_ms", took_ms),
                      DREY_LOG_STR("last_error", b->error));
    else
        DREY_LOG_INFO("partition moves from this node finished", DREY_LOG_UINT("moves", b->done[MOVE]),
                      DREY_LOG_UINT("handovers", b->done[HANDOVER]), DREY_LOG_UINT("new_backups", b->done[SYNC]),
                      DREY_LOG_STR("to", to), DREY_LOG_UINT("entries", b->entries), DREY_LOG_UINT("bytes", b->bytes),
                      DREY_LOG_INT("took_ms", took_ms));
    *b = (batch){0};
}

void *drey_cluster__mover_main(void *arg) {
    drey_cluster *c = arg;
    int64_t *retry_at = drey_xcalloc(c->n_parts, sizeof *retry_at);
    batch b = {0};
    int64_t idle_since_ns = 0;
    pthread_mutex_lock(&c->mu);
    while (!c->leaving) {
        mover mv = {.c = c};
        if (!next_move(c, retry_at, &mv)) {
            if (c->opts.store != NULL && c->opts.pipeline != NULL) {
                pthread_mutex_unlock(&c->mu);
                drop_roleless(c, retry_at);
                pthread_mutex_lock(&c->mu);
                if (c->leaving)
                    break;
            }
            int64_t now = drey_mono_ns();
            if (b.started_ns != 0 && idle_since_ns == 0)
                idle_since_ns = now;
            if (b.started_ns != 0 && now - idle_since_ns >= BATCH_QUIET_MS * 1000000LL) {
                pthread_mutex_unlock(&c->mu);
                batch_flush(&b);
                pthread_mutex_lock(&c->mu);
                continue; /* the table may have moved on meanwhile */
            }
            drey_cond_wait_until(&c->cond, &c->mu, drey_deadline_after_ms(b.started_ns != 0 ? 100 : RETRY_MS));
            continue;
        }
        idle_since_ns = 0;
        pthread_mutex_unlock(&c->mu);
        bool ok = run(&mv);
        if (!ok)
            retry_at[mv.partition] = drey_mono_ms() + RETRY_MS;
        batch_add(&b, &mv, ok);
        free((char *)mv.target);
        free((char *)mv.address);
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    batch_flush(&b);
    free(retry_at);
    return NULL;
}
