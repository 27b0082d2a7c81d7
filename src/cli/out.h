/*
 * out — how every drey command prints its results, in the three formats of
 * -o (--output):
 *
 *   text   one line per row, the command's columns separated by one tab, no
 *          header. A field is printed as it is unless that could be misread:
 *          an empty string, a string with a tab, a newline, a control
 *          character, a double quote or a backslash, or leading or trailing
 *          spaces is written in double quotes with C escapes (\t \n \" \\
 *          \xHH). An absent field (no expiry, no value) is empty. Objects and
 *          arrays (JSON values) are compact JSON, which has no tab or newline.
 *   table  the same columns aligned under an upper-case header; absent
 *          fields show "-", and strings with spaces (or "-") are quoted too.
 *   json   every field of every row, as JSON: one object for a command with
 *          one result, one object per line (JSON Lines) for commands with
 *          many (scan, mget, watch, ...). Field names are lowerCamelCase and
 *          stay stable; a new field may be added, none is renamed.
 *
 * A row is a jansson object; the columns say which of its fields text and
 * table show, in order. Rows are printed as they come (table buffers them
 * until drey_out_flush to align the columns).
 */
#ifndef DREY_CLI_OUT_H
#define DREY_CLI_OUT_H

#include <stdbool.h>
#include <stdio.h>

#include <jansson.h>

typedef enum drey_out_format { DREY_OUT_TEXT, DREY_OUT_JSON, DREY_OUT_TABLE } drey_out_format;

typedef struct drey_out {
    drey_out_format format;
    FILE *stream;
    const char *const *columns; /* NULL-terminated field names */
    json_t *rows;                /* table: held until flush */
} drey_out;

/* "text", "json" or "table"; false otherwise. */
bool drey_out_parse_format(const char *s, drey_out_format *f);

void drey_out_begin(drey_out *o, drey_out_format f, FILE *stream, const char *const *columns);
/* Prints (or, for a table, keeps) row; takes the reference. */
void drey_out_row(drey_out *o, json_t *row);
/* Prints a table's rows; nothing for the other formats. */
void drey_out_flush(drey_out *o);

/* One field as text shows it (quoted where it could be misread); table
 * quotes more (spaces, "-"). The caller frees the result. */
char *drey_out_field(const json_t *v, bool table);

/* Writes s quoted and escaped as in text, into out. */
void drey_out_quote(FILE *out, const char *s, size_t n);

/* A JSON document (compact, fields in insertion order) and a newline. */
void drey_out_json_line(FILE *out, const json_t *v);

#endif
