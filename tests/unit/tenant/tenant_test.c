/* The tenants' table against a real store: numbers, exact byte counts
 * through every way an entry comes and goes, admission with reservations,
 * the top tenants and the "other" row, and the metrics. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/store.h"
#include "drey/tenant.h"

static drey_store *store;
static drey_tenants *tenants;

static void up(void) {
    store = drey_store_create();
    tenants = drey_tenants_create(store);
}

static void down(void) {
    drey_store_destroy(store);
    drey_tenants_destroy(tenants);
}

TestSuite(tenant, .init = up, .fini = down);

static drey_key key_of(const char *cache, const char *key) {
    drey_key k;
    drey_store_key(store, &k, cache, strlen(cache), key, strlen(key));
    return k;
}

static void put(uint32_t tenant, const char *cache, const char *key, size_t len, int64_t expires) {
    static uint8_t buf[4096];
    drey_value v = {.kind = DREY_VALUE_BYTES, .data = buf, .len = (uint32_t)len};
    drey_key k = key_of(cache, key);
    drey_store_txn t;
    drey_store_txn_begin(store, &t, &k, 1);
    t.tenant = tenant;
    drey_store_txn_put(&t, &k, &v, expires, drey_store_next_version(store));
    drey_store_txn_end(&t);
}

static void removed(const char *cache, const char *key) {
    drey_key k = key_of(cache, key);
    drey_store_txn t;
    drey_store_txn_begin(store, &t, &k, 1);
    cr_assert(drey_store_txn_remove(&t, &k));
    drey_store_txn_end(&t);
}

static int64_t bytes(const char *cache, const char *key, size_t len) {
    return (int64_t)drey_store_entry_bytes(strlen(cache), strlen(key), len);
}

Test(tenant, numbers_are_stable_and_names_come_back) {
    uint32_t a = drey_tenants_intern(tenants, "acme", 4), b = drey_tenants_intern(tenants, "beta", 4);
    cr_assert_neq(a, 0);
    cr_assert_neq(a, b);
    cr_assert_eq(drey_tenants_intern(tenants, "acme", 4), a);
    cr_assert_eq(drey_tenants_intern(tenants, "", 0), 0, "no tenant");
    size_t n;
    cr_assert_str_eq(drey_store_tenant_name(store, a, &n), "acme");
    cr_assert_eq(n, 4);
    cr_assert_eq(drey_store_tenant_id(store, "beta", 4), b, "the store asks the table");
    for (int i = 0; i < 3000; i++) { /* the map grows */
        char name[16];
        snprintf(name, sizeof name, "t%d", i);
        uint32_t id = drey_tenants_intern(tenants, name, strlen(name));
        cr_assert_eq(drey_tenants_intern(tenants, name, strlen(name)), id);
    }
    cr_assert_eq(drey_tenants_intern(tenants, "acme", 4), a);
}

Test(tenant, bytes_follow_every_change_of_an_entry) {
    uint32_t a = drey_tenants_intern(tenants, "acme", 4), b = drey_tenants_intern(tenants, "beta", 4);
    put(a, "c", "k1", 100, 0);
    cr_assert_eq(drey_tenants_used(tenants, a), bytes("c", "k1", 100));
    put(a, "c", "k1", 300, 0); /* replaced by its own tenant */
    cr_assert_eq(drey_tenants_used(tenants, a), bytes("c", "k1", 300));
    put(b, "c", "k1", 50, 0); /* another tenant takes it over */
    cr_assert_eq(drey_tenants_used(tenants, a), 0);
    cr_assert_eq(drey_tenants_used(tenants, b), bytes("c", "k1", 50));
    put(0, "c", "k1", 10, 0); /* and nobody's write */
    cr_assert_eq(drey_tenants_used(tenants, b), 0);
    put(a, "c", "k2", 10, 0);
    removed("c", "k2");
    cr_assert_eq(drey_tenants_used(tenants, a), 0);

    put(a, "c", "short", 20, 1000); /* expired at 1000 ms */
    cr_assert_gt(drey_tenants_used(tenants, a), 0);
    size_t expired = 0;
    for (int i = 0; i < 4 * DREY_STORE_SHARDS; i++)
        drey_store_sweep(store, 5000, 1 << 20, &expired);
    cr_assert_eq(drey_tenants_used(tenants, a), 0, "swept");

    put(a, "c", "victim", 30, 0);
    drey_key k = key_of("c", "victim");
    drey_entry_view e;
    drey_store_txn t;
    drey_store_txn_begin(store, &t, &k, 1);
    cr_assert(drey_store_txn_get(&t, &k, 0, &e));
    cr_assert_eq(e.tenant, a, "readers see whose it is");
    cr_assert_gt(drey_store_txn_evict(&t, &k, e.version), 0);
    drey_store_txn_end(&t);
    cr_assert_eq(drey_tenants_used(tenants, a), 0, "evicted");

    put(a, "gone", "x", 40, 0);
    drey_store_clear_cache(store, "gone", 4);
    cr_assert_gt(drey_tenants_used(tenants, a), 0, "counted until the sweep frees it");
    for (int i = 0; i < 4 * DREY_STORE_SHARDS; i++)
        drey_store_sweep(store, 5000, 1 << 20, &expired);
    cr_assert_eq(drey_tenants_used(tenants, a), 0);

    put(a, "c", "z", 40, 0);
    drey_store_clear(store); /* recovery starting over */
    cr_assert_eq(drey_tenants_used(tenants, a), 0);
}

