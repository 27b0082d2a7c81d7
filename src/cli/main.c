/*
 * drey — the command-line client of dreyd.
 *
 *   drey [--addr=127.0.0.1:50051] [--cache=NAME] [--token=JWT] [--timeout=5s] <command> ...
 *
 * One call per run. Results go to stdout, one line each; a negative answer
 * (no such key, not added, not serving) is a line on stderr and exit status
 * 3; a failed call prints its gRPC code, the ErrorInfo reason and metadata
 * and every field violation on stderr and exits 1. The commands are a table
 * (below): adding one is a row and a function.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "drey/alloc.h"
#include "drey/admin/v1/admin.pb-c.h"
#include "drey/arena.h"
#include "drey/cache/v1/cache.pb-c.h"
#include "drey/client.h"
#include "drey/config.h"
#include "drey/pbjson.h"
#include "grpc/health/v1/health.pb-c.h"
#include "cluster.h"
#include "drain.h"
#include "json.h"
#include "ops.h"

#include <jansson.h>

enum {
    EXIT_OK = 0,
    EXIT_CALL_FAILED = 1, /* the call failed: server error, unreachable, deadline */
    EXIT_USAGE = 2,       /* the command line is wrong */
    EXIT_NEGATIVE = 3,    /* not found, not added, not serving, not ready */
};

/* Which command options a command takes. */
enum {
    OPT_TTL = 1u << 0,        /* --ttl=DURATION */
    OPT_IF_VERSION = 1u << 1, /* --if-version=N */
    OPT_KIND = 1u << 2,       /* --int, --json, --file */
    OPT_VALUES = 1u << 3,     /* --values */
};

typedef enum value_kind { KIND_STRING, KIND_INT, KIND_JSON, KIND_FILE } value_kind;

typedef struct cli {
    drey_client *client;
    const char *cache;
    int64_t timeout_ms;
    drey_arena arena;
    bool has_ttl;
    int64_t ttl_ms;
    bool has_if_version;
    uint64_t if_version;
    value_kind kind;
    bool values;
    const char *ops; /* --ops: readiness from the ops listener; NULL: $DREY_OPS_LISTEN or gRPC */
} cli;

typedef struct command {
    const char *name;
    int min_args, max_args;
    unsigned options;
    int (*run)(cli *c, char **args);
    const char *synopsis;
    const char *help;
} command;

/* --- output --------------------------------------------------------------- */

static void print_timestamp(FILE *out, const Google__Protobuf__Timestamp *t) {
    time_t secs = (time_t)t->seconds;
    struct tm tm;
    char buf[32];
    gmtime_r(&secs, &tm);
    strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    fprintf(out, "%s.%03dZ", buf, t->nanos / 1000000);
}

static void print_version(uint64_t version, const Google__Protobuf__Timestamp *expires_at) {
    printf(" version=%" PRIu64, version);
    if (expires_at != NULL) {
        printf(" expires_at=");
        print_timestamp(stdout, expires_at);
    }
    putchar('\n');
}

static void print_value(const Drey__Cache__V1__Value *v) {
    switch (v != NULL ? v->kind_case : DREY__CACHE__V1__VALUE__KIND__NOT_SET) {
    case DREY__CACHE__V1__VALUE__KIND_BYTES_VALUE: fwrite(v->bytes_value.data, 1, v->bytes_value.len, stdout); break;
    case DREY__CACHE__V1__VALUE__KIND_STRING_VALUE: fputs(v->string_value, stdout); break;
    case DREY__CACHE__V1__VALUE__KIND_INT64_VALUE: printf("%" PRId64, v->int64_value); break;
    case DREY__CACHE__V1__VALUE__KIND_DOUBLE_VALUE: printf("%.17g", v->double_value); break;
    case DREY__CACHE__V1__VALUE__KIND_BOOL_VALUE: fputs(v->bool_value ? "true" : "false", stdout); break;
    case DREY__CACHE__V1__VALUE__KIND_JSON_VALUE: drey_cli_json_print(stdout, v->json_value); break;
    case DREY__CACHE__V1__VALUE__KIND_NULL_VALUE: fputs("null", stdout); break;
    default: fputs("(no value)", stdout); break;
    }
    putchar('\n');
}

