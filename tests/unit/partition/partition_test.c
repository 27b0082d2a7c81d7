/*
 * Unit tests for src/partition: where an entry belongs, and the Import and
 * Drop writes a partition moves with.
 *
 * A real store, cache service and commit (partitioned, as on a cluster
 * node) apply real writes; Import and Drop are found in the method table by
 * path, as replay finds them, and applied through it. Each test pins one
 * promise: an outcome lives in its write's partition; an import puts
 * entries with their versions and expiry, replaces a stale copy, removes
 * what the sender removed and raises the version counter; a drop removes
 * exactly its partition (outcomes included); a malformed record changes
 * nothing.
 */
#include <criterion/criterion.h>

#include "drey/internal/v1/move.pb-c.h"
#include "drey/partition.h"
#include "drey/placement.h"
#include "tests/unit/write_stack.h"

#define N 16
#define T0 1700000000000LL

static write_stack s;
static drey_partition *parts;
static drey_arena arena;

static void setup(void) {
    stack_create(&s, 60000);
    /* A cluster node's commit: outcome keys name their write's key. */
    drey_commit_destroy(s.commit);
    drey_commit_options co = {.store = s.store, .methods = s.methods, .idempotency_retention_ms = 60000,
                              .partitioned = true};
    s.commit = drey_commit_create(&co);
    parts = drey_partition_create(s.store);
    cr_assert(drey_partition_register(s.methods, parts));
    drey_arena_init(&arena, NULL, 0);
}

static void teardown(void) {
    drey_arena_destroy(&arena);
    stack_destroy(&s);
    drey_partition_destroy(parts);
}

TestSuite(partition, .init = setup, .fini = teardown, .timeout = 60);

static uint32_t part(const char *cache, const char *key) {
    return drey_placement_partition(cache, strlen(cache), key, strlen(key), N);
}

/* The first key of "k<i>" in partition p (or not in it). */
static const char *key_in(uint32_t p, bool in, int from) {
    static char buf[8][32];
    static int slot;
    char *b = buf[slot++ % 8];
    for (int i = from;; i++) {
        snprintf(b, 32, "k%d", i);
        if ((part("c", b) == p) == in)
            return b;
    }
}

static void set(const char *key, const char *value, const char *request_id) {
    drey_write w;
    make_set(&s, &w, &arena, "c", key, value, 0, -1, request_id, "jwt:alice");
    drey_status st;
    drey_status_init(&st);
    drey_apply ax = {.now_ms = T0, .arena = &arena, .status = &st};
    cr_assert_not_null(drey_commit_apply(s.commit, &w, &ax));
}

/* Applies a Partitions write through the table; the response or NULL with st. */
static ProtobufCMessage *apply(const char *path, const ProtobufCMessage *req, drey_status *st) {
    const drey_method *m = drey_method_find(s.methods, path);
    cr_assert_not_null(m);
    cr_assert((m->flags & DREY_METHOD_PEER) && (m->flags & DREY_METHOD_WRITE), "only peers, and journaled");
    drey_status_init(st);
    drey_write w;
    size_t len = protobuf_c_message_get_packed_size(req);
    uint8_t *bytes = drey_arena_alloc(&arena, len ? len : 1);
    protobuf_c_message_pack(req, bytes);
    ProtobufCMessage *decoded = protobuf_c_message_unpack(m->desc->input, drey_arena_protobuf_allocator(&arena),
                                                          len, bytes);
    drey_commit_write_init(&w, m, decoded, bytes, len, "");
    drey_apply ax = {.now_ms = T0, .arena = &arena, .status = st};
    return drey_commit_apply(s.commit, &w, &ax);
}

typedef struct counted {
    uint32_t p;
    size_t n, outcomes;
} counted;

static void count(void *arg, const drey_store_item *it) {
    counted *c = arg;
    if (drey_partition_of_entry(it->cache, it->cache_len, it->key, it->key_len, N) != c->p)
        return;
    c->n++;
    c->outcomes += it->cache_len > 0 && it->cache[0] == '#';
}

static counted in_partition(uint32_t p) {
    counted c = {.p = p};
    for (size_t sh = 0; sh < DREY_STORE_SHARDS; sh++)
        drey_store_walk_shard(s.store, sh, T0, count, &c);
    return c;
}

