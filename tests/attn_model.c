/* SPDX-License-Identifier: MIT */
/* The FP64 attention model (see attn_model.h). */
#include "attn_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

size_t model_q_elems(const model_shape *s)
{
    return (size_t)s->batch * (size_t)s->seq_q * (size_t)s->heads * (size_t)s->head_dim;
}

size_t model_k_elems(const model_shape *s)
{
    return (size_t)s->batch * (size_t)s->seq_k * (size_t)s->kv_heads * (size_t)s->head_dim;
}

size_t model_v_elems(const model_shape *s)
{
    return (size_t)s->batch * (size_t)s->seq_k * (size_t)s->kv_heads * (size_t)s->head_dim_v;
}

size_t model_o_elems(const model_shape *s)
{
    return (size_t)s->batch * (size_t)s->seq_q * (size_t)s->heads * (size_t)s->head_dim_v;
}

size_t model_lse_elems(const model_shape *s)
{
    return (size_t)s->batch * (size_t)s->heads * (size_t)s->seq_q;
}

/* Row (b, t, h) of a dense [B][T][heads][dim] tensor. */
static size_t row(int64_t T, int heads, int dim, int64_t b, int64_t t, int h)
{
    return (((size_t)b * (size_t)T + (size_t)t) * (size_t)heads + (size_t)h) * (size_t)dim;
}

static size_t lse_at(const model_shape *s, int64_t b, int h, int64_t i)
{
    return ((size_t)b * (size_t)s->heads + (size_t)h) * (size_t)s->seq_q + (size_t)i;
}

static double dot(const double *a, const double *b, int n)
{
    double d = 0;
    for (int e = 0; e < n; e++)
        d += a[e] * b[e];
    return d;
}

void model_forward(const model_shape *s, const double *q, const double *k, const double *v, double *o,
                   double *lse)
{
    const model_ext none = { 0 };
    model_forward_ex(s, &none, q, k, v, o, lse);
}

/* Every visible pair adds its terms, also one of weight 0: 0 times a
 * non-finite element is NaN, as in exact IEEE arithmetic over the pairs. */
void model_backward(const model_shape *s, const double *q, const double *k, const double *v, const double *o,
                    const double *lse, const double *dout, double *dq, double *dk, double *dv)
{
    const model_ext none = { 0 };
    model_backward_ex(s, &none, q, k, v, o, lse, dout, dq, dk, dv, NULL);
}

double model_loss(const model_shape *s, const double *q, const double *k, const double *v, const double *dout)
{
    const size_t n = model_o_elems(s);
    double *o = malloc((n ? n : 1) * sizeof *o);
    if (!o)
        abort();
    model_forward(s, q, k, v, o, NULL);
    double loss = 0;
    for (size_t i = 0; i < n; i++)
        loss += dout[i] * o[i];
    free(o);
    return loss;
}

/* ---- API 1.1 --------------------------------------------------------- */

static int ext_doc(const model_ext *x, int64_t pos)
{
    int d = 0;
    while (d + 1 < x->ndocs && x->cu[d + 1] <= pos)
        d++;
    return d;
}

static int ext_mask(const model_shape *s, const model_ext *x, int64_t qp, int64_t kp)
{
    if (x->cu && ext_doc(x, qp) != ext_doc(x, kp))
        return 0;
    if (s->causal)
        return kp <= qp && (!x->window || kp > qp - x->window);
    return !x->window || (qp - kp < x->window && kp - qp < x->window);
}

/* How many times the pair (i, j) enters row i's softmax. */
static int ext_count(const model_shape *s, const model_ext *x, int64_t i, int64_t j)
{
    if (!x->rects)
        return ext_mask(s, x, s->q_offset + i, s->k_offset + j);
    int n = 0;
    for (int64_t r = 0; r < x->nrects; r++) {
        const model_rect *R = &x->rects[r];
        if (i >= R->q_row && i < R->q_row + R->q_len && j >= R->k_row && j < R->k_row + R->k_len)
            n += ext_mask(s, x, R->q_pos + (i - R->q_row), R->k_pos + (j - R->k_row));
    }
    return n;
}

/* The score of a pair and d score / d (q.k). */
static double ext_score(const model_shape *s, const model_ext *x, double qk, double *dscore)
{
    double raw = s->scale * qk;
    if (x->softcap <= 0) {
        *dscore = s->scale;
        return raw;
    }
    double t = tanh(raw / x->softcap);
    *dscore = s->scale * (1 - t * t);
    return x->softcap * t;
}

