/*
 * ledger — a cluster node's share of each tenant's quota, agreed through
 * etcd; see include/drey/tenant.h and docs/security.md.
 *
 * One etcd key per tenant, <prefix>tenants/<tenant>, holds every node's
 * grant, the bytes it last said it holds and how much more it wants:
 *
 *   {"n1": {"g": 4194304, "u": 3100000, "w": 0}, "n2": {...}}
 *
 * Invariant: the grants add up to at most the quota, so the bytes the
 * primaries hold (each at most its grant) do too. Every change is a
 * transaction compared on the key's mod_revision; a node changes only its
 * own entry, and drops those of nodes no longer members (their partitions
 * went to other nodes, whose bytes now count there).
 *
 * A node raises its grant (a write that would not fit waits for that: one
 * Range and one Txn) from the quota nobody holds; if that is not enough it
 * says how much more it wants ("w"), and every node watching the prefix
 * that holds more than it uses gives back what it does not need. A grant is
 * lowered here before etcd hears of it and raised here only after: the
 * node never admits against more than etcd records for it. If etcd cannot
 * be reached, grants stay as they are: writes within them go on, writes
 * beyond them are refused (the quota before availability).
 *
 * The thread also refreshes which partitions this node leads (what its
 * bytes are counted over) every OWNED_EVERY_NS.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "drey/alloc.h"
#include "drey/arena.h"
#include "drey/clock.h"
#include "drey/log.h"
#include "internal.h"

#define OWNED_EVERY_NS (20 * 1000000LL)
#define REPORT_EVERY_NS (1000 * 1000000LL)
#define ETCD_TIMEOUT_MS 2000
#define TXN_ATTEMPTS 8
/* A write that needs more than nobody holds waits this long at most for
 * the other nodes to give back what they do not use, asking again every
 * RETRY_NS (and at once when one of them changes the tenant's entry). */
#define STARVE_NS (1000 * 1000000LL)
#define RETRY_NS (25 * 1000000LL)
/* A tenant the ledger found no more room for: writes beyond the grant are
 * refused without asking again for this long (or until another node
 * changes the tenant's entry). */
#define EXHAUSTED_NS (100 * 1000000LL)
/* What a node asks for beyond its need, so that a tenant writing steadily
 * does not ask etcd at every write: a sixteenth of the quota (never more
 * than the quota lets), at least a little. */
#define CHUNK_MIN 4096
/* What a node keeps beyond its bytes when it gives some back. */
#define MARGIN_MIN 4096

typedef struct ledger {
    drey_tenants *t;
    drey_tenants_cluster c;
    char *prefix, *node_id, *watch_key;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    tenant *work_head, *work_tail;
    drey_etcd_watch *watch;
    int64_t next_owned_ns, next_report_ns;
} ledger;

static int64_t chunk_of(int64_t limit) {
    int64_t c = limit / 16;
    return c > CHUNK_MIN ? c : CHUNK_MIN;
}


static int64_t margin_of(int64_t limit) {
    int64_t m = limit / 64;
    return m > MARGIN_MIN ? m : MARGIN_MIN;
}

/* On the work list from due_ns on (sooner if it is already on it for
 * later). Under l->mu. */
static void enqueue_at_locked(ledger *l, tenant *x, int64_t due_ns) {
    if (x->queued) {
        if (due_ns < x->due_ns)
            x->due_ns = due_ns;
        pthread_cond_signal(&l->cv);
        return;
    }
    x->queued = true;
    x->due_ns = due_ns;
    x->next_work = NULL;
    if (l->work_tail != NULL)
        l->work_tail->next_work = x;
    else
        l->work_head = x;
    l->work_tail = x;
    pthread_cond_signal(&l->cv);
}

static void enqueue_locked(ledger *l, tenant *x) {
    enqueue_at_locked(l, x, 0);
}

/* The first tenant due at now (unlinked), or NULL with *next the earliest
 * due time. Under l->mu. */
