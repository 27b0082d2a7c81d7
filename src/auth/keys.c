/*
 * keys — builds an immutable key set from a JWKS file and a key directory.
 *
 * Every key ends up as an OpenSSL public key (RS, ES: verify.c checks
 * those signatures itself) or as raw secret bytes (HS: libjwt checks those),
 * with exactly one algorithm pinned to it:
 *
 *   JWKS  {"keys":[...]}, each key with "kid" and "alg" (required here):
 *         kty RSA (n, e) and EC (crv, x, y) become public keys built with
 *         OpenSSL 3 (EVP_PKEY_fromdata); kty oct uses base64url "k" as the
 *         secret. The kty (and crv) must be what the alg needs.
 *   dir   <kid>.<ALG>.pem: a PEM public key (RS*, ES*);
 *         <kid>.<ALG>.key: the raw secret bytes (HS*). Names starting with
 *         '.' and files with other extensions are ignored.
 *
 * A key that breaks a rule is skipped with a warning naming its source, kid
 * and the rule; secrets and key material are never logged. A source that
 * cannot be read, or holds no usable key, fails the whole load, and so do
 * two keys with one kid: a key set is either complete or not used.
 */
#include "keys.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/objects.h>
#include <openssl/param_build.h>
#include <openssl/pem.h>

#include "drey/alloc.h"
#include "b64.h"
#include "drey/log.h"

#define WHY_CAP 160

__attribute__((format(printf, 3, 4))) static void set_err(char *err, size_t cap, const char *fmt, ...) {
    if (err == NULL || cap == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, cap, fmt, ap);
    va_end(ap);
}

size_t drey_auth__min_secret(jwt_alg_t alg) {
    switch (alg) {
    case JWT_ALG_HS256:
        return 32;
    case JWT_ALG_HS384:
        return 48;
    case JWT_ALG_HS512:
        return 64;
    default:
        return 0;
    }
}

typedef enum { FAMILY_NONE, FAMILY_HS, FAMILY_RS, FAMILY_ES } alg_family;

static alg_family family_of(jwt_alg_t alg) {
    switch (alg) {
    case JWT_ALG_HS256:
    case JWT_ALG_HS384:
    case JWT_ALG_HS512:
        return FAMILY_HS;
    case JWT_ALG_RS256:
    case JWT_ALG_RS384:
    case JWT_ALG_RS512:
        return FAMILY_RS;
    case JWT_ALG_ES256:
    case JWT_ALG_ES384:
    case JWT_ALG_ES512:
        return FAMILY_ES;
    default:
        return FAMILY_NONE;
    }
}

/* The curve an ES algorithm is defined on (RFC 7518 section 3.4). */
typedef struct curve {
    const char *jwk_crv; /* JWK "crv" */
    const char *sn;      /* OpenSSL short name */
    int nid;
    size_t coord_len; /* bytes of x and y */
} curve;

static const curve *curve_of(jwt_alg_t alg) {
    static const curve p256 = {"P-256", "prime256v1", NID_X9_62_prime256v1, 32};
    static const curve p384 = {"P-384", "secp384r1", NID_secp384r1, 48};
    static const curve p521 = {"P-521", "secp521r1", NID_secp521r1, 66};
    switch (alg) {
    case JWT_ALG_ES256:
        return &p256;
    case JWT_ALG_ES384:
        return &p384;
    case JWT_ALG_ES512:
        return &p521;
    default:
        return NULL;
    }
}

/* A supported algorithm by its exact name (RFC 7515 names are case
 * sensitive; jwt_str_alg is not); JWT_ALG_INVAL otherwise, "none" included. */
static jwt_alg_t parse_alg(const char *name) {
    jwt_alg_t alg = jwt_str_alg(name);
    if (family_of(alg) == FAMILY_NONE || strcmp(name, jwt_alg_str(alg)) != 0)
        return JWT_ALG_INVAL;
    return alg;
}

/* ---- key material ---------------------------------------------------- */

