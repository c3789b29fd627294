/* SPDX-License-Identifier: MIT */
/* Sequence layouts: which global positions a CP rank holds, and copying a
 * rank's share out of a whole [batch, seq, token] tensor. Both go through
 * the rank's spans, so the two layouts are the same code. */
#include <stdint.h>

#include "core/context.h"
#include "layout/spans.h"

CP_EXPORT cp_status cp_layout_positions(cp_layout l, int cp_size, int cp_rank, int64_t seq_len,
                                        int64_t *positions)
{
    CPI_TRY(cpi_layout_check(__func__, l, cp_size, cp_rank, seq_len));
    CPI_CHECK_PTR(positions);
    CPI_CHECK((uintptr_t)positions % sizeof *positions == 0,
              "%s: positions = %p is not aligned to its 8-byte elements", __func__, (void *)positions);
    /* More positions than bytes of address space cannot have been allocated. */
    size_t bytes;
    CPI_CHECK(cpi_mul((size_t)(seq_len / cp_size), sizeof *positions, &bytes) && bytes <= PTRDIFF_MAX,
              "%s: seq_len / cp_size = %lld positions overflow the address space", __func__,
              (long long)(seq_len / cp_size));
    cpi_span spans[CPI_MAX_SPANS];
    int n = cpi_layout_spans(l, cp_size, cp_rank, seq_len, spans);
    for (int i = 0; i < n; i++)
        for (int64_t j = 0; j < spans[i].len; j++)
            *positions++ = spans[i].offset + j;
    return CP_SUCCESS;
}

CP_EXPORT cp_status cp_layout_shard(cp_context *ctx, cp_layout l, int cp_size, int cp_rank,
                                    const void *global, void *local, int64_t batch, int64_t seq_len,
                                    size_t token_bytes)
{
    CPI_CHECK_PTR(ctx);
    CPI_TRY(cpi_layout_check(__func__, l, cp_size, cp_rank, seq_len));
    CPI_CHECK_PTR(global);
    CPI_CHECK_PTR(local);
    CPI_CHECK(batch >= 1, "%s: batch = %lld (must be >= 1)", __func__, (long long)batch);
    CPI_CHECK(token_bytes >= 1, "%s: token_bytes = %zu (must be >= 1)", __func__, token_bytes);
    /* The global tensor's size bounds every offset and pitch below; it must
     * be addressable. */
    size_t row, total;
    CPI_CHECK(cpi_mul((size_t)seq_len, token_bytes, &row) && cpi_mul(row, (size_t)batch, &total) &&
                  total <= PTRDIFF_MAX,
              "%s: batch * seq_len * token_bytes = %lld * %lld * %zu bytes overflows the address space",
              __func__, (long long)batch, (long long)seq_len, token_bytes);

    size_t local_row = row / (size_t)cp_size;
    /* A copy between overlapping buffers would read tokens it has already
     * overwritten (and memcpy-like device copies do not allow it at all). */
    CPI_CHECK(!cpi_overlap(global, total, local, total / (size_t)cp_size),
              "%s: local %p (%zu bytes) overlaps global %p (%zu bytes)", __func__, local, total / (size_t)cp_size,
              global, total);
    cpi_span spans[CPI_MAX_SPANS];
    int n = cpi_layout_spans(l, cp_size, cp_rank, seq_len, spans);
    size_t done = 0; /* bytes of each local row already filled */
    cp_copy_kind kind = cpi_local_copy_kind(ctx);
    for (int i = 0; i < n; i++) {
        /* One strided copy per span: `batch` rows of the span's bytes. */
        size_t width = (size_t)spans[i].len * token_bytes;
        const char *src = (const char *)global + (size_t)spans[i].offset * token_bytes;
        CPI_TRY(ctx->ops->copy_2d(ctx->state, (char *)local + done, local_row, src, row, width, (size_t)batch,
                                  kind));
        done += width;
    }
    return CP_SUCCESS;
}
