/* SPDX-License-Identifier: MIT */
/*
 * The training example's hand-written backward, checked by finite
 * differences: every layer of examples/train/model.c, the attention layer
 * (RoPE on global positions, GQA, causal, through a CP=1 plan of the
 * library), and the whole model. For a layer y = f(x) and a fixed random
 * r, L = sum(r * y) (summed in double) has dL/dx = f'(x)^T r, which is what
 * the backward computes from dy = r; central differences of L give the
 * same numbers up to O(h^2) and float rounding. AdamW is checked against
 * its formula written out in double.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <infinicp/infinicp.h>

#include "model.h"

static uint64_t rng = 12345;

static double uni(void) /* [-1, 1) */
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) * 0x1.0p-52 - 1.0;
}

static float *randv(size_t n, double scale)
{
    float *p = malloc(n * sizeof *p);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = (float)(scale * uni());
    return p;
}

static float *zeros(size_t n)
{
    float *p = calloc(n, sizeof *p);
    assert_non_null(p);
    return p;
}

static double dot(const float *a, const float *r, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)a[i] * r[i];
    return s;
}

/* A layer under test: computes y from the current inputs. */
typedef void (*fwd_fn)(void *ctx, float *y);

/* Compare grad (analytic dL/dx for L = sum(r * y)) with central differences
 * over every element of x (perturbed in place, restored). */
static void check_grad(const char *what, fwd_fn f, void *ctx, float *x, size_t nx, const float *grad, float *y,
                       const float *r, size_t ny, float h, double tol)
{
    double worst = 0, gmax = 0;
    for (size_t i = 0; i < nx; i++)
        gmax = fmax(gmax, fabs(grad[i]));
    for (size_t i = 0; i < nx; i++) {
        const float x0 = x[i];
        x[i] = x0 + h;
        f(ctx, y);
        const double lp = dot(y, r, ny);
        x[i] = x0 - h;
        f(ctx, y);
        const double lm = dot(y, r, ny);
        x[i] = x0;
        const double fd = (lp - lm) / ((double)(x0 + h) - (double)(x0 - h));
        const double err = fabs(fd - grad[i]) / fmax(gmax, 1e-3);
        worst = fmax(worst, err);
        if (!(err <= tol))
            fail_msg("%s: element %zu: finite difference %.6g, backward %.6g (max |grad| %.3g)", what, i, fd,
                     (double)grad[i], gmax);
    }
    print_message("%-26s max error %.2e of max |grad| %.3g\n", what, worst, gmax);
}

/* ---- single layers ---------------------------------------------------- */

enum { N = 6, D = 8, OUT = 5, V = 7, H = 2, HKV = 1, HD = 4 };

typedef struct lin { float *x, *w; } lin;
static void lin_fwd(void *c, float *y)
{
    lin *l = c;
    linear_fwd(l->x, l->w, y, N, D, OUT);
}

static void test_linear(void **state)
{
    (void)state;
    lin l = { randv(N * D, 1), randv(D * OUT, 1) };
    float *y = zeros(N * OUT), *r = randv(N * OUT, 1), *dx = zeros(N * D), *dw = zeros(D * OUT);
    linear_bwd(l.x, l.w, r, dx, dw, N, D, OUT);
    check_grad("linear dx", lin_fwd, &l, l.x, N * D, dx, y, r, N * OUT, 1e-2f, 1e-4);
    check_grad("linear dw", lin_fwd, &l, l.w, D * OUT, dw, y, r, N * OUT, 1e-2f, 1e-4);
    free(l.x), free(l.w), free(y), free(r), free(dx), free(dw);
}

typedef struct rms { float *x, *g, rstd[N]; } rms;
static void rms_fwd(void *c, float *y)
{
    rms *l = c;
    rmsnorm_fwd(l->x, l->g, y, l->rstd, N, D, 1e-5f);
}

