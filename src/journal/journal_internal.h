/* Shared between the journal's files (internal). */
#ifndef DREY_JOURNAL_INTERNAL_H
#define DREY_JOURNAL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "drey/io.h"

/* "<16 hex digits>.seg" -> first LSN. */
bool drey_journal__segment_name(const char *name, uint64_t *first_lsn);
/* <dir>/journal or <dir>/journal/<name>. */
void drey_journal__path(char *buf, size_t cap, const char *dir, const char *name);
/* Zeroes [from, to) of an open segment and syncs it. */
int drey_journal__zero_range(drey_io *io, int fd, uint64_t from, uint64_t to);

#endif
