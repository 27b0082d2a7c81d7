/*
 * Unit tests for src/pbjson/pbjson.c: drey_pbjson_write, the descriptor-driven
 * protobuf-c → JSON writer behind GET /health/ready/details.
 *
 * Pinned: field names in lowerCamelCase, in descriptor order; every field
 * written, defaults included; 64-bit integers as bare JSON numbers, without
 * loss; enums by name; nested messages as objects (absent ones as null);
 * repeated fields as arrays and map fields as objects keyed by the map key;
 * strings escaped per RFC 8259 with UTF-8 passed through; bytes as "".
 * Whole documents are compared byte for byte, and every output is also
 * parsed with jansson, so a document that merely looks right fails too.
 *
 * The readiness document is built for real (ReadinessDetails); the scalar
 * kinds it lacks (double, enum, proto2 strings left NULL, repeated
 * messages and scalars) come from descriptor.proto's generated messages,
 * and float plus the repeated 8-byte and bool kinds from a small
 * descriptor written here, because no generated message has them.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/admin/v1/admin.pb-c.h"
#include "drey/cache/v1/cache.pb-c.h"
#include "drey/pbjson.h"
#include "google/protobuf/descriptor.pb-c.h"

typedef Drey__Admin__V1__ReadinessDetails details;
typedef Drey__Admin__V1__ReadinessDetails__Backpressure__RejectionsByReasonEntry reason_entry;

/* --- helpers -------------------------------------------------------------- */

/* The writer's output for msg, NUL-terminated; free() it. */
static char *render(const void *msg) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    drey_pbjson_write(f, msg);
    cr_assert(eq(int, fclose(f), 0));
    cr_assert(eq(sz, strlen(buf), len), "a NUL inside the document");
    return buf;
}

/* Parses text as one JSON document; flags as json_loads takes them. jansson
 * refuses integers above INT64_MAX unless told to read them as reals. */
static json_t *parse(const char *text, size_t flags) {
    json_error_t err;
    json_t *j = json_loads(text, JSON_REJECT_DUPLICATES | flags, &err);
    cr_assert_not_null(j, "not JSON (%s, at byte %d): %s", err.text, err.position, text);
    return j;
}

/* The object written for msg has exactly one key per field of its
 * descriptor: nothing omitted (duplicates are refused by parse()). */
static void assert_every_field_present(const json_t *obj, const ProtobufCMessage *msg) {
    cr_assert(eq(int, json_is_object(obj), 1), "%s is not an object", msg->descriptor->name);
    cr_assert(eq(sz, json_object_size(obj), msg->descriptor->n_fields), "%s", msg->descriptor->name);
}

static const char *str_member(const json_t *obj, const char *key) {
    json_t *v = json_object_get(obj, key);
    cr_assert(eq(int, json_is_string(v), 1), "%s is not a string", key);
    return json_string_value(v);
}

/* A fully populated readiness document; the caller owns nothing. */
typedef struct full_details {
    details d;
    Drey__Admin__V1__ReadinessDetails__JournalDisk disk;
    Drey__Admin__V1__ReadinessDetails__Memory mem;
    Drey__Admin__V1__ReadinessDetails__Backpressure bp;
    reason_entry reasons[2];
    reason_entry *reason_ptrs[2];
    Drey__Admin__V1__ReadinessDetails__Journal journal;
    Drey__Admin__V1__ReadinessDetails__Snapshot snap;
    Drey__Admin__V1__ReadinessDetails__Compaction comp;
    Drey__Admin__V1__ReadinessDetails__Recovery rec;
    Drey__Admin__V1__ReadinessDetails__DataDisk data;
} full_details;

