/*
 * registry — the store's cache registry (cache name -> slot, each slot's
 * figures) and, on a partitioned store, each table's figures per cache; see
 * store.c for how every change to an entry updates both.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/store.h"
#include "internal.h"

/* --- a table's figures per cache (partitioned stores) ----------------------- */

static size_t tc_home(uint32_t id1, uint32_t mask) {
    uint32_t h = id1 * 0x9e3779b1u;
    return (h ^ (h >> 16)) & mask;
}

table_cache *drey_store__tc_find(const shard *sh, uint32_t id) {
    if (sh->caches_cap == 0)
        return NULL;
    uint32_t mask = sh->caches_cap - 1;
    for (size_t i = tc_home(id + 1, mask);; i = (i + 1) & mask) {
        if (sh->caches[i].id1 == id + 1)
            return &sh->caches[i];
        if (sh->caches[i].id1 == 0)
            return NULL;
    }
}

static void tc_grow(shard *sh) {
    table_cache *old = sh->caches;
    uint32_t old_cap = sh->caches_cap;
    sh->caches_cap = old_cap ? old_cap * 2 : 4;
    sh->caches = drey_xcalloc(sh->caches_cap, sizeof *sh->caches);
    for (uint32_t i = 0; i < old_cap; i++) {
        if (old[i].id1 == 0)
            continue;
        size_t j = tc_home(old[i].id1, sh->caches_cap - 1);
        while (sh->caches[j].id1 != 0)
            j = (j + 1) & (sh->caches_cap - 1);
        sh->caches[j] = old[i];
    }
    free(old);
}

/* The cache's row, opened if it has none. */
static table_cache *tc_open(shard *sh, uint32_t id) {
    table_cache *row = drey_store__tc_find(sh, id);
    if (row != NULL)
        return row;
    if ((sh->caches_used + 1) * 4 > sh->caches_cap * 3)
        tc_grow(sh);
    uint32_t mask = sh->caches_cap - 1;
    size_t i = tc_home(id + 1, mask);
    while (sh->caches[i].id1 != 0)
        i = (i + 1) & mask;
    sh->caches[i] = (table_cache){.id1 = id + 1};
    sh->caches_used++;
    return &sh->caches[i];
}

/* Deletes a row, moving back the rows of its probe run (linear probing
 * without tombstones). */
static void tc_delete(shard *sh, table_cache *row) {
    uint32_t mask = sh->caches_cap - 1;
    size_t hole = (size_t)(row - sh->caches);
    for (size_t j = (hole + 1) & mask; sh->caches[j].id1 != 0; j = (j + 1) & mask) {
        size_t home = tc_home(sh->caches[j].id1, mask);
        /* j's row may fill the hole if its home is not in (hole, j]. */
        bool stays = hole < j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!stays) {
            sh->caches[hole] = sh->caches[j];
            hole = j;
        }
    }
    sh->caches[hole].id1 = 0;
    sh->caches_used--;
}

/* Moves the cache's figures in a table by the deltas; the row goes with the
 * cache's last entry in the table. */
void drey_store__tc_add(shard *sh, uint32_t id, int64_t entries, int64_t bytes, int expiring) {
    if (!sh->per_cache)
        return;
    table_cache *row = entries > 0 ? tc_open(sh, id) : drey_store__tc_find(sh, id);
    if (row == NULL)
        abort(); /* an entry counted nowhere: the figures are broken */
    row->entries += (uint64_t)entries;
    row->bytes += (uint64_t)bytes;
    row->expiring += (uint32_t)expiring;
    if (row->entries == 0)
        tc_delete(sh, row);
}

/* --- the cache registry --------------------------------------------------- */

cache_slot *drey_store__slot(drey_store *s, uint32_t id) {
    return &atomic_load_explicit(&s->reg.chunks[id / SLOT_CHUNK], memory_order_acquire)[id % SLOT_CHUNK];
}

static uint64_t name_hash(const char *name, size_t len) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a: the map holds few names, none chosen for the seed */
    for (size_t i = 0; i < len; i++)
        h = (h ^ (uint8_t)name[i]) * 1099511628211ULL;
    return h;
}

static bool slot_named(const cache_slot *c, const char *name, size_t len) {
    return c->name_len == len && memcmp(c->name, name, len) == 0;
}

/* The map position holding the name's slot, or the first free one after
 * its probe sequence. Registry lock held. */
size_t drey_store__map_find(drey_store *s, const char *name, size_t len, bool *found) {
    registry *r = &s->reg;
    size_t mask = r->map_cap - 1, i = name_hash(name, len) & mask, tomb = SIZE_MAX;
    for (;;) {
        uint32_t v = r->map[i];
        if (v == MAP_EMPTY) {
            *found = false;
            return tomb != SIZE_MAX ? tomb : i;
        }
        if (v == MAP_DELETED) {
            if (tomb == SIZE_MAX)
                tomb = i;
        } else if (slot_named(drey_store__slot(s, v - 1), name, len)) {
            *found = true;
            return i;
        }
        i = (i + 1) & mask;
    }
}