/* A failed call on stderr: code and message, then each detail on a line. */
static void report(const drey_client_status *st) {
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
}

static int negative(const char *what) {
    fprintf(stderr, "%s\n", what);
    return EXIT_NEGATIVE;
}

/* --- requests ------------------------------------------------------------- */

static bool call(cli *c, const char *method, const ProtobufCMessage *req, const ProtobufCMessageDescriptor *type,
                 void *resp) {
    drey_client_status st;
    if (drey_client_unary(c->client, method, req, type, c->timeout_ms, &c->arena, (ProtobufCMessage **)resp, &st) ==
        GRPC_STATUS_OK)
        return true;
    report(&st);
    return false;
}

static Google__Protobuf__Duration *ttl_of(cli *c, int64_t ms) {
    Google__Protobuf__Duration *d = drey_arena_alloc(&c->arena, sizeof *d);
    google__protobuf__duration__init(d);
    d->seconds = ms / 1000;
    d->nanos = (int32_t)(ms % 1000) * 1000000;
    return d;
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

static bool read_file(const char *path, drey_arena *a, ProtobufCBinaryData *out) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "drey: %s: %s\n", path, strerror(errno));
        return false;
    }
    size_t cap = 4096, len = 0;
    uint8_t *buf = drey_xmalloc(cap);
    size_t n;
    while ((n = fread(buf + len, 1, cap - len, f)) > 0) {
        len += n;
        if (len == cap)
            buf = drey_xrealloc(buf, cap *= 2, 1);
    }
    bool ok = !ferror(f);
    if (!ok)
        fprintf(stderr, "drey: %s: cannot read\n", path);
    fclose(f);
    if (ok) {
        out->len = len;
        out->data = drey_arena_alloc(a, len > 0 ? len : 1);
        memcpy(out->data, buf, len);
    }
    free(buf);
    return ok;
}

/* VALUE as the kind the options ask for; NULL (message printed) if it does
 * not parse. */
static Drey__Cache__V1__Value *value_of(cli *c, const char *text) {
    Drey__Cache__V1__Value *v = drey_arena_alloc(&c->arena, sizeof *v);
    drey__cache__v1__value__init(v);
    char err[256];
    switch (c->kind) {
    case KIND_STRING:
        v->kind_case = DREY__CACHE__V1__VALUE__KIND_STRING_VALUE;
        v->string_value = (char *)text;
        return v;
    case KIND_INT:
        v->kind_case = DREY__CACHE__V1__VALUE__KIND_INT64_VALUE;
        if (!parse_int64(text, &v->int64_value)) {
            fprintf(stderr, "drey: --int: \"%s\" is not an int64\n", text);
            return NULL;
        }
        return v;
    case KIND_JSON:
        v->kind_case = DREY__CACHE__V1__VALUE__KIND_JSON_VALUE;
        v->json_value = drey_cli_json_parse(text, &c->arena, err, sizeof err);
        if (v->json_value == NULL) {
            fprintf(stderr, "drey: --json: %s\n", err);
            return NULL;
        }
        return v;
    case KIND_FILE:
        v->kind_case = DREY__CACHE__V1__VALUE__KIND_BYTES_VALUE;
        return read_file(text, &c->arena, &v->bytes_value) ? v : NULL;
    }
    return NULL;
}

/* --- commands ------------------------------------------------------------- */

static int cmd_get(cli *c, char **args) {
    Drey__Cache__V1__GetRequest req = DREY__CACHE__V1__GET_REQUEST__INIT;
    req.cache = (char *)c->cache;
    req.key = args[0];
    Drey__Cache__V1__GetResponse *resp;
    if (!call(c, DREY_CLIENT_CACHE("Get"), &req.base, &drey__cache__v1__get_response__descriptor, &resp))
        return EXIT_CALL_FAILED;
    if (!resp->found)
        return negative("not found");
    print_value(resp->value);
    return EXIT_OK;
}

