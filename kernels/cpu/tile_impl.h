/* SPDX-License-Identifier: MIT */
/*
 * The tile primitives of tile.h, written once against the vector layer of
 * simd.h. Included by exactly one file per ISA (tile_avx512.c, tile_avx2.c,
 * tile_generic.c), which first selects the ISA and defines
 *   CPI_TILE_TABLE  the name of the table to define,
 *   CPI_TILE_NAME   its name string,
 *   MK_ROWS, MK_VECS the register block of the GEMM micro-kernel: MK_ROWS
 *                   rows of C by MK_VECS vectors, MK_ROWS * MK_VECS
 *                   accumulators plus MK_VECS B vectors and one broadcast
 *                   must fit the register file.
 */
#include "core/half.h"
#include "kernels/cpu/simd.h"
#include "kernels/cpu/tile.h"

#if CPI_TILE_PAD % VL != 0
#error "the tile padding must be a whole number of vectors"
#endif

#define ALWAYS_INLINE inline __attribute__((always_inline))

/*
 * The register-blocked GEMM micro-kernel: R rows by NV vectors of C, the sum
 * over K of a broadcast element of A times a vector row of B. R and NV are
 * compile-time constants at every call site (the switch below), so the
 * accumulators live in registers; ars / acs are often the constant 1 too,
 * which makes A's addressing one pointer plus small offsets.
 */
static ALWAYS_INLINE void micro_kernel(const int R, const int NV, int K, const float *A, ptrdiff_t ars,
                                       ptrdiff_t acs, const float *B, ptrdiff_t ldb, float *C,
                                       ptrdiff_t ldc, int accumulate)
{
    vf c[MK_ROWS][MK_VECS];
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
#pragma GCC unroll 16
        for (int v = 0; v < NV; v++)
            c[r][v] = accumulate ? vload(C + r * ldc + v * VL) : vzero();
    for (int k = 0; k < K; k++) {
        vf b[MK_VECS];
#pragma GCC unroll 16
        for (int v = 0; v < NV; v++)
            b[v] = vload(B + v * VL);
        B += ldb;
#pragma GCC unroll 16
        for (int r = 0; r < R; r++) {
            vf a = vset1(A[r * ars]);
#pragma GCC unroll 16
            for (int v = 0; v < NV; v++)
                c[r][v] = vfma(a, b[v], c[r][v]);
        }
        A += acs;
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; r++)
#pragma GCC unroll 16
        for (int v = 0; v < NV; v++)
            vstore(C + r * ldc + v * VL, c[r][v]);
}

/* One column panel of nv vectors: every row block of MK_ROWS, then the tail. */
static ALWAYS_INLINE void gemm_panel(const int NV, int M, int K, const float *A, ptrdiff_t ars,
                                     ptrdiff_t acs, const float *B, ptrdiff_t ldb, float *C,
                                     ptrdiff_t ldc, int accumulate)
{
    int m = 0;
    for (; m + MK_ROWS <= M; m += MK_ROWS)
        micro_kernel(MK_ROWS, NV, K, A + m * ars, ars, acs, B, ldb, C + m * ldc, ldc, accumulate);
    int rest = M - m;
    if (!rest)
        return;
    A += m * ars;
    C += m * ldc;
    switch (rest) {
#define TAIL(r)                                                                                    \
    case r:                                                                                        \
        if (r < MK_ROWS)                                                                           \
            micro_kernel(r < MK_ROWS ? r : 1, NV, K, A, ars, acs, B, ldb, C, ldc, accumulate);     \
        break;
        TAIL(1) TAIL(2) TAIL(3) TAIL(4) TAIL(5) TAIL(6) TAIL(7)
#undef TAIL
    default: break;
    }
}

/* The column panels of one A addressing mode. */
static ALWAYS_INLINE void gemm_panels(int M, int n16, int K, const float *A, ptrdiff_t ars,
                                      ptrdiff_t acs, const float *B, ptrdiff_t ldb, float *C,
                                      ptrdiff_t ldc, int accumulate)
{
    int n = 0;
    for (; n + MK_VECS * VL <= n16; n += MK_VECS * VL)
        gemm_panel(MK_VECS, M, K, A, ars, acs, B + n, ldb, C + n, ldc, accumulate);
    int nv = (n16 - n) / VL;
    switch (nv) {
#define TAILV(v)                                                                                   \
    case v:                                                                                        \
        if (v < MK_VECS)                                                                           \
            gemm_panel(v < MK_VECS ? v : 1, M, K, A, ars, acs, B + n, ldb, C + n, ldc, accumulate); \
        break;
        TAILV(1) TAILV(2) TAILV(3)
#undef TAILV
    default: break;
    }
}