static void fill(full_details *x) {
    *x = (full_details){
        .d = DREY__ADMIN__V1__READINESS_DETAILS__INIT,
        .disk = DREY__ADMIN__V1__READINESS_DETAILS__JOURNAL_DISK__INIT,
        .mem = DREY__ADMIN__V1__READINESS_DETAILS__MEMORY__INIT,
        .bp = DREY__ADMIN__V1__READINESS_DETAILS__BACKPRESSURE__INIT,
        .reasons = {DREY__ADMIN__V1__READINESS_DETAILS__BACKPRESSURE__REJECTIONS_BY_REASON_ENTRY__INIT,
                    DREY__ADMIN__V1__READINESS_DETAILS__BACKPRESSURE__REJECTIONS_BY_REASON_ENTRY__INIT},
        .journal = DREY__ADMIN__V1__READINESS_DETAILS__JOURNAL__INIT,
        .snap = DREY__ADMIN__V1__READINESS_DETAILS__SNAPSHOT__INIT,
        .comp = DREY__ADMIN__V1__READINESS_DETAILS__COMPACTION__INIT,
        .rec = DREY__ADMIN__V1__READINESS_DETAILS__RECOVERY__INIT,
        .data = DREY__ADMIN__V1__READINESS_DETAILS__DATA_DISK__INIT,
    };
    x->d.ready = 1;
    x->disk.state = "high";
    x->disk.max_bytes = 1099511627776ull;
    x->disk.used_bytes = 900000000000ull;
    x->disk.high_water_bytes = 800000000000ull;
    x->disk.write_rejection_active = 0;
    x->mem.state = "critical";
    x->mem.limit_bytes = 8589934592;
    x->mem.used_bytes = 8000000000;
    x->mem.high_bytes = 6442450944;
    x->mem.critical_bytes = 7730941132;
    x->mem.jemalloc_allocated_bytes = -1;
    x->mem.write_rejection_active = 1;
    x->bp.in_flight = 12;
    x->bp.queued = 3;
    x->bp.tracked_principals = 7;
    x->reasons[0].key = "queue_full";
    x->reasons[0].value = 42;
    x->reasons[1].key = "principal_limit";
    x->reasons[1].value = 5;
    x->reason_ptrs[0] = &x->reasons[0];
    x->reason_ptrs[1] = &x->reasons[1];
    x->bp.n_rejections_by_reason = 2;
    x->bp.rejections_by_reason = x->reason_ptrs;
    x->journal.fsync_policy = "batch";
    x->journal.last_lsn = 123456789012ull;
    x->journal.segments = 4;
    x->journal.last_fsync_micros = 850;
    x->journal.failed = 0;
    x->snap.last_lsn = 123456789000ull;
    x->snap.age_seconds = 3600;
    x->snap.in_flight = 1;
    x->comp.state = "idle";
    x->comp.last_run = "2024-05-01T12:00:00Z";
    x->rec.state = "done";
    x->rec.replayed_records = 1000000;
    x->d.journal_disk = &x->disk;
    x->d.memory = &x->mem;
    x->d.backpressure = &x->bp;
    x->d.journal = &x->journal;
    x->d.snapshot = &x->snap;
    x->d.compaction = &x->comp;
    x->d.recovery = &x->rec;
    x->data.journal_cap = "derived";
    x->data.fs_bytes = 2199023255552ull;
    x->data.available_bytes = 1500000000000ull;
    x->data.reserve_bytes = 1073741824ull;
    x->data.snapshot_estimate_bytes = 5000000000ull;
    x->data.snapshot_files_bytes = 9000000000ull;
    x->data.snapshot_room = "ok";
    x->d.data_disk = &x->data;
}

/* --- the readiness document ----------------------------------------------- */

