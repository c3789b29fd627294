/* SPDX-License-Identifier: MIT */
/*
 * The single-device kernels (cp_kernel_attn_forward / _backward / _merge /
 * _workspace_size) against the FP64 model of attn_model.c.
 *
 * Inputs are random values rounded to the storage type, so the reference sees
 * exactly the numbers the kernel sees and every difference is the kernel's
 * own rounding. Every case runs on several contexts: each instruction set the
 * processor has (INFINICP_CPU_ISA) and 1, 2 and 3 threads.
 *
 * Error bounds. u = 2^-24 (fp32 unit roundoff). Errors are measured
 * against the largest magnitude of the reference tensor (O is a convex
 * combination of V rows, so max|O| <= max|V|; gradients are sums whose terms
 * can cancel, so an absolute bound on the tensor's scale is the meaningful
 * one):
 *  - F32 results: a score is a length-D fp32 dot product, exponentials are
 *    2^x to < 2e-7 relative, the row sum and P V add up to Sk terms, and the
 *    backward chains three such products. Rounding errors of n-term fp32
 *    sums of terms of both signs grow like sqrt(n) u in practice (the
 *    worst case n u is not reached by random data): with D <= 64, Sk <= 300
 *    that is about 20 * 6e-8 = 1.2e-6 per product, a few 1e-6 in all
 *    (measured: below 1e-6). TOL_F32 = 2e-5 leaves a factor of 20 and
 *    still catches a wrong mask, scale, head mapping or a poor exp (errors
 *    of 1e-4 .. 1).
 *  - 16-bit results: the kernel rounds each output once to the type (unit
 *    roundoff 2^-8 for BF16, 2^-11 for F16, relative to the element, hence at
 *    most that times the tensor's scale), on top of the fp32 error. In the
 *    backward with a 16-bit O the kernel's D = rowsum(dO * O) sees the rounded
 *    O (as every implementation does), which adds about Dv * 2^-8 * |dO||O|
 *    relative to the terms it cancels with; the bounds are 1.5x the rounding
 *    unit for the forward and 2x for the backward (measured: 0.75x, 0.95x).
 *  - LSE is always fp32: absolute error <= the score error plus u |lse|.
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

#include "attn_model.h"
#include "cpuctx.h"
#include "storage.h"
#include "testutil.h"

#define TOL_F32 2e-5
#define TOL_LSE 2e-5

static double tol_for(cp_dtype t, int backward)
{
    switch (t) {
    case CP_DTYPE_BF16: return (backward ? 2.0 : 1.5) * 0x1p-8 + TOL_F32;
    case CP_DTYPE_F16: return (backward ? 2.0 : 1.5) * 0x1p-11 + TOL_F32;
    default: return TOL_F32;
    }
}

/* ------------------------------------------------------------------------ */
/* Contexts: every ISA this machine has, several thread counts              */
/* ------------------------------------------------------------------------ */

static cpuctx_set cs;

static int setup_contexts(void **state)
{
    (void)state;
    cpuctx_add(&cs, NULL, 1);
    cpuctx_add(&cs, NULL, 2);
    cpuctx_add(&cs, NULL, 3);
    cpuctx_add(&cs, "avx512", 2);
    cpuctx_add(&cs, "avx2", 2);
    cpuctx_add(&cs, "generic", 2);
    return 0;
}

static int teardown_contexts(void **state)
{
    (void)state;
    cpuctx_close_all(&cs);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Tensors in three memory layouts                                          */
/* ------------------------------------------------------------------------ */

typedef enum { LAYOUT_BSHD, LAYOUT_SBHD, LAYOUT_PADDED } layout;

/* Strides of a [B, S, H, D] tensor and the elements its buffer needs.
 * PADDED: BSHD with gaps after every row, head and token (explicit strides). */
static size_t layout_strides(layout l, int64_t B, int64_t S, int64_t H, int64_t D, int64_t st[3])
{
    switch (l) {
    case LAYOUT_BSHD: st[2] = D, st[1] = H * D, st[0] = S * H * D; break;
    case LAYOUT_SBHD: st[2] = D, st[0] = H * D, st[1] = B * H * D; break;
    case LAYOUT_PADDED: st[2] = D + 3, st[1] = H * (D + 3) + 5, st[0] = S * st[1] + 7; break;
    }
    return (size_t)((B - 1) * st[0] + (S - 1) * st[1] + (H - 1) * st[2] + D);
}

typedef struct {
    void *buf;
    cp_dtype t;
    int64_t B, S, H, D;
    int64_t st[3];
    size_t n; /* elements in buf */
} tensor;

static size_t elem_index(const tensor *x, int64_t b, int64_t s, int64_t h, int64_t d)
{
    return (size_t)(b * x->st[0] + s * x->st[1] + h * x->st[2] + d);
}

/* A tensor holding the dense BSHD values vals (already representable in t);
 * gaps hold NaN so that reading them shows. */
static tensor make_tensor(layout l, cp_dtype t, int64_t B, int64_t S, int64_t H, int64_t D, const double *vals)
{
    tensor x = {NULL, t, B, S, H, D, {0, 0, 0}, 0};
    x.n = layout_strides(l, B, S, H, D, x.st);
    x.buf = malloc(x.n * ref_dtype_size(t));
    assert_non_null(x.buf);
    for (size_t i = 0; i < x.n; i++)
        ref_store(x.buf, t, i, NAN);
    if (vals)
        for (int64_t b = 0; b < B; b++)
            for (int64_t s = 0; s < S; s++)
                for (int64_t h = 0; h < H; h++)
                    for (int64_t d = 0; d < D; d++)
                        ref_store(x.buf, t, elem_index(&x, b, s, h, d), vals[((b * S + s) * H + h) * D + d]);
    return x;
}

/* The dense BSHD values of a tensor. */
static double *read_tensor(const tensor *x)
{
    double *v = malloc(sizeof(double) * (size_t)(x->B * x->S * x->H * x->D));
    assert_non_null(v);
    for (int64_t b = 0; b < x->B; b++)
        for (int64_t s = 0; s < x->S; s++)
            for (int64_t h = 0; h < x->H; h++)
                for (int64_t d = 0; d < x->D; d++)
                    v[((b * x->S + s) * x->H + h) * x->D + d] = ref_load(x->buf, x->t, elem_index(x, b, s, h, d));
    return v;
}

static void free_tensor(tensor *x)
{
    free(x->buf);
    x->buf = NULL;
}

static double *random_values(ref_rng *r, size_t n, cp_dtype t, double amp)
{
    double *v = malloc(sizeof(double) * (n ? n : 1));
    assert_non_null(v);
    for (size_t i = 0; i < n; i++)
        v[i] = ref_round(ref_rng_uniform(r, -amp, amp), t);
    return v;
}

static double max_abs(const double *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(x[i]));
    return m;
}

