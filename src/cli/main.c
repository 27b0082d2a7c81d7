/*
 * drey — the command-line client of dreyd, with redis-cli's and etcdctl's
 * habits (docs/cli.md is the reference):
 *
 *   drey [options] COMMAND [ARGS] [options]   one command
 *   drey [options]                            interactive (a terminal) or one command per input line
 *
 * Options come anywhere, as --name value or --name=value, and each also
 * from the environment as DREY_<NAME> (upper case, '-' as '_'); the command
 * line wins. -h/--help works on every command. Output is -o text (default),
 * table or json (out.h). Exit status: 0 done, 1 a call failed, 2 usage,
 * 3 a negative answer (not found, not added, not serving, not ready).
 *
 * The commands are a table (below): a row names the command, its arguments,
 * its options and its function.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <editline/readline.h>

#include "cli.h"
#include "drey/admin/v1/admin.pb-c.h"
#include "drey/alloc.h"
#include "drey/cache/v1/cache.pb-c.h"
#include "drey/config.h"
#include "drey/pbjson.h"
#include "drey/version.h"
#include "grpc/health/v1/health.pb-c.h"
#include "json.h"
#include "ops.h"
#include "pbdyn.h"
#include "refl.h"

/* --- options ------------------------------------------------------------------ */

typedef struct option {
    const char *name;
    char shorthand; /* -o, -h; 0: none */
    bool flag;      /* takes no value (or, with optional, a number) */
    const char *arg;
    const char *help;
} option;

/* Every option of every command: one name, one meaning. */
static const option options[] = {
#define GLOBAL_FIRST 0
    {"addr", 0, false, "HOST:PORT", "node to call; repeat (or --endpoints) for failover (default 127.0.0.1:50051)"},
    {"endpoints", 0, false, "A,B,C", "nodes to call, comma-separated, tried in order"},
    {"cache", 0, false, "NAME", "cache (namespace); default: the default cache"},
    {"token", 0, false, "JWT", "bearer token sent with every call"},
    {"token-file", 0, false, "FILE", "read the bearer token from FILE (surrounding whitespace ignored)"},
    {"timeout", 0, false, "DURATION", "deadline of each call (default 5s; streams: none unless given)"},
    {"tls", 0, true, NULL, "TLS with the system's CA roots (implied by any --tls-* option)"},
    {"tls-ca", 0, false, "FILE", "PEM CA that signs the node's certificate"},
    {"tls-cert", 0, false, "FILE", "PEM client certificate, for mutual TLS"},
    {"tls-key", 0, false, "FILE", "PEM key of --tls-cert"},
    {"tls-server-name", 0, false, "NAME", "name to check in the node's certificate (default: the address's host)"},
    {"output", 'o', false, "FORMAT", "text (default), table or json"},
    {"help", 'h', true, NULL, "this help, or the command's"},
#define GLOBAL_COUNT 13
    {"version", 0, true, NULL, "print the version and exit"},
    {"ttl", 0, false, "DURATION", "time to live (250ms, 5s, 2m, 1h)"},
    {"if-version", 0, false, "N", "only if the entry's version is N (0: only if absent)"},
    {"int", 0, true, NULL, "VALUE is an int64"},
    {"json", 0, true, NULL, "VALUE is a JSON object"},
    {"file", 0, true, NULL, "VALUE names a file whose bytes are the value"},
    {"values", 0, true, NULL, "include values"},
    {"prefix", 0, false, "P", "keys starting with P (watch); the cluster's prefix in etcd (cluster: default drey/)"},
    {"count", 0, false, "N", "stop after N events"},
    {"etcd", 0, false, "URLS", "etcd endpoints, comma-separated http(s)://host:port (default $DREY_CLUSTER_ETCD)"},
    {"etcd-ca", 0, false, "FILE", "PEM CA of etcd's https endpoints (default $DREY_CLUSTER_ETCD_CA)"},
    {"etcd-cert", 0, false, "FILE", "PEM client certificate for etcd (default $DREY_CLUSTER_ETCD_CERT)"},
    {"etcd-key", 0, false, "FILE", "PEM key of --etcd-cert (default $DREY_CLUSTER_ETCD_KEY)"},
    {"etcd-user", 0, false, "NAME", "etcd user, with --etcd-password-file (default $DREY_CLUSTER_ETCD_USER)"},
    {"etcd-password-file", 0, false, "FILE", "the etcd user's password (default $DREY_CLUSTER_ETCD_PASSWORD_FILE)"},
    {"ops", 0, false, "HOST:PORT", "dreyd's ops listener (default $DREY_OPS_LISTEN): ready reads its details there (no "
                                   "token from loopback); drain is done once it closes"},
    {"partitions", 0, true, "[N]", "cluster init: partition count (default 256); cluster status: list every partition"},
    {"replication-factor", 0, false, "N", "copies of each partition, 1 to 3 (default 2)"},
    {"initial-nodes", 0, false, "N", "members the controller waits for before the first assignment (default 1)"},
    {"pid", 0, false, "N", "dreyd's process id (default 1: the container's entry point)"},
    {"pid-file", 0, false, "FILE", "read dreyd's process id from FILE"},
    {"wait", 0, false, "DURATION", "give up after this long (default 60s)"},
    {"stdin", 0, true, NULL, "read the request JSON from standard input"},
};
#define N_OPTIONS (sizeof options / sizeof options[0])

static int option_index(const char *name, size_t len) {
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (strlen(options[i].name) == len && strncmp(options[i].name, name, len) == 0)
            return (int)i;
    return -1;
}

const char *drey_cli_opt(const drey_cli *c, const char *name) {
    int i = option_index(name, strlen(name));
    return i >= 0 ? c->opt[i] : NULL;
}

/* --- the connection ------------------------------------------------------------- */

static void disconnect(drey_cli *c) {
    drey_client_close(c->client);
    c->client = NULL;
}

static drey_client *connect_current(drey_cli *c, drey_client_status *st) {
    if (c->client != NULL)
        return c->client;
    char err[512];
    c->copts.target = c->endpoints[c->current];
    c->copts.token = c->token;
    c->client = drey_client_open(&c->copts, err, sizeof err);
    if (c->client == NULL)
        drey_client_status_set(st, GRPC_STATUS_INVALID_ARGUMENT, drey_arena_strndup(&c->arena, err, strlen(err)));
    return c->client;
}

/* A failure of the transport, not an answer: the next endpoint may do. */
static bool transport_failure(const drey_client_status *st) {
    return st->code == GRPC_STATUS_UNAVAILABLE && st->details == NULL;
}

grpc_status_code drey_cli_call(drey_cli *c, const char *method, const ProtobufCMessage *req,
                               const ProtobufCMessageDescriptor *type, void *resp, drey_client_status *st) {
    for (size_t tried = 0; tried < c->n_endpoints; tried++) {
        drey_client *cl = connect_current(c, st);
        if (cl == NULL)
            return st->code;
        if (drey_client_unary(cl, method, req, type, c->timeout_ms, &c->arena, (ProtobufCMessage **)resp, st) ==
                GRPC_STATUS_OK ||
            !transport_failure(st))
            return st->code;
        disconnect(c);
        c->current = (c->current + 1) % c->n_endpoints;
    }
    return st->code;
}

grpc_status_code drey_cli_call_raw(drey_cli *c, const char *method, const uint8_t *req, size_t len,
                                   ProtobufCBinaryData *resp, drey_client_status *st) {
    for (size_t tried = 0; tried < c->n_endpoints; tried++) {
        drey_client *cl = connect_current(c, st);
        if (cl == NULL)
            return st->code;
        if (drey_client_unary_raw(cl, method, req, len, c->timeout_ms, &c->arena, resp, st) == GRPC_STATUS_OK ||
            !transport_failure(st))
            return st->code;
        disconnect(c);
        c->current = (c->current + 1) % c->n_endpoints;
    }
    return st->code;
}

drey_client *drey_cli_stream_client(drey_cli *c, drey_client_status *st) {
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = "";
    Grpc__Health__V1__HealthCheckResponse *resp;
    int64_t saved = c->timeout_ms;
    if (c->timeout_ms < 0)
        c->timeout_ms = 5000;
    grpc_status_code code = drey_cli_call(c, DREY_CLIENT_HEALTH("Check"), &req.base,
                                          &grpc__health__v1__health_check_response__descriptor, &resp, st);
    c->timeout_ms = saved;
    /* Any answer means the node is there (health may be NOT_SERVING while it drains). */
    return code == GRPC_STATUS_OK || !transport_failure(st) ? c->client : NULL;
}

/* --- reporting ------------------------------------------------------------------ */

json_t *drey_cli_status_json(const drey_client_status *st) {
    json_t *o = json_object();
    json_object_set_new(o, "code", json_string(drey_client_code_name(st->code)));
    json_object_set_new(o, "message", json_string(st->message));
    const Google__Rpc__ErrorInfo *ei = st->error_info;
    if (ei != NULL) {
        json_object_set_new(o, "reason", json_string(ei->reason));
        json_object_set_new(o, "domain", json_string(ei->domain));
        json_t *md = json_object();
        for (size_t i = 0; i < ei->n_metadata; i++)
            json_object_set_new(md, ei->metadata[i]->key, json_string(ei->metadata[i]->value));
        json_object_set_new(o, "metadata", md);
    }
    if (st->bad_request != NULL) {
        json_t *a = json_array();
        for (size_t i = 0; i < st->bad_request->n_field_violations; i++) {
            const Google__Rpc__BadRequest__FieldViolation *v = st->bad_request->field_violations[i];
            json_array_append_new(a, json_pack("{ssssss}", "field", v->field, "reason", v->reason, "description",
                                               v->description));
        }
        json_object_set_new(o, "fieldViolations", a);
    }
    if (st->quota_failure != NULL) {
        json_t *a = json_array();
        for (size_t i = 0; i < st->quota_failure->n_violations; i++) {
            const Google__Rpc__QuotaFailure__Violation *v = st->quota_failure->violations[i];
            json_array_append_new(a, json_pack("{ssss}", "subject", v->subject, "description", v->description));
        }
        json_object_set_new(o, "quotaViolations", a);
    }
    if (drey_client_status_retry_delay_ms(st) >= 0)
        json_object_set_new(o, "retryDelayMs", json_integer(drey_client_status_retry_delay_ms(st)));
    return o;
}

int drey_cli_report(const drey_cli *c, const drey_client_status *st) {
    if (c->format == DREY_OUT_JSON) {
        json_t *o = json_pack("{so}", "error", drey_cli_status_json(st));
        drey_out_json_line(stderr, o);
        json_decref(o);
        return DREY_EXIT_FAILED;
    }
    fprintf(stderr, "drey: %s: %s\n", drey_client_code_name(st->code), st->message);
    const Google__Rpc__ErrorInfo *ei = st->error_info;
    if (ei != NULL) {
        fprintf(stderr, "  reason: %s (%s)\n", ei->reason, ei->domain);
        for (size_t i = 0; i < ei->n_metadata; i++)
            fprintf(stderr, "  %s: %s\n", ei->metadata[i]->key, ei->metadata[i]->value);
    }
    for (size_t i = 0; st->bad_request != NULL && i < st->bad_request->n_field_violations; i++) {
        const Google__Rpc__BadRequest__FieldViolation *v = st->bad_request->field_violations[i];
        fprintf(stderr, "  field %s: %s: %s\n", v->field, v->reason, v->description);
    }
    for (size_t i = 0; st->quota_failure != NULL && i < st->quota_failure->n_violations; i++) {
        const Google__Rpc__QuotaFailure__Violation *v = st->quota_failure->violations[i];
        fprintf(stderr, "  quota %s: %s\n", v->subject, v->description);
    }
    if (drey_client_status_retry_delay_ms(st) >= 0)
        fprintf(stderr, "  retry after: %" PRId64 "ms\n", drey_client_status_retry_delay_ms(st));
    return DREY_EXIT_FAILED;
}

/* A negative answer: on stderr in text, and the row on stdout in JSON. */
static int negative(drey_cli *c, const char *what, json_t *row) {
    if (c->format == DREY_OUT_JSON && row != NULL)
        drey_out_json_line(stdout, row);
    else
        fprintf(stderr, "%s\n", what);
    json_decref(row);
    return DREY_EXIT_NEGATIVE;
}

static bool call(drey_cli *c, const char *method, const ProtobufCMessage *req, const ProtobufCMessageDescriptor *type,
                 void *resp, int *rc) {
    drey_client_status st;
    if (drey_cli_call(c, method, req, type, resp, &st) == GRPC_STATUS_OK)
        return true;
    *rc = drey_cli_report(c, &st);
    return false;
}

/* --- values ----------------------------------------------------------------------- */

json_t *drey_cli_timestamp(const Google__Protobuf__Timestamp *t) {
    if (t == NULL)
        return json_null();
    time_t secs = (time_t)t->seconds;
    struct tm tm;
    char buf[48];
    gmtime_r(&secs, &tm);
    size_t n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, sizeof buf - n, ".%03dZ", t->nanos / 1000000);
    return json_string(buf);
}

static const char *const kind_names[] = {"none", "bytes", "string", "int64", "double", "bool", "json", "null"};

static drey_out_format value_format; /* of the command running: bytes differ */

