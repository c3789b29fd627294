/* SPDX-License-Identifier: MIT */
/*
 * The single-device kernels with the API 1.1 arguments: sliding windows,
 * logit softcaps and rectangle lists (cp_kernel_attn_args.window, .softcap,
 * .rects), forward and backward, against the FP64 model of attn_model.h
 * (model_forward_ex / model_backward_ex, written apart from the kernels).
 *
 * Inputs are random values rounded to the storage type, and the error
 * bounds are test-kernel.c's (see its comment): fp32 results within 2e-5 of
 * the tensor's largest reference magnitude, 16-bit results within 1.5x
 * (forward) or 2x (backward) of the type's rounding unit on top. A softcap
 * adds the error of tanh (below 1e-7 of c, see vtanh), far inside them.
 *
 * Rectangle lists are random: query rows cut at the kernels' tile edges
 * (95/96/97 and 143/144/145 for the 96- and 144-row tiles, 255/256/257 for
 * the forward's 256 query rows) and elsewhere, rows in two rectangles with
 * disjoint keys, rows in none, empty rectangles and rectangles of one row,
 * positions anywhere (also near the largest allowed). Besides: the dense
 * block without rectangles is bit for bit the block as one explicit
 * rectangle; a causal block cut into rectangles equals the block; a NaN
 * reaches exactly the outputs whose visible pairs include it; a backend
 * that does not declare the 1.1 arguments refuses them; every bad new field
 * is refused, naming it.
 *
 * INFINICP_TEST_QUICK (the valgrind setup): a few random cases on one
 * context instead of many on six. INFINICP_TEST_FILTER=pattern runs only
 * the tests whose names match (cmocka's filter; for slow checkers such as
 * compute-sanitizer's racecheck).
 *
 * The GPU build (-DCPRUN_CUDA, suite gpu: gpu-kernel-v11, and
 * gpu-kernel-v11-deterministic with INFINICP_DETERMINISTIC=1) runs the same
 * tests against the CUDA backend's kernels, on one CUDA context (device 0):
 * kernel_call copies every buffer of a call into memory of the context's
 * backend and the outputs back (the rectangle list stays on the host, as
 * the API has it). It skips (exit 77, saying why) without the CUDA module,
 * a driver or a GPU. What differs there:
 *  - bounds (gpu_rms_tol, gpu_elem_tol): test-gpu-kernels.c's relative RMS
 *    bounds (forward F32 1e-5, F16 2e-3, BF16 1.5e-2; backward 2e-5, 6e-3,
 *    4e-2; LSE within 1e-4 absolute), by the type of the inputs, not of the
 *    outputs: the tensor-core kernels round P and dS to it for their
 *    products (fp32 accumulation), so an F32 output of 16-bit inputs is no
 *    better than that type allows. Besides, every element within 4 (forward)
 *    or 8 (backward) rounding units of the input type of the tensor's
 *    largest reference magnitude (F32: 2 x TOL_F32): the RMS alone would
 *    let a few wrong rows through. The softcap's tanh (1 - 2 / (2^(2x log2
 *    e) + 1) with a fast exp2, absolute error about 1e-7 of c) is far inside
 *    both.
 *  - bit-for-bit checks: one explicit rectangle against none is within
 *    twice the bounds instead (the dense call takes the 1.0 kernels, the
 *    list the rectangle kernels); the thread-count comparisons need several
 *    CPU contexts and do not apply.
 *  - non-finite inputs: BF16 too (the tensor-core kernels, O and gradients
 *    in BF16), beside F32. Every output the model says a plant touches has
 *    the model's class (finite ones its value, within the bounds), and each
 *    plant reaches an output; every other output is within the bounds of
 *    the clean run's or non-finite: the tensor-core products may carry a
 *    NaN or inf of V, dO, Q or K into hidden pairs of the same tile
 *    (docs/RELIABILITY.md), so those are counted and printed, not failed.
 *  - the rest runs as on the CPU (accumulation, an empty list leaving
 *    accumulated rows bit for bit, every bad field refused, a table that
 *    does not declare the 1.1 arguments), on the CUDA backend's table.
 *
 * INFINICP_TEST_DTYPES=bf16,f16 (any of f32, f16, bf16) runs only the
 * cases whose inputs have those types and says which it skipped: for
 * kernels that do not have every type yet. Unset: every type.
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
#include "core/context.h"
#include "cpuctx.h"
#include "devmem.h"
#include "storage.h"
#include "testutil.h"

#define TOL_F32 2e-5
#define TOL_LSE 2e-5
#define MAX_RECTS 48

static int quick(void)
{
    const char *q = getenv("INFINICP_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

/* Whether INFINICP_TEST_DTYPES (see the top of the file) lets cases of
 * input type t run; says once per type when it does not. */
static int dtype_wanted(cp_dtype t)
{
    static int said[4];
    const char *env = getenv("INFINICP_TEST_DTYPES");
    const char *name = t == CP_DTYPE_F32 ? "f32" : t == CP_DTYPE_F16 ? "f16" : t == CP_DTYPE_BF16 ? "bf16" : "f64";
    if (!env || !*env)
        return 1;
    for (const char *p = env; *p;) {
        const size_t n = strcspn(p, ",");
        if (n == strlen(name) && !strncmp(p, name, n))
            return 1;
        p += n + (p[n] == ',');
    }
    if (!said[t & 3]) {
        said[t & 3] = 1;
        printf("INFINICP_TEST_DTYPES=%s: the %s cases are skipped\n", env, name);
    }
    return 0;
}

static double tol_for(cp_dtype t, int backward)
{
    switch (t) {
    case CP_DTYPE_BF16: return (backward ? 2.0 : 1.5) * 0x1p-8 + TOL_F32;
    case CP_DTYPE_F16: return (backward ? 2.0 : 1.5) * 0x1p-11 + TOL_F32;
    default: return TOL_F32;
    }
}

/* The device of the contexts: the CPU, or CUDA device 0 in the GPU build
 * (-DCPRUN_CUDA, as the CP suites' GPU builds; cprun.h). */
#ifdef CPRUN_CUDA
static const cp_device test_device = CP_DEVICE_CUDA;
#else
static const cp_device test_device = CP_DEVICE_CPU;
#endif

static int on_gpu(void)
{
    return test_device != CP_DEVICE_CPU;
}

/* Whether test_device cannot be opened (never on the CPU); prints why, for
 * main to return 77 (meson: SKIP). */
static int device_missing(void)
{
    if (!on_gpu())
        return 0;
    cp_context_config cfg = CP_CONTEXT_CONFIG_INIT;
    cfg.device = test_device;
    cp_context *ctx = NULL;
    cp_status s = cp_context_create(&cfg, &ctx);
    cp_context_destroy(ctx);
    if (s == CP_SUCCESS)
        return 0;
    printf("SKIP: no usable CUDA device for the API 1.1 kernel suite: %s (%s)\n", cp_last_error(),
           cp_status_string(s));
    return 1;
}

/* The GPU's bounds, by the inputs' type (see the top of the file): relative
 * RMS error as in test-gpu-kernels.c, and every element's error against
 * the tensor's largest reference magnitude. */
static double gpu_rms_tol(cp_dtype t, int backward)
{
    if (backward)
        return t == CP_DTYPE_F32 ? 2e-5 : t == CP_DTYPE_F16 ? 6e-3 : 4e-2;
    return t == CP_DTYPE_F32 ? 1e-5 : t == CP_DTYPE_F16 ? 2e-3 : 1.5e-2;
}

static double gpu_elem_tol(cp_dtype t, int backward)
{
    const double u = t == CP_DTYPE_BF16 ? 0x1p-8 : t == CP_DTYPE_F16 ? 0x1p-11 : 0;
    return (backward ? 8 : 4) * u + 2 * TOL_F32;
}

#define GPU_TOL_LSE 1e-4

/* ------------------------------------------------------------------------ */
/* Contexts: every ISA this machine has, several thread counts              */
/* ------------------------------------------------------------------------ */

static cpuctx_set cs;

static int setup_contexts(void **state)
{
    (void)state;
    if (on_gpu()) {
        /* one context on CUDA device 0; deterministic as INFINICP_DETERMINISTIC says */
        cp_context_config cfg = CP_CONTEXT_CONFIG_INIT;
        cfg.device = test_device;
        if (cp_context_create(&cfg, &cs.c[0].ctx) != CP_SUCCESS)
            fail_msg("cp_context_create on CUDA device 0: %s", cp_last_error());
        snprintf(cs.c[0].name, sizeof cs.c[0].name, "cuda:0%s", cs.c[0].ctx->deterministic ? "/deterministic" : "");
        cs.n = 1;
        return 0;
    }
    /* contexts 0..2: one ISA, 1, 2 and 3 threads (their results must agree bit for bit) */
    cpuctx_add(&cs, NULL, 1);
    if (quick())
        return 0;
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
/* Tensors: dense BSHD or SBHD values in their storage type                 */
/* ------------------------------------------------------------------------ */

typedef struct {
    void *buf;
    cp_dtype t;
    cp_format f;
    int64_t B, S, H, D;
} tensor;

static size_t numel(const tensor *x)
{
    return (size_t)(x->B * x->S * x->H * x->D);
}

/* A tensor holding the BSHD values vals (NULL: NaN everywhere, so that an
 * element the kernel should write and does not shows). */
static tensor make_tensor(cp_format f, cp_dtype t, int64_t B, int64_t S, int64_t H, int64_t D, const double *vals)
{
    tensor x = {NULL, t, f, B, S, H, D};
    x.buf = malloc(numel(&x) * ref_dtype_size(t));
    assert_non_null(x.buf);
    ref_store_tensor(x.buf, t, f, B, S, H, D, vals);
    return x;
}

/* The BSHD values of a tensor. */
static double *read_tensor(const tensor *x)
{
    double *v = malloc(sizeof(double) * numel(x));
    assert_non_null(v);
    ref_load_tensor(x->buf, x->t, x->f, x->B, x->S, x->H, x->D, v);
    return v;
}

static void fill_tensor(tensor *x, double v)
{
    for (size_t i = 0; i < numel(x); i++)
        ref_store(x->buf, x->t, i, v);
}

static tensor copy_tensor(const tensor *x)
{
    tensor y = *x;
    y.buf = malloc(numel(x) * ref_dtype_size(x->t));
    assert_non_null(y.buf);
    memcpy(y.buf, x->buf, numel(x) * ref_dtype_size(x->t));
    return y;
}

static int same_bits(const tensor *x, const tensor *y)
{
    return !memcmp(x->buf, y->buf, numel(x) * ref_dtype_size(x->t));
}

static double *random_values(ref_rng *r, size_t n, cp_dtype t)
{
    double *v = malloc(sizeof(double) * (n ? n : 1));
    assert_non_null(v);
    for (size_t i = 0; i < n; i++)
        v[i] = ref_round(ref_rng_uniform(r, -1.0, 1.0), t);
    return v;
}

static double max_abs(const double *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs(x[i]));
    return m;
}

