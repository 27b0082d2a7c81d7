/*
 * verify — one `authorization` header value in, a subject or a reason out.
 *
 * The order of the checks is the error contract (first failure wins):
 *
 *   empty header                                       TOKEN_MISSING
 *   longer than "Bearer " + max_token_bytes            TOKEN_TOO_LARGE
 *     (decided on the length alone, before any parsing)
 *   not "Bearer" (any case) and spaces                 TOKEN_MALFORMED
 *   -- the verified-token cache is consulted here: a hit is a token,
 *      byte for byte, that passed every check below --
 *   not three non-empty base64url segments joined by
 *     dots                                             TOKEN_MALFORMED
 *   header segment not a JSON object                   TOKEN_MALFORMED
 *   "alg" missing, not a string, or "none" (any case)  TOKEN_ALGORITHM
 *   "kid" not a string, "typ" other than JWT (libjwt
 *     1.10 refuses it), "crit" present                 TOKEN_MALFORMED
 *   no key with that kid (no kid: unless exactly one
 *     key is configured)                               TOKEN_UNKNOWN_KEY
 *   "alg" is not exactly the key's algorithm           TOKEN_ALGORITHM
 *   libjwt refuses the token: payload not a JSON
 *     object                                           TOKEN_MALFORMED
 *                             otherwise                TOKEN_BAD_SIGNATURE
 *   exp missing or not a number, nbf or iat present
 *     but not numbers (NumericDate, fractions allowed) TOKEN_INVALID
 *   exp <= now - skew                                  TOKEN_EXPIRED
 *   nbf or iat > now + skew                            TOKEN_NOT_YET_VALID
 *   iss != the configured issuer                       TOKEN_WRONG_ISSUER
 *   aud (a string, or an array of them) does not
 *     name the configured audience                     TOKEN_WRONG_AUDIENCE
 *   sub present but not a string, or too long for
 *     the caller's buffer (never truncated)            TOKEN_INVALID
 *
 * The header is parsed here, not by libjwt, so that the algorithm is pinned
 * before libjwt sees the token: libjwt 1.10 would verify an HS256 token
 * against an RSA key's PEM text used as the HMAC secret. HS signatures are
 * libjwt's to check: it is always given the secret, and its idea of the
 * algorithm is compared with the key's once more afterwards. RS and ES
 * signatures are checked here, with the key OpenSSL parsed at load, and
 * only then does libjwt decode the token, without a key: libjwt 1.10 takes
 * PEM text and parses it on every call, 0.3 ms with OpenSSL 3's decoders,
 * which every forged token would cost again (tests/bench/auth_verify).
 * libjwt checks no claims: exp, nbf, iat, iss and aud are checked here.
 *
 * Nothing here logs: the caller reports the reason; tokens and claims never
 * reach the log.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>
#include <jwt.h>
#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>

#include "drey/alloc.h"
#include "auth_internal.h"
#include "b64.h"
#include "claims.h"

#define BEARER "Bearer"
#define BEARER_PREFIX (sizeof BEARER) /* "Bearer" and one space */

/* The token inside the header value. */
typedef struct token {
    const char *p;
    size_t len;
    size_t dot1, dot2; /* offsets of the two dots */
} token;

static bool ascii_ieq(const char *a, const char *b, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char x = a[i], y = b[i];
        if (x >= 'A' && x <= 'Z')
            x = (char)(x - 'A' + 'a');
        if (y >= 'A' && y <= 'Z')
            y = (char)(y - 'A' + 'a');
        if (x != y)
            return false;
    }
    return true;
}

/* "Bearer" 1*SP, then the token. */
static bool bearer_token(const char *h, size_t n, token *t) {
    size_t i = sizeof BEARER - 1;
    if (n <= i || !ascii_ieq(h, BEARER, i) || h[i] != ' ')
        return false;
    while (i < n && h[i] == ' ')
        i++;
    t->p = h + i;
    t->len = n - i;
    return true;
}

