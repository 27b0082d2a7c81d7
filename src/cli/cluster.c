/*
 * drey cluster — the operator's view of a cluster, straight from etcd.
 *
 *   drey cluster init --etcd=URLS [--prefix=drey/] [--partitions=256] [--replication-factor=2]
 *                     [--initial-nodes=1]
 *   drey cluster status --etcd=URLS [--prefix=drey/] [--token=JWT]
 *
 * init writes the cluster's config once (the same values again are fine,
 * others are refused: the partition count is fixed for the cluster's life).
 * status prints the config, the controller, every member with the
 * partitions it owns, and the partitions nobody owns, as one JSON object;
 * with replicas, also each partition's replication as its nodes report it
 * (their readiness details, asked at each member's advertised address:
 * the writes its primary has waiting and its backups' lag). A member that
 * does not answer within a second is listed as unanswered, and the
 * partitions it holds have no lag.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/admin/v1/admin.pb-c.h"
#include "drey/arena.h"
#include "drey/client.h"
#include "drey/etcd.h"
#include "drey/internal/v1/meta.pb-c.h"
#include "cluster.h"

#define CALL_MS 5000
#define NODE_CALL_MS 1000

/* What the nodes said of each partition's replication. */
typedef struct reported {
    bool primary_said; /* its primary answered */
    uint64_t pending;
    uint32_t backups_said; /* in-sync backups that answered */
    uint64_t lag_ms;       /* the largest of theirs */
} reported;

/* Asks member m for its readiness details and adds what it says of the
 * partitions it holds to rep; false when it did not answer. */
static bool ask_member(const Drey__Internal__V1__Member *m, const char *token, Drey__Internal__V1__PartitionEntry **entries,
                       uint32_t n, reported *rep) {
    char err[256];
    drey_client *cl = drey_client_open(&(drey_client_options){.target = m->advertise, .token = token}, err, sizeof err);
    if (cl == NULL)
        return false;
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    Drey__Admin__V1__GetReadinessDetailsRequest req = DREY__ADMIN__V1__GET_READINESS_DETAILS_REQUEST__INIT;
    Drey__Admin__V1__ReadinessDetails *d = NULL;
    drey_client_status st;
    bool ok = drey_client_unary(cl, DREY_CLIENT_ADMIN("GetReadinessDetails"), &req.base,
                                &drey__admin__v1__readiness_details__descriptor, NODE_CALL_MS, &a,
                                (ProtobufCMessage **)&d, &st) == GRPC_STATUS_OK &&
              d != NULL && d->cluster != NULL;
    for (size_t i = 0; ok && i < d->cluster->n_replicas; i++) {
        const Drey__Admin__V1__ReadinessDetails__Cluster__PartitionReplica *pr = d->cluster->replicas[i];
        const Drey__Internal__V1__PartitionEntry *e = pr->partition < n ? entries[pr->partition] : NULL;
        if (e == NULL)
            continue;
        /* Only what agrees with the table read from etcd. */
        if (strcmp(pr->role, "primary") == 0 && strcmp(e->primary, m->id) == 0) {
            rep[pr->partition].primary_said = true;
            rep[pr->partition].pending = pr->pending;
        } else if (strcmp(pr->role, "backup") == 0) {
            for (size_t r = 0; r < e->n_replicas; r++) {
                if (strcmp(e->replicas[r], m->id) != 0)
                    continue;
                rep[pr->partition].backups_said++;
                if (pr->lag_ms > rep[pr->partition].lag_ms)
                    rep[pr->partition].lag_ms = pr->lag_ms;
            }
        }
    }
    drey_arena_destroy(&a);
    drey_client_close(cl);
    return ok;
}

static const char *flag_value(int argc, char **argv, const char *name, const char *def) {
    size_t n = strlen(name);
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "--", 2) == 0 && strncmp(argv[i] + 2, name, n) == 0 && argv[i][2 + n] == '=')
            return argv[i] + 3 + n;
    }
    return def;
}

