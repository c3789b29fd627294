/* SPDX-License-Identifier: MIT */
/*
 * The vector layer the tile kernels are written in: a float vector type
 * `vf` of VL lanes and a handful of operations on it, for one instruction set
 * chosen by the including file before it includes this header:
 *
 *   CPI_SIMD_AVX512   16 lanes, AVX-512F (+ F16C for half conversion)
 *   CPI_SIMD_AVX2      8 lanes, AVX2 + FMA + F16C
 *   (neither)          4 lanes, GCC vector extensions only: portable C that
 *                      the compiler lowers to SSE2, NEON or scalar code
 *
 * The ISA files set the matching `#pragma GCC target` first, so the library
 * itself is built without -m flags and picks an ISA at run time.
 *
 * Everything that does not need a special instruction (exp2, blends, integer
 * bit work) is written once with GCC vector extensions on these types.
 */
#ifndef INFINICP_CPU_SIMD_H
#define INFINICP_CPU_SIMD_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/fp8.h"

#if defined(CPI_SIMD_AVX512) || defined(CPI_SIMD_AVX2)
#include <immintrin.h>
#endif

#if defined(CPI_SIMD_AVX512)
#define VL 16
typedef __m512 vf;
typedef int32_t vi __attribute__((vector_size(64)));
static inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vmax(vf a, vf b) { return _mm512_max_ps(a, b); }
static inline vf vset1(float x) { return _mm512_set1_ps(x); }
static inline vf vzero(void) { return _mm512_setzero_ps(); }
static inline vf vload_f16(const uint16_t *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}
static inline void vstore_f16(uint16_t *p, vf x)
{
    _mm256_storeu_si256((__m256i *)p, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
/* FP8 E4M3 (see vfp8_f16 below) */
static inline vf vload_fp8(const uint8_t *p)
{
    const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)p));
    const __m256i m = _mm256_set1_epi16(0x7f), mag = _mm256_and_si256(w, m);
    const __m256i h = _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8),
                                      _mm256_blendv_epi8(_mm256_slli_epi16(mag, 7), _mm256_set1_epi16(0x7e00),
                                                         _mm256_cmpeq_epi16(mag, m)));
    return _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
}
#elif defined(CPI_SIMD_AVX2)
#define VL 8
typedef __m256 vf;
typedef int32_t vi __attribute__((vector_size(32)));
static inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vmax(vf a, vf b) { return _mm256_max_ps(a, b); }
static inline vf vset1(float x) { return _mm256_set1_ps(x); }
static inline vf vzero(void) { return _mm256_setzero_ps(); }
static inline vf vload_f16(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}
static inline void vstore_f16(uint16_t *p, vf x)
{
    _mm_storeu_si128((__m128i *)p, _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
static inline vf vload_fp8(const uint8_t *p)
{
    const __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)p));
    const __m128i m = _mm_set1_epi16(0x7f), mag = _mm_and_si128(w, m);
    const __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8),
                                   _mm_blendv_epi8(_mm_slli_epi16(mag, 7), _mm_set1_epi16(0x7e00),
                                                   _mm_cmpeq_epi16(mag, m)));
    return _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
}
#else
#include "core/half.h"
#define VL 4
typedef float vf __attribute__((vector_size(16)));
typedef int32_t vi __attribute__((vector_size(16)));
/* Not fused: a software fma would be far slower than the rounding it saves. */
static inline vf vfma(vf a, vf b, vf c) { return a * b + c; }
static inline vf vmax(vf a, vf b)
{
    vi gt = a > b; /* NaN compares false and yields b, as maxps does */
    return (vf)((gt & (vi)a) | (~gt & (vi)b));
}
static inline vf vset1(float x) { return (vf){x, x, x, x}; }
static inline vf vzero(void) { return (vf){0, 0, 0, 0}; }
static inline vf vload_f16(const uint16_t *p)
{
    vf r;
    for (int i = 0; i < VL; i++)
        r[i] = cpi_f16_to_f32(p[i]);
    return r;
}
static inline void vstore_f16(uint16_t *p, vf x)
{
    for (int i = 0; i < VL; i++)
        p[i] = cpi_f32_to_f16(x[i]);
}
static inline vf vload_fp8(const uint8_t *p)
{
    vf r;
    for (int i = 0; i < VL; i++)
        r[i] = cpi_fp8_e4m3_to_f32(p[i]);
    return r;
}
#endif

/*
 * vload_fp8: VL FP8 E4M3 codes to floats, exactly. The generic one looks
 * the values up in a table; the x86 ones build the binary16 bits of each
 * value divided by 2^8 (e4m3's exponent bias 7 is f16's 15 less 8, and its
 * 7 bits of exponent and mantissa shifted up by 7 are f16's, subnormals
 * landing on f16's subnormals), put S.1111.111 on an f16 NaN and the sign
 * on f16's, widen with the F16C conversion (exact, subnormals too, as for
 * F16 tensors) and multiply by 2^8 (exact: the products are normal).
 */

typedef uint16_t vu16 __attribute__((vector_size(VL * 2)));
typedef uint32_t vu32 __attribute__((vector_size(VL * 4)));

