/* SPDX-License-Identifier: MIT */
/* The transformer's layers, forward and backward, and AdamW. See model.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

/* ---- parameters ----------------------------------------------------------- */

int model_init(model *m, const model_cfg *c)
{
    if (c->layers < 1 || c->layers > MODEL_MAX_LAYERS || c->heads < 1 || c->kv_heads < 1 ||
        c->heads % c->kv_heads || c->head_dim < 2 || c->head_dim % 2 || c->dim != c->heads * c->head_dim ||
        c->vocab < 2 || c->ffn < 1)
        return -1;
    memset(m, 0, sizeof *m);
    m->c = *c;
    const size_t d = (size_t)c->dim, kv = (size_t)c->kv_heads * (size_t)c->head_dim, f = (size_t)c->ffn;
    size_t at = 0;
#define TAKE(field, n) (field = at, at += (n))
    TAKE(m->embed, (size_t)c->vocab * d);
    for (int l = 0; l < c->layers; l++) {
        layer_off *o = &m->layer[l];
        TAKE(o->attn_norm, d);
        TAKE(o->wq, d * d);
        TAKE(o->wk, d * kv);
        TAKE(o->wv, d * kv);
        TAKE(o->wo, d * d);
        TAKE(o->mlp_norm, d);
        TAKE(o->w1, d * f);
        TAKE(o->w2, f * d);
    }
    TAKE(m->final_norm, d);
    TAKE(m->head, d * (size_t)c->vocab);
#undef TAKE
    m->count = at;
    return 0;
}

static double uniform(uint64_t *s) /* [-1, 1), the same stream on every rank */
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*s >> 11) * 0x1.0p-52 - 1.0;
}

static void fill(float *p, size_t n, double scale, uint64_t *s)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(scale * uniform(s));
}

static void ones(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[i] = 1.0f;
}

void model_init_params(const model *m, float *params, uint64_t seed)
{
    const model_cfg *c = &m->c;
    const size_t d = (size_t)c->dim, kv = (size_t)c->kv_heads * (size_t)c->head_dim, f = (size_t)c->ffn;
    const double sd = 1.0 / sqrt((double)d), sf = 1.0 / sqrt((double)f);
    fill(params + m->embed, (size_t)c->vocab * d, 1.0, &seed);
    for (int l = 0; l < c->layers; l++) {
        const layer_off *o = &m->layer[l];
        ones(params + o->attn_norm, d);
        fill(params + o->wq, d * d, sd, &seed);
        fill(params + o->wk, d * kv, sd, &seed);
        fill(params + o->wv, d * kv, sd, &seed);
        fill(params + o->wo, d * d, sd / c->layers, &seed);
        ones(params + o->mlp_norm, d);
        fill(params + o->w1, d * f, sd, &seed);
        fill(params + o->w2, f * d, sf / c->layers, &seed);
    }
    ones(params + m->final_norm, d);
    fill(params + m->head, d * (size_t)c->vocab, sd, &seed);
}

/* ---- activations ---------------------------------------------------------- */

int acts_alloc(acts *a, const model *m, int64_t n)
{
    const model_cfg *c = &m->c;
    const size_t N = (size_t)n, d = (size_t)c->dim, kv = (size_t)c->kv_heads * (size_t)c->head_dim;
    const size_t f = (size_t)c->ffn, v = (size_t)c->vocab;
    const size_t per_layer = N * (d + d + 1 + d + kv + kv + d + d + d + 1 + f + f);
    const size_t scratch = N * (4 * d + 2 * kv + 2 * f + v);
    memset(a, 0, sizeof *a);
    a->n = n;
    float *p = a->mem = calloc(per_layer * (size_t)c->layers + N * (d + d + 1 + v) + scratch, sizeof(float));
    if (!p)
        return -1;
#define CARVE(field, count) (field = p, p += (count))
    for (int l = 0; l < c->layers; l++) {
        layer_acts *L = &a->l[l];
        CARVE(L->x_in, N * d);
        CARVE(L->h1, N * d);
        CARVE(L->rstd1, N);
        CARVE(L->q, N * d);
        CARVE(L->k, N * kv);
        CARVE(L->v, N * kv);
        CARVE(L->o, N * d);
        CARVE(L->x_mid, N * d);
        CARVE(L->h2, N * d);
        CARVE(L->rstd2, N);
        CARVE(L->u, N * f);
        CARVE(L->z, N * f);
    }
    CARVE(a->x_out, N * d);
    CARVE(a->hf, N * d);
    CARVE(a->rstdf, N);
    CARVE(a->logits, N * v);
    CARVE(a->scratch, scratch);
#undef CARVE
    return 0;
}

