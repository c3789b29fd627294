/* SPDX-License-Identifier: MIT */
/* The tile primitives for AVX-512F (16 floats a vector, 32 vector registers:
 * a 6 x 4-vector micro-kernel, 24 accumulators). Only called after
 * cpi_tile_ops_select() has seen avx512f, fma and f16c on the processor. */
#if defined(__x86_64__) || defined(__i386__)
/* clang has no #pragma GCC target: it gives every function the attribute. */
#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC target("avx512f,avx2,fma,f16c")
#endif
#define CPI_SIMD_AVX512 1
#define CPI_TILE_TABLE cpi_tile_ops_avx512
#define CPI_TILE_NAME "avx512"
#define MK_ROWS 6
#define MK_VECS 4
#include "kernels/cpu/tile_impl.h"
#ifdef __clang__
#pragma clang attribute pop
#endif
#endif
