/*
 * Two absl::Mutexes locked in both orders: the pattern abseil's lock-order
 * detection reports as a potential deadlock (or aborts on), for
 * rpc_test.c. C++: abseil's mutexes have no C API.
 */
#include <absl/synchronization/mutex.h>

extern "C" void rpc_test_lock_in_both_orders(void) {
    absl::Mutex a, b;
    a.Lock();
    b.Lock();
    b.Unlock();
    a.Unlock();
    b.Lock();
    a.Lock();
    a.Unlock();
    b.Unlock();
}
