/*
 * table — the cluster as etcd holds it, seen from this node: the config,
 * the members under their leases, the partition table (one entry per
 * partition, its mod_revision the partition's epoch), this node's own
 * registration and lease, and the watch that keeps all of it current.
 *
 * Join (drey_cluster__table_open, _start): read and check the cluster's
 * config, take a lease, register the node under it (waiting for an earlier
 * registration of the same id to expire: two processes must never share
 * an id), keep the lease alive on a stream, read everything under the
 * prefix and watch it from there. The watch's callbacks run on the etcd
 * client's thread and only update the table and publish a new topology
 * (topology.c); everything that calls etcd runs on other threads.
 *
 * A lost lease (etcd unreachable past the TTL, or the node paused) takes the
 * node out of the membership; the controller thread registers it again with
 * a new lease once etcd answers (drey_cluster__register_again), while
 * routing goes on with the last table.
 *
 * The lease also bounds what this node may do as a primary: it commits and
 * serves only while the lease is valid by its own monotonic clock
 * (drey_cluster__lease_valid), and etcd expires it later than that.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/log.h"
#include "internal.h"
#include "room.h"
#include "table.h"

#define CALL_MS 2000

char *drey_cluster__key(const drey_cluster *c, drey_arena *a, const char *suffix) {
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

/* --- what an operator reads: members coming and going, failovers ------------ */

static const Drey__Internal__V1__Member *member_locked(const drey_cluster *c, const char *id, size_t len) {
    for (size_t i = 0; i < c->n_members; i++) {
        if (strlen(c->members[i]->id) == len && memcmp(c->members[i]->id, id, len) == 0)
            return c->members[i];
    }
    return NULL;
}

static void failover_done_locked(drey_cluster__departure *d, const char *how) {
    char to[512] = "";
    size_t n = 0;
    for (size_t i = 0; i < d->n_heirs && n < sizeof to; i++)
        n += (size_t)snprintf(to + n, sizeof to - n, "%s%s:%u", i > 0 ? "," : "", d->heirs[i].id, d->heirs[i].n);
    DREY_LOG_INFO(how, DREY_LOG_STR("node", d->id), DREY_LOG_UINT("partitions", d->led),
                  DREY_LOG_UINT("failed_over", d->taken), DREY_LOG_STR("to", to),
                  DREY_LOG_INT("took_ms_after_it_left", (drey_mono_ns() - d->left_ns) / 1000000));
    d->id[0] = '\0';
}

/* A member's entry went (its lease expired, or it gave it back leaving):
 * said once, on every node, naming it; its partitions are followed until
 * each has another primary. */
static void member_left_locked(drey_cluster *c, const Drey__Internal__V1__Member *m) {
    uint32_t led = 0, held = 0;
    for (uint32_t p = 0; p < c->n_parts; p++) {
        const Drey__Internal__V1__PartitionEntry *e = c->entries[p];
        if (e == NULL)
            continue;
        if (strcmp(e->primary, m->id) == 0)
            led++;
        for (size_t i = 0; i < e->n_replicas; i++)
            held += strcmp(e->replicas[i], m->id) == 0;
    }
    if (m->draining)
        DREY_LOG_INFO("a member left after draining", DREY_LOG_STR("node", m->id), DREY_LOG_UINT("partitions_led", led),
                      DREY_LOG_UINT("backups_held", held));
    else
        DREY_LOG_WARN("a member left the membership: its lease expired (or it stopped without draining)",
                      DREY_LOG_STR("node", m->id), DREY_LOG_UINT("partitions_led", led),
                      DREY_LOG_UINT("backups_held", held));
    if (led == 0)
        return;
    drey_cluster__departure *d = &c->departures[0];
    for (size_t i = 0; i < DREY_CLUSTER_DEPARTURES; i++) {
        if (c->departures[i].id[0] == '\0' || strcmp(c->departures[i].id, m->id) == 0) {
            d = &c->departures[i];
            break;
        }
        if (c->departures[i].left_ns < d->left_ns)
            d = &c->departures[i]; /* all taken: the oldest is forgotten */
    }
    *d = (drey_cluster__departure){.left_ns = drey_mono_ns(), .led = led};
    snprintf(d->id, sizeof d->id, "%s", m->id);
}

static void member_joined_locked(drey_cluster *c, const char *id) {
    for (size_t i = 0; i < DREY_CLUSTER_DEPARTURES; i++) {
        if (c->departures[i].id[0] != '\0' && strcmp(c->departures[i].id, id) == 0)
            failover_done_locked(&c->departures[i], "a member that left came back before all its partitions failed over");
    }
    if (strcmp(id, c->opts.node_id) != 0)
        DREY_LOG_INFO("a node joined the membership", DREY_LOG_STR("node", id));
}

/* Partition p's primary went from was to now: one of a departed member's
 * partitions failed over, perhaps the last. */
