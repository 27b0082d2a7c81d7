/*
 * server — the gRPC C-core runtime: listener, completion queues, calls.
 *
 * A pure transport: methods are registered by path with a request type and
 * unary or streaming callbacks; every method becomes a grpc core registered
 * method, so the hot path never parses a path string. It decodes requests
 * (with a nesting-depth guard protobuf-c lacks), carries metadata, deadlines
 * and cancellation, and encodes replies and google.rpc.Status failures. What
 * a request means is the caller's business (src/pipeline).
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

/* A method served by path. Unary methods get their decoded request once and
 * must answer it with drey_call_reply() or drey_call_fail(), from any
 * thread, even if the call was cancelled meanwhile. Streaming methods get
 * each request message, then the client's half-close (request NULL); they
 * send with drey_call_send() and end with drey_call_finish(); on_done runs
 * when the call is over (finished or cancelled), after which the handler
 * must not touch the call again. */
typedef struct drey_server_method {
    const char *path;                        /* "/pkg.Service/Method" */
    const ProtobufCMessageDescriptor *input; /* the request type */
    bool client_streaming, server_streaming;
    /* Streaming: messages queued while a send is in flight go out as one
     * message, their bytes concatenated. For a message made of one repeated
     * field that is the message holding all their elements (the peer
     * stream batches its answers so). */
    bool concatenate_sends;
    void (*unary)(void *ctx, drey_call *call, const ProtobufCMessage *request);
    void (*on_message)(void *ctx, drey_call *call, const ProtobufCMessage *request);
    void (*on_done)(void *ctx, drey_call *call);
    /* Streaming, optional: every message queued so far has been handed to
     * the transport (HTTP/2 flow control let it go). A handler that must
     * not queue without bound for a client that does not read sends a few
     * messages, then more from here. Runs on a completion-queue thread,
     * never after on_done. */
    void (*on_sent)(void *ctx, drey_call *call);
    void *ctx;
} drey_server_method;

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

/* Registers a method before the server starts. A method without the
 * callbacks of its kind, or a path registered twice, is a programming error
 * reported as false. */
bool drey_server_add_method(drey_server *s, const drey_server_method *m);

/* Called for every call of a registered method as its status is sent: the
 * method's index (registration order), the gRPC status code and the time
 * since it arrived. */
typedef void (*drey_call_observer_fn)(void *ctx, size_t method, int code, int64_t duration_ns);
void drey_server_set_call_observer(drey_server *s, drey_call_observer_fn fn, void *ctx);

/* Binds and starts serving; returns the bound port, or 0 with a message
 * (naming the cause, e.g. the address is in use) written to err_buf. */
int drey_server_start(drey_server *s, char *err_buf, size_t err_cap);

/* Stops accepting calls, lets in-flight calls finish for up to timeout_ms,
 * cancels what is left, then stops the workers. */
void drey_server_shutdown(drey_server *s, int64_t timeout_ms);
void drey_server_destroy(drey_server *s);

/* Registered methods' paths, by index. */
size_t drey_server_method_count(const drey_server *s);
const char *drey_server_method_path(const drey_server *s, size_t i);

/* --- calls ---------------------------------------------------------------- */

drey_arena *drey_call_arena(drey_call *c);
/* The raw request message a unary call received. */
void drey_call_request_bytes(const drey_call *c, const uint8_t **data, size_t *len);
/* A request metadata value by lowercase key; NULL if absent. The value is
 * not NUL-terminated. */
const char *drey_call_metadata(const drey_call *c, const char *key, size_t *len);
/* "conn:<n>": one number per client HTTP/2 connection, stable for its life,
 * never reused within the process. */
const char *drey_call_connection(drey_call *c);

/* Unary calls: fn runs at most once, if the client cancels (or the deadline
 * passes) before the handler answered, on the completion-queue thread; never
 * once drey_call_reply() or drey_call_fail() has begun. The handler must
 * still answer. */
void drey_call_on_cancel(drey_call *c, void (*fn)(void *arg), void *arg);
/* The call's deadline on the monotonic clock (ns); INT64_MAX without one. */
int64_t drey_call_deadline_mono_ns(const drey_call *c);

void drey_call_set_user(drey_call *c, void *user);
void *drey_call_user(const drey_call *c);

/* Whether the client proved (mutual TLS, verified against the listener's
 * client CA) a certificate whose subject alternative name or common name
 * is id. Always false on a listener without client certificates. */
bool drey_call_peer_is(drey_call *c, const char *id, size_t len);

/* Unary: send the response and OK. Exactly one of reply/fail/relay per call. */
void drey_call_reply(drey_call *c, const ProtobufCMessage *response);
void drey_call_fail(drey_call *c, const drey_status *st);

/* Unary: answer with another server's answer as it came (a forwarded
 * call's): the serialized response for OK, else the code, message and the
 * google.rpc.Status bytes unchanged. The buffers are copied. */
typedef struct drey_call_answer {
    int code; /* grpc_status_code */
    const char *message;
    size_t message_len;
    const uint8_t *details; /* grpc-status-details-bin; NULL: none */
    size_t details_len;
    const uint8_t *response; /* code OK only */
    size_t response_len;
    /* A client's: the call never left (no connection to the server was
     * ever made for it), so the server did nothing of it. */
    bool unsent;
} drey_call_answer;
void drey_call_relay(drey_call *c, const drey_call_answer *a);

/* Streaming: queue a message (false once the call is over). */
bool drey_call_send(drey_call *c, const ProtobufCMessage *message);
/* Streaming: queue a message already serialized (a stream that batches
 * several into one, as the peer stream does). The bytes are copied. */
bool drey_call_send_bytes(drey_call *c, const uint8_t *data, size_t len);
/* Streaming: end the call after the queued messages; st NULL means OK. */
void drey_call_finish(drey_call *c, const drey_status *st);
/* Streaming: end the call after the queued messages with another server's
 * status as it came (its code, message and google.rpc.Status bytes, as
 * drey_call_relay; a is copied). */
void drey_call_finish_relay(drey_call *c, const drey_call_answer *a);

/* Client streaming flow control: after drey_call_pause_reading() no further
 * message is read once the current on_message returns (HTTP/2 flow control
 * then holds the client back) until drey_call_resume_reading(). Either may
 * be called from any thread while the call is not over (before on_done). */
void drey_call_pause_reading(drey_call *c);
void drey_call_resume_reading(drey_call *c);

#endif
