/*
 * drey — the command-line client of dreyd, with redis-cli's and etcdctl's
 * habits (docs/cli.md is the reference):
 *
 *   drey [options] COMMAND [ARGS] [options]   one command
 *   drey [options]                            interactive (a terminal) or one command per input line
 *
 * Options come anywhere, as --name value or --name=value, and each also
 * from the environment as DREY_<NAME> (upper case, '-' as '_'); the command
 * line wins. -h/--help works on every command. Output is -o text (default),
 * table or json (out.h). Exit status: 0 done, 1 a call failed, 2 usage,
 * 3 a negative answer (not found, not added, not serving, not ready).
 *
 * The commands are a table (below): a row names the command, its arguments,
 * its options and its function. This file is the command line: the options,
 * the table, parsing, help, the environment and the interactive mode; the
 * commands are in data.c, stream.c, node.c, call.c, cluster.c and drain.c.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <editline/readline.h>

#include "cli.h"
#include "drey/alloc.h"
#include "drey/config.h"
#include "drey/version.h"

/* --- options ------------------------------------------------------------------ */

typedef struct option {
    const char *name;
    char shorthand; /* -o, -h; 0: none */
    bool flag;      /* takes no value (or, with optional, a number) */
    const char *arg;
    const char *help;
} option;

/* Every option of every command: one name, one meaning. */
static const option options[] = {
#define GLOBAL_FIRST 0
    {"addr", 0, false, "HOST:PORT", "node to call; repeat (or --endpoints) for failover (default 127.0.0.1:50051)"},
    {"endpoints", 0, false, "A,B,C", "nodes to call, comma-separated, tried in order"},
    {"cache", 0, false, "NAME", "cache (namespace); default: the default cache"},
    {"token", 0, false, "JWT", "bearer token sent with every call"},
    {"token-file", 0, false, "FILE", "read the bearer token from FILE (surrounding whitespace ignored)"},
    {"timeout", 0, false, "DURATION", "deadline of each call (default 5s; streams: none unless given)"},
    {"tls", 0, true, NULL, "TLS with the system's CA roots (implied by any --tls-* option)"},
    {"tls-ca", 0, false, "FILE", "PEM CA that signs the node's certificate"},
    {"tls-cert", 0, false, "FILE", "PEM client certificate, for mutual TLS"},
    {"tls-key", 0, false, "FILE", "PEM key of --tls-cert"},
    {"tls-server-name", 0, false, "NAME", "name to check in the node's certificate (default: the address's host)"},
    {"output", 'o', false, "FORMAT", "text (default), table or json"},
    {"help", 'h', true, NULL, "this help, or the command's"},
#define GLOBAL_COUNT 13
    {"version", 0, true, NULL, "print the version and exit"},
    {"ttl", 0, false, "DURATION", "time to live (250ms, 5s, 2m, 1h)"},
    {"if-version", 0, false, "N", "only if the entry's version is N (0: only if absent)"},
    {"int", 0, true, NULL, "VALUE is an int64"},
    {"json", 0, true, NULL, "VALUE is a JSON object"},
    {"file", 0, true, NULL, "VALUE names a file whose bytes are the value"},
    {"values", 0, true, NULL, "include values"},
    {"prefix", 0, false, "P", "keys starting with P (watch); the cluster's prefix in etcd (cluster: default drey/)"},
    {"count", 0, false, "N", "stop after N events"},
    {"etcd", 0, false, "URLS", "etcd endpoints, comma-separated http(s)://host:port (default $DREY_CLUSTER_ETCD)"},
    {"etcd-ca", 0, false, "FILE", "PEM CA of etcd's https endpoints (default $DREY_CLUSTER_ETCD_CA)"},
    {"etcd-cert", 0, false, "FILE", "PEM client certificate for etcd (default $DREY_CLUSTER_ETCD_CERT)"},
    {"etcd-key", 0, false, "FILE", "PEM key of --etcd-cert (default $DREY_CLUSTER_ETCD_KEY)"},
    {"etcd-user", 0, false, "NAME", "etcd user, with --etcd-password-file (default $DREY_CLUSTER_ETCD_USER)"},
    {"etcd-password-file", 0, false, "FILE", "the etcd user's password (default $DREY_CLUSTER_ETCD_PASSWORD_FILE)"},
    {"ops", 0, false, "HOST:PORT", "dreyd's ops listener (default $DREY_OPS_LISTEN): ready reads its details there (no "
                                   "token from loopback); drain is done once it closes"},
    {"partitions", 0, true, "[N]", "cluster init: partition count (default 256); cluster status: list every partition"},
    {"replication-factor", 0, false, "N", "copies of each partition, 1 to 3 (default 2)"},
    {"initial-nodes", 0, false, "N", "members the controller waits for before the first assignment (default 1)"},
    {"pid", 0, false, "N", "dreyd's process id (default 1: the container's entry point)"},
    {"pid-file", 0, false, "FILE", "read dreyd's process id from FILE"},
    {"wait", 0, false, "DURATION", "give up after this long (default 60s)"},
    {"stdin", 0, true, NULL, "read the request JSON from standard input"},
};
#define N_OPTIONS (sizeof options / sizeof options[0])