/* Sets kind and value of row from v. Bytes are base64 in JSON; in text and
 * table they are the bytes themselves, escaped where they are not
 * printable UTF-8 (out.h). */
static void put_value(json_t *row, const Drey__Cache__V1__Value *v) {
    json_t *x;
    const char *kind = "none";
    switch (v != NULL ? v->kind_case : DREY__CACHE__V1__VALUE__KIND__NOT_SET) {
    case DREY__CACHE__V1__VALUE__KIND_BYTES_VALUE: {
        if (value_format != DREY_OUT_JSON) {
            x = json_stringn_nocheck((const char *)v->bytes_value.data, v->bytes_value.len);
            break;
        }
        static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        const uint8_t *d = v->bytes_value.data;
        size_t n = v->bytes_value.len;
        char *s = drey_xmalloc(4 * ((n + 2) / 3) + 1), *o = s;
        for (size_t i = 0; i < n; i += 3) {
            uint32_t w = (uint32_t)d[i] << 16 | (i + 1 < n ? (uint32_t)d[i + 1] << 8 : 0) | (i + 2 < n ? d[i + 2] : 0);
            *o++ = b64[w >> 18 & 63];
            *o++ = b64[w >> 12 & 63];
            *o++ = i + 1 < n ? b64[w >> 6 & 63] : '=';
            *o++ = i + 2 < n ? b64[w & 63] : '=';
        }
        *o = '\0';
        x = json_string(s);
        free(s);
        break;
    }
    case DREY__CACHE__V1__VALUE__KIND_STRING_VALUE: x = json_string(v->string_value); break;
    case DREY__CACHE__V1__VALUE__KIND_INT64_VALUE: x = json_integer(v->int64_value); break;
    case DREY__CACHE__V1__VALUE__KIND_DOUBLE_VALUE: x = json_real(v->double_value); break;
    case DREY__CACHE__V1__VALUE__KIND_BOOL_VALUE: x = json_boolean(v->bool_value); break;
    case DREY__CACHE__V1__VALUE__KIND_JSON_VALUE: x = drey_cli_json_of_struct(v->json_value); break;
    case DREY__CACHE__V1__VALUE__KIND_NULL_VALUE: x = json_null(); break;
    default: x = json_null();
    }
    if (v != NULL && (size_t)v->kind_case < sizeof kind_names / sizeof kind_names[0])
        kind = kind_names[v->kind_case];
    json_object_set_new(row, "kind", json_string(kind));
    json_object_set_new(row, "value", x != NULL ? x : json_null());
}

static bool parse_int64(const char *s, int64_t *out) {
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end != '\0' || errno != 0)
        return false;
    *out = v;
    return true;
}

static bool parse_uint64(const char *s, uint64_t *out) {
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || *end != '\0' || errno != 0 || s[0] == '-')
        return false;
    *out = v;
    return true;
}

static bool read_whole(const char *path, drey_arena *a, ProtobufCBinaryData *out) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "drey: %s: %s\n", path, strerror(errno));
        return false;
    }
    size_t cap = 4096, len = 0, n;
    uint8_t *buf = drey_xmalloc(cap);
    while ((n = fread(buf + len, 1, cap - len, f)) > 0) {
        len += n;
        if (len == cap)
            buf = drey_xrealloc(buf, cap *= 2, 1);
    }
    bool ok = !ferror(f);
    if (!ok)
        fprintf(stderr, "drey: %s: cannot read\n", path);
    if (f != stdin)
        fclose(f);
    if (ok) {
        out->len = len;
        out->data = drey_arena_alloc(a, len + 1);
        memcpy(out->data, buf, len);
        out->data[len] = '\0';
    }
    free(buf);
    return ok;
}

/* VALUE as --int, --json or --file say; NULL (message printed) if not. */
static Drey__Cache__V1__Value *value_of(drey_cli *c, const char *text) {
    Drey__Cache__V1__Value *v = drey_arena_alloc(&c->arena, sizeof *v);
    drey__cache__v1__value__init(v);
    char err[256];
    if (drey_cli_opt(c, "int") != NULL) {
        v->kind_case = DREY__CACHE__V1__VALUE__KIND_INT64_VALUE;
        if (!parse_int64(text, &v->int64_value)) {
            fprintf(stderr, "drey: --int: \"%s\" is not an int64\n", text);
            return NULL;
        }
    } else if (drey_cli_opt(c, "json") != NULL) {
        v->kind_case = DREY__CACHE__V1__VALUE__KIND_JSON_VALUE;
        if ((v->json_value = drey_cli_json_parse(text, &c->arena, err, sizeof err)) == NULL) {
            fprintf(stderr, "drey: --json: %s\n", err);
            return NULL;
        }
    } else if (drey_cli_opt(c, "file") != NULL) {
        v->kind_case = DREY__CACHE__V1__VALUE__KIND_BYTES_VALUE;
        if (!read_whole(text, &c->arena, &v->bytes_value))
            return NULL;
    } else {
        v->kind_case = DREY__CACHE__V1__VALUE__KIND_STRING_VALUE;
        v->string_value = (char *)text;
    }
    return v;
}

static Google__Protobuf__Duration *duration_of(drey_cli *c, int64_t ms) {
    Google__Protobuf__Duration *d = drey_arena_alloc(&c->arena, sizeof *d);
    google__protobuf__duration__init(d);
    d->seconds = ms / 1000;
    d->nanos = (int32_t)(ms % 1000) * 1000000;
    return d;
}

/* --ttl as a Duration, NULL without one; *bad when it does not parse. */
static Google__Protobuf__Duration *ttl_opt(drey_cli *c, bool *bad) {
    const char *t = drey_cli_opt(c, "ttl");
    int64_t ms;
    *bad = false;
    if (t == NULL)
        return NULL;
    if (!drey_config_parse_duration_ms(t, &ms) || ms <= 0) {
        fprintf(stderr, "drey: --ttl: expected a positive duration (250ms, 5s, 2m, 1h)\n");
        *bad = true;
        return NULL;
    }
    return duration_of(c, ms);
}

/* With several endpoints, a random request_id: a write the CLI sends
 * again to another endpoint (failover) is then applied once. With one
 * there is no second try, and no outcome for the node to remember. */
static char *request_id(drey_cli *c) {
    if (c->n_endpoints < 2)
        return "";
    uint8_t r[16];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r)
        for (size_t i = 0; i < sizeof r; i++)
            r[i] = (uint8_t)rand();
    char *s = drey_arena_alloc(&c->arena, 2 * sizeof r + 6);
    int n = snprintf(s, 6, "drey-");
    for (size_t i = 0; i < sizeof r; i++)
        n += snprintf(s + n, 3, "%02x", r[i]);
    return s;
}

static json_t *row_key(const char *key) {
    return json_pack("{ss}", "key", key);
}

static void row_version(json_t *row, uint64_t version, const Google__Protobuf__Timestamp *expires_at) {
    json_object_set_new(row, "version", json_integer((json_int_t)version));
    json_object_set_new(row, "expiresAt", drey_cli_timestamp(expires_at));
}

/* One row printed alone. */
static int print_one(drey_cli *c, const char *const *columns, json_t *row) {
    drey_out o;
    drey_out_begin(&o, c->format, stdout, columns);
    drey_out_row(&o, row);
    drey_out_flush(&o);
    return DREY_EXIT_OK;
}

static const char *const COLS_VERSION[] = {"version", "expiresAt", NULL};

/* --- data commands ------------------------------------------------------------------ */

static int cmd_get(drey_cli *c, char **a) {
    Drey__Cache__V1__GetRequest req = DREY__CACHE__V1__GET_REQUEST__INIT;
    req.cache = (char *)c->cache;
    req.key = a[0];
    Drey__Cache__V1__GetResponse *r;
    int rc;
    if (!call(c, DREY_CLIENT_CACHE("Get"), &req.base, &drey__cache__v1__get_response__descriptor, &r, &rc))
        return rc;
    json_t *row = row_key(a[0]);
    json_object_set_new(row, "found", json_boolean(r->found));
    if (!r->found)
        return negative(c, "not found", row);
    put_value(row, r->value);
    row_version(row, r->version, r->expires_at);
    static const char *const cols[] = {"value", NULL};
    static const char *const tcols[] = {"key", "kind", "value", "version", "expiresAt", NULL};
    return print_one(c, c->format == DREY_OUT_TABLE ? tcols : cols, row);
}

/* mget and exists: GetMany, one row per key in the order given. */
static int get_many(drey_cli *c, char **a, bool values_too) {
    Drey__Cache__V1__GetManyRequest req = DREY__CACHE__V1__GET_MANY_REQUEST__INIT;
    req.cache = (char *)c->cache;
    for (req.n_keys = 0; a[req.n_keys] != NULL; req.n_keys++) {
    }
    req.keys = a;
    Drey__Cache__V1__GetManyResponse *r;
    int rc;
    if (!call(c, DREY_CLIENT_CACHE("GetMany"), &req.base, &drey__cache__v1__get_many_response__descriptor, &r, &rc))
        return rc;
    static const char *const mget_cols[] = {"key", "value", NULL};
    static const char *const mget_tcols[] = {"key", "found", "kind", "value", "version", "expiresAt", NULL};
    static const char *const exists_cols[] = {"key", "exists", NULL};
    drey_out o;
    drey_out_begin(&o, c->format, stdout,
                   !values_too ? exists_cols : c->format == DREY_OUT_TABLE ? mget_tcols : mget_cols);
    bool all = true;
    for (size_t i = 0; i < r->n_results; i++) {
        const Drey__Cache__V1__GetManyResponse__Result *x = r->results[i];
        json_t *row = row_key(x->key);
        all &= x->found;
        if (!values_too) {
            json_object_set_new(row, "exists", json_boolean(x->found));
        } else {
            json_object_set_new(row, "found", json_boolean(x->found));
            if (x->found) {
                put_value(row, x->value);
                row_version(row, x->version, x->expires_at);
            }
        }
        drey_out_row(&o, row);
    }
    drey_out_flush(&o);
    return values_too || all ? DREY_EXIT_OK : DREY_EXIT_NEGATIVE;
}

static int cmd_mget(drey_cli *c, char **a) {
    return get_many(c, a, true);
}

static int cmd_exists(drey_cli *c, char **a) {
    return get_many(c, a, false);
}

static int cmd_set(drey_cli *c, char **a) {
    Drey__Cache__V1__SetRequest req = DREY__CACHE__V1__SET_REQUEST__INIT;
    req.cache = (char *)c->cache;
    req.key = a[0];
    req.request_id = request_id(c);
    bool bad;
    if ((req.value = value_of(c, a[1])) == NULL || ((req.ttl = ttl_opt(c, &bad)) == NULL && bad))
        return DREY_EXIT_USAGE;
    if (req.ttl != NULL)
        req.expiration_case = DREY__CACHE__V1__SET_REQUEST__EXPIRATION_TTL;
    const char *iv = drey_cli_opt(c, "if-version");
    if (iv != NULL) {
        if (!parse_uint64(iv, &req.if_version)) {
            fprintf(stderr, "drey: --if-version: expected an unsigned integer\n");
            return DREY_EXIT_USAGE;
        }
        req.condition_case = DREY__CACHE__V1__SET_REQUEST__CONDITION_IF_VERSION;
    }
    Drey__Cache__V1__SetResponse *r;
    int rc;
    if (!call(c, DREY_CLIENT_CACHE("Set"), &req.base, &drey__cache__v1__set_response__descriptor, &r, &rc))
        return rc;
    json_t *row = row_key(a[0]);
    row_version(row, r->version, r->expires_at);
    return print_one(c, COLS_VERSION, row);
}

static int cmd_mset(drey_cli *c, char **a) {
    size_t n = 0;
    while (a[n] != NULL)
        n++;
    if (n % 2 != 0) {
        fprintf(stderr, "usage: drey mset KEY VALUE [KEY VALUE ...]\n");
        return DREY_EXIT_USAGE;
    }
    Drey__Cache__V1__SetManyRequest req = DREY__CACHE__V1__SET_MANY_REQUEST__INIT;
    req.cache = (char *)c->cache;
    req.request_id = request_id(c);
    req.n_entries = n / 2;
    req.entries = drey_arena_alloc(&c->arena, req.n_entries * sizeof *req.entries);
    bool bad;
    Google__Protobuf__Duration *ttl = ttl_opt(c, &bad);
    if (bad)
        return DREY_EXIT_USAGE;
    for (size_t i = 0; i < req.n_entries; i++) {
        Drey__Cache__V1__SetManyRequest__Entry *e = drey_arena_alloc(&c->arena, sizeof *e);
        drey__cache__v1__set_many_request__entry__init(e);
        e->key = a[2 * i];
        if ((e->value = value_of(c, a[2 * i + 1])) == NULL)
            return DREY_EXIT_USAGE;
        if (ttl != NULL) {
            e->expiration_case = DREY__CACHE__V1__SET_MANY_REQUEST__ENTRY__EXPIRATION_TTL;
            e->ttl = ttl;
        }
        req.entries[i] = e;
    }
    Drey__Cache__V1__SetManyResponse *r;
    int rc;
    if (!call(c, DREY_CLIENT_CACHE("SetMany"), &req.base, &drey__cache__v1__set_many_response__descriptor, &r, &rc))
        return rc;
    static const char *const cols[] = {"key", "version", "expiresAt", NULL};
    drey_out o;
    drey_out_begin(&o, c->format, stdout, cols);
    for (size_t i = 0; i < r->n_results && i < req.n_entries; i++) {
        json_t *row = row_key(req.entries[i]->key);
        row_version(row, r->results[i]->version, r->results[i]->expires_at);
        drey_out_row(&o, row);
    }
    drey_out_flush(&o);
    return DREY_EXIT_OK;
}

