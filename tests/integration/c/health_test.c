/* grpc.health.v1.Health through the C client against the real dreyd: Check,
 * and Watch across a drain (SIGTERM). */
#include <criterion/criterion.h>
#include <signal.h>
#include <string.h>

#include "grpc/health/v1/health.pb-c.h"
#include "harness.h"

#define SERVING GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
#define NOT_SERVING GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
#define SERVICE_UNKNOWN GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVICE_UNKNOWN

static harness_env env;

static void up(void) {
    harness_up(&env, NULL);
}

/* A long grace period: health is NOT_SERVING while calls are still taken.
 * harness_stop's SIGTERM is then the second signal, which ends it. */
static void up_with_grace(void) {
    static const char *const flags[] = {"--drain-grace=60s", NULL};
    harness_up(&env, flags);
}

static void down(void) {
    harness_down(&env);
}

TestSuite(health, .init = up, .fini = down, .timeout = 60);
TestSuite(drain, .init = up_with_grace, .fini = down, .timeout = 60);

static Grpc__Health__V1__HealthCheckResponse__ServingStatus check(const char *service) {
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)service;
    Grpc__Health__V1__HealthCheckResponse *r =
        harness_ok(&env, DREY_CLIENT_HEALTH("Check"), &req.base, &grpc__health__v1__health_check_response__descriptor);
    return r->status;
}

static drey_client_stream *watch(const char *service) {
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = (char *)service;
    drey_client_status st;
    drey_client_stream *s = drey_client_stream_start(env.client, DREY_CLIENT_HEALTH("Watch"), &req.base, 30000, &st);
    cr_assert_not_null(s, "%s", st.message);
    return s;
}

/* The next status on the stream; asserts one arrives. */
static Grpc__Health__V1__HealthCheckResponse__ServingStatus next_status(drey_client_stream *s) {
    ProtobufCMessage *m;
    cr_assert(drey_client_stream_read(s, &grpc__health__v1__health_check_response__descriptor, &env.arena, &m),
              "the stream ended early");
    return ((Grpc__Health__V1__HealthCheckResponse *)m)->status;
}

Test(health, check_reports_the_server_and_the_cache_service) {
    cr_assert_eq(check(""), SERVING);
    cr_assert_eq(check("drey.cache.v1.Cache"), SERVING);
}

Test(health, check_of_an_unknown_service_is_not_found) {
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = "no.such.Service";
    drey_client_status st;
    harness_fails(&env, DREY_CLIENT_HEALTH("Check"), &req.base, &grpc__health__v1__health_check_response__descriptor,
                  GRPC_STATUS_NOT_FOUND, &st);
    cr_assert_str_eq(drey_client_status_reason(&st), "UNKNOWN_SERVICE");
    cr_assert_str_eq(drey_client_status_domain(&st), "drey.dev");
}

Test(health, watch_of_an_unknown_service_says_so_and_stays_open) {
    drey_client_stream *s = watch("no.such.Service");
    cr_assert_eq(next_status(s), SERVICE_UNKNOWN);
    /* Still open: only cancelling ends it. */
    drey_client_stream_cancel(s);
    ProtobufCMessage *m;
    cr_assert_not(drey_client_stream_read(s, &grpc__health__v1__health_check_response__descriptor, &env.arena, &m));
    drey_client_status st;
    cr_assert_eq(drey_client_stream_finish(s, &env.arena, &st), GRPC_STATUS_CANCELLED, "%s",
                 drey_client_code_name(st.code));
}

Test(health, watch_sees_serving_then_not_serving_on_sigterm_and_ends_ok) {
    drey_client_stream *s = watch("");
    drey_client_stream *cache = watch("drey.cache.v1.Cache");
    cr_assert_eq(next_status(s), SERVING);
    cr_assert_eq(next_status(cache), SERVING);
    harness_signal(&env.server, SIGTERM);
    cr_assert_eq(next_status(s), NOT_SERVING);
    cr_assert_eq(next_status(cache), NOT_SERVING);
    drey_client_status st;
    ProtobufCMessage *m;
    cr_assert_not(drey_client_stream_read(s, &grpc__health__v1__health_check_response__descriptor, &env.arena, &m),
                  "the drain ends the stream");
    cr_assert_eq(drey_client_stream_finish(s, &env.arena, &st), GRPC_STATUS_OK, "%s: %s",
                 drey_client_code_name(st.code), st.message);
    cr_assert_eq(drey_client_stream_finish(cache, &env.arena, &st), GRPC_STATUS_OK, "%s: %s",
                 drey_client_code_name(st.code), st.message);
}

Test(drain, during_the_grace_period_calls_work_and_health_is_not_serving) {
    drey_client_stream *s = watch("");
    cr_assert_eq(next_status(s), SERVING);
    harness_signal(&env.server, SIGTERM);
    cr_assert_eq(next_status(s), NOT_SERVING); /* the drain has happened */
    drey_client_status st;
    cr_assert_eq(drey_client_stream_finish(s, &env.arena, &st), GRPC_STATUS_OK);

    cr_assert_eq(check(""), NOT_SERVING);
    cr_assert_eq(check("drey.cache.v1.Cache"), NOT_SERVING);
    drey_client_stream *late = watch("");
    cr_assert_eq(next_status(late), NOT_SERVING);
    ProtobufCMessage *m;
    cr_assert_not(drey_client_stream_read(late, &grpc__health__v1__health_check_response__descriptor, &env.arena, &m),
                  "a Watch started while draining ends at once");
    cr_assert_eq(drey_client_stream_finish(late, &env.arena, &st), GRPC_STATUS_OK);

    Drey__Cache__V1__IncrementRequest req = DREY__CACHE__V1__INCREMENT_REQUEST__INIT;
    req.key = "still";
    req.delta = 1;
    Drey__Cache__V1__IncrementResponse *r = harness_ok(&env, DREY_CLIENT_CACHE("Increment"), &req.base,
                                                       &drey__cache__v1__increment_response__descriptor);
    cr_assert_eq(r->value, 1, "the cache still answers during the grace period");
}
