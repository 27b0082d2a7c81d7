/*
 * member — joining the cluster, watching its table, and the controller.
 *
 * Join: read and check the cluster's config, take a lease, register the
 * node under it (waiting for an earlier registration of the same id to
 * expire: two processes must never share an id), keep the lease alive on a
 * stream, read everything under the prefix and watch it from there. The
 * watch's callbacks run on the etcd client's thread and only update the
 * table and publish a new topology; everything that calls etcd runs on the
 * controller thread, woken by every change and once a second.
 *
 * The controller thread of every node stands for controller (a transaction
 * that puts <prefix>controller under the node's lease if nobody holds it).
 * The node that holds it reconciles the partition table: today, the first
 * assignment of unassigned partitions by rendezvous hashing once the
 * cluster's initial_nodes are members. Each write compares the entry's
 * mod_revision (its epoch) with the one this node saw, so a deposed or
 * stale controller changes nothing; a new controller resumes from whatever
 * the table says.
 *
 * A lost lease (etcd unreachable past the TTL, or the node paused) takes the
 * node out of the membership; the controller thread registers it again with
 * a new lease once etcd answers, while routing goes on with the last table.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/log.h"
#include "drey/placement.h"
#include "internal.h"

#define CALL_MS 2000

static char *xstrdup(const char *s) {
    return drey_xstrdup(s != NULL ? s : "");
}

static char *key_of(const drey_cluster *c, drey_arena *a, const char *suffix) {
    return drey_arena_sprintf(a, "%s%s", c->prefix, suffix);
}

char *drey_cluster__partition_key(const drey_cluster *c, drey_arena *a, uint32_t p) {
    return drey_arena_sprintf(a, "%spartitions/%05" PRIu32, c->prefix, p);
}

/* Replaces the keepalive (NULL: none) and stops the old one. Under
 * lease_mu: request threads read it for the lease's validity. */
static void set_keepalive(drey_cluster *c, drey_etcd_keepalive *ka) {
    pthread_mutex_lock(&c->lease_mu);
    drey_etcd_keepalive *old = c->keepalive;
    c->keepalive = ka;
    pthread_mutex_unlock(&c->lease_mu);
    drey_etcd_keepalive_stop(old);
}

void drey_cluster__nap_ms(int64_t ms) {
    if (ms <= 0)
        return;
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* --- the table ------------------------------------------------------------- */

static void remove_member_locked(drey_cluster *c, const char *id, size_t len) {
    for (size_t i = 0; i < c->n_members; i++) {
        if (strlen(c->members[i]->id) == len && memcmp(c->members[i]->id, id, len) == 0) {
            drey__internal__v1__member__free_unpacked(c->members[i], NULL);
            c->members[i] = c->members[--c->n_members];
            return;
        }
    }
}

/* Applies one key's new value (NULL: deleted) to the table; needs c->mu. */
static void apply_kv_locked(drey_cluster *c, const Mvccpb__KeyValue *kv, bool deleted) {
    size_t plen = strlen(c->prefix);
    if (kv->key.len <= plen || memcmp(kv->key.data, c->prefix, plen) != 0)
        return;
    const char *rest = (const char *)kv->key.data + plen;
    size_t rlen = kv->key.len - plen;
    if (rlen > 6 && memcmp(rest, "nodes/", 6) == 0) {
        remove_member_locked(c, rest + 6, rlen - 6);
        if (deleted)
            return;
        Drey__Internal__V1__Member *m = drey__internal__v1__member__unpack(NULL, kv->value.len, kv->value.data);
        if (m == NULL) {
            DREY_LOG_WARN("undecodable member entry in etcd", DREY_LOG_INT("revision", kv->mod_revision));
            return;
        }
        if (c->n_members == c->cap_members) {
            c->cap_members = c->cap_members ? c->cap_members * 2 : 8;
            c->members = drey_xrealloc(c->members, c->cap_members, sizeof *c->members);
        }
        c->members[c->n_members++] = m;
    } else if (rlen == 10 && memcmp(rest, "controller", 10) == 0) {
        size_t n = deleted ? 0 : kv->value.len < sizeof c->controller - 1 ? kv->value.len : sizeof c->controller - 1;
        if (n > 0) /* a deleted key's value is empty, its data NULL */
            memcpy(c->controller, kv->value.data, n);
        c->controller[n] = '\0';
    } else if (rlen == 16 && memcmp(rest, "partitions/", 11) == 0) {
        char digits[6];
        memcpy(digits, rest + 11, 5);
        digits[5] = '\0';
        char *end;
        unsigned long p = strtoul(digits, &end, 10);
        if (*end != '\0' || p >= c->n_parts)
            return;
        if (c->entries[p] != NULL)
            drey__internal__v1__partition_entry__free_unpacked(c->entries[p], NULL);
        c->entries[p] = NULL;
        c->epochs[p] = 0;
        if (deleted)
            return;
        c->entries[p] = drey__internal__v1__partition_entry__unpack(NULL, kv->value.len, kv->value.data);
        c->epochs[p] = kv->mod_revision;
    }
}

void drey_cluster__apply_own_write(drey_cluster *c, const char *key, const uint8_t *value, size_t len,
                                   int64_t revision) {
    Mvccpb__KeyValue kv = MVCCPB__KEY_VALUE__INIT;
    kv.key = (ProtobufCBinaryData){.len = strlen(key), .data = (uint8_t *)key};
    kv.value = (ProtobufCBinaryData){.len = len, .data = (uint8_t *)value};
    kv.mod_revision = revision;
    pthread_mutex_lock(&c->mu);
    /* Unless the watch brought it (or something newer) already. The
     * table's revision stays the watch's: it says which events were seen. */
    size_t plen = strlen(c->prefix);
    unsigned long p = strtoul(key + plen + 11, NULL, 10);
    if (p < c->n_parts && c->epochs[p] < revision) {
        apply_kv_locked(c, &kv, false);
        drey_cluster__publish_locked(c);
        pthread_cond_broadcast(&c->cond);
    }
    pthread_mutex_unlock(&c->mu);
}

static void on_events(void *user, Mvccpb__Event *const *events, size_t n) {
    drey_cluster *c = user;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < n; i++) {
        const Mvccpb__KeyValue *kv = events[i]->kv;
        if (kv == NULL)
            continue;
        apply_kv_locked(c, kv, events[i]->type == MVCCPB__EVENT__EVENT_TYPE__DELETE);
        if (kv->mod_revision > c->revision)
            c->revision = kv->mod_revision;
    }
    drey_cluster__publish_locked(c);
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->mu);
}

