/* SPDX-License-Identifier: MIT */
/* Tensor views, token sets and the copies between them, all through the
 * backend so that they run on whatever device the plan's context drives. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attn/plan.h"

void *cpi_arena_take(cpi_arena *a, size_t bytes)
{
    /* 256-byte alignment suits every vector unit and GPU access pattern. */
    size_t start, end;
    if (!cpi_add(a->used, 255, &start) || !cpi_add(start & ~(size_t)255, bytes, &end)) {
        a->overflow = 1;
        return NULL;
    }
    start &= ~(size_t)255;
    a->used = end;
    if (a->measuring)
        return NULL;
    return a->base + start;
}

void cpi_tensor_strides(const cp_attn_plan *p, const cpi_tensor *t, int64_t *sb, int64_t *ss, int64_t *sh)
{
    int64_t hd = (int64_t)t->heads * t->dim;
    *sh = t->dim;
    if (p->d.format == CP_FORMAT_SBHD) {
        *sb = hd;
        *ss = p->d.batch * hd;
    } else {
        *sb = t->ntok * hd;
        *ss = hd;
    }
}

size_t cpi_tensor_bytes(const cp_attn_plan *p, const cpi_tensor *t)
{
    /* Bounds were overflow-checked at plan creation for the largest tensor. */
    return (size_t)p->d.batch * (size_t)t->ntok * (size_t)t->heads * (size_t)t->dim * cpi_dtype_size(t->dtype);
}

cpi_tensor cpi_tensor_take(const cp_attn_plan *p, cpi_arena *a, int64_t ntok, int32_t heads, int32_t dim,
                           cp_dtype dtype)
{
    cpi_tensor t = { NULL, ntok, heads, dim, dtype };
    t.p = cpi_arena_take(a, cpi_tensor_bytes(p, &t));
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
    b.p = (char *)base + (size_t)i * cpi_tensor_bytes(p, &b);
    return b;
}

static size_t lse_bytes(const cp_attn_plan *p, const cpi_lse *l)
{
    return (size_t)p->d.batch * (size_t)l->heads * (size_t)l->ntok * sizeof(float);
}

cpi_lse cpi_lse_take(const cp_attn_plan *p, cpi_arena *a, int64_t ntok, int32_t heads)
{
    cpi_lse l = { NULL, ntok, heads, NULL };
    l.p = cpi_arena_take(a, lse_bytes(p, &l));
    return l;
}

float *cpi_drow_take(const cp_attn_plan *p, cpi_arena *a, int64_t ntok, int32_t heads)
{
    return cpi_lse_take(p, a, ntok, heads).p;
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
    char *d0 = (char *)dst->p + ((size_t)dst_row * (size_t)dss + (size_t)dst_head * (size_t)dsh) * es;
    const char *s0 = (const char *)src->p + ((size_t)src_row * (size_t)sss + (size_t)src_head * (size_t)ssh) * es;

    if (p->d.format == CP_FORMAT_SBHD) {
        /* rows (token, batch) are evenly spaced by heads*dim in both */
        return ctx->ops->copy_2d(ctx->state, d0, (size_t)dsb * es, s0, (size_t)ssb * es, width,
                                 (size_t)(nrows * p->d.batch), local_kind(p));
    }
    /* BSHD: whole rows of equal head count are contiguous per batch */
    if (nheads == dst->heads && nheads == src->heads)
        return ctx->ops->copy_2d(ctx->state, d0, (size_t)dsb * es, s0, (size_t)ssb * es,
                                 width * (size_t)nrows, (size_t)p->d.batch, local_kind(p));
    for (int64_t b = 0; b < p->d.batch; b++)
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
    for (int64_t b = 0; b < p->d.batch; b++) {
        float *d0 = dst->p + ((size_t)b * (size_t)dst->heads + (size_t)dst_head) * (size_t)dst->ntok + (size_t)dst_row;
        const float *s0 = src->p + ((size_t)b * (size_t)src->heads + (size_t)src_head) * (size_t)src->ntok + (size_t)src_row;
        CPI_TRY(ctx->ops->copy_2d(ctx->state, d0, (size_t)dst->ntok * sizeof(float), s0,
                                  (size_t)src->ntok * sizeof(float), (size_t)nrows * sizeof(float),
                                  (size_t)nheads, local_kind(p)));
    }
    return CP_SUCCESS;
}

