/* SPDX-License-Identifier: MIT */
/* FP64 reference attention and exact storage-type conversions (see ref_attn.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ref_attn.h"

size_t ref_attn_q_elems(const ref_attn_shape *s)
{
    return (size_t)(s->batch * s->seq_q * s->heads * s->head_dim);
}
size_t ref_attn_k_elems(const ref_attn_shape *s)
{
    return (size_t)(s->batch * s->seq_k * s->kv_heads * s->head_dim);
}
size_t ref_attn_v_elems(const ref_attn_shape *s)
{
    return (size_t)(s->batch * s->seq_k * s->kv_heads * s->head_dim_v);
}
size_t ref_attn_o_elems(const ref_attn_shape *s)
{
    return (size_t)(s->batch * s->seq_q * s->heads * s->head_dim_v);
}
size_t ref_attn_lse_elems(const ref_attn_shape *s)
{
    return (size_t)(s->batch * s->heads * s->seq_q);
}

static const double *q_row(const ref_attn_shape *s, const double *q, int64_t b, int64_t i, int h)
{
    return q + ((b * s->seq_q + i) * s->heads + h) * s->head_dim;
}
static size_t kv_index(const ref_attn_shape *s, int64_t b, int64_t j, int h, int dim)
{
    int kvh = h / (s->heads / s->kv_heads);
    return (size_t)(((b * s->seq_k + j) * s->kv_heads + kvh) * dim);
}
static size_t o_index(const ref_attn_shape *s, int64_t b, int64_t i, int h)
{
    return (size_t)(((b * s->seq_q + i) * s->heads + h) * s->head_dim_v);
}

static int visible(const ref_attn_shape *s, int64_t i, int64_t j)
{
    return !s->causal || s->k_offset + j <= s->q_offset + i;
}

/* Probabilities of query row (b, i, h) over all keys into p[seq_k]; returns
 * the LSE (natural log), -inf when the row sees no key (p all 0). */
static double row_probs(const ref_attn_shape *s, const double *q, const double *k, int64_t b, int64_t i,
                        int h, double *p)
{
    const double *qi = q_row(s, q, b, i, h);
    double mx = -INFINITY;
    for (int64_t j = 0; j < s->seq_k; j++) {
        p[j] = -INFINITY;
        if (!visible(s, i, j))
            continue;
        const double *kj = k + kv_index(s, b, j, h, s->head_dim);
        double dot = 0;
        for (int d = 0; d < s->head_dim; d++)
            dot += qi[d] * kj[d];
        p[j] = dot * s->scale;
        if (p[j] > mx)
            mx = p[j];
    }
    if (mx == -INFINITY) {
        for (int64_t j = 0; j < s->seq_k; j++)
            p[j] = 0;
        return -INFINITY;
    }
    double sum = 0;
    for (int64_t j = 0; j < s->seq_k; j++) {
        p[j] = p[j] == -INFINITY ? 0 : exp(p[j] - mx);
        sum += p[j];
    }
    for (int64_t j = 0; j < s->seq_k; j++)
        p[j] /= sum;
    return mx + log(sum);
}

void ref_attn_forward(const ref_attn_shape *s, const double *q, const double *k, const double *v, double *o,
                      double *lse)
{
    double *p = malloc(sizeof(double) * (size_t)s->seq_k);
    for (int64_t b = 0; b < s->batch; b++)
        for (int h = 0; h < s->heads; h++)
            for (int64_t i = 0; i < s->seq_q; i++) {
                double l = row_probs(s, q, k, b, i, h, p);
                if (lse)
                    lse[(b * s->heads + h) * s->seq_q + i] = l;
                double *oi = o + o_index(s, b, i, h);
                for (int e = 0; e < s->head_dim_v; e++)
                    oi[e] = 0;
                for (int64_t j = 0; j < s->seq_k; j++) {
                    if (p[j] == 0)
                        continue;
                    const double *vj = v + kv_index(s, b, j, h, s->head_dim_v);
                    for (int e = 0; e < s->head_dim_v; e++)
                        oi[e] += p[j] * vj[e];
                }
            }
    free(p);
}

/*
 * dO -> dV = P^T dO; dP = dO V^T; dS = P * (dP - rowsum(dO * O)) (the softmax
 * Jacobian); dQ = scale dS K; dK = scale dS^T Q.
 */
