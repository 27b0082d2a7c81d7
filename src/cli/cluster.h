/* drey cluster init|status (src/cli/cluster.c). */
#ifndef DREY_CLI_CLUSTER_H
#define DREY_CLI_CLUSTER_H

int drey_cli_cluster(int argc, char **argv);

#endif