static int cmd_add(drey_cli *c, char **a) {
    Drey__Cache__V1__AddRequest req = DREY__CACHE__V1__ADD_REQUEST__INIT;
    req.cache = (char *)c->cache;
    req.key = a[0];
    req.request_id = request_id(c);
    bool bad;
    if ((req.value = value_of(c, a[1])) == NULL || ((req.ttl = ttl_opt(c, &bad)) == NULL && bad))
        return DREY_EXIT_USAGE;
    if (req.ttl != NULL)
        req.expiration_case = DREY__CACHE__V1__ADD_REQUEST__EXPIRATION_TTL;
    Drey__Cache__V1__AddResponse *r;
    int rc;
    if (!call(c, DREY_CLIENT_CACHE("Add"), &req.base, &drey__cache__v1__add_response__descriptor, &r, &rc))
        return rc;
    json_t *row = row_key(a[0]);
    json_object_set_new(row, "added", json_boolean(r->added));
    if (!r->added) {
        json_object_set_new(row, "version", json_integer((json_int_t)r->version));
        char what[64];
        snprintf(what, sizeof what, "exists version=%" PRIu64, r->version);
        return negative(c, what, row);
    }
    row_version(row, r->version, r->expires_at);
    return print_one(c, COLS_VERSION, row);
}

static int cmd_rm(drey_cli *c, char **a) {
    Drey__Cache__V1__RemoveRequest req = DREY__CACHE__V1__REMOVE_REQUEST__INIT;
    req.cache = (char *)c->cache;
    req.key = a[0];
    req.request_id = request_id(c);
    const char *iv = drey_cli_opt(c, "if-version");
    if (iv != NULL) {
        if (!parse_uint64(iv, &req.if_version)) {
            fprintf(stderr, "drey: --if-version: expected an unsigned integer\n");
            return DREY_EXIT_USAGE;
        }
        req.condition_case = DREY__CACHE__V1__REMOVE_REQUEST__CONDITION_IF_VERSION;
    }
    Drey__Cache__V1__RemoveResponse *r;
    int rc;
    if (!call(c, DREY_CLIENT_CACHE("Remove"), &req.base, &drey__cache__v1__remove_response__descriptor, &r, &rc))
        return rc;
    json_t *row = row_key(a[0]);
    json_object_set_new(row, "removed", json_boolean(r->removed));
    if (!r->removed)
        return negative(c, "not found", row);
    json_object_set_new(row, "version", json_integer((json_int_t)r->version));
    static const char *const cols[] = {"version", NULL};
    return print_one(c, cols, row);
}

static int cmd_del(drey_cli *c, char **a) {
    Drey__Cache__V1__RemoveManyRequest req = DREY__CACHE__V1__REMOVE_MANY_REQUEST__INIT;
    req.cache = (char *)c->cache;
    req.request_id = request_id(c);
    for (req.n_keys = 0; a[req.n_keys] != NULL; req.n_keys++) {
    }
    req.keys = a;
    Drey__Cache__V1__RemoveManyResponse *r;
    int rc;
    if (!call(c, DREY_CLIENT_CACHE("RemoveMany"), &req.base, &drey__cache__v1__remove_many_response__descriptor, &r,
              &rc))
        return rc;
    static const char *const cols[] = {"key", "removed", NULL};
    static const char *const tcols[] = {"key", "removed", "version", NULL};
    drey_out o;
    drey_out_begin(&o, c->format, stdout, c->format == DREY_OUT_TABLE ? tcols : cols);
    size_t removed = 0;
    for (size_t i = 0; i < r->n_results; i++) {
        json_t *row = row_key(r->results[i]->key);
        json_object_set_new(row, "removed", json_boolean(r->results[i]->removed));
        if (r->results[i]->removed)
            json_object_set_new(row, "version", json_integer((json_int_t)r->results[i]->version));
        removed += r->results[i]->removed;
        drey_out_row(&o, row);
    }
    drey_out_flush(&o);
    return removed > 0 ? DREY_EXIT_OK : DREY_EXIT_NEGATIVE;
}

static int cmd_incr(drey_cli *c, char **a) {
    Drey__Cache__V1__IncrementRequest req = DREY__CACHE__V1__INCREMENT_REQUEST__INIT;
    req.cache = (char *)c->cache;
    req.key = a[0];
    req.delta = 1;
    req.request_id = request_id(c);
    if (a[1] != NULL && !parse_int64(a[1], &req.delta)) {
        fprintf(stderr, "drey: incr: DELTA \"%s\" is not an int64\n", a[1]);
        return DREY_EXIT_USAGE;
    }
    bool bad;
    if ((req.ttl = ttl_opt(c, &bad)) == NULL && bad)
        return DREY_EXIT_USAGE;
    if (req.ttl != NULL)
        req.expiration_case = DREY__CACHE__V1__INCREMENT_REQUEST__EXPIRATION_TTL;
    Drey__Cache__V1__IncrementResponse *r;
    int rc;
    if (!call(c, DREY_CLIENT_CACHE("Increment"), &req.base, &drey__cache__v1__increment_response__descriptor, &r, &rc))
        return rc;
    json_t *row = row_key(a[0]);
    json_object_set_new(row, "value", json_integer(r->value));
    json_object_set_new(row, "version", json_integer((json_int_t)r->version));
    static const char *const cols[] = {"value", NULL};
    return print_one(c, cols, row);
}

static int cmd_expire(drey_cli *c, char **a) {
    int64_t ms;
    if (!drey_config_parse_duration_ms(a[1], &ms) || ms <= 0) {
        fprintf(stderr, "drey: TTL \"%s\" is not a positive duration (250ms, 5s, 2m, 1h)\n", a[1]);
        return DREY_EXIT_USAGE;
    }
    Drey__Cache__V1__TouchRequest req = DREY__CACHE__V1__TOUCH_REQUEST__INIT;
    req.cache = (char *)c->cache;
    req.key = a[0];
    req.ttl = duration_of(c, ms);
    req.request_id = request_id(c);
    Drey__Cache__V1__TouchResponse *r;
    int rc;
    if (!call(c, DREY_CLIENT_CACHE("Touch"), &req.base, &drey__cache__v1__touch_response__descriptor, &r, &rc))
        return rc;
    json_t *row = row_key(a[0]);
    json_object_set_new(row, "found", json_boolean(r->found));
    if (!r->found)
        return negative(c, "not found", row);
    row_version(row, r->version, r->expires_at);
    return print_one(c, COLS_VERSION, row);
}

static int cmd_persist(drey_cli *c, char **a) {
    Drey__Cache__V1__PersistRequest req = DREY__CACHE__V1__PERSIST_REQUEST__INIT;
    req.cache = (char *)c->cache;
    req.key = a[0];
    req.request_id = request_id(c);
    Drey__Cache__V1__PersistResponse *r;
    int rc;
    if (!call(c, DREY_CLIENT_CACHE("Persist"), &req.base, &drey__cache__v1__persist_response__descriptor, &r, &rc))
        return rc;
    json_t *row = row_key(a[0]);
    json_object_set_new(row, "found", json_boolean(r->found));
    if (!r->found)
        return negative(c, "not found or without expiry", row);
    json_object_set_new(row, "version", json_integer((json_int_t)r->version));
    static const char *const cols[] = {"version", NULL};
    return print_one(c, cols, row);
}

static int cmd_ttl(drey_cli *c, char **a) {
    Drey__Cache__V1__GetExpirationRequest req = DREY__CACHE__V1__GET_EXPIRATION_REQUEST__INIT;
    req.cache = (char *)c->cache;
    req.key = a[0];
    Drey__Cache__V1__GetExpirationResponse *r;
    int rc;
    if (!call(c, DREY_CLIENT_CACHE("GetExpiration"), &req.base, &drey__cache__v1__get_expiration_response__descriptor,
              &r, &rc))
        return rc;
    json_t *row = row_key(a[0]);
    json_object_set_new(row, "found", json_boolean(r->found));
    if (!r->found)
        return negative(c, "not found", row);
    bool has = r->has_expiration && r->remaining != NULL && r->expires_at != NULL;
    json_object_set_new(row, "hasExpiration", json_boolean(has));
    char rem[48] = "none";
    if (has) {
        int64_t ms = r->remaining->seconds * 1000 + r->remaining->nanos / 1000000;
        json_object_set_new(row, "remainingMs", json_integer(ms));
        snprintf(rem, sizeof rem, "%" PRId64 ".%03" PRId64 "s", ms / 1000, ms % 1000);
    }
    json_object_set_new(row, "ttl", json_string(rem));
    json_object_set_new(row, "expiresAt", drey_cli_timestamp(has ? r->expires_at : NULL));
    static const char *const cols[] = {"ttl", "expiresAt", NULL};
    return print_one(c, cols, row);
}

static int cmd_scan(drey_cli *c, char **a) {
    Drey__Cache__V1__ScanRequest req = DREY__CACHE__V1__SCAN_REQUEST__INIT;
    req.cache = (char *)c->cache;
    req.prefix = a[0] != NULL ? a[0] : "";
    req.limit = 1000;
    req.include_values = drey_cli_opt(c, "values") != NULL;
    static const char *const cols[] = {"key", "version", "expiresAt", NULL};
    static const char *const vcols[] = {"key", "version", "expiresAt", "value", NULL};
    static const char *const tcols[] = {"key", "version", "expiresAt", "kind", "value", NULL};
    drey_out o;
    drey_out_begin(&o, c->format, stdout, !req.include_values ? cols : c->format == DREY_OUT_TABLE ? tcols : vcols);
    char *cursor = drey_xstrdup("");
    int rc = DREY_EXIT_OK;
    for (;;) {
        req.cursor = cursor;
        Drey__Cache__V1__ScanResponse *r;
        if (!call(c, DREY_CLIENT_CACHE("Scan"), &req.base, &drey__cache__v1__scan_response__descriptor, &r, &rc))
            break;
        for (size_t i = 0; i < r->n_items; i++) {
            const Drey__Cache__V1__ScanResponse__Item *it = r->items[i];
            json_t *row = row_key(it->key);
            row_version(row, it->version, it->expires_at);
            if (req.include_values)
                put_value(row, it->value);
            drey_out_row(&o, row);
        }
        free(cursor);
        cursor = drey_xstrdup(r->next_cursor);
        drey_arena_reset(&c->arena); /* a page at a time, however big the cache */
        if (cursor[0] == '\0')
            break;
    }
    free(cursor);
    drey_out_flush(&o);
    return rc;
}

static int cmd_clear(drey_cli *c, char **a) {
    (void)a;
    Drey__Cache__V1__ClearRequest req = DREY__CACHE__V1__CLEAR_REQUEST__INIT;
    req.cache = (char *)c->cache;
    req.request_id = request_id(c);
    Drey__Cache__V1__ClearResponse *r;
    int rc;
    if (!call(c, DREY_CLIENT_CACHE("Clear"), &req.base, &drey__cache__v1__clear_response__descriptor, &r, &rc))
        return rc;
    static const char *const cols[] = {"cache", "cleared", NULL};
    return print_one(c, cols, json_pack("{sssb}", "cache", c->cache[0] ? c->cache : "default", "cleared", 1));
}

/* The replication factor when the node is part of a replicated cluster
 * (stats then count every copy), else 1. */
static uint32_t replication_factor(drey_cli *c) {
    Drey__Admin__V1__GetReadinessDetailsRequest req = DREY__ADMIN__V1__GET_READINESS_DETAILS_REQUEST__INIT;
    Drey__Admin__V1__ReadinessDetails *d;
    drey_client_status st;
    if (drey_cli_call(c, DREY_CLIENT_ADMIN("GetReadinessDetails"), &req.base,
                      &drey__admin__v1__readiness_details__descriptor, &d, &st) != GRPC_STATUS_OK ||
        d->cluster == NULL || d->cluster->replication_factor < 1)
        return 1;
    return d->cluster->replication_factor;
}

static json_t *stats_row(const Drey__Cache__V1__CacheStats *s, uint32_t rf) {
    json_t *row = json_pack("{ss}", "cache", s->cache[0] ? s->cache : "default");
    /* With replicas every copy is counted: say so in the name. */
    json_object_set_new(row, rf > 1 ? "copies" : "entries", json_integer((json_int_t)s->entries));
    json_object_set_new(row, "bytes", json_integer((json_int_t)s->bytes));
    json_object_set_new(row, "expiring", json_integer((json_int_t)s->expiring));
    json_object_set_new(row, "evictions", json_integer((json_int_t)s->evictions));
    json_object_set_new(row, "evictedBytes", json_integer((json_int_t)s->evicted_bytes));
    if (rf > 1)
        json_object_set_new(row, "replicationFactor", json_integer(rf));
    return row;
}

