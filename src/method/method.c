/*
 * method — the method table; see include/drey/method.h.
 *
 * Lookups by path run once per replayed record and once per method at
 * start-up (the transport binds each method to a handle of its own), so a
 * linear scan over a few dozen methods is enough.
 */
#include "drey/alloc.h"
#include "drey/method.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/descriptors.h"
#include "drey/log.h"

struct drey_method_table {
    drey_method **methods;
    size_t n;
};

drey_method_table *drey_method_table_create(void) {
    drey_method_table *t = drey_xcalloc(1, sizeof *t);
    return t;
}

void drey_method_table_destroy(drey_method_table *t) {
    if (t == NULL)
        return;
    for (size_t i = 0; i < t->n; i++) {
        free((char *)t->methods[i]->path);
        free(t->methods[i]);
    }
    free(t->methods);
    free(t);
}

static const drey_method_spec *find_spec(const drey_method_spec *specs, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++) {
        if (strcmp(specs[i].name, name) == 0)
            return &specs[i];
    }
    return NULL;
}

/* Whether the service's method md is streaming (then it is the
 * transport's, not the table's); false with *ok false when the descriptor
 * set does not know it. */
static bool is_streaming(const ProtobufCServiceDescriptor *sd, const ProtobufCMethodDescriptor *md, bool *ok) {
    bool cs = false, ss = false;
    *ok = drey_descriptors_method_kind(drey_descriptors_builtin(), sd->name, md->name, &cs, &ss);
    if (!*ok)
        DREY_LOG_ERROR("method missing from the descriptor set", DREY_LOG_STR("service", sd->name),
                       DREY_LOG_STR("method", md->name));
    return cs || ss;
}

static bool spec_ok(const ProtobufCServiceDescriptor *sd, const ProtobufCMethodDescriptor *md,
                    const drey_method_spec *spec) {
    bool known;
    bool streaming = is_streaming(sd, md, &known);
    if (!known)
        return false;
    const char *why = NULL;
    if (streaming && spec != NULL)
        why = "streaming methods belong to the transport";
    else if (streaming)
        return true;
    else if (spec == NULL)
        why = "no spec for the method";
    else if ((spec->apply == NULL) == (spec->handle == NULL))
        why = "exactly one of apply and handle";
    else if ((spec->flags & DREY_METHOD_WRITE) != 0 && spec->apply == NULL)
        why = "a write needs apply";
    if (why != NULL) {
        DREY_LOG_ERROR("bad method spec", DREY_LOG_STR("service", sd->name), DREY_LOG_STR("method", md->name),
                       DREY_LOG_STR("why", why));
        return false;
    }
    return true;
}

bool drey_method_table_add_service(drey_method_table *t, const ProtobufCServiceDescriptor *sd,
                                   const drey_method_spec *specs, size_t n_specs, void *ctx) {
    for (size_t i = 0; i < n_specs; i++) {
        if (protobuf_c_service_descriptor_get_method_by_name(sd, specs[i].name) == NULL) {
            DREY_LOG_ERROR("spec for a method the service does not have", DREY_LOG_STR("service", sd->name),
                           DREY_LOG_STR("method", specs[i].name));
            return false;
        }
    }
    for (unsigned m = 0; m < sd->n_methods; m++) {
        if (!spec_ok(sd, &sd->methods[m], find_spec(specs, n_specs, sd->methods[m].name)))
            return false;
    }
    t->methods = drey_xrealloc(t->methods, t->n + sd->n_methods, sizeof *t->methods);
    for (unsigned m = 0; m < sd->n_methods; m++) {
        const ProtobufCMethodDescriptor *md = &sd->methods[m];
        const drey_method_spec *spec = find_spec(specs, n_specs, md->name);
        if (spec == NULL)
            continue; /* streaming: checked above */
        drey_method *dm = drey_xcalloc(1, sizeof *dm);
        size_t plen = strlen(sd->name) + strlen(md->name) + 3;
        char *path = drey_xmalloc(plen);
        snprintf(path, plen, "/%s/%s", sd->name, md->name);
        *dm = (drey_method){
            .path = path,
            .desc = md,
            .flags = spec->flags,
            .route = spec->route,
            .apply = spec->apply,
            .growth = spec->growth,
            .tenant_growth = spec->tenant_growth,
            .versions_brought = spec->versions_brought,
            .handle = spec->handle,
            .ctx = ctx,
        };
        t->methods[t->n++] = dm;
    }
    return true;
}

