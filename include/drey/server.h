/*
 * server — the gRPC C-core runtime: listener, completion queues, calls.
 *
 * Services are registered from their protobuf-c service descriptors with a
 * table of handlers matched by method name; every method becomes a grpc core
 * registered method, so the hot path never parses a path string. The
 * streaming kind of each method comes from the built-in descriptor set.
 *
 * Threads: one completion queue per worker thread. A call's events are
 * delivered on the queue that accepted it, but drey_call_reply(),
 * drey_call_send() and drey_call_finish() may be called from any thread (the
 * journal writer completes writes after fsync).
 *
 * This is the only module that includes grpc/grpc.h for serving: the C core
 * API has no compatibility promise across releases.
 */
#ifndef DREY_SERVER_H
#define DREY_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "drey/arena.h"
#include "drey/status.h"

typedef struct drey_server drey_server;
typedef struct drey_call drey_call;
typedef struct drey_method drey_method;

/* Handler flags the request chain reads (which stages apply). */
enum {
    DREY_HANDLER_READ = 1u << 0,   /* reads the store */
    DREY_HANDLER_WRITE = 1u << 1,  /* mutates the store: memory admission, journal */
    DREY_HANDLER_SYSTEM = 1u << 2, /* health, reflection: answer without a token, under overload */
    DREY_HANDLER_ADMIN = 1u << 3,  /* operator actions: authenticated and admitted, no store access */
};

/* What a write's state transition gets: the time it happens at (the
 * journal record's, on replay) and where its response is built. */
typedef struct drey_apply {
    int64_t now_ms;      /* wall-clock milliseconds */
    drey_arena *arena;   /* response memory */
    drey_status *status; /* set when the transition fails */
} drey_apply;

typedef struct drey_handler {
    const char *name; /* the method's name in the service descriptor */
    unsigned flags;
    /* Write methods (DREY_HANDLER_WRITE): a deterministic state transition.
     * The request chain runs it after the journal append and recovery runs it
     * again on replay, so it may depend only on the store, the request and
     * ax->now_ms. Returns the response, or NULL with ax->status set. */
    ProtobufCMessage *(*apply)(void *service_ctx, drey_apply *ax, const ProtobufCMessage *request);
    /* Write methods that can grow memory: the bytes the write would add to
     * the store's accounting (new size - old size) if applied now. */
    int64_t (*growth)(void *service_ctx, const ProtobufCMessage *request, int64_t now_ms);
    /* Other unary methods: called once with the decoded request. The handler must
     * eventually call drey_call_reply() or drey_call_fail(), from any thread,
     * even if the call was cancelled meanwhile. */
    void (*unary)(drey_call *call, const ProtobufCMessage *request);
    /* Streaming methods: each request message, then the client's half-close
     * (request NULL). The handler sends with drey_call_send() and ends the
     * call with drey_call_finish(). */
    void (*on_message)(drey_call *call, const ProtobufCMessage *request);
    /* Streaming methods: the call is over (finished or cancelled). After it
     * returns the handler must not touch the call again. */
    void (*on_done)(drey_call *call);
} drey_handler;

struct drey_method {
    const char *path;                      /* "/drey.cache.v1.Cache/Get" */
    const char *service;                   /* "drey.cache.v1.Cache" */
    const ProtobufCMethodDescriptor *desc; /* name, input and output types */
    const drey_handler *handler;
    void *service_ctx;                     /* given to drey_server_add_service */
    bool client_streaming, server_streaming;
    size_t index;                          /* dense, for per-method metrics */
};

/* Runs a decoded unary request: the request chain. Defaults to calling the
 * handler directly (apply at the current time for write methods). */
typedef void (*drey_dispatch_fn)(void *ctx, drey_call *call, const ProtobufCMessage *request);

