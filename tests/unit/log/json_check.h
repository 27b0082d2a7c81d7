/*
 * A strict, tiny JSON checker for the log tests (RFC 8259).
 *
 * json_parse_line() accepts exactly one JSON object followed by one '\n' and
 * nothing else. Strings must be valid UTF-8 with no raw control characters
 * and only the escapes RFC 8259 defines. The top-level members are kept, in
 * order, with their raw text and, for strings, the decoded value, so tests
 * can check both the escaping on the wire and the round trip.
 */
#ifndef DREY_TESTS_UNIT_LOG_JSON_CHECK_H
#define DREY_TESTS_UNIT_LOG_JSON_CHECK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef enum { J_STRING, J_NUMBER, J_TRUE, J_FALSE, J_NULL, J_OBJECT, J_ARRAY } jtype;

#define JSON_MAX_MEMBERS 128
#define JSON_MAX_STR 8192

typedef struct jmember {
    char key[256];
    jtype type;
    const char *raw; /* the value's text inside the line */
    size_t raw_len;
    char str[JSON_MAX_STR]; /* decoded string value (J_STRING), NUL-terminated */
    size_t str_len;
} jmember;

typedef struct jobject {
    size_t n;
    jmember m[JSON_MAX_MEMBERS];
    char err[128]; /* why parsing failed */
} jobject;

typedef struct jparser {
    const char *start, *p, *end;
    jobject *o;
} jparser;

static bool j_fail(jparser *j, const char *why) {
    snprintf(j->o->err, sizeof j->o->err, "%s at offset %td", why, j->p - j->start);
    return false;
}

static void j_ws(jparser *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\r' || *j->p == '\n'))
        j->p++;
}

static void j_put_utf8(char *out, size_t *len, size_t cap, uint32_t cp) {
    char b[4];
    size_t n;
    if (cp < 0x80) {
        b[0] = (char)cp, n = 1;
    } else if (cp < 0x800) {
        b[0] = (char)(0xc0 | cp >> 6), b[1] = (char)(0x80 | (cp & 0x3f)), n = 2;
    } else if (cp < 0x10000) {
        b[0] = (char)(0xe0 | cp >> 12), b[1] = (char)(0x80 | ((cp >> 6) & 0x3f)), b[2] = (char)(0x80 | (cp & 0x3f));
        n = 3;
    } else {
        b[0] = (char)(0xf0 | cp >> 18), b[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        b[2] = (char)(0x80 | ((cp >> 6) & 0x3f)), b[3] = (char)(0x80 | (cp & 0x3f));
        n = 4;
    }
    if (out != NULL && *len + n < cap)
        memcpy(out + *len, b, n);
    *len += n;
}

static bool j_hex4(jparser *j, uint32_t *out) {
    if (j->end - j->p < 4)
        return j_fail(j, "short \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) {
        char c = *j->p++;
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (uint32_t)(c - 'A' + 10);
        else
            return j_fail(j, "bad hex digit");
    }
    *out = v;
    return true;
}

/* Length of the valid UTF-8 sequence at p (1..4), 0 if invalid. */
static size_t j_utf8_len(const unsigned char *p, const unsigned char *end) {
    unsigned char c = p[0];
    size_t n;
    uint32_t cp;
    if (c < 0x80)
        return 1;
    if ((c & 0xe0) == 0xc0)
        n = 2, cp = c & 0x1f;
    else if ((c & 0xf0) == 0xe0)
        n = 3, cp = c & 0x0f;
    else if ((c & 0xf8) == 0xf0)
        n = 4, cp = c & 0x07;
    else
        return 0;
    if ((size_t)(end - p) < n)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (p[i] & 0x3f);
    }
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n;
}

/* Parses a string; out (may be NULL) receives the decoded bytes. */
static bool j_string(jparser *j, char *out, size_t cap, size_t *out_len) {
    size_t len = 0;
    if (j->p >= j->end || *j->p != '"')
        return j_fail(j, "expected string");
    j->p++;
    for (;;) {
        if (j->p >= j->end)
            return j_fail(j, "unterminated string");
        unsigned char c = (unsigned char)*j->p;
        if (c == '"') {
            j->p++;
            break;
        }
        if (c < 0x20)
            return j_fail(j, "raw control character in string");
        if (c == '\\') {
            j->p++;
            if (j->p >= j->end)
                return j_fail(j, "unterminated escape");
            char e = *j->p++;
            uint32_t cp;
            switch (e) {
            case '"': cp = '"'; break;
            case '\\': cp = '\\'; break;
            case '/': cp = '/'; break;
            case 'b': cp = '\b'; break;
            case 'f': cp = '\f'; break;
            case 'n': cp = '\n'; break;
            case 'r': cp = '\r'; break;
            case 't': cp = '\t'; break;
            case 'u':
                if (!j_hex4(j, &cp))
                    return false;
                if (cp >= 0xd800 && cp <= 0xdbff) {
                    uint32_t lo;
                    if (j->end - j->p < 2 || j->p[0] != '\\' || j->p[1] != 'u')
                        return j_fail(j, "lone high surrogate");
                    j->p += 2;
                    if (!j_hex4(j, &lo))
                        return false;
                    if (lo < 0xdc00 || lo > 0xdfff)
                        return j_fail(j, "bad low surrogate");
                    cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                } else if (cp >= 0xdc00 && cp <= 0xdfff) {
                    return j_fail(j, "lone low surrogate");
                }
                break;
            default: return j_fail(j, "unknown escape");
            }
            j_put_utf8(out, &len, cap, cp);
            continue;
        }
        size_t n = j_utf8_len((const unsigned char *)j->p, (const unsigned char *)j->end);
        if (n == 0)
            return j_fail(j, "invalid UTF-8 in string");
        if (out != NULL && len + n < cap)
            memcpy(out + len, j->p, n);
        len += n;
        j->p += n;
    }
    if (out != NULL)
        out[len < cap ? len : cap - 1] = '\0';
    if (out_len != NULL)
        *out_len = len;
    return true;
}

