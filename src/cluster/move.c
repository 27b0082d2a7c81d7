/*
 * move — handing a partition this node owns to the node the controller
 * named `joining` in its entry.
 *
 *   1. copy: walk the store a shard at a time and send the partition's
 *      entries (remembered outcomes included) to the new node as Import
 *      calls of about a megabyte, the first one replacing whatever it held
 *      of the partition, at --cluster-move-rate. Writes go on meanwhile and
 *      record the keys they changed (router.c);
 *   2. catch up: send the current state of the changed keys, a few rounds
 *      while there are many;
 *   3. freeze: new writes of the partition wait, the ones running finish;
 *      the last changed keys go with this node's version counter, so
 *      versions keep increasing on the new owner;
 *   4. hand over: one etcd transaction, compared on the epoch the
 *      controller planned the move at, names the new node primary. This
 *      node applies it to its own table at once, so the waiting writes,
 *      routed again, are forwarded there; the new owner, hearing of it
 *      from a forwarded call before its watch did, waits for its table;
 *   5. drop: this node's copy goes in one journaled write.
 *
 * Any failure before the handover (the new node gone, its journal full, a
 * deadline) thaws the partition: this node is still its owner and nothing
 * was lost; the move is tried again a second later, or replanned by the
 * controller. A handover whose outcome etcd did not confirm keeps the
 * partition frozen until the entry is read back: thawing it then could let
 * two nodes take its writes.
 *
 * The pause (3 to 4) is what the writes of one partition feel: the last
 * catch-up plus one etcd round trip; it is measured and reported.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/internal/v1/move.pb-c.h"
#include "drey/log.h"
#include "drey/partition.h"
#include "internal.h"

#define CHUNK_BYTES (1u << 20)
#define CATCH_UP_ROUNDS 4
#define CATCH_UP_KEYS 512   /* fewer changed keys than this: freeze */
#define FREEZE_DRAIN_MS 2000 /* for the running writes of a frozen partition */
#define PEER_CALL_MS 10000
#define ETCD_CALL_MS 2000
#define RETRY_MS 1000

/* --- one call to the new owner, waited for --------------------------------------- */

typedef struct sync_call {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool done;
    int code;
    char message[256];
} sync_call;

static void sync_done(void *arg, const drey_answer *a) {
    sync_call *s = arg;
    pthread_mutex_lock(&s->mu);
    s->code = a->code;
    size_t n = a->message_len < sizeof s->message - 1 ? a->message_len : sizeof s->message - 1;
    if (n > 0)
        memcpy(s->message, a->message, n);
    s->message[n] = '\0';
    s->done = true;
    pthread_cond_signal(&s->cond);
    pthread_mutex_unlock(&s->mu);
}

typedef struct mover {
    drey_cluster *c;
    uint32_t partition;
    bool sync; /* a new backup's copy: it joins the in-sync set, this node stays primary */
    const char *target, *address;
    int64_t epoch;
    uint64_t entries, bytes;
    int64_t next_send_ns; /* the rate cap's schedule */
    char err[300];
} mover;

