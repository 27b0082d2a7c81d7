/*
 * controller — the elected controller's look at the table, and a restarted
 * node stepping out of its old roles.
 *
 * Once a second, and at every change, the controller takes a snapshot of
 * the table and the members, runs the planners (plan.h) on it and writes
 * every entry they changed, each compared on the epoch it was read at, in
 * transactions of at most DREY_CLUSTER_TXN_OPS. First the first
 * assignment, then the repairs (failover, departed copies, new backups);
 * moves are planned only on a look whose repairs changed nothing, so that
 * they are planned on a table the repairs are in.
 *
 * The old primary of a failed-over partition stopped on its own before:
 * it commits and serves only while its lease is valid by its own clock
 * (router.c), and etcd expires the lease later than that.
 *
 * A node that restarts does not know which of its records its backups had
 * (its journal may hold writes that were never acknowledged; an ephemeral
 * node holds nothing), so before it serves it takes itself out of every
 * entry that named it before it registered, handing each partition it led
 * to a live in-sync backup. It keeps a partition only when nobody else has
 * it, and comes back as a backup by the repairs (a fresh copy).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/journal.h"
#include "drey/log.h"
#include "internal.h"
#include "controller.h"
#include "table.h"
#include "plan.h"

#define CALL_MS 2000
#define STEP_DOWN_TRIES 10

int64_t *drey_cluster__snapshot(drey_cluster *c, drey_cluster__plan *pl) {
    pthread_mutex_lock(&c->mu);
    drey_cluster__plan_init(pl, c->n_parts, c->rf, c->opts.max_moves, c->n_members);
    int64_t *epochs = drey_xcalloc(c->n_parts ? c->n_parts : 1, sizeof *epochs);
    for (uint32_t p = 0; p < c->n_parts; p++) {
        drey_cluster__entry_of(c->entries[p], &pl->ent[p]);
        epochs[p] = c->epochs[p];
    }
    for (size_t i = 0; i < c->n_members; i++)
        drey_cluster__plan_member(pl, c->members[i]->id, c->members[i]->draining);
    pthread_mutex_unlock(&c->mu);
    return epochs;
}

/* Writes the entries pl changed, each if still at its epoch. False when
 * etcd refused or failed (said in the log: the controller looks again). */
static bool write_plan(drey_cluster *c, const drey_cluster__plan *pl, const int64_t *epochs) {
    bool ok = true;
    for (uint32_t p = 0; p < pl->n_parts && ok;) {
        drey_arena a;
        drey_arena_init(&a, NULL, 0);
        drey_etcd_txn t;
        drey_etcd_txn_init(&t, &a);
        size_t ops = 0;
        for (; p < pl->n_parts && ops < DREY_CLUSTER_TXN_OPS; p++) {
            if (pl->changed[p]) {
                drey_cluster__txn_put_entry(c, &t, &a, p, epochs[p], &pl->ent[p]);
                ops++;
            }
        }
        if (ops > 0) {
            Etcdserverpb__TxnResponse *resp;
            drey_etcd_status st;
            ok = drey_etcd_txn_commit(c->etcd, &t, CALL_MS, &a, &resp, &st) == GRPC_STATUS_OK && resp->succeeded;
            if (!ok)
                DREY_LOG_WARN("a partition table write did not apply (the table moved on, or etcd failed); the "
                              "controller will look again", DREY_LOG_STR("error", st.message));
        }
        drey_arena_destroy(&a);
    }
    return ok;
}

static bool any_changed(const drey_cluster__plan *pl) {
    for (uint32_t p = 0; p < pl->n_parts; p++) {
        if (pl->changed[p])
            return true;
    }
    return false;
}

/* Notes when each partition's primary changed, for the rebalance's settle
 * time; only the controller thread reads or writes these. */
static void watch_primaries(drey_cluster *c, const drey_cluster__plan *pl) {
    int64_t now = drey_mono_ms();
    for (uint32_t p = 0; p < pl->n_parts; p++) {
        if (strcmp(c->ctl.seen_primary[p], pl->ent[p].primary) == 0)
            continue;
        if (c->ctl.seen_primary[p][0] != '\0')
            c->ctl.primary_since_ms[p] = now;
        memcpy(c->ctl.seen_primary[p], pl->ent[p].primary, DREY_CLUSTER_MAX_ID);
    }
}

