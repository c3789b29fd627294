/* SPDX-License-Identifier: MIT */
/*
 * Tile primitives of the CPU attention kernels, one table per instruction
 * set. attention.c and merge.c are written against this table only; the
 * tables are built from one source (tile_impl.h) compiled once per ISA, and
 * cpi_tile_ops_select() picks the best one the processor supports.
 *
 * Tiles are fp32, row-major, with row pitches in floats. Column counts passed
 * as `n16` are multiples of 16 (buffers are padded to that), so every ISA
 * works on whole vectors without tails.
 */
#ifndef INFINICP_CPU_TILE_H
#define INFINICP_CPU_TILE_H

#include <stddef.h>

#include "core/internal.h"

/* Columns of fp32 tiles are padded to multiples of this many floats. */
#define CPI_TILE_PAD 16

static inline ptrdiff_t cpi_pad16(ptrdiff_t n)
{
    return (n + CPI_TILE_PAD - 1) / CPI_TILE_PAD * CPI_TILE_PAD;
}

typedef struct cpi_tile_ops {
    const char *name; /* "avx512", "avx2" or "generic" */

    /*
     * C[m][n] (+)= sum_k A[m*ars + k*acs] * B[k*ldb + n] for m < M, n < n16,
     * k < K: overwrite C when accumulate is 0, add to it otherwise. A is read
     * by single elements (either stride may be 1: row- or column-major), B and
     * C by whole rows of n16 floats.
     */
    void (*gemm)(int M, int n16, int K, const float *A, ptrdiff_t ars, ptrdiff_t acs, const float *B,
                 ptrdiff_t ldb, float *C, ptrdiff_t ldc, int accumulate);

    /*
     * One online-softmax step of the forward pass on a score tile stored
     * key-major, S[j*lds + i] = log2-scaled score of query column i and key
     * row j (j < nk, i < n16; -inf where masked). Per query column: m is the
     * running maximum, l the running sum of 2^(s - m). Updates m and l, writes
     * alpha = 2^(m_old - m_new) (the factor the running output must be scaled
     * by) and replaces S by p = 2^(s - m_new). Columns that have seen no key
     * (or only scores of -inf) keep m = -inf, l = 0 and get p = 0, alpha = 0.
     * A NaN score, or +inf (2^(inf - inf)), makes its column's l NaN.
     */
    void (*softmax_fwd)(float *S, int nk, int n16, ptrdiff_t lds, float *m, float *l, float *alpha);

    /*
     * The elementwise part of the backward pass on the columns [j0, n16) of
     * a query-major tile of nq rows (j0 a multiple of 16): P = 2^(S*c -
     * lse2[i]) for columns lo[i] <= j < lim[i], 0 in the others;
     * dP <- scale * P * (dP - D[i]), times dt (a tile of the same pitch)
     * when dt is not NULL, and 0 outside [lo[i], lim[i]) too: selected, not
     * multiplied by P = 0, so that a NaN there stays out. S is overwritten
     * with P; the columns before j0 are not touched.
     */
    void (*softmax_bwd)(float *S, float *dP, int nq, int j0, int n16, ptrdiff_t ld, const int *lo,
                        const int *lim, float c, float scale, const float *lse2, const float *D,
                        const float *dt);

    /*
     * The logit softcap on rows of n16 columns (pitch ld): t = tanh(in * x),
     * x <- out * t, and with dt (same pitch) dt <- 1 - t^2, the derivative
     * of tanh. NaN stays NaN and +-inf gives +-out; |error of t| < 1e-7.
     */
    void (*softcap)(float *X, int rows, int n16, ptrdiff_t ld, float in, float out, float *dt);

    /* Row i of C (n16 columns) *= alpha[i], for i < M. */
    void (*scale_rows)(float *C, int M, int n16, ptrdiff_t ldc, const float *alpha);

    /* dst[i] = s * src[i] (src of dtype t) for i < n; dst[n .. npad) = 0. */
    void (*load)(float *dst, const void *src, cp_dtype t, size_t n, size_t npad, float s);

    /* dst[i] = s * src[i] (+ dst[i] when add), rounded once to dtype t, i < n. */
    void (*store)(void *dst, cp_dtype t, const float *src, size_t n, float s, int add);

    /* sum of a[i] * b[i] for i < n, in fp32. */
    float (*dot)(const float *a, const float *b, size_t n);

    /* 1 if every x[i], i < n, is finite; 0 if any is an inf or a NaN. */
    int (*all_finite)(const float *x, size_t n);
} cpi_tile_ops;

extern const cpi_tile_ops cpi_tile_ops_generic;
#if defined(__x86_64__) || defined(__i386__)
#define CPI_HAVE_X86_TILES 1
extern const cpi_tile_ops cpi_tile_ops_avx2;
extern const cpi_tile_ops cpi_tile_ops_avx512;
#endif

/*
 * The table to use: the widest ISA this processor supports, or the one named
 * by the environment variable INFINICP_CPU_ISA ("avx512", "avx2", "generic")
 * for testing and comparison. Naming an ISA the processor lacks is an error.
 */
cp_status cpi_tile_ops_select(const cpi_tile_ops **out);

#endif
