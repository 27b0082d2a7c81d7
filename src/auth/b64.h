/* Strict base64url (RFC 4648 section 5, no padding), internal to auth. */
#ifndef DREY_AUTH_B64_H
#define DREY_AUTH_B64_H

#include <stdbool.h>
#include <stddef.h>

/* True for the 64 characters of the base64url alphabet. */
bool drey_auth__b64url_char(char c);

/* Decodes n characters of unpadded base64url. NULL (nothing allocated) for
 * a character outside the alphabet (padding included), a length that no
 * encoding has (n % 4 == 1), or set bits left over in the last character
 * (a non-canonical encoding). Otherwise malloc'd bytes, NUL-terminated for
 * convenience (not counted in *out_len); free() them. n == 0 decodes to an
 * empty buffer. */
unsigned char *drey_auth__b64url_decode(const char *s, size_t n, size_t *out_len);

#endif