static int option_index(const char *name, size_t len) {
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (strlen(options[i].name) == len && strncmp(options[i].name, name, len) == 0)
            return (int)i;
    return -1;
}

const char *drey_cli_opt(const drey_cli *c, const char *name) {
    int i = option_index(name, strlen(name));
    return i >= 0 ? c->opt[i] : NULL;
}

/* --- words ---------------------------------------------------------------------------- */

/* Splits a line into words: whitespace separates, '...' and "..." quote
 * (backslash escapes inside "..." and outside quotes). Returns the count,
 * -1 on an unclosed quote. Words point into the returned buffer. */
int drey_cli_split_words(const char *line, char ***words_out, char **buf_out) {
    size_t n = strlen(line);
    char *buf = drey_xmalloc(n + 1), *o = buf;
    char **words = drey_xcalloc(n / 2 + 2, sizeof *words);
    int count = 0;
    const char *p = line;
    while (*p != '\0') {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
            p++;
        if (*p == '\0')
            break;
        words[count++] = o;
        while (*p != '\0' && *p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
            if (*p == '\'' || *p == '"') {
                char q = *p++;
                while (*p != '\0' && *p != q) {
                    if (q == '"' && *p == '\\' && p[1] != '\0')
                        p++;
                    *o++ = *p++;
                }
                if (*p != q) {
                    free(buf);
                    free(words);
                    return -1;
                }
                p++;
            } else {
                if (*p == '\\' && p[1] != '\0')
                    p++;
                *o++ = *p++;
            }
        }
        *o++ = '\0';
    }
    *words_out = words;
    *buf_out = buf;
    return count;
}

/* --- the command table ----------------------------------------------------------------- */

static int cmd_version(drey_cli *c, char **a) {
    (void)a;
    if (c->format == DREY_OUT_JSON) {
        json_t *doc = json_pack("{ssssss}", "version", drey_version(), "revision", drey_version_revision(), "build",
                                drey_version_build());
        drey_out_json_line(stdout, doc);
        json_decref(doc);
    } else {
        drey_version_print(stdout, "drey");
    }
    return DREY_EXIT_OK;
}

typedef struct command {
    const char *name, *sub; /* "cluster", "status" */
    int min_args, max_args; /* -1: any number */
    const char *options;    /* the command's own, space-separated */
    bool connects;          /* needs the node (connection options apply) */
    int (*run)(drey_cli *c, char **args);
    const char *synopsis;
    const char *help;
} command;

#define VALUE_OPTS "ttl int json file"

