/* SPDX-License-Identifier: MIT */
/* Attention between two token sets: kernel calls over span pairs, with the
 * spans' global offsets, skipping the pairs that causality hides
 * (docs/ARCHITECTURE.md, Spans and token sets). Every CP mode computes
 * through this one function, cpi_attend. */
#include <stdlib.h>

#include "attn/plan.h"

static void set_tensor(const cp_attn_plan *p, const cpi_tensor *t, int64_t row, const void **ptr,
                       int64_t *sb, int64_t *ss, int64_t *sh)
{
    cpi_tensor_strides(p, t, sb, ss, sh);
    *ptr = (const char *)t->data + (size_t)row * (size_t)*ss * cpi_dtype_size(t->dtype);
}

/* How the causal mask treats span pair (q, k): every key hidden from every
 * query, every key visible to every query, or a diagonal in between. */
typedef enum { PAIR_HIDDEN, PAIR_FULL, PAIR_PARTIAL } pair_kind;

static pair_kind classify(const cp_attn_plan *p, cpi_span q, cpi_span k)
{
    if (p->desc.mask != CP_MASK_CAUSAL)
        return PAIR_FULL;
    if (k.offset > q.offset + q.len - 1)
        return PAIR_HIDDEN;
    return k.offset + k.len - 1 <= q.offset ? PAIR_FULL : PAIR_PARTIAL;
}

static void base_args(const cp_attn_plan *p, const cpi_attend_io *io, cp_kernel_attn_args *a)
{
    *a = (cp_kernel_attn_args)CP_KERNEL_ATTN_ARGS_INIT;
    a->dtype = io->q->dtype;
    a->format = p->desc.format;
    a->batch = p->desc.batch;
    a->num_heads = io->q->heads;
    a->num_kv_heads = io->k->heads;
    a->head_dim = p->desc.head_dim;
    a->head_dim_v = p->desc.head_dim_v;
    a->mask = p->desc.mask;
    a->softmax_scale = p->desc.softmax_scale;
    a->window = p->desc.window;
    a->softcap = p->desc.softcap;
    a->q_descale = io->descale.q;
    a->k_descale = io->descale.k;
    a->v_descale = io->descale.v;
    a->descale_per_head = io->descale.per_head;
    a->workspace = io->scratch;
    a->workspace_bytes = io->scratch_bytes;
}

/* One kernel call: query rows [qr, qr + nq) at global offset qoff against key
 * rows [kr, kr + nk) at koff, under `mask`. */
static cp_status call(const cp_attn_plan *p, const cpi_attend_io *io, cp_kernel_attn_args *a, int64_t qr,
                      int64_t nq, int64_t qoff, int64_t kr, int64_t nk, int64_t koff, cp_mask mask, int backward)
{
    const cp_backend_ops *ops = p->ctx->ops;
    a->seq_q = nq;
    a->seq_k = nk;
    a->q_offset = qoff;
    a->k_offset = koff;
    a->mask = mask;
    set_tensor(p, io->q, qr, &a->q, &a->q_stride_b, &a->q_stride_s, &a->q_stride_h);
    set_tensor(p, io->k, kr, &a->k, &a->k_stride_b, &a->k_stride_s, &a->k_stride_h);
    set_tensor(p, io->v, kr, &a->v, &a->v_stride_b, &a->v_stride_s, &a->v_stride_h);
    const cpi_lse *l = io->lse;
    a->lse = l->data + qr;
    a->lse_stride_b = (int64_t)l->heads * l->ntok;
    a->lse_stride_h = l->ntok;
    const void *c;
    if (!backward) {
        const cpi_tensor *o = io->out ? io->out : io->o32;
        set_tensor(p, o, qr, &c, &a->o_stride_b, &a->o_stride_s, &a->o_stride_h);
        a->o = (void *)c;
        a->o_dtype = o->dtype;
        a->accumulate = !io->out;
        a->lse_lo = !io->out && l->lo ? l->lo + qr : NULL;
        return ops->attn_forward(p->ctx->state, a);
    }
    set_tensor(p, io->o, qr, &c, &a->o_stride_b, &a->o_stride_s, &a->o_stride_h);
    a->o = (void *)c;
    a->o_dtype = io->o->dtype;
    set_tensor(p, io->dout, qr, &a->dout, &a->dout_stride_b, &a->dout_stride_s, &a->dout_stride_h);
    const int direct = io->dq_out != NULL;
    const cpi_tensor *dq = direct ? io->dq_out : io->dq32, *dk = direct ? io->dk_out : io->dk32,
                     *dv = direct ? io->dv_out : io->dv32;
    set_tensor(p, dq, qr, &c, &a->dq_stride_b, &a->dq_stride_s, &a->dq_stride_h);
    a->dq = (void *)c;
    set_tensor(p, dk, kr, &c, &a->dk_stride_b, &a->dk_stride_s, &a->dk_stride_h);
    a->dk = (void *)c;
    set_tensor(p, dv, kr, &c, &a->dv_stride_b, &a->dv_stride_s, &a->dv_stride_h);
    a->dv = (void *)c;
    a->grad_dtype = dq->dtype;
    a->grad_accumulate = !direct;
    a->drow = io->drow ? io->drow + qr : NULL;
    return ops->attn_backward(p->ctx->state, a);
}

