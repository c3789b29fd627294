/* SPDX-License-Identifier: MIT */
/*
 * Attention sinks (API 1.1, cp_attn_desc.sinks): one learned logit per
 * query head that joins every row's softmax denominator and has no value.
 * A sink is a block of its own whose one score is sink[h] and whose output
 * is 0, so the forward merges it into each row's final (O, LSE) once, after
 * all keys, exactly like any other block; the backward's kernels then need
 * nothing new (they recompute P from the final LSE, which includes the
 * sink), and the sink's own gradient is -sum_i P_sink,i rowsum(dO_i * O_i)
 * with P_sink,i = exp(sink - LSE_i), over this rank's rows.
 *
 * Host code: plan.c allows sinks on CPU contexts only, for now.
 */
#include <math.h>

#include "attn/plan.h"
#include "core/half.h"

cp_status cpi_sinks_merge(const cp_attn_plan *p, const cpi_tensor *o32, const cpi_lse *lse, int32_t h0,
                          const float *sinks)
{
    int64_t sb, ss, sh;
    cpi_tensor_strides(p, o32, &sb, &ss, &sh);
    float *o = o32->data;
    for (int64_t b = 0; b < p->desc.batch; b++)
        for (int32_t h = 0; h < o32->heads; h++) {
            const double sink = sinks[h0 + h];
            const size_t at = ((size_t)b * (size_t)lse->heads + (size_t)h) * (size_t)lse->ntok;
            for (int64_t i = 0; i < o32->ntok; i++) {
                float *l = lse->data + at + i, *lo = lse->lo ? lse->lo + at + i : NULL;
                const double old = (double)*l + (lo ? (double)*lo : 0.0);
                /* log(exp(old) + exp(sink)), NaN in either staying NaN */
                double m = old > sink ? old : sink, now;
                if (isnan(old) || isnan(sink))
                    now = NAN;
                else if (m == -INFINITY)
                    continue; /* no key and no sink weight: nothing changes */
                else if (m == INFINITY)
                    now = INFINITY;
                else
                    now = m + log(exp(old - m) + exp(sink - m));
                const float w = (float)exp(old - now); /* the keys' share of the new denominator */
                float *row = o + b * sb + i * ss + h * sh;
                for (int32_t e = 0; e < o32->dim; e++)
                    row[e] *= w;
                *l = (float)now;
                if (lo)
                    *lo = (float)(now - (double)*l);
            }
        }
    return CP_SUCCESS;
}

/* Element e of a row of the plan's dtype, as a double. */
static double elem(const void *row, cp_dtype t, int32_t e)
{
    switch (t) {
    case CP_DTYPE_F16: return cpi_f16_to_f32(((const uint16_t *)row)[e]);
    case CP_DTYPE_BF16: return cpi_bf16_to_f32(((const uint16_t *)row)[e]);
    default: return ((const float *)row)[e];
    }
}

cp_status cpi_sinks_grad(const cp_attn_plan *p, const void *out, const void *dout, const float *lse,
                         const float *sinks, float *dsinks)
{
    const cp_attn_desc *d = &p->desc;
    const cpi_tensor o = cpi_user_tensor(p, out, d->num_heads, d->head_dim_v, d->dtype);
    int64_t sb, ss, sh;
    cpi_tensor_strides(p, &o, &sb, &ss, &sh);
    const size_t es = cpi_dtype_size(d->dtype);
    for (int32_t h = 0; h < d->num_heads; h++) {
        double g = 0;
        for (int64_t b = 0; b < d->batch; b++)
            for (int64_t i = 0; i < p->s_loc; i++) {
                const double l = lse[((size_t)b * (size_t)d->num_heads + (size_t)h) * (size_t)p->s_loc + (size_t)i];
                if (l == -INFINITY)
                    continue; /* no key and no sink weight */
                const size_t at = (size_t)(b * sb + i * ss + h * sh) * es;
                double D = 0;
                for (int32_t e = 0; e < d->head_dim_v; e++)
                    D += elem((const char *)dout + at, d->dtype, e) * elem((const char *)out + at, d->dtype, e);
                g -= exp((double)sinks[h] - l) * D;
            }
        dsinks[h] = (float)g;
    }
    return CP_SUCCESS;
}
