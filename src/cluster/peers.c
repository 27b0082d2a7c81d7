/*
 * peers — calls to other nodes' internal listeners, over one stream each.
 *
 * One channel per peer, made on first use with this node's certificate and
 * the pinned cluster CA; the target name checked against the peer's
 * certificate is its node id (not its address), so a node answers only for
 * the id it was issued.
 *
 * A call is not a gRPC call of its own: every call to a peer is a Call
 * frame on one long-lived drey.internal.v1.Peer/Forward stream to it
 * (proto/drey/internal/v1/peer.proto), and its answer an Answer frame back.
 * A whole HTTP/2 call per forwarded request (stream setup, headers both
 * ways, trailers, on both nodes) cost more than the request itself; a frame
 * costs its bytes. Frames queued while a write is in flight go out together
 * in the next one, so the batch grows with the load by itself.
 *
 * A call's id is its slot in the stream's table (low 32 bits) and the
 * table's generation for it (high 32), so an answer finds its call without
 * a search and a late answer for a slot used again is ignored. When the
 * stream ends (the peer died, its connection broke, the channel was
 * replaced), every call on it fails UNAVAILABLE, like a unary call whose
 * connection broke: it may have run, and it is not retried here; the next
 * call opens a new stream.
 *
 * One completion queue and thread serve every stream, and every done runs
 * there, one at a time (the router's gathers rely on it). Cancelled calls
 * and calls past their deadline are finished by the same thread, which
 * wakes at least every SWEEP_NS while calls are in flight; the peer is told
 * with a Cancel frame.
 *
 * A peer is dialled at the internal address its member entry advertises,
 * unless --cluster-peer-address names another for its id (a sidecar, a NAT,
 * a test's proxy on that one link): the certificate is still checked
 * against the id, so the detour cannot change who answers.
 *
 * Certificates rotate without a restart: the files are checked (at most once
 * a second) before a call, and when one changed every channel is dropped
 * and made again with the new files on next use.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>

#include "drey/alloc.h"
#include "drey/clock.h"
#include "drey/internal/v1/peer.pb-c.h"
#include "drey/log.h"
#include "drey/pem.h"
#include "drey/rpc.h"
#include "internal.h"
#include "google/rpc/error_details.pb-c.h"
#include "google/rpc/status.pb-c.h"
#include "peers.h"

#define MAX_PEERS 256
#define CHECK_FILES_NS 1000000000LL
#define SWEEP_NS 10000000LL
/* A write batches frames up to this size (a bigger frame goes alone): the
 * peer's listener takes messages up to --max-recv-message-bytes. */
#define BATCH_BYTES (256 * 1024)
#define MAX_HEADERS 8
#define FORWARD_PATH "/drey.internal.v1.Peer/Forward"
#define NO_CONNECTION "failed to connect to all addresses"

typedef struct tag {
    void (*done)(struct tag *t, bool ok);
} tag;

typedef struct outbuf {
    struct outbuf *next;
    uint8_t *data;
    size_t len, cap;
} outbuf;

typedef struct pstream pstream;
typedef struct peer peer;

struct peer {
    char *id, *address;
    grpc_channel *channel;
    pstream *stream; /* the open one; NULL: the next call opens one */
};

/* One Forward call. Under p->mu except where said. */
struct pstream {
    drey_cluster__peers *p;
    peer *pe;       /* NULL once the peer forgot it */
    char peer_id[DREY_CLUSTER_MAX_ID]; /* for messages */
    grpc_call *call;
    int refs;       /* the peer's (until it ends), one per batch in flight */
    bool ended;     /* its status came: no more frames */
    bool writing;
    bool write_deferred; /* to the end of the caller's batch (it holds a reference) */
    bool retiring;  /* its peer's channel was replaced: it takes no new calls */
    bool closing;   /* retiring and idle: the close was sent */
    grpc_channel *channel; /* a retiring stream's: destroyed with it */
    tag start_tag, recv_tag, send_tag, status_tag, close_tag;
    grpc_metadata_array initial_md, trailing_md;
    grpc_status_code code;
    grpc_slice details;
    grpc_byte_buffer *recv_buf, *send_buf; /* the recv/send batch's own */
    outbuf *out_head, *out_tail; /* frames not written yet */
    drey_cluster__pcall **slots;
    uint32_t *gens;
    uint32_t n_slots, cap_slots;
    uint32_t *free_slots;
    uint32_t n_free;
    size_t live;
    pstream *prev, *next; /* in p->streams */
};

/* --cluster-peer-address: dial peer id at address instead. */
typedef struct dial_override {
    char *id, *address;
} dial_override;

