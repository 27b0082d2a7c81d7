/*
 * subscribe — clients' Watch streams following the partitions they
 * cover at their owners (subscribe.c).
 */
#ifndef DREY_CLUSTER_SUBSCRIBE_H
#define DREY_CLUSTER_SUBSCRIBE_H

#include "internal.h"

/* Ends every subscription; before the peers go. */
void drey_cluster__subs_destroy(drey_cluster__subs *s);

#endif
