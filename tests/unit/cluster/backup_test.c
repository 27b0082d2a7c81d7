/*
 * Unit tests for src/cluster/backup.c: what a node takes from a peer for a
 * partition, by what its own table says of the partition.
 *
 * Records only from the current primary, in sequence; a newer epoch's
 * primary believed before the watch says so; copies (imports) only by the
 * planned target, never over an in-sync copy or the primary; a handover's
 * check only when every write is applied; a drop only of a copy the table
 * names in no role; a heartbeat marks only an in-sync copy that has every
 * acknowledged write.
 */
#include <stdio.h>

#include <criterion/criterion.h>

#include "src/cluster/backup.h"
#include "src/cluster/internal.h"

/* This node backs the partition in sync at epoch 10, under the sender. */
static const drey_cluster__holding backing = {.epoch = 10, .in_sync = true, .sender_is_primary = true};

Test(backup, a_record_is_taken_only_next_in_sequence) {
    cr_assert_eq(drey_cluster__take_record(&backing, 10, 6, 5), DREY_ERR_NONE);
    cr_assert_eq(drey_cluster__take_record(&backing, 10, 7, 5), DREY_ERR_OUT_OF_SEQUENCE, "a gap");
    cr_assert_eq(drey_cluster__take_record(&backing, 10, 5, 5), DREY_ERR_OUT_OF_SEQUENCE, "a repeat");
    cr_assert_eq(drey_cluster__take_record(&backing, 10, 1, DREY_CLUSTER_SEQ_BROKEN), DREY_ERR_OUT_OF_SEQUENCE,
                 "nothing after a record that failed, until a fresh copy");
}

Test(backup, a_record_comes_only_from_the_primary_of_an_epoch_no_older) {
    drey_cluster__holding other = backing;
    other.sender_is_primary = false;
    cr_assert_eq(drey_cluster__take_record(&other, 9, 6, 5), DREY_ERR_STALE_EPOCH, "a deposed primary");
    cr_assert_eq(drey_cluster__take_record(&other, 10, 6, 5), DREY_ERR_NOT_REPLICA, "not the primary");
    cr_assert_eq(drey_cluster__take_record(&other, 11, 6, 5), DREY_ERR_NONE,
                 "the primary of a newer epoch, before this node's watch says so");
    /* The current primary's records may name the epoch before a plan. */
    cr_assert_eq(drey_cluster__take_record(&backing, 9, 6, 5), DREY_ERR_NONE);
    drey_cluster__holding copying = {.epoch = 10, .copy_target = true, .sender_is_primary = true};
    cr_assert_eq(drey_cluster__take_record(&copying, 10, 6, 5), DREY_ERR_NOT_REPLICA,
                 "a copy under way takes no record before it is in sync");
}

Test(backup, an_in_sync_copy_or_the_primary_takes_no_import) {
    cr_assert_eq(drey_cluster__take_import(&backing, 10), DREY_ERR_IN_SYNC_COPY);
    cr_assert_eq(drey_cluster__take_import(&backing, 11), DREY_ERR_IN_SYNC_COPY,
                 "whatever the epochs say: the copy has every acknowledged write");
    drey_cluster__holding leading = {.epoch = 10, .primary = true};
    cr_assert_eq(drey_cluster__take_import(&leading, 10), DREY_ERR_PARTITION_OWNED);
}

Test(backup, an_import_is_taken_only_by_the_planned_target_from_the_primary_at_that_epoch) {
    drey_cluster__holding target = {.epoch = 10, .copy_target = true, .sender_is_primary = true};
    cr_assert_eq(drey_cluster__take_import(&target, 10), DREY_ERR_NONE);
    cr_assert_eq(drey_cluster__take_import(&target, 9), DREY_ERR_STALE_EPOCH, "the plan moved on");
    cr_assert_eq(drey_cluster__take_import(&target, 11), DREY_ERR_NOT_CAUGHT_UP, "this table is behind the plan");
    drey_cluster__holding stranger = target;
    stranger.sender_is_primary = false;
    cr_assert_eq(drey_cluster__take_import(&stranger, 10), DREY_ERR_COPY_NOT_PLANNED);
    drey_cluster__holding bystander = {.epoch = 10, .sender_is_primary = true};
    cr_assert_eq(drey_cluster__take_import(&bystander, 10), DREY_ERR_COPY_NOT_PLANNED);
}

