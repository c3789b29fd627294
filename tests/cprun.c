/* SPDX-License-Identifier: MIT */
#include "cprun.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/context.h"

#ifdef CPRUN_CUDA
const cp_device cprun_device = CP_DEVICE_CUDA;
#else
const cp_device cprun_device = CP_DEVICE_CPU;
#endif

cp_attn_desc cprun_desc(const cpref_shape *sh, cp_dtype dtype, cp_format format, cp_layout layout, cp_mode mode)
{
    cp_attn_desc d = CP_ATTN_DESC_INIT;
    d.dtype = dtype;
    d.format = format;
    d.batch = sh->B;
    d.seq_len = sh->S;
    d.num_heads = sh->H;
    d.num_kv_heads = sh->Hkv;
    d.head_dim = sh->D;
    d.head_dim_v = sh->Dv;
    d.mask = sh->causal ? CP_MASK_CAUSAL : CP_MASK_NONE;
    d.softmax_scale = sh->scale;
    d.layout = layout;
    d.mode = mode;
    return d;
}

static size_t nelem(const cpref_shape *sh, int64_t tokens, int heads, int dim)
{
    return (size_t)sh->B * (size_t)tokens * (size_t)heads * (size_t)dim;
}

/* Buffers of the plan's device, through its backend (host memory on the CPU). */
static void *dev_alloc(cp_context *ctx, size_t bytes)
{
    void *p = NULL;
    return ctx->ops->alloc(ctx->state, bytes ? bytes : 1, &p) == CP_SUCCESS ? p : NULL;
}

static cp_status to_dev(cp_context *ctx, void *dst, const void *src, size_t bytes)
{
    cp_copy_kind k = ctx->device == CP_DEVICE_CPU ? CP_COPY_HOST_TO_HOST : CP_COPY_HOST_TO_DEVICE;
    return ctx->ops->copy_2d(ctx->state, dst, bytes, src, bytes, bytes, 1, k);
}

static cp_status to_host(cp_context *ctx, void *dst, const void *src, size_t bytes)
{
    cp_copy_kind k = ctx->device == CP_DEVICE_CPU ? CP_COPY_HOST_TO_HOST : CP_COPY_DEVICE_TO_HOST;
    cp_status s = ctx->ops->copy_2d(ctx->state, dst, bytes, src, bytes, bytes, 1, k);
    return s == CP_SUCCESS ? ctx->ops->synchronize(ctx->state) : s;
}

/* cprun_rank, with c's hook around the calls (c may be NULL). */
static cp_status rank_run(cp_context *ctx, cp_attn_plan *p, const cpref_data *d, const cp_attn_desc *desc, int P,
                          int rank, int own_workspace, cpref_result *into, const char **what, const cprun_cfg *c)
{
    const cpref_shape *sh = &d->sh;
    const cp_layout l = desc->layout;
    const cp_format f = desc->format;
    const cp_dtype t = desc->dtype;
    size_t wf = 0, wb = 0;
    cp_status s = cp_attn_workspace_size(p, &wf, &wb);
    *what = "cp_attn_workspace_size";
    if (s != CP_SUCCESS)
        return s;
    const int64_t n = sh->S / P;
    const size_t es = cpref_dtype_size(t);
    /* FP8 plans (API 1.2): forward only, out in BF16, descales 1 */
    const int fp8 = t == CP_DTYPE_FP8_E4M3;
    const cp_dtype ot = fp8 ? CP_DTYPE_BF16 : t;
    /* q k v out dout dq dk dv, then lse */
    const size_t bytes[9] = { nelem(sh, n, sh->H, sh->D) * es,   nelem(sh, n, sh->Hkv, sh->D) * es,
                              nelem(sh, n, sh->Hkv, sh->Dv) * es, nelem(sh, n, sh->H, sh->Dv) * cpref_dtype_size(ot),
                              nelem(sh, n, sh->H, sh->Dv) * es,  nelem(sh, n, sh->H, sh->D) * es,
                              nelem(sh, n, sh->Hkv, sh->D) * es, nelem(sh, n, sh->Hkv, sh->Dv) * es,
                              nelem(sh, n, sh->H, 1) * sizeof(float) };
    void *h[9], *b[9];
    for (int i = 0; i < 9; i++) {
        h[i] = malloc(bytes[i]);
        b[i] = dev_alloc(ctx, bytes[i]);
    }
    void *ws = own_workspace ? NULL : dev_alloc(ctx, wf > wb ? wf : wb);
    cpref_shard(sh, l, P, rank, f, t, d->q, sh->H, sh->D, h[0]);
    cpref_shard(sh, l, P, rank, f, t, d->k, sh->Hkv, sh->D, h[1]);
    cpref_shard(sh, l, P, rank, f, t, d->v, sh->Hkv, sh->Dv, h[2]);
    cpref_shard(sh, l, P, rank, f, t, d->dout, sh->H, sh->Dv, h[4]);
    *what = "copy to the device";
    for (int i = 0; i < 5 && s == CP_SUCCESS; i++)
        if (i != 3)
            s = to_dev(ctx, b[i], h[i], bytes[i]);
    /* The workspace holds all-ones bytes (NaN in every float type) before
     * each call: a result that reads a byte no step wrote comes out NaN. */
    if (s == CP_SUCCESS && c && c->calls)
        c->calls(ctx, 0, own_workspace, c->calls_arg);
    if (s == CP_SUCCESS) {
        *what = "cp_attn_forward";
        if (ws && wf)
            s = ctx->ops->memset(ctx->state, ws, 0xff, wf);
        if (s == CP_SUCCESS)
            s = cp_attn_forward(p, b[0], b[1], b[2], b[3], b[8], ws, wf);
    }
    if (s == CP_SUCCESS && !fp8) {
        *what = "cp_attn_backward";
        if (ws && wb)
            s = ctx->ops->memset(ctx->state, ws, 0xff, wb);
        if (s == CP_SUCCESS)
            s = cp_attn_backward(p, b[0], b[1], b[2], b[3], b[8], b[4], b[5], b[6], b[7], ws, wb);
    }
    if (s == CP_SUCCESS && c && c->calls)
        c->calls(ctx, 1, own_workspace, c->calls_arg);
    *what = s == CP_SUCCESS ? "copy to the host" : *what;
    for (int i = 3; i < 9 && s == CP_SUCCESS; i++)
        if (i != 4 && (!fp8 || i == 3 || i == 8))
            s = to_host(ctx, h[i], b[i], bytes[i]);
    if (s == CP_SUCCESS && into) {
        cpref_unshard(sh, l, P, rank, f, ot, h[3], sh->H, sh->Dv, into->out);
        cpref_unshard_lse(sh, l, P, rank, h[8], into->lse);
    }
    if (s == CP_SUCCESS && into && !fp8) {
        cpref_unshard(sh, l, P, rank, f, t, h[5], sh->H, sh->D, into->dq);
        cpref_unshard(sh, l, P, rank, f, t, h[6], sh->Hkv, sh->D, into->dk);
        cpref_unshard(sh, l, P, rank, f, t, h[7], sh->Hkv, sh->Dv, into->dv);
    }
    for (int i = 0; i < 9; i++) {
        free(h[i]);
        ctx->ops->free(ctx->state, b[i]);
    }
    if (ws)
        ctx->ops->free(ctx->state, ws);
    return s;
}