const drey_method *drey_method_find(const drey_method_table *t, const char *path) {
    for (size_t i = 0; i < t->n; i++) {
        if (strcmp(t->methods[i]->path, path) == 0)
            return t->methods[i];
    }
    return NULL;
}

size_t drey_method_count(const drey_method_table *t) {
    return t->n;
}

const drey_method *drey_method_at(const drey_method_table *t, size_t i) {
    return t->methods[i];
}

/* --- what a request names ---------------------------------------------------- */

static const void *member(const ProtobufCMessage *m, const char *name, const ProtobufCFieldDescriptor **fd) {
    *fd = protobuf_c_message_descriptor_get_field_by_name(m->descriptor, name);
    return *fd != NULL ? (const char *)m + (*fd)->offset : NULL;
}

static size_t repeated_count(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *fd) {
    return *(const size_t *)(const void *)((const char *)m + fd->quantifier_offset);
}

const char *drey_method_request_cache(const ProtobufCMessage *m) {
    const ProtobufCFieldDescriptor *fd;
    const void *p = member(m, "cache", &fd);
    if (p == NULL || fd->type != PROTOBUF_C_TYPE_STRING || fd->label == PROTOBUF_C_LABEL_REPEATED)
        return NULL;
    return *(char *const *)p;
}

uint32_t drey_method_request_partition(const ProtobufCMessage *m) {
    const ProtobufCFieldDescriptor *fd;
    const void *p = member(m, "partition", &fd);
    if (p == NULL || fd->type != PROTOBUF_C_TYPE_UINT32 || fd->label == PROTOBUF_C_LABEL_REPEATED)
        return UINT32_MAX;
    return *(const uint32_t *)p;
}

bool drey_method_request_allows_stale(const ProtobufCMessage *m) {
    const ProtobufCFieldDescriptor *fd;
    const void *p = member(m, "allow_stale", &fd);
    return p != NULL && fd->type == PROTOBUF_C_TYPE_BOOL && fd->label != PROTOBUF_C_LABEL_REPEATED &&
           *(const protobuf_c_boolean *)p;
}

size_t drey_method_request_key_count(const ProtobufCMessage *m) {
    const ProtobufCFieldDescriptor *fd;
    if (member(m, "key", &fd) != NULL && fd->type == PROTOBUF_C_TYPE_STRING && fd->label != PROTOBUF_C_LABEL_REPEATED)
        return 1;
    if (member(m, "keys", &fd) != NULL && fd->type == PROTOBUF_C_TYPE_STRING)
        return repeated_count(m, fd);
    if (member(m, "entries", &fd) != NULL && fd->type == PROTOBUF_C_TYPE_MESSAGE &&
        fd->label == PROTOBUF_C_LABEL_REPEATED)
        return repeated_count(m, fd);
    return 0;
}

const char *drey_method_request_key(const ProtobufCMessage *m, size_t i) {
    const ProtobufCFieldDescriptor *fd;
    const void *p = member(m, "key", &fd);
    if (p != NULL && fd->type == PROTOBUF_C_TYPE_STRING && fd->label != PROTOBUF_C_LABEL_REPEATED)
        return i == 0 ? *(char *const *)p : NULL;
    if ((p = member(m, "keys", &fd)) != NULL && fd->type == PROTOBUF_C_TYPE_STRING)
        return i < repeated_count(m, fd) ? (*(char *const *const *)p)[i] : NULL;
    if ((p = member(m, "entries", &fd)) != NULL && fd->type == PROTOBUF_C_TYPE_MESSAGE &&
        fd->label == PROTOBUF_C_LABEL_REPEATED && i < repeated_count(m, fd)) {
        const ProtobufCMessage *e = (*(ProtobufCMessage *const *const *)p)[i];
        const void *k = member(e, "key", &fd);
        return k != NULL && fd->type == PROTOBUF_C_TYPE_STRING ? *(char *const *)k : NULL;
    }
    return NULL;
}

/* --- scatter and gather (DREY_ROUTE_KEYS) ------------------------------------------- */

