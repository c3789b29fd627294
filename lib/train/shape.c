/* SPDX-License-Identifier: MIT */
/* Sizes under CP, for the code around attention: how many tokens of a
 * sequence a rank holds, and the activation a pipeline stage hands on. */
#include <string.h>

#include "layout/spans.h"
#include "topology/topology.h"

/* First published cp_attn_desc: everything up to mode. */
#define DESC_V1_SIZE (offsetof(cp_attn_desc, mode) + sizeof(cp_mode))

/* The descriptor with its struct_size honoured, and the local length. */
static cp_status local_len(const char *func, const cp_topology *t, const cp_attn_desc *d, cp_attn_desc *a,
                           int64_t *len)
{
    CPI_CHECK(t != NULL, "%s: t is NULL", func);
    CPI_CHECK(d != NULL, "%s: d is NULL", func);
    static const cp_attn_desc defaults = CP_ATTN_DESC_INIT;
    CPI_TRY(cpi_copy_config(a, sizeof *a, &defaults, d, DESC_V1_SIZE, func, "d"));
    CPI_CHECK(a->layout == CP_LAYOUT_CONTIGUOUS || a->layout == CP_LAYOUT_ZIGZAG,
              "%s: d->layout = %d (must be CP_LAYOUT_CONTIGUOUS (0) or CP_LAYOUT_ZIGZAG (1))", func, (int)a->layout);
    CPI_CHECK(a->seq_len >= 1, "%s: d->seq_len = %lld (must be >= 1)", func, (long long)a->seq_len);
    /* rank 0 is in every group: the length is the same on every rank */
    CPI_TRY(cpi_layout_check(func, a->layout, t->size[CPI_AXIS_CP], 0, a->seq_len));
    *len = a->seq_len / t->size[CPI_AXIS_CP];
    return CP_SUCCESS;
}

CP_EXPORT cp_status cp_seq_local_len(const cp_topology *t, const cp_attn_desc *d, int64_t *local_seq_len)
{
    CPI_CHECK_PTR(local_seq_len);
    *local_seq_len = 0;
    cp_attn_desc a;
    return local_len(__func__, t, d, &a, local_seq_len);
}

CP_EXPORT cp_status cp_stage_shape(const cp_topology *t, const cp_attn_desc *d, int64_t hidden, unsigned flags,
                                   int64_t shape[3], size_t *bytes)
{
    CPI_CHECK_PTR(shape);
    memset(shape, 0, 3 * sizeof *shape);
    if (bytes)
        *bytes = 0;
    cp_attn_desc a;
    int64_t len;
    CPI_TRY(local_len(__func__, t, d, &a, &len));
    CPI_CHECK(a.batch >= 1, "%s: d->batch = %lld (must be >= 1)", __func__, (long long)a.batch);
    CPI_CHECK(a.format == CP_FORMAT_BSHD || a.format == CP_FORMAT_SBHD,
              "%s: d->format = %d (must be CP_FORMAT_BSHD (0) or CP_FORMAT_SBHD (1))", __func__, (int)a.format);
    CPI_CHECK(cpi_dtype_valid(a.dtype), "%s: d->dtype = %d (must be a cp_dtype)", __func__, (int)a.dtype);
    CPI_CHECK(hidden >= 1, "%s: hidden = %lld (must be >= 1)", __func__, (long long)hidden);
    CPI_CHECK((flags & ~CP_STAGE_SEQUENCE_PARALLEL) == 0,
              "%s: flags = 0x%x (only CP_STAGE_SEQUENCE_PARALLEL (0x1) is defined)", __func__, flags);
    if (flags & CP_STAGE_SEQUENCE_PARALLEL) {
        const int tp = t->size[CPI_AXIS_TP];
        CPI_CHECK(len % tp == 0,
                  "%s: the local length seq_len / cp = %lld / %d = %lld is not divisible by tp = %d "
                  "(sequence parallelism splits it over TP)",
                  __func__, (long long)a.seq_len, t->size[CPI_AXIS_CP], (long long)len, tp);
        len /= tp;
    }
    /* the activations around an FP8 attention are its output's type, BF16 */
    const size_t es = cpi_dtype_size(a.dtype == CP_DTYPE_FP8_E4M3 ? CP_DTYPE_BF16 : a.dtype);
    size_t n;
    CPI_CHECK(cpi_mul((size_t)a.batch, (size_t)len, &n) && cpi_mul(n, (size_t)hidden, &n) && cpi_mul(n, es, &n) &&
                  n <= PTRDIFF_MAX,
              "%s: batch %lld x %lld tokens x hidden %lld x %zu bytes overflows the address space", __func__,
              (long long)a.batch, (long long)len, (long long)hidden, es);
    const int sbhd = a.format == CP_FORMAT_SBHD;
    shape[0] = sbhd ? len : a.batch;
    shape[1] = sbhd ? a.batch : len;
    shape[2] = hidden;
    if (bytes)
        *bytes = n;
    return CP_SUCCESS;
}
