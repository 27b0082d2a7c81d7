/*
 * internal — what the etcd client's files share: the client, its thread's
 * tags and timers, and the streams the thread drives.
 */
#ifndef DREY_ETCD_INTERNAL_H
#define DREY_ETCD_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <grpc/grpc.h>

#include "drey/etcd.h"

#define DREY_ETCD__MAX_ENDPOINTS 16

/* Methods, indexes into each endpoint's registered call handles. */
enum {
    DREY_ETCD__RANGE,
    DREY_ETCD__PUT,
    DREY_ETCD__DELETE_RANGE,
    DREY_ETCD__TXN,
    DREY_ETCD__LEASE_GRANT,
    DREY_ETCD__LEASE_REVOKE,
    DREY_ETCD__LEASE_KEEPALIVE,
    DREY_ETCD__WATCH,
    DREY_ETCD__AUTHENTICATE,
    DREY_ETCD__N_METHODS
};

/* What the thread does with a completion: every tag on the queue starts
 * with one of these. */
typedef struct drey_etcd__tag drey_etcd__tag;
struct drey_etcd__tag {
    void (*done)(drey_etcd *e, drey_etcd__tag *t, bool ok);
};

typedef struct drey_etcd__endpoint {
    char target[128]; /* "host:port" */
    bool tls;         /* https:// */
    grpc_channel *channel;
    void *methods[DREY_ETCD__N_METHODS];
} drey_etcd__endpoint;

/* A stream the thread drives (a watch or a keepalive): one bidirectional
 * call at a time, opened again on another endpoint when it breaks. The
 * thread alone touches its gRPC state; user threads touch only what e->mu
 * guards. */
typedef struct drey_etcd__stream drey_etcd__stream;
struct drey_etcd__stream {
    drey_etcd__stream *next; /* e->streams (thread) or e->incoming (under mu) */
    drey_etcd *e;
    /* Called by the thread: start (the stream was just handed over, ep is
     * the endpoint to try), a timer that came due, a received message in
     * recv (NULL, or ok false: no more), the current call's end once its
     * status has come and nothing of it is in flight (the call is freed by
     * then), and release (nothing in flight after closing: free what the
     * stream owns, not the stream). A close request cancels the call. */
    void (*on_start)(drey_etcd__stream *s);
    void (*on_timer)(drey_etcd__stream *s);
    void (*on_recv)(drey_etcd__stream *s, bool ok);
    void (*on_call_end)(drey_etcd__stream *s, grpc_status_code code, const char *message);
    void (*on_release)(drey_etcd__stream *s);
    int64_t timer_ns; /* monotonic; 0: none (thread) */
    int pending;      /* batches in flight (thread) */
    bool closing;     /* the close request was seen (thread) */

    /* The current call and what its batches fill in (the thread's). */
    size_t ep;         /* the endpoint of the current call, or of the next */
    grpc_call *call;   /* NULL between calls */
    grpc_byte_buffer *send, *recv;
    grpc_metadata md[2]; /* hasleader, and the token when etcd wants one */
    size_t n_md;
    uint64_t token_gen;  /* of the token the call was opened with */
    grpc_metadata_array initial_md, trailing_md;
    grpc_status_code code;
    grpc_slice details;
    bool status_received; /* the call's status is in code and details */
    bool headers_sent;    /* the call's first send carried its metadata */
    bool headers_asked;   /* the call's first receive took the server's */
    int64_t backoff_ns;   /* before the next call after a broken one */
    drey_etcd__tag send_tag, recv_tag, status_tag;

    /* Under e->mu. */
    bool close_requested;
    bool released;      /* the thread is done with it: the closer may free it */
    bool free_on_release; /* closed from a callback: the thread frees it */
};

struct drey_etcd {
    drey_etcd__endpoint endpoints[DREY_ETCD__MAX_ENDPOINTS];
    size_t n_endpoints;
    int64_t connect_timeout_ms;
    _Atomic size_t current; /* the endpoint calls try first */

    grpc_completion_queue *cq; /* next-type, polled by the thread */
    pthread_t thread;

    pthread_mutex_t mu;
    pthread_cond_t cv;           /* a stream was released */
    drey_etcd__stream *incoming; /* started, not yet seen by the thread */
    bool wake_pending;           /* a wake tag is on the queue */
    bool stopping;
    drey_etcd__tag wake_tag;

    drey_etcd__stream *streams; /* the thread's */

    /* Authentication (auth.c); user NULL: none. */
    char *user, *password_file;
    pthread_mutex_t auth_mu;
    pthread_cond_t auth_cv;
    char *token;            /* the token in force; NULL: none yet */
    uint64_t token_gen;     /* tokens fetched so far */
    bool refresh_wanted;    /* a stream was refused: the refresher fetches one */
    bool auth_stopping;
    pthread_t auth_thread;
    bool auth_thread_running;
};

