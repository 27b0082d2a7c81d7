/*
 * drey cluster init|status — the operator's view of a cluster.
 *
 * init writes the cluster's config in etcd once (the same values again are
 * fine, others are refused: the partition count is fixed for the cluster's
 * life).
 *
 * status reads the partition table from etcd (--etcd) or from any node
 * (--addr: drey.cluster.v1.Cluster/WatchTopology, the table every node
 * routes with), then asks each member at its advertised address for its
 * readiness details: controller, draining, lease, and each partition's
 * replication as its primary and backups see it. A member that does not
 * answer within a second is listed as unanswered.
 *
 * By default it prints a short table: the members, then one line of
 * totals, then the partitions only when something is wrong with them
 * (unassigned, under-replicated, moving, lagging) or with --partitions.
 * -o json prints the whole document, every partition included.
 *
 * Lag: a backup's lag grows between heartbeats (a few hundred ms) even when
 * it has every write, so it is shown only where it means something: when
 * the primary has writes waiting for backups, or when it passes a second.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "drey/admin/v1/admin.pb-c.h"
#include "drey/alloc.h"
#include "drey/cluster/v1/cluster.pb-c.h"
#include "drey/etcd.h"
#include "drey/internal/v1/meta.pb-c.h"

#define CALL_MS 5000
#define NODE_CALL_MS 1000
#define LAG_SHOWN_MS 1000 /* below, with nothing pending: heartbeat noise */

/* The table as either source gives it. */
typedef struct part {
    char *primary;
    json_t *in_sync, *syncing, *joining; /* arrays of node ids; joining: where the primary role goes */
    bool handover;                       /* ... to an in-sync backup, without a copy */
    /* What the members said. */
    bool primary_said;
    uint64_t pending;
    uint32_t backups_said;
    uint64_t lag_ms;
} part;

typedef struct member {
    char *id, *advertise, *internal, *build;
    bool draining_etcd;
    bool answered;
    Drey__Admin__V1__ReadinessDetails *details; /* in the arena, when answered */
} member;

typedef struct view {
    const char *source;
    uint32_t n_parts, rf;
    int64_t revision;
    char *controller;
    part *parts;
    member *members;
    size_t n_members, cap_members;
    drey_arena arena;
} view;

static member *add_member(view *v, const char *id) {
    for (size_t i = 0; i < v->n_members; i++)
        if (strcmp(v->members[i].id, id) == 0)
            return &v->members[i];
    if (v->n_members == v->cap_members) {
        v->cap_members = v->cap_members ? 2 * v->cap_members : 8;
        v->members = drey_xrealloc(v->members, v->cap_members, sizeof *v->members);
    }
    member *m = &v->members[v->n_members++];
    memset(m, 0, sizeof *m);
    m->id = drey_arena_strndup(&v->arena, id, strlen(id));
    m->advertise = m->internal = m->build = "";
    return m;
}

static bool parse_u32(const char *s, uint32_t *out) {
    char *end;
    unsigned long x = strtoul(s, &end, 10);
    if (*s == '\0' || *end != '\0' || x > UINT32_MAX)
        return false;
    *out = (uint32_t)x;
    return true;
}

static json_t *id_array(char **ids, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_string(ids[i]));
    return a;
}

static const char *prefix_of(drey_cli *c, char *buf, size_t cap) {
    /* The option, else dreyd's variable (a pod's environment), else drey/. */
    const char *p = drey_cli_opt(c, "prefix") != NULL ? drey_cli_opt(c, "prefix") : getenv("DREY_CLUSTER_PREFIX");
    if (p == NULL || p[0] == '\0')
        p = "drey/";
    size_t n = strlen(p);
    snprintf(buf, cap, "%s%s", p, n > 0 && p[n - 1] == '/' ? "" : "/");
    return buf;
}

/* etcd's endpoints with TLS and its authentication: the options, else the
 * variables dreyd reads for the same settings (a pod's environment
 * configures both). */
