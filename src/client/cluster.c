/*
 * cluster — routing by key for a drey cluster: a topology kept current from
 * WatchTopology on a thread of its own, and per-thread routers with one
 * channel per node (see include/drey/client.h).
 *
 * The watch thread turns each drey.cluster.v1.Topology into an immutable,
 * reference-counted table (partition -> index of its owner's advertised
 * address) and swaps it in under the topology's mutex, bumping an atomic
 * version. A router compares that version on every route (one relaxed-ish
 * atomic load on the fast path) and, when it moved, takes a reference to the
 * new table under the mutex and maps its addresses to its own clients, which
 * it keeps for its life: a node that leaves costs an idle channel, never a
 * reconnect storm when it comes back.
 *
 * A table whose hash rule this client does not know is not used: routing
 * falls back to the seed, which is correct (it forwards), only slower.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/arena.h"
#include "drey/client.h"
#include "drey/clock.h"
#include "drey/cluster/v1/cluster.pb-c.h"
#include "drey/placement.h"
#include "drey/rpc.h"
#include "internal.h"

#define WATCH_METHOD "/drey.cluster.v1.Cluster/WatchTopology"
#define NO_OWNER UINT32_MAX
#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 2000

typedef struct table {
    atomic_uint refs;
    uint32_t n_partitions;
    uint32_t *owner;  /* per partition: an index into addrs, or NO_OWNER */
    char **addrs;     /* distinct advertised host:port of the owners */
    size_t n_addrs;
} table;

struct drey_client_topology {
    drey_client *seed;          /* the watch stream's channel, used by the watch thread only */
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* a table arrived, or close began */
    table *current;             /* NULL before the first */
    _Atomic uint64_t version;   /* tables published */
    drey_client_stream *stream; /* open stream, for close to cancel */
    bool stopping;
};

/* One node's client inside a router. */
typedef struct node_client {
    char *addr;
    drey_client *client;
} node_client;

struct drey_client_cluster {
    drey_client_topology *topo;
    drey_client_options opts;     /* token and headers for every node (strings borrowed from the caller) */
    grpc_completion_queue *cq;    /* every node's asynchronous calls */
    drey_client *seed;
    char *seed_addr;
    node_client *nodes;
    size_t n_nodes, cap_nodes;
    table *t;                     /* the table routed with; NULL: all to the seed */
    uint64_t t_version;
    size_t *slot;                 /* t's address index -> index in nodes */
    size_t in_flight;
};

uint32_t drey_client_partition(const char *cache, size_t cache_len, const char *key, size_t key_len,
                               uint32_t n_partitions) {
    return drey_placement_partition(cache, cache_len, key, key_len, n_partitions);
}

/* --- tables --------------------------------------------------------------- */

static void table_unref(table *t) {
    if (t == NULL || atomic_fetch_sub(&t->refs, 1) != 1)
        return;
    for (size_t i = 0; i < t->n_addrs; i++)
        free(t->addrs[i]);
    free(t->addrs);
    free(t->owner);
    free(t);
}

static uint32_t addr_index(table *t, const char *addr) {
    for (size_t i = 0; i < t->n_addrs; i++) {
        if (strcmp(t->addrs[i], addr) == 0)
            return (uint32_t)i;
    }
    t->addrs = drey_xrealloc(t->addrs, t->n_addrs + 1, sizeof *t->addrs);
    t->addrs[t->n_addrs] = drey_xstrdup(addr);
    return (uint32_t)t->n_addrs++;
}

static const char *advertise_of(const Drey__Cluster__V1__Topology *m, const char *id) {
    for (size_t i = 0; i < m->n_nodes; i++) {
        if (m->nodes[i]->id != NULL && strcmp(m->nodes[i]->id, id) == 0)
            return m->nodes[i]->advertise;
    }
    return NULL;
}

/* The table of m, or NULL when its hash rule is not one this client knows
 * (or names no partitions). */
