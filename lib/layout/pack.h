/* SPDX-License-Identifier: MIT */
/*
 * cp_pack (API 1.1): the split of one packed row of documents across a CP
 * group (docs/ARCHITECTURE.md, Packed documents). Host only. A rank's
 * share is a short list of runs (spans of the row) in local order: the
 * pieces of documents other ranks share first, then the documents wholly
 * on the rank, each group along the row; the CP modes turn them into token
 * sets.
 */
#ifndef INFINICP_PACK_H
#define INFINICP_PACK_H

#include "layout/spans.h"

struct cp_pack {
    uint64_t id;         /* unique among the packs of this process (a reused address is another pack) */
    uint64_t hash;       /* of cp_size, the documents and the split: what ranks compare */
    int cp_size;         /* P */
    int64_t T;           /* tokens in the row */
    int64_t s_loc;       /* T / P */
    int num_seqs;        /* documents */
    int64_t *cu;         /* [num_seqs + 1] document boundaries, cu[0] = 0, cu[num_seqs] = T */
    cp_mask mask;        /* what the balance was for */
    int64_t window;
    cp_balance balance;  /* the policy used (AUTO resolved) */
    int64_t chunk;       /* GREEDY's chunk in tokens (0 for the other policies) */
    int *run_first;      /* [P + 1]: rank r's runs are runs[run_first[r] .. run_first[r + 1]) */
    cpi_span *runs;      /* coalesced; shared pieces first, then local documents, each group along the row */
};

/* Rank r's runs; returns how many. */
static inline int cpi_pack_runs(const cp_pack *pk, int r, const cpi_span **runs)
{
    *runs = pk->runs + pk->run_first[r];
    return pk->run_first[r + 1] - pk->run_first[r];
}

/* Visible (query, key) pairs of the queries at row positions [a, b), inside
 * their documents (cu, n documents), under mask and window: exact, closed
 * form per document piece. */
double cpi_pack_pairs(const int64_t *cu, int n, cp_mask mask, int64_t window, int64_t a, int64_t b);

/* The document holding row position pos (binary search). */
int cpi_pack_doc_of(const int64_t *cu, int n, int64_t pos);

#endif
