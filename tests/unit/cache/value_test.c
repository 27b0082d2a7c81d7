/*
 * Unit tests for src/cache/value.c: how a request's expiration becomes an
 * absolute expiry, how Values are stored (and read back) in the store's
 * byte form, and the Timestamp/Duration helpers of responses.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "src/cache/value.h"

/* DREY_MAX_TTL_MS of drey/pipeline.h, the longest ttl validation lets in. */
#define MAX_TTL_MS ((int64_t)100 * 366 * 24 * 3600 * 1000)

static drey_arena arena;

static void setup(void) {
    drey_arena_init(&arena, NULL, 0);
}

static void teardown(void) {
    drey_arena_destroy(&arena);
}

TestSuite(value, .init = setup, .fini = teardown);

/* --- expiry_at ------------------------------------------------------------ */

static int64_t with_ttl(int64_t s, int32_t ns, int64_t now, int64_t keep) {
    Google__Protobuf__Duration d = GOOGLE__PROTOBUF__DURATION__INIT;
    d.seconds = s;
    d.nanos = ns;
    drey_cache__expiry ex = {.ttl = &d};
    return drey_cache__expiry_at(&ex, now, keep);
}

static int64_t with_expires_at(int64_t s, int32_t ns, int64_t now, int64_t keep) {
    Google__Protobuf__Timestamp t = GOOGLE__PROTOBUF__TIMESTAMP__INIT;
    t.seconds = s;
    t.nanos = ns;
    drey_cache__expiry ex = {.expires_at = &t};
    return drey_cache__expiry_at(&ex, now, keep);
}

/* A ttl counts from now; a partial millisecond rounds up, so an entry never
 * expires before its ttl. */
Test(value, expiry_from_ttl_rounds_up) {
    const int64_t now = 1800000000000;
    cr_assert(eq(i64, with_ttl(5, 0, now, 0), now + 5000));
    cr_assert(eq(i64, with_ttl(0, 1, now, 0), now + 1));
    cr_assert(eq(i64, with_ttl(0, 999999, now, 0), now + 1));
    cr_assert(eq(i64, with_ttl(0, 1000000, now, 0), now + 1));
    cr_assert(eq(i64, with_ttl(0, 1000001, now, 0), now + 2));
    cr_assert(eq(i64, with_ttl(1, 500000000, now, 0), now + 1500));
    cr_assert(eq(i64, with_ttl(0, 999999999, now, 0), now + 1000));
    cr_assert(eq(i64, with_ttl(MAX_TTL_MS / 1000, 0, now, 0), now + MAX_TTL_MS));
    cr_assert(eq(i64, with_ttl(5, 0, now, 777), now + 5000), "a ttl replaces the current expiry");
}

/* expires_at is absolute: now does not matter; partial ms round up. */
Test(value, expiry_from_timestamp_rounds_up) {
    cr_assert(eq(i64, with_expires_at(1800000000, 0, 5, 0), 1800000000000));
    cr_assert(eq(i64, with_expires_at(1800000000, 0, 1900000000000, 0), 1800000000000),
              "a past time is kept: the entry is stored expired");
    cr_assert(eq(i64, with_expires_at(1800000000, 1, 0, 0), 1800000000001));
    cr_assert(eq(i64, with_expires_at(1800000000, 1000000, 0, 0), 1800000000001));
    cr_assert(eq(i64, with_expires_at(1800000000, 999999999, 0, 0), 1800000001000));
}

/* The result never passes 9999-12-31T23:59:59.999Z, the last millisecond a
 * Timestamp can express: it is returned to clients as expires_at. */
#define MAX_TIMESTAMP_MS (253402300799LL * 1000 + 999)

