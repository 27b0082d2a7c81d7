/*
 * pbjson — a protobuf-c message as JSON, driven by its descriptor.
 *
 * Field names in lowerCamelCase, in descriptor order; every field written,
 * defaults included; 64-bit integers as bare numbers; enums by name; maps as
 * objects; NaN and infinities as the protobuf JSON mapping's strings; bytes
 * as "" (never in the documents printed). Used for the readiness details
 * (GET /health/ready/details) and by the `drey` CLI, so the two print one
 * schema the same way and neither can drift from the .proto.
 */
#ifndef DREY_PBJSON_H
#define DREY_PBJSON_H

#include <stdio.h>

#include <protobuf-c/protobuf-c.h>

void drey_pbjson_write(FILE *out, const ProtobufCMessage *m);

#endif