/* Checks that a public key fits the algorithm pinned to it. */
static bool pkey_fits(EVP_PKEY *pk, jwt_alg_t alg, char *why) {
    switch (family_of(alg)) {
    case FAMILY_RS:
        if (EVP_PKEY_get_base_id(pk) != EVP_PKEY_RSA) {
            snprintf(why, WHY_CAP, "%s needs an RSA key", jwt_alg_str(alg));
            return false;
        }
        if (EVP_PKEY_get_bits(pk) < DREY_AUTH_MIN_RSA_BITS) {
            snprintf(why, WHY_CAP, "RSA key of %d bits (at least %d required)", EVP_PKEY_get_bits(pk),
                     DREY_AUTH_MIN_RSA_BITS);
            return false;
        }
        return true;
    case FAMILY_ES: {
        const curve *cv = curve_of(alg);
        char group[64];
        if (EVP_PKEY_get_base_id(pk) != EVP_PKEY_EC ||
            EVP_PKEY_get_utf8_string_param(pk, OSSL_PKEY_PARAM_GROUP_NAME, group, sizeof group, NULL) != 1 ||
            OBJ_sn2nid(group) != cv->nid) {
            snprintf(why, WHY_CAP, "%s needs an EC key on %s", jwt_alg_str(alg), cv->jwk_crv);
            return false;
        }
        return true;
    }
    default:
        snprintf(why, WHY_CAP, "not a public-key algorithm");
        return false;
    }
}

/* Validates pk for alg and stores it in k. Takes ownership of pk. */
static bool finish_public_key(EVP_PKEY *pk, jwt_alg_t alg, drey_auth__key *k, char *why) {
    bool ok = false;
    EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_from_pkey(NULL, pk, NULL);
    if (ctx == NULL || EVP_PKEY_public_check(ctx) != 1)
        snprintf(why, WHY_CAP, "the public key fails OpenSSL's checks");
    else
        ok = pkey_fits(pk, alg, why);
    EVP_PKEY_CTX_free(ctx);
    if (ok)
        k->pkey = pk;
    else
        EVP_PKEY_free(pk);
    return ok;
}

static EVP_PKEY *pkey_from_params(const char *type, OSSL_PARAM_BLD *bld) {
    EVP_PKEY *pk = NULL;
    OSSL_PARAM *params = OSSL_PARAM_BLD_to_param(bld);
    EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_from_name(NULL, type, NULL);
    if (params == NULL || ctx == NULL || EVP_PKEY_fromdata_init(ctx) != 1 ||
        EVP_PKEY_fromdata(ctx, &pk, EVP_PKEY_PUBLIC_KEY, params) != 1)
        pk = NULL;
    EVP_PKEY_CTX_free(ctx);
    OSSL_PARAM_free(params);
    return pk;
}

/* A base64url member of a JWK, decoded; NULL (why set) if absent or bad. */
static unsigned char *jwk_bytes(json_t *jwk, const char *member, size_t *len, char *why) {
    json_t *v = json_object_get(jwk, member);
    unsigned char *out = NULL;
    if (!json_is_string(v) || json_string_length(v) == 0 ||
        (out = drey_auth__b64url_decode(json_string_value(v), json_string_length(v), len)) == NULL)
        snprintf(why, WHY_CAP, "\"%s\" is missing or not base64url", member);
    return out;
}

static bool jwk_rsa(json_t *jwk, jwt_alg_t alg, drey_auth__key *k, char *why) {
    size_t n_len = 0, e_len = 0;
    unsigned char *n_bytes = jwk_bytes(jwk, "n", &n_len, why);
    unsigned char *e_bytes = n_bytes == NULL ? NULL : jwk_bytes(jwk, "e", &e_len, why);
    if (e_bytes == NULL) {
        free(n_bytes);
        return false;
    }
    BIGNUM *n = BN_bin2bn(n_bytes, (int)n_len, NULL), *e = BN_bin2bn(e_bytes, (int)e_len, NULL);
    free(n_bytes);
    free(e_bytes);
    EVP_PKEY *pk = NULL;
    OSSL_PARAM_BLD *bld = OSSL_PARAM_BLD_new();
    if (n != NULL && e != NULL && bld != NULL && OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_N, n) == 1 &&
        OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_E, e) == 1)
        pk = pkey_from_params("RSA", bld);
    OSSL_PARAM_BLD_free(bld);
    BN_free(n);
    BN_free(e);
    if (pk == NULL) {
        snprintf(why, WHY_CAP, "OpenSSL rejects the RSA parameters");
        return false;
    }
    return finish_public_key(pk, alg, k, why);
}