/* header '.' payload '.' signature, each segment non-empty base64url of a
 * length some input encodes to. A per-character scan: the cache spares
 * known tokens from it. */
static bool split_token(token *t) {
    size_t dots = 0, start = 0;
    for (size_t j = 0; j <= t->len; j++) {
        if (j == t->len || t->p[j] == '.') {
            size_t seg = j - start;
            if (seg == 0 || seg % 4 == 1 || (j < t->len && dots == 2))
                return false;
            if (j < t->len && dots == 0)
                t->dot1 = j;
            else if (j < t->len)
                t->dot2 = j;
            dots++;
            start = j + 1;
        } else if (!drey_auth__b64url_char(t->p[j])) {
            return false;
        }
    }
    return dots == 3; /* two dots, then the end of the token */
}

/* The header segment: picks the key and pins the algorithm. */
static drey_error check_header(const token *t, const drey_auth__keyset *ks, const drey_auth__key **key) {
    size_t len = 0;
    unsigned char *text = drey_auth__b64url_decode(t->p, t->dot1, &len);
    if (text == NULL)
        return DREY_ERR_TOKEN_MALFORMED;
    json_t *h = json_loadb((const char *)text, len, JSON_REJECT_DUPLICATES, NULL);
    free(text);
    drey_error e = DREY_ERR_NONE;
    json_t *alg = json_object_get(h, "alg"), *kid = json_object_get(h, "kid"), *typ = json_object_get(h, "typ");
    if (!json_is_object(h))
        e = DREY_ERR_TOKEN_MALFORMED;
    else if (!json_is_string(alg) || strcasecmp(json_string_value(alg), "none") == 0)
        e = DREY_ERR_TOKEN_ALGORITHM;
    else if (kid != NULL && !json_is_string(kid))
        e = DREY_ERR_TOKEN_MALFORMED;
    else if (typ != NULL && !(json_is_string(typ) && strcasecmp(json_string_value(typ), "JWT") == 0))
        e = DREY_ERR_TOKEN_MALFORMED; /* libjwt 1.10 refuses any other typ */
    else if (json_object_get(h, "crit") != NULL)
        e = DREY_ERR_TOKEN_MALFORMED; /* no extensions are understood (RFC 7515 4.1.11) */
    else if ((*key = drey_auth__keyset_find(ks, kid != NULL ? json_string_value(kid) : NULL)) == NULL)
        e = DREY_ERR_TOKEN_UNKNOWN_KEY;
    else if (strcmp(json_string_value(alg), jwt_alg_str((*key)->alg)) != 0)
        e = DREY_ERR_TOKEN_ALGORITHM; /* exact: jwt_str_alg ignores case */
    json_decref(h);
    return e;
}

/* Whether the payload segment is a JSON object: tells a malformed token
 * from a bad signature once libjwt has refused it. */
static bool payload_is_object(const token *t) {
    size_t len = 0;
    unsigned char *text = drey_auth__b64url_decode(t->p + t->dot1 + 1, t->dot2 - t->dot1 - 1, &len);
    if (text == NULL)
        return false;
    json_t *j = json_loadb((const char *)text, len, 0, NULL);
    bool ok = json_is_object(j);
    json_decref(j);
    free(text);
    return ok;
}

/* A claim as a jansson value of its own (json_decref it): 0 absent,
 * 1 present, -1 present but unreadable. Read through
 * jwt_get_grants_json because jwt_get_grant_int cannot tell a number
 * from another type in every libjwt 1.x. */
static int claim(jwt_t *jwt, const char *name, json_t **out) {
    char *text = jwt_get_grants_json(jwt, name);
    if (text == NULL)
        return 0;
    *out = json_loads(text, JSON_DECODE_ANY, NULL);
    free(text);
    return *out != NULL ? 1 : -1;
}

