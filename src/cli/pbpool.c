/*
 * pbpool — the descriptor pool of pbdyn.h: FileDescriptorProtos as a
 * server's reflection (or drey's own build) gives them, their messages,
 * enums and services indexed by full name, and a resolver asked for what
 * the pool lacks.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "pbwire.h"

enum { SYM_MESSAGE, SYM_ENUM, SYM_SERVICE };

typedef struct sym {
    char *name; /* full, no leading dot */
    int kind;
    const void *desc;
    size_t file;
} sym;

struct drey_pb_pool {
    Google__Protobuf__FileDescriptorProto **files;
    size_t n_files, cap_files;
    sym *syms;
    size_t n_syms, cap_syms;
    drey_pb_resolver resolve;
    void *ctx;
};

drey_pb_pool *drey_pb_pool_new(drey_pb_resolver resolve, void *ctx) {
    drey_pb_pool *p = drey_xcalloc(1, sizeof *p);
    p->resolve = resolve;
    p->ctx = ctx;
    return p;
}

void drey_pb_pool_free(drey_pb_pool *p) {
    if (p == NULL)
        return;
    for (size_t i = 0; i < p->n_files; i++)
        google__protobuf__file_descriptor_proto__free_unpacked(p->files[i], NULL);
    for (size_t i = 0; i < p->n_syms; i++)
        free(p->syms[i].name);
    free(p->files);
    free(p->syms);
    free(p);
}

static void add_sym(drey_pb_pool *p, const char *scope, const char *name, int kind, const void *desc, size_t file) {
    if (p->n_syms == p->cap_syms) {
        p->cap_syms = p->cap_syms ? 2 * p->cap_syms : 64;
        p->syms = drey_xrealloc(p->syms, p->cap_syms, sizeof *p->syms);
    }
    size_t n = strlen(scope) + strlen(name) + 2;
    char *full = drey_xmalloc(n);
    snprintf(full, n, "%s%s%s", scope, scope[0] ? "." : "", name);
    p->syms[p->n_syms++] = (sym){.name = full, .kind = kind, .desc = desc, .file = file};
}

static void index_message(drey_pb_pool *p, const char *scope, const message_t *m, size_t file) {
    add_sym(p, scope, m->name, SYM_MESSAGE, m, file);
    const char *full = p->syms[p->n_syms - 1].name;
    char *mine = drey_xstrdup(full); /* syms may move */
    for (size_t i = 0; i < m->n_nested_type; i++)
        index_message(p, mine, m->nested_type[i], file);
    for (size_t i = 0; i < m->n_enum_type; i++)
        add_sym(p, mine, m->enum_type[i]->name, SYM_ENUM, m->enum_type[i], file);
    free(mine);
}

bool drey_pb_pool_has_file(const drey_pb_pool *p, const char *name) {
    for (size_t i = 0; i < p->n_files; i++)
        if (strcmp(p->files[i]->name, name) == 0)
            return true;
    return false;
}

const Google__Protobuf__FileDescriptorProto *drey_pb_pool_file_at(const drey_pb_pool *p, size_t i) {
    return i < p->n_files ? p->files[i] : NULL;
}

bool drey_pb_pool_add_file(drey_pb_pool *p, const uint8_t *data, size_t len) {
    Google__Protobuf__FileDescriptorProto *f = google__protobuf__file_descriptor_proto__unpack(NULL, len, data);
    if (f == NULL || f->name == NULL)
        return f == NULL ? false : (google__protobuf__file_descriptor_proto__free_unpacked(f, NULL), false);
    if (drey_pb_pool_has_file(p, f->name)) {
        google__protobuf__file_descriptor_proto__free_unpacked(f, NULL);
        return true;
    }
    if (p->n_files == p->cap_files) {
        p->cap_files = p->cap_files ? 2 * p->cap_files : 16;
        p->files = drey_xrealloc(p->files, p->cap_files, sizeof *p->files);
    }
    size_t fi = p->n_files;
    p->files[p->n_files++] = f;
    const char *pkg = f->package != NULL ? f->package : "";
    for (size_t i = 0; i < f->n_message_type; i++)
        index_message(p, pkg, f->message_type[i], fi);
    for (size_t i = 0; i < f->n_enum_type; i++)
        add_sym(p, pkg, f->enum_type[i]->name, SYM_ENUM, f->enum_type[i], fi);
    for (size_t i = 0; i < f->n_service; i++)
        add_sym(p, pkg, f->service[i]->name, SYM_SERVICE, f->service[i], fi);
    return true;
}

static const sym *find_sym(drey_pb_pool *p, const char *name, int kind) {
    if (name[0] == '.')
        name++;
    for (int attempt = 0; attempt < 2; attempt++) {
        for (size_t i = 0; i < p->n_syms; i++)
            if (p->syms[i].kind == kind && strcmp(p->syms[i].name, name) == 0)
                return &p->syms[i];
        if (attempt == 0 && (p->resolve == NULL || !p->resolve(p->ctx, p, name)))
            break;
    }
    return NULL;
}

const message_t *drey_pb_pool_message(drey_pb_pool *p, const char *name) {
    const sym *s = find_sym(p, name, SYM_MESSAGE);
    return s != NULL ? s->desc : NULL;
}

const Google__Protobuf__EnumDescriptorProto *drey_pb_pool_enum(drey_pb_pool *p, const char *name) {
    const sym *s = find_sym(p, name, SYM_ENUM);
    return s != NULL ? s->desc : NULL;
}

const Google__Protobuf__ServiceDescriptorProto *drey_pb_pool_service(drey_pb_pool *p, const char *name) {
    const sym *s = find_sym(p, name, SYM_SERVICE);
    return s != NULL ? s->desc : NULL;
}

const Google__Protobuf__FileDescriptorProto *drey_pb_pool_file_of(drey_pb_pool *p, const char *name) {
    for (int k = SYM_MESSAGE; k <= SYM_SERVICE; k++) {
        const char *n = name[0] == '.' ? name + 1 : name;
        for (size_t i = 0; i < p->n_syms; i++)
            if (p->syms[i].kind == k && strcmp(p->syms[i].name, n) == 0)
                return p->files[p->syms[i].file];
    }
    return NULL;
}

drey_pb_pool *drey_pb_pool_builtin(void) {
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
