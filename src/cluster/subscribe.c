/*
 * subscribe — a Watch opened on any node follows the partitions it covers.
 *
 * The node a client's Watch reaches (the ingress) admits and counts it
 * (src/watch/watch.c), then hands it here. Here it is a set of covered
 * partitions (a keys watch: its keys' partitions; a prefix or whole-cache
 * watch: all of them) and, per owner the table names for them, a
 * subscription: one /drey.internal.v1.Subscriber/Subscribe server stream
 * on that owner's internal listener (this node's own too), naming the
 * partitions it is to report (proto/drey/internal/v1/subscribe.proto).
 * What the owners send goes into the client's stream as it came; the
 * client's WATCHING waits until every covered partition's subscription has
 * said it is in place.
 *
 * A plain call per subscription, not frames on the Peer/Forward stream: a
 * subscription is read at its client's pace, and HTTP/2 flow control per
 * call keeps a slow watcher from holding back forwarded calls; the call's
 * status is the subscription's end; and peers.c and the owner's door stay
 * as they are (the Forward stream's Frame oneof is being extended for
 * replication meanwhile).
 *
 * The table moves on. A thread looks at it every TICK_NS while watches are
 * open; when a covered partition's owner is no longer the one its events
 * are taken from (a move's handover, a failover), the client hears
 * RESYNC_REQUIRED (OWNER_CHANGED), events of that partition from the old
 * owner are no longer taken (a late one could come after the new owner's),
 * a new subscription for the partitions that changed hands is opened at the
 * new owner, and once it is in place the client hears WATCHING again. The
 * subscriptions of partitions that did not move go on untouched: their
 * events never stop, so none is missed. A subscription that ends without
 * being asked to (the owner died or restarted, the connection broke, the
 * owner could not serve it yet) is OWNER_LOST: RESYNC_REQUIRED, then it is
 * opened again, at whatever owner the table names, backing off from
 * RETRY_MIN_MS to RETRY_MAX_MS, and WATCHING once it is in place. So a
 * change is either reported or covered by a RESYNC_REQUIRED; never silently
 * missed.
 *
 * Each subscription carries the client's authorization header: the owner
 * checks the caller again with its own keys and policy (src/watch/
 * cluster.c), and its refusal (PERMISSION_DENIED, UNAUTHENTICATED) is no
 * loss to retry: the client's watch ends with the owner's status as it came.
 *
 * Resuming after an event is not offered across nodes: sequences are each
 * owner's own feed, and a watch that asks to resume starts with
 * RESYNC_REQUIRED (HISTORY_UNAVAILABLE) in place of WATCHING (watch.c).
 *
 * Everything here is under one mutex, taken before the watch hub's (the
 * stream is fed with it held); the hub never calls in with its own held.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "drey/alloc.h"
#include "drey/cache/v1/cache.pb-c.h"
#include "drey/clock.h"
#include "drey/internal/v1/subscribe.pb-c.h"
#include "drey/log.h"
#include "drey/placement.h"
#include "drey/watch.h"
#include "internal.h"
#include "peers.h"
#include "subscribe.h"
#include "table.h"

#define SUBSCRIBE_PATH "/drey.internal.v1.Subscriber/Subscribe"
/* How soon a table change reaches the watches, and their retries. */
#define TICK_NS 20000000LL
#define IDLE_TICK_NS 500000000LL
#define RETRY_MIN_MS 100
#define RETRY_MAX_MS 1000

typedef struct tag {
    void (*done)(struct tag *t, bool ok);
} tag;

typedef struct cwatch cwatch;

/* One subscription at one owner. Under S->mu. */
typedef struct osub {
    cwatch *cw;
    struct osub *next; /* in cw->subs */
    char *node;
    uint32_t n_accepted; /* partitions whose events are taken from it */
    grpc_call *call;
    int refs;            /* cw->subs' (until its status), one per batch in flight */
    bool ready;          /* its WATCHING came */
    bool cancelled;      /* asked to end: its end is no loss */
    bool ended;
    tag start_tag, recv_tag, status_tag;
    grpc_metadata token;  /* the client's authorization, for the owner's own check */
    grpc_metadata_array initial_md, trailing_md;
    grpc_byte_buffer *send_buf, *recv_buf;
    grpc_status_code code;
    grpc_slice details;
} osub;

