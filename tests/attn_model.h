/* SPDX-License-Identifier: MIT */
/*
 * The FP64 model of attention that every suite checks the library against:
 * a plain O(Sq * Sk) forward and backward, written without reference to the
 * library's kernels. The single-device kernel suites use it on one block
 * (queries and keys at offsets of a longer sequence), the CP suites on the
 * whole sequence (through cpref.h).
 *
 * Tensors are dense double arrays: q [B][Sq][H][D], k [B][Sk][Hkv][D],
 * v [B][Sk][Hkv][Dv], o and dout [B][Sq][H][Dv], lse [B][H][Sq] (natural
 * log). Query i has global position q_offset + i and key j k_offset + j;
 * with the causal mask key j is visible to query i iff
 * k_offset + j <= q_offset + i. Query head h uses kv head h / (H / Hkv).
 *
 * Non-finite inputs follow IEEE arithmetic over the visible (query, key)
 * pairs, masked pairs left out of every sum, as the library promises
 * (docs/RELIABILITY.md, "Non-finite inputs"): a NaN or inf reaches exactly
 * the outputs whose computation includes it. A row that
 * sees no key, or whose visible scores are all -inf (every weight exactly
 * 0), has O = 0 and LSE = -inf, however the keys are cut into blocks. For
 * finite inputs this is the textbook softmax attention.
 */
#ifndef INFINICP_TESTS_ATTN_MODEL_H
#define INFINICP_TESTS_ATTN_MODEL_H

#include <stddef.h>
#include <stdint.h>

typedef struct model_shape {
    int64_t batch, seq_q, seq_k;
    int heads, kv_heads, head_dim, head_dim_v;
    int64_t q_offset, k_offset;
    int causal;
    double scale; /* the softmax scale itself (no 0 default here) */
} model_shape;

/* Element counts of the dense tensors. */
size_t model_q_elems(const model_shape *s);
size_t model_k_elems(const model_shape *s);
size_t model_v_elems(const model_shape *s);
size_t model_o_elems(const model_shape *s);
size_t model_lse_elems(const model_shape *s);

/* O and LSE (lse may be NULL): m = max of the visible scores (NaN if one is
 * NaN), l = sum exp(s - m), O = sum exp(s - m) v / l, LSE = m + log l. */
void model_forward(const model_shape *s, const double *q, const double *k, const double *v, double *o,
                   double *lse);

/*
 * dQ, dK, dV of the loss sum(dout * O), from the O and LSE given (the
 * model's own, or those rounded to the types a kernel reads): over visible
 * pairs only, P = exp(s - LSE) (0 where LSE = -inf),
 * dS = P (dO.v - rowsum(dO * O)), dV += P dO, dK += scale dS q,
 * dQ += scale dS k.
 */
void model_backward(const model_shape *s, const double *q, const double *k, const double *v, const double *o,
                    const double *lse, const double *dout, double *dq, double *dk, double *dv);

/* The loss sum(dout * O), for finite-difference checks of the backward. */
double model_loss(const model_shape *s, const double *q, const double *k, const double *v, const double *dout);

/*
 * API 1.1 (DESIGN.md section 5): windows, softcap, documents, sinks and
 * rectangle lists. The pair (i, j) is visible when the mask and the window
 * hold on the positions (causal: kp <= qp, and kp > qp - W with a window;
 * none: |qp - kp| < W with a window, else always) and, with documents, both
 * positions lie in the same document. Without rects the block is one
 * rectangle at q_offset / k_offset; with them a pair counts once for every
 * rectangle that holds it and sees it (rectangles of a row are meant to
 * hold disjoint keys, but the model does not assume it). A score is
 * s = scale q.k, then c tanh(s / c) with a softcap c. A sink adds
 * exp(sink[h]) to the denominator of every row of head h (a row with no
 * key then has O = 0, LSE = sink[h]).
 */
typedef struct model_rect {
    int64_t q_row, q_len, k_row, k_len, q_pos, k_pos;
} model_rect;

typedef struct model_ext {
    int64_t window;           /* 0 = none */
    double softcap;           /* 0 = none */
    const int64_t *cu;        /* document boundaries on positions, cu[0] = 0 < ... < cu[ndocs]; NULL = none */
    int ndocs;
    const double *sinks;      /* [heads] logits, or NULL */
    const model_rect *rects;  /* NULL: the whole block at q_offset / k_offset */
    int64_t nrects;
} model_ext;

void model_forward_ex(const model_shape *s, const model_ext *x, const double *q, const double *k, const double *v,
                      double *o, double *lse);
/* dsinks [heads] (may be NULL): d loss / d sink[h] = -sum_i exp(sink[h] - LSE_i) rowsum(dout_i * O_i). */
void model_backward_ex(const model_shape *s, const model_ext *x, const double *q, const double *k,
                       const double *v, const double *o, const double *lse, const double *dout, double *dq,
                       double *dk, double *dv, double *dsinks);

#endif