static drey_etcd_options etcd_options(const drey_cli *c, const char *etcd) {
    static const char *const names[][2] = {{"etcd-ca", "DREY_CLUSTER_ETCD_CA"},
                                           {"etcd-cert", "DREY_CLUSTER_ETCD_CERT"},
                                           {"etcd-key", "DREY_CLUSTER_ETCD_KEY"},
                                           {"etcd-user", "DREY_CLUSTER_ETCD_USER"},
                                           {"etcd-password-file", "DREY_CLUSTER_ETCD_PASSWORD_FILE"}};
    const char *v[5];
    for (size_t i = 0; i < 5; i++) {
        v[i] = drey_cli_opt(c, names[i][0]);
        if (v[i] == NULL)
            v[i] = getenv(names[i][1]);
    }
    return (drey_etcd_options){.endpoints = etcd,
                               .tls = {.ca_file = v[0], .cert_file = v[1], .key_file = v[2]},
                               .user = v[3],
                               .password_file = v[4]};
}

/* A client of the etcd at etcd and the cluster's prefix in it (room for
 * 256); NULL with the reason printed for the subcommand (init, status). */
static drey_etcd *open_etcd(drey_cli *c, const char *etcd, const char *sub, char *prefix) {
    char err[320];
    prefix_of(c, prefix, 256);
    drey_etcd_options eo = etcd_options(c, etcd);
    drey_etcd *e = drey_etcd_open(&eo, err, sizeof err);
    if (e == NULL)
        fprintf(stderr, "drey cluster %s: %s\n", sub, err);
    return e;
}

/* --- init ---------------------------------------------------------------------------- */

int drey_cli_cluster_init(drey_cli *c, char **args) {
    (void)args;
    const char *etcd = drey_cli_opt(c, "etcd") != NULL ? drey_cli_opt(c, "etcd") : getenv("DREY_CLUSTER_ETCD");
    if (etcd == NULL || etcd[0] == '\0') {
        fprintf(stderr, "drey cluster init: --etcd URLS is required\n");
        return DREY_EXIT_USAGE;
    }
    uint32_t partitions = 256, rf = 2, initial = 1;
    const char *ps = drey_cli_opt(c, "partitions"), *rs = drey_cli_opt(c, "replication-factor"),
               *is = drey_cli_opt(c, "initial-nodes");
    if ((ps != NULL && !parse_u32(ps, &partitions)) || (rs != NULL && !parse_u32(rs, &rf)) ||
        (is != NULL && !parse_u32(is, &initial))) {
        fprintf(stderr, "drey cluster init: --partitions, --replication-factor and --initial-nodes take numbers\n");
        return DREY_EXIT_USAGE;
    }
    if (partitions < 1 || partitions > 65536 || rf < 1 || rf > 3) {
        fprintf(stderr, "drey cluster init: --partitions must be 1 to 65536 and --replication-factor 1 to 3\n");
        return DREY_EXIT_USAGE;
    }
    char prefix[256];
    drey_etcd *e = open_etcd(c, etcd, "init", prefix);
    if (e == NULL)
        return DREY_EXIT_USAGE;
    Drey__Internal__V1__ClusterConfig cfg = DREY__INTERNAL__V1__CLUSTER_CONFIG__INIT;
    cfg.format = DREY__INTERNAL__V1__CLUSTER_CONFIG__FORMAT__FORMAT_V1;
    cfg.partitions = partitions;
    cfg.replication_factor = rf;
    cfg.hash_function = 1;
    cfg.initial_nodes = initial > 0 ? initial : 1;
    uint8_t buf[64];
    size_t len = drey__internal__v1__cluster_config__pack(&cfg, buf);
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    const char *key = drey_arena_sprintf(&a, "%sconfig", prefix);
    drey_etcd_txn t;
    drey_etcd_txn_init(&t, &a);
    drey_etcd_txn_if_create_revision(&t, key, DREY_ETCD_EQUAL, 0);
    drey_etcd_txn_put(&t, DREY_ETCD_THEN, key, buf, len, 0);
    drey_etcd_txn_get(&t, DREY_ETCD_ELSE, key, false);
    Etcdserverpb__TxnResponse *resp;
    drey_etcd_status st;
    int rc = DREY_EXIT_FAILED;
    if (drey_etcd_txn_commit(e, &t, CALL_MS, &a, &resp, &st) != GRPC_STATUS_OK) {
        fprintf(stderr, "drey cluster init: cannot reach etcd at %s: %s\n", etcd, st.message);
    } else if (resp->succeeded) {
        rc = DREY_EXIT_OK;
    } else if (resp->n_responses == 1 && resp->responses[0]->response_range != NULL &&
               resp->responses[0]->response_range->n_kvs == 1) {
        const Mvccpb__KeyValue *kv = resp->responses[0]->response_range->kvs[0];
        Drey__Internal__V1__ClusterConfig *old =
            drey__internal__v1__cluster_config__unpack(drey_arena_protobuf_allocator(&a), kv->value.len, kv->value.data);
        if (old != NULL && old->format == cfg.format && old->partitions == cfg.partitions &&
            old->replication_factor == cfg.replication_factor && old->hash_function == cfg.hash_function)
            rc = DREY_EXIT_OK; /* the same again: nothing to do */
        else
            fprintf(stderr,
                    "drey cluster init: a cluster already exists under %s with %u partitions and replication factor "
                    "%u: its config is fixed for its life\n",
                    key, old != NULL ? old->partitions : 0, old != NULL ? old->replication_factor : 0);
    } else {
        fprintf(stderr, "drey cluster init: unexpected answer from etcd\n");
    }
    drey_arena_destroy(&a);
    drey_etcd_close(e);
    if (rc == DREY_EXIT_OK) {
        json_t *row = json_pack("{sIsIsI}", "partitions", (json_int_t)partitions, "replicationFactor", (json_int_t)rf,
                                "initialNodes", (json_int_t)initial);
        drey_out o;
        static const char *const cols[] = {"partitions", "replicationFactor", "initialNodes", NULL};
        drey_out_begin(&o, c->format, stdout, cols);
        drey_out_row(&o, row);
        drey_out_flush(&o);
    }
    return rc;
}

