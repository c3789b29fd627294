/* SPDX-License-Identifier: MIT */
/*
 * The CUDA backend's kernels against references computed here: block
 * attention forward and backward on each of the three paths (tensor-core
 * "mma", fp32 "simt", unfused "cublas") against the FP64 model of attn_model.c
 * and against the cuBLAS path, merge, conversion, reduction, copies,
 * streams and events, and the error paths.
 *
 * Skips (exit 77, with the reason printed) where there is no CUDA module,
 * driver or GPU.
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

#include "cpref.h"
#include "attn_model.h"
#include "gpuenv.h"
#include "testutil.h"

/* "auto" picks mma for F16 / BF16 (on Hopper possibly the wgmma forward; the
 * backward adding dQ with atomics), "mma" forces mma.sync (two row tiles per
 * warp in the forward), "mma-mt1" the mma forward with one row tile per warp,
 * "wgmma" the Hopper forward and backward where they fit (elsewhere it is
 * "auto"),
 * "mma-det" the automatic path with the deterministic backward. */
enum { PATH_AUTO, PATH_MMA, PATH_MT1, PATH_WGMMA, PATH_DET, PATH_SIMT, PATH_BLAS, NPATHS };
static const char *path_name[NPATHS] = {"auto", "mma", "mma-mt1", "wgmma", "mma-det", "simt", "cublas"};
static void *states[NPATHS];

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static double uniform(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / (double)(1ull << 53) * 2.0 - 1.0;
}

/* ------------------------------------------------------------------------ */
/* A block attention case and its FP64 reference                            */
/* ------------------------------------------------------------------------ */

typedef struct blk {
    const char *name;
    int B, H, Hkv, D, Dv;
    int64_t Sq, Sk, qoff, koff;
    int causal;
    cp_format fmt;
    int pad; /* extra elements after each head row (strides not dense) */
} blk;

typedef test_lay lay; /* testutil.h */

static lay make_lay(const blk *c, int64_t S, int heads, int dim)
{
    return test_lay_of(c->fmt, c->B, c->pad, S, heads, dim);
}

static size_t dense_at(int64_t S, int heads, int dim, int64_t b, int64_t s, int h)
{
    return (((size_t)b * (size_t)S + (size_t)s) * (size_t)heads + (size_t)h) * (size_t)dim;
}

/* Dense double [B, S, heads, dim] <-> strided storage of type t. */
static void *pack(const blk *c, const lay *l, cp_dtype t, const double *x, int64_t S, int heads, int dim)
{
    size_t es = cpref_dtype_size(t);
    char *out = calloc(l->elems ? l->elems : 1, es);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int h = 0; h < heads; h++)
                cpref_store(out + (size_t)(b * l->sb + s * l->ss + h * l->sh) * es, t,
                            x + dense_at(S, heads, dim, b, s, h), (size_t)dim);
    return out;
}

static void unpack(const blk *c, const lay *l, cp_dtype t, const void *in, double *x, int64_t S, int heads,
                   int dim)
{
    size_t es = cpref_dtype_size(t);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t s = 0; s < S; s++)
            for (int h = 0; h < heads; h++)
                cpref_load(x + dense_at(S, heads, dim, b, s, h),
                           (const char *)in + (size_t)(b * l->sb + s * l->ss + h * l->sh) * es, t, (size_t)dim);
}

/* The model's shape of a case's block. */
static model_shape shape_of(const blk *c, double scale)
{
    model_shape m = { .batch = c->B, .seq_q = c->Sq, .seq_k = c->Sk, .heads = c->H, .kv_heads = c->Hkv,
                      .head_dim = c->D, .head_dim_v = c->Dv, .q_offset = c->qoff, .k_offset = c->koff,
                      .causal = c->causal, .scale = scale };
    return m;
}

/* ------------------------------------------------------------------------ */
/* Running a case on the device                                             */
/* ------------------------------------------------------------------------ */

typedef struct dcase {
    const blk *c;
    cp_dtype t;
    double scale;
    lay lq, lk, lv, lo, lgq, lgk, lgv;
    size_t nq, nk, nv, no; /* dense element counts */
    double *q, *k, *v, *dout;  /* inputs, rounded to t */
    double *o, *lse;           /* FP64 forward */
    double *o_in;              /* o rounded to t: the backward's input */
    float *lse_in;             /* lse as float: the backward's input */
    double *dq, *dk, *dv;      /* FP64 backward from (o_in, lse_in) */
} dcase;

static void make_case(dcase *d, const blk *c, cp_dtype t)
{
    memset(d, 0, sizeof *d);
    d->c = c;
    d->t = t;
    d->scale = 1.0 / sqrt((double)c->D);
    d->nq = (size_t)c->B * c->Sq * c->H * c->D;
    d->nk = (size_t)c->B * c->Sk * c->Hkv * c->D;
    d->nv = (size_t)c->B * c->Sk * c->Hkv * c->Dv;
    d->no = (size_t)c->B * c->Sq * c->H * c->Dv;
    d->lq = make_lay(c, c->Sq, c->H, c->D);
    d->lk = make_lay(c, c->Sk, c->Hkv, c->D);
    d->lv = make_lay(c, c->Sk, c->Hkv, c->Dv);
    d->lo = make_lay(c, c->Sq, c->H, c->Dv);
    d->q = malloc(d->nq * sizeof(double));
    d->k = malloc(d->nk * sizeof(double));
    d->v = malloc(d->nv * sizeof(double));
    d->dout = malloc(d->no * sizeof(double));
    for (size_t i = 0; i < d->nq; i++)
        d->q[i] = cpref_round(2.0 * uniform(), t);
    for (size_t i = 0; i < d->nk; i++)
        d->k[i] = cpref_round(2.0 * uniform(), t);
    for (size_t i = 0; i < d->nv; i++)
        d->v[i] = cpref_round(uniform(), t);
    for (size_t i = 0; i < d->no; i++)
        d->dout[i] = cpref_round(uniform(), t);
    const size_t nl = (size_t)c->B * c->H * c->Sq;
    d->o = malloc(d->no * sizeof(double));
    d->lse = malloc(nl * sizeof(double));
    const model_shape m = shape_of(c, d->scale);
    model_forward(&m, d->q, d->k, d->v, d->o, d->lse);
    d->o_in = malloc(d->no * sizeof(double));
    d->lse_in = malloc(nl * sizeof(float));
    double *lse_d = malloc(nl * sizeof(double));
    for (size_t i = 0; i < d->no; i++)
        d->o_in[i] = cpref_round(d->o[i], t);
    for (size_t i = 0; i < nl; i++) {
        d->lse_in[i] = (float)d->lse[i];
        lse_d[i] = d->lse_in[i];
    }
    d->dq = malloc(d->nq * sizeof(double));
    d->dk = malloc(d->nk * sizeof(double));
    d->dv = malloc(d->nv * sizeof(double));
    /* the backward of the function the kernels compute from the O and LSE
     * they are given */
    model_backward(&m, d->q, d->k, d->v, d->o_in, lse_d, d->dout, d->dq, d->dk, d->dv);
    free(lse_d);
}

