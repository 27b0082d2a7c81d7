/*
 * call — any method of any service the node serves, through its server
 * reflection, as grpcurl does: call (request and answers in JSON, unary or
 * streaming), list (services, or a service's methods) and describe (a
 * service, message or enum, in .proto syntax).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "drey/alloc.h"
#include "pbdyn.h"
#include "refl.h"

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

int drey_cli_cmd_call(drey_cli *c, char **a) {
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
        char err[512];
        if (!drey_cli_read_whole("-", &c->arena, &in, err, sizeof err)) {
            fprintf(stderr, "drey: %s\n", err);
            return DREY_EXIT_USAGE;
        }
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
            drey_cli_interrupter it;
            drey_cli_interrupter_start(&it, s);
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
            drey_cli_interrupter_stop(&it);
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

int drey_cli_cmd_list(drey_cli *c, char **a) {
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

int drey_cli_cmd_describe(drey_cli *c, char **a) {
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
    FILE *out = drey_xopen_memstream(&text, &len);
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