/* --- the table from etcd ------------------------------------------------------------- */

static int from_etcd(drey_cli *c, const char *etcd, view *v) {
    char prefix[256];
    drey_etcd *e = open_etcd(c, etcd, "status", prefix);
    if (e == NULL)
        return DREY_EXIT_USAGE;
    Etcdserverpb__RangeResponse *resp;
    drey_etcd_status st;
    int rc = DREY_EXIT_FAILED;
    if (drey_etcd_get(e, prefix, true, CALL_MS, &v->arena, &resp, &st) != GRPC_STATUS_OK) {
        fprintf(stderr, "drey cluster status: cannot read etcd (%s): %s\n", st.endpoint, st.message);
        goto out;
    }
    v->revision = resp->header != NULL ? resp->header->revision : 0;
    size_t plen = strlen(prefix);
    for (size_t i = 0; i < resp->n_kvs; i++) {
        const Mvccpb__KeyValue *kv = resp->kvs[i];
        const char *k = (const char *)kv->key.data + plen;
        size_t kl = kv->key.len - plen;
        if (kl == 6 && memcmp(k, "config", 6) == 0) {
            Drey__Internal__V1__ClusterConfig *cfg = drey__internal__v1__cluster_config__unpack(
                drey_arena_protobuf_allocator(&v->arena), kv->value.len, kv->value.data);
            if (cfg != NULL && cfg->partitions > 0) {
                v->n_parts = cfg->partitions;
                v->rf = cfg->replication_factor;
            }
        } else if (kl == 10 && memcmp(k, "controller", 10) == 0) {
            v->controller = drey_arena_strndup(&v->arena, (const char *)kv->value.data, kv->value.len);
        }
    }
    if (v->n_parts == 0) {
        fprintf(stderr, "drey cluster status: no cluster under %s (drey cluster init creates one)\n", prefix);
        goto out;
    }
    v->parts = drey_arena_calloc(&v->arena, v->n_parts * sizeof *v->parts);
    for (size_t i = 0; i < resp->n_kvs; i++) {
        const Mvccpb__KeyValue *kv = resp->kvs[i];
        const char *k = (const char *)kv->key.data + plen;
        size_t kl = kv->key.len - plen;
        if (kl == 16 && memcmp(k, "partitions/", 11) == 0) {
            char digits[6];
            memcpy(digits, k + 11, 5);
            digits[5] = '\0';
            uint32_t p;
            Drey__Internal__V1__PartitionEntry *pe = drey__internal__v1__partition_entry__unpack(
                drey_arena_protobuf_allocator(&v->arena), kv->value.len, kv->value.data);
            if (parse_u32(digits, &p) && p < v->n_parts && pe != NULL) {
                v->parts[p].primary = pe->primary;
                v->parts[p].in_sync = id_array(pe->replicas, pe->n_replicas);
                v->parts[p].syncing = id_array(pe->syncing, pe->n_syncing);
                v->parts[p].joining = id_array(pe->joining, pe->n_joining);
                if (pe->handover[0] != '\0') {
                    json_array_append_new(v->parts[p].joining, json_string(pe->handover));
                    v->parts[p].handover = true;
                }
            }
        } else if (kl > 6 && memcmp(k, "nodes/", 6) == 0) {
            Drey__Internal__V1__Member *m = drey__internal__v1__member__unpack(drey_arena_protobuf_allocator(&v->arena),
                                                                              kv->value.len, kv->value.data);
            if (m == NULL)
                continue;
            member *mm = add_member(v, m->id);
            mm->advertise = m->advertise;
            mm->internal = m->internal;
            mm->build = m->build;
            mm->draining_etcd = m->draining;
        }
    }
    rc = DREY_EXIT_OK;
out:
    drey_etcd_close(e);
    return rc;
}