/* A client's watch. Under S->mu. */
struct cwatch {
    drey_cluster__subs *S;
    cwatch *prev, *next;
    drey_watch_stream *ws;
    Drey__Cache__V1__WatchRequest *req; /* a copy, resume fields cleared */
    char *authorization; /* the client's header (NULL: none), carried to every owner */
    size_t authorization_len;
    uint32_t n_parts;
    uint8_t *covered;   /* n_parts */
    osub **owner;       /* n_parts: whose events of it are taken; NULL: none now */
    osub *subs;
    int refs;           /* open (until closed), one per osub */
    bool closed;
    bool refused;       /* an owner refused the caller: the client's watch ends with its status */
    bool announced;     /* the first WATCHING went */
    bool owed;          /* a RESYNC_REQUIRED went; its WATCHING is owed */
    bool missing;       /* some covered partition has no subscription (a retry is due at retry_at_ns) */
    int64_t revision;   /* of the table last followed */
    int64_t retry_at_ns, backoff_ms;
};

struct drey_cluster__subs {
    drey_cluster *c;
    drey_watch *w;
    grpc_completion_queue *cq;
    pthread_t thread;
    pthread_mutex_t mu;
    cwatch *head;
    int64_t next_tick_ns;
};

/* --- lifetimes ------------------------------------------------------------- */

static void cwatch_unref_locked(cwatch *cw) {
    if (--cw->refs > 0)
        return;
    drey__cache__v1__watch_request__free_unpacked(cw->req, NULL);
    free(cw->authorization);
    free(cw->covered);
    free(cw->owner);
    free(cw);
}

static void osub_unref_locked(osub *os) {
    if (--os->refs > 0)
        return;
    grpc_metadata_array_destroy(&os->initial_md);
    grpc_metadata_array_destroy(&os->trailing_md);
    grpc_slice_unref(os->details);
    grpc_slice_unref(os->token.value);
    if (os->send_buf != NULL)
        grpc_byte_buffer_destroy(os->send_buf);
    if (os->call != NULL)
        grpc_call_unref(os->call);
    cwatch *cw = os->cw;
    free(os->node);
    free(os);
    cwatch_unref_locked(cw);
}

static void osub_cancel_locked(osub *os) {
    if (os->cancelled || os->ended)
        return;
    os->cancelled = true;
    grpc_call_cancel(os->call, NULL);
}

/* --- the client's view ------------------------------------------------------------ */

/* The client hears WATCHING once every covered partition's events come
 * from a subscription in place: first, and after each RESYNC_REQUIRED. */
static void check_ready_locked(cwatch *cw) {
    if (cw->closed || cw->refused || (cw->announced && !cw->owed))
        return;
    for (uint32_t p = 0; p < cw->n_parts; p++) {
        if (cw->covered[p] && (cw->owner[p] == NULL || !cw->owner[p]->ready))
            return;
    }
    drey_watch_mark(cw->ws, true, NULL);
    cw->announced = true;
    cw->owed = false;
}

/* Some covered partition's events may be missed from here until its new
 * subscription is in place. Before the first WATCHING nothing was promised. */
static void lost_locked(cwatch *cw, const char *reason) {
    if (cw->closed || cw->refused || !cw->announced || cw->owed)
        return;
    drey_watch_mark(cw->ws, false, reason);
    cw->owed = true;
}

/* --- a subscription's events (the thread) ------------------------------------------- */

static void start_recv_locked(osub *os) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &os->recv_buf;
    os->refs++;
    if (grpc_call_start_batch(os->call, &op, 1, &os->recv_tag, NULL) != GRPC_CALL_OK)
        abort();
}

static void on_start(tag *t, bool ok) {
    (void)ok; /* a failed start shows in the status */
    osub *os = (osub *)((char *)t - offsetof(osub, start_tag));
    drey_cluster__subs *S = os->cw->S;
    pthread_mutex_lock(&S->mu);
    osub_unref_locked(os);
    pthread_mutex_unlock(&S->mu);
}

/* An owner's message: its WATCHING, or an event to pass on if its
 * partition's events are taken from this subscription now. */