static void on_watch_end(void *user, const drey_etcd_watch_end *end) {
    drey_cluster *c = user;
    DREY_LOG_ERROR("the cluster table's watch ended; routing goes on with the last table",
                   DREY_LOG_INT("reason", end->reason), DREY_LOG_STR("message", end->message ? end->message : ""));
    pthread_mutex_lock(&c->mu);
    c->watch_ended = true;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->mu);
}

/* Reads everything under the prefix into the table; returns the revision
 * read at, or -1. */
static int64_t load_table(drey_cluster *c, char *err, size_t cap) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    Etcdserverpb__RangeResponse *resp;
    drey_etcd_status st;
    int64_t rev = -1;
    if (drey_etcd_get(c->etcd, c->prefix, true, CALL_MS, &a, &resp, &st) != GRPC_STATUS_OK) {
        snprintf(err, cap, "cannot read the cluster table from etcd (%s): %s", st.endpoint, st.message);
        goto out;
    }
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < resp->n_kvs; i++)
        apply_kv_locked(c, resp->kvs[i], false);
    rev = resp->header != NULL ? resp->header->revision : 0;
    c->revision = rev;
    drey_cluster__publish_locked(c);
    pthread_mutex_unlock(&c->mu);
out:
    drey_arena_destroy(&a);
    return rev;
}

/* --- membership ------------------------------------------------------------- */

static void on_lease_lost(void *user, drey_etcd_lease_loss why) {
    drey_cluster *c = user;
    DREY_LOG_ERROR("this node's etcd lease is lost; it will register again once etcd answers",
                   DREY_LOG_STR("why", why == DREY_ETCD_LEASE_EXPIRED ? "expired" : "unconfirmed"));
    pthread_mutex_lock(&c->mu);
    c->lease_lost = true;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->mu);
}

/* This node's member entry; 0 if it does not fit. */
static size_t pack_member(drey_cluster *c, uint8_t *buf, size_t cap) {
    Drey__Internal__V1__Member m = DREY__INTERNAL__V1__MEMBER__INIT;
    m.id = (char *)c->opts.node_id;
    m.advertise = (char *)c->opts.advertise;
    m.internal = (char *)c->opts.internal;
    m.build = (char *)(c->opts.build != NULL ? c->opts.build : "");
    pthread_mutex_lock(&c->mu);
    m.draining = c->draining;
    pthread_mutex_unlock(&c->mu);
    size_t len = drey__internal__v1__member__get_packed_size(&m);
    if (len > cap)
        return 0;
    drey__internal__v1__member__pack(&m, buf);
    return len;
}

/* Takes a lease and puts nodes/<id> under it, waiting up to wait_ms for an
 * earlier registration of the id to go. 0, or -1 with err. */
/* Puts nodes/<id> under the node's lease if its create_revision compares
 * with 0 as cmp says (EQUAL: nobody holds it; NOT_EQUAL: this node does).
 * *applied: the put happened. */
