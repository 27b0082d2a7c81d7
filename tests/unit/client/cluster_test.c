/* Routing by key without a cluster: the partition the cluster client routes
 * by is the shared rule (tests/data/partition_vectors.json, made by an
 * independent Python implementation), and a client with no table (the seed
 * is down, so WatchTopology never answers) routes everything to the seed,
 * keeps retrying the watch, and closes cleanly mid-retry with calls in
 * flight. Routing by a real table is tested against three dreyd in
 * tests/integration/python/test_cluster_routing.py. */
#include <criterion/criterion.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "drey/client.h"
#include "drey/clock.h"

#define VECTORS "tests/data/partition_vectors.json"

Test(cluster, partitions_follow_the_shared_vectors) {
    json_error_t err;
    json_t *doc = json_load_file(VECTORS, 0, &err);
    cr_assert_not_null(doc, "%s:%d: %s", VECTORS, err.line, err.text);
    json_t *vectors = json_object_get(doc, "vectors");
    cr_assert(json_array_size(vectors) >= 20);
    size_t i;
    json_t *v;
    json_array_foreach(vectors, i, v) {
        const char *cache = json_string_value(json_object_get(v, "cache"));
        const char *key = json_string_value(json_object_get(v, "key"));
        uint32_t n = (uint32_t)json_integer_value(json_object_get(v, "partitions"));
        uint32_t want = (uint32_t)json_integer_value(json_object_get(v, "partition"));
        cr_assert(cache && key && n > 0, "vector %zu is incomplete", i);
        uint32_t got = drey_client_partition(cache, strlen(cache), key, strlen(key), n);
        cr_expect_eq(got, want, "(%s, %s, %u): %u, want %u", cache, key, n, got, want);
    }
    json_decref(doc);
}

/* A loopback port nothing listens on (bound, so no one else takes it). */
static int refused_port(int *fd_out) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    socklen_t len = sizeof sa;
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    *fd_out = fd;
    return ntohs(sa.sin_port);
}

Test(cluster, without_a_table_everything_goes_to_the_seed) {
    int fd;
    char seed[64], err[128];
    snprintf(seed, sizeof seed, "127.0.0.1:%d", refused_port(&fd));
    drey_client_options opts = {.target = seed, .token = "t"};
    drey_client_topology *t = drey_client_topology_open(&opts, err, sizeof err);
    cr_assert_not_null(t, "%s", err);
    int64_t start = drey_mono_ms();
    cr_assert_not(drey_client_topology_wait(t, 300));
    cr_expect_geq(drey_mono_ms() - start, 300, "the wait ends on its deadline");
    cr_expect_eq(drey_client_topology_version(t), 0);
    cr_expect_eq(drey_client_topology_partitions(t), 0);

    drey_client_cluster *cc = drey_client_cluster_open(t, &opts, err, sizeof err);
    cr_assert_not_null(cc, "%s", err);
    cr_expect_str_eq(drey_client_cluster_route_address(cc, "users", 5, "alice", 5), seed);
    cr_expect_str_eq(drey_client_cluster_route_address(cc, "", 0, "bob", 3), seed);
    drey_client *c = drey_client_cluster_route(cc, "users", 5, "alice", 5);
    cr_assert_eq(drey_client_cluster_route(cc, "x", 1, "y", 1), c, "one seed client for every key");

    /* Calls through the router reach the seed and fail there as a plain
     * client's would; their completions come out of the router's queue. */
    static const uint8_t empty[1];
    for (int i = 0; i < 3; i++)
        cr_assert(drey_client_cluster_start_call(cc, "users", 5, "k", 1, "/drey.cache.v1.Cache/Get", empty, 0, 5000,
                                                 (void *)(intptr_t)(i + 1)));
    cr_expect_eq(drey_client_cluster_in_flight(cc), 3);
    drey_arena arena;
    drey_arena_init(&arena, NULL, 0);
    drey_client_completion done;
    cr_assert(drey_client_cluster_next(cc, 10000, &arena, &done));
    cr_expect_eq(done.status.code, GRPC_STATUS_UNAVAILABLE, "%s", drey_client_code_name(done.status.code));
    cr_expect(done.user != NULL);
    cr_expect_eq(drey_client_cluster_in_flight(cc), 2);
    /* Two left in flight: close cancels and reaps them (ASan checks the
     * leaks). */
    drey_arena_destroy(&arena);
    drey_client_cluster_close(cc);

    /* The watch kept retrying meanwhile; close stops it mid-backoff. */
    drey_client_topology_close(t);
    close(fd);
}

Test(cluster, a_router_with_nothing_in_flight_has_no_completion) {
    int fd;
    char seed[64], err[128];
    snprintf(seed, sizeof seed, "127.0.0.1:%d", refused_port(&fd));
    drey_client_options opts = {.target = seed};
    drey_client_topology *t = drey_client_topology_open(&opts, err, sizeof err);
    cr_assert_not_null(t, "%s", err);
    drey_client_cluster *cc = drey_client_cluster_open(t, &opts, err, sizeof err);
    cr_assert_not_null(cc, "%s", err);
    drey_arena arena;
    drey_arena_init(&arena, NULL, 0);
    drey_client_completion done;
    int64_t start = drey_mono_ms();
    cr_expect_not(drey_client_cluster_next(cc, 5000, &arena, &done));
    cr_expect_lt(drey_mono_ms() - start, 1000, "no call in flight: next does not wait");
    drey_arena_destroy(&arena);
    drey_client_cluster_close(cc);
    drey_client_topology_close(t);
    close(fd);
}

Test(cluster, unusable_options_are_refused) {
    char err[128] = "";
    cr_assert_null(drey_client_topology_open(&(drey_client_options){.target = ""}, err, sizeof err));
    cr_assert_str_eq(err, "no target address");
}