static void free_case(dcase *d)
{
    free(d->q), free(d->k), free(d->v), free(d->dout), free(d->o), free(d->lse);
    free(d->o_in), free(d->lse_in), free(d->dq), free(d->dk), free(d->dv);
}

/* Device copies of a case's inputs in storage type t. */
typedef struct dbufs {
    void *q, *k, *v, *dout, *o_in;
    float *lse_in;
} dbufs;

static dbufs upload_case(void *st, const dcase *d)
{
    const blk *c = d->c;
    const size_t es = cpref_dtype_size(d->t);
    dbufs b;
    void *h;
    h = pack(c, &d->lq, d->t, d->q, c->Sq, c->H, c->D);
    b.q = dev_copy(st, h, d->lq.elems * es);
    free(h);
    h = pack(c, &d->lk, d->t, d->k, c->Sk, c->Hkv, c->D);
    b.k = dev_copy(st, h, d->lk.elems * es);
    free(h);
    h = pack(c, &d->lv, d->t, d->v, c->Sk, c->Hkv, c->Dv);
    b.v = dev_copy(st, h, d->lv.elems * es);
    free(h);
    h = pack(c, &d->lo, d->t, d->dout, c->Sq, c->H, c->Dv);
    b.dout = dev_copy(st, h, d->lo.elems * es);
    free(h);
    h = pack(c, &d->lo, d->t, d->o_in, c->Sq, c->H, c->Dv);
    b.o_in = dev_copy(st, h, d->lo.elems * es);
    free(h);
    b.lse_in = dev_copy(st, d->lse_in, (size_t)c->B * c->H * c->Sq * sizeof(float));
    return b;
}

static void free_bufs(void *st, dbufs *b)
{
    gpu_ops->free(st, b->q), gpu_ops->free(st, b->k), gpu_ops->free(st, b->v);
    gpu_ops->free(st, b->dout), gpu_ops->free(st, b->o_in), gpu_ops->free(st, b->lse_in);
}

static void set_t(const lay *l, int64_t *sb, int64_t *ss, int64_t *sh)
{
    *sb = l->sb, *ss = l->ss, *sh = l->sh;
}

/* Arguments for keys [k0, k1) of the case (pointers into the full buffers). */
static cp_kernel_attn_args base_args(const dcase *d, const dbufs *b, int64_t k0, int64_t k1)
{
    const blk *c = d->c;
    const size_t es = cpref_dtype_size(d->t);
    cp_kernel_attn_args a = CP_KERNEL_ATTN_ARGS_INIT;
    a.dtype = d->t;
    a.format = c->fmt;
    a.batch = c->B;
    a.num_heads = c->H;
    a.num_kv_heads = c->Hkv;
    a.head_dim = c->D;
    a.head_dim_v = c->Dv;
    a.seq_q = c->Sq;
    a.seq_k = k1 - k0;
    a.q_offset = c->qoff;
    a.k_offset = c->koff + k0;
    a.mask = c->causal ? CP_MASK_CAUSAL : CP_MASK_NONE;
    a.softmax_scale = d->scale;
    a.q = b->q;
    set_t(&d->lq, &a.q_stride_b, &a.q_stride_s, &a.q_stride_h);
    a.k = (const char *)b->k + (size_t)(k0 * d->lk.ss) * es;
    set_t(&d->lk, &a.k_stride_b, &a.k_stride_s, &a.k_stride_h);
    a.v = (const char *)b->v + (size_t)(k0 * d->lv.ss) * es;
    set_t(&d->lv, &a.v_stride_b, &a.v_stride_s, &a.v_stride_h);
    return a;
}

/* Tolerances on the relative RMS error against FP64. F32 paths sum a few
 * hundred fp32 products (error ~1e-6). 16-bit results are rounded once to
 * the storage type (relative RMS u/sqrt(3): 1.1e-4 for F16, 2.3e-3 for BF16
 * with F32 outputs; up to that again for 16-bit outputs) and probabilities
 * / dS are rounded to 16 bits for the tensor-core products, which adds about
 * the same again; the bounds leave a factor of ~3 above those estimates. */
static double tol_fwd(cp_dtype t)
{
    return t == CP_DTYPE_F32 ? 1e-5 : t == CP_DTYPE_F16 ? 2e-3 : 1.5e-2;
}

static double tol_bwd(cp_dtype t)
{
    return t == CP_DTYPE_F32 ? 2e-5 : t == CP_DTYPE_F16 ? 6e-3 : 4e-2;
}

static size_t count_nonfinite(const double *x, size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += !isfinite(x[i]);
    return bad;
}

/* LSE: -inf exactly where the reference has no key, else close. */
static double lse_error(const double *ref, const float *got, size_t n)
{
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        if (ref[i] == -INFINITY) {
            if (got[i] != -INFINITY)
                return INFINITY;
            continue;
        }
        double e = fabs((double)got[i] - ref[i]);
        if (isnan(e))
            return INFINITY;
        if (e > worst)
            worst = e;
    }
    return worst;
}

typedef struct fwd_out {
    double *o;
    float *lse;
} fwd_out;

/* Forward in two modes: (a) one call, o in the storage type, outputs
 * poisoned first; (b) two calls over the key halves accumulating into an F32
 * o whose old values are NaN under LSE = -inf (they must never be read). */
