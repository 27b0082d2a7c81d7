/* The C client's near cache on a cluster node: Debian's etcd and two dreyd
 * (n1, n2). Its whole-cache watch on n1 follows both owners; when n2 is
 * SIGKILLed the watch says RESYNC_REQUIRED OWNER_LOST and the near cache
 * serves nothing from memory (a read of a key is not kept) until the
 * WATCHING that follows n2's return; then it caches again, and a write's
 * event invalidates as on a single node. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "drey/clock.h"
#include "harness.h"

static char dir[512], ca[600], ca_key[600], etcd_url[64], prefix[64];
static harness_proc etcd;
static harness_server n1, n2;

#define KEYS 16 /* over 8 partitions: both nodes own some */

/* Paces a poll; never a synchronisation. */
static void pace(void) {
    nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
}

static void openssl(const char *const *args) {
    const char *argv[32] = {"/usr/bin/openssl"};
    size_t n = 1;
    for (size_t i = 0; args[i] != NULL; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    char *err = NULL;
    int rc = harness_run(argv, NULL, &err);
    cr_assert_eq(rc, 0, "openssl %s: %s", args[0], err);
    free(err);
}

/* A certificate of the cluster CA for node id (SAN DNS:id), like the
 * Python harness's ClusterCA. */
static void issue(const char *id, char *cert, char *key, size_t cap) {
    char csr[600], ext[600], subj[64];
    snprintf(key, cap, "%s/%s.key", dir, id);
    snprintf(cert, cap, "%s/%s.pem", dir, id);
    snprintf(csr, sizeof csr, "%s/%s.csr", dir, id);
    snprintf(ext, sizeof ext, "%s/%s.ext", dir, id);
    snprintf(subj, sizeof subj, "/CN=%s", id);
    FILE *f = fopen(ext, "w");
    cr_assert_not_null(f);
    fprintf(f, "subjectAltName=DNS:%s\nextendedKeyUsage=serverAuth,clientAuth\n", id);
    fclose(f);
    openssl((const char *const[]){"req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                                  "-keyout", key, "-out", csr, "-subj", subj, NULL});
    openssl((const char *const[]){"x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-set_serial",
                                  id[1] == '1' ? "1" : "2", "-out", cert, "-days", "2", "-extfile", ext, NULL});
}

static void start_node(harness_server *s, const char *id) {
    static char certs[2][2][600];
    char(*c)[600] = certs[id[1] == '1' ? 0 : 1];
    if (c[0][0] == '\0')
        issue(id, c[0], c[1], sizeof c[0]);
    char node[64], etcd_flag[96], prefix_flag[96], cert[700], key[700], ca_flag[700];
    snprintf(node, sizeof node, "--node-id=%s", id);
    snprintf(etcd_flag, sizeof etcd_flag, "--cluster-etcd=%s", etcd_url);
    snprintf(prefix_flag, sizeof prefix_flag, "--cluster-prefix=%s", prefix);
    snprintf(cert, sizeof cert, "--internal-tls-cert=%s", c[0]);
    snprintf(key, sizeof key, "--internal-tls-key=%s", c[1]);
    snprintf(ca_flag, sizeof ca_flag, "--internal-tls-ca=%s", ca);
    const char *const flags[] = {node, etcd_flag, prefix_flag, "--internal-listen=127.0.0.1:0", cert, key, ca_flag,
                                 "--cluster-lease-ttl=2s", "--cluster-drain-timeout=0", "--ephemeral", NULL};
    harness_start(s, flags);
}

static void up(void) {
    harness_mkdtemp(dir, sizeof dir, "drey-near-cluster");
    int cp = harness_free_port(), pp = harness_free_port();
    char client[64], peer[64], data[600], listen_c[96], adv_c[96], listen_p[96], adv_p[96], initial[96];
    snprintf(client, sizeof client, "http://127.0.0.1:%d", cp);
    snprintf(peer, sizeof peer, "http://127.0.0.1:%d", pp);
    snprintf(etcd_url, sizeof etcd_url, "%s", client);
    snprintf(data, sizeof data, "--data-dir=%s/etcd", dir);
    snprintf(listen_c, sizeof listen_c, "--listen-client-urls=%s", client);
    snprintf(adv_c, sizeof adv_c, "--advertise-client-urls=%s", client);
    snprintf(listen_p, sizeof listen_p, "--listen-peer-urls=%s", peer);
    snprintf(adv_p, sizeof adv_p, "--initial-advertise-peer-urls=%s", peer);
    snprintf(initial, sizeof initial, "--initial-cluster=default=%s", peer);
    harness_spawn(&etcd, (const char *const[]){"/usr/bin/etcd", "--name=default", data, listen_c, adv_c, listen_p, adv_p,
                                               initial, NULL});
    snprintf(ca, sizeof ca, "%s/ca.pem", dir);
    snprintf(ca_key, sizeof ca_key, "%s/ca.key", dir);
    openssl((const char *const[]){"req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                                  "-keyout", ca_key, "-out", ca, "-days", "2", "-subj", "/CN=drey-cluster-ca", NULL});
    /* `drey cluster init` succeeds once etcd answers. */
    snprintf(prefix, sizeof prefix, "drey-near-%d/", (int)getpid());
    char bin[1024], etcd_arg[96], prefix_arg[96];
    harness_binary("drey", bin, sizeof bin);
    snprintf(etcd_arg, sizeof etcd_arg, "--etcd=%s", etcd_url);
    snprintf(prefix_arg, sizeof prefix_arg, "--prefix=%s", prefix);
    const char *const init[] = {bin, "cluster", "init", etcd_arg, prefix_arg, "--partitions=8", "--initial-nodes=2",
                                NULL};
    int64_t deadline = drey_mono_ms() + HARNESS_DEADLINE_MS;
    int rc;
    while ((rc = harness_run(init, NULL, NULL)) != 0 && drey_mono_ms() < deadline)
        pace();
    cr_assert_eq(rc, 0, "drey cluster init never succeeded");
    start_node(&n1, "n1");
    start_node(&n2, "n2");
}

static void down(void) {
    harness_stop(&n1);
    harness_stop(&n2);
    harness_proc_kill(&etcd);
    harness_rmdir(dir);
}

TestSuite(near_cluster, .init = up, .fini = down, .timeout = 180);

static drey_near_stats stats(drey_near_cache *n) {
    drey_near_stats s;
    drey_near_get_stats(n, &s);
    return s;
}

/* Writes every key through n1 (the absence of a value is never kept). */
static void set_all(void) {
    drey_client *c = harness_client(&n1);
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    for (int i = 0; i < KEYS; i++) {
        char key[16];
        snprintf(key, sizeof key, "k%d", i);
        Drey__Cache__V1__Value v = DREY__CACHE__V1__VALUE__INIT;
        v.kind_case = DREY__CACHE__V1__VALUE__KIND_STRING_VALUE;
        v.string_value = key;
        Drey__Cache__V1__SetRequest req = DREY__CACHE__V1__SET_REQUEST__INIT;
        req.cache = "nc";
        req.key = key;
        req.value = &v;
        ProtobufCMessage *resp;
        drey_client_status st;
        grpc_status_code code = drey_client_unary(c, DREY_CLIENT_CACHE("Set"), &req.base,
                                                  &drey__cache__v1__set_response__descriptor, HARNESS_DEADLINE_MS,
                                                  &a, &resp, &st);
        cr_assert_eq(code, GRPC_STATUS_OK, "Set %s: %s", key, st.message);
        drey_arena_reset(&a);
    }
    drey_arena_destroy(&a);
    drey_client_close(c);
}

/* Reads every key twice: how many second reads were served from memory. */
static int second_reads_hit(drey_near_cache *n) {
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    int hit = 0;
    for (int i = 0; i < KEYS; i++) {
        char key[16];
        snprintf(key, sizeof key, "k%d", i);
        bool found;
        Drey__Cache__V1__Value *v;
        uint64_t version;
        drey_client_status st;
        drey_near_get(n, key, HARNESS_DEADLINE_MS, &a, &found, &v, &version, &st);
        uint64_t hits = stats(n).hits;
        drey_near_get(n, key, HARNESS_DEADLINE_MS, &a, &found, &v, &version, &st);
        hit += stats(n).hits > hits;
        drey_arena_reset(&a);
    }
    drey_arena_destroy(&a);
    return hit;
}

static bool wait_for(drey_near_cache *n, bool (*done)(const drey_near_stats *s, uint64_t base), uint64_t base) {
    int64_t deadline = drey_mono_ms() + HARNESS_DEADLINE_MS;
    while (drey_mono_ms() < deadline) {
        drey_near_stats s = stats(n);
        if (done(&s, base))
            return true;
        pace();
    }
    return false;
}

static bool resynced(const drey_near_stats *s, uint64_t base) {
    return s->resyncs > base;
}

static bool watching_again(const drey_near_stats *s, uint64_t base) {
    return s->watches > base;
}

Test(near_cluster, serves_nothing_from_a_lost_owner_to_the_watching_after_it) {
    drey_near_options o = {.server = {.target = n1.addr}, .cache = "nc"};
    char err[256];
    /* WATCHING comes once both owners' subscriptions are in place, which
     * needs the table: open waits for it. */
    drey_near_cache *n = drey_near_open(&o, HARNESS_DEADLINE_MS, err, sizeof err);
    cr_assert_not_null(n, "%s", err);
    set_all();
    cr_assert_eq(second_reads_hit(n), KEYS, "a watching near cache serves from memory");

    drey_near_stats before = stats(n);
    harness_kill(&n2);
    cr_assert(wait_for(n, resynced, before.resyncs), "RESYNC_REQUIRED after n2 died");
    cr_assert_eq(stats(n).entries, 0);
    /* n1's keys are read (n2's fail): none is kept, the watch covers nothing */
    cr_assert_eq(second_reads_hit(n), 0, "nothing kept between OWNER_LOST and WATCHING");
    cr_assert_gt(stats(n).misses, before.misses);

    uint64_t watches = stats(n).watches;
    start_node(&n2, "n2");
    cr_assert(wait_for(n, watching_again, watches), "WATCHING once n2 is back");
    set_all(); /* n2 came back empty (ephemeral) */
    cr_assert_eq(second_reads_hit(n), KEYS, "caching again");
    drey_near_close(n);
}