static void check_close(const double *x, const double *ref, size_t n, double tol, double floor, const char *what)
{
    double e = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(x[i]))
            fail_msg("%s: NaN at element %zu (reference %g)", what, i, ref[i]);
        e = fmax(e, fabs(x[i] - ref[i]));
    }
    e /= fmax(max_abs(ref, n), floor);
    if (getenv("TEST_VERBOSE"))
        printf("%-60s err %.3g (bound %.3g)\n", what, e, tol);
    if (!(e <= tol))
        fail_msg("%s: error %.3g exceeds the bound %.3g", what, e, tol);
}

/*
 * x against ref: every element within tol of the largest reference
 * magnitude (at least floor); on the GPU within mult x gpu_elem_tol of the
 * input type t instead, and, unless the reference is all below floor (a
 * gradient that is exactly 0 in exact arithmetic, reached only up to
 * cancellation), its relative RMS error within mult x gpu_rms_tol.
 */
static void check_result(const double *x, const double *ref, size_t n, double tol, cp_dtype t, int backward,
                         double mult, double floor, const char *what)
{
    if (!on_gpu()) {
        check_close(x, ref, n, mult * tol, floor, what);
        return;
    }
    check_close(x, ref, n, mult * gpu_elem_tol(t, backward), floor, what);
    if (max_abs(ref, n) < floor)
        return;
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (x[i] - ref[i]) * (x[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    const double e = sqrt(num / den), bound = mult * gpu_rms_tol(t, backward);
    if (getenv("TEST_VERBOSE"))
        printf("%-60s rms %.3g (bound %.3g)\n", what, e, bound);
    if (!(e <= bound))
        fail_msg("%s: relative RMS error %.3g exceeds the bound %.3g", what, e, bound);
}

/* LSE: -inf exactly where the reference has no key, else within TOL_LSE
 * relative (on the GPU, GPU_TOL_LSE absolute on top), mult times that. */
static void check_lse(const float *lse, const double *ref, size_t n, double mult, const char *what)
{
    const double abs_tol = on_gpu() ? GPU_TOL_LSE : 0;
    for (size_t i = 0; i < n; i++) {
        if (ref[i] == -INFINITY) {
            if (lse[i] != -INFINITY)
                fail_msg("%s: LSE[%zu] = %g, expected -inf (the row sees no key)", what, i, lse[i]);
            continue;
        }
        if (!(fabs(lse[i] - ref[i]) <= mult * (abs_tol + TOL_LSE * (1 + fabs(ref[i])))))
            fail_msg("%s: LSE[%zu] = %.9g, reference %.9g", what, i, lse[i], ref[i]);
    }
}

static float *new_lse(size_t n, float fill)
{
    float *l = malloc(sizeof(float) * n);
    assert_non_null(l);
    for (size_t i = 0; i < n; i++)
        l[i] = fill;
    return l;
}

/* ------------------------------------------------------------------------ */
/* A case: shape, API 1.1 arguments, types; its inputs and reference        */
/* ------------------------------------------------------------------------ */

typedef struct {
    model_shape s;
    int64_t window;
    double softcap;
    int nrects; /* -1: no rectangle list */
    cp_attn_rect rects[MAX_RECTS];
    cp_dtype dtype, o_dtype, grad_dtype;
    cp_format format;
} kcase;

typedef struct {
    kcase c;
    double *q, *k, *v, *dout;
    double *o, *lse, *dq, *dk, *dv; /* the model's */
    tensor tq, tk, tv, tdo;
} fixture;

static model_ext ext_of(const kcase *c, model_rect *mr)
{
    model_ext x = {.window = c->window, .softcap = c->softcap};
    if (c->nrects >= 0) {
        for (int i = 0; i < c->nrects; i++) {
            const cp_attn_rect *r = &c->rects[i];
            mr[i] = (model_rect){r->q_row, r->q_len, r->k_row, r->k_len, r->q_pos, r->k_pos};
        }
        x.rects = mr;
        x.nrects = c->nrects;
    }
    return x;
}

static void model_run(const kcase *c, const double *q, const double *k, const double *v, const double *dout,
                      double *o, double *lse, double *dq, double *dk, double *dv)
{
    model_rect mr[MAX_RECTS];
    model_ext x = ext_of(c, mr);
    model_forward_ex(&c->s, &x, q, k, v, o, lse);
    if (dq)
        model_backward_ex(&c->s, &x, q, k, v, o, lse, dout, dq, dk, dv, NULL);
}

static void fixture_init(fixture *f, const kcase *c, uint64_t seed)
{
    memset(f, 0, sizeof *f);
    f->c = *c;
    const model_shape *s = &c->s;
    ref_rng r = {seed * 0x9E3779B97F4A7C15ULL + 1};
    f->q = random_values(&r, model_q_elems(s), c->dtype);
    f->k = random_values(&r, model_k_elems(s), c->dtype);
    f->v = random_values(&r, model_v_elems(s), c->dtype);
    f->dout = random_values(&r, model_o_elems(s), c->o_dtype);
    f->o = malloc(sizeof(double) * model_o_elems(s));
    f->lse = malloc(sizeof(double) * model_lse_elems(s));
    f->dq = malloc(sizeof(double) * model_q_elems(s));
    f->dk = malloc(sizeof(double) * model_k_elems(s));
    f->dv = malloc(sizeof(double) * model_v_elems(s));
    assert_true(f->o && f->lse && f->dq && f->dk && f->dv);
    model_run(c, f->q, f->k, f->v, f->dout, f->o, f->lse, f->dq, f->dk, f->dv);
    f->tq = make_tensor(c->format, c->dtype, s->batch, s->seq_q, s->heads, s->head_dim, f->q);
    f->tk = make_tensor(c->format, c->dtype, s->batch, s->seq_k, s->kv_heads, s->head_dim, f->k);
    f->tv = make_tensor(c->format, c->dtype, s->batch, s->seq_k, s->kv_heads, s->head_dim_v, f->v);
    f->tdo = make_tensor(c->format, c->o_dtype, s->batch, s->seq_q, s->heads, s->head_dim_v, f->dout);
}

static void fixture_free(fixture *f)
{
    free(f->q), free(f->k), free(f->v), free(f->dout), free(f->o), free(f->lse);
    free(f->dq), free(f->dk), free(f->dv);
    free(f->tq.buf), free(f->tk.buf), free(f->tv.buf), free(f->tdo.buf);
}

/* The call's arguments; o, lse and the gradients are set by the caller. */
static cp_kernel_attn_args base_args(const fixture *f)
{
    const kcase *c = &f->c;
    cp_kernel_attn_args a = CP_KERNEL_ATTN_ARGS_INIT;
    a.dtype = c->dtype;
    a.format = c->format;
    a.batch = c->s.batch;
    a.num_heads = c->s.heads;
    a.num_kv_heads = c->s.kv_heads;
    a.head_dim = c->s.head_dim;
    a.head_dim_v = c->s.head_dim_v;
    a.seq_q = c->s.seq_q;
    a.seq_k = c->s.seq_k;
    a.q_offset = c->s.q_offset;
    a.k_offset = c->s.k_offset;
    a.mask = c->s.causal ? CP_MASK_CAUSAL : CP_MASK_NONE;
    a.softmax_scale = c->s.scale;
    a.q = f->tq.buf, a.k = f->tk.buf, a.v = f->tv.buf;
    a.o_dtype = c->o_dtype;
    a.grad_dtype = c->grad_dtype;
    a.window = c->window;
    a.softcap = c->softcap;
    if (c->nrects >= 0) {
        a.rects = c->rects;
        a.num_rects = c->nrects;
    }
    return a;
}

static tensor new_o(const fixture *f, cp_dtype t)
{
    const model_shape *s = &f->c.s;
    return make_tensor(f->c.format, t, s->batch, s->seq_q, s->heads, s->head_dim_v, NULL);
}

typedef struct {
    tensor dq, dk, dv;
} grads;

static grads new_grads(const fixture *f)
{
    const model_shape *s = &f->c.s;
    cp_format fm = f->c.format;
    cp_dtype t = f->c.grad_dtype;
    grads g = {make_tensor(fm, t, s->batch, s->seq_q, s->heads, s->head_dim, NULL),
               make_tensor(fm, t, s->batch, s->seq_k, s->kv_heads, s->head_dim, NULL),
               make_tensor(fm, t, s->batch, s->seq_k, s->kv_heads, s->head_dim_v, NULL)};
    return g;
}

static void free_grads(grads *g)
{
    free(g->dq.buf), free(g->dk.buf), free(g->dv.buf);
}

/* The backward's inputs: the reference O in o_dtype and LSE as floats. */
static void set_backward(cp_kernel_attn_args *a, const fixture *f, const tensor *o, float *lse, grads *g)
{
    a->o = o->buf;
    a->lse = lse;
    a->dout = f->tdo.buf;
    a->dq = g->dq.buf, a->dk = g->dk.buf, a->dv = g->dv.buf;
}

static tensor reference_o(const fixture *f)
{
    size_t n = model_o_elems(&f->c.s);
    double *r = malloc(sizeof(double) * n);
    assert_non_null(r);
    for (size_t i = 0; i < n; i++)
        r[i] = ref_round(f->o[i], f->c.o_dtype);
    const model_shape *s = &f->c.s;
    tensor o = make_tensor(f->c.format, f->c.o_dtype, s->batch, s->seq_q, s->heads, s->head_dim_v, r);
    free(r);
    return o;
}

static float *reference_lse(const fixture *f)
{
    size_t n = model_lse_elems(&f->c.s);
    float *lse = new_lse(n, 0);
    for (size_t i = 0; i < n; i++)
        lse[i] = (float)f->lse[i];
    return lse;
}

#define GUARD 256 /* bytes after a workspace that a call must leave alone (exact_workspace) */

static size_t dense_bytes(const cp_kernel_attn_args *a, int64_t seq, int heads, int dim, cp_dtype t)
{
    return (size_t)a->batch * (size_t)seq * (size_t)heads * (size_t)dim * ref_dtype_size(t);
}

/*
 * One kernel call of the host buffers in a on ctx: the call itself on the
 * CPU; on a device, on copies in the context's memory of every buffer the
 * call reads or writes (outputs too: their old values are what accumulate
 * reads, and their poison shows an element the call should write and does
 * not), with the outputs copied back after it. A workspace there is a
 * device buffer of the same size, poisoned, with the guard's bytes copied
 * in before and back out after the call, for check_guard. The rectangle
 * list stays where it is: it is host memory in the API. On failure,
 * call_error holds cp_last_error().
 */
static char call_error[1024];

static cp_status kernel_call(cp_context *ctx, const cp_kernel_attn_args *a, int backward)
{
    cp_status s;
    if (devmem_on_host(ctx)) {
        s = backward ? cp_kernel_attn_backward(ctx, a) : cp_kernel_attn_forward(ctx, a);
        if (s != CP_SUCCESS)
            snprintf(call_error, sizeof call_error, "%s", cp_last_error());
        return s;
    }
    if (a->q_stride_b || a->q_stride_s || a->q_stride_h || a->k_stride_b || a->k_stride_s || a->k_stride_h ||
        a->v_stride_b || a->v_stride_s || a->v_stride_h || a->o_stride_b || a->o_stride_s || a->o_stride_h)
        fail_msg("kernel_call copies dense tensors only (a stride is set)");
    const int dv = a->head_dim_v ? a->head_dim_v : a->head_dim;
    const int64_t Sq = a->seq_q, Sk = a->seq_k;
    enum { Q, K, V, O, LSE, DOUT, DQ, DK, DV, NBUF };
    /* forward: o and lse are outputs; backward: dq, dk, dv */
    const struct {
        const void *host;
        size_t bytes;
        int out;
    } b[NBUF] = {
        [Q] = { a->q, dense_bytes(a, Sq, a->num_heads, a->head_dim, a->dtype), 0 },
        [K] = { a->k, dense_bytes(a, Sk, a->num_kv_heads, a->head_dim, a->dtype), 0 },
        [V] = { a->v, dense_bytes(a, Sk, a->num_kv_heads, dv, a->dtype), 0 },
        [O] = { a->o, dense_bytes(a, Sq, a->num_heads, dv, a->o_dtype), !backward },
        [LSE] = { a->lse, (size_t)a->batch * (size_t)a->num_heads * (size_t)Sq * sizeof(float), !backward },
        [DOUT] = { backward ? a->dout : NULL, dense_bytes(a, Sq, a->num_heads, dv, a->o_dtype), 0 },
        [DQ] = { backward ? a->dq : NULL, dense_bytes(a, Sq, a->num_heads, a->head_dim, a->grad_dtype), 1 },
        [DK] = { backward ? a->dk : NULL, dense_bytes(a, Sk, a->num_kv_heads, a->head_dim, a->grad_dtype), 1 },
        [DV] = { backward ? a->dv : NULL, dense_bytes(a, Sk, a->num_kv_heads, dv, a->grad_dtype), 1 },
    };
    void *d[NBUF], *ws = NULL;
    for (int i = 0; i < NBUF; i++)
        if (devmem_put(ctx, b[i].host, b[i].bytes, &d[i]) != CP_SUCCESS)
            fail_msg("kernel_call: buffer %d of %zu bytes to the device: %s", i, b[i].bytes, cp_last_error());
    cp_kernel_attn_args x = *a;
    x.q = d[Q], x.k = d[K], x.v = d[V], x.o = d[O], x.lse = d[LSE];
    if (backward)
        x.dout = d[DOUT], x.dq = d[DQ], x.dk = d[DK], x.dv = d[DV];
    if (a->workspace) {
        const size_t n = a->workspace_bytes;
        assert_int_equal(ctx->ops->alloc(ctx->state, n + GUARD, &ws), CP_SUCCESS);
        assert_int_equal(ctx->ops->memset(ctx->state, ws, 0xff, n + GUARD), CP_SUCCESS);
        assert_int_equal(ctx->ops->copy_2d(ctx->state, (char *)ws + n, GUARD, (const char *)a->workspace + n, GUARD,
                                           GUARD, 1, CP_COPY_HOST_TO_DEVICE),
                         CP_SUCCESS);
        x.workspace = ws;
    }
    s = backward ? cp_kernel_attn_backward(ctx, &x) : cp_kernel_attn_forward(ctx, &x);
    if (s != CP_SUCCESS)
        snprintf(call_error, sizeof call_error, "%s", cp_last_error());
    cp_status sync = ctx->ops->synchronize(ctx->state);
    if (s == CP_SUCCESS && sync != CP_SUCCESS)
        fail_msg("kernel_call: waiting for the %s: %s", backward ? "backward" : "forward", cp_last_error());
    for (int i = 0; i < NBUF; i++) {
        if (s == CP_SUCCESS && b[i].out && devmem_get(ctx, (void *)b[i].host, d[i], b[i].bytes) != CP_SUCCESS)
            fail_msg("kernel_call: buffer %d back to the host: %s", i, cp_last_error());
        devmem_free(ctx, d[i], b[i].host);
    }
    if (ws) {
        if (devmem_get(ctx, (char *)a->workspace + a->workspace_bytes, (char *)ws + a->workspace_bytes, GUARD) !=
            CP_SUCCESS)
            fail_msg("kernel_call: the workspace's guard back to the host: %s", cp_last_error());
        ctx->ops->free(ctx->state, ws);
    }
    return s;
}

static void forward_ok(cp_context *ctx, const cp_kernel_attn_args *a)
{
    if (kernel_call(ctx, a, 0) != CP_SUCCESS)
        fail_msg("cp_kernel_attn_forward: %s", call_error);
}

static void backward_ok(cp_context *ctx, const cp_kernel_attn_args *a)
{
    if (kernel_call(ctx, a, 1) != CP_SUCCESS)
        fail_msg("cp_kernel_attn_backward: %s", call_error);
}

/*
 * A workspace of exactly the size cp_kernel_attn_workspace_size gives, with
 * a guard after it that the call must leave alone (an overrun shows here
 * and under valgrind / ASan, which see the block end).
 */
static void *exact_workspace(cp_context *ctx, cp_kernel_attn_args *a, int backward)
{
    size_t bytes = 0;
    if (cp_kernel_attn_workspace_size(ctx, a, backward, &bytes) != CP_SUCCESS)
        fail_msg("cp_kernel_attn_workspace_size: %s", cp_last_error());
    unsigned char *ws = malloc(bytes + GUARD);
    assert_non_null(ws);
    memset(ws + bytes, 0xA5, GUARD);
    a->workspace = ws;
    a->workspace_bytes = bytes;
    return ws;
}

static void check_guard(const cp_kernel_attn_args *a)
{
    const unsigned char *g = (const unsigned char *)a->workspace + a->workspace_bytes;
    for (int i = 0; i < GUARD; i++)
        if (g[i] != 0xA5)
            fail_msg("the call wrote past its workspace of %zu bytes (byte %d after it)", a->workspace_bytes, i);
}

static void describe(const kcase *c, char *buf, size_t n)
{
    static const char *tn[] = {"F32", "F16", "BF16", "F64"};
    snprintf(buf, n, "%s/%s/%s B%lld Sq%lld Sk%lld H%d/%d D%d/%d %s W%lld cap%g rects%d", tn[c->dtype],
             tn[c->o_dtype], tn[c->grad_dtype], (long long)c->s.batch, (long long)c->s.seq_q,
             (long long)c->s.seq_k, c->s.heads, c->s.kv_heads, c->s.head_dim, c->s.head_dim_v,
             c->s.causal ? "causal" : "nomask", (long long)c->window, c->softcap, c->nrects);
}

/* Forward on every context (with an exact workspace on the first): O and
 * LSE against the model; one ISA's thread counts agree bit for bit. */
static void run_forward(const fixture *f)
{
    const model_shape *s = &f->c.s;
    size_t no = model_o_elems(s), nl = model_lse_elems(s);
    char name[160], what[256];
    describe(&f->c, name, sizeof name);
    tensor first = {0};
    for (int i = 0; i < cs.n; i++) {
        tensor o = new_o(f, f->c.o_dtype);
        float *lse = new_lse(nl, NAN);
        cp_kernel_attn_args a = base_args(f);
        a.o = o.buf;
        a.lse = lse;
        void *ws = i == 0 ? exact_workspace(cs.c[i].ctx, &a, 0) : NULL;
        forward_ok(cs.c[i].ctx, &a);
        if (ws)
            check_guard(&a);
        free(ws);
        double *got = read_tensor(&o);
        snprintf(what, sizeof what, "forward O, %s on %s", name, cs.c[i].name);
        check_result(got, f->o, no, tol_for(f->c.o_dtype, 0), f->c.dtype, 0, 1, 1e-30, what);
        check_lse(lse, f->lse, nl, 1, what);
        free(got);
        if (i == 0)
            first = copy_tensor(&o);
        else if (i < 3 && !same_bits(&first, &o))
            fail_msg("forward O differs between %s and %s: %s", cs.c[0].name, cs.c[i].name, name);
        free(lse);
        free(o.buf);
    }
    free(first.buf);
}

/*
 * Gradients against the model. The floor under the error's scale is 5e-2:
 * with a window of 1 every row's softmax is a single 1 and dQ, dK are
 * exactly 0, which the kernels reach only up to the cancellation of
 * dP - rowsum(dO * O), a few sqrt(Dv) u |dO| |V| |scale| (up to 3e-7 with
 * the generic ISA's unfused multiply-adds); the floor allows 1e-6, still
 * far below what a wrong pair or factor gives.
 */
static void check_grads(const fixture *f, const grads *g, const double *dq, const double *dk, const double *dv,
                        const char *where)
{
    double tol = tol_for(f->c.grad_dtype == CP_DTYPE_F32 ? f->c.o_dtype : f->c.grad_dtype, 1);
    const struct {
        const tensor *t;
        const double *ref;
        const char *name;
    } outs[] = {{&g->dq, dq, "dQ"}, {&g->dk, dk, "dK"}, {&g->dv, dv, "dV"}};
    for (int j = 0; j < 3; j++) {
        double *got = read_tensor(outs[j].t);
        char what[256];
        snprintf(what, sizeof what, "backward %s, %s", outs[j].name, where);
        check_result(got, outs[j].ref, numel(outs[j].t), tol, f->c.dtype, 1, 1, 5e-2, what);
        free(got);
    }
}

/* Backward on every context (with an exact workspace on the first); then
 * with grad_accumulate into existing values on the first. */
static void run_backward(const fixture *f)
{
    const model_shape *s = &f->c.s;
    tensor o = reference_o(f);
    float *lse = reference_lse(f);
    char name[160], where[256];
    describe(&f->c, name, sizeof name);
    for (int i = 0; i < cs.n; i++) {
        grads g = new_grads(f);
        cp_kernel_attn_args a = base_args(f);
        set_backward(&a, f, &o, lse, &g);
        void *ws = i == 0 ? exact_workspace(cs.c[i].ctx, &a, 1) : NULL;
        backward_ok(cs.c[i].ctx, &a);
        if (ws)
            check_guard(&a);
        free(ws);
        a.workspace = NULL;
        a.workspace_bytes = 0;
        snprintf(where, sizeof where, "%s on %s", name, cs.c[i].name);
        check_grads(f, &g, f->dq, f->dk, f->dv, where);
        if (i == 0) {
            /* existing values X: X + gradient */
            fill_tensor(&g.dq, 0.25), fill_tensor(&g.dk, -0.5), fill_tensor(&g.dv, 1.0);
            a.grad_accumulate = 1;
            backward_ok(cs.c[i].ctx, &a);
            size_t nq = model_q_elems(s), nk = model_k_elems(s), nv = model_v_elems(s);
            double *dq = malloc(sizeof(double) * nq), *dk = malloc(sizeof(double) * nk),
                   *dv = malloc(sizeof(double) * nv);
            assert_true(dq && dk && dv);
            for (size_t e = 0; e < nq; e++)
                dq[e] = ref_round(0.25, f->c.grad_dtype) + f->dq[e];
            for (size_t e = 0; e < nk; e++)
                dk[e] = -0.5 + f->dk[e];
            for (size_t e = 0; e < nv; e++)
                dv[e] = 1.0 + f->dv[e];
            snprintf(where, sizeof where, "added to existing values, %s", name);
            check_grads(f, &g, dq, dk, dv, where);
            free(dq), free(dk), free(dv);
        }
        free_grads(&g);
    }
    free(lse);
    free(o.buf);
}

/*
 * Forward accumulation over a rectangle list cut in two: the first half
 * into an empty result (O = 0, LSE = -inf), the second merged into it,
 * equals the whole list; and a call whose rectangles hold none of a row
 * leaves that row's O and LSE as they were, bit for bit.
 */
static void run_accumulate(const fixture *f)
{
    const kcase *c = &f->c;
    const model_shape *s = &c->s;
    if (c->nrects < 2)
        return;
    size_t nl = model_lse_elems(s);
    int half = c->nrects / 2;
    tensor o = new_o(f, CP_DTYPE_F32);
    fill_tensor(&o, 0);
    float *lse = new_lse(nl, -INFINITY);
    for (int part = 0; part < 2; part++) {
        cp_kernel_attn_args a = base_args(f);
        a.o = o.buf, a.o_dtype = CP_DTYPE_F32, a.lse = lse;
        a.rects = part ? c->rects + half : c->rects;
        a.num_rects = part ? c->nrects - half : half;
        a.accumulate = 1;
        forward_ok(cs.c[0].ctx, &a);
    }
    char name[160], what[256];
    describe(c, name, sizeof name);
    snprintf(what, sizeof what, "forward accumulated over two rectangle lists, %s", name);
    double *got = read_tensor(&o);
    check_result(got, f->o, model_o_elems(s), TOL_F32, c->dtype, 0, 1, 1e-30, what);
    check_lse(lse, f->lse, nl, 1, what);
    free(got);

    /* an empty list: every row keeps its values */
    tensor before = copy_tensor(&o);
    float *lse_before = new_lse(nl, 0);
    memcpy(lse_before, lse, nl * sizeof(float));
    cp_kernel_attn_args a = base_args(f);
    a.o = o.buf, a.o_dtype = CP_DTYPE_F32, a.lse = lse;
    a.num_rects = 0;
    a.accumulate = 1;
    forward_ok(cs.c[0].ctx, &a);
    if (!same_bits(&before, &o) || memcmp(lse_before, lse, nl * sizeof(float)))
        fail_msg("an empty rectangle list changed an accumulated result: %s", name);
    /* without accumulate: O = 0 and LSE = -inf everywhere */
    a.accumulate = 0;
    forward_ok(cs.c[0].ctx, &a);
    got = read_tensor(&o);
    for (size_t i = 0; i < model_o_elems(s); i++)
        if (got[i] != 0)
            fail_msg("an empty rectangle list gave O[%zu] = %g: %s", i, got[i], name);
    for (size_t i = 0; i < nl; i++)
        if (lse[i] != -INFINITY)
            fail_msg("an empty rectangle list gave LSE[%zu] = %g: %s", i, lse[i], name);
    free(got);
    free(before.buf);
    free(lse_before);
    free(lse);
    free(o.buf);
}

static void run_case(const kcase *c, uint64_t seed)
{
    if (!dtype_wanted(c->dtype))
        return;
    fixture f;
    fixture_init(&f, c, seed);
    run_forward(&f);
    run_backward(&f);
    run_accumulate(&f);
    fixture_free(&f);
}

static kcase make_case(int64_t B, int64_t Sq, int64_t Sk, int H, int Hkv, int D, int Dv, int causal, cp_dtype t,
                       cp_format fm)
{
    kcase c;
    memset(&c, 0, sizeof c);
    c.s.batch = B, c.s.seq_q = Sq, c.s.seq_k = Sk, c.s.heads = H, c.s.kv_heads = Hkv;
    c.s.head_dim = D, c.s.head_dim_v = Dv, c.s.causal = causal;
    c.s.scale = 1.0 / sqrt((double)D);
    c.nrects = -1;
    c.dtype = c.o_dtype = c.grad_dtype = t;
    c.format = fm;
    return c;
}

/* ------------------------------------------------------------------------ */
/* Random rectangle lists                                                   */
/* ------------------------------------------------------------------------ */

/* Cut points of [0, n): tile edges where they fall inside (the full tiles'
 * and the smaller ones of narrow windows: 48 / 96 key rows, 64 / 128 query
 * rows), and a few random. */
static int cuts(ref_rng *r, int64_t n, int64_t *at, int max)
{
    static const int64_t edges[] = {47, 48, 49, 63, 64, 65, 95, 96, 97, 127, 128, 129, 143, 144, 145, 255, 256, 257};
    int m = 0;
    at[m++] = 0;
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++)
        if (edges[i] < n && ref_rng_int(r, 0, 2) == 0 && m < max - 4)
            at[m++] = edges[i];
    for (int i = 0; i < 3 && n > 1 && m < max - 1; i++)
        at[m++] = ref_rng_int(r, 1, n - 1);
    at[m++] = n;
    /* sort and drop duplicates */
    for (int i = 1; i < m; i++)
        for (int j = i; j > 0 && at[j - 1] > at[j]; j--) {
            int64_t x = at[j];
            at[j] = at[j - 1];
            at[j - 1] = x;
        }
    int u = 1;
    for (int i = 1; i < m; i++)
        if (at[i] != at[u - 1])
            at[u++] = at[i];
    return u;
}

static void add_rect(kcase *c, int64_t q_row, int64_t q_len, int64_t k_row, int64_t k_len, int64_t q_pos,
                     int64_t k_pos)
{
    if (c->nrects < MAX_RECTS)
        c->rects[c->nrects++] = (cp_attn_rect){q_row, q_len, k_row, k_len, q_pos, k_pos};
}

/*
 * Query segments between cut points; each is left out (its rows in no
 * rectangle), or attends one key segment, or two disjoint ones (a row in two
 * rectangles). A segment may start with a rectangle of its first row alone.
 * Positions: the key segment's start plus a random shift, so that causal
 * rectangles are partly, fully or not at all visible; or far out, near
 * the largest allowed position. Plus empty rectangles anywhere.
 */
static void random_rects(ref_rng *r, kcase *c)
{
    int64_t qc[20], kc[20];
    int nq = cuts(r, c->s.seq_q, qc, 20), nk = cuts(r, c->s.seq_k, kc, 20);
    c->nrects = 0;
    const int64_t far = INT64_MAX / 4 - 2 * (c->s.seq_q + c->s.seq_k) - 400;
    for (int i = 0; i + 1 < nq; i++) {
        int64_t q0 = qc[i], q1 = qc[i + 1];
        if (ref_rng_int(r, 0, 6) == 0)
            continue; /* rows in no rectangle */
        int two = nk > 2 && ref_rng_int(r, 0, 2) == 0;
        int64_t ka = ref_rng_int(r, 0, nk - 2), kb = two ? ref_rng_int(r, 0, nk - 3) : 0;
        if (two && kb >= ka)
            kb++;
        for (int n = 0; n < 1 + two; n++) {
            int64_t ks = n ? kb : ka, k0 = kc[ks], k1 = kc[ks + 1];
            int64_t base = ref_rng_int(r, 0, 9) == 0 ? far : 1000;
            int64_t k_pos = base + k0, q_pos = base + q0 + ref_rng_int(r, -120, 300);
            if (q_pos < 0)
                q_pos = 0;
            if (q1 - q0 > 2 && ref_rng_int(r, 0, 4) == 0) {
                /* the first row alone, then the rest */
                add_rect(c, q0, 1, k0, k1 - k0, q_pos, k_pos);
                add_rect(c, q0 + 1, q1 - q0 - 1, k0, k1 - k0, q_pos + 1, k_pos);
            } else {
                add_rect(c, q0, q1 - q0, k0, k1 - k0, q_pos, k_pos);
            }
        }
    }
    int empties = (int)ref_rng_int(r, 0, 2);
    for (int i = 0; i < empties; i++) {
        int64_t q0 = ref_rng_int(r, 0, c->s.seq_q), k0 = ref_rng_int(r, 0, c->s.seq_k);
        add_rect(c, q0, i ? c->s.seq_q - q0 : 0, k0, i ? 0 : c->s.seq_k - k0, ref_rng_int(r, 0, 50),
                 ref_rng_int(r, 0, 50));
    }
}

/* A window: 1, smaller than a tile, larger than the block, larger than everything, or none. */
static int64_t random_window(ref_rng *r, const kcase *c)
{
    switch (ref_rng_int(r, 0, 5)) {
    case 0: return 1;
    case 1: return ref_rng_int(r, 2, 90);
    case 2: return (c->s.seq_q > c->s.seq_k ? c->s.seq_q : c->s.seq_k) + ref_rng_int(r, 1, 50);
    case 3: return INT64_MAX;
    default: return 0;
    }
}

/* ------------------------------------------------------------------------ */
/* Tests                                                                    */
/* ------------------------------------------------------------------------ */

/* Hand-picked: windows and softcap on dense blocks (no rectangles), every
 * dtype, both masks, both formats, MHA and GQA, D != Dv. */
static void test_dense(void **state)
{
    (void)state;
    const cp_dtype types[] = {CP_DTYPE_F32, CP_DTYPE_BF16, CP_DTYPE_F16};
    for (int ti = 0; ti < 3; ti++) {
        cp_dtype t = types[ti];
        struct {
            kcase c;
            int64_t qoff, koff, window;
            double softcap, scale; /* scale 0: 1/sqrt(D) */
        } cases[] = {
            {make_case(1, 300, 300, 2, 1, 16, 16, 1, t, CP_FORMAT_BSHD), 0, 0, 1, 0, 0},
            {make_case(2, 130, 200, 4, 2, 24, 40, 1, t, CP_FORMAT_SBHD), 100, 0, 50, 0, 0},
            {make_case(1, 260, 290, 2, 2, 8, 8, 0, t, CP_FORMAT_BSHD), 40, 0, 97, 0, 0},
            {make_case(1, 200, 150, 4, 1, 16, 8, 0, t, CP_FORMAT_SBHD), 0, 30, 0, 2.5, 0},
            {make_case(1, 300, 300, 2, 2, 16, 16, 1, t, CP_FORMAT_BSHD), 0, 0, 256, 1.0, 0},
            {make_case(1, 70, 300, 2, 1, 16, 24, 1, t, CP_FORMAT_BSHD), 230, 0, 400, 30.0, 0},
            {make_case(1, 100, 100, 2, 2, 8, 8, 0, t, CP_FORMAT_SBHD), 0, 0, INT64_MAX, 0.5, 0},
            /* a softcap below the smallest normal float: every score is +-c, about 0 */
            {make_case(1, 100, 120, 2, 1, 16, 16, 1, t, CP_FORMAT_BSHD), 20, 0, 0, 1e-40, 1e-3},
        };
        int n = quick() ? 2 : (int)(sizeof cases / sizeof cases[0]);
        for (int i = 0; i < n; i++) {
            kcase c = cases[i].c;
            c.s.q_offset = cases[i].qoff;
            c.s.k_offset = cases[i].koff;
            c.window = cases[i].window;
            c.softcap = cases[i].softcap;
            if (cases[i].scale != 0)
                c.s.scale = cases[i].scale;
            run_case(&c, 100 + 10 * (uint64_t)ti + (uint64_t)i);
        }
    }
}

/* Random shapes, masks, windows, softcaps, types and rectangle lists. */
static void test_random_rects(void **state)
{
    (void)state;
    ref_rng r = {2026};
    const cp_dtype types[] = {CP_DTYPE_F32, CP_DTYPE_BF16, CP_DTYPE_F16};
    const int kv_choices[] = {1, 2};
    int iters = quick() ? 3 : 120;
    for (int it = 0; it < iters; it++) {
        int hkv = kv_choices[ref_rng_int(&r, 0, 1)];
        int H = hkv * (int)ref_rng_int(&r, 1, 2);
        int D = (int)ref_rng_int(&r, 4, 32), Dv = ref_rng_int(&r, 0, 1) ? D : (int)ref_rng_int(&r, 4, 32);
        /* short blocks, a few tiles, and now and then several forward query tiles */
        const int64_t top[] = {40, 300, 300, 600};
        int64_t Sq = ref_rng_int(&r, 1, top[ref_rng_int(&r, 0, 3)]), Sk = ref_rng_int(&r, 1, top[ref_rng_int(&r, 0, 3)]);
        cp_dtype t = types[it % 3];
        kcase c = make_case(ref_rng_int(&r, 1, 2), Sq, Sk, H, hkv, D, Dv, (int)ref_rng_int(&r, 0, 1), t,
                            ref_rng_int(&r, 0, 1) ? CP_FORMAT_SBHD : CP_FORMAT_BSHD);
        c.s.scale = ref_rng_uniform(&r, -0.6, 0.6);
        c.window = random_window(&r, &c);
        c.softcap = ref_rng_int(&r, 0, 1) ? ref_rng_uniform(&r, 0.3, 20) : 0;
        if (t != CP_DTYPE_F32 && ref_rng_int(&r, 0, 1))
            c.o_dtype = CP_DTYPE_F32;
        if (t != CP_DTYPE_F32 && ref_rng_int(&r, 0, 1))
            c.grad_dtype = CP_DTYPE_F32;
        random_rects(&r, &c);
        run_case(&c, 5000 + (uint64_t)it);
    }
}

/* Run forward and backward of one argument set on ctx into fresh buffers. */
typedef struct {
    tensor o;
    float *lse;
    grads g;
} outputs;

static outputs run_both(cp_context *ctx, const fixture *f, const cp_kernel_attn_args *args)
{
    outputs r;
    size_t nl = model_lse_elems(&f->c.s);
    r.o = new_o(f, f->c.o_dtype);
    r.lse = new_lse(nl, NAN);
    cp_kernel_attn_args a = *args;
    a.o = r.o.buf, a.lse = r.lse;
    forward_ok(ctx, &a);
    tensor o = reference_o(f);
    float *lse = reference_lse(f);
    r.g = new_grads(f);
    a = *args;
    set_backward(&a, f, &o, lse, &r.g);
    backward_ok(ctx, &a);
    free(lse);
    free(o.buf);
    return r;
}

static void free_outputs(outputs *r)
{
    free(r->o.buf);
    free(r->lse);
    free_grads(&r->g);
}

/* y within twice the bounds of x, relative to x's largest magnitude (on
 * the GPU, check_result's bounds). */
static void check_tensors_close(const tensor *y, const tensor *x, double tol, cp_dtype t, int backward, double floor,
                                const char *what)
{
    double *a = read_tensor(x), *b = read_tensor(y);
    check_result(b, a, numel(x), tol, t, backward, 2, floor, what);
    free(a), free(b);
}

/* Two runs of the same case: y's outputs within twice the bounds of x's. */
static void check_outputs_close(const outputs *y, const outputs *x, const kcase *c, const char *what)
{
    const size_t nl = model_lse_elems(&c->s);
    check_tensors_close(&y->o, &x->o, tol_for(c->o_dtype, 0), c->dtype, 0, 1e-30, what);
    double *lx = malloc(nl * sizeof(double));
    assert_non_null(lx);
    for (size_t i = 0; i < nl; i++)
        lx[i] = x->lse[i];
    check_lse(y->lse, lx, nl, on_gpu() ? 2 : 1, what);
    free(lx);
    const double tol = tol_for(c->grad_dtype, 1);
    check_tensors_close(&y->g.dq, &x->g.dq, tol, c->dtype, 1, 1e-3, what);
    check_tensors_close(&y->g.dk, &x->g.dk, tol, c->dtype, 1, 1e-3, what);
    check_tensors_close(&y->g.dv, &x->g.dv, tol, c->dtype, 1, 1e-3, what);
}

/* No rectangle list is the block as one explicit rectangle at q_offset /
 * k_offset, bit for bit, with and without window and softcap (on the GPU
 * within twice the bounds: there the dense call without window and softcap
 * takes the 1.0 kernels). */
static void test_dense_is_one_rect(void **state)
{
    (void)state;
    kcase cases[] = {
        make_case(1, 300, 290, 4, 2, 16, 24, 1, CP_DTYPE_BF16, CP_FORMAT_BSHD),
        make_case(2, 100, 257, 2, 2, 8, 8, 0, CP_DTYPE_F32, CP_FORMAT_SBHD),
        make_case(1, 257, 145, 2, 1, 16, 16, 1, CP_DTYPE_F16, CP_FORMAT_BSHD),
    };
    const int64_t offs[][2] = {{0, 0}, {60, 10}, {300, 150}};
    const struct {
        int64_t window;
        double softcap;
    } v11[] = {{0, 0}, {77, 0}, {0, 3.0}, {200, 1.5}};
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
        for (size_t vi = 0; vi < sizeof v11 / sizeof v11[0]; vi++) {
            kcase c = cases[ci];
            c.s.q_offset = offs[ci][0], c.s.k_offset = offs[ci][1];
            c.window = v11[vi].window, c.softcap = v11[vi].softcap;
            if (!dtype_wanted(c.dtype))
                continue;
            fixture f;
            fixture_init(&f, &c, 40 + ci);
            for (int xi = 0; xi < cs.n; xi++) {
                cp_kernel_attn_args plain = base_args(&f), one = plain;
                const cp_attn_rect whole = {0, c.s.seq_q, 0, c.s.seq_k, c.s.q_offset, c.s.k_offset};
                one.rects = &whole;
                one.num_rects = 1;
                outputs x = run_both(cs.c[xi].ctx, &f, &plain), y = run_both(cs.c[xi].ctx, &f, &one);
                size_t nl = model_lse_elems(&c.s);
                if (on_gpu()) {
                    char what[160];
                    snprintf(what, sizeof what, "case %zu (window %lld, softcap %g) as one explicit rectangle on %s",
                             ci, (long long)c.window, c.softcap, cs.c[xi].name);
                    check_outputs_close(&y, &x, &c, what);
                } else if (!same_bits(&x.o, &y.o) || memcmp(x.lse, y.lse, nl * sizeof(float)) ||
                    !same_bits(&x.g.dq, &y.g.dq) || !same_bits(&x.g.dk, &y.g.dk) || !same_bits(&x.g.dv, &y.g.dv))
                    fail_msg("case %zu (window %lld, softcap %g) on %s: one explicit rectangle differs from none",
                             ci, (long long)c.window, c.softcap, cs.c[xi].name);
                free_outputs(&x);
                free_outputs(&y);
            }
            fixture_free(&f);
        }
}

/* A causal block (offsets 0) cut into rectangles on absolute positions:
 * pieces of queries against pieces of keys (the hidden ones left out) give
 * what one call over the block gives, within twice the rounding bounds. */
static void test_causal_in_pieces(void **state)
{
    (void)state;
    const int64_t qcut[] = {0, 1, 96, 97, 200, 256, 300}, kcut[] = {0, 95, 144, 145, 255, 300};
    const cp_dtype types[] = {CP_DTYPE_F32, CP_DTYPE_BF16};
    for (int ti = 0; ti < 2; ti++) {
        if (!dtype_wanted(types[ti]))
            continue;
        kcase c = make_case(2, 300, 300, 4, 2, 16, 16, 1, types[ti], CP_FORMAT_BSHD);
        cp_attn_rect rects[64];
        int n = 0;
        for (size_t i = 0; i + 1 < sizeof qcut / sizeof qcut[0]; i++)
            for (size_t j = 0; j + 1 < sizeof kcut / sizeof kcut[0]; j++)
                if (kcut[j] < qcut[i + 1]) /* the piece's last query sees its first key */
                    rects[n++] = (cp_attn_rect){qcut[i], qcut[i + 1] - qcut[i], kcut[j], kcut[j + 1] - kcut[j],
                                                qcut[i], kcut[j]};
        fixture f;
        fixture_init(&f, &c, 7 + (uint64_t)ti);
        for (int xi = 0; xi < cs.n; xi++) {
            cp_kernel_attn_args whole = base_args(&f), pieces = whole;
            pieces.rects = rects;
            pieces.num_rects = n;
            outputs x = run_both(cs.c[xi].ctx, &f, &whole), y = run_both(cs.c[xi].ctx, &f, &pieces);
            char what[128];
            snprintf(what, sizeof what, "%s causal block in %d rectangles on %s", ti ? "BF16" : "F32", n,
                     cs.c[xi].name);
            check_outputs_close(&y, &x, &c, what);
            free_outputs(&x);
            free_outputs(&y);
        }
        fixture_free(&f);
    }
}

/*
 * Key rows that no rectangle reads hold NaN, as a CP ring's buffers hold
 * rows nobody wrote: every output is what it is with finite values there.
 * The tensor-core kernels' key tiles start at a band's first visible key
 * and reach past its last into such rows (here rows 90-129 and 260-299),
 * so this says that they keep them out of the P V product and of the
 * gradients. Head dims 16 and 96 (the kernels' 64 and 128), with and
 * without a window.
 */
/* Head dims past 128: on Hopper the wgmma forward's 64-key tiles and its
 * output columns in two products (256), and MLA's q / k 192 with v 128 (and
 * 160 / 96, which pads to that shape: 128-key tiles, V of 128 columns). Three
 * documents of one packed row (the last two share a 128-row query tile), with
 * no window, a window and a softcap. */
static void test_wide_heads(void **state)
{
    (void)state;
    const int dims[][2] = {{256, 256}, {192, 128}, {160, 96}};
    const cp_dtype types[] = {CP_DTYPE_BF16, CP_DTYPE_F16};
    for (int di = 0; di < 3; di++)
        for (int ti = 0; ti < 2; ti++) {
            if (!dtype_wanted(types[ti]))
                continue;
            for (int v = 0; v < 3; v++) {
                if (quick() && v != di)
                    continue;
                kcase c = make_case(1, 300, 300, 4, 2, dims[di][0], dims[di][1], 1, types[ti], CP_FORMAT_BSHD);
                c.nrects = 0;
                add_rect(&c, 0, 90, 0, 90, 0, 0);
                add_rect(&c, 90, 150, 90, 150, 0, 0);
                add_rect(&c, 240, 60, 240, 60, 0, 0);
                c.window = v == 1 ? 70 : 0;
                c.softcap = v == 2 ? 15.0 : 0;
                run_case(&c, 7000 + (uint64_t)(9 * di + 3 * ti + v));
            }
        }
}

static void test_unread_keys_nan(void **state)
{
    (void)state;
    const cp_dtype types[] = {CP_DTYPE_F32, CP_DTYPE_BF16};
    const int dims[] = {16, 96}; /* 16-byte rows: the TMA kernels take them */
    const int64_t gaps[][2] = {{90, 130}, {260, 300}};
    for (int ti = 0; ti < 2; ti++) {
        if (!dtype_wanted(types[ti]))
            continue;
        for (int di = 0; di < 2; di++)
            for (int wi = 0; wi < 2; wi++) {
                kcase c = make_case(1, 300, 300, 4, 2, dims[di], dims[di], 1, types[ti], CP_FORMAT_BSHD);
                c.window = wi ? 50 : 0;
                c.nrects = 0;
                add_rect(&c, 0, 128, 0, 90, 0, 0);               /* the causal diagonal */
                add_rect(&c, 128, 172, 130, 130, 1000 + 129, 1000); /* every key seen (without window) */
                fixture f;
                fixture_init(&f, &c, 31 + (uint64_t)(4 * ti + 2 * di + wi));
                const int hk = c.s.kv_heads;
                for (size_t gi = 0; gi < sizeof gaps / sizeof gaps[0]; gi++)
                    for (int64_t r = gaps[gi][0]; r < gaps[gi][1]; r++)
                        for (int h = 0; h < hk; h++)
                            for (int d = 0; d < dims[di]; d++) {
                                const size_t e = (size_t)((r * hk + h) * dims[di] + d);
                                ref_store(f.tk.buf, c.dtype, e, NAN);
                                ref_store(f.tv.buf, c.dtype, e, NAN);
                            }
                run_forward(&f);
                run_backward(&f);
                fixture_free(&f);
            }
    }
}

/* ---- non-finite inputs ---------------------------------------------------- */

enum { FINITE, NOT_A_NUMBER, PLUS_INF, MINUS_INF };

static int value_class(double x)
{
    return isnan(x) ? NOT_A_NUMBER : x == INFINITY ? PLUS_INF : x == -INFINITY ? MINUS_INF : FINITE;
}

/* A kernel run's five outputs as doubles (BSHD; LSE [B][H][Sq]). */
typedef struct {
    double *t[5];
    size_t n[5];
} run5;

/* Forward, then the backward of this forward as a training step runs it
 * (O in the case's o_dtype: F32 on the CPU, where the cases are F32; the
 * storage type of the 16-bit cases on the GPU, for the tensor-core
 * backward). */
static run5 run_planted(cp_context *ctx, fixture *f)
{
    const model_shape *s = &f->c.s;
    const cp_dtype odt = f->c.o_dtype;
    size_t nl = model_lse_elems(s);
    cp_kernel_attn_args a = base_args(f);
    tensor o = new_o(f, odt);
    float *lse = new_lse(nl, NAN);
    a.o = o.buf, a.o_dtype = odt, a.lse = lse;
    forward_ok(ctx, &a);
    grads g = new_grads(f);
    a = base_args(f);
    a.o_dtype = odt;
    set_backward(&a, f, &o, lse, &g);
    backward_ok(ctx, &a);
    run5 r = {{read_tensor(&o), malloc(nl * sizeof(double)), read_tensor(&g.dq), read_tensor(&g.dk),
               read_tensor(&g.dv)},
              {numel(&o), nl, numel(&g.dq), numel(&g.dk), numel(&g.dv)}};
    assert_non_null(r.t[1]);
    for (size_t i = 0; i < nl; i++)
        r.t[1][i] = lse[i];
    free(lse);
    free(o.buf);
    free_grads(&g);
    return r;
}

static void free_run5(run5 *r)
{
    for (int i = 0; i < 5; i++)
        free(r->t[i]);
}

/* The model's results as a run5 (o is F32: the backward reads the model's O as is). */
static run5 model_planted(const fixture *f)
{
    const model_shape *s = &f->c.s;
    run5 r = {{malloc(sizeof(double) * model_o_elems(s)), malloc(sizeof(double) * model_lse_elems(s)),
               malloc(sizeof(double) * model_q_elems(s)), malloc(sizeof(double) * model_k_elems(s)),
               malloc(sizeof(double) * model_v_elems(s))},
              {model_o_elems(s), model_lse_elems(s), model_q_elems(s), model_k_elems(s), model_v_elems(s)}};
    for (int i = 0; i < 5; i++)
        assert_non_null(r.t[i]);
    model_run(&f->c, f->q, f->k, f->v, f->dout, r.t[0], r.t[1], r.t[2], r.t[3], r.t[4]);
    return r;
}

/*
 * NaN and +inf planted in q, k, v or dout, with a window and a rectangle
 * list (rows in two rectangles, rows in none): an output is touched iff the
 * model's planted and clean results differ; touched ones have the model's
 * class (and value, if finite), the others keep the clean run's bits.
 *
 * On the GPU (see the top of the file) also in BF16; touched outputs as
 * above (finite values within the bounds), the others within the bounds of
 * the clean run's, or non-finite: the tensor-core products' documented
 * NaN in hidden pairs of a tile, counted and printed.
 */
static void test_nonfinite(void **state)
{
    (void)state;
    static const char *names[] = {"O", "LSE", "dQ", "dK", "dV"}, *tn[] = {"q", "k", "v", "dout"};
    long leaked = 0, leak_runs = 0;
    for (int ci = 0; ci < (on_gpu() ? 4 : 2); ci++) {
        const int v = ci % 2;
        const cp_dtype dt = ci < 2 ? CP_DTYPE_F32 : CP_DTYPE_BF16;
        /* finite values: against the model (touched) or the clean run (the others, GPU) */
        const double ftol = dt == CP_DTYPE_F32 ? 1e-4 : 8 * 0x1p-8;
        if (!dtype_wanted(dt))
            continue;
        kcase c = make_case(1, 300, 300, 2, 1, 16, 16, v == 0, dt, CP_FORMAT_BSHD);
        c.s.scale = 0.25;
        c.window = v == 0 ? 100 : 40;
        c.softcap = v == 0 ? 0 : 5.0;
        c.nrects = 0;
        /* two documents at rows [0, 150) and [150, 300), rows [150, 200) also
         * see a second key range, rows [280, 300) nothing */
        add_rect(&c, 0, 150, 0, 150, 0, 0);
        add_rect(&c, 150, 130, 150, 150, 1000, 1000);
        add_rect(&c, 150, 50, 0, 96, 1200, 1100);
        fixture f;
        fixture_init(&f, &c, 900 + (uint64_t)ci);
        run5 m0 = model_planted(&f);
        static const int64_t tokens[] = {0, 95, 96, 149, 150, 190, 255, 290};
        static const double values[] = {NAN, INFINITY};
        for (int xi = 0; xi < cs.n; xi += quick() ? 1 : 3) {
            run5 k0 = run_planted(cs.c[xi].ctx, &f);
            for (int t = 0; t < 4; t++)
                for (int vi = 0; vi < 2; vi++)
                    for (int pi = 0; pi < (quick() ? 1 : 2); pi++) {
                        const int64_t pos = tokens[(t * 3 + vi + pi * 5 + ci) % 8];
                        double *x[4] = {f.q, f.k, f.v, f.dout};
                        tensor *tx[4] = {&f.tq, &f.tk, &f.tv, &f.tdo};
                        const int heads = t == 1 || t == 2 ? c.s.kv_heads : c.s.heads;
                        const int dim = t == 2 || t == 3 ? c.s.head_dim_v : c.s.head_dim;
                        const int h = (int)(pos % heads), e = (int)((pos * 7 + vi) % dim);
                        size_t idx = ((size_t)pos * (size_t)heads + (size_t)h) * (size_t)dim + (size_t)e;
                        size_t sidx = (size_t)((pos * heads + h) * dim + e); /* BSHD, batch 1 */
                        double keep = x[t][idx];
                        x[t][idx] = values[vi];
                        ref_store(tx[t]->buf, tx[t]->t, sidx, values[vi]);
                        run5 m1 = model_planted(&f), k1 = run_planted(cs.c[xi].ctx, &f);
                        x[t][idx] = keep;
                        ref_store(tx[t]->buf, tx[t]->t, sidx, keep);
                        int wrong = 0, reached = 0;
                        long leaks = 0;
                        for (int o = 0; o < 5; o++) {
                            double scale = 0;
                            for (size_t i = 0; i < m1.n[o]; i++)
                                if (isfinite(m1.t[o][i]))
                                    scale = fmax(scale, fabs(m1.t[o][i]));
                            for (size_t i = 0; i < m1.n[o] && !wrong; i++) {
                                if (m1.t[o][i] == m0.t[o][i] && on_gpu()) {
                                    /* not touched: near the clean run, or the tensor cores' NaN */
                                    const double got = k1.t[o][i], clean = k0.t[o][i];
                                    if (!isfinite(got) && isfinite(clean))
                                        leaks++;
                                    else if (isfinite(got) ? !(fabs(got - clean) <= ftol * scale)
                                                           : value_class(got) != value_class(clean))
                                        wrong = printf("%s = %g at token %lld on %s: %s[%zu] = %.9g, untouched, "
                                                       "clean run %.9g\n",
                                                       tn[t], values[vi], (long long)pos, cs.c[xi].name, names[o],
                                                       i, got, clean);
                                    continue;
                                }
                                if (m1.t[o][i] == m0.t[o][i]) {
                                    /* not touched: the clean run's bits (but for the sign of a zero) */
                                    if (!(k1.t[o][i] == k0.t[o][i]) &&
                                        memcmp(&k1.t[o][i], &k0.t[o][i], sizeof(double)))
                                        wrong = printf("%s = %g at token %lld on %s: %s[%zu] = %.9g, untouched, "
                                                       "clean run %.9g\n",
                                                       tn[t], values[vi], (long long)pos, cs.c[xi].name, names[o],
                                                       i, k1.t[o][i], k0.t[o][i]);
                                    continue;
                                }
                                int want = value_class(m1.t[o][i]), have = value_class(k1.t[o][i]);
                                reached += want != FINITE;
                                if (want != have ||
                                    (want == FINITE && !(fabs(k1.t[o][i] - m1.t[o][i]) <= ftol * scale)))
                                    wrong = printf("%s = %g at token %lld on %s: %s[%zu] = %.9g, the model says "
                                                   "%.9g\n",
                                                   tn[t], values[vi], (long long)pos, cs.c[xi].name, names[o], i,
                                                   k1.t[o][i], m1.t[o][i]);
                            }
                        }
                        if (wrong)
                            fail_msg("case %d: the plant reached outputs other than the model's (above)", ci);
                        if (!reached && (vi == 0 || t < 3) && pos < 280)
                            fail_msg("case %d: %s = %g at token %lld reached no output", ci, tn[t], values[vi],
                                     (long long)pos);
                        if (leaks)
                            printf("case %d (%s): %s = %g at token %lld: %ld untouched outputs non-finite (the "
                                   "tensor cores' hidden pairs)\n",
                                   ci, dt == CP_DTYPE_F32 ? "F32" : "BF16", tn[t], values[vi], (long long)pos,
                                   leaks);
                        leaked += leaks;
                        leak_runs += leaks > 0;
                        free_run5(&m1);
                        free_run5(&k1);
                    }
            free_run5(&k0);
        }
        free_run5(&m0);
        fixture_free(&f);
    }
    if (on_gpu())
        printf("non-finite plants: %ld untouched outputs non-finite in %ld runs (allowed on the GPU)\n", leaked,
               leak_runs);
}

/* ---- arguments ------------------------------------------------------------ */

enum { AB = 1, ASQ = 20, ASK = 24, AH = 2, AD = 8 };
static float aq[AB * ASQ * AH * AD], ak[AB * ASK * AH * AD], av[AB * ASK * AH * AD], ao[AB * ASQ * AH * AD],
    alse[AB * AH * ASQ], ado[AB * ASQ * AH * AD], adq[AB * ASQ * AH * AD], adk[AB * ASK * AH * AD],
    adv[AB * ASK * AH * AD];

static cp_kernel_attn_args small_args(void)
{
    for (size_t i = 0; i < sizeof aq / sizeof aq[0]; i++)
        aq[i] = ado[i] = (float)((i * 37) % 17) / 17.0f - 0.5f;
    for (size_t i = 0; i < sizeof ak / sizeof ak[0]; i++)
        ak[i] = av[i] = (float)((i * 29) % 13) / 13.0f - 0.5f;
    for (size_t i = 0; i < sizeof alse / sizeof alse[0]; i++)
        alse[i] = 1.0f;
    return f32_kernel_attn_args(AB, AH, AH, AD, ASQ, ASK, aq, ak, av, ao, alse, ado, adq, adk, adv);
}

/* All three entry points refuse a with status, naming needle. */
#define EXPECT_ALL(ctx, a, status, needle)                                                          \
    do {                                                                                            \
        size_t bytes_ = 1;                                                                          \
        EXPECT_ERROR(cp_kernel_attn_forward((ctx), &(a)), (status), (needle));                      \
        EXPECT_ERROR(cp_kernel_attn_backward((ctx), &(a)), (status), (needle));                     \
        EXPECT_ERROR(cp_kernel_attn_workspace_size((ctx), &(a), 1, &bytes_), (status), (needle));   \
        assert_int_equal(bytes_, 0);                                                                \
    } while (0)

/* Every bad new field: CP_ERROR_INVALID_ARGUMENT, the message naming it. */
static void test_bad_fields(void **state)
{
    (void)state;
    if (!dtype_wanted(CP_DTYPE_F32))
        skip(); /* its calls are F32 */
    cp_context *ctx = cs.c[0].ctx;
    cp_attn_rect r[4];
    for (int i = 0; i < 4; i++)
        r[i] = (cp_attn_rect){0, ASQ, 0, ASK, 0, 0};
    cp_kernel_attn_args a = small_args();
    a.window = -1;
    EXPECT_ALL(ctx, a, CP_ERROR_INVALID_ARGUMENT, "a->window = -1");
    const struct {
        double cap, scale;
        const char *needle;
    } caps[] = {{-1, 0, "a->softcap = -1"}, {NAN, 0, "a->softcap = nan"}, {INFINITY, 0, "a->softcap = inf"},
                {1e-300, 0.5, "a->softcap = 1e-300"}, {3e38, 0, "a->softcap = 3e+38"}};
    for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) {
        a = small_args();
        a.softcap = caps[i].cap;
        a.softmax_scale = caps[i].scale;
        EXPECT_ALL(ctx, a, CP_ERROR_INVALID_ARGUMENT, caps[i].needle);
    }
    a = small_args();
    a.rects = r;
    a.num_rects = -1;
    EXPECT_ALL(ctx, a, CP_ERROR_INVALID_ARGUMENT, "a->num_rects = -1");
    a.rects = NULL;
    a.num_rects = 2;
    EXPECT_ALL(ctx, a, CP_ERROR_INVALID_ARGUMENT, "a->num_rects = 2");
    const struct {
        int i;
        cp_attn_rect bad;
        const char *needle;
    } rects[] = {
        {3, {0, -1, 0, 1, 0, 0}, "a->rects[3].q_len = -1"},
        {0, {15, 10, 0, 1, 0, 0}, "a->rects[0].q_row = 15"},
        {1, {-1, 1, 0, 1, 0, 0}, "a->rects[1].q_row = -1"},
        {2, {0, 1, 0, -4, 0, 0}, "a->rects[2].k_len = -4"},
        {1, {0, 1, -1, 1, 0, 0}, "a->rects[1].k_row = -1"},
        {2, {0, 1, 0, ASK + 1, 0, 0}, "a->rects[2].k_row = 0 with k_len = 25"},
        {0, {0, 1, ASK, 0, -3, 0}, "a->rects[0].q_pos = -3"},
        {1, {0, 2, 0, 10, 0, INT64_MAX / 4 - 5}, "a->rects[1].k_pos = 2305843009213693946"},
        {3, {0, 2, 0, 10, INT64_MAX, 0}, "a->rects[3].q_pos = 9223372036854775807"},
    };
    for (size_t i = 0; i < sizeof rects / sizeof rects[0]; i++) {
        a = small_args();
        cp_attn_rect list[4];
        memcpy(list, r, sizeof list);
        list[rects[i].i] = rects[i].bad;
        a.rects = list;
        a.num_rects = 4;
        EXPECT_ALL(ctx, a, CP_ERROR_INVALID_ARGUMENT, rects[i].needle);
    }
    /* the edges that are allowed: empty rectangles at the block's end, positions at the limit */
    a = small_args();
    r[0] = (cp_attn_rect){ASQ, 0, ASK, 0, 0, 0};
    r[1] = (cp_attn_rect){0, ASQ, 0, ASK, INT64_MAX / 4 - ASQ, INT64_MAX / 4 - ASK};
    a.rects = r;
    a.num_rects = 2;
    a.window = INT64_MAX;
    forward_ok(ctx, &a);
    backward_ok(ctx, &a);
}

