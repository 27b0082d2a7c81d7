/*
 * Unit tests for src/partition/replica.c: a backup taking its primary's
 * records (drey_partition_replica_take).
 *
 * A real store, cache service, commit and journal (on the in-memory file
 * system, fsync always) take records a primary's commit encoded. Each test
 * pins one promise: the backup journals the primary's bytes, marked a copy,
 * and applies them only once durable, with the primary's version and time;
 * replay of that journal gives the same entry and counts no eviction of the
 * primary's in the cache's figures; a record this node could not replay,
 * and one the journal's quota refuses, is refused with nothing journaled
 * and nothing applied; an ephemeral backup applies at once; a journal
 * written when backups journaled the Apply request around the record still
 * replays.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>

#include "drey/internal/v1/move.pb-c.h"
#include "drey/io.h"
#include "drey/journal/v1/journal.pb-c.h"
#include "drey/partition.h"
#include "tests/unit/write_stack.h"

#define T0 1700000000000LL

static write_stack s;
static drey_partition_replica *rep;
static drey_io_fault *fs;
static drey_journal *journal;
static drey_arena arena;

static void open_journal(uint64_t max_bytes) {
    drey_journal_options jo = {
        .dir = "/d",
        .io = drey_io_fault_io(fs),
        .segment_bytes = 64 * 1024,
        .fsync = DREY_FSYNC_ALWAYS,
        .batch_max_bytes = 1 << 20,
        .max_bytes = max_bytes,
    };
    char err[256];
    cr_assert_eq(drey_journal_open(&jo, 0, NULL, NULL, &journal, err, sizeof err), 0, "%s", err);
    drey_partition_replica_set_journal(rep, journal);
}

static void setup(void) {
    stack_create(&s, 60000);
    rep = drey_partition_replica_create(s.commit, NULL);
    cr_assert(drey_partition_register_replica(s.methods, rep));
    fs = drey_io_fault_create();
    drey_io *io = drey_io_fault_io(fs);
    cr_assert_eq(io->ops->mkdir(io, "/d"), 0);
    drey_arena_init(&arena, NULL, 0);
}

static void close_journal(void) {
    drey_partition_replica_set_journal(rep, NULL);
    drey_journal_close(journal);
    journal = NULL;
}

static void teardown(void) {
    if (journal != NULL)
        close_journal();
    drey_arena_destroy(&arena);
    drey_partition_replica_destroy(rep);
    stack_destroy(&s);
    drey_io_fault_destroy(fs);
}

TestSuite(replica, .init = setup, .fini = teardown, .timeout = 60);

/* A Set as its primary journaled it: versions from first_version, victims
 * its memory admission chose. */
static void primary_record(const char *key, const char *value, uint64_t first_version, const drey_store_victim *victims,
                           size_t n_victims, uint8_t **out, size_t *len) {
    write_stack primary;
    stack_create(&primary, 60000);
    drey_write w;
    make_set(&primary, &w, &arena, "c", key, value, 60000, -1, "r1", "jwt:alice");
    w.first_version = first_version;
    w.evicted = victims;
    w.n_evicted = n_victims;
    drey_commit_encode(&w, &arena, out, len);
    stack_destroy(&primary);
}

typedef struct answered {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool done;
    int err;
    uint64_t journal_room;
    bool applied_when_done; /* the entry was in the store when done ran */
} answered;

static const char *watched_key;

static bool has(write_stack *st, const char *key, uint64_t *version, int64_t *expires);

static void on_done(void *arg, const ProtobufCMessage *answer, int err) {
    answered *a = arg;
    pthread_mutex_lock(&a->mu);
    a->err = err;
    if (answer != NULL) {
        cr_assert_eq(answer->descriptor, &drey__internal__v1__replicate_response__descriptor);
        a->journal_room = ((const Drey__Internal__V1__ReplicateResponse *)answer)->journal_room_bytes;
    }
    a->applied_when_done = has(&s, watched_key, NULL, NULL);
    a->done = true;
    pthread_cond_signal(&a->cv);
    pthread_mutex_unlock(&a->mu);
}

