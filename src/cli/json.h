/*
 * json — JSON text <-> google.protobuf.Struct for `drey set --json` and for
 * printing JSON values (jansson underneath).
 */
#ifndef DREY_CLI_JSON_H
#define DREY_CLI_JSON_H

#include <stdio.h>

#include <jansson.h>

#include "drey/arena.h"
#include "google/protobuf/struct.pb-c.h"

/* Parses a JSON object into a Struct in arena memory; NULL with a message in
 * err when text is not a JSON object. */
Google__Protobuf__Struct *drey_cli_json_parse(const char *text, drey_arena *arena, char *err, size_t err_cap);

/* s as a jansson object (a new reference). */
json_t *drey_cli_json_of_struct(const Google__Protobuf__Struct *s);

/* Writes s as compact JSON (keys sorted). */
void drey_cli_json_print(FILE *out, const Google__Protobuf__Struct *s);

#endif