/* max |x - ref| / max(max|ref|, floor); fails on NaN. */
static double rel_err(const double *x, const double *ref, size_t n, double floor)
{
    double e = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(x[i]))
            fail_msg("NaN at element %zu (reference %g)", i, ref[i]);
        e = fmax(e, fabs(x[i] - ref[i]));
    }
    return e / fmax(max_abs(ref, n), floor);
}

/* ------------------------------------------------------------------------ */
/* One test case: shapes, types, layout, and its reference results          */
/* ------------------------------------------------------------------------ */

typedef struct {
    model_shape s;
    cp_dtype dtype, o_dtype, grad_dtype;
    layout lay;
} kcase;

typedef struct {
    kcase c;
    double *q, *k, *v, *dout;      /* inputs, exact in their types */
    double *o, *lse;               /* reference forward */
    double *dq, *dk, *dv;          /* reference backward */
    tensor tq, tk, tv, tdo;        /* the inputs in storage */
} fixture;

static cp_format format_of(layout l)
{
    return l == LAYOUT_SBHD ? CP_FORMAT_SBHD : CP_FORMAT_BSHD;
}

static void fixture_init(fixture *f, const kcase *c, uint64_t seed)
{
    memset(f, 0, sizeof *f);
    f->c = *c;
    const model_shape *s = &c->s;
    ref_rng r = {seed * 0x9E3779B97F4A7C15ULL + 1};
    f->q = random_values(&r, model_q_elems(s), c->dtype, 1.0);
    f->k = random_values(&r, model_k_elems(s), c->dtype, 1.0);
    f->v = random_values(&r, model_v_elems(s), c->dtype, 1.0);
    f->dout = random_values(&r, model_o_elems(s), c->o_dtype, 1.0);
    f->o = malloc(sizeof(double) * model_o_elems(s));
    f->lse = malloc(sizeof(double) * model_lse_elems(s));
    f->dq = malloc(sizeof(double) * model_q_elems(s));
    f->dk = malloc(sizeof(double) * model_k_elems(s));
    f->dv = malloc(sizeof(double) * model_v_elems(s));
    model_forward(s, f->q, f->k, f->v, f->o, f->lse);
    model_backward(s, f->q, f->k, f->v, f->o, f->lse, f->dout, f->dq, f->dk, f->dv);
    f->tq = make_tensor(c->lay, c->dtype, s->batch, s->seq_q, s->heads, s->head_dim, f->q);
    f->tk = make_tensor(c->lay, c->dtype, s->batch, s->seq_k, s->kv_heads, s->head_dim, f->k);
    f->tv = make_tensor(c->lay, c->dtype, s->batch, s->seq_k, s->kv_heads, s->head_dim_v, f->v);
    f->tdo = make_tensor(c->lay, c->o_dtype, s->batch, s->seq_q, s->heads, s->head_dim_v, f->dout);
}

static void fixture_free(fixture *f)
{
    free(f->q), free(f->k), free(f->v), free(f->dout), free(f->o), free(f->lse);
    free(f->dq), free(f->dk), free(f->dv);
    free_tensor(&f->tq), free_tensor(&f->tk), free_tensor(&f->tv), free_tensor(&f->tdo);
}

/* Strides are passed as 0 (derived from the format) for the dense layouts and
 * explicitly for the padded one. */
static void set_strides(const tensor *x, layout l, int64_t *sb, int64_t *ss, int64_t *sh)
{
    if (l == LAYOUT_PADDED) {
        *sb = x->st[0], *ss = x->st[1], *sh = x->st[2];
    } else {
        *sb = *ss = *sh = 0;
    }
}

static cp_kernel_attn_args base_args(const fixture *f)
{
    const kcase *c = &f->c;
    cp_kernel_attn_args a = CP_KERNEL_ATTN_ARGS_INIT;
    a.dtype = c->dtype;
    a.format = format_of(c->lay);
    a.batch = c->s.batch;
    a.num_heads = c->s.heads;
    a.num_kv_heads = c->s.kv_heads;
    a.head_dim = c->s.head_dim;
    a.head_dim_v = c->s.head_dim_v == c->s.head_dim ? 0 : c->s.head_dim_v; /* exercise the default */
    a.seq_q = c->s.seq_q;
    a.seq_k = c->s.seq_k;
    a.q_offset = c->s.q_offset;
    a.k_offset = c->s.k_offset;
    a.mask = c->s.causal ? CP_MASK_CAUSAL : CP_MASK_NONE;
    a.softmax_scale = c->s.scale == 1.0 / sqrt(c->s.head_dim) ? 0.0 : c->s.scale;
    a.q = f->tq.buf;
    set_strides(&f->tq, c->lay, &a.q_stride_b, &a.q_stride_s, &a.q_stride_h);
    a.k = f->tk.buf;
    set_strides(&f->tk, c->lay, &a.k_stride_b, &a.k_stride_s, &a.k_stride_h);
    a.v = f->tv.buf;
    set_strides(&f->tv, c->lay, &a.v_stride_b, &a.v_stride_s, &a.v_stride_h);
    a.o_dtype = c->o_dtype;
    return a;
}

static void set_o(cp_kernel_attn_args *a, const tensor *o, layout l)
{
    a->o = o->buf;
    a->o_dtype = o->t;
    set_strides(o, l, &a->o_stride_b, &a->o_stride_s, &a->o_stride_h);
}

/* LSE buffers: dense [B, H, S] floats. */
static float *new_lse(const model_shape *s, float fill)
{
    size_t n = model_lse_elems(s);
    float *l = malloc(sizeof(float) * n);
    assert_non_null(l);
    for (size_t i = 0; i < n; i++)
        l[i] = fill;
    return l;
}