static grpc_status_code put_member(drey_cluster *c, drey_etcd_cmp cmp, const uint8_t *buf, size_t len, bool *applied,
                                   drey_etcd_status *st) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    const char *key = drey_arena_sprintf(&a, "%snodes/%s", c->prefix, c->opts.node_id);
    drey_etcd_txn t;
    drey_etcd_txn_init(&t, &a);
    drey_etcd_txn_if_create_revision(&t, key, cmp, 0);
    drey_etcd_txn_put(&t, DREY_ETCD_THEN, key, buf, len, c->lease.id);
    Etcdserverpb__TxnResponse *resp;
    grpc_status_code code = drey_etcd_txn_commit(c->etcd, &t, CALL_MS, &a, &resp, st);
    *applied = code == GRPC_STATUS_OK && resp->succeeded;
    if (*applied && cmp == DREY_ETCD_EQUAL && resp->header != NULL)
        c->registered_revision = resp->header->revision;
    drey_arena_destroy(&a);
    return code;
}

/* A lease nothing keeps alive yet: a fresh one while the wait for an
 * earlier registration goes on longer than half its TTL. */
static int fresh_lease(drey_cluster *c, int64_t *granted_ms, char *err, size_t cap) {
    drey_etcd_status st;
    if (c->lease.id != 0 && drey_mono_ms() - *granted_ms < c->opts.lease_ttl_s * 1000 / 2)
        return 0;
    if (c->lease.id != 0)
        drey_etcd_lease_revoke(c->etcd, c->lease.id, CALL_MS, &st); /* else it expires by itself */
    c->lease.id = 0;
    if (drey_etcd_lease_grant(c->etcd, c->opts.lease_ttl_s, CALL_MS, &c->lease, &st) != GRPC_STATUS_OK) {
        snprintf(err, cap, "cannot take a lease from etcd (%s): %s", st.endpoint, st.message);
        return -1;
    }
    *granted_ms = drey_mono_ms();
    return 0;
}

static int register_node(drey_cluster *c, int64_t wait_ms, char *err, size_t cap) {
    drey_etcd_status st;
    int64_t granted_ms = 0;
    c->lease.id = 0; /* a lost one is gone: never reused */
    uint8_t buf[1024];
    size_t len = pack_member(c, buf, sizeof buf);
    if (len == 0) {
        snprintf(err, cap, "the node id or addresses are too long");
        return -1;
    }
    int64_t until = drey_mono_ms() + wait_ms;
    bool told = false;
    for (;;) {
        if (fresh_lease(c, &granted_ms, err, cap) != 0)
            return -1;
        bool ok;
        grpc_status_code code = put_member(c, DREY_ETCD_EQUAL, buf, len, &ok, &st);
        if (ok)
            return 0;
        if (code != GRPC_STATUS_OK && !st.may_have_applied) {
            snprintf(err, cap, "cannot register in etcd (%s): %s", st.endpoint, st.message);
            return -1;
        }
        if (drey_mono_ms() >= until) {
            snprintf(err, cap,
                     "node id %s is registered by another process (or a previous run whose lease has not "
                     "expired): refusing to share it",
                     c->opts.node_id);
            return -1;
        }
        if (!told)
            DREY_LOG_INFO("waiting for an earlier registration of this node id to expire",
                          DREY_LOG_STR("node_id", c->opts.node_id));
        told = true;
        drey_cluster__nap_ms(100);
    }
}

static bool check_config(drey_cluster *c, char *err, size_t cap) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    bool ok = false;
    Etcdserverpb__RangeResponse *resp;
    drey_etcd_status st;
    const char *key = key_of(c, &a, "config");
    if (drey_etcd_get(c->etcd, key, false, CALL_MS, &a, &resp, &st) != GRPC_STATUS_OK) {
        snprintf(err, cap, "cannot reach etcd at %s: %s", c->opts.etcd, st.message);
        goto out;
    }
    if (resp->n_kvs == 0) {
        snprintf(err, cap, "no cluster under %s in etcd: run `drey cluster init --etcd=%s` first", c->prefix,
                 c->opts.etcd);
        goto out;
    }
    Drey__Internal__V1__ClusterConfig *cfg = drey__internal__v1__cluster_config__unpack(
        drey_arena_protobuf_allocator(&a), resp->kvs[0]->value.len, resp->kvs[0]->value.data);
    if (cfg == NULL || cfg->format != DREY__INTERNAL__V1__CLUSTER_CONFIG__FORMAT__FORMAT_V1 || cfg->hash_function != 1) {
        snprintf(err, cap, "the cluster's config under %s is of a format this build does not know (format %u)",
                 key, cfg != NULL ? cfg->format : 0);
        goto out;
    }
    if (c->opts.partitions != 0 && c->opts.partitions != cfg->partitions) {
        snprintf(err, cap, "the cluster has %u partitions and this node was started for %u: refusing to join",
                 cfg->partitions, c->opts.partitions);
        goto out;
    }
    if (cfg->partitions == 0 || cfg->partitions > 65536 || cfg->replication_factor == 0) {
        snprintf(err, cap, "the cluster's config is unusable (%u partitions, %u replicas)", cfg->partitions,
                 cfg->replication_factor);
        goto out;
    }
    if (cfg->replication_factor > DREY_CLUSTER_MAX_RF) {
        snprintf(err, cap, "the cluster asks for %u replicas; this build keeps at most %d", cfg->replication_factor,
                 DREY_CLUSTER_MAX_RF);
        goto out;
    }
    c->n_parts = cfg->partitions;
    c->rf = cfg->replication_factor;
    c->initial_nodes = cfg->initial_nodes > 0 ? cfg->initial_nodes : 1;
    ok = true;