static fwd_out run_forward(void *st, const dcase *d, const dbufs *b, int accumulate_halves)
{
    const blk *c = d->c;
    const size_t nl = (size_t)c->B * c->H * c->Sq;
    const cp_dtype ot = accumulate_halves ? CP_DTYPE_F32 : d->t;
    const size_t oes = cpref_dtype_size(ot);
    unsigned char *poison = malloc(d->lo.elems * oes);
    memset(poison, 0xff, d->lo.elems * oes); /* NaN in every type */
    void *o = dev_copy(st, poison, d->lo.elems * oes);
    float *lse_init = malloc(nl * sizeof(float));
    for (size_t i = 0; i < nl; i++)
        lse_init[i] = accumulate_halves ? -INFINITY : NAN;
    float *lse = dev_copy(st, lse_init, nl * sizeof(float));

    const int64_t cut = accumulate_halves ? c->Sk / 2 : c->Sk;
    int64_t bounds[3] = {0, cut, c->Sk};
    for (int part = 0; part < (accumulate_halves ? 2 : 1); part++) {
        int64_t k0 = bounds[part], k1 = accumulate_halves ? bounds[part + 1] : c->Sk;
        if (k1 <= k0)
            continue;
        cp_kernel_attn_args a = base_args(d, b, k0, k1);
        a.o = o;
        set_t(&d->lo, &a.o_stride_b, &a.o_stride_s, &a.o_stride_h);
        a.o_dtype = ot;
        a.lse = lse;
        a.accumulate = accumulate_halves;
        size_t ws = 0;
        assert_int_equal(gpu_ops->attn_workspace_size(st, &a, 0, &ws), CP_SUCCESS);
        void *w = ws ? dev_alloc(st, ws) : NULL;
        a.workspace = w;
        a.workspace_bytes = ws;
        cp_status s = gpu_ops->attn_forward(st, &a);
        if (s != CP_SUCCESS)
            fail_msg("%s: attn_forward: %s", c->name, cp_last_error());
        assert_int_equal(gpu_ops->synchronize(st), CP_SUCCESS);
        gpu_ops->free(st, w);
    }
    download(st, poison, o, d->lo.elems * oes);
    fwd_out r;
    r.o = malloc(d->no * sizeof(double));
    unpack(c, &d->lo, ot, poison, r.o, c->Sq, c->H, c->Dv);
    r.lse = malloc(nl * sizeof(float));
    download(st, r.lse, lse, nl * sizeof(float));
    gpu_ops->free(st, o);
    gpu_ops->free(st, lse);
    free(poison);
    free(lse_init);
    return r;
}

typedef struct bwd_out {
    double *dq, *dk, *dv;
} bwd_out;

/* Backward modes: grads in the storage type or F32, written by one call over
 * poisoned (NaN) buffers or added by two calls over the key halves into
 * zeroed ones. The atomic dQ takes a different route in each: a workspace
 * then a conversion (storage type), dq cleared then added into (F32, one
 * call), dq added into (F32, halves), a workspace then an addition (storage
 * type, halves). */
enum { BWD_ONE, BWD_HALVES_F32, BWD_ONE_F32, BWD_HALVES, NBWD };
static const char *bwd_name[NBWD] = {"one", "acc-f32", "one-f32", "acc"};

/* The caller's rowsum buffer (cp_kernel_attn_args.drow) of run_backward:
 * NULL, or a device buffer that the first call stores into (drow_ready 0)
 * and later calls read, unless drow_stored says the first may read too. */
static float *bwd_drow;
static int bwd_drow_stored;

static bwd_out run_backward(void *st, const dcase *d, const dbufs *b, int mode)
{
    const blk *c = d->c;
    const int accumulate_halves = mode == BWD_HALVES_F32 || mode == BWD_HALVES;
    const cp_dtype gt = mode == BWD_HALVES_F32 || mode == BWD_ONE_F32 ? CP_DTYPE_F32 : d->t;
    const size_t ges = cpref_dtype_size(gt);
    void *g[3];
    const lay *gl[3] = {&d->lq, &d->lk, &d->lv};
    for (int i = 0; i < 3; i++) {
        size_t bytes = gl[i]->elems * ges;
        unsigned char *init = malloc(bytes);
        memset(init, accumulate_halves ? 0x00 : 0xff, bytes);
        g[i] = dev_copy(st, init, bytes);
        free(init);
    }
    const int64_t cut = accumulate_halves ? c->Sk / 2 : c->Sk;
    int64_t bounds[3] = {0, cut, c->Sk};
    for (int part = 0; part < (accumulate_halves ? 2 : 1); part++) {
        int64_t k0 = bounds[part], k1 = accumulate_halves ? bounds[part + 1] : c->Sk;
        if (k1 <= k0)
            continue;
        cp_kernel_attn_args a = base_args(d, b, k0, k1);
        a.o = b->o_in;
        set_t(&d->lo, &a.o_stride_b, &a.o_stride_s, &a.o_stride_h);
        a.o_dtype = d->t;
        a.lse = b->lse_in;
        a.dout = b->dout;
        set_t(&d->lo, &a.dout_stride_b, &a.dout_stride_s, &a.dout_stride_h);
        a.dq = g[0];
        set_t(&d->lq, &a.dq_stride_b, &a.dq_stride_s, &a.dq_stride_h);
        a.dk = (char *)g[1] + (size_t)(k0 * d->lk.ss) * ges;
        set_t(&d->lk, &a.dk_stride_b, &a.dk_stride_s, &a.dk_stride_h);
        a.dv = (char *)g[2] + (size_t)(k0 * d->lv.ss) * ges;
        set_t(&d->lv, &a.dv_stride_b, &a.dv_stride_s, &a.dv_stride_h);
        a.grad_dtype = gt;
        a.grad_accumulate = accumulate_halves;
        a.drow = bwd_drow;
        a.drow_ready = bwd_drow && (part > 0 || bwd_drow_stored);
        /* the second half lets the kernel allocate its own workspace */
        size_t ws = 0;
        assert_int_equal(gpu_ops->attn_workspace_size(st, &a, 1, &ws), CP_SUCCESS);
        void *w = ws && part == 0 ? dev_alloc(st, ws) : NULL;
        a.workspace = w;
        a.workspace_bytes = w ? ws : 0;
        cp_status s = gpu_ops->attn_backward(st, &a);
        if (s != CP_SUCCESS)
            fail_msg("%s: attn_backward: %s", c->name, cp_last_error());
        assert_int_equal(gpu_ops->synchronize(st), CP_SUCCESS);
        gpu_ops->free(st, w);
    }
    bwd_out r;
    double **dst[3] = {&r.dq, &r.dk, &r.dv};
    const int64_t S[3] = {c->Sq, c->Sk, c->Sk};
    const int heads[3] = {c->H, c->Hkv, c->Hkv}, dims[3] = {c->D, c->D, c->Dv};
    for (int i = 0; i < 3; i++) {
        size_t bytes = gl[i]->elems * ges;
        void *host = malloc(bytes);
        download(st, host, g[i], bytes);
        *dst[i] = malloc((size_t)c->B * S[i] * heads[i] * dims[i] * sizeof(double));
        unpack(c, gl[i], gt, host, *dst[i], S[i], heads[i], dims[i]);
        free(host);
        gpu_ops->free(st, g[i]);
    }
    return r;
}