static void *repeated_slot(const ProtobufCMessage *m, const char *name, ProtobufCType type,
                           const ProtobufCFieldDescriptor **fd) {
    void *p = (void *)member(m, name, fd);
    return p != NULL && (*fd)->type == type && (*fd)->label == PROTOBUF_C_LABEL_REPEATED ? p : NULL;
}

ProtobufCMessage *drey_method_request_with_keys(drey_arena *a, const ProtobufCMessage *m, const size_t *index,
                                                size_t n) {
    const ProtobufCFieldDescriptor *fd;
    char *const *keys = NULL;
    char ***slot = repeated_slot(m, "keys", PROTOBUF_C_TYPE_STRING, &fd);
    if (slot == NULL)
        return NULL;
    keys = *slot;
    ProtobufCMessage *sub = drey_arena_alloc(a, m->descriptor->sizeof_message);
    memcpy(sub, m, m->descriptor->sizeof_message);
    char **picked = drey_arena_alloc(a, (n ? n : 1) * sizeof *picked);
    for (size_t i = 0; i < n; i++)
        picked[i] = keys[index[i]];
    *(char ***)((char *)sub + fd->offset) = picked;
    *(size_t *)(void *)((char *)sub + fd->quantifier_offset) = n;
    return sub;
}

size_t drey_method_response_results(const ProtobufCMessage *resp, ProtobufCMessage ***out) {
    const ProtobufCFieldDescriptor *fd;
    ProtobufCMessage ***slot = repeated_slot(resp, "results", PROTOBUF_C_TYPE_MESSAGE, &fd);
    if (slot == NULL)
        return 0;
    *out = *slot;
    return repeated_count(resp, fd);
}

ProtobufCMessage *drey_method_response_gathered(drey_arena *a, const ProtobufCMessageDescriptor *d,
                                                ProtobufCMessage **results, size_t n) {
    ProtobufCMessage *resp = drey_arena_alloc(a, d->sizeof_message);
    protobuf_c_message_init(d, resp);
    const ProtobufCFieldDescriptor *fd;
    ProtobufCMessage ***slot = repeated_slot(resp, "results", PROTOBUF_C_TYPE_MESSAGE, &fd);
    if (slot != NULL) {
        *slot = results;
        *(size_t *)(void *)((char *)resp + fd->quantifier_offset) = n;
    }
    return resp;
}

bool drey_method_response_stale(const ProtobufCMessage *resp, uint64_t *lag_ms) {
    const ProtobufCFieldDescriptor *fd, *lf;
    const protobuf_c_boolean *from = member(resp, "from_backup", &fd);
    const uint64_t *lag = member(resp, "lag_ms", &lf);
    if (from == NULL || fd->type != PROTOBUF_C_TYPE_BOOL || !*from)
        return false;
    *lag_ms = lag != NULL && lf->type == PROTOBUF_C_TYPE_UINT64 ? *lag : 0;
    return true;
}

void drey_method_response_mark_stale(ProtobufCMessage *resp, uint64_t lag_ms) {
    const ProtobufCFieldDescriptor *fd, *lf;
    protobuf_c_boolean *from = (void *)member(resp, "from_backup", &fd);
    uint64_t *lag = (void *)member(resp, "lag_ms", &lf);
    if (from != NULL && fd->type == PROTOBUF_C_TYPE_BOOL)
        *from = true;
    if (lag != NULL && lf->type == PROTOBUF_C_TYPE_UINT64 && lag_ms > *lag)
        *lag = lag_ms;
}

uint64_t drey_apply_version(drey_apply *ax, drey_store *s) {
    if (ax->next_version == 0)
        return drey_store_next_version(s);
    if (ax->n_versions == 0) {
        /* The next number belongs to the write ordered after this one. */
        DREY_LOG_ERROR("a write took more versions than it reserved", DREY_LOG_UINT("next", ax->next_version));
        abort();
    }
    uint64_t v = ax->next_version++;
    ax->n_versions--;
    drey_store_raise_version(s, v);
    return v;
}

size_t drey_apply_versions_needed(const drey_method *m, const ProtobufCMessage *request) {
    return (m->flags & DREY_METHOD_VERSIONED) != 0 ? drey_method_request_key_count(request) : 0;
}