out:
    drey_arena_destroy(&a);
    return ok;
}

drey_cluster *drey_cluster_create(const drey_cluster_options *opts, char *err, size_t cap) {
    drey_cluster *c = drey_xcalloc(1, sizeof *c);
    c->opts = *opts;
    c->opts.node_id = xstrdup(opts->node_id);
    c->opts.advertise = xstrdup(opts->advertise);
    c->opts.internal = xstrdup(opts->internal);
    c->opts.etcd = xstrdup(opts->etcd);
    c->opts.build = xstrdup(opts->build);
    size_t pl = strlen(opts->prefix);
    c->prefix = drey_xmalloc(pl + 2);
    snprintf(c->prefix, pl + 2, "%s%s", opts->prefix, pl > 0 && opts->prefix[pl - 1] == '/' ? "" : "/");
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cond, NULL);
    pthread_mutex_init(&c->move_mu, NULL);
    pthread_cond_init(&c->move_cond, NULL);
    pthread_mutex_init(&c->shrink_mu, NULL);
    pthread_mutex_init(&c->rooms_mu, NULL);
    pthread_mutex_init(&c->lease_mu, NULL);
    pthread_cond_init(&c->shrink_cond, NULL);
    if (c->opts.replication_timeout_ms <= 0)
        c->opts.replication_timeout_ms = 1000;
    if (c->opts.min_in_sync == 0)
        c->opts.min_in_sync = 1;
    /* Room for a clock running a little fast against etcd's, and for the
     * time etcd takes to act on an expiry it decided. */
    c->lease_margin_ns = 200 * 1000000LL;
    atomic_store(&c->moving, -1);
    pthread_mutex_lock(&c->mu);
    drey_cluster__publish_locked(c); /* an empty table until joined */
    pthread_mutex_unlock(&c->mu);
    c->peers = drey_cluster__peers_create(opts->tls_cert, opts->tls_key, opts->tls_ca, err, cap);
    if (c->peers == NULL ||
        (opts->peer_addresses != NULL && !drey_cluster__peers_dial_via(c->peers, opts->peer_addresses, err, cap))) {
        drey_cluster_destroy(c);
        return NULL;
    }
    return c;
}

void drey_cluster_set_addresses(drey_cluster *c, const char *advertise, const char *internal) {
    free((char *)c->opts.advertise);
    free((char *)c->opts.internal);
    c->opts.advertise = xstrdup(advertise);
    c->opts.internal = xstrdup(internal);
}

int drey_cluster_join(drey_cluster *c, char *err, size_t cap) {
    c->etcd = drey_etcd_open(&(drey_etcd_options){.endpoints = c->opts.etcd,
                                                  .tls = c->opts.etcd_tls,
                                                  .user = c->opts.etcd_user,
                                                  .password_file = c->opts.etcd_password_file},
                             err, cap);
    if (c->etcd == NULL || !check_config(c, err, cap))
        return -1;
    c->entries = drey_xcalloc(c->n_parts, sizeof *c->entries);
    c->epochs = drey_xcalloc(c->n_parts, sizeof *c->epochs);
    c->pstate = drey_xcalloc(c->n_parts, sizeof *c->pstate);
    c->lines = drey_xcalloc(c->n_parts, sizeof *c->lines);
    for (uint32_t p = 0; p < c->n_parts; p++)
        pthread_mutex_init(&c->lines[p].mu, NULL);
    if (register_node(c, 3 * 1000 * c->opts.lease_ttl_s + 2000, err, cap) != 0)
        return -1;
    set_keepalive(c, drey_etcd_keepalive_start(c->etcd, &c->lease, on_lease_lost, c));
    int64_t rev = load_table(c, err, cap);
    if (rev < 0)
        return -1;
    drey_etcd_watch_options wo = {
        .key = c->prefix,
        .prefix = true,
        .start_revision = rev + 1,
        .on_events = on_events,
        .on_end = on_watch_end,
        .user = c,
    };
    c->watch = drey_etcd_watch_start(c->etcd, &wo);
    if (c->rf > 1 && drey_cluster__step_down(c, err, cap) != 0)
        return -1;
    if (pthread_create(&c->controller_thread, NULL, drey_cluster__controller_main, c) != 0)
        abort();
    c->controller_running = true;
    if (c->opts.store != NULL) {
        if (pthread_create(&c->mover_thread, NULL, drey_cluster__mover_main, c) != 0)
            abort();
        c->mover_running = true;
    }
    if (pthread_create(&c->shrinker_thread, NULL, drey_cluster__shrinker_main, c) != 0 ||
        pthread_create(&c->beater_thread, NULL, drey_cluster__beater_main, c) != 0)
        abort();
    c->shrinker_running = true;
    DREY_LOG_INFO("joined the cluster", DREY_LOG_STR("node_id", c->opts.node_id),
                  DREY_LOG_UINT("partitions", c->n_parts), DREY_LOG_INT("revision", rev),
                  DREY_LOG_INT("lease_ttl_s", c->lease.ttl_s));
    return 0;
}

