/* SPDX-License-Identifier: MIT */
/*
 * all_gather (docs/ARCHITECTURE.md, CP modes): every rank gathers the K
 * and V of all ranks (kv heads only) and attends its own queries to them;
 * backward computes dK, dV for all keys and reduce-scatters them to their
 * owners.
 * The gathered blocks stay in rank order; p->sub[r] says which global
 * positions block r holds, so no reordering copy is needed. Where the
 * blocks are one tensor of all ranks' rows (batch 1, or SBHD) and the plan
 * attends through rectangles, the local queries attend to the whole
 * gathered row in one call (p->gathered); otherwise block by block.
 */
#include <string.h>

#include "attn/plan.h"

typedef struct gathered {
    cpi_tensor k, v;   /* P blocks of [s_loc, Hkv, dim] */
    size_t kblock, vblock;
    void *scratch;
    size_t scratch_bytes;
} gathered;

/* Whether the local queries attend to the gathered row in one call. */
static bool one_call(const cp_attn_plan *p)
{
    return p->rects && (p->desc.batch == 1 || p->desc.format == CP_FORMAT_SBHD);
}

static cp_status take_gathered(cp_attn_plan *p, cpi_arena *ws, int backward, gathered *g)
{
    const cp_attn_desc *d = &p->desc;
    const int64_t n = (int64_t)p->cp_size * p->s_loc;
    g->k = cpi_tensor_take(p, ws, n, d->num_kv_heads, d->head_dim, d->dtype);
    g->v = cpi_tensor_take(p, ws, n, d->num_kv_heads, d->head_dim_v, d->dtype);
    cpi_tensor one = { NULL, p->s_loc, d->num_kv_heads, d->head_dim, d->dtype };
    g->kblock = cpi_tensor_bytes(p, &one);
    one.dim = d->head_dim_v;
    g->vblock = cpi_tensor_bytes(p, &one);
    CPI_TRY(cpi_attend_scratch(p, p->max_rows, one_call(p) ? n : p->max_rows, d->num_heads, d->num_kv_heads,
                               backward, 0, &g->scratch_bytes));
    g->scratch = cpi_arena_take(ws, g->scratch_bytes);
    return cpi_arena_check(ws, "the gathered buffers");
}

static cp_status gather(cp_attn_plan *p, const void *k, const void *v, const gathered *g)
{
    cp_xfer x = cpi_group_xfer(p->group);
    CPI_TRY(cpi_all_gather(p->group->comm, &x, k, g->k.data, g->kblock));
    return cpi_all_gather(p->group->comm, &x, v, g->v.data, g->vblock);
}

cp_status cpi_all_gather_forward(cp_attn_plan *p, const cpi_fwd_args *a, cpi_arena *ws)
{
    const cp_attn_desc *d = &p->desc;
    gathered g;
    CPI_TRY(take_gathered(p, ws, 0, &g));
    cpi_tensor o32 = cpi_tensor_take(p, ws, p->s_loc, d->num_heads, d->head_dim_v, CP_DTYPE_F32);
    cpi_lse lse = { a->lse, p->s_loc, d->num_heads, NULL };
    cpi_lse_take_lo(p, ws, &lse);
    const cpi_sinks_scratch sk = cpi_sinks_take(p, ws, p->s_loc, d->num_heads);
    CPI_TRY(cpi_arena_check(ws, "the sinks' scratch"));
    if (ws->measuring)
        return CP_SUCCESS;

    cpi_tensor q = cpi_user_tensor(p, a->q, d->num_heads, d->head_dim, d->dtype);
    cpi_tensor out = cpi_user_tensor(p, a->out, d->num_heads, d->head_dim_v, cpi_plan_out_dtype(p));
    CPI_TRY(gather(p, a->k, a->v, &g));
    CPI_TRY(cpi_init_partial(p, &o32, &lse));
    if (one_call(p)) {
        cpi_attend_io io = { .q = &q, .k = &g.k, .v = &g.v, .tq = &p->mine, .tk = &p->gathered, .o32 = &o32,
                             .lse = &lse, .descale = a->descale, .scratch = g.scratch,
                             .scratch_bytes = g.scratch_bytes };
        CPI_TRY(cpi_attend(p, &io, 0));
    }
    for (int r = 0; !one_call(p) && r < p->cp_size; r++) {
        cpi_tensor k = cpi_tensor_block(p, &g.k, g.k.data, r), v = cpi_tensor_block(p, &g.v, g.v.data, r);
        cpi_attend_io io = { .q = &q, .k = &k, .v = &v, .tq = &p->mine, .tk = &p->sub[r], .o32 = &o32,
                            .lse = &lse, .descale = a->descale, .scratch = g.scratch,
                            .scratch_bytes = g.scratch_bytes };
        CPI_TRY(cpi_attend(p, &io, 0));
    }
    if (d->sinks)
        CPI_TRY(cpi_sinks_merge(p, &o32, &lse, 0, a->sinks, &sk));
    return cpi_convert_tensor(p, &out, &o32);
}