static bool call_import(mover *mv, const Drey__Internal__V1__ImportRequest *req) {
    drey_cluster *c = mv->c;
    size_t len = drey__internal__v1__import_request__get_packed_size(req);
    uint8_t *buf = drey_xmalloc(len ? len : 1);
    drey__internal__v1__import_request__pack(req, buf);
    if (c->opts.move_rate > 0) {
        /* A rate cap, not a synchronisation: the copy may not take the
         * node's disk and network from its clients. */
        int64_t now = drey_mono_ns();
        if (mv->next_send_ns > now)
            drey_cluster__nap_ms((mv->next_send_ns - now) / 1000000);
        int64_t start = mv->next_send_ns > now ? mv->next_send_ns : now;
        mv->next_send_ns = start + (int64_t)((double)len * 1e9 / (double)c->opts.move_rate);
    }
    char epoch[24];
    snprintf(epoch, sizeof epoch, "%" PRId64, mv->epoch);
    drey_cluster__header h[] = {
        {DREY_FORWARDED_BY, c->opts.node_id, strlen(c->opts.node_id)},
        {DREY_FORWARD_EPOCH, epoch, strlen(epoch)},
    };
    sync_call s = {.done = false};
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cond, NULL);
    drey_cluster__pcall *pc = drey_cluster__peers_call(c->peers, mv->target, mv->address, DREY_PARTITION_IMPORT_PATH,
                                                       buf, len, h, 2, drey_mono_ns() + PEER_CALL_MS * 1000000LL,
                                                       sync_done, &s);
    pthread_mutex_lock(&s.mu);
    while (!s.done)
        pthread_cond_wait(&s.cond, &s.mu); /* the call's deadline bounds it */
    pthread_mutex_unlock(&s.mu);
    drey_cluster__pcall_release(pc);
    pthread_mutex_destroy(&s.mu);
    pthread_cond_destroy(&s.cond);
    free(buf);
    if (s.code != 0) {
        snprintf(mv->err, sizeof mv->err, "import at %s: %s (code %d)", mv->target, s.message, s.code);
        return false;
    }
    mv->entries += req->n_entries;
    mv->bytes += len;
    return true;
}

/* --- chunks ------------------------------------------------------------------------ */

typedef struct chunk {
    drey_arena arena;
    Drey__Internal__V1__MovedEntry **entries, **removed;
    size_t n_entries, n_removed, cap_entries, cap_removed;
    size_t bytes;
    uint32_t partition, n_parts;
    drey_store *store; /* names the entries' tenants */
} chunk;

static void chunk_init(chunk *ch, uint32_t partition, uint32_t n_parts, drey_store *store) {
    memset(ch, 0, sizeof *ch);
    drey_arena_init(&ch->arena, NULL, 0);
    ch->partition = partition;
    ch->n_parts = n_parts;
    ch->store = store;
}

static Drey__Internal__V1__MovedEntry *push(chunk *ch, bool removed, const char *cache, size_t cache_len,
                                            const char *key, size_t key_len) {
    Drey__Internal__V1__MovedEntry ***list = removed ? &ch->removed : &ch->entries;
    size_t *n = removed ? &ch->n_removed : &ch->n_entries, *cap = removed ? &ch->cap_removed : &ch->cap_entries;
    if (*n == *cap) {
        *cap = *cap ? *cap * 2 : 256;
        *list = drey_xrealloc(*list, *cap, sizeof **list);
    }
    Drey__Internal__V1__MovedEntry *e = drey_arena_alloc(&ch->arena, sizeof *e);
    drey__internal__v1__moved_entry__init(e);
    uint8_t *data = drey_arena_alloc(&ch->arena, cache_len + key_len + 1);
    memcpy(data, cache, cache_len);
    memcpy(data + cache_len, key, key_len);
    e->cache = (ProtobufCBinaryData){.len = cache_len, .data = data};
    e->key = (ProtobufCBinaryData){.len = key_len, .data = data + cache_len};
    (*list)[(*n)++] = e;
    ch->bytes += cache_len + key_len + 16;
    return e;
}

static void push_entry(chunk *ch, const char *cache, size_t cache_len, const char *key, size_t key_len,
                       const drey_entry_view *v) {
    Drey__Internal__V1__MovedEntry *e = push(ch, false, cache, cache_len, key, key_len);
    uint8_t *value = drey_arena_alloc(&ch->arena, v->value.len ? v->value.len : 1);
    if (v->value.len > 0)
        memcpy(value, v->value.data, v->value.len);
    e->kind = (uint32_t)v->value.kind;
    e->value = (ProtobufCBinaryData){.len = v->value.len, .data = value};
    e->version = v->version;
    e->expires_at_ms = v->expires_at_ms;
    size_t tenant_len;
    const char *tenant = drey_store_tenant_name(ch->store, v->tenant, &tenant_len);
    e->tenant = drey_arena_strndup(&ch->arena, tenant, tenant_len); /* its tenant's on the new copy too */
    ch->bytes += v->value.len + tenant_len;
}