static size_t pending_writes(drey_cluster *c) {
    size_t n = 0;
    for (uint32_t p = 0; c->lines != NULL && p < c->n_parts; p++) {
        pthread_mutex_lock(&c->lines[p].mu);
        n += c->lines[p].queued;
        pthread_mutex_unlock(&c->lines[p].mu);
    }
    return n;
}

static void stop_shrinker(drey_cluster *c) {
    if (!c->shrinker_running)
        return;
    pthread_mutex_lock(&c->shrink_mu);
    c->shrink_stop = true;
    pthread_cond_broadcast(&c->shrink_cond);
    pthread_mutex_unlock(&c->shrink_mu);
    pthread_join(c->shrinker_thread, NULL);
    pthread_join(c->beater_thread, NULL);
    c->shrinker_running = false;
}

void drey_cluster_leave(drey_cluster *c) {
    if (c == NULL)
        return;
    pthread_mutex_lock(&c->mu);
    bool was = c->leaving;
    c->leaving = true;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->mu);
    if (was)
        return;
    drey_cluster__close_watchers(c);
    if (c->controller_running) {
        pthread_join(c->controller_thread, NULL);
        c->controller_running = false;
    }
    if (c->mover_running) {
        pthread_join(c->mover_thread, NULL);
        c->mover_running = false;
    }
    /* Writes waiting for their backups finish while the lease still says
     * this node leads (bounded: a backup that does not answer is dropped
     * within the replication timeout); what is left is answered as of
     * unknown outcome. */
    int64_t until = drey_mono_ms() + c->opts.replication_timeout_ms + 1000;
    while (pending_writes(c) > 0 && drey_mono_ms() < until)
        drey_cluster__nap_ms(10);
    stop_shrinker(c);
    drey_cluster__abandon_lines(c);
    set_keepalive(c, NULL);
    if (c->lease.id != 0) {
        drey_etcd_status st;
        if (drey_etcd_lease_revoke(c->etcd, c->lease.id, CALL_MS, &st) != GRPC_STATUS_OK)
            DREY_LOG_WARN("could not revoke the lease; it expires by itself", DREY_LOG_STR("error", st.message));
        c->lease.id = 0;
    }
    DREY_LOG_INFO("left the cluster", DREY_LOG_STR("node_id", c->opts.node_id));
}

static uint32_t owned_locked(const drey_cluster *c) {
    uint32_t n = 0;
    for (uint32_t p = 0; p < c->n_parts; p++)
        n += c->entries[p] != NULL && strcmp(c->entries[p]->primary, c->opts.node_id) == 0;
    return n;
}

