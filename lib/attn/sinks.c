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
 * On the CPU all of it is host code. On a device the forward is the
 * backend's merge of a part whose output is 0 and whose LSE is the sink
 * (rows filled by copies on the device), so nothing waits; the backward
 * takes the rowsums with the backend's row_dot and sums them on the device
 * with its sink_grad, so nothing waits either. A backend without sink_grad
 * (a module built against an earlier 1.2) gets the sum on the host: the
 * rowsums and the LSE copied back, one wait per backward. plan.c refuses
 * sinks on a device backend without row_dot.
 */
#include <math.h>
#include <stdlib.h>

#include "attn/plan.h"
#include "backend/backend.h"
#include "core/elem.h"

static bool on_device(const cp_attn_plan *p)
{
    return p->ctx->device != CP_DEVICE_CPU;
}

cpi_sinks_scratch cpi_sinks_take(const cp_attn_plan *p, cpi_arena *ws, int64_t ntok, int32_t heads)
{
    cpi_sinks_scratch sc = { NULL, NULL };
    if (!p->desc.sinks || !on_device(p))
        return sc;
    sc.lse_part = cpi_arena_take(ws, (size_t)p->desc.batch * (size_t)heads * (size_t)ntok * sizeof(float));
    sc.zero = cpi_arena_take(ws, (size_t)heads * (size_t)p->desc.head_dim_v * sizeof(float));
    return sc;
}

/* The device's merge of the sinks: (o32, lse) <- merge((o32, lse), (0, sink)).
 * The merge reads the running LSE without its residual (lse->lo), so the
 * result is rounded from the float LSE; the residual is spent and zeroed.
 * (One difference from the host code: a row that saw no key and has a NaN
 * sink gets O = 0 here, with its LSE NaN.) */
static cp_status merge_on_device(const cp_attn_plan *p, const cpi_tensor *o32, const cpi_lse *lse, int32_t h0,
                                 const float *sinks, const cpi_sinks_scratch *sc)
{
    const cp_backend_ops *ops = p->ctx->ops;
    void *st = p->ctx->state;
    const int64_t B = p->desc.batch, n = lse->ntok;
    const int32_t H = lse->heads, Dv = o32->dim;
    const size_t pitch = (size_t)n * sizeof(float);
    /* the first column of every (b, h) row of lse_part: sink[h0 + h] */
    for (int64_t b = 0; b < B; b++)
        CPI_TRY(ops->copy_2d(st, sc->lse_part + (size_t)b * (size_t)H * (size_t)n, pitch, sinks + h0, sizeof(float),
                             sizeof(float), (size_t)H, CP_COPY_DEVICE_TO_DEVICE));
    /* then to the end of each row */
    CPI_TRY(cpi_fill_rows(p, sc->lse_part, (size_t)(B * H), (size_t)n, 1));
    CPI_TRY(ops->memset(st, sc->zero, 0, (size_t)H * (size_t)Dv * sizeof(float)));
    int64_t sb, ss, sh;
    cpi_tensor_strides(p, o32, &sb, &ss, &sh);
    cp_kernel_merge_args m = CP_KERNEL_MERGE_ARGS_INIT;
    m.format = p->desc.format;
    m.batch = B;
    m.seq = n;
    m.num_heads = H;
    m.head_dim_v = Dv;
    m.o = o32->data;
    m.o_stride_b = sb;
    m.o_stride_s = ss;
    m.o_stride_h = sh;
    m.o_dtype = CP_DTYPE_F32;
    m.lse = lse->data;
    m.lse_stride_b = (int64_t)H * n;
    m.lse_stride_h = n;
    m.o_part = sc->zero; /* the same zero row for every (b, i): strides 0 */
    m.o_part_stride_b = 0;
    m.o_part_stride_s = 0;
    m.o_part_stride_h = Dv;
    m.o_part_dtype = CP_DTYPE_F32;
    m.lse_part = sc->lse_part;
    m.lse_part_stride_b = (int64_t)H * n;
    m.lse_part_stride_h = n;
    CPI_TRY(ops->merge(st, &m));
    if (lse->lo)
        CPI_TRY(ops->memset(st, lse->lo, 0, (size_t)B * (size_t)H * (size_t)n * sizeof(float)));
    return CP_SUCCESS;
}

