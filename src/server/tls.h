/* TLS server credentials that reload their files (internal). */
#ifndef DREY_SERVER_TLS_H
#define DREY_SERVER_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include <grpc/grpc_security.h>

typedef struct drey_server__tls drey_server__tls;

/* Credentials serving cert/key (PEM files), requiring and verifying client
 * certificates signed by client_ca when it is given (mTLS). The files are
 * checked at every new connection and read again when they changed, so
 * certificates rotate without a restart; a rotation that does not load keeps
 * the previous certificates. NULL with err when the first load fails. */
drey_server__tls *drey_server__tls_create(const char *cert, const char *key, const char *client_ca,
                                          grpc_server_credentials **creds, char *err, size_t err_cap);
void drey_server__tls_destroy(drey_server__tls *t);

#endif