static void answered_init(answered *a) {
    *a = (answered){.done = false};
    pthread_mutex_init(&a->mu, NULL);
    pthread_cond_init(&a->cv, NULL);
}

static void answered_wait(answered *a) {
    pthread_mutex_lock(&a->mu);
    while (!a->done)
        pthread_cond_wait(&a->cv, &a->mu);
    pthread_mutex_unlock(&a->mu);
    pthread_mutex_destroy(&a->mu);
    pthread_cond_destroy(&a->cv);
}

typedef struct found {
    uint64_t version;
    int64_t expires;
} found;

static void found_entry(void *arg, const drey_entry_view *e) {
    found *f = arg;
    f->version = e->version;
    f->expires = e->expires_at_ms;
}

static bool has(write_stack *st, const char *key, uint64_t *version, int64_t *expires) {
    drey_key k;
    drey_store_key(st->store, &k, "c", 1, key, strlen(key));
    found f = {0};
    bool ok = drey_store_read(st->store, &k, T0, found_entry, &f);
    if (version != NULL)
        *version = f.version;
    if (expires != NULL)
        *expires = f.expires;
    return ok;
}

/* The journal's records, in order (payloads copied into arena). */
typedef struct records {
    size_t n;
    const uint8_t *payload[8];
    size_t len[8];
    int64_t time_ms[8];
} records;

static int collect(void *ctx, const drey_journal_record *rec) {
    records *r = ctx;
    cr_assert_lt(r->n, 8);
    uint8_t *copy = drey_arena_alloc(&arena, rec->len);
    memcpy(copy, rec->payload, rec->len);
    r->payload[r->n] = copy;
    r->len[r->n] = rec->len;
    r->time_ms[r->n] = rec->time_ms;
    r->n++;
    return 0;
}

static records journaled(void) {
    records r = {0};
    drey_journal_scan scan;
    cr_assert_eq(drey_journal_scan_dir(drey_io_fault_io(fs), "/d", 0, collect, &r, &scan), 0);
    drey_journal_scan_free(&scan);
    return r;
}

static int replay_into(void *ctx, const drey_journal_record *rec) {
    return drey_commit_replay(ctx, rec);
}

/* Recovery's replay of the journal, into another store. */
static void replay_journal(write_stack *into) {
    drey_journal_scan scan;
    cr_assert_eq(drey_journal_scan_dir(drey_io_fault_io(fs), "/d", 0, replay_into, into->commit, &scan), 0);
    drey_journal_scan_free(&scan);
}

/* Takes the primary's Set of key (version 42, with the victims it chose);
 * a's done is set once it is answered. Returns the primary's record. */
static const uint8_t *take_set(const char *key, const drey_store_victim *victims, size_t n_victims, answered *a,
                               drey_partition_take *t, size_t *len) {
    uint8_t *record;
    primary_record(key, "v", 42, victims, n_victims, &record, len);
    watched_key = key;
    answered_init(a);
    *t = (drey_partition_take){
        .record = record, .len = *len, .time_ms = T0, .arena = &arena, .done = on_done, .arg = a};
    cr_assert_eq(drey_partition_replica_take(rep, t), 0);
    return record;
}

