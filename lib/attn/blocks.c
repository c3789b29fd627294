/* SPDX-License-Identifier: MIT */
/* Attention between two token sets: one kernel call per span pair, with the
 * spans' global offsets, skipping the pairs that causality hides. Every CP
 * mode computes through this one function. */
#include "attn/plan.h"

static void set_tensor(const cp_attn_plan *p, const cpi_tensor *t, int64_t row, const void **ptr,
                       int64_t *sb, int64_t *ss, int64_t *sh)
{
    cpi_tensor_strides(p, t, sb, ss, sh);
    *ptr = (const char *)t->p + (size_t)row * (size_t)*ss * cpi_dtype_size(t->dtype);
}

/* Does the causal mask hide every key of span k from every query of span q? */
static int hidden(const cp_attn_plan *p, cpi_span q, cpi_span k)
{
    return p->d.mask == CP_MASK_CAUSAL && k.offset > q.offset + q.len - 1;
}

static void base_args(const cp_attn_plan *p, const cpi_block_io *io, cp_kernel_attn_args *a)
{
    *a = (cp_kernel_attn_args)CP_KERNEL_ATTN_ARGS_INIT;
    a->dtype = io->q->dtype;
    a->format = p->d.format;
    a->batch = p->d.batch;
    a->num_heads = io->q->heads;
    a->num_kv_heads = io->k->heads;
    a->head_dim = p->d.head_dim;
    a->head_dim_v = p->d.head_dim_v;
    a->mask = p->d.mask;
    a->softmax_scale = p->d.softmax_scale;
    a->workspace = io->scratch;
    a->workspace_bytes = io->scratch_bytes;
}

cp_status cpi_attend(const cp_attn_plan *p, const cpi_block_io *io, int backward)
{
    const cp_backend_ops *ops = p->ctx->ops;
    cp_kernel_attn_args a;
    base_args(p, io, &a);
    for (int i = 0; i < io->tq->n; i++) {
        const cpi_span qs = io->tq->span[i];
        const int64_t qr = io->tq->row[i];
        for (int j = 0; j < io->tk->n; j++) {
            const cpi_span ks = io->tk->span[j];
            const int64_t kr = io->tk->row[j];
            if (hidden(p, qs, ks))
                continue;
            a.seq_q = qs.len;
            a.seq_k = ks.len;
            a.q_offset = qs.offset;
            a.k_offset = ks.offset;
            set_tensor(p, io->q, qr, &a.q, &a.q_stride_b, &a.q_stride_s, &a.q_stride_h);
            set_tensor(p, io->k, kr, &a.k, &a.k_stride_b, &a.k_stride_s, &a.k_stride_h);
            set_tensor(p, io->v, kr, &a.v, &a.v_stride_b, &a.v_stride_s, &a.v_stride_h);
            const cpi_lse *l = io->lse;
            a.lse = l->p + qr;
            a.lse_stride_b = (int64_t)l->heads * l->ntok;
            a.lse_stride_h = l->ntok;
            const void *c;
            if (!backward) {
                set_tensor(p, io->o32, qr, &c, &a.o_stride_b, &a.o_stride_s, &a.o_stride_h);
                a.o = (void *)c;
                a.o_dtype = CP_DTYPE_F32;
                a.accumulate = 1;
                a.lse_lo = l->lo ? l->lo + qr : NULL;
                CPI_TRY(ops->attn_forward(p->ctx->state, &a));
                continue;
            }
            set_tensor(p, io->o, qr, &c, &a.o_stride_b, &a.o_stride_s, &a.o_stride_h);
            a.o = (void *)c;
            a.o_dtype = io->o->dtype;
            set_tensor(p, io->dout, qr, &a.dout, &a.dout_stride_b, &a.dout_stride_s, &a.dout_stride_h);
            set_tensor(p, io->dq32, qr, &c, &a.dq_stride_b, &a.dq_stride_s, &a.dq_stride_h);
            a.dq = (void *)c;
            set_tensor(p, io->dk32, kr, &c, &a.dk_stride_b, &a.dk_stride_s, &a.dk_stride_h);
            a.dk = (void *)c;
            set_tensor(p, io->dv32, kr, &c, &a.dv_stride_b, &a.dv_stride_s, &a.dv_stride_h);
            a.dv = (void *)c;
            a.grad_dtype = CP_DTYPE_F32;
            a.grad_accumulate = 1;
            CPI_TRY(ops->attn_backward(p->ctx->state, &a));
        }
    }
    return CP_SUCCESS;
}

cp_status cpi_attend_scratch(const cp_attn_plan *p, int64_t max_q, int64_t max_k, int32_t hq, int32_t hkv,
                             int backward, size_t *bytes)
{
    /* The kernels' scratch depends on the block shape only; ask for the
     * largest block this plan will run. Pointers stay NULL: size query. */
    cpi_tensor q = { NULL, max_q, hq, p->d.head_dim, p->d.dtype };
    cpi_tensor k = { NULL, max_k, hkv, p->d.head_dim, p->d.dtype };
    cpi_block_io io = { .q = &q, .k = &k };
    cp_kernel_attn_args a;
    base_args(p, &io, &a);
    a.seq_q = max_q;
    a.seq_k = max_k;
    a.o_dtype = backward ? p->d.dtype : CP_DTYPE_F32;
    a.accumulate = !backward;
    a.grad_dtype = CP_DTYPE_F32;
    a.grad_accumulate = 1;
    return p->ctx->ops->attn_workspace_size(p->ctx->state, &a, backward, bytes);
}
