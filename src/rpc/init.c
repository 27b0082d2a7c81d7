/*
 * rpc — starting the gRPC core; see drey_rpc_init in include/drey/rpc.h.
 */
#include "drey/rpc.h"

#include "absl.h"

void drey_rpc_init(void) {
    drey_rpc__absl_deadlock_detection_off();
    drey_rpc__absl_cpu_frequency();
    grpc_init();
}