static tenant *take_due_locked(ledger *l, int64_t now, int64_t *next) {
    for (tenant **pp = &l->work_head, *prev = NULL; *pp != NULL; prev = *pp, pp = &(*pp)->next_work) {
        tenant *x = *pp;
        if (x->due_ns <= now) {
            *pp = x->next_work;
            if (l->work_tail == x)
                l->work_tail = prev;
            x->queued = false;
            return x;
        }
        if (*next == 0 || x->due_ns < *next)
            *next = x->due_ns;
    }
    return NULL;
}

void drey_tenants__ledger_ask(drey_tenants *t, tenant *x, int64_t want, tenant_waiter *w) {
    ledger *l = t->ledger;
    pthread_mutex_lock(&l->mu);
    if (want > x->want)
        x->want = want;
    if (w != NULL) {
        w->next = x->waiters;
        x->waiters = w;
    }
    enqueue_locked(l, x);
    pthread_mutex_unlock(&l->mu);
}

/* --- the key's value ------------------------------------------------------------- */

typedef struct share {
    int64_t g, u, w;
} share;

static int64_t field(json_t *o, const char *name) {
    json_t *v = json_object_get(o, name);
    return json_is_integer(v) && json_integer_value(v) > 0 ? json_integer_value(v) : 0;
}

/* The other members' shares summed; this node's own in *mine. An entry
 * that is not an object, or (members) a node no longer a member, counts
 * nothing. */
static void sum_others(ledger *l, json_t *root, bool members, share *others, share *mine, bool *someone_wants) {
    memset(others, 0, sizeof *others);
    memset(mine, 0, sizeof *mine);
    *someone_wants = false;
    const char *id;
    json_t *v;
    json_object_foreach(root, id, v) {
        if (!json_is_object(v))
            continue;
        share s = {.g = field(v, "g"), .u = field(v, "u"), .w = field(v, "w")};
        if (strcmp(id, l->node_id) == 0) {
            *mine = s;
            continue;
        }
        if (members && !l->c.is_member(l->c.ctx, id))
            continue;
        others->g += s.g;
        others->u += s.u;
        *someone_wants |= s.w > 0;
    }
}

static char *key_of(ledger *l, const tenant *x) {
    size_t n = strlen(l->watch_key) + x->len + 1;
    char *k = drey_xmalloc(n);
    snprintf(k, n, "%s%s", l->watch_key, x->name);
    return k;
}

/* --- one tenant's transaction ----------------------------------------------------- */

/* Brings x's entry up to date: more when it wants more, less when another
 * node wants and it holds more than it uses, its bytes in any case.
 * Returns how much of want it could not get (0: all of it); *others_slack
 * is what the other nodes hold beyond the bytes they said they use (what
 * waiting for them could bring). */
