/* The time rule for a token's claims, shared by verification and the
 * verified-token cache so a cached answer is exactly the one verification
 * would give (internal to auth). */
#ifndef DREY_AUTH_CLAIMS_H
#define DREY_AUTH_CLAIMS_H

#include <stdint.h>

#include "drey/status.h"

static inline int64_t drey_auth__sat_add(int64_t a, int64_t b) {
    int64_t r;
    if (__builtin_add_overflow(a, b, &r))
        return b > 0 ? INT64_MAX : INT64_MIN;
    return r;
}

static inline int64_t drey_auth__sat_sub(int64_t a, int64_t b) {
    int64_t r;
    if (__builtin_sub_overflow(a, b, &r))
        return b < 0 ? INT64_MAX : INT64_MIN;
    return r;
}

/* Expired when exp <= now - skew; not yet valid when the later of nbf and
 * iat (nbf_ms) > now + skew. All in ms. */
static inline drey_error drey_auth__check_times(int64_t exp_ms, int64_t nbf_ms, int64_t now_ms, int64_t skew_ms) {
    if (exp_ms <= drey_auth__sat_sub(now_ms, skew_ms))
        return DREY_ERR_TOKEN_EXPIRED;
    if (nbf_ms > drey_auth__sat_add(now_ms, skew_ms))
        return DREY_ERR_TOKEN_NOT_YET_VALID;
    return DREY_ERR_NONE;
}

#endif