uint32_t drey_cluster_drain(drey_cluster *c, int64_t timeout_ms) {
    if (c == NULL || c->etcd == NULL)
        return 0;
    pthread_mutex_lock(&c->mu);
    c->draining = true;
    uint32_t owned = owned_locked(c);
    bool someone = false; /* to take the partitions */
    for (size_t i = 0; i < c->n_members && !someone; i++)
        someone = !c->members[i]->draining && strcmp(c->members[i]->id, c->opts.node_id) != 0;
    pthread_mutex_unlock(&c->mu);
    if (owned == 0 || timeout_ms <= 0)
        return owned;
    if (!someone) {
        DREY_LOG_WARN("draining: no other node can take this node's partitions; they are unavailable until it "
                      "returns", DREY_LOG_UINT("partitions", owned));
        return owned;
    }
    uint8_t buf[1024];
    size_t len = pack_member(c, buf, sizeof buf);
    drey_etcd_status st;
    bool marked;
    /* Only over this node's own registration. */
    put_member(c, DREY_ETCD_NOT_EQUAL, buf, len, &marked, &st);
    if (!marked) {
        DREY_LOG_WARN("could not mark this node draining in etcd; its partitions stay here",
                      DREY_LOG_STR("error", st.message));
        return owned;
    }
    DREY_LOG_INFO("draining: moving this node's partitions to the others", DREY_LOG_UINT("partitions", owned),
                  DREY_LOG_INT("timeout_ms", timeout_ms));
    int64_t until = drey_deadline_after_ms(timeout_ms);
    pthread_mutex_lock(&c->mu);
    while ((owned = owned_locked(c)) > 0 && !c->leaving) {
        if (drey_cond_wait_until(&c->cond, &c->mu, until) == ETIMEDOUT) {
            owned = owned_locked(c);
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
    if (owned > 0)
        DREY_LOG_WARN("drain timed out: partitions still on this node are unavailable until it returns",
                      DREY_LOG_UINT("partitions", owned));
    else
        DREY_LOG_INFO("drained: this node owns no partition");
    return owned;
}

void drey_cluster_destroy(drey_cluster *c) {
    if (c == NULL)
        return;
    pthread_mutex_lock(&c->mu);
    c->leaving = true;
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->mu);
    if (c->controller_running)
        pthread_join(c->controller_thread, NULL);
    if (c->mover_running)
        pthread_join(c->mover_thread, NULL);
    stop_shrinker(c);
    drey_cluster__abandon_lines(c);
    set_keepalive(c, NULL);
    drey_etcd_watch_close(c->watch);
    drey_etcd_close(c->etcd);
    drey_cluster__subs_destroy(c->subs); /* its calls run on the peers' channels */
    drey_cluster__peers_destroy(c->peers);
    for (drey_cluster__shrink *s = c->shrinks, *next; s != NULL; s = next) {
        next = s->next;
        free(s);
    }
    for (uint32_t p = 0; c->lines != NULL && p < c->n_parts; p++)
        pthread_mutex_destroy(&c->lines[p].mu);
    free(c->lines);
    pthread_mutex_destroy(&c->shrink_mu);
    pthread_mutex_destroy(&c->rooms_mu);
    pthread_mutex_destroy(&c->lease_mu);
    pthread_cond_destroy(&c->shrink_cond);
    for (size_t i = 0; i < c->n_members; i++)
        drey__internal__v1__member__free_unpacked(c->members[i], NULL);
    free(c->members);
    for (uint32_t p = 0; c->entries != NULL && p < c->n_parts; p++) {
        if (c->entries[p] != NULL)
            drey__internal__v1__partition_entry__free_unpacked(c->entries[p], NULL);
    }
    free(c->entries);
    free(c->epochs);
    free(c->pstate);
    for (drey_cluster__dirty *d = c->dirty, *next; d != NULL; d = next) {
        next = d->next;
        free(d);
    }
    pthread_mutex_destroy(&c->move_mu);
    pthread_cond_destroy(&c->move_cond);
    drey_cluster__topology_unref(c->topo);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cond);
    free((char *)c->opts.node_id);
    free((char *)c->opts.advertise);
    free((char *)c->opts.internal);
    free((char *)c->opts.etcd);
    free((char *)c->opts.build);
    free(c->prefix);
    free(c);
}

/* --- the controller --------------------------------------------------------- */

static bool campaign(drey_cluster *c) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    const char *key = key_of(c, &a, "controller");
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

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

const Drey__Internal__V1__Member *drey_cluster__member_locked(const drey_cluster *c, const char *id) {
    for (size_t i = 0; i < c->n_members; i++) {
        if (strcmp(c->members[i]->id, id) == 0)
            return c->members[i];
    }
    return NULL;
}

bool drey_cluster__commit_table_writes(drey_cluster *c, const drey_etcd_txn *t, drey_arena *a, size_t ops) {
    if (ops == 0)
        return true;
    Etcdserverpb__TxnResponse *resp;
    drey_etcd_status st;
    bool ok = drey_etcd_txn_commit(c->etcd, t, CALL_MS, a, &resp, &st) == GRPC_STATUS_OK && resp->succeeded;
    if (!ok)
        DREY_LOG_WARN("a partition table write did not apply (the table moved on, or etcd failed); the controller "
                      "will look again", DREY_LOG_STR("error", st.message));
    return ok;
}

/* The first assignment: every partition without an owner gets the node
 * rendezvous hashing ranks first among the members, once there are enough
 * of them. Returns false when etcd refused or failed (retried later). */
