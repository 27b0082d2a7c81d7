/*
 * rpc — what every user of the gRPC C core in drey shares (the server, the
 * C client, the etcd client): protobuf-c messages in and out of gRPC byte
 * buffers, and the names of gRPC status codes. The core has no stable API
 * across releases, so the byte-buffer calls live here once rather than in
 * each module that sends or receives a message.
 */
#ifndef DREY_RPC_H
#define DREY_RPC_H

#include <stddef.h>

#include <grpc/grpc.h>
#include <grpc/status.h>
#include <protobuf-c/protobuf-c.h>

/* grpc_init(), for every module that starts the core (balanced by
 * grpc_shutdown). First it has abseil measure the CPU's frequency, which
 * abseil does once per process on first use: the gRPC core reads errno
 * after connect() only once it has made the socket's fd object, and that
 * can run the measurement (strace: the connecting thread opened the file
 * right after connect), whose failed open of a sysfs file sets errno
 * ENOENT. The connection in progress then fails at once ("No such file or
 * directory") and its channel backs off for a second: seen as drey-bench
 * --cluster runs whose first calls to one node failed UNAVAILABLE.
 * Measured here, before any connect, it never runs there. It also turns
 * off abseil's lock-order checking of gRPC's mutexes, on in Debian's build
 * and about 4 % of a busy process's CPU (src/rpc/absl.h). */
void drey_rpc_init(void);

/* m packed into a new byte buffer of one slice (the caller destroys it). */
grpc_byte_buffer *drey_rpc_pack(const ProtobufCMessage *m);

/* len bytes copied into a new byte buffer (the caller destroys it). */
grpc_byte_buffer *drey_rpc_copy(const void *data, size_t len);

/* A received message as one slice: a new reference, not a copy, when it
 * arrived in one piece (the common case); an empty slice when the buffer
 * cannot be read (a compressed message that does not decompress). The
 * caller unrefs it. */
grpc_slice drey_rpc_flatten(grpc_byte_buffer *bb);

/* A received message decoded as type with allocator a (NULL: malloc); NULL
 * when the buffer cannot be read or is not a valid type. */
ProtobufCMessage *drey_rpc_unpack(grpc_byte_buffer *bb, const ProtobufCMessageDescriptor *type, ProtobufCAllocator *a);

/* "OK", "CANCELLED", ... "UNAUTHENTICATED"; NULL for a number that is no
 * gRPC status code (each caller says what it prints then). */
const char *drey_rpc_code_name(grpc_status_code code);

/* Where field name lives in m, for a request filled by field names (the
 * CLI's and the load generator's requests, one table of operations each):
 * a member of a oneof gets its case set. NULL when m's type has no such
 * field. For a repeated field, *count (when not NULL) is where its count
 * lives. */
void *drey_rpc_field(ProtobufCMessage *m, const char *name, size_t **count);

#endif
