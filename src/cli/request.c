/*
 * request — the requests of drey's data commands, built in one place for
 * both ways of giving them: a command line (`drey set k v --ttl 5s`) and a
 * line of `drey pipeline` (`set k v --ttl=5s`). A table names each
 * operation, its arguments, its Cache method and the function that builds
 * its request from the arguments and the options (--ttl, --if-version, how
 * VALUE reads). Everything a request points to is in the CLI's arena, so a
 * pipeline line's words can go once it is built.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "cli.h"
#include "drey/alloc.h"
#include "drey/config.h"
#include "drey/rpc.h"
#include "json.h"

bool drey_cli_parse_int64(const char *s, int64_t *out) {
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end != '\0' || errno != 0)
        return false;
    *out = v;
    return true;
}

bool drey_cli_parse_uint64(const char *s, uint64_t *out) {
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || *end != '\0' || errno != 0 || s[0] == '-')
        return false;
    *out = v;
    return true;
}

bool drey_cli_read_whole(const char *path, drey_arena *a, ProtobufCBinaryData *out, char *err, size_t cap) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, cap, "%s: %s", path, strerror(errno));
        return false;
    }
    size_t buf_cap = 4096, len = 0, n;
    uint8_t *buf = drey_xmalloc(buf_cap);
    while ((n = fread(buf + len, 1, buf_cap - len, f)) > 0) {
        len += n;
        if (len == buf_cap)
            buf = drey_xrealloc(buf, buf_cap *= 2, 1);
    }
    bool ok = !ferror(f);
    if (!ok)
        snprintf(err, cap, "%s: cannot read", path);
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

static char *copy(drey_cli *c, const char *s) {
    return drey_arena_strndup(&c->arena, s, strlen(s));
}

Drey__Cache__V1__Value *drey_cli_value(drey_cli *c, drey_cli_value_kind kind, const char *text, char *err,
                                       size_t cap) {
    Drey__Cache__V1__Value *v = drey_arena_alloc(&c->arena, sizeof *v);
    drey__cache__v1__value__init(v);
    char why[256];
    switch (kind) {
    case DREY_CLI_VALUE_INT:
        v->kind_case = DREY__CACHE__V1__VALUE__KIND_INT64_VALUE;
        if (!drey_cli_parse_int64(text, &v->int64_value)) {
            snprintf(err, cap, "--int: \"%s\" is not an int64", text);
            return NULL;
        }
        break;
    case DREY_CLI_VALUE_JSON:
        v->kind_case = DREY__CACHE__V1__VALUE__KIND_JSON_VALUE;
        if ((v->json_value = drey_cli_json_parse(text, &c->arena, why, sizeof why)) == NULL) {
            snprintf(err, cap, "--json: %s", why);
            return NULL;
        }
        break;
    case DREY_CLI_VALUE_FILE:
        v->kind_case = DREY__CACHE__V1__VALUE__KIND_BYTES_VALUE;
        if (!drey_cli_read_whole(text, &c->arena, &v->bytes_value, err, cap))
            return NULL;
        break;
    case DREY_CLI_VALUE_STRING:
        v->kind_case = DREY__CACHE__V1__VALUE__KIND_STRING_VALUE;
        v->string_value = copy(c, text);
        break;
    }
    return v;
}

Google__Protobuf__Duration *drey_cli_duration(drey_cli *c, int64_t ms) {
    Google__Protobuf__Duration *d = drey_arena_alloc(&c->arena, sizeof *d);
    google__protobuf__duration__init(d);
    d->seconds = ms / 1000;
    d->nanos = (int32_t)(ms % 1000) * 1000000;
    return d;
}

bool drey_cli_ttl(drey_cli *c, const char *text, Google__Protobuf__Duration **out, char *err, size_t cap) {
    int64_t ms;
    *out = NULL;
    if (text == NULL)
        return true;
    if (!drey_config_parse_duration_ms(text, &ms) || ms <= 0) {
        snprintf(err, cap, "--ttl: expected a positive duration (250ms, 5s, 2m, 1h)");
        return false;
    }
    *out = drey_cli_duration(c, ms);
    return true;
}

/* --if-version as a number; *given false without one. */
static bool if_version(const drey_cli_op *op, bool *given, uint64_t *v, char *err, size_t cap) {
    *given = op->if_version != NULL;
    if (*given && !drey_cli_parse_uint64(op->if_version, v)) {
        snprintf(err, cap, "--if-version: expected an unsigned integer");
        return false;
    }
    return true;
}