static const command commands[] = {
    {"get", NULL, 1, 1, "", true, drey_cli_cmd_get, "get KEY", "print the value (exit 3: not found)"},
    {"mget", NULL, 1, -1, "", true, drey_cli_cmd_mget, "mget KEY...", "the values of several keys, in order (absent: empty)"},
    {"set", NULL, 2, 2, VALUE_OPTS " if-version", true, drey_cli_cmd_set, "set KEY VALUE [--ttl D] [--if-version N]",
     "store a value; prints its version and expiry (--if-version 0: only if absent)"},
    {"mset", NULL, 2, -1, VALUE_OPTS, true, drey_cli_cmd_mset, "mset KEY VALUE [KEY VALUE...] [--ttl D]",
     "store several values at once (atomically)"},
    {"add", NULL, 2, 2, VALUE_OPTS, true, drey_cli_cmd_add, "add KEY VALUE [--ttl D]", "store only if absent (exit 3: it exists)"},
    {"del", NULL, 1, -1, "", true, drey_cli_cmd_del, "del KEY...", "remove keys; prints which were removed (exit 3: none)"},
    {"rm", NULL, 1, 1, "if-version", true, drey_cli_cmd_rm, "rm KEY [--if-version N]", "remove one key, optionally only at a version"},
    {"exists", NULL, 1, -1, "", true, drey_cli_cmd_exists, "exists KEY...", "whether each key is live (exit 3: not all)"},
    {"incr", NULL, 1, 2, "ttl", true, drey_cli_cmd_incr, "incr KEY [DELTA] [--ttl D]",
     "add DELTA (default 1) to an int64, created from 0 (--ttl applies on creation)"},
    {"expire", NULL, 2, 2, "", true, drey_cli_cmd_expire, "expire KEY TTL", "give a live key a new time to live"},
    {"touch", NULL, 2, 2, "", true, drey_cli_cmd_expire, "touch KEY TTL", "the same as expire"},
    {"ttl", NULL, 1, 1, "", true, drey_cli_cmd_ttl, "ttl KEY", "the time left and the expiry (\"none\" without one)"},
    {"persist", NULL, 1, 1, "", true, drey_cli_cmd_persist, "persist KEY", "drop a key's expiry (exit 3: none to drop)"},
    {"scan", NULL, 0, 1, "values", true, drey_cli_cmd_scan, "scan [PREFIX] [--values]",
     "every live key of the cache (under PREFIX), with version and expiry, and values with --values"},
    {"clear", NULL, 0, 0, "", true, drey_cli_cmd_clear, "clear", "remove every entry of the cache (--cache)"},
    {"stats", NULL, 0, 0, "", true, drey_cli_cmd_stats, "stats",
     "entries, bytes and evictions of the --cache or of every cache (each partition counted once)"},
    {"watch", NULL, 0, -1, "prefix values count", true, drey_cli_cmd_watch, "watch [KEY...] [--prefix P] [--values] [--count N]",
     "print changes as they happen until interrupted (keys, a prefix or the whole cache)"},
    {"pipeline", NULL, 0, 0, "", true, drey_cli_cmd_pipeline, "pipeline",
     "operations from standard input, one a line (get, set, add, rm, del, mget, exists, incr, expire, persist, ttl), "
     "sent on one Pipeline stream; answers in order"},
    {"health", NULL, 0, 1, "", true, drey_cli_cmd_health, "health [SERVICE]", "grpc.health.v1 Check (exit 3: not SERVING)"},
    {"ready", NULL, 0, 0, "ops", true, drey_cli_cmd_ready, "ready [--ops HOST:PORT]",
     "readiness details, one field a line (exit 3: not ready); from the ops listener with --ops"},
    {"snapshot", NULL, 0, 0, "", true, drey_cli_cmd_snapshot, "snapshot", "write a snapshot now and compact the journal"},
    {"call", NULL, 1, 2, "stdin", true, drey_cli_cmd_call, "call SERVICE/METHOD [JSON|-] [--stdin]",
     "call any method through server reflection; request and answers in JSON"},
    {"list", NULL, 0, 1, "", true, drey_cli_cmd_list, "list [SERVICE]", "the services the node serves, or a service's methods"},
    {"describe", NULL, 1, 1, "", true, drey_cli_cmd_describe, "describe SYMBOL", "a service, message or enum, as reflection has it"},
    {"cluster", "status", 0, 0, "etcd etcd-ca etcd-cert etcd-key etcd-user etcd-password-file prefix partitions", true,
     drey_cli_cluster_status,
     "cluster status [--etcd URLS] [--partitions]",
     "members, partitions and moves, from any node (--addr) or from etcd (--etcd)"},
    {"cluster", "init", 0, 0, "etcd etcd-ca etcd-cert etcd-key etcd-user etcd-password-file prefix partitions replication-factor initial-nodes",
     false, drey_cli_cluster_init,
     "cluster init --etcd URLS [--partitions N] [--replication-factor N] [--initial-nodes N]",
     "create a cluster's config in etcd (once; the same again is fine)"},
    {"drain", NULL, 0, 0, "pid pid-file wait ops", false, drey_cli_drain,
     "drain [--pid N | --pid-file F] [--wait D] [--ops HOST:PORT]",
     "SIGTERM dreyd and wait until it has drained: exited, or closed its ops listener (a preStop hook)"},
    {"version", NULL, 0, 0, "", false, cmd_version, "version", "this drey's version, git revision and build"},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static bool command_takes(const command *cmd, const char *opt) {
    size_t n = strlen(opt);
    for (const char *p = cmd->options; (p = strstr(p, opt)) != NULL; p += n)
        if ((p == cmd->options || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0'))
            return true;
    return false;
}

static void env_name(const char *opt, char *out, size_t cap) {
    size_t j = (size_t)snprintf(out, cap, "DREY_");
    for (; *opt != '\0' && j + 1 < cap; opt++)
        out[j++] = *opt == '-' ? '_' : (char)toupper((unsigned char)*opt);
    out[j] = '\0';
}

static void print_option(FILE *out, const option *o) {
    char env[64], left[96];
    env_name(o->name, env, sizeof env);
    if (o->shorthand)
        snprintf(left, sizeof left, "-%c, --%s%s%s", o->shorthand, o->name, o->arg ? " " : "", o->arg ? o->arg : "");
    else
        snprintf(left, sizeof left, "--%s%s%s", o->name, o->arg ? " " : "", o->arg ? o->arg : "");
    fprintf(out, "  %-30s %s [%s]\n", left, o->help, env);
}

static void usage(FILE *out) {
    fprintf(out, "usage: drey [OPTIONS] COMMAND [ARGS] [OPTIONS]\n"
                 "       drey [OPTIONS]            interactive, or one command per line of standard input\n\n"
                 "Commands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++)
        fprintf(out, "  %-48s %s\n", commands[i].synopsis, commands[i].help);
    fprintf(out, "\nOptions (every one also from the environment variable in brackets):\n");
    for (size_t i = GLOBAL_FIRST; i < GLOBAL_COUNT; i++)
        print_option(out, &options[i]);
    print_option(out, &options[option_index("version", 7)]);
    fprintf(out, "\nOptions take a value as --name value or --name=value; -- ends them. A command's own\n"
                 "options are in `drey COMMAND --help`. Durations: 250ms, 5s, 2m, 1h.\n\n"
                 "Exit status:\n"
                 "  0  done\n"
                 "  1  a call failed (server error, unreachable, deadline): code, reason, details on stderr\n"
                 "  2  usage: the command line is wrong\n"
                 "  3  a negative answer: not found, not added, none removed, not all exist, not SERVING,\n"
                 "     not ready\n\n"
                 "docs/cli.md is the reference.\n");
}

static void command_usage(FILE *out, const command *cmd) {
    fprintf(out, "usage: drey %s\n\n%s.\n", cmd->synopsis, cmd->help);
    if (cmd->options[0] != '\0') {
        fprintf(out, "\nOptions:\n");
        for (size_t i = 0; i < N_OPTIONS; i++)
            if (command_takes(cmd, options[i].name))
                print_option(out, &options[i]);
    }
    if (strcmp(cmd->name, "set") == 0 || strcmp(cmd->name, "add") == 0 || strcmp(cmd->name, "mset") == 0)
        fprintf(out, "\nVALUE is a string; --int sends an int64, --json a JSON object, --file the bytes of the\n"
                     "file VALUE names.\n");
    fprintf(out, "\nGlobal options (drey --help): --addr, --endpoints, --cache, --token, --token-file, --timeout,\n"
                 "--tls, --tls-ca, --tls-cert, --tls-key, --tls-server-name, -o/--output.\n");
}

/* --- the command line ------------------------------------------------------------------ */

typedef struct parsed {
    const char *opt[N_OPTIONS];
    const char *addrs[DREY_CLI_MAX_ENDPOINTS];
    size_t n_addrs;
    char **pos;
    int n_pos;
} parsed;

/* Options anywhere, "--" ends them; false with a message on stderr. */
static bool parse_args(int argc, char **argv, parsed *p) {
    memset(p, 0, sizeof *p);
    p->pos = drey_xcalloc((size_t)argc + 1, sizeof *p->pos);
    bool done = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (done || a[0] != '-' || a[1] == '\0' || (a[1] != '-' && !(a[1] == 'o' || a[1] == 'h'))) {
            p->pos[p->n_pos++] = argv[i];
            continue;
        }
        if (strcmp(a, "--") == 0) {
            done = true;
            continue;
        }
        int k;
        const char *value = NULL;
        if (a[1] != '-') { /* -o json, -ojson, -h */
            k = option_index(a[1] == 'o' ? "output" : "help", a[1] == 'o' ? 6 : 4);
            if (a[2] != '\0')
                value = a + 2;
        } else {
            const char *eq = strchr(a + 2, '=');
            size_t n = eq != NULL ? (size_t)(eq - a - 2) : strlen(a + 2);
            k = option_index(a + 2, n);
            if (eq != NULL)
                value = eq + 1;
        }
        if (k < 0) {
            fprintf(stderr, "drey: unknown option %s (drey --help lists them)\n", a);
            return false;
        }
        const option *o = &options[k];
        /* --partitions alone (cluster status) or with a number (cluster init). */
        if (strcmp(o->name, "partitions") == 0 && value == NULL && i + 1 < argc && argv[i + 1][0] >= '0' &&
            argv[i + 1][0] <= '9')
            value = argv[++i];
        bool optional = strcmp(o->name, "partitions") == 0;
        if (o->flag && value != NULL && !optional) {
            fprintf(stderr, "drey: --%s takes no value\n", o->name);
            return false;
        }
        if (!o->flag && !optional && value == NULL) {
            if (i + 1 >= argc) {
                fprintf(stderr, "drey: --%s needs a value (--%s VALUE or --%s=VALUE)\n", o->name, o->name, o->name);
                return false;
            }
            value = argv[++i];
        }
        if (strcmp(o->name, "addr") == 0) {
            if (p->n_addrs == DREY_CLI_MAX_ENDPOINTS) {
                fprintf(stderr, "drey: at most %d endpoints\n", DREY_CLI_MAX_ENDPOINTS);
                return false;
            }
            p->addrs[p->n_addrs++] = value;
        }
        p->opt[k] = value != NULL ? value : "";
    }
    return true;
}

static const command *find_command(char **pos, int n_pos, int *used) {
    if (n_pos == 0)
        return NULL;
    const command *best = NULL;
    for (size_t i = 0; i < N_COMMANDS; i++) {
        if (strcmp(commands[i].name, pos[0]) != 0)
            continue;
        if (commands[i].sub == NULL) {
            *used = 1;
            return &commands[i];
        }
        if (n_pos >= 2 && strcmp(commands[i].sub, pos[1]) == 0) {
            *used = 2;
            return &commands[i];
        }
        best = &commands[i];
    }
    if (best != NULL)
        *used = 1; /* "cluster" alone: its help */
    return best;
}

static char *env_value(const option *o) {
    char env[64];
    env_name(o->name, env, sizeof env);
    return getenv(env);
}

/* The environment fills what the command line did not say. */
static void apply_env(parsed *p, const command *cmd) {
    for (size_t k = 0; k < N_OPTIONS; k++) {
        const option *o = &options[k];
        bool applies = k < GLOBAL_COUNT ? strcmp(o->name, "help") != 0 : cmd != NULL && command_takes(cmd, o->name);
        if (!applies || p->opt[k] != NULL)
            continue;
        const char *v = env_value(o);
        if (v == NULL || (o->flag && !(strcmp(v, "1") == 0 || strcmp(v, "true") == 0 || strcmp(v, "yes") == 0)))
            continue;
        if (strcmp(o->name, "addr") == 0 && p->n_addrs > 0)
            continue;
        p->opt[k] = o->flag ? "" : v;
        if (strcmp(o->name, "addr") == 0 && v[0] != '\0')
            p->addrs[p->n_addrs++] = v;
    }
}

static char *trimmed_file(const char *path) {
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return NULL;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getdelim(&line, &cap, '\0', f);
    fclose(f);
    if (n < 0) {
        free(line);
        return drey_xstrdup("");
    }
    char *s = line;
    while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
        s++;
    size_t len = strlen(s);
    while (len > 0 && (s[len - 1] == ' ' || s[len - 1] == '\t' || s[len - 1] == '\n' || s[len - 1] == '\r'))
        len--;
    char *out = drey_xmalloc(len + 1);
    memcpy(out, s, len);
    out[len] = '\0';
    free(line);
    return out;
}

/* --timeout, for the command line and for each interactive line; false
 * (message printed) when it is not a duration. */
static bool set_timeout(drey_cli *c, const parsed *p) {
    const char *t = p->opt[option_index("timeout", 7)];
    c->timeout_ms = 5000;
    c->timeout_given = t != NULL;
    if (t != NULL && !drey_config_parse_duration_ms(t, &c->timeout_ms)) {
        fprintf(stderr, "drey: --timeout: expected a duration (250ms, 5s, 2m, 1h)\n");
        return false;
    }
    return true;
}

/* Connection settings from the parsed options; false (message printed) when
 * they are wrong. */
static bool setup_connection(drey_cli *c, parsed *p) {
    c->n_endpoints = 0;
    for (size_t i = 0; i < p->n_addrs; i++)
        c->endpoints[c->n_endpoints++] = p->addrs[i];
    const char *eps = p->opt[option_index("endpoints", 9)];
    if (eps != NULL && c->n_endpoints == 0) {
        free(c->endpoints_buf);
        c->endpoints_buf = drey_xstrdup(eps);
        for (char *save = NULL, *t = strtok_r(c->endpoints_buf, ",", &save); t != NULL && c->n_endpoints < DREY_CLI_MAX_ENDPOINTS;
             t = strtok_r(NULL, ",", &save))
            c->endpoints[c->n_endpoints++] = t;
    }
    if (c->n_endpoints == 0)
        c->endpoints[c->n_endpoints++] = "127.0.0.1:50051";
    const char *tf = p->opt[option_index("token-file", 10)];
    free(c->token);
    c->token = NULL;
    if (tf != NULL) {
        if ((c->token = trimmed_file(tf)) == NULL) {
            fprintf(stderr, "drey: --token-file %s: %s\n", tf, strerror(errno));
            return false;
        }
    } else if (p->opt[option_index("token", 5)] != NULL) {
        c->token = drey_xstrdup(p->opt[option_index("token", 5)]);
    }
    c->copts = (drey_client_options){
        .max_recv_message_bytes = -1, /* the server's limits apply, not ours */
        .tls = p->opt[option_index("tls", 3)] != NULL,
        .tls_ca = p->opt[option_index("tls-ca", 6)],
        .tls_cert = p->opt[option_index("tls-cert", 8)],
        .tls_key = p->opt[option_index("tls-key", 7)],
        .tls_server_name = p->opt[option_index("tls-server-name", 15)],
    };
    return set_timeout(c, p);
}

static bool same_connection(const drey_cli *c, const parsed *p) {
    (void)c;
    static const char *const conn[] = {"addr", "endpoints", "token", "token-file", "tls", "tls-ca", "tls-cert",
                                       "tls-key", "tls-server-name"};
    for (size_t i = 0; i < sizeof conn / sizeof conn[0]; i++)
        if (p->opt[option_index(conn[i], strlen(conn[i]))] != NULL)
            return false;
    return true;
}

/* Runs one command line (argv without the program's name). base: the
 * options of drey's own command line, when this is a line of the
 * interactive mode (they apply unless the line says otherwise; connection
 * options belong to the command line only). */
static int run_line(drey_cli *c, int argc, char **argv, const parsed *base, bool *quit) {
    parsed p;
    int rc = DREY_EXIT_USAGE;
    if (!parse_args(argc, argv, &p))
        goto out;
    if (base != NULL) {
        if (!same_connection(c, &p)) {
            fprintf(stderr, "drey: connection options go on drey's command line, not on an interactive line\n");
            goto out;
        }
        for (size_t k = 0; k < N_OPTIONS; k++)
            if (p.opt[k] == NULL && k < GLOBAL_COUNT && strcmp(options[k].name, "help") != 0)
                p.opt[k] = base->opt[k];
    }
    int used = 0;
    const command *cmd = find_command(p.pos, p.n_pos, &used);
    if (base == NULL)
        apply_env(&p, cmd);
    bool help = p.opt[option_index("help", 4)] != NULL;
    if (p.n_pos > 0 && strcmp(p.pos[0], "help") == 0) {
        help = true;
        cmd = find_command(p.pos + 1, p.n_pos - 1, &used);
        if (p.n_pos > 1 && cmd == NULL) {
            fprintf(stderr, "drey: unknown command \"%s\" (drey --help lists them)\n", p.pos[1]);
            goto out;
        }
    }
    if (quit != NULL && p.n_pos == 1 && (strcmp(p.pos[0], "quit") == 0 || strcmp(p.pos[0], "exit") == 0)) {
        *quit = true;
        rc = DREY_EXIT_OK;
        goto out;
    }
    if (help) {
        if (cmd != NULL && cmd->sub != NULL && used == 1) {
            for (size_t i = 0; i < N_COMMANDS; i++)
                if (strcmp(commands[i].name, cmd->name) == 0)
                    fprintf(stdout, "usage: drey %s\n       %s\n", commands[i].synopsis, commands[i].help);
        } else if (cmd != NULL) {
            command_usage(stdout, cmd);
        } else {
            usage(stdout);
        }
        rc = DREY_EXIT_OK;
        goto out;
    }
    const char *fmt = p.opt[option_index("output", 6)];
    c->format = DREY_OUT_TEXT;
    if (fmt != NULL && !drey_out_parse_format(fmt, &c->format)) {
        fprintf(stderr, "drey: -o: expected text, table or json\n");
        goto out;
    }
    if (p.opt[option_index("version", 7)] != NULL && (cmd == NULL || cmd->run == cmd_version)) {
        rc = cmd_version(c, NULL);
        goto out;
    }
    if (cmd == NULL) {
        if (p.n_pos == 0)
            usage(stderr);
        else
            fprintf(stderr, "drey: unknown command \"%s\" (drey --help lists them)\n", p.pos[0]);
        goto out;
    }
    if (cmd->sub != NULL && used == 1) {
        fprintf(stderr, "drey: %s needs a subcommand:\n", cmd->name);
        for (size_t i = 0; i < N_COMMANDS; i++)
            if (strcmp(commands[i].name, cmd->name) == 0)
                fprintf(stderr, "  drey %s\n", commands[i].synopsis);
        goto out;
    }
    for (size_t k = GLOBAL_COUNT; k < N_OPTIONS; k++) {
        if (p.opt[k] != NULL && !command_takes(cmd, options[k].name)) {
            fprintf(stderr, "drey: %s does not take --%s (drey %s --help)\n", cmd->name, options[k].name, cmd->name);
            goto out;
        }
    }
    int n_args = p.n_pos - used;
    if (n_args < cmd->min_args || (cmd->max_args >= 0 && n_args > cmd->max_args)) {
        fprintf(stderr, "usage: drey %s\n", cmd->synopsis);
        goto out;
    }
    if ((p.opt[option_index("int", 3)] != NULL) + (p.opt[option_index("json", 4)] != NULL) +
            (p.opt[option_index("file", 4)] != NULL) >
        1) {
        fprintf(stderr, "drey: --int, --json and --file exclude each other\n");
        goto out;
    }
    c->cache = p.opt[option_index("cache", 5)] != NULL ? p.opt[option_index("cache", 5)] : "";
    c->opt = p.opt;
    if (base == NULL && !setup_connection(c, &p))
        goto out;
    if (base != NULL && !set_timeout(c, &p))
        goto out;
    rc = cmd->run(c, p.pos + used);
    fflush(stdout);
    c->opt = NULL;
    drey_arena_reset(&c->arena);
out:
    free(p.pos);
    return rc;
}

/* --- interactive ----------------------------------------------------------------------- */

static char *history_path(void) {
    const char *h = getenv("DREY_HISTFILE");
    if (h != NULL)
        return h[0] != '\0' ? drey_xstrdup(h) : NULL;
    const char *home = getenv("HOME");
    if (home == NULL || home[0] == '\0')
        return NULL;
    size_t n = strlen(home) + 32;
    char *p = drey_xmalloc(n);
    snprintf(p, n, "%s/.drey_history", home);
    return p;
}

/* Lines of commands: with a prompt, line editing and history on a terminal
 * (as redis-cli), plainly from a pipe or file. The exit status is the last
 * command's. */
static int interactive(drey_cli *c, const parsed *base) {
    bool tty = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
    char *hist = tty ? history_path() : NULL;
    char prompt[300];
    if (tty) {
        using_history();
        stifle_history(1000);
        if (hist != NULL)
            read_history(hist);
        snprintf(prompt, sizeof prompt, "%s> ", c->endpoints[0]);
        printf("drey %s connected to %s; help lists the commands, quit leaves\n", drey_version(), c->endpoints[0]);
    }
    int rc = DREY_EXIT_OK;
    bool quit = false;
    char *line = NULL;
    size_t cap = 0;
    while (!quit) {
        char *text;
        if (tty) {
            if ((text = readline(prompt)) == NULL)
                break;
        } else {
            if (getline(&line, &cap, stdin) < 0)
                break;
            text = line;
        }
        char **w, *buf;
        int n = drey_cli_split_words(text, &w, &buf);
        if (n < 0) {
            fprintf(stderr, "drey: unclosed quote\n");
            rc = DREY_EXIT_USAGE;
        } else if (n > 0 && w[0][0] != '#') {
            if (tty)
                add_history(text);
            rc = run_line(c, n, w, base, &quit);
        }
        if (n >= 0) {
            free(w);
            free(buf);
        }
        if (tty)
            free(text);
    }
    free(line);
    if (tty && hist != NULL)
        write_history(hist);
    free(hist);
    return rc;
}

int main(int argc, char **argv) {
    drey_cli c;
    memset(&c, 0, sizeof c);
    drey_arena_init(&c.arena, NULL, 0);
    drey_cli_signals_start();
    parsed p;
    int rc = DREY_EXIT_USAGE;
    if (!parse_args(argc - 1, argv + 1, &p)) {
        free(p.pos);
        goto out;
    }
    if (p.n_pos > 0 || p.opt[option_index("help", 4)] != NULL || p.opt[option_index("version", 7)] != NULL) {
        free(p.pos);
        rc = run_line(&c, argc - 1, argv + 1, NULL, NULL);
        goto out;
    }
    /* No command: the interactive mode, with these options for every line. */
    apply_env(&p, NULL);
    const char *fmt = p.opt[option_index("output", 6)];
    if ((fmt != NULL && !drey_out_parse_format(fmt, &c.format)) || !setup_connection(&c, &p)) {
        if (fmt != NULL && !drey_out_parse_format(fmt, &c.format))
            fprintf(stderr, "drey: -o: expected text, table or json\n");
        free(p.pos);
        goto out;
    }
    rc = interactive(&c, &p);
    free(p.pos);
out:
    drey_client_close(c.client);
    free(c.token);
    free(c.endpoints_buf);
    drey_arena_destroy(&c.arena);
    drey_cli_signals_stop();
    return rc;
}