/* Relative RMS error, with all-zero references compared absolutely. */
static double rel_err(const double *x, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double e = x[i] - ref[i];
        num += e * e;
        den += ref[i] * ref[i];
    }
    if (!isfinite(num))
        return INFINITY;
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static const blk cases[] = {
    /* name                 B  H Hkv   D   Dv   Sq   Sk qoff koff causal fmt pad */
    {"gqa-d64-partial", 2, 4, 2, 64, 64, 129, 200, 300, 250, 1, CP_FORMAT_BSHD, 0},
    {"mha-d128-full", 1, 2, 2, 128, 128, 77, 64, 0, 0, 0, CP_FORMAT_BSHD, 0},
    {"mqa-d256-diag", 1, 4, 1, 256, 256, 64, 96, 0, 0, 1, CP_FORMAT_BSHD, 0},
    {"d40-dv72-padded", 1, 3, 1, 40, 72, 33, 47, 10, 0, 1, CP_FORMAT_BSHD, 0},
    {"hidden", 1, 2, 1, 64, 64, 16, 16, 0, 100, 1, CP_FORMAT_BSHD, 0},
    {"one-row", 1, 2, 2, 128, 128, 1, 7, 6, 0, 1, CP_FORMAT_BSHD, 0},
    {"sbhd-strided", 2, 2, 2, 128, 128, 70, 70, 70, 0, 1, CP_FORMAT_SBHD, 8},
    {"unaligned-rows", 1, 2, 1, 64, 64, 40, 50, 0, 0, 0, CP_FORMAT_BSHD, 1},
    {"d512", 1, 1, 1, 512, 512, 24, 40, 0, 0, 1, CP_FORMAT_BSHD, 0},
    /* several key tiles of the wgmma forward (128 keys each): its K and V
     * buffers rotate, a partial last tile, a diagonal behind the block start */
    {"gqa-d128-negdelta", 1, 4, 2, 128, 128, 600, 600, 0, 40, 1, CP_FORMAT_BSHD, 0},
    {"mqa-d64-tiles", 2, 2, 1, 64, 64, 140, 700, 0, 0, 0, CP_FORMAT_BSHD, 0},
    /* more (row block, head) items than an H200 has SMs: the persistent
     * wgmma forward loops over several items a block (the first row blocks
     * see no key: items without tiles between ones with) */
    {"persistent-d64", 1, 24, 6, 64, 64, 1100, 640, 0, 200, 1, CP_FORMAT_BSHD, 0},
    {"persistent-d128", 1, 8, 8, 128, 128, 2200, 300, 0, 0, 1, CP_FORMAT_BSHD, 0},
    /* more (key block, kv head, batch) items than SMs for the persistent
     * wgmma backward: short items (a few query tiles), GQA heads walked in
     * turn, the last key blocks seen by no query (items without tiles) */
    {"persistent-bwd-d128", 2, 8, 8, 128, 128, 100, 1300, 1000, 0, 1, CP_FORMAT_BSHD, 0},
    {"persistent-bwd-d64", 1, 24, 12, 64, 64, 130, 1500, 1200, 0, 1, CP_FORMAT_BSHD, 0},
    /* head dims past 128 (the wgmma forward's 64-key tiles, the output's
     * columns in two products; 192 / 128 is MLA's shape): several key tiles,
     * partial last ones, and more items than SMs */
    {"mha-d256-tiles", 1, 2, 2, 256, 256, 300, 333, 0, 0, 1, CP_FORMAT_BSHD, 0},
    {"mla-d192-dv128", 2, 4, 2, 192, 128, 200, 270, 0, 30, 1, CP_FORMAT_BSHD, 0},
    {"d160-full-sbhd", 1, 2, 1, 160, 160, 150, 200, 0, 0, 0, CP_FORMAT_SBHD, 0},
    {"persistent-d256", 1, 16, 4, 256, 256, 1300, 700, 0, 100, 1, CP_FORMAT_BSHD, 0},
};
static const cp_dtype dtypes[] = {CP_DTYPE_F32, CP_DTYPE_F16, CP_DTYPE_BF16};
static const char *dtype_name[] = {"f32", "f16", "bf16"};

