/*
 * The rpc module's one C++ translation unit: abseil has no C API.
 */
#include "absl.h"

#include <absl/base/internal/sysinfo.h>

void drey_rpc__absl_cpu_frequency(void) {
    (void)absl::base_internal::NominalCPUFrequency();
}