static void handle_locked(osub *os, const uint8_t *data, size_t len) {
    cwatch *cw = os->cw;
    Drey__Cache__V1__WatchEvent *ev = drey__cache__v1__watch_event__unpack(NULL, len, data);
    if (ev == NULL) {
        DREY_LOG_WARN("an owner sent a watch event that does not decode; ending its subscription",
                      DREY_LOG_STR("peer", os->node));
        osub_cancel_locked(os);
        os->cancelled = false; /* a loss all the same */
        return;
    }
    switch (ev->kind) {
    case DREY__CACHE__V1__WATCH_EVENT__KIND__WATCHING:
        if (!os->ready) {
            os->ready = true;
            cw->backoff_ms = RETRY_MIN_MS;
            check_ready_locked(cw);
        }
        break;
    case DREY__CACHE__V1__WATCH_EVENT__KIND__RESYNC_REQUIRED:
        /* Its buffer overflowed: the client must know, in the ingress's
         * terms (the owner's words would say nothing of a WATCHING owed). */
        if (os->n_accepted > 0)
            drey_watch_lost(cw->ws);
        break;
    case DREY__CACHE__V1__WATCH_EVENT__KIND__CLEAR: /* every owner clears its share */
        if (os->n_accepted > 0)
            drey_watch_deliver(cw->ws, data, len);
        break;
    default: {
        uint32_t p = drey_placement_partition(ev->cache, strlen(ev->cache), ev->key, strlen(ev->key), cw->n_parts);
        if (cw->owner[p] == os)
            drey_watch_deliver(cw->ws, data, len);
        break;
    }
    }
    drey__cache__v1__watch_event__free_unpacked(ev, NULL);
}

static void on_recv(tag *t, bool ok) {
    osub *os = (osub *)((char *)t - offsetof(osub, recv_tag));
    drey_cluster__subs *S = os->cw->S;
    pthread_mutex_lock(&S->mu);
    if (!ok || os->recv_buf == NULL) { /* the call is ending: its status says how */
        osub_unref_locked(os);
        pthread_mutex_unlock(&S->mu);
        return;
    }
    grpc_slice body = grpc_empty_slice();
    grpc_byte_buffer_reader r;
    if (grpc_byte_buffer_reader_init(&r, os->recv_buf)) {
        body = grpc_byte_buffer_reader_readall(&r);
        grpc_byte_buffer_reader_destroy(&r);
    }
    grpc_byte_buffer_destroy(os->recv_buf);
    os->recv_buf = NULL;
    if (!os->cancelled && !os->cw->closed && !os->cw->refused)
        handle_locked(os, GRPC_SLICE_START_PTR(body), GRPC_SLICE_LENGTH(body));
    grpc_slice_unref(body);
    start_recv_locked(os);
    osub_unref_locked(os); /* this batch's; the next one holds its own */
    pthread_mutex_unlock(&S->mu);
}

/* Codes by which an owner refuses the caller itself (its own check of the
 * token and the grants): asking again, here or elsewhere, would only be
 * refused again, so the client hears it. Any other end is a loss. */
static bool refusal(grpc_status_code code) {
    return code == GRPC_STATUS_PERMISSION_DENIED || code == GRPC_STATUS_UNAUTHENTICATED;
}

/* The client's watch ends with the owner's refusal as it came (code,
 * message, details); its other subscriptions end with it. */
static void refused_locked(cwatch *cw, osub *os) {
    cw->refused = true;
    drey_call_answer a = {.code = os->code};
    char *msg = grpc_slice_to_c_string(os->details);
    a.message = msg;
    a.message_len = strlen(msg);
    for (size_t i = 0; i < os->trailing_md.count; i++) {
        if (grpc_slice_str_cmp(os->trailing_md.metadata[i].key, "grpc-status-details-bin") == 0) {
            a.details = GRPC_SLICE_START_PTR(os->trailing_md.metadata[i].value);
            a.details_len = GRPC_SLICE_LENGTH(os->trailing_md.metadata[i].value);
        }
    }
    DREY_LOG_DEBUG("an owner refused a watch's caller; ending the watch", DREY_LOG_STR("peer", os->node),
                   DREY_LOG_INT("code", os->code), DREY_LOG_STR("message", msg));
    drey_watch_end(cw->ws, &a);
    gpr_free(msg);
    for (osub *o = cw->subs; o != NULL; o = o->next)
        osub_cancel_locked(o);
    for (uint32_t p = 0; p < cw->n_parts; p++)
        cw->owner[p] = NULL;
}

