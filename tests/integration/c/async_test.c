/* The asynchronous interface (what drey-bench builds on) against the real
 * dreyd: many calls in flight on one client, each completed once with its
 * own user data. */
#include <criterion/criterion.h>
#include <string.h>

#include "harness.h"

static harness_env env;

/* One connection is one principal: let it have all 200 calls at once
 * (the defaults would queue 64 beyond its 64 running and refuse the rest). */
static const char *const flags[] = {"--principal-max-inflight=256", "--principal-max-queued=256",
                                    "--max-inflight=256", NULL};

static void up(void) {
    harness_up(&env, flags);
}

static void down(void) {
    harness_down(&env);
}

TestSuite(async, .init = up, .fini = down, .timeout = 60);

/* An IncrementRequest{key, delta: 1}, encoded into buf. */
static size_t encode_incr(const char *key, uint8_t *buf, size_t cap) {
    Drey__Cache__V1__IncrementRequest req = DREY__CACHE__V1__INCREMENT_REQUEST__INIT;
    req.key = (char *)key;
    req.delta = 1;
    size_t n = protobuf_c_message_get_packed_size(&req.base);
    cr_assert_leq(n, cap);
    return protobuf_c_message_pack(&req.base, buf);
}

Test(async, concurrent_increments_each_complete_once) {
    enum { N = 200 };
    uint8_t buf[64];
    size_t len = encode_incr("hits", buf, sizeof buf);
    static int done[N];
    static bool seen_value[N + 1];
    for (int i = 0; i < N; i++)
        cr_assert(drey_client_start_call(env.client, DREY_CLIENT_CACHE("Increment"), buf, len, 10000, &done[i]));
    cr_assert_eq(drey_client_in_flight(env.client), N);
    for (int i = 0; i < N; i++) {
        drey_client_completion c;
        cr_assert(drey_client_next(env.client, 10000, &env.arena, &c), "completion %d did not come", i);
        cr_assert_eq(c.status.code, GRPC_STATUS_OK, "%s: %s", drey_client_code_name(c.status.code),
                     c.status.message);
        int *slot = c.user;
        cr_assert(slot >= done && slot < done + N);
        (*slot)++;
        cr_assert_gt(c.elapsed_ns, 0);
        Drey__Cache__V1__IncrementResponse *r = (Drey__Cache__V1__IncrementResponse *)protobuf_c_message_unpack(
            &drey__cache__v1__increment_response__descriptor, drey_arena_protobuf_allocator(&env.arena),
            c.response.len, c.response.data);
        cr_assert_not_null(r);
        cr_assert(r->value >= 1 && r->value <= N);
        cr_assert_not(seen_value[r->value], "value %lld returned twice", (long long)r->value);
        seen_value[r->value] = true;
    }
    cr_assert_eq(drey_client_in_flight(env.client), 0);
    for (int i = 0; i < N; i++)
        cr_assert_eq(done[i], 1, "call %d completed %d times", i, done[i]);
    Drey__Cache__V1__GetRequest get = DREY__CACHE__V1__GET_REQUEST__INIT;
    get.key = "hits";
    Drey__Cache__V1__GetResponse *g =
        harness_ok(&env, DREY_CLIENT_CACHE("Get"), &get.base, &drey__cache__v1__get_response__descriptor);
    cr_assert_eq(g->value->int64_value, N, "every increment applied exactly once");
}

Test(async, failures_complete_with_their_details) {
    uint8_t buf[64];
    size_t len = encode_incr("", buf, sizeof buf); /* an invalid key */
    int tags[2];
    cr_assert(drey_client_start_call(env.client, DREY_CLIENT_CACHE("Increment"), buf, len, 10000, &tags[0]));
    cr_assert(drey_client_start_call(env.client, DREY_CLIENT_CACHE("Nope"), buf, len, 10000, &tags[1]));
    for (int i = 0; i < 2; i++) {
        drey_client_completion c;
        cr_assert(drey_client_next(env.client, 10000, &env.arena, &c));
        cr_assert_eq(c.response.len, 0);
        if (c.user == &tags[0]) {
            cr_assert_eq(c.status.code, GRPC_STATUS_INVALID_ARGUMENT);
            cr_assert_str_eq(drey_client_status_reason(&c.status), "INVALID_KEY");
            cr_assert_not_null(drey_client_status_violation(&c.status, "key"));
        } else {
            cr_assert_eq(c.user, &tags[1]);
            cr_assert_eq(c.status.code, GRPC_STATUS_UNIMPLEMENTED);
            cr_assert_str_eq(drey_client_status_reason(&c.status), "UNKNOWN_METHOD");
        }
    }
}

Test(async, synchronous_calls_interleave_with_calls_in_flight) {
    uint8_t buf[64];
    size_t len = encode_incr("mixed", buf, sizeof buf);
    for (int i = 0; i < 10; i++)
        cr_assert(drey_client_start_call(env.client, DREY_CLIENT_CACHE("Increment"), buf, len, 10000, NULL));
    Drey__Cache__V1__GetRequest get = DREY__CACHE__V1__GET_REQUEST__INIT;
    get.key = "other";
    harness_ok(&env, DREY_CLIENT_CACHE("Get"), &get.base, &drey__cache__v1__get_response__descriptor);
    for (int i = 0; i < 10; i++) {
        drey_client_completion c;
        cr_assert(drey_client_next(env.client, 10000, &env.arena, &c));
        cr_assert_eq(c.status.code, GRPC_STATUS_OK);
    }
}

Test(async, close_with_calls_in_flight_frees_them) {
    uint8_t buf[64];
    size_t len = encode_incr("left", buf, sizeof buf);
    drey_client *c = harness_client(&env.server);
    for (int i = 0; i < 50; i++)
        cr_assert(drey_client_start_call(c, DREY_CLIENT_CACHE("Increment"), buf, len, 10000, NULL));
    drey_client_close(c); /* cancels or collects all 50; ASan checks nothing leaks */
}
