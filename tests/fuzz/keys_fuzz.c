/*
 * Fuzz target: loading key sources (src/auth/keys.c): a JWKS file, or one
 * file of a key directory, whose name says its kid and algorithm.
 *
 * Byte 0 picks what the rest of the input is: the JWKS file, or a key
 * directory file with one of the names below (PEM public keys, HS secrets,
 * and names that are not key files). The file is written to a temporary
 * directory and the key set loaded from it.
 *
 * Properties: a load either fails with a reason or gives a key set whose
 * kids are sorted and unique and where each key is findable by its kid.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "drey/log.h"
#include "fuzz_util.h"
#include "src/auth/keys.h"

static const char *const names[] = {
    "k1.RS256.pem", "k1.RS384.pem", "k1.RS512.pem", "k1.ES256.pem", "k1.ES384.pem", "k1.ES512.pem",
    "k1.HS256.key", "k1.HS384.key", "k1.HS512.key", "k1.PS256.pem", "k1.RS256.key", "k1.HS256.pem",
    ".hidden.HS256.key", "noalg.pem", "k1.none.key",
};
#define N_NAMES (sizeof names / sizeof names[0])

static char dir[64], jwks[96], keydir[96];

static void write_file(const char *path, const uint8_t *d, size_t n) {
    FILE *f = fopen(path, "wb");
    FUZZ_CHECK(f != NULL, "cannot write %s", path);
    fwrite(d, 1, n, f);
    fclose(f);
}

static void cleanup(void) {
    unlink(jwks);
    for (size_t i = 0; i < N_NAMES; i++) {
        char p[160];
        snprintf(p, sizeof p, "%s/%s", keydir, names[i]);
        unlink(p);
    }
    rmdir(keydir);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    drey_log_set_level(DREY_LOG_LEVEL_ERROR); /* skipped keys are expected here */
    snprintf(dir, sizeof dir, "%s/drey-fuzz-jwks-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    FUZZ_CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(jwks, sizeof jwks, "%s/jwks.json", dir);
    snprintf(keydir, sizeof keydir, "%s/keys", dir);
    FUZZ_CHECK(mkdir(keydir, 0700) == 0, "mkdir");
    atexit(cleanup);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > DREY_AUTH_MAX_KEY_FILE)
        return 0;
    size_t pick = data[0] % (N_NAMES + 1);
    char path[160], err[512];
    drey_auth__keyset *ks;
    if (pick == N_NAMES) {
        write_file(jwks, data + 1, size - 1);
        ks = drey_auth__keyset_load(jwks, NULL, err, sizeof err);
        strcpy(path, jwks);
    } else {
        snprintf(path, sizeof path, "%s/%s", keydir, names[pick]);
        write_file(path, data + 1, size - 1);
        ks = drey_auth__keyset_load(NULL, keydir, err, sizeof err);
    }
    unlink(path);
    if (ks == NULL) {
        FUZZ_CHECK(memchr(err, 0, sizeof err) != NULL && err[0] != '\0', "a failed load without a reason");
        return 0;
    }
    FUZZ_CHECK(ks->n > 0, "an empty key set loaded");
    for (size_t i = 0; i < ks->n; i++) {
        const drey_auth__key *k = &ks->keys[i];
        FUZZ_CHECK(k->kid != NULL, "a key without kid");
        FUZZ_CHECK(i == 0 || strcmp(ks->keys[i - 1].kid, k->kid) < 0, "kids not sorted and unique");
        FUZZ_CHECK(drey_auth__keyset_find(ks, k->kid) == k, "kid %s not found", k->kid);
        FUZZ_CHECK((k->pkey != NULL) != (k->material != NULL), "a key with %s", k->pkey ? "both" : "neither");
    }
    drey_auth__keyset_free(ks);
    return 0;
}
