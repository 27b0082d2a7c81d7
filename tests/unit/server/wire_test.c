/*
 * Unit tests for src/server/wire.c: which request types can nest without
 * bound, and the iterative depth check that runs before protobuf-c's
 * recursive unpack (so deeply nested Structs cannot exhaust a worker's
 * stack).
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "drey/cache/v1/cache.pb-c.h"
#include "google/protobuf/descriptor.pb-c.h"
#include "google/protobuf/duration.pb-c.h"
#include "google/protobuf/struct.pb-c.h"
#include "google/protobuf/timestamp.pb-c.h"
#include "grpc/health/v1/health.pb-c.h"
#include "grpc/reflection/v1/reflection.pb-c.h"
#include "src/server/wire.h"
#include "tests/unit/pb_writer.h"

/* --- type_is_recursive ---------------------------------------------------- */

Test(wire, requests_holding_a_struct_are_recursive) {
    static const ProtobufCMessageDescriptor *const yes[] = {
        &google__protobuf__struct__descriptor,
        &google__protobuf__value__descriptor,
        &google__protobuf__list_value__descriptor,
        &drey__cache__v1__value__descriptor,
        &drey__cache__v1__set_request__descriptor,
        &drey__cache__v1__set_many_request__descriptor,
        &drey__cache__v1__add_request__descriptor,
        &drey__cache__v1__update_request__descriptor,
        &drey__cache__v1__get_or_add_request__descriptor,
        &google__protobuf__descriptor_proto__descriptor, /* nested_type */
    };
    for (size_t i = 0; i < sizeof yes / sizeof yes[0]; i++)
        cr_assert(drey_server__type_is_recursive(yes[i]), "%s", yes[i]->name);
}

Test(wire, flat_requests_are_not_recursive) {
    static const ProtobufCMessageDescriptor *const no[] = {
        &drey__cache__v1__get_request__descriptor,
        &drey__cache__v1__get_many_request__descriptor,
        &drey__cache__v1__remove_request__descriptor,
        &drey__cache__v1__touch_request__descriptor,
        &drey__cache__v1__persist_request__descriptor,
        &drey__cache__v1__get_expiration_request__descriptor,
        &drey__cache__v1__increment_request__descriptor,
        &google__protobuf__duration__descriptor,
        &google__protobuf__timestamp__descriptor,
        &grpc__health__v1__health_check_request__descriptor,
        &grpc__reflection__v1__server_reflection_request__descriptor,
    };
    for (size_t i = 0; i < sizeof no / sizeof no[0]; i++)
        cr_assert(not(drey_server__type_is_recursive(no[i])), "%s", no[i]->name);
}

/* A path of more than 32 distinct types is treated as recursive; 32 is
 * not. Built from synthetic descriptors: type i has one message field of
 * type i+1. */
#define CHAIN 40
static ProtobufCMessageDescriptor chain[CHAIN];
static ProtobufCFieldDescriptor chain_fields[CHAIN];

static void build_chain(void) {
    memset(chain, 0, sizeof chain);
    memset(chain_fields, 0, sizeof chain_fields);
    for (int i = 0; i < CHAIN; i++) {
        chain[i].magic = PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC;
        chain[i].name = "chain";
        if (i + 1 < CHAIN) {
            chain_fields[i].name = "next";
            chain_fields[i].id = 1;
            chain_fields[i].label = PROTOBUF_C_LABEL_OPTIONAL;
            chain_fields[i].type = PROTOBUF_C_TYPE_MESSAGE;
            chain_fields[i].descriptor = &chain[i + 1];
            chain[i].n_fields = 1;
            chain[i].fields = &chain_fields[i];
        }
    }
}

Test(wire, a_long_chain_of_types_counts_as_recursive) {
    build_chain();
    cr_assert(not(drey_server__type_is_recursive(&chain[CHAIN - 32])), "32 types");
    cr_assert(drey_server__type_is_recursive(&chain[CHAIN - 33]), "33 types");
    cr_assert(drey_server__type_is_recursive(&chain[0]));
    cr_assert(not(drey_server__type_is_recursive(&chain[CHAIN - 1])), "a type without fields");
}

/* --- building nested messages --------------------------------------------- */

/* Writes a google.protobuf.Struct nested `levels` deep into an empty writer:
 *   Struct { fields: { "k": Value { struct_value: Struct { ... } } } }
 * with an empty innermost Struct. Returns how many sub-message levels lie
 * below the outer Struct: Struct -> FieldsEntry -> Value -> Struct is 3
 * per level. */