Test(partition, an_outcome_lives_in_its_writes_partition) {
    for (int i = 0; i < 50; i++) {
        char key[16], rid[16];
        snprintf(key, sizeof key, "k%d", i);
        snprintf(rid, sizeof rid, "r%d", i);
        set(key, "v", rid);
    }
    size_t outcomes = 0;
    for (uint32_t p = 0; p < N; p++) {
        counted c = in_partition(p);
        cr_assert_eq(c.n, 2 * c.outcomes, "partition %u: one outcome beside each entry", p);
        outcomes += c.outcomes;
    }
    cr_assert_eq(outcomes, 50, "every outcome is in some partition");
    /* An outcome from before the node was partitioned names no write. */
    const char legacy[] = "jwt:alice\0r1";
    cr_assert_eq(drey_partition_of_entry("#outcomes", 9, legacy, sizeof legacy - 1, N), DREY_PARTITION_NONE);
    const char scoped[] = "jwt:alice\0r1\0c\x1f{tag}x";
    cr_assert_eq(drey_partition_of_entry("#outcomes", 9, scoped, sizeof scoped - 1, N), part("c", "{tag}y"),
                 "hash tags place the outcome with its key");
}

static Drey__Internal__V1__MovedEntry moved(const char *key, const char *value, uint64_t version, int64_t expires) {
    Drey__Internal__V1__MovedEntry e = DREY__INTERNAL__V1__MOVED_ENTRY__INIT;
    e.cache = (ProtobufCBinaryData){.len = 1, .data = (uint8_t *)"c"};
    e.key = (ProtobufCBinaryData){.len = strlen(key), .data = (uint8_t *)key};
    e.kind = DREY_VALUE_STRING;
    e.value = (ProtobufCBinaryData){.len = strlen(value), .data = (uint8_t *)value};
    e.version = version;
    e.expires_at_ms = expires;
    return e;
}

Test(partition, an_import_replaces_a_stale_copy_and_keeps_versions) {
    uint32_t p = part("c", "k0");
    const char *stale = key_in(p, true, 1), *other = key_in(p, false, 0);
    set(stale, "old", "");
    set(other, "stays", "");
    Drey__Internal__V1__MovedEntry a = moved("k0", "moved", 900, 0), b = moved("kx", "x", 901, T0 + 5000);
    b.key = (ProtobufCBinaryData){.len = strlen(key_in(p, true, 1000)), .data = (uint8_t *)key_in(p, true, 1000)};
    Drey__Internal__V1__MovedEntry *list[] = {&a, &b};
    Drey__Internal__V1__ImportRequest req = DREY__INTERNAL__V1__IMPORT_REQUEST__INIT;
    req.partition = p;
    req.partitions = N;
    req.replace = true;
    req.entries = list;
    req.n_entries = 2;
    req.min_version = 5000;
    drey_status st;
    cr_assert_not_null(apply(DREY_PARTITION_IMPORT_PATH, &req.base, &st));
    entry_copy e;
    cr_assert(read_entry(s.store, "c", "k0", T0, &e));
    cr_assert_eq(e.version, 900, "the sender's version, not a new one");
    cr_assert_eq(e.len, 5);
    cr_assert(read_entry(s.store, "c", (const char *)b.key.data, T0, &e));
    cr_assert_eq(e.expires_at_ms, T0 + 5000, "the absolute expiry moves as it was");
    cr_assert(!read_entry(s.store, "c", stale, T0, &e), "replace drops what the receiver held of the partition");
    cr_assert(read_entry(s.store, "c", other, T0, &e), "other partitions are untouched");
    cr_assert_geq(drey_store_last_version(s.store), 5000, "versions go on above the sender's");
    set("k0", "after", "");
    cr_assert(read_entry(s.store, "c", "k0", T0, &e));
    cr_assert_gt(e.version, 5000);

    /* A later chunk adds and removes, and replaces nothing else. */
    Drey__Internal__V1__MovedEntry gone = moved("k0", "", 0, 0);
    Drey__Internal__V1__MovedEntry *removed[] = {&gone};
    Drey__Internal__V1__ImportRequest more = DREY__INTERNAL__V1__IMPORT_REQUEST__INIT;
    more.partition = p;
    more.partitions = N;
    more.removed = removed;
    more.n_removed = 1;
    cr_assert_not_null(apply(DREY_PARTITION_IMPORT_PATH, &more.base, &st));
    cr_assert(!read_entry(s.store, "c", "k0", T0, &e));
    cr_assert(read_entry(s.store, "c", (const char *)b.key.data, T0, &e));
}

/* A Drop decided at epoch 10 (its node handed the partition over) that
 * reaches the journal after an Import of epoch 12 (the partition came back
 * to the node meanwhile) would erase the copy coming in: it removes
 * nothing, live and on replay (the same records in the same order). An
 * import of an older epoch does not hold a newer drop back. */