static void check_lse(const float *lse, const double *ref, size_t n, const char *what)
{
    for (size_t i = 0; i < n; i++) {
        if (ref[i] == -INFINITY) {
            if (lse[i] != -INFINITY)
                fail_msg("%s: LSE[%zu] = %g, expected -inf (the row sees no key)", what, i, lse[i]);
            continue;
        }
        double err = fabs(lse[i] - ref[i]);
        if (!(err <= TOL_LSE * (1 + fabs(ref[i]))))
            fail_msg("%s: LSE[%zu] = %.9g, reference %.9g", what, i, lse[i], ref[i]);
    }
}

static void check_close(const double *x, const double *ref, size_t n, double tol, double floor, const char *what)
{
    double e = rel_err(x, ref, n, floor);
    if (getenv("TEST_VERBOSE"))
        printf("%-40s err %.3g (bound %.3g)\n", what, e, tol);
    if (!(e <= tol))
        fail_msg("%s: error %.3g exceeds the bound %.3g", what, e, tol);
}

/* Forward on every context; results must match the reference and, for one
 * ISA, be identical for every thread count. */
static void run_forward(const fixture *f)
{
    const kcase *c = &f->c;
    const model_shape *s = &c->s;
    size_t no = model_o_elems(s), nl = model_lse_elems(s);
    double *first = NULL;
    for (int i = 0; i < cs.n; i++) {
        tensor o = make_tensor(c->lay, c->o_dtype, s->batch, s->seq_q, s->heads, s->head_dim_v, NULL);
        float *lse = new_lse(s, NAN);
        cp_kernel_attn_args a = base_args(f);
        set_o(&a, &o, c->lay);
        a.lse = lse;
        cp_status st = cp_kernel_attn_forward(cs.c[i].ctx, &a);
        if (st != CP_SUCCESS)
            fail_msg("%s: cp_kernel_attn_forward: %s", cs.c[i].name, cp_last_error());
        double *got = read_tensor(&o);
        char what[96];
        snprintf(what, sizeof what, "forward O on %s", cs.c[i].name);
        check_close(got, f->o, no, tol_for(c->o_dtype, 0), 1e-30, what);
        snprintf(what, sizeof what, "forward on %s", cs.c[i].name);
        check_lse(lse, f->lse, nl, what);
        /* contexts 0..2 are one ISA with 1, 2, 3 threads */
        if (i == 0)
            first = got, got = NULL;
        else if (i < 3 && memcmp(first, got, sizeof(double) * no))
            fail_msg("forward O differs between %s and %s", cs.c[0].name, cs.c[i].name);
        free(got);
        free(lse);
        free_tensor(&o);
    }
    free(first);
}

/* The reference O rounded to type t, as the "final forward output" the
 * backward reads; and the reference LSE as floats. */
static tensor reference_o(const fixture *f, cp_dtype t)
{
    const model_shape *s = &f->c.s;
    size_t n = model_o_elems(s);
    double *r = malloc(sizeof(double) * n);
    assert_non_null(r);
    for (size_t i = 0; i < n; i++)
        r[i] = ref_round(f->o[i], t);
    tensor o = make_tensor(f->c.lay, t, s->batch, s->seq_q, s->heads, s->head_dim_v, r);
    free(r);
    return o;
}

static float *reference_lse(const fixture *f)
{
    size_t n = model_lse_elems(&f->c.s);
    float *lse = new_lse(&f->c.s, 0);
    for (size_t i = 0; i < n; i++)
        lse[i] = (float)f->lse[i];
    return lse;
}

typedef struct {
    tensor dq, dk, dv;
} grads;

static grads new_grads(const fixture *f, cp_dtype t)
{
    const model_shape *s = &f->c.s;
    layout l = f->c.lay;
    grads g = {make_tensor(l, t, s->batch, s->seq_q, s->heads, s->head_dim, NULL),
               make_tensor(l, t, s->batch, s->seq_k, s->kv_heads, s->head_dim, NULL),
               make_tensor(l, t, s->batch, s->seq_k, s->kv_heads, s->head_dim_v, NULL)};
    return g;
}

static void free_grads(grads *g)
{
    free_tensor(&g->dq), free_tensor(&g->dk), free_tensor(&g->dv);
}

/* Backward arguments over all keys of the fixture. */
static cp_kernel_attn_args backward_args(const fixture *f, const tensor *o, float *lse, grads *g)
{
    layout l = f->c.lay;
    cp_kernel_attn_args a = base_args(f);
    set_o(&a, o, l);
    a.lse = lse;
    a.dout = f->tdo.buf;
    set_strides(&f->tdo, l, &a.dout_stride_b, &a.dout_stride_s, &a.dout_stride_h);
    a.dq = g->dq.buf;
    set_strides(&g->dq, l, &a.dq_stride_b, &a.dq_stride_s, &a.dq_stride_h);
    a.dk = g->dk.buf;
    set_strides(&g->dk, l, &a.dk_stride_b, &a.dk_stride_s, &a.dk_stride_h);
    a.dv = g->dv.buf;
    set_strides(&g->dv, l, &a.dv_stride_b, &a.dv_stride_s, &a.dv_stride_h);
    a.grad_dtype = g->dq.t;
    return a;
}

static void check_grads(const fixture *f, const grads *g, double tol, const char *where)
{
    const struct {
        const tensor *t;
        const double *ref;
        const char *name;
    } outs[] = {{&g->dq, f->dq, "dQ"}, {&g->dk, f->dk, "dK"}, {&g->dv, f->dv, "dV"}};
    for (int j = 0; j < 3; j++) {
        double *got = read_tensor(outs[j].t);
        char what[128];
        snprintf(what, sizeof what, "backward %s %s", outs[j].name, where);
        check_close(got, outs[j].ref, (size_t)(outs[j].t->B * outs[j].t->S * outs[j].t->H * outs[j].t->D),
                    tol, 1e-3, what);
        free(got);
    }
}

/* Backward on every context against the reference; for each context run
 * twice and require identical bits (the result is deterministic). */
