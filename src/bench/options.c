/*
 * options — drey-bench's command line. Every option is --name=value; sizes
 * and durations take the units dreyd's options do (256, 4KiB; 500ms, 10s).
 * Every option is also DREY_<NAME> in the environment.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/alloc.h"
#include "bench.h"
#include "drey/version.h"
#include "drey/config.h"

static const char usage[] =
    "usage: drey-bench [--option=value | --option value ...]   (drey-bench --version: the build)\n"
    "\n"
    "A closed-loop load generator: every connection keeps --streams calls in flight and starts\n"
    "a new one as soon as one finishes. Prints throughput, latency percentiles and errors by\n"
    "status code and ErrorInfo reason.\n"
    "\n"
    "Load\n"
    "  --target=HOST:PORT     server (default 127.0.0.1:50051)\n"
    "  --connections=N        connections, one thread each (default 1)\n"
    "  --streams=N            calls in flight per connection (default 1)\n"
    "  --duration=D           measured time after the warmup (default 10s)\n"
    "  --warmup=D             calls finishing in it are not measured (default 1s)\n"
    "  --count=N              stop after N calls in all instead (no warmup; a sequential\n"
    "                         distribution stops after one pass over the keys anyway)\n"
    "  --timeout=D            deadline of every call (default 10s)\n"
    "  --pipeline=N           send the operations through drey.cache.v1.Cache/Pipeline: each\n"
    "                         connection has one stream (with --cluster one per owner, each\n"
    "                         operation on its owner's) and sends N operations in one message,\n"
    "                         then waits for their N results (as redis-benchmark -P N does);\n"
    "                         latency is the batch's; --streams is ignored\n"
    "  --cluster              --target is a seed node of a drey cluster: read its table\n"
    "                         (WatchTopology; the run waits for it) and send every call to\n"
    "                         the node owning its key, one connection per node per thread\n"
    "\n"
    "Workload\n"
    "  --mix=OP:W,...         operations and weights: get, set, add, increment, remove,\n"
    "                         health (grpc.health.v1.Health/Check) (default get:1)\n"
    "  --keys=N               key space (default 100000)\n"
    "  --key-bytes=N          key length: \"k\" and the zero-padded index (default 8);\n"
    "                         increment uses \"c\" instead of \"k\" so counters never meet bytes\n"
    "  --distribution=NAME    uniform, zipf or sequential (default uniform)\n"
    "  --zipf-s=X             zipf exponent (default 0.99)\n"
    "  --value-bytes=N        bytes_value size of set and add (default 256)\n"
    "  --cache=NAME           cache (namespace) of every call (default: the default cache)\n"
    "  --ttl=D                writes carry this ttl (default: none)\n"
    "  --request-ids          writes carry a unique request_id (idempotent retries)\n"
    "  --seed=N               random seed (default: fixed, so runs repeat)\n"
    "\n"
    "Identity\n"
    "  --token=JWT            bearer token of every connection\n"
    "  --tokens-file=PATH     one token a line; connection i sends line i mod n (a principal\n"
    "                         per connection when each line names another sub)\n"
    "\n"
    "Raw mode (any gRPC server)\n"
    "  --raw-method=PATH      send this method path, e.g. /etcdserverpb.KV/Put\n"
    "  --raw-payloads=FILE    gRPC-framed messages (5-byte header + payload each, the\n"
    "                         file h2load -d sends); each call picks one with the key\n"
    "                         distribution over the messages in the file\n"
    "\n"
    "Output\n"
    "  --json                 one JSON object on stdout instead of text\n"
    "  --label=TEXT           a name for the run, echoed in the output\n"
    "\n"
    "Every option is also read from DREY_<NAME> (--key-bytes: DREY_KEY_BYTES); the command\n"
    "line wins.\n"
    "\n"
    "Exit status: 0 the run finished (errors are counted, not fatal); 1 it could not run;\n"
    "2 a bad option.\n";

static void die(const char *fmt, const char *arg) {
    fprintf(stderr, "drey-bench: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(drey-bench --help lists the options)\n");
    exit(2);
}

static uint64_t parse_count(const char *name, const char *v, uint64_t min) {
    char *end;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || v[0] == '-' || n < min)
        die("bad value for --%s", name);
    return n;
}

static int64_t parse_duration(const char *name, const char *v) {
    int64_t ms;
    if (!drey_config_parse_duration_ms(v, &ms) || ms < 0)
        die("bad duration for --%s", name);
    return ms;
}

static void parse_mix(drey_bench_options *o, const char *spec) {
    memset(o->mix, 0, sizeof o->mix);
    char *copy = drey_xstrdup(spec), *save = NULL;
    for (char *item = strtok_r(copy, ",", &save); item != NULL; item = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(item, ':');
        unsigned w = 1;
        if (colon != NULL) {
            *colon = '\0';
            w = (unsigned)parse_count("mix", colon + 1, 0);
        }
        int found = -1;
        for (int op = 0; op < DREY_BENCH_RAW; op++) {
            if (strcmp(item, drey_bench_op_name(op)) == 0)
                found = op;
        }
        if (found < 0)
            die("unknown operation in --mix: %s", item);
        o->mix[found] += w;
    }
    free(copy);
}

static void read_tokens(drey_bench_options *o, const char *path) {
    FILE *f = fopen(path, "r");
    if (f == NULL)
        die("cannot read --tokens-file %s", path);
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) > 0) {
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' '))
            line[--n] = '\0';
        if (n == 0)
            continue;
        o->tokens = drey_xrealloc(o->tokens, o->n_tokens + 1, sizeof *o->tokens);
        o->tokens[o->n_tokens++] = drey_xstrdup(line);
    }
    free(line);
    fclose(f);
    if (o->n_tokens == 0)
        die("--tokens-file %s holds no token", path);
}

/* What one option does to the run; false for a name drey-bench does not
 * know. Both the environment and the command line come through here. */