static void on_status(tag *t, bool ok) {
    (void)ok;
    osub *os = (osub *)((char *)t - offsetof(osub, status_tag));
    cwatch *cw = os->cw;
    drey_cluster__subs *S = cw->S;
    pthread_mutex_lock(&S->mu);
    os->ended = true;
    if (!os->cancelled && !cw->closed && !cw->refused && refusal(os->code)) {
        refused_locked(cw, os);
    } else if (!os->cancelled && !cw->closed && !cw->refused) {
        /* Lost: its partitions are followed again from the table, after a
         * pause (the owner may be down for a while). Said once per loss, not
         * per failed retry. */
        if (os->ready) {
            char *msg = grpc_slice_to_c_string(os->details);
            DREY_LOG_INFO("a watch's subscription ended; following its partitions again",
                          DREY_LOG_STR("peer", os->node), DREY_LOG_INT("code", os->code),
                          DREY_LOG_STR("message", msg));
            gpr_free(msg);
        }
        for (uint32_t p = 0; p < cw->n_parts; p++) {
            if (cw->owner[p] == os)
                cw->owner[p] = NULL;
        }
        os->n_accepted = 0;
        cw->missing = true;
        lost_locked(cw, "OWNER_LOST");
        cw->retry_at_ns = drey_mono_ns() + cw->backoff_ms * 1000000LL;
        cw->backoff_ms = cw->backoff_ms * 2 > RETRY_MAX_MS ? RETRY_MAX_MS : cw->backoff_ms * 2;
    }
    for (osub **pp = &cw->subs; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == os) {
            *pp = os->next;
            break;
        }
    }
    osub_unref_locked(os); /* the batch's */
    osub_unref_locked(os); /* cw->subs' */
    pthread_mutex_unlock(&S->mu);
}

/* Subscribes at node for the partitions listed; their events are taken
 * from it from now on. */
static void osub_open_locked(cwatch *cw, const drey_cluster__node *node, const uint32_t *parts, size_t n) {
    drey_cluster__subs *S = cw->S;
    drey_cluster *c = S->c;
    osub *os = drey_xcalloc(1, sizeof *os);
    os->cw = cw;
    cw->refs++;
    os->node = drey_xstrdup(node->id);
    os->refs = 1; /* cw->subs' */
    os->start_tag.done = on_start;
    os->recv_tag.done = on_recv;
    os->status_tag.done = on_status;
    grpc_metadata_array_init(&os->initial_md);
    grpc_metadata_array_init(&os->trailing_md);
    os->details = grpc_empty_slice();
    os->next = cw->subs;
    cw->subs = os;
    for (size_t i = 0; i < n; i++)
        cw->owner[parts[i]] = os;
    os->n_accepted = (uint32_t)n;

    Drey__Internal__V1__SubscribeRequest sr = DREY__INTERNAL__V1__SUBSCRIBE_REQUEST__INIT;
    sr.node = (char *)c->opts.node_id;
    sr.watch = cw->req;
    sr.partition_count = cw->n_parts;
    sr.n_partitions = n;
    sr.partitions = (uint32_t *)parts;
    size_t len = drey__internal__v1__subscribe_request__get_packed_size(&sr);
    uint8_t *buf = drey_xmalloc(len ? len : 1);
    drey__internal__v1__subscribe_request__pack(&sr, buf);
    grpc_slice slice = grpc_slice_new(buf, len, free);
    os->send_buf = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice);

    os->call = drey_cluster__peers_new_call(c->peers, node->id, node->internal, SUBSCRIBE_PATH, S->cq);
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (cw->authorization != NULL) {
        os->token.key = grpc_slice_from_static_string("authorization");
        os->token.value = grpc_slice_from_copied_buffer(cw->authorization, cw->authorization_len);
        ops[0].data.send_initial_metadata.count = 1;
        ops[0].data.send_initial_metadata.metadata = &os->token;
    }
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = os->send_buf;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &os->initial_md;
    os->refs++;
    if (grpc_call_start_batch(os->call, ops, 4, &os->start_tag, NULL) != GRPC_CALL_OK)
        abort();
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[0].data.recv_status_on_client.trailing_metadata = &os->trailing_md;
    ops[0].data.recv_status_on_client.status = &os->code;
    ops[0].data.recv_status_on_client.status_details = &os->details;
    os->refs++;
    if (grpc_call_start_batch(os->call, ops, 1, &os->status_tag, NULL) != GRPC_CALL_OK)
        abort();
    start_recv_locked(os);
}

/* --- following the table -------------------------------------------------------------- */

