/* The C client's pipelined calls (drey_client_pipeline_*) against the real
 * dreyd: ordered results with their ids, a refused operation decoded as a
 * unary failure would be, raw operations, a long stream with durable sets,
 * cancellation and per-operation timeouts. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "harness.h"

static harness_env env;

static const char *const flags[] = {"--pipeline-window=32", NULL};

static void up(void) {
    harness_up(&env, flags);
}

static void down(void) {
    harness_down(&env);
}

TestSuite(pipeline, .init = up, .fini = down, .timeout = 120);

static drey_client_pipeline *open_pipeline(void) {
    drey_client_status st;
    drey_client_pipeline *p = drey_client_pipeline_open(env.client, 60000, &st);
    cr_assert_not_null(p, "%s", st.message);
    return p;
}

/* Reads results until n have come, into out (in env.arena). */
static void read_results(drey_client_pipeline *p, Drey__Cache__V1__PipelineResult **out, size_t n) {
    size_t got = 0;
    while (got < n) {
        Drey__Cache__V1__PipelineResponse *resp;
        cr_assert(drey_client_pipeline_next(p, 30000, &env.arena, &resp), "result %zu of %zu did not come", got, n);
        for (size_t i = 0; i < resp->n_results; i++) {
            cr_assert_lt(got, n, "more results than operations");
            out[got++] = resp->results[i];
        }
    }
}

static void finish_ok(drey_client_pipeline *p) {
    drey_client_status st;
    cr_assert_eq(drey_client_pipeline_finish(p, &env.arena, &st), GRPC_STATUS_OK, "%s %s",
                 drey_client_code_name(st.code), st.message);
}

Test(pipeline, results_come_in_order_and_a_get_sees_the_set_before_it) {
    drey_client_pipeline *p = open_pipeline();
    Drey__Cache__V1__SetRequest set = DREY__CACHE__V1__SET_REQUEST__INIT;
    set.key = "ordered";
    set.value = harness_string(&env, "first");
    Drey__Cache__V1__GetRequest get = DREY__CACHE__V1__GET_REQUEST__INIT;
    get.key = "ordered";
    Drey__Cache__V1__SetRequest bad = DREY__CACHE__V1__SET_REQUEST__INIT;
    bad.key = ""; /* INVALID_KEY */
    bad.value = harness_string(&env, "x");
    cr_assert(drey_client_pipeline_add(p, 10, &set.base, DREY_CLIENT_NO_DEADLINE));
    cr_assert(drey_client_pipeline_add(p, 11, &get.base, DREY_CLIENT_NO_DEADLINE));
    cr_assert(drey_client_pipeline_add(p, 12, &bad.base, DREY_CLIENT_NO_DEADLINE));
    cr_assert(drey_client_pipeline_add(p, 13, &get.base, 0)); /* its timeout has passed when it is read */
    Drey__Cache__V1__Value v = DREY__CACHE__V1__VALUE__INIT;
    cr_assert_not(drey_client_pipeline_add(p, 14, &v.base, DREY_CLIENT_NO_DEADLINE), "a Value is no operation");
    cr_assert_not(drey_client_pipeline_add_raw(p, 14, "Pipeline", "", 0, DREY_CLIENT_NO_DEADLINE));
    cr_assert_eq(drey_client_pipeline_pending(p), 4);
    cr_assert(drey_client_pipeline_flush(p));

    Drey__Cache__V1__PipelineResult *r[4];
    read_results(p, r, 4);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(r[i]->id, 10u + (unsigned)i);
    drey_client_status st;
    cr_assert_eq(drey_client_pipeline_result_status(r[0], &env.arena, &st), GRPC_STATUS_OK);
    const Drey__Cache__V1__SetResponse *sr = (const void *)drey_client_pipeline_result_response(r[0]);
    cr_assert_not_null(sr);
    cr_assert_eq(sr->base.descriptor, &drey__cache__v1__set_response__descriptor);
    const Drey__Cache__V1__GetResponse *gr = (const void *)drey_client_pipeline_result_response(r[1]);
    cr_assert(gr->found);
    cr_assert_str_eq(gr->value->string_value, "first");
    cr_assert_eq(gr->version, sr->version);

    cr_assert_eq(drey_client_pipeline_result_status(r[2], &env.arena, &st), GRPC_STATUS_INVALID_ARGUMENT);
    cr_assert_null(drey_client_pipeline_result_response(r[2]));
    cr_assert_str_eq(drey_client_status_reason(&st), "INVALID_KEY");
    cr_assert_not_null(drey_client_status_violation(&st, "key"));
    /* the same as the unary call says */
    drey_client_status unary;
    harness_fails(&env, DREY_CLIENT_CACHE("Set"), &bad.base, &drey__cache__v1__set_response__descriptor,
                  GRPC_STATUS_INVALID_ARGUMENT, &unary);
    cr_assert_str_eq(st.message, unary.message);

    cr_assert_eq(drey_client_pipeline_result_status(r[3], &env.arena, &st), GRPC_STATUS_DEADLINE_EXCEEDED);
    finish_ok(p);
}

/* Durable sets and gets by raw bytes, many more than the window, read while
 * they are sent. */
