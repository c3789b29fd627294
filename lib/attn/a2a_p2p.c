/* SPDX-License-Identifier: MIT */
/*
 * The p2p, a2a and a2a_p2p modes: one path (docs/ARCHITECTURE.md, CP
 * modes). a2a inside sub-groups of A = p->a2a_size consecutive cp ranks
 * turns [my tokens, all heads] into [the sub-group's tokens, my head slice]
 * (a2a.c); the ring runs across the R = P / A sub-groups (ring.c); a2a
 * brings the results back to [my tokens, all heads]. p2p is the case
 * A == 1 (no exchange: the ring over the caller's own tensors), a2a (Ulysses)
 * the case A == P (a ring of one member: no hop).
 */
#include "attn/plan.h"
#include "attn/ring.h"

/* Exchange buffers: large enough for the largest of the given items that
 * goes through them (cpi_a2a_item_buffered). */
static void take_exchange(cp_attn_plan *p, cpi_arena *ws, const cpi_a2a_item *items, int n, void **send,
                          void **recv)
{
    size_t block = 0;
    for (int i = 0; i < n; i++) {
        if (!cpi_a2a_item_buffered(p, &items[i]))
            continue;
        size_t b = cpi_a2a_item_bytes(p, &items[i]);
        if (b > block)
            block = b;
    }
    *send = cpi_arena_take(ws, block * (size_t)p->a2a_size);
    *recv = cpi_arena_take(ws, block * (size_t)p->a2a_size);
}

cp_status cpi_a2a_p2p_forward(cp_attn_plan *p, const cpi_fwd_args *a, cpi_arena *ws)
{
    const cp_attn_desc *d = &p->desc;
    const int32_t H = d->num_heads, Hkv = d->num_kv_heads, hq = p->heads.hq, hkv = p->heads.hkv;
    const int64_t T = p->sub[p->ring_rank].ntok;
    cpi_tensor uq = cpi_user_tensor(p, a->q, H, d->head_dim, d->dtype);
    cpi_tensor uk = cpi_user_tensor(p, a->k, Hkv, d->head_dim, d->dtype);
    cpi_tensor uv = cpi_user_tensor(p, a->v, Hkv, d->head_dim_v, d->dtype);
    cpi_tensor uo = cpi_user_tensor(p, a->out, H, d->head_dim_v, cpi_plan_out_dtype(p));
    cpi_lse ulse = { a->lse, p->s_loc, H, NULL };
    /* my head slice's descales: the kernels see heads from the slice's first */
    const int member = p->rank % p->a2a_size;
    const cpi_descale ds =
        cpi_descale_slice(&a->descale, cpi_a2a_head_first(p, 0, member), cpi_a2a_head_first(p, 1, member));

    /* With A == 1 the head side is the caller's own tensors. */
    cpi_tensor qh = uq, kh = uk, vh = uv, oh = uo;
    cpi_lse lseh = ulse;
    void *send = NULL, *recv = NULL;
    if (p->a2a_size > 1) {
        qh = cpi_tensor_take(p, ws, T, hq, d->head_dim, d->dtype);
        kh = cpi_tensor_take(p, ws, T, hkv, d->head_dim, d->dtype);
        vh = cpi_tensor_take(p, ws, T, hkv, d->head_dim_v, d->dtype);
        oh = cpi_tensor_take(p, ws, T, hq, d->head_dim_v, uo.dtype);
        lseh = cpi_lse_take(p, ws, T, hq);
    }
    cpi_tensor o32 = cpi_tensor_take(p, ws, T, hq, d->head_dim_v, CP_DTYPE_F32);
    cpi_lse_take_lo(p, ws, &lseh);
    const cpi_sinks_scratch sk = cpi_sinks_take(p, ws, T, hq);
    const cpi_a2a_item iq = { &uq, NULL, &qh, NULL, 0 }, ik = { &uk, NULL, &kh, NULL, 1 },
                       iv = { &uv, NULL, &vh, NULL, 1 }, io = { &uo, NULL, &oh, NULL, 0 },
                       il = { NULL, &ulse, NULL, &lseh, 0 };
    if (p->a2a_size > 1) {
        const cpi_a2a_item all[] = { iq, ik, iv, io, il };
        take_exchange(p, ws, all, 5, &send, &recv);
    }
    CPI_TRY(cpi_arena_check(ws, "the exchange buffers"));
    if (ws->measuring)
        return cpi_ring_forward(p, &qh, &kh, &vh, &o32, &lseh, &ds, NULL, ws);

    /* one kernel call makes the whole result (CP = 1, a2a): it goes straight
     * into oh (sinks merge into the fp32 partial: not then) */
    int direct = 0;
    if (!d->sinks)
        CPI_TRY(cpi_ring_direct(p, 0, 0, &direct));
    if (p->a2a_size > 1) {
        CPI_TRY(cpi_a2a_to_heads(p, &iq, send, recv));
        CPI_TRY(cpi_a2a_to_heads(p, &ik, send, recv));
        CPI_TRY(cpi_a2a_to_heads(p, &iv, send, recv));
    }
    if (direct) {
        CPI_TRY(cpi_ring_forward(p, &qh, &kh, &vh, NULL, &lseh, &ds, &oh, ws));
    } else {
        CPI_TRY(cpi_init_partial(p, &o32, &lseh));
        CPI_TRY(cpi_ring_forward(p, &qh, &kh, &vh, &o32, &lseh, &ds, NULL, ws));
        if (d->sinks) /* my head slice's sinks */
            CPI_TRY(cpi_sinks_merge(p, &o32, &lseh, cpi_a2a_head_first(p, 0, member), a->sinks, &sk));
        CPI_TRY(cpi_convert_tensor(p, &oh, &o32));
    }
    if (p->a2a_size > 1) {
        CPI_TRY(cpi_a2a_to_tokens(p, &io, send, recv, 0));
        CPI_TRY(cpi_a2a_to_tokens(p, &il, send, recv, 0));
    }
    return CP_SUCCESS;
}

