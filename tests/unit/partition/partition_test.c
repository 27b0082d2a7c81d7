/*
 * Unit tests for src/partition: where an entry belongs, and the Import and
 * Drop writes a partition moves with.
 *
 * A real store, cache service and commit (partitioned, as on a cluster
 * node: outcome keys name their write, the store keeps entries per
 * partition) apply real writes; Import and Drop are found in the method
 * table by path, as replay finds them, and applied through it. Each test
 * pins one promise: an outcome lives in its write's partition; an import
 * puts entries with their versions and expiry, replaces a stale copy,
 * removes what the sender removed and raises the version counter; a drop
 * removes exactly its partition (outcomes included), whether the store
 * keeps entries per partition of the record's count or not (a record
 * replayed before the node joined); replayed records keep the store's
 * partitions whole; Hash answers the same from the partitions' own tables
 * as from a walk of the store; a malformed record changes nothing.
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
    cr_assert(drey_partition_index(s.store, N));
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

/* --- a store not partitioned as the record ---------------------------------------- */

typedef struct part_count {
    uint32_t p, n;
    size_t count;
} part_count;

static void count_of(void *arg, const drey_store_item *it) {
    part_count *pc = arg;
    pc->count += drey_partition_of_entry(it->cache, it->cache_len, it->key, it->key_len, pc->n) == pc->p;
}

/* Live entries of partition p of n, from a walk of the whole store. */
static size_t count_in(drey_store *st, uint32_t p, uint32_t n) {
    part_count pc = {.p = p, .n = n};
    for (size_t sh = 0; sh < DREY_STORE_SHARDS; sh++)
        drey_store_walk_shard(st, sh, T0, count_of, &pc);
    return pc.count;
}

static void set_in(write_stack *st, const char *key, const char *value) {
    drey_write w;
    make_set(st, &w, &arena, "c", key, value, 0, -1, "", "jwt:alice");
    drey_status status;
    drey_status_init(&status);
    drey_apply ax = {.now_ms = T0, .arena = &arena, .status = &status};
    cr_assert_not_null(drey_commit_apply(st->commit, &w, &ax));
}

static uint64_t drop_in(write_stack *st, uint32_t p, uint32_t n) {
    const drey_method *m = drey_method_find(st->methods, DREY_PARTITION_DROP_PATH);
    Drey__Internal__V1__DropRequest req = DREY__INTERNAL__V1__DROP_REQUEST__INIT;
    req.partition = p;
    req.partitions = n;
    drey_status status;
    drey_status_init(&status);
    drey_apply ax = {.now_ms = T0, .arena = &arena, .status = &status};
    Drey__Internal__V1__DropResponse *resp = (void *)m->apply(m->ctx, &ax, &req.base);
    cr_assert_not_null(resp);
    return resp->entries;
}

/* A Drop naming another partition count than the store keeps (a record
 * replayed before the node joined), or on a store never partitioned (a
 * cluster's journal replayed on a standalone node), walks the whole store
 * and removes exactly the record's partition. */
Test(partition, a_drop_of_another_count_than_the_stores_walks_the_store) {
    write_stack plain;
    stack_create(&plain, 60000);
    drey_partition *plain_parts = drey_partition_create(plain.store);
    cr_assert(drey_partition_register(plain.methods, plain_parts));
    write_stack *stacks[] = {&s, &plain};
    const uint32_t other = 2 * N;
    for (size_t k = 0; k < 2; k++) {
        write_stack *st = stacks[k];
        for (int i = 0; i < 200; i++) {
            char key[16];
            snprintf(key, sizeof key, "k%d", i);
            set_in(st, key, "v");
        }
        uint32_t p = drey_placement_partition("c", 1, "k3", 2, other);
        size_t before = count_in(st->store, p, other), rest = 0;
        for (uint32_t q = 0; q < other; q++)
            rest += q != p ? count_in(st->store, q, other) : 0;
        cr_assert_gt(before, 0);
        cr_assert_eq(drop_in(st, p, other), before, "%s: every entry of the record's partition",
                     k ? "never partitioned" : "partitioned by another count");
        cr_assert_eq(count_in(st->store, p, other), 0);
        size_t after = 0;
        for (uint32_t q = 0; q < other; q++)
            after += q != p ? count_in(st->store, q, other) : 0;
        cr_assert_eq(after, rest, "no other partition lost anything");
    }
    stack_destroy(&plain);
    drey_partition_destroy(plain_parts);
}

/* --- replay keeps the partitions whole --------------------------------------------- */

typedef struct tally {
    uint64_t entries, sum;
} tally;