static int cmd_stats(drey_cli *c, char **a) {
    (void)a;
    uint32_t rf = replication_factor(c);
    static const char *const cols[] = {"cache", "entries", "bytes", "expiring", "evictions", "evictedBytes", NULL};
    static const char *const ccols[] = {"cache", "copies", "bytes", "expiring", "evictions", "evictedBytes", NULL};
    drey_out o;
    drey_out_begin(&o, c->format, stdout, rf > 1 ? ccols : cols);
    int rc;
    if (c->cache[0] != '\0') {
        Drey__Cache__V1__GetCacheStatsRequest req = DREY__CACHE__V1__GET_CACHE_STATS_REQUEST__INIT;
        req.cache = (char *)c->cache;
        Drey__Cache__V1__CacheStats *r;
        if (!call(c, DREY_CLIENT_CACHE("GetCacheStats"), &req.base, &drey__cache__v1__cache_stats__descriptor, &r, &rc))
            return rc;
        drey_out_row(&o, stats_row(r, rf));
    } else {
        Drey__Cache__V1__ListCachesRequest req = DREY__CACHE__V1__LIST_CACHES_REQUEST__INIT;
        Drey__Cache__V1__ListCachesResponse *r;
        if (!call(c, DREY_CLIENT_CACHE("ListCaches"), &req.base, &drey__cache__v1__list_caches_response__descriptor,
                  &r, &rc))
            return rc;
        for (size_t i = 0; i < r->n_caches; i++)
            drey_out_row(&o, stats_row(r->caches[i], rf));
    }
    drey_out_flush(&o);
    if (rf > 1 && c->format != DREY_OUT_JSON)
        fprintf(stderr, "drey: copies, not entries: with replication factor %u each entry is counted on its primary "
                        "and on each backup\n",
                rf);
    return DREY_EXIT_OK;
}

static int cmd_health(drey_cli *c, char **a) {
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = a[0] != NULL ? a[0] : "";
    Grpc__Health__V1__HealthCheckResponse *r;
    int rc;
    if (!call(c, DREY_CLIENT_HEALTH("Check"), &req.base, &grpc__health__v1__health_check_response__descriptor, &r, &rc))
        return rc;
    const ProtobufCEnumValue *ev = protobuf_c_enum_descriptor_get_value(
        &grpc__health__v1__health_check_response__serving_status__descriptor, (int)r->status);
    static const char *const cols[] = {"status", NULL};
    print_one(c, cols, json_pack("{ssss}", "service", req.service, "status", ev != NULL ? ev->name : "UNKNOWN"));
    return r->status == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING ? DREY_EXIT_OK
                                                                                          : DREY_EXIT_NEGATIVE;
}

static int cmd_snapshot(drey_cli *c, char **a) {
    (void)a;
    Drey__Admin__V1__SnapshotRequest req = DREY__ADMIN__V1__SNAPSHOT_REQUEST__INIT;
    Drey__Admin__V1__SnapshotResponse *r;
    int rc;
    if (!call(c, DREY_CLIENT_ADMIN("Snapshot"), &req.base, &drey__admin__v1__snapshot_response__descriptor, &r, &rc))
        return rc;
    int64_t ms = r->duration != NULL ? r->duration->seconds * 1000 + r->duration->nanos / 1000000 : 0;
    static const char *const cols[] = {"lsn", "file", "entries", "bytes", "durationMs", "segmentsRemoved", NULL};
    return print_one(c, cols,
                     json_pack("{sIsssIsIsIsI}", "lsn", (json_int_t)r->lsn, "file", r->file, "entries",
                               (json_int_t)r->entries, "bytes", (json_int_t)r->bytes, "durationMs", (json_int_t)ms,
                               "segmentsRemoved", (json_int_t)r->segments_removed));
}

/* Leaves of a JSON document as "a.b.c" / value rows. */
static void flatten(drey_out *o, const char *path, json_t *v) {
    if (json_is_object(v) && json_object_size(v) > 0) {
        const char *k;
        json_t *x;
        json_object_foreach(v, k, x) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s%s%s", path, path[0] ? "." : "", k);
            flatten(o, sub, x);
        }
    } else if (json_is_array(v) && json_array_size(v) > 0) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            char sub[512];
            snprintf(sub, sizeof sub, "%s[%zu]", path, i);
            flatten(o, sub, json_array_get(v, i));
        }
    } else {
        drey_out_row(o, json_pack("{sssO}", "field", path, "value", v));
    }
}

/* The document GET /health/ready/details serves (-o json: the same bytes'
 * schema); text and table: one field per line. */
/* The readiness document: over gRPC, or (--ops, $DREY_OPS_LISTEN) the
 * same document from the ops listener, which needs no token from loopback
 * (inside a pod: kubectl exec ... drey ready). NULL, and *rc, if neither
 * answered; else malloc'd JSON text. */
static char *readiness_text(drey_cli *c, int *rc) {
    char ops[300];
    if (drey_cli_ops_address(drey_cli_opt(c, "ops"), ops, sizeof ops)) {
        char *body, err[320];
        size_t len;
        int status = drey_cli_ops_get(ops, "/health/ready/details", &body, &len, err, sizeof err);
        if (status == 200 || status == 503)
            return body;
        if (status == 0)
            fprintf(stderr, "drey: ready: %s\n", err);
        else
            fprintf(stderr, "drey: ready: the ops listener at %s answered HTTP %d\n", ops, status);
        free(status != 0 ? body : NULL);
        *rc = DREY_EXIT_FAILED;
        return NULL;
    }
    Drey__Admin__V1__GetReadinessDetailsRequest req = DREY__ADMIN__V1__GET_READINESS_DETAILS_REQUEST__INIT;
    Drey__Admin__V1__ReadinessDetails *r;
    if (!call(c, DREY_CLIENT_ADMIN("GetReadinessDetails"), &req.base, &drey__admin__v1__readiness_details__descriptor,
              &r, rc))
        return NULL;
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    drey_pbjson_write(m, &r->base);
    fclose(m);
    return text;
}

static int cmd_ready(drey_cli *c, char **a) {
    (void)a;
    int rc;
    char *text = readiness_text(c, &rc);
    if (text == NULL)
        return rc;
    json_t *doc = json_loads(text, 0, NULL);
    free(text);
    if (doc == NULL) {
        fprintf(stderr, "drey: ready: the details are not JSON\n");
        return DREY_EXIT_FAILED;
    }
    bool ready = json_is_true(json_object_get(doc, "ready"));
    if (c->format == DREY_OUT_JSON) {
        char *one = json_dumps(doc, JSON_COMPACT | JSON_PRESERVE_ORDER);
        puts(one);
        free(one);
    } else {
        static const char *const cols[] = {"field", "value", NULL};
        drey_out o;
        drey_out_begin(&o, c->format, stdout, cols);
        flatten(&o, "", doc);
        drey_out_flush(&o);
    }
    json_decref(doc);
    return ready ? DREY_EXIT_OK : DREY_EXIT_NEGATIVE;
}

/* --- watch ------------------------------------------------------------------------- */

/* Signals: SIGINT and SIGTERM are blocked from the start (before gRPC makes
 * its threads) and taken by one thread: it cancels the stream a command is
 * reading (watch, call), which then ends normally, or else exits as an
 * interrupted program does. SIGUSR2 ends the thread at exit. */
typedef struct interrupter {
    volatile sig_atomic_t fired;
} interrupter;

static pthread_mutex_t sig_mu = PTHREAD_MUTEX_INITIALIZER;
static drey_client_stream *sig_stream; /* the stream being read, under sig_mu */
static interrupter *sig_owner;
static pthread_t sig_thread;
static sigset_t sig_set;

static void *signal_thread(void *arg) {
    (void)arg;
    for (;;) {
        int sig;
        if (sigwait(&sig_set, &sig) != 0)
            continue;
        if (sig == SIGUSR2)
            return NULL;
        pthread_mutex_lock(&sig_mu);
        if (sig_stream != NULL) {
            sig_owner->fired = 1;
            drey_client_stream_cancel(sig_stream);
            pthread_mutex_unlock(&sig_mu);
            continue;
        }
        pthread_mutex_unlock(&sig_mu);
        fflush(stdout);
        _exit(128 + sig);
    }
}

static void signals_start(void) {
    sigemptyset(&sig_set);
    sigaddset(&sig_set, SIGINT);
    sigaddset(&sig_set, SIGTERM);
    sigaddset(&sig_set, SIGUSR2);
    pthread_sigmask(SIG_BLOCK, &sig_set, NULL);
    pthread_create(&sig_thread, NULL, signal_thread, NULL);
}

static void signals_stop(void) {
    pthread_kill(sig_thread, SIGUSR2);
    pthread_join(sig_thread, NULL);
}

static void interrupter_start(interrupter *it, drey_client_stream *s) {
    it->fired = 0;
    pthread_mutex_lock(&sig_mu);
    sig_stream = s;
    sig_owner = it;
    pthread_mutex_unlock(&sig_mu);
}

/* Before the stream is finished (freed). */
static void interrupter_stop(interrupter *it) {
    (void)it;
    pthread_mutex_lock(&sig_mu);
    sig_stream = NULL;
    sig_owner = NULL;
    pthread_mutex_unlock(&sig_mu);
}

static int cmd_watch(drey_cli *c, char **a) {
    Drey__Cache__V1__WatchRequest req = DREY__CACHE__V1__WATCH_REQUEST__INIT;
    req.cache = (char *)c->cache;
    for (req.n_keys = 0; a[req.n_keys] != NULL; req.n_keys++) {
    }
    req.keys = a;
    req.prefix = (char *)(drey_cli_opt(c, "prefix") != NULL ? drey_cli_opt(c, "prefix") : "");
    req.include_values = drey_cli_opt(c, "values") != NULL;
    if (req.n_keys > 0 && req.prefix[0] != '\0') {
        fprintf(stderr, "drey: watch: KEYs or --prefix, not both\n");
        return DREY_EXIT_USAGE;
    }
    uint64_t limit = 0;
    if (drey_cli_opt(c, "count") != NULL && !parse_uint64(drey_cli_opt(c, "count"), &limit)) {
        fprintf(stderr, "drey: --count: expected a number of events\n");
        return DREY_EXIT_USAGE;
    }
    drey_client_status st;
    drey_client *cl = drey_cli_stream_client(c, &st);
    if (cl == NULL)
        return drey_cli_report(c, &st);
    drey_client_stream *s = drey_client_watch(cl, &req, c->timeout_given ? c->timeout_ms : DREY_CLIENT_NO_DEADLINE, &st);
    if (s == NULL)
        return drey_cli_report(c, &st);
    interrupter it;
    interrupter_start(&it, s);
    static const char *const cols[] = {"event", "key", "version", "value", NULL};
    drey_out o;
    /* A table cannot wait for the end of a stream: rows print as text. */
    drey_out_begin(&o, c->format == DREY_OUT_TABLE ? DREY_OUT_TEXT : c->format, stdout, cols);
    uint64_t seen = 0;
    drey_arena ev_arena;
    drey_arena_init(&ev_arena, NULL, 0);
    Drey__Cache__V1__WatchEvent *ev;
    while ((limit == 0 || seen < limit) &&
           drey_client_stream_read(s, &drey__cache__v1__watch_event__descriptor, &ev_arena, (ProtobufCMessage **)&ev)) {
        const ProtobufCEnumValue *k =
            protobuf_c_enum_descriptor_get_value(&drey__cache__v1__watch_event__kind__descriptor, (int)ev->kind);
        json_t *row = json_pack("{ssssss}", "event", k != NULL ? k->name : "UNKNOWN", "cache",
                                ev->cache[0] ? ev->cache : "default", "key", ev->key);
        json_object_set_new(row, "version", json_integer((json_int_t)ev->version));
        if (ev->value != NULL)
            put_value(row, ev->value);
        if (ev->expires_at != NULL)
            json_object_set_new(row, "expiresAt", drey_cli_timestamp(ev->expires_at));
        json_object_set_new(row, "sequence", json_integer((json_int_t)ev->sequence));
        if (ev->kind == DREY__CACHE__V1__WATCH_EVENT__KIND__WATCHING)
            json_object_set_new(row, "feed", json_integer((json_int_t)ev->feed));
        if (ev->reason[0] != '\0')
            json_object_set_new(row, "reason", json_string(ev->reason));
        drey_out_row(&o, row);
        drey_arena_reset(&ev_arena);
        seen++;
    }
    interrupter_stop(&it);
    drey_client_stream_cancel(s);
    drey_client_stream_finish(s, &ev_arena, &st);
    int rc = DREY_EXIT_OK;
    if (!it.fired && (limit == 0 || seen < limit) && st.code != GRPC_STATUS_OK && st.code != GRPC_STATUS_CANCELLED)
        rc = drey_cli_report(c, &st);
    drey_arena_destroy(&ev_arena);
    return rc;
}

/* --- the built-in descriptors: drey's own messages as JSON ------------------------- */