static void chunk_reset(chunk *ch) {
    free(ch->entries);
    free(ch->removed);
    drey_arena_destroy(&ch->arena);
    chunk_init(ch, ch->partition, ch->n_parts, ch->store);
}

static void chunk_destroy(chunk *ch) {
    free(ch->entries);
    free(ch->removed);
    drey_arena_destroy(&ch->arena);
}

/* The last chunk goes while the partition is frozen: it carries this
 * node's version counter (versions keep increasing per key on the new
 * copy) and the partition's sequence (its next record follows it). */
static bool send_chunk(mover *mv, chunk *ch, bool replace, bool last) {
    Drey__Internal__V1__ImportRequest req = DREY__INTERNAL__V1__IMPORT_REQUEST__INIT;
    req.partition = ch->partition;
    req.partitions = ch->n_parts;
    req.replace = replace;
    req.entries = ch->entries;
    req.n_entries = ch->n_entries;
    req.removed = ch->removed;
    req.n_removed = ch->n_removed;
    req.epoch = mv->epoch;
    if (last) {
        req.last = true;
        req.min_version = drey_store_last_version(mv->c->opts.store);
        req.sequence = atomic_load(&mv->c->pstate[ch->partition].seq);
    }
    bool ok = call_import(mv, &req);
    chunk_reset(ch);
    return ok;
}

static void export_item(void *arg, const drey_store_item *it) {
    chunk *ch = arg;
    if (drey_partition_of_entry(it->cache, it->cache_len, it->key, it->key_len, ch->n_parts) == ch->partition)
        push_entry(ch, it->cache, it->cache_len, it->key, it->key_len, &it->entry);
}

/* 1: the partition as it is now, while its writes go on. */
static bool copy(mover *mv) {
    drey_cluster *c = mv->c;
    chunk ch;
    chunk_init(&ch, mv->partition, c->n_parts, c->opts.store);
    bool ok = true, first = true;
    for (size_t sh = 0; sh < DREY_STORE_SHARDS && ok; sh++) {
        drey_store_walk_shard(c->opts.store, sh, drey_wall_ms(), export_item, &ch);
        if (ch.bytes >= CHUNK_BYTES || (sh == DREY_STORE_SHARDS - 1 && (ch.n_entries > 0 || first))) {
            ok = send_chunk(mv, &ch, first, false);
            first = false;
        }
    }
    chunk_destroy(&ch);
    return ok;
}

/* The keys the partition's writes changed since the last call. */
static drey_cluster__dirty *take_dirty(drey_cluster *c, uint32_t p, size_t *n) {
    drey_cluster__dirty *mine = NULL, **pp;
    *n = 0;
    pthread_mutex_lock(&c->move_mu);
    pp = &c->dirty;
    while (*pp != NULL) {
        drey_cluster__dirty *d = *pp;
        if (d->partition == p) {
            *pp = d->next;
            d->next = mine;
            mine = d;
            (*n)++;
        } else {
            pp = &d->next;
        }
    }
    pthread_mutex_unlock(&c->move_mu);
    return mine;
}

static void free_dirty(drey_cluster__dirty *d) {
    while (d != NULL) {
        drey_cluster__dirty *next = d->next;
        free(d);
        d = next;
    }
}

typedef struct read_into {
    chunk *ch;
    const drey_cluster__dirty *d;
} read_into;

static void read_dirty(void *arg, const drey_entry_view *v) {
    read_into *ri = arg;
    push_entry(ri->ch, ri->d->data, ri->d->cache_len, ri->d->data + ri->d->cache_len, ri->d->key_len, v);
}

/* 2 and 3: the changed keys as they are now, present or gone. The last
 * call carries the version counter. */
