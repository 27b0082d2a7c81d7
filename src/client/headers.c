/*
 * headers — request metadata; see headers.h.
 */
#include "headers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <grpc/slice.h>

#include "drey/alloc.h"

#define BEARER "Bearer "

static bool legal(const char *key, grpc_slice value, char *err, size_t err_cap) {
    grpc_slice k = grpc_slice_from_static_string(key);
    if (key[0] == '\0' || !grpc_header_key_is_legal(k)) {
        snprintf(err, err_cap, "header \"%s\": keys are lowercase letters, digits, '-', '_' and '.'", key);
        return false;
    }
    if (!grpc_is_binary_header(k) && !grpc_header_nonbin_value_is_legal(value)) {
        snprintf(err, err_cap, "header \"%s\": the value must be printable ASCII (or use a -bin key)", key);
        return false;
    }
    return true;
}

bool drey_client__headers_build(drey_client__headers *h, const char *token, const drey_client_header *extra,
                                size_t n_extra, char *err, size_t err_cap) {
    bool has_token = token != NULL && token[0] != '\0';
    size_t n = n_extra + (has_token ? 1 : 0);
    h->md = drey_xcalloc(n > 0 ? n : 1, sizeof *h->md);
    h->count = 0;
    if (has_token) {
        size_t len = strlen(BEARER) + strlen(token);
        grpc_slice v = grpc_slice_malloc(len);
        memcpy(GRPC_SLICE_START_PTR(v), BEARER, strlen(BEARER));
        memcpy(GRPC_SLICE_START_PTR(v) + strlen(BEARER), token, strlen(token));
        h->md[h->count].key = grpc_slice_from_static_string("authorization");
        h->md[h->count].value = v;
        h->count++;
        if (!legal("authorization", v, err, err_cap)) {
            snprintf(err, err_cap, "the token must be printable ASCII");
            drey_client__headers_destroy(h);
            return false;
        }
    }
    for (size_t i = 0; i < n_extra; i++) {
        grpc_slice v = grpc_slice_from_copied_string(extra[i].value != NULL ? extra[i].value : "");
        const char *key = extra[i].key != NULL ? extra[i].key : "";
        if (!legal(key, v, err, err_cap)) {
            grpc_slice_unref(v);
            drey_client__headers_destroy(h);
            return false;
        }
        h->md[h->count].key = grpc_slice_from_copied_string(key);
        h->md[h->count].value = v;
        h->count++;
    }
    return true;
}

void drey_client__headers_destroy(drey_client__headers *h) {
    for (size_t i = 0; i < h->count; i++) {
        grpc_slice_unref(h->md[i].key);
        grpc_slice_unref(h->md[i].value);
    }
    free(h->md);
    h->md = NULL;
    h->count = 0;
}