char *drey_cli_request_id(drey_cli *c) {
    /* With several endpoints, a random request_id: a write the CLI sends
     * again to another endpoint (failover) is then applied once. With one
     * there is no second try, and no outcome for the node to remember. */
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

/* --- the requests ------------------------------------------------------------------- */

/* How an operation's arguments fill its request, besides the cache, the
 * request_id (where the type has one), --ttl and --if-version (where it
 * has those fields). */
enum {
    ARGS_KEY,       /* KEY */
    ARGS_KEYS,      /* KEY... */
    ARGS_KEY_VALUE, /* KEY VALUE: value, as op->kind says */
    ARGS_KEY_DELTA, /* KEY [DELTA]: delta, 1 without one */
    ARGS_KEY_TTL,   /* KEY TTL: ttl, from the argument */
};

/* The operations a pipeline line may name, and the commands of the same
 * name; rm is RemoveMany of one key in a pipeline, and Remove with
 * --if-version as a command (drey_cli_build_remove). */
typedef struct op_kind {
    const char *name;
    int min_args, max_args; /* of a pipeline line */
    const char *method;     /* its path */
    const ProtobufCMessageDescriptor *request;
    int args;
} op_kind;

static const op_kind ops[] = {
    {"get", 1, 1, DREY_CLIENT_CACHE("Get"), &drey__cache__v1__get_request__descriptor, ARGS_KEY},
    {"set", 2, 2, DREY_CLIENT_CACHE("Set"), &drey__cache__v1__set_request__descriptor, ARGS_KEY_VALUE},
    {"add", 2, 2, DREY_CLIENT_CACHE("Add"), &drey__cache__v1__add_request__descriptor, ARGS_KEY_VALUE},
    {"rm", 1, 1, DREY_CLIENT_CACHE("RemoveMany"), &drey__cache__v1__remove_many_request__descriptor, ARGS_KEYS},
    {"del", 1, 1000, DREY_CLIENT_CACHE("RemoveMany"), &drey__cache__v1__remove_many_request__descriptor, ARGS_KEYS},
    {"mget", 1, 1000, DREY_CLIENT_CACHE("GetMany"), &drey__cache__v1__get_many_request__descriptor, ARGS_KEYS},
    {"exists", 1, 1000, DREY_CLIENT_CACHE("GetMany"), &drey__cache__v1__get_many_request__descriptor, ARGS_KEYS},
    {"incr", 1, 2, DREY_CLIENT_CACHE("Increment"), &drey__cache__v1__increment_request__descriptor, ARGS_KEY_DELTA},
    {"expire", 2, 2, DREY_CLIENT_CACHE("Touch"), &drey__cache__v1__touch_request__descriptor, ARGS_KEY_TTL},
    {"touch", 2, 2, DREY_CLIENT_CACHE("Touch"), &drey__cache__v1__touch_request__descriptor, ARGS_KEY_TTL},
    {"persist", 1, 1, DREY_CLIENT_CACHE("Persist"), &drey__cache__v1__persist_request__descriptor, ARGS_KEY},
    {"ttl", 1, 1, DREY_CLIENT_CACHE("GetExpiration"), &drey__cache__v1__get_expiration_request__descriptor, ARGS_KEY},
};

static const op_kind remove_op = {"rm", 1, 1, DREY_CLIENT_CACHE("Remove"), &drey__cache__v1__remove_request__descriptor,
                                  ARGS_KEY};

static void *field(ProtobufCMessage *m, const char *name) {
    return drey_rpc_field(m, name, NULL);
}

/* Sets the string field name when m's type has it. */
static void set_string(ProtobufCMessage *m, const char *name, const char *v) {
    char **slot = field(m, name);
    if (slot != NULL)
        *slot = (char *)v;
}

static ProtobufCMessage *build(drey_cli *c, const op_kind *k, const drey_cli_op *op, char *err, size_t cap) {
    ProtobufCMessage *m = drey_arena_alloc(&c->arena, k->request->sizeof_message);
    protobuf_c_message_init(k->request, m);
    set_string(m, "cache", c->cache);
    if (k->args == ARGS_KEYS) {
        size_t n = (size_t)op->n_args;
        char **keys = drey_arena_alloc(&c->arena, (n > 0 ? n : 1) * sizeof *keys);
        for (size_t i = 0; i < n; i++)
            keys[i] = copy(c, op->args[i]);
        size_t *count;
        *(char ***)drey_rpc_field(m, "keys", &count) = keys;
        *count = n;
    } else {
        set_string(m, "key", copy(c, op->args[0]));
    }
    if (protobuf_c_message_descriptor_get_field_by_name(k->request, "request_id") != NULL)
        set_string(m, "request_id", drey_cli_request_id(c));
    if (k->args == ARGS_KEY_VALUE) {
        Drey__Cache__V1__Value *v = drey_cli_value(c, op->kind, op->args[1], err, cap);
        if (v == NULL)
            return NULL;
        *(Drey__Cache__V1__Value **)field(m, "value") = v;
    }
    if (k->args == ARGS_KEY_DELTA) {
        int64_t *delta = field(m, "delta");
        *delta = 1;
        if (op->n_args > 1 && !drey_cli_parse_int64(op->args[1], delta)) {
            snprintf(err, cap, "incr: DELTA \"%s\" is not an int64", op->args[1]);
            return NULL;
        }
    }
    if (k->args == ARGS_KEY_TTL) {
        int64_t ms;
        if (!drey_config_parse_duration_ms(op->args[1], &ms) || ms <= 0) {
            snprintf(err, cap, "TTL \"%s\" is not a positive duration (250ms, 5s, 2m, 1h)", op->args[1]);
            return NULL;
        }
        *(Google__Protobuf__Duration **)field(m, "ttl") = drey_cli_duration(c, ms);
    } else if (protobuf_c_message_descriptor_get_field_by_name(k->request, "ttl") != NULL) {
        Google__Protobuf__Duration *ttl;
        if (!drey_cli_ttl(c, op->ttl, &ttl, err, cap))
            return NULL;
        if (ttl != NULL)
            *(Google__Protobuf__Duration **)field(m, "ttl") = ttl;
    }
    if (protobuf_c_message_descriptor_get_field_by_name(k->request, "if_version") != NULL) {
        bool conditional;
        uint64_t version;
        if (!if_version(op, &conditional, &version, err, cap))
            return NULL;
        if (conditional)
            *(uint64_t *)field(m, "if_version") = version;
    }
    return m;
}

ProtobufCMessage *drey_cli_build_remove(drey_cli *c, const drey_cli_op *op, char *err, size_t cap) {
    return build(c, &remove_op, op, err, cap);
}

ProtobufCMessage *drey_cli_build(drey_cli *c, const char *name, const drey_cli_op *op, bool line, const char **method,
                                 char *err, size_t cap) {
    /* Options are checked whatever the operation makes of them. */
    Google__Protobuf__Duration *ttl;
    bool conditional;
    uint64_t version;
    if (!drey_cli_ttl(c, op->ttl, &ttl, err, cap) || !if_version(op, &conditional, &version, err, cap))
        return NULL;
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        /* A command's arguments were counted by its own table. */
        if (strcmp(ops[i].name, name) == 0 &&
            (!line || (op->n_args >= ops[i].min_args && op->n_args <= ops[i].max_args))) {
            if (method != NULL)
                *method = ops[i].method;
            return build(c, &ops[i], op, err, cap);
        }
    }
    snprintf(err, cap,
             "\"%s\" with %d argument(s) is not a pipeline operation (get, set, add, rm, del, mget, exists, incr, "
             "expire, persist, ttl)",
             name, op->n_args);
    return NULL;
}