static bool send_changes(mover *mv, drey_cluster__dirty *list, bool last) {
    drey_cluster *c = mv->c;
    chunk ch;
    chunk_init(&ch, mv->partition, c->n_parts, c->opts.store);
    bool ok = true;
    for (drey_cluster__dirty *d = list; d != NULL && ok; d = d->next) {
        drey_key k;
        drey_store_key(c->opts.store, &k, d->data, d->cache_len, d->data + d->cache_len, d->key_len);
        read_into ri = {.ch = &ch, .d = d};
        if (!drey_store_read(c->opts.store, &k, drey_wall_ms(), read_dirty, &ri))
            push(&ch, true, d->data, d->cache_len, d->data + d->cache_len, d->key_len);
        if (ch.bytes >= CHUNK_BYTES && d->next != NULL)
            ok = send_chunk(mv, &ch, false, false);
    }
    if (ok && (last || ch.n_entries + ch.n_removed > 0))
        ok = send_chunk(mv, &ch, false, last);
    chunk_destroy(&ch);
    return ok;
}

/* Until the count is 0 (whoever takes it to 0 broadcasts move_cond), for
 * FREEZE_DRAIN_MS at most. */
static bool wait_zero(drey_cluster *c, _Atomic uint32_t *count) {
    int64_t until = drey_deadline_after_ms(FREEZE_DRAIN_MS);
    pthread_mutex_lock(&c->move_mu);
    bool zero;
    while (!(zero = atomic_load(count) == 0)) {
        if (drey_cond_wait_until(&c->move_cond, &c->move_mu, until) == ETIMEDOUT) {
            zero = atomic_load(count) == 0;
            break;
        }
    }
    pthread_mutex_unlock(&c->move_mu);
    return zero;
}

/* 3: no new writes, and the running ones answered. */
static bool freeze(drey_cluster *c, uint32_t p) {
    atomic_store(&c->pstate[p].frozen, true);
    return wait_zero(c, &c->pstate[p].inflight);
}

/* --- 4: the handover ------------------------------------------------------------------ */

typedef enum handover { HANDED_OVER, KEPT, UNKNOWN } handover;

/* Whether the entry says the handover (or the new backup) happened. */
static bool done_in(const mover *mv, const Drey__Internal__V1__PartitionEntry *e) {
    if (!mv->sync)
        return strcmp(e->primary, mv->target) == 0;
    for (size_t i = 0; i < e->n_replicas; i++) {
        if (strcmp(e->replicas[i], mv->target) == 0)
            return true;
    }
    return false;
}

static handover read_back(mover *mv, const char *key) {
    drey_cluster *c = mv->c;
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    Etcdserverpb__RangeResponse *resp;
    drey_etcd_status st;
    handover h = UNKNOWN;
    if (drey_etcd_get(c->etcd, key, false, ETCD_CALL_MS, &a, &resp, &st) == GRPC_STATUS_OK) {
        h = KEPT;
        if (resp->n_kvs == 1) {
            Drey__Internal__V1__PartitionEntry *e = drey__internal__v1__partition_entry__unpack(
                drey_arena_protobuf_allocator(&a), resp->kvs[0]->value.len, resp->kvs[0]->value.data);
            if (e != NULL && done_in(mv, e)) {
                h = HANDED_OVER;
                drey_cluster__apply_own_write(c, key, resp->kvs[0]->value.data, resp->kvs[0]->value.len,
                                              resp->kvs[0]->mod_revision);
            }
        }
    }
    drey_arena_destroy(&a);
    return h;
}

/* The entry after the handover: the new node primary; the backups stay
 * (they have every write up to the freeze, and the new primary continues
 * the partition's sequence), and so does this node as one while the
 * partition would have fewer copies than the replication factor without
 * it. For a new backup: this node stays primary, the backup joins the set.
 * False when the entry is no longer the one planned. */
