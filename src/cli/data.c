/*
 * data — drey's data commands: get, mget, exists, set, mset, add, rm, del,
 * incr, expire/touch, persist, ttl, scan, clear and stats. Each builds its
 * request (request.c), calls the node through the endpoints (conn.c) and
 * prints its rows in the -o format (out.h); a negative answer (not found,
 * not added, none removed, not all exist) exits 3.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "drey/admin/v1/admin.pb-c.h"
#include "drey/alloc.h"
#include "drey/cache/v1/cache.pb-c.h"
#include "json.h"
#include "pbdyn.h"

static const char *const kind_names[] = {"none", "bytes", "string", "int64", "double", "bool", "json", "null"};

void drey_cli_put_value(const drey_cli *c, json_t *row, const Drey__Cache__V1__Value *v) {
    json_t *x;
    const char *kind = "none";
    switch (v != NULL ? v->kind_case : DREY__CACHE__V1__VALUE__KIND__NOT_SET) {
    case DREY__CACHE__V1__VALUE__KIND_BYTES_VALUE:
        if (c->format != DREY_OUT_JSON) {
            x = json_stringn_nocheck((const char *)v->bytes_value.data, v->bytes_value.len);
        } else {
            char *s = drey_pb_base64(v->bytes_value.data, v->bytes_value.len);
            x = json_string(s);
            free(s);
        }
        break;
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

/* Builds the command's request from its line (request.c's table) and calls
 * it; false with *rc set when the line is wrong or the call failed. */
static bool run(drey_cli *c, const char *name, char **a, const ProtobufCMessageDescriptor *type, void *resp,
                int *rc) {
    drey_cli_op op = drey_cli_op_of_command(c, a);
    const char *method;
    char err[512];
    ProtobufCMessage *req = drey_cli_build(c, name, &op, false, &method, err, sizeof err);
    if (req == NULL) {
        fprintf(stderr, "drey: %s\n", err);
        *rc = DREY_EXIT_USAGE;
        return false;
    }
    return drey_cli_call_ok(c, method, req, type, resp, rc);
}

static json_t *row_key(const char *key) {
    return json_pack("{ss}", "key", key);
}

static void row_version(json_t *row, uint64_t version, const Google__Protobuf__Timestamp *expires_at) {
    json_object_set_new(row, "version", json_integer((json_int_t)version));
    json_object_set_new(row, "expiresAt", drey_cli_timestamp(expires_at));
}

/* The key's row with "found" (or another flag) set; false when it is
 * false (the caller answers with drey_cli_negative). */
static bool flagged_row(json_t **row, const char *key, const char *flag, bool value) {
    *row = row_key(key);
    json_object_set_new(*row, flag, json_boolean(value));
    return value;
}

static const char *const COLS_VERSION[] = {"version", "expiresAt", NULL};
static const char *const COLS_VERSION_ONLY[] = {"version", NULL};

int drey_cli_cmd_get(drey_cli *c, char **a) {
    Drey__Cache__V1__GetResponse *r;
    int rc;
    if (!run(c, "get", a, &drey__cache__v1__get_response__descriptor, &r, &rc))
        return rc;
    json_t *row;
    if (!flagged_row(&row, a[0], "found", r->found))
        return drey_cli_negative(c, "not found", row);
    drey_cli_put_value(c, row, r->value);
    row_version(row, r->version, r->expires_at);
    static const char *const cols[] = {"value", NULL};
    static const char *const tcols[] = {"key", "kind", "value", "version", "expiresAt", NULL};
    return drey_cli_print_one(c, c->format == DREY_OUT_TABLE ? tcols : cols, row);
}

/* mget and exists: GetMany, one row per key in the order given. */
static int get_many(drey_cli *c, char **a, const char *name, bool values_too) {
    Drey__Cache__V1__GetManyResponse *r;
    int rc;
    if (!run(c, name, a, &drey__cache__v1__get_many_response__descriptor, &r, &rc))
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
        json_t *row;
        all &= flagged_row(&row, x->key, values_too ? "found" : "exists", x->found);
        if (values_too && x->found) {
            drey_cli_put_value(c, row, x->value);
            row_version(row, x->version, x->expires_at);
        }
        drey_out_row(&o, row);
    }
    drey_out_flush(&o);
    return values_too || all ? DREY_EXIT_OK : DREY_EXIT_NEGATIVE;
}

int drey_cli_cmd_mget(drey_cli *c, char **a) {
    return get_many(c, a, "mget", true);
}

int drey_cli_cmd_exists(drey_cli *c, char **a) {
    return get_many(c, a, "exists", false);
}

int drey_cli_cmd_set(drey_cli *c, char **a) {
    Drey__Cache__V1__SetResponse *r;
    int rc;
    if (!run(c, "set", a, &drey__cache__v1__set_response__descriptor, &r, &rc))
        return rc;
    json_t *row = row_key(a[0]);
    row_version(row, r->version, r->expires_at);
    return drey_cli_print_one(c, COLS_VERSION, row);
}