cp_status cpi_a2a_p2p_backward(cp_attn_plan *p, const cpi_bwd_args *a, cpi_arena *ws)
{
    const cp_attn_desc *d = &p->desc;
    const int32_t H = d->num_heads, Hkv = d->num_kv_heads, hq = p->heads.hq, hkv = p->heads.hkv;
    const int32_t D = d->head_dim, Dv = d->head_dim_v;
    const int64_t T = p->sub[p->ring_rank].ntok;
    cpi_tensor uq = cpi_user_tensor(p, a->q, H, D, d->dtype), uk = cpi_user_tensor(p, a->k, Hkv, D, d->dtype),
               uv = cpi_user_tensor(p, a->v, Hkv, Dv, d->dtype), uo = cpi_user_tensor(p, a->out, H, Dv, d->dtype),
               udo = cpi_user_tensor(p, a->dout, H, Dv, d->dtype), udq = cpi_user_tensor(p, a->dq, H, D, d->dtype),
               udk = cpi_user_tensor(p, a->dk, Hkv, D, d->dtype), udv = cpi_user_tensor(p, a->dv, Hkv, Dv, d->dtype);
    cpi_lse ulse = { (float *)a->lse, p->s_loc, H, NULL };

    cpi_tensor qh = uq, kh = uk, vh = uv, oh = uo, doh = udo, dqh = udq;
    cpi_lse lseh = ulse;
    cpi_tensor dk_loc = { 0 }, dv_loc = { 0 }, dkh = { 0 }, dvh = { 0 };
    /* With fewer kv heads than members, members share (replicate) kv heads
     * and the way back sums their dK / dV in fp32; otherwise every kv head
     * has one owner, whose gradients go back in the storage type (half the
     * bytes of fp32 for F16 / BF16, and no conversion on the token side). */
    const int replicas = p->a2a_size > 1 && Hkv < p->a2a_size;
    if (p->a2a_size > 1) {
        qh = cpi_tensor_take(p, ws, T, hq, D, d->dtype);
        kh = cpi_tensor_take(p, ws, T, hkv, D, d->dtype);
        vh = cpi_tensor_take(p, ws, T, hkv, Dv, d->dtype);
        oh = cpi_tensor_take(p, ws, T, hq, Dv, d->dtype);
        doh = cpi_tensor_take(p, ws, T, hq, Dv, d->dtype);
        dqh = cpi_tensor_take(p, ws, T, hq, D, d->dtype);
        lseh = cpi_lse_take(p, ws, T, hq);
        if (replicas) { /* gradients of my tokens, all kv heads, summed over replicas in fp32 */
            dk_loc = cpi_tensor_take(p, ws, p->s_loc, Hkv, D, CP_DTYPE_F32);
            dv_loc = cpi_tensor_take(p, ws, p->s_loc, Hkv, Dv, CP_DTYPE_F32);
        } else {
            dkh = cpi_tensor_take(p, ws, T, hkv, D, d->dtype);
            dvh = cpi_tensor_take(p, ws, T, hkv, Dv, d->dtype);
        }
    }
    /* one kernel call makes the whole result (CP = 1, a2a without kv
     * replicas): the gradients go straight into their storage type, and
     * the fp32 partials are not taken (their bytes may serve the call's
     * scratch) */
    cpi_tensor dq32 = { NULL, T, hq, D, CP_DTYPE_F32 }, dk32 = { NULL, T, hkv, D, CP_DTYPE_F32 },
               dv32 = { NULL, T, hkv, Dv, CP_DTYPE_F32 };
    int direct = 0;
    if (!replicas && !ws->measuring)
        CPI_TRY(cpi_ring_direct(
            p, 1, cpi_tensor_bytes(p, &dq32) + cpi_tensor_bytes(p, &dk32) + cpi_tensor_bytes(p, &dv32), &direct));
    if (!direct) {
        dq32.data = cpi_arena_take(ws, cpi_tensor_bytes(p, &dq32));
        dk32.data = cpi_arena_take(ws, cpi_tensor_bytes(p, &dk32));
        dv32.data = cpi_arena_take(ws, cpi_tensor_bytes(p, &dv32));
    }
    const cpi_a2a_item iq = { &uq, NULL, &qh, NULL, 0 }, ik = { &uk, NULL, &kh, NULL, 1 },
                       iv = { &uv, NULL, &vh, NULL, 1 }, io = { &uo, NULL, &oh, NULL, 0 },
                       ido = { &udo, NULL, &doh, NULL, 0 }, il = { NULL, &ulse, NULL, &lseh, 0 },
                       idq = { &udq, NULL, &dqh, NULL, 0 },
                       idk = replicas ? (cpi_a2a_item){ &dk_loc, NULL, &dk32, NULL, 1 }
                                      : (cpi_a2a_item){ &udk, NULL, &dkh, NULL, 1 },
                       idv = replicas ? (cpi_a2a_item){ &dv_loc, NULL, &dv32, NULL, 1 }
                                      : (cpi_a2a_item){ &udv, NULL, &dvh, NULL, 1 };
    void *send = NULL, *recv = NULL;
    if (p->a2a_size > 1) {
        const cpi_a2a_item all[] = { iq, ik, iv, io, ido, il, idq, idk, idv };
        take_exchange(p, ws, all, 9, &send, &recv);
    }
    CPI_TRY(cpi_arena_check(ws, "the exchange buffers"));
    if (ws->measuring)
        return cpi_ring_backward(p, &qh, &kh, &vh, &oh, &lseh, &doh, &dq32, &dk32, &dv32, NULL, ws);

    const cpi_tensor *fin[3] = { &udq, &udk, &udv };
    if (p->a2a_size > 1)
        fin[0] = &dqh, fin[1] = &dkh, fin[2] = &dvh;
    if (p->a2a_size > 1) {
        const cpi_a2a_item in[] = { iq, ik, iv, io, ido, il };
        for (int i = 0; i < 6; i++)
            CPI_TRY(cpi_a2a_to_heads(p, &in[i], send, recv));
    }
    CPI_TRY(cpi_ring_backward(p, &qh, &kh, &vh, &oh, &lseh, &doh, &dq32, &dk32, &dv32, direct ? fin : NULL, ws));
    if (p->a2a_size == 1) {
        if (direct)
            return CP_SUCCESS;
        CPI_TRY(cpi_convert_tensor(p, &udq, &dq32));
        CPI_TRY(cpi_convert_tensor(p, &udk, &dk32));
        return cpi_convert_tensor(p, &udv, &dv32);
    }
    if (!direct) {
        CPI_TRY(cpi_convert_tensor(p, &dqh, &dq32));
        if (!replicas) {
            CPI_TRY(cpi_convert_tensor(p, &dkh, &dk32));
            CPI_TRY(cpi_convert_tensor(p, &dvh, &dv32));
        }
    }
    CPI_TRY(cpi_a2a_to_tokens(p, &idq, send, recv, 0));
    CPI_TRY(cpi_a2a_to_tokens(p, &idk, send, recv, 1));
    CPI_TRY(cpi_a2a_to_tokens(p, &idv, send, recv, 1));
    if (!replicas)
        return CP_SUCCESS;
    CPI_TRY(cpi_convert_tensor(p, &udk, &dk_loc));
    return cpi_convert_tensor(p, &udv, &dv_loc);
}