static int cmd_set(cli *c, char **args) {
    Drey__Cache__V1__SetRequest req = DREY__CACHE__V1__SET_REQUEST__INIT;
    req.cache = (char *)c->cache;
    req.key = args[0];
    if ((req.value = value_of(c, args[1])) == NULL)
        return EXIT_USAGE;
    if (c->has_ttl) {
        req.expiration_case = DREY__CACHE__V1__SET_REQUEST__EXPIRATION_TTL;
        req.ttl = ttl_of(c, c->ttl_ms);
    }
    if (c->has_if_version) {
        req.condition_case = DREY__CACHE__V1__SET_REQUEST__CONDITION_IF_VERSION;
        req.if_version = c->if_version;
    }
    Drey__Cache__V1__SetResponse *resp;
    if (!call(c, DREY_CLIENT_CACHE("Set"), &req.base, &drey__cache__v1__set_response__descriptor, &resp))
        return EXIT_CALL_FAILED;
    printf("OK");
    print_version(resp->version, resp->expires_at);
    return EXIT_OK;
}

static int cmd_add(cli *c, char **args) {
    Drey__Cache__V1__AddRequest req = DREY__CACHE__V1__ADD_REQUEST__INIT;
    req.cache = (char *)c->cache;
    req.key = args[0];
    if ((req.value = value_of(c, args[1])) == NULL)
        return EXIT_USAGE;
    if (c->has_ttl) {
        req.expiration_case = DREY__CACHE__V1__ADD_REQUEST__EXPIRATION_TTL;
        req.ttl = ttl_of(c, c->ttl_ms);
    }
    Drey__Cache__V1__AddResponse *resp;
    if (!call(c, DREY_CLIENT_CACHE("Add"), &req.base, &drey__cache__v1__add_response__descriptor, &resp))
        return EXIT_CALL_FAILED;
    if (!resp->added) {
        fprintf(stderr, "exists version=%" PRIu64 "\n", resp->version);
        return EXIT_NEGATIVE;
    }
    printf("added");
    print_version(resp->version, resp->expires_at);
    return EXIT_OK;
}

static int cmd_rm(cli *c, char **args) {
    Drey__Cache__V1__RemoveRequest req = DREY__CACHE__V1__REMOVE_REQUEST__INIT;
    req.cache = (char *)c->cache;
    req.key = args[0];
    if (c->has_if_version) {
        req.condition_case = DREY__CACHE__V1__REMOVE_REQUEST__CONDITION_IF_VERSION;
        req.if_version = c->if_version;
    }
    Drey__Cache__V1__RemoveResponse *resp;
    if (!call(c, DREY_CLIENT_CACHE("Remove"), &req.base, &drey__cache__v1__remove_response__descriptor, &resp))
        return EXIT_CALL_FAILED;
    if (!resp->removed)
        return negative("not found");
    printf("removed");
    print_version(resp->version, NULL);
    return EXIT_OK;
}

static int cmd_incr(cli *c, char **args) {
    Drey__Cache__V1__IncrementRequest req = DREY__CACHE__V1__INCREMENT_REQUEST__INIT;
    req.cache = (char *)c->cache;
    req.key = args[0];
    req.delta = 1;
    if (args[1] != NULL && !parse_int64(args[1], &req.delta)) {
        fprintf(stderr, "drey: incr: DELTA \"%s\" is not an int64\n", args[1]);
        return EXIT_USAGE;
    }
    if (c->has_ttl) {
        req.expiration_case = DREY__CACHE__V1__INCREMENT_REQUEST__EXPIRATION_TTL;
        req.ttl = ttl_of(c, c->ttl_ms);
    }
    Drey__Cache__V1__IncrementResponse *resp;
    if (!call(c, DREY_CLIENT_CACHE("Increment"), &req.base, &drey__cache__v1__increment_response__descriptor, &resp))
        return EXIT_CALL_FAILED;
    printf("%" PRId64 "\n", resp->value);
    return EXIT_OK;
}