struct parse {
    drey_bench_options *o;
    bool duration_set, warmup_set, keys_set;
    const char *payloads_file;
};

static bool flag_option(const char *name) {
    return strcmp(name, "json") == 0 || strcmp(name, "request-ids") == 0 || strcmp(name, "cluster") == 0;
}

static bool set_option(struct parse *p, const char *name, const char *v) {
    drey_bench_options *o = p->o;
    if (flag_option(name)) {
        bool on = v == NULL || strcmp(v, "true") == 0 || strcmp(v, "1") == 0;
        if (strcmp(name, "json") == 0)
            o->json = on;
        else if (strcmp(name, "cluster") == 0)
            o->cluster = on;
        else
            o->request_ids = on;
        return true;
    }
    if (strcmp(name, "target") == 0) {
        o->target = v;
    } else if (strcmp(name, "connections") == 0) {
        o->connections = (int)parse_count(name, v, 1);
    } else if (strcmp(name, "pipeline") == 0) {
        o->pipeline = (int)parse_count(name, v, 1);
    } else if (strcmp(name, "streams") == 0) {
        o->streams = (int)parse_count(name, v, 1);
    } else if (strcmp(name, "duration") == 0) {
        o->duration_ms = parse_duration(name, v);
        p->duration_set = true;
    } else if (strcmp(name, "warmup") == 0) {
        o->warmup_ms = parse_duration(name, v);
        p->warmup_set = true;
    } else if (strcmp(name, "count") == 0) {
        o->count = parse_count(name, v, 1);
    } else if (strcmp(name, "timeout") == 0) {
        o->timeout_ms = parse_duration(name, v);
    } else if (strcmp(name, "mix") == 0) {
        parse_mix(o, v);
    } else if (strcmp(name, "keys") == 0) {
        o->keys = parse_count(name, v, 1);
        p->keys_set = true;
    } else if (strcmp(name, "key-bytes") == 0) {
        o->key_bytes = (int)parse_count(name, v, 2);
        if (o->key_bytes > 60)
            die("--%s is at most 60", name);
    } else if (strcmp(name, "distribution") == 0) {
        if (strcmp(v, "uniform") == 0)
            o->dist = DREY_BENCH_UNIFORM;
        else if (strcmp(v, "zipf") == 0)
            o->dist = DREY_BENCH_ZIPF;
        else if (strcmp(v, "sequential") == 0)
            o->dist = DREY_BENCH_SEQUENTIAL;
        else
            die("unknown --distribution %s (uniform, zipf, sequential)", v);
    } else if (strcmp(name, "zipf-s") == 0) {
        char *end;
        o->zipf_s = strtod(v, &end);
        if (end == v || *end != '\0' || o->zipf_s <= 0)
            die("bad value for --%s", name);
    } else if (strcmp(name, "value-bytes") == 0) {
        int64_t b;
        if (!drey_config_parse_bytes(v, &b) || b < 0)
            die("bad size for --%s", name);
        o->value_bytes = (size_t)b;
    } else if (strcmp(name, "cache") == 0) {
        o->cache = v;
    } else if (strcmp(name, "ttl") == 0) {
        o->ttl_ms = parse_duration(name, v);
    } else if (strcmp(name, "seed") == 0) {
        o->seed = parse_count(name, v, 0);
    } else if (strcmp(name, "token") == 0) {
        o->tokens = drey_xrealloc(o->tokens, o->n_tokens + 1, sizeof *o->tokens);
        o->tokens[o->n_tokens++] = drey_xstrdup(v);
    } else if (strcmp(name, "tokens-file") == 0) {
        read_tokens(o, v);
    } else if (strcmp(name, "raw-method") == 0) {
        o->raw_method = v;
    } else if (strcmp(name, "raw-payloads") == 0) {
        p->payloads_file = v;
    } else if (strcmp(name, "label") == 0) {
        o->label = v;
    } else {
        return false;
    }
    return true;
}