/* A pool of the descriptor set built into drey (the one dreyd serves). */
static drey_pb_pool *builtin_pool(void) {
    extern const unsigned char drey_descriptor_set[];
    extern const size_t drey_descriptor_set_len;
    drey_pb_pool *p = drey_pb_pool_new(NULL, NULL);
    Google__Protobuf__FileDescriptorSet *set =
        google__protobuf__file_descriptor_set__unpack(NULL, drey_descriptor_set_len, drey_descriptor_set);
    for (size_t i = 0; set != NULL && i < set->n_file; i++) {
        size_t n = google__protobuf__file_descriptor_proto__get_packed_size(set->file[i]);
        uint8_t *b = drey_xmalloc(n ? n : 1);
        google__protobuf__file_descriptor_proto__pack(set->file[i], b);
        drey_pb_pool_add_file(p, b, n);
        free(b);
    }
    if (set != NULL)
        google__protobuf__file_descriptor_set__free_unpacked(set, NULL);
    return p;
}

static json_t *message_json(drey_pb_pool *p, const ProtobufCMessage *m) {
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *b = drey_xmalloc(n ? n : 1);
    protobuf_c_message_pack(m, b);
    char err[256];
    json_t *j = drey_pb_to_json(p, m->descriptor->name, b, n, err, sizeof err);
    free(b);
    return j != NULL ? j : json_object();
}

/* --- pipeline ---------------------------------------------------------------------- */

/* Splits a line into words: whitespace separates, '...' and "..." quote
 * (backslash escapes inside "..." and outside quotes). Returns the count,
 * -1 on an unclosed quote. Words point into the returned buffer. */
static int split_words(const char *line, char ***words_out, char **buf_out) {
    size_t n = strlen(line);
    char *buf = drey_xmalloc(n + 1), *o = buf;
    char **words = drey_xcalloc(n / 2 + 2, sizeof *words);
    int count = 0;
    const char *p = line;
    while (*p != '\0') {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
            p++;
        if (*p == '\0')
            break;
        words[count++] = o;
        while (*p != '\0' && *p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            if (*p == '\'' || *p == '"') {
                char q = *p++;
                while (*p != '\0' && *p != q) {
                    if (q == '"' && *p == '\\' && p[1] != '\0')
                        p++;
                    *o++ = *p++;
                }
                if (*p != q) {
                    free(buf);
                    free(words);
                    return -1;
                }
                p++;
            } else {
                if (*p == '\\' && p[1] != '\0')
                    p++;
                *o++ = *p++;
            }
        }
        *o++ = '\0';
    }
    *words_out = words;
    *buf_out = buf;
    return count;
}

/* One line of `drey pipeline` as a Cache request (in c's arena); NULL with
 * a message in err. */
static ProtobufCMessage *pipeline_op(drey_cli *c, char **w, int n, char *err, size_t cap) {
    /* Per-line options: --ttl, --int, --json, --if-version. */
    char *args[64];
    int na = 0;
    const char *ttl = NULL, *ifv = NULL;
    bool as_int = false, as_json = false;
    for (int i = 1; i < n && na < 63; i++) {
        if (strncmp(w[i], "--ttl=", 6) == 0)
            ttl = w[i] + 6;
        else if (strncmp(w[i], "--if-version=", 13) == 0)
            ifv = w[i] + 13;
        else if (strcmp(w[i], "--int") == 0)
            as_int = true;
        else if (strcmp(w[i], "--json") == 0)
            as_json = true;
        else
            args[na++] = w[i];
    }
    args[na] = NULL;
    const char *op = w[0];
    int64_t ms = 0;
    uint64_t version = 0;
    if (ttl != NULL && (!drey_config_parse_duration_ms(ttl, &ms) || ms <= 0)) {
        snprintf(err, cap, "--ttl: expected a positive duration");
        return NULL;
    }
    if (ifv != NULL && !parse_uint64(ifv, &version)) {
        snprintf(err, cap, "--if-version: expected an unsigned integer");
        return NULL;
    }
    Drey__Cache__V1__Value *value = NULL;
    if (na >= 2 && (strcmp(op, "set") == 0 || strcmp(op, "add") == 0)) {
        value = drey_arena_alloc(&c->arena, sizeof *value);
        drey__cache__v1__value__init(value);
        if (as_int) {
            value->kind_case = DREY__CACHE__V1__VALUE__KIND_INT64_VALUE;
            if (!parse_int64(args[1], &value->int64_value)) {
                snprintf(err, cap, "--int: not an int64");
                return NULL;
            }
        } else if (as_json) {
            value->kind_case = DREY__CACHE__V1__VALUE__KIND_JSON_VALUE;
            if ((value->json_value = drey_cli_json_parse(args[1], &c->arena, err, cap)) == NULL)
                return NULL;
        } else {
            value->kind_case = DREY__CACHE__V1__VALUE__KIND_STRING_VALUE;
            value->string_value = drey_arena_strndup(&c->arena, args[1], strlen(args[1]));
        }
    }
#define ARGS(lo, hi) (na >= (lo) && na <= (hi))
#define NEW(T, init) ((T *)memset(drey_arena_alloc(&c->arena, sizeof(T)), 0, sizeof(T)))
#define KEY(i) drey_arena_strndup(&c->arena, args[i], strlen(args[i]))
    if (strcmp(op, "get") == 0 && ARGS(1, 1)) {
        Drey__Cache__V1__GetRequest *r = NEW(Drey__Cache__V1__GetRequest, 0);
        drey__cache__v1__get_request__init(r);
        r->cache = (char *)c->cache;
        r->key = KEY(0);
        return &r->base;
    }
    if (strcmp(op, "set") == 0 && ARGS(2, 2)) {
        Drey__Cache__V1__SetRequest *r = NEW(Drey__Cache__V1__SetRequest, 0);
        drey__cache__v1__set_request__init(r);
        r->cache = (char *)c->cache;
        r->key = KEY(0);
        r->value = value;
        r->request_id = request_id(c);
        if (ttl != NULL) {
            r->expiration_case = DREY__CACHE__V1__SET_REQUEST__EXPIRATION_TTL;
            r->ttl = duration_of(c, ms);
        }
        if (ifv != NULL) {
            r->condition_case = DREY__CACHE__V1__SET_REQUEST__CONDITION_IF_VERSION;
            r->if_version = version;
        }
        return &r->base;
    }
    if (strcmp(op, "add") == 0 && ARGS(2, 2)) {
        Drey__Cache__V1__AddRequest *r = NEW(Drey__Cache__V1__AddRequest, 0);
        drey__cache__v1__add_request__init(r);
        r->cache = (char *)c->cache;
        r->key = KEY(0);
        r->value = value;
        r->request_id = request_id(c);
        if (ttl != NULL) {
            r->expiration_case = DREY__CACHE__V1__ADD_REQUEST__EXPIRATION_TTL;
            r->ttl = duration_of(c, ms);
        }
        return &r->base;
    }
    if ((strcmp(op, "rm") == 0 && ARGS(1, 1)) || (strcmp(op, "del") == 0 && ARGS(1, 1000))) {
        Drey__Cache__V1__RemoveManyRequest *r = NEW(Drey__Cache__V1__RemoveManyRequest, 0);
        drey__cache__v1__remove_many_request__init(r);
        r->cache = (char *)c->cache;
        r->request_id = request_id(c);
        r->n_keys = (size_t)na;
        r->keys = drey_arena_alloc(&c->arena, (size_t)na * sizeof *r->keys);
        for (int i = 0; i < na; i++)
            r->keys[i] = KEY(i);
        return &r->base;
    }
    if ((strcmp(op, "mget") == 0 || strcmp(op, "exists") == 0) && ARGS(1, 1000)) {
        Drey__Cache__V1__GetManyRequest *r = NEW(Drey__Cache__V1__GetManyRequest, 0);
        drey__cache__v1__get_many_request__init(r);
        r->cache = (char *)c->cache;
        r->n_keys = (size_t)na;
        r->keys = drey_arena_alloc(&c->arena, (size_t)na * sizeof *r->keys);
        for (int i = 0; i < na; i++)
            r->keys[i] = KEY(i);
        return &r->base;
    }
    if (strcmp(op, "incr") == 0 && ARGS(1, 2)) {
        Drey__Cache__V1__IncrementRequest *r = NEW(Drey__Cache__V1__IncrementRequest, 0);
        drey__cache__v1__increment_request__init(r);
        r->cache = (char *)c->cache;
        r->key = KEY(0);
        r->delta = 1;
        r->request_id = request_id(c);
        if (na == 2 && !parse_int64(args[1], &r->delta)) {
            snprintf(err, cap, "incr: DELTA is not an int64");
            return NULL;
        }
        if (ttl != NULL) {
            r->expiration_case = DREY__CACHE__V1__INCREMENT_REQUEST__EXPIRATION_TTL;
            r->ttl = duration_of(c, ms);
        }
        return &r->base;
    }
    if ((strcmp(op, "expire") == 0 || strcmp(op, "touch") == 0) && ARGS(2, 2)) {
        int64_t t;
        if (!drey_config_parse_duration_ms(args[1], &t) || t <= 0) {
            snprintf(err, cap, "%s: TTL is not a positive duration", op);
            return NULL;
        }
        Drey__Cache__V1__TouchRequest *r = NEW(Drey__Cache__V1__TouchRequest, 0);
        drey__cache__v1__touch_request__init(r);
        r->cache = (char *)c->cache;
        r->key = KEY(0);
        r->ttl = duration_of(c, t);
        r->request_id = request_id(c);
        return &r->base;
    }
    if (strcmp(op, "persist") == 0 && ARGS(1, 1)) {
        Drey__Cache__V1__PersistRequest *r = NEW(Drey__Cache__V1__PersistRequest, 0);
        drey__cache__v1__persist_request__init(r);
        r->cache = (char *)c->cache;
        r->key = KEY(0);
        r->request_id = request_id(c);
        return &r->base;
    }
    if (strcmp(op, "ttl") == 0 && ARGS(1, 1)) {
        Drey__Cache__V1__GetExpirationRequest *r = NEW(Drey__Cache__V1__GetExpirationRequest, 0);
        drey__cache__v1__get_expiration_request__init(r);
        r->cache = (char *)c->cache;
        r->key = KEY(0);
        return &r->base;
    }
#undef ARGS
#undef NEW
#undef KEY
    snprintf(err, cap,
             "\"%s\" with %d argument(s) is not a pipeline operation (get, set, add, rm, del, mget, exists, incr, "
             "expire, persist, ttl)",
             op, na);
    return NULL;
}

/* Prints the results that have arrived (all of them when wait). */
static int pipeline_drain(drey_client_pipeline *p, drey_pb_pool *pool, drey_out *o, uint64_t *printed,
                          uint64_t sent, bool wait, drey_arena *a) {
    int rc = DREY_EXIT_OK;
    Drey__Cache__V1__PipelineResponse *resp;
    while (*printed < sent && drey_client_pipeline_next(p, wait ? DREY_CLIENT_NO_DEADLINE : 0, a, &resp)) {
        for (size_t i = 0; i < resp->n_results; i++) {
            const Drey__Cache__V1__PipelineResult *res = resp->results[i];
            drey_client_status st;
            json_t *row = json_pack("{sI}", "line", (json_int_t)res->id);
            if (drey_client_pipeline_result_status(res, a, &st) != GRPC_STATUS_OK) {
                json_object_set_new(row, "code", json_string(drey_client_code_name(st.code)));
                json_object_set_new(row, "error", drey_cli_status_json(&st));
                rc = DREY_EXIT_FAILED;
            } else {
                json_object_set_new(row, "code", json_string("OK"));
                const ProtobufCMessage *m = drey_client_pipeline_result_response(res);
                json_object_set_new(row, "response", m != NULL ? message_json(pool, m) : json_object());
            }
            drey_out_row(o, row);
            (*printed)++;
        }
        drey_arena_reset(a);
    }
    return rc;
}

/* Operations from standard input, one a line, sent on one Pipeline stream;
 * the answers in order, each with its line number. */
