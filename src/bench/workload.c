/*
 * workload — what each call sends: an operation drawn from the mix, a key
 * drawn from the distribution, and the request encoded with protobuf-c into
 * the thread's buffer (or, in raw mode, a pre-encoded payload).
 *
 * Randomness is splitmix64 per thread (seeded from --seed and the thread
 * number, so runs repeat). Zipf draws search a precomputed CDF of the key
 * space (8 bytes a key: 8 MB for a million keys); key 0 is the hottest.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"
#include "drey/alloc.h"
#include "drey/cache/v1/cache.pb-c.h"
#include "drey/rpc.h"
#include "grpc/health/v1/health.pb-c.h"

#define ZIPF_MAX_KEYS 100000000ull

/* Each operation's name (in reports), method and request type; the request
 * is filled by field names (next_request): a key, a value, a request_id,
 * a delta and a TTL where its type has those fields. Raw payloads come as
 * they are. */
static const struct {
    const char *name, *method;
    const ProtobufCMessageDescriptor *request;
} ops[DREY_BENCH_N_OPS] = {
    [DREY_BENCH_GET] = {"get", "/drey.cache.v1.Cache/Get", &drey__cache__v1__get_request__descriptor},
    [DREY_BENCH_SET] = {"set", "/drey.cache.v1.Cache/Set", &drey__cache__v1__set_request__descriptor},
    [DREY_BENCH_ADD] = {"add", "/drey.cache.v1.Cache/Add", &drey__cache__v1__add_request__descriptor},
    [DREY_BENCH_INCREMENT] = {"increment", "/drey.cache.v1.Cache/Increment",
                              &drey__cache__v1__increment_request__descriptor},
    [DREY_BENCH_REMOVE] = {"remove", "/drey.cache.v1.Cache/Remove", &drey__cache__v1__remove_request__descriptor},
    [DREY_BENCH_HEALTH] = {"health", "/grpc.health.v1.Health/Check",
                           &grpc__health__v1__health_check_request__descriptor},
    [DREY_BENCH_RAW] = {"raw", NULL, NULL},
};

const char *drey_bench_op_name(drey_bench_op op) {
    return (unsigned)op < DREY_BENCH_N_OPS ? ops[op].name : "?";
}

/* --- randomness ----------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [0, n) (Lemire's multiply-shift; the bias is below 2^-40 for
 * any key space a benchmark uses). */
static uint64_t uniform_below(uint64_t *state, uint64_t n) {
    return (uint64_t)(((unsigned __int128)splitmix64(state) * n) >> 64);
}

static double unit_interval(uint64_t *state) {
    return (double)(splitmix64(state) >> 11) * (1.0 / 9007199254740992.0);
}

/* --- the shared workload ---------------------------------------------------- */

