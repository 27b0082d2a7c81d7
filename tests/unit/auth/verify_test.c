/*
 * Unit tests for src/auth/verify.c: drey_auth_verify's error contract.
 *
 * The negative matrix, one reason at a time: missing, malformed (scheme,
 * segments, base64url, JSON), too large, alg none, HS/RS confusion, alg
 * mismatch, unknown kid, bad signature, wrong key under the right kid,
 * exp/nbf/iat with the skew both ways, iss, aud (string and array), sub.
 * Then every supported algorithm end to end, from a JWKS and from a keys
 * directory. Hostile tokens are crafted by hand; honest ones are signed by
 * libjwt with keys generated at test time.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/bn.h>
#include <openssl/ec.h>
#include <openssl/err.h>

#include "auth_helpers.h"
#include "drey/log.h"
#include "src/auth/b64.h"

/* One keys directory: rs (RS256), es (ES256), hs (HS256). */
static struct {
    char *dir;
    EVP_PKEY *rsa, *ec;
    unsigned char hs[32];
    drey_auth *a;
} F;

static void setup(void) {
    drey_log_set_level(DREY_LOG_LEVEL_ERROR);
    F.dir = th_tmpdir();
    F.rsa = th_rsa(2048);
    F.ec = th_ec("P-256");
    th_random(F.hs, sizeof F.hs);
    char *rsa_pem = th_pub_pem(F.rsa), *ec_pem = th_pub_pem(F.ec);
    th_write_str(F.dir, "rs.RS256.pem", rsa_pem);
    th_write_str(F.dir, "es.ES256.pem", ec_pem);
    th_write(F.dir, "hs.HS256.key", F.hs, sizeof F.hs);
    free(rsa_pem);
    free(ec_pem);
    drey_auth_options o = th_options(NULL, F.dir);
    F.a = th_create(&o);
}

static void teardown(void) {
    drey_auth_destroy(F.a);
    EVP_PKEY_free(F.rsa);
    EVP_PKEY_free(F.ec);
    th_rmrf(F.dir);
    free(F.dir);
}

TestSuite(verify, .init = setup, .fini = teardown);

static char *rs(const char *claims) {
    return th_sign_pk(JWT_ALG_RS256, F.rsa, "rs", claims);
}

static char *hs(const char *kid, const char *claims) {
    return th_sign(JWT_ALG_HS256, F.hs, sizeof F.hs, kid, claims);
}

/* Verifies token (as "Bearer <token>") at TH_NOW and frees it. */
static drey_error check(char *token) {
    char sub[64];
    drey_error e = th_verify(F.a, token, TH_NOW_MS, sub, sizeof sub);
    free(token);
    return e;
}

/* A header value verified as is. */
static drey_error check_header_value(const char *h) {
    char sub[64];
    return drey_auth_verify(F.a, h, h == NULL ? 0 : strlen(h), TH_NOW_MS, sub, sizeof sub);
}

static char *claims_with(const char *members) {
    return th_fmt("{\"iss\":\"https://issuer.test\",\"aud\":\"drey\"%s}", members);
}

static char *std_claims(void) {
    return th_claims("alice", "");
}

/* ---- the happy path ---------------------------------------------------- */

Test(verify, rs_es_hs_tokens_verify_and_return_sub) {
    char *c = std_claims();
    char sub[64];
    char *tok = rs(c);
    EXPECT_ERR(th_verify(F.a, tok, TH_NOW_MS, sub, sizeof sub), DREY_ERR_NONE);
    cr_assert_str_eq(sub, "alice");
    free(tok);
    tok = th_sign_pk(JWT_ALG_ES256, F.ec, "es", c);
    memset(sub, 'x', sizeof sub);
    EXPECT_ERR(th_verify(F.a, tok, TH_NOW_MS, sub, sizeof sub), DREY_ERR_NONE);
    cr_assert_str_eq(sub, "alice");
    free(tok);
    tok = hs("hs", c);
    EXPECT_ERR(th_verify(F.a, tok, TH_NOW_MS, sub, sizeof sub), DREY_ERR_NONE);
    cr_assert_str_eq(sub, "alice");
    free(tok);
    free(c);
}

Test(verify, scheme_is_case_insensitive_and_spaces_may_repeat) {
    char *c = std_claims(), *tok = hs("hs", c);
    char *h1 = th_fmt("bearer %s", tok), *h2 = th_fmt("BEARER   %s", tok);
    EXPECT_ERR(check_header_value(h1), DREY_ERR_NONE);
    EXPECT_ERR(check_header_value(h2), DREY_ERR_NONE);
    free(h1);
    free(h2);
    free(tok);
    free(c);
}