static void primary_changed_locked(drey_cluster *c, const char *was, const char *now) {
    for (size_t i = 0; i < DREY_CLUSTER_DEPARTURES; i++) {
        drey_cluster__departure *d = &c->departures[i];
        if (d->id[0] == '\0' || strcmp(d->id, was) != 0)
            continue;
        d->taken++;
        size_t h = 0;
        while (h < d->n_heirs && strcmp(d->heirs[h].id, now) != 0)
            h++;
        if (h == d->n_heirs && d->n_heirs < DREY_CLUSTER_HEIRS)
            snprintf(d->heirs[d->n_heirs++].id, sizeof d->heirs[0].id, "%s", now);
        if (h < d->n_heirs)
            d->heirs[h].n++;
        if (d->taken >= d->led)
            failover_done_locked(d, "a departed member's partitions have failed over");
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
        const Drey__Internal__V1__Member *was = member_locked(c, rest + 6, rlen - 6);
        if (c->loaded && was != NULL && deleted && strcmp(was->id, c->opts.node_id) != 0)
            member_left_locked(c, was);
        if (c->loaded && was == NULL && !deleted) {
            char id[DREY_CLUSTER_MAX_ID];
            snprintf(id, sizeof id, "%.*s", (int)(rlen - 6 < sizeof id ? rlen - 6 : sizeof id - 1), rest + 6);
            member_joined_locked(c, id);
        }
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
        Drey__Internal__V1__PartitionEntry *old = c->entries[p];
        c->entries[p] = NULL;
        c->epochs[p] = 0;
        if (!deleted) {
            c->entries[p] = drey__internal__v1__partition_entry__unpack(NULL, kv->value.len, kv->value.data);
            c->epochs[p] = kv->mod_revision;
        }
        if (c->loaded && old != NULL && old->primary[0] != '\0' && c->entries[p] != NULL &&
            c->entries[p]->primary[0] != '\0' && strcmp(old->primary, c->entries[p]->primary) != 0)
            primary_changed_locked(c, old->primary, c->entries[p]->primary);
        if (old != NULL)
            drey__internal__v1__partition_entry__free_unpacked(old, NULL);
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
    c->loaded = true;
    rev = resp->header != NULL ? resp->header->revision : 0;
    c->revision = rev;
    drey_cluster__publish_locked(c);
    pthread_mutex_unlock(&c->mu);
out:
    drey_arena_destroy(&a);
    return rev;
}

const Drey__Internal__V1__Member *drey_cluster__member_locked(const drey_cluster *c, const char *id) {
    for (size_t i = 0; i < c->n_members; i++) {
        if (strcmp(c->members[i]->id, id) == 0)
            return c->members[i];
    }
    return NULL;
}

/* --- membership ------------------------------------------------------------- */

static void on_lease_lost(void *user, drey_etcd_lease_loss why) {
    drey_cluster *c = user;
    DREY_LOG_ERROR("this node's etcd lease is lost; it will register again once etcd answers",
                   DREY_LOG_STR("why", why == DREY_ETCD_LEASE_EXPIRED ? "expired" : "unconfirmed"));
    atomic_store(&c->members_unsure_until_ns, INT64_MAX);
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
        drey_nap_ms(100);
    }
}

/* 0: the cluster's config fits this node; 1: etcd did not answer (worth
 * another try); -1: the answer says no. */
static int check_config(drey_cluster *c, char *err, size_t cap) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    int ok = -1;
    Etcdserverpb__RangeResponse *resp;
    drey_etcd_status st;
    const char *key = drey_cluster__key(c, &a, "config");
    grpc_status_code code = drey_etcd_get(c->etcd, key, false, CALL_MS, &a, &resp, &st);
    if (code != GRPC_STATUS_OK) {
        snprintf(err, cap, "cannot reach etcd at %s: %s", c->opts.etcd, st.message);
        if (code == GRPC_STATUS_UNAVAILABLE || code == GRPC_STATUS_DEADLINE_EXCEEDED)
            ok = 1;
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
    ok = 0;
out:
    drey_arena_destroy(&a);
    return ok;
}

int64_t drey_cluster_start_backoff_ms(unsigned attempt, double random) {
    int64_t ms = 250;
    for (unsigned i = 1; i < attempt && ms < 10000; i++)
        ms *= 2;
    if (ms > 10000)
        ms = 10000;
    return (int64_t)((double)ms * (0.75 + 0.5 * random));
}

static double next_random(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return (double)(*x >> 11) * 0x1.0p-53;
}

/* Under Kubernetes etcd may come up after the nodes: a node keeps asking
 * for up to start_timeout_ms instead of exiting into a crash loop, one
 * line per failed attempt, backing off so that those lines come at most
 * every few seconds. */
