/*
 * Unit tests for src/descriptors/descriptors.c: the index over the built-in
 * FileDescriptorSet (what reflection serves and where the server learns
 * which methods stream), and load() on sets that are not well-formed.
 */
#include <criterion/criterion.h>
#include <criterion/new/assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "drey/descriptors.h"
#include "google/protobuf/descriptor.pb-c.h"

static const drey_descriptors *builtin(void) {
    const drey_descriptors *d = drey_descriptors_builtin();
    cr_assert_not_null(d, "the built-in set does not load");
    return d;
}

static long file_of(const char *name) {
    long i = drey_descriptors_find_file(builtin(), name);
    cr_assert(ge(long, i, 0), "no file %s", name);
    return i;
}

/* --- the built-in set ----------------------------------------------------- */

Test(descriptors, builtin_loads_once) {
    const drey_descriptors *d = builtin();
    cr_assert(eq(ptr, (void *)d, (void *)drey_descriptors_builtin()), "parsed once, then shared");
    cr_assert(ge(sz, drey_descriptors_file_count(d), 7));
}

Test(descriptors, services_include_cache_health_and_both_reflections) {
    const char *const *names;
    size_t n = drey_descriptors_services(builtin(), &names);
    static const char *const want[] = {
        "drey.cache.v1.Cache",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
    };
    for (size_t w = 0; w < sizeof want / sizeof want[0]; w++) {
        size_t hits = 0;
        for (size_t i = 0; i < n; i++)
            hits += strcmp(names[i], want[w]) == 0;
        cr_assert(eq(sz, hits, 1), "%s listed %zu times", want[w], hits);
    }
    for (size_t i = 0; i < n; i++) {
        cr_assert(ge(long, drey_descriptors_find_symbol(builtin(), names[i]), 0), "%s is not a symbol", names[i]);
        cr_assert(ne(chr, names[i][0], '.'), "no leading dot: %s", names[i]);
    }
}

