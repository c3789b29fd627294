/* SPDX-License-Identifier: MIT */
/* Token sets: a set of global token positions as spans, and the buffer
 * rows each span occupies (docs/ARCHITECTURE.md, Spans and token sets). A
 * rank's own tokens, the tokens an a2a sub-group gathers and a ring
 * member's key block are all token sets, whatever the layout. */
#ifndef INFINICP_ATTN_TOKSET_H
#define INFINICP_ATTN_TOKSET_H

#include "layout/spans.h"

/* Span i holds tokens [span[i].offset, +len) at rows [row[i], +len). */
typedef struct cpi_tokset {
    int nspans;
    cpi_span *span;
    int64_t *row;
    int64_t ntok; /* rows in all */
} cpi_tokset;

cp_status cpi_tokset_alloc(cpi_tokset *t, int nspans);
void cpi_tokset_free(cpi_tokset *t);
/* The tokens of cp ranks [first, first + count) of a group of cp_size
 * under `layout`, sorted by position and with adjacent spans merged. The
 * arguments must have passed cpi_layout_check. */
cp_status cpi_tokset_of_ranks(cp_layout layout, int cp_size, int64_t seq_len, int first, int count,
                              cpi_tokset *out);
/* The token set of n spans: sorted by position, adjacent spans merged, rows
 * in that order (what a gathered buffer holds). */
cp_status cpi_tokset_sorted(const cpi_span *spans, int n, cpi_tokset *out);
/* The token set of n spans as given (what a rank's own buffers hold, in
 * its local order), rows one after the other. */
cp_status cpi_tokset_local(const cpi_span *spans, int n, cpi_tokset *out);
/* Row in t where global position pos lives (pos must be in t). */
int64_t cpi_tokset_row(const cpi_tokset *t, int64_t pos);

#endif