static int64_t settle(ledger *l, tenant *x, int64_t want, bool release, int64_t *others_slack) {
    drey_tenants *t = l->t;
    int64_t limit = atomic_load(&x->limit);
    int64_t short_of = want;
    *others_slack = 0;
    if (limit < 0)
        return 0; /* no quota seen: nothing to share */
    char *key = key_of(l, x);
    for (int attempt = 0; attempt < TXN_ATTEMPTS; attempt++) {
        drey_arena a;
        drey_arena_init(&a, NULL, 0);
        drey_etcd_status st;
        Etcdserverpb__RangeResponse *rr = NULL;
        if (drey_etcd_get(t->ledger->c.etcd, key, false, ETCD_TIMEOUT_MS, &a, &rr, &st) != GRPC_STATUS_OK) {
            DREY_LOG_WARN("tenant quota ledger: etcd read failed", DREY_LOG_STR("tenant", x->name),
                          DREY_LOG_STR("error", st.message));
            drey_arena_destroy(&a);
            break;
        }
        int64_t mod = 0;
        json_t *root = NULL;
        if (rr->n_kvs > 0) {
            mod = rr->kvs[0]->mod_revision;
            root = json_loadb((const char *)rr->kvs[0]->value.data, rr->kvs[0]->value.len, 0, NULL);
        }
        if (!json_is_object(root)) {
            json_decref(root);
            root = json_object();
        }
        share others, mine;
        bool someone_wants;
        sum_others(l, root, true, &others, &mine, &someone_wants);
        int64_t used = drey_tenants__local(t, x) + atomic_load(&x->pending);
        int64_t g = mine.g;
        if ((release || someone_wants) && g > used + margin_of(limit))
            g = used + margin_of(limit);
        int64_t room = limit - others.g - g, wants = 0;
        if (want > 0) {
            int64_t add = want > chunk_of(limit) ? want : chunk_of(limit);
            if (add > room)
                add = room > 0 ? room : 0;
            g += add;
            wants = add < want ? want - add : 0;
        }
        short_of = wants;
        *others_slack = others.g - others.u;
        if (g > limit - others.g)
            g = limit - others.g > 0 ? limit - others.g : 0; /* a lowered quota */
        /* Lower here first: never admit against more than etcd holds. */
        if (g < atomic_load(&x->granted))
            atomic_store(&x->granted, g);
        /* The entries of members only, and this node's. */
        json_t *out = json_object();
        const char *id;
        json_t *v;
        json_object_foreach(root, id, v) {
            if (strcmp(id, l->node_id) != 0 && json_is_object(v) && l->c.is_member(l->c.ctx, id))
                json_object_set(out, id, v);
        }
        json_object_set_new(out, l->node_id, json_pack("{sIsIsI}", "g", (json_int_t)g, "u", (json_int_t)used, "w",
                                                     (json_int_t)wants));
        char *text = json_dumps(out, JSON_COMPACT | JSON_SORT_KEYS);
        json_decref(out);
        json_decref(root);
        drey_etcd_txn txn;
        drey_etcd_txn_init(&txn, &a);
        drey_etcd_txn_if_mod_revision(&txn, key, DREY_ETCD_EQUAL, mod);
        drey_etcd_txn_put(&txn, DREY_ETCD_THEN, key, text, strlen(text), 0);
        Etcdserverpb__TxnResponse *tr = NULL;
        grpc_status_code code = drey_etcd_txn_commit(t->ledger->c.etcd, &txn, ETCD_TIMEOUT_MS, &a, &tr, &st);
        bool succeeded = code == GRPC_STATUS_OK && tr->succeeded; /* tr lives in a */
        free(text);
        drey_arena_destroy(&a);
        if (code != GRPC_STATUS_OK) {
            /* Maybe applied: the lower grant stands here, the next look
             * reads what etcd has. */
            DREY_LOG_WARN("tenant quota ledger: etcd write failed", DREY_LOG_STR("tenant", x->name),
                          DREY_LOG_STR("error", st.message));
            break;
        }
        if (!succeeded)
            continue; /* another node changed it meanwhile: read again */
        atomic_store(&x->granted, g);
        atomic_store(&x->others_used, others.u);
        x->reported = used;
        break;
    }
    free(key);
    return short_of;
}

/* --- the thread ----------------------------------------------------------------------- */

static void refresh_owned(ledger *l) {
    drey_tenants *t = l->t;
    uint32_t n = l->c.partitions;
    for (uint32_t w = 0; w < (n + 63) / 64; w++) {
        uint64_t bits = 0;
        for (uint32_t b = 0; b < 64 && w * 64 + b < n; b++)
            bits |= l->c.owns(l->c.ctx, w * 64 + b) ? (uint64_t)1 << b : 0;
        atomic_store_explicit(&t->owned[w], bits, memory_order_relaxed);
    }
}

/* Tenants whose bytes moved a good deal since this node last said: said
 * again, so the others' view (readiness, refusals' usedBytes) stays near. */
