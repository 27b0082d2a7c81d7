/*
 * reflect — gRPC server reflection, grpc.reflection.v1 and v1alpha.
 *
 * Serves the built-in descriptor set (include/drey/descriptors.h):
 * list_services (the services whose methods this server registered, read
 * at each request: a single node serves no drey.cluster.v1.Cluster),
 * file_by_filename and file_containing_symbol with every
 * transitive dependency, all_extension_numbers_of_type (drey defines no
 * extensions), and error_response NOT_FOUND for unknown names. With it,
 * grpcurl lists, describes and calls drey without .proto files.
 */
#ifndef DREY_REFLECT_H
#define DREY_REFLECT_H

#include <stdbool.h>

#include "drey/server.h"

bool drey_reflect_register(drey_server *s);

#endif