static bool known_flags(int argc, char **argv, const char *const *names) {
    for (int i = 0; i < argc; i++) {
        bool ok = false;
        for (const char *const *n = names; *n != NULL && !ok; n++) {
            size_t len = strlen(*n);
            ok = strncmp(argv[i], "--", 2) == 0 && strncmp(argv[i] + 2, *n, len) == 0 && argv[i][2 + len] == '=';
        }
        if (!ok) {
            fprintf(stderr, "drey cluster: unknown argument %s\n", argv[i]);
            return false;
        }
    }
    return true;
}

static bool parse_u32(const char *s, uint32_t *out) {
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (*s == '\0' || *end != '\0' || v > UINT32_MAX)
        return false;
    *out = (uint32_t)v;
    return true;
}

/* Writes the cluster's config once: the same values again are fine, others
 * are refused (the partition count is fixed for the cluster's life). */
static int init_config(const drey_etcd_options *etcd, const char *prefix, uint32_t partitions,
                       uint32_t replication_factor, uint32_t initial_nodes, char *err, size_t cap) {
    if (partitions < 1 || partitions > 65536) {
        snprintf(err, cap, "--partitions must be 1 to 65536");
        return -1;
    }
    if (replication_factor < 1 || replication_factor > 3) {
        snprintf(err, cap, "--replication-factor must be 1 to 3");
        return -1;
    }
    drey_etcd *e = drey_etcd_open(etcd, err, cap);
    if (e == NULL)
        return -1;
    Drey__Internal__V1__ClusterConfig cfg = DREY__INTERNAL__V1__CLUSTER_CONFIG__INIT;
    cfg.format = DREY__INTERNAL__V1__CLUSTER_CONFIG__FORMAT__FORMAT_V1;
    cfg.partitions = partitions;
    cfg.replication_factor = replication_factor;
    cfg.hash_function = 1;
    cfg.initial_nodes = initial_nodes > 0 ? initial_nodes : 1;
    uint8_t buf[64];
    size_t len = drey__internal__v1__cluster_config__pack(&cfg, buf);
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    size_t pl = strlen(prefix);
    const char *key = drey_arena_sprintf(&a, "%s%sconfig", prefix, pl > 0 && prefix[pl - 1] == '/' ? "" : "/");
    drey_etcd_txn t;
    drey_etcd_txn_init(&t, &a);
    drey_etcd_txn_if_create_revision(&t, key, DREY_ETCD_EQUAL, 0);
    drey_etcd_txn_put(&t, DREY_ETCD_THEN, key, buf, len, 0);
    drey_etcd_txn_get(&t, DREY_ETCD_ELSE, key, false);
    Etcdserverpb__TxnResponse *resp;
    drey_etcd_status st;
    int rc = -1;
    if (drey_etcd_txn_commit(e, &t, CALL_MS, &a, &resp, &st) != GRPC_STATUS_OK) {
        snprintf(err, cap, "cannot reach etcd at %s: %s", etcd->endpoints, st.message);
    } else if (resp->succeeded) {
        rc = 0;
    } else if (resp->n_responses == 1 && resp->responses[0]->response_range != NULL &&
               resp->responses[0]->response_range->n_kvs == 1) {
        const Mvccpb__KeyValue *kv = resp->responses[0]->response_range->kvs[0];
        Drey__Internal__V1__ClusterConfig *old =
            drey__internal__v1__cluster_config__unpack(drey_arena_protobuf_allocator(&a), kv->value.len, kv->value.data);
        if (old != NULL && old->format == cfg.format && old->partitions == cfg.partitions &&
            old->replication_factor == cfg.replication_factor && old->hash_function == cfg.hash_function)
            rc = 0; /* the same again: nothing to do */
        else
            snprintf(err, cap,
                     "a cluster already exists under %s with %u partitions and replication factor %u: its config "
                     "is fixed for its life",
                     key, old != NULL ? old->partitions : 0, old != NULL ? old->replication_factor : 0);
    } else {
        snprintf(err, cap, "unexpected answer from etcd");
    }
    drey_arena_destroy(&a);
    drey_etcd_close(e);
    return rc;
}