/* Every option also comes from DREY_<NAME> (--key-bytes: DREY_KEY_BYTES), as
 * dreyd's and drey's do; the command line wins. */
static const char *const option_names[] = {
    "target", "connections", "pipeline", "streams", "duration", "warmup", "count", "timeout", "mix", "keys",
    "key-bytes", "distribution", "zipf-s", "value-bytes", "cache", "ttl", "seed", "token", "tokens-file",
    "raw-method", "raw-payloads", "label", "json", "request-ids", "cluster",
};

static void from_environment(struct parse *p) {
    for (size_t i = 0; i < sizeof option_names / sizeof option_names[0]; i++) {
        char var[64] = "DREY_";
        size_t n = strlen(var);
        for (const char *c = option_names[i]; *c != '\0' && n + 1 < sizeof var; c++)
            var[n++] = *c == '-' ? '_' : (char)toupper((unsigned char)*c);
        var[n] = '\0';
        const char *v = getenv(var);
        if (v != NULL && v[0] != '\0')
            set_option(p, option_names[i], v);
    }
}

void drey_bench_options_parse(drey_bench_options *o, int argc, char **argv) {
    memset(o, 0, sizeof *o);
    o->target = "127.0.0.1:50051";
    o->connections = 1;
    o->streams = 1;
    o->duration_ms = 10000;
    o->warmup_ms = 1000;
    o->keys = 100000;
    o->key_bytes = 8;
    o->dist = DREY_BENCH_UNIFORM;
    o->zipf_s = 0.99;
    o->value_bytes = 256;
    o->mix[DREY_BENCH_GET] = 1;
    o->cache = "";
    o->timeout_ms = 10000;
    o->seed = 0x5eed;

    struct parse p = {.o = o};
    from_environment(&p);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            fputs(usage, stdout);
            exit(0);
        }
        if (strcmp(a, "--version") == 0) {
            drey_version_print(stdout, "drey-bench");
            exit(0);
        }
        if (strncmp(a, "--", 2) != 0)
            die("unexpected argument %s", a);
        a += 2;
        const char *eq = strchr(a, '=');
        char name[64];
        size_t nlen = eq != NULL ? (size_t)(eq - a) : strlen(a);
        if (nlen >= sizeof name)
            die("unknown option --%s", a);
        memcpy(name, a, nlen);
        name[nlen] = '\0';
        const char *v = eq != NULL ? eq + 1 : NULL;
        if (v == NULL && !flag_option(name) && i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0)
            v = argv[++i]; /* --name value */
        if (v == NULL && !flag_option(name))
            die("--%s needs a value (--name value or --name=value)", name);
        if (!set_option(&p, name, v))
            die("unknown option --%s", name);
    }

    if ((o->raw_method != NULL) != (p.payloads_file != NULL))
        die("%s", "--raw-method and --raw-payloads go together");
    if (o->raw_method != NULL) {
        if (o->raw_method[0] != '/')
            die("--raw-method %s must be a path like /pkg.Service/Method", o->raw_method);
        char err[256];
        if (!drey_bench_load_payloads(p.payloads_file, &o->payloads, &o->n_payloads, err, sizeof err))
            die("%s", err);
        memset(o->mix, 0, sizeof o->mix);
        o->mix[DREY_BENCH_RAW] = 1;
        if (!p.keys_set)
            o->keys = o->n_payloads;
        if (o->keys > o->n_payloads)
            die("%s", "--keys is larger than the number of raw payloads");
    }
    if (o->count > 0) {
        if (!p.duration_set)
            o->duration_ms = 0;
        if (!p.warmup_set)
            o->warmup_ms = 0;
    } else if (o->duration_ms == 0 && o->dist != DREY_BENCH_SEQUENTIAL) {
        die("%s", "give --duration or --count");
    }
    unsigned total = 0;
    for (int op = 0; op < DREY_BENCH_N_OPS; op++)
        total += o->mix[op];
    if (total == 0)
        die("%s", "--mix has no operation with a weight");
    /* "k" + digits: the largest index must fit. */
    char digits[32];
    int need = snprintf(digits, sizeof digits, "%llu", (unsigned long long)(o->keys - 1)) + 1;
    if (o->pipeline > 0 && (o->raw_method != NULL || o->mix[DREY_BENCH_HEALTH] > 0))
        die("%s", "--pipeline carries cache operations only: not with --raw-method or health");
    if (o->cluster && o->raw_method != NULL)
        die("%s", "--cluster routes cache calls by key: not with --raw-method");
    if (o->raw_method == NULL && need > o->key_bytes)
        die("--key-bytes is too short for --keys (%s)", digits);
}
