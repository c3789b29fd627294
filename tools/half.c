/* SPDX-License-Identifier: MIT */
/* 16-bit float conversions for the benchmark's data (round to nearest even). */
#include <string.h>

#include "bench.h"

float bench_f16_to_f32(uint16_t h)
{
    _Float16 x;
    memcpy(&x, &h, 2);
    return (float)x;
}

uint16_t bench_f32_to_half(float f, cp_dtype t)
{
    uint16_t h;
    if (t == CP_DTYPE_F16) {
        _Float16 x = (_Float16)f;
        memcpy(&h, &x, 2);
        return h;
    }
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
