/*
 * pem — a certificate chain, its private key and a CA bundle read from PEM
 * files, checked, and watched for change, so that TLS material rotates
 * without a restart. The server's listeners and the cluster's calls to peers
 * both load their certificates through it.
 *
 * A file's identity is its inode, size and modification time: a rotation
 * that writes a new file and renames it into place, or rewrites one, shows.
 * Not thread-safe: the owner serialises its calls.
 */
#ifndef DREY_PEM_H
#define DREY_PEM_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>
#include <time.h>

typedef struct drey_pem_id {
    ino_t ino;
    off_t size;
    struct timespec mtime;
} drey_pem_id;

typedef struct drey_pem_files {
    char *paths[3];      /* chain, key, CA (NULL: none) */
    drey_pem_id ids[3];  /* as of the last drey_pem_files_read that kept them */
    bool loaded;         /* a read has succeeded */
} drey_pem_files;

void drey_pem_files_init(drey_pem_files *f, const char *chain, const char *key, const char *ca);
void drey_pem_files_free(drey_pem_files *f);

/* Whether a file's identity differs from the last read's (true before the
 * first); the current identities go to now[] for drey_pem_files_keep. */
bool drey_pem_files_changed(const drey_pem_files *f, drey_pem_id now[3]);
void drey_pem_files_keep(drey_pem_files *f, const drey_pem_id now[3]);

/* Reads the files into NUL-terminated malloc'd texts (pem[2] NULL without a
 * CA) and checks them, since grpc core takes PEM as is and only fails at a
 * handshake: the chain parses, the key parses and belongs to the chain's
 * first certificate, the CA bundle parses. false with err (and pem[] freed)
 * otherwise. */
bool drey_pem_files_read(const drey_pem_files *f, char *pem[3], char *err, size_t cap);

/* Whether the chain's first certificate names `name` (exactly, no
 * wildcard) as TLS hostname verification does: in a DNS subject
 * alternative name, or in its subject's common name when it has none. */
bool drey_pem_names(const char *chain, const char *name);
void drey_pem_free(char *pem[3]);

#endif