/* --- the table from a node ------------------------------------------------------------- */

static int from_node(drey_cli *c, view *v) {
    drey_client_status st;
    drey_client *cl = drey_cli_stream_client(c, &st);
    if (cl == NULL)
        return drey_cli_report(c, &st);
    Drey__Cluster__V1__WatchTopologyRequest req = DREY__CLUSTER__V1__WATCH_TOPOLOGY_REQUEST__INIT;
    drey_client_stream *s = drey_client_stream_start(cl, "/drey.cluster.v1.Cluster/WatchTopology", &req.base,
                                                     c->timeout_ms, &st);
    if (s == NULL)
        return drey_cli_report(c, &st);
    Drey__Cluster__V1__Topology *t = NULL;
    bool got = drey_client_stream_read(s, &drey__cluster__v1__topology__descriptor, &v->arena, (ProtobufCMessage **)&t);
    drey_client_stream_cancel(s);
    drey_client_stream_finish(s, &v->arena, &st);
    if (!got) {
        if (st.code == GRPC_STATUS_UNIMPLEMENTED) {
            fprintf(stderr, "drey cluster status: %s is a single node, not a cluster member\n",
                    c->endpoints[c->current]);
            return DREY_EXIT_NEGATIVE;
        }
        return drey_cli_report(c, &st);
    }
    v->n_parts = t->hash != NULL ? t->hash->partitions : (uint32_t)t->n_partitions;
    v->rf = t->replication_factor;
    v->revision = t->revision;
    v->parts = drey_arena_calloc(&v->arena, (v->n_parts ? v->n_parts : 1) * sizeof *v->parts);
    for (size_t i = 0; i < t->n_nodes; i++)
        add_member(v, t->nodes[i]->id)->advertise = t->nodes[i]->advertise;
    for (size_t i = 0; i < t->n_partitions; i++) {
        const Drey__Cluster__V1__Partition *p = t->partitions[i];
        if (p->id >= v->n_parts)
            continue;
        part *pt = &v->parts[p->id];
        pt->primary = p->primary;
        pt->in_sync = id_array(p->replicas, p->n_replicas);
        /* The copies under way are new backups but for the move's target. */
        pt->joining = json_array();
        pt->syncing = json_array();
        for (size_t j = 0; j < p->n_joining; j++) {
            if (strcmp(p->joining[j], p->next_primary) != 0)
                json_array_append_new(pt->syncing, json_string(p->joining[j]));
        }
        if (p->next_primary[0] != '\0') {
            json_array_append_new(pt->joining, json_string(p->next_primary));
            pt->handover = json_array_size(pt->syncing) == p->n_joining; /* not copied to: in sync */
        }
    }
    return DREY_EXIT_OK;
}

/* --- asking the members ----------------------------------------------------------------- */

