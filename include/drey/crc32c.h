/*
 * crc32c — CRC-32C (Castagnoli), the checksum of journal frames, snapshots
 * and the manifest. Hardware-accelerated where the CPU allows.
 */
#ifndef DREY_CRC32C_H
#define DREY_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* Extends crc (0 to start) over n bytes; chaining calls equals one call over
 * the concatenation. */
uint32_t drey_crc32c(uint32_t crc, const void *data, size_t n);

/* The table-driven path, whatever the CPU (for tests). */
uint32_t drey_crc32c_portable(uint32_t crc, const void *data, size_t n);

#endif