static bool assign_unowned(drey_cluster *c) {
    pthread_mutex_lock(&c->mu);
    size_t n = c->n_members;
    uint32_t unowned = 0;
    for (uint32_t p = 0; p < c->n_parts; p++)
        unowned += c->entries[p] == NULL || c->entries[p]->primary[0] == '\0';
    bool first = unowned == c->n_parts;
    if (unowned == 0 || n == 0 || (first && n < c->initial_nodes)) {
        pthread_mutex_unlock(&c->mu);
        return true;
    }
    char **ids = drey_xcalloc(n, sizeof *ids);
    int64_t *epochs = drey_xcalloc(c->n_parts, sizeof *epochs);
    bool *want = drey_xcalloc(c->n_parts, sizeof *want);
    for (size_t i = 0; i < n; i++)
        ids[i] = xstrdup(c->members[i]->id);
    for (uint32_t p = 0; p < c->n_parts; p++) {
        epochs[p] = c->epochs[p];
        want[p] = c->entries[p] == NULL || c->entries[p]->primary[0] == '\0';
    }
    pthread_mutex_unlock(&c->mu);

    qsort(ids, n, sizeof *ids, cmp_str);
    /* Every copy starts empty, so the backups are in sync from the start. */
    uint32_t r = drey_placement_replicas(c->rf, n);
    uint32_t *assign = drey_xmalloc((size_t)c->n_parts * r * sizeof *assign);
    drey_placement_assign((const char *const *)ids, n, c->n_parts, c->rf, assign);
    bool ok = true;
    for (uint32_t p0 = 0; p0 < c->n_parts && ok;) {
        drey_arena a;
        drey_arena_init(&a, NULL, 0);
        drey_etcd_txn t;
        drey_etcd_txn_init(&t, &a);
        size_t ops = 0;
        uint32_t p = p0;
        for (; p < c->n_parts && ops < DREY_CLUSTER_TXN_OPS; p++) {
            if (!want[p])
                continue;
            drey_cluster__entry e;
            drey_cluster__entry_of(NULL, &e);
            snprintf(e.primary, sizeof e.primary, "%s", ids[assign[p * r]]);
            for (uint32_t k = 1; k < r; k++)
                drey_cluster__entry_add(e.replicas, &e.n_replicas, ids[assign[p * r + k]]);
            drey_cluster__txn_put_entry(c, &t, &a, p, epochs[p], &e);
            ops++;
        }
        p0 = p;
        ok = drey_cluster__commit_table_writes(c, &t, &a, ops);
        drey_arena_destroy(&a);
    }
    if (ok)
        DREY_LOG_INFO("partitions assigned", DREY_LOG_UINT("partitions", unowned), DREY_LOG_UINT("nodes", n));
    for (size_t i = 0; i < n; i++)
        free(ids[i]);
    free(ids);
    free(epochs);
    free(want);
    free(assign);
    return ok;
}

/* A node the placement counts: a member that is not leaving, or a node that
 * owns partitions but is not a member now (down: its data waits for it on
 * its disk, so its partitions stay planned where they are). */
typedef struct planned {
    char **ids;   /* sorted */
    size_t n;
    bool *member; /* by index: registered now */
    uint32_t *moving_out;
} planned;

static int planned_index(const planned *pl, const char *id) {
    for (size_t i = 0; i < pl->n; i++) {
        if (strcmp(pl->ids[i], id) == 0)
            return (int)i;
    }
    return -1;
}

/* Plans moves toward the placement of the nodes that should hold data: a
 * partition whose owner is not the one rendezvous hashing ranks first gets
 * that node as `joining` (its owner then moves it: move.c), at most
 * max_moves per owner at a time; a plan whose new node left is cancelled.
 * Only once every partition has an owner. */
