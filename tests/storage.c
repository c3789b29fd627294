/* SPDX-License-Identifier: MIT */
/* Exact storage-type conversions and a small generator (see storage.h). */
#include <math.h>

#include "storage.h"

size_t ref_dtype_size(cp_dtype t)
{
    return t == CP_DTYPE_F64 ? 8 : t == CP_DTYPE_F32 ? 4 : t == CP_DTYPE_FP8_E4M3 ? 1 : 2;
}

/* Format of a binary floating-point type: significand bits (with the hidden
 * one) and the minimum normal exponent, in frexp's convention (x = m 2^e with
 * 0.5 <= |m| < 1). */
static void format_of(cp_dtype t, int *bits, int *emin, int *emax)
{
    switch (t) {
    case CP_DTYPE_F16: *bits = 11, *emin = -13, *emax = 16; break;
    case CP_DTYPE_BF16: *bits = 8, *emin = -125, *emax = 128; break;
    case CP_DTYPE_F32: *bits = 24, *emin = -125, *emax = 128; break;
    case CP_DTYPE_FP8_E4M3: *bits = 4, *emin = -5, *emax = 9; break; /* largest 448 = 0.875 2^9 */
    default: *bits = 53, *emin = -1021, *emax = 1024; break;
    }
}

double ref_round(double x, cp_dtype t)
{
    if (t == CP_DTYPE_F64 || x == 0 || !isfinite(x))
        return x;
    int bits, emin, emax, e;
    format_of(t, &bits, &emin, &emax);
    frexp(x, &e);
    if (e < emin)
        e = emin; /* subnormal: the quantum stops shrinking */
    /* x / 2^(e - bits) rounded to an integer (nearbyint: ties to even) */
    double r = ldexp(nearbyint(ldexp(x, bits - e)), e - bits);
    if (t == CP_DTYPE_FP8_E4M3)
        return fabs(r) > 448 ? NAN : r; /* no infinity: S.1111.111 (480's place) is NaN */
    if (fabs(r) >= ldexp(1.0, emax))
        return x > 0 ? INFINITY : -INFINITY;
    return r;
}

double ref_fp8_e4m3_decode(uint8_t code)
{
    const double sign = code & 0x80 ? -1.0 : 1.0;
    const int e = (code >> 3) & 15, m = code & 7;
    if (e == 15 && m == 7)
        return NAN;
    if (e == 0) /* subnormal: 0.m 2^(1 - 7) */
        return sign * (m / 8.0) * ldexp(1.0, -6);
    return sign * (1.0 + m / 8.0) * ldexp(1.0, e - 7);
}

/* Bits of a value representable in a 16-bit type: 1 sign, `ebits` exponent
 * (bias 2^(ebits-1) - 1), the rest fraction. */
static uint16_t encode16(double x, int ebits)
{
    int fbits = 15 - ebits, bias = (1 << (ebits - 1)) - 1;
    uint16_t sign = signbit(x) ? 0x8000u : 0;
    x = fabs(x);
    if (isnan(x)) /* the quiet NaN: exponent all ones, top fraction bit */
        return sign | (uint16_t)(((1u << ebits) - 1) << fbits) | (uint16_t)(1u << (fbits - 1));
    if (isinf(x))
        return sign | (uint16_t)(((1u << ebits) - 1) << fbits);
    if (x == 0)
        return sign;
    int e;
    double m = frexp(x, &e); /* x = m 2^e, m in [0.5, 1) */
    int biased = e - 1 + bias;
    if (biased <= 0) /* subnormal: x = f 2^(1 - bias - fbits) */
        return sign | (uint16_t)ldexp(x, bias - 1 + fbits);
    uint16_t frac = (uint16_t)(ldexp(m, fbits + 1) - ldexp(1.0, fbits));
    return sign | (uint16_t)(biased << fbits) | frac;
}