Test(value, expiry_is_clamped_to_the_last_timestamp) {
    cr_assert(eq(i64, with_expires_at(253402300799, 998000000, 0, 0), MAX_TIMESTAMP_MS - 1));
    cr_assert(eq(i64, with_expires_at(253402300799, 999000000, 0, 0), MAX_TIMESTAMP_MS));
    cr_assert(eq(i64, with_expires_at(253402300799, 999000001, 0, 0), MAX_TIMESTAMP_MS), "rounding up stops there");
    cr_assert(eq(i64, with_ttl(MAX_TTL_MS / 1000, 0, MAX_TIMESTAMP_MS - 10, 0), MAX_TIMESTAMP_MS));
    cr_assert(eq(i64, with_ttl(0, 9000000, MAX_TIMESTAMP_MS - 10, 0), MAX_TIMESTAMP_MS - 1));
    cr_assert(eq(i64, with_ttl(0, 10000000, MAX_TIMESTAMP_MS - 10, 0), MAX_TIMESTAMP_MS));
    cr_assert(eq(i64, with_ttl(0, 11000000, MAX_TIMESTAMP_MS - 10, 0), MAX_TIMESTAMP_MS));
}

/* 0 means "never", so a time at or before the epoch becomes 1: already
 * past for any real clock, never "forever". */
Test(value, at_or_before_the_epoch_becomes_1) {
    cr_assert(eq(i64, with_expires_at(0, 0, 1000, 0), 1));
    cr_assert(eq(i64, with_expires_at(-1, 0, 1000, 0), 1));
    cr_assert(eq(i64, with_expires_at(-1, 999999999, 1000, 0), 1));
    cr_assert(eq(i64, with_expires_at(-62135596800, 0, 1000, 0), 1));
    cr_assert(eq(i64, with_expires_at(0, 1, 1000, 0), 1), "1 ns after the epoch rounds up to 1 ms");
    cr_assert(eq(i64, with_expires_at(0, 1000001, 1000, 0), 2));
}

Test(value, persist_and_keep) {
    drey_cache__expiry none = {0};
    cr_assert(eq(i64, drey_cache__expiry_at(&none, 1000, 0), 0), "nothing given, nothing kept: never");
    cr_assert(eq(i64, drey_cache__expiry_at(&none, 1000, 98765), 98765), "nothing given: the current expiry");
    drey_cache__expiry persist = {.persist = true};
    cr_assert(eq(i64, drey_cache__expiry_at(&persist, 1000, 98765), 0));
}

/* --- value_in / value_out ------------------------------------------------- */

/* Stores v and reads it back as a message. */
static Drey__Cache__V1__Value *round_trip(const Drey__Cache__V1__Value *v, drey_value *stored) {
    drey_cache__value_in(v, &arena, stored);
    cr_assert(eq(int, (int)stored->kind, (int)v->kind_case), "the stored kind is the oneof number");
    /* The store copies values: simulate it, so value_out cannot lean on
     * pointers into the request. Like a store view, data is never NULL. */
    uint8_t *copy = drey_arena_alloc(&arena, stored->len ? stored->len : 1);
    if (stored->len > 0)
        memcpy(copy, stored->data, stored->len);
    drey_value in_store = {.kind = stored->kind, .data = copy, .len = stored->len};
    Drey__Cache__V1__Value *out = drey_cache__value_out(&arena, &in_store);
    cr_assert_not_null(out);
    cr_assert(eq(int, out->kind_case, v->kind_case));
    return out;
}

Test(value, bytes_round_trip) {
    static const uint8_t data[] = {0, 1, 2, 0, 255, 0x80};
    Drey__Cache__V1__Value v = DREY__CACHE__V1__VALUE__INIT;
    v.kind_case = DREY__CACHE__V1__VALUE__KIND_BYTES_VALUE;
    v.bytes_value.data = (uint8_t *)data;
    v.bytes_value.len = sizeof data;
    drey_value stored;
    Drey__Cache__V1__Value *out = round_trip(&v, &stored);
    cr_assert(eq(u32, stored.len, sizeof data));
    cr_assert(eq(int, memcmp(stored.data, data, sizeof data), 0));
    cr_assert(eq(sz, out->bytes_value.len, sizeof data));
    cr_assert(eq(int, memcmp(out->bytes_value.data, data, sizeof data), 0));

    v.bytes_value.len = 0;
    out = round_trip(&v, &stored);
    cr_assert(eq(u32, stored.len, 0));
    cr_assert(eq(sz, out->bytes_value.len, 0));
}