static void test_rmsnorm(void **state)
{
    (void)state;
    rms l = { randv(N * D, 2), randv(D, 1), { 0 } };
    float *y = zeros(N * D), *r = randv(N * D, 1), *dx = zeros(N * D), *dg = zeros(D);
    rms_fwd(&l, y);
    rmsnorm_bwd(l.x, l.g, l.rstd, r, dx, dg, N, D);
    check_grad("rmsnorm dx", rms_fwd, &l, l.x, N * D, dx, y, r, N * D, 1e-3f, 2e-3);
    check_grad("rmsnorm dgain", rms_fwd, &l, l.g, D, dg, y, r, N * D, 1e-3f, 2e-3);
    free(l.x), free(l.g), free(y), free(r), free(dx), free(dg);
}

typedef struct emb { float *table; const int32_t *tok; } emb;
static void emb_fwd(void *c, float *y)
{
    emb *l = c;
    embedding_fwd(l->table, l->tok, y, N, D);
}

static void test_embedding(void **state)
{
    (void)state;
    const int32_t tok[N] = { 3, 0, 3, 6, 1, 3 }; /* repeats must add up */
    emb l = { randv(V * D, 1), tok };
    float *y = zeros(N * D), *r = randv(N * D, 1), *dt = zeros(V * D);
    embedding_bwd(tok, r, dt, N, D);
    check_grad("embedding dtable", emb_fwd, &l, l.table, V * D, dt, y, r, N * D, 1e-2f, 1e-4);
    free(l.table), free(y), free(r), free(dt);
}

typedef struct rope { float *x; const int64_t *pos; } rope;
static void rope_fwd(void *c, float *y)
{
    rope *l = c;
    memcpy(y, l->x, N * H * HD * sizeof *y);
    rope_apply(y, l->pos, N, H, HD, 10000.0, 0);
}

static void test_rope(void **state)
{
    (void)state;
    const int64_t pos[N] = { 0, 1, 7, 8, 30, 31 }; /* global positions, as a zigzag rank has */
    rope l = { randv(N * H * HD, 1), pos };
    float *y = zeros(N * H * HD), *r = randv(N * H * HD, 1), *dx = zeros(N * H * HD);
    memcpy(dx, r, N * H * HD * sizeof *dx);
    rope_apply(dx, pos, N, H, HD, 10000.0, 1); /* the backward: rotate back */
    check_grad("rope dx", rope_fwd, &l, l.x, N * H * HD, dx, y, r, N * H * HD, 1e-2f, 1e-4);
    /* and it preserves norms: a rotation */
    rope_fwd(&l, y);
    assert_true(fabs(dot(y, y, N * H * HD) - dot(l.x, l.x, N * H * HD)) < 1e-4 * dot(l.x, l.x, N * H * HD));
    free(l.x), free(y), free(r), free(dx);
}

typedef struct silu { float *u; } silu;
static void silu_f(void *c, float *y)
{
    silu_fwd(((silu *)c)->u, y, N * D);
}

static void test_silu(void **state)
{
    (void)state;
    silu l = { randv(N * D, 4) };
    float *y = zeros(N * D), *r = randv(N * D, 1), *du = zeros(N * D);
    silu_bwd(l.u, r, du, N * D);
    check_grad("silu du", silu_f, &l, l.u, N * D, du, y, r, N * D, 1e-3f, 2e-3);
    free(l.u), free(y), free(r), free(du);
}

typedef struct ce { float *logits; const int32_t *labels; } ce;
static void ce_fwd(void *c, float *y)
{
    ce *l = c;
    y[0] = (float)cross_entropy_fwd(l->logits, l->labels, N, V);
}

static void test_cross_entropy(void **state)
{
    (void)state;
    const int32_t labels[N] = { 0, 6, 2, 2, 5, 1 };
    ce l = { randv(N * V, 3), labels };
    float y, r = 1, *dl = zeros(N * V);
    cross_entropy_bwd(l.logits, labels, N, V, 1.0f, dl);
    check_grad("cross-entropy dlogits", ce_fwd, &l, l.logits, N * V, dl, &y, &r, 1, 1e-2f, 2e-3);
    /* the loss of uniform logits is ln V per token */
    float flat[N * V] = { 0 };
    assert_true(fabs(cross_entropy_fwd(flat, labels, N, V) - N * log((double)V)) < 1e-9);
    free(l.logits), free(dl);
}

