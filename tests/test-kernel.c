/* SPDX-License-Identifier: MIT */
/*
 * The single-device kernels (cp_kernel_attn_forward / _backward / _merge /
 * _workspace_size) against the FP64 reference of ref_attn.c.
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
 *  - F32 results: a score is a length-D fp32 dot product (error <= D u
 *    sum|q||k| * scale), exponentials are 2^x to < 2e-7, the row sum and
 *    P V add up to Sk terms (error <= Sk u), and the backward chains three
 *    such products. With D <= 64, Sk <= 300 and inputs in [-1, 1) that is a
 *    few 1e-5 at worst; TOL_F32 = 1e-4 leaves margin without hiding a wrong
 *    mask, scale or head mapping (those give errors of order 1e-1).
 *  - 16-bit results: the kernel rounds each output once to the type (unit
 *    roundoff 2^-8 for BF16, 2^-11 for F16, relative to the element, hence at
 *    most that times the tensor's scale), on top of the fp32 error. In the
 *    backward with a 16-bit O the kernel's D = rowsum(dO * O) sees the rounded
 *    O (as every implementation does), which adds about Dv * 2^-8 * |dO||O|
 *    relative to the terms it cancels with; the bounds are 1.5x the rounding
 *    unit for the forward and 4x for the backward.
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

#include "ref_attn.h"
#include "testutil.h"

#define TOL_F32 1e-4
#define TOL_LSE 1e-4

static double tol_for(cp_dtype t, int backward)
{
    switch (t) {
    case CP_DTYPE_BF16: return (backward ? 4.0 : 1.5) * 0x1p-8 + TOL_F32;
    case CP_DTYPE_F16: return (backward ? 4.0 : 1.5) * 0x1p-11 + TOL_F32;
    default: return TOL_F32;
    }
}

/* ------------------------------------------------------------------------ */
/* Contexts: every ISA this machine has, several thread counts              */
/* ------------------------------------------------------------------------ */

#define MAX_CTX 8
static struct {
    cp_context *ctx;
    char name[32];
    const char *isa; /* NULL = the library's choice */
    int threads;
} ctxs[MAX_CTX];
static int nctx;

static cp_context *open_ctx(const char *isa, int threads)
{
    if (isa)
        setenv("INFINICP_CPU_ISA", isa, 1);
    else
        unsetenv("INFINICP_CPU_ISA");
    cp_context_config cfg = CP_CONTEXT_CONFIG_INIT;
    cfg.num_threads = threads;
    cp_context *ctx = NULL;
    cp_status s = cp_context_create(&cfg, &ctx);
    unsetenv("INFINICP_CPU_ISA");
    if (s == CP_ERROR_UNSUPPORTED && isa)
        return NULL; /* this processor lacks the ISA */
    assert_int_equal(s, CP_SUCCESS);
    return ctx;
}

static void add_ctx(const char *isa, int threads)
{
    cp_context *c = open_ctx(isa, threads);
    if (!c)
        return;
    ctxs[nctx].ctx = c;
    ctxs[nctx].isa = isa;
    ctxs[nctx].threads = threads;
    snprintf(ctxs[nctx].name, sizeof ctxs[nctx].name, "%s/%dt", isa ? isa : "default", threads);
    nctx++;
}

static int setup_contexts(void **state)
{
    (void)state;
    add_ctx(NULL, 1);
    add_ctx(NULL, 2);
    add_ctx(NULL, 3);
    add_ctx("avx512", 2);
    add_ctx("avx2", 2);
    add_ctx("generic", 2);
    return 0;
}

