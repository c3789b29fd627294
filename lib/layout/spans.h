/* SPDX-License-Identifier: MIT */
/* A rank's share of the sequence as a short list of spans of global
 * positions (docs/ARCHITECTURE.md, Sequence layouts): one span for
 * contiguous, two for zigzag. */
#ifndef INFINICP_SPANS_H
#define INFINICP_SPANS_H

#include "core/internal.h"

#define CPI_MAX_SPANS 2

typedef struct cpi_span {
    int64_t offset; /* global position of the first token */
    int64_t len;    /* tokens */
} cpi_span;

/* Check (layout, cp_size, cp_rank, seq_len); on failure the message starts
 * with `func` and names the numbers. */
cp_status cpi_layout_check(const char *func, cp_layout l, int cp_size, int cp_rank, int64_t seq_len);

/* The spans of rank cp_rank, in the order they are stored locally.
 * Arguments must have passed cpi_layout_check. Returns the span count. */
int cpi_layout_spans(cp_layout l, int cp_size, int cp_rank, int64_t seq_len, cpi_span spans[CPI_MAX_SPANS]);

#endif
