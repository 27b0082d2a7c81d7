/*
 * peers — calls to other nodes' internal listeners (peers.c): one channel
 * per node, with mutual TLS checked against its id; unary calls as frames
 * of one stream per node pair.
 */
#ifndef DREY_CLUSTER_PEERS_H
#define DREY_CLUSTER_PEERS_H

#include "internal.h"

/* The peer certificates: the chain must name node_id (its SAN or CN), as
 * every peer checks; NULL with a message in err when not, or when the
 * files do not load. */
drey_cluster__peers *drey_cluster__peers_create(const char *node_id, const char *cert, const char *key, const char *ca,
                                                char *err, size_t err_cap);
void drey_cluster__peers_destroy(drey_cluster__peers *p);
/* --cluster-peer-address: "id=host:port[,id=host:port...]", each peer id
 * dialled at its address instead of the one it advertises; before the
 * first call. false with a message in err if spec is malformed. */
bool drey_cluster__peers_dial_via(drey_cluster__peers *p, const char *spec, char *err, size_t err_cap);

typedef drey_request_header drey_cluster__header;

/* A call in flight, for cancelling it. */
typedef struct drey_cluster__pcall drey_cluster__pcall;

/* A unary call of path on node id at address, with the serialized request
 * and headers; done runs once, on the peers' thread, with the answer (whose
 * buffers live until done returns). The returned handle holds a reference:
 * drop it with drey_cluster__pcall_cancel or drey_cluster__pcall_release,
 * once, from any thread (done may have run already or not). */
drey_cluster__pcall *drey_cluster__peers_call(drey_cluster__peers *p, const char *id, const char *address, const char *path,
                              const uint8_t *request, size_t len, const drey_cluster__header *headers,
                              size_t n_headers, int64_t deadline_mono_ns,
                              void (*done)(void *arg, const drey_answer *a), void *arg);
/* The same for a caller whose done may free the memory that keeps the
 * handle (a forwarded request's): the handle is published in *handle
 * before done can run, so the caller touches nothing of its own after
 * sending. When *handle is not NULL by then (a mark: the caller gave up on
 * the call), nothing is sent and done runs with CANCELLED; that handle is
 * never given out. */
void drey_cluster__peers_call_kept(drey_cluster__peers *p, const char *id, const char *address, const char *path,
                                   const uint8_t *request, size_t len, const drey_cluster__header *headers,
                                   size_t n_headers, int64_t deadline_mono_ns,
                                   void (*done)(void *arg, const drey_answer *a), void *arg,
                                   _Atomic(drey_cluster__pcall *) *handle);
/* A call of path to node id that its caller runs itself on cq (a watch's
 * subscription: a server stream of its own, subscribe.c), on the peer's
 * channel (made if need be): same credentials, same identity check. */
struct grpc_call;
struct grpc_completion_queue;
struct grpc_call *drey_cluster__peers_new_call(drey_cluster__peers *p, const char *id, const char *address,
                                               const char *path, struct grpc_completion_queue *cq);

/* Cancels the call (its done comes with CANCELLED unless it is over) and
 * drops the handle. */
void drey_cluster__pcall_cancel(drey_cluster__pcall *c);
void drey_cluster__pcall_release(drey_cluster__pcall *c);

/* The ErrorInfo reason of a peer's answer into out ("" for none). */
void drey_cluster__answer_reason(const drey_answer *a, char *out, size_t cap);

#endif
