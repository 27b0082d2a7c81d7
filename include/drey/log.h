/*
 * log — one JSON object per line on stderr.
 *
 *   DREY_LOG_INFO("listening", DREY_LOG_STR("address", addr), DREY_LOG_INT("port", p));
 *
 * prints {"time":"2026-11-30T02:03:04.123Z","level":"info","msg":"listening",
 * "address":"127.0.0.1","port":50051}. Lines are written with one write(2) so
 * concurrent threads never interleave. Callers must never pass cache keys,
 * values or tokens as fields: logs leave the node. A field named "error"
 * whose value is empty (or NULL) is left out: "error":"" says nothing.
 */
#ifndef DREY_LOG_H
#define DREY_LOG_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
    DREY_LOG_LEVEL_DEBUG = 0,
    DREY_LOG_LEVEL_INFO,
    DREY_LOG_LEVEL_WARN,
    DREY_LOG_LEVEL_ERROR,
} drey_log_level;

typedef enum {
    DREY_LOG_FIELD_STR,
    DREY_LOG_FIELD_INT,
    DREY_LOG_FIELD_UINT,
    DREY_LOG_FIELD_DOUBLE,
    DREY_LOG_FIELD_BOOL,
} drey_log_field_type;

typedef struct drey_log_field {
    const char *key;
    drey_log_field_type type;
    union {
        const char *s;
        int64_t i;
        uint64_t u;
        double d;
        bool b;
    } v;
} drey_log_field;

#define DREY_LOG_STR(k, x) ((drey_log_field){.key = (k), .type = DREY_LOG_FIELD_STR, .v.s = (x)})
#define DREY_LOG_INT(k, x) ((drey_log_field){.key = (k), .type = DREY_LOG_FIELD_INT, .v.i = (int64_t)(x)})
#define DREY_LOG_UINT(k, x) ((drey_log_field){.key = (k), .type = DREY_LOG_FIELD_UINT, .v.u = (uint64_t)(x)})
#define DREY_LOG_DOUBLE(k, x) ((drey_log_field){.key = (k), .type = DREY_LOG_FIELD_DOUBLE, .v.d = (double)(x)})
#define DREY_LOG_BOOL(k, x) ((drey_log_field){.key = (k), .type = DREY_LOG_FIELD_BOOL, .v.b = (x)})

#define DREY_LOG_(level, msg, ...)                                                                  \
    do {                                                                                            \
        if ((level) >= drey_log_min_level) {                                                        \
            const drey_log_field drey_log_fields_[] = {{.key = NULL} __VA_OPT__(, ) __VA_ARGS__};   \
            drey_log_emit((level), (msg), drey_log_fields_ + 1,                                     \
                          sizeof drey_log_fields_ / sizeof drey_log_fields_[0] - 1);                \
        }                                                                                           \
    } while (0)

#define DREY_LOG_DEBUG(msg, ...) DREY_LOG_(DREY_LOG_LEVEL_DEBUG, msg __VA_OPT__(, ) __VA_ARGS__)
#define DREY_LOG_INFO(msg, ...) DREY_LOG_(DREY_LOG_LEVEL_INFO, msg __VA_OPT__(, ) __VA_ARGS__)
#define DREY_LOG_WARN(msg, ...) DREY_LOG_(DREY_LOG_LEVEL_WARN, msg __VA_OPT__(, ) __VA_ARGS__)
#define DREY_LOG_ERROR(msg, ...) DREY_LOG_(DREY_LOG_LEVEL_ERROR, msg __VA_OPT__(, ) __VA_ARGS__)

extern drey_log_level drey_log_min_level;

/* Parses "debug", "info", "warn" or "error"; false if s is none of them. */
bool drey_log_parse_level(const char *s, drey_log_level *out);
void drey_log_set_level(drey_log_level level);

/* Where lines go (default 2, stderr); tests point it at a pipe or file. */
void drey_log_set_fd(int fd);

void drey_log_emit(drey_log_level level, const char *msg, const drey_log_field *fields, size_t n);

/* Copies the first len bytes of s into out (cap bytes, NUL-terminated),
 * for a message in a fixed-size buffer: when they do not fit it is cut
 * after the last whole word that leaves room for "..." (mid-word only when
 * a single word fills half the room or more), never inside a UTF-8
 * character. Returns the length written. */
size_t drey_log_clip(char *out, size_t cap, const char *s, size_t len);

/* Repeated lines: the same text (another library's error, retried three
 * times a second) at most once per interval. Keeps the last
 * DREY_LOG_REPEAT_SLOTS distinct texts; thread-safe. */
#define DREY_LOG_REPEAT_SLOTS 64
typedef struct drey_log_repeat {
    pthread_mutex_t mu;
    int64_t interval_ms;
    struct drey_log_repeat_slot {
        uint64_t hash;   /* 0: free */
        int64_t last_ms; /* when it last went out */
        int64_t used_ms; /* when it was last seen: the oldest goes first */
        uint64_t held;   /* held back since */
    } slots[DREY_LOG_REPEAT_SLOTS];
} drey_log_repeat;
/* A static one: static drey_log_repeat r = DREY_LOG_REPEAT_INIT(10000); */
#define DREY_LOG_REPEAT_INIT(ms) {.mu = PTHREAD_MUTEX_INITIALIZER, .interval_ms = (ms)}
/* Whether a line of text may go out at now_ms; when it may, *repeated is
 * how many times the same text was held back since it last went (0: none:
 * the line then says "repeated": K). */
bool drey_log_repeat_admit(drey_log_repeat *r, const char *text, int64_t now_ms, uint64_t *repeated);

/* Appends s to buf as a JSON string body (no quotes), escaping as RFC 8259
 * requires; returns the new length or cap if it did not fit. Exposed for the
 * other JSON writers (readiness details). */
size_t drey_log_json_escape(char *buf, size_t len, size_t cap, const char *s);

#endif
