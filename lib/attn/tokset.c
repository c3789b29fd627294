/* SPDX-License-Identifier: MIT */
/* Token sets (see tokset.h). */
#include <stdlib.h>
#include <string.h>

#include "attn/tokset.h"

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

cp_status cpi_tokset_sorted(const cpi_span *spans, int n, cpi_tokset *out)
{
    CPI_TRY(cpi_tokset_alloc(out, n > 0 ? n : 1));
    memcpy(out->span, spans, (size_t)n * sizeof *spans);
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
    out->nspans = m;
    out->ntok = row;
    return CP_SUCCESS;
}

cp_status cpi_tokset_local(const cpi_span *spans, int n, cpi_tokset *out)
{
    CPI_TRY(cpi_tokset_alloc(out, n > 0 ? n : 1));
    int64_t row = 0;
    for (int i = 0; i < n; i++) {
        out->span[i] = spans[i];
        out->row[i] = row;
        row += spans[i].len;
    }
    out->nspans = n;
    out->ntok = row;
    return CP_SUCCESS;
}

cp_status cpi_tokset_of_ranks(cp_layout layout, int cp_size, int64_t seq_len, int first, int count,
                              cpi_tokset *out)
{
    cpi_span *spans = cpi_calloc((size_t)count * CPI_MAX_SPANS, sizeof *spans);
    if (!spans)
        return CP_ERROR_OUT_OF_MEMORY;
    int n = 0;
    for (int r = first; r < first + count; r++)
        n += cpi_layout_spans(layout, cp_size, r, seq_len, spans + n);
    cp_status s = cpi_tokset_sorted(spans, n, out);
    free(spans);
    return s;
}

int64_t cpi_tokset_row(const cpi_tokset *t, int64_t pos)
{
    for (int i = 0; i < t->nspans; i++)
        if (pos >= t->span[i].offset && pos < t->span[i].offset + t->span[i].len)
            return t->row[i] + (pos - t->span[i].offset);
    return -1;
}