cp_status cpi_convert_tensor(const cp_attn_plan *p, const cpi_tensor *dst, const cpi_tensor *src)
{
    size_t n = (size_t)p->d.batch * (size_t)src->ntok * (size_t)src->heads * (size_t)src->dim;
    if (dst->dtype == src->dtype)
        return p->ctx->ops->copy_2d(p->ctx->state, dst->p, 0, src->p, 0, n * cpi_dtype_size(src->dtype), 1,
                                    local_kind(p));
    return p->ctx->ops->convert(p->ctx->state, dst->p, dst->dtype, src->p, src->dtype, n);
}

cp_status cpi_zero(const cp_attn_plan *p, const cpi_tensor *t)
{
    return p->ctx->ops->memset(p->ctx->state, t->p, 0, cpi_tensor_bytes(p, t));
}

cp_status cpi_init_partial(const cp_attn_plan *p, const cpi_tensor *o32, const cpi_lse *lse)
{
    CPI_TRY(cpi_zero(p, o32));
    /* -inf (0xff800000) is no byte pattern memset can write: one host row of
     * it goes to the start of the buffer, and copies inside the buffer
     * double the filled part until it is full (log2(n / CHUNK) copies; a
     * row-sized copy per CHUNK floats cost 2 ms at S = 32k, 16 heads). */
    if (lse->lo)
        CPI_TRY(p->ctx->ops->memset(p->ctx->state, lse->lo, 0, lse_bytes(p, lse)));
    const size_t n = (size_t)p->d.batch * (size_t)lse->heads * (size_t)lse->ntok;
    enum { CHUNK = 1024 };
    float row[CHUNK];
    for (int i = 0; i < CHUNK; i++)
        row[i] = -INFINITY;
    const int cpu = p->ctx->device == CP_DEVICE_CPU;
    size_t have = n < CHUNK ? n : CHUNK;
    if (have)
        CPI_TRY(p->ctx->ops->copy_2d(p->ctx->state, lse->p, 0, row, 0, have * sizeof(float), 1,
                                     cpu ? CP_COPY_HOST_TO_HOST : CP_COPY_HOST_TO_DEVICE));
    for (; have < n; have *= 2) {
        size_t m = n - have < have ? n - have : have;
        CPI_TRY(p->ctx->ops->copy_2d(p->ctx->state, lse->p + have, 0, lse->p, 0, m * sizeof(float), 1,
                                     local_kind(p)));
    }
    return CP_SUCCESS;
}

/* ---- token sets ---- */

cp_status cpi_tokset_alloc(cpi_tokset *t, int nspans)
{
    memset(t, 0, sizeof *t);
    t->span = cpi_calloc((size_t)nspans, sizeof *t->span);
    t->row = cpi_calloc((size_t)nspans, sizeof *t->row);
    if (!t->span || !t->row) {
        cpi_tokset_free(t);
        return CP_ERROR_OUT_OF_MEMORY;
    }
    return CP_SUCCESS;
}

void cpi_tokset_free(cpi_tokset *t)
{
    free(t->span);
    free(t->row);
    memset(t, 0, sizeof *t);
}

static int span_cmp(const void *a, const void *b)
{
    const cpi_span *x = a, *y = b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

cp_status cpi_tokset_of_ranks(const cp_attn_plan *p, int first, int count, cpi_tokset *out)
{
    CPI_TRY(cpi_tokset_alloc(out, count * CPI_MAX_SPANS));
    int n = 0;
    for (int r = first; r < first + count; r++)
        n += cpi_layout_spans(p->d.layout, p->P, r, p->d.seq_len, out->span + n);
    qsort(out->span, (size_t)n, sizeof *out->span, span_cmp);
    int m = 0;
    int64_t row = 0;
    for (int i = 0; i < n; i++) {
        if (m && out->span[m - 1].offset + out->span[m - 1].len == out->span[i].offset) {
            out->span[m - 1].len += out->span[i].len;
        } else {
            out->span[m] = out->span[i];
            out->row[m] = row;
            m++;
        }
        row += out->span[i].len;
    }
    out->n = m;
    out->ntok = row;
    return CP_SUCCESS;
}

int64_t cpi_tokset_row(const cpi_tokset *t, int64_t pos)
{
    for (int i = 0; i < t->n; i++)
        if (pos >= t->span[i].offset && pos < t->span[i].offset + t->span[i].len)
            return t->row[i] + (pos - t->span[i].offset);
    return -1;
}
