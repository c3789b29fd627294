/* SPDX-License-Identifier: MIT */
#include "cpattn.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cpref.h"
#include "cprun.h"
#include "devmem.h"

static double *alloc_d(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof *p);
    assert_non_null(p);
    return p;
}

void cpattn_results_alloc(const cpattn_cfg *c, cpattn_data *d)
{
    d->out = alloc_d(cpattn_no(c));
    d->lse = alloc_d(cpattn_nl(c));
    d->dq = alloc_d(cpattn_nq(c));
    d->dk = alloc_d(cpattn_nk(c));
    d->dv = alloc_d(cpattn_nv(c));
    d->dsinks = alloc_d((size_t)c->H);
}

void cpattn_results_free(cpattn_data *d)
{
    free(d->out);
    free(d->lse);
    free(d->dq);
    free(d->dk);
    free(d->dv);
    free(d->dsinks);
}

void cpattn_data_free(cpattn_data *d)
{
    free(d->q);
    free(d->k);
    free(d->v);
    free(d->dout);
    free(d->sinks);
    cpattn_results_free(d);
}

/* ---- one rank ------------------------------------------------------- */

typedef struct run {
    const cpattn_cfg *c;
    const cpattn_data *d;
    cpattn_data res;   /* gathered results */
    int bad_pack_rank; /* >= 0: that rank's pack has other documents */
    pthread_mutex_t lock;
} run;

/* Element (b, local token t, h, e) of a local tensor in the run's format. */
static size_t local_at(const cpattn_cfg *c, int64_t Sl, int heads, int dim, int64_t b, int64_t t, int h, int e)
{
    if (c->format == CP_FORMAT_SBHD)
        return (((size_t)t * (size_t)c->B + (size_t)b) * (size_t)heads + (size_t)h) * (size_t)dim + (size_t)e;
    return (((size_t)b * (size_t)Sl + (size_t)t) * (size_t)heads + (size_t)h) * (size_t)dim + (size_t)e;
}

static size_t global_at(const cpattn_cfg *c, int heads, int dim, int64_t b, int64_t p, int h, int e)
{
    return (((size_t)b * (size_t)c->S + (size_t)p) * (size_t)heads + (size_t)h) * (size_t)dim + (size_t)e;
}

/* The rank's tokens (global positions pos) of g, stored in the run's
 * dtype and format. */
static void *shard(const cpattn_cfg *c, const double *g, const int64_t *pos, int64_t Sl, int heads, int dim)
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

/* A local tensor of type dt back to its global positions in g. */
static void unshard(const cpattn_cfg *c, cp_dtype dt, const void *local, const int64_t *pos, int64_t Sl, int heads,
                    int dim, double *g)
{
    const size_t n = (size_t)(c->B * Sl * heads * dim);
    double *tmp = alloc_d(n);
    cpref_load(tmp, local, dt, n);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t t = 0; t < Sl; t++)
            for (int h = 0; h < heads; h++)
                for (int e = 0; e < dim; e++)
                    g[global_at(c, heads, dim, b, pos[t], h, e)] = tmp[local_at(c, Sl, heads, dim, b, t, h, e)];
    free(tmp);
}

static cp_status make_pack(const cpattn_cfg *c, int other, cp_pack **pk)
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