void drey_cluster__control(drey_cluster *c) {
    if (c->ctl.seen_primary == NULL) {
        c->ctl.seen_primary = drey_xcalloc(c->n_parts ? c->n_parts : 1, sizeof *c->ctl.seen_primary);
        c->ctl.primary_since_ms = drey_xcalloc(c->n_parts ? c->n_parts : 1, sizeof *c->ctl.primary_since_ms);
    }
    drey_cluster__plan pl;
    int64_t *epochs = drey_cluster__snapshot(c, &pl);
    watch_primaries(c, &pl);
    pl.primary_since_ms = c->ctl.primary_since_ms;
    pl.now_ms = drey_mono_ms();
    drey_cluster__plan_stats st = {0};
    drey_cluster__plan_assign(&pl, c->initial_nodes, &st);
    if (!any_changed(&pl))
        drey_cluster__plan_repair(&pl, &st);
    bool repaired = any_changed(&pl);
    if (!repaired)
        drey_cluster__plan_rebalance(&pl, &st);
    /* Unknown while repairs come first: waiting until a look says none. */
    atomic_store(&c->ctl.moves_waiting, repaired ? UINT32_MAX : st.waiting);
    bool ok = write_plan(c, &pl, epochs);
    if (ok && st.assigned > 0)
        DREY_LOG_INFO("partitions assigned", DREY_LOG_UINT("partitions", st.assigned),
                      DREY_LOG_UINT("nodes", pl.n_live));
    /* A failover's line is the failover summary every node logs (table.c);
     * backups planned and dropped pass by the dozen. */
    if (ok && (st.promoted > 0 || st.dropped > 0 || st.synced > 0))
        DREY_LOG_(st.promoted > 0 ? DREY_LOG_LEVEL_INFO : DREY_LOG_LEVEL_DEBUG, "partition table repaired", DREY_LOG_UINT("promoted", st.promoted),
                      DREY_LOG_UINT("backups_dropped", st.dropped), DREY_LOG_UINT("backups_planned", st.synced),
                      DREY_LOG_UINT("without_live_copy", st.stranded));
    if (ok && (st.moves > 0 || st.handovers > 0 || st.cancelled > 0 || st.placed > 0 || st.surplus > 0))
        DREY_LOG_INFO("partition moves planned", DREY_LOG_UINT("moves", st.moves),
                      DREY_LOG_UINT("handovers", st.handovers), DREY_LOG_UINT("backups_planned", st.placed),
                      DREY_LOG_UINT("backups_dropped", st.surplus), DREY_LOG_UINT("cancelled", st.cancelled),
                      DREY_LOG_UINT("nodes", pl.n_live));
    if (ok)
        atomic_fetch_add(&c->ctl.failovers, st.promoted);
    free(epochs);
    drey_cluster__plan_free(&pl);
}

/* --- the controller thread --------------------------------------------------------- */

static bool campaign(drey_cluster *c) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    const char *key = drey_cluster__key(c, &a, "controller");
    drey_etcd_txn t;
    drey_etcd_txn_init(&t, &a);
    drey_etcd_txn_if_create_revision(&t, key, DREY_ETCD_EQUAL, 0);
    drey_etcd_txn_put(&t, DREY_ETCD_THEN, key, c->opts.node_id, strlen(c->opts.node_id), c->lease.id);
    Etcdserverpb__TxnResponse *resp;
    drey_etcd_status st;
    bool won = drey_etcd_txn_commit(c->etcd, &t, CALL_MS, &a, &resp, &st) == GRPC_STATUS_OK && resp->succeeded;
    drey_arena_destroy(&a);
    if (won)
        DREY_LOG_INFO("this node is the cluster's controller", DREY_LOG_STR("node_id", c->opts.node_id));
    return won;
}

