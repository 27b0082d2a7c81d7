/*
 * entry — a partition table entry as the controller and the primary edit
 * it, and the compared write that changes it.
 *
 * Every change of an entry is one etcd transaction compared on the epoch
 * (mod_revision) the writer saw: the controller's plans, a primary's
 * handover or the backup it adds or drops, a restarted node stepping down.
 * Two writers racing on one entry therefore serialise, and whoever saw an
 * older table changes nothing.
 */
#include <stdio.h>
#include <string.h>

#include "drey/log.h"
#include "internal.h"
#include "table.h"

#define ETCD_CALL_MS 2000

static void copy_id(char *dst, const char *src) {
    snprintf(dst, DREY_CLUSTER_MAX_ID, "%s", src != NULL ? src : "");
}

void drey_cluster__entry_of(const Drey__Internal__V1__PartitionEntry *e, drey_cluster__entry *out) {
    memset(out, 0, sizeof *out);
    if (e == NULL)
        return;
    copy_id(out->primary, e->primary);
    for (size_t i = 0; i < e->n_replicas; i++)
        drey_cluster__entry_add(out->replicas, &out->n_replicas, e->replicas[i]);
    for (size_t i = 0; i < e->n_syncing; i++)
        drey_cluster__entry_add(out->syncing, &out->n_syncing, e->syncing[i]);
    if (e->n_joining > 0)
        copy_id(out->joining, e->joining[0]);
    copy_id(out->handover, e->handover);
}

bool drey_cluster__entry_has(char (*ids)[DREY_CLUSTER_MAX_ID], size_t n, const char *id) {
    for (size_t i = 0; i < n; i++) {
        if (strcmp(ids[i], id) == 0)
            return true;
    }
    return false;
}

bool drey_cluster__entry_names(const drey_cluster__entry *e, const char *id) {
    char(*replicas)[DREY_CLUSTER_MAX_ID] = (char(*)[DREY_CLUSTER_MAX_ID])e->replicas;
    char(*syncing)[DREY_CLUSTER_MAX_ID] = (char(*)[DREY_CLUSTER_MAX_ID])e->syncing;
    return strcmp(e->primary, id) == 0 || strcmp(e->joining, id) == 0 || strcmp(e->handover, id) == 0 ||
           drey_cluster__entry_has(replicas, e->n_replicas, id) || drey_cluster__entry_has(syncing, e->n_syncing, id);
}

bool drey_cluster__entry_remove(char (*ids)[DREY_CLUSTER_MAX_ID], size_t *n, const char *id) {
    for (size_t i = 0; i < *n; i++) {
        if (strcmp(ids[i], id) == 0) {
            memmove(ids[i], ids[i + 1], (*n - i - 1) * DREY_CLUSTER_MAX_ID);
            (*n)--;
            return true;
        }
    }
    return false;
}

void drey_cluster__entry_add(char (*ids)[DREY_CLUSTER_MAX_ID], size_t *n, const char *id) {
    if (*n < DREY_CLUSTER_MAX_REPLICAS && id[0] != '\0' && !drey_cluster__entry_has(ids, *n, id))
        copy_id(ids[(*n)++], id);
}

bool drey_cluster__entry_drop_replica(drey_cluster__entry *e, const char *id) {
    if (strcmp(e->handover, id) == 0)
        e->handover[0] = '\0';
    return drey_cluster__entry_remove(e->replicas, &e->n_replicas, id);
}

static char **id_list(drey_arena *a, char (*ids)[DREY_CLUSTER_MAX_ID], size_t n) {
    char **out = drey_arena_alloc(a, (n ? n : 1) * sizeof *out);
    for (size_t i = 0; i < n; i++)
        out[i] = ids[i];
    return out;
}

static uint8_t *pack(drey_arena *a, const drey_cluster__entry *e, size_t *len) {
    drey_cluster__entry *x = (drey_cluster__entry *)e;
    Drey__Internal__V1__PartitionEntry pe = DREY__INTERNAL__V1__PARTITION_ENTRY__INIT;
    pe.primary = x->primary;
    pe.replicas = id_list(a, x->replicas, x->n_replicas);
    pe.n_replicas = x->n_replicas;
    pe.syncing = id_list(a, x->syncing, x->n_syncing);
    pe.n_syncing = x->n_syncing;
    char *j[1] = {x->joining};
    if (x->joining[0] != '\0') {
        pe.joining = j;
        pe.n_joining = 1;
    }
    pe.handover = x->handover;
    *len = drey__internal__v1__partition_entry__get_packed_size(&pe);
    uint8_t *buf = drey_arena_alloc(a, *len ? *len : 1);
    drey__internal__v1__partition_entry__pack(&pe, buf);
    return buf;
}

void drey_cluster__txn_put_entry(drey_cluster *c, drey_etcd_txn *t, drey_arena *a, uint32_t p, int64_t epoch,
                                 const drey_cluster__entry *e) {
    size_t len;
    uint8_t *buf = pack(a, e, &len);
    const char *key = drey_cluster__partition_key(c, a, p);
    drey_etcd_txn_if_mod_revision(t, key, DREY_ETCD_EQUAL, epoch);
    drey_etcd_txn_put(t, DREY_ETCD_THEN, key, buf, len, 0);
}

drey_cluster__cas drey_cluster__cas_entry(drey_cluster *c, uint32_t p, int64_t epoch, const drey_cluster__entry *e,
                                          char *err, size_t err_cap) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    size_t len;
    uint8_t *buf = pack(&a, e, &len);
    const char *key = drey_cluster__partition_key(c, &a, p);
    drey_etcd_txn t;
    drey_etcd_txn_init(&t, &a);
    drey_etcd_txn_if_mod_revision(&t, key, DREY_ETCD_EQUAL, epoch);
    drey_etcd_txn_put(&t, DREY_ETCD_THEN, key, buf, len, 0);
    Etcdserverpb__TxnResponse *resp;
    drey_etcd_status st;
    drey_cluster__cas out;
    if (drey_etcd_txn_commit(c->etcd, &t, ETCD_CALL_MS, &a, &resp, &st) == GRPC_STATUS_OK) {
        out = resp->succeeded ? DREY_CLUSTER_CAS_APPLIED : DREY_CLUSTER_CAS_REFUSED;
        if (out == DREY_CLUSTER_CAS_APPLIED && resp->header != NULL)
            drey_cluster__apply_own_write(c, key, buf, len, resp->header->revision);
        if (out == DREY_CLUSTER_CAS_REFUSED)
            snprintf(err, err_cap, "the partition's entry changed since epoch %lld", (long long)epoch);
    } else {
        out = st.may_have_applied ? DREY_CLUSTER_CAS_UNKNOWN : DREY_CLUSTER_CAS_REFUSED;
        snprintf(err, err_cap, "etcd: %s", st.message);
    }
    drey_arena_destroy(&a);
    return out;
}