static int cmd_touch(cli *c, char **args) {
    int64_t ms;
    if (!drey_config_parse_duration_ms(args[1], &ms)) {
        fprintf(stderr, "drey: touch: TTL \"%s\" is not a duration (250ms, 5s, 2m, 1h)\n", args[1]);
        return EXIT_USAGE;
    }
    Drey__Cache__V1__TouchRequest req = DREY__CACHE__V1__TOUCH_REQUEST__INIT;
    req.cache = (char *)c->cache;
    req.key = args[0];
    req.ttl = ttl_of(c, ms);
    Drey__Cache__V1__TouchResponse *resp;
    if (!call(c, DREY_CLIENT_CACHE("Touch"), &req.base, &drey__cache__v1__touch_response__descriptor, &resp))
        return EXIT_CALL_FAILED;
    if (!resp->found)
        return negative("not found");
    printf("OK");
    print_version(resp->version, resp->expires_at);
    return EXIT_OK;
}

static int cmd_persist(cli *c, char **args) {
    Drey__Cache__V1__PersistRequest req = DREY__CACHE__V1__PERSIST_REQUEST__INIT;
    req.cache = (char *)c->cache;
    req.key = args[0];
    Drey__Cache__V1__PersistResponse *resp;
    if (!call(c, DREY_CLIENT_CACHE("Persist"), &req.base, &drey__cache__v1__persist_response__descriptor, &resp))
        return EXIT_CALL_FAILED;
    if (!resp->found)
        return negative("not found or without expiry");
    printf("OK");
    print_version(resp->version, NULL);
    return EXIT_OK;
}

static int cmd_ttl(cli *c, char **args) {
    Drey__Cache__V1__GetExpirationRequest req = DREY__CACHE__V1__GET_EXPIRATION_REQUEST__INIT;
    req.cache = (char *)c->cache;
    req.key = args[0];
    Drey__Cache__V1__GetExpirationResponse *resp;
    if (!call(c, DREY_CLIENT_CACHE("GetExpiration"), &req.base, &drey__cache__v1__get_expiration_response__descriptor,
              &resp))
        return EXIT_CALL_FAILED;
    if (!resp->found)
        return negative("not found");
    if (!resp->has_expiration || resp->remaining == NULL || resp->expires_at == NULL) {
        printf("none\n");
        return EXIT_OK;
    }
    printf("%" PRId64 ".%03ds expires_at=", resp->remaining->seconds, resp->remaining->nanos / 1000000);
    print_timestamp(stdout, resp->expires_at);
    putchar('\n');
    return EXIT_OK;
}

static int cmd_health(cli *c, char **args) {
    Grpc__Health__V1__HealthCheckRequest req = GRPC__HEALTH__V1__HEALTH_CHECK_REQUEST__INIT;
    req.service = args[0] != NULL ? args[0] : "";
    Grpc__Health__V1__HealthCheckResponse *resp;
    if (!call(c, DREY_CLIENT_HEALTH("Check"), &req.base, &grpc__health__v1__health_check_response__descriptor, &resp))
        return EXIT_CALL_FAILED;
    const ProtobufCEnumValue *ev =
        protobuf_c_enum_descriptor_get_value(&grpc__health__v1__health_check_response__serving_status__descriptor,
                                             (int)resp->status);
    printf("%s\n", ev != NULL ? ev->name : "UNKNOWN");
    return resp->status == GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING ? EXIT_OK : EXIT_NEGATIVE;
}

static int cmd_snapshot(cli *c, char **args) {
    (void)args;
    Drey__Admin__V1__SnapshotRequest req = DREY__ADMIN__V1__SNAPSHOT_REQUEST__INIT;
    Drey__Admin__V1__SnapshotResponse *resp;
    if (!call(c, DREY_CLIENT_ADMIN("Snapshot"), &req.base, &drey__admin__v1__snapshot_response__descriptor, &resp))
        return EXIT_CALL_FAILED;
    int64_t ms = resp->duration != NULL ? resp->duration->seconds * 1000 + resp->duration->nanos / 1000000 : 0;
    printf("snapshot lsn=%" PRIu64 " file=%s entries=%" PRIu64 " bytes=%" PRIu64 " ms=%" PRId64
           " segments_removed=%" PRIu32 "\n",
           resp->lsn, resp->file, resp->entries, resp->bytes, ms, resp->segments_removed);
    return EXIT_OK;
}