static bool jwk_ec(json_t *jwk, jwt_alg_t alg, drey_auth__key *k, char *why) {
    const curve *cv = curve_of(alg);
    const char *crv = json_string_value(json_object_get(jwk, "crv"));
    if (crv == NULL || strcmp(crv, cv->jwk_crv) != 0) {
        snprintf(why, WHY_CAP, "%s needs crv %s", jwt_alg_str(alg), cv->jwk_crv);
        return false;
    }
    size_t x_len = 0, y_len = 0;
    unsigned char *x = jwk_bytes(jwk, "x", &x_len, why);
    unsigned char *y = x == NULL ? NULL : jwk_bytes(jwk, "y", &y_len, why);
    if (y == NULL || x_len != cv->coord_len || y_len != cv->coord_len) {
        if (y != NULL)
            snprintf(why, WHY_CAP, "x and y must be %zu bytes each on %s", cv->coord_len, cv->jwk_crv);
        free(x);
        free(y);
        return false;
    }
    /* The uncompressed point: 0x04 || x || y. */
    unsigned char point[1 + 2 * 66];
    point[0] = 0x04;
    memcpy(point + 1, x, x_len);
    memcpy(point + 1 + x_len, y, y_len);
    free(x);
    free(y);
    EVP_PKEY *pk = NULL;
    OSSL_PARAM_BLD *bld = OSSL_PARAM_BLD_new();
    if (bld != NULL && OSSL_PARAM_BLD_push_utf8_string(bld, OSSL_PKEY_PARAM_GROUP_NAME, cv->sn, 0) == 1 &&
        OSSL_PARAM_BLD_push_octet_string(bld, OSSL_PKEY_PARAM_PUB_KEY, point, 1 + 2 * cv->coord_len) == 1)
        pk = pkey_from_params("EC", bld);
    OSSL_PARAM_BLD_free(bld);
    if (pk == NULL) {
        snprintf(why, WHY_CAP, "the point is not on %s", cv->jwk_crv);
        return false;
    }
    return finish_public_key(pk, alg, k, why);
}

static bool secret_ok(jwt_alg_t alg, size_t len, char *why) {
    if (len < drey_auth__min_secret(alg)) {
        snprintf(why, WHY_CAP, "%s secret of %zu bytes (at least %zu required)", jwt_alg_str(alg), len,
                 drey_auth__min_secret(alg));
        return false;
    }
    return true;
}

static bool jwk_oct(json_t *jwk, jwt_alg_t alg, drey_auth__key *k, char *why) {
    size_t len = 0;
    unsigned char *secret = jwk_bytes(jwk, "k", &len, why);
    if (secret == NULL)
        return false;
    if (!secret_ok(alg, len, why)) {
        OPENSSL_cleanse(secret, len);
        free(secret);
        return false;
    }
    k->material = secret;
    k->material_len = len;
    return true;
}

/* One JWK into k (kid, alg, material); false with why otherwise. */
static bool jwk_to_key(json_t *jwk, drey_auth__key *k, char *why) {
    static const char *const kty_of[] = {[FAMILY_HS] = "oct", [FAMILY_RS] = "RSA", [FAMILY_ES] = "EC"};
    const char *kid = json_string_value(json_object_get(jwk, "kid"));
    const char *alg_name = json_string_value(json_object_get(jwk, "alg"));
    const char *kty = json_string_value(json_object_get(jwk, "kty"));
    json_t *use = json_object_get(jwk, "use");
    if (!json_is_object(jwk)) {
        snprintf(why, WHY_CAP, "not a JSON object");
        return false;
    }
    if (kid == NULL || kid[0] == '\0') {
        snprintf(why, WHY_CAP, "no \"kid\"");
        return false;
    }
    if (alg_name == NULL) {
        snprintf(why, WHY_CAP, "no \"alg\" (required on every key)");
        return false;
    }
    jwt_alg_t alg = parse_alg(alg_name);
    if (alg == JWT_ALG_INVAL) {
        snprintf(why, WHY_CAP, "unsupported alg");
        return false;
    }
    if (use != NULL && !(json_is_string(use) && strcmp(json_string_value(use), "sig") == 0)) {
        snprintf(why, WHY_CAP, "\"use\" is not \"sig\"");
        return false;
    }
    alg_family fam = family_of(alg);
    if (kty == NULL || strcmp(kty, kty_of[fam]) != 0) {
        snprintf(why, WHY_CAP, "alg %s needs kty %s", jwt_alg_str(alg), kty_of[fam]);
        return false;
    }
    k->alg = alg;
    bool ok = fam == FAMILY_HS ? jwk_oct(jwk, alg, k, why) : fam == FAMILY_RS ? jwk_rsa(jwk, alg, k, why)
                                                                           : jwk_ec(jwk, alg, k, why);
    if (ok)
        k->kid = drey_xstrdup(kid);
    return ok;
}

/* ---- the key set under construction ------------------------------------ */

typedef struct builder {
    drey_auth__key *keys;
    size_t n, cap;
} builder;

static void key_clear(drey_auth__key *k) {
    if (k->material != NULL) {
        OPENSSL_cleanse(k->material, k->material_len);
        free(k->material);
    }
    EVP_PKEY_free(k->pkey);
    free(k->kid);
    memset(k, 0, sizeof *k);
}