void model_forward_ex(const model_shape *s, const model_ext *x, const double *q, const double *k, const double *v,
                      double *o, double *lse)
{
    const int G = s->heads / s->kv_heads;
    double *sc = malloc((size_t)(s->seq_k > 0 ? s->seq_k : 1) * sizeof *sc);
    int *cnt = malloc((size_t)(s->seq_k > 0 ? s->seq_k : 1) * sizeof *cnt);
    if (!sc || !cnt)
        abort();
    for (int64_t b = 0; b < s->batch; b++)
        for (int h = 0; h < s->heads; h++)
            for (int64_t i = 0; i < s->seq_q; i++) {
                const double *qi = q + row(s->seq_q, s->heads, s->head_dim, b, i, h);
                double *oi = o + row(s->seq_q, s->heads, s->head_dim_v, b, i, h);
                const double sink = x->sinks ? x->sinks[h] : -INFINITY;
                double mx = -INFINITY, unused;
                int any = 0, nan = 0;
                for (int64_t j = 0; j < s->seq_k; j++) {
                    cnt[j] = ext_count(s, x, i, j);
                    if (!cnt[j])
                        continue;
                    sc[j] = ext_score(s, x, dot(qi, k + row(s->seq_k, s->kv_heads, s->head_dim, b, j, h / G), s->head_dim),
                                      &unused);
                    nan |= isnan(sc[j]);
                    mx = sc[j] > mx ? sc[j] : mx;
                    any = 1;
                }
                for (int e = 0; e < s->head_dim_v; e++)
                    oi[e] = 0;
                if (!any || (!nan && mx == -INFINITY)) {
                    /* no key weighs anything: the sink alone, or nothing */
                    if (lse)
                        lse[lse_at(s, b, h, i)] = sink;
                    continue;
                }
                if (nan)
                    mx = NAN;
                if (sink > mx)
                    mx = sink;
                double l = x->sinks ? exp(sink - mx) : 0.0;
                for (int64_t j = 0; j < s->seq_k; j++) {
                    if (!cnt[j])
                        continue;
                    const double p = cnt[j] * exp(sc[j] - mx);
                    const double *vj = v + row(s->seq_k, s->kv_heads, s->head_dim_v, b, j, h / G);
                    l += p;
                    for (int e = 0; e < s->head_dim_v; e++)
                        oi[e] += p * vj[e];
                }
                for (int e = 0; e < s->head_dim_v; e++)
                    oi[e] /= l;
                if (lse)
                    lse[lse_at(s, b, h, i)] = mx + log(l);
            }
    free(cnt);
    free(sc);
}

void model_backward_ex(const model_shape *s, const model_ext *x, const double *q, const double *k,
                       const double *v, const double *o, const double *lse, const double *dout, double *dq,
                       double *dk, double *dv, double *dsinks)
{
    const int G = s->heads / s->kv_heads;
    memset(dq, 0, model_q_elems(s) * sizeof *dq);
    memset(dk, 0, model_k_elems(s) * sizeof *dk);
    memset(dv, 0, model_v_elems(s) * sizeof *dv);
    if (dsinks)
        for (int h = 0; h < s->heads; h++)
            dsinks[h] = 0;
    for (int64_t b = 0; b < s->batch; b++)
        for (int h = 0; h < s->heads; h++)
            for (int64_t i = 0; i < s->seq_q; i++) {
                const double *qi = q + row(s->seq_q, s->heads, s->head_dim, b, i, h);
                const double *doi = dout + row(s->seq_q, s->heads, s->head_dim_v, b, i, h);
                const double Di = dot(doi, o + row(s->seq_q, s->heads, s->head_dim_v, b, i, h), s->head_dim_v);
                const double l = lse[lse_at(s, b, h, i)];
                double *dqi = dq + row(s->seq_q, s->heads, s->head_dim, b, i, h);
                if (dsinks && x->sinks && l != -INFINITY)
                    dsinks[h] -= exp(x->sinks[h] - l) * Di;
                for (int64_t j = 0; j < s->seq_k; j++) {
                    const int c = ext_count(s, x, i, j);
                    if (!c)
                        continue;
                    const size_t kj = row(s->seq_k, s->kv_heads, s->head_dim, b, j, h / G);
                    const size_t vj = row(s->seq_k, s->kv_heads, s->head_dim_v, b, j, h / G);
                    double dscore;
                    const double sc = ext_score(s, x, dot(qi, k + kj, s->head_dim), &dscore);
                    const double p = l == -INFINITY ? 0.0 : c * exp(sc - l);
                    const double ds = p * (dot(doi, v + vj, s->head_dim_v) - Di) * dscore;
                    for (int e = 0; e < s->head_dim_v; e++)
                        dv[vj + e] += p * doi[e];
                    for (int e = 0; e < s->head_dim; e++) {
                        dk[kj + e] += ds * qi[e];
                        dqi[e] += ds * k[kj + e];
                    }
                }
            }
}
