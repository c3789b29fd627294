/* SPDX-License-Identifier: MIT */
/*
 * The p2p ring (DESIGN.md section 3) over p->ring_comm, R members. Member m
 * holds the queries of token set p->sub[m]; at step s it holds the keys and
 * values of member (m - s) mod R, attends to them, and passes them to m + 1
 * while receiving the next from m - 1 (double buffer). Backward: the fp32
 * dK/dV accumulator of each key block travels with it and arrives home after
 * R hops; dQ accumulates locally.
 */
#include "attn/plan.h"

typedef struct ring_bufs {
    cpi_tensor k[2], v[2];   /* circulating K, V (storage type) */
    cpi_tensor dk[2], dv[2]; /* circulating fp32 accumulators (backward) */
    void *scratch;
    size_t scratch_bytes;
} ring_bufs;

static cp_status take_bufs(cp_attn_plan *p, const cpi_tensor *k, const cpi_tensor *v, int backward,
                           cpi_arena *ws, ring_bufs *b)
{
    const int steps = p->R;
    for (int i = 0; i < 2 && steps > 1; i++) {
        b->k[i] = cpi_tensor_take(p, ws, k->ntok, k->heads, k->dim, k->dtype);
        b->v[i] = cpi_tensor_take(p, ws, v->ntok, v->heads, v->dim, v->dtype);
        if (backward) {
            b->dk[i] = cpi_tensor_take(p, ws, k->ntok, k->heads, k->dim, CP_DTYPE_F32);
            b->dv[i] = cpi_tensor_take(p, ws, v->ntok, v->heads, v->dim, CP_DTYPE_F32);
        }
    }
    CPI_TRY(cpi_attend_scratch(p, p->max_span, p->max_span, p->heads.hq, p->heads.hkv, backward, &b->scratch_bytes));
    b->scratch = cpi_arena_take(ws, b->scratch_bytes);
    return CP_SUCCESS;
}

static int ring_rank(const cp_attn_plan *p)
{
    return p->ring_rank;
}

/* Pass `t` to the next member and receive the previous member's into `into`. */
static cp_status shift(cp_attn_plan *p, const cpi_tensor *t, const cpi_tensor *into)
{
    const int m = ring_rank(p), R = p->R;
    cp_xfer x = cpi_group_xfer(p->g);
    size_t bytes = cpi_tensor_bytes(p, t);
    return cpi_sendrecv(p->ring_comm, &x, t->p, bytes, (m + 1) % R, into->p, bytes, (m + R - 1) % R);
}

cp_status cpi_ring_forward(cp_attn_plan *p, const cpi_tensor *q, const cpi_tensor *k, const cpi_tensor *v,
                           const cpi_tensor *o32, const cpi_lse *lse, cpi_arena *ws)
{
    ring_bufs b = { 0 };
    CPI_TRY(take_bufs(p, k, v, 0, ws, &b));
    if (ws->measuring)
        return CP_SUCCESS;

    const int m = ring_rank(p), R = p->R;
    const cpi_tensor *ck = k, *cv = v;
    for (int s = 0; s < R; s++) {
        const int src = (m - s + R) % R;
        cpi_block_io io = { .q = q, .k = ck, .v = cv, .tq = &p->sub[m], .tk = &p->sub[src],
                            .o32 = o32, .lse = lse, .scratch = b.scratch, .scratch_bytes = b.scratch_bytes };
        CPI_TRY(cpi_attend(p, &io, 0));
        if (s + 1 < R) {
            const int nx = s & 1;
            CPI_TRY(shift(p, ck, &b.k[nx]));
            CPI_TRY(shift(p, cv, &b.v[nx]));
            ck = &b.k[nx];
            cv = &b.v[nx];
        }
    }
    return CP_SUCCESS;
}

cp_status cpi_ring_backward(cp_attn_plan *p, const cpi_tensor *q, const cpi_tensor *k, const cpi_tensor *v,
                            const cpi_tensor *o, const cpi_lse *lse, const cpi_tensor *dout,
                            const cpi_tensor *dq32, const cpi_tensor *dk32, const cpi_tensor *dv32,
                            cpi_arena *ws)
{
    ring_bufs b = { 0 };
    CPI_TRY(take_bufs(p, k, v, 1, ws, &b));
    if (ws->measuring)
        return CP_SUCCESS;

    const int m = ring_rank(p), R = p->R;
    const cpi_tensor *ck = k, *cv = v;
    /* With one member the accumulators never travel. */
    const cpi_tensor *cdk = R == 1 ? dk32 : &b.dk[1], *cdv = R == 1 ? dv32 : &b.dv[1];
    CPI_TRY(cpi_zero(p, dq32));
    CPI_TRY(cpi_zero(p, cdk));
    CPI_TRY(cpi_zero(p, cdv));
    for (int s = 0; s < R; s++) {
        const int src = (m - s + R) % R;
        cpi_block_io io = { .q = q, .k = ck, .v = cv, .tq = &p->sub[m], .tk = &p->sub[src], .lse = lse,
                            .o = o, .dout = dout, .dq32 = dq32, .dk32 = cdk, .dv32 = cdv,
                            .scratch = b.scratch, .scratch_bytes = b.scratch_bytes };
        CPI_TRY(cpi_attend(p, &io, 1));
        if (R == 1)
            break;
        const int nx = s & 1;
        if (s + 1 < R) {
            CPI_TRY(shift(p, ck, &b.k[nx]));
            CPI_TRY(shift(p, cv, &b.v[nx]));
            ck = &b.k[nx];
            cv = &b.v[nx];
            /* the accumulator goes with its block; the incoming one holds the
             * sums of the members it already visited */
            CPI_TRY(shift(p, cdk, &b.dk[nx]));
            CPI_TRY(shift(p, cdv, &b.dv[nx]));
            cdk = &b.dk[nx];
            cdv = &b.dv[nx];
        } else {
            /* last hop: every accumulator arrives home */
            CPI_TRY(shift(p, cdk, dk32));
            CPI_TRY(shift(p, cdv, dv32));
        }
    }
    return CP_SUCCESS;
}