/* call() over query spans [i0, i1] of tq (nq rows) against key spans from
 * j0 of tk (nk rows). With a rowsum buffer (backward), the call reads it if
 * earlier calls stored all these spans' rows, stores them otherwise. */
static cp_status call_spans(const cp_attn_plan *p, const cpi_attend_io *io, cp_kernel_attn_args *a, int i0, int i1,
                            int64_t nq, int j0, int64_t nk, cp_mask mask, int backward)
{
    const cpi_tokset *tq = io->tq, *tk = io->tk;
    const int track = backward && io->drow;
    a->drow_ready = track;
    for (int i = i0; track && i <= i1; i++)
        a->drow_ready &= io->drow_ready[i];
    cp_status s = call(p, io, a, tq->row[i0], nq, tq->span[i0].offset, tk->row[j0], nk, tk->span[j0].offset, mask,
                       backward);
    for (int i = i0; track && s == CP_SUCCESS && i <= i1; i++)
        io->drow_ready[i] = 1;
    return s;
}

/* Whether span i + 1 of t follows span i in t's rows. */
static int rows_follow(const cpi_tokset *t, int i)
{
    return i + 1 < t->nspans && t->row[i + 1] == t->row[i] + t->span[i].len;
}

/*
 * Whether a causal block over token sets tq x tk is causal over buffer rows:
 * both the same spans in the same rows, laid out back to back in the order
 * of their offsets. Then every earlier span is fully visible to every later
 * one and hidden from every earlier one, exactly as the kernel's causal mask
 * with equal query and key offsets treats buffer rows - so the whole block
 * is one call. With zigzag p2p this is every rank's diagonal step (its early
 * and its late chunk, whose three visible pairs were three calls): fewer,
 * larger calls, whose blocks' fixed costs and tails weigh less.
 */
static int causal_over_rows(const cp_attn_plan *p, const cpi_tokset *tq, const cpi_tokset *tk)
{
    if (p->desc.mask != CP_MASK_CAUSAL || tq->nspans < 2 || tq->nspans != tk->nspans)
        return 0;
    for (int i = 0; i < tq->nspans; i++) {
        if (tq->span[i].offset != tk->span[i].offset || tq->span[i].len != tk->span[i].len ||
            tq->row[i] != tk->row[i])
            return 0;
        if (i + 1 < tq->nspans &&
            (!rows_follow(tq, i) || tq->span[i + 1].offset < tq->span[i].offset + tq->span[i].len))
            return 0;
    }
    return 1;
}

/*
 * Pairs that the mask leaves fully visible need no mask, so neighbouring
 * ones whose rows are adjacent in the buffers go in one call: a rectangle of
 * query spans [i0, i1] x key spans [j0, j1], grown greedily - first along
 * the keys, then along the queries. With zigzag p2p this turns the two
 * quarter blocks of every ring step into one call of twice the size (half
 * the launches and half the passes over the running output or gradient).
 * Diagonal pairs go one by one, with the causal mask.
 */
/*
 * API 1.1: the whole block in one call, as rectangles (vis.h): one per
 * (query span, key span, document) whose pairs the mask and window do not
 * all hide. A block with none makes no call.
 */
static cp_status attend_rects(const cp_attn_plan *p, const cpi_attend_io *io, cp_kernel_attn_args *a, int backward)
{
    const cpi_tokset *tq = io->tq, *tk = io->tk;
    cp_attn_rect *rects;
    int64_t n;
    CPI_TRY(cpi_vis_rects(&p->vis, tq, tk, &rects, &n));
    cp_status s = CP_SUCCESS;
    if (n) {
        a->rects = rects;
        a->num_rects = n;
        /* call_spans with every span: rows from the buffers' first */
        const int track = backward && io->drow;
        a->drow_ready = track;
        for (int i = 0; track && i < tq->nspans; i++)
            a->drow_ready &= io->drow_ready[i];
        s = call(p, io, a, 0, tq->ntok, 0, 0, tk->ntok, 0, p->desc.mask, backward);
        for (int i = 0; track && s == CP_SUCCESS && i < tq->nspans; i++)
            io->drow_ready[i] = 1;
    }
    free(rects);
    return s;
}

/* The calls of a block without rectangles, each as fn(arg, i0, i1, nq, j0,
 * nk, mask): query spans [i0, i1] of tq (nq rows) against key spans from
 * j0 of tk (nk rows). */
typedef cp_status (*pair_fn)(void *arg, int i0, int i1, int64_t nq, int j0, int64_t nk, cp_mask mask);