static double decode16(uint16_t h, int ebits)
{
    int fbits = 15 - ebits, bias = (1 << (ebits - 1)) - 1;
    int emask = (1 << ebits) - 1;
    double sign = h & 0x8000u ? -1.0 : 1.0;
    int e = (h >> fbits) & emask;
    unsigned f = h & ((1u << fbits) - 1);
    if (e == emask)
        return f ? NAN : sign * INFINITY;
    if (e == 0)
        return sign * ldexp((double)f, 1 - bias - fbits);
    return sign * ldexp(1.0 + ldexp((double)f, -fbits), e - bias);
}

/* The code of x, a value of the format (or NaN). */
static uint8_t encode8(double x)
{
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    x = fabs(x);
    if (isnan(x))
        return sign | 0x7f;
    if (x < ldexp(1.0, -6)) /* zero or subnormal: x = m 2^-9 */
        return sign | (uint8_t)ldexp(x, 9);
    int e;
    double f = frexp(x, &e); /* x = f 2^e = (2f) 2^(e - 1), 2f = 1 + m/8 */
    return sign | (uint8_t)((e - 1 + 7) << 3) | (uint8_t)(ldexp(f, 4) - 8);
}

void ref_store(void *buf, cp_dtype t, size_t i, double x)
{
    switch (t) {
    case CP_DTYPE_F32: ((float *)buf)[i] = (float)x; break;
    case CP_DTYPE_F64: ((double *)buf)[i] = x; break;
    case CP_DTYPE_F16: ((uint16_t *)buf)[i] = encode16(x, 5); break;
    case CP_DTYPE_BF16: ((uint16_t *)buf)[i] = encode16(x, 8); break;
    case CP_DTYPE_FP8_E4M3: ((uint8_t *)buf)[i] = encode8(x); break;
    }
}

double ref_load(const void *buf, cp_dtype t, size_t i)
{
    switch (t) {
    case CP_DTYPE_F32: return ((const float *)buf)[i];
    case CP_DTYPE_F64: return ((const double *)buf)[i];
    case CP_DTYPE_F16: return decode16(((const uint16_t *)buf)[i], 5);
    case CP_DTYPE_BF16: return decode16(((const uint16_t *)buf)[i], 8);
    case CP_DTYPE_FP8_E4M3: return ref_fp8_e4m3_decode(((const uint8_t *)buf)[i]);
    }
    return NAN;
}

size_t ref_at(cp_format f, int64_t B, int64_t S, int64_t H, int64_t D, int64_t b, int64_t s, int64_t h, int64_t d)
{
    const int64_t row = f == CP_FORMAT_SBHD ? s * B + b : b * S + s;
    return (size_t)((row * H + h) * D + d);
}

void ref_store_tensor(void *buf, cp_dtype t, cp_format f, int64_t B, int64_t S, int64_t H, int64_t D,
                      const double *v)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < D; d++)
                    ref_store(buf, t, ref_at(f, B, S, H, D, b, s, h, d), v ? v[((b * S + s) * H + h) * D + d] : NAN);
}

void ref_load_tensor(const void *buf, cp_dtype t, cp_format f, int64_t B, int64_t S, int64_t H, int64_t D,
                     double *v)
{
    for (int64_t b = 0; b < B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < D; d++)
                    v[((b * S + s) * H + h) * D + d] = ref_load(buf, t, ref_at(f, B, S, H, D, b, s, h, d));
}

uint64_t ref_rng_next(ref_rng *r)
{
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    return r->s * 0x2545F4914F6CDD1DULL;
}

double ref_rng_uniform(ref_rng *r, double lo, double hi)
{
    return lo + (hi - lo) * (double)(ref_rng_next(r) >> 11) * 0x1p-53;
}

int64_t ref_rng_int(ref_rng *r, int64_t lo, int64_t hi)
{
    return lo + (int64_t)(ref_rng_next(r) % (uint64_t)(hi - lo + 1));
}