struct drey_cluster__peers {
    char node_id[DREY_CLUSTER_MAX_ID]; /* what the certificate must name */
    drey_pem_files files; /* cert, key, ca */
    dial_override *dial;
    size_t n_dial;
    int64_t checked_ns;
    grpc_channel_credentials *creds;
    pthread_mutex_t mu;
    peer *peers[MAX_PEERS];
    size_t n;
    pstream *streams; /* every stream not freed yet, retiring ones too */
    size_t live; /* calls in flight on every stream */
    drey_cluster__pcall *finished; /* cancelled or expired, done still to run */
    int64_t next_sweep_ns;
    bool idle;   /* the thread waits without a timeout */
    bool kicked; /* a wake-up is on its way */
    tag kick_tag;
    grpc_completion_queue *cq;
    pthread_t thread;
};

struct drey_cluster__pcall {
    _Atomic int refs; /* the stream's until its done has run, and the handle's */
    drey_cluster__peers *p;
    pstream *s;       /* under p->mu: the stream it is in flight on; NULL once finished */
    uint64_t id;
    int64_t deadline_ns;
    grpc_status_code code; /* finished without an answer: why */
    drey_cluster__pcall *next_finished;
    void (*done)(void *arg, const drey_answer *a);
    void *arg;
};

typedef drey_cluster__pcall pcall;

static void pcall_unref(pcall *c) {
    if (atomic_fetch_sub(&c->refs, 1) == 1)
        free(c);
}

/* --- a stream's frames ------------------------------------------------------- */

static void stream_unref_locked(pstream *s) {
    if (--s->refs > 0)
        return;
    if (s->prev != NULL)
        s->prev->next = s->next;
    else
        s->p->streams = s->next;
    if (s->next != NULL)
        s->next->prev = s->prev;
    for (outbuf *o = s->out_head; o != NULL;) {
        outbuf *next = o->next;
        free(o->data);
        free(o);
        o = next;
    }
    grpc_metadata_array_destroy(&s->initial_md);
    grpc_metadata_array_destroy(&s->trailing_md);
    grpc_slice_unref(s->details);
    grpc_call_unref(s->call);
    if (s->channel != NULL)
        grpc_channel_destroy(s->channel);
    free(s->slots);
    free(s->gens);
    free(s->free_slots);
    free(s);
}

static void start_batch_locked(pstream *s, const grpc_op *ops, size_t n, tag *t) {
    s->refs++;
    grpc_call_error e = grpc_call_start_batch(s->call, ops, n, t, NULL);
    if (e != GRPC_CALL_OK) {
        DREY_LOG_ERROR("starting a peer stream batch failed", DREY_LOG_STR("error", grpc_call_error_to_string(e)));
        abort();
    }
}

/* Queues one frame, as a one-frame Frames (serialized Frames concatenate). */
static void append_locked(pstream *s, const Drey__Internal__V1__Frame *f) {
    Drey__Internal__V1__Frames fs = DREY__INTERNAL__V1__FRAMES__INIT;
    Drey__Internal__V1__Frame *one = (Drey__Internal__V1__Frame *)f;
    fs.n_frames = 1;
    fs.frames = &one;
    size_t n = drey__internal__v1__frames__get_packed_size(&fs);
    outbuf *o = s->out_tail;
    if (o == NULL || (o->len > 0 && o->len + n > BATCH_BYTES)) {
        o = drey_xcalloc(1, sizeof *o);
        if (s->out_tail != NULL)
            s->out_tail->next = o;
        else
            s->out_head = o;
        s->out_tail = o;
    }
    if (o->len + n > o->cap) {
        o->cap = o->len + n < 4096 ? 4096 : (o->len + n) * 2;
        o->data = drey_xrealloc(o->data, o->cap, 1);
    }
    drey__internal__v1__frames__pack(&fs, o->data + o->len);
    o->len += n;
}

/* Writes the next batch of frames unless a write is in flight. */
static void write_locked(pstream *s) {
    if (s->writing || s->ended || s->closing || s->out_head == NULL)
        return;
    outbuf *o = s->out_head;
    s->out_head = o->next;
    if (s->out_head == NULL)
        s->out_tail = NULL;
    grpc_slice slice = grpc_slice_new(o->data, o->len, free); /* the buffer goes with it: no copy */
    free(o);
    s->send_buf = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_MESSAGE;
    op.data.send_message.send_message = s->send_buf;
    s->writing = true;
    start_batch_locked(s, &op, 1, &s->send_tag);
}

/* A retiring stream whose calls are all answered closes its side; the peer
 * then ends it, and it goes with its channel. */
static void retire_if_idle_locked(pstream *s) {
    if (!s->retiring || s->closing || s->ended || s->live > 0 || s->writing || s->write_deferred ||
        s->out_head != NULL)
        return;
    s->closing = true;
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    start_batch_locked(s, &op, 1, &s->close_tag);
}

/* The end of the batch whose calls were queued on s (drey_cluster__peers_call). */
static void write_later(void *arg) {
    pstream *s = arg;
    drey_cluster__peers *p = s->p; /* s may go with its last reference */
    pthread_mutex_lock(&p->mu);
    s->write_deferred = false;
    write_locked(s);
    retire_if_idle_locked(s);
    stream_unref_locked(s);
    pthread_mutex_unlock(&p->mu);
}

