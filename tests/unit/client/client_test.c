/* Unit tests for src/client/client.c that need no server: option checks,
 * client-side statuses, and closing with calls in flight. */
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "drey/client.h"
#include "grpc/health/v1/health.pb-c.h"

/* A loopback port with a socket bound to it: refused when listen is false,
 * accepting connections that are never answered when it is true. */
static int socket_port(bool listening, int *fd_out) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    if (listening)
        cr_assert_eq(listen(fd, 16), 0);
    socklen_t len = sizeof sa;
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    *fd_out = fd;
    return ntohs(sa.sin_port);
}

static drey_client *open_port(int port) {
    char target[64], err[128];
    snprintf(target, sizeof target, "127.0.0.1:%d", port);
    drey_client *c = drey_client_open(&(drey_client_options){.target = target, .token = "t"}, err, sizeof err);
    cr_assert_not_null(c, "%s", err);
    return c;
}

Test(client, open_refuses_unusable_options) {
    char err[128] = "";
    cr_assert_null(drey_client_open(&(drey_client_options){.target = ""}, err, sizeof err));
    cr_assert_str_eq(err, "no target address");
    drey_client_header bad[] = {{"Bad Key", "v"}};
    cr_assert_null(drey_client_open(&(drey_client_options){.target = "127.0.0.1:1", .headers = bad, .n_headers = 1},
                                    err, sizeof err));
    cr_assert_neq(strstr(err, "Bad Key"), NULL, "%s", err);
    drey_client_close(NULL);
}

Test(client, open_and_close_without_calls) {
    drey_client *c = drey_client_open(&(drey_client_options){.target = "127.0.0.1:1", .max_recv_message_bytes = 1024},
                                      NULL, 0);
    cr_assert_not_null(c);
    cr_assert_eq(drey_client_in_flight(c), 0);
    drey_client_close(c);
}

Test(client, a_refused_connection_is_unavailable_without_details) {
    int fd, port = socket_port(false, &fd);
    drey_client *c = open_port(port);
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    ProtobufCMessage *resp = (ProtobufCMessage *)&req; /* must be reset */
    drey_client_status st;
    cr_assert_eq(drey_client_unary(c, DREY_CLIENT_HEALTH("Check"), &req.base,
                                   &grpc__health__v1__health_check_response__descriptor, 5000, &a, &resp, &st),
                 GRPC_STATUS_UNAVAILABLE, "%s: %s", drey_client_code_name(st.code), st.message);
    cr_assert_null(resp);
    cr_assert_null(st.details);
    cr_assert_str_eq(drey_client_status_reason(&st), "");
    ProtobufCBinaryData raw = {.len = 9};
    cr_assert_eq(drey_client_unary_raw(c, "/x.Y/Z", "", 0, 5000, &a, &raw, &st), GRPC_STATUS_UNAVAILABLE);
    cr_assert_eq(raw.len, 0);
    drey_client_close(c);
    drey_arena_destroy(&a);
    close(fd);
}

Test(client, a_deadline_of_zero_has_passed_before_the_call_starts) {
    int fd, port = socket_port(true, &fd);
    drey_client *c = open_port(port);
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    ProtobufCBinaryData raw;
    drey_client_status st;
    cr_assert_eq(drey_client_unary_raw(c, "/x.Y/Z", "", 0, 0, &a, &raw, &st), GRPC_STATUS_DEADLINE_EXCEEDED, "%s",
                 drey_client_code_name(st.code));
    drey_client_close(c);
    drey_arena_destroy(&a);
    close(fd);
}