static void ask_member(drey_cli *c, view *v, member *m) {
    if (m->advertise[0] == '\0')
        return;
    drey_client_options o = c->copts;
    o.target = m->advertise;
    o.token = c->token;
    char err[256];
    drey_client *cl = drey_client_open(&o, err, sizeof err);
    if (cl == NULL)
        return;
    Drey__Admin__V1__GetReadinessDetailsRequest req = DREY__ADMIN__V1__GET_READINESS_DETAILS_REQUEST__INIT;
    drey_client_status st;
    Drey__Admin__V1__ReadinessDetails *d = NULL;
    m->answered = drey_client_unary(cl, DREY_CLIENT_ADMIN("GetReadinessDetails"), &req.base,
                                    &drey__admin__v1__readiness_details__descriptor, NODE_CALL_MS, &v->arena,
                                    (ProtobufCMessage **)&d, &st) == GRPC_STATUS_OK &&
                  d != NULL && d->cluster != NULL;
    drey_client_close(cl);
    if (!m->answered)
        return;
    m->details = d;
    if (v->controller == NULL && d->cluster->controller[0] != '\0')
        v->controller = d->cluster->controller;
    for (size_t i = 0; i < d->cluster->n_replicas; i++) {
        const Drey__Admin__V1__ReadinessDetails__Cluster__PartitionReplica *pr = d->cluster->replicas[i];
        if (pr->partition >= v->n_parts || v->parts[pr->partition].primary == NULL)
            continue;
        part *pt = &v->parts[pr->partition];
        /* Only what agrees with the table. */
        if (strcmp(pr->role, "primary") == 0 && strcmp(pt->primary, m->id) == 0) {
            pt->primary_said = true;
            pt->pending = pr->pending;
            if (pr->lag_ms != UINT64_MAX && pr->lag_ms > pt->lag_ms)
                pt->lag_ms = pr->lag_ms;
        } else if (strcmp(pr->role, "backup") == 0) {
            for (size_t r = 0; r < json_array_size(pt->in_sync); r++) {
                if (strcmp(json_string_value(json_array_get(pt->in_sync, r)), m->id) != 0)
                    continue;
                pt->backups_said++;
                /* UINT64_MAX: the backup has not heard from its primary
                 * since it started: no figure yet. */
                if (pr->lag_ms != UINT64_MAX && pr->lag_ms > pt->lag_ms)
                    pt->lag_ms = pr->lag_ms;
            }
        }
    }
}

/* --- the document ------------------------------------------------------------------------ */

static bool in_array(const json_t *a, const char *id) {
    for (size_t i = 0; i < json_array_size(a); i++)
        if (strcmp(json_string_value(json_array_get(a, i)), id) == 0)
            return true;
    return false;
}

