/*
 * Unit tests for src/bytes/bytes.c and the inline helpers of drey/bytes.h.
 *
 * The UTF-8 tables name each boundary of RFC 3629 (the last and first code
 * points around overlong forms, surrogates and U+10FFFF) so a failure says
 * which rule broke.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <stdint.h>
#include <string.h>

#include "drey/bytes.h"

/* --- little-endian integers ---------------------------------------------- */

Test(bytes, integers_are_little_endian_and_round_trip) {
    uint8_t b[8];
    drey_bytes_put16(b, 0x1234);
    cr_assert(eq(u8, b[0], 0x34));
    cr_assert(eq(u8, b[1], 0x12));
    cr_assert(eq(u16, drey_bytes_get16(b), 0x1234));
    drey_bytes_put32(b, 0x89abcdefu);
    cr_assert(eq(u8, b[0], 0xef));
    cr_assert(eq(u8, b[3], 0x89));
    cr_assert(eq(u32, drey_bytes_get32(b), 0x89abcdefu));
    drey_bytes_put64(b, 0x0102030405060708ull);
    static const uint8_t want[8] = {8, 7, 6, 5, 4, 3, 2, 1};
    cr_assert(eq(int, memcmp(b, want, 8), 0));
    cr_assert(eq(u64, drey_bytes_get64(b), 0x0102030405060708ull));
    drey_bytes_put64(b, UINT64_MAX);
    cr_assert(eq(u64, drey_bytes_get64(b), UINT64_MAX));
}

/* --- varints --------------------------------------------------------------- */