Test(tenant, admission_reserves_what_it_admits) {
    uint32_t a = drey_tenants_intern(tenants, "acme", 4);
    put(a, "c", "k", 1000, 0);
    int64_t used = drey_tenants_used(tenants, a);
    drey_tenant_admission adm;
    drey_tenant_ask ask = {.tenant = a, .limit_bytes = used + 500, .growth_bytes = 400};
    cr_assert_eq(drey_tenants_admit(tenants, &ask, &adm), DREY_TENANT_ADMITTED);
    /* A second one would fit alone, not with the first's reservation. */
    cr_assert_eq(drey_tenants_admit(tenants, &ask, &adm), DREY_TENANT_REFUSED);
    cr_assert_eq(adm.used_bytes, used + 400, "used counts what is reserved");
    cr_assert_eq(adm.limit_bytes, used + 500);
    drey_tenants_release(tenants, a, 400);
    cr_assert_eq(drey_tenants_admit(tenants, &ask, &adm), DREY_TENANT_ADMITTED);
    drey_tenants_release(tenants, a, 400);
    drey_tenants_refused(tenants, a);
    drey_tenant_stats top[4];
    drey_tenants_summary sum;
    cr_assert_eq(drey_tenants_top(tenants, top, 4, &sum), 1);
    cr_assert_eq(top[0].refused_writes, 1);
    cr_assert_eq(top[0].limit_bytes, used + 500, "the quota last seen (no policy to ask)");
    cr_assert_eq(top[0].granted_bytes, used + 500, "a single node holds its whole quota");
    cr_assert_eq(top[0].cluster_used_bytes, used);
}

static int64_t limit_of(void *ctx, const char *tenant, size_t len) {
    (void)ctx;
    return len == 3 && memcmp(tenant, "t00", 3) == 0 ? 123 : 1000000;
}

Test(tenant, the_top_and_one_other_row) {
    drey_tenants_set_limits(tenants, limit_of, NULL);
    for (int i = 0; i < 12; i++) {
        char name[16];
        snprintf(name, sizeof name, "t%02d", i);
        put(drey_tenants_intern(tenants, name, 3), "c", name, (size_t)(100 * (i + 1)), 0);
    }
    drey_tenants_intern(tenants, "idle", 4); /* no entries: not listed */
    drey_tenant_stats top[10];
    drey_tenants_summary sum;
    size_t n = drey_tenants_top(tenants, top, 10, &sum);
    cr_assert_eq(n, 10);
    cr_assert_eq(sum.tenants, 12);
    for (size_t i = 0; i < n; i++) {
        char want[8];
        snprintf(want, sizeof want, "t%02zu", 11 - i);
        cr_assert_str_eq(top[i].tenant, want, "largest first");
    }
    cr_assert_eq(sum.other_tenants, 2);
    cr_assert_eq(sum.other.used_bytes, bytes("c", "t00", 100) + bytes("c", "t01", 200));

    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    drey_tenants_collect_metrics(tenants, f);
    fclose(f);
    char want[128];
    snprintf(want, sizeof want, "drey_tenant_used_bytes{tenant=\"t11\"} %lld", (long long)bytes("c", "t11", 1200));
    cr_assert(strstr(text, want) != NULL, "%s", text);
    snprintf(want, sizeof want, "drey_tenant_used_bytes{tenant=\"other\"} %lld", (long long)sum.other.used_bytes);
    cr_assert(strstr(text, want) != NULL, "%s", text);
    cr_assert(strstr(text, "drey_tenant_limit_bytes{tenant=\"t11\"} 1000000") != NULL);
    cr_assert(strstr(text, "tenant=\"t00\"") == NULL, "beyond the top only the other row");
    cr_assert(strstr(text, "drey_tenants 12") != NULL);
    cr_assert(strstr(text, "drey_tenant_granted_bytes") == NULL, "a single node has no shares");
    free(text);
}