static json_t *document(view *v) {
    json_t *doc = json_object();
    json_object_set_new(doc, "source", json_string(v->source));
    json_object_set_new(doc, "partitions", json_integer(v->n_parts));
    json_object_set_new(doc, "replicationFactor", json_integer(v->rf));
    json_object_set_new(doc, "controller", json_string(v->controller != NULL ? v->controller : ""));
    json_object_set_new(doc, "revision", json_integer(v->revision));
    json_t *nodes = json_array(), *unanswered = json_array(), *table = json_array(), *moves = json_array();
    for (size_t i = 0; i < v->n_members; i++) {
        member *m = &v->members[i];
        uint32_t primaries = 0, backups = 0, syncing = 0;
        for (uint32_t p = 0; p < v->n_parts; p++) {
            primaries += v->parts[p].primary != NULL && strcmp(v->parts[p].primary, m->id) == 0;
            backups += in_array(v->parts[p].in_sync, m->id);
            syncing += in_array(v->parts[p].syncing, m->id) || in_array(v->parts[p].joining, m->id);
        }
        const Drey__Admin__V1__ReadinessDetails__Cluster *cd = m->details != NULL ? m->details->cluster : NULL;
        bool draining = m->draining_etcd || (cd != NULL && cd->draining);
        json_t *n = json_pack("{ssss}", "id", m->id, "advertise", m->advertise);
        if (m->internal[0] != '\0')
            json_object_set_new(n, "internal", json_string(m->internal));
        json_object_set_new(n, "partitions", json_integer(primaries));
        json_object_set_new(n, "backups", json_integer(backups));
        /* What its memory and journal hold: the placement evens this out
         * (and the copies being made onto it, which will add to it). */
        json_object_set_new(n, "copies", json_integer(primaries + backups));
        json_object_set_new(n, "syncing", json_integer(syncing));
        json_object_set_new(n, "draining", json_boolean(draining));
        json_object_set_new(n, "state", json_string(!m->answered ? "unanswered" : draining ? "draining" : "serving"));
        json_object_set_new(n, "lease", cd == NULL ? json_null() : json_string(cd->lease_valid ? "valid" : "expired"));
        json_object_set_new(n, "controller", json_boolean(v->controller != NULL && strcmp(v->controller, m->id) == 0));
        if (cd != NULL) {
            json_object_set_new(n, "movingIn", json_integer(cd->moving_in));
            json_object_set_new(n, "movingOut", json_integer(cd->moving_out));
        }
        const char *build = m->build[0] != '\0' ? m->build : NULL;
        char b[160];
        if (build == NULL && m->details != NULL && m->details->build != NULL) {
            snprintf(b, sizeof b, "drey %s %s", m->details->build->version, m->details->build->revision);
            build = b;
        }
        if (build != NULL)
            json_object_set_new(n, "build", json_string(build));
        json_array_append_new(nodes, n);
        if (!m->answered)
            json_array_append_new(unanswered, json_string(m->id));
    }
    uint32_t unassigned = 0, under = 0;
    for (uint32_t p = 0; p < v->n_parts; p++) {
        part *pt = &v->parts[p];
        bool owned = pt->primary != NULL && pt->primary[0] != '\0';
        unassigned += !owned;
        under += owned && 1 + json_array_size(pt->in_sync) < v->rf;
        json_t *row = json_pack("{sIss}", "partition", (json_int_t)p, "primary", owned ? pt->primary : "");
        json_object_set_new(row, "inSync", pt->in_sync != NULL ? json_incref(pt->in_sync) : json_array());
        json_object_set_new(row, "syncing", pt->syncing != NULL ? json_incref(pt->syncing) : json_array());
        if (v->rf > 1 && owned) {
            if (pt->primary_said)
                json_object_set_new(row, "pending", json_integer((json_int_t)pt->pending));
            size_t n_in_sync = json_array_size(pt->in_sync);
            bool all_said = n_in_sync == 0 || pt->backups_said == n_in_sync;
            if (n_in_sync > 0 && !all_said)
                json_object_set_new(row, "lagMs", json_null()); /* not known: someone did not answer */
            else if ((pt->primary_said && pt->pending > 0) || pt->lag_ms >= LAG_SHOWN_MS)
                json_object_set_new(row, "lagMs", json_integer((json_int_t)pt->lag_ms));
        }
        json_array_append_new(table, row);
        for (size_t j = 0; j < json_array_size(pt->joining); j++)
            json_array_append_new(moves, json_pack("{sIsssssb}", "partition", (json_int_t)p, "from",
                                                   owned ? pt->primary : "", "to",
                                                   json_string_value(json_array_get(pt->joining, j)), "copy",
                                                   !pt->handover));
    }
    json_object_set_new(doc, "nodes", nodes);
    json_object_set_new(doc, "unassignedPartitions", json_integer(unassigned));
    json_object_set_new(doc, "underReplicatedPartitions", json_integer(under));
    json_object_set_new(doc, "unanswered", unanswered);
    json_object_set_new(doc, "table", table);
    json_object_set_new(doc, "moves", moves);
    return doc;
}

/* A partition worth a line in the short view. */
static bool troubled(const json_t *row, uint32_t rf) {
    const char *primary = json_string_value(json_object_get(row, "primary"));
    return primary == NULL || primary[0] == '\0' || 1 + json_array_size(json_object_get(row, "inSync")) < rf ||
           json_array_size(json_object_get(row, "syncing")) > 0 || json_object_get(row, "lagMs") != NULL;
}