void acts_free(acts *a)
{
    free(a->mem);
    memset(a, 0, sizeof *a);
}

/* ---- layers --------------------------------------------------------------- */

void embedding_fwd(const float *table, const int32_t *tokens, float *x, int64_t n, int dim)
{
    for (int64_t r = 0; r < n; r++)
        memcpy(x + r * dim, table + (size_t)tokens[r] * (size_t)dim, (size_t)dim * sizeof *x);
}

void embedding_bwd(const int32_t *tokens, const float *dx, float *dtable, int64_t n, int dim)
{
    for (int64_t r = 0; r < n; r++)
        for (int i = 0; i < dim; i++)
            dtable[(size_t)tokens[r] * (size_t)dim + (size_t)i] += dx[r * dim + i];
}

void rmsnorm_fwd(const float *x, const float *g, float *y, float *rstd, int64_t n, int dim, float eps)
{
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * dim;
        double ss = 0;
        for (int i = 0; i < dim; i++)
            ss += (double)xr[i] * xr[i];
        rstd[r] = (float)(1.0 / sqrt(ss / dim + eps));
        for (int i = 0; i < dim; i++)
            y[r * dim + i] = xr[i] * rstd[r] * g[i];
    }
}

/* y = x * s * g with s = (mean(x^2) + eps)^-1/2: dx = s * (g dy - x s^2 mean(g dy x)). */
void rmsnorm_bwd(const float *x, const float *g, const float *rstd, const float *dy, float *dx, float *dg,
                 int64_t n, int dim)
{
    for (int64_t r = 0; r < n; r++) {
        const float *xr = x + r * dim, *dyr = dy + r * dim;
        const double s = rstd[r];
        double dot = 0;
        for (int i = 0; i < dim; i++)
            dot += (double)g[i] * dyr[i] * xr[i];
        const double c = s * s * dot / dim;
        for (int i = 0; i < dim; i++) {
            dx[r * dim + i] += (float)(s * ((double)g[i] * dyr[i] - xr[i] * c));
            dg[i] += (float)(dyr[i] * xr[i] * s);
        }
    }
}

/* y[n][out] = x[n][in] w[in][out] */
void linear_fwd(const float *x, const float *w, float *y, int64_t n, int in, int out)
{
    for (int64_t r = 0; r < n; r++) {
        float *yr = y + r * out;
        for (int j = 0; j < out; j++)
            yr[j] = 0;
        for (int i = 0; i < in; i++) {
            const float xi = x[r * in + i];
            const float *wi = w + (size_t)i * (size_t)out;
            for (int j = 0; j < out; j++)
                yr[j] += xi * wi[j];
        }
    }
}

/* dx += dy w^T; dw += x^T dy (a sum over this rank's tokens only: the
 * other tokens' share arrives with the gradient all-reduce). */
void linear_bwd(const float *x, const float *w, const float *dy, float *dx, float *dw, int64_t n, int in, int out)
{
    for (int64_t r = 0; r < n; r++) {
        const float *dyr = dy + r * out;
        for (int i = 0; i < in; i++) {
            const float *wi = w + (size_t)i * (size_t)out;
            float *dwi = dw + (size_t)i * (size_t)out;
            const float xi = x[r * in + i];
            float acc = 0;
            for (int j = 0; j < out; j++) {
                acc += dyr[j] * wi[j];
                dwi[j] += xi * dyr[j];
            }
            dx[r * in + i] += acc;
        }
    }
}

void rope_apply(float *x, const int64_t *pos, int64_t n, int heads, int head_dim, double base, int inverse)
{
    const int half = head_dim / 2;
    for (int64_t r = 0; r < n; r++)
        for (int i = 0; i < half; i++) {
            /* the angle from the GLOBAL position: the same token gets the
             * same rotation whichever rank holds it */
            const double ang = (double)pos[r] * pow(base, -2.0 * i / head_dim);
            const float c = (float)cos(ang), s = inverse ? -(float)sin(ang) : (float)sin(ang);
            for (int h = 0; h < heads; h++) {
                float *xh = x + (r * heads + h) * head_dim;
                const float a = xh[i], b = xh[i + half];
                xh[i] = a * c - b * s;
                xh[i + half] = a * s + b * c;
            }
        }
}

