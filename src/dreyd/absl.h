/*
 * What dreyd asks of the abseil under gRPC (C++, reached from C).
 */
#ifndef DREYD_ABSL_H
#define DREYD_ABSL_H

#ifdef __cplusplus
extern "C" {
#endif

/* Turns off absl::Mutex's lock-order (deadlock) detection. Debian's abseil
 * is built with it on: every absl::Mutex that gRPC takes updates a graph of
 * lock orders (GraphCycles::GetId, UpdateStackTrace), about 4 % of dreyd's
 * CPU under load. It sees only gRPC's own mutexes (drey's are pthread
 * mutexes), so it checks gRPC, not drey. Call it before anything starts
 * gRPC (grpc_init), while the process has one thread. */
void dreyd_absl_deadlock_detection_off(void);

#ifdef __cplusplus
}
#endif

#endif