static void check_case(const blk *c, cp_dtype t, int *failures)
{
    dcase d;
    make_case(&d, c, t);
    const size_t nl = (size_t)c->B * c->H * c->Sq;
    fwd_out f[NPATHS][2];
    bwd_out g[NPATHS][NBWD];
    for (int p = 0; p < NPATHS; p++) {
        dbufs b = upload_case(states[p], &d);
        for (int mode = 0; mode < 2; mode++)
            f[p][mode] = run_forward(states[p], &d, &b, mode);
        for (int mode = 0; mode < NBWD; mode++)
            g[p][mode] = run_backward(states[p], &d, &b, mode);
        free_bufs(states[p], &b);
    }
    /* Accumulating over only hidden keys leaves a row as it was: its poison
     * (NaN) stays, with LSE = -inf. Check that, then compare the rest. */
    int untouched_ok = 1;
    for (int p = 0; p < NPATHS; p++)
        for (int64_t b = 0; b < c->B; b++)
            for (int h = 0; h < c->H; h++)
                for (int64_t i = 0; i < c->Sq; i++) {
                    if (d.lse[((size_t)b * c->H + (size_t)h) * (size_t)c->Sq + (size_t)i] != -INFINITY)
                        continue;
                    double *row = f[p][1].o + dense_at(c->Sq, c->H, c->Dv, b, i, h);
                    for (int e = 0; e < c->Dv; e++) {
                        untouched_ok &= isnan(row[e]);
                        row[e] = 0.0;
                    }
                }
    if (!untouched_ok)
        printf("%s: a row with no visible key was written in accumulate mode  <-- FAIL\n", c->name);
    *failures += !untouched_ok;
    for (int p = 0; p < NPATHS; p++)
        for (int mode = 0; mode < NBWD; mode++) {
            /* forward modes 0, 1 are checked with backward modes 0, 1 */
            const int fm = mode & 1;
            double eo = rel_err(f[p][fm].o, d.o, d.no), el = lse_error(d.lse, f[p][fm].lse, nl);
            double eq = rel_err(g[p][mode].dq, d.dq, d.nq), ek = rel_err(g[p][mode].dk, d.dk, d.nk);
            double ev = rel_err(g[p][mode].dv, d.dv, d.nv);
            /* against the cuBLAS path, relative to the reference's size */
            double xo = rel_err(f[p][fm].o, f[PATH_BLAS][fm].o, d.no);
            double xq = rel_err(g[p][mode].dq, g[PATH_BLAS][mode].dq, d.nq);
            double xk = rel_err(g[p][mode].dk, g[PATH_BLAS][mode].dk, d.nk);
            size_t nonfinite = count_nonfinite(f[p][fm].o, d.no) + count_nonfinite(g[p][mode].dq, d.nq) +
                               count_nonfinite(g[p][mode].dk, d.nk) + count_nonfinite(g[p][mode].dv, d.nv);
            int bad = nonfinite || !(eo <= tol_fwd(t)) || !(el <= 1e-4) || !(eq <= tol_bwd(t)) ||
                      !(ek <= tol_bwd(t)) || !(ev <= tol_bwd(t)) || !(xo <= 2 * tol_fwd(t)) ||
                      !(xq <= 2 * tol_bwd(t)) || !(xk <= 2 * tol_bwd(t));
            printf("%-16s %-4s %-7s %-7s  o %.2e lse %.1e dq %.2e dk %.2e dv %.2e | vs cublas o %.1e dq %.1e dk %.1e%s\n",
                   c->name, dtype_name[t == CP_DTYPE_F32 ? 0 : t == CP_DTYPE_F16 ? 1 : 2], path_name[p],
                   bwd_name[mode], eo, el, eq, ek, ev, xo, xq, xk, bad ? "  <-- FAIL" : "");
            *failures += bad;
        }
    for (int p = 0; p < NPATHS; p++) {
        for (int mode = 0; mode < 2; mode++)
            free(f[p][mode].o), free(f[p][mode].lse);
        for (int mode = 0; mode < NBWD; mode++)
            free(g[p][mode].dq), free(g[p][mode].dk), free(g[p][mode].dv);
    }
    free_case(&d);
}

static void test_attention_matches_fp64(void **unused)
{
    (void)unused;
    int failures = 0;
    /* INFINICP_GPU_TEST_CASES=name limits the cases (for slow checkers) */
    const char *only = getenv("INFINICP_GPU_TEST_CASES");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (size_t t = 0; t < sizeof dtypes / sizeof dtypes[0]; t++)
            if (!only || strstr(cases[i].name, only))
                check_case(&cases[i], dtypes[t], &failures);
    assert_int_equal(failures, 0);
}

/* A block the causal mask hides entirely: O = 0, LSE = -inf, zero
 * gradients (written when not accumulating), nothing NaN. */
static void test_hidden_block_is_exact(void **unused)
{
    (void)unused;
    const blk *c = &cases[4];
    for (int p = 0; p < NPATHS; p++) {
        dcase d;
        make_case(&d, c, CP_DTYPE_BF16);
        dbufs b = upload_case(states[p], &d);
        fwd_out f = run_forward(states[p], &d, &b, 0);
        bwd_out g = run_backward(states[p], &d, &b, 0);
        for (size_t i = 0; i < d.no; i++)
            assert_true(f.o[i] == 0.0);
        for (size_t i = 0; i < (size_t)c->B * c->H * c->Sq; i++)
            assert_true(f.lse[i] == -INFINITY);
        for (size_t i = 0; i < d.nq; i++)
            assert_true(g.dq[i] == 0.0);
        for (size_t i = 0; i < d.nk; i++)
            assert_true(g.dk[i] == 0.0);
        free(f.o), free(f.lse), free(g.dq), free(g.dk), free(g.dv);
        free_bufs(states[p], &b);
        free_case(&d);
    }
}

/* With deterministic = 1 the backward gives identical bits run after run
 * (F32 and storage-type grads); dk and dv, never summed with atomics, are
 * identical in the default mode too. Many key tiles adding into the same dQ
 * rows make a varying order likely to show if atomics were used. */
static void test_backward_deterministic(void **unused)
{
    (void)unused;
    const blk c = {"determinism", 1, 4, 2, 128, 128, 700, 700, 0, 0, 0, CP_FORMAT_BSHD, 0};
    dcase d;
    make_case(&d, &c, CP_DTYPE_BF16);
    const int paths[] = {PATH_DET, PATH_AUTO};
    for (int pi = 0; pi < 2; pi++) {
        void *st = states[paths[pi]];
        dbufs b = upload_case(st, &d);
        for (int mode = BWD_ONE; mode <= BWD_HALVES_F32; mode++) {
            bwd_out g1 = run_backward(st, &d, &b, mode);
            for (int rep = 0; rep < 3; rep++) {
                bwd_out g2 = run_backward(st, &d, &b, mode);
                if (paths[pi] == PATH_DET)
                    assert_memory_equal(g1.dq, g2.dq, d.nq * sizeof(double));
                assert_memory_equal(g1.dk, g2.dk, d.nk * sizeof(double));
                assert_memory_equal(g1.dv, g2.dv, d.nv * sizeof(double));
                free(g2.dq), free(g2.dk), free(g2.dv);
            }
            free(g1.dq), free(g1.dk), free(g1.dv);
        }
        free_bufs(st, &b);
    }
    free_case(&d);
}

/* rowsum(dO * O) kept across key blocks (the default; set here in case the
 * environment holds INFINICP_CUDA_DROW=0): over two
 * key halves, storing it in the first call and reading it in the second
 * gives dK and dV bit for bit as computing it in both, and dQ within fp32
 * atomics' reordering; a shifted buffer that is read changes dQ. */