/* The document GET /health/ready/details serves, written by the same code,
 * so scripts can read either. */
static int cmd_ready(cli *c, char **args) {
    (void)args;
    char ops[300];
    if (drey_cli_ops_address(c->ops, ops, sizeof ops)) {
        /* The ops listener's document, from loopback: no token needed
         * (inside a pod: kubectl exec ... drey ready). */
        char *body, err[320];
        size_t len;
        int status = drey_cli_ops_get(ops, "/health/ready/details", &body, &len, err, sizeof err);
        if (status != 200) {
            if (status == 0)
                fprintf(stderr, "drey: ready: %s\n", err);
            else
                fprintf(stderr, "drey: ready: %s answered HTTP %d: %s", ops, status, body);
            free(body);
            return EXIT_CALL_FAILED;
        }
        fwrite(body, 1, len, stdout);
        json_t *doc = json_loadb(body, len, 0, NULL);
        bool ready = json_is_true(json_object_get(doc, "ready"));
        json_decref(doc);
        free(body);
        return ready ? EXIT_OK : EXIT_NEGATIVE;
    }
    Drey__Admin__V1__GetReadinessDetailsRequest req = DREY__ADMIN__V1__GET_READINESS_DETAILS_REQUEST__INIT;
    Drey__Admin__V1__ReadinessDetails *resp;
    if (!call(c, DREY_CLIENT_ADMIN("GetReadinessDetails"), &req.base, &drey__admin__v1__readiness_details__descriptor,
              &resp))
        return EXIT_CALL_FAILED;
    drey_pbjson_write(stdout, &resp->base);
    putchar('\n');
    return resp->ready ? EXIT_OK : EXIT_NEGATIVE;
}

/* Every page, one line per key: "KEY version=N", with --values also
 * [expires_at=T] and the value. A key present for the whole scan is printed
 * at least once (a key written during it may be printed twice). */
static int cmd_scan(cli *c, char **args) {
    Drey__Cache__V1__ScanRequest req = DREY__CACHE__V1__SCAN_REQUEST__INIT;
    req.cache = (char *)c->cache;
    req.prefix = args[0] != NULL ? args[0] : "";
    req.limit = 1000;
    req.include_values = c->values;
    char *cursor = strdup("");
    if (cursor == NULL)
        abort();
    for (;;) {
        req.cursor = cursor;
        Drey__Cache__V1__ScanResponse *resp;
        if (!call(c, DREY_CLIENT_CACHE("Scan"), &req.base, &drey__cache__v1__scan_response__descriptor, &resp)) {
            free(cursor);
            return EXIT_CALL_FAILED;
        }
        for (size_t i = 0; i < resp->n_items; i++) {
            const Drey__Cache__V1__ScanResponse__Item *it = resp->items[i];
            printf("%s version=%" PRIu64, it->key, it->version);
            if (it->expires_at != NULL) {
                printf(" expires_at=");
                print_timestamp(stdout, it->expires_at);
            }
            if (it->value != NULL) {
                printf(" ");
                print_value(it->value); /* ends the line */
            } else {
                printf("\n");
            }
        }
        free(cursor);
        cursor = strdup(resp->next_cursor);
        if (cursor == NULL)
            abort();
        drey_arena_reset(&c->arena); /* a page at a time, however big the cache */
        if (cursor[0] == '\0')
            break;
    }
    free(cursor);
    return EXIT_OK;
}

static int cmd_clear(cli *c, char **args) {
    (void)args;
    Drey__Cache__V1__ClearRequest req = DREY__CACHE__V1__CLEAR_REQUEST__INIT;
    req.cache = (char *)c->cache;
    Drey__Cache__V1__ClearResponse *resp;
    if (!call(c, DREY_CLIENT_CACHE("Clear"), &req.base, &drey__cache__v1__clear_response__descriptor, &resp))
        return EXIT_CALL_FAILED;
    printf("cleared\n");
    return EXIT_OK;
}

