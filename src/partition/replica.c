/*
 * replica — drey.internal.v1.Replica/Apply: a partition's write, recorded
 * by its primary, applied on a backup.
 *
 * The record was validated, admitted and ordered at its primary (which
 * counted this node's room before sending it), so nothing of the public
 * chain runs for it again here: once the cluster's route row has taken it
 * in sequence, the backup journals the primary's bytes (marked a copy) in
 * its own journal, under its own fsync policy and quota, and applies them
 * once durable exactly as the primary did: at the record's time, with the
 * versions the primary reserved and the victims it chose, remembering the
 * same outcome. A write that fails on the primary (a version mismatch)
 * fails the same way here; the record is still taken, and answered as
 * done. Replay after a restart is a replay like any other record's.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/clock.h"

#include "drey/internal/v1/move.pb-c.h"
#include "drey/partition.h"

struct drey_partition_replica {
    drey_commit *commit;
    drey_memory *memory;
    _Atomic(drey_journal *) journal;
};

drey_partition_replica *drey_partition_replica_create(drey_commit *commit, drey_memory *memory) {
    drey_partition_replica *rep = drey_xcalloc(1, sizeof *rep);
    rep->commit = commit;
    rep->memory = memory;
    return rep;
}

void drey_partition_replica_set_journal(drey_partition_replica *rep, drey_journal *j) {
    atomic_store(&rep->journal, j);
}

void drey_partition_replica_destroy(drey_partition_replica *rep) {
    free(rep);
}

/* This node's room, for its primaries' admission. */
static ProtobufCMessage *room(drey_partition_replica *rep, drey_arena *a) {
    Drey__Internal__V1__ReplicateResponse *resp = drey_arena_alloc(a, sizeof *resp);
    drey__internal__v1__replicate_response__init(resp);
    drey_journal *j = atomic_load(&rep->journal);
    resp->journal_room_bytes = j != NULL ? drey_journal_room(j) : UINT64_MAX;
    resp->memory_room_bytes = rep->memory != NULL ? drey_memory_room(rep->memory) : INT64_MAX;
    return &resp->base;
}

static void apply_taken(drey_partition_take *t, int64_t now_ms) {
    drey_status st;
    drey_status_init(&st);
    drey_apply ax = {.now_ms = now_ms, .arena = t->arena, .status = &st};
    drey_commit_apply(t->rep->commit, &t->write, &ax);
    t->done(t->arg, room(t->rep, t->arena), 0);
}

static void taken_durable(void *arg, const drey_journal_record *rec, int err) {
    drey_partition_take *t = arg;
    if (err != 0)
        t->done(t->arg, NULL, err);
    else
        apply_taken(t, rec->time_ms);
}

int drey_partition_replica_take(drey_partition_replica *rep, drey_partition_take *t) {
    t->rep = rep;
    /* Decoded before it is journaled: a record this node could not replay
     * would stop its recovery. */
    if (t->record == NULL || drey_commit_decode(rep->commit, t->record, t->len, t->arena, &t->write) != 0)
        return -EINVAL;
    t->write.copy = true;
    drey_journal *j = atomic_load(&rep->journal);
    if (j == NULL) {
        apply_taken(t, t->time_ms != 0 ? t->time_ms : drey_wall_ms());
        return 0;
    }
    uint8_t *bytes = drey_arena_alloc(t->arena, t->len + DREY_COMMIT_COPY_ROOM);
    memcpy(bytes, t->record, t->len);
    t->entry = (drey_journal_entry){
        .payload = bytes,
        .len = t->len + drey_commit_mark_copy(bytes + t->len),
        .time_ms = t->time_ms,
        .done = taken_durable,
        .arg = t,
    };
    return drey_journal_append(j, &t->entry);
}

/* Live, the cluster's route row answers every Apply (the function above).
 * This is for journals written before backups journaled the record itself:
 * they hold the Apply request around it, and replay applies the record
 * inside at its own time. */
static ProtobufCMessage *apply_record(void *ctx, drey_apply *ax, const ProtobufCMessage *msg) {
    drey_partition_replica *rep = ctx;
    const Drey__Internal__V1__ReplicateRequest *req = (const void *)msg;
    drey_write w;
    if (req->record.data == NULL ||
        drey_commit_decode(rep->commit, req->record.data, req->record.len, ax->arena, &w) != 0) {
        drey_status_set(ax->status, DREY_ERR_MALFORMED_REQUEST);
        return NULL;
    }
    w.copy = true;
    drey_status st;
    drey_status_init(&st);
    drey_apply inner = {.now_ms = req->time_ms, .arena = ax->arena, .status = &st};
    drey_commit_apply(rep->commit, &w, &inner);
    return room(rep, ax->arena);
}

/* The marks of a heartbeat are the route row's (src/cluster/backup.c),
 * which leaves the epoch of those it took and zeroes the others' (a real
 * entry's epoch, an etcd revision, is never 0); the answer is this node's
 * room and the partitions of the marks taken: the leases it grants. */
static ProtobufCMessage *beat(void *ctx, drey_apply *ax, const ProtobufCMessage *msg) {
    const Drey__Internal__V1__BeatRequest *req = (const void *)msg;
    Drey__Internal__V1__ReplicateResponse *resp = (Drey__Internal__V1__ReplicateResponse *)room(ctx, ax->arena);
    resp->granted = drey_arena_alloc(ax->arena, (req->n_marks ? req->n_marks : 1) * sizeof *resp->granted);
    for (size_t i = 0; i < req->n_marks; i++) {
        if (req->marks[i]->epoch > 0)
            resp->granted[resp->n_granted++] = req->marks[i]->partition;
    }
    return &resp->base;
}

