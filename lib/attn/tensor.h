/* SPDX-License-Identifier: MIT */
/* Tensor views in a plan's format, taken from its workspace or laid over a
 * caller's buffers, and the copies between them. Every view has the plan's
 * batch size and format; the copies go through the backend, so that they
 * run on whatever device the plan's context drives. */
#ifndef INFINICP_ATTN_TENSOR_H
#define INFINICP_ATTN_TENSOR_H

#include "attn/arena.h"

/* A dense tensor [batch, ntok, heads, dim] (BSHD) or [ntok, batch, heads, dim]
 * (SBHD) on the plan's device. */
typedef struct cpi_tensor {
    void *data;
    int64_t ntok;
    int32_t heads, dim;
    cp_dtype dtype;
} cpi_tensor;

/* LSE buffer: float [batch, heads, ntok]. A partial result being merged
 * also has `lo`, the rounding residual of each value (same layout), so that
 * a chain of merges rounds once (see cp_kernel_attn_args.lse_lo). */
typedef struct cpi_lse {
    float *data;
    int64_t ntok;
    int32_t heads;
    float *lo;
} cpi_lse;

/* The descales of an FP8 forward (cp_attn_args), NULL = 1: per tensor, or
 * per head of the heads the pointers start at. */
typedef struct cpi_descale {
    const float *q, *k, *v;
    int per_head;
} cpi_descale;

/* d's descales of query heads from q_head and kv heads from kv_head (per
 * tensor: d itself), for the kernel calls of a head slice. */
static inline cpi_descale cpi_descale_slice(const cpi_descale *d, int32_t q_head, int32_t kv_head)
{
    cpi_descale s = *d;
    if (s.per_head) {
        s.q = s.q ? s.q + q_head : NULL;
        s.k = s.k ? s.k + kv_head : NULL;
        s.v = s.v ? s.v + kv_head : NULL;
    }
    return s;
}

/* Element strides and bytes of a tensor. */
void cpi_tensor_strides(const cp_attn_plan *p, const cpi_tensor *t, int64_t *sb, int64_t *ss, int64_t *sh);
size_t cpi_tensor_bytes(const cp_attn_plan *p, const cpi_tensor *t);

/* Views on workspace (NULL data while the arena measures). */
cpi_tensor cpi_tensor_take(const cp_attn_plan *p, cpi_arena *a, int64_t ntok, int32_t heads, int32_t dim,
                           cp_dtype dtype);
cpi_lse cpi_lse_take(const cp_attn_plan *p, cpi_arena *a, int64_t ntok, int32_t heads);
/* Give l a residual buffer from the arena (for partial results). */
void cpi_lse_take_lo(const cp_attn_plan *p, cpi_arena *a, cpi_lse *l);
/* The rowsum buffer of a backward over ntok query rows (see cpi_attend_io):
 * laid out like an LSE. */
float *cpi_drow_take(const cp_attn_plan *p, cpi_arena *a, int64_t ntok, int32_t heads);

/* A caller's tensor: this rank's s_loc tokens, dense. */
cpi_tensor cpi_user_tensor(const cp_attn_plan *p, const void *ptr, int32_t heads, int32_t dim, cp_dtype dtype);
/* Block i of a buffer of consecutive dense [s_loc, like->heads, like->dim]
 * blocks of like->dtype starting at base (gathered or exchanged data). */
cpi_tensor cpi_tensor_block(const cp_attn_plan *p, const cpi_tensor *like, void *base, int i);

/* Copy rows [src_row, +nrows) x heads [src_head, +nheads) of src into dst at
 * (dst_row, dst_head). Same dtype and dim. */
cp_status cpi_copy_tokens(const cp_attn_plan *p, const cpi_tensor *dst, int64_t dst_row, int32_t dst_head,
                          const cpi_tensor *src, int64_t src_row, int32_t src_head, int64_t nrows,
                          int32_t nheads);
cp_status cpi_copy_lse(const cp_attn_plan *p, const cpi_lse *dst, int64_t dst_row, int32_t dst_head,
                       const cpi_lse *src, int64_t src_row, int32_t src_head, int64_t nrows,
                       int32_t nheads);
/* dst = src converted (whole tensors of equal shape). */
cp_status cpi_convert_tensor(const cp_attn_plan *p, const cpi_tensor *dst, const cpi_tensor *src);
/* O = 0 (F32), LSE = -inf, its residual 0. */
cp_status cpi_init_partial(const cp_attn_plan *p, const cpi_tensor *o32, const cpi_lse *lse);
/* Each of nrows rows of n floats (n apart) whose first `have` (>= 1) hold a
 * pattern gets it repeated to its end, by copies on the plan's device that
 * double the filled part: log2(n / have) of them for all rows. */
cp_status cpi_fill_rows(const cp_attn_plan *p, float *rows, size_t nrows, size_t n, size_t have);
/* On a device context, p->neg_inf: the -inf row cpi_init_partial copies
 * LSE resets from on the device (made once; a copy from host memory would
 * hold the host in every call). */
cp_status cpi_plan_neg_inf_row(cp_attn_plan *p);
cp_status cpi_zero(const cp_attn_plan *p, const cpi_tensor *t);

#endif