Test(backup, a_handover_is_confirmed_only_with_every_write_applied) {
    cr_assert_eq(drey_cluster__take_confirm(&backing, 10, 42, 42, false), DREY_ERR_NONE);
    cr_assert_eq(drey_cluster__take_confirm(&backing, 10, 42, 41, false), DREY_ERR_NOT_CAUGHT_UP);
    cr_assert_eq(drey_cluster__take_confirm(&backing, 10, 42, 42, true), DREY_ERR_OUT_OF_SEQUENCE);
    cr_assert_eq(drey_cluster__take_confirm(&backing, 11, 42, 42, false), DREY_ERR_NOT_CAUGHT_UP,
                 "this table is behind the plan: ask again");
    cr_assert_eq(drey_cluster__take_confirm(&backing, 9, 42, 42, false), DREY_ERR_STALE_EPOCH);
    drey_cluster__holding other = backing;
    other.sender_is_primary = false;
    cr_assert_eq(drey_cluster__take_confirm(&other, 10, 42, 42, false), DREY_ERR_NOT_REPLICA);
    drey_cluster__holding copying = {.epoch = 10, .copy_target = true, .sender_is_primary = true};
    cr_assert_eq(drey_cluster__take_confirm(&copying, 10, 0, 0, false), DREY_ERR_NOT_REPLICA,
                 "a copy under way is not handed the role");
}

Test(backup, a_copy_is_dropped_only_when_the_table_names_the_node_in_no_role) {
    drey_cluster__holding none = {.epoch = 12};
    cr_assert_eq(drey_cluster__take_drop(&none), DREY_ERR_NONE);
    cr_assert_eq(drey_cluster__take_drop(&backing), DREY_ERR_IN_SYNC_COPY);
    drey_cluster__holding leading = {.epoch = 12, .primary = true};
    cr_assert_eq(drey_cluster__take_drop(&leading), DREY_ERR_PARTITION_OWNED);
    drey_cluster__holding back = {.epoch = 12, .copy_target = true};
    cr_assert_eq(drey_cluster__take_drop(&back), DREY_ERR_STALE_EPOCH, "the partition came back to this node");
}

Test(backup, a_heartbeat_grants_a_lease_only_to_the_primary_this_table_names) {
    cr_assert(drey_cluster__beat_grants(&backing, 10));
    cr_assert(drey_cluster__beat_grants(&backing, 11));
    cr_assert_not(drey_cluster__beat_grants(&backing, 9), "a deposed primary's epoch");
    drey_cluster__holding other = backing;
    other.sender_is_primary = false;
    cr_assert_not(drey_cluster__beat_grants(&other, 10), "a newer primary is known here: the old one gets nothing");
    drey_cluster__holding copying = {.epoch = 10, .copy_target = true, .sender_is_primary = true};
    cr_assert_not(drey_cluster__beat_grants(&copying, 10), "a copy not in sync cannot be promoted: it grants nothing");
}

/* What the mover's sweep asks before it drops a copy held without a role. */
Test(backup, an_entry_names_a_node_in_any_role) {
    drey_cluster__entry e = {.primary = "n1", .joining = "n4", .handover = "", .n_replicas = 1, .n_syncing = 1};
    snprintf(e.replicas[0], sizeof e.replicas[0], "n2");
    snprintf(e.syncing[0], sizeof e.syncing[0], "n3");
    for (const char *const *id = (const char *const[]){"n1", "n2", "n3", "n4", NULL}; *id != NULL; id++)
        cr_assert(drey_cluster__entry_names(&e, *id), "%s", *id);
    cr_assert_not(drey_cluster__entry_names(&e, "n5"));
    snprintf(e.handover, sizeof e.handover, "n5");
    cr_assert(drey_cluster__entry_names(&e, "n5"), "a handover's target");
}

Test(backup, a_heartbeat_marks_current_only_an_in_sync_copy_with_every_acknowledged_write) {
    cr_assert(drey_cluster__beat_marks_current(&backing, 10, 42, 42, false));
    cr_assert(drey_cluster__beat_marks_current(&backing, 11, 42, 50, false));
    cr_assert(!drey_cluster__beat_marks_current(&backing, 10, 42, 41, false), "a write it lacks");
    cr_assert(!drey_cluster__beat_marks_current(&backing, 9, 42, 42, false), "an older epoch's primary");
    cr_assert(!drey_cluster__beat_marks_current(&backing, 10, 42, 42, true), "a broken copy");
    drey_cluster__holding other = backing;
    other.sender_is_primary = false;
    cr_assert(!drey_cluster__beat_marks_current(&other, 10, 0, 0, false));
    drey_cluster__holding copying = {.epoch = 10, .copy_target = true, .sender_is_primary = true};
    cr_assert(!drey_cluster__beat_marks_current(&copying, 10, 0, 0, false));
}
