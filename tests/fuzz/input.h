/* SPDX-License-Identifier: MIT */
/*
 * Decoding a fuzz input as a stream of little-endian fields. Past the end of
 * the input every field reads as 0, so every input decodes to something;
 * seeds spell their fields out in the order the target reads them (see
 * make-seeds.py here).
 */
#ifndef INFINICP_FUZZ_INPUT_H
#define INFINICP_FUZZ_INPUT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct fuzz_input {
    const uint8_t *p;
    size_t n;
} fuzz_input;

static inline uint64_t fuzz_take(fuzz_input *in, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes && in->n; i++, in->p++, in->n--)
        v |= (uint64_t)*in->p << (8 * i);
    return v;
}

static inline uint8_t fuzz_u8(fuzz_input *in)
{
    return (uint8_t)fuzz_take(in, 1);
}

static inline int32_t fuzz_i32(fuzz_input *in)
{
    return (int32_t)(uint32_t)fuzz_take(in, 4);
}

static inline int64_t fuzz_i64(fuzz_input *in)
{
    return (int64_t)fuzz_take(in, 8);
}

static inline double fuzz_f64(fuzz_input *in)
{
    uint64_t u = fuzz_take(in, 8);
    double d;
    memcpy(&d, &u, sizeof d);
    return d;
}

/* struct_size of a versioned struct: a 16-bit field, 0 meaning "ours"
 * (what the _INIT macros set), anything else taken as it is. */
static inline size_t fuzz_struct_size(fuzz_input *in, size_t ours)
{
    uint16_t v = (uint16_t)fuzz_take(in, 2);
    return v ? v : ours;
}

#endif
