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

/* Leases from the backups: the primary's ends before the backup's wait. */
Test(lease, a_backups_grant_ends_on_the_primary_before_a_promoted_backup_serves) {
    const int64_t lease = 2000000000LL, margin = 200000000LL;
    const int64_t sent = 5000000000LL, taken = sent + 1000; /* the backup takes the beat after it was sent */
    int64_t primary_until = drey_cluster__grant_until(sent, lease, margin);
    int64_t backup_from = drey_cluster__serve_from(taken, lease, margin);
    cr_assert_lt(primary_until, backup_from, "never two primaries serving at once");
    cr_assert_geq(backup_from - primary_until, 2 * margin, "a margin on each side for clocks that drift");
}

Test(lease, every_in_sync_backup_must_grant) {
    const int64_t now = 100;
    cr_assert(drey_cluster__backups_grant((const int64_t[]){101, 150}, 2, now));
    cr_assert_not(drey_cluster__backups_grant((const int64_t[]){101, 100}, 2, now), "one lapsed: not led");
    cr_assert_not(drey_cluster__backups_grant((const int64_t[]){0}, 1, now), "never granted");
    cr_assert(drey_cluster__backups_grant(NULL, 0, now), "no in-sync backup: nobody can be promoted");
}

Test(lease, a_promoted_backup_waits_out_its_last_grant) {
    const int64_t lease = 2000000000LL, margin = 200000000LL;
    cr_assert_eq(drey_cluster__serve_from(0, lease, margin), 0, "never granted, or released: at once");
    cr_assert_eq(drey_cluster__serve_from(50, lease, margin), 50 + lease + margin);
}

Test(lease, a_release_voids_only_the_grant_it_names) {
    const drey_cluster__grant g = {.at_ns = 50, .epoch = 7, .to = 0xabc};
    cr_assert(drey_cluster__release_voids(&g, 0xabc, 7), "the grantee, after the epoch it was granted at");
    cr_assert(drey_cluster__release_voids(&g, 0xabc, 9), "a handover's flip names a newer epoch");
    cr_assert_not(drey_cluster__release_voids(&g, 0xdef, 9), "another node cannot release what it was not granted");
    cr_assert_not(drey_cluster__release_voids(&g, 0xabc, 6),
                  "a late release of an older lead: the node leads again and was granted anew");
    const drey_cluster__grant none = {.epoch = 7, .to = 0xabc};
    cr_assert_not(drey_cluster__release_voids(&none, 0xabc, 7));
}