cp_status cpi_sinks_merge(const cp_attn_plan *p, const cpi_tensor *o32, const cpi_lse *lse, int32_t h0,
                          const float *sinks, const cpi_sinks_scratch *sc)
{
    if (on_device(p))
        return merge_on_device(p, o32, lse, h0, sinks, sc);
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

size_t cpi_sinks_grad_bytes(const cp_attn_plan *p)
{
    if (!p->desc.sinks || !on_device(p))
        return 0;
    return (size_t)p->desc.batch * (size_t)p->desc.num_heads * (size_t)p->s_loc * sizeof(float);
}

/* The device's gradient: rowsums by row_dot into ws, then summed by the
 * backend's sink_grad, or on the host without one. */
static cp_status grad_on_device(const cp_attn_plan *p, const void *out, const void *dout, const float *lse,
                                const float *sinks, float *dsinks, void *ws, size_t ws_bytes)
{
    const cp_attn_desc *d = &p->desc;
    const cp_backend_ops *ops = p->ctx->ops;
    void *st = p->ctx->state;
    const size_t n = (size_t)d->batch * (size_t)d->num_heads * (size_t)p->s_loc, bytes = n * sizeof(float);
    const size_t hb = (size_t)d->num_heads * sizeof(float);
    if (!ws || ws_bytes < bytes)
        return cpi_error(CP_ERROR_INTERNAL, "attention sinks: %zu workspace bytes for %zu rowsums", ws_bytes, n);
    const cpi_tensor o = cpi_user_tensor(p, out, d->num_heads, d->head_dim_v, d->dtype);
    int64_t sb, ss, sh;
    cpi_tensor_strides(p, &o, &sb, &ss, &sh);
    CPI_TRY(ops->row_dot(st, ws, dout, out, d->dtype, d->batch, p->s_loc, d->num_heads, d->head_dim_v, sb, ss, sh));
    if (CP_BACKEND_HAS(ops, sink_grad)) /* in stream order, like the rest of the backward */
        return ops->sink_grad(st, dsinks, sinks, lse, ws, d->batch, p->s_loc, d->num_heads);
    float *rows = malloc(bytes), *l = malloc(bytes), *sk = malloc(hb), *g = malloc(hb);
    cp_status s = rows && l && sk && g ? CP_SUCCESS : CP_ERROR_OUT_OF_MEMORY;
    if (s == CP_SUCCESS)
        s = ops->copy_2d(st, rows, bytes, ws, bytes, bytes, 1, CP_COPY_DEVICE_TO_HOST);
    if (s == CP_SUCCESS)
        s = ops->copy_2d(st, l, bytes, lse, bytes, bytes, 1, CP_COPY_DEVICE_TO_HOST);
    if (s == CP_SUCCESS)
        s = ops->copy_2d(st, sk, hb, sinks, hb, hb, 1, CP_COPY_DEVICE_TO_HOST);
    if (s == CP_SUCCESS)
        s = ops->synchronize(st);
    if (s == CP_SUCCESS) /* the CPU backend's sum of the same rows */
        s = cpi_cpu_backend()->sink_grad(NULL, g, sk, l, rows, d->batch, p->s_loc, d->num_heads);
    if (s == CP_SUCCESS)
        s = ops->copy_2d(st, dsinks, hb, g, hb, hb, 1, CP_COPY_HOST_TO_DEVICE);
    if (s == CP_SUCCESS) /* g is host memory the copy may still read */
        s = ops->synchronize(st);
    free(rows);
    free(l);
    free(sk);
    free(g);
    return s;
}

cp_status cpi_sinks_grad(const cp_attn_plan *p, const void *out, const void *dout, const float *lse,
                         const float *sinks, float *dsinks, void *ws, size_t ws_bytes)
{
    if (on_device(p))
        return grad_on_device(p, out, dout, lse, sinks, dsinks, ws, ws_bytes);
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
                    D += cpi_load_elem((const char *)dout + at, d->dtype, (size_t)e) *
                         cpi_load_elem((const char *)out + at, d->dtype, (size_t)e);
                g -= exp((double)sinks[h] - l) * D;
            }
        dsinks[h] = (float)g;
    }
    return CP_SUCCESS;
}