Test(json, readiness_details_are_written_whole_in_camel_case) {
    full_details x;
    fill(&x);
    char *text = render(&x.d);
    /* Map keys are data, not field names: they keep their snake_case. */
    cr_assert(eq(str, text,
                 "{\"ready\":true,"
                 "\"journalDisk\":{\"state\":\"high\",\"maxBytes\":1099511627776,\"usedBytes\":900000000000,"
                 "\"highWaterBytes\":800000000000,\"writeRejectionActive\":false},"
                 "\"memory\":{\"state\":\"critical\",\"limitBytes\":8589934592,\"usedBytes\":8000000000,"
                 "\"highBytes\":6442450944,\"criticalBytes\":7730941132,\"jemallocAllocatedBytes\":-1,"
                 "\"writeRejectionActive\":true},"
                 "\"backpressure\":{\"inFlight\":12,\"queued\":3,\"trackedPrincipals\":7,"
                 "\"rejectionsByReason\":{\"queue_full\":42,\"principal_limit\":5}},"
                 "\"journal\":{\"fsyncPolicy\":\"batch\",\"lastLsn\":123456789012,\"segments\":4,"
                 "\"lastFsyncMicros\":850,\"failed\":false,\"queuedRecords\":0,\"queuedBytes\":0,\"queuedRecordsPeak\":0,\"queueRejections\":0},"
                 "\"snapshot\":{\"lastLsn\":123456789000,\"ageSeconds\":3600,\"inFlight\":true},"
                 "\"compaction\":{\"state\":\"idle\",\"lastRun\":\"2024-05-01T12:00:00Z\"},"
                 "\"recovery\":{\"state\":\"done\",\"replayedRecords\":1000000},"
                 "\"dataDisk\":{\"journalCap\":\"derived\",\"fsBytes\":2199023255552,"
                 "\"availableBytes\":1500000000000,\"reserveBytes\":1073741824,"
                 "\"snapshotEstimateBytes\":5000000000,\"snapshotFilesBytes\":9000000000,"
                 "\"snapshotRoom\":\"ok\"},\"eviction\":null,\"cluster\":null,\"build\":null,\"authz\":null,\"tenants\":null}"));
    json_t *j = parse(text, 0);
    assert_every_field_present(j, &x.d.base);
    assert_every_field_present(json_object_get(j, "journalDisk"), &x.disk.base);
    assert_every_field_present(json_object_get(j, "memory"), &x.mem.base);
    assert_every_field_present(json_object_get(j, "backpressure"), &x.bp.base);
    assert_every_field_present(json_object_get(j, "journal"), &x.journal.base);
    assert_every_field_present(json_object_get(j, "snapshot"), &x.snap.base);
    assert_every_field_present(json_object_get(j, "compaction"), &x.comp.base);
    assert_every_field_present(json_object_get(j, "recovery"), &x.rec.base);
    assert_every_field_present(json_object_get(j, "dataDisk"), &x.data.base);
    json_t *mem = json_object_get(j, "memory");
    cr_assert(eq(int, json_is_integer(json_object_get(mem, "limitBytes")), 1),
              "64-bit integers are numbers, not strings");
    cr_assert(eq(i64, json_integer_value(json_object_get(mem, "limitBytes")), 8589934592));
    cr_assert(eq(i64, json_integer_value(json_object_get(mem, "jemallocAllocatedBytes")), -1));
    cr_assert(eq(int, json_is_true(json_object_get(mem, "writeRejectionActive")), 1));
    json_t *reasons = json_object_get(json_object_get(j, "backpressure"), "rejectionsByReason");
    cr_assert(eq(int, json_is_object(reasons), 1), "a map is an object, not an array of entries");
    cr_assert(eq(sz, json_object_size(reasons), 2));
    cr_assert(eq(i64, json_integer_value(json_object_get(reasons, "queue_full")), 42));
    cr_assert(eq(i64, json_integer_value(json_object_get(reasons, "principal_limit")), 5));
    cr_assert(eq(str, (char *)str_member(json_object_get(j, "compaction"), "lastRun"), "2024-05-01T12:00:00Z"));
    json_decref(j);
    free(text);
}

/* Operators read "0", "false" and "" as facts; a field left out would read
 * as "not reported". */
Test(json, default_values_are_written_not_omitted) {
    full_details x;
    fill(&x);
    x.d.ready = 0;
    x.disk = (Drey__Admin__V1__ReadinessDetails__JournalDisk)DREY__ADMIN__V1__READINESS_DETAILS__JOURNAL_DISK__INIT;
    x.mem = (Drey__Admin__V1__ReadinessDetails__Memory)DREY__ADMIN__V1__READINESS_DETAILS__MEMORY__INIT;
    x.bp = (Drey__Admin__V1__ReadinessDetails__Backpressure)DREY__ADMIN__V1__READINESS_DETAILS__BACKPRESSURE__INIT;
    x.journal = (Drey__Admin__V1__ReadinessDetails__Journal)DREY__ADMIN__V1__READINESS_DETAILS__JOURNAL__INIT;
    x.snap = (Drey__Admin__V1__ReadinessDetails__Snapshot)DREY__ADMIN__V1__READINESS_DETAILS__SNAPSHOT__INIT;
    x.comp = (Drey__Admin__V1__ReadinessDetails__Compaction)DREY__ADMIN__V1__READINESS_DETAILS__COMPACTION__INIT;
    x.rec = (Drey__Admin__V1__ReadinessDetails__Recovery)DREY__ADMIN__V1__READINESS_DETAILS__RECOVERY__INIT;
    x.data = (Drey__Admin__V1__ReadinessDetails__DataDisk)DREY__ADMIN__V1__READINESS_DETAILS__DATA_DISK__INIT;
    char *text = render(&x.d);
    cr_assert(eq(str, text,
                 "{\"ready\":false,"
                 "\"journalDisk\":{\"state\":\"\",\"maxBytes\":0,\"usedBytes\":0,\"highWaterBytes\":0,"
                 "\"writeRejectionActive\":false},"
                 "\"memory\":{\"state\":\"\",\"limitBytes\":0,\"usedBytes\":0,\"highBytes\":0,\"criticalBytes\":0,"
                 "\"jemallocAllocatedBytes\":0,\"writeRejectionActive\":false},"
                 "\"backpressure\":{\"inFlight\":0,\"queued\":0,\"trackedPrincipals\":0,\"rejectionsByReason\":{}},"
                 "\"journal\":{\"fsyncPolicy\":\"\",\"lastLsn\":0,\"segments\":0,\"lastFsyncMicros\":0,"
                 "\"failed\":false,\"queuedRecords\":0,\"queuedBytes\":0,\"queuedRecordsPeak\":0,\"queueRejections\":0},"
                 "\"snapshot\":{\"lastLsn\":0,\"ageSeconds\":0,\"inFlight\":false},"
                 "\"compaction\":{\"state\":\"\",\"lastRun\":\"\"},"
                 "\"recovery\":{\"state\":\"\",\"replayedRecords\":0},"
                 "\"dataDisk\":{\"journalCap\":\"\",\"fsBytes\":0,\"availableBytes\":0,\"reserveBytes\":0,"
                 "\"snapshotEstimateBytes\":0,\"snapshotFilesBytes\":0,\"snapshotRoom\":\"\"},\"eviction\":null,\"cluster\":null,\"build\":null,\"authz\":null,\"tenants\":null}"));
    json_t *j = parse(text, 0);
    assert_every_field_present(j, &x.d.base);
    assert_every_field_present(json_object_get(j, "memory"), &x.mem.base);
    assert_every_field_present(json_object_get(j, "backpressure"), &x.bp.base);
    json_decref(j);
    free(text);
}