static bool next_entry(mover *mv, drey_cluster__entry *e, bool *keep_copy) {
    drey_cluster *c = mv->c;
    pthread_mutex_lock(&c->mu);
    bool same = c->epochs[mv->partition] == mv->epoch;
    if (same)
        drey_cluster__entry_of(c->entries[mv->partition], e);
    pthread_mutex_unlock(&c->mu);
    if (!same)
        return false;
    *keep_copy = true;
    if (mv->sync) {
        drey_cluster__entry_remove(e->syncing, &e->n_syncing, mv->target);
        drey_cluster__entry_add(e->replicas, &e->n_replicas, mv->target);
        return true;
    }
    drey_cluster__entry_remove(e->replicas, &e->n_replicas, mv->target);
    snprintf(e->primary, sizeof e->primary, "%s", mv->target);
    e->joining[0] = '\0';
    e->n_syncing = 0; /* copies from this node: the new primary plans its own */
    *keep_copy = 1 + e->n_replicas < c->rf;
    if (*keep_copy)
        drey_cluster__entry_add(e->replicas, &e->n_replicas, c->opts.node_id);
    return true;
}

static handover hand_over(mover *mv, bool *keep_copy) {
    drey_cluster *c = mv->c;
    drey_cluster__entry e;
    if (!next_entry(mv, &e, keep_copy)) {
        snprintf(mv->err, sizeof mv->err, "the partition's entry changed since the move was planned");
        return KEPT;
    }
    switch (drey_cluster__cas_entry(c, mv->partition, mv->epoch, &e, mv->err, sizeof mv->err)) {
    case DREY_CLUSTER_CAS_APPLIED: return HANDED_OVER;
    case DREY_CLUSTER_CAS_REFUSED: return KEPT;
    case DREY_CLUSTER_CAS_UNKNOWN: break;
    }
    /* Frozen until etcd says which: both answers are safe, guessing is
     * not. */
    DREY_LOG_WARN("a handover's outcome is unknown; the partition stays paused until etcd answers",
                  DREY_LOG_UINT("partition", mv->partition), DREY_LOG_STR("error", mv->err));
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    const char *key = drey_cluster__partition_key(c, &a, mv->partition);
    handover h;
    do {
        pthread_mutex_lock(&c->mu);
        bool leaving = c->leaving;
        pthread_mutex_unlock(&c->mu);
        if (leaving) {
            h = UNKNOWN;
            break;
        }
        drey_cluster__nap_ms(100);
    } while ((h = read_back(mv, key)) == UNKNOWN);
    drey_arena_destroy(&a);
    return h;
}

/* --- 5: the drop, a journaled write of this node ------------------------------------- */

typedef struct local_door {
    pthread_mutex_t mu;
    pthread_cond_t cond;
    bool done, ok;
    char error[128];
    const char *self;
} local_door;

static void local_finish(local_door *d, bool ok, const char *error) {
    pthread_mutex_lock(&d->mu);
    d->ok = ok;
    snprintf(d->error, sizeof d->error, "%s", error);
    d->done = true;
    pthread_cond_signal(&d->cond);
    pthread_mutex_unlock(&d->mu);
}

static void local_reply(void *door, const ProtobufCMessage *response) {
    (void)response;
    local_finish(door, true, "");
}

static void local_fail(void *door, const drey_status *st) {
    local_finish(door, false, drey_error_lookup(st->error)->reason);
}

static void local_relay(void *door, const drey_answer *a) {
    local_finish(door, a->code == 0, "relayed");
}

/* The node calling itself: it is the peer its metadata names. */
static const char *local_metadata(void *door, const char *key, size_t *len) {
    local_door *d = door;
    if (strcmp(key, DREY_FORWARDED_BY) != 0)
        return NULL;
    *len = strlen(d->self);
    return d->self;
}

static const char *local_peer(void *door) {
    (void)door;
    return "node:self";
}

static int64_t local_deadline(void *door) {
    (void)door;
    return INT64_MAX;
}