static cp_status pair_calls(const cp_attn_plan *p, const cpi_tokset *tq, const cpi_tokset *tk, pair_fn fn,
                            void *arg)
{
    if (causal_over_rows(p, tq, tk)) { /* equal spans: equal offsets too */
        int64_t n = 0;
        for (int i = 0; i < tq->nspans; i++)
            n += tq->span[i].len;
        return fn(arg, 0, tq->nspans - 1, n, 0, n, CP_MASK_CAUSAL);
    }
    unsigned char *done = cpi_calloc((size_t)tq->nspans * (size_t)tk->nspans, 1);
    if (!done)
        return CP_ERROR_OUT_OF_MEMORY;
#define PAIR(i, j)                                                                                                 \
    (done[(size_t)(i) * (size_t)tk->nspans + (size_t)(j)] ? PAIR_HIDDEN : classify(p, tq->span[i], tk->span[j]))
    cp_status s = CP_SUCCESS;
    for (int i0 = 0; i0 < tq->nspans && s == CP_SUCCESS; i0++)
        for (int j0 = 0; j0 < tk->nspans && s == CP_SUCCESS; j0++) {
            const pair_kind kind = PAIR(i0, j0);
            if (kind == PAIR_HIDDEN)
                continue;
            int i1 = i0, j1 = j0;
            if (kind == PAIR_FULL) {
                while (rows_follow(tk, j1) && PAIR(i0, j1 + 1) == PAIR_FULL)
                    j1++;
                for (int grow = 1; grow && rows_follow(tq, i1);) {
                    for (int j = j0; j <= j1 && grow; j++)
                        grow = PAIR(i1 + 1, j) == PAIR_FULL;
                    i1 += grow;
                }
            }
            int64_t nq = 0, nk = 0;
            for (int i = i0; i <= i1; i++) {
                nq += tq->span[i].len;
                for (int j = j0; j <= j1; j++)
                    done[(size_t)i * (size_t)tk->nspans + (size_t)j] = 1;
            }
            for (int j = j0; j <= j1; j++)
                nk += tk->span[j].len;
            s = fn(arg, i0, i1, nq, j0, nk, kind == PAIR_FULL ? CP_MASK_NONE : p->desc.mask);
        }
#undef PAIR
    free(done);
    return s;
}

typedef struct issue_arg {
    const cp_attn_plan *p;
    const cpi_attend_io *io;
    cp_kernel_attn_args *a;
    int backward;
} issue_arg;

static cp_status issue(void *arg, int i0, int i1, int64_t nq, int j0, int64_t nk, cp_mask mask)
{
    const issue_arg *x = arg;
    return call_spans(x->p, x->io, x->a, i0, i1, nq, j0, nk, mask, x->backward);
}

static cp_status count(void *arg, int i0, int i1, int64_t nq, int j0, int64_t nk, cp_mask mask)
{
    (void)i0, (void)i1, (void)nq, (void)j0, (void)nk, (void)mask;
    ++*(int *)arg;
    return CP_SUCCESS;
}

cp_status cpi_attend_single(const cp_attn_plan *p, const cpi_tokset *tq, const cpi_tokset *tk, int *one)
{
    *one = 0;
    if (p->rects) {
        cp_attn_rect *rects;
        int64_t n;
        CPI_TRY(cpi_vis_rects(&p->vis, tq, tk, &rects, &n));
        free(rects);
        *one = n > 0;
        return CP_SUCCESS;
    }
    int n = 0;
    CPI_TRY(pair_calls(p, tq, tk, count, &n));
    *one = n == 1;
    return CP_SUCCESS;
}

cp_status cpi_attend(const cp_attn_plan *p, const cpi_attend_io *io, int backward)
{
    cp_kernel_attn_args a;
    base_args(p, io, &a);
    if (p->rects)
        return attend_rects(p, io, &a, backward);
    issue_arg x = { p, io, &a, backward };
    return pair_calls(p, io->tq, io->tk, issue, &x);
}

cp_status cpi_attend_scratch(const cp_attn_plan *p, int64_t max_q, int64_t max_k, int32_t hq, int32_t hkv,
                             int backward, int direct, size_t *bytes)
{
    /* The kernels' scratch depends on the block shape only; ask for the
     * largest block this plan will run. Pointers stay NULL: size query. */
    cpi_tensor q = { NULL, max_q, hq, p->desc.head_dim, p->desc.dtype };
    cpi_tensor k = { NULL, max_k, hkv, p->desc.head_dim, p->desc.dtype };
    cpi_attend_io io = { .q = &q, .k = &k };
    cp_kernel_attn_args a;
    base_args(p, &io, &a);
    a.seq_q = max_q;
    a.seq_k = max_k;
    a.o_dtype = backward ? p->desc.dtype : CP_DTYPE_F32;
    a.accumulate = !backward;
    a.grad_dtype = CP_DTYPE_F32;
    a.grad_accumulate = 1;
    if (direct) { /* cpi_attend_io.out, dq_out...: results in their own types */
        if (!backward)
            a.o_dtype = cpi_plan_out_dtype(p);
        a.accumulate = 0;
        a.grad_dtype = p->desc.dtype;
        a.grad_accumulate = 0;
    }
    return p->ctx->ops->attn_workspace_size(p->ctx->state, &a, backward, bytes);
}
