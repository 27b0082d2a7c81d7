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

#ifdef __cplusplus
}
#endif

#endif