Test(client, asynchronous_calls_complete_once_each_with_their_user_data) {
    int fd, port = socket_port(false, &fd);
    drey_client *c = open_port(port);
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    enum { N = 8 };
    int seen[N] = {0};
    drey_client_completion done;
    cr_assert_not(drey_client_next(c, DREY_CLIENT_NO_DEADLINE, &a, &done), "nothing in flight: no wait");
    for (int i = 0; i < N; i++)
        cr_assert(drey_client_start_call(c, "/x.Y/Z", "ab", 2, 5000, &seen[i]));
    cr_assert_eq(drey_client_in_flight(c), N);
    for (int i = 0; i < N; i++) {
        cr_assert(drey_client_next(c, 10000, &a, &done));
        int *slot = done.user;
        cr_assert(slot >= seen && slot < seen + N);
        (*slot)++;
        cr_assert_eq(done.status.code, GRPC_STATUS_UNAVAILABLE);
        cr_assert_eq(done.response.len, 0);
        cr_assert_geq(done.elapsed_ns, 0);
    }
    for (int i = 0; i < N; i++)
        cr_assert_eq(seen[i], 1, "call %d completed %d times", i, seen[i]);
    cr_assert_eq(drey_client_in_flight(c), 0);
    cr_assert_not(drey_client_next(c, DREY_CLIENT_NO_DEADLINE, &a, &done));
    drey_client_close(c);
    drey_arena_destroy(&a);
    close(fd);
}

Test(client, next_times_out_while_calls_hang, .timeout = 30) {
    int fd, port = socket_port(true, &fd); /* accepts, never answers */
    drey_client *c = open_port(port);
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    cr_assert(drey_client_start_call(c, "/x.Y/Z", "", 0, DREY_CLIENT_NO_DEADLINE, NULL));
    drey_client_completion done;
    cr_assert_not(drey_client_next(c, 50, &a, &done));
    cr_assert_eq(drey_client_in_flight(c), 1);
    drey_client_close(c);
    drey_arena_destroy(&a);
    close(fd);
}

Test(client, close_cancels_calls_in_flight, .timeout = 30) {
    int fd, port = socket_port(true, &fd);
    drey_client *c = open_port(port);
    for (int i = 0; i < 16; i++)
        cr_assert(drey_client_start_call(c, i % 2 ? "/x.Y/Z" : "/x.Y/W", "payload", 7, DREY_CLIENT_NO_DEADLINE, NULL));
    cr_assert_eq(drey_client_in_flight(c), 16);
    drey_client_close(c); /* returns: every call cancelled and freed (ASan checks the freeing) */
    close(fd);
}

Test(client, a_stream_to_nowhere_ends_with_its_status) {
    int fd, port = socket_port(false, &fd);
    drey_client *c = open_port(port);
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    drey_client_status st;
    drey_client_stream *s = drey_client_stream_start(c, DREY_CLIENT_HEALTH("Watch"), &req.base, 5000, &st);
    cr_assert_not_null(s);
    ProtobufCMessage *m;
    cr_assert_not(drey_client_stream_read(s, &grpc__health__v1__health_check_response__descriptor, &a, &m));
    cr_assert_null(m);
    cr_assert_eq(drey_client_stream_finish(s, &a, &st), GRPC_STATUS_UNAVAILABLE);
    drey_client_close(c);
    drey_arena_destroy(&a);
    close(fd);
}

Test(client, a_cancelled_stream_finishes_cancelled, .timeout = 30) {
    int fd, port = socket_port(true, &fd);
    drey_client *c = open_port(port);
    drey_arena a;
    drey_arena_init(&a, NULL, 0);
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    drey_client_status st;
    drey_client_stream *s = drey_client_stream_start(c, DREY_CLIENT_HEALTH("Watch"), &req.base,
                                                     DREY_CLIENT_NO_DEADLINE, &st);
    cr_assert_not_null(s);
    drey_client_stream_cancel(s);
    cr_assert_eq(drey_client_stream_finish(s, &a, &st), GRPC_STATUS_CANCELLED, "%s", drey_client_code_name(st.code));
    drey_client_close(c);
    drey_arena_destroy(&a);
    close(fd);
}

Test(client, close_cancels_and_frees_open_streams, .timeout = 30) {
    int fd, port = socket_port(true, &fd);
    drey_client *c = open_port(port);
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    drey_client_status st;
    for (int i = 0; i < 3; i++)
        cr_assert_not_null(
            drey_client_stream_start(c, DREY_CLIENT_HEALTH("Watch"), &req.base, DREY_CLIENT_NO_DEADLINE, &st));
    drey_client_close(c); /* returns; ASan checks the streams were freed */
    close(fd);
}