/* Every kind of symbol resolves to the file that defines it. */
Test(descriptors, find_symbol_resolves_to_the_defining_file) {
    static const struct {
        const char *symbol, *file;
    } rows[] = {
        /* services and methods */
        {"drey.cache.v1.Cache", "drey/cache/v1/cache.proto"},
        {"drey.cache.v1.Cache.Get", "drey/cache/v1/cache.proto"},
        {"drey.cache.v1.Cache.Increment", "drey/cache/v1/cache.proto"},
        {"grpc.health.v1.Health", "grpc/health/v1/health.proto"},
        {"grpc.health.v1.Health.Watch", "grpc/health/v1/health.proto"},
        {"grpc.reflection.v1.ServerReflection.ServerReflectionInfo", "grpc/reflection/v1/reflection.proto"},
        {"grpc.reflection.v1alpha.ServerReflection", "grpc/reflection/v1alpha/reflection.proto"},
        /* messages, nested messages (including map entries) */
        {"drey.cache.v1.Value", "drey/cache/v1/cache.proto"},
        {"drey.cache.v1.GetRequest", "drey/cache/v1/cache.proto"},
        {"drey.cache.v1.GetManyResponse.Result", "drey/cache/v1/cache.proto"},
        {"drey.cache.v1.SetManyRequest.Entry", "drey/cache/v1/cache.proto"},
        {"google.protobuf.Struct", "google/protobuf/struct.proto"},
        {"google.protobuf.Struct.FieldsEntry", "google/protobuf/struct.proto"},
        {"google.protobuf.Duration", "google/protobuf/duration.proto"},
        {"google.protobuf.Timestamp", "google/protobuf/timestamp.proto"},
        /* enums and enum values (values live in the enum's enclosing scope) */
        {"google.protobuf.NullValue", "google/protobuf/struct.proto"},
        {"google.protobuf.NULL_VALUE", "google/protobuf/struct.proto"},
        {"grpc.health.v1.HealthCheckResponse.ServingStatus", "grpc/health/v1/health.proto"},
        {"grpc.health.v1.HealthCheckResponse.SERVING", "grpc/health/v1/health.proto"},
        {"grpc.health.v1.HealthCheckResponse.SERVICE_UNKNOWN", "grpc/health/v1/health.proto"},
        /* fields, including nested messages' and oneof members */
        {"drey.cache.v1.GetRequest.key", "drey/cache/v1/cache.proto"},
        {"drey.cache.v1.Value.json_value", "drey/cache/v1/cache.proto"},
        {"drey.cache.v1.SetManyRequest.Entry.if_version", "drey/cache/v1/cache.proto"},
        {"google.protobuf.Duration.nanos", "google/protobuf/duration.proto"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        long f = drey_descriptors_find_symbol(builtin(), rows[i].symbol);
        cr_assert(ge(long, f, 0), "%s not found", rows[i].symbol);
        cr_assert(eq(str, (char *)drey_descriptors_file_name(builtin(), (size_t)f), (char *)rows[i].file), "%s",
                  rows[i].symbol);
    }
}

Test(descriptors, unknown_symbols) {
    static const char *const missing[] = {
        "",
        "drey.cache.v1.Nope",
        "drey.cache.v1.Cache.Nope",
        ".drey.cache.v1.Cache", /* fully qualified without a leading dot */
        "drey.cache.v1.cache",  /* case matters */
        "Cache",
        "drey.cache.v1.Cache.",
        "drey.cache.v1.Cache.Get.x",
        "google.protobuf.NullValue.NULL_VALUE", /* values are not inside their enum */
    };
    for (size_t i = 0; i < sizeof missing / sizeof missing[0]; i++)
        cr_assert(eq(long, drey_descriptors_find_symbol(builtin(), missing[i]), -1), "\"%s\" found", missing[i]);
}

Test(descriptors, find_file) {
    const drey_descriptors *d = builtin();
    for (size_t i = 0; i < drey_descriptors_file_count(d); i++)
        cr_assert(eq(long, drey_descriptors_find_file(d, drey_descriptors_file_name(d, i)), (long)i));
    cr_assert(eq(long, drey_descriptors_find_file(d, "drey/cache/v1/nope.proto"), -1));
    cr_assert(eq(long, drey_descriptors_find_file(d, "cache.proto"), -1));
    cr_assert(eq(long, drey_descriptors_find_file(d, ""), -1));
}

/* A file's dependencies are the files it imports, by index, in order. */
Test(descriptors, deps_of_cache_proto) {
    const drey_descriptors *d = builtin();
    const size_t *deps;
    size_t n = drey_descriptors_file_deps(d, (size_t)file_of("drey/cache/v1/cache.proto"), &deps);
    cr_assert(eq(sz, n, 4));
    cr_assert(eq(str, (char *)drey_descriptors_file_name(d, deps[0]), "google/protobuf/duration.proto"));
    cr_assert(eq(str, (char *)drey_descriptors_file_name(d, deps[1]), "google/protobuf/struct.proto"));
    cr_assert(eq(str, (char *)drey_descriptors_file_name(d, deps[2]), "google/protobuf/timestamp.proto"));
    cr_assert(eq(str, (char *)drey_descriptors_file_name(d, deps[3]), "google/rpc/status.proto"));

    n = drey_descriptors_file_deps(d, (size_t)file_of("google/protobuf/duration.proto"), &deps);
    cr_assert(eq(sz, n, 0));
    n = drey_descriptors_file_deps(d, (size_t)file_of("grpc/health/v1/health.proto"), &deps);
    cr_assert(eq(sz, n, 0));
}

/* file_bytes are each file exactly as compiled: they parse to a
 * FileDescriptorProto of the same name, and re-framed as field 1 they
 * rebuild the embedded set byte for byte. */
Test(descriptors, file_bytes_are_exact) {
    const drey_descriptors *d = builtin();
    uint8_t *rebuilt = malloc(drey_descriptor_set_len + 16);
    size_t len = 0;
    for (size_t i = 0; i < drey_descriptors_file_count(d); i++) {
        const uint8_t *data;
        size_t n;
        drey_descriptors_file_bytes(d, i, &data, &n);
        Google__Protobuf__FileDescriptorProto *fp = google__protobuf__file_descriptor_proto__unpack(NULL, n, data);
        cr_assert_not_null(fp);
        cr_assert(eq(str, fp->name, (char *)drey_descriptors_file_name(d, i)));
        google__protobuf__file_descriptor_proto__free_unpacked(fp, NULL);

        cr_assert(le(sz, len + 1 + 5 + n, drey_descriptor_set_len + 16));
        rebuilt[len++] = 0x0a;
        for (size_t v = n; ; v >>= 7) {
            rebuilt[len++] = (uint8_t)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
            if (v < 0x80)
                break;
        }
        memcpy(rebuilt + len, data, n);
        len += n;
    }
    cr_assert(eq(sz, len, drey_descriptor_set_len));
    cr_assert(eq(int, memcmp(rebuilt, drey_descriptor_set, len), 0));
    free(rebuilt);
}

/* --- streaming kinds ------------------------------------------------------ */

typedef struct kind_row {
    const char *service, *method;
    bool client_streaming, server_streaming;
} kind_row;

Test(descriptors, method_kind) {
    static const kind_row rows[] = {
        {"drey.cache.v1.Cache", "Get", false, false},
        {"drey.cache.v1.Cache", "SetMany", false, false},
        {"grpc.health.v1.Health", "Check", false, false},
        {"grpc.health.v1.Health", "Watch", false, true},
        {"grpc.reflection.v1.ServerReflection", "ServerReflectionInfo", true, true},
        {"grpc.reflection.v1alpha.ServerReflection", "ServerReflectionInfo", true, true},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        bool cs = !rows[i].client_streaming, ss = !rows[i].server_streaming;
        cr_assert(drey_descriptors_method_kind(builtin(), rows[i].service, rows[i].method, &cs, &ss), "%s/%s",
                  rows[i].service, rows[i].method);
        cr_assert(eq(int, cs, rows[i].client_streaming), "%s/%s", rows[i].service, rows[i].method);
        cr_assert(eq(int, ss, rows[i].server_streaming), "%s/%s", rows[i].service, rows[i].method);
    }
}

Test(descriptors, method_kind_of_unknown_methods) {
    static const char *const bad[][2] = {
        {"drey.cache.v1.Cache", "Nope"},
        {"drey.cache.v1.Cache", "get"},
        {"drey.cache.v1.Nope", "Get"},
        {"Cache", "Get"},                /* the package is part of the name */
        {"drey.cache.v1Cache", "Get"},
        {"drey.cache.Cache", "Get"},
        {"cache.v1.Cache", "Get"},
        {"grpc.health.v1.Health", ""},
        {"", "Get"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        bool cs = true, ss = true;
        cr_assert(not(drey_descriptors_method_kind(builtin(), bad[i][0], bad[i][1], &cs, &ss)), "%s/%s", bad[i][0],
                  bad[i][1]);
    }
}

/* --- load() on other input ------------------------------------------------ */

/* Builds and loads a one-file set; the caller fills the file. */
static drey_descriptors *load_file(Google__Protobuf__FileDescriptorProto *f) {
    Google__Protobuf__FileDescriptorSet set = GOOGLE__PROTOBUF__FILE_DESCRIPTOR_SET__INIT;
    set.n_file = 1;
    set.file = &f;
    size_t n = google__protobuf__file_descriptor_set__get_packed_size(&set);
    static uint8_t buf[4096];
    cr_assert(le(sz, n, sizeof buf));
    google__protobuf__file_descriptor_set__pack(&set, buf);
    return drey_descriptors_load(buf, n);
}

/* A small hand-made file, with every kind of symbol. */
typedef struct mini {
    Google__Protobuf__FileDescriptorProto file;
    Google__Protobuf__DescriptorProto msg, nested;
    Google__Protobuf__DescriptorProto *msgs[1], *nesteds[1];
    Google__Protobuf__FieldDescriptorProto field;
    Google__Protobuf__FieldDescriptorProto *fields[1];
    Google__Protobuf__EnumDescriptorProto en;
    Google__Protobuf__EnumDescriptorProto *ens[1];
    Google__Protobuf__EnumValueDescriptorProto val;
    Google__Protobuf__EnumValueDescriptorProto *vals[1];
    Google__Protobuf__ServiceDescriptorProto svc;
    Google__Protobuf__ServiceDescriptorProto *svcs[1];
    Google__Protobuf__MethodDescriptorProto method;
    Google__Protobuf__MethodDescriptorProto *methods[1];
} mini;

static void mini_init(mini *m, const char *package) {
    memset(m, 0, sizeof *m);
    google__protobuf__file_descriptor_proto__init(&m->file);
    google__protobuf__descriptor_proto__init(&m->msg);
    google__protobuf__descriptor_proto__init(&m->nested);
    google__protobuf__field_descriptor_proto__init(&m->field);
    google__protobuf__enum_descriptor_proto__init(&m->en);
    google__protobuf__enum_value_descriptor_proto__init(&m->val);
    google__protobuf__service_descriptor_proto__init(&m->svc);
    google__protobuf__method_descriptor_proto__init(&m->method);
    m->file.name = "mini.proto";
    m->file.package = (char *)package;
    m->msg.name = "M";
    m->nested.name = "N";
    m->field.name = "f";
    m->field.has_number = 1;
    m->field.number = 1;
    m->en.name = "E";
    m->val.name = "V";
    m->svc.name = "S";
    m->method.name = "Do";
    m->method.input_type = ".M";
    m->method.output_type = ".M";
    m->method.has_server_streaming = 1;
    m->method.server_streaming = 1;
    m->msgs[0] = &m->msg, m->nesteds[0] = &m->nested, m->fields[0] = &m->field;
    m->ens[0] = &m->en, m->vals[0] = &m->val, m->svcs[0] = &m->svc, m->methods[0] = &m->method;
    m->file.n_message_type = 1, m->file.message_type = m->msgs;
    m->msg.n_field = 1, m->msg.field = m->fields;
    m->msg.n_nested_type = 1, m->msg.nested_type = m->nesteds;
    m->file.n_enum_type = 1, m->file.enum_type = m->ens;
    m->en.n_value = 1, m->en.value = m->vals;
    m->file.n_service = 1, m->file.service = m->svcs;
    m->svc.n_method = 1, m->svc.method = m->methods;
}

Test(descriptors, load_a_hand_made_set) {
    mini m;
    mini_init(&m, "p.q");
    drey_descriptors *d = load_file(&m.file);
    cr_assert_not_null(d);
    cr_assert(eq(sz, drey_descriptors_file_count(d), 1));
    static const char *const symbols[] = {"p.q.M", "p.q.M.f", "p.q.M.N", "p.q.E", "p.q.V", "p.q.S", "p.q.S.Do"};
    for (size_t i = 0; i < sizeof symbols / sizeof symbols[0]; i++)
        cr_assert(eq(long, drey_descriptors_find_symbol(d, symbols[i]), 0), "%s", symbols[i]);
    cr_assert(eq(long, drey_descriptors_find_symbol(d, "p.q.E.V"), -1));
    bool cs = true, ss = false;
    cr_assert(drey_descriptors_method_kind(d, "p.q.S", "Do", &cs, &ss));
    cr_assert(not(cs));
    cr_assert(ss);
    drey_descriptors_free(d);
}

/* Without a package, names are unqualified. */
Test(descriptors, load_a_set_without_package) {
    mini m;
    mini_init(&m, NULL);
    drey_descriptors *d = load_file(&m.file);
    cr_assert_not_null(d);
    cr_assert(eq(long, drey_descriptors_find_symbol(d, "M.N"), 0));
    cr_assert(eq(long, drey_descriptors_find_symbol(d, "S.Do"), 0));
    cr_assert(eq(long, drey_descriptors_find_symbol(d, ".S"), -1));
    const char *const *names;
    cr_assert(eq(sz, drey_descriptors_services(d, &names), 1));
    cr_assert(eq(str, (char *)names[0], "S"));
    bool cs, ss;
    cr_assert(drey_descriptors_method_kind(d, "S", "Do", &cs, &ss));
    cr_assert(not(drey_descriptors_method_kind(d, ".S", "Do", &cs, &ss)));
    drey_descriptors_free(d);
}

Test(descriptors, an_empty_set_is_valid_and_empty) {
    drey_descriptors *d = drey_descriptors_load((const uint8_t *)"", 0);
    cr_assert_not_null(d);
    cr_assert(eq(sz, drey_descriptors_file_count(d), 0));
    const char *const *names;
    cr_assert(eq(sz, drey_descriptors_services(d, &names), 0));
    cr_assert(eq(long, drey_descriptors_find_symbol(d, "drey.cache.v1.Cache"), -1));
    cr_assert(eq(long, drey_descriptors_find_file(d, "x.proto"), -1));
    bool cs, ss;
    cr_assert(not(drey_descriptors_method_kind(d, "drey.cache.v1.Cache", "Get", &cs, &ss)));
    drey_descriptors_free(d);
    drey_descriptors_free(NULL);
}

Test(descriptors, an_import_missing_from_the_set_is_rejected) {
    mini m;
    mini_init(&m, "p");
    char *dep = "google/protobuf/duration.proto";
    m.file.n_dependency = 1;
    m.file.dependency = &dep;
    cr_assert_null(load_file(&m.file));
}

/* Every prefix of the built-in set: a cut inside a file is malformed (NULL);
 * a cut exactly between files is a smaller valid set (protoc orders files
 * after their imports) holding exactly the files before the cut. */
Test(descriptors, truncated_sets, .timeout = 300) {
    const uint8_t *set = drey_descriptor_set;
    size_t len = drey_descriptor_set_len;
    const drey_descriptors *full = builtin();
    size_t nfiles = drey_descriptors_file_count(full);
    size_t *ends = calloc(nfiles + 1, sizeof *ends); /* ends[i]: offset after file i-1 */
    for (size_t i = 0; i < nfiles; i++) {
        const uint8_t *data;
        size_t n;
        drey_descriptors_file_bytes(full, i, &data, &n);
        ends[i + 1] = (size_t)(data - set) + n;
    }
    cr_assert(eq(sz, ends[nfiles], len));

    for (size_t cut = 0; cut < len; cut++) {
        /* Near file boundaries every length; elsewhere a sample. */
        bool near = false;
        for (size_t i = 0; i <= nfiles && !near; i++)
            near = cut + 16 >= ends[i] && cut <= ends[i] + 16;
        if (!near && cut % 61 != 0)
            continue;
        size_t whole = 0;
        bool boundary = false;
        for (size_t i = 0; i <= nfiles; i++) {
            if (ends[i] == cut) {
                boundary = true;
                whole = i;
            }
        }
        uint8_t *copy = malloc(cut ? cut : 1); /* exact size: ASan sees any over-read */
        memcpy(copy, set, cut);
        drey_descriptors *d = drey_descriptors_load(copy, cut);
        if (boundary) {
            cr_assert_not_null(d, "cut %zu between files", cut);
            cr_assert(eq(sz, drey_descriptors_file_count(d), whole));
        } else {
            cr_assert_null(d, "cut %zu inside a file loaded", cut);
        }
        drey_descriptors_free(d);
        free(copy);
    }
    free(ends);
}

/* Random bytes, and the built-in set with bytes overwritten, never crash
 * load() (nor reads past the buffer, under ASan). */
Test(descriptors, garbage_does_not_crash, .timeout = 300) {
    uint64_t x = 0x9e3779b97f4a7c15ULL;
    for (int round = 0; round < 3000; round++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        size_t n = (size_t)(x % 300);
        uint8_t *buf = malloc(n ? n : 1);
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            buf[i] = (uint8_t)x;
        }
        if (round % 3 == 0 && n > 0)
            buf[0] = 0x0a; /* a plausible first tag */
        drey_descriptors_free(drey_descriptors_load(buf, n));
        free(buf);
    }

    size_t len = drey_descriptor_set_len;
    uint8_t *copy = malloc(len);
    for (int round = 0; round < 400; round++) {
        memcpy(copy, drey_descriptor_set, len);
        for (int k = 0; k < 1 + round % 4; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            copy[(x >> 8) % len] = (uint8_t)x;
        }
        drey_descriptors *d = drey_descriptors_load(copy, len);
        if (d != NULL) {
            drey_descriptors_find_symbol(d, "drey.cache.v1.Cache");
            drey_descriptors_find_file(d, "drey/cache/v1/cache.proto");
        }
        drey_descriptors_free(d);
    }
    free(copy);
}

/* --- BUG: descriptors without names --------------------------------------- */

/* A FileDescriptorSet that parses but names nothing is malformed: load()
 * must refuse it instead of dereferencing the missing name (the names are
 * optional on the wire, so protobuf-c leaves them NULL). */

Test(descriptors, a_message_without_a_name_is_rejected) {
    mini m;
    mini_init(&m, "p");
    m.msg.name = NULL;
    cr_assert_null(load_file(&m.file));
}

Test(descriptors, a_nested_message_without_a_name_is_rejected) {
    mini m;
    mini_init(&m, "p");
    m.nested.name = NULL;
    cr_assert_null(load_file(&m.file));
}

Test(descriptors, a_field_without_a_name_is_rejected) {
    mini m;
    mini_init(&m, "p");
    m.field.name = NULL;
    cr_assert_null(load_file(&m.file));
}

Test(descriptors, an_enum_without_a_name_is_rejected) {
    mini m;
    mini_init(&m, "p");
    m.en.name = NULL;
    cr_assert_null(load_file(&m.file));
}

Test(descriptors, an_enum_value_without_a_name_is_rejected) {
    mini m;
    mini_init(&m, "p");
    m.val.name = NULL;
    cr_assert_null(load_file(&m.file));
}

Test(descriptors, a_service_without_a_name_is_rejected) {
    mini m;
    mini_init(&m, "p");
    m.svc.name = NULL;
    cr_assert_null(load_file(&m.file));
}

Test(descriptors, a_method_without_a_name_is_rejected) {
    mini m;
    mini_init(&m, "p");
    m.method.name = NULL;
    cr_assert_null(load_file(&m.file));
}

Test(descriptors, a_file_without_a_name_is_rejected) {
    mini m;
    mini_init(&m, "p");
    m.file.name = NULL;
    drey_descriptors *d = load_file(&m.file);
    if (d != NULL) {
        /* Accepted: the index must still be usable. */
        drey_descriptors_find_file(d, "mini.proto");
        drey_descriptors_free(d);
    }
    cr_assert_null(d);
}