static void send_cancel_locked(pstream *s, uint64_t id) {
    Drey__Internal__V1__Cancel cancel = DREY__INTERNAL__V1__CANCEL__INIT;
    Drey__Internal__V1__Frame f = DREY__INTERNAL__V1__FRAME__INIT;
    f.id = id;
    f.body_case = DREY__INTERNAL__V1__FRAME__BODY_CANCEL;
    f.cancel = &cancel;
    append_locked(s, &f);
    write_locked(s);
}

/* --- the stream's table of calls -------------------------------------------- */

static void slot_put_locked(pstream *s, pcall *c) {
    uint32_t i;
    if (s->n_free > 0) {
        i = s->free_slots[--s->n_free];
    } else {
        if (s->n_slots == s->cap_slots) {
            s->cap_slots = s->cap_slots ? s->cap_slots * 2 : 64;
            s->slots = drey_xrealloc(s->slots, s->cap_slots, sizeof *s->slots);
            s->gens = drey_xrealloc(s->gens, s->cap_slots, sizeof *s->gens);
            s->free_slots = drey_xrealloc(s->free_slots, s->cap_slots, sizeof *s->free_slots);
        }
        i = s->n_slots++;
        s->gens[i] = 0;
    }
    s->gens[i]++;
    s->slots[i] = c;
    c->id = (uint64_t)s->gens[i] << 32 | i;
    c->s = s;
    s->live++;
    s->p->live++;
}

static pcall *slot_find_locked(pstream *s, uint64_t id) {
    uint32_t i = (uint32_t)id;
    if (i >= s->n_slots || s->slots[i] == NULL || s->slots[i]->id != id)
        return NULL;
    return s->slots[i];
}

/* Takes c off its stream's table: it is finished, whatever comes later. */
static void slot_take_locked(pcall *c) {
    pstream *s = c->s;
    uint32_t i = (uint32_t)c->id;
    s->slots[i] = NULL;
    s->free_slots[s->n_free++] = i;
    s->live--;
    s->p->live--;
    c->s = NULL;
    retire_if_idle_locked(s);
}

/* Finishes c without an answer (its done runs on the peers' thread). */
static void finish_locked(drey_cluster__peers *p, pcall *c, grpc_status_code code) {
    c->code = code;
    c->next_finished = p->finished;
    p->finished = c;
}

/* Wakes the thread out of a wait without a timeout, which a call that
 * needs sweeping (it may be cancelled, it has a deadline) must not sleep
 * through: its stream may have no event coming for a long time (the peer
 * does not finish connecting). The C core has no way to post to a queue
 * but a watch: one on a peer's channel with a deadline already past
 * completes at once. Needs p->mu. */
static void kick_locked(drey_cluster__peers *p, grpc_channel *ch) {
    if (!p->idle || p->kicked)
        return;
    p->kicked = true;
    grpc_channel_watch_connectivity_state(ch, grpc_channel_check_connectivity_state(ch, 0),
                                          gpr_now(GPR_CLOCK_MONOTONIC), p->cq, &p->kick_tag);
}

static void on_kick(tag *t, bool ok) {
    (void)ok;
    drey_cluster__peers *p = (drey_cluster__peers *)((char *)t - offsetof(drey_cluster__peers, kick_tag));
    pthread_mutex_lock(&p->mu);
    p->kicked = false;
    pthread_mutex_unlock(&p->mu);
}

static void run_finished(pcall *list, const char *peer_message, bool unsent) {
    while (list != NULL) {
        pcall *c = list;
        list = c->next_finished;
        const char *msg = c->code == GRPC_STATUS_CANCELLED           ? "cancelled by the caller"
                          : c->code == GRPC_STATUS_DEADLINE_EXCEEDED ? "Deadline Exceeded"
                          : peer_message != NULL                      ? peer_message
                                                                      : "the stream to the peer broke";
        drey_answer a = {.code = c->code, .message = msg, .message_len = strlen(msg), .unsent = unsent};
        c->done(c->arg, &a);
        pcall_unref(c);
    }
}

/* New credentials from the files; NULL with err when they do not load.
 * Either way the files' identities are kept: a rotation that does not load
 * is not retried (and logged) until the files change again. */