static void run_backward(const fixture *f)
{
    const kcase *c = &f->c;
    tensor o = reference_o(f, c->o_dtype);
    float *lse = reference_lse(f);
    double tol = tol_for(c->grad_dtype == CP_DTYPE_F32 ? c->o_dtype : c->grad_dtype, 1);
    for (int i = 0; i < cs.n; i++) {
        grads g[2] = {new_grads(f, c->grad_dtype), new_grads(f, c->grad_dtype)};
        for (int rep = 0; rep < 2; rep++) {
            cp_kernel_attn_args a = backward_args(f, &o, lse, &g[rep]);
            cp_status st = cp_kernel_attn_backward(cs.c[i].ctx, &a);
            if (st != CP_SUCCESS)
                fail_msg("%s: cp_kernel_attn_backward: %s", cs.c[i].name, cp_last_error());
        }
        char where[64];
        snprintf(where, sizeof where, "on %s", cs.c[i].name);
        check_grads(f, &g[0], tol, where);
        size_t es = ref_dtype_size(c->grad_dtype);
        if (memcmp(g[0].dq.buf, g[1].dq.buf, g[0].dq.n * es) || memcmp(g[0].dk.buf, g[1].dk.buf, g[0].dk.n * es) ||
            memcmp(g[0].dv.buf, g[1].dv.buf, g[0].dv.n * es))
            fail_msg("backward on %s gave different bits in two identical calls", cs.c[i].name);
        free_grads(&g[0]), free_grads(&g[1]);
    }
    free(lse);
    free_tensor(&o);
}

static kcase make_case(int64_t B, int64_t Sq, int64_t Sk, int H, int Hkv, int D, int Dv, int64_t qoff,
                       int64_t koff, int causal, cp_dtype t, layout lay)
{
    kcase c;
    memset(&c, 0, sizeof c);
    c.s.batch = B, c.s.seq_q = Sq, c.s.seq_k = Sk, c.s.heads = H, c.s.kv_heads = Hkv;
    c.s.head_dim = D, c.s.head_dim_v = Dv, c.s.q_offset = qoff, c.s.k_offset = koff, c.s.causal = causal;
    c.s.scale = 1.0 / sqrt((double)D);
    c.dtype = c.o_dtype = c.grad_dtype = t;
    c.lay = lay;
    return c;
}

static void run_case(const kcase *c, uint64_t seed)
{
    fixture f;
    fixture_init(&f, c, seed);
    run_forward(&f);
    run_backward(&f);
    fixture_free(&f);
}

/* ------------------------------------------------------------------------ */
/* Tests                                                                    */
/* ------------------------------------------------------------------------ */

/* Hand-picked shapes: odd lengths, MHA and GQA, both masks, all dtypes,
 * blocks fully visible, partly visible and fully hidden, D != Dv, layouts. */
