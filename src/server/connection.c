/*
 * connection — what a call says of the connection it came on: a number
 * (conn:<n>, the principal of a caller without a token, one per HTTP/2
 * connection) and whether the peer's verified certificate names a node id
 * (the internal listener's mutual TLS).
 */
#include <stdio.h>
#include <string.h>

#include "internal.h"

/* Connection numbers live on the connection's auth context, which grpc core
 * shares between all calls of one connection (drey installs no auth metadata
 * processor, which would give each call its own). Properties are read and
 * added under a lock striped by context, since adding may reallocate the
 * property array another thread is reading. */
#define CONN_STRIPES 64
static pthread_mutex_t conn_stripes[CONN_STRIPES] = {[0 ... CONN_STRIPES - 1] = PTHREAD_MUTEX_INITIALIZER};
static _Atomic uint64_t next_conn = 1;

const char *drey_call_connection(drey_call *c) {
    if (c->conn[0] != '\0')
        return c->conn;
    grpc_auth_context *ac = grpc_call_auth_context(c->call);
    if (ac == NULL) {
        snprintf(c->conn, sizeof c->conn, "conn:0");
        return c->conn;
    }
    pthread_mutex_t *mu = &conn_stripes[((uintptr_t)ac >> 4) % CONN_STRIPES];
    pthread_mutex_lock(mu);
    grpc_auth_property_iterator it = grpc_auth_context_find_properties_by_name(ac, "drey.connection");
    const grpc_auth_property *p = grpc_auth_property_iterator_next(&it);
    if (p != NULL) {
        snprintf(c->conn, sizeof c->conn, "conn:%.*s", (int)p->value_length, p->value);
    } else {
        char n[24];
        snprintf(n, sizeof n, "%llu", (unsigned long long)atomic_fetch_add(&next_conn, 1));
        grpc_auth_context_add_cstring_property(ac, "drey.connection", n);
        snprintf(c->conn, sizeof c->conn, "conn:%s", n);
    }
    pthread_mutex_unlock(mu);
    grpc_auth_context_release(ac);
    return c->conn;
}

static bool property_is(grpc_auth_context *ac, const char *name, const char *id, size_t len) {
    grpc_auth_property_iterator it = grpc_auth_context_find_properties_by_name(ac, name);
    for (const grpc_auth_property *p; (p = grpc_auth_property_iterator_next(&it)) != NULL;) {
        if (p->value_length == len && memcmp(p->value, id, len) == 0)
            return true;
    }
    return false;
}

bool drey_call_peer_is(drey_call *c, const char *id, size_t len) {
    grpc_auth_context *ac = grpc_call_auth_context(c->call);
    if (ac == NULL)
        return false;
    /* Properties are read under the connection's stripe: drey_call_connection
     * may be adding one to the same context. */
    pthread_mutex_t *mu = &conn_stripes[((uintptr_t)ac >> 4) % CONN_STRIPES];
    pthread_mutex_lock(mu);
    bool ok = grpc_auth_context_peer_is_authenticated(ac) &&
              (property_is(ac, GRPC_X509_SAN_PROPERTY_NAME, id, len) ||
               property_is(ac, GRPC_X509_CN_PROPERTY_NAME, id, len));
    pthread_mutex_unlock(mu);
    grpc_auth_context_release(ac);
    return ok;
}

