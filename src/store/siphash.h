/* SipHash-1-3 over two byte strings, for the store's keyed hash (internal). */
#ifndef DREY_STORE_SIPHASH_H
#define DREY_STORE_SIPHASH_H

#include <stddef.h>
#include <stdint.h>

/* Hashes a || b as one message with the 128-bit key k. */
uint64_t drey_store__siphash2(const uint8_t k[16], const void *a, size_t alen, const void *b, size_t blen);

#endif
