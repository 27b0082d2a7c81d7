/*
 * The journal's on-disk layout (internal).
 *
 * A segment file is a 64-byte header followed by frames, each starting at a
 * multiple of 8 bytes, then zeros up to the preallocated size:
 *
 *   segment header (64 bytes)
 *     0  magic "DREYWAL\0"
 *     8  u32 format version (1)
 *    12  u32 header size (64)
 *    16  u64 first LSN of the segment
 *    24  u64 preallocated size at creation (an empty segment may later
 *        grow in place to fit a record larger than it; nothing reads this)
 *    32  u32 CRC-32C of bytes 0..32
 *    36  zeros
 *
 *   frame
 *     0  u32 payload length
 *     4  u32 CRC-32C of bytes 0..4 and 8..40+length (everything but itself)
 *     8  u64 LSN
 *    16  u64 batch LSN: the first LSN written to the segment since it was
 *        last synced (with fsync always, the first LSN of the write batch)
 *    24  i64 time, wall-clock ms: the time the record is applied at
 *    32  u32 type (1 = record)
 *    36  u32 reserved (0)
 *    40  payload, then zeros to the next multiple of 8
 *
 * All integers are little-endian. Because frames are 8-byte aligned, a
 * frame's length never straddles a sector, so it cannot be half-written.
 * A crash can tear only what was written since the last sync of the last
 * segment (a segment is synced before the next one is created; with fsync
 * always, that is the one batch being written when it struck); the batch
 * LSN lets recovery tell that torn tail (every intact frame after the damage
 * carries the same batch LSN, no later than the damaged record) from damage
 * to data that was already durable (an intact frame with a later batch LSN
 * follows it: it was written after a sync that covered the damaged one).
 */
#ifndef DREY_JOURNAL_FRAME_H
#define DREY_JOURNAL_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DREY_SEGMENT_MAGIC "DREYWAL"
#define DREY_SEGMENT_VERSION 1u
#define DREY_SEGMENT_HEADER 64u
#define DREY_FRAME_HEADER 40u
#define DREY_FRAME_RECORD 1u

typedef struct drey_segment_header {
    uint64_t first_lsn;
    uint64_t size;
} drey_segment_header;

typedef struct drey_frame {
    uint64_t lsn;
    uint64_t batch_lsn;
    int64_t time_ms;
    uint32_t length;
    const uint8_t *payload; /* decode only */
} drey_frame;

static inline size_t drey_frame_size(size_t payload_len) {
    return (DREY_FRAME_HEADER + payload_len + 7) & ~(size_t)7;
}

void drey_segment_header_encode(const drey_segment_header *h, uint8_t out[DREY_SEGMENT_HEADER]);
/* False when the magic, version, size or CRC is wrong. */
bool drey_segment_header_decode(const uint8_t in[DREY_SEGMENT_HEADER], drey_segment_header *h);

/* Writes header, payload and padding at out (drey_frame_size bytes). */
void drey_frame_encode(const drey_frame *f, const uint8_t *payload, uint8_t *out);

typedef enum drey_frame_status {
    DREY_FRAME_OK,
    DREY_FRAME_END,       /* a zero header: nothing was ever written here */
    DREY_FRAME_TRUNCATED, /* the frame runs past the end of the data */
    DREY_FRAME_BAD,       /* a checksum, type or length that cannot be right */
} drey_frame_status;

/* Decodes the frame at p (avail bytes readable). On OK, f->payload points
 * into p. */
drey_frame_status drey_frame_decode(const uint8_t *p, size_t avail, drey_frame *f);

#endif
