/* SPDX-License-Identifier: MIT */
/* bf16 / f16 <-> f32 conversions, round to nearest even, NaN kept. Static
 * inline in a header, because the CPU kernels and the MPI transport module
 * (which does not link the core) both convert element by element. */
#ifndef INFINICP_HALF_H
#define INFINICP_HALF_H

#include <stdint.h>
#include <string.h>

static inline float cpi_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t cpi_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float cpi_bf16_to_f32(uint16_t h)
{
    return cpi_bits_f32((uint32_t)h << 16);
}

static inline uint16_t cpi_f32_to_bf16(float f)
{
    uint32_t u = cpi_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it quiet and a NaN */
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float cpi_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f)
        return cpi_bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24 is exact in f32 */
        float v = (float)man * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return cpi_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

static inline uint16_t cpi_f32_to_f16(float f)
{
    uint32_t u = cpi_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return sign | 0x7e00u;
    if (a >= 0x477ff000u) /* rounds to >= 65520: infinity */
        return sign | 0x7c00u;
    if (a < 0x38800000u) {
        /* result is subnormal or zero: add 0.5 so the FPU rounds to a multiple of 2^-24 */
        float v = cpi_bits_f32(a) + 0.5f;
        return sign | (uint16_t)(cpi_f32_bits(v) - 0x3f000000u);
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u); /* round to nearest even at bit 13 */
    return sign | (uint16_t)((r - 0x38000000u) >> 13);
}

#endif