/* An absent sub-message is still a key, with null: the reader can tell
 * "not reported" from "all zero". */
Test(json, absent_sub_messages_are_null) {
    details d = DREY__ADMIN__V1__READINESS_DETAILS__INIT;
    char *text = render(&d);
    cr_assert(eq(str, text,
                 "{\"ready\":false,\"journalDisk\":null,\"memory\":null,\"backpressure\":null,\"journal\":null,"
                 "\"snapshot\":null,\"compaction\":null,\"recovery\":null,\"dataDisk\":null,\"eviction\":null,\"cluster\":null,\"build\":null,\"authz\":null,\"tenants\":null}"));
    json_t *j = parse(text, 0);
    cr_assert(eq(sz, json_object_size(j), d.base.descriptor->n_fields));
    json_decref(j);
    free(text);
}

/* JSON numbers have no width: the full 64-bit range is written as digits,
 * never quoted and never through a double (2^53 + 1 would become 2^53). */
Test(json, sixty_four_bit_integers_are_numbers_without_loss) {
    full_details x;
    fill(&x);
    x.disk.max_bytes = UINT64_MAX;
    x.disk.used_bytes = 9007199254740993ull;
    x.mem.limit_bytes = INT64_MIN;
    x.mem.used_bytes = INT64_MAX;
    x.journal.last_fsync_micros = -9007199254740993ll;
    char *text = render(&x.d);
    cr_assert_not_null(strstr(text, "\"maxBytes\":18446744073709551615,"), "%s", text);
    cr_assert_not_null(strstr(text, "\"usedBytes\":9007199254740993,"), "%s", text);
    cr_assert_not_null(strstr(text, "\"limitBytes\":-9223372036854775808,"), "%s", text);
    cr_assert_not_null(strstr(text, "\"usedBytes\":9223372036854775807,"), "%s", text);
    cr_assert_not_null(strstr(text, "\"lastFsyncMicros\":-9007199254740993,"), "%s", text);
    json_decref(parse(text, JSON_DECODE_INT_AS_REAL)); /* still one valid document */
    x.disk.max_bytes = 0;
    char *signed_only = render(&x.d);
    json_t *j = parse(signed_only, 0);
    json_t *mem = json_object_get(j, "memory");
    cr_assert(eq(i64, json_integer_value(json_object_get(mem, "limitBytes")), INT64_MIN));
    cr_assert(eq(i64, json_integer_value(json_object_get(mem, "usedBytes")), INT64_MAX));
    cr_assert(eq(i64, json_integer_value(json_object_get(json_object_get(j, "journalDisk"), "usedBytes")),
                 9007199254740993ll));
    json_decref(j);
    free(signed_only);
    free(text);
}

/* --- strings -------------------------------------------------------------- */

Test(json, strings_are_escaped_and_utf8_passes_through) {
    full_details x;
    fill(&x);
    /* é, €, U+1F600: 2-, 3- and 4-byte sequences; DEL needs no escape. */
    x.comp.state = "q\"b\\s/n\nr\rt\tc\x01\x1f\x7f caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80";
    x.comp.last_run = "";
    char *text = render(&x.comp);
    cr_assert(eq(str, text,
                 "{\"state\":\"q\\\"b\\\\s/n\\nr\\rt\\tc\\u0001\\u001f\x7f caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\","
                 "\"lastRun\":\"\"}"));
    json_t *j = parse(text, 0);
    cr_assert(eq(str, (char *)str_member(j, "state"), (char *)x.comp.state), "the decoded string is the original");
    json_decref(j);
    free(text);
}