static bool j_digits(jparser *j) {
    const char *start = j->p;
    while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
        j->p++;
    return j->p > start;
}

static bool j_number(jparser *j) {
    if (j->p < j->end && *j->p == '-')
        j->p++;
    if (j->p < j->end && *j->p == '0') {
        j->p++;
    } else if (j->p < j->end && *j->p >= '1' && *j->p <= '9') {
        j_digits(j);
    } else {
        return j_fail(j, "bad number");
    }
    if (j->p < j->end && *j->p == '.') {
        j->p++;
        if (!j_digits(j))
            return j_fail(j, "bad fraction");
    }
    if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
        j->p++;
        if (j->p < j->end && (*j->p == '+' || *j->p == '-'))
            j->p++;
        if (!j_digits(j))
            return j_fail(j, "bad exponent");
    }
    return true;
}

static bool j_literal(jparser *j, const char *lit) {
    size_t n = strlen(lit);
    if ((size_t)(j->end - j->p) < n || memcmp(j->p, lit, n) != 0)
        return j_fail(j, "bad literal");
    j->p += n;
    return true;
}

static bool j_value(jparser *j, jtype *type, int depth);

static bool j_container(jparser *j, bool object, int depth) {
    char close = object ? '}' : ']';
    j->p++;
    j_ws(j);
    if (j->p < j->end && *j->p == close) {
        j->p++;
        return true;
    }
    for (;;) {
        jtype t;
        j_ws(j);
        if (object) {
            if (!j_string(j, NULL, 0, NULL))
                return false;
            j_ws(j);
            if (j->p >= j->end || *j->p != ':')
                return j_fail(j, "expected ':'");
            j->p++;
            j_ws(j);
        }
        if (!j_value(j, &t, depth + 1))
            return false;
        j_ws(j);
        if (j->p < j->end && *j->p == ',') {
            j->p++;
            continue;
        }
        if (j->p < j->end && *j->p == close) {
            j->p++;
            return true;
        }
        return j_fail(j, "expected ',' or close");
    }
}

static bool j_value(jparser *j, jtype *type, int depth) {
    if (depth > 64)
        return j_fail(j, "too deep");
    if (j->p >= j->end)
        return j_fail(j, "expected value");
    switch (*j->p) {
    case '"': *type = J_STRING; return j_string(j, NULL, 0, NULL);
    case '{': *type = J_OBJECT; return j_container(j, true, depth);
    case '[': *type = J_ARRAY; return j_container(j, false, depth);
    case 't': *type = J_TRUE; return j_literal(j, "true");
    case 'f': *type = J_FALSE; return j_literal(j, "false");
    case 'n': *type = J_NULL; return j_literal(j, "null");
    default: *type = J_NUMBER; return j_number(j);
    }
}

/* Parses line[0..len): one object, then exactly one '\n' ending the line. */
static bool json_parse_line(const char *line, size_t len, jobject *o) {
    jparser j = {.start = line, .p = line, .end = line + len, .o = o};
    o->n = 0;
    o->err[0] = '\0';
    if (len == 0 || line[len - 1] != '\n' || memchr(line, '\n', len - 1) != NULL)
        return j_fail(&j, "not exactly one line");
    j.end--; /* the newline */
    if (j.p >= j.end || *j.p != '{')
        return j_fail(&j, "expected '{'");
    j.p++;
    if (j.p < j.end && *j.p == '}') {
        j.p++;
    } else {
        for (;;) {
            if (o->n == JSON_MAX_MEMBERS)
                return j_fail(&j, "too many members");
            jmember *m = &o->m[o->n];
            size_t klen;
            if (!j_string(&j, m->key, sizeof m->key, &klen))
                return false;
            if (j.p >= j.end || *j.p != ':')
                return j_fail(&j, "expected ':'");
            j.p++;
            m->raw = j.p;
            if (j.p < j.end && *j.p == '"') {
                m->type = J_STRING;
                if (!j_string(&j, m->str, sizeof m->str, &m->str_len))
                    return false;
            } else if (!j_value(&j, &m->type, 1)) {
                return false;
            }
            m->raw_len = (size_t)(j.p - m->raw);
            o->n++;
            if (j.p < j.end && *j.p == ',') {
                j.p++;
                continue;
            }
            if (j.p < j.end && *j.p == '}') {
                j.p++;
                break;
            }
            return j_fail(&j, "expected ',' or '}'");
        }
    }
    if (j.p != j.end)
        return j_fail(&j, "trailing bytes after the object");
    return true;
}

/* The member named key, or NULL. */
static const jmember *json_get(const jobject *o, const char *key) {
    for (size_t i = 0; i < o->n; i++) {
        if (strcmp(o->m[i].key, key) == 0)
            return &o->m[i];
    }
    return NULL;
}

/* Whether the member's raw text is exactly `raw`. */
static bool json_raw_is(const jmember *m, const char *raw) {
    return m != NULL && m->raw_len == strlen(raw) && memcmp(m->raw, raw, m->raw_len) == 0;
}

#endif
