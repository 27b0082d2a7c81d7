/*
 * cli — what the commands of `drey` share: the parsed command line, the
 * connection to the node (several endpoints, failing over), output and
 * error reporting. main.c parses and dispatches; each command is a function
 * of this shape in main.c, cluster.c or drain.c.
 */
#ifndef DREY_CLI_CLI_H
#define DREY_CLI_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "drey/arena.h"
#include "drey/client.h"
#include "out.h"

enum {
    DREY_EXIT_OK = 0,
    DREY_EXIT_FAILED = 1,   /* a call failed: server error, unreachable, deadline */
    DREY_EXIT_USAGE = 2,    /* the command line is wrong */
    DREY_EXIT_NEGATIVE = 3, /* not found, not added, not serving, not ready, not all exist */
};

#define DREY_CLI_MAX_ENDPOINTS 16

typedef struct drey_cli {
    /* The connection. */
    const char *endpoints[DREY_CLI_MAX_ENDPOINTS];
    size_t n_endpoints, current; /* the endpoint in use */
    drey_client_options copts;    /* target set per endpoint */
    char *token;                  /* from --token or --token-file */
    char *endpoints_buf;          /* --endpoints, split in place */
    drey_client *client;          /* open on endpoints[current], or NULL */
    int64_t timeout_ms;
    bool timeout_given;           /* streams run until interrupted unless it was */
    /* The command line. */
    const char *cache;
    drey_out_format format;
    const char **opt;             /* by option index: the value given (or "" for a flag), or NULL */
    drey_arena arena;
} drey_cli;

/* The option's value or NULL, by its long name (only those of the
 * command; see main.c's table). */
const char *drey_cli_opt(const drey_cli *c, const char *name);

/* A unary call through the endpoints: on a failure of the transport itself
 * (UNAVAILABLE without details: refused, reset, no route) the next endpoint
 * is tried with the same request, so writes carry a request_id. Returns the
 * status code; on OK *resp is set. */
grpc_status_code drey_cli_call(drey_cli *c, const char *method, const ProtobufCMessage *req,
                               const ProtobufCMessageDescriptor *type, void *resp, drey_client_status *st);
/* The same with bytes (drey call). */
grpc_status_code drey_cli_call_raw(drey_cli *c, const char *method, const uint8_t *req, size_t len,
                                   ProtobufCBinaryData *resp, drey_client_status *st);
/* The client of a live endpoint for a stream (a health check finds it);
 * NULL with st set when none answers. */
drey_client *drey_cli_stream_client(drey_cli *c, drey_client_status *st);

/* A failed call on stderr: text (code, reason, metadata, violations, retry)
 * or, with -o json, one JSON object. Returns DREY_EXIT_FAILED. */
int drey_cli_report(const drey_cli *c, const drey_client_status *st);
/* The status as a JSON object (code, message, reason, domain, metadata,
 * fieldViolations, quotaViolations, retryDelayMs). */
json_t *drey_cli_status_json(const drey_client_status *st);

/* "2026-01-02T03:04:05.123Z". */
json_t *drey_cli_timestamp(const Google__Protobuf__Timestamp *t);

/* The commands outside main.c. */
int drey_cli_cluster_init(drey_cli *c, char **args);
int drey_cli_cluster_status(drey_cli *c, char **args);
int drey_cli_drain(drey_cli *c, char **args);

#endif