Test(bytes, varint_decodes_and_advances) {
    static const uint8_t in[] = {0x00, 0x7f, 0x80, 0x01, 0xac, 0x02,
                                 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    const uint8_t *p = in, *end = in + sizeof in;
    uint64_t v;
    cr_assert(drey_bytes_varint(&p, end, &v));
    cr_assert(eq(u64, v, 0));
    cr_assert(drey_bytes_varint(&p, end, &v));
    cr_assert(eq(u64, v, 127));
    cr_assert(drey_bytes_varint(&p, end, &v));
    cr_assert(eq(u64, v, 128));
    cr_assert(drey_bytes_varint(&p, end, &v));
    cr_assert(eq(u64, v, 300));
    cr_assert(drey_bytes_varint(&p, end, &v));
    cr_assert(eq(u64, v, UINT64_MAX));
    cr_assert(eq(ptr, (void *)p, (void *)end));
    cr_assert(not(drey_bytes_varint(&p, end, &v)), "nothing left");
}

Test(bytes, varint_refuses_a_cut_or_overlong_varint) {
    static const uint8_t cut[] = {0x80, 0x80};
    const uint8_t *p = cut;
    uint64_t v = 7;
    cr_assert(not(drey_bytes_varint(&p, cut + sizeof cut, &v)));
    cr_assert(eq(u64, v, 7), "out untouched on failure");
    static const uint8_t eleven[] = {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01};
    p = eleven;
    cr_assert(not(drey_bytes_varint(&p, eleven + sizeof eleven, &v)), "more than ten bytes");
}

/* --- UTF-8 ----------------------------------------------------------------- */

typedef struct bytes_case {
    const char *what;
    const char *s;
    size_t n;
} bytes_case;

#define B(what, lit) {what, lit, sizeof lit - 1}

Test(bytes, utf8_accepts_well_formed_text) {
    static const bytes_case ok[] = {
        B("empty", ""),
        B("ascii", "hello, world"),
        B("NUL is a code point", "a\0b"),
        B("U+0080", "\xc2\x80"),
        B("U+07FF", "\xdf\xbf"),
        B("U+0800", "\xe0\xa0\x80"),
        B("U+D7FF, last before surrogates", "\xed\x9f\xbf"),
        B("U+E000, first after surrogates", "\xee\x80\x80"),
        B("U+FFFF", "\xef\xbf\xbf"),
        B("U+10000", "\xf0\x90\x80\x80"),
        B("U+1D11E", "\xf0\x9d\x84\x9e"),
        B("U+10FFFF, the last code point", "\xf4\x8f\xbf\xbf"),
        B("mixed", "k\xc3\xa9y-\xe2\x82\xac-\xf0\x9f\x98\x80"),
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        cr_assert(drey_bytes_utf8_valid((const uint8_t *)ok[i].s, ok[i].n), "%s", ok[i].what);
}

Test(bytes, utf8_rejects_malformed_text) {
    static const bytes_case bad[] = {
        B("lone continuation 80", "\x80"),
        B("lone continuation BF", "a\xbf"),
        B("overlong NUL C0 80", "\xc0\x80"),
        B("overlong C1 BF", "\xc1\xbf"),
        B("overlong 3-byte E0 80 80", "\xe0\x80\x80"),
        B("overlong 3-byte E0 9F BF", "\xe0\x9f\xbf"),
        B("overlong 4-byte F0 80 80 80", "\xf0\x80\x80\x80"),
        B("overlong 4-byte F0 8F BF BF", "\xf0\x8f\xbf\xbf"),
        B("surrogate U+D800", "\xed\xa0\x80"),
        B("surrogate U+DBFF", "\xed\xaf\xbf"),
        B("surrogate U+DC00", "\xed\xb0\x80"),
        B("surrogate U+DFFF", "\xed\xbf\xbf"),
        B("U+110000", "\xf4\x90\x80\x80"),
        B("lead F5", "\xf5\x80\x80\x80"),
        B("lead F7", "\xf7\xbf\xbf\xbf"),
        B("lead F8 (5 bytes)", "\xf8\x88\x80\x80\x80"),
        B("lead FC (6 bytes)", "\xfc\x84\x80\x80\x80\x80"),
        B("FE", "\xfe"),
        B("FF", "\xff"),
        B("truncated 2-byte", "\xc3"),
        B("truncated 3-byte", "\xe2\x82"),
        B("truncated 4-byte", "\xf0\x9d\x84"),
        B("truncated at the end", "abc\xe2\x82"),
        B("bad continuation", "\xc3\x28"),
        B("bad second of three", "\xe2\x28\xa1"),
        B("bad third of three", "\xe2\x82\x28"),
        B("bad fourth of four", "\xf0\x9d\x84\x28"),
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert(not(drey_bytes_utf8_valid((const uint8_t *)bad[i].s, bad[i].n)), "%s", bad[i].what);
}

/* The length is the bound, not a NUL: bytes after n are never read. */
Test(bytes, utf8_reads_only_n_bytes) {
    cr_assert(drey_bytes_utf8_valid((const uint8_t *)"ab\xff", 2));
    cr_assert(not(drey_bytes_utf8_valid((const uint8_t *)"\xe2\x82\xac", 2)), "a cut sequence");
}


Test(bytes, utf8_seq_gives_the_sequence_length) {
    cr_assert(eq(sz, drey_bytes_utf8_seq((const uint8_t *)"a", 1), 0), "ASCII is the caller's");
    cr_assert(eq(sz, drey_bytes_utf8_seq((const uint8_t *)"\xc3\xa9x", 3), 2));
    cr_assert(eq(sz, drey_bytes_utf8_seq((const uint8_t *)"\xe2\x82\xac", 3), 3));
    cr_assert(eq(sz, drey_bytes_utf8_seq((const uint8_t *)"\xf0\x9f\x98\x80", 4), 4));
    cr_assert(eq(sz, drey_bytes_utf8_seq((const uint8_t *)"\xf0\x9f\x98\x80", 3), 0), "cut");
    cr_assert(eq(sz, drey_bytes_utf8_seq((const uint8_t *)"", 0), 0), "empty");
}

/* --- hexadecimal file names ----------------------------------------------- */

Test(bytes, hex_name_parses_the_writers_spelling) {
    uint64_t v = 0;
    cr_assert(drey_bytes_hex_name("0000000000000001.seg", "", ".seg", &v));
    cr_assert(eq(u64, v, 1));
    cr_assert(drey_bytes_hex_name("snap-00000000000000ff.snap", "snap-", ".snap", &v));
    cr_assert(eq(u64, v, 255));
    cr_assert(drey_bytes_hex_name("ffffffffffffffff.seg", "", ".seg", &v));
    cr_assert(eq(u64, v, UINT64_MAX));
}

Test(bytes, hex_name_refuses_every_other_name) {
    static const char *const bad[] = {
        "000000000000001.seg",    /* 15 digits */
        "00000000000000001.seg",  /* 17 digits */
        "00000000000000FF.seg",   /* upper case: not how the writer spells it */
        "000000000000000g.seg",   /* not hex */
        "0000000000000001.se",    /* wrong suffix */
        "0000000000000001.seg~",  /* trailing bytes */
        "snap-0000000000000001.seg",
        "",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t v = 42;
        cr_assert(not(drey_bytes_hex_name(bad[i], "", ".seg", &v)), "%s", bad[i]);
        cr_assert(eq(u64, v, 42), "value untouched for %s", bad[i]);
    }
    uint64_t v = 42;
    cr_assert(not(drey_bytes_hex_name("snip-0000000000000001.snap", "snap-", ".snap", &v)), "wrong prefix");
}
