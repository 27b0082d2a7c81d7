/*
 * The one C++ translation unit of dreyd: abseil's settings have no C API.
 */
#include "absl.h"

#include <absl/synchronization/mutex.h>

void dreyd_absl_deadlock_detection_off(void) {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}