static void builder_push(builder *b, drey_auth__key *k) {
    if (b->n == b->cap) {
        b->cap = b->cap == 0 ? 8 : b->cap * 2;
        b->keys = drey_xrealloc(b->keys, b->cap, sizeof *b->keys);
    }
    b->keys[b->n++] = *k;
}

static void skipped(const char *source, const char *kid, const char *why) {
    DREY_LOG_WARN("auth key skipped", DREY_LOG_STR("source", source), DREY_LOG_STR("kid", kid),
                  DREY_LOG_STR("reason", why));
}

/* Reads a whole regular file (following symlinks) of at most max bytes. */
static unsigned char *read_file(const char *path, size_t max, size_t *len, char *why) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, WHY_CAP, "%s", strerror(errno));
        return NULL;
    }
    struct stat st;
    unsigned char *buf = NULL;
    if (fstat(fd, &st) != 0) {
        snprintf(why, WHY_CAP, "%s", strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        snprintf(why, WHY_CAP, "not a regular file");
    } else if ((uint64_t)st.st_size > max) {
        snprintf(why, WHY_CAP, "larger than %zu bytes", max);
    } else {
        buf = drey_xmalloc((size_t)st.st_size + 1);
        size_t got = 0;
        while (got < (size_t)st.st_size) {
            ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                break; /* shrank under us (or failed): use what is there */
            got += (size_t)r;
        }
        buf[got] = '\0';
        *len = got;
    }
    close(fd);
    return buf;
}

static bool load_jwks(const char *path, builder *b, char *err, size_t err_cap) {
    char why[WHY_CAP];
    size_t len = 0;
    unsigned char *text = read_file(path, DREY_AUTH_MAX_KEY_FILE, &len, why);
    if (text == NULL) {
        set_err(err, err_cap, "jwks_file %s: %s", path, why);
        return false;
    }
    json_error_t jerr;
    json_t *root = json_loadb((const char *)text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    json_t *keys = json_object_get(root, "keys");
    if (!json_is_array(keys)) {
        if (root == NULL)
            set_err(err, err_cap, "jwks_file %s: not JSON (line %d: %s)", path, jerr.line, jerr.text);
        else
            set_err(err, err_cap, "jwks_file %s: not a JWKS (no \"keys\" array)", path);
        json_decref(root);
        return false;
    }
    size_t index, added = 0;
    json_t *jwk;
    json_array_foreach(keys, index, jwk) {
        drey_auth__key k = {0};
        if (!jwk_to_key(jwk, &k, why)) {
            const char *kid = json_string_value(json_object_get(jwk, "kid"));
            char source[64];
            snprintf(source, sizeof source, "jwks_file keys[%zu]", index);
            skipped(source, kid != NULL ? kid : "", why);
            key_clear(&k);
            continue;
        }
        builder_push(b, &k);
        added++;
    }
    json_decref(root);
    if (added == 0) {
        set_err(err, err_cap, "jwks_file %s: no usable key (%zu skipped, see the log)", path, json_array_size(keys));
        return false;
    }
    return true;
}

static bool has_suffix(const char *s, size_t n, const char *suffix) {
    size_t m = strlen(suffix);
    return n > m && memcmp(s + n - m, suffix, m) == 0;
}

/* One file of the key directory into k; false with why otherwise. */
static bool file_to_key(const char *dir, const char *name, bool pem, drey_auth__key *k, char *why) {
    size_t n = strlen(name) - 4; /* without ".pem" / ".key" */
    const char *dot = NULL;
    for (size_t i = n; i > 0; i--)
        if (name[i - 1] == '.') {
            dot = name + i - 1;
            break;
        }
    if (dot == NULL || dot == name) {
        snprintf(why, WHY_CAP, "the name is not <kid>.<ALG>%s", pem ? ".pem" : ".key");
        return false;
    }
    char alg_name[16];
    size_t alg_len = (size_t)(name + n - dot - 1);
    if (alg_len >= sizeof alg_name) {
        snprintf(why, WHY_CAP, "unsupported alg");
        return false;
    }
    memcpy(alg_name, dot + 1, alg_len);
    alg_name[alg_len] = '\0';
    jwt_alg_t alg = parse_alg(alg_name);
    if (alg == JWT_ALG_INVAL) {
        snprintf(why, WHY_CAP, "unsupported alg");
        return false;
    }
    bool hs = family_of(alg) == FAMILY_HS;
    if (hs == pem) {
        snprintf(why, WHY_CAP, "%s keys are %s files", jwt_alg_str(alg), hs ? "<kid>.<ALG>.key" : "<kid>.<ALG>.pem");
        return false;
    }
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path) {
        snprintf(why, WHY_CAP, "path too long");
        return false;
    }
    size_t len = 0;
    unsigned char *bytes = read_file(path, DREY_AUTH_MAX_KEY_FILE, &len, why);
    if (bytes == NULL)
        return false;
    k->alg = alg;
    bool ok;
    if (hs) {
        ok = secret_ok(alg, len, why);
        if (ok) {
            k->material = bytes;
            k->material_len = len;
            bytes = NULL;
        }
    } else {
        BIO *bio = BIO_new_mem_buf(bytes, (int)len);
        EVP_PKEY *pk = bio == NULL ? NULL : PEM_read_bio_PUBKEY(bio, NULL, NULL, NULL);
        BIO_free(bio);
        if (pk == NULL) {
            snprintf(why, WHY_CAP, "not a PEM public key (BEGIN PUBLIC KEY)");
            ok = false;
        } else {
            ok = finish_public_key(pk, alg, k, why);
        }
    }
    if (bytes != NULL) {
        OPENSSL_cleanse(bytes, len);
        free(bytes);
    }
    if (ok)
        k->kid = drey_xstrndup(name, (size_t)(dot - name));
    return ok;
}