/*
 * A backend that does not declare the API 1.1 arguments (kernel_args_size 0,
 * or a table too old to have the field) refuses a window, a softcap and
 * rectangles, naming the field and the backend, instead of ignoring them;
 * one that declares part of them refuses the rest. A caller of the 1.0
 * struct size gets the 1.0 kernels whatever lies past its struct.
 */
static void test_unsupported(void **state)
{
    (void)state;
    if (!dtype_wanted(CP_DTYPE_F32))
        skip(); /* its calls are F32 */
    cp_context fake = *cs.c[0].ctx;
    cp_backend_ops ops = *fake.ops;
    fake.ops = &ops;
    cp_attn_rect whole = {0, ASQ, 0, ASK, 0, 0};
    const size_t v10 = offsetof(cp_kernel_attn_args, window);
    char backend[64]; /* the message names the backend: "cpu backend", "cuda backend" */
    snprintf(backend, sizeof backend, "%s backend", ops.name);
    const struct {
        size_t struct_size, args_size;
    } tables[] = {
        {sizeof ops, 0},
        {offsetof(cp_backend_ops, kernel_args_size), sizeof(cp_kernel_attn_args)},
        {sizeof ops, v10},
    };
    for (size_t ti = 0; ti < sizeof tables / sizeof tables[0]; ti++) {
        ops.struct_size = tables[ti].struct_size;
        ops.kernel_args_size = tables[ti].args_size;
        cp_kernel_attn_args a = small_args();
        forward_ok(&fake, &a); /* the 1.0 arguments run */
        a.window = 3;
        EXPECT_ALL(&fake, a, CP_ERROR_UNSUPPORTED, "window");
        EXPECT_ALL(&fake, a, CP_ERROR_UNSUPPORTED, backend);
        a = small_args();
        a.softcap = 2;
        EXPECT_ALL(&fake, a, CP_ERROR_UNSUPPORTED, "softcap");
        a = small_args();
        a.rects = &whole;
        a.num_rects = 1;
        EXPECT_ALL(&fake, a, CP_ERROR_UNSUPPORTED, "rects");
    }
    /* a backend that knows the window only */
    ops.struct_size = sizeof ops;
    ops.kernel_args_size = offsetof(cp_kernel_attn_args, window) + sizeof(int64_t);
    cp_kernel_attn_args a = small_args();
    a.window = 3;
    forward_ok(&fake, &a);
    a.softcap = 2;
    EXPECT_ALL(&fake, a, CP_ERROR_UNSUPPORTED, "softcap");

    /* a 1.0 caller: the new fields read as 0 */
    ops.kernel_args_size = 0;
    cp_kernel_attn_args old = small_args();
    old.struct_size = v10;
    old.window = 3, old.softcap = 2, old.num_rects = -7;
    forward_ok(&fake, &old);
    float o10[sizeof ao / sizeof ao[0]], lse10[sizeof alse / sizeof alse[0]];
    memcpy(o10, ao, sizeof ao);
    memcpy(lse10, alse, sizeof alse);
    cp_kernel_attn_args plain = small_args();
    forward_ok(cs.c[0].ctx, &plain);
    assert_memory_equal(o10, ao, sizeof ao);
    assert_memory_equal(lse10, alse, sizeof alse);
}

int main(void)
{
    if (device_missing())
        return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense),
        cmocka_unit_test(test_random_rects),
        cmocka_unit_test(test_dense_is_one_rect),
        cmocka_unit_test(test_causal_in_pieces),
        cmocka_unit_test(test_unread_keys_nan),
        cmocka_unit_test(test_wide_heads),
        cmocka_unit_test(test_nonfinite),
        cmocka_unit_test(test_bad_fields),
        cmocka_unit_test(test_unsupported),
    };
    if (getenv("INFINICP_TEST_FILTER"))
        cmocka_set_test_filter(getenv("INFINICP_TEST_FILTER"));
    return cmocka_run_group_tests(tests, setup_contexts, teardown_contexts);
}