static table *table_of(const Drey__Cluster__V1__Topology *m) {
    if (m->hash == NULL || m->hash->function != DREY__CLUSTER__V1__HASH_RULE__FUNCTION__CRC32C_CACHE_ROUTING_KEY ||
        m->hash->partitions == 0)
        return NULL;
    table *t = drey_xcalloc(1, sizeof *t);
    atomic_init(&t->refs, 1);
    t->n_partitions = m->hash->partitions;
    t->owner = drey_xmalloc(t->n_partitions * sizeof *t->owner);
    for (uint32_t p = 0; p < t->n_partitions; p++)
        t->owner[p] = NO_OWNER;
    for (size_t i = 0; i < m->n_partitions; i++) {
        const Drey__Cluster__V1__Partition *p = m->partitions[i];
        if (p->id >= t->n_partitions || p->primary == NULL || p->primary[0] == '\0')
            continue;
        const char *addr = advertise_of(m, p->primary);
        if (addr != NULL && addr[0] != '\0')
            t->owner[p->id] = addr_index(t, addr);
    }
    return t;
}

/* --- the watch ------------------------------------------------------------ */

static void publish(drey_client_topology *t, table *tab) {
    pthread_mutex_lock(&t->mu);
    table *old = t->current;
    t->current = tab;
    atomic_fetch_add(&t->version, 1);
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    table_unref(old);
}

/* One stream, until it ends; true when it delivered at least one table (the
 * backoff starts over). */
static bool watch_once(drey_client_topology *t, drey_arena *arena) {
    Drey__Cluster__V1__WatchTopologyRequest req = DREY__CLUSTER__V1__WATCH_TOPOLOGY_REQUEST__INIT;
    drey_client_status st;
    pthread_mutex_lock(&t->mu);
    if (t->stopping) {
        pthread_mutex_unlock(&t->mu);
        return false;
    }
    drey_client_stream *s = drey_client_stream_start(t->seed, WATCH_METHOD, &req.base, DREY_CLIENT_NO_DEADLINE, &st);
    t->stream = s;
    pthread_mutex_unlock(&t->mu);
    if (s == NULL)
        return false;
    bool got = false;
    ProtobufCMessage *m;
    while (drey_client_stream_read(s, &drey__cluster__v1__topology__descriptor, arena, &m)) {
        table *tab = table_of((const Drey__Cluster__V1__Topology *)m);
        if (tab != NULL) {
            publish(t, tab);
            got = true;
        }
        drey_arena_reset(arena);
    }
    pthread_mutex_lock(&t->mu);
    t->stream = NULL;
    pthread_mutex_unlock(&t->mu);
    drey_client_stream_finish(s, arena, &st);
    drey_arena_reset(arena);
    return got;
}

static void *watch_main(void *arg) {
    drey_client_topology *t = arg;
    drey_arena arena;
    drey_arena_init(&arena, NULL, 0);
    int64_t backoff_ms = BACKOFF_MIN_MS;
    for (;;) {
        if (watch_once(t, &arena))
            backoff_ms = BACKOFF_MIN_MS;
        pthread_mutex_lock(&t->mu);
        int64_t until = drey_deadline_after_ms(backoff_ms);
        while (!t->stopping && drey_mono_ns() < until)
            drey_cond_wait_until(&t->cv, &t->mu, until);
        bool stop = t->stopping;
        pthread_mutex_unlock(&t->mu);
        if (stop)
            break;
        backoff_ms = backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff_ms * 2;
    }
    drey_arena_destroy(&arena);
    return NULL;
}

drey_client_topology *drey_client_topology_open(const drey_client_options *seed, char *err, size_t err_cap) {
    drey_client *c = drey_client_open(seed, err, err_cap);
    if (c == NULL)
        return NULL;
    drey_client_topology *t = drey_xcalloc(1, sizeof *t);
    t->seed = c;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    atomic_init(&t->version, 0);
    if (pthread_create(&t->thread, NULL, watch_main, t) != 0) {
        snprintf(err, err_cap, "cannot start the topology thread");
        drey_client_close(c);
        pthread_cond_destroy(&t->cv);
        pthread_mutex_destroy(&t->mu);
        free(t);
        return NULL;
    }
    return t;
}

