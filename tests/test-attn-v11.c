/* SPDX-License-Identifier: MIT */
/*
 * API 1.1 end to end: packed documents, sliding windows, softcaps and sinks
 * under every CP mode, forward and backward, against the FP64 model of
 * attn_model.h (document masks, windows, softcap, sinks and their
 * gradient), written apart from the library. Each configuration runs at
 * CP=1 and CP=P on the same inputs: the error at CP=P must stay within 1.25x
 * of CP=1's (CP adds no error), and CP=1's within a bound per dtype.
 *
 * Documents are random (length-1 documents, one spanning every rank,
 * boundaries on chunk edges), windows random (1, inside a chunk, larger
 * than a rank's share, larger than T); every mode, the hybrid's
 * factorisations, tp = 2 strided groups, both formats for dense layouts,
 * every dtype, MHA and GQA, every balance. Ranks that pass different packs
 * get CP_ERROR_MISMATCH.
 *
 * The GPU build (-DCPRUN_CUDA, suite gpu: gpu-attn-v11) runs the same
 * matrix with every rank a thread with its own CUDA context on the one GPU
 * (as gpu-attn), the tensors in device memory of the rank's context; it
 * skips (exit 77, saying why) without the CUDA module, a driver or a GPU.
 * There the CP=1 bounds of the gradients are test-gpu-kernels.c's (relative
 * RMS 2e-5 / 6e-3 / 4e-2 for F32 / F16 / BF16: the tensor-core backward
 * rounds dS to the storage type for its products) where they are wider
 * than the CPU's; CP=P within 1.25x of CP=1 as on the CPU. Sinks run on a
 * device whose backend has row_dot (the CUDA module since 1.2); the GPU
 * build asks once, and where a plan with sinks is refused
 * (CP_ERROR_UNSUPPORTED naming the sinks) it says so and runs each
 * configuration with sinks without them. test_sinks_on_a_device runs them
 * on the asynchronous pretend device of fakeasync.c in the CPU build.
 *
 * INFINICP_TEST_DTYPES=bf16,f16 (any of f32, f16, bf16) runs only the
 * configurations of those types and says which it skipped: for kernels
 * that do not have every type yet. Unset: every type.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <infinicp/infinicp.h>

#include "attn/ring.h"
#include "attn_model.h"
#include "cpref.h"
#include "cprun.h"
#include "devmem.h"
#include "fakeasync.h"
#include "world.h"

/* ---- one configuration ---------------------------------------------- */

typedef struct cfg {
    cp_mode mode;
    cp_layout layout; /* CP_LAYOUT_PACKED: the documents below */
    cp_dtype dtype;
    cp_format format;
    cp_mask mask;
    int P, A, strided;
    int64_t B, S;
    int H, Hkv, D, Dv;
    int64_t window;
    double softcap;
    int sinks;
    int ndocs;
    int64_t cu[64];
    cp_balance balance;
    int64_t chunk;
} cfg;

/* Global data in double ([B][S][heads][dim]) and results. */
typedef struct data {
    double *q, *k, *v, *dout, *sinks;
    double dsinks_scale; /* sqrt(sum_h (sum_i |exp(sink_h - lse_i) rowsum(dout_i * o_i)|)^2): the sum's size
                          * without its cancellation */
    double *out, *lse, *dq, *dk, *dv, *dsinks; /* a run's, or the model's */
} data;

static size_t n_q(const cfg *c) { return (size_t)(c->B * c->S * c->H * c->D); }
static size_t n_k(const cfg *c) { return (size_t)(c->B * c->S * c->Hkv * c->D); }
static size_t n_v(const cfg *c) { return (size_t)(c->B * c->S * c->Hkv * c->Dv); }
static size_t n_o(const cfg *c) { return (size_t)(c->B * c->S * c->H * c->Dv); }
static size_t n_l(const cfg *c) { return (size_t)(c->B * c->H * c->S); }

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static double uni(uint64_t *s)
{
    return (double)(rng_next(s) >> 11) * 0x1.0p-53 * 2 - 1;
}

static double *alloc_d(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof *p);
    assert_non_null(p);
    return p;
}

static void results_alloc(const cfg *c, data *d)
{
    d->out = alloc_d(n_o(c));
    d->lse = alloc_d(n_l(c));
    d->dq = alloc_d(n_q(c));
    d->dk = alloc_d(n_k(c));
    d->dv = alloc_d(n_v(c));
    d->dsinks = alloc_d((size_t)c->H);
}

static void results_free(data *d)
{
    free(d->out);
    free(d->lse);
    free(d->dq);
    free(d->dk);
    free(d->dv);
    free(d->dsinks);
}

static size_t global_at(const cfg *c, int heads, int dim, int64_t b, int64_t p, int h, int e);

