/* SPDX-License-Identifier: MIT */
/*
 * A small decoder-only transformer in plain C: token embedding, RMSNorm,
 * attention with RoPE and grouped-query heads, a SiLU MLP, an LM head and
 * cross-entropy, with a hand-written backward for every layer, and AdamW.
 *
 * Nothing here knows about context parallelism except three things, which
 * are exactly what a framework has to get right:
 *  - every layer but attention works token by token, so it runs unchanged
 *    on whatever tokens a rank holds;
 *  - RoPE takes each token's GLOBAL position, passed in by the caller;
 *  - attention is a callback: train.c routes it through the CP plan.
 *
 * Activations are rows of floats, one row per local token, rows ordered
 * [batch][local token] (which is the BSHD layout the CP plan expects).
 */
#ifndef TRAIN_MODEL_H
#define TRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#define MODEL_MAX_LAYERS 8

typedef struct model_cfg {
    int vocab, dim;               /* vocabulary, model width (= heads * head_dim) */
    int heads, kv_heads, head_dim; /* GQA: kv_heads divides heads */
    int ffn;                      /* MLP hidden width */
    int layers;
    double rope_base;             /* 10000 as in most models */
    float norm_eps;
} model_cfg;

/* Where each tensor lives in the one flat parameter buffer (in floats). A
 * flat buffer makes the gradient all-reduce and the optimizer one call each. */
typedef struct layer_off {
    size_t attn_norm, wq, wk, wv, wo, mlp_norm, w1, w2;
} layer_off;

typedef struct model {
    model_cfg c;
    size_t embed, final_norm, head, count;
    layer_off layer[MODEL_MAX_LAYERS];
} model;

int model_init(model *m, const model_cfg *c);                  /* offsets; -1 if c is unusable */
void model_init_params(const model *m, float *params, uint64_t seed);

/* The attention of layer `layer` on this rank's n tokens: q and out are
 * [n, heads, head_dim], k and v [n, kv_heads, head_dim]. forward keeps
 * whatever its backward needs; backward ACCUMULATES into dq, dk, dv. */
typedef struct attn_iface {
    void *self;
    int (*forward)(void *self, int layer, const float *q, const float *k, const float *v, float *out);
    int (*backward)(void *self, int layer, const float *dout, float *dq, float *dk, float *dv);
} attn_iface;

/* What the forward keeps for the backward. */
typedef struct layer_acts {
    float *x_in, *h1, *rstd1, *q, *k, *v, *o, *x_mid, *h2, *rstd2, *u, *z;
} layer_acts;

typedef struct acts {
    int64_t n; /* tokens */
    layer_acts l[MODEL_MAX_LAYERS];
    float *x_out, *hf, *rstdf, *logits;
    float *scratch; /* backward temporaries */
    void *mem;
} acts;

int acts_alloc(acts *a, const model *m, int64_t n);
void acts_free(acts *a);

/* Forward over n tokens with global positions pos; fills a->logits.
 * Returns 0, or the attention callback's non-zero result. */
int model_forward(const model *m, const float *params, const int32_t *tokens, const int64_t *pos, int64_t n,
                  const attn_iface *attn, acts *a);

/* Sum over the n tokens of -log softmax(logits)[label] (a sum, not a mean:
 * the mean needs every rank's tokens). */
double model_loss_sum(const model *m, const acts *a, const int32_t *labels);

/* Backward of (loss_sum * scale); ACCUMULATES into grads (same layout as
 * params). scale is 1 / (tokens of the whole global batch). */
int model_backward(const model *m, const float *params, const int32_t *tokens, const int32_t *labels,
                   const int64_t *pos, float scale, const attn_iface *attn, acts *a, float *grads);

/* The layers, exposed for the finite-difference test. All backward
 * functions ACCUMULATE into their input and parameter gradients. */
void embedding_fwd(const float *table, const int32_t *tokens, float *x, int64_t n, int dim);
void embedding_bwd(const int32_t *tokens, const float *dx, float *dtable, int64_t n, int dim);
void rmsnorm_fwd(const float *x, const float *g, float *y, float *rstd, int64_t n, int dim, float eps);
void rmsnorm_bwd(const float *x, const float *g, const float *rstd, const float *dy, float *dx, float *dg,
                 int64_t n, int dim);
void linear_fwd(const float *x, const float *w, float *y, int64_t n, int in, int out);
void linear_bwd(const float *x, const float *w, const float *dy, float *dx, float *dw, int64_t n, int in,
                int out);
/* Rotate pairs (i, i + head_dim/2) of every head by pos * base^(-2i/head_dim);
 * inverse = 1 rotates back, which is also RoPE's backward. In place. */
void rope_apply(float *x, const int64_t *pos, int64_t n, int heads, int head_dim, double base, int inverse);
void silu_fwd(const float *u, float *z, size_t count);
void silu_bwd(const float *u, const float *dz, float *du, size_t count);
double cross_entropy_fwd(const float *logits, const int32_t *labels, int64_t n, int vocab);
void cross_entropy_bwd(const float *logits, const int32_t *labels, int64_t n, int vocab, float scale,
                       float *dlogits);

/* Decoupled weight decay Adam (Loshchilov & Hutter), step t >= 1. */
typedef struct adamw {
    float lr, beta1, beta2, eps, weight_decay;
} adamw;
void adamw_step(const adamw *o, int t, float *params, const float *grads, float *m1, float *m2, size_t count);

#endif