void silu_fwd(const float *u, float *z, size_t count)
{
    for (size_t i = 0; i < count; i++)
        z[i] = u[i] / (1.0f + expf(-u[i]));
}

void silu_bwd(const float *u, const float *dz, float *du, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        const float s = 1.0f / (1.0f + expf(-u[i]));
        du[i] += dz[i] * s * (1.0f + u[i] * (1.0f - s));
    }
}

/* One row's max and sum of exp(logit - max), in double. */
static void softmax_stats(const float *l, int vocab, float *mx, double *sum)
{
    float m = l[0];
    for (int j = 1; j < vocab; j++)
        m = l[j] > m ? l[j] : m;
    double s = 0;
    for (int j = 0; j < vocab; j++)
        s += exp((double)l[j] - m);
    *mx = m;
    *sum = s;
}

double cross_entropy_fwd(const float *logits, const int32_t *labels, int64_t n, int vocab)
{
    double total = 0;
    for (int64_t r = 0; r < n; r++) {
        const float *l = logits + r * vocab;
        float mx;
        double s;
        softmax_stats(l, vocab, &mx, &s);
        total += log(s) + mx - l[labels[r]];
    }
    return total;
}

void cross_entropy_bwd(const float *logits, const int32_t *labels, int64_t n, int vocab, float scale,
                       float *dlogits)
{
    for (int64_t r = 0; r < n; r++) {
        const float *l = logits + r * vocab;
        float mx;
        double s;
        softmax_stats(l, vocab, &mx, &s);
        for (int j = 0; j < vocab; j++) {
            const double p = exp((double)l[j] - mx) / s;
            dlogits[r * vocab + j] += (float)((p - (j == labels[r])) * scale);
        }
    }
}

/* ---- the model ------------------------------------------------------------ */

static void add(float *y, const float *x, size_t count)
{
    for (size_t i = 0; i < count; i++)
        y[i] += x[i];
}

int model_forward(const model *m, const float *params, const int32_t *tokens, const int64_t *pos, int64_t n,
                  const attn_iface *attn, acts *a)
{
    const model_cfg *c = &m->c;
    const int d = c->dim, kv = c->kv_heads * c->head_dim, f = c->ffn;
    const size_t nd = (size_t)n * (size_t)d;
    embedding_fwd(params + m->embed, tokens, a->l[0].x_in, n, d);
    for (int l = 0; l < c->layers; l++) {
        const layer_off *o = &m->layer[l];
        layer_acts *L = &a->l[l];
        rmsnorm_fwd(L->x_in, params + o->attn_norm, L->h1, L->rstd1, n, d, c->norm_eps);
        linear_fwd(L->h1, params + o->wq, L->q, n, d, d);
        linear_fwd(L->h1, params + o->wk, L->k, n, d, kv);
        linear_fwd(L->h1, params + o->wv, L->v, n, d, kv);
        rope_apply(L->q, pos, n, c->heads, c->head_dim, c->rope_base, 0);
        rope_apply(L->k, pos, n, c->kv_heads, c->head_dim, c->rope_base, 0);
        int rc = attn->forward(attn->self, l, L->q, L->k, L->v, L->o);
        if (rc)
            return rc;
        linear_fwd(L->o, params + o->wo, L->x_mid, n, d, d);
        add(L->x_mid, L->x_in, nd);
        rmsnorm_fwd(L->x_mid, params + o->mlp_norm, L->h2, L->rstd2, n, d, c->norm_eps);
        linear_fwd(L->h2, params + o->w1, L->u, n, d, f);
        silu_fwd(L->u, L->z, (size_t)n * (size_t)f);
        float *next = l + 1 < c->layers ? a->l[l + 1].x_in : a->x_out;
        linear_fwd(L->z, params + o->w2, next, n, f, d);
        add(next, L->x_mid, nd);
    }
    rmsnorm_fwd(a->x_out, params + m->final_norm, a->hf, a->rstdf, n, d, c->norm_eps);
    linear_fwd(a->hf, params + m->head, a->logits, n, d, c->vocab);
    return 0;
}

double model_loss_sum(const model *m, const acts *a, const int32_t *labels)
{
    return cross_entropy_fwd(a->logits, labels, a->n, m->c.vocab);
}