static void print_stats(const Drey__Cache__V1__CacheStats *st) {
    printf("%s entries=%" PRIu64 " bytes=%" PRIu64 " expiring=%" PRIu64 " evictions=%" PRIu64
           " evicted_bytes=%" PRIu64 "\n",
           st->cache, st->entries, st->bytes, st->expiring, st->evictions, st->evicted_bytes);
}

/* With --cache: that cache's figures; without: every cache's. */
static int cmd_stats(cli *c, char **args) {
    (void)args;
    if (c->cache[0] != '\0') {
        Drey__Cache__V1__GetCacheStatsRequest req = DREY__CACHE__V1__GET_CACHE_STATS_REQUEST__INIT;
        req.cache = (char *)c->cache;
        Drey__Cache__V1__CacheStats *resp;
        if (!call(c, DREY_CLIENT_CACHE("GetCacheStats"), &req.base, &drey__cache__v1__cache_stats__descriptor,
                  &resp))
            return EXIT_CALL_FAILED;
        print_stats(resp);
        return EXIT_OK;
    }
    Drey__Cache__V1__ListCachesRequest req = DREY__CACHE__V1__LIST_CACHES_REQUEST__INIT;
    Drey__Cache__V1__ListCachesResponse *resp;
    if (!call(c, DREY_CLIENT_CACHE("ListCaches"), &req.base, &drey__cache__v1__list_caches_response__descriptor,
              &resp))
        return EXIT_CALL_FAILED;
    for (size_t i = 0; i < resp->n_caches; i++)
        print_stats(resp->caches[i]);
    return EXIT_OK;
}

static const command commands[] = {
    {"get", 1, 1, 0, cmd_get, "get KEY", "print the value"},
    {"set", 2, 2, OPT_TTL | OPT_IF_VERSION | OPT_KIND, cmd_set, "set KEY VALUE [--ttl=D] [--if-version=N]",
     "store a value (upsert); --if-version=0 means only if absent"},
    {"add", 2, 2, OPT_TTL | OPT_KIND, cmd_add, "add KEY VALUE [--ttl=D]", "store only if the key is absent"},
    {"rm", 1, 1, OPT_IF_VERSION, cmd_rm, "rm KEY [--if-version=N]", "remove a key"},
    {"incr", 1, 2, OPT_TTL, cmd_incr, "incr KEY [DELTA] [--ttl=D]",
     "add DELTA (default 1) to an int64, creating it from 0; --ttl applies on creation"},
    {"touch", 2, 2, 0, cmd_touch, "touch KEY TTL", "give a live key a new time to live"},
    {"persist", 1, 1, 0, cmd_persist, "persist KEY", "drop a key's expiry"},
    {"ttl", 1, 1, 0, cmd_ttl, "ttl KEY", "print the time left (\"none\" without expiry)"},
    {"health", 0, 1, 0, cmd_health, "health [SERVICE]", "grpc.health.v1 Check (\"\" is the whole server)"},
    {"ready", 0, 0, 0, cmd_ready, "ready", "readiness details as JSON (the ops listener's document)"},
    {"snapshot", 0, 0, 0, cmd_snapshot, "snapshot", "write a snapshot now and compact the journal"},
    {"scan", 0, 1, OPT_VALUES, cmd_scan, "scan [PREFIX] [--values]",
     "list the cache's live keys (under PREFIX), with versions, and values with --values"},
    {"clear", 0, 0, 0, cmd_clear, "clear", "remove every entry of the cache (--cache; default: the default cache)"},
    {"stats", 0, 0, 0, cmd_stats, "stats", "entries, bytes and evictions of the --cache, or of every cache"},
};