Test(tenant, snapshots_and_walks_name_the_tenant) {
    uint32_t a = drey_tenants_intern(tenants, "acme", 4);
    put(a, "c", "k", 10, 0);
    put(0, "c", "free", 10, 0);
    drey_key k = key_of("c", "k");
    cr_assert_eq(drey_store_entry_size_tenant(store, &k, 0, &(uint32_t){0}), (size_t)bytes("c", "k", 10));
    uint32_t owner = 99;
    drey_store_entry_size_tenant(store, &k, 0, &owner);
    cr_assert_eq(owner, a);
    /* A loaded item that names its tenant by name is counted under it. */
    drey_store_item it = {.cache = "c", .cache_len = 1, .key = "loaded", .key_len = 6,
                          .entry = {.value = {.kind = DREY_VALUE_BYTES, .data = (const uint8_t *)"", .len = 0},
                                    .version = 1000},
                          .tenant = a};
    drey_store_load(store, &it);
    cr_assert_eq(drey_tenants_used(tenants, a), bytes("c", "k", 10) + bytes("c", "loaded", 0));
}

/* A cluster node's store is partitioned at join and drops whole partitions
 * (a move's Drop, Import's replace): the tenants' bytes follow. Moving the
 * entries into their partitions' tables changes nobody's bytes and keeps
 * each entry's tenant; removing a partition takes exactly its entries'
 * bytes from their tenants. */
static uint32_t by_first_letter(const char *cache, size_t cache_len, const char *key, size_t key_len, uint32_t n) {
    (void)cache;
    (void)cache_len;
    return key_len > 0 ? (uint32_t)(key[0] - 'a') % n : 0;
}

static void tenant_of_walked(void *arg, const drey_store_item *it) {
    uint32_t *seen = arg;
    seen[it->key[0] - 'a'] = it->tenant;
}

Test(tenant, bytes_follow_a_partitioned_store_and_a_partitions_removal) {
    uint32_t a = drey_tenants_intern(tenants, "acme", 4), b = drey_tenants_intern(tenants, "beta", 4);
    put(a, "c", "a1", 100, 0); /* partition 0 */
    put(b, "c", "a2", 50, 0);  /* partition 0 */
    put(a, "c", "b1", 70, 0);  /* partition 1 */
    put(b, "c", "c1", 30, 0);  /* partition 2 */
    int64_t used_a = drey_tenants_used(tenants, a), used_b = drey_tenants_used(tenants, b);
    cr_assert(drey_store_set_partitions(store, 4, by_first_letter));
    cr_assert_eq(drey_tenants_used(tenants, a), used_a, "partitioning moves entries, not bytes");
    cr_assert_eq(drey_tenants_used(tenants, b), used_b);
    drey_key k = key_of("c", "b1"); /* a key made under the new layout */
    uint32_t owner = 0;
    cr_assert_eq(drey_store_entry_size_tenant(store, &k, 0, &owner), (size_t)bytes("c", "b1", 70));
    cr_assert_eq(owner, a, "an entry keeps its tenant in its partition's table");
    uint32_t seen[3] = {0};
    for (uint32_t p = 0; p < 3; p++) {
        drey_store_scan_pos pos = {0, 0};
        while (pos.shard != DREY_STORE_SCAN_DONE)
            drey_store_partition_walk(store, p, 0, &pos, 1, tenant_of_walked, seen);
    }
    cr_assert_eq(seen[1], a, "a partition's walk names the tenant (a move carries it)");
    cr_assert_eq(seen[2], b);
    put(b, "c", "b1", 10, 0); /* taken over after partitioning */
    cr_assert_eq(drey_tenants_used(tenants, a), used_a - bytes("c", "b1", 70));
    cr_assert_eq(drey_tenants_used(tenants, b), used_b + bytes("c", "b1", 10));
    cr_assert_eq(drey_store_partition_remove(store, 0, 0), 2);
    cr_assert_eq(drey_tenants_used(tenants, a), 0, "a1 went with partition 0, b1 is beta's now");
    cr_assert_eq(drey_tenants_used(tenants, b), bytes("c", "b1", 10) + bytes("c", "c1", 30));
}