typedef struct drey_server_options {
    const char *listen;           /* host:port */
    size_t workers;               /* completion queues and threads; >= 1 */
    int64_t max_recv_message_bytes;
    /* TLS when tls_cert is set: PEM certificate chain and key; with
     * tls_client_ca, clients must present a certificate it signed (mTLS).
     * The files are re-read when they change (no restart). */
    const char *tls_cert, *tls_key, *tls_client_ca;
} drey_server_options;

drey_server *drey_server_create(const drey_server_options *opts);

/* Registers every method of the service. Each descriptor method must have a
 * handler of the right kind, and every handler a method: a mismatch is a
 * programming error reported as false before the server starts. */
bool drey_server_add_service(drey_server *s, const ProtobufCServiceDescriptor *sd, const drey_handler *handlers,
                             size_t n_handlers, void *service_ctx);

void drey_server_set_dispatch(drey_server *s, drey_dispatch_fn fn, void *ctx);

/* Called for every call of a registered method as its status is sent: the
 * method's index, the gRPC status code and the time since it arrived. */
typedef void (*drey_call_observer_fn)(void *ctx, size_t method, int code, int64_t duration_ns);
void drey_server_set_call_observer(drey_server *s, drey_call_observer_fn fn, void *ctx);

/* Binds and starts serving; returns the bound port, or 0 with a message
 * (naming the cause, e.g. the address is in use) written to err_buf. */
int drey_server_start(drey_server *s, char *err_buf, size_t err_cap);

/* Stops accepting calls, lets in-flight calls finish for up to timeout_ms,
 * cancels what is left, then stops the workers. */
void drey_server_shutdown(drey_server *s, int64_t timeout_ms);
void drey_server_destroy(drey_server *s);

/* The method registered at path ("/pkg.Service/Method"), or NULL. */
const drey_method *drey_server_find_method(const drey_server *s, const char *path);
size_t drey_server_method_count(const drey_server *s);
const drey_method *drey_server_method(const drey_server *s, size_t i);

/* --- calls ---------------------------------------------------------------- */

const drey_method *drey_call_method(const drey_call *c);
void *drey_call_service_ctx(const drey_call *c);
drey_arena *drey_call_arena(drey_call *c);
/* The raw request message a unary call received (for the journal). */
void drey_call_request_bytes(const drey_call *c, const uint8_t **data, size_t *len);
/* A request metadata value by lowercase key; NULL if absent. The value is
 * not NUL-terminated. */
const char *drey_call_metadata(const drey_call *c, const char *key, size_t *len);
/* "conn:<n>": one number per client HTTP/2 connection, stable for its life,
 * never reused within the process. */
const char *drey_call_connection(drey_call *c);

/* Unary calls: fn runs once, when the reply or failure is issued (before it
 * is sent), from the replying thread. */
void drey_call_on_finish(drey_call *c, void (*fn)(void *arg), void *arg);
/* Unary calls: fn runs once if the client cancels (or the deadline passes)
 * before the handler replied, on the completion-queue thread. The handler
 * must still reply. */
void drey_call_on_cancel(drey_call *c, void (*fn)(void *arg), void *arg);
/* The call's deadline on the monotonic clock (ns); INT64_MAX without one. */
int64_t drey_call_deadline_mono_ns(const drey_call *c);

void drey_call_set_user(drey_call *c, void *user);
void *drey_call_user(const drey_call *c);

/* Runs the method's handler: apply (at now_ms) and reply for write methods,
 * the unary handler otherwise. The request chain's last stage. */
void drey_call_run(drey_call *c, const ProtobufCMessage *request, int64_t now_ms);

/* Unary: send the response and OK. Exactly one of reply/fail per call. */
void drey_call_reply(drey_call *c, const ProtobufCMessage *response);
void drey_call_fail(drey_call *c, const drey_status *st);

/* Streaming: queue a message (false once the call is over). */
bool drey_call_send(drey_call *c, const ProtobufCMessage *message);
/* Streaming: end the call after the queued messages; st NULL means OK. */
void drey_call_finish(drey_call *c, const drey_status *st);

#endif