Test(value, string_round_trip) {
    Drey__Cache__V1__Value v = DREY__CACHE__V1__VALUE__INIT;
    v.kind_case = DREY__CACHE__V1__VALUE__KIND_STRING_VALUE;
    v.string_value = "h\xc3\xa9llo w\xc3\xb6rld";
    drey_value stored;
    Drey__Cache__V1__Value *out = round_trip(&v, &stored);
    cr_assert(eq(u32, stored.len, (uint32_t)strlen(v.string_value)), "stored without a terminator");
    cr_assert(eq(str, out->string_value, v.string_value));

    v.string_value = "";
    out = round_trip(&v, &stored);
    cr_assert(eq(u32, stored.len, 0));
    cr_assert(eq(str, out->string_value, ""));
}

/* int64 is 8 little-endian bytes whatever the host. */
Test(value, int64_round_trip_and_layout) {
    static const int64_t cases[] = {0, 1, -1, 42, INT64_MIN, INT64_MAX, 0x0102030405060708LL};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Drey__Cache__V1__Value v = DREY__CACHE__V1__VALUE__INIT;
        v.kind_case = DREY__CACHE__V1__VALUE__KIND_INT64_VALUE;
        v.int64_value = cases[i];
        drey_value stored;
        Drey__Cache__V1__Value *out = round_trip(&v, &stored);
        cr_assert(eq(u32, stored.len, 8));
        cr_assert(eq(i64, out->int64_value, cases[i]));
        cr_assert(eq(i64, drey_cache__int64_of(&stored), cases[i]));
    }
    Drey__Cache__V1__Value v = DREY__CACHE__V1__VALUE__INIT;
    v.kind_case = DREY__CACHE__V1__VALUE__KIND_INT64_VALUE;
    v.int64_value = 0x0102030405060708LL;
    drey_value stored;
    drey_cache__value_in(&v, &arena, &stored);
    static const uint8_t le[8] = {8, 7, 6, 5, 4, 3, 2, 1};
    cr_assert(eq(int, memcmp(stored.data, le, 8), 0));
}

/* double keeps its exact bits: signed zero, infinities, NaN payloads. */
Test(value, double_round_trip_is_bit_exact) {
    double nan_payload;
    uint64_t nan_bits = 0x7ff8000000abcdefULL;
    memcpy(&nan_payload, &nan_bits, 8);
    const double cases[] = {0.0, -0.0, 1.5, -2.25, 1e308, 5e-324, INFINITY, -INFINITY, nan_payload};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Drey__Cache__V1__Value v = DREY__CACHE__V1__VALUE__INIT;
        v.kind_case = DREY__CACHE__V1__VALUE__KIND_DOUBLE_VALUE;
        v.double_value = cases[i];
        drey_value stored;
        Drey__Cache__V1__Value *out = round_trip(&v, &stored);
        cr_assert(eq(u32, stored.len, 8));
        cr_assert(eq(int, memcmp(&out->double_value, &cases[i], 8), 0), "case %zu", i);
    }
    Drey__Cache__V1__Value v = DREY__CACHE__V1__VALUE__INIT;
    v.kind_case = DREY__CACHE__V1__VALUE__KIND_DOUBLE_VALUE;
    v.double_value = 1.0;
    drey_value stored;
    drey_cache__value_in(&v, &arena, &stored);
    static const uint8_t le[8] = {0, 0, 0, 0, 0, 0, 0xf0, 0x3f};
    cr_assert(eq(int, memcmp(stored.data, le, 8), 0));
}