/* The writer must emit valid JSON whatever the bytes: what is not UTF-8
 * becomes U+FFFD rather than passing through. */
Test(json, invalid_utf8_becomes_the_replacement_character) {
    full_details x;
    fill(&x);
    x.comp.state = "a\xff" "b\xc3" "c\xed\xa0\x80";
    char *text = render(&x.comp);
    json_t *j = parse(text, 0);
    cr_assert(eq(str, (char *)str_member(j, "state"),
                 "a\xef\xbf\xbd" "b\xef\xbf\xbd" "c\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"),
              "%s", text);
    json_decref(j);
    free(text);
}

/* Map keys are strings from the catalogue, but escaped all the same. */
Test(json, map_keys_are_escaped_and_an_empty_map_is_an_empty_object) {
    Drey__Admin__V1__ReadinessDetails__Backpressure bp = DREY__ADMIN__V1__READINESS_DETAILS__BACKPRESSURE__INIT;
    reason_entry e[3] = {DREY__ADMIN__V1__READINESS_DETAILS__BACKPRESSURE__REJECTIONS_BY_REASON_ENTRY__INIT,
                         DREY__ADMIN__V1__READINESS_DETAILS__BACKPRESSURE__REJECTIONS_BY_REASON_ENTRY__INIT,
                         DREY__ADMIN__V1__READINESS_DETAILS__BACKPRESSURE__REJECTIONS_BY_REASON_ENTRY__INIT};
    reason_entry *ptrs[3] = {&e[0], &e[1], &e[2]};
    char *text = render(&bp);
    cr_assert(eq(str, text, "{\"inFlight\":0,\"queued\":0,\"trackedPrincipals\":0,\"rejectionsByReason\":{}}"));
    free(text);
    e[0].key = "say \"no\"";
    e[0].value = 1;
    e[1].key = "";
    e[1].value = UINT64_MAX;
    e[2].key = "line\nbreak";
    e[2].value = 0;
    bp.rejections_by_reason = ptrs;
    bp.n_rejections_by_reason = 3;
    text = render(&bp);
    cr_assert(eq(str, text,
                 "{\"inFlight\":0,\"queued\":0,\"trackedPrincipals\":0,\"rejectionsByReason\":"
                 "{\"say \\\"no\\\"\":1,\"\":18446744073709551615,\"line\\nbreak\":0}}"));
    json_t *j = parse(text, JSON_DECODE_INT_AS_REAL);
    json_t *map = json_object_get(j, "rejectionsByReason");
    cr_assert(eq(sz, json_object_size(map), 3));
    cr_assert(eq(dbl, json_real_value(json_object_get(map, "say \"no\"")), 1));
    cr_assert(eq(dbl, json_real_value(json_object_get(map, "line\nbreak")), 0));
    json_decref(j);
    free(text);
}

/* --- other field kinds (descriptor.proto) --------------------------------- */

/* proto2 strings protobuf-c leaves NULL are "", bytes are never shown (the
 * comment in json.c: they never belong in an operator document), doubles
 * keep all 17 significant digits, repeated messages are arrays of objects. */
