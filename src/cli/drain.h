/* drey drain (src/cli/drain.c). */
#ifndef DREY_CLI_DRAIN_H
#define DREY_CLI_DRAIN_H

int drey_cli_drain(int argc, char **argv);

#endif