static grpc_channel_credentials *load_creds(drey_cluster__peers *p, const drey_pem_id ids[3], char *err, size_t cap) {
    drey_pem_files_keep(&p->files, ids);
    char *pem[3];
    if (!drey_pem_files_read(&p->files, pem, err, cap))
        return NULL;
    /* Every peer would refuse it: a peer dialling this node checks the
     * certificate against the node id as a host name, and the internal
     * listener compares the id a call claims with the certificate's. Said
     * at once, not as moves failing three times a second. */
    if (!drey_pem_names(pem[0], p->node_id)) {
        snprintf(err, cap,
                 "the internal certificate %s does not name \"%s\" (--node-id) in a DNS subject alternative name "
                 "(or, without one, its common name), so every peer would refuse this node",
                 p->files.paths[0], p->node_id);
        drey_pem_free(pem);
        return NULL;
    }
    grpc_ssl_pem_key_cert_pair pair = {.private_key = pem[1], .cert_chain = pem[0]};
    grpc_channel_credentials *creds = grpc_ssl_credentials_create(pem[2], &pair, NULL, NULL);
    drey_pem_free(pem);
    if (creds == NULL)
        snprintf(err, cap, "grpc refused the peer certificate, key or CA");
    return creds;
}

/* --- stream events (the peers' thread) ---------------------------------------- */

static pstream *of(tag *t, size_t off) {
    return (pstream *)((char *)t - off);
}

/* The start and the close each hold a reference until they complete. */
static void let_go(pstream *s) {
    drey_cluster__peers *p = s->p; /* s may go with its last reference */
    pthread_mutex_lock(&p->mu);
    stream_unref_locked(s);
    pthread_mutex_unlock(&p->mu);
}

static void on_start(tag *t, bool ok) {
    (void)ok; /* a failed start shows in the status */
    let_go(of(t, offsetof(pstream, start_tag)));
}

static void on_closed(tag *t, bool ok) {
    (void)ok;
    let_go(of(t, offsetof(pstream, close_tag)));
}

static void on_sent(tag *t, bool ok) {
    pstream *s = of(t, offsetof(pstream, send_tag));
    drey_cluster__peers *p = s->p;
    pthread_mutex_lock(&p->mu);
    grpc_byte_buffer_destroy(s->send_buf);
    s->send_buf = NULL;
    s->writing = false;
    if (ok)
        write_locked(s); /* what queued up meanwhile, in one message */
    retire_if_idle_locked(s);
    stream_unref_locked(s);
    pthread_mutex_unlock(&p->mu);
}

/* The stream is over: every call on it fails as a unary call on a broken
 * connection would. */
static void on_status(tag *t, bool ok) {
    (void)ok;
    pstream *s = of(t, offsetof(pstream, status_tag));
    drey_cluster__peers *p = s->p;
    pcall *failed = NULL;
    char msg[256];
    char *details = grpc_slice_to_c_string(s->details);
    pthread_mutex_lock(&p->mu);
    snprintf(msg, sizeof msg, "the stream to peer %s broke: %s", s->peer_id, details);
    s->ended = true;
    if (s->pe != NULL && s->pe->stream == s)
        s->pe->stream = NULL;
    s->pe = NULL;
    for (uint32_t i = 0; i < s->n_slots; i++) {
        pcall *c = s->slots[i];
        if (c == NULL)
            continue;
        slot_take_locked(c);
        c->code = GRPC_STATUS_UNAVAILABLE;
        c->next_finished = failed;
        failed = c;
    }
    stream_unref_locked(s); /* the batch's */
    stream_unref_locked(s); /* the peer's */
    pthread_mutex_unlock(&p->mu);
    /* The C core's words when no connection could be picked for the
     * stream: nothing of it went out (a transparent retry re-picks only
     * when the server had not seen the first attempt). */
    bool unsent = strncmp(details, NO_CONNECTION, strlen(NO_CONNECTION)) == 0;
    gpr_free(details);
    run_finished(failed, msg, unsent);
}

typedef struct answered {
    pcall *c;
    const Drey__Internal__V1__Answer *a;
} answered;

static void start_recv_locked(pstream *s) {
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_MESSAGE;
    op.data.recv_message.recv_message = &s->recv_buf;
    start_batch_locked(s, &op, 1, &s->recv_tag);
}