static bool local_peer_is(void *door, const char *id, size_t len) {
    local_door *d = door;
    return strlen(d->self) == len && memcmp(d->self, id, len) == 0;
}

static const drey_request_ops local_ops = {
    .reply = local_reply,
    .fail = local_fail,
    .relay = local_relay,
    .metadata = local_metadata,
    .peer = local_peer,
    .deadline_mono_ns = local_deadline,
    .peer_is = local_peer_is,
};

static bool drop(drey_cluster *c, uint32_t p) {
    const drey_method *m = drey_method_find(c->opts.methods, DREY_PARTITION_DROP_PATH);
    if (m == NULL || c->opts.pipeline == NULL)
        return false;
    local_door d = {.self = c->opts.node_id};
    pthread_mutex_init(&d.mu, NULL);
    pthread_cond_init(&d.cond, NULL);
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    Drey__Internal__V1__DropRequest *req = drey_arena_alloc(&a, sizeof *req);
    drey__internal__v1__drop_request__init(req);
    req->partition = p;
    req->partitions = c->n_parts;
    size_t len = drey__internal__v1__drop_request__get_packed_size(req);
    uint8_t *bytes = drey_arena_alloc(&a, len ? len : 1);
    drey__internal__v1__drop_request__pack(req, bytes);
    drey_request *r = drey_arena_calloc(&a, sizeof *r);
    drey_request_init(r, &local_ops, &d, &a, m, &req->base, bytes, len);
    drey_pipeline_submit(c->opts.pipeline, r);
    pthread_mutex_lock(&d.mu);
    while (!d.done)
        pthread_cond_wait(&d.cond, &d.mu); /* the journal answers every write */
    pthread_mutex_unlock(&d.mu);
    if (!d.ok)
        DREY_LOG_WARN("the copy of a partition handed over could not be dropped; it stays in memory unserved",
                      DREY_LOG_UINT("partition", p), DREY_LOG_STR("reason", d.error));
    drey_arena_destroy(&a);
    pthread_mutex_destroy(&d.mu);
    pthread_cond_destroy(&d.cond);
    return d.ok;
}

/* --- one move --------------------------------------------------------------------------- */

static uint64_t elapsed_us(int64_t since_ns) {
    return (uint64_t)((drey_mono_ns() - since_ns) / 1000);
}