Test(value, bool_round_trip) {
    for (int b = 0; b < 2; b++) {
        Drey__Cache__V1__Value v = DREY__CACHE__V1__VALUE__INIT;
        v.kind_case = DREY__CACHE__V1__VALUE__KIND_BOOL_VALUE;
        v.bool_value = b;
        drey_value stored;
        Drey__Cache__V1__Value *out = round_trip(&v, &stored);
        cr_assert(eq(u32, stored.len, 1));
        cr_assert(eq(u8, stored.data[0], (uint8_t)b));
        cr_assert(eq(int, out->bool_value, b));
    }
    /* Any non-zero stored byte reads as true. */
    uint8_t two = 2;
    drey_value stored = {.kind = DREY_VALUE_BOOL, .data = &two, .len = 1};
    cr_assert(eq(int, drey_cache__value_out(&arena, &stored)->bool_value, 1));
}

Test(value, null_round_trip) {
    Drey__Cache__V1__Value v = DREY__CACHE__V1__VALUE__INIT;
    v.kind_case = DREY__CACHE__V1__VALUE__KIND_NULL_VALUE;
    v.null_value = GOOGLE__PROTOBUF__NULL_VALUE__NULL_VALUE;
    drey_value stored;
    Drey__Cache__V1__Value *out = round_trip(&v, &stored);
    cr_assert(eq(u32, stored.len, 0));
    cr_assert_null(stored.data);
    cr_assert(eq(int, out->null_value, GOOGLE__PROTOBUF__NULL_VALUE__NULL_VALUE));
}

/* JSON is stored as the serialized Struct and read back as an equal Struct:
 * every google.protobuf.Value kind, nested objects and lists, order kept. */
