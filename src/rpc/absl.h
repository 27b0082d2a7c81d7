/*
 * What the rpc module asks of the abseil under gRPC (C++, reached from C).
 */
#ifndef DREY_RPC_ABSL_H
#define DREY_RPC_ABSL_H

#ifdef __cplusplus
extern "C" {
#endif

/* abseil's nominal CPU frequency, measured once per process on first use
 * (absl::base_internal::NominalCPUFrequency): the first call opens
 * /sys/devices/system/cpu/cpu0/tsc_freq_khz, which VMs often lack, and
 * leaves errno ENOENT; later calls touch nothing. */
void drey_rpc__absl_cpu_frequency(void);

/* Turns off absl::Mutex's lock-order (deadlock) detection. Debian's abseil
 * is built with it on: every absl::Mutex that gRPC takes updates a graph of
 * lock orders (GraphCycles::GetId, UpdateStackTrace), about 4 % of dreyd's
 * CPU under load and as much of a client's. It sees only gRPC's own
 * mutexes (drey's are pthread mutexes), so it checks gRPC, not drey. The
 * mode is one global flag: setting it again while other threads lock is
 * harmless. */
void drey_rpc__absl_deadlock_detection_off(void);

#ifdef __cplusplus
}
#endif

#endif