Test(replica, a_record_is_journaled_as_the_primary_wrote_it_and_applied_once_durable) {
    open_journal(0);
    answered a;
    drey_partition_take t;
    size_t len;
    const uint8_t *record = take_set("k", NULL, 0, &a, &t, &len);
    answered_wait(&a);
    cr_assert_eq(a.err, 0);
    cr_assert(a.applied_when_done, "applied before it is answered");
    cr_assert_eq(a.journal_room, UINT64_MAX, "the answer is this node's room (no quota: unbounded)");
    uint64_t version;
    int64_t expires;
    cr_assert(has(&s, "k", &version, &expires));
    cr_assert_eq(version, 42, "the primary's version");
    cr_assert_eq(expires, T0 + 60000, "expiry at the primary's time");
    close_journal();

    records r = journaled();
    cr_assert_eq(r.n, 1);
    cr_assert_eq(r.time_ms[0], T0, "the frame has the primary's time");
    cr_assert_eq(r.len[0], len + DREY_COMMIT_COPY_ROOM);
    cr_assert_arr_eq(r.payload[0], record, len, "the primary's bytes");
    drey_write w;
    cr_assert_eq(drey_commit_decode(s.commit, r.payload[0], r.len[0], &arena, &w), 0);
    cr_assert(w.copy, "marked a copy");
    cr_assert_eq(w.first_version, 42);

    write_stack again;
    stack_create(&again, 60000);
    replay_journal(&again);
    cr_assert(has(&again, "k", &version, &expires));
    cr_assert_eq(version, 42);
    cr_assert_eq(expires, T0 + 60000);
    stack_destroy(&again);
}

/* The store counts a copy's victims in its own figures (its memory) but
 * not in the cache's: the primary counted them. */
static void set_local(write_stack *st, const char *key) {
    drey_write w;
    make_set(st, &w, &arena, "c", key, "old", 0, -1, "", "");
    drey_status err;
    drey_status_init(&err);
    drey_apply ax = {.now_ms = T0, .arena = &arena, .status = &err};
    cr_assert_not_null(drey_commit_apply(st->commit, &w, &ax));
}

Test(replica, a_copys_victims_go_but_are_not_counted_again_in_the_cache_live_or_on_replay) {
    open_journal(0);
    set_local(&s, "victim");
    uint64_t victim_version;
    cr_assert(has(&s, "victim", &victim_version, NULL));
    drey_store_victim v = {.cache = "c", .cache_len = 1, .key = "victim", .key_len = 6, .version = victim_version};
    answered a;
    drey_partition_take t;
    size_t len;
    take_set("k", &v, 1, &a, &t, &len);
    answered_wait(&a);
    cr_assert_not(has(&s, "victim", NULL, NULL), "the primary's victim is gone here too");
    drey_cache_stats cs;
    drey_store_cache_stats(s.store, "c", 1, &cs);
    cr_assert_eq(cs.evictions, 0, "counted by the primary, not again by its backup");
    close_journal();

    write_stack again;
    stack_create(&again, 60000);
    set_local(&again, "victim"); /* the same version: the first of a fresh store */
    replay_journal(&again);
    cr_assert_not(has(&again, "victim", NULL, NULL));
    drey_store_cache_stats(again.store, "c", 1, &cs);
    cr_assert_eq(cs.evictions, 0, "nor on replay");
    stack_destroy(&again);
}

static void never_done(void *arg, const ProtobufCMessage *answer, int err) {
    (void)arg;
    (void)answer;
    cr_assert_fail("done ran for a refused record (err %d)", err);
}

Test(replica, a_record_this_node_could_not_replay_is_refused_and_not_journaled) {
    open_journal(0);
    static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0x01};
    Drey__Journal__V1__JournalRecord unknown = DREY__JOURNAL__V1__JOURNAL_RECORD__INIT;
    unknown.method = "drey.cache.v1.Cache/NoSuchWrite";
    uint8_t unknown_bytes[64];
    size_t unknown_len = drey__journal__v1__journal_record__pack(&unknown, unknown_bytes);
    Drey__Journal__V1__JournalRecord read = DREY__JOURNAL__V1__JOURNAL_RECORD__INIT;
    read.method = "drey.cache.v1.Cache/Get"; /* a method, but no write */
    uint8_t read_bytes[64];
    size_t read_len = drey__journal__v1__journal_record__pack(&read, read_bytes);
    const struct {
        const uint8_t *bytes;
        size_t len;
    } bad[] = {{garbage, sizeof garbage}, {unknown_bytes, unknown_len}, {read_bytes, read_len}, {NULL, 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        drey_partition_take t = {
            .record = bad[i].bytes, .len = bad[i].len, .time_ms = T0, .arena = &arena, .done = never_done};
        cr_assert_eq(drey_partition_replica_take(rep, &t), -EINVAL, "record %zu", i);
    }
    drey_journal_stats js;
    drey_journal_get_stats(journal, &js);
    cr_assert_eq(js.appends, 0, "nothing journaled");
    close_journal();
    cr_assert_eq(journaled().n, 0);
}