static void tile_gemm(int M, int n16, int K, const float *A, ptrdiff_t ars, ptrdiff_t acs,
                      const float *B, ptrdiff_t ldb, float *C, ptrdiff_t ldc, int accumulate)
{
    if (M <= 0 || n16 <= 0)
        return;
    /* Specialise the two layouts the kernels use, so that one stride is 1. */
    if (acs == 1)
        gemm_panels(M, n16, K, A, ars, 1, B, ldb, C, ldc, accumulate);
    else if (ars == 1)
        gemm_panels(M, n16, K, A, 1, acs, B, ldb, C, ldc, accumulate);
    else
        gemm_panels(M, n16, K, A, ars, acs, B, ldb, C, ldc, accumulate);
}

static void tile_softmax_fwd(float *S, int nk, int n16, ptrdiff_t lds, float *m, float *l, float *alpha)
{
    const vf ninf = vset1(-INFINITY);
    for (int i = 0; i < n16; i += VL) {
        vf mold = vload(m + i), mx = mold;
        for (int j = 0; j < nk; j++)
            mx = vmax(mx, vload(S + j * lds + i));
        /* A column with no key so far subtracts 0 instead of -inf: p = 2^-inf = 0. */
        vf base = vselect(mx == ninf, vzero(), mx);
        vf a = vexp2(mold - base);
        vf sum = vzero();
        for (int j = 0; j < nk; j++) {
            vf p = vexp2(vload(S + j * lds + i) - base);
            vstore(S + j * lds + i, p);
            sum += p;
        }
        vstore(m + i, mx);
        vstore(alpha + i, a);
        vstore(l + i, vfma(vload(l + i), a, sum));
    }
}

/* One row's share of tile_softmax_bwd; CAP (a constant at both call sites)
 * says whether dS takes the softcap's factor dt. */
static ALWAYS_INLINE void softmax_bwd_row(const bool CAP, float *s, float *dp, const float *dt, int j, int n16,
                                          int begin, int end, vf vc, vf vscale, vf nl, vf d)
{
    /* whole vectors before the first visible key */
    for (; j + VL <= begin; j += VL) {
        vstore(s + j, vzero());
        vstore(dp + j, vzero());
    }
    const vf one = vset1(1.0f);
    for (; j < end; j += VL) {
        vf p = vexp2(vfma(vload(s + j), vc, nl));
        /* P <= 1 in exact arithmetic, but where the scores are huge (a
         * softcap of 1e10 with a like scale) the score recomputed here may
         * exceed the forward's LSE by far more than 1 (an ulp of 1e10 is
         * 1024): 2^that saturates, and scale * P * dP overflows to inf and
         * then NaN. Clamped, P stays a probability; NaN stays NaN (NaN > 1
         * is false) */
        p = vselect(p > one, one, p);
        vf ds = vscale * p * (vload(dp + j) - d);
        if (CAP)
            ds = ds * vload(dt + j);
        if (j < begin || j + VL > end) {
            /* a vector that straddles a limit: zero the lanes outside,
             * selected, not multiplied by p = 0: a hidden lane's dP may be
             * NaN (a non-finite dO or V row), and 0 * NaN would leak it */
            vi keep;
            for (int k = 0; k < VL; k++)
                keep[k] = j + k >= begin && j + k < end ? -1 : 0;
            p = vselect(keep, p, vzero());
            ds = vselect(keep, ds, vzero());
        }
        vstore(s + j, p);
        vstore(dp + j, ds);
    }
    for (; j < n16; j += VL) {
        vstore(s + j, vzero());
        vstore(dp + j, vzero());
    }
}

static void tile_softmax_bwd(float *S, float *dP, int nq, int j0, int n16, ptrdiff_t ld, const int *lo,
                             const int *lim, float c, float scale, const float *lse2, const float *D,
                             const float *dt)
{
    const vf vc = vset1(c), vscale = vset1(scale);
    for (int i = 0; i < nq; i++) {
        vf nl = vset1(-lse2[i]), d = vset1(D[i]);
        if (dt)
            softmax_bwd_row(true, S + i * ld, dP + i * ld, dt + i * ld, j0, n16, lo[i], lim[i], vc, vscale, nl,
                            d);
        else
            softmax_bwd_row(false, S + i * ld, dP + i * ld, NULL, j0, n16, lo[i], lim[i], vc, vscale, nl, d);
    }
}

static void tile_softcap(float *X, int rows, int n16, ptrdiff_t ld, float in, float out, float *dt)
{
    const vf vin = vset1(in), vout = vset1(out), one = vset1(1.0f);
    for (int r = 0; r < rows; r++) {
        float *x = X + r * ld;
        for (int j = 0; j < n16; j += VL) {
            vf t = vtanh(vin * vload(x + j));
            vstore(x + j, vout * t);
            if (dt)
                vstore(dt + r * ld + j, one - t * t);
        }
    }
}

static void tile_scale_rows(float *C, int M, int n16, ptrdiff_t ldc, const float *alpha)
{
    for (int r = 0; r < M; r++) {
        if (alpha[r] == 1.0f)
            continue;
        vf a = vset1(alpha[r]);
        for (int j = 0; j < n16; j += VL)
            vstore(C + r * ldc + j, a * vload(C + r * ldc + j));
    }
}