cp_status cprun_rank(cp_context *ctx, cp_attn_plan *p, const cpref_data *d, const cp_attn_desc *desc, int P,
                     int rank, int own_workspace, cpref_result *into, const char **what)
{
    return rank_run(ctx, p, d, desc, P, rank, own_workspace, into, what, NULL);
}

/* ---- a world of ranks ---------------------------------------------------- */

typedef struct cprun_job {
    const cpref_data *d;
    const cprun_cfg *c;
    cprun_out *o;
} cprun_job;

static void cprun_main(world_rank *wr, void *arg)
{
    const cprun_job *j = arg;
    const cprun_cfg *c = j->c;
    cp_context_config cc = CP_CONTEXT_CONFIG_INIT;
    cc.num_threads = 1;
    cc.device = cprun_device;
    cp_group_config gc = CP_GROUP_CONFIG_INIT;
    gc.a2a_size = c->A;
    gc.timeout_ms = 60000;
    cp_attn_desc desc = cprun_desc(&j->d->sh, c->dtype, c->format, c->layout, c->mode);
    const int color = c->strided ? wr->rank % 2 : 0;
    fixture_cfg fc = { .context = &cc, .device = c->device, .group = &gc, .desc = &desc };
    if (c->strided || c->permuted) {
        fc.split = 1;
        fc.color = color;
        fc.key = c->permuted ? -wr->rank : wr->rank;
    }
    if (fixture_open(wr, &fc) != CP_SUCCESS)
        return;
    const fixture *f = &wr->fx;
    if (f->rank == 0 && color == 0)
        cp_attn_workspace_size(f->plan, &j->o->ws_fwd, &j->o->ws_bwd);
    /* The library's own workspace on some ranks, the caller's on others. */
    const int own = (int)(((unsigned)f->rank + (unsigned)c->mode + c->ws_salt) % 2u);
    const char *what = "";
    world_fail(wr,
               rank_run(f->ctx, f->plan, j->d, &desc, f->size, f->rank, own, color == 0 ? &j->o->g : NULL, &what, c),
               what);
}

cp_status cprun_world(const cpref_data *d, const cprun_cfg *c, cprun_out *o)
{
    memset(o, 0, sizeof *o);
    cpref_result_alloc(&o->g, &d->sh);
    world *w = malloc(sizeof *w);
    if (!w) {
        o->status = CP_ERROR_OUT_OF_MEMORY;
        snprintf(o->error, sizeof o->error, "cprun_world: out of memory");
        return o->status;
    }
    cprun_job job = { d, c, o };
    o->status = world_run(w, c->strided ? 2 * c->P : c->P, NULL, cprun_main, &job);
    memcpy(o->error, w->error, sizeof o->error);
    free(w);
    return o->status;
}

void cprun_out_free(cprun_out *o)
{
    cpref_result_free(&o->g);
}

int cprun_device_missing(const char *suite)
{
    if (cprun_device == CP_DEVICE_CPU)
        return 0;
    cp_context_config cc = CP_CONTEXT_CONFIG_INIT;
    cc.device = cprun_device;
    cp_context *ctx = NULL;
    cp_status s = cp_context_create(&cc, &ctx);
    cp_context_destroy(ctx);
    if (s == CP_SUCCESS)
        return 0;
    printf("SKIP: no usable CUDA device for %s: %s (%s)\n", suite, cp_last_error(), cp_status_string(s));
    return 1;
}