Test(json, doubles_bytes_null_strings_and_repeated_messages) {
    Google__Protobuf__UninterpretedOption__NamePart parts[2] = {
        GOOGLE__PROTOBUF__UNINTERPRETED_OPTION__NAME_PART__INIT,
        GOOGLE__PROTOBUF__UNINTERPRETED_OPTION__NAME_PART__INIT,
    };
    Google__Protobuf__UninterpretedOption__NamePart *part_ptrs[2] = {&parts[0], &parts[1]};
    parts[0].name_part = "drey";
    parts[0].is_extension = 1;
    parts[1].name_part = "ttl_ms";
    parts[1].is_extension = 0;
    Google__Protobuf__UninterpretedOption o = GOOGLE__PROTOBUF__UNINTERPRETED_OPTION__INIT;
    o.n_name = 2;
    o.name = part_ptrs;
    o.has_positive_int_value = 1;
    o.positive_int_value = UINT64_MAX;
    o.has_negative_int_value = 1;
    o.negative_int_value = INT64_MIN;
    o.has_double_value = 1;
    o.double_value = 0.1;
    o.has_string_value = 1;
    o.string_value = (ProtobufCBinaryData){.len = 3, .data = (uint8_t *)"\"\0\xff"};
    char *text = render(&o);
    cr_assert(eq(str, text,
                 "{\"name\":[{\"namePart\":\"drey\",\"isExtension\":true},"
                 "{\"namePart\":\"ttl_ms\",\"isExtension\":false}],"
                 "\"identifierValue\":\"\",\"positiveIntValue\":18446744073709551615,"
                 "\"negativeIntValue\":-9223372036854775808,\"doubleValue\":0.10000000000000001,"
                 "\"stringValue\":\"\",\"aggregateValue\":\"\"}"));
    json_t *j = parse(text, JSON_DECODE_INT_AS_REAL);
    cr_assert(eq(dbl, json_real_value(json_object_get(j, "doubleValue")), 0.1), "the double reads back exactly");
    json_t *name = json_object_get(j, "name");
    cr_assert(eq(int, json_is_array(name), 1));
    cr_assert(eq(sz, json_array_size(name), 2));
    cr_assert(eq(int, json_is_true(json_object_get(json_array_get(name, 0), "isExtension")), 1));
    json_decref(j);
    free(text);

    o.double_value = -2.5e-300;
    o.n_name = 0;
    text = render(&o);
    cr_assert_not_null(strstr(text, "\"name\":[],"), "an empty repeated field is []: %s", text);
    cr_assert_not_null(strstr(text, "\"doubleValue\":-2.5e-300,"), "%s", text);
    j = parse(text, JSON_DECODE_INT_AS_REAL);
    cr_assert(eq(dbl, json_real_value(json_object_get(j, "doubleValue")), -2.5e-300));
    json_decref(j);
    free(text);
}

/* Enums by their .proto names (what an operator greps for); a value the
 * descriptor does not know has no name and stays a number. Digits inside a
 * name stay as they are: proto3_optional is proto3Optional. Fields come in
 * field-number order (extendee is 2), as the descriptor lists them, not in
 * the order of the C struct. */
Test(json, enums_are_written_by_name) {
    Google__Protobuf__FieldDescriptorProto f = GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__INIT;
    f.name = "rejections_by_reason";
    f.has_number = 1;
    f.number = 4;
    f.has_label = 1;
    f.label = GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__LABEL__LABEL_REPEATED;
    f.has_type = 1;
    f.type = GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__TYPE__TYPE_MESSAGE;
    f.type_name = ".drey.admin.v1.ReadinessDetails.Backpressure.RejectionsByReasonEntry";
    f.json_name = "rejectionsByReason";
    f.has_oneof_index = 1;
    f.oneof_index = -3;
    f.has_proto3_optional = 1;
    f.proto3_optional = 1;
    char *text = render(&f);
    cr_assert(eq(str, text,
                 "{\"name\":\"rejections_by_reason\",\"extendee\":\"\",\"number\":4,"
                 "\"label\":\"LABEL_REPEATED\",\"type\":\"TYPE_MESSAGE\","
                 "\"typeName\":\".drey.admin.v1.ReadinessDetails.Backpressure.RejectionsByReasonEntry\","
                 "\"defaultValue\":\"\",\"options\":null,\"oneofIndex\":-3,\"jsonName\":\"rejectionsByReason\","
                 "\"proto3Optional\":true}"));
    json_decref(parse(text, 0));
    free(text);

    f.type = (Google__Protobuf__FieldDescriptorProto__Type)99;
    text = render(&f);
    cr_assert_not_null(strstr(text, "\"type\":99,"), "%s", text);
    json_decref(parse(text, 0));
    free(text);
}

Test(json, repeated_scalars_and_strings_are_arrays) {
    int32_t path[] = {4, 3, 2, -7, INT32_MAX, INT32_MIN};
    int32_t span[] = {0};
    char *detached[] = {"one", "two \"quoted\"", ""};
    Google__Protobuf__SourceCodeInfo__Location l = GOOGLE__PROTOBUF__SOURCE_CODE_INFO__LOCATION__INIT;
    l.n_path = sizeof path / sizeof path[0];
    l.path = path;
    l.n_span = 1;
    l.span = span;
    l.trailing_comments = " trailing\n";
    l.n_leading_detached_comments = 3;
    l.leading_detached_comments = detached;
    char *text = render(&l);
    cr_assert(eq(str, text,
                 "{\"path\":[4,3,2,-7,2147483647,-2147483648],\"span\":[0],\"leadingComments\":\"\","
                 "\"trailingComments\":\" trailing\\n\","
                 "\"leadingDetachedComments\":[\"one\",\"two \\\"quoted\\\"\",\"\"]}"));
    json_t *j = parse(text, 0);
    json_t *p = json_object_get(j, "path");
    cr_assert(eq(sz, json_array_size(p), 6));
    cr_assert(eq(i64, json_integer_value(json_array_get(p, 5)), INT32_MIN));
    json_decref(j);
    free(text);
}

