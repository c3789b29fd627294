/* SPDX-License-Identifier: MIT */
/*
 * FP8 E4M3 ("e4m3fn", CP_DTYPE_FP8_E4M3) <-> binary32 / binary64: 1 sign,
 * 4 exponent bits of bias 7, 3 mantissa bits, subnormals, no infinities,
 * S.1111.111 NaN, largest finite 448. Decoding is exact (every code is a
 * float) and goes through a table of the 256 codes, built at compile time;
 * encoding rounds once, to nearest even.
 */
#ifndef INFINICP_FP8_H
#define INFINICP_FP8_H

#include <stdint.h>

/* The value of every code: cpi_fp8_e4m3_values[c] is code c exactly (NaN
 * for 0x7f and 0xff). */
extern const float cpi_fp8_e4m3_values[256];

static inline float cpi_fp8_e4m3_to_f32(uint8_t c)
{
    return cpi_fp8_e4m3_values[c];
}

/*
 * The code nearest x, ties to even. Not saturating, as PyTorch's
 * conversion: |x| above 464 (halfway between 448 and 480, the next step of
 * the format, which S.1111.111 spends on NaN) and NaN give the NaN code of
 * x's sign; +-0 keep their sign.
 */
uint8_t cpi_f64_to_fp8_e4m3(double x);

#endif
