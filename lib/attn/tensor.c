/* SPDX-License-Identifier: MIT */
/* Tensor views and the copies between them (see tensor.h). */
#include <math.h>

#include "attn/plan.h"

void cpi_tensor_strides(const cp_attn_plan *p, const cpi_tensor *t, int64_t *sb, int64_t *ss, int64_t *sh)
{
    int64_t hd = (int64_t)t->heads * t->dim;
    *sh = t->dim;
    if (p->desc.format == CP_FORMAT_SBHD) {
        *sb = hd;
        *ss = p->desc.batch * hd;
    } else {
        *sb = t->ntok * hd;
        *ss = hd;
    }
}

size_t cpi_tensor_bytes(const cp_attn_plan *p, const cpi_tensor *t)
{
    /* Bounds were overflow-checked at plan creation for the largest tensor. */
    return (size_t)p->desc.batch * (size_t)t->ntok * (size_t)t->heads * (size_t)t->dim * cpi_dtype_size(t->dtype);
}

cpi_tensor cpi_tensor_take(const cp_attn_plan *p, cpi_arena *a, int64_t ntok, int32_t heads, int32_t dim,
                           cp_dtype dtype)
{
    cpi_tensor t = { NULL, ntok, heads, dim, dtype };
    t.data = cpi_arena_take(a, cpi_tensor_bytes(p, &t));
    return t;
}

cpi_tensor cpi_user_tensor(const cp_attn_plan *p, const void *ptr, int32_t heads, int32_t dim, cp_dtype dtype)
{
    cpi_tensor t = { (void *)ptr, p->s_loc, heads, dim, dtype };
    return t;
}

cpi_tensor cpi_tensor_block(const cp_attn_plan *p, const cpi_tensor *like, void *base, int i)
{
    cpi_tensor b = { NULL, p->s_loc, like->heads, like->dim, like->dtype };
    b.data = (char *)base + (size_t)i * cpi_tensor_bytes(p, &b);
    return b;
}

static size_t lse_bytes(const cp_attn_plan *p, const cpi_lse *l)
{
    return (size_t)p->desc.batch * (size_t)l->heads * (size_t)l->ntok * sizeof(float);
}

cpi_lse cpi_lse_take(const cp_attn_plan *p, cpi_arena *a, int64_t ntok, int32_t heads)
{
    cpi_lse l = { NULL, ntok, heads, NULL };
    l.data = cpi_arena_take(a, lse_bytes(p, &l));
    return l;
}

float *cpi_drow_take(const cp_attn_plan *p, cpi_arena *a, int64_t ntok, int32_t heads)
{
    return cpi_lse_take(p, a, ntok, heads).data;
}

void cpi_lse_take_lo(const cp_attn_plan *p, cpi_arena *a, cpi_lse *l)
{
    l->lo = cpi_arena_take(a, lse_bytes(p, l));
}

static cp_copy_kind local_kind(const cp_attn_plan *p)
{
    return cpi_local_copy_kind(p->ctx);
}

cp_status cpi_copy_tokens(const cp_attn_plan *p, const cpi_tensor *dst, int64_t dst_row, int32_t dst_head,
                          const cpi_tensor *src, int64_t src_row, int32_t src_head, int64_t nrows,
                          int32_t nheads)
{
    if (nrows == 0 || nheads == 0)
        return CP_SUCCESS;
    const size_t es = cpi_dtype_size(src->dtype);
    int64_t dsb, dss, dsh, ssb, sss, ssh;
    cpi_tensor_strides(p, dst, &dsb, &dss, &dsh);
    cpi_tensor_strides(p, src, &ssb, &sss, &ssh);
    const size_t width = (size_t)nheads * (size_t)src->dim * es;
    const cp_context *ctx = p->ctx;
    char *d0 = (char *)dst->data + ((size_t)dst_row * (size_t)dss + (size_t)dst_head * (size_t)dsh) * es;
    const char *s0 = (const char *)src->data + ((size_t)src_row * (size_t)sss + (size_t)src_head * (size_t)ssh) * es;

    if (p->desc.format == CP_FORMAT_SBHD) {
        /* rows (token, batch) are evenly spaced by heads*dim in both */
        return ctx->ops->copy_2d(ctx->state, d0, (size_t)dsb * es, s0, (size_t)ssb * es, width,
                                 (size_t)(nrows * p->desc.batch), local_kind(p));
    }
    /* BSHD: whole rows of equal head count are contiguous per batch */
    if (nheads == dst->heads && nheads == src->heads)
        return ctx->ops->copy_2d(ctx->state, d0, (size_t)dsb * es, s0, (size_t)ssb * es,
                                 width * (size_t)nrows, (size_t)p->desc.batch, local_kind(p));
    for (int64_t b = 0; b < p->desc.batch; b++)
        CPI_TRY(ctx->ops->copy_2d(ctx->state, d0 + (size_t)b * (size_t)dsb * es, (size_t)dss * es,
                                  s0 + (size_t)b * (size_t)ssb * es, (size_t)sss * es, width, (size_t)nrows,
                                  local_kind(p)));
    return CP_SUCCESS;
}