static int reach_etcd(drey_cluster *c, char *err, size_t cap) {
    int64_t started = drey_mono_ms(), until = started + c->opts.start_timeout_ms;
    uint64_t x = (uint64_t)drey_mono_ns() ^ ((uint64_t)getpid() << 32) ^ 0x9e3779b97f4a7c15ULL;
    for (unsigned attempt = 1;; attempt++) {
        int r = check_config(c, err, cap);
        if (r <= 0)
            return r;
        int64_t now = drey_mono_ms();
        if (now >= until) {
            if (c->opts.start_timeout_ms > 0) {
                char why[512];
                snprintf(why, sizeof why, "%s", err);
                snprintf(err, cap, "gave up after %lld s and %u attempts (--cluster-start-timeout): %s",
                         (long long)((now - started + 500) / 1000), attempt, why);
            }
            return -1;
        }
        int64_t wait = drey_cluster_start_backoff_ms(attempt, next_random(&x));
        if (wait > until - now)
            wait = until - now;
        DREY_LOG_WARN("etcd does not answer yet; trying again", DREY_LOG_STR("etcd", c->opts.etcd),
                      DREY_LOG_UINT("attempt", attempt), DREY_LOG_INT("retry_in_ms", wait),
                      DREY_LOG_INT("gives_up_in_s", (until - now + 999) / 1000), DREY_LOG_STR("error", err));
        bool go_on = true;
        if (c->opts.pause != NULL)
            go_on = c->opts.pause(c->opts.pause_ctx, wait);
        else
            drey_nap_ms(wait);
        if (!go_on) {
            snprintf(err, cap, "asked to stop while waiting for etcd at %s", c->opts.etcd);
            return DREY_CLUSTER_STOPPED;
        }
    }
}

int drey_cluster__table_open(drey_cluster *c, char *err, size_t cap) {
    c->etcd = drey_etcd_open(&(drey_etcd_options){.endpoints = c->opts.etcd,
                                                  .tls = c->opts.etcd_tls,
                                                  .user = c->opts.etcd_user,
                                                  .password_file = c->opts.etcd_password_file},
                             err, cap);
    if (c->etcd == NULL)
        return -1;
    int r = reach_etcd(c, err, cap);
    if (r != 0)
        return r;
    c->entries = drey_xcalloc(c->n_parts, sizeof *c->entries);
    c->epochs = drey_xcalloc(c->n_parts, sizeof *c->epochs);
    return 0;
}

int64_t drey_cluster__table_start(drey_cluster *c, char *err, size_t cap) {
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
    return rev;
}

bool drey_cluster__register_again(drey_cluster *c, char *err, size_t cap) {
    set_keepalive(c, NULL);
    if (register_node(c, 0, err, cap) != 0)
        return false;
    set_keepalive(c, drey_etcd_keepalive_start(c->etcd, &c->lease, on_lease_lost, c));
    atomic_store(&c->members_unsure_until_ns, drey_mono_ns() + c->opts.lease_ttl_s * 1000000000LL);
    pthread_mutex_lock(&c->mu);
    c->lease_lost = false;
    pthread_mutex_unlock(&c->mu);
    DREY_LOG_INFO("registered again with a new lease", DREY_LOG_STR("node_id", c->opts.node_id));
    return true;
}

bool drey_cluster__mark_draining(drey_cluster *c, char *err, size_t cap) {
    uint8_t buf[1024];
    size_t len = pack_member(c, buf, sizeof buf);
    drey_etcd_status st;
    bool marked;
    /* Only over this node's own registration. */
    put_member(c, DREY_ETCD_NOT_EQUAL, buf, len, &marked, &st);
    if (!marked)
        snprintf(err, cap, "%s", st.message);
    return marked;
}

void drey_cluster__table_release(drey_cluster *c) {
    set_keepalive(c, NULL);
    if (c->lease.id != 0) {
        drey_etcd_status st;
        if (drey_etcd_lease_revoke(c->etcd, c->lease.id, CALL_MS, &st) != GRPC_STATUS_OK)
            DREY_LOG_WARN("could not revoke the lease; it expires by itself", DREY_LOG_STR("error", st.message));
        c->lease.id = 0;
    }
}

void drey_cluster__table_free(drey_cluster *c) {
    set_keepalive(c, NULL);
    drey_etcd_watch_close(c->watch);
    drey_etcd_close(c->etcd);
    for (size_t i = 0; i < c->n_members; i++)
        drey__internal__v1__member__free_unpacked(c->members[i], NULL);
    free(c->members);
    for (uint32_t p = 0; c->entries != NULL && p < c->n_parts; p++) {
        if (c->entries[p] != NULL)
            drey__internal__v1__partition_entry__free_unpacked(c->entries[p], NULL);
    }
    free(c->entries);
    free(c->epochs);
}

/* --- the lease ------------------------------------------------------------------ */

bool drey_cluster__lease_valid(drey_cluster *c) {
    pthread_mutex_lock(&c->lease_mu);
    int64_t until = c->keepalive != NULL ? drey_etcd_keepalive_valid_until_ns(c->keepalive) : 0;
    pthread_mutex_unlock(&c->lease_mu);
    return drey_cluster__lease_holds(until, c->lease_margin_ns, drey_mono_ns());
}

