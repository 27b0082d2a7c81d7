/*
 * cache — the verified-token cache: SHA-256(token) -> sub, exp, not-before.
 *
 * Verification runs on several completion-queue threads at once, so the
 * cache is split into up to 16 shards, each with its own mutex, chosen by
 * the digest (uniform: it is SHA-256). A shard is a fixed array of slots
 * with a chained hash index over it; slots are reused round robin, so a
 * full shard replaces its oldest insertion. The bound is exact: the shards'
 * capacities add up to the configured number of entries.
 *
 * Entries carry the key-set generation that verified them: after a reload
 * they never hit again (and the owner clears them to free the memory).
 * They may also carry what another module made of the token's claims (its
 * grants: drey_auth_set_attach), one reference each; an entry whose object
 * is no longer current (the policy was reloaded) is a miss, so the token is
 * verified and its object made again once per token, not per call.
 */
#include "cache.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "claims.h"

typedef struct entry {
    uint8_t digest[DREY_AUTH_DIGEST];
    uint64_t gen; /* key-set generation that verified the token */
    int64_t exp_ms, nbf_ms;
    char *sub; /* malloc'd, NUL-terminated */
    size_t sub_len;
    void *attached; /* one reference; NULL: none */
    int32_t next; /* next slot in the bucket chain; -1: end */
    bool used;
} entry;

typedef struct shard {
    _Alignas(64) pthread_mutex_t mu; /* own cache line: no false sharing */
    entry *slots;
    int32_t *buckets; /* head slot per bucket; -1: empty */
    size_t cap;       /* slots */
    size_t mask;      /* buckets - 1 (a power of two) */
    size_t hand;      /* next slot to (re)use */
    size_t count;     /* used slots */
} shard;

struct drey_auth__cache {
    size_t n_shards; /* 0: disabled */
    size_t capacity;
    shard *shards;
    drey_auth_attach attach; /* make NULL: none */
};

void drey_auth__cache_set_attach(drey_auth__cache *c, const drey_auth_attach *at) {
    c->attach = *at;
}

static void let_go(const drey_auth__cache *c, void *attached) {
    if (attached != NULL)
        c->attach.unref(attached);
}

static uint64_t load64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

drey_auth__cache *drey_auth__cache_create(size_t entries) {
    drey_auth__cache *c = drey_xcalloc(1, sizeof *c);
    if (entries == 0)
        return c;
    c->capacity = entries;
    c->n_shards = entries < DREY_AUTH_CACHE_SHARDS ? entries : DREY_AUTH_CACHE_SHARDS;
    c->shards = drey_xaligned(_Alignof(shard), c->n_shards * sizeof(shard));
    for (size_t i = 0; i < c->n_shards; i++) {
        shard *s = &c->shards[i];
        memset(s, 0, sizeof *s);
        pthread_mutex_init(&s->mu, NULL);
        s->cap = entries / c->n_shards + (i < entries % c->n_shards ? 1 : 0);
        size_t nb = 1;
        while (nb < s->cap)
            nb <<= 1;
        s->mask = nb - 1;
        s->slots = drey_xcalloc(s->cap, sizeof *s->slots);
        s->buckets = drey_xrealloc(NULL, nb, sizeof *s->buckets);
        for (size_t b = 0; b < nb; b++)
            s->buckets[b] = -1;
    }
    return c;
}

static void shard_reset(const drey_auth__cache *c, shard *s) {
    for (size_t i = 0; i < s->cap; i++) {
        let_go(c, s->slots[i].attached);
        free(s->slots[i].sub);
        memset(&s->slots[i], 0, sizeof s->slots[i]);
    }
    for (size_t b = 0; b <= s->mask; b++)
        s->buckets[b] = -1;
    s->hand = 0;
    s->count = 0;
}

void drey_auth__cache_destroy(drey_auth__cache *c) {
    if (c == NULL)
        return;
    for (size_t i = 0; i < c->n_shards; i++) {
        shard *s = &c->shards[i];
        shard_reset(c, s);
        free(s->slots);
        free(s->buckets);
        pthread_mutex_destroy(&s->mu);
    }
    free(c->shards);
    free(c);
}

static shard *shard_of(drey_auth__cache *c, const uint8_t *digest) {
    return &c->shards[load64(digest) % c->n_shards];
}

static int32_t *bucket_of(shard *s, const uint8_t *digest) {
    return &s->buckets[load64(digest + 8) & s->mask];
}

static int32_t find(shard *s, const uint8_t *digest) {
    for (int32_t i = *bucket_of(s, digest); i >= 0; i = s->slots[i].next)
        if (memcmp(s->slots[i].digest, digest, DREY_AUTH_DIGEST) == 0)
            return i;
    return -1;
}

