/* Wire-level checks run before protobuf-c sees a message (internal). */
#ifndef DREY_SERVER_WIRE_H
#define DREY_SERVER_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

/* Whether messages of this type can nest without bound (google.protobuf.Struct
 * holds Values that hold Structs). */
bool drey_server__type_is_recursive(const ProtobufCMessageDescriptor *d);

/* False when the encoded message nests sub-messages deeper than max_depth.
 * protobuf-c unpacks recursively with no limit, so a few megabytes of nested
 * Structs would overflow a worker's stack; this walk is iterative over
 * fields and bounded in depth. Malformed encodings pass: unpack rejects
 * them. */
bool drey_server__depth_ok(const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len, int max_depth);

#endif