static void test_adamw(void **state)
{
    (void)state;
    const adamw o = { .lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f };
    float p[3] = { 1.0f, -2.0f, 0.5f }, g1[3] = { 0.5f, 0.1f, -1.0f }, g2[3] = { -0.2f, 0.3f, 0.4f };
    float m1[3] = { 0 }, m2[3] = { 0 };
    double pd[3] = { 1.0, -2.0, 0.5 }, md[3] = { 0 }, vd[3] = { 0 };
    const float *g[2] = { g1, g2 };
    for (int t = 1; t <= 2; t++) {
        adamw_step(&o, t, p, g[t - 1], m1, m2, 3);
        for (int i = 0; i < 3; i++) {
            md[i] = 0.9 * md[i] + 0.1 * g[t - 1][i];
            vd[i] = 0.99 * vd[i] + 0.01 * (double)g[t - 1][i] * g[t - 1][i];
            const double mh = md[i] / (1 - pow(0.9, t)), vh = vd[i] / (1 - pow(0.99, t));
            pd[i] -= 0.1 * (mh / (sqrt(vh) + 1e-8) + 0.1 * pd[i]);
            assert_true(fabs(p[i] - pd[i]) < 1e-5);
        }
    }
}

/* ---- attention through the library (CP = 1) -------------------------------- */

enum { AB = 2, AS = 8, AH = 4, AHKV = 2, AD = 4 };
#define AN (AB * AS)

typedef struct attn_layer {
    cp_attn_plan *plan;
    float *q, *k, *v; /* before RoPE */
    int64_t pos[AN];
    float qr[AN * AH * AD], kr[AN * AHKV * AD], o[AN * AH * AD], lse[AB * AH * AS];
} attn_layer;

static void attn_fwd(void *c, float *y)
{
    attn_layer *l = c;
    memcpy(l->qr, l->q, sizeof l->qr);
    memcpy(l->kr, l->k, sizeof l->kr);
    rope_apply(l->qr, l->pos, AN, AH, AD, 10000.0, 0);
    rope_apply(l->kr, l->pos, AN, AHKV, AD, 10000.0, 0);
    assert_int_equal(cp_attn_forward(l->plan, l->qr, l->kr, l->v, y, l->lse, NULL, 0), CP_SUCCESS);
}

static void test_attention_with_rope(void **state)
{
    (void)state;
    cp_comm *comm;
    cp_context *ctx;
    cp_group *g;
    cp_context_config cc = CP_CONTEXT_CONFIG_INIT;
    cc.num_threads = 1;
    assert_int_equal(cp_comm_create_local(1, &comm), CP_SUCCESS);
    assert_int_equal(cp_context_create(&cc, &ctx), CP_SUCCESS);
    assert_int_equal(cp_group_create(ctx, comm, NULL, &g), CP_SUCCESS);
    cp_attn_desc d = CP_ATTN_DESC_INIT;
    d.batch = AB;
    d.seq_len = AS;
    d.num_heads = AH;
    d.num_kv_heads = AHKV;
    d.head_dim = AD;
    attn_layer l = { .q = randv(AN * AH * AD, 1), .k = randv(AN * AHKV * AD, 1), .v = randv(AN * AHKV * AD, 1) };
    assert_int_equal(cp_attn_plan_create(g, &d, &l.plan), CP_SUCCESS);
    for (int i = 0; i < AN; i++)
        l.pos[i] = 100 + i % AS; /* positions far from 0: RoPE's angles matter */

    float *y = zeros(AN * AH * AD), *r = randv(AN * AH * AD, 1);
    float *dq = zeros(AN * AH * AD), *dk = zeros(AN * AHKV * AD), *dv = zeros(AN * AHKV * AD);
    attn_fwd(&l, y);
    assert_int_equal(cp_attn_backward(l.plan, l.qr, l.kr, l.v, y, l.lse, r, dq, dk, dv, NULL, 0), CP_SUCCESS);
    rope_apply(dq, l.pos, AN, AH, AD, 10000.0, 1);
    rope_apply(dk, l.pos, AN, AHKV, AD, 10000.0, 1);
    check_grad("attention+rope dq", attn_fwd, &l, l.q, AN * AH * AD, dq, y, r, AN * AH * AD, 1e-2f, 2e-3);
    check_grad("attention+rope dk", attn_fwd, &l, l.k, AN * AHKV * AD, dk, y, r, AN * AH * AD, 1e-2f, 2e-3);
    check_grad("attention+rope dv", attn_fwd, &l, l.v, AN * AHKV * AD, dv, y, r, AN * AH * AD, 1e-2f, 2e-3);
    cp_attn_plan_destroy(l.plan);
    cp_group_destroy(g);
    cp_context_destroy(ctx);
    cp_comm_destroy(comm);
    free(l.q), free(l.k), free(l.v), free(y), free(r), free(dq), free(dk), free(dv);
}