void drey_bench_workload_init(drey_bench_workload *w, const drey_bench_options *o) {
    memset(w, 0, sizeof *w);
    w->o = o;
    for (int op = 0; op < DREY_BENCH_N_OPS; op++)
        w->mix_total += o->mix[op];
    w->value = drey_xmalloc(o->value_bytes);
    uint64_t st = o->seed ^ 0xA5A5A5A5ull;
    for (size_t i = 0; i < o->value_bytes; i++)
        w->value[i] = (uint8_t)('a' + splitmix64(&st) % 26); /* incompressible enough, printable */
    if (o->dist == DREY_BENCH_ZIPF) {
        uint64_t n = o->keys;
        if (n > ZIPF_MAX_KEYS) {
            fprintf(stderr, "drey-bench: zipf over more than %llu keys is not supported\n", ZIPF_MAX_KEYS);
            exit(2);
        }
        w->zipf_cdf = drey_xmalloc(n * sizeof *w->zipf_cdf);
        double sum = 0;
        for (uint64_t i = 0; i < n; i++) {
            sum += 1.0 / pow((double)(i + 1), o->zipf_s);
            w->zipf_cdf[i] = sum;
        }
        for (uint64_t i = 0; i < n; i++)
            w->zipf_cdf[i] /= sum;
        w->zipf_cdf[n - 1] = 1.0;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t id_state = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    w->run_id = splitmix64(&id_state);
    atomic_init(&w->next_seq, 0);
}

void drey_bench_workload_free(drey_bench_workload *w) {
    free(w->zipf_cdf);
    free(w->value);
}

void drey_bench_gen_init(drey_bench_gen *g, const drey_bench_workload *w, int thread) {
    memset(g, 0, sizeof *g);
    g->w = w;
    g->thread = thread;
    g->rng = w->o->seed * 0x9E3779B97F4A7C15ull + (uint64_t)thread * 0xD1B54A32D192ED03ull + 1;
    g->cap = w->o->value_bytes + (size_t)w->o->key_bytes + strlen(w->o->cache) + 256;
    g->buf = drey_xmalloc(g->cap);
}

void drey_bench_gen_free(drey_bench_gen *g) {
    free(g->buf);
}

uint64_t drey_bench_next_key(drey_bench_gen *g, uint64_t n, bool *exhausted) {
    *exhausted = false;
    switch (g->w->o->dist) {
    case DREY_BENCH_UNIFORM:
        return uniform_below(&g->rng, n);
    case DREY_BENCH_ZIPF: {
        const double *cdf = g->w->zipf_cdf;
        double u = unit_interval(&g->rng);
        uint64_t lo = 0, hi = n - 1; /* first i with cdf[i] > u */
        while (lo < hi) {
            uint64_t mid = lo + (hi - lo) / 2;
            if (cdf[mid] > u)
                hi = mid;
            else
                lo = mid + 1;
        }
        return lo;
    }
    case DREY_BENCH_SEQUENTIAL: {
        drey_bench_workload *w = (drey_bench_workload *)g->w;
        uint64_t i = atomic_fetch_add_explicit(&w->next_seq, 1, memory_order_relaxed);
        if (i >= n) {
            *exhausted = true;
            return 0;
        }
        return i;
    }
    }
    return 0;
}

/* "k0012345": prefix and the index zero-padded to key_bytes - 1 digits. */
static void format_key(char *out, int key_bytes, char prefix, uint64_t index) {
    out[0] = prefix;
    for (int i = key_bytes - 1; i >= 1; i--) {
        out[i] = (char)('0' + index % 10);
        index /= 10;
    }
    out[key_bytes] = '\0';
}

static drey_bench_op pick_op(drey_bench_gen *g) {
    const drey_bench_options *o = g->w->o;
    if (g->w->mix_total == o->mix[DREY_BENCH_GET])
        return DREY_BENCH_GET;
    uint64_t r = uniform_below(&g->rng, g->w->mix_total);
    for (int op = 0; op < DREY_BENCH_N_OPS; op++) {
        if (r < o->mix[op])
            return op;
        r -= o->mix[op];
    }
    return DREY_BENCH_GET;
}

bool drey_bench_next_request(drey_bench_gen *g, drey_bench_request *out) {
    const drey_bench_options *o = g->w->o;
    drey_bench_op op = pick_op(g);
    bool exhausted = false;
    out->op = op;
    out->key = "";
    out->key_len = 0;
    if (op == DREY_BENCH_RAW) {
        uint64_t i = drey_bench_next_key(g, o->keys, &exhausted);
        out->method = o->raw_method;
        out->data = o->payloads[i].data;
        out->len = o->payloads[i].len;
        return !exhausted;
    }
    out->method = ops[op].method;
    union { /* room for any of the ops' requests */
        ProtobufCMessage base;
        Drey__Cache__V1__GetRequest get;
        Drey__Cache__V1__SetRequest set;
        Drey__Cache__V1__AddRequest add;
        Drey__Cache__V1__IncrementRequest increment;
        Drey__Cache__V1__RemoveRequest remove;
        Grpc__Health__V1__HealthCheckRequest health;
    } req;
    protobuf_c_message_init(ops[op].request, &req);
    if (op == DREY_BENCH_HEALTH) {
        out->len = protobuf_c_message_pack(&req.base, g->buf);
        out->data = g->buf;
        return true;
    }

    char *key = g->key;
    uint64_t index = drey_bench_next_key(g, o->keys, &exhausted);
    format_key(key, o->key_bytes < (int)sizeof g->key - 1 ? o->key_bytes : (int)sizeof g->key - 1,
               op == DREY_BENCH_INCREMENT ? 'c' : 'k', index);
    char request_id[64];
    request_id[0] = '\0';
    if (o->request_ids && op != DREY_BENCH_GET)
        snprintf(request_id, sizeof request_id, "%016llx-%d-%llu", (unsigned long long)g->w->run_id, g->thread,
                 (unsigned long long)g->seq++);
    Google__Protobuf__Duration ttl = GOOGLE__PROTOBUF__DURATION__INIT;
    ttl.seconds = o->ttl_ms / 1000;
    ttl.nanos = (int32_t)(o->ttl_ms % 1000) * 1000000;
    Drey__Cache__V1__Value value = DREY__CACHE__V1__VALUE__INIT;
    value.kind_case = DREY__CACHE__V1__VALUE__KIND_BYTES_VALUE;
    value.bytes_value.data = g->w->value;
    value.bytes_value.len = o->value_bytes;

    *(const char **)drey_rpc_field(&req.base, "cache", NULL) = o->cache;
    *(char **)drey_rpc_field(&req.base, "key", NULL) = key;
    void *slot;
    if ((slot = drey_rpc_field(&req.base, "value", NULL)) != NULL)
        *(Drey__Cache__V1__Value **)slot = &value;
    if ((slot = drey_rpc_field(&req.base, "request_id", NULL)) != NULL)
        *(char **)slot = request_id;
    if ((slot = drey_rpc_field(&req.base, "delta", NULL)) != NULL)
        *(int64_t *)slot = 1;
    if (o->ttl_ms > 0 && (slot = drey_rpc_field(&req.base, "ttl", NULL)) != NULL)
        *(Google__Protobuf__Duration **)slot = &ttl;
    out->len = protobuf_c_message_pack(&req.base, g->buf);
    out->data = g->buf;
    out->key = key;
    out->key_len = strlen(key);
    return !exhausted;
}

/* --- raw payloads ----------------------------------------------------------- */

bool drey_bench_load_payloads(const char *path, drey_bench_payload **out, size_t *n, char *err, size_t err_cap) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, err_cap, "cannot read --raw-payloads %s", path);
        return false;
    }
    uint8_t *data = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? cap * 2 : 1 << 16;
            data = drey_xrealloc(data, cap, 1);
        }
        size_t got = fread(data + len, 1, cap - len, f);
        if (got == 0)
            break;
        len += got;
    }
    fclose(f);
    /* The payloads point into data, which lives as long as the process. */
    drey_bench_payload *p = NULL;
    size_t count = 0, pcap = 0;
    for (size_t off = 0; off < len;) {
        if (len - off < 5) {
            snprintf(err, err_cap, "%s: a frame header is cut off at byte %zu", path, off);
            free(data);
            free(p);
            return false;
        }
        if (data[off] != 0) {
            snprintf(err, err_cap, "%s: frame at byte %zu is compressed (flag %u)", path, off, data[off]);
            free(data);
            free(p);
            return false;
        }
        size_t mlen = (size_t)data[off + 1] << 24 | (size_t)data[off + 2] << 16 | (size_t)data[off + 3] << 8 |
                      (size_t)data[off + 4];
        if (mlen > len - off - 5) {
            snprintf(err, err_cap, "%s: frame at byte %zu is cut off", path, off);
            free(data);
            free(p);
            return false;
        }
        if (count == pcap) {
            pcap = pcap ? pcap * 2 : 64;
            p = drey_xrealloc(p, pcap, sizeof *p);
        }
        p[count].data = data + off + 5;
        p[count].len = mlen;
        count++;
        off += 5 + mlen;
    }
    if (count == 0) {
        snprintf(err, err_cap, "%s holds no message", path);
        free(data);
        free(p);
        return false;
    }
    *out = p;
    *n = count;
    return true;
}