/* Inputs rounded to the storage type, and the model's results. */
static void make_data(const cfg *c, uint64_t seed, data *d)
{
    memset(d, 0, sizeof *d);
    d->q = alloc_d(n_q(c));
    d->k = alloc_d(n_k(c));
    d->v = alloc_d(n_v(c));
    d->dout = alloc_d(n_o(c));
    d->sinks = alloc_d((size_t)c->H);
    uint64_t s = seed;
    for (size_t i = 0; i < n_q(c); i++)
        d->q[i] = cpref_round(2 * uni(&s), c->dtype);
    for (size_t i = 0; i < n_k(c); i++)
        d->k[i] = cpref_round(2 * uni(&s), c->dtype);
    for (size_t i = 0; i < n_v(c); i++)
        d->v[i] = cpref_round(uni(&s), c->dtype);
    for (size_t i = 0; i < n_o(c); i++)
        d->dout[i] = cpref_round(uni(&s), c->dtype);
    for (int h = 0; h < c->H; h++)
        d->sinks[h] = (float)(1.5 * uni(&s));
    results_alloc(c, d);
    const model_shape m = { .batch = c->B, .seq_q = c->S, .seq_k = c->S, .heads = c->H, .kv_heads = c->Hkv,
                            .head_dim = c->D, .head_dim_v = c->Dv, .causal = c->mask == CP_MASK_CAUSAL,
                            .scale = 1.0 / sqrt((double)c->D) };
    const model_ext x = { .window = c->window, .softcap = c->softcap,
                          .cu = c->layout == CP_LAYOUT_PACKED ? c->cu : NULL, .ndocs = c->ndocs,
                          .sinks = c->sinks ? d->sinks : NULL };
    model_forward_ex(&m, &x, d->q, d->k, d->v, d->out, d->lse);
    /* the backward from the forward's results as the library stores them */
    double *o16 = alloc_d(n_o(c)), *l32 = alloc_d(n_l(c));
    for (size_t i = 0; i < n_o(c); i++)
        o16[i] = cpref_round(d->out[i], c->dtype);
    for (size_t i = 0; i < n_l(c); i++)
        l32[i] = (float)d->lse[i];
    model_backward_ex(&m, &x, d->q, d->k, d->v, o16, l32, d->dout, d->dq, d->dk, d->dv, c->sinks ? d->dsinks : NULL);
    double ss = 0;
    for (int h = 0; h < c->H; h++) {
        double a = 0;
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t i = 0; i < c->S; i++) {
                double D = 0;
                for (int e = 0; e < c->Dv; e++)
                    D += d->dout[global_at(c, c->H, c->Dv, b, i, h, e)] * o16[global_at(c, c->H, c->Dv, b, i, h, e)];
                a += fabs(exp(d->sinks[h] - l32[((size_t)b * (size_t)c->H + (size_t)h) * (size_t)c->S + (size_t)i]) * D);
            }
        ss += a * a;
    }
    d->dsinks_scale = sqrt(ss);
    free(o16);
    free(l32);
}

static void data_free(data *d)
{
    free(d->q);
    free(d->k);
    free(d->v);
    free(d->dout);
    free(d->sinks);
    results_free(d);
}

/* ---- one rank ------------------------------------------------------- */

typedef struct run {
    const cfg *c;
    const data *d;
    data res;          /* gathered results */
    int bad_pack_rank; /* >= 0: that rank's pack has other documents */
    pthread_mutex_t lock;
} run;

/* Element (b, local token t, h, e) of a local tensor in the run's format. */
static size_t local_at(const cfg *c, int64_t Sl, int heads, int dim, int64_t b, int64_t t, int h, int e)
{
    if (c->format == CP_FORMAT_SBHD)
        return (((size_t)t * (size_t)c->B + (size_t)b) * (size_t)heads + (size_t)h) * (size_t)dim + (size_t)e;
    return (((size_t)b * (size_t)Sl + (size_t)t) * (size_t)heads + (size_t)h) * (size_t)dim + (size_t)e;
}

static size_t global_at(const cfg *c, int heads, int dim, int64_t b, int64_t p, int h, int e)
{
    return (((size_t)b * (size_t)c->S + (size_t)p) * (size_t)heads + (size_t)h) * (size_t)dim + (size_t)e;
}

static void *shard(const cfg *c, const double *g, const int64_t *pos, int64_t Sl, int heads, int dim)
{
    const size_t n = (size_t)(c->B * Sl * heads * dim);
    double *tmp = alloc_d(n);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t t = 0; t < Sl; t++)
            for (int h = 0; h < heads; h++)
                for (int e = 0; e < dim; e++)
                    tmp[local_at(c, Sl, heads, dim, b, t, h, e)] = g[global_at(c, heads, dim, b, pos[t], h, e)];
    void *out = calloc(n ? n : 1, cpref_dtype_size(c->dtype));
    assert_non_null(out);
    cpref_store(out, c->dtype, tmp, n);
    free(tmp);
    return out;
}

static void unshard(const cfg *c, const void *local, const int64_t *pos, int64_t Sl, int heads, int dim, double *g)
{
    const size_t n = (size_t)(c->B * Sl * heads * dim);
    double *tmp = alloc_d(n);
    cpref_load(tmp, local, c->dtype, n);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t t = 0; t < Sl; t++)
            for (int h = 0; h < heads; h++)
                for (int e = 0; e < dim; e++)
                    g[global_at(c, heads, dim, b, pos[t], h, e)] = tmp[local_at(c, Sl, heads, dim, b, t, h, e)];
    free(tmp);
}

static cp_status make_pack(const cfg *c, int other, cp_pack **pk)
{
    int64_t cu[64];
    memcpy(cu, c->cu, sizeof cu);
    if (other && c->ndocs > 1)
        cu[1] = cu[1] + 1 < cu[2] ? cu[1] + 1 : cu[1] - 1 > 0 ? cu[1] - 1 : cu[1];
    else if (other)
        return CP_ERROR_INTERNAL;
    cp_pack_config pc = CP_PACK_CONFIG_INIT;
    pc.cp_size = c->P;
    pc.cu_seqlens = cu;
    pc.num_seqs = c->ndocs;
    pc.mask = c->mask;
    pc.window = c->window;
    pc.balance = c->balance;
    pc.chunk = c->chunk;
    return cp_pack_create(&pc, pk);
}