Test(value, json_round_trip) {
    Google__Protobuf__Value num = GOOGLE__PROTOBUF__VALUE__INIT, str = GOOGLE__PROTOBUF__VALUE__INIT,
                            yes = GOOGLE__PROTOBUF__VALUE__INIT, nul = GOOGLE__PROTOBUF__VALUE__INIT,
                            list = GOOGLE__PROTOBUF__VALUE__INIT, obj = GOOGLE__PROTOBUF__VALUE__INIT,
                            item = GOOGLE__PROTOBUF__VALUE__INIT;
    num.kind_case = GOOGLE__PROTOBUF__VALUE__KIND_NUMBER_VALUE;
    num.number_value = -12.5;
    str.kind_case = GOOGLE__PROTOBUF__VALUE__KIND_STRING_VALUE;
    str.string_value = "caf\xc3\xa9";
    yes.kind_case = GOOGLE__PROTOBUF__VALUE__KIND_BOOL_VALUE;
    yes.bool_value = 1;
    nul.kind_case = GOOGLE__PROTOBUF__VALUE__KIND_NULL_VALUE;
    item.kind_case = GOOGLE__PROTOBUF__VALUE__KIND_NUMBER_VALUE;
    item.number_value = 3;
    Google__Protobuf__Value *items[] = {&item, &str};
    Google__Protobuf__ListValue lv = GOOGLE__PROTOBUF__LIST_VALUE__INIT;
    lv.n_values = 2;
    lv.values = items;
    list.kind_case = GOOGLE__PROTOBUF__VALUE__KIND_LIST_VALUE;
    list.list_value = &lv;
    Google__Protobuf__Struct__FieldsEntry inner_e = GOOGLE__PROTOBUF__STRUCT__FIELDS_ENTRY__INIT;
    Google__Protobuf__Struct__FieldsEntry *inner_ep = &inner_e;
    inner_e.key = "deep";
    inner_e.value = &yes;
    Google__Protobuf__Struct inner = GOOGLE__PROTOBUF__STRUCT__INIT;
    inner.n_fields = 1;
    inner.fields = &inner_ep;
    obj.kind_case = GOOGLE__PROTOBUF__VALUE__KIND_STRUCT_VALUE;
    obj.struct_value = &inner;

    const char *keys[] = {"n", "s", "b", "z", "l", "o"};
    Google__Protobuf__Value *vals[] = {&num, &str, &yes, &nul, &list, &obj};
    Google__Protobuf__Struct__FieldsEntry e[6];
    Google__Protobuf__Struct__FieldsEntry *ep[6];
    for (int i = 0; i < 6; i++) {
        google__protobuf__struct__fields_entry__init(&e[i]);
        e[i].key = (char *)keys[i];
        e[i].value = vals[i];
        ep[i] = &e[i];
    }
    Google__Protobuf__Struct s = GOOGLE__PROTOBUF__STRUCT__INIT;
    s.n_fields = 6;
    s.fields = ep;

    Drey__Cache__V1__Value v = DREY__CACHE__V1__VALUE__INIT;
    v.kind_case = DREY__CACHE__V1__VALUE__KIND_JSON_VALUE;
    v.json_value = &s;
    drey_value stored;
    Drey__Cache__V1__Value *out = round_trip(&v, &stored);
    cr_assert(eq(u32, stored.len, (uint32_t)protobuf_c_message_get_packed_size(&s.base)));

    const Google__Protobuf__Struct *o = out->json_value;
    cr_assert_not_null(o);
    cr_assert(eq(sz, o->n_fields, 6));
    for (int i = 0; i < 6; i++)
        cr_assert(eq(str, o->fields[i]->key, (char *)keys[i]));
    cr_assert(eq(dbl, o->fields[0]->value->number_value, -12.5));
    cr_assert(eq(str, o->fields[1]->value->string_value, "caf\xc3\xa9"));
    cr_assert(eq(int, o->fields[2]->value->bool_value, 1));
    cr_assert(eq(int, o->fields[3]->value->kind_case, GOOGLE__PROTOBUF__VALUE__KIND_NULL_VALUE));
    cr_assert(eq(sz, o->fields[4]->value->list_value->n_values, 2));
    cr_assert(eq(dbl, o->fields[4]->value->list_value->values[0]->number_value, 3));
    cr_assert(eq(str, o->fields[5]->value->struct_value->fields[0]->key, "deep"));

    /* Same bytes both ways. */
    size_t n = protobuf_c_message_get_packed_size(&o->base);
    cr_assert(eq(sz, n, stored.len));
    uint8_t *again = drey_arena_alloc(&arena, n);
    protobuf_c_message_pack(&o->base, again);
    cr_assert(eq(int, memcmp(again, stored.data, n), 0));
}

Test(value, empty_json_round_trip) {
    Google__Protobuf__Struct s = GOOGLE__PROTOBUF__STRUCT__INIT;
    Drey__Cache__V1__Value v = DREY__CACHE__V1__VALUE__INIT;
    v.kind_case = DREY__CACHE__V1__VALUE__KIND_JSON_VALUE;
    v.json_value = &s;
    drey_value stored;
    Drey__Cache__V1__Value *out = round_trip(&v, &stored);
    cr_assert(eq(u32, stored.len, 0));
    cr_assert_not_null(out->json_value);
    cr_assert(eq(sz, out->json_value->n_fields, 0));
}

/* Stored JSON that does not parse (never written by drey) still reads as
 * a JSON value, an empty object, rather than NULL. */
Test(value, unreadable_stored_json_reads_as_an_empty_object) {
    static const uint8_t junk[] = {0xff, 0xff, 0xff};
    drey_value stored = {.kind = DREY_VALUE_JSON, .data = junk, .len = sizeof junk};
    Drey__Cache__V1__Value *out = drey_cache__value_out(&arena, &stored);
    cr_assert(eq(int, out->kind_case, DREY__CACHE__V1__VALUE__KIND_JSON_VALUE));
    cr_assert_not_null(out->json_value);
    cr_assert(eq(sz, out->json_value->n_fields, 0));
}

