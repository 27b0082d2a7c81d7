/*
 * log — JSON lines on stderr; see include/drey/log.h.
 *
 * A line is formatted into a stack buffer and written with one write(2); a
 * line that would not fit is cut and marked "truncated" rather than split, so
 * a reader parsing line by line never sees half an object.
 */
#include "drey/log.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "drey/bytes.h"

#define LOG_LINE_MAX 4096

drey_log_level drey_log_min_level = DREY_LOG_LEVEL_INFO;
static int log_fd = 2;

static const char *const level_names[] = {"debug", "info", "warn", "error"};

bool drey_log_parse_level(const char *s, drey_log_level *out) {
    for (size_t i = 0; i < sizeof level_names / sizeof level_names[0]; i++) {
        if (strcmp(s, level_names[i]) == 0) {
            *out = (drey_log_level)i;
            return true;
        }
    }
    return false;
}

void drey_log_set_level(drey_log_level level) {
    drey_log_min_level = level;
}

void drey_log_set_fd(int fd) {
    log_fd = fd;
}

size_t drey_log_json_escape(char *buf, size_t len, size_t cap, const char *s) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)s;
    size_t left = strlen(s);
    while (left > 0) {
        char esc[8];
        size_t n, used = 1;
        const char *src = esc;
        switch (*p) {
        case '"': memcpy(esc, "\\\"", n = 2); break;
        case '\\': memcpy(esc, "\\\\", n = 2); break;
        case '\n': memcpy(esc, "\\n", n = 2); break;
        case '\r': memcpy(esc, "\\r", n = 2); break;
        case '\t': memcpy(esc, "\\t", n = 2); break;
        default:
            if (*p < 0x20) {
                esc[0] = '\\', esc[1] = 'u', esc[2] = '0', esc[3] = '0';
                esc[4] = hex[*p >> 4], esc[5] = hex[*p & 15];
                n = 6;
            } else if (*p < 0x80) {
                esc[0] = (char)*p;
                n = 1;
            } else if ((used = drey_bytes_utf8_seq(p, left)) > 0) {
                src = (const char *)p;
                n = used;
            } else {
                /* Not UTF-8 (gRPC's messages can carry anything): the
                 * replacement character keeps the line valid JSON. */
                memcpy(esc, "\\ufffd", n = 6);
                used = 1;
            }
        }
        if (cap - len < n)
            return cap;
        memcpy(buf + len, src, n);
        len += n;
        p += used;
        left -= used;
    }
    return len;
}

/* Appends raw text; returns cap when it does not fit. */
static size_t put(char *buf, size_t len, size_t cap, const char *s, size_t n) {
    if (len >= cap || cap - len < n)
        return cap;
    memcpy(buf + len, s, n);
    return len + n;
}

static size_t put_str(char *buf, size_t len, size_t cap, const char *s) {
    len = put(buf, len, cap, "\"", 1);
    if (len < cap)
        len = drey_log_json_escape(buf, len, cap, s != NULL ? s : "");
    return put(buf, len, cap, "\"", 1);
}

static size_t put_fmt(char *buf, size_t len, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static size_t put_fmt(char *buf, size_t len, size_t cap, const char *fmt, ...) {
    if (len >= cap)
        return cap;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + len, cap - len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap - len)
        return cap;
    return len + (size_t)n;
}

