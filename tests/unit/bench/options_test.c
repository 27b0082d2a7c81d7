/*
 * drey-bench's command line: --pipeline goes with --cluster (each
 * operation on its owner's stream), and still not with what is no cache
 * operation (--raw-method, health). A usage error exits 2.
 */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <stdlib.h>

#include "src/bench/bench.h"

#define PARSE(o, ...)                                                                                                  \
    do {                                                                                                               \
        char *argv[] = {"drey-bench", __VA_ARGS__};                                                                    \
        drey_bench_options_parse(o, (int)(sizeof argv / sizeof argv[0]), argv);                                        \
    } while (0)

static void quiet(void) {
    cr_redirect_stderr();
}

Test(options, pipeline_with_cluster) {
    drey_bench_options o;
    PARSE(&o, "--target=127.0.0.1:1", "--cluster", "--pipeline=64", "--mix=get:1,set:1");
    cr_assert(o.cluster);
    cr_assert_eq(o.pipeline, 64);
    cr_assert_eq(o.mix[DREY_BENCH_SET], 1);
}

Test(options, pipeline_alone) {
    drey_bench_options o;
    PARSE(&o, "--pipeline", "16");
    cr_assert(!o.cluster);
    cr_assert_eq(o.pipeline, 16);
}

Test(options, pipeline_with_health_refused, .init = quiet, .exit_code = 2) {
    drey_bench_options o;
    PARSE(&o, "--cluster", "--pipeline=8", "--mix=health:1");
}

Test(options, pipeline_with_raw_method_refused, .init = quiet, .exit_code = 2) {
    drey_bench_options o;
    PARSE(&o, "--pipeline=8", "--raw-method=/x.Y/Z", "--key-bytes=32");
}

Test(options, pipeline_zero_refused, .init = quiet, .exit_code = 2) {
    drey_bench_options o;
    PARSE(&o, "--cluster", "--pipeline=0");
}