/* A NumericDate claim (seconds, integer or not) in ms, rounded down (exp)
 * or up (nbf, iat): 0 absent, 1 read, -1 not a number. */
static int numeric_date_ms(jwt_t *jwt, const char *name, bool round_up, int64_t *ms) {
    json_t *v = NULL;
    int r = claim(jwt, name, &v);
    if (r <= 0)
        return r;
    if (json_is_integer(v)) {
        json_int_t s = json_integer_value(v);
        if (__builtin_mul_overflow((int64_t)s, (int64_t)1000, ms))
            *ms = s > 0 ? INT64_MAX : INT64_MIN;
    } else if (json_is_real(v)) {
        double d = json_real_value(v) * 1000.0;
        if (d >= 9.2e18)
            *ms = INT64_MAX;
        else if (d <= -9.2e18)
            *ms = INT64_MIN;
        else {
            int64_t whole = (int64_t)d; /* toward zero */
            if (round_up && (double)whole < d)
                whole++;
            else if (!round_up && (double)whole > d)
                whole--;
            *ms = whole;
        }
    } else {
        r = -1;
    }
    json_decref(v);
    return r;
}

static bool audience_ok(jwt_t *jwt, const char *audience) {
    json_t *aud = NULL;
    if (claim(jwt, "aud", &aud) <= 0)
        return false;
    bool ok = false;
    if (json_is_string(aud)) {
        ok = strcmp(json_string_value(aud), audience) == 0;
    } else if (json_is_array(aud)) {
        size_t i;
        json_t *v;
        json_array_foreach(aud, i, v) {
            if (json_is_string(v) && strcmp(json_string_value(v), audience) == 0) {
                ok = true;
                break;
            }
        }
    }
    json_decref(aud);
    return ok;
}

/* The claims of a token whose signature verified. On success v holds its
 * times and *sub_out a malloc'd copy of sub ("" if none). */
static drey_error check_claims(const drey_auth *a, jwt_t *jwt, int64_t now_ms, drey_auth__verdict *v,
                               char **sub_out) {
    int64_t nbf_ms = INT64_MIN, t;
    int r;
    if (numeric_date_ms(jwt, "exp", false, &v->exp_ms) != 1)
        return DREY_ERR_TOKEN_INVALID;
    if ((r = numeric_date_ms(jwt, "nbf", true, &t)) < 0)
        return DREY_ERR_TOKEN_INVALID;
    if (r == 1 && t > nbf_ms)
        nbf_ms = t;
    if ((r = numeric_date_ms(jwt, "iat", true, &t)) < 0)
        return DREY_ERR_TOKEN_INVALID;
    if (r == 1 && t > nbf_ms)
        nbf_ms = t;
    v->nbf_ms = nbf_ms;
    drey_error e = drey_auth__check_times(v->exp_ms, v->nbf_ms, now_ms, a->skew_ms);
    if (e != DREY_ERR_NONE)
        return e;
    if (a->issuer != NULL) {
        const char *iss = jwt_get_grant(jwt, "iss");
        if (iss == NULL || strcmp(iss, a->issuer) != 0)
            return DREY_ERR_TOKEN_WRONG_ISSUER;
    }
    if (a->audience != NULL && !audience_ok(jwt, a->audience))
        return DREY_ERR_TOKEN_WRONG_AUDIENCE;
    json_t *sub = NULL;
    r = claim(jwt, "sub", &sub);
    if (r < 0 || (r == 1 && (!json_is_string(sub) || strlen(json_string_value(sub)) != json_string_length(sub)))) {
        json_decref(sub);
        return DREY_ERR_TOKEN_INVALID;
    }
    *sub_out = drey_xstrdup(r == 1 ? json_string_value(sub) : "");
    json_decref(sub);
    v->sub = *sub_out;
    v->sub_len = strlen(*sub_out);
    return DREY_ERR_NONE;
}

