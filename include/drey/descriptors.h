/*
 * descriptors — the compiled descriptor set of every service drey serves.
 *
 * gen/drey_descriptor_set.binpb (protoc --include_imports) is linked into the
 * binary. Reflection serves its files as they were compiled, and the server
 * reads each method's streaming kind from it, since protobuf-c's service
 * descriptors do not carry one.
 */
#ifndef DREY_DESCRIPTORS_H
#define DREY_DESCRIPTORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct drey_descriptors drey_descriptors;

/* The descriptor set built into the binary (gen/drey_descriptor_set.c). */
extern const unsigned char drey_descriptor_set[];
extern const size_t drey_descriptor_set_len;

/* Parses a serialized FileDescriptorSet; NULL when it is malformed. */
drey_descriptors *drey_descriptors_load(const uint8_t *set, size_t len);
/* The built-in set, parsed once and kept for the life of the process. */
const drey_descriptors *drey_descriptors_builtin(void);
void drey_descriptors_free(drey_descriptors *d);

size_t drey_descriptors_file_count(const drey_descriptors *d);
const char *drey_descriptors_file_name(const drey_descriptors *d, size_t i);
/* The file's serialized FileDescriptorProto, exactly as compiled. */
void drey_descriptors_file_bytes(const drey_descriptors *d, size_t i, const uint8_t **data, size_t *len);
/* Indices of the files file i imports. */
size_t drey_descriptors_file_deps(const drey_descriptors *d, size_t i, const size_t **deps);

/* -1 when unknown. Symbols are fully qualified without a leading dot:
 * packages' messages, nested messages, enums, enum values, fields,
 * services and methods (service.Method). */
long drey_descriptors_find_file(const drey_descriptors *d, const char *name);
long drey_descriptors_find_symbol(const drey_descriptors *d, const char *symbol);

/* Fully qualified names of every service defined in the set. */
size_t drey_descriptors_services(const drey_descriptors *d, const char *const **names);

/* Streaming flags of service.method; false when there is no such method. */
bool drey_descriptors_method_kind(const drey_descriptors *d, const char *service, const char *method,
                                  bool *client_streaming, bool *server_streaming);

#endif