cp_status cpi_copy_lse(const cp_attn_plan *p, const cpi_lse *dst, int64_t dst_row, int32_t dst_head,
                       const cpi_lse *src, int64_t src_row, int32_t src_head, int64_t nrows, int32_t nheads)
{
    if (nrows == 0 || nheads == 0)
        return CP_SUCCESS;
    const cp_context *ctx = p->ctx;
    for (int64_t b = 0; b < p->desc.batch; b++) {
        float *d0 =
            dst->data + ((size_t)b * (size_t)dst->heads + (size_t)dst_head) * (size_t)dst->ntok + (size_t)dst_row;
        const float *s0 =
            src->data + ((size_t)b * (size_t)src->heads + (size_t)src_head) * (size_t)src->ntok + (size_t)src_row;
        CPI_TRY(ctx->ops->copy_2d(ctx->state, d0, (size_t)dst->ntok * sizeof(float), s0,
                                  (size_t)src->ntok * sizeof(float), (size_t)nrows * sizeof(float),
                                  (size_t)nheads, local_kind(p)));
    }
    return CP_SUCCESS;
}

cp_status cpi_convert_tensor(const cp_attn_plan *p, const cpi_tensor *dst, const cpi_tensor *src)
{
    size_t n = (size_t)p->desc.batch * (size_t)src->ntok * (size_t)src->heads * (size_t)src->dim;
    if (dst->dtype == src->dtype)
        return p->ctx->ops->copy_2d(p->ctx->state, dst->data, 0, src->data, 0, n * cpi_dtype_size(src->dtype), 1,
                                    local_kind(p));
    return p->ctx->ops->convert(p->ctx->state, dst->data, dst->dtype, src->data, src->dtype, n);
}

cp_status cpi_zero(const cp_attn_plan *p, const cpi_tensor *t)
{
    return p->ctx->ops->memset(p->ctx->state, t->data, 0, cpi_tensor_bytes(p, t));
}

/* -inf (0xff800000) is no byte pattern memset can write, so LSE resets copy
 * it from a row of NEG_INF_ROW floats: on the host from the stack, on a
 * device from the plan's copy there (cpi_plan_neg_inf_row), since a copy
 * from host memory would make the host wait for the stream in every call. */
enum { NEG_INF_ROW = 1024 };

static void neg_inf_row(float *row)
{
    for (int i = 0; i < NEG_INF_ROW; i++)
        row[i] = -INFINITY;
}

cp_status cpi_plan_neg_inf_row(cp_attn_plan *p)
{
    if (p->ctx->device == CP_DEVICE_CPU || p->neg_inf)
        return CP_SUCCESS;
    float row[NEG_INF_ROW];
    neg_inf_row(row);
    CPI_TRY(p->ctx->ops->alloc(p->ctx->state, sizeof row, (void **)&p->neg_inf));
    return p->ctx->ops->copy_2d(p->ctx->state, p->neg_inf, 0, row, 0, sizeof row, 1, CP_COPY_HOST_TO_DEVICE);
}

cp_status cpi_fill_rows(const cp_attn_plan *p, float *rows, size_t nrows, size_t n, size_t have)
{
    for (; have < n; have *= 2) {
        const size_t m = n - have < have ? n - have : have;
        CPI_TRY(p->ctx->ops->copy_2d(p->ctx->state, rows + have, n * sizeof(float), rows, n * sizeof(float),
                                     m * sizeof(float), nrows, local_kind(p)));
    }
    return CP_SUCCESS;
}

cp_status cpi_init_partial(const cp_attn_plan *p, const cpi_tensor *o32, const cpi_lse *lse)
{
    CPI_TRY(cpi_zero(p, o32));
    if (lse->lo)
        CPI_TRY(p->ctx->ops->memset(p->ctx->state, lse->lo, 0, lse_bytes(p, lse)));
    /* One row of -inf at the start of the buffer, then copies inside the
     * buffer double the filled part until it is full (log2(n / NEG_INF_ROW)
     * copies; a copy per row of floats cost 2 ms at S = 32k, 16 heads). */
    const size_t n = (size_t)p->desc.batch * (size_t)lse->heads * (size_t)lse->ntok;
    size_t have = n < NEG_INF_ROW ? n : NEG_INF_ROW;
    if (have && p->neg_inf) {
        CPI_TRY(p->ctx->ops->copy_2d(p->ctx->state, lse->data, 0, p->neg_inf, 0, have * sizeof(float), 1,
                                     local_kind(p)));
    } else if (have) {
        float row[NEG_INF_ROW];
        neg_inf_row(row);
        const int cpu = p->ctx->device == CP_DEVICE_CPU;
        CPI_TRY(p->ctx->ops->copy_2d(p->ctx->state, lse->data, 0, row, 0, have * sizeof(float), 1,
                                     cpu ? CP_COPY_HOST_TO_HOST : CP_COPY_HOST_TO_DEVICE));
    }
    return cpi_fill_rows(p, lse->data, 1, n, have);
}
