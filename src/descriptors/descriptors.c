/*
 * descriptors — index over a FileDescriptorSet; see include/drey/descriptors.h.
 *
 * The set is read twice: once at the wire level, to keep each file's exact
 * bytes (field 1 of FileDescriptorSet, length-delimited), and once through
 * protobuf-c, to index symbols. Lookups are binary searches over a sorted
 * symbol table built at load time.
 */
#include "drey/descriptors.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "drey/bytes.h"
#include "google/protobuf/descriptor.pb-c.h"

typedef struct symbol {
    char *name;
    size_t file;
} symbol;

typedef struct file_info {
    const uint8_t *data; /* inside the set */
    size_t len;
    size_t *deps;
    size_t n_deps;
} file_info;

struct drey_descriptors {
    Google__Protobuf__FileDescriptorSet *set;
    file_info *files;
    size_t n_files;
    symbol *symbols;
    size_t n_symbols, cap_symbols;
    char **services;
    size_t n_services;
};

static char *join(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *s = drey_xmalloc(la + lb + 2);
    if (la == 0) {
        memcpy(s, b, lb + 1);
        return s;
    }
    memcpy(s, a, la);
    s[la] = '.';
    memcpy(s + la + 1, b, lb + 1);
    return s;
}

static void add_symbol(drey_descriptors *d, char *name, size_t file) {
    if (d->n_symbols == d->cap_symbols) {
        d->cap_symbols = d->cap_symbols ? d->cap_symbols * 2 : 256;
        d->symbols = drey_xrealloc(d->symbols, d->cap_symbols, sizeof *d->symbols);
    }
    d->symbols[d->n_symbols].name = name;
    d->symbols[d->n_symbols].file = file;
    d->n_symbols++;
}

/* Names are optional on the wire and required here: each index_ function
 * returns false on a missing one (the caller then drops the whole index). */

static bool index_enum(drey_descriptors *d, const char *scope, const Google__Protobuf__EnumDescriptorProto *e,
                       size_t file) {
    if (e->name == NULL)
        return false;
    add_symbol(d, join(scope, e->name), file);
    /* Enum values live in the enum's enclosing scope, as in C++. */
    for (size_t i = 0; i < e->n_value; i++) {
        if (e->value[i]->name == NULL)
            return false;
        add_symbol(d, join(scope, e->value[i]->name), file);
    }
    return true;
}

static bool index_message(drey_descriptors *d, const char *scope, const Google__Protobuf__DescriptorProto *m,
                          size_t file) {
    if (m->name == NULL)
        return false;
    char *name = join(scope, m->name);
    add_symbol(d, name, file);
    for (size_t i = 0; i < m->n_field; i++) {
        if (m->field[i]->name == NULL)
            return false;
        add_symbol(d, join(name, m->field[i]->name), file);
    }
    for (size_t i = 0; i < m->n_nested_type; i++) {
        if (!index_message(d, name, m->nested_type[i], file))
            return false;
    }
    for (size_t i = 0; i < m->n_enum_type; i++) {
        if (!index_enum(d, name, m->enum_type[i], file))
            return false;
    }
    return true;
}

static bool index_service(drey_descriptors *d, const char *scope, const Google__Protobuf__ServiceDescriptorProto *sp,
                          size_t file) {
    if (sp->name == NULL)
        return false;
    char *sname = join(scope, sp->name);
    add_symbol(d, sname, file);
    d->services = drey_xrealloc(d->services, d->n_services + 1, sizeof *d->services);
    d->services[d->n_services++] = sname;
    for (size_t m = 0; m < sp->n_method; m++) {
        if (sp->method[m]->name == NULL)
            return false;
        add_symbol(d, join(sname, sp->method[m]->name), file);
    }
    return true;
}

/* The files of the set that f imports, by their index in it. */
static bool link_deps(drey_descriptors *d, size_t f) {
    const Google__Protobuf__FileDescriptorProto *fp = d->set->file[f];
    d->files[f].deps = drey_xcalloc(fp->n_dependency, sizeof(size_t));
    for (size_t i = 0; i < fp->n_dependency; i++) {
        long dep = -1;
        for (size_t g = 0; fp->dependency[i] != NULL && g < d->n_files; g++) {
            if (strcmp(d->set->file[g]->name, fp->dependency[i]) == 0)
                dep = (long)g;
        }
        if (dep < 0)
            return false; /* protoc --include_imports always includes them */
        d->files[f].deps[d->files[f].n_deps++] = (size_t)dep;
    }
    return true;
}

static int symbol_cmp(const void *a, const void *b) {
    return strcmp(((const symbol *)a)->name, ((const symbol *)b)->name);
}