static void rank_main(world_rank *r, void *arg)
{
    run *u = arg;
    const cpattn_cfg *c = u->c;
    const cpattn_data *d = u->d;
    /* FP8 plans have a forward only, out in BF16: no dout, no gradients */
    const int fp8 = c->dtype == CP_DTYPE_FP8_E4M3;
    const cp_dtype ot = fp8 ? CP_DTYPE_BF16 : c->dtype;
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
    fixture_cfg fc = { .context = &cc, .device = c->device, .group = &gc, .desc = &desc };
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
    const size_t P = (size_t)c->P, es = cpref_dtype_size(c->dtype), hs = (size_t)c->H * sizeof(float);
    void *q = shard(c, d->q, pos, Sl, c->H, c->D), *k = shard(c, d->k, pos, Sl, c->Hkv, c->D),
         *v = shard(c, d->v, pos, Sl, c->Hkv, c->Dv), *dout = fp8 ? NULL : shard(c, d->dout, pos, Sl, c->H, c->Dv);
    void *o = calloc(cpattn_no(c) / P, cpref_dtype_size(ot)), *dq = fp8 ? NULL : calloc(cpattn_nq(c) / P, es),
         *dk = fp8 ? NULL : calloc(cpattn_nk(c) / P, es), *dv = fp8 ? NULL : calloc(cpattn_nv(c) / P, es);
    float *lse = calloc(cpattn_nl(c) / P, sizeof *lse), sinks[CPATTN_MAX_HEADS], dsinks[CPATTN_MAX_HEADS];
    for (int h = 0; h < c->H; h++)
        sinks[h] = (float)d->sinks[h];
    /* the tensors on the context's device (the host buffers themselves on
     * the CPU); sinks and descales too, like every tensor of the call;
     * inputs before BO, results from it */
    cp_context *ctx = r->fx.ctx;
    enum { BQ, BK, BV, BDOUT, BSINKS, BQD, BKD, BVD, BO, BDQ, BDK, BDV, BLSE, BDSINKS, NB };
    void *const host[NB] = { q, k, v, dout, c->sinks ? sinks : NULL, fp8 ? (void *)d->qd : NULL,
                             fp8 ? (void *)d->kd : NULL, fp8 ? (void *)d->vd : NULL, o, dq, dk, dv, lse,
                             c->sinks && !fp8 ? dsinks : NULL };
    const size_t nd = c->per_head ? (size_t)c->Hkv : 1; /* descales of k and v (of q: H, or 1) */
    const size_t bytes[NB] = { cpattn_nq(c) / P * es, cpattn_nk(c) / P * es, cpattn_nv(c) / P * es,
                               cpattn_no(c) / P * es, hs, (c->per_head ? (size_t)c->H : 1) * sizeof(float),
                               nd * sizeof(float), nd * sizeof(float), cpattn_no(c) / P * cpref_dtype_size(ot),
                               cpattn_nq(c) / P * es, cpattn_nk(c) / P * es, cpattn_nv(c) / P * es,
                               cpattn_nl(c) / P * sizeof(float), hs };
    void *dev[NB] = { NULL };
    for (int i = 0; i < NB; i++)
        if (world_fail(r, devmem_put(ctx, host[i], bytes[i], &dev[i]), "copy to the device") != CP_SUCCESS)
            goto free_all;
    cp_attn_args x = CP_ATTN_ARGS_INIT;
    x.pack = pk;
    x.sinks = dev[BSINKS];
    x.dsinks = dev[BDSINKS];
    x.q_descale = dev[BQD];
    x.k_descale = dev[BKD];
    x.v_descale = dev[BVD];
    x.descale_per_head = fp8 && c->per_head;
    s = cp_attn_forward_ex(r->fx.plan, dev[BQ], dev[BK], dev[BV], dev[BO], dev[BLSE], &x);
    if (u->bad_pack_rank >= 0) {
        /* every rank fails, none hangs */
        if (s != CP_ERROR_MISMATCH)
            world_fail(r, s == CP_SUCCESS ? CP_ERROR_INTERNAL : s, "cp_attn_forward_ex with different packs");
        goto free_all;
    }
    if (world_fail(r, s, "cp_attn_forward_ex") != CP_SUCCESS)
        goto free_all;
    if (!fp8) {
        if (c->bwd_hook)
            c->bwd_hook(ctx, 0, c->bwd_hook_arg);
        s = cp_attn_backward_ex(r->fx.plan, dev[BQ], dev[BK], dev[BV], dev[BO], dev[BLSE], dev[BDOUT], dev[BDQ],
                                dev[BDK], dev[BDV], &x);
        if (c->bwd_hook && s == CP_SUCCESS)
            c->bwd_hook(ctx, 1, c->bwd_hook_arg);
        if (world_fail(r, s, "cp_attn_backward_ex") != CP_SUCCESS)
            goto free_all;
    }
    for (int i = BO; i < NB; i++)
        if (world_fail(r, devmem_get(ctx, host[i], dev[i], bytes[i]), "copy to the host") != CP_SUCCESS)
            goto free_all;
    if (!c->strided || r->rank % 2 == 0) {
        pthread_mutex_lock(&u->lock);
        unshard(c, ot, o, pos, Sl, c->H, c->Dv, u->res.out);
        if (!fp8) {
            unshard(c, c->dtype, dq, pos, Sl, c->H, c->D, u->res.dq);
            unshard(c, c->dtype, dk, pos, Sl, c->Hkv, c->D, u->res.dk);
            unshard(c, c->dtype, dv, pos, Sl, c->Hkv, c->Dv, u->res.dv);
        }
        for (int64_t b = 0; b < c->B; b++)
            for (int h = 0; h < c->H; h++)
                for (int64_t t = 0; t < Sl; t++)
                    u->res.lse[((size_t)b * (size_t)c->H + (size_t)h) * (size_t)c->S + (size_t)pos[t]] =
                        lse[((size_t)b * (size_t)c->H + (size_t)h) * (size_t)Sl + (size_t)t];
        for (int h = 0; host[BDSINKS] && h < c->H; h++)
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

cp_status cpattn_run(const cpattn_cfg *c, const cpattn_data *d, int bad_pack_rank, cpattn_data *res, char *err,
                     size_t errn)
{
    run u = { .c = c, .d = d, .bad_pack_rank = bad_pack_rank };
    pthread_mutex_init(&u.lock, NULL);
    cpattn_results_alloc(c, &u.res);
    world w;
    cp_status s = world_run(&w, c->strided ? 2 * c->P : c->P, NULL, rank_main, &u);
    if (s != CP_SUCCESS)
        snprintf(err, errn, "%s", w.error);
    pthread_mutex_destroy(&u.lock);
    *res = u.res;
    return s;
}

/* ---- errors --------------------------------------------------------- */

static const char *err_names[CPATTN_NERR] = { "out", "lse", "dq", "dk", "dv", "dsinks" };

/* Infinities the run matches exactly (the lse of a row that sees no key)
 * add nothing. */
static double rel_rms(const double *x, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (isinf(ref[i]) && x[i] == ref[i])
            continue;
        num += (x[i] - ref[i]) * (x[i] - ref[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static void errors(const cpattn_cfg *c, const cpattn_data *ref, const cpattn_data *got, double e[CPATTN_NERR])
{
    e[CPATTN_OUT] = rel_rms(got->out, ref->out, cpattn_no(c));
    e[CPATTN_LSE] = rel_rms(got->lse, ref->lse, cpattn_nl(c));
    e[CPATTN_DQ] = rel_rms(got->dq, ref->dq, cpattn_nq(c));
    e[CPATTN_DK] = rel_rms(got->dk, ref->dk, cpattn_nk(c));
    e[CPATTN_DV] = rel_rms(got->dv, ref->dv, cpattn_nv(c));
    /* against the terms' size: the sum cancels, and the outputs it is made
     * of are rounded to the storage type, where CP moves a rounding by an
     * ulp here and there */
    double num = 0;
    for (int h = 0; c->sinks && h < c->H; h++)
        num += (got->dsinks[h] - ref->dsinks[h]) * (got->dsinks[h] - ref->dsinks[h]);
    e[CPATTN_DSINKS] = c->sinks && ref->dsinks_scale > 0 ? sqrt(num) / ref->dsinks_scale : 0;
}

static const char *dtype_name(cp_dtype t)
{
    return t == CP_DTYPE_F32 ? "F32" : t == CP_DTYPE_F16 ? "F16" : t == CP_DTYPE_FP8_E4M3 ? "FP8" : "BF16";
}

const char *cpattn_mode_name(cp_mode m)
{
    static const char *n[] = { "all_gather", "p2p", "a2a", "a2a_p2p" };
    return n[m];
}

static void describe(const cpattn_cfg *c, char *buf, size_t n)
{
    int w = snprintf(buf, n, "%s P=%d A=%d%s %s %s %s %s B=%lld S=%lld H=%d/%d D=%d/%d W=%lld cap=%g sinks=%d",
                     cpattn_mode_name(c->mode), c->P, c->A, c->strided ? " strided" : "",
                     c->layout == CP_LAYOUT_PACKED ? "packed" : c->layout == CP_LAYOUT_ZIGZAG ? "zigzag" : "contiguous",
                     dtype_name(c->dtype), c->format ? "SBHD" : "BSHD", c->mask ? "causal" : "nomask",
                     (long long)c->B, (long long)c->S, c->H, c->Hkv, c->D, c->Dv, (long long)c->window, c->softcap,
                     c->sinks);
    if (c->dtype == CP_DTYPE_FP8_E4M3 && w > 0 && (size_t)w < n)
        w += snprintf(buf + w, n - (size_t)w, " descales %s", c->per_head ? "per head" : "per tensor");
    if (c->layout == CP_LAYOUT_PACKED && w > 0 && (size_t)w < n) {
        w += snprintf(buf + w, n - (size_t)w, " balance=%d chunk=%lld docs=", (int)c->balance, (long long)c->chunk);
        for (int i = 1; i <= c->ndocs && w > 0 && (size_t)w < n; i++)
            w += snprintf(buf + w, n - (size_t)w, "%lld%s", (long long)(c->cu[i] - c->cu[i - 1]),
                          i < c->ndocs ? "," : "");
    }
}

/* The CP=1 bound of tensor e: the storage type's rounding of the results
 * (FP8's out is BF16; its lse, fp32, carries the kernel's error alone). */
static double cp1_bound(cp_dtype t, int e)
{
    if (t == CP_DTYPE_FP8_E4M3)
        return e == CPATTN_LSE ? 2e-5 : 4 * 0x1.0p-8;
    return t == CP_DTYPE_BF16 ? 4 * 0x1.0p-8 : t == CP_DTYPE_F16 ? 4 * 0x1.0p-11 : 2e-5;
}

/* The CP=1 bound of tensor e: cp1_bound, or on the GPU test-gpu-kernels.c's
 * relative RMS bound where that is wider (forward F32 / F16 / BF16 1e-5 /
 * 2e-3 / 1.5e-2, backward 2e-5 / 6e-3 / 4e-2). */
static double cp1_bound_of(cp_dtype t, int e)
{
    if (cprun_device == CP_DEVICE_CPU)
        return cp1_bound(t, e);
    const int bwd = e == CPATTN_DQ || e == CPATTN_DK || e == CPATTN_DV;
    const double gpu = bwd ? (t == CP_DTYPE_F32 ? 2e-5 : t == CP_DTYPE_F16 ? 6e-3 : 4e-2)
                           : (t == CP_DTYPE_F32 ? 1e-5 : t == CP_DTYPE_F16 ? 2e-3 : 1.5e-2);
    return fmax(cp1_bound(t, e), gpu);
}

/* Errors below this CP=1 may grow by it at CP=P (and give no ratio). */
static double ratio_floor(cp_dtype t, int e)
{
    if (t == CP_DTYPE_FP8_E4M3)
        return e == CPATTN_LSE ? 1e-9 : 1e-6;
    return t == CP_DTYPE_F32 ? 1e-9 : 1e-6;
}

/* dsinks arrives as one float per rank (the API's partial gradient): P
 * roundings of 2^-24 instead of one; and it sums outputs rounded to the
 * storage type, whose last bits CP moves around (measured against the
 * terms' size, see errors()). */
static double dsinks_floor(const cpattn_cfg *c)
{
    const double u = c->dtype == CP_DTYPE_BF16 ? 0x1.0p-8 : c->dtype == CP_DTYPE_F16 ? 0x1.0p-11 : 0x1.0p-24;
    return fmax(c->P * 0x1.0p-24, 0.05 * u);
}

double cpattn_worst_ratio[CPATTN_NERR];

void cpattn_check(const cpattn_cfg *c, const cpattn_data *d)
{
    char what[700], err[WORLD_ERROR_MAX];
    describe(c, what, sizeof what);
    if (getenv("V11_TRACE"))
        fprintf(stderr, "check %s\n", what);
    /* FP8: the forward's tensors alone */
    const int n = c->dtype == CP_DTYPE_FP8_E4M3 ? CPATTN_LSE + 1 : CPATTN_NERR;
    cpattn_cfg one = *c;
    one.P = 1;
    one.A = 1;
    one.strided = 0;
    if (one.mode == CP_MODE_A2A_P2P)
        one.mode = CP_MODE_P2P;
    cpattn_data r1, rP;
    double e1[CPATTN_NERR], eP[CPATTN_NERR];
    if (cpattn_run(&one, d, -1, &r1, err, sizeof err) != CP_SUCCESS)
        fail_msg("CP=1 of %s: %s", what, err);
    errors(c, d, &r1, e1);
    for (int i = 0; i < n; i++)
        if (!(e1[i] <= cp1_bound_of(c->dtype, i)))
            fail_msg("CP=1 of %s: %s error %.3g above %.3g", what, err_names[i], e1[i], cp1_bound_of(c->dtype, i));
    if (cpattn_run(c, d, -1, &rP, err, sizeof err) != CP_SUCCESS)
        fail_msg("%s: %s", what, err);
    errors(c, d, &rP, eP);
    for (int i = 0; i < n; i++)
        if (e1[i] > ratio_floor(c->dtype, i) && eP[i] / e1[i] > cpattn_worst_ratio[i])
            cpattn_worst_ratio[i] = eP[i] / e1[i];
    for (int i = 0; i < n; i++)
        if (!(eP[i] <= 1.25 * e1[i] + (i == CPATTN_DSINKS ? dsinks_floor(c) : ratio_floor(c->dtype, i))))
            fail_msg("%s: %s error %.4g at CP=P vs %.4g at CP=1 (ratio %.3f > 1.25)", what, err_names[i], eP[i],
                     e1[i], eP[i] / e1[i]);
    if (getenv("TEST_VERBOSE")) {
        char line[256];
        int w = 0;
        for (int i = 0; i < n && w >= 0 && (size_t)w < sizeof line; i++)
            w += snprintf(line + w, sizeof line - (size_t)w, " %s %.4g / %.4g", err_names[i], e1[i], eP[i]);
        print_message("%s:%s\n", what, line);
    }
    cpattn_results_free(&r1);
    cpattn_results_free(&rP);
}