/* The node whose subscription can report p now; NULL: none (no owner, or
 * one that is not a member). */
static const drey_cluster__node *owner_of(const drey_cluster__topology *t, uint32_t p) {
    int32_t o = t->parts[p].primary;
    if (o < 0 || !t->nodes[o].member || t->nodes[o].internal[0] == '\0')
        return NULL;
    return &t->nodes[o];
}

/* Makes cw's subscriptions match t: partitions whose owner changed stop
 * being taken from the old one (which ends once it reports nothing the
 * watch wants) and get one new subscription per new owner; partitions
 * without a subscription get one when their retry is due. */
static void follow_locked(cwatch *cw, const drey_cluster__topology *t, int64_t now) {
    if (cw->closed || cw->refused || t->n_parts != cw->n_parts)
        return;
    cw->revision = t->revision;
    bool due = now >= cw->retry_at_ns, changed = false;
    uint32_t *want = drey_xmalloc(cw->n_parts * sizeof *want);
    int32_t *node_of = drey_xmalloc(cw->n_parts * sizeof *node_of);
    size_t n_want = 0;
    for (uint32_t p = 0; p < cw->n_parts; p++) {
        if (!cw->covered[p])
            continue;
        const drey_cluster__node *node = owner_of(t, p);
        osub *cur = cw->owner[p];
        if (cur != NULL && node != NULL && strcmp(cur->node, node->id) == 0)
            continue;
        if (cur != NULL) {
            cw->owner[p] = NULL;
            if (--cur->n_accepted == 0)
                osub_cancel_locked(cur);
            changed = true;
        } else if (!due) {
            continue; /* lost: wait for its retry */
        }
        if (node != NULL) {
            want[n_want] = p;
            node_of[n_want++] = (int32_t)(node - t->nodes);
        }
    }
    if (changed)
        lost_locked(cw, "OWNER_CHANGED");
    /* One subscription per new owner, for all its partitions. */
    uint32_t *group = drey_xmalloc((n_want ? n_want : 1) * sizeof *group);
    for (size_t i = 0; i < n_want; i++) {
        if (node_of[i] < 0)
            continue;
        int32_t k = node_of[i];
        size_t g = 0;
        for (size_t j = i; j < n_want; j++) {
            if (node_of[j] == k) {
                group[g++] = want[j];
                node_of[j] = -1;
            }
        }
        osub_open_locked(cw, &t->nodes[k], group, g);
    }
    free(group);
    free(want);
    free(node_of);
    cw->missing = false;
    for (uint32_t p = 0; p < cw->n_parts && !cw->missing; p++)
        cw->missing = cw->covered[p] && cw->owner[p] == NULL;
    check_ready_locked(cw);
}

static void tick_locked(drey_cluster__subs *S) {
    int64_t now = drey_mono_ns();
    if (now < S->next_tick_ns)
        return;
    S->next_tick_ns = now + TICK_NS;
    if (S->head == NULL)
        return;
    drey_cluster__topology *t = drey_cluster__acquire(S->c);
    for (cwatch *cw = S->head; cw != NULL; cw = cw->next) {
        if (t->revision != cw->revision || (cw->missing && now >= cw->retry_at_ns))
            follow_locked(cw, t, now);
    }
    drey_cluster__topology_unref(t);
}

static void *subs_main(void *arg) {
    drey_cluster__subs *S = arg;
    for (;;) {
        pthread_mutex_lock(&S->mu);
        int64_t wait = S->head != NULL ? TICK_NS : IDLE_TICK_NS;
        pthread_mutex_unlock(&S->mu);
        grpc_event ev = grpc_completion_queue_next(
            S->cq, gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_nanos(wait, GPR_TIMESPAN)), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            return NULL;
        if (ev.type == GRPC_OP_COMPLETE) {
            tag *t = ev.tag;
            t->done(t, ev.success != 0);
        }
        pthread_mutex_lock(&S->mu);
        tick_locked(S);
        pthread_mutex_unlock(&S->mu);
    }
}

/* --- the watch hub's hooks ----------------------------------------------------------------- */