/* Where the ranks' contexts are: NULL for cprun_device, else a pretend
 * device (test_sinks_on_a_device). */
static const fixture_device *pretend;

static void rank_main(world_rank *r, void *arg)
{
    run *u = arg;
    const cfg *c = u->c;
    const data *d = u->d;
    cp_attn_desc desc = CP_ATTN_DESC_INIT;
    desc.dtype = c->dtype;
    desc.format = c->format;
    desc.batch = c->B;
    desc.seq_len = c->S;
    desc.num_heads = c->H;
    desc.num_kv_heads = c->Hkv;
    desc.head_dim = c->D;
    desc.head_dim_v = c->Dv;
    desc.mask = c->mask;
    desc.layout = c->layout;
    desc.mode = c->mode;
    desc.window = c->window;
    desc.softcap = c->softcap;
    desc.sinks = c->sinks;
    cp_context_config cc = CP_CONTEXT_CONFIG_INIT;
    cc.num_threads = 1;
    cc.device = cprun_device;
    cp_group_config gc = CP_GROUP_CONFIG_INIT;
    gc.a2a_size = c->mode == CP_MODE_A2A_P2P ? c->A : 1;
    gc.timeout_ms = 60000;
    fixture_cfg fc = { .context = &cc, .device = pretend, .group = &gc, .desc = &desc };
    if (c->strided) {
        fc.split = 1;
        fc.color = r->rank % 2;
        fc.key = r->rank / 2;
    }
    if (fixture_open(r, &fc) != CP_SUCCESS)
        return;
    const int rank = r->fx.rank;
    const int64_t Sl = c->S / c->P;
    int64_t *pos = calloc((size_t)Sl, sizeof *pos);
    cp_pack *pk = NULL;
    cp_status s;
    if (c->layout == CP_LAYOUT_PACKED) {
        s = make_pack(c, rank == u->bad_pack_rank, &pk);
        if (world_fail(r, s, "cp_pack_create") != CP_SUCCESS)
            goto out;
        s = cp_pack_positions(pk, rank, pos, NULL, NULL);
    } else {
        s = cp_layout_positions(c->layout, c->P, rank, c->S, pos);
    }
    if (world_fail(r, s, "positions") != CP_SUCCESS)
        goto out;
    void *q = shard(c, d->q, pos, Sl, c->H, c->D), *k = shard(c, d->k, pos, Sl, c->Hkv, c->D),
         *v = shard(c, d->v, pos, Sl, c->Hkv, c->Dv), *dout = shard(c, d->dout, pos, Sl, c->H, c->Dv);
    const size_t es = cpref_dtype_size(c->dtype);
    void *o = calloc(n_o(c) / (size_t)c->P, es), *dq = calloc(n_q(c) / (size_t)c->P, es),
         *dk = calloc(n_k(c) / (size_t)c->P, es), *dv = calloc(n_v(c) / (size_t)c->P, es);
    float *lse = calloc(n_l(c) / (size_t)c->P, sizeof *lse), sinks[64], dsinks[64];
    for (int h = 0; h < c->H; h++)
        sinks[h] = (float)d->sinks[h];
    /* the tensors on the context's device (the host buffers themselves on
     * the CPU); sinks too, like every tensor of the call */
    cp_context *ctx = r->fx.ctx;
    enum { BQ, BK, BV, BDOUT, BO, BDQ, BDK, BDV, BLSE, BSINKS, BDSINKS, NB };
    void *const host[NB] = { q, k, v, dout, o, dq, dk, dv, lse, c->sinks ? sinks : NULL, c->sinks ? dsinks : NULL };
    const size_t bytes[NB] = { n_q(c) / (size_t)c->P * es,       n_k(c) / (size_t)c->P * es,
                               n_v(c) / (size_t)c->P * es,       n_o(c) / (size_t)c->P * es,
                               n_o(c) / (size_t)c->P * es,       n_q(c) / (size_t)c->P * es,
                               n_k(c) / (size_t)c->P * es,       n_v(c) / (size_t)c->P * es,
                               n_l(c) / (size_t)c->P * sizeof(float), (size_t)c->H * sizeof(float),
                               (size_t)c->H * sizeof(float) };
    void *dev[NB] = { NULL };
    for (int i = 0; i < NB; i++)
        if (world_fail(r, devmem_put(ctx, host[i], bytes[i], &dev[i]), "copy to the device") != CP_SUCCESS)
            goto free_all;
    cp_attn_args x = CP_ATTN_ARGS_INIT;
    x.pack = pk;
    x.sinks = dev[BSINKS];
    x.dsinks = dev[BDSINKS];
    s = cp_attn_forward_ex(r->fx.plan, dev[BQ], dev[BK], dev[BV], dev[BO], dev[BLSE], &x);
    if (u->bad_pack_rank >= 0) {
        /* every rank fails, none hangs */
        if (s != CP_ERROR_MISMATCH)
            world_fail(r, s == CP_SUCCESS ? CP_ERROR_INTERNAL : s, "cp_attn_forward_ex with different packs");
        goto free_all;
    }
    if (world_fail(r, s, "cp_attn_forward_ex") != CP_SUCCESS)
        goto free_all;
    s = cp_attn_backward_ex(r->fx.plan, dev[BQ], dev[BK], dev[BV], dev[BO], dev[BLSE], dev[BDOUT], dev[BDQ],
                            dev[BDK], dev[BDV], &x);
    if (world_fail(r, s, "cp_attn_backward_ex") != CP_SUCCESS)
        goto free_all;
    for (int i = BO; i < NB; i++)
        if (world_fail(r, devmem_get(ctx, host[i], dev[i], bytes[i]), "copy to the host") != CP_SUCCESS)
            goto free_all;
    if (!c->strided || r->rank % 2 == 0) {
        pthread_mutex_lock(&u->lock);
        unshard(c, o, pos, Sl, c->H, c->Dv, u->res.out);
        unshard(c, dq, pos, Sl, c->H, c->D, u->res.dq);
        unshard(c, dk, pos, Sl, c->Hkv, c->D, u->res.dk);
        unshard(c, dv, pos, Sl, c->Hkv, c->Dv, u->res.dv);
        for (int64_t b = 0; b < c->B; b++)
            for (int h = 0; h < c->H; h++)
                for (int64_t t = 0; t < Sl; t++)
                    u->res.lse[((size_t)b * (size_t)c->H + (size_t)h) * (size_t)c->S + (size_t)pos[t]] =
                        lse[((size_t)b * (size_t)c->H + (size_t)h) * (size_t)Sl + (size_t)t];
        for (int h = 0; c->sinks && h < c->H; h++)
            u->res.dsinks[h] += dsinks[h]; /* each rank's share of its queries */
        pthread_mutex_unlock(&u->lock);
    }
free_all:
    for (int i = 0; i < NB; i++)
        devmem_free(ctx, dev[i], host[i]);
    free(q);
    free(k);
    free(v);
    free(dout);
    free(o);
    free(dq);
    free(dk);
    free(dv);
    free(lse);
out:
    cp_pack_destroy(pk);
    free(pos);
}

