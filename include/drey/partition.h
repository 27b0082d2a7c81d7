/*
 * partition — a cluster partition's entries as one node's store holds them:
 * which partition an entry is in, and the writes that move a partition
 * between nodes (drey.internal.v1.Partitions, proto/drey/internal/v1/
 * move.proto).
 *
 * Import and Drop are ordinary journaled writes of the node that receives
 * them (DREY_METHOD_PEER: only another node may call them), so the chain
 * admits them like any write (memory, journal quota) and recovery replays
 * them in order. Each record names the cluster's partition count, so it
 * means the same thing on replay whatever the node's flags.
 *
 * Remembered outcomes of request_ids belong to their write's partition
 * (include/drey/commit.h: a partitioned node's outcome keys name the
 * write's first key), so a retry after a move finds its first answer.
 */
#ifndef DREY_PARTITION_H
#define DREY_PARTITION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "drey/commit.h"
#include "drey/journal.h"
#include "drey/memory.h"
#include "drey/method.h"
#include "drey/store.h"

#define DREY_PARTITION_NONE UINT32_MAX

/* The partition (of n) a store entry belongs to: its cache and key's, or for
 * a remembered outcome its write's; DREY_PARTITION_NONE for an outcome that
 * names no write key (kept before the node was partitioned). */
uint32_t drey_partition_of_entry(const char *cache, size_t cache_len, const char *key, size_t key_len, uint32_t n);

/* Keeps the store's entries per partition of n (drey_store_set_partitions
 * with drey_partition_of_entry), so that Import, Drop and Hash of records
 * naming n cost their partition's entries; a cluster node does it at join.
 * Records naming another count walk the whole store. */
bool drey_partition_index(drey_store *s, uint32_t n);

/* drey.internal.v1.Partitions (Import, Drop) on a store: the writes, and
 * what they remember between them (the epoch each partition was last
 * imported at, so that an older Drop spares a newer copy). */
typedef struct drey_partition drey_partition;

drey_partition *drey_partition_create(drey_store *s);
void drey_partition_destroy(drey_partition *p);
/* Adds Import and Drop to the table. */
bool drey_partition_register(drey_method_table *t, drey_partition *p);

/* drey.internal.v1.Replica on this node: Apply (a primary's record on a
 * backup: drey_partition_replica_take), Beat (a primary's heartbeat,
 * answered with this node's room: journal, memory) and Hash. */
typedef struct drey_partition_replica drey_partition_replica;

drey_partition_replica *drey_partition_replica_create(drey_commit *commit, drey_memory *memory);
/* Durable nodes, once the journal is open. */
void drey_partition_replica_set_journal(drey_partition_replica *rep, drey_journal *j);
void drey_partition_replica_destroy(drey_partition_replica *rep);
bool drey_partition_register_replica(drey_method_table *t, drey_partition_replica *rep);

/* A primary's record this node takes as a backup, once the cluster has
 * checked its epoch and sequence (src/cluster/backup.c). */
typedef struct drey_partition_take {
    const uint8_t *record; /* the primary's journal record, as it journaled it */
    size_t len;
    int64_t time_ms;   /* the time the primary ordered it at */
    drey_arena *arena; /* the decoded write and the answer: kept until done */
    /* Runs once: the answer (this node's room), or NULL with err, -errno,
     * when this node's journal failed to write the record. */
    void (*done)(void *arg, const ProtobufCMessage *answer, int err);
    void *arg;
    /* The replica's, until done. */
    drey_partition_replica *rep;
    drey_write write;
    drey_journal_entry entry;
} drey_partition_take;

/* Journals t's record as this node's own and applies it once durable, as
 * its primary did (see src/partition/replica.c). 0: t->done runs, on the
 * journal's writer (on an ephemeral node before this returns); -EINVAL: not
 * a record of a write this node knows; else the journal's refusal
 * (drey_journal_append). On an error nothing was journaled and done never
 * runs. */
int drey_partition_replica_take(drey_partition_replica *rep, drey_partition_take *t);

#define DREY_PARTITION_IMPORT_PATH "/drey.internal.v1.Partitions/Import"
#define DREY_PARTITION_DROP_PATH "/drey.internal.v1.Partitions/Drop"
#define DREY_PARTITION_CLEAR_PATH "/drey.internal.v1.Partitions/Clear"
#define DREY_REPLICA_APPLY_PATH "/drey.internal.v1.Replica/Apply"
#define DREY_REPLICA_BEAT_PATH "/drey.internal.v1.Replica/Beat"
#define DREY_REPLICA_CONFIRM_PATH "/drey.internal.v1.Replica/Confirm"

#endif