static void test_backward_drow_reuse(void **unused)
{
    (void)unused;
    setenv("INFINICP_CUDA_DROW", "1", 1);
    void *st = gpu_open(NULL);
    unsetenv("INFINICP_CUDA_DROW");
    assert_non_null(st);
    const blk cases_drow[] = {
        {"drow-gqa-d128", 1, 4, 2, 128, 128, 300, 500, 400, 0, 1, CP_FORMAT_BSHD, 0},
        {"drow-d64-sbhd", 2, 2, 2, 64, 64, 70, 90, 0, 0, 0, CP_FORMAT_SBHD, 8},
    };
    for (size_t ci = 0; ci < sizeof cases_drow / sizeof cases_drow[0]; ci++) {
        const blk *c = &cases_drow[ci];
        dcase d;
        make_case(&d, c, CP_DTYPE_BF16);
        dbufs b = upload_case(st, &d);
        const size_t rows = (size_t)c->B * c->H * c->Sq;
        float *nan_rows = malloc(rows * sizeof(float));
        for (size_t i = 0; i < rows; i++)
            nan_rows[i] = NAN;
        bwd_drow = NULL;
        bwd_out plain = run_backward(st, &d, &b, BWD_HALVES_F32);
        bwd_drow = dev_copy(st, nan_rows, rows * sizeof(float));
        bwd_drow_stored = 0;
        bwd_out reuse = run_backward(st, &d, &b, BWD_HALVES_F32);
        assert_memory_equal(plain.dk, reuse.dk, d.nk * sizeof(double));
        assert_memory_equal(plain.dv, reuse.dv, d.nv * sizeof(double));
        double e = rel_err(reuse.dq, plain.dq, d.nq);
        if (!(e <= 1e-6))
            fail_msg("%s: dQ with the stored rowsum differs by %.3g from computing it", c->name, e);
        /* the stored sums, shifted by 1, then read by both halves */
        float *stored = malloc(rows * sizeof(float));
        download(st, stored, bwd_drow, rows * sizeof(float));
        for (size_t i = 0; i < rows; i++) {
            if (!isfinite(stored[i]))
                fail_msg("%s: row %zu of the stored rowsum is %g", c->name, i, (double)stored[i]);
            stored[i] += 1.0f;
        }
        gpu_ops->free(st, bwd_drow);
        bwd_drow = dev_copy(st, stored, rows * sizeof(float));
        bwd_drow_stored = 1;
        bwd_out shifted = run_backward(st, &d, &b, BWD_HALVES_F32);
        e = rel_err(shifted.dq, plain.dq, d.nq);
        if (!(e > 1e-2))
            fail_msg("%s: dQ from a shifted rowsum is within %.3g of the true one", c->name, e);
        printf("%s: dQ with the stored rowsum within %.2g; with it shifted by 1, %.2g off\n", c->name,
               rel_err(reuse.dq, plain.dq, d.nq), e);
        gpu_ops->free(st, bwd_drow);
        bwd_drow = NULL;
        bwd_drow_stored = 0;
        bwd_out outs[3] = {plain, reuse, shifted};
        for (int i = 0; i < 3; i++)
            free(outs[i].dq), free(outs[i].dk), free(outs[i].dv);
        free(stored);
        free(nan_rows);
        free_bufs(st, &b);
        free_case(&d);
    }
    gpu_ops->close(st);
}

/* ------------------------------------------------------------------------ */
/* Merge, conversion, reduction, copies                                     */
/* ------------------------------------------------------------------------ */

static void test_merge_matches_formula(void **unused)
{
    (void)unused;
    void *st = states[PATH_AUTO];
    const int B = 2, S = 37, H = 3, Dv = 80;
    const size_t n = (size_t)B * S * H * Dv, nl = (size_t)B * H * S;
    double *o1 = malloc(n * sizeof(double)), *o2 = malloc(n * sizeof(double)), *want = malloc(n * sizeof(double));
    float *l1 = malloc(nl * sizeof(float)), *l2 = malloc(nl * sizeof(float)), *lw = malloc(nl * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        o1[i] = cpref_round(uniform(), CP_DTYPE_F32);
        o2[i] = cpref_round(uniform(), CP_DTYPE_BF16);
    }
    for (size_t i = 0; i < nl; i++) {
        /* every combination of empty and non-empty partials */
        l1[i] = i % 5 == 0 ? -INFINITY : (float)(3 * uniform());
        l2[i] = i % 7 == 0 ? -INFINITY : (float)(3 * uniform());
    }
    /* docs/ARCHITECTURE.md, Merge: lse = max + log(sum exp), o = sum exp(lse_i - lse) o_i; an
     * empty partial (-inf) contributes nothing */
    for (int b = 0; b < B; b++)
        for (int s = 0; s < S; s++)
            for (int h = 0; h < H; h++) {
                size_t li = ((size_t)b * H + h) * S + s, oi = (((size_t)b * S + s) * H + h) * Dv;
                double a = l1[li], c = l2[li];
                if (c == -INFINITY) {
                    lw[li] = l1[li];
                    memcpy(want + oi, o1 + oi, Dv * sizeof(double));
                    continue;
                }
                double mx = a > c ? a : c, m = a == -INFINITY ? c : mx + log(exp(a - mx) + exp(c - mx));
                lw[li] = (float)m;
                for (int e = 0; e < Dv; e++)
                    want[oi + e] = (a == -INFINITY ? 0 : exp(a - m) * o1[oi + e]) + exp(c - m) * o2[oi + e];
            }
    float *h1 = malloc(n * sizeof(float));
    uint16_t *h2 = malloc(n * sizeof(uint16_t));
    cpref_store(h1, CP_DTYPE_F32, o1, n);
    cpref_store(h2, CP_DTYPE_BF16, o2, n);
    void *d1 = dev_copy(st, h1, n * 4), *d2 = dev_copy(st, h2, n * 2);
    float *dl1 = dev_copy(st, l1, nl * 4), *dl2 = dev_copy(st, l2, nl * 4);
    cp_kernel_merge_args m = CP_KERNEL_MERGE_ARGS_INIT;
    m.format = CP_FORMAT_BSHD;
    m.batch = B, m.seq = S, m.num_heads = H, m.head_dim_v = Dv;
    m.o = d1, m.o_dtype = CP_DTYPE_F32, m.lse = dl1;
    m.o_part = d2, m.o_part_dtype = CP_DTYPE_BF16, m.lse_part = dl2;
    assert_int_equal(gpu_ops->merge(st, &m), CP_SUCCESS);
    download(st, h1, d1, n * 4);
    download(st, l1, dl1, nl * 4);
    double *got = malloc(n * sizeof(double));
    cpref_load(got, h1, CP_DTYPE_F32, n);
    assert_true(rel_err(got, want, n) < 1e-6);
    for (size_t i = 0; i < nl; i++) {
        if (lw[i] == -INFINITY)
            assert_true(l1[i] == -INFINITY);
        else
            assert_true(fabsf(l1[i] - lw[i]) <= 1e-6f * (1 + fabsf(lw[i])));
    }
    gpu_ops->free(st, d1), gpu_ops->free(st, d2), gpu_ops->free(st, dl1), gpu_ops->free(st, dl2);
    free(o1), free(o2), free(want), free(l1), free(l2), free(lw), free(h1), free(h2), free(got);
}

