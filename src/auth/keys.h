/* Key sets: the verification keys loaded from a JWKS file and a key
 * directory, internal to auth. A key set is immutable once loaded. */
#ifndef DREY_AUTH_KEYS_H
#define DREY_AUTH_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jwt.h>
#include <openssl/evp.h>

/* Largest JWKS or key file read (bytes). */
#define DREY_AUTH_MAX_KEY_FILE (1u << 20)
/* Smallest RSA modulus accepted (bits). */
#define DREY_AUTH_MIN_RSA_BITS 2048

typedef struct drey_auth__key {
    char *kid;
    jwt_alg_t alg;           /* the only algorithm this key verifies */
    unsigned char *material; /* HS*: the secret, handed to libjwt */
    size_t material_len;
    EVP_PKEY *pkey;          /* RS*, ES*: the public key, parsed once (verify.c) */
} drey_auth__key;

typedef struct drey_auth__keyset {
    uint64_t generation;  /* set by the owner; tags cache entries */
    size_t n;
    drey_auth__key *keys; /* sorted by kid, kids unique */
} drey_auth__keyset;

/* Loads every usable key of the configured sources (NULL: not configured).
 * Unusable keys are skipped with a warning in the log. NULL with a reason
 * in err when a configured source cannot be read or parsed, holds no usable
 * key, or two keys share a kid. */
drey_auth__keyset *drey_auth__keyset_load(const char *jwks_file, const char *keys_dir, char *err, size_t err_cap);
void drey_auth__keyset_free(drey_auth__keyset *ks);

/* The key with that kid; with kid NULL, the only key if there is exactly
 * one. NULL otherwise. */
const drey_auth__key *drey_auth__keyset_find(const drey_auth__keyset *ks, const char *kid);

/* HS256/384/512 -> 32/48/64: the shortest secret accepted (bytes), the
 * digest size as RFC 7518 section 3.2 requires; 0 for other algorithms. */
size_t drey_auth__min_secret(jwt_alg_t alg);

#endif
