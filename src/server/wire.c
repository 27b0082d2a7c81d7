/*
 * Wire-level checks; see wire.h.
 */
#include "wire.h"

/* Depth-first search for a type that contains itself. Schemas are small, so
 * re-walking shared sub-types is cheap; a path deeper than 32 types is
 * treated as recursive (the depth check is cheap too). */
static bool has_cycle(const ProtobufCMessageDescriptor *d, const ProtobufCMessageDescriptor **path, size_t depth) {
    for (size_t i = 0; i < depth; i++) {
        if (path[i] == d)
            return true;
    }
    if (depth == 32)
        return true;
    path[depth] = d;
    for (unsigned f = 0; f < d->n_fields; f++) {
        const ProtobufCFieldDescriptor *fd = &d->fields[f];
        if (fd->type == PROTOBUF_C_TYPE_MESSAGE && has_cycle(fd->descriptor, path, depth + 1))
            return true;
    }
    return false;
}

bool drey_server__type_is_recursive(const ProtobufCMessageDescriptor *d) {
    const ProtobufCMessageDescriptor *path[32];
    return has_cycle(d, path, 0);
}

static bool varint(const uint8_t **p, const uint8_t *end, uint64_t *out) {
    uint64_t v = 0;
    for (int shift = 0; shift < 70 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << (shift < 64 ? shift : 63);
        if ((b & 0x80) == 0) {
            *out = v;
            return true;
        }
    }
    return false;
}

bool drey_server__depth_ok(const ProtobufCMessageDescriptor *d, const uint8_t *data, size_t len, int max_depth) {
    if (max_depth < 0)
        return false;
    const uint8_t *p = data, *end = data + len;
    while (p < end) {
        uint64_t key, n;
        if (!varint(&p, end, &key))
            return true;
        switch (key & 7) {
        case 0:
            if (!varint(&p, end, &n))
                return true;
            break;
        case 1:
            if (end - p < 8)
                return true;
            p += 8;
            break;
        case 5:
            if (end - p < 4)
                return true;
            p += 4;
            break;
        case 2: {
            if (!varint(&p, end, &n) || n > (uint64_t)(end - p))
                return true;
            const ProtobufCFieldDescriptor *fd =
                key >> 3 <= UINT32_MAX ? protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3)) : NULL;
            if (fd != NULL && fd->type == PROTOBUF_C_TYPE_MESSAGE &&
                !drey_server__depth_ok(fd->descriptor, p, (size_t)n, max_depth - 1))
                return false;
            p += n;
            break;
        }
        default:
            return true; /* groups and junk: unpack refuses them */
        }
    }
    return true;
}