static int teardown_contexts(void **state)
{
    (void)state;
    for (int i = 0; i < nctx; i++)
        cp_context_destroy(ctxs[i].ctx);
    nctx = 0;
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
    ref_attn_shape s;
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
    const ref_attn_shape *s = &c->s;
    ref_rng r = {seed * 0x9E3779B97F4A7C15ULL + 1};
    f->q = random_values(&r, ref_attn_q_elems(s), c->dtype, 1.0);
    f->k = random_values(&r, ref_attn_k_elems(s), c->dtype, 1.0);
    f->v = random_values(&r, ref_attn_v_elems(s), c->dtype, 1.0);
    f->dout = random_values(&r, ref_attn_o_elems(s), c->o_dtype, 1.0);
    f->o = malloc(sizeof(double) * ref_attn_o_elems(s));
    f->lse = malloc(sizeof(double) * ref_attn_lse_elems(s));
    f->dq = malloc(sizeof(double) * ref_attn_q_elems(s));
    f->dk = malloc(sizeof(double) * ref_attn_k_elems(s));
    f->dv = malloc(sizeof(double) * ref_attn_v_elems(s));
    ref_attn_forward(s, f->q, f->k, f->v, f->o, f->lse);
    ref_attn_backward(s, f->q, f->k, f->v, f->dout, f->dq, f->dk, f->dv);
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
static float *new_lse(const ref_attn_shape *s, float fill)
{
    size_t n = ref_attn_lse_elems(s);
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
    const ref_attn_shape *s = &c->s;
    size_t no = ref_attn_o_elems(s), nl = ref_attn_lse_elems(s);
    double *first = NULL;
    for (int i = 0; i < nctx; i++) {
        tensor o = make_tensor(c->lay, c->o_dtype, s->batch, s->seq_q, s->heads, s->head_dim_v, NULL);
        float *lse = new_lse(s, NAN);
        cp_kernel_attn_args a = base_args(f);
        set_o(&a, &o, c->lay);
        a.lse = lse;
        cp_status st = cp_kernel_attn_forward(ctxs[i].ctx, &a);
        if (st != CP_SUCCESS)
            fail_msg("%s: cp_kernel_attn_forward: %s", ctxs[i].name, cp_last_error());
        double *got = read_tensor(&o);
        char what[96];
        snprintf(what, sizeof what, "forward O on %s", ctxs[i].name);
        check_close(got, f->o, no, tol_for(c->o_dtype, 0), 1e-30, what);
        snprintf(what, sizeof what, "forward on %s", ctxs[i].name);
        check_lse(lse, f->lse, nl, what);
        /* contexts 0..2 are one ISA with 1, 2, 3 threads */
        if (i == 0)
            first = got, got = NULL;
        else if (i < 3 && memcmp(first, got, sizeof(double) * no))
            fail_msg("forward O differs between %s and %s", ctxs[0].name, ctxs[i].name);
        free(got);
        free(lse);
        free_tensor(&o);
    }
    free(first);
}

static void run_backward(const fixture *f)
{
    const kcase *c = &f->c;
    const ref_attn_shape *s = &c->s;
    /* the kernel gets the reference O and LSE as the "final" forward results */
    tensor o = make_tensor(c->lay, c->o_dtype, s->batch, s->seq_q, s->heads, s->head_dim_v, NULL);
    for (int64_t b = 0; b < s->batch; b++)
        for (int64_t i = 0; i < s->seq_q; i++)
            for (int h = 0; h < s->heads; h++)
                for (int e = 0; e < s->head_dim_v; e++)
                    ref_store(o.buf, o.t, elem_index(&o, b, i, h, e),
                              ref_round(f->o[((b * s->seq_q + i) * s->heads + h) * s->head_dim_v + e], o.t));
    size_t nl = ref_attn_lse_elems(s);
    float *lse = new_lse(s, 0);
    for (size_t i = 0; i < nl; i++)
        lse[i] = (float)f->lse[i];
    for (int i = 0; i < nctx; i++) {
        tensor dq = make_tensor(c->lay, c->grad_dtype, s->batch, s->seq_q, s->heads, s->head_dim, NULL);
        tensor dk = make_tensor(c->lay, c->grad_dtype, s->batch, s->seq_k, s->kv_heads, s->head_dim, NULL);
        tensor dv = make_tensor(c->lay, c->grad_dtype, s->batch, s->seq_k, s->kv_heads, s->head_dim_v, NULL);
        cp_kernel_attn_args a = base_args(f);
        set_o(&a, &o, c->lay);
        a.lse = lse;
        a.dout = f->tdo.buf;
        set_strides(&f->tdo, c->lay, &a.dout_stride_b, &a.dout_stride_s, &a.dout_stride_h);
        a.dq = dq.buf;
        set_strides(&dq, c->lay, &a.dq_stride_b, &a.dq_stride_s, &a.dq_stride_h);
        a.dk = dk.buf;
        set_strides(&dk, c->lay, &a.dk_stride_b, &a.dk_stride_s, &a.dk_stride_h);
        a.dv = dv.buf;
        set_strides(&dv, c->lay, &a.dv_stride_b, &a.dv_stride_s, &a.dv_stride_h);
        a.grad_dtype = c->grad_dtype;
        cp_status st = cp_kernel_attn_backward(ctxs[i].ctx, &a);
        if (st != CP_SUCCESS)
            fail_msg("%s: cp_kernel_attn_backward: %s", ctxs[i].name, cp_last_error());
        double tol = tol_for(c->grad_dtype == CP_DTYPE_F32 ? c->o_dtype : c->grad_dtype, 1);
        const struct {
            tensor *t;
            const double *ref;
            const char *name;
        } outs[] = {{&dq, f->dq, "dQ"}, {&dk, f->dk, "dK"}, {&dv, f->dv, "dV"}};
        for (int j = 0; j < 3; j++) {
            double *got = read_tensor(outs[j].t);
            char what[96];
            snprintf(what, sizeof what, "backward %s on %s", outs[j].name, ctxs[i].name);
            check_close(got, outs[j].ref, outs[j].t->B * outs[j].t->S * outs[j].t->H * outs[j].t->D, tol,
                        1e-3, what);
            free(got);
        }
        free_tensor(&dq), free_tensor(&dk), free_tensor(&dv);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shapes),
        cmocka_unit_test(test_random),
    };
    return cmocka_run_group_tests(tests, setup_contexts, teardown_contexts);
}
