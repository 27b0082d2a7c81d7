/*
 * router — the chain's route row (router.c): run here, forward once, or
 * refuse; and what the rows that split a request (gather.c, fanout.c)
 * share with it.
 */
#ifndef DREY_CLUSTER_ROUTER_H
#define DREY_CLUSTER_ROUTER_H

#include "internal.h"
#include "peers.h"

/* The owner of p when a call may go to it: 1 this node, 0 another (*node),
 * -1 refused (*refusal, r->status set), DREY_CLUSTER_OWNER_AWAIT (only when
 * may_await: a forwarded call from a newer table than this node's),
 * DREY_CLUSTER_OWNER_HOLD (only when may_await: this node was just promoted
 * and serves once the lease it granted ran out, within the call's
 * deadline: r->status says when, should the call not wait). */
#define DREY_CLUSTER_OWNER_AWAIT 2
#define DREY_CLUSTER_OWNER_HOLD 3
int drey_cluster__owner(drey_cluster *c, drey_request *r, const drey_cluster__topology *t, uint32_t p,
                        const drey_cluster__node **node, drey_stage_result *refusal, bool may_await);

/* The epoch a forwarding node's table had for the request's partition
 * (drey-epoch); 0: none. */
int64_t drey_cluster__forwarded_epoch(drey_request *r);
/* UNAVAILABLE e (PARTITION_UNAVAILABLE, LEASE_EXPIRED) for partition p,
 * typed for a client: ErrorInfo names the partition, its primary, the
 * cause (OWNER_UNREACHABLE, LEASE_EXPIRED, FAILOVER_IN_PROGRESS) and the
 * outcome (not_applied, or unknown when the call may have reached a
 * journal), with a RetryInfo; counted (drey_cluster_unavailable_total). */
drey_status *drey_cluster__unavailable(drey_cluster *c, drey_request *r, uint32_t p, drey_error e, const char *cause,
                                       const char *primary, bool maybe_applied);
/* PARTITION_UNAVAILABLE OWNER_UNREACHABLE for a call to primary that the
 * transport failed (a: its answer, whose message is kept as `transport`). */
drey_status *drey_cluster__unreachable(drey_cluster *c, drey_request *r, uint32_t p, const char *primary,
                                       const drey_answer *a, bool maybe_applied);

/* Whether a read that allows it may be answered from this node's backup
 * copy of p (in sync, not broken, once known current), and how stale it
 * may be. */
bool drey_cluster__stale_copy(drey_cluster *c, const drey_cluster__topology *t, uint32_t p, uint64_t *lag_ms);

/* A backup of p that is a member, other than this node, for a read whose
 * primary is gone; NULL: none. */
const drey_cluster__node *drey_cluster__live_backup(const drey_cluster__topology *t, uint32_t p);

/* A read of msg (r's, or a part of it) answered from this node's store in
 * the route row; NULL with r->status set when it fails. */
ProtobufCMessage *drey_cluster__read_here(drey_request *r, const ProtobufCMessage *msg);

/* DREY_ROUTE_KEYS: scatter to the owners, gather in order (gather.c). */
/* *hold_ns > 0 (with DREY_STAGE_PARKED, nothing sent): a key's partition was
 * just promoted here and may be served after that wait (may_await). */
drey_stage_result drey_cluster__route_keys(drey_cluster *c, drey_request *r, const drey_cluster__topology *t,
                                          bool may_await, int64_t *hold_ns);


/* Scan, Clear, ListCaches, GetCacheStats: every node's share (fanout.c). */
drey_stage_result drey_cluster__route_cache_wide(drey_cluster *c, drey_request *r, drey_cluster__topology *t);


/* The metadata of a call to another node: the caller's token, this node's
 * id, the partition's epoch (0: none); h holds 3 (owner.c). */
size_t drey_cluster__forward_headers(drey_cluster *c, drey_request *r, int64_t epoch, drey_cluster__header *h);

/* A scan's share names the owners' hash it began with. */
#define DREY_SCAN_OWNERS "drey-scan-owners"


#endif
