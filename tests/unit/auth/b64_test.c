/*
 * Unit tests for src/auth/b64.c: strict base64url decoding.
 *
 * Pins RFC 4648's test vectors in the url alphabet, and that everything
 * that is not the one canonical unpadded spelling is refused: padding, the
 * standard alphabet's + and /, impossible lengths, stray bits.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "auth_helpers.h"
#include "src/auth/b64.h"

static void expect_decodes(const char *in, const char *want) {
    size_t n = 0;
    unsigned char *out = drey_auth__b64url_decode(in, strlen(in), &n);
    cr_assert_not_null(out, "\"%s\" should decode", in);
    cr_assert_eq(n, strlen(want), "\"%s\": %zu bytes", in, n);
    cr_assert(memcmp(out, want, n) == 0, "\"%s\"", in);
    cr_assert_eq(out[n], '\0');
    free(out);
}

static void expect_refused(const char *in) {
    size_t n = 99;
    unsigned char *out = drey_auth__b64url_decode(in, strlen(in), &n);
    cr_assert_null(out, "\"%s\" should be refused", in);
}

Test(b64, rfc4648_vectors) {
    expect_decodes("", "");
    expect_decodes("Zg", "f");
    expect_decodes("Zm8", "fo");
    expect_decodes("Zm9v", "foo");
    expect_decodes("Zm9vYg", "foob");
    expect_decodes("Zm9vYmE", "fooba");
    expect_decodes("Zm9vYmFy", "foobar");
}

Test(b64, url_alphabet) {
    size_t n = 0;
    unsigned char *out = drey_auth__b64url_decode("-_-_", 4, &n);
    cr_assert_not_null(out);
    cr_assert_eq(n, 3);
    cr_assert_eq(out[0], 0xfb);
    cr_assert_eq(out[1], 0xff);
    cr_assert_eq(out[2], 0xbf);
    free(out);
    cr_assert(drey_auth__b64url_char('-'));
    cr_assert(drey_auth__b64url_char('_'));
    cr_assert(!drey_auth__b64url_char('+'));
    cr_assert(!drey_auth__b64url_char('/'));
    cr_assert(!drey_auth__b64url_char('='));
    cr_assert(!drey_auth__b64url_char('.'));
    cr_assert(!drey_auth__b64url_char('\0'));
}

Test(b64, refuses_padding_standard_alphabet_and_junk) {
    expect_refused("Zg==");
    expect_refused("Zm8=");
    expect_refused("+/+/");
    expect_refused("Zm 9v");
    expect_refused("Zm9v!");
    expect_refused("Zm9\x80");
}

Test(b64, refuses_impossible_lengths) {
    expect_refused("Z");
    expect_refused("Zm9vY");
}

Test(b64, refuses_non_canonical_trailing_bits) {
    /* "Zg" is "f"; "Zh" carries the same byte with a stray bit set. */
    expect_refused("Zh");
    expect_refused("Zm9");
}

Test(b64, round_trips_every_byte_value_and_length) {
    unsigned char buf[300];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (unsigned char)(i * 7 + 3);
    for (size_t len = 0; len <= sizeof buf; len += 1) {
        char *enc = th_b64url(buf, len);
        size_t n = 0;
        unsigned char *dec = drey_auth__b64url_decode(enc, strlen(enc), &n);
        cr_assert_not_null(dec, "length %zu", len);
        cr_assert_eq(n, len);
        cr_assert(memcmp(dec, buf, len) == 0);
        free(dec);
        free(enc);
    }
}