static void *watch_open(void *ctx, drey_watch_stream *ws, const Drey__Cache__V1__WatchRequest *req,
                        const char *authorization, size_t authorization_len) {
    drey_cluster__subs *S = ctx;
    cwatch *cw = drey_xcalloc(1, sizeof *cw);
    cw->S = S;
    cw->ws = ws;
    if (authorization != NULL) {
        cw->authorization = drey_xmalloc(authorization_len + 1);
        memcpy(cw->authorization, authorization, authorization_len);
        cw->authorization_len = authorization_len;
    }
    cw->refs = 1;
    cw->backoff_ms = RETRY_MIN_MS;
    cw->revision = -1;
    size_t len = drey__cache__v1__watch_request__get_packed_size(req);
    uint8_t *buf = drey_xmalloc(len ? len : 1);
    drey__cache__v1__watch_request__pack(req, buf);
    cw->req = drey__cache__v1__watch_request__unpack(NULL, len, buf);
    free(buf);
    if (cw->req == NULL)
        abort(); /* what protobuf-c just packed it unpacks */
    cw->req->resume_feed = 0;
    cw->req->resume_after = 0;
    drey_cluster__topology *t = drey_cluster__acquire(S->c);
    cw->n_parts = t->n_parts;
    cw->covered = drey_xcalloc(cw->n_parts ? cw->n_parts : 1, 1);
    cw->owner = drey_xcalloc(cw->n_parts ? cw->n_parts : 1, sizeof *cw->owner);
    for (uint32_t p = 0; p < cw->n_parts; p++)
        cw->covered[p] = req->n_keys == 0;
    for (size_t i = 0; i < req->n_keys && cw->n_parts > 0; i++)
        cw->covered[drey_placement_partition(req->cache, strlen(req->cache), req->keys[i], strlen(req->keys[i]),
                                             cw->n_parts)] = 1;
    pthread_mutex_lock(&S->mu);
    cw->next = S->head;
    if (S->head != NULL)
        S->head->prev = cw;
    S->head = cw;
    follow_locked(cw, t, drey_mono_ns());
    pthread_mutex_unlock(&S->mu);
    drey_cluster__topology_unref(t);
    return cw;
}

static void watch_close(void *ctx, void *handle) {
    drey_cluster__subs *S = ctx;
    cwatch *cw = handle;
    pthread_mutex_lock(&S->mu);
    cw->closed = true;
    if (cw->prev != NULL)
        cw->prev->next = cw->next;
    else
        S->head = cw->next;
    if (cw->next != NULL)
        cw->next->prev = cw->prev;
    for (osub *os = cw->subs; os != NULL; os = os->next)
        osub_cancel_locked(os);
    cwatch_unref_locked(cw);
    pthread_mutex_unlock(&S->mu);
}

static uint32_t watch_partitions(void *ctx) {
    drey_cluster__subs *S = ctx;
    return S->c->partitions != NULL ? S->c->n_parts : 0;
}

static bool watch_owns(void *ctx, uint32_t p) {
    drey_cluster__subs *S = ctx;
    return p < S->c->n_parts && S->c->partitions != NULL && atomic_load(&S->c->partitions[p].owned);
}

void drey_cluster_attach_watch(drey_cluster *c, drey_watch *w) {
    if (c->subs != NULL)
        return;
    drey_cluster__subs *S = drey_xcalloc(1, sizeof *S);
    S->c = c;
    S->w = w;
    pthread_mutex_init(&S->mu, NULL);
    S->cq = grpc_completion_queue_create_for_next(NULL);
    if (pthread_create(&S->thread, NULL, subs_main, S) != 0)
        abort();
    c->subs = S;
    drey_watch_cluster hooks = {
        .open = watch_open,
        .close = watch_close,
        .partitions = watch_partitions,
        .owns = watch_owns,
        .ctx = S,
    };
    drey_watch_set_cluster(w, &hooks);
}

void drey_cluster__subs_destroy(drey_cluster__subs *S) {
    if (S == NULL)
        return;
    pthread_mutex_lock(&S->mu);
    /* Watches still open (the server is gone: their calls are over) end
     * here; every subscription's batches complete before the queue's
     * shutdown does. */
    while (S->head != NULL) {
        cwatch *cw = S->head;
        pthread_mutex_unlock(&S->mu);
        watch_close(S, cw);
        pthread_mutex_lock(&S->mu);
    }
    pthread_mutex_unlock(&S->mu);
    grpc_completion_queue_shutdown(S->cq);
    pthread_join(S->thread, NULL);
    grpc_completion_queue_destroy(S->cq);
    pthread_mutex_destroy(&S->mu);
    free(S);
}
