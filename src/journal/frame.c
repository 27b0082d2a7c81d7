/*
 * Journal frames and segment headers; see frame.h for the layout.
 */
#include "frame.h"

#include <string.h>

#include "drey/bytes.h"
#include "drey/crc32c.h"

void drey_segment_header_encode(const drey_segment_header *h, uint8_t out[DREY_SEGMENT_HEADER]) {
    memset(out, 0, DREY_SEGMENT_HEADER);
    memcpy(out, DREY_SEGMENT_MAGIC, 8); /* includes the NUL */
    drey_bytes_put32(out + 8, DREY_SEGMENT_VERSION);
    drey_bytes_put32(out + 12, DREY_SEGMENT_HEADER);
    drey_bytes_put64(out + 16, h->first_lsn);
    drey_bytes_put64(out + 24, h->size);
    drey_bytes_put32(out + 32, drey_crc32c(0, out, 32));
}

bool drey_segment_header_decode(const uint8_t in[DREY_SEGMENT_HEADER], drey_segment_header *h) {
    if (memcmp(in, DREY_SEGMENT_MAGIC, 8) != 0 || drey_bytes_get32(in + 8) != DREY_SEGMENT_VERSION ||
        drey_bytes_get32(in + 12) != DREY_SEGMENT_HEADER || drey_bytes_get32(in + 32) != drey_crc32c(0, in, 32))
        return false;
    h->first_lsn = drey_bytes_get64(in + 16);
    h->size = drey_bytes_get64(in + 24);
    return h->first_lsn > 0;
}

static uint32_t frame_crc(const uint8_t *frame, uint32_t length) {
    uint32_t crc = drey_crc32c(0, frame, 4);
    return drey_crc32c(crc, frame + 8, DREY_FRAME_HEADER - 8 + (size_t)length);
}

void drey_frame_encode(const drey_frame *f, const uint8_t *payload, uint8_t *out) {
    size_t total = drey_frame_size(f->length);
    drey_bytes_put32(out, f->length);
    drey_bytes_put64(out + 8, f->lsn);
    drey_bytes_put64(out + 16, f->batch_lsn);
    drey_bytes_put64(out + 24, (uint64_t)f->time_ms);
    drey_bytes_put32(out + 32, DREY_FRAME_RECORD);
    drey_bytes_put32(out + 36, 0);
    memcpy(out + DREY_FRAME_HEADER, payload, f->length);
    memset(out + DREY_FRAME_HEADER + f->length, 0, total - DREY_FRAME_HEADER - f->length);
    drey_bytes_put32(out + 4, frame_crc(out, f->length));
}

drey_frame_status drey_frame_decode(const uint8_t *p, size_t avail, drey_frame *f) {
    if (avail < DREY_FRAME_HEADER) {
        for (size_t i = 0; i < avail; i++) {
            if (p[i] != 0)
                return DREY_FRAME_TRUNCATED;
        }
        return DREY_FRAME_END;
    }
    static const uint8_t zeros[DREY_FRAME_HEADER];
    if (memcmp(p, zeros, DREY_FRAME_HEADER) == 0)
        return DREY_FRAME_END;
    uint32_t length = drey_bytes_get32(p);
    if (drey_bytes_get32(p + 32) != DREY_FRAME_RECORD || drey_bytes_get32(p + 36) != 0)
        return DREY_FRAME_BAD;
    if (drey_frame_size(length) > avail)
        return DREY_FRAME_TRUNCATED;
    if (drey_bytes_get32(p + 4) != frame_crc(p, length))
        return DREY_FRAME_BAD;
    f->length = length;
    f->lsn = drey_bytes_get64(p + 8);
    f->batch_lsn = drey_bytes_get64(p + 16);
    f->time_ms = (int64_t)drey_bytes_get64(p + 24);
    f->payload = p + DREY_FRAME_HEADER;
    return DREY_FRAME_OK;
}