static int write_nested_struct(pbw *w, int levels) {
    cr_assert(eq(sz, pbw_len(w), 0));
    for (int i = 1; i < levels; i++) {
        pbw_wrap(w, 5, 0);        /* Value { struct_value: <all so far> } */
        pbw_wrap(w, 2, 0);        /* FieldsEntry { value: ... } */
        pbw_cstring(w, 1, "k");   /*   key: "k" (written last, lands first) */
        pbw_wrap(w, 1, 0);        /* Struct { fields: ... } */
    }
    return 3 * (levels - 1);
}

/* google.protobuf.Value { list_value: ListValue { values: [Value {...}] } }
 * nested `levels` deep, ending in a number; 2 levels per step. */
static int write_nested_list(pbw *w, int levels) {
    cr_assert(eq(sz, pbw_len(w), 0));
    double one = 1.0;
    pbw_raw(w, &one, 8);
    pbw_key(w, 2, 1); /* Value { number_value: 1.0 } */
    for (int i = 1; i < levels; i++) {
        pbw_wrap(w, 1, 0); /* ListValue { values: [<all so far>] } */
        pbw_wrap(w, 6, 0); /* Value { list_value: ... } */
    }
    return 2 * (levels - 1);
}

/* Wraps a Struct (all of w) into SetRequest { key: "k", value: Value {
 * json_value: <struct> } }; adds 2 levels (Value, Struct) above it. */
static void wrap_in_set_request(pbw *w) {
    pbw_wrap(w, 6, 0); /* drey Value { json_value } */
    pbw_wrap(w, 3, 0); /* SetRequest.value */
    pbw_cstring(w, 2, "k");
}

static bool depth_ok(const ProtobufCMessageDescriptor *d, const pbw *w, int max_depth) {
    uint8_t *copy = pbw_copy(w);
    bool ok = drey_server__depth_ok(d, copy, pbw_len(w), max_depth);
    free(copy);
    return ok;
}

/* --- depth_ok ------------------------------------------------------------- */

/* The limit is exact: a message nesting D levels passes with max_depth D
 * and fails with D - 1. */
Test(wire, depth_limit_is_exact_for_structs) {
    for (int levels = 1; levels <= 30; levels++) {
        pbw w;
        pbw_init(&w);
        int depth = write_nested_struct(&w, levels);
        cr_assert(depth_ok(&google__protobuf__struct__descriptor, &w, depth), "%d levels", levels);
        cr_assert(depth_ok(&google__protobuf__struct__descriptor, &w, depth + 10));
        if (depth > 0)
            cr_assert(not(depth_ok(&google__protobuf__struct__descriptor, &w, depth - 1)), "%d levels", levels);
        pbw_free(&w);
    }
}

Test(wire, depth_limit_is_exact_for_lists) {
    for (int levels = 1; levels <= 30; levels++) {
        pbw w;
        pbw_init(&w);
        int depth = write_nested_list(&w, levels);
        cr_assert(depth_ok(&google__protobuf__value__descriptor, &w, depth), "%d levels", levels);
        if (depth > 0)
            cr_assert(not(depth_ok(&google__protobuf__value__descriptor, &w, depth - 1)), "%d levels", levels);
        pbw_free(&w);
    }
}

/* What the server sees: a SetRequest with a shallow JSON value passes the
 * server's limit (64), one with 200 levels of struct -> value -> struct
 * does not, and protobuf-c agrees the shallow one is well-formed. */
Test(wire, set_request_with_shallow_and_deep_structs) {
    pbw w;
    pbw_init(&w);
    write_nested_struct(&w, 5);
    wrap_in_set_request(&w);
    cr_assert(depth_ok(&drey__cache__v1__set_request__descriptor, &w, 64));
    Drey__Cache__V1__SetRequest *req =
        drey__cache__v1__set_request__unpack(NULL, pbw_len(&w), pbw_data(&w));
    cr_assert_not_null(req, "the hand encoding is a valid SetRequest");
    cr_assert(eq(str, req->key, "k"));
    cr_assert(eq(int, req->value->kind_case, DREY__CACHE__V1__VALUE__KIND_JSON_VALUE));
    cr_assert(eq(sz, req->value->json_value->n_fields, 1));
    drey__cache__v1__set_request__free_unpacked(req, NULL);
    pbw_free(&w);

    pbw_init(&w);
    write_nested_struct(&w, 200);
    wrap_in_set_request(&w);
    cr_assert(not(depth_ok(&drey__cache__v1__set_request__descriptor, &w, 64)));
    pbw_free(&w);
}

/* A million levels (several MB): rejected promptly, without recursing a
 * million frames deep. */
Test(wire, a_huge_nesting_is_rejected_without_exhausting_the_stack, .timeout = 60) {
    pbw w;
    pbw_init(&w);
    write_nested_struct(&w, 1000000);
    wrap_in_set_request(&w);
    cr_assert(gt(sz, pbw_len(&w), 5u << 20));
    cr_assert(not(depth_ok(&drey__cache__v1__set_request__descriptor, &w, 64)));
    pbw_free(&w);
}

