/*
 * Fuzz target: what a client makes of a server's grpc-status-details-bin
 * (src/client/status.c): the C client, the CLI and the load generator
 * decode a google.rpc.Status and its Any details from whatever the server
 * at the other end sends, and read reasons, metadata, field violations and
 * the retry delay from them.
 *
 * Properties: the accessors answer for any decoded status (no overflow in
 * the retry delay: UBSan checks), and a retry delay is -1 or not negative.
 */
#include <stdint.h>
#include <string.h>

#include "drey/arena.h"
#include "drey/client.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char buf[2048];
    drey_arena a;
    drey_arena_init(&a, buf, sizeof buf);
    drey_client_status st;
    drey_client_status_set(&st, GRPC_STATUS_INVALID_ARGUMENT, NULL);
    if (drey_client_status_decode_details(&st, data, size, &a)) {
        (void)strlen(drey_client_status_reason(&st));
        (void)strlen(drey_client_status_domain(&st));
        const char *v = drey_client_status_metadata(&st, "limitBytes");
        if (v != NULL)
            (void)strlen(v);
        (void)drey_client_status_violation(&st, "key");
        int64_t d = drey_client_status_retry_delay_ms(&st);
        FUZZ_CHECK(d >= -1, "retry delay %lld", (long long)d);
    }
    drey_arena_destroy(&a);
    return 0;
}
