/* The operators' HTTP listener as the CLI reaches it (src/cli/ops.c). */
#ifndef DREY_CLI_OPS_H
#define DREY_CLI_OPS_H

#include <stdbool.h>
#include <stddef.h>

/* Where to reach the ops listener from this machine: the flag's value, or
 * else $DREY_OPS_LISTEN (what dreyd listens on; 0.0.0.0 and [::] are
 * reached on loopback). false: neither is set. */
bool drey_cli_ops_address(const char *flag, char *out, size_t cap);

/* GET path over HTTP/1.0: the status (0 and err when it could not be
 * asked) and the body (malloc'd). */
int drey_cli_ops_get(const char *addr, const char *path, char **body, size_t *len, char *err, size_t cap);

/* Nothing listens at addr any more (a connection is refused). */
bool drey_cli_ops_closed(const char *addr);

#endif
