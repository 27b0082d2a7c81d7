/*
 * drey-bench — load generator for drey and any other gRPC server (raw mode).
 * See bench.h for the parts and `drey-bench --help` for the options.
 *
 *   drey-bench --target=127.0.0.1:50051 --connections=16 --streams=64 --mix=get --duration=10s
 *   drey-bench --target=127.0.0.1:2379 --raw-method=/etcdserverpb.KV/Put --raw-payloads=put.bin --json
 *
 * It prints numbers and never judges them: the exit status is 0 whenever the
 * run took place (errors are part of the report), 1 when it could not start
 * and 2 on a usage error.
 */
#include <stdio.h>
#include <stdlib.h>

#include "drey/alloc.h"
#include "bench.h"

int main(int argc, char **argv) {
    drey_bench_options o;
    drey_bench_options_parse(&o, argc, argv);
    drey_bench_result *r = drey_xcalloc(1, sizeof *r);
    char err[512];
    if (!drey_bench_run(&o, r, err, sizeof err)) {
        fprintf(stderr, "drey-bench: %s\n", err);
        free(r);
        return 1;
    }
    if (o.json)
        drey_bench_report_json(&o, r);
    else
        drey_bench_report_text(&o, r);
    free(r);
    return 0;
}