/* Many siblings at one depth are not depth. */
Test(wire, wide_messages_pass) {
    pbw w;
    pbw_init(&w);
    for (int i = 0; i < 10000; i++) {
        size_t mark = pbw_len(&w);
        pbw_uint(&w, 4, 1);  /* Value { bool_value: true } */
        pbw_wrap(&w, 2, mark); /* FieldsEntry.value */
        pbw_cstring(&w, 1, "k");
        pbw_wrap(&w, 1, mark); /* Struct.fields */
    }
    cr_assert(depth_ok(&google__protobuf__struct__descriptor, &w, 2));
    cr_assert(not(depth_ok(&google__protobuf__struct__descriptor, &w, 1)));
    pbw_free(&w);
}

/* Only fields the schema says are messages are descended into: the same
 * deep bytes inside a bytes field, a string field or an unknown field are
 * opaque. */
Test(wire, bytes_strings_and_unknown_fields_are_opaque) {
    pbw deep;
    pbw_init(&deep);
    write_nested_struct(&deep, 200);
    static const uint32_t fields[] = {
        1,   /* drey Value.bytes_value */
        2,   /* drey Value.string_value */
        99,  /* not in the schema */
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        pbw w;
        pbw_init(&w);
        pbw_string(&w, fields[i], pbw_data(&deep), pbw_len(&deep));
        cr_assert(depth_ok(&drey__cache__v1__value__descriptor, &w, 0), "field %u", fields[i]);
        pbw_free(&w);
    }
    pbw_free(&deep);
}

Test(wire, negative_max_depth_fails_and_empty_passes) {
    cr_assert(not(drey_server__depth_ok(&google__protobuf__struct__descriptor, (const uint8_t *)"", 0, -1)));
    cr_assert(drey_server__depth_ok(&google__protobuf__struct__descriptor, (const uint8_t *)"", 0, 0));
}

/* --- malformed input ------------------------------------------------------ */

/* Malformed encodings pass (unpack rejects them) and are never read past
 * their end: each case is an exact-size heap copy under ASan. */
Test(wire, malformed_input_passes_without_overreading) {
    static const struct {
        const char *what;
        uint8_t bytes[16];
        size_t len;
    } cases[] = {
        {"truncated key varint", {0x80}, 1},
        {"endless varint", {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, 12},
        {"truncated varint value", {0x08, 0x80}, 2},
        {"truncated fixed64", {0x09, 1, 2, 3}, 4},
        {"truncated fixed32", {0x0d, 1, 2}, 3},
        {"length past the end", {0x0a, 0x05, 0x0a}, 3},
        {"huge length", {0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f}, 6},
        {"start group", {0x0b, 0x0c}, 2},
        {"end group", {0x0c}, 1},
        {"wire type 6", {0x0e}, 1},
        {"wire type 7", {0x0f}, 1},
        {"field number 0", {0x02, 0x00}, 2},
        {"field number past 2^32", {0xfa, 0xff, 0xff, 0xff, 0xff, 0x01, 0x00}, 7},
        {"nested: sub-message length past its parent", {0x0a, 0x02, 0x12, 0x05}, 4},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t *copy = malloc(cases[i].len);
        memcpy(copy, cases[i].bytes, cases[i].len);
        cr_assert(drey_server__depth_ok(&google__protobuf__struct__descriptor, copy, cases[i].len, 64), "%s",
                  cases[i].what);
        free(copy);
    }
}

/* Every prefix of a valid deep message, and random bytes: no crash, no
 * over-read. */
Test(wire, prefixes_and_garbage_do_not_crash, .timeout = 60) {
    pbw w;
    pbw_init(&w);
    write_nested_struct(&w, 40);
    wrap_in_set_request(&w);
    for (size_t n = 0; n <= pbw_len(&w); n++) {
        uint8_t *copy = malloc(n ? n : 1);
        memcpy(copy, pbw_data(&w), n);
        drey_server__depth_ok(&drey__cache__v1__set_request__descriptor, copy, n, 64);
        drey_server__depth_ok(&drey__cache__v1__set_request__descriptor, copy, n, 8);
        free(copy);
    }
    pbw_free(&w);

    uint64_t x = 88172645463325252ULL;
    for (int round = 0; round < 20000; round++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        size_t n = (size_t)(x % 64);
        uint8_t *buf = malloc(n ? n : 1);
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            buf[i] = (uint8_t)x;
        }
        drey_server__depth_ok(&drey__cache__v1__set_many_request__descriptor, buf, n, 64);
        drey_server__depth_ok(&google__protobuf__struct__descriptor, buf, n, 2);
        free(buf);
    }
}
