/* SPDX-License-Identifier: MIT */
/*
 * Visibility under API 1.1 (docs/ARCHITECTURE.md, Packed documents and
 * windows): which (query, key) pairs of two token sets a plan's mask,
 * window and documents leave visible, as the rectangles of one kernel call
 * and as the key rows a ring hop must carry. Arithmetic on token sets
 * only; the same answer on every rank.
 */
#ifndef INFINICP_ATTN_VIS_H
#define INFINICP_ATTN_VIS_H

#include "attn/tokset.h"

typedef struct cpi_vis {
    bool causal;
    int64_t window;    /* 0 = none */
    const int64_t *cu; /* document boundaries [ndocs + 1]: cu[0] = 0 < ... < cu[ndocs] = T */
    int ndocs;
} cpi_vis;

/*
 * The rectangles of attention between the query rows of tq and the key rows
 * of tk: one per (query span, key span, document) whose pairs are not all
 * hidden, trimmed to the keys some query sees and the queries that see some
 * key. *rects is malloc'ed (NULL when *n = 0); the caller frees it.
 */
cp_status cpi_vis_rects(const cpi_vis *v, const cpi_tokset *tq, const cpi_tokset *tk, cp_attn_rect **rects,
                        int64_t *n);

/* The positions [*lo, *hi) of key span k that some query of tq sees (their
 * cover); *lo >= *hi when none. */
void cpi_vis_seen(const cpi_vis *v, const cpi_tokset *tq, cpi_span k, int64_t *lo, int64_t *hi);

#endif