Test(replica, a_record_past_the_journals_quota_is_refused_and_applies_nothing) {
    open_journal(64 * 1024);
    char big[100 * 1024];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    uint8_t *record;
    size_t len;
    primary_record("k", big, 42, NULL, 0, &record, &len);
    drey_partition_take t = {.record = record, .len = len, .time_ms = T0, .arena = &arena, .done = never_done};
    cr_assert_eq(drey_partition_replica_take(rep, &t), -EDQUOT);
    cr_assert_not(has(&s, "k", NULL, NULL));
    close_journal();
    cr_assert_eq(journaled().n, 0);
}

Test(replica, an_ephemeral_backup_applies_the_record_at_once) {
    answered a;
    drey_partition_take t;
    size_t len;
    take_set("k", NULL, 0, &a, &t, &len);
    cr_assert(a.done, "answered before take returns");
    answered_wait(&a);
    cr_assert(a.applied_when_done);
    uint64_t version;
    cr_assert(has(&s, "k", &version, NULL));
    cr_assert_eq(version, 42);
}

/* Before backups journaled the record itself, a backup journaled the Apply
 * request around it: such a journal still replays, as a copy. */
Test(replica, an_apply_request_journaled_around_the_record_still_replays) {
    set_local(&s, "victim");
    uint64_t victim_version;
    cr_assert(has(&s, "victim", &victim_version, NULL));
    drey_store_victim v = {.cache = "c", .cache_len = 1, .key = "victim", .key_len = 6, .version = victim_version};
    uint8_t *record;
    size_t len;
    primary_record("k", "v", 42, &v, 1, &record, &len);
    Drey__Internal__V1__ReplicateRequest apply = DREY__INTERNAL__V1__REPLICATE_REQUEST__INIT;
    apply.partition = 3;
    apply.partitions = 16;
    apply.epoch = 7;
    apply.sequence = 1;
    apply.record.data = record;
    apply.record.len = len;
    apply.time_ms = T0;
    size_t apply_len = drey__internal__v1__replicate_request__get_packed_size(&apply);
    uint8_t *apply_bytes = drey_arena_alloc(&arena, apply_len);
    drey__internal__v1__replicate_request__pack(&apply, apply_bytes);
    Drey__Journal__V1__JournalRecord old = DREY__JOURNAL__V1__JOURNAL_RECORD__INIT;
    old.method = "drey.internal.v1.Replica/Apply";
    old.request.data = apply_bytes;
    old.request.len = apply_len;
    size_t old_len = drey__journal__v1__journal_record__get_packed_size(&old);
    uint8_t *old_bytes = drey_arena_alloc(&arena, old_len);
    drey__journal__v1__journal_record__pack(&old, old_bytes);

    drey_journal_record rec = {.lsn = 1, .time_ms = T0 + 5000, .payload = old_bytes, .len = old_len};
    cr_assert_eq(drey_commit_replay(s.commit, &rec), 0);
    uint64_t version;
    int64_t expires;
    cr_assert(has(&s, "k", &version, &expires));
    cr_assert_eq(version, 42);
    cr_assert_eq(expires, T0 + 60000, "at the record's time, not the backup's frame's");
    cr_assert_not(has(&s, "victim", NULL, NULL));
    drey_cache_stats cs;
    drey_store_cache_stats(s.store, "c", 1, &cs);
    cr_assert_eq(cs.evictions, 0, "a copy's victims are the primary's to count");
}