static int status(const drey_etcd_options *etcd, const char *prefix, const char *token) {
    char err[256];
    drey_etcd *e = drey_etcd_open(etcd, err, sizeof err);
    if (e == NULL) {
        fprintf(stderr, "drey cluster: %s\n", err);
        return 2;
    }
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    Etcdserverpb__RangeResponse *resp;
    drey_etcd_status st;
    int rc = 1;
    if (drey_etcd_get(e, prefix, true, CALL_MS, &a, &resp, &st) != GRPC_STATUS_OK) {
        fprintf(stderr, "drey cluster: cannot read etcd (%s): %s\n", st.endpoint, st.message);
        goto out;
    }
    size_t plen = strlen(prefix);
    Drey__Internal__V1__ClusterConfig *cfg = NULL;
    const char *controller = "";
    uint32_t owners_cap = 0;
    Drey__Internal__V1__PartitionEntry **entries = NULL; /* per partition */
    for (size_t i = 0; i < resp->n_kvs; i++) {
        const Mvccpb__KeyValue *kv = resp->kvs[i];
        const char *k = (const char *)kv->key.data + plen;
        size_t kl = kv->key.len - plen;
        if (kl == 6 && memcmp(k, "config", 6) == 0) {
            cfg = drey__internal__v1__cluster_config__unpack(drey_arena_protobuf_allocator(&a), kv->value.len,
                                                             kv->value.data);
            if (cfg != NULL && cfg->partitions > 0) {
                owners_cap = cfg->partitions;
                entries = drey_arena_calloc(&a, owners_cap * sizeof *entries);
            }
        } else if (kl == 10 && memcmp(k, "controller", 10) == 0) {
            controller = drey_arena_strndup(&a, (const char *)kv->value.data, kv->value.len);
        }
    }
    if (cfg == NULL) {
        fprintf(stderr, "drey cluster: no cluster under %s (drey cluster init creates one)\n", prefix);
        goto out;
    }
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
                drey_arena_protobuf_allocator(&a), kv->value.len, kv->value.data);
            if (parse_u32(digits, &p) && p < owners_cap && pe != NULL) {
                entries[p] = pe;
            }
        }
    }
    printf("{\"partitions\":%u,\"replicationFactor\":%u,\"controller\":\"%s\",\"nodes\":[", cfg->partitions,
           cfg->replication_factor, controller);
    reported *rep = drey_arena_calloc(&a, (owners_cap ? owners_cap : 1) * sizeof *rep);
    const char **unanswered = drey_arena_calloc(&a, (resp->n_kvs ? resp->n_kvs : 1) * sizeof *unanswered);
    size_t n_unanswered = 0;
    bool first = true;
    for (size_t i = 0; i < resp->n_kvs; i++) {
        const Mvccpb__KeyValue *kv = resp->kvs[i];
        const char *k = (const char *)kv->key.data + plen;
        size_t kl = kv->key.len - plen;
        if (kl <= 6 || memcmp(k, "nodes/", 6) != 0)
            continue;
        Drey__Internal__V1__Member *m =
            drey__internal__v1__member__unpack(drey_arena_protobuf_allocator(&a), kv->value.len, kv->value.data);
        if (m == NULL)
            continue;
        if (cfg->replication_factor > 1 && !ask_member(m, token, entries, owners_cap, rep))
            unanswered[n_unanswered++] = m->id;
        uint32_t owned = 0, backups = 0;
        for (uint32_t p = 0; p < owners_cap; p++) {
            owned += entries[p] != NULL && strcmp(entries[p]->primary, m->id) == 0;
            for (size_t r = 0; entries[p] != NULL && r < entries[p]->n_replicas; r++)
                backups += strcmp(entries[p]->replicas[r], m->id) == 0;
        }
        printf("%s{\"id\":\"%s\",\"advertise\":\"%s\",\"internal\":\"%s\",\"partitions\":%u,\"backups\":%u,"
               "\"draining\":%s}",
               first ? "" : ",", m->id, m->advertise, m->internal, owned, backups, m->draining ? "true" : "false");
        first = false;
    }
    uint32_t unowned = 0, under = 0;
    for (uint32_t p = 0; p < owners_cap; p++) {
        unowned += entries[p] == NULL || entries[p]->primary[0] == '\0';
        under += entries[p] != NULL && entries[p]->primary[0] != '\0' &&
                 1 + entries[p]->n_replicas < cfg->replication_factor;
    }
    /* Each partition's primary, in-sync backups and the copies under way
     * (new backups), in id order. */
    printf("],\"unassignedPartitions\":%u,\"underReplicatedPartitions\":%u,\"unanswered\":[", unowned, under);
    for (size_t i = 0; i < n_unanswered; i++)
        printf("%s\"%s\"", i ? "," : "", unanswered[i]);
    /* pending: the primary's writes waiting for backups; lagMs: the
     * stalest in-sync backup's lag (null: not every one answered). */
    printf("],\"table\":[");
    for (uint32_t p = 0; p < owners_cap; p++) {
        const Drey__Internal__V1__PartitionEntry *pe = entries[p];
        printf("%s{\"partition\":%u,\"primary\":\"%s\",\"inSync\":[", p ? "," : "", p, pe != NULL ? pe->primary : "");
        for (size_t r = 0; pe != NULL && r < pe->n_replicas; r++)
            printf("%s\"%s\"", r ? "," : "", pe->replicas[r]);
        printf("],\"syncing\":[");
        for (size_t r = 0; pe != NULL && r < pe->n_syncing; r++)
            printf("%s\"%s\"", r ? "," : "", pe->syncing[r]);
        printf("]");
        if (cfg->replication_factor > 1 && pe != NULL) {
            if (rep[p].primary_said)
                printf(",\"pending\":%" PRIu64, rep[p].pending);
            if (pe->n_replicas > 0 && rep[p].backups_said == pe->n_replicas && rep[p].lag_ms != UINT64_MAX)
                printf(",\"lagMs\":%" PRIu64, rep[p].lag_ms);
            else if (pe->n_replicas > 0)
                printf(",\"lagMs\":null");
        }
        printf("}");
    }
    /* Moves planned or under way: the owner copies, then hands over. */
    printf("],\"moves\":[");
    first = true;
    for (uint32_t p = 0; p < owners_cap; p++) {
        if (entries[p] == NULL || entries[p]->n_joining == 0)
            continue;
        printf("%s{\"partition\":%u,\"from\":\"%s\",\"to\":\"%s\"}", first ? "" : ",", p, entries[p]->primary,
               entries[p]->joining[0]);
        first = false;
    }
    printf("]}\n");
    rc = 0;