Test(partition, a_drop_spares_a_copy_imported_at_a_newer_epoch) {
    uint32_t p = part("c", "k0");
    Drey__Internal__V1__MovedEntry a = moved("k0", "came back", 900, 0);
    Drey__Internal__V1__MovedEntry *list[] = {&a};
    Drey__Internal__V1__ImportRequest imp = DREY__INTERNAL__V1__IMPORT_REQUEST__INIT;
    imp.partition = p;
    imp.partitions = N;
    imp.replace = true;
    imp.entries = list;
    imp.n_entries = 1;
    imp.epoch = 12;
    drey_status st;
    cr_assert_not_null(apply(DREY_PARTITION_IMPORT_PATH, &imp.base, &st));
    Drey__Internal__V1__DropRequest drop = DREY__INTERNAL__V1__DROP_REQUEST__INIT;
    drop.partition = p;
    drop.partitions = N;
    drop.epoch = 10;
    Drey__Internal__V1__DropResponse *resp = (void *)apply(DREY_PARTITION_DROP_PATH, &drop.base, &st);
    cr_assert_not_null(resp);
    cr_assert_eq(resp->entries, 0);
    entry_copy e;
    cr_assert(read_entry(s.store, "c", "k0", T0, &e), "the newer copy stays");
    drop.epoch = 12;
    resp = (void *)apply(DREY_PARTITION_DROP_PATH, &drop.base, &st);
    cr_assert_eq(resp->entries, 1, "a drop as new as the import removes it");
    cr_assert(!read_entry(s.store, "c", "k0", T0, &e));
}

Test(partition, a_drop_removes_exactly_its_partition_outcomes_included) {
    for (int i = 0; i < 64; i++) {
        char key[16], rid[16];
        snprintf(key, sizeof key, "k%d", i);
        snprintf(rid, sizeof rid, "r%d", i);
        set(key, "v", rid);
    }
    uint32_t p = part("c", "k0");
    counted before = in_partition(p);
    cr_assert_gt(before.outcomes, 0);
    size_t others[N];
    for (uint32_t q = 0; q < N; q++)
        others[q] = in_partition(q).n;
    size_t total_before = (size_t)drey_store_bytes(s.store);
    Drey__Internal__V1__DropRequest req = DREY__INTERNAL__V1__DROP_REQUEST__INIT;
    req.partition = p;
    req.partitions = N;
    drey_status st;
    Drey__Internal__V1__DropResponse *resp = (void *)apply(DREY_PARTITION_DROP_PATH, &req.base, &st);
    cr_assert_not_null(resp);
    cr_assert_eq(resp->entries, before.n);
    cr_assert_eq(in_partition(p).n, 0);
    for (uint32_t q = 0; q < N; q++) {
        if (q != p)
            cr_assert_eq(in_partition(q).n, others[q], "partition %u is untouched", q);
    }
    cr_assert_lt((size_t)drey_store_bytes(s.store), total_before);
    entry_copy e;
    cr_assert(read_entry(s.store, "c", key_in(p, false, 0), T0, &e), "another partition's key stays");
}

Test(partition, a_malformed_record_changes_nothing) {
    set("k0", "v", "");
    uint64_t version = drey_store_last_version(s.store);
    Drey__Internal__V1__DropRequest drop = DREY__INTERNAL__V1__DROP_REQUEST__INIT;
    drop.partition = N; /* out of range */
    drop.partitions = N;
    drey_status st;
    cr_assert_null(apply(DREY_PARTITION_DROP_PATH, &drop.base, &st));
    cr_assert_eq(st.error, DREY_ERR_MALFORMED_REQUEST);
    Drey__Internal__V1__ImportRequest imp = DREY__INTERNAL__V1__IMPORT_REQUEST__INIT;
    imp.partition = 0;
    imp.partitions = 0; /* no partition count: it means nothing */
    imp.replace = true;
    imp.min_version = 1u << 30;
    cr_assert_null(apply(DREY_PARTITION_IMPORT_PATH, &imp.base, &st));
    cr_assert_eq(st.error, DREY_ERR_MALFORMED_REQUEST);
    entry_copy e;
    cr_assert(read_entry(s.store, "c", "k0", T0, &e));
    cr_assert_eq(drey_store_last_version(s.store), version);
}

Test(partition, an_import_of_the_default_cache_and_an_empty_value) {
    /* Empty bytes arrive as NULL pointers: the default cache's name, "". */
    Drey__Internal__V1__MovedEntry e = DREY__INTERNAL__V1__MOVED_ENTRY__INIT;
    e.key = (ProtobufCBinaryData){.len = 2, .data = (uint8_t *)"kd"};
    e.kind = DREY_VALUE_BYTES;
    e.version = 7;
    Drey__Internal__V1__MovedEntry *list[] = {&e};
    Drey__Internal__V1__ImportRequest req = DREY__INTERNAL__V1__IMPORT_REQUEST__INIT;
    req.partition = part("", "kd");
    req.partitions = N;
    req.replace = true;
    req.entries = list;
    req.n_entries = 1;
    drey_status st;
    cr_assert_not_null(apply(DREY_PARTITION_IMPORT_PATH, &req.base, &st));
    entry_copy c;
    cr_assert(read_entry(s.store, "default", "kd", T0, &c), "\"\" and \"default\" are one cache");
    cr_assert_eq(c.len, 0);
    cr_assert_eq(c.version, 7);
}