/* ---- the whole model --------------------------------------------------------- */

/* Attention for the model: one CP=1 plan, tensors kept for the backward. */
typedef struct model_attn {
    cp_attn_plan *plan;
    int64_t n;
    int hq, hkv;
    float *q[2], *k[2], *v[2], *o[2], *lse[2];
} model_attn;

static int ma_forward(void *self, int l, const float *q, const float *k, const float *v, float *out)
{
    model_attn *a = self;
    memcpy(a->q[l], q, (size_t)(a->n * a->hq) * sizeof *q);
    memcpy(a->k[l], k, (size_t)(a->n * a->hkv) * sizeof *k);
    memcpy(a->v[l], v, (size_t)(a->n * a->hkv) * sizeof *v);
    if (cp_attn_forward(a->plan, a->q[l], a->k[l], a->v[l], a->o[l], a->lse[l], NULL, 0) != CP_SUCCESS)
        return -1;
    memcpy(out, a->o[l], (size_t)(a->n * a->hq) * sizeof *out);
    return 0;
}

static int ma_backward(void *self, int l, const float *dout, float *dq, float *dk, float *dv)
{
    model_attn *a = self;
    const size_t nq = (size_t)(a->n * a->hq), nkv = (size_t)(a->n * a->hkv);
    float *tq = zeros(nq), *tk = zeros(nkv), *tv = zeros(nkv);
    cp_status s = cp_attn_backward(a->plan, a->q[l], a->k[l], a->v[l], a->o[l], a->lse[l], dout, tq, tk, tv,
                                   NULL, 0);
    for (size_t i = 0; i < nq; i++)
        dq[i] += tq[i];
    for (size_t i = 0; i < nkv; i++) {
        dk[i] += tk[i];
        dv[i] += tv[i];
    }
    free(tq), free(tk), free(tv);
    return s == CP_SUCCESS ? 0 : -1;
}

typedef struct whole {
    model m;
    float *params;
    const int32_t *tok, *lab;
    const int64_t *pos;
    attn_iface ai;
    acts a;
    int64_t n;
} whole;

static void whole_fwd(void *c, float *y)
{
    whole *w = c;
    assert_int_equal(model_forward(&w->m, w->params, w->tok, w->pos, w->n, &w->ai, &w->a), 0);
    y[0] = (float)(model_loss_sum(&w->m, &w->a, w->lab) / (double)w->n);
}