static void tally_item(void *arg, const drey_store_item *it) {
    tally *t = arg;
    uint64_t h = 1469598103934665603ULL;
    const char *parts[] = {it->cache, it->key, (const char *)it->entry.value.data};
    size_t lens[] = {it->cache_len, it->key_len, it->entry.value.len};
    for (int i = 0; i < 3; i++) {
        for (size_t j = 0; j < lens[i]; j++)
            h = (h ^ (uint8_t)parts[i][j]) * 1099511628211ULL;
        h = (h ^ 0xff) * 1099511628211ULL;
    }
    t->entries++;
    t->sum += h ^ it->entry.version;
}

typedef struct full_tally {
    tally t[N + 1];
} full_tally;

static void full_item(void *arg, const drey_store_item *it) {
    full_tally *f = arg;
    uint32_t p = drey_partition_of_entry(it->cache, it->cache_len, it->key, it->key_len, N);
    tally_item(&f->t[p < N ? p : N], it);
}

/* Each partition's own walk is the whole store's share of it. */
static void partitions_agree(drey_store *st) {
    full_tally f;
    memset(&f, 0, sizeof f);
    for (size_t sh = 0; sh < DREY_STORE_SHARDS; sh++)
        drey_store_walk_shard(st, sh, T0, full_item, &f);
    for (uint32_t p = 0; p <= N; p++) {
        tally t = {0};
        drey_store_scan_pos pos = {0, 0};
        while (pos.shard != DREY_STORE_SCAN_DONE)
            drey_store_partition_walk(st, p, T0, &pos, 5, tally_item, &t);
        cr_assert_eq(t.entries, f.t[p].entries, "partition %u", p);
        cr_assert_eq(t.sum, f.t[p].sum, "partition %u", p);
        drey_store_partition_stats ps;
        drey_store_get_partition_stats(st, p, &ps);
        cr_assert_eq(ps.entries, f.t[p].entries, "partition %u's figure", p);
    }
}

/* The journal replayed on a cluster node (a backup's Apply, recovery after
 * the store was partitioned) lands every write, outcome, import and drop
 * in its partition: the replayed store's partitions agree with a walk of
 * it and hold what the live store holds. */
Test(partition, replayed_records_keep_the_partitions_whole) {
    write_stack r;
    stack_create(&r, 60000);
    drey_commit_destroy(r.commit);
    drey_commit_options co = {.store = r.store, .methods = r.methods, .idempotency_retention_ms = 60000,
                              .partitioned = true};
    r.commit = drey_commit_create(&co);
    drey_partition *r_parts = drey_partition_create(r.store);
    cr_assert(drey_partition_register(r.methods, r_parts));
    cr_assert(drey_partition_index(r.store, N));
    uint64_t lsn = 0;
    for (int i = 0; i < 300; i++) {
        char key[16], rid[16], value[16];
        snprintf(key, sizeof key, "k%d", i % 120);
        snprintf(rid, sizeof rid, "r%d", i);
        snprintf(value, sizeof value, "v%d", i);
        drey_write w;
        if (i % 7 == 3)
            make_remove(&s, &w, &arena, "c", key, i % 2 ? rid : "", "jwt:alice");
        else
            make_set(&s, &w, &arena, "c", key, value, i % 5 == 0 ? 60000 : 0, -1, i % 2 ? rid : "", "jwt:alice");
        drey_commit_reserve_versions(s.commit, &w);
        drey_status st;
        drey_status_init(&st);
        drey_apply ax = {.now_ms = T0, .arena = &arena, .status = &st};
        drey_commit_apply(s.commit, &w, &ax);
        uint8_t *payload;
        size_t len;
        drey_commit_encode(&w, &arena, &payload, &len);
        drey_journal_record rec = {.lsn = ++lsn, .time_ms = T0, .payload = payload, .len = len};
        cr_assert_eq(drey_commit_replay(r.commit, &rec), 0, "record %d", i);
    }
    /* An import and a drop, journaled like any write. */
    const char *paths[] = {DREY_PARTITION_IMPORT_PATH, DREY_PARTITION_DROP_PATH};
    Drey__Internal__V1__MovedEntry a = moved("imported", "x", 10, 0);
    Drey__Internal__V1__MovedEntry *list[] = {&a};
    Drey__Internal__V1__ImportRequest imp = DREY__INTERNAL__V1__IMPORT_REQUEST__INIT;
    imp.partition = part("c", "imported");
    imp.partitions = N;
    imp.replace = true;
    imp.entries = list;
    imp.n_entries = 1;
    Drey__Internal__V1__DropRequest drop = DREY__INTERNAL__V1__DROP_REQUEST__INIT;
    drop.partition = part("c", "k1");
    drop.partitions = N;
    const ProtobufCMessage *reqs[] = {&imp.base, &drop.base};
    for (int i = 0; i < 2; i++) {
        drey_status st;
        cr_assert_not_null(apply(paths[i], reqs[i], &st));
        const drey_method *m = drey_method_find(s.methods, paths[i]);
        size_t len = protobuf_c_message_get_packed_size(reqs[i]);
        uint8_t *bytes = drey_arena_alloc(&arena, len ? len : 1);
        protobuf_c_message_pack(reqs[i], bytes);
        drey_write w;
        drey_commit_write_init(&w, m, protobuf_c_message_unpack(m->desc->input, drey_arena_protobuf_allocator(&arena),
                                                                len, bytes),
                               bytes, len, "");
        uint8_t *payload;
        size_t plen;
        drey_commit_encode(&w, &arena, &payload, &plen);
        drey_journal_record rec = {.lsn = ++lsn, .time_ms = T0, .payload = payload, .len = plen};
        cr_assert_eq(drey_commit_replay(r.commit, &rec), 0);
    }
    cr_assert_eq(count_in(r.store, drop.partition, N), 0, "the drop replayed");
    partitions_agree(s.store);
    partitions_agree(r.store);
    for (uint32_t p = 0; p <= N; p++) {
        drey_store_partition_stats a_st, b_st;
        drey_store_get_partition_stats(s.store, p, &a_st);
        drey_store_get_partition_stats(r.store, p, &b_st);
        cr_assert_eq(a_st.entries, b_st.entries, "partition %u: live and replayed hold the same", p);
        cr_assert_eq(a_st.bytes, b_st.bytes, "partition %u", p);
    }
    stack_destroy(&r);
    drey_partition_destroy(r_parts);
}