static void test_shapes(void **state)
{
    (void)state;
    const cp_dtype types[] = {CP_DTYPE_F32, CP_DTYPE_BF16, CP_DTYPE_F16};
    for (int ti = 0; ti < 3; ti++) {
        cp_dtype t = types[ti];
        kcase cases[] = {
            make_case(1, 7, 7, 2, 2, 16, 16, 0, 0, 1, t, LAYOUT_BSHD),      /* diagonal block */
            make_case(2, 129, 129, 4, 1, 32, 32, 0, 0, 1, t, LAYOUT_BSHD),  /* GQA, one kv head */
            make_case(1, 1, 129, 4, 2, 24, 40, 128, 0, 1, t, LAYOUT_SBHD),  /* one query, D != Dv */
            make_case(1, 129, 7, 4, 4, 20, 20, 0, 200, 1, t, LAYOUT_BSHD),  /* fully hidden */
            make_case(1, 33, 64, 4, 2, 8, 8, 100, 0, 1, t, LAYOUT_PADDED),  /* fully visible */
            make_case(2, 129, 100, 4, 2, 16, 24, 50, 20, 1, t, LAYOUT_BSHD), /* partly visible */
            make_case(1, 45, 129, 4, 4, 16, 16, 0, 0, 0, t, LAYOUT_SBHD),   /* no mask */
            make_case(1, 100, 30, 8, 2, 12, 12, 0, 0, 0, t, LAYOUT_PADDED), /* no mask, GQA 4:1 */
            make_case(1, 300, 300, 2, 1, 8, 8, 0, 0, 1, t, LAYOUT_BSHD),    /* many tiles */
            make_case(1, 260, 290, 2, 2, 8, 4, 40, 0, 0, t, LAYOUT_SBHD),   /* many tiles, no mask */
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            run_case(&cases[i], 1000 + 10 * (uint64_t)ti + i);
    }
}

/* Random shapes and offsets, mixed result types. */
static void test_random(void **state)
{
    (void)state;
    ref_rng r = {42};
    const int kv_choices[] = {1, 2, 4};
    const cp_dtype types[] = {CP_DTYPE_F32, CP_DTYPE_BF16, CP_DTYPE_F16};
    for (int it = 0; it < 12; it++) {
        int hkv = kv_choices[ref_rng_int(&r, 0, 2)];
        int H = hkv * (int)ref_rng_int(&r, 1, 2);
        int D = (int)ref_rng_int(&r, 1, 40), Dv = ref_rng_int(&r, 0, 1) ? D : (int)ref_rng_int(&r, 1, 40);
        int64_t Sq = ref_rng_int(&r, 1, 140), Sk = ref_rng_int(&r, 1, 140);
        cp_dtype t = types[it % 3];
        kcase c = make_case(ref_rng_int(&r, 1, 2), Sq, Sk, H, hkv, D, Dv, ref_rng_int(&r, 0, 150),
                            ref_rng_int(&r, 0, 150), (int)ref_rng_int(&r, 0, 1), t, (layout)(it % 3));
        c.s.scale = ref_rng_uniform(&r, -0.6, 0.6); /* any scale, negative included */
        if (t != CP_DTYPE_F32 && ref_rng_int(&r, 0, 1))
            c.o_dtype = CP_DTYPE_F32;
        if (t != CP_DTYPE_F32 && ref_rng_int(&r, 0, 1))
            c.grad_dtype = CP_DTYPE_F32;
        run_case(&c, 7000 + (uint64_t)it);
    }
}

/* Pointer to element (b, s, 0, 0) of a tensor. */
static void *tensor_at(const tensor *x, int64_t b, int64_t s)
{
    return (char *)x->buf + elem_index(x, b, s, 0, 0) * ref_dtype_size(x->t);
}

/* Restrict arguments to keys [j0, j1) of the fixture: K, V (and dK, dV when
 * g is given) point into the full tensors, with explicit strides. */
static void restrict_keys(cp_kernel_attn_args *a, const fixture *f, int64_t j0, int64_t j1, grads *g)
{
    a->seq_k = j1 - j0;
    a->k_offset = f->c.s.k_offset + j0;
    a->k = tensor_at(&f->tk, 0, j0);
    a->k_stride_b = f->tk.st[0], a->k_stride_s = f->tk.st[1], a->k_stride_h = f->tk.st[2];
    a->v = tensor_at(&f->tv, 0, j0);
    a->v_stride_b = f->tv.st[0], a->v_stride_s = f->tv.st[1], a->v_stride_h = f->tv.st[2];
    if (g) {
        a->dk = tensor_at(&g->dk, 0, j0);
        a->dk_stride_b = g->dk.st[0], a->dk_stride_s = g->dk.st[1], a->dk_stride_h = g->dk.st[2];
        a->dv = tensor_at(&g->dv, 0, j0);
        a->dv_stride_b = g->dv.st[0], a->dv_stride_s = g->dv.st[1], a->dv_stride_h = g->dv.st[2];
    }
}

static void forward_ok(cp_context *ctx, const cp_kernel_attn_args *a)
{
    if (cp_kernel_attn_forward(ctx, a) != CP_SUCCESS)
        fail_msg("cp_kernel_attn_forward: %s", cp_last_error());
}

static void backward_ok(cp_context *ctx, const cp_kernel_attn_args *a)
{
    if (cp_kernel_attn_backward(ctx, a) != CP_SUCCESS)
        fail_msg("cp_kernel_attn_backward: %s", cp_last_error());
}

static void merge_ok(cp_context *ctx, const cp_kernel_merge_args *a)
{
    if (cp_kernel_merge(ctx, a) != CP_SUCCESS)
        fail_msg("cp_kernel_merge: %s", cp_last_error());
}

/* Fill a tensor's elements (not its gaps) with one value. */
static void fill_tensor(tensor *x, double v)
{
    for (int64_t b = 0; b < x->B; b++)
        for (int64_t s = 0; s < x->S; s++)
            for (int64_t h = 0; h < x->H; h++)
                for (int64_t d = 0; d < x->D; d++)
                    ref_store(x->buf, x->t, elem_index(x, b, s, h, d), v);
}

/* Splitting the keys into blocks and accumulating them (in any order, from a
 * first block or from an empty result) equals one call over all keys. */
static void test_forward_accumulate(void **state)
{
    (void)state;
    kcase cases[] = {
        make_case(2, 70, 150, 4, 2, 16, 16, 100, 0, 1, CP_DTYPE_BF16, LAYOUT_BSHD),
        make_case(1, 40, 90, 2, 1, 8, 12, 0, 0, 0, CP_DTYPE_F32, LAYOUT_SBHD),
        make_case(1, 33, 300, 3, 3, 8, 8, 200, 0, 1, CP_DTYPE_F16, LAYOUT_PADDED),
    };
    const int64_t cuts[][4] = {{0, 50, 120, 150}, {0, 1, 60, 90}, {0, 100, 199, 300}};
    const int orders[][3] = {{0, 1, 2}, {2, 0, 1}, {1, 2, 0}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        fixture f;
        fixture_init(&f, &cases[ci], 300 + ci);
        const model_shape *s = &f.c.s;
        for (int xi = 0; xi < cs.n; xi += 2) {
            for (int oi = 0; oi < 4; oi++) {
                /* orders 0..2 start with a plain call; order 3 accumulates
                 * every block into an empty result (O = 0, LSE = -inf) */
                const int *ord = orders[oi % 3];
                tensor o = make_tensor(f.c.lay, CP_DTYPE_F32, s->batch, s->seq_q, s->heads, s->head_dim_v, NULL);
                float *lse = new_lse(s, oi == 3 ? -INFINITY : NAN);
                if (oi == 3)
                    fill_tensor(&o, 0);
                for (int n = 0; n < 3; n++) {
                    cp_kernel_attn_args a = base_args(&f);
                    restrict_keys(&a, &f, cuts[ci][ord[n]], cuts[ci][ord[n] + 1], NULL);
                    set_o(&a, &o, f.c.lay);
                    a.lse = lse;
                    a.accumulate = oi == 3 || n > 0;
                    forward_ok(cs.c[xi].ctx, &a);
                }
                double *got = read_tensor(&o);
                char what[96];
                snprintf(what, sizeof what, "accumulated O (case %zu, order %d, %s)", ci, oi, cs.c[xi].name);
                check_close(got, f.o, model_o_elems(s), TOL_F32, 1e-30, what);
                check_lse(lse, f.lse, model_lse_elems(s), what);
                free(got);
                free(lse);
                free_tensor(&o);
            }
        }
        fixture_free(&f);
    }
}

/* Blocks and rows that see no key: O = 0 and LSE = -inf exactly, zero
 * gradients, and accumulating or merging them changes nothing, bit for bit. */
static void test_hidden_blocks(void **state)
{
    (void)state;
    /* queries at positions 10..29, keys at 0..29 */
    kcase c = make_case(1, 20, 30, 2, 1, 8, 8, 10, 0, 1, CP_DTYPE_F32, LAYOUT_BSHD);
    fixture f;
    fixture_init(&f, &c, 77);
    const model_shape *s = &c.s;
    size_t no = model_o_elems(s), nl = model_lse_elems(s);
    for (int xi = 0; xi < cs.n; xi++) {
        cp_context *ctx = cs.c[xi].ctx;
        tensor o = make_tensor(c.lay, CP_DTYPE_F32, s->batch, s->seq_q, s->heads, s->head_dim_v, NULL);
        float *lse = new_lse(s, NAN);
        cp_kernel_attn_args a = base_args(&f);
        set_o(&a, &o, c.lay);
        a.lse = lse;

        /* keys moved beyond every query: nothing is visible */
        a.k_offset = 1000;
        forward_ok(ctx, &a);
        for (size_t i = 0; i < no; i++)
            assert_true(((float *)o.buf)[i] == 0.0f && !signbit(((float *)o.buf)[i]));
        for (size_t i = 0; i < nl; i++)
            assert_true(lse[i] == -INFINITY);

        /* a real partial result over keys 0..9 (visible to every query) */
        restrict_keys(&a, &f, 0, 10, NULL);
        forward_ok(ctx, &a);
        float *o_before = malloc(no * sizeof(float)), *lse_before = malloc(nl * sizeof(float));
        memcpy(o_before, o.buf, no * sizeof(float));
        memcpy(lse_before, lse, nl * sizeof(float));

        /* accumulating a fully hidden block: no bit changes */
        a.accumulate = 1;
        a.k_offset = 1000;
        forward_ok(ctx, &a);
        assert_memory_equal(o.buf, o_before, no * sizeof(float));
        assert_memory_equal(lse, lse_before, nl * sizeof(float));

        /* keys 25..29: queries 0..14 (positions < 25) see none of them and
         * keep their bits; the others change */
        restrict_keys(&a, &f, 25, 30, NULL);
        forward_ok(ctx, &a);
        for (int h = 0; h < s->heads; h++)
            for (int64_t i = 0; i < s->seq_q; i++) {
                size_t row = (size_t)((i * s->heads + h) * s->head_dim_v), li = (size_t)(h * s->seq_q + i);
                int same = !memcmp((float *)o.buf + row, o_before + row, sizeof(float) * (size_t)s->head_dim_v) &&
                           lse[li] == lse_before[li];
                if (same != (s->q_offset + i < 25))
                    fail_msg("%s: row %lld head %d %s", cs.c[xi].name, (long long)i, h,
                             same ? "did not change" : "changed although it sees no key");
            }

        /* merging a part with LSE -inf (and garbage in its O): no bit changes */
        memcpy(o_before, o.buf, no * sizeof(float));
        memcpy(lse_before, lse, nl * sizeof(float));
        float *part = malloc(no * sizeof(float)), *lse_part = new_lse(s, -INFINITY);
        for (size_t i = 0; i < no; i++)
            part[i] = NAN;
        cp_kernel_merge_args m = CP_KERNEL_MERGE_ARGS_INIT;
        m.format = CP_FORMAT_BSHD;
        m.batch = s->batch, m.seq = s->seq_q, m.num_heads = s->heads, m.head_dim_v = s->head_dim_v;
        m.o = o.buf, m.o_dtype = CP_DTYPE_F32, m.lse = lse;
        m.o_part = part, m.o_part_dtype = CP_DTYPE_F32, m.lse_part = lse_part;
        merge_ok(ctx, &m);
        assert_memory_equal(o.buf, o_before, no * sizeof(float));
        assert_memory_equal(lse, lse_before, nl * sizeof(float));

        /* merging into an empty result gives the part exactly */
        m.o = part, m.lse = lse_part, m.o_part = o.buf, m.lse_part = lse;
        merge_ok(ctx, &m);
        assert_memory_equal(part, o.buf, no * sizeof(float));
        assert_memory_equal(lse_part, lse, nl * sizeof(float));

        /* backward over hidden keys: exact zeros; accumulating them: no change */
        grads g = new_grads(&f, CP_DTYPE_F32);
        tensor of = reference_o(&f, CP_DTYPE_F32);
        float *lf = reference_lse(&f);
        cp_kernel_attn_args b = backward_args(&f, &of, lf, &g);
        b.k_offset = 1000;
        backward_ok(ctx, &b);
        double *dq = read_tensor(&g.dq), *dk = read_tensor(&g.dk), *dv = read_tensor(&g.dv);
        for (size_t i = 0; i < model_q_elems(s); i++)
            assert_true(dq[i] == 0);
        for (size_t i = 0; i < model_k_elems(s); i++)
            assert_true(dk[i] == 0);
        for (size_t i = 0; i < model_v_elems(s); i++)
            assert_true(dv[i] == 0);
        free(dq), free(dk), free(dv);
        fill_tensor(&g.dq, 1.5), fill_tensor(&g.dk, -2.5), fill_tensor(&g.dv, 3.5);
        b.grad_accumulate = 1;
        backward_ok(ctx, &b);
        dq = read_tensor(&g.dq), dk = read_tensor(&g.dk), dv = read_tensor(&g.dv);
        for (size_t i = 0; i < model_q_elems(s); i++)
            assert_true(dq[i] == 1.5);
        for (size_t i = 0; i < model_k_elems(s); i++)
            assert_true(dk[i] == -2.5);
        for (size_t i = 0; i < model_v_elems(s); i++)
            assert_true(dv[i] == 3.5);
        free(dq), free(dk), free(dv);
        free(lf);
        free_tensor(&of);
        free_grads(&g);

        free(part), free(lse_part), free(o_before), free(lse_before), free(lse);
        free_tensor(&o);
    }
    fixture_free(&f);
}

/* Partial results of key blocks, in various types and layouts, merged with
 * cp_kernel_merge equal attention over all keys. */
static void test_merge(void **state)
{
    (void)state;
    kcase c = make_case(2, 33, 100, 3, 3, 8, 16, 60, 0, 1, CP_DTYPE_BF16, LAYOUT_SBHD);
    fixture f;
    fixture_init(&f, &c, 5);
    const model_shape *s = &c.s;
    const int64_t cuts[] = {0, 30, 75, 100};
    const cp_dtype part_t[] = {CP_DTYPE_F32, CP_DTYPE_BF16, CP_DTYPE_F32};
    for (int xi = 0; xi < cs.n; xi += 2) {
        cp_context *ctx = cs.c[xi].ctx;
        /* the result lives in a padded layout with explicit strides */
        tensor o = make_tensor(LAYOUT_PADDED, CP_DTYPE_F32, s->batch, s->seq_q, s->heads, s->head_dim_v, NULL);
        fill_tensor(&o, 0);
        float *lse = new_lse(s, -INFINITY);
        for (int n = 0; n < 3; n++) {
            tensor part = make_tensor(LAYOUT_SBHD, part_t[n], s->batch, s->seq_q, s->heads, s->head_dim_v, NULL);
            float *lse_part = new_lse(s, NAN);
            cp_kernel_attn_args a = base_args(&f);
            restrict_keys(&a, &f, cuts[n], cuts[n + 1], NULL);
            set_o(&a, &part, LAYOUT_SBHD);
            a.lse = lse_part;
            forward_ok(ctx, &a);
            cp_kernel_merge_args m = CP_KERNEL_MERGE_ARGS_INIT;
            m.format = CP_FORMAT_SBHD; /* derives o_part's zero strides */
            m.batch = s->batch, m.seq = s->seq_q, m.num_heads = s->heads, m.head_dim_v = s->head_dim_v;
            m.o = o.buf, m.o_dtype = CP_DTYPE_F32, m.lse = lse;
            m.o_stride_b = o.st[0], m.o_stride_s = o.st[1], m.o_stride_h = o.st[2];
            m.o_part = part.buf, m.o_part_dtype = part_t[n], m.lse_part = lse_part;
            merge_ok(ctx, &m);
            free(lse_part);
            free_tensor(&part);
        }
        double *got = read_tensor(&o);
        /* one part went through BF16: one rounding of its share */
        check_close(got, f.o, model_o_elems(s), tol_for(CP_DTYPE_BF16, 0), 1e-30, "merged O");
        check_lse(lse, f.lse, model_lse_elems(s), "merged");
        free(got);
        free(lse);
        free_tensor(&o);
    }
    fixture_free(&f);
}

/* The backward's key-split cases, each over three key blocks: causal GQA
 * with D != Dv (F32), and an unmasked BF16 one in the padded layout with a
 * block of one key. Gradients in F32. */
#define SPLIT_CASES 2
static const int64_t split_cuts[SPLIT_CASES][4] = {{0, 40, 100, 120}, {0, 30, 31, 77}};

static kcase split_case(size_t i)
{
    kcase c = i == 0 ? make_case(1, 50, 120, 4, 2, 16, 8, 70, 0, 1, CP_DTYPE_F32, LAYOUT_BSHD)
                     : make_case(2, 31, 77, 2, 1, 8, 8, 0, 0, 0, CP_DTYPE_BF16, LAYOUT_PADDED);
    c.grad_dtype = CP_DTYPE_F32;
    return c;
}

/* Split case ci with its inputs from seed, and the reference output and LSE
 * that its backward takes. */
static void split_fixture(size_t ci, uint64_t seed, fixture *f, tensor *o, float **lse)
{
    const kcase c = split_case(ci);
    fixture_init(f, &c, seed);
    *o = reference_o(f, f->c.o_dtype);
    *lse = reference_lse(f);
}

/* The backward of split case ci over its three key blocks, added into g.
 * With drow, the first call stores rowsum(dO * O) there and the others
 * read it. */
static void backward_over_cuts(cp_context *ctx, const fixture *f, const tensor *o, float *lse, grads *g, size_t ci,
                               float *drow)
{
    for (int n = 0; n < 3; n++) {
        cp_kernel_attn_args a = backward_args(f, o, lse, g);
        restrict_keys(&a, f, split_cuts[ci][n], split_cuts[ci][n + 1], g);
        a.grad_accumulate = 1;
        a.drow = drow;
        a.drow_ready = drow && n > 0;
        backward_ok(ctx, &a);
    }
}

/* Backward over key blocks, adding into dQ (and into slices of dK, dV), equals
 * one call; adding into existing values adds exactly the gradient. */
static void test_backward_accumulate(void **state)
{
    (void)state;
    for (size_t ci = 0; ci < SPLIT_CASES; ci++) {
        fixture f;
        tensor o;
        float *lse;
        split_fixture(ci, 40 + ci, &f, &o, &lse);
        const model_shape *s = &f.c.s;
        double tol = tol_for(f.c.o_dtype, 1);
        for (int xi = 0; xi < cs.n; xi += 2) {
            cp_context *ctx = cs.c[xi].ctx;
            grads g = new_grads(&f, CP_DTYPE_F32);
            fill_tensor(&g.dq, 0), fill_tensor(&g.dk, 0), fill_tensor(&g.dv, 0);
            backward_over_cuts(ctx, &f, &o, lse, &g, ci, NULL);
            char where[64];
            snprintf(where, sizeof where, "over key blocks on %s", cs.c[xi].name);
            check_grads(&f, &g, tol, where);

            /* existing values X: X + gradient */
            fill_tensor(&g.dq, 0.25), fill_tensor(&g.dk, -0.5), fill_tensor(&g.dv, 1.0);
            cp_kernel_attn_args a = backward_args(&f, &o, lse, &g);
            a.grad_accumulate = 1;
            backward_ok(ctx, &a);
            fixture shifted = f;
            size_t nq = model_q_elems(s), nk = model_k_elems(s), nv = model_v_elems(s);
            shifted.dq = malloc(sizeof(double) * nq), shifted.dk = malloc(sizeof(double) * nk);
            shifted.dv = malloc(sizeof(double) * nv);
            for (size_t i = 0; i < nq; i++)
                shifted.dq[i] = f.dq[i] + 0.25;
            for (size_t i = 0; i < nk; i++)
                shifted.dk[i] = f.dk[i] - 0.5;
            for (size_t i = 0; i < nv; i++)
                shifted.dv[i] = f.dv[i] + 1.0;
            snprintf(where, sizeof where, "added to existing values on %s", cs.c[xi].name);
            check_grads(&shifted, &g, tol, where);
            free(shifted.dq), free(shifted.dk), free(shifted.dv);
            free_grads(&g);
        }
        free(lse);
        free_tensor(&o);
        fixture_free(&f);
    }
}

/* rowsum(dO * O) reused across key blocks (cp_kernel_attn_args.drow): the
 * first call stores it (laid out like lse), later calls read it, and the
 * gradients come out bit for bit as when every call computes its own. The
 * stored values match the FP64 rowsum of the inputs as stored, and a call
 * that reads really uses them (shifted values change dQ). */
static void test_backward_drow(void **state)
{
    (void)state;
    for (size_t ci = 0; ci < SPLIT_CASES; ci++) {
        fixture f;
        tensor o;
        float *lse;
        split_fixture(ci, 60 + ci, &f, &o, &lse);
        const model_shape *s = &f.c.s;
        const size_t nrows = model_lse_elems(s);
        /* the FP64 rowsum of dO and O as the kernels read them */
        double *ref = calloc(nrows, sizeof(double)), *ov = read_tensor(&o), *dov = read_tensor(&f.tdo);
        assert_non_null(ref);
        for (int64_t b = 0; b < s->batch; b++)
            for (int h = 0; h < s->heads; h++)
                for (int64_t i = 0; i < s->seq_q; i++) {
                    size_t e = (((size_t)b * (size_t)s->seq_q + (size_t)i) * (size_t)s->heads + (size_t)h) *
                               (size_t)s->head_dim_v;
                    double acc = 0;
                    for (int d = 0; d < s->head_dim_v; d++)
                        acc += dov[e + (size_t)d] * ov[e + (size_t)d];
                    ref[((size_t)b * (size_t)s->heads + (size_t)h) * (size_t)s->seq_q + (size_t)i] = acc;
                }
        for (int xi = 0; xi < cs.n; xi++) {
            cp_context *ctx = cs.c[xi].ctx;
            grads plain = new_grads(&f, CP_DTYPE_F32), reuse = new_grads(&f, CP_DTYPE_F32);
            float *drow = new_lse(s, NAN);
            fill_tensor(&plain.dq, 0), fill_tensor(&plain.dk, 0), fill_tensor(&plain.dv, 0);
            fill_tensor(&reuse.dq, 0), fill_tensor(&reuse.dk, 0), fill_tensor(&reuse.dv, 0);
            backward_over_cuts(ctx, &f, &o, lse, &plain, ci, NULL);
            backward_over_cuts(ctx, &f, &o, lse, &reuse, ci, drow);
            /* whole buffers, as in run_backward: the gaps hold the same NaN in both */
            if (memcmp(plain.dq.buf, reuse.dq.buf, plain.dq.n * sizeof(float)) ||
                memcmp(plain.dk.buf, reuse.dk.buf, plain.dk.n * sizeof(float)) ||
                memcmp(plain.dv.buf, reuse.dv.buf, plain.dv.n * sizeof(float)))
                fail_msg("case %zu on %s: gradients with the stored rowsum differ from computing it per call", ci,
                         cs.c[xi].name);
            for (size_t r = 0; r < nrows; r++)
                if (!(fabs(drow[r] - ref[r]) <= 1e-5 * (1 + fabs(ref[r]))))
                    fail_msg("case %zu on %s: stored rowsum[%zu] = %.9g, FP64 %.9g", ci, cs.c[xi].name, r,
                             (double)drow[r], ref[r]);
            /* a reading call uses what it is given */
            for (size_t r = 0; r < nrows; r++)
                drow[r] += 1.0f;
            fill_tensor(&reuse.dq, 0), fill_tensor(&reuse.dk, 0), fill_tensor(&reuse.dv, 0);
            cp_kernel_attn_args a = backward_args(&f, &o, lse, &reuse);
            a.drow = drow;
            a.drow_ready = 1;
            backward_ok(ctx, &a);
            double *got = read_tensor(&reuse.dq);
            double e = rel_err(got, f.dq, model_q_elems(s), 1e-3);
            if (!(e > 10 * tol_for(f.c.o_dtype, 1)))
                fail_msg("case %zu on %s: dQ from a shifted rowsum is within %.3g of the true one", ci,
                         cs.c[xi].name, e);
            free(got);
            free(drow);
            free_grads(&plain);
            free_grads(&reuse);
        }
        free(ref), free(ov), free(dov);
        free(lse);
        free_tensor(&o);
        fixture_free(&f);
    }
}

/* The reference's own backward against central differences of its loss
 * sum(dO * O), in F64 on tiny shapes (with a row that sees no key). */
static void test_reference_gradient(void **state)
{
    (void)state;
    model_shape shapes[] = {
        {1, 3, 5, 2, 1, 3, 2, 2, 0, 1, 0.7},  /* causal, GQA 2:1, D != Dv */
        {2, 2, 3, 2, 2, 2, 3, 0, 0, 0, -1.3}, /* no mask, negative scale */
        {1, 3, 3, 1, 1, 2, 2, 0, 1, 1, 0.5},  /* query 0 sees no key */
    };
    ref_rng r = {99};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const model_shape *s = &shapes[si];
        size_t nq = model_q_elems(s), nk = model_k_elems(s), nv = model_v_elems(s),
               no = model_o_elems(s);
        double *q = random_values(&r, nq, CP_DTYPE_F64, 1.0), *k = random_values(&r, nk, CP_DTYPE_F64, 1.0),
               *v = random_values(&r, nv, CP_DTYPE_F64, 1.0), *dout = random_values(&r, no, CP_DTYPE_F64, 1.0);
        double *dq = malloc(sizeof(double) * nq), *dk = malloc(sizeof(double) * nk),
               *dv = malloc(sizeof(double) * nv), *o = malloc(sizeof(double) * no),
               *lse = malloc(sizeof(double) * model_lse_elems(s));
        model_forward(s, q, k, v, o, lse);
        model_backward(s, q, k, v, o, lse, dout, dq, dk, dv);
        struct {
            double *x, *g;
            size_t n;
        } vars[] = {{q, dq, nq}, {k, dk, nk}, {v, dv, nv}};
        const double h = 1e-5;
        for (int vi = 0; vi < 3; vi++)
            for (size_t i = 0; i < vars[vi].n; i++) {
                double x0 = vars[vi].x[i];
                vars[vi].x[i] = x0 + h;
                double lp = model_loss(s, q, k, v, dout);
                vars[vi].x[i] = x0 - h;
                double lm = model_loss(s, q, k, v, dout);
                vars[vi].x[i] = x0;
                double fd = (lp - lm) / (2 * h);
                /* central differences: error O(h^2) ~ 1e-10 plus 1e-16 / h */
                if (fabs(fd - vars[vi].g[i]) > 1e-8 * (1 + fabs(fd)))
                    fail_msg("shape %zu, %s[%zu]: analytic %.12g, finite difference %.12g", si,
                             vi == 0 ? "q" : vi == 1 ? "k" : "v", i, vars[vi].g[i], fd);
            }
        if (si == 2) /* query 0 sees no key: its gradient is exactly 0 */
            for (int d = 0; d < s->head_dim; d++)
                assert_true(dq[d] == 0);
        free(q), free(k), free(v), free(dout), free(dq), free(dk), free(dv), free(o), free(lse);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_gradient),
        cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_random),
        cmocka_unit_test(test_forward_accumulate),
        cmocka_unit_test(test_hidden_blocks),
        cmocka_unit_test(test_merge),
        cmocka_unit_test(test_backward_accumulate),
        cmocka_unit_test(test_backward_drow),
    };
    return cmocka_run_group_tests(tests, setup_contexts, teardown_contexts);
}
