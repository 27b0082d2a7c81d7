/*
 * Unit tests for src/cluster/room.c: what a primary admits for its
 * backups' journal and memory, and when its lease lets it lead.
 */
#include <criterion/criterion.h>

#include "src/cluster/room.h"

/* A backup heard 100 ms ago with 10,000 journal bytes and 5,000 memory
 * bytes of room, nothing in flight. */
static const drey_cluster__room_seen heard = {
    .journal = 10000, .memory = 5000, .since_heard_ns = 100000000LL};

Test(room, a_write_fits_in_what_the_backup_said_less_what_was_sent_since) {
    uint64_t have = 12345;
    cr_assert_eq(drey_cluster__room_verdict(&heard, 10000, 5000, &have), DREY_ERR_NONE, "exactly the room");
    drey_cluster__room_seen busy = heard;
    busy.sent_journal = 9000;
    busy.sent_memory = 4000;
    cr_assert_eq(drey_cluster__room_verdict(&busy, 1000, 1000, &have), DREY_ERR_NONE);
    cr_assert_eq(drey_cluster__room_verdict(&busy, 1001, 0, &have), DREY_ERR_JOURNAL_DISK_QUOTA);
    cr_assert_eq(have, 1000, "what is left is reported");
    cr_assert_eq(drey_cluster__room_verdict(&busy, 1000, 1001, &have), DREY_ERR_MEMORY_PRESSURE);
    cr_assert_eq(have, 1000);
    busy.sent_journal = 20000; /* more in flight than the last report's room */
    cr_assert_eq(drey_cluster__room_verdict(&busy, 1, 0, &have), DREY_ERR_JOURNAL_DISK_QUOTA);
    cr_assert_eq(have, 0, "no underflow");
}

Test(room, a_write_that_shrinks_is_never_refused_for_memory) {
    drey_cluster__room_seen full = heard;
    full.memory = 0;
    uint64_t have;
    cr_assert_eq(drey_cluster__room_verdict(&full, 100, 0, &have), DREY_ERR_NONE);
    cr_assert_eq(drey_cluster__room_verdict(&full, 100, -500, &have), DREY_ERR_NONE);
    cr_assert_eq(drey_cluster__room_verdict(&full, 100, 1, &have), DREY_ERR_MEMORY_PRESSURE);
}

Test(room, a_backup_without_a_journal_quota_never_refuses_for_its_journal) {
    drey_cluster__room_seen unbounded = heard;
    unbounded.journal = UINT64_MAX;
    unbounded.sent_journal = UINT64_MAX / 2;
    uint64_t have;
    cr_assert_eq(drey_cluster__room_verdict(&unbounded, UINT64_MAX / 4, 0, &have), DREY_ERR_NONE);
}

Test(room, a_backup_not_heard_lately_with_nothing_in_flight_gets_a_probe) {
    drey_cluster__room_seen silent = {.journal = 0, .memory = 0, .since_heard_ns = DREY_CLUSTER_ROOM_FRESH_NS + 1};
    uint64_t have;
    cr_assert_eq(drey_cluster__room_verdict(&silent, 1000, 1000, &have), DREY_ERR_NONE,
                 "the probe goes: a backup with no room refuses it and is dropped");
    cr_assert_eq(drey_cluster__room_memory_left(&silent), INT64_MAX);
    silent.sent_journal = 1; /* something in flight: it will be heard */
    cr_assert_eq(drey_cluster__room_verdict(&silent, 1000, 0, &have), DREY_ERR_JOURNAL_DISK_QUOTA);
    drey_cluster__room_seen fresh = silent;
    fresh.sent_journal = 0;
    fresh.since_heard_ns = DREY_CLUSTER_ROOM_FRESH_NS;
    cr_assert_eq(drey_cluster__room_verdict(&fresh, 1000, 0, &have), DREY_ERR_JOURNAL_DISK_QUOTA,
                 "a report exactly as old as the freshness still counts");
}

Test(lease, a_node_leads_only_until_the_lease_less_the_margin) {
    const int64_t until = 10000000000LL, margin = 200000000LL;
    cr_assert(drey_cluster__lease_holds(until, margin, until - margin - 1));
    cr_assert_not(drey_cluster__lease_holds(until, margin, until - margin), "ends before etcd could expire it");
    cr_assert_not(drey_cluster__lease_holds(until, margin, until + 1));
    cr_assert_not(drey_cluster__lease_holds(0, margin, 1), "no confirmed lease: never");
}

Test(lease, a_table_older_than_this_registration_lets_nothing_lead) {
    cr_assert(drey_cluster__may_lead_at(true, 40, 40));
    cr_assert(drey_cluster__may_lead_at(true, 41, 40));
    cr_assert_not(drey_cluster__may_lead_at(true, 39, 40), "it may name the previous life's roles");
    cr_assert_not(drey_cluster__may_lead_at(false, 41, 40));
}