#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *out) {
    fprintf(out, "usage: drey [--addr=HOST:PORT] [--cache=NAME] [--token=JWT] [--timeout=D] <command> ...\n"
                 "       drey cluster init|status --etcd=URLS ...   (drey cluster for its options)\n"
                 "       drey drain [--pid=N] [--wait=D]           SIGTERM dreyd and wait for its exit (preStop)\n\n"
                 "Options:\n"
                 "  --addr=HOST:PORT  server address (default $DREY_ADDR, else 127.0.0.1:50051)\n"
                 "  --cache=NAME      cache (namespace); default: the server's default cache\n"
                 "  --token=JWT       bearer token sent with every call (default $DREY_TOKEN)\n"
                 "  --ops=HOST:PORT   ready: read the ops listener's details from there instead (default\n"
                 "                    $DREY_OPS_LISTEN, as in a pod: loopback needs no token)\n"
                 "  --timeout=D       deadline of the call (default 5s)\n\n"
                 "Commands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(out, "  %-42s %s\n", commands[i].synopsis, commands[i].help);
    fprintf(out, "\nValues (set, add): VALUE is a string; --int sends an int64, --json a JSON object,\n"
                 "--file the bytes of the file VALUE names.\n"
                 "Durations: 250ms, 5s, 2m, 1h (a bare number is milliseconds).\n\n"
                 "Exit status:\n"
                 "  0  success\n"
                 "  1  the call failed (server error, unreachable, deadline); code, reason and\n"
                 "     field violations are printed on stderr\n"
                 "  2  usage error\n"
                 "  3  a negative answer: not found, not added (the key exists), not SERVING,\n"
                 "     not ready\n");
}

/* --- command line --------------------------------------------------------- */

typedef struct flag {
    const char *name;
    bool takes_value;
    unsigned needs; /* the command option it belongs to; 0: global */
    const char *value;
    bool set;
} flag;

enum { F_ADDR, F_CACHE, F_TOKEN, F_TIMEOUT, F_TTL, F_IF_VERSION, F_INT, F_JSON, F_FILE, F_VALUES, F_HELP, F_OPS,
       N_FLAGS };