/* --- authentication (auth.c) ------------------------------------------------ */

/* Starts the refresher (with a user configured). */
void drey_etcd__auth_start(drey_etcd *e);
void drey_etcd__auth_stop(drey_etcd *e);
/* The token metadata of a call: fills md with "token" (a copied slice, the
 * caller unrefs it) when there is one; returns how many entries (0 or 1).
 * md NULL: only whether there is one. */
size_t drey_etcd__token_md(drey_etcd *e, grpc_metadata *md, uint64_t *gen);
/* A stream was refused UNAUTHENTICATED with the token of generation gen:
 * the refresher fetches a new one (once per generation). */
void drey_etcd__token_stale(drey_etcd *e, uint64_t gen);
/* Fetches a token (the calling thread; not the client's) unless one newer
 * than gen exists. */
grpc_status_code drey_etcd__authenticate(drey_etcd *e, uint64_t gen, int64_t deadline_ns, drey_etcd_status *st);

/* A unary call without the token (Authenticate itself). */
grpc_status_code drey_etcd__unary_plain(drey_etcd *e, int method, const ProtobufCMessage *req,
                                        const ProtobufCMessageDescriptor *resp_type, bool idempotent,
                                        int64_t timeout_ms, drey_arena *arena, ProtobufCMessage **resp,
                                        drey_etcd_status *st);

/* --- TLS (tls.c) ----------------------------------------------------------------- */

/* Credentials for https:// endpoints from the files (re-read when they
 * change); NULL with err when they are unusable. */
grpc_channel_credentials *drey_etcd__tls_credentials(const drey_etcd_tls *tls, char *err, size_t cap);

/* True on the client's thread (inside a callback). */
bool drey_etcd__on_thread(const drey_etcd *e);

/* Hands s (its callbacks set) to the thread, which calls on_start. */
void drey_etcd__stream_add(drey_etcd *e, drey_etcd__stream *s);

/* Asks the thread to close s and waits until it has (or, on the thread,
 * marks s to be freed by the thread). Returns true when the caller must free
 * s (after which no callback can come), false when the thread will. */
bool drey_etcd__stream_close(drey_etcd__stream *s);

/* Whether the thread may still call s's user callbacks: false once a close
 * was asked for. A closer from another thread waits for the thread to
 * release s, which it does only between callbacks, so no callback runs
 * after close returns. */
bool drey_etcd__may_call_back(drey_etcd__stream *s);

/* --- stream.c: a stream's calls, on the thread --------------------------- */

/* Sets s's tags and hooks (the members of the same names), before
 * drey_etcd__stream_add. */
void drey_etcd__stream_init(drey_etcd__stream *s, void (*on_start)(drey_etcd__stream *s),
                            void (*on_timer)(drey_etcd__stream *s), void (*on_recv)(drey_etcd__stream *s, bool ok),
                            void (*on_call_end)(drey_etcd__stream *s, grpc_status_code code, const char *message),
                            void (*on_release)(drey_etcd__stream *s));

/* Opens a call of method on endpoint s->ep, with its status batch. */
void drey_etcd__call_open(drey_etcd__stream *s, int method);
/* Sends msg on the call (the call's metadata with the first); on a refusal
 * nothing is in flight and the status will say why. */
void drey_etcd__call_send(drey_etcd__stream *s, const ProtobufCMessage *msg);
/* Asks for the next message into s->recv (the server's metadata with the
 * first). */
void drey_etcd__call_recv(drey_etcd__stream *s);
/* Cancels the call, if there is one (its status follows). */
void drey_etcd__call_cancel(drey_etcd__stream *s);
/* Ends the call if its status has come and nothing is in flight: frees it
 * and calls on_call_end. */
void drey_etcd__call_maybe_end(drey_etcd__stream *s);
/* After a broken call: moves s->ep to the next endpoint and returns when to
 * open the next call (now + the backoff, which doubles up to max_ns). */
int64_t drey_etcd__call_retry_at(drey_etcd__stream *s, int64_t max_ns);


/* Unary call with the retry rules of etcd.h. */
grpc_status_code drey_etcd__unary(drey_etcd *e, int method, const ProtobufCMessage *req,
                                  const ProtobufCMessageDescriptor *resp_type, bool idempotent, int64_t timeout_ms,
                                  drey_arena *arena, ProtobufCMessage **resp, drey_etcd_status *st);

void drey_etcd__status_set(drey_etcd_status *st, grpc_status_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
