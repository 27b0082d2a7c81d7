/*
 * out — the three output formats of every drey command; see out.h.
 */
#include "out.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"

bool drey_out_parse_format(const char *s, drey_out_format *f) {
    if (strcmp(s, "text") == 0)
        *f = DREY_OUT_TEXT;
    else if (strcmp(s, "json") == 0)
        *f = DREY_OUT_JSON;
    else if (strcmp(s, "table") == 0)
        *f = DREY_OUT_TABLE;
    else
        return false;
    return true;
}

void drey_out_begin(drey_out *o, drey_out_format f, FILE *stream, const char *const *columns) {
    o->format = f;
    o->stream = stream;
    o->columns = columns;
    o->rows = NULL;
}

void drey_out_json_line(FILE *out, const json_t *v) {
    char *text = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY | JSON_REAL_PRECISION(17));
    fputs(text != NULL ? text : "null", out);
    fputc('\n', out);
    free(text);
}

/* The length of the valid UTF-8 sequence at s (1 to 4), or 0. */
static size_t utf8_len(const unsigned char *s, size_t n) {
    if (s[0] < 0x80)
        return 1;
    size_t len = s[0] >= 0xf0 && s[0] <= 0xf4 ? 4 : s[0] >= 0xe0 ? 3 : s[0] >= 0xc2 && s[0] < 0xe0 ? 2 : 0;
    if (len == 0 || len > n)
        return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xc0) != 0x80)
            return 0;
    return len;
}

static bool needs_quotes(const char *s, size_t n, bool table) {
    if (n == 0 || s[0] == ' ' || s[n - 1] == ' ')
        return true;
    if (table && n == 1 && s[0] == '-')
        return true;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t len = utf8_len((const unsigned char *)s + i, n - i);
        if (len == 0 || c < 0x20 || c == 0x7f || c == '"' || c == '\\' || (table && c == ' '))
            return true;
        i += len;
    }
    return false;
}

void drey_out_quote(FILE *out, const char *s, size_t n) {
    fputc('"', out);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        size_t len = utf8_len((const unsigned char *)s + i, n - i);
        if (c >= 0x80) {
            if (len == 0) {
                fprintf(out, "\\x%02x", c);
            } else {
                fwrite(s + i, 1, len, out);
                i += len - 1;
            }
            continue;
        }
        switch (c) {
        case '"': fputs("\\\"", out); break;
        case '\\': fputs("\\\\", out); break;
        case '\t': fputs("\\t", out); break;
        case '\n': fputs("\\n", out); break;
        case '\r': fputs("\\r", out); break;
        default:
            if (c < 0x20 || c == 0x7f)
                fprintf(out, "\\x%02x", c);
            else
                fputc(c, out);
        }
    }
    fputc('"', out);
}

char *drey_out_field(const json_t *v, bool table) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = drey_xopen_memstream(&buf, &len);
    switch (v != NULL ? json_typeof(v) : JSON_NULL) {
    case JSON_STRING: {
        const char *s = json_string_value(v);
        size_t n = json_string_length(v);
        if (needs_quotes(s, n, table))
            drey_out_quote(f, s, n);
        else
            fwrite(s, 1, n, f);
        break;
    }
    case JSON_INTEGER: fprintf(f, "%" JSON_INTEGER_FORMAT, json_integer_value(v)); break;
    case JSON_REAL: fprintf(f, "%.17g", json_real_value(v)); break;
    case JSON_TRUE: fputs("true", f); break;
    case JSON_FALSE: fputs("false", f); break;
    case JSON_NULL:
        if (table)
            fputc('-', f);
        break;
    default: {
        char *t = json_dumps(v, JSON_COMPACT | JSON_PRESERVE_ORDER);
        fputs(t != NULL ? t : "", f);
        free(t);
    }
    }
    fclose(f);
    return buf;
}

void drey_out_row(drey_out *o, json_t *row) {
    switch (o->format) {
    case DREY_OUT_JSON:
        drey_out_json_line(o->stream, row);
        json_decref(row);
        break;
    case DREY_OUT_TABLE:
        if (o->rows == NULL)
            o->rows = json_array();
        json_array_append_new(o->rows, row);
        return; /* printed by flush */
    case DREY_OUT_TEXT:
        for (size_t i = 0; o->columns[i] != NULL; i++) {
            char *s = drey_out_field(json_object_get(row, o->columns[i]), false);
            fprintf(o->stream, "%s%s", i ? "\t" : "", s);
            free(s);
        }
        fputc('\n', o->stream);
        json_decref(row);
        break;
    }
    fflush(o->stream);
}

/* A column name as a header: expiresAt -> EXPIRES_AT. */
static char *header(const char *name) {
    size_t n = strlen(name);
    char *h = drey_xmalloc(2 * n + 1), *p = h;
    for (size_t i = 0; i < n; i++) {
        if (isupper((unsigned char)name[i]) && i > 0)
            *p++ = '_';
        *p++ = (char)toupper((unsigned char)name[i]);
    }
    *p = '\0';
    return h;
}

/* Display width: UTF-8 continuation bytes take no column. */
static size_t width(const char *s) {
    size_t w = 0;
    for (; *s != '\0'; s++)
        w += ((unsigned char)*s & 0xc0) != 0x80;
    return w;
}

void drey_out_flush(drey_out *o) {
    if (o->format != DREY_OUT_TABLE)
        return;
    if (o->rows == NULL)
        o->rows = json_array(); /* no rows: the header alone */
    size_t ncol = 0;
    while (o->columns[ncol] != NULL)
        ncol++;
    size_t nrow = json_array_size(o->rows);
    char **cells = drey_xcalloc((nrow + 1) * (ncol ? ncol : 1), sizeof *cells);
    size_t *w = drey_xcalloc(ncol ? ncol : 1, sizeof *w);
    for (size_t c = 0; c < ncol; c++)
        cells[c] = header(o->columns[c]);
    for (size_t r = 0; r < nrow; r++)
        for (size_t c = 0; c < ncol; c++)
            cells[(r + 1) * ncol + c] = drey_out_field(json_object_get(json_array_get(o->rows, r), o->columns[c]), true);
    for (size_t i = 0; i < (nrow + 1) * ncol; i++)
        if (width(cells[i]) > w[i % ncol])
            w[i % ncol] = width(cells[i]);
    for (size_t r = 0; r <= nrow; r++) {
        for (size_t c = 0; c < ncol; c++) {
            const char *cell = cells[r * ncol + c];
            fputs(cell, o->stream);
            if (c + 1 < ncol)
                fprintf(o->stream, "%*s", (int)(w[c] - width(cell) + 2), "");
        }
        fputc('\n', o->stream);
    }
    for (size_t i = 0; i < (nrow + 1) * ncol; i++)
        free(cells[i]);
    free(cells);
    free(w);
    json_decref(o->rows);
    o->rows = NULL;
    fflush(o->stream);
}
