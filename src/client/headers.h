/*
 * headers — the request metadata a client sends on every call (internal to
 * the client module; exported for its unit tests).
 */
#ifndef DREY_CLIENT_HEADERS_H
#define DREY_CLIENT_HEADERS_H

#include <stdbool.h>
#include <stddef.h>

#include <grpc/grpc.h>

#include "drey/client.h"

typedef struct drey_client__headers {
    grpc_metadata *md; /* keys and values are owned slices */
    size_t count;
} drey_client__headers;

/* Builds "authorization: Bearer <token>" (when token is non-empty) followed
 * by the extra headers, checking each with gRPC's rules (lowercase legal
 * keys, printable values unless the key ends in "-bin"). Returns false with a
 * message in err, and nothing to free, when one is illegal. */
bool drey_client__headers_build(drey_client__headers *h, const char *token, const drey_client_header *extra,
                                size_t n_extra, char *err, size_t err_cap);
void drey_client__headers_destroy(drey_client__headers *h);

#endif