static int cmd_pipeline(drey_cli *c, char **a) {
    (void)a;
    drey_client_status st;
    drey_client *cl = drey_cli_stream_client(c, &st);
    if (cl == NULL)
        return drey_cli_report(c, &st);
    drey_client_pipeline *p =
        drey_client_pipeline_open(cl, c->timeout_given ? c->timeout_ms : DREY_CLIENT_NO_DEADLINE, &st);
    if (p == NULL)
        return drey_cli_report(c, &st);
    drey_pb_pool *pool = builtin_pool();
    static const char *const cols[] = {"line", "code", "response", NULL};
    static const char *const ecols[] = {"line", "code", "error", NULL};
    (void)ecols;
    drey_out o;
    drey_out_begin(&o, c->format == DREY_OUT_TABLE ? DREY_OUT_TEXT : c->format, stdout, cols);
    drey_arena ra;
    drey_arena_init(&ra, NULL, 0);
    char *line = NULL;
    size_t cap = 0;
    uint64_t lineno = 0, sent = 0, printed = 0;
    int rc = DREY_EXIT_OK, r;
    while (getline(&line, &cap, stdin) > 0) {
        lineno++;
        char **w, *buf;
        int n = split_words(line, &w, &buf);
        if (n < 0) {
            fprintf(stderr, "drey: pipeline: line %" PRIu64 ": unclosed quote\n", lineno);
            rc = DREY_EXIT_USAGE;
            break;
        }
        if (n == 0 || w[0][0] == '#') {
            free(w);
            free(buf);
            continue;
        }
        char err[256];
        ProtobufCMessage *op = pipeline_op(c, w, n, err, sizeof err);
        free(w);
        free(buf);
        if (op == NULL) {
            fprintf(stderr, "drey: pipeline: line %" PRIu64 ": %s\n", lineno, err);
            rc = DREY_EXIT_USAGE;
            break;
        }
        drey_client_pipeline_add(p, lineno, op, DREY_CLIENT_NO_DEADLINE);
        sent++;
        if (drey_client_pipeline_pending(p) >= 64) {
            drey_client_pipeline_flush(p);
            if ((r = pipeline_drain(p, pool, &o, &printed, sent, false, &ra)) != DREY_EXIT_OK)
                rc = r;
        }
    }
    free(line);
    if (rc == DREY_EXIT_USAGE)
        drey_client_pipeline_cancel(p);
    drey_client_pipeline_close_send(p);
    if (rc != DREY_EXIT_USAGE && (r = pipeline_drain(p, pool, &o, &printed, sent, true, &ra)) != DREY_EXIT_OK)
        rc = r;
    if (drey_client_pipeline_finish(p, &ra, &st) != GRPC_STATUS_OK && rc != DREY_EXIT_USAGE)
        rc = drey_cli_report(c, &st);
    drey_arena_destroy(&ra);
    drey_pb_pool_free(pool);
    return rc;
}

/* --- call, list, describe: any method through reflection ------------------------------- */

static void print_doc(drey_cli *c, FILE *out, const json_t *doc) {
    if (c->format == DREY_OUT_JSON) {
        drey_out_json_line(out, doc);
        return;
    }
    char *t = json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY | JSON_REAL_PRECISION(17));
    fprintf(out, "%s\n", t != NULL ? t : "null");
    free(t);
}

/* A failed call with its details decoded through reflection, as grpcurl
 * --format-error prints it. */
static int report_decoded(drey_cli *c, drey_refl *r, const drey_client_status *st) {
    json_t *doc = json_pack("{ssss}", "code", drey_client_code_name(st->code), "message", st->message);
    json_t *details = json_array();
    for (size_t i = 0; st->details != NULL && i < st->details->n_details; i++) {
        const Google__Protobuf__Any *any = st->details->details[i];
        size_t n = google__protobuf__any__get_packed_size(any);
        uint8_t *b = drey_xmalloc(n ? n : 1);
        google__protobuf__any__pack(any, b);
        char err[256];
        json_t *d = drey_pb_to_json(r->pool, "google.protobuf.Any", b, n, err, sizeof err);
        free(b);
        json_array_append_new(details, d != NULL ? d : json_pack("{ss}", "@type", any->type_url));
    }
    json_object_set_new(doc, "details", details);
    print_doc(c, stderr, doc);
    json_decref(doc);
    return DREY_EXIT_FAILED;
}

static bool connect_refl(drey_cli *c, drey_refl *r, int *rc) {
    drey_client_status st;
    drey_client *cl = drey_cli_stream_client(c, &st);
    if (cl == NULL) {
        *rc = drey_cli_report(c, &st);
        return false;
    }
    drey_refl_init(r, cl, c->timeout_ms);
    return true;
}

static int refl_failed(drey_cli *c, drey_refl *r) {
    if (r->call_failed && r->st.code != GRPC_STATUS_OK)
        drey_cli_report(c, &r->st);
    else
        fprintf(stderr, "drey: %s\n", r->err);
    return DREY_EXIT_FAILED;
}

/* "pkg.Service/Method", "/pkg.Service/Method" or "pkg.Service.Method". */
static bool split_method(const char *full, char *service, size_t scap, const char **method) {
    if (full[0] == '/')
        full++;
    const char *sep = strrchr(full, '/');
    if (sep == NULL)
        sep = strrchr(full, '.');
    if (sep == NULL || sep == full || sep[1] == '\0' || (size_t)(sep - full) >= scap)
        return false;
    memcpy(service, full, (size_t)(sep - full));
    service[sep - full] = '\0';
    *method = sep + 1;
    return true;
}

static int cmd_call(drey_cli *c, char **a) {
    char service[256];
    const char *mname;
    if (!split_method(a[0], service, sizeof service, &mname)) {
        fprintf(stderr, "drey: call: expected SERVICE/METHOD, e.g. drey.cache.v1.Cache/Get\n");
        return DREY_EXIT_USAGE;
    }
    /* The request: the argument, or standard input with --stdin or "-". */
    const char *text = a[1] != NULL ? a[1] : "{}";
    ProtobufCBinaryData in = {0};
    if (drey_cli_opt(c, "stdin") != NULL || (a[1] != NULL && strcmp(a[1], "-") == 0)) {
        if (!read_whole("-", &c->arena, &in))
            return DREY_EXIT_USAGE;
        text = (const char *)in.data;
    }
    int rc = DREY_EXIT_OK;
    drey_refl r;
    if (!connect_refl(c, &r, &rc))
        return rc;
    const Google__Protobuf__ServiceDescriptorProto *svc =
        drey_refl_load(&r, service) ? drey_pb_pool_service(r.pool, service) : NULL;
    const Google__Protobuf__MethodDescriptorProto *m = NULL;
    for (size_t i = 0; svc != NULL && i < svc->n_method; i++)
        if (strcmp(svc->method[i]->name, mname) == 0)
            m = svc->method[i];
    if (svc == NULL || m == NULL) {
        if (svc == NULL && r.call_failed)
            rc = refl_failed(c, &r);
        else {
            fprintf(stderr, "drey: call: the server does not describe %s/%s (drey list shows what it serves)\n",
                    service, mname);
            rc = DREY_EXIT_USAGE;
        }
        drey_refl_destroy(&r);
        return rc;
    }
    /* One JSON value per request message: several for a client stream. */
    ProtobufCBinaryData reqs[256];
    size_t n_reqs = 0;
    const char *p = text;
    while (rc == DREY_EXIT_OK) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
            p++;
        if (*p == '\0')
            break;
        json_error_t jerr;
        json_t *j = json_loadb(p, strlen(p), JSON_DISABLE_EOF_CHECK | JSON_DECODE_ANY, &jerr);
        char err[512];
        if (j == NULL) {
            fprintf(stderr, "drey: call: the request is not JSON: %s (line %d column %d)\n", jerr.text, jerr.line,
                    jerr.column);
            rc = DREY_EXIT_USAGE;
        } else if (n_reqs == sizeof reqs / sizeof reqs[0]) {
            fprintf(stderr, "drey: call: at most %zu request messages\n", n_reqs);
            rc = DREY_EXIT_USAGE;
        } else if (!drey_pb_from_json(r.pool, m->input_type, j, &reqs[n_reqs].data, &reqs[n_reqs].len, err,
                                      sizeof err)) {
            fprintf(stderr, "drey: call: %s\n", err);
            rc = DREY_EXIT_USAGE;
        } else {
            n_reqs++;
        }
        p += jerr.position;
        json_decref(j);
        if (!(m->has_client_streaming && m->client_streaming))
            break;
    }
    if (rc == DREY_EXIT_OK && n_reqs == 0) {
        reqs[0].data = drey_xmalloc(1);
        reqs[0].len = 0;
        n_reqs = 1;
    }
    char path[600];
    snprintf(path, sizeof path, "/%s/%s", service, mname);
    bool streaming = (m->has_client_streaming && m->client_streaming) || (m->has_server_streaming && m->server_streaming);
    drey_client_status st;
    char err[512];
    if (rc != DREY_EXIT_OK) {
        /* nothing sent */
    } else if (!streaming) {
        ProtobufCBinaryData out;
        if (drey_cli_call_raw(c, path, reqs[0].data, reqs[0].len, &out, &st) != GRPC_STATUS_OK) {
            rc = report_decoded(c, &r, &st);
        } else {
            json_t *doc = drey_pb_to_json(r.pool, m->output_type, out.data, out.len, err, sizeof err);
            if (doc == NULL) {
                fprintf(stderr, "drey: call: %s\n", err);
                rc = DREY_EXIT_FAILED;
            } else {
                print_doc(c, stdout, doc);
                json_decref(doc);
            }
        }
    } else {
        drey_client_stream *s = drey_client_stream_start_raw(
            r.client, path, reqs, n_reqs, c->timeout_given ? c->timeout_ms : DREY_CLIENT_NO_DEADLINE, &st);
        if (s == NULL) {
            rc = drey_cli_report(c, &st);
        } else {
            interrupter it;
            interrupter_start(&it, s);
            ProtobufCBinaryData out;
            drey_arena sa;
            drey_arena_init(&sa, NULL, 0);
            while (drey_client_stream_read_raw(s, &sa, &out)) {
                json_t *doc = drey_pb_to_json(r.pool, m->output_type, out.data, out.len, err, sizeof err);
                if (doc == NULL) {
                    fprintf(stderr, "drey: call: %s\n", err);
                    rc = DREY_EXIT_FAILED;
                    drey_client_stream_cancel(s);
                    break;
                }
                print_doc(c, stdout, doc);
                fflush(stdout);
                json_decref(doc);
                drey_arena_reset(&sa);
            }
            interrupter_stop(&it);
            drey_client_stream_finish(s, &sa, &st);
            if (rc == DREY_EXIT_OK && st.code != GRPC_STATUS_OK && !it.fired)
                rc = report_decoded(c, &r, &st);
            drey_arena_destroy(&sa);
        }
    }
    for (size_t i = 0; i < n_reqs; i++)
        free(reqs[i].data);
    drey_refl_destroy(&r);
    return rc;
}

static int cmd_list(drey_cli *c, char **a) {
    int rc = DREY_EXIT_OK;
    drey_refl r;
    if (!connect_refl(c, &r, &rc))
        return rc;
    static const char *const cols[] = {"name", NULL};
    drey_out o;
    drey_out_begin(&o, c->format, stdout, cols);
    if (a[0] == NULL) {
        json_t *names = drey_refl_services(&r);
        if (names == NULL) {
            rc = refl_failed(c, &r);
        } else {
            for (size_t i = 0; i < json_array_size(names); i++)
                drey_out_row(&o, json_pack("{sO}", "name", json_array_get(names, i)));
            json_decref(names);
        }
    } else {
        const Google__Protobuf__ServiceDescriptorProto *svc =
            drey_refl_load(&r, a[0]) ? drey_pb_pool_service(r.pool, a[0]) : NULL;
        if (svc == NULL) {
            rc = r.call_failed ? refl_failed(c, &r) : (fprintf(stderr, "drey: no service %s\n", a[0]), DREY_EXIT_NEGATIVE);
        } else {
            for (size_t i = 0; i < svc->n_method; i++) {
                char full[512];
                snprintf(full, sizeof full, "%s.%s", a[0], svc->method[i]->name);
                drey_out_row(&o, json_pack("{ss}", "name", full));
            }
        }
    }
    drey_out_flush(&o);
    drey_refl_destroy(&r);
    return rc;
}

static const char *const type_names[] = {"",        "double", "float",   "int64",    "uint64",   "int32",  "fixed64",
                                         "fixed32", "bool",   "string",  "group",    "",         "bytes",  "uint32",
                                         "",        "sfixed32", "sfixed64", "sint32", "sint64"};

static void describe_message(FILE *out, const Google__Protobuf__DescriptorProto *m, const char *name, int indent) {
    fprintf(out, "%*smessage %s {\n", indent, "", name);
    for (size_t i = 0; i < m->n_nested_type; i++)
        if (m->nested_type[i]->options == NULL || !m->nested_type[i]->options->map_entry)
            describe_message(out, m->nested_type[i], m->nested_type[i]->name, indent + 2);
    for (size_t i = 0; i < m->n_field; i++) {
        const Google__Protobuf__FieldDescriptorProto *f = m->field[i];
        const char *t = f->type_name != NULL && f->type_name[0] ? f->type_name + (f->type_name[0] == '.')
                        : (size_t)f->type < sizeof type_names / sizeof type_names[0] ? type_names[f->type]
                                                                                      : "?";
        fprintf(out, "%*s%s%s %s = %d;\n", indent + 2, "",
                f->label == GOOGLE__PROTOBUF__FIELD_DESCRIPTOR_PROTO__LABEL__LABEL_REPEATED ? "repeated " : "", t,
                f->name, f->number);
    }
    fprintf(out, "%*s}\n", indent, "");
}

