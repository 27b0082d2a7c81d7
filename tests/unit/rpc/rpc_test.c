/*
 * Unit tests for src/rpc/rpc.c: messages through gRPC byte buffers (one
 * slice or several, valid or not) and the status code names that the CLI,
 * the metrics and the logs print.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/grpc.h>

#include "drey/rpc.h"
#include "grpc/health/v1/health.pb-c.h"
#include "src/rpc/absl.h"

void rpc_test_lock_in_both_orders(void); /* lock_order.cc */

static Grpc__Health__V1__HealthCheckRequest *roundtrip(grpc_byte_buffer *bb) {
    return (Grpc__Health__V1__HealthCheckRequest *)drey_rpc_unpack(
        bb, &grpc__health__v1__health_check_request__descriptor, NULL);
}

Test(rpc, a_packed_message_unpacks_to_the_same) {
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = "drey.cache.v1.Cache";
    grpc_byte_buffer *bb = drey_rpc_pack(&req.base);
    Grpc__Health__V1__HealthCheckRequest *got = roundtrip(bb);
    cr_assert(ne(ptr, got, NULL));
    cr_assert(eq(str, got->service, "drey.cache.v1.Cache"));
    protobuf_c_message_free_unpacked(&got->base, NULL);
    grpc_byte_buffer_destroy(bb);
}

Test(rpc, a_message_in_several_slices_is_flattened) {
    /* The service name field (1) split across three slices. */
    static const char wire[] = "\x0a\x05" "drey!";
    grpc_slice parts[3] = {grpc_slice_from_copied_buffer(wire, 2), grpc_slice_from_copied_buffer(wire + 2, 3),
                           grpc_slice_from_copied_buffer(wire + 5, 2)};
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(parts, 3);
    for (int i = 0; i < 3; i++)
        grpc_slice_unref(parts[i]);
    grpc_slice flat = drey_rpc_flatten(bb);
    cr_assert(eq(sz, GRPC_SLICE_LENGTH(flat), 7));
    cr_assert(eq(int, memcmp(GRPC_SLICE_START_PTR(flat), wire, 7), 0));
    grpc_slice_unref(flat);
    Grpc__Health__V1__HealthCheckRequest *got = roundtrip(bb);
    cr_assert(eq(str, got->service, "drey!"));
    protobuf_c_message_free_unpacked(&got->base, NULL);
    grpc_byte_buffer_destroy(bb);
}

Test(rpc, copied_bytes_are_the_callers_bytes) {
    uint8_t bytes[4] = {1, 2, 3, 4};
    grpc_byte_buffer *bb = drey_rpc_copy(bytes, sizeof bytes);
    bytes[0] = 9; /* a copy: the buffer keeps what was given */
    grpc_slice flat = drey_rpc_flatten(bb);
    cr_assert(eq(sz, GRPC_SLICE_LENGTH(flat), 4));
    cr_assert(eq(u8, GRPC_SLICE_START_PTR(flat)[0], 1));
    grpc_slice_unref(flat);
    grpc_byte_buffer_destroy(bb);
}

Test(rpc, bytes_that_are_not_the_type_unpack_to_null) {
    static const uint8_t junk[] = {0x0a, 0x7f, 'x'}; /* a length past the end */
    grpc_byte_buffer *bb = drey_rpc_copy(junk, sizeof junk);
    cr_assert(eq(ptr, roundtrip(bb), NULL));
    grpc_byte_buffer_destroy(bb);
}

Test(rpc, code_names_are_grpcs_and_null_outside) {
    cr_assert(eq(str, (char *)drey_rpc_code_name(GRPC_STATUS_OK), "OK"));
    cr_assert(eq(str, (char *)drey_rpc_code_name(GRPC_STATUS_FAILED_PRECONDITION), "FAILED_PRECONDITION"));
    cr_assert(eq(str, (char *)drey_rpc_code_name(GRPC_STATUS_UNAUTHENTICATED), "UNAUTHENTICATED"));
    cr_assert(eq(ptr, (void *)drey_rpc_code_name((grpc_status_code)17), NULL));
    cr_assert(eq(ptr, (void *)drey_rpc_code_name((grpc_status_code)-1), NULL));
}

/* Once drey_rpc_init has run, abseil's CPU measurement is done: no later
 * use of it (the gRPC core's, between a connect() and the check of its
 * errno) sets errno. It can tell only where the measurement's sysfs file
 * is missing (this machine, most VMs); elsewhere it never sets errno. */
Test(rpc, after_init_abseils_cpu_measurement_leaves_errno_alone) {
    drey_rpc_init();
    errno = 0;
    drey_rpc__absl_cpu_frequency();
    cr_assert(eq(int, errno, 0), "errno %d (%s): a connect in progress would fail with it", errno, strerror(errno));
    grpc_shutdown();
}

/* After drey_rpc_init abseil no longer tracks the order gRPC's mutexes are
 * taken in (a cost of every lock): two mutexes locked in both orders, in a
 * child whose stderr is kept, neither abort it nor have abseil report a
 * potential deadlock. With the detection on, as Debian builds abseil, the
 * child does one or the other. */
Test(rpc, after_init_abseil_tracks_no_lock_order) {
    FILE *err = tmpfile();
    cr_assert(ne(ptr, err, NULL));
    pid_t pid = fork();
    cr_assert(ge(int, pid, 0));
    if (pid == 0) {
        dup2(fileno(err), STDERR_FILENO);
        drey_rpc_init();
        rpc_test_lock_in_both_orders();
        _exit(0);
    }
    int status = 0;
    cr_assert(eq(int, waitpid(pid, &status, 0), pid));
    char said[4096] = "";
    rewind(err);
    said[fread(said, 1, sizeof said - 1, err)] = '\0';
    fclose(err);
    bool exited_0 = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    cr_assert(exited_0, "the child ended with status %#x: %s", status, said);
    cr_assert(eq(ptr, strstr(said, "deadlock"), NULL), "abseil reported: %s", said);
}