static int run(int argc, char **argv) {
    flag flags[N_FLAGS] = {
        [F_ADDR] = {"addr", true, 0, NULL, false},
        [F_CACHE] = {"cache", true, 0, NULL, false},
        [F_TOKEN] = {"token", true, 0, NULL, false},
        [F_TIMEOUT] = {"timeout", true, 0, NULL, false},
        [F_TTL] = {"ttl", true, OPT_TTL, NULL, false},
        [F_IF_VERSION] = {"if-version", true, OPT_IF_VERSION, NULL, false},
        [F_INT] = {"int", false, OPT_KIND, NULL, false},
        [F_JSON] = {"json", false, OPT_KIND, NULL, false},
        [F_FILE] = {"file", false, OPT_KIND, NULL, false},
        [F_VALUES] = {"values", false, OPT_VALUES, NULL, false},
        [F_HELP] = {"help", false, 0, NULL, false},
        [F_OPS] = {"ops", true, 0, NULL, false},
    };
    char **pos = drey_xcalloc((size_t)argc + 1, sizeof *pos);
    int n_pos = 0;
    bool options_done = false;
    int rc = EXIT_USAGE;
    cli c = {.timeout_ms = 5000, .cache = ""};
    drey_arena_init(&c.arena, NULL, 0);

    /* Options may come anywhere; "--" ends them (for values that start
     * with "--"). Anything else, "-5" included, is an argument. */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (options_done || strncmp(a, "--", 2) != 0) {
            pos[n_pos++] = argv[i];
            continue;
        }
        if (a[2] == '\0') {
            options_done = true;
            continue;
        }
        const char *eq = strchr(a + 2, '=');
        size_t nlen = eq != NULL ? (size_t)(eq - a - 2) : strlen(a + 2);
        flag *f = NULL;
        for (size_t k = 0; k < N_FLAGS; k++) {
            if (strlen(flags[k].name) == nlen && strncmp(flags[k].name, a + 2, nlen) == 0)
                f = &flags[k];
        }
        if (f == NULL || f->takes_value != (eq != NULL)) {
            fprintf(stderr, f == NULL ? "drey: unknown option %s\n"
                            : f->takes_value ? "drey: %s needs a value (--name=value)\n"
                                             : "drey: %s takes no value\n",
                    a);
            goto out;
        }
        f->set = true;
        f->value = eq != NULL ? eq + 1 : NULL;
    }
    if (flags[F_HELP].set) {
        usage(stdout);
        rc = EXIT_OK;
        goto out;
    }
    if (n_pos == 0) {
        usage(stderr);
        goto out;
    }
    const command *cmd = NULL;
    for (size_t k = 0; k < N_COMMANDS; k++) {
        if (strcmp(commands[k].name, pos[0]) == 0)
            cmd = &commands[k];
    }
    if (cmd == NULL) {
        fprintf(stderr, "drey: unknown command \"%s\" (drey --help lists them)\n", pos[0]);
        goto out;
    }
    int n_args = n_pos - 1;
    if (n_args < cmd->min_args || n_args > cmd->max_args) {
        fprintf(stderr, "usage: drey %s\n", cmd->synopsis);
        goto out;
    }
    for (size_t k = 0; k < N_FLAGS; k++) {
        if (flags[k].set && flags[k].needs != 0 && (cmd->options & flags[k].needs) == 0) {
            fprintf(stderr, "drey: %s does not take --%s\n", cmd->name, flags[k].name);
            goto out;
        }
    }
    if (flags[F_INT].set + flags[F_JSON].set + flags[F_FILE].set > 1) {
        fprintf(stderr, "drey: --int, --json and --file exclude each other\n");
        goto out;
    }
    c.kind = flags[F_INT].set ? KIND_INT : flags[F_JSON].set ? KIND_JSON : flags[F_FILE].set ? KIND_FILE : KIND_STRING;
    if (flags[F_TIMEOUT].set && !drey_config_parse_duration_ms(flags[F_TIMEOUT].value, &c.timeout_ms)) {
        fprintf(stderr, "drey: --timeout: expected a duration (250ms, 5s, 2m, 1h)\n");
        goto out;
    }
    if (flags[F_TTL].set && !drey_config_parse_duration_ms(flags[F_TTL].value, &c.ttl_ms)) {
        fprintf(stderr, "drey: --ttl: expected a duration (250ms, 5s, 2m, 1h)\n");
        goto out;
    }
    c.has_ttl = flags[F_TTL].set;
    if (flags[F_IF_VERSION].set && !parse_uint64(flags[F_IF_VERSION].value, &c.if_version)) {
        fprintf(stderr, "drey: --if-version: expected an unsigned integer\n");
        goto out;
    }
    c.has_if_version = flags[F_IF_VERSION].set;
    c.values = flags[F_VALUES].set;
    if (flags[F_CACHE].set)
        c.cache = flags[F_CACHE].value;
    c.ops = flags[F_OPS].set ? flags[F_OPS].value : NULL;

    const char *addr = flags[F_ADDR].set ? flags[F_ADDR].value : getenv("DREY_ADDR");
    const char *token = flags[F_TOKEN].set ? flags[F_TOKEN].value : getenv("DREY_TOKEN");
    drey_client_options opts = {
        .target = addr != NULL && addr[0] != '\0' ? addr : "127.0.0.1:50051",
        .token = token,
        .max_recv_message_bytes = -1, /* the server's limits apply, not ours */
    };
    char err[256];
    c.client = drey_client_open(&opts, err, sizeof err);
    if (c.client == NULL) {
        fprintf(stderr, "drey: %s\n", err);
        goto out;
    }
    rc = cmd->run(&c, pos + 1);
    fflush(stdout);
    drey_client_close(c.client);

out:
    drey_arena_destroy(&c.arena);
    free(pos);
    return rc;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "cluster") == 0)
        return drey_cli_cluster(argc - 2, argv + 2);
    if (argc >= 2 && strcmp(argv[1], "drain") == 0)
        return drey_cli_drain(argc - 2, argv + 2);
    return run(argc, argv);
}
