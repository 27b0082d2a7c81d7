/*
 * cli — what the commands of `drey` share: the parsed command line, the
 * connection to the node (several endpoints, failing over: conn.c), output
 * and error reporting, and the data commands' requests (request.c). main.c
 * parses and dispatches; each command is a function of this shape in
 * data.c, stream.c, node.c, call.c, cluster.c or drain.c.
 */
#ifndef DREY_CLI_CLI_H
#define DREY_CLI_CLI_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "drey/arena.h"
#include "drey/cache/v1/cache.pb-c.h"
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

/* A unary call (drey_cli_call) whose failure is reported (drey_cli_report):
 * false with *rc set then. */
bool drey_cli_call_ok(drey_cli *c, const char *method, const ProtobufCMessage *req,
                      const ProtobufCMessageDescriptor *type, void *resp, int *rc);

/* A negative answer: what on stderr in text, the row on stdout in JSON.
 * Takes the row; returns DREY_EXIT_NEGATIVE. */
int drey_cli_negative(drey_cli *c, const char *what, json_t *row);

/* One row printed alone, in the -o format (takes the row). */
int drey_cli_print_one(drey_cli *c, const char *const *columns, json_t *row);

/* "2026-01-02T03:04:05.123Z". */
json_t *drey_cli_timestamp(const Google__Protobuf__Timestamp *t);

/* Sets kind and value of row from v. Bytes are base64 in JSON; in text and
 * table they are the bytes themselves, escaped where they are not
 * printable UTF-8 (out.h). */
void drey_cli_put_value(const drey_cli *c, json_t *row, const Drey__Cache__V1__Value *v);

/* --- request.c: the data commands' requests ------------------------------------- */

bool drey_cli_parse_int64(const char *s, int64_t *out);
bool drey_cli_parse_uint64(const char *s, uint64_t *out);
/* A whole file ("-": standard input) into arena memory, NUL-terminated;
 * false with a message in err. */
bool drey_cli_read_whole(const char *path, drey_arena *a, ProtobufCBinaryData *out, char *err, size_t cap);

/* How VALUE reads: --int, --json, --file or a string. */
typedef enum drey_cli_value_kind {
    DREY_CLI_VALUE_STRING,
    DREY_CLI_VALUE_INT,
    DREY_CLI_VALUE_JSON,
    DREY_CLI_VALUE_FILE,
} drey_cli_value_kind;

/* A data operation as a command line or a pipeline line gives it. */
typedef struct drey_cli_op {
    char **args; /* the arguments after its name, NULL-terminated */
    int n_args;
    drey_cli_value_kind kind;
    const char *ttl;        /* --ttl as given, or NULL */
    const char *if_version; /* --if-version as given, or NULL */
} drey_cli_op;

/* The operation of a command's arguments and options. */
drey_cli_op drey_cli_op_of_command(const drey_cli *c, char **args);
/* The operation of a pipeline line's words after the first (the name):
 * its options (--ttl=D, --if-version=N, --int, --json) taken out, the rest
 * into args (room for cap). */
drey_cli_op drey_cli_op_of_words(char **words, int n, char **args, size_t cap);

/* The request of the operation called name (get, set, add, rm, del, mget,
 * exists, incr, expire, touch, persist, ttl: request.c's table), in c's
 * arena, and its method's path in *method (may be NULL); NULL with a
 * message in err when the options or arguments are wrong. line: a
 * pipeline line, whose argument count is checked here (rm is then
 * RemoveMany of one key). */
ProtobufCMessage *drey_cli_build(drey_cli *c, const char *name, const drey_cli_op *op, bool line, const char **method,
                                 char *err, size_t cap);
/* The rm command's Remove, with --if-version. */
ProtobufCMessage *drey_cli_build_remove(drey_cli *c, const drey_cli_op *op, char *err, size_t cap);

/* VALUE, --ttl, a Duration and a request_id, in c's arena (NULL / false
 * with a message in err). */
Drey__Cache__V1__Value *drey_cli_value(drey_cli *c, drey_cli_value_kind kind, const char *text, char *err,
                                       size_t cap);
bool drey_cli_ttl(drey_cli *c, const char *text, Google__Protobuf__Duration **out, char *err, size_t cap);
Google__Protobuf__Duration *drey_cli_duration(drey_cli *c, int64_t ms);
char *drey_cli_request_id(drey_cli *c);

/* --- main.c and stream.c ------------------------------------------------------------ */

/* Splits a line into words: whitespace separates, '...' and "..." quote
 * (backslash escapes inside "..." and outside quotes). Returns the count,
 * -1 on an unclosed quote. Words point into *buf; free both. */
int drey_cli_split_words(const char *line, char ***words, char **buf);

/* SIGINT and SIGTERM, taken by one thread from the start: they cancel the
 * stream a command reads (registered between interrupter_start and _stop,
 * which then ends normally with fired set), else end the process. */
typedef struct drey_cli_interrupter {
    volatile sig_atomic_t fired;
} drey_cli_interrupter;
void drey_cli_signals_start(void);
void drey_cli_signals_stop(void);
void drey_cli_interrupter_start(drey_cli_interrupter *it, drey_client_stream *s);
void drey_cli_interrupter_stop(drey_cli_interrupter *it);

/* --- the commands (main.c's table) ---------------------------------------------------- */

int drey_cli_cmd_get(drey_cli *c, char **args);
int drey_cli_cmd_mget(drey_cli *c, char **args);
int drey_cli_cmd_exists(drey_cli *c, char **args);
int drey_cli_cmd_set(drey_cli *c, char **args);
int drey_cli_cmd_mset(drey_cli *c, char **args);
int drey_cli_cmd_add(drey_cli *c, char **args);
int drey_cli_cmd_rm(drey_cli *c, char **args);
int drey_cli_cmd_del(drey_cli *c, char **args);
int drey_cli_cmd_incr(drey_cli *c, char **args);
int drey_cli_cmd_expire(drey_cli *c, char **args);
int drey_cli_cmd_persist(drey_cli *c, char **args);
int drey_cli_cmd_ttl(drey_cli *c, char **args);
int drey_cli_cmd_scan(drey_cli *c, char **args);
int drey_cli_cmd_clear(drey_cli *c, char **args);
int drey_cli_cmd_stats(drey_cli *c, char **args);
int drey_cli_cmd_watch(drey_cli *c, char **args);
int drey_cli_cmd_pipeline(drey_cli *c, char **args);
int drey_cli_cmd_health(drey_cli *c, char **args);
int drey_cli_cmd_ready(drey_cli *c, char **args);
int drey_cli_cmd_snapshot(drey_cli *c, char **args);
int drey_cli_cmd_call(drey_cli *c, char **args);
int drey_cli_cmd_list(drey_cli *c, char **args);
int drey_cli_cmd_describe(drey_cli *c, char **args);
int drey_cli_cluster_init(drey_cli *c, char **args);
int drey_cli_cluster_status(drey_cli *c, char **args);
int drey_cli_drain(drey_cli *c, char **args);

#endif
