/*
 * The rpc module's one C++ translation unit: abseil has no C API.
 */
#include "absl.h"

#include <absl/base/internal/sysinfo.h>
#include <absl/synchronization/mutex.h>

void drey_rpc__absl_cpu_frequency(void) {
    (void)absl::base_internal::NominalCPUFrequency();
}

void drey_rpc__absl_deadlock_detection_off(void) {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}