static bool move_partition(mover *mv) {
    drey_cluster *c = mv->c;
    uint32_t p = mv->partition;
    drey_cluster__pstate *ps = &c->pstate[p];
    int64_t started = drey_mono_ns();
    atomic_store(&c->moving, (int64_t)p);
    atomic_store(&ps->moving, true);
    /* A Clear that began before the move finishes before the copy does:
     * Clears that begin after it are refused (fanout.c). */
    bool ok = wait_zero(c, &c->clearing);
    if (!ok)
        snprintf(mv->err, sizeof mv->err, "a Clear on this node did not finish");
    ok = ok && copy(mv);
    for (int round = 0; ok && round < CATCH_UP_ROUNDS; round++) {
        size_t n;
        drey_cluster__dirty *d = take_dirty(c, p, &n);
        if (n < CATCH_UP_KEYS) {
            /* Few enough for the pause: they go with the last ones. */
            pthread_mutex_lock(&c->move_mu);
            for (drey_cluster__dirty *x = d, *next; x != NULL; x = next) {
                next = x->next;
                x->next = c->dirty;
                c->dirty = x;
            }
            pthread_mutex_unlock(&c->move_mu);
            break;
        }
        ok = send_changes(mv, d, false);
        free_dirty(d);
    }
    handover h = KEPT;
    bool keep_copy = true;
    int64_t paused = drey_mono_ns();
    bool froze = ok;
    if (ok && !freeze(c, p)) {
        ok = false;
        snprintf(mv->err, sizeof mv->err, "the partition's running writes did not finish within %d ms",
                 FREEZE_DRAIN_MS);
    }
    if (ok) {
        size_t n;
        drey_cluster__dirty *d = take_dirty(c, p, &n);
        ok = send_changes(mv, d, true);
        free_dirty(d);
    }
    if (ok)
        h = hand_over(mv, &keep_copy);
    atomic_store(&ps->moving, false);
    if (h == UNKNOWN)
        return false; /* stopping with the handover unconfirmed: stay paused */
    drey_cluster__thaw(c, p);
    if (froze) {
        uint64_t pause = elapsed_us(paused);
        atomic_store(&c->pause_last_us, pause);
        if (pause > atomic_load(&c->pause_max_us))
            atomic_store(&c->pause_max_us, pause);
    }
    size_t n;
    free_dirty(take_dirty(c, p, &n));
    atomic_store(&c->moving, -1);
    atomic_fetch_add(&c->moved_entries, mv->entries);
    atomic_fetch_add(&c->moved_bytes, mv->bytes);
    if (h != HANDED_OVER) {
        atomic_fetch_add(&c->moves_failed, 1);
        DREY_LOG_WARN(mv->sync ? "a copy to a new backup did not complete" :
                                 "a partition move did not complete; this node keeps the partition",
                      DREY_LOG_UINT("partition", p), DREY_LOG_STR("to", mv->target), DREY_LOG_STR("error", mv->err));
        return false;
    }
    atomic_fetch_add(mv->sync ? &c->backups_added : &c->moves_done, 1);
    DREY_LOG_INFO(mv->sync ? "partition copied to a new backup" : "partition handed over",
                  DREY_LOG_UINT("partition", p), DREY_LOG_STR("to", mv->target),
                  DREY_LOG_UINT("entries", mv->entries), DREY_LOG_UINT("bytes", mv->bytes),
                  DREY_LOG_UINT("pause_us", atomic_load(&c->pause_last_us)),
                  DREY_LOG_UINT("took_ms", elapsed_us(started) / 1000));
    if (!keep_copy)
        drop(c, p);
    return true;
}

/* --- the loop ------------------------------------------------------------------------------ */

void *drey_cluster__mover_main(void *arg) {
    drey_cluster *c = arg;
    int64_t *retry_at = drey_xcalloc(c->n_parts, sizeof *retry_at);
    pthread_mutex_lock(&c->mu);
    while (!c->leaving) {
        /* The first planned move out of this node whose last try is not
         * too recent. */
        mover mv = {.c = c};
        bool found = false;
        int64_t now = drey_mono_ms();
        for (uint32_t p = 0; p < c->n_parts && !found; p++) {
            const Drey__Internal__V1__PartitionEntry *e = c->entries[p];
            if (e == NULL || (e->n_joining == 0 && e->n_syncing == 0) || strcmp(e->primary, c->opts.node_id) != 0 ||
                retry_at[p] > now)
                continue;
            /* A move first: the new primary restores the backups it wants. */
            const char *target = e->n_joining > 0 ? e->joining[0] : e->syncing[0];
            const Drey__Internal__V1__Member *to = drey_cluster__member_locked(c, target);
            if (to == NULL || to->internal[0] == '\0' || strcmp(target, c->opts.node_id) == 0)
                continue; /* the controller replans it */
            mv.sync = e->n_joining == 0;
            mv.partition = p;
            mv.target = drey_xstrdup(to->id);
            mv.address = drey_xstrdup(to->internal);
            mv.epoch = c->epochs[p];
            found = true;
        }
        if (!found) {
            drey_cond_wait_until(&c->cond, &c->mu, drey_deadline_after_ms(RETRY_MS));
            continue;
        }
        pthread_mutex_unlock(&c->mu);
        if (!move_partition(&mv))
            retry_at[mv.partition] = drey_mono_ms() + RETRY_MS;
        free((char *)mv.target);
        free((char *)mv.address);
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    free(retry_at);
    return NULL;
}
