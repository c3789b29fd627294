/* SPDX-License-Identifier: MIT */
/* FP8 E4M3 conversions (see fp8.h). */
#include <math.h>

#include "core/fp8.h"

/* Code c as a constant expression: exponent field e, mantissa m; normal
 * (8 + m) 2^(e - 10), subnormal m 2^-9, e = 15 with m = 7 NaN. */
#define E4M3_MAG(c)                                                                                  \
    ((((c) >> 3) & 15) == 15 && ((c) & 7) == 7 ? NAN                                                 \
     : (((c) >> 3) & 15) == 0                  ? (float)((c) & 7) * 0x1p-9f                          \
                                               : (float)(8 + ((c) & 7)) * (float)(1 << (((c) >> 3) & 15)) * 0x1p-10f)
#define E4M3(c) ((c) & 0x80 ? -E4M3_MAG((c) & 0x7f) : E4M3_MAG(c)),
#define E4M3_4(c) E4M3(c) E4M3((c) + 1) E4M3((c) + 2) E4M3((c) + 3)
#define E4M3_16(c) E4M3_4(c) E4M3_4((c) + 4) E4M3_4((c) + 8) E4M3_4((c) + 12)
#define E4M3_64(c) E4M3_16(c) E4M3_16((c) + 16) E4M3_16((c) + 32) E4M3_16((c) + 48)

const float cpi_fp8_e4m3_values[256] = { E4M3_64(0) E4M3_64(64) E4M3_64(128) E4M3_64(192) };

uint8_t cpi_f64_to_fp8_e4m3(double x)
{
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    const double a = fabs(x);
    if (isnan(x) || a > 464.0)
        return sign | 0x7f;
    if (a == 0)
        return sign;
    /* the quantum of a's binade (of the subnormals below 2^-6): 2^(E - 3) */
    int e;
    frexp(a, &e); /* a = f 2^e, f in [0.5, 1): the binade's exponent is e - 1 */
    const int q = (e - 1 < -6 ? -6 : e - 1) - 3;
    const double r = ldexp(nearbyint(ldexp(a, -q)), q); /* rounded to nearest even */
    if (r < 0x1p-6) /* subnormal; one that rounded up to 2^-6 is the first normal */
        return sign | (uint8_t)ldexp(r, 9);
    const int E = ilogb(r);
    const int m = (int)ldexp(r, 3 - E) - 8;
    return sign | (uint8_t)((E + 7) << 3 | m);
}