static bool rebalance(drey_cluster *c) {
    pthread_mutex_lock(&c->mu);
    planned pl = {.ids = drey_xcalloc(c->n_members + c->n_parts, sizeof *pl.ids)};
    for (uint32_t p = 0; p < c->n_parts; p++) {
        if (c->entries[p] == NULL || c->entries[p]->primary[0] == '\0') {
            pthread_mutex_unlock(&c->mu);
            free(pl.ids);
            return true;
        }
    }
    for (size_t i = 0; i < c->n_members; i++) {
        if (!c->members[i]->draining)
            pl.ids[pl.n++] = xstrdup(c->members[i]->id);
    }
    size_t n_live = pl.n;
    for (uint32_t p = 0; p < c->n_parts; p++) {
        const char *o = c->entries[p]->primary;
        bool known = false;
        for (size_t i = 0; i < c->n_members && !known; i++)
            known = strcmp(c->members[i]->id, o) == 0;
        for (size_t i = n_live; i < pl.n && !known; i++)
            known = strcmp(pl.ids[i], o) == 0;
        if (!known)
            pl.ids[pl.n++] = xstrdup(o);
    }
    qsort(pl.ids, pl.n, sizeof *pl.ids, cmp_str);
    pl.member = drey_xcalloc(pl.n ? pl.n : 1, sizeof *pl.member);
    pl.moving_out = drey_xcalloc(pl.n ? pl.n : 1, sizeof *pl.moving_out);
    for (size_t i = 0; i < c->n_members; i++) {
        int k = planned_index(&pl, c->members[i]->id);
        if (k >= 0)
            pl.member[k] = true;
    }
    /* What the table says, copied out of the lock. */
    drey_cluster__entry *ent = drey_xcalloc(c->n_parts, sizeof *ent);
    int64_t *epochs = drey_xcalloc(c->n_parts, sizeof *epochs);
    bool *owner_member = drey_xcalloc(c->n_parts, sizeof *owner_member);
    for (uint32_t p = 0; p < c->n_parts; p++) {
        drey_cluster__entry_of(c->entries[p], &ent[p]);
        epochs[p] = c->epochs[p];
        for (size_t i = 0; i < c->n_members && !owner_member[p]; i++)
            owner_member[p] = strcmp(c->members[i]->id, ent[p].primary) == 0;
    }
    pthread_mutex_unlock(&c->mu);

    bool ok = true;
    if (pl.n == 0)
        goto out;
    /* The same placement as the first assignment's, so that a cluster
     * that did not change plans nothing. */
    uint32_t r = drey_placement_replicas(c->rf, pl.n);
    uint32_t *assign = drey_xmalloc((size_t)c->n_parts * r * sizeof *assign);
    drey_placement_assign((const char *const *)pl.ids, pl.n, c->n_parts, c->rf, assign);
    for (uint32_t p = 0; p < c->n_parts; p++) {
        int k = planned_index(&pl, ent[p].primary);
        if (ent[p].joining[0] != '\0' && k >= 0)
            pl.moving_out[k]++;
    }
    uint32_t planned_now = 0, cancelled = 0;
    for (uint32_t p0 = 0; p0 < c->n_parts && ok;) {
        drey_arena a;
        drey_arena_init(&a, NULL, 0);
        drey_etcd_txn t;
        drey_etcd_txn_init(&t, &a);
        size_t ops = 0;
        uint32_t p = p0;
        for (; p < c->n_parts && ops < DREY_CLUSTER_TXN_OPS; p++) {
            drey_cluster__entry *e = &ent[p];
            int k = planned_index(&pl, e->primary);
            if (e->joining[0] != '\0') {
                int j = planned_index(&pl, e->joining);
                if (j < 0 || !pl.member[j]) { /* gone, or leaving itself */
                    e->joining[0] = '\0';
                    drey_cluster__txn_put_entry(c, &t, &a, p, epochs[p], e);
                    ops++;
                    cancelled++;
                }
                continue;
            }
            const char *want = pl.ids[assign[p * r]];
            if (strcmp(want, e->primary) == 0 || !owner_member[p] || !pl.member[assign[p * r]])
                continue;
            if (k >= 0 && pl.moving_out[k] >= c->opts.max_moves)
                continue;
            if (k < 0 && planned_now >= c->opts.max_moves)
                continue; /* a draining owner: not in the list, counted together */
            snprintf(e->joining, sizeof e->joining, "%s", want);
            drey_cluster__txn_put_entry(c, &t, &a, p, epochs[p], e);
            ops++;
            planned_now++;
            if (k >= 0)
                pl.moving_out[k]++;
        }
        p0 = p;
        ok = drey_cluster__commit_table_writes(c, &t, &a, ops);
        drey_arena_destroy(&a);
    }
    if (ok && (planned_now > 0 || cancelled > 0))
        DREY_LOG_INFO("partition moves planned", DREY_LOG_UINT("planned", planned_now),
                      DREY_LOG_UINT("cancelled", cancelled), DREY_LOG_UINT("nodes", n_live));
    free(assign);
out:
    free(ent);
    free(epochs);
    free(owner_member);
    for (size_t i = 0; i < pl.n; i++)
        free(pl.ids[i]);
    free(pl.ids);
    free(pl.member);
    free(pl.moving_out);
    return ok;
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
        if (lost) {
            set_keepalive(c, NULL);
            if (register_node(c, 0, err, sizeof err) == 0) {
                set_keepalive(c, drey_etcd_keepalive_start(c->etcd, &c->lease, on_lease_lost, c));
                pthread_mutex_lock(&c->mu);
                c->lease_lost = false;
                pthread_mutex_unlock(&c->mu);
                DREY_LOG_INFO("registered again with a new lease", DREY_LOG_STR("node_id", c->opts.node_id));
            }
        } else if (vacant) {
            leader = campaign(c);
        }
        bool repaired = false;
        /* Moves are planned on a table the repairs are in: the next look. */
        if (leader && !lost && assign_unowned(c) && drey_cluster__repair(c, &repaired) && !repaired)
            rebalance(c);
        pthread_mutex_lock(&c->mu);
        if (c->leaving)
            break;
        drey_cond_wait_until(&c->cond, &c->mu, drey_deadline_after_ms(1000));
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}