static void on_recv(tag *t, bool ok) {
    pstream *s = of(t, offsetof(pstream, recv_tag));
    drey_cluster__peers *p = s->p;
    if (!ok || s->recv_buf == NULL) {
        /* The stream is ending; its status says how. */
        pthread_mutex_lock(&p->mu);
        stream_unref_locked(s);
        pthread_mutex_unlock(&p->mu);
        return;
    }
    grpc_slice body = grpc_empty_slice();
    grpc_byte_buffer_reader r;
    if (grpc_byte_buffer_reader_init(&r, s->recv_buf)) {
        body = grpc_byte_buffer_reader_readall(&r);
        grpc_byte_buffer_reader_destroy(&r);
    }
    grpc_byte_buffer_destroy(s->recv_buf);
    s->recv_buf = NULL;
    Drey__Internal__V1__Frames *fs =
        drey__internal__v1__frames__unpack(NULL, GRPC_SLICE_LENGTH(body), GRPC_SLICE_START_PTR(body));
    grpc_slice_unref(body);
    answered stack[64];
    answered *done = stack;
    size_t n_done = 0;
    pthread_mutex_lock(&p->mu);
    if (fs == NULL) {
        /* Not from a node of this build: end it (its calls fail). */
        DREY_LOG_WARN("a peer sent a message that does not decode; closing its stream",
                      DREY_LOG_STR("peer", s->peer_id));
        grpc_call_cancel(s->call, NULL);
        stream_unref_locked(s);
        pthread_mutex_unlock(&p->mu);
        return;
    }
    if (fs->n_frames > 64)
        done = drey_xmalloc(fs->n_frames * sizeof *done);
    for (size_t i = 0; i < fs->n_frames; i++) {
        const Drey__Internal__V1__Frame *f = fs->frames[i];
        if (f->body_case != DREY__INTERNAL__V1__FRAME__BODY_ANSWER)
            continue;
        pcall *c = slot_find_locked(s, f->id);
        if (c == NULL)
            continue; /* cancelled or expired here already */
        slot_take_locked(c);
        done[n_done++] = (answered){c, f->answer};
    }
    start_recv_locked(s);
    stream_unref_locked(s); /* this batch's; the next one holds its own */
    pthread_mutex_unlock(&p->mu);
    /* What the answers lead to (a Pipeline stream's response) is written
     * once for all of them. */
    drey_pipeline_batch_begin();
    for (size_t i = 0; i < n_done; i++) {
        const Drey__Internal__V1__Answer *an = done[i].a;
        drey_answer a = {
            .code = an->code,
            .message = an->message,
            .message_len = strlen(an->message),
            .details = an->details.len > 0 ? an->details.data : NULL,
            .details_len = an->details.len,
            .response = an->response.len > 0 ? an->response.data : (const uint8_t *)"",
            .response_len = an->response.len,
        };
        done[i].c->done(done[i].c->arg, &a);
        pcall_unref(done[i].c);
    }
    drey_pipeline_batch_end();
    if (done != stack)
        free(done);
    drey__internal__v1__frames__free_unpacked(fs, NULL);
}

/* Finishes the calls past their deadline and the cancelled ones. */
static void sweep(drey_cluster__peers *p) {
    int64_t now = drey_mono_ns();
    pthread_mutex_lock(&p->mu);
    if (now >= p->next_sweep_ns) {
        p->next_sweep_ns = now + SWEEP_NS;
        for (pstream *s = p->streams; s != NULL; s = s->next) {
            for (uint32_t i = 0; s->live > 0 && i < s->n_slots; i++) {
                pcall *c = s->slots[i];
                if (c == NULL || c->deadline_ns > now)
                    continue;
                send_cancel_locked(s, c->id); /* the peer stops waiting too (before a retiring stream closes) */
                slot_take_locked(c);
                finish_locked(p, c, GRPC_STATUS_DEADLINE_EXCEEDED);
            }
        }
    }
    pcall *list = p->finished;
    p->finished = NULL;
    pthread_mutex_unlock(&p->mu);
    run_finished(list, NULL, false);
}

static void *peers_main(void *arg) {
    drey_cluster__peers *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        bool timed = p->live > 0 || p->finished != NULL;
        p->idle = !timed;
        pthread_mutex_unlock(&p->mu);
        gpr_timespec until = timed ? gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_nanos(SWEEP_NS, GPR_TIMESPAN))
                                   : gpr_inf_future(GPR_CLOCK_MONOTONIC);
        grpc_event ev = grpc_completion_queue_next(p->cq, until, NULL);
        pthread_mutex_lock(&p->mu);
        p->idle = false;
        pthread_mutex_unlock(&p->mu);
        if (ev.type == GRPC_OP_COMPLETE) {
            tag *t = ev.tag;
            t->done(t, ev.success != 0);
        }
        sweep(p);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            return NULL;
    }
}

drey_cluster__peers *drey_cluster__peers_create(const char *node_id, const char *cert, const char *key, const char *ca,
                                                char *err, size_t err_cap) {
    if (cert == NULL || cert[0] == '\0' || key == NULL || key[0] == '\0' || ca == NULL || ca[0] == '\0') {
        snprintf(err, err_cap, "a cluster node needs --internal-tls-cert, --internal-tls-key and --internal-tls-ca");
        return NULL;
    }
    drey_cluster__peers *p = drey_xcalloc(1, sizeof *p);
    snprintf(p->node_id, sizeof p->node_id, "%s", node_id);
    drey_pem_files_init(&p->files, cert, key, ca);
    drey_rpc_init();
    drey_pem_id ids[3];
    drey_pem_files_changed(&p->files, ids);
    p->creds = load_creds(p, ids, err, err_cap);
    if (p->creds == NULL) {
        drey_pem_files_free(&p->files);
        free(p);
        grpc_shutdown();
        return NULL;
    }
    p->checked_ns = drey_mono_ns();
    pthread_mutex_init(&p->mu, NULL);
    p->cq = grpc_completion_queue_create_for_next(NULL);
    p->kick_tag.done = on_kick;
    if (pthread_create(&p->thread, NULL, peers_main, p) != 0)
        abort();
    return p;
}