static int cmd_describe(drey_cli *c, char **a) {
    int rc = DREY_EXIT_OK;
    drey_refl r;
    if (!connect_refl(c, &r, &rc))
        return rc;
    const char *sym = a[0][0] == '.' ? a[0] + 1 : a[0];
    bool loaded = drey_refl_load(&r, sym);
    const Google__Protobuf__ServiceDescriptorProto *svc = loaded ? drey_pb_pool_service(r.pool, sym) : NULL;
    const Google__Protobuf__DescriptorProto *msg = loaded && svc == NULL ? drey_pb_pool_message(r.pool, sym) : NULL;
    const Google__Protobuf__EnumDescriptorProto *en =
        loaded && svc == NULL && msg == NULL ? drey_pb_pool_enum(r.pool, sym) : NULL;
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    if (svc != NULL) {
        fprintf(out, "service %s {\n", svc->name);
        for (size_t i = 0; i < svc->n_method; i++) {
            const Google__Protobuf__MethodDescriptorProto *m = svc->method[i];
            fprintf(out, "  rpc %s(%s%s) returns (%s%s);\n", m->name, m->client_streaming ? "stream " : "",
                    m->input_type + 1, m->server_streaming ? "stream " : "", m->output_type + 1);
        }
        fprintf(out, "}\n");
    } else if (msg != NULL) {
        describe_message(out, msg, sym, 0);
    } else if (en != NULL) {
        fprintf(out, "enum %s {\n", sym);
        for (size_t i = 0; i < en->n_value; i++)
            fprintf(out, "  %s = %d;\n", en->value[i]->name, en->value[i]->number);
        fprintf(out, "}\n");
    }
    fclose(out);
    if (svc == NULL && msg == NULL && en == NULL) {
        rc = r.call_failed ? refl_failed(c, &r) : (fprintf(stderr, "drey: no symbol %s\n", sym), DREY_EXIT_NEGATIVE);
    } else if (c->format == DREY_OUT_JSON) {
        const Google__Protobuf__FileDescriptorProto *f = drey_pb_pool_file_of(r.pool, sym);
        json_t *doc = json_pack("{sssssss}", "symbol", sym, "kind", svc ? "service" : msg ? "message" : "enum", "file",
                                f != NULL ? f->name : "", "definition", text);
        drey_out_json_line(stdout, doc);
        json_decref(doc);
    } else {
        fputs(text, stdout);
    }
    free(text);
    drey_refl_destroy(&r);
    return rc;
}

/* --- the command table ----------------------------------------------------------------- */

static int cmd_version(drey_cli *c, char **a) {
    (void)a;
    if (c->format == DREY_OUT_JSON) {
        json_t *doc = json_pack("{ssssss}", "version", drey_version(), "revision", drey_version_revision(), "build",
                                drey_version_build());
        drey_out_json_line(stdout, doc);
        json_decref(doc);
    } else {
        drey_version_print(stdout, "drey");
    }
    return DREY_EXIT_OK;
}

typedef struct command {
    const char *name, *sub; /* "cluster", "status" */
    int min_args, max_args; /* -1: any number */
    const char *options;    /* the command's own, space-separated */
    bool connects;          /* needs the node (connection options apply) */
    int (*run)(drey_cli *c, char **args);
    const char *synopsis;
    const char *help;
} command;

#define VALUE_OPTS "ttl int json file"