int drey_cli_cmd_mset(drey_cli *c, char **a) {
    drey_cli_op op = drey_cli_op_of_command(c, a);
    if (op.n_args % 2 != 0) {
        fprintf(stderr, "usage: drey mset KEY VALUE [KEY VALUE ...]\n");
        return DREY_EXIT_USAGE;
    }
    Drey__Cache__V1__SetManyRequest req = DREY__CACHE__V1__SET_MANY_REQUEST__INIT;
    req.cache = (char *)c->cache;
    req.request_id = drey_cli_request_id(c);
    req.n_entries = (size_t)op.n_args / 2;
    req.entries = drey_arena_alloc(&c->arena, req.n_entries * sizeof *req.entries);
    Google__Protobuf__Duration *ttl;
    char err[512];
    if (!drey_cli_ttl(c, op.ttl, &ttl, err, sizeof err)) {
        fprintf(stderr, "drey: %s\n", err);
        return DREY_EXIT_USAGE;
    }
    for (size_t i = 0; i < req.n_entries; i++) {
        Drey__Cache__V1__SetManyRequest__Entry *e = drey_arena_alloc(&c->arena, sizeof *e);
        drey__cache__v1__set_many_request__entry__init(e);
        e->key = a[2 * i];
        if ((e->value = drey_cli_value(c, op.kind, a[2 * i + 1], err, sizeof err)) == NULL) {
            fprintf(stderr, "drey: %s\n", err);
            return DREY_EXIT_USAGE;
        }
        if (ttl != NULL) {
            e->expiration_case = DREY__CACHE__V1__SET_MANY_REQUEST__ENTRY__EXPIRATION_TTL;
            e->ttl = ttl;
        }
        req.entries[i] = e;
    }
    Drey__Cache__V1__SetManyResponse *r;
    int rc;
    if (!drey_cli_call_ok(c, DREY_CLIENT_CACHE("SetMany"), &req.base, &drey__cache__v1__set_many_response__descriptor,
                          &r, &rc))
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

int drey_cli_cmd_add(drey_cli *c, char **a) {
    Drey__Cache__V1__AddResponse *r;
    int rc;
    if (!run(c, "add", a, &drey__cache__v1__add_response__descriptor, &r, &rc))
        return rc;
    json_t *row;
    if (!flagged_row(&row, a[0], "added", r->added)) {
        json_object_set_new(row, "version", json_integer((json_int_t)r->version));
        char what[64];
        snprintf(what, sizeof what, "exists version=%" PRIu64, r->version);
        return drey_cli_negative(c, what, row);
    }
    row_version(row, r->version, r->expires_at);
    return drey_cli_print_one(c, COLS_VERSION, row);
}

int drey_cli_cmd_rm(drey_cli *c, char **a) {
    drey_cli_op op = drey_cli_op_of_command(c, a);
    char err[512];
    ProtobufCMessage *req = drey_cli_build_remove(c, &op, err, sizeof err);
    if (req == NULL) {
        fprintf(stderr, "drey: %s\n", err);
        return DREY_EXIT_USAGE;
    }
    Drey__Cache__V1__RemoveResponse *r;
    int rc;
    if (!drey_cli_call_ok(c, DREY_CLIENT_CACHE("Remove"), req, &drey__cache__v1__remove_response__descriptor, &r,
                          &rc))
        return rc;
    json_t *row;
    if (!flagged_row(&row, a[0], "removed", r->removed))
        return drey_cli_negative(c, "not found", row);
    json_object_set_new(row, "version", json_integer((json_int_t)r->version));
    return drey_cli_print_one(c, COLS_VERSION_ONLY, row);
}

int drey_cli_cmd_del(drey_cli *c, char **a) {
    Drey__Cache__V1__RemoveManyResponse *r;
    int rc;
    if (!run(c, "del", a, &drey__cache__v1__remove_many_response__descriptor, &r, &rc))
        return rc;
    static const char *const cols[] = {"key", "removed", NULL};
    static const char *const tcols[] = {"key", "removed", "version", NULL};
    drey_out o;
    drey_out_begin(&o, c->format, stdout, c->format == DREY_OUT_TABLE ? tcols : cols);
    size_t removed = 0;
    for (size_t i = 0; i < r->n_results; i++) {
        json_t *row;
        if (flagged_row(&row, r->results[i]->key, "removed", r->results[i]->removed)) {
            json_object_set_new(row, "version", json_integer((json_int_t)r->results[i]->version));
            removed++;
        }
        drey_out_row(&o, row);
    }
    drey_out_flush(&o);
    return removed > 0 ? DREY_EXIT_OK : DREY_EXIT_NEGATIVE;
}

int drey_cli_cmd_incr(drey_cli *c, char **a) {
    Drey__Cache__V1__IncrementResponse *r;
    int rc;
    if (!run(c, "incr", a, &drey__cache__v1__increment_response__descriptor, &r, &rc))
        return rc;
    json_t *row = row_key(a[0]);
    json_object_set_new(row, "value", json_integer(r->value));
    json_object_set_new(row, "version", json_integer((json_int_t)r->version));
    static const char *const cols[] = {"value", NULL};
    return drey_cli_print_one(c, cols, row);
}

int drey_cli_cmd_expire(drey_cli *c, char **a) {
    Drey__Cache__V1__TouchResponse *r;
    int rc;
    if (!run(c, "expire", a, &drey__cache__v1__touch_response__descriptor, &r, &rc))
        return rc;
    json_t *row;
    if (!flagged_row(&row, a[0], "found", r->found))
        return drey_cli_negative(c, "not found", row);
    row_version(row, r->version, r->expires_at);
    return drey_cli_print_one(c, COLS_VERSION, row);
}

int drey_cli_cmd_persist(drey_cli *c, char **a) {
    Drey__Cache__V1__PersistResponse *r;
    int rc;
    if (!run(c, "persist", a, &drey__cache__v1__persist_response__descriptor, &r, &rc))
        return rc;
    json_t *row;
    if (!flagged_row(&row, a[0], "found", r->found))
        return drey_cli_negative(c, "not found or without expiry", row);
    json_object_set_new(row, "version", json_integer((json_int_t)r->version));
    return drey_cli_print_one(c, COLS_VERSION_ONLY, row);
}

int drey_cli_cmd_ttl(drey_cli *c, char **a) {
    Drey__Cache__V1__GetExpirationResponse *r;
    int rc;
    if (!run(c, "ttl", a, &drey__cache__v1__get_expiration_response__descriptor, &r, &rc))
        return rc;
    json_t *row;
    if (!flagged_row(&row, a[0], "found", r->found))
        return drey_cli_negative(c, "not found", row);
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
    return drey_cli_print_one(c, cols, row);
}

int drey_cli_cmd_scan(drey_cli *c, char **a) {
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
        if (!drey_cli_call_ok(c, DREY_CLIENT_CACHE("Scan"), &req.base, &drey__cache__v1__scan_response__descriptor,
                              &r, &rc))
            break;
        for (size_t i = 0; i < r->n_items; i++) {
            const Drey__Cache__V1__ScanResponse__Item *it = r->items[i];
            json_t *row = row_key(it->key);
            row_version(row, it->version, it->expires_at);
            if (req.include_values)
                drey_cli_put_value(c, row, it->value);
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

int drey_cli_cmd_clear(drey_cli *c, char **a) {
    (void)a;
    Drey__Cache__V1__ClearRequest req = DREY__CACHE__V1__CLEAR_REQUEST__INIT;
    req.cache = (char *)c->cache;
    req.request_id = drey_cli_request_id(c);
    Drey__Cache__V1__ClearResponse *r;
    int rc;
    if (!drey_cli_call_ok(c, DREY_CLIENT_CACHE("Clear"), &req.base, &drey__cache__v1__clear_response__descriptor, &r,
                          &rc))
        return rc;
    static const char *const cols[] = {"cache", "cleared", NULL};
    return drey_cli_print_one(c, cols,
                              json_pack("{sssb}", "cache", c->cache[0] ? c->cache : "default", "cleared", 1));
}

/* A cluster counts each partition once, on its primary, however many
 * copies it has. */
static json_t *stats_row(const Drey__Cache__V1__CacheStats *s) {
    json_t *row = json_pack("{ss}", "cache", s->cache[0] ? s->cache : "default");
    json_object_set_new(row, "entries", json_integer((json_int_t)s->entries));
    json_object_set_new(row, "bytes", json_integer((json_int_t)s->bytes));
    json_object_set_new(row, "expiring", json_integer((json_int_t)s->expiring));
    json_object_set_new(row, "evictions", json_integer((json_int_t)s->evictions));
    json_object_set_new(row, "evictedBytes", json_integer((json_int_t)s->evicted_bytes));
    return row;
}

int drey_cli_cmd_stats(drey_cli *c, char **a) {
    (void)a;
    static const char *const cols[] = {"cache", "entries", "bytes", "expiring", "evictions", "evictedBytes", NULL};
    drey_out o;
    drey_out_begin(&o, c->format, stdout, cols);
    int rc;
    if (c->cache[0] != '\0') {
        Drey__Cache__V1__GetCacheStatsRequest req = DREY__CACHE__V1__GET_CACHE_STATS_REQUEST__INIT;
        req.cache = (char *)c->cache;
        Drey__Cache__V1__CacheStats *r;
        if (!drey_cli_call_ok(c, DREY_CLIENT_CACHE("GetCacheStats"), &req.base,
                              &drey__cache__v1__cache_stats__descriptor, &r, &rc))
            return rc;
        drey_out_row(&o, stats_row(r));
    } else {
        Drey__Cache__V1__ListCachesRequest req = DREY__CACHE__V1__LIST_CACHES_REQUEST__INIT;
        Drey__Cache__V1__ListCachesResponse *r;
        if (!drey_cli_call_ok(c, DREY_CLIENT_CACHE("ListCaches"), &req.base,
                              &drey__cache__v1__list_caches_response__descriptor, &r, &rc))
            return rc;
        for (size_t i = 0; i < r->n_caches; i++)
            drey_out_row(&o, stats_row(r->caches[i]));
    }
    drey_out_flush(&o);
    return DREY_EXIT_OK;
}