/* Forgets a peer (its certificates rotated, it moved, or this node
 * stops). Its stream takes no new calls; the calls on it are answered on
 * it and then it closes, keeping the old channel until it ends (a rotation
 * fails nothing), unless cancel (this node stops: they fail now). */
static void drop_peer_locked(peer *pe, bool cancel) {
    pstream *s = pe->stream;
    if (s != NULL) {
        s->pe = NULL;
        s->retiring = true;
        s->channel = pe->channel;
        if (cancel)
            grpc_call_cancel(s->call, NULL);
        else
            retire_if_idle_locked(s);
    } else {
        grpc_channel_destroy(pe->channel);
    }
    free(pe->id);
    free(pe->address);
    free(pe);
}

static void drop_channels_locked(drey_cluster__peers *p, bool cancel) {
    for (size_t i = 0; i < p->n; i++)
        drop_peer_locked(p->peers[i], cancel);
    p->n = 0;
}

void drey_cluster__peers_destroy(drey_cluster__peers *p) {
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->mu);
    drop_channels_locked(p, true);
    pthread_mutex_unlock(&p->mu);
    /* The streams' batches complete (cancelled) before the queue reports
     * its shutdown, and their calls' dones run. */
    grpc_completion_queue_shutdown(p->cq);
    pthread_join(p->thread, NULL);
    grpc_completion_queue_destroy(p->cq);
    grpc_channel_credentials_release(p->creds);
    drey_pem_files_free(&p->files);
    for (size_t i = 0; i < p->n_dial; i++) {
        free(p->dial[i].id);
        free(p->dial[i].address);
    }
    free(p->dial);
    pthread_mutex_destroy(&p->mu);
    free(p);
    grpc_shutdown();
}

bool drey_cluster__peers_dial_via(drey_cluster__peers *p, const char *spec, char *err, size_t err_cap) {
    for (const char *s = spec; *s != '\0';) {
        const char *end = strchr(s, ',');
        size_t len = end != NULL ? (size_t)(end - s) : strlen(s);
        const char *eq = memchr(s, '=', len);
        const char *colon = eq != NULL ? memrchr(eq, ':', len - (size_t)(eq - s)) : NULL;
        size_t id_len = eq != NULL ? (size_t)(eq - s) : 0;
        /* id=host:port, each part non-empty */
        if (eq == NULL || id_len == 0 || id_len >= DREY_CLUSTER_MAX_ID || colon == NULL || colon == eq + 1 ||
            colon == s + len - 1) {
            snprintf(err, err_cap, "--cluster-peer-address: '%.*s' is not ID=HOST:PORT", (int)len, s);
            return false;
        }
        p->dial = drey_xrealloc(p->dial, p->n_dial + 1, sizeof *p->dial);
        p->dial[p->n_dial].id = drey_xstrndup(s, id_len);
        p->dial[p->n_dial].address = drey_xstrndup(eq + 1, len - id_len - 1);
        p->n_dial++;
        s += len + (end != NULL);
    }
    return true;
}

static const char *dial_address(const drey_cluster__peers *p, const char *id, const char *advertised) {
    for (size_t i = 0; i < p->n_dial; i++) {
        if (strcmp(p->dial[i].id, id) == 0)
            return p->dial[i].address;
    }
    return advertised;
}

/* Reloads the credentials when a file changed; needs p->mu. */
static void check_files_locked(drey_cluster__peers *p) {
    int64_t now = drey_mono_ns();
    if (now - p->checked_ns < CHECK_FILES_NS)
        return;
    p->checked_ns = now;
    drey_pem_id ids[3];
    if (!drey_pem_files_changed(&p->files, ids))
        return;
    char err[256];
    grpc_channel_credentials *creds = load_creds(p, ids, err, sizeof err);
    if (creds == NULL) {
        DREY_LOG_WARN("peer certificates changed but do not load; keeping the previous ones",
                      DREY_LOG_STR("error", err));
        return;
    }
    grpc_channel_credentials_release(p->creds);
    p->creds = creds;
    drop_channels_locked(p, false);
    DREY_LOG_INFO("peer certificates reloaded");
}