/* value_out copies into the arena: the result does not alias the store. */
Test(value, value_out_copies) {
    uint8_t data[4] = {'a', 'b', 'c', 'd'};
    drey_value b = {.kind = DREY_VALUE_BYTES, .data = data, .len = 4};
    drey_value s = {.kind = DREY_VALUE_STRING, .data = data, .len = 4};
    Drey__Cache__V1__Value *ob = drey_cache__value_out(&arena, &b);
    Drey__Cache__V1__Value *os = drey_cache__value_out(&arena, &s);
    memset(data, 'x', sizeof data);
    cr_assert(eq(int, memcmp(ob->bytes_value.data, "abcd", 4), 0));
    cr_assert(eq(str, os->string_value, "abcd"));
}

Test(value, int64_helpers) {
    uint8_t buf[8];
    drey_value v;
    drey_cache__int64_value(-2, buf, &v);
    cr_assert(eq(int, v.kind, DREY_VALUE_INT64));
    cr_assert(eq(u32, v.len, 8));
    cr_assert(eq(ptr, (void *)v.data, (void *)buf));
    static const uint8_t minus_two[8] = {0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    cr_assert(eq(int, memcmp(buf, minus_two, 8), 0));
    cr_assert(eq(i64, drey_cache__int64_of(&v), -2));
    drey_cache__int64_value(INT64_MIN, buf, &v);
    cr_assert(eq(i64, drey_cache__int64_of(&v), INT64_MIN));
}

/* --- timestamp / duration ------------------------------------------------- */

typedef struct ms_case {
    int64_t ms, seconds;
    int32_t nanos;
} ms_case;

/* Timestamps are normalized: nanos in [0, 1e9) even before the epoch. */
Test(value, timestamp_of_ms) {
    cr_assert_null(drey_cache__timestamp(&arena, 0), "0 is no expiry");
    static const ms_case cases[] = {
        {1, 0, 1000000},
        {999, 0, 999000000},
        {1000, 1, 0},
        {1500, 1, 500000000},
        {1800000000123, 1800000000, 123000000},
        {253402300799999, 253402300799, 999000000},
        {-1, -1, 999000000},
        {-999, -1, 1000000},
        {-1000, -1, 0},
        {-1001, -2, 999000000},
        {-1500, -2, 500000000},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Google__Protobuf__Timestamp *t = drey_cache__timestamp(&arena, cases[i].ms);
        cr_assert_not_null(t);
        cr_assert(eq(i64, t->seconds, cases[i].seconds), "%lld ms", (long long)cases[i].ms);
        cr_assert(eq(i32, t->nanos, cases[i].nanos), "%lld ms", (long long)cases[i].ms);
    }
}

/* Durations (remaining time) are never negative: past is zero. */
Test(value, duration_of_ms) {
    static const ms_case cases[] = {
        {0, 0, 0},
        {1, 0, 1000000},
        {999, 0, 999000000},
        {1500, 1, 500000000},
        {MAX_TTL_MS, MAX_TTL_MS / 1000, 0},
        {-1, 0, 0},
        {-5000, 0, 0},
        {INT64_MIN, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Google__Protobuf__Duration *d = drey_cache__duration(&arena, cases[i].ms);
        cr_assert_not_null(d);
        cr_assert(eq(i64, d->seconds, cases[i].seconds), "%lld ms", (long long)cases[i].ms);
        cr_assert(eq(i32, d->nanos, cases[i].nanos), "%lld ms", (long long)cases[i].ms);
    }
}

/* A response's expires_at, sent back as a request's expires_at, gives the
 * same expiry. */
Test(value, timestamp_and_expiry_at_agree) {
    static const int64_t ms[] = {1, 2, 999, 1000, 1001, 1800000000123, MAX_TIMESTAMP_MS};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        Google__Protobuf__Timestamp *t = drey_cache__timestamp(&arena, ms[i]);
        drey_cache__expiry ex = {.expires_at = t};
        cr_assert(eq(i64, drey_cache__expiry_at(&ex, 0, 0), ms[i]));
    }
}