static const EVP_MD *digest_of(jwt_alg_t alg) {
    switch (alg) {
    case JWT_ALG_RS256:
    case JWT_ALG_ES256: return EVP_sha256();
    case JWT_ALG_RS384:
    case JWT_ALG_ES384: return EVP_sha384();
    case JWT_ALG_RS512:
    case JWT_ALG_ES512: return EVP_sha512();
    default: return NULL;
    }
}

/* A JWS ECDSA signature is R || S, each as wide as the curve's order (RFC
 * 7518 section 3.4); OpenSSL verifies DER. NULL for any other length. */
static unsigned char *ecdsa_der(const unsigned char *raw, size_t n, EVP_PKEY *pk, size_t *der_len) {
    size_t half = ((size_t)EVP_PKEY_get_bits(pk) + 7) / 8;
    if (n != 2 * half)
        return NULL;
    ECDSA_SIG *sig = ECDSA_SIG_new();
    BIGNUM *r = BN_bin2bn(raw, (int)half, NULL), *s = BN_bin2bn(raw + half, (int)half, NULL);
    if (sig == NULL || r == NULL || s == NULL || ECDSA_SIG_set0(sig, r, s) != 1) {
        BN_free(r);
        BN_free(s);
        ECDSA_SIG_free(sig);
        return NULL;
    }
    unsigned char *der = NULL;
    int len = i2d_ECDSA_SIG(sig, &der);
    ECDSA_SIG_free(sig);
    if (len <= 0)
        return NULL;
    *der_len = (size_t)len;
    return der;
}

/* The RS or ES signature over "header.payload", with the key's own
 * algorithm (pinned by check_header). */
static bool signature_ok(const token *t, const drey_auth__key *key) {
    size_t n = 0, der_len = 0;
    unsigned char *sig = drey_auth__b64url_decode(t->p + t->dot2 + 1, t->len - t->dot2 - 1, &n);
    unsigned char *der = NULL;
    const unsigned char *check = sig;
    if (sig != NULL && EVP_PKEY_get_base_id(key->pkey) == EVP_PKEY_EC) {
        der = ecdsa_der(sig, n, key->pkey, &der_len);
        check = der;
        n = der_len;
    }
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    bool ok = check != NULL && ctx != NULL && digest_of(key->alg) != NULL &&
              EVP_DigestVerifyInit(ctx, NULL, digest_of(key->alg), NULL, key->pkey) == 1 &&
              EVP_DigestVerify(ctx, check, n, (const unsigned char *)t->p, t->dot2) == 1;
    EVP_MD_CTX_free(ctx);
    OPENSSL_free(der);
    free(sig);
    /* A refusal leaves errors on this thread's OpenSSL queue, where a TLS
     * connection served by the same thread would read them as its own. */
    if (!ok)
        ERR_clear_error();
    return ok;
}

/* Full verification of a token the cache did not know; a success is
 * remembered under the key set's generation. */