static peer *peer_locked(drey_cluster__peers *p, const char *id, const char *address) {
    check_files_locked(p);
    address = dial_address(p, id, address);
    for (size_t i = 0; i < p->n; i++) {
        if (strcmp(p->peers[i]->id, id) == 0) {
            if (strcmp(p->peers[i]->address, address) == 0)
                return p->peers[i];
            /* The peer moved (a rescheduled pod): a new channel. */
            drop_peer_locked(p->peers[i], false);
            p->peers[i] = p->peers[--p->n];
            break;
        }
    }
    if (p->n == MAX_PEERS)
        drop_channels_locked(p, false);
    grpc_arg args[4];
    memset(args, 0, sizeof args);
    args[0].type = GRPC_ARG_STRING;
    args[0].key = GRPC_SSL_TARGET_NAME_OVERRIDE_ARG;
    args[0].value.string = (char *)id;
    /* A peer's answer is relayed as it came: no transparent retries. */
    args[1].type = GRPC_ARG_INTEGER;
    args[1].key = GRPC_ARG_ENABLE_RETRIES;
    args[1].value.integer = 0;
    args[2].type = GRPC_ARG_INTEGER;
    args[2].key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    args[2].value.integer = -1;
    /* A peer that restarts at the same address (a pod keeps its name) is
     * reached again within a second, not after gRPC's reconnect backoff
     * (up to 120 s; 17 s after a 25 s outage, measured): watches
     * re-subscribe, and forwarded calls stop failing, as soon as it is back. */
    args[3].type = GRPC_ARG_INTEGER;
    args[3].key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS;
    args[3].value.integer = 1000;
    grpc_channel_args cargs = {.num_args = 4, .args = args};
    peer *pe = drey_xcalloc(1, sizeof *pe);
    pe->id = drey_xstrdup(id);
    pe->address = drey_xstrdup(address);
    pe->channel = grpc_channel_create(address, p->creds, &cargs);
    p->peers[p->n++] = pe;
    return pe;
}