/* Unaligned loads and stores; memcpy compiles to one vector move. */
static inline vf vload(const float *p)
{
    vf r;
    memcpy(&r, p, sizeof r);
    return r;
}
static inline void vstore(float *p, vf x)
{
    memcpy(p, &x, sizeof x);
}

/* bf16 is the top half of a float: widen and shift. */
static inline vf vload_bf16(const uint16_t *p)
{
    vu16 h;
    memcpy(&h, p, sizeof h);
    vu32 w = __builtin_convertvector(h, vu32) << 16;
    return (vf)w;
}

/* Round to nearest even at bit 16, NaN kept a quiet NaN (as cpi_f32_to_bf16). */
static inline void vstore_bf16(uint16_t *p, vf x)
{
    vu32 u = (vu32)x;
    vu32 nan = (vu32)((u & 0x7fffffffu) > 0x7f800000u);
    vu32 rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    vu32 quiet = (u >> 16) | 0x40u;
    vu16 h = __builtin_convertvector((nan & quiet) | (~nan & rounded), vu16);
    memcpy(p, &h, sizeof h);
}

/* mask ? a : b, lane by lane, for a mask from a vector comparison. */
static inline vf vselect(vi mask, vf a, vf b)
{
    return (vf)((mask & (vi)a) | (~mask & (vi)b));
}

/*
 * 2^x for every lane, relative error below 2e-7 for results in the normal
 * range; exactly 0 for x <= -127 (so -inf gives 0) and saturated at 2^127
 * for x >= 127. A NaN stays NaN: both clamps pass it through (vmax returns
 * its second operand when either is NaN, and NaN > hi is false), and NaN
 * times the exponent factor is NaN, so a NaN score is never mistaken for a
 * masked one. x = n + f with n = round(x), |f| <= 1/2; 2^f from its Taylor
 * series to degree 6 (truncation error (ln2/2)^7/7! = 1.2e-7), and 2^n by
 * building the exponent field.
 */
static inline vf vexp2(vf x)
{
    const vf lo = vset1(-127.0f), hi = vset1(127.0f);
    x = vmax(lo, x);
    x = vselect(x > hi, hi, x); /* min(x, hi) */
    /* round to nearest: adding 1.5*2^23 leaves n in the low mantissa bits */
    const vf magic = vset1(12582912.0f);
    vf t = x + magic;
    vf n = t - magic;
    vf f = x - n;
    vf p = vset1(1.5403530393381608e-4f);
    p = vfma(p, f, vset1(1.3333558146428443e-3f));
    p = vfma(p, f, vset1(9.6181291076284772e-3f));
    p = vfma(p, f, vset1(5.5504108664821580e-2f));
    p = vfma(p, f, vset1(2.4022650695910071e-1f));
    p = vfma(p, f, vset1(6.9314718055994531e-1f));
    p = vfma(p, f, vset1(1.0f));
    /* n in [-127, 127]: biased exponent n + 127 in [0, 254]; 0 encodes +0 */
    vi e = ((vi)t - (vi)magic + 127) << 23;
    return p * (vf)e;
}

/* |x| for every lane (the sign bit cleared; NaN stays NaN). */
static inline vf vabs(vf x)
{
    return (vf)((vi)x & 0x7fffffff);
}

/*
 * tanh for every lane, absolute error below 1e-7 (1.6 units in the last
 * place of 1; measured against tanh in double over [-20, 20] in steps of
 * 1e-5), relative error below 2e-7. NaN stays NaN (vexp2 passes it, and a
 * NaN fails the comparison below) and +-inf gives exactly +-1. For
 * |x| < 0.55 the odd Taylor series to x^15 (truncation below 3e-8), which
 * keeps the relative precision of small arguments; beyond, 1 - 2 / (e^2|x| + 1)
 * with the sign of x, which no longer cancels (the result is >= 0.5). Both
 * are computed and one is selected per lane.
 */
static inline vf vtanh(vf x)
{
    vf a = vabs(x);
    vf e = vexp2(a * vset1(2.8853900817779268f)); /* e^(2|x|) = 2^(2|x| log2(e)) */
    vf big = vset1(1.0f) - vset1(2.0f) / (e + vset1(1.0f));
    big = (vf)((vi)big | ((vi)x & INT32_MIN));
    vf x2 = x * x;
    vf p = vset1(-1.4558343e-3f); /* -929569/638512875 */
    p = vfma(p, x2, vset1(3.5921280e-3f));   /* 21844/6081075 */
    p = vfma(p, x2, vset1(-8.8632355e-3f));  /* -1382/155925 */
    p = vfma(p, x2, vset1(2.1869488e-2f));   /* 62/2835 */
    p = vfma(p, x2, vset1(-5.3968254e-2f));  /* -17/315 */
    p = vfma(p, x2, vset1(1.3333334e-1f));   /* 2/15 */
    p = vfma(p, x2, vset1(-3.3333334e-1f));  /* -1/3 */
    vf small = vfma(p * x2, x, x);
    return vselect(a < vset1(0.55f), small, big);
}

/* Horizontal reductions (outside the hot loops). */
static inline float vreduce_add(vf x)
{
    float s = 0;
    for (int i = 0; i < VL; i++)
        s += x[i];
    return s;
}

#endif
