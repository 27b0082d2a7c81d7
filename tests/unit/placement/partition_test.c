/* The partition rule: the shared vectors (tests/data/partition_vectors.json,
 * made by an independent Python implementation) give the same partitions in
 * C, and proto/drey/cluster/v1/cluster.proto lists exactly those vectors. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "drey/crc32c.h"
#include "drey/placement.h"

#define VECTORS "tests/data/partition_vectors.json"
#define PROTO "proto/drey/cluster/v1/cluster.proto"

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

static json_t *load_vectors(void) {
    json_error_t err;
    json_t *doc = json_load_file(VECTORS, 0, &err);
    cr_assert_not_null(doc, "%s:%d: %s", VECTORS, err.line, err.text);
    return doc;
}

static uint32_t partition_of(const char *cache, const char *key, uint32_t n) {
    return drey_placement_partition(cache, strlen(cache), key, strlen(key), n);
}

Test(partition, the_shared_vectors_hold_in_c) {
    json_t *doc = load_vectors();
    json_t *vectors = json_object_get(doc, "vectors");
    cr_assert(json_array_size(vectors) >= 20);
    size_t i;
    json_t *v;
    json_array_foreach(vectors, i, v) {
        const char *cache = json_string_value(json_object_get(v, "cache"));
        const char *key = json_string_value(json_object_get(v, "key"));
        const char *routing = json_string_value(json_object_get(v, "routing_key"));
        uint32_t n = (uint32_t)json_integer_value(json_object_get(v, "partitions"));
        uint32_t want = (uint32_t)json_integer_value(json_object_get(v, "partition"));
        cr_assert(cache && key && routing && n > 0, "vector %zu is incomplete", i);
        cr_expect_eq(partition_of(cache, key, n), want, "(%s, %s, %u): %u, want %u", cache, key, n,
                     partition_of(cache, key, n), want);
        size_t off, len;
        drey_placement_routing_key(key, strlen(key), &off, &len);
        cr_expect(len == strlen(routing) && memcmp(key + off, routing, len) == 0, "routing key of %s: %.*s, want %s",
                  key, (int)len, key + off, routing);
    }
    json_t *check = json_object_get(doc, "crc32c_check");
    const char *input = json_string_value(json_object_get(check, "input"));
    unsigned long want = strtoul(json_string_value(json_object_get(check, "crc32c")), NULL, 16);
    cr_assert_eq(drey_crc32c(0, input, strlen(input)), want);
    json_decref(doc);
}

/* Every vector appears in the proto's comments as
 *   "cache", "key", N -> partition
 * and the proto lists no vector the file does not have. */
Test(partition, the_proto_lists_the_same_vectors) {
    json_t *doc = load_vectors();
    char *proto = slurp(PROTO);
    json_t *vectors = json_object_get(doc, "vectors");
    size_t i;
    json_t *v;
    json_array_foreach(vectors, i, v) {
        char *cache = json_dumps(json_object_get(v, "cache"), JSON_ENCODE_ANY);
        char *key = json_dumps(json_object_get(v, "key"), JSON_ENCODE_ANY);
        char line[512];
        snprintf(line, sizeof line, "//   %s, %s, %lld -> %lld ", cache, key,
                 (long long)json_integer_value(json_object_get(v, "partitions")),
                 (long long)json_integer_value(json_object_get(v, "partition")));
        cr_expect_not_null(strstr(proto, line), "%s does not list: %s", PROTO, line);
        free(cache);
        free(key);
    }
    size_t listed = 0;
    for (const char *p = proto; (p = strstr(p, " -> ")) != NULL; p++)
        listed += p > proto && p[-1] >= '0' && p[-1] <= '9'; /* "N -> p", not prose */
    cr_expect_eq(listed, json_array_size(vectors), "%s lists %zu vectors, %s has %zu", PROTO, listed, VECTORS,
                 json_array_size(vectors));
    free(proto);
    json_decref(doc);
}

Test(partition, routing_keys_follow_redis_hash_tags) {
    static const struct {
        const char *key, *routing;
    } cases[] = {
        {"plain", "plain"},   {"{tag}rest", "tag"}, {"a{tag}", "tag"},   {"{}tag", "{}tag"},
        {"{}{tag}", "{}{tag}"}, {"{open", "{open"}, {"close}", "close}"}, {"}{t}", "t"},
        {"{a}{b}", "a"},      {"{{a}}", "{a"},      {"", ""},            {"{", "{"},
        {"{}", "{}"},         {"x{}", "x{}"},       {"{ }", " "},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t off, len;
        drey_placement_routing_key(cases[i].key, strlen(cases[i].key), &off, &len);
        cr_expect(len == strlen(cases[i].routing) && memcmp(cases[i].key + off, cases[i].routing, len) == 0,
                  "%s: %.*s, want %s", cases[i].key, (int)len, cases[i].key + off, cases[i].routing);
    }
}

Test(partition, keys_sharing_a_tag_share_a_partition_and_bytes_after_nul_count) {
    for (uint32_t n = 1; n <= 4096; n *= 2)
        cr_assert_eq(partition_of("c", "{user:42}:cart", n), partition_of("c", "user:42", n));
    /* Lengths, not NUL terminators: a key with an embedded 0 byte differs
     * from its prefix. */
    uint32_t a = drey_placement_partition("c", 1, "k\0x", 3, 1u << 31);
    uint32_t b = drey_placement_partition("c", 1, "k", 1, 1u << 31);
    cr_assert_neq(a, b);
}

Test(partition, default_and_empty_are_one_cache) {
    for (uint32_t n = 1; n <= 4096; n *= 4)
        cr_assert_eq(partition_of("default", "k", n), partition_of("", "k", n));
    cr_assert_neq(partition_of("defaults", "k", 1u << 31), partition_of("", "k", 1u << 31));
}

Test(partition, keys_spread_evenly) {
    /* 256 partitions, 256k keys: every partition within 10% of the mean
     * (a binomial's sd here is 3% of it). */
    enum { N = 256, KEYS = 1 << 18 };
    static uint32_t count[N];
    char key[32];
    for (int i = 0; i < KEYS; i++) {
        int len = snprintf(key, sizeof key, "key-%d", i);
        count[drey_placement_partition("cache", 5, key, (size_t)len, N)]++;
    }
    for (int p = 0; p < N; p++)
        cr_expect(count[p] > KEYS / N * 9 / 10 && count[p] < KEYS / N * 11 / 10, "partition %d has %u keys", p,
                  count[p]);
}
