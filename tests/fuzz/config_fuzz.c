/*
 * Fuzz target: dreyd's option parsing (src/config): flags and DREY_*
 * environment variables, sizes, durations, booleans, integers and their
 * bounds.
 *
 * The input is NUL-separated strings; byte 0 says how many of them (mod 8)
 * are environment entries, the rest are command-line arguments. Each string
 * is also parsed as a size, as a duration and as a listen address on its
 * own.
 *
 * Properties: a refused command line says why on the error stream; an
 * accepted size or duration is not negative and prints back to the same
 * number; an address taken for loopback (anonymous callers allowed) is
 * "localhost" or a numeric address that getaddrinfo, without resolving
 * names, also finds only on loopback; a parse never leaks (the ASan build
 * checks).
 */
#include <arpa/inet.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/config.h"
#include "fuzz_util.h"

#define MAX_STRINGS 32

static void number_rules(const char *s) {
    int64_t n;
    char again[32];
    if (drey_config_parse_bytes(s, &n)) {
        FUZZ_CHECK(n >= 0, "size %s is %" PRId64, s, n);
        snprintf(again, sizeof again, "%" PRId64, n);
        int64_t m;
        FUZZ_CHECK(drey_config_parse_bytes(again, &m) && m == n, "size %s: %" PRId64 " does not parse back", s, n);
    }
    if (drey_config_parse_duration_ms(s, &n)) {
        FUZZ_CHECK(n >= 0, "duration %s is %" PRId64, s, n);
        snprintf(again, sizeof again, "%" PRId64, n);
        int64_t m;
        FUZZ_CHECK(drey_config_parse_duration_ms(again, &m) && m == n, "duration %s: %" PRId64 " does not parse back",
                   s, n);
    }
}

static bool sockaddr_loopback(const struct sockaddr *sa) {
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)(const void *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6)
        return IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr);
    return false;
}

static void address_rules(const char *s) {
    if (!drey_config_listen_is_loopback(s))
        return;
    const char *colon = strrchr(s, ':');
    size_t n = colon != NULL ? (size_t)(colon - s) : strlen(s);
    char host[256];
    FUZZ_CHECK(n < sizeof host, "a %zu-byte host taken for loopback", n);
    memcpy(host, s, n);
    host[n] = '\0';
    if (strcmp(host, "localhost") == 0)
        return;
    char *h = host;
    if (n >= 2 && h[0] == '[' && h[n - 1] == ']') {
        h[n - 1] = '\0';
        h++;
    }
    struct addrinfo hints = {.ai_flags = AI_NUMERICHOST, .ai_socktype = SOCK_STREAM}, *res;
    int rc = getaddrinfo(h, NULL, &hints, &res);
    FUZZ_CHECK(rc == 0, "%s is taken for loopback but is not a numeric address", s);
    for (struct addrinfo *r = res; r != NULL; r = r->ai_next)
        FUZZ_CHECK(sockaddr_loopback(r->ai_addr), "%s is taken for loopback but is not", s);
    freeaddrinfo(res);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1 || size > 4096)
        return 0;
    size_t n_env = data[0] % 8;
    char *text = malloc(size);
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';
    char *strings[MAX_STRINGS];
    size_t n = 0;
    for (char *p = text; n < MAX_STRINGS && p < text + size - 1; p += strlen(p) + 1)
        strings[n++] = p;
    if (n_env > n)
        n_env = n;
    for (size_t i = 0; i < n; i++) {
        number_rules(strings[i]);
        address_rules(strings[i]);
    }

    char *envp[MAX_STRINGS + 1], *argv[MAX_STRINGS + 2];
    for (size_t i = 0; i < n_env; i++)
        envp[i] = strings[i];
    envp[n_env] = NULL;
    int argc = 0;
    argv[argc++] = "dreyd";
    for (size_t i = n_env; i < n; i++)
        argv[argc++] = strings[i];
    argv[argc] = NULL;

    char *msg = NULL;
    size_t msg_len = 0;
    FILE *err = open_memstream(&msg, &msg_len);
    drey_config cfg;
    drey_config_defaults(&cfg);
    drey_config_help help = DREY_CONFIG_HELP_NONE;
    bool ok = drey_config_parse(&cfg, argc, argv, 1, envp, err, &help);
    fclose(err);
    if (!ok)
        FUZZ_CHECK(msg_len > 0, "a refused command line without a message");
    drey_config_free(&cfg);
    free(msg);
    free(text);
    return 0;
}