static void print_view(drey_cli *c, json_t *doc, bool all_partitions) {
    bool text = c->format == DREY_OUT_TEXT;
    drey_out o;
    /* Text: one record per line, its kind first, so a script can pick. */
    static const char *const mcols[] = {"id", "advertise", "partitions", "backups", "copies", "syncing", "state", "lease", "role", "build", NULL};
    static const char *const mcols_t[] = {"record", "id", "advertise", "partitions", "backups", "copies", "syncing", "state", "lease", "role", "build", NULL};
    drey_out_begin(&o, c->format, stdout, text ? mcols_t : mcols);
    json_t *nodes = json_object_get(doc, "nodes");
    for (size_t i = 0; i < json_array_size(nodes); i++) {
        json_t *n = json_deep_copy(json_array_get(nodes, i));
        json_object_set_new(n, "record", json_string("member"));
        json_object_set_new(n, "role", json_is_true(json_object_get(n, "controller")) ? json_string("controller")
                                                                                        : json_null());
        drey_out_row(&o, n);
    }
    drey_out_flush(&o);
    uint32_t rf = (uint32_t)json_integer_value(json_object_get(doc, "replicationFactor"));
    json_t *sum = json_pack("{sssOsOsOsOsIsO}", "record", "partitions", "partitions", json_object_get(doc, "partitions"),
                            "replicationFactor", json_object_get(doc, "replicationFactor"), "unassigned",
                            json_object_get(doc, "unassignedPartitions"), "underReplicated",
                            json_object_get(doc, "underReplicatedPartitions"), "moving",
                            (json_int_t)json_array_size(json_object_get(doc, "moves")), "controller",
                            json_object_get(doc, "controller"));
    static const char *const scols[] = {"partitions", "replicationFactor", "unassigned", "underReplicated", "moving", "controller", NULL};
    static const char *const scols_t[] = {"record", "partitions", "replicationFactor", "unassigned", "underReplicated", "moving", "controller", NULL};
    if (!text)
        fputc('\n', stdout);
    drey_out_begin(&o, c->format, stdout, text ? scols_t : scols);
    drey_out_row(&o, sum);
    drey_out_flush(&o);
    static const char *const pcols[] = {"partition", "primary", "inSync", "syncing", "movingTo", "lagMs", NULL};
    static const char *const pcols_t[] = {"record", "partition", "primary", "inSync", "syncing", "movingTo", "lagMs", NULL};
    json_t *table = json_object_get(doc, "table"), *moves = json_object_get(doc, "moves");
    bool any = false;
    for (size_t i = 0; i < json_array_size(table); i++) {
        json_t *row = json_array_get(table, i);
        json_t *to = json_array();
        for (size_t k = 0; k < json_array_size(moves); k++)
            if (json_integer_value(json_object_get(json_array_get(moves, k), "partition")) ==
                json_integer_value(json_object_get(row, "partition")))
                json_array_append(to, json_object_get(json_array_get(moves, k), "to"));
        if (!all_partitions && !troubled(row, rf) && json_array_size(to) == 0) {
            json_decref(to);
            continue;
        }
        if (!any) {
            if (!text)
                fputc('\n', stdout);
            drey_out_begin(&o, c->format, stdout, text ? pcols_t : pcols);
            any = true;
        }
        json_t *r = json_deep_copy(row);
        json_object_set_new(r, "record", json_string("partition"));
        json_object_set_new(r, "movingTo", to);
        drey_out_row(&o, r);
    }
    if (any)
        drey_out_flush(&o);
}

int drey_cli_cluster_status(drey_cli *c, char **args) {
    (void)args;
    view v;
    memset(&v, 0, sizeof v);
    drey_arena_init(&v.arena, NULL, 0);
    const char *etcd = drey_cli_opt(c, "etcd");
    /* No node named either: dreyd's variable, as a pod has it. */
    if (etcd == NULL && drey_cli_opt(c, "addr") == NULL && drey_cli_opt(c, "endpoints") == NULL)
        etcd = getenv("DREY_CLUSTER_ETCD");
    int rc;
    if (etcd != NULL && etcd[0] != '\0') {
        v.source = "etcd";
        rc = from_etcd(c, etcd, &v);
    } else {
        v.source = "node";
        rc = from_node(c, &v);
    }
    if (rc == DREY_EXIT_OK) {
        for (size_t i = 0; i < v.n_members; i++)
            ask_member(c, &v, &v.members[i]);
        json_t *doc = document(&v);
        if (c->format == DREY_OUT_JSON)
            drey_out_json_line(stdout, doc);
        else
            print_view(c, doc, drey_cli_opt(c, "partitions") != NULL);
        json_decref(doc);
    }
    for (uint32_t p = 0; p < v.n_parts && v.parts != NULL; p++) {
        json_decref(v.parts[p].in_sync);
        json_decref(v.parts[p].syncing);
        json_decref(v.parts[p].joining);
    }
    free(v.members);
    drey_arena_destroy(&v.arena);
    return rc;
}
