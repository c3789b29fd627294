/* SPDX-License-Identifier: MIT */
#include "layout/spans.h"

cp_status cpi_layout_check(const char *func, cp_layout l, int cp_size, int cp_rank, int64_t seq_len)
{
    CPI_CHECK(l == CP_LAYOUT_CONTIGUOUS || l == CP_LAYOUT_ZIGZAG,
              "%s: layout = %d (must be CP_LAYOUT_CONTIGUOUS (0) or CP_LAYOUT_ZIGZAG (1))", func, (int)l);
    CPI_CHECK(cp_size >= 1, "%s: cp_size = %d (must be >= 1)", func, cp_size);
    CPI_CHECK(cp_rank >= 0 && cp_rank < cp_size, "%s: cp_rank = %d (must be in [0, %d))", func, cp_rank,
              cp_size);
    CPI_CHECK(seq_len >= 1, "%s: seq_len = %lld (must be >= 1)", func, (long long)seq_len);
    if (l == CP_LAYOUT_ZIGZAG)
        CPI_CHECK(seq_len % (2 * (int64_t)cp_size) == 0,
                  "%s: seq_len = %lld is not divisible by 2 * cp_size = %lld (zigzag cuts it into 2*%d chunks)",
                  func, (long long)seq_len, 2 * (long long)cp_size, cp_size);
    else
        CPI_CHECK(seq_len % cp_size == 0, "%s: seq_len = %lld is not divisible by cp_size = %d", func,
                  (long long)seq_len, cp_size);
    return CP_SUCCESS;
}

int cpi_layout_spans(cp_layout l, int cp_size, int cp_rank, int64_t seq_len, cpi_span spans[CPI_MAX_SPANS])
{
    if (l == CP_LAYOUT_ZIGZAG) {
        int64_t c = seq_len / (2 * (int64_t)cp_size);
        spans[0] = (cpi_span){ (int64_t)cp_rank * c, c };
        spans[1] = (cpi_span){ (2 * (int64_t)cp_size - 1 - cp_rank) * c, c };
        return 2;
    }
    int64_t n = seq_len / cp_size;
    spans[0] = (cpi_span){ (int64_t)cp_rank * n, n };
    return 1;
}