static void test_whole_model(void **state)
{
    (void)state;
    enum { B = 2, S = 8 };
    const model_cfg c = { .vocab = 11, .dim = 8, .heads = 2, .kv_heads = 1, .head_dim = 4, .ffn = 12,
                          .layers = 2, .rope_base = 10000.0, .norm_eps = 1e-5f };
    whole w = { .n = B * S };
    assert_int_equal(model_init(&w.m, &c), 0);
    w.params = zeros(w.m.count);
    model_init_params(&w.m, w.params, 77);
    int32_t tok[B * S], lab[B * S];
    int64_t pos[B * S];
    for (int i = 0; i < B * S; i++) {
        tok[i] = (int32_t)((i * 7 + 3) % c.vocab);
        lab[i] = (int32_t)((i * 5 + 1) % c.vocab);
        pos[i] = i % S;
    }
    w.tok = tok, w.lab = lab, w.pos = pos;

    cp_comm *comm;
    cp_context *ctx;
    cp_group *g;
    cp_context_config cc = CP_CONTEXT_CONFIG_INIT;
    cc.num_threads = 1;
    assert_int_equal(cp_comm_create_local(1, &comm), CP_SUCCESS);
    assert_int_equal(cp_context_create(&cc, &ctx), CP_SUCCESS);
    assert_int_equal(cp_group_create(ctx, comm, NULL, &g), CP_SUCCESS);
    cp_attn_desc d = CP_ATTN_DESC_INIT;
    d.batch = B;
    d.seq_len = S;
    d.num_heads = c.heads;
    d.num_kv_heads = c.kv_heads;
    d.head_dim = c.head_dim;
    model_attn ma = { .n = B * S, .hq = c.heads * c.head_dim, .hkv = c.kv_heads * c.head_dim };
    assert_int_equal(cp_attn_plan_create(g, &d, &ma.plan), CP_SUCCESS);
    for (int l = 0; l < 2; l++) {
        ma.q[l] = zeros((size_t)(ma.n * ma.hq));
        ma.o[l] = zeros((size_t)(ma.n * ma.hq));
        ma.k[l] = zeros((size_t)(ma.n * ma.hkv));
        ma.v[l] = zeros((size_t)(ma.n * ma.hkv));
        ma.lse[l] = zeros((size_t)(B * S * c.heads));
    }
    w.ai = (attn_iface){ &ma, ma_forward, ma_backward };
    assert_int_equal(acts_alloc(&w.a, &w.m, w.n), 0);

    float y, r = 1, *grads = zeros(w.m.count);
    whole_fwd(&w, &y);
    assert_int_equal(model_backward(&w.m, w.params, tok, lab, pos, 1.0f / (float)w.n, &w.ai, &w.a, grads), 0);
    /* every tensor, a few elements each (all of them would be slow) */
    const layer_off *L = &w.m.layer[0], *L1 = &w.m.layer[1];
    const struct {
        const char *name;
        size_t off, len;
    } t[] = {
        { "model d embed", w.m.embed, 24 },       { "model d attn_norm[0]", L->attn_norm, 8 },
        { "model d wq[0]", L->wq, 24 },           { "model d wk[0]", L->wk, 24 },
        { "model d wv[0]", L->wv, 24 },           { "model d wo[0]", L->wo, 24 },
        { "model d mlp_norm[0]", L->mlp_norm, 8 }, { "model d w1[0]", L->w1, 24 },
        { "model d w2[0]", L->w2, 24 },           { "model d wq[1]", L1->wq, 24 },
        { "model d final_norm", w.m.final_norm, 8 }, { "model d head", w.m.head, 24 },
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        check_grad(t[i].name, whole_fwd, &w, w.params + t[i].off, t[i].len, grads + t[i].off, &y, &r, 1, 1e-2f,
                   2e-2);
    acts_free(&w.a);
    for (int l = 0; l < 2; l++)
        free(ma.q[l]), free(ma.k[l]), free(ma.v[l]), free(ma.o[l]), free(ma.lse[l]);
    cp_attn_plan_destroy(ma.plan);
    cp_group_destroy(g);
    cp_context_destroy(ctx);
    cp_comm_destroy(comm);
    free(w.params), free(grads);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_silu),
        cmocka_unit_test(test_cross_entropy),
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_attention_with_rope),
        cmocka_unit_test(test_whole_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
