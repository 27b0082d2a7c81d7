/*
 * table — the table this node keeps of the cluster (table.c), its
 * immutable snapshots for routing (topology.c), and the compared writes
 * that change a partition's entry (entry.c).
 */
#ifndef DREY_CLUSTER_TABLE_H
#define DREY_CLUSTER_TABLE_H

#include "internal.h"

/* <prefix><suffix>, <prefix>partitions/<p>, in a. */
char *drey_cluster__key(const drey_cluster *c, drey_arena *a, const char *suffix);
char *drey_cluster__partition_key(const drey_cluster *c, drey_arena *a, uint32_t p);
/* Join: etcd opened and the cluster's config checked (n_parts, rf known);
 * then registered under a lease kept alive, the table read and watched:
 * the revision read at, or -1 (err says why). */
int drey_cluster__table_open(drey_cluster *c, char *err, size_t cap); /* 0, -1 or DREY_CLUSTER_STOPPED */
int64_t drey_cluster__table_start(drey_cluster *c, char *err, size_t cap);
/* After a lost lease: a new lease and registration (false: not yet). */
bool drey_cluster__register_again(drey_cluster *c, char *err, size_t cap);
/* This node's member entry says it is leaving. */
bool drey_cluster__mark_draining(drey_cluster *c, char *err, size_t cap);
/* Leave: the lease given back. Destroy: everything of the table freed. */
void drey_cluster__table_release(drey_cluster *c);
void drey_cluster__table_free(drey_cluster *c);



/* This node's lease is valid by its own clock. */
bool drey_cluster__lease_valid(drey_cluster *c);

/* Applies a key's value written by this node (the handover) as the watch
 * would, so routing follows at once. */
void drey_cluster__apply_own_write(drey_cluster *c, const char *key, const uint8_t *value, size_t len,
                                   int64_t revision);


drey_cluster__topology *drey_cluster__acquire(drey_cluster *c);
/* Rebuilds the topology from the table; needs c->mu. */
void drey_cluster__publish_locked(drey_cluster *c);
/* WatchTopology streams get the new topology; needs c->mu. */
void drey_cluster__notify_watchers_locked(drey_cluster *c);
void drey_cluster__close_watchers(drey_cluster *c);

/* The registered member named id, or NULL; needs c->mu. */
const Drey__Internal__V1__Member *drey_cluster__member_locked(const drey_cluster *c, const char *id);


/* Adds to t: if p's entry is still at epoch, put e (in a). */
void drey_cluster__txn_put_entry(drey_cluster *c, drey_etcd_txn *t, drey_arena *a, uint32_t p, int64_t epoch,
                                 const drey_cluster__entry *e);

typedef enum drey_cluster__cas {
    DREY_CLUSTER_CAS_APPLIED, /* written, and applied to this node's table */
    DREY_CLUSTER_CAS_REFUSED, /* the entry moved on, or etcd refused: nothing written */
    DREY_CLUSTER_CAS_UNKNOWN, /* etcd did not say (it may have applied) */
} drey_cluster__cas;

/* Writes p's entry if it is still at epoch, applying it to this node's
 * table at once when it did; err says why not. */
drey_cluster__cas drey_cluster__cas_entry(drey_cluster *c, uint32_t p, int64_t epoch, const drey_cluster__entry *e,
                                          char *err, size_t err_cap);

#endif