static void tile_load(float *dst, const void *src, cp_dtype t, size_t n, size_t npad, float s)
{
    size_t i = 0;
    const vf vs = vset1(s);
    switch (t) {
    case CP_DTYPE_F32: {
        const float *x = src;
        for (; i + VL <= n; i += VL)
            vstore(dst + i, vs * vload(x + i));
        for (; i < n; i++)
            dst[i] = s * x[i];
        break;
    }
    case CP_DTYPE_F16: {
        const uint16_t *x = src;
        for (; i + VL <= n; i += VL)
            vstore(dst + i, vs * vload_f16(x + i));
        for (; i < n; i++)
            dst[i] = s * cpi_f16_to_f32(x[i]);
        break;
    }
    case CP_DTYPE_BF16: {
        const uint16_t *x = src;
        for (; i + VL <= n; i += VL)
            vstore(dst + i, vs * vload_bf16(x + i));
        for (; i < n; i++)
            dst[i] = s * cpi_bf16_to_f32(x[i]);
        break;
    }
    case CP_DTYPE_F64: {
        const double *x = src;
        for (; i < n; i++)
            dst[i] = s * (float)x[i];
        break;
    }
    case CP_DTYPE_FP8_E4M3: {
        const uint8_t *x = src;
        for (; i + VL <= n; i += VL)
            vstore(dst + i, vs * vload_fp8(x + i));
        for (; i < n; i++)
            dst[i] = s * cpi_fp8_e4m3_to_f32(x[i]);
        break;
    }
    }
    for (; i < npad; i++)
        dst[i] = 0;
}

static void tile_store(void *dst, cp_dtype t, const float *src, size_t n, float s, int add)
{
    size_t i = 0;
    const vf vs = vset1(s);
    switch (t) {
    case CP_DTYPE_F32: {
        float *y = dst;
        for (; i + VL <= n; i += VL)
            vstore(y + i, add ? vfma(vs, vload(src + i), vload(y + i)) : (vf)(vs * vload(src + i)));
        for (; i < n; i++)
            y[i] = add ? s * src[i] + y[i] : s * src[i];
        break;
    }
    case CP_DTYPE_F16: {
        uint16_t *y = dst;
        for (; i + VL <= n; i += VL)
            vstore_f16(y + i, add ? vfma(vs, vload(src + i), vload_f16(y + i)) : (vf)(vs * vload(src + i)));
        for (; i < n; i++)
            y[i] = cpi_f32_to_f16(add ? s * src[i] + cpi_f16_to_f32(y[i]) : s * src[i]);
        break;
    }
    case CP_DTYPE_BF16: {
        uint16_t *y = dst;
        for (; i + VL <= n; i += VL)
            vstore_bf16(y + i, add ? vfma(vs, vload(src + i), vload_bf16(y + i)) : (vf)(vs * vload(src + i)));
        for (; i < n; i++)
            y[i] = cpi_f32_to_bf16(add ? s * src[i] + cpi_bf16_to_f32(y[i]) : s * src[i]);
        break;
    }
    case CP_DTYPE_F64: {
        double *y = dst;
        for (; i < n; i++)
            y[i] = add ? (double)(s * src[i]) + y[i] : (double)(s * src[i]);
        break;
    }
    case CP_DTYPE_FP8_E4M3: { /* no kernel writes FP8 (kernel.c); for completeness */
        uint8_t *y = dst;
        for (; i < n; i++)
            y[i] = cpi_f64_to_fp8_e4m3(add ? s * src[i] + cpi_fp8_e4m3_to_f32(y[i]) : s * src[i]);
        break;
    }
    }
}

static float tile_dot(const float *a, const float *b, size_t n)
{
    vf acc = vzero();
    size_t i = 0;
    for (; i + VL <= n; i += VL)
        acc = vfma(vload(a + i), vload(b + i), acc);
    float s = vreduce_add(acc);
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static int tile_all_finite(const float *x, size_t n)
{
    /* x * 0 is 0 for every finite x and NaN for inf and NaN */
    vf acc = vzero();
    size_t i = 0;
    for (; i + VL <= n; i += VL)
        acc += vload(x + i) * vzero();
    float s = vreduce_add(acc);
    for (; i < n; i++)
        s += x[i] * 0.0f;
    return s == 0.0f;
}

const cpi_tile_ops CPI_TILE_TABLE = {
    .name = CPI_TILE_NAME,
    .gemm = tile_gemm,
    .softmax_fwd = tile_softmax_fwd,
    .softmax_bwd = tile_softmax_bwd,
    .softcap = tile_softcap,
    .scale_rows = tile_scale_rows,
    .load = tile_load,
    .store = tile_store,
    .dot = tile_dot,
    .all_finite = tile_all_finite,
};