static const command commands[] = {
    {"get", NULL, 1, 1, "", true, cmd_get, "get KEY", "print the value (exit 3: not found)"},
    {"mget", NULL, 1, -1, "", true, cmd_mget, "mget KEY...", "the values of several keys, in order (absent: empty)"},
    {"set", NULL, 2, 2, VALUE_OPTS " if-version", true, cmd_set, "set KEY VALUE [--ttl D] [--if-version N]",
     "store a value; prints its version and expiry (--if-version 0: only if absent)"},
    {"mset", NULL, 2, -1, VALUE_OPTS, true, cmd_mset, "mset KEY VALUE [KEY VALUE...] [--ttl D]",
     "store several values at once (atomically)"},
    {"add", NULL, 2, 2, VALUE_OPTS, true, cmd_add, "add KEY VALUE [--ttl D]", "store only if absent (exit 3: it exists)"},
    {"del", NULL, 1, -1, "", true, cmd_del, "del KEY...", "remove keys; prints which were removed (exit 3: none)"},
    {"rm", NULL, 1, 1, "if-version", true, cmd_rm, "rm KEY [--if-version N]", "remove one key, optionally only at a version"},
    {"exists", NULL, 1, -1, "", true, cmd_exists, "exists KEY...", "whether each key is live (exit 3: not all)"},
    {"incr", NULL, 1, 2, "ttl", true, cmd_incr, "incr KEY [DELTA] [--ttl D]",
     "add DELTA (default 1) to an int64, created from 0 (--ttl applies on creation)"},
    {"expire", NULL, 2, 2, "", true, cmd_expire, "expire KEY TTL", "give a live key a new time to live"},
    {"touch", NULL, 2, 2, "", true, cmd_expire, "touch KEY TTL", "the same as expire"},
    {"ttl", NULL, 1, 1, "", true, cmd_ttl, "ttl KEY", "the time left and the expiry (\"none\" without one)"},
    {"persist", NULL, 1, 1, "", true, cmd_persist, "persist KEY", "drop a key's expiry (exit 3: none to drop)"},
    {"scan", NULL, 0, 1, "values", true, cmd_scan, "scan [PREFIX] [--values]",
     "every live key of the cache (under PREFIX), with version and expiry, and values with --values"},
    {"clear", NULL, 0, 0, "", true, cmd_clear, "clear", "remove every entry of the cache (--cache)"},
    {"stats", NULL, 0, 0, "", true, cmd_stats, "stats",
     "entries, bytes and evictions of the --cache or of every cache (copies, with replicas)"},
    {"watch", NULL, 0, -1, "prefix values count", true, cmd_watch, "watch [KEY...] [--prefix P] [--values] [--count N]",
     "print changes as they happen until interrupted (keys, a prefix or the whole cache)"},
    {"pipeline", NULL, 0, 0, "", true, cmd_pipeline, "pipeline",
     "operations from standard input, one a line (get, set, add, rm, del, mget, exists, incr, expire, persist, ttl), "
     "sent on one Pipeline stream; answers in order"},
    {"health", NULL, 0, 1, "", true, cmd_health, "health [SERVICE]", "grpc.health.v1 Check (exit 3: not SERVING)"},
    {"ready", NULL, 0, 0, "ops", true, cmd_ready, "ready [--ops HOST:PORT]",
     "readiness details, one field a line (exit 3: not ready); from the ops listener with --ops"},
    {"snapshot", NULL, 0, 0, "", true, cmd_snapshot, "snapshot", "write a snapshot now and compact the journal"},
    {"call", NULL, 1, 2, "stdin", true, cmd_call, "call SERVICE/METHOD [JSON|-] [--stdin]",
     "call any method through server reflection; request and answers in JSON"},
    {"list", NULL, 0, 1, "", true, cmd_list, "list [SERVICE]", "the services the node serves, or a service's methods"},
    {"describe", NULL, 1, 1, "", true, cmd_describe, "describe SYMBOL", "a service, message or enum, as reflection has it"},
    {"cluster", "status", 0, 0, "etcd etcd-ca etcd-cert etcd-key etcd-user etcd-password-file prefix partitions", true,
     drey_cli_cluster_status,
     "cluster status [--etcd URLS] [--partitions]",
     "members, partitions and moves, from any node (--addr) or from etcd (--etcd)"},
    {"cluster", "init", 0, 0, "etcd etcd-ca etcd-cert etcd-key etcd-user etcd-password-file prefix partitions replication-factor initial-nodes",
     false, drey_cli_cluster_init,
     "cluster init --etcd URLS [--partitions N] [--replication-factor N] [--initial-nodes N]",
     "create a cluster's config in etcd (once; the same again is fine)"},
    {"drain", NULL, 0, 0, "pid pid-file wait ops", false, drey_cli_drain,
     "drain [--pid N | --pid-file F] [--wait D] [--ops HOST:PORT]",
     "SIGTERM dreyd and wait until it has drained: exited, or closed its ops listener (a preStop hook)"},
    {"version", NULL, 0, 0, "", false, cmd_version, "version", "this drey's version, git revision and build"},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static bool command_takes(const command *cmd, const char *opt) {
    size_t n = strlen(opt);
    for (const char *p = cmd->options; (p = strstr(p, opt)) != NULL; p += n)
        if ((p == cmd->options || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0'))
            return true;
    return false;
}

static void env_name(const char *opt, char *out, size_t cap) {
    size_t j = (size_t)snprintf(out, cap, "DREY_");
    for (; *opt != '\0' && j + 1 < cap; opt++)
        out[j++] = *opt == '-' ? '_' : (char)toupper((unsigned char)*opt);
    out[j] = '\0';
}

static void print_option(FILE *out, const option *o) {
    char env[64], left[96];
    env_name(o->name, env, sizeof env);
    if (o->shorthand)
        snprintf(left, sizeof left, "-%c, --%s%s%s", o->shorthand, o->name, o->arg ? " " : "", o->arg ? o->arg : "");
    else
        snprintf(left, sizeof left, "--%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
    fprintf(out, "  %-30s %s [%s]\n", left, o->help, env);
}

static void usage(FILE *out) {
    fprintf(out, "usage: drey [OPTIONS] COMMAND [ARGS] [OPTIONS]\n"
                 "       drey [OPTIONS]            interactive, or one command per line of standard input\n\n"
                 "Commands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(out, "  %-48s %s\n", commands[i].synopsis, commands[i].help);
    fprintf(out, "\nOptions (every one also from the environment variable in brackets):\n");
    for (size_t i = GLOBAL_FIRST; i < GLOBAL_COUNT; i++)
        print_option(out, &options[i]);
    print_option(out, &options[option_index("version", 7)]);
    fprintf(out, "\nOptions take a value as --name value or --name=value; -- ends them. A command's own\n"
                 "options are in `drey COMMAND --help`. Durations: 250ms, 5s, 2m, 1h.\n\n"
                 "Exit status:\n"
                 "  0  done\n"
                 "  1  a call failed (server error, unreachable, deadline): code, reason, details on stderr\n"
                 "  2  usage: the command line is wrong\n"
                 "  3  a negative answer: not found, not added, none removed, not all exist, not SERVING,\n"
                 "     not ready\n\n"
                 "docs/cli.md is the reference.\n");
}

static void command_usage(FILE *out, const command *cmd) {
    fprintf(out, "usage: drey %s\n\n%s.\n", cmd->synopsis, cmd->help);
    if (cmd->options[0] != '\0') {
        fprintf(out, "\nOptions:\n");
        for (size_t i = 0; i < N_OPTIONS; i++)
            if (command_takes(cmd, options[i].name))
                print_option(out, &options[i]);
    }
    if (strcmp(cmd->name, "set") == 0 || strcmp(cmd->name, "add") == 0 || strcmp(cmd->name, "mset") == 0)
        fprintf(out, "\nVALUE is a string; --int sends an int64, --json a JSON object, --file the bytes of the\n"
                     "file VALUE names.\n");
    fprintf(out, "\nGlobal options (drey --help): --addr, --endpoints, --cache, --token, --token-file, --timeout,\n"
                 "--tls, --tls-ca, --tls-cert, --tls-key, --tls-server-name, -o/--output.\n");
}

/* --- the command line ------------------------------------------------------------------ */

typedef struct parsed {
    const char *opt[N_OPTIONS];
    const char *addrs[DREY_CLI_MAX_ENDPOINTS];
    size_t n_addrs;
    char **pos;
    int n_pos;
} parsed;

/* Options anywhere, "--" ends them; false with a message on stderr. */
static bool parse_args(int argc, char **argv, parsed *p) {
    memset(p, 0, sizeof *p);
    p->pos = drey_xcalloc((size_t)argc + 1, sizeof *p->pos);
    bool done = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (done || a[0] != '-' || a[1] == '\0' || (a[1] != '-' && !(a[1] == 'o' || a[1] == 'h'))) {
            p->pos[p->n_pos++] = argv[i];
            continue;
        }
        if (strcmp(a, "--") == 0) {
            done = true;
            continue;
        }
        int k;
        const char *value = NULL;
        if (a[1] != '-') { /* -o json, -ojson, -h */
            k = option_index(a[1] == 'o' ? "output" : "help", a[1] == 'o' ? 6 : 4);
            if (a[2] != '\0')
                value = a + 2;
        } else {
            const char *eq = strchr(a + 2, '=');
            size_t n = eq != NULL ? (size_t)(eq - a - 2) : strlen(a + 2);
            k = option_index(a + 2, n);
            if (eq != NULL)
                value = eq + 1;
        }
        if (k < 0) {
            fprintf(stderr, "drey: unknown option %s (drey --help lists them)\n", a);
            return false;
        }
        const option *o = &options[k];
        /* --partitions alone (cluster status) or with a number (cluster init). */
        if (strcmp(o->name, "partitions") == 0 && value == NULL && i + 1 < argc && argv[i + 1][0] >= '0' &&
            argv[i + 1][0] <= '9')
            value = argv[++i];
        bool optional = strcmp(o->name, "partitions") == 0;
        if (o->flag && value != NULL && !optional) {
            fprintf(stderr, "drey: --%s takes no value\n", o->name);
            return false;
        }
        if (!o->flag && !optional && value == NULL) {
            if (i + 1 >= argc) {
                fprintf(stderr, "drey: --%s needs a value (--%s VALUE or --%s=VALUE)\n", o->name, o->name, o->name);
                return false;
            }
            value = argv[++i];
        }
        if (strcmp(o->name, "addr") == 0) {
            if (p->n_addrs == DREY_CLI_MAX_ENDPOINTS) {
                fprintf(stderr, "drey: at most %d endpoints\n", DREY_CLI_MAX_ENDPOINTS);
                return false;
            }
            p->addrs[p->n_addrs++] = value;
        }
        p->opt[k] = value != NULL ? value : "";
    }
    return true;
}

static const command *find_command(char **pos, int n_pos, int *used) {
    if (n_pos == 0)
        return NULL;
    const command *best = NULL;
    for (size_t i = 0; i < N_COMMANDS; i++) {
        if (strcmp(commands[i].name, pos[0]) != 0)
            continue;
        if (commands[i].sub == NULL) {
            *used = 1;
            return &commands[i];
        }
        if (n_pos >= 2 && strcmp(commands[i].sub, pos[1]) == 0) {
            *used = 2;
            return &commands[i];
        }
        best = &commands[i];
    }
    if (best != NULL)
        *used = 1; /* "cluster" alone: its help */
    return best;
}

static char *env_value(const option *o) {
    char env[64];
    env_name(o->name, env, sizeof env);
    return getenv(env);
}

/* The environment fills what the command line did not say. */
static void apply_env(parsed *p, const command *cmd) {
    for (size_t k = 0; k < N_OPTIONS; k++) {
        const option *o = &options[k];
        bool applies = k < GLOBAL_COUNT ? strcmp(o->name, "help") != 0 : cmd != NULL && command_takes(cmd, o->name);
        if (!applies || p->opt[k] != NULL)
            continue;
        const char *v = env_value(o);
        if (v == NULL || (o->flag && !(strcmp(v, "1") == 0 || strcmp(v, "true") == 0 || strcmp(v, "yes") == 0)))
            continue;
        if (strcmp(o->name, "addr") == 0 && p->n_addrs > 0)
            continue;
        p->opt[k] = o->flag ? "" : v;
        if (strcmp(o->name, "addr") == 0 && v[0] != '\0')
            p->addrs[p->n_addrs++] = v;
    }
}

static char *trimmed_file(const char *path) {
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return NULL;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getdelim(&line, &cap, '\0', f);
    fclose(f);
    if (n < 0) {
        free(line);
        return drey_xstrdup("");
    }
    char *s = line;
    while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
        s++;
    size_t len = strlen(s);
    while (len > 0 && (s[len - 1] == ' ' || s[len - 1] == '\t' || s[len - 1] == '\n' || s[len - 1] == '\r'))
        len--;
    char *out = drey_xmalloc(len + 1);
    memcpy(out, s, len);
    out[len] = '\0';
    free(line);
    return out;
}

/* Connection settings from the parsed options; false (message printed) when
 * they are wrong. */
static bool setup_connection(drey_cli *c, parsed *p) {
    c->n_endpoints = 0;
    for (size_t i = 0; i < p->n_addrs; i++)
        c->endpoints[c->n_endpoints++] = p->addrs[i];
    const char *eps = p->opt[option_index("endpoints", 9)];
    if (eps != NULL && c->n_endpoints == 0) {
        free(c->endpoints_buf);
        c->endpoints_buf = drey_xstrdup(eps);
        for (char *save = NULL, *t = strtok_r(c->endpoints_buf, ",", &save); t != NULL && c->n_endpoints < DREY_CLI_MAX_ENDPOINTS;
             t = strtok_r(NULL, ",", &save))
            c->endpoints[c->n_endpoints++] = t;
    }
    if (c->n_endpoints == 0)
        c->endpoints[c->n_endpoints++] = "127.0.0.1:50051";
    const char *tf = p->opt[option_index("token-file", 10)];
    free(c->token);
    c->token = NULL;
    if (tf != NULL) {
        if ((c->token = trimmed_file(tf)) == NULL) {
            fprintf(stderr, "drey: --token-file %s: %s\n", tf, strerror(errno));
            return false;
        }
    } else if (p->opt[option_index("token", 5)] != NULL) {
        c->token = drey_xstrdup(p->opt[option_index("token", 5)]);
    }
    c->copts = (drey_client_options){
        .max_recv_message_bytes = -1, /* the server's limits apply, not ours */
        .tls = p->opt[option_index("tls", 3)] != NULL,
        .tls_ca = p->opt[option_index("tls-ca", 6)],
        .tls_cert = p->opt[option_index("tls-cert", 8)],
        .tls_key = p->opt[option_index("tls-key", 7)],
        .tls_server_name = p->opt[option_index("tls-server-name", 15)],
    };
    const char *t = p->opt[option_index("timeout", 7)];
    c->timeout_ms = 5000;
    c->timeout_given = t != NULL;
    if (t != NULL && !drey_config_parse_duration_ms(t, &c->timeout_ms)) {
        fprintf(stderr, "drey: --timeout: expected a duration (250ms, 5s, 2m, 1h)\n");
        return false;
    }
    return true;
}

static bool same_connection(const drey_cli *c, const parsed *p) {
    (void)c;
    static const char *const conn[] = {"addr", "endpoints", "token", "token-file", "tls", "tls-ca", "tls-cert",
                                       "tls-key", "tls-server-name"};
    for (size_t i = 0; i < sizeof conn / sizeof conn[0]; i++)
        if (p->opt[option_index(conn[i], strlen(conn[i]))] != NULL)
            return false;
    return true;
}

/* Runs one command line (argv without the program's name). base: the
 * options of drey's own command line, when this is a line of the
 * interactive mode (they apply unless the line says otherwise; connection
 * options belong to the command line only). */
static int run_line(drey_cli *c, int argc, char **argv, const parsed *base, bool *quit) {
    parsed p;
    int rc = DREY_EXIT_USAGE;
    if (!parse_args(argc, argv, &p))
        goto out;
    if (base != NULL) {
        if (!same_connection(c, &p)) {
            fprintf(stderr, "drey: connection options go on drey's command line, not on an interactive line\n");
            goto out;
        }
        for (size_t k = 0; k < N_OPTIONS; k++)
            if (p.opt[k] == NULL && k < GLOBAL_COUNT && strcmp(options[k].name, "help") != 0)
                p.opt[k] = base->opt[k];
    }
    int used = 0;
    const command *cmd = find_command(p.pos, p.n_pos, &used);
    if (base == NULL)
        apply_env(&p, cmd);
    bool help = p.opt[option_index("help", 4)] != NULL;
    if (p.n_pos > 0 && strcmp(p.pos[0], "help") == 0) {
        help = true;
        cmd = find_command(p.pos + 1, p.n_pos - 1, &used);
        if (p.n_pos > 1 && cmd == NULL) {
            fprintf(stderr, "drey: unknown command \"%s\" (drey --help lists them)\n", p.pos[1]);
            goto out;
        }
    }
    if (quit != NULL && p.n_pos == 1 && (strcmp(p.pos[0], "quit") == 0 || strcmp(p.pos[0], "exit") == 0)) {
        *quit = true;
        rc = DREY_EXIT_OK;
        goto out;
    }
    if (help) {
        if (cmd != NULL && cmd->sub != NULL && used == 1) {
            for (size_t i = 0; i < N_COMMANDS; i++)
                if (strcmp(commands[i].name, cmd->name) == 0)
                    fprintf(stdout, "usage: drey %s\n       %s\n", commands[i].synopsis, commands[i].help);
        } else if (cmd != NULL) {
            command_usage(stdout, cmd);
        } else {
            usage(stdout);
        }
        rc = DREY_EXIT_OK;
        goto out;
    }
    const char *fmt = p.opt[option_index("output", 6)];
    c->format = DREY_OUT_TEXT;
    if (fmt != NULL && !drey_out_parse_format(fmt, &c->format)) {
        fprintf(stderr, "drey: -o: expected text, table or json\n");
        goto out;
    }
    if (p.opt[option_index("version", 7)] != NULL && (cmd == NULL || cmd->run == cmd_version)) {
        rc = cmd_version(c, NULL);
        goto out;
    }
    if (cmd == NULL) {
        if (p.n_pos == 0)
            usage(stderr);
        else
            fprintf(stderr, "drey: unknown command \"%s\" (drey --help lists them)\n", p.pos[0]);
        goto out;
    }
    if (cmd->sub != NULL && used == 1) {
        fprintf(stderr, "drey: %s needs a subcommand:\n", cmd->name);
        for (size_t i = 0; i < N_COMMANDS; i++)
            if (strcmp(commands[i].name, cmd->name) == 0)
                fprintf(stderr, "  drey %s\n", commands[i].synopsis);
        goto out;
    }
    for (size_t k = GLOBAL_COUNT; k < N_OPTIONS; k++) {
        if (p.opt[k] != NULL && !command_takes(cmd, options[k].name)) {
            fprintf(stderr, "drey: %s does not take --%s (drey %s --help)\n", cmd->name, options[k].name, cmd->name);
            goto out;
        }
    }
    int n_args = p.n_pos - used;
    if (n_args < cmd->min_args || (cmd->max_args >= 0 && n_args > cmd->max_args)) {
        fprintf(stderr, "usage: drey %s\n", cmd->synopsis);
        goto out;
    }
    if ((p.opt[option_index("int", 3)] != NULL) + (p.opt[option_index("json", 4)] != NULL) +
            (p.opt[option_index("file", 4)] != NULL) >
        1) {
        fprintf(stderr, "drey: --int, --json and --file exclude each other\n");
        goto out;
    }
    c->cache = p.opt[option_index("cache", 5)] != NULL ? p.opt[option_index("cache", 5)] : "";
    c->opt = p.opt;
    if (base == NULL && !setup_connection(c, &p))
        goto out;
    if (base != NULL) {
        const char *t = p.opt[option_index("timeout", 7)];
        c->timeout_given = t != NULL;
        c->timeout_ms = 5000;
        if (t != NULL && !drey_config_parse_duration_ms(t, &c->timeout_ms)) {
            fprintf(stderr, "drey: --timeout: expected a duration (250ms, 5s, 2m, 1h)\n");
            goto out;
        }
    }
    value_format = c->format;
    rc = cmd->run(c, p.pos + used);
    fflush(stdout);
    c->opt = NULL;
    drey_arena_reset(&c->arena);
out:
    free(p.pos);
    return rc;
}

/* --- interactive ----------------------------------------------------------------------- */

static char *history_path(void) {
    const char *h = getenv("DREY_HISTFILE");
    if (h != NULL)
        return h[0] != '\0' ? drey_xstrdup(h) : NULL;
    const char *home = getenv("HOME");
    if (home == NULL || home[0] == '\0')
        return NULL;
    size_t n = strlen(home) + 32;
    char *p = drey_xmalloc(n);
    snprintf(p, n, "%s/.drey_history", home);
    return p;
}

/* Lines of commands: with a prompt, line editing and history on a terminal
 * (as redis-cli), plainly from a pipe or file. The exit status is the last
 * command's. */
static int interactive(drey_cli *c, const parsed *base) {
    bool tty = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
    char *hist = tty ? history_path() : NULL;
    char prompt[300];
    if (tty) {
        using_history();
        stifle_history(1000);
        if (hist != NULL)
            read_history(hist);
        snprintf(prompt, sizeof prompt, "%s> ", c->endpoints[0]);
        printf("drey %s connected to %s; help lists the commands, quit leaves\n", drey_version(), c->endpoints[0]);
    }
    int rc = DREY_EXIT_OK;
    bool quit = false;
    char *line = NULL;
    size_t cap = 0;
    while (!quit) {
        char *text;
        if (tty) {
            if ((text = readline(prompt)) == NULL)
                break;
        } else {
            if (getline(&line, &cap, stdin) < 0)
                break;
            text = line;
        }
        char **w, *buf;
        int n = split_words(text, &w, &buf);
        if (n < 0) {
            fprintf(stderr, "drey: unclosed quote\n");
            rc = DREY_EXIT_USAGE;
        } else if (n > 0 && w[0][0] != '#') {
            if (tty)
                add_history(text);
            rc = run_line(c, n, w, base, &quit);
        }
        if (n >= 0) {
            free(w);
            free(buf);
        }
        if (tty)
            free(text);
    }
    free(line);
    if (tty && hist != NULL)
        write_history(hist);
    free(hist);
    return rc;
}

int main(int argc, char **argv) {
    drey_cli c;
    memset(&c, 0, sizeof c);
    drey_arena_init(&c.arena, NULL, 0);
    signals_start();
    parsed p;
    int rc = DREY_EXIT_USAGE;
    if (!parse_args(argc - 1, argv + 1, &p)) {
        free(p.pos);
        goto out;
    }
    if (p.n_pos > 0 || p.opt[option_index("help", 4)] != NULL || p.opt[option_index("version", 7)] != NULL) {
        free(p.pos);
        rc = run_line(&c, argc - 1, argv + 1, NULL, NULL);
        goto out;
    }
    /* No command: the interactive mode, with these options for every line. */
    apply_env(&p, NULL);
    const char *fmt = p.opt[option_index("output", 6)];
    if ((fmt != NULL && !drey_out_parse_format(fmt, &c.format)) || !setup_connection(&c, &p)) {
        if (fmt != NULL && !drey_out_parse_format(fmt, &c.format))
            fprintf(stderr, "drey: -o: expected text, table or json\n");
        free(p.pos);
        goto out;
    }
    rc = interactive(&c, &p);
    free(p.pos);
out:
    drey_client_close(c.client);
    free(c.token);
    free(c.endpoints_buf);
    drey_arena_destroy(&c.arena);
    signals_stop();
    return rc;
}