static void test_convert_and_reduce_exact(void **unused)
{
    (void)unused;
    void *st = states[PATH_AUTO];
    const cp_dtype all[] = {CP_DTYPE_F32, CP_DTYPE_F16, CP_DTYPE_BF16, CP_DTYPE_F64};
    const size_t n = 100003;
    double *x = malloc(n * sizeof(double)), *y = malloc(n * sizeof(double)), *got = malloc(n * sizeof(double));
    unsigned char *hs = malloc(n * 8), *hd = malloc(n * 8);
    void *ds = dev_alloc(st, n * 8), *dd = dev_alloc(st, n * 8);
    for (size_t si = 0; si < 4; si++) {
        const cp_dtype s = all[si];
        for (size_t i = 0; i < n; i++)
            x[i] = cpref_round(300.0 * uniform() * uniform() * uniform(), s);
        cpref_store(hs, s, x, n);
        upload(st, ds, hs, n * cpref_dtype_size(s));
        /* off 0: 16-byte aligned (the eight-wide path between F32 and 16-bit
         * types, n % 8 = 3 left over); off 1: one element in (one-wide) */
        for (size_t di = 0; di < 4 * 2; di++) {
            const cp_dtype t = all[di % 4];
            const size_t off = di / 4, ss = cpref_dtype_size(s), ts = cpref_dtype_size(t);
            assert_int_equal(gpu_ops->convert(st, (char *)dd + off * ts, t, (char *)ds + off * ss, s, n - off),
                             CP_SUCCESS);
            download(st, hd, dd, n * ts);
            cpref_load(got, hd, t, n);
            for (size_t i = off; i < n; i++)
                if (got[i] != cpref_round(x[i], t))
                    fail_msg("convert %d -> %d (offset %zu): element %zu = %.17g, want %.17g", (int)s, (int)t, off,
                             i, got[i], cpref_round(x[i], t));
        }
        /* reduce: sum in fp32 (fp64 for F64), and max */
        for (int op = 0; op < 2; op++) {
            for (size_t i = 0; i < n; i++)
                y[i] = cpref_round(300.0 * uniform() * uniform(), s);
            cpref_store(hd, s, y, n);
            upload(st, dd, hd, n * cpref_dtype_size(s));
            assert_int_equal(gpu_ops->reduce(st, dd, ds, s, n, op ? CP_REDUCE_MAX : CP_REDUCE_SUM), CP_SUCCESS);
            download(st, hd, dd, n * cpref_dtype_size(s));
            cpref_load(got, hd, s, n);
            for (size_t i = 0; i < n; i++) {
                double want = op ? (x[i] > y[i] ? x[i] : y[i])
                                 : (s == CP_DTYPE_F64 ? y[i] + x[i] : cpref_round((float)(y[i] + x[i]), s));
                if (got[i] != want)
                    fail_msg("reduce op %d dtype %d: element %zu = %.17g, want %.17g", op, (int)s, i, got[i],
                             want);
            }
        }
    }
    gpu_ops->free(st, ds), gpu_ops->free(st, dd);
    free(x), free(y), free(got), free(hs), free(hd);
}

static void test_copies_and_memset(void **unused)
{
    (void)unused;
    void *st = states[PATH_AUTO];
    enum { W = 37, H = 19, SP = 53, DP = 64 };
    unsigned char src[H * SP], back[H * DP], want[H * DP];
    for (int i = 0; i < H * SP; i++)
        src[i] = (unsigned char)(uniform() * 127 + 128);
    void *d1 = dev_alloc(st, H * DP), *d2 = dev_alloc(st, H * DP);
    assert_int_equal(gpu_ops->memset(st, d1, 0xab, H * DP), CP_SUCCESS);
    /* host rows of pitch SP into device rows of pitch DP, then device to
     * device, then back */
    assert_int_equal(gpu_ops->copy_2d(st, d1, DP, src, SP, W, H, CP_COPY_HOST_TO_DEVICE), CP_SUCCESS);
    assert_int_equal(gpu_ops->copy_2d(st, d2, DP, d1, DP, DP, H, CP_COPY_DEVICE_TO_DEVICE), CP_SUCCESS);
    assert_int_equal(gpu_ops->copy_2d(st, back, DP, d2, DP, DP, H, CP_COPY_DEVICE_TO_HOST), CP_SUCCESS);
    assert_int_equal(gpu_ops->synchronize(st), CP_SUCCESS);
    for (int r = 0; r < H; r++)
        for (int c = 0; c < DP; c++)
            want[r * DP + c] = c < W ? src[r * SP + c] : 0xab;
    assert_memory_equal(back, want, sizeof want);
    /* Device to device on stream 0 runs as a kernel, in 1-, 4- or 16-byte
     * pieces by the alignment of the pointers, pitches and width: rows of
     * d1 (now `back`) into d2 at offsets and pitches that pick each. */
    static const struct {
        size_t doff, dpitch, soff, spitch, width, height;
    } cs[] = {
        {3, 61, 1, DP, 37, H - 1}, {4, 40, 8, DP, 36, H - 1}, {16, DP, 0, DP, 48, H - 1}, {0, DP, 0, DP, DP, H},
    };
    unsigned char got[H * DP];
    for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++) {
        assert_int_equal(gpu_ops->memset(st, d2, 0x5a, H * DP), CP_SUCCESS);
        assert_int_equal(gpu_ops->copy_2d(st, (char *)d2 + cs[k].doff, cs[k].dpitch, (char *)d1 + cs[k].soff,
                                          cs[k].spitch, cs[k].width, cs[k].height, CP_COPY_DEVICE_TO_DEVICE),
                         CP_SUCCESS);
        assert_int_equal(gpu_ops->copy_2d(st, got, DP, d2, DP, DP, H, CP_COPY_DEVICE_TO_HOST), CP_SUCCESS);
        assert_int_equal(gpu_ops->synchronize(st), CP_SUCCESS);
        memset(want, 0x5a, sizeof want);
        for (size_t r = 0; r < cs[k].height; r++)
            memcpy(want + cs[k].doff + r * cs[k].dpitch, back + cs[k].soff + r * cs[k].spitch, cs[k].width);
        if (memcmp(got, want, sizeof want))
            fail_msg("device copy case %zu (offsets %zu / %zu, pitches %zu / %zu, width %zu) differs", k,
                     cs[k].doff, cs[k].soff, cs[k].dpitch, cs[k].spitch, cs[k].width);
    }
    gpu_ops->free(st, d1), gpu_ops->free(st, d2);
}