static bool load_dir(const char *dir, builder *b, char *err, size_t err_cap) {
    DIR *d = opendir(dir);
    if (d == NULL) {
        set_err(err, err_cap, "keys_dir %s: %s", dir, strerror(errno));
        return false;
    }
    size_t added = 0, skips = 0;
    struct dirent *de;
    char why[WHY_CAP];
    while ((de = readdir(d)) != NULL) {
        const char *name = de->d_name;
        size_t n = strlen(name);
        bool pem = has_suffix(name, n, ".pem");
        if (name[0] == '.' || !(pem || has_suffix(name, n, ".key")))
            continue; /* not a key file: ignored */
        drey_auth__key k = {0};
        if (!file_to_key(dir, name, pem, &k, why)) {
            char source[300];
            snprintf(source, sizeof source, "keys_dir %s", name);
            skipped(source, "", why);
            key_clear(&k);
            skips++;
            continue;
        }
        builder_push(b, &k);
        added++;
    }
    closedir(d);
    if (added == 0) {
        set_err(err, err_cap, "keys_dir %s: no usable key (%zu skipped, see the log)", dir, skips);
        return false;
    }
    return true;
}

static int key_cmp(const void *x, const void *y) {
    return strcmp(((const drey_auth__key *)x)->kid, ((const drey_auth__key *)y)->kid);
}

static void builder_free(builder *b) {
    for (size_t i = 0; i < b->n; i++)
        key_clear(&b->keys[i]);
    free(b->keys);
}

drey_auth__keyset *drey_auth__keyset_load(const char *jwks_file, const char *keys_dir, char *err, size_t err_cap) {
    bool have_jwks = jwks_file != NULL && jwks_file[0] != '\0';
    bool have_dir = keys_dir != NULL && keys_dir[0] != '\0';
    if (!have_jwks && !have_dir) {
        set_err(err, err_cap, "no key source: set a JWKS file or a keys directory");
        return NULL;
    }
    builder b = {0};
    if ((have_jwks && !load_jwks(jwks_file, &b, err, err_cap)) || (have_dir && !load_dir(keys_dir, &b, err, err_cap))) {
        builder_free(&b);
        return NULL;
    }
    qsort(b.keys, b.n, sizeof *b.keys, key_cmp);
    for (size_t i = 1; i < b.n; i++)
        if (strcmp(b.keys[i - 1].kid, b.keys[i].kid) == 0) {
            set_err(err, err_cap, "two keys have kid \"%s\" (kids must be unique across the JWKS and the keys dir)",
                    b.keys[i].kid);
            builder_free(&b);
            return NULL;
        }
    drey_auth__keyset *ks = drey_xcalloc(1, sizeof *ks);
    ks->n = b.n;
    ks->keys = b.keys;
    return ks;
}

void drey_auth__keyset_free(drey_auth__keyset *ks) {
    if (ks == NULL)
        return;
    for (size_t i = 0; i < ks->n; i++)
        key_clear(&ks->keys[i]);
    free(ks->keys);
    free(ks);
}

const drey_auth__key *drey_auth__keyset_find(const drey_auth__keyset *ks, const char *kid) {
    if (kid == NULL)
        return ks->n == 1 ? &ks->keys[0] : NULL;
    size_t lo = 0, hi = ks->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(kid, ks->keys[mid].kid);
        if (c == 0)
            return &ks->keys[mid];
        if (c < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return NULL;
}
