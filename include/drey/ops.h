/*
 * ops — the operators' HTTP listener (libmicrohttpd), on its own port.
 *
 *   GET /health/live           200 while the process runs
 *   GET /health/ready          200 when the node can serve (recovered, journal
 *                              not failed); 503 otherwise. Disk and memory
 *                              pressure do not make it fail.
 *   GET /health/ready/details  the readiness document as JSON (camelCase)
 *   GET /metrics               Prometheus text exposition
 *
 * The details and the metrics are open from loopback; from anywhere else they
 * need `authorization: Bearer <JWT>` that the node's keys verify (401), and
 * with an authorization policy a caller granted the metrics verb (403
 * otherwise): the token's grants, or the anonymous bindings'.
 */
#ifndef DREY_OPS_H
#define DREY_OPS_H

#include <stddef.h>
#include <stdio.h>

#include "drey/admin.h"
#include "drey/auth.h"
#include "drey/authz.h"
#include "drey/metrics.h"

typedef struct drey_ops drey_ops;

typedef struct drey_ops_options {
    const char *listen;      /* host:port; port 0 picks one */
    drey_admin *admin;
    drey_metrics *metrics;
    drey_auth *auth;         /* NULL: remote callers get 401 */
    drey_authz *authz;       /* NULL: no policy (a verified token suffices) */
} drey_ops_options;

drey_ops *drey_ops_start(const drey_ops_options *opts, char *err, size_t err_cap);
int drey_ops_port(const drey_ops *o);
void drey_ops_stop(drey_ops *o);

#endif
