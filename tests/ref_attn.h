/* SPDX-License-Identifier: MIT */
/*
 * FP64 reference attention for the tests: a plain O(Sq * Sk) implementation
 * of the forward and backward pass, written without reference to the
 * library's kernels, plus exact conversions between double and the storage
 * types used to build inputs and read outputs.
 *
 * Tensors are dense double arrays: q [B][Sq][H][D], k [B][Sk][Hkv][D],
 * v [B][Sk][Hkv][Dv], o and dout [B][Sq][H][Dv], lse [B][H][Sq] (natural
 * log). Query i of the block has global position q_offset + i, key j has
 * k_offset + j; with the causal mask key j is visible to query i iff
 * k_offset + j <= q_offset + i. Query head h uses kv head h / (H / Hkv).
 */
#ifndef INFINICP_TESTS_REF_ATTN_H
#define INFINICP_TESTS_REF_ATTN_H

#include <stddef.h>
#include <stdint.h>

#include <infinicp/infinicp.h>

typedef struct ref_attn_shape {
    int64_t batch, seq_q, seq_k;
    int heads, kv_heads, head_dim, head_dim_v;
    int64_t q_offset, k_offset;
    int causal;
    double scale; /* the softmax scale itself (no 0 default here) */
} ref_attn_shape;

/* Element counts of the dense tensors. */
size_t ref_attn_q_elems(const ref_attn_shape *s);
size_t ref_attn_k_elems(const ref_attn_shape *s);
size_t ref_attn_v_elems(const ref_attn_shape *s);
size_t ref_attn_o_elems(const ref_attn_shape *s);
size_t ref_attn_lse_elems(const ref_attn_shape *s);

/* O and LSE. Rows that see no key get O = 0 and LSE = -inf. */
void ref_attn_forward(const ref_attn_shape *s, const double *q, const double *k, const double *v, double *o,
                      double *lse);

/* dQ, dK, dV of the loss sum(dout * O) (O recomputed from q, k, v). */
void ref_attn_backward(const ref_attn_shape *s, const double *q, const double *k, const double *v,
                       const double *dout, double *dq, double *dk, double *dv);

/* The loss sum(dout * O), for finite-difference checks of the backward. */
double ref_attn_loss(const ref_attn_shape *s, const double *q, const double *k, const double *v,
                     const double *dout);

/* ---- storage types ---------------------------------------------------- */

/* Round x to the nearest value of type t (ties to even), as a double.
 * F32 / F16 / BF16 / F64; F16 and BF16 saturate to +-inf on overflow. */
double ref_round(double x, cp_dtype t);

/* Store x (already representable in t) into element i of buf; read it back. */
void ref_store(void *buf, cp_dtype t, size_t i, double x);
double ref_load(const void *buf, cp_dtype t, size_t i);

size_t ref_dtype_size(cp_dtype t);

/* A small deterministic generator (xorshift64*) for reproducible inputs. */
typedef struct {
    uint64_t s;
} ref_rng;
uint64_t ref_rng_next(ref_rng *r);
double ref_rng_uniform(ref_rng *r, double lo, double hi); /* [lo, hi) */
int64_t ref_rng_int(ref_rng *r, int64_t lo, int64_t hi);  /* [lo, hi] */

#endif