bool drey_client_topology_wait(drey_client_topology *t, int64_t timeout_ms) {
    int64_t until = drey_deadline_after_ms(timeout_ms);
    pthread_mutex_lock(&t->mu);
    while (t->current == NULL && drey_mono_ns() < until)
        drey_cond_wait_until(&t->cv, &t->mu, until);
    bool loaded = t->current != NULL;
    pthread_mutex_unlock(&t->mu);
    return loaded;
}

uint64_t drey_client_topology_version(const drey_client_topology *t) {
    return atomic_load(&t->version);
}

uint32_t drey_client_topology_partitions(const drey_client_topology *t) {
    drey_client_topology *m = (drey_client_topology *)t; /* the mutex, not the table, changes */
    pthread_mutex_lock(&m->mu);
    uint32_t n = m->current != NULL ? m->current->n_partitions : 0;
    pthread_mutex_unlock(&m->mu);
    return n;
}

void drey_client_topology_close(drey_client_topology *t) {
    if (t == NULL)
        return;
    drey_client__stop_reader(t->thread, &t->mu, &t->cv, &t->stopping, &t->stream);
    drey_client_close(t->seed);
    table_unref(t->current);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

/* --- routers -------------------------------------------------------------- */

static drey_client *open_node(drey_client_cluster *cc, const char *addr, char *err, size_t err_cap) {
    drey_client_options o = cc->opts;
    o.target = addr;
    return drey_client__open_on(&o, cc->cq, err, err_cap);
}

drey_client_cluster *drey_client_cluster_open(drey_client_topology *t, const drey_client_options *opts, char *err,
                                              size_t err_cap) {
    drey_client_cluster *cc = drey_xcalloc(1, sizeof *cc);
    cc->topo = t;
    cc->opts = *opts;
    drey_rpc_init(); /* for the queue: balanced in close, after the clients' own */
    cc->cq = grpc_completion_queue_create_for_next(NULL);
    cc->seed = open_node(cc, opts->target, err, err_cap);
    if (cc->seed == NULL) {
        grpc_completion_queue_shutdown(cc->cq);
        grpc_completion_queue_destroy(cc->cq);
        grpc_shutdown();
        free(cc);
        return NULL;
    }
    cc->seed_addr = drey_xstrdup(opts->target);
    return cc;
}

/* The index in cc->nodes of addr's client, opened if new; SIZE_MAX when it
 * cannot be opened (the seed is used then). */
static size_t node_slot(drey_client_cluster *cc, const char *addr) {
    for (size_t i = 0; i < cc->n_nodes; i++) {
        if (strcmp(cc->nodes[i].addr, addr) == 0)
            return i;
    }
    char err[128];
    drey_client *c = open_node(cc, addr, err, sizeof err);
    if (c == NULL)
        return SIZE_MAX;
    if (cc->n_nodes == cc->cap_nodes) {
        cc->cap_nodes = cc->cap_nodes ? cc->cap_nodes * 2 : 4;
        cc->nodes = drey_xrealloc(cc->nodes, cc->cap_nodes, sizeof *cc->nodes);
    }
    cc->nodes[cc->n_nodes] = (node_client){.addr = drey_xstrdup(addr), .client = c};
    return cc->n_nodes++;
}

/* Takes the topology's newest table when it changed since the last route. */
static void refresh(drey_client_cluster *cc) {
    uint64_t v = atomic_load_explicit(&cc->topo->version, memory_order_acquire);
    if (v == cc->t_version)
        return;
    pthread_mutex_lock(&cc->topo->mu);
    table *t = cc->topo->current;
    if (t != NULL)
        atomic_fetch_add(&t->refs, 1);
    v = atomic_load(&cc->topo->version);
    pthread_mutex_unlock(&cc->topo->mu);
    table_unref(cc->t);
    cc->t = t;
    cc->t_version = v;
    free(cc->slot);
    cc->slot = NULL;
    if (t != NULL) {
        cc->slot = drey_xmalloc((t->n_addrs > 0 ? t->n_addrs : 1) * sizeof *cc->slot);
        for (size_t i = 0; i < t->n_addrs; i++)
            cc->slot[i] = node_slot(cc, t->addrs[i]);
    }
}

/* The index in cc->nodes of the owner's client, or SIZE_MAX for the seed. */
static size_t route_slot(drey_client_cluster *cc, const char *cache, size_t cache_len, const char *key,
                         size_t key_len) {
    refresh(cc);
    table *t = cc->t;
    if (t == NULL)
        return SIZE_MAX;
    uint32_t a = t->owner[drey_placement_partition(cache, cache_len, key, key_len, t->n_partitions)];
    return a == NO_OWNER ? SIZE_MAX : cc->slot[a];
}

drey_client *drey_client_cluster_route(drey_client_cluster *cc, const char *cache, size_t cache_len, const char *key,
                                       size_t key_len) {
    size_t i = route_slot(cc, cache, cache_len, key, key_len);
    return i == SIZE_MAX ? cc->seed : cc->nodes[i].client;
}

const char *drey_client_cluster_route_address(drey_client_cluster *cc, const char *cache, size_t cache_len,
                                              const char *key, size_t key_len) {
    size_t i = route_slot(cc, cache, cache_len, key, key_len);
    return i == SIZE_MAX ? cc->seed_addr : cc->nodes[i].addr;
}

bool drey_client_cluster_start_call(drey_client_cluster *cc, const char *cache, size_t cache_len, const char *key,
                                    size_t key_len, const char *method, const void *request, size_t request_len,
                                    int64_t timeout_ms, void *user) {
    drey_client *c = drey_client_cluster_route(cc, cache, cache_len, key, key_len);
    if (!drey_client_start_call(c, method, request, request_len, timeout_ms, user))
        return false;
    cc->in_flight++;
    return true;
}

bool drey_client_cluster_next(drey_client_cluster *cc, int64_t timeout_ms, drey_arena *arena,
                              drey_client_completion *out) {
    if (cc->in_flight == 0)
        return false;
    if (!drey_client__next_on(cc->cq, timeout_ms, arena, out))
        return false;
    cc->in_flight--;
    return true;
}

size_t drey_client_cluster_in_flight(const drey_client_cluster *cc) {
    return cc->in_flight;
}

void drey_client_cluster_close(drey_client_cluster *cc) {
    if (cc == NULL)
        return;
    drey_client__cancel_all(cc->seed);
    for (size_t i = 0; i < cc->n_nodes; i++)
        drey_client__cancel_all(cc->nodes[i].client);
    drey_arena scratch;
    drey_arena_init(&scratch, NULL, 0);
    drey_client_completion done;
    while (cc->in_flight > 0) {
        if (drey_client__next_on(cc->cq, DREY_CLIENT_NO_DEADLINE, &scratch, &done))
            cc->in_flight--;
        drey_arena_reset(&scratch);
    }
    drey_arena_destroy(&scratch);
    drey_client_close(cc->seed);
    for (size_t i = 0; i < cc->n_nodes; i++) {
        drey_client_close(cc->nodes[i].client);
        free(cc->nodes[i].addr);
    }
    free(cc->nodes);
    grpc_completion_queue_shutdown(cc->cq);
    while (grpc_completion_queue_next(cc->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type != GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cc->cq);
    grpc_shutdown();
    table_unref(cc->t);
    free(cc->slot);
    free(cc->seed_addr);
    free(cc);
}