static drey_error verify_uncached(drey_auth *a, const drey_auth__keyset *ks, const token *t,
                                  const uint8_t digest[DREY_AUTH_DIGEST], int64_t now_ms, char *sub, size_t sub_cap,
                                  void **attached) {
    const drey_auth__key *key = NULL;
    drey_error e = check_header(t, ks, &key);
    if (e != DREY_ERR_NONE)
        return e;
    char *copy = drey_xmalloc(t->len + 1);
    memcpy(copy, t->p, t->len);
    copy[t->len] = '\0';
    jwt_t *jwt = NULL;
    int rc;
    if (key->pkey == NULL)
        rc = jwt_decode(&jwt, copy, key->material, (int)key->material_len);
    else
        rc = signature_ok(t, key) ? jwt_decode(&jwt, copy, NULL, 0) : -1;
    free(copy);
    if (rc != 0 || jwt == NULL) {
        jwt_free(jwt);
        return payload_is_object(t) ? DREY_ERR_TOKEN_BAD_SIGNATURE : DREY_ERR_TOKEN_MALFORMED;
    }
    drey_auth__verdict v = {0};
    char *owned_sub = NULL;
    if (key->pkey == NULL && jwt_get_alg(jwt) != key->alg) /* keyless decoding says "none" */
        e = DREY_ERR_TOKEN_ALGORITHM;
    else
        e = check_claims(a, jwt, now_ms, &v, &owned_sub);
    if (e == DREY_ERR_NONE && a->attach.make != NULL) {
        /* Made once here and kept with the verdict: every later call with
         * this token finds it in the cache. */
        char *claims = jwt_get_grants_json(jwt, NULL);
        v.attached = a->attach.make(a->attach.ctx, claims != NULL ? claims : "{}", claims != NULL ? strlen(claims) : 2);
        free(claims);
    }
    jwt_free(jwt);
    if (e == DREY_ERR_NONE) {
        drey_auth__cache_insert(a->cache, digest, ks->generation, &v);
        if (sub != NULL) {
            if (v.sub_len < sub_cap)
                memcpy(sub, v.sub, v.sub_len + 1);
            else
                e = DREY_ERR_TOKEN_INVALID;
        }
    }
    if (e == DREY_ERR_NONE && attached != NULL)
        *attached = v.attached; /* the caller's reference; the cache took its own */
    else if (v.attached != NULL)
        a->attach.unref(v.attached);
    free(owned_sub);
    return e;
}

drey_error drey_auth_verify(drey_auth *a, const char *header, size_t header_len, int64_t now_ms, char *sub,
                            size_t sub_cap) {
    return drey_auth_verify_attached(a, header, header_len, now_ms, sub, sub_cap, NULL);
}

drey_error drey_auth_verify_attached(drey_auth *a, const char *header, size_t header_len, int64_t now_ms, char *sub,
                                     size_t sub_cap, void **attached) {
    if (attached != NULL)
        *attached = NULL;
    if (sub_cap == 0)
        sub = NULL; /* nowhere to write it: the caller does not want it */
    if (sub != NULL)
        sub[0] = '\0';
    if (header == NULL || header_len == 0)
        return DREY_ERR_TOKEN_MISSING;
    if (header_len > BEARER_PREFIX && header_len - BEARER_PREFIX > a->max_token_bytes)
        return DREY_ERR_TOKEN_TOO_LARGE;
    token t = {0};
    if (!bearer_token(header, header_len, &t))
        return DREY_ERR_TOKEN_MALFORMED;

    uint8_t digest[DREY_AUTH_DIGEST];
    if (EVP_Digest(t.p, t.len, digest, NULL, EVP_sha256(), NULL) != 1)
        return DREY_ERR_INTERNAL;

    drey_error e;
    bool fits = true;
    pthread_rwlock_rdlock(&a->keys_lock);
    const drey_auth__keyset *ks = a->keys;
    void *obj = NULL;
    if (drey_auth__cache_lookup_attached(a->cache, digest, ks->generation, now_ms, a->skew_ms, sub, sub_cap, &fits,
                                         &obj)) {
        atomic_fetch_add_explicit(&a->cache_hits, 1, memory_order_relaxed);
        e = fits ? DREY_ERR_NONE : DREY_ERR_TOKEN_INVALID;
    } else {
        atomic_fetch_add_explicit(&a->cache_misses, 1, memory_order_relaxed);
        e = split_token(&t) ? verify_uncached(a, ks, &t, digest, now_ms, sub, sub_cap, &obj)
                            : DREY_ERR_TOKEN_MALFORMED;
    }
    pthread_rwlock_unlock(&a->keys_lock);
    if (e != DREY_ERR_NONE && sub != NULL)
        sub[0] = '\0';
    if (e == DREY_ERR_NONE && attached != NULL)
        *attached = obj;
    else if (obj != NULL)
        a->attach.unref(obj);
    return e;
}
