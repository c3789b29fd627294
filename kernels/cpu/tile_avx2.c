/* SPDX-License-Identifier: MIT */
/* The tile primitives for AVX2 + FMA (8 floats a vector, 16 vector registers:
 * a 6 x 2-vector micro-kernel, 12 accumulators). Only called after
 * cpi_tile_ops_select() has seen avx2, fma and f16c on the processor. */
#if defined(__x86_64__) || defined(__i386__)
/* clang has no #pragma GCC target: it gives every function the attribute. */
#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx2,fma,f16c")
#endif
#define CPI_SIMD_AVX2 1
#define CPI_TILE_TABLE cpi_tile_ops_avx2
#define CPI_TILE_NAME "avx2"
#define MK_ROWS 6
#define MK_VECS 2
#include "kernels/cpu/tile_impl.h"
#ifdef __clang__
#pragma clang attribute pop
#endif
#endif