drey_descriptors *drey_descriptors_load(const uint8_t *set, size_t len) {
    Google__Protobuf__FileDescriptorSet *fds = google__protobuf__file_descriptor_set__unpack(NULL, len, set);
    if (fds == NULL)
        return NULL;
    drey_descriptors *d = drey_xmalloc(sizeof *d);
    memset(d, 0, sizeof *d);
    d->set = fds;
    d->n_files = fds->n_file;
    d->files = drey_xcalloc(d->n_files, sizeof *d->files);
    memset(d->files, 0, d->n_files * sizeof *d->files);

    /* Wire-level pass: the exact bytes of each file, in order. */
    const uint8_t *p = set, *end = set + len;
    size_t n = 0;
    while (p < end) {
        uint64_t key, flen;
        if (!drey_bytes_varint(&p, end, &key) || key != ((1 << 3) | 2) || !drey_bytes_varint(&p, end, &flen) ||
            flen > (uint64_t)(end - p) || n >= d->n_files)
            goto fail;
        d->files[n].data = p;
        d->files[n].len = (size_t)flen;
        p += flen;
        n++;
    }
    if (n != d->n_files)
        goto fail;

    for (size_t f = 0; f < d->n_files; f++) {
        if (fds->file[f]->name == NULL)
            goto fail; /* names are optional on the wire, required here */
    }
    for (size_t f = 0; f < d->n_files; f++) {
        const Google__Protobuf__FileDescriptorProto *fp = fds->file[f];
        const char *pkg = fp->package != NULL ? fp->package : "";
        if (!link_deps(d, f))
            goto fail;
        for (size_t i = 0; i < fp->n_message_type; i++) {
            if (!index_message(d, pkg, fp->message_type[i], f))
                goto fail;
        }
        for (size_t i = 0; i < fp->n_enum_type; i++) {
            if (!index_enum(d, pkg, fp->enum_type[i], f))
                goto fail;
        }
        for (size_t i = 0; i < fp->n_service; i++) {
            if (!index_service(d, pkg, fp->service[i], f))
                goto fail;
        }
    }
    if (d->n_symbols > 0)
        qsort(d->symbols, d->n_symbols, sizeof *d->symbols, symbol_cmp);
    return d;
fail:
    drey_descriptors_free(d);
    return NULL;
}

static drey_descriptors *builtin;
static pthread_once_t builtin_once = PTHREAD_ONCE_INIT;

static void load_builtin(void) {
    builtin = drey_descriptors_load(drey_descriptor_set, drey_descriptor_set_len);
    if (builtin == NULL)
        abort(); /* the build embedded a broken set */
}

const drey_descriptors *drey_descriptors_builtin(void) {
    pthread_once(&builtin_once, load_builtin);
    return builtin;
}

void drey_descriptors_free(drey_descriptors *d) {
    if (d == NULL)
        return;
    for (size_t i = 0; i < d->n_symbols; i++)
        free(d->symbols[i].name); /* service names are among them */
    free(d->symbols);
    free(d->services);
    for (size_t i = 0; i < d->n_files; i++)
        free(d->files[i].deps);
    free(d->files);
    google__protobuf__file_descriptor_set__free_unpacked(d->set, NULL);
    free(d);
}

size_t drey_descriptors_file_count(const drey_descriptors *d) {
    return d->n_files;
}

const char *drey_descriptors_file_name(const drey_descriptors *d, size_t i) {
    return d->set->file[i]->name;
}

void drey_descriptors_file_bytes(const drey_descriptors *d, size_t i, const uint8_t **data, size_t *len) {
    *data = d->files[i].data;
    *len = d->files[i].len;
}

size_t drey_descriptors_file_deps(const drey_descriptors *d, size_t i, const size_t **deps) {
    *deps = d->files[i].deps;
    return d->files[i].n_deps;
}

long drey_descriptors_find_file(const drey_descriptors *d, const char *name) {
    for (size_t i = 0; i < d->n_files; i++) {
        if (strcmp(d->set->file[i]->name, name) == 0)
            return (long)i;
    }
    return -1;
}

long drey_descriptors_find_symbol(const drey_descriptors *d, const char *name) {
    if (d->n_symbols == 0)
        return -1;
    symbol key = {.name = (char *)name};
    const symbol *s = bsearch(&key, d->symbols, d->n_symbols, sizeof key, symbol_cmp);
    return s != NULL ? (long)s->file : -1;
}

size_t drey_descriptors_services(const drey_descriptors *d, const char *const **names) {
    *names = (const char *const *)d->services;
    return d->n_services;
}

bool drey_descriptors_method_kind(const drey_descriptors *d, const char *service, const char *method,
                                  bool *client_streaming, bool *server_streaming) {
    for (size_t f = 0; f < d->n_files; f++) {
        const Google__Protobuf__FileDescriptorProto *fp = d->set->file[f];
        const char *pkg = fp->package != NULL ? fp->package : "";
        size_t plen = strlen(pkg);
        for (size_t i = 0; i < fp->n_service; i++) {
            const Google__Protobuf__ServiceDescriptorProto *sp = fp->service[i];
            bool same = plen == 0 ? strcmp(service, sp->name) == 0
                                  : strncmp(service, pkg, plen) == 0 && service[plen] == '.' &&
                                        strcmp(service + plen + 1, sp->name) == 0;
            if (!same)
                continue;
            for (size_t m = 0; m < sp->n_method; m++) {
                if (strcmp(sp->method[m]->name, method) == 0) {
                    *client_streaming = sp->method[m]->client_streaming;
                    *server_streaming = sp->method[m]->server_streaming;
                    return true;
                }
            }
        }
    }
    return false;
}