static pstream *stream_open_locked(drey_cluster__peers *p, peer *pe) {
    pstream *s = drey_xcalloc(1, sizeof *s);
    s->p = p;
    s->pe = pe;
    snprintf(s->peer_id, sizeof s->peer_id, "%s", pe->id);
    s->refs = 1; /* the peer's */
    s->start_tag.done = on_start;
    s->close_tag.done = on_closed;
    s->recv_tag.done = on_recv;
    s->send_tag.done = on_sent;
    s->status_tag.done = on_status;
    grpc_metadata_array_init(&s->initial_md);
    grpc_metadata_array_init(&s->trailing_md);
    s->details = grpc_empty_slice();
    grpc_slice method = grpc_slice_from_static_string(FORWARD_PATH);
    s->call = grpc_channel_create_call(pe->channel, NULL, GRPC_PROPAGATE_DEFAULTS, p->cq, method, NULL,
                                       gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    start_batch_locked(s, ops, 1, &s->start_tag);
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[0].data.recv_status_on_client.trailing_metadata = &s->trailing_md;
    ops[0].data.recv_status_on_client.status = &s->code;
    ops[0].data.recv_status_on_client.status_details = &s->details;
    start_batch_locked(s, ops, 1, &s->status_tag);
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[0].data.recv_initial_metadata.recv_initial_metadata = &s->initial_md;
    ops[1].op = GRPC_OP_RECV_MESSAGE;
    ops[1].data.recv_message.recv_message = &s->recv_buf;
    start_batch_locked(s, ops, 2, &s->recv_tag);
    pe->stream = s;
    s->next = p->streams;
    if (p->streams != NULL)
        p->streams->prev = s;
    p->streams = s;
    return s;
}

/* handle NULL: the handle is returned. Otherwise it is published there
 * (drey_cluster__peers_call_kept). */
static pcall *call_start(drey_cluster__peers *p, const char *id, const char *address, const char *path,
                         const uint8_t *request, size_t len, const drey_cluster__header *headers, size_t n_headers,
                         int64_t deadline_mono_ns, void (*done)(void *arg, const drey_answer *a), void *arg,
                         _Atomic(drey_cluster__pcall *) *handle) {
    pcall *c = drey_xmalloc(sizeof *c);
    memset(c, 0, sizeof *c);
    atomic_store(&c->refs, 2);
    c->p = p;
    c->done = done;
    c->arg = arg;
    c->deadline_ns = deadline_mono_ns;
    Drey__Internal__V1__Header hs[MAX_HEADERS], *hp[MAX_HEADERS];
    size_t n_md = n_headers < MAX_HEADERS ? n_headers : MAX_HEADERS;
    for (size_t i = 0; i < n_md; i++) {
        drey__internal__v1__header__init(&hs[i]);
        hs[i].key = (char *)headers[i].key;
        hs[i].value = (ProtobufCBinaryData){.len = headers[i].len, .data = (uint8_t *)headers[i].value};
        hp[i] = &hs[i];
    }
    Drey__Internal__V1__Call call = DREY__INTERNAL__V1__CALL__INIT;
    call.method = (char *)path;
    call.n_headers = n_md;
    call.headers = hp;
    if (deadline_mono_ns != INT64_MAX) {
        /* What is left, at least 1 us; gone already: -1, which the peer
         * refuses as DEADLINE_EXCEEDED. */
        int64_t left = deadline_mono_ns - drey_mono_ns();
        call.timeout_us = left > 0 ? (left + 999) / 1000 : -1;
    }
    call.request = (ProtobufCBinaryData){.len = len, .data = (uint8_t *)request};
    Drey__Internal__V1__Frame f = DREY__INTERNAL__V1__FRAME__INIT;
    f.body_case = DREY__INTERNAL__V1__FRAME__BODY_CALL;
    f.call = &call;

    pthread_mutex_lock(&p->mu);
    peer *pe = peer_locked(p, id, address);
    pcall *none = NULL;
    if (handle != NULL && !atomic_compare_exchange_strong(handle, &none, c)) {
        /* The caller gave up on it first: not sent, done says CANCELLED. */
        atomic_fetch_sub(&c->refs, 1); /* the handle's, never given out */
        finish_locked(p, c, GRPC_STATUS_CANCELLED);
        kick_locked(p, pe->channel);
        pthread_mutex_unlock(&p->mu);
        return NULL;
    }
    pstream *s = pe->stream != NULL ? pe->stream : stream_open_locked(p, pe);
    slot_put_locked(s, c);
    f.id = c->id;
    append_locked(s, &f);
    if (s->writing || s->write_deferred) {
        /* goes with the write in flight's successor, or the batch's */
    } else if (drey_pipeline_batch_defer(write_later, s)) {
        /* the caller's batch (a Pipeline message's operations) queues more:
         * they go in one message at its end */
        s->write_deferred = true;
        s->refs++;
    } else {
        write_locked(s);
    }
    kick_locked(p, pe->channel);
    pthread_mutex_unlock(&p->mu);
    return c;
}

drey_cluster__pcall *drey_cluster__peers_call(drey_cluster__peers *p, const char *id, const char *address,
                                              const char *path, const uint8_t *request, size_t len,
                                              const drey_cluster__header *headers, size_t n_headers,
                                              int64_t deadline_mono_ns, void (*done)(void *arg, const drey_answer *a),
                                              void *arg) {
    return call_start(p, id, address, path, request, len, headers, n_headers, deadline_mono_ns, done, arg, NULL);
}

void drey_cluster__peers_call_kept(drey_cluster__peers *p, const char *id, const char *address, const char *path,
                                   const uint8_t *request, size_t len, const drey_cluster__header *headers,
                                   size_t n_headers, int64_t deadline_mono_ns,
                                   void (*done)(void *arg, const drey_answer *a), void *arg,
                                   _Atomic(drey_cluster__pcall *) *handle) {
    call_start(p, id, address, path, request, len, headers, n_headers, deadline_mono_ns, done, arg, handle);
}

struct grpc_call *drey_cluster__peers_new_call(drey_cluster__peers *p, const char *id, const char *address,
                                               const char *path, struct grpc_completion_queue *cq) {
    pthread_mutex_lock(&p->mu);
    peer *pe = peer_locked(p, id, address);
    /* The call holds the channel: a rotation that replaces it meanwhile
     * does not end the call. */
    grpc_slice method = grpc_slice_from_static_string(path);
    grpc_call *call = grpc_channel_create_call(pe->channel, NULL, GRPC_PROPAGATE_DEFAULTS, cq, method, NULL,
                                               gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    pthread_mutex_unlock(&p->mu);
    return call;
}

void drey_cluster__pcall_cancel(drey_cluster__pcall *c) {
    drey_cluster__peers *p = c->p;
    pthread_mutex_lock(&p->mu);
    pstream *s = c->s;
    if (s != NULL) {
        send_cancel_locked(s, c->id); /* before a retiring stream closes */
        slot_take_locked(c);
        finish_locked(p, c, GRPC_STATUS_CANCELLED);
    }
    pthread_mutex_unlock(&p->mu);
    pcall_unref(c);
}

void drey_cluster__pcall_release(drey_cluster__pcall *c) {
    pcall_unref(c);
}

void drey_cluster__answer_reason(const drey_answer *a, char *out, size_t cap) {
    out[0] = '\0';
    if (a->code == GRPC_STATUS_OK || a->details == NULL)
        return;
    Google__Rpc__Status *st = google__rpc__status__unpack(NULL, a->details_len, a->details);
    for (size_t i = 0; st != NULL && i < st->n_details && out[0] == '\0'; i++) {
        const Google__Protobuf__Any *any = st->details[i];
        if (strcmp(any->type_url, "type.googleapis.com/google.rpc.ErrorInfo") != 0)
            continue;
        Google__Rpc__ErrorInfo *ei = google__rpc__error_info__unpack(NULL, any->value.len, any->value.data);
        if (ei != NULL)
            snprintf(out, cap, "%s", ei->reason);
        if (ei != NULL)
            google__rpc__error_info__free_unpacked(ei, NULL);
    }
    if (st != NULL)
        google__rpc__status__free_unpacked(st, NULL);
}