/* --- kinds no generated message has: a descriptor written here ------------ */

/* Repeated fields are walked by element width, so every width is checked:
 * 8 bytes (int64, uint64, double), protobuf_c_boolean, int-sized enums,
 * 4-byte floats and ProtobufCBinaryData. */
typedef struct widths {
    ProtobufCMessage base;
    float one_float;
    int32_t sint_32;
    uint32_t fixed_32;
    int64_t sfixed_64;
    uint64_t fixed_64;
    size_t n_int64s;
    int64_t *int64s;
    size_t n_uint64s;
    uint64_t *uint64s;
    size_t n_doubles;
    double *doubles;
    size_t n_flags;
    protobuf_c_boolean *flags;
    size_t n_labels;
    int *labels;
    size_t n_floats;
    float *floats;
    size_t n_blobs;
    ProtobufCBinaryData *blobs;
    size_t n_uint32s;
    uint32_t *uint32s;
} widths;

#define SINGLE(nm, num, ty, member)                                                                                   \
    {                                                                                                                 \
        .name = nm, .id = num, .label = PROTOBUF_C_LABEL_NONE, .type = ty, .offset = offsetof(widths, member)        \
    }
#define REPEATED(nm, num, ty, member, desc)                                                                           \
    {                                                                                                                 \
        .name = nm, .id = num, .label = PROTOBUF_C_LABEL_REPEATED, .type = ty,                                       \
        .quantifier_offset = offsetof(widths, n_##member), .offset = offsetof(widths, member), .descriptor = desc     \
    }

static const ProtobufCFieldDescriptor widths_fields[] = {
    SINGLE("one_float", 1, PROTOBUF_C_TYPE_FLOAT, one_float),
    SINGLE("sint_32", 2, PROTOBUF_C_TYPE_SINT32, sint_32),
    SINGLE("fixed_32", 3, PROTOBUF_C_TYPE_FIXED32, fixed_32),
    SINGLE("sfixed_64", 4, PROTOBUF_C_TYPE_SFIXED64, sfixed_64),
    SINGLE("fixed_64", 5, PROTOBUF_C_TYPE_FIXED64, fixed_64),
    REPEATED("int64s", 6, PROTOBUF_C_TYPE_INT64, int64s, NULL),
    REPEATED("uint64s", 7, PROTOBUF_C_TYPE_UINT64, uint64s, NULL),
    REPEATED("doubles", 8, PROTOBUF_C_TYPE_DOUBLE, doubles, NULL),
    REPEATED("flags", 9, PROTOBUF_C_TYPE_BOOL, flags, NULL),
    REPEATED("labels", 10, PROTOBUF_C_TYPE_ENUM, labels, &google__protobuf__field_descriptor_proto__label__descriptor),
    REPEATED("floats", 11, PROTOBUF_C_TYPE_FLOAT, floats, NULL),
    REPEATED("blobs", 12, PROTOBUF_C_TYPE_BYTES, blobs, NULL),
    REPEATED("uint32s", 13, PROTOBUF_C_TYPE_UINT32, uint32s, NULL),
};

static const ProtobufCMessageDescriptor widths_descriptor = {
    .magic = PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC,
    .name = "drey.test.Widths",
    .short_name = "Widths",
    .c_name = "Widths",
    .package_name = "drey.test",
    .sizeof_message = sizeof(widths),
    .n_fields = sizeof widths_fields / sizeof widths_fields[0],
    .fields = widths_fields,
};

Test(json, every_scalar_width_is_walked_and_written) {
    int64_t int64s[] = {-1, 9007199254740993ll, INT64_MAX};
    uint64_t uint64s[] = {UINT64_MAX, 0};
    double doubles[] = {0.5, 1e300, -0.0, 0.1};
    protobuf_c_boolean flags[] = {1, 0, 1};
    int labels[] = {GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__LABEL__LABEL_OPTIONAL,
                    GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__LABEL__LABEL_REPEATED, 0};
    float floats[] = {0.1f, 16777217.0f, -3.40282347e38f};
    ProtobufCBinaryData blobs[] = {{.len = 1, .data = (uint8_t *)"x"}, {.len = 0, .data = NULL}};
    uint32_t uint32s[] = {UINT32_MAX, 1};
    widths w = {
        .base = PROTOBUF_C_MESSAGE_INIT(&widths_descriptor),
        .one_float = 0.1f,
        .sint_32 = INT32_MIN,
        .fixed_32 = UINT32_MAX,
        .sfixed_64 = INT64_MIN,
        .fixed_64 = UINT64_MAX,
        .n_int64s = 3,
        .int64s = int64s,
        .n_uint64s = 2,
        .uint64s = uint64s,
        .n_doubles = 4,
        .doubles = doubles,
        .n_flags = 3,
        .flags = flags,
        .n_labels = 3,
        .labels = labels,
        .n_floats = 3,
        .floats = floats,
        .n_blobs = 2,
        .blobs = blobs,
        .n_uint32s = 2,
        .uint32s = uint32s,
    };
    char *text = render(&w);
    /* A float keeps the 9 digits that make it read back as the same float. */
    cr_assert(eq(str, text,
                 "{\"oneFloat\":0.100000001,\"sint32\":-2147483648,\"fixed32\":4294967295,"
                 "\"sfixed64\":-9223372036854775808,\"fixed64\":18446744073709551615,"
                 "\"int64s\":[-1,9007199254740993,9223372036854775807],\"uint64s\":[18446744073709551615,0],"
                 "\"doubles\":[0.5,1.0000000000000001e+300,-0,0.10000000000000001],\"flags\":[true,false,true],"
                 "\"labels\":[\"LABEL_OPTIONAL\",\"LABEL_REPEATED\",0],"
                 "\"floats\":[0.100000001,16777216,-3.40282347e+38],\"blobs\":[\"\",\"\"],"
                 "\"uint32s\":[4294967295,1]}"));
    json_t *j = parse(text, JSON_DECODE_INT_AS_REAL);
    cr_assert(eq(flt, (float)json_real_value(json_object_get(j, "oneFloat")), 0.1f), "reads back as 0.1f");
    json_t *fl = json_object_get(j, "floats");
    cr_assert(eq(flt, (float)json_real_value(json_array_get(fl, 2)), -3.40282347e38f));
    cr_assert(eq(dbl, json_real_value(json_array_get(json_object_get(j, "doubles"), 1)), 1e300));
    json_decref(j);
    free(text);
}

/* A oneof's members share one union: only the member that is set is
 * written (reading the others as their own types crashed the writer). */
Test(json, only_the_set_member_of_a_oneof_is_written) {
    Drey__Cache__V1__Value v = DREY__CACHE__V1__VALUE__INIT;
    char *out = render(&v);
    cr_assert(eq(str, out, "{}"), "nothing set");
    free(out);
    v.kind_case = DREY__CACHE__V1__VALUE__KIND_INT64_VALUE;
    v.int64_value = 5;
    out = render(&v);
    cr_assert(eq(str, out, "{\"int64Value\":5}"));
    free(out);
    v.kind_case = DREY__CACHE__V1__VALUE__KIND_STRING_VALUE;
    v.string_value = "five";
    out = render(&v);
    cr_assert(eq(str, out, "{\"stringValue\":\"five\"}"));
    free(out);
}

/* JSON has no NaN or infinities: the protobuf JSON mapping's strings. */
Test(json, nan_and_infinities_are_strings) {
    Drey__Cache__V1__Value v = DREY__CACHE__V1__VALUE__INIT;
    v.kind_case = DREY__CACHE__V1__VALUE__KIND_DOUBLE_VALUE;
    static const struct {
        double d;
        const char *want;
    } cases[] = {{NAN, "{\"doubleValue\":\"NaN\"}"},
                 {INFINITY, "{\"doubleValue\":\"Infinity\"}"},
                 {-INFINITY, "{\"doubleValue\":\"-Infinity\"}"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        v.double_value = cases[i].d;
        char *out = render(&v);
        cr_assert(eq(str, out, (char *)cases[i].want));
        json_decref(parse(out, 0));
        free(out);
    }
}

/* Strings of any length come out whole, escapes included (a fixed buffer
 * cut them and could print a byte it never wrote). */
Test(json, long_strings_are_written_whole) {
    size_t n = 5000;
    char *s = malloc(n + 1);
    cr_assert_not_null(s);
    for (size_t i = 0; i < n; i++)
        s[i] = i % 7 == 0 ? '"' : i % 11 == 0 ? '\n' : (char)('a' + i % 26);
    s[n] = '\0';
    Drey__Cache__V1__Value v = DREY__CACHE__V1__VALUE__INIT;
    v.kind_case = DREY__CACHE__V1__VALUE__KIND_STRING_VALUE;
    v.string_value = s;
    char *out = render(&v);
    json_t *j = parse(out, 0);
    cr_assert(eq(str, (char *)str_member(j, "stringValue"), s));
    json_decref(j);
    free(out);
    free(s);
}
