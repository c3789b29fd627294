/* SPDX-License-Identifier: MIT */
#include "cprun.h"

#include <stdlib.h>

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

cp_status cprun_rank(cp_attn_plan *p, const cpref_data *d, const cp_attn_desc *desc, int P, int rank,
                     int own_workspace, cpref_result *into, const char **what)
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
    /* q k v out dout dq dk dv */
    const size_t count[8] = { nelem(sh, n, sh->H, sh->D),   nelem(sh, n, sh->Hkv, sh->D), nelem(sh, n, sh->Hkv, sh->Dv),
                              nelem(sh, n, sh->H, sh->Dv),  nelem(sh, n, sh->H, sh->Dv),  nelem(sh, n, sh->H, sh->D),
                              nelem(sh, n, sh->Hkv, sh->D), nelem(sh, n, sh->Hkv, sh->Dv) };
    void *b[8];
    for (int i = 0; i < 8; i++)
        b[i] = malloc(count[i] * es);
    float *lse = malloc((size_t)sh->B * (size_t)sh->H * (size_t)n * sizeof *lse);
    void *ws = own_workspace ? NULL : malloc((wf > wb ? wf : wb) + 1);
    cpref_shard(sh, l, P, rank, f, t, d->q, sh->H, sh->D, b[0]);
    cpref_shard(sh, l, P, rank, f, t, d->k, sh->Hkv, sh->D, b[1]);
    cpref_shard(sh, l, P, rank, f, t, d->v, sh->Hkv, sh->Dv, b[2]);
    cpref_shard(sh, l, P, rank, f, t, d->dout, sh->H, sh->Dv, b[4]);
    *what = "cp_attn_forward";
    s = cp_attn_forward(p, b[0], b[1], b[2], b[3], lse, ws, wf);
    if (s == CP_SUCCESS) {
        *what = "cp_attn_backward";
        s = cp_attn_backward(p, b[0], b[1], b[2], b[3], lse, b[4], b[5], b[6], b[7], ws, wb);
    }
    if (s == CP_SUCCESS && into) {
        cpref_unshard(sh, l, P, rank, f, t, b[3], sh->H, sh->Dv, into->out);
        cpref_unshard_lse(sh, l, P, rank, lse, into->lse);
        cpref_unshard(sh, l, P, rank, f, t, b[5], sh->H, sh->D, into->dq);
        cpref_unshard(sh, l, P, rank, f, t, b[6], sh->Hkv, sh->D, into->dk);
        cpref_unshard(sh, l, P, rank, f, t, b[7], sh->Hkv, sh->Dv, into->dv);
    }
    for (int i = 0; i < 8; i++)
        free(b[i]);
    free(lse);
    free(ws);
    return s;
}