/* Work on an auxiliary stream, ordered back onto stream 0 by an event. */
static void test_streams_and_events(void **unused)
{
    (void)unused;
    void *st = states[PATH_AUTO];
    assert_true(CP_BACKEND_HAS(gpu_ops, stream_select) && CP_BACKEND_HAS(gpu_ops, event_wait));
    const size_t n = 1 << 22;
    float *h = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) /* small integers: 8 h stays exact in fp32 */
        h[i] = (float)(i % 4096);
    void *a = dev_copy(st, h, n * 4), *b = dev_alloc(st, n * 4);
    assert_int_equal(gpu_ops->synchronize(st), CP_SUCCESS);
    void *ev;
    assert_int_equal(gpu_ops->event_create(st, &ev), CP_SUCCESS);
    assert_int_equal(gpu_ops->stream_select(st, 1), CP_SUCCESS);
    assert_int_equal(gpu_ops->memset(st, b, 0, n * 4), CP_SUCCESS);
    for (int i = 0; i < 8; i++) /* b = 8 a, slowly, on stream 1 */
        assert_int_equal(gpu_ops->reduce(st, b, a, CP_DTYPE_F32, n, CP_REDUCE_SUM), CP_SUCCESS);
    assert_int_equal(gpu_ops->event_record(st, ev), CP_SUCCESS);
    assert_int_equal(gpu_ops->stream_select(st, 0), CP_SUCCESS);
    assert_int_equal(gpu_ops->event_wait(st, ev), CP_SUCCESS);
    download(st, h, b, n * 4);
    for (size_t i = 0; i < n; i++)
        if (h[i] != 8.0f * (float)(i % 4096))
            fail_msg("element %zu = %g, want %g", i, h[i], 8.0f * (float)(i % 4096));
    gpu_ops->event_destroy(st, ev);
    gpu_ops->free(st, a), gpu_ops->free(st, b);
    free(h);
}

static void test_bad_arguments(void **unused)
{
    (void)unused;
    void *st = states[PATH_AUTO];
    float x[4] = {0};
    EXPECT_ERROR(gpu_ops->convert(st, x, (cp_dtype)7, x, CP_DTYPE_F32, 4), CP_ERROR_INVALID_ARGUMENT, "dtype");
    EXPECT_ERROR(gpu_ops->reduce(st, x, x, CP_DTYPE_F32, 4, (cp_reduce_op)9), CP_ERROR_INVALID_ARGUMENT, "op = 9");
    EXPECT_ERROR(gpu_ops->stream_select(st, 9), CP_ERROR_INVALID_ARGUMENT, "index = 9");
    EXPECT_ERROR(gpu_ops->copy_2d(st, x, 4, x, 4, 4, 1, (cp_copy_kind)5), CP_ERROR_INVALID_ARGUMENT, "kind = 5");

    cp_kernel_attn_args a = CP_KERNEL_ATTN_ARGS_INIT;
    a.dtype = CP_DTYPE_F64;
    a.batch = 1, a.num_heads = 1, a.num_kv_heads = 1, a.head_dim = 64, a.seq_q = 1, a.seq_k = 1;
    size_t ws;
    EXPECT_ERROR(gpu_ops->attn_workspace_size(st, &a, 0, &ws), CP_ERROR_UNSUPPORTED, "a->dtype = 3");
    a.dtype = CP_DTYPE_BF16;
    a.o_dtype = CP_DTYPE_F16;
    EXPECT_ERROR(gpu_ops->attn_forward(st, &a), CP_ERROR_INVALID_ARGUMENT, "a->o_dtype = 1");
    a.o_dtype = CP_DTYPE_BF16;
    a.num_kv_heads = 3;
    EXPECT_ERROR(gpu_ops->attn_forward(st, &a), CP_ERROR_INVALID_ARGUMENT, "num_kv_heads 3");

    /* the cuBLAS path needs a workspace: one byte short is refused */
    const blk c = {"ws", 1, 1, 1, 64, 64, 8, 8, 0, 0, 0, CP_FORMAT_BSHD, 0};
    dcase d;
    make_case(&d, &c, CP_DTYPE_F32);
    void *bs = states[PATH_BLAS];
    dbufs b = upload_case(bs, &d);
    cp_kernel_attn_args f = base_args(&d, &b, 0, c.Sk);
    f.o = b.o_in, f.o_dtype = CP_DTYPE_F32, f.lse = b.lse_in;
    assert_int_equal(gpu_ops->attn_workspace_size(bs, &f, 0, &ws), CP_SUCCESS);
    assert_true(ws > 0);
    void *w = dev_alloc(bs, ws);
    f.workspace = w, f.workspace_bytes = ws - 1;
    EXPECT_ERROR(gpu_ops->attn_forward(bs, &f), CP_ERROR_INVALID_ARGUMENT, "workspace_bytes");
    gpu_ops->free(bs, w);
    free_bufs(bs, &b);
    free_case(&d);
}

static void test_comm_create_rejects_unknown_kind(void **unused)
{
    (void)unused;
    cp_comm *c = (cp_comm *)&c;
    assert_true(CP_BACKEND_HAS(gpu_ops, comm_create));
    EXPECT_ERROR(gpu_ops->comm_create("gloo", &c, &c), CP_ERROR_UNSUPPORTED, "gloo");
    assert_null(c);
}

int main(void)
{
    for (int p = 0; p < NPATHS; p++) {
        states[p] = gpu_open(p == PATH_AUTO ? NULL : path_name[p]);
        if (!states[p])
            return GPU_SKIP;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_attention_matches_fp64),
        cmocka_unit_test(test_hidden_block_is_exact),
        cmocka_unit_test(test_backward_deterministic),
        cmocka_unit_test(test_backward_drow_reuse),
        cmocka_unit_test(test_merge_matches_formula),
        cmocka_unit_test(test_convert_and_reduce_exact),
        cmocka_unit_test(test_copies_and_memset),
        cmocka_unit_test(test_streams_and_events),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_comm_create_rejects_unknown_kind),
    };
    int r = cmocka_run_group_tests_name("gpu-kernels", tests, NULL, NULL);
    for (int p = 0; p < NPATHS; p++)
        gpu_ops->close(states[p]);
    return r;
}