/* A handover's check is answered by the route row, which knows the
 * partition's sequence; a node that is not in a cluster backs nothing. */
static ProtobufCMessage *confirm(void *ctx, drey_apply *ax, const ProtobufCMessage *msg) {
    (void)ctx;
    (void)msg;
    drey_status_set(ax->status, DREY_ERR_NOT_REPLICA);
    return NULL;
}

/* --- Hash ------------------------------------------------------------------ */

#define FNV_OFFSET 0xcbf29ce484222325ULL
#define FNV_PRIME 0x100000001b3ULL

static uint64_t fnv(uint64_t h, const void *data, size_t len) {
    const uint8_t *p = data;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * FNV_PRIME;
    return h;
}

static uint64_t fnv_u64(uint64_t h, uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    return fnv(h, b, 8);
}

typedef struct hashing {
    uint32_t n;
    Drey__Internal__V1__PartitionHash **by_partition; /* n; NULL: not asked */
} hashing;

/* Adds an entry to its partition's hash: a sum, so the order entries come
 * in does not matter. */
static void hash_into(Drey__Internal__V1__PartitionHash *ph, const drey_store_item *it) {
    uint64_t h = fnv_u64(FNV_OFFSET, it->cache_len);
    h = fnv(h, it->cache, it->cache_len);
    h = fnv_u64(h, it->key_len);
    h = fnv(h, it->key, it->key_len);
    h = fnv_u64(h, it->entry.value.kind);
    h = fnv_u64(h, it->entry.value.len);
    h = fnv(h, it->entry.value.data, it->entry.value.len);
    h = fnv_u64(h, it->entry.version);
    h = fnv_u64(h, (uint64_t)it->entry.expires_at_ms);
    ph->hash += h;
    ph->entries++;
}

static void hash_item(void *arg, const drey_store_item *it) {
    hashing *hs = arg;
    uint32_t p = drey_partition_of_entry(it->cache, it->cache_len, it->key, it->key_len, hs->n);
    if (p < hs->n && hs->by_partition[p] != NULL)
        hash_into(hs->by_partition[p], it);
}

static void hash_partition_item(void *arg, const drey_store_item *it) {
    hash_into(arg, it);
}

#define HASH_STEP 4096 /* entries per step of a partition's walk */

static ProtobufCMessage *hash_apply(void *ctx, drey_apply *ax, const ProtobufCMessage *msg) {
    const Drey__Internal__V1__HashRequest *req = (const void *)msg;
    if (req->partitions == 0 || req->partitions > 65536) {
        drey_status_set(ax->status, DREY_ERR_MALFORMED_REQUEST);
        return NULL;
    }
    hashing hs = {.n = req->partitions};
    hs.by_partition = drey_arena_calloc(ax->arena, hs.n * sizeof *hs.by_partition);
    Drey__Internal__V1__HashResponse *resp = drey_arena_alloc(ax->arena, sizeof *resp);
    drey__internal__v1__hash_response__init(resp);
    size_t n = req->n_partition > 0 ? req->n_partition : hs.n;
    resp->partitions = drey_arena_alloc(ax->arena, n * sizeof *resp->partitions);
    for (size_t i = 0; i < n; i++) {
        uint32_t p = req->n_partition > 0 ? req->partition[i] : (uint32_t)i;
        if (p >= hs.n || hs.by_partition[p] != NULL)
            continue;
        Drey__Internal__V1__PartitionHash *ph = drey_arena_alloc(ax->arena, sizeof *ph);
        drey__internal__v1__partition_hash__init(ph);
        ph->partition = p;
        hs.by_partition[p] = ph;
        resp->partitions[resp->n_partitions++] = ph;
    }
    drey_store *s = drey_commit_store(((drey_partition_replica *)ctx)->commit);
    if (drey_store_partitions(s) == hs.n) {
        /* The partitions asked for, and only their entries. */
        for (size_t i = 0; i < resp->n_partitions; i++) {
            drey_store_scan_pos pos = {0, 0};
            while (pos.shard != DREY_STORE_SCAN_DONE)
                drey_store_partition_walk(s, resp->partitions[i]->partition, ax->now_ms, &pos, HASH_STEP,
                                          hash_partition_item, resp->partitions[i]);
        }
        return &resp->base;
    }
    for (size_t sh = 0; sh < DREY_STORE_SHARDS; sh++)
        drey_store_walk_shard(s, sh, ax->now_ms, hash_item, &hs);
    return &resp->base;
}

bool drey_partition_register_replica(drey_method_table *t, drey_partition_replica *rep) {
    const drey_method_spec specs[] = {
        {.name = "Apply", .route = DREY_ROUTE_PEER, .flags = DREY_METHOD_WRITE | DREY_METHOD_PEER | DREY_METHOD_ORDERED, .apply = apply_record},
        {.name = "Hash", .route = DREY_ROUTE_PEER, .flags = DREY_METHOD_READ | DREY_METHOD_PEER, .apply = hash_apply},
        {.name = "Beat", .route = DREY_ROUTE_PEER, .flags = DREY_METHOD_READ | DREY_METHOD_PEER | DREY_METHOD_ORDERED, .apply = beat},
        {.name = "Confirm", .route = DREY_ROUTE_PEER, .flags = DREY_METHOD_READ | DREY_METHOD_PEER | DREY_METHOD_ORDERED, .apply = confirm},
    };
    return drey_method_table_add_service(t, &drey__internal__v1__replica__descriptor, specs,
                                         sizeof specs / sizeof specs[0], rep);
}