Test(pipeline, a_long_stream_of_raw_operations) {
    enum { N = 20000, PER = 100 };
    drey_client_pipeline *p = open_pipeline();
    size_t got = 0;
    uint8_t buf[128];
    for (int i = 0; i < N; i++) {
        char key[32], val[32];
        snprintf(key, sizeof key, "long-%d", i / 2 % 500);
        snprintf(val, sizeof val, "%d", i - i % 2);
        size_t len;
        const char *method;
        if (i % 2 == 0) {
            Drey__Cache__V1__SetRequest set = DREY__CACHE__V1__SET_REQUEST__INIT;
            Drey__Cache__V1__Value v = DREY__CACHE__V1__VALUE__INIT;
            v.kind_case = DREY__CACHE__V1__VALUE__KIND_STRING_VALUE;
            v.string_value = val;
            set.key = key;
            set.value = &v;
            len = protobuf_c_message_pack(&set.base, buf);
            method = "Set";
        } else {
            Drey__Cache__V1__GetRequest get = DREY__CACHE__V1__GET_REQUEST__INIT;
            get.key = key;
            len = protobuf_c_message_pack(&get.base, buf);
            method = DREY_CLIENT_CACHE("Get");
        }
        cr_assert(drey_client_pipeline_add_raw(p, (uint64_t)i + 1, method, buf, len, 30000));
        if ((i + 1) % PER != 0)
            continue;
        cr_assert(drey_client_pipeline_flush(p));
        /* keep at most a few messages unanswered */
        while ((size_t)i + 1 - got > 4 * PER) {
            Drey__Cache__V1__PipelineResponse *resp;
            cr_assert(drey_client_pipeline_next(p, 30000, &env.arena, &resp));
            for (size_t k = 0; k < resp->n_results; k++, got++) {
                Drey__Cache__V1__PipelineResult *r = resp->results[k];
                cr_assert_eq(r->id, got + 1);
                cr_assert_null(r->status, "op %zu failed: %s", got, r->status->message);
                if (got % 2 == 1) {
                    char want[32];
                    snprintf(want, sizeof want, "%zu", got - 1);
                    cr_assert_str_eq(r->get->value->string_value, want);
                }
            }
            drey_arena_reset(&env.arena);
        }
    }
    drey_client_pipeline_close_send(p);
    Drey__Cache__V1__PipelineResponse *resp;
    while (drey_client_pipeline_next(p, 30000, &env.arena, &resp)) {
        for (size_t k = 0; k < resp->n_results; k++, got++)
            cr_assert_eq(resp->results[k]->id, got + 1);
        drey_arena_reset(&env.arena);
    }
    cr_assert_eq(got, N);
    finish_ok(p);
}

Test(pipeline, a_cancelled_stream_ends_cancelled) {
    drey_client_pipeline *p = open_pipeline();
    Drey__Cache__V1__GetRequest get = DREY__CACHE__V1__GET_REQUEST__INIT;
    get.key = "c";
    for (int i = 0; i < 100; i++)
        cr_assert(drey_client_pipeline_add(p, (uint64_t)i, &get.base, DREY_CLIENT_NO_DEADLINE));
    cr_assert(drey_client_pipeline_flush(p));
    drey_client_pipeline_cancel(p);
    drey_client_status st;
    cr_assert_eq(drey_client_pipeline_finish(p, &env.arena, &st), GRPC_STATUS_CANCELLED);
    /* the node goes on serving */
    harness_ok(&env, DREY_CLIENT_CACHE("Get"), &get.base, &drey__cache__v1__get_response__descriptor);
}

Test(pipeline, an_empty_stream_ends_ok) {
    finish_ok(open_pipeline());
}

Test(pipeline, next_times_out_and_a_half_closed_stream_sends_nothing) {
    drey_client_pipeline *p = open_pipeline();
    Drey__Cache__V1__PipelineResponse *resp;
    cr_assert_not(drey_client_pipeline_next(p, 50, &env.arena, &resp), "nothing was sent: nothing comes");
    cr_assert_null(resp);
    Drey__Cache__V1__GetRequest get = DREY__CACHE__V1__GET_REQUEST__INIT;
    get.key = "h";
    cr_assert(drey_client_pipeline_add(p, 1, &get.base, DREY_CLIENT_NO_DEADLINE));
    drey_client_pipeline_close_send(p); /* flushes the one added */
    cr_assert(drey_client_pipeline_add(p, 2, &get.base, DREY_CLIENT_NO_DEADLINE));
    cr_assert_not(drey_client_pipeline_flush(p), "flushed after the half-close");
    cr_assert(drey_client_pipeline_next(p, 30000, &env.arena, &resp));
    cr_assert_eq(resp->n_results, 1);
    cr_assert_eq(resp->results[0]->id, 1);
    cr_assert_not(drey_client_pipeline_next(p, 30000, &env.arena, &resp), "the stream ended");
    finish_ok(p);
}

/* A server that is not there: the stream ends UNAVAILABLE. */
Test(pipeline, no_server_ends_unavailable) {
    drey_client *c = drey_client_open(&(drey_client_options){.target = "127.0.0.1:1"}, (char[64]){0}, 64);
    cr_assert_not_null(c);
    drey_client_status st;
    drey_client_pipeline *p = drey_client_pipeline_open(c, 5000, &st);
    cr_assert_not_null(p);
    Drey__Cache__V1__GetRequest get = DREY__CACHE__V1__GET_REQUEST__INIT;
    get.key = "x";
    drey_client_pipeline_add(p, 1, &get.base, DREY_CLIENT_NO_DEADLINE);
    drey_client_pipeline_flush(p);
    Drey__Cache__V1__PipelineResponse *resp;
    cr_assert_not(drey_client_pipeline_next(p, 30000, &env.arena, &resp));
    cr_assert_eq(drey_client_pipeline_finish(p, &env.arena, &st), GRPC_STATUS_UNAVAILABLE, "%s",
                 drey_client_code_name(st.code));
    drey_client_close(c);
}