static void report(ledger *l) {
    drey_tenants *t = l->t;
    uint32_t n = atomic_load(&t->n);
    for (uint32_t id = 1; id <= n; id++) {
        tenant *x = drey_tenants__get(t, id);
        int64_t limit = atomic_load(&x->limit);
        if (limit < 0)
            continue;
        int64_t used = drey_tenants__local(t, x), d = used - x->reported;
        if (d < 0)
            d = -d;
        if (d > margin_of(limit)) {
            pthread_mutex_lock(&l->mu);
            enqueue_locked(l, x);
            pthread_mutex_unlock(&l->mu);
        }
    }
}

/* Resumes waiters (outside l->mu): they look again at the grant. */
static void wake(tenant_waiter *waiters) {
    while (waiters != NULL) {
        tenant_waiter *w = waiters;
        waiters = w->next;
        w->resume(w->arg);
        free(w);
    }
}

static void *ledger_main(void *arg) {
    ledger *l = arg;
    pthread_mutex_lock(&l->mu);
    while (!l->stop) {
        int64_t now = drey_mono_ns();
        if (now >= l->next_owned_ns) {
            pthread_mutex_unlock(&l->mu);
            refresh_owned(l);
            pthread_mutex_lock(&l->mu);
            l->next_owned_ns = now + OWNED_EVERY_NS;
        }
        if (now >= l->next_report_ns) {
            pthread_mutex_unlock(&l->mu);
            report(l);
            pthread_mutex_lock(&l->mu);
            l->next_report_ns = now + REPORT_EVERY_NS;
        }
        int64_t next = 0;
        tenant *x = take_due_locked(l, now, &next);
        if (x == NULL) {
            drey_cond_wait_until(&l->cv, &l->mu, next != 0 && next < l->next_owned_ns ? next : l->next_owned_ns);
            continue;
        }
        int64_t want = x->want;
        bool release = x->release;
        x->want = 0;
        x->release = false;
        pthread_mutex_unlock(&l->mu);
        int64_t slack;
        int64_t short_of = settle(l, x, want, release, &slack);
        pthread_mutex_lock(&l->mu);
        now = drey_mono_ns();
        /* Worth waiting only if the others hold enough they do not use:
         * a tenant whose quota is used everywhere is refused at once. */
        if (short_of > 0 && slack >= short_of && x->waiters != NULL) {
            /* Nobody holds what is missing: the others give back what they
             * do not use (they saw "w"); ask again soon, and at once when
             * one of them changes the entry. */
            if (x->starve_until_ns == 0)
                x->starve_until_ns = now + STARVE_NS;
            if (now < x->starve_until_ns) {
                if (want > x->want)
                    x->want = want;
                enqueue_at_locked(l, x, now + RETRY_NS);
                continue;
            }
        }
        /* Answered (or given up): the writes look again at the grant. One
         * that found nothing to get is not asked again for a moment: the
         * writes of a tenant at its quota are refused without waiting. */
        if (short_of > 0)
            atomic_store(&x->exhausted_until_ns, now + EXHAUSTED_NS);
        x->starve_until_ns = 0;
        tenant_waiter *waiters = x->waiters;
        x->waiters = NULL;
        pthread_mutex_unlock(&l->mu);
        wake(waiters);
        pthread_mutex_lock(&l->mu);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* Another node's change of a tenant's entry: if it wants more and this
 * node holds more than it uses, give some back; its bytes are news too. */
static void on_events(void *user, Mvccpb__Event *const *events, size_t n) {
    ledger *l = user;
    size_t plen = strlen(l->watch_key);
    for (size_t i = 0; i < n; i++) {
        const Mvccpb__KeyValue *kv = events[i]->kv;
        if (events[i]->type != MVCCPB__EVENT__EVENT_TYPE__PUT || kv == NULL || kv->key.len <= plen ||
            kv->key.len - plen > TENANT_NAME_MAX)
            continue;
        json_t *root = json_loadb((const char *)kv->value.data, kv->value.len, 0, NULL);
        if (!json_is_object(root)) {
            json_decref(root);
            continue;
        }
        /* On the etcd client's thread: no membership here (the cluster's
         * lock may be held by a thread waiting for this one). A node gone
         * that still wants only costs a release the next ask undoes. */
        share others, mine;
        bool someone_wants;
        sum_others(l, root, false, &others, &mine, &someone_wants);
        json_decref(root);
        uint32_t id = drey_tenants_intern(l->t, (const char *)kv->key.data + plen, kv->key.len - plen);
        tenant *x = drey_tenants__get(l->t, id);
        atomic_store(&x->others_used, others.u);
        pthread_mutex_lock(&l->mu);
        if (x->starve_until_ns != 0 && x->queued)
            enqueue_locked(l, x); /* someone changed it: maybe gave some back */
        pthread_mutex_unlock(&l->mu);
        if (others.g - others.u > 0)
            atomic_store(&x->exhausted_until_ns, 0); /* someone holds room again: ask */
        int64_t limit = atomic_load(&x->limit);
        if (!someone_wants || limit < 0)
            continue;
        int64_t used = drey_tenants__local(l->t, x) + atomic_load(&x->pending);
        if (atomic_load(&x->granted) > used + margin_of(limit)) {
            pthread_mutex_lock(&l->mu);
            x->release = true;
            enqueue_locked(l, x);
            pthread_mutex_unlock(&l->mu);
        }
    }
}

static void on_end(void *user, const drey_etcd_watch_end *end) {
    ledger *l = user;
    /* Compacted or refused: grants still hold; releases wait for the
     * others' next asks, which read the key afresh. */
    DREY_LOG_WARN("tenant quota ledger: the watch ended", DREY_LOG_STR("prefix", l->watch_key),
                  DREY_LOG_STR("reason", end->message != NULL ? end->message : ""));
}

int drey_tenants__ledger_start(drey_tenants *t, const drey_tenants_cluster *c, char *err, size_t cap) {
    ledger *l = drey_xcalloc(1, sizeof *l);
    l->t = t;
    l->c = *c;
    l->prefix = drey_xstrdup(c->prefix);
    l->node_id = drey_xstrdup(c->node_id);
    size_t n = strlen(c->prefix) + sizeof "tenants/";
    l->watch_key = drey_xmalloc(n);
    snprintf(l->watch_key, n, "%stenants/", c->prefix);
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    refresh_owned(l);
    l->watch = drey_etcd_watch_start(c->etcd, &(drey_etcd_watch_options){
                                                  .key = l->watch_key, .prefix = true, .on_events = on_events,
                                                  .on_end = on_end, .user = l});
    t->ledger = l;
    if (l->watch == NULL || pthread_create(&l->thread, NULL, ledger_main, l) != 0) {
        if (cap > 0)
            snprintf(err, cap, "tenants: cannot start the quota ledger");
        drey_etcd_watch_close(l->watch);
        t->ledger = NULL;
        free(l->watch_key);
        free(l->prefix);
        free(l->node_id);
        free(l);
        return -1;
    }
    return 0;
}

void drey_tenants__ledger_stop(drey_tenants *t) {
    ledger *l = t->ledger;
    pthread_mutex_lock(&l->mu);
    l->stop = true;
    pthread_cond_signal(&l->cv);
    pthread_mutex_unlock(&l->mu);
    pthread_join(l->thread, NULL);
    drey_etcd_watch_close(l->watch);
    /* Writes still parked are answered: they look again and, with no grant
     * to come, are refused. */
    pthread_mutex_lock(&l->mu);
    tenant_waiter *all = NULL;
    for (tenant *x = l->work_head; x != NULL; x = x->next_work) {
        while (x->waiters != NULL) {
            tenant_waiter *w = x->waiters;
            x->waiters = w->next;
            w->next = all;
            all = w;
        }
        x->queued = false;
    }
    l->work_head = l->work_tail = NULL;
    pthread_mutex_unlock(&l->mu);
    t->ledger = NULL;
    while (all != NULL) {
        tenant_waiter *w = all;
        all = w->next;
        w->resume(w->arg);
        free(w);
    }
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    free(l->watch_key);
    free(l->prefix);
    free(l->node_id);
    free(l);
}
