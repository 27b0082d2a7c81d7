/* Unit tests for src/client/headers.c: the metadata sent on every call. */
#include <criterion/criterion.h>
#include <string.h>

#include <grpc/grpc.h>
#include <grpc/slice.h>

#include "src/client/headers.h"

static void setup(void) {
    grpc_init();
}

static void teardown(void) {
    grpc_shutdown();
}

TestSuite(client_headers, .init = setup, .fini = teardown);

static bool slice_is(grpc_slice s, const char *want) {
    return GRPC_SLICE_LENGTH(s) == strlen(want) && memcmp(GRPC_SLICE_START_PTR(s), want, strlen(want)) == 0;
}

Test(client_headers, a_token_becomes_a_bearer_authorization_header) {
    drey_client__headers h;
    char err[128];
    cr_assert(drey_client__headers_build(&h, "eyJ.abc.def", NULL, 0, err, sizeof err));
    cr_assert_eq(h.count, 1);
    cr_assert(slice_is(h.md[0].key, "authorization"));
    cr_assert(slice_is(h.md[0].value, "Bearer eyJ.abc.def"));
    drey_client__headers_destroy(&h);
    cr_assert_eq(h.count, 0);
}

Test(client_headers, no_token_no_header) {
    drey_client__headers h;
    char err[128];
    cr_assert(drey_client__headers_build(&h, NULL, NULL, 0, err, sizeof err));
    cr_assert_eq(h.count, 0);
    drey_client__headers_destroy(&h);
    cr_assert(drey_client__headers_build(&h, "", NULL, 0, err, sizeof err));
    cr_assert_eq(h.count, 0, "an empty token sends nothing");
    drey_client__headers_destroy(&h);
}

Test(client_headers, extra_headers_follow_the_token_and_are_copied) {
    char value[] = "bench-1";
    drey_client_header extra[] = {{"x-request-source", value}, {"trace-bin", "\x01\x02"}};
    drey_client__headers h;
    char err[128];
    cr_assert(drey_client__headers_build(&h, "t", extra, 2, err, sizeof err));
    value[0] = 'X'; /* the caller's buffer may change afterwards */
    cr_assert_eq(h.count, 3);
    cr_assert(slice_is(h.md[0].key, "authorization"));
    cr_assert(slice_is(h.md[1].key, "x-request-source"));
    cr_assert(slice_is(h.md[1].value, "bench-1"));
    cr_assert(slice_is(h.md[2].key, "trace-bin"));
    cr_assert(slice_is(h.md[2].value, "\x01\x02"));
    drey_client__headers_destroy(&h);
}

Test(client_headers, illegal_keys_are_refused) {
    const char *bad[] = {"X-Upper", "", "has space", ":authority"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        drey_client_header extra[] = {{"ok", "1"}, {bad[i], "v"}};
        drey_client__headers h;
        char err[128] = "";
        cr_assert_not(drey_client__headers_build(&h, "t", extra, 2, err, sizeof err), "key \"%s\"", bad[i]);
        cr_assert_neq(strstr(err, "keys are"), NULL, "%s", err);
        cr_assert_null(h.md, "nothing is left to free");
    }
}

Test(client_headers, values_must_be_printable_unless_binary) {
    drey_client_header text[] = {{"x-note", "line\nbreak"}};
    drey_client__headers h;
    char err[128] = "";
    cr_assert_not(drey_client__headers_build(&h, NULL, text, 1, err, sizeof err));
    cr_assert_neq(strstr(err, "x-note"), NULL, "%s", err);
    drey_client_header bin[] = {{"x-note-bin", "line\nbreak"}};
    cr_assert(drey_client__headers_build(&h, NULL, bin, 1, err, sizeof err));
    drey_client__headers_destroy(&h);
}

Test(client_headers, a_token_with_a_newline_is_refused) {
    drey_client__headers h;
    char err[128] = "";
    cr_assert_not(drey_client__headers_build(&h, "abc\r\nx-evil: 1", NULL, 0, err, sizeof err));
    cr_assert_neq(strstr(err, "token"), NULL, "%s", err);
}