drey_cli_op drey_cli_op_of_command(const drey_cli *c, char **args) {
    drey_cli_op op = {.args = args, .kind = DREY_CLI_VALUE_STRING};
    while (args[op.n_args] != NULL)
        op.n_args++;
    op.kind = drey_cli_opt(c, "int") != NULL    ? DREY_CLI_VALUE_INT
              : drey_cli_opt(c, "json") != NULL ? DREY_CLI_VALUE_JSON
              : drey_cli_opt(c, "file") != NULL ? DREY_CLI_VALUE_FILE
                                                : DREY_CLI_VALUE_STRING;
    op.ttl = drey_cli_opt(c, "ttl");
    op.if_version = drey_cli_opt(c, "if-version");
    return op;
}

drey_cli_op drey_cli_op_of_words(char **w, int n, char **args, size_t cap) {
    /* Per-line options: --ttl=D, --if-version=N, --int, --json. */
    drey_cli_op op = {.args = args, .kind = DREY_CLI_VALUE_STRING};
    for (int i = 1; i < n && (size_t)op.n_args + 1 < cap; i++) {
        if (strncmp(w[i], "--ttl=", 6) == 0)
            op.ttl = w[i] + 6;
        else if (strncmp(w[i], "--if-version=", 13) == 0)
            op.if_version = w[i] + 13;
        else if (strcmp(w[i], "--int") == 0)
            op.kind = DREY_CLI_VALUE_INT;
        else if (strcmp(w[i], "--json") == 0 && op.kind != DREY_CLI_VALUE_INT) /* --int wins */
            op.kind = DREY_CLI_VALUE_JSON;
        else
            args[op.n_args++] = w[i];
    }
    args[op.n_args] = NULL;
    return op;
}