/* --- Hash ---------------------------------------------------------------------------- */

static Drey__Internal__V1__HashResponse *hash_of(drey_partition_replica *rep, const uint32_t *parts, size_t n_parts) {
    drey_method_table *t = drey_method_table_create();
    cr_assert(drey_partition_register_replica(t, rep));
    const drey_method *m = drey_method_find(t, "/drey.internal.v1.Replica/Hash");
    cr_assert_not_null(m);
    Drey__Internal__V1__HashRequest req = DREY__INTERNAL__V1__HASH_REQUEST__INIT;
    req.partitions = N;
    req.partition = (uint32_t *)parts;
    req.n_partition = n_parts;
    drey_status status;
    drey_status_init(&status);
    drey_apply ax = {.now_ms = T0, .arena = &arena, .status = &status};
    Drey__Internal__V1__HashResponse *resp = (void *)m->apply(m->ctx, &ax, &req.base);
    drey_method_table_destroy(t);
    return resp;
}

static void load_into(void *store, const drey_store_item *it) {
    drey_store_load(store, it);
}

/* Hash answers the same from the partitions' own tables (a partitioned
 * store) as from a walk of a store holding the same entries. */
Test(partition, hash_agrees_between_partition_tables_and_a_walk) {
    write_stack plain;
    stack_create(&plain, 60000);
    for (int i = 0; i < 500; i++) {
        char key[16], value[16];
        snprintf(key, sizeof key, "k%d", i);
        snprintf(value, sizeof value, "v%d", i);
        set_in(&s, key, value);
    }
    for (size_t sh = 0; sh < DREY_STORE_SHARDS; sh++) /* the same entries, same versions */
        drey_store_walk_shard(s.store, sh, T0, load_into, plain.store);
    cr_assert_eq(drey_store_partitions(plain.store), 0);
    drey_partition_replica *ra = drey_partition_replica_create(s.commit, NULL),
                           *rb = drey_partition_replica_create(plain.commit, NULL);
    const uint32_t some[] = {3, 0, 15, 3};
    for (int asked = 0; asked < 2; asked++) {
        Drey__Internal__V1__HashResponse *a = hash_of(ra, asked ? some : NULL, asked ? 4 : 0);
        Drey__Internal__V1__HashResponse *b = hash_of(rb, asked ? some : NULL, asked ? 4 : 0);
        cr_assert_not_null(a);
        cr_assert_not_null(b);
        cr_assert_eq(a->n_partitions, asked ? 3 : N, "each partition asked for once");
        cr_assert_eq(a->n_partitions, b->n_partitions);
        uint64_t entries = 0;
        for (size_t i = 0; i < a->n_partitions; i++) {
            cr_assert_eq(a->partitions[i]->partition, b->partitions[i]->partition);
            cr_assert_eq(a->partitions[i]->entries, b->partitions[i]->entries, "partition %u",
                         a->partitions[i]->partition);
            cr_assert_eq(a->partitions[i]->hash, b->partitions[i]->hash, "partition %u", a->partitions[i]->partition);
            cr_assert_eq(a->partitions[i]->entries, count_in(s.store, a->partitions[i]->partition, N));
            entries += a->partitions[i]->entries;
        }
        if (!asked)
            cr_assert_eq(entries, 500);
    }
    drey_partition_replica_destroy(ra);
    drey_partition_replica_destroy(rb);
    stack_destroy(&plain);
}