out:
    drey_arena_destroy(&a);
    drey_etcd_close(e);
    return rc;
}

/* --etcd-*, else the variable dreyd reads for the same setting (a pod's
 * environment configures both), else none. */
static const char *etcd_flag(int argc, char **argv, const char *name, const char *var) {
    return flag_value(argc, argv, name, getenv(var));
}

int drey_cli_cluster(int argc, char **argv) {
#define ETCD_FLAGS "etcd", "etcd-ca", "etcd-cert", "etcd-key", "etcd-user", "etcd-password-file"
    static const char *const init_flags[] = {ETCD_FLAGS, "prefix", "partitions", "replication-factor",
                                             "initial-nodes", NULL};
    static const char *const status_flags[] = {ETCD_FLAGS, "prefix", "token", NULL};
#undef ETCD_FLAGS
    if (argc < 1 || (strcmp(argv[0], "init") != 0 && strcmp(argv[0], "status") != 0)) {
        fprintf(stderr, "usage: drey cluster init --etcd=URLS [--prefix=drey/] [--partitions=256] "
                        "[--replication-factor=2] [--initial-nodes=1]\n"
                        "       drey cluster status --etcd=URLS [--prefix=drey/] [--token=JWT]\n"
                        "etcd over TLS and with its authentication (both commands):\n"
                        "       [--etcd-ca=PEM] [--etcd-cert=PEM --etcd-key=PEM] "
                        "[--etcd-user=NAME --etcd-password-file=FILE]\n"
                        "       (or dreyd's variables, as a pod sets them: DREY_CLUSTER_ETCD, DREY_CLUSTER_PREFIX, "
                        "DREY_CLUSTER_ETCD_CA, DREY_CLUSTER_ETCD_CERT, DREY_CLUSTER_ETCD_KEY, DREY_CLUSTER_ETCD_USER, "
                        "DREY_CLUSTER_ETCD_PASSWORD_FILE)\n");
        return 2;
    }
    bool init = strcmp(argv[0], "init") == 0;
    if (!known_flags(argc - 1, argv + 1, init ? init_flags : status_flags))
        return 2;
    const char *etcd = flag_value(argc - 1, argv + 1, "etcd", getenv("DREY_CLUSTER_ETCD"));
    if (etcd == NULL || etcd[0] == '\0') {
        fprintf(stderr, "drey cluster: --etcd=URLS is required\n");
        return 2;
    }
    drey_etcd_options eo = {
        .endpoints = etcd,
        .tls = {.ca_file = etcd_flag(argc - 1, argv + 1, "etcd-ca", "DREY_CLUSTER_ETCD_CA"),
                .cert_file = etcd_flag(argc - 1, argv + 1, "etcd-cert", "DREY_CLUSTER_ETCD_CERT"),
                .key_file = etcd_flag(argc - 1, argv + 1, "etcd-key", "DREY_CLUSTER_ETCD_KEY")},
        .user = etcd_flag(argc - 1, argv + 1, "etcd-user", "DREY_CLUSTER_ETCD_USER"),
        .password_file = etcd_flag(argc - 1, argv + 1, "etcd-password-file", "DREY_CLUSTER_ETCD_PASSWORD_FILE"),
    };
    const char *prefix_env = getenv("DREY_CLUSTER_PREFIX");
    const char *prefix_flag =
        flag_value(argc - 1, argv + 1, "prefix", prefix_env != NULL && prefix_env[0] != '\0' ? prefix_env : "drey/");
    size_t pl = strlen(prefix_flag);
    char prefix[256];
    snprintf(prefix, sizeof prefix, "%s%s", prefix_flag, pl > 0 && prefix_flag[pl - 1] == '/' ? "" : "/");
    if (!init)
        return status(&eo, prefix, flag_value(argc - 1, argv + 1, "token", getenv("DREY_TOKEN")));
    uint32_t partitions, rf, initial;
    if (!parse_u32(flag_value(argc - 1, argv + 1, "partitions", "256"), &partitions) ||
        !parse_u32(flag_value(argc - 1, argv + 1, "replication-factor", "2"), &rf) ||
        !parse_u32(flag_value(argc - 1, argv + 1, "initial-nodes", "1"), &initial)) {
        fprintf(stderr, "drey cluster: --partitions, --replication-factor and --initial-nodes take numbers\n");
        return 2;
    }
    char err[320];
    if (init_config(&eo, prefix, partitions, rf, initial, err, sizeof err) != 0) {
        fprintf(stderr, "drey cluster init: %s\n", err);
        return 1;
    }
    printf("{\"partitions\":%u,\"replicationFactor\":%u,\"initialNodes\":%u}\n", partitions, rf, initial);
    return 0;
}