cp_status cpi_all_gather_backward(cp_attn_plan *p, const cpi_bwd_args *a, cpi_arena *ws)
{
    const cp_attn_desc *d = &p->desc;
    const int64_t n = (int64_t)p->cp_size * p->s_loc;
    gathered g;
    CPI_TRY(take_gathered(p, ws, 1, &g));
    cpi_tensor dkg = cpi_tensor_take(p, ws, n, d->num_kv_heads, d->head_dim, CP_DTYPE_F32);
    cpi_tensor dvg = cpi_tensor_take(p, ws, n, d->num_kv_heads, d->head_dim_v, CP_DTYPE_F32);
    cpi_tensor dq32 = cpi_tensor_take(p, ws, p->s_loc, d->num_heads, d->head_dim, CP_DTYPE_F32);
    cpi_tensor dk32 = cpi_tensor_take(p, ws, p->s_loc, d->num_kv_heads, d->head_dim, CP_DTYPE_F32);
    cpi_tensor dv32 = cpi_tensor_take(p, ws, p->s_loc, d->num_kv_heads, d->head_dim_v, CP_DTYPE_F32);
    float *drow = cpi_drow_take(p, ws, p->s_loc, d->num_heads); /* rowsum(dO * O), once per query span */
    /* the reduce-scatters' staging, so that they neither allocate nor wait */
    const size_t kcount = g.kblock / cpi_dtype_size(d->dtype), vcount = g.vblock / cpi_dtype_size(d->dtype);
    const size_t stage_bytes = cpi_reduce_scratch_bytes(kcount > vcount ? kcount : vcount, CP_DTYPE_F32, true);
    void *stage = cpi_arena_take(ws, stage_bytes);
    CPI_TRY(cpi_arena_check(ws, "the reduction staging"));
    if (ws->measuring)
        return CP_SUCCESS;

    cpi_tensor q = cpi_user_tensor(p, a->q, d->num_heads, d->head_dim, d->dtype);
    cpi_tensor o = cpi_user_tensor(p, a->out, d->num_heads, d->head_dim_v, d->dtype);
    cpi_tensor dout = cpi_user_tensor(p, a->dout, d->num_heads, d->head_dim_v, d->dtype);
    cpi_tensor dq = cpi_user_tensor(p, a->dq, d->num_heads, d->head_dim, d->dtype);
    cpi_tensor dk = cpi_user_tensor(p, a->dk, d->num_kv_heads, d->head_dim, d->dtype);
    cpi_tensor dv = cpi_user_tensor(p, a->dv, d->num_kv_heads, d->head_dim_v, d->dtype);
    cpi_lse lse = { (float *)a->lse, p->s_loc, d->num_heads, NULL };
    CPI_TRY(gather(p, a->k, a->v, &g));
    CPI_TRY(cpi_zero(p, &dkg));
    CPI_TRY(cpi_zero(p, &dvg));
    CPI_TRY(cpi_zero(p, &dq32));
    memset(p->drow_ready, 0, (size_t)p->mine.nspans);
    if (one_call(p)) {
        cpi_attend_io io = { .q = &q, .k = &g.k, .v = &g.v, .tq = &p->mine, .tk = &p->gathered, .lse = &lse,
                             .o = &o, .dout = &dout, .dq32 = &dq32, .dk32 = &dkg, .dv32 = &dvg, .drow = drow,
                             .drow_ready = p->drow_ready, .scratch = g.scratch, .scratch_bytes = g.scratch_bytes };
        CPI_TRY(cpi_attend(p, &io, 1));
    }
    for (int r = 0; !one_call(p) && r < p->cp_size; r++) {
        cpi_tensor k = cpi_tensor_block(p, &g.k, g.k.data, r), v = cpi_tensor_block(p, &g.v, g.v.data, r);
        cpi_tensor dk_r = cpi_tensor_block(p, &dkg, dkg.data, r), dv_r = cpi_tensor_block(p, &dvg, dvg.data, r);
        cpi_attend_io io = { .q = &q, .k = &k, .v = &v, .tq = &p->mine, .tk = &p->sub[r], .lse = &lse,
                            .o = &o, .dout = &dout, .dq32 = &dq32, .dk32 = &dk_r, .dv32 = &dv_r, .drow = drow,
                            .drow_ready = p->drow_ready, .scratch = g.scratch, .scratch_bytes = g.scratch_bytes };
        CPI_TRY(cpi_attend(p, &io, 1));
    }
    cp_xfer x = cpi_group_xfer(p->group);
    CPI_TRY(cpi_reduce_scatter_ws(p->group->comm, &x, dkg.data, dk32.data, kcount, CP_DTYPE_F32, CP_REDUCE_SUM,
                                  stage, stage_bytes));
    CPI_TRY(cpi_reduce_scatter_ws(p->group->comm, &x, dvg.data, dv32.data, vcount, CP_DTYPE_F32, CP_REDUCE_SUM,
                                  stage, stage_bytes));
    CPI_TRY(cpi_convert_tensor(p, &dq, &dq32));
    CPI_TRY(cpi_convert_tensor(p, &dk, &dk32));
    return cpi_convert_tensor(p, &dv, &dv32);
}
