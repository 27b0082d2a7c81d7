/*
 * room — what a primary admits for its backups, and whether its lease lets
 * it lead: the arithmetic, as pure functions of numbers read at one moment,
 * so the rules are tested without peers or etcd (tests/unit/cluster/room_test.c).
 *
 * A backup reports its journal and memory room with every acknowledgement
 * and heartbeat. The primary refuses a write that would not fit in what the
 * backup last said, less what was sent to it since, before anything is
 * journaled anywhere: a refusal the backup would make anyway, made where it
 * leaves no trace. A backup not heard lately with nothing in flight to it
 * gets the next write as a probe: if it has no room it refuses it and is
 * taken out of the in-sync set, as one never heard is.
 */
#ifndef DREY_CLUSTER_ROOM_H
#define DREY_CLUSTER_ROOM_H

#include <stdbool.h>
#include <stdint.h>

#include "drey/status.h"

/* How long a backup's report stays good. */
#define DREY_CLUSTER_ROOM_FRESH_NS 1000000000LL

/* One backup's room as the primary knows it. */
typedef struct drey_cluster__room_seen {
    uint64_t journal;      /* frame bytes; UINT64_MAX: no quota (or not heard) */
    uint64_t sent_journal; /* sent since, not yet answered */
    int64_t memory;        /* accounted bytes; INT64_MAX: not heard */
    int64_t sent_memory;
    int64_t since_heard_ns; /* since the last report */
} drey_cluster__room_seen;

/* The memory still free on the backup; INT64_MAX when its report is not
 * fresh (a probe goes through). */
int64_t drey_cluster__room_memory_left(const drey_cluster__room_seen *s);

/* NONE, or why a write needing journal_need journal bytes and memory_need
 * memory bytes (a write that shrinks needs none) does not fit on the
 * backup: JOURNAL_DISK_QUOTA or MEMORY_PRESSURE, with what is left in
 * *have. */
drey_error drey_cluster__room_verdict(const drey_cluster__room_seen *s, uint64_t journal_need, int64_t memory_need,
                                      uint64_t *have);

/* Whether a lease etcd confirmed valid until valid_until_ns (0: none)
 * still lets this node lead at now_ns. The margin ends leading before etcd
 * could expire the lease, so a node paused or cut off stops before another
 * is promoted (clocks run at different rates; etcd's TTL counts from when
 * it took the renewal, this node's from when it sent it). */
bool drey_cluster__lease_holds(int64_t valid_until_ns, int64_t margin_ns, int64_t now_ns);

/* And a table at revision, read by a node whose registration is at
 * registered: a table older than the registration may still name what
 * this node's previous life held. */
bool drey_cluster__may_lead_at(bool lease_holds, int64_t revision, int64_t registered);

/* Leases from the backups (PacificA's): a backup's answer to a heartbeat
 * sent at sent_ns grants the primary the partition until sent_ns + the
 * lease, less the margin, by the primary's clock; the backup noted the
 * grant when it took the heartbeat, later. While every in-sync backup's
 * grant holds, the primary leads without etcd: none of them can be
 * promoted before its own grant ran out (below). With no in-sync backup
 * nobody can be promoted at all. */
int64_t drey_cluster__grant_until(int64_t sent_ns, int64_t lease_ns, int64_t margin_ns);
bool drey_cluster__backups_grant(const int64_t *until_ns, size_t n, int64_t now_ns);

/* A backup promoted while its primary may still hold the lease it granted
 * (granted_ns: when it last did; 0: never, or released) serves only from
 * the returned time on (0: at once): the lease, plus the margin, after
 * that grant. */
int64_t drey_cluster__serve_from(int64_t granted_ns, int64_t lease_ns, int64_t margin_ns);

/* The last lease a backup granted for a partition: when, at which epoch
 * (the heartbeat mark's), to whom (the primary's id, hashed). */
typedef struct drey_cluster__grant {
    int64_t at_ns;
    int64_t epoch;
    uint64_t to;
} drey_cluster__grant;

/* A release from node `from` (hashed), which leads the partition no more
 * after `epoch` (it handed it over, or it is leaving): it voids the grant
 * only if the grant went to that node at an epoch no newer. A release
 * that comes late, after the node led the partition again and was granted
 * anew, voids nothing. */
bool drey_cluster__release_voids(const drey_cluster__grant *g, uint64_t from, int64_t epoch);

#endif