void drey_log_emit(drey_log_level level, const char *msg, const drey_log_field *fields, size_t n) {
    char line[LOG_LINE_MAX];
    /* Room kept back for the truncation marker and the closing brace. */
    static const char truncated[] = ",\"truncated\":true";
    const size_t cap = sizeof line - sizeof truncated - 2;
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);

    size_t len = put_fmt(line, 0, cap, "{\"time\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ\",\"level\":\"%s\",\"msg\":",
                         tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                         ts.tv_nsec / 1000000, level_names[level]);
    /* The message is cut, not dropped, and its string closed, so even an
     * absurdly long one yields a valid line. */
    size_t mark = len;
    len = put_str(line, len, cap, msg);
    bool cut = len >= cap;
    if (cut) {
        len = put(line, mark, cap, "\"", 1);
        size_t room = cap - len - 2; /* the closing quote, and spare */
        size_t end = drey_log_json_escape(line, len, len + room, msg);
        if (end >= len + room) {
            /* Escape the longest prefix that fits, on a character boundary. */
            char tmp[LOG_LINE_MAX];
            size_t take = strlen(msg);
            if (take > sizeof tmp - 1)
                take = sizeof tmp - 1;
            do {
                take = take * 3 / 4;
                while (take > 0 && ((unsigned char)msg[take] & 0xc0) == 0x80)
                    take--;
                memcpy(tmp, msg, take);
                tmp[take] = '\0';
                end = drey_log_json_escape(line, len, len + room, tmp);
            } while (end >= len + room && take > 0);
        }
        len = put(line, end, cap, "\"", 1);
    }
    for (size_t i = 0; i < n && !cut; i++) {
        if (fields[i].type == DREY_LOG_FIELD_STR && (fields[i].v.s == NULL || fields[i].v.s[0] == '\0') &&
            fields[i].key != NULL && strcmp(fields[i].key, "error") == 0)
            continue;
        size_t mark = len;
        len = put(line, len, cap, ",", 1);
        len = put_str(line, len, cap, fields[i].key);
        len = put(line, len, cap, ":", 1);
        switch (fields[i].type) {
        case DREY_LOG_FIELD_STR: len = put_str(line, len, cap, fields[i].v.s); break;
        case DREY_LOG_FIELD_INT: len = put_fmt(line, len, cap, "%lld", (long long)fields[i].v.i); break;
        case DREY_LOG_FIELD_UINT: len = put_fmt(line, len, cap, "%llu", (unsigned long long)fields[i].v.u); break;
        case DREY_LOG_FIELD_DOUBLE:
            /* JSON has no NaN or infinity. */
            len = isfinite(fields[i].v.d) ? put_fmt(line, len, cap, "%.6g", fields[i].v.d)
                                           : put(line, len, cap, "null", 4);
            break;
        case DREY_LOG_FIELD_BOOL: len = put_fmt(line, len, cap, "%s", fields[i].v.b ? "true" : "false"); break;
        }
        if (len >= cap) {
            len = mark; /* drop the field that did not fit, keep the line valid */
            cut = true;
        }
    }
    if (cut) {
        memcpy(line + len, truncated, sizeof truncated - 1);
        len += sizeof truncated - 1;
    }
    line[len++] = '}';
    line[len++] = '\n';

    const char *p = line;
    while (len > 0) {
        ssize_t w = write(log_fd, p, len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return; /* nowhere left to report it */
        }
        p += w;
        len -= (size_t)w;
    }
}

/* --- clipping ---------------------------------------------------------------- */

size_t drey_log_clip(char *out, size_t cap, const char *s, size_t len) {
    static const char more[] = "...";
    if (cap == 0)
        return 0;
    if (len < cap) {
        memcpy(out, s, len);
        out[len] = '\0';
        return len;
    }
    if (cap <= sizeof more) {
        out[0] = '\0';
        return 0;
    }
    size_t room = cap - sizeof more; /* the text before "...", its NUL counted in sizeof */
    size_t cut = room;
    while (cut > 0 && s[cut] != ' ' && s[cut - 1] != ' ')
        cut--;
    while (cut > 0 && s[cut - 1] == ' ')
        cut--;
    if (cut < room / 2) { /* one long word: cut inside it, on a character boundary */
        cut = room;
        while (cut > 0 && ((unsigned char)s[cut] & 0xc0) == 0x80)
            cut--;
    }
    memcpy(out, s, cut);
    memcpy(out + cut, more, sizeof more);
    return cut + sizeof more - 1;
}

/* --- repeated lines -------------------------------------------------------------- */

typedef struct drey_log_repeat_slot repeat_slot;

static uint64_t text_hash(const char *s) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (; *s != '\0'; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h != 0 ? h : 1;
}

bool drey_log_repeat_admit(drey_log_repeat *r, const char *text, int64_t now_ms, uint64_t *repeated) {
    uint64_t h = text_hash(text != NULL ? text : "");
    *repeated = 0;
    pthread_mutex_lock(&r->mu);
    repeat_slot *slot = NULL, *oldest = &r->slots[0];
    for (size_t i = 0; i < DREY_LOG_REPEAT_SLOTS && slot == NULL; i++) {
        if (r->slots[i].hash == h)
            slot = &r->slots[i];
        else if (r->slots[i].hash == 0 || (oldest->hash != 0 && r->slots[i].used_ms < oldest->used_ms))
            oldest = &r->slots[i];
    }
    bool admit;
    if (slot == NULL) { /* a text not seen lately: it goes, and is watched from here */
        *oldest = (repeat_slot){.hash = h, .last_ms = now_ms, .used_ms = now_ms};
        admit = true;
    } else if (now_ms - slot->last_ms < r->interval_ms) {
        slot->held++;
        slot->used_ms = now_ms;
        admit = false;
    } else {
        *repeated = slot->held;
        slot->held = 0;
        slot->last_ms = slot->used_ms = now_ms;
        admit = true;
    }
    pthread_mutex_unlock(&r->mu);
    return admit;
}
