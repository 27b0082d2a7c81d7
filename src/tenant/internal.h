/* What the files of src/tenant share (internal to the tenant module). */
#ifndef DREY_TENANT_INTERNAL_H
#define DREY_TENANT_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "drey/tenant.h"

#define TENANT_CHUNK 1024
/* At most 4,194,304 tenants in a process's life: a tenant is a value an
 * issuer signed, not something a caller makes up. */
#define TENANT_CHUNKS 4096
#define TENANT_NAME_MAX 128

/* A parked write, waiting for the ledger's answer about its tenant. */
typedef struct tenant_waiter {
    struct tenant_waiter *next;
    void (*resume)(void *arg);
    void *arg;
} tenant_waiter;

typedef struct tenant {
    char name[TENANT_NAME_MAX + 1];
    size_t len;
    _Atomic int64_t bytes;    /* every entry of the tenant here */
    _Atomic int64_t pending;  /* growth of writes admitted and not yet answered */
    _Atomic int64_t limit;    /* the quota last seen with a write (-1: none yet) */
    _Atomic uint64_t refused;
    /* A cluster node: bytes per partition (NULL until joined). */
    _Atomic(_Atomic int64_t *) parts;
    /* The ledger's (a cluster node): this node's grant, what the others
     * said they use, and the ledger's own state under ledger->mu. */
    _Atomic int64_t granted;
    _Atomic int64_t others_used;
    /* The ledger found nothing more to get (monotonic ns): until then a
     * write beyond the grant is refused without asking etcd again. */
    _Atomic int64_t exhausted_until_ns;
    tenant_waiter *waiters;
    int64_t want;          /* more bytes asked for (0: nothing asked) */
    bool queued;           /* on the ledger's work list */
    bool release;          /* another node wants some: give back what is not used */
    int64_t reported;      /* the bytes this node last wrote to etcd */
    int64_t due_ns;        /* on the work list: not before this (monotonic) */
    int64_t starve_until_ns; /* waiters wait for others' releases until then; 0: none waiting */
    struct tenant *next_work;
} tenant;

struct ledger;

struct drey_tenants {
    drey_store *store;
    pthread_mutex_t mu; /* interning */
    uint32_t *map;      /* open addressing: tenant id, 0 empty */
    size_t map_cap;
    tenant *_Atomic chunks[TENANT_CHUNKS];
    _Atomic uint32_t n; /* the highest id handed out */
    int64_t (*limit)(void *ctx, const char *tenant, size_t len);
    void *limit_ctx;
    /* A cluster node (drey_tenants_join). */
    _Atomic uint32_t partitions; /* 0: a single node */
    _Atomic uint64_t *owned;     /* bitmap of the partitions this node leads */
    struct ledger *ledger;
};

tenant *drey_tenants__get(drey_tenants *t, uint32_t id);
/* Bytes of the tenant in the partitions this node leads (a cluster node),
 * or all of its bytes. */
int64_t drey_tenants__local(drey_tenants *t, tenant *x);

/* The ledger (ledger.c): a cluster node's share of each tenant's quota. */
int drey_tenants__ledger_start(drey_tenants *t, const drey_tenants_cluster *c, char *err, size_t cap);
void drey_tenants__ledger_stop(drey_tenants *t);
/* Asks for more of x's quota (want bytes beyond the grant); w (may be NULL)
 * is resumed once the ledger answered. */
void drey_tenants__ledger_ask(drey_tenants *t, tenant *x, int64_t want, tenant_waiter *w);

#endif