Test(verify, sub_absent_is_empty_and_sub_buffer_is_optional) {
    char *c = claims_with(",\"exp\":1700003600"), *tok = hs("hs", c);
    char sub[8] = "junk";
    EXPECT_ERR(th_verify(F.a, tok, TH_NOW_MS, sub, sizeof sub), DREY_ERR_NONE);
    cr_assert_str_eq(sub, "");
    EXPECT_ERR(th_verify(F.a, tok, TH_NOW_MS, NULL, 0), DREY_ERR_NONE);
    free(tok);
    free(c);
}

/* ---- missing, malformed, too large ---------------------------------- */

Test(verify, missing_header) {
    EXPECT_ERR(drey_auth_verify(F.a, NULL, 0, TH_NOW_MS, NULL, 0), DREY_ERR_TOKEN_MISSING);
    EXPECT_ERR(drey_auth_verify(F.a, "", 0, TH_NOW_MS, NULL, 0), DREY_ERR_TOKEN_MISSING);
}

Test(verify, malformed_headers) {
    char *c = std_claims(), *tok = hs("hs", c);
    const char *dot1 = strchr(tok, '.'), *dot2 = strchr(dot1 + 1, '.');
    char *two = th_fmt("Bearer %.*s", (int)(dot2 - tok), tok);           /* header.payload */
    char *four = th_fmt("Bearer %s.AAAA", tok);                           /* four segments */
    char *empty_mid = th_fmt("Bearer %.*s..%s", (int)(dot1 - tok), tok, dot2 + 1);
    char *empty_sig = th_fmt("Bearer %.*s.", (int)(dot2 - tok), tok);
    char *padded = th_fmt("Bearer %s==", tok);
    char *plus = th_fmt("Bearer %.*s+%s", (int)(dot1 - tok), tok, dot1); /* '+' in the header */
    char *bang = th_fmt("Bearer %s!", tok);
    char *len1 = th_fmt("Bearer %s.A", tok);                              /* also a 4th segment */
    char *sig_len1 = th_fmt("Bearer %.*sA", (int)(dot2 + 1 - tok), tok);  /* 1-char signature */
    char *trailing = th_fmt("Bearer %s ", tok);
    char *tab = th_fmt("Bearer\t%s", tok);
    char *no_space = th_fmt("Bearer%s", tok);
    char *basic = th_fmt("Basic %s", tok);
    char *bare = th_strdup(tok);
    const char *cases[] = {two,  four,     empty_mid, empty_sig, padded,   plus,     bang,    len1,
                           tab,  no_space, basic,     bare,      trailing, sig_len1, "Bearer", "Bearer ",
                           "Bearer ...", "Bearer a.b.c", " ", "Bearer \x80\x81.AAAA.AAAA"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        cr_assert_eq(check_header_value(cases[i]), DREY_ERR_TOKEN_MALFORMED, "case %zu: %s -> %s", i, cases[i],
                     th_err_name(check_header_value(cases[i])));
    char *all[] = {two, four, empty_mid, empty_sig, padded, plus, bang, len1, tab, no_space, basic, bare, trailing,
                   sig_len1};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
    free(tok);
    free(c);
}

Test(verify, header_segment_not_json) {
    char *c = std_claims();
    EXPECT_ERR(check(th_raw("not json", c, "AAAA")), DREY_ERR_TOKEN_MALFORMED);
    EXPECT_ERR(check(th_raw("[\"alg\",\"HS256\"]", c, "AAAA")), DREY_ERR_TOKEN_MALFORMED);
    EXPECT_ERR(check(th_raw("{\"alg\":\"HS256\",\"kid\":\"hs\"", c, "AAAA")), DREY_ERR_TOKEN_MALFORMED);
    /* Duplicate members: which one counts is parser-dependent, so neither does. */
    EXPECT_ERR(check(th_raw_hmac("{\"alg\":\"HS256\",\"kid\":\"hs\",\"kid\":\"rs\"}", c, EVP_sha256(), F.hs, 32)),
               DREY_ERR_TOKEN_MALFORMED);
    EXPECT_ERR(check(th_raw_hmac("{\"alg\":\"HS256\",\"kid\":7}", c, EVP_sha256(), F.hs, 32)),
               DREY_ERR_TOKEN_MALFORMED);
    free(c);
}

Test(verify, header_typ_and_crit) {
    char *c = std_claims();
    EXPECT_ERR(check(th_raw_hmac("{\"alg\":\"HS256\",\"kid\":\"hs\",\"typ\":\"jwt\"}", c, EVP_sha256(), F.hs, 32)),
               DREY_ERR_NONE);
    EXPECT_ERR(check(th_raw_hmac("{\"alg\":\"HS256\",\"kid\":\"hs\"}", c, EVP_sha256(), F.hs, 32)), DREY_ERR_NONE);
    EXPECT_ERR(check(th_raw_hmac("{\"alg\":\"HS256\",\"kid\":\"hs\",\"typ\":\"at+jwt\"}", c, EVP_sha256(), F.hs, 32)),
               DREY_ERR_TOKEN_MALFORMED);
    EXPECT_ERR(check(th_raw_hmac("{\"alg\":\"HS256\",\"kid\":\"hs\",\"crit\":[\"exp\"]}", c, EVP_sha256(), F.hs, 32)),
               DREY_ERR_TOKEN_MALFORMED);
    free(c);
}

Test(verify, payload_not_json) {
    /* Properly signed, so only the payload is wrong. */
    EXPECT_ERR(check(th_raw_hmac("{\"alg\":\"HS256\",\"kid\":\"hs\"}", "not json", EVP_sha256(), F.hs, 32)),
               DREY_ERR_TOKEN_MALFORMED);
    EXPECT_ERR(check(th_raw("{\"alg\":\"HS256\",\"kid\":\"hs\"}", "{\"exp\":", "AAAA")), DREY_ERR_TOKEN_MALFORMED);
    /* Signed JSON that is not an object has no usable claims. */
    EXPECT_ERR(check(th_raw_hmac("{\"alg\":\"HS256\",\"kid\":\"hs\"}", "[1,2]", EVP_sha256(), F.hs, 32)),
               DREY_ERR_TOKEN_INVALID);
}

Test(verify, too_large_is_decided_before_parsing) {
    size_t max = 8192;
    char *h = malloc(max + 64);
    cr_assert_not_null(h);
    memcpy(h, "Bearer ", 7);
    memset(h + 7, '!', max + 1); /* not even base64url: still TOO_LARGE */
    EXPECT_ERR(drey_auth_verify(F.a, h, 7 + max + 1, TH_NOW_MS, NULL, 0), DREY_ERR_TOKEN_TOO_LARGE);
    memset(h + 7, 'A', max + 1);
    EXPECT_ERR(drey_auth_verify(F.a, h, 7 + max + 1, TH_NOW_MS, NULL, 0), DREY_ERR_TOKEN_TOO_LARGE);
    /* Exactly max bytes of token is allowed through to parsing. */
    EXPECT_ERR(drey_auth_verify(F.a, h, 7 + max, TH_NOW_MS, NULL, 0), DREY_ERR_TOKEN_MALFORMED);
    free(h);

    size_t huge = 1u << 20;
    char *big = malloc(huge);
    cr_assert_not_null(big);
    memcpy(big, "Bearer ", 7);
    memset(big + 7, 'A', huge - 7);
    EXPECT_ERR(drey_auth_verify(F.a, big, huge, TH_NOW_MS, NULL, 0), DREY_ERR_TOKEN_TOO_LARGE);
    free(big);

    /* A real token padded with a big claim. */
    char *pad = malloc(9000);
    memset(pad, 'p', 8999);
    pad[8999] = '\0';
    char *extra = th_fmt(",\"pad\":\"%s\"", pad);
    char *c = th_claims("alice", extra);
    EXPECT_ERR(check(hs("hs", c)), DREY_ERR_TOKEN_TOO_LARGE);
    free(c);
    free(extra);
    free(pad);
}

/* ---- algorithms ------------------------------------------------------- */

Test(verify, alg_none_is_refused) {
    char *c = std_claims();
    /* The classic: an empty signature, which is not three segments. */
    EXPECT_ERR(check(th_raw("{\"alg\":\"none\",\"kid\":\"rs\"}", c, "")), DREY_ERR_TOKEN_MALFORMED);
    /* With something in the signature slot, alg none is what is refused. */
    EXPECT_ERR(check(th_raw("{\"alg\":\"none\",\"kid\":\"rs\"}", c, "AAAA")), DREY_ERR_TOKEN_ALGORITHM);
    EXPECT_ERR(check(th_raw("{\"alg\":\"none\"}", c, "AAAA")), DREY_ERR_TOKEN_ALGORITHM);
    EXPECT_ERR(check(th_raw("{\"alg\":\"NONE\",\"kid\":\"hs\"}", c, "AAAA")), DREY_ERR_TOKEN_ALGORITHM);
    EXPECT_ERR(check(th_raw("{\"alg\":\"None\",\"kid\":\"nope\"}", c, "AAAA")), DREY_ERR_TOKEN_ALGORITHM);
    free(c);
}

/* An HS256 token whose secret is the RSA key's public PEM: libjwt alone
 * accepts it against that PEM; pinning RS256 to the key refuses it. */
Test(verify, hs_rs_confusion_is_refused) {
    char *c = std_claims();
    char *pem = th_pub_pem(F.rsa);
    char *forged = th_sign(JWT_ALG_HS256, pem, strlen(pem), "rs", c);
    jwt_t *jwt = NULL;
    cr_assert_eq(jwt_decode(&jwt, forged, (const unsigned char *)pem, (int)strlen(pem)), 0,
                 "the trap: libjwt accepts the forgery on its own");
    jwt_free(jwt);
    EXPECT_ERR(check(forged), DREY_ERR_TOKEN_ALGORITHM);
    free(pem);
    free(c);
}

Test(verify, alg_must_be_exactly_the_keys) {
    char *c = std_claims();
    EXPECT_ERR(check(th_sign_pk(JWT_ALG_RS384, F.rsa, "rs", c)), DREY_ERR_TOKEN_ALGORITHM);
    EXPECT_ERR(check(th_sign_pk(JWT_ALG_RS512, F.rsa, "rs", c)), DREY_ERR_TOKEN_ALGORITHM);
    EXPECT_ERR(check(th_sign_pk(JWT_ALG_ES256, F.ec, "rs", c)), DREY_ERR_TOKEN_ALGORITHM);
    EXPECT_ERR(check(th_sign_pk(JWT_ALG_RS256, F.rsa, "es", c)), DREY_ERR_TOKEN_ALGORITHM);
    EXPECT_ERR(check(th_sign(JWT_ALG_HS384, F.hs, 32, "hs", c)), DREY_ERR_TOKEN_ALGORITHM);
    EXPECT_ERR(check(th_raw_hmac("{\"alg\":\"hs256\",\"kid\":\"hs\"}", c, EVP_sha256(), F.hs, 32)),
               DREY_ERR_TOKEN_ALGORITHM);
    EXPECT_ERR(check(th_raw("{\"alg\":\"PS256\",\"kid\":\"rs\"}", c, "AAAA")), DREY_ERR_TOKEN_ALGORITHM);
    EXPECT_ERR(check(th_raw("{\"kid\":\"rs\"}", c, "AAAA")), DREY_ERR_TOKEN_ALGORITHM);
    EXPECT_ERR(check(th_raw("{\"alg\":256,\"kid\":\"rs\"}", c, "AAAA")), DREY_ERR_TOKEN_ALGORITHM);
    free(c);
}

/* ---- keys and signatures ------------------------------------------------ */

Test(verify, unknown_kid) {
    char *c = std_claims();
    EXPECT_ERR(check(hs("nope", c)), DREY_ERR_TOKEN_UNKNOWN_KEY);
    EXPECT_ERR(check(hs("", c)), DREY_ERR_TOKEN_UNKNOWN_KEY);
    /* No kid and three keys: which one? None. */
    EXPECT_ERR(check(hs(NULL, c)), DREY_ERR_TOKEN_UNKNOWN_KEY);
    free(c);
}

Test(verify, no_kid_uses_the_only_key) {
    char *one = th_path(F.dir, "one");
    cr_assert_eq(mkdir(one, 0700), 0);
    th_write(one, "solo.HS256.key", F.hs, sizeof F.hs);
    drey_auth_options o = th_options(NULL, one);
    drey_auth *a = th_create(&o);
    char *c = std_claims(), *tok = hs(NULL, c);
    char sub[32];
    EXPECT_ERR(th_verify(a, tok, TH_NOW_MS, sub, sizeof sub), DREY_ERR_NONE);
    cr_assert_str_eq(sub, "alice");
    free(tok);
    tok = hs("solo", c);
    EXPECT_ERR(th_verify(a, tok, TH_NOW_MS, sub, sizeof sub), DREY_ERR_NONE);
    free(tok);
    tok = hs("other", c);
    EXPECT_ERR(th_verify(a, tok, TH_NOW_MS, sub, sizeof sub), DREY_ERR_TOKEN_UNKNOWN_KEY);
    free(tok);
    free(c);
    drey_auth_destroy(a);
    free(one);
}

/* Flips one character in the middle of the signature segment. */
static char *flip_signature(char *tok) {
    char *sig = strrchr(tok, '.') + 1;
    char *p = sig + strlen(sig) / 2;
    *p = *p == 'A' ? 'B' : 'A';
    return tok;
}

Test(verify, bad_signature) {
    char *c = std_claims();
    EXPECT_ERR(check(flip_signature(rs(c))), DREY_ERR_TOKEN_BAD_SIGNATURE);
    EXPECT_ERR(check(flip_signature(th_sign_pk(JWT_ALG_ES256, F.ec, "es", c))), DREY_ERR_TOKEN_BAD_SIGNATURE);
    EXPECT_ERR(check(flip_signature(hs("hs", c))), DREY_ERR_TOKEN_BAD_SIGNATURE);
    /* A signature of the wrong length. */
    char *tok = hs("hs", c);
    char *cut = th_fmt("%.*s", (int)(strlen(tok) - 4), tok);
    EXPECT_ERR(check(cut), DREY_ERR_TOKEN_BAD_SIGNATURE);
    free(tok);
    free(c);
}

/* RS and ES signatures are checked by drey itself (libjwt would re-parse the
 * key on every call): their encodings get the same scrutiny libjwt gave. */
Test(verify, rs_and_es_signatures_of_the_wrong_shape) {
    char *c = std_claims();
    char *toks[] = {rs(c), th_sign_pk(JWT_ALG_ES256, F.ec, "es", c)};
    for (size_t i = 0; i < 2; i++) {
        const char *sig = strrchr(toks[i], '.') + 1;
        int body = (int)(sig - toks[i]);
        /* shorter; longer; empty after the dot is malformed, not a signature */
        EXPECT_ERR(check(th_fmt("%.*s", (int)strlen(toks[i]) - 4, toks[i])), DREY_ERR_TOKEN_BAD_SIGNATURE);
        EXPECT_ERR(check(th_fmt("%sAAAA", toks[i])), DREY_ERR_TOKEN_BAD_SIGNATURE);
        EXPECT_ERR(check(th_fmt("%.*s", body, toks[i])), DREY_ERR_TOKEN_MALFORMED);
        /* another token's signature over this header and payload */
        char *other = i == 0 ? rs("{\"exp\":1}") : th_sign_pk(JWT_ALG_ES256, F.ec, "es", "{\"exp\":1}");
        EXPECT_ERR(check(th_fmt("%.*s%s", body, toks[i], strrchr(other, '.') + 1)), DREY_ERR_TOKEN_BAD_SIGNATURE);
        free(other);
    }
    /* The ES256 signature as DER (what OpenSSL produces) instead of R || S. */
    const char *sig = strrchr(toks[1], '.') + 1;
    size_t n = 0;
    unsigned char *raw = drey_auth__b64url_decode(sig, strlen(sig), &n);
    cr_assert_eq(n, 64);
    ECDSA_SIG *es = ECDSA_SIG_new();
    cr_assert_eq(ECDSA_SIG_set0(es, BN_bin2bn(raw, 32, NULL), BN_bin2bn(raw + 32, 32, NULL)), 1);
    unsigned char *der = NULL;
    int der_len = i2d_ECDSA_SIG(es, &der);
    cr_assert_gt(der_len, 0);
    char *der64 = th_b64url(der, (size_t)der_len);
    EXPECT_ERR(check(th_fmt("%.*s%s", (int)(sig - toks[1]), toks[1], der64)), DREY_ERR_TOKEN_BAD_SIGNATURE);
    free(der64);
    OPENSSL_free(der);
    ECDSA_SIG_free(es);
    free(raw);
    /* A refusal leaves nothing on this thread's OpenSSL error queue, which a
     * TLS connection served by the same thread would take for its own. */
    ERR_clear_error();
    EXPECT_ERR(check(flip_signature(th_strdup(toks[0]))), DREY_ERR_TOKEN_BAD_SIGNATURE);
    EXPECT_ERR(check(flip_signature(th_strdup(toks[1]))), DREY_ERR_TOKEN_BAD_SIGNATURE);
    cr_assert_eq(ERR_peek_error(), 0, "left on the queue: %s", ERR_error_string(ERR_peek_error(), NULL));
    free(toks[0]);
    free(toks[1]);
    free(c);
}

Test(verify, tampered_payload) {
    char *c = std_claims(), *evil = th_claims("mallory", "");
    char *good = rs(c), *other = rs(evil);
    /* mallory's payload under alice's signature */
    const char *g1 = strchr(good, '.'), *g2 = strchr(g1 + 1, '.');
    const char *o1 = strchr(other, '.'), *o2 = strchr(o1 + 1, '.');
    char *spliced = th_fmt("%.*s%.*s%s", (int)(g1 - good), good, (int)(o2 - o1), o1, g2);
    EXPECT_ERR(check(spliced), DREY_ERR_TOKEN_BAD_SIGNATURE);
    free(good);
    free(other);
    free(evil);
    free(c);
}

Test(verify, wrong_key_with_the_right_kid) {
    char *c = std_claims();
    EVP_PKEY *rsa2 = th_rsa(2048), *ec2 = th_ec("P-256");
    unsigned char hs2[32];
    th_random(hs2, sizeof hs2);
    EXPECT_ERR(check(th_sign_pk(JWT_ALG_RS256, rsa2, "rs", c)), DREY_ERR_TOKEN_BAD_SIGNATURE);
    EXPECT_ERR(check(th_sign_pk(JWT_ALG_ES256, ec2, "es", c)), DREY_ERR_TOKEN_BAD_SIGNATURE);
    EXPECT_ERR(check(th_sign(JWT_ALG_HS256, hs2, sizeof hs2, "hs", c)), DREY_ERR_TOKEN_BAD_SIGNATURE);
    EVP_PKEY_free(rsa2);
    EVP_PKEY_free(ec2);
    free(c);
}

/* ---- time claims -------------------------------------------------------- */

static char *with_times(const char *times) {
    return th_fmt("{\"sub\":\"alice\",\"iss\":\"https://issuer.test\",\"aud\":\"drey\"%s}", times);
}

static drey_error check_times(const char *times) {
    char *c = with_times(times);
    drey_error e = check(hs("hs", c));
    free(c);
    return e;
}

Test(verify, exp_is_required_and_numeric) {
    EXPECT_ERR(check_times(""), DREY_ERR_TOKEN_INVALID);
    EXPECT_ERR(check_times(",\"exp\":\"1700003600\""), DREY_ERR_TOKEN_INVALID);
    EXPECT_ERR(check_times(",\"exp\":true"), DREY_ERR_TOKEN_INVALID);
    EXPECT_ERR(check_times(",\"exp\":null"), DREY_ERR_TOKEN_INVALID);
    EXPECT_ERR(check_times(",\"exp\":[1700003600]"), DREY_ERR_TOKEN_INVALID);
    /* NumericDate may have a fraction; huge values saturate. */
    EXPECT_ERR(check_times(",\"exp\":1700003600.5"), DREY_ERR_NONE);
    EXPECT_ERR(check_times(",\"exp\":1e300"), DREY_ERR_NONE);
    EXPECT_ERR(check_times(",\"exp\":9223372036854775807"), DREY_ERR_NONE);
    EXPECT_ERR(check_times(",\"exp\":-9223372036854775807"), DREY_ERR_TOKEN_EXPIRED);
}

Test(verify, nbf_and_iat_must_be_numbers_when_present) {
    EXPECT_ERR(check_times(",\"exp\":1700003600,\"nbf\":\"soon\""), DREY_ERR_TOKEN_INVALID);
    EXPECT_ERR(check_times(",\"exp\":1700003600,\"iat\":false"), DREY_ERR_TOKEN_INVALID);
}

/* skew is 30 s: expired once exp <= now - 30 s. */
Test(verify, expiry_with_skew_both_sides) {
    EXPECT_ERR(check_times(",\"exp\":1699999970"), DREY_ERR_TOKEN_EXPIRED);     /* now - 30 s */
    EXPECT_ERR(check_times(",\"exp\":1699999971"), DREY_ERR_NONE);             /* now - 29 s */
    EXPECT_ERR(check_times(",\"exp\":1699999970.01"), DREY_ERR_NONE);          /* 10 ms inside */
    EXPECT_ERR(check_times(",\"exp\":1600000000"), DREY_ERR_TOKEN_EXPIRED);
}

Test(verify, not_yet_valid_with_skew_both_sides) {
    EXPECT_ERR(check_times(",\"exp\":1700003600,\"nbf\":1700000030"), DREY_ERR_NONE);             /* now + 30 s */
    EXPECT_ERR(check_times(",\"exp\":1700003600,\"nbf\":1700000031"), DREY_ERR_TOKEN_NOT_YET_VALID);
    EXPECT_ERR(check_times(",\"exp\":1700003600,\"nbf\":1700000030.001"), DREY_ERR_TOKEN_NOT_YET_VALID);
    EXPECT_ERR(check_times(",\"exp\":1700003600,\"iat\":1700000030"), DREY_ERR_NONE);
    EXPECT_ERR(check_times(",\"exp\":1700003600,\"iat\":1700000031"), DREY_ERR_TOKEN_NOT_YET_VALID);
    EXPECT_ERR(check_times(",\"exp\":1700003600,\"nbf\":1600000000,\"iat\":1700000100"),
               DREY_ERR_TOKEN_NOT_YET_VALID);
}

/* The same token over time, through the cache: the cached answer follows the
 * same rule as a full verification. */
Test(verify, a_cached_token_expires_by_the_same_rule) {
    char *c = with_times(",\"exp\":1700000100,\"nbf\":1700000000");
    char *tok = hs("hs", c);
    drey_auth_stats st;
    EXPECT_ERR(th_verify(F.a, tok, TH_NOW_MS, NULL, 0), DREY_ERR_NONE);
    EXPECT_ERR(th_verify(F.a, tok, (TH_NOW_S + 129) * 1000 + 999, NULL, 0), DREY_ERR_NONE);
    drey_auth_get_stats(F.a, &st);
    cr_assert_eq(st.cache_hits, 1);
    EXPECT_ERR(th_verify(F.a, tok, (TH_NOW_S + 130) * 1000, NULL, 0), DREY_ERR_TOKEN_EXPIRED);
    /* Back in time, before nbf - skew: not yet valid, cached or not. */
    EXPECT_ERR(th_verify(F.a, tok, TH_NOW_MS, NULL, 0), DREY_ERR_NONE);
    EXPECT_ERR(th_verify(F.a, tok, (TH_NOW_S - 31) * 1000, NULL, 0), DREY_ERR_TOKEN_NOT_YET_VALID);
    EXPECT_ERR(th_verify(F.a, tok, (TH_NOW_S - 30) * 1000, NULL, 0), DREY_ERR_NONE);
    free(tok);
    free(c);
}

/* ---- issuer, audience, subject -------------------------------------------- */

static drey_error check_claims(const char *members) {
    char *c = th_fmt("{\"sub\":\"alice\",\"exp\":1700003600%s}", members);
    drey_error e = check(hs("hs", c));
    free(c);
    return e;
}

Test(verify, issuer) {
    EXPECT_ERR(check_claims(",\"iss\":\"https://issuer.test\",\"aud\":\"drey\""), DREY_ERR_NONE);
    EXPECT_ERR(check_claims(",\"iss\":\"https://evil.test\",\"aud\":\"drey\""), DREY_ERR_TOKEN_WRONG_ISSUER);
    EXPECT_ERR(check_claims(",\"iss\":\"https://issuer.test/\",\"aud\":\"drey\""), DREY_ERR_TOKEN_WRONG_ISSUER);
    EXPECT_ERR(check_claims(",\"aud\":\"drey\""), DREY_ERR_TOKEN_WRONG_ISSUER);
    EXPECT_ERR(check_claims(",\"iss\":7,\"aud\":\"drey\""), DREY_ERR_TOKEN_WRONG_ISSUER);
}

Test(verify, audience_string_or_array) {
    const char *iss = ",\"iss\":\"https://issuer.test\"";
    char *ok_str = th_fmt("%s,\"aud\":\"drey\"", iss), *ok_arr = th_fmt("%s,\"aud\":[\"other\",\"drey\"]", iss);
    char *bad_str = th_fmt("%s,\"aud\":\"dreyd\"", iss), *bad_arr = th_fmt("%s,\"aud\":[\"a\",\"b\"]", iss);
    char *empty_arr = th_fmt("%s,\"aud\":[]", iss), *num = th_fmt("%s,\"aud\":5", iss);
    char *nested = th_fmt("%s,\"aud\":[[\"drey\"]]", iss);
    EXPECT_ERR(check_claims(ok_str), DREY_ERR_NONE);
    EXPECT_ERR(check_claims(ok_arr), DREY_ERR_NONE);
    EXPECT_ERR(check_claims(bad_str), DREY_ERR_TOKEN_WRONG_AUDIENCE);
    EXPECT_ERR(check_claims(bad_arr), DREY_ERR_TOKEN_WRONG_AUDIENCE);
    EXPECT_ERR(check_claims(empty_arr), DREY_ERR_TOKEN_WRONG_AUDIENCE);
    EXPECT_ERR(check_claims(num), DREY_ERR_TOKEN_WRONG_AUDIENCE);
    EXPECT_ERR(check_claims(nested), DREY_ERR_TOKEN_WRONG_AUDIENCE);
    EXPECT_ERR(check_claims(iss), DREY_ERR_TOKEN_WRONG_AUDIENCE);
    free(ok_str);
    free(ok_arr);
    free(bad_str);
    free(bad_arr);
    free(empty_arr);
    free(num);
    free(nested);
}

Test(verify, issuer_and_audience_unchecked_when_not_configured) {
    drey_auth_options o = th_options(NULL, F.dir);
    o.issuer = NULL;
    o.audience = "";
    drey_auth *a = th_create(&o);
    char *c = th_fmt("{\"sub\":\"bob\",\"exp\":1700003600,\"iss\":\"anyone\",\"aud\":42}");
    char *tok = hs("hs", c);
    EXPECT_ERR(th_verify(a, tok, TH_NOW_MS, NULL, 0), DREY_ERR_NONE);
    free(tok);
    free(c);
    drey_auth_destroy(a);
}

Test(verify, sub_must_be_a_string_that_fits) {
    EXPECT_ERR(check(hs("hs", "{\"sub\":42,\"exp\":1700003600,\"iss\":\"https://issuer.test\",\"aud\":\"drey\"}")),
               DREY_ERR_TOKEN_INVALID);
    char *c = th_claims("0123456789", ""), *tok = hs("hs", c);
    char small[10], big[11];
    EXPECT_ERR(th_verify(F.a, tok, TH_NOW_MS, small, sizeof small), DREY_ERR_TOKEN_INVALID);
    cr_assert_str_eq(small, "", "nothing half-written");
    /* Now cached: the same rule on a hit. */
    EXPECT_ERR(th_verify(F.a, tok, TH_NOW_MS, small, sizeof small), DREY_ERR_TOKEN_INVALID);
    EXPECT_ERR(th_verify(F.a, tok, TH_NOW_MS, big, sizeof big), DREY_ERR_NONE);
    cr_assert_str_eq(big, "0123456789");
    drey_auth_stats st;
    drey_auth_get_stats(F.a, &st);
    cr_assert_eq(st.cache_hits, 2);
    free(tok);
    free(c);
}

/* ---- every algorithm end to end ---------------------------------------- */

Test(verify, every_algorithm_from_a_jwks) {
    EVP_PKEY *rsa = F.rsa, *p256 = F.ec, *p384 = th_ec("P-384"), *p521 = th_ec("P-521");
    unsigned char secret[64];
    th_random(secret, sizeof secret);
    struct {
        const char *kid;
        jwt_alg_t alg;
        EVP_PKEY *pk; /* NULL: HMAC */
        size_t secret_len;
    } keys[] = {
        {"rs256", JWT_ALG_RS256, rsa, 0},  {"rs384", JWT_ALG_RS384, rsa, 0},  {"rs512", JWT_ALG_RS512, rsa, 0},
        {"es256", JWT_ALG_ES256, p256, 0}, {"es384", JWT_ALG_ES384, p384, 0}, {"es512", JWT_ALG_ES512, p521, 0},
        {"hs256", JWT_ALG_HS256, NULL, 32}, {"hs384", JWT_ALG_HS384, NULL, 48}, {"hs512", JWT_ALG_HS512, NULL, 64},
    };
    size_t n = sizeof keys / sizeof keys[0];
    char *jwk[9];
    for (size_t i = 0; i < n; i++)
        jwk[i] = keys[i].pk != NULL ? th_jwk(keys[i].pk, keys[i].kid, jwt_alg_str(keys[i].alg))
                                    : th_jwk_oct(secret, keys[i].secret_len, keys[i].kid, jwt_alg_str(keys[i].alg));
    char *text = th_jwks((const char *const *)jwk, n);
    th_write_str(F.dir, "jwks.json", text);
    char *path = th_path(F.dir, "jwks.json");
    drey_auth_options o = th_options(path, NULL);
    drey_auth *a = th_create(&o);
    drey_auth_stats st;
    drey_auth_get_stats(a, &st);
    cr_assert_eq(st.keys, n);
    char *c = th_claims("carol", "");
    for (size_t i = 0; i < n; i++) {
        char *tok = keys[i].pk != NULL ? th_sign_pk(keys[i].alg, keys[i].pk, keys[i].kid, c)
                                       : th_sign(keys[i].alg, secret, keys[i].secret_len, keys[i].kid, c);
        char sub[16] = "";
        drey_error e = th_verify(a, tok, TH_NOW_MS, sub, sizeof sub);
        cr_assert_eq(e, DREY_ERR_NONE, "%s: %s", keys[i].kid, th_err_name(e));
        cr_assert_str_eq(sub, "carol");
        e = th_verify(a, flip_signature(tok), TH_NOW_MS, sub, sizeof sub);
        cr_assert_eq(e, DREY_ERR_TOKEN_BAD_SIGNATURE, "%s flipped: %s", keys[i].kid, th_err_name(e));
        free(tok);
    }
    drey_auth_destroy(a);
    for (size_t i = 0; i < n; i++)
        free(jwk[i]);
    free(c);
    free(text);
    free(path);
    EVP_PKEY_free(p384);
    EVP_PKEY_free(p521);
}

Test(verify, every_family_from_a_keys_dir) {
    EVP_PKEY *p384 = th_ec("P-384");
    char *p384_pem = th_pub_pem(p384), *rsa_pem = th_pub_pem(F.rsa);
    unsigned char secret[64];
    th_random(secret, sizeof secret);
    char *kdir = th_path(F.dir, "more");
    cr_assert_eq(mkdir(kdir, 0700), 0);
    th_write_str(kdir, "e3.ES384.pem", p384_pem);
    th_write_str(kdir, "r5.RS512.pem", rsa_pem);
    th_write(kdir, "h5.HS512.key", secret, 64);
    drey_auth_options o = th_options(NULL, kdir);
    drey_auth *a = th_create(&o);
    char *c = th_claims("dave", "");
    char *toks[] = {th_sign_pk(JWT_ALG_ES384, p384, "e3", c), th_sign_pk(JWT_ALG_RS512, F.rsa, "r5", c),
                    th_sign(JWT_ALG_HS512, secret, 64, "h5", c)};
    for (size_t i = 0; i < 3; i++) {
        char sub[16] = "";
        EXPECT_ERR(th_verify(a, toks[i], TH_NOW_MS, sub, sizeof sub), DREY_ERR_NONE);
        cr_assert_str_eq(sub, "dave");
        free(toks[i]);
    }
    drey_auth_destroy(a);
    free(c);
    free(kdir);
    free(p384_pem);
    free(rsa_pem);
    EVP_PKEY_free(p384);
}