int model_backward(const model *m, const float *params, const int32_t *tokens, const int32_t *labels,
                   const int64_t *pos, float scale, const attn_iface *attn, acts *a, float *grads)
{
    const model_cfg *c = &m->c;
    const int64_t n = a->n;
    const int d = c->dim, kv = c->kv_heads * c->head_dim, f = c->ffn, V = c->vocab;
    const size_t nd = (size_t)n * (size_t)d, nkv = (size_t)n * (size_t)kv, nf = (size_t)n * (size_t)f;
    /* gradients of the residual stream (dx, dx_mid), of a block's input or
     * output (dh), of q, k, v, of the MLP's u and z, and of the logits */
    float *dx = a->scratch, *dxm = dx + nd, *dh = dxm + nd, *dq = dh + nd;
    float *dk = dq + nd, *dv = dk + nkv, *du = dv + nkv, *dz = du + nf, *dlogits = dz + nf;
    memset(a->scratch, 0, (4 * nd + 2 * nkv + 2 * nf + (size_t)n * (size_t)V) * sizeof(float));

    cross_entropy_bwd(a->logits, labels, n, V, scale, dlogits);
    linear_bwd(a->hf, params + m->head, dlogits, dh, grads + m->head, n, d, V);
    rmsnorm_bwd(a->x_out, params + m->final_norm, a->rstdf, dh, dx, grads + m->final_norm, n, d);
    for (int l = c->layers - 1; l >= 0; l--) {
        const layer_off *o = &m->layer[l];
        layer_acts *L = &a->l[l];
        /* MLP block: x_out = x_mid + silu(rms(x_mid) W1) W2 */
        memset(dz, 0, nf * sizeof *dz);
        memset(du, 0, nf * sizeof *du);
        memset(dh, 0, nd * sizeof *dh);
        linear_bwd(L->z, params + o->w2, dx, dz, grads + o->w2, n, f, d);
        silu_bwd(L->u, dz, du, nf);
        linear_bwd(L->h2, params + o->w1, du, dh, grads + o->w1, n, d, f);
        memcpy(dxm, dx, nd * sizeof *dx);
        rmsnorm_bwd(L->x_mid, params + o->mlp_norm, L->rstd2, dh, dxm, grads + o->mlp_norm, n, d);
        /* attention block: x_mid = x_in + attn(rope(q), rope(k), v) Wo */
        memset(dh, 0, nd * sizeof *dh);
        memset(dq, 0, nd * sizeof *dq);
        memset(dk, 0, nkv * sizeof *dk);
        memset(dv, 0, nkv * sizeof *dv);
        linear_bwd(L->o, params + o->wo, dxm, dh, grads + o->wo, n, d, d);
        int rc = attn->backward(attn->self, l, dh, dq, dk, dv);
        if (rc)
            return rc;
        rope_apply(dq, pos, n, c->heads, c->head_dim, c->rope_base, 1);
        rope_apply(dk, pos, n, c->kv_heads, c->head_dim, c->rope_base, 1);
        memset(dh, 0, nd * sizeof *dh);
        linear_bwd(L->h1, params + o->wq, dq, dh, grads + o->wq, n, d, d);
        linear_bwd(L->h1, params + o->wk, dk, dh, grads + o->wk, n, d, kv);
        linear_bwd(L->h1, params + o->wv, dv, dh, grads + o->wv, n, d, kv);
        memcpy(dx, dxm, nd * sizeof *dx);
        rmsnorm_bwd(L->x_in, params + o->attn_norm, L->rstd1, dh, dx, grads + o->attn_norm, n, d);
    }
    embedding_bwd(tokens, dx, grads + m->embed, n, d);
    return 0;
}

/* ---- optimizer ------------------------------------------------------------ */

void adamw_step(const adamw *o, int t, float *params, const float *grads, float *m1, float *m2, size_t count)
{
    const double c1 = 1.0 - pow(o->beta1, t), c2 = 1.0 - pow(o->beta2, t);
    for (size_t i = 0; i < count; i++) {
        m1[i] = o->beta1 * m1[i] + (1.0f - o->beta1) * grads[i];
        m2[i] = o->beta2 * m2[i] + (1.0f - o->beta2) * grads[i] * grads[i];
        const double step = (m1[i] / c1) / (sqrt(m2[i] / c2) + o->eps);
        params[i] -= (float)(o->lr * (step + (double)o->weight_decay * params[i]));
    }
}