/* A node whose journal failed (a write or an fdatasync: every later append
 * fails until a restart, include/drey/journal.h) can make nothing durable
 * any more, as a primary or as a backup; its in-sync backups can. It marks
 * itself draining, as a drain does, so the controller hands each partition
 * it leads to an in-sync backup (a handover copies nothing and needs no
 * journal here) and gives its backup roles to others; until a restart.
 * Kafka treats a failed log directory the same way (KIP-112). A journal
 * that only could not get a new segment (ENOSPC) goes on: not this. */
static void hand_off_if_journal_failed(drey_cluster *c) {
    drey_journal *j = c->opts.pipeline != NULL ? drey_pipeline_journal(c->opts.pipeline) : NULL;
    if (j == NULL || c->ctl.journal_failed)
        return;
    drey_journal_stats js;
    drey_journal_get_stats(j, &js);
    if (!js.failed)
        return;
    pthread_mutex_lock(&c->mu);
    c->draining = true;
    pthread_mutex_unlock(&c->mu);
    char err[256];
    if (!drey_cluster__mark_draining(c, err, sizeof err)) {
        DREY_LOG_WARN("this node's journal failed, and it could not mark itself draining yet; trying again",
                      DREY_LOG_STR("error", err));
        return;
    }
    c->ctl.journal_failed = true;
    DREY_LOG_ERROR("this node's journal failed: its partitions go to their in-sync backups until it restarts",
                   DREY_LOG_INT("errno", js.failed_errno));
}

void *drey_cluster__controller_main(void *arg) {
    drey_cluster *c = arg;
    char err[256];
    pthread_mutex_lock(&c->mu);
    while (!c->leaving) {
        bool lost = c->lease_lost;
        bool leader = strcmp(c->controller, c->opts.node_id) == 0;
        bool vacant = c->controller[0] == '\0';
        pthread_mutex_unlock(&c->mu);
        /* Registered again after losing its lease: etcd was away (or this
         * node was cut from it). After an outage longer than a lease etcd
         * revokes every member's lease at its return, and each registers
         * again within a moment: a look before they all have would fail
         * over partitions whose primaries are well, so none for a lease.
         * A controller that kept its lease acts at once (a killed node's
         * partitions fail over within a TTL). */
        if (lost && drey_cluster__register_again(c, err, sizeof err))
            c->ctl.quiet_until_ms = drey_mono_ms() + c->opts.lease_ttl_s * 1000;
        else if (!lost)
            hand_off_if_journal_failed(c);
        if (!lost && vacant)
            leader = campaign(c);
        if (leader && !lost && drey_mono_ms() >= c->ctl.quiet_until_ms)
            drey_cluster__control(c);
        pthread_mutex_lock(&c->mu);
        if (c->leaving)
            break;
        drey_cond_wait_until(&c->cond, &c->mu, drey_deadline_after_ms(1000));
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* --- a restarted node ---------------------------------------------------------------- */

int drey_cluster__step_down(drey_cluster *c, char *err, size_t cap) {
    for (int attempt = 0; attempt < STEP_DOWN_TRIES; attempt++) {
        drey_cluster__plan v;
        int64_t *epochs = drey_cluster__snapshot(c, &v);
        drey_cluster__plan_stats st = {0};
        /* Entries written after this process registered are about it,
         * not about the one before. */
        drey_cluster__plan_step_out(&v, c->opts.node_id, epochs, atomic_load(&c->registered_revision), &st);
        uint32_t left = 0, refused = 0;
        for (uint32_t p = 0; p < v.n_parts; p++) {
            char why[160];
            if (!v.changed[p])
                continue;
            if (drey_cluster__cas_entry(c, p, epochs[p], &v.ent[p], why, sizeof why) == DREY_CLUSTER_CAS_APPLIED)
                left++;
            else
                refused++;
        }
        free(epochs);
        drey_cluster__plan_free(&v);
        if (left > 0 || st.stranded > 0)
            DREY_LOG_INFO("restarted: stepped out of the partitions others hold", DREY_LOG_UINT("left", left),
                          DREY_LOG_UINT("kept_only_copy", st.stranded));
        if (refused == 0)
            return 0;
        /* Someone changed those entries meanwhile: the watch brings the
         * new ones; look again. */
        drey_nap_ms(100 * (attempt + 1));
    }
    snprintf(err, cap, "could not take this node out of the partition entries that name it (etcd kept refusing)");
    return -1;
}