/* Unlinks a used slot from its chain and empties it. */
static void drop(const drey_auth__cache *c, shard *s, int32_t idx) {
    entry *e = &s->slots[idx];
    int32_t *link = bucket_of(s, e->digest);
    while (*link != idx)
        link = &s->slots[*link].next;
    *link = e->next;
    let_go(c, e->attached);
    free(e->sub);
    memset(e, 0, sizeof *e);
    s->count--;
}

void drey_auth__cache_insert(drey_auth__cache *c, const uint8_t digest[DREY_AUTH_DIGEST], uint64_t gen,
                             const drey_auth__verdict *v) {
    if (c->n_shards == 0)
        return;
    char *sub = drey_xmalloc(v->sub_len + 1);
    memcpy(sub, v->sub, v->sub_len);
    sub[v->sub_len] = '\0';
    if (v->attached != NULL)
        c->attach.ref(v->attached);

    shard *s = shard_of(c, digest);
    pthread_mutex_lock(&s->mu);
    int32_t idx = find(s, digest);
    if (idx >= 0) { /* verified twice concurrently: keep the newer */
        free(s->slots[idx].sub);
        let_go(c, s->slots[idx].attached);
    } else {
        idx = (int32_t)s->hand;
        s->hand = (s->hand + 1) % s->cap;
        if (s->slots[idx].used)
            drop(c, s, idx);
        int32_t *head = bucket_of(s, digest);
        memcpy(s->slots[idx].digest, digest, DREY_AUTH_DIGEST);
        s->slots[idx].next = *head;
        s->slots[idx].used = true;
        *head = idx;
        s->count++;
    }
    entry *e = &s->slots[idx];
    e->gen = gen;
    e->exp_ms = v->exp_ms;
    e->nbf_ms = v->nbf_ms;
    e->sub = sub;
    e->sub_len = v->sub_len;
    e->attached = v->attached;
    pthread_mutex_unlock(&s->mu);
}

bool drey_auth__cache_lookup(drey_auth__cache *c, const uint8_t digest[DREY_AUTH_DIGEST], uint64_t gen,
                             int64_t now_ms, int64_t skew_ms, char *sub, size_t sub_cap, bool *sub_fits) {
    return drey_auth__cache_lookup_attached(c, digest, gen, now_ms, skew_ms, sub, sub_cap, sub_fits, NULL);
}

bool drey_auth__cache_lookup_attached(drey_auth__cache *c, const uint8_t digest[DREY_AUTH_DIGEST], uint64_t gen,
                                      int64_t now_ms, int64_t skew_ms, char *sub, size_t sub_cap, bool *sub_fits,
                                      void **attached) {
    if (attached != NULL)
        *attached = NULL;
    if (c->n_shards == 0)
        return false;
    shard *s = shard_of(c, digest);
    pthread_mutex_lock(&s->mu);
    int32_t idx = find(s, digest);
    if (idx < 0) {
        pthread_mutex_unlock(&s->mu);
        return false;
    }
    entry *e = &s->slots[idx];
    if (e->gen != gen || drey_auth__check_times(e->exp_ms, e->nbf_ms, now_ms, skew_ms) != DREY_ERR_NONE ||
        (e->attached != NULL && !c->attach.current(c->attach.ctx, e->attached))) {
        drop(c, s, idx);
        pthread_mutex_unlock(&s->mu);
        return false;
    }
    *sub_fits = sub == NULL || e->sub_len < sub_cap;
    if (sub != NULL && *sub_fits)
        memcpy(sub, e->sub, e->sub_len + 1);
    if (attached != NULL && e->attached != NULL) {
        c->attach.ref(e->attached);
        *attached = e->attached;
    }
    pthread_mutex_unlock(&s->mu);
    return true;
}

void drey_auth__cache_clear(drey_auth__cache *c) {
    for (size_t i = 0; i < c->n_shards; i++) {
        pthread_mutex_lock(&c->shards[i].mu);
        shard_reset(c, &c->shards[i]);
        pthread_mutex_unlock(&c->shards[i].mu);
    }
}

size_t drey_auth__cache_count(drey_auth__cache *c) {
    size_t n = 0;
    for (size_t i = 0; i < c->n_shards; i++) {
        pthread_mutex_lock(&c->shards[i].mu);
        n += c->shards[i].count;
        pthread_mutex_unlock(&c->shards[i].mu);
    }
    return n;
}

size_t drey_auth__cache_capacity(const drey_auth__cache *c) {
    return c->capacity;
}