void ref_attn_backward(const ref_attn_shape *s, const double *q, const double *k, const double *v,
                       const double *dout, double *dq, double *dk, double *dv)
{
    memset(dq, 0, sizeof(double) * ref_attn_q_elems(s));
    memset(dk, 0, sizeof(double) * ref_attn_k_elems(s));
    memset(dv, 0, sizeof(double) * ref_attn_v_elems(s));
    double *p = malloc(sizeof(double) * (size_t)s->seq_k);
    double *o = malloc(sizeof(double) * (size_t)s->head_dim_v);
    for (int64_t b = 0; b < s->batch; b++)
        for (int h = 0; h < s->heads; h++)
            for (int64_t i = 0; i < s->seq_q; i++) {
                if (row_probs(s, q, k, b, i, h, p) == -INFINITY)
                    continue;
                const double *doi = dout + o_index(s, b, i, h);
                for (int e = 0; e < s->head_dim_v; e++)
                    o[e] = 0;
                for (int64_t j = 0; j < s->seq_k; j++) {
                    const double *vj = v + kv_index(s, b, j, h, s->head_dim_v);
                    for (int e = 0; e < s->head_dim_v; e++)
                        o[e] += p[j] * vj[e];
                }
                double D = 0;
                for (int e = 0; e < s->head_dim_v; e++)
                    D += doi[e] * o[e];
                const double *qi = q_row(s, q, b, i, h);
                double *dqi = dq + ((b * s->seq_q + i) * s->heads + h) * s->head_dim;
                for (int64_t j = 0; j < s->seq_k; j++) {
                    if (p[j] == 0)
                        continue;
                    size_t kj = kv_index(s, b, j, h, s->head_dim), vj = kv_index(s, b, j, h, s->head_dim_v);
                    double dp = 0;
                    for (int e = 0; e < s->head_dim_v; e++) {
                        dp += doi[e] * v[vj + e];
                        dv[vj + e] += p[j] * doi[e];
                    }
                    double ds = p[j] * (dp - D) * s->scale;
                    for (int d = 0; d < s->head_dim; d++) {
                        dqi[d] += ds * k[kj + d];
                        dk[kj + d] += ds * qi[d];
                    }
                }
            }
    free(o);
    free(p);
}

double ref_attn_loss(const ref_attn_shape *s, const double *q, const double *k, const double *v,
                     const double *dout)
{
    size_t n = ref_attn_o_elems(s);
    double *o = malloc(sizeof(double) * n);
    ref_attn_forward(s, q, k, v, o, NULL);
    double loss = 0;
    for (size_t i = 0; i < n; i++)
        loss += dout[i] * o[i];
    free(o);
    return loss;
}

/* ---- storage types ---------------------------------------------------- */

size_t ref_dtype_size(cp_dtype t)
{
    return t == CP_DTYPE_F64 ? 8 : t == CP_DTYPE_F32 ? 4 : 2;
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
    if (fabs(r) >= ldexp(1.0, emax))
        return x > 0 ? INFINITY : -INFINITY;
    return r;
}

/* Bits of a value representable in a 16-bit type: 1 sign, `ebits` exponent
 * (bias 2^(ebits-1) - 1), the rest fraction. */
static uint16_t encode16(double x, int ebits)
{
    int fbits = 15 - ebits, bias = (1 << (ebits - 1)) - 1;
    uint16_t sign = signbit(x) ? 0x8000u : 0;
    x = fabs(x);
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

void ref_store(void *buf, cp_dtype t, size_t i, double x)
{
    switch (t) {
    case CP_DTYPE_F32: ((float *)buf)[i] = (float)x; break;
    case CP_DTYPE_F64: ((double *)buf)[i] = x; break;
    case CP_DTYPE_F16: ((uint16_t *)buf)[i] = encode16(x, 5); break;
    case CP_DTYPE_BF16: ((uint16_t *)buf)[i] = encode16(x, 8); break;
    }
}

double ref_load(const void *buf, cp_dtype t, size_t i)
{
    switch (t) {
    case CP_DTYPE_F32: return ((const float *)buf)[i];
    case CP_DTYPE_F64: return ((const double *)buf)[i];
    case CP_DTYPE_F16: return decode16(((const uint16_t *)buf)[i], 5);
    case CP_DTYPE_BF16: return decode16(((const uint16_t *)buf)[i], 8);
    }
    return NAN;
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