/* ---- errors --------------------------------------------------------- */

enum { E_OUT, E_LSE, E_DQ, E_DK, E_DV, E_DSINK, NERR };
static const char *err_names[NERR] = { "out", "lse", "dq", "dk", "dv", "dsinks" };

static double rel_rms(const double *x, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += (x[i] - ref[i]) * (x[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void errors(const cfg *c, const data *ref, const data *got, double e[NERR])
{
    e[E_OUT] = rel_rms(got->out, ref->out, n_o(c));
    e[E_LSE] = rel_rms(got->lse, ref->lse, n_l(c));
    e[E_DQ] = rel_rms(got->dq, ref->dq, n_q(c));
    e[E_DK] = rel_rms(got->dk, ref->dk, n_k(c));
    e[E_DV] = rel_rms(got->dv, ref->dv, n_v(c));
    /* against the terms' size: the sum cancels, and the outputs it is made
     * of are rounded to the storage type, where CP moves a rounding by an
     * ulp here and there */
    double num = 0;
    for (int h = 0; c->sinks && h < c->H; h++)
        num += (got->dsinks[h] - ref->dsinks[h]) * (got->dsinks[h] - ref->dsinks[h]);
    e[E_DSINK] = c->sinks && ref->dsinks_scale > 0 ? sqrt(num) / ref->dsinks_scale : 0;
}

static const char *dtype_name(cp_dtype t)
{
    return t == CP_DTYPE_F32 ? "F32" : t == CP_DTYPE_F16 ? "F16" : "BF16";
}

static const char *mode_name(cp_mode m)
{
    static const char *n[] = { "all_gather", "p2p", "a2a", "a2a_p2p" };
    return n[m];
}

static void describe(const cfg *c, char *buf, size_t n)
{
    int w = snprintf(buf, n, "%s P=%d A=%d%s %s %s %s %s B=%lld S=%lld H=%d/%d D=%d/%d W=%lld cap=%g sinks=%d",
                     mode_name(c->mode), c->P, c->A, c->strided ? " strided" : "",
                     c->layout == CP_LAYOUT_PACKED ? "packed" : c->layout == CP_LAYOUT_ZIGZAG ? "zigzag" : "contiguous",
                     dtype_name(c->dtype), c->format ? "SBHD" : "BSHD", c->mask ? "causal" : "nomask",
                     (long long)c->B, (long long)c->S, c->H, c->Hkv, c->D, c->Dv, (long long)c->window, c->softcap,
                     c->sinks);
    if (c->layout == CP_LAYOUT_PACKED && w > 0 && (size_t)w < n) {
        w += snprintf(buf + w, n - (size_t)w, " balance=%d chunk=%lld docs=", (int)c->balance, (long long)c->chunk);
        for (int i = 1; i <= c->ndocs && w > 0 && (size_t)w < n; i++)
            w += snprintf(buf + w, n - (size_t)w, "%lld%s", (long long)(c->cu[i] - c->cu[i - 1]),
                          i < c->ndocs ? "," : "");
    }
}

static cp_status run_cfg(const cfg *c, const data *d, int bad_pack_rank, data *res, char *err, size_t errn)
{
    run u = { .c = c, .d = d, .bad_pack_rank = bad_pack_rank };
    pthread_mutex_init(&u.lock, NULL);
    results_alloc(c, &u.res);
    world w;
    cp_status s = world_run(&w, c->strided ? 2 * c->P : c->P, NULL, rank_main, &u);
    if (s != CP_SUCCESS)
        snprintf(err, errn, "%s", w.error);
    pthread_mutex_destroy(&u.lock);
    *res = u.res;
    return s;
}

static double cp1_bound(cp_dtype t)
{
    return t == CP_DTYPE_BF16 ? 4 * 0x1.0p-8 : t == CP_DTYPE_F16 ? 4 * 0x1.0p-11 : 2e-5;
}

/* The CP=1 bound of tensor e: cp1_bound, or on the GPU test-gpu-kernels.c's
 * relative RMS bound where that is wider (forward F32 / F16 / BF16 1e-5 /
 * 2e-3 / 1.5e-2, backward 2e-5 / 6e-3 / 4e-2). */
static double cp1_bound_of(cp_dtype t, int e)
{
    if (cprun_device == CP_DEVICE_CPU)
        return cp1_bound(t);
    const int bwd = e == E_DQ || e == E_DK || e == E_DV;
    const double gpu = bwd ? (t == CP_DTYPE_F32 ? 2e-5 : t == CP_DTYPE_F16 ? 6e-3 : 4e-2)
                           : (t == CP_DTYPE_F32 ? 1e-5 : t == CP_DTYPE_F16 ? 2e-3 : 1.5e-2);
    return fmax(cp1_bound(t), gpu);
}

static double ratio_floor(cp_dtype t)
{
    return t == CP_DTYPE_F32 ? 1e-9 : 1e-6;
}

/* The largest CP=P / CP=1 error ratio seen per tensor (reported). */
static double worst_ratio[NERR];

/* Configurations with sinks that ran without them (CUDA contexts). */
static int sinks_dropped;

static void report_ratios(const char *what)
{
    print_message("%s: worst CP=P / CP=1 error ratio: out %.3f lse %.3f dq %.3f dk %.3f dv %.3f dsinks %.3f\n", what,
                  worst_ratio[0], worst_ratio[1], worst_ratio[2], worst_ratio[3], worst_ratio[4], worst_ratio[5]);
    memset(worst_ratio, 0, sizeof worst_ratio);
    if (sinks_dropped)
        print_message("%s: %d configurations with sinks ran without them (sinks: CPU contexts only)\n", what,
                      sinks_dropped);
    sinks_dropped = 0;
}

/*
 * Whether plans with sinks run on cprun_device: on the CPU they do; on the
 * GPU the library is asked once, with a one-rank plan, and must refuse them
 * with CP_ERROR_UNSUPPORTED naming the sinks (sinks.c is host code), or
 * accept them.
 */
static int sinks_run_here(void)
{
    static int known = -1;
    if (cprun_device == CP_DEVICE_CPU)
        return 1;
    if (known >= 0)
        return known;
    cp_context_config cc = CP_CONTEXT_CONFIG_INIT;
    cc.device = cprun_device;
    cp_context *ctx = NULL;
    cp_comm *comm = NULL;
    cp_group *g = NULL;
    cp_attn_plan *p = NULL;
    if (cp_context_create(&cc, &ctx) != CP_SUCCESS || cp_comm_create_local(1, &comm) != CP_SUCCESS ||
        cp_group_create(ctx, comm, NULL, &g) != CP_SUCCESS)
        fail_msg("a one-rank group on the GPU: %s", cp_last_error());
    cp_attn_desc desc = CP_ATTN_DESC_INIT;
    desc.dtype = CP_DTYPE_BF16;
    desc.batch = 1;
    desc.seq_len = 64;
    desc.num_heads = desc.num_kv_heads = 4;
    desc.head_dim = 64;
    desc.mask = CP_MASK_CAUSAL;
    desc.mode = CP_MODE_P2P;
    desc.sinks = 1;
    cp_status s = cp_attn_plan_create(g, &desc, &p);
    if (s == CP_SUCCESS) {
        known = 1;
        print_message("sinks: CUDA contexts accept plans with sinks; those configurations run with them\n");
    } else if (s == CP_ERROR_UNSUPPORTED && strstr(cp_last_error(), "sinks")) {
        known = 0;
        print_message("sinks: CPU contexts only; a CUDA context's plan is refused (%s); configurations with sinks "
                      "run without them here\n",
                      cp_last_error());
    } else {
        fail_msg("a plan with sinks on a CUDA context: status %d (%s), expected CP_SUCCESS or CP_ERROR_UNSUPPORTED "
                 "naming the sinks: %s",
                 (int)s, cp_status_string(s), cp_last_error());
    }
    cp_attn_plan_destroy(p);
    cp_group_destroy(g);
    cp_comm_destroy(comm);
    cp_context_destroy(ctx);
    return known;
}

/* dsinks arrives as one float per rank (the API's partial gradient): P
 * roundings of 2^-24 instead of one; and it sums outputs rounded to the
 * storage type, whose last bits CP moves around (measured against the
 * terms' size, see errors()). */
static double dsinks_floor(const cfg *c)
{
    const double u = c->dtype == CP_DTYPE_BF16 ? 0x1.0p-8 : c->dtype == CP_DTYPE_F16 ? 0x1.0p-11 : 0x1.0p-24;
    return fmax(c->P * 0x1.0p-24, 0.05 * u);
}

/* CP=1 (one rank, no pack split) and CP=P on the same inputs. */
static void check_cfg(const cfg *c, uint64_t seed)
{
    char what[700], err[WORLD_ERROR_MAX];
    describe(c, what, sizeof what);
    if (getenv("V11_TRACE"))
        fprintf(stderr, "check %s\n", what);
    data d;
    make_data(c, seed, &d);
    cfg one = *c;
    one.P = 1;
    one.A = 1;
    one.strided = 0;
    if (one.mode == CP_MODE_A2A_P2P)
        one.mode = CP_MODE_P2P;
    data r1, rP;
    double e1[NERR], eP[NERR];
    if (run_cfg(&one, &d, -1, &r1, err, sizeof err) != CP_SUCCESS)
        fail_msg("CP=1 of %s: %s", what, err);
    errors(c, &d, &r1, e1);
    for (int i = 0; i < NERR; i++)
        if (!(e1[i] <= cp1_bound_of(c->dtype, i)))
            fail_msg("CP=1 of %s: %s error %.3g above %.3g", what, err_names[i], e1[i], cp1_bound_of(c->dtype, i));
    if (run_cfg(c, &d, -1, &rP, err, sizeof err) != CP_SUCCESS)
        fail_msg("%s: %s", what, err);
    errors(c, &d, &rP, eP);
    for (int i = 0; i < NERR; i++)
        if (e1[i] > ratio_floor(c->dtype) && eP[i] / e1[i] > worst_ratio[i])
            worst_ratio[i] = eP[i] / e1[i];
    for (int i = 0; i < NERR; i++)
        if (!(eP[i] <= 1.25 * e1[i] + (i == E_DSINK ? dsinks_floor(c) : ratio_floor(c->dtype))))
            fail_msg("%s: %s error %.4g at CP=P vs %.4g at CP=1 (ratio %.3f > 1.25)", what, err_names[i], eP[i],
                     e1[i], eP[i] / e1[i]);
    results_free(&r1);
    results_free(&rP);
    data_free(&d);
}

/* Whether INFINICP_TEST_DTYPES (see the top of the file) lets
 * configurations of type t run; says once per type when it does not. */
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
        print_message("INFINICP_TEST_DTYPES=%s: the %s configurations are skipped\n", env, name);
    }
    return 0;
}

/* check_cfg, on a device that does not run sinks without them; returns
 * whether it ran (INFINICP_TEST_DTYPES). */
static int check(const cfg *c, uint64_t seed)
{
    if (!dtype_wanted(c->dtype))
        return 0;
    if (c->sinks && !sinks_run_here()) {
        cfg without = *c;
        without.sinks = 0;
        sinks_dropped++;
        check_cfg(&without, seed);
        return 1;
    }
    check_cfg(c, seed);
    return 1;
}

/* ---- configurations ------------------------------------------------- */

static int quick(void)
{
    const char *q = getenv("INFINICP_TEST_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

/* Random documents summing to T: length-1 ones, long ones, boundaries on
 * the chunk grid (multiples of `grid`) now and then. */
static int random_docs(uint64_t *s, int64_t T, int64_t grid, int64_t *cu, int max_docs)
{
    int n = 0;
    cu[0] = 0;
    while (cu[n] < T && n + 1 < max_docs) {
        const uint64_t kind = rng_next(s) % 8;
        int64_t len;
        if (kind == 0)
            len = 1;
        else if (kind == 1)
            len = T; /* the rest: one document spanning many ranks */
        else if (kind == 2 && grid > 1)
            len = grid - cu[n] % grid; /* up to the next chunk boundary */
        else
            len = 1 + (int64_t)(rng_next(s) % (uint64_t)(T / 4));
        if (len > T - cu[n])
            len = T - cu[n];
        cu[n + 1] = cu[n] + len;
        n++;
    }
    if (cu[n] < T) {
        cu[n] = T;
    }
    return n;
}

static int64_t random_window(uint64_t *s, int64_t T, int P)
{
    switch (rng_next(s) % 6) {
    case 0: return 0;
    case 1: return 1;
    case 2: return 1 + (int64_t)(rng_next(s) % 5);   /* inside a chunk */
    case 3: return T / P + 3;                           /* larger than a rank's share */
    case 4: return T + 5;                               /* larger than everything */
    default: return 1 + (int64_t)(rng_next(s) % (uint64_t)T);
    }
}

/* The hybrid's factorisations, a2a's head split, and what the heads allow. */
static int mode_ok(const cfg *c)
{
    const int split = c->mode == CP_MODE_A2A ? c->P : c->mode == CP_MODE_A2A_P2P ? c->A : 1;
    return c->H % split == 0 && (c->Hkv % split == 0 || split % c->Hkv == 0);
}

static void test_packed(void **state)
{
    (void)state;
    static const cp_dtype dtypes[] = { CP_DTYPE_F32, CP_DTYPE_F16, CP_DTYPE_BF16 };
    static const int sizes[] = { 2, 3, 4, 8 };
    uint64_t s = 0x1111;
    int runs = 0;
    for (int mode = 0; mode < 4; mode++)
        for (int si = 0; si < 4; si++)
            for (int rep = 0; rep < (quick() ? 1 : 12); rep++) {
                cfg c = { .mode = (cp_mode)mode, .layout = CP_LAYOUT_PACKED, .P = sizes[si], .B = 1, .S = 96,
                          .H = 8, .D = 16 };
                c.dtype = dtypes[(mode + si + rep) % 3];
                c.mask = rep % 3 == 2 ? CP_MASK_NONE : CP_MASK_CAUSAL;
                c.Hkv = rng_next(&s) % 2 ? 2 : 8;
                c.Dv = rng_next(&s) % 2 ? 8 : 16;
                c.format = (cp_format)(rng_next(&s) % 2);
                c.A = 1;
                if (c.mode == CP_MODE_A2A_P2P) {
                    static const int fa[] = { 1, 2, 4, 8 };
                    do
                        c.A = fa[rng_next(&s) % 4];
                    while (c.P % c.A);
                }
                c.strided = c.P <= 4 && rng_next(&s) % 4 == 0;
                c.window = random_window(&s, c.S, c.P);
                c.softcap = rng_next(&s) % 3 == 0 ? 2.5 : 0;
                c.sinks = rng_next(&s) % 2;
                static const cp_balance bal[] = { CP_BALANCE_AUTO, CP_BALANCE_GREEDY, CP_BALANCE_CONTIGUOUS };
                c.balance = bal[rng_next(&s) % 3];
                c.chunk = c.balance == CP_BALANCE_GREEDY && rng_next(&s) % 2 ? 4 : 0;
                if (c.chunk && (c.S / c.P) % c.chunk)
                    c.chunk = 0;
                c.ndocs = random_docs(&s, c.S, 4, c.cu, 12);
                if (!mode_ok(&c))
                    continue;
                runs += check(&c, rng_next(&s));
            }
    print_message("packed: %d configurations at CP=1 and CP=P\n", runs);
    report_ratios("packed");
}

/* TE's split for comparison: every document a multiple of 2P. */
static void test_doc_zigzag(void **state)
{
    (void)state;
    uint64_t s = 0x2222;
    for (int mode = 0; mode < 4; mode++) {
        cfg c = { .mode = (cp_mode)mode, .layout = CP_LAYOUT_PACKED, .dtype = CP_DTYPE_F32, .mask = CP_MASK_CAUSAL,
                  .P = 4, .A = mode == CP_MODE_A2A_P2P ? 2 : 1, .B = 1, .S = 96, .H = 4, .Hkv = 2, .D = 16, .Dv = 16,
                  .balance = CP_BALANCE_DOC_ZIGZAG, .ndocs = 3, .cu = { 0, 16, 64, 96 } };
        c.window = mode == 1 ? 5 : 0;
        check(&c, rng_next(&s));
    }
}

/* Windows, softcaps and sinks on the dense layouts, every mode. */
static void test_dense(void **state)
{
    (void)state;
    static const cp_dtype dtypes[] = { CP_DTYPE_F32, CP_DTYPE_F16, CP_DTYPE_BF16 };
    uint64_t s = 0x3333;
    int runs = 0;
    for (int mode = 0; mode < 4; mode++)
        for (int layout = 0; layout < 2; layout++)
            for (int rep = 0; rep < (quick() ? 1 : 6); rep++) {
                cfg c = { .mode = (cp_mode)mode, .layout = (cp_layout)layout, .B = 2, .S = 48, .H = 4, .D = 16,
                          .ndocs = 1 };
                c.P = rep % 3 == 0 ? 2 : rep % 3 == 1 ? 4 : 3;
                c.A = c.mode == CP_MODE_A2A_P2P && c.P % 2 == 0 ? 2 : 1;
                c.dtype = dtypes[(mode + layout + rep) % 3];
                c.format = (cp_format)(rng_next(&s) % 2);
                c.mask = rng_next(&s) % 3 ? CP_MASK_CAUSAL : CP_MASK_NONE;
                c.Hkv = rng_next(&s) % 2 ? 2 : 4;
                c.Dv = 16;
                c.window = random_window(&s, c.S, c.P);
                c.softcap = rng_next(&s) % 2 ? 1.5 : 0;
                c.sinks = rng_next(&s) % 2;
                if (!mode_ok(&c))
                    continue;
                runs += check(&c, rng_next(&s));
            }
    print_message("dense: %d configurations at CP=1 and CP=P\n", runs);
    report_ratios("dense");
}

/* More ranks than the matrix: a 16-rank ring over packed documents. */
static void test_large_p(void **state)
{
    (void)state;
    if (quick())
        skip();
    uint64_t s = 0x4444;
    cfg c = { .mode = CP_MODE_P2P, .layout = CP_LAYOUT_PACKED, .dtype = CP_DTYPE_F32, .mask = CP_MASK_CAUSAL,
              .P = 16, .A = 1, .B = 1, .S = 128, .H = 2, .Hkv = 1, .D = 8, .Dv = 8, .window = 20 };
    c.ndocs = random_docs(&s, c.S, 8, c.cu, 20);
    check(&c, rng_next(&s));
    c.mode = CP_MODE_A2A_P2P;
    c.A = 2;
    c.window = 0;
    c.sinks = 1;
    check(&c, rng_next(&s));
}

/* A rank's context on the asynchronous pretend device of fakeasync.c
 * (streams run later on threads of their own, after random delays). */
static cp_status open_pretend(const world_rank *r, const cp_context_config *cc, void *arg, cp_context **out)
{
    (void)cc;
    (void)arg;
    return fakeasync_context(77u + (unsigned)r->rank, 100, r->rank, out);
}

static void close_pretend(cp_context *ctx, void *arg)
{
    (void)arg;
    fakeasync_context_destroy(ctx);
}

/*
 * Sinks on a device context: the forward's merge of the sinks through the
 * backend's merge (their rows filled on the device), the gradient's rowsums
 * through its row_dot and the sum on the host. The pretend device runs the
 * CPU kernels on streams of its own, so a copy that the code forgot, or
 * ordered wrongly, shows as wrong results; every mode, dense and packed,
 * against the FP64 model with the CPU's bounds. On the GPU build the whole
 * matrix runs sinks on the GPU already.
 */
static void test_sinks_on_a_device(void **state)
{
    (void)state;
    if (cprun_device != CP_DEVICE_CPU)
        skip();
    static const fixture_device fake = { open_pretend, close_pretend, NULL };
    uint64_t s = 0x5555;
    int runs = 0;
    pretend = &fake;
    for (int mode = 0; mode < 4; mode++)
        for (int layout = 0; layout < 3; layout++) {
            cfg c = { .mode = (cp_mode)mode, .layout = (cp_layout)layout, .dtype = layout == 1 ? CP_DTYPE_BF16
                                                                                               : CP_DTYPE_F32,
                      .format = CP_FORMAT_BSHD, .mask = CP_MASK_CAUSAL, .P = 4, .B = 1, .S = 64, .H = 4,
                      .Hkv = mode == CP_MODE_A2A ? 4 : 2, .D = 16, .Dv = 16, .sinks = 1, .ndocs = 1 };
            c.A = c.mode == CP_MODE_A2A_P2P ? 2 : 1;
            if (c.layout == CP_LAYOUT_PACKED)
                c.ndocs = random_docs(&s, c.S, 4, c.cu, 8);
            c.window = layout == 2 ? 9 : 0;
            if (!mode_ok(&c))
                continue;
            check_cfg(&c, rng_next(&s));
            runs++;
        }
    pretend = NULL;
    print_message("sinks on the pretend device: %d configurations at CP=1 and CP=P\n", runs);
}

/* Ranks passing different packs: every rank gets CP_ERROR_MISMATCH. Only
 * on CPU contexts: on a device context the forward and backward compare
 * nothing (a vote would make the host wait for the stream in every call;
 * cp_attn_forward_ex(3)). */
static void test_pack_mismatch(void **state)
{
    (void)state;
    if (cprun_device != CP_DEVICE_CPU) {
        print_message("device contexts do not compare packs (cp_attn_forward_ex(3), NOTES)\n");
        skip();
    }
    for (int mode = 0; mode < 4; mode++) {
        cfg c = { .mode = (cp_mode)mode, .layout = CP_LAYOUT_PACKED, .dtype = CP_DTYPE_F32, .mask = CP_MASK_CAUSAL,
                  .P = 4, .A = mode == CP_MODE_A2A_P2P ? 2 : 1, .B = 1, .S = 32, .H = 4, .Hkv = 4, .D = 8, .Dv = 8,
                  .ndocs = 3, .cu = { 0, 10, 20, 32 }, .balance = CP_BALANCE_CONTIGUOUS };
        data d;
        make_data(&c, 7, &d);
        data r;
        char err[WORLD_ERROR_MAX];
        cp_status s = run_cfg(&c, &d, 2, &r, err, sizeof err);
        if (s != CP_SUCCESS)
            fail_msg("%s with different packs: %s", mode_name(c.mode), err);
        results_free(&r);
        data_free(&d);
    }
}

/* Ring geometry under API 1.1 (ring.h with vis.h): what the hops carry. */
static int64_t fwd_rows(cpi_ring *r, int *busy_hops)
{
    int64_t rows = 0;
    *busy_hops = 0;
    for (int step = 1; step < r->size; step++) {
        *busy_hops += !cpi_ring_fwd_idle(r, step);
        for (int m = 0; m < r->size; m++) {
            cpi_ring o = *r;
            o.member = m;
            const cpi_rows in = cpi_ring_fwd_kv_in(&o, step);
            rows += cpi_rows_empty(in) ? 0 : in.hi - in.lo;
        }
    }
    return rows;
}

static void test_ring_geometry(void **state)
{
    (void)state;
    enum { R = 4, SL = 16 };
    cpi_tokset sub[R];
    for (int m = 0; m < R; m++) {
        cpi_span sp = { m * SL, SL };
        assert_int_equal(cpi_tokset_local(&sp, 1, &sub[m]), CP_SUCCESS);
    }
    /* documents on the rank boundaries: nothing ever travels */
    const int64_t cu_local[] = { 0, 5, 16, 32, 40, 48, 64 };
    cpi_vis v = { .causal = true, .cu = cu_local, .ndocs = 6 };
    cpi_ring r = { .size = R, .sub = sub, .causal = true, .vis = &v, .rows_contiguous = true };
    int busy;
    assert_int_equal(fwd_rows(&r, &busy), 0);
    assert_int_equal(busy, 0);
    for (int step = 0; step < R; step++)
        for (int m = 0; m < R; m++) {
            cpi_ring o = r;
            o.member = m;
            assert_true(cpi_ring_bwd_idle(&o, step, 1));
            if (step < R - 1)
                assert_true(cpi_ring_bwd_idle(&o, step, 0));
        }
    /* one document across the ranks, window 3 <= a rank's share: a block is
     * seen by the next rank only, its last 2 rows; in the direction the
     * plan picks that is one busy hop, R - 1 blocks of 2 rows */
    const int64_t cu_one[] = { 0, R * SL };
    v = (cpi_vis){ .causal = true, .window = 3, .cu = cu_one, .ndocs = 1 };
    r.fwd_dir = cpi_ring_pick_fwd_dir(&r);
    assert_int_equal(r.fwd_dir, -1);
    assert_int_equal(fwd_rows(&r, &busy), (R - 1) * 2);
    assert_int_equal(busy, 1);
    r.fwd_dir = 1; /* the other way every hop carries them */
    assert_int_equal(fwd_rows(&r, &busy), (R - 1) * (R - 1) * 2);
    /* without a window the causal contiguous ring needs everything earlier */
    v.window = 0;
    r.fwd_dir = cpi_ring_pick_fwd_dir(&r);
    assert_true(fwd_rows(&r, &busy) > 0);
    for (int m = 0; m < R; m++)
        cpi_tokset_free(&sub[m]);
}

int main(void)
{
    if (cprun_device_missing("the API 1.1 CP suite"))
        return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_packed),      cmocka_unit_test(test_doc_zigzag), cmocka_unit_test(test_dense),
        cmocka_unit_test(test_large_p),     cmocka_unit_test(test_pack_mismatch),
        cmocka_unit_test(test_ring_geometry), cmocka_unit_test(test_sinks_on_a_device),
    };
    return cmocka_run_group_tests_name("attn-v11", tests, NULL, NULL);
}
