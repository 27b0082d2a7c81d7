/*
 * rpc — starting the gRPC core; see drey_rpc_init in include/drey/rpc.h.
 * Apart from the message helpers: only what starts the core links abseil's
 * C++ side (the fuzz targets link the helpers alone).
 */
#include "drey/rpc.h"

#include "absl.h"

void drey_rpc_init(void) {
    drey_rpc__absl_cpu_frequency();
    grpc_init();
}