/* Rehashes the map when live names and tombstones fill it: twice as large
 * when the live names alone fill half of it, else the same size (caches
 * come and go, and their tombstones must not grow the map for ever). */
static void map_grow(drey_store *s) {
    registry *r = &s->reg;
    uint32_t *old = r->map;
    size_t old_cap = r->map_cap, live = 0;
    for (size_t i = 0; i < old_cap; i++)
        live += old[i] != MAP_EMPTY && old[i] != MAP_DELETED;
    r->map_cap = live * 2 >= old_cap ? old_cap * 2 : old_cap;
    r->map = drey_xcalloc(r->map_cap, sizeof *r->map);
    r->map_used = 0;
    for (size_t i = 0; i < old_cap; i++) {
        if (old[i] == MAP_EMPTY || old[i] == MAP_DELETED)
            continue;
        cache_slot *c = drey_store__slot(s, old[i] - 1);
        bool found;
        r->map[drey_store__map_find(s, c->name, c->name_len, &found)] = old[i];
        r->map_used++;
    }
    free(old);
}

static uint32_t slot_alloc(drey_store *s) {
    registry *r = &s->reg;
    uint32_t id;
    if (r->free_head != 0) {
        id = r->free_head - 1;
        r->free_head = drey_store__slot(s, id)->next_free;
    } else {
        id = r->n_slots;
        if (id / SLOT_CHUNK >= SLOT_CHUNKS) {
            fprintf(stderr, "drey_store: more than %d caches\n", SLOT_CHUNK * SLOT_CHUNKS);
            abort();
        }
        if (atomic_load_explicit(&r->chunks[id / SLOT_CHUNK], memory_order_relaxed) == NULL)
            atomic_store_explicit(&r->chunks[id / SLOT_CHUNK], drey_xcalloc(SLOT_CHUNK, sizeof(cache_slot)),
                                  memory_order_release);
        r->n_slots++;
    }
    cache_slot *c = drey_store__slot(s, id);
    atomic_store(&c->entries, 0);
    atomic_store(&c->bytes, 0);
    atomic_store(&c->expiring, 0);
    atomic_store(&c->evictions, 0);
    atomic_store(&c->evicted_bytes, 0);
    c->retired = false;
    c->next_free = 0;
    return id;
}

/* Caches clients can name; internal ones ("#outcomes") are not theirs to
 * count. */
static bool counted(const char *name, size_t len) {
    return len == 0 || name[0] != '#';
}

void drey_store__slot_release(drey_store *s, uint32_t id) {
    cache_slot *c = drey_store__slot(s, id);
    s->reg.live -= counted(c->name, c->name_len);
    c->retired = false;
    c->next_free = s->reg.free_head;
    s->reg.free_head = id + 1;
}

/* The slot of the named cache for a new entry, opened if it has none, with
 * the entry counted in it: under the registry lock, so that the slot cannot
 * be released between being found and being counted in. Called with the
 * entry's shard write-locked (lock order: shards, then the registry). */
uint32_t drey_store__slot_for(drey_store *s, const char *name, size_t len) {
    registry *r = &s->reg;
    pthread_mutex_lock(&r->mu);
    bool found;
    size_t i = drey_store__map_find(s, name, len, &found);
    uint32_t id;
    if (found) {
        id = r->map[i] - 1;
    } else {
        id = slot_alloc(s);
        r->live += counted(name, len);
        cache_slot *c = drey_store__slot(s, id);
        memcpy(c->name, name, len);
        c->name_len = (uint8_t)len;
        if (r->map[i] == MAP_EMPTY)
            r->map_used++;
        r->map[i] = id + 1;
        if (r->map_used * 4 > r->map_cap * 3)
            map_grow(s);
    }
    atomic_fetch_add_explicit(&drey_store__slot(s, id)->entries, 1, memory_order_relaxed);
    pthread_mutex_unlock(&r->mu);
    return id;
}

bool drey_store_cache_admits(drey_store *s, const char *cache, size_t len, uint32_t limit) {
    /* Below the limit every write is admitted: no lock on the write path
     * until the limit is near. */
    if (atomic_load_explicit(&s->reg.live, memory_order_relaxed) < limit)
        return true;
    drey_key k;
    drey_store_key(s, &k, cache, len, "", 0); /* the normalised name */
    registry *r = &s->reg;
    pthread_mutex_lock(&r->mu);
    bool found;
    drey_store__map_find(s, k.cache, k.cache_len, &found);
    bool ok = found || r->live < limit;
    pthread_mutex_unlock(&r->mu);
    return ok;
}

void drey_store__registry_init(drey_store *s) {
    registry *r = &s->reg;
    pthread_mutex_init(&r->mu, NULL);
    r->map_cap = 64;
    r->map = drey_xcalloc(r->map_cap, sizeof *r->map);
}

void drey_store__registry_destroy(drey_store *s) {
    registry *r = &s->reg;
    for (size_t i = 0; i < SLOT_CHUNKS; i++)
        free(atomic_load(&r->chunks[i]));
    free(r->map);
    pthread_mutex_destroy(&r->mu);
}
